/* cpu_rnn_cell.c - the LSTM cell's gates and state update, forward and
 * backward (backend.h's lstm_cell and lstm_cell_backward; the formulas are
 * in ops/op_rnn_cell.c).
 *
 * Row by row: the activations of a row's gates go to a buffer through the
 * same functions the composed ops use (float32: cpu_vmath.h's vectorised
 * sigmoid and tanh; float64: the registry's expressions), and every product
 * and sum is done in the composed ops' order, so results are theirs bit for
 * bit. The backward makes the activations again from the gates rather than
 * keeping four (B, H) tensors per step. */
#include <math.h>
#include <stdlib.h>
#include "cpu_kernels.h"
#include "cpu_vmath.h"

/* the activations of one row of gates: i, f (sigmoid), g (tanh), o
 * (sigmoid) into act (4H), and tanh(c') into tc (H) */
static void activate_f32(float *act, const float *a, int64_t H) {
    nd_cpu_vsigmoid_f32(act, a, 2 * H);
    nd_cpu_vtanh_f32(act + 2 * H, a + 2 * H, H);
    nd_cpu_vsigmoid_f32(act + 3 * H, a + 3 * H, H);
}

static double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); } /* (the registry's) */

static void activate_f64(double *act, const double *a, int64_t H) {
    for (int64_t j = 0; j < 2 * H; j++) act[j] = sigmoid_f64(a[j]);
    for (int64_t j = 2 * H; j < 3 * H; j++) act[j] = tanh(a[j]);
    for (int64_t j = 3 * H; j < 4 * H; j++) act[j] = sigmoid_f64(a[j]);
}

static void tanh_f32(float *o, const float *x, int64_t n) { nd_cpu_vtanh_f32(o, x, n); }
static void tanh_f64(double *o, const double *x, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = tanh(x[j]);
}

/* One dtype's kernels: T the element type, SFX the helpers' suffix. A
 * row's gates are xw's row, or xw's plus hw's in a buffer (as the add). */
#define LSTM_CELL_KERNELS(T, SFX)                                                                  \
    static const T *gates_##SFX(T *sum, const nd_tensor *xw, const nd_tensor *hw, int64_t b,     \
                                int64_t n) {                                                      \
        const T *x = (const T *)nd_ptr(xw) + b * xw->strides[0];                                  \
        if (!hw) return x;                                                                        \
        const T *h = (const T *)nd_ptr(hw) + b * hw->strides[0];                                  \
        for (int64_t j = 0; j < n; j++) sum[j] = x[j] + h[j];                                     \
        return sum;                                                                               \
    }                                                                                             \
                                                                                                  \
    static nd_status forward_##SFX(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw,      \
                                   const nd_tensor *c) {                                          \
        const int64_t B = c->shape[0], H = c->shape[1];                                          \
        const int64_t cs = c->strides[0], os = out->strides[0];                                  \
        const T *C = (const T *)nd_ptr(c);                                                        \
        T *O = (T *)nd_ptr(out);                                                                  \
        int failed = 0;                                                                           \
        _Pragma("omp parallel num_threads(nd_cpu_threads()) if (B > 1 && B * H * 16 >= ND_PARALLEL_THRESHOLD)") \
        {                                                                                         \
            T *act = malloc(sizeof(T) * (size_t)(8 * H + 1));                                     \
            if (!act) {                                                                           \
                _Pragma("omp atomic write") failed = 1;                                           \
            }                                                                                     \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < B; b++) {                 \
                if (!act) continue;                                                               \
                activate_##SFX(act, gates_##SFX(act + 4 * H, xw, hw, b, 4 * H), H);              \
                const T *i = act, *f = act + H, *g = act + 2 * H, *o = act + 3 * H;               \
                const T *cr = C + b * cs;                                                         \
                T *h = O + b * os, *c2 = h + H;                                                   \
                for (int64_t j = 0; j < H; j++) c2[j] = f[j] * cr[j] + i[j] * g[j];               \
                tanh_##SFX(h, c2, H);                                                             \
                for (int64_t j = 0; j < H; j++) h[j] = o[j] * h[j];                               \
            }                                                                                     \
            free(act);                                                                            \
        }                                                                                         \
        if (failed) return nd_fail(ND_ERR_MEMORY, "lstm_cell: out of memory for %lld activations", \
                                   (long long)(8 * H));                                           \
        return ND_OK;                                                                             \
    }                                                                                             \
                                                                                                  \
    static nd_status backward_##SFX(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *g,         \
                                    const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c, \
                                    const nd_tensor *out) {                                       \
        const int64_t B = c->shape[0], H = c->shape[1];                                          \
        const T *C = (const T *)nd_ptr(c);                                                        \
        const T *G = (const T *)nd_ptr(g), *O = (const T *)nd_ptr(out);                          \
        T *DA = dgates ? (T *)nd_ptr(dgates) : NULL, *DC = dc ? (T *)nd_ptr(dc) : NULL;           \
        int failed = 0;                                                                           \
        _Pragma("omp parallel num_threads(nd_cpu_threads()) if (B > 1 && B * H * 32 >= ND_PARALLEL_THRESHOLD)") \
        {                                                                                         \
            T *act = malloc(sizeof(T) * (size_t)(9 * H + 1));                                     \
            if (!act) {                                                                           \
                _Pragma("omp atomic write") failed = 1;                                           \
            }                                                                                     \
            _Pragma("omp for schedule(static)") for (int64_t b = 0; b < B; b++) {                 \
                if (!act) continue;                                                               \
                activate_##SFX(act, gates_##SFX(act + 5 * H, xw, hw, b, 4 * H), H);              \
                const T *i = act, *f = act + H, *gg = act + 2 * H, *o = act + 3 * H;              \
                T *tc = act + 4 * H;                                                              \
                const T *orow = O + b * out->strides[0], *cr = C + b * c->strides[0];             \
                tanh_##SFX(tc, orow + H, H);                                                      \
                const T *dh = G + b * g->strides[0], *dcn = dh + H;                               \
                T *da = DA ? DA + b * dgates->strides[0] : NULL;                                  \
                T *dcr = DC ? DC + b * dc->strides[0] : NULL;                                     \
                for (int64_t j = 0; j < H; j++) {                                                 \
                    const T dc2 = dcn[j] + (dh[j] * o[j]) * ((T)1 - tc[j] * tc[j]);               \
                    if (da) {                                                                     \
                        da[j] = (dc2 * gg[j]) * (i[j] * ((T)1 - i[j]));                           \
                        da[H + j] = (dc2 * cr[j]) * (f[j] * ((T)1 - f[j]));                       \
                        da[2 * H + j] = (dc2 * i[j]) * ((T)1 - gg[j] * gg[j]);                    \
                        da[3 * H + j] = (dh[j] * tc[j]) * (o[j] * ((T)1 - o[j]));                 \
                    }                                                                             \
                    if (dcr) dcr[j] = dc2 * f[j];                                                 \
                }                                                                                 \
            }                                                                                     \
            free(act);                                                                            \
        }                                                                                         \
        if (failed) return nd_fail(ND_ERR_MEMORY, "lstm_cell: out of memory for %lld activations", \
                                   (long long)(9 * H));                                           \
        return ND_OK;                                                                             \
    }

LSTM_CELL_KERNELS(float, f32)
LSTM_CELL_KERNELS(double, f64)

nd_status nd_cpu_lstm_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw,
                           const nd_tensor *c) {
    if (c->dtype == ND_FLOAT32) return forward_f32(out, xw, hw, c);
    if (c->dtype == ND_FLOAT64) return forward_f64(out, xw, hw, c);
    return nd_fail(ND_ERR_DTYPE, "lstm_cell: no cpu kernel for %s", nd_dtype_name(c->dtype));
}

nd_status nd_cpu_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *g,
                                    const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                    const nd_tensor *out) {
    if (c->dtype == ND_FLOAT32) return backward_f32(dgates, dc, g, xw, hw, c, out);
    if (c->dtype == ND_FLOAT64) return backward_f64(dgates, dc, g, xw, hw, c, out);
    return nd_fail(ND_ERR_DTYPE, "lstm_cell: no cpu backward kernel for %s", nd_dtype_name(c->dtype));
}
