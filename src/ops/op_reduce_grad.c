/* op_reduce_grad.c - backward formulas of the reductions. The gradient of
 * the (possibly squeezed) result is first put back in keepdim form and
 * expanded over the reduced dims. */
#include <math.h>
#include "grad_expr.h"
#include "grad_fns.h"

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
    ND_TRY(nd_record(nd_reduce_name(op), bw_reduce, out, 1, in, &n));
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
    ND_TRY(nd_record("max", bw_max_dim, values, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim("max", dim, x->ndim, &d));
    n->dims[0] = d;
    n->ndims = x->ndim ? 1 : 0;
    n->iparams[3] = keepdim;
    return nd_save(n, indices, false);
}
