/* `granary plan`: its memory per shard against real tables filled to the planned rows (within
 * 10 %; the estimate uses the engine's own accounting, so it is usually within 1 %), the
 * fewest shards that fit a machine, what the sync modes and dense parameters add, the
 * command's JSON and overlay, and bad input refused with a message naming it. */
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

#include "cli/plan.h"
#include "granary/table.h"
#include "granary/train.h"
#include "support/ps_harness.h"

static const char *const spec_json =
    "{\"tables\": ["
    "{\"name\": \"user\", \"id\": 1, \"dim\": 16, \"optimizer\": {\"kind\": \"adagrad\", "
    "\"lr\": 0.05}, \"rows\": 600000, \"ids_per_example\": 1},"
    "{\"name\": \"item\", \"id\": 2, \"dim\": 24, \"dtype\": \"f16\", \"optimizer\": {\"kind\": "
    "\"rowwise_adagrad\", \"lr\": 0.05}, \"admit\": {\"min_count\": 2}, \"rows\": 150000, "
    "\"ids_per_example\": 3}], "
    "\"examples_per_second\": 50000, \"workers\": 4, \"batch\": 512}";

static void read_input(plan_input *in)
{
    memset(in, 0, sizeof *in);
    in->examples_per_sec = 1;
    in->workers = 1;
    in->batch = 1;
    assert_int_equal(plan_read_spec(spec_json, in), GR_OK);
    in->mode = GR_MODE_ASYNC;
    in->machine_bytes = 64ull << 20;
    in->headroom = 0.3;
    in->disk_bytes_per_sec = 200e6;
    in->cpus = 2;
}

/* One shard's tables, filled with its planned rows (distinct keys), as `granary stats` counts. */
static uint64_t filled_bytes(const plan_input *in, const plan_result *r)
{
    uint64_t total = 0;
    for (size_t i = 0; i < in->ntables; i++) {
        const plan_table *t = &in->tables[i];
        gr_table *tab;
        assert_int_equal(gr_table_create(&t->spec, &tab), GR_OK);
        uint64_t rows = t->shard.rows;
        assert_true(rows == (t->rows + r->shards - 1) / r->shards);
        enum { B = 8192 };
        uint64_t *keys = malloc(B * sizeof *keys);
        float *out = malloc((size_t)B * t->spec.dim * sizeof *out);
        unsigned looks = t->spec.admit_min_count > 1 ? t->spec.admit_min_count : 1;
        for (uint64_t k = 0; k < rows; k += B) {
            size_t n = rows - k < B ? (size_t)(rows - k) : B;
            for (size_t j = 0; j < n; j++)
                keys[j] = (k + j) * 0x9E3779B97F4A7C15ull + i;
            for (unsigned l = 0; l < looks; l++)
                assert_int_equal(gr_table_lookup(tab, keys, n, out, 0), GR_OK);
        }
        gr_table_stats st;
        gr_table_get_stats(tab, &st);
        assert_int_equal(st.rows, rows);
        total += st.bytes;
        free(keys);
        free(out);
        gr_table_destroy(tab);
    }
    return total;
}

static void test_memory_matches_real_tables(void **state)
{
    (void)state;
    plan_input in;
    read_input(&in);
    plan_result r;
    assert_int_equal(plan_compute(&in, &r), GR_OK);
    /* ~150 MB of tables in all against 64 MiB machines: several shards. */
    assert_true(r.shards >= 3);
    uint64_t real = filled_bytes(&in, &r);
    double ratio = (double)r.shard.table_bytes / (double)real;
    fprintf(stderr, "plan: %u shards, per shard planned %llu bytes, real %llu (ratio %.4f)\n",
            r.shards, (unsigned long long)r.shard.table_bytes, (unsigned long long)real, ratio);
    assert_true(ratio > 0.9 && ratio < 1.1);
    /* The fewest that fit: one shard fewer would not. */
    assert_true(r.shard.request_bytes <= in.machine_bytes);
    plan_input fewer = in;
    fewer.shards = r.shards - 1;
    plan_result rf;
    assert_int_equal(plan_compute(&fewer, &rf), GR_OK);
    assert_int_equal(rf.shards, r.shards - 1);
    assert_true(rf.shard.request_bytes > in.machine_bytes);
    /* Async with no dense parameters: memory is the tables; the request adds the headroom. */
    assert_int_equal(r.shard.staging_bytes, 0);
    assert_int_equal(r.shard.dense_bytes, 0);
    assert_true(r.shard.request_bytes == (uint64_t)ceil(r.shard.table_bytes * 1.3));
    /* Network: 50000 examples/s x (1 user id x (16 + 64) + 3 item ids x (16 + 96)) bytes in. */
    double want_in = 50000.0 * (1 * (16 + 64) + 3 * (16 + 96)) / r.shards;
    assert_true(fabs(r.shard.net_in_bytes_per_sec - want_in) < 1e-6 * want_in);
    /* Checkpoint: 8 + payload + 8 bytes per row. */
    double want_ck = (double)in.tables[0].shard.rows * (16 + 64 + 16 * 4) +
                     (double)in.tables[1].shard.rows * (16 + 48 + 4);
    assert_true(r.shard.ckpt_bytes > want_ck && r.shard.ckpt_bytes < want_ck * 1.01 + 8192);
}

static void test_modes_and_dense(void **state)
{
    (void)state;
    plan_input in;
    read_input(&in);
    in.shards = 2;
    in.dense_floats = 1000000;
    plan_result async_r, sync_r;
    assert_int_equal(plan_compute(&in, &async_r), GR_OK);
    in.mode = GR_MODE_SYNC;
    assert_int_equal(plan_compute(&in, &sync_r), GR_OK);
    /* Dense: weights and Adam's two moments; in sync modes a step of gradients per worker. */
    assert_int_equal(async_r.shard.dense_bytes, 12000000);
    assert_int_equal(sync_r.shard.dense_bytes, 12000000 + 4 * 4000000);
    /* Sync staging: 4 workers x 512 examples x ids x (key + gradient) / 2 shards. */
    double want = 4.0 * 512 * (1 * (8 + 64) + 3 * (8 + 96)) / 2;
    assert_true(fabs((double)sync_r.shard.staging_bytes - want) <= 1);
    assert_int_equal(async_r.shard.staging_bytes, 0);
    assert_int_equal(sync_r.shard.table_bytes, async_r.shard.table_bytes);
    /* A machine nothing fits on. */
    in.shards = 0;
    in.machine_bytes = 1 << 20;
    assert_int_equal(plan_compute(&in, &sync_r), GR_ECAPACITY);
    assert_non_null(strstr(gr_errmsg(), "--memory-per-shard"));
}

static void test_bad_input(void **state)
{
    (void)state;
    plan_input in;
    memset(&in, 0, sizeof in);
    assert_int_equal(plan_read_spec("{\"tables\": []}", &in), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "non-empty \"tables\""));
    assert_int_equal(plan_read_spec("{\"tables\": [{\"name\": \"a\", \"id\": 1, \"dim\": 4, "
                                    "\"colour\": 1}]}",
                                    &in),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "colour"));
    assert_int_equal(plan_read_spec("{\"tables\": [{\"name\": \"a\", \"id\": 1, \"dim\": 4, "
                                    "\"rows\": -5}]}",
                                    &in),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "\"rows\""));
    assert_int_equal(plan_read_spec("{\"tables\": [{\"name\": \"a\", \"id\": 1, \"dim\": 4}, "
                                    "{\"name\": \"a\", \"id\": 2, \"dim\": 4}]}",
                                    &in),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "listed twice"));
    assert_int_equal(plan_read_spec("[1]", &in), GR_EINVAL);
    read_input(&in);
    assert_int_equal(plan_set_rows(&in, "user=2e6,item=7"), GR_OK);
    assert_true(in.tables[0].rows == 2000000 && in.tables[1].rows == 7);
    assert_int_equal(plan_set_rows(&in, "5000"), GR_OK);
    assert_true(in.tables[0].rows == 5000 && in.tables[1].rows == 5000);
    assert_int_equal(plan_set_rows(&in, "nobody=5"), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "no table named 'nobody'"));
    assert_int_equal(plan_set_rows(&in, "user=lots"), GR_EINVAL);
}

/* The command: JSON on stdout with the same numbers, and the overlay written. */
static void test_command_json_and_overlay(void **state)
{
    (void)state;
    char dir[128];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    char spec[256], ov[256];
    snprintf(spec, sizeof spec, "%s/spec.json", dir);
    snprintf(ov, sizeof ov, "%s/overlay", dir);
    FILE *f = fopen(spec, "w");
    fputs(spec_json, f);
    fclose(f);
    static char out[65536];
    const char *args[] = {"plan",   "--tables", spec,     "--memory-per-shard", "64M",
                          "--mode", "async",    "--json", "--emit-kustomize",   ov,
                          NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    plan_input in;
    read_input(&in);
    plan_result r;
    assert_int_equal(plan_compute(&in, &r), GR_OK);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "shards")) == r.shards);
    cJSON *ps = cJSON_GetObjectItem(j, "per_shard");
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "memory_bytes")) ==
                (double)r.shard.memory_bytes);
    cJSON_Delete(j);
    char path[512], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/kustomization.yaml", ov);
    assert_int_equal(gr_read_file(path, &text, &len), 0);
    char want[64];
    snprintf(want, sizeof want, "count: %u\n", r.shards);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "- SHARDS=%u\n", r.shards);
    assert_non_null(strstr(text, want));
    free(text);
    snprintf(path, sizeof path, "%s/shard-resources.yaml", ov);
    assert_int_equal(gr_read_file(path, &text, &len), 0);
    snprintf(want, sizeof want, "memory: %lluMi\n",
             (unsigned long long)((r.shard.request_bytes + (1u << 20) - 1) >> 20));
    assert_non_null(strstr(text, want));
    free(text);
    /* Bad input: exit 2 naming what was wrong. */
    const char *bad[] = {"plan", "--tables", spec, "--rows-per-table", "nobody=1", NULL};
    assert_int_equal(ps_test_run_granary(bad, out, sizeof out), 2);
    assert_non_null(strstr(out, "no table named 'nobody'"));
    const char *none[] = {"plan", NULL};
    assert_int_equal(ps_test_run_granary(none, out, sizeof out), 2);
    assert_non_null(strstr(out, "--tables SPEC.json is required"));
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_matches_real_tables),
        cmocka_unit_test(test_modes_and_dense),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_command_json_and_overlay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
