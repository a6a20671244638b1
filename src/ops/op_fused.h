/* op_fused.h - what op_fused.c (the fused inference ops) and op_linear.c
 * (linear, whose kernel is the same GEMM with an epilogue) share: the
 * activation argument, the test for "autograd would record", and the
 * composed activation; and linear's driver, which takes an activation. */
#ifndef ND_OP_FUSED_H
#define ND_OP_FUSED_H

#include "autograd.h"
#include "backend.h"

static inline nd_status check_act(const char *op, nd_activation act) {
    if (act != ND_ACT_NONE && act != ND_ACT_RELU && act != ND_ACT_GELU)
        return nd_fail(ND_ERR_ARG, "%s: unknown activation %d (expected none, relu or gelu)", op, (int)act);
    return ND_OK;
}

static inline bool would_record(const nd_tensor *x, const nd_tensor *w, const nd_tensor *b) {
    return nd_grad_enabled() && (x->requires_grad || w->requires_grad || (b && b->requires_grad));
}

/* *out = act(y), consuming the caller's reference to y */
static inline nd_status finish_composed(nd_tensor *y, nd_activation act, nd_tensor **out) {
    if (act == ND_ACT_NONE) {
        *out = y;
        return ND_OK;
    }
    nd_status st = nd_unary(act == ND_ACT_GELU ? ND_UNARY_gelu : ND_UNARY_relu, y, out);
    nd_release(y);
    return st;
}

/* act(x @ w^T + b), errors named op (op_linear.c). Recorded (grad mode on,
 * an input requiring grad) it is one "linear" node over the backend's
 * kernel, then the activation as its own op. */
nd_status nd_linear_with_act(const char *op, const nd_tensor *x, const nd_tensor *weight,
                             const nd_tensor *bias, nd_activation act, nd_tensor **out);

#endif
