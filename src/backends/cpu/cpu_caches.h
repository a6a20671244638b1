/* cpu_caches.h - the CPU's cache sizes, for kernels that size their blocks
 * to them (the GEMM's column blocks stay in L2). */
#ifndef ND_CPU_CACHES_H
#define ND_CPU_CACHES_H

#include <stdbool.h>
#include <stdint.h>

/* Bytes of L2 cache a core has: NEEDLE_L2_BYTES when set (a container that
 * hides /sys, or a test that wants small blocks), else what Linux reports
 * for cpu0 (/sys/devices/system/cpu/cpu0/cache), else 1 MiB. Clamped to
 * [64 KiB, 64 MiB]. Read once. */
int64_t nd_cpu_l2_bytes(void);

/* Whether the CPU is Intel's (cpuid's vendor), for the few choices between
 * kernels that were measured per vendor. Read once. */
bool nd_cpu_is_intel(void);

#endif
