/* cpu_rnn_cell.c - the LSTM and GRU cells' gates and state updates, forward
 * and backward (backend.h's lstm_cell, gru_cell and their backwards; the
 * formulas are in ops/op_rnn_cell.c).
 *
 * Row by row: the activations of a row's gates go to a buffer through the
 * same functions the composed ops use (float32: cpu_vmath.h's vectorised
 * sigmoid and tanh; float64: the registry's expressions), and every product
 * and sum is done in the composed ops' order, so results are theirs bit for
 * bit (a zero gradient's sign aside: the composed ops' is -0 or +0 as the
 * engine put the gates' slices together, in place or added into zeros; the
 * kernels' is the product's, as nn.LSTM's and nn.GRU's composed steps
 * had). The backwards make the activations again from the gates rather
 * than keeping them per step. */
#include <math.h>
#include <stdlib.h>
#include "cpu_kernels.h"
#include "cpu_vmath.h"

/* A call's operands, for its row functions: outputs o[0..2], then what it
 * reads (NULL where the call has none) */
typedef struct {
    nd_tensor *o[3];
    const nd_tensor *g, *gc, *xw, *hw, *state, *c2;
    int64_t H;
    bool add_o2; /* o[2] += (the GRU's dh) rather than = */
} cell_call;

typedef void (*row_fn)(const cell_call *c, int64_t b, void *buf);

/* fn for every row b < B, the rows spread over the threads when there is
 * enough work (`work` operations a row), each thread with a buffer of
 * buf_elems elements of es bytes */
static nd_status each_row(const char *op, int64_t B, int64_t work, int64_t buf_elems, size_t es, row_fn fn,
                          const cell_call *c) {
    int failed = 0;
#pragma omp parallel num_threads(nd_cpu_threads()) if (B > 1 && B * work >= ND_PARALLEL_THRESHOLD)
    {
        void *buf = malloc(es * (size_t)(buf_elems + 1));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++)
            if (buf) fn(c, b, buf);
        free(buf);
    }
    if (failed) return nd_fail(ND_ERR_MEMORY, "%s: out of memory for %lld activations", op, (long long)buf_elems);
    return ND_OK;
}

/* row b of t (NULL: none), as T */
#define ROW(T, t, b) ((t) ? (T *)nd_ptr(t) + (b) * (t)->strides[0] : NULL)

static void sigmoid_f32(float *o, const float *x, int64_t n) { nd_cpu_vsigmoid_f32(o, x, n); }
static void tanh_f32(float *o, const float *x, int64_t n) { nd_cpu_vtanh_f32(o, x, n); }
static void sigmoid_f64(double *o, const double *x, int64_t n) { /* the registry's expression */
    for (int64_t j = 0; j < n; j++) o[j] = 1.0 / (1.0 + exp(-x[j]));
}
static void tanh_f64(double *o, const double *x, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = tanh(x[j]);
}

/* One dtype's row functions: T the element type, SFX the helpers' suffix. */
#define RNN_CELL_ROWS(T, SFX)                                                                      \
    /* the LSTM's activations of row b into act (4H: i, f, g, o), its gates                        \
     * xw's row or xw's plus hw's (as the add) made in sum (4H) */                                 \
    static void lstm_act_##SFX(const cell_call *c, int64_t b, T *act, T *sum) {                   \
        const int64_t H = c->H;                                                                   \
        const T *x = ROW(const T, c->xw, b), *h = ROW(const T, c->hw, b), *a = x;                  \
        if (h) {                                                                                  \
            for (int64_t j = 0; j < 4 * H; j++) sum[j] = x[j] + h[j];                             \
            a = sum;                                                                              \
        }                                                                                         \
        sigmoid_##SFX(act, a, 2 * H);                                                             \
        tanh_##SFX(act + 2 * H, a + 2 * H, H);                                                    \
        sigmoid_##SFX(act + 3 * H, a + 3 * H, H);                                                 \
    }                                                                                             \
    static void lstm_fwd_##SFX(const cell_call *c, int64_t b, void *buf) {                        \
        const int64_t H = c->H;                                                                   \
        T *act = buf;                                                                             \
        lstm_act_##SFX(c, b, act, act + 4 * H);                                                   \
        const T *i = act, *f = act + H, *g = act + 2 * H, *o = act + 3 * H;                       \
        const T *cr = ROW(const T, c->state, b);                                                  \
        T *h = ROW(T, c->o[0], b), *c2 = ROW(T, c->o[1], b);                                      \
        for (int64_t j = 0; j < H; j++) c2[j] = f[j] * cr[j] + i[j] * g[j];                       \
        tanh_##SFX(h, c2, H);                                                                     \
        for (int64_t j = 0; j < H; j++) h[j] = o[j] * h[j];                                       \
    }                                                                                             \
    static void lstm_bwd_##SFX(const cell_call *c, int64_t b, void *buf) {                        \
        const int64_t H = c->H;                                                                   \
        T *act = buf, *tc = act + 4 * H;                                                          \
        lstm_act_##SFX(c, b, act, act + 5 * H);                                                   \
        const T *i = act, *f = act + H, *gg = act + 2 * H, *o = act + 3 * H;                      \
        const T *cr = ROW(const T, c->state, b), *dh = ROW(const T, c->g, b);                     \
        const T *dcn = ROW(const T, c->gc, b);                                                    \
        tanh_##SFX(tc, ROW(const T, c->c2, b), H);                                                \
        T *da = ROW(T, c->o[0], b), *dcr = ROW(T, c->o[1], b);                                    \
        for (int64_t j = 0; j < H; j++) {                                                         \
            const T dc2 = dcn[j] + (dh[j] * o[j]) * ((T)1 - tc[j] * tc[j]);                       \
            if (da) {                                                                             \
                da[j] = (dc2 * gg[j]) * (i[j] * ((T)1 - i[j]));                            \
                da[H + j] = (dc2 * cr[j]) * (f[j] * ((T)1 - f[j]));                        \
                da[2 * H + j] = (dc2 * i[j]) * ((T)1 - gg[j] * gg[j]);                     \
                da[3 * H + j] = (dh[j] * tc[j]) * (o[j] * ((T)1 - o[j]));                  \
            }                                                                                     \
            if (dcr) dcr[j] = dc2 * f[j];                                                         \
        }                                                                                         \
    }                                                                                             \
    /* the GRU's r, z, n of row b into act (3H), as the composed ops make them */                 \
    static void gru_act_##SFX(const cell_call *c, int64_t b, T *act) {                            \
        const int64_t H = c->H;                                                                   \
        const T *x = ROW(const T, c->xw, b), *hw = ROW(const T, c->hw, b);                        \
        for (int64_t j = 0; j < 2 * H; j++) act[j] = x[j] + hw[j];                                \
        sigmoid_##SFX(act, act, 2 * H);                                                           \
        T *n = act + 2 * H;                                                                       \
        for (int64_t j = 0; j < H; j++) n[j] = x[2 * H + j] + act[j] * hw[2 * H + j];             \
        tanh_##SFX(n, n, H);                                                                      \
    }                                                                                             \
    static void gru_fwd_##SFX(const cell_call *c, int64_t b, void *buf) {                         \
        const int64_t H = c->H;                                                                   \
        T *act = buf;                                                                             \
        gru_act_##SFX(c, b, act);                                                                 \
        const T *z = act + H, *n = act + 2 * H, *hr = ROW(const T, c->state, b);                  \
        T *o = ROW(T, c->o[0], b);                                                                \
        for (int64_t j = 0; j < H; j++) o[j] = ((T)1 - z[j]) * n[j] + z[j] * hr[j];               \
    }                                                                                             \
    static void gru_bwd_##SFX(const cell_call *c, int64_t b, void *buf) {                         \
        const int64_t H = c->H;                                                                   \
        T *act = buf;                                                                             \
        gru_act_##SFX(c, b, act);                                                                 \
        const T *r = act, *z = act + H, *n = act + 2 * H, *hwr = ROW(const T, c->hw, b);          \
        const T *gr = ROW(const T, c->g, b), *hr = ROW(const T, c->state, b);                     \
        T *dx = ROW(T, c->o[0], b), *dhh = ROW(T, c->o[1], b), *ds = ROW(T, c->o[2], b);          \
        for (int64_t j = 0; j < H; j++) {                                                         \
            const T dn = gr[j] * ((T)1 - z[j]), dz = gr[j] * hr[j] - gr[j] * n[j];                \
            const T dpn = dn * ((T)1 - n[j] * n[j]), dpz = dz * (z[j] * ((T)1 - z[j]));           \
            const T dpr = (dpn * hwr[2 * H + j]) * (r[j] * ((T)1 - r[j]));                        \
            if (dx) dx[j] = dpr, dx[H + j] = dpz, dx[2 * H + j] = dpn;       \
            if (dhh) dhh[j] = dpr, dhh[H + j] = dpz, dhh[2 * H + j] = dpn * r[j]; \
            if (ds) ds[j] = c->add_o2 ? ds[j] + gr[j] * z[j] : gr[j] * z[j];                      \
        }                                                                                         \
    }

RNN_CELL_ROWS(float, f32)
RNN_CELL_ROWS(double, f64)

/* fn32 or fn64 over every row of a call (the state's dtype picks) */
static nd_status run_rows(const char *op, const cell_call *c, int64_t work, int64_t buf_elems, row_fn f32,
                          row_fn f64) {
    const nd_dtype dt = c->state->dtype;
    if (dt != ND_FLOAT32 && dt != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: no cpu kernel for %s", op, nd_dtype_name(dt));
    return each_row(op, c->state->shape[0], work, buf_elems, nd_dtype_size(dt), dt == ND_FLOAT32 ? f32 : f64, c);
}

nd_status nd_cpu_lstm_cell(nd_tensor *h, nd_tensor *c2, const nd_tensor *xw, const nd_tensor *hw,
                           const nd_tensor *c) {
    const int64_t H = c->shape[1];
    const cell_call cc = {.o = {h, c2}, .xw = xw, .hw = hw, .state = c, .H = H};
    return run_rows("lstm_cell", &cc, 16 * H, 8 * H, lstm_fwd_f32, lstm_fwd_f64);
}

nd_status nd_cpu_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *gh,
                                    const nd_tensor *gc, const nd_tensor *xw, const nd_tensor *hw,
                                    const nd_tensor *c, const nd_tensor *c2) {
    const int64_t H = c->shape[1];
    const cell_call cc = {.o = {dgates, dc}, .g = gh, .gc = gc, .xw = xw, .hw = hw, .state = c, .c2 = c2, .H = H};
    return run_rows("lstm_cell", &cc, 32 * H, 9 * H, lstm_bwd_f32, lstm_bwd_f64);
}

nd_status nd_cpu_gru_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h) {
    const int64_t H = h->shape[1];
    const cell_call cc = {.o = {out}, .xw = xw, .hw = hw, .state = h, .H = H};
    return run_rows("gru_cell", &cc, 16 * H, 3 * H, gru_fwd_f32, gru_fwd_f64);
}

nd_status nd_cpu_gru_cell_backward(nd_tensor *dxw, nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                   const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, bool dh_add) {
    const int64_t H = h->shape[1];
    const cell_call cc = {.o = {dxw, dhw, dh}, .g = g, .xw = xw, .hw = hw, .state = h, .H = H, .add_o2 = dh_add};
    return run_rows("gru_cell", &cc, 32 * H, 3 * H, gru_bwd_f32, gru_bwd_f64);
}
