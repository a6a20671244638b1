/* cpu_copy.c - strided copy with dtype conversion, and fill. */
#include <string.h>
#include "cpu_kernels.h"
#include "cpu_loop.h"

typedef struct { nd_dtype to, from; size_t size; } copy_ctx;

/* Same dtype: move bytes; a dense run is one memcpy. */
static void copy_same(char **p, const int64_t *s, int64_t n, void *vctx) {
    const copy_ctx *c = vctx;
    size_t sz = c->size;
    if (s[0] == (int64_t)sz && s[1] == (int64_t)sz) {
        memcpy(p[0], p[1], (size_t)n * sz);
        return;
    }
    char *d = p[0];
    const char *src = p[1];
    switch (sz) {
    case 1: for (int64_t i = 0; i < n; i++, d += s[0], src += s[1]) *d = *src; break;
    case 2: for (int64_t i = 0; i < n; i++, d += s[0], src += s[1]) memcpy(d, src, 2); break;
    case 4: for (int64_t i = 0; i < n; i++, d += s[0], src += s[1]) memcpy(d, src, 4); break;
    default: for (int64_t i = 0; i < n; i++, d += s[0], src += s[1]) memcpy(d, src, 8); break;
    }
}

#define CONVERT_LOOP(TO, FROM)                                                       \
    do {                                                                             \
        if (s[0] == sizeof(TO) && s[1] == sizeof(FROM)) {                            \
            TO *d = (TO *)p[0];                                                      \
            const FROM *x = (const FROM *)p[1];                                      \
            for (int64_t i = 0; i < n; i++) d[i] = (TO)x[i];                         \
        } else {                                                                     \
            for (int64_t i = 0; i < n; i++)                                          \
                *(TO *)(p[0] + i * s[0]) = (TO) * (const FROM *)(p[1] + i * s[1]);   \
        }                                                                            \
    } while (0)

/* Conversions that training code hits (float <-> double, labels to float)
 * get typed loops; the rest go through double. */
static void copy_convert(char **p, const int64_t *s, int64_t n, void *vctx) {
    const copy_ctx *c = vctx;
    if (c->to == ND_FLOAT32 && c->from == ND_FLOAT64) { CONVERT_LOOP(float, double); return; }
    if (c->to == ND_FLOAT64 && c->from == ND_FLOAT32) { CONVERT_LOOP(double, float); return; }
    if (c->to == ND_FLOAT32 && c->from == ND_INT64) { CONVERT_LOOP(float, int64_t); return; }
    if (c->to == ND_FLOAT32 && c->from == ND_UINT8) { CONVERT_LOOP(float, uint8_t); return; }
    if (c->to == ND_FLOAT32 && c->from == ND_BOOL) { CONVERT_LOOP(float, uint8_t); return; }
    if (c->to == ND_FLOAT64 && c->from == ND_INT64) { CONVERT_LOOP(double, int64_t); return; }
    for (int64_t i = 0; i < n; i++)
        nd_store_f64(p[0] + i * s[0], c->to, nd_load_f64(p[1] + i * s[1], c->from));
}

nd_status nd_cpu_copy(nd_tensor *dst, const nd_tensor *src) {
    nd_loop L;
    const nd_tensor *ts[2] = {dst, src};
    nd_loop_init(&L, 2, ts);
    copy_ctx c = {dst->dtype, src->dtype, nd_dtype_size(dst->dtype)};
    /* float->int conversions saturate (nd_store_f64), so no UB on any input */
    bool same = dst->dtype == src->dtype;
    nd_loop_run(&L, same ? copy_same : copy_convert, &c, 1);
    return ND_OK;
}

typedef struct { size_t size; unsigned char bytes[8]; } fill_ctx;

static void fill_run(char **p, const int64_t *s, int64_t n, void *vctx) {
    const fill_ctx *c = vctx;
    char *d = p[0];
    if (c->size == 4 && s[0] == 4) {
        uint32_t v;
        memcpy(&v, c->bytes, 4);
        uint32_t *o = (uint32_t *)d;
        for (int64_t i = 0; i < n; i++) o[i] = v;
    } else if (c->size == 8 && s[0] == 8) {
        uint64_t v;
        memcpy(&v, c->bytes, 8);
        uint64_t *o = (uint64_t *)d;
        for (int64_t i = 0; i < n; i++) o[i] = v;
    } else if (c->size == 1 && s[0] == 1) {
        memset(d, c->bytes[0], (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++, d += s[0]) memcpy(d, c->bytes, c->size);
    }
}

nd_status nd_cpu_fill(nd_tensor *dst, const void *value) {
    fill_ctx c = {nd_dtype_size(dst->dtype), {0}};
    memcpy(c.bytes, value, c.size);
    nd_loop L;
    const nd_tensor *ts[1] = {dst};
    nd_loop_init(&L, 1, ts);
    nd_loop_run(&L, fill_run, &c, 1);
    return ND_OK;
}

nd_status nd_cpu_contiguous(const nd_tensor *t, nd_tensor **out) {
    ND_TRY(nd_empty(t->shape, t->ndim, t->dtype, out));
    nd_status st = nd_cpu_copy(*out, t);
    if (st != ND_OK) { nd_release(*out); *out = NULL; }
    return st;
}
