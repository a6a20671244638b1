/* ocl_index.c - gather, scatter, index_select, index_add and masked_fill
 * on OpenCL (kernels/index.cl), with the CPU's semantics (cpu_index.c).
 *
 * Index values are checked before anything is written, as on the CPU: a
 * kernel raises a flag when any index is out of range, and only then is the
 * index read on the host to name the first bad value with the CPU's message
 * (so the common case costs one 4-byte read, not a copy of the index).
 *
 * Moves go through programs built for an integer type of the element's
 * size; scatter_add and index_add use one per-dtype kernel in which each
 * work-item owns one lane of destinations, so results are deterministic and
 * equal to the CPU's bit for bit. */
#include <stdio.h>
#include <string.h>
#include "ocl_kernels.h"

/* The kernel `name` of index.cl for moving elements of dt (by size), or,
 * with acc, for accumulating in dt. */
static nd_status ix_kernel(ocl_device *d, nd_dtype dt, bool acc, const char *name,
                           const char *op, cl_kernel *k) {
    char defs[160];
    if (acc) {
        ND_TRY(ocl_check_dtype(d, dt, op));
        ocl_dtype_defines(dt, defs, sizeof defs);
        strncat(defs, " -DACC=1", sizeof defs - strlen(defs) - 1);
    } else {
        nd_dtype mv;
        switch (nd_dtype_size(dt)) {
        case 1: mv = ND_UINT8; break;
        case 2: mv = ND_FLOAT16; break; /* ushort */
        case 4: mv = ND_INT32; break;
        default: mv = ND_INT64; break;
        }
        ocl_dtype_defines(mv, defs, sizeof defs);
    }
    return ocl_kernel(d, "index", defs, name, k);
}

/* ---------------------------------------------------------------- checks */

/* A contiguous host copy of t (device memory): copied into a contiguous
 * buffer on the device, then read in one transfer. */
static nd_status ocl_to_host(const nd_tensor *t, nd_tensor **out) {
    nd_tensor *c = NULL, *h = NULL;
    nd_status st = nd_empty_on(nd_get_device(t), t->shape, t->ndim, t->dtype, &c);
    if (st == ND_OK) st = ocl_copy(c, t);
    if (st == ND_OK) st = nd_empty(t->shape, t->ndim, t->dtype, &h);
    size_t nbytes = (size_t)nd_numel(t) * nd_dtype_size(t->dtype);
    if (st == ND_OK && nbytes) st = ocl_read(c->storage, 0, nd_ptr(h), nbytes);
    nd_release(c);
    if (st != ND_OK) { nd_release(h); h = NULL; }
    *out = h;
    return st;
}

/* The CPU's message (cpu_index.c check_indices) for the first value of the
 * host copy of index outside [0, limit). */
static nd_status index_error(const char *op, const nd_tensor *index, int64_t limit, int dim) {
    nd_tensor *h;
    ND_TRY(ocl_to_host(index, &h));
    const int64_t *v = (const int64_t *)nd_ptr(h);
    int64_t n = nd_numel(h), bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if ((uint64_t)v[i] >= (uint64_t)limit) bad = i;
    if (bad < 0) { /* the flag and the values disagree: should not happen */
        nd_release(h);
        return nd_fail(ND_ERR_INTERNAL, "%s: the OpenCL index check flagged an index out of "
                       "bounds but none is", op);
    }
    int64_t val = v[bad];
    nd_release(h);
    return nd_fail_index_bounds(op, index, bad, val, dim, limit);
}

/* Fails as the CPU does when a value of index lies outside [0, limit). */
static nd_status check_indices(const char *op, const nd_tensor *index, int64_t limit, int dim) {
    if (nd_numel(index) == 0) return ND_OK;
    ocl_device *d = ocl_dev(index);
    cl_kernel k;
    ND_TRY(ix_kernel(d, ND_INT64, false, "check_index", op, &k));
    cl_int flag = 0;
    cl_mem fm;
    ND_TRY(ocl_upload(d, &flag, sizeof flag, op, &fm));
    cl_long lim = limit;
    cl_int e = OCL_ARG(k, 0, lim) | OCL_ARG(k, 1, fm);
    nd_status st = e != CL_SUCCESS ? ocl_fail(e, op, "setting kernel arguments", d) : ND_OK;
    const nd_tensor *ts[1] = {index};
    if (st == ND_OK) st = ocl_run_strided(d, k, op, 2, 1, ts);
    if (st == ND_OK) {
        e = clEnqueueReadBuffer(d->queue, fm, CL_TRUE, 0, sizeof flag, &flag, 0, NULL, NULL);
        if (e != CL_SUCCESS) st = ocl_fail(e, op, "reading the index check", d);
    }
    clReleaseMemObject(fm);
    ND_TRY(st);
    return flag ? index_error(op, index, limit, dim) : ND_OK;
}

/* ---------------------------------------------------------------- pick */

/* out = x[.. idx ..] with the index and x already seen in out's shape. */
static nd_status run_pick(const char *op, nd_tensor *out, const nd_tensor *idx_view,
                          const nd_tensor *x_view, int64_t xd) {
    if (nd_numel(out) == 0) return ND_OK;
    ocl_device *d = ocl_dev(out);
    cl_kernel k;
    ND_TRY(ix_kernel(d, out->dtype, false, "pick", op, &k));
    cl_long x_d = xd;
    cl_int e = OCL_ARG(k, 0, x_d);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    const nd_tensor *ts[3] = {out, idx_view, x_view};
    return ocl_run_strided(d, k, op, 1, 3, ts);
}

nd_status ocl_gather(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    int64_t limit = x->ndim ? x->shape[dim] : 1;
    ND_TRY(check_indices("gather", index, limit, dim));
    /* x seen in index's shape, not moving along dim: the index moves it */
    int64_t st[ND_MAX_DIMS];
    for (int i = 0; i < index->ndim; i++) st[i] = i == dim ? 0 : x->strides[i];
    nd_tensor *xv;
    ND_TRY(nd_tensor_view_of(x, index->shape, st, index->ndim, x->offset, &xv));
    nd_status s = run_pick("gather", out, index, xv, x->ndim ? x->strides[dim] : 0);
    nd_release(xv);
    return s;
}

nd_status ocl_index_select(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    int64_t limit = x->ndim ? x->shape[dim] : 1;
    ND_TRY(check_indices("index_select", index, limit, dim));
    if (nd_numel(out) == 0) return ND_OK;
    int64_t xst[ND_MAX_DIMS], ist[ND_MAX_DIMS];
    for (int i = 0; i < out->ndim; i++) {
        xst[i] = i == dim ? 0 : x->strides[i];
        ist[i] = i == dim && index->ndim ? index->strides[0] : 0;
    }
    nd_tensor *xv = NULL, *iv = NULL;
    nd_status s = nd_tensor_view_of(x, out->shape, xst, out->ndim, x->offset, &xv);
    if (s == ND_OK) s = nd_tensor_view_of(index, out->shape, ist, out->ndim, index->offset, &iv);
    if (s == ND_OK) s = run_pick("index_select", out, iv, xv, x->ndim ? x->strides[dim] : 0);
    nd_release(xv);
    nd_release(iv);
    return s;
}

/* ---------------------------------------------------------------- scatter, index_add */

/* alpha in the kernel's ALPHA_T (index.cl) for dtype dt: bytes and size. */
static size_t alpha_bytes(const ocl_device *d, nd_dtype dt, double alpha, void *buf) {
    switch (dt) {
    case ND_FLOAT32: { float a = (float)alpha; memcpy(buf, &a, 4); return 4; }
    case ND_FLOAT64: memcpy(buf, &alpha, 8); return 8;
    /* integers: the op checked alpha is an integer within int64's range;
     * converted as the CPU does, then wrapped into the dtype */
    case ND_INT64: { uint64_t a = (uint64_t)(int64_t)alpha; memcpy(buf, &a, 8); return 8; }
    case ND_INT32: { uint32_t a = (uint32_t)(uint64_t)(int64_t)alpha; memcpy(buf, &a, 4); return 4; }
    case ND_UINT8: { uint8_t a = (uint8_t)(int64_t)alpha; memcpy(buf, &a, 1); return 1; }
    case ND_BOOL: { uint8_t a = alpha != 0; memcpy(buf, &a, 1); return 1; }
    default: /* half types: acc_t */
        if (d->info.fp64) { memcpy(buf, &alpha, 8); return 8; }
        { float a = (float)alpha; memcpy(buf, &a, 4); return 4; }
    }
}

/* Runs the lane kernel: out_v, idx_v and src_v are out, index and src seen
 * in the lane shape; K steps along dim with strides os, is, ss. */
static nd_status run_lanes(const char *op, const nd_tensor *out_v, const nd_tensor *idx_v,
                           const nd_tensor *src_v, int64_t K, int64_t os, int64_t is, int64_t ss,
                           bool acc, double alpha) {
    if (nd_numel(out_v) == 0 || K == 0) return ND_OK;
    ocl_device *d = ocl_dev(out_v);
    cl_kernel k;
    ND_TRY(ix_kernel(d, out_v->dtype, acc, acc ? "scatter_add" : "scatter_set", op, &k));
    cl_int e = CL_SUCCESS;
    int a = 0;
    if (acc) {
        _Alignas(8) unsigned char ab[8];
        size_t n = alpha_bytes(d, out_v->dtype, alpha, ab);
        e |= ocl_set_arg(k, a++, n, ab);
    }
    cl_long kk = K, o_s = os, i_s = is, s_s = ss;
    e |= ocl_set_arg(k, a, sizeof kk, &kk);
    e |= ocl_set_arg(k, a + 1, sizeof o_s, &o_s);
    e |= ocl_set_arg(k, a + 2, sizeof i_s, &i_s);
    e |= ocl_set_arg(k, a + 3, sizeof s_s, &s_s);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    const nd_tensor *ts[3] = {out_v, idx_v, src_v};
    return ocl_run_strided(d, k, op, a + 4, 3, ts);
}

nd_status ocl_scatter(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                      int accumulate) {
    const char *op = accumulate ? "scatter_add" : "scatter";
    int64_t limit = out->ndim ? out->shape[dim] : 1;
    ND_TRY(check_indices(op, index, limit, dim));
    if (nd_numel(index) == 0) return ND_OK;
    /* lanes: index's shape with dim collapsed to 1 */
    int nd = index->ndim;
    int64_t lane[ND_MAX_DIMS];
    memcpy(lane, index->shape, sizeof(int64_t) * (size_t)nd);
    int64_t K = 1, os = 0, is = 0, ss = 0;
    if (nd) {
        K = index->shape[dim];
        lane[dim] = 1;
        os = out->strides[dim];
        is = index->strides[dim];
        ss = src->strides[dim];
    }
    nd_tensor *ov = NULL, *iv = NULL, *sv = NULL;
    nd_status s = nd_tensor_view_of(out, lane, out->strides, nd, out->offset, &ov);
    if (s == ND_OK) s = nd_tensor_view_of(index, lane, index->strides, nd, index->offset, &iv);
    if (s == ND_OK) s = nd_tensor_view_of(src, lane, src->strides, nd, src->offset, &sv);
    if (s == ND_OK) s = run_lanes(op, ov, iv, sv, K, os, is, ss, accumulate != 0, 1.0);
    nd_release(ov);
    nd_release(iv);
    nd_release(sv);
    return s;
}

nd_status ocl_index_add(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                        double alpha) {
    int64_t limit = out->ndim ? out->shape[dim] : 1;
    ND_TRY(check_indices("index_add", index, limit, dim));
    /* lanes: src's shape with dim collapsed; every lane reads the whole
     * (1-D) index, so its view has stride 0 everywhere */
    int nd = src->ndim;
    int64_t lane[ND_MAX_DIMS], zero[ND_MAX_DIMS] = {0};
    memcpy(lane, src->shape, sizeof(int64_t) * (size_t)nd);
    int64_t K = nd_numel(index), os = 0, ss = 0;
    int64_t is = index->ndim ? index->strides[0] : 0;
    if (nd) {
        lane[dim] = 1;
        os = out->strides[dim];
        ss = src->strides[dim];
    }
    nd_tensor *ov = NULL, *iv = NULL, *sv = NULL;
    nd_status s = nd_tensor_view_of(out, lane, out->strides, nd, out->offset, &ov);
    if (s == ND_OK) s = nd_tensor_view_of(index, lane, zero, nd, index->offset, &iv);
    if (s == ND_OK) s = nd_tensor_view_of(src, lane, src->strides, nd, src->offset, &sv);
    if (s == ND_OK) s = run_lanes("index_add", ov, iv, sv, K, os, is, ss, true, alpha);
    nd_release(ov);
    nd_release(iv);
    nd_release(sv);
    return s;
}

/* ---------------------------------------------------------------- masked_fill */

nd_status ocl_masked_fill(nd_tensor *out, const nd_tensor *mask, double value) {
    if (nd_numel(out) == 0) return ND_OK;
    ocl_device *d = ocl_dev(out);
    /* the value in out's dtype, as the CPU stores it */
    _Alignas(8) unsigned char v[8] = {0};
    nd_store_f64(v, out->dtype, value);
    cl_kernel k;
    ND_TRY(ix_kernel(d, out->dtype, false, "masked_fill", "masked_fill", &k));
    cl_int e = ocl_set_arg(k, 0, nd_dtype_size(out->dtype), v);
    if (e != CL_SUCCESS) return ocl_fail(e, "masked_fill", "setting kernel arguments", d);
    const nd_tensor *ts[2] = {out, mask};
    return ocl_run_strided(d, k, "masked_fill", 1, 2, ts);
}
