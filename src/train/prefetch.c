/* Rows a hybrid worker may pull before its previous push has landed. With a staleness bound of
 * 0 a worker's pull of batch i+1 must see its own push of batch i; but only the rows of ids
 * that batch i touched can change with that push. The rest (measured: about 70 % of a batch's
 * unique ids on the bench's data) miss none of the worker's own updates once batch i-1 is
 * pushed, which it was before batch i was pulled, so they are pulled while batch i computes.
 * Only the ids common to both batches wait for the push. This file splits a batch's unique
 * ids into those two parts against a set of the previous batch's ids. */
#include "train/trainer_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t slot_of(const tr_prefetch *p, uint64_t key)
{
    /* Ids from a schema's integer column need not be hashed already: mix them. */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & p->mask;
}

int tr_prefetch_init(tr_prefetch *p, size_t cap, uint32_t dim)
{
    memset(p, 0, sizeof *p);
    size_t slots = 16;
    while (slots < 2 * cap) slots *= 2;
    p->mask = slots - 1;
    p->keys = malloc(slots * sizeof *p->keys);
    p->idx = malloc(slots * sizeof *p->idx);
    p->common_prev = malloc((cap ? cap : 1) * sizeof *p->common_prev);
    p->stamp = calloc(slots, sizeof *p->stamp);
    p->fresh_keys = malloc((cap ? cap : 1) * sizeof *p->fresh_keys);
    p->common_keys = malloc((cap ? cap : 1) * sizeof *p->common_keys);
    p->fresh_at = malloc((cap ? cap : 1) * sizeof *p->fresh_at);
    p->common_at = malloc((cap ? cap : 1) * sizeof *p->common_at);
    p->rows = malloc((cap ? cap : 1) * dim * sizeof *p->rows);
    p->gen = 1;
    if (!p->keys || !p->idx || !p->common_prev || !p->stamp || !p->fresh_keys || !p->common_keys || !p->fresh_at ||
        !p->common_at || !p->rows) {
        tr_prefetch_fini(p);
        return gr_seterr(GR_ENOMEM, "cannot allocate the row prefetch for batches of %zu ids", cap);
    }
    return GR_OK;
}

void tr_prefetch_fini(tr_prefetch *p)
{
    free(p->keys);
    free(p->idx);
    free(p->common_prev);
    free(p->stamp);
    free(p->fresh_keys);
    free(p->common_keys);
    free(p->fresh_at);
    free(p->common_at);
    free(p->rows);
    memset(p, 0, sizeof *p);
}

/* The slot holding key in the remembered set, or SIZE_MAX. */
static size_t remembered(const tr_prefetch *p, uint64_t key)
{
    for (size_t s = slot_of(p, key);; s = (s + 1) & p->mask) {
        if (p->stamp[s] != p->gen) return SIZE_MAX;
        if (p->keys[s] == key) return s;
    }
}

void tr_prefetch_split(tr_prefetch *p, const uint64_t *keys, size_t n)
{
    p->nfresh = p->ncommon = 0;
    for (size_t i = 0; i < n; i++) {
        size_t s = remembered(p, keys[i]);
        if (s != SIZE_MAX) {
            p->common_keys[p->ncommon] = keys[i];
            p->common_prev[p->ncommon] = p->idx[s];
            p->common_at[p->ncommon++] = (uint32_t)i;
        } else {
            p->fresh_keys[p->nfresh] = keys[i];
            p->fresh_at[p->nfresh++] = (uint32_t)i;
        }
    }
}

void tr_prefetch_remember(tr_prefetch *p, const uint64_t *keys, size_t n)
{
    /* A new generation empties the set without touching it; at the wrap, clear for real. */
    if (++p->gen == 0) {
        memset(p->stamp, 0, (p->mask + 1) * sizeof *p->stamp);
        p->gen = 1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t s = slot_of(p, keys[i]);
        while (p->stamp[s] == p->gen) {
            if (p->keys[s] == keys[i]) break;
            s = (s + 1) & p->mask;
        }
        p->keys[s] = keys[i];
        p->idx[s] = (uint32_t)i;
        p->stamp[s] = p->gen;
    }
}

void tr_prefetch_place(const float *src, const uint32_t *at, size_t n, uint32_t dim, float *rows)
{
    for (size_t i = 0; i < n; i++)
        memcpy(rows + (size_t)at[i] * dim, src + i * dim, dim * sizeof *rows);
}
