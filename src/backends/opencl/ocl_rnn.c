/* ocl_rnn.c - the LSTM cell's kernels (kernels/rnn.cl): one launch forward
 * and one backward where the composed ops made about a dozen each. */
#include "ocl_kernels.h"

static nd_status rnn_kernel(ocl_device *d, nd_dtype dt, const char *kname, cl_kernel *k) {
    if (dt != ND_FLOAT32 && dt != ND_FLOAT64)
        return nd_fail(ND_ERR_DTYPE, "lstm_cell: expected float32 or float64 on OpenCL, got %s",
                       nd_dtype_name(dt));
    ND_TRY(ocl_check_dtype(d, dt, "lstm_cell"));
    char defs[128];
    ocl_dtype_defines(dt, defs, sizeof defs);
    return ocl_kernel(d, "rnn", defs, kname, k);
}

/* t's buffer, element offset and row stride from argument *a on (NULL:
 * dflt's buffer, for a kernel that does not touch it); *a moves past them */
static cl_int set_rows2(cl_kernel k, cl_uint *a, const nd_tensor *t, const nd_tensor *dflt) {
    cl_mem m = ocl_mem(t ? t : dflt);
    cl_long off = t ? t->offset : 0, s = t ? t->strides[0] : 0;
    cl_int e = OCL_ARG(k, *a, m) | OCL_ARG(k, *a + 1, off) | OCL_ARG(k, *a + 2, s);
    *a += 3;
    return e;
}

/* xw's rows, then has_hw and hw's (xw's when there is none) */
static cl_int set_gates(cl_kernel k, cl_uint *a, const nd_tensor *xw, const nd_tensor *hw) {
    cl_int e = set_rows2(k, a, xw, NULL), has = hw != NULL;
    e |= OCL_ARG(k, *a, has);
    *a += 1;
    return e | set_rows2(k, a, hw, xw);
}

nd_status ocl_lstm_cell(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c) {
    const char *op = "lstm_cell";
    ocl_device *d = ocl_dev(c);
    const int64_t n = c->shape[0] * c->shape[1];
    if (n == 0) return ND_OK;
    cl_kernel k;
    ND_TRY(rnn_kernel(d, c->dtype, "lstm_cell_fwd", &k));
    cl_long nn = n, H = c->shape[1];
    cl_uint a = 2;
    cl_int e = OCL_ARG(k, 0, nn) | OCL_ARG(k, 1, H);
    e |= set_gates(k, &a, xw, hw);
    e |= set_rows2(k, &a, c, NULL) | set_rows2(k, &a, out, NULL);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return ocl_launch_1d(d, k, op, n);
}

nd_status ocl_lstm_cell_backward(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *g,
                                 const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c,
                                 const nd_tensor *out) {
    const char *op = "lstm_cell";
    ocl_device *d = ocl_dev(c);
    const int64_t n = c->shape[0] * c->shape[1];
    if (n == 0 || (!dgates && !dc)) return ND_OK;
    cl_kernel k;
    ND_TRY(rnn_kernel(d, c->dtype, "lstm_cell_bwd", &k));
    cl_long nn = n, H = c->shape[1];
    cl_int hda = dgates != NULL, hdc = dc != NULL;
    cl_uint a = 2;
    cl_int e = OCL_ARG(k, 0, nn) | OCL_ARG(k, 1, H);
    e |= set_rows2(k, &a, g, NULL);
    e |= set_gates(k, &a, xw, hw);
    e |= set_rows2(k, &a, c, NULL) | set_rows2(k, &a, out, NULL);
    e |= OCL_ARG(k, a, hda);
    a++;
    e |= set_rows2(k, &a, dgates, c) | OCL_ARG(k, a, hdc);
    a++;
    e |= set_rows2(k, &a, dc, c);
    if (e != CL_SUCCESS) return ocl_fail(e, op, "setting kernel arguments", d);
    return ocl_launch_1d(d, k, op, n);
}
