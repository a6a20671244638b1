/* cpu_math.h - small math helpers shared by CPU kernels. */
#ifndef ND_CPU_MATH_H
#define ND_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* Put before a hot loop's function: GCC builds it for AVX-512
 * (x86-64-v4), AVX2 + FMA (x86-64-v3) and baseline x86-64, and picks the
 * clone from cpuid at load time. ISA levels, not CPU models: GCC
 * dispatches an arch=<cpu> clone only on that very model (see
 * cpu_softmax.c). Elsewhere it expands to nothing. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ND_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ND_ISA_CLONES
#endif

/* expf as a branch-free polynomial (Cephes' expf, about 1 ulp) that the
 * compiler vectorises, unlike libm's expf (needs -fno-trapping-math, which
 * the build sets). Below the underflow cutoff it returns exactly 0, so
 * masked (-inf) entries get exactly zero weight. */
/* The shared core: x = n ln2 + r (n = round(x / ln2) by the 1.5 * 2^23
 * trick, no rint call), e^r by Cephes' polynomial; *fn = n. For x in
 * Cephes' range; cpu_vmath.c's exp applies 2^n in two steps for denormals. */
static inline float exp_reduced(float x, float *fn) {
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *fn = n;
    return p * r * r + r + 1.0f;
}

static inline float exp_poly(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365447504019f;
    float xc = x > hi ? hi : (x < lo ? lo : x);
    float fn;
    float e = exp_reduced(xc, &fn);
    /* 2^n from n's bits in n + 1.5 * 2^23 (0x4B400000 + n), in unsigned
     * arithmetic: a NaN x (its n NaN) gives some scale and a NaN e, never the
     * undefined conversion of a NaN to int32 */
    float shifted = fn + 12582912.0f;
    uint32_t nbits;
    memcpy(&nbits, &shifted, sizeof nbits);
    uint32_t bits = (nbits - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    e *= scale;
    return x < lo ? 0.0f : e;
}

#endif
