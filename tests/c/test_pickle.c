/* test_pickle.c - the restricted unpickler (src/io/pickle.c) on hand-written
 * pickles: what torch.save writes (protocols 2 and 4, shared storages,
 * parameters) must give the right tree, and every hostile or malformed
 * stream (forbidden globals, STACK_GLOBAL tricks, REDUCE on the wrong
 * thing, deep nesting, huge lengths, memo abuse, bad tensor geometry, bad
 * persistent ids) must fail with a message naming the problem. Run it under
 * ASan (build-asan) to see that failures free everything. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "io/pickle.h"

/* ---- a pickle builder */

typedef struct { unsigned char *b; size_t n, cap; } pk;

static void put(pk *p, const void *s, size_t n) {
    if (p->n + n > p->cap) {
        p->cap = (p->n + n) * 2 + 64;
        p->b = realloc(p->b, p->cap);
        if (!p->b) abort();
    }
    memcpy(p->b + p->n, s, n);
    p->n += n;
}
static void op(pk *p, unsigned char c) { put(p, &c, 1); }
static void le(pk *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) op(p, (unsigned char)(v >> (8 * i)));
}
static void uni_n(pk *p, const char *s, size_t n) { op(p, 'X'); le(p, n, 4); put(p, s, n); }
static void uni(pk *p, const char *s) { uni_n(p, s, strlen(s)); }
static void glob(pk *p, const char *mod, const char *name) {
    op(p, 'c');
    put(p, mod, strlen(mod));
    op(p, '\n');
    put(p, name, strlen(name));
    op(p, '\n');
}
static void k1(pk *p, unsigned v) { op(p, 'K'); op(p, (unsigned char)v); }
static void proto(pk *p, int v) { op(p, 0x80); op(p, (unsigned char)v); }
static void empty_od(pk *p) { glob(p, "collections", "OrderedDict"); op(p, ')'); op(p, 'R'); }
/* BINPERSID ('storage', torch.<type>, key, 'cpu', numel) */
static void storage(pk *p, const char *type, const char *key, unsigned numel) {
    op(p, '(');
    uni(p, "storage");
    glob(p, "torch", type);
    uni(p, key);
    uni(p, "cpu");
    k1(p, numel);
    op(p, 't');
    op(p, 'Q');
}
/* _rebuild_tensor_v2(storage(key, numel), offset, (d0, d1), (s0, s1), False, OrderedDict()) */
static void tensor2(pk *p, const char *key, unsigned numel, unsigned off, unsigned d0, unsigned d1,
                    unsigned s0, unsigned s1) {
    glob(p, "torch._utils", "_rebuild_tensor_v2");
    op(p, '(');
    storage(p, "FloatStorage", key, numel);
    k1(p, off);
    k1(p, d0); k1(p, d1); op(p, 0x86);
    k1(p, s0); k1(p, s1); op(p, 0x86);
    op(p, 0x89);
    empty_od(p);
    op(p, 't');
    op(p, 'R');
}

static nd_status load(pk *p, nd_pk_doc **doc) {
    nd_status st = nd_pickle_load("needle.load_torch", "test.pkl", p->b, p->n, doc);
    free(p->b);
    *p = (pk){0};
    return st;
}

/* The stream must fail with status IO (or `want`) and a message holding s1 and s2. */
#define BAD_PK(name, p, s1, s2) do { nd_pk_doc *d_ = NULL; \
        EXPECT_ERR(name, load(&(p), &d_), ND_ERR_IO, s1, s2); \
        CHECK(d_ == NULL); nd_pickle_free(d_); } while (0)

static const nd_pk *dict_get(const nd_pk *d, const char *key) {
    if (d->kind != ND_PK_DICT) return NULL;
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const nd_pk *k = d->u.dict.keys[i];
        if (k->kind == ND_PK_STR && k->u.str.len == strlen(key) && !memcmp(k->u.str.s, key, k->u.str.len))
            return d->u.dict.values[i];
    }
    return NULL;
}

/* Either outcome, but a failure must name its limit (and nothing leaks). */
static void st_any(pk *p) {
    nd_pk_doc *d = NULL;
    nd_status st = load(p, &d);
    CHECKM(st == ND_OK || strstr(nd_last_error(), "too often"), "%s", nd_last_error());
    nd_pickle_free(d);
}

/* ---- good streams */

static void test_state_dict(void) {
    pk p = {0};
    proto(&p, 2);
    empty_od(&p);
    op(&p, 'q'); op(&p, 0);
    op(&p, '(');
    uni(&p, "0.weight");
    tensor2(&p, "0", 6, 0, 2, 3, 3, 1);
    uni(&p, "0.bias");
    tensor2(&p, "1", 2, 0, 2, 1, 1, 0);
    uni(&p, "view");   /* the same storage again: a transposed view */
    tensor2(&p, "0", 6, 0, 3, 2, 1, 3);
    op(&p, 'u');
    op(&p, '}');       /* BUILD with {'_metadata': ...}: ignored */
    uni(&p, "_metadata");
    empty_od(&p);
    op(&p, 's');
    op(&p, 'b');
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    const nd_pk *r = doc->root;
    CHECK(r->kind == ND_PK_DICT && r->u.dict.n == 3);
    const nd_pk *w = dict_get(r, "0.weight"), *b = dict_get(r, "0.bias"), *v = dict_get(r, "view");
    CHECK(w && b && v);
    if (w && b && v) {
        CHECK(w->kind == ND_PK_TENSOR && w->u.tensor.ndim == 2);
        CHECK(w->u.tensor.shape[0] == 2 && w->u.tensor.shape[1] == 3);
        CHECK(w->u.tensor.stride[0] == 3 && w->u.tensor.stride[1] == 1);
        CHECK(w->u.tensor.offset == 0 && !w->u.tensor.requires_grad);
        const nd_pk *s = w->u.tensor.storage;
        CHECK(s->kind == ND_PK_STORAGE && s->u.storage.elem == ND_PKT_FLOAT32);
        CHECK(s->u.storage.numel == 6 && s->u.storage.key_len == 1 && !strcmp(s->u.storage.key, "0"));
        CHECK(!strcmp(s->u.storage.location, "cpu"));
        CHECK(v->u.tensor.storage == s); /* shared storages stay shared */
        CHECK(b->u.tensor.storage != s);
        CHECK(v->u.tensor.stride[0] == 1 && v->u.tensor.stride[1] == 3);
    }
    nd_pickle_free(doc);
}

/* protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, and a Parameter */
static void test_protocol4(void) {
    pk p = {0}, body = {0};
    /* body */
    op(&body, 0x8c); op(&body, 11); put(&body, "collections", 11); op(&body, 0x94);
    op(&body, 0x8c); op(&body, 11); put(&body, "OrderedDict", 11); op(&body, 0x94);
    op(&body, 0x93); op(&body, 0x94);
    op(&body, ')'); op(&body, 'R'); op(&body, 0x94);
    op(&body, 0x8c); op(&body, 1); op(&body, 'p'); op(&body, 0x94);
    op(&body, 0x8c); op(&body, 12); put(&body, "torch._utils", 12);
    op(&body, 0x8c); op(&body, 18); put(&body, "_rebuild_parameter", 18); op(&body, 0x93);
    tensor2(&body, "k", 4, 1, 1, 3, 3, 1);
    op(&body, 0x88); /* requires_grad True */
    op(&body, 'h'); op(&body, 2); op(&body, ')'); op(&body, 'R'); /* BINGET OrderedDict (memo 2) */
    op(&body, 0x87); /* TUPLE3 */
    op(&body, 'R');
    op(&body, 's');
    op(&body, 0x8c); op(&body, 1); op(&body, 'n');
    op(&body, 0x8a); op(&body, 8); le(&body, (uint64_t)-5, 8); /* LONG1 -5 in 8 bytes */
    op(&body, 's');
    op(&body, 0x8c); op(&body, 1); op(&body, 'f');
    op(&body, 'G'); { unsigned char f[8] = {0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a}; put(&body, f, 8); }
    op(&body, 's');
    op(&body, '.');
    proto(&p, 4);
    op(&p, 0x95); le(&p, body.n, 8);
    put(&p, body.b, body.n);
    free(body.b);
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    const nd_pk *r = doc->root, *t = dict_get(r, "p"), *n = dict_get(r, "n"), *f = dict_get(r, "f");
    CHECK(t && t->kind == ND_PK_TENSOR && t->u.tensor.requires_grad && t->u.tensor.offset == 1);
    CHECK(t && t->u.tensor.ndim == 2 && t->u.tensor.shape[1] == 3);
    CHECK(n && n->kind == ND_PK_INT && n->u.i == -5);
    CHECK(f && f->kind == ND_PK_FLOAT && f->u.f == 0.1);
    nd_pickle_free(doc);
}

/* plain values: lists, tuples, None, bools, ints, strings, bytes, dtypes */
static void test_values(void) {
    pk p = {0};
    proto(&p, 2);
    op(&p, '(');
    op(&p, 'N'); op(&p, 0x88); op(&p, 0x89);
    op(&p, 'J'); le(&p, (uint32_t)-7, 4);
    op(&p, 'M'); le(&p, 60000, 2);
    op(&p, 0x8a); op(&p, 9); le(&p, 0, 8); op(&p, 0); /* 0 in 9 bytes */
    op(&p, 0x8a); op(&p, 0);                          /* LONG1 of no bytes: 0 */
    op(&p, 'C'); op(&p, 3); put(&p, "a\0b", 3);
    op(&p, 'U'); op(&p, 2); put(&p, "hi", 2);
    glob(&p, "torch", "bfloat16");
    put(&p, "I01\n", 4); put(&p, "L-12L\n", 6);
    op(&p, 'l');
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    const nd_pk *l = doc->root;
    CHECK(l->kind == ND_PK_LIST && l->u.seq.n == 12);
    if (l->kind == ND_PK_LIST && l->u.seq.n == 12) {
        nd_pk **it = l->u.seq.items;
        CHECK(it[0]->kind == ND_PK_NONE);
        CHECK(it[1]->kind == ND_PK_BOOL && it[1]->u.b && !it[2]->u.b);
        CHECK(it[3]->kind == ND_PK_INT && it[3]->u.i == -7);
        CHECK(it[4]->u.i == 60000 && it[5]->u.i == 0 && it[6]->u.i == 0);
        CHECK(it[7]->kind == ND_PK_BYTES && it[7]->u.str.len == 3 && !memcmp(it[7]->u.str.s, "a\0b", 3));
        CHECK(it[8]->kind == ND_PK_STR && !strcmp(it[8]->u.str.s, "hi"));
        CHECK(it[9]->kind == ND_PK_GLOBAL && it[9]->u.global.id == ND_PKG_DTYPE &&
              it[9]->u.global.elem == ND_PKT_BFLOAT16);
        CHECK(it[10]->kind == ND_PK_BOOL && it[10]->u.b);
        CHECK(it[11]->kind == ND_PK_INT && it[11]->u.i == -12);
    }
    nd_pickle_free(doc);
    CHECK(nd_pk_elem_size(ND_PKT_BFLOAT16) == 2 && !strcmp(nd_pk_elem_name(ND_PKT_INT8), "int8"));
}

/* Protocols < 3 write bytes as _codecs.encode(str, 'latin1') and b'' as
 * bytes(): read as data, and nothing else of _codecs / builtins is callable. */
static void encode_latin1(pk *p, const char *s, size_t n) {
    glob(p, "_codecs", "encode");
    uni_n(p, s, n);
    uni(p, "latin1");
    op(p, 0x86);
    op(p, 'R');
}
static void test_bytes_proto2(void) {
    pk p = {0};
    proto(&p, 2);
    op(&p, '(');
    encode_latin1(&p, "\x00\x7f\xc2\x80\xc3\xbf", 6); /* U+0000 U+007F U+0080 U+00FF */
    op(&p, 'q'); op(&p, 1);
    glob(&p, "_codecs", "encode");                    /* the same str again, memoised */
    uni_n(&p, "a\xc3\xa9", 3);
    op(&p, 'q'); op(&p, 2);
    uni(&p, "latin1");
    op(&p, 0x86); op(&p, 'R');
    glob(&p, "_codecs", "encode");
    op(&p, 'h'); op(&p, 2);
    uni(&p, "latin1");
    op(&p, 0x86); op(&p, 'R');
    glob(&p, "__builtin__", "bytes"); op(&p, ')'); op(&p, 'R');
    glob(&p, "builtins", "bytes"); op(&p, ')'); op(&p, 'R');
    encode_latin1(&p, "", 0);
    op(&p, 'h'); op(&p, 1);                           /* the memoised bytes */
    op(&p, 'l');
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    const nd_pk *l = doc->root;
    CHECK(l->kind == ND_PK_LIST && l->u.seq.n == 7);
    if (l->kind == ND_PK_LIST && l->u.seq.n == 7) {
        nd_pk **it = l->u.seq.items;
        CHECK(it[0]->kind == ND_PK_BYTES && it[0]->u.str.len == 4 && !memcmp(it[0]->u.str.s, "\x00\x7f\x80\xff", 4));
        CHECK(it[1]->kind == ND_PK_BYTES && it[1]->u.str.len == 2 && !memcmp(it[1]->u.str.s, "a\xe9", 2));
        CHECK(it[2] == it[1]); /* one str encoded twice: one node, not a second copy */
        for (int i = 3; i < 6; i++)
            CHECK(it[i]->kind == ND_PK_BYTES && it[i]->u.str.len == 0 && it[i]->u.str.s && !it[i]->u.str.s[0]);
        CHECK(it[6] == it[0]);
    }
    nd_pickle_free(doc);

    /* code points above 0xFF: U+0100, U+20AC (3 bytes), U+1F600 (4 bytes) */
    proto(&p, 2); encode_latin1(&p, "ab\xc4\x80", 4); op(&p, '.');
    BAD_PK("encode U+0100", p, "_codecs.encode: the str has a character above U+00FF (at byte 2", "latin1");
    proto(&p, 2); encode_latin1(&p, "\xe2\x82\xac", 3); op(&p, '.');
    BAD_PK("encode U+20AC", p, "character above U+00FF (at byte 0", NULL);
    proto(&p, 2); encode_latin1(&p, "x\xf0\x9f\x98\x80", 5); op(&p, '.');
    BAD_PK("encode U+1F600", p, "character above U+00FF (at byte 1", NULL);
    /* other encodings, even latin1's aliases: pickle writes 'latin1' only */
    const char *encs[] = {"utf-8", "latin-1", "LATIN1", "latin1\0", "rot13", ""};
    for (size_t i = 0; i < sizeof encs / sizeof *encs; i++) {
        proto(&p, 2); glob(&p, "_codecs", "encode"); uni(&p, "abc");
        uni_n(&p, encs[i], strlen(encs[i]) + (i == 3)); op(&p, 0x86); op(&p, 'R'); op(&p, '.');
        BAD_PK("encode with another encoding", p, "_codecs.encode: encoding '", "is not supported (only 'latin1'");
    }
    /* argument counts and types */
    proto(&p, 2); glob(&p, "_codecs", "encode"); uni(&p, "abc"); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode(s)", p, "_codecs.encode takes 2 arguments", "got 1");
    proto(&p, 2); glob(&p, "_codecs", "encode"); uni(&p, "abc"); uni(&p, "latin1"); uni(&p, "strict");
    op(&p, 0x87); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode(s, enc, errors)", p, "_codecs.encode takes 2 arguments", "got 3");
    proto(&p, 2); glob(&p, "_codecs", "encode"); op(&p, ')'); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode()", p, "_codecs.encode takes 2 arguments", "got 0");
    proto(&p, 2); glob(&p, "_codecs", "encode"); op(&p, 'C'); op(&p, 2); put(&p, "ab", 2);
    uni(&p, "latin1"); op(&p, 0x86); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode(bytes, ...)", p, "_codecs.encode: the text must be a str, not bytes", NULL);
    proto(&p, 2); glob(&p, "_codecs", "encode"); uni(&p, "abc"); k1(&p, 1); op(&p, 0x86); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode(s, 1)", p, "_codecs.encode: the encoding must be a str, not int", NULL);
    proto(&p, 2); glob(&p, "_codecs", "encode"); op(&p, 'N'); op(&p, 'R'); op(&p, '.');
    BAD_PK("encode args not a tuple", p, "arguments must be a tuple", NULL);
    proto(&p, 2); glob(&p, "__builtin__", "bytes"); k1(&p, 3); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    BAD_PK("bytes(3)", p, "__builtin__.bytes called with 1 argument", "only bytes() is supported");
    proto(&p, 2); glob(&p, "builtins", "bytes"); uni(&p, "abc"); uni(&p, "latin1"); op(&p, 0x86); op(&p, 'R'); op(&p, '.');
    BAD_PK("bytes(s, enc)", p, "builtins.bytes called with 2 arguments", NULL);
    proto(&p, 2); glob(&p, "builtins", "bytes"); op(&p, ')'); op(&p, 0x81); op(&p, '.');
    BAD_PK("NEWOBJ bytes", p, "NEWOBJ of builtins.bytes", NULL);
    /* the neighbours stay refused */
    const char *refused[][2] = {{"_codecs", "decode"}, {"_codecs", "lookup"}, {"codecs", "encode"},
                                {"builtins", "bytearray"}, {"__builtin__", "eval"}, {"builtins", "getattr"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char want[64];
        snprintf(want, sizeof want, "global '%s.%s' is not allowed", refused[i][0], refused[i][1]);
        proto(&p, 2); glob(&p, refused[i][0], refused[i][1]); uni(&p, "abc"); uni(&p, "latin1");
        op(&p, 0x86); op(&p, 'R'); op(&p, '.');
        BAD_PK("neighbour global", p, want, "bytes");
    }
    /* encode is no tensor rebuilder */
    proto(&p, 2); glob(&p, "torch._tensor", "_rebuild_from_type_v2");
    op(&p, '(');
    glob(&p, "_codecs", "encode"); glob(&p, "torch", "Tensor");
    uni(&p, "abc"); uni(&p, "latin1"); op(&p, 0x86); op(&p, '}');
    op(&p, 't'); op(&p, 'R'); op(&p, '.');
    BAD_PK("_rebuild_from_type_v2(encode, ...)", p, "func must be torch._utils._rebuild_tensor_v2", NULL);
}

/* sparse memo indices are legal; shared containers are fine; repeated keys replace */
static void test_memo_and_sharing(void) {
    pk p = {0};
    proto(&p, 2);
    op(&p, ']');
    op(&p, ']');
    op(&p, 'r'); le(&p, 1000000, 4);                   /* LONG_BINPUT 1000000: the inner list */
    op(&p, 'a');
    op(&p, 'j'); le(&p, 1000000, 4);                   /* LONG_BINGET 1000000 */
    op(&p, 0x85);                                      /* ([],) shares the inner list */
    op(&p, 'a');
    op(&p, '}'); k1(&p, 1); k1(&p, 2); op(&p, 's');
    op(&p, 0x88); k1(&p, 3); op(&p, 's');              /* True == 1: replaces */
    op(&p, 'a');
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    const nd_pk *l = doc->root;
    CHECK(l->kind == ND_PK_LIST && l->u.seq.n == 3);
    if (l->kind == ND_PK_LIST && l->u.seq.n == 3) {
        const nd_pk *inner = l->u.seq.items[0], *t = l->u.seq.items[1], *d = l->u.seq.items[2];
        CHECK(inner->kind == ND_PK_LIST && t->kind == ND_PK_TUPLE && t->u.seq.items[0] == inner);
        CHECK(d->kind == ND_PK_DICT && d->u.dict.n == 1 && d->u.dict.values[0]->u.i == 3);
    }
    nd_pickle_free(doc);
}

/* cycles: a container added to itself, directly or through others */
static void test_cycles(void) {
    pk p = {0};
    proto(&p, 2); op(&p, ']'); op(&p, 'q'); op(&p, 0); op(&p, 'h'); op(&p, 0); op(&p, 'a'); op(&p, '.');
    BAD_PK("list appended to itself", p, "APPEND of a list into itself", NULL);
    proto(&p, 2); op(&p, ']'); op(&p, 'q'); op(&p, 0); op(&p, '('); op(&p, 'h'); op(&p, 0); op(&p, 'e'); op(&p, '.');
    BAD_PK("APPENDS to itself", p, "into itself", NULL);
    proto(&p, 2); op(&p, '}'); op(&p, 'q'); op(&p, 0); k1(&p, 1); op(&p, 'h'); op(&p, 0); op(&p, 's'); op(&p, '.');
    BAD_PK("dict set into itself", p, "SETITEM of a dict into itself", NULL);
    /* L1 = []; L2 = [L1]; L1.append((L2,)) */
    proto(&p, 2);
    op(&p, ']'); op(&p, 'q'); op(&p, 0);
    op(&p, ']'); op(&p, 'q'); op(&p, 1); op(&p, 'h'); op(&p, 0); op(&p, 'a');
    op(&p, '0');
    op(&p, 'h'); op(&p, 1); op(&p, 0x85); op(&p, 'a');
    op(&p, '.');
    BAD_PK("cycle through a tuple and a list", p, "makes a list contain itself (through a tuple)", NULL);
    /* a list added many times to many lists: shared, not cyclic, stays fast */
    proto(&p, 2);
    op(&p, ']');
    for (int i = 0; i < 2000; i++) k1(&p, 1), op(&p, 'a');
    op(&p, 'q'); op(&p, 0); op(&p, '0');
    op(&p, ']');
    for (int i = 0; i < 5000; i++) { op(&p, ']'); op(&p, 'h'); op(&p, 0); op(&p, 'a'); op(&p, 'a'); }
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    nd_pickle_free(doc);
    /* a chain of lists each holding the previous, appended again and again: the walk budget */
    proto(&p, 2);
    op(&p, ']'); op(&p, 'q'); op(&p, 0);
    for (int i = 1; i < 200; i++) { op(&p, ']'); op(&p, 'q'); op(&p, (unsigned char)i); op(&p, 'h'); op(&p, (unsigned char)(i - 1)); op(&p, 'a'); op(&p, '0'); }
    op(&p, ']');
    for (int i = 0; i < 20000; i++) { op(&p, 'h'); op(&p, 199); op(&p, 'a'); }
    op(&p, '.');
    st_any(&p);
}

/* a big dict: duplicate detection must stay linear */
static void test_big_dict(void) {
    pk p = {0};
    proto(&p, 2);
    op(&p, '}');
    op(&p, '(');
    for (unsigned i = 0; i < 200000; i++) { op(&p, 'J'); le(&p, i, 4); op(&p, 'N'); }
    op(&p, 'u');
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    CHECK(doc->root->kind == ND_PK_DICT && doc->root->u.dict.n == 200000);
    nd_pickle_free(doc);
}

/* ---- hostile streams */

static void test_globals(void) {
    pk p = {0};
    proto(&p, 2); glob(&p, "builtins", "eval"); op(&p, '.');
    BAD_PK("GLOBAL builtins.eval", p, "global 'builtins.eval' is not allowed", "(at byte 2)");
    proto(&p, 2); glob(&p, "os", "system"); op(&p, 'q'); op(&p, 0);
    op(&p, 'X'); le(&p, 5, 4); put(&p, "touch", 5); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    BAD_PK("REDUCE os.system", p, "global 'os.system' is not allowed", "OrderedDict");
    proto(&p, 4);
    op(&p, 0x8c); op(&p, 8); put(&p, "builtins", 8);
    op(&p, 0x8c); op(&p, 4); put(&p, "exec", 4);
    op(&p, 0x93); op(&p, '.');
    BAD_PK("STACK_GLOBAL builtins.exec", p, "global 'builtins.exec' is not allowed", NULL);
    /* STACK_GLOBAL whose parts are not strings, or too few */
    proto(&p, 4); glob(&p, "collections", "OrderedDict"); op(&p, 0x8c); op(&p, 4); put(&p, "eval", 4);
    op(&p, 0x93); op(&p, '.');
    BAD_PK("STACK_GLOBAL global+str", p, "STACK_GLOBAL needs two str values", NULL);
    proto(&p, 4); op(&p, 0x8c); op(&p, 4); put(&p, "eval", 4); op(&p, 0x93); op(&p, '.');
    BAD_PK("STACK_GLOBAL one value", p, "stack underflow", "STACK_GLOBAL");
    /* a name with a newline smuggled in, or NULs and quotes */
    proto(&p, 4);
    op(&p, 0x8c); op(&p, 11); put(&p, "collections", 11);
    op(&p, 0x8c); op(&p, 12); put(&p, "OrderedDict\0", 12);
    op(&p, 0x93); op(&p, '.');
    BAD_PK("STACK_GLOBAL with NUL", p, "OrderedDict\\x00' is not allowed", NULL);
    proto(&p, 2); glob(&p, "torch", "load"); op(&p, '.');
    BAD_PK("torch.load", p, "global 'torch.load' is not allowed", NULL);
    proto(&p, 2); glob(&p, "torch._utils", "_rebuild_tensor_v2\rX"); op(&p, '.');
    BAD_PK("name with CR", p, "not allowed", NULL);
    /* REDUCE on something other than an allowed callable */
    proto(&p, 2); op(&p, ')'); op(&p, ')'); op(&p, 'R'); op(&p, '.');
    BAD_PK("REDUCE on a tuple", p, "REDUCE on a tuple", NULL);
    proto(&p, 2); glob(&p, "torch", "FloatStorage"); op(&p, ')'); op(&p, 'R'); op(&p, '.');
    BAD_PK("REDUCE on a storage type", p, "'torch.FloatStorage' cannot be called", NULL);
    proto(&p, 2); glob(&p, "collections", "OrderedDict"); op(&p, 'N'); op(&p, 'R'); op(&p, '.');
    BAD_PK("REDUCE args not a tuple", p, "arguments must be a tuple", NULL);
    proto(&p, 2); glob(&p, "collections", "OrderedDict"); op(&p, ']'); op(&p, 0x85); op(&p, 'R'); op(&p, '.');
    BAD_PK("OrderedDict(args)", p, "OrderedDict called with arguments", NULL);
    proto(&p, 2); glob(&p, "torch", "Tensor"); op(&p, ')'); op(&p, 0x81); op(&p, '.');
    BAD_PK("NEWOBJ torch.Tensor", p, "NEWOBJ of torch.Tensor", NULL);
    /* objects-creating opcodes */
    put(&p, "(i__builtin__\neval\n.", 20);
    BAD_PK("INST", p, "opcode INST (0x69) is not supported", "arbitrary objects");
    proto(&p, 2); op(&p, '('); op(&p, ')'); op(&p, 'o'); op(&p, '.');
    BAD_PK("OBJ", p, "opcode OBJ", NULL);
    proto(&p, 2); op(&p, 0x82); op(&p, 1); op(&p, '.');
    BAD_PK("EXT1", p, "opcode EXT1", NULL);
    proto(&p, 2); op(&p, 0xff); op(&p, '.');
    BAD_PK("unknown opcode", p, "unknown opcode 0xff", "(at byte 2)");
    proto(&p, 6); op(&p, 'N'); op(&p, '.');
    BAD_PK("protocol 6", p, "unsupported pickle protocol 6", NULL);
    proto(&p, 4); op(&p, 0x8f); op(&p, '.');
    BAD_PK("EMPTY_SET", p, "EMPTY_SET", NULL);
    /* BUILD on something else than a dict */
    proto(&p, 2); op(&p, ']'); op(&p, '}'); op(&p, 'b'); op(&p, '.');
    BAD_PK("BUILD on a list", p, "BUILD on a list", NULL);
}

static void test_stack(void) {
    pk p = {0};
    /* fuzz finding: MARK then TUPLE / LIST / DICT before anything was pushed
     * (the stack array was still NULL: UBSan "zero offset to null pointer") */
    const char *first[] = {"t", "l", "d"};
    for (int i = 0; i < 3; i++) {
        proto(&p, 2); op(&p, '('); op(&p, (unsigned char)first[i][0]); op(&p, '.');
        nd_pk_doc *doc = NULL;
        OK(load(&p, &doc));
        const nd_pk *r = doc->root;
        CHECK(r->kind == ND_PK_DICT ? r->u.dict.n == 0 : r->u.seq.n == 0);
        nd_pickle_free(doc);
    }
    proto(&p, 2); op(&p, '.');
    BAD_PK("STOP on empty stack", p, "stack underflow: STOP", NULL);
    proto(&p, 2); op(&p, 'N');
    BAD_PK("no STOP", p, "truncated", "STOP");
    BAD_PK("empty stream", p, "truncated", NULL);
    proto(&p, 2); op(&p, ']'); op(&p, 'a'); op(&p, '.');
    BAD_PK("APPEND underflow", p, "stack underflow: APPEND needs 2 values", NULL);
    proto(&p, 2); op(&p, ']'); op(&p, '('); k1(&p, 1); op(&p, 'a'); op(&p, '.');
    BAD_PK("APPEND across a MARK", p, "above the last MARK", NULL);
    proto(&p, 2); k1(&p, 1); op(&p, 't'); op(&p, '.');
    BAD_PK("TUPLE without MARK", p, "TUPLE without a MARK", NULL);
    proto(&p, 2); op(&p, '1'); op(&p, '.');
    BAD_PK("POP_MARK without MARK", p, "POP_MARK without a MARK", NULL);
    proto(&p, 2); op(&p, '('); k1(&p, 1); op(&p, 'e'); op(&p, '.');
    BAD_PK("APPENDS without list", p, "APPENDS has no list", NULL);
    proto(&p, 2); k1(&p, 1); op(&p, '('); k1(&p, 1); op(&p, 'e'); op(&p, '.');
    BAD_PK("APPENDS to an int", p, "APPENDS to a int", NULL);
    proto(&p, 2); op(&p, '}'); op(&p, '('); k1(&p, 1); k1(&p, 2); k1(&p, 3); op(&p, 'u'); op(&p, '.');
    BAD_PK("SETITEMS odd", p, "odd number of values (3)", NULL);
    proto(&p, 2); op(&p, '}'); op(&p, ']'); k1(&p, 1); op(&p, 's'); op(&p, '.');
    BAD_PK("list as key", p, "unhashable dict key of type list", NULL);
    proto(&p, 2); op(&p, '}'); op(&p, '}'); k1(&p, 1); op(&p, 's'); op(&p, '.');
    BAD_PK("dict as key", p, "unhashable dict key of type dict", NULL);
    proto(&p, 2); op(&p, '}'); op(&p, ']'); op(&p, 0x85); k1(&p, 1); op(&p, 's'); op(&p, '.');
    BAD_PK("tuple holding a list as key", p, "unhashable dict key: a tuple holding a list", NULL);
    proto(&p, 2); k1(&p, 1); k1(&p, 2); k1(&p, 3); op(&p, 's'); op(&p, '.');
    BAD_PK("SETITEM on int", p, "SETITEM on a int", NULL);
    proto(&p, 2);
    for (int i = 0; i < 300; i++) op(&p, '(');
    op(&p, '.');
    BAD_PK("300 MARKs", p, "more than 256 nested MARKs (ND_PK_MAX_DEPTH)", NULL);
}

static void test_key_work(void) {
    pk p = {0};
    /* a tuple key longer than 64 items */
    proto(&p, 2); op(&p, '}'); op(&p, '(');
    for (int i = 0; i < 65; i++) k1(&p, 1);
    op(&p, 't'); op(&p, 'N'); op(&p, 's'); op(&p, '.');
    BAD_PK("tuple key of 65 items", p, "tuple of 65 items is not supported", NULL);
    /* two equal 100 KB keys, the second set again and again: each time a full
     * comparison, until the work budget runs out (instead of running for minutes) */
    static char big[100000];
    memset(big, 'k', sizeof big);
    proto(&p, 2);
    op(&p, 'X'); le(&p, sizeof big, 4); put(&p, big, sizeof big); op(&p, 'q'); op(&p, 0); op(&p, '0');
    op(&p, 'X'); le(&p, sizeof big, 4); put(&p, big, sizeof big); op(&p, 'q'); op(&p, 1); op(&p, '0');
    op(&p, '}'); op(&p, 'h'); op(&p, 0); op(&p, 'N'); op(&p, 's');
    for (int i = 0; i < 100000; i++) { op(&p, 'h'); op(&p, 1); op(&p, 'N'); op(&p, 's'); }
    op(&p, '.');
    BAD_PK("big equal keys", p, "dict keys too often", "64 per input byte");
    /* the same key node again and again is free */
    proto(&p, 2);
    op(&p, 'X'); le(&p, sizeof big, 4); put(&p, big, sizeof big); op(&p, 'q'); op(&p, 0); op(&p, '0');
    op(&p, '}');
    for (int i = 0; i < 100000; i++) { op(&p, 'h'); op(&p, 0); op(&p, 'N'); op(&p, 's'); }
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    CHECK(doc->root->u.dict.n == 1);
    nd_pickle_free(doc);
}

static void test_limits(void) {
    pk p = {0};
    /* deep nesting: TUPLE1 on TUPLE1 ... and lists appended into lists */
    proto(&p, 2); op(&p, 'N');
    for (int i = 0; i < 1000; i++) op(&p, 0x85);
    op(&p, '.');
    BAD_PK("deep tuples", p, "nested deeper than 256 levels (ND_PK_MAX_DEPTH)", NULL);
    proto(&p, 2);
    op(&p, ']');
    for (int i = 0; i < 400; i++) { op(&p, ']'); op(&p, '2'); op(&p, 0x85); op(&p, 'a'); }
    op(&p, '.');
    /* each step wraps: [t] where t = (list,), and the list grows deeper */
    BAD_PK("L.append((L,))", p, "contain itself", NULL);
    proto(&p, 2); op(&p, ']');
    for (int i = 0; i < 300; i++) { /* v -> ([v],) through the memo */
        op(&p, 'q'); op(&p, 0); op(&p, '0'); op(&p, ']'); op(&p, 'h'); op(&p, 0); op(&p, 'a'); op(&p, 0x85);
    }
    op(&p, '.');
    BAD_PK("deep mixed", p, "ND_PK_MAX_DEPTH", NULL);
    /* huge lengths */
    proto(&p, 2); op(&p, 'X'); le(&p, 0xffffffffu, 4); put(&p, "abc", 3);
    BAD_PK("BINUNICODE 4 GB", p, "BINUNICODE of 4294967295 bytes", "ND_PK_MAX_STR");
    proto(&p, 2); op(&p, 'X'); le(&p, 100, 4); put(&p, "abc", 3);
    BAD_PK("BINUNICODE past the end", p, "truncated: BINUNICODE needs 100 bytes, 3 left", NULL);
    proto(&p, 4); op(&p, 0x8d); le(&p, 1ull << 62, 8); put(&p, "abc", 3);
    BAD_PK("BINUNICODE8 2^62", p, "ND_PK_MAX_STR", NULL);
    proto(&p, 4); op(&p, 0x8e); le(&p, UINT64_MAX, 8); op(&p, '.');
    BAD_PK("BINBYTES8 2^64-1", p, "ND_PK_MAX_STR", NULL);
    proto(&p, 2); op(&p, 'T'); le(&p, (uint32_t)-1, 4); op(&p, '.');
    BAD_PK("BINSTRING negative", p, "negative length", NULL);
    proto(&p, 2); op(&p, 0x8b); le(&p, 0x7fffffff, 4); op(&p, '.');
    BAD_PK("LONG4 huge", p, "truncated: LONG4", NULL);
    proto(&p, 2); op(&p, 0x8a); op(&p, 9); le(&p, 0, 8); op(&p, 1); op(&p, '.');
    BAD_PK("LONG1 2^64", p, "does not fit in 64 bits", NULL);
    proto(&p, 2); put(&p, "I99999999999999999999\n.", 23);
    BAD_PK("INT overflow", p, "INT integer does not fit", NULL);
    proto(&p, 4); op(&p, 0x95); le(&p, 1000, 8); op(&p, 'N'); op(&p, '.');
    BAD_PK("FRAME past end", p, "FRAME of 1000 bytes runs past the end", NULL);
    proto(&p, 2); op(&p, 'X'); le(&p, 2, 4); put(&p, "\xc3\x28", 2); op(&p, '.');
    BAD_PK("bad UTF-8", p, "not valid UTF-8", NULL);
    proto(&p, 2); op(&p, 'X'); le(&p, 3, 4); put(&p, "\xed\xa0\x80", 3); op(&p, '.');
    BAD_PK("surrogate", p, "not valid UTF-8", NULL);
    proto(&p, 2); op(&p, 'c'); for (int i = 0; i < 300; i++) op(&p, 'a');
    op(&p, '\n'); put(&p, "x\n.", 3);
    BAD_PK("long GLOBAL", p, "GLOBAL argument longer than 256 bytes", NULL);
    proto(&p, 2); put(&p, "ctorch", 6);
    BAD_PK("GLOBAL truncated", p, "truncated: GLOBAL", NULL);
    /* memo */
    proto(&p, 2); op(&p, 'h'); op(&p, 3); op(&p, '.');
    BAD_PK("BINGET unset", p, "memo index 3 was never set", NULL);
    proto(&p, 2); op(&p, 'N'); op(&p, 'q'); op(&p, 1); op(&p, 'h'); op(&p, 0); op(&p, '.');
    BAD_PK("BINGET unset 0", p, "memo index 0 was never set", NULL);
    proto(&p, 2); op(&p, 'N'); op(&p, 'r'); le(&p, 0xffffffffu, 4); op(&p, '.');
    BAD_PK("LONG_BINPUT 2^32-1", p, "memo index 4294967295 is past the limit", "ND_PK_MAX_MEMO");
    proto(&p, 2); op(&p, 'j'); le(&p, 0xffffffffu, 4); op(&p, '.');
    BAD_PK("LONG_BINGET 2^32-1", p, "never set", NULL);
    proto(&p, 2); op(&p, 'q'); op(&p, 0); op(&p, '.');
    BAD_PK("BINPUT on empty stack", p, "stack underflow: BINPUT", NULL);
    proto(&p, 2); op(&p, 'N'); put(&p, "p-1\n.", 5);
    BAD_PK("PUT -1", p, "not a memo index", NULL);
}

/* _rebuild_tensor_v2 geometry and the persistent ids */
static void tensor_case(const char *name, int line, const char *size, const char *stride, int off,
                        const char *want) {
    pk p = {0};
    proto(&p, 2);
    glob(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '(');
    storage(&p, "FloatStorage", "0", 10);
    if (off < 0) { op(&p, 'J'); le(&p, (uint32_t)off, 4); } else k1(&p, (unsigned)off);
    put(&p, size, strlen(size));
    put(&p, stride, strlen(stride));
    op(&p, 0x89);
    empty_od(&p);
    op(&p, 't');
    op(&p, 'R');
    op(&p, '.');
    nd_pk_doc *d = NULL;
    nd_status st = load(&p, &d);
    checks++;
    if (st == ND_OK || !strstr(nd_last_error(), want)) {
        failures++;
        printf("%s:%d: FAIL: %s: got '%s', want '%s'\n", __FILE__, line, name,
               st == ND_OK ? "success" : nd_last_error(), want);
    }
    nd_pickle_free(d);
}
/* tuples written as protocol-0 text: "(I2\nI3\nt" */
#define T2(a, b) "(I" #a "\nI" #b "\nt"

static void test_tensor_geometry(void) {
    tensor_case("negative size", __LINE__, T2(-1, 3), T2(3, 1), 0, "size[0] is negative (-1)");
    tensor_case("negative stride", __LINE__, T2(2, 3), T2(3, -1), 0, "stride[1] is negative");
    tensor_case("negative offset", __LINE__, T2(2, 3), T2(3, 1), -4, "storage offset is negative");
    tensor_case("rank mismatch", __LINE__, T2(2, 3), "(I1\nt", 0, "size has 2 dims but stride has 1");
    tensor_case("size overflow", __LINE__, T2(4294967296, 4294967296), T2(1, 1), 0, "size overflows 64 bits");
    tensor_case("stride overflow", __LINE__, T2(3, 2), T2(9223372036854775807, 1), 0,
                "size times stride overflows");
    tensor_case("extent + offset overflow", __LINE__, T2(2, 1), T2(9223372036854775807, 1), 5,
                "overflows 64 bits");
    tensor_case("9 dims", __LINE__, "(I1\nI1\nI1\nI1\nI1\nI1\nI1\nI1\nI1\nt", T2(1, 1), 0, "9 dims, more than 8");
    tensor_case("size not ints", __LINE__, "(I1\nNt", T2(1, 1), 0, "size[1] must be an int, not None");
    tensor_case("size not a tuple", __LINE__, "N", T2(1, 1), 0, "size must be a tuple of ints");
    /* zero-size tensors may have any stride */
    pk p = {0};
    proto(&p, 2);
    tensor2(&p, "0", 0, 0, 0, 5, 200, 100);
    op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    CHECK(doc->root->kind == ND_PK_TENSOR && doc->root->u.tensor.shape[0] == 0);
    nd_pickle_free(doc);

    /* wrong argument kinds */
    proto(&p, 2);
    glob(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '('); k1(&p, 0); k1(&p, 0); op(&p, ')'); op(&p, ')'); op(&p, 0x89); op(&p, 'N'); op(&p, 't');
    op(&p, 'R'); op(&p, '.');
    BAD_PK("storage is an int", p, "the storage argument is a int, not a storage", NULL);
    proto(&p, 2);
    glob(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '('); storage(&p, "FloatStorage", "0", 1); k1(&p, 0); op(&p, ')'); op(&p, ')'); op(&p, 0x89);
    op(&p, '}'); k1(&p, 1); k1(&p, 1); op(&p, 's'); op(&p, 't'); op(&p, 'R'); op(&p, '.');
    BAD_PK("hooks", p, "backward hooks are not supported", NULL);
    proto(&p, 2);
    glob(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '('); storage(&p, "FloatStorage", "0", 1); op(&p, 't'); op(&p, 'R'); op(&p, '.');
    BAD_PK("1 argument", p, "_rebuild_tensor_v2 takes 6 or 7 arguments, got 1", NULL);
    /* _rebuild_parameter of a non-tensor */
    proto(&p, 2);
    glob(&p, "torch._utils", "_rebuild_parameter");
    op(&p, '('); k1(&p, 1); op(&p, 0x88); empty_od(&p); op(&p, 't'); op(&p, 'R'); op(&p, '.');
    BAD_PK("parameter of int", p, "data must be a tensor", NULL);
    /* _rebuild_from_type_v2 with an evil func */
    proto(&p, 2);
    glob(&p, "torch._tensor", "_rebuild_from_type_v2");
    op(&p, '('); glob(&p, "collections", "OrderedDict"); glob(&p, "torch", "Tensor"); op(&p, ')'); op(&p, 'N');
    op(&p, 't'); op(&p, 'R'); op(&p, '.');
    BAD_PK("from_type evil func", p, "func must be torch._utils._rebuild_tensor_v2", NULL);
    /* _rebuild_from_type_v2 done right */
    proto(&p, 2);
    glob(&p, "torch._tensor", "_rebuild_from_type_v2");
    op(&p, '('); glob(&p, "torch._utils", "_rebuild_tensor_v2"); glob(&p, "torch.nn.parameter", "Parameter");
    op(&p, '(');
    storage(&p, "HalfStorage", "7", 3);
    k1(&p, 0); k1(&p, 3); op(&p, 0x85); k1(&p, 1); op(&p, 0x85); op(&p, 0x89); empty_od(&p);
    op(&p, 't');
    op(&p, '}');
    op(&p, 't'); op(&p, 'R'); op(&p, '.');
    OK(load(&p, &doc));
    CHECK(doc->root->kind == ND_PK_TENSOR && doc->root->u.tensor.storage->u.storage.elem == ND_PKT_FLOAT16);
    nd_pickle_free(doc);
}

static void pid_case(pk *p, const char *type, const char *key, const char *numel) {
    proto(p, 2);
    op(p, '(');
    uni(p, "storage");
    glob(p, "torch", type);
    uni(p, key);
    uni(p, "cpu");
    put(p, numel, strlen(numel));
    op(p, 't');
    op(p, 'Q');
    op(p, '.');
}

static void test_persistent_ids(void) {
    pk p = {0};
    pid_case(&p, "FloatStorage", "../../etc/passwd", "K\1");
    BAD_PK("key with ..", p, "bad storage key '../../etc/passwd'", NULL);
    pid_case(&p, "FloatStorage", "a/b", "K\1");
    BAD_PK("key with /", p, "bad storage key", NULL);
    pid_case(&p, "FloatStorage", "", "K\1");
    BAD_PK("empty key", p, "bad storage key", NULL);
    pid_case(&p, "FloatStorage", "0", "J\xff\xff\xff\xff");
    BAD_PK("negative numel", p, "negative size (-1)", NULL);
    pid_case(&p, "float32", "0", "K\1");
    BAD_PK("dtype as storage type", p, "not a torch storage class", NULL);
    pid_case(&p, "FloatStorage", "0", "N");
    BAD_PK("numel None", p, "numel is a None", NULL);
    proto(&p, 2); k1(&p, 1); op(&p, 'Q'); op(&p, '.');
    BAD_PK("pid is an int", p, "persistent id is a int, not a tuple", NULL);
    proto(&p, 2); op(&p, '('); uni(&p, "module"); op(&p, 't'); op(&p, 'Q'); op(&p, '.');
    BAD_PK("pid of 1 field", p, "persistent id has 1 fields", NULL);
    proto(&p, 2); op(&p, 'Q'); op(&p, '.');
    BAD_PK("BINPERSID on empty stack", p, "stack underflow: BINPERSID", NULL);
    /* the same key twice with another type or size */
    proto(&p, 2);
    storage(&p, "FloatStorage", "0", 4);
    storage(&p, "FloatStorage", "0", 5);
    op(&p, 0x86); op(&p, '.');
    BAD_PK("same key, other numel", p, "storage '0' appears twice", "float32[4] and float32[5]");
    proto(&p, 2);
    storage(&p, "FloatStorage", "0", 4);
    storage(&p, "LongStorage", "0", 4);
    op(&p, 0x86); op(&p, '.');
    BAD_PK("same key, other type", p, "appears twice", "int64[4]");
    proto(&p, 2);
    storage(&p, "ByteStorage", "x", 4);
    storage(&p, "ByteStorage", "x", 4);
    op(&p, 0x86); op(&p, '.');
    nd_pk_doc *doc = NULL;
    OK(load(&p, &doc));
    CHECK(doc->root->u.seq.items[0] == doc->root->u.seq.items[1]);
    nd_pickle_free(doc);
}

/* Every prefix of a valid stream fails cleanly; so does every one-byte edit. */
static void test_truncations_and_flips(void) {
    pk p = {0};
    proto(&p, 2);
    empty_od(&p);
    op(&p, '(');
    uni(&p, "w");
    tensor2(&p, "0", 6, 0, 2, 3, 3, 1);
    uni(&p, "v");
    tensor2(&p, "0", 6, 1, 1, 5, 5, 1);
    op(&p, 'u');
    op(&p, '.');
    for (size_t n = 0; n < p.n; n++) {
        nd_pk_doc *d = NULL;
        nd_status st = nd_pickle_load("op", "t", p.b, n, &d);
        CHECKM(st != ND_OK, "prefix of %zu bytes accepted", n);
        nd_pickle_free(d);
    }
    unsigned char *copy = malloc(p.n);
    int accepted = 0;
    for (size_t i = 0; i < p.n; i++)
        for (int v = 0; v < 256; v += 7) {
            memcpy(copy, p.b, p.n);
            copy[i] = (unsigned char)v;
            nd_pk_doc *d = NULL;
            if (nd_pickle_load("op", "t", copy, p.n, &d) == ND_OK) accepted++;
            nd_pickle_free(d);
        }
    CHECK(accepted > 0); /* some edits (a shape byte) stay valid */
    free(copy);
    free(p.b);
}

int main(void) {
    test_state_dict();
    test_protocol4();
    test_values();
    test_memo_and_sharing();
    test_cycles();
    test_big_dict();
    test_globals();
    test_bytes_proto2();
    test_stack();
    test_key_work();
    test_limits();
    test_tensor_geometry();
    test_persistent_ids();
    test_truncations_and_flips();
    printf("test_pickle: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
