/* device.c - devices: names, transfers between them, the same-device rule.
 *
 * A tensor's device is its storage's. Transfers go through the host: the
 * source is made contiguous on its own device, then its bytes are read or
 * written in one blocking call of the device backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "autograd.h"
#include "backend.h"
#include "ops/grad_fns.h"
#include "tensor.h"

#ifdef NEEDLE_HAVE_OPENCL
#include "backends/opencl/ocl_runtime.h"
#endif

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
#ifdef NEEDLE_HAVE_OPENCL
    return nd_ocl_device_count();
#else
    return 0;
#endif
}

const char *nd_opencl_unavailable_reason(void) {
#ifdef NEEDLE_HAVE_OPENCL
    return nd_ocl_unavailable_reason();
#else
    return "this build of needle-lua has no OpenCL backend (install the headers and ICD loader, "
           "e.g. apt install ocl-icd-opencl-dev opencl-c-headers, and rebuild with "
           "-DNEEDLE_OPENCL=ON)";
#endif
}

nd_status nd_opencl_device_info(int index, nd_opencl_info *out) {
#ifdef NEEDLE_HAVE_OPENCL
    return nd_ocl_device_info(index, out);
#else
    (void)index; (void)out;
    return nd_fail(ND_ERR_DEVICE, "opencl: %s", nd_opencl_unavailable_reason());
#endif
}

static nd_status check_opencl_index(int index, const char *name) {
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
#ifdef NEEDLE_HAVE_OPENCL
            ND_TRY(check_opencl_index(0, name));
            ND_TRY(nd_ocl_default_device(&index));
#else
            ND_TRY(check_opencl_index(0, name));
            index = 0;
#endif
        } else {
            char *end;
            long v = strtol(name + 7, &end, 10);
            if (name[7] == 0 || *end || v < 0 || v > 1000)
                return nd_fail(ND_ERR_ARG, "device: '%s' is not a device name (expected \"cpu\", "
                               "\"opencl\" or \"opencl:N\")", name);
            index = (int)v;
            ND_TRY(check_opencl_index(index, name));
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

/* ---------------------------------------------------------------- transfers */

/* A contiguous copy of t (any device) on dev, without recording. */
static nd_status transfer(const nd_tensor *t, nd_device dev, nd_tensor **out) {
    nd_tensor *c;
    ND_TRY(nd_contiguous(t, &c));
    size_t es = nd_dtype_size(t->dtype);
    size_t nbytes = (size_t)nd_numel(c) * es;
    nd_tensor *r = NULL, *host = NULL;
    nd_status st = ND_OK;
    if (!nd_on_cpu(c)) { /* device -> host */
        st = nd_empty(c->shape, c->ndim, c->dtype, &host);
        if (st == ND_OK && nbytes)
            st = nd_backend_of(c)->read(c->storage, (size_t)c->offset * es, nd_ptr(host), nbytes);
    } else {
        host = c;
        nd_retain(c);
    }
    if (st == ND_OK && dev.type == ND_DEVICE_CPU) {
        r = host;
        host = NULL;
    } else if (st == ND_OK) { /* host -> device */
        st = nd_empty_on(dev, c->shape, c->ndim, c->dtype, &r);
        if (st == ND_OK && nbytes) st = nd_backend_of(r)->write(r->storage, 0, nd_ptr(host), nbytes);
        if (st != ND_OK) { nd_release(r); r = NULL; }
    }
    nd_release(host);
    nd_release(c);
    *out = r;
    return st;
}

nd_status nd_to_host(const nd_tensor *t, nd_tensor **out) {
    if (nd_on_cpu(t)) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    bool on = nd_set_grad_enabled(false);
    nd_status st = transfer(t, nd_cpu_device(), out);
    nd_set_grad_enabled(on);
    return st;
}

static nd_status bw_to_device(nd_node *n, nd_tensor *g, nd_tensor **grads) {
    nd_device d = {(nd_device_type)n->iparams[0], (int)n->iparams[1]};
    return nd_to_device(g, d, &grads[0]);
}

static nd_status to_device_forward(const nd_tensor *t, nd_device dev, nd_tensor **out) {
    nd_device cur = nd_get_device(t);
    if (cur.type == dev.type && cur.index == dev.index) {
        nd_retain((nd_tensor *)t);
        *out = (nd_tensor *)t;
        return ND_OK;
    }
    if (dev.type != ND_DEVICE_CPU) {
        char name[32];
        nd_device_str(dev, name);
        ND_TRY(check_opencl_index(dev.index, name));
    }
    return transfer(t, dev, out);
}

static nd_status record_to_device(const nd_tensor *t, nd_tensor *out) {
    if (out == t || !nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {t};
    ND_TRY(nd_record("to", bw_to_device, out, 1, in, &n));
    if (n) {
        n->iparams[0] = t->storage->device;
        n->iparams[1] = t->storage->device_index;
    }
    return ND_OK;
}

nd_status nd_to_device(const nd_tensor *t, nd_device dev, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(to_device_forward(t, dev, out), record_to_device(t, *out), out);
}
