/* op_reduce.c - reductions: dim lists, keepdim, result dtypes; then their
 * backward formulas and the recording of their nodes. */
#include <math.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

/* Marks the reduced dims; ndims == 0 means all. */
static nd_status reduced_mask(const char *op, const nd_tensor *x, const int *dims, int ndims,
                              bool *mask) {
    for (int i = 0; i < ND_MAX_DIMS; i++) mask[i] = ndims == 0;
    for (int i = 0; i < ndims; i++) {
        int d;
        ND_TRY(nd_norm_dim(op, dims[i], x->ndim, &d));
        if (x->ndim == 0) continue;
        if (mask[d]) return nd_fail(ND_ERR_ARG, "%s: dim " ND_IXF " appears more than once", op, ND_IX(dims[i]));
        mask[d] = true;
    }
    return ND_OK;
}

/* Output shape in keepdim form, and the squeezed (final) form. */
static void out_shapes(const nd_tensor *x, const bool *mask, int64_t *keep, int64_t *squeezed,
                       int *nsq) {
    int k = 0;
    for (int i = 0; i < x->ndim; i++) {
        keep[i] = mask[i] ? 1 : x->shape[i];
        if (!mask[i]) squeezed[k++] = x->shape[i];
    }
    *nsq = k;
}

/* Drops the reduced dims of a keepdim result (a view). */
static nd_status squeeze_reduced(nd_tensor *r, const bool *mask, int keepdim, nd_tensor **out) {
    if (keepdim) { *out = r; return ND_OK; }
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < r->ndim; i++)
        if (!mask[i]) { ns[k] = r->shape[i]; st[k] = r->strides[i]; k++; }
    nd_status s = nd_tensor_view_of(r, ns, st, k, r->offset, out);
    nd_release(r);
    return s;
}

static nd_status reduce_dtypes(nd_reduce_op op, nd_dtype in, nd_dtype *compute, nd_dtype *result) {
    if (in == ND_FLOAT16 || in == ND_BFLOAT16) in = ND_FLOAT32;
    *compute = in;
    switch (op) {
    case ND_REDUCE_sum: case ND_REDUCE_prod:
        *result = nd_dtype_is_float(in) ? in : ND_INT64;
        break;
    case ND_REDUCE_max: case ND_REDUCE_min:
        *result = in;
        break;
    case ND_REDUCE_argmax: case ND_REDUCE_argmin:
        *result = ND_INT64;
        break;
    default: /* mean, var, std, logsumexp are float ops */
        if (!nd_dtype_is_float(in)) *compute = ND_FLOAT32;
        *result = *compute;
        break;
    }
    return ND_OK;
}

static nd_status reduce_forward(nd_reduce_op op, const nd_tensor *x, const int *dims, int ndims,
                                int keepdim, int correction, nd_tensor **out) {
    if ((unsigned)op >= ND_NUM_REDUCE) return nd_fail(ND_ERR_ARG, "reduce: invalid op %d", op);
    const char *name = nd_reduce_name(op);
    bool mask[ND_MAX_DIMS];
    ND_TRY(reduced_mask(name, x, dims, ndims, mask));
    bool arg = op == ND_REDUCE_argmax || op == ND_REDUCE_argmin;
    if (arg && ndims > 1)
        return nd_fail(ND_ERR_ARG, "%s: expected a single dim, got %d dims", name, ndims);
    int64_t count = 1;
    for (int i = 0; i < x->ndim; i++) if (mask[i]) count *= x->shape[i];
    bool needs_elements = op == ND_REDUCE_max || op == ND_REDUCE_min || arg;
    if (needs_elements && count == 0 && nd_numel(x) == 0) {
        char b[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: cannot reduce an empty tensor of shape %s (no "
                       "identity for %s)", name, nd_shape_str(x->shape, x->ndim, b), name);
    }
    nd_dtype compute, result;
    ND_TRY(reduce_dtypes(op, x->dtype, &compute, &result));
    /* argmax/argmin without dim reduce the flattened tensor */
    nd_tensor *xc;
    ND_TRY(nd_as_dtype(x, compute, &xc));
    int64_t keep[ND_MAX_DIMS], sq[ND_MAX_DIMS];
    int nsq;
    out_shapes(x, mask, keep, sq, &nsq);
    nd_tensor *r;
    nd_status st = nd_empty_on(nd_get_device(x), keep, x->ndim, result, &r);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, reduce, name, op, r, xc, mask, correction);
        if (st != ND_OK) nd_release(r);
    }
    nd_release(xc);
    if (st != ND_OK) return st;
    return squeeze_reduced(r, mask, keepdim, out);
}

static nd_status max_dim_forward(const nd_tensor *x, int dim, int keepdim, int is_min,
                                 nd_tensor **values, nd_tensor **indices) {
    const char *name = is_min ? "min" : "max";
    int d;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &d));
    bool mask[ND_MAX_DIMS] = {0};
    if (x->ndim > 0) mask[d] = true;
    if (x->ndim > 0 && x->shape[d] == 0) {
        char b[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s: cannot reduce dim " ND_IXF " of size 0 (shape %s)", name, ND_IX(d),
                       nd_shape_str(x->shape, x->ndim, b));
    }
    nd_dtype compute = x->dtype == ND_FLOAT16 || x->dtype == ND_BFLOAT16 ? ND_FLOAT32 : x->dtype;
    nd_tensor *xc, *v = NULL, *ix = NULL;
    ND_TRY(nd_as_dtype(x, compute, &xc));
    int64_t keep[ND_MAX_DIMS], sq[ND_MAX_DIMS];
    int nsq;
    out_shapes(x, mask, keep, sq, &nsq);
    nd_status st = nd_empty_on(nd_get_device(x), keep, x->ndim, compute, &v);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), keep, x->ndim, ND_INT64, &ix);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, max_dim, name, v, ix, xc, x->ndim ? d : 0, is_min);
    }
    nd_release(xc);
    if (st != ND_OK) { nd_release(v); nd_release(ix); return st; }
    st = squeeze_reduced(v, mask, keepdim, values);
    if (st != ND_OK) { nd_release(ix); return st; }
    st = squeeze_reduced(ix, mask, keepdim, indices);
    if (st != ND_OK) { nd_release(*values); *values = NULL; }
    return st;
}

/* ---- differentiable entry points */

nd_status nd_reduce(nd_reduce_op op, const nd_tensor *x, const int *dims, int ndims, int keepdim,
                    int correction, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(reduce_forward(op, x, dims, ndims, keepdim, correction, out),
                           nd_record_reduce(op, x, dims, ndims, keepdim, correction, *out), out);
}

nd_status nd_max_dim(const nd_tensor *x, int dim, int keepdim, int is_min, nd_tensor **values,
                     nd_tensor **indices) {
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = max_dim_forward(x, dim, keepdim, is_min, values, indices);
    nd_set_grad_enabled(grad_on);
    if (st == ND_OK && grad_on) {
        st = nd_record_max_dim(x, dim, keepdim, *values, *indices);
        if (st != ND_OK) {
            nd_release(*values);
            nd_release(*indices);
            *values = *indices = NULL;
        }
    }
    return st;
}

/* ---- backward: the formulas of the reductions. The gradient of
 * the (possibly squeezed) result is first put back in keepdim form and
 * expanded over the reduced dims. */

/* g (shape of the result) -> the input's shape, broadcast over reduced dims */
static nd_tensor *expand_back(nd_gx *c, nd_node *n, const nd_tensor *g) {
    int64_t keep[ND_MAX_DIMS];
    for (int i = 0; i < n->in_ndim[0]; i++) keep[i] = n->in_shape[0][i];
    for (int k = 0; k < n->ndims; k++) keep[n->dims[k]] = 1;
    nd_tensor *gk = gx_reshape(c, g, keep, n->in_ndim[0]);
    return gx_expand(c, gk, n->in_shape[0], n->in_ndim[0]);
}

static nd_tensor *mean_keep(nd_gx *c, nd_node *n, const nd_tensor *x) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_reduce(ND_REDUCE_mean, x, n->dims, n->ndims, 1, 0, &r), &r);
}

static nd_status bw_reduce(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_reduce_op op = (nd_reduce_op)n->iparams[0];
    double count = (double)n->iparams[2];
    double denom = count - (double)n->iparams[1]; /* N - correction */
    nd_tensor *ge = expand_back(&c, n, g), *r = NULL;
    switch (op) {
    case ND_REDUCE_sum: r = ge; break;
    case ND_REDUCE_mean: r = gx_sc(&c, ND_BINARY_div, ge, count, 0); break;
    case ND_REDUCE_prod: { /* product of the other elements, exact with zeros:
                              * no zero: prod / x; one zero: the product of
                              * the rest at the zero, 0 elsewhere; more: 0 */
        nd_tensor *x = gx_saved(&c, n, 0);
        nd_tensor *is0 = gx_sc(&c, ND_BINARY_eq, x, 0, 0);
        nd_tensor *one = NULL, *zero = NULL, *nz = NULL, *p = NULL;
        if (c.st == ND_OK) one = gx_own(&c, nd_full_on(nd_get_device(x), NULL, 0, x->dtype, 1, &one), &one);
        zero = gx_zeros(&c, x, NULL, 0, x->dtype);
        nd_tensor *x_safe = gx_where(&c, is0, one, x); /* zeros replaced by 1 */
        nd_tensor *z = gx_to(&c, is0, x->dtype);
        if (c.st == ND_OK) nz = gx_own(&c, nd_reduce(ND_REDUCE_sum, z, n->dims, n->ndims, 1, 0, &nz), &nz);
        if (c.st == ND_OK) p = gx_own(&c, nd_reduce(ND_REDUCE_prod, x_safe, n->dims, n->ndims, 1, 0, &p), &p);
        nd_tensor *pe = gx_expand(&c, p, n->in_shape[0], n->in_ndim[0]);
        nd_tensor *nze = gx_expand(&c, nz, n->in_shape[0], n->in_ndim[0]);
        nd_tensor *no_zero = gx_bin(&c, ND_BINARY_div, pe, x_safe);
        nd_tensor *one_zero = gx_where(&c, is0, pe, zero);
        nd_tensor *d = gx_where(&c, gx_sc(&c, ND_BINARY_eq, nze, 0, 0), no_zero,
                                gx_where(&c, gx_sc(&c, ND_BINARY_eq, nze, 1, 0), one_zero, zero));
        r = gx_bin(&c, ND_BINARY_mul, ge, d);
        break;
    }
    case ND_REDUCE_max: case ND_REDUCE_min: { /* split evenly among the extrema */
        nd_tensor *x = gx_saved(&c, n, 0), *y = expand_back(&c, n, gx_saved(&c, n, 1));
        nd_tensor *mask = gx_to(&c, gx_bin(&c, ND_BINARY_eq, x, y), g->dtype);
        nd_tensor *cnt = NULL;
        if (c.st == ND_OK) cnt = gx_own(&c, nd_reduce(ND_REDUCE_sum, mask, n->dims, n->ndims, 1, 0, &cnt), &cnt);
        r = gx_bin(&c, ND_BINARY_mul, ge, gx_bin(&c, ND_BINARY_div, mask, cnt));
        break;
    }
    case ND_REDUCE_var: { /* 2 (x - mean) / (N - correction) */
        nd_tensor *x = gx_saved(&c, n, 0);
        nd_tensor *d = gx_bin(&c, ND_BINARY_sub, x, mean_keep(&c, n, x));
        r = gx_bin(&c, ND_BINARY_mul, ge, gx_sc(&c, ND_BINARY_mul, d, 2.0 / denom, 0));
        break;
    }
    case ND_REDUCE_std: { /* (x - mean) / ((N - correction) std) */
        nd_tensor *x = gx_saved(&c, n, 0), *y = expand_back(&c, n, gx_saved(&c, n, 1));
        nd_tensor *d = gx_bin(&c, ND_BINARY_sub, x, mean_keep(&c, n, x));
        r = gx_bin(&c, ND_BINARY_mul, ge, gx_bin(&c, ND_BINARY_div, gx_sc(&c, ND_BINARY_div, d, denom, 0), y));
        break;
    }
    case ND_REDUCE_logsumexp: { /* softmax weights */
        nd_tensor *x = gx_saved(&c, n, 0), *y = expand_back(&c, n, gx_saved(&c, n, 1));
        r = gx_bin(&c, ND_BINARY_mul, ge, gx_un(&c, ND_UNARY_exp, gx_bin(&c, ND_BINARY_sub, x, y)));
        break;
    }
    default: break;
    }
    grads[0] = gx_out(&c, r);
    return gx_end(&c);
}

nd_status nd_record_reduce(nd_reduce_op op, const nd_tensor *x, const int *dims, int ndims,
                           int keepdim, int correction, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK; /* argmax/argmin, integer sums */
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(nd_reduce_op_id(op), bw_reduce, out, 1, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    n->iparams[1] = correction;
    /* normalised, sorted reduced dims (all when none were given) */
    bool mask[ND_MAX_DIMS] = {0};
    for (int i = 0; i < ndims; i++) {
        int d;
        ND_TRY(nd_norm_dim(nd_reduce_name(op), dims[i], x->ndim, &d));
        if (x->ndim) mask[d] = true;
    }
    int64_t count = 1;
    n->ndims = 0;
    for (int i = 0; i < x->ndim; i++)
        if (ndims == 0 || mask[i]) { n->dims[n->ndims++] = i; count *= x->shape[i]; }
    n->iparams[2] = count;
    n->iparams[3] = keepdim;
    switch (op) {
    case ND_REDUCE_sum: case ND_REDUCE_mean: return ND_OK;
    case ND_REDUCE_var: case ND_REDUCE_prod: return nd_save(n, x, false);
    default:
        ND_TRY(nd_save(n, x, false));
        return nd_save(n, out, true);
    }
}

/* max(dim)/min(dim) values: the gradient goes to the index each value came from */
static nd_status bw_max_dim(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    int d = n->dims[0], nd = n->in_ndim[0];
    nd_tensor *idx = expand_back(&c, n, gx_saved(&c, n, 0));
    int64_t shape[ND_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = i == d ? n->in_shape[0][i] : 1;
    nd_tensor *ar = NULL;
    if (c.st == ND_OK) ar = gx_own(&c, nd_arange(0, (double)n->in_shape[0][d], 1, ND_INT64, &ar), &ar);
    nd_tensor *ard = NULL; /* the positions on g's device */
    if (c.st == ND_OK && !nd_on_cpu(g)) ar = gx_own(&c, nd_to_device(ar, nd_get_device(g), &ard), &ard);
    nd_tensor *pos = gx_reshape(&c, ar, shape, nd);
    nd_tensor *hit = gx_to(&c, gx_bin(&c, ND_BINARY_eq, pos, idx), g->dtype);
    grads[0] = gx_out(&c, gx_bin(&c, ND_BINARY_mul, expand_back(&c, n, g), hit));
    return gx_end(&c);
}

nd_status nd_record_max_dim(const nd_tensor *x, int dim, int keepdim, nd_tensor *values,
                            const nd_tensor *indices) {
    if (!nd_dtype_is_float(values->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_max, bw_max_dim, values, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim("max", dim, x->ndim, &d));
    n->dims[0] = d;
    n->ndims = x->ndim ? 1 : 0;
    n->iparams[3] = keepdim;
    return nd_save(n, indices, false);
}
