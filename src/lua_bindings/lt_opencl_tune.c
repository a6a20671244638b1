/* lt_opencl_tune.c - nd.opencl_tune(): the GEMM autotuner from Lua. */
#include "lt_internal.h"

static int l_opencl_tune(lua_State *L) {
    return lt_error(L, "opencl_tune", "not written yet");
}

void lt_register_opencl_tune(lua_State *L) {
    static const lt_reg regs[] = {
        {"opencl_tune", l_opencl_tune, false, true},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
