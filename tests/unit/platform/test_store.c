/* The job store's time series (events, progress samples, shard samples): the newest rows of
 * one job, oldest first, with every column under its key; a NaN sample reads back as null; other
 * jobs' rows never appear. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "platform/platform_int.h"

static int setup(void **state)
{
    char tmpl[] = "/tmp/granary-store-XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    char *path = strdup(dir);
    store *s;
    assert_int_equal(store_open(path, &s), 0);
    void **pair = calloc(2, sizeof *pair);
    pair[0] = s;
    pair[1] = path;
    *state = pair;
    return 0;
}

static int teardown(void **state)
{
    void **pair = *state;
    store_close(pair[0]);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", (char *)pair[1]);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", (char *)pair[1]);
    free(pair[1]);
    free(pair);
    return 0;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static void test_events_newest_oldest_first(void **state)
{
    store *s = ((void **)*state)[0];
    for (int i = 0; i < 5; i++) assert_int_equal(store_event(s, 7, "step", "event %d", i), 0);
    assert_int_equal(store_event(s, 8, "other", "not job 7's"), 0);
    cJSON *a = store_events(s, 7, 3);
    assert_int_equal(cJSON_GetArraySize(a), 3);
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        char want[32];
        snprintf(want, sizeof want, "event %d", i + 2);
        assert_string_equal(cJSON_GetObjectItem(e, "message")->valuestring, want);
        assert_string_equal(cJSON_GetObjectItem(e, "kind")->valuestring, "step");
        assert_true(num(e, "t") > 0);
    }
    cJSON_Delete(a);
    a = store_events(s, 9, 10);
    assert_int_equal(cJSON_GetArraySize(a), 0);
    cJSON_Delete(a);
}

static void test_samples_round_trip(void **state)
{
    store *s = ((void **)*state)[0];
    job j;
    memset(&j, 0, sizeof j);
    j.id = 3;
    for (int i = 0; i < 4; i++) {
        j.examples = 1000.0 * (i + 1);
        j.loss = 0.5 - 0.125 * i;
        j.auc = i == 3 ? NAN : 0.75 + 0.0625 * i;
        j.eps = 250.5 * i;
        j.rps = 2.25;
        j.replicas = (unsigned)i;
        assert_int_equal(store_sample(s, &j), 0);
    }
    cJSON *a = store_samples(s, 3, 2);
    assert_int_equal(cJSON_GetArraySize(a), 2);
    const cJSON *first = cJSON_GetArrayItem(a, 0), *last = cJSON_GetArrayItem(a, 1);
    assert_true(num(first, "examples") == 3000.0);
    assert_true(num(first, "loss") == 0.25);
    assert_true(num(first, "auc") == 0.875);
    assert_true(num(first, "eps") == 501.0);
    assert_true(num(first, "rps") == 2.25);
    assert_true(num(first, "replicas") == 2.0);
    assert_true(num(last, "examples") == 4000.0);
    /* SQLite stores NaN as NULL: a sample without an AUC says so. */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(last, "auc")));
    assert_true(num(last, "t") >= num(first, "t"));
    cJSON_Delete(a);
}

static void test_shard_samples_round_trip(void **state)
{
    store *s = ((void **)*state)[0];
    assert_int_equal(store_shard_sample(s, 4, 0, 100.0, 10.0), 0);
    assert_int_equal(store_shard_sample(s, 4, 1, 200.0, 20.5), 0);
    assert_int_equal(store_shard_sample(s, 5, 0, 1.0, 1.0), 0);
    cJSON *a = store_shard_samples(s, 4, 10);
    assert_int_equal(cJSON_GetArraySize(a), 2);
    const cJSON *b = cJSON_GetArrayItem(a, 1);
    assert_true(num(b, "shard") == 1.0);
    assert_true(num(b, "rows") == 200.0);
    assert_true(num(b, "requests") == 20.5);
    assert_true(num(cJSON_GetArrayItem(a, 0), "shard") == 0.0);
    cJSON_Delete(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_events_newest_oldest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_samples_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_samples_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
