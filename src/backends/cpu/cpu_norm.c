/* cpu_norm.c - fused layer norm, batch norm and cross entropy rows.
 *
 * Both make one pass (or two) over each row with double accumulators and
 * run rows in parallel: the composite forms write several full-size
 * temporaries instead. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include <stdlib.h>
#include "cpu_kernels.h"
#include "cpu_math.h"

/* one row: y = (x - mean) * rstd [* w] [+ b], with mean and rstd; the
 * sums in double, vectorised (lanes of partial sums: a plain loop over a
 * double accumulator is one add's latency per element) */
#define LN_ROW(T, NAME, CLONES)                                                              \
    CLONES static void NAME(const T *xr, T *yr, int64_t cols, const T *W, const T *B,        \
                            double eps, T *mean, T *rstd) {                                  \
        double s = 0;                                                                        \
        _Pragma("omp simd reduction(+ : s)")                                                 \
        for (int64_t k = 0; k < cols; k++) s += xr[k];                                       \
        double mu = s / (double)cols, v = 0;                                                 \
        _Pragma("omp simd reduction(+ : v)")                                                 \
        for (int64_t k = 0; k < cols; k++) { double d = xr[k] - mu; v += d * d; }            \
        double rs = 1.0 / sqrt(v / (double)cols + eps);                                      \
        *mean = (T)mu;                                                                       \
        *rstd = (T)rs;                                                                       \
        T tm = (T)mu, trs = (T)rs;                                                           \
        if (W && B) {                                                                        \
            _Pragma("omp simd")                                                              \
            for (int64_t k = 0; k < cols; k++) yr[k] = (xr[k] - tm) * trs * W[k] + B[k];     \
            return;                                                                          \
        }                                                                                    \
        _Pragma("omp simd")                                                                  \
        for (int64_t k = 0; k < cols; k++) {                                                 \
            T h = (xr[k] - tm) * trs;                                                        \
            if (W) h *= W[k];                                                                \
            if (B) h += B[k];                                                                \
            yr[k] = h;                                                                       \
        }                                                                                    \
    }
LN_ROW(float, ln_row_f32, ND_ISA_CLONES)
LN_ROW(double, ln_row_f64, )

void nd_cpu_layer_norm_row(nd_dtype dt, const void *x, void *y, int64_t cols, const void *w,
                           const void *b, double eps, void *mean, void *rstd) {
    if (dt == ND_FLOAT32) ln_row_f32(x, y, cols, w, b, eps, mean, rstd);
    else ln_row_f64(x, y, cols, w, b, eps, mean, rstd);
}

#define LN_ROWS(T, ROW)                                                                      \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(x);                                                   \
        const T *W = w ? (const T *)nd_ptr(w) : NULL, *B = b ? (const T *)nd_ptr(b) : NULL;  \
        T *Y = (T *)nd_ptr(y), *M = (T *)nd_ptr(mean), *R = (T *)nd_ptr(rstd);               \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (rows * cols >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < rows; r++) ROW(X + r * cols, Y + r * cols, cols, W, B, eps, M + r, R + r); \
    } while (0)

nd_status nd_cpu_layer_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps) {
    int64_t rows = nd_numel(mean), cols = rows ? nd_numel(x) / rows : 0;
    if (rows == 0 || cols == 0) return ND_OK;
    if (x->dtype == ND_FLOAT32) LN_ROWS(float, ln_row_f32);
    else LN_ROWS(double, ln_row_f64);
    return ND_OK;
}

#define CE_ROWS(T, EXP)                                                                      \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(logits);                                              \
        T *L = (T *)nd_ptr(loss);                                                            \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n * c >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < n; r++) {                                                    \
            const T *xr = X + r * c;                                                         \
            if (lab[r] == ignore) { L[r] = 0; continue; }                                    \
            T m = xr[0];                                                                     \
            double total = 0;                                                                \
            for (int64_t k = 1; k < c; k++) if (xr[k] > m || xr[k] != xr[k]) m = xr[k];      \
            double s = 0;                                                                    \
            for (int64_t k = 0; k < c; k++) { s += EXP(xr[k] - m); total += xr[k]; }     \
            double lse = (double)m + log(s);                                                 \
            /* -sum_k target_k (x_k - lse), target = (1-e) onehot + e/C */                   \
            double nll = lse - (double)xr[lab[r]];                                           \
            double smooth = lse - total / (double)c;                                         \
            L[r] = (T)((1.0 - smoothing) * nll + smoothing * smooth);                        \
        }                                                                                    \
    } while (0)

/* float32 rows: vectorisable passes (max with a NaN flag, then sums); an
 * AVX2 + FMA clone picked at load time (see cpu_softmax.c on x86-64-v3) */
ND_ISA_CLONES static float ce_row_f32(const float *x, int64_t c, int64_t label, double smoothing) {
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t k = 0; k < c; k++) {
        m = x[k] > m ? x[k] : m;
        nan |= x[k] != x[k];
    }
    if (nan) return NAN;
    if (m == -INFINITY) m = 0;
    float s = 0, total = 0;
#pragma omp simd reduction(+ : s, total)
    for (int64_t k = 0; k < c; k++) {
        s += exp_poly(x[k] - m);
        total += x[k];
    }
    double lse = (double)m + log((double)s);
    double nll = lse - (double)x[label], smooth = lse - (double)total / (double)c;
    return (float)((1.0 - smoothing) * nll + smoothing * smooth);
}

ND_ISA_CLONES static void ce_row_backward_f32(const float *x, float *d, int64_t c, int64_t label, float w,
                                double smoothing) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t k = 0; k < c; k++) m = x[k] > m ? x[k] : m;
    if (m == -INFINITY) m = 0;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < c; k++) {
        float e = exp_poly(x[k] - m);
        d[k] = e;
        s += e;
    }
    float scale = w / s, off = (float)(smoothing / (double)c) * w;
#pragma omp simd
    for (int64_t k = 0; k < c; k++) d[k] = d[k] * scale - off;
    d[label] -= (float)(1.0 - smoothing) * w;
}

nd_status nd_cpu_cross_entropy(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels,
                               int64_t ignore, double smoothing) {
    int64_t n = logits->shape[0], c = logits->shape[1];
    const int64_t *lab = (const int64_t *)nd_ptr(labels);
    if (n == 0) return ND_OK;
    if (logits->dtype == ND_FLOAT32) {
        const float *X = (const float *)nd_ptr(logits);
        float *L = (float *)nd_ptr(loss);
#pragma omp parallel for num_threads(nd_cpu_threads()) if (n * c >= ND_PARALLEL_THRESHOLD) schedule(static)
        for (int64_t r = 0; r < n; r++)
            L[r] = lab[r] == ignore ? 0.0f : ce_row_f32(X + r * c, c, lab[r], smoothing);
    } else {
        CE_ROWS(double, exp);
    }
    return ND_OK;
}

/* ---------------------------------------------------------- backward */

/* One row's backward: dx (when dr), and its terms of dw and db added into
 * pw and pb (double, cols each); sums vectorised in double. */
#define LN_BACKWARD_ROW(T, NAME, CLONES)                                                     \
    CLONES static void NAME(const T *gr, const T *xr, const T *W, double mu, double rs,     \
                            int64_t cols, double *pw, double *pb, T *dr) {                   \
        double a = 0, bsum = 0;                                                              \
        _Pragma("omp simd reduction(+ : a, bsum)")                                           \
        for (int64_t k = 0; k < cols; k++) {                                                 \
            double xh = (xr[k] - mu) * rs, gw = W ? gr[k] * (double)W[k] : gr[k];            \
            a += gw;                                                                         \
            bsum += gw * xh;                                                                 \
            pw[k] += gr[k] * xh;                                                             \
            pb[k] += gr[k];                                                                  \
        }                                                                                    \
        a /= (double)cols;                                                                   \
        bsum /= (double)cols;                                                                \
        if (!dr) return;                                                                     \
        _Pragma("omp simd")                                                                  \
        for (int64_t k = 0; k < cols; k++) {                                                 \
            double xh = (xr[k] - mu) * rs, gw = W ? gr[k] * (double)W[k] : gr[k];            \
            dr[k] = (T)(rs * (gw - a - xh * bsum));                                          \
        }                                                                                    \
    }
LN_BACKWARD_ROW(float, ln_backward_row_f32, ND_ISA_CLONES)
LN_BACKWARD_ROW(double, ln_backward_row_f64, )

/* dx, and dw/db summed over rows through per-thread partial sums (each
 * thread owns a slice of `part`, so no two threads write the same cell). */
#define LN_BACKWARD(T, ROW)                                                                  \
    do {                                                                                     \
        const T *G = (const T *)nd_ptr(g), *X = (const T *)nd_ptr(x);                        \
        const T *W = w ? (const T *)nd_ptr(w) : NULL;                                        \
        const T *M = (const T *)nd_ptr(mean), *R = (const T *)nd_ptr(rstd);                  \
        T *DX = dx ? (T *)nd_ptr(dx) : NULL;                                                 \
        _Pragma("omp parallel num_threads(nt)")                                              \
        {                                                                                    \
            double *pw = part + (size_t)omp_get_thread_num() * 2 * cols, *pb = pw + cols;    \
            _Pragma("omp for schedule(static)")                                              \
            for (int64_t r = 0; r < rows; r++)                                               \
                ROW(G + r * cols, X + r * cols, W, M[r], R[r], cols, pw, pb,                 \
                    DX ? DX + r * cols : NULL);                                              \
        }                                                                                    \
        for (int t = 0; t < nt; t++)                                                         \
            for (int64_t k = 0; k < cols; k++) {                                             \
                if (dw) ((T *)nd_ptr(dw))[k] += (T)part[(size_t)t * 2 * cols + k];          \
                if (db) ((T *)nd_ptr(db))[k] += (T)part[(size_t)t * 2 * cols + cols + k];    \
            }                                                                                \
    } while (0)

nd_status nd_cpu_layer_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd) {
    int64_t rows = nd_numel(mean), cols = rows ? nd_numel(x) / rows : 0;
    if (dw) memset(nd_ptr(dw), 0, (size_t)cols * nd_dtype_size(dw->dtype));
    if (db) memset(nd_ptr(db), 0, (size_t)cols * nd_dtype_size(db->dtype));
    if (rows == 0 || cols == 0) return ND_OK;
    int nt = rows * cols >= ND_PARALLEL_THRESHOLD ? nd_cpu_threads() : 1;
    double *part = calloc((size_t)nt * 2 * (size_t)cols, sizeof *part);
    if (!part) return nd_fail(ND_ERR_MEMORY, "layer_norm: out of memory in backward");
    if (x->dtype == ND_FLOAT32) LN_BACKWARD(float, ln_backward_row_f32);
    else LN_BACKWARD(double, ln_backward_row_f64);
    free(part);
    return ND_OK;
}

/* d logits = (softmax - target) * row weight; target = (1-e) onehot + e/C */
#define CE_BACKWARD(T, EXP)                                                                  \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(logits), *WR = (const T *)nd_ptr(wrow);               \
        T *D = (T *)nd_ptr(dlogits);                                                         \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n * c >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t r = 0; r < n; r++) {                                                    \
            const T *xr = X + r * c;                                                         \
            T *dr = D + r * c;                                                               \
            T wr = WR[r];                                                                    \
            if (lab[r] == ignore || wr == 0) { for (int64_t k = 0; k < c; k++) dr[k] = 0; continue; } \
            T m = xr[0];                                                                     \
            for (int64_t k = 1; k < c; k++) m = xr[k] > m ? xr[k] : m;                        \
            T s = 0;                                                                         \
            for (int64_t k = 0; k < c; k++) { T e = EXP(xr[k] - m); dr[k] = e; s += e; }     \
            T scale = wr / s, off = (T)(smoothing / (double)c) * wr;                         \
            for (int64_t k = 0; k < c; k++) dr[k] = dr[k] * scale - off;                     \
            dr[lab[r]] -= (T)(1.0 - smoothing) * wr;                                         \
        }                                                                                    \
    } while (0)

nd_status nd_cpu_cross_entropy_backward(nd_tensor *dlogits, const nd_tensor *logits,
                                        const nd_tensor *labels, const nd_tensor *wrow,
                                        int64_t ignore, double smoothing) {
    int64_t n = logits->shape[0], c = logits->shape[1];
    const int64_t *lab = (const int64_t *)nd_ptr(labels);
    if (n == 0 || c == 0) return ND_OK;
    if (logits->dtype == ND_FLOAT32) {
        const float *X = (const float *)nd_ptr(logits), *WR = (const float *)nd_ptr(wrow);
        float *D = (float *)nd_ptr(dlogits);
#pragma omp parallel for num_threads(nd_cpu_threads()) if (n * c >= ND_PARALLEL_THRESHOLD) schedule(static)
        for (int64_t r = 0; r < n; r++) {
            if (lab[r] == ignore || WR[r] == 0) memset(D + r * c, 0, (size_t)c * sizeof(float));
            else ce_row_backward_f32(X + r * c, D + r * c, c, lab[r], WR[r], smoothing);
        }
    } else {
        CE_BACKWARD(double, exp);
    }
    return ND_OK;
}

/* --------------------------------------------------------- batch norm */

/* One channel ch of x (n, c, sp): its statistics when training (two
 * passes: mean, then squared deviations; each row's partial sum vectorised
 * in T, the rows summed in double), then y = x * scale + shift. */
#define BN_CHANNEL(T, NAME, CLONES)                                                          \
    CLONES static void NAME(const T *X, T *Y, int64_t n, int64_t c, int64_t sp, int64_t ch,  \
                            const T *W, const T *B, T *M, T *R, double eps, bool training) { \
        if (training) {                                                                      \
            double s = 0, v = 0, cnt = (double)(n * sp);                                     \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T *xp = X + (i * c + ch) * sp;                                         \
                T a = 0;                                                                     \
                _Pragma("omp simd reduction(+ : a)")                                         \
                for (int64_t k = 0; k < sp; k++) a += xp[k];                                 \
                s += a;                                                                      \
            }                                                                                \
            double mu = s / cnt;                                                             \
            const T mu_t = (T)mu;                                                            \
            for (int64_t i = 0; i < n; i++) {                                                \
                const T *xp = X + (i * c + ch) * sp;                                         \
                T a = 0;                                                                     \
                _Pragma("omp simd reduction(+ : a)")                                         \
                for (int64_t k = 0; k < sp; k++) { T d = xp[k] - mu_t; a += d * d; }         \
                v += a;                                                                      \
            }                                                                                \
            M[ch] = (T)mu;                                                                   \
            R[ch] = (T)(1.0 / sqrt(v / cnt + eps));                                          \
        }                                                                                    \
        T mu = M[ch], scale = R[ch] * (W ? W[ch] : (T)1), shift = (B ? B[ch] : (T)0) - mu * scale; \
        for (int64_t i = 0; i < n; i++) {                                                    \
            const T *xp = X + (i * c + ch) * sp;                                             \
            T *yp = Y + (i * c + ch) * sp;                                                   \
            _Pragma("omp simd")                                                              \
            for (int64_t k = 0; k < sp; k++) yp[k] = xp[k] * scale + shift;                  \
        }                                                                                    \
    }
BN_CHANNEL(float, bn_channel_f32, ND_ISA_CLONES)
BN_CHANNEL(double, bn_channel_f64, )

#define BN_CHANNELS(T, CHANNEL)                                                              \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(x);                                                   \
        const T *W = w ? (const T *)nd_ptr(w) : NULL, *B = b ? (const T *)nd_ptr(b) : NULL;  \
        T *Y = (T *)nd_ptr(y), *M = (T *)nd_ptr(mean), *R = (T *)nd_ptr(rstd);               \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n * c * sp >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t ch = 0; ch < c; ch++) CHANNEL(X, Y, n, c, sp, ch, W, B, M, R, eps, training); \
    } while (0)

nd_status nd_cpu_batch_norm(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps, bool training) {
    int64_t n = x->shape[0], c = x->shape[1], sp = 1;
    for (int i = 2; i < x->ndim; i++) sp *= x->shape[i];
    if (n * c * sp == 0) return ND_OK;
    if (sp < BN_SLAB_MAX_SP) return nd_cpu_batch_norm_slab(y, mean, rstd, x, w, b, eps, training);
    if (x->dtype == ND_FLOAT32) BN_CHANNELS(float, bn_channel_f32);
    else BN_CHANNELS(double, bn_channel_f64);
    return ND_OK;
}

#define BN_BACKWARD_CHANNEL(T, NAME, CLONES)                                                 \
    CLONES static void NAME(const T *X, const T *G, int64_t n, int64_t c, int64_t sp,        \
                            int64_t ch, const T *W, const T *M, const T *R, T *DX, T *DW,   \
                            T *DB, bool training) {                                          \
        const T mu = M[ch], rs = R[ch];                                                      \
        double sg = 0, sgx = 0;                                                              \
        for (int64_t i = 0; i < n; i++) {                                                    \
            const T *xp = X + (i * c + ch) * sp, *gp = G + (i * c + ch) * sp;                \
            T a = 0, b = 0;                                                                  \
            _Pragma("omp simd reduction(+ : a, b)")                                          \
            for (int64_t k = 0; k < sp; k++) {                                               \
                a += gp[k];                                                                  \
                b += gp[k] * (xp[k] - mu);                                                   \
            }                                                                                \
            sg += a;                                                                         \
            sgx += b;                                                                        \
        }                                                                                    \
        sgx *= rs;                                                                           \
        if (DW) DW[ch] = (T)sgx;                                                             \
        if (DB) DB[ch] = (T)sg;                                                              \
        if (!DX) return;                                                                     \
        const double cnt = (double)(n * sp), wv = W ? W[ch] : 1.0;                           \
        /* dx = k1 * g - k2 * (x - mu) - k3 (training), k1 * g (evaluation) */              \
        const T k1 = (T)(rs * wv);                                                           \
        const T k2 = training ? (T)(rs * wv * rs * sgx / cnt) : (T)0;                        \
        const T k3 = training ? (T)(rs * wv * sg / cnt) : (T)0;                              \
        for (int64_t i = 0; i < n; i++) {                                                    \
            const T *xp = X + (i * c + ch) * sp, *gp = G + (i * c + ch) * sp;                \
            T *dp = DX + (i * c + ch) * sp;                                                  \
            _Pragma("omp simd")                                                              \
            for (int64_t k = 0; k < sp; k++) dp[k] = k1 * gp[k] - k2 * (xp[k] - mu) - k3;    \
        }                                                                                    \
    }
BN_BACKWARD_CHANNEL(float, bn_backward_channel_f32, ND_ISA_CLONES)
BN_BACKWARD_CHANNEL(double, bn_backward_channel_f64, )

/* Per channel ch, over its n * sp values: sg = sum(g), sgx = sum(g * xh)
 * with xh = (x - mean) * rstd; then dx = rstd * w * (g - sg/cnt - xh *
 * sgx/cnt) when training (the batch statistics depend on x), or g * rstd * w
 * in evaluation; dw = sgx, db = sg. Sums in double, row by row (each row's
 * partial sum vectorised in T). */
#define BN_BACKWARD(T, CHANNEL)                                                              \
    do {                                                                                     \
        const T *X = (const T *)nd_ptr(x), *G = (const T *)nd_ptr(g);                        \
        const T *W = w ? (const T *)nd_ptr(w) : NULL;                                        \
        const T *M = (const T *)nd_ptr(mean), *R = (const T *)nd_ptr(rstd);                  \
        T *DX = dx ? (T *)nd_ptr(dx) : NULL, *DW = dw ? (T *)nd_ptr(dw) : NULL;              \
        T *DB = db ? (T *)nd_ptr(db) : NULL;                                                 \
        _Pragma("omp parallel for num_threads(nd_cpu_threads()) if (n * c * sp >= ND_PARALLEL_THRESHOLD) schedule(static)") \
        for (int64_t ch = 0; ch < c; ch++)                                                   \
            CHANNEL(X, G, n, c, sp, ch, W, M, R, DX, DW, DB, training);                      \
    } while (0)

nd_status nd_cpu_batch_norm_backward(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd, bool training) {
    int64_t n = x->shape[0], c = x->shape[1], sp = 1;
    for (int i = 2; i < x->ndim; i++) sp *= x->shape[i];
    if (c == 0) return ND_OK;
    if (x->dtype != ND_FLOAT32 && x->dtype != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "batch_norm: no cpu kernel for %s", nd_dtype_name(x->dtype));
    if (n > 0 && sp > 0 && sp < BN_SLAB_MAX_SP)
        return nd_cpu_batch_norm_backward_slab(dx, dw, db, g, x, w, mean, rstd, training);
    if (x->dtype == ND_FLOAT32) BN_BACKWARD(float, bn_backward_channel_f32);
    else if (x->dtype == ND_FLOAT64) BN_BACKWARD(double, bn_backward_channel_f64);
    else return nd_fail(ND_ERR_DTYPE, "batch_norm: no cpu kernel for %s", nd_dtype_name(x->dtype));
    return ND_OK;
}
