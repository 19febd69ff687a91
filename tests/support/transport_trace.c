/* See transport_trace.h. */
#include "tests/support/transport_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tt_trace_add(tt_trace *t, const void *p, size_t n)
{
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2;
        t->data = realloc(t->data, t->cap);
        if (!t->data) abort();
    }
    memcpy(t->data + t->len, p, n);
    t->len += n;
}

void tt_fill_keys(uint64_t *keys, size_t n, uint64_t seed)
{
    gr_rng r;
    gr_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        keys[i] = (i & 1) ? gr_rng_next(&r) % 40 : gr_hash_key(gr_rng_next(&r), seed);
}

void tt_fill_grads(float *g, size_t n, uint64_t seed)
{
    gr_rng r;
    gr_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) g[i] = (float)((double)(gr_rng_next(&r) % 2001) / 1000.0 - 1.0);
}

gr_client *tt_client(const char *servers)
{
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = servers;
    cfg.request_timeout_ms = 20000;
    gr_client *c = NULL;
    if (gr_client_create(&cfg, &c)) {
        fprintf(stderr, "client for %s: %s\n", servers, gr_errmsg());
        return NULL;
    }
    return c;
}
