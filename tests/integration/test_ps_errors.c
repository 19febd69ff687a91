/* Integration: every bad-input path of the server, over raw sockets and through the client:
 * malformed, oversized, wrong-version and wrong-kind frames (error reply, then close),
 * unknown opcodes (error reply, connection kept), wrong dim, unknown table, misrouted keys,
 * non-finite gradients, the connection limit, request timeouts and reconnects. After each,
 * the server still serves a good client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"
#include "tests/support/ps_harness.h"
#include "tests/support/ps_raw.h"

static const char *user_spec = "{\"name\":\"user\",\"id\":1,\"dim\":16,\"seed\":7,"
                               "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
                               "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05}}";

static gr_client *client_for(const char *list)
{
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    cfg.connect_timeout_ms = 3000;
    gr_client *c = NULL;
    int rc = gr_client_create(&cfg, &c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return c;
}

/* A good client can still pull and push. */
static void assert_serves(const char *list)
{
    gr_client *c = client_for(list);
    uint64_t keys[64];
    float rows[64 * 16], g[64 * 16];
    for (int i = 0; i < 64; i++) keys[i] = (uint64_t)i * 31 + 5;
    for (int i = 0; i < 64 * 16; i++) g[i] = 0.01f;
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 64, rows), 0);
    assert_int_equal(gr_client_push(c, 1, 16, keys, 64, g), 0);
    gr_client_destroy(c);
}

/* Assertion adapters over tests/support/ps_raw. */
static void send_all(int fd, const void *p, size_t n) { assert_int_equal(ps_raw_send_all(fd, p, n), 0); }

static void send_header(int fd, uint8_t version, uint8_t kind, uint16_t op, uint32_t body_len,
                        uint64_t id)
{
    assert_int_equal(ps_raw_send_header(fd, version, kind, op, 0, 0, body_len, id), 0);
}

static int recv_all(int fd, void *p, size_t n) { return ps_raw_recv_all(fd, p, n); }

/* Reads one reply; returns its status and copies its error text (if any) to msg. */
/* Reads one reply; returns its status and copies its error text (if any) to msg. */
static int read_reply(int fd, gr_proto_header *h, char *msg, size_t cap)
{
    int st = ps_raw_read_reply(fd, h, msg, cap, NULL);
    assert_true(st <= 0 && st != -1000);
    return st;
}

static void assert_eof(int fd)
{
    size_t skipped = 0;
    assert_true(ps_raw_at_eof(fd, &skipped));
    assert_int_equal(skipped, 0);
}

static void test_bad_frames_close_connection(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--max-body", "1M", "--max-keys", "1000", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *c = client_for(s.addr);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    gr_proto_header h;
    char msg[512];

    /* Bad magic. */
    int fd = ps_test_connect(s.port);
    send_all(fd, "XXXXXXXXXXXXXXXXXXXXXXXX", 24);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_EPROTO);
    assert_non_null(strstr(msg, "bad frame magic"));
    assert_eof(fd);
    close(fd);

    /* Another protocol version: the error carries the request id. */
    fd = ps_test_connect(s.port);
    send_header(fd, 2, GR_PROTO_REQUEST, GR_OP_PULL, 0, 77);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_EVERSION);
    assert_true(h.id == 77);
    assert_non_null(strstr(msg, "protocol version 2 is not supported"));
    assert_eof(fd);
    close(fd);

    /* Oversized: refused from the header, before the server allocates anything. */
    fd = ps_test_connect(s.port);
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_PUSH, 2u << 20, 78);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_ETOOBIG);
    assert_non_null(strstr(msg, "exceeds the limit of 1048576 bytes"));
    assert_eof(fd);
    close(fd);

    /* A response frame sent as a request. */
    fd = ps_test_connect(s.port);
    send_header(fd, 1, GR_PROTO_RESPONSE, GR_OP_PULL, 0, 79);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_EPROTO);
    assert_eof(fd);
    close(fd);

    /* A body that lies about its contents: 5 tables promised, one section present. */
    fd = ps_test_connect(s.port);
    uint32_t body[8] = {5, 0, 1, 16, 1, 0, 9, 0}; /* key 9 as two u32 */
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_PULL, sizeof body, 80);
    send_all(fd, body, sizeof body);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_EPROTO);
    assert_true(h.id == 80);
    assert_eof(fd);
    close(fd);

    /* More keys than the server's limit. */
    fd = ps_test_connect(s.port);
    size_t nk = 1001, blen = 8 + 16 + nk * 8;
    uint8_t *big = calloc(1, blen);
    uint32_t head[6] = {1, 0, 1, 16, (uint32_t)nk, 0};
    memcpy(big, head, sizeof head);
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_PULL, (uint32_t)blen, 81);
    send_all(fd, big, blen);
    free(big);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_ETOOBIG);
    assert_non_null(strstr(msg, "more than 1000 keys"));
    assert_eof(fd);
    close(fd);

    /* A half header, then the client goes away. */
    fd = ps_test_connect(s.port);
    send_all(fd, "GR\x01", 3);
    close(fd);

    /* Unknown opcode: answered, and the connection keeps working. */
    fd = ps_test_connect(s.port);
    send_header(fd, 1, GR_PROTO_REQUEST, 63, 0, 82);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_EPROTO);
    assert_non_null(strstr(msg, "unknown opcode"));
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_STATS, 0, 83);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), 0);
    assert_true(h.id == 83);
    close(fd);

    /* The server counted them and still serves everyone. */
    char *json;
    assert_int_equal(gr_client_stats(c, 0, &json), 0);
    assert_non_null(strstr(json, "\"bad_frames\":6"));
    free(json);
    gr_client_destroy(c);
    assert_serves(s.addr);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

static void test_semantic_errors_keep_connection(void **state)
{
    (void)state;
    ps_test_server s[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(s, 2, NULL, list, sizeof list), 0);
    gr_client *c = client_for(list);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    uint64_t keys[3] = {1, 2, 3};
    float rows[3 * 16], g[3 * 32] = {0}; /* the client checks them: defined values */
    /* Wrong dim: GR_EDIM with the table's name and both dims, naming the shard. */
    assert_int_equal(gr_client_pull(c, 1, 8, keys, 3, rows), GR_EDIM);
    assert_non_null(strstr(gr_errmsg(), "table 'user' has dim 16, pull carried dim 8"));
    assert_non_null(strstr(gr_errmsg(), "shard "));
    assert_int_equal(gr_client_push(c, 1, 32, keys, 3, g), GR_EDIM);
    assert_non_null(strstr(gr_errmsg(), "push carried dim 32"));
    /* Unknown table. */
    assert_int_equal(gr_client_pull(c, 99, 16, keys, 3, rows), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no table with id 99"));
    /* Non-finite gradient: refused, nothing applied. */
    for (int i = 0; i < 3 * 16; i++) g[i] = 0.5f;
    g[5] = NAN;
    assert_int_equal(gr_client_push(c, 1, 16, keys, 3, g), GR_EINVAL);
    /* Bad arguments never leave a handle behind. */
    gr_client_op *op = (gr_client_op *)1;
    gr_client_batch bad = {1, 0, 3, keys, rows, NULL, 0};
    assert_int_equal(gr_client_pull_start(c, &bad, 1, 0, &op), GR_EINVAL);
    assert_null(op);
    op = (gr_client_op *)1;
    gr_client_batch nullrows = {1, 16, 3, keys, NULL, NULL, 0};
    assert_int_equal(gr_client_pull_start(c, &nullrows, 1, 0, &op), GR_EINVAL);
    assert_null(op);

    /* Misrouted key: a raw pull to shard 0 for a key whose slot is shard 1's. */
    uint64_t key = 0;
    while (gr_proto_default_shard(gr_slot_of(key), 2) != 1) key++;
    int fd = ps_test_connect(s[0].port);
    uint8_t body[8 + 16 + 8];
    uint32_t head[6] = {1, 0, 1, 16, 1, 0};
    memcpy(body, head, sizeof head);
    memcpy(body + 24, &key, 8);
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_PULL, sizeof body, 5);
    send_all(fd, body, sizeof body);
    gr_proto_header h;
    char msg[512];
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), GR_ESTALE);
    char want[128];
    snprintf(want, sizeof want, "key %llu (slot %u) belongs to shard 1, not shard 0",
             (unsigned long long)key, gr_slot_of(key));
    assert_non_null(strstr(msg, want));
    /* Same connection, properly routed: fine. */
    uint64_t key0 = 0;
    while (gr_proto_default_shard(gr_slot_of(key0), 2) != 0) key0++;
    memcpy(body + 24, &key0, 8);
    send_header(fd, 1, GR_PROTO_REQUEST, GR_OP_PULL, sizeof body, 6);
    send_all(fd, body, sizeof body);
    assert_int_equal(read_reply(fd, &h, msg, sizeof msg), 0);
    assert_true(h.id == 6);
    close(fd);
    gr_client_destroy(c);
    assert_serves(list);
    ps_test_cluster_stop(s, 2);
}

static void test_connection_limit(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--max-connections", "2", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    int a = ps_test_connect(s.port), b = ps_test_connect(s.port);
    /* Make sure both are accepted before the third arrives. */
    send_header(a, 1, GR_PROTO_REQUEST, GR_OP_STATS, 0, 1);
    send_header(b, 1, GR_PROTO_REQUEST, GR_OP_STATS, 0, 2);
    gr_proto_header h;
    char msg[512];
    assert_int_equal(read_reply(a, &h, NULL, 0), 0);
    assert_int_equal(read_reply(b, &h, NULL, 0), 0);
    int x = ps_test_connect(s.port);
    assert_int_equal(read_reply(x, &h, msg, sizeof msg), GR_EBUSY);
    assert_non_null(strstr(msg, "2 connections (the limit)"));
    assert_eof(x);
    close(x);
    /* The client reports the refusal, naming the shard. */
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    cfg.connect_timeout_ms = 200;
    gr_client *c = NULL;
    assert_int_not_equal(gr_client_create(&cfg, &c), 0);
    assert_null(c);
    assert_non_null(strstr(gr_errmsg(), "shard 0 (127.0.0.1:"));
    close(a);
    close(b);
    /* Slots free up once the server sees the closes. */
    int rc = -1;
    for (int i = 0; i < 100 && rc; i++) {
        cfg.connect_timeout_ms = 2000;
        rc = gr_client_create(&cfg, &c);
    }
    assert_int_equal(rc, 0);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* A fake shard that completes the handshake and then never answers. */
typedef struct fake {
    int lfd;
    uint16_t port;
    pthread_t th;
} fake;

static void *fake_main(void *p)
{
    fake *f = p;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t hb[24], body[4096];
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_header h;
    bool hello_done = false;
    while (recv_all(fd, hb, 24) == 0) {
        gr_proto_header_decode(hb, 24, &lim, &h, NULL);
        if (h.body_len > sizeof body) {
            uint8_t *tmp = malloc(h.body_len);
            recv_all(fd, tmp, h.body_len);
            free(tmp);
        } else if (recv_all(fd, body, h.body_len) != 0) {
            break;
        }
        if (!hello_done && h.op == GR_OP_HELLO) {
            gr_proto_buf b;
            gr_proto_buf_init(&b);
            gr_proto_hello hello;
            memset(&hello, 0, sizeof hello);
            hello.shards = 1;
            hello.limits = lim;
            snprintf(hello.server_version, sizeof hello.server_version, "fake");
            gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_HELLO, 0, 0, h.id);
            gr_proto_put_hello(&b, &hello);
            gr_proto_end(&b, 0);
            send(fd, b.data, b.len, MSG_NOSIGNAL);
            gr_proto_buf_fini(&b);
            hello_done = true;
        }
        /* everything else: silence */
    }
    close(fd);
    return NULL;
}

static void test_request_timeout_names_shard(void **state)
{
    (void)state;
    fake f;
    f.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f.lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(f.lfd, (struct sockaddr *)&a, &sl);
    f.port = ntohs(a.sin_port);
    pthread_create(&f.th, NULL, fake_main, &f);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", f.port);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = addr;
    cfg.request_timeout_ms = 300;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    uint64_t keys[2] = {1, 2};
    float rows[2 * 4];
    gr_client_op *op;
    gr_client_batch b = {1, 4, 2, keys, rows, NULL, 0};
    assert_int_equal(gr_client_pull_start(c, &b, 1, 0, &op), 0);
    assert_int_equal(gr_client_wait(op, 50), GR_EAGAIN); /* still running: handle kept */
    uint64_t t0 = gr_now_ns();
    int rc = gr_client_wait(op, -1);
    double waited_ms = (double)(gr_now_ns() - t0) / 1e6;
    assert_int_equal(rc, GR_ETIMEDOUT);
    char want[160];
    snprintf(want, sizeof want, "shard 0 (%s): no reply within 300 ms", addr);
    assert_non_null(strstr(gr_errmsg(), want));
    /* Upper bound: only "the 300 ms timeout was honoured, not the 30 s default"; how soon
     * after 300 ms the wait ends depends on the machine's load. */
    assert_true(waited_ms < 10000);
    gr_client_destroy(c);
    pthread_join(f.th, NULL);
    close(f.lfd);
}

static void test_reconnect_with_backoff(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    uint16_t port = s.port;
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    cfg.connect_timeout_ms = 300;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    uint64_t keys[4] = {1, 2, 3, 4};
    float rows[4 * 16];
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 4, rows), 0);
    /* The shard dies: the next call fails with a message naming it. */
    assert_int_equal(ps_test_server_stop(&s, SIGKILL), 128 + SIGKILL);
    int rc = gr_client_pull(c, 1, 16, keys, 4, rows);
    assert_true(rc == GR_ECONN || rc == GR_ETIMEDOUT);
    char want[64];
    snprintf(want, sizeof want, "shard 0 (127.0.0.1:%u)", port);
    assert_non_null(strstr(gr_errmsg(), want));
    /* While it is down, each call retries with backoff until the connect timeout. */
    uint64_t t0 = gr_now_ns();
    rc = gr_client_pull(c, 1, 16, keys, 4, rows);
    double ms = (double)(gr_now_ns() - t0) / 1e6;
    assert_int_equal(rc, GR_ECONN);
    assert_non_null(strstr(gr_errmsg(), "connection refused"));
    assert_non_null(strstr(gr_errmsg(), "attempts"));
    /* Below the 5 s default connect timeout: the 300 ms one was used (loose: load delays). */
    assert_true(ms >= 100 && ms < 4500);
    /* It comes back on the same port (a fresh, empty shard): the client reconnects. */
    assert_int_equal(ps_test_server_start(&s, 0, 1, port, NULL), 0);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 4, rows), 0);
    gr_client_stats_t st;
    gr_client_get_stats(c, &st);
    assert_true(st.reconnects >= 1);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

static void test_table_limit(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--max-tables", "2", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *c = client_for(s.addr);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"w\",\"size\":8}"), 0);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"x\",\"id\":2,\"dim\":4}"),
                     GR_ETOOBIG);
    assert_non_null(strstr(gr_errmsg(), "already holds 2 tables and dense parameters (the limit)"));
    /* Dropping one makes room. */
    assert_int_equal(gr_client_drop_table(c, "user"), 0);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"x\",\"id\":2,\"dim\":4}"), 0);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* Replies carry the request id and may overtake each other: a tiny pull sent after a heavy
 * push on the same connection usually comes back first (two workers). */
static void test_out_of_order_replies(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--threads", "2", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *c = client_for(s.addr);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    gr_client_destroy(c);
    int fd = ps_test_connect(s.port);
    const uint32_t n = 40000;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int overtaken = 0;
    for (int trial = 0; trial < 10 && !overtaken; trial++) {
        b.len = 0;
        uint64_t *keys;
        float *vals;
        assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0, 1000 + (uint64_t)trial), 0);
        gr_proto_put_batch_head(&b, 1);
        assert_int_equal(gr_proto_put_section(&b, GR_PROTO_KEYS_VALUES, 1, 16, n, &keys, &vals), 0);
        for (uint32_t i = 0; i < n; i++) keys[i] = (uint64_t)trial * n + i + 1000000;
        for (size_t i = 0; i < (size_t)n * 16; i++) vals[i] = 0.01f;
        gr_proto_end(&b, 0);
        size_t start = b.len;
        gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PULL, 0, 0, 2000 + (uint64_t)trial);
        gr_proto_put_batch_head(&b, 1);
        assert_int_equal(gr_proto_put_section(&b, GR_PROTO_KEYS, 1, 16, 1, &keys, NULL), 0);
        keys[0] = 7;
        gr_proto_end(&b, start);
        send_all(fd, b.data, b.len);
        gr_proto_header h1, h2;
        assert_int_equal(read_reply(fd, &h1, NULL, 0), 0);
        assert_int_equal(read_reply(fd, &h2, NULL, 0), 0);
        /* Both answered, each with its own id. */
        assert_true((h1.id == 1000 + (uint64_t)trial && h2.id == 2000 + (uint64_t)trial) ||
                    (h1.id == 2000 + (uint64_t)trial && h2.id == 1000 + (uint64_t)trial));
        if (h1.op == GR_OP_PULL) {
            assert_true(h1.id == 2000 + (uint64_t)trial);
            overtaken = 1;
        }
    }
    assert_true(overtaken);
    gr_proto_buf_fini(&b);
    close(fd);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* A connection's request bodies held at once are bounded: with a 1 MiB budget, pipelined
 * 800 KB pushes are taken one at a time (the reader waits, TCP pushes back), and all complete. */
static void test_inflight_bytes_budget(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--threads", "1", "--max-inflight-bytes", "1M", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *c = client_for(s.addr);
    assert_int_equal(gr_client_create_table(c, user_spec), 0);
    int fd = ps_test_connect(s.port);
    const uint32_t n = 12000; /* 12000 * (8 + 64) bytes = 864 KB per push */
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    const int npush = 10;
    for (int p = 0; p < npush; p++) {
        size_t start = b.len;
        uint64_t *keys;
        float *vals;
        gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0, 500 + (uint64_t)p);
        gr_proto_put_batch_head(&b, 1);
        assert_int_equal(gr_proto_put_section(&b, GR_PROTO_KEYS_VALUES, 1, 16, n, &keys, &vals), 0);
        for (uint32_t i = 0; i < n; i++) keys[i] = (uint64_t)p * n + i;
        for (size_t i = 0; i < (size_t)n * 16; i++) vals[i] = 0.001f;
        gr_proto_end(&b, start);
    }
    send_all(fd, b.data, b.len);
    gr_proto_buf_fini(&b);
    /* Meanwhile, from another connection: never more than one of those pushes held. */
    int max_seen = 0;
    for (int i = 0; i < 20; i++) {
        char *json;
        assert_int_equal(gr_client_stats(c, 0, &json), 0);
        char *q = strstr(json, "\"inflight\":");
        assert_non_null(q);
        int v = atoi(q + 11);
        if (v > max_seen) max_seen = v;
        free(json);
    }
    assert_true(max_seen <= 1);
    for (int p = 0; p < npush; p++) {
        gr_proto_header h;
        assert_int_equal(read_reply(fd, &h, NULL, 0), 0);
        assert_true(h.id == 500 + (uint64_t)p); /* one at a time: in order */
    }
    close(fd);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

static void test_client_config_errors(void **state)
{
    (void)state;
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    gr_client *c = (gr_client *)1;
    assert_int_equal(gr_client_create(&cfg, &c), GR_EINVAL);
    assert_null(c);
    cfg.servers = "localhost";
    assert_int_equal(gr_client_create(&cfg, &c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "want host:port"));
    cfg.servers = "127.0.0.1:1";
    cfg.connect_timeout_ms = 50;
    assert_int_equal(gr_client_create(&cfg, &c), GR_ECONN);
    assert_non_null(strstr(gr_errmsg(), "shard 0 (127.0.0.1:1): connection refused"));
    /* A cluster file whose order disagrees with the shards' own view. */
    ps_test_server s[2];
    char list[256], dir[128], path[256];
    assert_int_equal(ps_test_cluster_start(s, 2, NULL, list, sizeof list), 0);
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/cluster.json", dir);
    FILE *fp = fopen(path, "w");
    fprintf(fp, "{\"shards\":[\"%s\",\"%s\"]}", s[1].addr, s[0].addr);
    fclose(fp);
    gr_client_config_default(&cfg);
    cfg.cluster_file = path;
    assert_int_equal(gr_client_create(&cfg, &c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "server says it is shard 1 of 2, but the server list has "
                                        "it as shard 0 of 2"));
    fp = fopen(path, "w");
    fprintf(fp, "{\"shards\":[\"%s\",\"%s\"]}", s[0].addr, s[1].addr);
    fclose(fp);
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_string_equal(gr_client_shard_addr(c, 1), s[1].addr);
    gr_client_destroy(c);
    ps_test_cluster_stop(s, 2);
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_frames_close_connection),
        cmocka_unit_test(test_semantic_errors_keep_connection),
        cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_request_timeout_names_shard),
        cmocka_unit_test(test_reconnect_with_backoff),
        cmocka_unit_test(test_client_config_errors),
        cmocka_unit_test(test_table_limit),
        cmocka_unit_test(test_out_of_order_replies),
        cmocka_unit_test(test_inflight_bytes_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
