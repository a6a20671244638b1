/* op_pool.c - max_pool2d, avg_pool2d and adaptive_avg_pool2d (NCHW, or
 * unbatched CHW), with PyTorch's output sizes, checks and tie-breaking.
 *
 * Backward formulas are ops of their own (op_conv.h), so gradients of
 * gradients exist:
 *   max_pool2d:          g -> max_pool2d_backward(g, indices): scatter to the argmax
 *   max_pool2d_backward: gg -> max_pool2d_gather(gg, indices)
 *   max_pool2d_gather:   g -> max_pool2d_backward(g, indices)
 *   avg_pool2d <-> avg_pool2d_backward (each the other's adjoint) */
#include <limits.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"
#include "op_conv.h"

/* ------------------------------------------------------------ arguments */

static nd_status check_pool_input(const char *op, const nd_tensor *x) {
    char b1[ND_SHAPE_BUF];
    if (x->ndim != 3 && x->ndim != 4)
        return nd_fail(ND_ERR_SHAPE, "%s: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, "
                       "got shape %s", op, nd_shape_str(x->shape, x->ndim, b1));
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: expected a float32 or float64 input, got %s", op,
                       nd_dtype_name(x->dtype));
    if (x->shape[x->ndim - 1] < 1 || x->shape[x->ndim - 2] < 1)
        return nd_fail(ND_ERR_SHAPE, "%s: expected non-empty (H, W) planes, got input shape %s", op,
                       nd_shape_str(x->shape, x->ndim, b1));
    return ND_OK;
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* PyTorch's pooling_output_shape */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, bool ceil) {
    int64_t o = floor_div(in + 2 * pad - d * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
    if (ceil && (o - 1) * s >= in + pad) o--; /* the last window must start inside */
    return o;
}

/* kernel/stride/padding/dilation -> geometry, with PyTorch's checks */
static nd_status pool_args(const char *op, const nd_tensor *x, const int64_t *kernel,
                           const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                           bool ceil_mode, nd_pool_geom *p) {
    static const int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
    char b1[ND_SHAPE_BUF];
    ND_TRY(check_pool_input(op, x));
    if (!kernel) return nd_fail(ND_ERR_ARG, "%s: kernel_size is required", op);
    int64_t k[2], s[2], pad[2], d[2];
    ND_TRY(nd_conv_pair_arg(op, "kernel_size", kernel, ones, 1, k));
    ND_TRY(nd_conv_pair_arg(op, "stride", stride, k, 1, s));
    ND_TRY(nd_conv_pair_arg(op, "padding", padding, zeros, 0, pad));
    ND_TRY(nd_conv_pair_arg(op, "dilation", dilation, ones, 1, d));
    if (pad[0] > k[0] / 2 || pad[1] > k[1] / 2)
        return nd_fail(ND_ERR_ARG, "%s: padding {%lld,%lld} must be at most half of kernel_size "
                       "{%lld,%lld}", op, (long long)pad[0], (long long)pad[1], (long long)k[0],
                       (long long)k[1]);
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    int64_t oh = pool_out_size(H, k[0], pad[0], s[0], d[0], ceil_mode);
    int64_t ow = pool_out_size(W, k[1], pad[1], s[1], d[1], ceil_mode);
    if (oh < 1 || ow < 1)
        return nd_fail(ND_ERR_SHAPE, "%s: output size %lldx%lld is too small: the kernel %lldx%lld "
                       "(dilation {%lld,%lld}) does not fit the padded input (input shape %s, "
                       "padding {%lld,%lld})", op, (long long)oh, (long long)ow, (long long)k[0],
                       (long long)k[1], (long long)d[0], (long long)d[1],
                       nd_shape_str(x->shape, x->ndim, b1), (long long)pad[0], (long long)pad[1]);
    nd_pool_geom g = {k[0], k[1], s[0], s[1], pad[0], pad[1], d[0], d[1], oh, ow, false, false};
    *p = g;
    return ND_OK;
}

/* (C, H, W) -> (1, C, H, W) (a recorded view) or x itself (retained) */
static nd_status as_batched(const nd_tensor *x, nd_tensor **x4) {
    if (x->ndim == 4) {
        nd_retain((nd_tensor *)x);
        *x4 = (nd_tensor *)x;
        return ND_OK;
    }
    return nd_unsqueeze(x, 0, x4);
}

/* r (N, ...) back to x's form: squeezes the batch of an unbatched call
 * (and releases r) */
static nd_status as_input_form(const nd_tensor *x, nd_tensor *r, nd_tensor **out) {
    if (x->ndim == 4) {
        *out = r;
        return ND_OK;
    }
    nd_status st = nd_squeeze(r, 0, out);
    nd_release(r);
    return st;
}

/* ------------------------------------------------------------- max pool */

static nd_status max_pool_forward(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out,
                                  nd_tensor **indices) {
    int64_t shape[4] = {x->shape[0], x->shape[1], p->oh, p->ow};
    nd_tensor *xc, *o = NULL, *ix = NULL;
    ND_TRY(nd_contiguous(x, &xc));
    nd_status st = nd_empty_on(nd_get_device(x), shape, 4, x->dtype, &o);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), shape, 4, ND_INT64, &ix);
    if (st == ND_OK) st = ND_BACKEND_CALL(nd_backend_of(x), max_pool2d, "max_pool2d", o, ix, xc, p);
    nd_release(xc);
    if (st != ND_OK) {
        nd_release(o);
        nd_release(ix);
        return st;
    }
    *out = o;
    *indices = ix;
    return ND_OK;
}

static nd_status bw_max_pool2d(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *ix;
    ND_TRY(nd_saved(n, 0, &ix));
    nd_status st = nd_max_pool2d_backward_op(g, ix, n->in_shape[0][2], n->in_shape[0][3], &grads[0]);
    nd_release(ix);
    return st;
}

nd_status nd_record_max_pool2d(const nd_tensor *x, const nd_tensor *indices, nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_max_pool2d, bw_max_pool2d, out, 1, in, &n));
    return n ? nd_save(n, indices, false) : ND_OK;
}

static nd_status max_pool2d_4d(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out,
                               nd_tensor **indices) {
    bool on = nd_set_grad_enabled(false);
    nd_status st = max_pool_forward(x, p, out, indices);
    nd_set_grad_enabled(on);
    if (st == ND_OK && on && (st = nd_record_max_pool2d(x, *indices, *out)) != ND_OK) {
        nd_release(*out);
        nd_release(*indices);
        *out = *indices = NULL;
    }
    return st;
}

nd_status nd_max_pool2d(const nd_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        nd_tensor **out, nd_tensor **indices) {
    nd_pool_geom p;
    ND_TRY(pool_args("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode != 0, &p));
    nd_tensor *x4, *r, *ix;
    ND_TRY(as_batched(x, &x4));
    nd_status st = max_pool2d_4d(x4, &p, &r, &ix);
    nd_release(x4);
    ND_TRY(st);
    nd_tensor *o;
    if ((st = as_input_form(x, r, &o)) != ND_OK) { nd_release(ix); return st; }
    if (!indices) {
        nd_release(ix);
    } else if ((st = as_input_form(x, ix, indices)) != ND_OK) {
        nd_release(o);
        return st;
    }
    *out = o;
    return ND_OK;
}

/* ---- max_pool2d_backward and max_pool2d_gather: an adjoint pair ---- */

static nd_status max_backward_forward(const nd_tensor *g, const nd_tensor *indices, int64_t H,
                                      int64_t W, nd_tensor **out) {
    int64_t shape[4] = {g->shape[0], g->shape[1], H, W};
    nd_tensor *gc, *ic = NULL;
    ND_TRY(nd_contiguous(g, &gc));
    nd_status st = nd_contiguous(indices, &ic);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(g), shape, 4, g->dtype, out);
    if (st == ND_OK) {
        st = ND_BACKEND_CALL(nd_backend_of(g), max_pool2d_backward, "max_pool2d_backward", *out, gc, ic);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(gc);
    nd_release(ic);
    return st;
}

/* x (N, C, H, W) read at indices (N, C, oh, ow) */
static nd_status gather_forward(const nd_tensor *x, const nd_tensor *indices, nd_tensor **out) {
    int64_t xs[3] = {x->shape[0], x->shape[1], x->shape[2] * x->shape[3]};
    int64_t is[3] = {indices->shape[0], indices->shape[1], indices->shape[2] * indices->shape[3]};
    nd_tensor *x3 = NULL, *i3 = NULL, *r = NULL;
    nd_status st = nd_reshape(x, xs, 3, &x3);
    if (st == ND_OK) st = nd_reshape(indices, is, 3, &i3);
    if (st == ND_OK) st = nd_gather(x3, 2, i3, &r);
    if (st == ND_OK) st = nd_reshape(r, indices->shape, 4, out);
    nd_release(x3); nd_release(i3); nd_release(r);
    return st;
}

nd_status nd_max_pool2d_backward_op(const nd_tensor *g, const nd_tensor *indices, int64_t H,
                                    int64_t W, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(max_backward_forward(g, indices, H, W, out),
                           nd_record_max_pool2d_backward(g, indices, *out), out);
}

nd_status nd_max_pool2d_gather_op(const nd_tensor *x, const nd_tensor *indices, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(gather_forward(x, indices, out),
                           nd_record_max_pool2d_gather(x, indices, *out), out);
}

static nd_status bw_max_backward(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *ix;
    ND_TRY(nd_saved(n, 0, &ix));
    nd_status st = nd_max_pool2d_gather_op(g, ix, &grads[0]);
    nd_release(ix);
    return st;
}

static nd_status bw_max_gather(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_tensor *ix;
    ND_TRY(nd_saved(n, 0, &ix));
    nd_status st = nd_max_pool2d_backward_op(g, ix, n->in_shape[0][2], n->in_shape[0][3], &grads[0]);
    nd_release(ix);
    return st;
}

nd_status nd_record_max_pool2d_backward(const nd_tensor *g, const nd_tensor *indices,
                                        nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {g};
    ND_TRY(nd_record(ND_OP_max_pool2d_backward, bw_max_backward, out, 1, in, &n));
    return n ? nd_save(n, indices, false) : ND_OK;
}

nd_status nd_record_max_pool2d_gather(const nd_tensor *x, const nd_tensor *indices,
                                      nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(ND_OP_max_pool2d_gather, bw_max_gather, out, 1, in, &n));
    return n ? nd_save(n, indices, false) : ND_OK;
}

/* ------------------------------------------------------------- avg pool */

static nd_status avg_forward(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out) {
    int64_t shape[4] = {x->shape[0], x->shape[1], p->oh, p->ow};
    nd_tensor *xc;
    ND_TRY(nd_contiguous(x, &xc));
    nd_status st = nd_empty_on(nd_get_device(x), shape, 4, x->dtype, out);
    if (st == ND_OK) {
        st = ND_BACKEND_CALL(nd_backend_of(x), avg_pool2d,
                             p->adaptive ? "adaptive_avg_pool2d" : "avg_pool2d", *out, xc, p);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(xc);
    return st;
}

static nd_status avg_backward_forward(const nd_tensor *g, const nd_pool_geom *p, int64_t H,
                                      int64_t W, nd_tensor **out) {
    int64_t shape[4] = {g->shape[0], g->shape[1], H, W};
    nd_tensor *gc;
    ND_TRY(nd_contiguous(g, &gc));
    nd_status st = nd_empty_on(nd_get_device(g), shape, 4, g->dtype, out);
    if (st == ND_OK) {
        st = ND_BACKEND_CALL(nd_backend_of(g), avg_pool2d_backward, "avg_pool2d_backward", *out,
                             gc, p);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(gc);
    return st;
}

nd_status nd_avg_pool2d_op(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(avg_forward(x, p, out),
                           nd_record_avg_pool2d(p->adaptive ? ND_OP_adaptive_avg_pool2d : ND_OP_avg_pool2d,
                                                x, p, *out), out);
}

nd_status nd_avg_pool2d_backward_op(const nd_tensor *g, const nd_pool_geom *p, int64_t H,
                                    int64_t W, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(avg_backward_forward(g, p, H, W, out),
                           nd_record_avg_pool2d_backward(g, p, *out), out);
}

static nd_status bw_avg_pool2d(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_pool_geom p = nd_node_pool_geom(n);
    return nd_avg_pool2d_backward_op(g, &p, n->in_shape[0][2], n->in_shape[0][3], &grads[0]);
}

static nd_status bw_avg_backward(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_pool_geom p = nd_node_pool_geom(n);
    return nd_avg_pool2d_op(g, &p, &grads[0]);
}

nd_status nd_record_avg_pool2d(nd_op op, const nd_tensor *x, const nd_pool_geom *p,
                               nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(op, bw_avg_pool2d, out, 1, in, &n));
    if (n) nd_node_put_pool_geom(n, p);
    return ND_OK;
}

nd_status nd_record_avg_pool2d_backward(const nd_tensor *g, const nd_pool_geom *p,
                                        nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[1] = {g};
    ND_TRY(nd_record(ND_OP_avg_pool2d_backward, bw_avg_backward, out, 1, in, &n));
    if (n) nd_node_put_pool_geom(n, p);
    return ND_OK;
}

static nd_status avg_pool_any(const nd_tensor *x, const nd_pool_geom *p, nd_tensor **out) {
    nd_tensor *x4, *r;
    ND_TRY(as_batched(x, &x4));
    nd_status st = nd_avg_pool2d_op(x4, p, &r);
    nd_release(x4);
    ND_TRY(st);
    return as_input_form(x, r, out);
}

nd_status nd_avg_pool2d(const nd_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        nd_tensor **out) {
    nd_pool_geom p;
    ND_TRY(pool_args("avg_pool2d", x, kernel, stride, padding, NULL, ceil_mode != 0, &p));
    p.count_include_pad = count_include_pad != 0;
    return avg_pool_any(x, &p, out);
}

nd_status nd_adaptive_avg_pool2d(const nd_tensor *x, const int64_t *out_hw, nd_tensor **out) {
    const char *op = "adaptive_avg_pool2d";
    ND_TRY(check_pool_input(op, x));
    if (!out_hw) return nd_fail(ND_ERR_ARG, "%s: output_size is required", op);
    if (out_hw[0] < 0 || out_hw[1] < 0 || out_hw[0] > INT_MAX || out_hw[1] > INT_MAX)
        return nd_fail(ND_ERR_ARG, "%s: output_size must be >= 0, got {%lld,%lld}", op,
                       (long long)out_hw[0], (long long)out_hw[1]);
    nd_pool_geom p = {1, 1, 1, 1, 0, 0, 1, 1, out_hw[0], out_hw[1], false, true};
    return avg_pool_any(x, &p, out);
}
