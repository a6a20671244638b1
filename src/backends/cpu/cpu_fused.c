/* cpu_fused.c - the fused linear kernel: x @ w^T whose GEMM epilogue adds
 * the bias and applies the activation (nd.nn.fuse puts FusedLinear in place
 * of Linear(+BatchNorm1d)+ReLU, with the BatchNorm folded into the weights;
 * nd.linear uses it with no activation). The fused convolution is
 * cpu_conv_gemm.c's.
 *
 * float32 on needle's GEMM applies act(. + b) to each tile as it is stored
 * (cpu_gemm.c). Otherwise (float64, OpenBLAS):
 * out (M, O) = x (M, K) @ w^T, then one pass of act(out + b). (The other
 * order - out initialised to the bias, GEMM with beta = 1, then the
 * activation pass - costs one more pass over out when there is an
 * activation, and the same when there is none.) BLAS is never called
 * inside an OpenMP region (ARCHITECTURE.md). */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"
#include "cpu_gemm.h"

/* float32 reaches BLAS only where needle's GEMM declined (no kernel for
 * this CPU, or no memory for packing): nd_cpu_linear_fused tried it first */
static inline void gemm_nt(int M, int N, int K, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
}
static inline void gemm_nt_d(int M, int N, int K, const double *A, const double *B, double *C) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0, A, K, B, K, 0.0, C, N);
}

#define LINEAR_FUSED(T, GEMM)                                                                  \
    do {                                                                                       \
        const T *X = (const T *)nd_ptr(x), *Wt = (const T *)nd_ptr(w);                         \
        const T *B = b ? (const T *)nd_ptr(b) : NULL;                                          \
        T *OUT = (T *)nd_ptr(out);                                                             \
        GEMM((int)M, (int)O, (int)K, X, Wt, OUT);                                              \
        if (!B && !relu) break;                                                                \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (M * O >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t m = 0; m < M; m++) {                                                      \
            T *row = OUT + m * O;                                                              \
            if (B && relu) {                                                                   \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) {                                              \
                    T v = row[o] + B[o];                                                       \
                    row[o] = !(v <= (T)0) ? v : (T)0;                                          \
                }                                                                              \
            } else if (B) {                                                                    \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) row[o] += B[o];                                \
            } else {                                                                           \
                _Pragma("omp simd")                                                            \
                for (int64_t o = 0; o < O; o++) row[o] = !(row[o] <= (T)0) ? row[o] : (T)0;        \
            }                                                                                  \
        }                                                                                      \
    } while (0)

nd_status nd_cpu_finish_layer(nd_tensor *out, nd_activation act, const nd_tensor *res) {
    if (act == ND_ACT_GELU) ND_TRY(nd_cpu_unary(ND_UNARY_gelu, out, out));
    /* one add per element, as the add the residual replaces rounded */
    return res ? nd_cpu_binary(ND_BINARY_add, out, out, res) : ND_OK;
}

/* Joined layers keep their bits on needle's own float32 kernels: its GEMM
 * sums every element alike, its small-M kernel sums whole blocks of 4
 * weight rows alike (the rows left over past a multiple of 4 go another
 * way). BLAS (float64; float32 without those kernels) may follow the width,
 * and so does the bfloat16 GEMM's choice: no joins then. */
int nd_cpu_linear_join_align(nd_dtype dt) {
    /* (at float32 matmul precision "medium" the kernel follows the width:
     * a product narrower than 64 stays float32, a joined one may not) */
    if (nd_cpu_gemm_bf16_active()) return 0;
    return dt == ND_FLOAT32 && nd_cpu_small_linear() && strcmp(nd_cpu_gemm_kernel(), "openblas") != 0 ? 4 : 0;
}

/* nd_cpu_linear_fused with a half weight (O, K) converted to a float32 copy
 * first (exact), for when neither the autocast cache nor the half-weight
 * kernel takes it (nd_cpu_linear_half_weight promised one would; this keeps
 * the promise safe) */
static nd_status linear_via_float_copy(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                                       const nd_tensor *b, nd_activation act, const nd_tensor *res) {
    nd_tensor *wf = NULL;
    ND_TRY(nd_empty_on(nd_get_device(w), w->shape, w->ndim, ND_FLOAT32, &wf));
    const uint16_t *src = (const uint16_t *)nd_ptr(w);
    float *dst = (float *)nd_ptr(wf);
    const int64_t n = nd_numel(w);
    const bool bf16 = w->dtype == ND_BFLOAT16;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16 ? nd_bf16_to_float(src[i]) : nd_half_to_float(src[i]);
    nd_status st = nd_cpu_linear_fused(out, x, wf, b, act, res);
    nd_release(wf);
    return st;
}

nd_status nd_cpu_linear_fused(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, nd_activation act, const nd_tensor *res) {
    const int64_t M = x->shape[0], K = x->shape[1], O = w->shape[0];
    const bool relu = act == ND_ACT_RELU; /* (gelu: after the kernel, nd_cpu_finish_layer) */
    if (M == 0 || O == 0) return ND_OK;
    if (K == 0) /* op_fused.c runs the composed ops for these */
        return nd_fail(ND_ERR_ARG, "fused_linear: no input features");
    if (M > INT_MAX || K > INT_MAX || O > INT_MAX)
        return nd_fail(ND_ERR_ARG, "fused_linear: GEMM dims M=%lld N=%lld K=%lld exceed BLAS's int "
                       "range", (long long)M, (long long)O, (long long)K);
    if (x->dtype == ND_FLOAT32) { /* inside nd.autocast: the weight packed to bfloat16 once per scope */
        const nd_bf16_packed_b *pw = nd_cpu_bf16_weight(w);
        if (pw && nd_cpu_sgemm_bias_act_prepacked(M, (const float *)nd_ptr(x), K, 1, pw, (float *)nd_ptr(out), O,
                                                  b ? (const float *)nd_ptr(b) : NULL, act,
                                                  res ? (const float *)nd_ptr(res) : NULL, O))
            return ND_OK;
        /* a half weight the cache did not take, where the float32 copy would
         * run on bfloat16 products: through that copy, for its bits */
        if (w->dtype != x->dtype && nd_cpu_gemm_bf16_active() &&
            (nd_autocast_active() || nd_cpu_gemm_bf16_for(M, O)))
            return linear_via_float_copy(out, x, w, b, act, res);
    }
    if (nd_cpu_linear_small(out, x, w, b, relu)) /* a few rows, float32 (or a half w: linear_half_weight) */
        return nd_cpu_finish_layer(out, act, res);
    if (w->dtype != x->dtype) /* a half w neither kernel above took: through a float32 copy */
        return linear_via_float_copy(out, x, w, b, act, res);
    if (x->dtype == ND_FLOAT32 &&
        nd_cpu_sgemm_bias_act(M, O, K, (const float *)nd_ptr(x), K, 1, (const float *)nd_ptr(w), 1, K,
                              (float *)nd_ptr(out), O, b ? (const float *)nd_ptr(b) : NULL, act,
                              res ? (const float *)nd_ptr(res) : NULL, O))
        return ND_OK; /* needle's GEMM, the epilogue on each tile in cache */
    if (x->dtype == ND_FLOAT32) LINEAR_FUSED(float, gemm_nt);
    else if (x->dtype == ND_FLOAT64) LINEAR_FUSED(double, gemm_nt_d);
    else return nd_fail(ND_ERR_DTYPE, "fused_linear: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return nd_cpu_finish_layer(out, act, res);
}
