/* Integration: a shard's grow thread (gr_server_config.populate_ahead, src/server/grow.c):
 * after pulls and pushes that create rows it has the kernel hand out the row memory the next
 * rows will take (STATS "grow": bytes handed out, walks), off by default (no "grow" object),
 * the rows read back are those of a shard without it, and a value over 1 GiB is refused,
 * naming the field. The embedded cluster's shards run it. gr_server_config.huge_rows: each
 * sparse table the shard creates keeps its rows past that many bytes off huge pages. */
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
#include "granary/server.h"
#include "tests/support/vma_flags.h"
#include "table/table_internal.h"

#define DIM 16
#define NKEYS 40000

static const char *SPEC =
    "{\"name\":\"emb\",\"id\":1,\"dim\":16,\"seed\":3,"
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
    "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"initial_accumulator\":1e-7}}";

static gr_server *start(uint64_t ahead, uint64_t huge_rows)
{
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.threads = 1;
    cfg.populate_ahead = ahead;
    cfg.huge_rows = huge_rows;
    gr_server *s;
    assert_int_equal(gr_server_create(&cfg, &s), 0);
    assert_int_equal(gr_server_start(s), 0);
    return s;
}

static gr_client *connect_to(gr_server *s)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_server_port(s));
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = addr;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    return c;
}

/* STATS "grow" member `key` of shard 0; -1 when there is no "grow" object. */
static double grow_stat(gr_client *c, const char *key)
{
    char *js = NULL;
    assert_int_equal(gr_client_stats(c, 0, &js), 0);
    cJSON *j = cJSON_Parse(js);
    free(js);
    assert_non_null(j);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "grow");
    const cJSON *v = g ? cJSON_GetObjectItemCaseSensitive(g, key) : NULL;
    double out = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(j);
    return out;
}

/* Pulls (creating rows) then pushes every key once; the rows after both in *rows. */
static void train_rows(gr_client *c, float *rows)
{
    assert_int_equal(gr_client_create_table(c, SPEC), 0);
    uint64_t *keys = malloc(NKEYS * sizeof *keys);
    float *g = malloc((size_t)NKEYS * DIM * sizeof *g);
    for (size_t i = 0; i < NKEYS; i++) keys[i] = i * 0x9e3779b97f4a7c15ull + 5;
    for (size_t i = 0; i < (size_t)NKEYS * DIM; i++) g[i] = (float)(i % 13) * 0.01f - 0.05f;
    for (size_t i = 0; i < NKEYS; i += 4000) {
        assert_int_equal(gr_client_pull(c, 1, DIM, keys + i, 4000, rows + i * DIM), 0);
        assert_int_equal(gr_client_push(c, 1, DIM, keys + i, 4000, g + i * DIM), 0);
    }
    assert_int_equal(gr_client_pull(c, 1, DIM, keys, NKEYS, rows), 0);
    free(keys);
    free(g);
}

static void test_rows_ahead(void **state)
{
    (void)state;
    float *with = malloc((size_t)NKEYS * DIM * sizeof(float));
    float *without = malloc((size_t)NKEYS * DIM * sizeof(float));
    gr_server *s = start(2u << 20, 0);
    gr_client *c = connect_to(s);
    assert_true(grow_stat(c, "ahead") == (double)(2u << 20));
    train_rows(c, with);
    /* The thread runs at idle priority: give it a moment on a busy machine. */
    double bytes = 0;
    for (int i = 0; i < 500 && bytes <= 0; i++) {
        bytes = grow_stat(c, "bytes");
        if (bytes <= 0) usleep(10000);
    }
    assert_true(bytes >= 2u << 20);
    assert_true(grow_stat(c, "passes") >= 1);
    gr_client_destroy(c);
    assert_int_equal(gr_server_stop(s), 0);
    gr_server_destroy(s);

    s = start(0, 0);
    c = connect_to(s);
    assert_true(grow_stat(c, "bytes") == -1); /* off: no thread, no "grow" object */
    train_rows(c, without);
    gr_client_destroy(c);
    assert_int_equal(gr_server_stop(s), 0);
    gr_server_destroy(s);
    assert_memory_equal(with, without, (size_t)NKEYS * DIM * sizeof(float));
    free(with);
    free(without);
}

static void test_limits_and_cluster(void **state)
{
    (void)state;
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.populate_ahead = (1ull << 30) + 1;
    gr_server *s = NULL;
    assert_int_equal(gr_server_create(&cfg, &s), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "populate_ahead"));
    assert_null(s);

    /* gr_local_cluster_start leaves it off (no "grow" in STATS); granary train's start asks
     * for GR_LOCAL_CLUSTER_AHEAD; too much is refused with the server's message. */
    gr_local_cluster_opts lo;
    gr_local_cluster_opts_default(&lo, 1);
    lo.populate_ahead = (1ull << 30) + 1;
    gr_local_cluster *cl = NULL;
    assert_int_equal(gr_local_cluster_start_opts(&lo, &cl), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "populate_ahead"));
    assert_null(cl);
    for (int with = 0; with <= 1; with++) {
        if (with) {
            lo.threads = 1;
            lo.populate_ahead = GR_LOCAL_CLUSTER_AHEAD;
            assert_int_equal(gr_local_cluster_start_opts(&lo, &cl), 0);
        } else {
            assert_int_equal(gr_local_cluster_start(1, 1, &cl), 0);
        }
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = gr_local_cluster_servers(cl);
        gr_client *c;
        assert_int_equal(gr_client_create(&cc, &c), 0);
        assert_true(grow_stat(c, "ahead") == (with ? (double)GR_LOCAL_CLUSTER_AHEAD : -1.0));
        gr_client_destroy(c);
        gr_local_cluster_stop(cl);
    }
}

static int find_emb(void *ctx, const char *name, gr_table *table)
{
    if (!strcmp(name, "emb")) *(gr_table **)ctx = table;
    return 0;
}

/* A shard with huge_rows: its new table's first 2 MiB of rows are advised for huge pages, the
 * rest against them; the rows read back are those of a shard without it. */
static void test_huge_rows(void **state)
{
    (void)state;
    float *with = malloc((size_t)NKEYS * DIM * sizeof(float));
    float *without = malloc((size_t)NKEYS * DIM * sizeof(float));
    for (int lim = 1; lim >= 0; lim--) {
        gr_server *s = start(0, lim ? 2u << 20 : 0);
        gr_client *c = connect_to(s);
        train_rows(c, lim ? with : without);
        gr_table *t = NULL;
        assert_int_equal(gr_server_foreach_table(s, find_emb, &t), 0);
        assert_non_null(t);
        const size_t end = (size_t)t->committed * t->stride;
        assert_true(end > (3u << 20));
        bool found;
        assert_true(vma_has_flag(t->rowmem, "hg", &found));
        assert_true(found);
        assert_int_equal(vma_has_flag(t->rowmem + (2u << 20) + 64, "nh", &found), lim);
        assert_true(found);
        assert_int_equal(vma_has_flag(t->rowmem + end - 64, "hg", &found), !lim);
        assert_true(found);
        gr_client_destroy(c);
        assert_int_equal(gr_server_stop(s), 0);
        gr_server_destroy(s);
    }
    assert_memory_equal(with, without, (size_t)NKEYS * DIM * sizeof(float));
    free(with);
    free(without);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_ahead),
        cmocka_unit_test(test_limits_and_cluster),
        cmocka_unit_test(test_huge_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
