/* cpu_avx2.c - the run-time switch of the AVX2 + FMA kernels (cpu_avx2.h). */
#include "cpu_avx2.h"

#include <stdlib.h>

bool nd_cpu_avx2_enabled(const char *off_env, int *cache) {
    if (*cache < 0) {
        const char *off = getenv(off_env);
        bool on = !(off && *off && *off != '0');
#ifdef ND_HAVE_AVX2_KERNELS
        __builtin_cpu_init();
        on = on && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        on = false;
#endif
        *cache = on;
    }
    return *cache == 1;
}
