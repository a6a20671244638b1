/* op_join.c - cat, stack, flip and pad.
 *
 * Built only from nd_empty/nd_full, views and nd_copy_, so they work on any
 * backend that can copy: each input is copied into a view of the output.
 * The differentiable entry points at the end run these forwards with grad
 * mode off, then record (the backward section). */
#include <string.h>
#include "backend_call.h"
#include "grad_fns.h"
#include "tensor.h"

/* nd_copy_(out view with this geometry, src). */
static nd_status copy_into(nd_tensor *out, const int64_t *shape, const int64_t *strides,
                           int ndim, int64_t offset, const nd_tensor *src) {
    nd_tensor *v;
    ND_TRY(nd_tensor_view_of(out, shape, strides, ndim, offset, &v));
    nd_status st = nd_copy_(v, src);
    nd_release(v);
    return st;
}

/* PyTorch skips 1-D empty tensors in cat whatever the other shapes are. */
static bool cat_skipped(const nd_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

static nd_status cat_forward(nd_tensor *const *ts, int n, int dim, nd_tensor **out) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    *out = NULL;
    if (!ts || n <= 0) return nd_fail(ND_ERR_ARG, "cat: expected a non-empty list of tensors");
    const nd_tensor *ref = NULL;
    int ref_i = -1;
    nd_dtype dt = ND_BOOL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) return nd_fail(ND_ERR_ARG, "cat: tensor " ND_IXF " is NULL", ND_IX(i));
        if (ts[i]->ndim == 0)
            return nd_fail(ND_ERR_SHAPE, "cat: zero-dimensional tensor (at position " ND_IXF ") "
                           "cannot be concatenated", ND_IX(i));
        if (!nd_same_device(ts[i], ts[0])) {
            char d0[32], d1[32];
            return nd_fail(ND_ERR_DEVICE, "cat: tensor " ND_IXF " is on %s but tensor " ND_IXF
                           " is on %s (expected all on one device)", ND_IX(i),
                           nd_device_str(nd_get_device(ts[i]), d1), ND_IX(0),
                           nd_device_str(nd_get_device(ts[0]), d0));
        }
        dt = i ? nd_promote(dt, ts[i]->dtype) : ts[i]->dtype;
        if (!ref && !cat_skipped(ts[i])) { ref = ts[i]; ref_i = i; }
    }
    if (!ref) { /* everything was a 1-D empty tensor */
        int64_t zero = 0;
        return nd_empty_on(nd_get_device(ts[0]), &zero, 1, dt, out);
    }
    int d;
    ND_TRY(nd_norm_dim("cat", dim, ref->ndim, &d));
    int64_t shape[ND_MAX_DIMS];
    memcpy(shape, ref->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const nd_tensor *t = ts[i];
        if (cat_skipped(t)) continue;
        bool ok = t->ndim == ref->ndim;
        for (int k = 0; ok && k < t->ndim; k++) ok = k == d || t->shape[k] == ref->shape[k];
        if (!ok)
            return nd_fail(ND_ERR_SHAPE, "cat: shapes must match except in dim " ND_IXF ", but tensor "
                           ND_IXF " has shape %s and tensor " ND_IXF " has shape %s", ND_IX(d),
                           ND_IX(ref_i), nd_shape_str(ref->shape, ref->ndim, b1), ND_IX(i),
                           nd_shape_str(t->shape, t->ndim, b2));
        shape[d] += t->shape[d];
    }
    ND_TRY(nd_check_shape("cat", shape, ref->ndim, NULL)); /* the error names cat, not empty */
    nd_tensor *r;
    ND_TRY(nd_empty_on(nd_get_device(ref), shape, ref->ndim, dt, &r));
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const nd_tensor *t = ts[i];
        if (cat_skipped(t) || t->shape[d] == 0) continue;
        shape[d] = t->shape[d];
        nd_status st = copy_into(r, shape, r->strides, r->ndim, r->offset + off * r->strides[d], t);
        if (st != ND_OK) {
            nd_release(r);
            return st;
        }
        off += t->shape[d];
    }
    *out = r;
    return ND_OK;
}

static nd_status stack_forward(nd_tensor *const *ts, int n, int dim, nd_tensor **out) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    *out = NULL;
    if (!ts || n <= 0) return nd_fail(ND_ERR_ARG, "stack: expected a non-empty list of tensors");
    for (int i = 0; i < n; i++)
        if (!ts[i]) return nd_fail(ND_ERR_ARG, "stack: tensor " ND_IXF " is NULL", ND_IX(i));
    const nd_tensor *ref = ts[0];
    if (ref->ndim >= ND_MAX_DIMS)
        return nd_fail(ND_ERR_ARG, "stack: tensors of shape %s already have %d dims (the "
                       "result needs one more, at most %d)", nd_shape_str(ref->shape, ref->ndim, b1),
                       ref->ndim, ND_MAX_DIMS);
    int d;
    ND_TRY(nd_norm_dim("stack", dim, ref->ndim + 1, &d));
    nd_dtype dt = ref->dtype;
    for (int i = 1; i < n; i++) {
        const nd_tensor *t = ts[i];
        bool ok = t->ndim == ref->ndim;
        for (int k = 0; ok && k < t->ndim; k++) ok = t->shape[k] == ref->shape[k];
        if (!ok)
            return nd_fail(ND_ERR_SHAPE, "stack: tensors must all have the same shape, but "
                           "tensor " ND_IXF " has shape %s and tensor " ND_IXF " has shape %s", ND_IX(0),
                           nd_shape_str(ref->shape, ref->ndim, b1), ND_IX(i),
                           nd_shape_str(t->shape, t->ndim, b2));
        if (!nd_same_device(t, ref)) {
            char d0[32], d1[32];
            return nd_fail(ND_ERR_DEVICE, "stack: tensor " ND_IXF " is on %s but tensor " ND_IXF
                           " is on %s (expected all on one device)", ND_IX(i),
                           nd_device_str(nd_get_device(t), d1), ND_IX(0),
                           nd_device_str(nd_get_device(ref), d0));
        }
        dt = nd_promote(dt, t->dtype);
    }
    /* result shape: ref's with n inserted at d; slot i is the view without d */
    int64_t shape[ND_MAX_DIMS], vshape[ND_MAX_DIMS], vstrides[ND_MAX_DIMS];
    for (int k = 0, j = 0; k <= ref->ndim; k++) shape[k] = k == d ? n : ref->shape[j++];
    ND_TRY(nd_check_shape("stack", shape, ref->ndim + 1, NULL)); /* the error names stack */
    nd_tensor *r;
    ND_TRY(nd_empty_on(nd_get_device(ref), shape, ref->ndim + 1, dt, &r));
    for (int k = 0, j = 0; k <= ref->ndim; k++) {
        if (k == d) continue;
        vshape[j] = r->shape[k];
        vstrides[j++] = r->strides[k];
    }
    for (int i = 0; i < n; i++) {
        nd_status st = copy_into(r, vshape, vstrides, ref->ndim, r->offset + i * r->strides[d],
                                 ts[i]);
        if (st != ND_OK) {
            nd_release(r);
            return st;
        }
    }
    *out = r;
    return ND_OK;
}

/* A copy of x read through a view with the flipped dims' strides negated. */
static nd_status flip_forward(const nd_tensor *x, const int *dims, int ndims, nd_tensor **out) {
    *out = NULL;
    if (ndims < 0 || (ndims > 0 && !dims))
        return nd_fail(ND_ERR_ARG, "flip: invalid list of %d dims", ndims);
    bool flip[ND_MAX_DIMS] = {0};
    for (int i = 0; i < ndims; i++) {
        int d;
        ND_TRY(nd_norm_dim("flip", dims[i], x->ndim, &d));
        if (flip[d]) return nd_fail(ND_ERR_ARG, "flip: dim " ND_IXF " appears more than once", ND_IX(dims[i]));
        flip[d] = true;
    }
    int64_t strides[ND_MAX_DIMS];
    int64_t offset = x->offset;
    memcpy(strides, x->strides, sizeof strides);
    for (int d = 0; d < x->ndim; d++) {
        if (!flip[d] || x->shape[d] <= 1) continue;
        offset += (x->shape[d] - 1) * x->strides[d];
        strides[d] = -x->strides[d];
    }
    nd_tensor *r;
    ND_TRY(nd_empty_on(nd_get_device(x), x->shape, x->ndim, x->dtype, &r));
    nd_tensor *v;
    nd_status st = nd_tensor_view_of(x, x->shape, strides, x->ndim, offset, &v);
    if (st == ND_OK) {
        st = nd_copy_(r, v);
        nd_release(v);
    }
    if (st != ND_OK) {
        nd_release(r);
        return st;
    }
    *out = r;
    return ND_OK;
}

/* Constant padding; a negative pad crops. */
static nd_status pad_forward(const nd_tensor *x, const int64_t *pads, int npairs, double value,
                             nd_tensor **out) {
    char b1[ND_SHAPE_BUF];
    *out = NULL;
    if (npairs < 0 || npairs > x->ndim || (npairs > 0 && !pads))
        return nd_fail(ND_ERR_ARG, "pad: %d pairs of pads given for a tensor of shape %s (at most "
                       "one pair per dim)", npairs, nd_shape_str(x->shape, x->ndim, b1));
    int64_t shape[ND_MAX_DIMS], src_shape[ND_MAX_DIMS];
    int64_t src_off = x->offset, dst_start[ND_MAX_DIMS] = {0};
    bool empty_src = false;
    memcpy(shape, x->shape, sizeof shape);
    memcpy(src_shape, x->shape, sizeof src_shape);
    for (int i = 0; i < npairs; i++) {
        int d = x->ndim - 1 - i;
        int64_t before = pads[2 * i], after = pads[2 * i + 1], size = x->shape[d];
        /* size + before + after without overflow: when before + after
         * overflows both have the same sign, and size (0 .. 2^48) cannot
         * bring a sum below INT64_MIN back above 0. */
        int64_t both;
        bool too_big = false, too_small = false;
        if (__builtin_add_overflow(before, after, &both)) {
            too_big = before > 0;
            too_small = !too_big;
        } else {
            too_big = __builtin_add_overflow(size, both, &shape[d]);
        }
        if (too_big)
            return nd_fail(ND_ERR_SHAPE, "pad: padding (%lld, %lld) of dim " ND_IXF " of size %lld "
                           "overflows int64", (long long)before, (long long)after, ND_IX(d),
                           (long long)size);
        if (too_small)
            return nd_fail(ND_ERR_SHAPE, "pad: padding (%lld, %lld) of dim " ND_IXF " of size %lld gives "
                           "a negative size (below -2^63)", (long long)before, (long long)after,
                           ND_IX(d), (long long)size);
        if (shape[d] < 0)
            return nd_fail(ND_ERR_SHAPE, "pad: padding (%lld, %lld) of dim " ND_IXF " of size %lld gives "
                           "the negative size %lld", (long long)before, (long long)after, ND_IX(d),
                           (long long)size, (long long)shape[d]);
        /* the part of x that survives cropping, and where it lands; a crop
         * beyond the whole dim is the whole dim (never -INT64_MIN) */
        int64_t crop_lo = before < 0 ? (before < -size ? size : -before) : 0;
        int64_t crop_hi = after < 0 ? (after < -size ? size : -after) : 0;
        src_shape[d] = size - crop_lo - crop_hi;
        if (src_shape[d] <= 0) empty_src = true;
        else src_off += crop_lo * x->strides[d];
        dst_start[d] = before > 0 ? before : 0;
    }
    ND_TRY(nd_check_shape("pad", shape, x->ndim, NULL));
    ND_TRY(nd_check_number_fits("pad", x->dtype, nd_num_f(value)));
    nd_tensor *r;
    ND_TRY(nd_full_on(nd_get_device(x), shape, x->ndim, x->dtype, value, &r));
    if (empty_src || nd_shape_numel(src_shape, x->ndim) == 0) {
        *out = r;
        return ND_OK;
    }
    nd_tensor *src;
    int64_t dst_off = r->offset;
    for (int d = 0; d < x->ndim; d++) dst_off += dst_start[d] * r->strides[d];
    nd_status st = nd_tensor_view_of(x, src_shape, x->strides, x->ndim, src_off, &src);
    if (st == ND_OK) {
        st = copy_into(r, src_shape, r->strides, r->ndim, dst_off, src);
        nd_release(src);
    }
    if (st != ND_OK) {
        nd_release(r);
        return st;
    }
    *out = r;
    return ND_OK;
}

/* ---- differentiable entry points */

nd_status nd_cat(nd_tensor *const *ts, int n, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(cat_forward(ts, n, dim, out), nd_record_cat(ts, n, dim, *out), out);
}

nd_status nd_stack(nd_tensor *const *ts, int n, int dim, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(stack_forward(ts, n, dim, out), nd_record_stack(ts, n, dim, *out), out);
}

nd_status nd_flip(const nd_tensor *x, const int *dims, int ndims, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(flip_forward(x, dims, ndims, out), nd_record_flip(x, dims, ndims, *out),
                           out);
}

nd_status nd_pad(const nd_tensor *x, const int64_t *pads, int npairs, double value,
                 nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(pad_forward(x, pads, npairs, value, out),
                           nd_record_pad(x, pads, npairs, *out), out);
}

/* ---- backward: the formulas of cat, stack, flip and pad, and the
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
    ND_TRY(nd_record(ND_OP_cat, bw_cat, out, n, (const nd_tensor *const *)ts, &node));
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
    ND_TRY(nd_record(ND_OP_stack, bw_stack, out, n, (const nd_tensor *const *)ts, &node));
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
    ND_TRY(nd_record(ND_OP_flip, bw_flip, out, 1, in, &n));
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
    ND_TRY(nd_record(ND_OP_pad, bw_pad, out, 1, in, &n));
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
