/* ocl_rnn.c - the LSTM and GRU cells' kernels (kernels/rnn.cl): one launch
 * forward and one backward where the composed ops made about a dozen each. */
#include "ocl_kernels.h"

/* t's buffer, element offset and row stride from argument *a on (NULL:
 * dflt's buffer, for a kernel that does not touch it); *a moves past them */
static cl_int set_rows2(cl_kernel k, cl_uint *a, const nd_tensor *t, const nd_tensor *dflt) {
    cl_mem m = ocl_mem(t ? t : dflt);
    cl_long off = t ? t->offset : 0, s = t ? t->strides[0] : 0;
    cl_int e = OCL_ARG(k, *a, m) | OCL_ARG(k, *a + 1, off) | OCL_ARG(k, *a + 2, s);
    *a += 3;
    return e;
}

/* has (t != NULL), then t's rows (dflt's buffer when NULL) */
static cl_int set_opt_rows(cl_kernel k, cl_uint *a, const nd_tensor *t, const nd_tensor *dflt) {
    cl_int has = t != NULL, e = OCL_ARG(k, *a, has);
    *a += 1;
    return e | set_rows2(k, a, t, dflt);
}

/* One launch of kernel kname of op over the B x H units of state (its
 * dtype the kernel's), with the arguments n, H and then, in order, the
 * rows of the nr tensors of req (never NULL), each after its flag, of
 * the nopt tensors of opt (NULL: absent), and the nflags ints of flags. */
static nd_status launch_cell(const char *op, const char *kname, const nd_tensor *state,
                             const nd_tensor *const *req, int nr, const nd_tensor *const *opt, int nopt,
                             const cl_int *flags, int nflags) {
    ocl_device *d = ocl_dev(state);
    const nd_dtype dt = state->dtype;
    const int64_t n = state->shape[0] * state->shape[1];
    if (n == 0) return ND_OK;
    if (dt != ND_FLOAT32 && dt != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "%s: expected float32 or float64 on OpenCL, got %s", op, nd_dtype_name(dt));
    ND_TRY(ocl_check_dtype(d, dt, op));
    char defs[128];
    ocl_dtype_defines(dt, defs, sizeof defs);
    cl_kernel k;
    ND_TRY(ocl_kernel(d, "rnn", defs, kname, &k));
    cl_long nn = n, H = state->shape[1];
    cl_uint a = 2;
    cl_int e = OCL_ARG(k, 0, nn) | OCL_ARG(k, 1, H);
    for (int i = 0; i < nr; i++) e |= set_rows2(k, &a, req[i], NULL);
    for (int i = 0; i < nopt; i++) e |= set_opt_rows(k, &a, opt[i], state);
    for (int i = 0; i < nflags; i++) e |= OCL_ARG(k, a++, flags[i]);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return ocl_launch_1d(d, k, op, n);
}

nd_status ocl_lstm_cell(nd_tensor *h, nd_tensor *c2, const nd_tensor *xw, const nd_tensor *hw,
                        const nd_tensor *c) {
    const nd_tensor *req[4] = {xw, c, h, c2}, *opt[1] = {hw};
    return launch_cell("lstm_cell", "lstm_cell_fwd", c, req, 4, opt, 1, NULL, 0);
}

nd_status ocl_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *gh, const nd_tensor *gc,
                                 const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                 const nd_tensor *c2) {
    if (!dgates && !dc) return ND_OK;
    const nd_tensor *req[5] = {gh, gc, xw, c, c2}, *opt[3] = {hw, dgates, dc};
    return launch_cell("lstm_cell", "lstm_cell_bwd", c, req, 5, opt, 3, NULL, 0);
}

nd_status ocl_gru_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h) {
    const nd_tensor *req[4] = {xw, hw, h, out};
    return launch_cell("gru_cell", "gru_cell_fwd", h, req, 4, NULL, 0, NULL, 0);
}

nd_status ocl_gru_cell_backward(nd_tensor *dxw, nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, bool dh_add) {
    if (!dxw && !dhw && !dh) return ND_OK;
    const nd_tensor *req[4] = {g, xw, hw, h}, *opt[3] = {dxw, dhw, dh};
    const cl_int flags[1] = {dh_add};
    return launch_cell("gru_cell", "gru_cell_bwd", h, req, 4, opt, 3, flags, 1);
}
