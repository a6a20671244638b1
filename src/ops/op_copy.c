/* op_copy.c - copies, conversions and fills, and the backward of the copies. */
#include <math.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"

static nd_status clone_forward(const nd_tensor *t, nd_tensor **out);

nd_status nd_copy_(nd_tensor *dst, const nd_tensor *src) {
    ND_TRY(nd_check_writable("copy_", dst));
    ND_TRY(nd_check_inplace_grad("copy_", dst));
    if (!nd_same_device(dst, src)) { /* across devices: bring src over first */
        nd_tensor *moved;
        bool on = nd_set_grad_enabled(false);
        nd_status st = nd_to_device(src, nd_get_device(dst), &moved);
        nd_set_grad_enabled(on);
        ND_TRY(st);
        st = nd_copy_(dst, moved);
        nd_release(moved);
        return st;
    }
    nd_tensor *s;
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    if (nd_expand_to(src, dst->shape, dst->ndim, &s) != ND_OK)
        return nd_fail(ND_ERR_SHAPE, "copy: cannot copy a tensor of shape %s into shape %s",
                       nd_shape_str(src->shape, src->ndim, b1), nd_shape_str(dst->shape, dst->ndim, b2));
    /* Source and destination in the same memory: exactly the same view is a
     * no-op; any other overlap would read values already overwritten, so
     * the source is copied out first. */
    if (s->storage == dst->storage) {
        bool same = s->offset == dst->offset && s->dtype == dst->dtype;
        for (int i = 0; same && i < dst->ndim; i++) same = s->strides[i] == dst->strides[i];
        if (same) { nd_release(s); return ND_OK; }
        nd_tensor *c;
        nd_status cs = clone_forward(s, &c);
        nd_release(s);
        ND_TRY(cs);
        s = c;
    }
    const nd_backend *be = nd_backend_of(dst);
    nd_status st = ND_BACKEND_CALL(be, copy, "copy", dst, s);
    nd_release(s);
    if (st == ND_OK) nd_bump_version(dst);
    return st;
}

nd_status nd_fill_number_(nd_tensor *dst, nd_number v) {
    ND_TRY(nd_check_inplace_grad("fill_", dst));
    ND_TRY(nd_check_number_fits("fill_", dst->dtype, v)); /* an error, never a clamp */
    _Alignas(8) unsigned char value[8] = {0};
    nd_store_number(value, dst->dtype, v);
    const nd_backend *be = nd_backend_of(dst);
    ND_TRY(ND_BACKEND_CALL(be, fill, "fill", dst, value));
    nd_bump_version(dst);
    return ND_OK;
}

nd_status nd_fill_(nd_tensor *dst, double value) { return nd_fill_number_(dst, nd_num_f(value)); }
nd_status nd_fill_int_(nd_tensor *dst, int64_t value) { return nd_fill_number_(dst, nd_num_i(value)); }

static nd_status copy_into_new(const nd_tensor *t, nd_dtype dt, nd_tensor **out) {
    ND_TRY(nd_empty_on(nd_get_device(t), t->shape, t->ndim, dt, out));
    const nd_backend *be = nd_backend_of(t);
    nd_status st = ND_BACKEND_CALL(be, copy, "copy", *out, t);
    if (st != ND_OK) { nd_release(*out); *out = NULL; }
    return st;
}

static nd_status contiguous_forward(const nd_tensor *t, nd_tensor **out) {
    if (nd_is_contiguous(t)) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    return copy_into_new(t, t->dtype, out);
}

static nd_status clone_forward(const nd_tensor *t, nd_tensor **out) { return copy_into_new(t, t->dtype, out); }

static nd_status to_dtype_forward(const nd_tensor *t, nd_dtype dt, nd_tensor **out) {
    if ((unsigned)dt >= ND_NUM_DTYPES) return nd_fail(ND_ERR_DTYPE, "to: invalid dtype %d", dt);
    if (t->dtype == dt) { /* as PyTorch: converting to the same dtype is a no-op */
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    return copy_into_new(t, dt, out);
}

nd_status nd_contiguous(const nd_tensor *t, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(contiguous_forward(t, out), nd_record_identity(ND_OP_contiguous, t, *out), out);
}

nd_status nd_unit_rows(const nd_tensor *t, nd_tensor **out) {
    if (t->ndim == 0 || t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] <= 1) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    return nd_contiguous(t, out);
}

nd_status nd_clone(const nd_tensor *t, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(clone_forward(t, out), nd_record_identity(ND_OP_clone, t, *out), out);
}

nd_status nd_to_dtype(const nd_tensor *t, nd_dtype dt, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(to_dtype_forward(t, dt, out), nd_record_to_dtype(t, *out), out);
}


nd_status nd_half_operands(int n, const nd_tensor *const *in, nd_tensor **cv, bool *any) {
    bool half = false, f64 = false;
    for (int i = 0; i < n; i++) {
        cv[i] = NULL;
        if (!in[i]) continue;
        half = half || nd_dtype_is_half(in[i]->dtype);
        f64 = f64 || in[i]->dtype == ND_FLOAT64;
    }
    *any = half;
    if (!half) return ND_OK;
    /* the input's dtype (in[0], float32 or float64), so that a mismatch left
     * for the op names the operand the caller got wrong; else by the others */
    const nd_dtype d0 = in[0] ? in[0]->dtype : ND_FLOAT32;
    const nd_dtype to = d0 == ND_FLOAT32 || d0 == ND_FLOAT64 ? d0 : f64 ? ND_FLOAT64 : ND_FLOAT32;
    for (int i = 0; i < n; i++) {
        /* only the half ones: a float32 / float64 mix stays the op's to refuse */
        if (!in[i] || !nd_dtype_is_half(in[i]->dtype)) continue;
        nd_status st = nd_to_dtype(in[i], to, &cv[i]);
        if (st != ND_OK) {
            nd_half_release(n, cv);
            return st;
        }
    }
    return ND_OK;
}

void nd_half_release(int n, nd_tensor **cv) {
    for (int i = 0; i < n; i++) {
        nd_release(cv[i]);
        cv[i] = NULL;
    }
}

/* ------------------------------------------------------------- copies */

static nd_status bw_identity(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    (void)n;
    nd_retain(g);
    grads[0] = g;
    return ND_OK;
}

nd_status nd_record_identity(nd_op op, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype) || out == x) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record(op, bw_identity, out, 1, in, &n);
}

static nd_status bw_to_dtype(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    return nd_to_dtype(g, n->in_dtype[0], &grads[0]);
}

nd_status nd_record_to_dtype(const nd_tensor *x, nd_tensor *out) {
    if (out == x || !nd_dtype_is_float(out->dtype) || !nd_dtype_is_float(x->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    return nd_record(ND_OP_to, bw_to_dtype, out, 1, in, &n);
}
