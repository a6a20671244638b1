/* op_fused.c - fused_conv2d and fused_linear: act(conv2d(x, w) + b) and
 * act(x @ w^T + b) with the bias and the activation applied in the GEMM's
 * epilogue by the backend's conv2d_fused / linear_fused kernels (see
 * backends/cpu/cpu_fused.c). nd.nn.fuse builds its FusedConv2d/FusedLinear
 * modules on them, with BatchNorm already folded into w and b.
 *
 * They are inference kernels: no autograd node of their own. When autograd
 * would record (grad mode on and an input requires grad) they run as the
 * composed differentiable ops - conv2d / matmul, add, relu - which give the
 * same values and exact gradients (of any order). A backend without the
 * fused kernels (OpenCL) runs the composed ops too, on its own device. */
#include "backend.h"
#include "grad_expr.h"
#include "grad_fns.h"
#include "op_conv.h"

static nd_status check_act(const char *op, nd_activation act) {
    if (act != ND_ACT_NONE && act != ND_ACT_RELU)
        return nd_fail(ND_ERR_ARG, "%s: unknown activation %d (expected none or relu)", op, (int)act);
    return ND_OK;
}

static bool would_record(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b) {
    return nd_grad_enabled() && (x->requires_grad || w->requires_grad || (b && b->requires_grad));
}

/* *out = act(y), consuming the caller's reference to y */
static nd_status finish_composed(nd_tensor *y, nd_activation act, nd_tensor **out) {
    if (act == ND_ACT_NONE) {
        *out = y;
        return ND_OK;
    }
    nd_status st = nd_unary(ND_UNARY_relu, y, out);
    nd_release(y);
    return st;
}

/* ------------------------------------------------------------- conv2d */

nd_status nd_fused_conv2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                          int64_t groups, nd_activation act, nd_tensor **out) {
    const char *op = "fused_conv2d";
    ND_TRY(check_act(op, act));
    nd_conv_params cp;
    int64_t ohw[2];
    ND_TRY(nd_conv2d_args(op, x, weight, bias, stride, padding, dilation, groups, &cp, ohw));
    if (!would_record(x, weight, bias)) {
        /* the backend's kernel on x as a batch (an unbatched (C, H, W) x is a
         * batch of one; its (O, oh, ow) result a view of the same memory) */
        const bool batched = x->ndim == 4;
        nd_conv_geom g = {weight->shape[2], weight->shape[3], cp.stride[0], cp.stride[1],
                          cp.padding[0], cp.padding[1], cp.dilation[0], cp.dilation[1],
                          ohw[0], ohw[1]};
        nd_tensor *x4 = NULL, *r = NULL;
        bool used = false;
        nd_status st = ND_OK;
        if (batched) {
            nd_retain((nd_tensor *)x);
            x4 = (nd_tensor *)x;
        } else {
            st = nd_unsqueeze(x, 0, &x4);
        }
        if (st == ND_OK) st = nd_conv2d_by_backend(x4, weight, bias, &g, groups, act, &used, &r);
        nd_release(x4);
        ND_TRY(st);
        if (used && batched) {
            *out = r;
            return ND_OK;
        }
        if (used) {
            st = nd_squeeze(r, 0, out);
            nd_release(r);
            return st;
        }
    }
    /* recorded, or no kernel (OpenCL), or an empty convolution: the composed ops */
    nd_tensor *y;
    ND_TRY(nd_conv2d(x, weight, bias, stride, padding, dilation, groups, &y));
    return finish_composed(y, act, out);
}

/* ------------------------------------------------------------- linear */

static nd_status linear_args(const char *op, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    ND_TRY(nd_check_float_weights(op, x, w, b));
    if (w->ndim != 2)
        return nd_fail(ND_ERR_SHAPE, "%s: expected a 2-D weight (out_features, in_features), got "
                       "shape %s", op, nd_shape_str(w->shape, w->ndim, b1));
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return nd_fail(ND_ERR_SHAPE, "%s: input of shape %s does not match weight of shape %s "
                       "(expected last dim %lld)", op, nd_shape_str(x->shape, x->ndim, b1),
                       nd_shape_str(w->shape, w->ndim, b2), (long long)w->shape[1]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return nd_fail(ND_ERR_SHAPE, "%s: bias must have shape {%lld} (out_features), got %s", op,
                       (long long)w->shape[0], nd_shape_str(b->shape, b->ndim, b1));
    return ND_OK;
}

/* x @ w^T + b with the ordinary differentiable ops */
static nd_status linear_composed(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                 nd_tensor **out) {
    nd_tensor *wt, *y;
    ND_TRY(nd_transpose(w, 0, 1, &wt));
    nd_status st = nd_matmul(x, wt, &y);
    nd_release(wt);
    ND_TRY(st);
    if (!b) {
        *out = y;
        return ND_OK;
    }
    st = nd_binary(ND_BINARY_add, y, b, out);
    nd_release(y);
    return st;
}

/* act(x @ w^T + b) by the backend's kernel, grad mode aside (x any shape
 * (..., K), as (M, K)) */
static nd_status linear_forward_fused(const nd_tensor *x, const nd_tensor *weight,
                                      const nd_tensor *bias, nd_activation act, nd_tensor **out) {
    const nd_backend *be = nd_backend_of(x);
    const int64_t K = weight->shape[1], O = weight->shape[0];
    const int64_t M = nd_numel(x) / K;
    nd_tensor *xc = NULL, *x2 = NULL, *wc = NULL, *bc = NULL, *r = NULL;
    int64_t x2s[2] = {M, K}, os[ND_MAX_DIMS];
    for (int i = 0; i < x->ndim - 1; i++) os[i] = x->shape[i];
    os[x->ndim - 1] = O;
    nd_status st = nd_contiguous(x, &xc);
    if (st == ND_OK) st = nd_view(xc, x2s, 2, &x2);
    if (st == ND_OK) st = nd_contiguous(weight, &wc);
    if (st == ND_OK && bias) st = nd_contiguous(bias, &bc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(x), os, x->ndim, x->dtype, &r);
    if (st == ND_OK) st = be->linear_fused(r, x2, wc, bc, act);
    nd_release(xc);
    nd_release(x2);
    nd_release(wc);
    nd_release(bc);
    if (st != ND_OK) {
        nd_release(r);
        return st;
    }
    *out = r;
    return ND_OK;
}

/* linear's gradients, from differentiable ops (create_graph differentiates
 * them again): gx = g @ w; gw = g^T @ x over all M = numel(x) / K rows at
 * once (one GEMM, where matmul's backward of a batched x would run one per
 * batch entry and then sum); gb = g summed to (O). */
static nd_status bw_linear(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    const int64_t O = n->in_shape[1][0], K = n->in_shape[1][1];
    if (n->needs_grad[0]) {
        nd_tensor *w = gx_saved(&c, n, (int)n->iparams[1]), *r = NULL;
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(g, w, &r), &r);
        grads[0] = gx_out(&c, r);
    }
    if (n->needs_grad[1]) {
        nd_tensor *x = gx_saved(&c, n, (int)n->iparams[0]), *gt = NULL, *r = NULL;
        const int64_t M = O ? nd_numel(g) / O : 0;
        int64_t gs[2] = {M, O}, xs[2] = {M, K};
        nd_tensor *g2 = gx_reshape(&c, g, gs, 2), *x2 = gx_reshape(&c, x, xs, 2);
        if (c.st == ND_OK) gt = gx_own(&c, nd_transpose(g2, 0, 1, &gt), &gt);
        if (c.st == ND_OK) r = gx_own(&c, nd_matmul(gt, x2, &r), &r);
        grads[1] = gx_out(&c, r);
    }
    if (n->ninputs > 2 && n->needs_grad[2]) grads[2] = gx_out(&c, gx_sum_to(&c, g, n, 2));
    return gx_end(&c);
}

static nd_status record_linear(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               nd_tensor *out) {
    nd_node *n;
    const nd_tensor *in[3] = {x, w, b};
    ND_TRY(nd_record("linear", bw_linear, out, b ? 3 : 2, in, &n));
    if (!n) return ND_OK;
    /* keep only what the formulas need: x for gw, w for gx */
    n->iparams[0] = n->iparams[1] = -1;
    if (n->needs_grad[1]) {
        n->iparams[0] = n->nsaved;
        ND_TRY(nd_save(n, x, false));
    }
    if (n->needs_grad[0]) {
        n->iparams[1] = n->nsaved;
        ND_TRY(nd_save(n, w, false));
    }
    return ND_OK;
}

/* act(x @ w^T + b), errors named op. Recorded (grad mode on, an input
 * requiring grad) it is one "linear" node over the same kernel, then the
 * activation as its own op. */
static nd_status fused_linear(const char *op, const nd_tensor *x, const nd_tensor *weight,
                              const nd_tensor *bias, nd_activation act, nd_tensor **out) {
    ND_TRY(check_act(op, act));
    ND_TRY(linear_args(op, x, weight, bias));
    const nd_backend *be = nd_backend_of(x);
    if (!be->linear_fused || weight->shape[1] == 0) {
        nd_tensor *y;
        ND_TRY(linear_composed(x, weight, bias, &y));
        return finish_composed(y, act, out);
    }
    if (!would_record(x, weight, bias)) return linear_forward_fused(x, weight, bias, act, out);
    if (act != ND_ACT_NONE) {
        nd_tensor *y;
        ND_TRY(fused_linear(op, x, weight, bias, ND_ACT_NONE, &y));
        return finish_composed(y, act, out);
    }
    ND_FORWARD_THEN_RECORD(linear_forward_fused(x, weight, bias, ND_ACT_NONE, out),
                           record_linear(x, weight, bias, *out), out);
}

nd_status nd_fused_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          nd_activation act, nd_tensor **out) {
    return fused_linear("fused_linear", x, weight, bias, act, out);
}

nd_status nd_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                    nd_tensor **out) {
    return fused_linear("linear", x, weight, bias, ND_ACT_NONE, out);
}
