/* torch_load.c - PyTorch checkpoints (torch.save's zip format) without
 * Python (see torch_load.h). The file is untrusted from its first byte:
 * the zip reader checks the archive, the restricted unpickler builds a tree
 * of plain values without calling anything, and this file checks every
 * storage against its zip entry (exact byte count) and every tensor's
 * extent against its storage before any tensor exists, so no view can
 * reach outside the memory it was given. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
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
    /* the file's bytes: mapped, or read into the heap when mmap fails */
    void *map;
    size_t map_len;
    void *heap;
    void *pkl_owned; /* an inflated data.pkl */
    srec *recs;
    nd_tensor **tensors;
    size_t ntensors, cap_tensors;
} impl;

/* state of one load */
typedef struct {
    const char *op, *what;
    const nd_torch_opts *opts;
    uint64_t max_bytes;
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

static nd_status materialise_storage(loader *L, nd_pk *s) {
    if (s->u.storage.user) return ND_OK;
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
    for (srec *r = L->by_entry[idx]; r; r = r->next_same)
        if (r->elem == s->u.storage.elem) {
            if (r->numel != numel)
                return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' is used with %lld and with %lld elements of %s", kb,
                             (long long)r->numel, (long long)numel, nd_pk_elem_name(r->elem));
            s->u.storage.user = r;
            return ND_OK;
        }
    /* exact sizes, overflow-checked */
    if ((uint64_t)numel > SIZE_MAX / 8)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' is too large (%lld elements)", kb, (long long)numel);
    size_t want = (size_t)numel * es, nbytes = (size_t)numel * nd_dtype_size(dt);
    const nd_zip_entry *en = &L->zip->entries[idx];
    if (en->size != (uint64_t)want)
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s' should hold %lld %s elements (%zu bytes) but its entry has "
                     "%llu bytes", kb, (long long)numel, nd_pk_elem_name(s->u.storage.elem), want,
                     (unsigned long long)en->size);
    const uint8_t *data;
    size_t len;
    void *owned;
    ND_TRY(nd_zip_read(L->zip, (size_t)idx, L->max_bytes, &data, &len, &owned));
    if (len != want) { /* nd_zip_read returns the central directory's size: checked above */
        free(owned);
        return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s': entry size changed while reading", kb);
    }
    if (s->u.storage.elem == ND_PKT_BOOL) /* as the safetensors reader: needle's kernels rely on 0/1 */
        for (size_t k = 0; k < len; k++)
            if (data[k] > 1) {
                unsigned v = data[k];
                free(owned);
                return nd_io_fail(ND_ERR_IO, L->op, L->what, "storage '%s': bool element %zu has byte value %u (expected 0 or 1)",
                             kb, k, v);
            }
    srec *r = calloc(1, sizeof *r);
    nd_storage *st = NULL;
    if (!r || nd_storage_new(nbytes, &st) != ND_OK) {
        free(r);
        free(owned);
        return nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory for storage '%s' (%zu bytes)", L->op, L->what, kb,
                       nbytes);
    }
    convert(st->data, dt, data, s->u.storage.elem, (size_t)numel);
    free(owned);
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

/* Every storage and tensor reachable from the root, each container visited
 * once (the tree may share nodes and contain cycles), without recursion. */
static nd_status walk(loader *L, nd_pk *root) {
    pset seen = {0};
    nd_pk **stack = NULL;
    size_t n = 0, cap = 0;
    nd_status st = ND_OK;
#define PUSH(v) do { nd_pk *v_ = (v); \
        if (!v_) break; \
        if (n == cap) { size_t nc_ = cap ? cap * 2 : 64; nd_pk **ns_ = realloc(stack, nc_ * sizeof *ns_); \
            if (!ns_) { st = nd_fail(ND_ERR_MEMORY, "%s: '%s': out of memory", L->op, L->what); goto done; } \
            stack = ns_; cap = nc_; } \
        stack[n++] = v_; } while (0)
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
        case ND_PK_STORAGE:
            st = materialise_storage(L, v);
            break;
        case ND_PK_TENSOR:
            st = materialise_tensor(L, v);
            break;
        default:
            break;
        }
        if (st != ND_OK) goto done;
    }
#undef PUSH
done:
    free(stack);
    free(seen.slots);
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

static nd_status load_zip(loader *L, const uint8_t *buf, size_t len, nd_torch_file *f) {
    ND_TRY(nd_zip_open(L->op, L->what, buf, len, &L->zip));
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
        ND_TRY(nd_zip_read(L->zip, (size_t)bi, 64, &d, &n, &owned));
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
    ND_TRY(nd_zip_read(L->zip, pkl, L->max_bytes, &p, &n, &L->im->pkl_owned));
    ND_TRY(nd_pickle_load(L->op, L->what, p, n, &f->doc));
    return walk(L, f->doc->root);
}

/* The legacy format (torch < 1.6, or _use_new_zipfile_serialization=False)
 * is a bare pickle stream starting with the magic number 0x1950a86a20f9469cfc6c
 * (protocol 2: 80 02 8a 0a 6c fc 9c 46 f9 20 6a a8 50 19). */
static bool is_legacy(const uint8_t *b, size_t len) {
    return len >= 2 && b[0] == 0x80 && b[1] >= 1 && b[1] <= 5;
}

static nd_status load_bytes(const char *op, const char *what, const uint8_t *buf, size_t len,
                            const nd_torch_opts *opts, impl *im, nd_torch_file *f) {
    if (len >= 4 && buf[0] == 'P' && buf[1] == 'K' &&
        ((buf[2] == 3 && buf[3] == 4) || (buf[2] == 5 && buf[3] == 6))) {
        nd_torch_opts defaults = {false, 0};
        loader L = {0};
        L.op = op;
        L.what = what;
        L.opts = opts ? opts : &defaults;
        L.max_bytes = L.opts->max_bytes ? L.opts->max_bytes : ND_GUNZIP_DEFAULT_MAX;
        L.im = im;
        nd_status st = load_zip(&L, buf, len, f);
        free(L.by_entry);
        free(L.name_buf);
        nd_zip_close(L.zip);
        return st;
    }
    if (is_legacy(buf, len))
        return nd_io_fail(ND_ERR_IO, op, what, "the file is in PyTorch's legacy (pre-1.6) format, which needle does not read; "
                     "re-save it in PyTorch >= 1.6: torch.save(torch.load(path), path)");
    if (len == 0) return nd_io_fail(ND_ERR_IO, op, what, "not a PyTorch checkpoint (zip) file: the file is empty");
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
        if (im->map) munmap(im->map, im->map_len);
        free(im->heap);
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

nd_status nd_torch_load_memory(const char *op, const char *what, const void *buf, size_t len,
                               const nd_torch_opts *opts, nd_torch_file **out) {
    *out = NULL;
    if (!op) op = "load_torch";
    if (!what) what = "(memory)";
    nd_torch_file *f;
    ND_TRY(new_file(op, &f));
    impl *im = f->_impl;
    nd_status st = load_bytes(op, what, buf, len, opts, im, f);
    free(im->pkl_owned);
    im->pkl_owned = NULL;
    if (st != ND_OK) {
        nd_torch_free(f);
        return st;
    }
    *out = f;
    return ND_OK;
}

/* The whole file, mapped read-only (or read, where mmap fails). */
static nd_status map_file(const char *op, const char *path, impl *im, const uint8_t **buf, size_t *len) {
    int fd;
    uint64_t fsize;
    ND_TRY(nd_open_regular(op, path, &fd, &fsize));
    if (fsize > (uint64_t)SIZE_MAX / 2) {
        close(fd);
        return nd_fail(ND_ERR_IO, "%s: '%s': the file is too large", op, path);
    }
    size_t n = (size_t)fsize;
    *len = n;
    if (n == 0) {
        close(fd);
        *buf = (const uint8_t *)"";
        return ND_OK;
    }
    void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
        close(fd);
        im->map = m;
        im->map_len = n;
        *buf = m;
        return ND_OK;
    }
    uint8_t *h = malloc(n);
    if (!h) {
        close(fd);
        return nd_fail(ND_ERR_MEMORY, "%s: out of memory reading '%s' (%zu bytes)", op, path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, h + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : 0;
            free(h);
            close(fd);
            return nd_fail(ND_ERR_IO, "%s: cannot read '%s': %s", op, path,
                           err ? strerror(err) : "the file shrank while it was read");
        }
        got += (size_t)r;
    }
    close(fd);
    im->heap = h;
    *buf = h;
    return ND_OK;
}

nd_status nd_torch_load(const char *op, const char *path, const nd_torch_opts *opts, nd_torch_file **out) {
    *out = NULL;
    if (!op) op = "load_torch";
    if (!path || !*path) return nd_fail(ND_ERR_ARG, "%s: empty file name", op);
    nd_torch_file *f;
    ND_TRY(new_file(op, &f));
    const uint8_t *buf = NULL;
    size_t len = 0;
    impl *im = f->_impl;
    nd_status st = map_file(op, path, im, &buf, &len);
    if (st == ND_OK) st = load_bytes(op, path, buf, len, opts, im, f);
    /* storages hold copies and the doc its own strings: the file can go */
    free(im->pkl_owned);
    im->pkl_owned = NULL;
    if (im->map) munmap(im->map, im->map_len);
    im->map = NULL;
    free(im->heap);
    im->heap = NULL;
    if (st != ND_OK) {
        nd_torch_free(f);
        return st;
    }
    *out = f;
    return ND_OK;
}

nd_status nd_torch_storage_tensor(const nd_pk *storage, nd_tensor **out) {
    *out = NULL;
    if (!storage || storage->kind != ND_PK_STORAGE || !storage->u.storage.user)
        return nd_fail(ND_ERR_ARG, "load_torch: not a loaded storage");
    const srec *r = storage->u.storage.user;
    int64_t shape[1] = {r->numel}, stride[1] = {1};
    return nd_tensor_wrap(r->storage, r->dtype, shape, stride, 1, 0, out);
}
