/* cpu_attention.c - dropout(softmax(scale * q k^T + mask)) v in one kernel,
 * and its backward (the backend's attention and attention_backward entries),
 * float32 and float64.
 *
 * Forward work items are (product, block of BQ queries). A block's scores
 * (BQ x S) are one GEMM into the thread's buffer, which stays in cache while
 * the scale, the mask, the softmax and the dropout run over it in place,
 * and a second GEMM multiplies them into v. The composition (scores, + mask,
 * softmax, dropout, then the product) made the (batch, heads, L, S) scores
 * and weights as whole tensors - 50 MB a layer for GPT-2 at 1024 tokens -
 * and passed over them four times. The sums run in a different order from
 * the composition's (the scale is applied to the scores, not to q), so
 * results agree with it to rounding (spec/nn_sequence_spec.lua).
 *
 * The forward keeps each row's log-sum-exp when a gradient is wanted; the
 * backward (FlashAttention's) remakes a block's weights from it, P = exp(s -
 * lse), instead of keeping the (L, S) weights, and with D_i = dO_i . O_i:
 *   dV += Pd^T dO    (Pd: P after dropout)
 *   dS  = P * (dropout(dO V^T) - D) * scale
 *   dQ  = dS K,  dK += dS^T Q
 * Its work items are whole products (dK and dV sum over every query block),
 * so a call with fewer products than threads leaves threads idle.
 *
 * Dropout draws each weight's keep from the Philox stream at the counter
 * F.dropout's rand() would use on the (B1, B2, L, S) weights, with the same
 * comparison and scaling (nd_attention_args), so a fused call and the
 * composed ops given the same counters keep the same weights; the forward
 * writes them to the keep tensor when there is one (a gradient is wanted)
 * and the backward reads them there. With the causal cut a block of
 * queries multiplies only the keys up to its last query (block_keys). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_gemm.h"
#include "cpu_kernels.h"
#include "cpu_vmath.h"

#define BQ 128 /* queries per block: BQ x S scores, 512 KB at S = 1024 */

/* C (m x n, row stride ldc) = A @ B, or += with acc; A's (i, k) at A[i *
 * a_sm + k * a_sk], B's (k, j) at B[k * b_sk + j * b_sn]: needle's GEMM, or
 * plain loops where this CPU has none (NEEDLE_GEMM=openblas, no x86-64
 * kernel) */
static void product_f32(int64_t m, int64_t n, int64_t kk, const float *A, int64_t a_sm, int64_t a_sk,
                        const float *B, int64_t b_sk, int64_t b_sn, float *C, int64_t ldc, bool acc) {
    if (m == 0 || n == 0) return;
    if (kk > 0 && nd_cpu_sgemm(m, n, kk, A, a_sm, a_sk, B, b_sk, b_sn, C, ldc, acc)) return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t k = 0; k < kk; k++) s += (double)A[i * a_sm + k * a_sk] * B[k * b_sk + j * b_sn];
            C[i * ldc + j] = acc ? C[i * ldc + j] + (float)s : (float)s;
        }
}

static void product_f64(int64_t m, int64_t n, int64_t kk, const double *A, int64_t a_sm, int64_t a_sk,
                        const double *B, int64_t b_sk, int64_t b_sn, double *C, int64_t ldc, bool acc) {
    /* (float64 attention is for checks - gradients by finite differences -
     * where plain loops do) */
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t k = 0; k < kk; k++) s += A[i * a_sm + k * a_sk] * B[k * b_sk + j * b_sn];
            C[i * ldc + j] = acc ? C[i * ldc + j] + s : s;
        }
}

static void exp_f32(float *row, int64_t n) { nd_cpu_vexp_f32(row, row, n); }

/* the keys a block of queries up to (not including) row `end` can reach:
 * with the causal cut those before it, the rest being -inf scores (zero
 * weights) whose products would be work for nothing */
static int64_t block_keys(bool causal, int64_t S, int64_t end) {
    return causal && end < S ? end : S;
}
static void exp_f64(double *row, int64_t n) {
    for (int64_t j = 0; j < n; j++) row[j] = exp(row[j]);
}

/* One dtype's kernels, T its element type, SFX the names' suffix (the two
 * differ only in the element type and the product and exp they call). */
#define ATTENTION_KERNELS(T, SFX)                                                                    \
    /* a row of scores in place: scaled, masked (an additive mask row with                          \
     * stride m_s, and the causal cut) */                                                           \
    static void mask_row_##SFX(T *row, int64_t S, int64_t i, T scale, const T *mrow, int64_t m_s,   \
                               bool causal) {                                                       \
        if (!mrow) {                                                                                \
            _Pragma("omp simd") for (int64_t j = 0; j < S; j++) row[j] *= scale;                    \
        } else if (m_s == 1) {                                                                      \
            _Pragma("omp simd") for (int64_t j = 0; j < S; j++) row[j] = row[j] * scale + mrow[j];  \
        } else {                                                                                    \
            for (int64_t j = 0; j < S; j++) row[j] = row[j] * scale + mrow[j * m_s];                \
        }                                                                                           \
        if (causal)                                                                                 \
            for (int64_t j = i + 1; j < S; j++) row[j] = -INFINITY;                                 \
    }                                                                                               \
    /* softmax in place (as nd.softmax: a row all -inf or holding a NaN is                          \
     * NaN), its log-sum-exp to *lse when lse; loops without branches or                            \
     * carried sums, so they vectorise */                                                           \
    static void softmax_row_##SFX(T *row, int64_t S, T *lse) {                                      \
        T mx = -INFINITY;                                                                           \
        int nan = 0;                                                                                \
        _Pragma("omp simd reduction(max : mx) reduction(| : nan)") for (int64_t j = 0; j < S; j++) { \
            mx = row[j] > mx ? row[j] : mx;                                                         \
            nan |= row[j] != row[j];                                                                \
        }                                                                                           \
        if (nan) mx = NAN; /* (a NaN score makes the whole row NaN, below) */                       \
        _Pragma("omp simd") for (int64_t j = 0; j < S; j++) row[j] -= mx;                           \
        exp_##SFX(row, S);                                                                          \
        T sum = 0;                                                                                  \
        _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < S; j++) sum += row[j];       \
        const T inv = (T)1 / sum;                                                                   \
        _Pragma("omp simd") for (int64_t j = 0; j < S; j++) row[j] *= inv;                          \
        if (lse) *lse = mx + log(sum);                                                              \
    }                                                                                               \
    /* F.dropout's x * keep * (1 / (1 - p)), in that order (NaN * 0 stays NaN) */                   \
    static void dropout_rows_##SFX(T *P, int64_t n, const unsigned char *keep, T inv) {             \
        _Pragma("omp simd") for (int64_t j = 0; j < n; j++) P[j] = P[j] * (T)keep[j] * inv;         \
    }                                                                                               \
                                                                                                    \
    static nd_status forward_##SFX(nd_tensor *out, nd_tensor *lse, nd_tensor *tkeep,               \
                                   const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,      \
                                   const nd_tensor *mask, const nd_attention_args *a) {             \
        const int64_t B2 = q->shape[1], B = q->shape[0] * B2, L = q->shape[2], E = q->shape[3];     \
        const int64_t S = k->shape[2], Ev = v->shape[3];                                            \
        T *O = (T *)nd_ptr(out), *LSE = lse ? (T *)nd_ptr(lse) : NULL;                              \
        const T *Q = (const T *)nd_ptr(q), *K = (const T *)nd_ptr(k), *V = (const T *)nd_ptr(v);    \
        const T *M = mask ? (const T *)nd_ptr(mask) : NULL;                                         \
        const int64_t *ms = mask ? mask->strides : NULL;                                            \
        const bool drop = a->dropout_p > 0;                                                         \
        const T inv_keep = (T)(1.0 / (1.0 - a->dropout_p)), scale = (T)a->scale;                    \
        const int64_t nblk = (L + BQ - 1) / BQ, items = B * nblk;                                   \
        int failed = 0;                                                                             \
        _Pragma("omp parallel num_threads(nd_cpu_threads()) if (items > 1 && B * L * S * (E + Ev) >= ND_PARALLEL_THRESHOLD)") \
        {                                                                                           \
            const int64_t buf = (L < BQ ? L : BQ) * S;                                              \
            T *P = malloc(sizeof(T) * (size_t)buf);                                                 \
            unsigned char *keep = drop && !tkeep ? malloc((size_t)buf) : NULL;                      \
            const bool ok = P && (!drop || tkeep || keep);                                          \
            if (!ok) {                                                                              \
                _Pragma("omp atomic write") failed = 1;                                             \
            }                                                                                       \
            _Pragma("omp for schedule(static)") for (int64_t t = 0; t < items; t++) {               \
                if (!ok) continue;                                                                  \
                const int64_t b = t / nblk, i0 = (t % nblk) * BQ, nq = L - i0 < BQ ? L - i0 : BQ;   \
                const int64_t b1 = b / B2, b2 = b % B2;                                             \
                const T *Qb = Q + b1 * q->strides[0] + b2 * q->strides[1] + i0 * q->strides[2];     \
                const T *Kb = K + b1 * k->strides[0] + b2 * k->strides[1];                          \
                const T *Vb = V + b1 * v->strides[0] + b2 * v->strides[1];                          \
                const int64_t SE = block_keys(a->causal, S, i0 + nq);                               \
                product_##SFX(nq, SE, E, Qb, q->strides[2], 1, Kb, 1, k->strides[2], P, S, false);  \
                /* the keep tensor when the backward reads it, else the thread's buffer */          \
                unsigned char *kb = tkeep ? (unsigned char *)nd_ptr(tkeep) + (b * L + i0) * S : keep; \
                for (int64_t r = 0; r < nq; r++) {                                                  \
                    const int64_t i = i0 + r;                                                       \
                    const T *mrow = M ? M + b1 * ms[0] + b2 * ms[1] + i * ms[2] : NULL;             \
                    mask_row_##SFX(P + r * S, SE, i, scale, mrow, M ? ms[3] : 0, a->causal);        \
                    softmax_row_##SFX(P + r * S, SE, LSE ? LSE + b * L + i : NULL);                 \
                    if (drop) {                                                                     \
                        nd_cpu_uniform_below(a->seed, a->offset + (uint64_t)((b * L + i) * S), SE,  \
                                             out->dtype, 1.0 - a->dropout_p, kb + r * S);           \
                        dropout_rows_##SFX(P + r * S, SE, kb + r * S, inv_keep);                    \
                        /* (the keys past the cut: dropped, so that every keep is written) */       \
                        if (tkeep && SE < S) memset(kb + r * S + SE, 0, (size_t)(S - SE));          \
                    }                                                                               \
                }                                                                                   \
                T *Ob = O + b1 * out->strides[0] + b2 * out->strides[1] + i0 * out->strides[2];     \
                product_##SFX(nq, Ev, SE, P, S, 1, Vb, v->strides[2], 1, Ob, out->strides[2], false); \
            }                                                                                       \
            free(P);                                                                                \
            free(keep);                                                                             \
        }                                                                                           \
        if (failed)                                                                                 \
            return nd_fail(ND_ERR_MEMORY, "attention: out of memory for %lld scores",               \
                           (long long)((L < BQ ? L : BQ) * S));                                     \
        return ND_OK;                                                                               \
    }                                                                                               \
                                                                                                    \
    /* one product's gradients (the header's formulas), block by block of                          \
     * queries; P, dP: BQ x S buffers; tkeep the forward's keeps when dropping */                  \
    static void backward_product_##SFX(int64_t b, T *dq, T *dk, T *dv, const nd_tensor *tdq,        \
                                       const nd_tensor *tdk, const nd_tensor *tdv,                  \
                                       const nd_tensor *g, const nd_tensor *q, const nd_tensor *k,  \
                                       const nd_tensor *v, const nd_tensor *mask,                   \
                                       const nd_tensor *out, const T *LSE,                          \
                                       const unsigned char *tkeep, const nd_attention_args *a,      \
                                       T *P, T *dP) {                                               \
        const int64_t B2 = q->shape[1], L = q->shape[2], E = q->shape[3];                           \
        const int64_t S = k->shape[2], Ev = v->shape[3], b1 = b / B2, b2 = b % B2;                  \
        const T *Qb = (const T *)nd_ptr(q) + b1 * q->strides[0] + b2 * q->strides[1];               \
        const T *Kb = (const T *)nd_ptr(k) + b1 * k->strides[0] + b2 * k->strides[1];               \
        const T *Vb = (const T *)nd_ptr(v) + b1 * v->strides[0] + b2 * v->strides[1];               \
        const T *Gb = (const T *)nd_ptr(g) + b1 * g->strides[0] + b2 * g->strides[1];               \
        const T *Ob = (const T *)nd_ptr(out) + b1 * out->strides[0] + b2 * out->strides[1];         \
        const T *M = mask ? (const T *)nd_ptr(mask) : NULL;                                         \
        const int64_t *ms = mask ? mask->strides : NULL;                                            \
        const int64_t qs = q->strides[2], ks = k->strides[2], vs = v->strides[2];                   \
        const int64_t gs = g->strides[2], os = out->strides[2];                                     \
        T *dqb = dq ? dq + b1 * tdq->strides[0] + b2 * tdq->strides[1] : NULL;                      \
        T *dkb = dk ? dk + b1 * tdk->strides[0] + b2 * tdk->strides[1] : NULL;                      \
        T *dvb = dv ? dv + b1 * tdv->strides[0] + b2 * tdv->strides[1] : NULL;                      \
        const int64_t dks = dk ? tdk->strides[2] : 0, dvs = dv ? tdv->strides[2] : 0;               \
        const int64_t dqs = dq ? tdq->strides[2] : 0;                                               \
        const bool drop = a->dropout_p > 0;                                                         \
        const T inv_keep = (T)(1.0 / (1.0 - a->dropout_p)), scale = (T)a->scale;                    \
        if (L == 0 || S == 0) { /* no weights: what exists of the gradients is 0 */                 \
            for (int64_t i = 0; dqb && i < L; i++) memset(dqb + i * dqs, 0, sizeof(T) * (size_t)E); \
            for (int64_t j = 0; dkb && j < S; j++) memset(dkb + j * dks, 0, sizeof(T) * (size_t)E); \
            for (int64_t j = 0; dvb && j < S; j++) memset(dvb + j * dvs, 0, sizeof(T) * (size_t)Ev); \
            return;                                                                                 \
        }                                                                                           \
        /* causal: a block reaches the keys up to its last query only, so dK and                   \
         * dV start at 0 and every block adds into them */                                          \
        if (a->causal) {                                                                            \
            for (int64_t j = 0; dkb && j < S; j++) memset(dkb + j * dks, 0, sizeof(T) * (size_t)E); \
            for (int64_t j = 0; dvb && j < S; j++) memset(dvb + j * dvs, 0, sizeof(T) * (size_t)Ev); \
        }                                                                                           \
        for (int64_t i0 = 0; i0 < L; i0 += BQ) {                                                    \
            const int64_t nq = L - i0 < BQ ? L - i0 : BQ, SE = block_keys(a->causal, S, i0 + nq);   \
            const bool acc = a->causal || i0 > 0;                                                   \
            const T *Gi = Gb + i0 * gs, *Qi = Qb + i0 * qs;                                         \
            const unsigned char *keep = drop ? tkeep + (b * L + i0) * S : NULL;                     \
            /* the block's weights again: P = exp(scale s + mask - lse) */                          \
            product_##SFX(nq, SE, E, Qi, qs, 1, Kb, 1, ks, P, S, false);                            \
            for (int64_t r = 0; r < nq; r++) {                                                      \
                const int64_t i = i0 + r;                                                           \
                const T *mrow = M ? M + b1 * ms[0] + b2 * ms[1] + i * ms[2] : NULL;                 \
                T *row = P + r * S;                                                                 \
                mask_row_##SFX(row, SE, i, scale, mrow, M ? ms[3] : 0, a->causal);                  \
                const T l = LSE[b * L + i];                                                         \
                _Pragma("omp simd") for (int64_t j = 0; j < SE; j++) row[j] -= l;                   \
                exp_##SFX(row, SE);                                                                 \
            }                                                                                       \
            if (dvb) { /* dV += Pd^T dO (Pd in dP's buffer for the while) */                        \
                const T *Pd = P;                                                                    \
                if (drop) {                                                                         \
                    for (int64_t r = 0; r < nq; r++) {                                              \
                        memcpy(dP + r * S, P + r * S, sizeof(T) * (size_t)SE);                      \
                        dropout_rows_##SFX(dP + r * S, SE, keep + r * S, inv_keep);                 \
                    }                                                                               \
                    Pd = dP;                                                                        \
                }                                                                                   \
                product_##SFX(SE, Ev, nq, Pd, 1, S, Gi, gs, 1, dvb, dvs, acc);                      \
            }                                                                                       \
            if (!dqb && !dkb) continue;                                                             \
            product_##SFX(nq, SE, Ev, Gi, gs, 1, Vb, 1, vs, dP, S, false); /* dO V^T */             \
            for (int64_t r = 0; r < nq; r++) { /* dS into P's buffer */                             \
                const T *gr = Gi + r * gs, *orow = Ob + (i0 + r) * os;                              \
                T d = 0;                                                                            \
                _Pragma("omp simd reduction(+ : d)") for (int64_t e = 0; e < Ev; e++) d += gr[e] * orow[e]; \
                T *pr = P + r * S, *dpr = dP + r * S;                                               \
                if (drop) dropout_rows_##SFX(dpr, SE, keep + r * S, inv_keep);                      \
                _Pragma("omp simd") for (int64_t j = 0; j < SE; j++) pr[j] = pr[j] * (dpr[j] - d) * scale; \
            }                                                                                       \
            if (dqb) product_##SFX(nq, E, SE, P, S, 1, Kb, ks, 1, dqb + i0 * dqs, dqs, false);      \
            if (dkb) product_##SFX(SE, E, nq, P, 1, S, Qi, qs, 1, dkb, dks, acc);                   \
        }                                                                                           \
    }                                                                                               \
                                                                                                    \
    static nd_status backward_##SFX(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g, \
                                    const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,     \
                                    const nd_tensor *mask, const nd_tensor *out,                    \
                                    const nd_tensor *lse, const nd_tensor *tkeep,                   \
                                    const nd_attention_args *a) {                                   \
        const int64_t B = q->shape[0] * q->shape[1], L = q->shape[2], E = q->shape[3];              \
        const int64_t S = k->shape[2], Ev = v->shape[3];                                            \
        T *DQ = dq ? (T *)nd_ptr(dq) : NULL, *DK = dk ? (T *)nd_ptr(dk) : NULL;                     \
        T *DV = dv ? (T *)nd_ptr(dv) : NULL;                                                        \
        const T *LSE = (const T *)nd_ptr(lse);                                                      \
        const unsigned char *KEEP = tkeep ? (const unsigned char *)nd_ptr(tkeep) : NULL;            \
        if (a->dropout_p > 0 && !KEEP) /* (backend.h: the forward's keeps come with dropout) */     \
            return nd_fail(ND_ERR_INTERNAL, "attention: a backward with dropout needs the forward's keeps"); \
        const int64_t buf = (L < BQ ? L : BQ) * S;                                                  \
        int failed = 0;                                                                             \
        _Pragma("omp parallel num_threads(nd_cpu_threads()) if (B > 1 && B * L * S * (E + Ev) >= ND_PARALLEL_THRESHOLD)") \
        {                                                                                           \
            T *P = malloc(sizeof(T) * (size_t)(2 * buf + 1));                                       \
            const bool ok = P != NULL;                                                              \
            if (!ok) {                                                                              \
                _Pragma("omp atomic write") failed = 1;                                             \
            }                                                                                       \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < B; b++) {                   \
                if (ok)                                                                             \
                    backward_product_##SFX(b, DQ, DK, DV, dq, dk, dv, g, q, k, v, mask, out, LSE,   \
                                           KEEP, a, P, P ? P + buf : NULL);                         \
            }                                                                                       \
            free(P);                                                                                \
        }                                                                                           \
        if (failed)                                                                                 \
            return nd_fail(ND_ERR_MEMORY, "attention: out of memory for 2 x %lld weights in the "   \
                           "backward", (long long)buf);                                             \
        return ND_OK;                                                                               \
    }

ATTENTION_KERNELS(float, f32)
ATTENTION_KERNELS(double, f64)

nd_status nd_cpu_attention(nd_tensor *out, nd_tensor *lse, nd_tensor *keep, const nd_tensor *q,
                           const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                           const nd_attention_args *a) {
    if (q->dtype != ND_FLOAT32 && q->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "attention: no cpu kernel for %s", nd_dtype_name(q->dtype));
    const int64_t B = q->shape[0] * q->shape[1], L = q->shape[2], Ev = v->shape[3], S = k->shape[2];
    if (B == 0 || L == 0) return ND_OK;
    if (S == 0) { /* no keys: an empty weighted sum (out is dense, in some order); lse -inf */
        if (Ev > 0) memset(nd_ptr(out), 0, nd_dtype_size(q->dtype) * (size_t)(B * L * Ev));
        for (int64_t i = 0; lse && i < B * L; i++) {
            if (q->dtype == ND_FLOAT32) ((float *)nd_ptr(lse))[i] = -INFINITY;
            else ((double *)nd_ptr(lse))[i] = -INFINITY;
        }
        return ND_OK;
    }
    return q->dtype == ND_FLOAT32 ? forward_f32(out, lse, keep, q, k, v, mask, a)
                                  : forward_f64(out, lse, keep, q, k, v, mask, a);
}

nd_status nd_cpu_attention_backward(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                    const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                    const nd_tensor *mask, const nd_tensor *out,
                                    const nd_tensor *lse, const nd_tensor *keep,
                                    const nd_attention_args *a) {
    if (q->dtype != ND_FLOAT32 && q->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "attention: no cpu backward kernel for %s", nd_dtype_name(q->dtype));
    return q->dtype == ND_FLOAT32 ? backward_f32(dq, dk, dv, g, q, k, v, mask, out, lse, keep, a)
                                  : backward_f64(dq, dk, dv, g, q, k, v, mask, out, lse, keep, a);
}
