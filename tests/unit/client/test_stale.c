/* Unit tests for the client's answer to GR_ESTALE (src/client/op.c): every request carries the
 * client's layout epoch; when a shard refuses requests as stale, the caller's hook re-reads the
 * layout and the refused requests are sent again, so the operation succeeds and is applied
 * exactly once; a hook that gives up, or a refusal that is not stale, fails the operation; a
 * shard's connection can be pointed at another address. Shards run in this process. */
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

static gr_server *start_shard(uint32_t shard, uint32_t shards, char *addr, size_t cap)
{
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.threads = 2;
    cfg.shard = shard;
    cfg.shards = shards;
    gr_server *s = NULL;
    assert_int_equal(gr_server_create(&cfg, &s), 0);
    assert_int_equal(gr_server_start(s), 0);
    snprintf(addr, cap, "127.0.0.1:%u", gr_server_port(s));
    return s;
}

static void stop_shard(gr_server *s)
{
    gr_server_stop(s);
    gr_server_destroy(s);
}

static gr_client *connect_to(const char *list)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    cc.request_timeout_ms = 5000;
    gr_client *c = NULL;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    return c;
}

/* What the hook saw, and what it does: installs `next` epoch, optionally opens a fenced
 * shard (a shard that re-registered), and returns `ret`. */
typedef struct hook_state {
    int calls;
    uint32_t shard, epoch;
    char msg[400];
    uint32_t next;
    gr_server *unfence;
    int ret;
} hook_state;

static int hook(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch, const char *msg)
{
    hook_state *h = ctx;
    h->calls++;
    h->shard = shard;
    h->epoch = epoch;
    snprintf(h->msg, sizeof h->msg, "%s", msg);
    if (h->unfence) gr_server_set_fence(h->unfence, GR_SERVER_OPEN);
    gr_client_set_epoch(c, h->next);
    return h->ret;
}

static const uint64_t keys[6] = {1, 2, 3, 1000, 2000, 3000};

static void pull_all(gr_client *c, float *rows, int want)
{
    assert_int_equal(gr_client_pull(c, 1, 4, keys, 6, rows), want);
}

static void test_hook_moves_the_epoch_and_the_request_is_sent_again(void **state)
{
    (void)state;
    char a0[64], a1[64], list[160];
    gr_server *s0 = start_shard(0, 2, a0, sizeof a0), *s1 = start_shard(1, 2, a1, sizeof a1);
    snprintf(list, sizeof list, "%s,%s", a0, a1);
    gr_client *c = connect_to(list);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    /* The layout moved to epoch 5 while the client routes by epoch 4. */
    gr_server_set_epoch(s0, 5);
    gr_server_set_epoch(s1, 5);
    gr_client_set_epoch(c, 4);
    hook_state h = {.next = 5, .ret = 0};
    gr_client_set_stale_hook(c, hook, &h);
    float g[6 * 4];
    for (int i = 0; i < 24; i++) g[i] = -1.0f;
    assert_int_equal(gr_client_push(c, 1, 4, keys, 6, g), 0);
    assert_int_equal(h.calls, 1); /* one re-read for both shards' refusals */
    assert_int_equal(h.epoch, 4);
    assert_non_null(strstr(h.msg, "layout epoch 4 is stale"));
    assert_int_equal(gr_client_epoch(c), 5);
    float rows[6 * 4];
    pull_all(c, rows, 0);
    for (int i = 0; i < 24; i++) assert_true(rows[i] == 1.0f); /* applied exactly once */
    assert_int_equal(h.calls, 1);
    gr_client_destroy(c);
    stop_shard(s0);
    stop_shard(s1);
}

static void test_fenced_shard_is_waited_for_through_the_hook(void **state)
{
    (void)state;
    char a0[64];
    gr_server *s0 = start_shard(0, 1, a0, sizeof a0);
    gr_client *c = connect_to(a0);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    gr_server_set_fence(s0, GR_SERVER_FENCE_WRITES);
    hook_state h = {.next = 0, .unfence = s0, .ret = 0};
    gr_client_set_stale_hook(c, hook, &h);
    float g[6 * 4];
    for (int i = 0; i < 24; i++) g[i] = -2.0f;
    assert_int_equal(gr_client_push(c, 1, 4, keys, 6, g), 0);
    assert_int_equal(h.calls, 1);
    assert_non_null(strstr(h.msg, "fenced"));
    float rows[6 * 4];
    pull_all(c, rows, 0);
    for (int i = 0; i < 24; i++) assert_true(rows[i] == 2.0f);
    gr_client_destroy(c);
    stop_shard(s0);
}

static void test_hook_that_gives_up_fails_the_operation(void **state)
{
    (void)state;
    char a0[64];
    gr_server *s0 = start_shard(0, 1, a0, sizeof a0);
    gr_client *c = connect_to(a0);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    gr_server_set_epoch(s0, 9);
    gr_client_set_epoch(c, 8);
    hook_state h = {.next = 8, .ret = GR_ETIMEDOUT};
    gr_client_set_stale_hook(c, hook, &h);
    float rows[6 * 4];
    pull_all(c, rows, GR_ESTALE);
    assert_int_equal(h.calls, 1);
    /* A hook that keeps the wrong epoch and says "retry" is bounded (64 rounds). */
    h.ret = 0;
    h.calls = 0;
    pull_all(c, rows, GR_ESTALE);
    assert_int_equal(h.calls, 64);
    /* A refusal that is not stale never reaches the hook. */
    gr_client_set_epoch(c, 9);
    h.calls = 0;
    assert_int_equal(gr_client_pull(c, 77, 4, keys, 6, rows), GR_ENOENT);
    assert_int_equal(h.calls, 0);
    gr_client_destroy(c);
    stop_shard(s0);
}

static void test_shard_address_can_be_pointed_elsewhere(void **state)
{
    (void)state;
    char a0[64], b0[64];
    gr_server *old = start_shard(0, 1, a0, sizeof a0), *repl = start_shard(0, 1, b0, sizeof b0);
    gr_client *c = connect_to(a0);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    float g[6 * 4];
    for (int i = 0; i < 24; i++) g[i] = -1.0f;
    assert_int_equal(gr_client_push(c, 1, 4, keys, 6, g), 0);
    assert_int_equal(gr_client_set_shard_addr(c, 0, b0), 0);
    assert_string_equal(gr_client_shard_addr(c, 0), b0);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    float rows[6 * 4];
    pull_all(c, rows, 0);
    for (int i = 0; i < 24; i++) assert_true(rows[i] == 0.0f); /* the other shard's rows */
    assert_int_equal(gr_client_set_shard_addr(c, 1, b0), GR_EINVAL);
    assert_int_equal(gr_client_set_shard_addr(c, 0, "nohost"), GR_EINVAL);
    gr_client_destroy(c);
    stop_shard(old);
    stop_shard(repl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hook_moves_the_epoch_and_the_request_is_sent_again),
        cmocka_unit_test(test_fenced_shard_is_waited_for_through_the_hook),
        cmocka_unit_test(test_hook_that_gives_up_fails_the_operation),
        cmocka_unit_test(test_shard_address_can_be_pointed_elsewhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
