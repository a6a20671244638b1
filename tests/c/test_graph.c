/* test_graph.c - graph capture and replay from C (needle.h nd_graph_*),
 * as an embedding host would use it: capture y = relu(x @ w) + 1 over a
 * borrowed input buffer, change the buffer, replay, and compare with the
 * same ops run eagerly; the memory plan; a host read while capturing (a
 * graph break); misuse (replay while capturing, nested captures); the
 * position a host gives the checks a replay runs (nd_graph_set_where); and that
 * freeing the graph gives all its memory back. */
#include <stdlib.h>
#include "check.h"

static nd_status eager(const nd_tensor *x, const nd_tensor *w, nd_tensor **out) {
    nd_tensor *m = NULL, *r = NULL;
    nd_status st = nd_matmul(x, w, &m);
    if (st == ND_OK) st = nd_unary(ND_UNARY_relu, m, &r);
    if (st == ND_OK) st = nd_binary_scalar(ND_BINARY_add, r, 1.0, 0, out);
    nd_release(m);
    nd_release(r);
    return st;
}

static float max_diff(const nd_tensor *a, const nd_tensor *b) {
    float va[12], vb[12], d = 0;
    if (nd_copy_to_buffer(a, va, sizeof va) != ND_OK || nd_copy_to_buffer(b, vb, sizeof vb) != ND_OK) return 1e30f;
    for (int i = 0; i < 12; i++) d = va[i] - vb[i] > d ? va[i] - vb[i] : vb[i] - va[i] > d ? vb[i] - va[i] : d;
    return d;
}

static void test_capture_replay(void) {
    float xbuf[3 * 2] = {1, -2, 3, 4, -5, 6}, wbuf[2 * 4] = {1, 2, 3, 4, -1, -2, -3, -4};
    int64_t xs[2] = {3, 2}, ws[2] = {2, 4};
    nd_tensor *x, *w, *y = NULL, *want = NULL;
    OK(nd_from_borrowed(xbuf, xs, 2, ND_FLOAT32, NULL, NULL, &x));
    OK(nd_from_borrowed(wbuf, ws, 2, ND_FLOAT32, NULL, NULL, &w));
    nd_graph *g;
    OK(nd_graph_begin(&g));
    CHECK(nd_graph_capturing());
    EXPECT_ERR("replay while capturing", nd_graph_replay(g), ND_ERR_ARG, "not captured", NULL);
    nd_graph *g2;
    EXPECT_ERR("nested capture", nd_graph_begin(&g2), ND_ERR_UNSUPPORTED, "already being captured", NULL);
    OK(eager(x, w, &y));
    OK(nd_graph_end(g));
    CHECK(!nd_graph_capturing());
    CHECK(nd_graph_size(g) == 3);
    nd_graph_rec_info info;
    OK(nd_graph_record(g, 0, &info));
    CHECK(!strcmp(info.entry, "matmul"));
    CHECK(info.storage_kind[1] == 'e'); /* x existed before */
    OK(nd_graph_record(g, 1, &info));
    CHECK(!strcmp(info.detail, "relu"));
    EXPECT_ERR("record out of range", nd_graph_record(g, 3, &info), ND_ERR_INDEX, "no record 3", NULL);
    OK(nd_graph_plan(g));
    nd_graph_stat s;
    nd_graph_stats(g, &s);
    /* m dies at the relu, which may write over it (same view, elementwise): relu(m) goes
     * over m in one buffer; y is the caller's (not planned) */
    CHECK(s.records == 3 && s.buffers == 1 && s.planned_bytes == 12 * 4);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 6; i++) xbuf[i] = (float)((i * 7 + round * 3) % 5) - 2.0f;
        OK(nd_graph_replay(g));
        OK(eager(x, w, &want));
        CHECKM(max_diff(y, want) == 0, "round %d: replay differs from eager", round);
        nd_release(want);
    }
    nd_graph_free(g);
    nd_release(y);
    nd_release(x);
    nd_release(w);
}

static void test_graph_break(void) {
    int64_t sh[1] = {4};
    nd_tensor *t;
    OK(nd_full(sh, 1, ND_FLOAT32, 2.0, &t));
    nd_graph *g;
    OK(nd_graph_begin(&g));
    float buf[4];
    EXPECT_ERR("host read", nd_copy_to_buffer(t, buf, sizeof buf), ND_ERR_UNSUPPORTED, "graph break", NULL);
    EXPECT_ERR("end after a break", nd_graph_end(g), ND_ERR_UNSUPPORTED, "reads tensor values", NULL);
    EXPECT_ERR("replay of a broken graph", nd_graph_replay(g), ND_ERR_ARG, "not captured", NULL);
    nd_graph_free(g);
    /* with fallback the read goes on (the capture only fails at its end) */
    OK(nd_graph_begin(&g));
    nd_graph_set_fallback(g, true);
    OK(nd_copy_to_buffer(t, buf, sizeof buf));
    CHECK(buf[3] == 2.0f);
    EXPECT_ERR("end after a fallback break", nd_graph_end(g), ND_ERR_UNSUPPORTED, "graph break", NULL);
    nd_graph_free(g);
    OK(nd_copy_to_buffer(t, buf, sizeof buf)); /* no capture: reads are fine again */
    nd_release(t);
}

/* a host's own source position for the checks a capture records (nd_graph_set_where) */
static const char *host_where(void *ud) { return (const char *)ud; }

static void test_check_position(void) {
    float logits[2 * 3] = {0.5f, 1, -1, 2, 0, 1};
    int64_t labels[2] = {0, 2};
    nd_tensor *x, *y, *loss = NULL;
    OK(nd_from_borrowed(logits, S(2, 3), ND_FLOAT32, NULL, NULL, &x));
    OK(nd_from_borrowed(labels, S(2), ND_INT64, NULL, NULL, &y));
    nd_graph *g;
    OK(nd_graph_begin(&g));
    nd_graph_set_where(g, host_where, (void *)"model.cfg:7");
    OK(nd_cross_entropy(x, y, -100, 0.0, 1, &loss));
    OK(nd_graph_end(g));
    OK(nd_graph_plan(g));
    OK(nd_graph_replay(g));
    labels[1] = 3; /* out of range for 3 classes: the replay's check refuses it */
    EXPECT_ERR("replay with a bad label", nd_graph_replay(g), ND_ERR_INDEX, "out of range",
               "(the check of cross_entropy recorded at model.cfg:7)");
    labels[1] = 1;
    OK(nd_graph_replay(g));
    nd_graph_free(g);
    nd_release(loss);
    nd_release(x);
    nd_release(y);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int64_t live0 = nd_live_bytes();
    test_capture_replay();
    test_graph_break();
    test_check_position();
    checks++;
    if (nd_live_bytes() != live0)
        FAIL("live bytes: %lld at start, %lld after freeing the graphs", (long long)live0,
             (long long)nd_live_bytes());
    if (failures) printf("%d of %d checks failed\n", failures, checks);
    else printf("%d checks passed\n", checks);
    return failures ? 1 : 0;
}
