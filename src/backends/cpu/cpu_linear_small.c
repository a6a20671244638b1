/* cpu_linear_small.c - float32 x @ w^T (+ b, ReLU) without packing w: for a
 * few rows of x (the inference shape of an MLP at batch 8, issue 7's
 * workload 7), up to 384 with AVX-512, any number on AMD Zen 4
 * (avx512_rows_max).
 *
 * For M = 8, K = O = 512, OpenBLAS's sgemm takes about 60 us (2 threads):
 * it packs the whole 1 MB weight on every call and splits the work poorly.
 * The product needs only one pass over w: each row of w is dotted with
 * every row of x (x, M * K floats, stays in L1). This kernel streams w
 * once, 4 rows at a time against 2 rows of x (8 AVX2 accumulators), folds
 * the 4x2 dot products with horizontal adds, and adds the bias and applies
 * the ReLU as it stores - no second pass over out. Threads split the rows
 * of w.
 *
 * AVX2 + FMA, or AVX-512 (4 rows of w against 4 of x) where the GEMM runs
 * AVX-512, chosen at run time (the build targets baseline x86-64):
 * nd_cpu_linear_small returns false when the CPU lacks them or the shape
 * does not fit, and the caller uses BLAS. Summation order differs from
 * BLAS's (each dot product is 8 interleaved partial sums, then a tree), so
 * results agree to float32 rounding, not bit for bit. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "cpu_avx2.h"
#include "cpu_caches.h"
#include "cpu_gemm.h"
#include "cpu_kernels.h"

/* rows of x up to this: each 4-row block of w is reread M/2 times, from L1.
 * Measured against the packed GEMM (cpu_gemm.c, AVX-512) on 2 cores: 20 x
 * 1024 x 256 took 72 us here and 96 us packed (the LSTM's h @ W_hh^T at
 * batch 20), 32 rows about the same, 64 rows 211 against 167 us. */
#define SMALL_M_MAX 24
/* The AVX-512 kernel against the packed GEMM, which packs w^T on every call.
 * On a CPU whose 512-bit FMAs run at full rate (the host of 2026-11-26,
 * 2 threads, us): 20 x 256 by 1024 52 against 129, 128 rows 219 against
 * 310, 384 rows 654 against 869; from about 700 rows the two were even, and
 * that host's GEMM won at 64 x 512 by 512 (0.33 against 0.22 ms). So rows
 * up to this: */
#define SMALL_M_MAX_AVX512 384
/* On AMD Zen 4, which runs a 512-bit FMA as two 256-bit halves (a peak of
 * 116 GFLOP/s a core measured here), the packed GEMM reaches 165-190
 * GFLOP/s on 2 cores and this kernel 190-210: with x in L2-sized slabs
 * (x_slab_rows) it won at every shape measured (2026-11-27, us, this kernel
 * / packed): 20 x 768 by 768 119 / 344, 128 x 3072 by 768 3050 / 4420,
 * 1024 x 768 by 3072 23000 / 27500 (BERT's FFN at batch 8), 2048 x 3072 by
 * 768 49200 / 52800, 8192 x 1024 by 1024 79600 / 91300. There it takes
 * every M (avx512_rows_max). (Without the slabs x was streamed once per 4
 * rows of w and the kernel lost from about 700 rows: 1.9x slower at 2048 x
 * 3072.) */

#ifdef ND_HAVE_AVX2_KERNELS

/* On Intel, from 64 rows up with a depth of 1536 or more the packed GEMM
 * (after its C prefetch and in-place A, cpu_gemm.c) beat this kernel, whose
 * 4 + 4 rows of x and w (8 K floats: 48 KB at K = 1536) no longer fit in L1
 * (an Intel Xeon, 2 threads, 2026-11-29, us, this kernel / GEMM: 128 x 3072
 * by 768 3316-3407 / 2482-2619, BERT's FFN output at batch 1; 96 x 3072 by
 * 768 2359-2378 / 1844-1999; 64 x 3072 by 768 1647-1671 / 1373-1595; 128 x
 * 2048 by 512 1184-1238 / 1022-1158); with fewer rows or a shallower depth
 * this kernel won (20 x 3072 by 768 506-679 / 881-897, 32 x 4096 by 1024
 * 1573-1589 / 1712-1966, 20 x 1024 by 256 56-61 / 108-121). Unmeasured
 * elsewhere, so only there. */
static bool deep_rows_to_gemm(int64_t M, int64_t K) { return M >= 64 && K >= 1536 && nd_cpu_is_intel(); }

static int64_t avx512_rows_max(void) {
    static int64_t max = -1;
    if (max < 0) {
        __builtin_cpu_init();
        max = __builtin_cpu_is("amdfam19h") && __builtin_cpu_supports("avx512f") ? INT64_MAX
                                                                                : SMALL_M_MAX_AVX512;
    }
    return max;
}

__attribute__((target("avx2,fma"))) static inline __m128 finish4(__m128 r, const float *b,
                                                                  bool relu) {
    if (b) r = _mm_add_ps(r, _mm_loadu_ps(b));
    if (relu) r = _mm_andnot_ps(_mm_cmple_ps(r, _mm_setzero_ps()), r); /* as nd.relu: -0 -> +0, NaN stays */
    return r;
}

static inline float finish1(float v, const float *b, bool relu) {
    if (b) v += *b;
    return relu && v <= 0 ? 0.0f : v; /* NaN stays NaN, as nd.relu */
}

/* Y[m, o] for o in [o0, o1) (o1 - o0 a multiple of 4 except at the end) */
__attribute__((target("avx2,fma"))) static void linear_block_avx2(
    const float *X, const float *W, const float *B, float *Y, int64_t M, int64_t K, int64_t O,
    int64_t o0, int64_t o1, bool relu) {
    const int64_t K8 = K & ~(int64_t)7;
    int64_t o = o0;
    for (; o + 4 <= o1; o += 4) {
        const float *w0 = W + o * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        int64_t m = 0;
        for (; m + 2 <= M; m += 2) {
            const float *x0 = X + m * K, *x1 = x0 + K;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
            __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            for (int64_t k = 0; k < K8; k += 8) {
                __m256 v0 = _mm256_loadu_ps(x0 + k), v1 = _mm256_loadu_ps(x1 + k);
                __m256 u = _mm256_loadu_ps(w0 + k);
                a00 = _mm256_fmadd_ps(v0, u, a00);
                a10 = _mm256_fmadd_ps(v1, u, a10);
                u = _mm256_loadu_ps(w1 + k);
                a01 = _mm256_fmadd_ps(v0, u, a01);
                a11 = _mm256_fmadd_ps(v1, u, a11);
                u = _mm256_loadu_ps(w2 + k);
                a02 = _mm256_fmadd_ps(v0, u, a02);
                a12 = _mm256_fmadd_ps(v1, u, a12);
                u = _mm256_loadu_ps(w3 + k);
                a03 = _mm256_fmadd_ps(v0, u, a03);
                a13 = _mm256_fmadd_ps(v1, u, a13);
            }
            __m128 r0 = nd_hsum4(a00, a01, a02, a03), r1 = nd_hsum4(a10, a11, a12, a13);
            if (K8 < K) {
                float t0[4] = {0}, t1[4] = {0};
                for (int64_t k = K8; k < K; k++) {
                    t0[0] += x0[k] * w0[k], t0[1] += x0[k] * w1[k];
                    t0[2] += x0[k] * w2[k], t0[3] += x0[k] * w3[k];
                    t1[0] += x1[k] * w0[k], t1[1] += x1[k] * w1[k];
                    t1[2] += x1[k] * w2[k], t1[3] += x1[k] * w3[k];
                }
                r0 = _mm_add_ps(r0, _mm_loadu_ps(t0));
                r1 = _mm_add_ps(r1, _mm_loadu_ps(t1));
            }
            _mm_storeu_ps(Y + m * O + o, finish4(r0, B ? B + o : NULL, relu));
            _mm_storeu_ps(Y + (m + 1) * O + o, finish4(r1, B ? B + o : NULL, relu));
        }
        if (m < M) { /* the last row of an odd M */
            const float *x0 = X + m * K;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < K8; k += 8) {
                __m256 v0 = _mm256_loadu_ps(x0 + k);
                a0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w0 + k), a0);
                a1 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w1 + k), a1);
                a2 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w2 + k), a2);
                a3 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(w3 + k), a3);
            }
            __m128 r = nd_hsum4(a0, a1, a2, a3);
            if (K8 < K) {
                float t[4] = {0};
                for (int64_t k = K8; k < K; k++)
                    t[0] += x0[k] * w0[k], t[1] += x0[k] * w1[k], t[2] += x0[k] * w2[k],
                    t[3] += x0[k] * w3[k];
                r = _mm_add_ps(r, _mm_loadu_ps(t));
            }
            _mm_storeu_ps(Y + m * O + o, finish4(r, B ? B + o : NULL, relu));
        }
    }
    for (; o < o1; o++) { /* fewer than 4 rows of w left */
        const float *wr = W + o * K;
        for (int64_t m = 0; m < M; m++) {
            const float *xr = X + m * K;
            __m256 a = _mm256_setzero_ps();
            for (int64_t k = 0; k < K8; k += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(xr + k), _mm256_loadu_ps(wr + k), a);
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            h = _mm_hadd_ps(h, h);
            h = _mm_hadd_ps(h, h);
            float s = _mm_cvtss_f32(h);
            for (int64_t k = K8; k < K; k++) s += xr[k] * wr[k];
            Y[m * O + o] = finish1(s, B ? B + o : NULL, relu);
        }
    }
}

/* [sum(a), sum(b), sum(c), sum(d)] of four 16-float vectors */
__attribute__((target("avx512f,avx2,fma"))) static inline __m128 hsum4_512(__m512 a, __m512 b,
                                                                            __m512 c, __m512 d) {
#define HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), \
                                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    return nd_hsum4(HALVES(a), HALVES(b), HALVES(c), HALVES(d));
#undef HALVES
}

/* The AVX-512 kernel: 4 rows of w against 4 rows of x (16 accumulators of
 * 16 floats, of the 32 registers), so each load feeds two FMAs, where the
 * AVX2 kernel's 2 x 4 block needs 6 loads per 8 FMAs; K's tail through
 * masked loads. The LSTM's h @ W_hh^T (20 x 256 by 1024) took 75 us on
 * AVX2 and 41 us here (2 threads).
 *
 * One body, three weights (LINEAR_BLOCK_AVX512): float32, and the half
 * types, each 16 of them converted to 16 floats as loaded (exactly: a
 * bfloat16 is a float32's top half, a float16 widens without rounding), so
 * a model kept in half precision (docs/tensor.md, "Half-precision models")
 * gets the bits of the float32 kernel on its rounded weights while reading
 * half the bytes. */
#define LINEAR_BLOCK_AVX512(NAME, TARGET, WT, LOADW, LOADW_TAIL) \
__attribute__((target(TARGET))) static void NAME(                                        \
    const float *X, const WT *W, const float *B, float *Y, int64_t M, int64_t K, int64_t O,   \
    int64_t o0, int64_t o1, bool relu) {                                                             \
    const int64_t K16 = K & ~(int64_t)15;                                                            \
    const __mmask16 tail = (__mmask16)((1u << (K - K16)) - 1u);                                      \
    int64_t o = o0;                                                                                  \
    for (; o + 4 <= o1; o += 4) {                                                                    \
        const WT *w[4] = {W + o * K, W + (o + 1) * K, W + (o + 2) * K, W + (o + 3) * K};             \
        int64_t m = 0;                                                                               \
        for (; m + 4 <= M; m += 4) {                                                                 \
            const float *x[4] = {X + m * K, X + (m + 1) * K, X + (m + 2) * K, X + (m + 3) * K};      \
            __m512 a[4][4];                                                                          \
            for (int r = 0; r < 4; r++)                                                              \
                for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();                           \
            for (int64_t k = 0; k < K16; k += 16) {                                                  \
                __m512 v[4];                                                                         \
                for (int r = 0; r < 4; r++) v[r] = _mm512_loadu_ps(x[r] + k);                        \
                for (int c = 0; c < 4; c++) {                                                        \
                    __m512 u = LOADW(w[c] + k);                                                      \
                    for (int r = 0; r < 4; r++) a[r][c] = _mm512_fmadd_ps(v[r], u, a[r][c]);         \
                }                                                                                    \
            }                                                                                        \
            if (tail) {                                                                              \
                __m512 v[4];                                                                         \
                for (int r = 0; r < 4; r++) v[r] = _mm512_maskz_loadu_ps(tail, x[r] + K16);          \
                for (int c = 0; c < 4; c++) {                                                        \
                    __m512 u = LOADW_TAIL(tail, w[c] + K16);                                         \
                    for (int r = 0; r < 4; r++) a[r][c] = _mm512_fmadd_ps(v[r], u, a[r][c]);         \
                }                                                                                    \
            }                                                                                        \
            for (int r = 0; r < 4; r++)                                                              \
                _mm_storeu_ps(Y + (m + r) * O + o,                                                   \
                              finish4(hsum4_512(a[r][0], a[r][1], a[r][2], a[r][3]), B ? B + o : NULL, relu)); \
        }                                                                                            \
        for (; m < M; m++) { /* the rows past a multiple of 4 */                                     \
            const float *x0 = X + m * K;                                                             \
            __m512 a[4];                                                                             \
            for (int c = 0; c < 4; c++) a[c] = _mm512_setzero_ps();                                  \
            for (int64_t k = 0; k < K16; k += 16) {                                                  \
                __m512 v = _mm512_loadu_ps(x0 + k);                                                  \
                for (int c = 0; c < 4; c++) a[c] = _mm512_fmadd_ps(v, LOADW(w[c] + k), a[c]);        \
            }                                                                                        \
            if (tail) {                                                                              \
                __m512 v = _mm512_maskz_loadu_ps(tail, x0 + K16);                                    \
                for (int c = 0; c < 4; c++)                                                          \
                    a[c] = _mm512_fmadd_ps(v, LOADW_TAIL(tail, w[c] + K16), a[c]);                   \
            }                                                                                        \
            _mm_storeu_ps(Y + m * O + o, finish4(hsum4_512(a[0], a[1], a[2], a[3]), B ? B + o : NULL, relu)); \
        }                                                                                            \
    }                                                                                                \
    for (; o < o1; o++) { /* fewer than 4 rows of w left */                                          \
        const WT *wr = W + o * K;                                                                    \
        for (int64_t m = 0; m < M; m++) {                                                            \
            const float *xr = X + m * K;                                                             \
            __m512 a = _mm512_setzero_ps();                                                          \
            for (int64_t k = 0; k < K16; k += 16)                                                    \
                a = _mm512_fmadd_ps(_mm512_loadu_ps(xr + k), LOADW(wr + k), a);                      \
            if (tail)                                                                                \
                a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xr + K16), LOADW_TAIL(tail, wr + K16), a); \
            Y[m * O + o] = finish1(_mm512_reduce_add_ps(a), B ? B + o : NULL, relu);                 \
        }                                                                                            \
    }                                                                                                \
}

#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_F32_TAIL(m, p) _mm512_maskz_loadu_ps(m, p)
#define LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32( \
                         _mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define LOAD_BF16_TAIL(m, p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32( \
                         _mm256_maskz_loadu_epi16(m, (const void *)(p))), 16))
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define LOAD_F16_TAIL(m, p) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const void *)(p)))
LINEAR_BLOCK_AVX512(linear_block_avx512, "avx512f,avx2,fma", float, LOAD_F32, LOAD_F32_TAIL)
LINEAR_BLOCK_AVX512(linear_block_avx512_bf16, "avx512f,avx512bw,avx512vl,avx2,fma", uint16_t, LOAD_BF16,
                    LOAD_BF16_TAIL)
LINEAR_BLOCK_AVX512(linear_block_avx512_f16, "avx512f,avx512bw,avx512vl,avx2,fma", uint16_t, LOAD_F16,
                    LOAD_F16_TAIL)

/* Rows of x per slab: K floats a row, about 256 KB of them (at least 4, a
 * multiple of 4) */
static int64_t x_slab_rows(int64_t K) {
    int64_t rows = (256 * 1024 / 4) / K;
    return rows < 4 ? 4 : rows & ~(int64_t)3;
}

/* The AVX-512 kernel where the GEMM runs AVX-512 (so NEEDLE_GEMM=avx2 turns
 * both to AVX2). */
static bool use_avx512(void) {
    static int has = -1;
    if (has < 0) has = strncmp(nd_cpu_gemm_kernel(), "avx512", 6) == 0;
    return has == 1;
}

/* NEEDLE_NO_SMALL_GEMM=1 turns the kernel off (BLAS for every shape), for
 * comparisons. */
static bool cpu_has_avx2_fma(void) {
    static int has = -1;
    return nd_cpu_avx2_enabled("NEEDLE_NO_SMALL_GEMM", &has);
}
#endif

#ifdef ND_HAVE_AVX2_KERNELS
/* the half-weight kernels' masked 16-bit loads */
static bool cpu_has_avx512bw_vl(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    }
    return has == 1;
}
#endif

#ifdef ND_HAVE_AVX2_KERNELS
/* whether this file's AVX-512 kernels take the half weight w for x */
static bool small_half_ok(const nd_tensor *x, const nd_tensor *w) {
    if (x->dtype != ND_FLOAT32 || (w->dtype != ND_BFLOAT16 && w->dtype != ND_FLOAT16) || w->ndim != 2)
        return false;
    if (!cpu_has_avx2_fma() || !use_avx512() || !cpu_has_avx512bw_vl()) return false;
    const int64_t K = w->shape[1];
    return K > 0 && nd_numel(x) / K <= avx512_rows_max();
}
#endif

bool nd_cpu_linear_half_weight(const nd_tensor *x, const nd_tensor *w) {
    if (x->dtype != ND_FLOAT32 || (w->dtype != ND_BFLOAT16 && w->dtype != ND_FLOAT16) || w->ndim != 2 ||
        w->shape[1] <= 0)
        return false;
    /* Where the float32 copy would run on bfloat16 products (nd.autocast, or
     * precision "medium" at this size), this must too, with the same bits:
     * a bfloat16 weight inside nd.autocast goes into the scope's cache as it
     * is (cpu_bf16_weights.c; nd_cpu_linear_fused converts a copy when the
     * cache cannot take it); anything else is left to the op's float32 copy. */
    if (nd_cpu_gemm_bf16_active()) {
        if (nd_autocast_active()) return w->dtype == ND_BFLOAT16;
        if (nd_cpu_gemm_bf16_for(nd_numel(x) / w->shape[1], w->shape[0])) return false;
    }
#ifdef ND_HAVE_AVX2_KERNELS
    return small_half_ok(x, w);
#else
    return false;
#endif
}

bool nd_cpu_small_linear(void) {
#ifdef ND_HAVE_AVX2_KERNELS
    return cpu_has_avx2_fma();
#else
    return false;
#endif
}

bool nd_cpu_linear_small(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                         const nd_tensor *b, bool relu) {
#ifdef ND_HAVE_AVX2_KERNELS
    const int64_t M = x->shape[0], K = x->shape[1], O = w->shape[0];
    if (x->dtype != ND_FLOAT32 || M < 1 || K < 1 || O < 1) return false;
    if (!cpu_has_avx2_fma()) return false;
    /* a half weight (nd_cpu_linear_half_weight said so): the AVX-512 kernel
     * converting it as it loads, at any precision */
    const nd_dtype wt = w->dtype;
    if (wt != ND_FLOAT32 && !small_half_ok(x, w)) return false;
    /* float32 matmul precision "medium": the GEMM's bfloat16 kernel, which
     * does twice the multiplies per instruction, takes the shapes it takes */
    if (wt == ND_FLOAT32 && nd_cpu_gemm_bf16_for(M, O)) return false;
    const bool avx512 = use_avx512();
    if (M > (avx512 ? avx512_rows_max() : SMALL_M_MAX) || (avx512 && wt == ND_FLOAT32 && deep_rows_to_gemm(M, K)))
        return false; /* (a half weight stays here: it reads half the bytes) */
    const float *X = (const float *)nd_ptr(x), *W = (const float *)nd_ptr(w);
    const uint16_t *Wh = (const uint16_t *)nd_ptr(w);
    const float *B = b ? (const float *)nd_ptr(b) : NULL;
    float *Y = (float *)nd_ptr(out);
    const int64_t blocks = (O + 3) / 4; /* threads take whole 4-row blocks of w */
    /* Rows of x in slabs that stay in L2 while each thread runs its blocks of
     * w over them (a multiple of 4: every element is summed as unblocked,
     * whatever the slab) */
    const int64_t slab = avx512 ? x_slab_rows(K) : M;
    const int nth = M * K * O >= 4 * ND_PARALLEL_THRESHOLD ? nd_cpu_gemm_threads() : 1;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t slabs = (M + slab - 1) / slab;
        /* each thread its share of w's blocks over every slab; with fewer
         * blocks than that shares well (a narrow layer, many rows), a share
         * of the (slab, block) pairs instead (no element depends on who
         * computes it) */
        const bool by_block = blocks >= 2 * T;
        const int64_t items = by_block ? blocks : slabs * blocks;
        const int64_t i0 = items * t / T, i1 = items * (t + 1) / T;
        for (int64_t s = 0; s < (by_block ? slabs : 1); s++)
            for (int64_t i = i0; i < i1; i++) {
                const int64_t bi = by_block ? i : i % blocks, m0 = (by_block ? s : i / blocks) * slab;
                const int64_t mb = M - m0 < slab ? M - m0 : slab;
                const int64_t o0 = bi * 4, o1 = o0 + 4 < O ? o0 + 4 : O;
                if (wt == ND_BFLOAT16) linear_block_avx512_bf16(X + m0 * K, Wh, B, Y + m0 * O, mb, K, O, o0, o1, relu);
                else if (wt == ND_FLOAT16) linear_block_avx512_f16(X + m0 * K, Wh, B, Y + m0 * O, mb, K, O, o0, o1, relu);
                else if (avx512) linear_block_avx512(X + m0 * K, W, B, Y + m0 * O, mb, K, O, o0, o1, relu);
                else linear_block_avx2(X + m0 * K, W, B, Y + m0 * O, mb, K, O, o0, o1, relu);
            }
    }
    return true;
#else
    (void)out, (void)x, (void)w, (void)b, (void)relu;
    return false;
#endif
}
