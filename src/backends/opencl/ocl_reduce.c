/* ocl_reduce.c - reductions over any set of dims, and max/min along one dim
 * with indices (kernels/reduce.cl).
 *
 * The reduced block of each output is described as in cpu_reduce.c: kept
 * dims (the outputs, row-major, the keepdim output's own order) and reduced
 * dims, merged where contiguous with each other. Three launch shapes:
 *   - reduce_serial: one work-item per output, for small blocks;
 *   - reduce_tiles: column reductions (the reduced dims strided, the kept
 *     innermost contiguous): tiles of 32 neighbouring outputs x 8 lanes over
 *     the block, so neighbouring work-items read neighbouring elements;
 *   - reduce_groups: one work-group per output, a tree in local memory;
 *   - reduce_groups + reduce_finish: few outputs over large blocks are split
 *     across several work-groups each (so a full reduction fills the device),
 *     whose states a second launch folds. */
#include <string.h>
#include "ocl_kernels.h"

enum { WG_MAX = 256 };       /* kernels/reduce.cl's local arrays */
enum { STATE_BYTES = 48 };   /* >= sizeof(rstate) on the device (double acc_t) */

/* kernels/reduce.cl's rgeom, same layout. */
typedef struct {
    cl_long kshape[ND_MAX_DIMS], kstride[ND_MAX_DIMS];
    cl_long rshape[ND_MAX_DIMS], rstride[ND_MAX_DIMS];
    cl_long ocount, rcount;
    cl_long xoff, voff, ioff;
    cl_long chunk;
    cl_int nk, nr;
    cl_int groups;
    cl_int pad_;
} rgeom;
_Static_assert(ND_MAX_DIMS == 8 && sizeof(rgeom) == 320, "rgeom must match kernels/reduce.cl");

static void geom_init(rgeom *g, const nd_tensor *x, const bool *reduced) {
    memset(g, 0, sizeof *g);
    g->ocount = g->rcount = 1;
    for (int i = 0; i < x->ndim; i++) {
        int64_t st = x->strides[i];
        if (reduced[i]) {
            g->rcount *= x->shape[i];
            if (x->shape[i] == 1) continue;
            /* merge into the previous reduced dim when contiguous with it
             * (row-major order is kept, so flat indices for argmax stay) */
            if (g->nr && g->rstride[g->nr - 1] == st * x->shape[i]) {
                g->rshape[g->nr - 1] *= x->shape[i];
                g->rstride[g->nr - 1] = st;
            } else {
                g->rshape[g->nr] = x->shape[i];
                g->rstride[g->nr++] = st;
            }
        } else {
            g->ocount *= x->shape[i];
            if (x->shape[i] == 1) continue;
            g->kshape[g->nk] = x->shape[i];
            g->kstride[g->nk++] = st;
        }
    }
    if (g->nr == 0) { g->rshape[0] = 1; g->rstride[0] = 0; g->nr = 1; }
    g->xoff = x->offset;
}

static size_t pow2_floor(size_t v) {
    size_t p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}

/* A power-of-two work-group size for `work` items per group, at most
 * WG_MAX and what the device and kernel allow. */
static size_t group_size(ocl_device *d, cl_kernel k, int64_t work) {
    size_t lim = WG_MAX < d->max_wg ? WG_MAX : d->max_wg;
    size_t kw = 0;
    if (clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kw, &kw, NULL) ==
            CL_SUCCESS && kw && kw < lim)
        lim = kw;
    lim = pow2_floor(lim ? lim : 1);
    size_t L = 1;
    while (L < lim && (int64_t)L < work) L *= 2;
    return L;
}

static nd_status reduce_kernel(ocl_device *d, nd_dtype dt, bool accumulate, const char *kname, const char *op,
                               cl_kernel *k) {
    ND_TRY(ocl_check_dtype(d, dt, op));
    switch (dt) {
    case ND_FLOAT32: case ND_FLOAT64: case ND_INT64: case ND_INT32: case ND_UINT8: case ND_BOOL:
        break;
    default:
        return nd_fail(ND_ERR_DTYPE, "%s: no OpenCL reduction kernel for %s", op, nd_dtype_name(dt));
    }
    char defs[160];
    ocl_dtype_defines(dt, defs, sizeof defs);
    if (accumulate) strncat(defs, " -DACCUMULATE=1", sizeof defs - strlen(defs) - 1);
    return ocl_kernel(d, "reduce", defs, kname, k);
}

/* Sets (op, corr, both, g, src, outv, outi) as arguments 0..6. */
static cl_int set_common(cl_kernel k, int op, int corr, int both, const rgeom *g, cl_mem src,
                         cl_mem outv, cl_mem outi) {
    cl_int o = op, c = corr, b = both;
    return OCL_ARG(k, 0, o) | OCL_ARG(k, 1, c) | OCL_ARG(k, 2, b) |
           ocl_set_arg(k, 3, sizeof *g, g) | OCL_ARG(k, 4, src) | OCL_ARG(k, 5, outv) |
           OCL_ARG(k, 6, outi);
}

/* Reduces x over `reduced` into outv (values) and/or outi (int64: indices,
 * integer sums and products); both: max_dim, which writes the two. */
static nd_status run_reduce(const char *name, int op, int corr, int both, const nd_tensor *x,
                            const bool *reduced, nd_tensor *outv, nd_tensor *outi, bool accumulate) {
    ocl_device *d = ocl_dev(x);
    rgeom g;
    geom_init(&g, x, reduced);
    if (g.ocount == 0) return ND_OK;
    g.voff = outv->offset;
    g.ioff = outi->offset;
    cl_mem xm = ocl_mem(x), vm = ocl_mem(outv), im = ocl_mem(outi);
    int64_t oc = g.ocount, rc = g.rcount;
    bool inner_strided = g.nr > 1 || g.rstride[0] != 1;
    cl_kernel k;
    cl_int e;
    bool split = oc < 64 && rc >= 65536;
    bool columns = inner_strided && g.nk > 0 && g.kstride[g.nk - 1] == 1;
    if (columns && !split && rc > 32) {
        g.groups = 1;
        g.chunk = rc;
        ND_TRY(reduce_kernel(d, x->dtype, accumulate, "reduce_tiles", name, &k));
        e = set_common(k, op, corr, both, &g, xm, vm, im);
        if (e != CL_SUCCESS) return ocl_fail(e, name, "setting kernel arguments", d);
        /* 32 outputs (fewer when there are fewer) x up to 256/32 lanes */
        size_t lim = group_size(d, k, WG_MAX);
        size_t lc = 1;
        while (lc < 32 && lc < lim && (int64_t)lc < oc) lc *= 2;
        size_t lr = lim / lc;
        while (lr > 1 && (int64_t)lr > rc) lr /= 2;
        size_t local[2] = {lc, lr};
        size_t global[2] = {(size_t)((oc + (int64_t)lc - 1) / (int64_t)lc) * lc, lr};
        return ocl_launch(d, k, name, 2, global, local);
    }
    if (rc <= 32 || (oc >= 8192 && rc <= 1024 && inner_strided)) {
        g.groups = 1;
        g.chunk = rc;
        ND_TRY(reduce_kernel(d, x->dtype, accumulate, "reduce_serial", name, &k));
        e = set_common(k, op, corr, both, &g, xm, vm, im);
        if (e != CL_SUCCESS) return ocl_fail(e, name, "setting kernel arguments", d);
        return ocl_launch_1d(d, k, name, oc);
    }
    /* Few outputs over large blocks: several groups per output, about 256
     * groups in all, each over at least 16K elements. */
    int64_t groups = 1;
    if (split) {
        groups = 256 / oc;
        if (groups > rc / 16384) groups = rc / 16384;
        if (groups < 1) groups = 1;
    }
    int64_t chunk = (rc + groups - 1) / groups;
    groups = (rc + chunk - 1) / chunk;
    g.groups = (cl_int)groups;
    g.chunk = chunk;
    ND_TRY(reduce_kernel(d, x->dtype, accumulate, "reduce_groups", name, &k));
    cl_mem part = NULL;
    void *h = NULL;
    size_t part_bytes = (size_t)(oc * groups) * STATE_BYTES;
    if (groups > 1) {
        ND_TRY(ocl_alloc(d->index, part_bytes, &h));
        part = (cl_mem)h;
    }
    cl_mem pm = part ? part : xm; /* unused with one group per output */
    e = set_common(k, op, corr, both, &g, xm, vm, im) | OCL_ARG(k, 7, pm);
    nd_status st = e == CL_SUCCESS ? ND_OK : ocl_fail(e, name, "setting kernel arguments", d);
    if (st == ND_OK) {
        size_t L = group_size(d, k, chunk);
        size_t global = (size_t)(oc * groups) * L;
        st = ocl_launch(d, k, name, 1, &global, &L);
    }
    if (st == ND_OK && part) {
        cl_kernel kf;
        st = reduce_kernel(d, x->dtype, accumulate, "reduce_finish", name, &kf);
        if (st == ND_OK) {
            e = set_common(kf, op, corr, both, &g, part, vm, im);
            if (e != CL_SUCCESS) st = ocl_fail(e, name, "setting kernel arguments", d);
        }
        if (st == ND_OK) {
            size_t L = group_size(d, kf, groups);
            size_t global = (size_t)oc * L;
            st = ocl_launch(d, kf, name, 1, &global, &L);
        }
    }
    /* the queue is in order: the buffer may go back to the pool at once */
    if (part) ocl_free(d->index, h, part_bytes);
    return st;
}

nd_status ocl_reduce(nd_reduce_op op, nd_tensor *out, const nd_tensor *x, const bool *reduced,
                     int correction) {
    const char *name = nd_reduce_name(op);
    if ((unsigned)op >= ND_NUM_REDUCE) return nd_fail(ND_ERR_ARG, "reduce: invalid op %d", (int)op);
    bool fl = x->dtype == ND_FLOAT32 || x->dtype == ND_FLOAT64;
    if (!fl && op != ND_REDUCE_sum && op != ND_REDUCE_prod && op != ND_REDUCE_max &&
        op != ND_REDUCE_min && op != ND_REDUCE_argmax && op != ND_REDUCE_argmin)
        return nd_fail(ND_ERR_DTYPE, "%s: no OpenCL kernel for %s input (expected a float)", name,
                       nd_dtype_name(x->dtype));
    /* int64 results (indices, integer sums and products) go to outi; the
     * other output argument is never written and just gets the same buffer */
    return run_reduce(name, (int)op, correction, 0, x, reduced, out, out, false);
}

nd_status ocl_max_dim(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                      int is_min) {
    bool reduced[ND_MAX_DIMS] = {0};
    if (x->ndim > 0) reduced[dim] = true;
    return run_reduce(is_min ? "min" : "max", is_min ? ND_REDUCE_argmin : ND_REDUCE_argmax, 0, 1,
                      x, reduced, values, indices, false);
}

nd_status ocl_reduce_sum_acc(nd_tensor *out, const nd_tensor *x, const bool *reduced) {
    if ((x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64) || out->dtype != x->dtype)
        return nd_fail(ND_ERR_DTYPE, "sum: adding into an output takes float32 or float64, got %s into %s",
                       nd_dtype_name(x->dtype), nd_dtype_name(out->dtype));
    bool all[ND_MAX_DIMS];
    if (!reduced) {
        for (int d = 0; d < ND_MAX_DIMS; d++) all[d] = true;
        reduced = all;
    }
    return run_reduce("sum", ND_REDUCE_sum, 0, 0, x, reduced, out, out, true);
}
