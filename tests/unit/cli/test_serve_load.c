/* Tests of bench serve's paced client (bench/serve_load.c): every request is answered and
 * counted against a live HTTP server, refusals are errors, and the send lateness is split
 * correctly: requests that fall due while every connection waits on a slow server are charged
 * to waiting for a free connection (the server's backlog), not to the client. Timing targets
 * live in the bench; these assert only what the accounting must give on any machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/serve_load.h"
#include "granary/http.h"

typedef struct srv_mode {
    int status;       /* what every request gets */
    unsigned hold_ms; /* how long each is held before the answer */
    atomic_uint seen;
} srv_mode;

static void handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    srv_mode *m = ctx;
    atomic_fetch_add(&m->seen, 1);
    if (m->hold_ms) usleep(m->hold_ms * 1000u);
    if (strcmp(req->path, "/v1/predict")) gr_http_error(resp, 404, "no such path");
    else if (m->status != 200) gr_http_error(resp, m->status, "refused");
    else gr_http_printf(resp, 200, "application/json", "{\"predictions\":[0.5]}");
}

static bodies one_body(void)
{
    static char text[] = "{\"lines\":[\"1\"]}";
    static char *b[1] = {text};
    static size_t len[1] = {sizeof text - 1};
    return (bodies){b, len, 1};
}

static gr_http_server *start(srv_mode *m, unsigned threads)
{
    gr_http_config hc = {.listen = "127.0.0.1:0", .threads = threads, .handler = handle, .ctx = m};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&hc, &s), 0);
    return s;
}

static void test_every_request_answered(void **state)
{
    (void)state;
    srv_mode m = {.status = 200};
    gr_http_server *s = start(&m, 2);
    bodies b = one_body();
    load out;
    sl_run_paced(gr_http_port(s), &b, 400, 0.5, true, &out); /* 200 requests */
    sl_load_free(&out);
    gr_http_stop(s);
    assert_int_equal(out.requests, 200);
    assert_int_equal(out.errors, 0);
    assert_int_equal(atomic_load(&m.seen), 200);
    assert_true(out.p50_ms >= 0 && out.p99_ms >= out.p50_ms);
    /* The split: latency from the due time is send lateness plus reply time, and the send
     * lateness is the connection wait plus the client's own. */
    assert_true(out.late_p99_ms >= 0 && out.service_p99_ms >= 0);
    assert_true(out.conn_wait_p99_ms >= 0 && out.own_late_p99_ms >= 0);
    assert_true(out.own_late_p99_ms <= out.late_p99_ms + 1e-9);
    assert_false(isnan(out.runq_ms));
    /* Running as root (CI and the bench machine), the client gets SCHED_FIFO. */
    if (geteuid() == 0) assert_true(out.fifo);
}

static void test_refusals_are_errors(void **state)
{
    (void)state;
    srv_mode m = {.status = 503};
    gr_http_server *s = start(&m, 2);
    bodies b = one_body();
    load out;
    sl_run_paced(gr_http_port(s), &b, 200, 0.25, false, &out); /* 50 requests */
    sl_load_free(&out);
    gr_http_stop(s);
    assert_int_equal(out.requests, 0);
    assert_int_equal(out.errors, 50);
    assert_false(out.fifo);
}

/* A server that holds every request 50 ms: 40 requests fall due within 50 ms, at most 32 can
 * be in flight (the client's connections), and none returns before 50 ms after the first went
 * out, so the 33rd (due at 40 ms) waits at least 10 ms for a free connection. That wait must be
 * charged to the connections (the server's backlog), not to the client. (A slower machine, or
 * the server's threads taking the connections unevenly, only makes the waits longer.) */
static void test_backlog_is_charged_to_connections(void **state)
{
    (void)state;
    srv_mode m = {.status = 200, .hold_ms = 50};
    gr_http_server *s = start(&m, 32);
    bodies b = one_body();
    load out;
    sl_run_paced(gr_http_port(s), &b, 800, 0.05, true, &out);
    sl_load_free(&out);
    gr_http_stop(s);
    assert_int_equal(out.requests, 40);
    assert_int_equal(out.errors, 0);
    /* With 40 samples the p99 is the largest. */
    assert_true(out.conn_wait_p99_ms >= 5);
    assert_true(out.late_p99_ms >= out.conn_wait_p99_ms);
    assert_true(out.service_p99_ms >= 50);
}

/* The pacer's sleep: a due request with an idle connection goes out at once (before: it slept
 * up to 100 ms for a reply that, with nothing in flight, never came - the client's own tail). */
static void test_paced_wait(void **state)
{
    (void)state;
    assert_true(sl_paced_wait(true, 10.0, 10.5, 0, 32, 0.1) == 0);   /* due, all idle */
    assert_true(sl_paced_wait(true, 10.0, 10.5, 31, 32, 0.1) == 0);  /* due, one idle */
    assert_true(sl_paced_wait(true, 10.0, 10.5, 32, 32, 0.1) == 0.1); /* due, all busy */
    assert_true(sl_paced_wait(true, 10.25, 10.0, 32, 32, 0.1) == 0.25); /* not due yet */
    assert_true(sl_paced_wait(false, 10.0, 10.5, 0, 32, 0.1) == 0.1);  /* nothing left */
}

/* Rounds of the paced client: medians field by field (the p99 is the median round's, so one
 * round the hypervisor stalled does not decide it), every latency pooled, sums of counts. */
static void test_rounds_median_and_pool(void **state)
{
    (void)state;
    double a[] = {1, 2}, b[] = {3}, c[] = {4, 5, 6};
    load r[3] = {0};
    double p99[] = {0.3, 24.4, 1.4}, steal[] = {0, 1800, 20}, q[] = {100, 90, 110};
    double *lats[] = {a, b, c};
    size_t ns[] = {2, 1, 3};
    for (int i = 0; i < 3; i++) {
        r[i].p99_ms = p99[i], r[i].steal_ms = steal[i], r[i].qps = q[i];
        r[i].requests = ns[i], r[i].errors = (uint64_t)i;
        r[i].lat = lats[i], r[i].nlat = ns[i];
    }
    load m;
    sl_load_median(r, 3, &m);
    assert_true(m.p99_ms == 1.4 && m.steal_ms == 20 && m.qps == 100);
    assert_int_equal(m.requests, 6);
    assert_int_equal(m.errors, 3);
    assert_int_equal(m.nlat, 6);
    for (size_t i = 0; i < 6; i++) assert_true(m.lat[i] == (double)(i + 1));
    assert_true(sl_pct(m.lat, m.nlat, 1.0) == 6);
    sl_load_free(&m);
    assert_null(m.lat);
}

/* The split for the pinned rounds: the client gets the last allowed CPU, the servers the rest;
 * fewer than two CPUs: no split. */
static void test_split_cpus(void **state)
{
    (void)state;
    cpu_set_t all, servers;
    int client = -7;
    CPU_ZERO(&all);
    CPU_SET(3, &all);
    assert_int_equal(sl_split_cpus(&all, &servers, &client), -1);
    assert_int_equal(client, -7);
    CPU_SET(1, &all);
    CPU_SET(6, &all);
    assert_int_equal(sl_split_cpus(&all, &servers, &client), 0);
    assert_int_equal(client, 6);
    assert_int_equal(CPU_COUNT(&servers), 2);
    assert_true(CPU_ISSET(1, &servers) && CPU_ISSET(3, &servers) && !CPU_ISSET(6, &servers));
}

static atomic_int parked_go;

static void *parked(void *arg)
{
    (void)arg;
    while (!atomic_load(&parked_go)) usleep(1000);
    return NULL;
}

/* Every thread of the process is moved (one started before the call included), and moved
 * back. */
static void test_pin_threads(void **state)
{
    (void)state;
    cpu_set_t all, one, got;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &all)) first = c;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    pthread_t t;
    atomic_store(&parked_go, 0);
    assert_int_equal(pthread_create(&t, NULL, parked, NULL), 0);
    assert_true(sl_pin_threads(getpid(), &one) >= 2);
    assert_int_equal(pthread_getaffinity_np(t, sizeof got, &got), 0);
    assert_true(CPU_EQUAL(&got, &one));
    assert_int_equal(sched_getaffinity(0, sizeof got, &got), 0);
    assert_true(CPU_EQUAL(&got, &one));
    assert_true(sl_pin_threads(getpid(), &all) >= 2);
    assert_int_equal(pthread_getaffinity_np(t, sizeof got, &got), 0);
    assert_true(CPU_EQUAL(&got, &all));
    atomic_store(&parked_go, 1);
    pthread_join(t, NULL);
    assert_int_equal(sl_pin_threads(999999999, &all), -1); /* no such process */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_request_answered),
        cmocka_unit_test(test_refusals_are_errors),
        cmocka_unit_test(test_backlog_is_charged_to_connections),
        cmocka_unit_test(test_paced_wait),
        cmocka_unit_test(test_rounds_median_and_pool),
        cmocka_unit_test(test_split_cpus),
        cmocka_unit_test(test_pin_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
