/* test_zip.c - the zip reader (src/io/zip.c) on archives built here, in C:
 * stored and deflated (zlib) entries, ZIP64 records and extra fields,
 * torch's 'FB' alignment padding, data descriptors, comments; and damaged
 * ones: central directory vs local header disagreements, truncations at
 * every length, overlapping entries, duplicate names, CRC errors,
 * overlong/short/truncated deflate streams, encryption, unknown methods,
 * multi-disk archives, and random byte mutations (which must never crash or
 * read out of bounds: run it in the ASan build). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "byte_writer.h"
#include "check.h"
#include "io/zip.h"

/* ------------------------------------------------------------ a zip writer */

typedef struct {
    const char *name;
    const void *data;
    size_t len;
    int method;        /* 0 stored, 8 deflated */
    bool zip64;        /* ZIP64 extra fields (sizes and offset all 0xFFFFFFFF) */
    bool align;        /* torch's 'FB' padding: data starts on a 64-byte boundary */
    bool descriptor;   /* bit 3: sizes/CRC in a data descriptor after the data */
} ent;

typedef struct {
    bool zip64_eocd;   /* ZIP64 end record + locator, classic fields all ones */
    const char *comment;
} zopts;

typedef struct {
    bytes b;
    size_t local[16], central[16], eocd, cd_offset;
    size_t data_off[16], comp[16];
} zbuild;

static void build(zbuild *z, const ent *es, int n, const zopts *o) {
    memset(z, 0, sizeof *z);
    bytes *b = &z->b;
    uint32_t crcs[16];
    for (int i = 0; i < n; i++) {
        const ent *e = &es[i];
        uint8_t *cd = NULL;
        size_t comp = e->len;
        if (e->method == 8) comp = raw_deflate(e->data, e->len, &cd);
        crcs[i] = (uint32_t)crc32(crc32(0, Z_NULL, 0), e->data, (uInt)e->len);
        size_t nlen = strlen(e->name);
        size_t xlen = e->zip64 ? 20 : 0;
        size_t pad = 0;
        if (e->align) {
            size_t start = b->n + 30 + nlen + xlen + 4;
            pad = (64 - start % 64) % 64;
            xlen += 4 + pad;
        }
        z->local[i] = b->n;
        put32(b, 0x04034b50);
        put16(b, e->zip64 ? 45 : 20);
        put16(b, e->descriptor ? 8 : 0);
        put16(b, (uint16_t)e->method);
        put16(b, 0);
        put16(b, 0x21);
        put32(b, e->descriptor ? 0 : crcs[i]);
        put32(b, e->descriptor ? 0 : e->zip64 ? 0xFFFFFFFFu : (uint32_t)comp);
        put32(b, e->descriptor ? 0 : e->zip64 ? 0xFFFFFFFFu : (uint32_t)e->len);
        put16(b, (uint16_t)nlen);
        put16(b, (uint16_t)xlen);
        put(b, e->name, nlen);
        if (e->zip64) {
            put16(b, 1);
            put16(b, 16);
            put64(b, e->descriptor ? 0 : e->len);
            put64(b, e->descriptor ? 0 : comp);
        }
        if (e->align) {
            put16(b, 0x4246); /* "FB" */
            put16(b, (uint16_t)pad);
            for (size_t k = 0; k < pad; k++) put(b, "Z", 1);
        }
        z->data_off[i] = b->n;
        z->comp[i] = comp;
        put(b, e->method == 8 ? (const void *)cd : e->data, comp);
        if (e->descriptor) {
            put32(b, 0x08074b50);
            put32(b, crcs[i]);
            if (e->zip64) { put64(b, comp); put64(b, e->len); }
            else { put32(b, (uint32_t)comp); put32(b, (uint32_t)e->len); }
        }
        free(cd);
    }
    z->cd_offset = b->n;
    for (int i = 0; i < n; i++) {
        const ent *e = &es[i];
        size_t nlen = strlen(e->name);
        z->central[i] = b->n;
        put32(b, 0x02014b50);
        put16(b, 0x031e);
        put16(b, e->zip64 ? 45 : 20);
        put16(b, e->descriptor ? 8 : 0);
        put16(b, (uint16_t)e->method);
        put16(b, 0);
        put16(b, 0x21);
        put32(b, crcs[i]);
        put32(b, e->zip64 ? 0xFFFFFFFFu : (uint32_t)z->comp[i]);
        put32(b, e->zip64 ? 0xFFFFFFFFu : (uint32_t)e->len);
        put16(b, (uint16_t)nlen);
        put16(b, e->zip64 ? 28 : 0);
        put16(b, 0);
        put16(b, 0);
        put16(b, 0);
        put32(b, 0);
        put32(b, e->zip64 ? 0xFFFFFFFFu : (uint32_t)z->local[i]);
        put(b, e->name, nlen);
        if (e->zip64) {
            put16(b, 1);
            put16(b, 24);
            put64(b, e->len);
            put64(b, z->comp[i]);
            put64(b, z->local[i]);
        }
    }
    size_t cd_size = b->n - z->cd_offset;
    bool z64 = o && o->zip64_eocd;
    if (z64) {
        size_t rec = b->n;
        put32(b, 0x06064b50);
        put64(b, 44);
        put16(b, 45);
        put16(b, 45);
        put32(b, 0);
        put32(b, 0);
        put64(b, (uint64_t)n);
        put64(b, (uint64_t)n);
        put64(b, cd_size);
        put64(b, z->cd_offset);
        put32(b, 0x07064b50);
        put32(b, 0);
        put64(b, rec);
        put32(b, 1);
    }
    z->eocd = b->n;
    const char *comment = o && o->comment ? o->comment : "";
    put32(b, 0x06054b50);
    put16(b, 0);
    put16(b, 0);
    put16(b, z64 ? 0xFFFF : (uint16_t)n);
    put16(b, z64 ? 0xFFFF : (uint16_t)n);
    put32(b, z64 ? 0xFFFFFFFFu : (uint32_t)cd_size);
    put32(b, z64 ? 0xFFFFFFFFu : (uint32_t)z->cd_offset);
    put16(b, (uint16_t)strlen(comment));
    put(b, comment, strlen(comment));
}

/* ------------------------------------------------------------ helpers */

static char big[70000];
static const char *hello = "hello, zip";

static void init_big(void) {
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)("abcabcabd"[i % 9] + (i % 1000 == 0));
}

/* entry `name` of the archive holds exactly data[0, n) */
static void expect_entry(int line, const nd_zip *z, const char *name, const void *data, size_t n) {
    checks++;
    int64_t i = nd_zip_find(z, name, strlen(name));
    if (i < 0) { FAIL_AT(line, "entry '%s' not found", name); return; }
    const uint8_t *p;
    size_t len;
    void *owned;
    if (nd_zip_read(z, (size_t)i, (uint64_t)1 << 30, &p, &len, &owned) != ND_OK) {
        FAIL_AT(line, "reading '%s': %s", name, nd_last_error());
        return;
    }
    if (len != n || memcmp(p, data, n) != 0) FAIL_AT(line, "entry '%s': wrong content (%zu bytes)", name, len);
    free(owned);
}
#define EXPECT_ENTRY(z, name, data, n) expect_entry(__LINE__, z, name, data, n)

/* opening fails, mentioning s1 */
#define EXPECT_OPEN_ERR(buf, len, s1) do { nd_zip *z_ = NULL; \
        EXPECT_ERR("open", nd_zip_open("zip", "t.zip", buf, len, &z_), ND_ERR_IO, s1, "'t.zip'"); \
        nd_zip_close(z_); } while (0)

/* opening works, reading entry 0 fails with s1 */
#define EXPECT_READ_ERR(buf, len, st, s1) do { nd_zip *z_ = NULL; \
        OK(nd_zip_open("zip", "t.zip", buf, len, &z_)); const uint8_t *p_; size_t n_; void *o_; \
        EXPECT_ERR("read", nd_zip_read(z_, 0, (uint64_t)1 << 30, &p_, &n_, &o_), st, s1, "'t.zip'"); \
        free(o_); nd_zip_close(z_); } while (0)

/* ------------------------------------------------------------ tests */

static void test_stored(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, false, false, false},
                {"archive/data/0", big, 1000, 0, false, true, false},
                {"archive/version", "3\n", 2, 0, false, false, false},
                {"archive/empty", "", 0, 0, false, false, false}};
    zbuild b;
    build(&b, es, 4, NULL);
    nd_zip *z;
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    CHECK(z->n == 4);
    CHECK(strcmp(z->entries[1].name, "archive/data/0") == 0);
    CHECK(z->entries[1].data_offset % 64 == 0); /* the 'FB' padding was understood */
    EXPECT_ENTRY(z, "archive/data.pkl", hello, strlen(hello));
    EXPECT_ENTRY(z, "archive/data/0", big, 1000);
    EXPECT_ENTRY(z, "archive/version", "3\n", 2);
    EXPECT_ENTRY(z, "archive/empty", "", 0);
    CHECK(nd_zip_find(z, "archive/data", 12) == -1);
    CHECK(nd_zip_find(z, "archive/data/00", 15) == -1);
    CHECK(nd_zip_find(z, "", 0) == -1);
    /* a stored entry points into the buffer */
    const uint8_t *p;
    size_t n;
    void *owned;
    OK(nd_zip_read(z, 0, 0, &p, &n, &owned));
    CHECK(owned == NULL && p == b.b.p + z->entries[0].data_offset);
    EXPECT_ERR("index", nd_zip_read(z, 4, 100, &p, &n, &owned), ND_ERR_INDEX, "no zip entry", NULL);
    nd_zip_close(z);

    free(b.b.p);
    /* an empty archive: just the end record */
    zbuild e0;
    build(&e0, es, 0, NULL);
    OK(nd_zip_open("zip", "t.zip", e0.b.p, e0.b.n, &z));
    CHECK(z->n == 0 && nd_zip_find(z, "a", 1) == -1);
    nd_zip_close(z);
    free(e0.b.p);

    /* a comment after the end record */
    zopts o = {false, "a comment with PK\x05\x06 in it"};
    build(&b, es, 2, &o);
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    EXPECT_ENTRY(z, "archive/data/0", big, 1000);
    nd_zip_close(z);
    free(b.b.p);

    /* a data descriptor: local sizes and CRC are zero */
    ent d[] = {{"a/data.pkl", hello, strlen(hello), 0, false, false, true},
               {"a/data/0", big, 5000, 8, false, false, true}};
    build(&b, d, 2, NULL);
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    EXPECT_ENTRY(z, "a/data.pkl", hello, strlen(hello));
    EXPECT_ENTRY(z, "a/data/0", big, 5000);
    nd_zip_close(z);
    /* the descriptor must agree with the central directory */
    uint8_t *c = malloc(b.b.n);
    memcpy(c, b.b.p, b.b.n);
    c[b.data_off[1] + b.comp[1] + 4] ^= 1; /* its CRC */
    EXPECT_OPEN_ERR(c, b.b.n, "entry 'a/data/0': the data descriptor");
    memcpy(c, b.b.p, b.b.n);
    c[b.data_off[0] + strlen(hello) + 8] ^= 1; /* its compressed size */
    EXPECT_OPEN_ERR(c, b.b.n, "entry 'a/data.pkl': the data descriptor");
    free(c);
    free(b.b.p);
    /* ZIP64 descriptors (8-byte sizes) */
    ent d64[] = {{"a/data/0", big, 5000, 8, true, false, true}};
    build(&b, d64, 1, NULL);
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    EXPECT_ENTRY(z, "a/data/0", big, 5000);
    nd_zip_close(z);
    free(b.b.p);
}

static void test_deflated(void) {
    ent es[] = {{"root/data.pkl", hello, strlen(hello), 8, false, false, false},
                {"root/data/0", big, sizeof big, 8, false, false, false},
                {"root/data/1", "", 0, 8, false, false, false}};
    zbuild b;
    build(&b, es, 3, NULL);
    nd_zip *z;
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    CHECK(z->entries[1].method == 8 && z->entries[1].comp_size < sizeof big / 4);
    EXPECT_ENTRY(z, "root/data.pkl", hello, strlen(hello));
    EXPECT_ENTRY(z, "root/data/0", big, sizeof big);
    EXPECT_ENTRY(z, "root/data/1", "", 0);
    /* the cap on inflated sizes */
    const uint8_t *p;
    size_t n;
    void *owned;
    EXPECT_ERR("max", nd_zip_read(z, 1, 1000, &p, &n, &owned), ND_ERR_MEMORY, "root/data/0", "limit of 1000");
    CHECK(owned == NULL);
    OK(nd_zip_read(z, 1, sizeof big, &p, &n, &owned));
    free(owned);
    nd_zip_close(z);
    free(b.b.p);
}

static void test_zip64(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, true, false, false},
                {"archive/data/0", big, 3000, 0, true, true, false},
                {"archive/data/1", big, 3000, 8, true, false, false},
                {"archive/data/2", big + 7, 77, 0, false, false, false}};
    zopts o = {true, NULL};
    zbuild b;
    build(&b, es, 4, &o);
    nd_zip *z;
    OK(nd_zip_open("zip", "t.zip", b.b.p, b.b.n, &z));
    CHECK(z->n == 4);
    CHECK(z->entries[1].data_offset % 64 == 0);
    EXPECT_ENTRY(z, "archive/data.pkl", hello, strlen(hello));
    EXPECT_ENTRY(z, "archive/data/0", big, 3000);
    EXPECT_ENTRY(z, "archive/data/1", big, 3000);
    EXPECT_ENTRY(z, "archive/data/2", big + 7, 77);
    nd_zip_close(z);

    /* the ZIP64 record and the classic one disagree on the entry count */
    uint8_t *c = malloc(b.b.n);
    memcpy(c, b.b.p, b.b.n);
    set16(c + b.eocd + 10, 3);
    EXPECT_OPEN_ERR(c, b.b.n, "disagree");
    /* the locator points nowhere */
    memcpy(c, b.b.p, b.b.n);
    set32(c + b.eocd - 20 + 8, 0x7fffffff);
    EXPECT_OPEN_ERR(c, b.b.n, "locator");
    /* the ZIP64 record's size field is absurd */
    memcpy(c, b.b.p, b.b.n);
    set32(c + b.eocd - 20 - 56 + 4, 0xFFFFFFF0u);
    EXPECT_OPEN_ERR(c, b.b.n, "bad size");
    /* a central ZIP64 extra field too short for the fields marked 0xFFFFFFFF */
    memcpy(c, b.b.p, b.b.n);
    set16(c + b.central[0] + 46 + strlen(es[0].name) + 2, 8);
    EXPECT_OPEN_ERR(c, b.b.n, "ZIP64 extra field");
    /* 0xFFFFFFFF without any ZIP64 field: rename the field's id */
    memcpy(c, b.b.p, b.b.n);
    set16(c + b.central[0] + 46 + strlen(es[0].name), 0x9999);
    EXPECT_OPEN_ERR(c, b.b.n, "no ZIP64 extra field");
    /* the local ZIP64 sizes disagree with the central ones */
    memcpy(c, b.b.p, b.b.n);
    set32(c + b.local[0] + 30 + strlen(es[0].name) + 4, 5);
    EXPECT_OPEN_ERR(c, b.b.n, "local header says");
    /* review R1: a local header with only its compressed size 0xFFFFFFFF
     * still holds both sizes in its ZIP64 field (APPNOTE 4.5.3), size first:
     * the compressed size is the second (it was read from the first) */
    memcpy(c, b.b.p, b.b.n);
    set32(c + b.local[2] + 22, 3000);
    {
        nd_zip *z2 = NULL;
        OK(nd_zip_open("zip", "t.zip", c, b.b.n, &z2));
        EXPECT_ENTRY(z2, "archive/data/1", big, 3000);
        nd_zip_close(z2);
    }
    /* ... and one whose size and compressed size differ still disagrees */
    set32(c + b.local[2] + 30 + strlen(es[2].name) + 4 + 8, (uint32_t)b.comp[2] + 1);
    EXPECT_OPEN_ERR(c, b.b.n, "local header says");
    free(c);
    free(b.b.p);
}

static void test_local_mismatch(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, false, false, false},
                {"archive/data/0", big, 3000, 8, false, false, false}};
    zbuild b;
    build(&b, es, 2, NULL);
    uint8_t *c = malloc(b.b.n);
    size_t n = b.b.n;
    /* another name in the local header */
    memcpy(c, b.b.p, n);
    c[b.local[0] + 30 + 7] = 'X';
    EXPECT_OPEN_ERR(c, n, "local header names it 'archiveXdata.pkl'");
    /* a different size */
    memcpy(c, b.b.p, n);
    set32(c + b.local[1] + 22, 2999);
    EXPECT_OPEN_ERR(c, n, "archive/data/0': the central directory says 3000 bytes");
    /* a different CRC */
    memcpy(c, b.b.p, n);
    c[b.local[0] + 14] ^= 1;
    EXPECT_OPEN_ERR(c, n, "CRC");
    /* a different method */
    memcpy(c, b.b.p, n);
    set16(c + b.local[1] + 8, 0);
    EXPECT_OPEN_ERR(c, n, "compression method 8 in the central directory but 0");
    /* a central offset that does not point at a local header */
    memcpy(c, b.b.p, n);
    set32(c + b.central[1] + 42, (uint32_t)b.local[1] + 1);
    EXPECT_OPEN_ERR(c, n, "no local header");
    /* ... or points into the central directory */
    memcpy(c, b.b.p, n);
    set32(c + b.central[1] + 42, (uint32_t)b.central[0]);
    EXPECT_OPEN_ERR(c, n, "no local header");
    /* a local header whose name runs into the central directory */
    memcpy(c, b.b.p, n);
    set16(c + b.local[1] + 28, 0xFFFF);
    EXPECT_OPEN_ERR(c, n, "runs into the central directory");
    free(c);
    free(b.b.p);

    ent x[] = {{"archive/data/0", big, 100, 0, false, true, false}};
    build(&b, x, 1, NULL);
    c = malloc(b.b.n);
    memcpy(c, b.b.p, b.b.n);
    /* the 'FB' field claims more bytes than the extra area holds */
    set16(c + b.local[0] + 30 + strlen(x[0].name) + 2, 0x7000);
    EXPECT_OPEN_ERR(c, b.b.n, "corrupt extra field in the local header");
    free(c);
    free(b.b.p);
}

static void test_truncated(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, false, false, false},
                {"archive/data/0", big, 2000, 8, false, true, false}};
    zbuild b;
    build(&b, es, 2, NULL);
    /* every proper prefix is rejected (the end record is gone or points past the end) */
    for (size_t k = 0; k < b.b.n; k++) {
        uint8_t *c = malloc(k ? k : 1);
        memcpy(c, b.b.p, k);
        nd_zip *z = NULL;
        checks++;
        if (nd_zip_open("zip", "t.zip", c, k, &z) == ND_OK) {
            FAIL("a prefix of %zu of %zu bytes was accepted", k, b.b.n);
            nd_zip_close(z);
        } else if (!strstr(nd_last_error(), "'t.zip'")) {
            FAIL("message without the file name: %s", nd_last_error());
        }
        free(c);
    }
    EXPECT_OPEN_ERR(b.b.p, 10, "too short");
    EXPECT_OPEN_ERR(b.b.p, b.b.n - 1, "no end of central directory");
    /* trailing bytes after the end record are not a comment */
    uint8_t *c = malloc(b.b.n + 3);
    memcpy(c, b.b.p, b.b.n);
    memcpy(c + b.b.n, "xyz", 3);
    EXPECT_OPEN_ERR(c, b.b.n + 3, "no end of central directory");
    free(c);
    free(b.b.p);
}

static void test_overlap_and_duplicates(void) {
    ent es[] = {{"archive/a", big, 100, 0, false, false, false},
                {"archive/b", big, 100, 0, false, false, false}};
    zbuild b;
    build(&b, es, 2, NULL);
    uint8_t *c = malloc(b.b.n);
    size_t n = b.b.n;
    /* entry a claims 150 bytes (central and local agree): it runs into b */
    memcpy(c, b.b.p, n);
    set32(c + b.local[0] + 18, 150);
    set32(c + b.local[0] + 22, 150);
    set32(c + b.central[0] + 20, 150);
    set32(c + b.central[0] + 24, 150);
    EXPECT_OPEN_ERR(c, n, "entries 'archive/a' and 'archive/b' overlap");
    /* entry b claims to run into the central directory */
    memcpy(c, b.b.p, n);
    set32(c + b.local[1] + 18, 150);
    set32(c + b.local[1] + 22, 150);
    set32(c + b.central[1] + 20, 150);
    set32(c + b.central[1] + 24, 150);
    EXPECT_OPEN_ERR(c, n, "archive/b': its 150 bytes");
    free(c);
    free(b.b.p);

    /* two central entries for one local header */
    build(&b, es, 2, NULL);
    memcpy(b.b.p + b.central[1] + 46, "archive/a", 9);
    set32(b.b.p + b.central[1] + 42, (uint32_t)b.local[0]);
    EXPECT_OPEN_ERR(b.b.p, b.b.n, "overlap");
    free(b.b.p);

    ent d[] = {{"archive/data/0", big, 10, 0, false, false, false},
               {"archive/data.pkl", hello, 3, 0, false, false, false},
               {"archive/data/0", big + 10, 10, 0, false, false, false}};
    build(&b, d, 3, NULL);
    EXPECT_OPEN_ERR(b.b.p, b.b.n, "entry 'archive/data/0' appears twice");
    free(b.b.p);
}

static void test_crc_and_deflate_errors(void) {
    ent es[] = {{"archive/data/0", big, 3000, 0, false, false, false}};
    zbuild b;
    build(&b, es, 1, NULL);
    b.b.p[b.data_off[0] + 17] ^= 0x40;
    EXPECT_READ_ERR(b.b.p, b.b.n, ND_ERR_IO, "entry 'archive/data/0': CRC-32 mismatch");
    free(b.b.p);

    ent d[] = {{"archive/data/0", big, 3000, 8, false, false, false}};
    build(&b, d, 1, NULL);
    size_t n = b.b.n;
    uint8_t *c = malloc(n);
    /* damaged compressed data: zlib's error, or a CRC mismatch */
    memcpy(c, b.b.p, n);
    c[b.data_off[0] + b.comp[0] / 2] ^= 0x55;
    {
        nd_zip *z = NULL;
        OK(nd_zip_open("zip", "t.zip", c, n, &z));
        const uint8_t *p;
        size_t len;
        void *o;
        checks++;
        if (nd_zip_read(z, 0, 1 << 20, &p, &len, &o) == ND_OK) FAIL("damaged deflate stream accepted");
        else CHECKM(strstr(nd_last_error(), "archive/data/0") != NULL, "%s", nd_last_error());
        nd_zip_close(z);
    }
    /* the central directory (and local header) promise fewer bytes than the stream gives */
    memcpy(c, b.b.p, n);
    set32(c + b.local[0] + 22, 2999);
    set32(c + b.central[0] + 24, 2999);
    EXPECT_READ_ERR(c, n, ND_ERR_IO, "inflates to more than the 2999 bytes");
    /* ... or more */
    memcpy(c, b.b.p, n);
    set32(c + b.local[0] + 22, 3001);
    set32(c + b.central[0] + 24, 3001);
    EXPECT_READ_ERR(c, n, ND_ERR_IO, "inflates to 3000 bytes but the central directory says 3001");
    /* a compressed size that cuts the stream short */
    memcpy(c, b.b.p, n);
    set32(c + b.local[0] + 18, (uint32_t)b.comp[0] - 3);
    set32(c + b.central[0] + 20, (uint32_t)b.comp[0] - 3);
    EXPECT_READ_ERR(c, n, ND_ERR_IO, "truncated");
    /* review R1: every byte, but no end of stream (the final block is
     * missing): said as such, not as "truncated ... give only 3000 of 3000" */
    {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
        uint8_t sf[8192];
        zs.next_in = (Bytef *)big;
        zs.avail_in = 3000;
        zs.next_out = sf;
        zs.avail_out = sizeof sf;
        if (deflate(&zs, Z_SYNC_FLUSH) != Z_OK) exit(1); /* all of it, then an empty stored block: no end */
        size_t sk = zs.total_out;
        deflateEnd(&zs);
        ent u[] = {{"archive/data/0", sf, sk, 0, false, false, false}};
        zbuild ub;
        build(&ub, u, 1, NULL);
        uint32_t crc = (uint32_t)crc32(crc32(0, Z_NULL, 0), (const Bytef *)big, 3000);
        set16(ub.b.p + ub.local[0] + 8, 8);
        set16(ub.b.p + ub.central[0] + 10, 8);
        set32(ub.b.p + ub.local[0] + 14, crc);
        set32(ub.b.p + ub.central[0] + 16, crc);
        set32(ub.b.p + ub.local[0] + 22, 3000);
        set32(ub.b.p + ub.central[0] + 24, 3000);
        EXPECT_READ_ERR(ub.b.p, ub.b.n, ND_ERR_IO, "the deflate stream does not end after 3000 bytes");
        nd_zip *z = NULL;
        OK(nd_zip_open("zip", "t.zip", ub.b.p, ub.b.n, &z));
        const uint8_t *p;
        size_t len;
        void *o = NULL;
        checks++;
        if (nd_zip_read(z, 0, 1 << 20, &p, &len, &o) == ND_OK) FAIL("a stream without its end accepted");
        else CHECKM(!strstr(nd_last_error(), "truncated"), "%s", nd_last_error());
        free(o);
        nd_zip_close(z);
        free(ub.b.p);
    }
    /* a size deflate cannot reach from so few bytes (a bomb's claim) */
    memcpy(c, b.b.p, n);
    set32(c + b.local[0] + 22, 0x3FFFFFFF);
    set32(c + b.central[0] + 24, 0x3FFFFFFF);
    EXPECT_READ_ERR(c, n, ND_ERR_IO, "more than deflate can encode");
    free(c);
    free(b.b.p);

    /* bytes after the end of the deflate stream, inside the entry */
    uint8_t *cd;
    size_t k = raw_deflate(big, 3000, &cd);
    uint8_t *cd2 = malloc(k + 5);
    memcpy(cd2, cd, k);
    memcpy(cd2 + k, "junk!", 5);
    ent j[] = {{"x", cd2, k + 5, 0, false, false, false}};
    build(&b, j, 1, NULL);
    /* turn the stored entry into a deflated one of size 3000 with the right CRC */
    uint32_t crc = (uint32_t)crc32(crc32(0, Z_NULL, 0), (const Bytef *)big, 3000);
    set16(b.b.p + b.local[0] + 8, 8);
    set16(b.b.p + b.central[0] + 10, 8);
    set32(b.b.p + b.local[0] + 14, crc);
    set32(b.b.p + b.central[0] + 16, crc);
    set32(b.b.p + b.local[0] + 22, 3000);
    set32(b.b.p + b.central[0] + 24, 3000);
    EXPECT_READ_ERR(b.b.p, b.b.n, ND_ERR_IO, "follow the end of the deflate stream");
    free(b.b.p);
    free(cd);
    free(cd2);
}

static void test_unsupported(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, false, false, false}};
    zbuild b;
    build(&b, es, 1, NULL);
    size_t n = b.b.n;
    uint8_t *c = malloc(n);
    memcpy(c, b.b.p, n);
    set16(c + b.central[0] + 8, 1);
    set16(c + b.local[0] + 6, 1);
    EXPECT_OPEN_ERR(c, n, "entry 'archive/data.pkl' is encrypted");
    memcpy(c, b.b.p, n);
    set16(c + b.central[0] + 10, 12);
    set16(c + b.local[0] + 8, 12);
    EXPECT_OPEN_ERR(c, n, "compression method 12");
    memcpy(c, b.b.p, n);
    set16(c + b.eocd + 4, 1);
    EXPECT_OPEN_ERR(c, n, "multi-disk");
    memcpy(c, b.b.p, n);
    set16(c + b.eocd + 8, 0);
    EXPECT_OPEN_ERR(c, n, "multi-disk");
    memcpy(c, b.b.p, n);
    set16(c + b.central[0] + 34, 2);
    EXPECT_OPEN_ERR(c, n, "another disk");
    /* a stored entry whose sizes differ */
    memcpy(c, b.b.p, n);
    set32(c + b.central[0] + 20, 3);
    EXPECT_OPEN_ERR(c, n, "is stored but");
    /* a NUL in a name */
    memcpy(c, b.b.p, n);
    c[b.central[0] + 46 + 2] = 0;
    EXPECT_OPEN_ERR(c, n, "NUL byte");
    /* the end record counts more entries than the central directory holds */
    memcpy(c, b.b.p, n);
    set16(c + b.eocd + 8, 2);
    set16(c + b.eocd + 10, 2);
    EXPECT_OPEN_ERR(c, n, "too small for the 2 entries");
    /* ... or fewer */
    ent two[] = {{"a", "x", 1, 0, false, false, false}, {"b", "y", 1, 0, false, false, false}};
    zbuild b2;
    build(&b2, two, 2, NULL);
    set16(b2.b.p + b2.eocd + 8, 1);
    set16(b2.b.p + b2.eocd + 10, 1);
    EXPECT_OPEN_ERR(b2.b.p, b2.b.n, "after its 1 entries");
    free(b2.b.p);
    /* a central directory offset past the end */
    memcpy(c, b.b.p, n);
    set32(c + b.eocd + 16, 0x7FFFFFF0);
    EXPECT_OPEN_ERR(c, n, "outside the archive");
    /* a central directory size that overflows 32 bits with the offset */
    memcpy(c, b.b.p, n);
    set32(c + b.eocd + 12, 0xFFFFFFF0u);
    EXPECT_OPEN_ERR(c, n, "outside the archive");
    free(c);
    free(b.b.p);
}

/* Random damage: whatever the bytes, no crash, no read out of bounds (ASan),
 * an error with the file name or a clean read. */
static void test_mutations(void) {
    ent es[] = {{"archive/data.pkl", hello, strlen(hello), 0, false, false, false},
                {"archive/data/0", big, 700, 8, false, true, false},
                {"archive/data/1", big, 300, 0, true, false, false},
                {"archive/version", "3\n", 2, 8, false, false, true}};
    zopts o = {true, NULL};
    zbuild b;
    build(&b, es, 4, &o);
    uint64_t rng = 0x243F6A8885A308D3ull;
    uint8_t *c = malloc(b.b.n);
    int opened = 0;
    for (int t = 0; t < 20000; t++) {
        memcpy(c, b.b.p, b.b.n);
        int k = 1 + (int)((rng >> 60) & 3);
        for (int m = 0; m < k; m++) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            size_t at = (size_t)(rng % b.b.n);
            /* aim at the headers more often than at the data */
            if ((rng >> 40) & 1) {
                size_t heads[] = {b.local[0], b.local[1], b.local[2], b.local[3], b.central[0], b.central[1],
                                  b.central[2], b.central[3], b.eocd, b.eocd - 76};
                at = heads[(rng >> 20) % 10] + (size_t)((rng >> 8) % 48);
                if (at >= b.b.n) at = b.b.n - 1;
            }
            c[at] = (rng >> 32) & 1 ? (uint8_t)(rng >> 24) : (uint8_t)(c[at] ^ (1u << ((rng >> 28) & 7)));
        }
        nd_zip *z = NULL;
        if (nd_zip_open("zip", "m.zip", c, b.b.n, &z) != ND_OK) {
            if (!strstr(nd_last_error(), "'m.zip'")) FAIL("message without the file name: %s", nd_last_error());
            continue;
        }
        opened++;
        for (size_t i = 0; i < z->n; i++) {
            const uint8_t *p;
            size_t len;
            void *ow;
            if (nd_zip_read(z, i, 1 << 20, &p, &len, &ow) == ND_OK) {
                if (len != z->entries[i].size) FAIL("read %zu bytes, size %llu", len,
                                                    (unsigned long long)z->entries[i].size);
                free(ow);
            }
        }
        nd_zip_close(z);
    }
    checks++;
    printf("mutations: %d of 20000 still opened\n", opened);
    free(c);
    free(b.b.p);
}

int main(void) {
    init_big();
    test_stored();
    test_deflated();
    test_zip64();
    test_local_mismatch();
    test_truncated();
    test_overlap_and_duplicates();
    test_crc_and_deflate_errors();
    test_unsupported();
    test_mutations();
    printf("test_zip: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
