/* Integration: a sync job with a dense lag (delayed synchronous SGD, docs/sync.md) over an
 * embedded 2-shard cluster and the client, as hybrid's dense step runs it.
 *  - two workers push fixed dense gradients for 6 steps with lag 1 in two arrival orders (one
 *    worker a step ahead, then the other): the dense parameter ends bitwise equal in both, and
 *    equal to lock-step (lag 0), since every step applies the same sum in worker order;
 *  - the acquire answers step t once step t - 2 is applied, with the step itself as the tag;
 *    a step further ahead waits (and times out naming what it waits for), a push from beyond
 *    the lag is refused;
 *  - the job's settings include the lag: a config with another lag is refused, naming it, and
 *    the shard's stats show it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "granary/cluster.h"

#define DENSE_N 64
#define STEPS 6
#define SHARDS 2

typedef struct job {
    gr_local_cluster *cl;
    gr_client *c;
    uint64_t want[2][SHARDS];
} job;

static void job_up(job *j, uint32_t lag)
{
    memset(j, 0, sizeof *j);
    assert_int_equal(gr_local_cluster_start(SHARDS, 2, &j->cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(j->cl);
    assert_int_equal(gr_client_create(&cc, &j->c), 0);
    assert_int_equal(gr_client_dense_create(j->c, "{\"name\":\"mlp\",\"size\":64,\"seed\":3,"
                                                  "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01}}"),
                     0);
    gr_client_sync_config sc = {.mode = GR_CLIENT_SYNC_SYNC, .workers = 2, .dense_lag = lag};
    assert_int_equal(gr_client_sync_configure(j->c, &sc, 0, NULL), 0);
}

static void job_down(job *j)
{
    gr_client_destroy(j->c);
    gr_local_cluster_stop(j->cl);
}

/* Worker w's gradient for step t: fixed, with magnitudes that make float sums depend on
 * their order. */
static void grad_of(uint32_t w, uint64_t t, float *g)
{
    for (int i = 0; i < DENSE_N; i++)
        g[i] = (w ? -1.0f : 1.0f) * (float)((i * 7 + (int)t * 13) % 17) * (i % 2 ? 1e4f : 1e-3f) +
               (float)w * 0.37f;
}

/* Worker w starts its next step (acquire on both shards: the tag must be the step) and pushes
 * its dense gradient for it. */
static void step(job *j, uint32_t w)
{
    uint64_t tags[SHARDS], t = j->want[w][0];
    assert_int_equal(gr_client_sync_acquire(j->c, w, j->want[w], 5000, tags, NULL), 0);
    for (int s = 0; s < SHARDS; s++) {
        assert_true(tags[s] == t);
        j->want[w][s] = tags[s] + 1;
    }
    float g[DENSE_N];
    grad_of(w, t, g);
    gr_client_dense_grad d = {"mlp", g, DENSE_N};
    uint32_t out[SHARDS];
    assert_int_equal(gr_client_push_step(j->c, w, tags, NULL, 0, &d, 1, out), 0);
}

static void run_order(uint32_t lag, const uint32_t *order, size_t n, float *dense)
{
    job j;
    job_up(&j, lag);
    for (size_t i = 0; i < n; i++) step(&j, order[i]);
    assert_int_equal(gr_client_dense_pull(j.c, "mlp", dense, DENSE_N), 0);
    job_down(&j);
}

static void test_orders_give_the_same_bits(void **state)
{
    (void)state;
    /* Lock-step, worker 0 one step ahead, worker 1 one step ahead. */
    static const uint32_t lock[] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    static const uint32_t w0_ahead[] = {0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1};
    static const uint32_t w1_ahead[] = {1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0};
    float ref[DENSE_N], a[DENSE_N], b[DENSE_N], init[DENSE_N];
    run_order(0, lock, 2 * STEPS, ref);
    run_order(1, w0_ahead, 2 * STEPS, a);
    run_order(1, w1_ahead, 2 * STEPS, b);
    assert_memory_equal(a, ref, sizeof ref);
    assert_memory_equal(b, ref, sizeof ref);
    /* It trained: the values moved from their initialisation. */
    job j;
    job_up(&j, 1);
    assert_int_equal(gr_client_dense_pull(j.c, "mlp", init, DENSE_N), 0);
    job_down(&j);
    assert_true(memcmp(init, ref, sizeof ref) != 0);
}

static double sync_stat(gr_client *c, uint32_t s, const char *key)
{
    char *txt = NULL;
    assert_int_equal(gr_client_stats(c, s, &txt), 0);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "sync"), key);
    assert_true(cJSON_IsNumber(v));
    double d = v->valuedouble;
    cJSON_Delete(root);
    return d;
}

static void test_bound_and_refusals(void **state)
{
    (void)state;
    job j;
    job_up(&j, 1);
    step(&j, 0);
    step(&j, 0); /* step 1 before step 0 is applied: lag 1 allows it */
    /* Step 2 needs step 0 applied, which waits for worker 1. */
    uint64_t tags[SHARDS];
    assert_int_equal(gr_client_sync_acquire(j.c, 0, j.want[0], 100, tags, NULL), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "waiting for step 2"));
    /* A push tagged beyond G + 1 is refused on the shard. */
    uint64_t ahead[SHARDS] = {2, 2};
    float g[DENSE_N];
    grad_of(0, 2, g);
    gr_client_dense_grad d = {"mlp", g, DENSE_N};
    uint32_t out[SHARDS];
    assert_int_equal(gr_client_push_step(j.c, 1, ahead, NULL, 0, &d, 1, out), GR_ESTALE);
    assert_true(sync_stat(j.c, 0, "dense_lag") == 1);
    assert_true(sync_stat(j.c, 0, "ahead") == 1);
    assert_true(sync_stat(j.c, 0, "step") == 0);
    step(&j, 1);
    for (int s = 0; s < SHARDS; s++) assert_true(sync_stat(j.c, (uint32_t)s, "step") == 1);
    /* Another lag is another job. */
    gr_client_sync_config other = {.mode = GR_CLIENT_SYNC_SYNC, .workers = 2, .dense_lag = 0};
    assert_int_equal(gr_client_sync_configure(j.c, &other, 0, NULL), GR_EBUSY);
    assert_non_null(strstr(gr_errmsg(), "dense lag 1"));
    /* A lag outside sync is refused with what was wrong. */
    gr_client_sync_config semi = {.mode = GR_CLIENT_SYNC_SEMISYNC, .workers = 2, .aggregate = 1,
                                  .dense_lag = 1};
    assert_int_equal(gr_client_sync_configure(j.c, &semi, GR_CLIENT_SYNC_RESET, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "dense lag"));
    job_down(&j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders_give_the_same_bits),
        cmocka_unit_test(test_bound_and_refusals),
    };
    return cmocka_run_group_tests_name("dense_lag", tests, NULL, NULL);
}
