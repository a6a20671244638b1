/* op_norm.c - fused layer_norm and batch_norm (cross_entropy is in
 * op_loss.c).
 *
 * Forward passes are single fused kernels. Backward passes are written by
 * hand (the closed forms, not the composite's graph) with differentiable
 * ops, so they are also fast and still have second derivatives:
 *
 *   layer_norm:    xh = (x - mean) * rstd, gw = g * w
 *                  dx = rstd * (gw - mean(gw) - xh * mean(gw * xh))
 *                  dw = sum(g * xh), db = sum(g)   (over the leading dims)
 *
 * With create_graph the statistics are recomputed with differentiable ops
 * (the saved mean/rstd are constants and would hide their dependence on x). */
#include <math.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"


/* ------------------------------------------------------------ layer norm */

/* p's shape against x's normalized dims (and its device), dtype aside */
static nd_status check_param_shape(const char *what, const nd_tensor *p, const nd_tensor *x, int nnorm) {
    if (!p || nnorm < 1 || nnorm > x->ndim) return ND_OK; /* (a bad nnorm: layer_norm_forward's message) */
    ND_TRY(nd_check_same_device("layer_norm", x, p));
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    bool ok = p->ndim == nnorm;
    for (int i = 0; ok && i < nnorm; i++) ok = p->shape[i] == x->shape[x->ndim - nnorm + i];
    if (ok) return ND_OK;
    return nd_fail(ND_ERR_SHAPE, "layer_norm: %s of shape %s (%s) does not match the normalized "
                   "shape %s of the input (%s)", what, nd_shape_str(p->shape, p->ndim, b1),
                   nd_dtype_name(p->dtype), nd_shape_str(x->shape + x->ndim - nnorm, nnorm, b2),
                   nd_dtype_name(x->dtype));
}

static nd_status check_param(const char *what, const nd_tensor *p, const nd_tensor *x, int nnorm) {
    if (!p) return ND_OK;
    ND_TRY(nd_check_same_device("layer_norm", x, p));
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    bool ok = p->ndim == nnorm;
    for (int i = 0; ok && i < nnorm; i++) ok = p->shape[i] == x->shape[x->ndim - nnorm + i];
    if (ok && p->dtype == x->dtype) return ND_OK;
    if (ok)
        return nd_fail(ND_ERR_DTYPE, "layer_norm: %s (%s) and input (%s) must have the same dtype", what,
                       nd_dtype_name(p->dtype), nd_dtype_name(x->dtype));
    return nd_fail(ND_ERR_SHAPE, "layer_norm: %s of shape %s (%s) does not match the normalized "
                   "shape %s of the input (%s)", what, nd_shape_str(p->shape, p->ndim, b1),
                   nd_dtype_name(p->dtype), nd_shape_str(x->shape + x->ndim - nnorm, nnorm, b2),
                   nd_dtype_name(x->dtype));
}

static nd_status layer_norm_forward(const nd_tensor *x, int nnorm, const nd_tensor *w,
                                    const nd_tensor *b, double eps, nd_tensor **out,
                                    nd_tensor **mean, nd_tensor **rstd) {
    char buf[ND_SHAPE_BUF];
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "layer_norm: expected a float32 or float64 input, got %s",
                       nd_dtype_name(x->dtype));
    if (nnorm < 1 || nnorm > x->ndim)
        return nd_fail(ND_ERR_SHAPE, "layer_norm: cannot normalize the last %d dims of a tensor "
                       "of shape %s", nnorm, nd_shape_str(x->shape, x->ndim, buf));
    if (!(eps >= 0)) return nd_fail(ND_ERR_ARG, "layer_norm: eps must be >= 0, got %g", eps);
    ND_TRY(check_param("weight", w, x, nnorm));
    ND_TRY(check_param("bias", b, x, nnorm));
    int64_t stat_shape[ND_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) stat_shape[i] = i < x->ndim - nnorm ? x->shape[i] : 1;
    nd_tensor *xc = NULL, *wc = NULL, *bc = NULL;
    *out = *mean = *rstd = NULL;
    nd_status st = nd_contiguous(x, &xc);
    if (st == ND_OK && w) st = nd_contiguous(w, &wc);
    if (st == ND_OK && b) st = nd_contiguous(b, &bc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, x->dtype, out);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), stat_shape, x->ndim, x->dtype, mean);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), stat_shape, x->ndim, x->dtype, rstd);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, layer_norm, "layer_norm", *out, *mean, *rstd, xc, wc, bc, eps);
    }
    nd_release(xc); nd_release(wc); nd_release(bc);
    if (st != ND_OK) {
        nd_release(*out); nd_release(*mean); nd_release(*rstd);
        *out = *mean = *rstd = NULL;
    }
    return st;
}

/* One fused pass (no create_graph): dx, dw and db from the saved statistics. */
static nd_status bw_layer_norm_fused(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *x = NULL, *mean = NULL, *rstd = NULL, *w = NULL, *gc = NULL, *xc = NULL;
    nd_tensor *dx = NULL, *dw = NULL, *db = NULL;
    bool has_w = n->iparams[1];
    nd_tensor *xs = NULL, *ws = NULL;
    nd_status st = nd_saved(n, 0, &xs);
    if (st == ND_OK) st = nd_contiguous(xs, &x);
    if (st == ND_OK) st = nd_saved(n, 1, &mean);
    if (st == ND_OK) st = nd_saved(n, 2, &rstd);
    if (st == ND_OK && has_w) st = nd_saved(n, 3, &ws);
    if (st == ND_OK && has_w) st = nd_contiguous(ws, &w);
    if (st == ND_OK) st = nd_contiguous(g, &gc);
    if (st == ND_OK) st = nd_contiguous(x, &xc);
    if (st == ND_OK && w) { nd_tensor *wc; st = nd_contiguous(w, &wc); nd_release(w); w = wc; }
    if (st == ND_OK && n->needs_grad[0]) st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, x->dtype, &dx);
    int nnorm = (int)n->iparams[0];
    const int64_t *pshape = x->shape + x->ndim - nnorm;
    if (st == ND_OK && n->ninputs > 1 && n->needs_grad[1]) st = nd_empty_on(nd_get_device(x), pshape, nnorm, x->dtype, &dw);
    if (st == ND_OK && n->ninputs > 2 && n->needs_grad[2]) st = nd_empty_on(nd_get_device(x), pshape, nnorm, x->dtype, &db);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, layer_norm_backward, "layer_norm", dx, dw, db, gc, xc, w, mean, rstd);
    }
    nd_release(xs); nd_release(ws); /* the saved references themselves */
    nd_release(x); nd_release(mean); nd_release(rstd); nd_release(w); nd_release(gc); nd_release(xc);
    if (st != ND_OK) { nd_release(dx); nd_release(dw); nd_release(db); return st; }
    grads[0] = dx;
    if (n->ninputs > 1) grads[1] = dw; else nd_release(dw);
    if (n->ninputs > 2) grads[2] = db; else nd_release(db);
    return ND_OK;
}

static nd_status bw_layer_norm(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (!nd_grad_enabled()) return bw_layer_norm_fused(n, g, grads);
    nd_gx c = {0};
    int nd = n->in_ndim[0], nnorm = (int)n->iparams[0];
    double eps = n->fparams[0];
    int dims[ND_MAX_DIMS], lead[ND_MAX_DIMS], nlead = nd - nnorm;
    for (int i = 0; i < nnorm; i++) dims[i] = nlead + i;
    for (int i = 0; i < nlead; i++) lead[i] = i;
    nd_tensor *x = gx_saved(&c, n, 0);
    nd_tensor *w = n->iparams[1] ? gx_saved(&c, n, 3) : NULL;
    nd_tensor *mean = NULL, *rstd = NULL;
    if (nd_grad_enabled()) { /* create_graph: statistics as functions of x */
        nd_tensor *mu = NULL, *var = NULL;
        if (c.st == ND_OK) mu = gx_own(&c, nd_reduce(ND_REDUCE_mean, x, dims, nnorm, 1, 0, &mu), &mu);
        nd_tensor *d = gx_bin(&c, ND_BINARY_sub, x, mu);
        nd_tensor *d2 = gx_bin(&c, ND_BINARY_mul, d, d);
        if (c.st == ND_OK) var = gx_own(&c, nd_reduce(ND_REDUCE_mean, d2, dims, nnorm, 1, 0, &var), &var);
        mean = mu;
        rstd = gx_sc(&c, ND_BINARY_pow, gx_sc(&c, ND_BINARY_add, var, eps, 0), -0.5, 0);
    } else {
        mean = gx_saved(&c, n, 1);
        rstd = gx_saved(&c, n, 2);
    }
    nd_tensor *xh = gx_bin(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_sub, x, mean), rstd);
    if (n->needs_grad[0]) {
        nd_tensor *gw = w ? gx_bin(&c, ND_BINARY_mul, g, w) : g;
        nd_tensor *m1 = NULL, *m2 = NULL;
        if (c.st == ND_OK) m1 = gx_own(&c, nd_reduce(ND_REDUCE_mean, gw, dims, nnorm, 1, 0, &m1), &m1);
        nd_tensor *gwx = gx_bin(&c, ND_BINARY_mul, gw, xh);
        if (c.st == ND_OK) m2 = gx_own(&c, nd_reduce(ND_REDUCE_mean, gwx, dims, nnorm, 1, 0, &m2), &m2);
        nd_tensor *inner = gx_bin(&c, ND_BINARY_sub, gx_bin(&c, ND_BINARY_sub, gw, m1),
                                  gx_bin(&c, ND_BINARY_mul, xh, m2));
        grads[0] = gx_out(&c, gx_bin(&c, ND_BINARY_mul, inner, rstd));
    }
    if (n->ninputs > 1 && n->needs_grad[1]) { /* weight */
        nd_tensor *gx_ = gx_bin(&c, ND_BINARY_mul, g, xh), *s = gx_;
        if (nlead && c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, gx_, lead, nlead, 0, 0, &s), &s);
        grads[1] = gx_out(&c, s);
    }
    if (n->ninputs > 2 && n->needs_grad[2]) { /* bias */
        nd_tensor *s = g;
        if (nlead && c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, g, lead, nlead, 0, 0, &s), &s);
        grads[2] = gx_out(&c, s);
    }
    return gx_end(&c);
}

nd_status nd_layer_norm(const nd_tensor *x, int nnorm, const nd_tensor *weight,
                        const nd_tensor *bias, double eps, nd_tensor **out) {
    /* float16 / bfloat16 operands compute in float32 (nd_half_operands), their
     * shapes checked first on what the caller passed (the messages name its dtypes) */
    if ((weight && nd_dtype_is_half(weight->dtype)) || (bias && nd_dtype_is_half(bias->dtype))) {
        ND_TRY(check_param_shape("weight", weight, x, nnorm));
        ND_TRY(check_param_shape("bias", bias, x, nnorm));
    }
    ND_RETURN_IF_HALF3(x, weight, bias, nd_layer_norm(HX, nnorm, HW, HB, eps, out));
    nd_tensor *mean = NULL, *rstd = NULL;
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = layer_norm_forward(x, nnorm, weight, bias, eps, out, &mean, &rstd);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on) {
        nd_node *n;
        const nd_tensor *in[3] = {x, weight, bias};
        st = nd_record(ND_OP_layer_norm, bw_layer_norm, *out, 3, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = nnorm;
            n->iparams[1] = weight != NULL;
            n->fparams[0] = eps;
            st = nd_save(n, x, false);                     /* 0 */
            if (st == ND_OK) st = nd_save(n, mean, false); /* 1 */
            if (st == ND_OK) st = nd_save(n, rstd, false); /* 2 */
            if (st == ND_OK && weight) st = nd_save(n, weight, false); /* 3 */
        }
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(mean);
    nd_release(rstd);
    return st;
}

/* ------------------------------------------------------------ batch norm */

/* The tensor's (1, C, 1, ...) shape, for broadcasting per-channel values. */
static int channel_shape(const nd_tensor *x, int64_t *shape) {
    for (int i = 0; i < x->ndim; i++) shape[i] = i == 1 ? x->shape[1] : 1;
    return x->ndim;
}

/* a per-channel tensor's shape and device, whatever its dtype (bn_check_param
 * checks that too), for the half operands' path: its messages name the
 * dtypes the caller passed */
static nd_status bn_check_shape(const char *what, const nd_tensor *p, const nd_tensor *x) {
    char b1[ND_SHAPE_BUF];
    if (!p || x->ndim < 2) return ND_OK; /* (x's own shape: batch_norm_forward's message) */
    ND_TRY(nd_check_same_device("batch_norm", x, p));
    if (p->ndim != 1 || p->shape[0] != x->shape[1])
        return nd_fail(ND_ERR_SHAPE, "batch_norm: %s must have shape {%lld} (one value per channel), got %s %s",
                       what, (long long)x->shape[1], nd_dtype_name(p->dtype), nd_shape_str(p->shape, p->ndim, b1));
    return ND_OK;
}

static nd_status bn_check_param(const char *what, const nd_tensor *p, const nd_tensor *x) {
    char b1[ND_SHAPE_BUF];
    if (!p) return ND_OK;
    ND_TRY(nd_check_same_device("batch_norm", x, p));
    if (p->ndim != 1 || p->shape[0] != x->shape[1] || p->dtype != x->dtype)
        return nd_fail(ND_ERR_SHAPE, "batch_norm: %s must be a %s tensor of shape {%lld} (one "
                       "value per channel), got %s %s", what, nd_dtype_name(x->dtype),
                       (long long)x->shape[1], nd_dtype_name(p->dtype),
                       nd_shape_str(p->shape, p->ndim, b1));
    return ND_OK;
}

/* The backend's fused kernel (CPU), when the backward is not itself
 * recorded: two passes over x and g instead of a dozen ops. */
static nd_status bw_batch_norm_fused(nd_node *n, const nd_tensor *g, nd_tensor **grads) {
    const nd_backend *be = nd_backend_of(g);
    const bool has_w = n->iparams[1];
    const bool want_w = n->ninputs > 1 && n->needs_grad[1], want_b = n->ninputs > 2 && n->needs_grad[2];
    nd_tensor *x = NULL, *mean = NULL, *rstd = NULL, *w = NULL, *gc = NULL;
    nd_tensor *dx = NULL, *dw = NULL, *db = NULL;
    const nd_device dev = nd_get_device(g);
    nd_tensor *xs = NULL, *ws = NULL;
    nd_status st = nd_saved(n, 0, &xs);
    if (st == ND_OK) st = nd_contiguous(xs, &x);
    if (st == ND_OK) st = nd_saved(n, 1, &mean);
    if (st == ND_OK) st = nd_saved(n, 2, &rstd);
    if (st == ND_OK && has_w) st = nd_saved(n, 3, &ws);
    if (st == ND_OK && has_w) st = nd_contiguous(ws, &w);
    if (st == ND_OK) st = nd_contiguous(g, &gc);
    int64_t C = n->in_shape[0][1];
    if (st == ND_OK && n->needs_grad[0]) st = nd_empty_on(dev, x->shape, x->ndim, g->dtype, &dx);
    if (st == ND_OK && want_w) st = nd_empty_on(dev, &C, 1, g->dtype, &dw);
    if (st == ND_OK && want_b) st = nd_empty_on(dev, &C, 1, g->dtype, &db);
    if (st == ND_OK)
        st = ND_BACKEND_CALL(be, batch_norm_backward, "batch_norm", dx, dw, db, gc, x, w, mean, rstd,
                                n->iparams[0] != 0);
    nd_release(xs);
    nd_release(ws);
    nd_release(x);
    nd_release(mean);
    nd_release(rstd);
    nd_release(w);
    nd_release(gc);
    if (st != ND_OK) {
        nd_release(dx);
        nd_release(dw);
        nd_release(db);
        return st;
    }
    grads[0] = dx;
    if (n->ninputs > 1) grads[1] = dw;
    if (n->ninputs > 2) grads[2] = db;
    return ND_OK;
}

static nd_status bw_batch_norm(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (!nd_grad_enabled() && nd_backend_of(g)->batch_norm_backward)
        return bw_batch_norm_fused(n, g, grads);
    nd_gx c = {0};
    bool training = n->iparams[0], has_w = n->iparams[1];
    double eps = n->fparams[0];
    nd_tensor *x = gx_saved(&c, n, 0);
    if (c.st != ND_OK || !x) return gx_end(&c);
    int dims[ND_MAX_DIMS], nd = 0;
    for (int i = 0; i < x->ndim; i++) if (i != 1) dims[nd++] = i;
    int64_t cs[ND_MAX_DIMS];
    int cn = channel_shape(x, cs);
    nd_tensor *mean, *rstd;
    if (training && nd_grad_enabled()) { /* create_graph: statistics as functions of x */
        nd_tensor *mu = NULL, *var = NULL;
        mu = gx_own(&c, nd_reduce(ND_REDUCE_mean, x, dims, nd, 1, 0, &mu), &mu);
        nd_tensor *d = gx_bin(&c, ND_BINARY_sub, x, mu);
        nd_tensor *d2 = gx_bin(&c, ND_BINARY_mul, d, d);
        if (c.st == ND_OK) var = gx_own(&c, nd_reduce(ND_REDUCE_mean, d2, dims, nd, 1, 0, &var), &var);
        mean = mu;
        rstd = gx_sc(&c, ND_BINARY_pow, gx_sc(&c, ND_BINARY_add, var, eps, 0), -0.5, 0);
    } else {
        mean = gx_reshape(&c, gx_saved(&c, n, 1), cs, cn);
        rstd = gx_reshape(&c, gx_saved(&c, n, 2), cs, cn);
    }
    nd_tensor *w = has_w ? gx_reshape(&c, gx_saved(&c, n, 3), cs, cn) : NULL;
    nd_tensor *xh = gx_bin(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_sub, x, mean), rstd);
    if (n->needs_grad[0]) {
        nd_tensor *gw = w ? gx_bin(&c, ND_BINARY_mul, g, w) : g, *dx;
        if (training) {
            nd_tensor *m1 = NULL, *m2 = NULL;
            if (c.st == ND_OK) m1 = gx_own(&c, nd_reduce(ND_REDUCE_mean, gw, dims, nd, 1, 0, &m1), &m1);
            nd_tensor *gwx = gx_bin(&c, ND_BINARY_mul, gw, xh);
            if (c.st == ND_OK) m2 = gx_own(&c, nd_reduce(ND_REDUCE_mean, gwx, dims, nd, 1, 0, &m2), &m2);
            dx = gx_bin(&c, ND_BINARY_mul, rstd, gx_bin(&c, ND_BINARY_sub, gx_bin(&c, ND_BINARY_sub, gw, m1),
                        gx_bin(&c, ND_BINARY_mul, xh, m2)));
        } else {
            dx = gx_bin(&c, ND_BINARY_mul, gw, rstd); /* the statistics are constants */
        }
        grads[0] = gx_out(&c, dx);
    }
    if (n->ninputs > 1 && n->needs_grad[1]) {
        nd_tensor *s = NULL, *gx_ = gx_bin(&c, ND_BINARY_mul, g, xh);
        if (c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, gx_, dims, nd, 0, 0, &s), &s);
        grads[1] = gx_out(&c, s);
    }
    if (n->ninputs > 2 && n->needs_grad[2]) {
        nd_tensor *s = NULL;
        if (c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, g, dims, nd, 0, 0, &s), &s);
        grads[2] = gx_out(&c, s);
    }
    return gx_end(&c);
}

static nd_status batch_norm_forward(const nd_tensor *x, nd_tensor *rm, nd_tensor *rv,
                                    const nd_tensor *w, const nd_tensor *b, bool training,
                                    double momentum, double eps, nd_tensor **out,
                                    nd_tensor **mean, nd_tensor **rstd) {
    char b1[ND_SHAPE_BUF];
    *out = *mean = *rstd = NULL;
    if (x->ndim < 2 || (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64))
        return nd_fail(ND_ERR_SHAPE, "batch_norm: expected a float32/float64 input of shape "
                       "(N, C, ...), got %s %s", nd_dtype_name(x->dtype),
                       nd_shape_str(x->shape, x->ndim, b1));
    ND_TRY(bn_check_param("weight", w, x));
    ND_TRY(bn_check_param("bias", b, x));
    ND_TRY(bn_check_param("running_mean", rm, x));
    ND_TRY(bn_check_param("running_var", rv, x));
    if (!training && (!rm || !rv))
        return nd_fail(ND_ERR_ARG, "batch_norm: evaluation needs running_mean and running_var");
    if ((rm == NULL) != (rv == NULL))
        return nd_fail(ND_ERR_ARG, "batch_norm: give both running_mean and running_var, or neither");
    int64_t count = nd_numel(x) / (x->shape[1] ? x->shape[1] : 1);
    if (training && count < 2 && rm)
        return nd_fail(ND_ERR_SHAPE, "batch_norm: expected more than 1 value per channel when "
                       "training, got input of shape %s", nd_shape_str(x->shape, x->ndim, b1));
    int64_t C = x->shape[1];
    nd_tensor *xc = NULL, *wc = NULL, *bc = NULL;
    nd_status st = nd_contiguous(x, &xc);
    if (st == ND_OK && w) st = nd_contiguous(w, &wc);
    if (st == ND_OK && b) st = nd_contiguous(b, &bc);
    if (st == ND_OK) {
        if (training) {
            st = nd_empty_on(nd_get_device(x), &C, 1, x->dtype, mean);
            if (st == ND_OK) st = nd_empty_on(nd_get_device(x), &C, 1, x->dtype, rstd);
        } else { /* rstd = (running_var + eps)^-1/2 */
            nd_tensor *ve = NULL;
            st = nd_clone(rm, mean);
            if (st == ND_OK) st = nd_binary_scalar(ND_BINARY_add, rv, eps, 0, &ve);
            if (st == ND_OK) st = nd_unary(ND_UNARY_rsqrt, ve, rstd);
            nd_release(ve);
        }
    }
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, x->dtype, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, batch_norm, "batch_norm", *out, *mean, *rstd, xc, wc, bc, eps,
                             training);
    }
    if (st == ND_OK && training && rm) {
        /* running = (1 - m) running + m batch; the variance unbiased (count / (count - 1)) */
        nd_tensor *var = NULL, *t = NULL;
        st = nd_binary_scalar(ND_BINARY_pow, *rstd, -2, 0, &t);
        if (st == ND_OK) st = nd_binary_scalar(ND_BINARY_sub, t, eps, 0, &var);
        nd_release(t);
        double unbias = (double)count / (double)(count - 1);
        if (st == ND_OK) st = nd_binary_scalar_(ND_BINARY_mul, rm, 1 - momentum);
        if (st == ND_OK) st = nd_binary_scalar(ND_BINARY_mul, *mean, momentum, 0, &t);
        if (st == ND_OK) { st = nd_binary_(ND_BINARY_add, rm, t); nd_release(t); }
        if (st == ND_OK) st = nd_binary_scalar_(ND_BINARY_mul, rv, 1 - momentum);
        if (st == ND_OK) st = nd_binary_scalar(ND_BINARY_mul, var, momentum * unbias, 0, &t);
        if (st == ND_OK) { st = nd_binary_(ND_BINARY_add, rv, t); nd_release(t); }
        nd_release(var);
    }
    nd_release(xc); nd_release(wc); nd_release(bc);
    if (st != ND_OK) {
        nd_release(*out); nd_release(*mean); nd_release(*rstd);
        *out = *mean = *rstd = NULL;
    }
    return st;
}

nd_status nd_batch_norm(const nd_tensor *x, nd_tensor *running_mean, nd_tensor *running_var,
                        const nd_tensor *weight, const nd_tensor *bias, bool training,
                        double momentum, double eps, nd_tensor **out) {
    { /* float16 / bfloat16 operands compute in float32 (nd_half_operands); running
       * statistics updated in place cannot be converted copies */
        const nd_tensor *in[5] = {x, weight, bias, running_mean, running_var};
        nd_tensor *cv[5];
        bool half;
        const bool rm_half = running_mean && nd_dtype_is_half(running_mean->dtype),
                   rv_half = running_var && nd_dtype_is_half(running_var->dtype);
        if (training && (rm_half || rv_half))
            return nd_fail(ND_ERR_DTYPE, "batch_norm: running statistics in %s cannot be updated in training "
                           "mode (half precision is storage for inference); use eval() or keep them in %s",
                           nd_dtype_name(rm_half ? running_mean->dtype : running_var->dtype),
                           nd_dtype_name(x->dtype == ND_FLOAT64 ? ND_FLOAT64 : ND_FLOAT32));
        bool any_half = false;
        for (int i = 0; i < 5; i++) any_half = any_half || (in[i] && nd_dtype_is_half(in[i]->dtype));
        if (any_half) { /* shapes and devices checked on what the caller passed (the messages name its dtypes) */
            ND_TRY(bn_check_shape("weight", weight, x));
            ND_TRY(bn_check_shape("bias", bias, x));
            ND_TRY(bn_check_shape("running_mean", running_mean, x));
            ND_TRY(bn_check_shape("running_var", running_var, x));
        }
        ND_TRY(nd_half_operands(5, in, cv, &half));
        if (half) {
            nd_status st = nd_batch_norm(cv[0] ? cv[0] : x, cv[3] ? cv[3] : running_mean,
                                         cv[4] ? cv[4] : running_var, cv[1] ? cv[1] : weight,
                                         cv[2] ? cv[2] : bias, training, momentum, eps, out);
            nd_half_release(5, cv);
            return st;
        }
    }
    nd_tensor *mean = NULL, *rstd = NULL;
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = batch_norm_forward(x, running_mean, running_var, weight, bias, training,
                                      momentum, eps, out, &mean, &rstd);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on) {
        nd_node *n;
        const nd_tensor *in[3] = {x, weight, bias};
        st = nd_record(ND_OP_batch_norm, bw_batch_norm, *out, 3, in, &n);
        if (st == ND_OK && n) {
            n->iparams[0] = training;
            n->iparams[1] = weight != NULL;
            n->fparams[0] = eps;
            st = nd_save(n, x, false);
            if (st == ND_OK) st = nd_save(n, mean, false);
            if (st == ND_OK) st = nd_save(n, rstd, false);
            if (st == ND_OK && weight) st = nd_save(n, weight, false);
        }
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(mean);
    nd_release(rstd);
    return st;
}
