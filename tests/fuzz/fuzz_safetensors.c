/* fuzz_safetensors.c - libFuzzer harness for the safetensors reader
 * (nd_st_load_memory): header parsing, validation and tensor creation.
 * An accepted file's tensors are read back in full. Every input also goes
 * through the format detection (nd_detect_format, src/io/format.c), which
 * must not fail on bytes in memory and must call every file the reader
 * accepts safetensors (nd.load would otherwise hand it to another reader). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "io/io.h"
#include "io/safetensors.h"
#include "needle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nd_io_src src = nd_src_memory("fuzz", "input", data, size);
    nd_file_format fmt;
    if (nd_detect_format(&src, &fmt) != ND_OK) abort();
    nd_st_header *h = NULL;
    nd_tensor **t = NULL;
    if (nd_st_load_memory("fuzz", "input", data, size, &h, &t) != ND_OK) return 0;
    if (fmt != ND_FMT_SAFETENSORS) abort(); /* a valid file detected as something else */
    for (size_t i = 0; i < h->ntensors; i++) {
        size_t bytes = (size_t)(h->tensors[i].end - h->tensors[i].begin);
        void *buf = malloc(bytes ? bytes : 1);
        if (buf && nd_copy_to_buffer(t[i], buf, bytes) != ND_OK) abort(); /* sizes must agree */
        free(buf);
    }
    nd_st_free_tensors(t, h->ntensors);
    nd_st_header_free(h);
    return 0;
}
