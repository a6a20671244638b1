/* lt_math.c - elementwise math, arithmetic metamethods, reductions,
 * matmul, where and clamp; as methods (x:exp()) and functions (nd.exp(x)). */
#include <math.h>
#include <string.h>
#include "lt_internal.h"

/* ------------------------------------------------------------------ unary */

/* A unary op takes its tensor alone: lt_register refuses an extra argument
 * (an options table meant for nd.F.gelu, a dim) that would be dropped
 * without a word. (Lua's __unm passes x twice: u_neg reads the first.) */
#define UNARY_WRAPPER(name, ...) \
    static int u_##name(lua_State *L) { \
        nd_tensor *r; \
        LT_CHECK(L, nd_unary(ND_UNARY_##name, lt_check(L, 1, #name), &r)); \
        lt_push(L, r); \
        return 1; \
    }
ND_UNARY_OPS(UNARY_WRAPPER)

/* x:relu_() ...: the op in place, returning x */
#define UNARY_INPLACE_WRAPPER(name, ...) \
    static int u_##name##_(lua_State *L) { \
        LT_CHECK(L, nd_unary_(ND_UNARY_##name, lt_check(L, 1, #name "_"))); \
        lua_settop(L, 1); \
        return 1; \
    }
ND_UNARY_OPS(UNARY_INPLACE_WRAPPER)

/* ----------------------------------------------------------------- binary */

static bool is_scalar(lua_State *L, int idx) {
    int t = lua_type(L, idx);
    return t == LUA_TNUMBER || t == LUA_TBOOLEAN;
}

/* A tensor for operand idx: tensors as they are, tables converted to the
 * other operand's dtype. Borrowed (see lt_check_tensor_like). */
static nd_tensor *operand(lua_State *L, int idx, const char *op, nd_tensor *other) {
    return lt_check_tensor_like_on(L, idx, op, other ? other->dtype : ND_FLOAT32,
                                   other ? nd_get_device(other) : nd_cpu_device());
}

static int binary(lua_State *L, nd_binary_op op) {
    const char *name = nd_binary_name(op);
    nd_tensor *r;
    nd_status st;
    if (is_scalar(L, 2)) {
        st = nd_binary_number(op, lt_check(L, 1, name), lt_to_number(L, 2), 0, &r);
    } else if (is_scalar(L, 1)) {
        st = nd_binary_number(op, lt_check(L, 2, name), lt_to_number(L, 1), 1, &r);
    } else {
        nd_tensor *a = lt_to(L, 1), *b = lt_to(L, 2);
        if (a && b) st = nd_binary(op, a, b, &r);
        else {
            if (!a && !b) return lt_error(L, name, "expected a tensor operand, got %s and %s",
                                          luaL_typename(L, 1), luaL_typename(L, 2));
            nd_tensor *ta = a ? a : operand(L, 1, name, b);
            nd_tensor *tb = b ? b : operand(L, 2, name, a);
            st = nd_binary(op, ta, tb, &r);
        }
    }
    LT_CHECK(L, st);
    lt_push(L, r);
    return 1;
}

#define BINARY_WRAPPER(name, ...) static int b_##name(lua_State *L) { return binary(L, ND_BINARY_##name); }
ND_BINARY_OPS(BINARY_WRAPPER)

/* In place: x:add_(y) returns x. */
static int binary_inplace(lua_State *L, nd_binary_op op) {
    const char *name = nd_binary_name(op);
    nd_tensor *a = lt_check(L, 1, name);
    if (is_scalar(L, 2)) {
        LT_CHECK(L, nd_binary_number_(op, a, lt_to_number(L, 2)));
    } else {
        LT_CHECK(L, nd_binary_(op, a, operand(L, 2, name, a)));
    }
    lua_settop(L, 1);
    return 1;
}
static int b_add_(lua_State *L) { return binary_inplace(L, ND_BINARY_add); }
static int b_sub_(lua_State *L) { return binary_inplace(L, ND_BINARY_sub); }
static int b_mul_(lua_State *L) { return binary_inplace(L, ND_BINARY_mul); }
static int b_div_(lua_State *L) { return binary_inplace(L, ND_BINARY_div); }
static int b_pow_(lua_State *L) { return binary_inplace(L, ND_BINARY_pow); }

static int t_fill_(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "fill_");
    if (!is_scalar(L, 2)) return lt_error(L, "fill_", "expected a number, got %s", luaL_typename(L, 2));
    LT_CHECK(L, nd_fill_number_(t, lt_to_number(L, 2)));
    lua_settop(L, 1);
    return 1;
}

static int t_zero_(lua_State *L) {
    LT_CHECK(L, nd_fill_(lt_check(L, 1, "zero_"), 0));
    lua_settop(L, 1);
    return 1;
}

static int t_copy_(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "copy_");
    LT_CHECK(L, nd_copy_(t, operand(L, 2, "copy_", t)));
    lua_settop(L, 1);
    return 1;
}

/* ------------------------------------------------------- where and clamp */

static int l_where(lua_State *L) {
    nd_tensor *a = lt_to(L, 2), *b = lt_to(L, 3);
    nd_tensor *c = lt_check_tensor_like_on(L, 1, "where", ND_BOOL,
                                           a ? nd_get_device(a) : b ? nd_get_device(b) : nd_cpu_device());
    nd_tensor *ta = a ? a : operand(L, 2, "where", b);
    nd_tensor *tb = b ? b : operand(L, 3, "where", ta);
    nd_tensor *r;
    LT_CHECK(L, nd_where(c, ta, tb, &r));
    lt_push(L, r);
    return 1;
}

/* x:where(cond, y) == nd.where(cond, x, y) */
static int t_where(lua_State *L) {
    lua_settop(L, 3);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 3);
    lua_remove(L, 1); lua_remove(L, 1); lua_remove(L, 1);
    return l_where(L);
}

static double opt_bound(lua_State *L, int idx, const char *name) {
    if (lua_isnoneornil(L, idx)) return NAN;
    if (lua_type(L, idx) != LUA_TNUMBER)
        lt_error(L, name, "bounds must be numbers or nil, got %s", luaL_typename(L, idx));
    return lua_tonumber(L, idx);
}

/* clamp's bounds: (min, max) or ({min=, max=}) after x; nil or absent: none */
static void clamp_bounds(lua_State *L, const char *name, double *lo, double *hi) {
    if (lua_istable(L, 2)) {
        static const char *const valid[] = {"min", "max", NULL};
        lt_no_extra_arg(L, 2, name, "x, {min=, max=}");
        lt_options(L, 2, name, valid);
        lua_getfield(L, 2, "min");
        lua_getfield(L, 2, "max");
        *lo = opt_bound(L, -2, name);
        *hi = opt_bound(L, -1, name);
    } else {
        *lo = opt_bound(L, 2, name);
        *hi = opt_bound(L, 3, name);
    }
}

static int t_clamp(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "clamp"), *r;
    double lo, hi;
    clamp_bounds(L, "clamp", &lo, &hi);
    LT_CHECK(L, nd_clamp(x, lo, hi, &r));
    lt_push(L, r);
    return 1;
}

/* in place: the kernel writes into x */
static int t_clamp_(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "clamp_");
    double lo, hi;
    clamp_bounds(L, "clamp_", &lo, &hi);
    LT_CHECK(L, nd_clamp_(x, lo, hi));
    lua_settop(L, 1);
    return 1;
}

/* ------------------------------------------------------------- reductions */

/* x:op(dims?, keepdim?, opts?) where opts (also accepted in place of dims
 * or keepdim, as the trailing argument) holds dim, keepdim, correction and
 * unbiased (var/std). */
#define REDUCE_USAGE "x[, dim, keepdim, opts]"
#define VAR_USAGE "x[, dim, keepdim, correction | opts]"

static int reduce(lua_State *L, nd_reduce_op op) {
    const char *name = nd_reduce_name(op);
    nd_tensor *x = lt_check(L, 1, name), *r;
    int dims[ND_MAX_DIMS], nd = 0, opts = 0;
    bool keepdim = false, var = op == ND_REDUCE_var || op == ND_REDUCE_std;
    int correction = 1;
    for (int i = 2; i <= 4 && !opts; i++) if (lt_is_options(L, i)) opts = i;
    /* the options table ends the list; only var and std take a 4th number */
    if (opts) lt_no_extra_arg(L, opts, name, var ? VAR_USAGE : REDUCE_USAGE);
    else if (!lua_isnoneornil(L, 4) && !lua_istable(L, 4) && !(var && lua_type(L, 4) == LUA_TNUMBER))
        lt_extra_arg(L, name, var ? VAR_USAGE : REDUCE_USAGE, NULL, 4);
    if (opts != 2) nd = lt_dims(L, 2, name, dims);
    if (opts != 3 && opts != 2) keepdim = lua_toboolean(L, 3);
    if (!opts && lua_type(L, 4) == LUA_TNUMBER) correction = (int)luaL_checkinteger(L, 4);
    if (opts) {
        static const char *const valid[] = {"dim", "keepdim", NULL};
        static const char *const valid_var[] = {"dim", "keepdim", "correction", "unbiased", NULL};
        lt_options(L, opts, name, var ? valid_var : valid);
        if (lua_getfield(L, opts, "dim") != LUA_TNIL) nd = lt_dims(L, lua_gettop(L), name, dims);
        keepdim = lt_opt_bool(L, opts, name, "keepdim", keepdim);
        if (lua_getfield(L, opts, "correction") != LUA_TNIL) correction = (int)luaL_checkinteger(L, -1);
        if (lua_getfield(L, opts, "unbiased") != LUA_TNIL) correction = lt_opt_bool(L, opts, name, "unbiased", true);
    }
    LT_CHECK(L, nd_reduce(op, x, dims, nd, keepdim, correction, &r));
    if (op == ND_REDUCE_argmax || op == ND_REDUCE_argmin) lt_push_index(L, r);
    else lt_push(L, r);
    return 1;
}

static int r_sum(lua_State *L) { return reduce(L, ND_REDUCE_sum); }
static int r_mean(lua_State *L) { return reduce(L, ND_REDUCE_mean); }
static int r_prod(lua_State *L) { return reduce(L, ND_REDUCE_prod); }
static int r_argmax(lua_State *L) { return reduce(L, ND_REDUCE_argmax); }
static int r_argmin(lua_State *L) { return reduce(L, ND_REDUCE_argmin); }
static int r_var(lua_State *L) { return reduce(L, ND_REDUCE_var); }
static int r_std(lua_State *L) { return reduce(L, ND_REDUCE_std); }
static int r_logsumexp(lua_State *L) { return reduce(L, ND_REDUCE_logsumexp); }

/* max(): the largest value; max({dims}, keepdim): the largest over several
 * dims; max(dim, keepdim): values and 1-based indices; max(other tensor):
 * elementwise maximum (as torch.max). */
static int max_min(lua_State *L, int is_min) {
    const char *name = is_min ? "min" : "max";
    nd_tensor *x = lt_check(L, 1, name);
    if (lt_to(L, 2)) {
        lt_no_extra_arg(L, 2, name, "x, other");
        return binary(L, is_min ? ND_BINARY_minimum : ND_BINARY_maximum);
    }
    /* no dim, a list of dims or options: a reduction (values only) */
    if (lua_isnoneornil(L, 2) || lua_istable(L, 2)) return reduce(L, is_min ? ND_REDUCE_min : ND_REDUCE_max);
    lt_no_extra_arg(L, 3, name, "x, dim[, keepdim]");
    int d = lt_dim(L, 2, name);
    nd_tensor *v, *ix;
    LT_CHECK(L, nd_max_dim(x, d, lua_toboolean(L, 3), is_min, &v, &ix));
    lt_push(L, v);
    lt_push_index(L, ix);
    return 2;
}
static int r_max(lua_State *L) { return max_min(L, 0); }
static int r_min(lua_State *L) { return max_min(L, 1); }

/* ----------------------------------------------------------------- matmul */

static int l_matmul(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "matmul"), *b = lt_check(L, 2, "matmul"), *r;
    LT_CHECK(L, nd_matmul(a, b, &r));
    lt_push(L, r);
    return 1;
}

/* softmax(x, dim) / log_softmax(x, dim); dim defaults to the last */
static int softmax(lua_State *L, bool log) {
    const char *name = log ? "log_softmax" : "softmax";
    nd_tensor *x = lt_check(L, 1, name), *r;
    int d = lt_opt_dim(L, 2, name, -1);
    LT_CHECK(L, log ? nd_log_softmax(x, d, &r) : nd_softmax(x, d, &r));
    lt_push(L, r);
    return 1;
}
static int l_softmax(lua_State *L) { return softmax(L, false); }
static int l_log_softmax(lua_State *L) { return softmax(L, true); }

/* layer_norm(x, normalized_shape, weight, bias, eps = 1e-5) */
static int l_layer_norm(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "layer_norm"), *r;
    int64_t shape[ND_MAX_DIMS];
    int nn = lt_shape(L, 2, "layer_norm", shape, false);
    if (nn < 1 || nn > x->ndim)
        return lt_error(L, "layer_norm", "normalized_shape has %d dims, input has %d", nn, x->ndim);
    for (int i = 0; i < nn; i++)
        if (shape[i] != x->shape[x->ndim - nn + i]) {
            char b[ND_SHAPE_BUF];
            return lt_error(L, "layer_norm", "normalized_shape does not match the last %d dims of "
                            "the input's shape %s", nn, nd_shape_str(x->shape, x->ndim, b));
        }
    int widx = lua_istable(L, 2) ? 3 : 2 + nn;
    nd_tensor *w = lua_isnoneornil(L, widx) ? NULL : lt_check(L, widx, "layer_norm");
    nd_tensor *b = lua_isnoneornil(L, widx + 1) ? NULL : lt_check(L, widx + 1, "layer_norm");
    double eps = luaL_optnumber(L, widx + 2, 1e-5);
    LT_CHECK(L, nd_layer_norm(x, nn, w, b, eps, &r));
    lt_push(L, r);
    return 1;
}

/* batch_norm(x, running_mean, running_var, weight, bias, training = false,
 * momentum = 0.1, eps = 1e-5) (nil for absent tensors) */
static int l_batch_norm(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "batch_norm"), *r;
    nd_tensor *t[4];
    for (int i = 0; i < 4; i++) t[i] = lua_isnoneornil(L, 2 + i) ? NULL : lt_check(L, 2 + i, "batch_norm");
    bool training = lua_toboolean(L, 6);
    double momentum = luaL_optnumber(L, 7, 0.1), eps = luaL_optnumber(L, 8, 1e-5);
    LT_CHECK(L, nd_batch_norm(x, t[0], t[1], t[2], t[3], training, momentum, eps, &r));
    lt_push(L, r);
    return 1;
}

/* cross_entropy(logits (N, C), labels 1..C, {ignore_index=, label_smoothing=, reduction=}) */
static int l_cross_entropy(lua_State *L) {
    const char *op = "cross_entropy";
    nd_tensor *logits = lt_check(L, 1, op), *r;
    int64_t ignore = 0;
    bool has_ignore = false;
    double smoothing = 0;
    int reduction = 1;
    if (lua_istable(L, 3)) {
        static const char *const valid[] = {"ignore_index", "label_smoothing", "reduction", NULL};
        lt_options(L, 3, op, valid);
        if (lua_getfield(L, 3, "ignore_index") != LUA_TNIL) {
            int isint = 0;
            ignore = lua_tointegerx(L, -1, &isint); /* 3.0 is 3; 1.5 or a string is not */
            if (!isint || lua_type(L, -1) != LUA_TNUMBER)
                return lt_error(L, op, "ignore_index must be an integer, got %s",
                                luaL_tolstring(L, -1, NULL));
            has_ignore = true;
        }
        if (lua_getfield(L, 3, "label_smoothing") != LUA_TNIL) smoothing = luaL_checknumber(L, -1);
        if (lua_getfield(L, 3, "reduction") != LUA_TNIL) {
            const char *red = luaL_checkstring(L, -1);
            if (strcmp(red, "none") == 0) reduction = 0;
            else if (strcmp(red, "mean") == 0) reduction = 1;
            else if (strcmp(red, "sum") == 0) reduction = 2;
            else return lt_error(L, op, "reduction must be 'mean', 'sum' or 'none', got '%s'", red);
        }
    }
    nd_tensor *lab0;
    int64_t ignore0 = INT64_MIN;
    if (logits->ndim == 2) {
        /* 1-based labels (and ignore_index) checked here, on every device, and
         * shifted to the core's 0-based ones on the logits' device */
        lab0 = lt_check_labels_on(L, 2, op, logits->shape[0], logits->shape[1],
                                  has_ignore ? &ignore : NULL, nd_get_device(logits), &ignore0);
    } else {
        lab0 = lt_check_ints_like(L, 2, op, "labels"); /* the core names the logits' shape */
    }
    LT_CHECK(L, nd_cross_entropy(logits, lab0, ignore0, smoothing, reduction, &r));
    lt_push(L, r);
    return 1;
}

/* nd.set_num_threads(n [, {adaptive = bool}]): n is the most threads the
 * CPU kernels use; adaptive (left as it was when absent) lets the count
 * drop while other processes keep the CPUs busy. */
static int l_set_num_threads(lua_State *L) {
    lua_Integer n = luaL_checkinteger(L, 1);
    if (n < 1 || n > 4096)
        return lt_error(L, "set_num_threads", "thread count must be in 1..4096, got %lld", (long long)n);
    static const char *const valid[] = {"adaptive", NULL};
    int opts = lt_options(L, 2, "set_num_threads", valid);
    if (opts) {
        lua_getfield(L, opts, "adaptive");
        bool given = !lua_isnil(L, -1);
        lua_pop(L, 1);
        if (given) nd_set_adaptive_threads(lt_opt_bool(L, opts, "set_num_threads", "adaptive", true));
    }
    nd_set_num_threads((int)n);
    return 0;
}

static int l_get_num_threads(lua_State *L) {
    lua_pushinteger(L, nd_get_num_threads());
    return 1;
}

/* nd.set_float32_matmul_precision("highest" | "high" | "medium"), PyTorch's
 * names: "medium" lets float32 products compute on bfloat16 inputs where the
 * CPU has AVX512_BF16 (needle.h) */
static const char *const precision_names[] = {"highest", "high", "medium", NULL};

static int l_set_float32_matmul_precision(lua_State *L) {
    const char *s = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : NULL;
    for (int i = 0; s && precision_names[i]; i++)
        if (strcmp(s, precision_names[i]) == 0) {
            /* a replay runs its products at the precision of the call (a
             * signature guard), not at one set inside the capture */
            LT_CHECK(L, nd_graph_break("set_float32_matmul_precision inside a compiled function: a replay "
                                       "would not run it; set it (or call nd.autocast) outside"));
            nd_set_float32_matmul_precision((nd_matmul_precision)i);
            return 0;
        }
    return lt_error(L, "set_float32_matmul_precision",
                    "expected \"highest\", \"high\" or \"medium\", got %s",
                    s ? lua_pushfstring(L, "\"%s\"", s) : luaL_typename(L, 1));
}

/* core._autocast_enter() / core._autocast_exit(): nd.autocast's scope (needle.h) */
static int l_autocast_enter(lua_State *L) {
    (void)L;
    nd_autocast_enter();
    return 0;
}

static int l_autocast_exit(lua_State *L) {
    (void)L;
    nd_autocast_exit();
    return 0;
}

/* core._set_opencl_matmul_dtype("float32" | "float16" | "bfloat16") /
 * core._get_opencl_matmul_dtype(): what nd.autocast{device_type = "opencl"}
 * rounds the products' operands to there (needle.h) */
static int l_set_opencl_matmul_dtype(lua_State *L) {
    const char *op = "set_opencl_matmul_dtype";
    LT_CHECK_AS(L, op, nd_set_opencl_matmul_dtype(lt_check_dtype_name(L, 1, op)));
    return 0;
}

static int l_get_opencl_matmul_dtype(lua_State *L) {
    lua_pushstring(L, nd_dtype_name(nd_get_opencl_matmul_dtype()));
    return 1;
}

static int l_get_float32_matmul_precision(lua_State *L) {
    lua_pushstring(L, precision_names[nd_get_float32_matmul_precision()]);
    return 1;
}

/* nd.threads(): {max, in_use, cpus, adaptive, measured, busy_elsewhere[, quota]} */
static int l_threads(lua_State *L) {
    nd_threads_state st;
    nd_threads_info(&st);
    lua_createtable(L, 0, 7);
    lt_set_int(L, "max", st.max);
    lt_set_int(L, "in_use", st.in_use);
    lt_set_int(L, "cpus", st.cpus);
    lt_set_bool(L, "adaptive", st.adaptive);
    lt_set_bool(L, "measured", st.measured);
    lt_set_num(L, "busy_elsewhere", st.busy_elsewhere);
    if (st.quota_cpus > 0) lt_set_int(L, "quota", st.quota_cpus);
    return 1;
}

/* nd.ops(): the op registry (needle_ops.h) as a list of tables, for specs
 * that must cover every op and for tools. */
static int l_ops(lua_State *L) {
    int n = nd_op_count();
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        const nd_op_info *op = nd_op_at(i);
        lua_createtable(L, 0, 7);
        lt_set_str(L, "name", op->name);
        lt_set_str(L, "kind", op->kind);
        lt_set_int(L, "arity", op->arity);
        lt_set_str(L, "dtype_rule", op->dtype_rule);
        lt_set_bool(L, "differentiable", op->differentiable);
        lt_set_bool(L, "records_node", op->records_node);
        if (op->expr) lt_set_str(L, "expr", op->expr);
        if (op->backward) lt_set_str(L, "backward", op->backward);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

void lt_register_math(lua_State *L) {
    static const lt_reg regs[] = {
#define REG_U(name, ...) {#name, u_##name, true, true, 1, "x"}, {#name "_", u_##name##_, true, false, 1, "x"},
        ND_UNARY_OPS(REG_U)
#undef REG_U
        /* gelu again, with the form an options table meant (the last entry wins) */
        {"gelu", u_gelu, true, true, 1, "x", "the tanh form is nd.F.gelu(x, {approximate = \"tanh\"})"},
#define REG_B(name, ...) {#name, b_##name, true, true, 2, "x, y"},
        ND_BINARY_OPS(REG_B)
#undef REG_B
        {"add_", b_add_, true, false, 2, "x, y"},
        {"sub_", b_sub_, true, false, 2, "x, y"},
        {"mul_", b_mul_, true, false, 2, "x, y"},
        {"div_", b_div_, true, false, 2, "x, y"},
        {"pow_", b_pow_, true, false, 2, "x, y"},
        {"fill_", t_fill_, true, false, 2, "x, value"},
        {"zero_", t_zero_, true, false, 1, "x"},
        {"copy_", t_copy_, true, false, 2, "x, src"},
        {"where", t_where, true, false, 3, "x, cond, y"},
        {"where", l_where, false, true, 3, "cond, x, y"},
        {"clamp", t_clamp, true, true, 3, "x[, min, max]"},
        {"clip", t_clamp, true, true, 3, "x[, min, max]"},
        {"clamp_", t_clamp_, true, false, 3, "x[, min, max]"},
        {"sum", r_sum, true, true, 4, REDUCE_USAGE},
        {"mean", r_mean, true, true, 4, REDUCE_USAGE},
        {"prod", r_prod, true, true, 4, REDUCE_USAGE},
        {"max", r_max, true, true, 4, "x[, dim, keepdim, opts]"},
        {"min", r_min, true, true, 4, "x[, dim, keepdim, opts]"},
        {"argmax", r_argmax, true, true, 4, REDUCE_USAGE},
        {"argmin", r_argmin, true, true, 4, REDUCE_USAGE},
        {"var", r_var, true, true, 4, VAR_USAGE},
        {"std", r_std, true, true, 4, VAR_USAGE},
        {"logsumexp", r_logsumexp, true, true, 4, REDUCE_USAGE},
        {"matmul", l_matmul, true, true, 2, "x, y"},
        {"mm", l_matmul, true, true, 2, "x, y"},
        {"softmax", l_softmax, true, true, 2, "x[, dim]"},
        {"log_softmax", l_log_softmax, true, true, 2, "x[, dim]"},
        {"layer_norm", l_layer_norm, false, true, 5, "x, normalized_shape[, weight, bias, eps]", NULL, 2},
        {"batch_norm", l_batch_norm, false, true, 8,
         "x, running_mean, running_var[, weight, bias, training, momentum, eps]"},
        {"cross_entropy", l_cross_entropy, false, true, 3, "logits, labels[, opts]"},
        {"set_num_threads", l_set_num_threads, false, true, 2, "n[, opts]"},
        {"get_num_threads", l_get_num_threads, false, true, 0, ""},
        {"set_float32_matmul_precision", l_set_float32_matmul_precision, false, true, 1, "precision"},
        {"get_float32_matmul_precision", l_get_float32_matmul_precision, false, true, 0, ""},
        {"_autocast_enter", l_autocast_enter, false, true, 0, ""},
        {"_set_opencl_matmul_dtype", l_set_opencl_matmul_dtype, false, true, 1, "dtype"},
        {"_get_opencl_matmul_dtype", l_get_opencl_matmul_dtype, false, true, 0, ""},
        {"_autocast_exit", l_autocast_exit, false, true, 0, ""},
        {"threads", l_threads, false, true, 0, ""},
        {"ops", l_ops, false, true, 0, ""},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
    /* arithmetic metamethods on the tensor metatable */
    void lt_push_metatable(lua_State *L);
    lt_push_metatable(L);
    static const struct { const char *mm; lua_CFunction fn; } mms[] = {
        {"__add", b_add}, {"__sub", b_sub}, {"__mul", b_mul}, {"__div", b_div},
        {"__pow", b_pow}, {"__unm", u_neg},
    };
    for (size_t i = 0; i < sizeof mms / sizeof *mms; i++) {
        lua_pushcfunction(L, mms[i].fn);
        lua_setfield(L, -2, mms[i].mm);
    }
    lua_pop(L, 1);
}
