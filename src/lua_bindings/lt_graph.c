/* lt_graph.c - the C half of nd.compile (lua/needle/compile): a captured
 * graph as a userdata (core._graph_begin() -> g; g:finish(), g:replay(),
 * g:stats(), g:records(), g:free()), pausing a capture, and the identity of
 * a tensor's storage (the parameter guards). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* core._graph_begin([fallback]) -> a graph that records from now on */
static int l_begin(lua_State *L) {
    bool fallback = lua_toboolean(L, 1);
    graph_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->g = NULL;
    b->capturing = false;
    luaL_setmetatable(L, GRAPH_MT);
    LT_CHECK(L, nd_graph_begin(&b->g));
    nd_graph_set_fallback(b->g, fallback);
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

static int l_replay(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    LT_CHECK(L, nd_graph_replay(b->g));
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

/* g:tune(seconds) -> {kernels, cached, tuned, seconds, best_speedup} (nd_graph_tune) */
static int l_tune(lua_State *L) {
    graph_box *b = check_graph(L, "compile");
    double secs = luaL_checknumber(L, 2);
    nd_graph_tune_stat s;
    LT_CHECK(L, nd_graph_tune(b->g, secs, &s));
    lua_createtable(L, 0, 5);
    lt_set_int(L, "kernels", s.kernels);
    lt_set_int(L, "cached", s.cached);
    lt_set_int(L, "tuned", s.tuned);
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
        static const luaL_Reg methods[] = {
            {"finish", l_finish}, {"replay", l_replay}, {"stats", l_stats},
            {"records", l_records}, {"free", l_free}, {"plan", l_plan}, {"pass", l_pass}, {"check", l_check},
            {"attach_backward", l_attach_backward}, {"tune", l_tune}, {"pending", l_pending},
            {"mark_input", l_mark_input}, {NULL, NULL},
        };
        lua_newtable(L);
        luaL_setfuncs(L, methods, 0);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, graph_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    static const lt_reg regs[] = {
        {"_graph_begin", l_begin, false, true},
        {"_graph_pause", l_pause, false, true},
        {"_graph_capturing", l_capturing, false, true},
        {"_storage_key", l_storage_key, false, true},
        {"_storage_version", l_storage_version, false, true},
        {"_meta_generation", l_meta_generation, false, true},
        {"_tensor_sig", l_tensor_sig, false, true},
        {"_grad_leaves", l_grad_leaves, false, true},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
