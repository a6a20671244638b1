/* cpu_amx.c - permission to use AMX tiles (cpu_amx.h).
 *
 * AMX's tile registers are 8 KiB of state that Linux does not save for a
 * process unless it asks first (arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA), Linux 5.16 and later); a tile instruction without
 * that permission kills the process with SIGILL. The request is
 * process-wide, so the OpenMP workers that run the kernel share it. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_amx.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static bool detect(void) {
    const char *env = getenv("NEEDLE_AMX");
    if (env && strcmp(env, "0") == 0) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#else
static bool detect(void) { return false; }
#endif

bool nd_cpu_amx_bf16(void) {
    static _Atomic int state = -1; /* -1 not asked yet; threads may race to the same answer */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s < 0) {
        s = detect() ? 1 : 0;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s == 1;
}
