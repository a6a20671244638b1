/* ocl_norm.c - fused softmax, layer_norm, cross_entropy and batch_norm, with
 * the fused backwards of layer_norm and cross_entropy (kernels/norm.cl).
 *
 * Row kernels get one work-group per row (a power-of-two local size up to
 * 256, no larger than the row) and reduce in local memory. Softmax rows
 * that are short, or that run along a dim other than the last with many
 * rows, take one work-item per row instead. Operands are contiguous (the
 * ops make them so); their element offsets are passed along. */
#include <math.h>
#include <stdio.h>
#include "ocl_kernels.h"

enum { WG_MAX = 256 }; /* kernels/norm.cl's local arrays */


/* The largest power-of-two work-group size <= WG_MAX the device and kernel allow. */
static size_t max_group(ocl_device *d, cl_kernel k) { return ocl_max_group(d, k, WG_MAX); }

/* A group size for rows of `work` elements: a power of two, no larger than needed. */
static size_t row_group(ocl_device *d, cl_kernel k, int64_t work) {
    size_t lim = max_group(d, k), L = 1;
    while (L < lim && (int64_t)L < work) L *= 2;
    return L;
}

/* One work-group of L items per row. */
static nd_status launch_rows(ocl_device *d, cl_kernel k, const char *op, int64_t rows, size_t L) {
    size_t global = (size_t)rows * L;
    return ocl_launch(d, k, op, 1, &global, &L);
}

static nd_status norm_kernel(ocl_device *d, nd_dtype dt, const char *kname, const char *op,
                             cl_kernel *k) {
    if (dt != ND_FLOAT32 && dt != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 on OpenCL, got %s", op,
                       nd_dtype_name(dt));
    ND_TRY(ocl_check_dtype(d, dt, op));
    char defs[128];
    ocl_dtype_defines(dt, defs, sizeof defs);
    return ocl_kernel(d, "norm", defs, kname, k);
}

/* An acc_t argument: double when the device has it (common.cl). */
static cl_int set_acc(cl_kernel k, cl_uint i, const ocl_device *d, double v) {
    if (d->info.fp64) return OCL_ARG(k, i, v);
    float f = (float)v;
    return OCL_ARG(k, i, f);
}

/* Sets a (buffer, offset) argument pair; t may be NULL (then `dflt`, never read). */
static cl_int set_buf(cl_kernel k, cl_uint i, const nd_tensor *t, const nd_tensor *dflt) {
    cl_mem m = ocl_mem(t ? t : dflt);
    cl_long off = t ? t->offset : 0;
    return OCL_ARG(k, i, m) | OCL_ARG(k, i + 1, off);
}

#define SET_OR_FAIL(e, op, d) \
    do { if ((e) != CL_SUCCESS) return ocl_fail((e), (op), "setting kernel arguments", (d)); } while (0)

/* ---------------------------------------------------------------- softmax */

nd_status ocl_softmax(nd_tensor *out, const nd_tensor *x, int dim, bool log) {
    const char *op = log ? "log_softmax" : "softmax";
    ocl_device *d = ocl_dev(x);
    int64_t outer = 1, inner = 1, n = x->ndim ? x->shape[dim] : 1;
    for (int i = 0; i < dim; i++) outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) inner *= x->shape[i];
    if (n == 0 || outer * inner == 0) return ND_OK;
    int64_t rows = outer * inner;
    bool serial = n <= 32 || (inner > 1 && (n <= 1024 || rows >= 1024));
    cl_kernel k;
    ND_TRY(norm_kernel(d, x->dtype, serial ? "softmax_serial" : "softmax_rows", op, &k));
    cl_long nn = n, in = inner, rr = rows;
    cl_int wl = log;
    cl_uint a = 0;
    cl_int e = OCL_ARG(k, a, nn) | OCL_ARG(k, a + 1, in);
    a += 2;
    if (serial) e |= OCL_ARG(k, a++, rr);
    e |= OCL_ARG(k, a, wl) | set_buf(k, a + 1, x, NULL) | set_buf(k, a + 3, out, NULL);
    SET_OR_FAIL(e, op, d);
    if (serial) return ocl_launch_1d(d, k, op, rows);
    return launch_rows(d, k, op, rows, row_group(d, k, n));
}

/* -------------------------------------------------------------- attention */

/* t's buffer, offset and first three strides (batch, batch, row) from
 * argument *a on (NULL: dflt's buffer and zeros, for a kernel that does not
 * read it); *a moves past them */
static cl_int set_rows(cl_kernel kr, cl_uint *a, const nd_tensor *t, const nd_tensor *dflt) {
    cl_int e = set_buf(kr, *a, t, dflt);
    for (int j = 0; j < 3; j++) {
        cl_long s = t ? t->strides[j] : 0;
        e |= OCL_ARG(kr, *a + 2 + (cl_uint)j, s);
    }
    *a += 5;
    return e;
}

/* the arguments every attention kernel starts with, from argument 1 on
 * (B2, L, S, E, Ev, scale, causal, q, k, v, the mask) */
static cl_int set_attention_common(cl_kernel kr, cl_uint *a, ocl_device *d, const nd_tensor *q,
                                   const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                                   const nd_attention_args *args) {
    cl_long b2 = q->shape[1], L = q->shape[2], S = k->shape[2], E = q->shape[3], Ev = v->shape[3];
    cl_int c = args->causal, hm = mask != NULL;
    cl_int e = OCL_ARG(kr, 1, b2) | OCL_ARG(kr, 2, L) | OCL_ARG(kr, 3, S) | OCL_ARG(kr, 4, E) |
               OCL_ARG(kr, 5, Ev) | set_acc(kr, 6, d, args->scale) | OCL_ARG(kr, 7, c);
    *a = 8;
    e |= set_rows(kr, a, q, NULL) | set_rows(kr, a, k, NULL) | set_rows(kr, a, v, NULL);
    e |= OCL_ARG(kr, *a, hm) | set_buf(kr, *a + 1, mask, q);
    for (int j = 0; j < 4; j++) {
        cl_long s = mask ? mask->strides[j] : 0;
        e |= OCL_ARG(kr, *a + 3 + (cl_uint)j, s);
    }
    *a += 7;
    return e;
}

static nd_status no_dropout(const nd_attention_args *a, const char *op) {
    if (a->dropout_p > 0)
        return nd_fail(ND_ERR_UNSUPPORTED, "%s: dropout inside the fused kernel has no opencl kernel "
                       "(F.scaled_dot_product_attention composes the ops there)", op);
    return ND_OK;
}

/* One work-item per (product, query) (kernels/norm.cl, attention_rows): a
 * plain kernel that keeps the op on the device, with no (..., L, S)
 * tensors; not tuned (no GPU to tune it on yet). */
nd_status ocl_attention(nd_tensor *out, nd_tensor *lse, nd_tensor *keep, const nd_tensor *q,
                        const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                        const nd_attention_args *args) {
    (void)keep; /* (only with dropout, which no_dropout refuses) */
    const char *op = "attention";
    ND_TRY(no_dropout(args, op));
    ocl_device *d = ocl_dev(q);
    const int64_t rows = q->shape[0] * q->shape[1] * q->shape[2];
    if (rows == 0) return ND_OK;
    if (k->shape[2] == 0) { /* no keys: an empty weighted sum, lse -inf */
        const unsigned char zero[8] = {0};
        ND_TRY(v->shape[3] ? ocl_fill(out, zero) : ND_OK);
        if (!lse) return ND_OK;
        const double ninf = -INFINITY;
        const float ninf32 = -INFINITY;
        return ocl_fill(lse, q->dtype == ND_FLOAT64 ? (const void *)&ninf : (const void *)&ninf32);
    }
    cl_kernel kr;
    ND_TRY(norm_kernel(d, q->dtype, "attention_rows", op, &kr));
    cl_long nrows = rows;
    cl_int hl = lse != NULL;
    cl_uint a;
    cl_int e = OCL_ARG(kr, 0, nrows) | set_attention_common(kr, &a, d, q, k, v, mask, args);
    e |= set_rows(kr, &a, out, NULL);
    e |= OCL_ARG(kr, a, hl) | set_buf(kr, a + 1, lse, q);
    SET_OR_FAIL(e, op, d);
    return ocl_launch_1d(d, kr, op, rows);
}

nd_status ocl_attention_backward(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                 const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                 const nd_tensor *mask, const nd_tensor *out, const nd_tensor *lse,
                                 const nd_tensor *keep, const nd_attention_args *args) {
    (void)keep;
    const char *op = "attention";
    ND_TRY(no_dropout(args, op));
    ocl_device *d = ocl_dev(q);
    const int64_t B = q->shape[0] * q->shape[1], rows = B * q->shape[2], keys = B * k->shape[2];
    const int names = 2;
    const char *name[2] = {"attention_bwd_q", "attention_bwd_kv"};
    const int64_t items[2] = {dq ? rows : 0, dk || dv ? keys : 0};
    for (int t = 0; t < names; t++) {
        if (items[t] == 0) continue;
        cl_kernel kr;
        ND_TRY(norm_kernel(d, q->dtype, name[t], op, &kr));
        cl_long n = items[t];
        cl_uint a;
        cl_int e = OCL_ARG(kr, 0, n) | set_attention_common(kr, &a, d, q, k, v, mask, args);
        e |= set_rows(kr, &a, g, NULL) | set_rows(kr, &a, out, NULL) | set_buf(kr, a, lse, NULL);
        a += 2;
        if (t == 0) {
            e |= set_rows(kr, &a, dq, NULL);
        } else {
            cl_int hk = dk != NULL, hv = dv != NULL;
            e |= OCL_ARG(kr, a, hk);
            a++;
            e |= set_rows(kr, &a, dk, q) | OCL_ARG(kr, a, hv);
            a++;
            e |= set_rows(kr, &a, dv, q);
        }
        SET_OR_FAIL(e, op, d);
        ND_TRY(ocl_launch_1d(d, kr, op, items[t]));
    }
    return ND_OK;
}

/* ------------------------------------------------------------- layer norm */

nd_status ocl_layer_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                         const nd_tensor *w, const nd_tensor *b, double eps) {
    ocl_device *d = ocl_dev(x);
    int64_t rows = nd_numel(mean), cols = rows ? nd_numel(x) / rows : 0;
    if (rows == 0 || cols == 0) return ND_OK;
    cl_kernel k;
    ND_TRY(norm_kernel(d, x->dtype, "layer_norm_rows", "layer_norm", &k));
    cl_long c = cols;
    cl_int hw = w != NULL, hb = b != NULL;
    cl_int e = OCL_ARG(k, 0, c) | set_acc(k, 1, d, eps) | set_buf(k, 2, x, NULL) |
               set_buf(k, 4, y, NULL) | set_buf(k, 6, mean, NULL) | set_buf(k, 8, rstd, NULL) |
               OCL_ARG(k, 10, hw) | set_buf(k, 11, w, x) | OCL_ARG(k, 13, hb) |
               set_buf(k, 14, b, x);
    SET_OR_FAIL(e, "layer_norm", d);
    return launch_rows(d, k, "layer_norm", rows, row_group(d, k, cols));
}

nd_status ocl_layer_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db, const nd_tensor *g,
                                  const nd_tensor *x, const nd_tensor *w, const nd_tensor *mean,
                                  const nd_tensor *rstd) {
    const char *op = "layer_norm";
    ocl_device *d = ocl_dev(x);
    int64_t rows = nd_numel(mean), cols = rows ? nd_numel(x) / rows : 0;
    if (rows == 0 || cols == 0) { /* empty sums */
        static const double zero = 0;
        float zf = 0;
        const void *z = x->dtype == ND_FLOAT64 ? (const void *)&zero : (const void *)&zf;
        if (dw) ND_TRY(ocl_fill(dw, z));
        if (db) ND_TRY(ocl_fill(db, z));
        return ND_OK;
    }
    cl_long R = rows, C = cols;
    cl_kernel k;
    cl_int e;
    if (dx) {
        ND_TRY(norm_kernel(d, x->dtype, "layer_norm_dx", op, &k));
        cl_int hw = w != NULL;
        e = OCL_ARG(k, 0, C) | set_buf(k, 1, g, NULL) | set_buf(k, 3, x, NULL) |
            OCL_ARG(k, 5, hw) | set_buf(k, 6, w, x) | set_buf(k, 8, mean, NULL) |
            set_buf(k, 10, rstd, NULL) | set_buf(k, 12, dx, NULL);
        SET_OR_FAIL(e, op, d);
        ND_TRY(launch_rows(d, k, op, rows, row_group(d, k, cols)));
    }
    if (!dw && !db) return ND_OK;
    ND_TRY(norm_kernel(d, x->dtype, "layer_norm_dwdb", op, &k));
    cl_int ww = dw != NULL, wb = db != NULL;
    e = OCL_ARG(k, 0, R) | OCL_ARG(k, 1, C) | set_buf(k, 2, g, NULL) | set_buf(k, 4, x, NULL) |
        set_buf(k, 6, mean, NULL) | set_buf(k, 8, rstd, NULL) | OCL_ARG(k, 10, ww) |
        set_buf(k, 11, dw, x) | OCL_ARG(k, 13, wb) | set_buf(k, 14, db, x);
    SET_OR_FAIL(e, op, d);
    /* tiles of 32 columns x up to 8 row lanes (fewer lanes when the device
     * allows fewer than 256 items a group, or there are few rows) */
    size_t lim = max_group(d, k);
    size_t lc = lim < 32 ? lim : 32, lr = lim / lc;
    if (lr > 8) lr = 8;
    while (lr > 1 && (int64_t)lr > rows) lr /= 2;
    size_t local[2] = {lc, lr};
    size_t global[2] = {(size_t)((cols + (int64_t)lc - 1) / (int64_t)lc) * lc, lr};
    return ocl_launch(d, k, op, 2, global, local);
}

/* ---------------------------------------------------------- cross entropy */

nd_status ocl_cross_entropy(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels,
                            int64_t ignore, double smoothing) {
    const char *op = "cross_entropy";
    ocl_device *d = ocl_dev(logits);
    int64_t n = logits->shape[0], c = logits->shape[1];
    if (n == 0) return ND_OK;
    if (labels->dtype != ND_INT64)
        return nd_fail(ND_ERR_DTYPE, "cross_entropy: expected int64 labels, got %s",
                       nd_dtype_name(labels->dtype));
    cl_kernel k;
    ND_TRY(norm_kernel(d, logits->dtype, "cross_entropy_rows", op, &k));
    cl_long C = c, ig = ignore, ls = labels->strides[0];
    cl_int e = OCL_ARG(k, 0, C) | OCL_ARG(k, 1, ig) | set_acc(k, 2, d, smoothing) |
               set_buf(k, 3, logits, NULL) | set_buf(k, 5, labels, NULL) | OCL_ARG(k, 7, ls) |
               set_buf(k, 8, loss, NULL);
    SET_OR_FAIL(e, op, d);
    return launch_rows(d, k, op, n, row_group(d, k, c));
}

nd_status ocl_cross_entropy_backward(nd_tensor *dlogits, const nd_tensor *logits,
                                     const nd_tensor *labels, const nd_tensor *wrow,
                                     int64_t ignore, double smoothing) {
    const char *op = "cross_entropy";
    ocl_device *d = ocl_dev(logits);
    int64_t n = logits->shape[0], c = logits->shape[1];
    if (n == 0 || c == 0) return ND_OK;
    if (labels->dtype != ND_INT64 || wrow->dtype != logits->dtype)
        return nd_fail(ND_ERR_DTYPE, "cross_entropy: expected int64 labels and %s row weights, "
                       "got %s and %s", nd_dtype_name(logits->dtype), nd_dtype_name(labels->dtype),
                       nd_dtype_name(wrow->dtype));
    cl_kernel k;
    ND_TRY(norm_kernel(d, logits->dtype, "cross_entropy_backward_rows", op, &k));
    cl_long C = c, ig = ignore, ls = labels->strides[0];
    cl_long ws = wrow->ndim ? wrow->strides[0] : 0;
    cl_int e = OCL_ARG(k, 0, C) | OCL_ARG(k, 1, ig) | set_acc(k, 2, d, smoothing) |
               set_buf(k, 3, logits, NULL) | set_buf(k, 5, labels, NULL) | OCL_ARG(k, 7, ls) |
               set_buf(k, 8, wrow, NULL) | OCL_ARG(k, 10, ws) | set_buf(k, 11, dlogits, NULL);
    SET_OR_FAIL(e, op, d);
    return launch_rows(d, k, op, n, row_group(d, k, c));
}

/* ------------------------------------------------------------- batch norm */

nd_status ocl_batch_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                         const nd_tensor *w, const nd_tensor *b, double eps, bool training) {
    const char *op = "batch_norm";
    ocl_device *d = ocl_dev(x);
    int64_t n = x->shape[0], c = x->shape[1], sp = 1;
    for (int i = 2; i < x->ndim; i++) sp *= x->shape[i];
    if (n * c * sp == 0) return ND_OK;
    cl_long N = n, C = c, S = sp, total = n * c * sp;
    cl_kernel k;
    cl_int e;
    if (training) {
        ND_TRY(norm_kernel(d, x->dtype, "batch_norm_stats", op, &k));
        e = OCL_ARG(k, 0, N) | OCL_ARG(k, 1, C) | OCL_ARG(k, 2, S) | set_acc(k, 3, d, eps) |
            set_buf(k, 4, x, NULL) | set_buf(k, 6, mean, NULL) | set_buf(k, 8, rstd, NULL);
        SET_OR_FAIL(e, op, d);
        ND_TRY(launch_rows(d, k, op, c, row_group(d, k, n * sp)));
    }
    ND_TRY(norm_kernel(d, x->dtype, "batch_norm_apply", op, &k));
    cl_int hw = w != NULL, hb = b != NULL;
    e = OCL_ARG(k, 0, total) | OCL_ARG(k, 1, C) | OCL_ARG(k, 2, S) | set_buf(k, 3, x, NULL) |
        set_buf(k, 5, y, NULL) | set_buf(k, 7, mean, NULL) | set_buf(k, 9, rstd, NULL) |
        OCL_ARG(k, 11, hw) | set_buf(k, 12, w, x) | OCL_ARG(k, 14, hb) | set_buf(k, 15, b, x);
    SET_OR_FAIL(e, op, d);
    return ocl_launch_1d(d, k, op, total);
}
