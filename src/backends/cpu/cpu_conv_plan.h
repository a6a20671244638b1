/* cpu_conv_plan.h - what the CPU conv kernels (cpu_conv_gemm.c,
 * cpu_conv_packed.c) work out once per call: shapes, the live kernel taps
 * and, for the gathers, a table of input offsets per tap and output pixel. */
#ifndef ND_CPU_CONV_PLAN_H
#define ND_CPU_CONV_PLAN_H

#include "backend.h"

typedef struct {
    int64_t N, C, H, W, O, G, Cg, Og, kk, L;
    int64_t x_img, y_img; /* elements from one image of x (C*H*W) and of the output (O*L) to the
                           * next: a group's plan (cpu_conv_packed.c) keeps the whole tensors' */
    int64_t nt;       /* live taps */
    int64_t *tap;     /* their indices i*kw + j, nt of them */
    int64_t K;        /* GEMM depth per group: Cg * nt */
    int64_t nb;       /* images per chunk (cpu_conv_gemm.c) */
    int32_t *off;     /* (nt, L) offsets into an input plane, -1 for padding; or NULL
                       * (nd_conv_plan_table; only the BLAS path reads it) */
    const nd_conv_geom *g;
} nd_conv_plan;

/* Output rows up to this wide get the offset table (nd_conv_plan_table),
 * for the BLAS path's gathers: a 4x4 map's im2col row is 4 rows of 4
 * copies, each with its own edge tests, which cost more than the GEMM (perf
 * on ResNet9's 4x4 layers: im2col 41% of the time, memset 13%). Wider rows
 * copy faster as runs. */
#define ND_CONV_TABLE_MAX_LW 16

/* x: the input or its gradient (for N, C, H, W and the dtype); O output
 * channels. Fails on a dtype other than float32/float64 and on an empty
 * convolution (the op layer routes those elsewhere). */
nd_status nd_conv_plan_make(nd_conv_plan *p, const char *op, const nd_tensor *x, int64_t O,
                            const nd_conv_geom *g, int64_t groups);
/* p->off for the BLAS path, when its rows are at most ND_CONV_TABLE_MAX_LW
 * wide (else it stays NULL); fails only when out of memory */
nd_status nd_conv_plan_table(nd_conv_plan *p, const char *op);
void nd_conv_plan_free(nd_conv_plan *p);

/* Multiply-adds from which a product of a convolution runs faster through
 * (both paths: cpu_conv_packed.c's choice, cpu_conv_gemm.c's GEMMs)
 * im2col and the bfloat16 GEMM than in float32 here: that path packs both
 * operands to bfloat16 on every call, which smaller products do not earn
 * back. A layer's forward and backward, float32 against bfloat16, 2-core
 * Zen 4 (ms): ResNet9 at batch 128, 128 -> 128 3x3 on 1x1 maps (products
 * of 128 x 128 x 128) 0.25 against 0.41, 32 -> 32 on 4x4 (up to 19M) 1.00
 * against 0.97-1.06, and its whole training step 9.1 against 11.4 with
 * every product of 64 x 64 or more on bfloat16, 10.6 from 8M, 9.1 with
 * none; ResNet-50's at batch 4 (products of 200M to 900M) 1.0-1.8x faster
 * on bfloat16: 512 -> 512 3x3 on 7x7 19.4 against 14.5, 1024 -> 256 1x1 on
 * 14x14 8.4 against 5.7. */
#define ND_CONV_BF16_MIN_MADDS (INT64_C(32) << 20)

/* the three products of a convolution, for the choice of path */
typedef enum { ND_CONV_FORWARD, ND_CONV_GRAD_X, ND_CONV_GRAD_W } nd_conv_product;

/* cpu_conv_plan.c: whether product `which` of p is large enough for
 * bfloat16 products (ND_CONV_BF16_MIN_MADDS, judged on a whole chunk of
 * nb images, so that every chunk of a call computes alike); the precision
 * ("medium") and the GEMM's own 64 x 64 decide the rest */
bool nd_conv_bf16_pays(const nd_conv_plan *p, nd_conv_product which);

/* cpu_conv_packed.c: whether its packed float32 path runs this product of
 * p (dtype dt): AVX2 + FMA, groups = 1, and a shape where it beats the
 * BLAS path (NEEDLE_CONV_BLAS=1: never; NEEDLE_CONV_PACKED=1: whatever the
 * shape). */
bool nd_cpu_conv_packed_runs(const nd_conv_plan *p, nd_dtype dt, nd_conv_product which);

/* cpu_conv_packed.c: the float32 path on AVX2 + FMA CPUs. *done = false
 * (and ND_OK) when it does not apply; then the caller runs the BLAS path. */
nd_status nd_cpu_conv2d_packed(nd_conv_plan *p, nd_tensor *out, const nd_tensor *x,
                               const nd_tensor *w, const float *prepacked, const nd_tensor *b,
                               nd_activation act, const nd_tensor *res, bool *done);
/* prepacked is w in the layout nd_cpu_conv2d_prepack writes (then w is
 * not read; NULL: w is packed here, per call). The backend's
 * conv2d_packed_numel, conv2d_prepack and conv2d_fused_packed (backend.h): */
int64_t nd_cpu_conv2d_packed_numel(const int64_t *xshape, const int64_t *wshape, nd_dtype dt,
                                   const nd_conv_geom *g, int64_t groups);
nd_status nd_cpu_conv2d_prepack(nd_tensor *packed, const nd_tensor *w, const int64_t *xshape,
                                const nd_conv_geom *g, int64_t groups);
nd_status nd_cpu_conv2d_fused_packed(nd_tensor *out, const nd_tensor *x, const nd_tensor *packed,
                                     const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                                     nd_activation act, const nd_tensor *res);
/* gx and gw (either may be NULL) when the packed path runs every product
 * asked for (nd_cpu_conv_packed_runs); else *done = false and nothing is
 * written */
nd_status nd_cpu_conv2d_packed_backward(nd_conv_plan *p, nd_tensor *gx, nd_tensor *gw,
                                        const nd_tensor *dy, const nd_tensor *x,
                                        const nd_tensor *w, bool *done);

#endif
