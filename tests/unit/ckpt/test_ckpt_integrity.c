/* Checkpoints that save must load (issue 9), at the library level: the writer refuses what the
 * loader would refuse (an f16 export of a weight beyond the half-float range was committed,
 * then refused by every load), files are opened without blocking and must be regular files,
 * metadata is sized before it is read, and a manifest's parts are checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "granary/ckpt.h"

static char g_tmp[256];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/gr-ckpt-integrity-XXXXXX");
    assert_non_null(mkdtemp(g_tmp));
    return 0;
}

static int teardown_tmp(void **state)
{
    (void)state;
    ck_rmtree(g_tmp);
    return 0;
}

static gr_table *table_with(const char *name, float value)
{
    gr_table_spec sp;
    gr_table_spec_default(&sp, name, 4);
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&sp, &t), 0);
    uint64_t keys[2] = {5, 6};
    float w[8] = {0.5f, 0.5f, 0.5f, 0.5f, value, 0.25f, 0.25f, 0.25f};
    assert_int_equal(gr_table_insert(t, keys, 2, w, NULL, NULL), 0);
    return t;
}

/* Before: the export was committed and every load refused it (f16 inf). */
static void test_f16_export_out_of_range_is_not_committed(void **state)
{
    (void)state;
    gr_table *t = table_with("emb", 70000.0f);
    char dir[512], mf[600];
    snprintf(dir, sizeof dir, "%s/export", g_tmp);
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_export(dir, &t, 1, 3, true, 0, &fi), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "table 'emb', row of key 6"));
    assert_non_null(strstr(gr_errmsg(), "weight element 0 is 70000"));
    assert_non_null(strstr(gr_errmsg(), "nothing committed"));
    snprintf(mf, sizeof mf, "%s/manifest.json", dir);
    assert_int_equal(access(mf, F_OK), -1);
    /* The same table exports in f32, and that export loads. */
    snprintf(dir, sizeof dir, "%s/export32", g_tmp);
    assert_int_equal(gr_ckpt_export(dir, &t, 1, 3, false, 0, &fi), 0);
    assert_int_equal(gr_ckpt_verify(dir, false, NULL), 0);
    gr_table_destroy(t);
}

/* The shared check names the table, key and element; state values are checked too. */
static void test_row_check_messages(void **state)
{
    (void)state;
    float w[3] = {1.0f, 2.0f, 3.0f}, st[2] = {0.0f, 0.0f};
    assert_int_equal(ck_check_row("f", "t", 9, w, 3, false, st, 2), 0);
    assert_int_equal(ck_check_row("f", "t", 9, w, 3, true, st, 2), 0);
    w[1] = 65520.0f;
    assert_int_equal(ck_check_row("f", "t", 9, w, 3, false, st, 2), 0);
    assert_int_equal(ck_check_row("f", "t", 9, w, 3, true, st, 2), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "in half precision"));
    w[1] = 2.0f;
    st[1] = -INFINITY;
    assert_int_equal(ck_check_row("shard.gck", "user", 77, w, 3, false, st, 2), GR_ECORRUPT);
    assert_string_equal(gr_errmsg(), "shard.gck: table 'user', row of key 77: optimizer state "
                                     "element 1 is -inf, not finite");
}

/* A FIFO, a directory or a device in place of a file is refused at once, never waited on;
 * a file over the limit is refused by its size before it is read. */
static void test_open_regular_and_read_small(void **state)
{
    (void)state;
    char p[600];
    int fd = -1;
    uint64_t size = 0;
    snprintf(p, sizeof p, "%s/fifo", g_tmp);
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(gr_ckpt_open_regular(p, &fd, &size), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "not a regular file"));
    assert_int_equal(fd, -1);
    char *buf = NULL;
    assert_int_equal(gr_ckpt_read_small(p, 100, &buf, NULL), GR_ECORRUPT);
    assert_int_equal(gr_ckpt_open_regular(g_tmp, &fd, &size), GR_ECORRUPT);
    assert_int_equal(gr_ckpt_open_regular("/dev/null", &fd, &size), GR_ECORRUPT);
    snprintf(p, sizeof p, "%s/missing", g_tmp);
    assert_int_equal(gr_ckpt_open_regular(p, &fd, &size), GR_ENOENT);
    /* A sparse 1 GiB file: refused by size, nothing allocated for it. */
    snprintf(p, sizeof p, "%s/big.json", g_tmp);
    int f = open(p, O_CREAT | O_WRONLY, 0644);
    assert_true(f >= 0);
    assert_int_equal(ftruncate(f, 1ll << 30), 0);
    close(f);
    assert_int_equal(gr_ckpt_read_small(p, GR_CKPT_META_MAX, &buf, NULL), GR_ETOOBIG);
    assert_null(buf);
    assert_non_null(strstr(gr_errmsg(), "1073741824 bytes"));
    assert_int_equal(truncate(p, 2), 0);
    size_t len = 0;
    assert_int_equal(gr_ckpt_read_small(p, GR_CKPT_META_MAX, &buf, &len), 0);
    assert_int_equal(len, 2);
    free(buf);
    /* A FIFO named manifest.json: the manifest read fails at once. */
    char d[512];
    snprintf(d, sizeof d, "%s/ck", g_tmp);
    assert_int_equal(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/manifest.json", d);
    assert_int_equal(mkfifo(p, 0644), 0);
    gr_ckpt_manifest *m = NULL;
    assert_int_equal(gr_ckpt_manifest_read(d, &m), GR_ECORRUPT);
    assert_null(m);
}

/* Parts: listed in the manifest only when given (older manifests print as before), each must
 * be committed, and verify fails when one is missing. */
static void test_parts(void **state)
{
    (void)state;
    gr_table *t = table_with("emb", 1.0f);
    char dir[512], sub[600];
    snprintf(dir, sizeof dir, "%s/step-000000000001", g_tmp);
    snprintf(sub, sizeof sub, "%s/extra", dir);
    gr_ckpt_write_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.kind = GR_CKPT_FULL;
    wo.shards = 1;
    wo.step = 1;
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, &fi), 0);
    assert_int_equal(gr_ckpt_write_shard(sub, &t, 1, &wo, &fi), 0);
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    const char *parts[] = {"extra"}, *bad[] = {"nothere"}, *twice[] = {"extra", "extra"};
    assert_int_equal(gr_ckpt_commit_parts(dir, &co, parts, 1), GR_ENOENT); /* sub uncommitted */
    assert_int_equal(gr_ckpt_commit(sub, &co), 0);
    assert_int_equal(gr_ckpt_commit_parts(dir, &co, bad, 1), GR_ENOENT);
    assert_int_equal(gr_ckpt_commit_parts(dir, &co, twice, 2), GR_EINVAL);
    assert_int_equal(gr_ckpt_commit_parts(dir, &co, parts, 1), 0);
    gr_ckpt_manifest *m = NULL;
    assert_int_equal(gr_ckpt_manifest_read(dir, &m), 0);
    assert_int_equal(m->nparts, 1);
    assert_string_equal(m->parts[0], "extra");
    char *js = gr_ckpt_manifest_to_json(m);
    assert_non_null(strstr(js, "\"parts\""));
    gr_ckpt_manifest *back = NULL;
    assert_int_equal(gr_ckpt_manifest_parse(js, strlen(js), &back), 0);
    assert_int_equal(back->nparts, 1);
    gr_ckpt_manifest_destroy(back);
    free(js);
    gr_ckpt_manifest_destroy(m);
    gr_ckpt_verify_stats vs;
    assert_int_equal(gr_ckpt_verify(dir, false, &vs), 0);
    assert_int_equal(vs.files, 2);
    ck_rmtree(sub);
    assert_int_equal(gr_ckpt_verify(dir, false, &vs), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "part extra is missing"));
    gr_table_destroy(t);
}

/* An f16 table cannot hold 65520 or more: an insert (a restore) of such a row is refused. */
static void test_f16_table_insert_range(void **state)
{
    (void)state;
    gr_table_spec sp;
    gr_table_spec_default(&sp, "h", 2);
    sp.dtype = GR_DTYPE_F16;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&sp, &t), 0);
    uint64_t key = 3;
    float w[2] = {1.0f, 70000.0f};
    assert_int_equal(gr_table_insert(t, &key, 1, w, NULL, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "outside the f16 range"));
    w[1] = 65504.0f;
    assert_int_equal(gr_table_insert(t, &key, 1, w, NULL, NULL), 0);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_f16_export_out_of_range_is_not_committed, setup_tmp,
                                        teardown_tmp),
        cmocka_unit_test(test_row_check_messages),
        cmocka_unit_test_setup_teardown(test_open_regular_and_read_small, setup_tmp,
                                        teardown_tmp),
        cmocka_unit_test_setup_teardown(test_parts, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_f16_table_insert_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
