/* cpu_amx.h - whether this process may run Intel AMX tile instructions
 * (the bfloat16 GEMM's tile kernel, cpu_gemm.c). */
#ifndef ND_CPU_AMX_H
#define ND_CPU_AMX_H

#include <stdbool.h>

/* True when the CPU has AMX-TILE and AMX-BF16, Linux granted this process
 * the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once, for
 * every thread), and NEEDLE_AMX is not "0". Read once. */
bool nd_cpu_amx_bf16(void);

#endif
