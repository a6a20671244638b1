/* fuzz_pickle.c - libFuzzer harness for the restricted unpickler
 * (src/io/pickle.c): any byte string must either fail with an nd_status
 * or give a tree a consumer can walk. The walk below touches every node
 * (bounded depth, as pickle.h asks of consumers) so that ASan sees reads
 * of every field the parser filled in. Build: -DNEEDLE_FUZZ=ON (docs/fuzzing.md). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "io/pickle.h"

/* The tree is a DAG (the memo shares nodes, so ((t,t),(t,t)) doubles at
 * every level): the walk counts its visits instead of trusting depth. */
static long visits;

static uint64_t walk(const nd_pk *v, int depth) {
    if (depth > 64 || ++visits > 100000) return 1;
    uint64_t h = (uint64_t)v->kind;
    switch (v->kind) {
    case ND_PK_NONE: break;
    case ND_PK_BOOL: h += v->u.b; break;
    case ND_PK_INT: h += (uint64_t)v->u.i; break;
    case ND_PK_FLOAT: h += (uint64_t)(v->u.f == v->u.f); break;
    case ND_PK_STR:
    case ND_PK_BYTES:
        for (size_t i = 0; i < v->u.str.len; i++) h += (unsigned char)v->u.str.s[i];
        h += (unsigned char)v->u.str.s[v->u.str.len]; /* NUL-terminated */
        break;
    case ND_PK_TUPLE:
    case ND_PK_LIST:
        for (size_t i = 0; i < v->u.seq.n && i < 64; i++) h += walk(v->u.seq.items[i], depth + 1);
        break;
    case ND_PK_DICT:
        for (size_t i = 0; i < v->u.dict.n && i < 64; i++)
            h += walk(v->u.dict.keys[i], depth + 1) + walk(v->u.dict.values[i], depth + 1);
        break;
    case ND_PK_GLOBAL: h += strlen(v->u.global.name) + nd_pk_elem_size(v->u.global.elem); break;
    case ND_PK_STORAGE:
        h += strlen(v->u.storage.key) + strlen(v->u.storage.location) + (uint64_t)v->u.storage.numel;
        h += nd_pk_elem_size(v->u.storage.elem);
        break;
    case ND_PK_TENSOR:
        h += walk(v->u.tensor.storage, depth + 1) + (uint64_t)v->u.tensor.offset;
        for (int d = 0; d < v->u.tensor.ndim; d++) h += (uint64_t)(v->u.tensor.shape[d] ^ v->u.tensor.stride[d]);
        break;
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nd_pk_doc *doc = NULL;
    if (nd_pickle_load("fuzz", "input", data, size, &doc) == ND_OK) {
        visits = 0;
        volatile uint64_t h = walk(doc->root, 0);
        (void)h;
        nd_pickle_free(doc);
    }
    return 0;
}
