/* The WebAssembly face of libqformat: the few functions the JavaScript reader calls
 * (readers/js/src/wasm.js).  Built by libqformat/scripts/build_wasm.py into
 * readers/js/wasm/qformat.wasm; nothing here is part of the C API (qformat.h).
 *
 * JavaScript cannot pass 64-bit integers or structs without ceremony, so these take 32-bit
 * sizes (a wasm32 memory is at most 4 GiB anyway) and an error buffer the caller allocated:
 * a qf_error, code at offset 0 (NUL-terminated, 40 bytes), message at offset 40. */
#include <stdint.h>
#include <stdlib.h>

#include "qformat.h"

#define QFW_EXPORT(name) __attribute__((export_name(#name)))

QFW_EXPORT(qfw_malloc) void *qfw_malloc(uint32_t n) { return malloc(n ? n : 1); }
QFW_EXPORT(qfw_free) void qfw_free(void *p) { free(p); }
QFW_EXPORT(qfw_error_size) uint32_t qfw_error_size(void) { return (uint32_t)sizeof(qf_error); }

/* A file held in this memory (the caller keeps it there until qfw_close), or NULL with err set. */
QFW_EXPORT(qfw_open) qf_file *qfw_open(const void *data, uint32_t size, qf_error *err) {
    qf_file *f = NULL;
    return qf_open_memory(data, size, NULL, &f, err) == QF_OK ? f : NULL;
}

QFW_EXPORT(qfw_close) void qfw_close(qf_file *f) { qf_close(f); }

/* Rows [row0, row0 + nrows) of logical tensor i (all of it for a rank-0 tensor: nrows 1), written
 * as out (0 float32, 1 float16 bits, 2 bfloat16 bits) to dst; returns the qf_status. */
QFW_EXPORT(qfw_decode_rows)
int qfw_decode_rows(const qf_file *f, uint32_t i, double row0, double nrows, int out, void *dst, uint32_t dst_bytes,
                    qf_error *err) {
    /* rows come as doubles: exact integers below 2^53, which is every row count a 4 GiB memory holds */
    if (nrows < 0 || row0 < 0) return (int)QF_E_SLICE_INVALID;
    qf_tensor_info_t info;
    qf_status s = qf_tensor_info(f, i, &info, err);
    if (s != QF_OK) return (int)s;
    if (info.rank == 0 || (row0 == 0 && (uint64_t)nrows == info.shape[0]))
        return (int)qf_decode(f, i, (qf_out_dtype)out, dst, dst_bytes, err);
    return (int)qf_decode_rows(f, i, (uint64_t)row0, (uint64_t)nrows, (qf_out_dtype)out, dst, dst_bytes, err);
}
