/* cpu_conv.c - im2col and its adjoint col2im, the data movement half of
 * convolution (the other half is one GEMM per (batch, group), done by the
 * op with matmul).
 *
 * Plane p = n*C + c of x (H*W elements) owns rows p*kh*kw .. (p+1)*kh*kw - 1
 * of cols (each lh*lw long), so both kernels run planes (or rows) in
 * parallel without two threads ever writing the same element. Along W a unit
 * stride (the common case) turns each row segment into one copy or one
 * vectorisable add between two zero-filled edges. */
#include <string.h>
#include "cpu_kernels.h"

/* The ow range [lo, hi) whose column x = ow + x0 lies inside 0..W-1
 * (stride 1 along W). */
static inline void unit_range(int64_t x0, int64_t W, int64_t lw, int64_t *lo, int64_t *hi) {
    int64_t a = x0 < 0 ? -x0 : 0, b = W - x0;
    if (b > lw) b = lw;
    if (a > lw) a = lw;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

#define IM2COL(T)                                                                            \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(x);                                                   \
        T *COLS = (T *)nd_ptr(cols);                                                         \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (rows * L >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < rows; r++) {                                                 \
            int64_t p = r / kk, i = (r % kk) / g->kw, j = r % g->kw;                         \
            const T *xp = X + p * H * W;                                                     \
            T *row = COLS + r * L;                                                           \
            int64_t x0 = j * g->dw - g->pw;                                                  \
            for (int64_t oh = 0; oh < g->lh; oh++) {                                         \
                int64_t y = oh * g->sh - g->ph + i * g->dh;                                  \
                T *dst = row + oh * g->lw;                                                   \
                if (y < 0 || y >= H) {                                                       \
                    memset(dst, 0, sizeof(T) * (size_t)g->lw);                               \
                    continue;                                                                \
                }                                                                            \
                const T *src = xp + y * W;                                                   \
                if (g->sw == 1) {                                                            \
                    int64_t lo, hi;                                                          \
                    unit_range(x0, W, g->lw, &lo, &hi);                                      \
                    for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;                         \
                    if (hi > lo) memcpy(dst + lo, src + lo + x0, sizeof(T) * (size_t)(hi - lo)); \
                    for (int64_t ow = hi; ow < g->lw; ow++) dst[ow] = 0;                     \
                } else {                                                                     \
                    for (int64_t ow = 0; ow < g->lw; ow++) {                                 \
                        int64_t xx = ow * g->sw + x0;                                        \
                        dst[ow] = (xx >= 0 && xx < W) ? src[xx] : (T)0;                      \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    } while (0)

nd_status nd_cpu_im2col(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t kk = g->kh * g->kw, L = g->lh * g->lw, rows = N * C * kk;
    if (rows == 0 || L == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32) IM2COL(float);
    else if (x->dtype == ND_FLOAT64) IM2COL(double);
    else return nd_fail(ND_ERR_DTYPE, "im2col: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return ND_OK;
}

#define COL2IM(T)                                                                             \
    do {                                                                                      \
        T *X = (T *)nd_ptr(xo);                                                               \
        const T *COLS = (const T *)nd_ptr(cols);                                              \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (planes * kk * L >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t p = 0; p < planes; p++) {                                                \
            T *xp = X + p * H * W;                                                            \
            memset(xp, 0, sizeof(T) * (size_t)(H * W));                                       \
            for (int64_t i = 0; i < g->kh; i++)                                               \
                for (int64_t j = 0; j < g->kw; j++) {                                         \
                    const T *row = COLS + (p * kk + i * g->kw + j) * L;                       \
                    int64_t x0 = j * g->dw - g->pw;                                           \
                    int64_t lo = 0, hi = 0;                                                   \
                    if (g->sw == 1) unit_range(x0, W, g->lw, &lo, &hi);                       \
                    for (int64_t oh = 0; oh < g->lh; oh++) {                                  \
                        int64_t y = oh * g->sh - g->ph + i * g->dh;                           \
                        if (y < 0 || y >= H) continue;                                        \
                        const T *src = row + oh * g->lw;                                      \
                        T *dst = xp + y * W;                                                  \
                        if (g->sw == 1) {                                                     \
                            _Pragma("omp simd")                                               \
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow + x0] += src[ow];     \
                        } else {                                                              \
                            for (int64_t ow = 0; ow < g->lw; ow++) {                          \
                                int64_t xx = ow * g->sw + x0;                                 \
                                if (xx >= 0 && xx < W) dst[xx] += src[ow];                    \
                            }                                                                 \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
        }                                                                                     \
    } while (0)

nd_status nd_cpu_col2im(nd_tensor *xo, const nd_tensor *cols, const nd_conv_geom *g) {
    int64_t N = xo->shape[0], C = xo->shape[1], H = xo->shape[2], W = xo->shape[3];
    int64_t kk = g->kh * g->kw, L = g->lh * g->lw, planes = N * C;
    if (planes == 0 || H * W == 0) return ND_OK;
    if (xo->dtype == ND_FLOAT32) COL2IM(float);
    else if (xo->dtype == ND_FLOAT64) COL2IM(double);
    else return nd_fail(ND_ERR_DTYPE, "col2im: no cpu kernel for %s", nd_dtype_name(xo->dtype));
    return ND_OK;
}
