/* Integration (ZooKeeper): electing the chief. Three candidates in their own processes; the
 * first leads; killing a middle candidate changes nothing (the last one re-links to the
 * leader, it does not take over); killing the leader with SIGKILL hands the lead to the next
 * once its session times out; a candidate that resigns hands it over at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/coord.h"
#include "tests/support/coord_child.h"
#include "tests/support/zk_harness.h"

#define SESSION_MS 2000u

static zk_test_server zk;

static int setup(void **state)
{
    (void)state;
    if (!zk_test_available()) return 0;
    return zk_test_start(&zk);
}

static int teardown(void **state)
{
    (void)state;
    zk_test_destroy(&zk);
    return 0;
}

static gr_coord *open_job(const char *url)
{
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.session_timeout_ms = SESSION_MS;
    gr_coord *c = NULL;
    int rc = gr_coord_open(url, &o, &c);
    if (rc) fail_msg("open %s: %s", url, gr_errmsg());
    return c;
}

static void start_candidate(coord_child *ch, const char *url, int32_t rank)
{
    coord_child_opts o = {url, GR_COORD_WORKER, rank, NULL, true, SESSION_MS};
    assert_int_equal(coord_child_start(ch, &o), 0);
    /* One at a time, so their sequence order is their rank order. */
    assert_int_equal(coord_child_expect(ch, "registered ", NULL, 0, 15000), 0);
}

static void expect_leader_pid(gr_coord *obs, pid_t pid)
{
    gr_coord_member m;
    int rc = gr_coord_leader(obs, &m);
    if (rc) fail_msg("leader: %s", gr_errmsg());
    assert_int_equal(m.pid, pid);
    assert_int_equal(m.role, GR_COORD_WORKER);
}

static void test_leader_killed_next_takes_over(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/granary/t-elect", url, sizeof url);
    /* Children first: this process opens no coordinator before it forks. */
    coord_child a, b, c;
    start_candidate(&a, url, 0);
    start_candidate(&b, url, 1);
    start_candidate(&c, url, 2);
    assert_int_equal(coord_child_expect(&a, "leader 1", NULL, 0, 10000), 0);
    gr_coord *obs = open_job(url);
    expect_leader_pid(obs, a.pid);

    /* The middle candidate dies: c now watches a, and must not think it leads. */
    coord_child_kill(&b);
    assert_int_equal(coord_child_expect(&c, "leader 1", NULL, 0, SESSION_MS + 2000), -1);
    expect_leader_pid(obs, a.pid);

    /* The leader dies without a word: once its session times out, c leads. */
    uint64_t t0 = gr_now_ns();
    coord_child_kill(&a);
    assert_int_equal(coord_child_expect(&c, "leader 1", NULL, 0, SESSION_MS * 3 + 5000), 0);
    double took = (double)(gr_now_ns() - t0) / 1e9;
    fprintf(stderr, "  takeover after SIGKILL of the leader: %.2f s (session %u ms)\n", took,
            SESSION_MS);
    expect_leader_pid(obs, c.pid);

    coord_child_kill(&c);
    /* Nobody left (c's node goes with its session). */
    int rc = 0;
    for (int i = 0; i < 100; i++) {
        gr_coord_member m;
        if ((rc = gr_coord_leader(obs, &m)) == GR_ENOENT) break;
        gr_sleep_ms(100);
    }
    assert_int_equal(rc, GR_ENOENT);
    gr_coord_close(obs);
}

typedef struct leader_log {
    int ups, downs;
} leader_log;

static void on_leader(void *arg, bool leader)
{
    leader_log *l = arg;
    __atomic_add_fetch(leader ? &l->ups : &l->downs, 1, __ATOMIC_SEQ_CST);
}

static void test_resign_hands_over_at_once(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/granary/t-resign", url, sizeof url);
    gr_coord *x = open_job(url), *y = open_job(url);
    leader_log lx = {0, 0}, ly = {0, 0};
    gr_coord_member m;
    gr_coord_member_init(&m, GR_COORD_WORKER);
    assert_int_equal(gr_coord_elect(x, on_leader, &lx), GR_ENOENT);
    m.index = 0;
    assert_int_equal(gr_coord_register(x, &m, NULL), 0);
    m.index = 1;
    assert_int_equal(gr_coord_register(y, &m, NULL), 0);
    assert_int_equal(gr_coord_elect(x, on_leader, &lx), 0);
    assert_int_equal(gr_coord_elect(y, on_leader, &ly), 0);
    for (int i = 0; i < 200 && !gr_coord_is_leader(x); i++) gr_sleep_ms(10);
    assert_true(gr_coord_is_leader(x));
    gr_sleep_ms(200);
    assert_false(gr_coord_is_leader(y));
    uint64_t t0 = gr_now_ns();
    assert_int_equal(gr_coord_resign(x), 0);
    assert_false(gr_coord_is_leader(x));
    for (int i = 0; i < 500 && !gr_coord_is_leader(y); i++) gr_sleep_ms(2);
    assert_true(gr_coord_is_leader(y));
    /* No session timeout involved: the watch on the predecessor fires at once. */
    assert_true(gr_now_ns() - t0 < (uint64_t)SESSION_MS * 1000000u);
    assert_int_equal(__atomic_load_n(&lx.ups, __ATOMIC_SEQ_CST), 1);
    assert_int_equal(__atomic_load_n(&lx.downs, __ATOMIC_SEQ_CST), 1);
    assert_int_equal(__atomic_load_n(&ly.ups, __ATOMIC_SEQ_CST), 1);
    gr_coord_member lead;
    assert_int_equal(gr_coord_leader(x, &lead), 0);
    assert_int_equal(lead.index, 1);
    gr_coord_close(y);
    gr_coord_close(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leader_killed_next_takes_over),
        cmocka_unit_test(test_resign_hands_over_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
