/* fuzz_torch_load.c - libFuzzer harness for whole checkpoints
 * (nd_torch_load_memory: zip + pickle + storages + tensor views).
 *
 * Two modes, picked by the input:
 *  - an input starting with "PK\3\4" is the checkpoint itself (zip-level
 *    mutations; a mutated entry mostly fails its CRC);
 *  - anything else is a data.pkl: the harness unpickles it to learn its
 *    storages, writes a valid stored zip around it (archive/data.pkl,
 *    archive/version, archive/data/<key> of numel * element size bytes,
 *    CRCs right) and loads that, so the tensor geometry, dtype and view
 *    code sees mutated pickles. The input's last byte perturbs the zip:
 *    bit 1 drops the first storage entry, bit 2 makes it one byte short,
 *    bit 3 one byte long.
 * In both modes the last byte's bit 0 is half_to_float, and every tensor of
 * an accepted file is copied out in full, so a view reaching past its
 * storage shows under ASan. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "io/pickle.h"
#include "io/torch_load.h"
#include "needle.h"

#define MAX_STORAGES 64
/* The tree is a DAG (the memo shares nodes: ((t,t,t),(t,t,t),...) doubles at
 * every level), so walks count their visits instead of trusting depth. */
#define MAX_VISITS 100000
static long visits;
#define MAX_STORAGE_BYTES (1u << 20)

static void touch(const nd_pk *v, int depth) {
    if (depth > 32 || ++visits > MAX_VISITS) return;
    switch (v->kind) {
    case ND_PK_TUPLE:
    case ND_PK_LIST:
        for (size_t i = 0; i < v->u.seq.n && i < 256; i++) touch(v->u.seq.items[i], depth + 1);
        break;
    case ND_PK_DICT:
        for (size_t i = 0; i < v->u.dict.n && i < 256; i++) touch(v->u.dict.values[i], depth + 1);
        break;
    case ND_PK_TENSOR: {
        nd_tensor *t = nd_torch_tensor(v);
        if (!t) break;
        size_t bytes = (size_t)nd_numel(t) * nd_dtype_size(nd_get_dtype(t));
        void *buf = malloc(bytes ? bytes : 1);
        if (buf && nd_copy_to_buffer(t, buf, bytes) != ND_OK) abort(); /* sizes must agree */
        free(buf);
        break;
    }
    default: break;
    }
}

static void load(const uint8_t *data, size_t size, bool half) {
    nd_torch_opts opts = {.half_to_float = half, .max_decompressed_bytes = 1u << 24};
    nd_torch_file *f = NULL;
    nd_status st = nd_torch_load_memory("fuzz", "input", data, size, &opts, &f);
    if (getenv("NEEDLE_FUZZ_VERBOSE")) /* replaying one input: say what became of it */
        fprintf(stderr, "load: %s\n", st == ND_OK ? "accepted" : nd_last_error());
    if (st != ND_OK) return;
    visits = 0;
    touch(f->doc->root, 0);
    nd_torch_free(f);
}

/* ---- a minimal stored-zip writer */

typedef struct { uint8_t *b; size_t n, cap; bool oom; } out;
typedef struct { char name[300]; size_t name_len; uint32_t crc, size, offset; } centry;

static void put(out *o, const void *s, size_t n) {
    if (o->oom) return;
    if (o->n + n > o->cap) {
        size_t cap = (o->n + n) * 2;
        uint8_t *b = realloc(o->b, cap);
        if (!b) { o->oom = true; return; }
        o->b = b;
        o->cap = cap;
    }
    memcpy(o->b + o->n, s, n);
    o->n += n;
}
static void u16(out *o, unsigned v) { uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(o, b, 2); }
static void u32(out *o, uint32_t v) { u16(o, v & 0xffff); u16(o, v >> 16); }

static void entry(out *o, centry *c, const char *name, size_t name_len, const void *data, uint32_t len) {
    memcpy(c->name, name, name_len);
    c->name_len = name_len;
    c->crc = (uint32_t)crc32(0, data, len);
    c->size = len;
    c->offset = (uint32_t)o->n;
    u32(o, 0x04034b50); u16(o, 20); u16(o, 0); u16(o, 0); u16(o, 0); u16(o, 0x21);
    u32(o, c->crc); u32(o, len); u32(o, len); u16(o, (unsigned)name_len); u16(o, 0);
    put(o, name, name_len);
    put(o, data, len);
}

static void finish(out *o, const centry *c, size_t n) {
    uint32_t cd = (uint32_t)o->n;
    for (size_t i = 0; i < n; i++) {
        u32(o, 0x02014b50); u16(o, 20); u16(o, 20); u16(o, 0); u16(o, 0); u16(o, 0); u16(o, 0x21);
        u32(o, c[i].crc); u32(o, c[i].size); u32(o, c[i].size); u16(o, (unsigned)c[i].name_len);
        u16(o, 0); u16(o, 0); u16(o, 0); u16(o, 0); u32(o, 0); u32(o, c[i].offset);
        put(o, c[i].name, c[i].name_len);
    }
    uint32_t cd_size = (uint32_t)o->n - cd;
    u32(o, 0x06054b50); u16(o, 0); u16(o, 0); u16(o, (unsigned)n); u16(o, (unsigned)n);
    u32(o, cd_size); u32(o, cd); u16(o, 0);
}

/* the storages of a pickle, each once */
static size_t storages(const nd_pk *v, const nd_pk **found, size_t n, int depth) {
    if (depth > 32 || n >= MAX_STORAGES || ++visits > MAX_VISITS) return n;
    switch (v->kind) {
    case ND_PK_STORAGE:
        for (size_t i = 0; i < n; i++) if (found[i] == v) return n;
        found[n++] = v;
        return n;
    case ND_PK_TENSOR: return storages(v->u.tensor.storage, found, n, depth + 1);
    case ND_PK_TUPLE:
    case ND_PK_LIST:
        for (size_t i = 0; i < v->u.seq.n && i < 256; i++) n = storages(v->u.seq.items[i], found, n, depth + 1);
        return n;
    case ND_PK_DICT:
        for (size_t i = 0; i < v->u.dict.n && i < 256; i++) n = storages(v->u.dict.values[i], found, n, depth + 1);
        return n;
    default: return n;
    }
}

static void synthesize(const uint8_t *data, size_t size) {
    nd_pk_doc *doc = NULL;
    if (nd_pickle_load("fuzz", "input", data, size, &doc) != ND_OK) return;
    const nd_pk *st[MAX_STORAGES];
    visits = 0;
    size_t ns = storages(doc->root, st, 0, 0);
    uint8_t flags = data[size - 1] == '.' ? 0 : data[size - 1]; /* a byte after STOP sets them */
    static uint8_t blob[MAX_STORAGE_BYTES + 1];
    static centry ce[MAX_STORAGES + 2];
    out o = {0};
    size_t nc = 0;
    entry(&o, &ce[nc++], "archive/data.pkl", 16, data, (uint32_t)size);
    entry(&o, &ce[nc++], "archive/version", 15, "3\n", 2);
    for (size_t i = 0; i < ns; i++) {
        const nd_pk *s = st[i];
        uint64_t bytes = (uint64_t)s->u.storage.numel * nd_pk_elem_size(s->u.storage.elem);
        if (s->u.storage.numel > MAX_STORAGE_BYTES || bytes > MAX_STORAGE_BYTES) goto done;
        if (i == 0 && (flags & 2)) continue;
        if (i == 0 && (flags & 4) && bytes) bytes--;
        if (i == 0 && (flags & 8)) bytes++;
        bool is_bool = s->u.storage.elem == ND_PKT_BOOL; /* any bit pattern, 0/1 for bools */
        for (uint64_t k = 0; k < bytes; k++) blob[k] = (uint8_t)(is_bool ? (k + i) & 1 : k * 37 + i);
        char name[300];
        size_t nl = s->u.storage.key_len + 13;
        memcpy(name, "archive/data/", 13);
        memcpy(name + 13, s->u.storage.key, s->u.storage.key_len);
        entry(&o, &ce[nc++], name, nl, blob, (uint32_t)bytes);
    }
    finish(&o, ce, nc);
    if (!o.oom) load(o.b, o.n, flags & 1);
done:
    free(o.b);
    nd_pickle_free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 4 && !memcmp(data, "PK\3\4", 4)) load(data, size, data[size - 1] & 1);
    else if (size) synthesize(data, size);
    return 0;
}
