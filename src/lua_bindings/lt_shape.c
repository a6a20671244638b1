/* lt_shape.c - views (view, reshape, permute, transpose, expand, select,
 * narrow, slice, squeeze, unsqueeze, flatten), conversions, and joining
 * and splitting (cat, stack, split, chunk, flip, pad). */
#include <string.h>
#include "lt_internal.h"

/* r is read only after st was computed (argument order is unspecified). */
static int push_result(lua_State *L, nd_status st, nd_tensor **r) {
    LT_CHECK(L, st);
    lt_push(L, *r);
    return 1;
}

/* Conversions that change nothing return the very same Lua object, as
 * PyTorch's x.to(x.dtype) returns x. */
static int push_converted(lua_State *L, nd_status st, nd_tensor *x, nd_tensor **r) {
    LT_CHECK(L, st);
    if (*r == x) {
        nd_release(*r);
        lua_pushvalue(L, 1);
        return 1;
    }
    lt_push(L, *r);
    return 1;
}

static int t_view(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "view"), *r;
    int64_t shape[ND_MAX_DIMS];
    int n = lt_shape(L, 2, "view", shape, true);
    return push_result(L, nd_view(x, shape, n, &r), &r);
}

static int t_reshape(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "reshape"), *r;
    int64_t shape[ND_MAX_DIMS];
    int n = lt_shape(L, 2, "reshape", shape, true);
    return push_result(L, nd_reshape(x, shape, n, &r), &r);
}

static int t_view_as(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "view_as"), *o = lt_check(L, 2, "view_as"), *r;
    return push_result(L, nd_view(x, o->shape, o->ndim, &r), &r);
}

static int t_permute(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "permute"), *r;
    int dims[ND_MAX_DIMS], n = 0;
    if (lua_istable(L, 2)) n = lt_dims(L, 2, "permute", dims);
    else
        for (int i = 2; i <= lua_gettop(L) && n < ND_MAX_DIMS; i++) dims[n++] = lt_dim(L, i, "permute");
    return push_result(L, nd_permute(x, dims, n, &r), &r);
}

static int t_transpose(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "transpose"), *r;
    int a = lt_dim(L, 2, "transpose"), b = lt_dim(L, 3, "transpose");
    return push_result(L, nd_transpose(x, a, b, &r), &r);
}

/* t(): transpose of a matrix (<= 2 dims) */
static int t_t(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "t"), *r;
    if (x->ndim > 2) {
        char b[ND_SHAPE_BUF];
        return lt_error(L, "t", "expects a tensor with at most 2 dims, got shape %s (use transpose)",
                        nd_shape_str(x->shape, x->ndim, b));
    }
    if (x->ndim < 2) { nd_retain(x); lt_push(L, x); return 1; }
    return push_result(L, nd_transpose(x, 0, 1, &r), &r);
}

static int t_expand(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "expand"), *r;
    int64_t shape[ND_MAX_DIMS];
    int n = lt_shape(L, 2, "expand", shape, true);
    return push_result(L, nd_expand(x, shape, n, &r), &r);
}

static int t_expand_as(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "expand_as"), *o = lt_check(L, 2, "expand_as"), *r;
    return push_result(L, nd_expand(x, o->shape, o->ndim, &r), &r);
}

/* 1-based index (negative from the end) -> 0-based, range-checked by core */
static int64_t index_value(lua_State *L, int idx, const char *op) {
    lua_Integer i = luaL_checkinteger(L, idx);
    if (i == 0) lt_error(L, op, "index 0 is invalid (indices are 1-based; -1 is the last)");
    return i > 0 ? i - 1 : i;
}

static int t_select(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "select"), *r;
    int d = lt_dim(L, 2, "select");
    int64_t i = index_value(L, 3, "select");
    return push_result(L, nd_select(x, d, i, &r), &r);
}

/* narrow(dim, start, length) with a 1-based start */
static int t_narrow(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "narrow"), *r;
    int d = lt_dim(L, 2, "narrow");
    int64_t s = index_value(L, 3, "narrow");
    lua_Integer len = luaL_checkinteger(L, 4);
    return push_result(L, nd_narrow(x, d, s, len, &r), &r);
}

/* slice(dim, first, last[, step]): inclusive 1-based range, as x[{..., {first, last, step}}] */
static int t_slice(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "slice"), *r;
    int d = lt_dim(L, 2, "slice"), cd;
    LT_CHECK(L, nd_norm_dim("slice", d, x->ndim, &cd));
    int64_t n = x->ndim ? x->shape[cd] : 1;
    lua_Integer first = luaL_optinteger(L, 3, 1), last = luaL_optinteger(L, 4, -1);
    lua_Integer step = luaL_optinteger(L, 5, 1);
    if (first == 0 || last == 0) return lt_error(L, "slice", "index 0 is invalid (indices are 1-based)");
    int64_t s = first > 0 ? first - 1 : first + n, e = last > 0 ? last : last + n + 1;
    if (s < 0 || s > n || e > n || e < 0)
        return lt_error(L, "slice", "range {%lld, %lld} out of bounds for dim %d of size %lld",
                        (long long)first, (long long)last, cd + 1, (long long)n);
    return push_result(L, nd_slice(x, cd, s, e, step, &r), &r);
}

static int t_squeeze(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "squeeze"), *r;
    if (lua_isnoneornil(L, 2)) return push_result(L, nd_squeeze_all(x, &r), &r);
    return push_result(L, nd_squeeze(x, lt_dim(L, 2, "squeeze"), &r), &r);
}

static int t_unsqueeze(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "unsqueeze"), *r;
    return push_result(L, nd_unsqueeze(x, lt_dim(L, 2, "unsqueeze"), &r), &r);
}

static int t_flatten(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "flatten"), *r;
    int s = lt_opt_dim(L, 2, "flatten", 0), e = lt_opt_dim(L, 3, "flatten", -1);
    return push_result(L, nd_flatten(x, s, e, &r), &r);
}

static int t_contiguous(lua_State *L) {
    nd_tensor *r;
    return push_result(L, nd_contiguous(lt_check(L, 1, "contiguous"), &r), &r);
}

static int t_clone(lua_State *L) {
    nd_tensor *r;
    return push_result(L, nd_clone(lt_check(L, 1, "clone"), &r), &r);
}

/* to("float64"), to("cpu"), to({dtype=, device=}) */
static int t_to(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "to"), *r;
    nd_dtype dt = x->dtype;
    nd_device dev = nd_get_device(x);
    if (lua_type(L, 2) == LUA_TSTRING) {
        const char *s = lua_tostring(L, 2);
        if (strcmp(s, "cpu") == 0 || strncmp(s, "opencl", 6) == 0) dev = lt_device_name(L, 2, "to");
        else dt = lt_check_dtype_name(L, 2, "to");
    } else if (lua_istable(L, 2)) {
        static const char *const valid[] = {"dtype", "device", NULL};
        lt_options(L, 2, "to", valid);
        dev = lt_opt_device(L, 2, "to", dev);
        dt = lt_opt_dtype(L, 2, "to", dt);
    } else {
        return lt_error(L, "to", "expected a dtype or device name or an options table, got %s",
                        luaL_typename(L, 2));
    }
    nd_tensor *m;
    LT_CHECK_AS(L, "to", nd_to_device(x, dev, &m));
    lt_push(L, m); /* owned by the stack */
    LT_CHECK_AS(L, "to", nd_to_dtype(m, dt, &r));
    if (r == x) { /* nothing to do: x itself, as PyTorch */
        nd_release(r);
        lua_pushvalue(L, 1);
        return 1;
    }
    lt_push(L, r);
    return 1;
}

/* x:set_data_(y): x takes y's memory, shape and dtype (PyTorch's x.data = y) */
static int t_set_data(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "set_data_"), *y = lt_check(L, 2, "set_data_");
    if (nd_graph_capturing()) /* a replay would keep using the old storage */
        return lt_error(L, "set_data_", "cannot run inside a compiled function (it swaps the "
                        "tensor's memory, which a replay cannot follow)");
    LT_CHECK_AS(L, "set_data_", nd_set_data_(x, y));
    lua_settop(L, 1);
    return 1;
}

/* x:cpu() */
static int t_cpu(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "cpu"), *r;
    LT_CHECK_AS(L, "cpu", nd_to_device(x, nd_cpu_device(), &r));
    lt_push(L, r);
    return 1;
}

static int convert(lua_State *L, nd_dtype dt, const char *op) {
    nd_tensor *x = lt_check(L, 1, op), *r;
    return push_converted(L, nd_to_dtype(x, dt, &r), x, &r);
}
static int t_float(lua_State *L) { return convert(L, ND_FLOAT32, "float"); }
static int t_double(lua_State *L) { return convert(L, ND_FLOAT64, "double"); }
static int t_long(lua_State *L) { return convert(L, ND_INT64, "long"); }
static int t_int(lua_State *L) { return convert(L, ND_INT32, "int"); }
static int t_byte(lua_State *L) { return convert(L, ND_UINT8, "byte"); }
static int t_bool(lua_State *L) { return convert(L, ND_BOOL, "bool"); }
static int t_half(lua_State *L) { return convert(L, ND_FLOAT16, "half"); }
static int t_bfloat16(lua_State *L) { return convert(L, ND_BFLOAT16, "bfloat16"); }

/* --------------------------------------------------------- join and split */

/* Reads a list of tensors (the table at idx) into ts; returns count. Raw
 * access only: no __len/__index code can run, change the length between
 * reads or hand out tensors that nothing keeps alive - every pointer is
 * anchored by the table itself for the duration of the call. */
static int tensor_list(lua_State *L, int idx, const char *op, nd_tensor **ts, int max) {
    if (!lua_istable(L, idx))
        lt_error(L, op, "expected a table of tensors, got %s", luaL_typename(L, idx));
    lua_Unsigned n = lua_rawlen(L, idx);
    if (n == 0) lt_error(L, op, "expected a non-empty list of tensors");
    if (n > (lua_Unsigned)max) lt_error(L, op, "too many tensors (%llu, at most %d)", (unsigned long long)n, max);
    for (int i = 0; i < (int)n; i++) {
        lua_rawgeti(L, idx, i + 1);
        ts[i] = lt_to(L, -1);
        if (!ts[i]) lt_error(L, op, "element %d of the list is a %s, expected a tensor", i + 1,
                             luaL_typename(L, -1));
        lua_pop(L, 1);
    }
    return (int)n;
}

#define MAX_JOIN 4096

static int join(lua_State *L, bool stack) {
    const char *op = stack ? "stack" : "cat";
    nd_tensor *buf[64], **ts = buf, *r;
    int d = lt_opt_dim(L, 2, op, 0); /* before the buffer below lands at index 2 when dim is absent */
    lua_Unsigned len = lua_istable(L, 1) ? lua_rawlen(L, 1) : 0;
    if (len > 64 && len <= MAX_JOIN) ts = lua_newuserdatauv(L, sizeof(nd_tensor *) * (size_t)len, 0);
    int n = tensor_list(L, 1, op, ts, len > 64 ? MAX_JOIN : 64);
    nd_status st = stack ? nd_stack(ts, n, d, &r) : nd_cat(ts, n, d, &r);
    return push_result(L, st, &r);
}
static int l_cat(lua_State *L) { return join(L, false); }
static int l_stack(lua_State *L) { return join(L, true); }

/* split(size | {sizes}, dim) -> list of views along dim */
static int t_split(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "split");
    int d = lt_opt_dim(L, 3, "split", 0), cd;
    LT_CHECK(L, nd_norm_dim("split", d, x->ndim, &cd));
    if (x->ndim == 0) return lt_error(L, "split", "cannot split a 0-dim tensor");
    int64_t len = x->shape[cd];
    lua_newtable(L);
    int out = lua_gettop(L);
    int64_t start = 0;
    if (lua_istable(L, 2)) {
        int n = (int)luaL_len(L, 2);
        int64_t total = 0;
        for (int i = 1; i <= n; i++) {
            lua_geti(L, 2, i);
            lua_Integer s = luaL_checkinteger(L, -1);
            lua_pop(L, 1);
            if (s < 0) return lt_error(L, "split", "split sizes must be >= 0, got %lld", (long long)s);
            if (s > len - total)
                return lt_error(L, "split", "split sizes add up to more than dim %d's size %lld",
                                cd + 1, (long long)len);
            total += s;
        }
        if (total != len)
            return lt_error(L, "split", "split sizes sum to %lld but dim %d has size %lld",
                            (long long)total, cd + 1, (long long)len);
        for (int i = 1; i <= n; i++) {
            lua_geti(L, 2, i);
            int64_t s = lua_tointeger(L, -1);
            lua_pop(L, 1);
            nd_tensor *r;
            LT_CHECK(L, nd_narrow(x, cd, start, s, &r));
            lt_push(L, r);
            lua_rawseti(L, out, i);
            start += s;
        }
        return 1;
    }
    lua_Integer size = luaL_checkinteger(L, 2);
    if (size <= 0) return lt_error(L, "split", "split size must be positive, got %lld", (long long)size);
    for (int i = 1; start < len || (len == 0 && i == 1); i++) {
        int64_t s = len - start < size ? len - start : size;
        nd_tensor *r;
        LT_CHECK(L, nd_narrow(x, cd, start, s, &r));
        lt_push(L, r);
        lua_rawseti(L, out, i);
        start += s;
        if (len == 0) break;
    }
    return 1;
}

/* chunk(n, dim): n pieces of ceil(size / n) (the last may be smaller) */
static int t_chunk(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "chunk");
    lua_Integer n = luaL_checkinteger(L, 2);
    if (n <= 0) return lt_error(L, "chunk", "number of chunks must be positive, got %lld", (long long)n);
    int d = lt_opt_dim(L, 3, "chunk", 0), cd;
    LT_CHECK(L, nd_norm_dim("chunk", d, x->ndim, &cd));
    if (x->ndim == 0) return lt_error(L, "chunk", "cannot chunk a 0-dim tensor");
    int64_t len = x->shape[cd], size = len / n + (len % n != 0); /* ceil without overflow */
    lua_settop(L, 1);
    lua_pushinteger(L, size > 0 ? size : 1);
    lua_pushinteger(L, cd + 1);
    return t_split(L);
}

static int t_flip(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "flip"), *r;
    int dims[ND_MAX_DIMS], n;
    if (lua_istable(L, 2)) n = lt_dims(L, 2, "flip", dims);
    else {
        n = 0;
        for (int i = 2; i <= lua_gettop(L) && n < ND_MAX_DIMS; i++) dims[n++] = lt_dim(L, i, "flip");
    }
    if (n == 0) return lt_error(L, "flip", "expected at least one dim");
    return push_result(L, nd_flip(x, dims, n, &r), &r);
}

/* pad({left, right, top, bottom, ...}, value): pairs from the last dim, as F.pad */
static int t_pad(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "pad"), *r;
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = (int)luaL_len(L, 2);
    if (n % 2 != 0 || n / 2 > x->ndim || n == 0)
        return lt_error(L, "pad", "expected an even number of pad sizes (2 per dim, at most %d), got %d",
                        2 * x->ndim, n);
    int64_t pads[2 * ND_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        lua_geti(L, 2, i + 1);
        pads[i] = luaL_checkinteger(L, -1);
        lua_pop(L, 1);
    }
    double v = luaL_optnumber(L, 3, 0);
    return push_result(L, nd_pad(x, pads, n / 2, v, &r), &r);
}

void lt_register_shape(lua_State *L) {
    /* view, reshape, expand and broadcast_to take a shape, permute and flip
     * dims, as a table or as numbers (sizes_at 2) */
    static const lt_reg regs[] = {
        {"view", t_view, true, false, 2, "x, size... | {sizes}", NULL, 2},
        {"reshape", t_reshape, true, true, 2, "x, size... | {sizes}", NULL, 2},
        {"view_as", t_view_as, true, false, 2, "x, other"},
        {"permute", t_permute, true, true, 2, "x, dim... | {dims}", NULL, 2},
        {"transpose", t_transpose, true, true, 3, "x, dim0, dim1"},
        {"t", t_t, true, false, 1, "x"},
        {"expand", t_expand, true, false, 2, "x, size... | {sizes}", NULL, 2},
        {"broadcast_to", t_expand, true, true, 2, "x, size... | {sizes}", NULL, 2},
        {"expand_as", t_expand_as, true, false, 2, "x, other"},
        {"select", t_select, true, true, 3, "x, dim, index"},
        {"narrow", t_narrow, true, true, 4, "x, dim, start, length"},
        {"slice", t_slice, true, false, 5, "x, dim[, first, last, step]"},
        {"squeeze", t_squeeze, true, true, 2, "x[, dim]"},
        {"unsqueeze", t_unsqueeze, true, true, 2, "x, dim"},
        {"flatten", t_flatten, true, true, 3, "x[, start_dim, end_dim]"},
        {"contiguous", t_contiguous, true, false, 1, "x"},
        {"clone", t_clone, true, true, 1, "x"},
        {"to", t_to, true, false, 2, "x, dtype | device | opts"},
        {"cpu", t_cpu, true, false, 1, "x"},
        {"set_data_", t_set_data, true, false, 2, "x, other"},
        {"float", t_float, true, false, 1, "x"},
        {"double", t_double, true, false, 1, "x"},
        {"long", t_long, true, false, 1, "x"},
        {"int", t_int, true, false, 1, "x"},
        {"byte", t_byte, true, false, 1, "x"},
        {"bool", t_bool, true, false, 1, "x"},
        {"half", t_half, true, false, 1, "x"},
        {"bfloat16", t_bfloat16, true, false, 1, "x"},
        {"cat", l_cat, false, true, 2, "tensors[, dim]"},
        {"concat", l_cat, false, true, 2, "tensors[, dim]"},
        {"stack", l_stack, false, true, 2, "tensors[, dim]"},
        {"split", t_split, true, true, 3, "x, size | {sizes}[, dim]"},
        {"chunk", t_chunk, true, true, 3, "x, chunks[, dim]"},
        {"flip", t_flip, true, true, 2, "x, dim... | {dims}", NULL, 2},
        {"pad", t_pad, true, true, 3, "x, pads[, value]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
