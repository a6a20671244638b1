/* fuzz_json.c - libFuzzer harness for the JSON reader (src/io/json.c), the
 * codec of safetensors headers and checkpoint metadata. Besides "no crash,
 * no leak, no UB": an error's offset lies within the input, and a document
 * the reader accepts is written back with the writer and read again to the
 * same tree (types, keys, values and shape), unless it holds a number
 * beyond double range (read as infinity, which JSON cannot write). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "io/json.h"

/* Writes node i (and its children) with the codec's own writer. */
static void write_node(nd_json_buf *b, const nd_json_doc *d, size_t i, bool *unwritable) {
    const nd_json_node *n = &d->nodes[i];
    switch (n->type) {
    case ND_JSON_OBJECT:
    case ND_JSON_ARRAY: {
        bool obj = n->type == ND_JSON_OBJECT;
        nd_json_puts(b, obj ? "{" : "[");
        for (size_t c = n->first, k = 0; c; c = d->nodes[c].next, k++) {
            if (k) nd_json_puts(b, ",");
            if (obj) {
                nd_json_string(b, d->nodes[c].key, d->nodes[c].key_len);
                nd_json_puts(b, ":");
            }
            write_node(b, d, c, unwritable);
        }
        nd_json_puts(b, obj ? "}" : "]");
        break;
    }
    case ND_JSON_STRING: nd_json_string(b, n->str, n->str_len); break;
    case ND_JSON_INT: nd_json_int(b, n->i); break;
    case ND_JSON_FLOAT: /* 1e999 reads as inf, which JSON cannot write */
        if (!nd_json_float(b, n->f)) *unwritable = true;
        break;
    case ND_JSON_BOOL: nd_json_puts(b, n->b ? "true" : "false"); break;
    }
}

static bool same_node(const nd_json_doc *a, size_t i, const nd_json_doc *b, size_t j) {
    const nd_json_node *x = &a->nodes[i], *y = &b->nodes[j];
    if (x->type != y->type || x->count != y->count) return false;
    switch (x->type) {
    case ND_JSON_STRING:
        return x->str_len == y->str_len && memcmp(x->str, y->str, x->str_len) == 0;
    case ND_JSON_INT: return x->i == y->i;
    case ND_JSON_FLOAT: return x->f == y->f; /* %.17g round-trips every double */
    case ND_JSON_BOOL: return x->b == y->b;
    default: break;
    }
    size_t c = x->first, e = y->first;
    for (; c && e; c = a->nodes[c].next, e = b->nodes[e].next) {
        if (x->type == ND_JSON_OBJECT &&
            (a->nodes[c].key_len != b->nodes[e].key_len ||
             memcmp(a->nodes[c].key, b->nodes[e].key, a->nodes[c].key_len) != 0))
            return false;
        if (!same_node(a, c, b, e)) return false;
    }
    return !c && !e;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nd_json_doc *doc = NULL;
    nd_json_error err;
    if (nd_json_parse((const char *)data, size, NULL, &doc, &err) != ND_OK) {
        if (err.offset > size) abort(); /* the offset must point into the input */
        return 0;
    }
    nd_json_buf b = {0};
    bool unwritable = false;
    write_node(&b, doc, 0, &unwritable);
    if (b.oom || unwritable) { nd_json_buf_free(&b); nd_json_free(doc); return 0; }
    nd_json_doc *again = NULL;
    if (nd_json_parse(b.p, b.n, NULL, &again, &err) != ND_OK) abort(); /* our output is JSON */
    if (!same_node(doc, 0, again, 0)) abort();
    nd_json_free(again);
    nd_json_buf_free(&b);
    nd_json_free(doc);
    return 0;
}
