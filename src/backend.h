/* backend.h - the function table each device implements.
 *
 * Ops (src/ops) do every shape, dtype and device check, allocate outputs and
 * then call one of these. A backend may assume:
 *   - every tensor argument is on its device;
 *   - elementwise operands are already broadcast (expanded) to the output's
 *     shape and cast to the compute dtype the op chose;
 *   - outputs are freshly allocated and contiguous unless stated otherwise.
 * A missing entry (NULL) makes the op fail with an error naming the op and
 * the device: never a silent fallback to another device. */
#ifndef ND_BACKEND_H
#define ND_BACKEND_H

#include "tensor.h"

typedef enum { ND_RANDOM_UNIFORM, ND_RANDOM_NORMAL, ND_RANDOM_INT, ND_RANDOM_BERNOULLI } nd_random_kind;

typedef struct nd_backend {
    const char *name;
    /* dst = src, any strides for both (dst may be a view), casting dtypes;
     * src already has dst's shape (possibly with 0 strides). */
    nd_status (*copy)(nd_tensor *dst, const nd_tensor *src);
    /* value: one element in dst's dtype; dst any strides */
    nd_status (*fill)(nd_tensor *dst, const void *value);
    nd_status (*unary)(nd_unary_op op, nd_tensor *out, const nd_tensor *x);
    /* a and b in the compute dtype; out in it too, or bool for comparisons. */
    nd_status (*binary)(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
    /* s: one element in a's dtype */
    nd_status (*binary_scalar)(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                               int scalar_first);
    nd_status (*where)(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a,
                       const nd_tensor *b);
    nd_status (*clamp)(nd_tensor *out, const nd_tensor *x, double lo, double hi);
    /* out has x's rank with reduced dims of size 1 (keepdim form). */
    nd_status (*reduce)(nd_reduce_op op, nd_tensor *out, const nd_tensor *x,
                        const bool *reduced, int correction);
    /* values (x's dtype) and int64 indices along dim, keepdim form. */
    nd_status (*max_dim)(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                         int is_min);
    /* a (B..., M, K) @ b (B..., K, N) -> out (B..., M, N); batch dims equal
     * (possibly 0-strided), any strides on a and b. */
    nd_status (*matmul)(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
    nd_status (*gather)(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
    /* out already holds a copy of the destination; writes src at index. */
    nd_status (*scatter)(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                         int accumulate);
    nd_status (*index_select)(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
    /* out already holds a copy of x; out.index_add_(dim, index, alpha * src). */
    nd_status (*index_add)(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                           double alpha);
    /* out already holds a copy of x; mask broadcast to out's shape (bool). */
    nd_status (*masked_fill)(nd_tensor *out, const nd_tensor *mask, double value);
    nd_status (*cumsum)(nd_tensor *out, const nd_tensor *x, int dim);
    nd_status (*sort)(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                      int descending);
    /* (log_)softmax along dim; x and out contiguous, float32 or float64 */
    nd_status (*softmax)(nd_tensor *out, const nd_tensor *x, int dim, bool log);
    /* Element i of out (row-major) draws from counter (offset + i) of the
     * Philox stream keyed by seed, so results never depend on threads.
     * a, b: low/high for uniform and int, mean/std for normal; for bernoulli
     * the probabilities are in p (out's shape). */
    nd_status (*random)(nd_tensor *out, nd_random_kind kind, double a, double b,
                        const nd_tensor *p, uint64_t seed, uint64_t offset);
} nd_backend;

extern const nd_backend nd_cpu_backend;

/* The backend that owns t's memory. */
static inline const nd_backend *nd_backend_of(const nd_tensor *t) {
    (void)t; /* the OpenCL issue adds devices; until then everything is on the cpu */
    return &nd_cpu_backend;
}

/* Errors with "<op>: not implemented on device <name>" when fn is NULL. */
#define ND_BACKEND_CALL(be, fn, opname, ...) \
    ((be)->fn ? (be)->fn(__VA_ARGS__) \
              : nd_fail(ND_ERR_UNSUPPORTED, "%s: no kernel on device '%s'", opname, (be)->name))

#endif
