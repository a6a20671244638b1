/* tests/c/byte_writer.h - a growable little-endian byte buffer and raw
 * deflate, for the C tests that build files (zip archives, pickles, torch
 * checkpoints) byte by byte. Header only, like check.h. */
#ifndef NEEDLE_TESTS_BYTE_WRITER_H
#define NEEDLE_TESTS_BYTE_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct { uint8_t *p; size_t n, cap; } bytes;

static inline void put(bytes *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p) { printf("out of memory\n"); exit(1); }
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void put8(bytes *b, uint8_t v) { put(b, &v, 1); }
static inline void put16(bytes *b, uint16_t v) { put8(b, (uint8_t)v); put8(b, (uint8_t)(v >> 8)); }
static inline void put32(bytes *b, uint32_t v) { put16(b, (uint16_t)v); put16(b, (uint16_t)(v >> 16)); }
static inline void put64(bytes *b, uint64_t v) { put32(b, (uint32_t)v); put32(b, (uint32_t)(v >> 32)); }
static inline void puts_(bytes *b, const char *s) { put(b, s, strlen(s)); }
static inline void set16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void set32(uint8_t *p, uint32_t v) { set16(p, (uint16_t)v); set16(p + 2, (uint16_t)(v >> 16)); }

/* n bytes of src as a raw deflate stream (no zlib or gzip wrapper, as zip
 * entries hold them) in a malloc'd *out; returns its length. */
static inline size_t raw_deflate(const void *src, size_t n, uint8_t **out) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) exit(1);
    size_t cap = deflateBound(&zs, (uLong)n) + 16;
    *out = malloc(cap);
    if (!*out) { printf("out of memory\n"); exit(1); }
    zs.next_in = (Bytef *)src;
    zs.avail_in = (uInt)n;
    zs.next_out = *out;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) exit(1);
    size_t k = zs.total_out;
    deflateEnd(&zs);
    return k;
}

#endif
