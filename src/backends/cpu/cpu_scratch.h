/* cpu_scratch.h - scratch memory for the CPU kernels' packed panels.
 *
 * Kernels that pack operands (the GEMM's panels, the packed convolution's
 * weight and column panels) need megabytes per call. From malloc, such a
 * block comes from mmap or from the top of the heap, which glibc gives back
 * to the system when it is freed, depending on its adaptive thresholds: a
 * process then page-faults (and zeroes) every panel on every call - a
 * ResNet9 inference at batch 8 ran 0.30 or 0.58 ms per call depending on
 * the heap's history. These blocks come from the caching allocator
 * (alloc_cache.c) instead, which keeps them for the next call. 64-byte
 * aligned; thread-safe. */
#ifndef ND_CPU_SCRATCH_H
#define ND_CPU_SCRATCH_H

#include <stddef.h>

/* nbytes of scratch (64-byte aligned), NULL when out of memory */
void *nd_cpu_scratch_alloc(size_t nbytes);
/* gives back a block of nd_cpu_scratch_alloc (NULL: nothing) */
void nd_cpu_scratch_free(void *p);

#endif
