/* json.h - needle's one JSON codec: the safetensors header (safetensors.c)
 * and the checkpoint state (lua/needle/checkpoint.lua, through the
 * bindings in lt_io.c) are both read and written with it.
 *
 * The reader is strict RFC 8259 without null: objects, arrays, strings (all
 * escapes, \uXXXX with surrogate pairs checked, raw bytes valid UTF-8, no
 * control characters below 0x20), numbers, true and false. Input is treated
 * as hostile: it never recurses (an explicit stack of at most max_depth
 * frames), every index is bounds-checked, duplicate keys are refused in
 * every object, and it allocates at most a small multiple of the input's
 * size. Integers (no fraction, no exponent) are int64 and out-of-range ones
 * are errors rather than rounded; other numbers are doubles (strtod).
 *
 * An error is ND_ERR_IO (ND_ERR_MEMORY when out of memory) with the message
 * and the 0-based byte offset in *err; nd_last_error() reads
 * "invalid JSON at byte <offset>: <message>". Callers that want their own
 * wording ("invalid header JSON at byte 52: ...", or 1-based offsets for
 * Lua) format err themselves. */
#ifndef ND_JSON_H
#define ND_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "needle.h"

#define ND_JSON_MAX_DEPTH 512 /* the default nesting limit (containers inside containers) */

typedef enum { ND_JSON_OBJECT = 1, ND_JSON_ARRAY, ND_JSON_STRING, ND_JSON_INT, ND_JSON_FLOAT, ND_JSON_BOOL } nd_json_type;

/* One value of a parsed document. Children are indices into the document's
 * nodes (0 = none: 0 is the root, never anyone's child). */
typedef struct {
    nd_json_type type;
    size_t pos;             /* byte offset of the value; for an object member, of its key */
    const char *key;        /* as an object member: its key, decoded, NUL-terminated */
    size_t key_len;         /* (a key may hold NULs: \u0000) */
    const char *str;        /* ND_JSON_STRING: decoded, NUL-terminated */
    size_t str_len;
    int64_t i;              /* ND_JSON_INT */
    double f;               /* ND_JSON_FLOAT */
    bool b;                 /* ND_JSON_BOOL */
    size_t first, next;     /* first child; next sibling */
    size_t count;           /* number of children */
} nd_json_node;

typedef struct {
    nd_json_node *nodes; /* nodes[0] is the root */
    size_t nnodes;
    char *_strings;      /* owns key and str */
} nd_json_doc;

/* What a caller allows; zeroes mean plain JSON with the default limit. */
typedef struct {
    int max_depth;              /* containers nested at most this deep; 0: ND_JSON_MAX_DEPTH */
    const char *integers_only;  /* non-NULL: fractions and exponents are errors, this says why */
    bool no_booleans;           /* true and false are errors */
    const char *name;           /* the document in messages ("the header"); NULL: "the JSON" */
} nd_json_opts;

typedef struct {
    size_t offset; /* 0-based byte offset of the problem */
    char msg[400];
} nd_json_error;

/* Parses s[0, n) (all of it: whitespace may surround the one value). opts
 * and err may be NULL. On success *out is the document (nd_json_free). */
nd_status nd_json_parse(const char *s, size_t n, const nd_json_opts *opts, nd_json_doc **out, nd_json_error *err);
void nd_json_free(nd_json_doc *doc);

/* Hands the document's strings (every key and str) to the caller, who
 * frees them with free() after nd_json_free(doc): a reader that keeps
 * names and drops the tree (safetensors.c) copies nothing. */
char *nd_json_take_strings(nd_json_doc *doc);

/* ---- writing: a growing buffer; functions after a failed allocation do
 * nothing and leave oom set, so a writer checks once at the end. p is
 * NUL-terminated whenever it is not NULL. */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} nd_json_buf;

void nd_json_put(nd_json_buf *b, const void *s, size_t n); /* raw bytes */
void nd_json_puts(nd_json_buf *b, const char *s);          /* raw, NUL-terminated */
/* A string, quoted: '"', '\' and control characters below 0x20 escaped
 * (\n, \t, ... or \u00XX, as serde_json writes them); every other byte as
 * it is. The caller checks UTF-8 (nd_utf8_check) where it must. */
void nd_json_string(nd_json_buf *b, const char *s, size_t n);
void nd_json_int(nd_json_buf *b, int64_t v);
void nd_json_uint(nd_json_buf *b, uint64_t v);
/* A finite double with %.17g (which reads back as the same double) and
 * always with a '.' or an exponent, so that it reads back as a float, not an
 * integer: 3.0 -> "3.0", -0.0 -> "-0.0". Returns false (writing nothing) for
 * NaN and infinities, which JSON cannot hold. */
bool nd_json_float(nd_json_buf *b, double v);
void nd_json_buf_free(nd_json_buf *b);

/* s[0, len) for a message: at most ND_JSON_SHOW_MAX bytes then "...",
 * control bytes (and every byte above 0x7f when s is not UTF-8) as \xHH.
 * buf holds ND_JSON_SHOW_BUF bytes. */
#define ND_JSON_SHOW_MAX 120
#define ND_JSON_SHOW_BUF (ND_JSON_SHOW_MAX + 16)
const char *nd_json_show(const char *s, size_t len, char *buf);

#endif
