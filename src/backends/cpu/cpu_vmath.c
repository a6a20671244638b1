/* cpu_vmath.c - float32 exp, tanh, sigmoid, erf and gelu over arrays (cpu_vmath.h). */
#include "cpu_vmath.h"

#include <string.h>
#include "cpu_math.h"

/* e^x for x in [-103.98, 88.73) and its limits: x = n ln2 + r, |r| <= ln2/2,
 * e^r by Cephes' polynomial, then 2^n applied as two powers of two so that
 * n below -126 (denormal results) is exact up to the final rounding. */
static inline float exp1(float x) {
    const float hi = 88.72283935546875f, lo = -103.97208f;
    float xc = x < hi ? (x > lo ? x : lo) : hi; /* (NaN -> hi: no NaN to convert to int below) */
    float fn;
    float e = exp_reduced(xc, &fn); /* cpu_math.h */
    int32_t n = (int32_t)fn, n1 = n / 2, n2 = n - n1; /* each within [-75, 64] */
    int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    e = e * s1 * s2;
    e = x >= hi ? __builtin_inff() : (x < lo ? 0.0f : e);
    return x != x ? x : e;
}

/* o[i] = FN(x[i]) over an array, vectorised (AVX2 + FMA clone where the CPU has them) */
#define ARRAY_FN(NAME, FN)                                                     \
    ND_ISA_CLONES                                                              \
    void NAME(float *o, const float *x, int64_t n) {                           \
        _Pragma("omp simd")                                                    \
        for (int64_t i = 0; i < n; i++) o[i] = FN(x[i]);                       \
    }

ARRAY_FN(nd_cpu_vexp_f32, exp1)

static inline float tanh1(float v) {
    float a = v < 0 ? -v : v;
    /* |x| < 0.625: x + x z P(z), z = x^2 */
    float z = v * v;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = __builtin_copysignf(v + v * z * p, v); /* (-0 + +0 would be +0) */
    /* else 1 - 2 / (e^2|x| + 1); past |x| = 20 it is 1 in float */
    float big = 1.0f - 2.0f / (exp1(2.0f * (a < 20.0f ? a : 20.0f)) + 1.0f);
    big = v < 0 ? -big : big;
    float r = a < 0.625f ? small : big;
    return v != v ? v : r;
}

ARRAY_FN(nd_cpu_vtanh_f32, tanh1)

/* GELU's tanh form (approximate = "tanh", GPT-2's gelu_new): 0.5 x (1 +
 * tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the registry's expression
 * (needle_ops.h) with tanh1 for libm's tanh */
static inline float gelu_tanh1(float v) {
    return 0.5f * v * (1.0f + tanh1(0.79788456080286535588f * (v + 0.044715f * v * v * v)));
}

ARRAY_FN(nd_cpu_vgelu_tanh_f32, gelu_tanh1)

ND_ISA_CLONES
void nd_cpu_vsigmoid_f32(float *o, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float e = exp1(v < 0 ? v : -v); /* e^-|x|, in (0, 1] */
        float r = (v >= 0 ? 1.0f : e) / (1.0f + e);
        o[i] = v != v ? v : r;
    }
}

/* erf(x)/x as a polynomial in z = x^2 over [0, 4] (|x| < 2): mpmath's
 * Chebyshev fit of degree 11 (chebyfit, 40 digits; relative error 5.6e-11
 * in double), evaluated in double as its even and odd halves in w = z^2
 * (two chains of 5 steps, not one of 11: the latency was the cost). */
static const double ERF_SMALL[12] = {
    1.1283791670588466, -0.37612638638896384, 0.11283788504003064, -0.026866021318734216,
    0.0052236118555670985, -0.00085430035995375712, 0.00012005743532526797,
    -1.4617245884003805e-05, 1.5153799995022345e-06, -1.2556504647148862e-07,
    7.2351069422968625e-09, -2.1053071648886082e-10};

/* |x| < 2: x p(x^2) (above); else 1 - erfc(|x|) with x's sign, erfc(a) =
 * t e^(-a^2 + Q(t)), t = 1 / (1 + a/2), Q the polynomial of Numerical
 * Recipes' erfcc (relative error 1.2e-7 on erfc, which is below 4.7e-3
 * there: far under half an ulp of erf). Within 1 ulp of float64's erf over
 * every float (checked exhaustively when written); erf(-0) = -0. */
/* erf1's value for |v| < 2 (its first branch alone) */
static inline float erf_small(float v) {
    double x = v, z = x * x, w = z * z;
    double e = ERF_SMALL[10], o = ERF_SMALL[11];
    e = e * w + ERF_SMALL[8]; o = o * w + ERF_SMALL[9];
    e = e * w + ERF_SMALL[6]; o = o * w + ERF_SMALL[7];
    e = e * w + ERF_SMALL[4]; o = o * w + ERF_SMALL[5];
    e = e * w + ERF_SMALL[2]; o = o * w + ERF_SMALL[3];
    e = e * w + ERF_SMALL[0]; o = o * w + ERF_SMALL[1];
    return (float)(x * (e + z * o));
}

static inline float erf1(float v) {
    float small = erf_small(v);
    float a = v < 0 ? -v : v;
    /* erf is 1 in float past 3.92, so |x| is clamped at 4 (every float >= 2
     * checked: the same values as clamping at 10). Clamped at 10, e^(q - a^2)
     * went below float's normal range from |x| = 9.4, and each such lane's
     * denormal arithmetic made erf and gelu 4-6x slower on inputs of scale 5
     * and more (a linear layer's output before its GELU, with large weights). */
    float ac = a < 4.0f ? a : 4.0f;
    float t = 1.0f / (1.0f + 0.5f * ac);
    float q = 0.17087277f;
    q = q * t - 0.82215223f;
    q = q * t + 1.48851587f;
    q = q * t - 1.13520398f;
    q = q * t + 0.27886807f;
    q = q * t - 0.18628806f;
    q = q * t + 0.09678418f;
    q = q * t + 0.37409196f;
    q = q * t + 1.00002368f;
    q = q * t - 1.26551223f;
    float big = 1.0f - t * exp1(q - ac * ac);
    big = v < 0 ? -big : big;
    float r = a < 2.0f ? small : big;
    return v != v ? v : r;
}

/* the registry's gelu, (T)0.5 * x * ((T)1 + erf(x * (T)0.70710678118654752440)),
 * in its order of operations, with the erf above */
static inline float gelu1(float v) { return 0.5f * v * (1.0f + erf1(v * 0.70710678118654752440f)); }
static inline float gelu_small(float v) {
    return 0.5f * v * (1.0f + erf_small(v * 0.70710678118654752440f));
}

/* erf and gelu a block of 16 at a time: where every argument of erf in the
 * block is below 2 in magnitude (all but the tails of a layer's activations)
 * only the polynomial runs; elsewhere both branches, as erf1. The same
 * values either way (erf_small is erf1's first branch), twice as fast on
 * BERT's feed-forward activations. A NaN fails the test: the full path. */
#define ERF_BLOCK 16
#define BLOCKED_FN(NAME, FULL, SMALL, SCALE)                                   \
    ND_ISA_CLONES                                                              \
    void NAME(float *o, const float *x, int64_t n) {                           \
        int64_t i = 0;                                                         \
        for (; i + ERF_BLOCK <= n; i += ERF_BLOCK) {                           \
            int small = 1;                                                     \
            for (int j = 0; j < ERF_BLOCK; j++) {                              \
                const float a = x[i + j] * (SCALE);                            \
                small &= (a < 2.0f) & (a > -2.0f);                             \
            }                                                                  \
            if (small) {                                                       \
                _Pragma("omp simd")                                            \
                for (int j = 0; j < ERF_BLOCK; j++) o[i + j] = SMALL(x[i + j]); \
            } else {                                                           \
                _Pragma("omp simd")                                            \
                for (int j = 0; j < ERF_BLOCK; j++) o[i + j] = FULL(x[i + j]);  \
            }                                                                  \
        }                                                                      \
        for (; i < n; i++) o[i] = FULL(x[i]);                                  \
    }

BLOCKED_FN(nd_cpu_verf_f32, erf1, erf_small, 1.0f)
BLOCKED_FN(nd_cpu_vgelu_f32, gelu1, gelu_small, 0.70710678118654752440f)
