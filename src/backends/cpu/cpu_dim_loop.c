/* cpu_dim_loop.c - see cpu_dim_loop.h. */
#include <omp.h>
#include "cpu_threads.h"
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

/* Positions p at grid cell `start` of L's outer dims (idx: its coordinates). */
static void seek(const nd_dim_loop *L, int64_t start, int64_t *idx, char **p) {
    int64_t rem = start;
    for (int d = L->ndim - 1; d >= 0; d--) {
        idx[d] = rem % L->shape[d];
        rem /= L->shape[d];
    }
    for (int k = 0; k < L->nops; k++) {
        p[k] = L->base[k];
        for (int d = 0; d < L->ndim; d++) p[k] += idx[d] * L->strides[k][d];
    }
}

/* Moves p and idx to the next grid cell (row-major). */
static void step(const nd_dim_loop *L, int64_t *idx, char **p) {
    const int nops = L->nops;
    int d = L->ndim - 1;
    if (d < 0) return;
    for (int k = 0; k < nops; k++) p[k] += L->strides[k][d];
    idx[d]++;
    for (; d > 0 && idx[d] == L->shape[d]; d--) {
        for (int k = 0; k < nops; k++) p[k] += L->strides[k][d - 1] - L->shape[d] * L->strides[k][d];
        idx[d] = 0;
        idx[d - 1]++;
    }
}

static int pick_threads(const nd_dim_loop *L, int64_t tasks, int parallel) {
    if (!parallel || tasks < 2 || L->nouter * L->n < ND_PARALLEL_THRESHOLD) return 1;
    int nt = nd_cpu_threads();
    return nt > tasks ? (int)tasks : nt;
}

int nd_dim_loop_chunks(const nd_dim_loop *L, int parallel) {
    if (L->nouter == 0 || L->n == 0) return 1;
    return pick_threads(L, L->nouter, parallel);
}

/* Runs slices [start, end) as chunk `chunk`, walking the outer coordinates
 * with a counter. */
static void run_chunk(const nd_dim_loop *L, int64_t start, int64_t end, nd_chunk_fn fn,
                      int chunk, void *ctx) {
    int64_t idx[ND_MAX_DIMS];
    char *p[ND_LOOP_MAX_OPS];
    seek(L, start, idx, p);
    for (int64_t s = start; s < end; s++) {
        fn(p, L->inner, L->n, chunk, ctx);
        if (s + 1 < end) step(L, idx, p);
    }
}

void nd_dim_loop_run_chunks(const nd_dim_loop *L, nd_chunk_fn fn, void *ctx, int nchunks) {
    int64_t total = L->nouter;
    if (total == 0 || L->n == 0) return;
    if (nchunks < 1) nchunks = 1;
    if (nchunks > total) nchunks = (int)total;
    int64_t per = (total + nchunks - 1) / nchunks;
    if (nchunks == 1) {
        run_chunk(L, 0, total, fn, 0, ctx);
        return;
    }
    /* The team may be smaller than asked (nested regions, thread limits):
     * each thread takes every nt-th chunk, so all chunks run, each once. */
#pragma omp parallel num_threads(nchunks)
    {
        int nt = omp_get_num_threads();
        for (int c = omp_get_thread_num(); c < nchunks; c += nt) {
            int64_t s = (int64_t)c * per, e = s + per;
            if (e > total) e = total;
            if (s < e) run_chunk(L, s, e, fn, c, ctx);
        }
    }
}

/* Tiles [start, end) of grid G, whose last dim counts chunks of `chunk`
 * lanes out of `lanes` (chunk 0: G's cells are single slices). */
static void run_tiles(const nd_dim_loop *G, int64_t start, int64_t end, int64_t chunk,
                      int64_t lanes, const int64_t *lstr, nd_tile_fn fn, void *ctx) {
    int64_t idx[ND_MAX_DIMS];
    char *p[ND_LOOP_MAX_OPS];
    seek(G, start, idx, p);
    for (int64_t s = start; s < end; s++) {
        int64_t n = 1;
        if (chunk) {
            int64_t first = idx[G->ndim - 1] * chunk;
            n = lanes - first < chunk ? lanes - first : chunk;
        }
        fn(p, G->inner, G->n, lstr, n, ctx);
        if (s + 1 < end) step(G, idx, p);
    }
}

void nd_dim_loop_run_tiles(const nd_dim_loop *L, nd_tile_fn fn, void *ctx, int parallel) {
    if (L->nouter == 0 || L->n == 0) return;
    nd_dim_loop G = *L;
    int64_t chunk = 0, lanes = 1, lstr[ND_LOOP_MAX_OPS] = {0};
    int lane = L->ndim - 1;
    /* Lanes pay off when they are the more contiguous direction of operand
     * 0 (the output), or when slices have a single element. */
    if (L->ndim > 0) {
        int64_t ls = L->strides[0][lane], ds = L->inner[0];
        if (ls < 0) ls = -ls;
        if (ds < 0) ds = -ds;
        if (L->n == 1 || ls < ds) {
            lanes = L->shape[lane];
            int64_t rest = L->nouter / lanes;
            /* enough tiles for the threads, but at least 64 lanes (whole
             * cache lines) and at most ND_TILE_MAX per tile */
            int64_t want = parallel ? 4 * (int64_t)nd_cpu_threads() : 1;
            int64_t per_row = rest >= want ? 1 : (want + rest - 1) / rest;
            chunk = (lanes + per_row - 1) / per_row;
            if (chunk < 64) chunk = 64;
            if (chunk > ND_TILE_MAX) chunk = ND_TILE_MAX;
            if (chunk > lanes) chunk = lanes;
            int64_t nchunks = (lanes + chunk - 1) / chunk;
            for (int k = 0; k < L->nops; k++) {
                lstr[k] = L->strides[k][lane];
                G.strides[k][lane] = L->strides[k][lane] * chunk;
            }
            G.shape[lane] = nchunks;
            G.nouter = rest * nchunks;
        }
    }
    int64_t total = G.nouter;
    int nthreads = pick_threads(L, total, parallel);
    if (nthreads <= 1) {
        run_tiles(&G, 0, total, chunk, lanes, lstr, fn, ctx);
        return;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t per = (total + nt - 1) / nt;
        int64_t s = (int64_t)t * per, e = s + per;
        if (e > total) e = total;
        if (s < e) run_tiles(&G, s, e, chunk, lanes, lstr, fn, ctx);
    }
}
