/* cpu_fused.c - fused inference kernels: convolution and linear layers whose
 * GEMM epilogue adds the bias and applies the activation (nd.nn.fuse puts
 * them in place of Conv2d+BatchNorm2d+ReLU and Linear(+BatchNorm1d)+ReLU,
 * with the BatchNorm folded into the weights).
 *
 * conv2d, per chunk of nb images (nb * L about CHUNK_COLS columns):
 *   cols (C*kh*kw, nb*L) = im2col written straight into the GEMM's layout
 *                          (the unfused op writes (N, C*kh*kw, L) and then
 *                          copies it into this layout)
 *   R_g  (O/G, nb*L)     = w_g (O/G, K) @ cols_g (K, nb*L), one GEMM per group
 *   out  (nb, O, L)      = act(R + b), in the one pass that moves R to NCHW
 *                          (a one-image chunk: R is out itself, the pass runs in
 *                          place)
 * Against the unfused Conv2d -> BatchNorm2d -> ReLU this saves the cols
 * copy, the bias pass, the whole BatchNorm pass and the ReLU pass. Chunking
 * bounds the im2col buffer (the unfused op holds two of them for the whole
 * batch) and keeps it in cache between im2col and the GEMM.
 *
 * linear: out (M, O) = x (M, K) @ w^T, then one pass of act(out + b). (The
 * other order - out initialised to the bias, GEMM with beta = 1, then the
 * activation pass - costs one more pass over out when there is an
 * activation, and the same when there is none.)
 *
 * BLAS is never called inside an OpenMP region (ARCHITECTURE.md): the
 * im2col and epilogue loops are parallel, the GEMMs thread themselves. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"

/* Images per chunk: about this many GEMM columns (one image per chunk from
 * 32x32 maps up). Timed on ResNet9 and ResNet-18 at batch 8 and 128 (1
 * thread): 512 to 1024 did best, 4096 to 16384 were 5-15% slower at batch
 * 128 (a larger im2col buffer falls out of cache). NEEDLE_FUSED_CHUNK_COLS
 * overrides it, for tuning (read per call: getenv is cheap next to a conv). */
#define CHUNK_COLS_DEFAULT 1024

static int64_t chunk_cols(void) {
    const char *e = getenv("NEEDLE_FUSED_CHUNK_COLS");
    long long n = e ? atoll(e) : 0;
    return n > 0 ? n : CHUNK_COLS_DEFAULT;
}

/* The ow range [lo, hi) whose column x = ow * sw + x0 lies inside 0..W-1
 * (cpu_conv.c's unit_range for any stride): the row copy needs no test. */
static inline void col_range(int64_t x0, int64_t sw, int64_t W, int64_t lw, int64_t *lo,
                             int64_t *hi) {
    int64_t a = x0 >= 0 ? 0 : (-x0 + sw - 1) / sw;
    int64_t b = W - 1 - x0 < 0 ? 0 : (W - 1 - x0) / sw + 1;
    if (b > lw) b = lw;
    if (a > lw) a = lw;
    if (b < a) b = a;
    *lo = a;
    *hi = b;
}

/* Does kernel tap (i, j) read only padding at every output position? */
static bool tap_outside(const nd_conv_geom *g, int64_t i, int64_t j, int64_t H, int64_t W) {
    bool row = false, col = false;
    for (int64_t oh = 0; oh < g->lh && !row; oh++) {
        int64_t y = oh * g->sh - g->ph + i * g->dh;
        row = y >= 0 && y < H;
    }
    for (int64_t ow = 0; ow < g->lw && !col; ow++) {
        int64_t x = ow * g->sw - g->pw + j * g->dw;
        col = x >= 0 && x < W;
    }
    return !row || !col;
}

static inline void gemm_nn(int M, int N, int K, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
}
static inline void gemm_nn_d(int M, int N, int K, const double *A, const double *B, double *C) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
}
static inline void gemm_nt(int M, int N, int K, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
}
static inline void gemm_nt_d(int M, int N, int K, const double *A, const double *B, double *C) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0, A, K, B, K, 0.0, C, N);
}

/* One row (length L) of the epilogue: dst = act(src + bias). */
#define EPI_ROW(T, dst, src, L, bias, relu)                                    \
    do {                                                                       \
        const T bv_ = (bias);                                                  \
        if (relu) {                                                            \
            _Pragma("omp simd")                                                \
            for (int64_t l_ = 0; l_ < (L); l_++) {                             \
                T v_ = (src)[l_] + bv_;                                        \
                (dst)[l_] = v_ > (T)0 ? v_ : (T)0;                             \
            }                                                                  \
        } else {                                                               \
            _Pragma("omp simd")                                                \
            for (int64_t l_ = 0; l_ < (L); l_++) (dst)[l_] = (src)[l_] + bv_;  \
        }                                                                      \
    } while (0)

/* conv2d for element type T with GEMM function GEMM (see the top). */
#define CONV_FUSED(T, GEMM)                                                                    \
    do {                                                                                       \
        const T *X = (const T *)nd_ptr(x), *Wt = (const T *)nd_ptr(w);                         \
        const T *B = b ? (const T *)nd_ptr(b) : NULL;                                          \
        T *OUT = (T *)nd_ptr(out);                                                             \
        T *COLS = colsbuf ? (T *)nd_ptr(colsbuf) : NULL;                                       \
        T *R = rbuf ? (T *)nd_ptr(rbuf) : NULL;                                                \
        for (int64_t n0 = 0; n0 < N; n0 += nb) {                                               \
            const int64_t nc = N - n0 < nb ? N - n0 : nb, NL = nc * L;                         \
            const T *cols;                                                                     \
            if (pointwise && nc == 1) {                                                        \
                cols = X + n0 * C * H * Wd;                                                    \
            } else {                                                                           \
                /* row r = c*kk + i*kw + j, image n of the chunk at column n*L; */             \
                /* rows in parallel, each split into (c, i, j) once */                         \
                _Pragma("omp parallel for if (rows * NL >= ND_PARALLEL_THRESHOLD) schedule(static)") \
                for (int64_t r = 0; r < rows; r++) {                                           \
                    const int64_t c = r / kk, i = (r % kk) / g->kw, j = r % g->kw;             \
                    const int64_t x0 = j * g->dw - g->pw;                                      \
                    int64_t lo, hi;                                                            \
                    col_range(x0, g->sw, Wd, g->lw, &lo, &hi);                                 \
                    if (tap_outside(g, i, j, H, Wd)) { /* all padding: e.g. 3x3 on 1x1 maps */ \
                        memset(COLS + r * NL, 0, sizeof(T) * (size_t)NL);                      \
                        continue;                                                              \
                    }                                                                          \
                    for (int64_t n = 0; n < nc; n++) {                                         \
                        const T *xp = X + ((n0 + n) * C + c) * H * Wd;                         \
                        T *row = COLS + r * NL + n * L;                                        \
                        for (int64_t oh = 0; oh < g->lh; oh++) {                               \
                            const int64_t y = oh * g->sh - g->ph + i * g->dh;                  \
                            T *dst = row + oh * g->lw;                                         \
                            if (y < 0 || y >= H) {                                             \
                                for (int64_t ow = 0; ow < g->lw; ow++) dst[ow] = 0;            \
                                continue;                                                      \
                            }                                                                  \
                            const T *src = xp + y * Wd + x0;                                   \
                            for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;                   \
                            if (g->sw == 1)                                                    \
                                for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow];        \
                            else                                                               \
                                for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * g->sw]; \
                            for (int64_t ow = hi; ow < g->lw; ow++) dst[ow] = 0;               \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                cols = COLS;                                                                   \
            }                                                                                  \
            T *dst = nc == 1 ? OUT + n0 * O * L : R; /* (O, nc*L) */                           \
            for (int64_t gi = 0; gi < G; gi++)                                                 \
                GEMM((int)Og, (int)NL, (int)K, Wt + gi * Og * K, cols + gi * K * NL,           \
                     dst + gi * Og * NL);                                                      \
            /* epilogue: (O, nc, L) -> (nc, O, L) with bias and activation */                  \
            T *obase = OUT + n0 * O * L;                                                       \
            _Pragma("omp parallel for if (O * NL >= ND_PARALLEL_THRESHOLD) schedule(static)")  \
            for (int64_t o = 0; o < O; o++) {                                                  \
                const T bo = B ? B[o] : (T)0;                                                  \
                for (int64_t n = 0; n < nc; n++)                                               \
                    EPI_ROW(T, obase + (n * O + o) * L, dst + o * NL + n * L, L, bo, relu);    \
            }                                                                                  \
        }                                                                                      \
    } while (0)

nd_status nd_cpu_conv2d_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                              nd_activation act) {
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], Wd = x->shape[3];
    const int64_t O = w->shape[0], G = groups, Og = O / G, kk = g->kh * g->kw;
    const int64_t K = (C / G) * kk, L = g->lh * g->lw, rows = C * kk;
    const bool relu = act == ND_ACT_RELU;
    if (N == 0 || O == 0 || L == 0) return ND_OK;
    if (K == 0) /* op_fused.c runs the composed ops for these */
        return nd_fail(ND_ERR_ARG, "fused_conv2d: no input channels");
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "fused_conv2d: no cpu kernel for %s", nd_dtype_name(x->dtype));
    const bool pointwise = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
                           g->pw == 0 && g->lh == H && g->lw == Wd;
    int64_t nb = (chunk_cols() + L - 1) / L;
    if (nb > N) nb = N;
    if (nb < 1) nb = 1;
    if (Og > INT_MAX || K > INT_MAX || nb * L > INT_MAX)
        return nd_fail(ND_ERR_ARG, "fused_conv2d: GEMM dims M=%lld N=%lld K=%lld exceed BLAS's int "
                       "range", (long long)Og, (long long)(nb * L), (long long)K);
    nd_tensor *colsbuf = NULL, *rbuf = NULL;
    nd_status st = ND_OK;
    if (!(pointwise && nb == 1)) {
        int64_t cs[2] = {rows, nb * L};
        st = nd_empty(cs, 2, x->dtype, &colsbuf);
    }
    if (st == ND_OK && nb > 1) {
        int64_t rs[2] = {O, nb * L};
        st = nd_empty(rs, 2, x->dtype, &rbuf);
    }
    if (st == ND_OK) {
        if (x->dtype == ND_FLOAT32) CONV_FUSED(float, gemm_nn);
        else CONV_FUSED(double, gemm_nn_d);
    }
    nd_release(colsbuf);
    nd_release(rbuf);
    return st;
}

#define LINEAR_FUSED(T, GEMM)                                                                  \
    do {                                                                                       \
        const T *X = (const T *)nd_ptr(x), *Wt = (const T *)nd_ptr(w);                         \
        const T *B = b ? (const T *)nd_ptr(b) : NULL;                                          \
        T *OUT = (T *)nd_ptr(out);                                                             \
        GEMM((int)M, (int)O, (int)K, X, Wt, OUT);                                              \
        if (!B && !relu) break;                                                                \
        _Pragma("omp parallel for if (M * O >= ND_PARALLEL_THRESHOLD) schedule(static)")       \
        for (int64_t m = 0; m < M; m++) {                                                      \
            T *row = OUT + m * O;                                                              \
            if (B && relu) {                                                                   \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) {                                              \
                    T v = row[o] + B[o];                                                       \
                    row[o] = v > (T)0 ? v : (T)0;                                              \
                }                                                                              \
            } else if (B) {                                                                    \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) row[o] += B[o];                                \
            } else {                                                                           \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) row[o] = row[o] > (T)0 ? row[o] : (T)0;        \
            }                                                                                  \
        }                                                                                      \
    } while (0)

nd_status nd_cpu_linear_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, nd_activation act) {
    const int64_t M = x->shape[0], K = x->shape[1], O = w->shape[0];
    const bool relu = act == ND_ACT_RELU;
    if (M == 0 || O == 0) return ND_OK;
    if (K == 0) /* op_fused.c runs the composed ops for these */
        return nd_fail(ND_ERR_ARG, "fused_linear: no input features");
    if (M > INT_MAX || K > INT_MAX || O > INT_MAX)
        return nd_fail(ND_ERR_ARG, "fused_linear: GEMM dims M=%lld N=%lld K=%lld exceed BLAS's int "
                       "range", (long long)M, (long long)O, (long long)K);
    if (x->dtype == ND_FLOAT32) LINEAR_FUSED(float, gemm_nt);
    else if (x->dtype == ND_FLOAT64) LINEAR_FUSED(double, gemm_nt_d);
    else return nd_fail(ND_ERR_DTYPE, "fused_linear: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return ND_OK;
}
