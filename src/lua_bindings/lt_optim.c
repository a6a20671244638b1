/* lt_optim.c - the fused optimizer updates for nd.optim (needle.h,
 * "optimizer updates"):
 *
 *   core.sgd_step_(p, grad, buf, {lr =, momentum =, dampening =, weight_decay =,
 *                  nesterov =, maximize =, first =}) -> handled
 *
 *   core.adam_step_(p, grad, exp_avg, exp_avg_sq, {beta1 =, beta2 =, one_minus_beta1 =,
 *                   one_minus_beta2 =, eps =, weight_decay =, decay =, step_size =,
 *                   bc2_sqrt =, decoupled =, maximize =}) -> handled
 *
 *   core.amp_unscale_(g, inv) -> handled, found_inf   (nd.amp.GradScaler)
 *
 * buf is nil without momentum. Each returns false, changing nothing, where
 * the fused kernel does not apply; nd.optim.SGD / Adam then compose the
 * update. */
#include "lt_internal.h"

static double field_number(lua_State *L, int idx, const char *key, const char *op) {
    lua_getfield(L, idx, key);
    int isnum;
    double v = lua_tonumberx(L, -1, &isnum);
    if (!isnum) lt_error(L, op, "option '%s' must be a number, got %s", key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

static bool field_bool(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

static int l_sgd_step_(lua_State *L) {
    nd_tensor *p = lt_check(L, 1, "sgd_step_");
    nd_tensor *g = lt_check(L, 2, "sgd_step_");
    nd_tensor *buf = lua_isnil(L, 3) ? NULL : lt_check(L, 3, "sgd_step_");
    luaL_checktype(L, 4, LUA_TTABLE);
    nd_sgd_hyper h = {
        .lr = field_number(L, 4, "lr", "sgd_step_"),
        .momentum = field_number(L, 4, "momentum", "sgd_step_"),
        .dampening = field_number(L, 4, "dampening", "sgd_step_"),
        .weight_decay = field_number(L, 4, "weight_decay", "sgd_step_"),
        .nesterov = field_bool(L, 4, "nesterov"),
        .maximize = field_bool(L, 4, "maximize"),
    };
    bool done = false;
    LT_CHECK(L, nd_sgd_step_(p, g, buf, &h, field_bool(L, 4, "first"), &done));
    lua_pushboolean(L, done);
    return 1;
}

static int l_adam_step_(lua_State *L) {
    const char *op = "adam_step_";
    nd_tensor *p = lt_check(L, 1, op), *g = lt_check(L, 2, op);
    nd_tensor *m = lt_check(L, 3, op), *v = lt_check(L, 4, op);
    luaL_checktype(L, 5, LUA_TTABLE);
    nd_adam_hyper h = {
        .beta1 = field_number(L, 5, "beta1", op),
        .beta2 = field_number(L, 5, "beta2", op),
        .one_minus_beta1 = field_number(L, 5, "one_minus_beta1", op),
        .one_minus_beta2 = field_number(L, 5, "one_minus_beta2", op),
        .eps = field_number(L, 5, "eps", op),
        .weight_decay = field_number(L, 5, "weight_decay", op),
        .decay = field_number(L, 5, "decay", op),
        .step_size = field_number(L, 5, "step_size", op),
        .bc2_sqrt = field_number(L, 5, "bc2_sqrt", op),
        .decoupled = field_bool(L, 5, "decoupled"),
        .maximize = field_bool(L, 5, "maximize"),
    };
    bool done = false;
    LT_CHECK(L, nd_adam_step_(p, g, m, v, &h, &done));
    lua_pushboolean(L, done);
    return 1;
}

/* core.amp_unscale_(g, inv) -> handled, found_inf (false, false where the
 * kernel does not apply: the scaler then composes it) */
static int l_amp_unscale_(lua_State *L) {
    nd_tensor *g = lt_check(L, 1, "amp_unscale_");
    const double inv = luaL_checknumber(L, 2);
    /* its answer is a value on the host: a replay could not give it again */
    LT_CHECK(L, nd_graph_break("amp_unscale_ returns whether a gradient was finite, on the host"));
    bool done = false, found = false;
    LT_CHECK(L, nd_amp_unscale_(g, inv, &found, &done));
    lua_pushboolean(L, done);
    lua_pushboolean(L, found);
    return 2;
}

void lt_register_optim(lua_State *L) {
    static const lt_reg regs[] = {
        {"sgd_step_", l_sgd_step_, false, true, 4, "p, grad, momentum_buffer, hyper"},
        {"adam_step_", l_adam_step_, false, true, 5, "p, grad, exp_avg, exp_avg_sq, hyper"},
        {"amp_unscale_", l_amp_unscale_, false, true, 2, "grad, inv_scale"},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
