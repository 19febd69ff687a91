/* Raw frames for the hostile-peer tests (ps_raw.h). */
#include "tests/support/ps_raw.h"
#include "tests/support/ps_harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int ps_raw_connect(uint16_t port, int rcvbuf)
{
    return ps_test_connect_rcvbuf(port, rcvbuf);
}

int ps_raw_send_all(int fd, const void *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = send(fd, (const char *)p + done, n - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

int ps_raw_send_header(int fd, uint8_t version, uint8_t kind, uint16_t op, uint16_t flags,
                       int32_t status, uint32_t body_len, uint64_t id)
{
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    gr_proto_header h = {version, kind, op, flags, status, body_len, id};
    gr_proto_header_encode(hb, &h);
    return ps_raw_send_all(fd, hb, sizeof hb);
}

int ps_raw_send_frame(int fd, uint16_t op, uint16_t flags, uint64_t id, const void *body,
                      uint32_t len)
{
    if (ps_raw_send_header(fd, GR_PROTO_VERSION, GR_PROTO_REQUEST, op, flags, 0, len, id)) return -1;
    return len ? ps_raw_send_all(fd, body, len) : 0;
}

int ps_raw_send_buf(int fd, const gr_proto_buf *b) { return ps_raw_send_all(fd, b->data, b->len); }

int ps_raw_recv_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

int ps_raw_read_reply(int fd, gr_proto_header *h, char *msg, size_t cap, uint8_t **body)
{
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    if (msg && cap) msg[0] = '\0';
    if (body) *body = NULL;
    memset(h, 0, sizeof *h);
    if (ps_raw_recv_all(fd, hb, sizeof hb)) return PS_RAW_EOF;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_body = UINT32_MAX;
    int rc = gr_proto_header_decode(hb, sizeof hb, &lim, h, NULL);
    if ((rc != GR_OK && rc != GR_EAGAIN) || h->kind != GR_PROTO_RESPONSE) return -1000;
    uint8_t *b = malloc(h->body_len + 8);
    if (!b || ps_raw_recv_all(fd, b, h->body_len)) {
        free(b);
        return PS_RAW_EOF;
    }
    if (h->status < 0 && msg && cap) {
        const char *s;
        uint32_t n;
        if (gr_proto_decode_str(b, h->body_len, &lim, &s, &n) == GR_OK)
            snprintf(msg, cap, "%.*s", (int)n, s);
    }
    if (body) *body = b;
    else free(b);
    return h->status;
}

bool ps_raw_at_eof(int fd, size_t *skipped)
{
    char junk[65536];
    if (skipped) *skipped = 0;
    for (;;) {
        ssize_t r = recv(fd, junk, sizeof junk, 0);
        if (r > 0) {
            if (skipped) *skipped += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return true;
        return errno == ECONNRESET || errno == EPIPE;
    }
}

int ps_raw_keys_frame(gr_proto_buf *b, uint16_t op, uint64_t id, uint32_t table, uint32_t dim,
                      uint32_t n, uint64_t stride)
{
    b->len = 0;
    uint64_t *keys = NULL;
    int rc = gr_proto_buf_reserve(b, 64 + gr_proto_section_size(GR_PROTO_KEYS, n, dim));
    if (!rc) rc = gr_proto_begin(b, GR_PROTO_REQUEST, op, 0, 0, id);
    if (!rc) rc = gr_proto_put_batch_head(b, 1);
    if (!rc) rc = gr_proto_put_section(b, GR_PROTO_KEYS, table, dim, n, &keys, NULL);
    for (uint32_t i = 0; !rc && i < n; i++) keys[i] = (uint64_t)i * stride + 1;
    if (!rc) rc = gr_proto_end(b, 0);
    return rc;
}
