/* op_reduce.c - reductions: dim lists, keepdim, result dtypes. */
#include <math.h>
#include "backend.h"
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
