/* ocl_runtime.h - the OpenCL backend's runtime: devices, programs, kernels,
 * buffers and launches. Kernel families (ocl_*.c) build on this.
 *
 * - Devices: every device of every platform, in platform order; one context
 *   and one in-order queue each. Launches are asynchronous; the host waits
 *   only when it reads (ocl_read) or synchronizes.
 * - Programs: kernels/<file>.cl (embedded at build time) compiled with
 *   kernels/common.cl in front and a defines string (-DT=float ...), once
 *   per device; binaries are cached on disk (see ocl_program.c).
 * - Buffers: a per-device pool of freed cl_mem by size (ocl_pool.c); an
 *   allocation past the device's memory is an ND_ERR_MEMORY error.
 * - Tensors on OpenCL: storage->data is the cl_mem, offsets are in elements
 *   and are passed to kernels as arguments (no sub-buffers).
 *
 * Kernel objects hold their arguments, so OpenCL tensors must be used from
 * one thread at a time (as the Lua state that owns them is). */
#ifndef ND_OCL_RUNTIME_H
#define ND_OCL_RUNTIME_H

#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include "../../backend.h"

typedef struct ocl_cached_program ocl_cached_program;
typedef struct ocl_cached_kernel ocl_cached_kernel;
typedef struct ocl_pool_block ocl_pool_block;

typedef struct ocl_device {
    int index;
    cl_platform_id platform;
    cl_device_id id;
    cl_context ctx;
    cl_command_queue queue;
    nd_opencl_info info;
    size_t max_wg;            /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    size_t local_mem;         /* bytes of local memory per work-group */
    bool fp32_rounded_div_sqrt; /* CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT: ocl_program.c asks for it */
    ocl_cached_program *programs;
    ocl_cached_kernel *kernels;
    /* buffer pool */
    ocl_pool_block *pool;
    size_t pool_bytes;
    size_t live_bytes;        /* bytes in live buffers (pool excluded) */
    /* tuned GEMM parameters (ocl_gemm.c); loaded lazily */
    void *gemm_config;
} ocl_device;

/* ---- devices (ocl_runtime.c) ---- */
int nd_ocl_device_count(void);
/* kernels enqueued so far, all devices (nd_backend.launch_count) */
uint64_t nd_ocl_launch_count(void);
const char *nd_ocl_unavailable_reason(void);
nd_status nd_ocl_device_info(int index, nd_opencl_info *out);
/* NEEDLE_OPENCL_DEVICE (an index or part of a device name), else the first
 * GPU, else device 0. */
nd_status nd_ocl_default_device(int *index);
/* Device `index` (initialised; NULL when out of range). */
ocl_device *ocl_device_at(int index);
static inline ocl_device *ocl_dev(const nd_tensor *t) { return ocl_device_at(t->storage->device_index); }
static inline cl_mem ocl_mem(const nd_tensor *t) { return (cl_mem)t->storage->data; }

/* ---- errors ---- */
const char *ocl_error_name(cl_int err);
/* "<op>: OpenCL <what> failed on <device>: CL_..." (ND_ERR_MEMORY for the
 * out-of-memory codes, ND_ERR_DEVICE otherwise). */
nd_status ocl_fail(cl_int err, const char *op, const char *what, const ocl_device *d);
/* float64 needs cl_khr_fp64; every dtype else works everywhere. */
nd_status ocl_check_dtype(const ocl_device *d, nd_dtype dt, const char *op);
/* The OpenCL C type name of a dtype ("float", "double", "long", "int",
 * "uchar" for uint8 and bool, "ushort" for float16/bfloat16). */
const char *ocl_type_name(nd_dtype dt);
/* "-DT=<type> -DT_FLOAT=<0|1> -DT_ID=<dtype number>" for a kernel on dtype dt. */
void ocl_dtype_defines(nd_dtype dt, char *buf, size_t n);

/* ---- programs and kernels (ocl_program.c) ---- */
/* Kernel `name` of kernels/<file>.cl built with `defines`; cached per device.
 * A build failure returns the compiler's log in the error. */
nd_status ocl_kernel(ocl_device *d, const char *file, const char *defines, const char *name,
                     cl_kernel *out);
/* A kernel of generated source (common.cl, the registry's cases and
 * kernels/ew_ops.cl come in front of body), cached like the files' ones:
 * in memory by (defines, body), on disk by its hash; label names it in
 * file names and errors. */
nd_status ocl_kernel_generated(ocl_device *d, const char *label, const char *defines,
                               const char *body, const char *name, cl_kernel *out);
/* Bumped by ocl_forget_programs: a kernel kept from an older generation is
 * gone. */
uint64_t ocl_programs_generation(void);
/* The embedded source of kernels/<file>.cl (NULL if there is none). */
const char *ocl_source(const char *file);
/* The registry's elementwise ops as OpenCL C (ocl_registry_source.c),
 * compiled in front of every program after kernels/common.cl. */
extern const char ocl_registry_source[];
bool ocl_unary_has_kernel(nd_unary_op op, nd_dtype dt);
bool ocl_binary_has_kernel(nd_binary_op op, nd_dtype dt);
bool ocl_binary_is_comparison(nd_binary_op op);
/* Drops every cached program binary of this process's devices from disk
 * and memory (tests; nd.opencl.clear_cache()). */
void ocl_forget_programs(ocl_device *d);
/* The on-disk cache directory (created on demand): NEEDLE_CACHE_DIR, else
 * $XDG_CACHE_HOME/needle, else ~/.cache/needle; + "/opencl". NULL if none. */
const char *ocl_cache_dir(void);

/* ---- launches ---- */
/* clSetKernelArg, noted while a call is being prepared (ocl_prepared.c):
 * every kernel argument goes through it. */
cl_int ocl_set_arg(cl_kernel k, cl_uint index, size_t size, const void *value);
/* Sets argument i to the bytes of v (the kernel's declared type). */
#define OCL_ARG(k, i, v) ocl_set_arg((k), (i), sizeof(v), &(v))
/* Enqueues k over `global` items (rounded up to a multiple of `local`;
 * local 0 lets the driver choose). Kernels guard their own bounds. */
nd_status ocl_launch(ocl_device *d, cl_kernel k, const char *op, int dims, const size_t *global,
                     const size_t *local);
/* One-dimensional launch over n items with a work-group of 256 (or the
 * device maximum), the shape every elementwise kernel uses. */
nd_status ocl_launch_1d(ocl_device *d, cl_kernel k, const char *op, int64_t n);

/* The largest power-of-two work-group size <= limit that the device and the
 * kernel allow (kernels with local arrays of `limit` elements use it). */
size_t ocl_max_group(ocl_device *d, cl_kernel k, size_t limit);

/* ---- prepared launches (ocl_prepared.c; backend.h prepare_begin) ---- */
/* What a call does while it is being prepared: the commands it enqueues
 * (ocl_launch notes its launches itself), or something a prepared replay
 * could not repeat (host reads and writes, allocations, waits). */
void ocl_prepare_note_launch(ocl_device *d, cl_kernel k, const char *op, cl_uint dims,
                             const size_t *global, const size_t *local);
void ocl_prepare_note_fill(ocl_device *d, cl_mem dst, const void *pattern, size_t pattern_size,
                           size_t off, size_t size);
void ocl_prepare_note_copy(ocl_device *d, cl_mem src, cl_mem dst, size_t src_off, size_t dst_off,
                           size_t size);
void ocl_prepare_impure(void);
/* Counts one kernel launch (nd.opencl.launches()). */
void ocl_count_launch(void);
nd_status ocl_prepare_begin(void);
void *ocl_prepare_end(bool keep);
bool ocl_prepared_equal(const void *a, const void *b);
nd_status ocl_prepared_run(void *p);
void ocl_prepared_free(void *p);

/* ---- device time per command (ocl_timing.c; nd.opencl.timing) ---- */
bool ocl_timing_on(void);
/* The event to pass to an enqueue: &ev while timing is on, else NULL. */
#define OCL_TIMING_EVENT(ev) (ocl_timing_on() ? &(ev) : NULL)
/* Keeps ev (NULL: nothing) to be read later under "<op> <function> [global]". */
void ocl_timing_note(cl_event ev, const char *function, const char *op, cl_uint dims,
                     const size_t *global);
void ocl_timing_note_kernel(cl_event ev, cl_kernel k, const char *op, cl_uint dims,
                            const size_t *global);
nd_status nd_ocl_timing(bool on);
nd_status nd_ocl_kernel_times(const nd_opencl_kernel_time **rows, int *n);

/* ---- buffers (ocl_pool.c) ---- */
nd_status ocl_alloc(int index, size_t nbytes, void **handle);
void ocl_free(int index, void *handle, size_t nbytes);
/* Returns pooled buffers to the driver. */
void ocl_pool_drain(ocl_device *d);
nd_status ocl_read(const nd_storage *s, size_t off, void *dst, size_t n);
nd_status ocl_write(nd_storage *s, size_t off, const void *src, size_t n);
nd_status ocl_synchronize(int index);
/* A device buffer with n bytes copied from host memory (for small argument
 * arrays). The caller releases it (clReleaseMemObject) after enqueueing: the
 * queue keeps it alive until the kernel ran. */
nd_status ocl_upload(ocl_device *d, const void *src, size_t n, const char *op, cl_mem *out);

/* ---- geometry of strided operands ----
 * Up to 4 operands (0 = output) of one shape, each with its own strides and
 * element offset. ocl_geom_make merges dims that are contiguous in every
 * operand and drops size-1 dims, so the common cases become 1-D. Passed
 * to kernels by value as `nd_geom` (kernels/common.cl). */
typedef struct {
    cl_long shape[ND_MAX_DIMS];
    cl_long strides[4][ND_MAX_DIMS];
    cl_long offset[4];
    cl_int ndim;
    cl_int pad_;
} ocl_geom;
void ocl_geom_make(ocl_geom *g, int nops, const nd_tensor *const *ops);
/* The merging behind it, for any number of operands: fills shape[0 .. nd)
 * and strides[k][0 .. nd) (elements) and returns nd (>= 1). */
int ocl_merge_dims(int nops, const nd_tensor *const *ops, int64_t *shape,
                   int64_t (*strides)[ND_MAX_DIMS]);
/* True when every operand is contiguous from its offset after merging
 * (kernels can then index plainly with offset + i). */
bool ocl_geom_is_flat(const ocl_geom *g, int nops);

#endif
