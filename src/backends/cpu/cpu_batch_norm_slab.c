/* cpu_batch_norm_slab.c - batch norm forward and backward for small maps
 * (fewer than BN_SLAB_MAX_SP pixels per channel, down to 1: the 1-D batch
 * norm of an MLP and the 2x2 / 1x1 maps at the end of ResNet9).
 *
 * cpu_norm.c walks each channel's rows of sp values; with sp = 1 or 4 a
 * "row" is one to four values and the loop overhead is the whole cost
 * (ResNet9's eight batch norms took about 0.6 ms per training step, most
 * of it in the 1x1 and 2x2 layers). Here each image's (C, sp) slab is
 * contiguous, so the sums run over whole slabs with one accumulator per
 * (channel, pixel) - vectorised across channels - and the per-channel
 * constants are spread to slab width for the elementwise passes. Threads
 * split the slab's columns; sums are in double, like cpu_norm.c. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"

/* columns [j0, j1) of a cs-wide slab for this thread */
#define THREAD_COLUMNS(cs, j0, j1)                                                   \
    const int team_ = omp_get_num_threads(), id_ = omp_get_thread_num();            \
    const int64_t j0 = (cs) * id_ / team_, j1 = (cs) * (id_ + 1) / team_

/* per channel: the sum over its sp accumulators */
static double channel_sum(const double *acc, int64_t ch, int64_t sp) {
    double s = 0;
    for (int64_t k = 0; k < sp; k++) s += acc[ch * sp + k];
    return s;
}

#define BN_SLAB_FORWARD(T)                                                                     \
    do {                                                                                       \
        const T *X = (const T *)nd_ptr(x);                                                     \
        const T *Wt = w ? (const T *)nd_ptr(w) : NULL, *Bs = b ? (const T *)nd_ptr(b) : NULL;  \
        T *Y = (T *)nd_ptr(y), *M = (T *)nd_ptr(mean), *R = (T *)nd_ptr(rstd);                 \
        T *mu_e = (T *)spread, *sc = mu_e + cs, *sh = sc + cs;                                 \
        const double cnt = (double)(n * sp);                                                   \
        if (training) {                                                                        \
            _Pragma("omp parallel num_threads(nd_cpu_threads()) if (par)")                     \
            {                                                                                  \
                THREAD_COLUMNS(cs, j0, j1);                                                    \
                for (int64_t j = j0; j < j1; j++) acc[j] = 0;                                  \
                for (int64_t i = 0; i < n; i++) {                                              \
                    const T *xp = X + i * cs;                                                  \
                    for (int64_t j = j0; j < j1; j++) acc[j] += xp[j];                         \
                }                                                                              \
            }                                                                                  \
            for (int64_t ch = 0; ch < c; ch++) {                                               \
                M[ch] = (T)(channel_sum(acc, ch, sp) / cnt);                                   \
                for (int64_t k = 0; k < sp; k++) mu_e[ch * sp + k] = M[ch];                    \
            }                                                                                  \
            _Pragma("omp parallel num_threads(nd_cpu_threads()) if (par)")                     \
            {                                                                                  \
                THREAD_COLUMNS(cs, j0, j1);                                                    \
                for (int64_t j = j0; j < j1; j++) acc[j] = 0;                                  \
                for (int64_t i = 0; i < n; i++) {                                              \
                    const T *xp = X + i * cs;                                                  \
                    for (int64_t j = j0; j < j1; j++) {                                        \
                        const T d = xp[j] - mu_e[j];                                           \
                        acc[j] += (double)(d * d);                                             \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            for (int64_t ch = 0; ch < c; ch++)                                                 \
                R[ch] = (T)(1.0 / sqrt(channel_sum(acc, ch, sp) / cnt + eps));                 \
        }                                                                                      \
        for (int64_t ch = 0; ch < c; ch++) {                                                   \
            const T scale = R[ch] * (Wt ? Wt[ch] : (T)1);                                      \
            const T shift = (Bs ? Bs[ch] : (T)0) - M[ch] * scale;                              \
            for (int64_t k = 0; k < sp; k++) sc[ch * sp + k] = scale, sh[ch * sp + k] = shift; \
        }                                                                                      \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (par) schedule(static)")    \
        for (int64_t i = 0; i < n; i++) {                                                      \
            const T *xp = X + i * cs;                                                          \
            T *yp = Y + i * cs;                                                                \
            _Pragma("omp simd")                                                                \
            for (int64_t j = 0; j < cs; j++) yp[j] = xp[j] * sc[j] + sh[j];                    \
        }                                                                                      \
    } while (0)

/* Scratch for one slab pass: acc_rows slabs of double sums and spread_rows
 * slabs in x's dtype, each cs = C * pixels long; freed by the caller. */
static nd_status slab_scratch(const nd_tensor *x, int64_t cs, int acc_rows, int spread_rows,
                              double **acc, void **spread) {
    *acc = malloc((size_t)acc_rows * sizeof(double) * (size_t)cs);
    *spread = malloc((size_t)spread_rows * nd_dtype_size(x->dtype) * (size_t)cs);
    if (!*acc || !*spread) {
        free(*acc), free(*spread);
        return nd_fail(ND_ERR_MEMORY, "batch_norm: out of memory");
    }
    return ND_OK;
}

nd_status nd_cpu_batch_norm_slab(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd,
                                 const nd_tensor *x, const nd_tensor *w, const nd_tensor *b,
                                 double eps, bool training) {
    const int64_t n = x->shape[0], c = x->shape[1], sp = nd_numel(x) / (n * c), cs = c * sp;
    const bool par = n * cs >= ND_PARALLEL_THRESHOLD;
    double *acc;
    void *spread;
    ND_TRY(slab_scratch(x, cs, 1, 3, &acc, &spread));
    if (x->dtype == ND_FLOAT32) BN_SLAB_FORWARD(float);
    else BN_SLAB_FORWARD(double);
    free(acc), free(spread);
    return ND_OK;
}

/* The formulas of cpu_norm.c's BN_BACKWARD: per channel sg = sum(g), sgx =
 * sum(g * (x - mean)) * rstd; dx = k1 * g - k2 * (x - mean) - k3. */
#define BN_SLAB_BACKWARD(T)                                                                    \
    do {                                                                                       \
        const T *X = (const T *)nd_ptr(x), *G = (const T *)nd_ptr(g);                          \
        const T *Wt = w ? (const T *)nd_ptr(w) : NULL;                                         \
        const T *M = (const T *)nd_ptr(mean), *R = (const T *)nd_ptr(rstd);                    \
        T *DX = dx ? (T *)nd_ptr(dx) : NULL, *DW = dw ? (T *)nd_ptr(dw) : NULL;                \
        T *DB = db ? (T *)nd_ptr(db) : NULL;                                                   \
        T *mu_e = (T *)spread, *k1 = mu_e + cs, *k2 = k1 + cs, *k3 = k2 + cs;                  \
        for (int64_t ch = 0; ch < c; ch++)                                                     \
            for (int64_t k = 0; k < sp; k++) mu_e[ch * sp + k] = M[ch];                        \
        double *ag = acc, *agx = acc + cs;                                                     \
        _Pragma("omp parallel num_threads(nd_cpu_threads()) if (par)")                         \
        {                                                                                      \
            THREAD_COLUMNS(cs, j0, j1);                                                        \
            for (int64_t j = j0; j < j1; j++) ag[j] = 0, agx[j] = 0;                           \
            for (int64_t i = 0; i < n; i++) {                                                  \
                const T *xp = X + i * cs, *gp = G + i * cs;                                    \
                for (int64_t j = j0; j < j1; j++) {                                            \
                    ag[j] += gp[j];                                                            \
                    agx[j] += (double)(gp[j] * (xp[j] - mu_e[j]));                             \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        const double cnt = (double)(n * sp);                                                   \
        for (int64_t ch = 0; ch < c; ch++) {                                                   \
            const double rs = R[ch], sg = channel_sum(ag, ch, sp);                             \
            const double sgx = channel_sum(agx, ch, sp) * rs, wv = Wt ? Wt[ch] : 1.0;          \
            if (DW) DW[ch] = (T)sgx;                                                           \
            if (DB) DB[ch] = (T)sg;                                                            \
            const T a = (T)(rs * wv);                                                          \
            const T bb = training ? (T)(rs * wv * rs * sgx / cnt) : (T)0;                      \
            const T cc = training ? (T)(rs * wv * sg / cnt) : (T)0;                            \
            for (int64_t k = 0; k < sp; k++)                                                   \
                k1[ch * sp + k] = a, k2[ch * sp + k] = bb, k3[ch * sp + k] = cc;               \
        }                                                                                      \
        if (!DX) break;                                                                        \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (par) schedule(static)")    \
        for (int64_t i = 0; i < n; i++) {                                                      \
            const T *xp = X + i * cs, *gp = G + i * cs;                                        \
            T *dp = DX + i * cs;                                                               \
            _Pragma("omp simd")                                                                \
            for (int64_t j = 0; j < cs; j++)                                                   \
                dp[j] = k1[j] * gp[j] - k2[j] * (xp[j] - mu_e[j]) - k3[j];                     \
        }                                                                                      \
    } while (0)

nd_status nd_cpu_batch_norm_backward_slab(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                          const nd_tensor *g, const nd_tensor *x,
                                          const nd_tensor *w, const nd_tensor *mean,
                                          const nd_tensor *rstd, bool training) {
    const int64_t n = x->shape[0], c = x->shape[1], sp = nd_numel(x) / (n * c), cs = c * sp;
    const bool par = n * cs >= ND_PARALLEL_THRESHOLD;
    double *acc;
    void *spread;
    ND_TRY(slab_scratch(x, cs, 2, 4, &acc, &spread));
    if (x->dtype == ND_FLOAT32) BN_SLAB_BACKWARD(float);
    else BN_SLAB_BACKWARD(double);
    free(acc), free(spread);
    return ND_OK;
}
