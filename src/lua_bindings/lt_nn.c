/* lt_nn.c - convolution and pooling: nd.conv2d, nd.conv_transpose2d,
 * nd.max_pool2d, nd.avg_pool2d, nd.adaptive_avg_pool2d, nd.dilate and
 * nd.undilate, and the fused inference ops nd.fused_conv2d and nd.fused_linear.
 * Size arguments are an integer or an {h, w} pair; PyTorch's
 * keyword arguments go in a trailing options table (unknown keys are an
 * error, so a typo is not silently ignored). max_pool2d's indices are
 * 1-based flat positions within each (H, W) plane: (h - 1) * W + w. */
#include <string.h>
#include "lt_internal.h"

static int64_t pair_item(lua_State *L, int idx, const char *op, const char *what) {
    int isnum;
    lua_Integer v = lua_tointegerx(L, idx, &isnum);
    if (!isnum) lt_error(L, op, "%s must be an integer or a pair {h, w} of integers", what);
    return (int64_t)v;
}

/* An integer (both sides) or an {h, w} pair at idx. */
static void check_pair(lua_State *L, int idx, const char *op, const char *what, int64_t out[2]) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TNUMBER) {
        out[0] = out[1] = pair_item(L, idx, op, what);
        return;
    }
    if (!lua_istable(L, idx) || lt_to(L, idx))
        lt_error(L, op, "%s must be an integer or a pair {h, w}, got %s", what, luaL_typename(L, idx));
    if (luaL_len(L, idx) != 2)
        lt_error(L, op, "%s must be an integer or a pair {h, w}, got a table of %d entries", what,
                 (int)luaL_len(L, idx));
    for (int i = 0; i < 2; i++) {
        lua_geti(L, idx, i + 1);
        out[i] = pair_item(L, -1, op, what);
        lua_pop(L, 1);
    }
}

/* Field `what` of the options table at opts, when present: true and *out. */
static bool opt_pair(lua_State *L, int opts, const char *op, const char *what, int64_t out[2]) {
    if (!opts) return false;
    bool present = lua_getfield(L, opts, what) != LUA_TNIL;
    if (present) check_pair(L, -1, op, what, out);
    lua_pop(L, 1);
    return present;
}

static int64_t opt_int(lua_State *L, int opts, const char *op, const char *what, int64_t def) {
    if (!opts) return def;
    int64_t v = def;
    if (lua_getfield(L, opts, what) != LUA_TNIL) {
        int isnum;
        lua_Integer i = lua_tointegerx(L, -1, &isnum);
        if (!isnum) lt_error(L, op, "%s must be an integer, got %s", what, luaL_typename(L, -1));
        v = (int64_t)i;
    }
    lua_pop(L, 1);
    return v;
}

/* The optional bias at idx and the options table after it; a plain table
 * in the bias's place is taken as the options (conv2d(x, w, {stride=2})). */
static const nd_tensor *bias_and_options(lua_State *L, const char *op, const char *const *allowed,
                                         int *opts) {
    if (lua_istable(L, 3) && !lt_to(L, 3) && lua_isnoneornil(L, 4)) {
        *opts = lt_options(L, 3, op, allowed);
        return NULL;
    }
    const nd_tensor *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3, op);
    *opts = lt_options(L, 4, op, allowed);
    return b;
}

/* The arguments conv2d and fused_conv2d share: x, w, [b] and the options
 * stride, padding, dilation (NULL when absent) and groups. */
typedef struct {
    nd_tensor *x, *w;
    const nd_tensor *b;
    int opts;
    int64_t stride[2], padding[2], dilation[2], groups;
    const int64_t *stride_p, *padding_p, *dilation_p;
} conv_call;

static void conv_call_args(lua_State *L, const char *op, const char *const *allowed, conv_call *c) {
    c->x = lt_check(L, 1, op);
    c->w = lt_check(L, 2, op);
    c->b = bias_and_options(L, op, allowed, &c->opts);
    c->stride_p = opt_pair(L, c->opts, op, "stride", c->stride) ? c->stride : NULL;
    c->padding_p = opt_pair(L, c->opts, op, "padding", c->padding) ? c->padding : NULL;
    c->dilation_p = opt_pair(L, c->opts, op, "dilation", c->dilation) ? c->dilation : NULL;
    c->groups = opt_int(L, c->opts, op, "groups", 1);
}

/* nd.conv2d(x, w, [b], {stride=, padding=, dilation=, groups=}) */
static int l_conv2d(lua_State *L) {
    static const char *const allowed[] = {"stride", "padding", "dilation", "groups", NULL};
    conv_call c;
    nd_tensor *r;
    conv_call_args(L, "conv2d", allowed, &c);
    LT_CHECK(L, nd_conv2d(c.x, c.w, c.b, c.stride_p, c.padding_p, c.dilation_p, c.groups, &r));
    lt_push(L, r);
    return 1;
}

/* nd.conv_transpose2d(x, w, [b], {stride=, padding=, output_padding=,
 * dilation=, groups=}) */
static int l_conv_transpose2d(lua_State *L) {
    static const char *const allowed[] = {"stride", "padding", "output_padding", "dilation",
                                          "groups", NULL};
    const char *op = "conv_transpose2d";
    nd_tensor *x = lt_check(L, 1, op), *w = lt_check(L, 2, op), *r;
    int opts;
    const nd_tensor *b = bias_and_options(L, op, allowed, &opts);
    int64_t stride[2], padding[2], outpad[2], dilation[2];
    bool hs = opt_pair(L, opts, op, "stride", stride);
    bool hp = opt_pair(L, opts, op, "padding", padding);
    bool ho = opt_pair(L, opts, op, "output_padding", outpad);
    bool hd = opt_pair(L, opts, op, "dilation", dilation);
    int64_t groups = opt_int(L, opts, op, "groups", 1);
    LT_CHECK(L, nd_conv_transpose2d(x, w, b, hs ? stride : NULL, hp ? padding : NULL,
                                    ho ? outpad : NULL, hd ? dilation : NULL, groups, &r));
    lt_push(L, r);
    return 1;
}

/* nd.max_pool2d(x, kernel_size, {stride=, padding=, dilation=, ceil_mode=,
 * return_indices=}) -> out[, indices (int64, 1-based within each plane)] */
static int l_max_pool2d(lua_State *L) {
    static const char *const allowed[] = {"stride", "padding", "dilation", "ceil_mode",
                                          "return_indices", NULL};
    const char *op = "max_pool2d";
    nd_tensor *x = lt_check(L, 1, op), *r, *ix = NULL;
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    if (lua_isnoneornil(L, 2)) lt_error(L, op, "kernel_size is required");
    check_pair(L, 2, op, "kernel_size", kernel);
    int opts = lt_options(L, 3, op, allowed);
    bool hs = opt_pair(L, opts, op, "stride", stride);
    bool hp = opt_pair(L, opts, op, "padding", padding);
    bool hd = opt_pair(L, opts, op, "dilation", dilation);
    bool ceil_mode = lt_opt_bool(L, opts, op, "ceil_mode", false);
    bool want_ix = lt_opt_bool(L, opts, op, "return_indices", false);
    LT_CHECK(L, nd_max_pool2d(x, kernel, hs ? stride : NULL, hp ? padding : NULL,
                              hd ? dilation : NULL, ceil_mode, &r, want_ix ? &ix : NULL));
    lt_push(L, r);
    if (!want_ix) return 1;
    lt_push_index(L, ix);
    return 2;
}

/* nd.avg_pool2d(x, kernel_size, {stride=, padding=, ceil_mode=,
 * count_include_pad=true}) */
static int l_avg_pool2d(lua_State *L) {
    static const char *const allowed[] = {"stride", "padding", "ceil_mode", "count_include_pad",
                                          NULL};
    const char *op = "avg_pool2d";
    nd_tensor *x = lt_check(L, 1, op), *r;
    int64_t kernel[2], stride[2], padding[2];
    if (lua_isnoneornil(L, 2)) lt_error(L, op, "kernel_size is required");
    check_pair(L, 2, op, "kernel_size", kernel);
    int opts = lt_options(L, 3, op, allowed);
    bool hs = opt_pair(L, opts, op, "stride", stride);
    bool hp = opt_pair(L, opts, op, "padding", padding);
    bool ceil_mode = lt_opt_bool(L, opts, op, "ceil_mode", false);
    bool include_pad = lt_opt_bool(L, opts, op, "count_include_pad", true);
    LT_CHECK(L, nd_avg_pool2d(x, kernel, hs ? stride : NULL, hp ? padding : NULL, ceil_mode,
                              include_pad, &r));
    lt_push(L, r);
    return 1;
}

/* nd.adaptive_avg_pool2d(x, {oh, ow}) (or one integer for both) */
static int l_adaptive_avg_pool2d(lua_State *L) {
    const char *op = "adaptive_avg_pool2d";
    nd_tensor *x = lt_check(L, 1, op), *r;
    int64_t hw[2];
    if (lua_isnoneornil(L, 2)) lt_error(L, op, "output_size is required");
    check_pair(L, 2, op, "output_size", hw);
    LT_CHECK(L, nd_adaptive_avg_pool2d(x, hw, &r));
    lt_push(L, r);
    return 1;
}

/* nd.dilate(x, dims, dilation) / nd.undilate(x, dims, dilation); dims a
 * 1-based dim or a list of them */
static int dilate(lua_State *L, bool un) {
    const char *op = un ? "undilate" : "dilate";
    nd_tensor *x = lt_check(L, 1, op), *r;
    int dims[ND_MAX_DIMS];
    if (lua_isnoneornil(L, 2)) lt_error(L, op, "dims are required");
    int nd = lt_dims(L, 2, op, dims);
    int isnum;
    lua_Integer dil = lua_tointegerx(L, 3, &isnum);
    if (!isnum) lt_error(L, op, "dilation must be an integer, got %s", luaL_typename(L, 3));
    LT_CHECK(L, un ? nd_undilate(x, dims, nd, (int64_t)dil, &r) : nd_dilate(x, dims, nd, (int64_t)dil, &r));
    lt_push(L, r);
    return 1;
}
static int l_dilate(lua_State *L) { return dilate(L, false); }
static int l_undilate(lua_State *L) { return dilate(L, true); }

/* ---- fused inference ops (nd.nn.fuse): the same arguments as conv2d and
 * F.linear plus activation = "none" (the default), "relu" or "gelu" ---- */

static nd_activation opt_activation(lua_State *L, int opts, const char *op) {
    nd_activation act = ND_ACT_NONE;
    if (!opts) return act;
    int t = lua_getfield(L, opts, "activation");
    if (t != LUA_TNIL) {
        const char *s = t == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (s && strcmp(s, "relu") == 0) act = ND_ACT_RELU;
        else if (s && strcmp(s, "gelu") == 0) act = ND_ACT_GELU;
        else if (!(s && strcmp(s, "none") == 0))
            lt_error(L, op, "activation must be 'none', 'relu' or 'gelu', got %s%s%s",
                     s ? "'" : "", s ? s : luaL_typename(L, -1), s ? "'" : "");
    }
    lua_pop(L, 1);
    return act;
}

/* nd.fused_conv2d(x, w, [b], {stride=, padding=, dilation=, groups=, activation=}) */
static int l_fused_conv2d(lua_State *L) {
    static const char *const allowed[] = {"stride", "padding", "dilation", "groups",
                                          "activation", NULL};
    const char *op = "fused_conv2d";
    conv_call c;
    nd_tensor *r;
    conv_call_args(L, op, allowed, &c);
    nd_activation act = opt_activation(L, c.opts, op);
    LT_CHECK(L, nd_fused_conv2d(c.x, c.w, c.b, c.stride_p, c.padding_p, c.dilation_p, c.groups,
                                act, &r));
    lt_push(L, r);
    return 1;
}

/* nd.fused_linear(x, w, [b], {activation=}) */
static int l_fused_linear(lua_State *L) {
    static const char *const allowed[] = {"activation", NULL};
    const char *op = "fused_linear";
    nd_tensor *x = lt_check(L, 1, op), *w = lt_check(L, 2, op), *r;
    int opts;
    const nd_tensor *b = bias_and_options(L, op, allowed, &opts);
    nd_activation act = opt_activation(L, opts, op);
    LT_CHECK(L, nd_fused_linear(x, w, b, act, &r));
    lt_push(L, r);
    return 1;
}

/* nd.fold_batch_norm(w, b|nil, mean, rstd, gamma|nil, beta|nil) -> w', b' */
static int l_fold_batch_norm(lua_State *L) {
    const char *op = "fold_batch_norm";
    const nd_tensor *t[6];
    for (int i = 0; i < 6; i++) {
        bool optional = i == 1 || i == 4 || i == 5;
        t[i] = optional && lua_isnoneornil(L, i + 1) ? NULL : lt_check(L, i + 1, op);
    }
    nd_tensor *w = NULL, *b = NULL;
    LT_CHECK(L, nd_fold_batch_norm(t[0], t[1], t[2], t[3], t[4], t[5], &w, &b));
    lt_push(L, w);
    lt_push(L, b);
    return 2;
}

/* nd.linear(x, w[, b]): F.linear's core (x @ w^T + b) */
static int l_linear(lua_State *L) {
    const char *op = "linear";
    nd_tensor *x = lt_check(L, 1, op), *w = lt_check(L, 2, op), *r;
    const nd_tensor *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3, op);
    LT_CHECK(L, nd_linear(x, w, b, &r));
    lt_push(L, r);
    return 1;
}

/* _attention(q, k, v, mask or nil, scale, causal, dropout_p = 0):
 * F.scaled_dot_product_attention's fused kernel (functional/attention.lua
 * decides when) */
static int l_attention(lua_State *L) {
    const char *op = "attention";
    nd_tensor *q = lt_check(L, 1, op), *k = lt_check(L, 2, op), *v = lt_check(L, 3, op), *r;
    const nd_tensor *mask = lua_isnoneornil(L, 4) ? NULL : lt_check(L, 4, op);
    const double scale = luaL_checknumber(L, 5);
    const bool causal = lua_toboolean(L, 6);
    const double dropout_p = luaL_optnumber(L, 7, 0.0);
    LT_CHECK(L, nd_attention(q, k, v, mask, scale, causal, dropout_p, &r));
    lt_push(L, r);
    return 1;
}

/* _lstm_cell(xw (B, 4H), hw (B, 4H) or nil, c (B, H)) -> (B, 2H) = [h | c']
 * with the gates xw + hw (nn.LSTM's step) */
static int l_lstm_cell(lua_State *L) {
    const char *op = "lstm_cell";
    nd_tensor *xw = lt_check(L, 1, op), *c = lt_check(L, 3, op), *r;
    const nd_tensor *hw = lua_isnoneornil(L, 2) ? NULL : lt_check(L, 2, op);
    LT_CHECK(L, nd_lstm_cell(xw, hw, c, &r));
    lt_push(L, r);
    return 1;
}

/* _gru_cell(xw (B, 3H), hw (B, 3H), h (B, H)) -> h' (B, H) (nn.GRU's step) */
static int l_gru_cell(lua_State *L) {
    const char *op = "gru_cell";
    nd_tensor *xw = lt_check(L, 1, op), *hw = lt_check(L, 2, op), *h = lt_check(L, 3, op), *r;
    LT_CHECK(L, nd_gru_cell(xw, hw, h, &r));
    lt_push(L, r);
    return 1;
}

/* _lstm_layer(xw (T, B, 4H), w_hh (4H, H), b_hh (4H) or nil, h0, c0 (B, H), reverse)
 * -> (T + 1, B, H): the outputs h_1..h_T, then the last c (nn.LSTM's layer,
 * one direction) */
static int l_lstm_layer(lua_State *L) {
    const char *op = "lstm_layer";
    nd_tensor *xw = lt_check(L, 1, op), *w = lt_check(L, 2, op), *h0 = lt_check(L, 4, op);
    nd_tensor *c0 = lt_check(L, 5, op), *r;
    const nd_tensor *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3, op);
    LT_CHECK(L, nd_lstm_layer(xw, w, b, h0, c0, lua_toboolean(L, 6), &r));
    lt_push(L, r);
    return 1;
}

/* _gru_layer(xw (T, B, 3H), w_hh (3H, H), b_hh (3H) or nil, h0 (B, H), reverse)
 * -> the outputs (T, B, H) (nn.GRU's layer, one direction) */
static int l_gru_layer(lua_State *L) {
    const char *op = "gru_layer";
    nd_tensor *xw = lt_check(L, 1, op), *w = lt_check(L, 2, op), *h0 = lt_check(L, 4, op), *r;
    const nd_tensor *b = lua_isnoneornil(L, 3) ? NULL : lt_check(L, 3, op);
    LT_CHECK(L, nd_gru_layer(xw, w, b, h0, lua_toboolean(L, 5), &r));
    lt_push(L, r);
    return 1;
}

void lt_register_nn(lua_State *L) {
    static const lt_reg regs[] = {
        {"conv2d", l_conv2d, false, true, 4, "x, weight[, bias][, opts]"},
        {"conv_transpose2d", l_conv_transpose2d, false, true, 4, "x, weight[, bias][, opts]"},
        {"max_pool2d", l_max_pool2d, false, true, 3, "x, kernel_size[, opts]"},
        {"avg_pool2d", l_avg_pool2d, false, true, 3, "x, kernel_size[, opts]"},
        {"adaptive_avg_pool2d", l_adaptive_avg_pool2d, false, true, 2, "x, output_size"},
        {"dilate", l_dilate, true, true, 3, "x, dims, dilation"},
        {"undilate", l_undilate, true, true, 3, "x, dims, dilation"},
        {"fused_conv2d", l_fused_conv2d, false, true, 4, "x, weight[, bias][, opts]"},
        {"fused_linear", l_fused_linear, false, true, 4, "x, weight[, bias][, opts]"},
        {"linear", l_linear, false, true, 3, "x, weight[, bias]"},
        {"_attention", l_attention, false, true, 7, "q, k, v, mask, scale, causal[, dropout_p]"},
        {"_lstm_cell", l_lstm_cell, false, true, 3, "xw, hw, c"},
        {"_gru_cell", l_gru_cell, false, true, 3, "xw, hw, h"},
        {"_lstm_layer", l_lstm_layer, false, true, 6, "xw, w_hh, b_hh, h0, c0, reverse"},
        {"_gru_layer", l_gru_layer, false, true, 5, "xw, w_hh, b_hh, h0, reverse"},
        {"fold_batch_norm", l_fold_batch_norm, false, true, 6, "w, b, mean, rstd, gamma, beta"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
