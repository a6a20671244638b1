/* cpu_optim.c - fused optimizer updates: one pass over a parameter, its
 * gradient and its state instead of one tensor op (and often a temporary)
 * per term of the formula. See nd_sgd_step_, nd_adam_step_ and
 * nd_amp_unscale_ (a gradient scaler's unscale) in needle.h.
 *
 * Each term is rounded to the tensor's dtype where the composed ops round
 * it (a product, then a sum), so fused and composed agree to the bit; the
 * build does not contract a * b + c into an FMA (-std=c11 implies
 * -ffp-contract=off in GCC, and the generic x86-64 target has no FMA). */
#include <float.h>
#include <math.h>
#include "cpu_kernels.h"

#define SGD_STEP(T)                                                                       \
    do {                                                                                  \
        T *P = (T *)nd_ptr(p);                                                            \
        const T *G = (const T *)nd_ptr(grad);                                             \
        T *B = buf ? (T *)nd_ptr(buf) : NULL;                                             \
        const T wd = (T)h->weight_decay, m = (T)h->momentum;                              \
        const T keep = (T)(1.0 - h->dampening), neg_lr = (T)(-h->lr);                     \
        const bool use_wd = h->weight_decay != 0, damp = h->dampening != 0;               \
        const bool nesterov = h->nesterov, maximize = h->maximize;                        \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                                 \
            T g = maximize ? -G[i] : G[i];                                                \
            if (use_wd) {                                                                 \
                const T t = P[i] * wd;                                                    \
                g = g + t;                                                                \
            }                                                                             \
            if (B) {                                                                      \
                T b;                                                                      \
                if (first) b = g;                                                         \
                else {                                                                    \
                    const T bm = B[i] * m;                                                \
                    const T gd = damp ? g * keep : g;                                     \
                    b = bm + gd;                                                          \
                }                                                                         \
                B[i] = b;                                                                 \
                if (nesterov) {                                                           \
                    const T t = b * m;                                                    \
                    g = g + t;                                                            \
                } else g = b;                                                             \
            }                                                                             \
            const T step = g * neg_lr;                                                    \
            P[i] = P[i] + step;                                                           \
        }                                                                                 \
    } while (0)

/* g *= inv in one pass, noting a non-finite element: |x| <= max is false for
 * inf and NaN alike (a compare the loop vectorises, no branch) */
#define AMP_UNSCALE(T, MAX)                                                               \
    do {                                                                                  \
        T *G = (T *)nd_ptr(g);                                                            \
        const T s = (T)inv;                                                               \
        int bad = 0;                                                                      \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n >= ND_PARALLEL_THRESHOLD) schedule(static) reduction(|:bad)") \
        for (int64_t i = 0; i < n; i++) {                                                 \
            const T x = G[i];                                                             \
            bad |= !(x <= (T)MAX && x >= -(T)MAX);                                        \
            G[i] = x * s;                                                                 \
        }                                                                                 \
        if (bad) *found_inf = true;                                                       \
    } while (0)

nd_status nd_cpu_amp_unscale(nd_tensor *g, double inv, bool *found_inf) {
    const int64_t n = nd_numel(g);
    if (g->dtype == ND_FLOAT32) AMP_UNSCALE(float, FLT_MAX);
    else if (g->dtype == ND_FLOAT64) AMP_UNSCALE(double, DBL_MAX);
    else return nd_fail(ND_ERR_DTYPE, "amp_unscale: no cpu kernel for %s", nd_dtype_name(g->dtype));
    return ND_OK;
}

nd_status nd_cpu_sgd_step(nd_tensor *p, const nd_tensor *grad, nd_tensor *buf,
                          const nd_sgd_hyper *h, bool first) {
    const int64_t n = nd_numel(p);
    if (p->dtype == ND_FLOAT32) SGD_STEP(float);
    else if (p->dtype == ND_FLOAT64) SGD_STEP(double);
    else return nd_fail(ND_ERR_DTYPE, "sgd_step: no cpu kernel for %s", nd_dtype_name(p->dtype));
    return ND_OK;
}

#define ADAM_STEP(T)                                                                      \
    do {                                                                                  \
        T *P = (T *)nd_ptr(p), *Mv = (T *)nd_ptr(m), *V = (T *)nd_ptr(v);                  \
        const T *G = (const T *)nd_ptr(grad);                                             \
        const T b1 = (T)h->beta1, b2 = (T)h->beta2, c1 = (T)h->one_minus_beta1;           \
        const T c2 = (T)h->one_minus_beta2, eps = (T)h->eps, wd = (T)h->weight_decay;     \
        const T decay = (T)h->decay, step = (T)h->step_size, bc2 = (T)h->bc2_sqrt;        \
        const bool use_wd = h->weight_decay != 0, decoupled = h->decoupled;               \
        const bool maximize = h->maximize;                                                \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                                 \
            T g = maximize ? -G[i] : G[i];                                                \
            T pv = P[i];                                                                  \
            if (use_wd) {                                                                 \
                if (decoupled) pv = pv * decay;                                           \
                else {                                                                    \
                    const T t = pv * wd;                                                  \
                    g = g + t;                                                            \
                }                                                                         \
            }                                                                             \
            const T mb = Mv[i] * b1, gc = g * c1;                                         \
            const T mn = mb + gc;                                                         \
            const T vb = V[i] * b2, gc2 = g * c2;                                         \
            const T gg = gc2 * g;                                                         \
            const T vn = vb + gg;                                                         \
            Mv[i] = mn;                                                                   \
            V[i] = vn;                                                                    \
            const T root = sqrt(vn);                                                      \
            const T scaled = root / bc2;                                                  \
            const T denom = scaled + eps;                                                 \
            const T num = mn * step;                                                      \
            const T upd = num / denom;                                                    \
            P[i] = pv + upd;                                                              \
        }                                                                                 \
    } while (0)

nd_status nd_cpu_adam_step(nd_tensor *p, const nd_tensor *grad, nd_tensor *m, nd_tensor *v,
                           const nd_adam_hyper *h) {
    const int64_t n = nd_numel(p);
    if (p->dtype == ND_FLOAT32) ADAM_STEP(float);
    else if (p->dtype == ND_FLOAT64) ADAM_STEP(double);
    else return nd_fail(ND_ERR_DTYPE, "adam_step: no cpu kernel for %s", nd_dtype_name(p->dtype));
    return ND_OK;
}
