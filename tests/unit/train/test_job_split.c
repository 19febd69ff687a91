/* Unit tests for one process of a job of several (gr_train_opts.job): the training file is cut
 * by the job's worker index, so ranks 0 and 1 of 1 worker each read exactly what workers 0 and
 * 1 of one process read; the hooks are called once, in order; combinations a job of several
 * processes cannot run are refused. The local backend; no coordinator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/train.h"

static char tmpdir[64], train_path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gr_jobsplit_XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    gr_datagen_opts o = {.train_rows = 30001, .test_rows = 100, .seed = 5, .threads = 2};
    gr_datagen_result r;
    if (gr_datagen_run(tmpdir, &o, &r)) return -1;
    snprintf(train_path, sizeof train_path, "%s/train.tsv", tmpdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct hooks {
    bool chief;
    int started, waited, order; /* order: 1 when started came before wait_others */
} hooks;

static bool is_chief(void *ctx) { return ((hooks *)ctx)->chief; }
static int started(void *ctx)
{
    ((hooks *)ctx)->started++;
    return GR_OK;
}
static void wait_others(void *ctx)
{
    hooks *h = ctx;
    h->waited++;
    h->order = h->started == 1;
}

static void opts(gr_train_opts *o, unsigned workers)
{
    gr_train_opts_default(o, GR_MODEL_LR);
    o->train_path = train_path;
    o->progress_s = 0;
    o->batch = 256;
    o->workers = workers;
    o->pipeline = false;
    o->data = GR_TRAIN_DATA_STATIC;
}

static void test_ranks_read_the_workers_ranges(void **state)
{
    (void)state;
    gr_train_opts o;
    gr_train_backend be;
    gr_train_result one;
    opts(&o, 2);
    assert_int_equal(gr_local_backend_create(NULL, &be), GR_OK);
    assert_int_equal(gr_train_run(&o, &be, &one), GR_OK);
    gr_train_backend_destroy(&be);
    assert_int_equal(one.examples, 30001);

    uint64_t examples = 0;
    for (unsigned rank = 0; rank < 2; rank++) {
        hooks h = {.chief = rank == 0};
        gr_train_job job = {.ranks = 2, .rank = rank, .ctx = &h, .is_chief = is_chief,
                            .started = started, .wait_others = wait_others};
        opts(&o, 1);
        o.job = &job;
        gr_train_result r;
        assert_int_equal(gr_local_backend_create(NULL, &be), GR_OK);
        assert_int_equal(gr_train_run(&o, &be, &r), GR_OK);
        gr_train_backend_destroy(&be);
        /* Rank r's one worker is the job's worker r: the range worker r of one process read. */
        assert_int_equal(r.worker_steps[0], one.worker_steps[rank]);
        assert_int_equal(h.started, 1);
        assert_int_equal(h.waited, 1);
        assert_int_equal(h.order, 1);
        examples += r.examples;
    }
    assert_int_equal(examples, one.examples);
}

static void test_refused_combinations(void **state)
{
    (void)state;
    hooks h = {.chief = true};
    gr_train_job job = {.ranks = 2, .rank = 2, .ctx = &h, .is_chief = is_chief};
    gr_train_opts o;
    opts(&o, 1);
    o.job = &job;
    gr_train_backend be;
    gr_train_result r;
    assert_int_equal(gr_local_backend_create(NULL, &be), GR_OK);
    assert_int_equal(gr_train_run(&o, &be, &r), GR_EINVAL); /* rank 2 of 2 */
    job.rank = 1;
    o.data = GR_TRAIN_DATA_SHARED;
    assert_int_equal(gr_train_run(&o, &be, &r), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "static ranges"));
    o.data = GR_TRAIN_DATA_STATIC;
    job.is_chief = NULL;
    assert_int_equal(gr_train_run(&o, &be, &r), GR_EINVAL);
    gr_train_backend_destroy(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_read_the_workers_ranges),
        cmocka_unit_test(test_refused_combinations),
    };
    return cmocka_run_group_tests_name("train_job_split", tests, setup, teardown);
}
