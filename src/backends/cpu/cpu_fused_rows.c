/* cpu_fused_rows.c - a row kernel (softmax, log_softmax, layer norm) whose
 * input is made row by row by a fused elementwise prologue (backend.h,
 * nd_rows_op; made by nd.compile's fuse pass), so the input is never
 * stored: each thread runs the program over one row into a buffer of its
 * own, which stays in cache while the row kernel reads it. The program
 * runs through the fused elementwise executor (cpu_ew_exec.h) and the row
 * through the unfused kernel's own row function, so the results are bit for
 * bit those of the program, then the kernel. */
#include <stdlib.h>
#include "cpu_ew_exec.h"

/* tensor t's element offset of row r (rows: t's shape without its last dim) */
static int64_t row_offset(const nd_tensor *t, int64_t r) {
    int64_t off = t->offset;
    for (int d = t->ndim - 2; d >= 0 && r > 0; d--) {
        off += (r % t->shape[d]) * t->strides[d];
        r /= t->shape[d];
    }
    return off;
}

nd_status nd_cpu_fused_rows(const nd_rows_op *op, nd_ew_program *p, nd_tensor *const *ts, int x_slot) {
    const nd_tensor *y = op->y;
    const char *name = op->kind == ND_ROWS_SOFTMAX ? "softmax" : "layer_norm";
    if (p->dtype != y->dtype || x_slot < 0 || x_slot >= p->nt || ts[x_slot] || y->ndim < 1)
        return nd_fail(ND_ERR_INTERNAL, "%s: a fused prologue that does not make its input", name);
    nd_cpu_ew_exec x;
    ND_TRY(nd_cpu_ew_prepare(p, &x));
    const int64_t cols = y->shape[y->ndim - 1], rows = cols ? nd_numel(y) / cols : 0;
    if (rows == 0 || cols == 0) return ND_OK;
    const size_t es = nd_dtype_size(y->dtype);
    char *Y = nd_ptr(op->y);
    char *M = op->mean ? nd_ptr(op->mean) : NULL, *R = op->rstd ? nd_ptr(op->rstd) : NULL;
    const void *W = op->w ? nd_ptr(op->w) : NULL, *B = op->b ? nd_ptr(op->b) : NULL;
    int failed = 0;
#pragma omp parallel num_threads(nd_cpu_threads()) if (rows > 1 && rows * cols >= ND_PARALLEL_THRESHOLD)
    {
        char *buf = aligned_alloc(64, ((size_t)cols * es + 63) / 64 * 64);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        char *ptr[ND_EW_MAX_TENSORS];
        int64_t str[ND_EW_MAX_TENSORS];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf) continue;
            for (int k = 0; k < p->nt; k++) {
                if (k == x_slot) {
                    ptr[k] = buf;
                    str[k] = (int64_t)es;
                    continue;
                }
                const nd_tensor *t = ts[k];
                const int64_t tes = (int64_t)nd_dtype_size(t->dtype);
                ptr[k] = nd_ptr(t) + (row_offset(t, r) - t->offset) * tes;
                str[k] = t->strides[t->ndim - 1] * tes;
            }
            nd_cpu_ew_run(ptr, str, cols, &x);
            char *yr = Y + (size_t)(r * cols) * es;
            if (op->kind == ND_ROWS_SOFTMAX)
                nd_cpu_softmax_row(y->dtype, buf, yr, cols, op->log);
            else
                nd_cpu_layer_norm_row(y->dtype, buf, yr, cols, W, B, op->eps, M + (size_t)r * es,
                                      R + (size_t)r * es);
        }
        free(buf);
    }
    if (failed)
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory for a row of %lld elements", name, (long long)cols);
    return ND_OK;
}
