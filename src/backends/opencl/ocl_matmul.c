/* ocl_matmul.c - matmul on OpenCL: the register-tiled GEMM of
 * kernels/gemm.cl with the configuration the autotuner chose for the device
 * (ocl_gemm_tune.c), or the default one.
 *
 * Operands are read through their strides: a transposed or sliced a or b
 * costs no copy (the kernel is built for the operand's layout, so a
 * unit stride becomes a constant and tile loads are vectorised along it),
 * batch dims may be broadcast (stride 0). float32 and float64 (where the
 * device has fp64) take the tuned kernel; the integer dtypes the op can pass
 * (int64, int32, uint8) take the naive kernel, wrapping as the CPU does.
 * A float32 product takes float16 or bfloat16 operands as they are stored:
 * the kernels widen them as they load them (A_HALF / B_HALF), which is
 * exact, so half the bytes are read and nothing is converted first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ocl_kernels.h"
#include "ocl_gemm.h"

/* ---------------------------------------------------------------- configs */

void ocl_gemm_cfg_str(const ocl_gemm_cfg *c, char *buf, size_t n) {
    switch (c->kind) {
    case OCL_GEMM_TILED:
        snprintf(buf, n, "tiled %dx%dx%d %dx%d v%d", c->tsm, c->tsn, c->tsk, c->wptm, c->wptn, c->vw);
        break;
    case OCL_GEMM_DIRECT:
    case OCL_GEMM_DOT:
        snprintf(buf, n, "%s %dx%d %dx%d v%d", c->kind == OCL_GEMM_DOT ? "dot" : "direct", c->tsm,
                 c->tsn, c->wptm, c->wptn, c->vw);
        break;
    default: snprintf(buf, n, "naive"); break;
    }
}

bool ocl_gemm_cfg_parse(const char *s, ocl_gemm_cfg *c) {
    ocl_gemm_cfg r = {0};
    char tail;
    if (strncmp(s, "naive", 5) == 0 && (s[5] == 0 || s[5] == ' ' || s[5] == '\n')) {
        r.kind = OCL_GEMM_NAIVE;
    } else if (sscanf(s, "tiled %dx%dx%d %dx%d v%d%c", &r.tsm, &r.tsn, &r.tsk, &r.wptm, &r.wptn,
                      &r.vw, &tail) >= 6) {
        r.kind = OCL_GEMM_TILED;
    } else if (sscanf(s, "direct %dx%d %dx%d v%d%c", &r.tsm, &r.tsn, &r.wptm, &r.wptn, &r.vw,
                      &tail) >= 5) {
        r.kind = OCL_GEMM_DIRECT;
        r.tsk = 1;
    } else if (sscanf(s, "dot %dx%d %dx%d v%d%c", &r.tsm, &r.tsn, &r.wptm, &r.wptn, &r.vw,
                      &tail) >= 5) {
        r.kind = OCL_GEMM_DOT;
        r.tsk = 1;
    } else {
        return false;
    }
    *c = r;
    return true;
}

static bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

bool ocl_gemm_cfg_valid(const ocl_device *d, const ocl_gemm_cfg *c, size_t elem, char *why,
                        size_t nwhy) {
    char tmp[8];
    if (!why) { why = tmp; nwhy = sizeof tmp; }
    why[0] = 0;
    if (c->kind == OCL_GEMM_NAIVE) return true;
    if (c->kind != OCL_GEMM_TILED && c->kind != OCL_GEMM_DIRECT && c->kind != OCL_GEMM_DOT) {
        snprintf(why, nwhy, "unknown kernel kind %d", c->kind);
        return false;
    }
    if (!pow2(c->tsm) || !pow2(c->tsn) || !pow2(c->wptm) || !pow2(c->wptn) || !pow2(c->vw) ||
        c->tsm > 256 || c->tsn > 256 || c->wptm > c->tsm || c->wptn > c->tsn || c->vw > 16) {
        snprintf(why, nwhy, "tiles and vector widths must be powers of two (tiles <= 256, "
                 "vectors <= 16)");
        return false;
    }
    /* accumulators per work-item: scalars (tiled), vectors (direct: wptn / vw
     * per row; dot: one per output); more would only spill */
    int regs = c->kind == OCL_GEMM_DIRECT ? c->wptm * (c->wptn / c->vw) : c->wptm * c->wptn;
    if (regs > (c->kind == OCL_GEMM_TILED ? 128 : 64)) {
        snprintf(why, nwhy, "%d accumulators per work-item is too many", regs);
        return false;
    }
    size_t rm = (size_t)(c->tsm / c->wptm), rn = (size_t)(c->tsn / c->wptn);
    size_t sizes[3] = {0, 0, 0};
    clGetDeviceInfo(d->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes, sizes, NULL);
    if (rm * rn > d->max_wg || (sizes[0] && rn > sizes[0]) || (sizes[1] && rm > sizes[1])) {
        snprintf(why, nwhy, "work-group %zux%zu exceeds the device's limit (%zu)", rn, rm, d->max_wg);
        return false;
    }
    if (c->kind == OCL_GEMM_DIRECT && c->wptn % c->vw) {
        snprintf(why, nwhy, "the vector width must divide wptn");
        return false;
    }
    if (c->kind == OCL_GEMM_TILED) {
        if (!pow2(c->tsk) || c->tsk > 64 || c->vw > 8 || c->tsk % c->vw || c->tsm % c->vw ||
            c->tsn % c->vw) {
            snprintf(why, nwhy, "tsk must be a power of two <= 64 and the vector width (1, 2, 4, 8) "
                     "must divide every tile");
            return false;
        }
        size_t bytes = (size_t)c->tsk * (size_t)(c->tsm + c->tsn) * elem;
        if (bytes > d->local_mem) {
            snprintf(why, nwhy, "needs %zu bytes of local memory, the device has %zu", bytes,
                     d->local_mem);
            return false;
        }
    }
    return true;
}

bool ocl_gemm_cfg_fits_group(const ocl_gemm_cfg *c, int g) {
    if (c->kind == OCL_GEMM_DOT) return g == OCL_GEMM_NT;
    if (c->kind == OCL_GEMM_DIRECT && c->vw > 1) return g == OCL_GEMM_NN;
    return true;
}

int ocl_gemm_class(int64_t m, int64_t n, int64_t k) {
    /* in double: M * N * K can overflow int64 for absurd but legal shapes */
    return (double)m * (double)n * (double)k <= (double)OCL_GEMM_SMALL_FLOPS ? OCL_GEMM_SMALL
                                                                             : OCL_GEMM_LARGE;
}

/* ---------------------------------------------------------------- launch */

/* The batch dims (all but the last two) of out, a and b as an nd_geom with
 * operands 0 = out, 1 = a, 2 = b: size-1 dims dropped, neighbours merged
 * where every operand steps evenly across them (as ocl_geom_make does for
 * elementwise kernels). */
static int64_t batch_geom(ocl_geom *g, const nd_tensor *out, const nd_tensor *a,
                          const nd_tensor *b) {
    memset(g, 0, sizeof *g);
    const nd_tensor *ops[3] = {out, a, b};
    int nb = out->ndim - 2, m = 0;
    int64_t count = 1;
    for (int i = 0; i < nb; i++) {
        int64_t s = out->shape[i];
        count *= s;
        if (s == 1) continue;
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < 3 && merge; k++)
                merge = g->strides[k][m - 1] == ops[k]->strides[i] * s;
            if (merge) {
                g->shape[m - 1] *= s;
                for (int k = 0; k < 3; k++) g->strides[k][m - 1] = ops[k]->strides[i];
                continue;
            }
        }
        g->shape[m] = s;
        for (int k = 0; k < 3; k++) g->strides[k][m] = ops[k]->strides[i];
        m++;
    }
    if (m == 0) { g->shape[0] = 1; m = 1; }
    g->ndim = m;
    for (int k = 0; k < 3; k++) g->offset[k] = ops[k]->offset;
    return count;
}

/* Layout codes of gemm.cl (A_LAYOUT / B_LAYOUT): 1 unit stride along the
 * output dim (rows of a, cols of b), 2 unit stride along K, 0 neither. A dim
 * of size 1 may count as unit-stride: only its index 0 is ever read. */
void ocl_gemm_layouts(const nd_tensor *a, const nd_tensor *b, int *la, int *lb) {
    int n = a->ndim;
    int64_t M = a->shape[n - 2], K = a->shape[n - 1], N = b->shape[n - 1];
    int64_t a_sm = a->strides[n - 2], a_sk = a->strides[n - 1];
    int64_t b_sk = b->strides[n - 2], b_sn = b->strides[n - 1];
    *la = a_sk == 1 ? 2 : a_sm == 1 ? 1 : K == 1 ? 2 : M == 1 ? 1 : 0;
    *lb = b_sn == 1 ? 1 : b_sk == 1 ? 2 : N == 1 ? 1 : K == 1 ? 2 : 0;
}

/* gemm.cl's defines for the result dtype dt and operand dtypes at, bt
 * (A_HALF / B_HALF for half operands of a float32 product) into defs. */
static void gemm_defines(nd_dtype dt, nd_dtype at, nd_dtype bt, bool accumulate, char *defs,
                         size_t n) {
    ocl_dtype_defines(dt, defs, n);
    size_t len = strlen(defs);
    int ah = ocl_gemm_half_code(at), bh = ocl_gemm_half_code(bt);
    if (ah || bh) snprintf(defs + len, n - len, " -DA_HALF=%d -DB_HALF=%d", ah, bh);
    if (accumulate) strncat(defs, " -DACCUMULATE=1", n - strlen(defs) - 1);
}

nd_status ocl_gemm_kernel(ocl_device *d, const ocl_gemm_cfg *c, nd_dtype dt, nd_dtype at,
                          nd_dtype bt, int la, int lb, cl_kernel *k) {
    char defs[320];
    gemm_defines(dt, at, bt, c->accumulate, defs, sizeof defs);
    if (c->kind == OCL_GEMM_TILED && c->c_rows) {
        /* the tile staged for the store, padded against bank conflicts, where it fits
         * beside the operand tiles (else the plain store: the same values) */
        size_t es = nd_dtype_size(dt);
        size_t bytes = ((size_t)c->tsk * (size_t)(c->tsm + c->tsn) +
                        (size_t)c->tsn * (size_t)(c->tsm + 1)) * es;
        if (bytes <= d->local_mem) strncat(defs, " -DC_LAYOUT=1", sizeof defs - strlen(defs) - 1);
    }
    if (c->kind == OCL_GEMM_NAIVE) return ocl_kernel(d, "gemm", defs, "gemm_naive", k);
    size_t n = strlen(defs);
    bool tiled = c->kind == OCL_GEMM_TILED, dot = c->kind == OCL_GEMM_DOT;
    /* direct: vectors along N need b unit-stride there; else scalar */
    int vw = c->kind == OCL_GEMM_DIRECT && lb != 1 ? 1 : c->vw;
    snprintf(defs + n, sizeof defs - n,
             " -DTSM=%d -DTSN=%d -DTSK=%d -DWPTM=%d -DWPTN=%d -DVW=%d -DUSE_LOCAL=%d"
             " -DA_LAYOUT=%d -DB_LAYOUT=%d%s",
             c->tsm, c->tsn, tiled ? c->tsk : 1, c->wptm, c->wptn, vw, tiled ? 1 : 0, la, lb,
             dot ? " -DDOT=1" : "");
    ND_TRY(ocl_kernel(d, "gemm", defs, tiled ? "gemm_tiled" : dot ? "gemm_dot" : "gemm_direct", k));
    /* A driver may allow fewer work-items for this kernel than for the
     * device (registers): then the launch would fail. */
    size_t kwg = 0, wg = (size_t)(c->tsm / c->wptm) * (size_t)(c->tsn / c->wptn);
    if (clGetKernelWorkGroupInfo(*k, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) ==
            CL_SUCCESS && kwg && kwg < wg) {
        char cs[48];
        ocl_gemm_cfg_str(c, cs, sizeof cs);
        return nd_fail(ND_ERR_DEVICE, "matmul: GEMM kernel '%s' needs work-groups of %zu but "
                       "opencl:%d (%s) allows %zu for it", cs, wg, d->index, d->info.name, kwg);
    }
    return ND_OK;
}

/* The arguments every kernel of gemm.cl takes (see its header). */
static nd_status set_gemm_args(ocl_device *d, cl_kernel k, const nd_tensor *out, const nd_tensor *a,
                               const nd_tensor *b, const ocl_geom *g) {
    int n = out->ndim;
    cl_long M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
    cl_long a_sm = a->strides[n - 2], a_sk = a->strides[n - 1];
    cl_long b_sk = b->strides[n - 2], b_sn = b->strides[n - 1];
    cl_long c_sm = out->strides[n - 2], c_sn = out->strides[n - 1];
    cl_mem am = ocl_mem(a), bm = ocl_mem(b), cm = ocl_mem(out);
    cl_int e = OCL_ARG(k, 0, M) | OCL_ARG(k, 1, N) | OCL_ARG(k, 2, K) | OCL_ARG(k, 3, *g) |
               OCL_ARG(k, 4, am) | OCL_ARG(k, 5, a_sm) | OCL_ARG(k, 6, a_sk) |
               OCL_ARG(k, 7, bm) | OCL_ARG(k, 8, b_sk) | OCL_ARG(k, 9, b_sn) |
               OCL_ARG(k, 10, cm) | OCL_ARG(k, 11, c_sm) | OCL_ARG(k, 12, c_sn);
    return e != CL_SUCCESS ? ocl_fail(e, "matmul", "setting kernel arguments", d) : ND_OK;
}

nd_status ocl_gemm_run(ocl_device *d, const ocl_gemm_cfg *c, nd_tensor *out, const nd_tensor *a,
                       const nd_tensor *b) {
    int n = out->ndim;
    cl_long M = out->shape[n - 2], N = out->shape[n - 1];
    ocl_geom g;
    int64_t batch = batch_geom(&g, out, a, b);
    if (M == 0 || N == 0 || batch == 0) return ND_OK;
    int la, lb;
    ocl_gemm_layouts(a, b, &la, &lb);
    ocl_gemm_cfg cc = *c;
    cc.c_rows = out->strides[n - 2] == 1 && out->strides[n - 1] != 1 && M > 1;
    cl_kernel k;
    ND_TRY(ocl_gemm_kernel(d, &cc, out->dtype, a->dtype, b->dtype, la, lb, &k));
    ND_TRY(set_gemm_args(d, k, out, a, b, &g));
    size_t global[3], local[3];
    if (c->kind == OCL_GEMM_NAIVE) {
        /* 16 x 16 groups, narrower for matrix-vector shapes */
        size_t ln = 1, lm = 1;
        while (ln < 16 && (int64_t)ln < N) ln *= 2;
        while (lm < 16 && (int64_t)lm < M && ln * lm * 2 <= d->max_wg) lm *= 2;
        while (ln * lm > d->max_wg && ln > 1) ln /= 2;
        global[0] = (size_t)N; global[1] = (size_t)M; global[2] = (size_t)batch;
        local[0] = ln; local[1] = lm; local[2] = 1;
    } else {
        size_t rm = (size_t)(c->tsm / c->wptm), rn = (size_t)(c->tsn / c->wptn);
        global[0] = (size_t)((N + c->tsn - 1) / c->tsn) * rn;
        global[1] = (size_t)((M + c->tsm - 1) / c->tsm) * rm;
        global[2] = (size_t)batch;
        local[0] = rn; local[1] = rm; local[2] = 1;
    }
    return ocl_launch(d, k, "matmul", 3, global, local);
}

/* ---------------------------------------------------------------- skinny */

/* Few rows (or, transposed, few columns): at most this many. */
#define SKINNY_MAX 32

/* NEEDLE_OPENCL_GEMM_SPLIT, for the two ways of splitting a product that a
 * tiled configuration would give too few work-groups (the skinny kernel,
 * split-K): "auto" (default: on a GPU, when it would), "always" (whenever
 * the shape allows, on any device: the specs use it on POCL) or "never". */
static int split_mode(void) {
    static int mode = -2; /* not read yet; racing readers store the same value */
    if (mode == -2) {
        const char *e = getenv("NEEDLE_OPENCL_GEMM_SPLIT");
        mode = e && strcmp(e, "always") == 0 ? 1 : e && strcmp(e, "never") == 0 ? -1 : 0;
    }
    return mode;
}

/* Work-groups configuration c runs for an M x N product (batch times). */
static double cfg_groups(const ocl_gemm_cfg *c, int64_t M, int64_t N, int64_t batch) {
    if (c->kind == OCL_GEMM_NAIVE) return (double)M * (double)N * (double)batch / 256.0;
    return (double)((M + c->tsm - 1) / c->tsm) * (double)((N + c->tsn - 1) / c->tsn) * (double)batch;
}

/* 1: the skinny kernel on the rows, 2: on the columns (C^T = B^T A^T),
 * 0: the configuration c. On a GPU a product with few rows or columns goes
 * to the skinny kernel when c would run fewer than two work-groups per
 * compute unit (measured on an H100: a 20 x 256 x 1024 product took 72 us
 * tiled, in 4 work-groups). */
static int skinny_choice(const ocl_device *d, const ocl_gemm_cfg *c, int64_t M, int64_t N,
                         int64_t batch) {
    int mode = split_mode();
    if (mode < 0 || d->max_wg < 256 || (M > SKINNY_MAX && N > SKINNY_MAX)) return 0;
    if (mode == 0 && (!d->info.is_gpu ||
                      cfg_groups(c, M, N, batch) >= 2.0 * (double)d->info.compute_units))
        return 0;
    return M <= N ? 1 : 2;
}

static nd_status skinny_run(ocl_device *d, nd_tensor *out, const nd_tensor *a, const nd_tensor *b,
                            bool accumulate) {
    int n = out->ndim;
    cl_long M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
    ocl_geom g;
    int64_t batch = batch_geom(&g, out, a, b);
    if (M == 0 || N == 0 || batch == 0) return ND_OK;
    int la, lb;
    ocl_gemm_layouts(a, b, &la, &lb);
    /* B contiguous along K: slices along K are the fast dimension, 8 columns
     * per group. Otherwise columns are: 32 of them (128-byte rows of B) and
     * 8 slices, or for a long K (dgates @ W: 20 x 256 x 1024 ran in 40
     * groups of 128 steps, 17 us on an H100) 8 columns (32-byte sectors
     * still) and 32 slices, four times the groups and a quarter the steps. */
    int skl = lb == 2, skr = 4;
    int skn = skl || K >= 256 ? 8 : 32, sks = skl || K >= 256 ? 32 : 8;
    char defs[320];
    gemm_defines(out->dtype, a->dtype, b->dtype, accumulate, defs, sizeof defs);
    size_t len = strlen(defs);
    snprintf(defs + len, sizeof defs - len, " -DSKR=%d -DSKN=%d -DSKS=%d -DSKL=%d -DA_LAYOUT=%d "
             "-DB_LAYOUT=%d", skr, skn, sks, skl, la, lb);
    cl_kernel k;
    ND_TRY(ocl_kernel(d, "gemm", defs, "gemm_skinny", &k));
    ND_TRY(set_gemm_args(d, k, out, a, b, &g));
    size_t l0 = (size_t)(skl ? sks : skn), l1 = (size_t)(skl ? skn : sks);
    size_t global[3] = {(size_t)((N + skn - 1) / skn) * l0, (size_t)((M + skr - 1) / skr) * l1,
                        (size_t)batch};
    size_t local[3] = {l0, l1, 1};
    return ocl_launch(d, k, "matmul", 3, global, local);
}

/* out^T = b^T a^T: the same product with rows and columns swapped, as views. */
static nd_status skinny_run_transposed(ocl_device *d, nd_tensor *out, const nd_tensor *a,
                                       const nd_tensor *b, bool accumulate) {
    const nd_tensor *src[3] = {out, b, a};
    nd_tensor *v[3] = {NULL, NULL, NULL};
    nd_status st = ND_OK;
    for (int i = 0; i < 3 && st == ND_OK; i++) {
        const nd_tensor *t = src[i];
        int nd = t->ndim;
        int64_t shape[ND_MAX_DIMS], strides[ND_MAX_DIMS];
        memcpy(shape, t->shape, sizeof(int64_t) * (size_t)nd);
        memcpy(strides, t->strides, sizeof(int64_t) * (size_t)nd);
        shape[nd - 2] = t->shape[nd - 1]; shape[nd - 1] = t->shape[nd - 2];
        strides[nd - 2] = t->strides[nd - 1]; strides[nd - 1] = t->strides[nd - 2];
        st = nd_tensor_view_of(t, shape, strides, nd, t->offset, &v[i]);
    }
    if (st == ND_OK) st = skinny_run(d, v[0], v[1], v[2], accumulate);
    for (int i = 0; i < 3; i++) nd_release(v[i]);
    return st;
}

/* ---------------------------------------------------------------- split-K */

/* Into how many slices of K to split a product whose tiles would leave a
 * GPU's compute units idle (1: none). The LSTM decoder's input gradient,
 * 700 x 256 x 10000, is 44 tiles of 64 x 64 on an H100's 132 SMs, each
 * walking K = 10000 alone (0.86 ms). Split, the slices run as one batched
 * product into a temporary and a sum adds them (both deterministic). The
 * slices must divide K, each at least 256 long (64 when forced). */
static int splitk_parts(const ocl_device *d, const ocl_gemm_cfg *c, int64_t M, int64_t N,
                        int64_t K, int64_t batch, int ndim) {
    int mode = split_mode();
    if (mode < 0 || c->kind == OCL_GEMM_NAIVE || ndim >= ND_MAX_DIMS) return 1;
    double groups = cfg_groups(c, M, N, batch), cu = (double)d->info.compute_units;
    if (mode == 0 && (!d->info.is_gpu || groups >= cu)) return 1;
    int64_t min_slice = mode > 0 ? 64 : 256;
    int best = 1;
    for (int s = 2; s <= 16; s *= 2) {
        if (K % s || K / s < min_slice) break;
        best = s;
        if (groups * s >= 2.0 * cu) break; /* enough groups: no more temporary than needed */
    }
    return best;
}

/* out (+)= a @ b as s products of K / s each (a batch of them, into a
 * temporary (s, ...out's shape)) and a sum over the slices. */
static nd_status splitk_run(ocl_device *d, const ocl_gemm_cfg *c, nd_tensor *out, const nd_tensor *a,
                            const nd_tensor *b, int s, bool accumulate) {
    int n = out->ndim;
    int64_t kc = a->shape[n - 1] / s;
    int64_t sh[ND_MAX_DIMS], st[ND_MAX_DIMS];
    nd_tensor *av = NULL, *bv = NULL, *part = NULL, *ov = NULL;
    /* a as (s, ..., M, kc), b as (s, ..., kc, N): slice i starts i * kc along K */
    sh[0] = s; st[0] = kc * a->strides[n - 1];
    for (int i = 0; i < n; i++) { sh[i + 1] = a->shape[i]; st[i + 1] = a->strides[i]; }
    sh[n] = kc;
    nd_status r = nd_tensor_view_of(a, sh, st, n + 1, a->offset, &av);
    if (r == ND_OK) {
        sh[0] = s; st[0] = kc * b->strides[n - 2];
        for (int i = 0; i < n; i++) { sh[i + 1] = b->shape[i]; st[i + 1] = b->strides[i]; }
        sh[n - 1] = kc;
        r = nd_tensor_view_of(b, sh, st, n + 1, b->offset, &bv);
    }
    if (r == ND_OK) {
        sh[0] = s;
        for (int i = 0; i < n; i++) sh[i + 1] = out->shape[i];
        nd_device dv = {ND_DEVICE_OPENCL, d->index};
        r = nd_empty_on(dv, sh, n + 1, out->dtype, &part);
    }
    if (r == ND_OK) {
        ocl_gemm_cfg pc = *c;
        pc.accumulate = 0;
        r = ocl_gemm_run(d, &pc, part, av, bv);
    }
    if (r == ND_OK) { /* out seen as (1, ...) : the sum's keepdim form */
        sh[0] = 1; st[0] = 0;
        for (int i = 0; i < n; i++) { sh[i + 1] = out->shape[i]; st[i + 1] = out->strides[i]; }
        r = nd_tensor_view_of(out, sh, st, n + 1, out->offset, &ov);
    }
    if (r == ND_OK) {
        bool reduced[ND_MAX_DIMS] = {true};
        r = accumulate ? ocl_reduce_sum_acc(ov, part, reduced)
                       : ocl_reduce(ND_REDUCE_sum, ov, part, reduced, 0);
    }
    nd_release(av);
    nd_release(bv);
    nd_release(part);
    nd_release(ov);
    return r;
}

/* ---------------------------------------------------------------- the entry */

/* x in dtype half (float16 or bfloat16): x itself (a new reference) when
 * it is already, else a copy rounded to nearest even - what a product
 * inside nd.autocast{device_type = "opencl"} multiplies. One conversion
 * pass; the GEMM reads the half copy as it is (A_HALF / B_HALF). */
static nd_status half_operand(const nd_tensor *x, nd_dtype half, nd_tensor **out) {
    if (x->dtype == half) {
        nd_retain((nd_tensor *)x);
        *out = (nd_tensor *)x;
        return ND_OK;
    }
    nd_device dv = {ND_DEVICE_OPENCL, ocl_dev(x)->index};
    nd_tensor *h = NULL;
    *out = NULL;
    nd_status st = nd_empty_on(dv, x->shape, x->ndim, half, &h);
    if (st == ND_OK) st = ocl_copy(h, x);
    if (st != ND_OK) {
        nd_release(h);
        return st;
    }
    *out = h;
    return ND_OK;
}

static nd_status matmul_at(nd_tensor *out, const nd_tensor *a, const nd_tensor *b, bool accumulate);

static nd_status matmul(nd_tensor *out, const nd_tensor *a, const nd_tensor *b, bool accumulate) {
    const nd_dtype half = nd_get_opencl_matmul_dtype();
    if (half == ND_FLOAT32 || out->dtype != ND_FLOAT32 || !ocl_gemm_reads(a->dtype) ||
        !ocl_gemm_reads(b->dtype))
        return matmul_at(out, a, b, accumulate);
    nd_tensor *ah = NULL, *bh = NULL;
    nd_status st = half_operand(a, half, &ah);
    if (st == ND_OK) st = half_operand(b, half, &bh);
    if (st == ND_OK) st = matmul_at(out, ah, bh, accumulate);
    nd_release(ah);
    nd_release(bh);
    return st;
}

static nd_status matmul_at(nd_tensor *out, const nd_tensor *a, const nd_tensor *b, bool accumulate) {
    ocl_device *d = ocl_dev(out);
    nd_dtype dt = out->dtype;
    bool halves = dt == ND_FLOAT32 && ocl_gemm_reads(a->dtype) && ocl_gemm_reads(b->dtype);
    if ((a->dtype != dt || b->dtype != dt) && !halves)
        return nd_fail(ND_ERR_DTYPE, "matmul: operands %s and %s and result %s differ on opencl:%d "
                       "(float16 and bfloat16 operands may go with a float32 result; the op "
                       "converts the others first)", nd_dtype_name(a->dtype),
                       nd_dtype_name(b->dtype), nd_dtype_name(dt), d->index);
    ND_TRY(ocl_check_dtype(d, dt, "matmul"));
    bool fl = dt == ND_FLOAT32 || dt == ND_FLOAT64;
    if (!fl && dt != ND_INT64 && dt != ND_INT32 && dt != ND_UINT8)
        return nd_fail(ND_ERR_DTYPE, "matmul: dtype %s is not supported on opencl:%d (float32, "
                       "float64, int64, int32, uint8)", nd_dtype_name(dt), d->index);
    int n = out->ndim;
    int64_t M = out->shape[n - 2], N = out->shape[n - 1], K = a->shape[n - 1];
    if (K == 0) {
        if (accumulate) { /* out += 0, as an add of zeros would (-0 becomes +0) */
            const uint64_t zero = 0;
            return ocl_binary_scalar(ND_BINARY_add, out, out, &zero, false);
        }
        const uint64_t zero = 0; /* every dtype's 0 is all-zero bytes */
        return ocl_fill(out, &zero);
    }
    ocl_gemm_cfg c = {OCL_GEMM_NAIVE, 0, 0, 0, 0, 0, 0, 0};
    int cls = ocl_gemm_class(M, N, K), la, lb;
    ocl_gemm_layouts(a, b, &la, &lb);
    int group = ocl_gemm_group(lb);
    if (fl) c = ocl_gemm_config(d, cls, group, dt);
    c.accumulate = accumulate;
    if (fl) {
        int64_t batch = 1;
        for (int i = 0; i < n - 2; i++) batch *= out->shape[i];
        int sk = skinny_choice(d, &c, M, N, batch);
        if (sk) return sk == 1 ? skinny_run(d, out, a, b, accumulate)
                               : skinny_run_transposed(d, out, a, b, accumulate);
        /* (Large products of few tiles stay on their class: the small
         * class's 32 x 32 tiles made 700 x 256 x 10000 slower on an H100,
         * 1.24 ms against 0.86, though they run four times the groups.) */
        int parts = splitk_parts(d, &c, M, N, K, batch, n);
        if (parts > 1) return splitk_run(d, &c, out, a, b, parts, accumulate);
    }
    nd_status st = ocl_gemm_run(d, &c, out, a, b);
    if (st != ND_OK && accumulate && c.kind != OCL_GEMM_NAIVE && st != ND_ERR_MEMORY) {
        /* The driver refused the accumulating variant of the configuration
         * (registers): the plain product into a temporary, then an add - the
         * same kernels and bits as without the epilogue pass. */
        nd_tensor *t;
        nd_device dv = {ND_DEVICE_OPENCL, d->index};
        ND_TRY(nd_empty_on(dv, out->shape, out->ndim, out->dtype, &t));
        st = matmul_at(t, a, b, false);
        if (st == ND_OK) st = ocl_binary(ND_BINARY_add, out, out, t);
        nd_release(t);
        return st;
    }
    if (st != ND_OK && c.kind != OCL_GEMM_NAIVE && st != ND_ERR_MEMORY) {
        /* The device's compiler or launcher refused this configuration:
         * use the naive kernel for the class from now on, and say so once
         * (nd.opencl_tune finds one that works). */
        ocl_gemm_disable(d, cls, group, dt, nd_last_error());
        c.kind = OCL_GEMM_NAIVE;
        st = ocl_gemm_run(d, &c, out, a, b);
    }
    return st;
}

nd_status ocl_matmul(nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    return matmul(out, a, b, false);
}

nd_status ocl_matmul_acc(nd_tensor *out, const nd_tensor *a, const nd_tensor *b) {
    return matmul(out, a, b, true);
}
