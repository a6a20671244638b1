/* lt_tensor.c - the tensor userdata: creation, lifetime, GC accounting,
 * argument helpers and the property half of __index/__newindex. */
#include <stdio.h>
#include <string.h>
#include "lt_internal.h"

/* Registry keys (addresses are unique). */
static char mt_key, methods_key;

/* ---------------------------------------------------------------- errors */

/* The registry field where needle.errors leaves the directory prefix of the
 * package's Lua files when they are loaded from files ("@/.../lua/needle/"). */
#define LIBRARY_ROOT_KEY "needle.library_root"

/* Whether a chunk is one of the package's own Lua files: an embedded source
 * ("=[needle embedded] needle...") or a file under the registered root. */
static bool is_library_source(lua_State *L, const char *source) {
    static const char embedded[] = "=[needle embedded] needle";
    if (strncmp(source, embedded, sizeof embedded - 1) == 0) return true;
    bool lib = false;
    if (lua_getfield(L, LUA_REGISTRYINDEX, LIBRARY_ROOT_KEY) == LUA_TSTRING) {
        size_t n;
        const char *root = lua_tolstring(L, -1, &n);
        lib = n > 0 && strncmp(source, root, n) == 0;
    }
    lua_pop(L, 1);
    return lib;
}

/* Pushes "<file>:<line>: " for an error raised here, as luaL_where(L, 1)
 * does, except when the caller is one of the package's own Lua files: then
 * the innermost frame of the user's code above it, so that an op failing
 * inside the library (F.linear inside Linear:forward inside a Sequential)
 * names the user's line rather than a library line. Called from C (pcall)
 * or from the user's code, it is luaL_where's answer. The position is found
 * where the error is raised, so nothing catches and re-raises it, and the
 * traceback keeps every frame. */
static void push_where(lua_State *L) {
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "S", &ar) && ar.what[0] != 'C' &&
        is_library_source(L, ar.source)) {
        for (int level = 2; lua_getstack(L, level, &ar); level++) {
            if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue; /* C frames */
            if (is_library_source(L, ar.source)) continue;
            lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
            return;
        }
    }
    luaL_where(L, 1);
}

/* core._set_library_root(prefix): needle.errors registers where the
 * package's files are when they are not embedded. */
int lt_set_library_root(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, LIBRARY_ROOT_KEY);
    return 0;
}

int lt_raise(lua_State *L) {
    push_where(L);
    lua_pushfstring(L, "needle.%s", nd_last_error_based(1)); /* Lua is 1-based */
    lua_concat(L, 2);
    return lua_error(L);
}

int lt_raise_as(lua_State *L, const char *op) {
    const char *msg = nd_last_error_based(1);
    const char *colon = strstr(msg, ": ");
    push_where(L);
    lua_pushfstring(L, "needle.%s: %s", op, colon ? colon + 2 : msg);
    lua_concat(L, 2);
    return lua_error(L);
}

nd_number lt_to_number(lua_State *L, int idx) {
    if (lua_type(L, idx) == LUA_TBOOLEAN) return nd_num_i(lua_toboolean(L, idx));
    if (lua_isinteger(L, idx)) return nd_num_i(lua_tointeger(L, idx));
    return nd_num_f(lua_tonumber(L, idx));
}

double lt_arg_number(lua_State *L, int idx, const char *op, const char *what) {
    if (lua_type(L, idx) != LUA_TNUMBER)
        return lt_error(L, op, "%s must be a number, got %s", what, luaL_typename(L, idx));
    return lua_tonumber(L, idx);
}

lua_Integer lt_arg_integer(lua_State *L, int idx, const char *op, const char *what) {
    if (lua_type(L, idx) != LUA_TNUMBER)
        return lt_error(L, op, "%s must be an integer, got %s", what, luaL_typename(L, idx));
    if (!lua_isinteger(L, idx)) {
        lua_Number v = lua_tonumber(L, idx);
        lua_Integer i;
        if (!lua_numbertointeger(v, &i) || (lua_Number)i != v)
            return lt_error(L, op, "%s must be an integer, got %s", what, lua_tostring(L, idx));
        return i;
    }
    return lua_tointeger(L, idx);
}

static lt_box *to_box(lua_State *L, int idx);

/* the type of an argument for "got an extra argument #k (<type>)" */
static const char *arg_type(lua_State *L, int idx) {
    return to_box(L, idx) ? "tensor" : luaL_typename(L, idx);
}

void lt_no_extra(lua_State *L, int last, const char *op, const char *usage) {
    for (int i = last + 1; i <= lua_gettop(L); i++)
        if (!lua_isnil(L, i))
            lt_error(L, op, "%s, got an extra argument #%d (%s)", usage, i, arg_type(L, i));
}

int lt_extra_arg(lua_State *L, const char *name, const char *params, const char *hint, int idx) {
    /* a method call (x:sum(1, true, 5)) is answered in its own terms, as
     * luaL_argerror does: x:sum([dim, keepdim]) and positions after self */
    lua_Debug ar;
    bool method = lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && ar.namewhat &&
                  strcmp(ar.namewhat, "method") == 0 && idx > 1;
    char form[256];
    if (method) {
        size_t self = strcspn(params, ",[");
        const char *rest = params + self, *open = "";
        if (strncmp(rest, "[, ", 3) == 0) { rest += 3; open = "["; }
        else if (strncmp(rest, ", ", 2) == 0) rest += 2;
        snprintf(form, sizeof form, "%.*s:%s(%s%s)", (int)self, params, name, open, rest);
    } else {
        snprintf(form, sizeof form, "%s(%s)", name, params);
    }
    return lt_error(L, name, "takes %s only, got an extra argument #%d (%s)%s%s", form,
                    method ? idx - 1 : idx, arg_type(L, idx), hint ? "; " : "", hint ? hint : "");
}

void lt_no_extra_arg(lua_State *L, int last, const char *name, const char *params) {
    for (int i = last + 1; i <= lua_gettop(L); i++)
        if (!lua_isnil(L, i)) lt_extra_arg(L, name, params, NULL, i);
}

int lt_error(lua_State *L, const char *op, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    push_where(L);
    lua_pushfstring(L, "needle.%s: %s", op, msg);
    lua_concat(L, 2);
    return lua_error(L);
}

/* ------------------------------------------------------- GC accounting
 * Lua's collector sees only the small userdata, not the tensor memory
 * behind it, so a loop making big temporaries would grow without bound.
 * When live tensor bytes pass a threshold we run a full collection and set
 * the next threshold to what survived plus a quarter of it (at least 2 MiB
 * of garbage, and twice the Lua heap): collections stay proportional to the
 * bytes allocated,
 * freed blocks go back to the caching allocator while they are still hot
 * (no fresh, page-faulting memory for every large temporary), and nobody
 * needs collectgarbage(). A full collection costs time proportional to the
 * Lua heap, not to tensor sizes (0.06 ms for the 450 KB of a ResNet9
 * script). With 32 MiB of garbage allowed, a loop making 393 KB results
 * ran its first 80 calls on fresh, page-faulting memory (3.7 ms a call
 * instead of 1.8). */
#define GC_MIN_SLACK ((int64_t)2 << 20)
/* live bytes after the last collection, or the least seen since (a
 * collectgarbage() of the program's own lowers it), and the Lua heap then */
static _Thread_local int64_t gc_floor = -1, gc_heap;

/* Second mechanism, for many small tensors: Lua paces its incremental
 * collector by the bytes it allocates itself, but a tensor's headers and
 * data live outside Lua (several hundred bytes behind a 50-byte userdata).
 * We charge those bytes to the collector with LUA_GCSTEP, which in Lua 5.4
 * counts them as if Lua had allocated them, so a loop of small ops is
 * collected at the pace its real memory use calls for. */
/* A tensor's data is charged up to GC_CHARGE_MAX bytes: the threshold
 * above paces big tensors. Charged in full, one 8 MB activation was a debt
 * the incremental collector paid by running a whole cycle (its pause is
 * sized to the small Lua heap), so every op of a ResNet9 train step at
 * batch 128 ran a full collection: steps took 15 ms between the
 * threshold's collections and 7.5 ms just after them. */
#define GC_CHARGE_BATCH (64 << 10)
#define GC_CHARGE_MAX ((size_t)4 << 10)
static _Thread_local size_t gc_charge;

static void gc_account(lua_State *L, const nd_tensor *t) {
    /* the tensor header, plus storage header and data when this tensor is
     * the storage's only user (a fresh result rather than a view) */
    gc_charge += sizeof(nd_tensor);
    if (atomic_load(&t->storage->refcount) == 1)
        gc_charge += sizeof(nd_storage) +
                     (t->storage->nbytes < GC_CHARGE_MAX ? t->storage->nbytes : GC_CHARGE_MAX);
    if (gc_charge >= GC_CHARGE_BATCH) {
        size_t kb = gc_charge >> 10;
        gc_charge = 0;
        lua_gc(L, LUA_GCSTEP, kb > 1 << 20 ? 1 << 20 : (int)kb);
    }
    int64_t live = nd_live_bytes();
    if (gc_floor < 0 || live < gc_floor) gc_floor = live;
    /* a collection costs time in proportion to the Lua heap: at least twice
     * the heap's bytes of garbage per collection keeps that cost below the
     * bytes allocated, as Lua's own pause does */
    int64_t slack = gc_floor / 4 > GC_MIN_SLACK ? gc_floor / 4 : GC_MIN_SLACK;
    /* the heap at our last collection, or now if it has shrunk since (a
     * 64 MB table the program has dropped must not keep the slack at
     * 128 MB for the rest of the run) */
    int64_t heap = (int64_t)lua_gc(L, LUA_GCCOUNT) * 1024;
    if (heap > gc_heap) heap = gc_heap;
    if (slack < 2 * heap) slack = 2 * heap;
    if (live - gc_floor <= slack) return;
    lua_gc(L, LUA_GCCOLLECT);
    gc_floor = nd_live_bytes();
    gc_heap = (int64_t)lua_gc(L, LUA_GCCOUNT) * 1024;
}

/* --------------------------------------------------------------- userdata */

void lt_push(lua_State *L, nd_tensor *t) {
    lt_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->t = t;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &mt_key);
    lua_setmetatable(L, -2);
    gc_account(L, t);
}

void nd_lua_push_tensor(lua_State *L, nd_tensor *t) {
    nd_retain(t);
    lt_push(L, t);
}

/* ------------------------------------------------- the tensor type check
 * to_box runs on every operand of every op. Comparing the userdata's
 * metatable with the registry's (a hash lookup and two more stack slots) was
 * a tenth of the time of an op on small tensors, so the metatables of the
 * live needle states are also kept in a small process-wide table and
 * compared by address. A slot is cleared by the finalizer of a sentinel that
 * the metatable holds and that holds the metatable as its user value: when
 * both become garbage, the collector keeps the metatable alive until the
 * sentinel's finalizer has run, and lua_close runs every finalizer before it
 * frees anything, so no slot ever names freed memory that a new table could
 * reuse. States beyond the slots use the registry comparison. */
#define KNOWN_MT_SLOTS 16
static _Atomic(const void *) known_mt[KNOWN_MT_SLOTS];
static atomic_int known_mt_used; /* slots ever claimed: the scan's end */
static char sentinel_key;

static int sentinel_gc(lua_State *L) {
    int *slot = lua_touserdata(L, 1);
    if (slot && *slot >= 0) atomic_store(&known_mt[*slot], NULL);
    return 0;
}

/* registers the metatable on top of the stack (left there) */
static void register_metatable(lua_State *L) {
    const void *mt = lua_topointer(L, -1);
    int slot = -1;
    for (int i = 0; i < KNOWN_MT_SLOTS && slot < 0; i++) {
        const void *expected = NULL;
        if (atomic_compare_exchange_strong(&known_mt[i], &expected, mt)) slot = i;
    }
    if (slot < 0) return; /* full: this state uses the registry comparison */
    int used = atomic_load(&known_mt_used);
    while (used < slot + 1 && !atomic_compare_exchange_weak(&known_mt_used, &used, slot + 1)) {}
    int *s = lua_newuserdatauv(L, sizeof *s, 1);
    *s = slot;
    lua_pushvalue(L, -2);
    lua_setiuservalue(L, -2, 1);           /* sentinel -> metatable */
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, sentinel_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, -2, &sentinel_key);     /* metatable -> sentinel */
}

static lt_box *to_box(lua_State *L, int idx) {
    if (lua_type(L, idx) != LUA_TUSERDATA || lua_rawlen(L, idx) != sizeof(lt_box)) return NULL;
    lt_box *b = lua_touserdata(L, idx);
    if (!lua_getmetatable(L, idx)) return NULL;
    const void *mt = lua_topointer(L, -1);
    int used = atomic_load_explicit(&known_mt_used, memory_order_relaxed);
    for (int i = 0; i < used; i++) {
        if (atomic_load_explicit(&known_mt[i], memory_order_relaxed) == mt) {
            lua_pop(L, 1);
            return b;
        }
    }
    lua_rawgetp(L, LUA_REGISTRYINDEX, &mt_key);
    bool ok = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return ok ? b : NULL;
}

nd_tensor *lt_to(lua_State *L, int idx) {
    lt_box *b = to_box(L, idx);
    if (b && !b->t) luaL_error(L, "needle: use of a closed tensor");
    return b ? b->t : NULL;
}

nd_tensor *nd_lua_to_tensor(lua_State *L, int idx) {
    lt_box *b = to_box(L, idx);
    return b ? b->t : NULL;
}

nd_tensor *lt_check(lua_State *L, int idx, const char *op) {
    nd_tensor *t = lt_to(L, idx);
    if (!t) lt_error(L, op, "expected a tensor for argument %d, got %s", idx, luaL_typename(L, idx));
    return t;
}

static int t_gc(lua_State *L) {
    lt_box *b = lua_touserdata(L, 1);
    if (b && b->t) { nd_release(b->t); b->t = NULL; }
    return 0;
}

/* ----------------------------------------------------------- conversions */

int lt_dim_value(lua_State *L, lua_Integer d, const char *op) {
    if (d == 0) lt_error(L, op, "dim 0 is invalid (dims are 1-based; -1 is the last)");
    if (d > ND_MAX_DIMS || d < -ND_MAX_DIMS - 1)
        lt_error(L, op, "dim %lld out of range", (long long)d);
    return d > 0 ? (int)d - 1 : (int)d;
}

static lua_Integer check_int(lua_State *L, int idx, const char *op, const char *what) {
    int isnum;
    lua_Integer v = lua_tointegerx(L, idx, &isnum);
    if (!isnum) {
        if (lua_type(L, idx) == LUA_TNUMBER)
            lt_error(L, op, "%s must be an integer, got %s", what, lua_tostring(L, idx));
        lt_error(L, op, "%s must be an integer, got %s", what, luaL_typename(L, idx));
    }
    return v;
}

int lt_dim(lua_State *L, int idx, const char *op) {
    return lt_dim_value(L, check_int(L, idx, op, "dim"), op);
}

int lt_opt_dim(lua_State *L, int idx, const char *op, int def_core_dim) {
    return lua_isnoneornil(L, idx) ? def_core_dim : lt_dim(L, idx, op);
}

/* A shape table must be a list and nothing else: a key that is not a
 * position, or a hole ({[1] = 2, [3] = 4}, whose length may be 1 or 3), is
 * an error rather than a shape that drops sizes. Returns the number of dims. */
static int shape_table(lua_State *L, int idx, const char *op, int64_t *shape) {
    idx = lua_absindex(L, idx);
    lua_Integer count = 0, last = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1) {
            bool str = lua_type(L, -1) == LUA_TSTRING;
            const char *k = luaL_tolstring(L, -1, NULL);
            lt_error(L, op, "a shape is a list of sizes such as {2, 3}, but this one has the key %s%s%s",
                     str ? "'" : "", k, str ? "'" : "");
        }
        count++;
        if (lua_tointeger(L, -1) > last) last = lua_tointeger(L, -1);
    }
    if (last != count) {
        lua_Integer hole = 1;
        while (lua_rawgeti(L, idx, hole) != LUA_TNIL) { lua_pop(L, 1); hole++; }
        lt_error(L, op, "a shape is a list of sizes such as {2, 3}, but this one has no size at "
                 "index %lld (and one at %lld)", (long long)hole, (long long)last);
    }
    if (count > ND_MAX_DIMS)
        lt_error(L, op, "shape has %lld dims, at most %d supported", (long long)count, ND_MAX_DIMS);
    for (int i = 0; i < (int)count; i++) {
        int ty = lua_rawgeti(L, idx, i + 1), isint = 0;
        lua_Integer v = ty == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0; /* not even "2" */
        if (!isint) /* the message is formatted only here: shapes are read on every call */
            lt_error(L, op, "size %d of the shape must be an integer, got %s", i + 1,
                     ty == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
        shape[i] = v;
        lua_pop(L, 1);
    }
    return (int)count;
}

int lt_shape(lua_State *L, int idx, const char *op, int64_t *shape, bool allow_minus1) {
    int n;
    if (lua_istable(L, idx)) {
        n = shape_table(L, idx, op, shape);
    } else {
        int top = lua_gettop(L);
        n = 0;
        for (int i = idx; i <= top && lua_type(L, i) == LUA_TNUMBER; i++) {
            if (n == ND_MAX_DIMS) lt_error(L, op, "shape has more than %d dims", ND_MAX_DIMS);
            shape[n++] = check_int(L, i, op, "size");
        }
        if (n == 0 && !lua_isnoneornil(L, idx))
            lt_error(L, op, "expected a shape (table or sizes), got %s", luaL_typename(L, idx));
    }
    for (int i = 0; i < n; i++)
        if (shape[i] < 0 && !(allow_minus1 && shape[i] == -1))
            lt_error(L, op, "invalid size %lld at dim %d (sizes must be >= 0)", (long long)shape[i], i + 1);
    return n;
}

int lt_dims(lua_State *L, int idx, const char *op, int *dims) {
    if (lua_isnoneornil(L, idx)) return 0;
    if (lua_istable(L, idx)) {
        int n = (int)luaL_len(L, idx);
        if (n > ND_MAX_DIMS) lt_error(L, op, "too many dims (%d)", n);
        for (int i = 0; i < n; i++) {
            lua_geti(L, idx, i + 1);
            dims[i] = lt_dim(L, lua_gettop(L), op);
            lua_pop(L, 1);
        }
        return n;
    }
    dims[0] = lt_dim(L, idx, op);
    return 1;
}

nd_dtype lt_check_dtype_name(lua_State *L, int idx, const char *op) {
    if (lua_type(L, idx) != LUA_TSTRING) /* before lua_tostring, which would turn 64 into "64" */
        lt_error(L, op, "dtype must be a string, got %s", luaL_typename(L, idx));
    const char *name = lua_tostring(L, idx);
    nd_dtype dt;
    if (nd_dtype_from_name(name, &dt) != ND_OK) lt_error(L, op, "%s", nd_last_error_based(1));
    return dt;
}

nd_dtype lt_opt_dtype(lua_State *L, int idx, const char *op, nd_dtype def) {
    if (!lua_istable(L, idx)) return def;
    nd_dtype dt = def;
    if (lua_getfield(L, idx, "dtype") != LUA_TNIL) dt = lt_check_dtype_name(L, lua_gettop(L), op);
    lua_pop(L, 1);
    return dt;
}

nd_device lt_device_name(lua_State *L, int idx, const char *op) {
    if (lua_type(L, idx) != LUA_TSTRING)
        lt_error(L, op, "device must be a string (\"cpu\", \"opencl\", \"opencl:N\"), got %s",
                 luaL_typename(L, idx));
    nd_device d;
    if (nd_device_parse(lua_tostring(L, idx), &d) != ND_OK)
        lt_error(L, op, "%s", nd_last_error_based(1));
    return d;
}

nd_device lt_opt_device(lua_State *L, int idx, const char *op, nd_device def) {
    if (!lua_istable(L, idx)) return def;
    if (lua_getfield(L, idx, "device") != LUA_TNIL) def = lt_device_name(L, lua_gettop(L), op);
    lua_pop(L, 1);
    return def;
}

nd_device lt_check_device(lua_State *L, int idx, const char *op) {
    return lt_opt_device(L, idx, op, nd_cpu_device());
}

nd_tensor *lt_push_host(lua_State *L, nd_tensor *t, const char *op) {
    nd_tensor *h;
    LT_CHECK_AS(L, op, nd_graph_check_host_read(op));
    LT_CHECK_AS(L, op, nd_to_host(t, &h));
    lt_push(L, h);
    return h;
}

void lt_push_on(lua_State *L, nd_tensor *t, nd_device d, const char *op) {
    nd_device cur = nd_get_device(t);
    if (cur.type != d.type || cur.index != d.index) {
        nd_tensor *m;
        bool on = nd_set_grad_enabled(false);
        nd_status st = nd_to_device(t, d, &m);
        nd_set_grad_enabled(on);
        nd_release(t);
        LT_CHECK_AS(L, op, st);
        t = m;
    }
    lt_push(L, t);
}

bool lt_is_options(lua_State *L, int idx) {
    if (!lua_istable(L, idx) || lt_to(L, idx)) return false;
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        bool named = lua_type(L, -2) == LUA_TSTRING;
        lua_pop(L, 1);
        if (named) { lua_pop(L, 1); return true; }
    }
    return false;
}

/* ----------------------------------------------------------- registration */

/* The arity check of a binding (lt_reg in lt_internal.h): the closure's
 * upvalue is its (static) entry. Arguments past max must be nil; they are
 * dropped, and the entry's function runs in this frame. The common case
 * (no argument past max) costs a comparison. */
static int call_checked(lua_State *L, const lt_reg *r, int top, int max) {
    for (int i = max + 1; i <= top; i++)
        if (!lua_isnil(L, i)) return lt_extra_arg(L, r->name, r->usage, r->hint, i);
    lua_settop(L, max);
    return r->fn(L);
}

static int arity_call(lua_State *L) {
    const lt_reg *r = lua_touserdata(L, lua_upvalueindex(1));
    int top = lua_gettop(L);
    return top > r->max_args ? call_checked(L, r, top, r->max_args) : r->fn(L);
}

/* sizes_at: numbers from there on are one argument (x:view(2, 3)) */
static int arity_sizes_call(lua_State *L) {
    const lt_reg *r = lua_touserdata(L, lua_upvalueindex(1));
    int top = lua_gettop(L), max = r->max_args, k = r->sizes_at;
    if (lua_type(L, k) == LUA_TNUMBER) {
        int j = k + 1;
        while (j <= top && lua_type(L, j) == LUA_TNUMBER) j++;
        max += j - k - 1;
    }
    return top > max ? call_checked(L, r, top, max) : r->fn(L);
}

void lt_push_binding(lua_State *L, const lt_reg *r) {
    if (!r->usage || r->max_args < LT_VARARGS || r->sizes_at < 0)
        luaL_error(L, "needle: binding '%s' has no arity (lt_reg's max_args and usage)", r->name);
    if (r->max_args == LT_VARARGS) {
        lua_pushcfunction(L, r->fn);
    } else {
        lua_pushlightuserdata(L, (void *)r);
        lua_pushcclosure(L, r->sizes_at ? arity_sizes_call : arity_call, 1);
    }
}

void lt_register(lua_State *L, int methods_idx, int module_idx, const lt_reg *regs) {
    methods_idx = lua_absindex(L, methods_idx);
    module_idx = lua_absindex(L, module_idx);
    for (; regs->name; regs++) {
        lt_push_binding(L, regs);
        /* one value for both tables: x.sum == nd.sum, as with bare functions */
        if (regs->method) {
            lua_pushvalue(L, -1);
            lua_setfield(L, methods_idx, regs->name);
        }
        if (regs->function) {
            lua_pushvalue(L, -1);
            lua_setfield(L, module_idx, regs->name);
        }
        lua_pop(L, 1);
    }
}

/* ------------------------------------------------------------ properties */

int lt_index_get(lua_State *L);  /* lt_index.c: x[i], x[{...}] */
int lt_index_set(lua_State *L);

static int push_shape(lua_State *L, const nd_tensor *t) {
    lua_createtable(L, t->ndim, 0);
    for (int i = 0; i < t->ndim; i++) {
        lua_pushinteger(L, t->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* The properties t_index answers, for completion (the metatable's
 * __properties) and for the suggestions of a missing name. */
static const char *const properties[] = {"shape", "dtype", "device", "ndim", "requires_grad", "grad",
                                         "is_leaf", "grad_fn", "T", "mT", NULL};

/* A name that is neither a method nor a property is an error, not nil: a
 * misspelt method would otherwise fail as "attempt to call a nil value",
 * and a misspelt field would read as nil. */
static int missing_name(lua_State *L, const char *k, size_t len) {
    lt_closest c;
    lt_closest_init(&c, k, len);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &methods_key);
    lt_closest_add_keys(L, &c, -1);
    lua_pop(L, 1);
    bool property = false; /* the closest name is a property */
    for (int i = 0; properties[i]; i++)
        if (lt_closest_add(&c, properties[i], strlen(properties[i]))) property = true;
    push_where(L);
    if (c.best[0])
        lua_pushfstring(L, "needle: no %s '%s' on a tensor; did you mean '%s'?", property ? "field" : "method",
                        k, c.best);
    else
        lua_pushfstring(L, "needle: no method or field '%s' on a tensor", k);
    lua_concat(L, 2);
    return lua_error(L);
}

static int t_index(lua_State *L) {
    if (lua_type(L, 2) != LUA_TSTRING) return lt_index_get(L);
    /* methods first: the common case */
    lua_rawgetp(L, LUA_REGISTRYINDEX, &methods_key);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, -2) != LUA_TNIL) return 1;
    nd_tensor *t = lt_check(L, 1, "index"), *r;
    size_t len;
    const char *k = lua_tolstring(L, 2, &len);
    if (strcmp(k, "shape") == 0) return push_shape(L, t);
    if (strcmp(k, "dtype") == 0) { lua_pushstring(L, nd_dtype_name(t->dtype)); return 1; }
    if (strcmp(k, "device") == 0) {
        char buf[32];
        lua_pushstring(L, nd_device_str(nd_get_device(t), buf));
        return 1;
    }
    if (strcmp(k, "ndim") == 0) { lua_pushinteger(L, t->ndim); return 1; }
    if (strcmp(k, "requires_grad") == 0) { lua_pushboolean(L, t->requires_grad); return 1; }
    if (strcmp(k, "grad") == 0) {
        if (t->grad) { nd_retain(t->grad); lt_push(L, t->grad); }
        else lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "is_leaf") == 0) { lua_pushboolean(L, t->grad_fn == NULL); return 1; }
    if (strcmp(k, "grad_fn") == 0) {
        const char *name = nd_grad_fn_name(t);
        if (name) lua_pushstring(L, name); else lua_pushnil(L);
        return 1;
    }
    /* x.T: the dims reversed (PyTorch's; a 0- or 1-dim tensor is itself) */
    if (strcmp(k, "T") == 0) {
        if (t->ndim < 2) { nd_retain(t); lt_push(L, t); return 1; }
        int dims[ND_MAX_DIMS];
        for (int i = 0; i < t->ndim; i++) dims[i] = t->ndim - 1 - i;
        LT_CHECK_AS(L, "T", nd_permute(t, dims, t->ndim, &r));
        lt_push(L, r);
        return 1;
    }
    /* x.mT: the last two dims swapped (a batch of matrices transposed) */
    if (strcmp(k, "mT") == 0) {
        if (t->ndim < 2) {
            char b[ND_SHAPE_BUF];
            return lt_error(L, "mT", "expects a matrix or a batch of matrices (at least 2 dims), got shape %s",
                            nd_shape_str(t->shape, t->ndim, b));
        }
        LT_CHECK_AS(L, "mT", nd_transpose(t, t->ndim - 2, t->ndim - 1, &r));
        lt_push(L, r);
        return 1;
    }
    return missing_name(L, k, len);
}

static int t_newindex(lua_State *L) {
    if (lua_type(L, 2) != LUA_TSTRING) return lt_index_set(L);
    nd_tensor *t = lt_check(L, 1, "newindex");
    const char *k = lua_tostring(L, 2);
    if (strcmp(k, "requires_grad") == 0) {
        LT_CHECK(L, nd_requires_grad_(t, lua_toboolean(L, 3)));
        return 0;
    }
    if (strcmp(k, "grad") == 0) {
        nd_tensor *g = lua_isnil(L, 3) ? NULL : lt_check(L, 3, "grad");
        if (g && g->storage == t->storage)
            lt_error(L, "grad", "a tensor cannot be its own gradient (assign a clone)");
        if (g && g->dtype != t->dtype)
            lt_error(L, "grad", "assigned gradient has dtype %s, expected %s",
                     nd_dtype_name(g->dtype), nd_dtype_name(t->dtype));
        LT_CHECK(L, nd_set_grad(t, g));
        return 0;
    }
    return lt_error(L, "newindex", "cannot set field '%s' on a tensor", k);
}

static int t_close(lua_State *L) { return t_gc(L); }

static int t_len(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "len");
    if (t->ndim == 0) return lt_error(L, "len", "a 0-dim tensor has no length");
    lua_pushinteger(L, t->shape[0]);
    return 1;
}

/* Metadata methods */
static int t_size(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "size");
    if (lua_isnoneornil(L, 2)) return push_shape(L, t);
    int d;
    LT_CHECK(L, nd_norm_dim("size", lt_dim(L, 2, "size"), t->ndim, &d));
    lua_pushinteger(L, t->ndim ? t->shape[d] : 1);
    return 1;
}

static int t_stride(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "stride");
    if (lua_isnoneornil(L, 2)) {
        lua_createtable(L, t->ndim, 0);
        for (int i = 0; i < t->ndim; i++) {
            lua_pushinteger(L, t->strides[i]);
            lua_rawseti(L, -2, i + 1);
        }
        return 1;
    }
    int d;
    LT_CHECK(L, nd_norm_dim("stride", lt_dim(L, 2, "stride"), t->ndim, &d));
    lua_pushinteger(L, t->ndim ? t->strides[d] : 1);
    return 1;
}

static int t_dim(lua_State *L) { lua_pushinteger(L, lt_check(L, 1, "dim")->ndim); return 1; }
static int t_numel(lua_State *L) { lua_pushinteger(L, nd_numel(lt_check(L, 1, "numel"))); return 1; }
/* x:element_size(): bytes per element of x's dtype, as PyTorch's */
static int t_element_size(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)nd_dtype_size(lt_check(L, 1, "element_size")->dtype));
    return 1;
}
static int t_is_contiguous(lua_State *L) {
    lua_pushboolean(L, nd_is_contiguous(lt_check(L, 1, "is_contiguous")));
    return 1;
}
static int t_storage_offset(lua_State *L) {
    lua_pushinteger(L, lt_check(L, 1, "storage_offset")->offset);
    return 1;
}
/* True when both tensors view the same storage (for specs and debugging). */
static int t_shares_storage(lua_State *L) {
    nd_tensor *a = lt_check(L, 1, "shares_storage"), *b = lt_check(L, 2, "shares_storage");
    lua_pushboolean(L, a->storage == b->storage);
    return 1;
}
static int t_is_tensor(lua_State *L) {
    lua_pushboolean(L, to_box(L, 1) != NULL);
    return 1;
}
static int t_requires_grad_(lua_State *L) {
    lua_settop(L, 2);
    if (lua_isnone(L, 2) || lua_isnil(L, 2)) { lua_pushboolean(L, 1); lua_replace(L, 2); }
    lua_pushstring(L, "requires_grad");
    lua_insert(L, 2);
    t_newindex(L);
    lua_settop(L, 1);
    return 1;
}

void lt_register_tensor(lua_State *L) {
    /* stack: methods, module */
    static const lt_reg regs[] = {
        {"size", t_size, true, false, 2, "x[, dim]"},
        {"stride", t_stride, true, false, 2, "x[, dim]"},
        {"dim", t_dim, true, false, 1, "x"},
        {"ndimension", t_dim, true, false, 1, "x"},
        {"numel", t_numel, true, true, 1, "x"},
        {"nelement", t_numel, true, false, 1, "x"},
        {"element_size", t_element_size, true, false, 1, "x"},
        {"is_contiguous", t_is_contiguous, true, false, 1, "x"},
        {"storage_offset", t_storage_offset, true, false, 1, "x"},
        {"shares_storage", t_shares_storage, true, false, 2, "x, other"},
        {"requires_grad_", t_requires_grad_, true, false, 2, "x[, requires_grad]"},
        {"is_tensor", t_is_tensor, false, true, 1, "value"},
        {"_closest", lt_closest_fn, false, true, 2, "word, names"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
    /* metatable: __index dispatches to methods (registry) and properties */
    lua_newtable(L);
    lua_pushcfunction(L, t_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, t_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, t_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, t_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, t_len);
    lua_setfield(L, -2, "__len");
    lua_pushstring(L, "needle.Tensor");
    lua_setfield(L, -2, "__name");
    lua_pushvalue(L, -3); /* methods, for completion and Lua-side extension */
    lua_setfield(L, -2, "__methods");
    lua_newtable(L); /* property names, for completion */
    for (int i = 0; properties[i]; i++) {
        lua_pushstring(L, properties[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "__properties");
    register_metatable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &mt_key);
    lua_pushvalue(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &methods_key);
}

/* The metatable, for the module to expose and for metamethod registration. */
void lt_push_metatable(lua_State *L) { lua_rawgetp(L, LUA_REGISTRYINDEX, &mt_key); }
