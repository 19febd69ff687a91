/* Unit tests for metrics: the exact exposition text (types, labels, escaping, histograms),
 * declaring families (same declaration shared, clashes and bad names refused), exact counts
 * under concurrent counting, mirrored and lazy series, collectors, the process's series, and
 * the /metrics + /healthz endpoint over real HTTP. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/http.h"
#include "granary/metrics.h"

__attribute__((noinline)) static char *format(gr_metrics *r)
{
    char *txt = NULL;
    size_t len = 0;
    assert_int_equal(gr_metrics_format(r, &txt, &len), GR_OK);
    assert_int_equal(strlen(txt), len);
    return txt;
}

static void test_exposition_exact(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    gr_metric_family *req, *mem, *lat;
    assert_int_equal(gr_metrics_family(r, GR_METRIC_COUNTER, "granary_requests_total",
                                       "Requests by \\op.\nSecond line.", "shard,op", NULL, 0, 0,
                                       &req),
                     GR_OK);
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "granary_memory_bytes", "Memory.", NULL,
                                       NULL, 0, 0, &mem),
                     GR_OK);
    const double b[] = {0.001, 0.01, 0.1};
    assert_int_equal(gr_metrics_family(r, GR_METRIC_HISTOGRAM, "granary_latency_seconds", "Lat.",
                                       "op", b, 3, 0, &lat),
                     GR_OK);
    gr_metric_inc(gr_metric_at(req, "0", "pull"), 3);
    gr_metric_inc(gr_metric_at(req, "0", "pull"), 2);
    gr_metric_inc(gr_metric_at(req, "1", "we\"ird\\\nop"), 1);
    gr_metric_set(gr_metric_at(mem), 1.5e9);
    gr_metric_add(gr_metric_at(mem), 0.25);
    gr_metric *l = gr_metric_at(lat, "pull");
    gr_metric_observe(l, 0.0005);
    gr_metric_observe(l, 0.001); /* on the bound: counted in it (le) */
    gr_metric_observe(l, 0.05);
    gr_metric_observe(l, 7);
    gr_metric_observe(l, NAN); /* ignored */
    char *txt = format(r);
    const char *want = "# HELP granary_requests_total Requests by \\\\op.\\nSecond line.\n"
                       "# TYPE granary_requests_total counter\n"
                       "granary_requests_total{shard=\"0\",op=\"pull\"} 5\n"
                       "granary_requests_total{shard=\"1\",op=\"we\\\"ird\\\\\\nop\"} 1\n"
                       "# HELP granary_memory_bytes Memory.\n"
                       "# TYPE granary_memory_bytes gauge\n"
                       "granary_memory_bytes 1500000000.25\n"
                       "# HELP granary_latency_seconds Lat.\n"
                       "# TYPE granary_latency_seconds histogram\n"
                       "granary_latency_seconds_bucket{op=\"pull\",le=\"0.001\"} 2\n"
                       "granary_latency_seconds_bucket{op=\"pull\",le=\"0.01\"} 2\n"
                       "granary_latency_seconds_bucket{op=\"pull\",le=\"0.1\"} 3\n"
                       "granary_latency_seconds_bucket{op=\"pull\",le=\"+Inf\"} 4\n"
                       "granary_latency_seconds_sum{op=\"pull\"} 7.0515\n"
                       "granary_latency_seconds_count{op=\"pull\"} 4\n";
    assert_string_equal(txt, want);
    assert_int_equal(gr_metric_bucket(l, 0), 2);
    assert_int_equal(gr_metric_bucket(l, 3), 4);
    assert_true(gr_metric_value(l) == 4);
    free(txt);
    gr_metrics_destroy(r);
}

static void test_declarations(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    gr_metric_family *a, *b;
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "g", "x", "shard", NULL, 0, 0, &a), 0);
    /* The same declaration (a second shard in one process) shares the family. */
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "g", "y", "shard", NULL, 0, 0, &b), 0);
    assert_ptr_equal(a, b);
    assert_ptr_equal(gr_metric_at(a, "3"), gr_metric_at(b, "3"));
    assert_ptr_not_equal(gr_metric_at(a, "3"), gr_metric_at(b, "4"));
    /* Another type or other labels under the same name: refused, naming it. */
    assert_int_equal(gr_metrics_family(r, GR_METRIC_COUNTER, "g", "x", "shard", NULL, 0, 0, &b),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "metric g is already declared"));
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "g", "x", "op", NULL, 0, 0, &b),
                     GR_EINVAL);
    /* Bad names, labels and buckets. */
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "9x", "", NULL, NULL, 0, 0, &b),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "bad metric name '9x'"));
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "a-b", "", NULL, NULL, 0, 0, &b),
                     GR_EINVAL);
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "ok", "", "a,__b", NULL, 0, 0, &b),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "bad label name '__b'"));
    assert_int_equal(gr_metrics_family(r, GR_METRIC_HISTOGRAM, "h", "", "le", NULL, 0, 0, &b),
                     GR_EINVAL);
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "ok", "", "a,,b", NULL, 0, 0, &b),
                     GR_EINVAL);
    const double down[] = {1, 0.5};
    assert_int_equal(gr_metrics_family(r, GR_METRIC_HISTOGRAM, "h", "", NULL, down, 2, 0, &b),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "strictly increasing"));
    const double one[] = {1};
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "g2", "", NULL, one, 1, 0, &b),
                     GR_EINVAL);
    /* NULL pointers never crash the hot path. */
    gr_metric_inc(NULL, 1);
    gr_metric_observe(NULL, 1);
    assert_null(gr_metric_at(a, NULL));
    /* A family with no series is left out of the exposition. */
    gr_metric_family *empty;
    assert_int_equal(
        gr_metrics_family(r, GR_METRIC_COUNTER, "never_total", "", "x", NULL, 0, 0, &empty), 0);
    char *txt = format(r);
    assert_null(strstr(txt, "never_total"));
    free(txt);
    gr_metrics_destroy(r);
    gr_metrics_destroy(NULL);
}

typedef struct counting {
    gr_metric *c, *h, *g;
} counting;

static void *count_thread(void *arg)
{
    counting *k = arg;
    for (int i = 0; i < 200000; i++) {
        gr_metric_inc(k->c, 1);
        gr_metric_observe(k->h, (i % 4) * 0.001);
        gr_metric_add(k->g, 0.5);
    }
    return NULL;
}

/* Four threads count into the same series: nothing is lost (every update is atomic). */
static void test_concurrent_counts_exact(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    gr_metric_family *c, *h, *g;
    assert_int_equal(gr_metrics_family(r, GR_METRIC_COUNTER, "c_total", "", NULL, NULL, 0, 0, &c),
                     0);
    const double b[] = {0.0005, 0.0015, 0.0025};
    assert_int_equal(gr_metrics_family(r, GR_METRIC_HISTOGRAM, "h", "", NULL, b, 3, 0, &h), 0);
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "g", "", NULL, NULL, 0, 0, &g), 0);
    counting k = {gr_metric_at(c), gr_metric_at(h), gr_metric_at(g)};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, count_thread, &k), 0);
    /* Scrapes while counting: each sees a consistent histogram (count = +Inf bucket). */
    for (int s = 0; s < 20; s++) {
        char *txt = format(r);
        assert_non_null(strstr(txt, "h_bucket{le=\"+Inf\"}"));
        free(txt);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_true(gr_metric_value(k.c) == 800000);
    assert_true(gr_metric_value(k.h) == 800000);
    assert_int_equal(gr_metric_bucket(k.h, 0), 200000); /* the zeros */
    assert_int_equal(gr_metric_bucket(k.h, 1), 400000);
    assert_int_equal(gr_metric_bucket(k.h, 2), 600000);
    assert_true(fabs(gr_metric_sum(k.h) - 4 * 50000 * 0.006) < 1e-6);
    assert_true(gr_metric_value(k.g) == 400000);
    gr_metrics_destroy(r);
}

typedef struct mirror {
    gr_metric_family *rows;
    int tables; /* how many tables "exist" now */
    int calls;
} mirror;

static void mirror_collect(void *ctx, gr_metrics *r)
{
    (void)r;
    mirror *m = ctx;
    m->calls++;
    if (m->tables >= 1) gr_metric_set(gr_metric_at(m->rows, "user"), 100);
    if (m->tables >= 2) gr_metric_set(gr_metric_at(m->rows, "item"), 7);
}

/* A mirrored series shows only while a collector sets it: a dropped table disappears. */
static void test_mirrored_and_lazy(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    mirror m = {0};
    assert_int_equal(gr_metrics_family(r, GR_METRIC_GAUGE, "rows", "Rows.", "table", NULL, 0,
                                       GR_METRIC_MIRRORED, &m.rows),
                     0);
    gr_metric_family *lazy;
    assert_int_equal(gr_metrics_family(r, GR_METRIC_HISTOGRAM, "lat_seconds", "L.", "op", NULL, 0,
                                       GR_METRIC_LAZY, &lazy),
                     0);
    gr_metric *pull = gr_metric_at(lazy, "pull");
    gr_metric_at(lazy, "push"); /* made ahead, never used */
    assert_int_equal(gr_metrics_add_collector(r, mirror_collect, &m), 0);
    m.tables = 2;
    char *txt = format(r);
    assert_non_null(strstr(txt, "rows{table=\"user\"} 100\nrows{table=\"item\"} 7\n"));
    assert_null(strstr(txt, "lat_seconds"));
    free(txt);
    m.tables = 1;
    gr_metric_observe(pull, 0.002);
    txt = format(r);
    assert_non_null(strstr(txt, "rows{table=\"user\"} 100\n"));
    assert_null(strstr(txt, "item"));
    assert_non_null(strstr(txt, "lat_seconds_count{op=\"pull\"} 1\n"));
    assert_null(strstr(txt, "op=\"push\""));
    free(txt);
    m.tables = 0;
    txt = format(r);
    assert_null(strstr(txt, "# TYPE rows")); /* no series left: no family lines either */
    free(txt);
    assert_int_equal(m.calls, 3);
    gr_metrics_remove_collector(r, mirror_collect, &m);
    m.tables = 2;
    txt = format(r);
    assert_null(strstr(txt, "rows{"));
    free(txt);
    assert_int_equal(m.calls, 3);
    gr_metrics_destroy(r);
}

static void test_process_series(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    assert_int_equal(gr_metrics_add_process(r), GR_OK);
    assert_int_equal(gr_metrics_add_process(r), GR_OK); /* once per registry */
    char *txt = format(r);
    const char *p = strstr(txt, "\nprocess_resident_memory_bytes ");
    assert_non_null(p);
    double rss = strtod(p + strlen("\nprocess_resident_memory_bytes "), NULL);
    assert_true(rss > 1e5 && rss < 1e11);
    p = strstr(txt, "\nprocess_open_fds ");
    assert_non_null(p);
    assert_true(strtod(p + strlen("\nprocess_open_fds "), NULL) >= 3);
    assert_non_null(strstr(txt, "# TYPE process_cpu_seconds_total counter\n"));
    p = strstr(txt, "\nprocess_threads ");
    assert_non_null(p);
    assert_true(strtod(p + strlen("\nprocess_threads "), NULL) >= 1);
    free(txt);
    gr_metrics_destroy(r);
}

static bool health_flag(void *ctx, char *why, size_t cap)
{
    bool ok = *(bool *)ctx;
    if (!ok) snprintf(why, cap, "draining");
    return ok;
}

static void fetch(const char *method, uint16_t port, const char *path, gr_http_result *res)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    assert_int_equal(gr_http_fetch(method, url, NULL, NULL, 0, 5000, res), GR_OK);
}

static void test_http_endpoint(void **state)
{
    (void)state;
    gr_metrics *r;
    assert_int_equal(gr_metrics_create(&r), GR_OK);
    gr_metric_family *f;
    assert_int_equal(
        gr_metrics_family(r, GR_METRIC_COUNTER, "granary_x_total", "X.", NULL, NULL, 0, 0, &f), 0);
    gr_metric_inc(gr_metric_at(f), 42);
    bool healthy = true;
    gr_metrics_http *h;
    assert_int_equal(gr_metrics_http_start(r, "127.0.0.1:0", health_flag, &healthy, &h), GR_OK);
    uint16_t port = gr_metrics_http_port(h);
    assert_true(port > 0);
    gr_http_result res;
    fetch("GET", port, "/metrics", &res);
    assert_int_equal(res.status, 200);
    assert_non_null(strstr(res.content_type, "text/plain; version=0.0.4"));
    assert_string_equal(res.body, "# HELP granary_x_total X.\n# TYPE granary_x_total counter\n"
                                  "granary_x_total 42\n");
    gr_http_result_free(&res);
    fetch("GET", port, "/healthz", &res);
    assert_int_equal(res.status, 200);
    assert_string_equal(res.body, "ok\n");
    gr_http_result_free(&res);
    healthy = false;
    fetch("GET", port, "/healthz", &res);
    assert_int_equal(res.status, 503);
    assert_string_equal(res.body, "unhealthy: draining\n");
    gr_http_result_free(&res);
    fetch("GET", port, "/nothing", &res);
    assert_int_equal(res.status, 404);
    gr_http_result_free(&res);
    fetch("POST", port, "/metrics", &res);
    assert_int_equal(res.status, 405);
    gr_http_result_free(&res);
    /* A second endpoint on the same port cannot bind: the error names the address. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    gr_metrics_http *h2 = NULL;
    assert_int_not_equal(gr_metrics_http_start(r, addr, NULL, NULL, &h2), GR_OK);
    assert_non_null(strstr(gr_errmsg(), addr));
    assert_int_equal(gr_metrics_http_start(r, "nonsense", NULL, NULL, &h2), GR_EINVAL);
    gr_metrics_http_stop(h);
    gr_metrics_http_stop(NULL);
    gr_metrics_destroy(r);
}

typedef struct own_server {
    gr_metrics *r;
} own_server;

static void own_handler(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    own_server *o = ctx;
    if (!gr_metrics_http_answer(o->r, NULL, NULL, req, resp))
        gr_http_printf(resp, 200, "text/plain", "app %s\n", req->path);
}

/* A part with its own HTTP server answers /metrics and /healthz through the registry and
 * everything else itself. */
static void test_answer_in_own_server(void **state)
{
    (void)state;
    own_server o;
    assert_int_equal(gr_metrics_create(&o.r), GR_OK);
    gr_metric_family *f;
    assert_int_equal(
        gr_metrics_family(o.r, GR_METRIC_GAUGE, "granary_serve_x", "X.", NULL, NULL, 0, 0, &f), 0);
    gr_metric_set(gr_metric_at(f), 2.5);
    gr_http_config cfg = {.listen = "127.0.0.1:0", .handler = own_handler, .ctx = &o};
    gr_http_server *srv;
    assert_int_equal(gr_http_start(&cfg, &srv), GR_OK);
    uint16_t port = gr_http_port(srv);
    gr_http_result res;
    fetch("GET", port, "/metrics", &res);
    assert_int_equal(res.status, 200);
    assert_non_null(strstr(res.body, "\ngranary_serve_x 2.5\n"));
    gr_http_result_free(&res);
    fetch("GET", port, "/healthz", &res);
    assert_int_equal(res.status, 200);
    assert_string_equal(res.body, "ok\n");
    gr_http_result_free(&res);
    fetch("DELETE", port, "/metrics", &res);
    assert_int_equal(res.status, 405);
    gr_http_result_free(&res);
    fetch("GET", port, "/v1/model", &res);
    assert_int_equal(res.status, 200);
    assert_string_equal(res.body, "app /v1/model\n");
    gr_http_result_free(&res);
    gr_http_stop(srv);
    gr_metrics_destroy(o.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exposition_exact),        cmocka_unit_test(test_declarations),
        cmocka_unit_test(test_concurrent_counts_exact), cmocka_unit_test(test_mirrored_and_lazy),
        cmocka_unit_test(test_process_series),          cmocka_unit_test(test_http_endpoint),
        cmocka_unit_test(test_answer_in_own_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
