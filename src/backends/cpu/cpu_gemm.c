/* cpu_gemm.c - needle's own float32 GEMM for x86-64: C = A @ B with A
 * (M x K) and B (K x N) read through any element strides, C row-major.
 *
 * Why not only OpenBLAS: which kernels it runs depends on how it names the
 * CPU (Debian's 0.3.21 calls a Sapphire Rapids "Prescott" and runs 5x
 * slower; this machine's environment pins Haswell's AVX2 kernels on a CPU
 * with AVX-512), and it packs the whole of B on every call, which is most of
 * the cost of the small products a recurrent step makes. Here the ISA comes
 * from cpuid at run time: AVX-512F (a 12 x 32 microkernel), AVX2 + FMA
 * (6 x 16), or no kernel (the caller uses BLAS).
 *
 * The structure is the usual one (Goto, BLIS): B in blocks of KC x NC
 * packed into NR-column panels, A in blocks of MC x KC packed into MR-row
 * panels, and a register-blocked microkernel that multiplies one A panel
 * by one B panel into an MR x NR tile of C. The first K block stores into
 * C, later ones add to it. Packing reads the operands through their
 * strides, so transposed and sliced operands cost nothing extra. A product
 * with few rows (M <= 2 MR) and unit-stride rows of B reads B in place
 * instead of packing it: it is read once anyway. Work is split over OpenMP
 * threads by blocks of rows and, when there are fewer of those than
 * threads, by ranges of column panels; every output element is computed
 * by one thread in a fixed order, so results do not depend on the thread
 * count.
 *
 * Summation order differs from OpenBLAS's: results agree to float32
 * rounding (the specs compare with float64 products).
 *
 * With nd_set_float32_matmul_precision(ND_MATMUL_MEDIUM) (PyTorch's
 * "medium") and a CPU with AVX512_BF16, the same structure runs on
 * bfloat16: packing rounds A and B to bfloat16 (to nearest even), pairs of
 * k interleaved in 32-bit words, and the microkernel's vdpbf16ps adds two
 * products per lane into float32 accumulators - twice the multiplies per
 * instruction of the float32 kernel. Inputs and outputs stay float32; a
 * product is exact for bfloat16 inputs and summed in float32, so results
 * are those of the inputs rounded to 8 significant bits. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "cpu_amx.h"
#include "cpu_caches.h"
#include "cpu_scratch.h"
#include "cpu_kernels.h"
#include "cpu_gemm.h"
#include "cpu_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ND_HAVE_GEMM_KERNELS 1
#endif

#define KC 384
#define MAX_MR 32
#define MAX_NR 32

typedef void (*ukernel_fn)(int64_t kc, const float *a, const float *b, int64_t ldb, float *c,
                           int64_t ldc, bool add);
/* The same with A read in place: MR rows of unit stride, lda apart */
typedef void (*ukernel_a_fn)(int64_t kc, const float *a, int64_t lda, const float *b, int64_t ldb,
                             float *c, int64_t ldc, bool add);

typedef struct {
    const char *name;
    int mr, nr, mc, nc;
    ukernel_fn ukr;
    bool bf16; /* panels of bfloat16 pairs (k, k + 1) in 32-bit words, not floats */
    int kc;    /* K block depth (0: KC) */
    bool amx;  /* A packed for AMX tiles: each row's pairs in order (p[r * depth + kk]), not k-major */
    ukernel_a_fn ukr_a; /* ukr reading row-major A in place (NULL: A is always packed) */
    bool a_in_place_streamed; /* ukr_a only when B streams past A (below), else A is packed */
} gemm_isa;

/* The bfloat16 kernel's K blocks: 1024 deep. Its B panel then lives in L2,
 * not L1, but C is read and written, and A packed, a third as often: 12%
 * faster here (BERT's and 2048 products, 2 Zen 4 threads: 331-340 GFLOP/s
 * at 384, 368-381 at 1024, no better deeper). */
#define KC_BF16 1024

static inline int64_t block_depth(const gemm_isa *isa) { return isa->kc ? isa->kc : KC; }

/* The float words a packed panel of kc k's takes per row or column: kc
 * floats, or for bfloat16 pairs ceil(kc / 2) words (a float's size each). */
static int64_t panel_depth(const gemm_isa *isa, int64_t kc) { return isa->bf16 ? (kc + 1) / 2 : kc; }



#ifdef ND_HAVE_GEMM_KERNELS
/* The 12 x 32 kernels' accumulators into C (row stride ldc): stored, or
 * with add added to what C holds (the float32 and bfloat16 kernels alike;
 * inlined into both) */
__attribute__((target("avx512f"), always_inline)) static inline void tile_12x32_out(__m512 acc[12][2], float *c,
                                                                                   int64_t ldc, bool add) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        float *ci = c + i * ldc;
        if (add) {
            acc[i][0] = _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][0]);
            acc[i][1] = _mm512_add_ps(_mm512_loadu_ps(ci + 16), acc[i][1]);
        }
        _mm512_storeu_ps(ci, acc[i][0]);
        _mm512_storeu_ps(ci + 16, acc[i][1]);
    }
}

/* c[12 x 32] (row stride ldc) = or += a @ b (32 per k, row stride ldb: 32
 * when packed, the row stride of B when read in place), with a packed (12
 * per k: ukr_avx512_12x32) or row-major and read in place (rows lda apart:
 * ukr_avx512_12x32_a). In place, the twelve rows are four base pointers
 * and 0, 1 or 2 row strides from them, so that every broadcast is one
 * load with a register index and no row pointer is reloaded. Both make
 * each element the same chain of FMAs: the same bits. Two k's per loop
 * trip: the loop's own instructions are a tenth of the FMAs' issue slots
 * at one k (measured alone, B from L2: 172 -> 181 GFLOP/s a core). */
#define WIDE_12x32_BODY(A_AT)                                                                            \
    __m512 acc[12][2];                                                                                   \
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) {                                              \
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();                                                     \
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T1);                                          \
        _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T1);                                     \
    }                                                                                                    \
    _Pragma("GCC unroll 2") for (int64_t k = 0; k < kc; k++) {                                          \
        const __m512 b0 = _mm512_loadu_ps(b + k * ldb), b1 = _mm512_loadu_ps(b + k * ldb + 16);          \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) {                                          \
            const __m512 ai = _mm512_set1_ps(A_AT(i, k));                                                \
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);                                              \
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);                                              \
        }                                                                                                \
    }                                                                                                    \
    tile_12x32_out(acc, c, ldc, add);
#define A_PACKED_12(i, k) a[(k) * 12 + (i)]
#define A_ROWS_12(i, k) base[(i) / 3][((i) % 3) * lda + (k)]
__attribute__((target("avx512f"))) static void ukr_avx512_12x32(int64_t kc, const float *a,
                                                                 const float *b, int64_t ldb,
                                                                 float *c, int64_t ldc, bool add) {
    WIDE_12x32_BODY(A_PACKED_12)
}
__attribute__((target("avx512f"))) static void ukr_avx512_12x32_a(int64_t kc, const float *a, int64_t lda,
                                                                   const float *b, int64_t ldb, float *c,
                                                                   int64_t ldc, bool add) {
    const float *const base[4] = {a, a + 3 * lda, a + 6 * lda, a + 9 * lda};
    WIDE_12x32_BODY(A_ROWS_12)
}
#undef A_PACKED_12
#undef A_ROWS_12
#undef WIDE_12x32_BODY

__attribute__((target("avx2,fma"))) static void ukr_avx2_6x16(int64_t kc, const float *a,
                                                              const float *b, int64_t ldb,
                                                              float *c, int64_t ldc, bool add) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T1); /* (as the AVX-512 kernel's) */
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(b + k * ldb), b1 = _mm256_loadu_ps(b + k * ldb + 8);
        const float *ak = a + k * 6;
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            const __m256 ai = _mm256_broadcast_ss(ak + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        float *ci = c + i * ldc;
        if (add) {
            acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]);
            acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]);
        }
        _mm256_storeu_ps(ci, acc[i][0]);
        _mm256_storeu_ps(ci + 8, acc[i][1]);
    }
}

/* Kernels for products with few columns (N <= 16, or <= 8): one vector of
 * B per k and MR rows, where the wide kernels compute 32 (16) columns for
 * the few wanted - a 10-class head over 4096 rows ran at the cost of 32
 * columns. c[MR x VL] = or += a @ b (VL per k, row stride ldb), with a
 * packed (MR per k: NAME) or row-major and read in place (rows lda apart:
 * NAME_a). Packing A, a transpose of scalar loads and stores, took 60% of
 * such a product's time (perf, 4096 x 512 x 10); for a wide product it is
 * spread over 32 columns, here over at most 16. Reading A in place costs
 * a row pointer's load per broadcast, which the few columns leave room
 * for. Each element is the same chain of fused multiply-adds over the same
 * K blocks as in the wide kernels, so the bits do not depend on which
 * kernel ran. MR = 24: 24 accumulators and B's vector in the 32 vector
 * registers (12 of 16 with AVX2), the broadcasts folded into the FMAs. */
#define NARROW_BODY(MR, VEC, SETZERO, LOADU, SET1, FMADD, ADD, STOREU, A_AT)                            \
    VEC acc[MR];                                                                                        \
    _Pragma("GCC unroll 24") for (int i = 0; i < MR; i++) acc[i] = SETZERO();                           \
    for (int64_t k = 0; k < kc; k++) {                                                                  \
        const VEC b0 = LOADU(b + k * ldb);                                                              \
        _Pragma("GCC unroll 24") for (int i = 0; i < MR; i++) acc[i] = FMADD(SET1(A_AT(i, k)), b0, acc[i]); \
    }                                                                                                   \
    _Pragma("GCC unroll 24") for (int i = 0; i < MR; i++) {                                             \
        float *ci = c + i * ldc;                                                                        \
        if (add) acc[i] = ADD(LOADU(ci), acc[i]);                                                       \
        STOREU(ci, acc[i]);                                                                             \
    }
#define NARROW_UKR(NAME, TARGET, MR, VEC, SETZERO, LOADU, SET1, FMADD, ADD, STOREU)                      \
    __attribute__((target(TARGET))) static void NAME(int64_t kc, const float *a, const float *b,        \
                                                     int64_t ldb, float *c, int64_t ldc, bool add) {    \
        NARROW_BODY(MR, VEC, SETZERO, LOADU, SET1, FMADD, ADD, STOREU, A_PACKED)                        \
    }                                                                                                   \
    __attribute__((target(TARGET))) static void NAME##_a(int64_t kc, const float *a, int64_t lda,       \
                                                         const float *b, int64_t ldb, float *c,         \
                                                         int64_t ldc, bool add) {                       \
        const float *ar[MR];                                                                            \
        for (int i = 0; i < MR; i++) ar[i] = a + i * lda;                                               \
        NARROW_BODY(MR, VEC, SETZERO, LOADU, SET1, FMADD, ADD, STOREU, A_ROWS)                          \
    }
#define A_PACKED(i, k) a[(k) * MR_ + (i)]
#define A_ROWS(i, k) ar[i][k]
#define MR_ 24
NARROW_UKR(ukr_avx512_24x16, "avx512f", 24, __m512, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps,
           _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps)
/* 8 columns in 256-bit vectors: AVX-512VL gives them the 32 registers */
NARROW_UKR(ukr_avx512_24x8, "avx512f,avx512vl,fma", 24, __m256, _mm256_setzero_ps, _mm256_loadu_ps,
           _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps)
#undef MR_
#define MR_ 12
NARROW_UKR(ukr_avx2_12x8, "avx2,fma", 12, __m256, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps,
           _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps)
#undef MR_
#undef A_PACKED
#undef A_ROWS
#undef NARROW_BODY
#undef NARROW_UKR

/* c[12 x 32] = or += a @ b on bfloat16 pairs: a packed 12 words per k pair
 * (row r's k and k + 1), b 32 words per k pair (column c's), ldb in words;
 * kc counts k's (an odd kc's last pair holds a zero). */
__attribute__((target("avx512f,avx512bf16"))) static void ukr_bf16_12x32(int64_t kc, const float *a_,
                                                                          const float *b_, int64_t ldb,
                                                                          float *c, int64_t ldc, bool add) {
    const int32_t *a = (const int32_t *)(const void *)a_, *b = (const int32_t *)(const void *)b_;
    const int64_t kp = (kc + 1) / 2;
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k++) {
        const __m512i b0 = _mm512_loadu_si512(b + k * ldb), b1 = _mm512_loadu_si512(b + k * ldb + 16);
        const int32_t *ak = a + k * 12;
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            const __m512i ai = _mm512_set1_epi32(ak[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)ai, (__m512bh)b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)ai, (__m512bh)b1);
        }
    }
    tile_12x32_out(acc, c, ldc, add);
}

/* AMX's tile configuration for ukr_amx_32x32: palette 1, all 8 tiles 16
 * rows of 64 bytes (C: tiles 0-3, A: 4-5, B: 6-7) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;
static const amx_tilecfg amx_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* c[32 x 32] = or += a @ b on bfloat16 pairs with AMX tiles: four 16 x 16
 * float32 tiles of C, each tdpbf16ps multiplying a 16-row x 16-pair tile
 * of A (a: 32 rows of ceil(kc / 2) pair words each, row after row) by a
 * 16-pair x 16-column tile of B (b: the bfloat16 kernel's panel, ldb words
 * a pair row, so its two tiles are the panel's halves). Pairs past the
 * last whole 16 go through zero-padded copies. As the other kernels, the
 * block's sum is made from zero and then stored, or added to C. */
__attribute__((target("amx-tile,amx-bf16"))) static void ukr_amx_32x32(int64_t kc, const float *a_, const float *b_,
                                                                        int64_t ldb, float *c, int64_t ldc,
                                                                        bool add) {
    const uint32_t *a = (const uint32_t *)(const void *)a_, *b = (const uint32_t *)(const void *)b_;
    const int64_t kp = (kc + 1) / 2, full = kp / 16 * 16;
    const size_t lda = (size_t)kp * 4, ldb_bytes = (size_t)ldb * 4;
    _tile_loadconfig(&amx_cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p = 0; p < full; p += 16) {
        _tile_loadd(4, a + p, lda);
        _tile_loadd(5, a + 16 * kp + p, lda);
        _tile_loadd(6, b + p * ldb, ldb_bytes);
        _tile_loadd(7, b + p * ldb + 16, ldb_bytes);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (full < kp) {
        _Alignas(64) uint32_t at[32 * 16], bt[16 * 32];
        const int64_t rem = kp - full;
        for (int r = 0; r < 32; r++)
            for (int q = 0; q < 16; q++) at[r * 16 + q] = q < rem ? a[r * kp + full + q] : 0u;
        for (int q = 0; q < 16; q++)
            for (int j = 0; j < 32; j++) bt[q * 32 + j] = q < rem ? b[(full + q) * ldb + j] : 0u;
        _tile_loadd(4, at, 64);
        _tile_loadd(5, at + 16 * 16, 64);
        _tile_loadd(6, bt, 128);
        _tile_loadd(7, bt + 16, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (!add) {
        const size_t ldc_bytes = (size_t)ldc * 4;
        _tile_stored(0, c, ldc_bytes);
        _tile_stored(1, c + 16, ldc_bytes);
        _tile_stored(2, c + 16 * ldc, ldc_bytes);
        _tile_stored(3, c + 16 * ldc + 16, ldc_bytes);
    } else {
        _Alignas(64) float t[32 * 32];
        _tile_stored(0, t, 128);
        _tile_stored(1, t + 16, 128);
        _tile_stored(2, t + 16 * 32, 128);
        _tile_stored(3, t + 16 * 32 + 16, 128);
        for (int i = 0; i < 32; i++)
#pragma omp simd
            for (int j = 0; j < 32; j++) c[i * ldc + j] = c[i * ldc + j] + t[i * 32 + j];
    }
    _tile_release(); /* (a process holding tile state makes every context switch save 8 KiB more) */
}
#endif

static const gemm_isa isa_bf16 = {"avx512_bf16 12x32", 12, 32, 192, 2048,
#ifdef ND_HAVE_GEMM_KERNELS
                                  ukr_bf16_12x32,
#else
                                  NULL,
#endif
                                  true, KC_BF16};

/* The same products on AMX tiles where the CPU has them (Sapphire Rapids
 * and later): the bfloat16 kernel's B panels, blocks and prepacked weights
 * as they are, A packed for the tiles. */
static const gemm_isa isa_amx = {"amx_bf16 32x32", 32, 32, 192, 2048,
#ifdef ND_HAVE_GEMM_KERNELS
                                 ukr_amx_32x32,
#else
                                 NULL,
#endif
                                 true, KC_BF16, true};

static const gemm_isa isa_avx512 = {"avx512f 12x32", 12, 32, 192, 2048,
#ifdef ND_HAVE_GEMM_KERNELS
                                    ukr_avx512_12x32, .ukr_a = ukr_avx512_12x32_a, .a_in_place_streamed = true
#else
                                    NULL
#endif
};
static const gemm_isa isa_avx2 = {"avx2+fma 6x16", 6, 16, 96, 2048,
#ifdef ND_HAVE_GEMM_KERNELS
                                  ukr_avx2_6x16
#else
                                  NULL
#endif
};

/* The narrow kernels (above), with the wide ones' blocks */
#ifdef ND_HAVE_GEMM_KERNELS
#define NARROW_ISA(name, mr, nr, fn) {name, mr, nr, 192, 2048, fn, .ukr_a = fn##_a}
#else
#define NARROW_ISA(name, mr, nr, fn) {name, mr, nr, 192, 2048, NULL}
#endif
static const gemm_isa isa_avx512_n16 = NARROW_ISA("avx512f 24x16", 24, 16, ukr_avx512_24x16);
static const gemm_isa isa_avx512_n8 = NARROW_ISA("avx512f 24x8", 24, 8, ukr_avx512_24x8);
static const gemm_isa isa_avx2_n8 = NARROW_ISA("avx2+fma 12x8", 12, 8, ukr_avx2_12x8);
#undef NARROW_ISA

/* The float32 kernel for this CPU, or NULL: NEEDLE_GEMM=openblas (BLAS
 * only), avx2 (the AVX2 kernel on an AVX-512 CPU), anything else or unset:
 * the best the CPU has. Read once. */
static const gemm_isa *pick_f32_isa(void) {
    static int state = -1; /* -1 unread; else index into the table below */
    static const gemm_isa *const table[3] = {NULL, &isa_avx2, &isa_avx512};
    if (state < 0) {
        int s = 0;
#ifdef ND_HAVE_GEMM_KERNELS
        const char *env = getenv("NEEDLE_GEMM");
        __builtin_cpu_init();
        bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        bool avx512 = __builtin_cpu_supports("avx512f");
        if (env && strcmp(env, "openblas") == 0) s = 0;
        else if (avx512 && !(env && strcmp(env, "avx2") == 0)) s = 2;
        else if (avx2) s = 1;
#endif
        state = s;
    }
    return table[state];
}

/* AVX512_BF16 (vdpbf16ps) on this CPU, under the AVX-512 kernel. Read once. */
static bool have_bf16(void) {
    static int has = -1;
    if (has < 0) {
#ifdef ND_HAVE_GEMM_KERNELS
        __builtin_cpu_init();
        has = pick_f32_isa() == &isa_avx512 && __builtin_cpu_supports("avx512bf16");
#else
        has = 0;
#endif
    }
    return has == 1;
}

bool nd_cpu_gemm_bf16_available(void) { return have_bf16(); }

bool nd_cpu_gemm_amx_available(void) { return have_bf16() && nd_cpu_amx_bf16(); }

/* The bfloat16 kernel: AMX tiles where this process may use them, else
 * AVX512_BF16's vdpbf16ps (have_bf16() true). */
static const gemm_isa *bf16_isa(void) { return nd_cpu_gemm_amx_available() ? &isa_amx : &isa_bf16; }

/* The kernel products run on now: bfloat16 under the "medium" precision
 * where the CPU has it, else the float32 kernel (or NULL: BLAS). */
static const gemm_isa *pick_isa(void) {
    if (nd_get_float32_matmul_precision() == ND_MATMUL_MEDIUM && have_bf16()) return bf16_isa();
    return pick_f32_isa();
}

static bool is_bf16(const gemm_isa *isa) { return isa && isa->bf16; }

bool nd_cpu_gemm_bf16_active(void) { return is_bf16(pick_isa()); }

/* The bfloat16 kernel takes a product only when both M and N are at least
 * this: it packs B on every call (the float32 kernel reads few rows' B in
 * place, the small-batch linear kernel streams the weight), and below it
 * the packing costs more than the halved multiplies save (a 1 x 768 by 768
 * x 3072 linear: 0.57 ms streamed in float32, 6 ms packed to bfloat16). The
 * test is symmetric, so C and C^T (nd.compile's accumulating weight
 * gradient computes the transpose) take the same kernel. */
#define BF16_MIN_DIM 64

/* The float32 kernel isa, or its narrow form for a product of N columns
 * (same bits: each element's chain of FMAs is the same) */
static const gemm_isa *narrow_for(const gemm_isa *isa, int64_t N) {
#ifdef ND_HAVE_GEMM_KERNELS
    static int vl = -1; /* AVX-512VL, read once (racing readers store the same value) */
    if (vl < 0) vl = __builtin_cpu_supports("avx512vl") ? 1 : 0;
    if (isa == &isa_avx512) return N <= 8 && vl ? &isa_avx512_n8 : N <= 16 ? &isa_avx512_n16 : isa;
    if (isa == &isa_avx2 && N <= 8) return &isa_avx2_n8;
#else
    (void)N;
#endif
    return isa;
}

static const gemm_isa *isa_for(int64_t M, int64_t N) {
    const gemm_isa *isa = pick_isa();
    if (is_bf16(isa) && (M < BF16_MIN_DIM || N < BF16_MIN_DIM)) isa = pick_f32_isa();
    return narrow_for(isa, N);
}

bool nd_cpu_gemm_bf16_for(int64_t M, int64_t N) { return is_bf16(isa_for(M, N)); }

const char *nd_cpu_gemm_kernel(void) {
    const gemm_isa *isa = pick_isa();
    return isa ? isa->name : "openblas";
}

/* n unit-stride lines (sr[r]: line r at the block's first k) into
 * p[k * ld + r] for r < n, k < kc: a transpose - a panel of A's rows (ld =
 * MR), or of B's columns when B is contiguous along K (ld = NR: x @ w^T,
 * a convolution's weight gradient). Scalar, it was a load and a store an
 * element, and took 23-60% of a 4096 x 512 product's time at 128-10
 * columns (A, perf), 12% of a 512 x 768 by 3072 linear's (B); with SSE,
 * groups of 4 lines go 4 k's at a time through 4 x 4 transposes in
 * registers. A copy: no bits change. */
static void pack_lines(const float *const *sr, int n, int64_t ld, int64_t kc, float *p) {
    int r0 = 0;
#ifdef ND_HAVE_GEMM_KERNELS
    for (; r0 + 4 <= n; r0 += 4) {
        const float *s0 = sr[r0], *s1 = sr[r0 + 1], *s2 = sr[r0 + 2], *s3 = sr[r0 + 3];
        int64_t k = 0;
        for (; k + 4 <= kc; k += 4) {
            __m128 a0 = _mm_loadu_ps(s0 + k), a1 = _mm_loadu_ps(s1 + k);
            __m128 a2 = _mm_loadu_ps(s2 + k), a3 = _mm_loadu_ps(s3 + k);
            _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
            float *d = p + k * ld + r0;
            _mm_storeu_ps(d, a0);
            _mm_storeu_ps(d + ld, a1);
            _mm_storeu_ps(d + 2 * ld, a2);
            _mm_storeu_ps(d + 3 * ld, a3);
        }
        for (; k < kc; k++) {
            float *d = p + k * ld + r0;
            d[0] = s0[k];
            d[1] = s1[k];
            d[2] = s2[k];
            d[3] = s3[k];
        }
    }
#endif
    for (; r0 < n; r0++)
        for (int64_t k = 0; k < kc; k++) p[k * ld + r0] = sr[r0][k];
}

/* A's rows [i0, i0 + mc) x cols [k0, k0 + kc) into MR-row panels, k-major
 * within a panel (p[k * MR + r]); rows past M are zeros. The loops run
 * along A's unit stride: a row at a time for row-major A, a k at a time
 * for column-major A (a transposed operand). */
static void pack_a(const gemm_isa *isa, const float *A, int64_t a_sm, int64_t a_sk, int64_t M,
                   int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *p) {
    const int MR = isa->mr;
    if (a_sm == 1 && a_sk != 1) {
        /* column-major A: a k at a time along all mc rows, so that memory is
         * read in order (panel by panel, each k would start a new line a_sk
         * floats away) */
        for (int64_t k = 0; k < kc; k++) {
            const float *sk = A + i0 + (k0 + k) * a_sk;
            for (int64_t ip = 0; ip < mc; ip += MR) {
                int64_t rows = mc - ip < MR ? mc - ip : MR;
                if (i0 + ip + rows > M) rows = M - (i0 + ip);
                float *dk = p + ip * kc + k * MR;
                int64_t r = 0;
                for (; r < rows; r++) dk[r] = sk[ip + r];
                for (; r < MR; r++) dk[r] = 0.0f;
            }
        }
        return;
    }
    for (int64_t ip = 0; ip < mc; ip += MR, p += MR * kc) {
        int64_t rows = mc - ip < MR ? mc - ip : MR;
        if (i0 + ip + rows > M) rows = M - (i0 + ip);
        const float *src = A + (i0 + ip) * a_sm + k0 * a_sk;
        if (rows == MR && a_sk == 1) { /* row-major, a whole panel: the panel written in order */
            const float *sr[MAX_MR];
            for (int r = 0; r < MR; r++) sr[r] = src + r * a_sm;
            pack_lines(sr, MR, MR, kc, p);
            continue;
        }
        for (int r = 0; r < MR; r++) {
            if (r >= rows) {
                for (int64_t k = 0; k < kc; k++) p[k * MR + r] = 0.0f;
                continue;
            }
            const float *sr = src + r * a_sm;
            for (int64_t k = 0; k < kc; k++) p[k * MR + r] = sr[k * a_sk];
        }
    }
}

/* B's rows [k0, k0 + kc) x cols [j0 + jp0, j0 + jp1) into NR-column
 * panels (panel q at p + q * NR * kc, p[k * NR + c]); columns past N are
 * zeros. Row-major B is copied a row at a time; B contiguous along K (a
 * transposed weight, x @ w:t()) a column at a time, reading memory in
 * order and writing the panel, which stays in L1. */
static void pack_b(const gemm_isa *isa, const float *B, int64_t b_sk, int64_t b_sn, int64_t N,
                   int64_t k0, int64_t kc, int64_t j0, int64_t jp0, int64_t jp1, float *p) {
    const int NR = isa->nr;
    for (int64_t jp = jp0; jp < jp1; jp += NR) {
        float *q = p + jp * kc;
        int64_t j = j0 + jp, w = N - j < NR ? N - j : NR;
        const float *src = B + k0 * b_sk + j * b_sn;
        if (b_sk == 1 && b_sn != 1) {
            const float *sc[MAX_NR];
            for (int64_t c = 0; c < w; c++) sc[c] = src + c * b_sn;
            pack_lines(sc, (int)w, NR, kc, q);
            for (int64_t c = w; c < NR; c++)
                for (int64_t k = 0; k < kc; k++) q[k * NR + c] = 0.0f;
            continue;
        }
        for (int64_t k = 0; k < kc; k++) {
            const float *sk = src + k * b_sk;
            float *dst = q + k * NR;
            if (b_sn == 1) {
                memcpy(dst, sk, (size_t)w * sizeof(float));
            } else {
                for (int64_t c = 0; c < w; c++) dst[c] = sk[c * b_sn];
            }
            for (int64_t c = w; c < NR; c++) dst[c] = 0.0f;
        }
    }
}

/* float -> bfloat16 bits, to nearest even, NaN kept quiet (nd_float_to_bf16's
 * rule, without branches so that the packing loops vectorise) */
static inline uint32_t bf16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, nan = (x >> 16) | 0x40u;
    return (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

static inline uint32_t bf16_pair(float lo, float hi) { return bf16_bits(lo) | bf16_bits(hi) << 16; }

/* (The bfloat16 packers run only under the AVX512_BF16 kernel: compiled for
 * AVX-512 so that their loops vectorise.) */
#ifdef ND_HAVE_GEMM_KERNELS
#define BF16_PACK_TARGET __attribute__((target("avx512f,avx512bw")))
#else
#define BF16_PACK_TARGET
#endif

/* The pairs kk < even of one panel of a row-major A (rows <= MR rows from
 * src, a_sm apart): each row's floats are rounded into a small block in
 * order (contiguous reads and writes: the loop vectorises, and two
 * consecutive bfloat16 are the pair word little-endian), then the block is
 * written out a pair at a time across the rows, as the kernel reads it.
 * Writing p[kk * MR + r] straight from the rows instead scatters every
 * word 48 bytes apart: that was 7-10% of a bfloat16 product. */
#define PACK_A_PAIRS 64
BF16_PACK_TARGET static void pack_a_bf16_rows(int MR, const float *src, int64_t a_sm, int64_t rows,
                                              int64_t even, uint32_t *p) {
    uint16_t block[MAX_MR][2 * PACK_A_PAIRS];
    for (int64_t k0 = 0; k0 < even; k0 += PACK_A_PAIRS) {
        const int64_t nb = even - k0 < PACK_A_PAIRS ? even - k0 : PACK_A_PAIRS;
        for (int64_t r = 0; r < rows; r++) {
            const float *sr = src + r * a_sm + 2 * k0;
            uint16_t *b = block[r];
#pragma omp simd
            for (int64_t i = 0; i < 2 * nb; i++) b[i] = (uint16_t)bf16_bits(sr[i]);
        }
        for (int64_t kk = 0; kk < nb; kk++) {
            uint32_t *d = p + (k0 + kk) * MR;
            for (int64_t r = 0; r < rows; r++) d[r] = (uint32_t)block[r][2 * kk] | (uint32_t)block[r][2 * kk + 1] << 16;
            for (int64_t r = rows; r < MR; r++) d[r] = 0u;
        }
    }
}

/* pack_a's panels in bfloat16 pairs: word (kk, r) = A[r, 2kk] | A[r, 2kk + 1] << 16
 * at p[kk * MR + r]; k's past kc and rows past M are zeros */
BF16_PACK_TARGET static void pack_a_bf16(const gemm_isa *isa, const float *A, int64_t a_sm, int64_t a_sk,
                                         int64_t M, int64_t i0, int64_t mc, int64_t k0, int64_t kc,
                                         uint32_t *p) {
    const int MR = isa->mr;
    const int64_t kp = (kc + 1) / 2, even = kc / 2;
    if (a_sm == 1 && a_sk != 1) {
        /* column-major A (a gradient read transposed, g:t() @ x): a pair of
         * k's at a time, along all mc rows, so that memory is read in order
         * (panel by panel, each k would start a new line a_sk floats away) */
        for (int64_t kk = 0; kk < kp; kk++) {
            const float *s0 = A + i0 + (k0 + 2 * kk) * a_sk, *s1 = s0 + a_sk;
            for (int64_t ip = 0; ip < mc; ip += MR) {
                int64_t rows = mc - ip < MR ? mc - ip : MR;
                if (i0 + ip + rows > M) rows = M - (i0 + ip);
                uint32_t *dk = p + ip * kp + kk * MR;
                int64_t r = 0;
                if (kk < even) {
#pragma omp simd
                    for (r = 0; r < rows; r++) dk[r] = bf16_pair(s0[ip + r], s1[ip + r]);
                } else {
                    for (r = 0; r < rows; r++) dk[r] = bf16_bits(s0[ip + r]);
                }
                for (r = rows; r < MR; r++) dk[r] = 0u;
            }
        }
        return;
    }
    for (int64_t ip = 0; ip < mc; ip += MR, p += MR * kp) {
        int64_t rows = mc - ip < MR ? mc - ip : MR;
        if (i0 + ip + rows > M) rows = M - (i0 + ip);
        const float *src = A + (i0 + ip) * a_sm + k0 * a_sk;
        if (a_sk == 1) { /* row-major A */
            pack_a_bf16_rows(MR, src, a_sm, rows, even, p);
            if (kp > even) {
                for (int r = 0; r < MR; r++) p[even * MR + r] = r < rows ? bf16_bits(src[r * a_sm + 2 * even]) : 0u;
            }
            continue;
        }
        for (int r = 0; r < MR; r++) {
            if (r >= rows) {
                for (int64_t kk = 0; kk < kp; kk++) p[kk * MR + r] = 0u;
                continue;
            }
            const float *sr = src + r * a_sm;
            for (int64_t kk = 0; kk < even; kk++)
                p[kk * MR + r] = bf16_pair(sr[2 * kk * a_sk], sr[(2 * kk + 1) * a_sk]);
            if (kp > even) p[even * MR + r] = bf16_bits(sr[2 * even * a_sk]);
        }
    }
}

/* pack_b's panels in bfloat16 pairs: word (kk, c) = B[2kk, c] | B[2kk + 1, c] << 16
 * at q[kk * NR + c] (panel q at p + q * NR * ceil(kc / 2)) */
BF16_PACK_TARGET static void pack_b_bf16(const gemm_isa *isa, const float *B, int64_t b_sk, int64_t b_sn,
                                         int64_t N, int64_t k0, int64_t kc, int64_t j0, int64_t jp0,
                                         int64_t jp1, uint32_t *p) {
    const int NR = isa->nr;
    const int64_t kp = (kc + 1) / 2, even = kc / 2;
    for (int64_t jp = jp0; jp < jp1; jp += NR) {
        uint32_t *q = p + jp * kp;
        int64_t j = j0 + jp, w = N - j < NR ? N - j : NR;
        const float *src = B + k0 * b_sk + j * b_sn;
        if (b_sk == 1 && b_sn != 1) { /* columns contiguous along K (a weight read transposed) */
            for (int64_t c = 0; c < w; c++) {
                const float *sc = src + c * b_sn;
#pragma omp simd
                for (int64_t kk = 0; kk < even; kk++) q[kk * NR + c] = bf16_pair(sc[2 * kk], sc[2 * kk + 1]);
                if (kp > even) q[even * NR + c] = bf16_bits(sc[2 * even]);
            }
            for (int64_t c = w; c < NR; c++)
                for (int64_t kk = 0; kk < kp; kk++) q[kk * NR + c] = 0u;
            continue;
        }
        for (int64_t kk = 0; kk < kp; kk++) {
            const float *s0 = src + 2 * kk * b_sk, *s1 = s0 + b_sk;
            uint32_t *dst = q + kk * NR;
            if (kk < even && b_sn == 1) {
#pragma omp simd
                for (int64_t c = 0; c < w; c++) dst[c] = bf16_pair(s0[c], s1[c]);
            } else if (kk < even) {
                for (int64_t c = 0; c < w; c++) dst[c] = bf16_pair(s0[c * b_sn], s1[c * b_sn]);
            } else {
                for (int64_t c = 0; c < w; c++) dst[c] = bf16_bits(s0[c * b_sn]);
            }
            for (int64_t c = w; c < NR; c++) dst[c] = 0u;
        }
    }
}

/* pack_a's panels for AMX tiles: word (r, kk) = A[r, 2kk] | A[r, 2kk + 1] << 16
 * at p[r * ceil(kc / 2) + kk], a panel's rows one after another (a tile
 * row is 16 consecutive pairs of one row); k's past kc and rows past M are
 * zeros. Loops along A's unit stride, as pack_a_bf16's. */
BF16_PACK_TARGET static void pack_a_amx(const gemm_isa *isa, const float *A, int64_t a_sm, int64_t a_sk,
                                        int64_t M, int64_t i0, int64_t mc, int64_t k0, int64_t kc, uint32_t *p) {
    const int MR = isa->mr;
    const int64_t kp = (kc + 1) / 2, even = kc / 2;
    for (int64_t ip = 0; ip < mc; ip += MR, p += MR * kp) {
        int64_t rows = mc - ip < MR ? mc - ip : MR;
        if (i0 + ip + rows > M) rows = M - (i0 + ip);
        const float *src = A + (i0 + ip) * a_sm + k0 * a_sk;
        if (a_sm == 1 && a_sk != 1) { /* column-major A: a pair of k's at a time along the rows */
            for (int64_t kk = 0; kk < kp; kk++) {
                const float *s0 = src + 2 * kk * a_sk, *s1 = s0 + a_sk;
                for (int64_t r = 0; r < rows; r++) p[r * kp + kk] = kk < even ? bf16_pair(s0[r], s1[r]) : bf16_bits(s0[r]);
            }
        } else {
            for (int64_t r = 0; r < rows; r++) {
                const float *sr = src + r * a_sm;
                uint32_t *d = p + r * kp;
                if (a_sk == 1) {
#pragma omp simd
                    for (int64_t kk = 0; kk < even; kk++) d[kk] = bf16_pair(sr[2 * kk], sr[2 * kk + 1]);
                } else {
                    for (int64_t kk = 0; kk < even; kk++) d[kk] = bf16_pair(sr[2 * kk * a_sk], sr[(2 * kk + 1) * a_sk]);
                }
                if (kp > even) d[even] = bf16_bits(sr[2 * even * a_sk]);
            }
        }
        memset(p + rows * kp, 0, sizeof(uint32_t) * (size_t)((MR - rows) * kp));
    }
}

/* A's and B's packing in the kernel's format (words of float size) */
static void pack_a_any(const gemm_isa *isa, const float *A, int64_t a_sm, int64_t a_sk, int64_t M,
                       int64_t i0, int64_t mc, int64_t k0, int64_t kc, float *p) {
    if (isa->amx) pack_a_amx(isa, A, a_sm, a_sk, M, i0, mc, k0, kc, (uint32_t *)(void *)p);
    else if (isa->bf16) pack_a_bf16(isa, A, a_sm, a_sk, M, i0, mc, k0, kc, (uint32_t *)(void *)p);
    else pack_a(isa, A, a_sm, a_sk, M, i0, mc, k0, kc, p);
}

static void pack_b_any(const gemm_isa *isa, const float *B, int64_t b_sk, int64_t b_sn, int64_t N,
                       int64_t k0, int64_t kc, int64_t j0, int64_t jp0, int64_t jp1, float *p) {
    if (isa->bf16) pack_b_bf16(isa, B, b_sk, b_sn, N, k0, kc, j0, jp0, jp1, (uint32_t *)(void *)p);
    else pack_b(isa, B, b_sk, b_sn, N, k0, kc, j0, jp0, jp1, p);
}

/* The tile at C[i, j] (rows mr <= MR, cols nr <= NR): straight into C when
 * whole, else through a scratch tile. */
static void run_tile(const gemm_isa *isa, int64_t kc, const float *ap, const float *bp, int64_t ldb,
                     float *C, int64_t ldc, int64_t mr, int64_t nr, bool add) {
    if (mr == isa->mr && nr == isa->nr) {
        isa->ukr(kc, ap, bp, ldb, C, ldc, add);
        return;
    }
    float t[MAX_MR * MAX_NR];
    isa->ukr(kc, ap, bp, ldb, t, isa->nr, false);
    for (int64_t r = 0; r < mr; r++)
        for (int64_t c = 0; c < nr; c++) C[r * ldc + c] = add ? C[r * ldc + c] + t[r * isa->nr + c] : t[r * isa->nr + c];
}

/* run_tile with A's MR rows read in place (isa->ukr_a; mr == MR) */
static void run_tile_a(const gemm_isa *isa, int64_t kc, const float *a, int64_t lda, const float *bp,
                       int64_t ldb, float *C, int64_t ldc, int64_t nr, bool add) {
    if (nr == isa->nr) {
        isa->ukr_a(kc, a, lda, bp, ldb, C, ldc, add);
        return;
    }
    float t[MAX_MR * MAX_NR];
    isa->ukr_a(kc, a, lda, bp, ldb, t, isa->nr, false);
    for (int64_t r = 0; r < isa->mr; r++)
        for (int64_t c = 0; c < nr; c++) C[r * ldc + c] = add ? C[r * ldc + c] + t[r * isa->nr + c] : t[r * isa->nr + c];
}

/* With at most this many rows of A, a row-major B is read in place rather
 * than packed: each B panel serves few A panels, so packing it costs more
 * than its strided reads (measured here, 2 threads: 128x3072 @ 3072x768
 * 2.33 -> 1.88 ms, 256x1024 @ 1024x1024 2.00 -> 1.67 ms, 64x4096 @
 * 4096x4096 10.2 -> 9.3 ms; from 512 rows up it was even or worse, 2048^3
 * 52.5 -> 55.8 ms when read in place). */
#define IN_PLACE_B_ROWS 256

/* Products below this many flops (~20 us of work) run on one thread: a
 * parallel region costs more than it gives. */
#define SMALL_PRODUCT_FLOPS 4.0e6

/* The epilogue on a finished tile (its last K block just stored, still in
 * L1): C[r, c] = act(C[r, c] + bias[c]) + res[r, c] (each part optional;
 * res: the tile's place in a residual with row stride ldr). Each step
 * rounds as the separate kernels did: the same bits. */
typedef struct {
    const float *bias, *res;
    int64_t ldr;
    bool relu;
    nd_inner_fn act_fn; /* another activation: nd.<act>'s own inner loop, in place */
} tile_post;

static void tile_epilogue(float *C, int64_t ldc, int64_t mr, int64_t nr, const tile_post *e) {
    const float *bias = e->bias;
    for (int64_t r = 0; r < mr; r++) {
        float *row = C + r * ldc;
        if (bias && e->relu) {
#pragma omp simd
            for (int64_t c = 0; c < nr; c++) {
                float v = row[c] + bias[c];
                row[c] = !(v <= 0.0f) ? v : 0.0f; /* NaN stays NaN, as nd.relu */
            }
        } else if (bias) {
#pragma omp simd
            for (int64_t c = 0; c < nr; c++) row[c] += bias[c];
        } else if (e->relu) {
#pragma omp simd
            for (int64_t c = 0; c < nr; c++) row[c] = !(row[c] <= 0.0f) ? row[c] : 0.0f;
        }
        if (e->act_fn) {
            char *p[2] = {(char *)row, (char *)row};
            const int64_t s[2] = {sizeof(float), sizeof(float)};
            e->act_fn(p, s, nr, NULL);
        }
        if (e->res) {
            const float *rr = e->res + r * e->ldr;
#pragma omp simd
            for (int64_t c = 0; c < nr; c++) row[c] += rr[c];
        }
    }
}

/* ---- products with one column or one row (matrix-vector, dot) ----
 * The tile kernel would compute 32 columns (or 12 rows) for the one that
 * is wanted: a 4096 x 1024 matrix times a vector took 6.2 ms, a dot of
 * 1024 floats 43 us. Here each output is one dot product (rows of unit
 * stride) or the columns are summed with one axpy per k (columns of unit
 * stride), vectorised; C gets the finished product added or stored, as the
 * tile kernel's last step, so matmul_acc stays matmul + add bit for bit. */

/* 64 float partial sums (lane l takes k = l mod 64), added in a fixed
 * order, a block of 4096 k's at a time, the blocks summed in double: every
 * clone gives the same bits (a multiply, then an add: -std=c11 contracts
 * nothing into FMAs), and a long dot (a gradient's squared norm) keeps
 * float32's accuracy */
#define DOT_LANES 64
ND_ISA_CLONES static float dot_f32(const float *a, const float *x, int64_t n) {
    double total = 0;
    for (int64_t k0 = 0; k0 < n; k0 += 4096) {
        const int64_t k1 = n - k0 < 4096 ? n : k0 + 4096;
        float acc[DOT_LANES] = {0};
        int64_t k = k0;
        for (; k + DOT_LANES <= k1; k += DOT_LANES) {
#pragma omp simd
            for (int l = 0; l < DOT_LANES; l++) acc[l] += a[k + l] * x[k + l];
        }
        float s = 0;
        for (int l = 0; l < DOT_LANES; l++) s += acc[l];
        for (; k < k1; k++) s += a[k] * x[k];
        total += s;
    }
    return (float)total;
}

ND_ISA_CLONES static void axpy_f32(float *y, float alpha, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* rows at a time for the axpy form: its partial sums stay in L1 */
#define GEMV_ROW_BLOCK 1024

/* C[i * cs] (=, or += when accumulate) sum_k A[i * a_r + k * a_k] * x[k * xs]
 * for i < rows; false, with C untouched, when neither of A's strides is 1
 * (the tile path then runs) or memory ran out. */
static bool gemv_f32(int threads, int64_t rows, int64_t K, const float *A, int64_t a_r, int64_t a_k,
                     const float *x, int64_t xs, float *C, int64_t cs, bool accumulate) {
    if (a_k != 1 && a_r != 1 && rows > 1) return false;
    if (2.0 * (double)rows * (double)K < SMALL_PRODUCT_FLOPS) threads = 1;
    /* the dots read contiguous vectors: a strided x, and a strided single
     * row of A (a dot of two strided vectors), are copied first */
    const bool copy_x = xs != 1 && (a_k == 1 || rows == 1), copy_a = a_k != 1 && rows == 1;
    float *xc = NULL;
    if (copy_x || copy_a) {
        xc = nd_cpu_scratch_alloc((size_t)K * sizeof(float) * (copy_x && copy_a ? 2 : 1));
        if (!xc) return false;
        float *p = xc;
        if (copy_x) {
            for (int64_t k = 0; k < K; k++) p[k] = x[k * xs];
            x = p, xs = 1, p += K;
        }
        if (copy_a) {
            for (int64_t k = 0; k < K; k++) p[k] = A[k * a_k];
            A = p, a_k = 1;
        }
    }
    if (a_k == 1) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (int64_t i = 0; i < rows; i++) {
            float d = dot_f32(A + i * a_r, x, K);
            C[i * cs] = accumulate ? C[i * cs] + d : d;
        }
    } else {
        /* every thread's sums allocated before any of C is written: a
         * failure then leaves C as it was for the tile path */
        const int64_t blocks = (rows + GEMV_ROW_BLOCK - 1) / GEMV_ROW_BLOCK;
        const int team = threads > 1 && blocks > 1 ? threads : 1;
        float *ys = nd_cpu_scratch_alloc((size_t)team * GEMV_ROW_BLOCK * sizeof(float));
        if (!ys) {
            nd_cpu_scratch_free(xc);
            return false;
        }
#pragma omp parallel num_threads(team) if (team > 1)
        {
            float *y = ys + (size_t)omp_get_thread_num() * GEMV_ROW_BLOCK;
#pragma omp for schedule(static)
            for (int64_t ib = 0; ib < blocks; ib++) {
                const int64_t i0 = ib * GEMV_ROW_BLOCK;
                const int64_t n = rows - i0 < GEMV_ROW_BLOCK ? rows - i0 : GEMV_ROW_BLOCK;
                memset(y, 0, (size_t)n * sizeof(float));
                for (int64_t k = 0; k < K; k++) axpy_f32(y, x[k * xs], A + k * a_k + i0, n);
                for (int64_t i = 0; i < n; i++)
                    C[(i0 + i) * cs] = accumulate ? C[(i0 + i) * cs] + y[i] : y[i];
            }
        }
        nd_cpu_scratch_free(ys);
    }
    nd_cpu_scratch_free(xc);
    return true;
}

/* B packed whole for the bfloat16 kernel, once (nd_cpu_bf16_pack_b): its
 * (NC column block jb, K block kb) panels at data + off[jb * nk + kb],
 * exactly as sgemm_on packs them for that block */
struct nd_bf16_packed_b {
    int64_t K, N, nj, nk;
    size_t *off;
    uint32_t *data;
    size_t bytes;
};

/* nd.compile's hint for this thread's next products (backend.h gemm_hint):
 * set around a tuned record's replay, all zero otherwise. Its fields only
 * move work between threads and blocks, never change a sum's order. */
static _Thread_local nd_gemm_hint gemm_hint;

void nd_cpu_gemm_hint(const nd_gemm_hint *h) {
    if (h) gemm_hint = *h;
    else memset(&gemm_hint, 0, sizeof gemm_hint);
}

int nd_cpu_gemm_threads(void) {
    const int threads = nd_cpu_threads();
    return gemm_hint.threads > 0 && gemm_hint.threads < threads ? gemm_hint.threads : threads;
}

static bool sgemm_run(int threads, const gemm_isa *isa, int64_t M, int64_t N, int64_t K, const float *A,
                      int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                      const nd_bf16_packed_b *pre, float *C, int64_t ldc, bool accumulate,
                      const tile_post *post);

/* One product on at most `threads` threads. */
static bool sgemm_on(int threads, int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm,
                     int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc,
                     bool accumulate, const tile_post *post) {
    return sgemm_run(threads, isa_for(M, N), M, N, K, A, a_sm, a_sk, B, b_sk, b_sn, NULL, C, ldc, accumulate,
                     post);
}

/* The epilogue epi (the last K block; NULL: none) on the finished tile at
 * C's (row, col), ct = its first element */
static inline void tile_done(float *ct, int64_t ldc, int64_t row, int64_t col, int64_t mr, int64_t nr,
                             const tile_post *epi) {
    if (!epi) return;
    tile_post e = *epi;
    if (e.bias) e.bias += col;
    if (e.res) e.res += row * e.ldr + col;
    tile_epilogue(ct, ldc, mr, nr, &e);
}

/* One tile: C's mr x nr at (row, col) = or += an A panel @ a B panel (row
 * stride ldb), then, with epi (the last K block), the epilogue on it. */
static inline void gemm_tile(const gemm_isa *isa, int64_t kc, const float *ap, const float *bp, int64_t ldb,
                             float *C, int64_t ldc, int64_t row, int64_t col, int64_t mr, int64_t nr, bool add,
                             const tile_post *epi) {
    float *ct = C + row * ldc + col;
    run_tile(isa, kc, ap, bp, ldb, ct, ldc, mr, nr, add);
    tile_done(ct, ldc, row, col, mr, nr, epi);
}

/* gemm_tile with A's whole panel (MR rows) read in place: rows lda apart */
static inline void gemm_tile_a(const gemm_isa *isa, int64_t kc, const float *a, int64_t lda, const float *bp,
                               int64_t ldb, float *C, int64_t ldc, int64_t row, int64_t col, int64_t nr, bool add,
                               const tile_post *epi) {
    float *ct = C + row * ldc + col;
    run_tile_a(isa, kc, a, lda, bp, ldb, ct, ldc, nr, add);
    tile_done(ct, ldc, row, col, isa->mr, nr, epi);
}

/* The share of L2 a block of packed B may take when it is streamed from
 * there (the rest: A's block, C's rows and what else runs). */
#define STREAM_L2_SHARE 0.5

/* The columns of a packed B block that is streamed from L2: as many as fit
 * in STREAM_L2_SHARE of it at depth kd (at most the ISA's NC), then evened
 * out over the blocks N needs, in whole panels (N = 2048 on a 2 MiB L2:
 * two blocks of 1024, not 1024 + 1024 + 0). */
static int64_t stream_block_cols(const gemm_isa *isa, int64_t N, int64_t kd) {
    const int64_t NR = isa->nr;
    int64_t nc = (int64_t)(STREAM_L2_SHARE * (double)nd_cpu_l2_bytes()) / (kd * (int64_t)sizeof(float)) / NR * NR;
    if (nc < NR) nc = NR;
    if (nc > isa->nc) nc = isa->nc;
    const int64_t blocks = (N + nc - 1) / nc;
    nc = (N + blocks - 1) / blocks;
    return (nc + NR - 1) / NR * NR;
}

/* sgemm_on on a given kernel, B packed already when pre is given (the
 * bfloat16 kernel's whole B) */
static bool sgemm_run(int threads, const gemm_isa *isa, int64_t M, int64_t N, int64_t K, const float *A,
                      int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                      const nd_bf16_packed_b *pre, float *C, int64_t ldc, bool accumulate,
                      const tile_post *post) {
    if (!isa || !isa->ukr || M <= 0 || N <= 0 || K <= 0) return false;
    /* one column of C (A @ vector) or one row (vector @ B, the same as
     * B^T @ vector): dot products or axpys, then the epilogue on C */
    if ((N == 1 || M == 1) && !isa->bf16 && !pre) {
        bool done = N == 1 ? gemv_f32(threads, M, K, A, a_sm, a_sk, B, b_sk, C, ldc, accumulate)
                           : gemv_f32(threads, N, K, B, b_sn, b_sk, A, a_sk, C, 1, accumulate);
        if (done) {
            if (post) tile_epilogue(C, ldc, M, N, post);
            return true;
        }
    }
    const int MR = isa->mr, NR = isa->nr;
    double flops = 2.0 * (double)M * (double)N * (double)K;
    if (flops < SMALL_PRODUCT_FLOPS) threads = 1;
    /* blocks of rows of at most the ISA's MC (or the hint's, in whole
     * panels), the row panels spread evenly over them: the first mrem
     * blocks have one panel more. (Rounding one block size up to whole
     * panels left the last block short: 1024 rows were 5 x 180 + 124, 540
     * rows on one thread and 484 on the other.) */
    const int64_t mc_max = gemm_hint.mc > 0 ? ((int64_t)gemm_hint.mc + MR - 1) / MR * MR : isa->mc;
    const int64_t mblocks = (M + mc_max - 1) / mc_max;
    const int64_t mpanels = (M + MR - 1) / MR, mq = mpanels / mblocks, mrem = mpanels % mblocks;
    const int64_t MC = (mq + (mrem > 0)) * MR; /* the largest block */
    /* tasks: blocks of rows times ranges of column panels, a multiple of the
     * thread count while there are few blocks (3 blocks on 2 threads: 6) */
    int64_t chunks = 1;
    if (mblocks < 8 * (int64_t)threads) {
        int64_t g = mblocks, h = threads;
        while (h) { int64_t r = g % h; g = h; h = r; }
        chunks = threads / g;
    }
    if (gemm_hint.split == 1) chunks = 1;
    else if (gemm_hint.split == 2) chunks = threads;
    /* up to IN_PLACE_B_ROWS rows, B rows unit-stride: B read in place
     * (whole NR-wide panels only; the last partial panel is packed) */
    const bool b_in_place = M <= IN_PLACE_B_ROWS && b_sn == 1 && !isa->bf16 && !pre;
    const int64_t KD = block_depth(isa);
    const int64_t kc_max = K < KD ? K : KD;
    /* Which panel stays in cache while the other streams past it. By
     * default a B panel stays (48 KiB: in L1 or near it) while the A panels
     * of a row block stream from L2. When the packed B block (kc x N, up to
     * 384 x 2048 floats, 3 MiB) is too big to stay in L2, the B panels come
     * from L3 once per row block; then an A panel (12 x 384 floats, 18
     * KiB) stays in L1 while the panels of an L2-sized B block stream past
     * it (BLIS's order). Here (2 MiB L2), median of paired runs, 1 thread:
     * 2048^3 +10%, 512 x 2304 x 768 +12%, 700 x 10000 x 256 +14%; with the
     * small B block of 10000 x 256 x 700 streaming cost 11% on 2 threads,
     * hence only past half the L2. Not for B read in place (strided rows
     * stream badly) or the bfloat16 kernel (its 64 KiB panels are meant to
     * live in L2 at KC 1024; prepacked weights come in NC-wide blocks). */
    const bool may_stream = !b_in_place && !isa->bf16 && !pre;
    const bool stream_b = may_stream && (gemm_hint.order ? gemm_hint.order == 2
                                                         : (double)kc_max * (double)N * sizeof(float) >
                                                               0.5 * (double)nd_cpu_l2_bytes());
    const int64_t NC = stream_b ? stream_block_cols(isa, N, KD) : isa->nc;
    /* row-major A read in place by kernels that can: the narrow ones
     * always, the wide AVX-512 one when B streams past A's panel (which
     * then stays in L1 for a whole block of B panels: in place it cost
     * nothing there, where packing it - a transpose, once per block of B -
     * took 9% of a 2048^3 product's time; with A's panels streaming from
     * L2 instead, packed ones were 7% faster). A row block's last, partial
     * panel is packed. */
    const bool a_in_place = isa->ukr_a && a_sk == 1 && (!isa->a_in_place_streamed || stream_b);
    float *bpack = NULL;
    /* packing buffers as big as this product needs, not the block maxima:
     * a small product then takes a few KiB, not 3 MiB (a fresh mapping's
     * page faults on every call where malloc maps big blocks) */
    const int64_t nc_max = N < NC ? N : NC;
    size_t bpack_n = (size_t)kc_max * (size_t)((nc_max + NR - 1) / NR * NR);
    if (!b_in_place && !pre) {
        bpack = nd_cpu_scratch_alloc(bpack_n * sizeof(float)); /* cpu_scratch.h */
        if (!bpack) return false;
    }
    bool ok = true;
    for (int64_t jc = 0; jc < N; jc += NC) {
        const int64_t nc = N - jc < NC ? N - jc : NC;
        const int64_t npanels = (nc + NR - 1) / NR;
        for (int64_t pc = 0; pc < K; pc += KD) {
            const int64_t kc = K - pc < KD ? K - pc : KD;
            const bool add = accumulate || pc > 0;
            const bool last_k = pc + kc == K, epilogue = last_k && post;
            float *bblock = bpack;
            if (pre) {
                bblock = (float *)(void *)(pre->data + pre->off[(jc / NC) * pre->nk + pc / KD]);
            } else if (!b_in_place) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
                for (int64_t p = 0; p < npanels; p++)
                    pack_b_any(isa, B, b_sk, b_sn, N, pc, kc, jc, p * NR, p * NR + NR, bpack);
            }
            const int64_t nchunks = chunks < npanels ? chunks : npanels;
            const int64_t tasks = mblocks * nchunks;
            int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && tasks > 1) reduction(| : failed)
            {
                /* MR * kc floats per panel */
                size_t abytes = (size_t)MC * (size_t)kc_max * sizeof(float);
                float *apack = nd_cpu_scratch_alloc(abytes);
                float edge[KC * MAX_NR]; /* a partial B panel read in place gets packed here */
                if (!apack) failed = 1;
                /* round robin: the blocks with a panel more go one to each thread */
#pragma omp for schedule(static, 1)
                for (int64_t t = 0; t < tasks; t++) {
                    if (!apack) continue;
                    const int64_t ib = t / nchunks, ch = t % nchunks;
                    const int64_t ic = (ib * mq + (ib < mrem ? ib : mrem)) * MR;
                    const int64_t mc = M - ic < (mq + (ib < mrem)) * MR ? M - ic : (mq + (ib < mrem)) * MR;
                    const int64_t p0 = npanels * ch / nchunks, p1 = npanels * (ch + 1) / nchunks;
                    const int64_t depth = panel_depth(isa, kc);
                    const int64_t whole = a_in_place ? mc / MR * MR : 0; /* panels read in place */
                    if (whole < mc) pack_a_any(isa, A, a_sm, a_sk, M, ic + whole, mc - whole, pc, kc, apack + whole * depth);
                    const tile_post *epi = epilogue ? post : NULL;
                    if (stream_b) {
                        for (int64_t ir = 0; ir < mc; ir += MR) {
                            const int64_t mr = mc - ir < MR ? mc - ir : MR;
                            for (int64_t p = p0; p < p1; p++) {
                                const int64_t jr = p * NR, nr = nc - jr < NR ? nc - jr : NR;
                                const float *bp = bblock + (size_t)p * NR * (size_t)depth;
                                if (ir < whole)
                                    gemm_tile_a(isa, kc, A + (ic + ir) * a_sm + pc, a_sm, bp, NR, C, ldc, ic + ir,
                                                jc + jr, nr, add, epi);
                                else
                                    gemm_tile(isa, kc, apack + ir * depth, bp, NR, C, ldc, ic + ir, jc + jr, mr,
                                              nr, add, epi);
                            }
                        }
                        continue;
                    }
                    for (int64_t p = p0; p < p1; p++) {
                        const int64_t jr = p * NR, nr = nc - jr < NR ? nc - jr : NR;
                        const float *bp;
                        int64_t ldb;
                        if (!b_in_place) {
                            bp = bblock + (size_t)p * NR * (size_t)depth;
                            ldb = NR;
                        } else if (nr == NR) {
                            bp = B + pc * b_sk + (jc + jr);
                            ldb = b_sk;
                        } else {
                            pack_b(isa, B, b_sk, b_sn, N, pc, kc, jc + jr, 0, NR, edge);
                            bp = edge;
                            ldb = NR;
                        }
                        for (int64_t ir = 0; ir < mc; ir += MR) {
                            const int64_t mr = mc - ir < MR ? mc - ir : MR;
                            if (ir < whole)
                                gemm_tile_a(isa, kc, A + (ic + ir) * a_sm + pc, a_sm, bp, ldb, C, ldc, ic + ir,
                                            jc + jr, nr, add, epi);
                            else
                                gemm_tile(isa, kc, apack + ir * depth, bp, ldb, C, ldc, ic + ir, jc + jr, mr, nr,
                                          add, epi);
                        }
                    }
                }
                nd_cpu_scratch_free(apack);
            }
            if (failed) { ok = false; goto out; }
        }
    }
out:
    nd_cpu_scratch_free(bpack);
    return ok;
}

bool nd_cpu_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk,
                  const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc,
                  bool accumulate) {
    return sgemm_on(nd_cpu_gemm_threads(), M, N, K, A, a_sm, a_sk, B, b_sk, b_sn, C, ldc, accumulate,
                    NULL);
}

bool nd_cpu_sgemm_bf16_from(int64_t min_madds, int64_t M, int64_t N, int64_t K, const float *A,
                             int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                             float *C, int64_t ldc, bool accumulate) {
    const gemm_isa *isa = isa_for(M, N);
    if (is_bf16(isa) && (double)M * (double)N * (double)K < (double)min_madds) isa = narrow_for(pick_f32_isa(), N);
    return sgemm_run(nd_cpu_gemm_threads(), isa, M, N, K, A, a_sm, a_sk, B, b_sk, b_sn, NULL, C, ldc, accumulate,
                     NULL);
}

int nd_cpu_sgemm_add(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk,
                     const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc) {
    const gemm_isa *isa = isa_for(M, N);
    /* one K block: each tile's product is whole in registers when it is
     * added to C (several blocks would add their partial sums one by one) */
    if (!isa || !isa->ukr || M <= 0 || N <= 0 || K <= 0 || K > block_depth(isa)) return 0;
    return sgemm_on(nd_cpu_gemm_threads(), M, N, K, A, a_sm, a_sk, B, b_sk, b_sn, C, ldc, true, NULL)
               ? 1 : -1;
}

bool nd_cpu_sgemm_bias_act(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm,
                           int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn, float *C,
                           int64_t ldc, const float *bias, nd_activation act, const float *res,
                           int64_t ldr) {
    tile_post e = {bias, res, ldr, act == ND_ACT_RELU,
                   act == ND_ACT_GELU ? nd_cpu_unary_inner(ND_UNARY_gelu, ND_FLOAT32) : NULL};
    return sgemm_on(nd_cpu_gemm_threads(), M, N, K, A, a_sm, a_sk, B, b_sk, b_sn, C, ldc, false,
                    bias || act != ND_ACT_NONE || res ? &e : NULL);
}

/* pack_b_bf16's panels from a bfloat16 weight w (N x K rows, ldw apart)
 * read as B = w^T: a row's consecutive pair (2kk, 2kk + 1) is already the
 * word the kernel reads, so a panel is a copy (no rounding: the values are
 * bfloat16 already) */
static void pack_b_from_bf16_rows(const gemm_isa *isa, const uint16_t *w, int64_t ldw, int64_t N, int64_t k0,
                                  int64_t kc, int64_t j0, int64_t jp0, int64_t jp1, uint32_t *p) {
    const int NR = isa->nr;
    const int64_t kp = (kc + 1) / 2, even = kc / 2;
    for (int64_t jp = jp0; jp < jp1; jp += NR) {
        uint32_t *q = p + jp * kp;
        const int64_t j = j0 + jp, cols = N - j < NR ? N - j : NR;
        for (int64_t c = 0; c < cols; c++) {
            const uint16_t *row = w + (j + c) * ldw + k0;
            for (int64_t kk = 0; kk < even; kk++) {
                uint32_t word;
                memcpy(&word, row + 2 * kk, sizeof word);
                q[kk * NR + c] = word;
            }
            if (kp > even) q[even * NR + c] = row[2 * even];
        }
        for (int64_t c = cols; c < NR; c++)
            for (int64_t kk = 0; kk < kp; kk++) q[kk * NR + c] = 0u;
    }
}

/* nd_cpu_bf16_pack_b's body: B from float32 (B, strides) or, with w16, the
 * transpose of a bfloat16 weight (N x K, rows ldw apart) */
static nd_bf16_packed_b *bf16_pack_b(int64_t K, int64_t N, const float *B, int64_t b_sk, int64_t b_sn,
                                     const uint16_t *w16, int64_t ldw) {
    const gemm_isa *isa = &isa_bf16;
    if (!have_bf16() || K <= 0 || N <= 0) return NULL;
    const int64_t NR = isa->nr, NC = isa->nc, KD = block_depth(isa);
    nd_bf16_packed_b *pb = calloc(1, sizeof *pb);
    if (!pb) return NULL;
    pb->K = K, pb->N = N, pb->nj = (N + NC - 1) / NC, pb->nk = (K + KD - 1) / KD;
    pb->off = malloc(sizeof(size_t) * (size_t)(pb->nj * pb->nk));
    size_t words = 0;
    for (int64_t jb = 0; pb->off && jb < pb->nj; jb++) {
        const int64_t nc = N - jb * NC < NC ? N - jb * NC : NC, npanels = (nc + NR - 1) / NR;
        for (int64_t kb = 0; kb < pb->nk; kb++) {
            const int64_t kc = K - kb * KD < KD ? K - kb * KD : KD;
            pb->off[jb * pb->nk + kb] = words;
            words += (size_t)(npanels * NR * panel_depth(isa, kc));
        }
    }
    pb->bytes = words * sizeof(uint32_t);
    pb->data = pb->off ? malloc(pb->bytes ? pb->bytes : 1) : NULL;
    if (!pb->data) {
        nd_cpu_bf16_packed_free(pb);
        return NULL;
    }
    for (int64_t jb = 0; jb < pb->nj; jb++) {
        const int64_t jc = jb * NC, nc = N - jc < NC ? N - jc : NC, npanels = (nc + NR - 1) / NR;
        for (int64_t kb = 0; kb < pb->nk; kb++) {
            const int64_t pc = kb * KD, kc = K - pc < KD ? K - pc : KD;
            uint32_t *dst = pb->data + pb->off[jb * pb->nk + kb];
#pragma omp parallel for num_threads(nd_cpu_threads()) schedule(static) if (npanels > 1)
            for (int64_t p = 0; p < npanels; p++) {
                if (w16) pack_b_from_bf16_rows(isa, w16, ldw, N, pc, kc, jc, p * NR, p * NR + NR, dst);
                else pack_b_bf16(isa, B, b_sk, b_sn, N, pc, kc, jc, p * NR, p * NR + NR, dst);
            }
        }
    }
    return pb;
}

nd_bf16_packed_b *nd_cpu_bf16_pack_b(int64_t K, int64_t N, const float *B, int64_t b_sk, int64_t b_sn) {
    return bf16_pack_b(K, N, B, b_sk, b_sn, NULL, 0);
}

nd_bf16_packed_b *nd_cpu_bf16_pack_weight_bf16(int64_t K, int64_t N, const uint16_t *w, int64_t ldw) {
    return bf16_pack_b(K, N, NULL, 0, 0, w, ldw);
}

size_t nd_cpu_bf16_packed_bytes(const nd_bf16_packed_b *pb) { return pb ? pb->bytes + sizeof *pb : 0; }

void nd_cpu_bf16_packed_free(nd_bf16_packed_b *pb) {
    if (!pb) return;
    free(pb->off);
    free(pb->data);
    free(pb);
}

#ifdef ND_HAVE_GEMM_KERNELS
/* Rows i0 .. i0 + m - 1 (m <= SMALL_ROWS) of C = A @ B on the packed B, one
 * 32-column panel at a time: each row's (k, k + 1) pair broadcast against
 * the panel, as the tile kernel does for its rows - the same sums in the
 * same order (a K block's products summed from zero, then stored or added
 * to C), so a row's bits do not depend on how many rows came with it; but
 * no work on the rows of zeros a panel of A would carry, and B streams
 * once: with few rows (a generated token's) the product is as fast as B's
 * bytes. */
#define SMALL_ROWS 4

/* One K block's sums, from zero, of m rows (their kp pairs at a, row
 * stride kp_all) against one 32-column panel b: acc[r] = row r's 32. */
typedef void (*rows_block_fn)(int64_t m, const uint32_t *a, int64_t kp_all, const int32_t *b, int64_t kp,
                              __m512 acc[SMALL_ROWS][2]);

/* ukr_bf16_12x32's order: one vdpbf16ps chain per column over the pairs */
__attribute__((target("avx512f,avx512bf16"))) static void block_bf16(int64_t m, const uint32_t *a, int64_t kp_all,
                                                                     const int32_t *b, int64_t kp,
                                                                     __m512 acc[SMALL_ROWS][2]) {
    const int64_t NR = 32;
    for (int64_t r = 0; r < m; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k++) {
        const __m512i b0 = _mm512_loadu_si512(b + k * NR), b1 = _mm512_loadu_si512(b + k * NR + 16);
        for (int64_t r = 0; r < m; r++) {
            const __m512i ai = _mm512_set1_epi32((int32_t)a[r * kp_all + k]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)ai, (__m512bh)b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)ai, (__m512bh)b1);
        }
    }
}

/* ukr_amx_32x32's order. Measured on a Sapphire Rapids (probes of sums
 * whose rounding shows the order): each tdpbf16ps, over its 16 pairs, sums
 * the even k's products in one chain and the odd k's in another, each from
 * zero in k order and rounded to nearest at each step, then adds the two
 * chains' sum to C - not Intel's pseudo-code (one chain, even then odd,
 * from C), nor vdpbf16ps's order. Denormal inputs and results are flushed
 * to zero (rows_on_packed sets MXCSR's DAZ and FTZ for it). Here the pair's
 * halves widen to floats (a bfloat16 is a float's top half) and run the
 * same chains with FMAs - a product of bfloat16s is exact in float32, so
 * each FMA rounds as a chain step does - in groups of 16 pairs (a partial
 * group's zero padding adds +0 once). */
__attribute__((target("avx512f"))) static void block_amx_order(int64_t m, const uint32_t *a, int64_t kp_all,
                                                                const int32_t *b, int64_t kp,
                                                                __m512 acc[SMALL_ROWS][2]) {
    const int64_t NR = 32;
    const __m512i hi_mask = _mm512_set1_epi32((int32_t)0xffff0000u);
    for (int64_t r = 0; r < m; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < kp; g += 16) {
        const int64_t gend = kp - g < 16 ? kp : g + 16;
        __m512 ev[SMALL_ROWS][2], od[SMALL_ROWS][2];
        for (int64_t r = 0; r < m; r++) ev[r][0] = ev[r][1] = od[r][0] = od[r][1] = _mm512_setzero_ps();
        for (int64_t k = g; k < gend; k++) {
            const __m512i b0 = _mm512_loadu_si512(b + k * NR), b1 = _mm512_loadu_si512(b + k * NR + 16);
            const __m512 b0e = _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16)),
                         b0o = _mm512_castsi512_ps(_mm512_and_si512(b0, hi_mask)),
                         b1e = _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16)),
                         b1o = _mm512_castsi512_ps(_mm512_and_si512(b1, hi_mask));
            for (int64_t r = 0; r < m; r++) {
                const uint32_t w = a[r * kp_all + k];
                const uint32_t we = w << 16, wo = w & 0xffff0000u;
                float fe, fo;
                memcpy(&fe, &we, 4);
                memcpy(&fo, &wo, 4);
                const __m512 ae = _mm512_set1_ps(fe), ao = _mm512_set1_ps(fo);
                ev[r][0] = _mm512_fmadd_ps(ae, b0e, ev[r][0]);
                ev[r][1] = _mm512_fmadd_ps(ae, b1e, ev[r][1]);
                od[r][0] = _mm512_fmadd_ps(ao, b0o, od[r][0]);
                od[r][1] = _mm512_fmadd_ps(ao, b1o, od[r][1]);
            }
        }
        const __m512 zero = _mm512_setzero_ps();
        for (int64_t r = 0; r < m; r++)
            for (int h = 0; h < 2; h++) {
                __m512 e = ev[r][h], o = od[r][h];
                if (gend - g < 16) { /* the padding's +0 products */
                    e = _mm512_add_ps(e, zero);
                    o = _mm512_add_ps(o, zero);
                }
                acc[r][h] = _mm512_add_ps(acc[r][h], _mm512_add_ps(e, o));
            }
    }
}

/* Panels p0 .. p1 - 1 of the m rows' product, each K block's sums by block
 * (flush: with DAZ and FTZ set, restored after) */
__attribute__((target("avx512f"))) static void rows_on_packed(int64_t m, const uint32_t *ap, int64_t kp_all,
                                                               const nd_bf16_packed_b *pb, int64_t p0, int64_t p1,
                                                               float *C, int64_t ldc, rows_block_fn block,
                                                               bool flush) {
    const int64_t NR = 32, NC = isa_bf16.nc, KD = block_depth(&isa_bf16), N = pb->N, K = pb->K;
    const unsigned csr = _mm_getcsr();
    if (flush) _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6) */
    for (int64_t p = p0; p < p1; p++) {
        const int64_t j = p * NR, jb = j / NC, jp = j - jb * NC;
        float tile[SMALL_ROWS][32];
        for (int64_t kb = 0; kb < pb->nk; kb++) {
            const int64_t kc = K - kb * KD < KD ? K - kb * KD : KD, kp = (kc + 1) / 2;
            const int32_t *b = (const int32_t *)(pb->data + pb->off[jb * pb->nk + kb]) + jp * kp;
            __m512 acc[SMALL_ROWS][2];
            block(m, ap + kb * (KD / 2), kp_all, b, kp, acc);
            for (int64_t r = 0; r < m; r++) {
                if (kb > 0) {
                    acc[r][0] = _mm512_add_ps(_mm512_loadu_ps(tile[r]), acc[r][0]);
                    acc[r][1] = _mm512_add_ps(_mm512_loadu_ps(tile[r] + 16), acc[r][1]);
                }
                _mm512_storeu_ps(tile[r], acc[r][0]);
                _mm512_storeu_ps(tile[r] + 16, acc[r][1]);
            }
        }
        const int64_t w = N - j < NR ? N - j : NR;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < w; c++) C[r * ldc + j + c] = tile[r][c];
    }
    if (flush) _mm_setcsr(csr);
}
#endif

/* A's rows as bfloat16 pairs, row r's at out + r * ceil(K / 2) (K blocks
 * of KD, each a whole number of pairs as the packed panels have them) */
static void rows_to_pairs(int64_t m, const float *A, int64_t a_sm, int64_t a_sk, int64_t K, int64_t KD,
                          uint32_t *out, int64_t kp_all) {
    for (int64_t r = 0; r < m; r++) {
        const float *src = A + r * a_sm;
        uint32_t *dst = out + r * kp_all;
        for (int64_t k0 = 0; k0 < K; k0 += KD) {
            const int64_t kc = K - k0 < KD ? K - k0 : KD;
            for (int64_t kk = 0; 2 * kk < kc; kk++) {
                const int64_t k = k0 + 2 * kk;
                dst[k0 / 2 + kk] = bf16_pair(src[k * a_sk], 2 * kk + 1 < kc ? src[(k + 1) * a_sk] : 0.0f);
            }
        }
    }
}

bool nd_cpu_sgemm_bias_act_prepacked(int64_t M, const float *A, int64_t a_sm, int64_t a_sk,
                                     const nd_bf16_packed_b *pb, float *C, int64_t ldc, const float *bias,
                                     nd_activation act, const float *res, int64_t ldr) {
    if (!pb || M <= 0) return false;
    tile_post e = {bias, res, ldr, act == ND_ACT_RELU,
                   act == ND_ACT_GELU ? nd_cpu_unary_inner(ND_UNARY_gelu, ND_FLOAT32) : NULL};
    const bool post = bias || act != ND_ACT_NONE || res;
#ifdef ND_HAVE_GEMM_KERNELS
    if (M <= SMALL_ROWS) {
        const int64_t KD = block_depth(&isa_bf16), K = pb->K, N = pb->N, npanels = (N + 31) / 32;
        const int64_t kp_all = (K + KD - 1) / KD * (KD / 2);
        uint32_t *ap = malloc(sizeof(uint32_t) * (size_t)(M * kp_all));
        if (!ap) return false;
        rows_to_pairs(M, A, a_sm, a_sk, K, KD, ap, kp_all);
        const int threads = 2.0 * (double)M * N * K < SMALL_PRODUCT_FLOPS ? 1 : nd_cpu_gemm_threads();
        const bool amx = bf16_isa() == &isa_amx; /* the bits the tile kernel gives more rows */
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int64_t p0 = npanels * t / nt, p1 = npanels * (t + 1) / nt;
            rows_on_packed(M, ap, kp_all, pb, p0, p1, C, ldc, amx ? block_amx_order : block_bf16, amx);
            if (post)
                for (int64_t p = p0; p < p1; p++) {
                    tile_post ep = e;
                    if (ep.bias) ep.bias += p * 32;
                    if (ep.res) ep.res += p * 32;
                    tile_epilogue(C + p * 32, ldc, M, N - p * 32 < 32 ? N - p * 32 : 32, &ep);
                }
        }
        free(ap);
        return true;
    }
#endif
    return sgemm_run(nd_cpu_gemm_threads(), bf16_isa(), M, pb->N, pb->K, A, a_sm, a_sk, NULL, 0, 0, pb, C, ldc, false,
                     post ? &e : NULL);
}

/* Threads take whole products when each is too small to split (attention's
 * per-head products: 128x64 @ 64x128 is 2 MFLOP) or when there are at least
 * as many products as threads and each is modest; otherwise the products
 * run one after another, each split across the threads. A product's result
 * does not depend on which thread or how many computed it. */
bool nd_cpu_sgemm_batched(int64_t batch, const int64_t *a_off, const int64_t *b_off,
                          const int64_t *c_off, int64_t M, int64_t N, int64_t K, const float *A,
                          int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                          float *C, int64_t ldc) {
    const gemm_isa *isa = isa_for(M, N);
    if (!isa || !isa->ukr || M <= 0 || N <= 0 || K <= 0) return false;
    int threads = nd_cpu_gemm_threads();
    double flops = 2.0 * (double)M * (double)N * (double)K;
    bool by_product = threads > 1 && batch > 1 &&
                      (flops < SMALL_PRODUCT_FLOPS || (batch >= threads && flops < 8 * SMALL_PRODUCT_FLOPS));
    if (!by_product) {
        for (int64_t i = 0; i < batch; i++)
            if (!sgemm_on(threads, M, N, K, A + a_off[i], a_sm, a_sk, B + b_off[i], b_sk, b_sn,
                          C + c_off[i], ldc, false, NULL))
                return false;
        return true;
    }
    int nt = batch < threads ? (int)batch : threads, failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : failed)
    for (int64_t i = 0; i < batch; i++)
        if (!failed && !sgemm_on(1, M, N, K, A + a_off[i], a_sm, a_sk, B + b_off[i], b_sk, b_sn,
                                 C + c_off[i], ldc, false, NULL))
            failed = 1;
    return !failed;
}
