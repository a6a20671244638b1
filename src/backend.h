/* backend.h - the function table each device implements.
 *
 * Ops (src/ops) do every shape, dtype and device check, allocate outputs and
 * then call one of these. A backend may assume:
 *   - every tensor argument is on its device;
 *   - elementwise operands are already broadcast (expanded) to the output's
 *     shape and cast to the compute dtype the op chose;
 *   - outputs are freshly allocated and contiguous unless stated otherwise.
 * A missing entry (NULL) makes the op fail with an error naming the op and
 * the device: never a silent fallback to another device. */
#ifndef ND_BACKEND_H
#define ND_BACKEND_H

#include "tensor.h"

typedef enum { ND_RANDOM_UNIFORM, ND_RANDOM_NORMAL, ND_RANDOM_INT, ND_RANDOM_BERNOULLI } nd_random_kind;

/* Geometry of im2col/col2im: a kh x kw kernel with stride, top/left padding
 * and dilation, evaluated at an lh x lw grid of positions (for conv2d the
 * output size; for conv_transpose2d the input size). */
typedef struct {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t lh, lw;
} nd_conv_geom;

/* Geometry of 2-D pooling on (H, W) planes, output oh x ow (already
 * computed, ceil_mode included). Window along h for output row o: rows
 * o*sh - ph + i*dh (i < kh) inside the input; avg pools (dh = dw = 1) divide
 * by the window clipped to the padded input (count_include_pad) or to the
 * input. adaptive: rows floor(o*H/oh) .. ceil((o+1)*H/oh) - 1, the k/s/p/d
 * fields are unused. */
typedef struct {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t oh, ow;
    bool count_include_pad;
    bool adaptive;
} nd_pool_geom;

/* ---- dense linear algebra (nd.linalg; ops/op_linalg.c) ----
 * One linalg call factors `batch` matrices: in[0] is A (batch, m, n) and,
 * for SOLVE and LSTSQ, in[1] is B (batch, m, k); both on the cpu, contiguous
 * (row-major), one float dtype. Outputs are fresh, contiguous, of A's dtype:
 *   INV       out[0] A^-1 (batch, n, n)
 *   SOLVE     out[0] X with A X = B (batch, n, k)
 *   DET       out[0] det, out[1] sign, out[2] log|det| (batch); a singular
 *             matrix gives 0, 0, -inf (not a failure)
 *   CHOLESKY  out[0] L, lower (upper: U = L^T, from A's upper triangle) (batch, n, n)
 *   QR        out[0] Q (batch, m, full ? m : min(m, n)) or NULL (R only),
 *             out[1] R (batch, full ? m : min(m, n), n)
 *   SVD       out[0] U (batch, m, full ? m : min), out[1] S (batch, min),
 *             out[2] Vh (batch, full ? n : min, n); U and Vh NULL: S only
 *   EIGH      out[0] eigenvalues, ascending (batch, n), out[1] eigenvectors
 *             as columns (batch, n, n) or NULL; reads A's lower triangle
 *             (upper: its upper one)
 *   LSTSQ     out[0] X (batch, n, k), the minimum-norm least-squares
 *             solution (SVD, singular values below rcond * the largest
 *             count as 0), out[1] the squared residual norms of each column
 *             (batch, k) when m > n (NULL otherwise), out[2] rank (batch,
 *             int64), out[3] singular values (batch, min)
 * info[b] (host memory, batch entries) is LAPACK's info for matrix b: 0
 * fine, > 0 singular (INV, SOLVE: the 1-based zero pivot), not positive-
 * definite (CHOLESKY: the order of the failing minor) or no convergence
 * (SVD, EIGH, LSTSQ), ND_LINALG_NONFINITE when SVD, EIGH or LSTSQ found a
 * NaN or infinity in the input (LAPACK is not called on it). The status is
 * the call's own failure (memory, sizes beyond LAPACK's 32-bit integers). */
typedef enum {
    ND_LINALG_INV, ND_LINALG_SOLVE, ND_LINALG_DET, ND_LINALG_CHOLESKY, ND_LINALG_QR,
    ND_LINALG_SVD, ND_LINALG_EIGH, ND_LINALG_LSTSQ
} nd_linalg_kind;
#define ND_LINALG_NONFINITE (-1)
typedef struct {
    nd_linalg_kind kind;
    const char *op; /* the name errors start with ("linalg.inv") */
    bool upper;    /* CHOLESKY, EIGH */
    bool full;     /* QR: mode "complete"; SVD: full_matrices */
    double rcond;  /* LSTSQ (< 0: the dtype's machine epsilon, as LAPACK) */
    int64_t *info;
} nd_linalg_args;

/* ---- fused elementwise programs (nd.compile's fuse pass, ops/graph_fuse.c) ----
 * A run of elementwise kernels over one shape, done as one pass: for each
 * element (row-major over the shape), the steps in order. A step reads up to
 * three values and makes one; value v < nt is element i of tensor v (all nt
 * tensors have the shape, any strides, broadcast ones 0-strided), value
 * nt + j is step j's result. A step with store >= 0 writes its result into
 * tensor `store` (the last write of that tensor in the run); the other
 * results are never stored. Each step computes exactly what the unfused
 * kernel (unary, binary, binary_scalar, where, clamp, relu_backward, copy) would:
 * a fused run is bit for bit the unfused one. */
#define ND_EW_MAX_TENSORS 16
#define ND_EW_MAX_STEPS 48
#define ND_EW_SCALAR (-1) /* an operand that is the step's scalar */
typedef enum { ND_EW_UNARY, ND_EW_BINARY, ND_EW_WHERE, ND_EW_CLAMP, ND_EW_RELU_BACKWARD, ND_EW_COPY } nd_ew_kind;
typedef struct {
    uint8_t kind;        /* nd_ew_kind */
    uint8_t op;          /* nd_unary_op (UNARY) or nd_binary_op (BINARY) */
    uint8_t dtype;       /* the result's nd_dtype: the program's, or bool for comparisons */
    int8_t store;        /* the tensor it is stored into, -1: none */
    int16_t in[3];       /* UNARY, CLAMP, COPY: x; BINARY: a, b (one may be ND_EW_SCALAR);
                          * WHERE: cond (bool), a, b; RELU_BACKWARD: g, y */
    double lo, hi;       /* CLAMP's bounds (NaN: none), as the clamp entry takes them */
    _Alignas(8) unsigned char scalar[8]; /* BINARY's scalar, one element of the program's dtype */
} nd_ew_step;
/* How many of in[] a step reads. */
static inline int nd_ew_inputs(const nd_ew_step *s) {
    return s->kind == ND_EW_UNARY || s->kind == ND_EW_CLAMP || s->kind == ND_EW_COPY ? 1
           : s->kind == ND_EW_WHERE ? 3 : 2;
}
typedef struct nd_ew_program {
    int nt, nsteps;
    nd_dtype dtype;       /* every operand's and result's (bool: where's conditions, comparisons) */
    nd_ew_step steps[ND_EW_MAX_STEPS];
    /* Chosen by nd.compile's tuner (graph_tune.c), 0 / false: the backend's
     * default. tune_size: elements per tile (CPU) or the work-group size
     * (OpenCL); tune_serial: one thread (CPU). */
    int32_t tune_size;
    bool tune_serial;
    void *backend_cache;  /* what the backend prepared at the first run (OpenCL: the kernel,
                           * owned by the device's program cache), never freed with it */
    uint64_t backend_tag; /* ... and the backend's note on it (OpenCL: the cache's generation) */
    char desc[128];       /* the ops, "mul+add+sigmoid" (introspection, profiler rows) */
} nd_ew_program;

/* ---- row kernels with a fused prologue (nd.compile's fuse pass) ----
 * A row op whose input x is never stored: each row of x is made by an
 * elementwise program (as above; every tensor of it has x's shape) into a
 * buffer, and the row op reads it there. Tensor `x_slot` of the program is
 * x: it is NULL in ts, and the program's step that stores into it writes
 * the row buffer instead. Each row is the unfused kernel's own row, so the
 * results are bit for bit the unfused ones. */
typedef enum { ND_ROWS_SOFTMAX, ND_ROWS_LAYER_NORM } nd_rows_kind;
typedef struct {
    nd_rows_kind kind;
    bool log;              /* SOFTMAX: log_softmax */
    double eps;            /* LAYER_NORM */
    nd_tensor *y;          /* contiguous, x's shape; rows along its last dim */
    nd_tensor *mean, *rstd; /* LAYER_NORM: one per row */
    const nd_tensor *w, *b; /* LAYER_NORM: NULL or the last dim's */
} nd_rows_op;

/* The scalars of fused attention (the attention and attention_backward
 * entries): scores scaled by scale; causal: key j > query i masked
 * (top-left aligned); dropout_p > 0: each weight (b, i, j) - b the product's
 * index over B1 x B2, i the query, j the key - is kept when the uniform of
 * counter offset + (b L + i) S + j of the Philox stream keyed by seed (as
 * the random entry draws them: a float32 operand's 24 bits, a float64's 53)
 * is below 1 - dropout_p, and kept weights are scaled by 1 / (1 - p) in the
 * operand's dtype: F.dropout's mask on the (B1, B2, L, S) weights, drawn by
 * the kernel in place of the tensor. */
typedef struct {
    double scale;
    bool causal;
    double dropout_p;
    uint64_t seed, offset;
} nd_attention_args;

/* A GEMM's work split (backend.h gemm_hint); 0 in a field: the kernel's
 * own choice. */
typedef struct {
    int threads; /* at most this many threads */
    int mc;      /* rows of A per block (rounded to the kernel's tile rows) */
    int order;   /* 1: a B panel stays in cache while A's stream; 2: an A panel stays while an L2-sized block of B streams */
    int split;   /* 1: threads take blocks of rows only; 2: blocks of rows, each cut into one range of columns per thread */
} nd_gemm_hint;

typedef struct nd_backend {
    const char *name;
    /* ---- discovery (devices other than the cpu; device.c) ----
     * count: how many devices of this type (0 when none or the runtime
     * failed, then unavailable_reason says why); info: one device's
     * description; default_device: the index "opencl" without ":N" means. */
    int (*device_count)(void);
    const char *(*unavailable_reason)(void);
    nd_status (*device_info)(int index, nd_opencl_info *out);
    nd_status (*default_device)(int *index);
    /* kernels launched so far on this backend's devices (NULL: not counted;
     * nd.opencl.launches(), and nd.compile's launch figures) */
    uint64_t (*launch_count)(void);
    /* device time per command (NULL: not measured; nd.opencl.timing): timing
     * turns event timing on or off (and clears the rows); kernel_times
     * waits for the commands timed so far and returns the rows (owned by
     * the backend, valid until the next call). */
    nd_status (*timing)(bool on);
    nd_status (*kernel_times)(const nd_opencl_kernel_time **rows, int *n);
    /* ---- memory of devices other than the cpu (storage.c, device.c) ----
     * alloc: a buffer of nbytes (>= 0) on device `index`; errors name the
     * device and the size (out of memory is a status, never an abort). */
    nd_status (*alloc)(int index, size_t nbytes, void **handle);
    void (*free)(int index, void *handle, size_t nbytes);
    /* Blocking transfers of n bytes at byte offset off of storage s. */
    nd_status (*read)(const nd_storage *s, size_t off, void *dst, size_t n);
    nd_status (*write)(nd_storage *s, size_t off, const void *src, size_t n);
    nd_status (*synchronize)(int index);
    /* dst = src, any strides for both (dst may be a view), casting dtypes;
     * src already has dst's shape (possibly with 0 strides). */
    nd_status (*copy)(nd_tensor *dst, const nd_tensor *src);
    /* value: one element in dst's dtype; dst any strides */
    nd_status (*fill)(nd_tensor *dst, const void *value);
    nd_status (*unary)(nd_unary_op op, nd_tensor *out, const nd_tensor *x);
    /* a and b in the compute dtype; out in it too, or bool for comparisons. */
    nd_status (*binary)(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
    /* s: one element in a's dtype */
    nd_status (*binary_scalar)(nd_binary_op op, nd_tensor *out, const nd_tensor *a, const void *s,
                               int scalar_first);
    nd_status (*where)(nd_tensor *out, const nd_tensor *cond, const nd_tensor *a,
                       const nd_tensor *b);
    nd_status (*clamp)(nd_tensor *out, const nd_tensor *x, double lo, double hi);
    /* out has x's rank with reduced dims of size 1 (keepdim form). */
    nd_status (*reduce)(nd_reduce_op op, nd_tensor *out, const nd_tensor *x,
                        const bool *reduced, int correction);
    /* out += the sum of x over `reduced` (float dtypes; out in reduce's
     * keepdim shape), one add per element after the sum (bit for bit a sum
     * then an add); made by nd.compile's epilogue pass only. NULL: the pass
     * leaves the sum and the add. */
    nd_status (*reduce_sum_acc)(nd_tensor *out, const nd_tensor *x, const bool *reduced);
    /* values (x's dtype) and int64 indices along dim, keepdim form. */
    nd_status (*max_dim)(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                         int is_min);
    /* a (B..., M, K) @ b (B..., K, N) -> out (B..., M, N); batch dims equal
     * (possibly 0-strided), any strides on a and b. */
    nd_status (*matmul)(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
    /* out += a @ b, one add per element after the product (bit for bit a
     * matmul then an add); made by nd.compile's epilogue pass only. NULL:
     * the pass leaves the matmul and the add. */
    nd_status (*matmul_acc)(nd_tensor *out, const nd_tensor *a, const nd_tensor *b);
    /* matmul and matmul_acc take float16 / bfloat16 a and b for a float32
     * out as they are stored (widened as they are read, which is exact), so
     * the op passes half operands unconverted. false: the op converts them
     * to float32 first. */
    bool matmul_reads_half;
    nd_status (*gather)(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
    /* out already holds a copy of the destination; writes src at index. */
    nd_status (*scatter)(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                         int accumulate);
    nd_status (*index_select)(nd_tensor *out, const nd_tensor *x, int dim, const nd_tensor *index);
    /* out already holds a copy of x; out.index_add_(dim, index, alpha * src). */
    nd_status (*index_add)(nd_tensor *out, int dim, const nd_tensor *index, const nd_tensor *src,
                           double alpha);
    /* out already holds a copy of x; mask broadcast to out's shape (bool). */
    nd_status (*masked_fill)(nd_tensor *out, const nd_tensor *mask, double value);
    nd_status (*cumsum)(nd_tensor *out, const nd_tensor *x, int dim);
    nd_status (*sort)(nd_tensor *values, nd_tensor *indices, const nd_tensor *x, int dim,
                      int descending);
    /* (log_)softmax along dim; x and out contiguous, float32 or float64 */
    nd_status (*softmax)(nd_tensor *out, const nd_tensor *x, int dim, bool log);
    /* Layer norm of each row of x (rows x cols, contiguous) with optional
     * weight and bias (cols): y = (x - mean) * rstd * w + b; mean and rstd
     * (rows) are kept for backward. */
    nd_status (*layer_norm)(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps);
    /* Per-row cross entropy of logits (N, C contiguous) against 0-based
     * int64 labels (N); rows labelled `ignore` get 0. With smoothing e the
     * target is (1 - e) one_hot + e / C. loss: (N). */
    nd_status (*cross_entropy)(nd_tensor *loss, const nd_tensor *logits, const nd_tensor *labels,
                               int64_t ignore, double smoothing);
    /* Batch norm of x (N, C, S) contiguous: with `training`, computes each
     * channel's mean and rstd (biased variance) into mean/rstd (C); else
     * uses them as given. y = (x - mean) * rstd * w + b (w, b may be NULL). */
    nd_status (*batch_norm)(nd_tensor *y, nd_tensor *mean, nd_tensor *rstd, const nd_tensor *x,
                            const nd_tensor *w, const nd_tensor *b, double eps, bool training);
    /* Fused backwards (used when no graph of the gradient is wanted): dx
     * (may be NULL), and dw/db summed over rows (may be NULL); all
     * contiguous, mean/rstd as the forward produced them. */
    nd_status (*layer_norm_backward)(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd);
    /* batch_norm's: x (N, C, ...), w (C) or NULL, mean/rstd (C) as the
     * training forward computed them or as evaluation used them; training
     * says whether they were the batch's own statistics (then they depend
     * on x). dw = sum(g * xh), db = sum(g) per channel. */
    nd_status (*batch_norm_backward)(nd_tensor *dx, nd_tensor *dw, nd_tensor *db,
                                     const nd_tensor *g, const nd_tensor *x, const nd_tensor *w,
                                     const nd_tensor *mean, const nd_tensor *rstd, bool training);
    /* relu's: gx = g where y > 0, else 0 (so a NaN or infinite g stays out
     * of the zeroed positions, as PyTorch's threshold_backward); all
     * contiguous, one float dtype, one shape. */
    nd_status (*relu_backward)(nd_tensor *gx, const nd_tensor *g, const nd_tensor *y);
    /* nd_sgd_step_'s update (needle.h): p, grad and buf (NULL without
     * momentum) contiguous, one float dtype, one shape. */
    nd_status (*sgd_step)(nd_tensor *p, const nd_tensor *grad, nd_tensor *buf,
                          const nd_sgd_hyper *h, bool first);
    /* nd_adam_step_'s update (needle.h): p, grad, m and v contiguous, one
     * float dtype, one shape. */
    nd_status (*adam_step)(nd_tensor *p, const nd_tensor *grad, nd_tensor *m, nd_tensor *v,
                           const nd_adam_hyper *h);
    /* nd_amp_unscale_'s pass (needle.h): g contiguous, float32 or float64;
     * *found_inf set when an element was inf or NaN, else left as it was. */
    nd_status (*amp_unscale)(nd_tensor *g, double inv, bool *found_inf);
    /* dlogits = (softmax(logits) - target) * wrow[row]; labels 0-based.
     * dlogits may be logits itself (the same view: nd.compile's memory plan
     * puts the gradient over the logits when they die there), so each
     * element of a row is read before it is written, by whoever writes it. */
    nd_status (*cross_entropy_backward)(nd_tensor *dlogits, const nd_tensor *logits,
                                        const nd_tensor *labels, const nd_tensor *wrow,
                                        int64_t ignore, double smoothing);
    /* Element i of out (row-major) draws from counter (offset + i) of the
     * Philox stream keyed by seed, so results never depend on threads.
     * a, b: low/high for uniform and int, mean/std for normal; for bernoulli
     * the probabilities are in p (out's shape). */
    nd_status (*random)(nd_tensor *out, nd_random_kind kind, double a, double b,
                        const nd_tensor *p, uint64_t seed, uint64_t offset);
    /* nd.linalg's factorizations (see nd_linalg_args above); NULL: the op
     * runs them on the cpu (the tensors are copied there and back). */
    nd_status (*linalg)(const nd_linalg_args *a, nd_tensor *const *out, const nd_tensor *const *in);
    /* ---- convolution and pooling (NCHW; x, cols and g contiguous; outputs
     * fresh and contiguous; float32 or float64) ---- */
    /* cols (N, C*kh*kw, lh*lw) from x (N, C, H, W): row (c*kh + i)*kw + j,
     * column oh*lw + ow holds x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
     * (0 outside x). Groups need nothing more: group k's rows are the k-th
     * block of C/groups channels. */
    nd_status (*im2col)(nd_tensor *cols, const nd_tensor *x, const nd_conv_geom *g);
    /* The adjoint: x (N, C, H, W) = the sum of every cols entry into the
     * position im2col read it from (x is overwritten, not accumulated into). */
    nd_status (*col2im)(nd_tensor *x, const nd_tensor *cols, const nd_conv_geom *g);
    /* Depthwise conv2d (groups == C, w (C*M, 1, kh, kw)), for a backend
     * without conv2d_fused (the CPU's conv2d_fused routes these itself):
     * out (N, C*M, g->lh, g->lw) = conv2d(x, w) + b (b may be NULL); and its
     * gradients gx, gw at dy (each NULL when not wanted, else overwritten).
     * NULL: im2col and a GEMM per group. */
    nd_status (*conv2d_depthwise)(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                                  const nd_tensor *b, const nd_conv_geom *g);
    nd_status (*conv2d_depthwise_backward)(nd_tensor *gx, nd_tensor *gw, const nd_tensor *dy,
                                           const nd_tensor *x, const nd_tensor *w,
                                           const nd_conv_geom *g);
    /* out (N, C, oh, ow) and int64 indices (flat h*W + w within each plane,
     * 0-based) of the window maxima; ties keep the first, NaN propagates. */
    nd_status (*max_pool2d)(nd_tensor *out, nd_tensor *indices, const nd_tensor *x,
                            const nd_pool_geom *p);
    /* gx (N, C, H, W) = 0, then gx[n, c, indices] += g (overwrites gx). */
    nd_status (*max_pool2d_backward)(nd_tensor *gx, const nd_tensor *g, const nd_tensor *indices);
    /* window means (p->adaptive: PyTorch's adaptive windows) */
    nd_status (*avg_pool2d)(nd_tensor *out, const nd_tensor *x, const nd_pool_geom *p);
    /* gx (N, C, H, W) = the adjoint of avg_pool2d applied to g (overwrites gx). */
    nd_status (*avg_pool2d_backward)(nd_tensor *gx, const nd_tensor *g, const nd_pool_geom *p);
    /* ---- fused inference (op_fused.c; NULL: the op runs the composed ops
     * on the device instead). All tensors contiguous, one float dtype; b may
     * be NULL; out fresh. res: NULL, or a residual of out's shape and dtype
     * (contiguous, not out's memory) added after the activation, rounded as
     * a separate add would round (nd.compile's epilogue pass: a residual
     * connection's add). ---- */
    /* out (N, O, g->lh, g->lw) = act(conv2d(x (N, C, H, W), w (O, C/groups,
     * g->kh, g->kw)) + b (O)) + res */
    nd_status (*conv2d_fused)(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                              nd_activation act, const nd_tensor *res);
    /* The gradients of conv2d (no activation) at dy (N, O, g->lh, g->lw):
     * gx (N, C, H, W), gw (O, C/groups, kh, kw) and gb (O), each NULL when
     * not wanted and overwritten when given. Used by conv2d's backward when
     * it is not itself recorded (no create_graph); NULL: the backward runs
     * the composed (differentiable) formulas. x is read only for gw, w only
     * for gx, but both are passed for their shapes. */
    nd_status (*conv2d_backward)(nd_tensor *gx, nd_tensor *gw, nd_tensor *gb, const nd_tensor *dy,
                                 const nd_tensor *x, const nd_tensor *w, const nd_conv_geom *g,
                                 int64_t groups);
    /* Prepacked convolution weights (nd.compile's fold pass; NULL where a
     * backend packs nothing). conv2d_packed_numel: the elements conv2d_prepack
     * writes for a convolution of an input of shape xshape (N, C, H, W) in
     * dtype dt by a weight of shape wshape, or 0 when that convolution does
     * not run on packed weights. conv2d_prepack: w (contiguous) in that
     * layout into packed (contiguous, that many elements of w's dtype).
     * conv2d_fused_packed: conv2d_fused with the weight given so packed
     * for x's shape (O = out's dim 1). */
    int64_t (*conv2d_packed_numel)(const int64_t *xshape, const int64_t *wshape, nd_dtype dt,
                                   const nd_conv_geom *g, int64_t groups);
    nd_status (*conv2d_prepack)(nd_tensor *packed, const nd_tensor *w, const int64_t *xshape,
                                const nd_conv_geom *g, int64_t groups);
    nd_status (*conv2d_fused_packed)(nd_tensor *out, const nd_tensor *x, const nd_tensor *packed,
                                     const nd_tensor *b, const nd_conv_geom *g, int64_t groups,
                                     nd_activation act, const nd_tensor *res);
    /* out (M, O) = act(x (M, K) @ w (O, K)^T + b (O)) + res */
    nd_status (*linear_fused)(nd_tensor *out, const nd_tensor *x, const nd_tensor *w,
                              const nd_tensor *b, nd_activation act, const nd_tensor *res);
    /* (query) whether linear_fused takes w in float16/bfloat16 for this
     * float32 x (any shape (..., K)), converting it exactly as it reads it:
     * the bits of w converted to float32 first, without that copy. NULL: no */
    bool (*linear_half_weight)(const nd_tensor *x, const nd_tensor *w);
    /* out (B1, B2, L, Ev) = dropout(softmax(scale * q k^T + mask)) v for
     * each of the B1 x B2 products (a's scalars): q (B1, B2, L, E), k (B1,
     * B2, S, E), v (B1, B2, S, Ev) and out with unit-stride rows (other
     * strides any; out dense); mask NULL or (B1, B2, L, S) of q's dtype
     * with any strides (broadcast dims 0-strided), added to the scaled
     * scores. A row whose scores are all -inf or hold a NaN is NaN, as
     * nd.softmax's. lse NULL, or (B1, B2, L) contiguous of q's dtype: each
     * row's log-sum-exp of the masked, scaled scores (before dropout), for
     * the backward. keep NULL, or with dropout (B1, B2, L, S) contiguous
     * bool: the weights kept, for a backward that reads them instead of
     * drawing them again. NULL: none (F.scaled_dot_product_attention
     * composes the ops). */
    nd_status (*attention)(nd_tensor *out, nd_tensor *lse, nd_tensor *keep, const nd_tensor *q,
                           const nd_tensor *k, const nd_tensor *v, const nd_tensor *mask,
                           const nd_attention_args *a);
    /* attention's gradients from g (out's, unit-stride rows), the forward's
     * operands, its out and lse, recomputing the weights block by block
     * (no (L, S) float tensor kept): dq, dk, dv each NULL (not wanted) or
     * with q's, k's and v's shapes and dtype, unit-stride rows (other
     * strides any, no overlap); keep the forward's (with dropout; NULL
     * without). NULL: the autograd node composes them from differentiable
     * ops. */
    nd_status (*attention_backward)(nd_tensor *dq, nd_tensor *dk, nd_tensor *dv, const nd_tensor *g,
                                    const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                                    const nd_tensor *mask, const nd_tensor *out,
                                    const nd_tensor *lse, const nd_tensor *keep,
                                    const nd_attention_args *a);
    /* The LSTM cell after its products: gates = xw + hw (B, 4H; hw NULL:
     * xw alone) pre-activations in PyTorch's order (input, forget, cell,
     * output), c (B, H) -> h, c2 (B, H) with i, f, o = sigmoid, g = tanh of
     * the gates, c2 = f c + i g, h = o tanh(c2). Every operand 2-D with
     * unit-stride rows (row strides any: h and c2 may be the two halves of
     * one (B, 2H) result, or rows of a layer's outputs). Each value as the
     * composed ops (add, sigmoid, tanh, mul) compute it. NULL: nn.LSTM
     * composes the ops. */
    nd_status (*lstm_cell)(nd_tensor *h, nd_tensor *c2, const nd_tensor *xw, const nd_tensor *hw,
                           const nd_tensor *c);
    /* Its gradients from gh, gc (B, H) = h's and c2's (the same layouts;
     * c2 the forward's): dgates (B, 4H: xw's and hw's gradient both) and
     * dc (B, H), each NULL when not wanted, as the composed ops' backward
     * computes them. */
    nd_status (*lstm_cell_backward)(nd_tensor *dgates, nd_tensor *dc, const nd_tensor *gh,
                                    const nd_tensor *gc, const nd_tensor *xw, const nd_tensor *hw,
                                    const nd_tensor *c, const nd_tensor *c2);
    /* The GRU cell after its products: xw, hw (B, 3H) the input's and the
     * state's products in PyTorch's order (reset, update, new), h (B, H)
     * -> out (B, H) = (1 - z) n + z h with r = sigmoid(xw_r + hw_r), z =
     * sigmoid(xw_z + hw_z), n = tanh(xw_n + r hw_n). Operands 2-D with
     * unit-stride rows; out dense; the composed ops' values. NULL: nn.GRU
     * composes the ops. */
    nd_status (*gru_cell)(nd_tensor *out, const nd_tensor *xw, const nd_tensor *hw,
                          const nd_tensor *h);
    /* Its gradients from g (B, H): dxw, dhw (B, 3H) and dh (B, H), each
     * NULL when not wanted, as the composed ops' backward computes them;
     * with dh_add, dh += its gradient (one add per element: nn.GRU's layer
     * adds it into the state gradient of the step before). */
    nd_status (*gru_cell_backward)(nd_tensor *dxw, nd_tensor *dhw, nd_tensor *dh, const nd_tensor *g,
                                   const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, bool dh_add);
    /* A (query; nd.compile's join pass): A > 0 when linear_fused in dtype dt
     * computes each output element the same way whatever the output's width
     * and the element's column, as long as the widths and column offsets are
     * multiples of A (so layers joined side by side give the same bits);
     * 0 or NULL: no such promise, the pass leaves the layers alone. */
    int (*linear_join_align)(nd_dtype dt);
    /* Runs program p over ts[0 .. p->nt) (see nd_ew_program); NULL: the fuse
     * pass leaves this backend's elementwise kernels unfused. */
    nd_status (*fused_elementwise)(nd_ew_program *p, nd_tensor *const *ts);
    /* Runs row op op over rows made by program p (see nd_rows_op); NULL: the
     * fuse pass leaves row ops and their producers apart. */
    nd_status (*fused_rows)(const nd_rows_op *op, nd_ew_program *p, nd_tensor *const *ts, int x_slot);
    /* Prepared launches (nd.compile's replays; NULL where a call costs
     * nothing to prepare, as on the CPU). Between prepare_begin and
     * prepare_end this thread's calls note the commands they enqueue;
     * prepare_end(keep) returns them as an opaque handle, or NULL when keep
     * is false or the calls did anything a handle cannot repeat (read or
     * write host memory, allocate, wait). prepared_run enqueues the same
     * commands with the same arguments again; prepared_equal says whether
     * two handles would enqueue the same commands. */
    nd_status (*prepare_begin)(void);
    void *(*prepare_end)(bool keep);
    bool (*prepared_equal)(const void *a, const void *b);
    nd_status (*prepared_run)(void *prepared);
    void (*prepared_free)(void *prepared);
    /* How this thread's next GEMMs (matmul, matmul_acc, linear_fused) split
     * their work (nd.compile's tuner and replays, graph_tune.c); NULL or
     * all-zero: the kernels' own choices. A hint never changes a result's
     * bits. NULL entry: the backend takes no hints. */
    void (*gemm_hint)(const nd_gemm_hint *h);
} nd_backend;

extern const nd_backend nd_cpu_backend;
#ifdef NEEDLE_HAVE_OPENCL
extern const nd_backend nd_opencl_backend;
#endif

/* The backend of a device type (NULL when this build lacks it). */
static inline const nd_backend *nd_backend_for(nd_device_type type) {
    if (type == ND_DEVICE_CPU) return &nd_cpu_backend;
#ifdef NEEDLE_HAVE_OPENCL
    if (type == ND_DEVICE_OPENCL) return &nd_opencl_backend;
#endif
    return NULL;
}

/* The backend that owns t's memory (a tensor on a device always has one). */
static inline const nd_backend *nd_backend_of(const nd_tensor *t) {
    return nd_backend_for(t->storage->device);
}

#endif
