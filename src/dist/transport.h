/* transport.h - what dist.c needs from the message layer: MPI
 * (transport_mpi.c) when the build found it, else transport_none.c, whose
 * every entry says how to rebuild with MPI. Buffers are host memory; the
 * caller keeps them alive until the request has completed. */
#ifndef ND_DIST_TRANSPORT_H
#define ND_DIST_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "needle.h"

typedef enum {
    ND_TX_ALL_REDUCE, ND_TX_BROADCAST, ND_TX_ALL_GATHER, ND_TX_REDUCE_SCATTER, ND_TX_BARRIER
} nd_tx_kind;

typedef struct {
    nd_tx_kind kind;
    const void *send;  /* NULL: in place (all_reduce, broadcast) */
    void *recv;
    int64_t count;     /* elements sent by each rank (reduce_scatter: received) */
    nd_dtype dtype;
    nd_dist_op op;     /* sum or max or min (mean is a sum, divided after) */
    int root;
    int channel;       /* 0: the default communicator; 1: the gradients' own */
} nd_tx_call;

typedef struct nd_tx_req nd_tx_req;

bool nd_tx_available(void);
/* rank, size, local rank and local size of the launched job */
nd_status nd_tx_init(int *rank, int *size, int *local_rank, int *local_size);
nd_status nd_tx_start(const nd_tx_call *c, nd_tx_req **req);
/* the call, blocking (MPI's blocking collectives: its tuned algorithms) */
nd_status nd_tx_run(const nd_tx_call *c);
/* blocks until r is done (0) or failed (-1, message set) */
int nd_tx_wait(nd_tx_req *r);
/* 1 done, 0 not yet, -1 failed (message set) */
int nd_tx_test(nd_tx_req *r);
void nd_tx_free(nd_tx_req *r);
nd_status nd_tx_finalize(void);
void nd_tx_abort(int code);

#endif
