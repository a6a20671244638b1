/* pickle.c - the restricted unpickler of pickle.h.
 *
 * The input is hostile: every read is bounds-checked against the buffer,
 * every length against the bytes left and the ND_PK_MAX_* limits, and no
 * allocation grows faster than the opcodes read (an opcode adds at most one
 * node or one container slot), so memory stays proportional to the input.
 * Nothing is ever called: GLOBAL / STACK_GLOBAL only look names up in a
 * fixed table, and REDUCE / NEWOBJ / BUILD / BINPERSID interpret the few
 * torch callables by hand. All nodes live in an arena freed in one go, on
 * success (nd_pickle_free) as on failure.
 *
 * The stack follows CPython's Unpickler: MARK starts a new frame of the
 * stack, and an opcode may only pop values above the innermost mark. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "io/pickle.h"
#include "tensor.h"

#define SHOW_MAX 96        /* bytes of a name shown in a message */
#define NAME_MAX_LEN 256   /* a GLOBAL module or name, a storage key */
#define TEXT_LINE_MAX 64   /* protocol-0 INT / LONG / PUT / GET arguments */
#define ARENA_CHUNK 65536

/* ------------------------------------------------------------ arena */

typedef struct chunk { struct chunk *next; size_t used, cap; max_align_t data[]; } chunk;
typedef struct { chunk *head; size_t total; } arena;
/* what one stream may allocate in all: far above any real data.pkl (tens of
 * bytes per tensor), but it stops a stream of tiny opcodes from asking for
 * many times its own size */
#define ARENA_MAX ((size_t)1 << 30)

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n > ARENA_MAX - a->total) return NULL;
    a->total += n;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > ARENA_CHUNK / 2 ? n : ARENA_CHUNK;
        chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        /* a big block gets a chunk of its own behind the current one, so
         * the current chunk's free space is not thrown away */
        if (a->head && cap != ARENA_CHUNK) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
        c->used = n;
        return c->data;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a) {
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
}

/* Every node carries its container nesting depth in a header in front of
 * the public struct (the public layout stays what pickle.h shows). The
 * depth is the one seen when the node was built or last appended to: a
 * container mutated after it was put inside another is not re-measured, so
 * consumers still bound their own recursion (pickle.h says so).
 * A node is allocated only as large as its kind's union member (an int
 * takes 16 bytes, not the tensor's 170): consumers read members, they never
 * copy a whole nd_pk. */
typedef struct {
    uint32_t depth, stamp; /* stamp: cycle-check visits */
    uint64_t hash;         /* as a dict key, once computed (0: not yet) */
} node_hdr;
static node_hdr *hdr_of(const nd_pk *v) { return (node_hdr *)((char *)(uintptr_t)v - sizeof(node_hdr)); }
static uint32_t depth_of(const nd_pk *v) { return hdr_of(v)->depth; }

/* ------------------------------------------------------------ hash maps */

/* Open addressing, power-of-two capacity; a slot with ptr == NULL is free. */
typedef struct { uint64_t h; void *ptr; size_t aux; } slot;
typedef struct { slot *s; size_t cap, n; } table;

static bool table_grow(table *t) {
    if ((t->n + 1) * 2 <= t->cap) return true;
    size_t cap = t->cap ? t->cap * 2 : 64;
    slot *s = calloc(cap, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->s[i].ptr) continue;
        size_t j = t->s[i].h & (cap - 1);
        while (s[j].ptr) j = (j + 1) & (cap - 1);
        s[j] = t->s[i];
    }
    free(t->s);
    t->s = s;
    t->cap = cap;
    return true;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(uint64_t seed, const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return mix(h ^ n);
}

/* ------------------------------------------------------------ parser */

typedef struct {
    const char *op, *what;
    const unsigned char *buf;
    size_t len, pos, op_pos; /* op_pos: where the current opcode starts */
    arena ar;
    nd_pk **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks;
    table memo;    /* key: index + 1 (so that index 0 is a live key) */
    size_t memo_n; /* live memo entries (MEMOIZE's next index) */
    table dkeys;   /* (dict, key) -> position in the dict */
    table storages; /* key string -> ND_PK_STORAGE node */
    table encoded;  /* str node -> the bytes node _codecs.encode made of it */
    int proto;
    nd_pk *none, *true_, *false_; /* shared immutable nodes */
    nd_pk **walk;            /* the cycle check's work list */
    size_t walk_cap;
    uint32_t stamp;
    uint64_t budget;         /* steps the cycle and key checks may still take */
    uint64_t max_items, items_left; /* values built and container elements (nd_pk_limits) */
    bool out_of_items;       /* new_node found items_left at 0 */
    uint64_t seed;           /* hash seed: a digest of the whole input, so that keys
                                cannot be chosen to collide in the tables */
} parser;

static const char *show(const char *s, size_t len, char *buf) {
    size_t o = 0, i;
    for (i = 0; i < len && o < SHOW_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '\'' || c == '\\') o += (size_t)snprintf(buf + o, 8, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (i < len) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = 0;
    return buf;
}
#define SHOW_BUF (SHOW_MAX + 16)

static nd_status perr(parser *p, nd_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static nd_status perr(parser *p, nd_status st, const char *fmt, ...) {
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nd_fail(st, "%s: '%s': %s (at byte %zu)", p->op, p->what, msg, p->op_pos);
}
#define BAD(...) perr(p, ND_ERR_IO, __VA_ARGS__)
static nd_status items_exhausted(parser *p) {
    return perr(p, ND_ERR_MEMORY, "more than %llu items (values, and list, tuple and dict elements) in all, "
                "the limit per load (nd.load_torch's option max_items raises it)",
                (unsigned long long)p->max_items);
}
/* a NULL from new_node or arena_alloc: the load's item budget, or memory */
static nd_status nomem(parser *p) {
    if (p->out_of_items) return items_exhausted(p);
    return perr(p, ND_ERR_MEMORY, "out of memory (a stream may use at most 1 GiB)");
}
#define NOMEM() nomem(p)
#define TRY(x) do { nd_status s_ = (x); if (s_ != ND_OK) return s_; } while (0)

static const char *kind_name(nd_pk_kind k) {
    static const char *n[] = {"None", "bool", "int", "float", "str", "bytes", "tuple", "list",
                              "dict", "global", "storage", "tensor"};
    return (unsigned)k < sizeof n / sizeof *n ? n[k] : "?";
}

static size_t member_size(nd_pk_kind k) {
    const nd_pk *v = NULL;
    switch (k) {
    case ND_PK_NONE: return 0;
    case ND_PK_BOOL: return sizeof v->u.b;
    case ND_PK_INT: return sizeof v->u.i;
    case ND_PK_FLOAT: return sizeof v->u.f;
    case ND_PK_STR: case ND_PK_BYTES: return sizeof v->u.str;
    case ND_PK_TUPLE: case ND_PK_LIST: return sizeof v->u.seq;
    case ND_PK_DICT: return sizeof v->u.dict;
    case ND_PK_GLOBAL: return sizeof v->u.global;
    case ND_PK_STORAGE: return sizeof v->u.storage;
    case ND_PK_TENSOR: return sizeof(nd_pk) - offsetof(nd_pk, u);
    }
    return sizeof(nd_pk) - offsetof(nd_pk, u);
}

static nd_pk *new_node(parser *p, nd_pk_kind k) {
    /* None, True and False are immutable: one node each per stream */
    if (k == ND_PK_NONE && p->none) return p->none;
    /* every value built is charged to the load's budget, not only container
     * elements: values pushed and popped again (BININT1, POP) stay in the
     * arena, and 20 million of them came from a 58 KB file */
    if (p->items_left == 0) {
        p->out_of_items = true;
        return NULL;
    }
    p->items_left--;
    size_t size = sizeof(node_hdr) + offsetof(nd_pk, u) + member_size(k);
    char *m = arena_alloc(&p->ar, size);
    if (!m) return NULL;
    memset(m, 0, size);
    nd_pk *v = (nd_pk *)(m + sizeof(node_hdr));
    v->kind = k;
    if (k == ND_PK_NONE) p->none = v;
    return v;
}
static nd_pk *new_bool(parser *p, bool b) {
    nd_pk **slot = b ? &p->true_ : &p->false_;
    if (!*slot) {
        char *m = arena_alloc(&p->ar, sizeof(node_hdr) + offsetof(nd_pk, u) + sizeof(bool));
        if (!m) return NULL;
        memset(m, 0, sizeof(node_hdr) + offsetof(nd_pk, u) + sizeof(bool));
        *slot = (nd_pk *)(m + sizeof(node_hdr));
        (*slot)->kind = ND_PK_BOOL;
        (*slot)->u.b = b;
    }
    return *slot;
}

/* ---- reading the stream */

static nd_status need(parser *p, size_t n, const char *opname) {
    if (p->len - p->pos < n)
        return BAD("truncated: %s needs %zu bytes, %zu left", opname, n, p->len - p->pos);
    return ND_OK;
}
static uint64_t rd_le(parser *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p->buf[p->pos + i] << (8 * i);
    p->pos += (size_t)n;
    return v;
}

/* A text argument ending in '\n' (GLOBAL, INT, PUT, ...): *s, *n exclude it. */
static nd_status rd_line(parser *p, size_t max, const char *opname, const char **s, size_t *n) {
    size_t left = p->len - p->pos, lim = left < max + 1 ? left : max + 1;
    const unsigned char *nl = memchr(p->buf + p->pos, '\n', lim);
    if (!nl) {
        if (lim == left) return BAD("truncated: %s argument has no newline", opname);
        return BAD("%s argument longer than %zu bytes", opname, max);
    }
    *s = (const char *)p->buf + p->pos;
    *n = (size_t)(nl - (p->buf + p->pos));
    p->pos += *n + 1;
    return ND_OK;
}

/* ---- the stack */

static nd_status push(parser *p, nd_pk *v) {
    if (!v) return NOMEM();
    if (p->sp == p->stack_cap) {
        if (p->sp >= ND_PK_MAX_STACK)
            return BAD("stack holds more than %u values (ND_PK_MAX_STACK)", ND_PK_MAX_STACK);
        size_t cap = p->stack_cap ? p->stack_cap * 2 : 64;
        nd_pk **s = realloc(p->stack, cap * sizeof *s);
        if (!s) return NOMEM();
        p->stack = s;
        p->stack_cap = cap;
    }
    p->stack[p->sp++] = v;
    return ND_OK;
}
static size_t base(const parser *p) { return p->nmarks ? p->marks[p->nmarks - 1] : 0; }
static nd_status want(parser *p, size_t n, const char *opname) {
    if (p->sp - base(p) < n)
        return BAD("stack underflow: %s needs %zu value%s, the stack%s holds %zu", opname, n,
                   n == 1 ? "" : "s", p->nmarks ? " above the last MARK" : "", p->sp - base(p));
    return ND_OK;
}
/* Pops the innermost mark: the values above it are stack[*from, p->sp). */
static nd_status pop_mark(parser *p, const char *opname, size_t *from) {
    if (!p->nmarks) return BAD("%s without a MARK", opname);
    *from = p->marks[--p->nmarks];
    return ND_OK;
}

/* ---- containers */

static nd_status check_depth(parser *p, nd_pk *c, const nd_pk *child) {
    uint32_t d = depth_of(child) + 1;
    if (d > ND_PK_MAX_DEPTH)
        return BAD("containers nested deeper than %d levels (ND_PK_MAX_DEPTH)", ND_PK_MAX_DEPTH);
    if (d > hdr_of(c)->depth) hdr_of(c)->depth = d;
    return ND_OK;
}

/* Room for `more` items in a TUPLE/LIST's array (or a DICT's two arrays). */
static nd_status reserve(parser *p, nd_pk *c, size_t more) {
    bool dict = c->kind == ND_PK_DICT;
    size_t n = dict ? c->u.dict.n : c->u.seq.n, cap = dict ? c->u.dict.cap : c->u.seq.cap;
    if (more > ND_PK_MAX_ITEMS - n)
        return BAD("a %s with more than %u items (ND_PK_MAX_ITEMS)", kind_name(c->kind), ND_PK_MAX_ITEMS);
    /* the load's budget: every item added is charged before its slot exists */
    if (more > p->items_left) return items_exhausted(p);
    p->items_left -= more;
    if (n + more <= cap) return ND_OK;
    size_t ncap = cap ? cap * 2 : 4;
    if (ncap < n + more) ncap = n + more;
    if (ncap > ND_PK_MAX_ITEMS) ncap = ND_PK_MAX_ITEMS;
    for (int k = 0; k < (dict ? 2 : 1); k++) {
        nd_pk **old = dict ? (k ? c->u.dict.values : c->u.dict.keys) : c->u.seq.items;
        nd_pk **a = arena_alloc(&p->ar, ncap * sizeof *a);
        if (!a) return NOMEM();
        if (n) memcpy(a, old, n * sizeof *a);
        if (!dict) c->u.seq.items = a;
        else if (k) c->u.dict.values = a;
        else c->u.dict.keys = a;
    }
    if (dict) c->u.dict.cap = ncap;
    else c->u.seq.cap = ncap;
    return ND_OK;
}

static nd_status seq_from(parser *p, nd_pk_kind k, nd_pk **items, size_t n) {
    nd_pk *t = new_node(p, k);
    if (!t) return NOMEM();
    TRY(reserve(p, t, n));
    for (size_t i = 0; i < n; i++) {
        TRY(check_depth(p, t, items[i]));
        t->u.seq.items[i] = items[i];
    }
    t->u.seq.n = n;
    return push(p, t);
}

static bool is_container(const nd_pk *v) {
    return v->kind == ND_PK_TUPLE || v->kind == ND_PK_LIST || v->kind == ND_PK_DICT;
}

/* The cycle checks and the dict key comparisons together may take 64 steps
 * per input byte: far more than real files need, and a stream that shares
 * one big container or key everywhere cannot make them quadratic. */
static nd_status charge(parser *p, uint64_t steps) {
    if (steps > p->budget)
        return BAD("the stream shares containers or dict keys too often to check them "
                   "(more than %llu steps, 64 per input byte)", (unsigned long long)(64ull * (p->len + 1024)));
    p->budget -= steps;
    return ND_OK;
}

/* No checkpoint holds a cycle, and code that walks the result would loop
 * on one: adding x to the mutable container c fails when c is reachable
 * from x. Only a list or dict can close a cycle (tuples are built from
 * values that already exist), so this runs where one is mutated. Each check
 * visits the containers under x once (stamps); all checks together are
 * charged to the budget (charge). */
static nd_status check_cycle(parser *p, const nd_pk *c, nd_pk *x, const char *opname) {
    if (!is_container(x)) return ND_OK;
    if (x == c) return BAD("%s of a %s into itself: a checkpoint holds no cycles", opname, kind_name(c->kind));
    uint32_t stamp = ++p->stamp;
    size_t n = 0;
    hdr_of(x)->stamp = stamp;
    p->walk[n++] = x;
    while (n) {
        nd_pk *v = p->walk[--n];
        size_t m = v->kind == ND_PK_DICT ? v->u.dict.n : v->u.seq.n;
        nd_pk **kids = v->kind == ND_PK_DICT ? v->u.dict.values : v->u.seq.items;
        for (size_t i = 0; i < m; i++) {
            nd_pk *k = kids[i];
            if (!is_container(k) || hdr_of(k)->stamp == stamp) continue;
            if (k == c)
                return BAD("%s makes a %s contain itself (through a %s): a checkpoint holds no cycles",
                           opname, kind_name(c->kind), kind_name(x->kind));
            TRY(charge(p, 1));
            hdr_of(k)->stamp = stamp;
            if (n == p->walk_cap) {
                size_t cap = p->walk_cap * 2;
                nd_pk **w = realloc(p->walk, cap * sizeof *w);
                if (!w) return NOMEM();
                p->walk = w;
                p->walk_cap = cap;
            }
            p->walk[n++] = k;
        }
    }
    return ND_OK;
}

static nd_status list_add(parser *p, nd_pk *list, nd_pk **items, size_t n, const char *opname) {
    if (list->kind != ND_PK_LIST) return BAD("%s to a %s (only lists are supported)", opname, kind_name(list->kind));
    TRY(reserve(p, list, n));
    for (size_t i = 0; i < n; i++) {
        TRY(check_cycle(p, list, items[i], opname));
        TRY(check_depth(p, list, items[i]));
        list->u.seq.items[list->u.seq.n++] = items[i];
    }
    return ND_OK;
}

/* Dict keys: scalars, and tuples of scalars (a nested tuple would need an
 * unbounded, possibly exponential walk over shared children). Numbers
 * compare across bool/int/float as Python's do. */
static bool scalar_key(const nd_pk *k) {
    return k->kind == ND_PK_NONE || k->kind == ND_PK_BOOL || k->kind == ND_PK_INT ||
           k->kind == ND_PK_FLOAT || k->kind == ND_PK_STR || k->kind == ND_PK_BYTES;
}
static bool as_int(const nd_pk *k, int64_t *out) {
    if (k->kind == ND_PK_BOOL) { *out = k->u.b; return true; }
    if (k->kind == ND_PK_INT) { *out = k->u.i; return true; }
    if (k->kind == ND_PK_FLOAT && k->u.f >= -9223372036854775808.0 && k->u.f < 9223372036854775808.0 &&
        (double)(int64_t)k->u.f == k->u.f) { *out = (int64_t)k->u.f; return true; }
    return false;
}
static uint64_t scalar_hash(uint64_t seed, const nd_pk *k) {
    int64_t i = 0;
    switch (k->kind) {
    case ND_PK_NONE: return mix(seed ^ 0x9e3779b97f4a7c15ull);
    case ND_PK_STR: return hash_bytes(seed, k->u.str.s, k->u.str.len);
    case ND_PK_BYTES: return ~hash_bytes(seed, k->u.str.s, k->u.str.len);
    case ND_PK_FLOAT:
        if (!as_int(k, &i)) {
            uint64_t b;
            double f = k->u.f == 0 ? 0.0 : k->u.f; /* -0.0 == 0.0 */
            memcpy(&b, &f, 8);
            return mix(b ^ 0x5555 ^ seed);
        }
        /* fall through */
    default: as_int(k, &i); return mix((uint64_t)i ^ seed);
    }
}
static bool scalar_eq(const nd_pk *a, const nd_pk *b) {
    int64_t x, y;
    bool na = a->kind == ND_PK_BOOL || a->kind == ND_PK_INT || a->kind == ND_PK_FLOAT;
    bool nb = b->kind == ND_PK_BOOL || b->kind == ND_PK_INT || b->kind == ND_PK_FLOAT;
    if (na && nb) {
        if (as_int(a, &x) && as_int(b, &y)) return x == y;
        if (a->kind == ND_PK_FLOAT && b->kind == ND_PK_FLOAT) return a->u.f == b->u.f;
        return false; /* an integer never equals a non-integral float */
    }
    if (a->kind != b->kind) return false;
    if (a->kind == ND_PK_NONE) return true;
    return a->u.str.len == b->u.str.len && memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0;
}
#define MAX_KEY_TUPLE 64 /* items of a tuple used as a dict key */
static nd_status key_hash_new(parser *p, const nd_pk *k, uint64_t *h);

/* A key's hash, computed once per node (a key reached again through the
 * memo costs nothing more); hashing long strings is charged to the budget. */
static nd_status key_hash(parser *p, const nd_pk *k, uint64_t *h) {
    node_hdr *hd = hdr_of(k);
    if (hd->hash) { *h = hd->hash; return ND_OK; }
    TRY(key_hash_new(p, k, h));
    if (!*h) *h = 1;
    hd->hash = *h;
    return ND_OK;
}
static uint64_t key_cost(const nd_pk *k) { /* steps to hash or compare a key */
    if (k->kind == ND_PK_STR || k->kind == ND_PK_BYTES) return 1 + k->u.str.len / 8;
    if (k->kind != ND_PK_TUPLE) return 1;
    uint64_t c = 1;
    for (size_t i = 0; i < k->u.seq.n; i++) c += key_cost(k->u.seq.items[i]);
    return c;
}
static nd_status key_hash_new(parser *p, const nd_pk *k, uint64_t *h) {
    if (scalar_key(k)) {
        TRY(charge(p, key_cost(k)));
        *h = scalar_hash(p->seed, k);
        return ND_OK;
    }
    if (k->kind == ND_PK_LIST || k->kind == ND_PK_DICT)
        return BAD("unhashable dict key of type %s", kind_name(k->kind));
    if (k->kind != ND_PK_TUPLE)
        return BAD("a dict key of type %s is not supported", kind_name(k->kind));
    if (k->u.seq.n > MAX_KEY_TUPLE)
        return BAD("a dict key that is a tuple of %zu items is not supported (at most %d)", k->u.seq.n, MAX_KEY_TUPLE);
    uint64_t x = 0x7475706c65ull ^ k->u.seq.n;
    for (size_t i = 0; i < k->u.seq.n; i++) {
        const nd_pk *e = k->u.seq.items[i];
        if (e->kind == ND_PK_LIST || e->kind == ND_PK_DICT)
            return BAD("unhashable dict key: a tuple holding a %s", kind_name(e->kind));
        if (!scalar_key(e)) return BAD("a dict key that is a tuple holding a %s is not supported", kind_name(e->kind));
        TRY(charge(p, key_cost(e)));
        x = mix(x ^ scalar_hash(p->seed, e)) + i;
    }
    *h = x;
    return ND_OK;
}
static bool key_eq(const nd_pk *a, const nd_pk *b) {
    if (a->kind == ND_PK_TUPLE || b->kind == ND_PK_TUPLE) {
        if (a->kind != b->kind || a->u.seq.n != b->u.seq.n) return false;
        for (size_t i = 0; i < a->u.seq.n; i++)
            if (!scalar_eq(a->u.seq.items[i], b->u.seq.items[i])) return false;
        return true;
    }
    return scalar_eq(a, b);
}

static nd_status dict_set(parser *p, nd_pk *d, nd_pk *k, nd_pk *v, const char *opname) {
    if (d->kind != ND_PK_DICT) return BAD("%s on a %s (only dicts are supported)", opname, kind_name(d->kind));
    uint64_t kh = 0;
    TRY(key_hash(p, k, &kh));
    TRY(check_cycle(p, d, v, opname));
    /* the dict's address is in the hash: one table serves every dict */
    uint64_t h = mix(kh ^ (uint64_t)(uintptr_t)d);
    table *t = &p->dkeys;
    if (t->cap) {
        for (size_t j = h & (t->cap - 1); t->s[j].ptr; j = (j + 1) & (t->cap - 1)) {
            if (t->s[j].h != h || t->s[j].ptr != d) continue;
            nd_pk *old = d->u.dict.keys[t->s[j].aux];
            if (old != k) TRY(charge(p, key_cost(k)));
            if (old == k || key_eq(old, k)) {
                TRY(check_depth(p, d, v));
                d->u.dict.values[t->s[j].aux] = v; /* a repeated key replaces the value */
                return ND_OK;
            }
        }
    }
    TRY(reserve(p, d, 1));
    TRY(check_depth(p, d, k));
    TRY(check_depth(p, d, v));
    if (!table_grow(t)) return NOMEM();
    size_t j = h & (t->cap - 1);
    while (t->s[j].ptr) j = (j + 1) & (t->cap - 1);
    t->s[j] = (slot){h, d, d->u.dict.n};
    t->n++;
    d->u.dict.keys[d->u.dict.n] = k;
    d->u.dict.values[d->u.dict.n] = v;
    d->u.dict.n++;
    return ND_OK;
}

/* ---- memo */

static nd_status memo_put(parser *p, uint64_t idx, nd_pk *v) {
    if (idx >= ND_PK_MAX_MEMO)
        return BAD("memo index %llu is past the limit of %u slots (ND_PK_MAX_MEMO)",
                   (unsigned long long)idx, ND_PK_MAX_MEMO);
    table *t = &p->memo;
    uint64_t h = mix((idx + 1) ^ p->seed);
    if (t->cap)
        for (size_t j = h & (t->cap - 1); t->s[j].ptr; j = (j + 1) & (t->cap - 1))
            if (t->s[j].aux == idx + 1) { t->s[j].ptr = v; return ND_OK; }
    if (p->memo_n >= ND_PK_MAX_MEMO)
        return BAD("more than %u memo entries (ND_PK_MAX_MEMO)", ND_PK_MAX_MEMO);
    if (!table_grow(t)) return NOMEM();
    size_t j = h & (t->cap - 1);
    while (t->s[j].ptr) j = (j + 1) & (t->cap - 1);
    t->s[j] = (slot){h, v, (size_t)idx + 1};
    t->n++;
    p->memo_n++;
    return ND_OK;
}
static nd_status memo_get(parser *p, uint64_t idx) {
    table *t = &p->memo;
    if (idx < ND_PK_MAX_MEMO && t->cap) {
        uint64_t h = mix((idx + 1) ^ p->seed);
        for (size_t j = h & (t->cap - 1); t->s[j].ptr; j = (j + 1) & (t->cap - 1))
            if (t->s[j].aux == idx + 1) return push(p, t->s[j].ptr);
    }
    return BAD("memo index %llu was never set", (unsigned long long)idx);
}

/* ---- values */


static nd_status push_str(parser *p, nd_pk_kind k, uint64_t n, const char *opname) {
    if (n > ND_PK_MAX_STR)
        return BAD("%s of %llu bytes is longer than the limit of %u (ND_PK_MAX_STR)", opname,
                   (unsigned long long)n, ND_PK_MAX_STR);
    TRY(need(p, (size_t)n, opname));
    const unsigned char *src = p->buf + p->pos;
    if (k == ND_PK_STR) {
        size_t bad = nd_utf8_check(src, (size_t)n);
        if (bad != n) return BAD("%s is not valid UTF-8 (byte %zu of the string)", opname, bad);
    }
    nd_pk *v = new_node(p, k);
    char *s = v ? arena_alloc(&p->ar, (size_t)n + 1) : NULL;
    if (!s) return NOMEM();
    memcpy(s, src, (size_t)n);
    s[n] = 0;
    p->pos += (size_t)n;
    v->u.str.s = s;
    v->u.str.len = (size_t)n;
    return push(p, v);
}

static nd_status push_int(parser *p, int64_t i) {
    nd_pk *v = new_node(p, ND_PK_INT);
    if (v) v->u.i = i;
    return push(p, v);
}

/* LONG1 / LONG4: n bytes of little-endian two's complement. Anything that
 * does not fit int64 is an error (torch never pickles such integers). */
static nd_status push_long(parser *p, uint64_t n, const char *opname) {
    if (n > p->len - p->pos)
        return BAD("truncated: %s needs %llu bytes, %zu left", opname, (unsigned long long)n, p->len - p->pos);
    const unsigned char *b = p->buf + p->pos;
    uint64_t u = 0;
    if (n == 0) return push_int(p, 0);
    size_t m = n < 8 ? (size_t)n : 8;
    for (size_t i = 0; i < m; i++) u |= (uint64_t)b[i] << (8 * i);
    bool neg = b[m - 1] & 0x80;
    for (size_t i = 8; i < n; i++) /* longer: only sign extension may follow */
        if (b[i] != (neg ? 0xff : 0x00))
            return BAD("%s integer of %llu bytes does not fit in 64 bits", opname, (unsigned long long)n);
    if (m < 8 && neg) u |= ~(uint64_t)0 << (8 * m);
    p->pos += (size_t)n;
    return push_int(p, (int64_t)u);
}

/* Protocol 0 INT / LONG: optional sign, decimal digits, and for LONG an
 * optional trailing 'L'. "I01" and "I00" are True and False. */
static nd_status text_int(parser *p, bool is_long, const char *opname) {
    const char *s = NULL;
    size_t n = 0;
    TRY(rd_line(p, TEXT_LINE_MAX, opname, &s, &n));
    if (!is_long && n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
        return push(p, new_bool(p, s[1] == '1'));
    }
    if (is_long && n && s[n - 1] == 'L') n--;
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    if (i == n) return BAD("%s argument is not an integer", opname);
    uint64_t u = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return BAD("%s argument is not an integer", opname);
        unsigned d = (unsigned)(s[i] - '0');
        if (u > (UINT64_MAX - d) / 10) return BAD("%s integer does not fit in 64 bits", opname);
        u = u * 10 + d;
    }
    if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX)
        return BAD("%s integer does not fit in 64 bits", opname);
    return push_int(p, neg ? (int64_t)(0 - u) : (int64_t)u);
}

static nd_status text_index(parser *p, const char *opname, uint64_t *idx) {
    const char *s = NULL;
    size_t n = 0;
    TRY(rd_line(p, TEXT_LINE_MAX, opname, &s, &n));
    if (!n) return BAD("%s argument is not a memo index", opname);
    uint64_t u = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || u > UINT32_MAX) return BAD("%s argument is not a memo index", opname);
        u = u * 10 + (unsigned)(s[i] - '0');
    }
    *idx = u;
    return ND_OK;
}

/* ---- the allow-list */

typedef struct { const char *module, *name; nd_pk_global_id id; nd_pk_elem elem; } allowed;
static const allowed ALLOWED[] = {
    {"collections", "OrderedDict", ND_PKG_ORDERED_DICT, 0},
    {"torch._utils", "_rebuild_tensor_v2", ND_PKG_REBUILD_TENSOR_V2, 0},
    {"torch._utils", "_rebuild_tensor", ND_PKG_REBUILD_TENSOR, 0},
    {"torch._utils", "_rebuild_parameter", ND_PKG_REBUILD_PARAMETER, 0},
    {"torch._utils", "_rebuild_parameter_with_state", ND_PKG_REBUILD_PARAMETER_WITH_STATE, 0},
    {"torch._tensor", "_rebuild_from_type_v2", ND_PKG_REBUILD_FROM_TYPE_V2, 0},
    {"torch", "Tensor", ND_PKG_TENSOR_TYPE, 0},
    {"torch._tensor", "Tensor", ND_PKG_TENSOR_TYPE, 0},
    {"torch.nn.parameter", "Parameter", ND_PKG_PARAMETER_TYPE, 0},
    {"torch", "FloatStorage", ND_PKG_STORAGE, ND_PKT_FLOAT32},
    {"torch", "DoubleStorage", ND_PKG_STORAGE, ND_PKT_FLOAT64},
    {"torch", "HalfStorage", ND_PKG_STORAGE, ND_PKT_FLOAT16},
    {"torch", "BFloat16Storage", ND_PKG_STORAGE, ND_PKT_BFLOAT16},
    {"torch", "LongStorage", ND_PKG_STORAGE, ND_PKT_INT64},
    {"torch", "IntStorage", ND_PKG_STORAGE, ND_PKT_INT32},
    {"torch", "ShortStorage", ND_PKG_STORAGE, ND_PKT_INT16},
    {"torch", "CharStorage", ND_PKG_STORAGE, ND_PKT_INT8},
    {"torch", "ByteStorage", ND_PKG_STORAGE, ND_PKT_UINT8},
    {"torch", "BoolStorage", ND_PKG_STORAGE, ND_PKT_BOOL},
    {"torch", "float32", ND_PKG_DTYPE, ND_PKT_FLOAT32},
    {"torch", "float", ND_PKG_DTYPE, ND_PKT_FLOAT32},
    {"torch", "float64", ND_PKG_DTYPE, ND_PKT_FLOAT64},
    {"torch", "double", ND_PKG_DTYPE, ND_PKT_FLOAT64},
    {"torch", "float16", ND_PKG_DTYPE, ND_PKT_FLOAT16},
    {"torch", "half", ND_PKG_DTYPE, ND_PKT_FLOAT16},
    {"torch", "bfloat16", ND_PKG_DTYPE, ND_PKT_BFLOAT16},
    {"torch", "int64", ND_PKG_DTYPE, ND_PKT_INT64},
    {"torch", "long", ND_PKG_DTYPE, ND_PKT_INT64},
    {"torch", "int32", ND_PKG_DTYPE, ND_PKT_INT32},
    {"torch", "int", ND_PKG_DTYPE, ND_PKT_INT32},
    {"torch", "int16", ND_PKG_DTYPE, ND_PKT_INT16},
    {"torch", "short", ND_PKG_DTYPE, ND_PKT_INT16},
    {"torch", "int8", ND_PKG_DTYPE, ND_PKT_INT8},
    {"torch", "uint8", ND_PKG_DTYPE, ND_PKT_UINT8},
    {"torch", "bool", ND_PKG_DTYPE, ND_PKT_BOOL},
    /* protocols < 3 write bytes as _codecs.encode(str, 'latin1') and b'' as
     * bytes() (protocol 2 names the module __builtin__): both are read as
     * data, nothing else of _codecs or builtins is allowed */
    {"_codecs", "encode", ND_PKG_CODECS_ENCODE, 0},
    {"builtins", "bytes", ND_PKG_BYTES_TYPE, 0},
    {"__builtin__", "bytes", ND_PKG_BYTES_TYPE, 0},
};

size_t nd_pk_elem_size(nd_pk_elem e) {
    switch (e) {
    case ND_PKT_FLOAT64: case ND_PKT_INT64: return 8;
    case ND_PKT_FLOAT32: case ND_PKT_INT32: return 4;
    case ND_PKT_FLOAT16: case ND_PKT_BFLOAT16: case ND_PKT_INT16: return 2;
    case ND_PKT_INT8: case ND_PKT_UINT8: case ND_PKT_BOOL: return 1;
    }
    return 0;
}

const char *nd_pk_elem_name(nd_pk_elem e) {
    switch (e) {
    case ND_PKT_FLOAT32: return "float32";
    case ND_PKT_FLOAT64: return "float64";
    case ND_PKT_FLOAT16: return "float16";
    case ND_PKT_BFLOAT16: return "bfloat16";
    case ND_PKT_INT64: return "int64";
    case ND_PKT_INT32: return "int32";
    case ND_PKT_INT16: return "int16";
    case ND_PKT_INT8: return "int8";
    case ND_PKT_UINT8: return "uint8";
    case ND_PKT_BOOL: return "bool";
    }
    return "?";
}

/* The fix for a global that is a class of a whole pickled object, or NULL:
 * torch.save(model) pickles the model's class (torch.nn.modules.*, or a
 * class of the script that saved it: __main__.*) and torch.save(optimizer)
 * torch.optim's; what needle reads is their state_dict(). */
static const char *object_hint(const char *mod, size_t ml) {
    static const struct { const char *prefix, *fix; } HINTS[] = {
        {"torch.nn.", "it is a torch.nn class: the file holds a whole pickled torch.nn module (torch.save(model)), which needle cannot "
                      "rebuild; save `model.state_dict()` instead: torch.save(model.state_dict(), path)"},
        {"torch.optim.", "it is a torch.optim class: the file holds a whole pickled torch.optim object (torch.save(optimizer)), which needle "
                         "cannot rebuild; save `optimizer.state_dict()` instead"},
        {"__main__", "it is a class of the script that saved the file, so the file holds a whole pickled Python "
                     "object (a model saved with torch.save(model)?), which needle cannot rebuild; save "
                     "`model.state_dict()` instead"},
    };
    for (size_t i = 0; i < sizeof HINTS / sizeof *HINTS; i++) {
        size_t pl = strlen(HINTS[i].prefix);
        bool whole = HINTS[i].prefix[pl - 1] != '.'; /* "__main__" itself, not "__main__x" */
        if (ml >= pl && memcmp(mod, HINTS[i].prefix, pl) == 0 && (!whole || ml == pl)) return HINTS[i].fix;
    }
    return NULL;
}

/* Resolves module.name against the allow-list; anything else fails here,
 * before a value is ever pushed or memoised. */
static nd_status push_global(parser *p, const char *mod, size_t ml, const char *name, size_t nl) {
    for (size_t i = 0; i < sizeof ALLOWED / sizeof *ALLOWED; i++) {
        const allowed *a = &ALLOWED[i];
        if (strlen(a->module) == ml && !memcmp(a->module, mod, ml) && strlen(a->name) == nl &&
            !memcmp(a->name, name, nl)) {
            nd_pk *v = new_node(p, ND_PK_GLOBAL);
            char *full = v ? arena_alloc(&p->ar, ml + nl + 2) : NULL;
            if (!full) return NOMEM();
            memcpy(full, mod, ml);
            full[ml] = '.';
            memcpy(full + ml + 1, name, nl);
            full[ml + nl + 1] = 0;
            v->u.global.id = a->id;
            v->u.global.elem = a->elem;
            v->u.global.name = full;
            return push(p, v);
        }
    }
    char b1[SHOW_BUF], b2[SHOW_BUF];
    const char *fix = object_hint(mod, ml);
    if (fix)
        return BAD("global '%s.%s' is not allowed: %s", show(mod, ml, b1), show(name, nl, b2), fix);
    /* A name spelt as a class (ResNet, Net) from any other package: most
     * likely a whole model pickled by torch.save(model) (torchvision's, or a
     * package's own), and the fix is the same. */
    bool class_like = nl > 0 && name[0] >= 'A' && name[0] <= 'Z';
    return BAD("global '%s.%s' is not allowed (a torch checkpoint only needs tensors, storages, "
               "OrderedDict, dtypes and bytes; this file may try to run code)%s",
               show(mod, ml, b1), show(name, nl, b2),
               class_like ? "; if it is a class of a whole model saved with torch.save(model), save "
                            "`model.state_dict()` instead: torch.save(model.state_dict(), path)" : "");
}

/* ---- interpreting the allowed callables */

static bool empty_or_none(const nd_pk *v) {
    return v->kind == ND_PK_NONE || (v->kind == ND_PK_DICT && v->u.dict.n == 0);
}

static nd_status get_int(parser *p, const nd_pk *v, const char *fn, const char *arg, int64_t *out) {
    if (v->kind != ND_PK_INT) return BAD("%s: %s must be an int, not %s", fn, arg, kind_name(v->kind));
    if (v->u.i < 0) return BAD("%s: %s is negative (%lld)", fn, arg, (long long)v->u.i);
    *out = v->u.i;
    return ND_OK;
}

static nd_status get_dims(parser *p, const nd_pk *v, const char *fn, const char *arg, int64_t *out, int *nd) {
    if (v->kind != ND_PK_TUPLE && v->kind != ND_PK_LIST)
        return BAD("%s: %s must be a tuple of ints, not %s", fn, arg, kind_name(v->kind));
    if (v->u.seq.n > ND_PK_MAX_DIMS)
        return BAD("%s: %s has %zu dims, more than %d", fn, arg, v->u.seq.n, ND_PK_MAX_DIMS);
    for (size_t i = 0; i < v->u.seq.n; i++) {
        const nd_pk *e = v->u.seq.items[i];
        if (e->kind != ND_PK_INT) return BAD("%s: %s[%zu] must be an int, not %s", fn, arg, i, kind_name(e->kind));
        if (e->u.i < 0) return BAD("%s: %s[%zu] is negative (%lld)", fn, arg, i, (long long)e->u.i);
        out[i] = e->u.i;
    }
    *nd = (int)v->u.seq.n;
    return ND_OK;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
 * and _rebuild_tensor(storage, offset, size, stride). */
static nd_status rebuild_tensor(parser *p, const nd_pk *args, bool v2, nd_pk **out) {
    const char *fn = v2 ? "_rebuild_tensor_v2" : "_rebuild_tensor";
    size_t n = args->u.seq.n;
    if (v2 ? (n != 6 && n != 7) : n != 4)
        return BAD("%s takes %s arguments, got %zu", fn, v2 ? "6 or 7" : "4", n);
    nd_pk *const *a = args->u.seq.items;
    if (a[0]->kind != ND_PK_STORAGE) return BAD("%s: the storage argument is a %s, not a storage", fn, kind_name(a[0]->kind));
    nd_pk *t = new_node(p, ND_PK_TENSOR);
    if (!t) return NOMEM();
    t->u.tensor.storage = a[0];
    TRY(get_int(p, a[1], fn, "storage offset", &t->u.tensor.offset));
    int nd1, nd2;
    TRY(get_dims(p, a[2], fn, "size", t->u.tensor.shape, &nd1));
    TRY(get_dims(p, a[3], fn, "stride", t->u.tensor.stride, &nd2));
    if (nd1 != nd2) return BAD("%s: size has %d dims but stride has %d", fn, nd1, nd2);
    t->u.tensor.ndim = nd1;
    /* the number of elements, and the last element's distance from the
     * offset, must fit int64 (torch_load compares them with the storage) */
    int64_t numel = 1, extent = 0;
    bool empty = false;
    for (int d = 0; d < nd1; d++) if (t->u.tensor.shape[d] == 0) empty = true;
    for (int d = 0; d < nd1; d++) {
        int64_t s = t->u.tensor.shape[d], st = t->u.tensor.stride[d], x;
        if (__builtin_mul_overflow(numel, s, &numel))
            return BAD("%s: size overflows 64 bits", fn);
        if (!empty && (__builtin_mul_overflow(s - 1, st, &x) || __builtin_add_overflow(extent, x, &extent)))
            return BAD("%s: size times stride overflows 64 bits", fn);
    }
    if (__builtin_add_overflow(extent, t->u.tensor.offset, &extent))
        return BAD("%s: storage offset plus extent overflows 64 bits", fn);
    if (v2) {
        if (a[4]->kind != ND_PK_BOOL && a[4]->kind != ND_PK_INT)
            return BAD("%s: requires_grad must be a bool, not %s", fn, kind_name(a[4]->kind));
        t->u.tensor.requires_grad = a[4]->kind == ND_PK_BOOL ? a[4]->u.b : a[4]->u.i != 0;
        if (!empty_or_none(a[5])) return BAD("%s: backward hooks are not supported (got a non-empty %s)", fn, kind_name(a[5]->kind));
        if (n == 7 && !empty_or_none(a[6])) return BAD("%s: tensor metadata is not supported (got a non-empty %s)", fn, kind_name(a[6]->kind));
    }
    *out = t;
    return ND_OK;
}

/* _rebuild_parameter(data, requires_grad, hooks[, state]): a copy of the
 * tensor node with requires_grad set (the original may be shared). */
static nd_status rebuild_parameter(parser *p, const nd_pk *args, bool with_state, nd_pk **out) {
    const char *fn = with_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter";
    size_t want_n = with_state ? 4 : 3;
    if (args->u.seq.n != want_n) return BAD("%s takes %zu arguments, got %zu", fn, want_n, args->u.seq.n);
    nd_pk *const *a = args->u.seq.items;
    if (a[0]->kind != ND_PK_TENSOR) return BAD("%s: data must be a tensor, not %s", fn, kind_name(a[0]->kind));
    if (a[1]->kind != ND_PK_BOOL && a[1]->kind != ND_PK_INT)
        return BAD("%s: requires_grad must be a bool, not %s", fn, kind_name(a[1]->kind));
    if (!empty_or_none(a[2])) return BAD("%s: backward hooks are not supported (got a non-empty %s)", fn, kind_name(a[2]->kind));
    if (with_state && !empty_or_none(a[3]) && !(a[3]->kind == ND_PK_TUPLE))
        return BAD("%s: parameter state of type %s is not supported", fn, kind_name(a[3]->kind));
    nd_pk *t = new_node(p, ND_PK_TENSOR);
    if (!t) return NOMEM();
    t->u.tensor = a[0]->u.tensor;
    t->u.tensor.requires_grad = a[1]->kind == ND_PK_BOOL ? a[1]->u.b : a[1]->u.i != 0;
    *out = t;
    return ND_OK;
}

static nd_status apply(parser *p, const nd_pk *fn, const nd_pk *args, int level, nd_pk **out);

/* _rebuild_from_type_v2(func, new_type, args, state): func(*args) as new_type. */
static nd_status rebuild_from_type(parser *p, const nd_pk *args, int level, nd_pk **out) {
    const char *fn = "_rebuild_from_type_v2";
    if (args->u.seq.n != 4) return BAD("%s takes 4 arguments, got %zu", fn, args->u.seq.n);
    nd_pk *const *a = args->u.seq.items;
    if (a[0]->kind != ND_PK_GLOBAL ||
        (a[0]->u.global.id != ND_PKG_REBUILD_TENSOR_V2 && a[0]->u.global.id != ND_PKG_REBUILD_TENSOR &&
         a[0]->u.global.id != ND_PKG_REBUILD_PARAMETER))
        return BAD("%s: func must be torch._utils._rebuild_tensor_v2", fn);
    if (a[1]->kind != ND_PK_GLOBAL ||
        (a[1]->u.global.id != ND_PKG_TENSOR_TYPE && a[1]->u.global.id != ND_PKG_PARAMETER_TYPE))
        return BAD("%s: new_type must be torch.Tensor or torch.nn.parameter.Parameter", fn);
    if (a[2]->kind != ND_PK_TUPLE) return BAD("%s: args must be a tuple, not %s", fn, kind_name(a[2]->kind));
    if (!empty_or_none(a[3])) return BAD("%s: tensor state of type %s is not supported", fn, kind_name(a[3]->kind));
    TRY(apply(p, a[0], a[2], level + 1, out));
    if ((*out)->kind != ND_PK_TENSOR) return BAD("%s: func did not build a tensor", fn);
    return ND_OK;
}

/* _codecs.encode(s, 'latin1'): how protocols < 3 pickle a non-empty bytes
 * (the str holds one code point <= 0xFF per byte). s is valid UTF-8 (push_str
 * checked it), so a code point <= 0xFF is one byte below 0x80 or the pair
 * 0xC2/0xC3 + continuation; any other lead byte starts one above 0xFF.
 * The same str node encoded again gives the same bytes node: a memoised
 * long str cannot make each of many REDUCEs copy it. */
static nd_status codecs_encode(parser *p, const nd_pk *args, nd_pk **out) {
    const char *fn = "_codecs.encode";
    if (args->u.seq.n != 2)
        return BAD("%s takes 2 arguments (a str and 'latin1'), got %zu", fn, args->u.seq.n);
    nd_pk *const *a = args->u.seq.items;
    if (a[0]->kind != ND_PK_STR) return BAD("%s: the text must be a str, not %s", fn, kind_name(a[0]->kind));
    if (a[1]->kind != ND_PK_STR) return BAD("%s: the encoding must be a str, not %s", fn, kind_name(a[1]->kind));
    if (a[1]->u.str.len != 6 || memcmp(a[1]->u.str.s, "latin1", 6)) {
        char b[SHOW_BUF];
        return BAD("%s: encoding '%s' is not supported (only 'latin1', as pickle writes bytes)", fn,
                   show(a[1]->u.str.s, a[1]->u.str.len, b));
    }
    table *t = &p->encoded;
    uint64_t h = mix((uint64_t)(uintptr_t)a[0] ^ p->seed);
    if (t->cap)
        for (size_t j = h & (t->cap - 1); t->s[j].ptr; j = (j + 1) & (t->cap - 1))
            if (t->s[j].aux == (size_t)(uintptr_t)a[0]) {
                *out = t->s[j].ptr;
                return ND_OK;
            }
    const unsigned char *s = (const unsigned char *)a[0]->u.str.s;
    size_t n = a[0]->u.str.len, o = 0;
    nd_pk *v = new_node(p, ND_PK_BYTES);
    unsigned char *d = v ? arena_alloc(&p->ar, n + 1) : NULL;
    if (!d) return NOMEM();
    for (size_t i = 0; i < n; i++) {
        if (s[i] < 0x80) d[o++] = s[i];
        else if ((s[i] == 0xc2 || s[i] == 0xc3) && i + 1 < n && (s[i + 1] & 0xc0) == 0x80) {
            d[o++] = (unsigned char)((s[i] & 0x03) << 6 | (s[i + 1] & 0x3f));
            i++;
        } else
            return BAD("%s: the str has a character above U+00FF (at byte %zu of the str), which "
                       "'latin1' cannot encode", fn, i);
    }
    d[o] = 0;
    v->u.str.s = (const char *)d;
    v->u.str.len = o;
    if (!table_grow(t)) return NOMEM();
    size_t j = h & (t->cap - 1);
    while (t->s[j].ptr) j = (j + 1) & (t->cap - 1);
    t->s[j] = (slot){h, v, (size_t)(uintptr_t)a[0]};
    t->n++;
    *out = v;
    return ND_OK;
}

/* bytes(): how protocols < 3 pickle b''. Other arguments would convert
 * arbitrary objects, which no pickler writes. */
static nd_status bytes_empty(parser *p, const nd_pk *fn, const nd_pk *args, nd_pk **out) {
    if (args->u.seq.n)
        return BAD("%s called with %zu argument%s (only bytes() is supported)", fn->u.global.name,
                   args->u.seq.n, args->u.seq.n == 1 ? "" : "s");
    nd_pk *v = new_node(p, ND_PK_BYTES);
    char *d = v ? arena_alloc(&p->ar, 1) : NULL;
    if (!d) return NOMEM();
    d[0] = 0;
    v->u.str.s = d;
    v->u.str.len = 0;
    *out = v;
    return ND_OK;
}

/* REDUCE: fn(*args) for the allowed callables. */
static nd_status apply(parser *p, const nd_pk *fn, const nd_pk *args, int level, nd_pk **out) {
    if (fn->kind != ND_PK_GLOBAL) return BAD("REDUCE on a %s (only allowed globals may be called)", kind_name(fn->kind));
    if (args->kind != ND_PK_TUPLE) return BAD("REDUCE arguments must be a tuple, not %s", kind_name(args->kind));
    if (level > 1) return BAD("_rebuild_from_type_v2 nested in itself");
    switch (fn->u.global.id) {
    case ND_PKG_ORDERED_DICT:
        if (args->u.seq.n) return BAD("collections.OrderedDict called with arguments (only OrderedDict() is supported)");
        *out = new_node(p, ND_PK_DICT);
        return *out ? ND_OK : NOMEM();
    case ND_PKG_REBUILD_TENSOR_V2: return rebuild_tensor(p, args, true, out);
    case ND_PKG_REBUILD_TENSOR: return rebuild_tensor(p, args, false, out);
    case ND_PKG_REBUILD_PARAMETER: return rebuild_parameter(p, args, false, out);
    case ND_PKG_REBUILD_PARAMETER_WITH_STATE: return rebuild_parameter(p, args, true, out);
    case ND_PKG_REBUILD_FROM_TYPE_V2: return rebuild_from_type(p, args, level, out);
    case ND_PKG_CODECS_ENCODE: return codecs_encode(p, args, out);
    case ND_PKG_BYTES_TYPE: return bytes_empty(p, fn, args, out);
    default: return BAD("'%s' cannot be called (only OrderedDict, bytes, _codecs.encode and torch's "
                        "rebuild functions can)", fn->u.global.name);
    }
}

/* BINPERSID ('storage', storage type, key, location, numel). One node per
 * key: tensors that share a storage share the node. */
static nd_status persistent_load(parser *p, const nd_pk *pid, nd_pk **out) {
    if (pid->kind != ND_PK_TUPLE) return BAD("persistent id is a %s, not a tuple", kind_name(pid->kind));
    if (pid->u.seq.n != 5) return BAD("persistent id has %zu fields, expected 5 ('storage', type, key, location, numel)", pid->u.seq.n);
    nd_pk *const *a = pid->u.seq.items;
    if (a[0]->kind != ND_PK_STR || a[0]->u.str.len != 7 || memcmp(a[0]->u.str.s, "storage", 7))
        return BAD("persistent id is not a 'storage' record");
    if (a[1]->kind != ND_PK_GLOBAL || a[1]->u.global.id != ND_PKG_STORAGE)
        return BAD("persistent id: the storage type is a %s, not a torch storage class", kind_name(a[1]->kind));
    if (a[2]->kind != ND_PK_STR) return BAD("persistent id: the key is a %s, not a str", kind_name(a[2]->kind));
    if (a[3]->kind != ND_PK_STR) return BAD("persistent id: the location is a %s, not a str", kind_name(a[3]->kind));
    if (a[4]->kind != ND_PK_INT) return BAD("persistent id: numel is a %s, not an int", kind_name(a[4]->kind));
    const char *key = a[2]->u.str.s;
    size_t kl = a[2]->u.str.len;
    char kb[SHOW_BUF];
    if (kl == 0 || kl > NAME_MAX_LEN || memchr(key, '/', kl) || memchr(key, '\\', kl) || memchr(key, 0, kl) ||
        strstr(key, ".."))
        return BAD("persistent id: bad storage key '%s' (1 to %d bytes, no '/', '\\' or '..')", show(key, kl, kb), NAME_MAX_LEN);
    if (a[3]->u.str.len > NAME_MAX_LEN || memchr(a[3]->u.str.s, 0, a[3]->u.str.len))
        return BAD("persistent id: bad storage location");
    if (a[4]->u.i < 0) return BAD("persistent id: storage '%s' has a negative size (%lld)", show(key, kl, kb), (long long)a[4]->u.i);
    nd_pk_elem elem = a[1]->u.global.elem;
    table *t = &p->storages;
    uint64_t h = hash_bytes(p->seed, key, kl);
    if (t->cap)
        for (size_t j = h & (t->cap - 1); t->s[j].ptr; j = (j + 1) & (t->cap - 1)) {
            nd_pk *s = t->s[j].ptr;
            if (t->s[j].h != h || s->u.storage.key_len != kl || memcmp(s->u.storage.key, key, kl)) continue;
            if (s->u.storage.elem != elem || s->u.storage.numel != a[4]->u.i)
                return BAD("storage '%s' appears twice with different types or sizes (%s[%lld] and %s[%lld])",
                           show(key, kl, kb), nd_pk_elem_name(s->u.storage.elem), (long long)s->u.storage.numel,
                           nd_pk_elem_name(elem), (long long)a[4]->u.i);
            *out = s;
            return ND_OK;
        }
    nd_pk *s = new_node(p, ND_PK_STORAGE);
    if (!s || !table_grow(t)) return NOMEM();
    s->u.storage.elem = elem;
    s->u.storage.key = key; /* arena strings, NUL-terminated */
    s->u.storage.key_len = kl;
    s->u.storage.location = a[3]->u.str.s;
    s->u.storage.numel = a[4]->u.i;
    size_t j = h & (t->cap - 1);
    while (t->s[j].ptr) j = (j + 1) & (t->cap - 1);
    t->s[j] = (slot){h, s, 0};
    t->n++;
    *out = s;
    return ND_OK;
}

/* ---- the opcode loop */

static const char *opcode_name(unsigned c) {
    switch (c) {
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 'S': return "STRING";
    case 'V': return "UNICODE";
    case 'F': return "FLOAT";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    }
    return NULL;
}

static nd_status run(parser *p, nd_pk **result) {
    size_t nops = 0;
    for (;;) {
        p->op_pos = p->pos;
        if (p->pos >= p->len) return BAD("truncated: the stream ends before its STOP opcode");
        if (++nops > ND_PK_MAX_OPS) return BAD("more than %u opcodes (ND_PK_MAX_OPS)", ND_PK_MAX_OPS);
        unsigned c = p->buf[p->pos++];
        size_t from = 0;
        nd_pk *v = NULL;
        switch (c) {
        case 0x80: /* PROTO */
            TRY(need(p, 1, "PROTO"));
            p->proto = p->buf[p->pos++];
            if (p->proto > 5) return BAD("unsupported pickle protocol %d", p->proto);
            break;
        case 0x95: { /* FRAME: a length hint; the opcodes inside are read as usual */
            TRY(need(p, 8, "FRAME"));
            uint64_t n = rd_le(p, 8);
            if (n > p->len - p->pos) return BAD("FRAME of %llu bytes runs past the end of the stream", (unsigned long long)n);
            break;
        }
        case '.': /* STOP */
            TRY(want(p, 1, "STOP"));
            *result = p->stack[--p->sp];
            return ND_OK;
        case '(': /* MARK */
            if (p->nmarks >= ND_PK_MAX_DEPTH) return BAD("more than %d nested MARKs (ND_PK_MAX_DEPTH)", ND_PK_MAX_DEPTH);
            p->marks[p->nmarks++] = p->sp;
            break;
        case '0': /* POP */
            if (p->sp == base(p) && p->nmarks) { p->nmarks--; break; } /* pops the mark, as CPython */
            TRY(want(p, 1, "POP"));
            p->sp--;
            break;
        case '1': /* POP_MARK */
            TRY(pop_mark(p, "POP_MARK", &from));
            p->sp = from;
            break;
        case '2': /* DUP */
            TRY(want(p, 1, "DUP"));
            TRY(push(p, p->stack[p->sp - 1]));
            break;
        case 'N': TRY(push(p, new_node(p, ND_PK_NONE))); break;
        case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
            TRY(push(p, new_bool(p, c == 0x88)));
            break;
        case 'J': TRY(need(p, 4, "BININT")); TRY(push_int(p, (int32_t)(uint32_t)rd_le(p, 4))); break;
        case 'K': TRY(need(p, 1, "BININT1")); TRY(push_int(p, (int64_t)rd_le(p, 1))); break;
        case 'M': TRY(need(p, 2, "BININT2")); TRY(push_int(p, (int64_t)rd_le(p, 2))); break;
        case 0x8a: TRY(need(p, 1, "LONG1")); TRY(push_long(p, rd_le(p, 1), "LONG1")); break;
        case 0x8b: TRY(need(p, 4, "LONG4")); TRY(push_long(p, rd_le(p, 4), "LONG4")); break;
        case 'I': TRY(text_int(p, false, "INT")); break;
        case 'L': TRY(text_int(p, true, "LONG")); break;
        case 'G': { /* BINFLOAT: big-endian IEEE double */
            TRY(need(p, 8, "BINFLOAT"));
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u = u << 8 | p->buf[p->pos + i];
            p->pos += 8;
            v = new_node(p, ND_PK_FLOAT);
            if (v) memcpy(&v->u.f, &u, 8);
            TRY(push(p, v));
            break;
        }
        case 0x8c: TRY(need(p, 1, "SHORT_BINUNICODE")); TRY(push_str(p, ND_PK_STR, rd_le(p, 1), "SHORT_BINUNICODE")); break;
        case 'X': TRY(need(p, 4, "BINUNICODE")); TRY(push_str(p, ND_PK_STR, rd_le(p, 4), "BINUNICODE")); break;
        case 0x8d: TRY(need(p, 8, "BINUNICODE8")); TRY(push_str(p, ND_PK_STR, rd_le(p, 8), "BINUNICODE8")); break;
        case 'U': TRY(need(p, 1, "SHORT_BINSTRING")); TRY(push_str(p, ND_PK_STR, rd_le(p, 1), "SHORT_BINSTRING")); break;
        case 'T': { /* BINSTRING: a signed 4-byte length */
            TRY(need(p, 4, "BINSTRING"));
            int32_t n = (int32_t)(uint32_t)rd_le(p, 4);
            if (n < 0) return BAD("BINSTRING has a negative length (%d)", n);
            TRY(push_str(p, ND_PK_STR, (uint64_t)n, "BINSTRING"));
            break;
        }
        case 'C': TRY(need(p, 1, "SHORT_BINBYTES")); TRY(push_str(p, ND_PK_BYTES, rd_le(p, 1), "SHORT_BINBYTES")); break;
        case 'B': TRY(need(p, 4, "BINBYTES")); TRY(push_str(p, ND_PK_BYTES, rd_le(p, 4), "BINBYTES")); break;
        case 0x8e: TRY(need(p, 8, "BINBYTES8")); TRY(push_str(p, ND_PK_BYTES, rd_le(p, 8), "BINBYTES8")); break;
        case ')': TRY(seq_from(p, ND_PK_TUPLE, NULL, 0)); break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t n = c - 0x84;
            TRY(want(p, n, n == 1 ? "TUPLE1" : n == 2 ? "TUPLE2" : "TUPLE3"));
            p->sp -= n;
            TRY(seq_from(p, ND_PK_TUPLE, p->stack + p->sp, n));
            break;
        }
        case 't': case 'l': { /* TUPLE, LIST: the values above the mark */
            TRY(pop_mark(p, c == 't' ? "TUPLE" : "LIST", &from));
            size_t n = p->sp - from;
            p->sp = from;
            TRY(seq_from(p, c == 't' ? ND_PK_TUPLE : ND_PK_LIST, p->stack + from, n));
            break;
        }
        case ']': TRY(seq_from(p, ND_PK_LIST, NULL, 0)); break;
        case '}': TRY(push(p, new_node(p, ND_PK_DICT))); break;
        case 'a': /* APPEND */
            TRY(want(p, 2, "APPEND"));
            TRY(list_add(p, p->stack[p->sp - 2], p->stack + p->sp - 1, 1, "APPEND"));
            p->sp--;
            break;
        case 'e': { /* APPENDS */
            TRY(pop_mark(p, "APPENDS", &from));
            if (from == base(p) || from < 1) return BAD("stack underflow: APPENDS has no list below its MARK");
            TRY(list_add(p, p->stack[from - 1], p->stack + from, p->sp - from, "APPENDS"));
            p->sp = from;
            break;
        }
        case 's': /* SETITEM */
            TRY(want(p, 3, "SETITEM"));
            TRY(dict_set(p, p->stack[p->sp - 3], p->stack[p->sp - 2], p->stack[p->sp - 1], "SETITEM"));
            p->sp -= 2;
            break;
        case 'u': case 'd': { /* SETITEMS, DICT */
            const char *name = c == 'u' ? "SETITEMS" : "DICT";
            TRY(pop_mark(p, name, &from));
            if ((p->sp - from) % 2) return BAD("%s with an odd number of values (%zu): keys and values must pair up", name, p->sp - from);
            nd_pk *d;
            if (c == 'u') {
                if (from == base(p) || from < 1) return BAD("stack underflow: SETITEMS has no dict below its MARK");
                d = p->stack[from - 1];
            } else if (!(d = new_node(p, ND_PK_DICT))) return NOMEM();
            for (size_t i = from; i < p->sp; i += 2) TRY(dict_set(p, d, p->stack[i], p->stack[i + 1], name));
            p->sp = from;
            if (c == 'd') TRY(push(p, d));
            break;
        }
        case 'q': TRY(need(p, 1, "BINPUT")); TRY(want(p, 1, "BINPUT")); TRY(memo_put(p, rd_le(p, 1), p->stack[p->sp - 1])); break;
        case 'r': TRY(need(p, 4, "LONG_BINPUT")); TRY(want(p, 1, "LONG_BINPUT")); TRY(memo_put(p, rd_le(p, 4), p->stack[p->sp - 1])); break;
        case 0x94: TRY(want(p, 1, "MEMOIZE")); TRY(memo_put(p, p->memo_n, p->stack[p->sp - 1])); break;
        case 'p': { uint64_t i; TRY(want(p, 1, "PUT")); TRY(text_index(p, "PUT", &i)); TRY(memo_put(p, i, p->stack[p->sp - 1])); break; }
        case 'h': TRY(need(p, 1, "BINGET")); TRY(memo_get(p, rd_le(p, 1))); break;
        case 'j': TRY(need(p, 4, "LONG_BINGET")); TRY(memo_get(p, rd_le(p, 4))); break;
        case 'g': { uint64_t i; TRY(text_index(p, "GET", &i)); TRY(memo_get(p, i)); break; }
        case 'c': { /* GLOBAL module\nname\n */
            const char *m = NULL, *n = NULL;
            size_t ml = 0, nl = 0;
            TRY(rd_line(p, NAME_MAX_LEN, "GLOBAL", &m, &ml));
            TRY(rd_line(p, NAME_MAX_LEN, "GLOBAL", &n, &nl));
            TRY(push_global(p, m, ml, n, nl));
            break;
        }
        case 0x93: { /* STACK_GLOBAL: module and name from the stack */
            TRY(want(p, 2, "STACK_GLOBAL"));
            nd_pk *m = p->stack[p->sp - 2], *n = p->stack[p->sp - 1];
            if (m->kind != ND_PK_STR || n->kind != ND_PK_STR)
                return BAD("STACK_GLOBAL needs two str values, got %s and %s", kind_name(m->kind), kind_name(n->kind));
            p->sp -= 2;
            TRY(push_global(p, m->u.str.s, m->u.str.len, n->u.str.s, n->u.str.len));
            break;
        }
        case 'R': { /* REDUCE */
            TRY(want(p, 2, "REDUCE"));
            nd_pk *fn = p->stack[p->sp - 2], *args = p->stack[p->sp - 1];
            TRY(apply(p, fn, args, 0, &v));
            p->sp -= 2;
            TRY(push(p, v));
            break;
        }
        case 0x81: { /* NEWOBJ cls.__new__(cls, *args): only OrderedDict */
            TRY(want(p, 2, "NEWOBJ"));
            nd_pk *cls = p->stack[p->sp - 2], *args = p->stack[p->sp - 1];
            if (cls->kind != ND_PK_GLOBAL || cls->u.global.id != ND_PKG_ORDERED_DICT)
                return BAD("NEWOBJ of %s (only collections.OrderedDict can be created)",
                           cls->kind == ND_PK_GLOBAL ? cls->u.global.name : kind_name(cls->kind));
            if (args->kind != ND_PK_TUPLE || args->u.seq.n)
                return BAD("NEWOBJ of collections.OrderedDict with arguments");
            p->sp -= 2;
            TRY(push(p, new_node(p, ND_PK_DICT)));
            break;
        }
        case 'b': { /* BUILD: OrderedDict's _metadata (and empty state) is ignored */
            TRY(want(p, 2, "BUILD"));
            nd_pk *obj = p->stack[p->sp - 2], *state = p->stack[p->sp - 1];
            if (obj->kind == ND_PK_DICT || (obj->kind == ND_PK_TENSOR && empty_or_none(state))) {
                p->sp--;
                break;
            }
            return BAD("BUILD on a %s is not supported (only on an OrderedDict)", kind_name(obj->kind));
        }
        case 'Q': /* BINPERSID */
            TRY(want(p, 1, "BINPERSID"));
            TRY(persistent_load(p, p->stack[p->sp - 1], &v));
            p->stack[p->sp - 1] = v;
            break;
        default: {
            const char *name = opcode_name(c);
            if (name)
                return BAD("opcode %s (0x%02x) is not supported%s", name, c,
                           c == 'i' || c == 'o' || (c >= 0x82 && c <= 0x84) || c == 0x92
                               ? ": it would create arbitrary objects" : "");
            return BAD("unknown opcode 0x%02x", c);
        }
        }
    }
}

nd_status nd_pickle_load(const char *op, const char *what, const void *buf, size_t len,
                         nd_pk_doc **out) {
    return nd_pickle_load_limited(op, what, buf, len, NULL, out);
}

nd_status nd_pickle_load_limited(const char *op, const char *what, const void *buf, size_t len,
                                 const nd_pk_limits *limits, nd_pk_doc **out) {
    *out = NULL;
    parser P = {.op = op, .what = what, .buf = buf, .len = len}, *p = &P;
    p->max_items = limits && limits->max_items ? limits->max_items : ND_PK_DEFAULT_MAX_ITEMS;
    p->items_left = p->max_items;
    nd_status st;
    nd_pk_doc *doc = NULL;
    nd_pk *root = NULL;
    p->marks = malloc(ND_PK_MAX_DEPTH * sizeof *p->marks);
    p->stack_cap = 64; /* never NULL: `stack + sp` is computed even when empty */
    p->stack = malloc(p->stack_cap * sizeof *p->stack);
    p->walk_cap = 64;
    p->walk = malloc(p->walk_cap * sizeof *p->walk);
    p->budget = 64ull * (len + 1024);
    p->seed = hash_bytes(0x6e65656465ull, buf, len);
    if (!p->marks || !p->stack || !p->walk) st = NOMEM();
    else st = run(p, &root);
    if (st == ND_OK) {
        doc = arena_alloc(&p->ar, sizeof *doc);
        if (!doc) st = NOMEM();
    }
    free(p->marks);
    free(p->stack);
    free(p->walk);
    free(p->memo.s);
    free(p->dkeys.s);
    free(p->storages.s);
    free(p->encoded.s);
    if (st != ND_OK) {
        arena_free(&p->ar);
        return st;
    }
    /* the doc lives in its own arena: remember where the arena starts */
    arena *a = arena_alloc(&p->ar, sizeof *a);
    if (!a) {
        arena_free(&p->ar);
        return perr(p, ND_ERR_MEMORY, "out of memory");
    }
    *a = p->ar;
    doc->root = root;
    doc->_arena = a;
    *out = doc;
    return ND_OK;
}

void nd_pickle_free(nd_pk_doc *doc) {
    if (!doc) return;
    arena a = *(arena *)doc->_arena; /* copied out: it lives in the arena itself */
    arena_free(&a);
}
