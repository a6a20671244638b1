/* cpu_gemm.h - needle's own float32 GEMM for x86-64 (cpu_gemm.c). */
#ifndef ND_CPU_GEMM_H
#define ND_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

/* C (M x N, row stride ldc) = A @ B, or with accumulate C += A @ B; A's
 * element (i, k) at A[i * a_sm + k * a_sk], B's (k, j) at B[k * b_sk +
 * j * b_sn] (any strides). False, with C untouched, when this CPU has no
 * kernel (or NEEDLE_GEMM=openblas) or memory for packing ran out: the
 * caller uses BLAS. */
bool nd_cpu_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk,
                  const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc,
                  bool accumulate);

#endif
