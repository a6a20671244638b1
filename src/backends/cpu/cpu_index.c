/* cpu_index.c - gather, scatter, index_select, index_add, masked_fill.
 *
 * Every kernel first checks all index values (a parallel scan, then a serial
 * one to name the first bad value), so nothing reads or writes out of bounds
 * and nothing is written when an index is bad. Moving data is done by
 * element size (a gather of float32 and of int32 is the same 4-byte copy);
 * accumulation is typed per dtype. */
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include "cpu_dim_loop.h"
#include "cpu_kernels.h"
#include "cpu_loop.h"

/* ---- index validation ---- */

typedef struct {
    uint64_t limit;
    int bad;
    int64_t pos, bad_pos, bad_val; /* serial pass only */
} check_ctx;

static void check_any(char **p, const int64_t *s, int64_t n, void *vctx) {
    check_ctx *c = vctx;
    const char *pi = p[0];
    int bad = 0;
    /* One unsigned compare catches negatives too. */
    for (int64_t j = 0; j < n; j++, pi += s[0]) bad |= (uint64_t)*(const int64_t *)pi >= c->limit;
    if (bad) {
#pragma omp atomic write
        c->bad = 1;
    }
}

static void check_first(char **p, const int64_t *s, int64_t n, void *vctx) {
    check_ctx *c = vctx;
    const char *pi = p[0];
    for (int64_t j = 0; j < n && c->bad_pos < 0; j++, pi += s[0]) {
        int64_t v = *(const int64_t *)pi;
        if ((uint64_t)v >= c->limit) {
            c->bad_pos = c->pos + j;
            c->bad_val = v;
        }
    }
    c->pos += n;
}

/* Fails with ND_ERR_INDEX naming the first value of `index` outside
 * [0, limit), its position in index and the dim it indexes. */
static nd_status check_indices(const char *op, const nd_tensor *index, int64_t limit, int dim) {
    nd_loop L;
    check_ctx c = {.limit = (uint64_t)limit, .bad = 0, .pos = 0, .bad_pos = -1};
    nd_loop_init(&L, 1, &index);
    nd_loop_run(&L, check_any, &c, 1);
    if (!c.bad) return ND_OK;
    nd_loop_run(&L, check_first, &c, 0); /* the engine keeps row-major order */
    return nd_fail_index_bounds(op, index, c.bad_pos, c.bad_val, dim, limit);
}

/* ---- gather / index_select: out = x[... idx ...], a copy by element size ---- */

/* ptrs: out, index, x at the element's coordinates with 0 along dim;
 * ctx: x's byte stride along dim. */
#define PICK_BODY(T)                                                            \
    {                                                                           \
        const int64_t xd = *(const int64_t *)ctx;                               \
        char *po = p[0];                                                        \
        const char *pi = p[1], *px = p[2];                                      \
        for (int64_t j = 0; j < n; j++, po += s[0], pi += s[1], px += s[2])     \
            *(T *)po = *(const T *)(px + *(const int64_t *)pi * xd);            \
    }
static void pick_1(char **p, const int64_t *s, int64_t n, void *ctx) PICK_BODY(uint8_t)
static void pick_2(char **p, const int64_t *s, int64_t n, void *ctx) PICK_BODY(uint16_t)
static void pick_4(char **p, const int64_t *s, int64_t n, void *ctx) PICK_BODY(uint32_t)
static void pick_8(char **p, const int64_t *s, int64_t n, void *ctx) PICK_BODY(uint64_t)
#undef PICK_BODY

static nd_inner_fn by_size(size_t es, nd_inner_fn f1, nd_inner_fn f2, nd_inner_fn f4,
                           nd_inner_fn f8) {
    switch (es) {
    case 1: return f1;
    case 2: return f2;
    case 4: return f4;
    default: return f8;
    }
}

/* Runs pick over out, an index view and an x view (both in out's shape). */
static nd_status run_pick(nd_tensor *out, const nd_tensor *idx_view, const nd_tensor *x_view,
                          int64_t xd_bytes) {
    const nd_tensor *ops[3] = {out, idx_view, x_view};
    nd_loop L;
    nd_loop_init(&L, 3, ops);
    nd_loop_run(&L, by_size(nd_dtype_size(out->dtype), pick_1, pick_2, pick_4, pick_8),
                &xd_bytes, 1);
    return ND_OK;
}

nd_status nd_cpu_gather(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    int64_t limit = x->ndim ? x->shape[dim] : 1;
    ND_TRY(check_indices("gather", index, limit, dim));
    /* x seen in index's shape, not moving along dim: the index moves it. */
    int64_t st[ND_MAX_DIMS];
    for (int d = 0; d < index->ndim; d++) st[d] = d == dim ? 0 : x->strides[d];
    nd_tensor *xv;
    ND_TRY(nd_tensor_view_of(x, index->shape, st, index->ndim, x->offset, &xv));
    int64_t xd = x->ndim ? x->strides[dim] * (int64_t)nd_dtype_size(x->dtype) : 0;
    nd_status s = run_pick(out, index, xv, xd);
    nd_release(xv);
    return s;
}

/* Contiguous x and out: whole rows after dim are copied with memcpy (the
 * embedding lookup). */
static void index_select_rows(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    int64_t outer = 1, inner = 1, N = x->shape[dim], K = out->shape[dim];
    for (int d = 0; d < dim; d++) outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    size_t row = (size_t)inner * nd_dtype_size(x->dtype);
    const int64_t *ip = (const int64_t *)nd_ptr(index);
    int64_t is = index->ndim ? index->strides[0] : 0;
    const char *xp = nd_ptr(x);
    char *op = nd_ptr(out);
    int64_t rows = outer * K;
#pragma omp parallel for num_threads(nd_cpu_threads()) schedule(static) if (rows * inner >= ND_PARALLEL_THRESHOLD && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r / K, k = r % K;
        memcpy(op + (size_t)r * row, xp + (size_t)(o * N + ip[k * is]) * row, row);
    }
}

nd_status nd_cpu_index_select(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index) {
    int64_t limit = x->ndim ? x->shape[dim] : 1;
    ND_TRY(check_indices("index_select", index, limit, dim));
    if (nd_numel(out) == 0) return ND_OK;
    if (x->ndim == 0) { /* one element, index already checked to be 0 */
        memcpy(nd_ptr(out), nd_ptr(x), nd_dtype_size(x->dtype));
        return ND_OK;
    }
    int64_t inner = 1;
    for (int d = dim + 1; d < x->ndim; d++) inner *= x->shape[d];
    if (nd_is_contiguous(x) && nd_is_contiguous(out) && inner * (int64_t)nd_dtype_size(x->dtype) >= 32) {
        index_select_rows(out, x, dim, index);
        return ND_OK;
    }
    int64_t xst[ND_MAX_DIMS], ist[ND_MAX_DIMS];
    for (int d = 0; d < out->ndim; d++) {
        xst[d] = d == dim ? 0 : x->strides[d];
        ist[d] = d == dim && index->ndim ? index->strides[0] : 0;
    }
    nd_tensor *xv = NULL, *iv = NULL;
    nd_status s = nd_tensor_view_of(x, out->shape, xst, out->ndim, x->offset, &xv);
    if (s == ND_OK) s = nd_tensor_view_of(index, out->shape, ist, out->ndim, index->offset, &iv);
    if (s == ND_OK)
        s = run_pick(out, iv, xv, x->strides[dim] * (int64_t)nd_dtype_size(x->dtype));
    nd_release(xv);
    nd_release(iv);
    return s;
}

/* ---- scatter: tiles of slices along dim (cpu_dim_loop.h), so duplicate
 * indices only ever meet within one thread ---- */

/* ptrs: out, index, src at coordinate 0 of dim; per lane, later positions
 * along dim win for duplicate indices (deterministic). */
#define SCATTER_BODY(T, STMT)                                                  \
    {                                                                          \
        for (int64_t k = 0; k < n; k++) {                                      \
            char *po = p[0];                                                   \
            const char *pi = p[1] + k * ds[1], *ps = p[2] + k * ds[2];         \
            for (int64_t l = 0; l < lanes; l++, po += ls[0], pi += ls[1], ps += ls[2]) { \
                T *d = (T *)(po + *(const int64_t *)pi * ds[0]);               \
                T v = *(const T *)ps;                                          \
                STMT;                                                          \
            }                                                                  \
        }                                                                      \
    }
#define SCATTER_FN(name, T, STMT)                                              \
    static void name(char **p, const int64_t *ds, int64_t n, const int64_t *ls, \
                     int64_t lanes, void *ctx) SCATTER_BODY(T, STMT)
SCATTER_FN(scat_1, uint8_t, *d = v)
SCATTER_FN(scat_2, uint16_t, *d = v)
SCATTER_FN(scat_4, uint32_t, *d = v)
SCATTER_FN(scat_8, uint64_t, *d = v)
SCATTER_FN(scat_add_f32, float, *d += v)
SCATTER_FN(scat_add_f64, double, *d += v)
/* integers wrap on overflow (computed unsigned), as the elementwise add */
SCATTER_FN(scat_add_i64, int64_t, *d = (int64_t)((uint64_t)*d + (uint64_t)v))
SCATTER_FN(scat_add_i32, int32_t, *d = (int32_t)((uint32_t)*d + (uint32_t)v))
SCATTER_FN(scat_add_u8, uint8_t, *d = (uint8_t)(*d + v))
SCATTER_FN(scat_add_bool, uint8_t, *d = *d | v)
#undef SCATTER_FN
#undef SCATTER_BODY

/* float16/bfloat16: through double; ctx is the dtype. */
static void scat_add_generic(char **p, const int64_t *ds, int64_t n, const int64_t *ls,
                             int64_t lanes, void *ctx) {
    const nd_dtype dt = *(const nd_dtype *)ctx;
    for (int64_t k = 0; k < n; k++) {
        char *po = p[0];
        const char *pi = p[1] + k * ds[1], *ps = p[2] + k * ds[2];
        for (int64_t l = 0; l < lanes; l++, po += ls[0], pi += ls[1], ps += ls[2]) {
            char *d = po + *(const int64_t *)pi * ds[0];
            nd_store_f64(d, dt, nd_load_f64(d, dt) + nd_load_f64(ps, dt));
        }
    }
}

static nd_tile_fn by_size_tile(size_t es, nd_tile_fn f1, nd_tile_fn f2, nd_tile_fn f4,
                               nd_tile_fn f8) {
    switch (es) {
    case 1: return f1;
    case 2: return f2;
    case 4: return f4;
    default: return f8;
    }
}

nd_status nd_cpu_scatter(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                         int accumulate) {
    int64_t limit = out->ndim ? out->shape[dim] : 1;
    ND_TRY(check_indices(accumulate ? "scatter_add" : "scatter", index, limit, dim));
    nd_tile_fn fn;
    nd_dtype dt = out->dtype;
    if (!accumulate) {
        fn = by_size_tile(nd_dtype_size(dt), scat_1, scat_2, scat_4, scat_8);
    } else {
        switch (dt) {
        case ND_FLOAT32: fn = scat_add_f32; break;
        case ND_FLOAT64: fn = scat_add_f64; break;
        case ND_INT64: fn = scat_add_i64; break;
        case ND_INT32: fn = scat_add_i32; break;
        case ND_UINT8: fn = scat_add_u8; break;
        case ND_BOOL: fn = scat_add_bool; break;
        default: fn = scat_add_generic; break;
        }
    }
    const nd_tensor *ops[3] = {out, index, src};
    nd_dim_loop L;
    nd_dim_loop_init(&L, 3, ops, index->shape, index->ndim, dim);
    nd_dim_loop_run_tiles(&L, fn, &dt, 1);
    return ND_OK;
}

/* ---- index_add: out[.., index[k], ..] += alpha * src[.., k, ..] ---- */

typedef struct {
    const char *idx;
    int64_t idx_stride; /* bytes */
    double alpha;
    nd_dtype dt;
} index_add_ctx;

/* ptrs: out, src at coordinate 0 of dim. The lane loop gets a dense
 * version (both operands contiguous across lanes) that compilers vectorise. */
#define INDEX_ADD_FN(name, T, A, STMT)                                         \
    static void name(char **p, const int64_t *ds, int64_t n, const int64_t *ls, \
                     int64_t lanes, void *ctx) {                               \
        const index_add_ctx *c = ctx;                                          \
        const T a = (T)(A);                                                    \
        const int dense = ls[0] == sizeof(T) && ls[1] == sizeof(T);            \
        for (int64_t k = 0; k < n; k++) {                                      \
            char *po = p[0] + *(const int64_t *)(c->idx + k * c->idx_stride) * ds[0]; \
            const char *ps = p[1] + k * ds[1];                                 \
            if (dense) {                                                       \
                T *d = (T *)po;                                                \
                const T *v = (const T *)ps;                                    \
                for (int64_t l = 0; l < lanes; l++) { T *dl = d + l; T vl = v[l]; STMT(dl, vl); } \
            } else {                                                           \
                for (int64_t l = 0; l < lanes; l++, po += ls[0], ps += ls[1]) { \
                    T *dl = (T *)po;                                           \
                    T vl = *(const T *)ps;                                     \
                    STMT(dl, vl);                                              \
                }                                                              \
            }                                                                  \
        }                                                                      \
        (void)a;                                                               \
    }
/* Integer types: T is the unsigned type (the sum and product wrap, as the
 * elementwise kernels, instead of overflowing a signed type); nd_index_add
 * has checked that alpha is an integer within int64's range, so the
 * conversion to int64_t is defined, and it wraps into T. */
#define ADD_SCALED(d, v) (*(d) += a * (v))
#define ADD_SCALED_U8(d, v) (*(d) = (uint8_t)(*(d) + a * (v)))
#define OR_SCALED(d, v) (*(d) = *(d) | (a & (v)))
INDEX_ADD_FN(iadd_f32, float, c->alpha, ADD_SCALED)
INDEX_ADD_FN(iadd_f64, double, c->alpha, ADD_SCALED)
INDEX_ADD_FN(iadd_i64, uint64_t, (uint64_t)(int64_t)c->alpha, ADD_SCALED)
INDEX_ADD_FN(iadd_i32, uint32_t, (uint32_t)(uint64_t)(int64_t)c->alpha, ADD_SCALED)
INDEX_ADD_FN(iadd_u8, uint8_t, (int64_t)c->alpha, ADD_SCALED_U8)
INDEX_ADD_FN(iadd_bool, uint8_t, c->alpha != 0, OR_SCALED)
#undef ADD_SCALED
#undef ADD_SCALED_U8
#undef OR_SCALED
#undef INDEX_ADD_FN

static void iadd_generic(char **p, const int64_t *ds, int64_t n, const int64_t *ls,
                         int64_t lanes, void *ctx) {
    const index_add_ctx *c = ctx;
    for (int64_t k = 0; k < n; k++) {
        char *po = p[0] + *(const int64_t *)(c->idx + k * c->idx_stride) * ds[0];
        const char *ps = p[1] + k * ds[1];
        for (int64_t l = 0; l < lanes; l++, po += ls[0], ps += ls[1])
            nd_store_f64(po, c->dt, nd_load_f64(po, c->dt) + c->alpha * nd_load_f64(ps, c->dt));
    }
}

nd_status nd_cpu_index_add(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                           double alpha) {
    int64_t limit = out->ndim ? out->shape[dim] : 1;
    ND_TRY(check_indices("index_add", index, limit, dim));
    index_add_ctx c = {.idx = nd_ptr(index),
                       .idx_stride = index->ndim ? index->strides[0] * 8 : 0,
                       .alpha = alpha,
                       .dt = out->dtype};
    nd_tile_fn fn;
    switch (out->dtype) {
    case ND_FLOAT32: fn = iadd_f32; break;
    case ND_FLOAT64: fn = iadd_f64; break;
    case ND_INT64: fn = iadd_i64; break;
    case ND_INT32: fn = iadd_i32; break;
    case ND_UINT8: fn = iadd_u8; break;
    case ND_BOOL: fn = iadd_bool; break;
    default: fn = iadd_generic; break;
    }
    const nd_tensor *ops[2] = {out, src};
    nd_dim_loop L;
    nd_dim_loop_init(&L, 2, ops, src->shape, src->ndim, dim);
    nd_dim_loop_run_tiles(&L, fn, &c, 1);
    return ND_OK;
}

/* ---- masked_fill: out = mask ? value : out ---- */

#define MASKED_FILL_BODY(T)                                                    \
    {                                                                          \
        T v;                                                                   \
        memcpy(&v, ctx, sizeof v);                                             \
        char *po = p[0];                                                       \
        const char *pm = p[1];                                                 \
        for (int64_t j = 0; j < n; j++, po += s[0], pm += s[1])                \
            if (*(const uint8_t *)pm) *(T *)po = v;                            \
    }
static void mfill_1(char **p, const int64_t *s, int64_t n, void *ctx) MASKED_FILL_BODY(uint8_t)
static void mfill_2(char **p, const int64_t *s, int64_t n, void *ctx) MASKED_FILL_BODY(uint16_t)
static void mfill_4(char **p, const int64_t *s, int64_t n, void *ctx) MASKED_FILL_BODY(uint32_t)
static void mfill_8(char **p, const int64_t *s, int64_t n, void *ctx) MASKED_FILL_BODY(uint64_t)
#undef MASKED_FILL_BODY

nd_status nd_cpu_masked_fill(nd_tensor *out, const nd_tensor *mask, double value) {
    /* The value in out's dtype, as bytes (aligned for the widest type). */
    union { uint64_t u64; uint8_t bytes[8]; } v = {0};
    nd_store_f64(v.bytes, out->dtype, value);
    const nd_tensor *ops[2] = {out, mask};
    nd_loop L;
    nd_loop_init(&L, 2, ops);
    nd_loop_run(&L, by_size(nd_dtype_size(out->dtype), mfill_1, mfill_2, mfill_4, mfill_8),
                v.bytes, 1);
    return ND_OK;
}
