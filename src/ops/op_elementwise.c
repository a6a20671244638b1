/* op_elementwise.c - unary and binary ops, where, clamp: dtype promotion,
 * broadcasting and checks in front of the backend's kernels, then their
 * backward formulas (written with the differentiable ops themselves, so
 * create_graph gives gradients of gradients) and the recording of nodes.
 * The ops, their dtype rules and the unary formulas are in needle_ops.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend_call.h"
#include "grad_expr.h"
#include "grad_fns.h"
/* Every binary op needs a case in each backward switch below: adding an op
 * to needle_ops.h without its formula fails the build. */
#pragma GCC diagnostic error "-Wswitch"

/* ---------------------------------------------------- rules from the registry */

static bool is_comparison(nd_binary_op op) {
    switch (op) {
#define ND_X(name, kind, ...) case ND_BINARY_##name: return KIND_IS_CMP_##kind;
#define KIND_IS_CMP_ARITH false
#define KIND_IS_CMP_CMP true
    ND_BINARY_OPS(ND_X)
#undef ND_X
    default: return false;
    }
}

typedef enum { RULE_KEEP, RULE_FLOAT, RULE_UINT8, RULE_INT64, RULE_REFUSE } dtype_rule;

static const dtype_rule unary_int_rule[ND_NUM_UNARY] = {
#define ND_X(name, ints, ...) [ND_UNARY_##name] = RULE_##ints,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};
static const dtype_rule unary_bool_rule[ND_NUM_UNARY] = {
#define ND_X(name, ints, bools, ...) [ND_UNARY_##name] = RULE_##bools,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};
static const dtype_rule binary_int_rule[ND_NUM_BINARY] = {
#define ND_X(name, kind, ints, ...) [ND_BINARY_##name] = RULE_##ints,
    ND_BINARY_OPS(ND_X)
#undef ND_X
};
static const dtype_rule binary_bool_rule[ND_NUM_BINARY] = {
#define ND_X(name, kind, ints, bools, ...) [ND_BINARY_##name] = RULE_##bools,
    ND_BINARY_OPS(ND_X)
#undef ND_X
};

/* What to do instead, for the ops that refuse bool tensors. */
static const char *bool_hint(const char *op) {
    if (strcmp(op, "neg") == 0) return " (use logical not: x:eq(0))";
    if (strcmp(op, "sub") == 0) return " (use x:ne(y))";
    return "";
}

static nd_status where_forward(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                               nd_tensor **out);
static nd_status clamp_forward(const nd_tensor *x, double lo, double hi, nd_tensor **out);

/* The dtype a unary op computes in for input dtype dt. */
static nd_status unary_dtype(nd_unary_op op, nd_dtype dt, nd_dtype *out) {
    if (dt == ND_FLOAT16 || dt == ND_BFLOAT16) dt = ND_FLOAT32; /* storage-only types */
    if (dt == ND_BOOL) {
        if (unary_bool_rule[op] == RULE_REFUSE)
            return nd_fail(ND_ERR_DTYPE, "%s: not supported for bool tensors%s", nd_unary_name(op),
                           bool_hint(nd_unary_name(op)));
        dt = unary_bool_rule[op] == RULE_UINT8 ? ND_UINT8 : ND_FLOAT32;
    } else if (nd_dtype_is_int(dt) && unary_int_rule[op] == RULE_FLOAT) {
        dt = ND_FLOAT32;
    }
    *out = dt;
    return ND_OK;
}

static nd_status unary_forward(nd_unary_op op, const nd_tensor *x, nd_tensor **out) {
    if ((unsigned)op >= ND_NUM_UNARY) return nd_fail(ND_ERR_ARG, "unary: invalid op %d", op);
    nd_dtype dt = x->dtype;
    ND_TRY(unary_dtype(op, x->dtype, &dt));
    nd_tensor *xc;
    ND_TRY(nd_as_dtype(x, dt, &xc));
    nd_status st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, dt, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, unary, nd_unary_name(op), op, *out, xc);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(xc);
    if (st == ND_OK && x->dtype == ND_BOOL && dt == ND_UINT8) (*out)->dtype = ND_BOOL;
    return st;
}

/* The dtype a binary op computes in for promoted operand dtype c. */
static nd_status binary_dtype(nd_binary_op op, nd_dtype c, nd_dtype *out) {
    if (c == ND_FLOAT16 || c == ND_BFLOAT16) c = ND_FLOAT32;
    if (c == ND_BOOL) {
        switch (binary_bool_rule[op]) {
        case RULE_REFUSE:
            return nd_fail(ND_ERR_DTYPE, "%s: not supported for bool tensors%s", nd_binary_name(op),
                           bool_hint(nd_binary_name(op)));
        case RULE_INT64: c = ND_INT64; break;
        case RULE_FLOAT: c = ND_FLOAT32; break;
        default: break;
        }
    } else if (nd_dtype_is_int(c) && binary_int_rule[op] == RULE_FLOAT) {
        c = ND_FLOAT32; /* true division */
    }
    *out = c;
    return ND_OK;
}

static bool same_shape(const nd_tensor *t, const int64_t *shape, int nd) {
    if (t->ndim != nd) return false;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

/* Operand x converted to dtype c and expanded to shape. Borrowed when no
 * change is needed (the common case: no references taken on the hot path),
 * else a new tensor recorded in *tmp for the caller to release. */
static nd_status line_up(const nd_tensor *x, nd_dtype c, const int64_t *shape, int nd,
                         const nd_tensor **out, nd_tensor **tmp) {
    *tmp = NULL;
    *out = x;
    if (x->dtype == c && same_shape(x, shape, nd)) return ND_OK;
    nd_tensor *conv;
    ND_TRY(nd_as_dtype(x, c, &conv));
    nd_status st = nd_expand_to(conv, shape, nd, tmp);
    nd_release(conv);
    if (st == ND_OK) *out = *tmp;
    return st;
}

static nd_status binary_forward(nd_binary_op op, const nd_tensor *a, const nd_tensor *b,
                                nd_tensor **out) {
    if ((unsigned)op >= ND_NUM_BINARY) return nd_fail(ND_ERR_ARG, "binary: invalid op %d", op);
    const char *name = nd_binary_name(op);
    int64_t shape[ND_MAX_DIMS];
    int nd;
    ND_TRY(nd_check_same_device(name, a, b));
    ND_TRY(nd_broadcast_shape(name, a->shape, a->ndim, b->shape, b->ndim, shape, &nd));
    nd_dtype c = ND_FLOAT32;
    ND_TRY(binary_dtype(op, nd_promote(a->dtype, b->dtype), &c));
    const nd_tensor *al, *bl;
    nd_tensor *ta = NULL, *tb = NULL;
    nd_status st = line_up(a, c, shape, nd, &al, &ta);
    if (st == ND_OK) st = line_up(b, c, shape, nd, &bl, &tb);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(a), shape, nd, is_comparison(op) ? ND_BOOL : c, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(a);
        st = ND_BACKEND_CALL(be, binary, name, op, *out, al, bl);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(ta);
    nd_release(tb);
    return st;
}

/* PyTorch's rule for a tensor and a number: the number does not widen the
 * tensor's dtype within its kind; a floating number (a Lua float, even 2.0,
 * as a Python float) with an integer or bool tensor gives float32, an
 * integer with a bool tensor gives int64. */
static nd_dtype scalar_promote(nd_dtype t, nd_number s) {
    if (nd_dtype_is_float(t)) return t;
    if (!s.is_int) return ND_FLOAT32;
    return t == ND_BOOL ? ND_INT64 : t;
}

static nd_status binary_number_forward(nd_binary_op op, const nd_tensor *a, nd_number s,
                                       int scalar_first, nd_tensor **out) {
    if ((unsigned)op >= ND_NUM_BINARY) return nd_fail(ND_ERR_ARG, "binary: invalid op %d", op);
    const char *name = nd_binary_name(op);
    nd_dtype c = ND_FLOAT32;
    nd_dtype p = is_comparison(op) ? nd_promote(a->dtype, scalar_promote(a->dtype, s))
                                   : scalar_promote(a->dtype, s);
    /* bool compared with a number compares as int64 */
    if (is_comparison(op) && p == ND_BOOL) p = ND_INT64;
    ND_TRY(binary_dtype(op, p, &c));
    if (!nd_number_fits(c, s)) {
        /* a comparison is still well defined: compare in int64 */
        if (!is_comparison(op))
            return nd_fail(ND_ERR_ARG, "%s: the number %lld cannot be converted to %s without "
                           "overflow", name, (long long)s.i, nd_dtype_name(c));
        c = ND_INT64;
    }
    nd_tensor *ac;
    ND_TRY(nd_as_dtype(a, c, &ac));
    nd_status st = nd_empty_on(nd_get_device(a), a->shape, a->ndim, is_comparison(op) ? ND_BOOL : c, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(a);
        _Alignas(8) unsigned char value[8] = {0};
        nd_store_number(value, c, s);
        st = ND_BACKEND_CALL(be, binary_scalar, name, op, *out, ac, value, scalar_first);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(ac);
    return st;
}

/* PyTorch's can_cast for in-place results: a float result cannot be
 * written into an integer tensor, nor an integer one into a bool tensor,
 * without silently losing information. */
static nd_status check_inplace_cast(const char *op, nd_dtype result, nd_dtype target) {
    bool lossy = (nd_dtype_is_float(result) && !nd_dtype_is_float(target)) ||
                 (nd_dtype_is_int(result) && target == ND_BOOL);
    if (lossy)
        return nd_fail(ND_ERR_DTYPE, "%s_: the result has dtype %s, which cannot be written in "
                       "place into a tensor of dtype %s (convert the tensor first)", op,
                       nd_dtype_name(result), nd_dtype_name(target));
    return ND_OK;
}

/* In-place forms compute out of place into a temporary only when the
 * result dtype differs from a's; otherwise the kernel writes into a
 * directly (operands may alias the output element for element). */
static nd_status write_back(nd_tensor *a, nd_tensor *r) {
    nd_status st = nd_copy_(a, r);
    nd_release(r);
    return st;
}

nd_status nd_binary_(nd_binary_op op, nd_tensor *a, const nd_tensor *b) {
    const char *name = nd_binary_name(op);
    char iname[24]; /* errors name the in-place form: add_ */
    snprintf(iname, sizeof iname, "%s_", name);
    ND_TRY(nd_check_writable(iname, a));
    ND_TRY(nd_check_inplace_grad(iname, a));
    ND_TRY(nd_check_same_device(iname, a, b));
    int64_t shape[ND_MAX_DIMS];
    int nd;
    ND_TRY(nd_broadcast_shape(name, a->shape, a->ndim, b->shape, b->ndim, shape, &nd));
    bool same = nd == a->ndim;
    for (int i = 0; same && i < nd; i++) same = shape[i] == a->shape[i];
    if (!same) {
        char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
        return nd_fail(ND_ERR_SHAPE, "%s_: in-place result of shape %s cannot be written into "
                       "a tensor of shape %s", name, nd_shape_str(shape, nd, b1),
                       nd_shape_str(a->shape, a->ndim, b2));
    }
    /* Write straight into a when the result has a's dtype and b cannot alias
     * a partially (b is in other memory, or is exactly a's elements): each
     * output element then depends only on the inputs at the same position. */
    nd_dtype c = ND_FLOAT32;
    ND_TRY(binary_dtype(op, nd_promote(a->dtype, b->dtype), &c));
    if (!is_comparison(op)) ND_TRY(check_inplace_cast(name, c, a->dtype));
    bool same_view = b->storage == a->storage && b->offset == a->offset && b->ndim == a->ndim;
    for (int i = 0; same_view && i < a->ndim; i++)
        same_view = b->strides[i] == a->strides[i] && b->shape[i] == a->shape[i];
    if (!is_comparison(op) && c == a->dtype && (b->storage != a->storage || same_view)) {
        const nd_tensor *bl;
        nd_tensor *tb;
        ND_TRY(line_up(b, c, a->shape, a->ndim, &bl, &tb));
        const nd_backend *be = nd_backend_of(a);
        nd_status st = ND_BACKEND_CALL(be, binary, name, op, a, a, bl);
        nd_release(tb);
        if (st == ND_OK) nd_bump_version(a);
        return st;
    }
    nd_tensor *r;
    ND_TRY(binary_forward(op, a, b, &r));
    return write_back(a, r);
}

/* x = op(x) in place. The kernel writes straight into x when op computes
 * in x's dtype (each element is read before it is written, at the same
 * place); otherwise (float16/bfloat16 storage, bool) out of place and
 * copied back, rounding as copy_ does. */
nd_status nd_unary_(nd_unary_op op, nd_tensor *x) {
    if ((unsigned)op >= ND_NUM_UNARY) return nd_fail(ND_ERR_ARG, "unary: invalid op %d", op);
    const char *name = nd_unary_name(op);
    char iname[24]; /* errors name the in-place form: relu_ */
    snprintf(iname, sizeof iname, "%s_", name);
    ND_TRY(nd_check_writable(iname, x));
    ND_TRY(nd_check_inplace_grad(iname, x));
    nd_dtype dt = x->dtype;
    ND_TRY(unary_dtype(op, x->dtype, &dt));
    /* (a bool input computed as uint8 gives a bool result) */
    ND_TRY(check_inplace_cast(name, x->dtype == ND_BOOL && dt == ND_UINT8 ? ND_BOOL : dt, x->dtype));
    if (dt == x->dtype) {
        ND_TRY(ND_BACKEND_CALL(nd_backend_of(x), unary, name, op, x, x));
        nd_bump_version(x);
        return ND_OK;
    }
    nd_tensor *r;
    ND_TRY(unary_forward(op, x, &r)); /* (not recorded: the forward alone) */
    return write_back(x, r);
}

/* x = clamp(x, lo, hi) in place, as nd_unary_ */
nd_status nd_clamp_(nd_tensor *x, double lo, double hi) {
    ND_TRY(nd_check_writable("clamp_", x));
    ND_TRY(nd_check_inplace_grad("clamp_", x));
    if (x->dtype != ND_FLOAT16 && x->dtype != ND_BFLOAT16 && x->dtype != ND_BOOL) {
        if (!isnan(lo) && !isnan(hi) && lo > hi)
            return nd_fail(ND_ERR_ARG, "clamp_: min %g is greater than max %g", lo, hi);
        ND_TRY(ND_BACKEND_CALL(nd_backend_of(x), clamp, "clamp", x, x, lo, hi));
        nd_bump_version(x);
        return ND_OK;
    }
    nd_tensor *r;
    ND_TRY(clamp_forward(x, lo, hi, &r));
    return write_back(x, r);
}

nd_status nd_binary_scalar(nd_binary_op op, const nd_tensor *a, double s, int scalar_first,
                           nd_tensor **out) {
    return nd_binary_number(op, a, nd_num_f(s), scalar_first, out);
}

/* ---- the differentiable entry points: forward with grad off, then record */

nd_status nd_unary(nd_unary_op op, const nd_tensor *x, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(unary_forward(op, x, out), nd_record_unary(op, x, *out), out);
}

nd_status nd_binary(nd_binary_op op, const nd_tensor *a, const nd_tensor *b, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(binary_forward(op, a, b, out), nd_record_binary(op, a, b, *out), out);
}

nd_status nd_binary_number(nd_binary_op op, const nd_tensor *a, nd_number s, int scalar_first,
                           nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(binary_number_forward(op, a, s, scalar_first, out),
                           nd_record_binary_number(op, a, s, scalar_first, *out), out);
}

nd_status nd_where(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                   nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(where_forward(cond, a, b, out), nd_record_where(cond, a, b, *out), out);
}

nd_status nd_clamp(const nd_tensor *x, double lo, double hi, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(clamp_forward(x, lo, hi, out), nd_record_clamp(x, lo, hi, *out), out);
}

nd_status nd_binary_scalar_int(nd_binary_op op, const nd_tensor *a, int64_t s, int scalar_first,
                               nd_tensor **out) {
    return nd_binary_number(op, a, nd_num_i(s), scalar_first, out);
}

nd_status nd_binary_scalar_(nd_binary_op op, nd_tensor *a, double s) {
    return nd_binary_number_(op, a, nd_num_f(s));
}

nd_status nd_binary_number_(nd_binary_op op, nd_tensor *a, nd_number s) {
    char iname[24]; /* errors name the in-place form: add_ */
    snprintf(iname, sizeof iname, "%s_", nd_binary_name(op));
    ND_TRY(nd_check_writable(iname, a));
    ND_TRY(nd_check_inplace_grad(iname, a));
    nd_dtype c = ND_FLOAT32;
    ND_TRY(binary_dtype(op, scalar_promote(a->dtype, s), &c));
    if (!is_comparison(op)) ND_TRY(check_inplace_cast(nd_binary_name(op), c, a->dtype));
    if (!nd_number_fits(c, s))
        return nd_fail(ND_ERR_ARG, "%s_: the number %lld cannot be converted to %s without "
                       "overflow", nd_binary_name(op), (long long)s.i, nd_dtype_name(c));
    if (c == a->dtype && !is_comparison(op)) {
        const nd_backend *be = nd_backend_of(a);
        _Alignas(8) unsigned char value[8] = {0};
        nd_store_number(value, c, s);
        ND_TRY(ND_BACKEND_CALL(be, binary_scalar, nd_binary_name(op), op, a, a, value, 0));
        nd_bump_version(a);
        return ND_OK;
    }
    nd_tensor *r;
    ND_TRY(binary_number_forward(op, a, s, 0, &r));
    return write_back(a, r);
}

static nd_status where_forward(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                               nd_tensor **out) {
    if (cond->dtype != ND_BOOL)
        return nd_fail(ND_ERR_DTYPE, "where: condition must be a bool tensor, got %s",
                       nd_dtype_name(cond->dtype));
    int64_t s1[ND_MAX_DIMS], shape[ND_MAX_DIMS];
    int n1, nd;
    ND_TRY(nd_check_same_device("where", cond, a));
    ND_TRY(nd_check_same_device("where", a, b));
    ND_TRY(nd_broadcast_shape("where", a->shape, a->ndim, b->shape, b->ndim, s1, &n1));
    ND_TRY(nd_broadcast_shape("where", cond->shape, cond->ndim, s1, n1, shape, &nd));
    nd_dtype c = nd_promote(a->dtype, b->dtype);
    nd_tensor *ac = NULL, *bc = NULL, *ae = NULL, *bex = NULL, *ce = NULL;
    nd_status st = nd_as_dtype(a, c, &ac);
    if (st == ND_OK) st = nd_as_dtype(b, c, &bc);
    if (st == ND_OK) st = nd_expand_to(ac, shape, nd, &ae);
    if (st == ND_OK) st = nd_expand_to(bc, shape, nd, &bex);
    if (st == ND_OK) st = nd_expand_to(cond, shape, nd, &ce);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(a), shape, nd, c, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(a);
        st = ND_BACKEND_CALL(be, where, "where", *out, ce, ae, bex);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(ac); nd_release(bc); nd_release(ae); nd_release(bex); nd_release(ce);
    return st;
}

static nd_status clamp_forward(const nd_tensor *x, double lo, double hi, nd_tensor **out) {
    if (!isnan(lo) && !isnan(hi) && lo > hi)
        return nd_fail(ND_ERR_ARG, "clamp: min %g is greater than max %g", lo, hi);
    if (x->dtype == ND_BOOL)
        return nd_fail(ND_ERR_DTYPE, "clamp: not supported for bool tensors");
    nd_dtype dt = x->dtype == ND_FLOAT16 || x->dtype == ND_BFLOAT16 ? ND_FLOAT32 : x->dtype;
    nd_tensor *xc;
    ND_TRY(nd_as_dtype(x, dt, &xc));
    nd_status st = nd_empty_on(nd_get_device(x), x->shape, x->ndim, dt, out);
    if (st == ND_OK) {
        const nd_backend *be = nd_backend_of(x);
        st = ND_BACKEND_CALL(be, clamp, "clamp", *out, xc, lo, hi);
        if (st != ND_OK) { nd_release(*out); *out = NULL; }
    }
    nd_release(xc);
    return st;
}

/* ========================================================= backward formulas */

/* ------------------------------------------------------------------ unary */

/* relu's backward by the backend's kernel, when it is not itself recorded:
 * one pass instead of a mask and a product */
static nd_status bw_relu_fused(nd_node *n, const nd_tensor *g, nd_tensor **grads) {
    nd_tensor *ys = NULL, *y = NULL, *gc = NULL, *gx = NULL;
    nd_status st = nd_saved(n, 0, &ys);
    if (st == ND_OK) st = nd_contiguous(ys, &y);
    if (st == ND_OK) st = nd_contiguous(g, &gc);
    if (st == ND_OK) st = nd_empty_on(nd_get_device(g), y->shape, y->ndim, g->dtype, &gx);
    if (st == ND_OK) st = ND_BACKEND_CALL(nd_backend_of(g), relu_backward, "relu", gx, gc, y);
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

/* The backward formulas of needle_ops.h, one function per op. The saved
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
#include "grad_formula_undef.h"

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

/* The same formulas as one fused elementwise program (backend.h), for a
 * backward that is not itself recorded: the composed formula made a tensor
 * per operation - GELU's 11 passes and 11 temporaries over BERT's FFN
 * activations took 7 ms a layer, as long as the layer's GEMM backward on
 * one thread. Each step of the program is its unfused kernel's inner loop,
 * so the result is bit for bit the composed one. Values: 1 is g, 2 the
 * saved x or y, nt + j step j's result (0 is the gradient, written by the
 * last step). A formula the program cannot hold (ZEROS, a comparison, more
 * steps than it has) sets ok = false, and the composed one runs. */
typedef struct {
    nd_ew_program p;
    bool ok;
} ew_build;

static int ew_push(ew_build *e, nd_ew_step s) {
    if (!e->ok || e->p.nsteps >= ND_EW_MAX_STEPS) {
        e->ok = false;
        return 0;
    }
    s.store = -1;
    s.dtype = (uint8_t)e->p.dtype;
    e->p.steps[e->p.nsteps] = s;
    return e->p.nt + e->p.nsteps++;
}

static int ew_bin(ew_build *e, nd_binary_op op, int a, int b) {
    nd_ew_step s = {.kind = ND_EW_BINARY, .op = (uint8_t)op, .in = {(int16_t)a, (int16_t)b, 0}};
    return ew_push(e, s);
}

/* as binary_number_forward: the number stored in the program's dtype */
static int ew_sc(ew_build *e, nd_binary_op op, int a, double v, int scalar_first) {
    if (is_comparison(op)) { /* a bool result: the program's steps are all of one dtype */
        e->ok = false;
        return 0;
    }
    nd_ew_step s = {.kind = ND_EW_BINARY, .op = (uint8_t)op};
    s.in[scalar_first ? 0 : 1] = ND_EW_SCALAR;
    s.in[scalar_first ? 1 : 0] = (int16_t)a;
    nd_store_number(s.scalar, e->p.dtype, nd_num_f(v));
    return ew_push(e, s);
}

static int ew_un(ew_build *e, nd_unary_op op, int a) {
    nd_ew_step s = {.kind = ND_EW_UNARY, .op = (uint8_t)op, .in = {(int16_t)a, 0, 0}};
    return ew_push(e, s);
}

static int ew_fail(ew_build *e) {
    e->ok = false;
    return 0;
}

#define SAVED_NONE
#define SAVED_INPUT const int x = 2;
#define SAVED_OUTPUT const int y = 2;
#define MUL(a, b) ew_bin(e, ND_BINARY_mul, a, b)
#define DIV(a, b) ew_bin(e, ND_BINARY_div, a, b)
#define ADD(a, b) ew_bin(e, ND_BINARY_add, a, b)
#define SUB(a, b) ew_bin(e, ND_BINARY_sub, a, b)
#define MULS(a, s) ew_sc(e, ND_BINARY_mul, a, s, 0)
#define ADDS(a, s) ew_sc(e, ND_BINARY_add, a, s, 0)
#define POWS(a, s) ew_sc(e, ND_BINARY_pow, a, s, 0)
#define GTS(a, s) ew_sc(e, ND_BINARY_gt, a, s, 0)
#define RSUBS(s, a) ew_sc(e, ND_BINARY_sub, a, s, 1)
#define UN(op, a) ew_un(e, ND_UNARY_##op, a)
#define ZEROS ew_fail(e)
#define ND_X(name, ints, bools, save, fexpr, iexpr, bw)                          \
    static int ew_grad_##name(ew_build *e) {                                    \
        const int g = 1;                                                        \
        SAVED_##save                                                            \
        (void)g;                                                                \
        return bw;                                                              \
    }
ND_UNARY_OPS(ND_X)
#include "grad_formula_undef.h"

static int (*const unary_ew_grads[ND_NUM_UNARY])(ew_build *e) = {
#define ND_X(name, ...) [ND_UNARY_##name] = ew_grad_##name,
    ND_UNARY_OPS(ND_X)
#undef ND_X
};

/* *done = false (and nothing made) when the fused form does not apply:
 * CPU float32/float64 tensors of one dtype, not capturing, a formula the
 * program holds */
static nd_status bw_unary_fused(nd_node *n, nd_unary_op op, const nd_tensor *g, nd_tensor **grads,
                                bool *done) {
    *done = false;
    const bool saves = unary_saves[op] != SAVE_NONE;
    if (nd_graph_capturing() || !nd_on_cpu(g) || (g->dtype != ND_FLOAT32 && g->dtype != ND_FLOAT64))
        return ND_OK;
    ew_build e = {.ok = true};
    e.p.nt = saves ? 3 : 2;
    e.p.dtype = g->dtype;
    const int result = unary_ew_grads[op](&e);
    if (!e.ok || e.p.nsteps < 1 || result != e.p.nt + e.p.nsteps - 1) return ND_OK;
    e.p.steps[e.p.nsteps - 1].store = 0;
    snprintf(e.p.desc, sizeof e.p.desc, "%s_backward", nd_unary_name(op));
    nd_tensor *s = NULL, *gx = NULL;
    if (saves) ND_TRY(nd_saved(n, 0, &s));
    nd_status st = ND_OK;
    if (s && (s->dtype != g->dtype || !nd_on_cpu(s) || !same_shape(s, g->shape, g->ndim))) goto out; /* not done */
    st = nd_empty_on(nd_get_device(g), g->shape, g->ndim, g->dtype, &gx);
    if (st == ND_OK) {
        nd_tensor *ts[3] = {gx, (nd_tensor *)g, s};
        st = ND_BACKEND_CALL(nd_backend_of(g), fused_elementwise, e.p.desc, &e.p, ts);
    }
    if (st == ND_OK) {
        grads[0] = gx;
        gx = NULL;
        *done = true;
    }
out:
    nd_release(gx);
    nd_release(s);
    return st;
}

static nd_status bw_unary(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_unary_op op = (nd_unary_op)n->iparams[0];
    if (op == ND_UNARY_relu && !nd_grad_enabled() && nd_backend_of(g)->relu_backward)
        return bw_relu_fused(n, g, grads);
    if (!nd_grad_enabled()) {
        bool done;
        ND_TRY(bw_unary_fused(n, op, g, grads, &done));
        if (done) return ND_OK;
    }
    nd_gx c = {0};
    grads[0] = gx_out(&c, unary_grads[op](&c, n, g));
    return gx_end(&c);
}

nd_status nd_record_unary(nd_unary_op op, const nd_tensor *x, nd_tensor *out) {
    if (!nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {x};
    ND_TRY(nd_record(nd_unary_op_id(op), bw_unary, out, 1, in, &n));
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
    ND_TRY(nd_record(nd_binary_op_id(op), bw_binary, out, 2, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    switch (op) { /* what bw_binary reads: every op decides (-Wswitch is an error here) */
    case ND_BINARY_mul: case ND_BINARY_div: case ND_BINARY_pow:
    case ND_BINARY_maximum: case ND_BINARY_minimum:
        ND_TRY(nd_save(n, a, false));
        return nd_save(n, b, false);
    case ND_BINARY_add: case ND_BINARY_sub:
    case ND_BINARY_eq: case ND_BINARY_ne: case ND_BINARY_lt: case ND_BINARY_le:
    case ND_BINARY_gt: case ND_BINARY_ge:
    case ND_NUM_BINARY:
        return ND_OK;
    }
    return ND_OK;
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
    ND_TRY(nd_record(nd_binary_op_id(op), bw_binary_number, out, 1, in, &n));
    if (!n) return ND_OK;
    n->iparams[0] = op;
    n->iparams[1] = scalar_first;
    n->fparams[0] = s.is_int ? (double)s.i : s.f;
    switch (op) { /* what bw_binary_number reads: every op decides */
    case ND_BINARY_pow: case ND_BINARY_maximum: case ND_BINARY_minimum:
        return nd_save(n, a, false);
    case ND_BINARY_div:
        return scalar_first ? nd_save(n, a, false) : ND_OK;
    case ND_BINARY_add: case ND_BINARY_sub: case ND_BINARY_mul:
    case ND_BINARY_eq: case ND_BINARY_ne: case ND_BINARY_lt: case ND_BINARY_le:
    case ND_BINARY_gt: case ND_BINARY_ge:
    case ND_NUM_BINARY:
        return ND_OK;
    }
    return ND_OK;
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
    ND_TRY(nd_record(ND_OP_where, bw_where, out, 3, in, &n));
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
    ND_TRY(nd_record(ND_OP_clamp, bw_clamp, out, 1, in, &n));
    if (!n) return ND_OK;
    n->fparams[0] = lo;
    n->fparams[1] = hi;
    return nd_save(n, x, false);
}
