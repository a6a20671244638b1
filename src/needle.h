/*
 * needle.h - the public C API of needle-lua's core (libneedle).
 *
 * Conventions
 *   - Every fallible function returns nd_status; ND_OK is 0. On failure the
 *     thread-local message nd_last_error() says what went wrong, naming the op.
 *     Nothing aborts or longjmps on user error.
 *   - Results are returned through an `nd_tensor **out` argument. The caller
 *     owns one reference to every tensor it receives and gives it back with
 *     nd_release(). Inputs are borrowed (never consumed).
 *   - Dims and indices are 0-based here; the Lua layer is 1-based.
 *   - Views (reshape when strides allow, permute, transpose, expand, select,
 *     narrow, slice, squeeze, unsqueeze, flatten) share storage with their
 *     base: a write through a view is seen by the base.
 *
 * The Lua side (needs <lua.h> in the caller):
 *   luaopen_needle()      the whole package ("needle") from sources embedded in
 *                         the library: a C host needs no files on disk.
 *   luaopen_needle_core() the C bindings only ("needle.core").
 *   nd_lua_push_tensor()  / nd_lua_check_tensor() move tensors across.
 */
#ifndef NEEDLE_H
#define NEEDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "needle_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ND_MAX_DIMS 8

typedef enum {
    ND_OK = 0,
    ND_ERR_ARG,         /* bad argument (value, type, option) */
    ND_ERR_SHAPE,       /* shapes do not match or cannot broadcast */
    ND_ERR_DTYPE,       /* dtype not supported by the op */
    ND_ERR_INDEX,       /* index or dim out of range */
    ND_ERR_MEMORY,      /* allocation failed or size absurd */
    ND_ERR_DEVICE,      /* operands on different devices / device missing */
    ND_ERR_UNSUPPORTED, /* op not available on this backend */
    ND_ERR_IO,          /* file I/O */
    ND_ERR_INTERNAL
} nd_status;

typedef enum {
    ND_FLOAT32 = 0,
    ND_FLOAT64,
    ND_INT64,
    ND_INT32,
    ND_UINT8,
    ND_BOOL,
    ND_FLOAT16,  /* storage only: convert with nd_to_dtype */
    ND_BFLOAT16, /* storage only */
    ND_NUM_DTYPES
} nd_dtype;

typedef enum { ND_DEVICE_CPU = 0, ND_DEVICE_OPENCL = 1 } nd_device_type;
/* A device: the cpu (index 0), or OpenCL device `index` (0-based, in the
 * order nd_opencl_device_info lists them). Written "cpu", "opencl:N". */
typedef struct { nd_device_type type; int index; } nd_device;

typedef struct nd_tensor nd_tensor;

/* ---- errors, dtypes, library ---- */
const char *nd_last_error(void);
const char *nd_status_name(nd_status s);
const char *nd_version(void);
const char *nd_dtype_name(nd_dtype dt);
nd_status nd_dtype_from_name(const char *name, nd_dtype *out);
size_t nd_dtype_size(nd_dtype dt);
int nd_dtype_is_float(nd_dtype dt);
/* float16 or bfloat16: storage types that ops compute in float32 */
int nd_dtype_is_half(nd_dtype dt);
/* Threads of the CPU kernels (cpu_threads.c): n is the most they use; with
 * adaptive threads (the default; NEEDLE_ADAPTIVE_THREADS=0 turns it off)
 * fewer while other processes keep this process's CPUs busy. */
void nd_set_num_threads(int n);
int nd_get_num_threads(void);
void nd_set_adaptive_threads(bool on);
typedef struct {
    int max;               /* nd_set_num_threads / NEEDLE_NUM_THREADS / OpenMP's default */
    int in_use;            /* the count kernels use now */
    int cpus;              /* CPUs this process may run on */
    bool adaptive;         /* the count follows the load */
    bool measured;         /* /proc/stat could be read (else in_use == max) */
    double busy_elsewhere; /* cores other processes took lately (smoothed) */
    int quota_cpus;        /* CPUs the cgroup's CPU quota allows (0: no quota) */
} nd_threads_state;
void nd_threads_info(nd_threads_state *out);
/* The calling thread's kernels use at most n threads (0: no cap of its own).
 * A DataLoader worker thread runs with 1: its parallelism is the workers'. */
void nd_set_thread_max_threads(int n);
/* The CPU's run-time chosen float32 fast paths (AVX2 + FMA): the packed
 * conv2d kernels (cpu_conv_packed.c; NEEDLE_CONV_BLAS=1 turns them off) and
 * the small-batch linear kernel (cpu_linear_small.c; NEEDLE_NO_SMALL_GEMM=1). */
bool nd_cpu_packed_conv(void);
bool nd_cpu_small_linear(void);
/* The kernel float32 matmul runs on the CPU (cpu_gemm.c): "avx512f 12x32",
 * "avx2+fma 6x16" (chosen from cpuid), or "openblas" (no such ISA, or
 * NEEDLE_GEMM=openblas; NEEDLE_GEMM=avx2 picks AVX2 on an AVX-512 CPU). */
const char *nd_cpu_gemm_kernel(void);
/* Bytes of L2 cache a core has, which sizes the GEMM's column blocks
 * (cpu_caches.h: NEEDLE_L2_BYTES, else Linux's /sys, else 1 MiB). */
int64_t nd_cpu_l2_cache_bytes(void);
/* PyTorch's float32 matmul precision: "highest" (float32 throughout, the
 * default), "high" (the same here: the CPU has no TF32), "medium" (float32
 * products may compute on bfloat16 inputs with float32 sums: on a CPU with
 * AVX512_BF16, needle's GEMM packs its operands as bfloat16 - matmul,
 * linear, conv2d's GEMMs, attention - for products of at least 64 x 64, and
 * the small-batch linear kernel gives way to it there). Process-wide;
 * OpenCL devices are not affected. */
typedef enum { ND_MATMUL_HIGHEST = 0, ND_MATMUL_HIGH = 1, ND_MATMUL_MEDIUM = 2 } nd_matmul_precision;
void nd_set_float32_matmul_precision(nd_matmul_precision p);
nd_matmul_precision nd_get_float32_matmul_precision(void);
/* The dtype float32 products on OpenCL devices round their operands to
 * first: ND_FLOAT32 (the default: none), ND_FLOAT16 or ND_BFLOAT16 (to
 * nearest even, as the CPU's conversions), summed in float32 - matmul and
 * what runs on it there (linear, conv2d's im2col GEMMs, the recurrent
 * layers' projections); the fused attention and depthwise kernels stay
 * float32. nd.autocast{device_type = "opencl"} sets it for its scope;
 * autograd nodes record it with the precision. Process-wide. */
nd_status nd_set_opencl_matmul_dtype(nd_dtype dt);
nd_dtype nd_get_opencl_matmul_dtype(void);
/* Whether this CPU can run the bfloat16 GEMM; whether products run on it
 * now (the precision is "medium" and the CPU can); and whether an M x N
 * product does (it also needs M and N of at least 64: below, packing costs
 * more than bfloat16 saves, and the product stays float32). */
bool nd_cpu_gemm_bf16_available(void);
/* Whether the bfloat16 products run on AMX tiles (Sapphire Rapids and
 * later, with Linux's permission; NEEDLE_AMX=0 keeps vdpbf16ps). */
bool nd_cpu_gemm_amx_available(void);
bool nd_cpu_gemm_bf16_active(void);
bool nd_cpu_gemm_bf16_for(int64_t M, int64_t N);
/* nd.autocast's scope, for its caches: inside it (enter .. the outermost
 * exit, which frees them) a linear layer's weight is packed to bfloat16 once
 * and every linear, of any batch size, runs the bfloat16 kernel on it. */
void nd_autocast_enter(void);
void nd_autocast_exit(void);
bool nd_autocast_active(void);

/* ---- lifetime and metadata ---- */
void nd_retain(nd_tensor *t);
void nd_release(nd_tensor *t);
int nd_ndim(const nd_tensor *t);
const int64_t *nd_shape(const nd_tensor *t);
const int64_t *nd_strides(const nd_tensor *t); /* in elements */
int64_t nd_numel(const nd_tensor *t);
nd_dtype nd_get_dtype(const nd_tensor *t);
int nd_is_contiguous(const nd_tensor *t);
/* Pointer to the first element (storage data + offset), CPU tensors only
 * (NULL for a tensor on another device: copy it with nd_to_device first). */
void *nd_data(const nd_tensor *t);

/* ---- devices ----
 * Tensors live on one device; an op's operands must share it (an error names
 * both devices otherwise) and its results are created there. Results of
 * nd_empty & co. are on the cpu; nd_empty_on & co. take a device. */
nd_device nd_get_device(const nd_tensor *t);
static inline nd_device nd_cpu_device(void) { nd_device d = {ND_DEVICE_CPU, 0}; return d; }
/* "cpu", "opencl" (the default OpenCL device: NEEDLE_OPENCL_DEVICE, else the
 * first GPU, else the first device) or "opencl:N". Fails with an error that
 * says how to get a device when there is none. */
nd_status nd_device_parse(const char *name, nd_device *out);
/* "cpu" or "opencl:N" into buf (at least 32 bytes); returns buf. */
const char *nd_device_str(nd_device d, char *buf);
/* t on device d: t itself (a new reference) when already there, else a
 * contiguous copy. Differentiable (the gradient goes back to t's device). */
nd_status nd_to_device(const nd_tensor *t, nd_device d, nd_tensor **out);
nd_status nd_empty_on(nd_device d, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_zeros_on(nd_device d, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_full_on(nd_device d, const int64_t *shape, int ndim, nd_dtype dt, double value,
                     nd_tensor **out);
/* Waits until every queued kernel of t's device finished (a no-op on cpu). */
nd_status nd_synchronize(nd_device d);

/* OpenCL devices (0 when the build has no OpenCL or no driver is installed). */
typedef struct {
    char name[128], vendor[128], platform[128], version[128], driver[64];
    int64_t global_mem_bytes, max_alloc_bytes, local_mem_bytes;
    int compute_units, max_clock_mhz, max_work_group_size;
    bool is_gpu, fp64;
    bool fp16; /* cl_khr_fp16: half arithmetic in kernels (needle's kernels do not use it yet) */
} nd_opencl_info;
int nd_opencl_device_count(void);
nd_status nd_opencl_device_info(int index, nd_opencl_info *out);
/* Why there is no OpenCL device (build option, missing ICD, no platform),
 * with how to install one; NULL when devices exist. */
const char *nd_opencl_unavailable_reason(void);
/* OpenCL kernels launched so far by this process (0 without OpenCL). */
uint64_t nd_opencl_launch_count(void);
/* Device time per OpenCL command (kernels, fills, copies), summed per label
 * "<op> <kernel function> [global size]". nd_opencl_timing(true) starts
 * timing (every command then takes an event, which costs host time) and
 * clears the rows; nd_opencl_kernel_times waits for the timed commands and
 * returns the rows (valid until the next call; none without OpenCL). */
typedef struct {
    char label[128];
    int64_t calls;
    uint64_t ns;
} nd_opencl_kernel_time;
nd_status nd_opencl_timing(bool on);
nd_status nd_opencl_kernel_times(const nd_opencl_kernel_time **rows, int *n);

/* ---- creation ---- */
nd_status nd_empty(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_zeros(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_full(const int64_t *shape, int ndim, nd_dtype dt, double value, nd_tensor **out);
nd_status nd_scalar(double value, nd_dtype dt, nd_tensor **out); /* 0-dim */
nd_status nd_arange(double start, double end, double step, nd_dtype dt, nd_tensor **out);
nd_status nd_linspace(double start, double end, int64_t steps, nd_dtype dt, nd_tensor **out);
nd_status nd_eye(int64_t n, int64_t m, nd_dtype dt, nd_tensor **out);
/* Copies `data` (row-major, dtype dt) into a new tensor. */
nd_status nd_from_buffer(const void *data, const int64_t *shape, int ndim, nd_dtype dt,
                         nd_tensor **out);
/* Wraps `data` without copying; release(ctx) is called when the last view
 * of it dies. The host keeps the buffer alive until then. */
nd_status nd_from_borrowed(void *data, const int64_t *shape, int ndim, nd_dtype dt,
                           void (*release)(void *ctx), void *ctx, nd_tensor **out);
/* Copies the tensor's elements, row-major, into dst (dst_bytes must equal
 * numel * dtype size). Works for any strides. */
nd_status nd_copy_to_buffer(const nd_tensor *t, void *dst, size_t dst_bytes);
/* Element at a (0-based) multi-index, as a double. */
nd_status nd_get_item(const nd_tensor *t, const int64_t *index, double *out);

/* ---- views (share storage) ---- */
nd_status nd_view(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out);
nd_status nd_reshape(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out);
nd_status nd_permute(const nd_tensor *t, const int *dims, int ndim, nd_tensor **out);
nd_status nd_transpose(const nd_tensor *t, int d0, int d1, nd_tensor **out);
nd_status nd_expand(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out);
nd_status nd_select(const nd_tensor *t, int dim, int64_t index, nd_tensor **out);
nd_status nd_narrow(const nd_tensor *t, int dim, int64_t start, int64_t length, nd_tensor **out);
nd_status nd_slice(const nd_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                   nd_tensor **out);
/* squeeze one dim (a no-op when its size is not 1), or every size-1 dim */
nd_status nd_squeeze(const nd_tensor *t, int dim, nd_tensor **out);
nd_status nd_squeeze_all(const nd_tensor *t, nd_tensor **out);
nd_status nd_unsqueeze(const nd_tensor *t, int dim, nd_tensor **out);
nd_status nd_flatten(const nd_tensor *t, int start_dim, int end_dim, nd_tensor **out);

/* ---- copies and conversions ---- */
nd_status nd_contiguous(const nd_tensor *t, nd_tensor **out); /* new ref to t if already */
nd_status nd_clone(const nd_tensor *t, nd_tensor **out);
nd_status nd_to_dtype(const nd_tensor *t, nd_dtype dt, nd_tensor **out);
/* dst[...] = src (broadcast to dst's shape, cast to dst's dtype), in place. */
nd_status nd_copy_(nd_tensor *dst, const nd_tensor *src);
/* t takes src's memory, geometry and dtype (PyTorch's `t.data = src`): every
 * reference to t sees the new data. Used to move a module's parameters to a
 * device in place. A gradient on another device than src is dropped. */
nd_status nd_set_data_(nd_tensor *t, const nd_tensor *src);
nd_status nd_fill_(nd_tensor *dst, double value);
nd_status nd_fill_int_(nd_tensor *dst, int64_t value); /* exact for int64 */

/* ---- elementwise ---- (the ops and their rules: needle_ops.h) */
typedef enum {
#define ND_X(name, ...) ND_UNARY_##name,
    ND_UNARY_OPS(ND_X)
#undef ND_X
    ND_NUM_UNARY
} nd_unary_op;

typedef enum {
#define ND_X(name, ...) ND_BINARY_##name,
    ND_BINARY_OPS(ND_X)
#undef ND_X
    ND_NUM_BINARY
} nd_binary_op;

const char *nd_unary_name(nd_unary_op op);
const char *nd_binary_name(nd_binary_op op);
nd_status nd_unary(nd_unary_op op, const nd_tensor *x, nd_tensor **out);
nd_status nd_unary_(nd_unary_op op, nd_tensor *x); /* in place: x:relu_() */
nd_status nd_binary(nd_binary_op op, const nd_tensor *a, const nd_tensor *b, nd_tensor **out);
/* a op s (or s op a when scalar_first). As in PyTorch a number does not widen
 * a tensor's dtype within its kind; a non-integral number with an integer or
 * bool tensor gives float32. */
nd_status nd_binary_scalar(nd_binary_op op, const nd_tensor *a, double s, int scalar_first,
                           nd_tensor **out);
/* The same with an integer, exact beyond 2^53 for int64 tensors. */
nd_status nd_binary_scalar_int(nd_binary_op op, const nd_tensor *a, int64_t s, int scalar_first,
                               nd_tensor **out);
/* In place: a = a op b (b broadcast to a's shape, result cast to a's dtype). */
nd_status nd_binary_(nd_binary_op op, nd_tensor *a, const nd_tensor *b);
nd_status nd_binary_scalar_(nd_binary_op op, nd_tensor *a, double s);
nd_status nd_where(const nd_tensor *cond, const nd_tensor *a, const nd_tensor *b,
                   nd_tensor **out);
/* NAN bound means "no bound" on that side. */
nd_status nd_clamp(const nd_tensor *x, double lo, double hi, nd_tensor **out);
nd_status nd_clamp_(nd_tensor *x, double lo, double hi); /* in place */

/* ---- reductions ----
 * dims: list of 0-based dims (negative allowed); ndims 0 means all dims.
 * correction: for var/std (1 = unbiased). */
typedef enum {
#define ND_X(name, ...) ND_REDUCE_##name,
    ND_REDUCE_OPS(ND_X)
#undef ND_X
    ND_NUM_REDUCE
} nd_reduce_op;
const char *nd_reduce_name(nd_reduce_op op);
nd_status nd_reduce(nd_reduce_op op, const nd_tensor *x, const int *dims, int ndims,
                    int keepdim, int correction, nd_tensor **out);
/* values and (int64) indices of max/min along one dim */
nd_status nd_max_dim(const nd_tensor *x, int dim, int keepdim, int is_min,
                     nd_tensor **values, nd_tensor **indices);

/* ---- the op registry (needle_ops.h), for bindings and tools ----
 * One entry per op, in a fixed order: unary, binary, reduction, other. */
typedef struct {
    const char *name;
    const char *kind;       /* "unary", "binary", "reduce", "view", "gemm", ... (lower case) */
    int arity;              /* tensor inputs; -1: a list of tensors */
    const char *dtype_rule; /* "same", "float", "promote", "promote_float" (ints too give
                             * float32), "index", "output", "compare" */
    bool differentiable;    /* has a gradient for float inputs */
    bool records_node;      /* ... through an autograd node of its own, named after the op */
    const char *expr;       /* elementwise ops: the float expression (x, or a and b); else NULL */
    const char *backward;   /* unary ops: the backward formula; else NULL */
} nd_op_info;
/* Every op: ND_OP_<name>, in the order of nd_op_at. A name that two lists
 * of needle_ops.h share would be a duplicate enumerator: a build error. */
typedef enum {
#define ND_X(name, ...) ND_OP_##name,
    ND_UNARY_OPS(ND_X) ND_BINARY_OPS(ND_X) ND_REDUCE_OPS(ND_X) ND_OTHER_OPS(ND_X)
#undef ND_X
    ND_NUM_OPS
} nd_op;
static inline nd_op nd_unary_op_id(nd_unary_op op) { return (nd_op)op; }
static inline nd_op nd_binary_op_id(nd_binary_op op) { return (nd_op)(ND_NUM_UNARY + op); }
static inline nd_op nd_reduce_op_id(nd_reduce_op op) {
    return (nd_op)(ND_NUM_UNARY + ND_NUM_BINARY + op);
}
const char *nd_op_name(nd_op op);
int nd_op_count(void);
const nd_op_info *nd_op_at(int i);               /* NULL outside 0 .. nd_op_count() - 1 */
const nd_op_info *nd_op_find(const char *name);  /* NULL when no op has that name */

/* ---- neural-network ops ---- */
/* Fused, numerically stable softmax / log_softmax along dim (float types). */
nd_status nd_softmax(const nd_tensor *x, int dim, nd_tensor **out);
nd_status nd_log_softmax(const nd_tensor *x, int dim, nd_tensor **out);
/* Layer norm over the last `nnorm` dims; weight/bias (those dims' shape) may
 * be NULL. */
nd_status nd_layer_norm(const nd_tensor *x, int nnorm, const nd_tensor *weight,
                        const nd_tensor *bias, double eps, nd_tensor **out);
/* Batch norm of x (N, C, ...). Training uses the batch's statistics and, if
 * running_mean/running_var are given, updates them in place (momentum;
 * unbiased variance); evaluation uses the running statistics. */
nd_status nd_batch_norm(const nd_tensor *x, nd_tensor *running_mean, nd_tensor *running_var,
                        const nd_tensor *weight, const nd_tensor *bias, bool training,
                        double momentum, double eps, nd_tensor **out);
/* The weight (O, ...) and bias (O, or NULL) of a layer followed by an
 * evaluation-mode batch norm over its O outputs, with the norm folded in:
 * w' = w * s per output channel, b' = (b - mean) * s + beta, s = gamma * rstd
 * (rstd = (running_var + eps)^-1/2; gamma, beta may be NULL). Computed in
 * float64, returned in w's dtype on w's device; no autograd graph. The
 * formula of nd.nn.fuse and of nd.compile's fold pass. */
nd_status nd_fold_batch_norm(const nd_tensor *w, const nd_tensor *b, const nd_tensor *mean,
                             const nd_tensor *rstd, const nd_tensor *gamma, const nd_tensor *beta,
                             nd_tensor **w_out, nd_tensor **b_out);
/* Cross entropy of logits (N, C) against 0-based int64 labels (N).
 * reduction: 0 none, 1 mean (over rows not ignored), 2 sum. ignore_index
 * may be any value outside 0..C-1 to disable it. */
nd_status nd_cross_entropy(const nd_tensor *logits, const nd_tensor *labels, int64_t ignore_index,
                           double label_smoothing, int reduction, nd_tensor **out);

/* ---- linear algebra ---- */
nd_status nd_matmul(const nd_tensor *a, const nd_tensor *b, nd_tensor **out);

/* ---- nd.linalg (ops/op_linalg.c): LAPACK on batches of matrices ----
 * A is (..., m, n), square where the function needs it, float32 or float64
 * (other dtypes are an error); its leading dims are a batch, broadcast with
 * B's. A tensor on another device is factored on the host and the results
 * are copied back. A singular, not positive-definite or non-finite input
 * is an error naming the batch element. No autograd node is recorded
 * (nd.linalg's gradients are Lua functions of differentiable ops,
 * lua/needle/linalg.lua), and a graph capture stops at these (a graph
 * break: they read LAPACK's results on the host). Errors are named
 * "linalg.<fn>". */
nd_status nd_linalg_inv(const nd_tensor *a, nd_tensor **out);
/* X with A X = B: B is (..., n, k), or a vector, as PyTorch decides it (B
 * has one dim, or A's shape without its last dim): X then has B's shape. */
nd_status nd_linalg_solve(const nd_tensor *a, const nd_tensor *b, nd_tensor **out);
/* det(A), and its sign and log|det(A)| (sign 0 and -inf when singular); any
 * of the three may be NULL. */
nd_status nd_linalg_det(const nd_tensor *a, nd_tensor **det, nd_tensor **sign, nd_tensor **logabsdet);
/* L with A = L L^T from A's lower triangle; upper: U = L^T from its upper one. */
nd_status nd_linalg_cholesky(const nd_tensor *a, bool upper, nd_tensor **out);
typedef enum { ND_QR_REDUCED, ND_QR_COMPLETE, ND_QR_R } nd_qr_mode;
/* Q (..., m, k) and R (..., k, n), k = min(m, n); complete: k = m; R only:
 * q is an empty tensor of shape {0}, as PyTorch's. */
nd_status nd_linalg_qr(const nd_tensor *a, nd_qr_mode mode, nd_tensor **q, nd_tensor **r);
/* A = U diag(S) Vh, S descending (..., min(m, n)); full_matrices: U (..., m, m)
 * and Vh (..., n, n). u and vh NULL: S only. */
nd_status nd_linalg_svd(const nd_tensor *a, bool full_matrices, nd_tensor **u, nd_tensor **s,
                        nd_tensor **vh);
/* Eigenvalues (ascending) and eigenvectors (columns) of the symmetric matrix
 * in A's lower triangle (upper: its upper one); v NULL: values only. */
nd_status nd_linalg_eigh(const nd_tensor *a, bool upper, nd_tensor **w, nd_tensor **v);
/* The minimum-norm least-squares solution of A X = B (LAPACK's gelsd): B is
 * (..., m, k), or (..., m) when it has one dim fewer than A. Singular values
 * below rcond times the largest count as zero; rcond NaN: the dtype's
 * epsilon times max(m, n). residuals (..., k): squared residual norms when
 * m > n and every matrix has full rank, else an empty tensor {0}; rank
 * (..., int64) and singular values (..., min(m, n)). Any output but x may
 * be NULL. */
nd_status nd_linalg_lstsq(const nd_tensor *a, const nd_tensor *b, double rcond, nd_tensor **x,
                          nd_tensor **residuals, nd_tensor **rank, nd_tensor **sv);

/* ---- convolution and pooling (NCHW, as PyTorch) ----
 * x is (N, C, H, W), or (C, H, W) unbatched (the result is then unbatched
 * too). Pair arguments are {h, w}; NULL gives the default (stride 1, or the
 * kernel size for pools; padding and output_padding 0; dilation 1). Float32
 * and float64; x, weight and bias of one dtype. All are differentiable
 * (conv2d and conv_transpose2d to any order: their backward is made of the
 * two of them and of im2col/matmul). */
/* weight (O, C/groups, kh, kw), bias (O) or NULL -> (N, O, oh, ow) with
 * oh = (H + 2 ph - dh (kh - 1) - 1) / sh + 1. Forward is im2col + one GEMM
 * per (batch, group). */
nd_status nd_conv2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                    const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                    int64_t groups, nd_tensor **out);
/* The adjoint of conv2d in x: weight (C, O/groups, kh, kw), bias (O) or NULL
 * -> (N, O, oh, ow) with oh = (H - 1) sh - 2 ph + dh (kh - 1) + oph + 1;
 * output_padding must be smaller than the stride or the dilation. */
nd_status nd_conv_transpose2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                              const int64_t *stride, const int64_t *padding,
                              const int64_t *output_padding, const int64_t *dilation,
                              int64_t groups, nd_tensor **out);
/* Window maxima; padding is -inf and at most half the kernel. ceil_mode
 * rounds the output size up (a window must still start inside the input or
 * its left padding). indices (int64, may be NULL): the argmax's flat
 * position h*W + w within its (H, W) plane, 0-based; ties give the first
 * maximum in row-major window order (as PyTorch's CPU kernel). The gradient
 * goes to that position. */
nd_status nd_max_pool2d(const nd_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, const int64_t *dilation, int ceil_mode,
                        nd_tensor **out, nd_tensor **indices);
/* Window means; count_include_pad divides by the window clipped to the
 * padded input, else by its elements inside the input. */
nd_status nd_avg_pool2d(const nd_tensor *x, const int64_t *kernel, const int64_t *stride,
                        const int64_t *padding, int ceil_mode, int count_include_pad,
                        nd_tensor **out);
/* Output (oh, ow); window i along H covers floor(i H / oh) .. ceil((i+1) H / oh) - 1. */
nd_status nd_adaptive_avg_pool2d(const nd_tensor *x, const int64_t *out_hw, nd_tensor **out);
/* needle's dilate: every element along each of `dims` is followed by
 * `dilation` zeros, so a dim of size n becomes n (dilation + 1). undilate
 * keeps every (dilation + 1)-th element from the first: ceil(n / (dilation
 * + 1)). undilate(dilate(x)) == x. Both return new tensors. */
nd_status nd_dilate(const nd_tensor *x, const int *dims, int ndims, int64_t dilation,
                    nd_tensor **out);
nd_status nd_undilate(const nd_tensor *x, const int *dims, int ndims, int64_t dilation,
                      nd_tensor **out);

/* ---- fused inference ops (nd.nn.fuse) ----
 * act(conv2d(x, w, b)) and act(x @ w^T + b) as one GEMM whose epilogue adds
 * the bias and applies the activation while the output is still in cache
 * (what nd.nn.fuse puts in place of Conv2d+BatchNorm2d+ReLU, BatchNorm
 * folded into w and b). Same arguments, shapes and dtypes as nd_conv2d /
 * F.linear. When autograd would record (grad mode on and an input requires
 * grad) they run as the composed differentiable ops (conv2d or matmul, add,
 * relu or gelu), so gradients stay exact; devices without a fused kernel (OpenCL)
 * also run the composed ops. */
typedef enum { ND_ACT_NONE = 0, ND_ACT_RELU = 1, ND_ACT_GELU = 2 } nd_activation;
/* x (..., in), weight (out, in), bias (out) or NULL -> (..., out) */
nd_status nd_fused_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          nd_activation act, nd_tensor **out);
/* F.linear: x @ weight^T + bias (bias may be NULL), differentiable; the
 * bias is added in the GEMM epilogue when autograd does not record.
 * Errors are named "linear". */
nd_status nd_linear(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                    nd_tensor **out);
/* dropout(softmax(scale * q k^T + mask)) v in one kernel, float32 or
 * float64: q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev), mask NULL or
 * (B, H, L, S) with any strides, added to the scaled scores (no gradient
 * for it: an error when it requires one); causal masks key j > query i;
 * dropout_p in [0, 1) drops weights as F.dropout would (the counters its
 * rand() would take). -> (B, H, L, Ev), with
 * a fused backward for q, k and v. Errors are named "attention"; a device
 * without the kernel fails ("no kernel on device"). */
nd_status nd_attention(const nd_tensor *q, const nd_tensor *k, const nd_tensor *v,
                       const nd_tensor *mask, double scale, bool causal, double dropout_p,
                       nd_tensor **out);
/* nn.LSTM's cell after its products, one kernel forward and one backward:
 * gates = xw + hw (B, 4H; hw may be NULL) pre-activations (input, forget,
 * cell, output: PyTorch's order), c (B, H) -> (B, 2H) = [h | c'], c' =
 * sigmoid(f) c + sigmoid(i) tanh(g), h = sigmoid(o) tanh(c'), float32 or
 * float64, the values and gradients of the composed ops. Errors are named
 * "lstm_cell". */
nd_status nd_lstm_cell(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *c, nd_tensor **out);
/* nn.GRU's cell after its products, one kernel forward and one backward:
 * xw, hw (B, 3H) the input's and the state's products (reset, update, new:
 * PyTorch's order), h (B, H) -> (1 - z) n + z h (B, H) with r, z = sigmoid
 * of the sums, n = tanh(xw_n + r hw_n); float32 or float64, the values and
 * gradients of the composed ops. Errors are named "gru_cell". */
nd_status nd_gru_cell(const nd_tensor *xw, const nd_tensor *hw, const nd_tensor *h, nd_tensor **out);
/* One direction of one nn.LSTM layer over a whole sequence, as one op: xw
 * (T, B, 4H) the input's products (x W_ih^T + b_ih), w_hh (4H, H), b_hh
 * (4H) or NULL, the state h0, c0 (B, H); each step's gates are xw_t + b_hh
 * + h W_hh^T and its cell nd_lstm_cell's; steps run t = 1..T, or T..1 when
 * reverse. Returns (T + 1, B, H): rows 1..T the outputs h_t, row T + 1 the
 * last cell state (the last h is the output at T, or at 1 when reverse).
 * The backward runs the steps back and computes the weight's gradient as
 * one product over all of them. float32 or float64; errors are named
 * "lstm_layer". */
nd_status nd_lstm_layer(const nd_tensor *xw, const nd_tensor *w_hh, const nd_tensor *b_hh, const nd_tensor *h0,
                        const nd_tensor *c0, bool reverse, nd_tensor **out);
/* One direction of one nn.GRU layer over a whole sequence, as one op: xw
 * (T, B, 3H) the input's products, w_hh (3H, H), b_hh (3H) or NULL, h0 (B,
 * H); each step's state product is h W_hh^T + b_hh and its cell
 * nd_gru_cell's; steps run t = 1..T, or T..1 when reverse. Returns the
 * outputs (T, B, H). float32 or float64; errors are named "gru_layer". */
nd_status nd_gru_layer(const nd_tensor *xw, const nd_tensor *w_hh, const nd_tensor *b_hh, const nd_tensor *h0,
                       bool reverse, nd_tensor **out);
/* as nd_conv2d, then act */
nd_status nd_fused_conv2d(const nd_tensor *x, const nd_tensor *weight, const nd_tensor *bias,
                          const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                          int64_t groups, nd_activation act, nd_tensor **out);

/* ---- optimizer updates ----
 * One step of torch.optim.SGD on p, in place and in one pass over memory:
 *   g = grad (negated when maximize) + weight_decay * p
 *   buf = g on the first step, else momentum * buf + (1 - dampening) * g
 *   g = nesterov ? g + momentum * buf : buf           (buf only when momentum != 0)
 *   p = p - lr * g
 * computed in p's dtype with the roundings of those formulas written as
 * separate tensor ops (the hyperparameters rounded to that dtype first), so
 * the result is the composed one to the bit. buf is NULL when momentum is 0.
 * *done is false, and nothing is changed, where the fused kernel does not
 * apply (a device without it, a non-float dtype, tensors that differ in
 * dtype, shape or device, or that are not contiguous): the caller then
 * composes the update from tensor ops. Refused while autograd would record
 * an in-place change of p (grad mode on and p requires grad). */
typedef struct {
    double lr, momentum, dampening, weight_decay;
    bool nesterov, maximize;
} nd_sgd_hyper;
nd_status nd_sgd_step_(nd_tensor *p, const nd_tensor *grad, nd_tensor *buf, const nd_sgd_hyper *h,
                       bool first, bool *done);
/* One step of torch.optim.Adam (decoupled: AdamW) on p, in place and in one
 * pass, with the roundings of nd.optim.Adam's composed tensor ops:
 *   g = grad (negated when maximize)
 *   decoupled: p = p * decay, else g = g + p * weight_decay   (when weight_decay != 0)
 *   m = m * beta1 + g * one_minus_beta1
 *   v = v * beta2 + (g * one_minus_beta2) * g
 *   p = p + (m * step_size) / (sqrt(v) / bc2_sqrt + eps)
 * each scalar as given (the caller computes step_size = -lr / (1 - beta1^t),
 * bc2_sqrt = sqrt(1 - beta2^t), decay = 1 - lr * weight_decay), rounded to
 * p's dtype. *done as nd_sgd_step_'s (m and v: p's dtype, shape and device,
 * contiguous). */
typedef struct {
    double beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, decay, step_size,
        bc2_sqrt;
    bool decoupled, maximize;
} nd_adam_hyper;
nd_status nd_adam_step_(nd_tensor *p, const nd_tensor *grad, nd_tensor *m, nd_tensor *v,
                        const nd_adam_hyper *h, bool *done);
/* A gradient scaler's unscale (PyTorch's _amp_foreach_non_finite_check_and_unscale_)
 * on g, in place and in one pass: g = g * inv (inv rounded to g's dtype),
 * and *found_inf set when an element of g was inf or NaN (left false
 * otherwise: the caller ORs several). *done as nd_sgd_step_'s (g contiguous,
 * float32 or float64, on a device with the kernel; not while a graph is
 * being captured). */
nd_status nd_amp_unscale_(nd_tensor *g, double inv, bool *found_inf, bool *done);

/* ---- joining, splitting, reordering ---- */
nd_status nd_cat(nd_tensor *const *ts, int n, int dim, nd_tensor **out);
nd_status nd_stack(nd_tensor *const *ts, int n, int dim, nd_tensor **out);
nd_status nd_flip(const nd_tensor *x, const int *dims, int ndims, nd_tensor **out);
/* pads: pairs (before, after) starting from the LAST dim, as torch.nn.functional.pad */
nd_status nd_pad(const nd_tensor *x, const int64_t *pads, int npairs, double value,
                 nd_tensor **out);
nd_status nd_cumsum(const nd_tensor *x, int dim, nd_tensor **out);
nd_status nd_sort(const nd_tensor *x, int dim, int descending, nd_tensor **values,
                  nd_tensor **indices);
nd_status nd_topk(const nd_tensor *x, int64_t k, int dim, int largest, nd_tensor **values,
                  nd_tensor **indices);

/* ---- indexing (indices are int64, 0-based) ---- */
nd_status nd_gather(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor **out);
nd_status nd_scatter(const nd_tensor *x, int dim, const nd_tensor *index,
                     const nd_tensor *src, int accumulate, nd_tensor **out);
nd_status nd_index_select(const nd_tensor *x, int dim, const nd_tensor *index, nd_tensor **out);
nd_status nd_index_add(const nd_tensor *x, int dim, const nd_tensor *index,
                       const nd_tensor *src, double alpha, nd_tensor **out);
nd_status nd_masked_fill(const nd_tensor *x, const nd_tensor *mask, double value,
                         nd_tensor **out);
nd_status nd_one_hot(const nd_tensor *index, int64_t num_classes, nd_tensor **out);

/* ---- random (counter-based Philox: independent of thread count) ---- */
void nd_manual_seed(uint64_t seed);
void nd_rng_get_state(uint64_t *seed, uint64_t *offset);
void nd_rng_set_state(uint64_t seed, uint64_t offset);
/* on: the calling thread gets a random stream of its own (starting where the
 * process's stream is now; nd_manual_seed and the get/set state calls on this
 * thread act on it), so a DataLoader worker seeds and draws without moving
 * the process's stream; off: back to the process's stream. */
void nd_rng_thread_local(bool on);
nd_status nd_rand(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_randn(const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_randint(int64_t low, int64_t high, const int64_t *shape, int ndim, nd_dtype dt,
                     nd_tensor **out);
nd_status nd_bernoulli(const nd_tensor *p, nd_tensor **out); /* on p's device */
nd_status nd_rand_on(nd_device d, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_randn_on(nd_device d, const int64_t *shape, int ndim, nd_dtype dt, nd_tensor **out);
nd_status nd_randperm(int64_t n, nd_tensor **out);

/* ---- autograd ----
 * Ops on tensors that require grad record a graph; backward walks it in
 * reverse and accumulates into the leaves' grad. Backward formulas are
 * differentiable ops, so create_graph gives gradients of gradients. */
nd_status nd_requires_grad_(nd_tensor *t, bool on);
/* The accumulated gradient (borrowed; NULL if none) and its setter. */
nd_tensor *nd_get_grad(const nd_tensor *t);
nd_status nd_set_grad(nd_tensor *t, nd_tensor *grad);
/* grad NULL means 1 (one-element tensors only). */
nd_status nd_backward(nd_tensor *root, const nd_tensor *grad, bool retain_graph,
                      bool create_graph);
/* Gradients of outputs w.r.t. inputs without touching grad fields. */
nd_status nd_grad(nd_tensor *const *outputs, nd_tensor *const *grad_outputs, int noutputs,
                  nd_tensor *const *inputs, int ninputs, bool retain_graph, bool create_graph,
                  bool allow_unused, nd_tensor **result);
/* Gradient-ready hooks: for a leaf flagged with nd_set_grad_hook, the
 * process's callback runs once per backward (not nd_grad), right after the
 * leaf's gradient got its last contribution, while the rest of the backward
 * is still to run (DistributedDataParallel starts reducing it there). A
 * failed status from the callback ends the backward with that error. A
 * backward run inside a custom op's backward (a walk of its own) counts
 * the leaves it reaches itself: the outer walk does not report those. */
typedef nd_status (*nd_grad_hook_fn)(nd_tensor *leaf);
void nd_set_grad_hook_callback(nd_grad_hook_fn fn);
nd_status nd_set_grad_hook(nd_tensor *t, bool on);
/* Tensor hooks (x:register_hook, x:retain_grad): nd_hook_tensor flags t's
 * grad_fn (or t itself, a leaf) and gives the key the process's callback will
 * be called with; fresh is true when it was not flagged before. In backward
 * and nd_grad, the gradient of a flagged node's output, and the sum of a
 * flagged leaf's contributions in one walk, go through the callback before
 * they go on (to the node's backward, to a leaf's grad, to nd_grad's result);
 * *out is NULL (unchanged) or a new reference to a replacement of grad's
 * shape, dtype and device. in_backward: false under nd_grad. freed(key) runs
 * when a flagged node or leaf is freed (on any thread). */
typedef nd_status (*nd_tensor_hook_fn)(const void *key, nd_tensor *grad, bool in_backward,
                                       nd_tensor **out);
void nd_set_tensor_hook_callback(nd_tensor_hook_fn fn, void (*freed)(const void *key));
nd_status nd_hook_tensor(nd_tensor *t, const void **key, bool *fresh);
/* A differentiable op whose backward is a callback (nd.autograd.Function,
 * the distributed collectives): *out is value (a new view of it) recorded
 * as a function of the inputs when grad mode is on and one of them requires
 * grad. In backward, fn gets the output's gradient and sets grads[i] (a new
 * reference, or NULL for none) for each of the ninputs inputs; ctx_free(ctx)
 * runs when the graph is freed (also when nothing was recorded). */
typedef nd_status (*nd_custom_backward_fn)(void *ctx, const nd_tensor *grad, nd_tensor **grads,
                                           int ninputs);
nd_status nd_custom_record(const char *name, const nd_tensor *const *inputs, int ninputs,
                           const nd_tensor *value, nd_custom_backward_fn fn, void *ctx,
                           void (*ctx_free)(void *ctx), nd_tensor **out);
/* Grad mode is per thread; returns the previous mode. */
bool nd_set_grad_enabled(bool on);
bool nd_grad_enabled(void);
/* A view that shares memory but has no gradient history. */
nd_status nd_detach(const nd_tensor *t, nd_tensor **out);
/* The op that produced t ("mul", "matmul", ...) or NULL for a leaf. */
const char *nd_grad_fn_name(const nd_tensor *t);

/* ---- memory accounting ---- */
/* Bytes held by live tensor storages (all devices). */
int64_t nd_live_bytes(void);
/* The most nd_live_bytes has been since the last reset (a reset starts from
 * the current value). */
int64_t nd_peak_live_bytes(void);
void nd_reset_peak_live_bytes(void);
/* Bytes kept in the caching allocator's free lists (the shared ones and the
 * calling thread's own small-block list); nd_empty_cache() frees them. */
int64_t nd_cached_bytes(void);
void nd_empty_cache(void);
/* Bytes of tensor storage allocated since start (never decreases). */
int64_t nd_allocated_bytes(void);
/* Bytes of memory this process can ever have: physical memory plus swap,
 * lowered by its cgroup's memory limit; INT64_MAX when unknown. A CPU tensor
 * larger than this is refused before any memory is touched (where the kernel
 * overcommits, malloc would succeed and the process be killed while the
 * pages are filled). Read once per process. */
int64_t nd_memory_limit(void);
/* on: the calling thread may make tensors only on the CPU (an allocation on
 * another device fails naming the thread); a DataLoader worker thread runs
 * so, since an OpenCL device's queue is driven by the thread running Lua. */
void nd_set_thread_cpu_only(bool on);

/* ---- profiler (nd.profile, `needle-lua --profile`; docs/profiler.md) ----
 * Named events bracket ops: push returns the depth before the push, pop(d)
 * closes every event above depth d (so an event left open by an error closes
 * with its caller). Per name the profiler sums calls, total and self time
 * (self = total minus nested events) and bytes of tensor storage allocated;
 * with keep_events the events themselves are kept too, for a Chrome trace.
 * Off by default; off, push/pop cost one test of a flag. Not thread-safe:
 * call it from one thread (the one running Lua). */
typedef struct {
    int64_t calls, total_ns, self_ns;
    int64_t total_bytes, self_bytes; /* storage bytes allocated (nested events in total) */
} nd_profile_stat;
typedef struct {
    int name;                 /* id from nd_profiler_intern */
    int depth;                /* 0 = outermost */
    int64_t start_ns, end_ns; /* nd_profiler_now_ns clock */
    int64_t total_bytes, self_bytes;
} nd_profile_event;
void nd_profiler_enable(bool on, bool keep_events);
/* The flag itself, for hot paths to test inline (read-only outside profiler.c). */
extern bool nd_profiler_on_;
bool nd_profiler_enabled(void);
/* The id of a name (copied; the same name gives the same id), -1 on OOM. */
int nd_profiler_intern(const char *name);
int nd_profiler_num_names(void);
const char *nd_profiler_name(int id);
void nd_profiler_stat(int id, nd_profile_stat *out);
int nd_profiler_push(int id);
void nd_profiler_pop(int depth);
int nd_profiler_depth(void);
/* push of "<op>_backward" (op: a static string, e.g. a node's name) */
int nd_profiler_push_backward(const char *op);
/* The kept events (valid until the next push/reset), in order of ending. */
size_t nd_profiler_events(const nd_profile_event **events, size_t *dropped);
/* Zeroes the sums and drops the events (names keep their ids). */
void nd_profiler_reset(void);
/* Monotonic clock, nanoseconds. */
int64_t nd_profiler_now_ns(void);

/* ---- graph capture and replay (the engine under nd.compile; docs/compile.md) ----
 * nd_graph_begin starts recording, on this thread, every backend call the
 * ops make (they still run); nd_graph_end stops and fails if the capture
 * hit something a replay cannot reproduce (a graph break: reading tensor
 * values on the host). nd_graph_replay runs the recorded kernels again on
 * the same buffers. */
typedef struct nd_graph nd_graph;
nd_status nd_graph_begin(nd_graph **out);
nd_status nd_graph_end(nd_graph *g);
nd_status nd_graph_replay(nd_graph *g);
void nd_graph_free(nd_graph *g); /* drops the caller's reference (see nd_graph_retain) */
void nd_graph_retain(nd_graph *g);
/* Backward through a compiled forward: out (a fresh tensor, output k of a
 * replay of fw) gets an autograd node whose inputs are leaves[0 .. n): its
 * backward copies the incoming gradient into grad_ins[k], replays bw
 * (captured to compute the gradients of the outputs with respect to the
 * leaves from grad_ins, zeros but while an output's backward runs) and
 * returns copies of grads[i] (NULL: no gradient). It fails when fw replayed
 * again since out was made, when anything else bw reads was written since
 * (storage versions), and under create_graph. Nothing is attached when grad
 * mode is off or no leaf requires grad. */
/* Outputs of fw with an attached backward that has not run yet and that are
 * still alive (their next replay would make that backward refuse). */
int64_t nd_graph_pending_backwards(const nd_graph *g);
nd_status nd_graph_attach_backward(nd_tensor *out, nd_graph *fw, nd_graph *bw,
                                   nd_tensor *const *grad_ins, int ngrad_in, int k,
                                   int n, nd_tensor *const *leaves, nd_tensor *const *grads);
/* Runs one pass over an ended graph's records before its plan (graph_passes.c):
 * "dce" (dead kernels) or "cse" (repeated kernels); *changed: records removed. */
nd_status nd_graph_pass(nd_graph *g, const char *name, int64_t *changed);
/* Marks t's storage as an input of the compiled function (its copy of the
 * caller's argument): the fold pass never treats it as a constant. */
void nd_graph_mark_input(nd_graph *g, const nd_tensor *t);
/* Plans the memory of an ended graph: the intermediates that only its
 * kernels see share buffers by liveness (graph_plan.c). */
nd_status nd_graph_plan(nd_graph *g);
/* Is a graph being captured on this thread (and not paused)? */
bool nd_graph_capturing(void);
/* "<op>: reads tensor values on the host ..." while capturing (outside an
 * op's own host checks): what Lua computes from such values, a replay would
 * never update (a graph break). ND_OK when not capturing. */
nd_status nd_graph_check_host_read(const char *op);
/* A graph break for another reason (why: "<op>: what runs that a replay would
 * not"): as nd_graph_check_host_read. ND_OK when not capturing. */
nd_status nd_graph_break(const char *why);
/* With fallback on, a graph break stops the recording (the ops go on
 * eagerly) and nd_graph_end fails with its reason, instead of the op that
 * read the values failing. */
void nd_graph_set_fallback(nd_graph *g, bool on);
/* Where the capture's host checks come from: fn(ud) gives the caller's source
 * position ("train.lua:42", or NULL) when a host check is recorded, so that a
 * replay refused by it names the line (the Lua bindings pass the Lua state's
 * current line). Called only while g captures. */
/* Whether a tensor object from before the capture that g's kernels use has
 * since got new memory (set_data_), changed requires_grad or got its first
 * tensor hook: a replay would go on as captured, so the graph must be
 * captured again; why gets the reason. Cheap to skip while
 * nd_meta_generation has not moved (every such change bumps it). */
bool nd_graph_stale(const nd_graph *g, char *why, size_t n);
typedef const char *(*nd_graph_where_fn)(void *ud);
void nd_graph_set_where(nd_graph *g, nd_graph_where_fn fn, void *ud);
/* Pauses (true) or resumes recording; returns whether it was paused. */
bool nd_graph_set_paused(bool paused);
/* Opaque nodes (an nd.autograd.Function's Lua forward or backward inside a
 * capture; docs/compile.md): with opaque on, the capture may record a call
 * of code the graph cannot see as one record that reads ins and writes outs
 * (whole fresh storages). A replay runs it through the hook: fn must fill
 * outs[0 .. nout) (same shapes and dtypes) from ins; id names the caller's
 * code (the bindings' Lua function), release(id) runs when the graph that
 * recorded it is freed (possibly where no Lua state runs). */
typedef nd_status (*nd_graph_opaque_fn)(const char *name, int64_t id, int kind, nd_tensor *const *ins,
                                        int nin, nd_tensor *const *outs, int nout);
void nd_graph_set_opaque_hooks(nd_graph_opaque_fn fn, void (*release)(int64_t id));
void nd_graph_set_opaque(nd_graph *g, bool on);
/* Whether the capture on this thread records opaque nodes (capturing and on). */
bool nd_graph_opaque_ok(void);
/* Records the opaque node (kind: 0 forward, 1 backward; name: the caller's,
 * copied). An entry of outs that is not a whole storage made during the
 * capture and new to the graph is replaced by a copy (made with the capture
 * paused); on ND_OK every outs[k] is a new reference the caller owns.
 * ND_ERR_UNSUPPORTED (nothing recorded, outs untouched) when more than 16
 * tensors or not capturing with opaque on. */
nd_status nd_graph_opaque(const char *name, int64_t id, int kind, nd_tensor *const *ins, int nin,
                          nd_tensor **outs, int nout);
size_t nd_graph_size(const nd_graph *g);
typedef struct {
    int64_t records, storages, leaves;
    int64_t internal_bytes;  /* bytes of the storages made during the capture (unplanned) */
    int64_t restored, restored_bytes; /* constants copied back before each replay */
    /* after nd_graph_plan: bytes of its shared buffers (how many), and of the
     * storages made inside that stay as they are (seen outside the graph) */
    int64_t planned_bytes, fixed_bytes, buffers;
    int64_t bound_bytes;  /* the least any plan could use: the most bytes live at once */
    int64_t captured;     /* records the capture made (the plan may add zero fills) */
    int64_t fused_runs;   /* fused elementwise kernels the fuse pass made */
    int64_t fused_rows;   /* row kernels (softmax, layer norm) it gave a fused prologue */
    int64_t fused_registers, fused_register_bytes; /* intermediates they never store (bytes) */
    int64_t prepared;            /* records replayed through prepared launches (OpenCL) */
    int64_t folded;              /* records in the prologue (the fold pass) */
    int64_t fold_sources;        /* the constants it reads (parameters, buffers) */
    int64_t refolds;             /* prologue runs at replays: a source had changed */
} nd_graph_stat;
void nd_graph_stats(const nd_graph *g, nd_graph_stat *out);
#define ND_GRAPH_REC_TENSORS 16 /* the most tensors a record has (a fused run's) */
typedef struct {
    const char *entry;   /* the backend entry ("binary", "matmul", ...) */
    const char *op;      /* the op that called it */
    const char *detail;  /* the registry op of elementwise/reduce entries, a fused
                          * run's ops ("mul+add+sigmoid"), else NULL */
    const char *device;  /* the backend's name, "host" for host checks */
    int ntensors;
    const nd_tensor *tensors[ND_GRAPH_REC_TENSORS];  /* borrowed, NULL where the call passed none */
    int roles[ND_GRAPH_REC_TENSORS];                 /* 1 read, 2 write, 3 read and write */
    int storage[ND_GRAPH_REC_TENSORS];               /* storage number within the graph, -1 for none */
    char storage_kind[ND_GRAPH_REC_TENSORS];         /* 'e' existed before, 'i' made inside, 'p' made inside and
                                   * placed by the memory plan, 'c' constant restored per replay,
                                   * 'f' folded: written by the prologue (the fold pass) */
    bool outside[ND_GRAPH_REC_TENSORS];
    int tune_size;     /* a fused kernel's tuned size (0: the default) and thread choice */
    int gemm_threads, gemm_mc, gemm_order, gemm_split; /* a product's tuned work split (backend.h gemm_hint; 0: default) */
    bool tune_serial;              /* made inside and, at the plan, also held outside the graph */
} nd_graph_rec_info;
nd_status nd_graph_record(const nd_graph *g, size_t i, nd_graph_rec_info *out);
/* The records' consistency after passes (graph_check.c): storage numbers,
 * roles, views inside their storages, whole writes, fused layers' slots;
 * an ND_ERR_INTERNAL error naming the record and slot when one fails. */
nd_status nd_graph_check(const nd_graph *g);
/* Autotuning of a planned graph's fused kernels and products (graph_tune.c): choices on
 * file (nd_cache_dir "compile/tune.txt") are applied; with seconds > 0 the
 * others are timed within that budget and the fastest exact choice kept and
 * written to the file. */
typedef struct {
    int64_t kernels, gemms;         /* fused kernels; products (a backend's that takes GEMM hints) */
    int64_t cached, tuned;          /* of both: choices from the file (or an equal one before); tuned now */
    int64_t untimed;                /* of both: left at their default, the budget spent (or 0 s) */
    double seconds, best_speedup;   /* time spent; the best default-over-tuned ratio */
} nd_graph_tune_stat;
nd_status nd_graph_tune(nd_graph *g, double seconds, nd_graph_tune_stat *out);

/* ---- distributed (src/dist/: MPI collectives on tensors) ----
 * Data-parallel training over MPI (Open MPI). nd_dist_init joins the job that
 * mpirun started; outside a launcher it makes a world of one process, where
 * every collective is local. Ranks are 0-based, as MPI's. The collectives are
 * collective: every rank calls the same ones in the same order. With check,
 * the ranks first exchange what they are about to do (collective, op, dtype,
 * shape, root) and all fail with one message naming the disagreeing ranks
 * instead of hanging or mixing buffers. Waiting is bounded by the timeout
 * (seconds; 0: none): past it a watchdog thread writes which collective
 * timed out on which rank to stderr and ends the process (_Exit), and
 * mpirun ends the job, since MPI cannot cancel a collective. Tensors of every
 * dtype go straight to MPI when contiguous on the cpu; others (strided,
 * OpenCL) are staged through a host copy. */
typedef enum { ND_DIST_SUM, ND_DIST_MEAN, ND_DIST_MAX, ND_DIST_MIN } nd_dist_op;
typedef struct nd_dist_work nd_dist_work; /* a collective in flight */
/* Built with MPI (CMake found it)? */
bool nd_dist_available(void);
/* Under a launcher (mpirun, srun)? Reads the environment only. */
bool nd_dist_launched(void);
nd_status nd_dist_init(double timeout_seconds);
bool nd_dist_initialized(void);
int nd_dist_rank(void);        /* 0 before init */
int nd_dist_world_size(void);  /* 1 before init */
int nd_dist_local_rank(void);  /* among the processes on this node */
int nd_dist_local_size(void);
double nd_dist_timeout(void);
void nd_dist_set_timeout(double seconds);
nd_status nd_dist_barrier(void);
/* With work NULL the call blocks until done; else *work is the collective
 * in flight: nd_dist_wait (or nd_dist_test until true) then nd_dist_free. */
nd_status nd_dist_all_reduce(nd_tensor *t, nd_dist_op op, bool check, nd_dist_work **work);
/* On a channel: 0 the default communicator, 1 one of its own for gradients,
 * whose calls keep their order among themselves whatever runs on channel 0
 * between them (DistributedDataParallel's buckets, started during a
 * backward in which SyncBatchNorm makes collectives of its own). */
nd_status nd_dist_all_reduce_on(nd_tensor *t, nd_dist_op op, bool check, int channel,
                                nd_dist_work **work);
nd_status nd_dist_broadcast(nd_tensor *t, int root, bool check, nd_dist_work **work);
/* out: {world_size, t's shape...}, on t's device (available after the wait) */
nd_status nd_dist_all_gather(const nd_tensor *t, bool check, nd_tensor **out, nd_dist_work **work);
/* t's first dim is world_size * n; out: {n, ...}, this rank's reduced block */
nd_status nd_dist_reduce_scatter(const nd_tensor *t, nd_dist_op op, bool check, nd_tensor **out,
                                 nd_dist_work **work);
nd_status nd_dist_wait(nd_dist_work *w);
/* done? (drives MPI's progress; an error is a failure status in *st) */
bool nd_dist_test(nd_dist_work *w, nd_status *st);
/* The result of a finished collective (a new reference): all_gather's and
 * reduce_scatter's new tensor, all_reduce's and broadcast's own tensor. */
nd_tensor *nd_dist_result(nd_dist_work *w);
/* Frees w; one still in flight is waited for first (under the timeout). */
void nd_dist_free(nd_dist_work *w);
nd_status nd_dist_finalize(void);
bool nd_dist_finalized(void);
/* Ends every process of the job (MPI_Abort); returns only without MPI. */
void nd_dist_abort(int code);

/* ---- Lua (declared without including lua.h) ---- */
struct lua_State;
int luaopen_needle(struct lua_State *L);
int luaopen_needle_core(struct lua_State *L);
/* Pushes a new Lua reference to t (t itself gets one more reference). */
void nd_lua_push_tensor(struct lua_State *L, nd_tensor *t);
/* The tensor at stack index idx, or NULL if it is not a needle tensor.
 * Borrowed: retain it to keep it beyond the userdata's life. */
nd_tensor *nd_lua_to_tensor(struct lua_State *L, int idx);

#ifdef __cplusplus
}
#endif
#endif
