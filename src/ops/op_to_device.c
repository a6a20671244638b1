/* op_to_device.c - moving tensors between devices (differentiable: the
 * gradient goes back to the source's device). Transfers go through the
 * host: the source is made contiguous on its own device, then its bytes are
 * read or written in one blocking call of the device backend. */
#include "backend_call.h"
#include "grad_fns.h"

/* ---------------------------------------------------------------- transfers */

/* A contiguous copy of t (any device) on dev, without recording. */
static nd_status transfer(const nd_tensor *t, nd_device dev, nd_tensor **out) {
    nd_tensor *c;
    ND_TRY(nd_contiguous(t, &c));
    size_t nbytes = (size_t)nd_numel(c) * nd_dtype_size(t->dtype);
    nd_tensor *r = NULL, *host = NULL;
    nd_status st = ND_OK;
    if (!nd_on_cpu(c)) { /* device -> host */
        st = nd_empty(c->shape, c->ndim, c->dtype, &host);
        if (st == ND_OK && nbytes)
            st = ND_BACKEND_CALL(nd_backend_of(c), read, "to", host, c);
    } else {
        host = c;
        nd_retain(c);
    }
    if (st == ND_OK && dev.type == ND_DEVICE_CPU) {
        r = host;
        host = NULL;
    } else if (st == ND_OK) { /* host -> device */
        st = nd_empty_on(dev, c->shape, c->ndim, c->dtype, &r);
        if (st == ND_OK && nbytes) st = ND_BACKEND_CALL(nd_backend_of(r), write, "to", r, host);
        if (st != ND_OK) { nd_release(r); r = NULL; }
    }
    nd_release(host);
    nd_release(c);
    *out = r;
    return st;
}

nd_status nd_to_host(const nd_tensor *t, nd_tensor **out) {
    *out = NULL;
    ND_TRY(nd_graph_check_host_read("to_host"));
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
        ND_TRY(nd_check_opencl_index(dev.index, name));
    }
    return transfer(t, dev, out);
}

static nd_status record_to_device(const nd_tensor *t, nd_tensor *out) {
    if (out == t || !nd_dtype_is_float(out->dtype)) return ND_OK;
    nd_node *n;
    const nd_tensor *in[1] = {t};
    ND_TRY(nd_record(ND_OP_to, bw_to_device, out, 1, in, &n));
    if (n) {
        n->iparams[0] = t->storage->device;
        n->iparams[1] = t->storage->device_index;
    }
    return ND_OK;
}

nd_status nd_to_device(const nd_tensor *t, nd_device dev, nd_tensor **out) {
    ND_FORWARD_THEN_RECORD(to_device_forward(t, dev, out), record_to_device(t, *out), out);
}
