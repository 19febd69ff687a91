/* Test support for the transport comparisons (test_local_transport.c, test_direct_shards.c):
 * the same sequence of calls runs over two transports, everything each run reads back is
 * appended to a trace, and the traces must be equal byte for byte. */
#ifndef GRANARY_TEST_TRANSPORT_TRACE_H
#define GRANARY_TEST_TRANSPORT_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "granary/client.h"

typedef struct tt_trace {
    uint8_t *data;
    size_t len, cap;
} tt_trace;

/* Appends n bytes (aborts when out of memory). */
void tt_trace_add(tt_trace *t, const void *p, size_t n);
/* n keys from seed: half of them repeat a small set (so pushes sum duplicates). */
void tt_fill_keys(uint64_t *keys, size_t n, uint64_t seed);
/* n gradients in [-1, 1] from seed, multiples of 1/1000. */
void tt_fill_grads(float *g, size_t n, uint64_t seed);
/* A client of servers with a 20 s request timeout; NULL (the reason on stderr) on failure. */
gr_client *tt_client(const char *servers);

#endif
