/* transport_mpi.c - the transport over MPI: non-blocking collectives on
 * MPI_COMM_WORLD (so that dist.c can bound every wait), errors returned
 * rather than fatal, and reductions MPI lacks written as user ops:
 * float16/bfloat16 (added in float, rounded once per step as PyTorch's
 * half all-reduce does) and bool (sum and max are "or", min is "and"). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "tensor.h"
#include "transport.h"

struct nd_tx_req { MPI_Request r; };

static MPI_Op half_ops[3], bf16_ops[3]; /* sum, max, min */
/* channel 0: MPI_COMM_WORLD; 1: a duplicate for DistributedDataParallel's
 * buckets, whose calls keep their own order whatever runs on the first */
static MPI_Comm comms[2];

static const char *mpi_message(int code, char *buf) {
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) strcpy(buf, "unknown MPI error");
    return buf;
}

static nd_status mpi_fail(const char *what, int code) {
    char buf[MPI_MAX_ERROR_STRING];
    return nd_fail(ND_ERR_IO, "distributed: %s failed: %s", what, mpi_message(code, buf));
}

/* the user ops: (in, inout) elementwise, in float */
#define HALF_OP(name, to_f, from_f, expr)                                           \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {         \
        (void)dt;                                                                  \
        const uint16_t *a = in;                                                    \
        uint16_t *b = inout;                                                       \
        for (int i = 0; i < *len; i++) {                                           \
            float x = to_f(a[i]), y = to_f(b[i]);                                  \
            b[i] = from_f(expr);                                                   \
        }                                                                          \
    }
HALF_OP(half_sum, nd_half_to_float, nd_float_to_half, x + y)
HALF_OP(half_max, nd_half_to_float, nd_float_to_half, (x > y || x != x) ? x : y)
HALF_OP(half_min, nd_half_to_float, nd_float_to_half, (x < y || x != x) ? x : y)
HALF_OP(bf16_sum, nd_bf16_to_float, nd_float_to_bf16, x + y)
HALF_OP(bf16_max, nd_bf16_to_float, nd_float_to_bf16, (x > y || x != x) ? x : y)
HALF_OP(bf16_min, nd_bf16_to_float, nd_float_to_bf16, (x < y || x != x) ? x : y)

bool nd_tx_available(void) { return true; }

nd_status nd_tx_init(int *rank, int *size, int *local_rank, int *local_size) {
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        /* only the thread that called init talks to MPI */
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail("MPI_Init_thread", rc);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return mpi_fail("MPI_Comm_split_type", rc);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    comms[0] = MPI_COMM_WORLD;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &comms[1]);
    if (rc != MPI_SUCCESS) return mpi_fail("MPI_Comm_dup", rc);
    MPI_Comm_set_errhandler(comms[1], MPI_ERRORS_RETURN);
    MPI_User_function *h[3] = {half_sum, half_max, half_min};
    MPI_User_function *b[3] = {bf16_sum, bf16_max, bf16_min};
    for (int i = 0; i < 3; i++) {
        MPI_Op_create(h[i], 1, &half_ops[i]);
        MPI_Op_create(b[i], 1, &bf16_ops[i]);
    }
    return ND_OK;
}

static MPI_Datatype mpi_type(nd_dtype dt) {
    switch (dt) {
    case ND_FLOAT32: return MPI_FLOAT;
    case ND_FLOAT64: return MPI_DOUBLE;
    case ND_INT64: return MPI_INT64_T;
    case ND_INT32: return MPI_INT32_T;
    case ND_UINT8: case ND_BOOL: return MPI_UINT8_T;
    case ND_FLOAT16: case ND_BFLOAT16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(nd_dtype dt, nd_dist_op op) {
    int k = op == ND_DIST_MAX ? 1 : op == ND_DIST_MIN ? 2 : 0;
    if (dt == ND_FLOAT16) return half_ops[k];
    if (dt == ND_BFLOAT16) return bf16_ops[k];
    if (dt == ND_BOOL) return k == 2 ? MPI_LAND : MPI_LOR;
    return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

/* MPI counts are ints */
static nd_status mpi_count(int64_t n, int *count) {
    if (n <= INT32_MAX) {
        *count = (int)n;
        return ND_OK;
    }
    return nd_fail(ND_ERR_ARG, "distributed: %lld elements in one collective; MPI takes at most "
                   "%d (split the tensor)", (long long)n, INT32_MAX);
}

/* One entry for the blocking (req NULL) and the non-blocking calls. */
static nd_status call(const nd_tx_call *c, nd_tx_req **req) {
    nd_tx_req *r = NULL;
    if (req) {
        r = calloc(1, sizeof *r);
        if (!r) return nd_fail(ND_ERR_MEMORY, "distributed: out of memory");
    }
    int n = 0, rc = MPI_SUCCESS;
    MPI_Datatype dt = mpi_type(c->dtype);
    nd_status st = c->kind == ND_TX_BARRIER ? ND_OK : mpi_count(c->count, &n);
    if (st != ND_OK) { free(r); return st; }
    MPI_Op op = mpi_op(c->dtype, c->op);
    const void *send = c->send ? c->send : MPI_IN_PLACE;
    MPI_Comm comm = comms[c->channel == 1 ? 1 : 0];
    const char *what = "";
    switch (c->kind) {
    case ND_TX_ALL_REDUCE:
        what = "MPI_Allreduce";
        rc = r ? MPI_Iallreduce(send, c->recv, n, dt, op, comm, &r->r)
               : MPI_Allreduce(send, c->recv, n, dt, op, comm);
        break;
    case ND_TX_BROADCAST:
        what = "MPI_Bcast";
        rc = r ? MPI_Ibcast(c->recv, n, dt, c->root, comm, &r->r)
               : MPI_Bcast(c->recv, n, dt, c->root, comm);
        break;
    case ND_TX_ALL_GATHER:
        what = "MPI_Allgather";
        rc = r ? MPI_Iallgather(c->send, n, dt, c->recv, n, dt, comm, &r->r)
               : MPI_Allgather(c->send, n, dt, c->recv, n, dt, comm);
        break;
    case ND_TX_REDUCE_SCATTER:
        what = "MPI_Reduce_scatter_block";
        rc = r ? MPI_Ireduce_scatter_block(c->send, c->recv, n, dt, op, comm, &r->r)
               : MPI_Reduce_scatter_block(c->send, c->recv, n, dt, op, comm);
        break;
    case ND_TX_BARRIER:
        what = "MPI_Barrier";
        rc = r ? MPI_Ibarrier(comm, &r->r) : MPI_Barrier(comm);
        break;
    }
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_fail(what, rc);
    }
    if (req) *req = r;
    return ND_OK;
}

nd_status nd_tx_start(const nd_tx_call *c, nd_tx_req **req) { return call(c, req); }
nd_status nd_tx_run(const nd_tx_call *c) { return call(c, NULL); }

int nd_tx_wait(nd_tx_req *r) {
    int rc = MPI_Wait(&r->r, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        mpi_fail("MPI_Wait", rc);
        return -1;
    }
    return 0;
}

int nd_tx_test(nd_tx_req *r) {
    int done = 0;
    int rc = MPI_Test(&r->r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        mpi_fail("MPI_Test", rc);
        return -1;
    }
    return done ? 1 : 0;
}

void nd_tx_free(nd_tx_req *r) { free(r); }

nd_status nd_tx_finalize(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (done) return ND_OK;
    for (int i = 0; i < 3; i++) {
        MPI_Op_free(&half_ops[i]);
        MPI_Op_free(&bf16_ops[i]);
    }
    MPI_Comm_free(&comms[1]);
    int rc = MPI_Finalize();
    return rc == MPI_SUCCESS ? ND_OK : mpi_fail("MPI_Finalize", rc);
}

void nd_tx_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
