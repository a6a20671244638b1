/* cpu_conv_packed.c - float32 conv2d forward and backward (groups = 1) on
 * CPUs with AVX2 + FMA: im2col gathered straight into packed GEMM panels,
 * one 6x16 register-tile kernel for every product, and threads that each
 * run their own GEMMs on their own columns.
 *
 * Why not BLAS (cpu_conv_gemm.c: the path for float64, groups, CPUs
 * without AVX2, NEEDLE_CONV_BLAS=1, and the large products where its
 * blocking wins, packed_wins below): the convolutions of small
 * networks are thin GEMMs - 16 to 128 output channels against ~1000
 * columns - where OpenBLAS repacks the im2col matrix it was just handed,
 * zeroes C in a separate pass (beta = 0), and splits each small product
 * across threads that then wait at its barriers. perf on the ResNet9
 * training step showed the GEMM kernel itself at 21% of the CPU time, its
 * copies and beta pass at 12%, and OpenMP barrier spinning at 16%.
 *
 * Here im2col writes the panels the kernel reads, so nothing is copied
 * twice; the kernel writes or accumulates C directly; and the threads take
 * disjoint blocks of columns for the whole call (one parallel region, no
 * BLAS inside it):
 *
 *   forward  OUT (O, cols) = W (O, K) @ COLS (K, cols), K = C * live taps.
 *            A = W in 6-row panels (A[k][6]), once per call;
 *            B = im2col in 16-column panels (B[k][16]) per block of columns;
 *            each 6x16 tile gets bias + ReLU and goes to its NCHW place.
 *   grad x   DCOLS (K, cols) = W^T (K, O) @ DY (O, cols): A = W^T in 6-row
 *            panels, B = dy in 16-column panels; each tile is added into gx
 *            at the positions im2col read (col2im), straight from the tile.
 *   grad w   GW (O, K) = DY (O, cols) @ COLS^T (cols, K): A = dy in 6-row
 *            panels along the columns, B = im2col transposed into 16-row
 *            panels (B[col][16]); each thread sums into its own GW, and the
 *            partial sums are added at the end.
 *
 * Columns are output pixels across the batch: column n*L + l is pixel l of
 * image n. Panels and blocks of columns may span images; the backward
 * gives each thread whole images, so the col2im adds of two threads never
 * meet. The packers walk a panel as segments (pieces of one output row of
 * one image) and copy each tap's input row piece at once: where some live
 * tap reads padding, each thread first copies the image it works on into
 * a zero-padded buffer (and accumulates gx in one), so no copy tests
 * bounds. A table-driven gather (one test per element) had cost as much
 * as the GEMM on ResNet9's 4x4 maps.
 *
 * Sums run in a different order from BLAS's (depth blocks of 256, the
 * threads' partial weight gradients), so results agree with the BLAS path
 * to float32 rounding, not bit for bit. spec/fast_kernels_spec.lua checks
 * both paths against a direct sum and the composed autograd formulas. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "cpu_avx2.h"
#include "cpu_caches.h"
#include "cpu_conv_plan.h"
#include "cpu_kernels.h"
#include "cpu_scratch.h"

#define MR 6   /* rows of a register tile: 12 accumulators, 2 B loads, 1 broadcast */
#define NR 16  /* columns of a register tile: two 8-float vectors */
#define KC 256 /* depth per kernel call: an A panel 6 KB and a B panel 16 KB, in L1 */
/* Columns per block of the weight gradient: its im2col rows stay near
 * 256 KB (L2). */
#define BLOCK_BYTES (256 * 1024)
#define BLOCK_COLS_MAX 256

#ifdef ND_HAVE_AVX2_KERNELS

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

/* ------------------------------------------------------------ the kernel */

/* C (6, 16; row stride ldc) = (acc ? C : 0) + A (kc, 6)^T-panel @ B (kc, 16)-panel */
__attribute__((target("avx2,fma"))) static void tile_6x16(int64_t kc, const float *A,
                                                          const float *B, float *C, int64_t ldc,
                                                          bool acc) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (acc) {
        c00 = _mm256_loadu_ps(C), c01 = _mm256_loadu_ps(C + 8);
        c10 = _mm256_loadu_ps(C + ldc), c11 = _mm256_loadu_ps(C + ldc + 8);
        c20 = _mm256_loadu_ps(C + 2 * ldc), c21 = _mm256_loadu_ps(C + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(C + 3 * ldc), c31 = _mm256_loadu_ps(C + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(C + 4 * ldc), c41 = _mm256_loadu_ps(C + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(C + 5 * ldc), c51 = _mm256_loadu_ps(C + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 =
            _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8);
        __m256 a;
        a = _mm256_broadcast_ss(A + 0), c00 = _mm256_fmadd_ps(a, b0, c00),
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(A + 1), c10 = _mm256_fmadd_ps(a, b0, c10),
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(A + 2), c20 = _mm256_fmadd_ps(a, b0, c20),
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(A + 3), c30 = _mm256_fmadd_ps(a, b0, c30),
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(A + 4), c40 = _mm256_fmadd_ps(a, b0, c40),
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(A + 5), c50 = _mm256_fmadd_ps(a, b0, c50),
        c51 = _mm256_fmadd_ps(a, b1, c51);
        A += MR, B += NR;
    }
    _mm256_storeu_ps(C, c00), _mm256_storeu_ps(C + 8, c01);
    _mm256_storeu_ps(C + ldc, c10), _mm256_storeu_ps(C + ldc + 8, c11);
    _mm256_storeu_ps(C + 2 * ldc, c20), _mm256_storeu_ps(C + 2 * ldc + 8, c21);
    _mm256_storeu_ps(C + 3 * ldc, c30), _mm256_storeu_ps(C + 3 * ldc + 8, c31);
    _mm256_storeu_ps(C + 4 * ldc, c40), _mm256_storeu_ps(C + 4 * ldc + 8, c41);
    _mm256_storeu_ps(C + 5 * ldc, c50), _mm256_storeu_ps(C + 5 * ldc + 8, c51);
}

/* NP consecutive 6-row A panels (panel q at A + q * pstride) against one
 * B panel into T (6 NP, 16; row stride NR): tile_6x16 NP times over, with
 * one 16-float B vector a k feeding 6 NP accumulators (AVX-512: twice the
 * lanes of an AVX2 FMA; 4 panels keep 24 FMA chains in flight, 2 panels
 * 12, 1 panel 6). Each element is the same chain of FMAs over k as
 * tile_6x16's, so the same bits. */
#define TILE_AVX512(NAME, NP)                                                                     \
    __attribute__((target("avx512f"))) static void NAME(int64_t kc, const float *A, int64_t pstride, \
                                                        const float *B, float *C, bool acc) {     \
        __m512 c[NP * MR];                                                                        \
        _Pragma("GCC unroll 24")                                                                  \
        for (int i = 0; i < NP * MR; i++) c[i] = acc ? _mm512_loadu_ps(C + i * NR) : _mm512_setzero_ps(); \
        for (int64_t k = 0; k < kc; k++) {                                                        \
            const __m512 b = _mm512_loadu_ps(B + k * NR);                                         \
            _Pragma("GCC unroll 4")                                                               \
            for (int q = 0; q < NP; q++) {                                                        \
                const float *a = A + q * pstride + k * MR;                                        \
                _Pragma("GCC unroll 6")                                                           \
                for (int i = 0; i < MR; i++)                                                      \
                    c[q * MR + i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), b, c[q * MR + i]);      \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 24")                                                                  \
        for (int i = 0; i < NP * MR; i++) _mm512_storeu_ps(C + i * NR, c[i]);                    \
    }
TILE_AVX512(tile_24x16, 4)
TILE_AVX512(tile_12x16, 2)
TILE_AVX512(tile_6x16_avx512, 1)

/* The AVX-512 tiles where the GEMM runs AVX-512 (NEEDLE_GEMM=avx2 or
 * openblas: the AVX2 tile only, for comparisons) */
static bool tiles_avx512(void) {
    static int has = -1;
    if (has < 0) has = strncmp(nd_cpu_gemm_kernel(), "avx512", 6) == 0;
    return has == 1;
}

/* T (rows_pad, 16) = A-panels (rows_pad / 6 of them, depth d each) @ one
 * B panel (d, 16), in depth blocks of KC. */
static void panel_product(int64_t d, int64_t rows_pad, const float *A, const float *B, float *T) {
    const bool wide = tiles_avx512();
    for (int64_t k0 = 0; k0 < d; k0 += KC) {
        const int64_t kc = d - k0 < KC ? d - k0 : KC;
        const float *b = B + k0 * NR;
        int64_t r = 0;
        if (wide) {
            for (; r + 4 * MR <= rows_pad; r += 4 * MR) tile_24x16(kc, A + r * d + k0 * MR, MR * d, b, T + r * NR, k0 > 0);
            if (r + 2 * MR <= rows_pad) tile_12x16(kc, A + r * d + k0 * MR, MR * d, b, T + r * NR, k0 > 0), r += 2 * MR;
            if (r < rows_pad) tile_6x16_avx512(kc, A + r * d + k0 * MR, MR * d, b, T + r * NR, k0 > 0), r += MR;
        }
        for (; r < rows_pad; r += MR) tile_6x16(kc, A + r * d + k0 * MR, b, T + r * NR, NR, k0 > 0);
    }
    if (d == 0) memset(T, 0, sizeof(float) * (size_t)(rows_pad * NR));
}

/* ------------------------------------------------------- input planes */

/* Where each tap reads. Either x's own planes (copy false: no live tap
 * ever reads padding, and no phase split below), or per-image copies that
 * are zero-padded and, for strided convolutions with output rows at least 4
 * wide, split by stride phase: padded pixel (y, x) (x's pixel (y - ph,
 * x - pw)) goes to phase plane (y % sh, x % sw) at (y / sh, x / sw), each
 * phase plane Hq x Wq. Output pixel (oh, ow) of tap (i, j) reads padded
 * pixel (oh*sh + i*dh, ow*sw + j*dw): in phase plane ((i*dh) % sh,
 * (j*dw) % sw) at (oh + i*dh/sh, ow + j*dw/sw), so consecutive output
 * pixels of a row read consecutive floats whatever the stride (ResNet9's
 * 7x7 stem has stride 4: element-by-element copies had cost as much as
 * its GEMM). Without phases a plane is one phase (sh = sw = 1 here) read
 * with stride step. Either way output pixel (oh, ow) of tap t reads
 * channel_plane[oh*row + ow*step + tap_off[t]]. */
typedef struct {
    const nd_conv_plan *p;
    bool copy;
    int64_t sh, sw;  /* phases (1 x 1 for x's own planes) */
    int64_t Hq, Wq;  /* a phase plane */
    int64_t HWp;     /* floats per channel: sh * sw * Hq * Wq */
    int64_t row, step;
    bool reads_pad;   /* some live tap reads padding: copies start zeroed */
    int64_t *tap_off; /* nt of them */
    int64_t *row_off; /* copies: where row y of x starts in a channel (H), */
    int64_t *col_off; /* plus where its pixels x = ph, ph + sw, ... go (sw) */
} conv_src;

static void src_free(conv_src *s) {
    free(s->tap_off), free(s->row_off), free(s->col_off);
    s->tap_off = s->row_off = s->col_off = NULL;
}

static bool src_make(conv_src *s, const nd_conv_plan *p) {
    const nd_conv_geom *g = p->g;
    s->p = p;
    /* Phase planes pay for their copy once output rows are 4 wide (fewer,
     * and the copy is element by element) and several taps read each copied
     * pixel; below that, strided reads. (A strided 1x1 convolution reads
     * each pixel at most once: copying all of x into phase planes, three
     * quarters of them never read, had made ResNet-50's stride-2
     * downsampling convolutions run at half the BLAS path's speed.) */
    const bool phases = (g->sh > 1 || g->sw > 1) && g->lw >= 4 && p->nt > 1;
    s->reads_pad = false;
    for (int64_t t = 0; t < p->nt; t++) {
        const int64_t i = p->tap[t] / g->kw, j = p->tap[t] % g->kw;
        const int64_t y0 = i * g->dh - g->ph, y1 = y0 + (g->lh - 1) * g->sh;
        const int64_t x0 = j * g->dw - g->pw, x1 = x0 + (g->lw - 1) * g->sw;
        if (y0 < 0 || y1 >= p->H || x0 < 0 || x1 >= p->W) s->reads_pad = true;
    }
    s->copy = phases || s->reads_pad;
    s->row_off = s->col_off = NULL;
    s->tap_off = malloc(sizeof(int64_t) * (size_t)(p->nt > 0 ? p->nt : 1));
    if (!s->tap_off) return false;
    if (!s->copy) {
        s->sh = s->sw = 1, s->Hq = p->H, s->Wq = p->W, s->HWp = p->H * p->W;
        s->row = g->sh * p->W, s->step = g->sw;
        for (int64_t t = 0; t < p->nt; t++) {
            const int64_t i = p->tap[t] / g->kw, j = p->tap[t] % g->kw;
            s->tap_off[t] = (i * g->dh - g->ph) * p->W + (j * g->dw - g->pw);
        }
        return true;
    }
    /* the padded extent: x itself, and every position a tap reads */
    const int64_t hr = (g->lh - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    const int64_t wr = (g->lw - 1) * g->sw + (g->kw - 1) * g->dw + 1;
    const int64_t Hp = hr > p->H + g->ph ? hr : p->H + g->ph;
    const int64_t Wp = wr > p->W + g->pw ? wr : p->W + g->pw;
    s->sh = phases ? g->sh : 1, s->sw = phases ? g->sw : 1;
    s->Hq = (Hp + s->sh - 1) / s->sh, s->Wq = (Wp + s->sw - 1) / s->sw;
    s->HWp = s->sh * s->sw * s->Hq * s->Wq;
    s->row = phases ? s->Wq : g->sh * s->Wq, s->step = phases ? 1 : g->sw;
    const int64_t plane = s->Hq * s->Wq;
    for (int64_t t = 0; t < p->nt; t++) {
        const int64_t y = (p->tap[t] / g->kw) * g->dh, x = (p->tap[t] % g->kw) * g->dw;
        s->tap_off[t] = ((y % s->sh) * s->sw + x % s->sw) * plane + (y / s->sh) * s->Wq + x / s->sw;
    }
    /* padded pixel (y, x) sits at ((y % sh) * sw + x % sw) * plane + (y / sh)
     * * Wq + x / sw: a row part and a column part, tabulated here so the
     * copies divide nothing */
    s->row_off = malloc(sizeof(int64_t) * (size_t)p->H);
    s->col_off = malloc(sizeof(int64_t) * (size_t)s->sw);
    if (!s->row_off || !s->col_off) return false;
    for (int64_t y = 0; y < p->H; y++) {
        const int64_t yp = y + g->ph;
        s->row_off[y] = (yp % s->sh) * s->sw * plane + (yp / s->sh) * s->Wq;
    }
    for (int64_t ph = 0; ph < s->sw; ph++) {
        const int64_t xp = ph + g->pw;
        s->col_off[ph] = (xp % s->sw) * plane + xp / s->sw;
    }
    return true;
}

/* A thread's copied image: every packer visits images in increasing order
 * (segments run in column order, and a thread's columns are consecutive),
 * so an image is copied once and, for gx, written back to GX once, when the
 * next image takes the buffer or at the end. */
typedef struct {
    float *buf;
    int64_t tag; /* the image in buf, or -1 */
} pad_slot;

/* (the buffer from the scratch cache: malloc's fresh mapping of a
 * ResNet-50 image, 860 KB, page-faulted on every call, 4% of a 3x3
 * layer's time) */
static bool slot_make(pad_slot *r, const conv_src *s) {
    r->tag = -1;
    r->buf = s->copy ? nd_cpu_scratch_alloc(sizeof(float) * (size_t)(s->p->C * s->HWp)) : NULL;
    return !s->copy || r->buf;
}

/* One image's C planes between x's layout (C, H, W) and a copy's (padded,
 * phase-split): src_is_copy says which way. Each phase of a row is a
 * contiguous run in the copy (one run when sw = 1). */
static void copy_planes(const conv_src *s, const float *src, float *dst, bool src_is_copy) {
    const nd_conv_plan *p = s->p;
    const int64_t sw = s->sw, W = p->W;
    for (int64_t c = 0; c < p->C; c++)
        for (int64_t y = 0; y < p->H; y++) {
            const int64_t dense = (c * p->H + y) * W, row = c * s->HWp + s->row_off[y];
            for (int64_t ph = 0; ph < sw && ph < W; ph++) {
                const int64_t run = row + s->col_off[ph];
                if (src_is_copy)
                    for (int64_t x = ph, q = 0; x < W; x += sw, q++) dst[dense + x] = src[run + q];
                else
                    for (int64_t x = ph, q = 0; x < W; x += sw, q++) dst[run + q] = src[dense + x];
            }
        }
}

/* image n's planes, to read */
static const float *image_in(const conv_src *s, pad_slot *r, const float *X, int64_t n) {
    const nd_conv_plan *p = s->p;
    const float *xn = X + n * p->x_img;
    if (!s->copy) return xn;
    if (r->tag == n) return r->buf;
    r->tag = n;
    if (s->reads_pad) memset(r->buf, 0, sizeof(float) * (size_t)(p->C * s->HWp));
    copy_planes(s, xn, r->buf, false);
    return r->buf;
}

/* the copied gx image in the slot (if any) back to GX */
static void slot_flush(const conv_src *s, pad_slot *r, float *GX) {
    if (!s->copy || r->tag < 0) return;
    copy_planes(s, r->buf, GX + r->tag * s->p->x_img, true);
    r->tag = -1;
}

/* image n's gx planes, to add into (GX's own, zeroed by the caller, when
 * x's planes are read in place) */
static float *image_grad(const conv_src *s, pad_slot *r, float *GX, int64_t n) {
    if (!s->copy) return GX + n * s->p->x_img;
    if (r->tag == n) return r->buf;
    slot_flush(s, r, GX);
    r->tag = n;
    memset(r->buf, 0, sizeof(float) * (size_t)(s->p->C * s->HWp));
    return r->buf;
}

/* ----------------------------------------------------------- segments */

/* Columns j0 .. j1-1 as pieces of output rows: image n, output pixels
 * l .. l+len-1 (one row), at position j from j0 in the packed data; base =
 * oh*row + ow*step, where each tap's read starts (plus tap_off). */
typedef struct {
    int64_t n, l, len, j, base;
} col_seg;

static int64_t col_segs(const conv_src *s, int64_t j0, int64_t j1, col_seg *seg) {
    const nd_conv_geom *g = s->p->g;
    const int64_t L = s->p->L;
    int64_t ns = 0;
    for (int64_t j = j0; j < j1;) {
        const int64_t n = j / L, l = j % L, oh = l / g->lw, ow = l % g->lw;
        const int64_t len = g->lw - ow < j1 - j ? g->lw - ow : j1 - j;
        seg[ns++] = (col_seg){n, l, len, j - j0, oh * s->row + ow * s->step};
        j += len;
    }
    return ns;
}

/* The segments merged into runs of consecutive pixels of one image (dy
 * and the output are contiguous along a run; only im2col needs rows). */
static int64_t seg_runs(const col_seg *seg, int64_t ns, col_seg *run) {
    int64_t nr = 0;
    for (int64_t q = 0; q < ns; q++) {
        if (nr > 0 && run[nr - 1].n == seg[q].n && run[nr - 1].l + run[nr - 1].len == seg[q].l)
            run[nr - 1].len += seg[q].len;
        else
            run[nr++] = seg[q];
    }
    return nr;
}

/* ------------------------------------------------------------- packing */

/* A panels of the weight's live taps: (Opad/6, K, 6), zero rows past O. A
 * panel at a time, its six filters read side by side and each k's six
 * values written together: filter by filter, each panel was written six
 * times over at a stride of 6 floats, and packing took as many
 * instructions as the tiles in ResNet9's inference at batch 8 (callgrind:
 * 22% of the run each). */
static void pack_weight(const nd_conv_plan *p, const float *W, float *A) {
    const int64_t K = p->K, O = p->O, C = p->C, nt = p->nt, kk = p->kk, npan = round_up(O, MR) / MR;
    const int64_t *tap = p->tap;
#pragma omp parallel for num_threads(nd_cpu_threads()) if (npan * MR * K >= ND_PARALLEL_THRESHOLD) schedule(static)
    for (int64_t q = 0; q < npan; q++) {
        float *dst = A + q * K * MR;
        const float *src[MR];
        for (int r = 0; r < MR; r++) src[r] = q * MR + r < O ? W + (q * MR + r) * C * kk : NULL;
        for (int64_t c = 0; c < C; c++)
            for (int64_t t = 0; t < nt; t++, dst += MR) {
                const int64_t at = c * kk + tap[t];
                for (int r = 0; r < MR; r++) dst[r] = src[r] ? src[r][at] : 0.0f;
            }
    }
}

/* A panels of the transposed weight: (Kpad/6, O, 6), zero rows past K; a
 * panel at a time, each filter's six values written together (as
 * pack_weight) */
static void pack_weight_t(const nd_conv_plan *p, const float *W, float *A) {
    const int64_t O = p->O, K = p->K, C = p->C, nt = p->nt, kk = p->kk, npan = round_up(K, MR) / MR;
    const int64_t *tap = p->tap;
#pragma omp parallel for num_threads(nd_cpu_threads()) if (npan * MR * O >= ND_PARALLEL_THRESHOLD) schedule(static)
    for (int64_t q = 0; q < npan; q++) {
        float *dst = A + q * O * MR;
        int64_t at[MR]; /* where panel row r's value sits in a filter (-1: past K) */
        for (int r = 0; r < MR; r++) {
            const int64_t k = q * MR + r;
            at[r] = k < K ? (k / nt) * kk + tap[k % nt] : -1;
        }
        for (int64_t o = 0; o < O; o++, dst += MR) {
            const float *f = W + o * C * kk;
            for (int r = 0; r < MR; r++) dst[r] = at[r] >= 0 ? f[at[r]] : 0.0f;
        }
    }
}

#define ROW_MASK(n) ((__mmask16)((1u << (n)) - 1u)) /* the first n of 16 lanes, n <= 16 */

/* Whether a row of len floats goes through the masked AVX-512 moves: only
 * the widths the scalar paths have no fixed-size move for (16, 8, 4, 2 and 1
 * floats keep theirs). With every width masked, ResNet9's training step
 * (4 x 4 to 1 x 1 maps) went 7.3-7.6 -> 8.4-8.5 ms and its convolutions'
 * forward 38-41 -> 41-43 ms (nd.profile, 20 steps, alternating runs). */
static inline bool masked_pays(int64_t len) { return len != 16 && len != 8 && len != 4 && len != 2 && len != 1; }

/* im2col rows of one segment of unit stride with AVX-512 moves, masked at
 * a row's end: row (c, t) is len floats from img + c HWp + toff[t], to dst
 * + (c nt + t) ld. The SSE copies of the fixed widths and the scalar loop
 * of the others (a 14- or 7-pixel output row: ResNet-50's last stages)
 * were 20-30% of a 3x3 layer's forward (perf). */
__attribute__((target("avx512f"))) static void rows_copy_avx512(const float *img, int64_t C, int64_t HWp,
                                                                 int64_t nt, const int64_t *toff, int64_t len,
                                                                 float *dst, int64_t ld) {
    if (len <= 16) {
        const __mmask16 m = ROW_MASK(len);
        for (int64_t c = 0; c < C; c++, img += HWp)
            for (int64_t t = 0; t < nt; t++, dst += ld)
                _mm512_mask_storeu_ps(dst, m, _mm512_maskz_loadu_ps(m, img + toff[t]));
        return;
    }
    for (int64_t c = 0; c < C; c++, img += HWp)
        for (int64_t t = 0; t < nt; t++, dst += ld) {
            const float *src = img + toff[t];
            int64_t k = 0;
            for (; k + 16 <= len; k += 16) _mm512_storeu_ps(dst + k, _mm512_loadu_ps(src + k));
            if (k < len) {
                const __mmask16 m = ROW_MASK(len - k);
                _mm512_mask_storeu_ps(dst + k, m, _mm512_maskz_loadu_ps(m, src + k));
            }
        }
}

/* col2im of one segment of unit stride (len <= 16): row (c, t) of the
 * tile, 16 floats apart, added into img + c HWp + toff[t] */
__attribute__((target("avx512f"))) static void rows_add_avx512(float *img, int64_t C, int64_t HWp, int64_t nt,
                                                                const int64_t *toff, int64_t len,
                                                                const float *src) {
    const __mmask16 m = ROW_MASK(len);
    for (int64_t c = 0; c < C; c++, img += HWp)
        for (int64_t t = 0; t < nt; t++, src += NR) {
            float *d = img + toff[t];
            _mm512_mask_storeu_ps(d, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), _mm512_maskz_loadu_ps(m, src)));
        }
}

/* im2col of the segments' columns into rows of stride ld: row c*nt + t at
 * B + (c*nt + t) * ld. ld = 16: a forward B panel; ld = the block's depth:
 * the weight gradient's plain rows. */
static void pack_cols(const conv_src *s, pad_slot *r, const float *X, const col_seg *seg,
                      int64_t ns, int64_t ld, float *B) {
    const nd_conv_plan *p = s->p;
    const int64_t sw = s->step, nt = p->nt, C = p->C, HWp = s->HWp;
    const int64_t *toff = s->tap_off;
    const bool wide = tiles_avx512();
    for (int64_t q = 0; q < ns; q++) {
        const float *img = image_in(s, r, X, seg[q].n) + seg[q].base;
        float *dst = B + seg[q].j;
        const int64_t len = seg[q].len;
        if (wide && sw == 1 && masked_pays(len)) {
            rows_copy_avx512(img, C, HWp, nt, toff, len, dst, ld);
            continue;
        }
        /* the common widths as fixed-size (vector) moves, chosen once per
         * segment rather than per row */
#define ROWS(COPY)                                                             \
    for (int64_t c = 0; c < C; c++, img += HWp)                                \
        for (int64_t t = 0; t < nt; t++, dst += ld) {                          \
            const float *src_ = img + toff[t];                                 \
            COPY;                                                              \
        }
        if (sw == 1 && len == 16) ROWS(memcpy(dst, src_, 16 * sizeof(float)))
        else if (sw == 1 && len == 8) ROWS(memcpy(dst, src_, 8 * sizeof(float)))
        else if (sw == 1 && len == 4) ROWS(memcpy(dst, src_, 4 * sizeof(float)))
        else if (sw == 1 && len == 2) ROWS(memcpy(dst, src_, 2 * sizeof(float)))
        else if (sw == 1 && len == 1) ROWS(dst[0] = src_[0])
        else ROWS(for (int64_t k = 0; k < len; k++) dst[k] = src_[k * sw])
#undef ROWS
    }
}

/* rows (O, ld) of dy for the runs' columns: a B panel (ld = 16) or the
 * weight gradient's plain rows */
static void pack_dy(const nd_conv_plan *p, const float *DY, const col_seg *run, int64_t nr,
                    int64_t ld, float *B) {
    const int64_t O = p->O, L = p->L;
    for (int64_t q = 0; q < nr; q++) {
        const float *src = DY + run[q].n * p->y_img + run[q].l;
        float *dst = B + run[q].j;
        if (run[q].len == NR)
            for (int64_t o = 0; o < O; o++, dst += ld, src += L) memcpy(dst, src, NR * sizeof(float));
        else
            for (int64_t o = 0; o < O; o++, dst += ld, src += L)
                for (int64_t k = 0; k < run[q].len; k++) dst[k] = src[k];
    }
}

/* G[o][k] += dot(D row o, B row k) for o < 4, k < 3 (G row stride ldg; D
 * and B rows dp floats, dp a multiple of 8): 12 accumulators, 7 loads per
 * 12 FMAs, no transposed packing. */
__attribute__((target("avx2,fma"))) static void dot_4x3(int64_t dp, const float *D, const float *B,
                                                        float *G, int64_t ldg) {
    __m256 s00 = _mm256_setzero_ps(), s01 = s00, s02 = s00, s10 = s00, s11 = s00, s12 = s00,
           s20 = s00, s21 = s00, s22 = s00, s30 = s00, s31 = s00, s32 = s00;
    const float *d0 = D, *d1 = D + dp, *d2 = D + 2 * dp, *d3 = D + 3 * dp;
    const float *b0 = B, *b1 = B + dp, *b2 = B + 2 * dp;
    for (int64_t j = 0; j < dp; j += 8) {
        const __m256 x0 = _mm256_loadu_ps(b0 + j), x1 = _mm256_loadu_ps(b1 + j),
                     x2 = _mm256_loadu_ps(b2 + j);
        __m256 a = _mm256_loadu_ps(d0 + j);
        s00 = _mm256_fmadd_ps(a, x0, s00), s01 = _mm256_fmadd_ps(a, x1, s01),
        s02 = _mm256_fmadd_ps(a, x2, s02);
        a = _mm256_loadu_ps(d1 + j);
        s10 = _mm256_fmadd_ps(a, x0, s10), s11 = _mm256_fmadd_ps(a, x1, s11),
        s12 = _mm256_fmadd_ps(a, x2, s12);
        a = _mm256_loadu_ps(d2 + j);
        s20 = _mm256_fmadd_ps(a, x0, s20), s21 = _mm256_fmadd_ps(a, x1, s21),
        s22 = _mm256_fmadd_ps(a, x2, s22);
        a = _mm256_loadu_ps(d3 + j);
        s30 = _mm256_fmadd_ps(a, x0, s30), s31 = _mm256_fmadd_ps(a, x1, s31),
        s32 = _mm256_fmadd_ps(a, x2, s32);
    }
    /* columns k of the 4 rows: hsum4 gives [row0, row1, row2, row3] */
    float c0[4], c1[4], c2[4];
    _mm_storeu_ps(c0, nd_hsum4(s00, s10, s20, s30));
    _mm_storeu_ps(c1, nd_hsum4(s01, s11, s21, s31));
    _mm_storeu_ps(c2, nd_hsum4(s02, s12, s22, s32));
    for (int i = 0; i < 4; i++) {
        G[i * ldg] += c0[i];
        G[i * ldg + 1] += c1[i];
        G[i * ldg + 2] += c2[i];
    }
}

/* (rows_pad, dp) rows of which (rows, d) get written: zero the rest */
static void zero_padding(float *M, int64_t rows, int64_t rows_pad, int64_t d, int64_t dp) {
    if (dp > d)
        for (int64_t i = 0; i < rows; i++) memset(M + i * dp + d, 0, sizeof(float) * (size_t)(dp - d));
    memset(M + rows * dp, 0, sizeof(float) * (size_t)((rows_pad - rows) * dp));
}

/* ------------------------------------------------------------ epilogues */

/* OUT[n, o, l] = act(T[o][j] + b[o]) + RES[n, o, l] (RES: NULL, or a
 * residual in OUT's layout) for the runs' columns */
/* store_out without another activation, with AVX-512 moves masked at a
 * run's end (runs of at most 16): the same adds and ReLU, the same bits */
__attribute__((target("avx512f"))) static void store_out_avx512(const nd_conv_plan *p, const float *T,
                                                                 const col_seg *seg, int64_t ns,
                                                                 const float *Bias, bool relu,
                                                                 const float *RES, float *OUT) {
    const int64_t O = p->O, L = p->L;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t o = 0; o < O; o++) {
        const __m512 bo = _mm512_set1_ps(Bias ? Bias[o] : 0.0f);
        for (int64_t q = 0; q < ns; q++) {
            const int64_t at = seg[q].n * p->y_img + o * L + seg[q].l;
            const __mmask16 m = ROW_MASK(seg[q].len);
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, T + o * NR + seg[q].j), bo);
            if (relu) /* v <= 0 (ordered: NaN stays NaN, as nd.relu) -> 0 */
                v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LE_OQ), zero);
            if (RES) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, RES + at));
            _mm512_mask_storeu_ps(OUT + at, m, v);
        }
    }
}

static void store_out(const nd_conv_plan *p, const float *T, const col_seg *seg, int64_t ns,
                      const float *Bias, bool relu, nd_inner_fn act_fn, const float *RES, float *OUT) {
    const int64_t O = p->O, L = p->L;
    if (!act_fn && tiles_avx512()) { /* a panel with a run of another width: masked moves */
        bool odd = false;
        for (int64_t q = 0; q < ns; q++) odd |= masked_pays(seg[q].len);
        if (odd) {
            store_out_avx512(p, T, seg, ns, Bias, relu, RES, OUT);
            return;
        }
    }
    for (int64_t o = 0; o < O; o++) {
        const float bo = Bias ? Bias[o] : 0.0f;
        for (int64_t q = 0; q < ns; q++) {
            const float *t = T + o * NR + seg[q].j;
            const int64_t at = seg[q].n * p->y_img + o * L + seg[q].l;
            float *d = OUT + at;
            const int64_t len = seg[q].len;
            if (relu)
                for (int64_t k = 0; k < len; k++) {
                    const float v = t[k] + bo;
                    d[k] = !(v <= 0.0f) ? v : 0.0f; /* NaN stays NaN, as nd.relu */
                }
            else
                for (int64_t k = 0; k < len; k++) d[k] = t[k] + bo;
            if (act_fn) { /* another activation: nd.<act>'s own inner loop, in place */
                char *pp[2] = {(char *)d, (char *)d};
                const int64_t s[2] = {sizeof(float), sizeof(float)};
                act_fn(pp, s, len, NULL);
            }
            if (RES) {
                const float *r = RES + at;
                for (int64_t k = 0; k < len; k++) d[k] += r[k];
            }
        }
    }
}

/* col2im of a (K, 16) tile of DCOLS: each entry added where im2col read it */
static void add_cols(const conv_src *s, pad_slot *r, const float *T, const col_seg *seg,
                     int64_t ns, float *GX) {
    const nd_conv_plan *p = s->p;
    const int64_t sw = s->step, nt = p->nt, C = p->C, HWp = s->HWp;
    const int64_t *toff = s->tap_off;
    const bool wide = tiles_avx512();
    for (int64_t q = 0; q < ns; q++) {
        float *img = image_grad(s, r, GX, seg[q].n) + seg[q].base;
        const float *src = T + seg[q].j;
        const int64_t len = seg[q].len;
        if (wide && sw == 1 && masked_pays(len)) { /* (the same adds, element for element: the same bits) */
            rows_add_avx512(img, C, HWp, nt, toff, len, src);
            continue;
        }
#define ROWS(LEN, STEP)                                                        \
    for (int64_t c = 0; c < C; c++, img += HWp)                                \
        for (int64_t t = 0; t < nt; t++, src += NR) {                          \
            float *d_ = img + toff[t];                                         \
            for (int64_t k = 0; k < (LEN); k++) d_[k * (STEP)] += src[k];      \
        }
        if (sw == 1 && len == 16) ROWS(16, 1)
        else if (sw == 1 && len == 8) ROWS(8, 1)
        else if (sw == 1 && len == 4) ROWS(4, 1)
        else if (sw == 1 && len == 2) ROWS(2, 1)
        else if (sw == 1 && len == 1) ROWS(1, 1)
        else if (sw == 1) ROWS(len, 1)
        else ROWS(len, sw)
#undef ROWS
    }
}

/* ---------------------------------------------------------------- driver */

/* NEEDLE_CONV_BLAS=1 sends every conv to the BLAS path, for comparisons. */
static bool packed_available(void) {
    static int has = -1;
    return nd_cpu_avx2_enabled("NEEDLE_CONV_BLAS", &has);
}

bool nd_cpu_packed_conv(void) { return packed_available(); }

/* NEEDLE_CONV_PACKED=1 runs every float32 product this path can run here,
 * whatever its shape (for comparisons with the BLAS path) */
static bool packed_everywhere(void) {
    static int all = -1;
    if (all < 0) {
        const char *e = getenv("NEEDLE_CONV_PACKED");
        all = e && *e && *e != '0';
    }
    return all == 1;
}

/* Whether this path beats the BLAS one on a product of this shape. Packed
 * wins on thin products (few channels, small maps, small batches: ResNet9,
 * MobileNetV2's narrow layers), BLAS on big ones: its blocking keeps a
 * large weight in cache across many columns, where the packed kernel
 * streams all of it once per 16 columns, and its 1x1 products write C in
 * place where this one stages every tile. Thresholds from timing each
 * product of ResNet-50 (batch 4), MobileNetV2 (batch 4 and 8) and ResNet9
 * (batch 8 and 128) both ways on a 2-core Zen 4 (docs/cpu-gemm.md, "Which
 * path runs a convolution"); cols counts output pixels across the batch. */
/* Whether the weight gradient of a large weight goes to the GEMM path
 * whatever the pixel count. Measured: on an AMD Zen 4 (2026-11, 512-bit
 * FMAs as two halves) the packed kernel's dot products won over many
 * pixels; on an Intel Xeon (2026-11-29, two full-width FMA units, after the
 * GEMM's C prefetch and A read in place) the GEMM path won every ResNet-50
 * layer with a weight of 128 KB or more, by 1.2-2.4x (ResNet-50 batch 8,
 * all grad w products: packed 535 ms, GEMM 332, PyTorch's oneDNN 336). Other
 * vendors take AMD's rule. */
static bool grad_w_gemm_over_many_pixels(void) { return nd_cpu_is_intel(); }

static bool packed_wins(const nd_conv_plan *p, nd_conv_product which) {
    const int64_t cols = p->N * p->L, OK = p->O * p->K;
    const int64_t widest = p->O > p->K ? p->O : p->K;
    switch (which) {
    case ND_CONV_FORWARD: /* BLAS: 1x1 over large maps or with a large weight */
        return !(p->nt == 1 && (cols >= 8192 || OK >= 262144));
    case ND_CONV_GRAD_X: /* BLAS: large maps with 64+ channels a side (up to
                          * 3x3: the 7x7 stem's scatter stays here), a weight
                          * of 4 MB or more, or a 1x1 of 256 KB over 2048+ pixels */
        return !((p->nt <= 9 && cols >= 8192 && widest >= 64) || OK >= 1048576 ||
                 (p->nt == 1 && OK >= 65536 && cols >= 2048));
    case ND_CONV_GRAD_W: /* GEMM: a weight of 128 KB or more - on AMD only over
                          * few pixels (each thread's partial sums of the whole
                          * weight cost more than its share of them) */
        return !(OK >= 32768 && (cols < 1024 || grad_w_gemm_over_many_pixels()));
    }
    return true;
}

/* Group g of p as a convolution of its own: Cg channels in, Og out, the
 * images still x_img and y_img apart (the caller offsets the pointers by the
 * group's first channel and filter). Its tap table is p's (not owned). */
static nd_conv_plan group_plan(const nd_conv_plan *p) {
    nd_conv_plan q = *p;
    q.C = p->Cg, q.O = p->Og, q.G = 1;
    q.off = NULL;
    return q;
}

bool nd_cpu_conv_packed_runs(const nd_conv_plan *p, nd_dtype dt, nd_conv_product which) {
    if (dt != ND_FLOAT32 || p->nt == 0 || !packed_available()) return false;
    /* float32 matmul precision "medium": im2col and the GEMM's bfloat16 kernel
     * where it takes this product (cpu_conv_gemm.c's: filters per group,
     * the group's depth and a chunk's columns) and it is large enough to pay */
    const int64_t cols = p->nb * p->L, kg = p->Cg * p->nt;
    const int64_t gm = which == ND_CONV_GRAD_X ? kg : p->Og, gn = which == ND_CONV_GRAD_W ? kg : cols;
    if (nd_cpu_gemm_bf16_for(gm, gn) && nd_conv_bf16_pays(p, which)) return false;
    const nd_conv_plan q = group_plan(p); /* (p itself when groups = 1) */
    return packed_everywhere() || packed_wins(&q, which);
}

static bool packed_applies(const nd_conv_plan *p, const nd_tensor *x) {
    return nd_cpu_conv_packed_runs(p, x->dtype, ND_CONV_FORWARD);
}

/* threads for work of this many multiply-adds, at most one per unit */
static int threads_for(int64_t madds, int64_t units) {
    int nt = madds >= 8 * (int64_t)ND_PARALLEL_THRESHOLD ? nd_cpu_threads() : 1;
    return nt > units ? (int)(units > 0 ? units : 1) : nt;
}

static void *alloc_floats(int64_t n) { /* 64-byte aligned, whole cache lines (cpu_scratch.h) */
    return nd_cpu_scratch_alloc((size_t)round_up(n > 0 ? n : 1, 16) * sizeof(float));
}

/* One group's forward (p: its plan, the pointers at its first channel,
 * filter, bias and output plane); Wt NULL when prepacked is given. */
static nd_status forward_group(const nd_conv_plan *p, const float *X, const float *Wt,
                               const float *prepacked, const float *Bias, bool relu,
                               nd_inner_fn act_fn, const float *RES, float *OUT) {
    const int64_t K = p->K, O = p->O, Opad = round_up(O, MR), cols = p->N * p->L;
    const int64_t npanels = (cols + NR - 1) / NR;
    conv_src src;
    float *A = prepacked ? NULL : alloc_floats(Opad * K);
    if (!src_make(&src, p) || (!A && !prepacked)) {
        src_free(&src), nd_cpu_scratch_free(A);
        return nd_fail(ND_ERR_MEMORY, "fused_conv2d: out of memory");
    }
    if (prepacked) A = (float *)prepacked; /* (not freed below: A is the caller's then) */
    else pack_weight(p, Wt, A);
    int failed = 0;
#pragma omp parallel num_threads(threads_for(O * K * cols, npanels))
    {
        float *B = alloc_floats(K * NR), *T = alloc_floats(Opad * NR);
        pad_slot slot;
        const bool ok = slot_make(&slot, &src) && B && T;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* a thread whose buffers failed still takes part in the loop (no
         * early exit from a worksharing loop); it just does no work. The
         * static schedule gives each thread consecutive panels, so the
         * images it reads only ever increase (pad_slot). */
#pragma omp for schedule(static)
        for (int64_t pi = 0; pi < npanels; pi++) {
            if (!ok) continue;
            const int64_t j0 = pi * NR, j1 = j0 + NR < cols ? j0 + NR : cols;
            col_seg seg[NR], run[NR];
            const int64_t ns = col_segs(&src, j0, j1, seg), nr = seg_runs(seg, ns, run);
            if (j1 - j0 < NR) memset(B, 0, sizeof(float) * (size_t)(K * NR));
            pack_cols(&src, &slot, X, seg, ns, NR, B);
            panel_product(K, Opad, A, B, T);
            store_out(p, T, run, nr, Bias, relu, act_fn, RES, OUT);
        }
        nd_cpu_scratch_free(B), nd_cpu_scratch_free(T), nd_cpu_scratch_free(slot.buf);
    }
    if (!prepacked) nd_cpu_scratch_free(A);
    src_free(&src);
    if (failed) return nd_fail(ND_ERR_MEMORY, "fused_conv2d: out of memory");
    return ND_OK;
}

/* Groups run one after another, each as a convolution of its own: a
 * grouped layer's products are thin (ResNeXt's 3x3s: 4 to 32 channels a
 * group), where this path beats im2col + a GEMM per group. (Depthwise
 * layers, one channel a group, have their own kernel: cpu_conv_depthwise.c.) */
nd_status nd_cpu_conv2d_packed(nd_conv_plan *p, nd_tensor *out, const nd_tensor *x,
                               const nd_tensor *w, const float *prepacked, const nd_tensor *b,
                               nd_activation act, const nd_tensor *res, bool *done) {
    *done = false;
    const bool relu = act == ND_ACT_RELU;
    const nd_inner_fn act_fn = act == ND_ACT_GELU ? nd_cpu_unary_inner(ND_UNARY_gelu, ND_FLOAT32) : NULL;
    if (!packed_applies(p, x) || (prepacked && p->G != 1)) return ND_OK;
    const nd_conv_plan q = group_plan(p);
    const float *X = (const float *)nd_ptr(x), *Bias = b ? (const float *)nd_ptr(b) : NULL;
    const float *RES = res ? (const float *)nd_ptr(res) : NULL;
    const float *Wt = prepacked ? NULL : (const float *)nd_ptr(w);
    float *OUT = (float *)nd_ptr(out);
    for (int64_t g = 0; g < p->G; g++) {
        const int64_t c0 = g * p->Cg, o0 = g * p->Og;
        ND_TRY(forward_group(&q, X + c0 * p->H * p->W, Wt ? Wt + o0 * p->Cg * p->kk : NULL,
                             prepacked, Bias ? Bias + o0 : NULL, relu, act_fn,
                             RES ? RES + o0 * p->L : NULL, OUT + o0 * p->L));
    }
    *done = true;
    return ND_OK;
}

/* The plan of a convolution of an input of shape xshape (N, C, H, W) and
 * dtype dt by O filters (only shapes: no data is read). */
static nd_status plan_for_shape(nd_conv_plan *p, const int64_t *xshape, nd_dtype dt, int64_t O,
                                const nd_conv_geom *g, int64_t groups, nd_tensor *xs) {
    memset(xs, 0, sizeof *xs);
    xs->ndim = 4;
    xs->dtype = dt;
    for (int d = 0; d < 4; d++) xs->shape[d] = xshape[d];
    return nd_conv_plan_make(p, "conv2d_prepack", xs, O, g, groups);
}

int64_t nd_cpu_conv2d_packed_numel(const int64_t *xshape, const int64_t *wshape, nd_dtype dt,
                                   const nd_conv_geom *g, int64_t groups) {
    nd_conv_plan p;
    nd_tensor xs;
    if (plan_for_shape(&p, xshape, dt, wshape[0], g, groups, &xs) != ND_OK) return 0;
    /* (groups run unpacked: one packed weight is one group's layout) */
    int64_t n = p.G == 1 && packed_applies(&p, &xs) ? round_up(p.O, MR) * p.K : 0;
    nd_conv_plan_free(&p);
    return n;
}

nd_status nd_cpu_conv2d_prepack(nd_tensor *packed, const nd_tensor *w, const int64_t *xshape,
                                const nd_conv_geom *g, int64_t groups) {
    nd_conv_plan p;
    nd_tensor xs;
    ND_TRY(plan_for_shape(&p, xshape, w->dtype, w->shape[0], g, groups, &xs));
    nd_status st = ND_OK;
    if (p.G != 1 || !packed_applies(&p, &xs) || packed->dtype != ND_FLOAT32 || !nd_is_contiguous(packed) ||
        nd_numel(packed) != round_up(p.O, MR) * p.K || !nd_is_contiguous(w))
        st = nd_fail(ND_ERR_INTERNAL, "conv2d_prepack: the packed weight does not fit this convolution");
    else
        pack_weight(&p, (const float *)nd_ptr(w), (float *)nd_ptr(packed));
    nd_conv_plan_free(&p);
    return st;
}

nd_status nd_cpu_conv2d_fused_packed(nd_tensor *out, const nd_tensor *x, const nd_tensor *packed,
                                     const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                                     nd_activation act, const nd_tensor *res) {
    nd_conv_plan p;
    ND_TRY(nd_conv_plan_make(&p, "fused_conv2d", x, out->shape[1], g, groups));
    bool done = false;
    nd_status st = ND_OK;
    if (nd_numel(packed) != round_up(p.O, MR) * p.K || packed->dtype != ND_FLOAT32)
        st = nd_fail(ND_ERR_INTERNAL, "fused_conv2d: the packed weight does not fit this convolution");
    else
        st = nd_cpu_conv2d_packed(&p, out, x, NULL, (const float *)nd_ptr(packed), b,
                                  act, res, &done);
    if (st == ND_OK && !done)
        st = nd_fail(ND_ERR_INTERNAL, "fused_conv2d: a packed weight for a convolution that does "
                     "not run packed");
    nd_conv_plan_free(&p);
    return st;
}

/* One group's gradients (p: its plan, the pointers at its first channel and
 * filter; GX or GW NULL when not wanted). */
static nd_status backward_group(const nd_conv_plan *p, float *GX, float *GW, const float *DY,
                                const float *X, const float *Wt) {
    const bool gx = GX != NULL, gw = GW != NULL;
    const int64_t K = p->K, O = p->O, N = p->N, L = p->L;
    const int64_t Kpad6 = round_up(K, MR), Kpad3 = round_up(K, 3), Opad4 = round_up(O, 4);
    /* whole images per thread: the col2im adds of two threads never meet */
    const int nth = threads_for(O * K * N * L * (gx && gw ? 2 : 1), N);
    /* weight-gradient blocks of nc columns: long dot products, so the
     * horizontal sums and the read-modify-write of the partial GW are paid
     * once per nc columns (with nc sized to keep all K im2col rows in L2,
     * ResNet-50's 3x3 layers got 16 columns and ran at a third of the
     * BLAS path's speed); the rows are then taken in chunks that fit L2 */
    const int64_t nc = BLOCK_COLS_MAX;
    conv_src src;
    float *AT = gx ? alloc_floats(Kpad6 * O) : NULL;
    float *GWP = gw ? calloc((size_t)(nth * Opad4 * Kpad3), sizeof(float)) : NULL;
    if (!src_make(&src, p) || (gx && !AT) || (gw && !GWP)) {
        src_free(&src), nd_cpu_scratch_free(AT), free(GWP);
        return nd_fail(ND_ERR_MEMORY, "conv2d_backward: out of memory");
    }
    if (gx) pack_weight_t(p, Wt, AT);
    int failed = 0;
#pragma omp parallel num_threads(nth)
    {
        const int id = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t n0 = N * id / team, n1 = N * (id + 1) / team;
        float *BG = gx ? alloc_floats(O * NR) : NULL, *TG = gx ? alloc_floats(Kpad6 * NR) : NULL;
        float *AD = gw ? alloc_floats(Opad4 * nc) : NULL, *BD = gw ? alloc_floats(Kpad3 * nc) : NULL;
        col_seg *seg = malloc(sizeof(col_seg) * (size_t)nc), *run = malloc(sizeof(col_seg) * (size_t)nc);
        pad_slot in_slot, g_slot;
        const bool slots = slot_make(&in_slot, &src) & slot_make(&g_slot, &src); /* both, always */
        const bool ok = slots && seg && run &&
                        (!gx || (BG && TG)) && (!gw || (AD && BD));
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        } else {
            if (gx && !src.copy)
                for (int64_t n = n0; n < n1; n++) /* (a group's planes of each image) */
                    memset(GX + n * p->x_img, 0, sizeof(float) * (size_t)(p->C * src.HWp));
            float *gwp = gw ? GWP + id * Opad4 * Kpad3 : NULL;
            for (int64_t b0 = n0 * L; b0 < n1 * L; b0 += nc) {
                const int64_t b1 = b0 + nc < n1 * L ? b0 + nc : n1 * L;
                if (gx)
                    for (int64_t j0 = b0; j0 < b1; j0 += NR) {
                        const int64_t j1 = j0 + NR < b1 ? j0 + NR : b1;
                        const int64_t ns = col_segs(&src, j0, j1, seg);
                        const int64_t nr = seg_runs(seg, ns, run);
                        if (j1 - j0 < NR) memset(BG, 0, sizeof(float) * (size_t)(O * NR));
                        pack_dy(p, DY, run, nr, NR, BG);
                        panel_product(O, Kpad6, AT, BG, TG);
                        add_cols(&src, &g_slot, TG, seg, ns, GX);
                    }
                if (gw) { /* rows padded to dp columns and to Opad4 / Kpad3 rows with zeros */
                    const int64_t d = b1 - b0, dp = round_up(d, 8), ns = col_segs(&src, b0, b1, seg);
                    zero_padding(AD, O, Opad4, d, dp);
                    zero_padding(BD, K, Kpad3, d, dp);
                    pack_dy(p, DY, run, seg_runs(seg, ns, run), dp, AD);
                    pack_cols(&src, &in_slot, X, seg, ns, dp, BD);
                    /* BD rows in chunks of kb (in L2); four dy rows (in L1)
                     * against each chunk */
                    int64_t kb = BLOCK_BYTES / (int64_t)sizeof(float) / dp / 3 * 3;
                    kb = kb < 3 ? 3 : kb;
                    for (int64_t k0 = 0; k0 < Kpad3; k0 += kb) {
                        const int64_t k1 = k0 + kb < Kpad3 ? k0 + kb : Kpad3;
                        for (int64_t o = 0; o < Opad4; o += 4)
                            for (int64_t k = k0; k < k1; k += 3)
                                dot_4x3(dp, AD + o * dp, BD + k * dp, gwp + o * Kpad3 + k, Kpad3);
                    }
                }
            }
            if (gx) slot_flush(&src, &g_slot, GX);
        }
        nd_cpu_scratch_free(BG), nd_cpu_scratch_free(TG), nd_cpu_scratch_free(AD), nd_cpu_scratch_free(BD);
        free(seg), free(run);
        nd_cpu_scratch_free(in_slot.buf), nd_cpu_scratch_free(g_slot.buf);
    }
    nd_cpu_scratch_free(AT), src_free(&src);
    if (failed) {
        free(GWP);
        return nd_fail(ND_ERR_MEMORY, "conv2d_backward: out of memory");
    }
    if (gw) { /* GW[o, c, tap] = the threads' partial sums; 0 at dead taps */
        memset(GW, 0, sizeof(float) * (size_t)(O * p->C * p->kk));
#pragma omp parallel for num_threads(nd_cpu_threads()) if (O * K * nth >= ND_PARALLEL_THRESHOLD) schedule(static)
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                float sum = 0;
                for (int th = 0; th < nth; th++) sum += GWP[(th * Opad4 + o) * Kpad3 + k];
                GW[(o * p->C + k / p->nt) * p->kk + p->tap[k % p->nt]] = sum;
            }
        free(GWP);
    }
    return ND_OK;
}

nd_status nd_cpu_conv2d_packed_backward(nd_conv_plan *p, nd_tensor *gx, nd_tensor *gw,
                                        const nd_tensor *dy, const nd_tensor *x,
                                        const nd_tensor *w, bool *done) {
    *done = false;
    if ((gx && !nd_cpu_conv_packed_runs(p, dy->dtype, ND_CONV_GRAD_X)) ||
        (gw && !nd_cpu_conv_packed_runs(p, dy->dtype, ND_CONV_GRAD_W)) || (!gx && !gw))
        return ND_OK; /* the caller asks for the products this path runs */
    const nd_conv_plan q = group_plan(p);
    const float *DY = (const float *)nd_ptr(dy), *X = gw ? (const float *)nd_ptr(x) : NULL;
    const float *Wt = gx ? (const float *)nd_ptr(w) : NULL;
    float *GX = gx ? (float *)nd_ptr(gx) : NULL, *GW = gw ? (float *)nd_ptr(gw) : NULL;
    for (int64_t g = 0; g < p->G; g++) { /* groups one after another, as the forward */
        const int64_t c0 = g * p->Cg * p->H * p->W, o0 = g * p->Og;
        ND_TRY(backward_group(&q, GX ? GX + c0 : NULL, GW ? GW + o0 * p->Cg * p->kk : NULL,
                              DY + o0 * p->L, X ? X + c0 : NULL, Wt ? Wt + o0 * p->Cg * p->kk : NULL));
    }
    *done = true;
    return ND_OK;
}

#else /* no x86-64 intrinsics: always the BLAS path */

bool nd_cpu_packed_conv(void) { return false; }

bool nd_cpu_conv_packed_runs(const nd_conv_plan *p, nd_dtype dt, nd_conv_product which) {
    (void)p, (void)dt, (void)which;
    return false;
}

nd_status nd_cpu_conv2d_packed(nd_conv_plan *p, nd_tensor *out, const nd_tensor *x,
                               const nd_tensor *w, const float *prepacked, const nd_tensor *b,
                               nd_activation act, const nd_tensor *res, bool *done) {
    (void)p, (void)out, (void)x, (void)w, (void)prepacked, (void)b, (void)act, (void)res;
    *done = false;
    return ND_OK;
}

/* nothing runs packed: the fold pass never asks for the two below */
int64_t nd_cpu_conv2d_packed_numel(const int64_t *xshape, const int64_t *wshape, nd_dtype dt,
                                   const nd_conv_geom *g, int64_t groups) {
    (void)xshape, (void)wshape, (void)dt, (void)g, (void)groups;
    return 0;
}

nd_status nd_cpu_conv2d_prepack(nd_tensor *packed, const nd_tensor *w, const int64_t *xshape,
                                const nd_conv_geom *g, int64_t groups) {
    (void)packed, (void)w, (void)xshape, (void)g, (void)groups;
    return nd_fail(ND_ERR_INTERNAL, "conv2d_prepack: no packed convolution in this build");
}

nd_status nd_cpu_conv2d_fused_packed(nd_tensor *out, const nd_tensor *x, const nd_tensor *packed,
                                     const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                                     nd_activation act, const nd_tensor *res) {
    (void)out, (void)x, (void)packed, (void)b, (void)g, (void)groups, (void)act, (void)res;
    return nd_fail(ND_ERR_INTERNAL, "fused_conv2d: no packed convolution in this build");
}

nd_status nd_cpu_conv2d_packed_backward(nd_conv_plan *p, nd_tensor *gx, nd_tensor *gw,
                                        const nd_tensor *dy, const nd_tensor *x,
                                        const nd_tensor *w, bool *done) {
    (void)p, (void)gx, (void)gw, (void)dy, (void)x, (void)w;
    *done = false;
    return ND_OK;
}
#endif
