/* lt_profile.c - the C half of nd.profile (lua/needle/profile.lua).
 *
 * core.profiler_wrap(fn, name) returns a C closure that brackets fn with a
 * profiler event; profile.lua puts such closures in place of the bindings
 * while profiling and puts the originals back after. The closure calls fn
 * protected, so an error inside still closes its event, and re-raises the
 * same error value. The per-name sums and the Chrome trace are read here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "lt_internal.h"

static int profiled_call(lua_State *L) {
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    int depth = nd_profiler_push((int)lua_tointeger(L, lua_upvalueindex(2)));
    int st = lua_pcall(L, n, LUA_MULTRET, 0);
    nd_profiler_pop(depth);
    if (st != LUA_OK) return lua_error(L);
    return lua_gettop(L);
}

/* profiler_wrap(fn, name) -> wrapped fn */
static int l_wrap(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    int id = nd_profiler_intern(luaL_checkstring(L, 2));
    if (id < 0) return luaL_error(L, "needle.profile: out of memory");
    lua_pushvalue(L, 1);
    lua_pushinteger(L, id);
    lua_pushcclosure(L, profiled_call, 2);
    return 1;
}

/* profiler_enable(on, keep_events) */
static int l_enable(lua_State *L) {
    nd_profiler_enable(lua_toboolean(L, 1), lua_toboolean(L, 2));
    return 0;
}
static int l_enabled(lua_State *L) { lua_pushboolean(L, nd_profiler_enabled()); return 1; }
static int l_reset(lua_State *L) { (void)L; nd_profiler_reset(); return 0; }
static int l_depth(lua_State *L) { lua_pushinteger(L, nd_profiler_depth()); return 1; }
static int l_now(lua_State *L) { lua_pushinteger(L, nd_profiler_now_ns()); return 1; }
static int l_allocated(lua_State *L) { lua_pushinteger(L, nd_allocated_bytes()); return 1; }

/* profiler_push(name) -> depth; profiler_pop(depth) */
static int l_push(lua_State *L) {
    int id = nd_profiler_intern(luaL_checkstring(L, 1));
    lua_pushinteger(L, id < 0 ? nd_profiler_depth() : nd_profiler_push(id));
    return 1;
}
static int l_pop(lua_State *L) { nd_profiler_pop((int)luaL_checkinteger(L, 1)); return 0; }

/* profiler_stats() -> {name = {calls, total_ns, self_ns, total_bytes, self_bytes}},
 * number of kept events, number dropped */
static int l_stats(lua_State *L) {
    int n = nd_profiler_num_names();
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        nd_profile_stat s;
        nd_profiler_stat(i, &s);
        if (s.calls == 0) continue;
        lua_createtable(L, 0, 5);
        lt_set_int(L, "calls", s.calls);
        lt_set_int(L, "total_ns", s.total_ns);
        lt_set_int(L, "self_ns", s.self_ns);
        lt_set_int(L, "total_bytes", s.total_bytes);
        lt_set_int(L, "self_bytes", s.self_bytes);
        lua_setfield(L, -2, nd_profiler_name(i));
    }
    size_t dropped;
    lua_pushinteger(L, (lua_Integer)nd_profiler_events(NULL, &dropped));
    lua_pushinteger(L, (lua_Integer)dropped);
    return 3;
}

static const nd_profile_event *sort_events;
static int by_start(const void *a, const void *b) {
    const nd_profile_event *x = &sort_events[*(const size_t *)a];
    const nd_profile_event *y = &sort_events[*(const size_t *)b];
    if (x->start_ns != y->start_ns) return x->start_ns < y->start_ns ? -1 : 1;
    return (x->depth > y->depth) - (x->depth < y->depth); /* parents first */
}

/* s as a JSON string (quoted, escaped) into buf of cap bytes; its length.
 * Names are op names: a long one is cut rather than overflowing buf. */
static size_t json_string(char *buf, size_t cap, const char *s) {
    size_t o = 0;
    buf[o++] = '"';
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { buf[o++] = '\\'; buf[o++] = (char)c; }
        else if (c < 0x20) o += (size_t)snprintf(buf + o, cap - o, "\\u%04x", c);
        else buf[o++] = (char)c;
    }
    buf[o++] = '"';
    buf[o] = 0;
    return o;
}

/* profiler_write_trace(path, first, last, t0_ns): events first..last
 * (1-based, in nd_profiler_events order) as a Chrome trace: complete ("X")
 * events, ts and dur in microseconds from t0_ns. Written as every file of
 * needle's is (nd_atomic_*: a temporary renamed into place; a FIFO or
 * device is refused; a file-size limit is an error, not SIGXFSZ). */
static int l_write_trace(lua_State *L) {
    const char *path = lt_check_path(L, 1, "profile");
    lua_Integer first = luaL_checkinteger(L, 2), last = luaL_checkinteger(L, 3);
    int64_t t0 = (int64_t)luaL_checkinteger(L, 4);
    const nd_profile_event *ev;
    size_t n = nd_profiler_events(&ev, NULL);
    if (first < 1) first = 1;
    if (last > (lua_Integer)n) last = (lua_Integer)n;
    size_t count = last >= first ? (size_t)(last - first + 1) : 0;
    /* a userdata, so that an error below leaves nothing to free */
    size_t *order = lua_newuserdatauv(L, (count ? count : 1) * sizeof *order, 0);
    for (size_t i = 0; i < count; i++) order[i] = (size_t)first - 1 + i;
    sort_events = ev;
    qsort(order, count, sizeof *order, by_start);
    nd_atomic_file *f;
    LT_CHECK(L, nd_atomic_open("profile", path, &f));
    static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"needle-lua\"}}";
    LT_CHECK(L, nd_atomic_write(f, head, sizeof head - 1)); /* a failed write frees f */
    for (size_t i = 0; i < count; i++) {
        const nd_profile_event *e = &ev[order[i]];
        const char *name = nd_profiler_name(e->name);
        char js[256], line[512];
        json_string(js, sizeof js, name);
        int k = snprintf(line, sizeof line, ",\n{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,"
                         "\"dur\":%.3f,\"pid\":1,\"tid\":1,\"args\":{\"bytes\":%lld,\"self_bytes\":%lld}}",
                         js, strstr(name, "_backward") ? "backward" : "op",
                         (double)(e->start_ns - t0) / 1e3, (double)(e->end_ns - e->start_ns) / 1e3,
                         (long long)e->total_bytes, (long long)e->self_bytes);
        LT_CHECK(L, nd_atomic_write(f, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1));
    }
    LT_CHECK(L, nd_atomic_write(f, "\n]}\n", 4));
    LT_CHECK(L, nd_atomic_commit(f));
    lua_pushinteger(L, (lua_Integer)count);
    return 1;
}

void lt_register_profile(lua_State *L) {
    static const lt_reg regs[] = {
        {"profiler_wrap", l_wrap, false, true, 2, "fn, name"},
        {"profiler_enable", l_enable, false, true, 2, "on[, keep_events]"},
        {"profiler_enabled", l_enabled, false, true, 0, ""},
        {"profiler_reset", l_reset, false, true, 0, ""},
        {"profiler_depth", l_depth, false, true, 0, ""},
        {"profiler_now", l_now, false, true, 0, ""},
        {"profiler_push", l_push, false, true, 1, "name"},
        {"profiler_pop", l_pop, false, true, 1, "depth"},
        {"profiler_stats", l_stats, false, true, 0, ""},
        {"profiler_write_trace", l_write_trace, false, true, 4, "path, first, last, t0"},
        {"allocated_bytes", l_allocated, false, true, 0, ""},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
