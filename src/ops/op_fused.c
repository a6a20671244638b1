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
 * fused kernels (OpenCL) runs the composed ops too, on its own device.
 * fused_linear is linear's driver with an activation (op_linear.c). */
#include "backend_call.h"
#include "op_conv.h"
#include "op_fused.h"

/* ------------------------------------------------------------- conv2d */

nd_status nd_fused_conv2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                          int64_t groups, nd_activation act, nd_tensor **out) {
    const char *op = "fused_conv2d";
    /* float16 / bfloat16 operands compute in float32 (nd_half_operands) */
    ND_RETURN_IF_HALF3(x, weight, bias, nd_fused_conv2d(HX, HW, HB, stride, padding, dilation, groups, act, out));
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

/* the kernel, its checks and its recording are linear's (op_linear.c) */
nd_status nd_fused_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          nd_activation act, nd_tensor **out) {
    return nd_linear_with_act("fused_linear", x, weight, bias, act, out);
}
