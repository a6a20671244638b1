/* cpu_loop.h - the strided loop engine under every elementwise CPU kernel.
 *
 * Like a NumPy ufunc: an inner function processes one run of n elements
 * with a byte stride per operand; the engine merges dims that are contiguous
 * with respect to each other (so a contiguous tensor is one run), walks the
 * rest with a counter, and splits the flat range across OpenMP threads above
 * a size threshold. Operand 0 is conventionally the output. */
#ifndef ND_CPU_LOOP_H
#define ND_CPU_LOOP_H

#include "tensor.h"

#define ND_LOOP_MAX_OPS 16 /* a fused run's tensors (ND_EW_MAX_TENSORS) */

typedef void (*nd_inner_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);

typedef struct {
    int nops, ndim;
    int64_t numel;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_LOOP_MAX_OPS][ND_MAX_DIMS]; /* bytes */
    char *base[ND_LOOP_MAX_OPS];
} nd_loop;

/* All tensors must have the same shape (broadcast beforehand with expand).
 * A NULL entry with a non-NULL scalar_ptr[i] is a 0-stride scalar operand. */
void nd_loop_init(nd_loop *L, int nops, const nd_tensor *const *ts);
/* Adds a 0-stride operand pointing at a single value. */
void nd_loop_add_scalar(nd_loop *L, void *value);
/* Runs fn over every element; in parallel when `parallel` and large. */
void nd_loop_run(const nd_loop *L, nd_inner_fn fn, void *ctx, int parallel);

/* Convenience: true if the run is dense for all operands of the given sizes. */
static inline int nd_run_dense(const int64_t *s, int nops, const size_t *sizes) {
    for (int i = 0; i < nops; i++)
        if (s[i] != (int64_t)sizes[i]) return 0;
    return 1;
}

#endif
