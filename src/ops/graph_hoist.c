/* graph_hoist.c - a captured graph's checks go first (nd_graph_plan).
 *
 * A host check (an index's bounds, a label's range) refuses a replay. Run
 * where the capture met it, after an optimizer's update, a refused replay
 * would leave the parameters updated: half a step, where docs/compile.md
 * promises a refused call leaves them as they were. So each check moves up
 * as far as nothing it reads is written above it - usually to the top, as
 * it reads a call's argument, copied in before the replay. The small
 * records that compute what it reads from there (a 1-based index turned
 * 0-based) move up first, if they can. A record moves above another only
 * when neither writes a storage the other reads or writes (then every read
 * still sees the version it saw before), never across a host check (their
 * order is the order of the errors a user sees), a host read or write, a
 * random draw or an opaque node (Lua code). A check of a value the graph
 * computes from an update stays below it: that refusal can still come half
 * way. */
#include <string.h>
#include "graph_internal.h"

/* producers of a check that may move with it: records writing at most this many elements */
#define SMALL_PRODUCER 65536
/* how many producers deep */
#define PRODUCER_DEPTH 4
/* producer moves per check */
#define MAX_PRODUCER_MOVES 16

static bool small_producer(const nd_graph_rec *r) {
    if (nd_graph_rec_barrier(r) || r->entry == ND_CALL_fused_rows) return false;
    bool writes = false;
    for (int i = 0; i < r->nt; i++) {
        if (!r->t[i] || !(r->role[i] & ND_ROLE_WRITE)) continue;
        if (nd_numel(r->t[i]) > SMALL_PRODUCER) return false;
        writes = true;
    }
    return writes;
}

/* Moves record j up as far as it may go (its small producers first, depth
 * levels deep, at most *moves producer moves in all: two producers that do
 * not conflict could otherwise pass each other forever); returns where it
 * ends. */
static size_t hoist(nd_graph *g, size_t j, int depth, int *moves) {
    size_t q = j;
    while (q > 0) {
        const nd_graph_rec *p = &g->recs[q - 1];
        if (nd_graph_rec_barrier(p)) break;
        if (!nd_graph_recs_conflict(p, &g->recs[j])) {
            q--;
            continue;
        }
        /* p writes what j reads (or the other way): p first, if it can go */
        if (depth > 0 && *moves > 0 && small_producer(p)) {
            (*moves)--;
            if (hoist(g, q - 1, depth - 1, moves) < q - 1) continue;
        }
        break;
    }
    if (q < j) {
        nd_graph_rec moved = g->recs[j];
        memmove(&g->recs[q + 1], &g->recs[q], (j - q) * sizeof *g->recs);
        g->recs[q] = moved;
    }
    return q;
}

void nd_graph_hoist_checks(nd_graph *g) {
    for (size_t j = 1; j < g->n; j++) {
        const nd_graph_rec *c = &g->recs[j];
        int moves = MAX_PRODUCER_MOVES;
        if (c->entry == ND_CALL_host_check && !nd_graph_rec_opaque(c)) hoist(g, j, PRODUCER_DEPTH, &moves);
    }
}
