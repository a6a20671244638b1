/* ocl_scan_sort.c - cumsum and stable sort along a dim (kernels/scan_sort.cl).
 *
 * cumsum: one work-item per line; long lines that are few (not enough
 * work-items to fill the device) are cut into chunks, summed, then scanned
 * from the sums of the chunks before them.
 * sort: each line's (key, position) pairs go to a scratch row padded to a
 * power of two and are bitonic-sorted: within a work-group's segment in
 * local memory, then stage by stage across segments in global memory.
 * Positions make every pair distinct, so the result is the stable order
 * whatever the network does. */
#include <stdio.h>
#include <string.h>
#include "ocl_kernels.h"

enum { WG_MAX = 256 }; /* kernels/scan_sort.cl's local arrays hold 2 * WG_MAX pairs */

/* kernels/scan_sort.cl's lgeom, same layout. */
typedef struct {
    cl_long shape[ND_MAX_DIMS];
    cl_long stride[3][ND_MAX_DIMS];
    cl_long dstride[3];
    cl_long offset[3];
    cl_long n;
    cl_long lines;
    cl_int ndim;
    cl_int pad_;
} lgeom;
_Static_assert(ND_MAX_DIMS == 8 && sizeof(lgeom) == 328, "lgeom must match kernels/scan_sort.cl");

/* Lines of ts[0]'s shape along dim (every operand has that shape). */
static void lgeom_make(lgeom *g, int nops, const nd_tensor *const *ts, int dim) {
    memset(g, 0, sizeof *g);
    const nd_tensor *t = ts[0];
    g->n = t->ndim ? t->shape[dim] : 1;
    g->lines = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (i == dim) continue;
        g->lines *= t->shape[i];
        if (t->shape[i] == 1) continue;
        g->shape[g->ndim] = t->shape[i];
        for (int k = 0; k < nops; k++) g->stride[k][g->ndim] = ts[k]->strides[i];
        g->ndim++;
    }
    for (int k = 0; k < nops; k++) {
        g->dstride[k] = ts[k]->ndim ? ts[k]->strides[dim] : 0;
        g->offset[k] = ts[k]->offset;
    }
}


/* The largest power-of-two work-group size <= WG_MAX the device and kernel allow. */
static size_t max_group(ocl_device *d, cl_kernel k) { return ocl_max_group(d, k, WG_MAX); }

static nd_status scratch(ocl_device *d, size_t n, const char *op, cl_mem *m) {
    (void)op; /* ocl_alloc's error names the device and the size */
    void *h;
    ND_TRY(ocl_alloc(d->index, n, &h));
    *m = (cl_mem)h;
    return ND_OK;
}

/* ---------------------------------------------------------------- cumsum */

nd_status ocl_cumsum(nd_tensor *out, const nd_tensor *x, int dim) {
    ocl_device *d = ocl_dev(out);
    ND_TRY(ocl_check_dtype(d, x->dtype, "cumsum"));
    ND_TRY(ocl_check_dtype(d, out->dtype, "cumsum"));
    bool xf = nd_dtype_is_float(x->dtype);
    bool ok = xf ? out->dtype == x->dtype : out->dtype == ND_INT64;
    if (!ok)
        return nd_fail(ND_ERR_DTYPE, "cumsum: no OpenCL kernel from %s to %s", nd_dtype_name(x->dtype),
                       nd_dtype_name(out->dtype));
    if (nd_numel(x) == 0) return ND_OK;
    char defs[192];
    snprintf(defs, sizeof defs, "-DT=%s -DT_ID=%d -DO_T=%s -DO_ID=%d -DT_FLOAT=%d", ocl_type_name(x->dtype),
             (int)x->dtype, ocl_type_name(out->dtype), (int)out->dtype,
             x->dtype == ND_FLOAT32 || x->dtype == ND_FLOAT64);
    const nd_tensor *ts[2] = {out, x};
    lgeom g;
    lgeom_make(&g, 2, ts, dim);
    cl_mem om = ocl_mem(out), xm = ocl_mem(x);
    cl_kernel k;
    cl_int e;
    /* Fewer than 4096 lines of more than 4096: chunks of >= 1024 elements,
     * about 4096 work-items in all (at most 256 chunks a line). */
    int64_t nchunks = 1;
    if (g.lines < 4096 && g.n > 4096) {
        nchunks = 4096 / g.lines;
        if (nchunks > g.n / 1024) nchunks = g.n / 1024;
        if (nchunks > 256) nchunks = 256;
    }
    if (nchunks <= 1) {
        ND_TRY(ocl_kernel(d, "scan_sort", defs, "cumsum_lines", &k));
        e = ocl_set_arg(k, 0, sizeof g, &g) | OCL_ARG(k, 1, om) | OCL_ARG(k, 2, xm);
        if (e != CL_SUCCESS) return ocl_fail(e, "cumsum", "setting kernel arguments", d);
        return ocl_launch_1d(d, k, "cumsum", g.lines);
    }
    cl_long chunk = (g.n + nchunks - 1) / nchunks;
    cl_long nc = (g.n + chunk - 1) / chunk;
    size_t bytes = (size_t)(g.lines * nc) * 8; /* sums: acc_t (double) or ulong */
    cl_kernel ks;
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "cumsum_chunk_sums", &ks));
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "cumsum_chunks", &k));
    cl_mem sums;
    ND_TRY(scratch(d, bytes, "cumsum", &sums));
    e = ocl_set_arg(ks, 0, sizeof g, &g) | OCL_ARG(ks, 1, chunk) | OCL_ARG(ks, 2, nc) |
        OCL_ARG(ks, 3, xm) | OCL_ARG(ks, 4, sums);
    e |= ocl_set_arg(k, 0, sizeof g, &g) | OCL_ARG(k, 1, chunk) | OCL_ARG(k, 2, nc) |
         OCL_ARG(k, 3, om) | OCL_ARG(k, 4, xm) | OCL_ARG(k, 5, sums);
    nd_status st = e == CL_SUCCESS ? ND_OK : ocl_fail(e, "cumsum", "setting kernel arguments", d);
    if (st == ND_OK) st = ocl_launch_1d(d, ks, "cumsum", g.lines * nc);
    if (st == ND_OK) st = ocl_launch_1d(d, k, "cumsum", g.lines * nc);
    ocl_free(d->index, sums, bytes); /* in-order queue: safe to reuse at once */
    return st;
}

/* ---------------------------------------------------------------- sort */

nd_status ocl_sort(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                   int descending) {
    ocl_device *d = ocl_dev(x);
    ND_TRY(ocl_check_dtype(d, x->dtype, "sort"));
    if (values->dtype != x->dtype || indices->dtype != ND_INT64)
        return nd_fail(ND_ERR_DTYPE, "sort: expected %s values and int64 indices, got %s and %s",
                       nd_dtype_name(x->dtype), nd_dtype_name(values->dtype),
                       nd_dtype_name(indices->dtype));
    if (nd_numel(x) == 0) return ND_OK;
    char defs[128];
    ocl_dtype_defines(x->dtype, defs, sizeof defs);
    const nd_tensor *ts[3] = {values, indices, x};
    lgeom g;
    lgeom_make(&g, 3, ts, dim);
    cl_long np = 1;
    while (np < g.n) np *= 2;
    cl_long total = g.lines * np;
    size_t bytes = (size_t)total * 8;
    cl_kernel kinit, klocal, kstep, kmerge, kgather;
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "sort_init", &kinit));
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "sort_local", &klocal));
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "sort_global_step", &kstep));
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "sort_local_merge", &kmerge));
    ND_TRY(ocl_kernel(d, "scan_sort", defs, "sort_gather", &kgather));
    cl_mem keys, idx;
    ND_TRY(scratch(d, bytes, "sort", &keys));
    nd_status st = scratch(d, bytes, "sort", &idx);
    if (st != ND_OK) {
        ocl_free(d->index, keys, bytes);
        return st;
    }
    cl_mem vm = ocl_mem(values), im = ocl_mem(indices), xm = ocl_mem(x);
    cl_int desc = descending != 0;
    cl_int e = ocl_set_arg(kinit, 0, sizeof g, &g) | OCL_ARG(kinit, 1, np) |
               OCL_ARG(kinit, 2, desc) | OCL_ARG(kinit, 3, xm) | OCL_ARG(kinit, 4, keys) |
               OCL_ARG(kinit, 5, idx);
    if (e != CL_SUCCESS) st = ocl_fail(e, "sort", "setting kernel arguments", d);
    if (st == ND_OK) st = ocl_launch_1d(d, kinit, "sort", total);
    if (st == ND_OK && np > 1) {
        /* segments of B = 2L entries; L no larger than the work needs */
        size_t L = max_group(d, klocal), Lm = max_group(d, kmerge);
        if (Lm < L) L = Lm;
        while (L > 1 && (cl_long)(2 * L) > total) L /= 2;
        cl_long B = 2 * (cl_long)L, kmax = np < B ? np : B;
        size_t ngroups = (size_t)((total + B - 1) / B), global = ngroups * L;
        e = OCL_ARG(klocal, 0, keys) | OCL_ARG(klocal, 1, idx) | OCL_ARG(klocal, 2, total) |
            OCL_ARG(klocal, 3, np) | OCL_ARG(klocal, 4, kmax);
        e |= OCL_ARG(kstep, 0, keys) | OCL_ARG(kstep, 1, idx) | OCL_ARG(kstep, 2, total) |
             OCL_ARG(kstep, 3, np);
        e |= OCL_ARG(kmerge, 0, keys) | OCL_ARG(kmerge, 1, idx) | OCL_ARG(kmerge, 2, np);
        if (e != CL_SUCCESS) st = ocl_fail(e, "sort", "setting kernel arguments", d);
        if (st == ND_OK) st = ocl_launch(d, klocal, "sort", 1, &global, &L);
        for (cl_long k = 2 * B; st == ND_OK && k <= np; k *= 2) {
            for (cl_long j = k / 2; st == ND_OK && j >= B; j /= 2) {
                e = OCL_ARG(kstep, 4, k) | OCL_ARG(kstep, 5, j);
                if (e != CL_SUCCESS) st = ocl_fail(e, "sort", "setting kernel arguments", d);
                else st = ocl_launch_1d(d, kstep, "sort", total / 2);
            }
            if (st != ND_OK) break;
            e = OCL_ARG(kmerge, 3, k);
            if (e != CL_SUCCESS) st = ocl_fail(e, "sort", "setting kernel arguments", d);
            else st = ocl_launch(d, kmerge, "sort", 1, &global, &L);
        }
    }
    if (st == ND_OK) {
        e = ocl_set_arg(kgather, 0, sizeof g, &g) | OCL_ARG(kgather, 1, np) |
            OCL_ARG(kgather, 2, vm) | OCL_ARG(kgather, 3, im) | OCL_ARG(kgather, 4, xm) |
            OCL_ARG(kgather, 5, idx);
        if (e != CL_SUCCESS) st = ocl_fail(e, "sort", "setting kernel arguments", d);
        else st = ocl_launch_1d(d, kgather, "sort", g.lines * g.n);
    }
    ocl_free(d->index, keys, bytes);
    ocl_free(d->index, idx, bytes);
    return st;
}
