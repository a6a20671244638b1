/* lt_opencl_tune.c - nd.opencl_tune(): the GEMM autotuner from Lua.
 *
 *   nd.opencl_tune{device=0, sizes={256, {72, 73, 74}, "128x3072x768"},
 *                  layouts={"nn", "nt"}, budget_s=5, verbose=true, save=true}
 *     tunes matmul on the device (default: the default OpenCL device) and
 *     returns a table: device, name, config = {small = {nn=, nt=}, large =
 *     {nn=, nt=}}, tuned (same shape, booleans), sizes = {{m=, n=, k=,
 *     class=, layout=, config=, gflops=, ms=, naive_gflops=}}, candidates =
 *     {{config=, layout=, status=, gflops={...per entry of sizes}}}, tried,
 *     total, rejected, budget_exhausted, elapsed_s, peak_gflops,
 *     peak_formula, file. A size is n (n x n x n), {M, N, K} or "MxNxK" for
 *     (M, K) @ (K, N); layouts "nn" (b row-major) and "nt" (b = w:t()).
 *   nd.opencl_tune{device=0, query=true}  the configuration in use, no tuning
 *   nd.opencl_tune{device=0, forget=true} deletes the tuned choice
 * (ocl_gemm_tune.c does the work; this file only converts.) */
#include <stdio.h>
#include <string.h>
#include "lt_internal.h"
#ifdef NEEDLE_HAVE_OPENCL
#include "opencl_tune.h"
#endif

#define OP "opencl_tune"

#ifdef NEEDLE_HAVE_OPENCL
#define class_names ocl_gemm_class_names
#define group_names ocl_gemm_group_names

/* The OpenCL device index of opts.device: a number N (opencl:N), a device
 * name ("opencl", "opencl:N"), or the default OpenCL device when absent. */
static int opt_device(lua_State *L) {
    nd_device d;
    int t = lua_getfield(L, 1, "device");
    if (t == LUA_TNUMBER) {
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
            lt_error(L, OP, "device must be an OpenCL device index (0, 1, ...) or name, got %s",
                     lua_tostring(L, -1));
        lua_Integer i = lua_tointeger(L, -1);
        if (i >= nd_opencl_device_count())
            lt_error(L, OP, "no OpenCL device %d (%d available; nd.devices() lists them)", (int)i,
                     nd_opencl_device_count());
        lua_pop(L, 1);
        return (int)i;
    }
    if (t == LUA_TNIL) {
        if (nd_device_parse("opencl", &d) != ND_OK) lt_error(L, OP, "%s", nd_last_error());
    } else {
        d = lt_device_name(L, lua_gettop(L), OP);
        if (d.type != ND_DEVICE_OPENCL)
            lt_error(L, OP, "device must be an OpenCL device, got '%s'", lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    return d.index;
}

static lua_Integer size_int(lua_State *L, int idx, int which) {
    if (!lua_isinteger(L, idx))
        lt_error(L, OP, "sizes[%d]: M, N and K must be integers", which);
    return lua_tointeger(L, idx);
}

/* opts.sizes: a list of n, {M, N, K} or "MxNxK" */
static int opt_sizes(lua_State *L, int64_t sizes[][3]) {
    int n = 0;
    if (lua_getfield(L, 1, "sizes") == LUA_TNIL) { lua_pop(L, 1); return 0; }
    if (!lua_istable(L, -1)) lt_error(L, OP, "sizes must be a list, got %s", luaL_typename(L, -1));
    int list = lua_gettop(L);
    lua_Integer len = (lua_Integer)lua_rawlen(L, list);
    if (len > OCL_GEMM_MAX_SIZES) lt_error(L, OP, "at most %d sizes, got %d", OCL_GEMM_MAX_SIZES, (int)len);
    for (lua_Integer i = 1; i <= len; i++, n++) {
        int t = lua_rawgeti(L, list, i);
        int64_t *s = sizes[n];
        if (t == LUA_TNUMBER) {
            s[0] = s[1] = s[2] = size_int(L, -1, (int)i);
        } else if (t == LUA_TTABLE) {
            if (lua_rawlen(L, -1) != 3) lt_error(L, OP, "sizes[%d]: a table size is {M, N, K}", (int)i);
            for (int j = 0; j < 3; j++) {
                lua_rawgeti(L, -1, j + 1);
                s[j] = size_int(L, -1, (int)i);
                lua_pop(L, 1);
            }
        } else if (t == LUA_TSTRING) {
            long long m, nn, k;
            char tail;
            if (sscanf(lua_tostring(L, -1), "%lldx%lldx%lld%c", &m, &nn, &k, &tail) != 3)
                lt_error(L, OP, "sizes[%d]: expected \"MxNxK\", got \"%s\"", (int)i, lua_tostring(L, -1));
            s[0] = m; s[1] = nn; s[2] = k;
        } else {
            lt_error(L, OP, "sizes[%d]: expected n, {M, N, K} or \"MxNxK\", got %s", (int)i,
                     luaL_typename(L, -1));
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (n == 0) lt_error(L, OP, "sizes is empty");
    return n;
}

/* {small = {nn=, nt=}, large = {nn=, nt=}} of configuration strings */
static void push_configs(lua_State *L, char cfg[OCL_GEMM_NCLASS][OCL_GEMM_NGROUP][48]) {
    lua_createtable(L, 0, OCL_GEMM_NCLASS);
    for (int c = 0; c < OCL_GEMM_NCLASS; c++) {
        lua_createtable(L, 0, OCL_GEMM_NGROUP);
        for (int g = 0; g < OCL_GEMM_NGROUP; g++) lt_set_str(L, group_names[g], cfg[c][g]);
        lua_setfield(L, -2, class_names[c]);
    }
}

/* opts.layouts: a list of "nn" / "nt" (default both) */
static void opt_layouts(lua_State *L, bool *groups) {
    for (int g = 0; g < OCL_GEMM_NGROUP; g++) groups[g] = true;
    if (lua_getfield(L, 1, "layouts") == LUA_TNIL) { lua_pop(L, 1); return; }
    if (!lua_istable(L, -1)) lt_error(L, OP, "layouts must be a list of \"nn\" and \"nt\"");
    for (int g = 0; g < OCL_GEMM_NGROUP; g++) groups[g] = false;
    lua_Integer len = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= len; i++) {
        lua_rawgeti(L, -1, i);
        const char *v = lua_tostring(L, -1);
        int found = -1;
        for (int g = 0; g < OCL_GEMM_NGROUP && v; g++)
            if (strcmp(v, group_names[g]) == 0) found = g;
        if (found < 0)
            lt_error(L, OP, "layouts[%d]: expected \"nn\" or \"nt\", got %s", (int)i,
                     v ? v : luaL_typename(L, -1));
        groups[found] = true;
        lua_pop(L, 1);
    }
    if (len == 0) lt_error(L, OP, "layouts is empty");
    lua_pop(L, 1);
}

static void push_peak(lua_State *L, int device) {
    double peak;
    char formula[512];
    if (nd_ocl_gemm_peak(device, &peak, formula, sizeof formula) == ND_OK) {
        lt_set_num(L, "peak_gflops", peak);
        lt_set_str(L, "peak_formula", formula);
    }
}

static int l_opencl_tune(lua_State *L) {
    if (lua_isnoneornil(L, 1)) { lua_settop(L, 0); lua_newtable(L); }
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    const char *why = nd_opencl_unavailable_reason();
    if (why) return lt_error(L, OP, "%s", why);
    static const char *const known[] = {"device", "sizes", "layouts", "budget_s", "verbose", "save",
                                        "query", "forget", NULL};
    lt_options(L, 1, OP, known);
    int device = opt_device(L);
    char name[32];
    nd_device dv = {ND_DEVICE_OPENCL, device};
    nd_device_str(dv, name);

    if (lt_opt_bool(L, 1, OP, "forget", false)) LT_CHECK_AS(L, OP, nd_ocl_gemm_forget(device));
    if (lt_opt_bool(L, 1, OP, "query", false) || lt_opt_bool(L, 1, OP, "forget", false)) {
        char cfg[OCL_GEMM_NCLASS][OCL_GEMM_NGROUP][48], source[1400], file[1100];
        LT_CHECK_AS(L, OP, nd_ocl_gemm_current(device, cfg, source, sizeof source, file, sizeof file));
        nd_opencl_info in;
        LT_CHECK_AS(L, OP, nd_opencl_device_info(device, &in));
        lua_createtable(L, 0, 8);
        lt_set_str(L, "device", name);
        lt_set_str(L, "name", in.name);
        push_configs(L, cfg);
        lua_setfield(L, -2, "config");
        lt_set_str(L, "source", source);
        if (file[0]) lt_set_str(L, "file", file);
        push_peak(L, device);
        return 1;
    }

    ocl_gemm_tune_opts o;
    memset(&o, 0, sizeof o);
    o.device = device;
    o.nsizes = opt_sizes(L, o.sizes);
    opt_layouts(L, o.groups);
    o.budget_s = 5;
    if (lua_getfield(L, 1, "budget_s") != LUA_TNIL) {
        if (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < 0)
            return lt_error(L, OP, "budget_s must be a number of seconds >= 0");
        o.budget_s = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    o.verbose = lt_opt_bool(L, 1, OP, "verbose", false);
    o.save = lt_opt_bool(L, 1, OP, "save", true);

    /* the result is large: on the heap, owned by a userdata so that a Lua
     * error below cannot leak it */
    ocl_gemm_tune_result *r = lua_newuserdatauv(L, sizeof *r, 0);
    int rud = lua_gettop(L);
    LT_CHECK_AS(L, OP, nd_ocl_gemm_tune(&o, r));

    lua_createtable(L, 0, 16);
    lt_set_str(L, "device", name);
    lt_set_str(L, "name", r->device_name);
    push_configs(L, r->config);
    lua_setfield(L, -2, "config");
    lua_createtable(L, 0, OCL_GEMM_NCLASS);
    for (int c = 0; c < OCL_GEMM_NCLASS; c++) {
        lua_createtable(L, 0, OCL_GEMM_NGROUP);
        for (int g = 0; g < OCL_GEMM_NGROUP; g++) lt_set_bool(L, group_names[g], r->tuned[c][g]);
        lua_setfield(L, -2, class_names[c]);
    }
    lua_setfield(L, -2, "tuned");
    lua_createtable(L, r->nsizes, 0);
    for (int i = 0; i < r->nsizes; i++) {
        const ocl_gemm_size_result *s = &r->sizes[i];
        lua_createtable(L, 0, 8);
        lt_set_int(L, "m", s->m);
        lt_set_int(L, "n", s->n);
        lt_set_int(L, "k", s->k);
        lt_set_str(L, "class", class_names[s->cls]);
        lt_set_str(L, "layout", group_names[s->group]);
        if (s->cfg[0]) lt_set_str(L, "config", s->cfg);
        lt_set_num(L, "gflops", s->gflops);
        lt_set_num(L, "ms", s->ms);
        if (s->naive_gflops > 0) lt_set_num(L, "naive_gflops", s->naive_gflops);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "sizes");
    lua_createtable(L, r->ncandidates, 0);
    for (int ci = 0; ci < r->ncandidates; ci++) {
        const ocl_gemm_candidate_result *c = &r->cand[ci];
        lua_createtable(L, 0, 3);
        lt_set_str(L, "config", c->cfg);
        lt_set_str(L, "layout", group_names[c->group]);
        lt_set_str(L, "status", c->status);
        lua_createtable(L, r->nsizes, 0);
        for (int i = 0; i < r->nsizes; i++) {
            lua_pushnumber(L, c->gflops[i]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, "gflops");
        lua_rawseti(L, -2, ci + 1);
    }
    lua_setfield(L, -2, "candidates");
    lt_set_int(L, "tried", r->ntried);
    lt_set_int(L, "total", r->ncandidates);
    lt_set_int(L, "rejected", r->nrejected);
    lt_set_bool(L, "budget_exhausted", r->budget_exhausted);
    lt_set_num(L, "elapsed_s", r->elapsed_s);
    lt_set_num(L, "peak_gflops", r->peak_gflops);
    lt_set_str(L, "peak_formula", r->peak_formula);
    if (r->file[0]) lt_set_str(L, "file", r->file);
    lua_remove(L, rud);
    return 1;
}
#else
static int l_opencl_tune(lua_State *L) {
    const char *why = nd_opencl_unavailable_reason();
    return lt_error(L, OP, "no OpenCL backend: %s", why ? why : "this build has none");
}
#endif

void lt_register_opencl_tune(lua_State *L) {
    static const lt_reg regs[] = {
        {"opencl_tune", l_opencl_tune, false, true, 1, "[opts]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
