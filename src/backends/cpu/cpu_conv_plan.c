/* cpu_conv_plan.c - the conv plan (cpu_conv_plan.h): live taps, chunking,
 * the offset table. */
#include "cpu_conv_plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Images per chunk of cpu_conv_gemm.c: about this many GEMM columns (one
 * image per chunk from 32x32 maps up). Timed on ResNet9 and ResNet-18 at
 * batch 8 and 128 (1 thread): 512 to 1024 did best, 4096 to 16384 were
 * 5-15% slower at batch 128 (a larger im2col buffer falls out of cache).
 * NEEDLE_CONV_CHUNK_COLS overrides it, for tuning (read per call: getenv is
 * cheap next to a conv). */
#define CHUNK_COLS_DEFAULT 1024

static int64_t chunk_cols(void) {
    const char *e = getenv("NEEDLE_CONV_CHUNK_COLS");
    long long n = e ? atoll(e) : 0;
    return n > 0 ? n : CHUNK_COLS_DEFAULT;
}

/* Does kernel tap (i, j) read only padding at every output position? */
static bool tap_outside(const nd_conv_geom *g, int64_t i, int64_t j, int64_t H, int64_t W) {
    bool row = false, col = false;
    for (int64_t oh = 0; oh < g->lh && !row; oh++) {
        int64_t y = oh * g->sh - g->ph + i * g->dh;
        row = y >= 0 && y < H;
    }
    for (int64_t ow = 0; ow < g->lw && !col; ow++) {
        int64_t x = ow * g->sw - g->pw + j * g->dw;
        col = x >= 0 && x < W;
    }
    return !row || !col;
}

void nd_conv_plan_free(nd_conv_plan *p) {
    free(p->tap);
    free(p->off);
    p->tap = NULL;
    p->off = NULL;
}

nd_status nd_conv_plan_table(nd_conv_plan *p, const char *op) {
    const nd_conv_geom *g = p->g;
    if (p->off || g->lw > ND_CONV_TABLE_MAX_LW || p->nt == 0 || p->H * p->W > INT32_MAX)
        return ND_OK;
    p->off = malloc(sizeof(int32_t) * (size_t)(p->nt * p->L));
    if (!p->off) return nd_fail(ND_ERR_MEMORY, "%s: out of memory", op);
    for (int64_t t = 0; t < p->nt; t++) {
        const int64_t i = p->tap[t] / g->kw, j = p->tap[t] % g->kw;
        for (int64_t oh = 0; oh < g->lh; oh++)
            for (int64_t ow = 0; ow < g->lw; ow++) {
                const int64_t y = oh * g->sh - g->ph + i * g->dh;
                const int64_t x = ow * g->sw - g->pw + j * g->dw;
                const bool in = y >= 0 && y < p->H && x >= 0 && x < p->W;
                p->off[t * p->L + oh * g->lw + ow] = in ? (int32_t)(y * p->W + x) : -1;
            }
    }
    return ND_OK;
}

nd_status nd_conv_plan_make(nd_conv_plan *p, const char *op, const nd_tensor *x, int64_t O,
                            const nd_conv_geom *g, int64_t groups) {
    memset(p, 0, sizeof *p);
    p->N = x->shape[0], p->C = x->shape[1], p->H = x->shape[2], p->W = x->shape[3];
    p->O = O, p->G = groups, p->Cg = p->C / groups, p->Og = O / groups;
    p->kk = g->kh * g->kw, p->L = g->lh * g->lw, p->g = g;
    p->x_img = p->C * p->H * p->W, p->y_img = O * p->L;
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: no cpu kernel for %s", op, nd_dtype_name(x->dtype));
    if (p->N < 1 || p->Cg < 1 || p->Og < 1 || p->L < 1) /* the op layer routes these elsewhere */
        return nd_fail(ND_ERR_ARG, "%s: empty convolution", op);
    p->tap = malloc(sizeof(int64_t) * (size_t)p->kk);
    if (!p->tap) return nd_fail(ND_ERR_MEMORY, "%s: out of memory", op);
    for (int64_t i = 0; i < g->kh; i++)
        for (int64_t j = 0; j < g->kw; j++)
            if (!tap_outside(g, i, j, p->H, p->W)) p->tap[p->nt++] = i * g->kw + j;
    p->K = p->Cg * p->nt;
    p->nb = (chunk_cols() + p->L - 1) / p->L;
    if (p->nb > p->N) p->nb = p->N;
    if (p->nb < 1) p->nb = 1;
    if (p->Og > INT_MAX || p->K > INT_MAX || p->nb * p->L > INT_MAX) {
        nd_conv_plan_free(p);
        return nd_fail(ND_ERR_ARG, "%s: GEMM dims M=%lld N=%lld K=%lld exceed BLAS's int range", op,
                       (long long)p->Og, (long long)(p->nb * p->L), (long long)p->K);
    }
    return ND_OK;
}

bool nd_conv_bf16_pays(const nd_conv_plan *p, nd_conv_product which) {
    const int64_t cols = p->nb * p->L, kg = p->Cg * p->nt;
    const int64_t gm = which == ND_CONV_GRAD_X ? kg : p->Og, gn = which == ND_CONV_GRAD_W ? kg : cols;
    const int64_t gk = which == ND_CONV_FORWARD ? kg : which == ND_CONV_GRAD_X ? p->Og : cols;
    return (double)gm * (double)gn * (double)gk >= (double)ND_CONV_BF16_MIN_MADDS;
}
