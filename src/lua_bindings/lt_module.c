#define _POSIX_C_SOURCE 200809L /* clock_gettime */
/* lt_module.c - the Lua entry points: luaopen_needle_core (the C bindings,
 * the "needle.core" module) and luaopen_needle (the whole package from the
 * Lua sources embedded in the library, for C hosts). */
#include <string.h>
#include <time.h>
#include "embedded_lua.h"
#include "lt_internal.h"

void lt_push_metatable(lua_State *L);

static int l_live_bytes(lua_State *L) { lua_pushinteger(L, nd_live_bytes()); return 1; }
static int l_peak_live_bytes(lua_State *L) { lua_pushinteger(L, nd_peak_live_bytes()); return 1; }
static int l_reset_peak(lua_State *L) { (void)L; nd_reset_peak_live_bytes(); return 0; }
static int l_cached_bytes(lua_State *L) { lua_pushinteger(L, nd_cached_bytes()); return 1; }
static int l_empty_cache(lua_State *L) { (void)L; nd_empty_cache(); return 0; }

/* Monotonic wall-clock seconds, for benchmarks and the profiler (os.clock
 * is CPU time summed over threads, wrong for parallel kernels). */
static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    return 1;
}

int luaopen_needle_core(lua_State *L) {
    lua_newtable(L); /* methods */
    lua_newtable(L); /* module */
    lt_register_tensor(L); /* creates the metatable: must come first */
    lt_register_construct(L);
    lt_register_math(L);
    lt_register_shape(L);
    lt_register_index(L);
    lt_register_autograd(L);
    lt_register_nn(L);
    lt_register_io(L);
    lt_register_torch(L);
    lt_register_device(L);
    lt_register_opencl_tune(L);
    lt_register_profile(L);
    lt_register_optim(L);
    lt_register_graph(L);
    lt_register_dist(L);
    lt_register_linalg(L);
    lt_register_workers(L);
    static const lt_reg regs[] = {
        {"live_bytes", l_live_bytes, false, true, 0, ""},
        {"peak_live_bytes", l_peak_live_bytes, false, true, 0, ""},
        {"reset_peak_live_bytes", l_reset_peak, false, true, 0, ""},
        {"cached_bytes", l_cached_bytes, false, true, 0, ""},
        {"empty_cache", l_empty_cache, false, true, 0, ""},
        {"clock", l_clock, false, true, 0, ""},
        {"_set_library_root", lt_set_library_root, false, true, 1, "prefix"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "_methods");
    lt_push_metatable(L);
    lua_setfield(L, -2, "_metatable");
    lua_pushstring(L, nd_version());
    lua_setfield(L, -2, "_VERSION");
#ifdef NEEDLE_SANITIZE_BUILD
    lua_pushboolean(L, 1);
#else
    lua_pushboolean(L, 0);
#endif
    lua_setfield(L, -2, "_SANITIZE"); /* built with ASan/UBSan: RSS is not meaningful */
    lua_remove(L, -2);
    return 1;
}

/* package.searchers entry that finds needle.* modules in the embedded
 * sources, placed after the preload searcher. */
static int embedded_searcher(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    for (const struct nd_embedded_lua *e = nd_embedded_lua; e->name; e++) {
        if (strcmp(e->name, name) != 0) continue;
        lua_pushfstring(L, "=[needle embedded] %s", name);
        if (luaL_loadbufferx(L, e->source, e->len, lua_tostring(L, -1), "t") != LUA_OK)
            return lua_error(L);
        lua_pushstring(L, ":embedded:");
        return 2;
    }
    lua_pushfstring(L, "no embedded module '%s'", name);
    return 1;
}

int luaopen_needle(lua_State *L) {
    luaL_checkversion(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_needle_core);
    lua_setfield(L, -2, "needle.core");
    lua_pop(L, 1);
    /* searchers[2] (after preload): the embedded sources win over files on
     * package.path, so a host always gets the library's own Lua half. */
    if (lua_getglobal(L, "package") == LUA_TTABLE &&
        lua_getfield(L, -1, "searchers") == LUA_TTABLE) {
        lua_Integer n = luaL_len(L, -1);
        for (lua_Integer i = n; i >= 2; i--) {
            lua_geti(L, -1, i);
            lua_seti(L, -2, i + 1);
        }
        lua_pushcfunction(L, embedded_searcher);
        lua_seti(L, -2, 2);
        lua_pop(L, 2);
    } else {
        return luaL_error(L, "needle: luaopen_needle needs the package library (luaL_openlibs)");
    }
    lua_getglobal(L, "require");
    lua_pushstring(L, "needle");
    lua_call(L, 1, 1);
    return 1;
}
