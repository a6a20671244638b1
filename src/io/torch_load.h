/* torch_load.h - PyTorch checkpoints (torch.save, zip format) without Python.
 *
 * A checkpoint is a zip archive <root>/data.pkl + <root>/data/<key> (one
 * entry per storage) + <root>/version (and .data/ files newer versions add);
 * <root> is any single folder name. nd_torch_load opens the file (read with
 * pread, never mapped: a file truncated while it is read fails with an
 * error), opens the zip (zip.h), unpickles data.pkl (pickle.h) and
 * materialises every
 * ND_PK_STORAGE as one nd_storage read from data/<key> (its size must be
 * numel * element size, exactly) and every ND_PK_TENSOR as an nd_tensor
 * over it: offset + sum((shape-1)*stride) must lie inside the storage
 * (overflow-checked), so tensors that share a storage stay views of one
 * buffer. int8/int16 storages become int32 tensors (needle has no narrower
 * signed integers); float16/bfloat16 stay half unless opts->half_to_float.
 * A storage is converted as a whole (widened or read into float32), so
 * views of it keep sharing memory either way. Storage nodes that name the
 * same entry with the same element type (torch writes one per view) share
 * one nd_storage; the same entry read as two element types (a torch >= 2
 * dtype view) gives two storages that do not share memory.
 *
 * Budget: a load reads at most max_decompressed_bytes out of deflated
 * entries (all of them together, checked for every storage before any is
 * read) and builds at most max_items items in the pickle (values and
 * container elements, pickle.h); the error names the limit and the option
 * that raises it.
 *
 * What the file is comes from nd_detect_format (io.h): the legacy (pre-1.6)
 * format fails with a message saying how to re-save it, a safetensors file
 * with one pointing at nd.load. Errors read "<op>: '<path>': ..." */
#ifndef ND_TORCH_LOAD_H
#define ND_TORCH_LOAD_H

#include <stdbool.h>
#include "needle.h"
#include "io/io.h"
#include "io/pickle.h"

#define ND_TORCH_DEFAULT_MAX_DECOMPRESSED ((uint64_t)4 << 30) /* 4 GiB per load */

typedef struct {
    bool half_to_float;              /* float16/bfloat16 -> float32 */
    uint64_t max_decompressed_bytes; /* bytes inflated from deflated entries, all together
                                        (0: ND_TORCH_DEFAULT_MAX_DECOMPRESSED) */
    uint64_t max_items;              /* values and container elements of the pickle, all together
                                        (0: ND_PK_DEFAULT_MAX_ITEMS) */
} nd_torch_opts;

typedef struct nd_torch_file {
    nd_pk_doc *doc;            /* the unpickled object; tensor nodes have u.tensor.user set
                                  to their nd_tensor* (owned by this file) */
    void *_impl;
} nd_torch_file;

nd_status nd_torch_load(const char *op, const char *path, const nd_torch_opts *opts,
                        nd_torch_file **out);
/* The same from bytes in memory (fuzzing, tests); what names them in messages.
 * Nothing in the result points into buf. */
nd_status nd_torch_load_memory(const char *op, const char *what, const void *buf, size_t len,
                               const nd_torch_opts *opts, nd_torch_file **out);
/* The nd_tensor of an ND_PK_TENSOR node (borrowed). */
static inline nd_tensor *nd_torch_tensor(const nd_pk *v) { return (nd_tensor *)v->u.tensor.user; }
/* An ND_PK_STORAGE node reached directly (torch.save of a bare storage) as a
 * new 1-D tensor over all its elements (the caller releases it). */
nd_status nd_torch_storage_tensor(const nd_pk *storage, nd_tensor **out);
void nd_torch_free(nd_torch_file *f);

#endif
