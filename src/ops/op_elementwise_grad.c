/* op_elementwise_grad.c - backward formulas of the elementwise ops, written
 * with the differentiable ops themselves (so create_graph gives gradients of
 * gradients), and the recording of their nodes. */
#include <math.h>
#include "backend.h"
/* Every binary op needs a case in each backward switch below: adding an op
 * to op_registry.h without its formula fails the build. */
#pragma GCC diagnostic error "-Wswitch"
#include "grad_expr.h"
#include "grad_fns.h"

/* ------------------------------------------------------------------ unary */

/* relu's backward by the backend's kernel, when it is not itself recorded:
 * one pass instead of a mask and a product */
static nd_status bw_relu_fused(nd_node *n, const nd_tensor *g, nd_tensor **grads) {
    nd_tensor *ys = NULL, *y = NULL, *gc = NULL, *gx = NULL;
    nd_status st = nd_saved(n, 0, &ys);
    if (st == ND_OK) st = nd_contiguous(ys, &y);
    if (st == ND_OK) st = nd_contiguous(g, &gc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(g), y->shape, y->ndim, g->dtype, &gx);
    if (st == ND_OK) st = nd_backend_of(g)->relu_backward(gx, gc, y);
    nd_release(ys);
    nd_release(y);
    nd_release(gc);
    if (st != ND_OK) {
        nd_release(gx);
        return st;
    }
    grads[0] = gx;
    return ND_OK;
}

/* The backward formulas of op_registry.h, one function per op. The saved
 * tensor is declared only under the name the registry's save column gives
 * (x: the input, y: the output), so a formula that reads the other one
 * fails to compile. */
#define SAVED_NONE
#define SAVED_INPUT nd_tensor *x = gx_saved(c, n, 0);
#define SAVED_OUTPUT nd_tensor *y = gx_saved(c, n, 0);
#define MUL(a, b) gx_bin(c, ND_BINARY_mul, a, b)
#define DIV(a, b) gx_bin(c, ND_BINARY_div, a, b)
#define ADD(a, b) gx_bin(c, ND_BINARY_add, a, b)
#define SUB(a, b) gx_bin(c, ND_BINARY_sub, a, b)
#define MULS(a, s) gx_sc(c, ND_BINARY_mul, a, s, 0)
#define ADDS(a, s) gx_sc(c, ND_BINARY_add, a, s, 0)
#define POWS(a, s) gx_sc(c, ND_BINARY_pow, a, s, 0)
#define GTS(a, s) gx_sc(c, ND_BINARY_gt, a, s, 0)
#define RSUBS(s, a) gx_sc(c, ND_BINARY_sub, a, s, 1)
#define UN(op, a) gx_un(c, ND_UNARY_##op, a)
#define ZEROS gx_zeros(c, g, n->in_shape[0], n->in_ndim[0], g->dtype)
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw)                          \
    static nd_tensor *grad_##name(nd_gx *c, nd_node *n, nd_tensor *g) {         \
        SAVED_##save                                                            \
        return bw;                                                              \
    }
ND_UNARY_OPS(ND_X)
#undef ND_X
#undef MUL
#undef DIV
#undef ADD
#undef SUB
#undef MULS
#undef ADDS
#undef POWS
#undef GTS
#undef RSUBS
#undef UN
#undef ZEROS

typedef nd_tensor *(*unary_grad_fn)(nd_gx *c, nd_node *n, nd_tensor *g);
static const unary_grad_fn unary_grads[ND_NUM_UNARY] = {
#define ND_X(name, ...) [ND_UNARY_##name] = grad_##name,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};

/* What each unary op's node saves for its formula. */
enum { SAVE_NONE, SAVE_INPUT, SAVE_OUTPUT };
static const unsigned char unary_saves[ND_NUM_UNARY] = {
#define ND_X(name, ints, bools, save, ...) [ND_UNARY_##name] = SAVE_##save,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};

static nd_status bw_unary(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_unary_op op = (nd_unary_op)n->iparams[0];
    if (op == ND_UNARY_relu && !nd_grad_enabled() && nd_backend_of(g)->relu_backward)
        return bw_relu_fused(n, g, grads);
    nd_gx c = {0};
    grads[0] = gx_out(&c, unary_grads[op](&c, n, g));
    return gx_end(&c);
}

nd_status nd_record_unary(nd_unary_op op, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(nd_unary_name(op), bw_unary, out, 1, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    switch (unary_saves[op]) {
    case SAVE_OUTPUT: return nd_save(n, out, true);
    case SAVE_INPUT: return nd_save(n, x, false);
    default: return ND_OK;
    }
}

/* ----------------------------------------------------------------- binary */

/* 1 where a wins, 1/2 on ties (PyTorch splits a tie evenly), 0 elsewhere */
static nd_tensor *win_mask(nd_gx *c, bool is_max, const nd_tensor *a, const nd_tensor *b,
                           double bs, bool b_is_scalar) {
    nd_binary_op wins = is_max ? ND_BINARY_gt : ND_BINARY_lt;
    nd_tensor *w = b_is_scalar ? gx_sc(c, wins, a, bs, 0) : gx_bin(c, wins, a, b);
    nd_tensor *t = b_is_scalar ? gx_sc(c, ND_BINARY_eq, a, bs, 0) : gx_bin(c, ND_BINARY_eq, a, b);
    return gx_bin(c, ND_BINARY_add, gx_to(c, w, a->dtype), gx_sc(c, ND_BINARY_mul, gx_to(c, t, a->dtype), 0.5, 0));
}

static nd_status bw_binary(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_binary_op op = (nd_binary_op)n->iparams[0];
    nd_tensor *ga = NULL, *gb = NULL;
    bool wa = n->needs_grad[0], wb = n->needs_grad[1];
    switch (op) {
    case ND_BINARY_add: ga = g; gb = g; break;
    case ND_BINARY_sub: ga = g; gb = wb ? gx_un(&c, ND_UNARY_neg, g) : NULL; break;
    case ND_BINARY_mul: {
        nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
        if (wa) ga = gx_bin(&c, ND_BINARY_mul, g, b);
        if (wb) gb = gx_bin(&c, ND_BINARY_mul, g, a);
        break;
    }
    case ND_BINARY_div: { /* d(a/b) = g/b, -g a / b^2 */
        nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
        nd_tensor *gdb = gx_bin(&c, ND_BINARY_div, g, b);
        if (wa) ga = gdb;
        if (wb) gb = gx_un(&c, ND_UNARY_neg, gx_bin(&c, ND_BINARY_mul, gdb, gx_bin(&c, ND_BINARY_div, a, b)));
        break;
    }
    case ND_BINARY_pow: { /* d(a^b) = g b a^(b-1), g a^b log a (0 where a == 0) */
        nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
        if (wa)
            ga = gx_bin(&c, ND_BINARY_mul, g, gx_bin(&c, ND_BINARY_mul, b,
                        gx_bin(&c, ND_BINARY_pow, a, gx_sc(&c, ND_BINARY_sub, b, 1, 0))));
        if (wb) {
            nd_tensor *y = gx_bin(&c, ND_BINARY_pow, a, b);
            nd_tensor *t = gx_bin(&c, ND_BINARY_mul, g, gx_bin(&c, ND_BINARY_mul, y, gx_un(&c, ND_UNARY_log, a)));
            nd_tensor *z = gx_zeros(&c, g, NULL, 0, t ? t->dtype : ND_FLOAT32);
            gb = gx_where(&c, gx_sc(&c, ND_BINARY_eq, a, 0, 0), z, t);
        }
        break;
    }
    case ND_BINARY_maximum: case ND_BINARY_minimum: {
        bool is_max = op == ND_BINARY_maximum;
        nd_tensor *a = gx_saved(&c, n, 0), *b = gx_saved(&c, n, 1);
        if (wa) ga = gx_bin(&c, ND_BINARY_mul, g, win_mask(&c, is_max, a, b, 0, false));
        if (wb) gb = gx_bin(&c, ND_BINARY_mul, g, win_mask(&c, is_max, b, a, 0, false));
        break;
    }
    case ND_BINARY_eq: case ND_BINARY_ne: case ND_BINARY_lt: case ND_BINARY_le:
    case ND_BINARY_gt: case ND_BINARY_ge:
    case ND_NUM_BINARY:
        break; /* comparisons give bool results: never recorded */
    }
    if (wa && ga) grads[0] = gx_out(&c, gx_sum_to(&c, ga, n, 0));
    if (wb && gb) grads[1] = gx_out(&c, gx_sum_to(&c, gb, n, 1));
    return gx_end(&c);
}

nd_status nd_record_binary(nd_binary_op op, const nd_tensor *a, const nd_tensor *b, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK; /* comparisons, integer math */
    nd_node *n;
    const nd_tensor *in[2] = {a, b};
    ND_TRY(nd_record(nd_binary_name(op), bw_binary, out, 2, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    switch (op) {
    case ND_BINARY_mul: case ND_BINARY_div: case ND_BINARY_pow:
    case ND_BINARY_maximum: case ND_BINARY_minimum:
        ND_TRY(nd_save(n, a, false));
        return nd_save(n, b, false);
    default:
        return ND_OK;
    }
}

/* a op s (scalar_first: s op a); the number gets no gradient */
static nd_status bw_binary_number(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_binary_op op = (nd_binary_op)n->iparams[0];
    bool first = n->iparams[1];
    double s = n->fparams[0];
    nd_tensor *r = NULL;
    switch (op) {
    case ND_BINARY_add: r = g; break;
    case ND_BINARY_sub: r = first ? gx_un(&c, ND_UNARY_neg, g) : g; break;
    case ND_BINARY_mul: r = gx_sc(&c, ND_BINARY_mul, g, s, 0); break;
    case ND_BINARY_div:
        if (!first) r = gx_sc(&c, ND_BINARY_div, g, s, 0);
        else { /* d(s/a) = -g s / a^2 */
            nd_tensor *a = gx_saved(&c, n, 0);
            r = gx_un(&c, ND_UNARY_neg, gx_sc(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_div, g,
                      gx_bin(&c, ND_BINARY_mul, a, a)), s, 0));
        }
        break;
    case ND_BINARY_pow: {
        nd_tensor *a = gx_saved(&c, n, 0);
        if (!first) /* d(a^s) = g s a^(s-1) */
            r = gx_bin(&c, ND_BINARY_mul, g, gx_sc(&c, ND_BINARY_mul, gx_sc(&c, ND_BINARY_pow, a, s - 1, 0), s, 0));
        else /* d(s^a) = g s^a log s */
            r = gx_sc(&c, ND_BINARY_mul, gx_bin(&c, ND_BINARY_mul, g, gx_sc(&c, ND_BINARY_pow, a, s, 1)), log(s), 0);
        break;
    }
    case ND_BINARY_maximum: case ND_BINARY_minimum:
        r = gx_bin(&c, ND_BINARY_mul, g, win_mask(&c, op == ND_BINARY_maximum, gx_saved(&c, n, 0), NULL, s, true));
        break;
    case ND_BINARY_eq: case ND_BINARY_ne: case ND_BINARY_lt: case ND_BINARY_le:
    case ND_BINARY_gt: case ND_BINARY_ge:
    case ND_NUM_BINARY:
        break; /* comparisons give bool results: never recorded */
    }
    grads[0] = gx_out(&c, r);
    return gx_end(&c);
}

nd_status nd_record_binary_number(nd_binary_op op, const nd_tensor *a, nd_number s,
                                  int scalar_first, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {a};
    ND_TRY(nd_record(nd_binary_name(op), bw_binary_number, out, 1, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    n->iparams[1] = scalar_first;
    n->fparams[0] = s.is_int ? (double)s.i : s.f;
    bool needs_a = op == ND_BINARY_pow || op == ND_BINARY_maximum || op == ND_BINARY_minimum ||
                   (op == ND_BINARY_div && scalar_first);
    return needs_a ? nd_save(n, a, false) : ND_OK;
}

/* ---------------------------------------------------------- where, clamp */

static nd_status bw_where(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *cond = gx_saved(&c, n, 0);
    nd_tensor *z = gx_zeros(&c, g, NULL, 0, g->dtype);
    if (n->needs_grad[1]) grads[1] = gx_out(&c, gx_sum_to(&c, gx_where(&c, cond, g, z), n, 1));
    if (n->needs_grad[2]) grads[2] = gx_out(&c, gx_sum_to(&c, gx_where(&c, cond, z, g), n, 2));
    return gx_end(&c);
}

nd_status nd_record_where(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                          nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[3] = {NULL, a, b};
    ND_TRY(nd_record("where", bw_where, out, 3, in, &n));
    return n ? nd_save(n, cond, false) : ND_OK;
}

/* gradient passes where lo <= x <= hi (PyTorch's convention at the bounds) */
static nd_status bw_clamp(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_gx c = {0};
    nd_tensor *x = gx_saved(&c, n, 0), *mask = g;
    double lo = n->fparams[0], hi = n->fparams[1];
    if (!isnan(lo)) mask = gx_bin(&c, ND_BINARY_mul, mask, gx_sc(&c, ND_BINARY_ge, x, lo, 0));
    if (!isnan(hi)) mask = gx_bin(&c, ND_BINARY_mul, mask, gx_sc(&c, ND_BINARY_le, x, hi, 0));
    grads[0] = gx_out(&c, mask);
    return gx_end(&c);
}

nd_status nd_record_clamp(const nd_tensor *x, double lo, double hi, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record("clamp", bw_clamp, out, 1, in, &n));
    if (!n) return ND_OK;
    n->fparams[0] = lo;
    n->fparams[1] = hi;
    return nd_save(n, x, false);
}
