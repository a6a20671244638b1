/* json.c - the JSON reader and writer; see json.h. The reader is one loop
 * over an explicit stack of open containers (no recursion a hostile file
 * could deepen), building a flat array of nodes; decoded strings go to one
 * arena of n + 1 bytes, which is enough because decoding never lengthens a
 * string (an escape is at least as long as the bytes it stands for, and
 * every string loses its two quotes, room for its NUL). */
#define _POSIX_C_SOURCE 200809L
#include "io/json.h"
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "tensor.h"

const char *nd_json_show(const char *s, size_t len, char *buf) {
    size_t o = 0, i;
    bool ascii_only = nd_utf8_check((const unsigned char *)s, len) != len;
    for (i = 0; i < len && o < ND_JSON_SHOW_MAX; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || (ascii_only && c >= 0x80)) o += (size_t)snprintf(buf + o, 8, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (i < len) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = 0;
    return buf;
}

/* ------------------------------------------------------------- reading */

typedef struct {
    size_t node;            /* the container */
    size_t last;            /* its last child so far (0: none yet) */
    const char *key;        /* an object's key waiting for its value */
    size_t key_len, key_pos;
} frame;

typedef struct { const char *k; size_t len, pos; } keyref;

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    nd_json_opts o;
    nd_json_doc *doc;
    size_t cap;
    char *arena;
    size_t used;
    keyref *keys; /* scratch for the duplicate check */
    size_t keys_cap;
    nd_json_error *err;
} parser;

static nd_status perr(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static nd_status perr(parser *p, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
    va_end(ap);
    p->err->offset = at;
    return nd_fail(ND_ERR_IO, "invalid JSON at byte %zu: %s", at, p->err->msg);
}

static nd_status oom(parser *p) {
    snprintf(p->err->msg, sizeof p->err->msg, "out of memory parsing %s", p->o.name);
    p->err->offset = p->pos;
    return nd_fail(ND_ERR_MEMORY, "%s", p->err->msg);
}

static const char *char_str(int c, char *buf) {
    if (c > 0x20 && c < 0x7f) snprintf(buf, 8, "'%c'", c);
    else snprintf(buf, 8, "0x%02x", c);
    return buf;
}

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static nd_status new_node(parser *p, nd_json_type type, size_t *out) {
    nd_json_doc *d = p->doc;
    if (d->nnodes == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 64;
        nd_json_node *nn = realloc(d->nodes, ncap * sizeof *nn);
        if (!nn) return oom(p);
        d->nodes = nn;
        p->cap = ncap;
    }
    nd_json_node *j = &d->nodes[d->nnodes];
    memset(j, 0, sizeof *j);
    j->type = type;
    j->pos = p->pos;
    *out = d->nnodes++;
    return ND_OK;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static nd_status read_hex4(parser *p, unsigned *out) {
    if (p->n - p->pos < 4) return perr(p, p->pos, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->pos + (size_t)k]);
        if (h < 0) return perr(p, p->pos + (size_t)k, "bad hex digit in \\u escape");
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return ND_OK;
}

/* p->pos is at the opening quote; decodes into the arena. */
static nd_status parse_string(parser *p, const char **out, size_t *len) {
    size_t start = p->pos++;
    char *o = p->arena + p->used;
    size_t k = 0;
    for (;;) {
        if (p->pos >= p->n) return perr(p, start, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return perr(p, p->pos, "unescaped control character 0x%02x in a string", c);
        if (c >= 0x80) { /* a whole UTF-8 sequence, checked */
            size_t want = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
            if (!want || p->n - p->pos < want || nd_utf8_check(p->s + p->pos, want) != want)
                return perr(p, p->pos, "invalid UTF-8 in a string");
            memcpy(o + k, p->s + p->pos, want);
            k += want;
            p->pos += want;
            continue;
        }
        if (c != '\\') { o[k++] = (char)c; p->pos++; continue; }
        size_t esc = p->pos++;
        if (p->pos >= p->n) return perr(p, esc, "unterminated escape");
        c = p->s[p->pos++];
        switch (c) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            unsigned cp;
            ND_TRY(read_hex4(p, &cp));
            if (cp >= 0xdc00 && cp <= 0xdfff) return perr(p, esc, "lone low surrogate \\u%04x", cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned lo;
                if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return perr(p, esc, "high surrogate \\u%04x without a low surrogate", cp);
                p->pos += 2;
                ND_TRY(read_hex4(p, &lo));
                if (lo < 0xdc00 || lo > 0xdfff)
                    return perr(p, esc, "high surrogate \\u%04x followed by \\u%04x", cp, lo);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp < 0x80) o[k++] = (char)cp;
            else if (cp < 0x800) {
                o[k++] = (char)(0xc0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xe0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[k++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o[k++] = (char)(0xf0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[k++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: {
            char cb[8];
            return perr(p, esc, "invalid escape \\%s", char_str(c, cb));
        }
        }
    }
    o[k] = 0;
    *out = o;
    *len = k;
    p->used += k + 1; /* decoded + NUL never exceeds the raw bytes incl. quotes */
    return ND_OK;
}

static bool is_digit(const parser *p, size_t at) { return at < p->n && p->s[at] >= '0' && p->s[at] <= '9'; }

/* A float token through strtod, which reads the C locale's decimal point:
 * a host that called setlocale gets the same numbers. false: no memory. */
static bool to_double(const char *s, size_t len, double *out) {
    char buf[64], *tmp = len < sizeof buf ? buf : malloc(len + 1);
    if (!tmp) return false;
    memcpy(tmp, s, len);
    tmp[len] = 0;
    char point = localeconv()->decimal_point[0];
    if (point && point != '.') {
        char *d = memchr(tmp, '.', len);
        if (d) *d = point;
    }
    *out = strtod(tmp, NULL); /* out of range: +-HUGE_VAL or a denormal/zero, as Lua's tonumber */
    if (tmp != buf) free(tmp);
    return true;
}

static nd_status parse_number(parser *p, size_t node) {
    size_t start = p->pos;
    bool neg = false;
    if (p->s[p->pos] == '-') { neg = true; p->pos++; }
    if (!is_digit(p, p->pos)) return perr(p, start, "'-' without digits");
    if (p->s[p->pos] == '0' && is_digit(p, p->pos + 1)) return perr(p, start, "number with a leading zero");
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    bool over = false;
    while (is_digit(p, p->pos)) {
        unsigned d = p->s[p->pos++] - '0';
        if (v > (limit - d) / 10) over = true;
        else v = v * 10 + d;
    }
    nd_json_node *j = &p->doc->nodes[node];
    if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        if (p->o.integers_only) return perr(p, start, "a number with a fraction or exponent (%s)", p->o.integers_only);
        if (p->s[p->pos] == '.') {
            p->pos++;
            if (!is_digit(p, p->pos)) return perr(p, start, "a fraction without digits");
            while (is_digit(p, p->pos)) p->pos++;
        }
        if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
            p->pos++;
            if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
            if (!is_digit(p, p->pos)) return perr(p, start, "an exponent without digits");
            while (is_digit(p, p->pos)) p->pos++;
        }
        j->type = ND_JSON_FLOAT;
        if (!to_double((const char *)p->s + start, p->pos - start, &j->f)) return oom(p);
        return ND_OK;
    }
    if (over) return perr(p, start, "integer out of the 64-bit range");
    j->type = ND_JSON_INT;
    j->i = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return ND_OK;
}

static int keyref_cmp(const void *a, const void *b) {
    const keyref *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->k, y->k, m);
    if (c) return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static nd_status check_duplicates(parser *p, size_t obj) {
    const nd_json_doc *d = p->doc;
    size_t n = d->nodes[obj].count;
    if (n < 2) return ND_OK;
    if (n > p->keys_cap) {
        keyref *nk = realloc(p->keys, n * sizeof *nk);
        if (!nk) return oom(p);
        p->keys = nk;
        p->keys_cap = n;
    }
    size_t i = 0;
    for (size_t c = d->nodes[obj].first; c; c = d->nodes[c].next, i++)
        p->keys[i] = (keyref){d->nodes[c].key, d->nodes[c].key_len, d->nodes[c].pos};
    qsort(p->keys, n, sizeof *p->keys, keyref_cmp);
    for (i = 1; i < n; i++)
        if (keyref_cmp(&p->keys[i - 1], &p->keys[i]) == 0) {
            char sb[ND_JSON_SHOW_BUF];
            size_t at = p->keys[i].pos > p->keys[i - 1].pos ? p->keys[i].pos : p->keys[i - 1].pos;
            return perr(p, at, "duplicate key '%s'", nd_json_show(p->keys[i].k, p->keys[i].len, sb));
        }
    return ND_OK;
}

static const char *expected_values(const nd_json_opts *o) {
    if (o->integers_only)
        return o->no_booleans ? "an object, array, string or integer" : "an object, array, string, integer, true or false";
    return o->no_booleans ? "an object, array, string or number" : "an object, array, string, number, true or false";
}

static const char *type_word(nd_json_type t) {
    switch (t) {
    case ND_JSON_OBJECT: return "object";
    case ND_JSON_ARRAY: return "array";
    case ND_JSON_STRING: return "string";
    case ND_JSON_BOOL: return "boolean";
    default: return "number";
    }
}

static nd_status parse(parser *p) {
    nd_json_doc *d = p->doc;
    const char *name = p->o.name;
    /* every open container took a byte: no more than n frames are ever used */
    size_t frames = (size_t)p->o.max_depth < p->n ? (size_t)p->o.max_depth : p->n;
    frame *stack = malloc((frames ? frames : 1) * sizeof *stack);
    if (!stack) return oom(p);
    int depth = 0;
    nd_status st = ND_OK;
    size_t me = 0;
    char cb[8];
#define FAIL(expr) do { st = (expr); goto done; } while (0)
value: /* a value starts at p->pos (after whitespace) */
    skip_ws(p);
    if (p->pos >= p->n) FAIL(perr(p, p->pos, "unexpected end of %s", name));
    {
        unsigned char c = p->s[p->pos];
        if (c == '{' || c == '[') {
            if (depth >= p->o.max_depth || (size_t)depth >= frames) /* the second cannot happen */
                FAIL(perr(p, p->pos, "nesting deeper than %d levels", p->o.max_depth));
            bool obj = c == '{';
            if ((st = new_node(p, obj ? ND_JSON_OBJECT : ND_JSON_ARRAY, &me)) != ND_OK) goto done;
            p->pos++;
            stack[depth++] = (frame){.node = me};
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == (obj ? '}' : ']')) {
                p->pos++;
                depth--;
                goto complete;
            }
            if (obj) goto key;
            goto value;
        }
        if (c == '"') {
            if ((st = new_node(p, ND_JSON_STRING, &me)) != ND_OK) goto done;
            const char *s;
            size_t len;
            if ((st = parse_string(p, &s, &len)) != ND_OK) goto done;
            d->nodes[me].str = s;
            d->nodes[me].str_len = len;
            goto complete;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            if ((st = new_node(p, ND_JSON_INT, &me)) != ND_OK) goto done;
            if ((st = parse_number(p, me)) != ND_OK) goto done;
            goto complete;
        }
        if (!p->o.no_booleans && (c == 't' || c == 'f')) {
            const char *lit = c == 't' ? "true" : "false";
            size_t ll = strlen(lit);
            if (p->n - p->pos >= ll && memcmp(p->s + p->pos, lit, ll) == 0) {
                if ((st = new_node(p, ND_JSON_BOOL, &me)) != ND_OK) goto done;
                d->nodes[me].b = c == 't';
                p->pos += ll;
                goto complete;
            }
        }
        FAIL(perr(p, p->pos, "unexpected %s (expected %s)", char_str(c, cb), expected_values(&p->o)));
    }
key: /* in an object, before a key */
    skip_ws(p);
    if (p->pos >= p->n) FAIL(perr(p, p->pos, "unexpected end of %s in an object", name));
    if (p->s[p->pos] != '"') FAIL(perr(p, p->pos, "expected a string key, found %s", char_str(p->s[p->pos], cb)));
    {
        frame *f = &stack[depth - 1];
        f->key_pos = p->pos;
        if ((st = parse_string(p, &f->key, &f->key_len)) != ND_OK) goto done;
    }
    skip_ws(p);
    if (p->pos >= p->n || p->s[p->pos] != ':') FAIL(perr(p, p->pos, "expected ':' after an object key"));
    p->pos++;
    goto value;
complete: /* value `me` is whole: it is the root or goes into the innermost container */
    if (depth == 0) {
        skip_ws(p);
        if (p->pos != p->n)
            FAIL(perr(p, p->pos, "trailing characters after %s %s", name, type_word(d->nodes[me].type)));
        goto done;
    }
    {
        frame *f = &stack[depth - 1];
        nd_json_node *parent = &d->nodes[f->node];
        bool obj = parent->type == ND_JSON_OBJECT;
        if (obj) {
            d->nodes[me].key = f->key;
            d->nodes[me].key_len = f->key_len;
            d->nodes[me].pos = f->key_pos;
        }
        if (f->last) d->nodes[f->last].next = me;
        else parent->first = me;
        f->last = me;
        parent->count++;
        skip_ws(p);
        if (p->pos >= p->n) FAIL(perr(p, p->pos, "unexpected end of %s in an %s", name, obj ? "object" : "array"));
        unsigned char c = p->s[p->pos++];
        if (c == (obj ? '}' : ']')) {
            if (obj && (st = check_duplicates(p, f->node)) != ND_OK) goto done;
            me = f->node;
            depth--;
            goto complete;
        }
        if (c != ',') FAIL(perr(p, p->pos - 1, "expected ',' or '%c', found %s", obj ? '}' : ']', char_str(c, cb)));
        if (obj) goto key;
        goto value;
    }
done:
#undef FAIL
    free(stack);
    return st;
}

nd_status nd_json_parse(const char *s, size_t n, const nd_json_opts *opts, nd_json_doc **out, nd_json_error *err) {
    *out = NULL;
    nd_json_error scratch;
    parser p = {.s = (const unsigned char *)s, .n = n, .err = err ? err : &scratch};
    if (opts) p.o = *opts;
    if (p.o.max_depth <= 0) p.o.max_depth = ND_JSON_MAX_DEPTH;
    if (!p.o.name) p.o.name = "the JSON";
    p.err->offset = 0;
    p.err->msg[0] = 0;
    p.doc = calloc(1, sizeof *p.doc);
    p.arena = malloc(n + 1);
    if (!p.doc || !p.arena) {
        free(p.doc);
        free(p.arena);
        p.doc = NULL;
        snprintf(p.err->msg, sizeof p.err->msg, "out of memory parsing %s of %zu bytes", p.o.name, n);
        return nd_fail(ND_ERR_MEMORY, "%s", p.err->msg);
    }
    p.doc->_strings = p.arena;
    nd_status st = parse(&p);
    free(p.keys);
    if (st != ND_OK) {
        nd_json_free(p.doc);
        return st;
    }
    *out = p.doc;
    return ND_OK;
}

void nd_json_free(nd_json_doc *doc) {
    if (!doc) return;
    free(doc->nodes);
    free(doc->_strings);
    free(doc);
}

char *nd_json_take_strings(nd_json_doc *doc) {
    char *s = doc->_strings;
    doc->_strings = NULL;
    return s;
}

/* ------------------------------------------------------------- writing */

void nd_json_put(nd_json_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->cap - b->n < n + 1) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap - b->n < n + 1) {
            if (ncap > SIZE_MAX / 2) { b->oom = true; return; }
            ncap *= 2;
        }
        char *np = realloc(b->p, ncap);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = ncap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void nd_json_puts(nd_json_buf *b, const char *s) { nd_json_put(b, s, strlen(s)); }

void nd_json_string(nd_json_buf *b, const char *s, size_t n) {
    nd_json_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        const char *esc;
        char ub[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default: snprintf(ub, sizeof ub, "\\u%04x", c); esc = ub;
        }
        nd_json_put(b, s + run, i - run);
        nd_json_puts(b, esc);
        run = i + 1;
    }
    nd_json_put(b, s + run, n - run);
    nd_json_put(b, "\"", 1);
}

void nd_json_int(nd_json_buf *b, int64_t v) {
    char t[24];
    int n = snprintf(t, sizeof t, "%lld", (long long)v);
    nd_json_put(b, t, (size_t)n);
}

void nd_json_uint(nd_json_buf *b, uint64_t v) {
    char t[24];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    nd_json_put(b, t, (size_t)n);
}

bool nd_json_float(nd_json_buf *b, double v) {
    if (!isfinite(v)) return false;
    char t[40];
    int n = snprintf(t, sizeof t, "%.17g", v);
    if (n <= 0 || (size_t)n >= sizeof t) return false; /* cannot happen: %.17g of a double is < 25 bytes */
    /* printf writes the locale's decimal point; JSON has '.' */
    char point = localeconv()->decimal_point[0];
    if (point && point != '.') {
        char *d = memchr(t, point, (size_t)n);
        if (d) *d = '.';
    }
    nd_json_put(b, t, (size_t)n);
    if (!memchr(t, '.', (size_t)n) && !memchr(t, 'e', (size_t)n)) nd_json_put(b, ".0", 2);
    return true;
}

void nd_json_buf_free(nd_json_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
