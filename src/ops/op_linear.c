/* op_linear.c - linear: y = x @ w^T + b, its checks, forward and backward.
 *
 * The forward is the backend's linear_fused kernel (the GEMM with the bias
 * in its epilogue; nd_fused_linear in op_fused.c adds an activation there),
 * or the composed differentiable ops where there is no kernel (OpenCL) or
 * nothing to multiply. The backward is one "linear" node whose formulas are
 * differentiable ops:
 *   gx = g @ w,  gw = g^T @ x (all M = numel(x) / K rows as one GEMM),
 *   gb = g summed to (O). */
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"
#include "op_conv.h" /* nd_check_float_weights */
#include "op_fused.h"

/* the shapes of linear's operands (their dtypes and devices: linear_args) */
static nd_status linear_shapes(const char *op, const nd_tensor *x, const nd_tensor *w,
                               const nd_tensor *b) {
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
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

static nd_status linear_args(const char *op, const nd_tensor *x, const nd_tensor *w,
                             const nd_tensor *b) {
    ND_TRY(nd_check_float_weights(op, x, w, b));
    return linear_shapes(op, x, w, b);
}

static bool is_half(const nd_tensor *t) { return t && nd_dtype_is_half(t->dtype); }


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
    if (st == ND_OK) st = ND_BACKEND_CALL(be, linear_fused, "linear", r, x2, wc, bc, act);
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
    ND_TRY(nd_record(ND_OP_linear, bw_linear, out, b ? 3 : 2, in, &n));
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

/* A half weight the backend reads itself: no gradient wanted, a float32 x,
 * the backend's query says yes. The bias (any float32 or half) is made
 * float32 (O values). Returns false when this path does not apply. */
/* The checks of the half paths below, whose operands' dtypes linear_args
 * (one dtype for all) would refuse: devices, shapes, activation. */
static nd_status half_path_args(const char *op, const nd_tensor *x, const nd_tensor *w,
                                const nd_tensor *b, nd_activation act) {
    ND_TRY(nd_check_same_device(op, x, w));
    if (b) ND_TRY(nd_check_same_device(op, x, b));
    ND_TRY(linear_shapes(op, x, w, b));
    return check_act(op, act);
}

static bool linear_half_direct(const char *op, const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                               nd_activation act, nd_tensor **out, nd_status *st) {
    const nd_backend *be = nd_backend_of(x);
    if (x->dtype != ND_FLOAT32 || !is_half(w) || (b && b->dtype != ND_FLOAT32 && !is_half(b)) ||
        w->ndim != 2 || w->shape[1] == 0 || !nd_is_contiguous(w) || would_record(x, w, b) ||
        !nd_call_linear_half_weight(be, x, w))
        return false;
    *st = half_path_args(op, x, w, b, act);
    nd_tensor *bc = NULL;
    if (*st == ND_OK && is_half(b)) *st = nd_to_dtype(b, ND_FLOAT32, &bc);
    if (*st == ND_OK) *st = linear_forward_fused(x, w, bc ? bc : b, act, out);
    nd_release(bc);
    return true;
}

/* Half x or w on a backend without a fused linear whose matmul reads half
 * operands as they are stored (OpenCL): the composed ops take them so -
 * matmul reads them unconverted, half the bytes, and the bias add computes
 * a half bias in float32 - where converting them first would cost a pass
 * and a float32 copy each. Autograd gives each input a gradient of its
 * own dtype, as for the converted operands. Returns false when this path
 * does not apply. */
static bool linear_half_composed(const char *op, const nd_tensor *x, const nd_tensor *w,
                                 const nd_tensor *b, nd_activation act, nd_tensor **out,
                                 nd_status *st) {
    const nd_backend *be = nd_backend_of(x);
    bool f32_or_half_x = x->dtype == ND_FLOAT32 || is_half(x);
    bool f32_or_half_w = w->dtype == ND_FLOAT32 || is_half(w);
    if (be->linear_fused || !be->matmul_reads_half || !(is_half(x) || is_half(w)) ||
        !f32_or_half_x || !f32_or_half_w || (b && b->dtype != ND_FLOAT32 && !is_half(b)))
        return false;
    *st = half_path_args(op, x, w, b, act);
    nd_tensor *y = NULL;
    if (*st == ND_OK) *st = linear_composed(x, w, b, &y);
    if (*st == ND_OK) *st = finish_composed(y, act, out);
    return true;
}

/* act(x @ w^T + b), errors named op (op_fused.h) */
nd_status nd_linear_with_act(const char *op, const nd_tensor *x, const nd_tensor *weight,
                             const nd_tensor *bias, nd_activation act, nd_tensor **out) {
    /* float16 / bfloat16 operands (a model kept in half precision) compute in float32;
     * without a gradient wanted the backend may read a half weight itself (the
     * bits of its float32 copy, half the bytes, no copy) */
    nd_status direct;
    if (linear_half_direct(op, x, weight, bias, act, out, &direct)) return direct;
    if (linear_half_composed(op, x, weight, bias, act, out, &direct)) return direct;
    ND_RETURN_IF_HALF3(x, weight, bias, nd_linear_with_act(op, HX, HW, HB, act, out));
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
        ND_TRY(nd_linear_with_act(op, x, weight, bias, ND_ACT_NONE, &y));
        return finish_composed(y, act, out);
    }
    ND_FORWARD_THEN_RECORD(linear_forward_fused(x, weight, bias, ND_ACT_NONE, out),
                           record_linear(x, weight, bias, *out), out);
}

nd_status nd_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                    nd_tensor **out) {
    return nd_linear_with_act("linear", x, weight, bias, ND_ACT_NONE, out);
}
