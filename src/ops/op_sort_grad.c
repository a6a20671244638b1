/* op_sort_grad.c - backward formulas of cumsum and of the values of sort and
 * topk, and the recording of their nodes.
 *   cumsum       the reverse cumulative sum: flip(cumsum(flip(g)))
 *   sort, topk   values = x gathered at the returned indices, so the gradient
 *                is g scatter-added into zeros at those indices (the indices
 *                themselves are integers: no gradient)
 * Both are written with differentiable ops, so second derivatives work. */
#include "grad_expr.h"
#include "grad_fns.h"

static nd_status bw_cumsum(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (n->in_ndim[0] == 0) { /* a 0-dim cumsum is the identity */
        nd_retain(g);
        grads[0] = g;
        return ND_OK;
    }
    int d = n->dims[0];
    nd_tensor *f = NULL, *cs = NULL;
    nd_status st = nd_flip(g, &d, 1, &f);
    if (st == ND_OK) st = nd_cumsum(f, d, &cs);
    if (st == ND_OK) st = nd_flip(cs, &d, 1, &grads[0]);
    nd_release(f);
    nd_release(cs);
    return st;
}

nd_status nd_record_cumsum(const nd_tensor *x, int dim, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK; /* integer sums are int64 */
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("cumsum", bw_cumsum, out, 1, in, &n));
    if (!n) return ND_OK;
    return nd_norm_dim("cumsum", dim, x->ndim, &n->dims[0]);
}

static nd_status bw_sort_values(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    if (n->in_ndim[0] == 0) { /* a 0-dim tensor sorts to itself */
        nd_retain(g);
        grads[0] = g;
        return ND_OK;
    }
    nd_tensor *index;
    ND_TRY(nd_saved(n, 0, &index));
    nd_status st = nd_gather_backward(g, n->in_shape[0], n->in_ndim[0], n->dims[0], index,
                                      &grads[0]);
    nd_release(index);
    return st;
}

nd_status nd_record_sort_values(const char *name, const nd_tensor *x, int dim, nd_tensor *values,
                                const nd_tensor *indices) {
    if (!nd_dtype_is_float(values->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(name, bw_sort_values, values, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &n->dims[0]));
    return nd_save(n, indices, false);
}
