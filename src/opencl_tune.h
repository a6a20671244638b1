/* opencl_tune.h - the OpenCL GEMM autotuner's interface (implemented by the
 * OpenCL backend, ocl_gemm_tune.c; called by the Lua binding
 * lt_opencl_tune.c, which must not reach into the backend's own headers). */
#ifndef ND_OPENCL_TUNE_H
#define ND_OPENCL_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "needle.h"

/* Size classes, each with its own configuration: launch overhead dominates
 * small products, throughput large ones. */
enum { OCL_GEMM_SMALL = 0, OCL_GEMM_LARGE = 1, OCL_GEMM_NCLASS = 2 };
/* Layout groups, each with its own configuration too: "nn" where b is
 * contiguous along N (row-major) or neither, "nt" where b is contiguous
 * along K (b = w:t(), as in x @ w:t() of a Linear layer). */
enum { OCL_GEMM_NN = 0, OCL_GEMM_NT = 1, OCL_GEMM_NGROUP = 2 };
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

#endif
