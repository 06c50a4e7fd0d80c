/* matvec: y = W x for one quantized linear layer of a qformat file, two ways:
 *   1. from the float32 weights qf_decode() gives, and
 *   2. straight from the raw components (packed int codes, scales, zero points) that
 *      qf_tensor_component() / qf_stored_info() hand out, with the element, packing and
 *      parameter members of qf_tensor_quant() -- what an engine with its own kernel does.
 * Both compute every weight in the binary32 order of SPEC.md 10.1-10.2 (code -> element value,
 * - zero, * or / scale, + or - bias) and accumulate y[n] = sum_k W[n,k] x[k] in the same order,
 * so the two results are bit for bit equal: max |difference| is exactly 0.
 *
 * The raw path covers the usual engine layout (and refuses anything else, saying why): a 2-D
 * canonical int element, slot arrangement (container % bits == 0, no slot_order or planes),
 * rows along the last axis, identity order; plain F32/F16/BF16 parameters with grid blocks
 * [1, G] or [1, null] (no group index).
 *
 *   usage: matvec FILE.safetensors [TENSOR]   (default encoder.layer.0.attention.self.query.weight)
 * Build: see README.md (pkg-config or CMake find_package(qformat)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <qformat.h>

static float half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, w;
    if (e == 31) w = s | 0x7F800000u | (m << 13);
    else if (e) w = s | ((e + 112) << 23) | (m << 13);
    else if (!m) w = s;
    else { /* subnormal: exact */
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    float f;
    memcpy(&f, &w, 4);
    return f;
}

/* one plain parameter value, widened exactly to binary32 (SPEC.md 9.2) */
static float param_value(const char *dtype, const unsigned char *p, uint64_t k) {
    if (!strcmp(dtype, "F32")) { float f; memcpy(&f, p + 4 * k, 4); return f; }
    uint16_t h;
    memcpy(&h, p + 2 * k, 2);
    if (!strcmp(dtype, "F16")) return half_to_float(h);
    uint32_t w = (uint32_t)h << 16; /* BF16 */
    float f;
    memcpy(&f, &w, 4);
    return f;
}

typedef struct param { const qf_param_info *info; const unsigned char *data; } param;

/* the parameter value of weight (n, k): grid blocks [1, G] or [1, null], stored [N, G'] or with order [1, 0] */
static float param_at(const param *p, uint64_t n, uint64_t k) {
    const qf_param_info *q = p->info;
    uint64_t gk = q->block[1] ? k / q->block[1] : 0, gn = q->block[0] ? n / q->block[0] : 0;
    uint64_t flat = q->has_order && q->order[0] == 1 ? gk * q->grid[0] + gn : gn * q->grid[1] + gk;
    return param_value(q->dtype, p->data, flat);
}

static int supported(const qf_quant_info *q, const char **why) {
    *why = q->rank != 2 ? "not 2-D" : strcmp(q->layout, "canonical") ? "a device layout" : q->element != QF_ELEMENT_INT ? "not an int element"
         : q->stream ? "stream arrangement" : q->has_slot_order || q->planes_span ? "slot_order or planes" : q->axis != 1 ? "rows not along the last axis"
         : q->has_order ? "a storage order" : NULL;
    const qf_param_info *ps[3] = {&q->zero, &q->scale, &q->bias};
    for (int r = 0; r < 3 && !*why; r++) {
        const qf_param_info *p = ps[r];
        if (!p->present) continue;
        if (p->encoded || p->flat || p->has_index || (p->block[0] != 0 && p->block[0] != 1)) *why = "a parameter other than plain grid [1, G]";
        else if (strcmp(p->dtype, "F32") && strcmp(p->dtype, "F16") && strcmp(p->dtype, "BF16")) *why = "a parameter dtype other than F32/F16/BF16";
    }
    return *why == NULL;
}

static int load_param(const qf_file *f, size_t i, const char *role, const qf_param_info *info, param *out) {
    out->info = info;
    out->data = NULL;
    if (!info->present) return 1;
    size_t j;
    qf_error err;
    const void *data;
    if (qf_tensor_component(f, i, role, &j, &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 0; }
    qf_stored_info(f, j, NULL, NULL, NULL, NULL, NULL, &data, NULL);
    out->data = (const unsigned char *)data;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: matvec FILE.safetensors [TENSOR]\n"); return 2; }
    const char *want = argc > 2 ? argv[2] : "encoder.layer.0.attention.self.query.weight";
    qf_file *f = NULL;
    qf_error err;
    if (qf_open_path(argv[1], NULL, &f, &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }

    /* walk the tensors */
    size_t nq = 0, count = qf_tensor_count(f);
    for (size_t i = 0; i < count; i++) {
        struct qf_tensor_info ti;
        qf_tensor_info(f, i, &ti, NULL);
        nq += ti.is_quantized != 0;
        if (i < 4 || i + 2 > count) {
            printf("%-60.*s %-9s %-8s [", (int)ti.name_len, ti.name, ti.is_quantized ? (ti.scheme ? ti.scheme : "quantized") : "plain", ti.dtype);
            for (size_t a = 0; a < ti.rank; a++) printf("%s%llu", a ? ", " : "", (unsigned long long)ti.shape[a]);
            printf("]\n");
        } else if (i == 4) printf("...\n");
    }
    printf("%zu tensors, %zu quantized\n", count, nq);

    size_t i;
    if (qf_find_tensor(f, want, strlen(want), &i, &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    qf_quant_info q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    if (qf_tensor_quant(f, i, NULL, &q, &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    const char *desc;
    size_t desc_len;
    qf_tensor_descriptor(f, i, &desc, &desc_len, NULL);
    printf("%s: %.*s\n", want, (int)desc_len, desc);
    const char *why;
    if (!supported(&q, &why)) { fprintf(stderr, "%s: this example's raw kernel does not handle %s\n", want, why); return 1; }
    uint64_t N = q.shape[0], K = q.shape[1];

    float *x = (float *)malloc(K * sizeof(float)), *W = (float *)malloc(N * K * sizeof(float));
    float *y1 = (float *)calloc(N, sizeof(float)), *y2 = (float *)calloc(N, sizeof(float));
    if (!x || !W || !y1 || !y2) return 1;
    for (uint64_t k = 0; k < K; k++) x[k] = (float)((int)(k * 7919 % 201) - 100) / 64.0f; /* a fixed input */

    /* 1. from the decoded weights */
    if (qf_decode(f, i, QF_OUT_FLOAT32, W, N * K * sizeof(float), &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    for (uint64_t n = 0; n < N; n++) {
        float acc = 0.0f;
        for (uint64_t k = 0; k < K; k++) acc += W[n * K + k] * x[k];
        y1[n] = acc;
    }

    /* 2. from the raw components */
    size_t jc;
    const void *codes_v;
    if (qf_tensor_component(f, i, "codes", &jc, &err)) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    qf_stored_info(f, jc, NULL, NULL, NULL, NULL, NULL, &codes_v, NULL);
    const unsigned char *codes = (const unsigned char *)codes_v;
    param zero, scale, bias;
    if (!load_param(f, i, "zero", &q.zero, &zero) || !load_param(f, i, "scale", &q.scale, &scale) || !load_param(f, i, "bias", &q.bias, &bias)) return 1;
    unsigned b = q.bits, cbytes = q.container / 8, mask = (1u << b) - 1;
    for (uint64_t n = 0; n < N; n++) {
        float acc = 0.0f;
        const unsigned char *row = codes + n * q.words_per_row * cbytes;
        for (uint64_t k = 0; k < K; k++) {
            uint64_t word = k / q.slots; /* slot s = k mod n of container k / n (7.7) */
            unsigned s = (unsigned)(k % q.slots), shift = q.msb_first ? q.container - (s + 1) * b : s * b;
            uint32_t w = 0;
            for (unsigned by = 0; by < cbytes; by++) w |= (uint32_t)row[word * cbytes + by] << (8 * by); /* little-endian */
            unsigned u = ((w >> shift) & mask);
            u = (u + q.code_offset) & mask;                                                        /* 6.2 step 1 */
            int v = q.signedness == QF_SIGNEDNESS_UNSIGNED ? (int)u
                  : q.signedness == QF_SIGNEDNESS_TWOS_COMPLEMENT ? (u >= (1u << (b - 1)) ? (int)u - (1 << b) : (int)u)
                  : (int)u - (1 << (b - 1));                                                      /* step 2 */
            float e = ldexpf((float)v, -(int)q.frac_bits);                                          /* step 3, exact */
            if (q.zero.present) e = e - param_at(&zero, n, k);                                      /* 10.1, one rounding each */
            if (q.scale.present) e = q.scale.op == QF_PARAM_DIVIDE ? e / param_at(&scale, n, k) : e * param_at(&scale, n, k);
            if (q.bias.present) e = q.bias.op == QF_PARAM_ADD ? e + param_at(&bias, n, k) : e - param_at(&bias, n, k);
            acc += e * x[k]; /* W is float32 (q.dtype): no rounding to a narrower logical dtype here */
        }
        y2[n] = acc;
    }
    if (strcmp(q.dtype, "float32")) printf("note: logical dtype %s: the raw path skips the rounding to it (10.3)\n", q.dtype);

    float maxdiff = 0.0f;
    for (uint64_t n = 0; n < N; n++) {
        float d = fabsf(y1[n] - y2[n]);
        if (d > maxdiff || d != d) maxdiff = d;
    }
    printf("W %s [%llu, %llu] %s%u %s, container %u, scale %s%s\n", want, (unsigned long long)N, (unsigned long long)K,
           q.signedness == QF_SIGNEDNESS_UNSIGNED ? "uint" : "int", b, q.msb_first ? "msb_first" : "lsb_first", q.container,
           q.scale.present ? q.scale.dtype : "-", q.zero.present ? " + zero" : "");
    printf("y[0..3] decoded: %.9g %.9g %.9g %.9g\n", y1[0], y1[1 % N], y1[2 % N], y1[3 % N]);
    printf("y[0..3] raw:     %.9g %.9g %.9g %.9g\n", y2[0], y2[1 % N], y2[2 % N], y2[3 % N]);
    printf("max abs difference: %g\n", maxdiff);
    free(x), free(W), free(y1), free(y2);
    qf_close(f);
    return maxdiff == 0.0f ? 0 : 1;
}
