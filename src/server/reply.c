/* Replies written after a request's own handler returned (parked acquires, checkpoints): they
 * go through conn.c without blocking and count into the opcode's bytes_out. */
#include "server/server_int.h"

void srv_conn_send(srv_conn *c, const void *frame, size_t n, unsigned op)
{
    gr_server *s = srv_conn_ctx(c);
    gr_proto_buf b = {(uint8_t *)frame, n, n};
    size_t w = srv_conn_write(c, &b, false);
    if (op < GR_PROTO_OP_LIMIT) atomic_fetch_add(&s->ops[op].bytes_out, w);
}

void srv_conn_send_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg)
{
    srv_conn_write_error(c, op, id, rc, msg, false);
}

