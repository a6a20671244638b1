/* cpu_avx2.h - what the run-time chosen float32 AVX2 + FMA kernels
 * (cpu_linear_small.c, cpu_conv_packed.c) share. */
#ifndef ND_CPU_AVX2_H
#define ND_CPU_AVX2_H

#include <stdbool.h>

/* Whether such a kernel may run: the CPU has AVX2 and FMA, and off_env (a
 * switch for comparisons with the BLAS path) is unset, empty or "0". The
 * answer is kept in *cache (start it at -1), so each is read once; a benign
 * race, every thread computes the same value. */
bool nd_cpu_avx2_enabled(const char *off_env, int *cache);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ND_HAVE_AVX2_KERNELS 1

/* [sum(a), sum(b), sum(c), sum(d)] */
__attribute__((target("avx2,fma"))) static inline __m128 nd_hsum4(__m256 a, __m256 b, __m256 c,
                                                                   __m256 d) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
#endif

#endif
