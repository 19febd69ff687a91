/* Key deduplication (unique keys + inverse index), used by the client before routing and by
 * anyone who sums gradients of repeated keys. Open addressing over a power-of-two table. */
#include "granary/core.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY_IDX UINT32_MAX

static int ensure_scratch(gr_dedup_scratch *sc, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (sc->cap >= cap) return GR_OK;
    free(sc->slots);
    free(sc->idx);
    sc->slots = malloc(cap * sizeof *sc->slots);
    sc->idx = malloc(cap * sizeof *sc->idx);
    if (!sc->slots || !sc->idx) {
        free(sc->slots);
        free(sc->idx);
        sc->slots = NULL;
        sc->idx = NULL;
        sc->cap = 0;
        return gr_seterr(GR_ENOMEM, "dedup: cannot allocate a map for %zu keys", n);
    }
    sc->cap = cap;
    return GR_OK;
}

long gr_dedup(const uint64_t *keys, size_t n, uint64_t *uniq, uint32_t *inverse,
              gr_dedup_scratch *scratch)
{
    if (n > UINT32_MAX / 2) return gr_seterr(GR_ETOOBIG, "dedup: %zu keys is too many", n);
    gr_dedup_scratch local = {0};
    gr_dedup_scratch *sc = scratch ? scratch : &local;
    int rc = ensure_scratch(sc, n);
    if (rc) return rc;
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    size_t mask = cap - 1;
    memset(sc->idx, 0xff, cap * sizeof *sc->idx);
    uint32_t nu = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = keys[i];
        /* Fibonacci hashing: keys are often already hashes, but not always. */
        size_t h = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20) & mask;
        for (;;) {
            uint32_t ix = sc->idx[h];
            if (ix == EMPTY_IDX) {
                sc->idx[h] = nu;
                sc->slots[h] = k;
                uniq[nu] = k;
                inverse[i] = nu++;
                break;
            }
            if (sc->slots[h] == k) {
                inverse[i] = ix;
                break;
            }
            h = (h + 1) & mask;
        }
    }
    if (!scratch) gr_dedup_scratch_fini(&local);
    return (long)nu;
}

void gr_dedup_scratch_fini(gr_dedup_scratch *sc)
{
    if (!sc) return;
    free(sc->slots);
    free(sc->idx);
    sc->slots = NULL;
    sc->idx = NULL;
    sc->cap = 0;
}
