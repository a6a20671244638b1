/* cpu_dim_loop.c - see cpu_dim_loop.h. */
#include <omp.h>
#include "cpu_dim_loop.h"

void nd_dim_loop_init(nd_dim_loop *L, int nops, const nd_tensor *const *ts,
                      const int64_t *shape, int ndim, int dim) {
    L->nops = nops;
    L->n = ndim > 0 ? shape[dim] : 1;
    for (int k = 0; k < nops; k++) {
        L->base[k] = nd_ptr(ts[k]);
        L->inner[k] = ndim > 0 && ts[k]->ndim > 0
                          ? ts[k]->strides[dim] * (int64_t)nd_dtype_size(ts[k]->dtype) : 0;
    }
    /* Outer dims without `dim` and size-1 dims; merge neighbours that every
     * operand steps through contiguously (as nd_loop_init does). */
    int nd = 0;
    L->nouter = 1;
    for (int i = 0; i < ndim; i++) {
        if (i == dim) continue;
        L->nouter *= shape[i];
        if (shape[i] == 1) continue;
        L->shape[nd] = shape[i];
        for (int k = 0; k < nops; k++)
            L->strides[k][nd] = ts[k]->strides[i] * (int64_t)nd_dtype_size(ts[k]->dtype);
        nd++;
    }
    int out = 0;
    for (int i = 1; i < nd; i++) {
        bool merge = true;
        for (int k = 0; k < nops && merge; k++)
            merge = L->strides[k][out] == L->strides[k][i] * L->shape[i];
        if (merge) {
            L->shape[out] *= L->shape[i];
        } else {
            out++;
            L->shape[out] = L->shape[i];
        }
        for (int k = 0; k < nops; k++) L->strides[k][out] = L->strides[k][i];
    }
    L->ndim = nd ? out + 1 : 0;
}

/* Runs slices [start, end), walking the outer coordinates with a counter. */
static void run_slices(const nd_dim_loop *L, int64_t start, int64_t end, nd_inner_fn fn,
                       void *ctx) {
    const int nops = L->nops, nd = L->ndim;
    int64_t idx[ND_MAX_DIMS];
    char *p[ND_LOOP_MAX_OPS];
    int64_t rem = start;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % L->shape[d];
        rem /= L->shape[d];
    }
    for (int k = 0; k < nops; k++) {
        p[k] = L->base[k];
        for (int d = 0; d < nd; d++) p[k] += idx[d] * L->strides[k][d];
    }
    for (int64_t s = start; s < end; s++) {
        fn(p, L->inner, L->n, ctx);
        if (s + 1 == end || nd == 0) break;
        int d = nd - 1;
        for (int k = 0; k < nops; k++) p[k] += L->strides[k][d];
        idx[d]++;
        for (; d > 0 && idx[d] == L->shape[d]; d--) {
            for (int k = 0; k < nops; k++)
                p[k] += L->strides[k][d - 1] - L->shape[d] * L->strides[k][d];
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

void nd_dim_loop_run(const nd_dim_loop *L, nd_inner_fn fn, void *ctx, int parallel) {
    int64_t total = L->nouter;
    if (total == 0 || L->n == 0) return;
    int nthreads = parallel && total > 1 && total * L->n >= ND_PARALLEL_THRESHOLD
                       ? omp_get_max_threads() : 1;
    if (nthreads > total) nthreads = (int)total;
    if (nthreads <= 1) {
        run_slices(L, 0, total, fn, ctx);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t chunk = (total + nt - 1) / nt;
        int64_t s = (int64_t)t * chunk, e = s + chunk;
        if (e > total) e = total;
        if (s < e) run_slices(L, s, e, fn, ctx);
    }
}
