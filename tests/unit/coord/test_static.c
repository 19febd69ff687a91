/* Unit tests for the static coord backend: the layout from a server list, a cluster file or
 * the embedded cluster's own write; compare-and-set in memory; the barrier, the election and
 * the callbacks with nothing running. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/coord.h"

static void test_server_list(void **state)
{
    (void)state;
    gr_coord *c;
    assert_int_equal(gr_coord_open("127.0.0.1:7000,127.0.0.1:7001", NULL, &c), 0);
    assert_int_equal(gr_coord_backend_of(c), GR_COORD_STATIC);
    assert_int_equal(gr_coord_session_state(c), GR_COORD_CONNECTED);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_get(c, &l), 0);
    assert_int_equal(l.n_shards, 2);
    assert_int_equal(l.version, 0);
    assert_int_equal(l.epoch, 1);
    assert_string_equal(l.shards[1].address, "127.0.0.1:7001");
    gr_coord_layout_fini(&l);
    /* A static list is up by definition; workers are not counted. */
    assert_int_equal(gr_coord_barrier(c, 2, 8, 0), 0);
    assert_int_equal(gr_coord_barrier(c, 3, 0, 0), GR_ETIMEDOUT);
    gr_coord_close(c);

    assert_int_equal(gr_coord_open("127.0.0.1:7000,,x:1", NULL, &c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "server 1 of"));
    assert_int_equal(gr_coord_open("nocolon", NULL, &c), GR_EINVAL);
}

static void test_cluster_file(void **state)
{
    (void)state;
    char path[] = "/tmp/granary-coord-XXXXXX.json";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    const char *j = "{\"epoch\":4,\"shards\":[{\"index\":0,\"address\":\"h:1\"},"
                    "{\"index\":1,\"address\":\"h:2\"}],\"slots\":[[0,99,1],[100,16383,0]]}";
    assert_int_equal(write(fd, j, strlen(j)), (ssize_t)strlen(j));
    close(fd);
    gr_coord *c;
    assert_int_equal(gr_coord_open(path, NULL, &c), 0);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_get(c, &l), 0);
    assert_int_equal(l.epoch, 4);
    assert_int_equal(l.slot_map[0], 1);
    assert_int_equal(l.slot_map[100], 0);
    gr_coord_layout_fini(&l);
    gr_coord_close(c);
    char spec[64];
    snprintf(spec, sizeof spec, "file:%s", path);
    assert_int_equal(gr_coord_open(spec, NULL, &c), 0);
    gr_coord_close(c);
    unlink(path);
    assert_int_equal(gr_coord_open(spec, NULL, &c), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "cluster file"));
}

typedef struct seen {
    pthread_mutex_t mu;
    int layouts, members, leader_calls;
    uint64_t epoch;
    size_t n_members;
    bool leader;
} seen;

static void on_layout(void *arg, const gr_coord_layout *l)
{
    seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->layouts++;
    s->epoch = l->epoch;
    pthread_mutex_unlock(&s->mu);
}

static void on_members(void *arg, const gr_coord_members_event *ev)
{
    seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->members++;
    s->n_members = ev->n;
    pthread_mutex_unlock(&s->mu);
}

static void on_leader(void *arg, bool leader)
{
    seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->leader_calls++;
    s->leader = leader;
    pthread_mutex_unlock(&s->mu);
}

/* Waits until cond(s) holds (the callbacks run on the handle's thread). */
#define WAIT_FOR(s, cond)                                                                    \
    do {                                                                                     \
        bool ok_ = false;                                                                    \
        for (int i_ = 0; i_ < 400 && !ok_; i_++) {                                           \
            pthread_mutex_lock(&(s)->mu);                                                    \
            ok_ = (cond);                                                                    \
            pthread_mutex_unlock(&(s)->mu);                                                  \
            if (!ok_) gr_sleep_ms(5);                                                        \
        }                                                                                    \
        if (!ok_) fail_msg("never: %s", #cond);                                              \
    } while (0)

static void test_embedded_cas_and_callbacks(void **state)
{
    (void)state;
    gr_coord *c;
    assert_int_equal(gr_coord_open(NULL, NULL, &c), 0);
    assert_string_equal(gr_coord_spec(c), "");
    seen s = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0, false};
    assert_int_equal(gr_coord_watch_layout(c, on_layout, &s), 0);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_get(c, &l), GR_ENOENT);
    /* The embedded cluster writes its layout once it started. */
    assert_int_equal(gr_coord_layout_init(&l, 2), 0);
    strcpy(l.shards[0].address, "127.0.0.1:1");
    strcpy(l.shards[1].address, "127.0.0.1:2");
    assert_int_equal(gr_coord_layout_cas(c, &l), 0);
    assert_int_equal(l.version, 0);
    WAIT_FOR(&s, s.epoch == 1);
    l.epoch = 2;
    int64_t old = l.version;
    assert_int_equal(gr_coord_layout_cas(c, &l), 0);
    assert_int_equal(l.version, 1);
    WAIT_FOR(&s, s.epoch == 2);
    l.version = old; /* a writer that read version 0 loses */
    assert_int_equal(gr_coord_layout_cas(c, &l), GR_ESTALE);
    l.slot_map[3] = 9; /* not a shard: refused before anything is stored */
    l.version = 1;
    assert_int_equal(gr_coord_layout_cas(c, &l), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "slot 3 names shard 9 of 2"));
    gr_coord_layout_fini(&l);

    /* Membership and the election are this handle's own. */
    assert_int_equal(gr_coord_watch_members(c, on_members, &s), 0);
    gr_coord_member m;
    gr_coord_member_init(&m, GR_COORD_WORKER);
    m.index = 0;
    assert_int_equal(gr_coord_elect(c, on_leader, &s), GR_ENOENT);
    char id[GR_COORD_ID_MAX];
    assert_int_equal(gr_coord_register(c, &m, id), 0);
    assert_string_equal(id, "local-0");
    assert_true(gr_coord_registered(c));
    WAIT_FOR(&s, s.n_members == 1);
    assert_int_equal(gr_coord_elect(c, on_leader, &s), 0);
    assert_int_equal(gr_coord_elect(c, on_leader, &s), GR_EEXIST);
    WAIT_FOR(&s, s.leader);
    assert_true(gr_coord_is_leader(c));
    gr_coord_member lead;
    assert_int_equal(gr_coord_leader(c, &lead), 0);
    assert_int_equal(lead.role, GR_COORD_WORKER);
    assert_true(lead.pid > 0);
    assert_int_equal(gr_coord_resign(c), 0);
    assert_false(gr_coord_is_leader(c));
    assert_int_equal(gr_coord_leader(c, &lead), GR_ENOENT);
    assert_int_equal(gr_coord_unregister(c), 0);
    assert_false(gr_coord_registered(c));
    WAIT_FOR(&s, s.n_members == 0);
    gr_coord_close(c);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(s.leader_calls, 2);
    assert_false(s.leader);
    pthread_mutex_unlock(&s.mu);
}

static void test_rank_other_than_zero_never_leads(void **state)
{
    (void)state;
    gr_coord *c;
    assert_int_equal(gr_coord_open("embedded", NULL, &c), 0);
    gr_coord_member m;
    gr_coord_member_init(&m, GR_COORD_WORKER);
    m.index = 3;
    assert_int_equal(gr_coord_register(c, &m, NULL), 0);
    assert_int_equal(gr_coord_elect(c, NULL, NULL), 0);
    gr_sleep_ms(50);
    assert_false(gr_coord_is_leader(c));
    m.role = (gr_coord_role)9;
    assert_int_equal(gr_coord_update(c, &m), GR_EINVAL);
    gr_coord_close(c);
}

static void test_names(void **state)
{
    (void)state;
    gr_coord_role r;
    assert_int_equal(gr_coord_role_parse("standby", &r), 0);
    assert_int_equal(r, GR_COORD_STANDBY);
    assert_int_equal(gr_coord_role_parse("chief", &r), GR_EINVAL);
    assert_string_equal(gr_coord_role_name(GR_COORD_OBSERVER), "observer");
    assert_string_equal(gr_coord_role_name(42), "unknown");
    assert_string_equal(gr_coord_session_name(GR_COORD_EXPIRED), "expired");
}

/* Job values: created only once (-1), changed only at the version read, bad names refused. */
static void test_values_compare_and_set(void **state)
{
    (void)state;
    gr_coord *c;
    assert_int_equal(gr_coord_open("127.0.0.1:7000", NULL, &c), 0);
    char *txt = NULL;
    int64_t v = 7;
    assert_int_equal(gr_coord_value_get(c, "workers", &txt, &v), GR_ENOENT);
    assert_null(txt);
    int64_t mine = -1;
    assert_int_equal(gr_coord_value_cas(c, "workers", "{\"a\":1}", &mine), 0);
    assert_int_equal(mine, 0);
    int64_t again = -1;
    assert_int_equal(gr_coord_value_cas(c, "workers", "{}", &again), GR_ESTALE);
    assert_int_equal(gr_coord_value_cas(c, "workers", "{\"a\":2}", &mine), 0);
    assert_int_equal(mine, 1);
    int64_t old = 0;
    assert_int_equal(gr_coord_value_cas(c, "workers", "{\"a\":3}", &old), GR_ESTALE);
    assert_int_equal(gr_coord_value_get(c, "workers", &txt, &v), 0);
    assert_string_equal(txt, "{\"a\":2}");
    assert_int_equal(v, 1);
    free(txt);
    assert_int_equal(gr_coord_value_get(c, "layout", &txt, &v), GR_EINVAL);
    assert_int_equal(gr_coord_value_cas(c, "a/b", "{}", &mine), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "cannot name a value"));
    assert_false(gr_coord_value_name_ok(""));
    assert_true(gr_coord_value_name_ok("run-2_x"));
    gr_coord_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_list),
        cmocka_unit_test(test_cluster_file),
        cmocka_unit_test(test_embedded_cas_and_callbacks),
        cmocka_unit_test(test_rank_other_than_zero_never_leads),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_values_compare_and_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
