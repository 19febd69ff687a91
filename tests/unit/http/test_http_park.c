/* Coalescing in the HTTP server (gr_http_config.park / run / reply): requests a thread read
 * while it was busy are parked together and run in one call; each gets its own reply; park may
 * also answer or decline; a job whose connection closed while it waited is handed back to be
 * freed (every parked job ends in exactly one reply call); a half-given set of callbacks is
 * refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "granary/http.h"

typedef struct job {
    int id;
    int result;
} job;

typedef struct park_srv {
    atomic_int parked, runs, replies, freed, handled, biggest;
    atomic_int block_first; /* the first run waits on `release` */
    sem_t entered, release;
    sem_t parking, closed;  /* park of /job/close: tells it is parking, waits for the close */
} park_srv;

static void handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    park_srv *ps = ctx;
    atomic_fetch_add(&ps->handled, 1);
    gr_http_printf(resp, 200, "text/plain", "handler %s", req->path);
}

/* /job/N is parked; /answer is answered by park itself; anything else is declined. */
static int park(void *ctx, const gr_http_request *req, gr_http_response *resp, void **out)
{
    park_srv *ps = ctx;
    if (!strcmp(req->path, "/answer")) {
        gr_http_error(resp, 418, "answered while parking");
        return GR_HTTP_ANSWERED;
    }
    if (strncmp(req->path, "/job/", 5)) return GR_HTTP_DECLINED;
    if (!strcmp(req->path, "/job/close")) {
        sem_post(&ps->parking);
        sem_wait(&ps->closed);
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return GR_HTTP_DECLINED;
    j->id = atoi(req->path + 5);
    *out = j;
    atomic_fetch_add(&ps->parked, 1);
    return GR_HTTP_PARKED;
}

static void run(void *ctx, void **jobs, size_t n)
{
    park_srv *ps = ctx;
    if (atomic_exchange(&ps->block_first, 0)) {
        sem_post(&ps->entered);
        sem_wait(&ps->release);
    }
    atomic_fetch_add(&ps->runs, 1);
    int big = atomic_load(&ps->biggest);
    while ((int)n > big && !atomic_compare_exchange_weak(&ps->biggest, &big, (int)n)) {}
    for (size_t i = 0; i < n; i++) ((job *)jobs[i])->result = ((job *)jobs[i])->id * 3 + (int)n * 1000;
}

static void reply(void *ctx, void *jp, gr_http_response *resp)
{
    park_srv *ps = ctx;
    job *j = jp;
    if (resp) {
        atomic_fetch_add(&ps->replies, 1);
        gr_http_printf(resp, 200, "text/plain", "%d %d", j->id, j->result);
    } else {
        atomic_fetch_add(&ps->freed, 1);
    }
    free(j);
}

static gr_http_server *start(park_srv *ps, unsigned threads)
{
    gr_http_config c = {.listen = "127.0.0.1:0", .threads = threads, .handler = handle,
                        .ctx = ps, .park = park, .run = run, .reply = reply};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&c, &s), 0);
    return s;
}

static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_get(int fd, const char *path)
{
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
}

/* Reads one response whole (it is small: headers and body arrive together) and returns the
 * status, with the body copied out. */
static int read_reply(int fd, char *body, size_t cap)
{
    char buf[4096];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        assert_true(r > 0);
        got += (size_t)r;
        buf[got] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = strcasestr(buf, "Content-Length:");
        if (end && cl && got >= (size_t)(end + 4 - buf) + (size_t)atoi(cl + 15)) {
            snprintf(body, cap, "%.*s", atoi(cl + 15), end + 4);
            break;
        }
    }
    int status = 0;
    assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &status), 1);
    return status;
}

static void init(park_srv *ps)
{
    memset(ps, 0, sizeof *ps);
    sem_init(&ps->entered, 0, 0);
    sem_init(&ps->release, 0, 0);
    sem_init(&ps->parking, 0, 0);
    sem_init(&ps->closed, 0, 0);
}

/* While the thread's first run is held, eight requests arrive on eight connections: they are
 * parked in one pass and run together, and each connection gets its own request's answer. */
static void test_requests_read_together_run_together(void **state)
{
    (void)state;
    park_srv ps;
    init(&ps);
    atomic_store(&ps.block_first, 1);
    gr_http_server *s = start(&ps, 1);
    uint16_t port = gr_http_port(s);
    int first = dial(port);
    send_get(first, "/job/100");
    sem_wait(&ps.entered); /* the thread is inside the first run */
    enum { N = 8 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = dial(port);
        char path[32];
        snprintf(path, sizeof path, "/job/%d", i);
        send_get(fds[i], path);
    }
    usleep(50000); /* the requests are in the server's sockets before the thread goes on */
    sem_post(&ps.release);
    char body[128];
    assert_int_equal(read_reply(first, body, sizeof body), 200);
    assert_string_equal(body, "100 1300");
    for (int i = 0; i < N; i++) {
        assert_int_equal(read_reply(fds[i], body, sizeof body), 200);
        char want[64];
        snprintf(want, sizeof want, "%d %d", i, i * 3 + N * 1000); /* run with all eight */
        assert_string_equal(body, want);
        close(fds[i]);
    }
    close(first);
    assert_int_equal(atomic_load(&ps.runs), 2);
    assert_int_equal(atomic_load(&ps.biggest), N);
    /* A kept-alive connection parks again: its next request is a new job. */
    int again = dial(port);
    for (int k = 0; k < 3; k++) {
        send_get(again, "/job/7");
        assert_int_equal(read_reply(again, body, sizeof body), 200);
        assert_string_equal(body, "7 1021");
    }
    close(again);
    gr_http_stop(s);
    assert_int_equal(atomic_load(&ps.parked), N + 4);
    assert_int_equal(atomic_load(&ps.replies), N + 4);
    assert_int_equal(atomic_load(&ps.freed), 0);
    assert_int_equal(atomic_load(&ps.handled), 0);
}

/* park answers /answer itself and declines other paths to the handler; the server goes on. */
static void test_park_answers_or_declines(void **state)
{
    (void)state;
    park_srv ps;
    init(&ps);
    gr_http_server *s = start(&ps, 2);
    int fd = dial(gr_http_port(s));
    char body[128];
    send_get(fd, "/answer");
    assert_int_equal(read_reply(fd, body, sizeof body), 418);
    assert_non_null(strstr(body, "answered while parking"));
    send_get(fd, "/other");
    assert_int_equal(read_reply(fd, body, sizeof body), 200);
    assert_string_equal(body, "handler /other");
    send_get(fd, "/job/5");
    assert_int_equal(read_reply(fd, body, sizeof body), 200);
    assert_string_equal(body, "5 1015");
    close(fd);
    gr_http_stop(s);
    assert_int_equal(atomic_load(&ps.handled), 1);
    assert_int_equal(atomic_load(&ps.parked), 1);
    assert_int_equal(atomic_load(&ps.replies), 1);
}

/* Connections that close with their requests parked (or about to be): every job still ends
 * in exactly one reply call, freed or answered, and the server answers the next client. */
static void test_closed_while_parked_is_freed(void **state)
{
    (void)state;
    park_srv ps;
    init(&ps);
    atomic_store(&ps.block_first, 1);
    gr_http_server *s = start(&ps, 1);
    uint16_t port = gr_http_port(s);
    int first = dial(port);
    send_get(first, "/job/1");
    sem_wait(&ps.entered);
    for (int i = 0; i < 6; i++) {
        int fd = dial(port);
        send_get(fd, "/job/2");
        close(fd); /* gone before the thread reads it */
    }
    usleep(50000);
    sem_post(&ps.release);
    char body[128];
    assert_int_equal(read_reply(first, body, sizeof body), 200);
    close(first);
    /* A connection reset while its request is being parked: the server finds it gone at the
     * next pass, before the reply, and hands the job back to be freed. */
    int gone = dial(port);
    send_get(gone, "/job/close");
    sem_wait(&ps.parking);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(gone, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(gone);
    usleep(20000);
    sem_post(&ps.closed);
    int next = dial(port);
    send_get(next, "/job/9");
    assert_int_equal(read_reply(next, body, sizeof body), 200);
    close(next);
    gr_http_stop(s);
    int parked = atomic_load(&ps.parked);
    fprintf(stderr, "closed while parked: %d parked, %d answered, %d freed\n", parked,
            atomic_load(&ps.replies), atomic_load(&ps.freed));
    assert_true(parked >= 2);
    assert_int_equal(atomic_load(&ps.replies) + atomic_load(&ps.freed), parked);
}

static void *stopper(void *s)
{
    gr_http_stop(s);
    return NULL;
}

/* The server stopped while a request is parked: the job is handed back (answered or freed),
 * never lost. */
static void test_stop_while_parked(void **state)
{
    (void)state;
    park_srv ps;
    init(&ps);
    gr_http_server *s = start(&ps, 1);
    int fd = dial(gr_http_port(s));
    send_get(fd, "/job/close");
    sem_wait(&ps.parking);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stopper, s), 0);
    usleep(50000);
    sem_post(&ps.closed);
    pthread_join(t, NULL);
    close(fd);
    fprintf(stderr, "stopped while parked: %d parked, %d answered, %d freed\n",
            atomic_load(&ps.parked), atomic_load(&ps.replies), atomic_load(&ps.freed));
    assert_int_equal(atomic_load(&ps.parked), 1);
    assert_int_equal(atomic_load(&ps.replies) + atomic_load(&ps.freed), 1);
}

static void test_half_the_callbacks_is_refused(void **state)
{
    (void)state;
    park_srv ps;
    init(&ps);
    gr_http_config c = {.listen = "127.0.0.1:0", .handler = handle, .ctx = &ps, .park = park};
    gr_http_server *s = NULL;
    assert_int_equal(gr_http_start(&c, &s), GR_EINVAL);
    assert_null(s);
    assert_non_null(strstr(gr_errmsg(), "park, run and reply"));
    c.park = NULL;
    c.reply = reply;
    assert_int_equal(gr_http_start(&c, &s), GR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_read_together_run_together),
        cmocka_unit_test(test_park_answers_or_declines),
        cmocka_unit_test(test_closed_while_parked_is_freed),
        cmocka_unit_test(test_stop_while_parked),
        cmocka_unit_test(test_half_the_callbacks_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
