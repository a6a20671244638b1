/* cpu_attention.c - softmax(scale * q k^T + mask) v in one kernel (the
 * backend's attention entry, for F.scaled_dot_product_attention when no
 * gradient is wanted), float32.
 *
 * Work items are (product, block of BQ queries). A block's scores (BQ x S)
 * are one GEMM into the thread's buffer, which stays in cache while the
 * scale, the mask and the softmax run over it in place, and a second GEMM
 * multiplies them into v. The composition (scores, + mask, softmax, then
 * the product) made the (batch, heads, L, S) scores and weights as whole
 * tensors - 50 MB a layer for GPT-2 at 1024 tokens - and passed over them
 * four times. The sums run in a different order from the composition's
 * (the scale is applied to the scores, not to q), so results agree with it
 * to float32 rounding (spec/nn_sequence_spec.lua). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_gemm.h"
#include "cpu_kernels.h"
#include "cpu_vmath.h"

#define BQ 128 /* queries per work item: BQ x S scores, 512 KB at S = 1024 */

/* C (m x n, row stride ldc) = A (m x kk, rows lda) @ B, B's (k, j) at
 * B[k * b_sk + j * b_sn]: needle's GEMM, or plain loops where this CPU has
 * none (NEEDLE_GEMM=openblas, no x86-64 kernel) */
static void product(int64_t m, int64_t n, int64_t kk, const float *A, int64_t lda, const float *B,
                    int64_t b_sk, int64_t b_sn, float *C, int64_t ldc) {
    if (nd_cpu_sgemm(m, n, kk, A, lda, 1, B, b_sk, b_sn, C, ldc, false)) return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t k = 0; k < kk; k++) s += (double)A[i * lda + k] * B[k * b_sk + j * b_sn];
            C[i * ldc + j] = (float)s;
        }
}

/* one row of scores in place: scaled, masked, softmaxed (as nd.softmax: a
 * row whose scores are all -inf, or that holds a NaN, is NaN). Loops
 * without branches or carried sums, so they vectorise: the reductions as
 * omp simd reductions (their order is free), the causal cut as a fill. */
static void softmax_row(float *row, int64_t S, int64_t i, float scale, const float *mrow,
                        int64_t m_s, bool causal) {
    if (!mrow) {
#pragma omp simd
        for (int64_t j = 0; j < S; j++) row[j] *= scale;
    } else if (m_s == 1) {
#pragma omp simd
        for (int64_t j = 0; j < S; j++) row[j] = row[j] * scale + mrow[j];
    } else {
        for (int64_t j = 0; j < S; j++) row[j] = row[j] * scale + mrow[j * m_s];
    }
    if (causal)
        for (int64_t j = i + 1; j < S; j++) row[j] = -INFINITY;
    float mx = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int64_t j = 0; j < S; j++) {
        mx = row[j] > mx ? row[j] : mx;
        nan |= row[j] != row[j];
    }
    if (nan) mx = NAN; /* (a NaN score makes the whole row NaN, below) */
#pragma omp simd
    for (int64_t j = 0; j < S; j++) row[j] -= mx;
    nd_cpu_vexp_f32(row, row, S);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < S; j++) sum += row[j];
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < S; j++) row[j] *= inv;
}

nd_status nd_cpu_attention(nd_tensor *out, const nd_tensor *q, const nd_tensor *k,
                           const nd_tensor *v, const nd_tensor *mask, double scale, bool causal) {
    if (q->dtype != ND_FLOAT32)
        return nd_fail(ND_ERR_DTYPE, "attention: no cpu kernel for %s", nd_dtype_name(q->dtype));
    /* (B1, B2, L, E) etc.: q, k, v and out with unit-stride rows, the mask
     * any strides */
    const int64_t B2 = q->shape[1], B = q->shape[0] * B2, L = q->shape[2], E = q->shape[3];
    const int64_t S = k->shape[2], Ev = v->shape[3];
    if (B == 0 || L == 0 || Ev == 0) return ND_OK;
    float *O = (float *)nd_ptr(out);
    if (S == 0) { /* no keys: an empty weighted sum (out is dense, in some order) */
        memset(O, 0, sizeof(float) * (size_t)(B * L * Ev));
        return ND_OK;
    }
    const float *Q = (const float *)nd_ptr(q), *K = (const float *)nd_ptr(k);
    const float *V = (const float *)nd_ptr(v), *M = mask ? (const float *)nd_ptr(mask) : NULL;
    const int64_t *ms = mask ? mask->strides : NULL;
    const int64_t nblk = (L + BQ - 1) / BQ, items = B * nblk;
    int failed = 0;
#pragma omp parallel num_threads(nd_cpu_threads()) if (items > 1 && B * L * S * (E + Ev) >= ND_PARALLEL_THRESHOLD)
    {
        float *P = malloc(sizeof(float) * (size_t)(BQ * S));
        if (!P) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < items; t++) {
            if (!P) continue;
            const int64_t b = t / nblk, i0 = (t % nblk) * BQ, nq = L - i0 < BQ ? L - i0 : BQ;
            const int64_t b1 = b / B2, b2 = b % B2;
            const float *Qb = Q + b1 * q->strides[0] + b2 * q->strides[1] + i0 * q->strides[2];
            const float *Kb = K + b1 * k->strides[0] + b2 * k->strides[1];
            const float *Vb = V + b1 * v->strides[0] + b2 * v->strides[1];
            product(nq, S, E, Qb, q->strides[2], Kb, 1, k->strides[2], P, S);
            for (int64_t r = 0; r < nq; r++) {
                const int64_t i = i0 + r;
                const float *mrow = M ? M + (b / B2) * ms[0] + (b % B2) * ms[1] + i * ms[2] : NULL;
                softmax_row(P + r * S, S, i, (float)scale, mrow, M ? ms[3] : 0, causal);
            }
            float *Ob = O + b1 * out->strides[0] + b2 * out->strides[1] + i0 * out->strides[2];
            product(nq, Ev, S, P, S, Vb, v->strides[2], 1, Ob, out->strides[2]);
        }
        free(P);
    }
    if (failed) return nd_fail(ND_ERR_MEMORY, "attention: out of memory for %lld scores",
                               (long long)(BQ * S));
    return ND_OK;
}
