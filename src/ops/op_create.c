/* op_create.c - arange, linspace, eye, filled tensors (full, zeros), copying out to a
 * caller's buffer. */
#include <math.h>
#include <string.h>
#include "backend_call.h"

nd_status nd_arange(double start, double end, double step, nd_dtype dt, nd_tensor **out) {
    if (step == 0 || isnan(step) || isnan(start) || isnan(end))
        return nd_fail(ND_ERR_ARG, "arange: step must be non-zero and bounds finite (got start=%g "
                       "end=%g step=%g)", start, end, step);
    if ((end - start) / step > (double)ND_MAX_NUMEL)
        return nd_fail(ND_ERR_MEMORY, "arange: %g elements is too many", (end - start) / step);
    double n = ceil((end - start) / step);
    int64_t len = n > 0 ? (int64_t)n : 0;
    if (len > 0 && nd_dtype_is_int(dt)) { /* the ends must fit: no saturated run of 255s */
        ND_TRY(nd_check_number_fits("arange", dt, nd_num_f(trunc(start))));
        ND_TRY(nd_check_number_fits("arange", dt, nd_num_f(trunc(start + (double)(len - 1) * step))));
    }
    ND_TRY(nd_empty(&len, 1, dt, out));
    char *p = nd_ptr(*out);
    size_t es = nd_dtype_size(dt);
    for (int64_t i = 0; i < len; i++) nd_store_f64(p + i * (int64_t)es, dt, start + (double)i * step);
    return ND_OK;
}

nd_status nd_linspace(double start, double end, int64_t steps, nd_dtype dt, nd_tensor **out) {
    if (steps < 0) return nd_fail(ND_ERR_ARG, "linspace: steps must be >= 0, got %lld", (long long)steps);
    if (steps > 0 && nd_dtype_is_int(dt)) { /* as arange: the ends must fit, every value lies between */
        ND_TRY(nd_check_number_fits("linspace", dt, nd_num_f(trunc(start))));
        if (steps > 1) ND_TRY(nd_check_number_fits("linspace", dt, nd_num_f(trunc(end))));
    }
    ND_TRY(nd_empty(&steps, 1, dt, out));
    char *p = nd_ptr(*out);
    size_t es = nd_dtype_size(dt);
    double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
    /* fill symmetric halves from each end, as PyTorch, so the last value is exactly end */
    int64_t half = (steps + 1) / 2; /* steps == 1 gives just start, as PyTorch */
    for (int64_t i = 0; i < steps; i++) {
        double v = i < half ? start + step * (double)i : end - step * (double)(steps - 1 - i);
        nd_store_f64(p + i * (int64_t)es, dt, v);
    }
    return ND_OK;
}

nd_status nd_eye(int64_t n, int64_t m, nd_dtype dt, nd_tensor **out) {
    if (m < 0) m = n;
    int64_t shape[2] = {n, m};
    ND_TRY(nd_zeros(shape, 2, dt, out));
    char *p = nd_ptr(*out);
    size_t es = nd_dtype_size(dt);
    for (int64_t i = 0; i < n && i < m; i++) nd_store_f64(p + (i * m + i) * (int64_t)es, dt, 1);
    return ND_OK;
}

/* ------------------------------------------------ filled tensors, copies out */

nd_status nd_full_on(nd_device dev, const int64_t *shape, int ndim, nd_dtype dt, double value,
                     nd_tensor **out) {
    ND_TRY(nd_empty_on(dev, shape, ndim, dt, out));
    nd_status st = nd_fill_(*out, value);
    if (st != ND_OK) { nd_release(*out); *out = NULL; }
    return st;
}

nd_status nd_full(const int64_t *shape, int ndim, nd_dtype dt, double value, nd_tensor **out) {
    return nd_full_on(nd_cpu_device(), shape, ndim, dt, value, out);
}

nd_status nd_zeros_on(nd_device dev, const int64_t *shape, int ndim, nd_dtype dt,
                      nd_tensor **out) {
    if (dev.type != ND_DEVICE_CPU) return nd_full_on(dev, shape, ndim, dt, 0, out);
    ND_TRY(nd_empty(shape, ndim, dt, out));
    memset(nd_ptr(*out), 0, (*out)->storage->nbytes); /* all-zero bits are 0 in every dtype */
    return ND_OK;
}

nd_status nd_zeros(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out) {
    return nd_zeros_on(nd_cpu_device(), shape, ndim, dt, out);
}

nd_status nd_scalar(double value, nd_dtype dt, nd_tensor **out) {
    return nd_full(NULL, 0, dt, value, out);
}

nd_status nd_copy_to_buffer(const nd_tensor *t, void *dst, size_t dst_bytes) {
    size_t need = (size_t)nd_numel(t) * nd_dtype_size(t->dtype);
    if (dst_bytes != need)
        return nd_fail(ND_ERR_ARG, "copy_to_buffer: buffer has %zu bytes, tensor needs %zu",
                       dst_bytes, need);
    nd_tensor *view, *host;
    ND_TRY(nd_to_host(t, &host));
    nd_status st = nd_from_borrowed(dst, t->shape, t->ndim, t->dtype, NULL, NULL, &view);
    if (st == ND_OK) st = nd_copy_(view, host);
    nd_release(view);
    nd_release(host);
    return st;
}
