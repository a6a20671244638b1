/* cpu_conv_depthwise.c - depthwise conv2d (groups == in_channels, weight
 * (C*M, 1, kh, kw), channel multiplier M >= 1) forward and both gradients,
 * float32 and float64, any kernel size, stride, padding and dilation.
 *
 * Why not im2col + GEMM (cpu_conv_gemm.c): a depthwise group is a GEMM of
 * M rows by kh*kw deep - MobileNetV2's 3x3 layers are 1 x 9 products, one
 * per channel, where BLAS spends its time in call overhead and the im2col
 * copy (9x the input) is most of the traffic. Here each (image, channel)
 * plane is computed directly, the input read kh*kw times from L1.
 *
 * The phase layout. Each thread copies the plane it works on into a
 * zero-padded buffer, its columns split by phase of the W stride:
 *
 *   buf[q][r][k] = xpad[r][k*sw + q]     (q < sw; xpad: x padded by ph, pw)
 *
 * so that tap (i, j) at output (oh, ow) reads xpad[oh*sh + i*dh][ow*sw + j*dw]
 * = buf[q][oh*sh + i*dh][ow + (j*dw)/sw], q = (j*dw) % sw: for every stride
 * and dilation, a tap is a contiguous run along an output row, with no
 * bounds tests. Then
 *
 *   forward  out row = b + sum over taps of w_t * (tap's run)     (AVX2 tiles)
 *   grad x   the adjoint: gbuf (same layout, zeroed) += w_t * dy row for
 *            each tap, then gx = gbuf's interior, un-phased
 *   grad w   gw_t = sum over images and rows of dot(tap's run, dy row)
 *
 * Threads (OpenMP) take (image, channel) planes for the forward and grad x
 * (each plane's M output channels in one task, so the buffer is built once)
 * and channels for grad w (summing over the batch inside, so no two threads
 * write one weight). Sums run in a different order from the GEMM path's, so
 * results agree with it to rounding, not bit for bit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_avx2.h"
#include "cpu_kernels.h"
#include "cpu_scratch.h"

typedef struct {
    int64_t N, C, M, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t Hp, Wq, nt; /* buffer rows, row length per phase, taps (kh*kw) */
} dw_geom;

static dw_geom dw_geom_of(const int64_t *xshape, int64_t O, const nd_conv_geom *g) {
    dw_geom d = {.N = xshape[0], .C = xshape[1], .H = xshape[2], .W = xshape[3], .OH = g->lh,
                 .OW = g->lw, .kh = g->kh, .kw = g->kw, .sh = g->sh, .sw = g->sw, .ph = g->ph,
                 .pw = g->pw, .dh = g->dh, .dw = g->dw};
    d.M = O / d.C;
    d.Hp = d.H + 2 * d.ph;
    d.Wq = d.OW + ((d.kw - 1) * d.dw) / d.sw;
    d.nt = d.kh * d.kw;
    return d;
}

/* offset of tap t's run for output row 0 in the buffer */
static int64_t tap_off(const dw_geom *d, int64_t t) {
    const int64_t i = t / d->kw, j = t % d->kw, jd = j * d->dw;
    return ((jd % d->sw) * d->Hp + i * d->dh) * d->Wq + jd / d->sw;
}

/* the k range [lo, hi) of phase q whose column k*sw + q - pw lies in 0..W-1 */
static void phase_range(const dw_geom *d, int64_t q, int64_t *lo, int64_t *hi) {
    int64_t a = d->pw - q <= 0 ? 0 : (d->pw - q + d->sw - 1) / d->sw;
    int64_t b = d->W + d->pw - q <= 0 ? 0 : (d->W + d->pw - q + d->sw - 1) / d->sw;
    if (b > d->Wq) b = d->Wq;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* Every thread of a task region allocates its scratch first; when one
 * fails, none enters the work-shared loop (all must reach it, or none). */
#define DW_FAILED(oom) do { _Pragma("omp atomic write") *(oom) = true; } while (0)
static inline bool dw_all_ok(bool *oom) {
    bool bad;
    _Pragma("omp barrier")
    _Pragma("omp atomic read") bad = *oom;
    return !bad;
}
#define DW_ALL_OK(oom) dw_all_ok(oom)

/* elements past a buffer's end that a partial block of the forward reads */
#define DW_SLACK 16
#define DW_ROW_TMP(d) (2 * (d)->Wq) /* to_phases' row copy (stride 2) */
#define DW_VB(T) (64 / (int)sizeof(T)) /* the forward's block of columns */

/* The wide layout (stride 1 along H): output pixel (oh, ow) at oh*Wq + ow,
 * the buffer's row length, so that a tap is one run over the whole plane
 * rather than OH runs of OW (a 7x7 map: one run of 63 instead of 7 of 7,
 * each with a vector tail); the columns past OW are computed and dropped
 * (forward) or zero in dy (gradients). Their reads reach up to Wq past a
 * phase's last row, into the next phase or the buffer's zeroed slack, and
 * multiply by 0: only a non-finite x or w there would show (as NaN). The
 * forward takes it for maps narrower than this; wider rows have few tails. */
#define DW_WIDE_MAX_OW 64
static bool dw_wide(const dw_geom *d) { return d->sh == 1 && d->OW < DW_WIDE_MAX_OW; }
/* The gradients' wide runs: the plane rounded up to 8 elements (no scalar
 * tails), dy widened with zeros up to there; the buffers' slack (Wq +
 * DW_SLACK past the end) covers the 7 extra. */
static int64_t dw_fw(const dw_geom *d) { return (d->OH * d->Wq + 7) / 8 * 8; }
/* dyw of dw_fw(d) elements, the part past the plane zeroed once */
static void *dw_dyw_alloc(const dw_geom *d, size_t elt) {
    char *p = nd_cpu_scratch_alloc(elt * (size_t)dw_fw(d));
    if (p) memset(p + elt * (size_t)(d->OH * d->Wq), 0, elt * (size_t)(dw_fw(d) - d->OH * d->Wq));
    return p;
}

#define DW_TASK_PAR(work)                                                                   \
    const int64_t work_ = (work);                                                           \
    _Pragma("omp parallel num_threads(nd_cpu_threads()) if (work_ >= ND_PARALLEL_THRESHOLD)")

/* DEFINE_DW(T, SUF, ATTR): the kernels for element type T, compiled with
 * function attributes ATTR (target("avx2,fma") for the run-time chosen
 * copies, nothing for the portable ones). The loops are written for the
 * vectorizer (unit strides, no tests inside). */
/* Copies and zero fills inside the kernels: loops, not libc calls, which
 * cost more than the work on 7x7 maps (perf: memmove and memset 32% of a
 * 7x7x960 training step); "omp simd" keeps GCC from turning them back
 * into calls. */
#define DW_COPY(dst, src, n)                                                                \
    do {                                                                                    \
        const int64_t n_ = (n);                                                             \
        _Pragma("omp simd") for (int64_t z_ = 0; z_ < n_; z_++) (dst)[z_] = (src)[z_];      \
    } while (0)
#define DW_ZERO(dst, n)                                                                     \
    do {                                                                                    \
        const int64_t n_ = (n);                                                             \
        _Pragma("omp simd") for (int64_t z_ = 0; z_ < n_; z_++) (dst)[z_] = 0;              \
    } while (0)

#define DEFINE_DW(T, SUF, ATTR)                                                               \
    /* buf (sw, Hp, Wq) = plane xp, padded and split by phase; stride 2 goes                  \
     * through a padded copy of each row (tmp, DW_ROW_TMP(d) elements), split                 \
     * by a loop the vectorizer turns into shuffles */                                        \
    ATTR static void to_phases_##SUF(const dw_geom *d, const T *xp, T *buf, T *tmp) {         \
        if (d->sw == 2) {                                                                     \
            const int64_t rw = 2 * d->Wq, hi = d->W + d->pw < rw ? d->W + d->pw : rw;         \
            const int64_t lo = d->pw < rw ? d->pw : rw;                                       \
            for (int64_t r = 0; r < d->Hp; r++) {                                             \
                T *d0 = buf + r * d->Wq, *d1 = buf + (d->Hp + r) * d->Wq;                     \
                const int64_t y = r - d->ph;                                                  \
                if (y < 0 || y >= d->H) {                                                     \
                    DW_ZERO(d0, d->Wq);                                 \
                    DW_ZERO(d1, d->Wq);                                 \
                    continue;                                                                 \
                }                                                                             \
                for (int64_t k = 0; k < lo; k++) tmp[k] = 0;                                  \
                if (hi > lo) DW_COPY(tmp + lo, xp + y * d->W, (hi - lo));  \
                for (int64_t k = hi > lo ? hi : lo; k < rw; k++) tmp[k] = 0;                  \
                for (int64_t k = 0; k < d->Wq; k++) {                                         \
                    d0[k] = tmp[2 * k];                                                       \
                    d1[k] = tmp[2 * k + 1];                                                   \
                }                                                                             \
            }                                                                                 \
            return;                                                                           \
        }                                                                                     \
        for (int64_t q = 0; q < d->sw; q++) {                                                 \
            int64_t lo, hi;                                                                   \
            phase_range(d, q, &lo, &hi);                                                      \
            const int64_t x0 = q - d->pw;                                                     \
            for (int64_t r = 0; r < d->Hp; r++) {                                             \
                T *dst = buf + (q * d->Hp + r) * d->Wq;                                       \
                const int64_t y = r - d->ph;                                                  \
                if (y < 0 || y >= d->H) {                                                     \
                    DW_ZERO(dst, d->Wq);                                \
                    continue;                                                                 \
                }                                                                             \
                const T *src = xp + y * d->W + x0;                                            \
                for (int64_t k = 0; k < lo; k++) dst[k] = 0;                                  \
                if (d->sw == 1) DW_COPY(dst + lo, src + lo, (hi - lo));    \
                else                                                                          \
                    for (int64_t k = lo; k < hi; k++) dst[k] = src[k * d->sw];                \
                for (int64_t k = hi; k < d->Wq; k++) dst[k] = 0;                              \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* gxp = the plane's part of gbuf (the adjoint of to_phases) */                           \
    ATTR static void from_phases_##SUF(const dw_geom *d, const T *buf, T *gxp) {              \
        for (int64_t q = 0; q < d->sw; q++) {                                                 \
            int64_t lo, hi;                                                                   \
            phase_range(d, q, &lo, &hi);                                                      \
            const int64_t x0 = q - d->pw;                                                     \
            for (int64_t y = 0; y < d->H; y++) {                                              \
                const T *src = buf + (q * d->Hp + y + d->ph) * d->Wq;                         \
                T *dst = gxp + y * d->W + x0;                                                 \
                if (d->sw == 1) DW_COPY(dst + lo, src + lo, (hi - lo));    \
                else                                                                          \
                    for (int64_t k = lo; k < hi; k++) dst[k * d->sw] = src[k];                \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* one output row: out[ow] = bias + sum_t w[t] * src[off[t] + ow], in blocks \
     * of VB columns held in registers across the taps; the last block may be  \
     * partial (it reads up to VB - 1 columns past the row: the buffer has that \
     * much slack, DW_SLACK; the extra sums are not stored) */                  \
    ATTR static inline void block_##SUF(int64_t nt, const T *src, const int64_t *off,         \
                                        const T *w, T bias, bool relu, T *out, int64_t nout) { \
        enum { VB = 64 / (int)sizeof(T) }; /* 2 vectors of 256 bits */                        \
        /* GCC's vector types: 2 ymm accumulators under target("avx2,fma") (plain      \
         * arrays were scalarised), SSE pairs in the portable copies */               \
        typedef T vec __attribute__((vector_size(32), aligned(sizeof(T))));                   \
        vec a0, a1;                                                                           \
        for (int v = 0; v < VB / 2; v++) a0[v] = a1[v] = bias;                                \
        for (int64_t t = 0; t < nt; t++) {                                                    \
            const T wt = w[t], *s = src + off[t];                                             \
            a0 += wt * *(const vec *)s;                                                       \
            a1 += wt * *(const vec *)(s + VB / 2);                                            \
        }                                                                                     \
        if (!relu && nout == VB) { /* (unaligned vector stores: the typedef's alignment) */   \
            *(vec *)out = a0;                                                                 \
            *(vec *)(out + VB / 2) = a1;                                                      \
            return;                                                                           \
        }                                                                                     \
        T acc[VB];                                                                            \
        *(vec *)acc = a0;                                                                     \
        *(vec *)(acc + VB / 2) = a1;                                                          \
        /* relu as the GEMM path's: NaN stays NaN */                                          \
        for (int64_t v = 0; v < nout; v++) out[v] = relu && acc[v] <= 0 ? 0 : acc[v];        \
    }                                                                                         \
    ATTR static void row_##SUF(const dw_geom *d, const T *src, const int64_t *off,            \
                               const T *w, T bias, bool relu, T *out) {                       \
        enum { VB = 64 / (int)sizeof(T) };                                                    \
        for (int64_t ow = 0; ow < d->OW; ow += VB)                                            \
            block_##SUF(d->nt, src + ow, off, w, bias, relu, out + ow,                        \
                        d->OW - ow < VB ? d->OW - ow : VB);                                   \
    }                                                                                         \
    ATTR static void forward_##SUF(const dw_geom *d, const void *Xv, const void *Wv,          \
                                   const void *Bv, bool relu, void *OUTv, bool *oom) {        \
        const T *X = Xv, *Wt = Wv, *B = Bv;                                                   \
        T *OUT = OUTv;                                                                        \
        const int64_t planes = d->N * d->C, bufn = d->sw * d->Hp * d->Wq, slack = d->Wq + DW_SLACK;\
        const int64_t FW = d->OH * d->Wq; /* a wide plane's elements */                       \
        const bool wide = dw_wide(d);                                                         \
        DW_TASK_PAR(planes * d->M * d->OH * d->OW * d->nt) {                                  \
            T *buf = nd_cpu_scratch_alloc(sizeof(T) * (size_t)(bufn + slack + DW_ROW_TMP(d))); \
            T *wout = wide ? nd_cpu_scratch_alloc(sizeof(T) * (size_t)(FW + DW_SLACK)) : NULL;\
            int64_t *offs = nd_cpu_scratch_alloc(sizeof(int64_t) * (size_t)d->nt);            \
            if (!buf || !offs || (wide && !wout)) DW_FAILED(oom);                             \
            if (DW_ALL_OK(oom)) {                                                             \
                DW_ZERO(buf + bufn, slack);                             \
                for (int64_t t = 0; t < d->nt; t++) offs[t] = tap_off(d, t);                  \
                _Pragma("omp for schedule(static)")                                           \
                for (int64_t p = 0; p < planes; p++) {                                        \
                    const int64_t n = p / d->C, c = p % d->C;                                 \
                    to_phases_##SUF(d, X + p * d->H * d->W, buf, buf + bufn + slack);                             \
                    for (int64_t m = 0; m < d->M; m++) {                                      \
                        const int64_t o = c * d->M + m;                                       \
                        T *op = OUT + (n * d->C * d->M + o) * d->OH * d->OW;                  \
                        const T bo = B ? B[o] : (T)0, *wo = Wt + o * d->nt;                   \
                        if (wide) {                                                           \
                            for (int64_t f = 0; f < FW; f += DW_VB(T))                        \
                                block_##SUF(d->nt, buf + f, offs, wo, bo, relu, wout + f,     \
                                            FW - f < DW_VB(T) ? FW - f : DW_VB(T));           \
                            for (int64_t oh = 0; oh < d->OH; oh++)                            \
                                DW_COPY(op + oh * d->OW, wout + oh * d->Wq, d->OW);\
                        } else {                                                              \
                            for (int64_t oh = 0; oh < d->OH; oh++)                            \
                                row_##SUF(d, buf + oh * d->sh * d->Wq, offs, wo, bo, relu,    \
                                          op + oh * d->OW);                                   \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            nd_cpu_scratch_free(buf);                                                         \
            nd_cpu_scratch_free(wout);                                                        \
            nd_cpu_scratch_free(offs);                                                        \
        }                                                                                     \
    }                                                                                         \
    /* dyw (OH, Wq) = the dy plane dyp (OH, OW) widened with zero columns */                  \
    ATTR static void widen_##SUF(const dw_geom *d, const T *dyp, T *dyw) {                    \
        for (int64_t oh = 0; oh < d->OH; oh++) {                                              \
            DW_COPY(dyw + oh * d->Wq, dyp + oh * d->OW, d->OW);            \
            for (int64_t k = d->OW; k < d->Wq; k++) dyw[oh * d->Wq + k] = 0;                  \
        }                                                                                     \
    }                                                                                         \
    /* gx: per plane, gbuf += w_t * dy row for each tap, then un-phase */                     \
    ATTR static void grad_x_##SUF(const dw_geom *d, const void *DYv, const void *Wv,          \
                                  void *GXv, bool *oom) {                                     \
        const T *DY = DYv, *Wt = Wv;                                                          \
        T *GX = GXv;                                                                          \
        const int64_t planes = d->N * d->C, bufn = d->sw * d->Hp * d->Wq, FW = dw_fw(d);       \
        const bool wide = d->sh == 1;                                                         \
        DW_TASK_PAR(planes * d->M * d->OH * d->OW * d->nt) {                                  \
            T *buf = nd_cpu_scratch_alloc(sizeof(T) * (size_t)(bufn + d->Wq + DW_SLACK));     \
            T *dyw = wide ? dw_dyw_alloc(d, sizeof(T)) : NULL;                                \
            if (!buf || (wide && !dyw)) DW_FAILED(oom);                                       \
            if (DW_ALL_OK(oom)) {                                                             \
                _Pragma("omp for schedule(static)")                                           \
                for (int64_t p = 0; p < planes; p++) {                                        \
                    const int64_t n = p / d->C, c = p % d->C;                                 \
                    DW_ZERO(buf, bufn);                                 \
                    for (int64_t m = 0; m < d->M; m++) {                                      \
                        const int64_t o = c * d->M + m;                                       \
                        const T *dyp = DY + (n * d->C * d->M + o) * d->OH * d->OW;            \
                        if (wide) widen_##SUF(d, dyp, dyw);                                   \
                        for (int64_t t = 0; t < d->nt; t++) {                                 \
                            const T wt = Wt[o * d->nt + t];                                   \
                            T *base = buf + tap_off(d, t);                                    \
                            if (wide) { /* one run over the plane: zero columns add nothing */\
                                for (int64_t f = 0; f < FW; f++) base[f] += wt * dyw[f];      \
                                continue;                                                     \
                            }                                                                 \
                            for (int64_t oh = 0; oh < d->OH; oh++) {                          \
                                T *dst = base + oh * d->sh * d->Wq;                           \
                                const T *s = dyp + oh * d->OW;                                \
                                for (int64_t ow = 0; ow < d->OW; ow++) dst[ow] += wt * s[ow]; \
                            }                                                                 \
                        }                                                                     \
                    }                                                                         \
                    T *gxp = GX + p * d->H * d->W;                                            \
                    if (d->sw > 1 || d->Wq < d->W + d->pw) /* else every column is written */ \
                        DW_ZERO(gxp, (d->H * d->W));                    \
                    from_phases_##SUF(d, buf, gxp);                                           \
                }                                                                             \
            }                                                                                 \
            nd_cpu_scratch_free(buf);                                                         \
            nd_cpu_scratch_free(dyw);                                                         \
        }                                                                                     \
    }                                                                                         \
    /* gw: per channel, the taps' dot products with dy summed over the batch */               \
    ATTR static void grad_w_##SUF(const dw_geom *d, const void *DYv, const void *Xv,          \
                                  void *GWv, bool *oom) {                                     \
        const T *DY = DYv, *X = Xv;                                                           \
        T *GW = GWv;                                                                          \
        const int64_t bufn = d->sw * d->Hp * d->Wq, slack = d->Wq + DW_SLACK, FW = dw_fw(d);    \
        const bool wide = d->sh == 1;                                                         \
        DW_TASK_PAR(d->N * d->C * d->M * d->OH * d->OW * d->nt) {                             \
            T *buf = nd_cpu_scratch_alloc(sizeof(T) * (size_t)(bufn + slack + DW_ROW_TMP(d))); \
            T *dyw = wide ? dw_dyw_alloc(d, sizeof(T)) : NULL;                                \
            double *acc = nd_cpu_scratch_alloc(sizeof(double) * (size_t)(d->M * d->nt));      \
            if (!buf || !acc || (wide && !dyw)) DW_FAILED(oom);                               \
            if (DW_ALL_OK(oom)) {                                                             \
                DW_ZERO(buf + bufn, slack);                             \
                _Pragma("omp for schedule(static)")                                           \
                for (int64_t c = 0; c < d->C; c++) {                                          \
                    for (int64_t k = 0; k < d->M * d->nt; k++) acc[k] = 0;                    \
                    for (int64_t n = 0; n < d->N; n++) {                                      \
                        to_phases_##SUF(d, X + (n * d->C + c) * d->H * d->W, buf, buf + bufn + slack);            \
                        for (int64_t m = 0; m < d->M; m++) {                                  \
                            const int64_t o = c * d->M + m;                                   \
                            const T *dyp = DY + (n * d->C * d->M + o) * d->OH * d->OW;        \
                            if (wide) widen_##SUF(d, dyp, dyw);                               \
                            for (int64_t t = 0; t < d->nt; t++) {                             \
                                const T *base = buf + tap_off(d, t);                          \
                                T s = 0; /* one image's sum, then added in double */          \
                                if (wide) {                                                   \
                                    _Pragma("omp simd reduction(+ : s)")                      \
                                    for (int64_t f = 0; f < FW; f++) s += base[f] * dyw[f];   \
                                } else {                                                      \
                                    for (int64_t oh = 0; oh < d->OH; oh++) {                  \
                                        const T *a = base + oh * d->sh * d->Wq;               \
                                        const T *b = dyp + oh * d->OW;                        \
                                        T r = 0;                                              \
                                        _Pragma("omp simd reduction(+ : r)")                  \
                                        for (int64_t ow = 0; ow < d->OW; ow++) r += a[ow] * b[ow];\
                                        s += r;                                               \
                                    }                                                         \
                                }                                                             \
                                acc[m * d->nt + t] += s;                                      \
                            }                                                                 \
                        }                                                                     \
                    }                                                                         \
                    for (int64_t k = 0; k < d->M * d->nt; k++)                                \
                        GW[c * d->M * d->nt + k] = (T)acc[k];                                 \
                }                                                                             \
            }                                                                                 \
            nd_cpu_scratch_free(buf);                                                         \
            nd_cpu_scratch_free(dyw);                                                         \
            nd_cpu_scratch_free(acc);                                                         \
        }                                                                                     \
    }

#define ND_NO_ATTR
DEFINE_DW(float, f32, ND_NO_ATTR)
DEFINE_DW(double, f64, ND_NO_ATTR)
#ifdef ND_HAVE_AVX2_KERNELS
#define ND_AVX2_ATTR __attribute__((target("avx2,fma")))
DEFINE_DW(float, f32_avx2, ND_AVX2_ATTR)
DEFINE_DW(double, f64_avx2, ND_AVX2_ATTR)
#endif

/* NEEDLE_CONV_BLAS=1 (the packed conv's switch) sends depthwise convs to
 * the GEMM path too, for comparisons; the portable copies run on CPUs
 * without AVX2. */
static bool use_avx2(void) {
    static int has = -1;
    return nd_cpu_avx2_enabled("NEEDLE_CONV_BLAS", &has);
}

bool nd_cpu_conv_is_depthwise(const int64_t *xshape, const int64_t *wshape, int64_t groups) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("NEEDLE_CONV_BLAS");
        on = !(e && *e && *e != '0');
    }
    return on && groups > 1 && groups == xshape[1] && wshape[1] == 1 && wshape[0] % groups == 0;
}

#ifdef ND_HAVE_AVX2_KERNELS
#define DW_CALL(fn, dt, ...)                                                                 \
    do {                                                                                     \
        if ((dt) == ND_FLOAT32) {                                                            \
            if (use_avx2()) fn##_f32_avx2(__VA_ARGS__);                                      \
            else fn##_f32(__VA_ARGS__);                                                      \
        } else if (use_avx2()) fn##_f64_avx2(__VA_ARGS__);                                   \
        else fn##_f64(__VA_ARGS__);                                                          \
    } while (0)
#else
#define DW_CALL(fn, dt, ...)                                                                 \
    do {                                                                                     \
        if ((dt) == ND_FLOAT32) fn##_f32(__VA_ARGS__);                                       \
        else fn##_f64(__VA_ARGS__);                                                          \
    } while (0)
#endif

static nd_status dw_dtype(const char *op, nd_dtype dt) {
    if (dt == ND_FLOAT32 || dt == ND_FLOAT64) return ND_OK;
    return nd_fail(ND_ERR_DTYPE, "%s: no cpu kernel for %s", op, nd_dtype_name(dt));
}

nd_status nd_cpu_conv2d_depthwise(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                                  const nd_tensor *b, const nd_conv_geom *g, bool relu) {
    ND_TRY(dw_dtype("conv2d", x->dtype));
    const dw_geom d = dw_geom_of(x->shape, w->shape[0], g);
    bool oom = false;
    DW_CALL(forward, x->dtype, &d, nd_ptr(x), nd_ptr(w), b ? nd_ptr(b) : NULL, relu, nd_ptr(out),
            &oom);
    return oom ? nd_fail(ND_ERR_MEMORY, "conv2d: out of memory (depthwise scratch)") : ND_OK;
}

nd_status nd_cpu_conv2d_depthwise_backward(nd_tensor *gx, nd_tensor *gw, const nd_tensor *dy,
                                           const nd_tensor *x, const nd_tensor *w,
                                           const nd_conv_geom *g) {
    ND_TRY(dw_dtype("conv2d_backward", dy->dtype));
    const int64_t *xs = gx ? gx->shape : x->shape;
    const dw_geom d = dw_geom_of(xs, dy->shape[1], g);
    bool oom = false;
    if (gx) DW_CALL(grad_x, dy->dtype, &d, nd_ptr(dy), nd_ptr(w), nd_ptr(gx), &oom);
    if (gw && !oom) DW_CALL(grad_w, dy->dtype, &d, nd_ptr(dy), nd_ptr(x), nd_ptr(gw), &oom);
    return oom ? nd_fail(ND_ERR_MEMORY, "conv2d_backward: out of memory (depthwise scratch)")
               : ND_OK;
}
