/* The shared HTTP part: server and client round trips, limits, errors, concurrency. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "granary/http.h"

/* Echoes what it was given, so the test can check each part of the request arrived. */
static void echo(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    (void)ctx;
    if (!strcmp(req->path, "/missing")) {
        gr_http_error(resp, 404, "no \"page\" at %s", req->path);
        return;
    }
    const char *q = gr_http_query(req, "q");
    const char *auth = gr_http_header(req, "authorization");
    gr_http_printf(resp, 200, "text/plain", "%s %s q=%s auth=%s len=%zu body=%s", req->method,
                   req->path, q ? q : "-", auth ? auth : "-", req->body_len, req->body);
    snprintf(resp->extra_header[0], sizeof resp->extra_header[0], "X-Granary: yes");
}

static gr_http_server *start(size_t max_body, char *base, size_t base_len)
{
    gr_http_config cfg = {.listen = "127.0.0.1:0", .threads = 2, .max_body = max_body,
                          .handler = echo};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&cfg, &s), 0);
    assert_true(gr_http_port(s) > 0);
    snprintf(base, base_len, "http://127.0.0.1:%u", gr_http_port(s));
    return s;
}

static void test_get_and_post(void **state)
{
    (void)state;
    char base[64], url[128];
    gr_http_server *s = start(0, base, sizeof base);
    gr_http_result r;
    snprintf(url, sizeof url, "%s/v1/x?q=7&z=1", base);
    assert_int_equal(gr_http_fetch("GET", url, "Authorization: Bearer t0k\r\n", NULL, 0, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "text/plain");
    assert_string_equal(r.body, "GET /v1/x q=7 auth=Bearer t0k len=0 body=");
    gr_http_result_free(&r);
    snprintf(url, sizeof url, "%s/p", base);
    assert_int_equal(gr_http_fetch("POST", url, NULL, "{\"a\":1}", 7, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "POST /p q=- auth=- len=7 body={\"a\":1}");
    gr_http_result_free(&r);
    gr_http_stop(s);
}

static void test_errors_are_json(void **state)
{
    (void)state;
    char base[64], url[128];
    gr_http_server *s = start(0, base, sizeof base);
    gr_http_result r;
    snprintf(url, sizeof url, "%s/missing", base);
    assert_int_equal(gr_http_fetch("GET", url, NULL, NULL, 0, 5000, &r), 0);
    assert_int_equal(r.status, 404);
    assert_string_equal(r.content_type, "application/json");
    assert_string_equal(r.body, "{\"error\":\"no \\\"page\\\" at /missing\"}\n");
    gr_http_result_free(&r);
    gr_http_stop(s);
}

static void test_body_over_limit_is_413_and_server_goes_on(void **state)
{
    (void)state;
    char base[64], url[128];
    gr_http_server *s = start(100, base, sizeof base);
    snprintf(url, sizeof url, "%s/p", base);
    char big[1000];
    memset(big, 'x', sizeof big);
    gr_http_result r;
    assert_int_equal(gr_http_fetch("POST", url, NULL, big, sizeof big, 5000, &r), 0);
    assert_int_equal(r.status, 413);
    assert_non_null(strstr(r.body, "over the limit of 100"));
    gr_http_result_free(&r);
    assert_int_equal(gr_http_fetch("POST", url, NULL, big, 100, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "len=100"));
    gr_http_result_free(&r);
    gr_http_stop(s);
}

static void test_bad_addresses(void **state)
{
    (void)state;
    gr_http_server *s = NULL;
    gr_http_config cfg = {.listen = "127.0.0.1", .handler = echo};
    assert_int_equal(gr_http_start(&cfg, &s), GR_EINVAL);
    cfg.listen = "127.0.0.1:99999";
    assert_int_equal(gr_http_start(&cfg, &s), GR_EINVAL);
    char base[64];
    gr_http_server *a = start(0, base, sizeof base);
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%u", gr_http_port(a));
    cfg.listen = taken;
    assert_int_equal(gr_http_start(&cfg, &s), GR_EIO);
    assert_non_null(strstr(gr_errmsg(), taken));
    gr_http_result r;
    assert_int_equal(gr_http_fetch("GET", "ftp://x/", NULL, NULL, 0, 1000, &r), GR_EINVAL);
    gr_http_stop(a);
    /* Nothing listens there any more. */
    char url[128];
    snprintf(url, sizeof url, "http://%s/", taken);
    assert_int_equal(gr_http_fetch("GET", url, NULL, NULL, 0, 2000, &r), GR_ECONN);
}

typedef struct { const char *base; int ok; } worker_arg;

static void *hammer(void *p)
{
    worker_arg *w = p;
    char url[128];
    for (int i = 0; i < 50; i++) {
        snprintf(url, sizeof url, "%s/n?q=%d", w->base, i);
        gr_http_result r;
        char want[64];
        snprintf(want, sizeof want, "GET /n q=%d auth=- len=0 body=", i);
        if (gr_http_fetch("GET", url, NULL, NULL, 0, 10000, &r) == 0 && r.status == 200 &&
            !strcmp(r.body, want))
            w->ok++;
        gr_http_result_free(&r);
    }
    return NULL;
}

static void test_concurrent_clients(void **state)
{
    (void)state;
    char base[64];
    gr_http_server *s = start(0, base, sizeof base);
    pthread_t t[4];
    worker_arg w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_arg){.base = base};
        pthread_create(&t[i], NULL, hammer, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].ok, 50);
    }
    gr_http_stop(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_and_post),
        cmocka_unit_test(test_errors_are_json),
        cmocka_unit_test(test_body_over_limit_is_413_and_server_goes_on),
        cmocka_unit_test(test_bad_addresses),
        cmocka_unit_test(test_concurrent_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
