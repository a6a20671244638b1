/* view_grad.c - backward formulas of the views, matmul and the copies.
 *
 * A view's gradient is the inverse view of the output gradient (reshape
 * back, permute back, sum over expanded dims), except select and slice:
 * their gradient is the output gradient embedded into zeros of the input's
 * shape, an op of its own ("slice_backward") whose backward is the slice
 * again - so second derivatives flow through views too. */
#include <string.h>
#include "grad_expr.h"
#include "grad_fns.h"

/* ------------------------------------------------ reshape-like, permute */

static nd_status bw_reshape(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    grads[0] = gx_out(&c, gx_reshape(&c, g, n->in_shape[0], n->in_ndim[0]));
    return gx_end(&c);
}

nd_status nd_record_reshape(const char *name, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record(name, bw_reshape, out, 1, in, &n);
}

static nd_status bw_permute(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    int inv[ND_MAX_DIMS];
    for (int i = 0; i < n->ndims; i++) inv[n->dims[i]] = i;
    nd_tensor *r;
    ND_TRY(nd_permute(g, inv, n->ndims, &r));
    grads[0] = r;
    return ND_OK;
}

nd_status nd_record_permute(const nd_tensor *x, const int *dims, int ndim, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("permute", bw_permute, out, 1, in, &n));
    if (!n) return ND_OK;
    for (int i = 0; i < ndim; i++) ND_TRY(nd_norm_dim("permute", dims[i], x->ndim, &n->dims[i]));
    n->ndims = ndim;
    return ND_OK;
}

static nd_status bw_transpose(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_transpose(g, n->dims[0], n->dims[1], &grads[0]);
}

nd_status nd_record_transpose(const nd_tensor *x, int d0, int d1, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("transpose", bw_transpose, out, 1, in, &n));
    if (!n) return ND_OK;
    n->dims[0] = d0;
    n->dims[1] = d1;
    return ND_OK;
}

static nd_status bw_expand(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_sum_to_shape(g, n->in_shape[0], n->in_ndim[0], &grads[0]);
}

nd_status nd_record_expand(const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record("expand", bw_expand, out, 1, in, &n);
}

/* ------------------------------------------------------ select, slice */

/* g embedded into zeros of shape (shape, ndim) at [start : : step] along dim */
static nd_status slice_backward(const nd_tensor *g, const int64_t *shape, int ndim, int dim,
                                int64_t start, int64_t step, nd_tensor **out);

static nd_status bw_slice_backward(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    int64_t start = n->iparams[0], step = n->iparams[1], len = n->in_shape[0][n->dims[0]];
    return nd_slice(g, n->dims[0], start, start + len * step, step, &grads[0]);
}

static nd_status slice_backward(const nd_tensor *g, const int64_t *shape, int ndim, int dim,
                                int64_t start, int64_t step, nd_tensor **out) {
    bool grad_on = nd_set_grad_enabled(false);
    nd_tensor *z = NULL, *v = NULL;
    nd_status st = nd_zeros_on(nd_get_device(g), shape, ndim, g->dtype, &z);
    if (st == ND_OK) st = nd_slice(z, dim, start, start + g->shape[dim] * step, step, &v);
    if (st == ND_OK) st = nd_copy_(v, g);
    nd_release(v);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on) {
        nd_node *n;
        const nd_tensor *in[1] = {g};
        st = nd_record("slice_backward", bw_slice_backward, z, 1, in, &n);
        if (st == ND_OK && n) {
            n->dims[0] = dim;
            n->iparams[0] = start;
            n->iparams[1] = step;
        }
    }
    if (st != ND_OK) { nd_release(z); z = NULL; }
    *out = z;
    return st;
}

static nd_status bw_slice(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return slice_backward(g, n->in_shape[0], n->in_ndim[0], n->dims[0], n->iparams[0],
                          n->iparams[1], &grads[0]);
}

nd_status nd_record_slice(const nd_tensor *x, int dim, int64_t start, int64_t step, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("slice", bw_slice, out, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim("slice", dim, x->ndim, &d));
    int64_t len = x->shape[d]; /* the same clamping as the forward */
    if (start < 0) start += len;
    if (start < 0) start = 0;
    if (start > len) start = len;
    n->dims[0] = d;
    n->iparams[0] = start;
    n->iparams[1] = step;
    return ND_OK;
}

static nd_status bw_select(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *u;
    ND_TRY(nd_unsqueeze(g, n->dims[0], &u));
    nd_status st = slice_backward(u, n->in_shape[0], n->in_ndim[0], n->dims[0], n->iparams[0], 1,
                                  &grads[0]);
    nd_release(u);
    return st;
}

nd_status nd_record_select(const nd_tensor *x, int dim, int64_t index, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("select", bw_select, out, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim("select", dim, x->ndim, &d));
    n->dims[0] = d;
    n->iparams[0] = index < 0 ? index + x->shape[d] : index;
    return ND_OK;
}

/* ------------------------------------------------------------ matmul */

static nd_status bw_matmul(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
    if (c.st != ND_OK || !a || !b) return gx_end(&c);
    /* 1-D operands as a row / a column, and g with those dims put back */
    bool a_vec = a->ndim == 1, b_vec = b->ndim == 1;
    int64_t as[ND_MAX_DIMS], bs[ND_MAX_DIMS], gs[ND_MAX_DIMS];
    int an = a->ndim, bn = b->ndim, gn = 0;
    memcpy(as, a->shape, sizeof as);
    memcpy(bs, b->shape, sizeof bs);
    if (a_vec) { as[1] = as[0]; as[0] = 1; an = 2; }
    if (b_vec) { bs[1] = 1; bn = 2; }
    int nb = g->ndim - !a_vec - !b_vec;
    for (int i = 0; i < nb; i++) gs[gn++] = g->shape[i];
    gs[gn++] = as[an - 2];
    gs[gn++] = bs[bn - 1];
    nd_tensor *a2 = gx_reshape(&c, a, as, an), *b2 = gx_reshape(&c, b, bs, bn);
    nd_tensor *g2 = gx_reshape(&c, g, gs, gn);
    if (n->needs_grad[0] && c.st == ND_OK) { /* g b^T, summed over broadcast batch dims */
        nd_tensor *bt = NULL, *r = NULL;
        bt = gx_own(&c, nd_transpose(b2, -1, -2, &bt), &bt);
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(g2, bt, &r), &r);
        nd_tensor *rs = NULL;
        if (c.st == ND_OK) rs = gx_own(&c, nd_sum_to_shape(r, as, an, &rs), &rs);
        grads[0] = gx_out(&c, gx_reshape(&c, rs, n->in_shape[0], n->in_ndim[0]));
    }
    if (n->needs_grad[1] && c.st == ND_OK) { /* a^T g */
        nd_tensor *at = NULL, *r = NULL;
        at = gx_own(&c, nd_transpose(a2, -1, -2, &at), &at);
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(at, g2, &r), &r);
        nd_tensor *rs = NULL;
        if (c.st == ND_OK) rs = gx_own(&c, nd_sum_to_shape(r, bs, bn, &rs), &rs);
        grads[1] = gx_out(&c, gx_reshape(&c, rs, n->in_shape[1], n->in_ndim[1]));
    }
    return gx_end(&c);
}

nd_status nd_record_matmul(const nd_tensor *a, const nd_tensor *b, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[2] = {a, b};
    ND_TRY(nd_record("matmul", bw_matmul, out, 2, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_save(n, a, false));
    return nd_save(n, b, false);
}

/* ------------------------------------------------------------- copies */

static nd_status bw_identity(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    (void)n;
    nd_retain(g);
    grads[0] = g;
    return ND_OK;
}

nd_status nd_record_identity(const char *name, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype) || out == x) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record(name, bw_identity, out, 1, in, &n);
}

static nd_status bw_to_dtype(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_to_dtype(g, n->in_dtype[0], &grads[0]);
}

nd_status nd_record_to_dtype(const nd_tensor *x, nd_tensor *out) {
    if (out == x || !nd_dtype_is_float(out->dtype) || !nd_dtype_is_float(x->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record("to", bw_to_dtype, out, 1, in, &n);
}
