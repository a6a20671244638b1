/* cpu_pool.c - 2-D max and average pooling, forward and backward, on
 * contiguous NCHW planes; planes run in parallel (a plane's gradient is
 * written by one thread only, so the backward kernels need no atomics).
 *
 * The window arithmetic is PyTorch's CPU kernels' (MaxPoolKernel.cpp,
 * AvgPoolKernel.cpp, AdaptiveAvgPoolKernel.cpp), so results, tie-breaking
 * and divisors agree with it exactly. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cpu_kernels.h"

/* ---------------------------------------------------------------- max */

/* take ? a : b through the bits, so the compiler cannot make it a branch
 * (it did, for the ternary: see MAX_POOL) */
static inline float select_f32(int take, float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, 4), memcpy(&ub, &b, 4);
    ub ^= (ua ^ ub) & (0u - (uint32_t)take);
    memcpy(&b, &ub, 4);
    return b;
}
static inline double select_f64(int take, double a, double b) {
    uint64_t ua, ub;
    memcpy(&ua, &a, 8), memcpy(&ub, &b, 8);
    ub ^= (ua ^ ub) & (0u - (uint64_t)take);
    memcpy(&b, &ub, 8);
    return b;
}
#define POOL_SELECT(take, a, b) _Generic((b), float: select_f32, double: select_f64)(take, a, b)

/* Output rows in chunks of up to POOL_CHUNK outputs, tap by tap: for each
 * tap (i, j) in window order, every output of the chunk whose window holds
 * it compares it with its best so far. Each output sees its taps in the
 * order of a window-by-window loop (so ties and NaNs resolve the same), but
 * the chunk's outputs are independent chains: one window at a time, each
 * comparison waited for the previous one (ResNet-50's 3x3 stride-2 stem
 * pool took 11 ms at batch 4, branchy or not). */
#define POOL_CHUNK 256
#define MAX_POOL(T)                                                                           \
    do {                                                                                      \
        const T *X = (const T *)nd_ptr(x);                                                    \
        T *Y = (T *)nd_ptr(out);                                                              \
        int64_t *I = (int64_t *)nd_ptr(indices);                                              \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (planes * OL * p->kh * p->kw >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t pl = 0; pl < planes; pl++) {                                             \
            const T *xp = X + pl * H * W;                                                     \
            T *yp = Y + pl * OL;                                                              \
            int64_t *ip = I + pl * OL;                                                        \
            T best[POOL_CHUNK];                                                               \
            int64_t bi[POOL_CHUNK];                                                           \
            for (int64_t oh = 0; oh < p->oh; oh++)                                            \
                for (int64_t c0 = 0; c0 < p->ow; c0 += POOL_CHUNK) {                          \
                    const int64_t c1 = c0 + POOL_CHUNK < p->ow ? c0 + POOL_CHUNK : p->ow;     \
                    /* an empty window keeps -inf at its first in-range position */           \
                    int64_t h0 = oh * p->sh - p->ph;                                          \
                    while (h0 < 0) h0 += p->dh;                                               \
                    for (int64_t o = c0; o < c1; o++) {                                       \
                        int64_t w0 = o * p->sw - p->pw;                                       \
                        while (w0 < 0) w0 += p->dw;                                           \
                        best[o - c0] = -INFINITY;                                             \
                        bi[o - c0] = h0 * W + w0;                                             \
                    }                                                                         \
                    for (int64_t i = 0; i < p->kh; i++) {                                     \
                        const int64_t h = oh * p->sh - p->ph + i * p->dh;                     \
                        if (h < 0 || h >= H) continue;                                        \
                        const T *xr = xp + h * W;                                             \
                        for (int64_t j = 0; j < p->kw; j++) {                                 \
                            /* the outputs o whose tap j reads column o*sw - pw + j*dw in     \
                             * [0, W) */                                                      \
                            const int64_t off = j * p->dw - p->pw;                            \
                            int64_t lo = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;           \
                            int64_t hi = W - 1 - off < 0 ? -1 : (W - 1 - off) / p->sw;        \
                            if (lo < c0) lo = c0;                                             \
                            if (hi > c1 - 1) hi = c1 - 1;                                     \
                            for (int64_t o = lo; o <= hi; o++) {                              \
                                const int64_t at = h * W + o * p->sw + off;                   \
                                const T v = xr[o * p->sw + off];                              \
                                const int take = (v > best[o - c0]) | (v != v);               \
                                best[o - c0] = POOL_SELECT(take, v, best[o - c0]);            \
                                bi[o - c0] ^= (bi[o - c0] ^ at) & -(int64_t)take;             \
                            }                                                                 \
                        }                                                                     \
                    }                                                                         \
                    for (int64_t o = c0; o < c1; o++) {                                       \
                        yp[oh * p->ow + o] = best[o - c0];                                    \
                        ip[oh * p->ow + o] = bi[o - c0];                                      \
                    }                                                                         \
                }                                                                             \
        }                                                                                     \
    } while (0)

nd_status nd_cpu_max_pool2d(nd_tensor *out, nd_tensor *indices, const nd_tensor *x,
                            const nd_pool_geom *p) {
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OL = p->oh * p->ow;
    if (planes == 0 || OL == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32) MAX_POOL(float);
    else if (x->dtype == ND_FLOAT64) MAX_POOL(double);
    else return nd_fail(ND_ERR_DTYPE, "max_pool2d: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return ND_OK;
}

#define MAX_POOL_BACKWARD(T)                                                                  \
    do {                                                                                      \
        T *GX = (T *)nd_ptr(gx);                                                              \
        const T *G = (const T *)nd_ptr(g);                                                    \
        const int64_t *I = (const int64_t *)nd_ptr(indices);                                  \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (planes * (HW + OL) >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t pl = 0; pl < planes; pl++) {                                             \
            T *gp = GX + pl * HW;                                                             \
            const T *g0 = G + pl * OL;                                                        \
            const int64_t *ip = I + pl * OL;                                                  \
            memset(gp, 0, sizeof(T) * (size_t)HW);                                            \
            for (int64_t o = 0; o < OL; o++) {                                                \
                int64_t k = ip[o];                                                            \
                if (k >= 0 && k < HW) gp[k] += g0[o];                                         \
            }                                                                                 \
        }                                                                                     \
    } while (0)

nd_status nd_cpu_max_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices) {
    int64_t planes = gx->shape[0] * gx->shape[1], HW = gx->shape[2] * gx->shape[3];
    int64_t OL = g->shape[2] * g->shape[3];
    if (planes == 0 || HW == 0) return ND_OK;
    if (gx->dtype == ND_FLOAT32) MAX_POOL_BACKWARD(float);
    else if (gx->dtype == ND_FLOAT64) MAX_POOL_BACKWARD(double);
    else return nd_fail(ND_ERR_DTYPE, "max_pool2d_backward: no cpu kernel for %s",
                        nd_dtype_name(gx->dtype));
    return ND_OK;
}

/* ---------------------------------------------------------------- avg */

/* Window [*a, *b) of output o along one axis of size n, and its share of
 * the divisor. */
static inline void avg_window(const nd_pool_geom *p, int axis, int64_t o, int64_t n, int64_t *a,
                              int64_t *b, int64_t *cnt) {
    int64_t osz = axis ? p->ow : p->oh;
    if (p->adaptive) {
        *a = (o * n) / osz;
        *b = ((o + 1) * n + osz - 1) / osz;
        *cnt = *b - *a;
        return;
    }
    int64_t k = axis ? p->kw : p->kh, s = axis ? p->sw : p->sh, pad = axis ? p->pw : p->ph;
    int64_t lo = o * s - pad, hi = lo + k;
    if (hi > n + pad) hi = n + pad;
    int64_t pool = hi - lo;
    if (lo < 0) lo = 0;
    if (hi > n) hi = n;
    *a = lo;
    *b = hi;
    *cnt = p->count_include_pad ? pool : hi - lo;
}

#define AVG_POOL(T)                                                                           \
    do {                                                                                      \
        const T *X = (const T *)nd_ptr(x);                                                    \
        T *Y = (T *)nd_ptr(out);                                                              \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (planes * H * W >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t pl = 0; pl < planes; pl++) {                                             \
            const T *xp = X + pl * H * W;                                                     \
            T *yp = Y + pl * p->oh * p->ow;                                                   \
            for (int64_t oh = 0; oh < p->oh; oh++) {                                          \
                int64_t h0, h1, ch;                                                           \
                avg_window(p, 0, oh, H, &h0, &h1, &ch);                                       \
                for (int64_t ow = 0; ow < p->ow; ow++) {                                      \
                    int64_t w0, w1, cw;                                                       \
                    avg_window(p, 1, ow, W, &w0, &w1, &cw);                                   \
                    T sum = 0;                                                                \
                    if (h0 < h1 && w0 < w1) {                                                 \
                        for (int64_t h = h0; h < h1; h++)                                     \
                            for (int64_t w = w0; w < w1; w++) sum += xp[h * W + w];           \
                        sum /= (T)(ch * cw);                                                  \
                    }                                                                         \
                    yp[oh * p->ow + ow] = sum;                                                \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    } while (0)

nd_status nd_cpu_avg_pool2d(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p) {
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    if (planes == 0 || p->oh * p->ow == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32) AVG_POOL(float);
    else if (x->dtype == ND_FLOAT64) AVG_POOL(double);
    else return nd_fail(ND_ERR_DTYPE, "avg_pool2d: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return ND_OK;
}

#define AVG_POOL_BACKWARD(T)                                                                  \
    do {                                                                                      \
        T *GX = (T *)nd_ptr(gx);                                                              \
        const T *G = (const T *)nd_ptr(g);                                                    \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (planes * H * W >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t pl = 0; pl < planes; pl++) {                                             \
            T *gp = GX + pl * H * W;                                                          \
            const T *g0 = G + pl * p->oh * p->ow;                                             \
            memset(gp, 0, sizeof(T) * (size_t)(H * W));                                       \
            for (int64_t oh = 0; oh < p->oh; oh++) {                                          \
                int64_t h0, h1, ch;                                                           \
                avg_window(p, 0, oh, H, &h0, &h1, &ch);                                       \
                for (int64_t ow = 0; ow < p->ow; ow++) {                                      \
                    int64_t w0, w1, cw;                                                       \
                    avg_window(p, 1, ow, W, &w0, &w1, &cw);                                   \
                    if (h0 >= h1 || w0 >= w1) continue;                                       \
                    T v = g0[oh * p->ow + ow] / (T)(ch * cw);                                 \
                    for (int64_t h = h0; h < h1; h++)                                         \
                        for (int64_t w = w0; w < w1; w++) gp[h * W + w] += v;                 \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    } while (0)

nd_status nd_cpu_avg_pool2d_backward(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p) {
    int64_t planes = gx->shape[0] * gx->shape[1], H = gx->shape[2], W = gx->shape[3];
    if (planes == 0 || H * W == 0) return ND_OK;
    if (gx->dtype == ND_FLOAT32) AVG_POOL_BACKWARD(float);
    else if (gx->dtype == ND_FLOAT64) AVG_POOL_BACKWARD(double);
    else return nd_fail(ND_ERR_DTYPE, "avg_pool2d_backward: no cpu kernel for %s",
                        nd_dtype_name(gx->dtype));
    return ND_OK;
}
