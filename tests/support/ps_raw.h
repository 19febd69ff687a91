/* Test support: hand-made frames over raw sockets, for the tests that play a broken or
 * hostile peer. One copy for every integration test (they used to carry their own). None of
 * these assert: they return -1 (or PS_RAW_EOF) and the test decides. */
#ifndef GRANARY_TEST_PS_RAW_H
#define GRANARY_TEST_PS_RAW_H

#include "granary/proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PS_RAW_EOF 1 /* ps_raw_read_reply: the connection ended before a whole reply */

/* A raw TCP connection to 127.0.0.1:port with 10 s I/O timeouts. rcvbuf > 0 sets a small
 * receive buffer before connecting (a peer that reads slowly). -1 on failure. */
int ps_raw_connect(uint16_t port, int rcvbuf);
int ps_raw_send_all(int fd, const void *p, size_t n);
/* A request header with every field given (version 1 is the protocol's). */
int ps_raw_send_header(int fd, uint8_t version, uint8_t kind, uint16_t op, uint16_t flags,
                       int32_t status, uint32_t body_len, uint64_t id);
/* A whole request frame (version 1, status 0). */
int ps_raw_send_frame(int fd, uint16_t op, uint16_t flags, uint64_t id, const void *body,
                      uint32_t len);
/* A request frame built in b (the frame starts at 0): gr_proto_begin .. gr_proto_end. */
int ps_raw_send_buf(int fd, const gr_proto_buf *b);
int ps_raw_recv_all(int fd, void *p, size_t n);
/* Reads one response frame: returns its status (0 or a negative gr_err) and fills h; copies
 * an error's text into msg (cap bytes, may be NULL); with body != NULL hands over the body
 * (malloc'd, caller frees). PS_RAW_EOF when the connection ended first, -1000 when the frame
 * is not a response. */
int ps_raw_read_reply(int fd, gr_proto_header *h, char *msg, size_t cap, uint8_t **body);
/* True when the next recv sees the peer's EOF (or a reset), waiting up to the socket's
 * receive timeout. Bytes still buffered are read and counted into *skipped (may be NULL). */
bool ps_raw_at_eof(int fd, size_t *skipped);
/* Builds a PULL (or any KEYS-layout) request of n keys 0..n-1 scaled by stride. */
int ps_raw_keys_frame(gr_proto_buf *b, uint16_t op, uint64_t id, uint32_t table, uint32_t dim,
                      uint32_t n, uint64_t stride);

#endif
