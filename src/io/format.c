/* format.c - what a file is (io.h: nd_detect_format), decided in one place
 * from the file's structure for every loader. A first-bytes guess does not
 * work: a safetensors file starts with its header length, and the lengths
 * whose low bytes are 0x80 0x02..0x05 (640, 896, 1152, 1408, plus any
 * multiple of 65536) start like a pickle; one whose bytes spell "PK\3\4"
 * starts like a zip. */
#include <stdbool.h>
#include <string.h>
#include "io/io.h"
#include "io/safetensors.h"
#include "io/zip.h"
#include "tensor.h"

/* torch.save's legacy format starts with the pickle of this number
 * (torch/serialization.py: MAGIC_NUMBER = 0x1950a86a20f9469cfc6c): LONG1 of
 * 10 little-endian bytes. */
static const unsigned char LEGACY_MAGIC[12] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                               0x20, 0x6a, 0xa8, 0x50, 0x19};
/* protocols 0 and 1 (no LONG1): LONG in decimal text */
static const char LEGACY_MAGIC_TEXT[] = "L119547037146038801333356L\n";

/* The pickled magic number at the start of the file: PROTO 2..5, for
 * protocols 4 and 5 a FRAME, then LONG1 and the number; or, without PROTO,
 * the decimal LONG of protocols 0 and 1. b holds the first n bytes. */
static bool is_legacy_torch(const unsigned char *b, size_t n) {
    size_t at = 0;
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) {
        at = 2;
        if (b[1] >= 4 && n > at && b[at] == 0x95) at += 9; /* FRAME + 8-byte length */
        return n >= at + sizeof LEGACY_MAGIC && memcmp(b + at, LEGACY_MAGIC, sizeof LEGACY_MAGIC) == 0;
    }
    size_t tl = sizeof LEGACY_MAGIC_TEXT - 1;
    return n >= tl && memcmp(b, LEGACY_MAGIC_TEXT, tl) == 0;
}

/* A plausible safetensors header: 2 <= N <= the cap and 8 + N <= size
 * ("{}" is the smallest header), and '{' at offset 8, after any JSON
 * whitespace the reader would skip (the format says '{' comes first, but
 * the reader accepts whitespace: every file it accepts must be detected). */
static nd_status is_safetensors(const nd_io_src *s, const unsigned char *b, size_t n, bool *yes) {
    *yes = false;
    if (n < 9) return ND_OK;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    if (hl < 2 || hl > ND_ST_MAX_HEADER || hl > s->size - 8) return ND_OK;
    unsigned char chunk[256];
    const unsigned char *p = b + 8;
    size_t avail = n - 8;
    for (uint64_t at = 8; at < 8 + hl;) {
        for (size_t i = 0; i < avail && at < 8 + hl; i++, at++) {
            unsigned char c = p[i];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
            *yes = c == '{';
            return ND_OK;
        }
        if (at >= 8 + hl) break;
        avail = 8 + hl - at < sizeof chunk ? (size_t)(8 + hl - at) : sizeof chunk;
        ND_TRY(nd_src_read(s, at, chunk, avail));
        p = chunk;
    }
    return ND_OK;
}

nd_status nd_detect_format(const nd_io_src *s, nd_file_format *out) {
    *out = ND_FMT_UNKNOWN;
    unsigned char head[32];
    size_t n = s->size < sizeof head ? (size_t)s->size : sizeof head;
    ND_TRY(nd_src_read(s, 0, head, n));
    bool st;
    ND_TRY(is_safetensors(s, head, n, &st));
    if (st) {
        *out = ND_FMT_SAFETENSORS;
        return ND_OK;
    }
    if (is_legacy_torch(head, n)) {
        *out = ND_FMT_TORCH_LEGACY;
        return ND_OK;
    }
    bool zip;
    ND_TRY(nd_zip_probe(s, &zip));
    /* a truncated or damaged archive has lost its end record but not its
     * first local header (or the end record of an empty archive): the zip
     * reader says what is wrong with it */
    if (zip || (n >= 4 && head[0] == 'P' && head[1] == 'K' &&
                ((head[2] == 3 && head[3] == 4) || (head[2] == 5 && head[3] == 6))))
        *out = ND_FMT_ZIP;
    return ND_OK;
}

const char *nd_file_format_name(nd_file_format f) {
    switch (f) {
    case ND_FMT_SAFETENSORS: return "safetensors";
    case ND_FMT_ZIP: return "zip";
    case ND_FMT_TORCH_LEGACY: return "torch_legacy";
    case ND_FMT_UNKNOWN: break;
    }
    return "unknown";
}
