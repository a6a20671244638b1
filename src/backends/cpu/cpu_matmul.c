/* cpu_matmul.c - (batched) matrix multiply: float32 on needle's own GEMM
 * (cpu_gemm.c) where the CPU has a kernel for it, float64 (and float32
 * otherwise) on OpenBLAS, other dtypes on a plain loop.
 *
 * Strided operands go to cblas_?gemm as they are: a matrix whose rows or
 * whose columns are unit-stride is passed with its leading dimension and a
 * transpose flag, so x:t() costs no copy. Only layouts BLAS cannot describe
 * (both strides non-unit, broadcast or negative strides) are copied first. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"
#include "cpu_gemm.h"

typedef struct { CBLAS_TRANSPOSE trans; int64_t ld; } blas_view;

/* Can a rows x cols matrix with element strides (sr, sc) be a BLAS operand? */
static bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, blas_view *v) {
    int64_t mc = cols > 1 ? cols : 1, mr = rows > 1 ? rows : 1;
    if ((cols == 1 || sc == 1) && (rows == 1 || sr >= mc)) {
        v->trans = CblasNoTrans;
        v->ld = rows == 1 ? mc : sr;
    } else if ((rows == 1 || sr == 1) && (cols == 1 || sc >= mr)) {
        v->trans = CblasTrans;
        v->ld = cols == 1 ? mr : sc;
    } else {
        return false;
    }
    return v->ld <= INT_MAX;
}

static bool operand_ok(const nd_tensor *t) {
    int n = t->ndim;
    blas_view v;
    for (int i = 0; i < n - 2; i++)
        if (t->strides[i] < 0) return false;
    return blas_layout(t->shape[n - 2], t->shape[n - 1], t->strides[n - 2], t->strides[n - 1], &v);
}

/* Integer (and other non-BLAS) dtypes: a plain triple loop, int64 or double
 * accumulation. Correct rather than fast: training runs in float. */
static void gemm_generic(const nd_tensor *a, const nd_tensor *b, nd_tensor *out, int64_t ao,
                         int64_t bo, int64_t oo, int64_t M, int64_t N, int64_t K) {
    size_t ea = nd_dtype_size(a->dtype), eb = nd_dtype_size(b->dtype), eo = nd_dtype_size(out->dtype);
    int n = a->ndim;
    const char *pa = (const char *)a->storage->data, *pb = (const char *)b->storage->data;
    char *po = (char *)out->storage->data;
    bool fl = nd_dtype_is_float(out->dtype);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            uint64_t iacc = 0; /* wraps like PyTorch's integer matmul */
            for (int64_t k = 0; k < K; k++) {
                const char *xa = pa + (ao + i * a->strides[n - 2] + k * a->strides[n - 1]) * (int64_t)ea;
                const char *yb = pb + (bo + k * b->strides[n - 2] + j * b->strides[n - 1]) * (int64_t)eb;
                if (fl) acc += nd_load_f64(xa, a->dtype) * nd_load_f64(yb, b->dtype);
                else iacc += (uint64_t)nd_load_i64(xa, a->dtype) * (uint64_t)nd_load_i64(yb, b->dtype);
            }
            char *dst = po + (oo + i * N + j) * (int64_t)eo;
            if (fl) nd_store_f64(dst, out->dtype, acc);
            else nd_store_number(dst, out->dtype, nd_num_i((int64_t)iacc));
        }
}

/* float32 on needle's own GEMM (cpu_gemm.c), which reads any strides: false
 * when this CPU has no kernel for it (or memory ran out). */
static bool own_sgemm(nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    int n = out->ndim;
    int64_t M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
    int64_t batch = 1;
    for (int i = 0; i < n - 2; i++) batch *= out->shape[i];
    int64_t one[3], *off = batch == 1 ? one : malloc(sizeof(int64_t) * 3 * (size_t)batch);
    if (!off) return false;
    int64_t *ao = off, *bo = off + batch, *oo = off + 2 * batch;
    int64_t idx[ND_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < batch; bi++) {
        ao[bi] = a->offset, bo[bi] = b->offset, oo[bi] = out->offset + bi * M * N;
        for (int d = 0; d < n - 2; d++) {
            ao[bi] += idx[d] * a->strides[d];
            bo[bi] += idx[d] * b->strides[d];
        }
        for (int d = n - 3; d >= 0; d--) {
            if (++idx[d] < out->shape[d]) break;
            idx[d] = 0;
        }
    }
    bool ok = nd_cpu_sgemm_batched(batch, ao, bo, oo, M, N, K, (const float *)a->storage->data,
                                   a->strides[n - 2], a->strides[n - 1], (const float *)b->storage->data,
                                   b->strides[n - 2], b->strides[n - 1], (float *)out->storage->data, N);
    if (off != one) free(off);
    return ok; /* false: BLAS then computes every batch */
}

nd_status nd_cpu_matmul(nd_tensor *out, const nd_tensor *a_in, const nd_tensor *b_in) {
    const nd_tensor *a = a_in, *b = b_in;
    if (out->dtype == ND_FLOAT32 && a->dtype == ND_FLOAT32 && b->dtype == ND_FLOAT32) {
        int n = out->ndim;
        if (a->shape[n - 1] > 0 && out->shape[n - 2] > 0 && out->shape[n - 1] > 0 &&
            own_sgemm(out, a, b))
            return ND_OK;
    }
    nd_tensor *ac = NULL, *bc = NULL;
    bool blas = out->dtype == ND_FLOAT32 || out->dtype == ND_FLOAT64;
    if (blas && !operand_ok(a)) { ND_TRY(nd_cpu_contiguous(a, &ac)); a = ac; }
    if (blas && !operand_ok(b)) {
        nd_status st = nd_cpu_contiguous(b, &bc);
        if (st != ND_OK) { nd_release(ac); return st; }
        b = bc;
    }
    int n = out->ndim;
    int64_t M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
    int64_t batch = 1;
    for (int i = 0; i < n - 2; i++) batch *= out->shape[i];
    nd_status st = ND_OK;
    if (blas && (M > INT_MAX || N > INT_MAX || K > INT_MAX)) {
        st = nd_fail(ND_ERR_ARG, "matmul: dims M=%lld N=%lld K=%lld exceed BLAS's int range",
                     (long long)M, (long long)N, (long long)K);
        goto done;
    }
    if (K == 0) { const uint64_t zero = 0; st = nd_cpu_fill(out, &zero); goto done; }
    if (M == 0 || N == 0 || batch == 0) goto done;
    blas_view va = {CblasNoTrans, 1}, vb = {CblasNoTrans, 1};
    if (blas) {
        blas_layout(M, K, a->strides[n - 2], a->strides[n - 1], &va);
        blas_layout(K, N, b->strides[n - 2], b->strides[n - 1], &vb);
    }
    int64_t idx[ND_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < batch; bi++) {
        int64_t ao = a->offset, bo = b->offset, oo = out->offset + bi * M * N;
        for (int d = 0; d < n - 2; d++) {
            ao += idx[d] * a->strides[d];
            bo += idx[d] * b->strides[d];
        }
        if (out->dtype == ND_FLOAT32) {
            cblas_sgemm(CblasRowMajor, va.trans, vb.trans, (int)M, (int)N, (int)K, 1.0f,
                        (const float *)a->storage->data + ao, (int)va.ld,
                        (const float *)b->storage->data + bo, (int)vb.ld, 0.0f,
                        (float *)out->storage->data + oo, (int)N);
        } else if (out->dtype == ND_FLOAT64) {
            cblas_dgemm(CblasRowMajor, va.trans, vb.trans, (int)M, (int)N, (int)K, 1.0,
                        (const double *)a->storage->data + ao, (int)va.ld,
                        (const double *)b->storage->data + bo, (int)vb.ld, 0.0,
                        (double *)out->storage->data + oo, (int)N);
        } else {
            gemm_generic(a, b, out, ao, bo, oo, M, N, K);
        }
        for (int d = n - 3; d >= 0; d--) {
            if (++idx[d] < out->shape[d]) break;
            idx[d] = 0;
        }
    }
done:
    nd_release(ac);
    nd_release(bc);
    return st;
}

/* out += a @ b (nd.compile's epilogue pass: a weight gradient summed over
 * the steps of a recurrence), bit for bit nd_cpu_matmul then an add. A
 * float32 product of one K block into rows or columns of unit stride adds
 * into out as each tile is stored (cpu_gemm.c; a transposed out, as a
 * weight's gradient is, computes out^T += b^T @ a^T: the same products
 * summed in the same order). Anything else computes the product into a
 * temporary and adds it, as the two kernels did. */
nd_status nd_cpu_matmul_acc(nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    int n = out->ndim;
    bool single = n >= 2 && out->dtype == ND_FLOAT32 && a->dtype == ND_FLOAT32 && b->dtype == ND_FLOAT32;
    for (int d = 0; single && d < n - 2; d++) single = out->shape[d] == 1;
    if (single) {
        int64_t M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
        int64_t so = out->strides[n - 2], sc = out->strides[n - 1];
        const float *A = (const float *)a->storage->data + a->offset;
        const float *B = (const float *)b->storage->data + b->offset;
        float *C = (float *)out->storage->data + out->offset;
        int64_t asm_ = a->strides[n - 2], ask = a->strides[n - 1], bsk = b->strides[n - 2], bsn = b->strides[n - 1];
        int done = 0;
        if ((sc == 1 || N == 1) && so >= N && so > 0)
            done = nd_cpu_sgemm_add(M, N, K, A, asm_, ask, B, bsk, bsn, C, so);
        else if ((so == 1 || M == 1) && sc >= M && sc > 0) /* out^T (N x M) row-major */
            done = nd_cpu_sgemm_add(N, M, K, B, bsn, bsk, A, ask, asm_, C, sc);
        if (done == 1) return ND_OK;
        if (done < 0)
            return nd_fail(ND_ERR_MEMORY, "matmul_acc: out of memory for GEMM packing (%lld x %lld x %lld)",
                           (long long)M, (long long)N, (long long)K);
    }
    nd_tensor *t;
    ND_TRY(nd_empty(out->shape, out->ndim, out->dtype, &t));
    nd_status st = nd_cpu_matmul(t, a, b);
    if (st == ND_OK) st = nd_cpu_binary(ND_BINARY_add, out, out, t);
    nd_release(t);
    return st;
}
