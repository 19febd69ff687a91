/* Integration: the model a user gets. A run on an embedded cluster checkpoints; the saved
 * model (the checkpoint root, the checkpoint, and a complete export of it) opens without a
 * server and scores the test file with exactly the trainer's evaluation path: AUC, logloss
 * and every probability equal the run's own, bit for bit. `granary eval` and `granary ckpt
 * export` through the binary; refusals name what is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "granary/ckpt.h"
#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"

static tr_fixture fx;
static char root[256], exp32[256], exp16[256];
static gr_train_result trained;
static gr_train_opts topts;

/* Trains the fixture's small DLRM on a 2-shard embedded cluster with checkpoints. */
static int train_into(const char *ckdir, gr_train_opts *o, gr_train_result *res)
{
    gr_local_cluster *cl;
    if (gr_local_cluster_start(2, 2, &cl)) return -1;
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    gr_client *client;
    int rc = gr_client_create(&cc, &client);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = client;
    po.mode = o->mode;
    po.workers = o->workers;
    gr_train_backend be;
    if (!rc) rc = gr_ps_backend_create(&po, &be);
    o->ckpt_dir = ckdir;
    o->ckpt_every = 40;
    if (!rc) rc = gr_train_run(o, &be, res);
    if (rc) fprintf(stderr, "train: %s\n", gr_errmsg());
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cl);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_WARN);
    if (tr_fixture_make(&fx, "savedmodel", 11)) return -1;
    snprintf(root, sizeof root, "%s/ck", fx.dir);
    snprintf(exp32, sizeof exp32, "%s/export", fx.dir);
    snprintf(exp16, sizeof exp16, "%s/export16", fx.dir);
    /* Two workers, async, shared chunks, pipelined: the default multi-worker data path. */
    tr_fixture_small_dlrm(&fx, &topts, GR_MODE_ASYNC, 2);
    return train_into(root, &topts, &trained);
}

static int teardown(void **state)
{
    (void)state;
    return tr_fixture_remove(&fx);
}

static void assert_same_double(double a, double b)
{
    if (memcmp(&a, &b, sizeof a)) fprintf(stderr, "%.17g != %.17g\n", a, b);
    assert_memory_equal(&a, &b, sizeof a);
}

static void assert_scores_like_training(const char *path, const char *kind)
{
    gr_saved_model *sm;
    int rc = gr_saved_model_open(path, &sm);
    if (rc) fprintf(stderr, "open %s: %s\n", path, gr_errmsg());
    assert_int_equal(rc, 0);
    const gr_saved_model_info *in = gr_saved_model_get_info(sm);
    assert_string_equal(in->kind, kind);
    assert_int_equal(in->model.kind, GR_MODEL_DLRM);
    assert_int_equal(in->model.dim, 8);
    assert_int_equal(in->model.n_bottom, 1);
    assert_int_equal(in->model.bottom[0], 16);
    assert_int_equal(in->model.n_top, 1);
    assert_int_equal(in->model.top[0], 32);
    assert_int_equal(in->n_dense, 13);
    assert_int_equal(in->n_sparse, 26);
    assert_string_equal(in->table, "embeddings");
    assert_string_equal(in->dense_name, "dlrm.dense");
    assert_int_equal(in->dense_size, gr_model_dense_size(gr_saved_model_model(sm)));
    assert_int_equal(in->batch, 256);
    assert_int_equal(in->workers, 2);
    assert_true(in->rows > 1000);
    gr_eval_result r;
    assert_int_equal(gr_saved_model_evaluate(sm, fx.test, 0, 0, true, &r), 0);
    assert_int_equal(r.examples, trained.test_examples);
    assert_same_double(r.auc, trained.test_auc);
    assert_same_double(r.logloss, trained.test_logloss);
    assert_true(r.auc > 0.65);
    /* One batch of the first 100 examples by hand: the same probabilities (the trainer's
     * batches of 256 hold them at the same positions, and rows are per example). */
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = 256;
    gr_criteo_reader *rd;
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 256), 0);
    assert_int_equal(gr_criteo_open(fx.test, &ro, &rd), 0);
    assert_int_equal(gr_criteo_next(rd, &b), 0);
    assert_int_equal(b.n, 256);
    gr_score_ws *ws;
    assert_int_equal(gr_score_ws_create(gr_saved_model_model(sm), &ws), 0);
    float probs[256];
    assert_int_equal(gr_saved_model_predict(sm, ws, b.n, b.dense, b.ids, probs), 0);
    assert_memory_equal(probs, r.probs, sizeof probs);
    gr_score_ws_destroy(ws);
    gr_criteo_close(rd);
    gr_batch_fini(&b);
    free(r.probs);
    gr_saved_model_close(sm);
}

/* The root (its newest checkpoint) and that checkpoint itself. */
static void test_checkpoint_scores_like_training(void **state)
{
    (void)state;
    assert_true(trained.ckpt_saves >= 2);
    assert_false(isnan(trained.test_auc));
    assert_scores_like_training(root, "full");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, trained.ckpt_last);
    assert_scores_like_training(dir, "full");
}

/* An export holds everything a server needs: embeddings, the dense MLP, the model's shapes. */
static void test_export_is_complete(void **state)
{
    (void)state;
    gr_ckpt_export_info ei;
    int rc = gr_ckpt_export_dir(root, exp32, false, 0, &ei);
    if (rc) fprintf(stderr, "export: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(ei.dense, 1);
    assert_true(ei.has_meta);
    assert_true(ei.rows > 1000);
    assert_int_equal(gr_ckpt_verify(exp32, true, NULL), 0);
    gr_ckpt_dense_info *dv;
    size_t nd;
    assert_int_equal(gr_ckpt_dense_list(exp32, &dv, &nd), 0);
    assert_int_equal(nd, 1);
    assert_string_equal(dv[0].name, "dlrm.dense");
    assert_int_equal(dv[0].size, ei.dense_floats);
    free(dv);
    assert_scores_like_training(exp32, "export");
    /* The dense parameters are bitwise those of the checkpoint. */
    float *a, *b;
    uint64_t na, nb;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, trained.ckpt_last);
    assert_int_equal(gr_ckpt_dense_read(dir, "dlrm.dense", &a, &na), 0);
    assert_int_equal(gr_ckpt_dense_read(exp32, "dlrm.dense", &b, &nb), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a);
    free(b);
    /* A second export into the same place is refused and changes nothing. */
    assert_int_equal(gr_ckpt_export_dir(root, exp32, false, 0, &ei), GR_EEXIST);
    assert_non_null(strstr(gr_errmsg(), exp32));
    assert_int_equal(gr_ckpt_verify(exp32, true, NULL), 0);
}

/* f16 halves the embeddings; the dense part stays f32; scores stay close. */
static void test_export_f16(void **state)
{
    (void)state;
    gr_ckpt_export_info ei;
    assert_int_equal(gr_ckpt_export_dir(root, exp16, true, 3, &ei), 0);
    gr_saved_model *sm;
    assert_int_equal(gr_saved_model_open(exp16, &sm), 0);
    gr_eval_result r;
    assert_int_equal(gr_saved_model_evaluate(sm, fx.test, 0, 0, false, &r), 0);
    assert_int_equal(r.examples, trained.test_examples);
    assert_true(fabs(r.auc - trained.test_auc) < 2e-3);
    assert_null(r.probs);
    gr_saved_model_close(sm);
}

/* `granary eval` prints the same AUC and logloss, with predictions on request;
 * `granary ckpt export --json` reports the dense part. */
static void test_cli_eval(void **state)
{
    (void)state;
    char out[4096], pred[512], want[128];
    snprintf(pred, sizeof pred, "%s/pred.txt", fx.dir);
    const char *args[] = {"eval", "--model", root, "--test", fx.test, "--json", "--predictions-out",
                          pred, NULL};
    int st = ps_test_run_granary(args, out, sizeof out);
    if (st) fprintf(stderr, "%s\n", out);
    assert_int_equal(st, 0);
    /* cJSON prints doubles with 17 significant digits when 15 do not round-trip. */
    snprintf(want, sizeof want, "\"examples\":%llu", (unsigned long long)trained.test_examples);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"kind\":\"full\""));
    double auc = NAN;
    const char *a = strstr(out, "\"auc\":");
    assert_non_null(a);
    auc = strtod(a + 6, NULL);
    assert_same_double(auc, trained.test_auc);
    FILE *f = fopen(pred, "r");
    assert_non_null(f);
    size_t lines = 0;
    char line[64];
    while (fgets(line, sizeof line, f)) {
        double p = strtod(line, NULL);
        assert_true(p > 0 && p < 1);
        lines++;
    }
    fclose(f);
    assert_int_equal(lines, trained.test_examples);

    char exp3[512];
    snprintf(exp3, sizeof exp3, "%s/export-cli", fx.dir);
    const char *ex[] = {"ckpt", "export", root, "--out", exp3, "--json", NULL};
    assert_int_equal(ps_test_run_granary(ex, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"dense\":1"));
    assert_non_null(strstr(out, "\"model\":true"));
    const char *ev[] = {"eval", "--model", exp3, "--test", fx.test, NULL};
    assert_int_equal(ps_test_run_granary(ev, out, sizeof out), 0);
    assert_non_null(strstr(out, "auc 0."));
}

/* `ckpt list`, `ckpt inspect` (dense parameters, position, settings) and `ckpt latest` on a
 * root and on one checkpoint, as --resume takes them. */
static void test_cli_ckpt_tools(void **state)
{
    (void)state;
    char out[65536], dir[512], want[600], broken[512];
    snprintf(dir, sizeof dir, "%s/%s", root, trained.ckpt_last);
    snprintf(broken, sizeof broken, "%s/step-999999999999", root);
    assert_int_equal(mkdir(broken, 0755), 0);
    const char *ls[] = {"ckpt", "list", root, "--json", NULL};
    assert_int_equal(ps_test_run_granary(ls, out, sizeof out), 0);
    snprintf(want, sizeof want, "{\"name\":\"%s\",\"step\":", trained.ckpt_last);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"kind\":\"full\""));
    assert_non_null(strstr(out, "\"complete\":true"));
    /* The unfinished save is listed first (newest), as incomplete. */
    const char *first = strstr(out, "step-999999999999"), *done = strstr(out, trained.ckpt_last);
    assert_non_null(first);
    assert_true(first < done);
    assert_non_null(strstr(first, "\"complete\":false"));
    const char *lst[] = {"ckpt", "list", root, NULL};
    assert_int_equal(ps_test_run_granary(lst, out, sizeof out), 0);
    assert_non_null(strstr(out, "no (no manifest"));
    /* latest skips it, on the root; a checkpoint is its own latest. */
    const char *la[] = {"ckpt", "latest", root, NULL};
    assert_int_equal(ps_test_run_granary(la, out, sizeof out), 0);
    snprintf(want, sizeof want, "%s\n", dir);
    assert_string_equal(out, want);
    const char *lb[] = {"ckpt", "latest", dir, "--json", NULL};
    assert_int_equal(ps_test_run_granary(lb, out, sizeof out), 0);
    snprintf(want, sizeof want, "\"name\":\"%s\"", trained.ckpt_last);
    assert_non_null(strstr(out, want));
    assert_int_equal(rmdir(broken), 0);

    /* inspect on the root shows its newest checkpoint, with the dense parameter's checksum. */
    float *vals;
    uint64_t n;
    assert_int_equal(gr_ckpt_dense_read(dir, "dlrm.dense", &vals, &n), 0);
    char ck[17];
    snprintf(ck, sizeof ck, "%016llx", (unsigned long long)gr_checksum(vals, n * sizeof *vals));
    free(vals);
    const char *in[] = {"ckpt", "inspect", root, "--json", NULL};
    assert_int_equal(ps_test_run_granary(in, out, sizeof out), 0);
    snprintf(want, sizeof want, "\"name\":\"dlrm.dense\",\"size\":%llu", (unsigned long long)n);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "\"checksum\":\"%s\"", ck);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "\"worker_steps\":["));
    assert_non_null(strstr(out, "\"chunks\":{\"count\":128"));
    assert_non_null(strstr(out, "\"model\":{\"kind\":\"dlrm\",\"n_dense\":13,\"n_sparse\":26,\"dim\":8"));
    assert_non_null(strstr(out, "\"dense_layout\":\"bottom0.w 16x13 @0"));
    const char *it[] = {"ckpt", "inspect", dir, NULL};
    assert_int_equal(ps_test_run_granary(it, out, sizeof out), 0);
    assert_non_null(strstr(out, "position    40000 examples"));
    assert_non_null(strstr(out, "mode async, 2 worker(s), batch 256"));
    assert_non_null(strstr(out, ck));
    assert_non_null(strstr(out, "model       dlrm: 13 dense + 26 categorical features, embedding dim 8"));
    char missing[512];
    snprintf(missing, sizeof missing, "%s/nothing-here", fx.dir);
    const char *bad[] = {"ckpt", "inspect", missing, NULL};
    assert_int_equal(ps_test_run_granary(bad, out, sizeof out), 1);
    assert_non_null(strstr(out, missing));
}

/* Refusals name what is missing; nothing crashes. */
static void test_refusals(void **state)
{
    (void)state;
    char path[512], out[4096];
    gr_saved_model *sm = (gr_saved_model *)1;
    snprintf(path, sizeof path, "%s/no-such-model", fx.dir);
    assert_int_equal(gr_saved_model_open(path, &sm), GR_ENOENT);
    assert_null(sm);
    assert_non_null(strstr(gr_errmsg(), path));
    /* A checkpoint written by the library's tools has no model metadata. */
    snprintf(path, sizeof path, "%s/plain", fx.dir);
    gr_table_spec spec;
    gr_table_spec_default(&spec, "embeddings", 8);
    gr_table *t;
    assert_int_equal(gr_table_create(&spec, &t), 0);
    gr_ckpt_saver *sv;
    assert_int_equal(gr_ckpt_saver_create(path, NULL, &sv), 0);
    assert_int_equal(gr_ckpt_saver_save(sv, 5, &t, 1, NULL, NULL), 0);
    gr_ckpt_saver_destroy(sv);
    gr_table_destroy(t);
    assert_int_equal(gr_saved_model_open(path, &sm), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no model metadata"));
    /* A checkpoint whose dense part was deleted. */
    char copy[512], cmd[2200];
    snprintf(copy, sizeof copy, "%s/nodense", fx.dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && rm -rf '%s'/dense-00000-of-00001", exp32, copy, copy);
    assert_int_equal(system(cmd), 0);
    assert_int_not_equal(gr_saved_model_open(copy, &sm), 0);
    assert_non_null(strstr(gr_errmsg(), "dense-00000-of-00001"));
    const char *args[] = {"eval", "--model", copy, "--test", fx.test, NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "granary eval: "));
    assert_non_null(strstr(out, "missing"));
    /* An unwritable predictions file fails before the model is loaded. */
    char nowhere[600];
    snprintf(nowhere, sizeof nowhere, "%s/no-such-dir/p.txt", fx.dir);
    const char *badout[] = {"eval", "--model", root, "--test", fx.test, "--predictions-out",
                            nowhere, NULL};
    assert_int_equal(ps_test_run_granary(badout, out, sizeof out), 1);
    assert_non_null(strstr(out, "--predictions-out: cannot write"));
    assert_null(strstr(out, "auc "));
    const char *noargs[] = {"eval", "--model", root, NULL};
    assert_int_equal(ps_test_run_granary(noargs, out, sizeof out), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_scores_like_training),
        cmocka_unit_test(test_export_is_complete),
        cmocka_unit_test(test_export_f16),
        cmocka_unit_test(test_cli_eval),
        cmocka_unit_test(test_cli_ckpt_tools),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
