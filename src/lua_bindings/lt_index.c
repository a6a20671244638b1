/* lt_index.c - x[i], x[{...}] reads and writes, and the index ops
 * (gather, scatter, index_select, index_add, masked_fill, one_hot, cumsum,
 * sort, topk). Lua indices are 1-based: converted here on the way in and
 * out, so the core stays 0-based. */
#include <math.h>
#include <string.h>
#include "lt_internal.h"

/* ------------------------------------------------------- index tensors */

nd_tensor *lt_check_index(lua_State *L, int idx, const char *op) {
    nd_tensor *t = lt_to(L, idx);
    return lt_check_index_on(L, idx, op, t ? nd_get_device(t) : nd_cpu_device());
}

/* The integers at idx (an integer tensor, or a number or table of them) as
 * a private contiguous int64 tensor in host memory, pushed, for the caller
 * to check and shift in place; *dev is where they belong (the tensor's own
 * device, else target). */
static nd_tensor *host_ints(lua_State *L, int idx, const char *op, const char *what,
                            nd_device target, nd_device *dev) {
    nd_tensor *t = lt_to(L, idx), *r;
    *dev = t ? nd_get_device(t) : target;
    nd_tensor *src = lt_check_ints_like(L, idx, op, what);
    if (!t) return src; /* made from Lua values: fresh, contiguous int64, stack-owned */
    bool fresh = !nd_on_cpu(t); /* the host copy below is already private */
    if (fresh) src = lt_push_host(L, t, op);
    nd_status st = nd_to_dtype(src, ND_INT64, &r);
    if (st == ND_OK && r == src && fresh && nd_is_contiguous(src)) {
        nd_release(r); /* src itself, stack-owned already */
        return src;
    }
    if (st == ND_OK && r == src) { /* need a private copy to shift */
        nd_release(r);
        st = nd_clone(src, &r);
    } else if (st == ND_OK && !nd_is_contiguous(r)) {
        nd_tensor *c;
        st = nd_contiguous(r, &c);
        nd_release(r);
        r = c;
    }
    LT_CHECK(L, st);
    lt_push(L, r); /* the stack owns it from here */
    return r;
}

/* r (host, stack-owned at the top) moved to dev; the result is borrowed. */
static nd_tensor *ints_to(lua_State *L, nd_tensor *r, nd_device dev, const char *op) {
    if (dev.type == ND_DEVICE_CPU) return r;
    nd_retain(r);
    lt_push_on(L, r, dev, op);
    return lt_to(L, -1);
}

/* While a graph captures, an index or label tensor may be a graph input
 * whose values change from call to call: it is shifted to 0-based by
 * recorded ops on its device, never on the host (the kernels and the ops'
 * host checks bound-check the result on every replay). Labels equal to
 * *ignore become ignore0. Pushed (stack-owned), borrowed. */
static nd_tensor *shift_on_device(lua_State *L, nd_tensor *t, const char *op, const char *what,
                                  const int64_t *ignore, int64_t ignore0) {
    lt_check_ints_like(L, lua_gettop(L), op, what); /* integer dtype, else the usual error */
    nd_tensor *i64 = NULL, *r = NULL, *eq = NULL, *alt = NULL;
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = nd_to_dtype(t, ND_INT64, &i64);
    if (st == ND_OK) st = nd_binary_scalar_int(ND_BINARY_sub, i64, 1, 0, &r);
    if (st == ND_OK && ignore) {
        st = nd_binary_scalar_int(ND_BINARY_eq, i64, *ignore, 0, &eq);
        if (st == ND_OK) st = nd_empty_on(nd_get_device(t), t->shape, t->ndim, ND_INT64, &alt);
        if (st == ND_OK) st = nd_fill_number_(alt, nd_num_i(ignore0));
        nd_tensor *w = NULL;
        if (st == ND_OK) st = nd_where(eq, alt, r, &w);
        if (st == ND_OK) { nd_release(r); r = w; }
    }
    nd_set_grad_enabled(grad_on);
    nd_release(i64);
    nd_release(eq);
    nd_release(alt);
    if (st != ND_OK) nd_release(r);
    LT_CHECK_AS(L, op, st);
    lt_push(L, r);
    return r;
}

nd_tensor *lt_check_index_on(lua_State *L, int idx, const char *op, nd_device target) {
    nd_device dev;
    if (nd_graph_capturing() && lt_to(L, idx)) {
        lua_pushvalue(L, idx);
        return shift_on_device(L, lt_to(L, idx), op, "index values", NULL, 0);
    }
    nd_tensor *r = host_ints(L, idx, op, "index values", target, &dev);
    int64_t *p = (int64_t *)nd_ptr(r), n = nd_numel(r);
    for (int64_t i = 0; i < n; i++) {
        if (p[i] < 1) lt_error(L, op, "index %lld out of range (indices are 1-based)", (long long)p[i]);
        p[i] -= 1;
    }
    return ints_to(L, r, dev, op);
}

nd_tensor *lt_check_labels_on(lua_State *L, int idx, const char *op, int64_t n, int64_t C,
                              const int64_t *ignore, nd_device target, int64_t *ignore0) {
    nd_device dev;
    nd_tensor *lt = lt_to(L, idx);
    if (nd_graph_capturing() && lt && lt->ndim == 1 && lt->shape[0] == n) {
        /* 0-based ignore as below, except that an ignore outside 1..C maps
         * to INT64_MIN: -1 would also be what a label 0 becomes */
        *ignore0 = !ignore ? INT64_MIN : (*ignore >= 1 && *ignore <= C) ? *ignore - 1 : INT64_MIN;
        lua_pushvalue(L, idx);
        return shift_on_device(L, lt, op, "labels", ignore, *ignore0);
    }
    nd_tensor *r = host_ints(L, idx, op, "labels", target, &dev);
    *ignore0 = INT64_MIN;
    /* not one label per row: the op's own check names both shapes */
    if (r->ndim != 1 || r->shape[0] != n) return ints_to(L, r, dev, op);
    /* Checked in the caller's 1-based terms before anything is subtracted
     * (math.mininteger - 1 would overflow). An ignore_index outside 1..C
     * becomes -1: no valid label maps there. */
    bool in_range = ignore && *ignore >= 1 && *ignore <= C;
    *ignore0 = !ignore ? INT64_MIN : in_range ? *ignore - 1 : -1;
    int64_t *p = (int64_t *)nd_ptr(r);
    for (int64_t i = 0; i < n; i++) {
        if (ignore && p[i] == *ignore) p[i] = *ignore0;
        else if (p[i] < 1 || p[i] > C)
            lt_error(L, op, "label %lld of row %lld is out of range for %lld classes (expected 1..%lld)",
                     (long long)p[i], (long long)i + 1, (long long)C, (long long)C);
        else p[i] -= 1;
    }
    return ints_to(L, r, dev, op);
}

void lt_push_index(lua_State *L, nd_tensor *t) {
    /* A new tensor, never t shifted in place: t may also be saved for
     * backward (max(dim) keeps its 0-based indices). */
    nd_tensor *r;
    bool grad_on = nd_set_grad_enabled(false);
    nd_status st = nd_binary_scalar_int(ND_BINARY_add, t, 1, 0, &r);
    nd_set_grad_enabled(grad_on);
    nd_release(t);
    LT_CHECK(L, st);
    lt_push(L, r);
}

/* -------------------------------------------------------- x[...] views */

static int64_t lua_index(lua_State *L, lua_Integer i, const char *op) {
    if (i == 0) lt_error(L, op, "index 0 is invalid (indices are 1-based; -1 is the last)");
    return i > 0 ? i - 1 : i;
}

/* "too many indices": n entries for x (the indexed tensor, not the view
 * that the entries before made of it, which may be 0-dim by then). */
static void too_many_indices(lua_State *L, nd_tensor **cur, const nd_tensor *x, int n) {
    char b[ND_SHAPE_BUF];
    nd_shape_str(x->shape, x->ndim, b);
    nd_release(*cur);
    *cur = NULL;
    lt_error(L, "index", "too many indices (%d) for a tensor of shape %s", n, b);
}

/* Applies entry pos (of n) of a table index on x, at the top of the stack,
 * to *cur at dim *d. */
static void apply_entry(lua_State *L, const nd_tensor *x, nd_tensor **cur, int *d, int pos,
                        int n_entries) {
    nd_tensor *r = NULL;
    nd_status st = ND_OK;
    int ty = lua_type(L, -1);
    if (*d >= (*cur)->ndim && !(ty == LUA_TSTRING)) too_many_indices(L, cur, x, n_entries);
    if (ty == LUA_TNUMBER) {
        if (!lua_isinteger(L, -1)) {
            nd_release(*cur); *cur = NULL;
            lt_error(L, "index", "index %d must be an integer, got %s", pos, lua_tostring(L, -1));
        }
        lua_Integer i = lua_tointeger(L, -1);
        int64_t size = (*cur)->shape[*d];
        if (i == 0 || i > size || i < -size) {
            nd_release(*cur); *cur = NULL;
            lt_error(L, "index", "index %lld out of range for dim %d of size %lld%s", (long long)i,
                     pos, (long long)size, i == 0 ? " (indices are 1-based)" : "");
        }
        st = nd_select(*cur, *d, lua_index(L, i, "index"), &r);
    } else if (ty == LUA_TTABLE) {
        int n = (int)lua_rawlen(L, -1);
        int64_t size = (*cur)->shape[*d];
        lua_Integer v[3] = {1, -1, 1};
        if (n > 3) { nd_release(*cur); *cur = NULL; lt_error(L, "index", "range %d has %d entries (expected {first, last[, step]})", pos, n); }
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, -1, i + 1);
            if (!lua_isinteger(L, -1)) {
                nd_release(*cur); *cur = NULL;
                lt_error(L, "index", "range %d: entry %d must be an integer, got %s", pos, i + 1,
                         luaL_typename(L, -1));
            }
            v[i] = lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        if (n == 1) v[1] = v[0]; /* {i}: the single index i, keeping the dim */
        if (v[0] == 0 || v[1] == 0 || v[2] <= 0) {
            nd_release(*cur); *cur = NULL;
            lt_error(L, "index", "range %d: {%lld, %lld, %lld} is invalid (1-based inclusive "
                     "bounds, positive step)", pos, (long long)v[0], (long long)v[1], (long long)v[2]);
        }
        int64_t s = v[0] > 0 ? v[0] - 1 : v[0] + size, e = v[1] > 0 ? v[1] : v[1] + size + 1;
        if (s < 0 || e > size || s > size || e < 0) {
            nd_release(*cur); *cur = NULL;
            lt_error(L, "index", "range {%lld, %lld} out of bounds for dim %d of size %lld",
                     (long long)v[0], (long long)v[1], pos, (long long)size);
        }
        st = nd_slice(*cur, *d, s, e, v[2], &r);
        (*d)++;
    } else if (ty == LUA_TSTRING && strcmp(lua_tostring(L, -1), ":") == 0) {
        if (*d >= (*cur)->ndim) too_many_indices(L, cur, x, n_entries);
        (*d)++;
        return;
    } else {
        nd_release(*cur); *cur = NULL;
        lt_error(L, "index", "index %d: expected an integer, a range table or \":\", got %s", pos,
                 luaL_typename(L, -1));
    }
    nd_release(*cur);
    *cur = NULL;
    LT_CHECK(L, st);
    *cur = r;
}

/* The view that key (at stack index 2) denotes. New reference. */
static nd_tensor *index_view(lua_State *L, nd_tensor *x) {
    nd_tensor *r;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        if (!lua_isinteger(L, 2)) lt_error(L, "index", "index must be an integer, got %s", lua_tostring(L, 2));
        if (x->ndim == 0) lt_error(L, "index", "cannot index a 0-dim tensor");
        LT_CHECK(L, nd_select(x, 0, lua_index(L, lua_tointeger(L, 2), "index"), &r));
        return r;
    }
    if (!lua_istable(L, 2)) {
        if (lt_to(L, 2)) lt_error(L, "index", "indexing with a tensor is not supported; use "
                                  "index_select, gather or masked_fill");
        lt_error(L, "index", "expected an integer or a table index, got %s", luaL_typename(L, 2));
    }
    /* raw reads: no metamethod can raise while cur holds a reference */
    nd_retain(x);
    nd_tensor *cur = x;
    int d = 0, n = (int)lua_rawlen(L, 2);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        apply_entry(L, x, &cur, &d, i, n);
        lua_pop(L, 1);
    }
    return cur;
}

int lt_index_get(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "index");
    lt_push(L, index_view(L, x));
    return 1;
}

int lt_index_set(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "index");
    nd_tensor *v = index_view(L, x);
    lt_push(L, v); /* owned by Lua from here: errors below cannot leak it */
    nd_status st;
    int ty = lua_type(L, 3);
    if (ty == LUA_TNUMBER || ty == LUA_TBOOLEAN) {
        st = nd_fill_number_(v, lt_to_number(L, 3)); /* a value out of v's range is an error */
        if (st != ND_OK) lt_raise_as(L, "index");
    } else {
        st = nd_copy_(v, lt_check_tensor_like(L, 3, "index", v->dtype)); /* copy_ crosses devices */
    }
    LT_CHECK(L, st);
    return 0;
}

/* ------------------------------------------------------------- index ops */

/* r is read only after st was computed (argument order is unspecified). */
static int push_result(lua_State *L, nd_status st, nd_tensor **r) {
    LT_CHECK(L, st);
    lt_push(L, *r);
    return 1;
}

static int t_gather(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "gather"), *r = NULL;
    int d = lt_dim(L, 2, "gather");
    nd_tensor *ix = lt_check_index_on(L, 3, "gather", nd_get_device(x));
    return push_result(L, nd_gather(x, d, ix, &r), &r);
}

static int scatter(lua_State *L, int accumulate) {
    const char *op = accumulate ? "scatter_add" : "scatter";
    nd_tensor *x = lt_check(L, 1, op), *r = NULL, *src;
    int d = lt_dim(L, 2, op);
    nd_tensor *ix = lt_check_index_on(L, 3, op, nd_get_device(x));
    if (lua_type(L, 4) == LUA_TNUMBER) {
        LT_CHECK(L, nd_empty_on(nd_get_device(x), ix->shape, ix->ndim, x->dtype, &src));
        lt_push(L, src); /* stack-owned */
        LT_CHECK_AS(L, op, nd_fill_number_(src, lt_to_number(L, 4))); /* exact, or refused */
    } else {
        src = lt_to(L, 4);
        if (!src) lt_error(L, op, "src must be a tensor or number, got %s", luaL_typename(L, 4));
    }
    return push_result(L, nd_scatter(x, d, ix, src, accumulate, &r), &r);
}
static int t_scatter(lua_State *L) { return scatter(L, 0); }
static int t_scatter_add(lua_State *L) { return scatter(L, 1); }

static int t_index_select(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "index_select"), *r = NULL;
    int d = lt_dim(L, 2, "index_select");
    nd_tensor *ix = lt_check_index_on(L, 3, "index_select", nd_get_device(x));
    return push_result(L, nd_index_select(x, d, ix, &r), &r);
}

static int t_index_add(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "index_add"), *r = NULL;
    int d = lt_dim(L, 2, "index_add");
    nd_tensor *src = lt_check(L, 4, "index_add");
    double alpha = luaL_optnumber(L, 5, 1.0);
    nd_tensor *ix = lt_check_index_on(L, 3, "index_add", nd_get_device(x));
    return push_result(L, nd_index_add(x, d, ix, src, alpha, &r), &r);
}

static int t_masked_fill(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "masked_fill"), *r = NULL;
    nd_tensor *m = lt_check_tensor_like_on(L, 2, "masked_fill", ND_BOOL, nd_get_device(x));
    if (!lua_isboolean(L, 3)) luaL_checknumber(L, 3);
    /* the core takes a double: the range is checked here on the exact value */
    LT_CHECK(L, nd_check_number_fits("masked_fill", x->dtype, lt_to_number(L, 3)));
    double v = lua_isboolean(L, 3) ? lua_toboolean(L, 3) : lua_tonumber(L, 3);
    return push_result(L, nd_masked_fill(x, m, v, &r), &r);
}

/* core._ints(value, op, what[, device]): class labels or indices for the
 * Lua layer (nll_loss, embedding): an integer tensor as it is, a number or
 * table of integers as an int64 tensor on device (default cpu); anything
 * else (fractions, booleans, float tensors) is an error naming op and what. */
static int l_ints(lua_State *L) {
    const char *op = luaL_checkstring(L, 2), *what = luaL_checkstring(L, 3);
    nd_device dev = lua_isnoneornil(L, 4) ? nd_cpu_device() : lt_device_name(L, 4, op);
    if (lt_to(L, 1)) {
        lt_check_ints_like(L, 1, op, what); /* checks the dtype */
        lua_settop(L, 1);
        return 1;
    }
    nd_tensor *t = lt_check_ints_like(L, 1, op, what); /* pushed */
    nd_retain(t);
    lua_pop(L, 1);
    lt_push_on(L, t, dev, op);
    return 1;
}

/* one_hot(labels 1..C, C): labels as a tensor or table */
static int l_one_hot(lua_State *L) {
    lua_Integer c = luaL_optinteger(L, 2, -1);
    nd_tensor *ix = lt_check_index(L, 1, "one_hot"), *r = NULL;
    return push_result(L, nd_one_hot(ix, c, &r), &r);
}

static int t_cumsum(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "cumsum"), *r = NULL;
    return push_result(L, nd_cumsum(x, lt_dim(L, 2, "cumsum"), &r), &r);
}

/* sort(dim = -1, descending = false) -> values, indices */
static int sort(lua_State *L, const char *op) {
    nd_tensor *x = lt_check(L, 1, op), *v, *ix;
    int d;
    bool desc;
    if (lua_istable(L, 2)) { /* sort({dim=, descending=}) */
        static const char *const valid[] = {"dim", "descending", NULL};
        lt_no_extra_arg(L, 2, op, "x, {dim=, descending=}");
        lt_options(L, 2, "sort", valid);
        lua_getfield(L, 2, "dim");
        d = lua_isnil(L, -1) ? -1 : lt_dim(L, lua_gettop(L), "sort");
        desc = lt_opt_bool(L, 2, "sort", "descending", false);
    } else {
        d = lt_opt_dim(L, 2, "sort", -1);
        desc = lua_toboolean(L, 3);
    }
    LT_CHECK(L, nd_sort(x, d, desc, &v, &ix));
    lt_push(L, v);
    lt_push_index(L, ix);
    return 2;
}

static int t_sort(lua_State *L) { return sort(L, "sort"); }

static int t_argsort(lua_State *L) {
    sort(L, "argsort");
    return 1; /* the indices are on top */
}

/* topk(k, dim = -1, largest = true) -> values, indices */
static int t_topk(lua_State *L) {
    nd_tensor *x = lt_check(L, 1, "topk"), *v, *ix;
    lua_Integer k = luaL_checkinteger(L, 2);
    int d = lt_opt_dim(L, 3, "topk", -1);
    bool largest = lua_isnoneornil(L, 4) ? true : lua_toboolean(L, 4);
    LT_CHECK(L, nd_topk(x, k, d, largest, &v, &ix));
    lt_push(L, v);
    lt_push_index(L, ix);
    return 2;
}

void lt_register_index(lua_State *L) {
    static const lt_reg regs[] = {
        {"gather", t_gather, true, true, 3, "x, dim, index"},
        {"scatter", t_scatter, true, true, 4, "x, dim, index, src"},
        {"scatter_add", t_scatter_add, true, true, 4, "x, dim, index, src"},
        {"index_select", t_index_select, true, true, 3, "x, dim, index"},
        {"index_add", t_index_add, true, true, 5, "x, dim, index, src[, alpha]"},
        {"masked_fill", t_masked_fill, true, true, 3, "x, mask, value"},
        {"one_hot", l_one_hot, false, true, 2, "labels[, num_classes]"},
        {"_ints", l_ints, false, true, 4, "value, op, what[, device]"},
        {"cumsum", t_cumsum, true, true, 2, "x, dim"},
        {"sort", t_sort, true, true, 3, "x[, dim, descending]"},
        {"argsort", t_argsort, true, true, 3, "x[, dim, descending]"},
        {"topk", t_topk, true, true, 4, "x, k[, dim, largest]"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
