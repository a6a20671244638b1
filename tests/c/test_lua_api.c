/* test_lua_api.c - the Lua half of the embedding API (needle.h):
 * luaopen_needle through luaL_requiref with no files on disk, tensors
 * crossing between C and Lua (nd_lua_push_tensor / nd_lua_to_tensor) and
 * sharing memory, needle's Lua errors coming back through lua_pcall, and
 * lua_close giving every tensor (and a borrowed buffer) back.
 *
 * Exit status 0 when every check passes; each failure is printed as
 * file:line. The last line is "N checks passed" (or "F of N checks failed"). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>
#include "needle.h"
#include "check.h"

/* Runs a chunk that must succeed, leaving nres results on the stack. */
#define RUN(L, code, nres) do { checks++; if (!run_chunk(L, code, nres)) { \
        FAIL("chunk failed: %s\n    %s", code, lua_tostring(L, -1)); lua_pop(L, 1); return; } } while (0)

static int run_chunk(lua_State *L, const char *code, int nres) {
    if (luaL_loadbuffer(L, code, strlen(code), "=chunk") != LUA_OK) return 0;
    return lua_pcall(L, 0, nres, 0) == LUA_OK;
}

static lua_State *new_state(void) {
    lua_State *L = luaL_newstate();
    if (!L) return NULL;
    luaL_openlibs(L);
    /* nothing on disk: the package must come from the library itself */
    lua_getglobal(L, "package");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    luaL_requiref(L, "needle", luaopen_needle, 1); /* also sets the global `needle` */
    lua_pop(L, 1);
    return L;
}

static int release_calls = 0;
static void on_release(void *ctx) { (void)ctx; release_calls++; }

static void test_open(lua_State *L) {
    CHECK(lua_getglobal(L, "needle") == LUA_TTABLE);
    CHECK(lua_getfield(L, -1, "matmul") == LUA_TFUNCTION);
    lua_pop(L, 1);
    /* require returns the same table */
    RUN(L, "return require 'needle'", 1);
    CHECK(lua_rawequal(L, -1, -2));
    lua_pop(L, 2);
    RUN(L, "local nd = require 'needle'; return nd.version, #nd.dtypes", 2);
    CHECK(lua_isstring(L, -2) && strcmp(lua_tostring(L, -2), nd_version()) == 0);
    CHECK(lua_tointeger(L, -1) == ND_NUM_DTYPES);
    lua_pop(L, 2);
    CHECK(lua_gettop(L) == 0);
}

/* A C tensor modified in place by Lua; a Lua result read back in C. */
static void test_cross(lua_State *L) {
    nd_tensor *x = NULL;
    OK(nd_from_buffer((const float[]){1, 2, 3, 4, 5, 6}, (const int64_t[]){2, 3}, 2, ND_FLOAT32, &x));
    nd_lua_push_tensor(L, x);
    CHECK(nd_lua_to_tensor(L, -1) == x); /* the same tensor, not a copy */
    lua_setglobal(L, "x");
    RUN(L, "x:mul_(2); x[1][2] = -1", 0); /* Lua indices are 1-based */
    const float *p = nd_data(x);
    CHECK(p[0] == 2 && p[1] == -1 && p[2] == 6 && p[5] == 12);
    /* C writes are seen by Lua */
    ((float *)nd_data(x))[5] = 100;
    RUN(L, "return x[2][3]:item(), x:sum():item()", 2);
    CHECK(lua_tonumber(L, -2) == 100);
    CHECK(lua_tonumber(L, -1) == 2 - 1 + 6 + 8 + 10 + 100);
    lua_pop(L, 2);

    /* a new tensor made in Lua, kept by C after Lua lets it go */
    RUN(L, "local nd = require 'needle'; return (x:t() + nd.tensor({10, 20})):relu()", 1);
    nd_tensor *y = nd_lua_to_tensor(L, -1);
    CHECK(y != NULL);
    if (y) {
        nd_retain(y);
        lua_pop(L, 1);
        lua_gc(L, LUA_GCCOLLECT);
        CHECK(nd_ndim(y) == 2 && nd_shape(y)[0] == 3 && nd_shape(y)[1] == 2);
        float out[6];
        OK(nd_copy_to_buffer(y, out, sizeof out));
        /* x^T = {{2,8},{-1,10},{6,100}} + {10,20} */
        CHECK(out[0] == 12 && out[1] == 28 && out[2] == 9 && out[3] == 30 && out[4] == 16 &&
              out[5] == 120);
        nd_release(y);
    }

    /* the C reference and the Lua one are independent */
    nd_release(x);
    RUN(L, "return x:numel()", 1);
    CHECK(lua_tointeger(L, -1) == 6);
    lua_pop(L, 1);
    lua_pushnil(L);
    lua_setglobal(L, "x");
    CHECK(lua_gettop(L) == 0);
}

static void test_not_tensors(lua_State *L) {
    int top = lua_gettop(L);
    lua_pushnil(L);
    lua_pushinteger(L, 3);
    lua_pushstring(L, "tensor");
    lua_newtable(L);
    lua_pushlightuserdata(L, &checks);
    lua_newuserdatauv(L, 64, 0); /* a full userdata without needle's metatable */
    lua_getglobal(L, "io");
    lua_getfield(L, -1, "stdout"); /* a userdata with another metatable */
    lua_remove(L, -2);
    RUN(L, "return require('needle').zeros(2)", 1);
    int n = lua_gettop(L) - top;
    for (int i = 1; i < n; i++)
        CHECKM(nd_lua_to_tensor(L, top + i) == NULL, "nd_lua_to_tensor accepted a %s",
               luaL_typename(L, top + i));
    CHECK(nd_lua_to_tensor(L, -1) != NULL);
    CHECK(nd_lua_to_tensor(L, top + n + 5) == NULL); /* an empty (acceptable) index */
    lua_settop(L, top);
}

/* needle's errors are Lua errors: "needle.<op>: <message>" */
static void test_errors(lua_State *L) {
    /* called from C: no Lua frame to name, the message starts with the op */
    nd_tensor *a = NULL, *b = NULL;
    OK(nd_zeros((const int64_t[]){2, 3}, 2, ND_FLOAT32, &a));
    OK(nd_zeros((const int64_t[]){4, 5}, 2, ND_FLOAT32, &b));
    lua_getglobal(L, "needle");
    lua_getfield(L, -1, "matmul");
    lua_remove(L, -2);
    nd_lua_push_tensor(L, a);
    nd_lua_push_tensor(L, b);
    nd_release(a);
    nd_release(b);
    checks++;
    if (lua_pcall(L, 2, 1, 0) != LUA_ERRRUN) FAIL("needle.matmul with mismatched shapes did not fail");
    const char *msg = lua_tostring(L, -1);
    CHECKM(msg && strncmp(msg, "needle.matmul", 13) == 0, "message: %s", msg ? msg : "(not a string)");
    CHECKM(msg && strstr(msg, "needle.matmul: shapes {2,3} and {4,5} do not match"), "message: %s",
           msg ? msg : "(not a string)");
    lua_pop(L, 1);

    /* from a chunk: the position of the call comes first */
    const char *code = "local nd = require 'needle'\n"
                       "local a, b = nd.zeros(2, 3), nd.zeros(4, 5)\n"
                       "return a:matmul(b)\n";
    checks++;
    if (run_chunk(L, code, 1)) FAIL("a:matmul(b) with mismatched shapes did not fail");
    msg = lua_tostring(L, -1);
    CHECKM(msg && strncmp(msg, "chunk:3: needle.matmul: shapes {2,3} and {4,5}", 46) == 0,
           "message: %s", msg ? msg : "(not a string)");
    lua_pop(L, 1);

    /* an error inside a protected call in Lua: pcall returns it as a value */
    RUN(L, "local nd = require 'needle'\n"
           "local ok, err = pcall(function() return nd.zeros(2, 3):sum(3) end)\n"
           "return ok, err", 2);
    CHECK(lua_toboolean(L, -2) == 0);
    msg = lua_tostring(L, -1);
    CHECKM(msg && strstr(msg, "needle.sum") && strstr(msg, "dim 3"), "message: %s", msg ? msg : "");
    lua_pop(L, 2);
    CHECK(lua_gettop(L) == 0);
}

/* Many states at once, more than the tensor type check's fast table holds
 * (16), opened and closed in turn: every state must still accept its own
 * tensors (fast or registry comparison) and refuse other userdata. */
#define MANY_STATES 20
static void check_state_works(lua_State *L, int i) {
    checks++;
    if (!run_chunk(L, "local nd = require 'needle'\n"
                      "local x = nd.ones(3) + nd.ones(3)\n"
                      "return (x * 2):sum():item()", 1)) {
        FAIL("state %d: %s", i, lua_tostring(L, -1));
        lua_pop(L, 1);
        return;
    }
    CHECKM(lua_tonumber(L, -1) == 12, "state %d: sum %g", i, lua_tonumber(L, -1));
    lua_pop(L, 1);
    nd_tensor *t = NULL;
    OK(nd_zeros((const int64_t[]){2}, 1, ND_FLOAT32, &t));
    nd_lua_push_tensor(L, t);
    nd_release(t);
    CHECKM(nd_lua_to_tensor(L, -1) == t, "state %d: its own tensor refused", i);
    /* a userdata of the box's size with another metatable is no tensor */
    void **fake = lua_newuserdatauv(L, sizeof(void *), 0);
    *fake = t;
    lua_newtable(L);
    lua_setmetatable(L, -2);
    CHECKM(nd_lua_to_tensor(L, -1) == NULL, "state %d: a foreign userdata accepted", i);
    lua_pop(L, 2);
}

static void test_many_states(int64_t live0) {
    lua_State *Ls[MANY_STATES];
    for (int i = 0; i < MANY_STATES; i++) {
        Ls[i] = new_state();
        CHECK(Ls[i] != NULL);
        if (!Ls[i]) return;
    }
    for (int i = 0; i < MANY_STATES; i++) check_state_works(Ls[i], i);
    /* close every other one and open new ones in their place */
    for (int i = 0; i < MANY_STATES; i += 2) {
        lua_close(Ls[i]);
        Ls[i] = new_state();
        CHECK(Ls[i] != NULL);
        if (!Ls[i]) return;
    }
    for (int i = 0; i < MANY_STATES; i++) check_state_works(Ls[i], i);
    for (int i = 0; i < MANY_STATES; i++) lua_close(Ls[i]);
    CHECKM(nd_live_bytes() == live0, "live bytes %lld after closing %d states, %lld before",
           (long long)nd_live_bytes(), MANY_STATES, (long long)live0);
}

/* Borrowed host memory used from Lua: views made in Lua keep it alive, and
 * lua_close gives it back exactly once. */
static void test_borrowed_lifetime(int64_t live0) {
    static float buf[4] = {1, 2, 3, 4};
    release_calls = 0;
    lua_State *L = new_state();
    CHECK(L != NULL);
    if (!L) return;
    nd_tensor *t = NULL;
    OK(nd_from_borrowed(buf, (const int64_t[]){2, 2}, 2, ND_FLOAT32, on_release, NULL, &t));
    nd_lua_push_tensor(L, t);
    lua_setglobal(L, "b");
    nd_release(t); /* Lua holds the only reference now */
    RUN(L, "V = b:t(); W = b:view(4):narrow(1, 2, 2); b = nil; collectgarbage()", 0);
    CHECK(release_calls == 0);
    RUN(L, "W:add_(10); return V:contiguous()", 1);
    CHECK(buf[1] == 12 && buf[2] == 13);
    nd_tensor *c = nd_lua_to_tensor(L, -1);
    CHECK(c && nd_data(c) != (void *)buf); /* V is transposed: contiguous() copies */
    lua_pop(L, 1);
    CHECK(nd_live_bytes() > live0);
    lua_close(L);
    CHECKM(release_calls == 1, "release callback called %d times", release_calls);
    CHECKM(nd_live_bytes() == live0, "live bytes %lld after lua_close, %lld before the state opened",
           (long long)nd_live_bytes(), (long long)live0);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int64_t live0 = nd_live_bytes();
    lua_State *L = new_state();
    if (!L) { printf("cannot create a lua_State\n"); return 1; }
    test_open(L);
    test_cross(L);
    test_not_tensors(L);
    test_errors(L);
    lua_close(L);
    CHECKM(nd_live_bytes() == live0, "live bytes %lld after lua_close, %lld at start",
           (long long)nd_live_bytes(), (long long)live0);
    test_borrowed_lifetime(live0);
    test_many_states(live0);
    nd_empty_cache();
    if (failures) printf("%d of %d checks failed\n", failures, checks);
    else printf("%d checks passed\n", checks);
    return failures ? 1 : 0;
}
