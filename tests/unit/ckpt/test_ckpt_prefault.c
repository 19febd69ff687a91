/* A restore into tables prepared ahead (gr_table_prefault: what a warm standby holds,
 * docs/coord.md "Warm standby") gives the tables a restore into new ones gives, bitwise: the
 * same rows visited in the same order with the same weights, optimizer state and metadata,
 * the same row count and counted bytes; for a whole checkpoint, for one shard of an M->N
 * restore, with one thread and with several, and when the prepared row count is short. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "granary/ckpt.h"

#define DIM 16
#define ROWS 40000

static char g_tmp[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/gr-ckpt-prefault-XXXXXX");
    assert_non_null(mkdtemp(g_tmp));
    return 0;
}

static int teardown_tmp(void **state)
{
    (void)state;
    ck_rmtree(g_tmp);
    return 0;
}

static void spec_of(gr_table_spec *sp)
{
    gr_table_spec_default(sp, "emb", DIM);
    sp->seed = 3;
    sp->opt.kind = GR_OPT_ADAGRAD;
    sp->opt.lr = 0.05f;
}

/* Every row as a scan sees it, in scan order (partition by partition, slot order): two
 * tables with the same dump hold the same rows in the same slots. */
typedef struct dump {
    unsigned char *b;
    size_t len, cap;
    uint32_t sf;
} dump;

static int dump_row(void *ctx, uint64_t key, const float *w, const float *st,
                    const gr_row_meta *meta)
{
    dump *d = ctx;
    size_t need = 8 + DIM * 4 + d->sf * 4 + sizeof *meta;
    if (d->len + need > d->cap) {
        d->cap = (d->cap + need) * 2;
        d->b = realloc(d->b, d->cap);
    }
    memcpy(d->b + d->len, &key, 8);
    memcpy(d->b + d->len + 8, w, DIM * 4);
    if (d->sf) memcpy(d->b + d->len + 8 + DIM * 4, st, d->sf * 4);
    memcpy(d->b + d->len + 8 + DIM * 4 + d->sf * 4, meta, sizeof *meta);
    d->len += need;
    return 0;
}

static void assert_same_tables(gr_table *a, gr_table *b)
{
    uint32_t sf = gr_table_state_floats(gr_table_get_spec(a));
    dump x = {NULL, 0, 0, sf}, y = {NULL, 0, 0, sf};
    assert_int_equal(gr_table_scan(a, dump_row, &x), GR_OK);
    assert_int_equal(gr_table_scan(b, dump_row, &y), GR_OK);
    assert_true(x.len > 0);
    assert_int_equal(x.len, y.len);
    assert_memory_equal(x.b, y.b, x.len);
    gr_table_stats sa, sb;
    gr_table_get_stats(a, &sa);
    gr_table_get_stats(b, &sb);
    assert_int_equal(sa.rows, sb.rows);
    assert_int_equal(sa.bytes, sb.bytes);
    free(x.b);
    free(y.b);
}

/* A checkpoint of `files` shard files holding ROWS rows with distinct values. */
static void write_ckpt(const char *dir, uint32_t files)
{
    gr_table_spec sp;
    spec_of(&sp);
    for (uint32_t f = 0; f < files; f++) {
        gr_table *t = NULL;
        assert_int_equal(gr_table_create(&sp, &t), GR_OK);
        float w[DIM];
        for (uint64_t i = 0; i < ROWS; i++) {
            uint64_t k = i * 0x9e3779b97f4a7c15ull + 17;
            if (gr_slot_shard(gr_slot_of(k), files) != f) continue;
            for (int d = 0; d < DIM; d++) w[d] = (float)((i * 31 + (uint64_t)d) % 1000) * 1e-3f;
            assert_int_equal(gr_table_insert(t, &k, 1, w, NULL, NULL), GR_OK);
        }
        float g[DIM];
        for (int d = 0; d < DIM; d++) g[d] = 0.1f;
        uint64_t k0 = 17;
        if (gr_slot_shard(gr_slot_of(k0), files) == f) gr_table_apply(t, &k0, 1, g);
        gr_ckpt_write_opts o;
        memset(&o, 0, sizeof o);
        o.kind = GR_CKPT_FULL;
        o.shard = f;
        o.shards = files;
        o.step = 10;
        assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &o, NULL), GR_OK);
        gr_table_destroy(t);
    }
    gr_ckpt_commit_opts co = {files, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(dir, &co), GR_OK);
}

/* Restores shard `shard` of `shards` from dir into a new table and into one prepared for
 * `prepared` rows, with `threads` threads, and compares them. */
static void restore_both(const char *dir, uint32_t shard, uint32_t shards, uint64_t prepared,
                         uint32_t threads)
{
    gr_table_spec sp;
    spec_of(&sp);
    gr_table *a = NULL, *b = NULL;
    assert_int_equal(gr_table_create(&sp, &a), GR_OK);
    assert_int_equal(gr_table_create(&sp, &b), GR_OK);
    assert_int_equal(gr_table_prefault(b, prepared), GR_OK);
    gr_ckpt_load_opts lo = {shard, shards, NULL, threads};
    gr_ckpt_load_stats sa, sb;
    assert_int_equal(gr_ckpt_load(dir, &a, 1, &lo, &sa), GR_OK);
    assert_int_equal(gr_ckpt_load(dir, &b, 1, &lo, &sb), GR_OK);
    assert_int_equal(sa.rows_loaded, sb.rows_loaded);
    assert_true(sa.rows_loaded > 0);
    assert_same_tables(a, b);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

static void test_whole_checkpoint(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/one", g_tmp);
    write_ckpt(dir, 1);
    restore_both(dir, 0, 1, ROWS, 1);
    restore_both(dir, 0, 1, ROWS, 3);
    restore_both(dir, 0, 1, ROWS / 10, 2); /* prepared short */
}

static void test_m_to_n(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/two", g_tmp);
    write_ckpt(dir, 2);
    /* The largest shard of 3 gets about a third; a warm standby prepares for it. */
    for (uint32_t s = 0; s < 3; s++) restore_both(dir, s, 3, ROWS / 3 + 1000, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_checkpoint),
        cmocka_unit_test(test_m_to_n),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
