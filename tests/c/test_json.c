/* test_json.c - the JSON codec (src/io/json.c): valid documents and the
 * tree they give, every refusal with its exact message and byte offset,
 * the options safetensors uses (integers only, no true/false, 32 levels),
 * the depth limit at 100000 levels (no recursion to blow), numbers at the
 * edges of int64 and double, escapes and surrogate pairs, and round trips
 * through the writer. Also random bytes and mutations of a valid document,
 * which must never crash or read out of bounds (run it in the ASan build). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "io/json.h"

static nd_json_doc *parse_ok_at(int line, const char *s, const nd_json_opts *o) {
    nd_json_doc *d = NULL;
    nd_json_error e;
    checks++;
    if (nd_json_parse(s, strlen(s), o, &d, &e) != ND_OK) {
        FAIL_AT(line, "parse of %s failed: %s at byte %zu", s, e.msg, e.offset);
        return NULL;
    }
    return d;
}
#define PARSE_OK(s, o) parse_ok_at(__LINE__, s, o)

/* s (len bytes) is refused with message msg (exactly) at byte offset at */
static void bad_at(int line, const char *s, size_t len, const nd_json_opts *o, size_t at, const char *msg) {
    nd_json_doc *d = (nd_json_doc *)1;
    nd_json_error e;
    checks++;
    nd_status st = nd_json_parse(s, len, o, &d, &e);
    if (st != ND_ERR_IO || d != NULL) {
        FAIL_AT(line, "%s: expected an error, got %s", s, nd_status_name(st));
        if (st == ND_OK) nd_json_free(d);
        return;
    }
    if (e.offset != at || strcmp(e.msg, msg) != 0)
        FAIL_AT(line, "%s: got '%s' at %zu, expected '%s' at %zu", s, e.msg, e.offset, msg, at);
    char want[600];
    snprintf(want, sizeof want, "invalid JSON at byte %zu: %s", at, msg);
    if (strcmp(nd_last_error(), want) != 0) FAIL_AT(line, "nd_last_error() is '%s'", nd_last_error());
}
#define BAD(s, at, msg) bad_at(__LINE__, s, strlen(s), NULL, at, msg)
#define BAD_O(s, o, at, msg) bad_at(__LINE__, s, strlen(s), o, at, msg)

static const nd_json_opts st_opts = {.max_depth = 32, .integers_only = "safetensors headers hold integers",
                                     .no_booleans = true, .name = "the header"};

static void test_values(void) {
    nd_json_doc *d = PARSE_OK(" {\"b\": [1, -2, 3.5, true, false, \"x\"], \"a\": {}, \"c\": []}\n", NULL);
    if (!d) return;
    const nd_json_node *n = d->nodes;
    CHECK(n[0].type == ND_JSON_OBJECT && n[0].count == 3 && n[0].pos == 1);
    size_t b = n[0].first;
    CHECK(strcmp(n[b].key, "b") == 0 && n[b].type == ND_JSON_ARRAY && n[b].count == 6);
    CHECK(n[b].pos == 2); /* a member's pos is its key's */
    size_t e = n[b].first;
    CHECK(n[e].type == ND_JSON_INT && n[e].i == 1);
    e = n[e].next;
    CHECK(n[e].type == ND_JSON_INT && n[e].i == -2);
    e = n[e].next;
    CHECK(n[e].type == ND_JSON_FLOAT && n[e].f == 3.5);
    e = n[e].next;
    CHECK(n[e].type == ND_JSON_BOOL && n[e].b);
    e = n[e].next;
    CHECK(n[e].type == ND_JSON_BOOL && !n[e].b);
    e = n[e].next;
    CHECK(n[e].type == ND_JSON_STRING && n[e].str_len == 1 && strcmp(n[e].str, "x") == 0);
    CHECK(n[e].next == 0);
    size_t a = n[b].next, c = n[a].next;
    CHECK(strcmp(n[a].key, "a") == 0 && n[a].type == ND_JSON_OBJECT && n[a].count == 0 && n[a].first == 0);
    CHECK(strcmp(n[c].key, "c") == 0 && n[c].type == ND_JSON_ARRAY && n[c].count == 0 && n[c].next == 0);
    nd_json_free(d);
    /* scalars at the root */
    d = PARSE_OK("\"s\"", NULL);
    if (d) CHECK(d->nnodes == 1 && d->nodes[0].type == ND_JSON_STRING);
    nd_json_free(d);
    d = PARSE_OK("-0", NULL);
    if (d) CHECK(d->nodes[0].type == ND_JSON_INT && d->nodes[0].i == 0);
    nd_json_free(d);
    d = PARSE_OK("-0.0", NULL);
    if (d) CHECK(d->nodes[0].type == ND_JSON_FLOAT && d->nodes[0].f == 0 && signbit(d->nodes[0].f));
    nd_json_free(d);
}

static void test_numbers(void) {
    struct { const char *s; int64_t i; } ints[] = {
        {"0", 0}, {"-1", -1}, {"9223372036854775807", INT64_MAX}, {"-9223372036854775808", INT64_MIN},
        {"1234567890123", 1234567890123LL},
    };
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        nd_json_doc *d = PARSE_OK(ints[k].s, NULL);
        if (d) CHECKM(d->nodes[0].type == ND_JSON_INT && d->nodes[0].i == ints[k].i, "%s", ints[k].s);
        nd_json_free(d);
    }
    struct { const char *s; double f; } floats[] = {
        {"0.1", 0.1}, {"1e3", 1000.0}, {"1E+3", 1000.0}, {"-2.5e-7", -2.5e-7}, {"1.7976931348623157e308", 1.7976931348623157e308},
        {"4.9406564584124654e-324", 4.9406564584124654e-324}, {"1e400", INFINITY}, {"-1e400", -INFINITY},
        {"0.30000000000000004", 0.30000000000000004},
    };
    for (size_t k = 0; k < sizeof floats / sizeof *floats; k++) {
        nd_json_doc *d = PARSE_OK(floats[k].s, NULL);
        if (d) CHECKM(d->nodes[0].type == ND_JSON_FLOAT && d->nodes[0].f == floats[k].f, "%s", floats[k].s);
        nd_json_free(d);
    }
    BAD("9223372036854775808", 0, "integer out of the 64-bit range");
    BAD("[1, -9223372036854775809]", 4, "integer out of the 64-bit range");
    BAD("01", 0, "number with a leading zero");
    BAD("[-01]", 1, "number with a leading zero");
    BAD("-", 0, "'-' without digits");
    BAD("-a", 0, "'-' without digits");
    BAD("1.", 0, "a fraction without digits");
    BAD("1.e5", 0, "a fraction without digits");
    BAD("1e", 0, "an exponent without digits");
    BAD("1e+", 0, "an exponent without digits");
    BAD("+1", 0, "unexpected '+' (expected an object, array, string, number, true or false)");
    BAD(".5", 0, "unexpected '.' (expected an object, array, string, number, true or false)");
    BAD_O("[1.5]", &st_opts, 1, "a number with a fraction or exponent (safetensors headers hold integers)");
    BAD_O("[1e5]", &st_opts, 1, "a number with a fraction or exponent (safetensors headers hold integers)");
}

static void test_strings(void) {
    nd_json_doc *d = PARSE_OK("[\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\", \"\\u00e9\\u20ac\\ud83d\\ude00\", \"\\u0000x\", "
                              "\"\xc3\xa9\xf0\x9f\x99\x82\x7f\"]", NULL);
    if (d) {
        size_t a = d->nodes[0].first, b = d->nodes[a].next, c = d->nodes[b].next, e = d->nodes[c].next;
        CHECK(d->nodes[a].str_len == 12 && memcmp(d->nodes[a].str, "a\"b\\c/d\b\f\n\r\t", 12) == 0);
        CHECK(strcmp(d->nodes[b].str, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") == 0);
        CHECK(d->nodes[c].str_len == 2 && memcmp(d->nodes[c].str, "\0x", 2) == 0);
        CHECK(strcmp(d->nodes[e].str, "\xc3\xa9\xf0\x9f\x99\x82\x7f") == 0); /* DEL is not a control character in JSON */
    }
    nd_json_free(d);
    BAD("\"abc", 0, "unterminated string");
    BAD("[\"a\\", 3, "unterminated escape");
    BAD("\"a\nb\"", 2, "unescaped control character 0x0a in a string");
    BAD("\"\\x\"", 1, "invalid escape \\'x'");
    BAD("\"\\u12zz\"", 5, "bad hex digit in \\u escape");
    BAD("\"\\u12", 3, "truncated \\u escape");
    BAD("\"\\udc00\"", 1, "lone low surrogate \\udc00");
    BAD("\"\\ud800\"", 1, "high surrogate \\ud800 without a low surrogate");
    BAD("\"\\ud800\\u0041\"", 1, "high surrogate \\ud800 followed by \\u0041");
    BAD("\"a\xff\"", 2, "invalid UTF-8 in a string");
    BAD("\"a\xc3\"", 2, "invalid UTF-8 in a string");        /* cut short by the quote */
    BAD("\"\xc0\xaf\"", 1, "invalid UTF-8 in a string");      /* overlong */
    BAD("\"\xed\xa0\x80\"", 1, "invalid UTF-8 in a string");  /* an encoded surrogate */
    BAD("\"\xf4\x90\x80\x80\"", 1, "invalid UTF-8 in a string"); /* above U+10FFFF */
    bad_at(__LINE__, "\"\xe2\x82", 3, NULL, 1, "invalid UTF-8 in a string"); /* cut by the end */
}

static void test_structure(void) {
    BAD("", 0, "unexpected end of the JSON");
    BAD("   ", 3, "unexpected end of the JSON");
    BAD("[", 1, "unexpected end of the JSON");
    BAD("{", 1, "unexpected end of the JSON in an object");
    BAD("{\"a\"", 4, "expected ':' after an object key");
    BAD("{\"a\":", 5, "unexpected end of the JSON");
    BAD("{\"a\":1", 6, "unexpected end of the JSON in an object");
    BAD("[1", 2, "unexpected end of the JSON in an array");
    BAD("[1,]", 3, "unexpected ']' (expected an object, array, string, number, true or false)");
    BAD("{\"a\":1,}", 7, "expected a string key, found '}'");
    BAD("{1:2}", 1, "expected a string key, found '1'");
    BAD("[1 2]", 3, "expected ',' or ']', found '2'");
    BAD("{\"a\":1 \"b\":2}", 7, "expected ',' or '}', found '\"'");
    BAD("[1] 2", 4, "trailing characters after the JSON array");
    BAD("{} x", 3, "trailing characters after the JSON object");
    BAD("null", 0, "unexpected 'n' (expected an object, array, string, number, true or false)");
    BAD("tru", 0, "unexpected 't' (expected an object, array, string, number, true or false)");
    BAD("[\x01]", 1, "unexpected 0x01 (expected an object, array, string, number, true or false)");
    BAD("{\"a\":1,\"b\":2,\"a\":3}", 13, "duplicate key 'a'");
    BAD("{\"x\":{\"k\\u0000\":1,\"k\\u0000\":2}}", 18, "duplicate key 'k\\x00'");
    /* the duplicate in a nested object is found when that object closes */
    BAD("[{\"a\":1,\"a\":1}, 01]", 8, "duplicate key 'a'");
    /* keys that differ only after a NUL are different */
    nd_json_doc *d = PARSE_OK("{\"a\\u0000b\":1,\"a\\u0000c\":2,\"a\":3}", NULL);
    if (d) CHECK(d->nodes[0].count == 3);
    nd_json_free(d);
    /* the safetensors options: messages name the header, integers only, no literals */
    BAD_O("{\"a\":1", &st_opts, 6, "unexpected end of the header in an object");
    BAD_O("{} extra", &st_opts, 3, "trailing characters after the header object");
    BAD_O("[true]", &st_opts, 1, "unexpected 't' (expected an object, array, string or integer)");
    /* and a number right at the end of the input (no NUL after it to stop a reader) */
    d = NULL;
    checks++;
    if (nd_json_parse("12345", 3, NULL, &d, NULL) != ND_OK || d->nodes[0].i != 123) FAIL("a number cut by the length");
    nd_json_free(d);
    d = NULL;
    checks++;
    if (nd_json_parse("1.25", 3, NULL, &d, NULL) != ND_OK || d->nodes[0].f != 1.2) FAIL("a float cut by the length");
    nd_json_free(d);
}

static void test_depth(void) {
    /* the limit counts containers: 32 nested arrays pass with max_depth 32, 33 do not */
    char s[80];
    for (int n = 31; n <= 33; n++) {
        memset(s, '[', (size_t)n);
        memset(s + n, ']', (size_t)n);
        s[2 * n] = 0;
        nd_json_doc *d = NULL;
        nd_json_error e;
        nd_status st = nd_json_parse(s, strlen(s), &st_opts, &d, &e);
        checks++;
        if (n <= 32 ? st != ND_OK : st != ND_ERR_IO || e.offset != 32 || strcmp(e.msg, "nesting deeper than 32 levels"))
            FAIL("%d levels: %s (%s at %zu)", n, nd_status_name(st), e.msg, e.offset);
        nd_json_free(d);
    }
    /* 100000 levels with the default limit: refused at level 513, no recursion */
    size_t n = 100000;
    char *deep = malloc(6 * n + 1);
    if (!deep) return;
    for (size_t i = 0; i < n; i++) memcpy(deep + 5 * i, "{\"k\":", 5);
    deep[5 * n] = '1';
    memset(deep + 5 * n + 1, '}', n);
    bad_at(__LINE__, deep, 6 * n + 1, NULL, 5 * ND_JSON_MAX_DEPTH, "nesting deeper than 512 levels");
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    bad_at(__LINE__, deep, 2 * n, NULL, ND_JSON_MAX_DEPTH, "nesting deeper than 512 levels");
    /* exactly the limit */
    memcpy(deep + ND_JSON_MAX_DEPTH, deep + n, ND_JSON_MAX_DEPTH);
    nd_json_doc *d = NULL;
    checks++;
    if (nd_json_parse(deep, 2 * ND_JSON_MAX_DEPTH, NULL, &d, NULL) != ND_OK) FAIL("512 levels: %s", nd_last_error());
    nd_json_free(d);
    free(deep);
}

/* the writer's output read back by the reader */
static void test_writer(void) {
    nd_json_buf b = {0};
    const char raw[] = "q\"b\\s/\x01\x1f\n\r\t\b\f\x7f\xc3\xa9\0z";
    nd_json_string(&b, raw, sizeof raw - 1);
    CHECK(strcmp(b.p, "\"q\\\"b\\\\s/\\u0001\\u001f\\n\\r\\t\\b\\f\x7f\xc3\xa9\\u0000z\"") == 0);
    nd_json_doc *d = NULL;
    checks++;
    if (nd_json_parse(b.p, b.n, NULL, &d, NULL) != ND_OK) FAIL("the written string: %s", nd_last_error());
    else CHECK(d->nodes[0].str_len == sizeof raw - 1 && memcmp(d->nodes[0].str, raw, sizeof raw - 1) == 0);
    nd_json_free(d);
    nd_json_buf_free(&b);
    /* integers as integers, floats always with '.' or an exponent, %.17g */
    struct { double v; const char *s; } fl[] = {
        {3.0, "3.0"}, {-0.0, "-0.0"}, {0.1, "0.10000000000000001"}, {1e300, "1.0000000000000001e+300"},
        {1e-310, "9.9999999999999694e-311"}, {123456789.0, "123456789.0"}, {1e17, "1e+17"}, {-2.5e-7, "-2.4999999999999999e-07"},
    };
    for (size_t k = 0; k < sizeof fl / sizeof *fl; k++) {
        nd_json_buf f = {0};
        CHECK(nd_json_float(&f, fl[k].v));
        CHECKM(f.p && strcmp(f.p, fl[k].s) == 0, "%.17g wrote '%s', expected '%s'", fl[k].v, f.p, fl[k].s);
        d = NULL;
        checks++;
        if (!f.p || nd_json_parse(f.p, f.n, NULL, &d, NULL) != ND_OK || d->nodes[0].type != ND_JSON_FLOAT ||
            d->nodes[0].f != fl[k].v || signbit(d->nodes[0].f) != signbit(fl[k].v))
            FAIL("%s does not read back as %.17g", f.p, fl[k].v);
        nd_json_free(d);
        nd_json_buf_free(&f);
    }
    nd_json_buf f = {0};
    CHECK(!nd_json_float(&f, NAN) && !nd_json_float(&f, INFINITY) && !nd_json_float(&f, -INFINITY) && f.n == 0);
    nd_json_int(&f, INT64_MIN);
    nd_json_puts(&f, " ");
    nd_json_uint(&f, UINT64_MAX);
    CHECK(strcmp(f.p, "-9223372036854775808 18446744073709551615") == 0);
    nd_json_buf_free(&f);
    /* random doubles round-trip exactly */
    uint64_t r = 0x243f6a8885a308d3ull;
    int bad = 0;
    for (int k = 0; k < 20000; k++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        double v;
        memcpy(&v, &r, sizeof v);
        if (!isfinite(v)) continue;
        nd_json_buf g = {0};
        nd_json_float(&g, v);
        d = NULL;
        if (nd_json_parse(g.p, g.n, NULL, &d, NULL) != ND_OK || d->nodes[0].type != ND_JSON_FLOAT ||
            memcmp(&d->nodes[0].f, &v, sizeof v) != 0)
            bad++;
        nd_json_free(d);
        nd_json_buf_free(&g);
    }
    CHECKM(bad == 0, "%d random doubles did not round-trip", bad);
}

/* random bytes and mutations: errors or documents, never a crash (ASan) */
static void test_garbage(void) {
    const char *base = "{\"a\":[1,-2.5e3,true,false,\"\\u00e9\\ud83d\\ude00\"],\"b\":{\"c\":{}},\"d\":\"x\\n\"}";
    size_t n = strlen(base);
    char *buf = malloc(n + 1);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    int ok = 0;
    const char pick[] = "{}[],:\"\\u0123456789-+.eEtrufalsn \x80\xc3\xff";
    for (int k = 0; k < 30000; k++) {
        memcpy(buf, base, n);
        int edits = 1 + (int)(r % 4);
        for (int e = 0; e < edits; e++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            buf[r % n] = pick[(r >> 32) % (sizeof pick - 1)];
        }
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        size_t len = k % 5 == 0 ? (size_t)(r % (n + 1)) : n; /* and truncations, without a NUL after them */
        char *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        nd_json_doc *d = NULL;
        nd_json_error err;
        nd_status st = nd_json_parse(exact, len, NULL, &d, &err);
        if (st == ND_OK) {
            ok++;
            CHECK(d->nnodes >= 1);
        } else {
            checks++;
            if (st != ND_ERR_IO || err.offset > len || !err.msg[0]) FAIL("mutation %d: status %d offset %zu", k, st, err.offset);
        }
        nd_json_free(d);
        free(exact);
    }
    printf("mutations: %d of 30000 still parsed\n", ok);
    free(buf);
}

static void test_show(void) {
    char b[ND_JSON_SHOW_BUF];
    CHECK(strcmp(nd_json_show("a\nb", 3, b), "a\\x0ab") == 0);
    CHECK(strcmp(nd_json_show("\xc3\xa9", 2, b), "\xc3\xa9") == 0);
    CHECK(strcmp(nd_json_show("\xff", 1, b), "\\xff") == 0);
    char long_name[300];
    memset(long_name, 'x', sizeof long_name);
    nd_json_show(long_name, sizeof long_name, b);
    CHECK(strlen(b) == ND_JSON_SHOW_MAX + 3 && strcmp(b + ND_JSON_SHOW_MAX, "...") == 0);
}

int main(void) {
    test_values();
    test_numbers();
    test_strings();
    test_structure();
    test_depth();
    test_writer();
    test_garbage();
    test_show();
    printf("test_json: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
