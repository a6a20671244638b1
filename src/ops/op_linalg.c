/* op_linalg.c - nd.linalg's ops (needle.h, nd_linalg_*): shape and dtype
 * checks, the batch (leading dims, broadcast between A and B), the trip to
 * the host and back for tensors on other devices, one call of the CPU
 * backend's linalg entry (LAPACK, backends/cpu/cpu_linalg.c), and errors
 * made from LAPACK's info, naming the batch element.
 *
 * Nothing here records an autograd node: the gradients are Lua functions
 * of differentiable ops (lua/needle/linalg.lua), so they run on every
 * device and to any order. The forward itself runs with grad mode off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend_call.h"
#include "tensor.h"

typedef struct {
    const char *op;
    nd_device dev;              /* where the results go */
    nd_dtype dt;
    int nb;                     /* batch dims */
    int64_t bshape[ND_MAX_DIMS];
    int64_t batch;              /* their product */
} lin;

/* "(batch element 3): " / "(batch element {1,2}): " (1-based for Lua through
 * ND_IXF), "" for a single matrix. */
static const char *where_in_batch(const lin *c, int64_t b, char *buf, size_t n) {
    if (c->nb == 0) return "";
    int64_t idx[ND_MAX_DIMS];
    for (int d = c->nb - 1; d >= 0; d--) {
        idx[d] = c->bshape[d] ? b % c->bshape[d] : 0;
        b = c->bshape[d] ? b / c->bshape[d] : 0;
    }
    size_t o = (size_t)snprintf(buf, n, "(batch element %s", c->nb > 1 ? "{" : "");
    for (int d = 0; d < c->nb && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, d ? "," ND_IXF : ND_IXF, ND_IX(idx[d]));
    if (o < n) snprintf(buf + o, n - o, "%s): ", c->nb > 1 ? "}" : "");
    return buf;
}

/* A (or B) must be a float32 or float64 tensor with at least `mindims` dims. */
static nd_status check_input(const char *op, const char *name, const nd_tensor *t, int mindims) {
    char s[ND_SHAPE_BUF];
    if (t->ndim < mindims)
        return nd_fail(ND_ERR_SHAPE, "%s: %s must have at least %d dims, got shape %s", op, name, mindims,
                       nd_shape_str(t->shape, t->ndim, s));
    if (t->dtype == ND_FLOAT32 || t->dtype == ND_FLOAT64) return ND_OK;
    if (t->dtype == ND_FLOAT16 || t->dtype == ND_BFLOAT16)
        return nd_fail(ND_ERR_DTYPE, "%s: expected %s to be a float32 or float64 tensor, got %s (LAPACK has "
                       "no %s: convert with :float() or :double())", op, name, nd_dtype_name(t->dtype),
                       nd_dtype_name(t->dtype));
    return nd_fail(ND_ERR_DTYPE, "%s: expected %s to be a float32 or float64 tensor, got %s", op, name,
                   nd_dtype_name(t->dtype));
}

static nd_status check_square(const char *op, const nd_tensor *a) {
    int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1];
    if (m == n) return ND_OK;
    char s[ND_SHAPE_BUF];
    return nd_fail(ND_ERR_SHAPE, "%s: A must be a batch of square matrices, but they are %lld by %lld "
                   "matrices (shape %s)", op, (long long)m, (long long)n, nd_shape_str(a->shape, a->ndim, s));
}

/* The context of one call: A's batch dims (nb of them), its dtype and device. */
static nd_status begin(lin *c, const char *op, const nd_tensor *a, int nb) {
    c->op = op;
    c->dev = nd_get_device(a);
    c->dt = a->dtype;
    c->nb = nb;
    c->batch = 1;
    for (int d = 0; d < nb; d++) c->bshape[d] = a->shape[d], c->batch *= a->shape[d];
    /* a compiled function would replay the factorization without its checks */
    return nd_graph_check_host_read(op);
}

/* Broadcasts the batch (A's) with B's leading nb2 dims. */
static nd_status broadcast_batch(lin *c, const nd_tensor *a, const nd_tensor *b, int nb2) {
    int64_t out[ND_MAX_DIMS];
    int nout;
    if (nd_broadcast_shape(c->op, c->bshape, c->nb, b->shape, nb2, out, &nout) != ND_OK) {
        char sa[ND_SHAPE_BUF], sb[ND_SHAPE_BUF], ba[ND_SHAPE_BUF], bb[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: the batch dims of A %s and B %s cannot be broadcast (%s and %s)",
                       c->op, nd_shape_str(a->shape, a->ndim, sa), nd_shape_str(b->shape, b->ndim, sb),
                       nd_shape_str(c->bshape, c->nb, ba), nd_shape_str(b->shape, nb2, bb));
    }
    c->nb = nout;
    c->batch = 1;
    for (int d = 0; d < nout; d++) c->bshape[d] = out[d], c->batch *= out[d];
    return ND_OK;
}

/* t (batch dims broadcast to c's, then rows x cols; a vector is a column)
 * as a contiguous cpu tensor of shape (batch, rows, cols). */
static nd_status host3(const lin *c, const nd_tensor *t, bool vec, int64_t rows, int64_t cols,
                       nd_tensor **out) {
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, c->bshape, (size_t)c->nb * sizeof *shape);
    shape[c->nb] = rows;
    shape[c->nb + 1] = cols;
    nd_tensor *e = NULL, *x = NULL, *h = NULL, *k = NULL;
    nd_status st = vec ? nd_unsqueeze(t, t->ndim, &e) : (nd_retain((nd_tensor *)t), e = (nd_tensor *)t, ND_OK);
    if (st == ND_OK) st = nd_expand_to(e, shape, c->nb + 2, &x);
    if (st == ND_OK) st = nd_to_device(x, nd_cpu_device(), &h);
    if (st == ND_OK) st = nd_contiguous(h, &k);
    int64_t s3[3] = {c->batch, rows, cols};
    if (st == ND_OK) st = nd_reshape(k, s3, 3, out);
    nd_release(e); nd_release(x); nd_release(h); nd_release(k);
    return st;
}

/* A new cpu result (batch, rows, cols), or (batch, rows) when cols < 0. */
static nd_status result(const lin *c, nd_dtype dt, int64_t rows, int64_t cols, nd_tensor **out) {
    int64_t s[3] = {c->batch, rows, cols};
    return nd_empty(s, cols < 0 ? 2 : 3, dt, out);
}

/* r (cpu, batch first) reshaped to the batch dims followed by tail, on the
 * caller's device; r is consumed. */
static nd_status finish(const lin *c, nd_tensor *r, const int64_t *tail, int ntail, nd_tensor **out) {
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, c->bshape, (size_t)c->nb * sizeof *shape);
    if (ntail) memcpy(shape + c->nb, tail, (size_t)ntail * sizeof *shape);
    nd_tensor *v = NULL;
    nd_status st = nd_reshape(r, shape, c->nb + ntail, &v);
    if (st == ND_OK) st = nd_to_device(v, c->dev, out);
    nd_release(v);
    nd_release(r);
    return st;
}

/* As finish, for a result that depends on A alone (lstsq's rank and
 * singular values): the batch is A's own, not the one broadcast with B's
 * (the entries along broadcast dims are equal, so the first is kept). */
static nd_status finish_a(const lin *c, const nd_tensor *a, nd_tensor *r, const int64_t *tail, int ntail,
                          nd_tensor **out) {
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, c->bshape, (size_t)c->nb * sizeof *shape);
    if (ntail) memcpy(shape + c->nb, tail, (size_t)ntail * sizeof *shape);
    nd_tensor *v = NULL;
    nd_status st = nd_reshape(r, shape, c->nb + ntail, &v);
    nd_release(r);
    int na = a->ndim - 2, skip = c->nb - na;
    for (int d = 0, at = 0; st == ND_OK && d < c->nb; d++) {
        nd_tensor *w = NULL;
        if (d < skip) st = nd_select(v, at, 0, &w); /* a dim A does not have */
        else if (a->shape[d - skip] == 1 && c->bshape[d] != 1) st = nd_narrow(v, at++, 0, 1, &w);
        else { at++; continue; }
        nd_release(v);
        v = w;
    }
    nd_tensor *k = NULL;
    if (st == ND_OK) st = nd_contiguous(v, &k);
    if (st == ND_OK) st = nd_to_device(k, c->dev, out);
    nd_release(v);
    nd_release(k);
    return st;
}

/* Runs the backend on in[0..nin) and fills info (batch entries). */
static nd_status call(const lin *c, nd_linalg_args *args, nd_tensor *const *out, const nd_tensor *const *in,
                      int64_t **info) {
    *info = calloc((size_t)(c->batch > 0 ? c->batch : 1), sizeof **info);
    if (!*info) return nd_fail(ND_ERR_MEMORY, "%s: out of memory", c->op);
    args->op = c->op;
    args->info = *info;
    return ND_BACKEND_CALL(nd_backend_for(ND_DEVICE_CPU), linalg, c->op, args, out, in);
}

/* The first failure in info as op's error: what(c, b, info) writes it. */
typedef nd_status (*fail_fn)(const lin *c, const char *at, int64_t info);
static nd_status check_info(const lin *c, const int64_t *info, fail_fn what) {
    for (int64_t b = 0; b < c->batch; b++) {
        if (info[b] == 0) continue;
        char at[ND_MAX_DIMS * 26 + 32];
        return what(c, where_in_batch(c, b, at, sizeof at), info[b]);
    }
    return ND_OK;
}

static nd_status nonfinite(const lin *c, const char *at) {
    return nd_fail(ND_ERR_ARG, "%s: %sthe input contains non-finite values (NaN or infinity)", c->op, at);
}

/* Grad mode off for the whole op: its copies and views are no one's graph. */
#define NO_GRAD(call_)                            \
    do {                                          \
        bool on_ = nd_set_grad_enabled(false);    \
        nd_status st_ = (call_);                  \
        nd_set_grad_enabled(on_);                 \
        return st_;                               \
    } while (0)

/* ------------------------------------------------------------------ inv */

static nd_status singular_inv(const lin *c, const char *at, int64_t info) {
    return nd_fail(ND_ERR_ARG, "%s: %sthe diagonal element " ND_IXF " of the LU factorization is zero: the "
                   "input matrix is singular and has no inverse", c->op, at, ND_IX(info - 1));
}

static nd_status inv_impl(const nd_tensor *a, nd_tensor **out) {
    lin c;
    ND_TRY(check_input("linalg.inv", "A", a, 2));
    ND_TRY(check_square("linalg.inv", a));
    ND_TRY(begin(&c, "linalg.inv", a, a->ndim - 2));
    int64_t n = a->shape[a->ndim - 1], *info = NULL;
    nd_tensor *h = NULL, *r = NULL;
    nd_status st = host3(&c, a, false, n, n, &h);
    if (st == ND_OK) st = result(&c, c.dt, n, n, &r);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_INV};
        st = call(&c, &args, (nd_tensor *const[]){r}, (const nd_tensor *const[]){h}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, singular_inv);
    free(info);
    nd_release(h);
    if (st != ND_OK) { nd_release(r); return st; }
    return finish(&c, r, (int64_t[]){n, n}, 2, out);
}

nd_status nd_linalg_inv(const nd_tensor *a, nd_tensor **out) {
    *out = NULL;
    NO_GRAD(inv_impl(a, out));
}

/* ---------------------------------------------------------------- solve */

static nd_status singular_solve(const lin *c, const char *at, int64_t info) {
    return nd_fail(ND_ERR_ARG, "%s: %sthe solver failed because the input matrix is singular (the diagonal "
                   "element " ND_IXF " of its LU factorization is zero)", c->op, at, ND_IX(info - 1));
}

static nd_status solve_impl(const nd_tensor *a, const nd_tensor *b, nd_tensor **out) {
    const char *op = "linalg.solve";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(check_input(op, "B", b, 1));
    ND_TRY(check_square(op, a));
    if (a->dtype != b->dtype)
        return nd_fail(ND_ERR_DTYPE, "%s: A and B must have the same dtype, got %s and %s", op,
                       nd_dtype_name(a->dtype), nd_dtype_name(b->dtype));
    ND_TRY(nd_check_same_device(op, a, b));
    int64_t n = a->shape[a->ndim - 1];
    /* PyTorch's rule: B is a vector when it has one dim, or A's shape without its last */
    bool vec = b->ndim == 1 || (b->ndim == a->ndim - 1 && !memcmp(b->shape, a->shape, (size_t)b->ndim * sizeof *b->shape));
    int64_t rows = vec ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2], k = vec ? 1 : b->shape[b->ndim - 1];
    if (rows != n) {
        char sa[ND_SHAPE_BUF], sb[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: incompatible shapes of A %s and B %s for A X = B (%lldx%lld and "
                       "%lldx%lld)", op, nd_shape_str(a->shape, a->ndim, sa), nd_shape_str(b->shape, b->ndim, sb),
                       (long long)n, (long long)n, (long long)rows, (long long)k);
    }
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    ND_TRY(broadcast_batch(&c, a, b, b->ndim - (vec ? 1 : 2)));
    int64_t *info = NULL;
    nd_tensor *ha = NULL, *hb = NULL, *r = NULL;
    nd_status st = host3(&c, a, false, n, n, &ha);
    if (st == ND_OK) st = host3(&c, b, vec, n, k, &hb);
    if (st == ND_OK) st = result(&c, c.dt, n, k, &r);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_SOLVE};
        st = call(&c, &args, (nd_tensor *const[]){r}, (const nd_tensor *const[]){ha, hb}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, singular_solve);
    free(info);
    nd_release(ha);
    nd_release(hb);
    if (st != ND_OK) { nd_release(r); return st; }
    return finish(&c, r, (int64_t[]){n, k}, vec ? 1 : 2, out);
}

nd_status nd_linalg_solve(const nd_tensor *a, const nd_tensor *b, nd_tensor **out) {
    *out = NULL;
    NO_GRAD(solve_impl(a, b, out));
}

/* ------------------------------------------------------------------ det */

static nd_status det_impl(const nd_tensor *a, nd_tensor **det, nd_tensor **sign, nd_tensor **logabs) {
    const char *op = sign || logabs ? "linalg.slogdet" : "linalg.det";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(check_square(op, a));
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    int64_t n = a->shape[a->ndim - 1], *info = NULL;
    nd_tensor *h = NULL, *r[3] = {NULL, NULL, NULL};
    nd_status st = host3(&c, a, false, n, n, &h);
    for (int i = 0; i < 3 && st == ND_OK; i++) st = result(&c, c.dt, 1, -1, &r[i]);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_DET};
        st = call(&c, &args, r, (const nd_tensor *const[]){h}, &info);
    }
    free(info); /* a singular matrix has det 0: never a failure */
    nd_release(h);
    nd_tensor **outs[3] = {det, sign, logabs};
    for (int i = 0; i < 3; i++) {
        if (st == ND_OK && outs[i]) st = finish(&c, r[i], NULL, 0, outs[i]);
        else nd_release(r[i]);
    }
    return st;
}

nd_status nd_linalg_det(const nd_tensor *a, nd_tensor **det, nd_tensor **sign, nd_tensor **logabsdet) {
    if (det) *det = NULL;
    if (sign) *sign = NULL;
    if (logabsdet) *logabsdet = NULL;
    bool on = nd_set_grad_enabled(false);
    nd_status st = det_impl(a, det, sign, logabsdet);
    nd_set_grad_enabled(on);
    if (st != ND_OK) {
        if (det) { nd_release(*det); *det = NULL; }
        if (sign) { nd_release(*sign); *sign = NULL; }
        if (logabsdet) { nd_release(*logabsdet); *logabsdet = NULL; }
    }
    return st;
}

/* ------------------------------------------------------------- cholesky */

static nd_status not_pd(const lin *c, const char *at, int64_t info) {
    return nd_fail(ND_ERR_ARG, "%s: %sthe factorization could not be completed because the input is not "
                   "positive-definite (the leading minor of order %lld is not positive-definite)", c->op, at,
                   (long long)info);
}

static nd_status cholesky_impl(const nd_tensor *a, bool upper, nd_tensor **out) {
    const char *op = "linalg.cholesky";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(check_square(op, a));
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    int64_t n = a->shape[a->ndim - 1], *info = NULL;
    nd_tensor *h = NULL, *r = NULL;
    nd_status st = host3(&c, a, false, n, n, &h);
    if (st == ND_OK) st = result(&c, c.dt, n, n, &r);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_CHOLESKY, .upper = upper};
        st = call(&c, &args, (nd_tensor *const[]){r}, (const nd_tensor *const[]){h}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, not_pd);
    free(info);
    nd_release(h);
    if (st != ND_OK) { nd_release(r); return st; }
    return finish(&c, r, (int64_t[]){n, n}, 2, out);
}

nd_status nd_linalg_cholesky(const nd_tensor *a, bool upper, nd_tensor **out) {
    *out = NULL;
    NO_GRAD(cholesky_impl(a, upper, out));
}

/* ------------------------------------------------------------------- qr */

static nd_status qr_impl(const nd_tensor *a, nd_qr_mode mode, nd_tensor **q, nd_tensor **r) {
    const char *op = "linalg.qr";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    if ((unsigned)mode > ND_QR_R) return nd_fail(ND_ERR_ARG, "%s: unknown mode %d", op, (int)mode);
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], k = m < n ? m : n;
    int64_t kq = mode == ND_QR_COMPLETE ? m : k, *info = NULL;
    nd_tensor *h = NULL, *rq = NULL, *rr = NULL;
    nd_status st = host3(&c, a, false, m, n, &h);
    if (st == ND_OK && mode != ND_QR_R) st = result(&c, c.dt, m, kq, &rq);
    if (st == ND_OK) st = result(&c, c.dt, kq, n, &rr);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_QR, .full = mode == ND_QR_COMPLETE};
        st = call(&c, &args, (nd_tensor *const[]){rq, rr}, (const nd_tensor *const[]){h}, &info);
    }
    free(info); /* Householder QR has no failing input */
    nd_release(h);
    if (st != ND_OK) { nd_release(rq); nd_release(rr); return st; }
    st = finish(&c, rr, (int64_t[]){kq, n}, 2, r);
    if (st != ND_OK) { nd_release(rq); return st; }
    if (mode == ND_QR_R) return nd_empty_on(c.dev, (int64_t[]){0}, 1, c.dt, q); /* PyTorch's empty Q */
    return finish(&c, rq, (int64_t[]){m, kq}, 2, q);
}

nd_status nd_linalg_qr(const nd_tensor *a, nd_qr_mode mode, nd_tensor **q, nd_tensor **r) {
    *q = *r = NULL;
    bool on = nd_set_grad_enabled(false);
    nd_status st = qr_impl(a, mode, q, r);
    nd_set_grad_enabled(on);
    if (st != ND_OK) { nd_release(*q); nd_release(*r); *q = *r = NULL; }
    return st;
}

/* ------------------------------------------------------------------ svd */

static nd_status svd_failed(const lin *c, const char *at, int64_t info) {
    if (info == ND_LINALG_NONFINITE) return nonfinite(c, at);
    return nd_fail(ND_ERR_ARG, "%s: %sthe algorithm failed to converge because the input matrix is "
                   "ill-conditioned or has too many repeated singular values (LAPACK's gesdd: info %lld)",
                   c->op, at, (long long)info);
}

static nd_status svd_impl(const nd_tensor *a, bool full, nd_tensor **u, nd_tensor **s, nd_tensor **vh) {
    const char *op = u ? "linalg.svd" : "linalg.svdvals";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], k = m < n ? m : n;
    int64_t uc = full ? m : k, vr = full ? n : k, *info = NULL;
    nd_tensor *h = NULL, *r[3] = {NULL, NULL, NULL};
    nd_status st = host3(&c, a, false, m, n, &h);
    if (st == ND_OK) st = result(&c, c.dt, k, -1, &r[1]);
    if (st == ND_OK && u) st = result(&c, c.dt, m, uc, &r[0]);
    if (st == ND_OK && u) st = result(&c, c.dt, vr, n, &r[2]);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_SVD, .full = full};
        st = call(&c, &args, r, (const nd_tensor *const[]){h}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, svd_failed);
    free(info);
    nd_release(h);
    if (st == ND_OK) st = finish(&c, r[1], (int64_t[]){k}, 1, s), r[1] = NULL;
    if (st == ND_OK && u) st = finish(&c, r[0], (int64_t[]){m, uc}, 2, u), r[0] = NULL;
    if (st == ND_OK && u) st = finish(&c, r[2], (int64_t[]){vr, n}, 2, vh), r[2] = NULL;
    for (int i = 0; i < 3; i++) nd_release(r[i]);
    return st;
}

nd_status nd_linalg_svd(const nd_tensor *a, bool full_matrices, nd_tensor **u, nd_tensor **s,
                        nd_tensor **vh) {
    if (u) *u = NULL;
    if (vh) *vh = NULL;
    *s = NULL;
    if ((u == NULL) != (vh == NULL))
        return nd_fail(ND_ERR_ARG, "linalg.svd: U and Vh are wanted together or not at all");
    bool on = nd_set_grad_enabled(false);
    nd_status st = svd_impl(a, full_matrices, u, s, vh);
    nd_set_grad_enabled(on);
    if (st != ND_OK) {
        nd_release(*s); *s = NULL;
        if (u) { nd_release(*u); nd_release(*vh); *u = *vh = NULL; }
    }
    return st;
}

/* ----------------------------------------------------------------- eigh */

static nd_status eigh_failed(const lin *c, const char *at, int64_t info) {
    if (info == ND_LINALG_NONFINITE) return nonfinite(c, at);
    return nd_fail(ND_ERR_ARG, "%s: %sthe algorithm failed to converge because the input matrix is "
                   "ill-conditioned or has too many repeated eigenvalues (LAPACK's syevd: info %lld)", c->op,
                   at, (long long)info);
}

static nd_status eigh_impl(const nd_tensor *a, bool upper, nd_tensor **w, nd_tensor **v) {
    const char *op = v ? "linalg.eigh" : "linalg.eigvalsh";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(check_square(op, a));
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    int64_t n = a->shape[a->ndim - 1], *info = NULL;
    nd_tensor *h = NULL, *r[2] = {NULL, NULL};
    nd_status st = host3(&c, a, false, n, n, &h);
    if (st == ND_OK) st = result(&c, c.dt, n, -1, &r[0]);
    if (st == ND_OK && v) st = result(&c, c.dt, n, n, &r[1]);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_EIGH, .upper = upper};
        st = call(&c, &args, r, (const nd_tensor *const[]){h}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, eigh_failed);
    free(info);
    nd_release(h);
    if (st == ND_OK) st = finish(&c, r[0], (int64_t[]){n}, 1, w), r[0] = NULL;
    if (st == ND_OK && v) st = finish(&c, r[1], (int64_t[]){n, n}, 2, v), r[1] = NULL;
    nd_release(r[0]);
    nd_release(r[1]);
    return st;
}

nd_status nd_linalg_eigh(const nd_tensor *a, bool upper, nd_tensor **w, nd_tensor **v) {
    *w = NULL;
    if (v) *v = NULL;
    bool on = nd_set_grad_enabled(false);
    nd_status st = eigh_impl(a, upper, w, v);
    nd_set_grad_enabled(on);
    if (st != ND_OK) {
        nd_release(*w); *w = NULL;
        if (v) { nd_release(*v); *v = NULL; }
    }
    return st;
}

/* ---------------------------------------------------------------- lstsq */

static nd_status lstsq_failed(const lin *c, const char *at, int64_t info) {
    if (info == ND_LINALG_NONFINITE) return nonfinite(c, at);
    return nd_fail(ND_ERR_ARG, "%s: %sthe SVD of the input failed to converge (LAPACK's gelsd: info %lld)",
                   c->op, at, (long long)info);
}

typedef struct { nd_tensor **x, **res, **rank, **sv; } lstsq_outs;

static nd_status lstsq_impl(const nd_tensor *a, const nd_tensor *b, double rcond, lstsq_outs o) {
    const char *op = "linalg.lstsq";
    lin c;
    ND_TRY(check_input(op, "A", a, 2));
    ND_TRY(check_input(op, "B", b, 1));
    if (a->dtype != b->dtype)
        return nd_fail(ND_ERR_DTYPE, "%s: A and B must have the same dtype, got %s and %s", op,
                       nd_dtype_name(a->dtype), nd_dtype_name(b->dtype));
    ND_TRY(nd_check_same_device(op, a, b));
    int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], kmin = m < n ? m : n;
    bool vec = b->ndim == a->ndim - 1; /* PyTorch's rule for lstsq */
    if (!vec && b->ndim < 2) {
        char sa[ND_SHAPE_BUF], sb[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: B %s must be a batch of vectors (one dim fewer than A %s) or of matrices "
                       "(at least 2 dims)", op, nd_shape_str(b->shape, b->ndim, sb), nd_shape_str(a->shape, a->ndim, sa));
    }
    int64_t rows = vec ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2], k = vec ? 1 : b->shape[b->ndim - 1];
    if (rows != m) {
        char sa[ND_SHAPE_BUF], sb[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: A %s and B %s must have the same number of rows (%lld and %lld%s)",
                       op, nd_shape_str(a->shape, a->ndim, sa), nd_shape_str(b->shape, b->ndim, sb),
                       (long long)m, (long long)rows, vec ? "; B has one dim fewer than A, so it is a "
                       "batch of vectors" : "");
    }
    if (!isnan(rcond) && rcond < 0) return nd_fail(ND_ERR_ARG, "%s: rcond must be >= 0, got %g", op, rcond);
    if (isnan(rcond)) /* PyTorch's default: the dtype's epsilon times the larger side */
        rcond = (a->dtype == ND_FLOAT64 ? 2.220446049250313e-16 : 1.1920928955078125e-07) * (double)(m > n ? m : n);
    ND_TRY(begin(&c, op, a, a->ndim - 2));
    ND_TRY(broadcast_batch(&c, a, b, b->ndim - (vec ? 1 : 2)));
    int64_t *info = NULL;
    nd_tensor *ha = NULL, *hb = NULL, *r[4] = {NULL, NULL, NULL, NULL};
    nd_status st = host3(&c, a, false, m, n, &ha);
    if (st == ND_OK) st = host3(&c, b, vec, m, k, &hb);
    if (st == ND_OK) st = result(&c, c.dt, n, k, &r[0]);
    if (st == ND_OK && m > n) st = result(&c, c.dt, k, -1, &r[1]);
    if (st == ND_OK) st = result(&c, ND_INT64, 1, -1, &r[2]);
    if (st == ND_OK) st = result(&c, c.dt, kmin, -1, &r[3]);
    if (st == ND_OK) {
        nd_linalg_args args = {.kind = ND_LINALG_LSTSQ, .rcond = rcond};
        st = call(&c, &args, r, (const nd_tensor *const[]){ha, hb}, &info);
    }
    if (st == ND_OK) st = check_info(&c, info, lstsq_failed);
    free(info);
    nd_release(ha);
    nd_release(hb);
    /* residuals only when every matrix has full rank (PyTorch's rule) */
    bool full_rank = r[1] != NULL;
    for (int64_t i = 0; st == ND_OK && full_rank && i < c.batch; i++)
        if (((const int64_t *)nd_ptr(r[2]))[i] != n) full_rank = false;
    if (st == ND_OK) st = finish(&c, r[0], (int64_t[]){n, k}, vec ? 1 : 2, o.x), r[0] = NULL;
    if (st == ND_OK && o.res && full_rank) st = finish(&c, r[1], (int64_t[]){k}, 1, o.res), r[1] = NULL;
    else if (st == ND_OK && o.res) st = nd_empty_on(c.dev, (int64_t[]){0}, 1, c.dt, o.res);
    if (st == ND_OK && o.rank) st = finish_a(&c, a, r[2], NULL, 0, o.rank), r[2] = NULL;
    if (st == ND_OK && o.sv) st = finish_a(&c, a, r[3], (int64_t[]){kmin}, 1, o.sv), r[3] = NULL;
    for (int i = 0; i < 4; i++) nd_release(r[i]);
    return st;
}

nd_status nd_linalg_lstsq(const nd_tensor *a, const nd_tensor *b, double rcond, nd_tensor **x,
                          nd_tensor **residuals, nd_tensor **rank, nd_tensor **sv) {
    lstsq_outs o = {x, residuals, rank, sv};
    nd_tensor **all[4] = {x, residuals, rank, sv};
    for (int i = 0; i < 4; i++) if (all[i]) *all[i] = NULL;
    bool on = nd_set_grad_enabled(false);
    nd_status st = lstsq_impl(a, b, rcond, o);
    nd_set_grad_enabled(on);
    if (st != ND_OK)
        for (int i = 0; i < 4; i++) if (all[i]) { nd_release(*all[i]); *all[i] = NULL; }
    return st;
}
