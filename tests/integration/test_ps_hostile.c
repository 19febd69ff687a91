/* Integration: peers that are broken or hostile must not take service away from the others.
 * Each test plays one such peer over raw sockets against a real `granary server` and checks
 * that a well-behaved client is still served, and that the peer is cut off by the deadline or
 * limit that covers it (docs/server.md, "Connections"): a client that stops reading its
 * replies, partial frames that stall, an authentication that never finishes, idle
 * connections, a hang-up while an acquire is parked, header bits that must be zero, and the
 * cap on request bytes in flight over all connections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"
#include "tests/support/ps_harness.h"
#include "tests/support/ps_raw.h"

static const char *spec64 = "{\"name\":\"emb\",\"id\":1,\"dim\":64,\"seed\":3,"
                            "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
                            "\"optimizer\":{\"kind\":\"sgd\",\"lr\":0.1}}";

static gr_client *client_for(const ps_test_server *s, uint32_t request_timeout_ms)
{
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s->addr;
    cfg.connect_timeout_ms = 5000;
    cfg.request_timeout_ms = request_timeout_ms;
    gr_client *c = NULL;
    int rc = gr_client_create(&cfg, &c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return c;
}

static double now_s(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

/* One number of the shard's STATS JSON (top level, or inside the object `obj`). */
static double stat_of(const ps_test_server *s, const char *obj, const char *key)
{
    char out[65536];
    const char *args[] = {"stats", "--server", s->addr, "--json", NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 0);
    const char *brace = strchr(out, '{');
    assert_non_null(brace);
    cJSON *root = cJSON_Parse(brace);
    assert_non_null(root);
    cJSON *o = obj ? cJSON_GetObjectItemCaseSensitive(root, obj) : root;
    cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (!cJSON_IsNumber(v)) fprintf(stderr, "stats: no number %s.%s in %s\n", obj ? obj : "", key, out);
    assert_true(cJSON_IsNumber(v));
    double d = v->valuedouble;
    cJSON_Delete(root);
    return d;
}

static long threads_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long n = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) n = strtol(line + 8, NULL, 10);
    fclose(f);
    return n;
}

static void pull_one(gr_client *c)
{
    uint64_t key = 42;
    float row[64];
    int rc = gr_client_pull(c, 1, 64, &key, 1, row);
    if (rc) fprintf(stderr, "1-key pull: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
}

/* A client pipelines large pulls with a tiny receive buffer and never reads. The only worker
 * thread must not block on its socket: another client's 1-key pull completes meanwhile, and
 * the reader that does not drain is dropped after --send-timeout with its queued replies
 * freed. (Before: the worker blocked in send() for 30 s per reply, holding everyone up.) */
static void test_slow_reader_is_dropped_not_waited_for(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--threads", "1", "--send-timeout", "1500", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *good = client_for(&s, 10000);
    assert_int_equal(gr_client_create_table(good, spec64), 0);

    int fd = ps_raw_connect(s.port, 4096);
    assert_true(fd >= 0);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    /* 8 pulls of 50 000 rows of 256 bytes: ~100 MB of replies, far past every buffer. */
    enum { NPULL = 8, NKEYS = 50000 };
    for (int i = 0; i < NPULL; i++) {
        assert_int_equal(ps_raw_keys_frame(&b, GR_OP_PULL, 100 + (uint64_t)i, 1, 64, NKEYS, 1), 0);
        assert_int_equal(ps_raw_send_buf(fd, &b), 0);
    }
    gr_proto_buf_fini(&b);
    double t0 = now_s();
    for (int i = 0; i < 5; i++) pull_one(good); /* the single worker is not stuck */
    assert_true(now_s() - t0 < 8.0);

    /* The stalled peer is dropped: reading now finds the end well before all replies. */
    sleep(3);
    size_t got = 0;
    assert_true(ps_raw_at_eof(fd, &got));
    assert_true(got < (size_t)NPULL * NKEYS * 256);
    close(fd);
    assert_true(stat_of(&s, NULL, "connections_dropped_slow") >= 1);
    pull_one(good);
    gr_client_destroy(good);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* Many connections that start a frame and stall cost no thread each, are cut off by
 * --frame-timeout with an error naming it, and do not lock real clients out. */
static void test_stalled_partial_frames(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--threads", "1", "--max-connections", "40", "--frame-timeout", "800",
                           NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *good = client_for(&s, 10000);
    assert_int_equal(gr_client_create_table(good, spec64), 0);
    gr_client_destroy(good); /* frees its slot: the stalled peers take all of them */
    /* The server sees that hang-up on its loop a moment later; only the stats tool's own
     * connection may be left when the stalled peers arrive. */
    for (int i = 0; i < 100 && stat_of(&s, NULL, "connections") > 1; i++) usleep(20 * 1000);
    assert_int_equal((int)stat_of(&s, NULL, "connections"), 1);
    usleep(100 * 1000); /* and the stats tool's connection is gone too */
    long threads_before = threads_of(s.pid);

    enum { NSTALL = 40 };
    int fds[NSTALL];
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    gr_proto_header h = {GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_PULL, 0, 0, 1000, 7};
    gr_proto_header_encode(hb, &h);
    for (int i = 0; i < NSTALL; i++) {
        fds[i] = ps_raw_connect(s.port, 0);
        assert_true(fds[i] >= 0);
        /* Half the peers stop inside the header, the others inside the body. */
        assert_int_equal(ps_raw_send_all(fds[i], hb, i % 2 ? 10 : sizeof hb), 0);
    }
    usleep(200 * 1000);
    assert_int_equal(threads_of(s.pid), threads_before);

    /* After the deadline each stalled peer gets the error, then the end. */
    for (int i = 0; i < NSTALL; i++) {
        gr_proto_header r;
        char msg[256];
        int st = ps_raw_read_reply(fds[i], &r, msg, sizeof msg, NULL);
        assert_int_equal(st, GR_ETIMEDOUT);
        assert_non_null(strstr(msg, "not completed within 800 ms"));
        assert_true(ps_raw_at_eof(fds[i], NULL));
        close(fds[i]);
    }
    good = client_for(&s, 10000);
    pull_one(good);
    gr_client_destroy(good);
    assert_true(stat_of(&s, NULL, "connections_reaped") >= NSTALL);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* With --auth-file, a peer that never authenticates is closed --auth-timeout after it
 * connected, however often it sends a byte (the deadline is not reset by traffic); one that
 * sends an unknown opcode before authenticating is answered and closed at once. */
static void test_auth_deadline_from_accept(void **state)
{
    (void)state;
    char dir[256], secret_path[300];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(secret_path, sizeof secret_path, "%s/secret", dir);
    FILE *f = fopen(secret_path, "w");
    assert_non_null(f);
    fputs("hostile-test-secret\n", f);
    fclose(f);
    chmod(secret_path, 0600);
    ps_test_server s;
    const char *extra[] = {"--auth-file", secret_path, "--auth-timeout", "700",
                           "--frame-timeout", "60000", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);

    int fd = ps_raw_connect(s.port, 0);
    assert_true(fd >= 0);
    assert_int_equal(ps_raw_send_frame(fd, GR_OP_HELLO, 0, 1, NULL, 0), 0);
    gr_proto_header r;
    assert_int_equal(ps_raw_read_reply(fd, &r, NULL, 0, NULL), 0);
    /* Trickle a header, one byte every 100 ms. */
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    gr_proto_header h = {GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_AUTH, 0, 0, 64, 2};
    gr_proto_header_encode(hb, &h);
    double t0 = now_s();
    bool closed = false;
    for (size_t i = 0; i < sizeof hb && !closed; i++) {
        if (send(fd, hb + i, 1, MSG_NOSIGNAL) != 1) closed = true;
        usleep(100 * 1000);
        if (now_s() - t0 > 1.5) break;
    }
    char msg[256];
    int st = ps_raw_read_reply(fd, &r, msg, sizeof msg, NULL);
    assert_int_equal(st, GR_EAUTH);
    assert_non_null(strstr(msg, "authentication not completed within 700 ms"));
    assert_true(ps_raw_at_eof(fd, NULL));
    assert_true(now_s() - t0 < 6.0); /* a reset-per-byte deadline would close at 11.5 s */
    close(fd);

    /* Unknown opcode before authentication: answered, then closed. */
    fd = ps_raw_connect(s.port, 0);
    assert_true(fd >= 0);
    assert_int_equal(ps_raw_send_frame(fd, 63, 0, 3, NULL, 0), 0);
    st = ps_raw_read_reply(fd, &r, msg, sizeof msg, NULL);
    assert_int_equal(st, GR_EPROTO);
    assert_non_null(strstr(msg, "unknown opcode 63 before authentication"));
    assert_true(ps_raw_at_eof(fd, NULL));
    close(fd);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    ps_test_rmdir(dir);
}

/* --idle-timeout closes a connection that has nothing in flight and sends nothing; a client
 * whose connection was reaped reconnects on its next call. */
static void test_idle_connections_reaped(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--idle-timeout", "400", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *good = client_for(&s, 10000);
    assert_int_equal(gr_client_create_table(good, spec64), 0);
    int fd = ps_raw_connect(s.port, 0);
    assert_true(fd >= 0);
    assert_int_equal(ps_raw_send_frame(fd, GR_OP_HELLO, 0, 1, NULL, 0), 0);
    gr_proto_header r;
    assert_int_equal(ps_raw_read_reply(fd, &r, NULL, 0, NULL), 0);
    double t0 = now_s();
    assert_true(ps_raw_at_eof(fd, NULL));
    double took = now_s() - t0;
    assert_true(took > 0.3 && took < 6.0);
    close(fd);
    usleep(600 * 1000); /* the client's connection is reaped too */
    pull_one(good);
    gr_client_destroy(good);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* A peer that hangs up while its SYNC_ACQUIRE is parked cancels it at once (the socket is
 * closed, not left in CLOSE_WAIT until the acquire's timeout). */
static void test_hangup_cancels_parked_acquire(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *good = client_for(&s, 10000);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(good, &sc, 0, NULL), 0);

    int fd = ps_raw_connect(s.port, 0);
    assert_true(fd >= 0);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_sync_acquire a = {0, 3600 * 1000, 1}; /* step 1 waits for step 0's pushes */
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_SYNC_ACQUIRE, 0, 0, 9), 0);
    assert_int_equal(gr_proto_put_sync_acquire(&b, &a), 0);
    assert_int_equal(gr_proto_end(&b, 0), 0);
    assert_int_equal(ps_raw_send_buf(fd, &b), 0);
    gr_proto_buf_fini(&b);
    /* Polls by the clock, 10 s at most: under load the server may take a while to read. */
    for (double t = now_s(); stat_of(&s, "sync", "waiting") < 1 && now_s() - t < 10.0;)
        usleep(20 * 1000);
    assert_int_equal((int)stat_of(&s, "sync", "waiting"), 1);
    int conns = (int)stat_of(&s, NULL, "connections"); /* good, the peer, the stats tool */
    close(fd);
    double t0 = now_s();
    while (stat_of(&s, "sync", "waiting") > 0 && now_s() - t0 < 5.0) usleep(20 * 1000);
    assert_int_equal((int)stat_of(&s, "sync", "waiting"), 0);
    assert_true(now_s() - t0 < 5.0); /* not the acquire's hour */
    assert_int_equal((int)stat_of(&s, NULL, "connections"), conns - 1);
    gr_client_destroy(good);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* Header bits the protocol says must be zero: undefined flag bits are refused (the framing is
 * intact, so the connection stays); a request with a nonzero status is not a request. */
static void test_header_bits_must_be_zero(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *good = client_for(&s, 10000);
    assert_int_equal(gr_client_create_table(good, spec64), 0);
    int fd = ps_raw_connect(s.port, 0);
    assert_true(fd >= 0);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(ps_raw_keys_frame(&b, GR_OP_PULL, 5, 1, 64, 3, 1), 0);
    b.data[6] = 0x04; /* flags: READONLY is 0x1; 0x4 means nothing */
    assert_int_equal(ps_raw_send_buf(fd, &b), 0);
    gr_proto_header r;
    char msg[256];
    assert_int_equal(ps_raw_read_reply(fd, &r, msg, sizeof msg, NULL), GR_EPROTO);
    assert_non_null(strstr(msg, "flag bits 0x4 are not defined for pull"));
    b.data[6] = 0x01; /* READONLY is fine on a pull */
    assert_int_equal(ps_raw_send_buf(fd, &b), 0);
    assert_int_equal(ps_raw_read_reply(fd, &r, NULL, 0, NULL), 0);
    assert_int_equal(ps_raw_send_header(fd, GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_PUSH,
                                        GR_PROTO_F_READONLY, 0, 0, 6), 0);
    assert_int_equal(ps_raw_read_reply(fd, &r, msg, sizeof msg, NULL), GR_EPROTO);
    assert_non_null(strstr(msg, "flag bits 0x1 are not defined for push"));
    /* A nonzero status: an error reply, then the end. */
    assert_int_equal(ps_raw_send_header(fd, GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_STATS, 0,
                                        -3, 0, 7), 0);
    assert_int_equal(ps_raw_read_reply(fd, &r, msg, sizeof msg, NULL), GR_EPROTO);
    assert_non_null(strstr(msg, "status field must be 0"));
    assert_true(ps_raw_at_eof(fd, NULL));
    close(fd);
    gr_proto_buf_fini(&b);
    pull_one(good);
    gr_client_destroy(good);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* --max-total-inflight-bytes caps request bodies in flight over all connections: while one
 * peer holds 800 KB (a body announced and not sent), another's 800 KB request is not read;
 * it is once the first peer goes away. */
static void test_global_inflight_cap(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--max-total-inflight-bytes", "1M", "--frame-timeout", "60000", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    enum { BODY = 800 * 1024 };
    uint8_t *junk = calloc(1, BODY);
    assert_non_null(junk);
    int a = ps_raw_connect(s.port, 0), b = ps_raw_connect(s.port, 0);
    assert_true(a >= 0 && b >= 0);
    assert_int_equal(ps_raw_send_header(a, GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0,
                                        BODY, 1), 0);
    assert_int_equal(ps_raw_send_all(a, junk, 100), 0);
    for (double t = now_s(); stat_of(&s, NULL, "inflight_bytes") < BODY && now_s() - t < 10.0;)
        usleep(20 * 1000);
    assert_int_equal((int)stat_of(&s, NULL, "inflight_bytes"), BODY);
    /* b's whole request (a body of zeros: not a valid push) sits unread. */
    assert_int_equal(ps_raw_send_header(b, GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0,
                                        BODY, 2), 0);
    assert_int_equal(ps_raw_send_all(b, junk, BODY), 0);
    struct timeval tv = {0, 500 * 1000};
    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    assert_int_equal(recv(b, &c, 1, MSG_PEEK), -1); /* no reply: not read yet */
    assert_int_equal((int)stat_of(&s, NULL, "inflight_bytes"), BODY);
    close(a);
    tv.tv_sec = 10;
    tv.tv_usec = 0;
    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    gr_proto_header r;
    int st = ps_raw_read_reply(b, &r, NULL, 0, NULL);
    assert_true(st < 0 && st != -1000); /* answered (the zeros do not decode) */
    assert_int_equal(r.id, 2);
    close(b);
    free(junk);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_reader_is_dropped_not_waited_for),
        cmocka_unit_test(test_stalled_partial_frames),
        cmocka_unit_test(test_auth_deadline_from_accept),
        cmocka_unit_test(test_idle_connections_reaped),
        cmocka_unit_test(test_hangup_cancels_parked_acquire),
        cmocka_unit_test(test_header_bits_must_be_zero),
        cmocka_unit_test(test_global_inflight_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
