/* pickle.h - a restricted unpickler for what torch.save writes.
 *
 * It reads protocols 2 to 5 (and the protocol-less 0/1 opcodes a protocol-2
 * stream may contain) and builds a tree of nd_pk values. It never calls
 * anything: GLOBAL / STACK_GLOBAL resolve only names on an allow-list
 * (nd_pk_global_id) to ND_PK_GLOBAL values, and REDUCE / NEWOBJ / BUILD are
 * interpreted for those few callables only:
 *
 *   collections.OrderedDict()                       -> an empty ND_PK_DICT
 *   torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
 *       requires_grad, backward_hooks[, metadata])  -> ND_PK_TENSOR
 *   torch._utils._rebuild_tensor(storage, offset, size, stride) -> ND_PK_TENSOR
 *   torch._utils._rebuild_parameter(tensor, requires_grad, hooks)
 *   torch._utils._rebuild_parameter_with_state(tensor, requires_grad, hooks, state)
 *                                                   -> the tensor
 *   torch._tensor._rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor or
 *       torch.nn.parameter.Parameter, args, state)  -> ND_PK_TENSOR
 *   _codecs.encode(s, 'latin1')                     -> ND_PK_BYTES of s's code
 *       points (each <= 0xFF): how protocols < 3 write a non-empty bytes
 *   builtins.bytes() / __builtin__.bytes()          -> an empty ND_PK_BYTES
 *   BUILD on an OrderedDict (its _metadata attribute): state ignored
 *   BINPERSID of ('storage', <storage type global>, key, location, numel)
 *                                                   -> ND_PK_STORAGE
 *
 * Any other global, or a known one used any other way, fails with an error
 * naming it ("global 'builtins.eval' is not allowed; a torch checkpoint
 * only needs ..."; for a class of torch.nn, torch.optim or the script that
 * saved the file, the message says the file holds a whole pickled object
 * and to save its state_dict() instead). Limits (ND_PK_MAX_*) bound the memo, stack depth,
 * nesting, string/bytes lengths, container sizes and opcode count; every
 * read is bounds-checked. Errors read "<op>: '<what>': <message> (at byte N)".
 *
 * Values live in an arena owned by the nd_pk_doc; containers may share
 * children (the memo), so a consumer walking the tree should remember what
 * it has visited (a DAG can be exponentially larger as a tree) and bound its
 * depth. Cycles (a list appended to itself, directly or through other
 * containers) are rejected with an error saying the container would contain
 * itself. Nodes are allocated at the size of their kind's union member:
 * read members, never copy a whole nd_pk by value. */
#ifndef ND_PICKLE_H
#define ND_PICKLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "needle.h"

#define ND_PK_MAX_OPS       (1u << 26)   /* opcodes per stream */
#define ND_PK_MAX_STACK     (1u << 20)   /* values on the stack (all marks together) */
#define ND_PK_MAX_MEMO      (1u << 22)   /* memo slots */
#define ND_PK_MAX_DEPTH     256          /* nesting of containers / marks */
#define ND_PK_MAX_STR       (1u << 28)   /* bytes in one string or bytes value */
#define ND_PK_MAX_ITEMS     (1u << 24)   /* elements of one container */
#define ND_PK_DEFAULT_MAX_ITEMS (1u << 22) /* values built and elements of all containers
                                              together, unless nd_pk_limits says otherwise */
#define ND_PK_MAX_DIMS      ND_MAX_DIMS  /* of a rebuilt tensor */

typedef enum {
    ND_PK_NONE, ND_PK_BOOL, ND_PK_INT, ND_PK_FLOAT, ND_PK_STR, ND_PK_BYTES,
    ND_PK_TUPLE, ND_PK_LIST, ND_PK_DICT,
    ND_PK_GLOBAL,   /* an allow-listed name, not yet applied */
    ND_PK_STORAGE,  /* a persistent id: a storage of the archive */
    ND_PK_TENSOR,   /* a rebuilt tensor's geometry over a storage */
} nd_pk_kind;

/* The allow-list. Storage types carry the element type they stand for. */
typedef enum {
    ND_PKG_ORDERED_DICT = 1,
    ND_PKG_REBUILD_TENSOR_V2,
    ND_PKG_REBUILD_TENSOR,
    ND_PKG_REBUILD_PARAMETER,
    ND_PKG_REBUILD_PARAMETER_WITH_STATE,
    ND_PKG_REBUILD_FROM_TYPE_V2,
    ND_PKG_TENSOR_TYPE,       /* torch.Tensor */
    ND_PKG_PARAMETER_TYPE,    /* torch.nn.parameter.Parameter */
    ND_PKG_STORAGE,           /* torch.FloatStorage, ...: see storage_type */
    ND_PKG_DTYPE,             /* torch.float32, ...: see storage_type */
    ND_PKG_CODECS_ENCODE,     /* _codecs.encode: protocol < 3 bytes, see above */
    ND_PKG_BYTES_TYPE,        /* builtins.bytes / __builtin__.bytes: only bytes() */
} nd_pk_global_id;

/* Element types a torch storage can hold (needle widens int8/int16 to
 * int32 when it builds tensors: it has no 8/16-bit signed integer dtype). */
typedef enum {
    ND_PKT_FLOAT32 = 1, ND_PKT_FLOAT64, ND_PKT_FLOAT16, ND_PKT_BFLOAT16,
    ND_PKT_INT64, ND_PKT_INT32, ND_PKT_INT16, ND_PKT_INT8, ND_PKT_UINT8, ND_PKT_BOOL,
} nd_pk_elem;

size_t nd_pk_elem_size(nd_pk_elem e);
const char *nd_pk_elem_name(nd_pk_elem e); /* "float32", "int16", ... */

typedef struct nd_pk nd_pk;
struct nd_pk {
    nd_pk_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *s; size_t len; } str;             /* STR (UTF-8) and BYTES */
        struct { nd_pk **items; size_t n, cap; } seq;          /* TUPLE, LIST */
        struct { nd_pk **keys, **values; size_t n, cap; } dict; /* DICT, insertion order;
                                                                   a repeated key replaces */
        struct { nd_pk_global_id id; nd_pk_elem elem; const char *name; } global;
        struct {
            nd_pk_elem elem;
            const char *key; size_t key_len;    /* the entry name under <root>/data/ */
            const char *location;               /* "cpu", "cuda:0", ... */
            int64_t numel;                      /* elements, as pickled (>= 0) */
            void *user;                         /* free for the consumer (torch_load.c) */
        } storage;
        struct {
            nd_pk *storage;                     /* an ND_PK_STORAGE */
            int64_t offset;                     /* in elements, >= 0 */
            int ndim;
            int64_t shape[ND_PK_MAX_DIMS];      /* each >= 0 */
            int64_t stride[ND_PK_MAX_DIMS];     /* each >= 0 */
            bool requires_grad;
            void *user;                         /* free for the consumer */
        } tensor;
    } u;
};

typedef struct nd_pk_doc {
    nd_pk *root;
    void *_arena;
} nd_pk_doc;

/* Unpickles buf[0, len) up to its STOP. `what` names the stream in errors
 * ("'model.pt' entry archive/data.pkl"). The tensor geometry is checked
 * only for sign and overflow here; torch_load checks it against the storage. */
nd_status nd_pickle_load(const char *op, const char *what, const void *buf, size_t len,
                         nd_pk_doc **out);
/* A load's budget of items: every value the unpickler builds (None, True
 * and False are built once and then shared) and every element of its lists, tuples
 * and dicts, counted before the memory for it is allocated; 0 means
 * ND_PK_DEFAULT_MAX_ITEMS. The error names the limit and nd.load_torch's
 * option max_items. */
typedef struct { uint64_t max_items; } nd_pk_limits;
nd_status nd_pickle_load_limited(const char *op, const char *what, const void *buf, size_t len,
                                 const nd_pk_limits *limits, nd_pk_doc **out);
void nd_pickle_free(nd_pk_doc *doc);

#endif
