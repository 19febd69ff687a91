/* Integration (ZooKeeper): shards under `granary server --coord`. Two shards take the two
 * indexes of a new job and a standby waits. A shard killed with SIGKILL is replaced by the
 * standby (layout epoch + 1), which restores that index's rows from the newest checkpoint:
 * its keys read the checkpoint's values, the surviving shard's keys keep their newer ones,
 * and a client still on the old epoch is refused by the survivor. A shard stopped with
 * SIGSTOP past its session timeout is replaced too; after SIGCONT it refuses a write at once
 * (its lease ran out while it was stopped), then finds it was replaced and exits 3. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/coord.h"
#include "tests/support/ps_harness.h"
#include "tests/support/zk_harness.h"

static zk_test_server zk;
static char tmp[256];

static const char *spec = "{\"name\":\"emb\",\"id\":1,\"dim\":4,\"seed\":3,"
                          "\"init\":{\"kind\":\"zeros\"},\"optimizer\":{\"kind\":\"sgd\",\"lr\":1.0}}";

static int setup(void **state)
{
    (void)state;
    if (ps_test_tmpdir(tmp, sizeof tmp)) return -1;
    if (!zk_test_available()) return 0;
    return zk_test_start(&zk);
}

static int teardown(void **state)
{
    (void)state;
    zk_test_destroy(&zk);
    ps_test_rmdir(tmp);
    return 0;
}

static void start_shard(ps_test_server *s, const char *url, bool standby)
{
    const char *args[] = {"server", "--coord", url, "--shards", "2", "--threads", "1",
                          "--session-timeout", "2000", "--ckpt-root", tmp, "--ckpt-dir", "ck",
                          standby ? "--standby" : NULL, NULL};
    assert_int_equal(ps_test_server_start_args(s, args), 0);
}

static gr_coord *observer(const char *url)
{
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.session_timeout_ms = 4000;
    gr_coord *c = NULL;
    assert_int_equal(gr_coord_open(url, &o, &c), 0);
    return c;
}

/* Waits until the layout has both indexes served and (when addr1 is given) index 1 at addr1;
 * fills l. */
static void wait_layout(gr_coord *c, const char *addr1, gr_coord_layout *l, unsigned ms)
{
    for (unsigned waited = 0;; waited += 50) {
        memset(l, 0, sizeof *l);
        if (gr_coord_layout_get(c, l) == 0 && l->n_shards == 2 && l->shards[0].address[0] &&
            l->shards[1].address[0] && (!addr1 || !strcmp(l->shards[1].address, addr1)))
            return;
        gr_coord_layout_fini(l);
        assert_true(waited < ms);
        usleep(50000);
    }
}

/* What a coordinated worker does on GR_ESTALE: re-read the layout, take its epoch, and give a
 * shard that has not seen the change yet (or is still restoring) a moment. */
static int restale(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch, const char *msg)
{
    (void)shard;
    (void)epoch;
    (void)msg;
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (gr_coord_layout_get(ctx, &l) == 0) gr_client_set_epoch(c, (uint32_t)l.epoch);
    gr_coord_layout_fini(&l);
    usleep(20000);
    return 0;
}

static gr_client *client_for(const gr_coord_layout *l, gr_coord *obs)
{
    char list[600];
    assert_int_equal(gr_coord_layout_servers(l, list, sizeof list), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    cc.request_timeout_ms = 10000;
    gr_client *c = NULL;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    assert_int_equal(gr_client_set_epoch(c, (uint32_t)l->epoch), 0);
    gr_client_set_stale_hook(c, restale, obs);
    return c;
}

#define NKEYS 64

static void push_all(gr_client *c)
{
    uint64_t keys[NKEYS];
    float g[NKEYS * 4];
    for (int i = 0; i < NKEYS; i++) keys[i] = (uint64_t)i * 7919u + 1;
    for (int i = 0; i < NKEYS * 4; i++) g[i] = -1.0f; /* sgd lr 1: +1 per push */
    assert_int_equal(gr_client_push(c, 1, 4, keys, NKEYS, g), 0);
}

static void test_standby_takes_over_a_killed_shard(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/jobs/kill", url, sizeof url);
    ps_test_server a, b, sb;
    start_shard(&a, url, false);
    start_shard(&b, url, false);
    start_shard(&sb, url, true);
    gr_coord *obs = observer(url);
    gr_coord_layout l;
    wait_layout(obs, NULL, &l, 10000);
    gr_client *c = client_for(&l, obs);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    push_all(c); /* every row 1 */
    gr_client_ckpt_opts o;
    memset(&o, 0, sizeof o);
    o.root = "ck";
    o.step = 1;
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), 0);
    push_all(c); /* every row 2 */
    ps_test_server *victim = !strcmp(l.shards[1].address, a.addr) ? &a : &b;
    ps_test_server *survivor = victim == &a ? &b : &a;
    uint64_t old_epoch = l.epoch;
    gr_coord_layout_fini(&l);
    assert_int_equal(ps_test_server_stop(victim, SIGKILL), 128 + SIGKILL);
    wait_layout(obs, sb.addr, &l, 15000); /* detection takes the 2 s session timeout */
    assert_true(l.epoch > old_epoch);
    assert_string_equal(l.shards[0].address, survivor->addr);

    /* The old client still routes by the old epoch: the survivor refuses it (without the
     * hook that would re-read the layout). */
    gr_client_set_stale_hook(c, NULL, NULL);
    uint64_t key0 = 0;
    for (uint64_t k = 1;; k++) /* a key of shard 0 */
        if (gr_slot_shard(gr_slot_of(k), 2) == 0) {
            key0 = k;
            break;
        }
    float row[4];
    int stale = 0; /* the survivor follows the layout within a moment */
    for (int tries = 0; tries < 100 && (stale = gr_client_pull(c, 1, 4, &key0, 1, row)) == 0;
         tries++)
        usleep(20000);
    assert_int_equal(stale, GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "is stale"));
    gr_client_destroy(c);

    /* The new layout: shard 1's rows are the checkpoint's, shard 0's the newest. */
    c = client_for(&l, obs);
    uint64_t keys[NKEYS];
    float rows[NKEYS * 4];
    for (int i = 0; i < NKEYS; i++) keys[i] = (uint64_t)i * 7919u + 1;
    int rc = GR_ESTALE;
    for (int tries = 0; rc == GR_ESTALE && tries < 100; tries++) { /* still restoring */
        rc = gr_client_pull(c, 1, 4, keys, NKEYS, rows);
        if (rc == GR_ESTALE) usleep(50000);
    }
    assert_int_equal(rc, 0);
    int on1 = 0;
    for (int i = 0; i < NKEYS; i++) {
        bool shard1 = gr_slot_shard(gr_slot_of(keys[i]), 2) == 1;
        on1 += shard1;
        for (int d = 0; d < 4; d++) assert_true(rows[i * 4 + d] == (shard1 ? 1.0f : 2.0f));
    }
    assert_true(on1 > 0 && on1 < NKEYS);
    char *json = NULL;
    assert_int_equal(gr_client_stats(c, 1, &json), 0);
    assert_non_null(strstr(json, "\"takeovers\":1"));
    free(json);
    gr_client_destroy(c);
    gr_coord_layout_fini(&l);
    gr_coord_close(obs);
    /* Both leave cleanly on SIGTERM: join stopped, coordinator closed, then freed. */
    assert_int_equal(ps_test_server_stop(survivor, 0), 0);
    assert_int_equal(ps_test_server_stop(&sb, 0), 0);
}

static void test_paused_shard_is_fenced_when_it_wakes(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/jobs/pause", url, sizeof url);
    ps_test_server a, b, sb;
    start_shard(&a, url, false);
    start_shard(&b, url, false);
    start_shard(&sb, url, true);
    gr_coord *obs = observer(url);
    gr_coord_layout l;
    wait_layout(obs, NULL, &l, 10000);
    gr_client *c = client_for(&l, obs);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    push_all(c);
    ps_test_server *victim = !strcmp(l.shards[1].address, a.addr) ? &a : &b;
    ps_test_server *survivor = victim == &a ? &b : &a;
    gr_coord_layout_fini(&l);
    /* A direct client of the victim alone, on the old epoch: what a worker that missed the
     * change would still send. */
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = victim->addr;
    cc.any_shard = true;
    cc.request_timeout_ms = 5000;
    gr_client *direct = NULL;
    assert_int_equal(gr_client_create(&cc, &direct), 0);
    assert_int_equal(gr_client_set_epoch(direct, gr_client_epoch(c)), 0);
    char *json = NULL;
    assert_int_equal(gr_client_stats(direct, 0, &json), 0); /* connected before the pause */
    free(json);

    assert_int_equal(kill(victim->pid, SIGSTOP), 0);
    wait_layout(obs, sb.addr, &l, 15000);
    gr_coord_layout_fini(&l);
    assert_int_equal(kill(victim->pid, SIGCONT), 0);
    /* At once: the lease ran out during the pause, so no write is taken. */
    uint64_t k1 = 0;
    for (uint64_t k = 1;; k++)
        if (gr_slot_shard(gr_slot_of(k), 2) == 1) {
            k1 = k;
            break;
        }
    const float g[4] = {-1, -1, -1, -1};
    int rc = gr_client_push(direct, 1, 4, &k1, 1, g);
    assert_int_equal(rc, GR_ESTALE); /* fenced, not applied */
    assert_non_null(strstr(gr_errmsg(), "fenced"));
    gr_client_destroy(direct);
    /* Then it learns that it was replaced and stops with status 3. */
    assert_int_equal(ps_test_server_wait(victim, 20000), 3);
    gr_client_destroy(c);
    gr_coord_close(obs);
    ps_test_server_stop(survivor, 0);
    ps_test_server_stop(&sb, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standby_takes_over_a_killed_shard),
        cmocka_unit_test(test_paused_shard_is_fenced_when_it_wakes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
