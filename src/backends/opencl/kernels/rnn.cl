/* rnn.cl - the LSTM cell's gates and state update (backend.h's lstm_cell
 * and lstm_cell_backward; the formulas are in ops/op_rnn_cell.c), one
 * work-item per (row, unit). T is float or double; every operand is 2-D
 * with unit-stride rows and the row stride given, offsets in elements. A
 * gate is xw's plus hw's (has_hw) or xw's. The activations are the
 * registry's sigmoid and tanh expressions. */

inline T cell_sigmoid(T x) { return (T)1 / ((T)1 + exp(-x)); }

/* gate k's pre-activation of unit j: xw's, plus hw's when there is one */
inline T gate(__global const T *xr, __global const T *hr, int has_hw, long H, long j, int k) {
    return has_hw ? xr[k * H + j] + hr[k * H + j] : xr[k * H + j];
}

/* the LSTM's i, f, g, o of unit j of a row */
inline void lstm_act(__global const T *xr, __global const T *hr, int has_hw, long H, long j, T *i, T *f,
                     T *g, T *o) {
    *i = cell_sigmoid(gate(xr, hr, has_hw, H, j, 0));
    *f = cell_sigmoid(gate(xr, hr, has_hw, H, j, 1));
    *g = tanh(gate(xr, hr, has_hw, H, j, 2));
    *o = cell_sigmoid(gate(xr, hr, has_hw, H, j, 3));
}

__kernel void lstm_cell_fwd(long n, long H, __global const T *x, long xoff, long xs,
                            __global const T *c, long coff, long cs, __global T *h, long hoff, long hs2,
                            __global T *c2, long c2off, long c2s, int has_hw, __global const T *hw,
                            long hoff_w, long hs) {
    long id = get_global_id(0);
    if (id >= n) return;
    long b = id / H, j = id - b * H;
    T i, f, g, o;
    lstm_act(x + xoff + b * xs, hw + hoff_w + b * hs, has_hw, H, j, &i, &f, &g, &o);
    T cn = f * c[coff + b * cs + j] + i * g;
    c2[c2off + b * c2s + j] = cn;
    h[hoff + b * hs2 + j] = o * tanh(cn);
}

__kernel void lstm_cell_bwd(long n, long H, __global const T *gh, long ghoff, long ghs,
                            __global const T *gc, long gcoff, long gcs, __global const T *x, long xoff,
                            long xs, __global const T *c, long coff, long cs, __global const T *c2,
                            long c2off, long c2s, int has_hw, __global const T *hw, long hoff, long hs,
                            int has_da, __global T *da, long daoff, long das, int has_dc,
                            __global T *dc, long dcoff, long dcs) {
    long id = get_global_id(0);
    if (id >= n) return;
    long b = id / H, j = id - b * H;
    T i, f, gg, o;
    lstm_act(x + xoff + b * xs, hw + hoff + b * hs, has_hw, H, j, &i, &f, &gg, &o);
    T tc = tanh(c2[c2off + b * c2s + j]);
    T dh = gh[ghoff + b * ghs + j], dcn = gc[gcoff + b * gcs + j];
    T dc2 = dcn + (dh * o) * ((T)1 - tc * tc);
    if (has_da) {
        __global T *dr = da + daoff + b * das;
        dr[j] = (dc2 * gg) * (i * ((T)1 - i));
        dr[H + j] = (dc2 * c[coff + b * cs + j]) * (f * ((T)1 - f));
        dr[2 * H + j] = (dc2 * i) * ((T)1 - gg * gg);
        dr[3 * H + j] = (dh * tc) * (o * ((T)1 - o));
    }
    if (has_dc) dc[dcoff + b * dcs + j] = dc2 * f;
}

/* the GRU cell: r, z, n of unit j of a row */
inline void gru_act(__global const T *xr, __global const T *hr, long H, long j, T *r, T *z, T *n) {
    *r = cell_sigmoid(xr[j] + hr[j]);
    *z = cell_sigmoid(xr[H + j] + hr[H + j]);
    *n = tanh(xr[2 * H + j] + *r * hr[2 * H + j]);
}

__kernel void gru_cell_fwd(long n, long H, __global const T *x, long xoff, long xs,
                           __global const T *hw, long hoff, long hs, __global const T *h, long soff,
                           long ss, __global T *out, long ooff, long os) {
    long id = get_global_id(0);
    if (id >= n) return;
    long b = id / H, j = id - b * H;
    T r, z, nn;
    gru_act(x + xoff + b * xs, hw + hoff + b * hs, H, j, &r, &z, &nn);
    out[ooff + b * os + j] = ((T)1 - z) * nn + z * h[soff + b * ss + j];
}

__kernel void gru_cell_bwd(long n, long H, __global const T *g, long goff, long gs,
                           __global const T *x, long xoff, long xs, __global const T *hw, long hoff,
                           long hs, __global const T *h, long soff, long ss, int has_dx,
                           __global T *dx, long dxoff, long dxs, int has_dhw, __global T *dhw,
                           long dhoff, long dhs, int has_dh, __global T *dh, long dsoff, long dss,
                           int dh_add) {
    long id = get_global_id(0);
    if (id >= n) return;
    long b = id / H, j = id - b * H;
    __global const T *hr = hw + hoff + b * hs;
    T r, z, nn;
    gru_act(x + xoff + b * xs, hr, H, j, &r, &z, &nn);
    T gv = g[goff + b * gs + j], hv = h[soff + b * ss + j];
    T dn = gv * ((T)1 - z), dz = gv * hv - gv * nn;
    T dpn = dn * ((T)1 - nn * nn), dpz = dz * (z * ((T)1 - z));
    T dpr = (dpn * hr[2 * H + j]) * (r * ((T)1 - r));
    if (has_dx) {
        __global T *d = dx + dxoff + b * dxs;
        d[j] = dpr, d[H + j] = dpz, d[2 * H + j] = dpn;
    }
    if (has_dhw) {
        __global T *d = dhw + dhoff + b * dhs;
        d[j] = dpr, d[H + j] = dpz, d[2 * H + j] = dpn * r;
    }
    if (has_dh) { /* dh_add: into the state gradient already there (nn.GRU's layer) */
        __global T *d = dh + dsoff + b * dss + j;
        *d = dh_add ? *d + gv * z : gv * z;
    }
}
