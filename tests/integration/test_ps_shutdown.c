/* Integration: graceful shutdown. SIGTERM with requests still queued: every request the server
 * had received is answered, then the connection closes and the process exits 0. Idle
 * connections do not hold up a stop; a SHUTDOWN request stops every shard the same way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"
#include "tests/support/ps_harness.h"
#include "tests/support/ps_raw.h"

static void send_all(int fd, const void *p, size_t n) { assert_int_equal(ps_raw_send_all(fd, p, n), 0); }

/* Reads one reply: returns status; *id and the body (malloc'd into *body, NUL-terminated) are
 * filled. */
static int read_reply(int fd, uint16_t *op, uint64_t *id, char **body, uint32_t *len)
{
    gr_proto_header h;
    uint8_t *b = NULL;
    *body = NULL;
    *op = 0;
    *id = 0;
    *len = 0;
    int st = ps_raw_read_reply(fd, &h, NULL, 0, &b);
    if (st == PS_RAW_EOF) return -100;
    *body = (char *)b;
    if (b) b[h.body_len] = '\0';
    *op = h.op;
    *id = h.id;
    *len = h.body_len;
    return st;
}

static void test_sigterm_drains_inflight(void **state)
{
    (void)state;
    ps_test_server s;
    const char *extra[] = {"--threads", "1", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"big\",\"id\":1,\"dim\":64,"
                                               "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.1}}"),
                     0);
    /* Pipeline heavy pushes (new keys: every row is created, then updated), then STATS, which
     * the connection's reader answers at once: by then every push has been received. */
    const int npush = 12;
    const uint32_t n = 20000, dim = 64;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int fd = ps_test_connect(s.port);
    for (int p = 0; p < npush; p++) {
        b.len = 0;
        assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0, 100 + (uint64_t)p), 0);
        assert_int_equal(gr_proto_put_batch_head(&b, 1), 0);
        uint64_t *keys;
        float *vals;
        assert_int_equal(gr_proto_put_section(&b, GR_PROTO_KEYS_VALUES, 1, dim, n, &keys, &vals), 0);
        for (uint32_t i = 0; i < n; i++) keys[i] = (uint64_t)p * n + i;
        for (size_t i = 0; i < (size_t)n * dim; i++) vals[i] = 0.001f;
        assert_int_equal(gr_proto_end(&b, 0), 0);
        send_all(fd, b.data, b.len);
    }
    b.len = 0;
    gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_STATS, 0, 0, 999);
    gr_proto_end(&b, 0);
    send_all(fd, b.data, b.len);
    gr_proto_buf_fini(&b);
    int pushes_ok = 0;
    bool stats_seen = false;
    while (!stats_seen) {
        uint16_t op;
        uint64_t id;
        char *body;
        uint32_t len;
        assert_int_equal(read_reply(fd, &op, &id, &body, &len), 0);
        if (op == GR_OP_PUSH) {
            pushes_ok++;
        } else {
            assert_true(id == 999);
            /* Work was still queued or running when we asked. */
            char *p = strstr(body + 4, "\"inflight\":");
            assert_non_null(p);
            int inflight = atoi(p + 11);
            fprintf(stderr, "at SIGTERM: %d pushes done, %d in flight\n", pushes_ok, inflight);
            assert_true(inflight > 0);
            stats_seen = true;
        }
        free(body);
    }
    kill(s.pid, SIGTERM);
    /* Every received request is still answered, then the connection closes. */
    for (;;) {
        uint16_t op;
        uint64_t id;
        char *body = NULL;
        uint32_t len;
        int rc = read_reply(fd, &op, &id, &body, &len);
        free(body);
        if (rc == -100) break;
        assert_int_equal(rc, 0);
        assert_int_equal(op, GR_OP_PUSH);
        pushes_ok++;
    }
    assert_int_equal(pushes_ok, npush);
    close(fd);
    assert_int_equal(ps_test_server_wait(&s, 20000), 0);
    gr_client_destroy(c);
}

static void test_sigterm_with_idle_connections(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    int fds[5];
    for (int i = 0; i < 5; i++) fds[i] = ps_test_connect(s.port);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    cfg.connect_timeout_ms = 300;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    uint64_t t0 = gr_now_ns();
    assert_int_equal(ps_test_server_stop(&s, SIGTERM), 0);
    assert_true((gr_now_ns() - t0) / 1000000 < 20000); /* it ends, idle peers or not (loose) */
    for (int i = 0; i < 5; i++) {
        char ch;
        assert_int_equal(recv(fds[i], &ch, 1, 0), 0); /* closed, no stray bytes */
        close(fds[i]);
    }
    /* The client learns the shard is gone. */
    uint64_t k = 1;
    float row[4];
    assert_int_not_equal(gr_client_pull(c, 1, 4, &k, 1, row), 0);
    gr_client_destroy(c);
}

static void test_shutdown_request(void **state)
{
    (void)state;
    ps_test_server s[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(s, 2, NULL, list, sizeof list), 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_int_equal(gr_client_shutdown(c, -1), 0);
    assert_int_equal(ps_test_server_wait(&s[0], 20000), 0);
    assert_int_equal(ps_test_server_wait(&s[1], 20000), 0);
    gr_client_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigterm_drains_inflight),
        cmocka_unit_test(test_sigterm_with_idle_connections),
        cmocka_unit_test(test_shutdown_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
