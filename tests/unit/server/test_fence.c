/* Unit tests for the shard's coordination checks (src/server/fence.c): a shard serving layout
 * epoch E refuses requests stamped with another nonzero epoch and accepts epoch 0 (tools that
 * are not coordinated); a write fence refuses what changes state but still serves pulls and
 * stats; a full fence refuses pulls too; a refused request changes nothing. The shard runs in
 * this process on a loopback port; the client is the real one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "granary/client.h"
#include "granary/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *spec = "{\"name\":\"emb\",\"id\":1,\"dim\":4,\"seed\":3,"
                          "\"init\":{\"kind\":\"zeros\"},\"optimizer\":{\"kind\":\"sgd\",\"lr\":1.0}}";

typedef struct fixture {
    gr_server *s;
    gr_client *c;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.threads = 2;
    if (gr_server_create(&cfg, &f->s) || gr_server_start(f->s)) return -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_server_port(f->s));
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = addr;
    cc.request_timeout_ms = 5000;
    if (gr_client_create(&cc, &f->c)) return -1;
    if (gr_client_create_table(f->c, spec)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    gr_client_destroy(f->c);
    gr_server_stop(f->s);
    gr_server_destroy(f->s);
    free(f);
    return 0;
}

static const uint64_t key = 42;

static float row0(gr_client *c)
{
    float row[4] = {-1, -1, -1, -1};
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, row), 0);
    return row[0];
}

static int push_one(gr_client *c)
{
    const float g[4] = {-1, -1, -1, -1}; /* sgd lr 1: the row grows by 1 per applied push */
    return gr_client_push(c, 1, 4, &key, 1, g);
}

static void test_epoch_zero_is_accepted_as_before(void **state)
{
    fixture *f = *state;
    assert_int_equal(gr_server_epoch(f->s), 0);
    assert_int_equal(gr_server_set_epoch(f->s, 7), 0);
    assert_int_equal(gr_client_epoch(f->c), 0);
    assert_int_equal(push_one(f->c), 0);
    assert_true(row0(f->c) == 1.0f);
}

static void test_other_epoch_is_refused_and_applies_nothing(void **state)
{
    fixture *f = *state;
    assert_int_equal(gr_server_set_epoch(f->s, 7), 0);
    assert_int_equal(gr_client_set_epoch(f->c, 6), 0);
    assert_int_equal(push_one(f->c), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "layout epoch 6 is stale: shard 0 serves epoch 7"));
    float row[4];
    assert_int_equal(gr_client_pull(f->c, 1, 4, &key, 1, row), GR_ESTALE);
    assert_int_equal(gr_client_set_epoch(f->c, 8), 0); /* ahead of the shard: refused too */
    assert_int_equal(push_one(f->c), GR_ESTALE);
    assert_int_equal(gr_client_set_epoch(f->c, 7), 0);
    assert_true(row0(f->c) == 0.0f); /* nothing was applied */
    assert_int_equal(push_one(f->c), 0);
    assert_true(row0(f->c) == 1.0f);
    /* Stats answer whatever the epoch: an operator must see a stale shard. */
    assert_int_equal(gr_client_set_epoch(f->c, 3), 0);
    char *json = NULL;
    assert_int_equal(gr_client_stats(f->c, 0, &json), 0);
    free(json);
    assert_int_equal(gr_client_set_epoch(f->c, GR_PROTO_EPOCH_MAX + 1u), GR_EINVAL);
    assert_int_equal(gr_server_set_epoch(f->s, GR_PROTO_EPOCH_MAX + 1u), GR_EINVAL);
}

static void test_write_fence_serves_reads_only(void **state)
{
    fixture *f = *state;
    assert_int_equal(push_one(f->c), 0);
    gr_server_set_fence(f->s, GR_SERVER_FENCE_WRITES);
    assert_int_equal(gr_server_get_fence(f->s), GR_SERVER_FENCE_WRITES);
    assert_int_equal(push_one(f->c), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "shard 0 is fenced"));
    assert_non_null(strstr(gr_errmsg(), "push refused"));
    const float g[4] = {0};
    assert_int_equal(gr_client_dense_push(f->c, "mlp", g, 4), GR_ESTALE);
    assert_int_equal(gr_client_create_table(f->c, spec), GR_ESTALE);
    assert_true(row0(f->c) == 1.0f); /* reads go on, and the refused push did nothing */
    gr_server_set_fence(f->s, GR_SERVER_OPEN);
    assert_int_equal(push_one(f->c), 0);
    assert_true(row0(f->c) == 2.0f);
}

static void test_full_fence_refuses_reads_but_answers_stats(void **state)
{
    fixture *f = *state;
    gr_server_set_fence(f->s, GR_SERVER_FENCE_ALL);
    float row[4];
    assert_int_equal(gr_client_pull(f->c, 1, 4, &key, 1, row), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "pull refused"));
    char *json = NULL;
    assert_int_equal(gr_client_stats(f->c, 0, &json), 0);
    free(json);
    /* A fully fenced shard may take another index; an open one may not. */
    assert_int_equal(gr_server_assign(f->s, 1, 2), 0);
    assert_int_equal(gr_server_shard(f->s), 1);
    assert_int_equal(gr_server_shards(f->s), 2);
    assert_int_equal(gr_server_assign(f->s, 2, 2), GR_EINVAL);
    assert_int_equal(gr_server_assign(f->s, 0, 1), 0);
    gr_server_set_fence(f->s, GR_SERVER_OPEN);
    assert_int_equal(gr_server_assign(f->s, 0, 1), GR_EBUSY);
    assert_true(row0(f->c) == 0.0f);
}

/* A lease that ran out fences as a lost session does (writes; reads go on without a sync
 * job); a renewed one opens again. */
static void test_expired_lease_fences_writes(void **state)
{
    fixture *f = *state;
    gr_server_set_lease(f->s, gr_now_ns() + 60ull * 1000000000u);
    assert_int_equal(push_one(f->c), 0);
    gr_server_set_lease(f->s, gr_now_ns() - 1);
    assert_int_equal(push_one(f->c), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "fenced"));
    assert_true(row0(f->c) == 1.0f);
    gr_server_set_lease(f->s, 0);
    assert_int_equal(push_one(f->c), 0);
    assert_true(row0(f->c) == 2.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_epoch_zero_is_accepted_as_before, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_epoch_is_refused_and_applies_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_write_fence_serves_reads_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_fence_refuses_reads_but_answers_stats, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_expired_lease_fences_writes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
