/* op_fold_norm.c - nd_fold_batch_norm: the weight and bias of a layer that
 * an evaluation-mode batch norm follows, with the norm folded in.
 *
 * One formula for its two clients: nd.nn.fuse (a new module with folded
 * parameters) and nd.compile's fold pass (graph_fold.c), which runs this op
 * under a capture of its own so that a replay can fold again when a
 * parameter or a running statistic changes. Made of ordinary ops: on every
 * backend, and recorded like any other. Computed in float64 (the folded
 * weight is one rounding away from the exact product), returned in the
 * weight's dtype. */
#include "backend_call.h"

static nd_status fold_check(const char *what, const nd_tensor *p, const nd_tensor *w) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (!p) return ND_OK;
    ND_TRY(nd_check_same_device("fold_batch_norm", w, p));
    if (p->ndim != 1 || p->shape[0] != w->shape[0] || p->dtype != w->dtype)
        return nd_fail(ND_ERR_SHAPE, "fold_batch_norm: %s must be a %s tensor of shape {%lld} (one "
                       "value per output channel of the weight %s), got %s %s", what,
                       nd_dtype_name(w->dtype), (long long)w->shape[0],
                       nd_shape_str(w->shape, w->ndim, b2), nd_dtype_name(p->dtype),
                       nd_shape_str(p->shape, p->ndim, b1));
    return ND_OK;
}

/* *out = float64 copy (or a new reference when it is float64 already) */
static nd_status f64(const nd_tensor *t, nd_tensor **out) {
    *out = NULL;
    return t ? nd_to_dtype(t, ND_FLOAT64, out) : ND_OK;
}

/* a op b, releasing a (the running result) */
static nd_status step(nd_binary_op op, nd_tensor **a, const nd_tensor *b) {
    nd_tensor *r = NULL;
    nd_status st = nd_binary(op, *a, b, &r);
    nd_release(*a);
    *a = r;
    return st;
}

nd_status nd_fold_batch_norm(const nd_tensor *w, const nd_tensor *b, const nd_tensor *mean,
                             const nd_tensor *rstd, const nd_tensor *gamma, const nd_tensor *beta,
                             nd_tensor **w_out, nd_tensor **b_out) {
    char b1[ND_SHAPE_BUF];
    *w_out = *b_out = NULL;
    if (!w || !mean || !rstd)
        return nd_fail(ND_ERR_ARG, "fold_batch_norm: the weight, mean and rstd are required");
    if (w->ndim < 1 || (w->dtype != ND_FLOAT32 && w->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_SHAPE, "fold_batch_norm: expected a float32/float64 weight with the "
                       "output channels first, got %s %s", nd_dtype_name(w->dtype),
                       nd_shape_str(w->shape, w->ndim, b1));
    ND_TRY(fold_check("bias", b, w));
    ND_TRY(fold_check("mean", mean, w));
    ND_TRY(fold_check("rstd", rstd, w));
    ND_TRY(fold_check("gamma", gamma, w));
    ND_TRY(fold_check("beta", beta, w));
    bool grad = nd_set_grad_enabled(false); /* constants: no autograd graph */
    nd_tensor *w64 = NULL, *m64 = NULL, *s = NULL, *t = NULL, *x = NULL, *sv = NULL;
    int64_t vshape[ND_MAX_DIMS];
    vshape[0] = w->shape[0];
    for (int d = 1; d < w->ndim; d++) vshape[d] = 1;
    nd_status st = f64(rstd, &s); /* s = gamma * rstd */
    if (st == ND_OK && gamma) st = f64(gamma, &x);
    if (st == ND_OK && gamma) st = step(ND_BINARY_mul, &s, x);
    nd_release(x); x = NULL;
    if (st == ND_OK) st = f64(w, &w64); /* w' = w * s, s along dim 1 */
    if (st == ND_OK) st = nd_view(s, vshape, w->ndim, &sv);
    if (st == ND_OK) st = step(ND_BINARY_mul, &w64, sv);
    if (st == ND_OK) st = f64(mean, &m64); /* b' = (b - mean) * s + beta */
    if (st == ND_OK) {
        if (b) {
            st = f64(b, &t);
            if (st == ND_OK) st = step(ND_BINARY_sub, &t, m64);
        } else {
            st = nd_binary_scalar(ND_BINARY_mul, m64, -1.0, 0, &t);
        }
    }
    if (st == ND_OK) st = step(ND_BINARY_mul, &t, s);
    if (st == ND_OK && beta) st = f64(beta, &x);
    if (st == ND_OK && beta) st = step(ND_BINARY_add, &t, x);
    if (st == ND_OK) st = nd_to_dtype(w64, w->dtype, w_out);
    if (st == ND_OK) st = nd_to_dtype(t, w->dtype, b_out);
    nd_release(w64); nd_release(m64); nd_release(s); nd_release(t); nd_release(x); nd_release(sv);
    nd_set_grad_enabled(grad);
    if (st != ND_OK) {
        nd_release(*w_out); nd_release(*b_out);
        *w_out = *b_out = NULL;
    }
    return st;
}
