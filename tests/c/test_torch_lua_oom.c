/* test_torch_lua_oom.c - nd.load_torch (src/lua_bindings/lt_torch.c) when
 * Lua runs out of memory part-way through turning a checkpoint into Lua
 * values: for every allocation the conversion makes, a state whose
 * allocator fails from that allocation on must raise a Lua error (never
 * crash) and, once closed, give back every tensor byte: the loaded file
 * (its holder userdata), the tensors already pushed and the one being
 * pushed when the allocation failed (a retained reference that lt_push's
 * userdata never took). Run it in the ASan build too.
 *
 * Exit status 0 when every check passes; the last line counts them. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "needle.h"
#include "check.h"

static bool armed;
static long budget; /* allocations left while armed */

static void *falloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    /* fail growth only: Lua may not fail a shrink */
    if (armed && (ptr == NULL || nsize > osize) && budget-- <= 0) return NULL;
    return realloc(ptr, nsize);
}

static lua_State *new_state(void) {
    lua_State *L = lua_newstate(falloc, NULL);
    if (!L) return NULL;
    luaL_openlibs(L);
    luaL_requiref(L, "needle", luaopen_needle, 1);
    lua_pop(L, 1);
    return L;
}

/* Loads path with the first `allow` allocations granted; returns whether
 * the load succeeded. Checks that closing the state frees every tensor. */
static bool load_with_budget(const char *path, long allow, int64_t base) {
    lua_State *L = new_state();
    if (!L) { FAIL("no Lua state"); return true; }
    lua_getglobal(L, "needle");
    lua_getfield(L, -1, "load_torch");
    lua_remove(L, -2);
    lua_pushstring(L, path);
    budget = allow;
    armed = true;
    int r = lua_pcall(L, 1, 1, 0);
    armed = false;
    bool ok = r == LUA_OK;
    if (!ok) {
        checks++;
        const char *m = lua_tostring(L, -1);
        /* a memory error, or needle's own error for the allocation that failed */
        if (r != LUA_ERRMEM && !(m && (strstr(m, "memory") || strstr(m, "stack"))))
            FAIL("budget %ld: unexpected error (%d): %s", allow, r, m ? m : "(not a string)");
    }
    lua_close(L);
    checks++;
    if (nd_live_bytes() != base)
        FAIL("budget %ld: %lld tensor bytes still live after lua_close (%s)", allow,
             (long long)(nd_live_bytes() - base), ok ? "loaded" : "failed");
    return ok;
}

int main(void) {
    /* views of one storage, a 0-dim and an empty tensor, a bare storage,
     * nested containers: every kind of push the converter makes */
    const char *files[] = {"spec/fixtures/load_torch/lt_views.pt", "spec/fixtures/load_torch/lt_storage.pt",
                           "spec/fixtures/load_torch/lt_values.pt", "spec/fixtures/torch_ckpt/mlp.pt"};
    int64_t base = nd_live_bytes();
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        long allow = 0;
        while (!load_with_budget(files[f], allow, base)) {
            if (++allow > 200000) {
                FAIL("%s: never loaded", files[f]);
                break;
            }
        }
        printf("%s: loads with %ld allocations\n", files[f], allow);
    }
    if (failures) printf("%d of %d checks failed\n", failures, checks);
    else printf("%d checks passed\n", checks);
    return failures ? 1 : 0;
}
