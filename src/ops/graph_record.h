/* graph_record.h - one recorded backend call of a captured graph (graph.c
 * keeps the list, backend_call.c makes and replays the records). */
#ifndef ND_GRAPH_RECORD_H
#define ND_GRAPH_RECORD_H

#include "backend_call.h"

#define ND_REC_MAX_TENSORS ND_EW_MAX_TENSORS /* a fused record's operands */

/* The slots of a fused layer record (conv2d_fused, conv2d_fused_packed,
 * linear_fused): out, x, w, b, and a residual that only the epilogue pass
 * adds (graph_epilogue.c; recorded calls have four slots). */
#define ND_LAYER_W 2
#define ND_LAYER_B 3
#define ND_LAYER_RES 4

/* A fused_rows record (the fuse pass, graph_fuse.c) is the row op's own
 * record (softmax: out, x; layer_norm: y, mean, rstd, x, w, b; its i[0..1]
 * and f as recorded) with x's slot NULL, followed by its prologue program's
 * tensors (prog), x's among them NULL too. These i[] say the rest: */
#define ND_ROWS_REC_X 3     /* x's slot in the program's tensors */
#define ND_ROWS_REC_BASE 4  /* the record slot where the program's tensors start */
#define ND_ROWS_REC_ENTRY 5 /* the row op's entry (ND_CALL_softmax, ND_CALL_layer_norm) */

typedef enum { ND_ROLE_READ = 1, ND_ROLE_WRITE = 2, ND_ROLE_UPDATE = 3 } nd_rec_role;

typedef struct nd_graph_rec {
    nd_call_entry entry;
    const nd_backend *be;
    const char *op;            /* the op's name (static text) */
    int nt;
    /* The call's tensors in argument order (NULL where the call passed
     * NULL): private headers with the captured geometry, storages retained. */
    nd_tensor *t[ND_REC_MAX_TENSORS];
    unsigned char role[ND_REC_MAX_TENSORS]; /* nd_rec_role */
    bool full[ND_REC_MAX_TENSORS];          /* a write covers its whole storage */
    int sid[ND_REC_MAX_TENSORS];            /* the graph's number of each tensor's storage */
    int64_t i[6];
    double f[4];
    union {
        nd_conv_geom conv;
        nd_pool_geom pool;
        nd_sgd_hyper sgd;
        bool reduced[ND_MAX_DIMS];
        _Alignas(8) unsigned char value[16];
    } u;
    nd_host_check_fn check;
    char where[72];           /* a host check's source position at capture (nd_graph_set_where), or "" */
    nd_ew_program *prog;      /* fused_elementwise's and fused_rows' program (owned) */
    /* Prepared launches (backend.h prepare_begin; nd_graph_rec_run): the
     * commands of the first recorded replay, kept once a second recording
     * agrees, with the buffers they were recorded over. */
    int prep_state;           /* nd_prep_state */
    void *prepared;
    void *prep_data[ND_REC_MAX_TENSORS];
    int profile_id;   /* the profiler's name "compiled:<entry>[.<op>]" + 1, 0 until first profiled */
    nd_gemm_hint hint; /* a GEMM record's tuned work split (graph_tune.c); all zero: none */
} nd_graph_rec;

/* Whether the tuner may give r a GEMM hint: a product on a backend that
 * takes hints (backend.h gemm_hint). */
bool nd_graph_rec_gemm(const nd_graph_rec *r);

/* A new record at the end of the capturing graph, or NULL when none is
 * capturing (or the capture already failed: it is then poisoned). */
nd_graph_rec *nd_graph_rec_new(nd_call_entry e, const nd_backend *be, const char *op);
/* Adds tensor t (may be NULL) with its role. */
void nd_graph_rec_tensor(nd_graph_rec *r, const nd_tensor *t, nd_rec_role role);
/* Done adding: the storages are classified (graph.c). */
void nd_graph_rec_done(nd_graph_rec *r);
/* The call just recorded failed: the capture is invalid (its message says
 * which op). */
void nd_graph_rec_failed(nd_status st);
/* Gives back what the record holds (its tensors, its program). */
void nd_graph_rec_release(nd_graph_rec *r);
/* Runs one record again (backend_call.c). */
nd_status nd_graph_rec_replay(const nd_graph_rec *r);

typedef enum { ND_PREP_NONE, ND_PREP_FIRST, ND_PREP_READY, ND_PREP_NEVER } nd_prep_state;
/* Runs one record of a replay: through its prepared launches where its
 * backend has them and two recordings agreed, else nd_graph_rec_replay. */
nd_status nd_graph_rec_run(nd_graph_rec *r);
/* Forgets r's prepared launches (its kernels' parameters changed: tuning). */
void nd_graph_rec_unprepare(nd_graph_rec *r);

#endif
