/* safetensors.c - reader and writer of the safetensors format; see
 * safetensors.h. The reader treats the file as hostile: every integer is
 * range-checked before it is used as a size or an offset, the header is
 * parsed by the JSON codec (json.h) restricted to what the format needs
 * (objects, arrays, strings, integers; 32 levels of nesting), and no
 * allocation is larger than the file that asks for it. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "tensor.h"

#define JSON_MAX_DEPTH 32
#define show nd_json_show /* a name for a message (json.h) */
#define SHOW_BUF ND_JSON_SHOW_BUF

/* ---------------------------------------------------------- the header */

static const struct { const char *name; nd_dtype dt; } st_dtypes[] = {
    {"F64", ND_FLOAT64}, {"F32", ND_FLOAT32}, {"F16", ND_FLOAT16}, {"BF16", ND_BFLOAT16},
    {"I64", ND_INT64},   {"I32", ND_INT32},   {"U8", ND_UINT8},    {"BOOL", ND_BOOL},
};
#define ST_DTYPES_LIST "F64, F32, F16, BF16, I64, I32, U8, BOOL"
/* in the format, not in needle */
static const char *const st_other_dtypes[] = {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2",
                                              "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64", NULL};

const char *nd_st_dtype_name(nd_dtype dt) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
    return NULL;
}

void nd_st_header_free(nd_st_header *h) {
    if (!h) return;
    free(h->tensors);
    free(h->meta_keys);
    free(h->meta_values);
    free(h->meta_key_lens);
    free(h->meta_value_lens);
    free(h->_arena);
    free(h);
}

static bool key_is(const nd_json_node *j, const char *k) {
    size_t n = strlen(k);
    return j->key_len == n && memcmp(j->key, k, n) == 0;
}

/* what parse_entry and validate read */
typedef struct {
    const char *op, *what;
    const nd_json_node *nodes;
} jheader;

typedef struct { uint64_t begin, end; size_t idx; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* fills *info from the member node t (an entry of the root object) */
static nd_status parse_entry(const jheader *p, size_t t, uint64_t data_len, nd_st_info *info) {
    const nd_json_node *e = &p->nodes[t];
    char nb[SHOW_BUF], sb[ND_SHAPE_BUF], db[SHOW_BUF];
    const char *name = show(e->key, e->key_len, nb);
    const char *op = p->op, *what = p->what;
    info->name = (char *)e->key; /* owned by the header (its _arena) */
    info->name_len = e->key_len;
    if (e->type != ND_JSON_OBJECT) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': entry is not a JSON object", name);
    size_t jd = 0, js = 0, jo = 0;
    for (size_t c = e->first; c; c = p->nodes[c].next) {
        if (key_is(&p->nodes[c], "dtype")) jd = c;
        else if (key_is(&p->nodes[c], "shape")) js = c;
        else if (key_is(&p->nodes[c], "data_offsets")) jo = c;
        /* other fields are ignored, as by the reference implementation */
    }
    if (!jd) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': missing \"dtype\"", name);
    if (!js) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': missing \"shape\"", name);
    if (!jo) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': missing \"data_offsets\"", name);
    /* dtype */
    const nd_json_node *d = &p->nodes[jd];
    if (d->type != ND_JSON_STRING) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': \"dtype\" is not a string", name);
    const char *ds = d->str;
    bool found = false;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (strlen(st_dtypes[i].name) == d->str_len && memcmp(st_dtypes[i].name, ds, d->str_len) == 0) {
            info->dtype = st_dtypes[i].dt;
            found = true;
        }
    if (!found) {
        for (size_t i = 0; st_other_dtypes[i]; i++)
            if (strlen(st_other_dtypes[i]) == d->str_len && memcmp(st_other_dtypes[i], ds, d->str_len) == 0)
                return nd_io_fail(ND_ERR_DTYPE, op, what, "tensor '%s': dtype %s is not supported by needle "
                            "(supported: " ST_DTYPES_LIST ")", name, st_other_dtypes[i]);
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': unknown dtype '%s' (supported: " ST_DTYPES_LIST ")",
                    name, show(ds, d->str_len, db));
    }
    /* shape */
    const nd_json_node *s = &p->nodes[js];
    if (s->type != ND_JSON_ARRAY) return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': \"shape\" is not an array", name);
    if (s->count > ND_MAX_DIMS)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': shape has %zu dims (needle supports at most %d)",
                    name, s->count, ND_MAX_DIMS);
    info->ndim = (int)s->count;
    int k = 0;
    for (size_t c = s->first; c; c = p->nodes[c].next, k++) {
        if (p->nodes[c].type != ND_JSON_INT)
            return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': shape entry %d is not an integer", name, k + 1);
        if (p->nodes[c].i < 0)
            return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': shape entry %d is negative (%lld)", name, k + 1,
                        (long long)p->nodes[c].i);
        info->shape[k] = p->nodes[c].i;
    }
    /* the size rule of every tensor (tensor.h), the one nd.save's tensors obey */
    int64_t numel;
    size_t es = nd_dtype_size(info->dtype);
    char label[SHOW_BUF + 16];
    snprintf(label, sizeof label, "tensor '%s'", name);
    if (nd_check_shape(label, info->shape, info->ndim, &numel) != ND_OK)
        return nd_io_fail(ND_ERR_IO, op, what, "%s", nd_last_error());
    uint64_t nbytes = (uint64_t)numel * es; /* numel <= 2^48, es <= 8: no overflow */
    /* data_offsets */
    const nd_json_node *o = &p->nodes[jo];
    if (o->type != ND_JSON_ARRAY || o->count != 2 || p->nodes[o->first].type != ND_JSON_INT ||
        p->nodes[p->nodes[o->first].next].type != ND_JSON_INT)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s': \"data_offsets\" is not an array of two integers",
                    name);
    int64_t b = p->nodes[o->first].i, en = p->nodes[p->nodes[o->first].next].i;
    if (b < 0 || en < 0)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s' data_offsets [%lld, %lld] are negative", name,
                    (long long)b, (long long)en);
    if (b > en)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s' data_offsets [%lld, %lld] end before they begin",
                    name, (long long)b, (long long)en);
    if ((uint64_t)en > data_len)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s' data_offsets [%lld, %lld] lie outside the byte "
                    "buffer (%llu bytes)", name, (long long)b, (long long)en, (unsigned long long)data_len);
    if ((uint64_t)(en - b) != nbytes)
        return nd_io_fail(ND_ERR_IO, op, what, "tensor '%s' data_offsets [%lld, %lld] do not match shape %s %s "
                    "(%llu bytes)", name, (long long)b, (long long)en,
                    nd_shape_str(info->shape, info->ndim, sb), nd_dtype_name(info->dtype),
                    (unsigned long long)nbytes);
    info->begin = (uint64_t)b;
    info->end = (uint64_t)en;
    return ND_OK;
}

static nd_status validate(const jheader *p, uint64_t data_len, nd_st_header *h) {
    const char *op = p->op, *what = p->what;
    const nd_json_node *root = &p->nodes[0];
    if (root->type != ND_JSON_OBJECT) return nd_io_fail(ND_ERR_IO, op, what, "the header is not a JSON object");
    size_t nt = root->count, nm = 0;
    size_t jmeta = 0;
    for (size_t c = root->first; c; c = p->nodes[c].next)
        if (key_is(&p->nodes[c], "__metadata__")) { jmeta = c; nt--; }
    if (jmeta) {
        const nd_json_node *m = &p->nodes[jmeta];
        if (m->type != ND_JSON_OBJECT) return nd_io_fail(ND_ERR_IO, op, what, "__metadata__ is not a JSON object");
        nm = m->count;
    }
    h->tensors = calloc(nt ? nt : 1, sizeof *h->tensors);
    h->meta_keys = calloc(nm ? nm : 1, sizeof *h->meta_keys);
    h->meta_values = calloc(nm ? nm : 1, sizeof *h->meta_values);
    h->meta_key_lens = calloc(nm ? nm : 1, sizeof *h->meta_key_lens);
    h->meta_value_lens = calloc(nm ? nm : 1, sizeof *h->meta_value_lens);
    if (!h->tensors || !h->meta_keys || !h->meta_values || !h->meta_key_lens || !h->meta_value_lens)
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory reading the header");
    if (jmeta) {
        size_t i = 0;
        for (size_t c = p->nodes[jmeta].first; c; c = p->nodes[c].next, i++) {
            const nd_json_node *v = &p->nodes[c];
            if (v->type != ND_JSON_STRING) {
                char kb[SHOW_BUF];
                return nd_io_fail(ND_ERR_IO, op, what, "__metadata__ value of '%s' is not a string",
                            show(v->key, v->key_len, kb));
            }
            h->meta_keys[i] = (char *)v->key;
            h->meta_key_lens[i] = v->key_len;
            h->meta_values[i] = (char *)v->str;
            h->meta_value_lens[i] = v->str_len;
        }
        h->nmeta = nm;
    }
    size_t i = 0;
    for (size_t c = root->first; c; c = p->nodes[c].next) {
        if (c == jmeta) continue;
        ND_TRY(parse_entry(p, c, data_len, &h->tensors[i]));
        i++;
    }
    h->ntensors = nt;
    /* the tensors tile the buffer: sorted by offset, each starts where the
     * previous one ended, and the last one ends at the end of the buffer */
    span *sp = malloc((nt ? nt : 1) * sizeof *sp);
    if (!sp) return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory reading the header");
    for (i = 0; i < nt; i++) sp[i] = (span){h->tensors[i].begin, h->tensors[i].end, i};
    qsort(sp, nt, sizeof *sp, span_cmp);
    uint64_t at = 0;
    size_t prev = (size_t)-1;
    nd_status st = ND_OK;
    for (i = 0; i < nt && st == ND_OK; i++) {
        const nd_st_info *t = &h->tensors[sp[i].idx];
        char nb[SHOW_BUF], pb[SHOW_BUF];
        if (t->begin < at) {
            const nd_st_info *q = &h->tensors[prev];
            st = nd_io_fail(ND_ERR_IO, op, what, "tensor '%s' data_offsets [%llu, %llu] overlap those of "
                      "tensor '%s' [%llu, %llu]", show(t->name, t->name_len, nb),
                      (unsigned long long)t->begin, (unsigned long long)t->end,
                      show(q->name, q->name_len, pb), (unsigned long long)q->begin,
                      (unsigned long long)q->end);
        } else if (t->begin > at) {
            st = nd_io_fail(ND_ERR_IO, op, what, "bytes [%llu, %llu) of the byte buffer belong to no tensor "
                      "(the next tensor, '%s', starts at %llu)", (unsigned long long)at,
                      (unsigned long long)t->begin, show(t->name, t->name_len, nb),
                      (unsigned long long)t->begin);
        }
        if (t->end > at || prev == (size_t)-1) prev = sp[i].idx;
        if (t->end > at) at = t->end;
    }
    free(sp);
    if (st != ND_OK) return st;
    if (at != data_len)
        return nd_io_fail(ND_ERR_IO, op, what, "the byte buffer has %llu bytes but the tensors cover only the "
                    "first %llu (trailing bytes belong to no tensor)", (unsigned long long)data_len,
                    (unsigned long long)at);
    return ND_OK;
}

nd_status nd_st_parse_header(const char *op, const char *what, const char *json, uint64_t json_len,
                             uint64_t data_len, nd_st_header **out) {
    *out = NULL;
    if (json_len > ND_ST_MAX_HEADER)
        return nd_io_fail(ND_ERR_IO, op, what, "header length %llu exceeds the limit of %llu bytes",
                    (unsigned long long)json_len, ND_ST_MAX_HEADER);
    if (json_len == 0) return nd_io_fail(ND_ERR_IO, op, what, "the header is empty");
    size_t bad = nd_utf8_check((const unsigned char *)json, (size_t)json_len);
    if (bad != json_len) return nd_io_fail(ND_ERR_IO, op, what, "the header is not valid UTF-8 (byte %zu)", bad);
    /* the format's subset of JSON: integers only, no true/false */
    const nd_json_opts jo = {.max_depth = JSON_MAX_DEPTH, .integers_only = "safetensors headers hold integers",
                             .no_booleans = true, .name = "the header"};
    nd_json_doc *doc;
    nd_json_error je;
    nd_status st = nd_json_parse(json, (size_t)json_len, &jo, &doc, &je);
    if (st == ND_ERR_MEMORY)
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory reading a header of %llu bytes",
                          (unsigned long long)json_len);
    if (st != ND_OK) return nd_io_fail(ND_ERR_IO, op, what, "invalid header JSON at byte %zu: %s", je.offset, je.msg);
    nd_st_header *h = calloc(1, sizeof *h);
    if (!h) {
        nd_json_free(doc);
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory reading a header of %llu bytes",
                          (unsigned long long)json_len);
    }
    h->header_len = json_len;
    h->data_len = data_len;
    const jheader p = {op, what, doc->nodes};
    st = validate(&p, data_len, h);
    /* the names and metadata point into the document's strings: the header keeps them */
    h->_arena = nd_json_take_strings(doc);
    nd_json_free(doc);
    if (st != ND_OK) {
        nd_st_header_free(h);
        return st;
    }
    *out = h;
    return ND_OK;
}

/* ------------------------------------------------------------- reading */

/* a file (fd) or a memory buffer */
static nd_status read_header(const nd_io_src *s, nd_st_header **out) {
    *out = NULL;
    if (s->size < 8)
        return nd_io_fail(ND_ERR_IO, s->op, s->what, "file too short (%llu bytes) to be a safetensors file",
                    (unsigned long long)s->size);
    unsigned char le[8];
    ND_TRY(nd_src_read(s, 0, le, 8));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | le[i];
    const char *hint = "";
    if (le[0] == 'P' && le[1] == 'K') hint = " (this looks like a zip archive, e.g. a PyTorch .pt file)";
    else if (le[0] == 0x1f && le[1] == 0x8b) hint = " (this looks like a gzip file)";
    if (n > ND_ST_MAX_HEADER)
        return nd_io_fail(ND_ERR_IO, s->op, s->what, "header length %llu exceeds the limit of %llu bytes%s",
                    (unsigned long long)n, ND_ST_MAX_HEADER, hint);
    if (n > s->size - 8)
        return nd_io_fail(ND_ERR_IO, s->op, s->what, "header length %llu exceeds the file size (%llu bytes)%s",
                    (unsigned long long)n, (unsigned long long)s->size, hint);
    char *json = malloc((size_t)n + 1);
    if (!json) return nd_io_fail(ND_ERR_MEMORY, s->op, s->what, "out of memory reading the header");
    nd_status st = nd_src_read(s, 8, json, n);
    if (st == ND_OK) st = nd_st_parse_header(s->op, s->what, json, n, s->size - 8 - n, out);
    free(json);
    return st;
}

void nd_st_free_tensors(nd_tensor **ts, size_t n) {
    if (!ts) return;
    for (size_t i = 0; i < n; i++)
        if (ts[i]) nd_release(ts[i]);
    free(ts);
}

static nd_status read_tensors(const nd_io_src *s, const nd_st_header *h, nd_tensor ***out) {
    *out = NULL;
    nd_tensor **ts = calloc(h->ntensors ? h->ntensors : 1, sizeof *ts);
    if (!ts) return nd_io_fail(ND_ERR_MEMORY, s->op, s->what, "out of memory");
    uint64_t base = 8 + h->header_len;
    for (size_t i = 0; i < h->ntensors; i++) {
        const nd_st_info *t = &h->tensors[i];
        char nb[SHOW_BUF];
        nd_status st = nd_empty(t->shape, t->ndim, t->dtype, &ts[i]);
        if (st != ND_OK) {
            st = nd_io_fail(st, s->op, s->what, "tensor '%s': %s", show(t->name, t->name_len, nb), nd_last_error());
            nd_st_free_tensors(ts, h->ntensors);
            return st;
        }
        uint64_t nbytes = t->end - t->begin;
        st = nd_src_read(s, base + t->begin, nd_ptr(ts[i]), nbytes);
        if (st == ND_OK && t->dtype == ND_BOOL) {
            const unsigned char *b = (const unsigned char *)nd_ptr(ts[i]);
            for (uint64_t k = 0; k < nbytes; k++)
                if (b[k] > 1) {
                    st = nd_io_fail(ND_ERR_IO, s->op, s->what, "tensor '%s': bool element %llu has byte value %u "
                              "(expected 0 or 1)", show(t->name, t->name_len, nb),
                              (unsigned long long)k + 1, b[k]);
                    break;
                }
        }
        if (st != ND_OK) {
            nd_st_free_tensors(ts, h->ntensors);
            return st;
        }
    }
    *out = ts;
    return ND_OK;
}

nd_status nd_st_read_header_file(const char *op, const char *path, nd_st_header **header) {
    *header = NULL;
    nd_io_src s;
    ND_TRY(nd_src_open(op, path, &s));
    nd_status st = read_header(&s, header);
    nd_src_close(&s);
    return st;
}

nd_status nd_st_load_file(const char *op, const char *path, nd_st_header **header, nd_tensor ***tensors) {
    *header = NULL;
    *tensors = NULL;
    nd_io_src s;
    ND_TRY(nd_src_open(op, path, &s));
    nd_st_header *h;
    nd_status st = read_header(&s, &h);
    if (st == ND_OK) {
        st = read_tensors(&s, h, tensors);
        if (st != ND_OK) nd_st_header_free(h);
        else *header = h;
    }
    nd_src_close(&s);
    return st;
}

nd_status nd_st_load_memory(const char *op, const char *what, const void *buf, size_t len,
                            nd_st_header **header, nd_tensor ***tensors) {
    *header = NULL;
    *tensors = NULL;
    nd_io_src s = nd_src_memory(op, what, buf, len);
    nd_st_header *h;
    ND_TRY(read_header(&s, &h));
    nd_status st = read_tensors(&s, h, tensors);
    if (st != ND_OK) nd_st_header_free(h);
    else *header = h;
    return st;
}

/* ------------------------------------------------------------- writing */

typedef nd_json_buf sbuf; /* the header, and the file when it is written to memory */

typedef struct { const char *k; size_t len; size_t es; size_t idx; } wkey;

static int wkey_name_cmp(const void *a, const void *b) {
    const wkey *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->k, y->k, m);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len;
}
static int wkey_layout_cmp(const void *a, const void *b) {
    const wkey *x = a, *y = b;
    if (x->es != y->es) return x->es > y->es ? -1 : 1;
    return wkey_name_cmp(a, b);
}

/* The sink the writer streams into: an atomic file or a memory buffer. */
typedef struct {
    nd_atomic_file *file;
    sbuf *mem;
} sink;

static nd_status sink_write(sink *k, const char *op, const void *p, size_t n) {
    if (k->file) {
        nd_status st = nd_atomic_write(k->file, p, n);
        if (st != ND_OK) k->file = NULL; /* the atomic file aborted itself */
        return st;
    }
    nd_json_put(k->mem, p, n);
    return k->mem->oom ? nd_fail(ND_ERR_MEMORY, "%s: out of memory", op) : ND_OK;
}

/* Validates the entries and builds the header; *layout gets the entries in
 * data order with their offsets. */
static nd_status build_header(const char *op, const char *what, const nd_st_entry *entries, size_t n,
                              const nd_st_meta *meta, size_t nmeta, sbuf *hdr, wkey **layout) {
    *layout = NULL;
    char nb[SHOW_BUF];
    for (size_t i = 0; i < n; i++) {
        const nd_st_entry *e = &entries[i];
        if (!e->name) return nd_io_fail(ND_ERR_ARG, op, what, "tensor %zu has no name", i + 1);
        const char *nm = show(e->name, e->name_len, nb);
        if (!e->tensor) return nd_io_fail(ND_ERR_ARG, op, what, "tensor '%s' is NULL", nm);
        /* tensors on a device are read back while their bytes are written */
        if (nd_utf8_check((const unsigned char *)e->name, e->name_len) != e->name_len)
            return nd_io_fail(ND_ERR_ARG, op, what, "tensor name '%s' is not valid UTF-8", nm);
        if (e->name_len == 12 && memcmp(e->name, "__metadata__", 12) == 0)
            return nd_io_fail(ND_ERR_ARG, op, what, "'__metadata__' cannot be a tensor name");
        if (!nd_st_dtype_name(e->tensor->dtype))
            return nd_io_fail(ND_ERR_DTYPE, op, what, "tensor '%s': dtype %s has no safetensors name", nm,
                        nd_dtype_name(e->tensor->dtype));
    }
    for (size_t i = 0; i < nmeta; i++) {
        const nd_st_meta *m = &meta[i];
        if (!m->key || !m->value) return nd_io_fail(ND_ERR_ARG, op, what, "metadata entry %zu is NULL", i + 1);
        if (nd_utf8_check((const unsigned char *)m->key, m->key_len) != m->key_len)
            return nd_io_fail(ND_ERR_ARG, op, what, "metadata key '%s' is not valid UTF-8",
                        show(m->key, m->key_len, nb));
        if (nd_utf8_check((const unsigned char *)m->value, m->value_len) != m->value_len)
            return nd_io_fail(ND_ERR_ARG, op, what, "metadata value of '%s' is not valid UTF-8",
                        show(m->key, m->key_len, nb));
    }
    wkey *byname = malloc((n ? n : 1) * sizeof *byname);
    wkey *lay = malloc((n ? n : 1) * sizeof *lay);
    wkey *mk = malloc((nmeta ? nmeta : 1) * sizeof *mk);
    if (!byname || !lay || !mk) {
        free(byname); free(lay); free(mk);
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        byname[i] = (wkey){entries[i].name, entries[i].name_len, nd_dtype_size(entries[i].tensor->dtype), i};
    for (size_t i = 0; i < nmeta; i++) mk[i] = (wkey){meta[i].key, meta[i].key_len, 0, i};
    qsort(byname, n, sizeof *byname, wkey_name_cmp);
    qsort(mk, nmeta, sizeof *mk, wkey_name_cmp);
    nd_status st = ND_OK;
    for (size_t i = 1; i < n && st == ND_OK; i++)
        if (wkey_name_cmp(&byname[i - 1], &byname[i]) == 0)
            st = nd_io_fail(ND_ERR_ARG, op, what, "duplicate tensor name '%s'", show(byname[i].k, byname[i].len, nb));
    for (size_t i = 1; i < nmeta && st == ND_OK; i++)
        if (wkey_name_cmp(&mk[i - 1], &mk[i]) == 0)
            st = nd_io_fail(ND_ERR_ARG, op, what, "duplicate metadata key '%s'", show(mk[i].k, mk[i].len, nb));
    if (st != ND_OK) {
        free(byname); free(lay); free(mk);
        return st;
    }
    /* data layout: largest elements first keeps every tensor aligned */
    memcpy(lay, byname, n * sizeof *lay);
    qsort(lay, n, sizeof *lay, wkey_layout_cmp);
    uint64_t *at = malloc((n ? n : 1) * sizeof *at); /* offset by entry index */
    if (!at) {
        free(byname); free(lay); free(mk);
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory");
    }
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const nd_tensor *t = entries[lay[i].idx].tensor;
        at[lay[i].idx] = pos;
        pos += (uint64_t)nd_numel(t) * nd_dtype_size(t->dtype);
    }
    /* the JSON */
    nd_json_puts(hdr, "{");
    bool first = true;
    if (nmeta > 0) {
        nd_json_puts(hdr, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            const nd_st_meta *m = &meta[mk[i].idx];
            if (i) nd_json_puts(hdr, ",");
            nd_json_string(hdr, m->key, m->key_len);
            nd_json_puts(hdr, ":");
            nd_json_string(hdr, m->value, m->value_len);
        }
        nd_json_puts(hdr, "}");
        first = false;
    }
    for (size_t i = 0; i < n; i++) {
        const nd_st_entry *e = &entries[byname[i].idx];
        const nd_tensor *t = e->tensor;
        if (!first) nd_json_puts(hdr, ",");
        first = false;
        nd_json_string(hdr, e->name, e->name_len);
        nd_json_puts(hdr, ":{\"dtype\":");
        nd_json_string(hdr, nd_st_dtype_name(t->dtype), strlen(nd_st_dtype_name(t->dtype)));
        nd_json_puts(hdr, ",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) nd_json_puts(hdr, ",");
            nd_json_int(hdr, t->shape[d]);
        }
        uint64_t b = at[byname[i].idx];
        nd_json_puts(hdr, "],\"data_offsets\":[");
        nd_json_uint(hdr, b);
        nd_json_puts(hdr, ",");
        nd_json_uint(hdr, b + (uint64_t)nd_numel(t) * nd_dtype_size(t->dtype));
        nd_json_puts(hdr, "]}");
    }
    nd_json_puts(hdr, "}");
    while (hdr->n % 8 != 0) nd_json_puts(hdr, " "); /* 8-byte aligned buffer, as the reference */
    free(at);
    free(byname);
    free(mk);
    if (hdr->oom) {
        free(lay);
        return nd_io_fail(ND_ERR_MEMORY, op, what, "out of memory building the header");
    }
    if (hdr->n > ND_ST_MAX_HEADER) {
        free(lay);
        return nd_io_fail(ND_ERR_ARG, op, what, "the header would be %zu bytes, over the limit of %llu",
                    hdr->n, ND_ST_MAX_HEADER);
    }
    *layout = lay;
    return ND_OK;
}

static nd_status write_all(const char *op, const char *what, sink *k, const nd_st_entry *entries,
                           size_t n, const sbuf *hdr, const wkey *lay) {
    unsigned char le[8];
    uint64_t hl = hdr->n;
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
    ND_TRY(sink_write(k, op, le, 8));
    ND_TRY(sink_write(k, op, hdr->p, hdr->n));
    for (size_t i = 0; i < n; i++) {
        const nd_tensor *t = entries[lay[i].idx].tensor;
        size_t nbytes = (size_t)nd_numel(t) * nd_dtype_size(t->dtype);
        if (nbytes == 0) continue;
        if (nd_is_contiguous(t) && nd_on_cpu(t)) {
            ND_TRY(sink_write(k, op, nd_ptr(t), nbytes));
            continue;
        }
        nd_tensor *c; /* contiguous, in host memory */
        nd_status st = nd_to_host(t, &c);
        if (st == ND_OK && !nd_is_contiguous(c)) {
            nd_tensor *h = c;
            st = nd_contiguous(h, &c);
            nd_release(h);
        }
        if (st != ND_OK) {
            char nb[SHOW_BUF];
            return nd_io_fail(st, op, what, "tensor '%s': %s", show(entries[lay[i].idx].name,
                        entries[lay[i].idx].name_len, nb), nd_last_error());
        }
        st = sink_write(k, op, nd_ptr(c), nbytes);
        nd_release(c);
        ND_TRY(st);
    }
    return ND_OK;
}

nd_status nd_st_save_file(const char *op, const char *path, const nd_st_entry *entries, size_t n,
                          const nd_st_meta *meta, size_t nmeta) {
    sbuf hdr = {0};
    wkey *lay;
    nd_status st = build_header(op, path, entries, n, meta, nmeta, &hdr, &lay);
    if (st != ND_OK) { free(hdr.p); return st; }
    sink k = {0};
    st = nd_atomic_open(op, path, &k.file);
    if (st == ND_OK) {
        st = write_all(op, path, &k, entries, n, &hdr, lay);
        if (st == ND_OK) st = nd_atomic_commit(k.file);
        else nd_atomic_abort(k.file); /* NULL when the write aborted it */
    }
    free(hdr.p);
    free(lay);
    return st;
}

nd_status nd_st_save_memory(const char *op, const nd_st_entry *entries, size_t n,
                            const nd_st_meta *meta, size_t nmeta, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    sbuf hdr = {0}, mem = {0};
    wkey *lay;
    nd_status st = build_header(op, "<memory>", entries, n, meta, nmeta, &hdr, &lay);
    if (st != ND_OK) { free(hdr.p); return st; }
    sink k = {.mem = &mem};
    st = write_all(op, "<memory>", &k, entries, n, &hdr, lay);
    free(hdr.p);
    free(lay);
    if (st != ND_OK) { free(mem.p); return st; }
    if (!mem.p) { /* nothing written cannot happen (8 + header) but keep *out valid */
        mem.p = malloc(1);
        if (!mem.p) return nd_fail(ND_ERR_MEMORY, "%s: out of memory", op);
    }
    *out = mem.p;
    *len = mem.n;
    return ND_OK;
}
