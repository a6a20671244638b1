/* ocl_random.c - random fills: Philox as on the CPU (kernels/random.cl). */
#include "ocl_kernels.h"

/* Not written yet: each entry fails with a clear error. */
nd_status ocl_random(nd_tensor *out, nd_random_kind kind, double a, double b, const nd_tensor *p, uint64_t seed, uint64_t offset) {
    (void)out;
    (void)kind;
    (void)a;
    (void)b;
    (void)p;
    (void)seed;
    (void)offset;
    return nd_fail(ND_ERR_UNSUPPORTED, "random: no kernel on device 'opencl' yet");
}

