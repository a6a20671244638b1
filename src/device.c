/* device.c - device identity (core): names, parsing, the same-device rule,
 * and what the OpenCL backend found, asked through the backend table (the
 * transfers between devices are an op: ops/op_to_device.c). A tensor's
 * device is its storage's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "tensor.h"

static const char no_opencl_build[] =
    "this build of needle-lua has no OpenCL backend (install the headers and ICD loader, "
    "e.g. apt install ocl-icd-opencl-dev opencl-c-headers, and rebuild with "
    "-DNEEDLE_OPENCL=ON)";

nd_device nd_get_device(const nd_tensor *t) {
    nd_device d = {t->storage->device, t->storage->device_index};
    return d;
}

const char *nd_device_str(nd_device d, char *buf) {
    if (d.type == ND_DEVICE_CPU) snprintf(buf, 32, "cpu");
    else snprintf(buf, 32, "opencl:%d", d.index);
    return buf;
}

nd_status nd_check_same_device(const char *op, const nd_tensor *a, const nd_tensor *b) {
    if (nd_same_device(a, b)) return ND_OK;
    char da[32], db[32];
    return nd_fail(ND_ERR_DEVICE, "%s: expected all tensors on one device, got %s and %s "
                   "(move one with :to(device))", op, nd_device_str(nd_get_device(a), da),
                   nd_device_str(nd_get_device(b), db));
}

/* ---------------------------------------------------------------- OpenCL info */

int nd_opencl_device_count(void) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    return be ? be->device_count() : 0;
}

uint64_t nd_opencl_launch_count(void) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    return be && be->launch_count ? be->launch_count() : 0;
}

nd_status nd_opencl_timing(bool on) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    return be && be->timing ? be->timing(on) : ND_OK;
}

nd_status nd_opencl_kernel_times(const nd_opencl_kernel_time **rows, int *n) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    *rows = NULL;
    *n = 0;
    return be && be->kernel_times ? be->kernel_times(rows, n) : ND_OK;
}

const char *nd_opencl_unavailable_reason(void) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    return be ? be->unavailable_reason() : no_opencl_build;
}

nd_status nd_opencl_device_info(int index, nd_opencl_info *out) {
    const nd_backend *be = nd_backend_for(ND_DEVICE_OPENCL);
    if (!be) return nd_fail(ND_ERR_DEVICE, "opencl: %s", no_opencl_build);
    return be->device_info(index, out);
}

nd_status nd_check_opencl_index(int index, const char *name) {
    int n = nd_opencl_device_count();
    if (n == 0) return nd_fail(ND_ERR_DEVICE, "device '%s': no OpenCL device: %s", name,
                               nd_opencl_unavailable_reason());
    if (index < 0 || index >= n)
        return nd_fail(ND_ERR_DEVICE, "device '%s': no such OpenCL device (%d available: "
                       "opencl:0..opencl:%d; nd.devices() lists them)", name, n, n - 1);
    return ND_OK;
}

nd_status nd_device_parse(const char *name, nd_device *out) {
    if (!name) return nd_fail(ND_ERR_ARG, "device: expected a device name");
    if (strcmp(name, "cpu") == 0) { *out = nd_cpu_device(); return ND_OK; }
    if (strncmp(name, "opencl", 6) == 0 && (name[6] == 0 || name[6] == ':')) {
        int index;
        if (name[6] == 0) {
            ND_TRY(nd_check_opencl_index(0, name));
            ND_TRY(nd_backend_for(ND_DEVICE_OPENCL)->default_device(&index));
        } else {
            char *end;
            long v = strtol(name + 7, &end, 10);
            if (name[7] == 0 || *end || v < 0 || v > 1000)
                return nd_fail(ND_ERR_ARG, "device: '%s' is not a device name (expected \"cpu\", "
                               "\"opencl\" or \"opencl:N\")", name);
            index = (int)v;
            ND_TRY(nd_check_opencl_index(index, name));
        }
        out->type = ND_DEVICE_OPENCL;
        out->index = index;
        return ND_OK;
    }
    return nd_fail(ND_ERR_ARG, "device: '%s' is not a device name (expected \"cpu\", \"opencl\" "
                   "or \"opencl:N\")", name);
}

nd_status nd_synchronize(nd_device d) {
    const nd_backend *be = nd_backend_for(d.type);
    if (!be || !be->synchronize) return ND_OK;
    return be->synchronize(d.index);
}
