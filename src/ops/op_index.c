/* op_index.c - gather, scatter, index_select, index_add, masked_fill and
 * one_hot. The ops check shapes, dtypes and devices and build the output;
 * the kernels check every index value before writing anything. All results
 * are new tensors (out-of-place). The differentiable entry points at the end
 * run these forwards with grad mode off, then record (the backward section). */
#include <math.h>
#include <string.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"
#include "tensor.h"

static nd_status check_index_dtype(const char *op, const nd_tensor *index) {
    if (index->dtype != ND_INT64)
        return nd_fail(ND_ERR_DTYPE, "%s: index must be an int64 tensor, got %s", op,
                       nd_dtype_name(index->dtype));
    return ND_OK;
}

static nd_status check_device(const char *op, const nd_tensor *a, const nd_tensor *b) {
    return nd_check_same_device(op, a, b);
}

/* A fresh contiguous copy of x (broadcast to shape, cast to dt). */
static nd_status fresh_copy(const nd_tensor *x, const int64_t *shape, int ndim, nd_dtype dt,
                            nd_tensor **out) {
    nd_tensor *t;
    ND_TRY(nd_empty_on(nd_get_device(x), shape, ndim, dt, &t));
    nd_status st = nd_copy_(t, x);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

static nd_status gather_forward(const nd_tensor *x, int dim, const nd_tensor *index,
                              nd_tensor **out) {
    int d;
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    *out = NULL;
    ND_TRY(check_index_dtype("gather", index));
    ND_TRY(check_device("gather", x, index));
    ND_TRY(nd_norm_dim("gather", dim, x->ndim, &d));
    if (index->ndim != x->ndim)
        return nd_fail(ND_ERR_SHAPE, "gather: index of shape %s must have as many dims as x of "
                       "shape %s", nd_shape_str(index->shape, index->ndim, b1),
                       nd_shape_str(x->shape, x->ndim, b2));
    for (int i = 0; i < x->ndim; i++)
        if (i != d && index->shape[i] > x->shape[i])
            return nd_fail(ND_ERR_SHAPE, "gather: index of shape %s is larger than x of shape %s "
                           "in dim " ND_IXF " (only dim " ND_IXF " may be larger)",
                           nd_shape_str(index->shape, index->ndim, b1),
                           nd_shape_str(x->shape, x->ndim, b2), ND_IX(i), ND_IX(d));
    nd_tensor *t;
    ND_TRY(nd_empty_on(nd_get_device(x), index->shape, index->ndim, x->dtype, &t));
    const nd_backend *be = nd_backend_of(x);
    nd_status st = ND_BACKEND_CALL(be, gather, "gather", t, x, d, index);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

static nd_status scatter_forward(const nd_tensor *x, int dim, const nd_tensor *index,
                               const nd_tensor *src, int accumulate, nd_tensor **out) {
    const char *op = accumulate ? "scatter_add" : "scatter";
    int d;
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    *out = NULL;
    if (accumulate != 0 && accumulate != 1)
        return nd_fail(ND_ERR_ARG, "scatter: accumulate must be 0 or 1, got %d", accumulate);
    ND_TRY(check_index_dtype(op, index));
    ND_TRY(check_device(op, x, index));
    ND_TRY(check_device(op, x, src));
    ND_TRY(nd_norm_dim(op, dim, x->ndim, &d));
    if (index->ndim != x->ndim)
        return nd_fail(ND_ERR_SHAPE, "%s: index of shape %s must have as many dims as x of "
                       "shape %s", op, nd_shape_str(index->shape, index->ndim, b1),
                       nd_shape_str(x->shape, x->ndim, b2));
    /* A 0-dim src is a value scattered everywhere index points. */
    bool scalar_src = src->ndim == 0 && x->ndim > 0;
    if (!scalar_src && src->ndim != x->ndim)
        return nd_fail(ND_ERR_SHAPE, "%s: src of shape %s must have as many dims as x of "
                       "shape %s", op, nd_shape_str(src->shape, src->ndim, b1),
                       nd_shape_str(x->shape, x->ndim, b2));
    for (int i = 0; i < x->ndim; i++) {
        if (!scalar_src && index->shape[i] > src->shape[i])
            return nd_fail(ND_ERR_SHAPE, "%s: index of shape %s is larger than src of shape %s "
                           "in dim " ND_IXF, op, nd_shape_str(index->shape, index->ndim, b1),
                           nd_shape_str(src->shape, src->ndim, b2), ND_IX(i));
        if (i != d && index->shape[i] > x->shape[i])
            return nd_fail(ND_ERR_SHAPE, "%s: index of shape %s is larger than x of shape %s "
                           "in dim " ND_IXF " (only dim " ND_IXF " may be larger)", op,
                           nd_shape_str(index->shape, index->ndim, b1),
                           nd_shape_str(x->shape, x->ndim, b2), ND_IX(i), ND_IX(d));
    }
    nd_tensor *t = NULL, *s = NULL, *se = NULL;
    nd_status st = fresh_copy(x, x->shape, x->ndim, x->dtype, &t);
    if (st == ND_OK) st = nd_as_dtype(src, x->dtype, &s);
    if (st == ND_OK && scalar_src) st = nd_expand(s, index->shape, index->ndim, &se);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, scatter, op, t, d, index, se ? se : s, accumulate);
    }
    nd_release(s);
    nd_release(se);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

/* Index tensors of index_select / index_add are 1-D (or 0-dim: one index). */
static nd_status check_index_vector(const char *op, const nd_tensor *index) {
    char b1[ND_SHAPE_BUF];
    ND_TRY(check_index_dtype(op, index));
    if (index->ndim > 1)
        return nd_fail(ND_ERR_SHAPE, "%s: index must be 1-D, got shape %s", op,
                       nd_shape_str(index->shape, index->ndim, b1));
    return ND_OK;
}

static nd_status index_select_forward(const nd_tensor *x, int dim, const nd_tensor *index,
                                    nd_tensor **out) {
    int d;
    *out = NULL;
    ND_TRY(check_index_vector("index_select", index));
    ND_TRY(check_device("index_select", x, index));
    ND_TRY(nd_norm_dim("index_select", dim, x->ndim, &d));
    int64_t k = nd_numel(index);
    if (x->ndim == 0 && k != 1)
        return nd_fail(ND_ERR_SHAPE, "index_select: a 0-dim x takes exactly one index, got %lld",
                       (long long)k);
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    if (x->ndim) shape[d] = k;
    nd_tensor *t;
    ND_TRY(nd_empty_on(nd_get_device(x), shape, x->ndim, x->dtype, &t));
    const nd_backend *be = nd_backend_of(x);
    nd_status st = ND_BACKEND_CALL(be, index_select, "index_select", t, x, d, index);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

static nd_status index_add_forward(const nd_tensor *x, int dim, const nd_tensor *index,
                                 const nd_tensor *src, double alpha, nd_tensor **out) {
    int d;
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    *out = NULL;
    ND_TRY(check_index_vector("index_add", index));
    ND_TRY(check_device("index_add", x, index));
    ND_TRY(check_device("index_add", x, src));
    ND_TRY(nd_norm_dim("index_add", dim, x->ndim, &d));
    if (src->ndim != x->ndim)
        return nd_fail(ND_ERR_SHAPE, "index_add: src of shape %s must have as many dims as x of "
                       "shape %s", nd_shape_str(src->shape, src->ndim, b1),
                       nd_shape_str(x->shape, x->ndim, b2));
    for (int i = 0; i < x->ndim; i++)
        if (i != d && src->shape[i] != x->shape[i])
            return nd_fail(ND_ERR_SHAPE, "index_add: src of shape %s does not match x of shape %s "
                           "in dim " ND_IXF " (only dim " ND_IXF " may differ)",
                           nd_shape_str(src->shape, src->ndim, b1),
                           nd_shape_str(x->shape, x->ndim, b2), ND_IX(i), ND_IX(d));
    int64_t k = nd_numel(index), along = src->ndim ? src->shape[d] : 1;
    if (k != along)
        return nd_fail(ND_ERR_SHAPE, "index_add: index has %lld elements but src of shape %s has "
                       "%lld along dim " ND_IXF, (long long)k, nd_shape_str(src->shape, src->ndim, b1),
                       (long long)along, ND_IX(d));
    /* Integer kernels convert alpha to int64 (then wrap into the dtype, as
     * the elementwise ops): it must be a finite integer that int64 holds. */
    if (!nd_dtype_is_float(x->dtype)) {
        if (!isfinite(alpha))
            return nd_fail(ND_ERR_ARG, "index_add: alpha %g must be finite for dtype %s",
                           alpha, nd_dtype_name(x->dtype));
        if (alpha != floor(alpha))
            return nd_fail(ND_ERR_ARG, "index_add: alpha %g must be an integer for dtype %s",
                           alpha, nd_dtype_name(x->dtype));
        if (!(alpha >= -0x1p63 && alpha < 0x1p63))
            return nd_fail(ND_ERR_ARG, "index_add: alpha %g is out of range for dtype %s "
                           "(expected an integer in [-2^63, 2^63))", alpha,
                           nd_dtype_name(x->dtype));
    }
    nd_tensor *t = NULL, *s = NULL;
    nd_status st = fresh_copy(x, x->shape, x->ndim, x->dtype, &t);
    if (st == ND_OK) st = nd_as_dtype(src, x->dtype, &s);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, index_add, "index_add", t, d, index, s, alpha);
    }
    nd_release(s);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

/* As PyTorch's out-of-place masked_fill, x and mask broadcast together. */
static nd_status masked_fill_forward(const nd_tensor *x, const nd_tensor *mask, double value,
                                   nd_tensor **out) {
    *out = NULL;
    if (mask->dtype != ND_BOOL)
        return nd_fail(ND_ERR_DTYPE, "masked_fill: mask must be a bool tensor, got %s",
                       nd_dtype_name(mask->dtype));
    ND_TRY(check_device("masked_fill", x, mask));
    int64_t shape[ND_MAX_DIMS];
    int ndim = 0;
    ND_TRY(nd_broadcast_shape("masked_fill", x->shape, x->ndim, mask->shape, mask->ndim, shape,
                              &ndim));
    nd_tensor *t = NULL, *m = NULL;
    nd_status st = fresh_copy(x, shape, ndim, x->dtype, &t);
    if (st == ND_OK) st = nd_expand(mask, shape, ndim, &m);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, masked_fill, "masked_fill", t, m, value);
    }
    nd_release(m);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

/* Min or max over all of an int64 tensor, exactly (max and min of int64
 * are int64; a double would round values beyond 2^53). */
static nd_status reduce_i64(nd_reduce_op op, const nd_tensor *t, int64_t *v) {
    nd_tensor *r;
    ND_TRY(nd_reduce(op, t, NULL, 0, 0, 0, &r));
    nd_status st = r->dtype == ND_INT64 && nd_numel(r) == 1
                       ? nd_copy_to_buffer(r, v, sizeof *v)
                       : nd_fail(ND_ERR_INTERNAL, "one_hot: min/max of an int64 tensor gave %s",
                                 nd_dtype_name(r->dtype));
    nd_release(r);
    return st;
}

nd_status nd_one_hot(const nd_tensor *index, int64_t num_classes, nd_tensor **out) {
    char b1[ND_SHAPE_BUF];
    *out = NULL;
    ND_TRY(check_index_dtype("one_hot", index));
    if (index->ndim >= ND_MAX_DIMS)
        return nd_fail(ND_ERR_ARG, "one_hot: index of shape %s already has %d dims (the result "
                       "needs one more, at most %d)", nd_shape_str(index->shape, index->ndim, b1),
                       index->ndim, ND_MAX_DIMS);
    if (num_classes < -1)
        return nd_fail(ND_ERR_ARG, "one_hot: num_classes must be -1 (infer) or >= 0, got %lld",
                       (long long)num_classes);
    int64_t n = nd_numel(index);
    if (n == 0 && num_classes == -1)
        return nd_fail(ND_ERR_ARG, "one_hot: cannot infer num_classes from an empty index");
    if (n > 0) {
        int64_t lo, hi;
        ND_TRY(reduce_i64(ND_REDUCE_min, index, &lo));
        ND_TRY(reduce_i64(ND_REDUCE_max, index, &hi));
        if (lo < 0)
            return nd_fail(ND_ERR_INDEX, "one_hot: class values must be at least " ND_IXF
                           ", got " ND_IXF, ND_IX(0), ND_IX(lo));
        if (num_classes == -1) {
            if (hi == INT64_MAX)
                return nd_fail(ND_ERR_ARG, "one_hot: cannot infer num_classes from class value "
                               "%lld (num_classes would exceed int64)", (long long)hi);
            num_classes = hi + 1;
        } else if (hi >= num_classes)
            return nd_fail(ND_ERR_INDEX, "one_hot: class value " ND_IXF " is out of range for "
                           "num_classes %lld (expected " ND_IXF ".." ND_IXF ")", ND_IX(hi),
                           (long long)num_classes, ND_IX(0), ND_IX(num_classes - 1));
    }
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, index->shape, sizeof(int64_t) * (size_t)index->ndim);
    shape[index->ndim] = num_classes;
    /* A huge (inferred) num_classes fails here, named as one_hot's. */
    ND_TRY(nd_check_shape("one_hot", shape, index->ndim + 1, NULL));
    nd_tensor *t;
    ND_TRY(nd_zeros_on(nd_get_device(index), shape, index->ndim + 1, ND_INT64, &t));
    if (n == 0) {
        *out = t;
        return ND_OK;
    }
    /* out.scatter_(-1, index.unsqueeze(-1), 1) */
    nd_tensor *iv = NULL, *one = NULL, *ones = NULL;
    nd_status st = nd_unsqueeze(index, index->ndim, &iv);
    if (st == ND_OK) st = nd_full_on(nd_get_device(index), NULL, 0, ND_INT64, 1, &one);
    if (st == ND_OK) st = nd_expand(one, iv->shape, iv->ndim, &ones);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(index);
        st = ND_BACKEND_CALL(be, scatter, "one_hot", t, index->ndim, iv, ones, 0);
    }
    nd_release(iv);
    nd_release(one);
    nd_release(ones);
    if (st != ND_OK) {
        nd_release(t);
        return st;
    }
    *out = t;
    return ND_OK;
}

/* ---- differentiable entry points (one_hot's int64 result has no gradient) */

nd_status nd_gather(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(gather_forward(x, dim, index, out),
                           nd_record_gather(x, dim, index, *out), out);
}

nd_status nd_scatter(const nd_tensor *x, int dim, const nd_tensor *index, const nd_tensor *src,
                     int accumulate, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(scatter_forward(x, dim, index, src, accumulate, out),
                           nd_record_scatter(x, dim, index, src, accumulate, *out), out);
}

nd_status nd_index_select(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(index_select_forward(x, dim, index, out),
                           nd_record_index_select(x, dim, index, *out), out);
}

nd_status nd_index_add(const nd_tensor *x, int dim, const nd_tensor *index, const nd_tensor *src,
                       double alpha, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(index_add_forward(x, dim, index, src, alpha, out),
                           nd_record_index_add(x, dim, index, src, alpha, *out), out);
}

nd_status nd_masked_fill(const nd_tensor *x, const nd_tensor *mask, double value,
                         nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(masked_fill_forward(x, mask, value, out),
                           nd_record_masked_fill(x, mask, *out), out);
}

/* ---- backward: the formulas of gather, scatter, scatter_add,
 * index_select, index_add and masked_fill, and the recording of their nodes.
 *
 * The formulas are the ops' adjoints, written with the differentiable ops:
 *   gather        x: g scatter-added into zeros at index (nd_gather_backward)
 *   scatter       x: g with the scattered positions zeroed   src: gather(g)
 *   scatter_add   x: g                                        src: gather(g)
 *   index_select  x: g index-added into zeros
 *   index_add     x: g                                        src: index_select(g) * alpha
 *   masked_fill   x: g zeroed where mask (summed to x's shape); none for the value
 * Scatter-adding into zeros is recorded as a scatter_add whose src is g, and
 * index-adding as an index_add, so with create_graph their own gradients are
 * gather / index_select again: second derivatives work. Index tensors and
 * masks are saved (version-checked) for the formulas. */

/* ------------------------------------------------------------- helpers */

static nd_tensor *gx_gather(nd_gx *c, const nd_tensor *t, int dim, const nd_tensor *index) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_gather(t, dim, index, &r), &r);
}

static nd_tensor *gx_scatter(nd_gx *c, const nd_tensor *x, int dim, const nd_tensor *index,
                             const nd_tensor *src, int accumulate) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_scatter(x, dim, index, src, accumulate, &r), &r);
}

static nd_tensor *gx_index_select(nd_gx *c, const nd_tensor *t, int dim, const nd_tensor *index) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_index_select(t, dim, index, &r), &r);
}

static nd_tensor *gx_index_add(nd_gx *c, const nd_tensor *x, int dim, const nd_tensor *index,
                               const nd_tensor *src, double alpha) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_index_add(x, dim, index, src, alpha, &r), &r);
}

static nd_tensor *gx_sum_all(nd_gx *c, const nd_tensor *t) {
    if (c->st != ND_OK) return NULL;
    nd_tensor *r = NULL;
    return gx_own(c, nd_reduce(ND_REDUCE_sum, t, NULL, 0, 0, 0, &r), &r);
}

/* t (at most shape in every dim, same ndim) embedded at the start of zeros of
 * (shape, ndim): a pad at the end of each dim, itself differentiable. */
static nd_tensor *gx_embed_front(nd_gx *c, const nd_tensor *t, const int64_t *shape, int ndim) {
    if (c->st != ND_OK) return NULL;
    int64_t pads[2 * ND_MAX_DIMS];
    bool same = true;
    for (int i = 0; i < ndim; i++) {
        int d = ndim - 1 - i;
        pads[2 * i] = 0;
        pads[2 * i + 1] = shape[d] - t->shape[d];
        same = same && pads[2 * i + 1] == 0;
    }
    if (same) return (nd_tensor *)t;
    nd_tensor *r = NULL;
    return gx_own(c, nd_pad(t, pads, ndim, 0, &r), &r);
}

nd_status nd_gather_backward(const nd_tensor *g, const int64_t *shape, int ndim, int dim,
                             const nd_tensor *index, nd_tensor **out) {
    nd_tensor *z;
    ND_TRY(nd_zeros_on(nd_get_device(g), shape, ndim, g->dtype, &z));
    nd_status st = nd_scatter(z, dim, index, g, 1, out);
    nd_release(z);
    return st;
}

/* -------------------------------------------------------------- gather */

static nd_status bw_gather(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *index;
    ND_TRY(nd_saved(n, 0, &index));
    nd_status st = nd_gather_backward(g, n->in_shape[0], n->in_ndim[0], n->dims[0], index,
                                      &grads[0]);
    nd_release(index);
    return st;
}

nd_status nd_record_gather(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_gather, bw_gather, out, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("gather", dim, x->ndim, &n->dims[0]));
    return nd_save(n, index, false);
}

/* ------------------------------------------------ scatter, scatter_add */

/* inputs: x, (index), src */
static nd_status bw_scatter(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    int d = n->dims[0];
    bool accumulate = n->iparams[0] != 0;
    nd_tensor *index = gx_saved(&c, n, 0);
    if (n->needs_grad[0]) {
        if (accumulate) {
            grads[0] = gx_out(&c, g);
        } else { /* what was overwritten gets no gradient */
            nd_tensor *zero = gx_zeros(&c, g, NULL, 0, g->dtype);
            grads[0] = gx_out(&c, gx_scatter(&c, g, d, index, zero, 0));
        }
    }
    if (n->needs_grad[2]) {
        nd_tensor *r = gx_gather(&c, g, d, index);
        if (n->in_ndim[2] == 0 && n->in_ndim[0] > 0) /* one value scattered everywhere */
            r = gx_sum_all(&c, r);
        else /* src may be larger than index: the rest was not used */
            r = gx_embed_front(&c, r, n->in_shape[2], n->in_ndim[2]);
        grads[2] = gx_out(&c, r);
    }
    return gx_end(&c);
}

nd_status nd_record_scatter(const nd_tensor *x, int dim, const nd_tensor *index,
                            const nd_tensor *src, int accumulate, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_op op = accumulate ? ND_OP_scatter_add : ND_OP_scatter;
    const char *name = nd_op_name(op);
    nd_node *n;
    /* an integer src cast to x's dtype carries no gradient */
    const nd_tensor *in[3] = {x, NULL, src};
    ND_TRY(nd_record(op, bw_scatter, out, 3, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim(name, dim, x->ndim, &n->dims[0]));
    n->iparams[0] = accumulate;
    return nd_save(n, index, false);
}

/* ------------------------------------------------ index_select, index_add */

static nd_status bw_index_select(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *index = gx_saved(&c, n, 0);
    nd_tensor *z = gx_zeros(&c, g, n->in_shape[0], n->in_ndim[0], g->dtype);
    grads[0] = gx_out(&c, gx_index_add(&c, z, n->dims[0], index, g, 1.0));
    return gx_end(&c);
}

nd_status nd_record_index_select(const nd_tensor *x, int dim, const nd_tensor *index,
                                 nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_index_select, bw_index_select, out, 1, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("index_select", dim, x->ndim, &n->dims[0]));
    return nd_save(n, index, false);
}

/* inputs: x, (index), src */
static nd_status bw_index_add(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    double alpha = n->fparams[0];
    if (n->needs_grad[0]) grads[0] = gx_out(&c, g);
    if (n->needs_grad[2]) {
        nd_tensor *index = gx_saved(&c, n, 0);
        nd_tensor *r = gx_index_select(&c, g, n->dims[0], index);
        if (alpha != 1.0) r = gx_sc(&c, ND_BINARY_mul, r, alpha, 0);
        grads[2] = gx_out(&c, r);
    }
    return gx_end(&c);
}

nd_status nd_record_index_add(const nd_tensor *x, int dim, const nd_tensor *index,
                              const nd_tensor *src, double alpha, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[3] = {x, NULL, src};
    ND_TRY(nd_record(ND_OP_index_add, bw_index_add, out, 3, in, &n));
    if (!n) return ND_OK;
    ND_TRY(nd_norm_dim("index_add", dim, x->ndim, &n->dims[0]));
    n->fparams[0] = alpha;
    return nd_save(n, index, false);
}

/* ---------------------------------------------------------- masked_fill */

static nd_status bw_masked_fill(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *mask = gx_saved(&c, n, 0), *r = NULL;
    if (c.st == ND_OK) r = gx_own(&c, nd_masked_fill(g, mask, 0, &r), &r);
    grads[0] = gx_out(&c, gx_sum_to(&c, r, n, 0));
    return gx_end(&c);
}

nd_status nd_record_masked_fill(const nd_tensor *x, const nd_tensor *mask, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_masked_fill, bw_masked_fill, out, 1, in, &n));
    return n ? nd_save(n, mask, false) : ND_OK;
}
