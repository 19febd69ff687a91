/* Integration (ZooKeeper): the layout znode changes only by compare-and-set. Two claimants
 * that read the same version race for one vacant shard index: exactly one wins, the other
 * gets GR_ESTALE and sees the winner after re-reading; a layout watch reports each version.
 * Also: membership lists and watches, and the startup barrier. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/coord.h"
#include "tests/support/zk_harness.h"

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

static gr_coord *open_job(const char *path)
{
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, path, url, sizeof url);
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.session_timeout_ms = 3000;
    gr_coord *c = NULL;
    int rc = gr_coord_open(url, &o, &c);
    if (rc) fprintf(stderr, "open %s: %s\n", url, gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(gr_coord_backend_of(c), GR_COORD_ZOOKEEPER);
    return c;
}

/* ---- compare-and-set race ---- */

typedef struct claimant {
    gr_coord *c;
    const char *address;
    pthread_barrier_t *go;
    gr_coord_layout read; /* read before the barrier, so both hold the same version */
    int rc;
} claimant;

static void *claim(void *arg)
{
    claimant *cl = arg;
    gr_coord_layout *l = &cl->read;
    snprintf(l->shards[1].address, sizeof l->shards[1].address, "%s", cl->address);
    l->epoch++;
    pthread_barrier_wait(cl->go);
    cl->rc = gr_coord_layout_cas(cl->c, l);
    return NULL;
}

typedef struct layout_seen {
    pthread_mutex_t mu;
    int calls;
    uint64_t last_epoch;
    int64_t last_version;
} layout_seen;

static void on_layout(void *arg, const gr_coord_layout *l)
{
    layout_seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    s->last_epoch = l->epoch;
    s->last_version = l->version;
    pthread_mutex_unlock(&s->mu);
}

static void wait_epoch(layout_seen *s, uint64_t epoch)
{
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&s->mu);
        bool ok = s->last_epoch == epoch;
        pthread_mutex_unlock(&s->mu);
        if (ok) return;
        gr_sleep_ms(25);
    }
    fail_msg("the layout watch never reported epoch %llu", (unsigned long long)epoch);
}

static void test_layout_cas_race_one_winner(void **state)
{
    (void)state;
    gr_coord *a = open_job("/granary/t-cas");
    gr_coord *b = open_job("/granary/t-cas");
    gr_coord *watcher = open_job("/granary/t-cas");
    layout_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    assert_int_equal(gr_coord_watch_layout(watcher, on_layout, &seen), 0);

    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_get(a, &l), GR_ENOENT);
    assert_int_equal(gr_coord_layout_init(&l, 2), 0);
    snprintf(l.shards[0].address, sizeof l.shards[0].address, "127.0.0.1:7000");
    assert_int_equal(gr_coord_layout_cas(a, &l), 0);
    assert_int_equal(l.version, 0);
    /* A second create loses: the layout exists. */
    gr_coord_layout again;
    assert_int_equal(gr_coord_layout_init(&again, 3), 0);
    assert_int_equal(gr_coord_layout_cas(b, &again), GR_ESTALE);
    gr_coord_layout_fini(&again);
    gr_coord_layout_fini(&l);
    wait_epoch(&seen, 1);

    /* Both read version 0, then race to put their address at vacant index 1. */
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    claimant ca = {a, "127.0.0.1:7001", &go, {0}, -99};
    claimant cb = {b, "127.0.0.1:7002", &go, {0}, -99};
    assert_int_equal(gr_coord_layout_get(a, &ca.read), 0);
    assert_int_equal(gr_coord_layout_get(b, &cb.read), 0);
    assert_int_equal(ca.read.version, 0);
    assert_int_equal(cb.read.version, 0);
    assert_string_equal(ca.read.shards[1].address, "");
    pthread_t ta, tb;
    pthread_create(&ta, NULL, claim, &ca);
    pthread_create(&tb, NULL, claim, &cb);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&go);
    int wins = (ca.rc == 0) + (cb.rc == 0);
    assert_int_equal(wins, 1);
    assert_int_equal(ca.rc == 0 ? cb.rc : ca.rc, GR_ESTALE);
    const char *winner = ca.rc == 0 ? ca.address : cb.address;

    gr_coord_layout now;
    assert_int_equal(gr_coord_layout_get(b, &now), 0);
    assert_int_equal(now.version, 1);
    assert_int_equal(now.epoch, 2);
    assert_string_equal(now.shards[1].address, winner);
    assert_string_equal(now.shards[0].address, "127.0.0.1:7000");
    assert_int_equal(now.slot_map[GR_SLOTS - 1], 1);
    /* The loser's stale write is still refused after the winner's. */
    claimant *loser = ca.rc == 0 ? &cb : &ca;
    assert_int_equal(gr_coord_layout_cas(loser->c, &loser->read), GR_ESTALE);
    gr_coord_layout_fini(&now);
    wait_epoch(&seen, 2);
    pthread_mutex_lock(&seen.mu);
    assert_int_equal(seen.last_version, 1);
    pthread_mutex_unlock(&seen.mu);

    gr_coord_layout_fini(&ca.read);
    gr_coord_layout_fini(&cb.read);
    gr_coord_close(watcher);
    gr_coord_close(b);
    gr_coord_close(a);
}

/* ---- membership and the barrier ---- */

typedef struct members_seen {
    pthread_mutex_t mu;
    size_t n, joined, lost;
    char last_lost[GR_COORD_ID_MAX];
} members_seen;

static void on_members(void *arg, const gr_coord_members_event *ev)
{
    members_seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->n = ev->n;
    s->joined += ev->n_joined;
    s->lost += ev->n_lost;
    if (ev->n_lost) snprintf(s->last_lost, sizeof s->last_lost, "%s", ev->lost[0].id);
    pthread_mutex_unlock(&s->mu);
}

static void wait_members(members_seen *s, size_t n, size_t lost)
{
    for (int i = 0; i < 200; i++) {
        pthread_mutex_lock(&s->mu);
        bool ok = s->n == n && s->lost == lost;
        pthread_mutex_unlock(&s->mu);
        if (ok) return;
        gr_sleep_ms(25);
    }
    fail_msg("members watch: wanted %zu members and %zu losses, saw %zu and %zu", n, lost, s->n,
             s->lost);
}

static gr_coord *member(const char *path, gr_coord_role role, int32_t index, char *id)
{
    gr_coord *c = open_job(path);
    gr_coord_member m;
    gr_coord_member_init(&m, role);
    m.index = index;
    if (role != GR_COORD_WORKER) snprintf(m.address, sizeof m.address, "127.0.0.1:%d", 7100 + index);
    assert_int_equal(gr_coord_register(c, &m, id), 0);
    assert_true(gr_coord_registered(c));
    return c;
}

static void test_members_and_barrier(void **state)
{
    (void)state;
    const char *job = "/granary/t-members";
    gr_coord *obs = open_job(job);
    members_seen seen = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, ""};
    assert_int_equal(gr_coord_watch_members(obs, on_members, &seen), 0);
    /* Nobody yet: the barrier times out and says what it saw. */
    assert_int_equal(gr_coord_barrier(obs, 2, 1, 100), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "0 of 2 shards and 0 of 1 workers"));

    char id0[GR_COORD_ID_MAX], id1[GR_COORD_ID_MAX], idw[GR_COORD_ID_MAX], ids[GR_COORD_ID_MAX];
    gr_coord *s0 = member(job, GR_COORD_SHARD, 0, id0);
    gr_coord *sb = member(job, GR_COORD_STANDBY, -1, ids);
    gr_coord *w0 = member(job, GR_COORD_WORKER, 0, idw);
    gr_coord_member twice;
    gr_coord_member_init(&twice, GR_COORD_WORKER);
    assert_int_equal(gr_coord_register(w0, &twice, NULL), GR_EEXIST);
    wait_members(&seen, 3, 0);
    /* A standby is not a shard: still one of two. */
    assert_int_equal(gr_coord_barrier(obs, 2, 1, 200), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "1 of 2 shards and 1 of 1 workers"));
    gr_coord *s1 = member(job, GR_COORD_SHARD, 1, id1);
    assert_int_equal(gr_coord_barrier(obs, 2, 1, 5000), 0);

    gr_coord_member *all;
    size_t n;
    assert_int_equal(gr_coord_members(obs, &all, &n), 0);
    assert_int_equal(n, 4);
    /* Sequence order is registration order. */
    assert_string_equal(all[0].id, id0);
    assert_string_equal(all[1].id, ids);
    assert_string_equal(all[2].id, idw);
    assert_string_equal(all[3].id, id1);
    assert_int_equal(all[0].role, GR_COORD_SHARD);
    assert_int_equal(all[0].index, 0);
    assert_string_equal(all[0].address, "127.0.0.1:7100");
    assert_true(all[0].pid > 0);
    assert_int_equal(all[1].role, GR_COORD_STANDBY);
    assert_int_equal(all[2].role, GR_COORD_WORKER);
    free(all);

    /* The standby takes index 1's place in its record (update keeps the id). */
    gr_coord_member up;
    gr_coord_member_init(&up, GR_COORD_SHARD);
    up.index = 1;
    assert_int_equal(gr_coord_update(sb, &up), 0);
    gr_coord_member self;
    gr_coord_self(sb, &self);
    assert_string_equal(self.id, ids);
    assert_int_equal(self.role, GR_COORD_SHARD);

    /* A member that leaves shows as lost. */
    gr_coord_close(s0);
    wait_members(&seen, 3, 1);
    pthread_mutex_lock(&seen.mu);
    assert_string_equal(seen.last_lost, id0);
    pthread_mutex_unlock(&seen.mu);
    gr_coord_close(s1);
    gr_coord_close(w0);
    gr_coord_close(sb);
    gr_coord_close(obs);
}

static void test_bad_specs(void **state)
{
    (void)state;
    gr_coord *c;
    assert_int_equal(gr_coord_open("zk://", NULL, &c), GR_EINVAL);
    assert_int_equal(gr_coord_open("zk://127.0.0.1:1", NULL, &c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "zk://HOST:PORT"));
    assert_int_equal(gr_coord_open("zk://127.0.0.1:1/job/", NULL, &c), GR_EINVAL);
    /* Nothing listens there: a clear timeout, not a hang. */
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.connect_timeout_ms = 300;
    assert_int_equal(gr_coord_open("zk://127.0.0.1:1/job", &o, &c), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "no ZooKeeper server answered at 127.0.0.1:1"));
}

/* Several servers in the spec: a dead one first does not stop the handle from reaching the
 * live one (the library tries them in turn). */
static void test_host_list_with_a_dead_server(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    snprintf(url, sizeof url, "zk://127.0.0.1:1,%s/granary/t-hosts", zk.hosts);
    gr_coord_options o;
    gr_coord_options_default(&o);
    gr_coord *c;
    int rc = gr_coord_open(url, &o, &c);
    if (rc) fail_msg("open %s: %s", url, gr_errmsg());
    gr_coord_member m;
    gr_coord_member_init(&m, GR_COORD_WORKER);
    assert_int_equal(gr_coord_register(c, &m, NULL), 0);
    assert_int_equal(gr_coord_barrier(c, 0, 1, 5000), 0);
    gr_coord_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_cas_race_one_winner),
        cmocka_unit_test(test_members_and_barrier),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_host_list_with_a_dead_server),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
