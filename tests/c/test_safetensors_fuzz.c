/* test_safetensors_fuzz.c - the safetensors reader (src/io/safetensors.c) on
 * hostile input. Valid files written by the writer are mutated (bit flips,
 * byte edits, truncations, random header lengths, JSON edits and garbage),
 * and random headers are generated from parts (huge, negative and
 * overflowing shapes, bad dtypes, overlapping / gapped / out-of-range
 * offsets, duplicate keys, bad metadata, deep nesting, bad escapes and
 * UTF-8). Every input goes through the reader and through an independent
 * reference validator written here from the specification; they must agree
 * on every input, so the reader neither accepts an invalid file nor rejects
 * a valid one. An accepted file's tensors must hold exactly the bytes at
 * their offsets. Mutations that are invalid by construction (truncation, a
 * changed header length) are also checked to fail outright. Fixed seed:
 * every run sees the same inputs. Run under ASan/UBSan in build-asan. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "io/io.h"
#include "io/safetensors.h"
#include "needle.h"

static int failures = 0, accepted = 0, rejected = 0, trials = 0;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) { /* xorshift64 */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static uint64_t rnd(uint64_t n) { return n ? next() % n : 0; }

#define FAIL(...) do { failures++; printf("FAIL line %d (trial %d): ", __LINE__, trials); \
        printf(__VA_ARGS__); printf("\n"); if (failures > 20) exit(1); } while (0)
#define REQ(expr) do { nd_status s_ = (expr); if (s_ != ND_OK) { \
        printf("FAIL line %d: %s -> %s\n", __LINE__, #expr, nd_last_error()); exit(1); } } while (0)

/* ======================================================================
 * Reference validator: a second reading of the format, in a different
 * style (a DOM of malloc'd nodes, code-point UTF-8 decoding, decimal-string
 * integer range checks, 128-bit size arithmetic), with needle's policies:
 * the 100 MB header limit, at most 8 dims, at most 2^48 elements (zero
 * sizes counted as 1), JSON nesting of at most 32 levels, unknown tensor
 * fields ignored, bool bytes 0 or 1.
 * ====================================================================== */

typedef struct rnode {
    char t; /* 'o' object, 'a' array, 's' string, 'i' integer */
    char *s;
    size_t slen;
    long long i;
    int n;
    struct rnode **kid;
    char **key;
    size_t *klen;
} rnode;

static void rfree(rnode *r) {
    if (!r) return;
    for (int k = 0; k < r->n; k++) {
        rfree(r->kid[k]);
        if (r->key) free(r->key[k]);
    }
    free(r->kid);
    free(r->key);
    free(r->klen);
    free(r->s);
    free(r);
}

typedef struct { const unsigned char *p, *end; int bad; } rin;

static void rws(rin *in) {
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\n' || *in->p == '\r' || *in->p == '\t')) in->p++;
}

/* appends code point cp as UTF-8 */
static void put_cp(char *o, size_t *k, unsigned long cp) {
    if (cp <= 0x7f) o[(*k)++] = (char)cp;
    else if (cp <= 0x7ff) { o[(*k)++] = (char)(0xc0 | (cp >> 6)); o[(*k)++] = (char)(0x80 | (cp & 63)); }
    else if (cp <= 0xffff) {
        o[(*k)++] = (char)(0xe0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63));
        o[(*k)++] = (char)(0x80 | (cp & 63));
    } else {
        o[(*k)++] = (char)(0xf0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 63));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63));
        o[(*k)++] = (char)(0x80 | (cp & 63));
    }
}

static int read_u4(rin *in, unsigned long *v) {
    if (in->end - in->p < 4) return 0;
    char tmp[5];
    memcpy(tmp, in->p, 4);
    tmp[4] = 0;
    for (int k = 0; k < 4; k++)
        if (!strchr("0123456789abcdefABCDEF", tmp[k]) || !tmp[k]) return 0;
    *v = strtoul(tmp, NULL, 16);
    in->p += 4;
    return 1;
}

static char *rstring(rin *in, size_t *len) {
    /* at '"' */
    in->p++;
    size_t cap = (size_t)(in->end - in->p) + 1, k = 0;
    char *o = malloc(cap + 4);
    while (1) {
        if (in->p >= in->end) { free(o); return NULL; }
        unsigned char c = *in->p++;
        if (c == '"') break;
        if (c < 0x20) { free(o); return NULL; }
        if (c != '\\') { o[k++] = (char)c; continue; }
        if (in->p >= in->end) { free(o); return NULL; }
        c = *in->p++;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *f = c ? strchr(from, c) : NULL;
        if (f) { o[k++] = to[f - from]; continue; }
        if (c != 'u') { free(o); return NULL; }
        unsigned long cp, lo;
        if (!read_u4(in, &cp)) { free(o); return NULL; }
        if (cp >= 0xd800 && cp < 0xdc00) {
            if (in->end - in->p < 2 || in->p[0] != '\\' || in->p[1] != 'u') { free(o); return NULL; }
            in->p += 2;
            if (!read_u4(in, &lo) || lo < 0xdc00 || lo > 0xdfff) { free(o); return NULL; }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp <= 0xdfff) { free(o); return NULL; }
        put_cp(o, &k, cp);
    }
    o[k] = 0;
    *len = k;
    return o;
}

static rnode *rvalue(rin *in, int level);

static rnode *rcontainer(rin *in, int level, char open) {
    if (level >= 32) return NULL;
    rnode *r = calloc(1, sizeof *r);
    r->t = open == '{' ? 'o' : 'a';
    in->p++;
    rws(in);
    if (in->p < in->end && *in->p == (open == '{' ? '}' : ']')) { in->p++; return r; }
    for (;;) {
        char *key = NULL;
        size_t klen = 0;
        if (r->t == 'o') {
            rws(in);
            if (in->p >= in->end || *in->p != '"') { rfree(r); return NULL; }
            key = rstring(in, &klen);
            if (!key) { rfree(r); return NULL; }
            rws(in);
            if (in->p >= in->end || *in->p != ':') { free(key); rfree(r); return NULL; }
            in->p++;
        }
        rnode *v = rvalue(in, level + 1);
        if (!v) { free(key); rfree(r); return NULL; }
        r->kid = realloc(r->kid, (size_t)(r->n + 1) * sizeof *r->kid);
        r->key = realloc(r->key, (size_t)(r->n + 1) * sizeof *r->key);
        r->klen = realloc(r->klen, (size_t)(r->n + 1) * sizeof *r->klen);
        r->kid[r->n] = v;
        r->key[r->n] = key;
        r->klen[r->n] = klen;
        r->n++;
        rws(in);
        if (in->p >= in->end) { rfree(r); return NULL; }
        char c = (char)*in->p++;
        if (c == (r->t == 'o' ? '}' : ']')) break;
        if (c != ',') { rfree(r); return NULL; }
    }
    if (r->t == 'o') /* duplicate keys: pairwise */
        for (int a = 0; a < r->n; a++)
            for (int b = a + 1; b < r->n; b++)
                if (r->klen[a] == r->klen[b] && memcmp(r->key[a], r->key[b], r->klen[a]) == 0) {
                    rfree(r);
                    return NULL;
                }
    return r;
}

static rnode *rvalue(rin *in, int level) {
    rws(in);
    if (in->p >= in->end) return NULL;
    unsigned char c = *in->p;
    if (c == '{' || c == '[') return rcontainer(in, level, (char)c);
    if (c == '"') {
        size_t len;
        char *s = rstring(in, &len);
        if (!s) return NULL;
        rnode *r = calloc(1, sizeof *r);
        r->t = 's';
        r->s = s;
        r->slen = len;
        return r;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *st = in->p;
        int neg = c == '-';
        if (neg) in->p++;
        const unsigned char *d0 = in->p;
        while (in->p < in->end && *in->p >= '0' && *in->p <= '9') in->p++;
        size_t nd = (size_t)(in->p - d0);
        if (nd == 0) return NULL;
        if (nd > 1 && *d0 == '0') return NULL;
        if (in->p < in->end && (*in->p == '.' || *in->p == 'e' || *in->p == 'E')) return NULL;
        const char *lim = neg ? "9223372036854775808" : "9223372036854775807";
        if (nd > 19 || (nd == 19 && memcmp(d0, lim, 19) > 0)) return NULL;
        char tmp[24];
        memcpy(tmp, st, (size_t)(in->p - st));
        tmp[in->p - st] = 0;
        rnode *r = calloc(1, sizeof *r);
        r->t = 'i';
        r->i = strtoll(tmp, NULL, 10);
        return r;
    }
    return NULL;
}

/* UTF-8 by decoding: shortest form, no surrogates, <= U+10FFFF */
static int ref_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int len;
        unsigned long cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + (size_t)k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + (size_t)k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += (size_t)len;
    }
    return 1;
}

static rnode *field(const rnode *o, const char *k) {
    for (int i = 0; i < o->n; i++)
        if (o->klen[i] == strlen(k) && memcmp(o->key[i], k, o->klen[i]) == 0) return o->kid[i];
    return NULL;
}

typedef struct { unsigned long long b, e; int bool_; } rspan;
static int rspan_cmp(const void *x, const void *y) {
    const rspan *a = x, *b = y;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->e != b->e) return a->e < b->e ? -1 : 1;
    return 0;
}

static int ref_valid(const unsigned char *buf, size_t len) {
    if (len < 8) return 0;
    unsigned long long n = 0;
    for (int i = 0; i < 8; i++) n |= (unsigned long long)buf[i] << (8 * i);
    if (n > 100000000ull || n > len - 8 || n == 0) return 0;
    const unsigned char *h = buf + 8;
    if (!ref_utf8(h, (size_t)n)) return 0;
    rin in = {h, h + n, 0};
    rnode *root = rvalue(&in, 0);
    if (!root) return 0;
    rws(&in);
    int ok = in.p == in.end && root->t == 'o';
    unsigned long long dlen = len - 8 - n;
    rspan *sp = calloc((size_t)root->n + 1, sizeof *sp);
    int ns = 0;
    static const char *dn[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL"};
    static const int ds[] = {8, 4, 2, 2, 8, 4, 1, 1};
    for (int i = 0; ok && i < root->n; i++) {
        const rnode *v = root->kid[i];
        if (root->klen[i] == 12 && memcmp(root->key[i], "__metadata__", 12) == 0) {
            if (v->t != 'o') ok = 0;
            for (int k = 0; ok && k < v->n; k++)
                if (v->kid[k]->t != 's') ok = 0;
            continue;
        }
        if (v->t != 'o') { ok = 0; break; }
        const rnode *d = field(v, "dtype"), *s = field(v, "shape"), *o = field(v, "data_offsets");
        if (!d || !s || !o || d->t != 's' || s->t != 'a' || o->t != 'a') { ok = 0; break; }
        int size = 0;
        for (int k = 0; k < 8; k++)
            if (d->slen == strlen(dn[k]) && memcmp(d->s, dn[k], d->slen) == 0) size = ds[k];
        if (!size || s->n > 8 || o->n != 2) { ok = 0; break; }
        __int128 numel = 1, span = 1;
        for (int k = 0; ok && k < s->n; k++) {
            if (s->kid[k]->t != 'i' || s->kid[k]->i < 0) { ok = 0; break; }
            numel *= s->kid[k]->i;
            span *= s->kid[k]->i ? s->kid[k]->i : 1;
            if (span > ((__int128)1 << 48)) ok = 0;
        }
        if (!ok) break;
        if (o->kid[0]->t != 'i' || o->kid[1]->t != 'i') { ok = 0; break; }
        long long b = o->kid[0]->i, e = o->kid[1]->i;
        if (b < 0 || e < b || (unsigned long long)e > dlen || (__int128)(e - b) != numel * size) { ok = 0; break; }
        sp[ns].b = (unsigned long long)b;
        sp[ns].e = (unsigned long long)e;
        sp[ns].bool_ = size == 1 && d->slen == 4;
        ns++;
    }
    if (ok) {
        qsort(sp, (size_t)ns, sizeof *sp, rspan_cmp);
        unsigned long long at = 0;
        for (int k = 0; ok && k < ns; k++) {
            if (sp[k].b != at) ok = 0;
            at = sp[k].e;
        }
        if (at != dlen) ok = 0;
        for (int k = 0; ok && k < ns; k++)
            if (sp[k].bool_)
                for (unsigned long long q = sp[k].b; q < sp[k].e; q++)
                    if (buf[8 + n + q] > 1) ok = 0;
    }
    free(sp);
    rfree(root);
    return ok;
}

/* ====================================================================== */

typedef struct { unsigned char *p; size_t n, cap; } bytes;

static void bput(bytes *b, const void *s, size_t n) {
    if (n == 0 && b->p) return;
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void bstr(bytes *b, const char *s) { bput(b, s, strlen(s)); }

/* a file from header text and a data buffer */
static bytes make_file(const char *hdr, size_t hlen, const unsigned char *data, size_t dlen) {
    bytes f = {0};
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    bput(&f, le, 8);
    bput(&f, hdr, hlen);
    bput(&f, data, dlen);
    return f;
}

/* The reader against the reference on one input; returns the verdict. */
static int check_input(const unsigned char *buf, size_t len, int must_fail, const char *what) {
    trials++;
    nd_st_header *h = NULL;
    nd_tensor **ts = NULL;
    nd_status st = nd_st_load_memory("load", "fuzz", buf, len, &h, &ts);
    int ref = ref_valid(buf, len);
    if ((st == ND_OK) != ref) {
        FAIL("%s: reader says %s, reference says %s (%zu bytes)", what,
             st == ND_OK ? "valid" : nd_last_error(), ref ? "valid" : "invalid", len);
        if (len < 2000) {
            printf("  input: ");
            for (size_t i = 0; i < len; i++) printf(buf[i] >= 32 && buf[i] < 127 ? "%c" : "\\x%02x", buf[i]);
            printf("\n");
        }
    }
    if (must_fail && st == ND_OK) FAIL("%s: an invalid-by-construction input was accepted", what);
    if (st != ND_OK) {
        rejected++;
        const char *m = nd_last_error();
        if (strncmp(m, "load: 'fuzz': ", 14) != 0) FAIL("%s: message does not name the file: %s", what, m);
        if (h || ts) FAIL("%s: outputs set on failure", what);
        return 0;
    }
    accepted++;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)buf[i] << (8 * i);
    for (size_t i = 0; i < h->ntensors; i++) {
        const nd_st_info *t = &h->tensors[i];
        size_t nb = (size_t)(t->end - t->begin);
        if (nd_get_dtype(ts[i]) != t->dtype || nd_ndim(ts[i]) != t->ndim ||
            (size_t)nd_numel(ts[i]) * nd_dtype_size(t->dtype) != nb)
            FAIL("%s: tensor %zu does not match its header entry", what, i);
        else if (nb && memcmp(nd_data(ts[i]), buf + 8 + n + t->begin, nb) != 0)
            FAIL("%s: tensor %zu does not hold the bytes at its offsets", what, i);
    }
    nd_st_free_tensors(ts, h->ntensors);
    nd_st_header_free(h);
    return 1;
}

/* ---- valid base files from the writer ---- */

static nd_tensor *filled(const int64_t *shape, int ndim, nd_dtype dt) {
    nd_tensor *t;
    REQ(nd_empty(shape, ndim, dt, &t));
    size_t nb = (size_t)nd_numel(t) * nd_dtype_size(dt);
    unsigned char *p = nd_data(t);
    for (size_t i = 0; i < nb; i++) p[i] = dt == ND_BOOL ? (unsigned char)(next() & 1) : (unsigned char)next();
    if (dt == ND_FLOAT32 || dt == ND_FLOAT64 || dt == ND_FLOAT16 || dt == ND_BFLOAT16) {
        /* finite values only (NaN bits are fine for the reader, but keep it simple) */
        nd_tensor *f;
        REQ(nd_rand(shape, ndim, dt == ND_FLOAT16 || dt == ND_BFLOAT16 ? ND_FLOAT32 : dt, &f));
        nd_tensor *g;
        REQ(nd_to_dtype(f, dt, &g));
        nd_release(f);
        nd_release(t);
        t = g;
    }
    return t;
}

#define NBASE 6
static bytes base[NBASE];

static void make_bases(void) {
    static const nd_dtype dts[] = {ND_FLOAT64, ND_FLOAT32, ND_FLOAT16, ND_BFLOAT16,
                                   ND_INT64, ND_INT32, ND_UINT8, ND_BOOL};
    nd_manual_seed(7);
    for (int b = 0; b < NBASE; b++) {
        int nt = b == 0 ? 0 : 1 + (int)rnd(b == 5 ? 12 : 5);
        nd_st_entry e[16];
        char names[16][32];
        nd_tensor *t[16];
        for (int i = 0; i < nt; i++) {
            int ndim = (int)rnd(4);
            int64_t shape[4];
            for (int d = 0; d < ndim; d++) shape[d] = (int64_t)rnd(4) + (b == 3 && d == 0 ? 0 : 1);
            if (b == 4 && i == 0) { ndim = 2; shape[0] = 0; shape[1] = 5; } /* empty */
            nd_dtype dt = b == 2 ? ND_BOOL : dts[rnd(8)];
            t[i] = filled(shape, ndim, dt);
            snprintf(names[i], sizeof names[i], i % 3 == 0 ? "layer%d.weight" : i % 3 == 1 ? "b\"%d\\x" : "n\xc3\xa9%d", i);
            e[i] = (nd_st_entry){names[i], strlen(names[i]), t[i]};
        }
        static const char note[] = "a \"quoted\"\nline \xe2\x82\xac";
        nd_st_meta m[2] = {{"format", 6, "pt", 2}, {"note", 4, note, sizeof note - 1}};
        char *out;
        size_t len;
        REQ(nd_st_save_memory("save", e, (size_t)nt, m, b % 2 ? 2 : 0, &out, &len));
        base[b].p = (unsigned char *)out;
        base[b].n = base[b].cap = len;
        for (int i = 0; i < nt; i++) nd_release(t[i]);
        if (!check_input(base[b].p, base[b].n, 0, "base file")) FAIL("base file %d rejected", b);
        /* the writer's layout: header padded to 8 bytes, aligned tensors */
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)base[b].p[i] << (8 * i);
        if (n % 8) FAIL("base %d: header length %llu is not a multiple of 8", b, (unsigned long long)n);
    }
}

/* ---- mutators ---- */

static void fuzz_bitflips(int iters) {
    for (int it = 0; it < iters; it++) {
        const bytes *b = &base[rnd(NBASE)];
        unsigned char *p = malloc(b->n);
        memcpy(p, b->p, b->n);
        int flips = 1 + (int)rnd(it % 4 == 0 ? 8 : 1);
        for (int k = 0; k < flips; k++) {
            size_t at = rnd(b->n); /* sequenced: the same inputs whatever the compiler */
            p[at] ^= (unsigned char)(1u << rnd(8));
        }
        check_input(p, b->n, 0, "bit flip");
        free(p);
    }
}

static void fuzz_bytes(int iters) {
    static const char tok[] = "{}[]\":,\\ -0123456789eE.u\x01\x7f\xc3\xa9\xff";
    for (int it = 0; it < iters; it++) {
        const bytes *b = &base[rnd(NBASE)];
        unsigned char *p = malloc(b->n);
        memcpy(p, b->p, b->n);
        size_t at = 8 + rnd(b->n - 8);
        p[at] = rnd(2) ? (unsigned char)tok[rnd(sizeof tok - 1)] : (unsigned char)next();
        check_input(p, b->n, 0, "byte edit");
        free(p);
    }
}

static void fuzz_truncate(int iters) {
    for (int it = 0; it < iters; it++) {
        const bytes *b = &base[1 + rnd(NBASE - 1)];
        size_t n = rnd(b->n); /* strictly shorter */
        unsigned char *p = malloc(n ? n : 1);
        memcpy(p, b->p, n);
        check_input(p, n, 1, "truncation");
        free(p);
    }
}

static void fuzz_header_length(int iters) {
    for (int it = 0; it < iters; it++) {
        const bytes *b = &base[rnd(NBASE)];
        unsigned char *p = malloc(b->n);
        memcpy(p, b->p, b->n);
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)p[i] << (8 * i);
        uint64_t m;
        switch (rnd(5)) {
        case 0: m = next(); break;
        case 1: m = n + 1 + rnd(16); break;
        case 2: m = n - 1 - rnd(n < 16 ? n : 16); break; /* may wrap: fine */
        case 3: m = (uint64_t)b->n - 8 + rnd(3); break;
        default: m = 100000000ull + rnd(3) - 1; break;
        }
        if (m == n) m++;
        for (int i = 0; i < 8; i++) p[i] = (unsigned char)(m >> (8 * i));
        check_input(p, b->n, 1, "header length");
        free(p);
    }
}

/* the header text edited as text; the length field follows it */
static void fuzz_json_edits(int iters) {
    static const char *ins[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "0", "-1", "1e3", "1.5", "01",
                                "\"x\":1", "\"a\":{}", "\\u0000", "\\ud800", "\\udc00\\ud800", "true",
                                "null", "\t", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "__metadata__",
                                "\"dtype\":\"F32\"", "\"shape\":[]", "\"data_offsets\":[0,0]"};
    for (int it = 0; it < iters; it++) {
        const bytes *b = &base[rnd(NBASE)];
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)b->p[i] << (8 * i);
        bytes h = {0};
        bput(&h, b->p + 8, n);
        int edits = 1 + (int)rnd(3);
        for (int e = 0; e < edits; e++) {
            size_t at = rnd(h.n + 1);
            bytes nh = {0};
            bput(&nh, h.p, at);
            int kind = (int)rnd(3);
            if (kind == 0) bstr(&nh, ins[rnd(sizeof ins / sizeof *ins)]);            /* insert */
            size_t skip = kind == 1 ? 1 + rnd(8) : 0;                                  /* delete */
            if (kind == 2 && at < h.n) { size_t l = 1 + rnd(12); if (at + l > h.n) l = h.n - at;
                bput(&nh, h.p + at, l); }                                              /* duplicate */
            if (at + skip > h.n) skip = h.n - at;
            bput(&nh, h.p + at + skip, h.n - at - skip);
            free(h.p);
            h = nh;
        }
        bytes f = make_file((char *)h.p, h.n, b->p + 8 + n, b->n - 8 - n);
        check_input(f.p, f.n, 0, "json edit");
        free(f.p);
        free(h.p);
    }
}

static void fuzz_garbage(int iters) {
    static const char tok[] = "{}[]\":,  \"\"aF32shape0123-";
    for (int it = 0; it < iters; it++) {
        size_t n = 1 + rnd(64);
        char *g = malloc(n);
        for (size_t i = 0; i < n; i++) g[i] = rnd(3) ? tok[rnd(sizeof tok - 1)] : (char)next();
        if (rnd(2)) g[0] = '{';
        unsigned char data[16];
        for (int i = 0; i < 16; i++) data[i] = (unsigned char)next();
        bytes f = make_file(g, n, data, rnd(17));
        check_input(f.p, f.n, 0, "garbage");
        free(f.p);
        free(g);
        /* raw random bytes, any length field */
        size_t m = rnd(48);
        unsigned char *r = malloc(m ? m : 1);
        for (size_t i = 0; i < m; i++) r[i] = (unsigned char)next();
        check_input(r, m, 0, "random bytes");
        free(r);
    }
}

/* headers built from parts, mostly valid, with one or more defects */
static void fuzz_structured(int iters) {
    static const char *dtn[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL", "I8", "f32", "", "F32 "};
    static const int dsz[] = {8, 4, 2, 2, 8, 4, 1, 1, 1, 4, 4, 4};
    static const char *huge[] = {"4294967296", "9223372036854775807", "281474976710656", "281474976710655",
                                 "-1", "-9223372036854775808", "9223372036854775808", "65536", "0", "1"};
    for (int it = 0; it < iters; it++) {
        int nt = (int)rnd(5);
        bytes h = {0}, data = {0};
        bstr(&h, "{");
        int first = 1;
        if (rnd(3) == 0) {
            bstr(&h, rnd(8) ? "\"__metadata__\":{\"k\":\"v\"" : "\"__metadata__\":{\"k\":1");
            if (rnd(8) == 0) bstr(&h, ",\"k\":\"w\"");
            bstr(&h, "}");
            first = 0;
        }
        uint64_t at = 0;
        for (int i = 0; i < nt; i++) {
            int di = rnd(6) ? (int)rnd(8) : (int)rnd(12);
            int ndim = (int)rnd(rnd(10) ? 4 : 10);
            char buf[512];
            size_t bl = 0;
            uint64_t numel = 1;
            int defect_shape = rnd(8) == 0;
            bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[",
                                   first ? "" : ",", rnd(6) ? i : 0, dtn[di]);
            first = 0;
            for (int d = 0; d < ndim; d++) {
                if (defect_shape && d == ndim - 1) {
                    bl += (size_t)snprintf(buf + bl, sizeof buf - bl, d ? ",%s" : "%s", huge[rnd(10)]);
                    numel *= 3;
                } else {
                    uint64_t s = rnd(4);
                    bl += (size_t)snprintf(buf + bl, sizeof buf - bl, d ? ",%llu" : "%llu", (unsigned long long)s);
                    numel *= s;
                }
            }
            uint64_t nb = numel * (uint64_t)dsz[di];
            if (nb > 4096) nb = 4096;
            long long b = (long long)at, e = (long long)(at + nb);
            switch (rnd(12)) {
            case 0: b -= 1 + (long long)rnd(4); break;          /* overlap */
            case 1: b += 1; e += 1; break;                       /* gap */
            case 2: e += 1; break;                               /* size mismatch */
            case 3: { long long t = b; b = e; e = t; break; }    /* reversed */
            case 4: e = (long long)(next() >> 1); break;         /* out of range */
            case 5: b = -b - 1; break;                           /* negative */
            default: break;
            }
            const char *extra = rnd(10) == 0 ? ",\"extra\":[1,[2,{}]]" : "";
            if (rnd(15) == 0)
                bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "],\"data_offsets\":[%lld]%s}", b, extra);
            else if (rnd(15) == 0)
                bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "]%s}", extra); /* missing offsets */
            else
                bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "],\"data_offsets\":[%lld,%lld]%s}", b, e, extra);
            bput(&h, buf, bl);
            if (e > (long long)at && e - (long long)at < 8192) {
                for (long long q = (long long)at; q < e; q++) {
                    unsigned char c = (unsigned char)(di == 7 && rnd(20) ? rnd(2) : next());
                    bput(&data, &c, 1);
                }
                at = (uint64_t)e;
            }
        }
        bstr(&h, "}");
        int pad = (int)rnd(9);
        for (int k = 0; k < pad; k++) bstr(&h, rnd(6) ? " " : "\n");
        size_t dl = data.n;
        if (rnd(6) == 0) { unsigned char z = 0; bput(&data, &z, 1); dl++; } /* trailing byte */
        else if (rnd(6) == 0 && dl) dl--;                                    /* short buffer */
        bytes f = make_file((char *)h.p, h.n, data.p, dl);
        check_input(f.p, f.n, 0, "structured");
        free(f.p);
        free(h.p);
        free(data.p);
    }
}

/* nesting and string edge cases, each with a known verdict */
static void fixed_cases(void) {
    char deep[200];
    size_t k = 0;
    deep[k++] = '{';
    memcpy(deep + k, "\"x\":", 4);
    k += 4;
    for (int i = 0; i < 40; i++) deep[k++] = '[';
    for (int i = 0; i < 40; i++) deep[k++] = ']';
    deep[k++] = '}';
    /* nesting limit: root (level 1), the entry (2), then arrays in an ignored field */
    char deep30[200], deep31[200];
    for (int v = 0; v < 2; v++) {
        char *o = v ? deep31 : deep30;
        size_t q = (size_t)sprintf(o, "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"x\":");
        for (int i = 0; i < 30 + v; i++) o[q++] = '[';
        for (int i = 0; i < 30 + v; i++) o[q++] = ']';
        o[q++] = '}';
        o[q++] = '}';
        o[q] = 0;
    }
    struct { const char *h; size_t dl; int valid; } cases[] = {
        {deep30, 1, 1},
        {deep31, 1, 0},
        {"{}", 0, 1},
        {"{}  ", 0, 1},
        {" {}", 0, 1},
        {"{}", 1, 0},                                  /* a byte nobody owns */
        {"[]", 0, 0},
        {"\"x\"", 0, 0},
        {"{\"__metadata__\":{}}", 0, 1},
        {"{\"__metadata__\":[]}", 0, 0},
        {"{\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{}}", 0, 0},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, 1},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}", 8, 0},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 1},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 1},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0,281474976710657],\"data_offsets\":[0,0]}}", 0, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0,281474976710656],\"data_offsets\":[0,0]}}", 0, 1},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2,140737488355329],\"data_offsets\":[0,0]}}", 0, 0},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, 0},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0},
        {"{\"\\u00e9\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 1},
        {"{\"\\ud83d\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 0},
        {"{\"\\u0000\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 1},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", 1, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],}}", 1, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} x", 1, 0},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":[[[]]]}}", 1, 1},
        {deep, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char data[16] = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
        const char *h = cases[i].h;
        size_t hl = h == deep ? k : strlen(h);
        bytes f = make_file(h, hl, data, cases[i].dl);
        char what[64];
        snprintf(what, sizeof what, "fixed case %zu", i);
        int got = check_input(f.p, f.n, !cases[i].valid, what);
        if (got != cases[i].valid) FAIL("%s: expected %s", what, cases[i].valid ? "valid" : "invalid");
        free(f.p);
    }
}

/* the file path (pread) agrees with the memory path; header-only reads */
static void file_cases(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/needle_st_fuzz_%ld.safetensors", (long)getpid());
    for (int it = 0; it < 200; it++) {
        const bytes *b = &base[rnd(NBASE)];
        unsigned char *p = malloc(b->n);
        memcpy(p, b->p, b->n);
        size_t n = b->n;
        if (it % 2) {
            size_t at = rnd(b->n);
            p[at] ^= (unsigned char)(1u << rnd(8));
        }
        if (it % 5 == 0) n = rnd(b->n + 1);
        REQ(nd_write_file_atomic("write", path, p, n));
        nd_st_header *h1, *h2, *h3;
        nd_tensor **t1, **t2;
        nd_status s1 = nd_st_load_file("load", path, &h1, &t1);
        nd_status s2 = nd_st_load_memory("load", path, p, n, &h2, &t2);
        nd_status s3 = nd_st_read_header_file("load", path, &h3);
        trials++;
        if ((s1 == ND_OK) != (s2 == ND_OK)) FAIL("file and memory readers disagree");
        if (s1 == ND_OK) {
            if (h1->ntensors != h2->ntensors) FAIL("file/memory tensor counts differ");
            for (size_t i = 0; i < h1->ntensors && i < h2->ntensors; i++) {
                size_t nb = (size_t)nd_numel(t1[i]) * nd_dtype_size(nd_get_dtype(t1[i]));
                if (nb && memcmp(nd_data(t1[i]), nd_data(t2[i]), nb) != 0) FAIL("file/memory data differ");
            }
            nd_st_free_tensors(t1, h1->ntensors);
            nd_st_header_free(h1);
        }
        if (s2 == ND_OK) {
            nd_st_free_tensors(t2, h2->ntensors);
            nd_st_header_free(h2);
        }
        if (s3 == ND_OK) nd_st_header_free(h3);
        free(p);
    }
    unlink(path);
    nd_st_header *h;
    nd_tensor **t;
    if (nd_st_load_file("load", path, &h, &t) == ND_OK || !strstr(nd_last_error(), "No such file"))
        FAIL("missing file: %s", nd_last_error());
    if (nd_st_load_file("load", "/tmp", &h, &t) == ND_OK || !strstr(nd_last_error(), "Is a directory"))
        FAIL("directory: %s", nd_last_error());
}

/* writer rejects what the reader would */
static void writer_cases(void) {
    nd_tensor *t;
    REQ(nd_zeros((int64_t[]){2}, 1, ND_FLOAT32, &t));
    char *out;
    size_t len;
    nd_st_entry dup[2] = {{"a", 1, t}, {"a", 1, t}};
    if (nd_st_save_memory("save", dup, 2, NULL, 0, &out, &len) == ND_OK || !strstr(nd_last_error(), "duplicate"))
        FAIL("duplicate names accepted by the writer");
    nd_st_entry meta_name[1] = {{"__metadata__", 12, t}};
    if (nd_st_save_memory("save", meta_name, 1, NULL, 0, &out, &len) == ND_OK)
        FAIL("__metadata__ accepted as a tensor name");
    nd_st_entry bad_utf8[1] = {{"\xff", 1, t}};
    if (nd_st_save_memory("save", bad_utf8, 1, NULL, 0, &out, &len) == ND_OK || !strstr(nd_last_error(), "UTF-8"))
        FAIL("invalid UTF-8 name accepted by the writer");
    /* a transposed (non-contiguous) tensor is written row-major */
    nd_tensor *a, *at;
    double v[6] = {1, 2, 3, 4, 5, 6};
    REQ(nd_from_buffer(v, (int64_t[]){2, 3}, 2, ND_FLOAT64, &a));
    REQ(nd_transpose(a, 0, 1, &at));
    nd_st_entry e[1] = {{"at", 2, at}};
    REQ(nd_st_save_memory("save", e, 1, NULL, 0, &out, &len));
    nd_st_header *h;
    nd_tensor **ts;
    REQ(nd_st_load_memory("load", "mem", out, len, &h, &ts));
    double w[6], want[6] = {1, 4, 2, 5, 3, 6};
    REQ(nd_copy_to_buffer(ts[0], w, sizeof w));
    if (memcmp(w, want, sizeof w) != 0 || nd_shape(ts[0])[0] != 3) FAIL("transposed tensor not written row-major");
    nd_st_free_tensors(ts, h->ntensors);
    nd_st_header_free(h);
    free(out);
    nd_release(at);
    nd_release(a);
    nd_release(t);
}

int main(void) {
    int64_t live0 = nd_live_bytes();
    make_bases();
    fixed_cases();
    fuzz_bitflips(10000);
    fuzz_bytes(5000);
    fuzz_truncate(2000);
    fuzz_header_length(2000);
    fuzz_json_edits(10000);
    fuzz_garbage(3000);
    fuzz_structured(15000);
    file_cases();
    writer_cases();
    for (int b = 0; b < NBASE; b++) free(base[b].p);
    nd_empty_cache();
    if (nd_live_bytes() != live0) FAIL("tensor memory leaked: %lld bytes live", (long long)(nd_live_bytes() - live0));
    printf("%d inputs: %d accepted, %d rejected; %d failures\n", trials, accepted, rejected, failures);
    if (accepted < 100 || rejected < 1000) {
        printf("FAIL: the mutators are not reaching both verdicts\n");
        return 1;
    }
    return failures ? 1 : 0;
}
