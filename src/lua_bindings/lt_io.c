/* lt_io.c - binary I/O for Lua: raw bytes <-> tensors, gzip reads, atomic
 * writes, the safetensors reader/writer under needle.serialize, what a file
 * is (its format, its type) and the check every path argument gets. Results
 * the core hands over (buffers, headers, tensor arrays) sit in a holder
 * userdata while Lua values are built, so a Lua error (out of memory) in
 * between cannot leak them. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "io/io.h"
#include "io/safetensors.h"
#include "lt_internal.h"

#define HOLDER_MT "needle.io_holder"

typedef struct {
    char *buf;
    nd_st_header *h;
    nd_tensor **ts;
    size_t nts;
} io_holder;

static int holder_gc(lua_State *L) {
    io_holder *o = luaL_checkudata(L, 1, HOLDER_MT);
    free(o->buf);
    nd_st_header_free(o->h);
    nd_st_free_tensors(o->ts, o->nts);
    memset(o, 0, sizeof *o);
    return 0;
}

static io_holder *new_holder(lua_State *L) {
    io_holder *o = lua_newuserdatauv(L, sizeof *o, 0);
    memset(o, 0, sizeof *o);
    luaL_setmetatable(L, HOLDER_MT);
    return o;
}

static const char *check_string(lua_State *L, int idx, const char *op, const char *what, size_t *len) {
    if (lua_type(L, idx) != LUA_TSTRING)
        lt_error(L, op, "%s must be a string, got %s", what, luaL_typename(L, idx));
    return lua_tolstring(L, idx, len);
}

const char *lt_check_path(lua_State *L, int idx, const char *op) {
    size_t n;
    const char *path = check_string(L, idx, op, "path", &n);
    if (n == 0) lt_error(L, op, "path is empty");
    /* the C library would stop at the NUL and open another file */
    const char *nul = memchr(path, 0, n);
    if (nul) lt_error(L, op, "path '%s\\0...' contains a NUL byte (at byte %d of %d)", path, (int)(nul - path) + 1, (int)n);
    return path;
}

/* nd.frombytes(s, dtype[, shape]): shape defaults to 1-D of #s / element size */
static int l_frombytes(lua_State *L) {
    size_t n;
    const char *s = check_string(L, 1, "frombytes", "data (argument 1)", &n);
    nd_dtype dt = lt_check_dtype_name(L, 2, "frombytes");
    int64_t shape[ND_MAX_DIMS];
    int nd;
    if (lua_isnoneornil(L, 3)) {
        size_t es = nd_dtype_size(dt);
        if (n % es != 0)
            return lt_error(L, "frombytes", "%zu bytes is not a whole number of %s elements (%zu bytes each)",
                            n, nd_dtype_name(dt), es);
        shape[0] = (int64_t)(n / es);
        nd = 1;
    } else {
        if (!lua_istable(L, 3))
            return lt_error(L, "frombytes", "shape (argument 3) must be a table, got %s", luaL_typename(L, 3));
        nd = lt_shape(L, 3, "frombytes", shape, false);
    }
    nd_tensor *t;
    LT_CHECK(L, nd_from_bytes("frombytes", s, n, shape, nd, dt, &t));
    lt_push(L, t);
    return 1;
}

/* The string of tobytes for the host tensor at 1 (run under lua_pcall: the
 * string may be too large for Lua's allocator). */
static int tobytes_build(lua_State *L) {
    nd_tensor *t = lt_to(L, 1);
    size_t nbytes = (size_t)nd_numel(t) * nd_dtype_size(t->dtype);
    if (nd_is_contiguous(t)) {
        lua_pushlstring(L, nbytes ? nd_ptr(t) : "", nbytes);
        return 1;
    }
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, nbytes);
    LT_CHECK_AS(L, "tobytes", nd_copy_to_buffer(t, p, nbytes));
    luaL_pushresultsize(&b, nbytes);
    return 1;
}

/* t:tobytes(): the elements, row-major, as a string of raw little-endian bytes */
static int t_tobytes(lua_State *L) {
    nd_tensor *t = lt_check(L, 1, "tobytes");
    /* An expanded view can stand for far more bytes than it holds; Lua's
     * allocator would zero-fill them where the kernel overcommits, so the
     * string is held to the bound tensors are held to (nd_memory_limit). */
    uint64_t nbytes = (uint64_t)nd_numel(t) * nd_dtype_size(t->dtype);
    if (nbytes > (uint64_t)nd_memory_limit()) {
        char b[ND_SHAPE_BUF], want[ND_BYTES_BUF], have[ND_BYTES_BUF];
        return lt_error(L, "tobytes", "a string of %llu bytes (%s, a %s tensor of shape %s) is more than "
                        "the %s of memory this process can have (%s)", (unsigned long long)nbytes,
                        nd_bytes_str(nbytes, want), nd_dtype_name(t->dtype), nd_shape_str(t->shape, t->ndim, b),
                        nd_bytes_str((uint64_t)nd_memory_limit(), have), nd_memory_limit_source());
    }
    t = lt_push_host(L, t, "tobytes");
    lua_pushcfunction(L, tobytes_build);
    lua_pushvalue(L, -2);
    int st = lua_pcall(L, 1, 1, 0);
    if (st == LUA_ERRMEM) { /* Lua's bare "not enough memory": say what did not fit */
        char b[ND_SHAPE_BUF];
        return lt_error(L, "tobytes", "not enough memory for a string of %llu bytes (a %s tensor "
                        "of shape %s)", (unsigned long long)nd_numel(t) * nd_dtype_size(t->dtype),
                        nd_dtype_name(t->dtype), nd_shape_str(t->shape, t->ndim, b));
    }
    if (st != LUA_OK) return lua_error(L);
    return 1;
}

/* nd.gunzip(path[, max_bytes]) */
static int l_gunzip(lua_State *L) {
    const char *path = lt_check_path(L, 1, "gunzip");
    uint64_t max = ND_GUNZIP_DEFAULT_MAX;
    if (!lua_isnoneornil(L, 2)) {
        if (!lua_isinteger(L, 2) || lua_tointeger(L, 2) < 0)
            return lt_error(L, "gunzip", "max_bytes must be a non-negative integer");
        max = (uint64_t)lua_tointeger(L, 2);
    }
    io_holder *o = new_holder(L);
    size_t len;
    LT_CHECK(L, nd_gunzip("gunzip", path, max, &o->buf, &len));
    lua_pushlstring(L, o->buf, len);
    free(o->buf);
    o->buf = NULL;
    return 1;
}

/* nd.write_file_atomic(path, data) */
static int l_write_file_atomic(lua_State *L) {
    const char *path = lt_check_path(L, 1, "write_file_atomic");
    size_t n;
    const char *data = check_string(L, 2, "write_file_atomic", "data", &n);
    LT_CHECK(L, nd_write_file_atomic("write_file_atomic", path, data, n));
    return 0;
}

/* ------------------------------------------------------------ safetensors */

static void push_shape(lua_State *L, const int64_t *shape, int ndim) {
    lua_createtable(L, ndim, 0);
    for (int i = 0; i < ndim; i++) {
        lua_pushinteger(L, shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

static void push_metadata(lua_State *L, const nd_st_header *h) {
    lua_createtable(L, 0, (int)(h->nmeta < 1000000 ? h->nmeta : 0));
    for (size_t i = 0; i < h->nmeta; i++) {
        lua_pushlstring(L, h->meta_keys[i], h->meta_key_lens[i]);
        lua_pushlstring(L, h->meta_values[i], h->meta_value_lens[i]);
        lua_rawset(L, -3);
    }
}

/* core._safetensors_load(path[, op]) -> {name = tensor}, {key = value} */
static int l_st_load(lua_State *L) {
    const char *op = luaL_optstring(L, 2, "load");
    const char *path = lt_check_path(L, 1, op);
    io_holder *o = new_holder(L);
    nd_st_header *h;
    nd_tensor **ts;
    LT_CHECK(L, nd_st_load_file(op, path, &h, &ts));
    o->h = h;
    o->ts = ts;
    o->nts = h->ntensors;
    lua_createtable(L, 0, (int)(h->ntensors < 1000000 ? h->ntensors : 0));
    for (size_t i = 0; i < h->ntensors; i++) {
        lua_pushlstring(L, h->tensors[i].name, h->tensors[i].name_len);
        lt_push(L, ts[i]);
        ts[i] = NULL; /* the userdata owns it now */
        lua_rawset(L, -3);
    }
    push_metadata(L, h);
    return 2;
}

/* core._safetensors_header(path[, op]) -> {name = {dtype=, shape=, data_offsets={b, e}}}, metadata
 * (offsets 0-based into the byte buffer, which starts at data_start). Reads no tensor data. */
static int l_st_header(lua_State *L) {
    const char *op = luaL_optstring(L, 2, "read_header");
    const char *path = lt_check_path(L, 1, op);
    io_holder *o = new_holder(L);
    LT_CHECK(L, nd_st_read_header_file(op, path, &o->h));
    const nd_st_header *h = o->h;
    lua_createtable(L, 0, (int)(h->ntensors < 1000000 ? h->ntensors : 0));
    for (size_t i = 0; i < h->ntensors; i++) {
        const nd_st_info *t = &h->tensors[i];
        lua_pushlstring(L, t->name, t->name_len);
        lua_createtable(L, 0, 3);
        lua_pushstring(L, nd_dtype_name(t->dtype));
        lua_setfield(L, -2, "dtype");
        push_shape(L, t->shape, t->ndim);
        lua_setfield(L, -2, "shape");
        lua_createtable(L, 2, 0);
        lua_pushinteger(L, (lua_Integer)t->begin);
        lua_rawseti(L, -2, 1);
        lua_pushinteger(L, (lua_Integer)t->end);
        lua_rawseti(L, -2, 2);
        lua_setfield(L, -2, "data_offsets");
        lua_rawset(L, -3);
    }
    push_metadata(L, h);
    lua_pushinteger(L, (lua_Integer)(8 + h->header_len));
    return 3;
}

/* core._safetensors_save(path, {name = tensor}, {key = value} or nil[, op]) */
static int l_st_save(lua_State *L) {
    const char *op = luaL_optstring(L, 4, "save");
    const char *path = lt_check_path(L, 1, op);
    if (!lua_istable(L, 2)) return lt_error(L, op, "expected a table of tensors, got %s", luaL_typename(L, 2));
    if (!lua_isnoneornil(L, 3) && !lua_istable(L, 3))
        return lt_error(L, op, "metadata must be a table of strings, got %s", luaL_typename(L, 3));
    lua_settop(L, 3);
    size_t n = 0, nm = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lua_pop(L, 1);
        n++;
    }
    if (lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            lua_pop(L, 1);
            nm++;
        }
    }
    /* arrays owned by the GC; names and values stay alive in the argument tables */
    nd_st_entry *entries = lua_newuserdatauv(L, (n ? n : 1) * sizeof *entries, 0);
    nd_st_meta *meta = lua_newuserdatauv(L, (nm ? nm : 1) * sizeof *meta, 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pushvalue(L, -2);
            return lt_error(L, op, "tensor names must be strings, got a %s key (%s)", luaL_typename(L, -3),
                            luaL_tolstring(L, -1, NULL));
        }
        const char *name = lua_tolstring(L, -2, &entries[i].name_len);
        nd_tensor *t = lt_to(L, -1);
        if (!t) return lt_error(L, op, "value for '%s' is a %s, not a tensor", name, luaL_typename(L, -1));
        if (i >= n) return lt_error(L, op, "the tensor table changed while it was read");
        entries[i].name = name;
        entries[i].tensor = t;
        i++;
        lua_pop(L, 1);
    }
    n = i;
    i = 0;
    if (nm > 0) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            if (lua_type(L, -2) != LUA_TSTRING)
                return lt_error(L, op, "metadata keys must be strings, got a %s key", luaL_typename(L, -2));
            const char *key = lua_tolstring(L, -2, &meta[i].key_len);
            if (lua_type(L, -1) != LUA_TSTRING)
                return lt_error(L, op, "metadata value for '%s' must be a string, got %s", key,
                                luaL_typename(L, -1));
            if (i >= nm) return lt_error(L, op, "the metadata table changed while it was read");
            meta[i].key = key;
            meta[i].value = lua_tolstring(L, -1, &meta[i].value_len);
            i++;
            lua_pop(L, 1);
        }
        nm = i;
    }
    LT_CHECK(L, nd_st_save_file(op, path, entries, n, meta, nm));
    return 0;
}

/* ------------------------------------------------------------ what a file is */

/* core._file_format(path[, op]) -> "safetensors" | "zip" | "torch_legacy" | "unknown"
 * (io.h: nd_detect_format); a file that cannot be opened is an error. */
static int l_file_format(lua_State *L) {
    const char *op = luaL_optstring(L, 2, "load");
    const char *path = lt_check_path(L, 1, op);
    nd_io_src src;
    LT_CHECK(L, nd_src_open(op, path, &src));
    nd_file_format f;
    nd_status st = nd_detect_format(&src, &f);
    nd_src_close(&src);
    LT_CHECK(L, st);
    lua_pushstring(L, nd_file_format_name(f));
    return 1;
}

/* core._file_type(path[, op]) -> "file" | "directory" | "fifo" | "character device" |
 * "block device" | "socket" | "other", or nil, message when it cannot be
 * stat'ed. Nothing is opened (opening a FIFO would wait for a writer). */
static int l_file_type(lua_State *L) {
    const char *op = luaL_optstring(L, 2, "file_type");
    const char *path = lt_check_path(L, 1, op);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, strerror(errno));
        return 2;
    }
    const char *t = S_ISREG(sb.st_mode) ? "file" : S_ISDIR(sb.st_mode) ? "directory" : S_ISFIFO(sb.st_mode) ? "fifo"
                  : S_ISCHR(sb.st_mode) ? "character device" : S_ISBLK(sb.st_mode) ? "block device"
                  : S_ISSOCK(sb.st_mode) ? "socket" : "other";
    lua_pushstring(L, t);
    return 1;
}

void lt_register_io(lua_State *L) {
    if (luaL_newmetatable(L, HOLDER_MT)) {
        lua_pushcfunction(L, holder_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    static const lt_reg regs[] = {
        {"frombytes", l_frombytes, false, true},
        {"tobytes", t_tobytes, true, true},
        {"gunzip", l_gunzip, false, true},
        {"write_file_atomic", l_write_file_atomic, false, true},
        {"_safetensors_load", l_st_load, false, true},
        {"_safetensors_header", l_st_header, false, true},
        {"_safetensors_save", l_st_save, false, true},
        {"_file_format", l_file_format, false, true},
        {"_file_type", l_file_type, false, true},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
