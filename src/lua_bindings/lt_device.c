/* lt_device.c - devices from Lua: nd.devices(), nd.synchronize(),
 * nd.opencl_available(). */
#include "lt_internal.h"

/* nd.devices(): {{name="cpu", type="cpu", threads=N, memory=bytes, packed_conv=bool, small_linear=bool, gemm=kernel,
 * l2_cache=bytes, bf16=bool, amx=bool},
 * {name="opencl:0", ...}} */
static int l_devices(lua_State *L) {
    int n = nd_opencl_device_count();
    lua_createtable(L, n + 1, 0);
    lua_createtable(L, 0, 10);
    lt_set_str(L, "name", "cpu");
    lt_set_str(L, "type", "cpu");
    lt_set_int(L, "threads", nd_get_num_threads());
    /* bytes this process can have (tensors above it are refused) */
    lt_set_int(L, "memory", nd_memory_limit());
    lt_set_bool(L, "packed_conv", nd_cpu_packed_conv());
    lt_set_bool(L, "small_linear", nd_cpu_small_linear());
    lt_set_str(L, "gemm", nd_cpu_gemm_kernel());
    lt_set_int(L, "l2_cache", nd_cpu_l2_cache_bytes()); /* sizes the GEMM's blocks */
    lt_set_bool(L, "bf16", nd_cpu_gemm_bf16_available());
    lt_set_bool(L, "amx", nd_cpu_gemm_amx_available()); /* bfloat16 products on AMX tiles */
    lua_rawseti(L, -2, 1);
    for (int i = 0; i < n; i++) {
        nd_opencl_info in;
        LT_CHECK_AS(L, "devices", nd_opencl_device_info(i, &in));
        lua_createtable(L, 0, 20);
        char name[32];
        nd_device d = {ND_DEVICE_OPENCL, i};
        lt_set_str(L, "name", nd_device_str(d, name));
        lt_set_str(L, "type", "opencl");
        lt_set_int(L, "index", i);
        lt_set_str(L, "device", in.name);
        lt_set_str(L, "vendor", in.vendor);
        lt_set_str(L, "platform", in.platform);
        lt_set_str(L, "version", in.version);
        lt_set_str(L, "driver", in.driver);
        lt_set_int(L, "memory", in.global_mem_bytes);
        lt_set_int(L, "max_alloc", in.max_alloc_bytes);
        lt_set_int(L, "local_memory", in.local_mem_bytes);
        lt_set_int(L, "compute_units", in.compute_units);
        lt_set_int(L, "max_clock_mhz", in.max_clock_mhz);
        lt_set_int(L, "max_work_group_size", in.max_work_group_size);
        lt_set_bool(L, "gpu", in.is_gpu);
        lt_set_bool(L, "fp64", in.fp64);
        lt_set_bool(L, "fp16", in.fp16);
        lua_rawseti(L, -2, i + 2);
    }
    return 1;
}

/* nd.synchronize([device]): waits for the device's queued kernels (all devices by default) */
static int l_synchronize(lua_State *L) {
    if (lua_isnoneornil(L, 1)) {
        for (int i = 0, n = nd_opencl_device_count(); i < n; i++) {
            nd_device d = {ND_DEVICE_OPENCL, i};
            LT_CHECK_AS(L, "synchronize", nd_synchronize(d));
        }
        return 0;
    }
    nd_tensor *t = lt_to(L, 1);
    nd_device d = t ? nd_get_device(t) : lt_device_name(L, 1, "synchronize");
    LT_CHECK_AS(L, "synchronize", nd_synchronize(d));
    return 0;
}

/* nd.opencl_available(): true, or false and why (with how to install a driver) */
static int l_opencl_available(lua_State *L) {
    const char *why = nd_opencl_unavailable_reason();
    lua_pushboolean(L, why == NULL);
    if (why) lua_pushstring(L, why);
    else lua_pushnil(L);
    return 2;
}

/* nd.opencl.launches(): OpenCL kernels launched so far by this process */
static int l_opencl_launches(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)nd_opencl_launch_count());
    return 1;
}

/* nd.opencl.timing(on): device time per command on or off (rows cleared) */
static int l_opencl_timing(lua_State *L) {
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    LT_CHECK_AS(L, "opencl.timing", nd_opencl_timing(lua_toboolean(L, 1)));
    return 0;
}

/* nd.opencl.kernel_times(): {{name=, calls=, ms=}, ...}, most device time first */
static int l_opencl_kernel_times(lua_State *L) {
    const nd_opencl_kernel_time *rows;
    int n;
    LT_CHECK_AS(L, "opencl.kernel_times", nd_opencl_kernel_times(&rows, &n));
    int *order = n ? lua_newuserdatauv(L, sizeof(int) * (size_t)n, 0) : NULL;
    for (int i = 0; i < n; i++) { /* insertion sort by time, descending */
        int j = i;
        while (j > 0 && rows[order[j - 1]].ns < rows[i].ns) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        const nd_opencl_kernel_time *r = &rows[order[i]];
        lua_createtable(L, 0, 3);
        lt_set_str(L, "name", r->label);
        lt_set_int(L, "calls", r->calls);
        lua_pushnumber(L, (double)r->ns / 1e6);
        lua_setfield(L, -2, "ms");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

void lt_register_device(lua_State *L) {
    static const lt_reg regs[] = {
        {"devices", l_devices, false, true, 0, ""},
        {"synchronize", l_synchronize, false, true, 1, "[device]"},
        {"opencl_available", l_opencl_available, false, true, 0, ""},
        {"opencl_launches", l_opencl_launches, false, true, 0, ""},
        {"opencl_timing", l_opencl_timing, false, true, 1, "on"},
        {"opencl_kernel_times", l_opencl_kernel_times, false, true, 0, ""},
        {NULL, NULL, false, false},
    };
    lt_register(L, -2, -1, regs);
}
