/* Online learning on a drifting stream (issue 12): a model trained on the first part of a
 * stream whose teacher drifts, then kept training on the next part through publishing shards,
 * is served by a subscribed replica. On the newest data, the served model's AUC stays within
 * 0.01 of (or above) a model retrained offline on just the recent part, while a frozen replica
 * of the first model falls behind both and below its own AUC on the data of its time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/serve.h"
#include "support/ps_harness.h"

#define OLD_ROWS 120000
#define NEW_ROWS 120000
#define EVAL_ROWS 20000
#define DRIFT 1.2 /* radians per 100 000 rows */

static void write_rows(gr_datagen_stream *g, const char *path, uint64_t n)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    char row[GR_DATAGEN_ROW_MAX];
    for (uint64_t i = 0; i < n; i++) fwrite(row, 1, gr_datagen_stream_next(g, row, NULL, NULL), f);
    fclose(f);
}

static double served_auc(gr_serve *s, const char *path)
{
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = 1000;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &ro, &r), 0);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 1000), 0);
    float *probs = malloc(EVAL_ROWS * sizeof *probs), *labels = malloc(EVAL_ROWS * sizeof *labels);
    size_t n = 0;
    while (gr_criteo_next(r, &b) == 0 && b.n && n + b.n <= EVAL_ROWS) {
        assert_int_equal(gr_serve_predict(s, b.n, b.dense, b.ids, probs + n, NULL), 0);
        memcpy(labels + n, b.labels, b.n * sizeof *labels);
        n += b.n;
    }
    gr_criteo_close(r);
    gr_batch_fini(&b);
    double auc = 0;
    assert_int_equal(gr_auc(probs, labels, n, &auc), 0);
    free(probs), free(labels);
    return auc;
}

static void small_dlrm(gr_train_opts *o, const char *train, const char *test)
{
    gr_train_opts_default(o, GR_MODEL_DLRM);
    o->model.dim = 8;
    o->model.n_bottom = 1;
    o->model.bottom[0] = 16;
    o->model.n_top = 1;
    o->model.top[0] = 32;
    o->emb.dim = 8;
    o->batch = 256;
    o->workers = 1;
    o->progress_s = 0;
    o->train_path = train;
    o->test_path = test;
}

/* Waits until the replica has applied everything the shards will publish: dense parameters
 * present and no new publication for half a second (the shards publish every 50 ms). */
static void wait_settled(gr_serve *s)
{
    gr_serve_stats st;
    uint64_t last = UINT64_MAX;
    int quiet = 0;
    for (int i = 0; i < 3000 && quiet < 10; i++) {
        usleep(50000);
        gr_serve_get_stats(s, &st);
        quiet = st.dense_version && st.publications == last ? quiet + 1 : 0;
        last = st.publications;
    }
    assert_true(quiet >= 10);
}

static void test_online_follows_drift(void **state)
{
    (void)state;
    char dir[256], old_path[300], new_path[300], eval_path[300], old_tail[300];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(old_path, sizeof old_path, "%s/old.tsv", dir);
    snprintf(old_tail, sizeof old_tail, "%s/old_tail.tsv", dir);
    snprintf(new_path, sizeof new_path, "%s/new.tsv", dir);
    snprintf(eval_path, sizeof eval_path, "%s/eval.tsv", dir);
    gr_datagen_stream *g;
    assert_int_equal(gr_datagen_stream_create(11, DRIFT, &g), 0);
    write_rows(g, old_path, OLD_ROWS);
    write_rows(g, old_tail, EVAL_ROWS); /* data of the first model's time */
    write_rows(g, new_path, NEW_ROWS);
    write_rows(g, eval_path, EVAL_ROWS); /* the newest data */
    gr_datagen_stream_destroy(g);

    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start_publishing(1, 2, 50, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = c;
    po.tables = GR_PS_TABLES_REUSE; /* the online phase continues with the first phase's rows */
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    gr_train_result res;
    small_dlrm(&o, old_path, NULL);
    assert_int_equal(gr_train_run(&o, &be, &res), 0);

    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &o.model;
    cfg.from = gr_local_cluster_servers(cl);
    cfg.poll_wait_ms = 200;
    gr_serve *frozen, *served;
    assert_int_equal(gr_serve_create(&cfg, &frozen), 0);
    assert_int_equal(gr_serve_start(frozen), 0);
    assert_int_equal(gr_serve_create(&cfg, &served), 0);
    assert_int_equal(gr_serve_start(served), 0);
    wait_settled(frozen);
    gr_serve_freeze(frozen); /* the first model, as it was */

    /* Online: the same model keeps training on the new data; the served replica follows. */
    small_dlrm(&o, new_path, NULL);
    assert_int_equal(gr_train_run(&o, &be, &res), 0);
    wait_settled(served);

    /* Offline: a fresh model trained on the new data only. */
    gr_local_backend_opts lo = {GR_DENSE_OPT_ADAM, 1e-3f, 0.9f, 0.999f, 1e-8f};
    gr_train_backend local;
    assert_int_equal(gr_local_backend_create(&lo, &local), 0);
    gr_train_result off;
    small_dlrm(&o, new_path, eval_path);
    assert_int_equal(gr_train_run(&o, &local, &off), 0);

    double auc_served = served_auc(served, eval_path);
    double auc_frozen = served_auc(frozen, eval_path);
    double auc_frozen_then = served_auc(frozen, old_tail);
    fprintf(stderr, "newest data: served (online) AUC %.4f, offline retrained %.4f, frozen %.4f "
            "(frozen on the data of its time %.4f)\n", auc_served, off.test_auc, auc_frozen,
            auc_frozen_then);
    assert_true(auc_served >= off.test_auc - 0.01);
    assert_true(auc_frozen < auc_served - 0.02);
    assert_true(auc_frozen < auc_frozen_then - 0.02);

    gr_serve_destroy(frozen);
    gr_serve_destroy(served);
    gr_train_backend_destroy(&local);
    gr_train_backend_destroy(&be);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_online_follows_drift)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
