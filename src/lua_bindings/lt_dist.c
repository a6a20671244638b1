/* lt_dist.c - the C half of nd.distributed (lua/needle/distributed): the
 * world (core.dist_init, core.dist_info, ...) and the collectives, which
 * block or, with async, return a work userdata:
 *
 *   core.dist_all_reduce(t, op, check, async[, channel]) -> [work]
 *   core.dist_broadcast(t, root, check, async)     -> [work]
 *   core.dist_all_gather(t, check, async)          -> tensor | work
 *   core.dist_reduce_scatter(t, op, check, async)  -> tensor | work
 *   work:wait() -> the result tensor (gather, scatter) or nothing
 *   work:is_completed() -> bool (also drives MPI's progress)
 *
 * op is "sum", "mean", "max" or "min"; ranks are 0-based, as MPI's. */
#include <string.h>
#include "lt_internal.h"

#define WORK_MT "needle.dist_work"

typedef struct { nd_dist_work *w; const char *what; } work_box;

static const char *const OPS[] = {"sum", "mean", "max", "min", NULL};

static nd_dist_op check_op(lua_State *L, int idx, const char *what) {
    const char *name = luaL_optstring(L, idx, "sum");
    for (int i = 0; OPS[i]; i++)
        if (strcmp(name, OPS[i]) == 0) return (nd_dist_op)i;
    lt_error(L, what, "unknown op '%s' (valid: sum, mean, max, min)", name);
    return ND_DIST_SUM;
}

static int work_gc(lua_State *L) {
    work_box *b = luaL_checkudata(L, 1, WORK_MT);
    nd_dist_free(b->w);
    b->w = NULL;
    return 0;
}

static work_box *check_work(lua_State *L, const char *op) {
    work_box *b = luaL_checkudata(L, 1, WORK_MT);
    if (!b->w) lt_error(L, op, "this handle was already waited for");
    return b;
}

/* pushes the work (async) or waits for it and pushes the result, if any */
static int deliver(lua_State *L, const char *what, nd_dist_work *w) {
    work_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->w = w;
    b->what = what;
    luaL_setmetatable(L, WORK_MT);
    return 1;
}

static int w_wait(lua_State *L) {
    work_box *b = check_work(L, "distributed.wait");
    nd_status st = nd_dist_wait(b->w);
    nd_tensor *out = st == ND_OK ? nd_dist_result(b->w) : NULL;
    nd_dist_free(b->w);
    b->w = NULL;
    if (st != ND_OK) return lt_raise(L);
    if (!out) return 0;
    lt_push(L, out);
    return 1;
}

static int w_is_completed(lua_State *L) {
    work_box *b = luaL_checkudata(L, 1, WORK_MT);
    if (!b->w) {
        lua_pushboolean(L, 1);
        return 1;
    }
    nd_status st;
    bool done = nd_dist_test(b->w, &st);
    if (st != ND_OK) return lt_raise(L);
    lua_pushboolean(L, done);
    return 1;
}

static int l_init(lua_State *L) {
    LT_CHECK(L, nd_dist_init(luaL_checknumber(L, 1)));
    return 0;
}

static int l_info(lua_State *L) {
    lua_createtable(L, 0, 10);
    lt_set_bool(L, "available", nd_dist_available());
    lt_set_bool(L, "launched", nd_dist_launched());
    lt_set_bool(L, "initialized", nd_dist_initialized());
    lt_set_bool(L, "finalized", nd_dist_finalized());
    lt_set_int(L, "rank", nd_dist_rank());
    lt_set_int(L, "world_size", nd_dist_world_size());
    lt_set_int(L, "local_rank", nd_dist_local_rank());
    lt_set_int(L, "local_size", nd_dist_local_size());
    lt_set_num(L, "timeout", nd_dist_timeout());
    return 1;
}

static int l_set_timeout(lua_State *L) {
    nd_dist_set_timeout(luaL_checknumber(L, 1));
    return 0;
}

static int l_all_reduce(lua_State *L) {
    const char *what = "distributed.all_reduce";
    nd_tensor *t = lt_check(L, 1, what);
    nd_dist_op op = check_op(L, 2, what);
    bool check = lua_toboolean(L, 3), async = lua_toboolean(L, 4);
    int channel = (int)luaL_optinteger(L, 5, 0);
    nd_dist_work *w = NULL;
    LT_CHECK(L, nd_dist_all_reduce_on(t, op, check, channel, async ? &w : NULL));
    return async ? deliver(L, what, w) : 0;
}

static int l_broadcast(lua_State *L) {
    const char *what = "distributed.broadcast";
    nd_tensor *t = lt_check(L, 1, what);
    lua_Integer root = luaL_checkinteger(L, 2);
    if (nd_dist_initialized() && (root < 0 || root >= nd_dist_world_size()))
        return lt_error(L, what, "root rank %lld out of range (ranks are 0..%d)", (long long)root,
                        nd_dist_world_size() - 1);
    if (root < INT32_MIN || root > INT32_MAX) root = -1; /* out of range either way */
    bool check = lua_toboolean(L, 3), async = lua_toboolean(L, 4);
    nd_dist_work *w = NULL;
    LT_CHECK(L, nd_dist_broadcast(t, (int)root, check, async ? &w : NULL));
    return async ? deliver(L, what, w) : 0;
}

static int l_all_gather(lua_State *L) {
    const char *what = "distributed.all_gather";
    nd_tensor *t = lt_check(L, 1, what);
    bool check = lua_toboolean(L, 2), async = lua_toboolean(L, 3);
    nd_dist_work *w = NULL;
    nd_tensor *out = NULL;
    LT_CHECK(L, nd_dist_all_gather(t, check, &out, async ? &w : NULL));
    if (async) return deliver(L, what, w);
    lt_push(L, out);
    return 1;
}

static int l_reduce_scatter(lua_State *L) {
    const char *what = "distributed.reduce_scatter";
    nd_tensor *t = lt_check(L, 1, what);
    nd_dist_op op = check_op(L, 2, what);
    bool check = lua_toboolean(L, 3), async = lua_toboolean(L, 4);
    nd_dist_work *w = NULL;
    nd_tensor *out = NULL;
    LT_CHECK(L, nd_dist_reduce_scatter(t, op, check, &out, async ? &w : NULL));
    if (async) return deliver(L, what, w);
    lt_push(L, out);
    return 1;
}

static int l_barrier(lua_State *L) {
    LT_CHECK(L, nd_dist_barrier());
    return 0;
}

static int l_finalize(lua_State *L) {
    LT_CHECK(L, nd_dist_finalize());
    return 0;
}

static int l_abort(lua_State *L) {
    int code = (int)luaL_optinteger(L, 1, 1);
    nd_dist_abort(code);
    return 0; /* without a launched job: nothing to end */
}

void lt_register_dist(lua_State *L) {
    if (luaL_newmetatable(L, WORK_MT)) {
        static const lt_reg methods[] = {
            {"wait", w_wait, false, true, 1, "work"},
            {"is_completed", w_is_completed, false, true, 1, "work"},
            {NULL, NULL, false, false}};
        lua_newtable(L);
        lt_register(L, -1, -1, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, work_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    static const lt_reg regs[] = {
        {"dist_init", l_init, false, true, 1, "timeout"},
        {"dist_info", l_info, false, true, 0, ""},
        {"dist_set_timeout", l_set_timeout, false, true, 1, "seconds"},
        {"dist_all_reduce", l_all_reduce, false, true, 5, "t, op[, check, async, channel]"},
        {"dist_broadcast", l_broadcast, false, true, 4, "t, root[, check, async]"},
        {"dist_all_gather", l_all_gather, false, true, 3, "t[, check, async]"},
        {"dist_reduce_scatter", l_reduce_scatter, false, true, 4, "t, op[, check, async]"},
        {"dist_barrier", l_barrier, false, true, 0, ""},
        {"dist_finalize", l_finalize, false, true, 0, ""},
        {"dist_abort", l_abort, false, true, 1, "[code]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
