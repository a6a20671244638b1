/* torch_load.c - PyTorch checkpoints (torch.save's zip format) without
 * Python (see torch_load.h). The file is untrusted from its first byte:
 * the zip reader checks the archive, the restricted unpickler builds a tree
 * of plain values without calling anything, and this file checks every
 * storage against its zip entry (exact byte count) and every tensor's
 * extent against its storage before any tensor exists, so no view can
 * reach outside the memory it was given. The file is read with pread
 * (io.h: nd_io_src), never mapped: one truncated or rewritten while it is
 * read fails with an error (a mapping would raise SIGBUS, which pcall
 * cannot catch). A load has a budget: the bytes its deflated entries
 * inflate to, checked for all storages together before any is read, and
 * the items of the pickle (values and container elements, pickle.h), so a
 * small file cannot make it allocate gigabytes. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "io/torch_load.h"
#include "io/zip.h"
#include "tensor.h"

/* One storage as needle holds it: a zip entry read as one element type.
 * Storage nodes of the pickle that name the same entry with the same type
 * (torch writes one per view) share it, so their tensors share memory. */
typedef struct srec {
    struct srec *next_same; /* other element types of the same entry */
    struct srec *next_all;
    nd_pk_elem elem;
    int64_t numel;
    nd_dtype dtype;
    nd_storage *storage;
} srec;

typedef struct {
    void *pkl_owned; /* data.pkl, inflated or read from the file */
    srec *recs;
    nd_tensor **tensors;
    size_t ntensors, cap_tensors;
} impl;

/* state of one load */
typedef struct {
    const char *op, *what;
    const nd_torch_opts *opts;
    uint64_t max_bytes;   /* the budget of decompressed bytes (opts or the default) */
    uint64_t bytes_left;  /* what is left of it */
    nd_zip *zip;
    const char *root;
    size_t root_len;
    srec **by_entry; /* zip entry index -> its storages */
    impl *im;
    char *name_buf;
} loader;


/* a storage key for messages (printable ASCII, cut short) */
static const char *show_key(const char *s, size_t n, char *buf) {
    size_t o = 0;
    for (size_t i = 0; i < n && o < 80; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, 8, "\\x%02x", c);
    }
    if (o >= 80) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = 0;
    return buf;
}
#define KEY_BUF 100

/* ------------------------------------------------------------ a pointer set */
typedef struct {
    const void **slots;
    size_t cap, n;
} pset;

static size_t phash(const void *p, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* 1: added, 0: already there, -1: out of memory */
static int pset_add(pset *s, const void *p) {
    if ((s->n + 1) * 2 > s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        const void **ns = calloc(ncap, sizeof *ns);
        if (!ns) return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i]) {
                size_t j = phash(s->slots[i], ncap);
                while (ns[j]) j = (j + 1) & (ncap - 1);
                ns[j] = s->slots[i];
            }
        free(s->slots);
        s->slots = ns;
        s->cap = ncap;
    }
    size_t j = phash(p, s->cap);
    while (s->slots[j]) {
        if (s->slots[j] == p) return 0;
        j = (j + 1) & (s->cap - 1);
    }
    s->slots[j] = p;
    s->n++;
    return 1;
}

/* ------------------------------------------------------------ storages */

static nd_dtype target_dtype(nd_pk_elem e, bool half_to_float) {
    switch (e) {
    case ND_PKT_FLOAT32: return ND_FLOAT32;
    case ND_PKT_FLOAT64: return ND_FLOAT64;
    case ND_PKT_FLOAT16: return half_to_float ? ND_FLOAT32 : ND_FLOAT16;
    case ND_PKT_BFLOAT16: return half_to_float ? ND_FLOAT32 : ND_BFLOAT16;
    case ND_PKT_INT64: return ND_INT64;
    case ND_PKT_INT32: case ND_PKT_INT16: case ND_PKT_INT8: return ND_INT32;
    case ND_PKT_UINT8: return ND_UINT8;
    case ND_PKT_BOOL: return ND_BOOL;
    }
    return ND_NUM_DTYPES;
}

/* src holds n elements of e (little-endian); dst gets them as dt */
static void convert(void *dst, nd_dtype dt, const uint8_t *src, nd_pk_elem e, size_t n) {
    size_t es = nd_pk_elem_size(e);
    if (nd_dtype_size(dt) == es) {
        memcpy(dst, src, n * es);
        return;
    }
    switch (e) {
    case ND_PKT_FLOAT16: {
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = nd_half_to_float((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        break;
    }
    case ND_PKT_BFLOAT16: {
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = nd_bf16_to_float((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        break;
    }
    case ND_PKT_INT16: {
        int32_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (int16_t)(uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
        break;
    }
    case ND_PKT_INT8: {
        int32_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (int8_t)src[i];
        break;
    }
    default: /* same size: handled above */
        break;
    }
}

/* The zip entry <root>/data/<key> of storage node s, checked: a known
 * element type, a valid count, and an entry of exactly numel * element size
 * bytes (overflow-checked). */
static nd_status storage_entry(loader *L, const nd_pk *s, size_t *entry) {
    char kb[KEY_BUF];
    const char *key = s->u.storage.key;
    size_t key_len = s->u.storage.key_len;
    show_key(key ? key : "", key ? key_len : 0, kb);
    size_t es = nd_pk_elem_size(s->u.storage.elem);
    nd_dtype dt = target_dtype(s->u.storage.elem, L->opts->half_to_float);
    if (es == 0 || dt == ND_NUM_DTYPES)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' has an unknown element type (%d)", kb, (int)s->u.storage.elem);
    int64_t numel = s->u.storage.numel;
    if (numel < 0 || numel > ND_MAX_NUMEL)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' has an invalid element count (%lld)", kb, (long long)numel);
    /* <root>/data/<key> */
    if (!key || key_len == 0 || key_len > 0xFFFF)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' has an invalid key", kb);
    size_t nlen = L->root_len + 6 + key_len;
    char *name = realloc(L->name_buf, nlen + 1);
    if (!name) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what);
    L->name_buf = name;
    memcpy(name, L->root, L->root_len);
    memcpy(name + L->root_len, "/data/", 6);
    memcpy(name + L->root_len + 6, key, key_len);
    name[nlen] = 0;
    int64_t idx = nd_zip_find(L->zip, name, nlen);
    if (idx < 0) {
        char rb[KEY_BUF];
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' has no entry '%s/data/%s' in the archive", kb,
                     show_key(L->root, L->root_len, rb), kb);
    }
    /* exact sizes, overflow-checked */
    if ((uint64_t)numel > SIZE_MAX / 8)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' is too large (%lld elements)", kb, (long long)numel);
    size_t want = (size_t)numel * es;
    const nd_zip_entry *en = &L->zip->entries[idx];
    if (en->size != (uint64_t)want)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' should hold %lld %s elements (%zu bytes) but its entry has "
                     "%llu bytes", kb, (long long)numel, nd_pk_elem_name(s->u.storage.elem), want,
                     (unsigned long long)en->size);
    *entry = (size_t)idx;
    return ND_OK;
}

static const char *const BUDGET_HINT = "nd.load_torch's option max_decompressed_bytes raises it";

/* Charges the bytes entry i inflates to (if it is deflated) to the load's
 * budget, before anything is allocated for them. */
static nd_status charge_entry(loader *L, size_t i) {
    const nd_zip_entry *en = &L->zip->entries[i];
    if (en->method == 0) return ND_OK;
    if (en->size > L->bytes_left) {
        char nb[KEY_BUF];
        return nd_io_fail(ND_ERR_MEMORY, L->op, L->what, "entry '%s' decompresses to %llu bytes, more than the %llu left of "
                          "the limit of %llu decompressed bytes per load (%s)",
                          show_key(en->name, en->name_len, nb), (unsigned long long)en->size,
                          (unsigned long long)L->bytes_left, (unsigned long long)L->max_bytes, BUDGET_HINT);
    }
    L->bytes_left -= en->size;
    return ND_OK;
}

/* Entry i's content (nd_zip_read), charged to the budget. */
static nd_status read_entry_budgeted(loader *L, size_t i, const uint8_t **data, size_t *len, void **owned) {
    ND_TRY(charge_entry(L, i));
    return nd_zip_read(L->zip, i, L->zip->entries[i].size, data, len, owned);
}

static nd_status materialise_storage(loader *L, nd_pk *s) {
    if (s->u.storage.user) return ND_OK;
    char kb[KEY_BUF];
    show_key(s->u.storage.key ? s->u.storage.key : "", s->u.storage.key ? s->u.storage.key_len : 0, kb);
    size_t idx;
    ND_TRY(storage_entry(L, s, &idx));
    int64_t numel = s->u.storage.numel;
    nd_dtype dt = target_dtype(s->u.storage.elem, L->opts->half_to_float);
    size_t want = (size_t)numel * nd_pk_elem_size(s->u.storage.elem), nbytes = (size_t)numel * nd_dtype_size(dt);
    for (srec *r = L->by_entry[idx]; r; r = r->next_same)
        if (r->elem == s->u.storage.elem) {
            if (r->numel != numel)
                return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' is used with %lld and with %lld elements of %s", kb,
                             (long long)r->numel, (long long)numel, nd_pk_elem_name(r->elem));
            s->u.storage.user = r;
            return ND_OK;
        }
    ND_TRY(charge_entry(L, idx));
    srec *r = calloc(1, sizeof *r);
    nd_storage *st = NULL;
    if (!r || nd_storage_new(nbytes, &st) != ND_OK) {
        free(r);
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory for storage '%s' (%zu bytes)", L->op, L->what, kb,
                       nbytes);
    }
    nd_status status;
    const uint8_t *data = st->data;
    if (nbytes == want) {
        /* kept as it is: read (or inflated) straight into the storage */
        status = nd_zip_read_into(L->zip, idx, st->data, want);
    } else {
        size_t len;
        void *owned = NULL;
        status = nd_zip_read(L->zip, idx, want, &data, &len, &owned);
        if (status == ND_OK) convert(st->data, dt, data, s->u.storage.elem, (size_t)numel);
        free(owned);
        data = st->data;
    }
    if (status == ND_OK && s->u.storage.elem == ND_PKT_BOOL) /* as the safetensors reader: needle's kernels rely on 0/1 */
        for (size_t k = 0; k < want; k++)
            if (data[k] > 1) {
                status = nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s': bool element %zu has byte value %u (expected 0 "
                                    "or 1)", kb, k, data[k]);
                break;
            }
    if (status != ND_OK) {
        nd_storage_release(st);
        free(r);
        return status;
    }
    r->elem = s->u.storage.elem;
    r->numel = numel;
    r->dtype = dt;
    r->storage = st;
    r->next_same = L->by_entry[idx];
    L->by_entry[idx] = r;
    r->next_all = L->im->recs;
    L->im->recs = r;
    s->u.storage.user = r;
    return ND_OK;
}

/* ------------------------------------------------------------ tensors */

static nd_status materialise_tensor(loader *L, nd_pk *t) {
    if (t->u.tensor.user) return ND_OK;
    nd_pk *s = t->u.tensor.storage;
    if (!s || s->kind != ND_PK_STORAGE)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "a tensor's storage is not a storage of the archive");
    ND_TRY(materialise_storage(L, s));
    const srec *r = s->u.storage.user;
    char kb[KEY_BUF], sb[ND_SHAPE_BUF];
    show_key(s->u.storage.key, s->u.storage.key_len, kb);
    int nd = t->u.tensor.ndim;
    if (nd < 0 || nd > ND_MAX_DIMS)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "a tensor over storage '%s' has %d dims (at most %d)", kb, nd, ND_MAX_DIMS);
    const int64_t *shape = t->u.tensor.shape, *stride = t->u.tensor.stride;
    int64_t off = t->u.tensor.offset, numel;
    /* the size rule of every tensor (tensor.h), as nd.save's files obey it */
    char label[KEY_BUF + 32];
    snprintf(label, sizeof label, "a tensor over storage '%s'", kb);
    if (nd_check_shape(label, shape, nd, &numel) != ND_OK ||
        nd_check_strides(label, shape, stride, nd) != ND_OK)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "%s", nd_last_error());
    if (off < 0 || off > r->numel)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "a tensor's offset %lld lies outside storage '%s' (%lld elements)",
                     (long long)off, kb, (long long)r->numel);
    if (numel > 0) {
        /* the last element it reaches: off + sum((shape-1) * stride) < numel */
        int64_t last = off;
        for (int i = 0; i < nd; i++) {
            int64_t k = shape[i] - 1;
            if (k > 0 && stride[i] > (INT64_MAX - last) / k) { last = INT64_MAX; break; }
            last += k * stride[i];
        }
        if (last >= r->numel)
            return nd_io_fail(ND_ERR_IO, L->op, L->what, "a tensor of shape %s (offset %lld) reaches element %lld of storage "
                         "'%s', which has %lld elements", nd_shape_str(shape, nd, sb), (long long)off,
                         (long long)last, kb, (long long)r->numel);
    }
    impl *im = L->im;
    if (im->ntensors == im->cap_tensors) {
        size_t nc = im->cap_tensors ? im->cap_tensors * 2 : 16;
        nd_tensor **nt = realloc(im->tensors, nc * sizeof *nt);
        if (!nt) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what);
        im->tensors = nt;
        im->cap_tensors = nc;
    }
    nd_tensor *x;
    ND_TRY(nd_tensor_wrap(r->storage, r->dtype, shape, stride, nd, off, &x));
    im->tensors[im->ntensors++] = x;
    t->u.tensor.user = x;
    return ND_OK;
}

/* Every storage and tensor reachable from the root, in the order they are
 * met, each container visited once (the tree may share nodes), without
 * recursion. */
static nd_status collect(loader *L, nd_pk *root, nd_pk ***out, size_t *nout) {
    pset seen = {0};
    nd_pk **stack = NULL, **found = NULL;
    size_t n = 0, cap = 0, nf = 0, capf = 0;
    nd_status st = ND_OK;
#define GROW(arr, len, cp) do { if (len == cp) { size_t nc_ = cp ? cp * 2 : 64; \
            nd_pk **na_ = realloc(arr, nc_ * sizeof *na_); \
            if (!na_) { st = nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what); goto done; } \
            arr = na_; cp = nc_; } } while (0)
#define PUSH(v) do { nd_pk *v_ = (v); if (!v_) break; GROW(stack, n, cap); stack[n++] = v_; } while (0)
    PUSH(root);
    while (n > 0) {
        nd_pk *v = stack[--n];
        switch (v->kind) {
        case ND_PK_TUPLE: case ND_PK_LIST: case ND_PK_DICT: {
            int a = pset_add(&seen, v);
            if (a < 0) { st = nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what); goto done; }
            if (a == 0) break;
            if (v->kind == ND_PK_DICT) {
                for (size_t i = v->u.dict.n; i-- > 0;) {
                    PUSH(v->u.dict.values[i]);
                    PUSH(v->u.dict.keys[i]);
                }
            } else {
                for (size_t i = v->u.seq.n; i-- > 0;) PUSH(v->u.seq.items[i]);
            }
            break;
        }
        case ND_PK_STORAGE: case ND_PK_TENSOR:
            GROW(found, nf, capf);
            found[nf++] = v;
            break;
        default:
            break;
        }
    }
#undef PUSH
#undef GROW
done:
    free(stack);
    free(seen.slots);
    if (st != ND_OK) {
        free(found);
        return st;
    }
    *out = found;
    *nout = nf;
    return ND_OK;
}

/* The budget, before any storage is read: the bytes every deflated entry
 * the storages name inflates to (each entry counted once per element type
 * it is read as, as materialise_storage reads it), against what is left. */
static nd_status check_budget(loader *L, nd_pk **nodes, size_t n) {
    uint16_t *types = calloc(L->zip->n ? L->zip->n : 1, sizeof *types); /* bit e: read as element type e */
    if (!types) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what);
    uint64_t total = 0;
    size_t count = 0;
    nd_status st = ND_OK;
    for (size_t i = 0; i < n && st == ND_OK; i++) {
        const nd_pk *s = nodes[i]->kind == ND_PK_TENSOR ? nodes[i]->u.tensor.storage : nodes[i];
        if (!s || s->kind != ND_PK_STORAGE) continue; /* materialise_tensor says what is wrong */
        size_t idx;
        st = storage_entry(L, s, &idx);
        if (st != ND_OK) break;
        const nd_zip_entry *en = &L->zip->entries[idx];
        unsigned bit = 1u << ((unsigned)s->u.storage.elem & 15);
        if (en->method == 0 || (types[idx] & bit)) continue;
        types[idx] |= (uint16_t)bit;
        total = en->size > UINT64_MAX - total ? UINT64_MAX : total + en->size;
        count++;
    }
    free(types);
    ND_TRY(st);
    if (total > L->bytes_left)
        return nd_io_fail(ND_ERR_MEMORY, L->op, L->what, "its %zu deflated storages decompress to %llu bytes in all, more "
                          "than the %llu left of the limit of %llu decompressed bytes per load (%s)", count,
                          (unsigned long long)total, (unsigned long long)L->bytes_left,
                          (unsigned long long)L->max_bytes, BUDGET_HINT);
    return ND_OK;
}

/* Every storage and tensor reachable from the root: the budget is checked
 * for all of them, then each is read and checked in turn. */
static nd_status walk(loader *L, nd_pk *root) {
    nd_pk **nodes;
    size_t n;
    ND_TRY(collect(L, root, &nodes, &n));
    nd_status st = check_budget(L, nodes, n);
    for (size_t i = 0; i < n && st == ND_OK; i++)
        st = nodes[i]->kind == ND_PK_STORAGE ? materialise_storage(L, nodes[i]) : materialise_tensor(L, nodes[i]);
    free(nodes);
    return st;
}

/* ------------------------------------------------------------ the archive */

/* The single <root>/data.pkl (root: one path component). */
static nd_status find_root(loader *L, size_t *pkl) {
    const nd_zip *z = L->zip;
    size_t found = 0;
    for (size_t i = 0; i < z->n; i++) {
        const nd_zip_entry *e = &z->entries[i];
        if (e->name_len <= 9 || memcmp(e->name + e->name_len - 9, "/data.pkl", 9) != 0) continue;
        size_t rl = e->name_len - 9;
        if (memchr(e->name, '/', rl)) continue; /* data.pkl deeper in the tree */
        if (found++) {
            char kb[KEY_BUF], kb2[KEY_BUF];
            return nd_io_fail(ND_ERR_IO, L->op, L->what, "several checkpoints in one archive ('%s/data.pkl' and '%s/data.pkl')",
                         show_key(L->root, L->root_len, kb), show_key(e->name, rl, kb2));
        }
        L->root = e->name;
        L->root_len = rl;
        *pkl = i;
    }
    if (!found)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "a zip archive without a '<folder>/data.pkl' entry: not a PyTorch checkpoint");
    return ND_OK;
}

static nd_status load_zip(loader *L, const nd_io_src *src, nd_torch_file *f) {
    ND_TRY(nd_zip_open_src(src, &L->zip));
    size_t pkl = 0;
    ND_TRY(find_root(L, &pkl));
    /* newer torch records the byte order; the data must be little-endian */
    char *bo = malloc(L->root_len + 11);
    if (!bo) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what);
    memcpy(bo, L->root, L->root_len);
    memcpy(bo + L->root_len, "/byteorder", 10);
    int64_t bi = nd_zip_find(L->zip, bo, L->root_len + 10);
    free(bo);
    if (bi >= 0) {
        const uint8_t *d;
        size_t n;
        void *owned;
        if (L->zip->entries[bi].size > 64)
            return nd_io_fail(ND_ERR_IO, L->op, L->what, "the checkpoint's byteorder entry has %llu bytes (expected 'little')",
                              (unsigned long long)L->zip->entries[bi].size);
        ND_TRY(read_entry_budgeted(L, (size_t)bi, &d, &n, &owned));
        bool little = n == 6 && memcmp(d, "little", 6) == 0;
        char kb[KEY_BUF];
        show_key((const char *)d, n, kb);
        free(owned);
        if (!little)
            return nd_io_fail(ND_ERR_IO, L->op, L->what, "the checkpoint's byte order is '%s', not 'little': needle reads only "
                         "little-endian data", kb);
    }
    L->by_entry = calloc(L->zip->n ? L->zip->n : 1, sizeof *L->by_entry);
    if (!L->by_entry) return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what);
    const uint8_t *p;
    size_t n;
    ND_TRY(read_entry_budgeted(L, pkl, &p, &n, &L->im->pkl_owned));
    nd_pk_limits lim = {L->opts->max_items};
    ND_TRY(nd_pickle_load_limited(L->op, L->what, p, n, &lim, &f->doc));
    /* the pickle's strings live in the doc: a copy read from the file can go */
    free(L->im->pkl_owned);
    L->im->pkl_owned = NULL;
    return walk(L, f->doc->root);
}

/* The checkpoint in src, whatever the format says it is (io.h:
 * nd_detect_format): a zip is read, the rest is refused with what it is. */
static nd_status load_src(const nd_io_src *src, const nd_torch_opts *opts, impl *im, nd_torch_file *f) {
    const char *op = src->op, *what = src->what;
    nd_file_format fmt;
    ND_TRY(nd_detect_format(src, &fmt));
    switch (fmt) {
    case ND_FMT_ZIP: {
        nd_torch_opts defaults = {0};
        loader L = {0};
        L.op = op;
        L.what = what;
        L.opts = opts ? opts : &defaults;
        L.max_bytes = L.opts->max_decompressed_bytes ? L.opts->max_decompressed_bytes : ND_TORCH_DEFAULT_MAX_DECOMPRESSED;
        L.bytes_left = L.max_bytes;
        L.im = im;
        nd_status st = load_zip(&L, src, f);
        free(L.by_entry);
        free(L.name_buf);
        nd_zip_close(L.zip);
        return st;
    }
    case ND_FMT_TORCH_LEGACY:
        return nd_io_fail(ND_ERR_IO, op, what, "the file is in PyTorch's legacy (pre-1.6) format, which needle does not read; "
                     "re-save it in PyTorch >= 1.6: torch.save(torch.load(path), path)");
    case ND_FMT_SAFETENSORS:
        return nd_io_fail(ND_ERR_IO, op, what, "not a PyTorch checkpoint (zip) file: it is a safetensors file, which nd.load reads");
    case ND_FMT_UNKNOWN:
        break;
    }
    if (src->size == 0) return nd_io_fail(ND_ERR_IO, op, what, "not a PyTorch checkpoint (zip) file: the file is empty");
    unsigned char b[2] = {0, 0};
    if (src->size >= 2) ND_TRY(nd_src_read(src, 0, b, 2));
    if (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return nd_io_fail(ND_ERR_IO, op, what, "not a PyTorch checkpoint (zip) file: it is a bare pickle stream without "
                          "the magic number torch.save's legacy format starts with");
    return nd_io_fail(ND_ERR_IO, op, what, "not a PyTorch checkpoint (zip) file");
}

void nd_torch_free(nd_torch_file *f) {
    if (!f) return;
    impl *im = f->_impl;
    if (im) {
        for (size_t i = 0; i < im->ntensors; i++) nd_release(im->tensors[i]);
        free(im->tensors);
        for (srec *r = im->recs, *nx; r; r = nx) {
            nx = r->next_all;
            nd_storage_release(r->storage);
            free(r);
        }
    }
    nd_pickle_free(f->doc);
    if (im) {
        free(im->pkl_owned);
        free(im);
    }
    free(f);
}

static nd_status new_file(const char *op, nd_torch_file **f) {
    *f = calloc(1, sizeof **f);
    if (*f) (*f)->_impl = calloc(1, sizeof(impl));
    if (!*f || !(*f)->_impl) {
        free(*f);
        *f = NULL;
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory", op);
    }
    return ND_OK;
}

/* Loads src into a new file object: the storages hold copies and the doc
 * its own strings, so nothing in the result points into src. */
static nd_status load_new(const nd_io_src *src, const nd_torch_opts *opts, nd_torch_file **out) {
    nd_torch_file *f;
    ND_TRY(new_file(src->op, &f));
    impl *im = f->_impl;
    nd_status st = load_src(src, opts, im, f);
    free(im->pkl_owned);
    im->pkl_owned = NULL;
    if (st != ND_OK) {
        nd_torch_free(f);
        return st;
    }
    *out = f;
    return ND_OK;
}

nd_status nd_torch_load_memory(const char *op, const char *what, const void *buf, size_t len,
                               const nd_torch_opts *opts, nd_torch_file **out) {
    *out = NULL;
    nd_io_src src = nd_src_memory(op ? op : "load_torch", what ? what : "(memory)", buf, len);
    return load_new(&src, opts, out);
}

nd_status nd_torch_load(const char *op, const char *path, const nd_torch_opts *opts, nd_torch_file **out) {
    *out = NULL;
    if (!op) op = "load_torch";
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    nd_io_src src;
    ND_TRY(nd_src_open(op, path, &src));
    nd_status st = load_new(&src, opts, out);
    nd_src_close(&src);
    return st;
}

nd_status nd_torch_storage_tensor(const nd_pk *storage, nd_tensor **out) {
    *out = NULL;
    if (!storage || storage->kind != ND_PK_STORAGE || !storage->u.storage.user)
        return nd_fail(ND_ERR_ARG, "load_torch: not a loaded storage");
    const srec *r = storage->u.storage.user;
    int64_t shape[1] = {r->numel}, stride[1] = {1};
    return nd_tensor_wrap(r->storage, r->dtype, shape, stride, 1, 0, out);
}
