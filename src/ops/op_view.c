/* op_view.c - views: new geometry over the same storage, no copies; then
 * their backward formulas. A view's gradient is the inverse view of the
 * output gradient (reshape back, permute back, sum over expanded dims),
 * except select and slice: their gradient is the output gradient embedded
 * into zeros of the input's shape, an op of its own ("slice_backward")
 * whose backward is the slice again - so second derivatives flow through
 * views too. */
#include <string.h>
#include "grad_expr.h"
#include "grad_fns.h"

/* Resolves one -1 in a requested shape against numel. The request obeys
 * the size rule (nd_check_shape, with the -1 counted as 1) before anything
 * is multiplied, so {0, 2^62, 2^62} is refused although it has as many
 * elements (none) as the tensor. */
static nd_status infer_shape(const char *op, const nd_tensor *t, const int64_t *shape, int ndim,
                             int64_t *out) {
    if (ndim < 0 || ndim > ND_MAX_DIMS)
        return nd_fail(ND_ERR_ARG, "%s: %d dims requested, at most %d supported", op, ndim,
                       ND_MAX_DIMS);
    int infer = -1;
    int64_t known, numel = nd_numel(t);
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return nd_fail(ND_ERR_ARG, "%s: only one dim can be -1", op);
            infer = i;
            out[i] = 1;
        } else if (shape[i] < 0) {
            return nd_fail(ND_ERR_ARG, "%s: invalid size %lld in shape %s", op,
                           (long long)shape[i], nd_shape_str(shape, ndim, b1));
        }
    }
    ND_TRY(nd_check_shape(op, out, ndim, &known));
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return nd_fail(ND_ERR_SHAPE, "%s: shape %s is invalid for a tensor of shape %s "
                           "(%lld elements)", op, nd_shape_str(shape, ndim, b1),
                           nd_shape_str(t->shape, t->ndim, b2), (long long)numel);
        out[infer] = numel / known; /* the whole shape then has numel (<= 2^48) elements */
    } else if (known != numel) {
        return nd_fail(ND_ERR_SHAPE, "%s: shape %s is invalid for a tensor of shape %s "
                       "(%lld elements)", op, nd_shape_str(shape, ndim, b1),
                       nd_shape_str(t->shape, t->ndim, b2), (long long)numel);
    }
    return ND_OK;
}

/* Strides for viewing t as newshape without copying, as PyTorch's
 * computeStride: dims are grouped into chunks that are contiguous with
 * respect to each other, and each chunk must map onto whole new dims. */
static int view_strides(const nd_tensor *t, const int64_t *newshape, int nd, int64_t *ns) {
    if (nd_numel(t) == 0 || t->ndim == 0) {
        nd_contiguous_strides(newshape, nd, ns);
        return 1;
    }
    int view_d = nd - 1;
    int64_t chunk_base = t->strides[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->shape[d];
        if (d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
                ns[view_d] = view_numel * chunk_base;
                view_numel *= newshape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return 0;
            if (d > 0) {
                chunk_base = t->strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

static nd_status view_forward(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    ND_TRY(infer_shape("view", t, shape, ndim, ns));
    if (!view_strides(t, ns, ndim, st)) {
        char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF], b3[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "view: cannot view a tensor of shape %s and strides %s as "
                       "shape %s without copying (use reshape, or contiguous first)",
                       nd_shape_str(t->shape, t->ndim, b1), nd_shape_str(t->strides, t->ndim, b2),
                       nd_shape_str(ns, ndim, b3));
    }
    return nd_tensor_view_of(t, ns, st, ndim, t->offset, out);
}

static nd_status reshape_forward(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    ND_TRY(infer_shape("reshape", t, shape, ndim, ns));
    if (view_strides(t, ns, ndim, st)) return nd_tensor_view_of(t, ns, st, ndim, t->offset, out);
    nd_tensor *c;
    ND_TRY(nd_contiguous(t, &c));
    nd_contiguous_strides(ns, ndim, st);
    nd_status s = nd_tensor_view_of(c, ns, st, ndim, c->offset, out);
    nd_release(c);
    return s;
}

static nd_status permute_forward(const nd_tensor *t, const int *dims, int ndim, nd_tensor **out) {
    if (ndim != t->ndim)
        return nd_fail(ND_ERR_ARG, "permute: %d dims given for a tensor with %d dims", ndim,
                       t->ndim);
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    bool seen[ND_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++) {
        int d;
        ND_TRY(nd_norm_dim("permute", dims[i], t->ndim, &d));
        if (seen[d]) return nd_fail(ND_ERR_ARG, "permute: dim " ND_IXF " appears twice", ND_IX(dims[i]));
        seen[d] = true;
        ns[i] = t->shape[d];
        st[i] = t->strides[d];
    }
    return nd_tensor_view_of(t, ns, st, ndim, t->offset, out);
}

static nd_status transpose_forward(const nd_tensor *t, int d0, int d1, nd_tensor **out) {
    int a, b;
    if (t->ndim == 0) return nd_tensor_view_of(t, t->shape, t->strides, 0, t->offset, out);
    ND_TRY(nd_norm_dim("transpose", d0, t->ndim, &a));
    ND_TRY(nd_norm_dim("transpose", d1, t->ndim, &b));
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    memcpy(ns, t->shape, sizeof ns);
    memcpy(st, t->strides, sizeof st);
    ns[a] = t->shape[b]; ns[b] = t->shape[a];
    st[a] = t->strides[b]; st[b] = t->strides[a];
    return nd_tensor_view_of(t, ns, st, t->ndim, t->offset, out);
}

static nd_status expand_forward(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (ndim < t->ndim || ndim > ND_MAX_DIMS)
        return nd_fail(ND_ERR_SHAPE, "expand: cannot expand shape %s to %s (fewer dims)",
                       nd_shape_str(t->shape, t->ndim, b1), nd_shape_str(shape, ndim, b2));
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0)
                return nd_fail(ND_ERR_SHAPE, "expand: -1 is not allowed for the new leading dim " ND_IXF,
                               ND_IX(i));
            ns[i] = want;
            st[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            ns[i] = t->shape[j];
            st[i] = t->strides[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            ns[i] = want;
            st[i] = 0;
        } else {
            return nd_fail(ND_ERR_SHAPE, "expand: cannot expand shape %s to %s (dim " ND_IXF " has size "
                           "%lld, expected 1 or %lld)", nd_shape_str(t->shape, t->ndim, b1),
                           nd_shape_str(shape, ndim, b2), ND_IX(i), (long long)t->shape[j],
                           (long long)want);
        }
    }
    ND_TRY(nd_check_shape("expand", ns, ndim, NULL));
    return nd_tensor_view_of(t, ns, st, ndim, t->offset, out);
}

static nd_status select_forward(const nd_tensor *t, int dim, int64_t index, nd_tensor **out) {
    int d;
    if (t->ndim == 0) return nd_fail(ND_ERR_INDEX, "select: cannot index a 0-dim tensor");
    ND_TRY(nd_norm_dim("select", dim, t->ndim, &d));
    int64_t n = t->shape[d];
    if (index < -n || index >= n)
        return nd_fail(ND_ERR_INDEX, "select: index " ND_IXF " out of range for dim " ND_IXF " of size %lld",
                       ND_IX(index), ND_IX(d), (long long)n);
    if (index < 0) index += n;
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    for (int i = 0, k = 0; i < t->ndim; i++)
        if (i != d) { ns[k] = t->shape[i]; st[k] = t->strides[i]; k++; }
    return nd_tensor_view_of(t, ns, st, t->ndim - 1, t->offset + index * t->strides[d], out);
}

static nd_status slice_forward(const nd_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                   nd_tensor **out) {
    int d;
    if (t->ndim == 0) return nd_fail(ND_ERR_INDEX, "slice: cannot slice a 0-dim tensor");
    ND_TRY(nd_norm_dim("slice", dim, t->ndim, &d));
    if (step <= 0) return nd_fail(ND_ERR_ARG, "slice: step must be positive, got %lld",
                                  (long long)step);
    int64_t n = t->shape[d];
    /* Python-style clamping of start/stop. */
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    if (start < 0) start = 0;
    if (start > n) start = n;
    if (stop > n) stop = n;
    if (stop < start) stop = start;
    if (step > n) step = n > 0 ? n : 1; /* same elements; keeps the arithmetic in range */
    int64_t span = stop - start;
    int64_t len = span / step + (span % step != 0);
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    memcpy(ns, t->shape, sizeof ns);
    memcpy(st, t->strides, sizeof st);
    ns[d] = len;
    st[d] = t->strides[d] * step;
    return nd_tensor_view_of(t, ns, st, t->ndim, t->offset + (len ? start * t->strides[d] : 0),
                             out);
}

nd_status nd_narrow(const nd_tensor *t, int dim, int64_t start, int64_t length, nd_tensor **out) {
    int d;
    if (t->ndim == 0) return nd_fail(ND_ERR_INDEX, "narrow: cannot narrow a 0-dim tensor");
    ND_TRY(nd_norm_dim("narrow", dim, t->ndim, &d));
    int64_t n = t->shape[d];
    int64_t given = start;
    if (start < 0) start += n;
    if (start < 0 || start > n || length < 0 || length > n - start)
        return nd_fail(ND_ERR_INDEX, "narrow: start " ND_IXF " and length %lld out of range for dim " ND_IXF " "
                       "of size %lld", ND_IX(given), (long long)length, ND_IX(d), (long long)n);
    return nd_slice(t, d, start, start + length, 1, out); /* records slice */
}

/* d < 0: drop every size-1 dim; else drop dim d if its size is 1. */
static nd_status squeeze_impl(const nd_tensor *t, int d, nd_tensor **out) {
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++) {
        bool drop = t->shape[i] == 1 && (d < 0 || i == d);
        if (!drop) { ns[k] = t->shape[i]; st[k] = t->strides[i]; k++; }
    }
    return nd_tensor_view_of(t, ns, st, k, t->offset, out);
}

static nd_status squeeze_forward(const nd_tensor *t, int dim, nd_tensor **out) {
    int d;
    if (t->ndim == 0) return nd_tensor_view_of(t, t->shape, t->strides, 0, t->offset, out);
    ND_TRY(nd_norm_dim("squeeze", dim, t->ndim, &d));
    return squeeze_impl(t, d, out);
}

static nd_status squeeze_all_forward(const nd_tensor *t, nd_tensor **out) { return squeeze_impl(t, -1, out); }

static nd_status unsqueeze_forward(const nd_tensor *t, int dim, nd_tensor **out) {
    if (t->ndim >= ND_MAX_DIMS)
        return nd_fail(ND_ERR_ARG, "unsqueeze: tensor already has %d dims (the maximum)", t->ndim);
    int d;
    ND_TRY(nd_norm_dim("unsqueeze", dim, t->ndim + 1, &d));
    int64_t ns[ND_MAX_DIMS], st[ND_MAX_DIMS];
    for (int i = 0, k = 0; i <= t->ndim; i++) {
        if (i == d) {
            ns[i] = 1;
            st[i] = k < t->ndim ? t->strides[k] * t->shape[k] : 1;
        } else {
            ns[i] = t->shape[k];
            st[i] = t->strides[k];
            k++;
        }
    }
    return nd_tensor_view_of(t, ns, st, t->ndim + 1, t->offset, out);
}

nd_status nd_flatten(const nd_tensor *t, int start_dim, int end_dim, nd_tensor **out) {
    int s, e;
    if (t->ndim == 0) {
        int64_t one = 1;
        return nd_reshape(t, &one, 1, out);
    }
    ND_TRY(nd_norm_dim("flatten", start_dim, t->ndim, &s));
    ND_TRY(nd_norm_dim("flatten", end_dim, t->ndim, &e));
    if (s > e) return nd_fail(ND_ERR_ARG, "flatten: start_dim " ND_IXF " comes after end_dim " ND_IXF,
                              ND_IX(s), ND_IX(e));
    int64_t ns[ND_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < s; i++) ns[k++] = t->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= t->shape[i];
    ns[k++] = m;
    for (int i = e + 1; i < t->ndim; i++) ns[k++] = t->shape[i];
    return nd_reshape(t, ns, k, out);
}

/* ---- differentiable entry points: a view of a tensor that requires grad
 * records a node whose backward maps the gradient back (views/grad.c). */

nd_status nd_view(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(view_forward(t, shape, ndim, out), nd_record_reshape(ND_OP_view, t, *out), out);
}
nd_status nd_reshape(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(reshape_forward(t, shape, ndim, out), nd_record_reshape(ND_OP_reshape, t, *out), out);
}
nd_status nd_squeeze(const nd_tensor *t, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(squeeze_forward(t, dim, out), nd_record_reshape(ND_OP_squeeze, t, *out), out);
}
nd_status nd_squeeze_all(const nd_tensor *t, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(squeeze_all_forward(t, out), nd_record_reshape(ND_OP_squeeze, t, *out), out);
}
nd_status nd_unsqueeze(const nd_tensor *t, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(unsqueeze_forward(t, dim, out), nd_record_reshape(ND_OP_unsqueeze, t, *out), out);
}
nd_status nd_permute(const nd_tensor *t, const int *dims, int ndim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(permute_forward(t, dims, ndim, out), nd_record_permute(t, dims, ndim, *out), out);
}
nd_status nd_transpose(const nd_tensor *t, int d0, int d1, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(transpose_forward(t, d0, d1, out), nd_record_transpose(t, d0, d1, *out), out);
}
nd_status nd_expand(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(expand_forward(t, shape, ndim, out), nd_record_expand(t, *out), out);
}
nd_status nd_select(const nd_tensor *t, int dim, int64_t index, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(select_forward(t, dim, index, out), nd_record_select(t, dim, index, *out), out);
}
nd_status nd_slice(const nd_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                   nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(slice_forward(t, dim, start, stop, step, out),
                           nd_record_slice(t, dim, start, step, *out), out);
}

/* ====================================================== backward formulas */

/* ------------------------------------------------ reshape-like, permute */

static nd_status bw_reshape(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    grads[0] = gx_out(&c, gx_reshape(&c, g, n->in_shape[0], n->in_ndim[0]));
    return gx_end(&c);
}

nd_status nd_record_reshape(nd_op op, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record(op, bw_reshape, out, 1, in, &n);
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
    ND_TRY(nd_record(ND_OP_permute, bw_permute, out, 1, in, &n));
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
    ND_TRY(nd_record(ND_OP_transpose, bw_transpose, out, 1, in, &n));
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
    return nd_record(ND_OP_expand, bw_expand, out, 1, in, &n);
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
        st = nd_record(ND_OP_slice_backward, bw_slice_backward, z, 1, in, &n);
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
    ND_TRY(nd_record(ND_OP_slice, bw_slice, out, 1, in, &n));
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

nd_status nd_view_grad_into(nd_node *n, nd_tensor *g, nd_tensor **slot, bool *done) {
    *done = false;
    bool sel = n->backward == bw_select;
    if ((!sel && n->backward != bw_slice) || g->dtype != n->in_dtype[0]) return ND_OK;
    int dim = n->dims[0];
    int64_t start = n->iparams[0], step = sel ? 1 : n->iparams[1];
    nd_tensor *u;
    if (sel) ND_TRY(nd_unsqueeze(g, dim, &u));
    else {
        nd_retain(g);
        u = g;
    }
    nd_status st = ND_OK;
    nd_tensor *acc = *slot;
    if (!acc) {
        st = slice_backward(u, n->in_shape[0], n->in_ndim[0], dim, start, step, slot);
    } else {
        /* only the engine holds it (a capturing graph's references aside) */
        int held = atomic_load(&acc->storage->refcount) - atomic_load(&acc->storage->graph_refs);
        bool owned = atomic_load(&acc->refcount) == 1 && held == 1 && nd_is_contiguous(acc) &&
                     acc->dtype == u->dtype;
        if (!owned) {
            nd_tensor *c;
            st = nd_clone(acc, &c);
            if (st == ND_OK) {
                nd_release(acc);
                *slot = acc = c;
            }
        }
        nd_tensor *v = NULL;
        if (st == ND_OK) st = nd_slice(acc, dim, start, start + u->shape[dim] * step, step, &v);
        if (st == ND_OK) st = nd_binary_(ND_BINARY_add, v, u);
        nd_release(v);
    }
    nd_release(u);
    *done = st == ND_OK;
    return st;
}

nd_status nd_record_select(const nd_tensor *x, int dim, int64_t index, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_select, bw_select, out, 1, in, &n));
    if (!n) return ND_OK;
    int d;
    ND_TRY(nd_norm_dim("select", dim, x->ndim, &d));
    n->dims[0] = d;
    n->iparams[0] = index < 0 ? index + x->shape[d] : index;
    return ND_OK;
}
