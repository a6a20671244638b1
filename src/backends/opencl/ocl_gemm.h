/* ocl_gemm.h - the OpenCL GEMM (kernels/gemm.cl): kernel configurations,
 * the launcher (ocl_matmul.c) and the autotuner with its on-disk choices
 * (ocl_gemm_tune.c). Internal to the OpenCL backend, except for the tuner's
 * entry point nd_ocl_gemm_tune, which the Lua binding calls. */
#ifndef ND_OCL_GEMM_H
#define ND_OCL_GEMM_H

#include <stdbool.h>
#include <stdint.h>
#include "../../tensor.h"

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
} ocl_gemm_cfg;

/* Size classes, each with its own configuration: launch overhead dominates
 * small products, throughput large ones. */
enum { OCL_GEMM_SMALL = 0, OCL_GEMM_LARGE = 1, OCL_GEMM_NCLASS = 2 };
/* Layout groups, each with its own configuration too: "nn" where b is
 * contiguous along N (row-major) or neither, "nt" where b is contiguous
 * along K (b = w:t(), as in x @ w:t() of a Linear layer). */
enum { OCL_GEMM_NN = 0, OCL_GEMM_NT = 1, OCL_GEMM_NGROUP = 2 };
/* Products with M * N * K at or below this are "small" (128^3). */
#define OCL_GEMM_SMALL_FLOPS (INT64_C(1) << 21)

#define OCL_GEMM_MAX_SIZES 16 /* sizes per tuning run (each timed in both layout groups) */
#define OCL_GEMM_MAX_PROBLEMS (2 * OCL_GEMM_MAX_SIZES)
#define OCL_GEMM_MAX_CANDIDATES 64

typedef struct {
    int64_t m, n, k;
    int cls;              /* OCL_GEMM_SMALL / LARGE */
    int group;            /* OCL_GEMM_NN / NT */
    double gflops, ms;    /* the chosen configuration on this size */
    double naive_gflops;  /* the naive kernel, for comparison (0 if not timed) */
    char cfg[48];         /* the chosen configuration (ocl_gemm_cfg_str) */
} ocl_gemm_size_result;

typedef struct {
    char cfg[48];
    int group;            /* the layout group it was timed in */
    char status[64];      /* "ok", "skipped: ...", "wrong result (...)", "build failed" */
    double gflops[OCL_GEMM_MAX_PROBLEMS]; /* per problem; 0 when not timed */
} ocl_gemm_candidate_result;

typedef struct {
    int device;
    char device_name[256];
    char config[OCL_GEMM_NCLASS][OCL_GEMM_NGROUP][48]; /* the choice after tuning */
    bool tuned[OCL_GEMM_NCLASS][OCL_GEMM_NGROUP]; /* false: nothing of that kind timed; kept */
    int nsizes;           /* problems: each size in each layout group asked for */
    ocl_gemm_size_result sizes[OCL_GEMM_MAX_PROBLEMS];
    int ncandidates, ntried, nrejected;
    ocl_gemm_candidate_result cand[OCL_GEMM_MAX_CANDIDATES];
    double peak_gflops;    /* estimate, see peak_formula */
    char peak_formula[512];
    double elapsed_s;
    bool budget_exhausted;
    char file[1100];       /* where the choice was saved ("" if not saved) */
} ocl_gemm_tune_result;

typedef struct {
    int device;                       /* OpenCL device index */
    int nsizes;                       /* 0: the defaults */
    int64_t sizes[OCL_GEMM_MAX_SIZES][3]; /* M, N, K */
    double budget_s;                  /* stop trying new candidates after this */
    bool verbose;                     /* progress lines on stderr */
    bool save;                        /* write the choice to the cache file */
    bool groups[OCL_GEMM_NGROUP];     /* which layout groups to tune */
} ocl_gemm_tune_opts;

/* Runs the autotuner on opts->device (see ocl_gemm_tune.c). */
nd_status nd_ocl_gemm_tune(const ocl_gemm_tune_opts *opts, ocl_gemm_tune_result *res);
/* The configuration per class and group that matmul uses on the device
 * now, where it came from ("tuned (<file>)" or "default ..."), and the
 * cache file path. */
nd_status nd_ocl_gemm_current(int device, char cfg[OCL_GEMM_NCLASS][OCL_GEMM_NGROUP][48],
                              char *source, size_t nsource, char *file, size_t nfile);
/* "small"/"large", "nn"/"nt" */
extern const char *const ocl_gemm_class_names[OCL_GEMM_NCLASS];
extern const char *const ocl_gemm_group_names[OCL_GEMM_NGROUP];
/* Forgets the device's tuned choice (deletes the file; defaults from now on). */
nd_status nd_ocl_gemm_forget(int device);
/* The device's theoretical float32 peak, an estimate with its formula. */
nd_status nd_ocl_gemm_peak(int device, double *gflops, char *formula, size_t n);

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
/* The kernel of configuration c for dtype dt and layouts la, lb (built on
 * first use), checked against the driver's per-kernel work-group limit. */
nd_status ocl_gemm_kernel(ocl_device *d, const ocl_gemm_cfg *c, nd_dtype dt, int la, int lb,
                          cl_kernel *k);
/* Runs c on out = a @ b (shapes and strides as ocl_matmul takes them, out
 * allocated) without the checks of ocl_matmul. */
nd_status ocl_gemm_run(ocl_device *d, const ocl_gemm_cfg *c, nd_tensor *out, const nd_tensor *a,
                       const nd_tensor *b);
#endif

#endif
