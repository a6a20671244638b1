/* op_dilate.c - needle's dilate and undilate: checks, forward, backward.
 *
 * dilate follows every element along each of the given dims by `dilation`
 * zeros (a dim of size n becomes n (dilation + 1)); undilate keeps every
 * (dilation + 1)-th element. Each is the other's backward (undilate's cut
 * back to its input's size), so gradients of any order exist. */
#include <string.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

static nd_status dilate_args(const char *op, const nd_tensor *x, const int *dims, int ndims,
                             int64_t dilation, bool *mask) {
    if (dilation < 0)
        return nd_fail(ND_ERR_ARG, "%s: dilation must be >= 0, got %lld", op, (long long)dilation);
    if (ndims < 0 || ndims > ND_MAX_DIMS || (ndims > 0 && !dims))
        return nd_fail(ND_ERR_ARG, "%s: bad list of %d dims", op, ndims);
    for (int i = 0; i < ND_MAX_DIMS; i++) mask[i] = false;
    for (int i = 0; i < ndims; i++) {
        int d;
        ND_TRY(nd_norm_dim(op, dims[i], x->ndim, &d));
        if (mask[d]) return nd_fail(ND_ERR_ARG, "%s: dim " ND_IXF " is given twice", op, ND_IX(d));
        mask[d] = true;
    }
    return ND_OK;
}

/* v = t sliced with step (dilation + 1) along the masked dims (a view) */
static nd_status every_nth(const nd_tensor *t, const bool *mask, int64_t dilation, nd_tensor **v) {
    nd_tensor *cur = (nd_tensor *)t;
    nd_retain(cur);
    for (int d = 0; d < t->ndim; d++) {
        if (!mask[d]) continue;
        nd_tensor *next;
        nd_status st = nd_slice(cur, d, 0, t->shape[d], dilation + 1, &next);
        nd_release(cur);
        ND_TRY(st);
        cur = next;
    }
    *v = cur;
    return ND_OK;
}

static nd_status dilate_forward(const nd_tensor *x, const bool *mask, int64_t dilation,
                                nd_tensor **out) {
    int64_t shape[ND_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) {
        shape[d] = x->shape[d];
        if (!mask[d]) continue;
        if (x->shape[d] > 0 && dilation + 1 > ND_MAX_NUMEL / x->shape[d])
            return nd_fail(ND_ERR_MEMORY, "dilate: dim of size %lld dilated by %lld is too large",
                           (long long)x->shape[d], (long long)dilation);
        shape[d] *= dilation + 1;
    }
    nd_tensor *z, *v = NULL;
    ND_TRY(nd_zeros_on(nd_get_device(x), shape, x->ndim, x->dtype, &z));
    nd_status st = every_nth(z, mask, dilation, &v);
    if (st == ND_OK) st = nd_copy_(v, x);
    nd_release(v);
    if (st != ND_OK) { nd_release(z); return st; }
    *out = z;
    return ND_OK;
}

static nd_status undilate_forward(const nd_tensor *x, const bool *mask, int64_t dilation,
                                  nd_tensor **out) {
    nd_tensor *v;
    ND_TRY(every_nth(x, mask, dilation, &v));
    nd_status st = nd_clone(v, out);
    nd_release(v);
    return st;
}

static nd_status bw_dilate(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_undilate(g, n->dims, n->ndims, n->iparams[0], &grads[0]);
}

/* undilate's input may not have been a multiple of (dilation + 1) long:
 * dilate the gradient and cut it back to the input's size */
static nd_status bw_undilate(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *r = NULL;
    r = gx_own(&c, nd_dilate(g, n->dims, n->ndims, n->iparams[0], &r), &r);
    for (int i = 0; i < n->ndims && c.st == ND_OK; i++) {
        int d = n->dims[i];
        if (r->shape[d] == n->in_shape[0][d]) continue;
        nd_tensor *v = NULL;
        r = gx_own(&c, nd_narrow(r, d, 0, n->in_shape[0][d], &v), &v);
    }
    grads[0] = gx_out(&c, r);
    return gx_end(&c);
}

static nd_status record_dilate(bool un, const nd_tensor *x, const int *dims, int ndims,
                               int64_t dilation, nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    const char *name = nd_op_name(un ? ND_OP_undilate : ND_OP_dilate);
    ND_TRY(nd_record(un ? ND_OP_undilate : ND_OP_dilate, un ? bw_undilate : bw_dilate, out, 1, in, &n));
    if (!n) return ND_OK;
    n->ndims = 0;
    for (int i = 0; i < ndims; i++) { /* normalised (0-based, non-negative) */
        int d;
        ND_TRY(nd_norm_dim(name, dims[i], x->ndim, &d));
        n->dims[n->ndims++] = d;
    }
    n->iparams[0] = dilation;
    return ND_OK;
}

static nd_status dilate_op(const nd_tensor *x, const int *dims, int ndims, int64_t dilation,
                           bool un, nd_tensor **out) {
    const char *name = nd_op_name(un ? ND_OP_undilate : ND_OP_dilate);
    bool mask[ND_MAX_DIMS];
    ND_TRY(dilate_args(name, x, dims, ndims, dilation, mask));
    ND_FORWARD_THEN_RECORD(un ? undilate_forward(x, mask, dilation, out)
                              : dilate_forward(x, mask, dilation, out),
                           record_dilate(un, x, dims, ndims, dilation, *out), out);
}

nd_status nd_dilate(const nd_tensor *x, const int *dims, int ndims, int64_t dilation,
                    nd_tensor **out) {
    return dilate_op(x, dims, ndims, dilation, false, out);
}

nd_status nd_undilate(const nd_tensor *x, const int *dims, int ndims, int64_t dilation,
                      nd_tensor **out) {
    return dilate_op(x, dims, ndims, dilation, true, out);
}
