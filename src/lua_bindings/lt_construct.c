/* lt_construct.c - tensors from Lua values and back: nd.tensor, the
 * constructors, totable, item, and the random functions. */
#include <math.h>
#include <string.h>
#include "lt_internal.h"

/* ----------------------------------------------------- nested tables */

/* Walks first elements to find the shape; validates later. */
static int table_shape(lua_State *L, int idx, int64_t *shape, bool *has_bool) {
    int nd = 0;
    lua_pushvalue(L, idx);
    while (lua_istable(L, -1)) {
        if (nd == ND_MAX_DIMS) lt_error(L, "tensor", "nested table is deeper than %d dims", ND_MAX_DIMS);
        shape[nd++] = (int64_t)luaL_len(L, -1);
        if (shape[nd - 1] == 0) break;
        lua_geti(L, -1, 1);
        lua_remove(L, -2);
    }
    if (lua_isboolean(L, -1)) *has_bool = true;
    lua_pop(L, 1);
    return nd;
}

/* ints (named what in errors): class labels and indices, where a fraction
 * or a boolean is a mistake rather than something to truncate. */
typedef struct {
    char *p; size_t es; nd_dtype dt; int64_t pos; const char *op; const char *ints;
    bool any_number; /* a float dtype and no integer rule: every number is stored as it is */
} fill_state;

/* " (at index {i,j})" for an error about the element at path, built only
 * when an error is raised (formatting it per element made nd.tensor of a
 * big table 4x slower); "" for a lone number (path NULL). */
static const char *at_index(const int64_t *path, int depth, char *buf, size_t size) {
    if (!path) return "";
    char p[ND_SHAPE_BUF];
    snprintf(buf, size, " (at index %s)", nd_shape_str(path, depth, p));
    return buf;
}

/* Stores the number or boolean at the top of the stack as element fs->pos.
 * A number must fit the dtype (nd_check_number_fits: out of range is an
 * error, never a clamp); path/depth say where it came from (NULL for a lone
 * number). */
static void store_value(lua_State *L, fill_state *fs, const int64_t *path, int depth) {
    char at[ND_SHAPE_BUF + 16];
    int ty = lua_type(L, -1);
    if (ty == LUA_TNUMBER) { /* the common cases, kept short: any number into a
                              * float dtype, a Lua integer into int64 */
        if (fs->any_number) {
            nd_store_f64(fs->p + fs->pos++ * (int64_t)fs->es, fs->dt, lua_tonumber(L, -1));
            return;
        }
        if (fs->dt == ND_INT64 && lua_isinteger(L, -1)) {
            ((int64_t *)(void *)fs->p)[fs->pos++] = lua_tointeger(L, -1);
            return;
        }
    }
    if (fs->ints && !(ty == LUA_TNUMBER && (lua_isinteger(L, -1) ||
                                             lua_tonumber(L, -1) == trunc(lua_tonumber(L, -1))))) {
        const char *where = at_index(path, depth, at, sizeof at);
        if (ty == LUA_TNUMBER)
            lt_error(L, fs->op, "%s must be integers, got %.15g%s", fs->ints, lua_tonumber(L, -1), where);
        lt_error(L, fs->op, "%s must be integers, got a %s%s", fs->ints, lua_typename(L, ty), where);
    }
    nd_number v = lt_to_number(L, -1);
    if (nd_check_number_fits(fs->op, fs->dt, v) != ND_OK) {
        const char *m = nd_last_error(), *c = strstr(m, ": ");
        lt_error(L, fs->op, "%s%s", c ? c + 2 : m, at_index(path, depth, at, sizeof at));
    }
    nd_store_number(fs->p + fs->pos * (int64_t)fs->es, fs->dt, v);
    fs->pos++;
}

static void fill_from_table(lua_State *L, int idx, const int64_t *shape, int nd, int depth,
                            int64_t *path, fill_state *fs) {
    char pbuf[ND_SHAPE_BUF];
    int64_t n = (int64_t)luaL_len(L, idx);
    if (n != shape[depth]) {
        nd_shape_str(path, depth, pbuf);
        lt_error(L, fs->op, "ragged nested table: expected %lld elements at dim %d, got %lld "
                 "(at index %s)", (long long)shape[depth], depth + 1, (long long)n, pbuf);
    }
    for (int64_t i = 1; i <= n; i++) {
        path[depth] = i;
        int ty = lua_geti(L, idx, i);
        if (depth + 1 < nd) {
            if (ty != LUA_TTABLE) {
                nd_shape_str(path, depth + 1, pbuf);
                lt_error(L, fs->op, "ragged nested table: expected a table at %s, got %s",
                         pbuf, lua_typename(L, ty));
            }
            fill_from_table(L, lua_gettop(L), shape, nd, depth + 1, path, fs);
        } else {
            if (ty != LUA_TNUMBER && ty != LUA_TBOOLEAN)
                lt_error(L, fs->op, "expected a number at index %s, got %s",
                         nd_shape_str(path, depth + 1, pbuf), lua_typename(L, ty));
            store_value(L, fs, path, depth + 1);
        }
        lua_pop(L, 1);
    }
}

/* Builds a tensor from the Lua value at idx and pushes it (as a userdata
 * owning it); returns the borrowed pointer. */
static nd_tensor *tensor_from_lua(lua_State *L, int idx, const char *op, nd_dtype dt,
                                  bool dtype_given, const char *ints) {
    nd_tensor *t;
    int ty = lua_type(L, idx);
    if (ty == LUA_TNUMBER || ty == LUA_TBOOLEAN) {
        if (ty == LUA_TBOOLEAN && !dtype_given) dt = ND_BOOL;
        LT_CHECK(L, nd_empty(NULL, 0, dt, &t));
        lt_push(L, t); /* owned by the stack if the value is refused */
        fill_state fs = {nd_ptr(t), nd_dtype_size(dt), dt, 0, op, ints, !ints && nd_dtype_is_float(dt)};
        lua_pushvalue(L, idx);
        store_value(L, &fs, NULL, 0);
        lua_pop(L, 1);
        return t;
    }
    if (ty != LUA_TTABLE)
        lt_error(L, op, "expected a number, boolean or nested table, got %s",
                 lua_typename(L, ty));
    int64_t shape[ND_MAX_DIMS], path[ND_MAX_DIMS];
    bool has_bool = false;
    int nd = table_shape(L, idx, shape, &has_bool);
    if (has_bool && !dtype_given) dt = ND_BOOL;
    LT_CHECK(L, nd_empty(shape, nd, dt, &t));
    fill_state fs = {nd_ptr(t), nd_dtype_size(dt), dt, 0, op, ints, !ints && nd_dtype_is_float(dt)};
    /* pushed first so that an error inside fill does not leak it */
    lt_push(L, t);
    /* also when empty: every row must agree ({{}, {1, 2}} is ragged) */
    if (nd > 0) fill_from_table(L, idx, shape, nd, 0, path, &fs);
    return t;
}

nd_tensor *lt_check_tensor_like(lua_State *L, int idx, const char *op, nd_dtype dt) {
    nd_tensor *t = lt_to(L, idx);
    if (t) return t;
    int ty = lua_type(L, idx);
    if (ty != LUA_TNUMBER && ty != LUA_TTABLE && ty != LUA_TBOOLEAN)
        lt_error(L, op, "expected a tensor, number or table for argument %d, got %s", idx,
                 lua_typename(L, ty));
    return tensor_from_lua(L, idx, op, dt, ty != LUA_TBOOLEAN, NULL);
}

nd_tensor *lt_check_ints_like(lua_State *L, int idx, const char *op, const char *what) {
    nd_tensor *t = lt_to(L, idx);
    if (t) {
        if (!nd_dtype_is_int(t->dtype))
            lt_error(L, op, "%s must be integers, got a %s tensor (expected int64, int32 or uint8)",
                     what, nd_dtype_name(t->dtype));
        return t;
    }
    int ty = lua_type(L, idx);
    if (ty != LUA_TNUMBER && ty != LUA_TTABLE)
        lt_error(L, op, "expected %s as a tensor, table or number for argument %d, got %s", what,
                 idx, lua_typename(L, ty));
    return tensor_from_lua(L, idx, op, ND_INT64, true, what);
}

nd_tensor *lt_check_tensor_like_on(lua_State *L, int idx, const char *op, nd_dtype dt,
                                   nd_device dev) {
    nd_tensor *t = lt_to(L, idx);
    if (t) return t; /* a tensor stays where it is: the op checks devices */
    t = lt_check_tensor_like(L, idx, op, dt); /* pushed */
    if (dev.type == ND_DEVICE_CPU) return t;
    ((lt_box *)lua_touserdata(L, -1))->t = NULL; /* take the reference back */
    lua_pop(L, 1);
    lt_push_on(L, t, dev, op);
    return lt_to(L, -1);
}

static void finish_new_on(lua_State *L, nd_tensor *t, int opts, const char *op, nd_device dev);

/* The options every constructor takes (PyTorch's factory keywords). */
static const char *const NEW_OPTS[] = {"dtype", "device", "requires_grad", NULL};

/* nd.tensor(data, {dtype=, device=, requires_grad=}) */
static int l_tensor(lua_State *L) { /* at most 2 arguments: lt_register's check */
    lt_options(L, 2, "tensor", NEW_OPTS);
    nd_tensor *src0 = lt_to(L, 1);
    nd_device dev = lt_opt_device(L, 2, "tensor", src0 ? nd_get_device(src0) : nd_cpu_device());
    bool given = false;
    if (lua_istable(L, 2)) {
        given = lua_getfield(L, 2, "dtype") != LUA_TNIL;
        lua_pop(L, 1);
    }
    nd_dtype dt = lt_opt_dtype(L, 2, "tensor", ND_FLOAT32);
    nd_tensor *src = lt_to(L, 1);
    nd_tensor *t;
    if (src) LT_CHECK(L, given ? nd_to_dtype(src, dt, &t) : nd_clone(src, &t));
    else {
        t = tensor_from_lua(L, 1, "tensor", dt, given, NULL); /* pushed: take it off the stack */
        nd_retain(t);
        lua_pop(L, 1);
        finish_new_on(L, t, 2, "tensor", dev);
        return 1;
    }
    if (src && given && t == src) { /* to() returned src itself: copy */
        nd_tensor *c;
        nd_status st = nd_clone(src, &c);
        nd_release(t);
        LT_CHECK(L, st);
        t = c;
    }
    finish_new_on(L, t, 2, "tensor", dev);
    return 1;
}

/* ------------------------------------------------------------- back out */

static void push_element(lua_State *L, const char *p, nd_dtype dt) {
    switch (dt) {
    case ND_INT64: lua_pushinteger(L, *(const int64_t *)p); break;
    case ND_INT32: lua_pushinteger(L, *(const int32_t *)p); break;
    case ND_UINT8: lua_pushinteger(L, *(const uint8_t *)p); break;
    case ND_BOOL: lua_pushboolean(L, *(const uint8_t *)p != 0); break;
    default: lua_pushnumber(L, nd_load_f64(p, dt)); break;
    }
}

static void push_table(lua_State *L, const nd_tensor *t, int depth, const char *p) {
    if (depth == t->ndim) { push_element(L, p, t->dtype); return; }
    int64_t n = t->shape[depth];
    int64_t step = t->strides[depth] * (int64_t)nd_dtype_size(t->dtype);
    luaL_checkstack(L, 4, "tensor too deep");
    lua_createtable(L, n > 0x7fffffff ? 0 : (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        push_table(L, t, depth + 1, p + i * step);
        lua_rawseti(L, -2, i + 1);
    }
}

static int t_totable(lua_State *L) {
    nd_tensor *t = lt_push_host(L, lt_check(L, 1, "totable"), "totable");
    push_table(L, t, 0, nd_ptr(t));
    return 1;
}

static int t_item(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "item");
    if (nd_numel(t) != 1) {
        char b[ND_SHAPE_BUF];
        return lt_error(L, "item", "a tensor with %lld elements (shape %s) cannot be converted "
                        "to a number (expected exactly 1)", (long long)nd_numel(t),
                        nd_shape_str(t->shape, t->ndim, b));
    }
    t = lt_push_host(L, t, "item");
    push_element(L, nd_ptr(t), t->dtype);
    return 1;
}

/* ---------------------------------------------------------- constructors */

/* Shape from args at idx (table or sizes); options table after it (or nil). */
static int shape_and_opts(lua_State *L, int idx, const char *op, int64_t *shape, int *opts) {
    int n = lt_shape(L, idx, op, shape, false);
    int o = lua_istable(L, idx) ? idx + 1 : idx + n;
    *opts = o;
    if (!lua_isnoneornil(L, o) && !lua_istable(L, o))
        lt_error(L, op, "expected an options table after the shape, got %s", luaL_typename(L, o));
    lt_no_extra(L, o, op, "the options table is the last argument");
    lt_options(L, o, op, NEW_OPTS);
    lt_check_device(L, o, op);
    return n;
}

/* Moves a new tensor to opts.device (default dev), sets requires_grad, pushes it. */
static void finish_new_on(lua_State *L, nd_tensor *t, int opts, const char *op, nd_device dev) {
    lt_push(L, t); /* owned by the stack while the options are read: they may raise */
    dev = lt_opt_device(L, opts, op, dev);
    bool rg = lt_opt_bool(L, lua_istable(L, opts) ? opts : 0, op, "requires_grad", false);
    if (rg && !nd_dtype_is_float(t->dtype))
        lt_error(L, op, "only floating point tensors can require gradients");
    ((lt_box *)lua_touserdata(L, -1))->t = NULL; /* take the reference back */
    lua_pop(L, 1);
    lt_push_on(L, t, dev, op);
    if (rg) lt_to(L, -1)->requires_grad = true;
}

static void finish_new(lua_State *L, nd_tensor *t, int opts, const char *op) {
    finish_new_on(L, t, opts, op, nd_cpu_device());
}

static int fill_ctor(lua_State *L, const char *op, double value, int first) {
    int64_t shape[ND_MAX_DIMS];
    int opts;
    int n = shape_and_opts(L, first, op, shape, &opts);
    nd_dtype dt = lt_opt_dtype(L, opts, op, ND_FLOAT32);
    nd_tensor *t;
    nd_device dev = lt_check_device(L, opts, op); /* made there directly */
    if (value == 0) LT_CHECK_AS(L, op, nd_zeros_on(dev, shape, n, dt, &t));
    else if (isnan(value) && strcmp(op, "empty") == 0) LT_CHECK_AS(L, op, nd_empty_on(dev, shape, n, dt, &t));
    else LT_CHECK_AS(L, op, nd_full_on(dev, shape, n, dt, value, &t));
    finish_new(L, t, opts, op);
    return 1;
}

static int l_zeros(lua_State *L) { return fill_ctor(L, "zeros", 0, 1); }
static int l_ones(lua_State *L) { return fill_ctor(L, "ones", 1, 1); }
static int l_empty(lua_State *L) { return fill_ctor(L, "empty", NAN, 1); }
static int l_full(lua_State *L) {
    /* full(shape, value, opts) */
    int64_t shape[ND_MAX_DIMS];
    int n = lt_shape(L, 1, "full", shape, false);
    if (!lua_istable(L, 1)) return lt_error(L, "full", "expected the shape as a table");
    if (!lua_isboolean(L, 2)) lt_arg_number(L, 2, "full", "value");
    nd_number v = lt_to_number(L, 2);
    lt_options(L, 3, "full", NEW_OPTS);
    nd_device dev = lt_check_device(L, 3, "full");
    nd_dtype dt = lt_opt_dtype(L, 3, "full", lua_isboolean(L, 2) ? ND_BOOL : ND_FLOAT32);
    nd_tensor *t;
    LT_CHECK_AS(L, "full", nd_empty_on(dev, shape, n, dt, &t));
    lt_push(L, t); /* owned by the stack while it is filled */
    LT_CHECK_AS(L, "full", nd_fill_number_(t, v)); /* exact for int64 */
    lua_pop(L, 1);
    nd_retain(t);
    finish_new(L, t, 3, "full");
    return 1;
}

/* zeros_like(x, opts) and friends: x's shape and dtype unless overridden */
static int like_ctor(lua_State *L, const char *op, int kind, double value) {
    nd_tensor *x = lt_check(L, 1, op);
    int opts = kind == 2 ? 3 : 2;
    lt_options(L, opts, op, NEW_OPTS);
    nd_device dev = lt_opt_device(L, opts, op, nd_get_device(x)); /* x's device by default */
    nd_dtype dt = lt_opt_dtype(L, opts, op, x->dtype);
    nd_tensor *t;
    if (kind == 3) {
        LT_CHECK(L, nd_rand_on(dev, x->shape, x->ndim, dt, &t));
    } else if (kind == 4) {
        LT_CHECK(L, nd_randn_on(dev, x->shape, x->ndim, dt, &t));
    } else {
        /* full_like's value as given (exact for int64), refused if it does not fit */
        nd_number v = nd_num_f(value);
        if (kind == 2) {
            lt_arg_number(L, 2, op, "value");
            v = lt_to_number(L, 2);
        }
        LT_CHECK_AS(L, op, nd_empty_on(dev, x->shape, x->ndim, dt, &t));
        lt_push(L, t); /* owned by the stack while it is filled */
        LT_CHECK_AS(L, op, nd_fill_number_(t, v));
        lua_pop(L, 1);
        nd_retain(t);
    }
    finish_new_on(L, t, opts, op, dev);
    return 1;
}
static int l_zeros_like(lua_State *L) { return like_ctor(L, "zeros_like", 0, 0); }
static int l_ones_like(lua_State *L) { return like_ctor(L, "ones_like", 1, 1); }
static int l_full_like(lua_State *L) { return like_ctor(L, "full_like", 2, 0); }
static int l_rand_like(lua_State *L) { return like_ctor(L, "rand_like", 3, 0); }
static int l_randn_like(lua_State *L) { return like_ctor(L, "randn_like", 4, 0); }

#define ARANGE_USAGE "[start, ]end[, step][, opts]"
#define EYE_USAGE "n[, m][, opts]"

static int l_arange(lua_State *L) {
    /* arange(end) | arange(start, end[, step]) [, opts] */
    int nargs = 0;
    while (nargs < 3 && lua_type(L, nargs + 1) == LUA_TNUMBER) nargs++;
    if (nargs == 0) return lt_error(L, "arange", "expected arange(end) or arange(start, end[, step])");
    double start = 0, end, step = 1;
    if (nargs == 1) end = lua_tonumber(L, 1);
    else { start = lua_tonumber(L, 1); end = lua_tonumber(L, 2); }
    if (nargs == 3) step = lua_tonumber(L, 3);
    int opts = nargs + 1;
    /* arange(start, end, nil, opts): a nil step is the default one */
    if (nargs == 2 && lua_isnil(L, 3) && lua_istable(L, 4)) opts = 4;
    lt_no_extra_arg(L, opts, "arange", ARANGE_USAGE); /* the options table ends the list */
    lt_options(L, opts, "arange", NEW_OPTS);
    lt_check_device(L, opts, "arange");
    bool all_int = true;
    for (int i = 1; i <= nargs; i++) all_int = all_int && lua_isinteger(L, i);
    /* integer arguments give int64 as in PyTorch */
    nd_dtype dt = lt_opt_dtype(L, opts, "arange", all_int ? ND_INT64 : ND_FLOAT32);
    nd_tensor *t;
    LT_CHECK_AS(L, "arange", nd_arange(start, end, step, dt, &t));
    finish_new(L, t, opts, "arange");
    return 1;
}

static int l_linspace(lua_State *L) {
    double a = lt_arg_number(L, 1, "linspace", "start"), b = lt_arg_number(L, 2, "linspace", "end");
    lua_Integer steps = lt_arg_integer(L, 3, "linspace", "steps");
    lt_options(L, 4, "linspace", NEW_OPTS);
    lt_check_device(L, 4, "linspace");
    nd_dtype dt = lt_opt_dtype(L, 4, "linspace", ND_FLOAT32);
    nd_tensor *t;
    LT_CHECK_AS(L, "linspace", nd_linspace(a, b, steps, dt, &t));
    finish_new(L, t, 4, "linspace");
    return 1;
}

static int l_eye(lua_State *L) {
    lua_Integer n = lt_arg_integer(L, 1, "eye", "n");
    int opts = 2;
    lua_Integer m = n;
    if (lua_type(L, 2) == LUA_TNUMBER) { m = lt_arg_integer(L, 2, "eye", "m"); opts = 3; }
    else if (lua_isnil(L, 2) && lua_istable(L, 3)) opts = 3; /* eye(n, nil, opts): m = n */
    lt_no_extra_arg(L, opts, "eye", EYE_USAGE); /* the options table ends the list */
    if (n < 0 || m < 0) return lt_error(L, "eye", "sizes must be >= 0, got %lld x %lld",
                                        (long long)n, (long long)m);
    lt_options(L, opts, "eye", NEW_OPTS);
    lt_check_device(L, opts, "eye");
    nd_dtype dt = lt_opt_dtype(L, opts, "eye", ND_FLOAT32);
    nd_tensor *t;
    LT_CHECK_AS(L, "eye", nd_eye(n, m, dt, &t));
    finish_new(L, t, opts, "eye");
    return 1;
}

/* ---------------------------------------------------------------- random */

/* Inside a compiled function's capture the stream's state is Lua's business
 * that a replay would not repeat (each replay draws fresh counters from where
 * the stream is): a graph break. */
static int l_manual_seed(lua_State *L) {
    lua_Integer s = lt_arg_integer(L, 1, "manual_seed", "seed");
    LT_CHECK(L, nd_graph_break("manual_seed: reseeds the random stream"));
    nd_manual_seed((uint64_t)s);
    return 0;
}

static int l_get_rng_state(lua_State *L) {
    uint64_t seed, offset;
    LT_CHECK(L, nd_graph_break("get_rng_state: reads the random stream's position"));
    nd_rng_get_state(&seed, &offset);
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)seed);
    lua_setfield(L, -2, "seed");
    lua_pushinteger(L, (lua_Integer)offset);
    lua_setfield(L, -2, "offset");
    return 1;
}

static int l_set_rng_state(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "seed");
    lua_getfield(L, 1, "offset");
    if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
        return lt_error(L, "set_rng_state", "expected a table {seed=<integer>, offset=<integer>}");
    LT_CHECK(L, nd_graph_break("set_rng_state: moves the random stream"));
    nd_rng_set_state((uint64_t)lua_tointeger(L, -2), (uint64_t)lua_tointeger(L, -1));
    return 0;
}

static int rand_ctor(lua_State *L, const char *op, int normal) {
    int64_t shape[ND_MAX_DIMS];
    int opts;
    int n = shape_and_opts(L, 1, op, shape, &opts);
    nd_dtype dt = lt_opt_dtype(L, opts, op, ND_FLOAT32);
    if (!nd_dtype_is_float(dt)) lt_error(L, op, "dtype must be floating point, got %s", nd_dtype_name(dt));
    nd_tensor *t;
    nd_device dev = lt_check_device(L, opts, op);
    LT_CHECK_AS(L, op, normal ? nd_randn_on(dev, shape, n, dt, &t) : nd_rand_on(dev, shape, n, dt, &t));
    finish_new(L, t, opts, op);
    return 1;
}
static int l_rand(lua_State *L) { return rand_ctor(L, "rand", 0); }
static int l_randn(lua_State *L) { return rand_ctor(L, "randn", 1); }

/* randint(low, high, shape[, opts]): integers in [low, high], inclusive
 * like math.random (so randint(1, C, ...) draws 1-based class labels). */
static int l_randint(lua_State *L) {
    lua_Integer lo = lt_arg_integer(L, 1, "randint", "low"), hi = lt_arg_integer(L, 2, "randint", "high");
    if (hi < lo) return lt_error(L, "randint", "empty range [%lld, %lld]", (long long)lo, (long long)hi);
    int64_t shape[ND_MAX_DIMS];
    int opts;
    int n = shape_and_opts(L, 3, "randint", shape, &opts);
    nd_dtype dt = lt_opt_dtype(L, opts, "randint", ND_INT64);
    nd_tensor *t;
    if (hi == INT64_MAX) return lt_error(L, "randint", "high must be < 2^63-1");
    LT_CHECK_AS(L, "randint", nd_randint(lo, hi + 1, shape, n, dt, &t));
    finish_new(L, t, opts, "randint");
    return 1;
}

/* nd.randperm(n[, {device =}]): drawn on the cpu (one stream for every
 * device, as the other draws), then moved. */
static int l_randperm(lua_State *L) {
    lua_Integer n = lt_arg_integer(L, 1, "randperm", "n");
    static const char *const valid[] = {"device", NULL};
    int opts = lt_options(L, 2, "randperm", valid);
    nd_device dev = opts ? lt_check_device(L, opts, "randperm") : nd_cpu_device();
    if (n < 0) return lt_error(L, "randperm", "n must be >= 0, got %lld", (long long)n);
    nd_tensor *t;
    LT_CHECK_AS(L, "randperm", nd_randperm(n, &t));
    lt_push_index(L, t); /* a permutation of 1..n */
    nd_tensor *p = lt_check(L, -1, "randperm");
    nd_retain(p);
    lua_pop(L, 1);
    lt_push_on(L, p, dev, "randperm");
    return 1;
}

static int l_bernoulli(lua_State *L) {
    nd_tensor *p = lt_check_tensor_like(L, 1, "bernoulli", ND_FLOAT32);
    nd_tensor *t;
    LT_CHECK(L, nd_bernoulli(p, &t));
    lt_push(L, t);
    return 1;
}

void lt_register_construct(lua_State *L) {
    /* zeros, ones, empty, rand and randn take a shape as a table or as
     * numbers, then options: shape_and_opts refuses what follows those */
    static const lt_reg regs[] = {
        {"tensor", l_tensor, false, true, 2, "data[, opts]"},
        {"totable", t_totable, true, false, 1, "x"},
        {"item", t_item, true, false, 1, "x"},
        {"zeros", l_zeros, false, true, LT_VARARGS, "size...[, opts]"},
        {"ones", l_ones, false, true, LT_VARARGS, "size...[, opts]"},
        {"empty", l_empty, false, true, LT_VARARGS, "size...[, opts]"},
        {"full", l_full, false, true, 3, "size, value[, opts]"},
        {"zeros_like", l_zeros_like, false, true, 2, "x[, opts]"},
        {"ones_like", l_ones_like, false, true, 2, "x[, opts]"},
        {"full_like", l_full_like, false, true, 3, "x, value[, opts]"},
        {"rand_like", l_rand_like, false, true, 2, "x[, opts]"},
        {"randn_like", l_randn_like, false, true, 2, "x[, opts]"},
        {"arange", l_arange, false, true, 4, ARANGE_USAGE},
        {"linspace", l_linspace, false, true, 4, "start, end, steps[, opts]"},
        {"eye", l_eye, false, true, 3, EYE_USAGE},
        {"manual_seed", l_manual_seed, false, true, 1, "seed"},
        {"get_rng_state", l_get_rng_state, false, true, 0, ""},
        {"set_rng_state", l_set_rng_state, false, true, 1, "state"},
        {"rand", l_rand, false, true, LT_VARARGS, "size...[, opts]"},
        {"randn", l_randn, false, true, LT_VARARGS, "size...[, opts]"},
        {"randint", l_randint, false, true, 4, "low, high, size[, opts]", NULL, 3},
        {"randperm", l_randperm, false, true, 2, "n[, opts]"},
        {"bernoulli", l_bernoulli, true, true, 1, "p"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
