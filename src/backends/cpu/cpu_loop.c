/* cpu_loop.c - see cpu_loop.h. */
#include <omp.h>
#include <string.h>
#include "cpu_threads.h"
#include "cpu_loop.h"

void nd_loop_init(nd_loop *L, int nops, const nd_tensor *const *ts) {
    const nd_tensor *ref = ts[0];
    L->nops = nops;
    L->numel = nd_numel(ref);
    for (int k = 0; k < nops; k++) L->base[k] = nd_ptr(ts[k]);
    /* Drop size-1 dims, then merge dim i into i+1 when every operand steps
     * through i exactly as far as it steps across all of i+1. */
    int nd = 0;
    for (int i = 0; i < ref->ndim; i++) {
        if (ref->shape[i] == 1) continue;
        L->shape[nd] = ref->shape[i];
        for (int k = 0; k < nops; k++)
            L->strides[k][nd] = ts[k]->strides[i] * (int64_t)nd_dtype_size(ts[k]->dtype);
        nd++;
    }
    if (nd == 0) {
        L->shape[0] = 1;
        for (int k = 0; k < nops; k++) L->strides[k][0] = 0;
        nd = 1;
    }
    int out = 0;
    for (int i = 1; i < nd; i++) {
        bool merge = true;
        for (int k = 0; k < nops && merge; k++)
            merge = L->strides[k][out] == L->strides[k][i] * L->shape[i];
        if (merge) {
            L->shape[out] *= L->shape[i];
            for (int k = 0; k < nops; k++) L->strides[k][out] = L->strides[k][i];
        } else {
            out++;
            L->shape[out] = L->shape[i];
            for (int k = 0; k < nops; k++) L->strides[k][out] = L->strides[k][i];
        }
    }
    L->ndim = out + 1;
}

void nd_loop_add_scalar(nd_loop *L, void *value) {
    int k = L->nops++;
    L->base[k] = value;
    for (int i = 0; i < L->ndim; i++) L->strides[k][i] = 0;
}

/* Runs elements [start, end) of the flat row-major range. */
static void run_range(const nd_loop *L, int64_t start, int64_t end, nd_inner_fn fn, void *ctx) {
    const int nops = L->nops, nd = L->ndim, in = nd - 1;
    int64_t idx[ND_MAX_DIMS];
    char *p[ND_LOOP_MAX_OPS];
    int64_t inner_strides[ND_LOOP_MAX_OPS];
    int64_t rem = start;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % L->shape[d];
        rem /= L->shape[d];
    }
    for (int k = 0; k < nops; k++) {
        p[k] = L->base[k];
        for (int d = 0; d < nd; d++) p[k] += idx[d] * L->strides[k][d];
        inner_strides[k] = L->strides[k][in];
    }
    int64_t i = start;
    while (i < end) {
        int64_t n = L->shape[in] - idx[in];
        if (n > end - i) n = end - i;
        fn(p, inner_strides, n, ctx);
        i += n;
        if (i >= end) break;
        for (int k = 0; k < nops; k++) p[k] += n * inner_strides[k];
        idx[in] += n;
        /* carry into outer dims */
        for (int d = in; d > 0 && idx[d] == L->shape[d]; d--) {
            for (int k = 0; k < nops; k++)
                p[k] += L->strides[k][d - 1] - L->shape[d] * L->strides[k][d];
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

void nd_loop_run(const nd_loop *L, nd_inner_fn fn, void *ctx, int parallel) {
    int64_t total = L->numel;
    if (total == 0) return;
    int nthreads = parallel && total >= ND_PARALLEL_THRESHOLD ? nd_cpu_threads() : 1;
    if (nthreads <= 1) {
        run_range(L, 0, total, fn, ctx);
        return;
    }
    /* Chunks are multiples of 16 elements so threads do not share cache lines
     * of a dense output. */
#pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t chunk = (total + nt - 1) / nt;
        chunk = (chunk + 15) / 16 * 16;
        int64_t s = (int64_t)t * chunk, e = s + chunk;
        if (e > total) e = total;
        if (s < e) run_range(L, s, e, fn, ctx);
    }
}
