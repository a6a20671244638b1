/* cpu_conv_gemm.c - conv2d forward and backward as chunked im2col + GEMM,
 * the CPU backend's conv2d_fused and conv2d_backward kernels.
 *
 * Work runs per chunk of nb images (nb * L about 1024 columns, L the output
 * pixels per image; the plan, cpu_conv_plan.c, picks nb), so the im2col buffer stays in cache between
 * its writing and the GEMM that reads it, and is never batch-sized:
 *
 *   cols  (C*nt, nb*L)   im2col of the chunk, written straight into the
 *                        GEMM's layout (row c*nt + t: channel c, live tap t)
 *   forward   R_g  (O/G, nb*L) = W_g (O/G, K) @ cols_g (K, nb*L), then one
 *             pass act(R + b) that moves R to NCHW (a one-image chunk: R is
 *             the output itself and the pass runs in place)
 *   backward  D (O, nb*L) = the chunk of dy in the same layout (a one-image
 *             chunk: dy itself);
 *             dW_g (O/G, K) += D_g @ cols_g^T         (weight gradient)
 *             dcols_g (K, nb*L) = W_g^T @ D_g; col2im (input gradient)
 *             db[o] = the sum of dy over the batch and pixels
 *
 * Dead taps. A kernel tap (i, j) that reads only padding at every output
 * position contributes nothing: 3x3 convolutions on 1x1 maps (the end of
 * ResNet9 and of ResNet-18 on CIFAR) have 8 dead taps out of 9. Only the nt
 * live taps get im2col rows and GEMM columns (K = C/G * nt); the weight is
 * gathered into that layout (W_live) once per call, and the weight gradient
 * of a dead tap is exactly 0.
 *
 * Depthwise convs (groups == in_channels) go to cpu_conv_depthwise.c.
 *
 * BLAS is never called inside an OpenMP region (ARCHITECTURE.md): the
 * im2col, col2im and epilogue loops are parallel, the GEMMs thread
 * themselves. The op layer (op_conv.c, op_fused.c) calls these with
 * contiguous tensors of one float dtype, N, C, O and L all > 0. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_conv_plan.h"
#include "cpu_kernels.h"
#include "cpu_gemm.h"

static bool plan_all_live(const nd_conv_plan *p) { return p->nt == p->kk; }

/* A 1x1 conv, stride 1, no padding, one image per chunk: cols is x itself. */
static bool plan_pointwise(const nd_conv_plan *p) {
    const nd_conv_geom *g = p->g;
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
           g->lh == p->H && g->lw == p->W && p->nb == 1;
}

/* The ow range [lo, hi) whose column x = ow * sw + x0 lies inside 0..W-1:
 * the row copy needs no test. */
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

/* ------------------------------------------------------------------ BLAS */

/* half: the product may take bfloat16 (precision "medium"; nd_conv_bf16_pays) */
static inline void gemm_f32(bool ta, bool tb, int M, int N, int K, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc, bool half) {
    /* needle's own kernel where the CPU has one (cpu_gemm.c): beta is 0 or 1 here */
    if (K > 0 && (beta == 0.0f || beta == 1.0f) &&
        nd_cpu_sgemm_bf16_from(half ? 0 : INT64_MAX, M, N, K, A, ta ? 1 : lda, ta ? lda : 1, B, tb ? 1 : ldb,
                               tb ? ldb : 1, C, ldc, beta == 1.0f))
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
static inline void gemm_f64(bool ta, bool tb, int M, int N, int K, const double *A, int lda,
                            const double *B, int ldb, double beta, double *C, int ldc, bool half) {
    (void)half;
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

/* --------------------------------------------------- per-type functions */

/* a parallel loop when work_ (declared just before) is worth the threads */
#define PAR_IF(work) const int64_t work_ = (work);                                    \
    _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (work_ >= ND_PARALLEL_THRESHOLD) schedule(static)")

#define DEFINE_CONV_KERNELS(T, SUF)                                                              \
    /* cols (C*nt, nc*L) of images n0 .. n0+nc-1 */                                             \
    static void im2col_chunk_##SUF(const nd_conv_plan *p, const T *X, int64_t n0, int64_t nc,      \
                                   T *COLS) {                                                   \
        const nd_conv_geom *g = p->g;                                                           \
        const int64_t rows = p->C * p->nt, NL = nc * p->L, H = p->H, Wd = p->W;                 \
        PAR_IF(rows * NL)                                                                       \
        for (int64_t r = 0; r < rows; r++) {                                                    \
            const int64_t c = r / p->nt, tp = p->tap[r % p->nt];                                \
            const int64_t i = tp / g->kw, j = tp % g->kw, x0 = j * g->dw - g->pw;               \
            if (p->off) {                                                                       \
                const int32_t *off = p->off + (r % p->nt) * p->L;                               \
                for (int64_t n = 0; n < nc; n++) {                                              \
                    const T *xp = X + ((n0 + n) * p->C + c) * H * Wd;                           \
                    T *row = COLS + r * NL + n * p->L;                                          \
                    for (int64_t l = 0; l < p->L; l++) row[l] = off[l] >= 0 ? xp[off[l]] : (T)0; \
                }                                                                               \
                continue;                                                                       \
            }                                                                                   \
            int64_t lo, hi;                                                                     \
            col_range(x0, g->sw, Wd, g->lw, &lo, &hi);                                          \
            for (int64_t n = 0; n < nc; n++) {                                                  \
                const T *xp = X + ((n0 + n) * p->C + c) * H * Wd;                               \
                T *row = COLS + r * NL + n * p->L;                                              \
                for (int64_t oh = 0; oh < g->lh; oh++) {                                        \
                    const int64_t y = oh * g->sh - g->ph + i * g->dh;                           \
                    T *dst = row + oh * g->lw;                                                  \
                    if (y < 0 || y >= H) {                                                      \
                        for (int64_t ow = 0; ow < g->lw; ow++) dst[ow] = 0;                     \
                        continue;                                                               \
                    }                                                                           \
                    const T *src = xp + y * Wd + x0;                                            \
                    for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;                            \
                    if (g->sw == 1)                                                             \
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow];                 \
                    else                                                                        \
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * g->sw];         \
                    for (int64_t ow = hi; ow < g->lw; ow++) dst[ow] = 0;                        \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
                                                                                                \
    /* GX planes of images n0 .. n0+nc-1 = the adjoint of im2col_chunk applied to DCOLS */      \
    static void col2im_chunk_##SUF(const nd_conv_plan *p, const T *DCOLS, int64_t n0, int64_t nc,  \
                                   T *GX) {                                                     \
        const nd_conv_geom *g = p->g;                                                           \
        const int64_t NL = nc * p->L, H = p->H, Wd = p->W, planes = nc * p->C;                  \
        PAR_IF(planes * p->nt * p->L)                                                           \
        for (int64_t q = 0; q < planes; q++) {                                                  \
            const int64_t n = q / p->C, c = q % p->C;                                           \
            T *xp = GX + ((n0 + n) * p->C + c) * H * Wd;                                        \
            memset(xp, 0, sizeof(T) * (size_t)(H * Wd));                                        \
            for (int64_t t = 0; t < p->nt; t++) {                                               \
                const int64_t tp = p->tap[t], i = tp / g->kw, j = tp % g->kw;                   \
                const int64_t x0 = j * g->dw - g->pw;                                           \
                const T *row = DCOLS + (c * p->nt + t) * NL + n * p->L;                         \
                if (p->off) {                                                                   \
                    const int32_t *off = p->off + t * p->L;                                     \
                    for (int64_t l = 0; l < p->L; l++)                                          \
                        if (off[l] >= 0) xp[off[l]] += row[l];                                  \
                    continue;                                                                   \
                }                                                                               \
                int64_t lo, hi;                                                                 \
                col_range(x0, g->sw, Wd, g->lw, &lo, &hi);                                      \
                for (int64_t oh = 0; oh < g->lh; oh++) {                                        \
                    const int64_t y = oh * g->sh - g->ph + i * g->dh;                           \
                    if (y < 0 || y >= H) continue;                                              \
                    const T *src = row + oh * g->lw;                                            \
                    T *dst = xp + y * Wd + x0;                                                  \
                    if (g->sw == 1) {                                                           \
                        _Pragma("omp simd")                                                     \
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] += src[ow];                \
                    } else {                                                                    \
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow * g->sw] += src[ow];        \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
                                                                                                \
    /* WL (O, K) = w's live taps; and back: GW (O, Cg*kk) from GWL, 0 at dead taps */           \
    static void gather_live_##SUF(const nd_conv_plan *p, const T *Wt, T *WL) {                     \
        PAR_IF(p->O * p->K)                                                                     \
        for (int64_t o = 0; o < p->O; o++)                                                      \
            for (int64_t c = 0; c < p->Cg; c++)                                                 \
                for (int64_t t = 0; t < p->nt; t++)                                             \
                    WL[o * p->K + c * p->nt + t] = Wt[(o * p->Cg + c) * p->kk + p->tap[t]];     \
    }                                                                                           \
    static void scatter_live_##SUF(const nd_conv_plan *p, const T *GWL, T *GW) {                   \
        PAR_IF(p->O * p->Cg * p->kk)                                                            \
        for (int64_t o = 0; o < p->O; o++)                                                      \
            for (int64_t c = 0; c < p->Cg; c++) {                                               \
                T *dst = GW + (o * p->Cg + c) * p->kk;                                          \
                for (int64_t k = 0; k < p->kk; k++) dst[k] = 0;                                 \
                for (int64_t t = 0; t < p->nt; t++)                                             \
                    dst[p->tap[t]] = GWL[o * p->K + c * p->nt + t];                             \
            }                                                                                   \
    }                                                                                           \
                                                                                                \
    static void forward_##SUF(const nd_conv_plan *p, const T *X, const T *WL, const T *B,          \
                              bool relu, T *OUT, T *COLS, T *R) {                               \
        const int64_t O = p->O, Og = p->Og, L = p->L, K = p->K;                                 \
        for (int64_t n0 = 0; n0 < p->N; n0 += p->nb) {                                          \
            const int64_t nc = p->N - n0 < p->nb ? p->N - n0 : p->nb, NL = nc * L;              \
            const T *cols = COLS;                                                               \
            if (plan_pointwise(p)) cols = X + n0 * p->C * p->H * p->W;                          \
            else if (K > 0) im2col_chunk_##SUF(p, X, n0, nc, COLS);                             \
            T *dst = nc == 1 ? OUT + n0 * O * L : R; /* (O, nc*L) */                            \
            if (K == 0) memset(dst, 0, sizeof(T) * (size_t)(O * NL));                           \
            else                                                                                \
                for (int64_t gi = 0; gi < p->G; gi++)                                           \
                    gemm_##SUF(false, false, (int)Og, (int)NL, (int)K, WL + gi * Og * K,        \
                               (int)K, cols + gi * K * NL, (int)NL, 0, dst + gi * Og * NL,      \
                               (int)NL, nd_conv_bf16_pays(p, ND_CONV_FORWARD));                 \
            /* epilogue: (O, nc, L) -> (nc, O, L) with bias and activation */                   \
            T *obase = OUT + n0 * O * L;                                                        \
            if (nc == 1 && !B && !relu) continue;                                               \
            PAR_IF(O * NL)                                                                      \
            for (int64_t o = 0; o < O; o++) {                                                   \
                const T bo = B ? B[o] : (T)0;                                                   \
                for (int64_t n = 0; n < nc; n++) {                                              \
                    T *d = obase + (n * O + o) * L;                                             \
                    const T *s = dst + o * NL + n * L;                                          \
                    if (relu) {                                                                 \
                        _Pragma("omp simd")                                                     \
                        for (int64_t l = 0; l < L; l++) {                                       \
                            T v = s[l] + bo;                                                    \
                            d[l] = !(v <= (T)0) ? v : (T)0;                                     \
                        }                                                                       \
                    } else {                                                                    \
                        _Pragma("omp simd")                                                     \
                        for (int64_t l = 0; l < L; l++) d[l] = s[l] + bo;                       \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
                                                                                                \
    /* D (O, nc*L) = dy of images n0 .. n0+nc-1, (nc, O, L) -> (O, nc, L) */                    \
    static void gather_dy_##SUF(const nd_conv_plan *p, const T *DY, int64_t n0, int64_t nc, T *D) { \
        const int64_t O = p->O, L = p->L, NL = nc * L;                                          \
        PAR_IF(O * NL)                                                                          \
        for (int64_t o = 0; o < O; o++)                                                         \
            for (int64_t n = 0; n < nc; n++)                                                    \
                memcpy(D + o * NL + n * L, DY + ((n0 + n) * O + o) * L, sizeof(T) * (size_t)L); \
    }                                                                                           \
                                                                                                \
    static void bias_grad_##SUF(const nd_conv_plan *p, const T *DY, T *GB) {                       \
        PAR_IF(p->N * p->O * p->L)                                                              \
        for (int64_t o = 0; o < p->O; o++) {                                                    \
            double s = 0;                                                                       \
            for (int64_t n = 0; n < p->N; n++) {                                                \
                const T *row = DY + (n * p->O + o) * p->L;                                      \
                T part = 0;                                                                     \
                _Pragma("omp simd reduction(+ : part)")                                         \
                for (int64_t l = 0; l < p->L; l++) part += row[l];                              \
                s += part;                                                                      \
            }                                                                                   \
            GB[o] = (T)s;                                                                       \
        }                                                                                       \
    }                                                                                           \
                                                                                                \
    static void backward_##SUF(const nd_conv_plan *p, const T *DY, const T *X, const T *WL,        \
                               T *GX, T *GWL, T *COLS, T *DCOLS, T *D) {                        \
        const int64_t Og = p->Og, L = p->L, K = p->K;                                           \
        for (int64_t n0 = 0; n0 < p->N; n0 += p->nb) {                                          \
            const int64_t nc = p->N - n0 < p->nb ? p->N - n0 : p->nb, NL = nc * L;              \
            const T *dy = D;                                                                    \
            if (nc == 1) dy = DY + n0 * p->O * L;                                               \
            else gather_dy_##SUF(p, DY, n0, nc, D);                                             \
            if (GWL && K > 0) {                                                                 \
                const T *cols = COLS;                                                           \
                if (plan_pointwise(p)) cols = X + n0 * p->C * p->H * p->W;                      \
                else im2col_chunk_##SUF(p, X, n0, nc, COLS);                                    \
                for (int64_t gi = 0; gi < p->G; gi++)                                           \
                    gemm_##SUF(false, true, (int)Og, (int)K, (int)NL, dy + gi * Og * NL,        \
                               (int)NL, cols + gi * K * NL, (int)NL, n0 == 0 ? 0 : 1,           \
                               GWL + gi * Og * K, (int)K, nd_conv_bf16_pays(p, ND_CONV_GRAD_W)); \
            }                                                                                   \
            if (GX) {                                                                           \
                if (K > 0)                                                                      \
                    for (int64_t gi = 0; gi < p->G; gi++)                                       \
                        gemm_##SUF(true, false, (int)K, (int)NL, (int)Og, WL + gi * Og * K,     \
                                   (int)K, dy + gi * Og * NL, (int)NL, 0,                       \
                                   DCOLS + gi * K * NL, (int)NL,                                \
                                   nd_conv_bf16_pays(p, ND_CONV_GRAD_X));                       \
                col2im_chunk_##SUF(p, DCOLS, n0, nc, GX);                                       \
            }                                                                                   \
        }                                                                                       \
    }

DEFINE_CONV_KERNELS(float, f32)
DEFINE_CONV_KERNELS(double, f64)

/* ------------------------------------------------------------ scratch */

/* the data pointer as void *, which converts to the kernels' T * */
static inline void *vptr(const nd_tensor *t) { return nd_ptr(t); }


typedef struct {
    nd_tensor *t[5];
    int n;
    nd_status st;
} scratch;

/* a fresh (rows, cols) buffer of x's dtype, or NULL when not needed */
static void *scratch_get(scratch *s, const nd_tensor *like, int64_t rows, int64_t cols) {
    if (s->st != ND_OK || rows * cols == 0) return NULL;
    int64_t shape[2] = {rows, cols};
    nd_tensor *t = NULL;
    s->st = nd_empty(shape, 2, like->dtype, &t);
    if (s->st != ND_OK) return NULL;
    s->t[s->n++] = t;
    return vptr(t);
}

static void scratch_free(scratch *s) {
    for (int i = 0; i < s->n; i++) nd_release(s->t[i]);
}

/* w itself when every tap is live, else its live taps gathered */
static const void *live_weight(scratch *s, const nd_conv_plan *p, const nd_tensor *w) {
    if (plan_all_live(p)) return vptr(w);
    void *wl = scratch_get(s, w, p->O, p->K);
    if (wl && w->dtype == ND_FLOAT32) gather_live_f32(p, vptr(w), wl);
    else if (wl) gather_live_f64(p, vptr(w), wl);
    return wl;
}

/* gx and gw by chunked im2col + BLAS */
static void backward_blas(const nd_conv_plan *p, scratch *s, nd_tensor *gx, nd_tensor *gw,
                          const nd_tensor *dy, const nd_tensor *x, const nd_tensor *w) {
    const int64_t NL = p->nb * p->L;
    const void *wl = gx ? live_weight(s, p, w) : NULL;
    void *gwl = !gw ? NULL : plan_all_live(p) ? vptr(gw) : scratch_get(s, dy, p->O, p->K);
    void *cols = gw && !plan_pointwise(p) ? scratch_get(s, dy, p->C * p->nt, NL) : NULL;
    void *dcols = gx ? scratch_get(s, dy, p->C * p->nt, NL) : NULL;
    void *d = p->nb > 1 ? scratch_get(s, dy, p->O, NL) : NULL;
    if (s->st != ND_OK) return;
    const void *xp = gw ? vptr(x) : NULL;
    void *gxp = gx ? vptr(gx) : NULL;
    if (dy->dtype == ND_FLOAT32) backward_f32(p, vptr(dy), xp, wl, gxp, gwl, cols, dcols, d);
    else backward_f64(p, vptr(dy), xp, wl, gxp, gwl, cols, dcols, d);
    if (!gw) return;
    if (p->K == 0) memset(vptr(gw), 0, nd_dtype_size(gw->dtype) * (size_t)(p->O * p->Cg * p->kk));
    else if (!plan_all_live(p) && dy->dtype == ND_FLOAT32) scatter_live_f32(p, gwl, vptr(gw));
    else if (!plan_all_live(p)) scatter_live_f64(p, gwl, vptr(gw));
}

/* ------------------------------------------------------------- entries */

nd_status nd_cpu_conv2d_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                              nd_activation act, const nd_tensor *res) {
    const bool relu = act == ND_ACT_RELU; /* (gelu: after the product, nd_cpu_finish_layer) */
    if (nd_cpu_conv_is_depthwise(x->shape, w->shape, groups)) { /* cpu_conv_depthwise.c */
        ND_TRY(nd_cpu_conv2d_depthwise(out, x, w, b, g, relu));
        return nd_cpu_finish_layer(out, act, res);
    }
    nd_conv_plan p;
    ND_TRY(nd_conv_plan_make(&p, "fused_conv2d", x, w->shape[0], g, groups));
    bool done;
    nd_status st = nd_cpu_conv2d_packed(&p, out, x, w, NULL, b, act, res, &done);
    if (st == ND_OK && !done) st = nd_conv_plan_table(&p, "fused_conv2d");
    if (st != ND_OK || done) {
        nd_conv_plan_free(&p);
        return st;
    }
    scratch s = {.st = ND_OK};
    const void *wl = live_weight(&s, &p, w);
    void *cols = plan_pointwise(&p) ? NULL : scratch_get(&s, x, p.C * p.nt, p.nb * p.L);
    void *r = p.nb > 1 ? scratch_get(&s, x, p.O, p.nb * p.L) : NULL;
    if (s.st == ND_OK) {
        if (x->dtype == ND_FLOAT32)
            forward_f32(&p, vptr(x), wl, b ? vptr(b) : NULL, relu, vptr(out), cols, r);
        else
            forward_f64(&p, vptr(x), wl, b ? vptr(b) : NULL, relu, vptr(out), cols, r);
    }
    scratch_free(&s);
    nd_conv_plan_free(&p);
    return s.st == ND_OK ? nd_cpu_finish_layer(out, act, res) : s.st;
}

nd_status nd_cpu_conv2d_backward(nd_tensor *gx, nd_tensor *gw, nd_tensor *gb, const nd_tensor *dy,
                                 const nd_tensor *x, const nd_tensor *w, const nd_conv_geom *g,
                                 int64_t groups) {
    if (!gx && !gw) { /* the bias gradient needs no plan */
        if (!gb) return ND_OK;
        nd_conv_plan p = {.N = dy->shape[0], .O = dy->shape[1], .L = dy->shape[2] * dy->shape[3]};
        if (dy->dtype == ND_FLOAT32) bias_grad_f32(&p, vptr(dy), vptr(gb));
        else if (dy->dtype == ND_FLOAT64) bias_grad_f64(&p, vptr(dy), vptr(gb));
        else return nd_fail(ND_ERR_DTYPE, "conv2d_backward: no cpu kernel for %s",
                            nd_dtype_name(dy->dtype));
        return ND_OK;
    }
    const int64_t *xs = (gw ? x : gx)->shape, *wsh = (gx ? w : gw)->shape;
    if (nd_cpu_conv_is_depthwise(xs, wsh, groups)) { /* cpu_conv_depthwise.c */
        ND_TRY(nd_cpu_conv2d_depthwise_backward(gx, gw, dy, x, w, g));
        if (gb) {
            nd_conv_plan p = {.N = dy->shape[0], .O = dy->shape[1], .L = dy->shape[2] * dy->shape[3]};
            if (dy->dtype == ND_FLOAT32) bias_grad_f32(&p, vptr(dy), vptr(gb));
            else bias_grad_f64(&p, vptr(dy), vptr(gb));
        }
        return ND_OK;
    }
    nd_conv_plan p;
    ND_TRY(nd_conv_plan_make(&p, "conv2d_backward", gw ? x : gx, dy->shape[1], g, groups));
    scratch s = {.st = ND_OK};
    /* each product on the path that runs it faster (nd_cpu_conv_packed_runs) */
    const bool px = gx && nd_cpu_conv_packed_runs(&p, dy->dtype, ND_CONV_GRAD_X);
    const bool pw = gw && nd_cpu_conv_packed_runs(&p, dy->dtype, ND_CONV_GRAD_W);
    bool done = false;
    if (px || pw) s.st = nd_cpu_conv2d_packed_backward(&p, px ? gx : NULL, pw ? gw : NULL,
                                                       dy, x, w, &done);
    nd_tensor *bx = done && px ? NULL : gx, *bw = done && pw ? NULL : gw; /* left to BLAS */
    if (s.st == ND_OK && (bx || bw)) s.st = nd_conv_plan_table(&p, "conv2d_backward");
    if (s.st == ND_OK && (bx || bw)) backward_blas(&p, &s, bx, bw, dy, x, w);
    if (s.st == ND_OK && gb) {
        if (dy->dtype == ND_FLOAT32) bias_grad_f32(&p, vptr(dy), vptr(gb));
        else bias_grad_f64(&p, vptr(dy), vptr(gb));
    }
    scratch_free(&s);
    nd_conv_plan_free(&p);
    return s.st;
}
