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
 * This file parses the arguments and splits the rows over threads: every buffer length, table
 * size and the full range of parameter cells a call can touch is checked by the kernel
 * (qfk_check) before the GIL is released.  The level (baseline, AVX2+F16C, AVX-512) is picked once at import from the CPU
 * (or forced by set_level()).  The call releases the GIL; its rows are split over ``threads``
 * native threads here (POSIX builds; qformat.decode passes its thread count where the kernel
 * reads the packed bytes in place, else it spreads chunks over its Python pool).  Bits never
 * depend on the thread count.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "kernel.h"

/* Native threads (POSIX): one call splits its rows over several threads, each taking the next
 * block of rows from a shared counter (so a thread the OS runs late takes fewer blocks), and a
 * fresh output's first-touch page faults are taken by every thread at once.  Elsewhere a call
 * runs on the caller's thread only (qformat.decode then spreads chunks over its Python pool). */
#if !defined(_WIN32) && !defined(__STDC_NO_ATOMICS__) && !defined(__EMSCRIPTEN__) && !defined(__wasi__)
#include <pthread.h>
#include <stdatomic.h>
#define QF_THREADS 1
#else
#define QF_THREADS 0
#endif

static int g_level = QFK_LVL_GENERIC;

static PyObject *bad(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

static void release_all(Py_buffer *bufs, int nb) {
    int i;
    for (i = 0; i < nb; i++) PyBuffer_Release(&bufs[i]);
}

/* -- rows over native threads ------------------------------------------------------------------ */
/* Rows per block a thread takes at a time: about 2 MiB of output (whole rows), one huge page,
 * so two threads seldom fault on the same fresh huge page at once (Linux clears a huge page
 * before it takes the page table's lock: both would clear it), and a 64 MiB output is 32 blocks,
 * so a thread that starts late or is preempted takes fewer of them. */
static qfk_int block_rows(const qfk_job *j) {
    const qfk_int bytes = j->C * (j->outkind == QFK_OUT_F32 ? 4 : 2);
    const qfk_int b = bytes > 0 ? ((qfk_int)1 << 21) / bytes : 1;
    return b < 1 ? 1 : b;
}

#if QF_THREADS
typedef struct {
    const qfk_job *j;
    int lvl;
    qfk_int block;
    atomic_llong next; /* the first row no thread has taken yet */
} shared_rows;

static void take_rows(shared_rows *s) {
    for (;;) {
        const long long r0 = atomic_fetch_add(&s->next, (long long)s->block);
        if (r0 >= (long long)s->j->R) return;
        qfk_run(s->j, (qfk_int)r0, (qfk_int)r0 + s->block, s->lvl); /* qfk_run clips to R */
    }
}

static void *rows_thread(void *arg) {
    take_rows((shared_rows *)arg);
    return NULL;
}
#endif

/* Rows [0, R) of a checked job on ``threads`` threads (the caller's included), the GIL released
 * by the caller.  A thread that cannot start leaves its blocks to the others: the same bits. */
static void run_rows(const qfk_job *j, int lvl, int threads) {
#if QF_THREADS
    enum { MAXT = 64 };
    pthread_t t[MAXT];
    int k, started = 0;
    shared_rows s;
    const qfk_int block = block_rows(j);
    if (threads > MAXT) threads = MAXT;
    if (threads > (j->R + block - 1) / block) threads = (int)((j->R + block - 1) / block);
    if (threads <= 1) {
        qfk_run(j, 0, j->R, lvl);
        return;
    }
    s.j = j;
    s.lvl = lvl;
    s.block = block;
    atomic_init(&s.next, 0);
    for (k = 0; k < threads - 1; k++)
        if (pthread_create(&t[started], NULL, rows_thread, &s) == 0) started++;
    take_rows(&s);
    for (k = 0; k < started; k++) pthread_join(t[k], NULL);
#else
    (void)threads;
    qfk_run(j, 0, j->R, lvl);
#endif
}

/* decode(codes, stride, R, C, n, byte_table, params, out, outkind, span, stream, six, threads)
 * params: a sequence of (op, mode, values, rowoff, colidx or None, a, b[, vkind]); span: 0, or the
 * planes span (a divisor of the tile, a multiple of n, dividing C); six: 6-bit codes, four in three bytes
 * (n = 1, see kernel.h); threads: native threads sharing the rows (1: the caller's thread only;
 * where QF_THREADS is 0, always 1). */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer bufs[3 + 3 * 3];
    int nb = 0, k, outkind, n;
    Py_ssize_t stride, R, C, span = 0;
    PyObject *params, *seq = NULL;
    int stream = 0, six = 0, threads = 1;
    const char *why;
    qfk_job j;
    qfk_lens lens;
    (void)self;
    memset(&j, 0, sizeof j);
    memset(&lens, 0, sizeof lens);
    memset(bufs, 0, sizeof bufs);
    if (!PyArg_ParseTuple(args, "y*nnniy*Ow*i|nppi", &bufs[0], &stride, &R, &C, &n, &bufs[1], &params, &bufs[2], &outkind, &span,
                          &stream, &six, &threads)) {
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
    if (threads < 1) FAIL("threads must be at least 1");
    if (R && C) {
        int lvl = g_level;
        Py_BEGIN_ALLOW_THREADS
        run_rows(&j, lvl, threads);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(seq);
    release_all(bufs, nb);
    Py_RETURN_NONE;
#undef FAIL
}

static PyObject *py_threads(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(QF_THREADS);
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
    {"threads", py_threads, METH_NOARGS, "Whether decode() can split its rows over native threads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "qformat's native decode kernel.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    g_level = qfk_cpu_level();
    return PyModule_Create(&module);
}
