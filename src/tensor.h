/* tensor.h - internal definitions of the tensor, its storage and the helpers
 * every op shares. Public API: needle.h. */
#ifndef ND_TENSOR_H
#define ND_TENSOR_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "needle.h"

typedef struct nd_storage {
    atomic_int refcount;
    nd_device_type device;
    int device_index;   /* which OpenCL device (0 on the cpu) */
    size_t nbytes;
    void *data;         /* host memory, or the device's buffer handle (cl_mem) */
    /* Bumped by every in-place write; autograd compares it at backward time. */
    uint64_t version;
    /* Order of creation (nd_storage_serial): a graph capture tells the
     * storages made during it from those that existed before. (0 for every
     * storage made while no capture runs: not an identity.) */
    uint64_t serial;
    /* An identity unique for the process's life, given on first asking
     * (nd_storage_id; 0 until then): caches keyed by it cannot mistake a
     * new storage at a freed one's address for the old one. */
    _Atomic uint64_t id;
    /* References a capturing graph holds (graph.c); when the count of all
     * references drops to it, nd_storage_idle_hook runs: the graph may give
     * the memory back while it captures, as eager would (0: no graph). */
    atomic_int graph_refs;
    /* Borrowed memory: release(ctx) instead of returning data to the cache. */
    void (*release)(void *ctx);
    void *release_ctx;
} nd_storage;

struct nd_node; /* autograd graph node (autograd issue) */

/* Set by the engine (nd_set_tensor_hook_callback): called with a hooked leaf
 * or node (nd_hook_tensor) as it is freed, on whichever thread frees it, so
 * the hooks kept for it elsewhere can go. */
extern void (*nd_hook_key_freed)(const void *key);

struct nd_tensor {
    atomic_int refcount;
    int ndim;
    nd_dtype dtype;
    int64_t shape[ND_MAX_DIMS];
    int64_t strides[ND_MAX_DIMS]; /* in elements; 0 for broadcast dims */
    int64_t offset;               /* in elements */
    nd_storage *storage;
    /* autograd */
    bool requires_grad;
    bool grad_hook;              /* nd_set_grad_hook: report when its grad is complete */
    bool tensor_hooks;           /* nd_hook_tensor on a leaf: its gradient passes the hooks */
    int grad_mark, grad_pending; /* a backward's count of contributions still to come */
    nd_tensor *grad;
    struct nd_node *grad_fn;
};

/* ---- errors (status.c) ---- */
/* Sets the thread-local message and returns the status, so call sites read
 * `return nd_fail(ND_ERR_SHAPE, "matmul: ...", ...)`. */
nd_status nd_fail(nd_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<op>: not supported for dtype <dt>": a backend with no kernel for a dtype
 * the op layer should have converted first (one message on every device). */
nd_status nd_fail_dtype_kernel(const char *op, nd_dtype dt);
/* Formats a shape as "{2,3}" into buf (at least 200 bytes). */
const char *nd_shape_str(const int64_t *shape, int ndim, char *buf);
#define ND_SHAPE_BUF 200
/* Formats a byte count for people ("4.0 TiB", "512 bytes") into buf. */
const char *nd_bytes_str(uint64_t n, char *buf);
#define ND_BYTES_BUF 32
/* memory_limit.c: the bound (nd_memory_limit) as seen under a root
 * directory ("" for this system; tests use a fake tree) and what set it
 * ("physical memory plus swap", "the memory limit of its cgroup", "unknown"). */
int64_t nd_memory_limit_at(const char *root, const char **source);
const char *nd_memory_limit_source(void);
/* The directory of what needle measured on this machine, with sub appended
 * and created (cache_dir.c): $NEEDLE_CACHE_DIR/sub, else
 * $XDG_CACHE_HOME/needle/sub, else ~/.cache/needle/sub. False when there is
 * none (no variable set, too long, not creatable). */
bool nd_cache_dir(const char *sub, char *out, size_t n);
int nd_mkdirs(const char *path); /* mkdir -p; 0 on success */
/* Dims and indices in messages are written with ND_IXF ("%lld" between
 * markers) and a 0-based value: nd_last_error() shows them as they are (C is
 * 0-based), nd_last_error_based(1) adds 1 to the non-negative ones for the Lua
 * layer, so each side reads the dims it actually wrote. */
#define ND_IXF "\x01%lld\x02"
#define ND_IX(v) ((long long)(v))
const char *nd_last_error_based(int base);
/* The message as nd_fail wrote it, index markers and all: for a caller that
 * adds to it (nd_fail(st, "%s ...", copy)) and keeps the markers. */
const char *nd_last_error_raw(void);
/* "<op>: index V is out of bounds for dim D with size N (at position {..} of
 * the index tensor)": the error every backend gives for an index value out of
 * [0, limit); flat_pos is the value's row-major position in `index`. */
nd_status nd_fail_index_bounds(const char *op, const nd_tensor *index, int64_t flat_pos,
                               int64_t value, int dim, int64_t limit);
#define ND_TRY(expr) do { nd_status st_ = (expr); if (st_ != ND_OK) return st_; } while (0)

/* A counter bumped whenever a tensor gets other memory (set_data_) or its
 * requires_grad flips: nd.compile's guards recheck parameters only when it
 * moved (tensor.c). */
uint64_t nd_meta_generation(void);
void nd_bump_meta_generation(void);

/* ---- storage (storage.c) ---- */
nd_status nd_storage_new(size_t nbytes, nd_storage **out);
/* On any device (its backend allocates); the message names the device. */
nd_status nd_storage_new_on(nd_device dev, size_t nbytes, nd_storage **out);
void nd_storage_retain(nd_storage *s);
/* The serial of the storage made last (each new storage takes the next, or
 * 0 while no capture runs: see nd_captures_running). */
uint64_t nd_storage_serial(void);
uint64_t nd_storage_next_serial(void);
/* s's identity (the id field), made on the first call for s. */
uint64_t nd_storage_id(nd_storage *s);
/* Graph captures running on all threads (graph.c counts them): when 0, the
 * capture checks on every op's path are one relaxed load. */
extern atomic_int nd_captures_running;
void nd_storage_release(nd_storage *s);
extern void (*nd_storage_idle_hook)(nd_storage *s);
/* Frees s's memory (not borrowed memory) and leaves s without data: only a
 * capturing graph does this, to a storage only it still refers to. */
void nd_storage_drop_data(nd_storage *s);
/* Gives a storage whose data was dropped memory again (contents undefined):
 * the fold pass keeps what it computes once across replays. */
nd_status nd_storage_refill_data(nd_storage *s);
/* caching allocator (alloc_cache.c) */
void *nd_cache_alloc(size_t nbytes);
void nd_cache_free(void *p, size_t nbytes);

/* ---- tensor helpers (tensor.c) ---- */
/* The size rule every tensor obeys, however it is made (constructors, op
 * results, views, files): sizes are >= 0 and their product, with each 0
 * counted as 1, is at most ND_MAX_NUMEL = 2^48. Then the element count,
 * every contiguous stride, every product of some of the sizes and every
 * byte count (x 8) fit in int64 with room to spare, empty tensors included,
 * and numel/stride arithmetic needs no overflow checks. nd_check_shape
 * applies it (errors name op) and gives the element count; every path that
 * makes a shape from user input or other shapes calls it (or nd_empty_on,
 * nd_expand, nd_broadcast_shape, reshape/view, which do). */
#define ND_MAX_NUMEL ((int64_t)1 << 48)
nd_status nd_check_shape(const char *op, const int64_t *shape, int ndim, int64_t *numel);
/* The matching rule for strides that come from outside (a file's view of a
 * storage): each is >= 0 and stride * (size - 1) is at most 2^48 (stride at
 * most 2^48 for dims of size 0 or 1), so stride * size and offsets summed
 * over the dims fit in int64. needle's own views of tensors within these
 * bounds stay within a small multiple of them (slices, unsqueeze). */
nd_status nd_check_strides(const char *op, const int64_t *shape, const int64_t *strides,
                           int ndim);
/* A new header over `storage` (retained) with the given geometry. */
nd_status nd_tensor_wrap(nd_storage *storage, nd_dtype dt, const int64_t *shape,
                         const int64_t *strides, int ndim, int64_t offset, nd_tensor **out);
/* A view of t with new geometry, same storage. */
nd_status nd_tensor_view_of(const nd_tensor *t, const int64_t *shape, const int64_t *strides,
                            int ndim, int64_t offset, nd_tensor **out);
void nd_contiguous_strides(const int64_t *shape, int ndim, int64_t *strides);
int64_t nd_shape_numel(const int64_t *shape, int ndim);
/* Normalises a possibly negative dim for a tensor of rank ndim. */
nd_status nd_norm_dim(const char *op, int dim, int ndim, int *out);
static inline bool nd_on_cpu(const nd_tensor *t) { return t->storage->device == ND_DEVICE_CPU; }
static inline bool nd_same_device(const nd_tensor *a, const nd_tensor *b) {
    return a->storage->device == b->storage->device &&
           a->storage->device_index == b->storage->device_index;
}
/* "op: <what> are on different devices (cpu and opencl:0)" unless a and b share one. */
nd_status nd_check_same_device(const char *op, const nd_tensor *a, const nd_tensor *b);
/* Fails naming `name` when OpenCL device `index` does not exist (or none does). */
nd_status nd_check_opencl_index(int index, const char *name);
/* t's elements in host memory: t itself (new reference) on the cpu, else a
 * contiguous cpu copy (waits for the device). For checks that must read
 * values (labels, indices) and for printing. */
nd_status nd_to_host(const nd_tensor *t, nd_tensor **out);
/* Host pointer to t's first element: CPU tensors only. */
static inline char *nd_ptr(const nd_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)nd_dtype_size(t->dtype);
}
static inline void nd_bump_version(nd_tensor *t) { t->storage->version++; }

/* In-place writes are refused when several elements share one memory
 * location (an expanded view): the result would depend on write order. */
nd_status nd_check_writable(const char *op, const nd_tensor *t);
/* In-place writes into a tensor that requires grad would silently corrupt
 * the gradient graph: refused while grad mode is on (optimizers update
 * parameters under no_grad). */
nd_status nd_check_inplace_grad(const char *op, const nd_tensor *t);
/* NumPy broadcasting of two shapes (ops/broadcast.c); errors name op. */
nd_status nd_broadcast_shape(const char *op, const int64_t *a, int na, const int64_t *b, int nb,
                             int64_t *out, int *nout);
/* t expanded to shape (a new reference; t itself when the shape already matches). */
nd_status nd_expand_to(const nd_tensor *t, const int64_t *shape, int ndim, nd_tensor **out);
/* t converted to dt (a new reference; t itself when already dt). */
nd_status nd_as_dtype(const nd_tensor *t, nd_dtype dt, nd_tensor **out);
/* The half types (float16, bfloat16) are storage: an op computes them in
 * float32, as elementwise ops and matmul do (ops/op_copy.c). For an op
 * whose operands in[0..n) are floating point (NULLs skipped; in[0] the
 * input): when one of them is a half type, cv[i] is in[i] converted
 * (differentiably) to the compute dtype - the input's when it is float32 or
 * float64, else float64 when an operand is float64, else float32 - where
 * in[i] is a half type, else NULL, and *any is true; else every cv[i] is
 * NULL and *any false. Other dtypes (a float32 / float64 mix included) are
 * left to the op's own checks.
 * nd_half_release releases cv[0..n). */
nd_status nd_half_operands(int n, const nd_tensor *const *in, nd_tensor **cv, bool *any);

/* t itself (a new reference) when its last dim is unit-stride, else a
 * contiguous copy (op_copy.c): what kernels that walk rows need, without
 * copying views that already are (split heads, a narrow of a state) */
nd_status nd_unit_rows(const nd_tensor *t, nd_tensor **out);
void nd_half_release(int n, nd_tensor **cv);
/* An op's first lines for its operands x, w, b (any may be NULL but x):
 * when one is a half type, returns call - an expression written with HX,
 * HW and HB, the operands as the op computes them (converted or as given) -
 * with the conversions released after. */
#define ND_RETURN_IF_HALF3(x, w, b, call)                                                           \
    do {                                                                                            \
        const nd_tensor *in_[3] = {(x), (w), (b)};                                                  \
        nd_tensor *cv_[3];                                                                          \
        bool half_;                                                                                 \
        ND_TRY(nd_half_operands(3, in_, cv_, &half_));                                              \
        if (half_) {                                                                                \
            const nd_tensor *HX = cv_[0] ? cv_[0] : in_[0], *HW = cv_[1] ? cv_[1] : in_[1];         \
            const nd_tensor *HB = cv_[2] ? cv_[2] : in_[2];                                         \
            nd_status st_ = (call);                                                                 \
            nd_half_release(3, cv_);                                                                \
            return st_;                                                                             \
        }                                                                                           \
    } while (0)

/* A number from the caller, integer or floating: integers stay exact up
 * to 64 bits (a double holds only 53). */
typedef struct { bool is_int; int64_t i; double f; } nd_number;
static inline nd_number nd_num_f(double f) { nd_number n = {false, 0, f}; return n; }
static inline nd_number nd_num_i(int64_t i) { nd_number n = {true, i, (double)i}; return n; }
/* Stores n into one element of dtype dt at p: exact where it fits, else
 * the conversion rule (truncate toward zero, saturate, NaN -> 0). */
void nd_store_number(void *p, nd_dtype dt, nd_number n);
/* Is n exactly a value of dt: for an integer dtype an integer (no fraction,
 * no NaN) within its range? Always true for the floating and bool dtypes. */
bool nd_number_fits(nd_dtype dt, nd_number n);
/* "op: value 300 is out of range for uint8 (0..255)" or "op: value 2.5 is
 * not an integer (...)" unless n fits dt: a number given for an integer
 * tensor (fill, full, tables, x[i] = v) is stored exactly or refused, never
 * clamped or truncated (tensor conversions are what truncate). */
nd_status nd_check_number_fits(const char *op, nd_dtype dt, nd_number n);
nd_status nd_fill_number_(nd_tensor *dst, nd_number v);
nd_status nd_binary_number(nd_binary_op op, const nd_tensor *a, nd_number s, int scalar_first,
                           nd_tensor **out);
nd_status nd_binary_number_(nd_binary_op op, nd_tensor *a, nd_number s);
int64_t nd_load_i64(const void *p, nd_dtype dt);

/* ---- dtypes (dtype.c) ---- */
nd_dtype nd_promote(nd_dtype a, nd_dtype b);
int nd_dtype_is_int(nd_dtype dt); /* int64, int32, uint8 (not bool) */
/* Reads/writes one element of dtype dt at p as a double. Writing into an
 * integer dtype truncates toward zero and saturates at its range, NaN -> 0;
 * into bool, anything but 0 (NaN included) is true. */
double nd_load_f64(const void *p, nd_dtype dt);
void nd_store_f64(void *p, nd_dtype dt, double v);
float nd_half_to_float(uint16_t h);
uint16_t nd_float_to_half(float f);
float nd_bf16_to_float(uint16_t h);
uint16_t nd_float_to_bf16(float f);

/* ---- threads ---- */
/* Elementwise loops go parallel above this many elements. */
#define ND_PARALLEL_THRESHOLD 32768

#endif
