/* lt_options.c - options tables (PyTorch's keyword arguments) for every C
 * function of the bindings: one check, so that a misspelt key is an error
 * naming the valid ones everywhere instead of being silently ignored
 * (nd.tensor(t, {dtyp = "float64"}) would give float32). The Lua half of the
 * package has the same rule in lua/needle/options.lua. */
#include <stdlib.h>
#include <string.h>
#include "lt_internal.h"

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "a, b, c": the valid keys sorted, so that the message does not depend on
 * the order a binding happens to list them in. */
static void valid_list(const char *const *valid, char *buf, size_t size) {
    const char *names[64];
    size_t n = 0;
    for (const char *const *v = valid; *v && n < sizeof names / sizeof *names; v++) names[n++] = *v;
    qsort(names, n, sizeof *names, cmp_names);
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i) strncat(buf, ", ", size - strlen(buf) - 1);
        strncat(buf, names[i], size - strlen(buf) - 1);
    }
}

static bool is_valid(const char *k, const char *const *valid) {
    for (const char *const *v = valid; *v; v++)
        if (strcmp(k, *v) == 0) return true;
    return false;
}

/* Pushes the key to report, when there is an unknown one: a non-string key
 * (a list entry where a name belongs) first, else the smallest name, so that
 * the error names the same key in every run whatever lua_next's order. */
static bool first_unknown(lua_State *L, int idx, const char *const *valid) {
    lua_pushnil(L); /* the key found so far */
    int best = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        bool str = lua_type(L, -1) == LUA_TSTRING;
        if (str && is_valid(lua_tostring(L, -1), valid)) continue;
        bool take = lua_isnil(L, best) ||
                    (str && lua_type(L, best) == LUA_TSTRING &&
                     strcmp(lua_tostring(L, -1), lua_tostring(L, best)) < 0) ||
                    (!str && lua_type(L, best) == LUA_TSTRING);
        if (take) {
            lua_pushvalue(L, -1);
            lua_replace(L, best);
        }
    }
    if (!lua_isnil(L, best)) return true;
    lua_pop(L, 1);
    return false;
}

int lt_options(lua_State *L, int idx, const char *op, const char *const *valid) {
    if (lua_isnoneornil(L, idx)) return 0;
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx) || lt_to(L, idx))
        lt_error(L, op, "expected an options table as argument %d, got %s", idx, luaL_typename(L, idx));
    if (first_unknown(L, idx, valid)) {
        char list[512];
        valid_list(valid, list, sizeof list);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (!k) k = lua_pushfstring(L, "[%s]", luaL_tolstring(L, -1, NULL));
        else k = lua_pushfstring(L, "'%s'", k);
        lt_error(L, op, "unknown option %s (%s%s)", k, list[0] ? "valid: " : "it takes no options", list);
    }
    return idx;
}

bool lt_opt_bool(lua_State *L, int opts, const char *op, const char *field, bool def) {
    if (!opts) return def;
    int t = lua_getfield(L, opts, field);
    bool v = def;
    if (t == LUA_TBOOLEAN) v = lua_toboolean(L, -1);
    else if (t != LUA_TNIL)
        lt_error(L, op, "option '%s' must be a boolean, got %s", field, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}
