/* `granary server --metrics`: real shards serve /metrics and /healthz, and the series agree
 * exactly with what happened (rows created, requests by operation, their latency count, bad
 * frames) and with the shard's own STATS document, which they mirror. */
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
#include "granary/http.h"
#include "support/ps_harness.h"

static char *scrape(uint16_t port, const char *path, int *status)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    gr_http_result res;
    assert_int_equal(gr_http_fetch("GET", url, NULL, NULL, 0, 10000, &res), GR_OK);
    *status = res.status;
    return res.body; /* malloc'd; freed by the caller */
}

/* The value of the series whose name{labels} is exactly `series`; -1 when absent. */
static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return -1;
}

static double stats_number(gr_client *c, uint32_t shard, const char *obj, const char *key)
{
    char *txt = NULL;
    assert_int_equal(gr_client_stats(c, shard, &txt), 0);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *o = obj ? cJSON_GetObjectItemCaseSensitive(root, obj) : root;
    double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, key));
    cJSON_Delete(root);
    return v;
}

static void test_server_series(void **state)
{
    (void)state;
    ps_test_server srv[2];
    const char *extra[] = {"--metrics", "127.0.0.1:0", NULL};
    char list[256];
    assert_int_equal(ps_test_cluster_start(srv, 2, extra, list, sizeof list), 0);
    assert_true(srv[0].metrics_port > 0 && srv[1].metrics_port > 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"user\",\"id\":1,\"dim\":8}"), 0);
    enum { N = 1000 };
    uint64_t keys[N];
    for (size_t i = 0; i < N; i++)
        keys[i] = 7919 * i + 3;
    float *rows = calloc(N * 8, sizeof *rows);
    assert_int_equal(gr_client_pull(c, 1, 8, keys, N, rows), 0);
    assert_int_equal(gr_client_push(c, 1, 8, keys, N, rows), 0);
    assert_int_equal(gr_client_pull(c, 1, 8, keys, N, rows), 0);
    free(rows);
    /* A frame that is not granary's: the shard closes that connection and counts it. */
    int fd = ps_test_connect(srv[0].port);
    assert_true(fd >= 0);
    char junk[64];
    memset(junk, 'x', sizeof junk);
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    char b;
    assert_true(read(fd, &b, 1) >= 0); /* an error reply or the close */
    close(fd);
    usleep(50 * 1000);

    double rows_sum = 0;
    for (unsigned s = 0; s < 2; s++) {
        int status;
        char *txt = scrape(srv[s].metrics_port, "/metrics", &status);
        assert_int_equal(status, 200);
        char name[160];
        snprintf(name, sizeof name, "granary_table_rows{shard=\"%u\",table=\"user\"}", s);
        double rows_s = value_of(txt, name);
        assert_true(rows_s > 0);
        assert_true(rows_s == stats_number(c, s, NULL, "rows"));
        rows_sum += rows_s;
        /* Two pulls and one push reached each shard (one request each: 1000 keys fit). */
        snprintf(name, sizeof name, "granary_server_requests_total{shard=\"%u\",op=\"pull\"}", s);
        assert_true(value_of(txt, name) == 2);
        snprintf(name, sizeof name, "granary_server_requests_total{shard=\"%u\",op=\"push\"}", s);
        assert_true(value_of(txt, name) == 1);
        snprintf(name, sizeof name,
                 "granary_server_request_duration_seconds_count{shard=\"%u\",op=\"pull\"}", s);
        assert_true(value_of(txt, name) == 2);
        snprintf(
            name, sizeof name,
            "granary_server_request_duration_seconds_bucket{shard=\"%u\",op=\"pull\",le=\"+Inf\"}",
            s);
        assert_true(value_of(txt, name) == 2);
        snprintf(name, sizeof name, "granary_server_request_keys_total{shard=\"%u\",op=\"pull\"}",
                 s);
        assert_true(value_of(txt, name) == 2 * rows_s);
        snprintf(name, sizeof name, "granary_server_memory_bytes{shard=\"%u\"}", s);
        assert_true(value_of(txt, name) == stats_number(c, s, NULL, "memory_bytes"));
        assert_true(value_of(txt, name) > rows_s * 8 * sizeof(float));
        snprintf(name, sizeof name, "granary_server_bad_frames_total{shard=\"%u\"}", s);
        assert_true(value_of(txt, name) == (s == 0 ? 1 : 0));
        assert_true(value_of(txt, "process_resident_memory_bytes") > 1e6);
        /* Operations never used are not listed. */
        assert_null(strstr(txt, "op=\"ckpt_load\""));
        free(txt);
        txt = scrape(srv[s].metrics_port, "/healthz", &status);
        assert_int_equal(status, 200);
        assert_string_equal(txt, "ok\n");
        free(txt);
    }
    assert_true(rows_sum == N);
    /* A dropped table leaves the exposition. */
    assert_int_equal(gr_client_drop_table(c, "user"), 0);
    int status;
    char *txt = scrape(srv[0].metrics_port, "/metrics", &status);
    assert_null(strstr(txt, "table=\"user\""));
    free(txt);
    gr_client_destroy(c);
    ps_test_cluster_stop(srv, 2);
}

static void test_bad_metrics_address(void **state)
{
    (void)state;
    char out[2048];
    const char *args[] = {"server", "--listen", "127.0.0.1:0", "--metrics", "nonsense", NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "--metrics nonsense"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_series),
        cmocka_unit_test(test_bad_metrics_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
