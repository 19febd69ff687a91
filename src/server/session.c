/* A connection's session: HELLO (the shard's layout and limits, and a fresh nonce) and AUTH
 * (HMAC challenge-response over that nonce). Both run on the connection loop, in frame order,
 * and keep their state in the connection (conn.c's srv_conn_auth). */
#include "server/server_int.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_session_hello(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    free(body);
    srv_conn_auth *a = srv_conn_auth_state(c);
    gr_proto_hello hello;
    memset(&hello, 0, sizeof hello);
    hello.shard = s->cfg.shard;
    hello.shards = s->cfg.shards;
    hello.auth_required = s->secret ? 1 : 0;
    hello.limits = s->cfg.limits;
    snprintf(hello.server_version, sizeof hello.server_version, "granary %s", GR_VERSION_STRING);
    int rc = gr_proto_random(a->nonce, sizeof a->nonce);
    if (!rc) {
        memcpy(hello.nonce, a->nonce, sizeof a->nonce);
        a->hello_done = true;
    }
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (!rc) rc = gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_HELLO, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_hello(&b, &hello);
    if (!rc) rc = gr_proto_end(&b, 0);
    if (!rc) srv_conn_send(c, b.data, b.len, GR_OP_HELLO);
    else srv_conn_write_error(c, h->op, h->id, rc, gr_errmsg(), true);
    gr_proto_buf_fini(&b);
}

/* Checks the client's proof and answers with the server's own: HMAC(secret, client nonce ||
 * hello nonce), so the client knows the server holds the secret too. */
static int check_auth(gr_server *s, srv_conn *c, const gr_proto_header *h, const uint8_t *body,
                      gr_proto_buf *b)
{
    srv_conn_auth *a = srv_conn_auth_state(c);
    uint8_t cnonce[GR_PROTO_NONCE_SIZE], mac[GR_PROTO_MAC_SIZE], want[GR_PROTO_MAC_SIZE];
    int rc = gr_proto_decode_auth(body, h->body_len, cnonce, mac);
    if (rc) return rc;
    if (!s->secret) return gr_seterr(GR_EAUTH, "this server does not use authentication");
    if (!a->hello_done) return gr_seterr(GR_EAUTH, "auth must follow hello (no nonce issued yet)");
    rc = gr_proto_auth_mac(s->secret, s->cfg.secret_len, a->nonce, cnonce, want);
    if (rc) return rc;
    if (CRYPTO_memcmp(want, mac, sizeof mac) != 0)
        return gr_seterr(GR_EAUTH, "authentication failed: the client's proof does not match "
                         "this server's secret");
    uint8_t proof[GR_PROTO_MAC_SIZE];
    rc = gr_proto_auth_mac(s->secret, s->cfg.secret_len, cnonce, a->nonce, proof);
    if (rc) return rc;
    /* Each nonce proves one login only. */
    a->hello_done = false;
    srv_conn_set_authed(c);
    rc = gr_proto_begin(b, GR_PROTO_RESPONSE, GR_OP_AUTH, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_bytes(b, proof, sizeof proof);
    if (!rc) rc = gr_proto_end(b, 0);
    return rc;
}

void srv_session_auth(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int rc = check_auth(s, c, h, body, &b);
    free(body);
    if (rc) {
        atomic_fetch_add(&s->auth_failures, 1);
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        GR_LOGW("shard %u: %s: %s", s->cfg.shard, srv_conn_peer(c), gr_errmsg());
        srv_conn_write_error(c, h->op, h->id, rc, gr_errmsg(), true);
    } else {
        srv_conn_send(c, b.data, b.len, GR_OP_AUTH);
    }
    gr_proto_buf_fini(&b);
}

