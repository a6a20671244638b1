/* ocl_elementwise.c - copy, fill, unary, binary, scalar, where and clamp on
 * OpenCL (kernels/elementwise.cl, kernels/copy.cl). Each launch merges the
 * operands' dims (ocl_geom_make) and takes the flat kernel when everything
 * is contiguous. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "ocl_kernels.h"


static nd_status ew_kernel(ocl_device *d, nd_dtype dt, const char *name, const char *op,
                           cl_kernel *k) {
    ND_TRY(ocl_check_dtype(d, dt, op));
    char defs[128];
    ocl_dtype_defines(dt, defs, sizeof defs);
    return ocl_kernel(d, "elementwise", defs, name, k);
}

/* Sets the geometry and buffer arguments common to the strided kernels:
 * args first.. are (n, geom, buf0, buf1, ...). */
static cl_int set_strided(cl_kernel k, int first, int64_t n, const ocl_geom *g, int nops,
                          const nd_tensor *const *ts) {
    cl_long nn = n;
    cl_int e = ocl_set_arg(k, first, sizeof nn, &nn);
    e |= ocl_set_arg(k, first + 1, sizeof *g, g);
    for (int i = 0; i < nops; i++) {
        cl_mem m = ocl_mem(ts[i]);
        e |= ocl_set_arg(k, first + 2 + i, sizeof m, &m);
    }
    return e;
}

nd_status ocl_run_strided(ocl_device *d, cl_kernel k, const char *op, int first, int nops,
                          const nd_tensor *const *ts) {
    int64_t n = nd_numel(ts[0]);
    if (n == 0) return ND_OK;
    ocl_geom g;
    ocl_geom_make(&g, nops, ts);
    cl_int e = set_strided(k, first, n, &g, nops, ts);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return ocl_launch_1d(d, k, op, n);
}

/* ---------------------------------------------------------------- copy */

nd_status ocl_copy(nd_tensor *dst, const nd_tensor *src) {
    ocl_device *d = ocl_dev(dst);
    ND_TRY(ocl_check_dtype(d, dst->dtype, "copy"));
    ND_TRY(ocl_check_dtype(d, src->dtype, "copy"));
    char defs[160];
    snprintf(defs, sizeof defs, "-DSRC_T=%s -DSRC_ID=%d -DDST_T=%s -DDST_ID=%d",
             ocl_type_name(src->dtype), (int)src->dtype, ocl_type_name(dst->dtype), (int)dst->dtype);
    int64_t n = nd_numel(dst);
    if (n == 0) return ND_OK;
    const nd_tensor *ts[2] = {dst, src};
    ocl_geom g;
    ocl_geom_make(&g, 2, ts);
    cl_kernel k;
    if (ocl_geom_is_flat(&g, 2)) {
        if (dst->dtype == src->dtype) { /* a plain buffer copy */
            size_t es = nd_dtype_size(dst->dtype);
            cl_event ev = NULL;
            size_t bytes = (size_t)n * es;
            cl_int e = clEnqueueCopyBuffer(d->queue, ocl_mem(src), ocl_mem(dst),
                                           (size_t)g.offset[1] * es, (size_t)g.offset[0] * es,
                                           bytes, 0, NULL, OCL_TIMING_EVENT(ev));
            if (e != CL_SUCCESS) return ocl_fail(e, "copy", "clEnqueueCopyBuffer", d);
            ocl_timing_note(ev, "clEnqueueCopyBuffer", "copy", 1, &bytes);
            ocl_prepare_note_copy(d, ocl_mem(src), ocl_mem(dst), (size_t)g.offset[1] * es,
                                  (size_t)g.offset[0] * es, (size_t)n * es);
            return ND_OK;
        }
        ND_TRY(ocl_kernel(d, "copy", defs, "copy_flat", &k));
        cl_long nn = n, doff = g.offset[0], soff = g.offset[1];
        cl_mem dm = ocl_mem(dst), sm = ocl_mem(src);
        cl_int e = OCL_ARG(k, 0, nn) | OCL_ARG(k, 1, dm) | OCL_ARG(k, 2, doff) |
                   OCL_ARG(k, 3, sm) | OCL_ARG(k, 4, soff);
        if (e != CL_SUCCESS) return ocl_fail(e, "copy", "setting kernel arguments", d);
        return ocl_launch_1d(d, k, "copy", n);
    }
    ND_TRY(ocl_kernel(d, "copy", defs, "copy_strided", &k));
    cl_int e = set_strided(k, 0, n, &g, 2, ts);
    if (e != CL_SUCCESS) return ocl_fail(e, "copy", "setting kernel arguments", d);
    return ocl_launch_1d(d, k, "copy", n);
}

/* ---------------------------------------------------------------- fill */

nd_status ocl_fill(nd_tensor *dst, const void *value) {
    ocl_device *d = ocl_dev(dst);
    int64_t n = nd_numel(dst);
    if (n == 0) return ND_OK;
    size_t es = nd_dtype_size(dst->dtype);
    const nd_tensor *ts[1] = {dst};
    ocl_geom g;
    ocl_geom_make(&g, 1, ts);
    if (ocl_geom_is_flat(&g, 1)) { /* the driver's fill */
        cl_event ev = NULL;
        size_t bytes = (size_t)n * es;
        cl_int e = clEnqueueFillBuffer(d->queue, ocl_mem(dst), value, es, (size_t)g.offset[0] * es,
                                       bytes, 0, NULL, OCL_TIMING_EVENT(ev));
        if (e != CL_SUCCESS) return ocl_fail(e, "fill", "clEnqueueFillBuffer", d);
        ocl_timing_note(ev, "clEnqueueFillBuffer", "fill", 1, &bytes);
        ocl_prepare_note_fill(d, ocl_mem(dst), value, es, (size_t)g.offset[0] * es, (size_t)n * es);
        return ND_OK;
    }
    cl_kernel k;
    ND_TRY(ew_kernel(d, dst->dtype, "fill_strided", "fill", &k));
    cl_int e = ocl_set_arg(k, 0, es, value);
    if (e != CL_SUCCESS) return ocl_fail(e, "fill", "setting kernel arguments", d);
    return ocl_run_strided(d, k, "fill", 1, 1, ts);
}

/* ---------------------------------------------------------------- unary, binary */

nd_status ocl_unary(nd_unary_op op, nd_tensor *out, const nd_tensor *x) {
    ocl_device *d = ocl_dev(out);
    const char *name = nd_unary_name(op);
    if (!ocl_unary_has_kernel(op, x->dtype)) return nd_fail_dtype_kernel(name, x->dtype);
    cl_kernel k;
    ND_TRY(ew_kernel(d, x->dtype, "unary_strided", name, &k));
    cl_int o = op;
    cl_int e = OCL_ARG(k, 0, o);
    if (e != CL_SUCCESS) return ocl_fail(e, name, "setting kernel arguments", d);
    const nd_tensor *ts[2] = {out, x};
    return ocl_run_strided(d, k, name, 1, 2, ts);
}

nd_status ocl_binary(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    ocl_device *d = ocl_dev(out);
    const char *name = nd_binary_name(op);
    if (!ocl_binary_has_kernel(op, a->dtype)) return nd_fail_dtype_kernel(name, a->dtype);
    bool cmp = ocl_binary_is_comparison(op);
    cl_kernel k;
    ND_TRY(ew_kernel(d, a->dtype, cmp ? "compare_strided" : "binary_strided", name, &k));
    cl_int o = op;
    cl_int e = OCL_ARG(k, 0, o);
    if (e != CL_SUCCESS) return ocl_fail(e, name, "setting kernel arguments", d);
    const nd_tensor *ts[3] = {out, a, b};
    return ocl_run_strided(d, k, name, 1, 3, ts);
}

nd_status ocl_binary_scalar(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                            int scalar_first) {
    ocl_device *d = ocl_dev(out);
    const char *name = nd_binary_name(op);
    if (!ocl_binary_has_kernel(op, a->dtype)) return nd_fail_dtype_kernel(name, a->dtype);
    bool cmp = ocl_binary_is_comparison(op);
    cl_kernel k;
    ND_TRY(ew_kernel(d, a->dtype, cmp ? "compare_scalar_strided" : "scalar_strided", name, &k));
    cl_int o = op, sf = scalar_first;
    cl_int e = OCL_ARG(k, 0, o) | OCL_ARG(k, 1, sf) |
               ocl_set_arg(k, 2, nd_dtype_size(a->dtype), s);
    if (e != CL_SUCCESS) return ocl_fail(e, name, "setting kernel arguments", d);
    const nd_tensor *ts[2] = {out, a};
    return ocl_run_strided(d, k, name, 3, 2, ts);
}

nd_status ocl_where(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b) {
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(ew_kernel(d, out->dtype, "where_strided", "where", &k));
    const nd_tensor *ts[4] = {out, cond, a, b};
    return ocl_run_strided(d, k, "where", 0, 4, ts);
}

/* Integer bounds as the CPU's: the smallest integer >= lo, the largest <= hi. */
static int64_t bound_i64(double v, bool lower, int64_t lo_lim, int64_t hi_lim) {
    if (isnan(v)) return lower ? lo_lim : hi_lim;
    v = lower ? ceil(v) : floor(v);
    if (v <= (double)lo_lim) return lo_lim;
    if (v >= (double)hi_lim) return hi_lim;
    return (int64_t)v;
}

nd_status ocl_clamp(nd_tensor *out, const nd_tensor *x, double lo, double hi) {
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(ew_kernel(d, x->dtype, "clamp_strided", "clamp", &k));
    _Alignas(8) unsigned char l[8], h[8];
    switch (x->dtype) {
    case ND_FLOAT32: {
        float a = isnan(lo) ? -INFINITY : (float)lo, b = isnan(hi) ? INFINITY : (float)hi;
        memcpy(l, &a, 4); memcpy(h, &b, 4);
        break;
    }
    case ND_FLOAT64: {
        double a = isnan(lo) ? -INFINITY : lo, b = isnan(hi) ? INFINITY : hi;
        memcpy(l, &a, 8); memcpy(h, &b, 8);
        break;
    }
    case ND_INT64: {
        int64_t a = bound_i64(lo, true, INT64_MIN, INT64_MAX), b = bound_i64(hi, false, INT64_MIN, INT64_MAX);
        memcpy(l, &a, 8); memcpy(h, &b, 8);
        break;
    }
    case ND_INT32: {
        int32_t a = (int32_t)bound_i64(lo, true, INT32_MIN, INT32_MAX);
        int32_t b = (int32_t)bound_i64(hi, false, INT32_MIN, INT32_MAX);
        memcpy(l, &a, 4); memcpy(h, &b, 4);
        break;
    }
    case ND_UINT8: {
        uint8_t a = (uint8_t)bound_i64(lo, true, 0, 255), b = (uint8_t)bound_i64(hi, false, 0, 255);
        l[0] = a; h[0] = b;
        break;
    }
    default:
        return nd_fail(ND_ERR_DTYPE, "clamp: no OpenCL kernel for %s", nd_dtype_name(x->dtype));
    }
    size_t es = nd_dtype_size(x->dtype);
    cl_int e = ocl_set_arg(k, 0, es, l) | ocl_set_arg(k, 1, es, h);
    if (e != CL_SUCCESS) return ocl_fail(e, "clamp", "setting kernel arguments", d);
    const nd_tensor *ts[2] = {out, x};
    return ocl_run_strided(d, k, "clamp", 2, 2, ts);
}
