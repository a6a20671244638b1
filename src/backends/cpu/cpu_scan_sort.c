/* cpu_scan_sort.c - cumsum and stable sort along a dim.
 *
 * Both go through cpu_dim_loop.h: cumsum by tiles of neighbouring slices
 * (one running sum per lane), sort one whole slice at a time per thread. */
#include <stdlib.h>
#include <string.h>
#include "cpu_dim_loop.h"
#include "cpu_kernels.h"

/* ---- cumsum ----
 * Floats accumulate in double and integers in int64 (as PyTorch's CPU
 * kernel), so a long float32 cumsum does not drift. Integer sums are kept in
 * uint64_t, so an overflow wraps (as the elementwise kernels do) instead of
 * being undefined. Tiles (cpu_dim_loop.h) keep one running sum per lane.
 * ptrs: out, x. */
#define CUMSUM_FN(name, TO, TX, TACC)                                          \
    static void name(char **p, const int64_t *ds, int64_t n, const int64_t *ls, \
                     int64_t lanes, void *ctx) {                               \
        TACC acc[ND_TILE_MAX];                                                 \
        for (int64_t l = 0; l < lanes; l++) acc[l] = 0;                        \
        for (int64_t k = 0; k < n; k++) {                                      \
            char *po = p[0] + k * ds[0];                                       \
            const char *px = p[1] + k * ds[1];                                 \
            for (int64_t l = 0; l < lanes; l++, po += ls[0], px += ls[1]) {    \
                acc[l] += (TACC)*(const TX *)px;                               \
                *(TO *)po = (TO)acc[l];                                        \
            }                                                                  \
        }                                                                      \
    }
CUMSUM_FN(cumsum_f32, float, float, double)
CUMSUM_FN(cumsum_f64, double, double, double)
CUMSUM_FN(cumsum_i64, int64_t, int64_t, uint64_t)
CUMSUM_FN(cumsum_i32_i64, int64_t, int32_t, uint64_t)
CUMSUM_FN(cumsum_u8_i64, int64_t, uint8_t, uint64_t) /* bool too: stored as 0/1 */
#undef CUMSUM_FN

typedef struct { nd_dtype out, x; } dtype_pair;

/* Any other pair (float16 in and out, int to float, ...): through double. */
static void cumsum_generic(char **p, const int64_t *ds, int64_t n, const int64_t *ls,
                           int64_t lanes, void *ctx) {
    const dtype_pair *dt = ctx;
    double acc[ND_TILE_MAX];
    for (int64_t l = 0; l < lanes; l++) acc[l] = 0;
    for (int64_t k = 0; k < n; k++) {
        char *po = p[0] + k * ds[0];
        const char *px = p[1] + k * ds[1];
        for (int64_t l = 0; l < lanes; l++, po += ls[0], px += ls[1]) {
            acc[l] += nd_load_f64(px, dt->x);
            nd_store_f64(po, dt->out, acc[l]);
        }
    }
}

nd_status nd_cpu_cumsum(nd_tensor *out, const nd_tensor *x, int dim) {
    dtype_pair dt = {out->dtype, x->dtype};
    nd_tile_fn fn = cumsum_generic;
    if (dt.out == ND_FLOAT32 && dt.x == ND_FLOAT32) fn = cumsum_f32;
    else if (dt.out == ND_FLOAT64 && dt.x == ND_FLOAT64) fn = cumsum_f64;
    else if (dt.out == ND_INT64 && dt.x == ND_INT64) fn = cumsum_i64;
    else if (dt.out == ND_INT64 && dt.x == ND_INT32) fn = cumsum_i32_i64;
    else if (dt.out == ND_INT64 && (dt.x == ND_UINT8 || dt.x == ND_BOOL)) fn = cumsum_u8_i64;
    const nd_tensor *ops[2] = {out, x};
    nd_dim_loop L;
    nd_dim_loop_init(&L, 2, ops, x->shape, x->ndim, dim);
    nd_dim_loop_run_tiles(&L, fn, &dt, 1);
    return ND_OK;
}

/* ---- sort ----
 * Every value becomes an unsigned 64-bit key whose integer order is the
 * value order we want: NaN largest (all NaNs equal), -0 equal to +0; a
 * descending sort complements the key. A stable sort of (key, index) pairs
 * (merge sort for short slices, radix sort for long ones) then gives
 * PyTorch's stable=True order in both directions. */

typedef struct {
    uint64_t key;
    int64_t idx;
} sort_pair;

static inline uint64_t key_f64(double v) {
    if (v != v) return UINT64_MAX;
    if (v == 0) v = 0.0;
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return (b >> 63) ? ~b : b | (UINT64_C(1) << 63);
}

static inline uint64_t key_i64(int64_t v) { return (uint64_t)v ^ (UINT64_C(1) << 63); }

/* Insertion-sorted runs of 16, then bottom-up merges between a and tmp. */
static void sort_pairs(sort_pair *a, sort_pair *tmp, int64_t n) {
    const int64_t run = 16;
    for (int64_t lo = 0; lo < n; lo += run) {
        int64_t hi = lo + run < n ? lo + run : n;
        for (int64_t i = lo + 1; i < hi; i++) {
            sort_pair x = a[i];
            int64_t j = i;
            for (; j > lo && a[j - 1].key > x.key; j--) a[j] = a[j - 1];
            a[j] = x;
        }
    }
    sort_pair *src = a, *dst = tmp;
    for (int64_t w = run; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            if (mid == hi || src[mid - 1].key <= src[mid].key) { /* already in order */
                memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *src);
                continue;
            }
            while (i < mid && j < hi) dst[k++] = src[j].key < src[i].key ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        sort_pair *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* LSD radix sort on the keys, 8 bits a pass (stable). One histogram pass
 * serves every digit (a permutation keeps the counts), and digits that all
 * keys share are skipped: float32 keys (via double) and small integers
 * need about half the passes. */
static void radix_sort_pairs(sort_pair *a, sort_pair *tmp, int64_t n) {
    static const int nd = 8;
    int64_t (*count)[256] = calloc((size_t)nd, sizeof *count);
    if (!count) { /* no memory for the histograms: the merge sort needs none */
        sort_pairs(a, tmp, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t k = a[i].key;
        for (int b = 0; b < nd; b++) count[b][(k >> (8 * b)) & 255]++;
    }
    sort_pair *src = a, *dst = tmp;
    for (int b = 0; b < nd; b++) {
        int shift = 8 * b;
        if (count[b][(src[0].key >> shift) & 255] == n) continue;
        int64_t off[256], sum = 0;
        for (int d = 0; d < 256; d++) {
            off[d] = sum;
            sum += count[b][d];
        }
        for (int64_t i = 0; i < n; i++) dst[off[(src[i].key >> shift) & 255]++] = src[i];
        sort_pair *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
    free(count);
}

typedef struct {
    nd_dtype dt;
    int descending;
    sort_pair **scratch; /* per chunk of the dim loop: 2n pairs, allocated on first use */
    int failed;
} sort_ctx;

#define FILL_KEYS(T, KEY)                                                      \
    for (int64_t k = 0; k < n; k++, px += sx) {                                \
        buf[k].key = KEY(*(const T *)px);                                      \
        buf[k].idx = k;                                                        \
    }
#define COPY_VALUES(T)                                                         \
    for (int64_t k = 0; k < n; k++)                                            \
        *(T *)(pv + k * sv) = *(const T *)(xs + buf[k].idx * sx);

/* ptrs: values, indices, x at coordinate 0 of dim. Scratch is indexed by
 * the dim loop's chunk, not omp_get_thread_num(): inside a caller's
 * parallel region the loop runs serially and the thread number is the
 * caller's, which can exceed the number of chunks. */
static void sort_slice(char **p, const int64_t *s, int64_t n, int chunk, void *vctx) {
    sort_ctx *c = vctx;
    sort_pair **slot = &c->scratch[chunk];
    if (!*slot && !(*slot = malloc(2 * (size_t)n * sizeof(sort_pair)))) {
#pragma omp atomic write
        c->failed = 1;
    }
    if (!*slot) return;
    sort_pair *buf = *slot;
    const int64_t sx = s[2], sv = s[0], si = s[1];
    const char *px = p[2], *xs = p[2];
    switch (c->dt) {
    case ND_FLOAT32: FILL_KEYS(float, key_f64) break;
    case ND_FLOAT64: FILL_KEYS(double, key_f64) break;
    case ND_INT64: FILL_KEYS(int64_t, key_i64) break;
    case ND_INT32: FILL_KEYS(int32_t, key_i64) break;
    case ND_UINT8:
    case ND_BOOL: FILL_KEYS(uint8_t, (uint64_t)) break;
    default:
        for (int64_t k = 0; k < n; k++, px += sx) {
            buf[k].key = key_f64(nd_load_f64(px, c->dt));
            buf[k].idx = k;
        }
    }
    if (c->descending)
        for (int64_t k = 0; k < n; k++) buf[k].key = ~buf[k].key;
    if (n >= 1024) radix_sort_pairs(buf, buf + n, n);
    else sort_pairs(buf, buf + n, n);
    char *pv = p[0], *pi = p[1];
    switch (nd_dtype_size(c->dt)) {
    case 1: COPY_VALUES(uint8_t) break;
    case 2: COPY_VALUES(uint16_t) break;
    case 4: COPY_VALUES(uint32_t) break;
    default: COPY_VALUES(uint64_t) break;
    }
    for (int64_t k = 0; k < n; k++) *(int64_t *)(pi + k * si) = buf[k].idx;
}
#undef FILL_KEYS
#undef COPY_VALUES

nd_status nd_cpu_sort(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                      int descending) {
    sort_ctx c = {.dt = x->dtype, .descending = descending, .failed = 0};
    const nd_tensor *ops[3] = {values, indices, x};
    nd_dim_loop L;
    nd_dim_loop_init(&L, 3, ops, x->shape, x->ndim, dim);
    int nt = nd_dim_loop_chunks(&L, 1);
    c.scratch = calloc((size_t)nt, sizeof *c.scratch);
    if (!c.scratch) return nd_fail(ND_ERR_MEMORY, "sort: out of memory");
    nd_dim_loop_run_chunks(&L, sort_slice, &c, nt);
    for (int t = 0; t < nt; t++) free(c.scratch[t]);
    free(c.scratch);
    if (c.failed)
        return nd_fail(ND_ERR_MEMORY, "sort: out of memory for a slice of %lld elements",
                       (long long)L.n);
    return ND_OK;
}
