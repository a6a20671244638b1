/* op_softmax.c - softmax and log_softmax: a fused kernel forward, and a
 * backward written with differentiable ops (so it has a second derivative):
 *   softmax:     dx = y * (g - sum(g * y, dim))
 *   log_softmax: dx = g - exp(y) * sum(g, dim) */
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

static nd_status softmax_forward(const char *name, const nd_tensor *x, int dim, bool log,
                                 nd_tensor **out) {
    int d;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &d));
    if (!nd_dtype_is_float(x->dtype))
        return nd_fail(ND_ERR_DTYPE, "%s: expected a floating point tensor, got %s", name,
                       nd_dtype_name(x->dtype));
    nd_dtype dt = x->dtype == ND_FLOAT64 ? ND_FLOAT64 : ND_FLOAT32;
    nd_tensor *xc, *xd;
    ND_TRY(nd_as_dtype(x, dt, &xd));
    nd_status st = nd_contiguous(xd, &xc);
    nd_release(xd);
    ND_TRY(st);
    st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, dt, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, softmax, name, *out, xc, x->ndim ? d : 0, log);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(xc);
    return st;
}

static nd_status bw_softmax(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    bool log = n->iparams[0];
    int dim = n->dims[0];
    nd_tensor *y = gx_saved(&c, n, 0), *s = NULL, *r = NULL;
    if (!log) {
        nd_tensor *gy = gx_bin(&c, ND_BINARY_mul, g, y);
        if (c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, gy, &dim, 1, 1, 0, &s), &s);
        r = gx_bin(&c, ND_BINARY_mul, y, gx_bin(&c, ND_BINARY_sub, g, s));
    } else {
        if (c.st == ND_OK) s = gx_own(&c, nd_reduce(ND_REDUCE_sum, g, &dim, 1, 1, 0, &s), &s);
        r = gx_bin(&c, ND_BINARY_sub, g, gx_bin(&c, ND_BINARY_mul, gx_un(&c, ND_UNARY_exp, y), s));
    }
    grads[0] = gx_out(&c, r);
    return gx_end(&c);
}

static nd_status record_softmax(nd_op op, const nd_tensor *x, int dim, bool log,
                                nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(op, bw_softmax, out, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim(nd_op_name(op), dim, x->ndim, &d));
    n->dims[0] = d;
    n->iparams[0] = log;
    return nd_save(n, out, true);
}

nd_status nd_softmax(const nd_tensor *x, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(softmax_forward("softmax", x, dim, false, out),
                           record_softmax(ND_OP_softmax, x, dim, false, *out), out);
}

nd_status nd_log_softmax(const nd_tensor *x, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(softmax_forward("log_softmax", x, dim, true, out),
                           record_softmax(ND_OP_log_softmax, x, dim, true, *out), out);
}
