/* safetensors.h - the safetensors format (https://huggingface.co/docs/safetensors):
 *
 *   8 bytes   N, little-endian u64
 *   N bytes   JSON: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 *                    "__metadata__": {"<key>": "<value>", ...}}   (padded with spaces)
 *   rest      the byte buffer; tensor bytes are [b, e) of it, row-major, little-endian
 *
 * Files are untrusted input: the reader checks every length, offset, shape and
 * dtype, parses the header with the strict JSON codec of json.h limited to
 * what the format uses (objects, arrays, strings with escapes, integers;
 * UTF-8; duplicate keys rejected; 32 levels) and
 * requires the tensors to cover the buffer exactly, without overlap, as the
 * specification does. Failures are nd_status errors whose message reads
 * "<op>: '<file>': <what is wrong>". */
#ifndef ND_SAFETENSORS_H
#define ND_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "needle.h"

#define ND_ST_MAX_HEADER 100000000ull /* 100 MB, as the reference implementation */

typedef struct {
    char *name; /* NUL-terminated; may contain NULs (\u0000): name_len counts all */
    size_t name_len;
    nd_dtype dtype;
    int ndim;
    int64_t shape[ND_MAX_DIMS];
    uint64_t begin, end; /* [begin, end) of the byte buffer */
} nd_st_info;

typedef struct {
    nd_st_info *tensors; /* in header order */
    size_t ntensors;
    char **meta_keys, **meta_values; /* the __metadata__ strings */
    size_t *meta_key_lens, *meta_value_lens;
    size_t nmeta;
    uint64_t header_len; /* N */
    uint64_t data_len;   /* bytes of the buffer (file size - 8 - N) */
    void *_arena;        /* owns the strings above */
} nd_st_header;

/* Parses and validates a header: `json` is the N header bytes, data_len the
 * size of the byte buffer after it. `op` and `what` (the file) prefix errors. */
nd_status nd_st_parse_header(const char *op, const char *what, const char *json, uint64_t json_len,
                             uint64_t data_len, nd_st_header **out);
void nd_st_header_free(nd_st_header *h);

/* The safetensors dtype name ("F32") of a needle dtype, and back. */
const char *nd_st_dtype_name(nd_dtype dt);

/* Reads a whole file: the header and one new tensor per entry (tensors[i]
 * belongs to header->tensors[i]). Release with nd_st_free_tensors. */
nd_status nd_st_load_file(const char *op, const char *path, nd_st_header **header,
                          nd_tensor ***tensors);
/* The same from memory (what names it in messages). */
nd_status nd_st_load_memory(const char *op, const char *what, const void *buf, size_t len,
                            nd_st_header **header, nd_tensor ***tensors);
/* Only the header of a file (no tensor data is read). */
nd_status nd_st_read_header_file(const char *op, const char *path, nd_st_header **header);
void nd_st_free_tensors(nd_tensor **tensors, size_t n);

/* ---- writing ----
 * Names and metadata must be valid UTF-8 and unique; "__metadata__" is not a
 * tensor name. JSON keys are written sorted (bytewise), __metadata__ first;
 * the data is laid out by element size (largest first), then name, so every
 * tensor is aligned to its element size; the header is padded with spaces to
 * a multiple of 8 bytes (the reference implementation's layout). Tensors may
 * have any strides (written row-major). */
typedef struct { const char *name; size_t name_len; const nd_tensor *tensor; } nd_st_entry;
typedef struct { const char *key; size_t key_len; const char *value; size_t value_len; } nd_st_meta;

/* Atomically replaces path (nd_atomic_*): the old file survives any failure. */
nd_status nd_st_save_file(const char *op, const char *path, const nd_st_entry *entries, size_t n,
                          const nd_st_meta *meta, size_t nmeta);
/* The file's bytes in a malloc'd buffer. */
nd_status nd_st_save_memory(const char *op, const nd_st_entry *entries, size_t n,
                            const nd_st_meta *meta, size_t nmeta, char **out, size_t *len);

#endif
