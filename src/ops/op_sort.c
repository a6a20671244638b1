/* op_sort.c - cumsum, sort and topk: checks, outputs, then the backend.
 * The differentiable entry points at the end run these forwards with grad
 * mode off, then record (the backward section). */
#include "backend_call.h"
#include "grad_fns.h"
#include "tensor.h"

static nd_status cumsum_forward(const nd_tensor *x, int dim, nd_tensor **out) {
    int d;
    *out = NULL;
    ND_TRY(nd_norm_dim("cumsum", dim, x->ndim, &d));
    if ((unsigned)x->dtype >= ND_NUM_DTYPES)
        return nd_fail(ND_ERR_DTYPE, "cumsum: invalid dtype %d", (int)x->dtype);
    /* As PyTorch: integer and bool sums are int64. */
    nd_dtype odt = nd_dtype_is_float(x->dtype) ? x->dtype : ND_INT64;
    nd_tensor *t;
    ND_TRY(nd_empty_on(nd_get_device(x), x->shape, x->ndim, odt, &t));
    const nd_backend *be = nd_backend_of(x);
    nd_status st = ND_BACKEND_CALL(be, cumsum, "cumsum", t, x, d);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

/* values and indices may each be NULL when the caller does not want them. */
static nd_status sort_forward(const nd_tensor *x, int dim, int descending, nd_tensor **values,
                             nd_tensor **indices) {
    int d;
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    ND_TRY(nd_norm_dim("sort", dim, x->ndim, &d));
    if ((unsigned)x->dtype >= ND_NUM_DTYPES)
        return nd_fail(ND_ERR_DTYPE, "sort: invalid dtype %d", (int)x->dtype);
    nd_tensor *v = NULL, *i = NULL;
    nd_status st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, x->dtype, &v);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, ND_INT64, &i);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, sort, "sort", v, i, x, d, descending);
    }
    if (st != ND_OK || !values) nd_release(v);
    if (st != ND_OK || !indices) nd_release(i);
    if (st != ND_OK) return st;
    if (values) *values = v;
    if (indices) *indices = i;
    return ND_OK;
}

/* The first k entries of t along dim, copied into fresh memory. */
static nd_status take_first(nd_tensor *t, int dim, int64_t k, nd_tensor **out) {
    nd_tensor *view, *c;
    ND_TRY(nd_narrow(t, dim, 0, k, &view));
    nd_status st = nd_empty_on(nd_get_device(view), view->shape, view->ndim, view->dtype, &c);
    if (st == ND_OK && (st = nd_copy_(c, view)) != ND_OK) nd_release(c);
    nd_release(view);
    if (st == ND_OK) *out = c;
    return st;
}

/* Values come sorted (largest first when largest, else smallest first);
 * NaN counts as the largest value, as in PyTorch. */
static nd_status topk_forward(const nd_tensor *x, int64_t k, int dim, int largest,
                             nd_tensor **values, nd_tensor **indices) {
    int d;
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    ND_TRY(nd_norm_dim("topk", dim, x->ndim, &d));
    int64_t size = x->ndim ? x->shape[d] : 1;
    if (k < 0 || k > size)
        return nd_fail(ND_ERR_INDEX, "topk: k (%lld) out of range for dim " ND_IXF " of size %lld "
                       "(expected 0..%lld)", (long long)k, ND_IX(d), (long long)size, (long long)size);
    nd_tensor *v, *i;
    ND_TRY(sort_forward(x, d, largest, &v, &i));
    if (k == size || x->ndim == 0) {
        if (values) *values = v; else nd_release(v);
        if (indices) *indices = i; else nd_release(i);
        return ND_OK;
    }
    nd_tensor *vk = NULL, *ik = NULL;
    nd_status st = ND_OK;
    if (values) st = take_first(v, d, k, &vk);
    if (st == ND_OK && indices) st = take_first(i, d, k, &ik);
    nd_release(v);
    nd_release(i);
    if (st != ND_OK) {
        nd_release(vk);
        return st;
    }
    if (values) *values = vk;
    if (indices) *indices = ik;
    return ND_OK;
}

/* ---- differentiable entry points */

nd_status nd_cumsum(const nd_tensor *x, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(cumsum_forward(x, dim, out), nd_record_cumsum(x, dim, *out), out);
}

/* sort and topk: the forward always makes the indices (the values' node
 * saves them) and hands back only the outputs the caller asked for. */
static nd_status sort_or_topk(bool topk, const nd_tensor *x, int64_t k, int dim, int flag,
                              nd_tensor **values, nd_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    nd_tensor *v = NULL, *i = NULL;
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = topk ? topk_forward(x, k, dim, flag, values ? &v : NULL, &i)
                        : sort_forward(x, dim, flag, values ? &v : NULL, &i);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on && v) st = nd_record_sort_values(topk ? ND_OP_topk : ND_OP_sort, x, dim, v, i);
    if (st != ND_OK) {
        nd_release(v);
        nd_release(i);
        return st;
    }
    if (values) *values = v;
    if (indices) *indices = i; else nd_release(i);
    return ND_OK;
}

nd_status nd_sort(const nd_tensor *x, int dim, int descending, nd_tensor **values,
                  nd_tensor **indices) {
    return sort_or_topk(false, x, 0, dim, descending, values, indices);
}

nd_status nd_topk(const nd_tensor *x, int64_t k, int dim, int largest, nd_tensor **values,
                  nd_tensor **indices) {
    return sort_or_topk(true, x, k, dim, largest, values, indices);
}

/* ---- backward: the formulas of cumsum and of the values of sort and
 * topk, and the recording of their nodes.
 *   cumsum       the reverse cumulative sum: flip(cumsum(flip(g)))
 *   sort, topk   values = x gathered at the returned indices, so the gradient
 *                is g scatter-added into zeros at those indices (the indices
 *                themselves are integers: no gradient)
 * Both are written with differentiable ops, so second derivatives work. */

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
    ND_TRY(nd_record(ND_OP_cumsum, bw_cumsum, out, 1, in, &n));
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

nd_status nd_record_sort_values(nd_op op, const nd_tensor *x, int dim, nd_tensor *values,
                                const nd_tensor *indices) {
    const char *name = nd_op_name(op);
    if (!nd_dtype_is_float(values->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(op, bw_sort_values, values, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &n->dims[0]));
    return nd_save(n, indices, false);
}
