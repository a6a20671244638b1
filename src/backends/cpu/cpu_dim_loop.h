/* cpu_dim_loop.h - walks tensors slice by slice along one dim.
 *
 * The CPU kernels that work along a dim (scatter, index_add, cumsum, sort)
 * need whole slices: every element with the same coordinates outside `dim`.
 * This loop hands each slice, whole, to one thread: fn gets the operands'
 * pointers at coordinate 0 of `dim`, their byte strides along `dim` and the
 * slice length. Two slices never touch the same output elements, so kernels
 * that accumulate along a slice (duplicate indices in scatter_add) stay
 * race-free and deterministic under OpenMP. */
#ifndef ND_CPU_DIM_LOOP_H
#define ND_CPU_DIM_LOOP_H

#include "cpu_loop.h"

typedef struct {
    int nops, ndim;               /* ndim: merged outer dims (dim removed) */
    int64_t nouter, n;            /* number of slices, slice length */
    int64_t shape[ND_MAX_DIMS];   /* outer dims */
    int64_t strides[ND_LOOP_MAX_OPS][ND_MAX_DIMS]; /* bytes, outer dims */
    int64_t inner[ND_LOOP_MAX_OPS];                /* bytes along dim */
    char *base[ND_LOOP_MAX_OPS];
} nd_dim_loop;

/* Iterates over `shape` (ndim dims; each operand's own shape must be at
 * least as large in every dim) using each operand's own strides. A 0-dim
 * shape is one slice of length 1. */
void nd_dim_loop_init(nd_dim_loop *L, int nops, const nd_tensor *const *ts,
                      const int64_t *shape, int ndim, int dim);
/* For kernels that keep scratch per worker (sort): the slices are split into
 * `nchunks` runs of neighbouring slices, each run by one thread, and fn gets
 * the run's number `chunk` (0 <= chunk < nchunks), so scratch indexed by it
 * is never shared. Never index such scratch by omp_get_thread_num(): called
 * from the caller's own parallel region the loop runs serially there, and
 * the thread number is the caller's (up to its team size, not ours).
 * nd_dim_loop_chunks gives the count to pass (1 when the loop is serial);
 * any nchunks >= 1 is valid and every chunk runs, whatever team OpenMP
 * actually gives. */
typedef void (*nd_chunk_fn)(char **ptrs, const int64_t *strides, int64_t n, int chunk,
                            void *ctx);
int nd_dim_loop_chunks(const nd_dim_loop *L, int parallel);
void nd_dim_loop_run_chunks(const nd_dim_loop *L, nd_chunk_fn fn, void *ctx, int nchunks);

/* A tile is up to ND_TILE_MAX neighbouring slices ("lanes", along the
 * innermost outer dim): fn gets their pointers at coordinate 0 of dim, the
 * byte strides along dim (dstr) and across lanes (lstr), the slice length n
 * and the lane count. A kernel loops `for k < n: for l < lanes`, so when
 * dim is the outer, strided dim (index_add along dim 0 of a row-major
 * tensor) its inner loop still walks memory in order. When the slices
 * themselves are the more contiguous direction, tiles have one lane each.
 * Tiles never share a lane, so per-lane accumulation stays race-free. */
#define ND_TILE_MAX 1024
typedef void (*nd_tile_fn)(char **ptrs, const int64_t *dstr, int64_t n, const int64_t *lstr,
                           int64_t lanes, void *ctx);
void nd_dim_loop_run_tiles(const nd_dim_loop *L, nd_tile_fn fn, void *ctx, int parallel);

#endif
