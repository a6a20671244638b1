/* fuzz_zip.c - libFuzzer harness for the zip reader (src/io/zip.c): open
 * the archive, look every entry up by name and read it (stored entries in
 * place, deflated ones through zlib, at most 16 MiB each), touching every
 * byte returned, and again with nd_zip_read_into, which must agree. An
 * archive the reader opens must be one the format detection
 * (nd_detect_format) does not call unknown: it found its end record the
 * same way (or took it for one of the formats tested first). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "io/io.h"
#include "io/zip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nd_io_src src = nd_src_memory("fuzz", "input", data, size);
    nd_file_format fmt;
    if (nd_detect_format(&src, &fmt) != ND_OK) abort();
    nd_zip *z = NULL;
    if (nd_zip_open("fuzz", "input", data, size, &z) != ND_OK) return 0;
    if (fmt == ND_FMT_UNKNOWN) abort();
    static volatile unsigned sum;
    for (size_t i = 0; i < z->n; i++) {
        if (nd_zip_find(z, z->entries[i].name, z->entries[i].name_len) != (int64_t)i) abort();
        const uint8_t *p = NULL;
        size_t len = 0;
        void *owned = NULL;
        nd_status st = nd_zip_read(z, i, 1u << 24, &p, &len, &owned);
        if (st == ND_OK) {
            if (len != z->entries[i].size) abort();
            for (size_t k = 0; k < len; k++) sum += p[k];
        }
        /* read straight into a buffer: the same result, the same bytes */
        if (z->entries[i].size <= (1u << 24)) {
            uint8_t *dst = malloc(z->entries[i].size ? z->entries[i].size : 1);
            nd_status st2 = dst ? nd_zip_read_into(z, i, dst, z->entries[i].size) : st;
            if (dst && (st2 == ND_OK) != (st == ND_OK)) abort();
            if (dst && st == ND_OK && len && memcmp(dst, p, len) != 0) abort();
            free(dst);
        }
        free(owned);
    }
    (void)sum; /* every byte was read (ASan checks the reads) */
    nd_zip_close(z);
    return 0;
}
