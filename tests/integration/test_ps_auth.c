/* Integration: HMAC-SHA256 challenge-response. A client with the secret is served; a wrong or
 * missing secret, a request before auth, a forged proof or an oversized pre-auth frame are
 * refused with a clear error and the connection is closed. Without an auth file the server
 * refuses a non-loopback address unless --insecure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"
#include "tests/support/ps_harness.h"
#include "tests/support/ps_raw.h"

static char dir[128], secret_path[256];
static ps_test_server srv;

static int setup(void **state)
{
    (void)state;
    if (ps_test_tmpdir(dir, sizeof dir)) return -1;
    snprintf(secret_path, sizeof secret_path, "%s/secret", dir);
    FILE *f = fopen(secret_path, "w");
    fprintf(f, "correct horse battery staple\n");
    fclose(f);
    chmod(secret_path, 0600);
    const char *extra[] = {"--auth-file", secret_path, NULL};
    return ps_test_server_start(&srv, 0, 1, 0, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = ps_test_server_stop(&srv, 0);
    ps_test_rmdir(dir);
    return rc == 0 ? 0 : -1;
}

static int try_client(const char *auth_file, const char *secret, gr_client **out)
{
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = srv.addr;
    cfg.auth_file = auth_file;
    if (secret) {
        cfg.secret = (const uint8_t *)secret;
        cfg.secret_len = strlen(secret);
    }
    cfg.connect_timeout_ms = 2000;
    *out = NULL;
    return gr_client_create(&cfg, out);
}

static void test_accepted(void **state)
{
    (void)state;
    gr_client *c;
    assert_int_equal(try_client(secret_path, NULL, &c), 0);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"t\",\"id\":1,\"dim\":4}"), 0);
    uint64_t k[2] = {5, 6};
    float rows[8];
    assert_int_equal(gr_client_pull(c, 1, 4, k, 2, rows), 0);
    gr_client_destroy(c);
    /* The secret given as bytes (the file's trailing newline is not part of it). */
    assert_int_equal(try_client(NULL, "correct horse battery staple", &c), 0);
    gr_client_destroy(c);
    /* A cluster file naming the auth file relative to itself. */
    char cpath[300];
    snprintf(cpath, sizeof cpath, "%s/cluster.json", dir);
    FILE *f = fopen(cpath, "w");
    fprintf(f, "{\"shards\":[\"%s\"],\"auth_file\":\"secret\"}", srv.addr);
    fclose(f);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.cluster_file = cpath;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    assert_int_equal(gr_client_pull(c, 1, 4, k, 2, rows), 0);
    gr_client_destroy(c);
    /* The stats tool with and without the secret. */
    char out[8192];
    const char *ok[] = {"stats", "--server", srv.addr, "--auth-file", secret_path, NULL};
    assert_int_equal(ps_test_run_granary(ok, out, sizeof out), 0);
    assert_non_null(strstr(out, "shard 0 of 1"));
    const char *no[] = {"stats", "--server", srv.addr, NULL};
    assert_int_equal(ps_test_run_granary(no, out, sizeof out), 1);
    assert_non_null(strstr(out, "requires authentication"));
}

static void test_refused(void **state)
{
    (void)state;
    gr_client *c;
    assert_int_equal(try_client(NULL, "wrong secret", &c), GR_EAUTH);
    assert_null(c);
    assert_non_null(strstr(gr_errmsg(), "authentication failed"));
    assert_non_null(strstr(gr_errmsg(), "shard 0 (127.0.0.1:"));
    assert_int_equal(try_client(NULL, NULL, &c), GR_EAUTH);
    assert_non_null(strstr(gr_errmsg(), "requires authentication: give an auth file"));
}

/* Assertion adapters over tests/support/ps_raw. */
static void send_frame(int fd, uint16_t op, uint64_t id, const void *body, uint32_t len)
{
    assert_int_equal(ps_raw_send_frame(fd, op, 0, id, body, len), 0);
}

static int read_reply(int fd, gr_proto_header *h, uint8_t *body, size_t cap)
{
    uint8_t *b = NULL;
    int st = ps_raw_read_reply(fd, h, NULL, 0, &b);
    if (st == PS_RAW_EOF) return -100;
    assert_true(h->body_len <= cap);
    if (b && h->body_len) memcpy(body, b, h->body_len);
    free(b);
    return st;
}

static void assert_eof(int fd)
{
    size_t skipped = 0;
    assert_true(ps_raw_at_eof(fd, &skipped));
    assert_int_equal(skipped, 0);
}

static void test_raw_refusals(void **state)
{
    (void)state;
    gr_proto_header h;
    uint8_t body[4096];
    /* A request before auth. */
    int fd = ps_test_connect(srv.port);
    send_frame(fd, GR_OP_STATS, 9, NULL, 0);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), GR_EAUTH);
    assert_true(h.id == 9);
    assert_non_null(memmem(body, h.body_len, "authentication required", 23));
    assert_eof(fd);
    close(fd);
    /* A forged proof after hello. */
    fd = ps_test_connect(srv.port);
    send_frame(fd, GR_OP_HELLO, 1, NULL, 0);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), 0);
    gr_proto_hello hello;
    assert_int_equal(gr_proto_decode_hello(body, h.body_len, &hello), 0);
    assert_int_equal(hello.auth_required, 1);
    uint8_t proof[64];
    memset(proof, 0xab, sizeof proof);
    send_frame(fd, GR_OP_AUTH, 2, proof, sizeof proof);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), GR_EAUTH);
    assert_eof(fd);
    close(fd);
    /* The right proof, computed by hand: accepted, and the server proves itself back. */
    fd = ps_test_connect(srv.port);
    send_frame(fd, GR_OP_HELLO, 1, NULL, 0);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), 0);
    assert_int_equal(gr_proto_decode_hello(body, h.body_len, &hello), 0);
    const char *secret = "correct horse battery staple";
    uint8_t cn[32], mac[32], want[32];
    memset(cn, 7, sizeof cn);
    gr_proto_auth_mac((const uint8_t *)secret, strlen(secret), hello.nonce, cn, mac);
    memcpy(proof, cn, 32);
    memcpy(proof + 32, mac, 32);
    send_frame(fd, GR_OP_AUTH, 2, proof, sizeof proof);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), 0);
    assert_int_equal(h.body_len, 32);
    gr_proto_auth_mac((const uint8_t *)secret, strlen(secret), cn, hello.nonce, want);
    assert_memory_equal(body, want, 32);
    send_frame(fd, GR_OP_STATS, 3, NULL, 0);
    uint8_t *big = malloc(1 << 20);
    uint8_t hb[24];
    assert_int_equal(recv(fd, hb, 24, MSG_WAITALL), 24);
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_header_decode(hb, 24, &lim, &h, NULL);
    assert_int_equal(h.status, 0);
    assert_int_equal(recv(fd, big, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
    assert_non_null(memmem(big, h.body_len, "\"auth_failures\":", 16));
    free(big);
    close(fd);
    /* Before auth, frames are limited to 4 KiB. */
    fd = ps_test_connect(srv.port);
    uint8_t hb2[24];
    gr_proto_header hh = {1, GR_PROTO_REQUEST, GR_OP_HELLO, 0, 0, 8192, 4};
    gr_proto_header_encode(hb2, &hh);
    assert_int_equal(send(fd, hb2, 24, MSG_NOSIGNAL), 24);
    assert_int_equal(read_reply(fd, &h, body, sizeof body), GR_ETOOBIG);
    assert_eof(fd);
    close(fd);
}

static void test_listen_policy(void **state)
{
    (void)state;
    char out[4096];
    const char *open_args[] = {"server", "--listen", "0.0.0.0:0", NULL};
    assert_int_equal(ps_test_run_granary(open_args, out, sizeof out), 2);
    assert_non_null(strstr(out, "refusing to listen on 0.0.0.0 without authentication"));
    /* --insecure, or an auth file, lifts the refusal (the last --listen wins). */
    ps_test_server s;
    const char *insecure[] = {"--listen", "0.0.0.0:0", "--insecure", NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, insecure), 0);
    gr_client *c;
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    const char *authed[] = {"--listen", "0.0.0.0:0", "--auth-file", secret_path, NULL};
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, authed), 0);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    /* Bad flags and an empty auth file. */
    const char *bad[] = {"server", "--listen", "nonsense", NULL};
    assert_int_equal(ps_test_run_granary(bad, out, sizeof out), 2);
    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    FILE *f = fopen(empty, "w");
    fclose(f);
    const char *emp[] = {"server", "--listen", "127.0.0.1:0", "--auth-file", empty, NULL};
    assert_int_equal(ps_test_run_granary(emp, out, sizeof out), 1);
    assert_non_null(strstr(out, "is empty"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_raw_refusals),
        cmocka_unit_test(test_listen_policy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
