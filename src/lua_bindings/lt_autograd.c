/* lt_autograd.c - autograd from Lua: x:backward(), nd.grad(), nd.no_grad(),
 * nd.enable_grad() and nd.inference_mode() (also as to-be-closed guards),
 * x:detach(), tensor hooks (x:register_hook, x:retain_grad), custom
 * functions and the hooks DistributedDataParallel uses. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "autograd_node.h"
#include "lt_internal.h"

/* ---- gradient-ready hooks (needle.h nd_set_grad_hook) ----
 * core._set_grad_hook(t, fn | nil): fn(t) runs in x:backward() once t's
 * gradient is complete. The functions live in a registry table keyed by the
 * C tensor, with the userdata (a hooked parameter stays alive until its hook
 * is removed); the backward's Lua state is the one that called backward. */
static const char HOOKS_KEY = 'h';
/* per thread: a DataLoader worker's Lua state may run a backward of its own */
static _Thread_local lua_State *backward_L; /* the state inside x:backward(), else NULL */

static nd_status run_grad_hook(nd_tensor *leaf) {
    lua_State *L = backward_L;
    if (!L) return ND_OK;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &HOOKS_KEY);
    lua_rawgetp(L, -1, leaf);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 2);
        return ND_OK;
    }
    lua_rawgeti(L, -1, 1); /* fn */
    lua_rawgeti(L, -2, 2); /* the tensor */
    int rc = lua_pcall(L, 1, 0, 0);
    nd_status st = ND_OK;
    if (rc != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        st = nd_fail(ND_ERR_ARG, "backward: a gradient hook failed: %s", msg ? msg : "(no message)");
        lua_pop(L, 1);
    }
    lua_pop(L, 2);
    return st;
}

static int l_set_grad_hook(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "set_grad_hook");
    bool on = !lua_isnoneornil(L, 2);
    if (on) luaL_checktype(L, 2, LUA_TFUNCTION);
    LT_CHECK(L, nd_set_grad_hook(t, on));
    nd_set_grad_hook_callback(run_grad_hook);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &HOOKS_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &HOOKS_KEY);
    }
    if (on) {
        lua_createtable(L, 2, 0);
        lua_pushvalue(L, 2);
        lua_rawseti(L, -2, 1);
        lua_pushvalue(L, 1);
        lua_rawseti(L, -2, 2);
    } else {
        lua_pushnil(L);
    }
    lua_rawsetp(L, -2, t);
    return 0;
}

/* ---- tensor hooks (x:register_hook(fn), x:retain_grad(); needle.h
 * nd_hook_tensor) ----
 * The registry table TENSOR_HOOKS maps the engine's key (the tensor's
 * grad_fn, or the leaf itself) to an entry: {rec, rec, ..., retain = a
 * weak-valued {tensor}}, rec = {fn} in registration order. A handle holds
 * the key and its rec; remove() takes the rec out of the entry (the engine
 * then finds one hook fewer). The engine says when a flagged node or leaf
 * is freed, possibly on another thread, where no Lua can run: the key is
 * noted, and the next registration drops the noted entries first (a new
 * node or tensor at a freed one's address starts unflagged, so the engine
 * never asks for a stale entry before that). */
static const char TENSOR_HOOKS_KEY = 't';
static const char HANDLE_MT_KEY = 'r';
static atomic_flag dead_lock = ATOMIC_FLAG_INIT;
static const void **dead_keys;
static size_t ndead_keys, capdead_keys;

static void hook_key_freed(const void *key) {
    while (atomic_flag_test_and_set_explicit(&dead_lock, memory_order_acquire)) {}
    if (ndead_keys == capdead_keys) {
        size_t cap = capdead_keys ? capdead_keys * 2 : 64;
        const void **p = realloc((void *)dead_keys, cap * sizeof *p);
        if (p) {
            dead_keys = p;
            capdead_keys = cap;
        }
    }
    /* without memory the entry stays: a leak, not a wrong hook (see above) */
    if (ndead_keys < capdead_keys) dead_keys[ndead_keys++] = key;
    atomic_flag_clear_explicit(&dead_lock, memory_order_release);
}

/* pushes TENSOR_HOOKS (made on first use) with the freed keys' entries dropped */
static void push_hooks_table(lua_State *L) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &TENSOR_HOOKS_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &TENSOR_HOOKS_KEY);
    }
    while (atomic_flag_test_and_set_explicit(&dead_lock, memory_order_acquire)) {}
    for (size_t i = 0; i < ndead_keys; i++) {
        lua_pushnil(L);
        lua_rawsetp(L, -2, dead_keys[i]);
    }
    ndead_keys = 0;
    atomic_flag_clear_explicit(&dead_lock, memory_order_release);
}

/* core._mute_tensor_hooks(on) -> was: while on, hooked gradients report
 * their graph break but pass unchanged (nd.compile's capture of a backward
 * that then runs eagerly: its hooks would run twice) */
static bool hooks_muted;

static int l_mute_tensor_hooks(lua_State *L) {
    bool was = hooks_muted;
    hooks_muted = lua_toboolean(L, 1);
    lua_pushboolean(L, was);
    return 1;
}

static bool same_device(nd_device a, nd_device b) { return a.type == b.type && a.index == b.index; }

/* the hook's result at the top of the stack as the new gradient (NULL: keep
 * cur), or a failed status naming what was wrong */
static nd_status hook_result(lua_State *L, const nd_tensor *cur, nd_tensor **out) {
    *out = NULL;
    if (lua_isnil(L, -1)) return ND_OK;
    nd_tensor *r = nd_lua_to_tensor(L, -1);
    if (!r)
        return nd_fail(ND_ERR_ARG, "register_hook: a hook returned a %s; expected the new gradient "
                       "(a tensor) or nil", luaL_typename(L, -1));
    char b1[ND_SHAPE_BUF], b2[ND_SHAPE_BUF];
    bool same = r->ndim == cur->ndim;
    for (int d = 0; same && d < r->ndim; d++) same = r->shape[d] == cur->shape[d];
    if (!same)
        return nd_fail(ND_ERR_SHAPE, "register_hook: a hook returned a gradient of shape %s for a "
                       "tensor of shape %s", nd_shape_str(r->shape, r->ndim, b1),
                       nd_shape_str(cur->shape, cur->ndim, b2));
    if (r->dtype != cur->dtype)
        return nd_fail(ND_ERR_DTYPE, "register_hook: a hook returned a %s gradient of shape %s for a "
                       "%s tensor", nd_dtype_name(r->dtype), nd_shape_str(r->shape, r->ndim, b1),
                       nd_dtype_name(cur->dtype));
    nd_device dr = nd_get_device(r), dc = nd_get_device(cur);
    if (!same_device(dr, dc)) {
        char d1[32], d2[32];
        return nd_fail(ND_ERR_ARG, "register_hook: a hook returned a gradient on device %s for a "
                       "tensor on device %s", nd_device_str(dr, d1), nd_device_str(dc, d2));
    }
    nd_retain(r);
    *out = r;
    return ND_OK;
}

/* the engine's callback: grad through the hooks of key, in order, then a
 * retained non-leaf's grad (in backward only, as a leaf's) */
static nd_status run_tensor_hooks(const void *key, nd_tensor *grad, bool in_backward, nd_tensor **out) {
    lua_State *L = backward_L;
    *out = NULL;
    if (!L) return ND_OK;
    if (!lua_checkstack(L, 8)) return nd_fail(ND_ERR_MEMORY, "backward: no Lua stack for a hook");
    int top = lua_gettop(L);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &TENSOR_HOOKS_KEY);
    if (!lua_istable(L, -1) || lua_rawgetp(L, -1, key) != LUA_TTABLE) {
        lua_settop(L, top);
        return ND_OK;
    }
    int entry = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, entry);
    bool retain = lua_getfield(L, entry, "retain") == LUA_TTABLE;
    lua_pop(L, 1);
    if (n == 0 && !retain) {
        lua_settop(L, top);
        return ND_OK;
    }
    /* Lua that a compiled replay would not run */
    nd_status st = nd_graph_break("register_hook: a tensor hook or retain_grad runs in this backward");
    if (st != ND_OK || hooks_muted) {
        lua_settop(L, top);
        return st;
    }
    /* the hooks first: one may remove others (or itself) */
    lua_createtable(L, (int)n, 0);
    int snap = lua_gettop(L);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, entry, i);
        lua_rawseti(L, snap, i);
    }
    nd_tensor *cur = grad;
    nd_retain(cur);
    for (lua_Integer i = 1; i <= n && st == ND_OK; i++) {
        lua_rawgeti(L, snap, i);
        lua_rawgeti(L, -1, 1);
        lua_remove(L, -2);
        nd_retain(cur);
        lt_push(L, cur);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
            const char *msg = lua_tostring(L, -1);
            st = nd_fail(ND_ERR_ARG, "backward: a hook registered with register_hook failed: %s",
                         msg ? msg : "(error object is not a string)");
        } else {
            nd_tensor *r;
            st = hook_result(L, cur, &r);
            if (r) {
                nd_release(cur);
                cur = r;
            }
        }
        lua_pop(L, 1);
    }
    if (st == ND_OK && retain && in_backward) {
        lua_getfield(L, entry, "retain");
        lua_rawgeti(L, -1, 1);
        nd_tensor *t = nd_lua_to_tensor(L, -1);
        if (t && (const void *)t->grad_fn == key) { /* .grad accumulates, as a leaf's */
            nd_tensor *sum = cur;
            if (t->grad) st = nd_binary(ND_BINARY_add, t->grad, cur, &sum);
            else nd_retain(cur);
            if (st == ND_OK) {
                nd_release(t->grad);
                t->grad = sum;
            }
        }
    }
    lua_settop(L, top);
    if (st != ND_OK || cur == grad) {
        nd_release(cur);
        return st;
    }
    *out = cur;
    return ND_OK;
}

/* the entry of t's key, made (or made anew: a stale one) as needed */
static int hook_entry(lua_State *L, nd_tensor *t, const char *op, const void **key) {
    bool fresh;
    push_hooks_table(L);
    int tbl = lua_gettop(L);
    if (nd_hook_tensor(t, key, &fresh) != ND_OK) lt_raise_as(L, op);
    nd_set_tensor_hook_callback(run_tensor_hooks, hook_key_freed);
    if (fresh || lua_rawgetp(L, tbl, *key) != LUA_TTABLE) {
        if (!fresh) lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, tbl, *key);
    }
    lua_remove(L, tbl);
    return lua_gettop(L);
}

/* handle:remove(): takes its hook out (again: nothing) */
static int handle_remove(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "key");
    const void *key = lua_touserdata(L, -1);
    lua_getfield(L, 1, "rec");
    int rec = lua_gettop(L);
    if (!key || lua_rawgetp(L, LUA_REGISTRYINDEX, &TENSOR_HOOKS_KEY) != LUA_TTABLE) return 0;
    if (lua_rawgetp(L, -1, key) != LUA_TTABLE) return 0;
    int entry = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, entry);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, entry, i);
        bool found = lua_rawequal(L, -1, rec);
        lua_pop(L, 1);
        if (!found) continue;
        for (lua_Integer j = i; j < n; j++) {
            lua_rawgeti(L, entry, j + 1);
            lua_rawseti(L, entry, j);
        }
        lua_pushnil(L);
        lua_rawseti(L, entry, n);
        break;
    }
    return 0;
}

/* x:register_hook(fn) -> handle: fn(grad) -> nil | the new gradient, run in
 * backward (and nd.grad) with the gradient of x; handle:remove() (also the
 * handle's __close) takes it out */
static int t_register_hook(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "register_hook");
    if (lua_type(L, 2) != LUA_TFUNCTION)
        return lt_error(L, "register_hook", "expected a function fn(grad) -> nil | tensor, got %s",
                        luaL_typename(L, 2));
    lua_settop(L, 2);
    const void *key;
    int entry = hook_entry(L, t, "register_hook", &key);
    lua_createtable(L, 1, 0); /* rec */
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, entry, (lua_Integer)lua_rawlen(L, entry) + 1);
    lua_createtable(L, 0, 2); /* the handle */
    lua_insert(L, -2);
    lua_setfield(L, -2, "rec");
    lua_pushlightuserdata(L, (void *)key);
    lua_setfield(L, -2, "key");
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &HANDLE_MT_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_createtable(L, 0, 3);
        lua_createtable(L, 0, 1);
        static const lt_reg remove = {"remove", handle_remove, false, true, 1, "handle"};
        lt_push_binding(L, &remove);
        lua_setfield(L, -2, "remove");
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, handle_remove);
        lua_setfield(L, -2, "__close");
        lua_pushliteral(L, "needle.RemovableHandle");
        lua_setfield(L, -2, "__name");
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &HANDLE_MT_KEY);
    }
    lua_setmetatable(L, -2);
    return 1;
}

/* x:retain_grad(): a non-leaf's grad is filled by backward (a leaf's always
 * is: nothing to do) */
static int t_retain_grad(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "retain_grad");
    if (!t->requires_grad)
        return lt_error(L, "retain_grad", "cannot retain the gradient of a tensor that does not require grad");
    if (!t->grad_fn) return 0;
    lua_settop(L, 1);
    const void *key;
    int entry = hook_entry(L, t, "retain_grad", &key);
    lua_createtable(L, 1, 0); /* weak: retaining must not keep x alive */
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 1);
    lua_setfield(L, entry, "retain");
    return 0;
}

/* core._graph_break(why): a graph break (nd_graph_break) when a compiled
 * function is being captured: why names what runs Lua a replay would not */
static int l_graph_break(lua_State *L) {
    LT_CHECK(L, nd_graph_break(luaL_checkstring(L, 1)));
    return 0;
}

/* core._set_backward_end_hook(key, fn | nil): fn(ok, nested, create_graph)
 * runs when an outermost x:backward() ends: ok false when it failed (the
 * error is raised after the hooks, whose own errors are then dropped),
 * nested true when a backward or nd.grad ran inside it (a custom function's
 * backward), create_graph as given. DistributedDataParallel finishes its
 * gradient reduction there. key is any value that names the hook; the table
 * holds its keys weakly (a hook goes with its key). */
static const char END_HOOKS_KEY = 'e';
static _Thread_local int backward_depth;   /* x:backward() and nd.grad() calls in progress */
static _Thread_local bool nested_backward; /* one ran inside the outermost one */

static void enter_backward(lua_State *L, lua_State **outer) {
    if (backward_depth++ > 0) nested_backward = true;
    else nested_backward = false;
    *outer = backward_L;
    backward_L = L;
}

static void leave_backward(lua_State *outer) {
    backward_depth--;
    backward_L = outer;
}

static int l_set_backward_end_hook(lua_State *L) {
    luaL_checkany(L, 1);
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &END_HOOKS_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_createtable(L, 0, 1); /* weak keys: a hook lives as long as its key */
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &END_HOOKS_KEY);
    }
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_rawset(L, -3);
    return 0;
}

static void run_backward_end_hooks(lua_State *L, bool ok, bool nested, bool create) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &END_HOOKS_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        return;
    }
    /* the functions first: a hook may add or remove hooks */
    int tbl = lua_gettop(L);
    lua_newtable(L);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, tbl)) lua_rawseti(L, tbl + 1, ++n);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, tbl + 1, i);
        lua_pushboolean(L, ok);
        lua_pushboolean(L, nested);
        lua_pushboolean(L, create);
        if (ok) {
            lua_call(L, 3, 0); /* an error propagates to backward's caller */
        } else if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
            lua_pop(L, 1); /* the backward's own error is the one to raise */
        }
    }
    lua_pop(L, 2);
}

/* ---- custom ops (nd.autograd.Function, needle.h nd_custom_record) ----
 * core._custom_record(name, inputs, value, backward) -> out: out is value
 * recorded as a function of the list inputs; backward(grad) returns one
 * gradient (or nil) per input. The Lua functions live in a registry table
 * keyed by the node's context; a freed node only notes its key (it may be
 * freed where no Lua state can run), and the next record drops the notes. */
static const char CUSTOM_KEY = 'c';
static void **dead_ctx;
static size_t ndead, capdead;

static void custom_ctx_free(void *ctx) {
    if (ndead == capdead) {
        size_t cap = capdead ? capdead * 2 : 16;
        void **p = realloc(dead_ctx, cap * sizeof *p);
        if (!p) return; /* the entry stays in the table: a leak, not a crash */
        dead_ctx = p;
        capdead = cap;
    }
    dead_ctx[ndead++] = ctx;
}

static nd_status custom_backward(void *ctx, const nd_tensor *grad, nd_tensor **grads, int ninputs) {
    lua_State *L = backward_L;
    if (!L) return nd_fail(ND_ERR_ARG, "backward: a custom function's backward runs only from Lua");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CUSTOM_KEY);
    lua_rawgetp(L, -1, ctx);
    lua_remove(L, -2);
    nd_retain((nd_tensor *)grad);
    lt_push(L, (nd_tensor *)grad);
    int top = lua_gettop(L) - 2;
    if (!lua_checkstack(L, ninputs + LUA_MINSTACK)) {
        lua_settop(L, top);
        return nd_fail(ND_ERR_MEMORY, "backward: no Lua stack for %d gradients", ninputs);
    }
    if (lua_pcall(L, 1, ninputs, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        nd_status st = nd_fail(ND_ERR_ARG, "backward: %s", msg ? msg : "(error object is not a string)");
        lua_settop(L, top);
        return st;
    }
    for (int i = 0; i < ninputs; i++) {
        int idx = top + 1 + i;
        if (lua_isnil(L, idx)) continue;
        nd_tensor *g = lt_to(L, idx);
        if (!g) {
            nd_status st = nd_fail(ND_ERR_ARG, "backward: a custom function's backward returned a %s "
                                   "as gradient %d; expected a tensor or nil", luaL_typename(L, idx), i + 1);
            for (int k = 0; k < i; k++) { nd_release(grads[k]); grads[k] = NULL; }
            lua_settop(L, top);
            return st;
        }
        nd_retain(g);
        grads[i] = g;
    }
    lua_settop(L, top);
    return ND_OK;
}

/* The state inside x:backward() (NULL outside): where an opaque node of a
 * compiled forward's backward graph calls its Lua (lt_graph.c). */
lua_State *lt_custom_backward_state(void);
lua_State *lt_custom_backward_state(void) { return backward_L; }

/* core._custom_flush(): drops the Lua functions of freed custom nodes now
 * (nd.compile, before it plans a graph: their saved tensors would look held) */
static int custom_flush(lua_State *L) {
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &CUSTOM_KEY) != LUA_TTABLE) { lua_pop(L, 1); return 0; }
    int fns = lua_gettop(L);
    while (ndead) {
        void *dead = dead_ctx[--ndead];
        lua_pushnil(L);
        lua_rawsetp(L, fns, dead);
        free(dead);
    }
    lua_pop(L, 1);
    return 0;
}

static int l_custom_record(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    nd_tensor *value = lt_check(L, 3, "autograd.Function");
    luaL_checktype(L, 4, LUA_TFUNCTION);
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &CUSTOM_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &CUSTOM_KEY);
    }
    int fns = lua_gettop(L);
    while (ndead) {
        void *dead = dead_ctx[--ndead];
        lua_pushnil(L);
        lua_rawsetp(L, fns, dead);
        free(dead);
    }
    lua_Integer n = luaL_len(L, 2);
    if (n < 1 || n > 64) return lt_error(L, "autograd.Function", "expected 1..64 inputs, got %lld", (long long)n);
    nd_tensor *ins[64] = {0};
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        ins[i - 1] = lt_to(L, -1); /* non-tensors: NULL, not differentiated */
        lua_pop(L, 1);
    }
    /* a distinct key per node: the node's context is this small allocation,
     * freed only when its key leaves the table (so no new node reuses an
     * address still in the table) */
    void *ctx = malloc(1);
    if (!ctx) return lt_error(L, "autograd.Function", "out of memory");
    nd_tensor *out;
    /* the key goes into the table before recording (a failed record frees ctx) */
    lua_pushvalue(L, 4);
    lua_rawsetp(L, fns, ctx);
    nd_status st = nd_custom_record(name, (const nd_tensor *const *)ins, (int)n, value, custom_backward,
                                    ctx, custom_ctx_free, &out);
    if (st != ND_OK) return lt_raise(L);
    lt_push(L, out);
    return 1;
}

/* x:backward([grad][, {retain_graph=, create_graph=}]) */
static int t_backward(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "backward");
    int opts = 2;
    nd_tensor *grad = NULL;
    if (lt_is_options(L, 2)) {
        lt_no_extra_arg(L, 2, "backward", "x[, gradient][, opts]"); /* the options end the list */
    } else { /* a gradient (or nil), then options */
        if (!lua_isnoneornil(L, 2)) grad = lt_check_tensor_like_on(L, 2, "backward", x->dtype, nd_get_device(x));
        opts = 3;
    }
    static const char *const valid[] = {"retain_graph", "create_graph", NULL};
    opts = lt_options(L, opts, "backward", valid);
    bool retain = lt_opt_bool(L, opts, "backward", "retain_graph", false);
    bool create = lt_opt_bool(L, opts, "backward", "create_graph", false);
    lua_State *outer;
    enter_backward(L, &outer);
    nd_status st = nd_backward(x, grad, retain || create, create);
    leave_backward(outer);
    if (backward_depth == 0) {
        if (st != ND_OK) {
            /* the hooks may run ops: keep the error's message first */
            lua_pushstring(L, nd_last_error());
            run_backward_end_hooks(L, false, nested_backward, create);
            nd_fail(ND_ERR_ARG, "%s", lua_tostring(L, -1));
            lua_pop(L, 1);
            return lt_raise(L);
        }
        run_backward_end_hooks(L, true, nested_backward, create);
    }
    LT_CHECK(L, st);
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
    lua_State *outer;
    enter_backward(L, &outer);
    nd_status st = nd_grad(outs, have_gouts ? gouts : NULL, no, ins, ni, retain, create, unused, res);
    leave_backward(outer);
    LT_CHECK(L, st);
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

/* nd.inference_mode: grad mode off, as no_grad, and this flag on (what
 * nd.is_inference_mode_enabled() reports), per thread like grad mode */
static _Thread_local bool inference_on;

/* The to-be-closed form: `local g <close> = nd.no_grad()` sets the mode at
 * once; closing g (leaving its scope, also by an error) puts back the modes
 * it found. Closing twice restores once. */
#define GRAD_GUARD_MT "needle.grad_mode"
typedef struct { bool prev_grad, prev_inference, closed; } grad_guard;

static int guard_close(lua_State *L) {
    grad_guard *g = luaL_checkudata(L, 1, GRAD_GUARD_MT);
    if (g->closed) return 0;
    g->closed = true;
    nd_set_grad_enabled(g->prev_grad);
    inference_on = g->prev_inference;
    return 0;
}

static int guard_tostring(lua_State *L) {
    grad_guard *g = luaL_checkudata(L, 1, GRAD_GUARD_MT);
    lua_pushstring(L, g->closed ? "grad mode guard (closed)" : "grad mode guard");
    return 1;
}

/* Calls the function at 1 with the remaining arguments under grad mode
 * `on` (and inference mode `inference`), restoring the previous modes even
 * when it raises; without a function, returns the to-be-closed guard. */
static int with_grad_mode(lua_State *L, bool on, bool inference, const char *op) {
    /* only a call without arguments makes a guard: nd.no_grad(f) with an f
     * that is nil by mistake must not turn grad off for the rest of the run */
    if (lua_gettop(L) == 0) {
        grad_guard *g = lua_newuserdatauv(L, sizeof *g, 0);
        g->closed = false;
        if (luaL_newmetatable(L, GRAD_GUARD_MT)) {
            lua_pushcfunction(L, guard_close);
            lua_setfield(L, -2, "__close");
            lua_pushcfunction(L, guard_tostring);
            lua_setfield(L, -2, "__tostring");
            lua_createtable(L, 0, 1); /* g:close(), for code without <close> */
            static const lt_reg close = {"close", guard_close, false, true, 1, "guard"};
            lt_push_binding(L, &close);
            lua_setfield(L, -2, "close");
            lua_setfield(L, -2, "__index");
        }
        lua_setmetatable(L, -2);
        g->prev_grad = nd_set_grad_enabled(on);
        g->prev_inference = inference_on;
        inference_on = inference;
        return 1;
    }
    if (lua_type(L, 1) != LUA_TFUNCTION)
        return lt_error(L, op, "expected a function (and its arguments), or nothing for a to-be-closed "
                        "guard, got %s", luaL_typename(L, 1));
    int base = lua_gettop(L);
    bool prev = nd_set_grad_enabled(on), prev_inference = inference_on;
    inference_on = inference;
    int st = lua_pcall(L, base - 1, LUA_MULTRET, 0);
    nd_set_grad_enabled(prev);
    inference_on = prev_inference;
    if (st != LUA_OK) return lua_error(L);
    return lua_gettop(L);
}
/* enable_grad and no_grad leave inference mode as they find it */
static int l_no_grad(lua_State *L) { return with_grad_mode(L, false, inference_on, "no_grad"); }
static int l_enable_grad(lua_State *L) { return with_grad_mode(L, true, inference_on, "enable_grad"); }
static int l_inference_mode(lua_State *L) { return with_grad_mode(L, false, true, "inference_mode"); }

static int l_is_inference_mode_enabled(lua_State *L) {
    lua_pushboolean(L, inference_on);
    return 1;
}

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
    /* no_grad, enable_grad and inference_mode call fn with the arguments after it */
    static const lt_reg regs[] = {
        {"backward", t_backward, true, false, 3, "x[, gradient][, opts]"},
        {"detach", t_detach, true, true, 1, "x"},
        {"grad", l_grad, false, true, 3, "outputs, inputs[, opts]"},
        {"no_grad", l_no_grad, false, true, LT_VARARGS, "[fn, ...]"},
        {"enable_grad", l_enable_grad, false, true, LT_VARARGS, "[fn, ...]"},
        {"is_grad_enabled", l_is_grad_enabled, false, true, 0, ""},
        {"set_grad_enabled", l_set_grad_enabled, false, true, 1, "on"},
        {"inference_mode", l_inference_mode, false, true, LT_VARARGS, "[fn, ...]"},
        {"is_inference_mode_enabled", l_is_inference_mode_enabled, false, true, 0, ""},
        {"register_hook", t_register_hook, true, false, 2, "x, hook"},
        {"retain_grad", t_retain_grad, true, false, 1, "x"},
        {"_graph_break", l_graph_break, false, true, 1, "why"},
        {"_mute_tensor_hooks", l_mute_tensor_hooks, false, true, 1, "on"},
        {"_set_grad_hook", l_set_grad_hook, false, true, 2, "t, fn"},
        {"_custom_record", l_custom_record, false, true, 4, "name, inputs, value, backward"},
        {"_custom_flush", custom_flush, false, true, 0, ""},
        {"_set_backward_end_hook", l_set_backward_end_hook, false, true, 2, "key, fn"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
