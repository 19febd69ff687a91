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

#include <xxhash.h>

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

/* Writes a NaN into the first weight of the first ROWS section of a raw shard file and
 * recomputes every checksum over it (section, trailer, manifest), as a writer without the
 * check would have produced it. Returns the key of that row. */
static uint64_t plant_nan(const char *dir, const char *file)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    ck_reader r;
    assert_int_equal(ck_reader_open(&r, path, 0), GR_OK);
    ck_section s;
    uint64_t off = 0;
    unsigned char *buf = NULL;
    size_t cap = 0;
    while (ck_reader_next(&r, &s) == 1) {
        if (s.type == CK_SEC_TABLE) {
            assert_int_equal(ck_reader_payload(&r, &s, &buf, &cap), GR_OK);
            assert_int_equal(ck_reader_table(&r, &s, buf), GR_OK);
        }
        if (s.type == CK_SEC_ROWS) {
            off = r.payload_off;
            break;
        }
    }
    free(buf);
    ck_reader_close(&r);
    assert_true(off > 0);
    assert_int_equal(s.codec, CK_CODEC_NONE);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char *payload = malloc(s.stored_len);
    assert_int_equal(pread(fd, payload, s.stored_len, (off_t)off), (ssize_t)s.stored_len);
    uint64_t key;
    memcpy(&key, payload, 8);
    float nan = NAN;
    memcpy(payload + 8 * s.count, &nan, 4);
    assert_int_equal(pwrite(fd, payload, s.stored_len, (off_t)off), (ssize_t)s.stored_len);
    s.payload_checksum = XXH3_64bits(payload, s.stored_len);
    s.checksum = XXH3_64bits(&s, 48);
    assert_int_equal(pwrite(fd, &s, sizeof s, (off_t)(off - sizeof s)), (ssize_t)sizeof s);
    free(payload);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t body = (size_t)st.st_size - CK_TAIL_SIZE;
    unsigned char *all = malloc(body);
    assert_int_equal(pread(fd, all, body, 0), (ssize_t)body);
    ck_tail tail;
    assert_int_equal(pread(fd, &tail, sizeof tail, (off_t)body), (ssize_t)sizeof tail);
    uint64_t old = tail.content_checksum;
    tail.content_checksum = XXH3_64bits(all, body);
    assert_int_equal(pwrite(fd, &tail, sizeof tail, (off_t)body), (ssize_t)sizeof tail);
    free(all);
    close(fd);
    char mpath[700], oldhex[17], newhex[17], *txt = NULL;
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    snprintf(oldhex, sizeof oldhex, "%016llx", (unsigned long long)old);
    snprintf(newhex, sizeof newhex, "%016llx", (unsigned long long)tail.content_checksum);
    size_t len = 0;
    assert_int_equal(gr_read_file(mpath, &txt, &len), 0);
    char *at = strstr(txt, oldhex);
    assert_non_null(at);
    memcpy(at, newhex, 16);
    assert_int_equal(gr_write_file_atomic(mpath, txt, len), 0);
    free(txt);
    return key;
}

/* A restore names exactly which file, table and row is bad (and inserts nothing of it). */
static void test_restore_names_the_bad_row(void **state)
{
    (void)state;
    gr_table *t = table_with("emb", 1.0f);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/step-000000000001", g_tmp);
    gr_ckpt_write_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.kind = GR_CKPT_FULL;
    wo.shards = 1;
    wo.step = 1;
    gr_ckpt_file_info fi;
    assert_int_equal(gr_ckpt_write_shard(dir, &t, 1, &wo, &fi), 0);
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    assert_int_equal(gr_ckpt_commit(dir, &co), 0);
    uint64_t key = plant_nan(dir, fi.name);
    gr_table *target = NULL;
    assert_int_equal(gr_table_create(gr_table_get_spec(t), &target), 0);
    gr_ckpt_load_opts lo = {0, 1, NULL, 0};
    assert_int_equal(gr_ckpt_load(dir, &target, 1, &lo, NULL), GR_ECORRUPT);
    char want[256];
    snprintf(want, sizeof want, "%s: table 'emb', row of key %llu: weight element 0 is nan",
             fi.name, (unsigned long long)key);
    if (!strstr(gr_errmsg(), want)) fprintf(stderr, "got: %s\nwant: %s\n", gr_errmsg(), want);
    assert_non_null(strstr(gr_errmsg(), want));
    gr_table_stats st;
    gr_table_get_stats(target, &st);
    assert_int_equal(st.rows, 0);
    gr_table_destroy(target);
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
        cmocka_unit_test_setup_teardown(test_restore_names_the_bad_row, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
