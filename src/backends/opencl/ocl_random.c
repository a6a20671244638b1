/* ocl_random.c - random fills on OpenCL (kernels/random.cl): the CPU's
 * Philox stream and conversions (cpu_random.c), so a seeded draw gives the
 * same values on either device (uniform, int and bernoulli bit for bit,
 * normal up to the device's log/cos/sqrt). Element i of out (row-major)
 * takes counter offset + i whatever out's strides. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "ocl_kernels.h"

/* Kernel parameters of type P_ARG / acc_t (random.cl): float for float32
 * outputs (P_ARG only) and on devices without fp64, else double. */
typedef struct {
    _Alignas(8) unsigned char b[8];
    size_t n;
} acc_arg;

static acc_arg as_acc(const ocl_device *d, double v, bool f32) {
    acc_arg a;
    if (f32 || !d->info.fp64) {
        float f = (float)v;
        memcpy(a.b, &f, 4);
        a.n = 4;
    } else {
        memcpy(a.b, &v, 8);
        a.n = 8;
    }
    return a;
}

static acc_arg as_f32(float f) {
    acc_arg a;
    memcpy(a.b, &f, 4);
    a.n = 4;
    return a;
}

nd_status ocl_random(nd_tensor *out, nd_random_kind kind, double a, double b, const nd_tensor *p,
                     uint64_t seed, uint64_t offset) {
    const char *op = kind == ND_RANDOM_UNIFORM   ? "rand"
                     : kind == ND_RANDOM_NORMAL  ? "randn"
                     : kind == ND_RANDOM_INT     ? "randint"
                     : kind == ND_RANDOM_BERNOULLI ? "bernoulli"
                                                 : "random";
    ocl_device *d = ocl_dev(out);
    nd_dtype dt = out->dtype;
    ND_TRY(ocl_check_dtype(d, dt, op));
    if (kind == ND_RANDOM_BERNOULLI) {
        if (!p) return nd_fail(ND_ERR_ARG, "bernoulli: no probability tensor");
        ND_TRY(ocl_check_dtype(d, p->dtype, op));
    }
    if (nd_numel(out) == 0) return ND_OK;
    char defs[200];
    ocl_dtype_defines(dt, defs, sizeof defs);
    const bool f32 = dt == ND_FLOAT32;
    cl_ulong s = seed, o = offset;
    cl_kernel k;
    cl_int e = CL_SUCCESS;
    int next; /* the first argument of the strided part */
    switch (kind) {
    case ND_RANDOM_UNIFORM: {
        ND_TRY(ocl_kernel(d, "random", defs, "rand_uniform", &k));
        acc_arg pa, pw, pb, top;
        if (f32) { /* as cpu_random.c fill_uniform */
            float fa = (float)a, fb = (float)b;
            pa = as_f32(fa);
            pw = as_f32((float)(b - a));
            pb = as_f32(fb);
            top = as_f32(fb > fa ? nextafterf(fb, fa) : fb);
        } else {
            pa = as_acc(d, a, false);
            pw = as_acc(d, b - a, false);
            pb = as_acc(d, b, false);
            top = as_acc(d, b > a ? nextafter(b, a) : b, false);
        }
        e = ocl_set_arg(k, 0, pa.n, pa.b) | ocl_set_arg(k, 1, pw.n, pw.b) |
            ocl_set_arg(k, 2, pb.n, pb.b) | ocl_set_arg(k, 3, top.n, top.b) |
            OCL_ARG(k, 4, s) | OCL_ARG(k, 5, o);
        next = 6;
        break;
    }
    case ND_RANDOM_NORMAL: {
        ND_TRY(ocl_kernel(d, "random", defs, "rand_normal", &k));
        acc_arg m = as_acc(d, a, f32), sd = as_acc(d, b, f32);
        e = ocl_set_arg(k, 0, m.n, m.b) | ocl_set_arg(k, 1, sd.n, sd.b) |
            OCL_ARG(k, 2, s) | OCL_ARG(k, 3, o);
        next = 4;
        break;
    }
    case ND_RANDOM_INT: {
        ND_TRY(ocl_kernel(d, "random", defs, "rand_int", &k));
        /* the op checked a < b, both integral and in int64 range */
        cl_long lo = (int64_t)a;
        cl_ulong range = (uint64_t)(int64_t)b - (uint64_t)lo;
        e = OCL_ARG(k, 0, lo) | OCL_ARG(k, 1, range) | OCL_ARG(k, 2, s) | OCL_ARG(k, 3, o);
        next = 4;
        break;
    }
    case ND_RANDOM_BERNOULLI: {
        size_t l = strlen(defs);
        snprintf(defs + l, sizeof defs - l, " -DP_T=%s -DP_ID=%d", ocl_type_name(p->dtype),
                 (int)p->dtype);
        ND_TRY(ocl_kernel(d, "random", defs, "rand_bernoulli", &k));
        e = OCL_ARG(k, 0, s) | OCL_ARG(k, 1, o);
        next = 2;
        break;
    }
    default:
        return nd_fail(ND_ERR_ARG, "random: unknown distribution %d", (int)kind);
    }
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    const nd_tensor *ts[2] = {out, p};
    return ocl_run_strided(d, k, op, next, kind == ND_RANDOM_BERNOULLI ? 2 : 1, ts);
}
