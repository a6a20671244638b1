/* ocl_gemm.h - the OpenCL GEMM (kernels/gemm.cl): kernel configurations,
 * the launcher (ocl_matmul.c) and the autotuner with its on-disk choices
 * (ocl_gemm_tune.c). Internal to the OpenCL backend; the tuner's interface
 * for the bindings is src/opencl_tune.h. */
#ifndef ND_OCL_GEMM_H
#define ND_OCL_GEMM_H

#include <stdbool.h>
#include <stdint.h>
#include "../../tensor.h"
#include "../../opencl_tune.h"

/* Which kernel of gemm.cl a configuration runs. */
typedef enum {
    OCL_GEMM_NAIVE = 0,  /* one work-item per output, no tiling */
    OCL_GEMM_TILED = 1,  /* local-memory tiles + register tiles (gemm_tiled) */
    OCL_GEMM_DIRECT = 2, /* register tiles read straight from global memory, vectors along N (gemm_direct) */
    OCL_GEMM_DOT = 3,    /* register tiles of dot products, vectors along K (gemm_dot) */
} ocl_gemm_kind;

/* One kernel configuration (the build defines of gemm.cl). The work-group
 * is (tsn / wptn) x (tsm / wptm); tsk matters to the tiled kernel only, vw
 * is the vector width (of tile loads, along N, or along K by kind). */
typedef struct {
    int kind;
    int tsm, tsn, tsk, wptm, wptn, vw;
    int accumulate; /* C += A @ B (ocl_matmul_acc); not part of a tuned configuration */
    int c_rows;     /* C contiguous along M (a transposed view; ocl_gemm_run sets it): the
                     * tiled kernel stores its tile through local memory (C_LAYOUT) */
} ocl_gemm_cfg;
/* Products with M * N * K at or below this are "small" (128^3). */
#define OCL_GEMM_SMALL_FLOPS (INT64_C(1) << 21)

#ifdef ND_OCL_RUNTIME_H /* for the backend's own files */
/* "tiled 64x64x16 4x4 v4", "direct 8x128 8x16 v16", "dot 16x16 4x4 v16", "naive" */
void ocl_gemm_cfg_str(const ocl_gemm_cfg *c, char *buf, size_t n);
bool ocl_gemm_cfg_parse(const char *s, ocl_gemm_cfg *c);
/* Can the device run c on elements of elem bytes? (why says why not) */
bool ocl_gemm_cfg_valid(const ocl_device *d, const ocl_gemm_cfg *c, size_t elem, char *why,
                        size_t nwhy);
/* The class of an M x N x K product. */
int ocl_gemm_class(int64_t m, int64_t n, int64_t k);
/* Can configuration c serve layout group g? (dot needs nt; direct with
 * vectors along N needs nn) */
bool ocl_gemm_cfg_fits_group(const ocl_gemm_cfg *c, int g);
/* The configuration matmul uses for a class, a layout group and a float
 * dtype: the tuned choice (loaded from disk on first use) when the device
 * can run it on dt, the default otherwise. */
ocl_gemm_cfg ocl_gemm_config(ocl_device *d, int cls, int group, nd_dtype dt);
/* The default configuration of a class and group on the device for dtype
 * dt (the first valid of a short list; naive when none is). */
ocl_gemm_cfg ocl_gemm_default(ocl_device *d, int cls, int group, nd_dtype dt);
/* The configuration of class cls and group g failed on the device (msg
 * says how): use the naive kernel there in this process, with a warning. */
void ocl_gemm_disable(ocl_device *d, int cls, int group, nd_dtype dt, const char *msg);
/* gemm.cl's layout codes (A_LAYOUT, B_LAYOUT) of operands a and b. */
void ocl_gemm_layouts(const nd_tensor *a, const nd_tensor *b, int *la, int *lb);
/* The layout group of b's layout code. */
static inline int ocl_gemm_group(int lb) { return lb == 2 ? OCL_GEMM_NT : OCL_GEMM_NN; }
/* gemm.cl's storage code (A_HALF / B_HALF) of an operand of dtype dt: 1
 * float16, 2 bfloat16 (read as stored and widened on load, in a float32
 * product), 0 the product's own dtype. */
static inline int ocl_gemm_half_code(nd_dtype dt) {
    return dt == ND_FLOAT16 ? 1 : dt == ND_BFLOAT16 ? 2 : 0;
}
/* Whether a float32 product's kernels read an operand of dtype dt. */
static inline bool ocl_gemm_reads(nd_dtype dt) {
    return dt == ND_FLOAT32 || nd_dtype_is_half(dt);
}
/* The kernel of configuration c for result dtype dt, operand dtypes at and
 * bt (dt's, or float16 / bfloat16 with a float32 dt) and layouts la, lb
 * (built on first use), checked against the driver's per-kernel
 * work-group limit. */
nd_status ocl_gemm_kernel(ocl_device *d, const ocl_gemm_cfg *c, nd_dtype dt, nd_dtype at,
                          nd_dtype bt, int la, int lb, cl_kernel *k);
/* Runs c on out = a @ b (shapes and strides as ocl_matmul takes them, out
 * allocated) without the checks of ocl_matmul. */
nd_status ocl_gemm_run(ocl_device *d, const ocl_gemm_cfg *c, nd_tensor *out, const nd_tensor *a,
                       const nd_tensor *b);
#endif

#endif
