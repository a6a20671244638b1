/* lt_torch.c - nd.load_torch(path[, {half_to_float=, max_decompressed_bytes=,
 * max_items=}]): a PyTorch checkpoint
 * (src/io/torch_load.c) as Lua values. dict/OrderedDict -> table (str, int,
 * bool and float keys), list/tuple -> sequence, None -> nd.null (a light
 * userdata: nil cannot be a table value), bool/int/float/str/bytes -> Lua
 * values, tensors -> needle tensors (views of one storage share memory).
 * A container the pickle shares (its memo) becomes one Lua table reached
 * from every place (which would also keep a cycle finite, though the
 * unpickler refuses those). The loaded file sits in
 * a holder userdata while the tables are built, so a Lua error on the way
 * (out of memory, a bad key) leaks nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/torch_load.h"
#include "lt_internal.h"

#define HOLDER_MT "needle.torch_holder"
#define MAX_DEPTH 200 /* nesting of containers in the converted value */

static const char null_sentinel = 0; /* nd.null is its address */

typedef struct { nd_torch_file *f; } torch_holder;

static int holder_gc(lua_State *L) {
    torch_holder *h = luaL_checkudata(L, 1, HOLDER_MT);
    nd_torch_free(h->f);
    h->f = NULL;
    return 0;
}

typedef struct {
    lua_State *L;
    const char *op, *path;
    int memo; /* stack index of {node lightuserdata = Lua value} */
} conv;

static void push_value(conv *c, const nd_pk *v, int depth);

static const char *kind_name(nd_pk_kind k) {
    switch (k) {
    case ND_PK_NONE: return "None";
    case ND_PK_BOOL: return "bool";
    case ND_PK_INT: return "int";
    case ND_PK_FLOAT: return "float";
    case ND_PK_STR: return "str";
    case ND_PK_BYTES: return "bytes";
    case ND_PK_TUPLE: return "tuple";
    case ND_PK_LIST: return "list";
    case ND_PK_DICT: return "dict";
    case ND_PK_GLOBAL: return "global";
    case ND_PK_STORAGE: return "storage";
    case ND_PK_TENSOR: return "tensor";
    }
    return "value";
}

static void push_key(conv *c, const nd_pk *k) {
    lua_State *L = c->L;
    switch (k->kind) {
    case ND_PK_STR: lua_pushlstring(L, k->u.str.s, k->u.str.len); return;
    case ND_PK_INT: lua_pushinteger(L, (lua_Integer)k->u.i); return;
    case ND_PK_BOOL: lua_pushboolean(L, k->u.b); return;
    case ND_PK_FLOAT:
        if (isnan(k->u.f)) lt_error(L, c->op, "'%s': a dict has a NaN key, which Lua tables cannot hold", c->path);
        lua_pushnumber(L, k->u.f);
        return;
    default:
        lt_error(L, c->op, "'%s': a dict has a %s key; only str, int, bool and float keys are supported", c->path,
                 kind_name(k->kind));
    }
}

/* A scalar key for messages: strings with non-printable bytes as \xNN, cut short. */
static const char *show_key(const nd_pk *k, char *buf, size_t cap) {
    if (k->kind == ND_PK_INT) { snprintf(buf, cap, "%lld", (long long)k->u.i); return buf; }
    if (k->kind == ND_PK_FLOAT) { snprintf(buf, cap, "%.17g", k->u.f); return buf; }
    if (k->kind == ND_PK_BOOL) return k->u.b ? "True" : "False";
    if (k->kind != ND_PK_STR && k->kind != ND_PK_BYTES) return kind_name(k->kind);
    size_t o = 0;
    for (size_t i = 0; i < k->u.str.len && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)k->u.str.s[i];
        if (o > 60) { memcpy(buf + o, "...", 3); o += 3; break; }
        if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'') buf[o++] = (char)ch;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
    }
    buf[o] = 0;
    return buf;
}

/* Pushes the value of a container already converted, if any. */
static bool push_memo(conv *c, const nd_pk *v) {
    lua_pushlightuserdata(c->L, (void *)v);
    if (lua_rawget(c->L, c->memo) != LUA_TNIL) return true;
    lua_pop(c->L, 1);
    return false;
}

static void set_memo(conv *c, const nd_pk *v) { /* the value is on top */
    lua_pushlightuserdata(c->L, (void *)v);
    lua_pushvalue(c->L, -2);
    lua_rawset(c->L, c->memo);
}

/* lt_push(t) in protected mode: t is a reference of ours, and lt_push's
 * lua_newuserdatauv can raise (out of memory) before the box owns it. The
 * box holds t once lua_newuserdatauv returns, and nothing after it in
 * lt_push raises, so a failure means t is still ours to release. */
static int push_protected(lua_State *L) {
    lt_push(L, lua_touserdata(L, 1));
    return 1;
}
static void push_owned_tensor(lua_State *L, nd_tensor *t) {
    lua_pushcfunction(L, push_protected);
    lua_pushlightuserdata(L, t);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        nd_release(t);
        lua_error(L);
    }
}

static void push_value(conv *c, const nd_pk *v, int depth) {
    lua_State *L = c->L;
    if (!v) lt_error(L, c->op, "'%s': a missing value in the unpickled data", c->path);
    switch (v->kind) {
    case ND_PK_NONE: lua_pushlightuserdata(L, (void *)&null_sentinel); return;
    case ND_PK_BOOL: lua_pushboolean(L, v->u.b); return;
    case ND_PK_INT: lua_pushinteger(L, (lua_Integer)v->u.i); return;
    case ND_PK_FLOAT: lua_pushnumber(L, v->u.f); return;
    case ND_PK_STR: case ND_PK_BYTES: lua_pushlstring(L, v->u.str.s, v->u.str.len); return;
    case ND_PK_GLOBAL:
        /* torch dtypes appear as values ({"dtype": torch.float16}): their name */
        if (v->u.global.id == ND_PKG_DTYPE) {
            lua_pushstring(L, nd_pk_elem_name(v->u.global.elem));
            return;
        }
        lt_error(L, c->op, "'%s': the value %s cannot be converted to a Lua value", c->path,
                 v->u.global.name ? v->u.global.name : "(a global)");
        return;
    case ND_PK_TENSOR: case ND_PK_STORAGE: {
        if (push_memo(c, v)) return;
        nd_tensor *t;
        if (v->kind == ND_PK_TENSOR) {
            t = nd_torch_tensor(v);
            if (!t) lt_error(L, c->op, "'%s': a tensor was not loaded", c->path);
            nd_retain(t);
        } else {
            LT_CHECK(L, nd_torch_storage_tensor(v, &t));
        }
        push_owned_tensor(L, t);
        set_memo(c, v);
        return;
    }
    case ND_PK_TUPLE: case ND_PK_LIST: case ND_PK_DICT:
        break;
    }
    if (push_memo(c, v)) return;
    if (depth >= MAX_DEPTH)
        lt_error(L, c->op, "'%s': containers nested deeper than %d levels", c->path, MAX_DEPTH);
    if (!lua_checkstack(L, 8)) lt_error(L, c->op, "'%s': out of Lua stack space", c->path);
    if (v->kind == ND_PK_DICT) {
        size_t n = v->u.dict.n;
        lua_createtable(L, 0, n < 1000000 ? (int)n : 0);
        set_memo(c, v);
        for (size_t i = 0; i < n; i++) {
            push_key(c, v->u.dict.keys[i]);
            /* The unpickler merges keys Python finds equal (1, 1.0, True),
             * which Lua's table keys agree with for the kinds push_key
             * takes; should the two ever differ, fail rather than let one
             * value silently replace another. */
            lua_pushvalue(L, -1);
            if (lua_rawget(L, -3) != LUA_TNIL) {
                char kb[100];
                lt_error(L, c->op, "'%s': a dict has two keys that are the same Lua key (%s): one value would be "
                         "lost", c->path, show_key(v->u.dict.keys[i], kb, sizeof kb));
            }
            lua_pop(L, 1);
            push_value(c, v->u.dict.values[i], depth + 1);
            lua_rawset(L, -3);
        }
    } else {
        size_t n = v->u.seq.n;
        lua_createtable(L, n < 1000000 ? (int)n : 0, 0);
        set_memo(c, v);
        for (size_t i = 0; i < n; i++) {
            push_value(c, v->u.seq.items[i], depth + 1);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
    }
}

/* A positive integer option (a budget), or def when absent. */
static uint64_t opt_limit(lua_State *L, int opts, const char *op, const char *name) {
    lua_getfield(L, opts, name);
    uint64_t v = 0;
    if (!lua_isnil(L, -1)) {
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) <= 0)
            lt_error(L, op, "option '%s' must be a positive integer, got %s", name,
                     lua_isinteger(L, -1) ? lua_tostring(L, -1) : luaL_typename(L, -1));
        v = (uint64_t)lua_tointeger(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* core.load_torch(path[, opts[, op]]) */
static int l_load_torch(lua_State *L) {
    const char *op = luaL_optstring(L, 3, "load_torch");
    const char *path = lt_check_path(L, 1, op);
    nd_torch_opts o = {0};
    static const char *const valid[] = {"half_to_float", "max_decompressed_bytes", "max_items", NULL};
    if (lt_options(L, 2, op, valid)) {
        o.half_to_float = lt_opt_bool(L, 2, op, "half_to_float", false);
        o.max_decompressed_bytes = opt_limit(L, 2, op, "max_decompressed_bytes");
        o.max_items = opt_limit(L, 2, op, "max_items");
    }
    lua_settop(L, 1);
    torch_holder *h = lua_newuserdatauv(L, sizeof *h, 0); /* 2 */
    h->f = NULL;
    luaL_setmetatable(L, HOLDER_MT);
    LT_CHECK(L, nd_torch_load(op, path, &o, &h->f));
    lua_newtable(L); /* 3: the memo */
    conv c = {L, op, path, 3};
    push_value(&c, h->f->doc->root, 0);
    /* the tensors hold their own references now */
    nd_torch_free(h->f);
    h->f = NULL;
    return 1;
}

/* nd.null: None in a loaded checkpoint */
static void push_null(lua_State *L) { lua_pushlightuserdata(L, (void *)&null_sentinel); }

void lt_register_torch(lua_State *L) {
    if (luaL_newmetatable(L, HOLDER_MT)) {
        lua_pushcfunction(L, holder_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_pop(L, 1);
    static const lt_reg regs[] = {
        {"load_torch", l_load_torch, false, true, 3, "path[, opts, op]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
    push_null(L);
    lua_setfield(L, -2, "null");
}
