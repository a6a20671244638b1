/* lt_autograd.c - autograd from Lua: x:backward(), nd.grad(), nd.no_grad(),
 * nd.enable_grad(), x:detach(). */
#include <string.h>
#include "lt_internal.h"

/* x:backward([grad][, {retain_graph=, create_graph=}]) */
static int t_backward(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "backward");
    int opts = 2;
    nd_tensor *grad = NULL;
    if (!lua_isnoneornil(L, 2) && !lt_is_options(L, 2)) { /* a gradient, then options */
        grad = lt_check_tensor_like_on(L, 2, "backward", x->dtype, nd_get_device(x));
        opts = 3;
    }
    static const char *const valid[] = {"retain_graph", "create_graph", NULL};
    opts = lt_options(L, opts, "backward", valid);
    bool retain = lt_opt_bool(L, opts, "backward", "retain_graph", false);
    bool create = lt_opt_bool(L, opts, "backward", "create_graph", false);
    LT_CHECK(L, nd_backward(x, grad, retain || create, create));
    return 0;
}

#define GRAD_MAX_TENSORS (1 << 20) /* per list: a sanity bound, not a table size */

/* How many tensors a tensor or a list of tensors at idx holds (a list: its
 * length, checked against 1..GRAD_MAX_TENSORS). */
static int tensor_count(lua_State *L, int idx, const char *op, const char *what) {
    if (lt_to(L, idx)) return 1;
    if (!lua_istable(L, idx))
        lt_error(L, op, "%s must be a tensor or a list of tensors, got %s", what, luaL_typename(L, idx));
    lua_Integer n = luaL_len(L, idx);
    if (n < 1 || n > GRAD_MAX_TENSORS)
        lt_error(L, op, "%s: expected 1..%d tensors, got %lld", what, GRAD_MAX_TENSORS, (long long)n);
    return (int)n;
}

/* Reads a tensor or a list of n tensors at idx into ts. */
static void tensor_or_list(lua_State *L, int idx, const char *op, const char *what, nd_tensor **ts,
                           int n, bool *was_list) {
    nd_tensor *t = lt_to(L, idx);
    *was_list = t == NULL;
    if (t) { ts[0] = t; return; }
    for (int i = 0; i < n; i++) {
        lua_geti(L, idx, i + 1);
        ts[i] = lt_to(L, -1);
        if (!ts[i]) lt_error(L, op, "%s[%d] is a %s, expected a tensor", what, i + 1, luaL_typename(L, -1));
        lua_pop(L, 1);
    }
}

/* nd.grad(outputs, inputs[, {grad_outputs=, retain_graph=, create_graph=, allow_unused=}])
 * -> the gradient (or a list of them, when inputs is a list) */
static int l_grad(lua_State *L) {
    lua_settop(L, 3); /* the scratch userdata below goes above the arguments */
    int no = tensor_count(L, 1, "grad", "outputs"), ni = tensor_count(L, 2, "grad", "inputs");
    /* the arrays live in a userdata: a Lua error below frees them with it */
    nd_tensor **outs = lua_newuserdatauv(L, sizeof *outs * (size_t)(2 * no + 2 * ni), 0);
    nd_tensor **gouts = outs + no, **ins = gouts + no, **res = ins + ni;
    memset(outs, 0, sizeof *outs * (size_t)(2 * no + 2 * ni));
    bool out_list, in_list;
    tensor_or_list(L, 1, "grad", "outputs", outs, no, &out_list);
    tensor_or_list(L, 2, "grad", "inputs", ins, ni, &in_list);
    static const char *const valid[] = {"grad_outputs", "retain_graph", "create_graph",
                                        "allow_unused", NULL};
    int opts = lt_options(L, 3, "grad", valid);
    bool have_gouts = false;
    if (opts && lua_getfield(L, opts, "grad_outputs") != LUA_TNIL) {
        bool gl;
        int idx = lua_gettop(L);
        int ng = tensor_count(L, idx, "grad", "grad_outputs");
        if (ng != no) lt_error(L, "grad", "%d grad_outputs for %d outputs", ng, no);
        tensor_or_list(L, idx, "grad", "grad_outputs", gouts, ng, &gl);
        have_gouts = true;
    }
    bool create = lt_opt_bool(L, opts, "grad", "create_graph", false);
    bool retain = lt_opt_bool(L, opts, "grad", "retain_graph", create);
    bool unused = lt_opt_bool(L, opts, "grad", "allow_unused", false);
    LT_CHECK(L, nd_grad(outs, have_gouts ? gouts : NULL, no, ins, ni, retain, create, unused, res));
    if (!in_list) {
        if (res[0]) lt_push(L, res[0]); else lua_pushnil(L);
        return 1;
    }
    lua_createtable(L, ni, 0);
    for (int i = 0; i < ni; i++) {
        if (res[i]) lt_push(L, res[i]); else lua_pushnil(L); /* a hole for unused inputs */
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* Calls the function at 1 with the remaining arguments under grad mode
 * `on`, restoring the previous mode even when it raises. */
static int with_grad_mode(lua_State *L, bool on, const char *op) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    int base = lua_gettop(L);
    (void)op;
    bool prev = nd_set_grad_enabled(on);
    int st = lua_pcall(L, base - 1, LUA_MULTRET, 0);
    nd_set_grad_enabled(prev);
    if (st != LUA_OK) return lua_error(L);
    return lua_gettop(L);
}
static int l_no_grad(lua_State *L) { return with_grad_mode(L, false, "no_grad"); }
static int l_enable_grad(lua_State *L) { return with_grad_mode(L, true, "enable_grad"); }

static int l_is_grad_enabled(lua_State *L) {
    lua_pushboolean(L, nd_grad_enabled());
    return 1;
}

static int l_set_grad_enabled(lua_State *L) {
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    lua_pushboolean(L, nd_set_grad_enabled(lua_toboolean(L, 1)));
    return 1;
}

static int t_detach(lua_State *L) {
    nd_tensor *r;
    LT_CHECK(L, nd_detach(lt_check(L, 1, "detach"), &r));
    lt_push(L, r);
    return 1;
}

void lt_register_autograd(lua_State *L) {
    static const lt_reg regs[] = {
        {"backward", t_backward, true, false},
        {"detach", t_detach, true, true},
        {"grad", l_grad, false, true},
        {"no_grad", l_no_grad, false, true},
        {"enable_grad", l_enable_grad, false, true},
        {"is_grad_enabled", l_is_grad_enabled, false, true},
        {"set_grad_enabled", l_set_grad_enabled, false, true},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
