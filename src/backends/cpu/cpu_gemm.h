/* cpu_gemm.h - needle's own float32 GEMM for x86-64 (cpu_gemm.c). */
#ifndef ND_CPU_GEMM_H
#define ND_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>
#include "needle.h"

/* The threads this thread's products take: nd_cpu_threads(), at most
 * nd.compile's hint's (nd_cpu_gemm_hint, cpu_kernels.h). */
int nd_cpu_gemm_threads(void);

/* C (M x N, row stride ldc) = A @ B, or with accumulate C += A @ B; A's
 * element (i, k) at A[i * a_sm + k * a_sk], B's (k, j) at B[k * b_sk +
 * j * b_sn] (any strides). False, with C untouched, when this CPU has no
 * kernel (or NEEDLE_GEMM=openblas) or memory for packing ran out: the
 * caller uses BLAS. */
bool nd_cpu_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk,
                  const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc,
                  bool accumulate);

/* nd_cpu_sgemm, with the bfloat16 kernel only for products of at least
 * min_madds multiply-adds (below, the float32 kernel whatever the
 * precision): for callers whose operands change every call, where packing
 * them to bfloat16 costs more than smaller products save (convolutions,
 * cpu_conv_plan.h's ND_CONV_BF16_MIN_MADDS) */
bool nd_cpu_sgemm_bf16_from(int64_t min_madds, int64_t M, int64_t N, int64_t K, const float *A,
                             int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                             float *C, int64_t ldc, bool accumulate);

/* C += A @ B bit for bit as nd_cpu_sgemm's product followed by one add per
 * element (C[i,j] + p[i,j]), for nd.compile's accumulating GEMM: 1 done;
 * 0 not done, C untouched (no kernel, or K over one K block, whose partial
 * sums would be added into C one at a time); -1 memory for packing ran
 * out part-way, C partly updated. */
int nd_cpu_sgemm_add(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm, int64_t a_sk,
                     const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc);

/* C = act(A @ B + bias) + res with bias (N values, or NULL) added, the
 * activation applied (as nd.relu / nd.gelu compute it: the same bits) and
 * the residual res (M x N, row stride ldr, or NULL) added to each tile as
 * its last K block is stored, while it is in cache: the fused linear's
 * epilogue without a pass over C. */
bool nd_cpu_sgemm_bias_act(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_sm,
                           int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn, float *C,
                           int64_t ldc, const float *bias, nd_activation act, const float *res,
                           int64_t ldr);

/* batch products C + c_off[i] = (A + a_off[i]) @ (B + b_off[i]), each as
 * above (offsets in elements), spread over the threads by product or within
 * each; false (some C may be written) when nd_cpu_sgemm would be. */
bool nd_cpu_sgemm_batched(int64_t batch, const int64_t *a_off, const int64_t *b_off,
                          const int64_t *c_off, int64_t M, int64_t N, int64_t K, const float *A,
                          int64_t a_sm, int64_t a_sk, const float *B, int64_t b_sk, int64_t b_sn,
                          float *C, int64_t ldc);

/* B (K x N, any strides) packed whole for the bfloat16 kernel, for products
 * that reuse it (a linear layer's weight inside nd.autocast,
 * cpu_bf16_weights.c): NULL without AVX512_BF16 or memory. The prepacked
 * product is the bfloat16 kernel's, bit for bit as if B were packed on the
 * call (any M: the caller chose the kernel). */
typedef struct nd_bf16_packed_b nd_bf16_packed_b;
nd_bf16_packed_b *nd_cpu_bf16_pack_b(int64_t K, int64_t N, const float *B, int64_t b_sk, int64_t b_sn);
/* the same for B = w^T, w (N x K, rows ldw apart) a bfloat16 weight: its
 * values go in as they are */
nd_bf16_packed_b *nd_cpu_bf16_pack_weight_bf16(int64_t K, int64_t N, const uint16_t *w, int64_t ldw);
size_t nd_cpu_bf16_packed_bytes(const nd_bf16_packed_b *pb);
void nd_cpu_bf16_packed_free(nd_bf16_packed_b *pb);
/* A linear layer's weight (O x K, contiguous float32 or bfloat16) packed as
 * B = w^T, cached for the nd.autocast scope (cpu_bf16_weights.c); NULL when
 * not in one. */
const nd_bf16_packed_b *nd_cpu_bf16_weight(const nd_tensor *w);
bool nd_cpu_sgemm_bias_act_prepacked(int64_t M, const float *A, int64_t a_sm, int64_t a_sk,
                                     const nd_bf16_packed_b *pb, float *C, int64_t ldc, const float *bias,
                                     nd_activation act, const float *res, int64_t ldr);

#endif
