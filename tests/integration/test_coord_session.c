/* Integration (ZooKeeper): sessions. A member stopped with SIGSTOP past its session timeout
 * loses its ephemeral znode (the others see it gone); after SIGCONT its session callback says
 * expired, it would not accept writes (not registered), and it registers again under a new id
 * by itself. ZooKeeper itself restarted mid-run: members reconnect and carry on; the layout,
 * the election and compare-and-set work again; nothing is fatal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

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

static gr_coord *open_job(const char *url, uint32_t session_ms)
{
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.session_timeout_ms = session_ms;
    gr_coord *c = NULL;
    int rc = gr_coord_open(url, &o, &c);
    if (rc) fail_msg("open %s: %s", url, gr_errmsg());
    return c;
}

/* Whether id is listed (a listing that fails is retried: "gone" must mean gone). */
static bool has_member(gr_coord *c, const char *id)
{
    gr_coord_member *m;
    size_t n;
    int rc;
    for (int i = 0; (rc = gr_coord_members(c, &m, &n)) != 0 && i < 100; i++) gr_sleep_ms(50);
    if (rc) fail_msg("members: %s", gr_errmsg());
    bool found = false;
    for (size_t i = 0; i < n; i++) found |= !strcmp(m[i].id, id);
    free(m);
    return found;
}

static void test_stopped_member_expires_and_reregisters(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/granary/t-expiry", url, sizeof url);
    coord_child ch;
    coord_child_opts o = {url, GR_COORD_SHARD, 0, "127.0.0.1:7000", false, SESSION_MS};
    assert_int_equal(coord_child_start(&ch, &o), 0);
    char line[256];
    assert_int_equal(coord_child_expect(&ch, "registered ", line, sizeof line, 15000), 0);
    char first_id[256];
    snprintf(first_id, sizeof first_id, "%s", line + strlen("registered "));
    assert_int_equal(coord_child_expect(&ch, "writable 1", NULL, 0, 5000), 0);
    gr_coord *obs = open_job(url, SESSION_MS);
    assert_true(has_member(obs, first_id));

    /* Paused past the session timeout: the server drops its session and znode. */
    assert_int_equal(kill(ch.pid, SIGSTOP), 0);
    bool gone = false;
    for (int i = 0; i < 150 && !gone; i++) {
        gr_sleep_ms(100);
        gone = !has_member(obs, first_id);
    }
    assert_true(gone);
    gr_sleep_ms(500);
    assert_int_equal(kill(ch.pid, SIGCONT), 0);

    /* The first thing it says about writes once it runs again is "no": its lease ran out
     * while it was stopped, before the library noticed anything. */
    assert_int_equal(coord_child_expect(&ch, "writable ", line, sizeof line, 15000), 0);
    assert_string_equal(line, "writable 0");
    /* Back: it learns the session expired, says it is not registered, and comes back. */
    assert_int_equal(coord_child_expect(&ch, "session expired", line, sizeof line, 15000), 0);
    assert_string_equal(line, "session expired 0");
    assert_int_equal(coord_child_expect(&ch, "session connected", line, sizeof line, 15000), 0);
    assert_string_equal(line, "session connected 1");
    assert_int_equal(coord_child_expect(&ch, "registered ", line, sizeof line, 5000), 0);
    char back[64];
    assert_int_equal(coord_child_expect(&ch, "writable ", back, sizeof back, 5000), 0);
    assert_string_equal(back, "writable 1");
    const char *second_id = line + strlen("registered ");
    assert_string_not_equal(second_id, first_id);
    assert_true(has_member(obs, second_id));
    assert_false(has_member(obs, first_id));
    gr_coord_member *m;
    size_t n;
    assert_int_equal(gr_coord_members(obs, &m, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(m[0].role, GR_COORD_SHARD); /* the same record, registered again */
    assert_string_equal(m[0].address, "127.0.0.1:7000");
    assert_int_equal(m[0].pid, ch.pid);
    free(m);
    coord_child_kill(&ch);
    gr_coord_close(obs);
}

typedef struct session_log {
    int suspended, connected, expired;
} session_log;

static void on_session(void *arg, gr_coord_session s)
{
    session_log *l = arg;
    int *f = s == GR_COORD_SUSPENDED ? &l->suspended
             : s == GR_COORD_CONNECTED ? &l->connected
                                       : &l->expired;
    __atomic_add_fetch(f, 1, __ATOMIC_SEQ_CST);
}

static void test_zookeeper_restarted_mid_run(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/granary/t-restart", url, sizeof url);
    coord_child shard, worker;
    coord_child_opts so = {url, GR_COORD_SHARD, 0, "127.0.0.1:7000", false, 6000};
    coord_child_opts wo = {url, GR_COORD_WORKER, 0, NULL, true, 6000};
    assert_int_equal(coord_child_start(&shard, &so), 0);
    assert_int_equal(coord_child_expect(&shard, "registered ", NULL, 0, 15000), 0);
    assert_int_equal(coord_child_start(&worker, &wo), 0);
    assert_int_equal(coord_child_expect(&worker, "leader 1", NULL, 0, 15000), 0);
    gr_coord *obs = open_job(url, 6000);
    session_log log = {0, 0, 0};
    gr_coord_watch_session(obs, on_session, &log);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_init(&l, 1), 0);
    strcpy(l.shards[0].address, "127.0.0.1:7000");
    assert_int_equal(gr_coord_layout_cas(obs, &l), 0);

    assert_int_equal(zk_test_restart(&zk), 0);

    /* Everyone reconnects by themselves. */
    assert_int_equal(coord_child_expect(&shard, "session connected 1", NULL, 0, 30000), 0);
    assert_int_equal(coord_child_expect(&worker, "session connected 1", NULL, 0, 30000), 0);
    for (int i = 0; i < 300 && gr_coord_session_state(obs) != GR_COORD_CONNECTED; i++)
        gr_sleep_ms(100);
    assert_int_equal(gr_coord_session_state(obs), GR_COORD_CONNECTED);
    /* The watch hears of it on the coordinator's own thread, maybe a moment after the state
     * reads connected (seen once under ASan): wait for the call, too. */
    for (int i = 0; i < 100 && __atomic_load_n(&log.connected, __ATOMIC_SEQ_CST) < 1; i++)
        gr_sleep_ms(100);
    assert_true(__atomic_load_n(&log.suspended, __ATOMIC_SEQ_CST) >= 1);
    assert_true(__atomic_load_n(&log.connected, __ATOMIC_SEQ_CST) >= 1);
    /* The data survived, and compare-and-set goes on from the version we hold. */
    gr_coord_layout now;
    assert_int_equal(gr_coord_layout_get(obs, &now), 0);
    assert_int_equal(now.version, l.version);
    assert_string_equal(now.shards[0].address, "127.0.0.1:7000");
    gr_coord_layout_fini(&now);
    l.epoch++;
    assert_int_equal(gr_coord_layout_cas(obs, &l), 0);
    gr_coord_layout_fini(&l);
    /* Both members are there and the worker still (or again) leads. */
    gr_coord_member *m;
    size_t n = 0;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(gr_coord_members(obs, &m, &n), 0);
        free(m);
        if (n == 2) break;
        gr_sleep_ms(100);
    }
    assert_int_equal(n, 2);
    gr_coord_member lead;
    assert_int_equal(gr_coord_leader(obs, &lead), 0);
    assert_int_equal(lead.pid, worker.pid);
    /* Nothing was fatal: both member processes live. */
    assert_int_equal(waitpid(shard.pid, NULL, WNOHANG), 0);
    assert_int_equal(waitpid(worker.pid, NULL, WNOHANG), 0);
    coord_child_kill(&shard);
    coord_child_kill(&worker);
    gr_coord_close(obs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stopped_member_expires_and_reregisters),
        cmocka_unit_test(test_zookeeper_restarted_mid_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
