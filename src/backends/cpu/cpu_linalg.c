/* cpu_linalg.c - nd.linalg's factorizations through LAPACK (backend.h,
 * nd_linalg_args). The OpenBLAS the library links exports the Fortran LAPACK
 * routines (Debian's libopenblas0: 32-bit INTEGERs); their prototypes are
 * declared here rather than taken from a LAPACKE header, which Debian ships
 * in another package.
 *
 * LAPACK is column-major and our tensors are row-major: a row-major m x n
 * buffer is the column-major n x m matrix A^T. Where the factorization of
 * A^T is the one we want (inv, det, cholesky with the other triangle, svd
 * with U and Vh swapped) the tensor's bytes go to LAPACK as they are;
 * elsewhere (solve's right-hand sides, qr, eigh's vectors, lstsq) a matrix
 * is transposed into a work buffer and back. Work arrays come from LAPACK's
 * own workspace queries, made once per call (every matrix of a batch has
 * the same size). OpenBLAS is never called inside an OpenMP region: the
 * batch loop is serial, LAPACK threads within a matrix. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"

typedef int lp_int; /* LAPACK's INTEGER in this OpenBLAS build */

/* Fortran CHARACTER arguments carry a hidden length, passed last (size_t
 * with gfortran 8 and later); the routines OpenBLAS writes in C ignore it. */
#define CH size_t
void sgetrf_(const lp_int *m, const lp_int *n, float *a, const lp_int *lda, lp_int *ipiv, lp_int *info);
void dgetrf_(const lp_int *m, const lp_int *n, double *a, const lp_int *lda, lp_int *ipiv, lp_int *info);
void sgetri_(const lp_int *n, float *a, const lp_int *lda, const lp_int *ipiv, float *work,
             const lp_int *lwork, lp_int *info);
void dgetri_(const lp_int *n, double *a, const lp_int *lda, const lp_int *ipiv, double *work,
             const lp_int *lwork, lp_int *info);
void sgetrs_(const char *trans, const lp_int *n, const lp_int *nrhs, const float *a, const lp_int *lda,
             const lp_int *ipiv, float *b, const lp_int *ldb, lp_int *info, CH);
void dgetrs_(const char *trans, const lp_int *n, const lp_int *nrhs, const double *a, const lp_int *lda,
             const lp_int *ipiv, double *b, const lp_int *ldb, lp_int *info, CH);
void spotrf_(const char *uplo, const lp_int *n, float *a, const lp_int *lda, lp_int *info, CH);
void dpotrf_(const char *uplo, const lp_int *n, double *a, const lp_int *lda, lp_int *info, CH);
void sgeqrf_(const lp_int *m, const lp_int *n, float *a, const lp_int *lda, float *tau, float *work,
             const lp_int *lwork, lp_int *info);
void dgeqrf_(const lp_int *m, const lp_int *n, double *a, const lp_int *lda, double *tau, double *work,
             const lp_int *lwork, lp_int *info);
void sorgqr_(const lp_int *m, const lp_int *n, const lp_int *k, float *a, const lp_int *lda,
             const float *tau, float *work, const lp_int *lwork, lp_int *info);
void dorgqr_(const lp_int *m, const lp_int *n, const lp_int *k, double *a, const lp_int *lda,
             const double *tau, double *work, const lp_int *lwork, lp_int *info);
void sgesdd_(const char *jobz, const lp_int *m, const lp_int *n, float *a, const lp_int *lda, float *s,
             float *u, const lp_int *ldu, float *vt, const lp_int *ldvt, float *work,
             const lp_int *lwork, lp_int *iwork, lp_int *info, CH);
void dgesdd_(const char *jobz, const lp_int *m, const lp_int *n, double *a, const lp_int *lda, double *s,
             double *u, const lp_int *ldu, double *vt, const lp_int *ldvt, double *work,
             const lp_int *lwork, lp_int *iwork, lp_int *info, CH);
void ssyevd_(const char *jobz, const char *uplo, const lp_int *n, float *a, const lp_int *lda, float *w,
             float *work, const lp_int *lwork, lp_int *iwork, const lp_int *liwork, lp_int *info, CH, CH);
void dsyevd_(const char *jobz, const char *uplo, const lp_int *n, double *a, const lp_int *lda, double *w,
             double *work, const lp_int *lwork, lp_int *iwork, const lp_int *liwork, lp_int *info, CH, CH);
void sgelsd_(const lp_int *m, const lp_int *n, const lp_int *nrhs, float *a, const lp_int *lda, float *b,
             const lp_int *ldb, float *s, const float *rcond, lp_int *rank, float *work,
             const lp_int *lwork, lp_int *iwork, lp_int *info);
void dgelsd_(const lp_int *m, const lp_int *n, const lp_int *nrhs, double *a, const lp_int *lda, double *b,
             const lp_int *ldb, double *s, const double *rcond, lp_int *rank, double *work,
             const lp_int *lwork, lp_int *iwork, lp_int *info);

/* ---- one function per routine, float32 or float64 by `d` ---- */
static void getrf(bool d, lp_int n, void *a, lp_int *ipiv, lp_int *info) {
    lp_int lda = n > 1 ? n : 1;
    if (d) dgetrf_(&n, &n, a, &lda, ipiv, info); else sgetrf_(&n, &n, a, &lda, ipiv, info);
}
static void getri(bool d, lp_int n, void *a, const lp_int *ipiv, void *work, lp_int lwork, lp_int *info) {
    lp_int lda = n > 1 ? n : 1;
    if (d) dgetri_(&n, a, &lda, ipiv, work, &lwork, info); else sgetri_(&n, a, &lda, ipiv, work, &lwork, info);
}
static void getrs(bool d, char trans, lp_int n, lp_int k, const void *a, const lp_int *ipiv, void *b,
                  lp_int *info) {
    lp_int ld = n > 1 ? n : 1;
    if (d) dgetrs_(&trans, &n, &k, a, &ld, ipiv, b, &ld, info, 1);
    else sgetrs_(&trans, &n, &k, a, &ld, ipiv, b, &ld, info, 1);
}
static void potrf(bool d, char uplo, lp_int n, void *a, lp_int *info) {
    lp_int lda = n > 1 ? n : 1;
    if (d) dpotrf_(&uplo, &n, a, &lda, info, 1); else spotrf_(&uplo, &n, a, &lda, info, 1);
}
static void geqrf(bool d, lp_int m, lp_int n, void *a, void *tau, void *work, lp_int lwork, lp_int *info) {
    lp_int lda = m > 1 ? m : 1;
    if (d) dgeqrf_(&m, &n, a, &lda, tau, work, &lwork, info);
    else sgeqrf_(&m, &n, a, &lda, tau, work, &lwork, info);
}
static void orgqr(bool d, lp_int m, lp_int n, lp_int k, void *a, const void *tau, void *work, lp_int lwork,
                  lp_int *info) {
    lp_int lda = m > 1 ? m : 1;
    if (d) dorgqr_(&m, &n, &k, a, &lda, tau, work, &lwork, info);
    else sorgqr_(&m, &n, &k, a, &lda, tau, work, &lwork, info);
}
static void gesdd(bool d, char jobz, lp_int m, lp_int n, void *a, void *s, void *u, lp_int ldu, void *vt,
                  lp_int ldvt, void *work, lp_int lwork, lp_int *iwork, lp_int *info) {
    lp_int lda = m > 1 ? m : 1;
    if (d) dgesdd_(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
    else sgesdd_(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
}
static void syevd(bool d, char jobz, char uplo, lp_int n, void *a, void *w, void *work, lp_int lwork,
                  lp_int *iwork, lp_int liwork, lp_int *info) {
    lp_int lda = n > 1 ? n : 1;
    if (d) dsyevd_(&jobz, &uplo, &n, a, &lda, w, work, &lwork, iwork, &liwork, info, 1, 1);
    else ssyevd_(&jobz, &uplo, &n, a, &lda, w, work, &lwork, iwork, &liwork, info, 1, 1);
}
static void gelsd(bool d, lp_int m, lp_int n, lp_int k, void *a, void *b, lp_int ldb, void *s, double rcond,
                  lp_int *rank, void *work, lp_int lwork, lp_int *iwork, lp_int *info) {
    lp_int lda = m > 1 ? m : 1;
    if (d) {
        dgelsd_(&m, &n, &k, a, &lda, b, &ldb, s, &rcond, rank, work, &lwork, iwork, info);
    } else {
        float rc = (float)rcond;
        sgelsd_(&m, &n, &k, a, &lda, b, &ldb, s, &rc, rank, work, &lwork, iwork, info);
    }
}

/* ---- element access and layouts (es: the element size, 4 or 8) ---- */
static double get(bool d, const void *p, int64_t i) { return d ? ((const double *)p)[i] : ((const float *)p)[i]; }
static void put(bool d, void *p, int64_t i, double v) {
    if (d) ((double *)p)[i] = v; else ((float *)p)[i] = (float)v;
}

/* dst (column-major, leading dimension ld) = src (row-major rows x cols) */
static void to_colmajor(void *dst, const void *src, int64_t rows, int64_t cols, int64_t ld, size_t es) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            memcpy((char *)dst + (size_t)(i + j * ld) * es, (const char *)src + (size_t)(i * cols + j) * es, es);
}

/* dst (row-major rows x cols) = src (column-major, leading dimension ld) */
static void from_colmajor(void *dst, const void *src, int64_t rows, int64_t cols, int64_t ld, size_t es) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            memcpy((char *)dst + (size_t)(i * cols + j) * es, (const char *)src + (size_t)(i + j * ld) * es, es);
}

static void eye_into(bool d, void *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) put(d, p, i * n + j, i == j);
}

static bool all_finite(bool d, const void *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(get(d, p, i))) return false;
    return true;
}

/* ---- work memory and LAPACK's integers ---- */
static nd_status fits(const char *op, const char *what, int64_t v) {
    if (v <= INT_MAX) return ND_OK;
    return nd_fail(ND_ERR_ARG, "%s: %s (%lld) is too large for LAPACK's 32-bit integers (at most %d)",
                   op, what, (long long)v, INT_MAX);
}

/* The size a workspace query reported (the first element of work), rounded
 * up: a float32 query can round a large size down. */
static nd_status query_size(const char *op, bool d, const void *q, lp_int *out) {
    double v = get(d, q, 0);
    v = ceil(v * (d ? 1.0 : 1.0 + 1e-6));
    if (!(v >= 1)) v = 1;
    if (v > INT_MAX)
        return nd_fail(ND_ERR_ARG, "%s: LAPACK asks for a workspace of %.0f elements, more than its "
                       "32-bit integers can address", op, v);
    *out = (lp_int)v;
    return ND_OK;
}

/* n elements of es bytes (n >= 0, already within int64); NULL on failure. */
static void *alloc(int64_t n, size_t es) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * es;
    return malloc(bytes);
}

typedef struct {
    const char *op;
    bool d;
    size_t es;
    int64_t batch, m, n, k;
} dims;

static nd_status no_memory(const dims *z, int64_t n, size_t es) {
    char b[ND_BYTES_BUF];
    return nd_fail(ND_ERR_MEMORY, "%s: cannot allocate %s of LAPACK workspace", z->op,
                   nd_bytes_str((uint64_t)(n > 0 ? n : 1) * es, b));
}

static nd_status illegal(const dims *z, const char *routine, lp_int info) {
    return nd_fail(ND_ERR_INTERNAL, "%s: LAPACK's %s rejected its argument %d", z->op, routine, -info);
}

/* ---- the kinds ---- */

static nd_status lin_inv(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t n = z->n, nn = n * n;
    lp_int *ipiv = malloc((size_t)(n > 0 ? n : 1) * sizeof *ipiv);
    double q[2]; /* a query answer: one float or double (as doubles: aligned for either) */
    lp_int info = 0, lwork = 1;
    void *work = NULL;
    nd_status st = ipiv ? ND_OK : no_memory(z, n, sizeof *ipiv);
    if (st == ND_OK && n == 0) { /* nothing to invert */
        for (int64_t b = 0; b < z->batch; b++) a->info[b] = 0;
        free(ipiv);
        return ND_OK;
    }
    if (st == ND_OK) { /* inv(A^T)^T = inv(A): the row-major bytes need no transpose */
        getri(z->d, (lp_int)n, nd_ptr(out[0]), ipiv, q, -1, &info);
        if (info < 0) st = illegal(z, "getri", info);
        else st = query_size(z->op, z->d, q, &lwork);
    }
    if (st == ND_OK && !(work = alloc(lwork, z->es))) st = no_memory(z, lwork, z->es);
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        char *x = nd_ptr(out[0]) + (size_t)(b * nn) * z->es;
        memcpy(x, nd_ptr(in[0]) + (size_t)(b * nn) * z->es, (size_t)nn * z->es);
        getrf(z->d, (lp_int)n, x, ipiv, &info);
        if (info == 0) getri(z->d, (lp_int)n, x, ipiv, work, lwork, &info);
        if (info < 0) st = illegal(z, "getrf/getri", info);
        a->info[b] = info;
    }
    free(work);
    free(ipiv);
    return st;
}

static nd_status lin_solve(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t n = z->n, k = z->k, nn = n * n, nk = n * k;
    lp_int *ipiv = malloc((size_t)(n > 0 ? n : 1) * sizeof *ipiv);
    void *lu = alloc(nn, z->es), *bw = alloc(nk, z->es);
    if (!ipiv || !lu || !bw) {
        free(ipiv); free(lu); free(bw);
        return no_memory(z, nn + nk, z->es);
    }
    nd_status st = ND_OK;
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        lp_int info;
        /* LU of the column-major view, A^T; then A X = B is a transposed solve */
        memcpy(lu, nd_ptr(in[0]) + (size_t)(b * nn) * z->es, (size_t)nn * z->es);
        info = 0;
        if (n > 0) getrf(z->d, (lp_int)n, lu, ipiv, &info);
        if (info == 0 && n > 0 && k > 0) {
            to_colmajor(bw, nd_ptr(in[1]) + (size_t)(b * nk) * z->es, n, k, n, z->es);
            getrs(z->d, 'T', (lp_int)n, (lp_int)k, lu, ipiv, bw, &info);
            from_colmajor(nd_ptr(out[0]) + (size_t)(b * nk) * z->es, bw, n, k, n, z->es);
        }
        if (info < 0) st = illegal(z, "getrf/getrs", info);
        a->info[b] = info;
    }
    free(ipiv); free(lu); free(bw);
    return st;
}

static nd_status lin_det(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t n = z->n, nn = n * n;
    lp_int *ipiv = malloc((size_t)(n > 0 ? n : 1) * sizeof *ipiv);
    void *lu = alloc(nn, z->es);
    if (!ipiv || !lu) {
        free(ipiv); free(lu);
        return no_memory(z, nn, z->es);
    }
    nd_status st = ND_OK;
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        lp_int info = 0;
        memcpy(lu, nd_ptr(in[0]) + (size_t)(b * nn) * z->es, (size_t)nn * z->es);
        if (n > 0) getrf(z->d, (lp_int)n, lu, ipiv, &info);
        /* det = the permutation's sign times U's diagonal; an exact zero
         * pivot (info > 0) is a singular matrix, not a failure: 0, 0, -inf */
        double det = 1, sign = 1, logabs = 0;
        for (int64_t i = 0; i < n; i++) {
            double u = get(z->d, lu, i * n + i);
            if (ipiv[i] != i + 1) det = -det, sign = -sign;
            det *= u;
            sign *= u > 0 ? 1 : u < 0 ? -1 : u; /* 0 stays 0, NaN stays NaN */
            logabs += log(fabs(u));
        }
        if (info < 0) st = illegal(z, "getrf", info);
        put(z->d, nd_ptr(out[0]), b, det);
        put(z->d, nd_ptr(out[1]), b, sign);
        put(z->d, nd_ptr(out[2]), b, logabs);
        a->info[b] = 0;
    }
    free(ipiv); free(lu);
    return st;
}

static nd_status lin_cholesky(const dims *z, const nd_linalg_args *a, nd_tensor *const *out,
                              const nd_tensor *const *in) {
    const int64_t n = z->n, nn = n * n;
    nd_status st = ND_OK;
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        char *l = nd_ptr(out[0]) + (size_t)(b * nn) * z->es;
        lp_int info = 0;
        memcpy(l, nd_ptr(in[0]) + (size_t)(b * nn) * z->es, (size_t)nn * z->es);
        /* The column-major view is A^T: its upper factor, read from its upper
         * triangle (A's lower one), is L's bytes; for upper = true the other way. */
        if (n > 0) potrf(z->d, a->upper ? 'L' : 'U', (lp_int)n, l, &info);
        if (info < 0) st = illegal(z, "potrf", info);
        for (int64_t i = 0; i < n; i++) /* the triangle LAPACK did not touch */
            for (int64_t j = 0; j < n; j++)
                if (a->upper ? j < i : j > i) put(z->d, l, i * n + j, 0);
        a->info[b] = info;
    }
    return st;
}

static nd_status lin_qr(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t m = z->m, n = z->n, kmin = m < n ? m : n;
    const int64_t qcols = a->full ? m : kmin, rrows = a->full ? m : kmin;
    const bool want_q = out[0] != NULL;
    /* orgqr needs the reflectors in an m x qcols array: a itself unless the
     * complete Q has more columns than A */
    const int64_t acols = want_q && qcols > n ? qcols : n;
    void *w = alloc(m * acols, z->es), *tau = alloc(kmin, z->es), *work = NULL;
    if (!w || !tau) {
        free(w); free(tau);
        return no_memory(z, m * acols + kmin, z->es);
    }
    nd_status st = ND_OK;
    lp_int info = 0, lwork = 1, l2 = 1;
    double q[2]; /* a query answer: one float or double (as doubles: aligned for either) */
    if (kmin > 0) {
        geqrf(z->d, (lp_int)m, (lp_int)n, w, tau, q, -1, &info);
        st = info < 0 ? illegal(z, "geqrf", info) : query_size(z->op, z->d, q, &lwork);
        if (st == ND_OK && want_q) {
            orgqr(z->d, (lp_int)m, (lp_int)qcols, (lp_int)kmin, w, tau, q, -1, &info);
            st = info < 0 ? illegal(z, "orgqr", info) : query_size(z->op, z->d, q, &l2);
            if (l2 > lwork) lwork = l2;
        }
        if (st == ND_OK && !(work = alloc(lwork, z->es))) st = no_memory(z, lwork, z->es);
    }
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        char *r = nd_ptr(out[1]) + (size_t)(b * rrows * n) * z->es;
        memset(w, 0, (size_t)(m * acols) * z->es);
        to_colmajor(w, nd_ptr(in[0]) + (size_t)(b * m * n) * z->es, m, n, m, z->es);
        if (kmin > 0) geqrf(z->d, (lp_int)m, (lp_int)n, w, tau, work, lwork, &info);
        if (info < 0) { st = illegal(z, "geqrf", info); break; }
        for (int64_t i = 0; i < rrows; i++)
            for (int64_t j = 0; j < n; j++) put(z->d, r, i * n + j, j >= i ? get(z->d, w, i + j * m) : 0);
        if (want_q) {
            char *qo = nd_ptr(out[0]) + (size_t)(b * m * qcols) * z->es;
            if (kmin > 0) {
                orgqr(z->d, (lp_int)m, (lp_int)qcols, (lp_int)kmin, w, tau, work, lwork, &info);
                if (info < 0) { st = illegal(z, "orgqr", info); break; }
                from_colmajor(qo, w, m, qcols, m, z->es);
            } else {
                memset(qo, 0, (size_t)(m * qcols) * z->es); /* complete: the identity */
                if (qcols == m) eye_into(z->d, qo, m);
            }
        }
        a->info[b] = 0;
    }
    free(w); free(tau); free(work);
    return st;
}

static nd_status lin_svd(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t m = z->m, n = z->n, kmin = m < n ? m : n, mn = m * n;
    const bool vectors = out[0] != NULL;
    const char jobz = !vectors ? 'N' : a->full ? 'A' : 'S';
    const int64_t ucols = a->full ? m : kmin, vrows = a->full ? n : kmin;
    /* The column-major view is A^T (n x m) = V S U^T: LAPACK's U is our V
     * (its bytes are Vh's, row-major) and its VT our U^T (U's bytes). */
    const lp_int ldu = (lp_int)(n > 1 ? n : 1), ldvt = (lp_int)(a->full ? (m > 1 ? m : 1) : (kmin > 1 ? kmin : 1));
    void *w = alloc(mn, z->es), *work = NULL;
    lp_int *iwork = malloc((size_t)(8 * kmin + 1) * sizeof *iwork);
    if (!w || !iwork) {
        free(w); free(iwork);
        return no_memory(z, mn + 8 * kmin, z->es);
    }
    nd_status st = ND_OK;
    lp_int info = 0, lwork = 1;
    double q[2], dummy[2];
    if (kmin > 0) {
        gesdd(z->d, jobz, (lp_int)n, (lp_int)m, w, dummy, dummy, ldu, dummy, ldvt, q, -1, iwork, &info);
        st = info < 0 ? illegal(z, "gesdd", info) : query_size(z->op, z->d, q, &lwork);
        if (st == ND_OK && !(work = alloc(lwork, z->es))) st = no_memory(z, lwork, z->es);
    }
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        const char *src = nd_ptr(in[0]) + (size_t)(b * mn) * z->es;
        char *s = nd_ptr(out[1]) + (size_t)(b * kmin) * z->es;
        char *u = vectors ? nd_ptr(out[0]) + (size_t)(b * m * ucols) * z->es : NULL;
        char *vh = vectors ? nd_ptr(out[2]) + (size_t)(b * vrows * n) * z->es : NULL;
        a->info[b] = 0;
        if (kmin == 0) { /* no singular values; full matrices are identities */
            if (vectors && a->full) { eye_into(z->d, u, m); eye_into(z->d, vh, n); }
            continue;
        }
        if (!all_finite(z->d, src, mn)) {
            a->info[b] = ND_LINALG_NONFINITE;
            continue;
        }
        memcpy(w, src, (size_t)mn * z->es);
        gesdd(z->d, jobz, (lp_int)n, (lp_int)m, w, s, vectors ? vh : (void *)dummy, ldu, vectors ? u : (void *)dummy, ldvt,
              work, lwork, iwork, &info);
        if (info < 0) st = illegal(z, "gesdd", info);
        else a->info[b] = info;
    }
    free(w); free(work); free(iwork);
    return st;
}

static nd_status lin_eigh(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t n = z->n, nn = n * n;
    const bool vectors = out[1] != NULL;
    /* the column-major view is A^T: A's lower triangle is its upper one */
    const char jobz = vectors ? 'V' : 'N', uplo = a->upper ? 'L' : 'U';
    void *w = alloc(nn, z->es), *work = NULL;
    lp_int *iwork = NULL;
    if (!w) return no_memory(z, nn, z->es);
    nd_status st = ND_OK;
    lp_int info = 0, lwork = 1, liwork = 1, iq = 1;
    double q[2]; /* a query answer: one float or double (as doubles: aligned for either) */
    if (n > 0) {
        syevd(z->d, jobz, uplo, (lp_int)n, w, q, q, -1, &iq, -1, &info);
        st = info < 0 ? illegal(z, "syevd", info) : query_size(z->op, z->d, q, &lwork);
        liwork = iq > 1 ? iq : 1;
        if (st == ND_OK && !(work = alloc(lwork, z->es))) st = no_memory(z, lwork, z->es);
        if (st == ND_OK && !(iwork = malloc((size_t)liwork * sizeof *iwork))) st = no_memory(z, liwork, sizeof *iwork);
    }
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        const char *src = nd_ptr(in[0]) + (size_t)(b * nn) * z->es;
        a->info[b] = 0;
        if (n == 0) continue;
        bool finite = true; /* only the triangle LAPACK reads */
        for (int64_t i = 0; i < n && finite; i++)
            for (int64_t j = 0; j < n; j++)
                if ((a->upper ? j >= i : j <= i) && !isfinite(get(z->d, src, i * n + j))) { finite = false; break; }
        if (!finite) {
            a->info[b] = ND_LINALG_NONFINITE;
            continue;
        }
        memcpy(w, src, (size_t)nn * z->es);
        syevd(z->d, jobz, uplo, (lp_int)n, w, nd_ptr(out[0]) + (size_t)(b * n) * z->es, work, lwork, iwork,
              liwork, &info);
        if (info < 0) { st = illegal(z, "syevd", info); break; }
        a->info[b] = info;
        if (vectors) from_colmajor(nd_ptr(out[1]) + (size_t)(b * nn) * z->es, w, n, n, n, z->es);
    }
    free(w); free(work); free(iwork);
    return st;
}

static nd_status lin_lstsq(const dims *z, const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const int64_t m = z->m, n = z->n, k = z->k, kmin = m < n ? m : n;
    const int64_t ldb = m > n ? (m > 1 ? m : 1) : (n > 1 ? n : 1);
    void *w = alloc(m * n, z->es), *bw = alloc(ldb * k, z->es), *s = alloc(kmin, z->es), *work = NULL;
    lp_int *iwork = NULL;
    if (!w || !bw || !s) {
        free(w); free(bw); free(s);
        return no_memory(z, m * n + ldb * k + kmin, z->es);
    }
    nd_status st = ND_OK;
    lp_int info = 0, lwork = 1, liwork = 1, rank = 0;
    double q[2]; /* a query answer: one float or double (as doubles: aligned for either) */
    if (kmin > 0) {
        lp_int iq = 1;
        gelsd(z->d, (lp_int)m, (lp_int)n, (lp_int)k, w, bw, (lp_int)ldb, s, a->rcond, &rank, q, -1, &iq, &info);
        st = info < 0 ? illegal(z, "gelsd", info) : query_size(z->op, z->d, q, &lwork);
        liwork = iq > 1 ? iq : 1;
        if (st == ND_OK && !(work = alloc(lwork, z->es))) st = no_memory(z, lwork, z->es);
        if (st == ND_OK && !(iwork = malloc((size_t)liwork * sizeof *iwork))) st = no_memory(z, liwork, sizeof *iwork);
    }
    for (int64_t b = 0; st == ND_OK && b < z->batch; b++) {
        const char *ab = nd_ptr(in[0]) + (size_t)(b * m * n) * z->es;
        const char *bb = nd_ptr(in[1]) + (size_t)(b * m * k) * z->es;
        a->info[b] = 0;
        if (!all_finite(z->d, ab, m * n) || !all_finite(z->d, bb, m * k)) {
            a->info[b] = ND_LINALG_NONFINITE;
            continue;
        }
        /* B's columns, zero below row m; with no row or no column (kmin 0)
         * there is nothing to factor: X is 0 and B is all residual */
        memset(bw, 0, (size_t)(ldb * k) * z->es);
        to_colmajor(bw, bb, m, k, ldb, z->es);
        rank = 0;
        if (kmin > 0) {
            to_colmajor(w, ab, m, n, m, z->es);
            gelsd(z->d, (lp_int)m, (lp_int)n, (lp_int)k, w, bw, (lp_int)ldb, s, a->rcond, &rank, work, lwork,
                  iwork, &info);
            if (info < 0) { st = illegal(z, "gelsd", info); break; }
            a->info[b] = info;
            memcpy(nd_ptr(out[3]) + (size_t)(b * kmin) * z->es, s, (size_t)kmin * z->es);
        }
        from_colmajor(nd_ptr(out[0]) + (size_t)(b * n * k) * z->es, bw, n, k, ldb, z->es);
        ((int64_t *)nd_ptr(out[2]))[b] = rank;
        if (out[1]) /* rows n.. of LAPACK's B: the residual of each column */
            for (int64_t j = 0; j < k; j++) {
                double sum = 0;
                for (int64_t i = n; i < m; i++) {
                    double v = get(z->d, bw, i + j * ldb);
                    sum += v * v;
                }
                put(z->d, nd_ptr(out[1]), b * k + j, sum);
            }
    }
    free(w); free(bw); free(s); free(work); free(iwork);
    return st;
}

nd_status nd_cpu_linalg(const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in) {
    const nd_tensor *x = in[0];
    if (x->ndim != 3 || (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_INTERNAL, "%s: expected a float32 or float64 batch of matrices", a->op);
    dims z = {a->op, x->dtype == ND_FLOAT64, nd_dtype_size(x->dtype), x->shape[0], x->shape[1],
              x->shape[2], 0};
    if (a->kind == ND_LINALG_SOLVE || a->kind == ND_LINALG_LSTSQ) z.k = in[1]->shape[2];
    if (z.batch == 0) return ND_OK;
    ND_TRY(fits(z.op, "the number of rows", z.m));
    ND_TRY(fits(z.op, "the number of columns", z.n));
    ND_TRY(fits(z.op, "the number of right-hand sides", z.k));
    /* LAPACK indexes each matrix (and sizes its workspaces) with its INTEGERs;
     * each product is of two numbers within them, so it cannot overflow */
    ND_TRY(fits(z.op, "the number of elements of a matrix", z.m * z.n));
    ND_TRY(fits(z.op, "the number of elements of the right-hand sides", (z.m > z.n ? z.m : z.n) * z.k));
    switch (a->kind) {
    case ND_LINALG_INV: return lin_inv(&z, a, out, in);
    case ND_LINALG_SOLVE: return lin_solve(&z, a, out, in);
    case ND_LINALG_DET: return lin_det(&z, a, out, in);
    case ND_LINALG_CHOLESKY: return lin_cholesky(&z, a, out, in);
    case ND_LINALG_QR: return lin_qr(&z, a, out, in);
    case ND_LINALG_SVD: return lin_svd(&z, a, out, in);
    case ND_LINALG_EIGH: return lin_eigh(&z, a, out, in);
    case ND_LINALG_LSTSQ: return lin_lstsq(&z, a, out, in);
    }
    return nd_fail(ND_ERR_INTERNAL, "%s: unknown kind %d", a->op, (int)a->kind);
}
