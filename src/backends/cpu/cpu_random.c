/* cpu_random.c - random fill from the Philox4x32-10 stream (cpu_philox.h).
 *
 * Element i (row-major over out) uses only counter (offset + i), so the
 * values do not depend on the thread count or on how the range is split.
 * From the counter's 4 words w0..w3:
 *   uniform   float32: top 24 bits of w0; float64: top 53 bits of w0:w1;
 *             float16/bfloat16: top 11/8 bits of w0
 *   normal    Box-Muller, cos branch: float32 from w0 (radius) and w1
 *             (angle), float64 from w0:w1 and w2:w3
 *   int       [a, b): w0:w1 as a 64-bit r, a + floor(r * (b - a) / 2^64)
 *             (Lemire's multiply-shift, no rejection: a value is off from
 *             uniform by at most (b - a) / 2^64 in probability)
 *   bernoulli 1 when a uniform (24 bits for float32 p, else 53) is < p[i]. */
#include <math.h>
#include <string.h>
#include "cpu_avx2.h"
#include "cpu_kernels.h"
#include "cpu_philox.h"

#define TWO_PI 6.283185307179586476925286766559

static inline uint64_t words64(uint32_t hi, uint32_t lo) { return (uint64_t)hi << 32 | lo; }
static inline float u24(uint32_t w) { return (float)(w >> 8) * 0x1p-24f; }
static inline double u53(uint32_t hi, uint32_t lo) {
    return (double)(words64(hi, lo) >> 11) * 0x1p-53;
}

/* High 64 bits of a 64x64-bit product, in portable C. */
static inline uint64_t mulhi64(uint64_t a, uint64_t b) {
    uint64_t a_lo = (uint32_t)a, a_hi = a >> 32, b_lo = (uint32_t)b, b_hi = b >> 32;
    uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
    uint64_t cross = (lo_lo >> 32) + (uint32_t)hi_lo + lo_hi;
    return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

static inline float normal_f32(const uint32_t *w) {
    float u1 = (float)((w[0] >> 8) + 1) * 0x1p-24f; /* (0, 1]: log stays finite */
    return sqrtf(-2.0f * logf(u1)) * cosf((float)TWO_PI * u24(w[1]));
}

static inline double normal_f64(const uint32_t *w) {
    double u1 = (double)((words64(w[0], w[1]) >> 11) + 1) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(TWO_PI * u53(w[2], w[3]));
}

/* nd_philox_at8 in AVX2 registers: the 8 positions' rounds side by side,
 * the 32 x 32 -> 64-bit products as vpmuludq on the even lanes and on the
 * odd ones shifted down. One position at a time the 10 dependent rounds
 * left the multipliers idle: a fill cost about 23 cycles an element. */
#ifdef ND_HAVE_AVX2_KERNELS
__attribute__((target("avx2"))) static inline void mul_hi_lo(__m256i a, __m256i m, __m256i *hi,
                                                             __m256i *lo) {
    const __m256i even = _mm256_mul_epu32(a, m);                        /* lanes 0, 2, 4, 6 */
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m); /* lanes 1, 3, 5, 7 */
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

__attribute__((target("avx2"))) static void philox8_avx2(uint64_t seed, uint64_t ctr,
                                                         uint32_t out[4][8]) {
    uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; j++) lo[j] = (uint32_t)(ctr + (uint64_t)j), hi[j] = (uint32_t)((ctr + (uint64_t)j) >> 32);
    __m256i c0 = _mm256_loadu_si256((const __m256i *)lo), c1 = _mm256_loadu_si256((const __m256i *)hi);
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m256i h0, l0, h1, l1;
        mul_hi_lo(c0, m0, &h0, &l0);
        mul_hi_lo(c2, m1, &h1, &l1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(h1, c1), _mm256_set1_epi32((int)k0));
        c2 = _mm256_xor_si256(_mm256_xor_si256(h0, c3), _mm256_set1_epi32((int)k1));
        c1 = l1, c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    _mm256_storeu_si256((__m256i *)out[0], c0), _mm256_storeu_si256((__m256i *)out[1], c1);
    _mm256_storeu_si256((__m256i *)out[2], c2), _mm256_storeu_si256((__m256i *)out[3], c3);
}
#endif

static void philox8_base(uint64_t seed, uint64_t ctr, uint32_t out[4][8]) {
    nd_philox_at8(seed, ctr, out);
}

typedef void (*philox8_fn)(uint64_t, uint64_t, uint32_t[4][8]);
static philox8_fn philox8(void) {
#ifdef ND_HAVE_AVX2_KERNELS
    /* (atomic: kernels call it from their own threads, nd_cpu_uniform_below) */
    static _Atomic int avx2 = -1;
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2");
    }
    if (avx2) return philox8_avx2;
#endif
    return philox8_base;
}

/* Runs BODY for i in [0, n) with w[4] holding counter (offset + i)'s
 * words, drawn 8 positions at a time. */
#define RAND_LOOP(BODY)                                                         \
    {                                                                           \
        const philox8_fn gen_ = philox8();                                      \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) schedule(static) if (n >= ND_PARALLEL_THRESHOLD)") \
        for (int64_t i0 = 0; i0 < n; i0 += 8) {                                 \
            uint32_t W_[4][8];                                                  \
            gen_(seed, offset + (uint64_t)i0, W_);                              \
            const int64_t m_ = n - i0 < 8 ? n - i0 : 8;                         \
            for (int64_t q_ = 0; q_ < m_; q_++) {                               \
                const int64_t i = i0 + q_;                                      \
                const uint32_t w[4] = {W_[0][q_], W_[1][q_], W_[2][q_], W_[3][q_]}; \
                BODY;                                                           \
            }                                                                   \
        }                                                                       \
    }

typedef struct {
    char *out;
    nd_dtype dt;
    int64_t n;
    double a, b;
    const char *p; /* bernoulli probabilities, contiguous */
    nd_dtype pdt;
    uint64_t seed, offset;
} rand_job;

static void fill_uniform(const rand_job *j) {
    const int64_t n = j->n;
    const uint64_t seed = j->seed, offset = j->offset;
    const double a = j->a, b = j->b;
    switch (j->dt) {
    case ND_FLOAT32: {
        float *o = (float *)j->out;
        const float fa = (float)a, fb = (float)b, fw = (float)(b - a);
        /* Rounding a + w * u to float can land on b; keep the range half-open. */
        const float top = fb > fa ? nextafterf(fb, fa) : fb;
        RAND_LOOP(float v = fa + fw * u24(w[0]); o[i] = v < fb ? v : top)
        break;
    }
    case ND_FLOAT64: {
        double *o = (double *)j->out;
        const double top = b > a ? nextafter(b, a) : b;
        RAND_LOOP(double v = a + (b - a) * u53(w[0], w[1]); o[i] = v < b ? v : top)
        break;
    }
    default: {
        /* float16/bfloat16: as many bits as the mantissa holds, so [0, 1)
         * stays below 1; a value that still rounds up to b becomes a. */
        char *o = j->out;
        const size_t es = nd_dtype_size(j->dt);
        const nd_dtype dt = j->dt;
        const int bits = dt == ND_FLOAT16 ? 11 : dt == ND_BFLOAT16 ? 8 : 24;
        const double scale = ldexp(1.0, -bits);
        RAND_LOOP(char *q = o + i * es;
                  nd_store_f64(q, dt, a + (b - a) * (double)(w[0] >> (32 - bits)) * scale);
                  if (nd_load_f64(q, dt) >= b && b > a) nd_store_f64(q, dt, a))
    }
    }
}

static void fill_normal(const rand_job *j) {
    const int64_t n = j->n;
    const uint64_t seed = j->seed, offset = j->offset;
    const double mean = j->a, std = j->b;
    switch (j->dt) {
    case ND_FLOAT32: {
        float *o = (float *)j->out;
        const float fm = (float)mean, fs = (float)std;
        RAND_LOOP(o[i] = fm + fs * normal_f32(w))
        break;
    }
    case ND_FLOAT64: {
        double *o = (double *)j->out;
        RAND_LOOP(o[i] = mean + std * normal_f64(w))
        break;
    }
    default: {
        char *o = j->out;
        const size_t es = nd_dtype_size(j->dt);
        const nd_dtype dt = j->dt;
        RAND_LOOP(nd_store_f64(o + i * es, dt, mean + std * normal_f32(w)))
    }
    }
}

static void fill_int(const rand_job *j) {
    const int64_t n = j->n;
    const uint64_t seed = j->seed, offset = j->offset;
    /* The op checked a < b, both integral and in int64 range. */
    const int64_t lo = (int64_t)j->a;
    const uint64_t range = (uint64_t)(int64_t)j->b - (uint64_t)lo;
#define DRAW ((int64_t)((uint64_t)lo + mulhi64(words64(w[0], w[1]), range)))
    switch (j->dt) {
    case ND_INT64: {
        int64_t *o = (int64_t *)j->out;
        RAND_LOOP(o[i] = DRAW)
        break;
    }
    case ND_INT32: {
        int32_t *o = (int32_t *)j->out;
        RAND_LOOP(o[i] = (int32_t)DRAW)
        break;
    }
    case ND_FLOAT32: {
        float *o = (float *)j->out;
        RAND_LOOP(o[i] = (float)DRAW)
        break;
    }
    case ND_FLOAT64: {
        double *o = (double *)j->out;
        RAND_LOOP(o[i] = (double)DRAW)
        break;
    }
    default: {
        char *o = j->out;
        const size_t es = nd_dtype_size(j->dt);
        const nd_dtype dt = j->dt;
        RAND_LOOP(nd_store_f64(o + i * es, dt, (double)DRAW))
    }
    }
#undef DRAW
}

static void fill_bernoulli(const rand_job *j) {
    const int64_t n = j->n;
    const uint64_t seed = j->seed, offset = j->offset;
    if (j->dt == ND_FLOAT32 && j->pdt == ND_FLOAT32) {
        float *o = (float *)j->out;
        const float *p = (const float *)j->p;
        RAND_LOOP(o[i] = u24(w[0]) < p[i] ? 1.0f : 0.0f)
    } else if (j->dt == ND_FLOAT64 && j->pdt == ND_FLOAT64) {
        double *o = (double *)j->out;
        const double *p = (const double *)j->p;
        RAND_LOOP(o[i] = u53(w[0], w[1]) < p[i] ? 1.0 : 0.0)
    } else {
        char *o = j->out;
        const char *p = j->p;
        const size_t es = nd_dtype_size(j->dt), ps = nd_dtype_size(j->pdt);
        const nd_dtype dt = j->dt, pdt = j->pdt;
        /* float32 p keeps the 24-bit draw so the result matches the fast path */
        RAND_LOOP(double u = pdt == ND_FLOAT32 ? (double)u24(w[0]) : u53(w[0], w[1]);
                  nd_store_f64(o + i * es, dt, u < nd_load_f64(p + i * ps, pdt) ? 1.0 : 0.0))
    }
}
#undef RAND_LOOP

nd_status nd_cpu_random(nd_tensor *out, nd_random_kind kind, double a, double b,
                        const nd_tensor *p, uint64_t seed, uint64_t offset) {
    nd_tensor *dst = out, *pc = NULL;
    nd_status st = ND_OK;
    /* Generators write row-major into contiguous memory; other layouts go
     * through a temporary. */
    if (!nd_is_contiguous(out)) ND_TRY(nd_empty(out->shape, out->ndim, out->dtype, &dst));
    if (kind == ND_RANDOM_BERNOULLI) {
        if (!p) {
            st = nd_fail(ND_ERR_ARG, "bernoulli: no probability tensor");
            goto done;
        }
        if (nd_is_contiguous(p)) {
            pc = (nd_tensor *)p;
            nd_retain(pc);
        } else if ((st = nd_empty(p->shape, p->ndim, p->dtype, &pc)) != ND_OK ||
                   (st = nd_cpu_copy(pc, p)) != ND_OK) {
            goto done;
        }
    }
    rand_job j = {.out = nd_ptr(dst), .dt = dst->dtype, .n = nd_numel(dst), .a = a, .b = b,
                  .p = pc ? nd_ptr(pc) : NULL, .pdt = pc ? pc->dtype : ND_FLOAT32,
                  .seed = seed, .offset = offset};
    switch (kind) {
    case ND_RANDOM_UNIFORM: fill_uniform(&j); break;
    case ND_RANDOM_NORMAL: fill_normal(&j); break;
    case ND_RANDOM_INT: fill_int(&j); break;
    case ND_RANDOM_BERNOULLI: fill_bernoulli(&j); break;
    default: st = nd_fail(ND_ERR_ARG, "random: unknown distribution %d", (int)kind); goto done;
    }
    if (dst != out) st = nd_cpu_copy(out, dst);
done:
    nd_release(pc);
    if (dst != out) nd_release(dst);
    return st;
}

void nd_cpu_uniform_below(uint64_t seed, uint64_t offset, int64_t n, nd_dtype dt, double below,
                          unsigned char *keep) {
    const philox8_fn gen = philox8();
    const float fb = (float)below;
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        uint32_t W[4][8];
        gen(seed, offset + (uint64_t)i0, W);
        const int64_t m = n - i0 < 8 ? n - i0 : 8;
        if (dt == ND_FLOAT64)
            for (int64_t q = 0; q < m; q++) keep[i0 + q] = u53(W[0][q], W[1][q]) < below;
        else
            for (int64_t q = 0; q < m; q++) keep[i0 + q] = u24(W[0][q]) < fb;
    }
}
