/* Admission's count-min sketch: how often a key not yet in the table has been looked up,
 * without storing the key. Counters are relaxed atomics shared by all partitions; the estimate
 * never undercounts (until aging halves the counters, which lets the sketch forget keys). */
#include "table/table_internal.h"

#include <stdlib.h>

int gr_cms_init(gr_cms *c, uint32_t width)
{
    c->c = calloc((size_t)GR_CMS_DEPTH * width, sizeof *c->c);
    if (!c->c) return gr_seterr(GR_ENOMEM, "cannot allocate the admission sketch");
    for (size_t i = 0; i < (size_t)GR_CMS_DEPTH * width; i++) atomic_init(&c->c[i], 0);
    c->width_mask = width - 1;
    atomic_init(&c->events, 0);
    atomic_flag_clear(&c->aging);
    return GR_OK;
}

void gr_cms_fini(gr_cms *c)
{
    free(c->c);
    c->c = NULL;
}

/* Double hashing over the two halves of a remixed table hash gives the depth indices. */
static inline uint32_t cms_index(const gr_cms *c, uint64_t h, unsigned d)
{
    uint64_t x = h * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    uint32_t a = (uint32_t)x, b = (uint32_t)(x >> 32) | 1u;
    return d * (c->width_mask + 1) + ((a + d * b) & c->width_mask);
}

uint32_t gr_cms_add(gr_cms *c, uint64_t h)
{
    uint32_t est = UINT32_MAX;
    for (unsigned d = 0; d < GR_CMS_DEPTH; d++) {
        atomic_uint *ctr = &c->c[cms_index(c, h, d)];
        uint32_t v = atomic_load_explicit(ctr, memory_order_relaxed);
        if (v != UINT32_MAX) v = atomic_fetch_add_explicit(ctr, 1, memory_order_relaxed) + 1;
        if (v < est) est = v;
    }
    atomic_fetch_add_explicit(&c->events, 1, memory_order_relaxed);
    return est;
}

uint32_t gr_cms_estimate(const gr_cms *c, uint64_t h)
{
    uint32_t est = UINT32_MAX;
    for (unsigned d = 0; d < GR_CMS_DEPTH; d++) {
        uint32_t v = atomic_load_explicit(&c->c[cms_index(c, h, d)], memory_order_relaxed);
        if (v < est) est = v;
    }
    return est;
}

void gr_cms_maybe_age(gr_cms *c)
{
    uint64_t width = (uint64_t)c->width_mask + 1;
    if (atomic_load_explicit(&c->events, memory_order_relaxed) < 8 * width) return;
    if (atomic_flag_test_and_set_explicit(&c->aging, memory_order_acquire)) return;
    if (atomic_load_explicit(&c->events, memory_order_relaxed) >= 8 * width) {
        atomic_store_explicit(&c->events, 0, memory_order_relaxed);
        /* Increments racing with the halving may be lost; the sketch is approximate anyway. */
        for (uint64_t i = 0; i < GR_CMS_DEPTH * width; i++) {
            uint32_t v = atomic_load_explicit(&c->c[i], memory_order_relaxed);
            if (v) atomic_store_explicit(&c->c[i], v >> 1, memory_order_relaxed);
        }
    }
    atomic_flag_clear_explicit(&c->aging, memory_order_release);
}
