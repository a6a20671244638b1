/* lt_optim.c - the fused optimizer updates for nd.optim (needle.h,
 * "optimizer updates"):
 *
 *   core.sgd_step_(p, grad, buf, {lr =, momentum =, dampening =, weight_decay =,
 *                  nesterov =, maximize =, first =}) -> handled
 *
 * buf is nil without momentum. Returns false, changing nothing, where the
 * fused kernel does not apply; nd.optim.SGD then composes the update. */
#include "lt_internal.h"

static double field_number(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    int isnum;
    double v = lua_tonumberx(L, -1, &isnum);
    if (!isnum) lt_error(L, "sgd_step_", "option '%s' must be a number, got %s", key, luaL_typename(L, -1));
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
        .lr = field_number(L, 4, "lr"),
        .momentum = field_number(L, 4, "momentum"),
        .dampening = field_number(L, 4, "dampening"),
        .weight_decay = field_number(L, 4, "weight_decay"),
        .nesterov = field_bool(L, 4, "nesterov"),
        .maximize = field_bool(L, 4, "maximize"),
    };
    bool done = false;
    LT_CHECK(L, nd_sgd_step_(p, g, buf, &h, field_bool(L, 4, "first"), &done));
    lua_pushboolean(L, done);
    return 1;
}

void lt_register_optim(lua_State *L) {
    static const lt_reg regs[] = {
        {"sgd_step_", l_sgd_step_, false, true},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
