/* fuzz_zip.c - libFuzzer harness for the zip reader (src/io/zip.c): open
 * the archive, look every entry up by name and read it (stored entries in
 * place, deflated ones through zlib, at most 16 MiB each), touching every
 * byte returned. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "io/zip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nd_zip *z = NULL;
    if (nd_zip_open("fuzz", "input", data, size, &z) != ND_OK) return 0;
    static volatile unsigned sum;
    for (size_t i = 0; i < z->n; i++) {
        if (nd_zip_find(z, z->entries[i].name, z->entries[i].name_len) != (int64_t)i) abort();
        const uint8_t *p = NULL;
        size_t len = 0;
        void *owned = NULL;
        if (nd_zip_read(z, i, 1u << 24, &p, &len, &owned) == ND_OK) {
            if (len != z->entries[i].size) abort();
            for (size_t k = 0; k < len; k++) sum += p[k];
        }
        free(owned);
    }
    (void)sum; /* every byte was read (ASan checks the reads) */
    nd_zip_close(z);
    return 0;
}
