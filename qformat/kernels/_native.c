/* qformat native decode kernel (issue 23): the CPython wrapper around libqformat's fused
 * kernel (libqformat/src/kernel.c, kernel.h: ONE C decoder source for the Python package and
 * the C library; setup.py compiles both files into this extension).
 *
 * The kernel decodes packed codes -> element value -> parameters (zero, scale, bias, in that
 * order) -> one round-to-nearest-even cast, in one pass, bit-exact with SPEC.md section 10.
 * Python (qformat.decode) hands it a byte table (qformat.regions.byte_table) and either the
 * packed bytes (n = 1, 2, 4 or 8 codes per byte) or codes it unpacked itself (n = 1), and each
 * parameter's binary32 (or binary16 / bfloat16) values with their cell addressing (CONST,
 * BLOCK, FLAT, COLS; see kernel.h).
 *
 * This file only parses the arguments: every buffer length, table size and the full range of
 * parameter cells a call can touch is checked by the kernel (qfk_check) before the GIL is
 * released.  The level (baseline, AVX2+F16C, AVX-512) is picked once at import from the CPU
 * (or forced by set_level()).  Threads come from the caller: the call releases the GIL and
 * qformat.decode spreads chunks over its thread pool (bits never depend on the thread count).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "kernel.h"

static int g_level = QFK_LVL_GENERIC;

static PyObject *bad(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

static void release_all(Py_buffer *bufs, int nb) {
    int i;
    for (i = 0; i < nb; i++) PyBuffer_Release(&bufs[i]);
}

/* decode(codes, stride, R, C, n, byte_table, params, out, outkind, span, stream, six)
 * params: a sequence of (op, mode, values, rowoff, colidx or None, a, b[, vkind]); span: 0, or the
 * planes span (a divisor of the tile, a multiple of n, dividing C); six: 6-bit codes, four in three bytes
 * (n = 1, see kernel.h). */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer bufs[3 + 3 * 3];
    int nb = 0, k, outkind, n;
    Py_ssize_t stride, R, C, span = 0;
    PyObject *params, *seq = NULL;
    int stream = 0, six = 0;
    const char *why;
    qfk_job j;
    qfk_lens lens;
    (void)self;
    memset(&j, 0, sizeof j);
    memset(&lens, 0, sizeof lens);
    memset(bufs, 0, sizeof bufs);
    if (!PyArg_ParseTuple(args, "y*nnniy*Ow*i|npp", &bufs[0], &stride, &R, &C, &n, &bufs[1], &params, &bufs[2], &outkind, &span,
                          &stream, &six)) {
        for (k = 0; k < 3; k++)
            if (bufs[k].obj) PyBuffer_Release(&bufs[k]);
        return NULL;
    }
    nb = 3;
#define FAIL(msg)                   \
    do {                            \
        Py_XDECREF(seq);            \
        release_all(bufs, nb);      \
        return bad(msg);            \
    } while (0)
    seq = PySequence_Fast(params, "params must be a sequence");
    if (!seq) {
        release_all(bufs, nb);
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(seq) > 3) FAIL("at most three parameters");
    j.nparams = (int)PySequence_Fast_GET_SIZE(seq);
    for (k = 0; k < j.nparams; k++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, k), *colobj;
        qfk_param *p = &j.p[k];
        Py_buffer *vb = &bufs[nb], *rb = &bufs[nb + 1], *cb = &bufs[nb + 2];
        long long a, b;
        p->vkind = QFK_VAL_F32;
        if (!PyArg_ParseTuple(t, "iiy*y*OLL|i", &p->op, &p->mode, vb, rb, &colobj, &a, &b, &p->vkind)) {
            /* a failed parse releases nothing it acquired past the failure; count what was taken */
            if (vb->obj) nb++;
            if (rb->obj) nb++;
            Py_XDECREF(seq);
            release_all(bufs, nb);
            return NULL;
        }
        nb += 2;
        if (colobj != Py_None) {
            if (PyObject_GetBuffer(colobj, cb, PyBUF_SIMPLE) < 0) {
                Py_XDECREF(seq);
                release_all(bufs, nb);
                return NULL;
            }
            nb++;
            lens.colidx[k] = (size_t)cb->len / 8;
            p->colidx = (const int64_t *)cb->buf;
        }
        p->a = a;
        p->b = b;
        p->v = vb->buf;
        p->rowoff = (const int64_t *)rb->buf;
        lens.values[k] = (size_t)vb->len / (p->vkind == QFK_VAL_F32 ? 4 : 2);
        lens.rowoff[k] = (size_t)rb->len / 8;
    }
    j.codes = (const uint8_t *)bufs[0].buf;
    j.bt = (const float *)bufs[1].buf;
    j.out = bufs[2].buf;
    j.stride = stride;
    j.R = R;
    j.C = C;
    j.n = n;
    j.outkind = outkind;
    j.span = span;
    j.stream = stream;
    j.six = six;
    lens.codes = (size_t)bufs[0].len;
    lens.bt = (size_t)bufs[1].len;
    lens.out = (size_t)bufs[2].len;
    why = qfk_check(&j, &lens); /* every size and parameter cell, before any byte is read */
    if (why) FAIL(why);
    if (R && C) {
        int lvl = g_level;
        Py_BEGIN_ALLOW_THREADS
        qfk_run(&j, 0, R, lvl);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(seq);
    release_all(bufs, nb);
    Py_RETURN_NONE;
#undef FAIL
}

static PyObject *py_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(qfk_level_name(g_level));
}

static PyObject *py_cpu_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(qfk_level_name(qfk_cpu_level()));
}

/* set_level(name): use the kernels of ``name`` ("generic", "avx2", "avx512"); refused for a
 * level this CPU (or this build) does not have. */
static PyObject *py_set_level(PyObject *self, PyObject *args) {
    const char *name;
    int k;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    for (k = 0; k <= QFK_LVL_AVX512; k++)
        if (strcmp(name, qfk_level_name(k)) == 0) {
            if (k > qfk_cpu_level()) {
                PyErr_Format(PyExc_ValueError, "kernel level %s is not supported on this CPU (best: %s)", name,
                             qfk_level_name(qfk_cpu_level()));
                return NULL;
            }
            g_level = k;
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "unknown kernel level %s", name);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS, "Fused decode of R rows of C values (see the file's header)."},
    {"level", py_level, METH_NOARGS, "The kernel level in use."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "The best kernel level this CPU and build support."},
    {"set_level", py_set_level, METH_VARARGS, "Use the kernels of one level."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "qformat's native decode kernel.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    g_level = qfk_cpu_level();
    return PyModule_Create(&module);
}
