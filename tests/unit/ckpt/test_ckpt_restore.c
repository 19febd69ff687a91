/* Unit tests for the parallel restore (src/ckpt/load.c with the bulk insert of
 * src/table/bulk.c): a checkpoint of many sections restored with 1, 2, 3 and 8 threads gives
 * tables bitwise equal to the saved one (weights, optimizer state, metadata, row count); a
 * delta chain with overwritten, deleted and re-created rows restores the same with any
 * thread count; an M->N restore with threads covers every row exactly once; and a damaged
 * section in the middle fails the restore with the file named whatever the thread count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "granary/ckpt.h"

#define DIM 16
#define ROWS 60000 /* about 9 MB: nine 1 MiB ROWS sections */

static char g_tmp[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/gr-ckpt-restore-XXXXXX");
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
    sp->init.kind = GR_INIT_UNIFORM;
    sp->init.low = -0.05f;
    sp->init.high = 0.05f;
    sp->opt.kind = GR_OPT_ADAGRAD;
    sp->opt.lr = 0.05f;
}

static uint64_t key_of(uint64_t i) { return i * 0x9e3779b97f4a7c15ull + 17; }

static gr_table *filled(uint64_t first, uint64_t n)
{
    gr_table_spec sp;
    spec_of(&sp);
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&sp, &t), GR_OK);
    gr_table_set_clock(t, 5);
    uint64_t *k = malloc(n * 8);
    float *g = malloc(n * DIM * 4), *out = malloc(n * DIM * 4);
    for (uint64_t i = 0; i < n; i++) k[i] = key_of(first + i);
    for (uint64_t i = 0; i < n * DIM; i++) g[i] = (float)(i % 13) * 0.01f - 0.05f;
    assert_int_equal(gr_table_lookup(t, k, n, out, 0), GR_OK);
    assert_int_equal(gr_table_apply(t, k, n, g), GR_OK);
    free(k);
    free(g);
    free(out);
    return t;
}

/* a and b hold the same rows, bitwise, for keys [0, upto). */
static void assert_equal_tables(gr_table *a, gr_table *b, uint64_t upto)
{
    gr_table_stats sa, sb;
    gr_table_get_stats(a, &sa);
    gr_table_get_stats(b, &sb);
    assert_int_equal(sa.rows, sb.rows);
    uint32_t sf = gr_table_state_floats(gr_table_get_spec(a));
    const uint64_t B = 4096;
    uint64_t *k = malloc(B * 8);
    float *wa = malloc(B * DIM * 4), *wb = malloc(B * DIM * 4);
    float *xa = malloc(B * sf * 4), *xb = malloc(B * sf * 4);
    gr_row_meta *ma = malloc(B * sizeof *ma), *mb = malloc(B * sizeof *mb);
    bool *fa = malloc(B), *fb = malloc(B);
    for (uint64_t at = 0; at < upto; at += B) {
        uint64_t n = upto - at < B ? upto - at : B;
        for (uint64_t i = 0; i < n; i++) k[i] = key_of(at + i);
        assert_int_equal(gr_table_get(a, k, n, wa, xa, ma, fa), GR_OK);
        assert_int_equal(gr_table_get(b, k, n, wb, xb, mb, fb), GR_OK);
        assert_memory_equal(fa, fb, n);
        assert_memory_equal(wa, wb, n * DIM * 4);
        assert_memory_equal(xa, xb, n * sf * 4);
        assert_memory_equal(ma, mb, n * sizeof *ma);
    }
    free(k);
    free(wa);
    free(wb);
    free(xa);
    free(xb);
    free(ma);
    free(mb);
    free(fa);
    free(fb);
}

static gr_table *restored(const char *dir, uint32_t shard, uint32_t shards, uint32_t threads,
                          gr_ckpt_load_stats *st)
{
    gr_table_spec sp;
    spec_of(&sp);
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&sp, &t), GR_OK);
    gr_ckpt_load_opts lo = {shard, shards, NULL, threads};
    int rc = gr_ckpt_load(dir, &t, 1, &lo, st);
    if (rc) fail_msg("load with %u threads: %s", threads, gr_errmsg());
    return t;
}

static void test_threads_restore_bitwise(void **state)
{
    (void)state;
    gr_table *src = filled(0, ROWS);
    gr_ckpt_saver *sv = NULL;
    gr_ckpt_saver_opts so = {0, 1, false, 0, 0, 0};
    assert_int_equal(gr_ckpt_saver_create(g_tmp, &so, &sv), GR_OK);
    char name[GR_CKPT_NAME_MAX], dir[512];
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &src, 1, name, &fi), GR_OK);
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    const uint32_t counts[] = {1, 2, 3, 8};
    for (size_t c = 0; c < 4; c++) {
        gr_ckpt_load_stats st;
        gr_table *t = restored(dir, 0, 1, counts[c], &st);
        assert_int_equal(st.rows_loaded, ROWS);
        assert_int_equal(st.rows_read, ROWS);
        assert_equal_tables(src, t, ROWS + 100);
        assert_int_equal(gr_table_dirty_count(t, 1), ROWS); /* inserted rows are dirty */
        gr_table_destroy(t);
    }
    /* M->N: three shards with three threads each together hold every row once. */
    uint64_t total = 0;
    for (uint32_t j = 0; j < 3; j++) {
        gr_ckpt_load_stats st;
        gr_table *t = restored(dir, j, 3, 3, &st);
        gr_table_stats ts;
        gr_table_get_stats(t, &ts);
        assert_int_equal(ts.rows, st.rows_loaded);
        total += ts.rows;
        gr_table_destroy(t);
    }
    assert_int_equal(total, ROWS);
    gr_ckpt_saver_destroy(sv);
    gr_table_destroy(src);
}

static void test_threads_restore_delta_chain(void **state)
{
    (void)state;
    gr_table *src = filled(0, ROWS);
    gr_ckpt_saver *sv = NULL;
    gr_ckpt_saver_opts so = {0, 1, true, 0, 0, 0};
    assert_int_equal(gr_ckpt_saver_create(g_tmp, &so, &sv), GR_OK);
    char name[GR_CKPT_NAME_MAX], dir[512];
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &src, 1, name, &fi), GR_OK);
    /* Delta 1: a third of the rows updated, a slice deleted, new rows added. */
    uint64_t *k = malloc(ROWS * 8);
    float *g = malloc(ROWS * DIM * 4), *out = malloc(ROWS * DIM * 4);
    for (uint64_t i = 0; i < ROWS / 3; i++) k[i] = key_of(i * 3);
    for (uint64_t i = 0; i < ROWS / 3 * DIM; i++) g[i] = 0.02f;
    assert_int_equal(gr_table_apply(src, k, ROWS / 3, g), GR_OK);
    for (uint64_t i = 0; i < 2000; i++) k[i] = key_of(10000 + i);
    assert_int_equal(gr_table_delete(src, k, 2000, NULL), GR_OK);
    /* (Rows a pull creates are not dirty until a push: deltas carry pushed rows.) */
    for (uint64_t i = 0; i < 5000; i++) k[i] = key_of(ROWS + i);
    assert_int_equal(gr_table_apply(src, k, 5000, g), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 2, &src, 1, name, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    /* Delta 2: half the deleted rows re-created, some rows updated again. */
    for (uint64_t i = 0; i < 1000; i++) k[i] = key_of(10000 + i);
    assert_int_equal(gr_table_apply(src, k, 1000, g), GR_OK);
    for (uint64_t i = 0; i < 4000; i++) k[i] = key_of(i * 3);
    assert_int_equal(gr_table_apply(src, k, 4000, g), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(sv, 3, &src, 1, name, &fi), GR_OK);
    assert_int_equal(fi.kind, GR_CKPT_DELTA);
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    for (uint32_t threads = 1; threads <= 4; threads += 3) {
        gr_ckpt_load_stats st;
        gr_table *t = restored(dir, 0, 1, threads, &st);
        assert_int_equal(st.checkpoints, 3);
        /* Deleted in delta 1 and not re-created: keys 11000..11999 but the 333 multiples of 3
         * among them, which delta 2's apply created again. */
        assert_int_equal(st.rows_dropped, 1000 - 333);
        assert_equal_tables(src, t, ROWS + 5000);
        gr_table_destroy(t);
    }
    free(k);
    free(g);
    free(out);
    gr_ckpt_saver_destroy(sv);
    gr_table_destroy(src);
}

static void test_threads_damaged_section(void **state)
{
    (void)state;
    gr_table *src = filled(0, ROWS);
    gr_ckpt_saver *sv = NULL;
    gr_ckpt_saver_opts so = {0, 1, false, 0, 0, 0};
    assert_int_equal(gr_ckpt_saver_create(g_tmp, &so, &sv), GR_OK);
    char name[GR_CKPT_NAME_MAX], dir[512], path[700];
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_saver_save(sv, 1, &src, 1, name, &fi), GR_OK);
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    snprintf(path, sizeof path, "%s/shard-00000-of-00001.gck", dir);
    /* One byte in the middle of the file, inside a ROWS payload: its checksum fails. */
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    off_t at = (off_t)(fi.size / 2);
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
    for (uint32_t threads = 1; threads <= 8; threads *= 2) {
        gr_table_spec sp;
        spec_of(&sp);
        gr_table *t = NULL;
        assert_int_equal(gr_table_create(&sp, &t), GR_OK);
        gr_ckpt_load_opts lo = {0, 1, NULL, threads};
        assert_int_equal(gr_ckpt_load(dir, &t, 1, &lo, NULL), GR_ECORRUPT);
        assert_non_null(strstr(gr_errmsg(), "payload checksum mismatch"));
        assert_non_null(strstr(gr_errmsg(), "shard-00000-of-00001.gck"));
        gr_table_destroy(t);
    }
    gr_ckpt_saver_destroy(sv);
    gr_table_destroy(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_threads_restore_bitwise, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_threads_restore_delta_chain, setup_tmp, teardown_tmp),
        cmocka_unit_test_setup_teardown(test_threads_damaged_section, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
