/* cpu_vmath.c - float32 exp, tanh and sigmoid over arrays (cpu_vmath.h). */
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

__attribute__((target_clones("arch=x86-64-v3", "default")))
void nd_cpu_vexp_f32(float *o, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = exp1(x[i]);
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
void nd_cpu_vtanh_f32(float *o, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], a = v < 0 ? -v : v;
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
        o[i] = v != v ? v : r;
    }
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
void nd_cpu_vsigmoid_f32(float *o, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float e = exp1(v < 0 ? v : -v); /* e^-|x|, in (0, 1] */
        float r = (v >= 0 ? 1.0f : e) / (1.0f + e);
        o[i] = v != v ? v : r;
    }
}
