/* Integration: a job owns its state.
 *  - tables: `granary train --servers` refuses tables that already hold rows (an earlier
 *    run's), naming the table and the row count; --reuse-tables continues with them, --fresh
 *    drops and recreates them (and then trains exactly as the first run did);
 *  - the sync job: a second trainer against servers whose sync job belongs to a running
 *    trainer is refused at start with a message naming that job (owner, mode, workers,
 *    started when); the first trainer's job is untouched and its run is bitwise the run it
 *    makes alone; a clear from another owner does not take the job away; an older client's
 *    config (no owner) still joins as before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"

static char tmp[128], trainf[256], testf[256];

static int setup(void **state)
{
    (void)state;
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_ERROR);
    if (ps_test_tmpdir(tmp, sizeof tmp)) return -1;
    gr_datagen_opts o = {.train_rows = 6000, .test_rows = 1500, .seed = 5, .threads = 2};
    gr_datagen_result r;
    if (gr_datagen_run(tmp, &o, &r)) return -1;
    snprintf(trainf, sizeof trainf, "%s/train.tsv", tmp);
    snprintf(testf, sizeof testf, "%s/test.tsv", tmp);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ps_test_rmdir(tmp);
    return 0;
}

/* `granary train` against the cluster: one worker, sequential, so a run is deterministic. */
static int train_cli(const char *servers, const char *extra1, const char *extra2, char *out,
                     size_t cap)
{
    const char *args[24] = {"train", "--servers", servers, "--train", trainf, "--test", testf,
                            "--workers", "1", "--no-pipeline", "--batch", "256", "--dim", "4",
                            "--bottom", "8", "--top", "8", "--progress", "0"};
    int n = 20;
    if (extra1) args[n++] = extra1;
    if (extra2) args[n++] = extra2;
    args[n] = NULL;
    return ps_test_run_granary(args, out, cap);
}

static const char *auc_of(const char *out)
{
    const char *a = strstr(out, "\nauc ");
    return a ? a + 1 : strstr(out, "auc ");
}

static void test_tables_with_rows(void **state)
{
    (void)state;
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    const char *servers = gr_local_cluster_servers(cl);
    static char first[8192], out[8192];
    int st = train_cli(servers, NULL, NULL, first, sizeof first);
    if (st) fprintf(stderr, "%s\n", first);
    assert_int_equal(st, 0);
    char auc1[64];
    snprintf(auc1, sizeof auc1, "%.30s", auc_of(first));

    /* How many rows the first run left. */
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    char *js;
    assert_int_equal(gr_client_describe_table(c, "embeddings", &js), 0);
    cJSON *j = cJSON_Parse(js);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rows");
    assert_true(cJSON_IsNumber(r));
    unsigned long long rows = (unsigned long long)r->valuedouble;
    cJSON_Delete(j);
    assert_true(rows > 1000);
    free(js);

    /* The same command again is refused before any training, naming table and rows. */
    assert_int_equal(train_cli(servers, NULL, NULL, out, sizeof out), 1);
    char want[128];
    snprintf(want, sizeof want, "table 'embeddings' on the servers already holds %llu rows", rows);
    if (!strstr(out, want)) fprintf(stderr, "%s\n", out);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "--fresh"));
    assert_non_null(strstr(out, "--reuse-tables"));
    assert_null(strstr(out, "\nauc "));

    /* --reuse-tables continues with them: another model than the first run's. */
    assert_int_equal(train_cli(servers, "--reuse-tables", NULL, out, sizeof out), 0);
    assert_non_null(auc_of(out));
    assert_int_not_equal(strncmp(auc_of(out), auc1, strlen(auc1)), 0);

    /* --fresh drops them: exactly the first run again. */
    st = train_cli(servers, "--fresh", NULL, out, sizeof out);
    if (st) fprintf(stderr, "%s\n", out);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "dropped table 'embeddings'"));
    assert_int_equal(strncmp(auc_of(out), auc1, strlen(auc1)), 0);

    /* A resume needs neither: its restore replaces the tables. */
    char ck[300], ckflag[320], resflag[320];
    snprintf(ck, sizeof ck, "%s/ckres", tmp);
    snprintf(ckflag, sizeof ckflag, "--ckpt-dir=%s", ck);
    snprintf(resflag, sizeof resflag, "--resume=%s", ck);
    st = train_cli(servers, ckflag, "--reuse-tables", out, sizeof out);
    if (st) fprintf(stderr, "%s\n", out);
    assert_int_equal(st, 0);
    st = train_cli(servers, ckflag, resflag, out, sizeof out);
    if (st) fprintf(stderr, "%s\n", out);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "resumed from"));

    /* --fresh with --resume or --reuse-tables is a usage error. */
    assert_int_equal(train_cli(servers, "--fresh", "--reuse-tables", out, sizeof out), 2);
    char res[300];
    snprintf(res, sizeof res, "--resume=%s/ck", tmp);
    assert_int_equal(train_cli(servers, "--fresh", res, out, sizeof out), 2);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
}

/* A sync backend on the cluster: the job it installs is owned by it. */
static gr_train_backend sync_backend(gr_client *c, uint64_t owner, bool reset, int *rc)
{
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = c;
    po.mode = GR_MODE_SYNC;
    po.workers = 2;
    po.owner = owner;
    po.reset = reset;
    po.tables = GR_PS_TABLES_FRESH;
    gr_train_backend be;
    *rc = gr_ps_backend_create(&po, &be);
    return be;
}

static void small_opts(gr_train_opts *o)
{
    gr_train_opts_default(o, GR_MODEL_DLRM);
    o->model.dim = 4;
    o->model.n_bottom = 1;
    o->model.bottom[0] = 8;
    o->model.n_top = 1;
    o->model.top[0] = 8;
    o->emb.dim = 4;
    o->train_path = trainf;
    o->test_path = testf;
    o->batch = 256;
    o->workers = 2;
    o->mode = GR_MODE_SYNC;
    o->progress_s = 0;
}

static void test_second_sync_trainer_refused(void **state)
{
    (void)state;
    /* Alone, on a fresh cluster: the reference. */
    gr_train_result ref, res;
    gr_train_opts o;
    small_opts(&o);
    {
        gr_local_cluster *cl;
        assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = gr_local_cluster_servers(cl);
        gr_client *c;
        assert_int_equal(gr_client_create(&cc, &c), 0);
        int rc;
        gr_train_backend be = sync_backend(c, 0, false, &rc);
        assert_int_equal(rc, 0);
        assert_int_equal(gr_train_run(&o, &be, &ref), 0);
        gr_ps_backend_finish(&be);
        gr_train_backend_destroy(&be);
        gr_client_destroy(c);
        gr_local_cluster_stop(cl);
    }
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    gr_client *c1, *c2;
    assert_int_equal(gr_client_create(&cc, &c1), 0);
    assert_int_equal(gr_client_create(&cc, &c2), 0);
    int rc;
    gr_train_backend first = sync_backend(c1, 0, false, &rc);
    assert_int_equal(rc, 0);

    /* A second trainer with the same settings: refused, naming the running job. */
    gr_train_backend second = sync_backend(c2, 0, false, &rc);
    assert_int_equal(rc, GR_EBUSY);
    const char *msg = gr_errmsg();
    assert_non_null(strstr(msg, "runs the sync job of another trainer"));
    assert_non_null(strstr(msg, "mode sync, 2 workers"));
    assert_non_null(strstr(msg, "started 20"));
    assert_non_null(strstr(msg, "s ago, at step 0"));
    char pid[32];
    snprintf(pid, sizeof pid, ":%ld (id ", (long)getpid());
    assert_non_null(strstr(msg, pid));
    assert_non_null(strstr(msg, "--sync-reset"));
    (void)second;

    /* Another owner's clear does not take the job away; an owner-less config (an older
     * client) joins it as before. */
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    gr_client_sync_owner other = {0x77, 1, "someone-else:1"};
    assert_int_equal(gr_client_sync_configure_owned(c2, &sc, &other, GR_CLIENT_SYNC_CLEAR, NULL),
                     GR_EBUSY);
    assert_non_null(strstr(gr_errmsg(), "not cleared"));
    assert_int_equal(gr_client_sync_configure(c2, &sc, 0, NULL), 0);

    /* The first trainer runs unaffected: bitwise the run it makes alone. */
    assert_int_equal(gr_train_run(&o, &first, &res), 0);
    assert_memory_equal(&res.test_auc, &ref.test_auc, sizeof ref.test_auc);
    assert_memory_equal(&res.test_logloss, &ref.test_logloss, sizeof ref.test_logloss);
    assert_int_equal(res.steps, ref.steps);
    assert_int_equal(gr_ps_backend_finish(&first), 0);
    gr_train_backend_destroy(&first);

    /* Its job is gone after its finish: a new trainer installs its own. */
    gr_train_backend third = sync_backend(c2, 0, false, &rc);
    assert_int_equal(rc, 0);
    gr_train_backend_destroy(&third);
    /* A job left behind (its trainer gone) is replaced with reset, as --sync-reset. */
    gr_train_backend fourth = sync_backend(c1, 0, false, &rc);
    assert_int_equal(rc, GR_EBUSY);
    fourth = sync_backend(c1, 0, true, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(gr_ps_backend_finish(&fourth), 0);
    gr_train_backend_destroy(&fourth);
    gr_client_destroy(c1);
    gr_client_destroy(c2);
    gr_local_cluster_stop(cl);
}

/* Through the command: a second `granary train --mode sync` exits 1 naming the job. */
static void test_cli_second_trainer(void **state)
{
    (void)state;
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    const char *servers = gr_local_cluster_servers(cl);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    int rc;
    gr_train_backend first = sync_backend(c, 0, false, &rc);
    assert_int_equal(rc, 0);
    static char out[8192];
    const char *args[] = {"train", "--servers", servers, "--train", trainf, "--mode", "sync",
                          "--workers", "2", "--progress", "0", NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "runs the sync job of another trainer"));
    assert_non_null(strstr(out, "mode sync, 2 workers"));
    /* The first job is still there: the same owner configures it again as a join. */
    assert_int_equal(gr_ps_backend_finish(&first), 0);
    gr_train_backend_destroy(&first);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_with_rows),
        cmocka_unit_test(test_second_sync_trainer_refused),
        cmocka_unit_test(test_cli_second_trainer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
