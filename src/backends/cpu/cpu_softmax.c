/* cpu_softmax.c - fused, numerically stable (log_)softmax.
 *
 * The tensor is seen as (outer, n, inner) around the softmax dim. Rows along
 * a contiguous last dim (inner == 1, the common case) take three
 * vectorisable passes: max, exp(x - max) written out while summing, scale.
 * exp is a branch-free polynomial (Cephes' expf, about 1 ulp) that the
 * compiler can vectorise, unlike libm's expf; below the underflow cutoff it
 * returns exactly 0, so masked (-inf) entries get exactly zero weight.
 * float64 and strided rows use libm. Rows run in parallel. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cpu_kernels.h"
#include "cpu_math.h"


/* Built twice and picked at load time (GCC function multiversioning): the
 * baseline x86-64 build has only 4-wide SSE2 vectors, AVX2 + FMA machines
 * get 8-wide ones. The clone is "arch=x86-64-v3" (AVX2, FMA, BMI...), not
 * "arch=haswell": GCC dispatches an arch=<cpu> clone only on that very CPU
 * model, so every other CPU (AMD, Skylake and later) ran the SSE2 clone at
 * half the speed. */
ND_ISA_CLONES
static void row_f32(const float *x, float *y, int64_t n, bool want_log) {
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t k = 0; k < n; k++) {
        m = x[k] > m ? x[k] : m;
        nan |= x[k] != x[k];
    }
    if (nan) {
        for (int64_t k = 0; k < n; k++) y[k] = NAN;
        return;
    }
    if (m == -INFINITY) m = 0; /* a row of -inf: 0/0 below gives nan, as PyTorch */
    float sum = 0;
    if (want_log) {
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < n; k++) sum += exp_poly(x[k] - m);
        float ls = logf(sum); /* (x - m) - ls keeps the digits m + ls would lose */
#pragma omp simd
        for (int64_t k = 0; k < n; k++) y[k] = (x[k] - m) - ls;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < n; k++) {
            float e = exp_poly(x[k] - m);
            y[k] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t k = 0; k < n; k++) y[k] *= inv;
    }
}

/* one general row (float64, or a softmax dim that is not the last): n
 * elements inner apart */
#define STRIDED_ROW(T, NAME, EXP, LOG)                                                     \
    static void NAME(const T *xr, T *yr, int64_t n, int64_t inner, bool want_log) {        \
        T m = xr[0];                                                                       \
        for (int64_t k = 1; k < n; k++)                                                    \
            if (xr[k * inner] > m || xr[k * inner] != xr[k * inner]) m = xr[k * inner];    \
        if (isinf(m) && m < 0) m = 0;                                                      \
        double sum = 0;                                                                    \
        for (int64_t k = 0; k < n; k++) {                                                  \
            T e = EXP(xr[k * inner] - m);                                                  \
            if (!want_log) yr[k * inner] = e;                                              \
            sum += e;                                                                      \
        }                                                                                  \
        if (want_log) {                                                                    \
            T ls = (T)LOG(sum);                                                            \
            for (int64_t k = 0; k < n; k++) yr[k * inner] = (xr[k * inner] - m) - ls;     \
        } else {                                                                           \
            T inv = (T)(1.0 / sum);                                                        \
            for (int64_t k = 0; k < n; k++) yr[k * inner] *= inv;                          \
        }                                                                                  \
    }
STRIDED_ROW(float, strided_row_f32, expf, logf)
STRIDED_ROW(double, strided_row_f64, exp, log)

#define STRIDED_ROWS(T, ROW)                                                               \
    do {                                                                                   \
        const T *X = (const T *)nd_ptr(x);                                                 \
        T *Y = (T *)nd_ptr(out);                                                           \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (outer * inner * n >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < outer * inner; r++) {                                      \
            int64_t o = r / inner, i = r % inner;                                          \
            ROW(X + o * n * inner + i, Y + o * n * inner + i, n, inner, want_log);         \
        }                                                                                  \
    } while (0)

void nd_cpu_softmax_row(nd_dtype dt, const void *x, void *y, int64_t n, bool want_log) {
    if (dt == ND_FLOAT32) row_f32(x, y, n, want_log);
    else strided_row_f64(x, y, n, 1, want_log);
}

nd_status nd_cpu_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool want_log) {
    int64_t outer = 1, inner = 1, n = x->ndim ? x->shape[dim] : 1;
    for (int i = 0; i < dim; i++) outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) inner *= x->shape[i];
    if (n == 0 || outer * inner == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32 && inner == 1) {
        const float *X = (const float *)nd_ptr(x);
        float *Y = (float *)nd_ptr(out);
#pragma omp parallel for num_threads(nd_cpu_threads()) if (outer * n >= ND_PARALLEL_THRESHOLD) schedule(static)
        for (int64_t o = 0; o < outer; o++) row_f32(X + o * n, Y + o * n, n, want_log);
    } else if (x->dtype == ND_FLOAT32) {
        STRIDED_ROWS(float, strided_row_f32);
    } else {
        STRIDED_ROWS(double, strided_row_f64);
    }
    return ND_OK;
}
