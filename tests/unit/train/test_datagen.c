/* Unit tests for datagen: the same seed gives the same bytes whatever the thread count, a
 * different seed different bytes, the files parse cleanly, and the oracle is plausible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/train.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gr_datagen_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *slurp(const char *dir, const char *name, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *buf;
    assert_int_equal(gr_read_file(path, &buf, len), GR_OK);
    return buf;
}

static void gen(const char *sub, uint64_t seed, unsigned threads, gr_datagen_result *r)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    gr_datagen_opts o = {.train_rows = 20000, .test_rows = 5000, .seed = seed, .threads = threads};
    assert_int_equal(gr_datagen_run(dir, &o, r), GR_OK);
}

static void test_deterministic(void **state)
{
    (void)state;
    gr_datagen_result a, b, c;
    gen("a", 7, 1, &a);
    gen("b", 7, 3, &b);
    gen("c", 8, 2, &c);
    char da[128], db[128], dc[128];
    snprintf(da, sizeof da, "%s/a", tmpdir);
    snprintf(db, sizeof db, "%s/b", tmpdir);
    snprintf(dc, sizeof dc, "%s/c", tmpdir);
    const char *files[] = {"train.tsv", "test.tsv", "oracle.json"};
    for (int i = 0; i < 3; i++) {
        size_t la, lb, lc;
        char *x = slurp(da, files[i], &la), *y = slurp(db, files[i], &lb),
             *z = slurp(dc, files[i], &lc);
        assert_int_equal(la, lb);
        assert_memory_equal(x, y, la);
        assert_true(la != lc || memcmp(x, z, la) != 0);
        free(x);
        free(y);
        free(z);
    }
    assert_true(a.teacher_auc == b.teacher_auc);
    assert_int_equal(a.train_rows, 20000);
    assert_int_equal(a.test_rows, 5000);
    /* The generator aims at a 10-30% positive rate and a teacher AUC around 0.75-0.85. */
    assert_true(a.test_positive_rate > 0.10 && a.test_positive_rate < 0.30);
    assert_true(a.teacher_auc > 0.75 && a.teacher_auc < 0.87);
    assert_true(a.teacher_logloss < a.base_logloss);

    /* oracle.json carries the same figures. */
    size_t len;
    char *json = slurp(da, "oracle.json", &len);
    cJSON *o = cJSON_Parse(json);
    assert_non_null(o);
    assert_float_equal(cJSON_GetObjectItem(o, "teacher_auc")->valuedouble, a.teacher_auc, 1e-9);
    assert_float_equal(cJSON_GetObjectItem(o, "teacher_logloss")->valuedouble,
                       a.teacher_logloss, 1e-9);
    assert_int_equal((int)cJSON_GetObjectItem(o, "train_rows")->valuedouble, 20000);
    assert_int_equal((int)cJSON_GetObjectItem(o, "test_rows")->valuedouble, 5000);
    assert_int_equal((int)cJSON_GetObjectItem(o, "seed")->valuedouble, 7);
    assert_float_equal(cJSON_GetObjectItem(o, "positive_rate")->valuedouble,
                       a.test_positive_rate, 1e-9);
    cJSON_Delete(o);
    free(json);

    /* The reader takes every line, and the label mean matches the reported rate. */
    char path[256];
    snprintf(path, sizeof path, "%s/train.tsv", da);
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.strict = true;
    ro.threads = 2;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &ro, &r), GR_OK);
    gr_batch bt;
    assert_int_equal(gr_batch_init(&bt, 1024), GR_OK);
    double pos = 0;
    size_t n = 0;
    for (;;) {
        assert_int_equal(gr_criteo_next(r, &bt), GR_OK);
        if (!bt.n) break;
        for (size_t i = 0; i < bt.n; i++) pos += bt.labels[i];
        n += bt.n;
    }
    assert_int_equal(n, 20000);
    assert_float_equal(pos / n, a.train_positive_rate, 1e-9);
    gr_criteo_close(r);
    gr_batch_fini(&bt);
}

static void test_empty_and_errors(void **state)
{
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/empty", tmpdir);
    gr_datagen_opts o = {.train_rows = 0, .test_rows = 0, .seed = 1};
    gr_datagen_result r;
    assert_int_equal(gr_datagen_run(dir, &o, &r), GR_OK);
    assert_true(isnan(r.teacher_auc)); /* no test rows: undefined, null in oracle.json */
    size_t len;
    char *json = slurp(dir, "oracle.json", &len);
    assert_non_null(strstr(json, "\"teacher_auc\":\tnull"));
    free(json);
    assert_int_equal(gr_datagen_run("/proc/nope/x", &o, &r), GR_EIO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_empty_and_errors),
    };
    return cmocka_run_group_tests_name("train_datagen", tests, setup, teardown);
}
