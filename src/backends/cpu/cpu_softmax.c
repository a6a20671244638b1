/* cpu_softmax.c - fused, numerically stable (log_)softmax.
 *
 * The tensor is seen as (outer, n, inner) around the softmax dim; each of
 * the outer*inner rows is reduced in three passes over its n elements (max,
 * sum of exp(x - max), write) with a double accumulator. Rows run in
 * parallel. One pass over memory instead of the five tensors a composite
 * max/sub/exp/sum/div would write. */
#include <math.h>
#include "cpu_kernels.h"

#define SOFTMAX_ROWS(T, EXP, LOG)                                                          \
    do {                                                                                   \
        const T *X = (const T *)nd_ptr(x);                                                 \
        T *Y = (T *)nd_ptr(out);                                                           \
        _Pragma("omp parallel for if (outer * inner * n >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < outer * inner; r++) {                                      \
            int64_t o = r / inner, i = r % inner;                                          \
            const T *xr = X + o * n * inner + i;                                           \
            T *yr = Y + o * n * inner + i;                                                 \
            T m = xr[0];                                                                   \
            for (int64_t k = 1; k < n; k++) if (xr[k * inner] > m || xr[k * inner] != xr[k * inner]) m = xr[k * inner]; \
            if (isinf(m) && m < 0) m = 0; /* a row of -inf: avoid inf - inf */             \
            double sum = 0;                                                                \
            for (int64_t k = 0; k < n; k++) sum += EXP(xr[k * inner] - m);                 \
            if (want_log) {                                                                   \
                T lse = (T)LOG(sum);                                                       \
                for (int64_t k = 0; k < n; k++) yr[k * inner] = xr[k * inner] - m - lse;   \
            } else {                                                                       \
                T inv = (T)(1.0 / sum);                                                    \
                for (int64_t k = 0; k < n; k++) yr[k * inner] = EXP(xr[k * inner] - m) * inv; \
            }                                                                              \
        }                                                                                  \
    } while (0)

nd_status nd_cpu_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool want_log) {
    int64_t outer = 1, inner = 1, n = x->ndim ? x->shape[dim] : 1;
    for (int i = 0; i < dim; i++) outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) inner *= x->shape[i];
    if (n == 0 || outer * inner == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32) SOFTMAX_ROWS(float, expf, logf);
    else SOFTMAX_ROWS(double, exp, log);
    return ND_OK;
}
