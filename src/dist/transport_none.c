/* transport_none.c - the transport of a build without MPI: a world of one
 * process works (dist.c never calls here then); joining a launched job says
 * how to get MPI. */
#include <stdlib.h>
#include "tensor.h"
#include "transport.h"

#define REBUILD "this needle-lua was built without MPI; install Open MPI (Debian: apt install " \
    "libopenmpi-dev openmpi-bin) and rebuild (bash scripts/setup.sh)"

bool nd_tx_available(void) { return false; }

nd_status nd_tx_init(int *rank, int *size, int *local_rank, int *local_size) {
    (void)rank; (void)size; (void)local_rank; (void)local_size;
    return nd_fail(ND_ERR_UNSUPPORTED, "distributed.init: " REBUILD);
}

nd_status nd_tx_start(const nd_tx_call *c, nd_tx_req **req) {
    (void)c; (void)req;
    return nd_fail(ND_ERR_UNSUPPORTED, "distributed: " REBUILD);
}

nd_status nd_tx_run(const nd_tx_call *c) {
    (void)c;
    return nd_fail(ND_ERR_UNSUPPORTED, "distributed: " REBUILD);
}

int nd_tx_test(nd_tx_req *r) { (void)r; return -1; }
int nd_tx_wait(nd_tx_req *r) { (void)r; return -1; }
void nd_tx_free(nd_tx_req *r) { (void)r; }
nd_status nd_tx_finalize(void) { return ND_OK; }
void nd_tx_abort(int code) { exit(code); }
