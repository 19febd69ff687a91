/* The client's reading of pull replies, against a fake shard that answers what the test tells
 * it to: a correct reply built by hand (rows land, odd sizes padded), a reply whose section
 * does not match the request (GR_EPROTO naming the shard, the connection dropped and the next
 * call reconnecting), a reply for another table, and a reply whose body stalls half way (the op fails at its deadline,
 * it does not hang). Pull replies are streamed from the socket (docs/client.md), so these are
 * the cases where the reader holds a request while its body arrives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"

enum { GOOD = 0, WRONG_SECTION = 1, STALL = 2, WRONG_TABLE = 3 };

typedef struct fake {
    int lfd;
    uint16_t port;
    int mode;
    int conns; /* connections to serve before leaving */
    pthread_t th;
} fake;

static int recv_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Answers a pull: each row is its key's value in every column (key + 0.5). */
static void answer_pull(int fd, int mode, const gr_proto_header *h, const uint8_t *body)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_batch req;
    if (gr_proto_decode_batch(body, h->body_len, GR_PROTO_KEYS, &lim, &req)) return;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_PULL, 0, 0, h->id);
    gr_proto_put_batch_head(&b, req.ntables);
    for (uint32_t t = 0; t < req.ntables; t++) {
        const gr_proto_section *s = &req.sections[t];
        uint32_t n = mode == WRONG_SECTION ? s->n + 1 : s->n;
        float *vals;
        uint32_t table = mode == WRONG_TABLE ? s->table + 100 : s->table;
        gr_proto_put_section(&b, GR_PROTO_VALUES, table, s->dim, n, NULL, &vals);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t d = 0; d < s->dim; d++)
                vals[(size_t)i * s->dim + d] = i < s->n ? (float)s->keys[i] + 0.5f : 0.0f;
    }
    gr_proto_end(&b, 0);
    /* STALL: the header and a first part of the body, then nothing. */
    size_t len = mode == STALL ? GR_PROTO_HEADER_SIZE + 8 + 16 + 4 : b.len;
    send(fd, b.data, len, MSG_NOSIGNAL);
    gr_proto_buf_fini(&b);
    gr_proto_batch_fini(&req);
}

static void *fake_main(void *p)
{
    fake *f = p;
    for (int c = 0; c < f->conns; c++) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0) return NULL;
        gr_proto_limits lim;
        gr_proto_limits_default(&lim);
        uint8_t hb[24];
        gr_proto_header h;
        while (recv_all(fd, hb, 24) == 0) {
            gr_proto_header_decode(hb, 24, &lim, &h, NULL);
            uint8_t *body = malloc(h.body_len + 8);
            if (recv_all(fd, body, h.body_len) != 0) {
                free(body);
                break;
            }
            if (h.op == GR_OP_HELLO) {
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
            } else if (h.op == GR_OP_PULL) {
                answer_pull(fd, f->mode, &h, body);
            }
            free(body);
        }
        close(fd);
    }
    return NULL;
}

static void fake_start(fake *f, int mode, int conns)
{
    f->mode = mode;
    f->conns = conns;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->lfd, 4), 0);
    socklen_t sl = sizeof a;
    getsockname(f->lfd, (struct sockaddr *)&a, &sl);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static gr_client *connect_to(const fake *f, char *addr, size_t cap, uint32_t timeout_ms)
{
    snprintf(addr, cap, "127.0.0.1:%u", f->port);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = addr;
    cfg.request_timeout_ms = timeout_ms;
    gr_client *c = NULL;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    return c;
}

static void test_good_reply_lands_in_every_occurrence(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, GOOD, 1);
    char addr[64];
    gr_client *c = connect_to(&f, addr, sizeof addr, 5000);
    /* dim 3 with 3 unique keys: 9 floats, so the section is padded; two tables. */
    uint64_t k1[5] = {7, 9, 7, 11, 9}, k2[2] = {4, 4};
    float r1[5 * 3], r2[2 * 1];
    gr_client_batch b[2] = {{1, 3, 5, k1, r1, NULL, 0}, {2, 1, 2, k2, r2, NULL, 0}};
    assert_int_equal(gr_client_pull_many(c, b, 2, 0), 0);
    for (int i = 0; i < 5; i++)
        for (int d = 0; d < 3; d++) assert_true(r1[i * 3 + d] == (float)k1[i] + 0.5f);
    assert_true(r2[0] == 4.5f && r2[1] == 4.5f);
    /* The same keys given unique: one row each, at their own positions. */
    uint64_t u[3] = {11, 7, 9};
    float ru[3 * 3];
    gr_client_batch bu = {1, 3, 3, u, ru, NULL, GR_CLIENT_BATCH_UNIQUE};
    assert_int_equal(gr_client_pull_many(c, &bu, 1, 0), 0);
    for (int i = 0; i < 3; i++) assert_true(ru[i * 3 + 2] == (float)u[i] + 0.5f);
    gr_client_destroy(c);
    pthread_join(f.th, NULL);
    close(f.lfd);
}

static void test_mismatched_reply_drops_the_connection(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, WRONG_SECTION, 2);
    char addr[64];
    gr_client *c = connect_to(&f, addr, sizeof addr, 5000);
    uint64_t keys[3] = {1, 2, 3};
    float rows[3 * 4];
    assert_int_equal(gr_client_pull(c, 1, 4, keys, 3, rows), GR_EPROTO);
    char want[96];
    snprintf(want, sizeof want, "shard 0 (%s): ", addr);
    assert_non_null(strstr(gr_errmsg(), want));
    assert_non_null(strstr(gr_errmsg(), "does not match the request"));
    /* The connection was dropped: the next call reconnects (and fails the same way). */
    gr_client_stats_t st;
    assert_int_equal(gr_client_pull(c, 1, 4, keys, 3, rows), GR_EPROTO);
    gr_client_get_stats(c, &st);
    assert_int_equal(st.reconnects, 1);
    gr_client_destroy(c);
    pthread_join(f.th, NULL);
    close(f.lfd);
}

static void test_reply_for_another_table_is_refused(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, WRONG_TABLE, 1);
    char addr[64];
    gr_client *c = connect_to(&f, addr, sizeof addr, 5000);
    uint64_t keys[2] = {1, 2};
    float rows[2 * 4];
    assert_int_equal(gr_client_pull(c, 1, 4, keys, 2, rows), GR_EPROTO);
    assert_non_null(strstr(gr_errmsg(), "reply section 0 does not match the request"));
    gr_client_destroy(c);
    pthread_join(f.th, NULL);
    close(f.lfd);
}

static void test_stalled_reply_fails_at_the_deadline(void **state)
{
    (void)state;
    fake f;
    fake_start(&f, STALL, 1);
    char addr[64];
    gr_client *c = connect_to(&f, addr, sizeof addr, 300);
    uint64_t keys[3] = {1, 2, 3};
    float rows[3 * 4];
    uint64_t t0 = gr_now_ns();
    assert_int_equal(gr_client_pull(c, 1, 4, keys, 3, rows), GR_ETIMEDOUT);
    double ms = (double)(gr_now_ns() - t0) / 1e6;
    assert_non_null(strstr(gr_errmsg(), "stalled"));
    /* Upper bound: the 300 ms deadline, not the 30 s default (loose: load delays wakeups). */
    assert_true(ms >= 250 && ms < 10000);
    gr_client_destroy(c);
    pthread_join(f.th, NULL);
    close(f.lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_reply_lands_in_every_occurrence),
        cmocka_unit_test(test_mismatched_reply_drops_the_connection),
        cmocka_unit_test(test_reply_for_another_table_is_refused),
        cmocka_unit_test(test_stalled_reply_fails_at_the_deadline),
    };
    return cmocka_run_group_tests_name("client_replies", tests, NULL, NULL);
}
