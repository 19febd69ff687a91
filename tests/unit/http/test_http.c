/* The shared HTTP part: server and client round trips, limits, errors, concurrency. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "granary/core.h"
#include "granary/http.h"
#include "support/sched_probe.h"

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

/* Answers with the time slice of the handler thread that runs it (sched_getattr, ns). */
static void report_slice(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    (void)ctx, (void)req;
    gr_http_printf(resp, 200, "text/plain", "%llu", (unsigned long long)sched_probe_slice_ns());
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

/* A small connection memory (the replica's 8 KiB): headers of a few KiB and bodies of any
 * size (up to max_body) still arrive whole, a request whose headers do not fit is refused
 * with a 4xx, and the server goes on; under 4 KiB is refused at start. */
static void test_connection_memory(void **state)
{
    (void)state;
    gr_http_config cfg = {.listen = "127.0.0.1:0", .threads = 1, .max_body = 1u << 20,
                          .conn_memory = 3000, .handler = echo};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&cfg, &s), GR_EINVAL);
    cfg.conn_memory = 8192;
    assert_int_equal(gr_http_start(&cfg, &s), 0);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/p", gr_http_port(s));
    char hdr[16384], *body = malloc(100000);
    memset(body, 'b', 100000);
    int n = snprintf(hdr, sizeof hdr, "Authorization: ");
    memset(hdr + n, 'a', 3000);
    snprintf(hdr + n + 3000, sizeof hdr - (size_t)n - 3000, "\r\n");
    gr_http_result r;
    assert_int_equal(gr_http_fetch("POST", url, hdr, body, 100000, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "len=100000 body=bbbb"));
    assert_int_equal(strlen(r.body), strlen("POST /p q=- auth= len=100000 body=") + 3000 + 100000);
    gr_http_result_free(&r);
    memset(hdr + n, 'a', 12000);
    snprintf(hdr + n + 12000, sizeof hdr - (size_t)n - 12000, "\r\n");
    int rc = gr_http_fetch("POST", url, hdr, body, 10, 5000, &r);
    if (!rc) {
        assert_true(r.status >= 400 && r.status < 500);
        gr_http_result_free(&r);
    }
    assert_int_equal(gr_http_fetch("POST", url, NULL, body, 10, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    gr_http_result_free(&r);
    free(body);
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

/* Every handler waits (up to 3 s) until `want` handlers are inside at once: they can all be
 * only if their connections are on different server threads. */
typedef struct meeting {
    atomic_int inside;
    int want;
} meeting;

static void meet(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    (void)req;
    meeting *m = ctx;
    atomic_fetch_add(&m->inside, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool met = false;
    do {
        met = atomic_load(&m->inside) >= m->want;
        if (!met) usleep(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (!met && (t.tv_sec - t0.tv_sec) < 3);
    gr_http_printf(resp, 200, "text/plain", "%s", met ? "met" : "alone");
}

/* Connections a client opens all at once (a pool, wrk) are spread over the handler threads:
 * libmicrohttpd's own thread pool often gave every one of them to one thread. */
static void test_connections_opened_at_once_spread_over_threads(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    meeting m = {.want = THREADS};
    gr_http_config cfg = {.listen = "127.0.0.1:0", .threads = THREADS, .handler = meet, .ctx = &m};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&cfg, &s), 0);
    int fd[THREADS];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(gr_http_port(s)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < THREADS; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fd[i], (struct sockaddr *)&a, sizeof a), 0);
    }
    const char *req = "GET /meet HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(send(fd[i], req, strlen(req), 0), (ssize_t)strlen(req));
    for (int i = 0; i < THREADS; i++) {
        char buf[1024] = "";
        size_t n = 0;
        while (n < sizeof buf - 1 && !strstr(buf, "met") && !strstr(buf, "alone")) {
            ssize_t r = recv(fd[i], buf + n, sizeof buf - 1 - n, 0);
            if (r <= 0) break;
            n += (size_t)r;
            buf[n] = '\0';
        }
        buf[n] = '\0';
        if (!strstr(buf, "\r\n\r\nmet")) fail_msg("connection %d: %s", i, buf);
        close(fd[i]);
    }
    gr_http_stop(s);
}

/* slice_us: every handler thread runs with that time slice (where the kernel has custom
 * slices); out of range is refused at start. */
static void test_handler_threads_take_the_slice(void **state)
{
    (void)state;
    gr_http_config cfg = {.listen = "127.0.0.1:0", .threads = 2, .slice_us = 99, .handler = report_slice};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&cfg, &s), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "100 to 100000 us"));
    if (gr_thread_set_slice_us(300) != GR_OK) skip(); /* no custom slices on this kernel */
    gr_thread_set_slice_us(0);
    cfg.slice_us = 300;
    assert_int_equal(gr_http_start(&cfg, &s), 0);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/s", gr_http_port(s));
    for (int i = 0; i < 6; i++) { /* new connections, spread over both threads */
        gr_http_result r;
        assert_int_equal(gr_http_fetch("GET", url, NULL, NULL, 0, 5000, &r), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "300000");
        gr_http_result_free(&r);
    }
    gr_http_stop(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_and_post),
        cmocka_unit_test(test_handler_threads_take_the_slice),
        cmocka_unit_test(test_errors_are_json),
        cmocka_unit_test(test_body_over_limit_is_413_and_server_goes_on),
        cmocka_unit_test(test_bad_addresses),
        cmocka_unit_test(test_connection_memory),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_connections_opened_at_once_spread_over_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
