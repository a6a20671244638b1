/* test_io_budget.c - the budget of one torch checkpoint load
 * (torch_load.h: max_decompressed_bytes, max_items), on the two files of
 * issue 15, built here:
 *  - a ~5 MB archive of four deflated storages that claim 1.25 GiB each
 *    (5 GiB in all): refused before any of them is inflated or allocated
 *    (their compressed bytes are not even a deflate stream, so a reader that
 *    started inflating would fail differently);
 *  - a data.pkl of four lists of 15 million items (60 MB, deflated to a
 *    little over 100 KB): refused when the items reach the limit, before
 *    the memory for more is allocated.
 * And the options: a small budget is enforced to the byte and the item, a
 * budget of exactly what the file needs loads it, in memory and from a
 * file. */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "byte_writer.h"
#include "check.h"
#include "io/pickle.h"
#include "io/torch_load.h"

/* ------------------------------------------------------------ a zip writer
 * Entries with ZIP64 sizes (so a 1.25 GiB claim fits any field). data is
 * written as given (comp bytes); size and crc are what the entry claims. */
typedef struct { const char *name; const uint8_t *data; uint64_t comp, size; uint32_t crc; int method; } ent;

static void zip(bytes *b, const ent *es, int n) {
    uint64_t off[16];
    for (int i = 0; i < n; i++) {
        const ent *e = &es[i];
        off[i] = b->n;
        put32(b, 0x04034b50u);
        put16(b, 45); put16(b, 0); put16(b, (uint16_t)e->method); put32(b, 0);
        put32(b, e->crc); put32(b, 0xFFFFFFFFu); put32(b, 0xFFFFFFFFu);
        put16(b, (uint16_t)strlen(e->name)); put16(b, 20);
        puts_(b, e->name);
        put16(b, 1); put16(b, 16); put64(b, e->size); put64(b, e->comp);
        put(b, e->data, (size_t)e->comp);
    }
    uint64_t cd = b->n;
    for (int i = 0; i < n; i++) {
        const ent *e = &es[i];
        put32(b, 0x02014b50u);
        put16(b, 45); put16(b, 45); put16(b, 0); put16(b, (uint16_t)e->method); put32(b, 0);
        put32(b, e->crc); put32(b, 0xFFFFFFFFu); put32(b, 0xFFFFFFFFu);
        put16(b, (uint16_t)strlen(e->name)); put16(b, 28); put16(b, 0); put16(b, 0); put16(b, 0);
        put32(b, 0); put32(b, 0xFFFFFFFFu);
        puts_(b, e->name);
        put16(b, 1); put16(b, 24); put64(b, e->size); put64(b, e->comp); put64(b, off[i]);
    }
    uint64_t cd_size = b->n - cd, z64 = b->n;
    put32(b, 0x06064b50u); put64(b, 44); put16(b, 45); put16(b, 45); put32(b, 0); put32(b, 0);
    put64(b, (uint64_t)n); put64(b, (uint64_t)n); put64(b, cd_size); put64(b, cd);
    put32(b, 0x07064b50u); put32(b, 0); put64(b, z64); put32(b, 1);
    put32(b, 0x06054b50u); put16(b, 0); put16(b, 0); put16(b, 0xFFFF); put16(b, 0xFFFF);
    put32(b, 0xFFFFFFFFu); put32(b, 0xFFFFFFFFu); put16(b, 0);
}

static ent stored(const char *name, const bytes *d) {
    return (ent){name, d->p, d->n, d->n, (uint32_t)crc32(0, d->p, (uInt)d->n), 0};
}

/* ------------------------------------------------------------ pickles */

/* BINUNICODE s */
static void pk_str(bytes *b, const char *s) { put8(b, 'X'); put32(b, (uint32_t)strlen(s)); puts_(b, s); }

/* ('storage', torch.ByteStorage, key, 'cpu', numel) as BINPERSID */
static void pk_storage(bytes *b, const char *key, uint64_t numel) {
    put8(b, '(');
    pk_str(b, "storage");
    puts_(b, "ctorch\nByteStorage\n");
    pk_str(b, key);
    pk_str(b, "cpu");
    put8(b, 0x8a); put8(b, 8); put64(b, numel); /* LONG1 */
    puts_(b, "tQ");
}

/* {"s0": storage 0, ...}: n bare storages of numel bytes each */
static void pk_storages(bytes *b, int n, uint64_t numel) {
    puts_(b, "\x80\x02}(");
    for (int i = 0; i < n; i++) {
        char key[8], name[8];
        snprintf(key, sizeof key, "%d", i);
        snprintf(name, sizeof name, "s%d", i);
        pk_str(b, name);
        pk_storage(b, key, numel);
    }
    puts_(b, "u.");
}

/* a tuple of `lists` lists of `items` Nones each, appended 1000 at a time
 * (as pickle writes them) */
static void pk_lists(bytes *b, int lists, long items) {
    puts_(b, "\x80\x02(");
    for (int l = 0; l < lists; l++) {
        put8(b, ']');
        for (long i = 0; i < items; i += 1000) {
            put8(b, '(');
            long k = items - i < 1000 ? items - i : 1000;
            for (long j = 0; j < k; j++) put8(b, 'N');
            put8(b, 'e');
        }
    }
    puts_(b, "t.");
}

/* ------------------------------------------------------------ loads */

static char tmpdir[] = "/tmp/needle-test-budget.XXXXXX";

/* loads b in memory and from a file with opts: both give status want and
 * mention s1 and s2 */
static void expect_at(int line, const char *what, const bytes *b, const nd_torch_opts *o, nd_status want,
                      const char *s1, const char *s2) {
    nd_torch_file *f = NULL;
    nd_status st = nd_torch_load_memory("load_torch", "budget.pt", b->p, b->n, o, &f);
    nd_torch_free(f);
    expect_err_at(__FILE__, line, what, st, want, want ? s1 : NULL, want ? s2 : NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/budget.pt", tmpdir);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(b->p, 1, b->n, fp) != b->n || fclose(fp) != 0) { printf("cannot write %s\n", path); exit(1); }
    f = NULL;
    st = nd_torch_load("load_torch", path, o, &f);
    nd_torch_free(f);
    unlink(path);
    expect_err_at(__FILE__, line, what, st, want, want ? s1 : NULL, want ? s2 : NULL);
}
#define EXPECT(what, b, o, want, s1, s2) expect_at(__LINE__, what, b, o, want, s1, s2)

/* The first file: four deflated storages of 1.25 GiB each. */
static void test_four_deflated_storages(void) {
    const uint64_t claim = (uint64_t)5 << 28; /* 1.25 GiB */
    const size_t comp = (size_t)(claim / 1000); /* enough compressed bytes for deflate's 1032:1 */
    bytes pkl = {0}, b = {0};
    pk_storages(&pkl, 4, claim);
    uint8_t *junk = malloc(comp);
    memset(junk, 0xA5, comp); /* not a deflate stream: inflating it would fail at once */
    ent es[5] = {stored("archive/data.pkl", &pkl)};
    const char *names[4] = {"archive/data/0", "archive/data/1", "archive/data/2", "archive/data/3"};
    for (int i = 0; i < 4; i++) es[1 + i] = (ent){names[i], junk, comp, claim, 0, 8};
    zip(&b, es, 5);
    CHECKM(b.n < 6 << 20, "the archive has %zu bytes", b.n);
    EXPECT("5 GiB of deflated storages", &b, NULL, ND_ERR_MEMORY,
           "its 4 deflated storages decompress to 5368709120 bytes in all", "max_decompressed_bytes");
    EXPECT("5 GiB of deflated storages", &b, NULL, ND_ERR_MEMORY, "limit of 4294967296 decompressed bytes per load",
           NULL);
    nd_torch_opts small = {.max_decompressed_bytes = claim * 4 - 1};
    EXPECT("a budget one byte short", &b, &small, ND_ERR_MEMORY, "limit of 5368709119", "max_decompressed_bytes");
    free(junk);
    free(pkl.p);
    free(b.p);
}

/* The same budget on a small archive that loads: the deflated data.pkl and
 * storages count, to the byte. */
static void test_small_budget(void) {
    bytes pkl = {0}, b = {0};
    pk_storages(&pkl, 2, 1000);
    uint8_t data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7);
    uint8_t *dz, *pz;
    size_t dn = raw_deflate(data, sizeof data, &dz), pn = raw_deflate(pkl.p, pkl.n, &pz);
    uint32_t dcrc = (uint32_t)crc32(0, data, sizeof data);
    ent es[3] = {{"archive/data.pkl", pz, pn, pkl.n, (uint32_t)crc32(0, pkl.p, (uInt)pkl.n), 8},
                 {"archive/data/0", dz, dn, 1000, dcrc, 8},
                 {"archive/data/1", dz, dn, 1000, dcrc, 8}};
    zip(&b, es, 3);
    nd_torch_opts o = {.max_decompressed_bytes = pkl.n + 2000};
    EXPECT("a budget of exactly what the file needs", &b, &o, ND_OK, NULL, NULL);
    o.max_decompressed_bytes = pkl.n + 1999;
    EXPECT("a budget one byte short", &b, &o, ND_ERR_MEMORY, "its 2 deflated storages decompress to 2000 bytes",
           "max_decompressed_bytes");
    o.max_decompressed_bytes = pkl.n - 1;
    EXPECT("a budget short of data.pkl", &b, &o, ND_ERR_MEMORY, "entry 'archive/data.pkl' decompresses to",
           "max_decompressed_bytes");
    free(dz);
    free(pz);
    free(pkl.p);
    free(b.p);
}

/* The second file: four lists of 15 million items. */
static void test_four_long_lists(void) {
    bytes pkl = {0}, b = {0};
    pk_lists(&pkl, 4, 15000000);
    uint8_t *pz;
    size_t pn = raw_deflate(pkl.p, pkl.n, &pz);
    ent es[1] = {{"archive/data.pkl", pz, pn, pkl.n, (uint32_t)crc32(0, pkl.p, (uInt)pkl.n), 8}};
    zip(&b, es, 1);
    CHECKM(b.n < 200 << 10, "the archive has %zu bytes", b.n);
    char want[64];
    snprintf(want, sizeof want, "more than %u items", ND_PK_DEFAULT_MAX_ITEMS);
    EXPECT("60 million list items", &b, NULL, ND_ERR_MEMORY, want, "max_items");
    /* the unpickler alone, with the default and with a raised limit */
    nd_pk_doc *d = NULL;
    EXPECT_ERR("nd_pickle_load", nd_pickle_load("load_torch", "data.pkl", pkl.p, pkl.n, &d), ND_ERR_MEMORY, want,
               "max_items");
    nd_pk_limits lim = {.max_items = (uint64_t)1 << 23};
    EXPECT_ERR("nd_pickle_load_limited", nd_pickle_load_limited("load_torch", "data.pkl", pkl.p, pkl.n, &lim, &d),
               ND_ERR_MEMORY, "more than 8388608 items", "max_items");
    free(pz);
    free(pkl.p);
    free(b.p);
}

/* Items counted to the item: 3 lists of 100 in a tuple of 3 are 303
 * elements and 5 values (the lists, the tuple, and None, built once and
 * then shared). */
static void test_small_items(void) {
    bytes pkl = {0}, b = {0};
    pk_lists(&pkl, 3, 100);
    ent es[1] = {stored("archive/data.pkl", &pkl)};
    zip(&b, es, 1);
    nd_torch_opts o = {.max_items = 308};
    EXPECT("max_items of exactly what the file holds", &b, &o, ND_OK, NULL, NULL);
    o.max_items = 307;
    EXPECT("max_items one short", &b, &o, ND_ERR_MEMORY, "more than 307 items", "max_items");
    free(pkl.p);
    free(b.p);
}

/* Values that are built and dropped again (BININT1 1, POP) stay in the
 * unpickler's memory: they are charged too, so a small file cannot build
 * hundreds of megabytes of them. */
static void popped_values(bytes *b, long n) {
    bytes pkl = {0};
    puts_(&pkl, "\x80\x02");
    for (long i = 0; i < n; i++) puts_(&pkl, "K\x01" "0");
    puts_(&pkl, "N.");
    uint8_t *pz;
    size_t pn = raw_deflate(pkl.p, pkl.n, &pz);
    ent es[1] = {{"archive/data.pkl", pz, pn, pkl.n, (uint32_t)crc32(0, pkl.p, (uInt)pkl.n), 8}};
    zip(b, es, 1);
    free(pz);
    free(pkl.p);
}

static void test_popped_values(void) {
    bytes b = {0};
    popped_values(&b, (long)ND_PK_DEFAULT_MAX_ITEMS + 1000);
    CHECKM(b.n < 100 << 10, "the archive has %zu bytes", b.n);
    char want[64];
    snprintf(want, sizeof want, "more than %u items", ND_PK_DEFAULT_MAX_ITEMS);
    EXPECT("values pushed and popped", &b, NULL, ND_ERR_MEMORY, want, "max_items");
    free(b.p);
    b = (bytes){0};
    popped_values(&b, 1000); /* 1000 integers and the None returned */
    nd_torch_opts o = {.max_items = 1001};
    EXPECT("values pushed and popped, with room for them", &b, &o, ND_OK, NULL, NULL);
    o.max_items = 1000;
    EXPECT("values pushed and popped, one short", &b, &o, ND_ERR_MEMORY, "more than 1000 items", "max_items");
    free(b.p);
}

int main(void) {
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_four_deflated_storages();
    test_small_budget();
    test_four_long_lists();
    test_small_items();
    test_popped_values();
    rmdir(tmpdir);
    if (failures) {
        printf("%d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("%d checks passed\n", checks);
    return 0;
}
