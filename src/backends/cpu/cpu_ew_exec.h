/* cpu_ew_exec.h - the CPU's executor of fused elementwise programs
 * (cpu_fused_elementwise.c), shared with the row kernels that run a program
 * as their prologue (cpu_fused_rows.c). */
#ifndef ND_CPU_EW_EXEC_H
#define ND_CPU_EW_EXEC_H

#include "cpu_kernels.h"

#define ND_CPU_EW_SCRATCH (64 * 1024) /* bytes of unstored results per call, on the stack */

/* A program made ready to run: each step's inner loop and its scratch block. */
typedef struct {
    const nd_ew_program *p;
    nd_inner_fn fn[ND_EW_MAX_STEPS];
    void *ctx[ND_EW_MAX_STEPS];
    nd_cpu_clamp_ctx clamp[ND_EW_MAX_STEPS];
    size_t es;                       /* the program's element size (where's ctx) */
    int scratch_of[ND_EW_MAX_STEPS]; /* the scratch block of each unstored result */
    int64_t tile;                    /* elements per tile */
} nd_cpu_ew_exec;

nd_status nd_cpu_ew_prepare(const nd_ew_program *p, nd_cpu_ew_exec *x);
/* Runs the program over n elements: tensor k's first at p[k], the next s[k]
 * bytes on (an nd_loop inner function; ctx the nd_cpu_ew_exec). */
void nd_cpu_ew_run(char **p, const int64_t *s, int64_t n, void *ctx);

#endif
