/* host.c - a C program embedding needle-lua: it hands its own float buffer
 * to a Lua "model" without copying, reads the result back, and computes the
 * same model with the C API alone. Usage: embed_host path/to/model.lua
 * Exit status 0 when both results match the values computed by hand. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "needle.h"

/* Every nd_status is checked; a failure prints the library's message. */
#define TRY(expr) do { nd_status st_ = (expr); if (st_ != ND_OK) { \
        printf("FAIL: %s: %s (%s)\n", #expr, nd_last_error(), nd_status_name(st_)); \
        exit(1); } } while (0)

/* The host's buffer: needle calls release() once, when the last tensor
 * (or view) using it is gone. */
typedef struct { float *data; int releases; } host_buffer;
static void release(void *ctx) {
    host_buffer *hb = ctx;
    free(hb->data);
    hb->data = NULL;
    hb->releases++;
}

enum { B = 2, IN = 4, OUT = 3 };
static const float W[IN][OUT] = {{1, -1, 0.5f}, {2, 0, -1}, {0, 1, 1}, {-1, 2, 0}};
static const float bias[OUT] = {0.5f, -1, 0};

/* The model by hand: y[i] = sum_j relu(sum_k x[i][k] W[k][j] + b[j]) */
static void by_hand(const float *x, float *y) {
    for (int i = 0; i < B; i++) {
        y[i] = 0;
        for (int j = 0; j < OUT; j++) {
            float s = bias[j];
            for (int k = 0; k < IN; k++) s += x[i * IN + k] * W[k][j];
            y[i] += s > 0 ? s : 0;
        }
    }
}

static int check(const char *what, const float *got, const float *want) {
    printf("%s = [%g, %g]\n", what, got[0], got[1]);
    for (int i = 0; i < B; i++)
        if (fabsf(got[i] - want[i]) > 1e-5f) {
            printf("FAIL: %s[%d] is %g, expected %g\n", what, i, got[i], want[i]);
            return 0;
        }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s model.lua\n", argv[0]); return 2; }
    int ok = 1;
    int64_t live0 = nd_live_bytes();

    /* 1. the host's data, wrapped without copying */
    host_buffer hb = {malloc(B * IN * sizeof(float)), 0};
    const float init[B * IN] = {1, 2, 3, 4, -1, 0, 1, 2};
    for (int i = 0; i < B * IN; i++) hb.data[i] = init[i];
    nd_tensor *x;
    TRY(nd_from_borrowed(hb.data, (const int64_t[]){B, IN}, 2, ND_FLOAT32, release, &hb, &x));
    float want[B];
    by_hand(hb.data, want);

    /* 2. Lua: open needle (from sources inside the library), load the model */
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "needle", luaopen_needle, 0);
    lua_pop(L, 1);
    if (luaL_loadfile(L, argv[1]) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
        printf("FAIL: loading %s: %s\n", argv[1], lua_tostring(L, -1));
        return 1;
    }
    nd_lua_push_tensor(L, x); /* the model function is below it on the stack */
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        printf("FAIL: model: %s\n", lua_tostring(L, -1));
        return 1;
    }
    nd_tensor *y = nd_lua_to_tensor(L, -1); /* borrowed from the userdata */
    float got[B];
    if (!y || nd_numel(y) != B || nd_get_dtype(y) != ND_FLOAT32) {
        printf("FAIL: the model did not return a float32 tensor of %d elements\n", B);
        return 1;
    }
    TRY(nd_copy_to_buffer(y, got, sizeof got));
    ok &= check("model(x)", got, want);
    lua_close(L); /* drops Lua's references, y included */

    /* 3. the same model with the C API alone */
    nd_tensor *w, *b, *xw, *z, *r, *s;
    TRY(nd_from_buffer(W, (const int64_t[]){IN, OUT}, 2, ND_FLOAT32, &w));
    TRY(nd_from_buffer(bias, (const int64_t[]){OUT}, 1, ND_FLOAT32, &b));
    TRY(nd_matmul(x, w, &xw));                    /* {B,OUT} */
    TRY(nd_binary(ND_BINARY_add, xw, b, &z));     /* b broadcasts over rows */
    TRY(nd_unary(ND_UNARY_relu, z, &r));
    TRY(nd_reduce(ND_REDUCE_sum, r, (const int[]){1}, 1, 0, 0, &s)); /* dims 0-based in C */
    TRY(nd_copy_to_buffer(s, got, sizeof got));
    ok &= check("C API   ", got, want);
    nd_release(w); nd_release(b); nd_release(xw); nd_release(z); nd_release(r); nd_release(s);

    /* 4. our reference is the last one: releasing it hands the buffer back */
    if (hb.releases != 0) { printf("FAIL: buffer released while still in use\n"); ok = 0; }
    nd_release(x);
    if (hb.releases != 1) {
        printf("FAIL: release callback called %d times, expected once\n", hb.releases);
        ok = 0;
    }
    if (nd_live_bytes() != live0) {
        printf("FAIL: %lld bytes of tensors still alive\n", (long long)(nd_live_bytes() - live0));
        ok = 0;
    }
    nd_empty_cache();
    printf(ok ? "embed example: ok\n" : "embed example: FAILED\n");
    return ok ? 0 : 1;
}
