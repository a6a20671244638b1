/* test_io_format.c - nd_detect_format (src/io/format.c), the one place that
 * says what a file is for nd.load, nd.load_torch and checkpoints, at every
 * boundary: safetensors header lengths whose low bytes read like a pickle
 * protocol header (0x80 0x02..0x05: 640, 896, 1152, 1408, plus multiples of
 * 65536) or whose bytes spell "PK\3\4", every header length from 2 to 1499,
 * the limits of a plausible header length (2, the 100 MB cap, the file's
 * end) and of '{' at offset 8; zips by their end record (also after a
 * prefix, with a comment, empty); torch's legacy magic number at every
 * pickle protocol, cut short, and a bare pickle without it; files that are
 * none of these. Each case is checked in memory and from a file. What is
 * not a regular file (a directory, a FIFO, a device, a socket) is refused
 * at once for reading, and a save does not replace it. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "check.h"
#include "io/io.h"
#include "io/safetensors.h"

static char tmpdir[] = "/tmp/needle-test-format.XXXXXX";

static const char *name(nd_file_format f) { return nd_file_format_name(f); }

/* the format of b[0, n) in memory and as a file */
static void expect_at(int line, const char *what, const void *b, size_t n, nd_file_format want) {
    nd_io_src m = nd_src_memory("detect", what, b, n);
    nd_file_format got = ND_FMT_UNKNOWN;
    checks++;
    nd_status st = nd_detect_format(&m, &got);
    if (st != ND_OK || got != want)
        FAIL_AT(line, "%s (%zu bytes, memory): got %s (%s), expected %s", what, n, name(got),
                st == ND_OK ? "ok" : nd_last_error(), name(want));
    char path[128];
    snprintf(path, sizeof path, "%s/f", tmpdir);
    /* trailing zeros as a hole: the 100 MB headers cost no disk */
    size_t used = n;
    while (used > 0 && ((const unsigned char *)b)[used - 1] == 0) used--;
    FILE *f = fopen(path, "wb");
    if (!f || (used && fwrite(b, 1, used, f) != used) || fflush(f) != 0 || ftruncate(fileno(f), (off_t)n) != 0 ||
        fclose(f) != 0) { printf("cannot write %s\n", path); exit(1); }
    nd_io_src s;
    checks++;
    if (nd_src_open("detect", path, &s) != ND_OK) {
        FAIL_AT(line, "%s: cannot open: %s", what, nd_last_error());
        return;
    }
    got = ND_FMT_UNKNOWN;
    st = nd_detect_format(&s, &got);
    nd_src_close(&s);
    if (st != ND_OK || got != want)
        FAIL_AT(line, "%s (%zu bytes, file): got %s (%s), expected %s", what, n, name(got),
                st == ND_OK ? "ok" : nd_last_error(), name(want));
}
#define EXPECT(what, b, n, want) expect_at(__LINE__, what, b, n, want)

/* A safetensors-shaped buffer: header length hl, '{' (or c) at 8, and
 * total bytes in all (zeros after the '{'). */
static unsigned char *st_like(uint64_t hl, unsigned char c, size_t total) {
    unsigned char *b = calloc(total ? total : 1, 1);
    if (!b) { printf("out of memory\n"); exit(1); }
    for (int i = 0; i < 8 && (size_t)i < total; i++) b[i] = (unsigned char)(hl >> (8 * i));
    if (total > 8) b[8] = c;
    return b;
}

static void test_safetensors(void) {
    /* a real file of the writer */
    nd_tensor *t;
    OK(nd_zeros(S(2, 3), ND_FLOAT32, &t));
    nd_st_entry e = {"w", 1, t};
    char *buf;
    size_t n;
    OK(nd_st_save_memory("save", &e, 1, NULL, 0, &buf, &n));
    nd_release(t);
    EXPECT("written by nd_st_save_memory", buf, n, ND_FMT_SAFETENSORS);
    free(buf);

    /* header lengths whose first two bytes are 0x80 0x02..0x05, with and
     * without multiples of 65536 (and 2^32) added */
    const uint64_t lows[] = {640, 896, 1152, 1408};
    const uint64_t highs[] = {0, 65536, 3 * 65536, 100 * 65536, (uint64_t)1 << 24};
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < sizeof highs / sizeof *highs; j++) {
            uint64_t hl = lows[i] + highs[j];
            unsigned char *b = st_like(hl, '{', (size_t)(8 + hl));
            char what[64];
            snprintf(what, sizeof what, "header length %llu", (unsigned long long)hl);
            CHECKM(b[0] == 0x80 && b[1] >= 2 && b[1] <= 5, "%s does not start like a pickle", what);
            EXPECT(what, b, (size_t)(8 + hl), ND_FMT_SAFETENSORS);
            free(b);
        }
    /* every header length from 2 to 1499 */
    for (uint64_t hl = 2; hl < 1500; hl++) {
        unsigned char *b = st_like(hl, '{', (size_t)(8 + hl + 16));
        char what[64];
        snprintf(what, sizeof what, "header length %llu (+16 data bytes)", (unsigned long long)hl);
        EXPECT(what, b, (size_t)(8 + hl + 16), ND_FMT_SAFETENSORS);
        free(b);
    }
    /* a header length spelling "PK\3\4" (67 MB, under the 100 MB cap) */
    uint64_t pk = 0x04034b50u;
    unsigned char *b = st_like(pk, '{', (size_t)(8 + pk));
    CHECK(memcmp(b, "PK\3\4", 4) == 0);
    EXPECT("header length spelling PK\\3\\4", b, (size_t)(8 + pk), ND_FMT_SAFETENSORS);
    /* ...that the file cannot hold: a zip's first local header, not safetensors */
    EXPECT("header length spelling PK\\3\\4, file too short", b, 4096, ND_FMT_ZIP);
    free(b);

    /* the limits of a plausible header */
    b = st_like(2, '{', 10);
    EXPECT("header length 2, file of 10 bytes", b, 10, ND_FMT_SAFETENSORS);
    EXPECT("header length 2, file of 9 bytes", b, 9, ND_FMT_UNKNOWN);
    free(b);
    b = st_like(1, '{', 9);
    EXPECT("header length 1", b, 9, ND_FMT_UNKNOWN);
    free(b);
    b = st_like(0, '{', 9);
    EXPECT("header length 0", b, 9, ND_FMT_UNKNOWN);
    free(b);
    b = st_like(100, ' ', 108);
    EXPECT("no '{' at offset 8", b, 108, ND_FMT_UNKNOWN);
    free(b);
    b = st_like(100, '{', 107);
    EXPECT("header length one past the end", b, 107, ND_FMT_UNKNOWN);
    free(b);
    b = st_like(ND_ST_MAX_HEADER, '{', (size_t)(8 + ND_ST_MAX_HEADER));
    EXPECT("header length at the cap", b, (size_t)(8 + ND_ST_MAX_HEADER), ND_FMT_SAFETENSORS);
    free(b);
    b = st_like(ND_ST_MAX_HEADER + 1, '{', (size_t)(9 + ND_ST_MAX_HEADER));
    EXPECT("header length one over the cap", b, (size_t)(9 + ND_ST_MAX_HEADER), ND_FMT_UNKNOWN);
    free(b);
    b = st_like(UINT64_MAX, '{', 64);
    EXPECT("header length 2^64-1", b, 64, ND_FMT_UNKNOWN);
    free(b);

    /* JSON whitespace before the '{' (the reader skips it), also past the
     * first bytes read; only whitespace, or whitespace past the header, is not */
    const size_t wss[] = {1, 23, 24, 300, 1000};
    for (size_t i = 0; i < sizeof wss / sizeof *wss; i++) {
        size_t ws = wss[i], total = 8 + ws + 2;
        b = st_like(ws + 2, ' ', total);
        for (size_t k = 0; k < ws; k++) b[8 + k] = " \t\n\r"[k % 4];
        memcpy(b + 8 + ws, "{}", 2);
        char what[64];
        snprintf(what, sizeof what, "%zu whitespace bytes before the '{'", ws);
        EXPECT(what, b, total, ND_FMT_SAFETENSORS);
        b[8 + ws] = ' ';
        snprintf(what, sizeof what, "%zu whitespace bytes, then no '{'", ws);
        EXPECT(what, b, total, ND_FMT_UNKNOWN);
        memcpy(b + 8 + ws, "{}", 2);
        for (int k = 0; k < 8; k++) b[k] = (unsigned char)((ws >> (8 * k)) & 0xFF); /* the header ends before it */
        snprintf(what, sizeof what, "%zu whitespace bytes are the whole header", ws);
        EXPECT(what, b, total, ND_FMT_UNKNOWN);
        free(b);
    }

    /* tensor data that ends like a zip's end record: still safetensors */
    size_t total = 8 + 16 + 22;
    b = st_like(16, '{', total);
    memcpy(b + total - 22, "PK\5\6", 4);
    EXPECT("safetensors ending in an end-of-central-directory record", b, total, ND_FMT_SAFETENSORS);
    free(b);
}

/* the smallest zip: an end record (optionally after a prefix and with a comment) */
static void test_zip(void) {
    unsigned char eocd[22] = {'P', 'K', 5, 6};
    EXPECT("an empty zip archive", eocd, sizeof eocd, ND_FMT_ZIP);
    unsigned char withc[1 + 22 + 5] = {'x'}; /* (a file that starts with "PK\5\6" is a zip anyway) */
    memcpy(withc + 1, eocd, 22);
    withc[1 + 20] = 5;
    memcpy(withc + 1 + 22, "notes", 5);
    EXPECT("an empty zip with a comment", withc, sizeof withc, ND_FMT_ZIP);
    withc[1 + 20] = 4; /* the comment length does not reach the end */
    EXPECT("an end record whose comment length is wrong", withc, sizeof withc, ND_FMT_UNKNOWN);
    unsigned char pre[64 + 22];
    memset(pre, 'x', 64);
    memcpy(pre + 64, eocd, 22);
    EXPECT("an end record after 64 bytes of text", pre, sizeof pre, ND_FMT_ZIP);
    /* the end record may be 65535 + 22 bytes from the end, not more */
    size_t far = 22 + 0xFFFF;
    unsigned char *b = calloc(far + 2, 1);
    b[0] = 'x';
    memcpy(b + 1, eocd, 22);
    b[21] = 0xFF;
    b[22] = 0xFF;
    memset(b + 23, ' ', far - 22);
    EXPECT("an end record with the longest comment", b, far + 1, ND_FMT_ZIP);
    b[far + 1] = ' ';
    EXPECT("an end record farther from the end than a comment can reach", b, far + 2, ND_FMT_UNKNOWN);
    free(b);
    /* a torch checkpoint, and a truncated zip (its first local header) */
    FILE *f = fopen("spec/fixtures/torch_ckpt/mlp.pt", "rb");
    if (!f) { FAIL("cannot open spec/fixtures/torch_ckpt/mlp.pt"); return; }
    static unsigned char pt[1 << 16];
    size_t n = fread(pt, 1, sizeof pt, f);
    fclose(f);
    CHECK(n > 1000 && n < sizeof pt);
    EXPECT("spec/fixtures/torch_ckpt/mlp.pt", pt, n, ND_FMT_ZIP);
    EXPECT("mlp.pt cut in half", pt, n / 2, ND_FMT_ZIP);
    EXPECT("mlp.pt cut to 4 bytes", pt, 4, ND_FMT_ZIP);
    EXPECT("mlp.pt cut to 3 bytes", pt, 3, ND_FMT_UNKNOWN);
}

static void test_legacy(void) {
    static const unsigned char magic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    unsigned char b[64];
    for (int proto = 2; proto <= 5; proto++) {
        size_t n = 0;
        b[n++] = 0x80;
        b[n++] = (unsigned char)proto;
        if (proto >= 4) { /* FRAME of the 13 bytes that follow */
            b[n++] = 0x95;
            for (int i = 0; i < 8; i++) b[n++] = i == 0 ? (unsigned char)sizeof magic : 0;
        }
        memcpy(b + n, magic, sizeof magic);
        n += sizeof magic;
        char what[64];
        snprintf(what, sizeof what, "legacy magic, protocol %d", proto);
        EXPECT(what, b, n, ND_FMT_TORCH_LEGACY);
        snprintf(what, sizeof what, "legacy magic, protocol %d, its last byte cut", proto);
        EXPECT(what, b, n - 2, ND_FMT_UNKNOWN);
        b[n - 3] ^= 1; /* one bit of the number */
        snprintf(what, sizeof what, "legacy magic, protocol %d, one bit off", proto);
        EXPECT(what, b, n, ND_FMT_UNKNOWN);
    }
    const char *text = "L119547037146038801333356L\n.";
    EXPECT("legacy magic, protocol 0/1 text", text, strlen(text), ND_FMT_TORCH_LEGACY);
    /* a bare pickle that is not torch's: 80 02 then a GLOBAL */
    const char *bare = "\x80\x02" "cos\nsystem\n";
    EXPECT("a bare pickle without the magic", bare, strlen(bare), ND_FMT_UNKNOWN);
    /* the real legacy file of the fixtures */
    FILE *f = fopen("spec/fixtures/torch_ckpt/legacy.pt", "rb");
    if (!f) { FAIL("cannot open spec/fixtures/torch_ckpt/legacy.pt"); return; }
    static unsigned char lb[1 << 16];
    size_t n = fread(lb, 1, sizeof lb, f);
    fclose(f);
    EXPECT("spec/fixtures/torch_ckpt/legacy.pt", lb, n, ND_FMT_TORCH_LEGACY);
}

static void test_neither(void) {
    EXPECT("an empty file", "", 0, ND_FMT_UNKNOWN);
    EXPECT("one byte", "{", 1, ND_FMT_UNKNOWN);
    EXPECT("text", "not a checkpoint at all", 23, ND_FMT_UNKNOWN);
    const unsigned char gz[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT("a gzip file", gz, sizeof gz, ND_FMT_UNKNOWN);
    EXPECT("PK without 3 4", "PK\1\2 and so on", 15, ND_FMT_UNKNOWN);
    /* a pseudo-random sweep: nothing crashes, reads out of bounds or fails */
    uint32_t x = 12345;
    unsigned char r[200];
    for (int i = 0; i < 2000; i++) {
        size_t n = (size_t)(i % 200);
        for (size_t k = 0; k < n; k++) { x = x * 1664525u + 1013904223u; r[k] = (unsigned char)(x >> 24); }
        if (i % 7 == 0 && n >= 4) memcpy(r + n - 4, "PK\5\6", 4);
        nd_io_src m = nd_src_memory("detect", "random", r, n);
        nd_file_format got;
        checks++;
        if (nd_detect_format(&m, &got) != ND_OK) FAIL("random input %d failed: %s", i, nd_last_error());
    }
}

static void test_not_a_file(void) {
    nd_io_src s;
    EXPECT_ERR("a directory", nd_src_open("detect", tmpdir, &s), ND_ERR_IO, "Is a directory", tmpdir);
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmpdir);
    if (mkfifo(fifo, 0600) != 0) { perror("mkfifo"); return; }
    /* returns at once (opening a FIFO for reading would wait for a writer) */
    EXPECT_ERR("a FIFO", nd_src_open("detect", fifo, &s), ND_ERR_IO, "not a regular file (a FIFO)", fifo);
    unlink(fifo);
    EXPECT_ERR("a character device", nd_src_open("detect", "/dev/null", &s), ND_ERR_IO,
               "not a regular file (a character device)", "/dev/null");
    /* a socket: neither read nor replaced */
    char sock[64]; /* fits sun_path */
    snprintf(sock, sizeof sock, "%s/sock", tmpdir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { perror("socket"); return; }
    EXPECT_ERR("a socket", nd_src_open("detect", sock, &s), ND_ERR_IO, "not a regular file (a socket)", sock);
    EXPECT_ERR("replacing a socket", nd_write_file_atomic("save", sock, "x", 1), ND_ERR_IO,
               "cannot replace", "it is a socket, not a regular file");
    struct stat sb;
    CHECK(stat(sock, &sb) == 0 && S_ISSOCK(sb.st_mode));
    close(fd);
    unlink(sock);
}

int main(void) {
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_safetensors();
    test_zip();
    test_legacy();
    test_neither();
    test_not_a_file();
    char path[128];
    snprintf(path, sizeof path, "%s/f", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    if (failures) {
        printf("%d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("%d checks passed\n", checks);
    return 0;
}
