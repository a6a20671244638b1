/* op_join_grad.c - backward formulas of cat, stack, flip and pad, and the
 * recording of their nodes.
 *   cat    input i: the narrow of g where input i landed
 *   stack  input i: select(g, dim, i)
 *   flip   flip(g) over the same dims
 *   pad    pad(g) with the pads negated: positive pads are cropped off again,
 *          and what a negative pad cropped gets zeros
 * All are differentiable ops (views or pad), so second derivatives work.
 *
 * cat and stack record ONE node with all n inputs: a node's per-input arrays
 * are sized by its own input count (autograd.h), so there is no limit on n
 * and no chain of partial joins to build. */
#include "grad_expr.h"
#include "grad_fns.h"

/* ----------------------------------------------------------------- cat */

/* as the forward: 1-D empty inputs are skipped whatever the other shapes */
static bool cat_skipped_input(const nd_node *n, int i) {
    return n->in_ndim[i] == 1 && n->in_shape[i][0] == 0;
}

static nd_status bw_cat(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    int d = n->dims[0];
    int64_t off = 0;
    for (int i = 0; i < n->ninputs; i++) {
        if (cat_skipped_input(n, i)) {
            if (n->needs_grad[i]) ND_TRY(nd_zeros_on(nd_get_device(g), n->in_shape[i], 1, g->dtype, &grads[i]));
            continue;
        }
        int64_t len = n->in_shape[i][d];
        if (n->needs_grad[i]) ND_TRY(nd_narrow(g, d, off, len, &grads[i]));
        off += len;
    }
    return ND_OK;
}

nd_status nd_record_cat(nd_tensor *const *ts, int n, int dim, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *node;
    ND_TRY(nd_record("cat", bw_cat, out, n, (const nd_tensor *const *)ts, &node));
    if (!node) return ND_OK;
    for (int i = 0; i < n; i++) /* the dim is normalised against the first kept input */
        if (!(ts[i]->ndim == 1 && ts[i]->shape[0] == 0))
            return nd_norm_dim("cat", dim, ts[i]->ndim, &node->dims[0]);
    return ND_OK; /* all inputs were skipped: every gradient is empty */
}

/* --------------------------------------------------------------- stack */

static nd_status bw_stack(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    for (int i = 0; i < n->ninputs; i++)
        if (n->needs_grad[i]) ND_TRY(nd_select(g, n->dims[0], i, &grads[i]));
    return ND_OK;
}

nd_status nd_record_stack(nd_tensor *const *ts, int n, int dim, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *node;
    ND_TRY(nd_record("stack", bw_stack, out, n, (const nd_tensor *const *)ts, &node));
    if (!node) return ND_OK;
    return nd_norm_dim("stack", dim, ts[0]->ndim + 1, &node->dims[0]);
}

/* ---------------------------------------------------------------- flip */

static nd_status bw_flip(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_flip(g, n->dims, n->ndims, &grads[0]);
}

nd_status nd_record_flip(const nd_tensor *x, const int *dims, int ndims, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("flip", bw_flip, out, 1, in, &n));
    if (!n) return ND_OK;
    for (int i = 0; i < ndims; i++) ND_TRY(nd_norm_dim("flip", dims[i], x->ndim, &n->dims[i]));
    n->ndims = ndims;
    return ND_OK;
}

/* ----------------------------------------------------------------- pad */

/* iparams[i]: the pad before dim ndim-1-i, clamped to [-size, out size]
 * (beyond that every element is a pad value either way, and the clamped
 * value keeps the negated pads of the backward far from overflow); the pad
 * after follows from the shapes. */
static nd_status bw_pad(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    int64_t pads[2 * ND_MAX_DIMS];
    int nd = n->in_ndim[0];
    for (int i = 0; i < n->ndims; i++) {
        int d = nd - 1 - i;
        int64_t before = n->iparams[i], after = n->out_shape[d] - n->in_shape[0][d] - before;
        pads[2 * i] = -before;
        pads[2 * i + 1] = -after;
    }
    return nd_pad(g, pads, n->ndims, 0, &grads[0]);
}

nd_status nd_record_pad(const nd_tensor *x, const int64_t *pads, int npairs, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("pad", bw_pad, out, 1, in, &n));
    if (!n) return ND_OK;
    for (int i = 0; i < npairs; i++) {
        int d = x->ndim - 1 - i;
        int64_t before = pads[2 * i];
        if (before < -x->shape[d]) before = -x->shape[d];
        if (before > out->shape[d]) before = out->shape[d];
        n->iparams[i] = before;
    }
    n->ndims = npairs;
    return ND_OK;
}
