/* lt_io.c - binary I/O for Lua: raw bytes <-> tensors, gzip reads, atomic
 * writes, the safetensors reader/writer under needle.serialize, the JSON
 * codec (io/json.h) under needle.checkpoint's json, what a file is (its
 * format, its type) and the check every path argument gets. Results
 * the core hands over (buffers, headers, tensor arrays) sit in a holder
 * userdata while Lua values are built, so a Lua error (out of memory) in
 * between cannot leak them. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "io/io.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "lt_internal.h"

#define HOLDER_MT "needle.io_holder"

typedef struct {
    char *buf;
    nd_st_header *h;
    nd_tensor **ts;
    size_t nts;
    nd_json_doc *doc;
    nd_json_buf json;
} io_holder;

static int holder_gc(lua_State *L) {
    io_holder *o = luaL_checkudata(L, 1, HOLDER_MT);
    free(o->buf);
    nd_st_header_free(o->h);
    nd_st_free_tensors(o->ts, o->nts);
    nd_json_free(o->doc);
    nd_json_buf_free(&o->json);
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

/* core._image_read(path, channels) -> uint8 tensor (H, W, C); channels 0
 * keeps the file's (needle.image's read) */
static int l_image_read(lua_State *L) {
    const char *path = lt_check_path(L, 1, "image.read");
    lua_Integer c = luaL_optinteger(L, 2, 0);
    if (c != 0 && c != 1 && c != 3) return lt_error(L, "image.read", "channels must be 1 or 3, got %lld", (long long)c);
    nd_tensor *t;
    LT_CHECK(L, nd_image_read("image.read", path, (int)c, &t));
    lt_push(L, t);
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

/* ------------------------------------------------------------ JSON
 * The value mapping of needle.checkpoint's json (see there): strings,
 * booleans, integers and floats (kept apart: 3 and 3.0), arrays (a table
 * that is a non-empty sequence, or has the array metatable the caller
 * passes) and objects (every other table: string keys, written sorted
 * bytewise, so the same value gives the same bytes). Both functions return
 * nil and a message instead of raising, so the Lua side words the error. */

#define JSON_ENCODE_MAX_DEPTH 200 /* tables inside tables; also what stops a table that contains itself */

/* a decoded value: the recursion is bounded by the reader's depth limit */
static void push_json(lua_State *L, const nd_json_doc *d, size_t i, int array_mt) {
    const nd_json_node *j = &d->nodes[i];
    switch (j->type) {
    case ND_JSON_STRING: lua_pushlstring(L, j->str, j->str_len); return;
    case ND_JSON_INT: lua_pushinteger(L, (lua_Integer)j->i); return;
    case ND_JSON_FLOAT: lua_pushnumber(L, (lua_Number)j->f); return;
    case ND_JSON_BOOL: lua_pushboolean(L, j->b); return;
    case ND_JSON_ARRAY: {
        luaL_checkstack(L, 4, "JSON nested too deeply");
        lua_createtable(L, j->count < 1000000 ? (int)j->count : 0, 0);
        lua_Integer k = 1;
        for (size_t c = j->first; c; c = d->nodes[c].next) {
            push_json(L, d, c, array_mt);
            lua_rawseti(L, -2, k++);
        }
        if (array_mt) {
            lua_pushvalue(L, array_mt);
            lua_setmetatable(L, -2);
        }
        return;
    }
    case ND_JSON_OBJECT:
        luaL_checkstack(L, 4, "JSON nested too deeply");
        lua_createtable(L, 0, j->count < 1000000 ? (int)j->count : 0);
        for (size_t c = j->first; c; c = d->nodes[c].next) {
            lua_pushlstring(L, d->nodes[c].key, d->nodes[c].key_len);
            push_json(L, d, c, array_mt);
            lua_rawset(L, -3);
        }
        return;
    }
}

/* core._json_decode(s[, array_mt]) -> value, or nil, "<problem> at byte <1-based offset>" */
static int l_json_decode(lua_State *L) {
    size_t n;
    const char *s = check_string(L, 1, "json_decode", "text", &n);
    int array_mt = lua_istable(L, 2) ? 2 : 0;
    io_holder *o = new_holder(L);
    nd_json_error e;
    nd_status st = nd_json_parse(s, n, NULL, &o->doc, &e);
    if (st == ND_ERR_MEMORY) return lt_error(L, "json_decode", "%s", e.msg);
    if (st != ND_OK) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s at byte %I", e.msg, (lua_Integer)e.offset + 1);
        return 2;
    }
    push_json(L, o->doc, 0, array_mt);
    nd_json_free(o->doc); /* now, not when the holder is collected */
    o->doc = NULL;
    return 1;
}

typedef struct {
    lua_State *L;
    nd_json_buf *b;
    int array_mt;
    /* the path to the value being written, for messages: a key or an index per level */
    struct { const char *k; size_t len; lua_Integer i; } path[JSON_ENCODE_MAX_DEPTH + 2];
} encoder;

/* "at the root.a[2].b", as needle.checkpoint has always named values, at
 * most about 80 bytes: the start and the end kept */
static void push_where(encoder *e, int depth) {
    lua_State *L = e->L;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "at the root");
    for (int d = 1; d <= depth; d++) {
        if (e->path[d].k) {
            luaL_addchar(&b, '.');
            luaL_addlstring(&b, e->path[d].k, e->path[d].len);
        } else {
            char t[32];
            snprintf(t, sizeof t, "[%lld]", (long long)e->path[d].i);
            luaL_addstring(&b, t);
        }
    }
    luaL_pushresult(&b);
    size_t n;
    const char *w = lua_tolstring(L, -1, &n);
    if (n > 80) {
        lua_pushlstring(L, w, 38);
        lua_pushliteral(L, "...");
        lua_pushlstring(L, w + n - 38, 38);
        lua_concat(L, 3);
        lua_remove(L, -2);
    }
}

/* leaves the message on the stack and returns false */
static bool enc_fail(encoder *e, int depth, const char *fmt1, const char *fmt2, const char *a, const char *b) {
    lua_State *L = e->L;
    push_where(e, depth);
    const char *w = lua_tostring(L, -1);
    lua_pushfstring(L, fmt1, w);
    if (fmt2) lua_pushfstring(L, fmt2, a, b);
    else lua_pushliteral(L, "");
    lua_concat(L, 2);
    lua_remove(L, -2);
    return false;
}

static bool enc_string(encoder *e, int idx, int depth) {
    size_t n;
    const char *s = lua_tolstring(e->L, idx, &n);
    if (nd_utf8_check((const unsigned char *)s, n) != n)
        return enc_fail(e, depth, "string %s is not valid UTF-8", NULL, NULL, NULL);
    nd_json_string(e->b, s, n);
    return true;
}

typedef struct { const char *k; size_t len; } enc_key;
static int enc_key_cmp(const void *a, const void *b) {
    const enc_key *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->k, y->k, m);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* writes the value at idx (an absolute index) */
static bool enc_value(encoder *e, int idx, int depth) {
    lua_State *L = e->L;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: return enc_string(e, idx, depth);
    case LUA_TBOOLEAN: nd_json_puts(e->b, lua_toboolean(L, idx) ? "true" : "false"); return true;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            nd_json_int(e->b, (int64_t)lua_tointeger(L, idx));
            return true;
        }
        if (!nd_json_float(e->b, (double)lua_tonumber(L, idx))) {
            lua_Number x = lua_tonumber(L, idx);
            return enc_fail(e, depth, "number %s is ", "%s%s, which JSON cannot hold", x != x ? "NaN" : x > 0 ? "inf" : "-inf", "");
        }
        return true;
    case LUA_TTABLE: break;
    default:
        return enc_fail(e, depth, "value %s is a ", "%s%s, which JSON cannot hold", luaL_typename(L, idx), "");
    }
    if (depth > JSON_ENCODE_MAX_DEPTH || !lua_checkstack(L, 8))
        return enc_fail(e, depth, "table %s is nested too deeply (or contains itself)", NULL, NULL, NULL);
    bool array = false;
    if (e->array_mt && lua_getmetatable(L, idx)) {
        array = lua_rawequal(L, -1, e->array_mt);
        lua_pop(L, 1);
    }
    size_t count = 0;
    lua_Unsigned len = lua_rawlen(L, idx);
    if (!array) { /* a non-empty sequence: as many keys as its length */
        lua_pushnil(L);
        while (lua_next(L, idx)) {
            lua_pop(L, 1);
            count++;
        }
        array = count > 0 && count == len;
    }
    if (array) {
        nd_json_puts(e->b, "[");
        for (lua_Unsigned i = 1; i <= len; i++) {
            if (i > 1) nd_json_puts(e->b, ",");
            lua_rawgeti(L, idx, (lua_Integer)i);
            e->path[depth + 1].k = NULL;
            e->path[depth + 1].i = (lua_Integer)i;
            bool ok = enc_value(e, lua_gettop(L), depth + 1);
            if (!ok) {
                lua_remove(L, -2); /* the element, under the message */
                return false;
            }
            lua_pop(L, 1);
        }
        nd_json_puts(e->b, "]");
        return true;
    }
    /* an object: string keys, sorted */
    enc_key *keys = lua_newuserdatauv(L, (count ? count : 1) * sizeof *keys, 0);
    int keys_idx = lua_gettop(L);
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            const char *ty = luaL_typename(L, -1);
            const char *shown = luaL_tolstring(L, -1, NULL);
            bool r = enc_fail(e, depth, "table %s has a ", "%s key (%s): JSON objects take string keys", ty, shown);
            lua_replace(L, keys_idx); /* the message where the keys were; drop the rest */
            lua_settop(L, keys_idx);
            return r;
        }
        keys[n].k = lua_tolstring(L, -1, &keys[n].len);
        n++;
    }
    /* n == count: nothing ran between the two walks that could change the table */
    qsort(keys, n, sizeof *keys, enc_key_cmp);
    nd_json_puts(e->b, "{");
    for (size_t i = 0; i < n; i++) {
        if (i) nd_json_puts(e->b, ",");
        lua_pushlstring(L, keys[i].k, keys[i].len);
        if (nd_utf8_check((const unsigned char *)keys[i].k, keys[i].len) != keys[i].len) {
            bool r = enc_fail(e, depth, "string %s is not valid UTF-8", NULL, NULL, NULL);
            lua_replace(L, keys_idx);
            lua_settop(L, keys_idx);
            return r;
        }
        nd_json_string(e->b, keys[i].k, keys[i].len);
        nd_json_puts(e->b, ":");
        lua_rawget(L, idx);
        e->path[depth + 1].k = keys[i].k;
        e->path[depth + 1].len = keys[i].len;
        bool ok = enc_value(e, lua_gettop(L), depth + 1);
        if (!ok) {
            lua_replace(L, keys_idx);
            lua_settop(L, keys_idx);
            return false;
        }
        lua_pop(L, 1);
    }
    nd_json_puts(e->b, "}");
    lua_pop(L, 1); /* keys */
    return true;
}

/* core._json_encode(value[, array_mt]) -> string, or nil, "<what> at the root.<path> <problem>" */
static int l_json_encode(lua_State *L) {
    lua_settop(L, 2);
    int array_mt = lua_istable(L, 2) ? 2 : 0;
    io_holder *o = new_holder(L); /* frees the buffer if Lua raises (out of memory) */
    encoder *e = lua_newuserdatauv(L, sizeof *e, 0);
    memset(e, 0, sizeof *e);
    e->L = L;
    e->b = &o->json;
    e->array_mt = array_mt;
    if (!enc_value(e, 1, 0)) {
        nd_json_buf_free(&o->json);
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    if (o->json.oom) return lt_error(L, "json_encode", "out of memory writing a JSON text of %zu bytes", o->json.n);
    lua_pushlstring(L, o->json.p ? o->json.p : "", o->json.n);
    nd_json_buf_free(&o->json);
    return 1;
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
        {"frombytes", l_frombytes, false, true, 3, "data, dtype[, shape]"},
        {"tobytes", t_tobytes, true, true, 1, "x"},
        {"gunzip", l_gunzip, false, true, 2, "path[, max_bytes]"},
        {"_image_read", l_image_read, false, true, 2, "path[, channels]"},
        {"write_file_atomic", l_write_file_atomic, false, true, 2, "path, data"},
        {"_safetensors_load", l_st_load, false, true, 2, "path[, op]"},
        {"_safetensors_header", l_st_header, false, true, 2, "path[, op]"},
        {"_safetensors_save", l_st_save, false, true, 4, "path, tensors[, metadata, op]"},
        {"_file_format", l_file_format, false, true, 2, "path[, op]"},
        {"_file_type", l_file_type, false, true, 2, "path[, op]"},
        {"_json_decode", l_json_decode, false, true, 2, "text[, array_mt]"},
        {"_json_encode", l_json_encode, false, true, 2, "value[, array_mt]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
