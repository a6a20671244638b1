/* lt_internal.h - what the Lua binding files share: the tensor userdata,
 * argument conversion (1-based dims and indices), and error raising. Only
 * this layer raises Lua errors; the core returns nd_status. */
#ifndef ND_LT_INTERNAL_H
#define ND_LT_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include "tensor.h"

/* The userdata: one reference to a C tensor (NULL once closed). */
typedef struct { nd_tensor *t; } lt_box;

/* Raises "needle.<nd_last_error()>" (the core's message starts with the op). */
int lt_raise(lua_State *L);
/* Raises the core's error under the name the user called: "needle.<op>: "
 * followed by the core message without its own op prefix (constructors
 * reach the core through nd_empty/nd_full, whose names would mislead). */
int lt_raise_as(lua_State *L, const char *op);
#define LT_CHECK_AS(L, op, expr) do { if ((expr) != ND_OK) lt_raise_as(L, op); } while (0)
/* Raises "needle.<op>: <fmt...>" at the position of the innermost Lua frame
 * outside the package's own Lua files (the user's line). */
int lt_error(lua_State *L, const char *op, const char *fmt, ...);
/* Argument idx as a number / an integer, else "needle.<op>: <what> must be a
 * number (an integer), got ..." (luaL_check*'s "bad argument #2 to 'full'"
 * names neither needle's op nor the argument). */
double lt_arg_number(lua_State *L, int idx, const char *op, const char *what);
lua_Integer lt_arg_integer(lua_State *L, int idx, const char *op, const char *what);
/* Arguments past `last` must be nil: else "needle.<op>: <usage>, got an extra
 * argument #k (<type>)", as options.no_extra in Lua. */
void lt_no_extra(lua_State *L, int last, const char *op, const char *usage);
/* The error of a binding called with a non-nil argument at idx that it does
 * not take: "needle.<name>: takes <name>(<params>) only, got an extra
 * argument #idx (<type>)[; <hint>]", or, for a method call (x:sum(...)),
 * "takes x:sum(<params after self>) only" with idx counted after self, as
 * Lua's own argument errors count. params lists the parameters, self
 * first ("x[, dim, keepdim]"); hint may be NULL. lt_register's wrappers
 * raise it; a binding whose arguments depend on each other (an options
 * table that ends the list where it stands) raises it itself. */
int lt_extra_arg(lua_State *L, const char *name, const char *params, const char *hint, int idx);
/* Arguments past `last` must be nil, else lt_extra_arg for the first that is not. */
void lt_no_extra_arg(lua_State *L, int last, const char *name, const char *params);
/* core._set_library_root(prefix): where the package's Lua files are, when
 * they are loaded from files rather than embedded (needle.errors sets it). */
int lt_set_library_root(lua_State *L);

/* lt_suggest.c: the closest of some names to a misspelt word, for "did you
 * mean ...?": edits, a swap of two neighbours counting as one, at most 1 for
 * a word of up to 4 letters, 2 up to 8, 3 beyond; a difference of case only
 * is closest of all; ties go to the first in byte order (not to a table's
 * iteration order); names starting with '_' only for a word that does. */
#define LT_NAME_MAX 48
typedef struct {
    const char *word;
    size_t len;
    int best_d;
    char best[LT_NAME_MAX]; /* "" while no name is close enough */
} lt_closest;
void lt_closest_init(lt_closest *c, const char *word, size_t len);
/* true when name is the closest so far */
bool lt_closest_add(lt_closest *c, const char *name, size_t n);
/* adds the string keys of the table at idx */
void lt_closest_add_keys(lua_State *L, lt_closest *c, int idx);
/* core._closest(word, names): the name of the list (or key of the set), or nil */
int lt_closest_fn(lua_State *L);
#define LT_CHECK(L, expr) do { if ((expr) != ND_OK) lt_raise(L); } while (0)

/* The file name at idx (lt_io.c): a string, not empty, without a NUL byte
 * (the C library would stop at it and use another file), else a Lua error
 * "needle.<op>: path ...". */
const char *lt_check_path(lua_State *L, int idx, const char *op);

/* Pushes a tensor, taking over the caller's reference (t may not be NULL). */
void lt_push(lua_State *L, nd_tensor *t);
/* Tensor at idx or NULL. */
nd_tensor *lt_to(lua_State *L, int idx);
/* Tensor at idx or a Lua error naming op and the argument. */
nd_tensor *lt_check(lua_State *L, int idx, const char *op);
/* A tensor from a tensor, number, boolean or nested table at idx. The
 * result is BORROWED: a converted value is pushed onto the Lua stack as a
 * userdata that owns it, so a Lua error raised later in the caller cannot
 * leak it. (Use positive stack indices after calling this.) dt is the dtype
 * for numbers and tables. */
nd_tensor *lt_check_tensor_like(lua_State *L, int idx, const char *op, nd_dtype dt);
nd_tensor *lt_check_index_on(lua_State *L, int idx, const char *op, nd_device target);
/* Integers (indices, class labels) at idx: an integer tensor as it is, or a
 * number or nested table of integers as a new int64 tensor (borrowed, as
 * above). A fraction, a boolean or a float tensor is an error naming op and
 * what ("labels", "index values"); values are not range-checked. */
nd_tensor *lt_check_ints_like(lua_State *L, int idx, const char *op, const char *what);
/* Class labels 1..C (or *ignore, when ignore is not NULL) for the n rows of
 * op's input, from an integer tensor or a table at idx: checked in 1-based
 * terms (errors name the label, its row and 1..C), then as a new 0-based
 * int64 tensor on the tensor's device (a table: on target); labels equal to
 * *ignore become *ignore0 (ignore - 1 within 1..C, else -1; INT64_MIN without
 * ignore), which is the core's ignore_index. Labels of another shape than
 * {n} come back unchecked, for the op to refuse. Borrowed, as above. */
nd_tensor *lt_check_labels_on(lua_State *L, int idx, const char *op, int64_t n, int64_t C,
                              const int64_t *ignore, nd_device target, int64_t *ignore0);
/* The number or boolean at idx: Lua integers stay exact (64 bits), floats
 * are floats, booleans are 0/1. */
nd_number lt_to_number(lua_State *L, int idx);
/* The same, with a table or number made on device dev (an operand next to a
 * tensor on dev); a tensor is returned as it is. */
nd_tensor *lt_check_tensor_like_on(lua_State *L, int idx, const char *op, nd_dtype dt,
                                   nd_device dev);

/* 1-based (negative from the end) Lua dim -> the core's dim (may stay
 * negative: the core normalises and range-checks). 0 is an error. */
int lt_dim(lua_State *L, int idx, const char *op);
int lt_opt_dim(lua_State *L, int idx, const char *op, int def_core_dim);
int lt_dim_value(lua_State *L, lua_Integer d, const char *op);
/* Reads a shape from a table at idx or from integers idx..top. */
int lt_shape(lua_State *L, int idx, const char *op, int64_t *shape, bool allow_minus1);
/* Reads a list of dims (number or table) at idx into core dims; returns count. */
int lt_dims(lua_State *L, int idx, const char *op, int *dims);
/* Options table: dtype (default def), returns it; device must be cpu. */
nd_dtype lt_opt_dtype(lua_State *L, int idx, const char *op, nd_dtype def);
/* The device named at idx ("cpu", "opencl", "opencl:N"); errors name op. */
nd_device lt_device_name(lua_State *L, int idx, const char *op);
/* opts.device of the options table at idx (def when absent or no table). */
nd_device lt_opt_device(lua_State *L, int idx, const char *op, nd_device def);
nd_device lt_check_device(lua_State *L, int opts_idx, const char *op); /* def cpu */
/* Pushes t's elements in host memory (t itself on the cpu) and returns them. */
nd_tensor *lt_push_host(lua_State *L, nd_tensor *t, const char *op);
/* Pushes t (consuming the caller's reference) after moving it to d. */
void lt_push_on(lua_State *L, nd_tensor *t, nd_device d, const char *op);
/* A table argument is an options table when it has named fields
 * ({correction=0}), data or a list of dims otherwise ({1, 3}). */
bool lt_is_options(lua_State *L, int idx);
nd_dtype lt_check_dtype_name(lua_State *L, int idx, const char *op);

/* lt_options.c - options tables (PyTorch's keyword arguments). The table at
 * idx must be absent, nil or a plain table whose keys are all in `valid` (a
 * NULL-terminated list); otherwise raises "needle.<op>: unknown option 'k'
 * (valid: a, b, c)" (the valid keys sorted) or "expected an options table".
 * Returns idx as an absolute index, or 0 when there is no table. */
int lt_options(lua_State *L, int idx, const char *op, const char *const *valid);
/* opts[field] (opts from lt_options; 0: def) as a boolean; another type
 * raises "needle.<op>: option '<field>' must be a boolean, got <type>". */
bool lt_opt_bool(lua_State *L, int opts, const char *op, const char *field, bool def);

/* An int64 tensor of 0-based indices from 1-based Lua indices (tensor or
 * table at idx). Borrowed: owned by a userdata pushed onto the stack. */
nd_tensor *lt_check_index(lua_State *L, int idx, const char *op);
/* Adds 1 to an int64 tensor of 0-based indices (in place) and pushes it. */
void lt_push_index(lua_State *L, nd_tensor *t);

/* Registration of each area's methods/functions (called by luaopen_needle_core):
 * methods go into the table at -2 (tensor methods), functions into -1 (module). */
void lt_register_tensor(lua_State *L);
void lt_register_device(lua_State *L);
void lt_register_opencl_tune(lua_State *L);
void lt_register_construct(lua_State *L);
void lt_register_math(lua_State *L);
void lt_register_shape(lua_State *L);
void lt_register_index(lua_State *L);
void lt_register_autograd(lua_State *L);
void lt_register_nn(lua_State *L);  /* lt_nn.c: conv, pooling, dilate */
void lt_register_io(lua_State *L);  /* lt_io.c: bytes, gunzip, atomic writes, safetensors */
void lt_register_torch(lua_State *L); /* lt_torch.c: load_torch, null */
void lt_register_profile(lua_State *L); /* lt_profile.c: the C half of nd.profile */
void lt_register_optim(lua_State *L);   /* lt_optim.c: fused optimizer updates */
void lt_register_graph(lua_State *L);   /* lt_graph.c: the C half of nd.compile */
void lt_register_dist(lua_State *L);    /* lt_dist.c: the C half of nd.distributed */
void lt_register_linalg(lua_State *L);  /* lt_linalg.c: the C half of nd.linalg */
void lt_register_workers(lua_State *L); /* lt_workers.c: DataLoader worker threads */

/* One binding: name = fn in the tensor methods table (method) and/or the
 * module table (function), one value for both.
 *
 * Arity: lt_register wraps fn in a C closure that refuses a non-nil
 * argument past max_args (self counted for a method) with lt_extra_arg
 * before fn runs, drops trailing nils past it, and calls fn directly (a
 * plain C call in the same frame: errors, where-info and debug.getinfo
 * see the binding). Trailing nils are allowed everywhere (an optional value
 * handed along does no harm).
 *   max_args   the most arguments fn reads (0: none); LT_VARARGS for a
 *              function that takes any number (nd.no_grad(fn, ...)) or
 *              checks its own (the constructors' shapes): registered bare
 *   usage      fn's parameters, self first, for the error: "x[, dim, keepdim]"
 *              (required for every entry: lt_register refuses an entry
 *              without one, so a new binding cannot go unchecked by mistake)
 *   hint       optional words after the error ("the tanh form: ...")
 *   sizes_at   0, or the position of a shape or dim list that may also come
 *              as numbers (x:view(2, 3) or x:view({2, 3})): the numbers
 *              there count as one argument of max_args
 * A name registered twice (in one table or in two) keeps the last entry. */
typedef struct {
    const char *name;
    lua_CFunction fn;
    bool method, function;
    int max_args;
    const char *usage;
    const char *hint;
    int sizes_at;
} lt_reg;
#define LT_VARARGS (-1)

/* t[k] = v for the table on top of the stack (building result tables). */
static inline void lt_set_int(lua_State *L, const char *k, lua_Integer v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}
static inline void lt_set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}
static inline void lt_set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}
static inline void lt_set_bool(lua_State *L, const char *k, bool v) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}
void lt_register(lua_State *L, int methods_idx, int module_idx, const lt_reg *regs);
/* Pushes the function lt_register would set for the (static) entry r: for
 * methods of other userdata (a hook handle's remove, a graph's replay). */
void lt_push_binding(lua_State *L, const lt_reg *r);

#endif
