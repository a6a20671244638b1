/* lt_graph.c - the C half of nd.compile (lua/needle/compile): a captured
 * graph as a userdata (core._graph_begin() -> g; g:finish(), g:replay(),
 * g:stats(), g:records(), g:free()), pausing a capture, and the identity of
 * a tensor's storage (the parameter guards). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "autograd_node.h"
#include "lt_internal.h"

#define GRAPH_MT "needle.graph"

typedef struct { nd_graph *g; bool capturing; } graph_box;

static graph_box *check_graph(lua_State *L, const char *op) {
    graph_box *b = luaL_checkudata(L, 1, GRAPH_MT);
    if (!b->g) lt_error(L, op, "the graph was freed");
    return b;
}

static int graph_gc(lua_State *L) {
    graph_box *b = luaL_checkudata(L, 1, GRAPH_MT);
    if (b->g && b->capturing) nd_graph_end(b->g); /* an error unwound the capture */
    nd_graph_free(b->g);
    b->g = NULL;
    return 0;
}

/* The capture's caller's source position for a host check (nd_graph_set_where):
 * the first Lua frame outside needle's own package (the user's line that called
 * cross_entropy, index_select, ...). ud is the Lua state that began the capture,
 * running (or resuming a coroutine) for as long as the capture does. */
static const char *capture_where(void *ud) {
    lua_State *L = ud;
    static _Thread_local char buf[72];
    lua_Debug ar;
    for (int level = 0; level < 40 && lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
        if (ar.source[0] == '@' && strstr(ar.source, "lua/needle/")) continue; /* the package's own */
        snprintf(buf, sizeof buf, "%s:%d", ar.short_src, ar.currentline);
        return buf;
    }
    return NULL;
}

/* core._graph_begin([fallback[, opaque]]) -> a graph that records from now on
 * (opaque: nd.autograd.Functions become opaque nodes, nd_graph_opaque) */
static int l_begin(lua_State *L) {
    bool fallback = lua_toboolean(L, 1), opaque = lua_toboolean(L, 2);
    graph_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->g = NULL;
    b->capturing = false;
    luaL_setmetatable(L, GRAPH_MT);
    LT_CHECK(L, nd_graph_begin(&b->g));
    nd_graph_set_fallback(b->g, fallback);
    nd_graph_set_opaque(b->g, opaque);
    nd_graph_set_where(b->g, capture_where, L);
    b->capturing = true;
    return 1;
}

/* g:finish(): stops recording; a Lua error if the capture saw a graph break */
static int l_finish(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    b->capturing = false;
    LT_CHECK(L, nd_graph_end(b->g));
    return 0;
}

/* ---- opaque nodes (nd_graph_opaque): a replay calls back into Lua ----
 * The Lua function of each node lives in a registry table under the node's
 * id; a freed graph only notes its ids (it may be freed where no Lua state
 * runs) and the next node recorded drops them. The state a replay calls
 * into: the one running g:replay(), else the one running the backward that
 * replays a compiled forward's backward graph (lt_autograd.c). */
static const char OPAQUE_KEY = 'o';
static _Thread_local lua_State *replay_L;
static int64_t opaque_next_id;
static int64_t *dead_ids;
static size_t ndead_ids, capdead_ids;
lua_State *lt_custom_backward_state(void); /* lt_autograd.c */

static void opaque_release(int64_t id) {
    if (ndead_ids == capdead_ids) {
        size_t cap = capdead_ids ? capdead_ids * 2 : 16;
        int64_t *p = realloc(dead_ids, cap * sizeof *p);
        if (!p) return; /* the function stays in the table: a leak, not a crash */
        dead_ids = p;
        capdead_ids = cap;
    }
    dead_ids[ndead_ids++] = id;
}

static void shape_str(const nd_tensor *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s {", nd_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "}");
}

static bool same_shape(const nd_tensor *a, const nd_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static nd_status opaque_run(const char *name, int64_t id, int kind, nd_tensor *const *ins, int nin,
                            nd_tensor *const *outs, int nout) {
    const char *what = kind ? "backward" : "forward";
    lua_State *L = replay_L ? replay_L : lt_custom_backward_state();
    if (!L)
        return nd_fail(ND_ERR_UNSUPPORTED, "compile: autograd.Function '%s': its %s (an opaque node) "
                       "runs Lua, and this replay was not started from Lua", name, what);
    int top = lua_gettop(L);
    if (!lua_checkstack(L, nin + nout + LUA_MINSTACK))
        return nd_fail(ND_ERR_MEMORY, "compile: autograd.Function '%s': no Lua stack", name);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &OPAQUE_KEY);
    if (!lua_istable(L, -1) || lua_rawgeti(L, -1, (lua_Integer)id) != LUA_TFUNCTION) {
        lua_settop(L, top);
        return nd_fail(ND_ERR_INTERNAL, "compile: autograd.Function '%s': its opaque node lost its Lua", name);
    }
    lua_remove(L, -2);
    for (int k = 0; k < nin; k++) {
        nd_tensor *v;
        nd_status st = nd_tensor_view_of(ins[k], ins[k]->shape, ins[k]->strides, ins[k]->ndim, ins[k]->offset, &v);
        if (st != ND_OK) { lua_settop(L, top); return st; }
        lt_push(L, v);
    }
    if (lua_pcall(L, nin, nout, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        nd_status st = nd_fail(ND_ERR_ARG, "%s", msg ? msg : "(error object is not a string)");
        lua_settop(L, top);
        return st;
    }
    nd_status st = ND_OK;
    bool grad = nd_set_grad_enabled(false);
    for (int k = 0; k < nout && st == ND_OK; k++) {
        nd_tensor *res = lt_to(L, top + 1 + k), *o = outs[k];
        char got[64 + 21 * ND_MAX_DIMS], want[64 + 21 * ND_MAX_DIMS], d1[32], d2[32];
        if (!res) {
            st = nd_fail(ND_ERR_ARG, "compile: autograd.Function '%s': its %s returned a %s at a replay "
                         "where the capture had a tensor (result %d)", name, what,
                         luaL_typename(L, top + 1 + k), k + 1);
            break;
        }
        nd_device dr = nd_get_device(res), dw = nd_get_device(o);
        if (res->dtype != o->dtype || !same_shape(res, o) || dr.type != dw.type ||
            dr.index != dw.index) {
            shape_str(res, got, sizeof got);
            shape_str(o, want, sizeof want);
            st = nd_fail(ND_ERR_ARG, "compile: autograd.Function '%s': its %s returned %s on %s at a replay, "
                         "where the capture had %s on %s (result %d): an opaque node's results keep "
                         "the shape, dtype and device they had when captured", name, what, got,
                         nd_device_str(dr, d1), want, nd_device_str(dw, d2), k + 1);
            break;
        }
        st = nd_copy_(o, res);
    }
    nd_set_grad_enabled(grad);
    lua_settop(L, top);
    return st;
}

/* core._graph_opaque_ok() -> whether the capture on this thread records
 * opaque nodes */
static int l_opaque_ok(lua_State *L) {
    lua_pushboolean(L, nd_graph_opaque_ok());
    return 1;
}

/* core._graph_opaque(name, kind, fn, ins, outs) -> outs' (each the tensor
 * the node writes: outs[k] or its copy), or nil and the reason it cannot be
 * one (the caller then breaks the graph). kind: "forward" or "backward";
 * fn(ins...) -> outs... runs at every replay. */
static int l_graph_opaque(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    int kind = strcmp(luaL_checkstring(L, 2), "backward") == 0;
    luaL_checktype(L, 3, LUA_TFUNCTION);
    luaL_checktype(L, 4, LUA_TTABLE);
    luaL_checktype(L, 5, LUA_TTABLE);
    lua_Integer nin = luaL_len(L, 4), nout = luaL_len(L, 5);
    if (nin + nout > 16) {
        lua_pushnil(L);
        lua_pushfstring(L, "autograd.Function '%s': %d tensors in and out, more than an opaque node "
                        "holds (16)", name, (int)(nin + nout));
        return 2;
    }
    nd_tensor *ins[16], *outs[16];
    for (lua_Integer i = 1; i <= nin; i++) {
        lua_rawgeti(L, 4, i);
        ins[i - 1] = lt_check(L, -1, "compile");
        lua_pop(L, 1);
    }
    for (lua_Integer i = 1; i <= nout; i++) {
        lua_rawgeti(L, 5, i);
        outs[i - 1] = lt_check(L, -1, "compile");
        lua_pop(L, 1);
    }
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &OPAQUE_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &OPAQUE_KEY);
    }
    int fns = lua_gettop(L);
    while (ndead_ids) {
        lua_pushnil(L);
        lua_rawseti(L, fns, (lua_Integer)dead_ids[--ndead_ids]);
    }
    int64_t id = ++opaque_next_id;
    lua_pushvalue(L, 3);
    lua_rawseti(L, fns, (lua_Integer)id);
    if (nd_graph_opaque(name, id, kind, ins, (int)nin, outs, (int)nout) != ND_OK) {
        lua_pushnil(L);
        lua_rawseti(L, fns, (lua_Integer)id);
        lua_pushnil(L);
        lua_pushstring(L, nd_last_error());
        return 2;
    }
    lua_createtable(L, (int)nout, 0);
    for (lua_Integer i = 1; i <= nout; i++) {
        lt_push(L, outs[i - 1]);
        lua_rawseti(L, -2, i);
    }
    return 1;
}

static int l_replay(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    lua_State *outer = replay_L;
    replay_L = L;
    nd_status st = nd_graph_replay(b->g);
    replay_L = outer;
    LT_CHECK(L, st);
    return 0;
}

static int l_free(lua_State *L) { return graph_gc(L); }

/* g:pass(name) -> records removed */
static int l_pass(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    int64_t changed = 0;
    LT_CHECK(L, nd_graph_pass(b->g, luaL_checkstring(L, 2), &changed));
    lua_pushinteger(L, changed);
    return 1;
}

/* g:check(): raises naming the first inconsistent record (nd_graph_check) */
static int l_check(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    LT_CHECK(L, nd_graph_check(b->g));
    return 0;
}

static int l_plan(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    LT_CHECK(L, nd_graph_plan(b->g));
    return 0;
}

static int l_stats(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    nd_graph_stat s;
    nd_graph_stats(b->g, &s);
    lua_createtable(L, 0, 6);
    lt_set_int(L, "records", s.records);
    lt_set_int(L, "storages", s.storages);
    lt_set_int(L, "leaves", s.leaves);
    lt_set_int(L, "internal_bytes", s.internal_bytes);
    lt_set_int(L, "restored", s.restored);
    lt_set_int(L, "restored_bytes", s.restored_bytes);
    lt_set_int(L, "planned_bytes", s.planned_bytes);
    lt_set_int(L, "fixed_bytes", s.fixed_bytes);
    lt_set_int(L, "buffers", s.buffers);
    lt_set_int(L, "bound_bytes", s.bound_bytes);
    lt_set_int(L, "captured", s.captured);
    lt_set_int(L, "fused_runs", s.fused_runs);
    lt_set_int(L, "fused_rows", s.fused_rows);
    lt_set_int(L, "fused_registers", s.fused_registers);
    lt_set_int(L, "fused_register_bytes", s.fused_register_bytes);
    lt_set_int(L, "prepared", s.prepared);
    lt_set_int(L, "folded", s.folded);
    lt_set_int(L, "fold_sources", s.fold_sources);
    lt_set_int(L, "refolds", s.refolds);
    return 1;
}

/* g:mark_input(t): t's storage is an argument's copy (never a constant) */
static int l_mark_input(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    nd_graph_mark_input(b->g, lt_check(L, 2, "compile"));
    return 0;
}

/* g:records() -> {{entry, op, detail, device, args = {{storage, key, kind,
 * role, dtype, shape = {...}, strides = {...}, offset}, ...}}, ...} (key:
 * core._storage_key of the memory it uses now); an argument the call passed
 * as NULL is {role = ...} alone. */
static int l_records(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    size_t n = nd_graph_size(b->g);
    lua_createtable(L, n > INT32_MAX ? 0 : (int)n, 0);
    static const char *const roles[] = {"", "r", "w", "rw"};
    for (size_t i = 0; i < n; i++) {
        nd_graph_rec_info info;
        LT_CHECK(L, nd_graph_record(b->g, i, &info));
        lua_createtable(L, 0, 5);
        lt_set_str(L, "entry", info.entry);
        lt_set_str(L, "op", info.op);
        lt_set_str(L, "device", info.device);
        if (info.detail) lt_set_str(L, "detail", info.detail);
        if (info.tune_size) lt_set_int(L, "tune_size", info.tune_size);
        if (info.tune_serial) lt_set_bool(L, "tune_serial", true);
        if (info.gemm_threads || info.gemm_mc || info.gemm_order || info.gemm_split) {
            lua_createtable(L, 0, 4); /* a product's tuned work split: gemm_hint = {threads, mc, order, split} */
            lt_set_int(L, "threads", info.gemm_threads);
            lt_set_int(L, "mc", info.gemm_mc);
            lt_set_int(L, "order", info.gemm_order);
            lt_set_int(L, "split", info.gemm_split);
            lua_setfield(L, -2, "gemm_hint");
        }
        lua_createtable(L, info.ntensors, 0);
        for (int k = 0; k < info.ntensors; k++) {
            lua_createtable(L, 0, 7);
            lt_set_str(L, "role", roles[info.roles[k] & 3]);
            const nd_tensor *t = info.tensors[k];
            if (t) {
                lt_set_int(L, "storage", info.storage[k] + 1);
                lt_set_int(L, "key", (lua_Integer)(uintptr_t)t->storage); /* core._storage_key's */
                char kind[2] = {info.storage_kind[k], 0};
                lt_set_str(L, "kind", kind);
                if (info.outside[k]) lt_set_bool(L, "outside", true);
                lt_set_str(L, "dtype", nd_dtype_name(t->dtype));
                lt_set_int(L, "offset", t->offset);
                lua_createtable(L, t->ndim, 0);
                for (int d = 0; d < t->ndim; d++) {
                    lua_pushinteger(L, t->shape[d]);
                    lua_rawseti(L, -2, d + 1);
                }
                lua_setfield(L, -2, "shape");
                lua_createtable(L, t->ndim, 0);
                for (int d = 0; d < t->ndim; d++) {
                    lua_pushinteger(L, t->strides[d]);
                    lua_rawseti(L, -2, d + 1);
                }
                lua_setfield(L, -2, "strides");
            }
            lua_rawseti(L, -2, k + 1);
        }
        lua_setfield(L, -2, "args");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* g:pending() -> nd_graph_pending_backwards */
static int l_pending(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    lua_pushinteger(L, (lua_Integer)nd_graph_pending_backwards(b->g));
    return 1;
}

/* g:stale() -> nil, or why a tensor the graph uses changed (nd_graph_stale) */
static int l_stale(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    char why[200];
    if (!nd_graph_stale(b->g, why, sizeof why)) return 0;
    lua_pushstring(L, why);
    return 1;
}

/* g:tune(seconds) -> {kernels, gemms, cached, tuned, untimed, seconds, best_speedup} (nd_graph_tune) */
static int l_tune(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    double secs = luaL_checknumber(L, 2);
    nd_graph_tune_stat s;
    LT_CHECK(L, nd_graph_tune(b->g, secs, &s));
    lua_createtable(L, 0, 7);
    lt_set_int(L, "kernels", s.kernels);
    lt_set_int(L, "cached", s.cached);
    lt_set_int(L, "gemms", s.gemms);
    lt_set_int(L, "tuned", s.tuned);
    lt_set_int(L, "untimed", s.untimed);
    lt_set_num(L, "seconds", s.seconds);
    lt_set_num(L, "best_speedup", s.best_speedup);
    return 1;
}

/* g:attach_backward(out, bw, grad_ins, k, leaves, grads): out (output k)
 * gets the node of nd_graph_attach_backward (grads[i] false: no gradient for
 * leaves[i]) */
static nd_tensor **tensor_list(lua_State *L, int idx, int n, nd_tensor **into, bool allow_false) {
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        into[i] = nd_lua_to_tensor(L, -1);
        bool bad = !into[i] && !(allow_false && lua_toboolean(L, -1) == 0);
        lua_pop(L, 1);
        if (bad) return NULL;
    }
    return into;
}

static int l_attach_backward(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    nd_tensor *out = lt_check(L, 2, "compile");
    graph_box *bw = luaL_checkudata(L, 3, GRAPH_MT);
    if (!bw->g) return lt_error(L, "compile", "the backward graph was freed");
    luaL_checktype(L, 4, LUA_TTABLE);
    int k = (int)luaL_checkinteger(L, 5) - 1;
    luaL_checktype(L, 6, LUA_TTABLE);
    luaL_checktype(L, 7, LUA_TTABLE);
    int ng = (int)lua_rawlen(L, 4), n = (int)lua_rawlen(L, 6);
    /* scratch in a userdata: freed with it on any error */
    nd_tensor **buf = lua_newuserdatauv(L, sizeof *buf * (size_t)(ng + 2 * n + 1), 0);
    nd_tensor **gin = buf, **leaves = buf + ng, **grads = leaves + n;
    if (!tensor_list(L, 4, ng, gin, false) || !tensor_list(L, 6, n, leaves, false) ||
        !tensor_list(L, 7, n, grads, true))
        return lt_error(L, "compile", "attach_backward: expected lists of tensors");
    LT_CHECK(L, nd_graph_attach_backward(out, b->g, bw->g, gin, ng, k, n, leaves, grads));
    return 0;
}

/* A set of pointers (open addressing, grown at half full). */
typedef struct { const void **slot; size_t cap, n; } ptr_set;

/* 1: p was new and is in now; 0: it was in; -1: out of memory */
static int ptr_set_add(ptr_set *s, const void *p) {
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        const void **slot = calloc(cap, sizeof *slot);
        if (!slot) return -1;
        for (size_t q = 0; q < s->cap; q++) {
            if (!s->slot[q]) continue;
            size_t h = ((uintptr_t)s->slot[q] >> 4) & (cap - 1);
            while (slot[h]) h = (h + 1) & (cap - 1);
            slot[h] = s->slot[q];
        }
        free(s->slot);
        s->slot = slot;
        s->cap = cap;
    }
    size_t h = ((uintptr_t)p >> 4) & (s->cap - 1);
    for (; s->slot[h]; h = (h + 1) & (s->cap - 1))
        if (s->slot[h] == p) return 0;
    s->slot[h] = p;
    s->n++;
    return 1;
}

/* core._grad_leaves({t, ...}) -> the tensors that require grad and have no
 * grad_fn (parameters) reached through the ts' autograd graphs (or among the
 * ts themselves), each once, in the order a depth-first walk meets them */
static int l_grad_leaves(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    size_t cap = 256, n = 0;
    nd_node **stack = malloc(cap * sizeof *stack);
    ptr_set seen = {0};
    int ok = stack ? 1 : -1, nleaves = 0;
    lua_newtable(L);
    for (lua_Integer i = 1; ok >= 0 && i <= (lua_Integer)lua_rawlen(L, 1); i++) {
        lua_rawgeti(L, 1, i);
        nd_tensor *t = nd_lua_to_tensor(L, -1);
        lua_pop(L, 1);
        if (t && !t->grad_fn && t->requires_grad) { /* a parameter returned as it is */
            if ((ok = ptr_set_add(&seen, t)) > 0) {
                nd_lua_push_tensor(L, t);
                lua_rawseti(L, -2, ++nleaves);
            }
            continue;
        }
        if (!t || !t->grad_fn || (ok = ptr_set_add(&seen, t->grad_fn)) <= 0) continue;
        stack[n++] = t->grad_fn;
        while (ok >= 0 && n) {
            nd_node *node = stack[--n];
            for (int k = node->ninputs - 1; ok >= 0 && k >= 0; k--) {
                nd_node *next = node->next[k];
                nd_tensor *leaf = next ? NULL : node->leaf[k];
                if ((!next && !leaf) || (ok = ptr_set_add(&seen, next ? (void *)next : (void *)leaf)) <= 0)
                    continue;
                if (leaf) {
                    nd_lua_push_tensor(L, leaf);
                    lua_rawseti(L, -2, ++nleaves);
                    continue;
                }
                if (n == cap) {
                    nd_node **ns = realloc(stack, cap * 2 * sizeof *ns);
                    if (!ns) { ok = -1; break; }
                    stack = ns;
                    cap *= 2;
                }
                stack[n++] = next;
            }
        }
    }
    free(stack);
    free(seen.slot);
    if (ok < 0) return lt_error(L, "compile", "out of memory walking the autograd graph");
    return 1;
}

/* core._graph_pause(on) -> whether it was paused: work the capturing code
 * does outside the graph (an optimizer filling the scalars a replay hook
 * refreshes) */
static int l_pause(lua_State *L) {
    lua_pushboolean(L, nd_graph_set_paused(lua_toboolean(L, 1)));
    return 1;
}

/* core._call_no_yield(fn, ...) -> fn(...), where a coroutine.yield inside is
 * an error ("attempt to yield across a C-call boundary"): a capture, whose
 * recording state is per thread, must not be suspended while other Lua code
 * runs ops (they would land in the suspended graph) */
static int l_call_no_yield(lua_State *L) {
    luaL_checkany(L, 1); /* a function or a callable table (a module) */
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* core._host_read(op): the graph break of reading tensor values on the host
 * (nd_graph_check_host_read) under the name the user called (tostring,
 * tolist), before library code reads them through another op */
static int l_host_read(lua_State *L) {
    const char *op = luaL_checkstring(L, 1);
    LT_CHECK(L, nd_graph_check_host_read(op));
    return 0;
}

static int l_capturing(lua_State *L) {
    lua_pushboolean(L, nd_graph_capturing());
    return 1;
}

/* core._storage_key(t) -> an integer naming t's storage (equal for views of
 * one storage, different once t gets other memory through set_data_) */
static int l_storage_key(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "compile");
    lua_pushinteger(L, (lua_Integer)(uintptr_t)t->storage);
    return 1;
}

/* core._storage_version(t) -> its storage's version (bumped by every write) */
static int l_storage_version(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "compile");
    lua_pushinteger(L, (lua_Integer)t->storage->version);
    return 1;
}

/* core._tensor_sig(t) -> "float32 cpu 8,512 g": what nd.compile's signature
 * keeps of a tensor argument (dtype, device, shape, requires_grad), in one
 * call instead of four property reads and a format. */
static int l_tensor_sig(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "compile");
    char buf[64 + 21 * ND_MAX_DIMS], dev[32];
    int n = snprintf(buf, sizeof buf, "%s %s ", nd_dtype_name(t->dtype),
                     nd_device_str(nd_get_device(t), dev));
    for (int d = 0; d < t->ndim && n < (int)sizeof buf; d++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    if (t->requires_grad && n < (int)sizeof buf) n += snprintf(buf + n, sizeof buf - (size_t)n, " g");
    lua_pushlstring(L, buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
    return 1;
}

/* core._meta_generation() -> nd_meta_generation (tensor.h) */
static int l_meta_generation(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)nd_meta_generation());
    return 1;
}

void lt_register_graph(lua_State *L) {
    if (luaL_newmetatable(L, GRAPH_MT)) {
        static const lt_reg methods[] = {
            {"finish", l_finish, false, true, 1, "g"},
            {"replay", l_replay, false, true, 1, "g"},
            {"stats", l_stats, false, true, 1, "g"},
            {"records", l_records, false, true, 1, "g"},
            {"free", l_free, false, true, 1, "g"},
            {"plan", l_plan, false, true, 1, "g"},
            {"pass", l_pass, false, true, 2, "g, name"},
            {"check", l_check, false, true, 1, "g"},
            {"attach_backward", l_attach_backward, false, true, 7, "g, out, bw, grad_ins, k, leaves, grads"},
            {"tune", l_tune, false, true, 2, "g, seconds"},
            {"pending", l_pending, false, true, 1, "g"},
            {"stale", l_stale, false, true, 1, "g"},
            {"mark_input", l_mark_input, false, true, 2, "g, t"},
            {NULL, NULL, false, false},
        };
        lua_newtable(L);
        lt_register(L, -1, -1, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, graph_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    nd_graph_set_opaque_hooks(opaque_run, opaque_release);
    static const lt_reg regs[] = {
        {"_graph_begin", l_begin, false, true, 2, "[fallback, opaque]"},
        {"_graph_opaque", l_graph_opaque, false, true, 5, "name, kind, fn, ins, outs"},
        {"_graph_opaque_ok", l_opaque_ok, false, true, 0, ""},
        {"_graph_pause", l_pause, false, true, 1, "on"},
        {"_graph_capturing", l_capturing, false, true, 0, ""},
        {"_call_no_yield", l_call_no_yield, false, true, LT_VARARGS, "fn, ..."},
        {"_host_read", l_host_read, false, true, 1, "op"},
        {"_storage_key", l_storage_key, false, true, 1, "t"},
        {"_storage_version", l_storage_version, false, true, 1, "t"},
        {"_meta_generation", l_meta_generation, false, true, 0, ""},
        {"_tensor_sig", l_tensor_sig, false, true, 1, "t"},
        {"_grad_leaves", l_grad_leaves, false, true, 1, "outputs"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
