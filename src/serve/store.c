/* The replica's row store: weights only, one version per row. A table is split into
 * partitions by key hash; each partition is an open-addressing map (linear probing) guarded by
 * its own rwlock, held for one row at a time, so lookups run beside a publication being
 * applied and never wait for all of it. The trainer's gr_table is not used here because a
 * replica needs what it does not keep (a per-row version for idempotent apply) and none of
 * what it does (optimizer state, admission, eviction). */
#include "serve/serve_int.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SV_PARTS 64u
#define SV_INITIAL 64u

struct sv_part {
    pthread_rwlock_t lock;
    /* cap and the arrays change only under the write lock. They are atomic so that
     * sv_table_get may read them without the lock to prefetch a key's slot (a value a grow
     * replaced only prefetches a line in vain: a prefetch never faults). */
    _Atomic size_t cap; /* power of two */
    size_t n;
    uint64_t *_Atomic keys;
    uint64_t *versions;
    uint8_t *_Atomic used;
    float *_Atomic rows; /* cap * dim */
};

static inline uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

int sv_table_create(uint32_t id, const char *name, uint32_t dim, sv_table **out)
{
    *out = NULL;
    if (dim == 0 || dim > GR_PROTO_DIM_MAX)
        return gr_seterr(GR_EINVAL, "table %u: dim %u is not 1..%u", id, dim, GR_PROTO_DIM_MAX);
    sv_table *t = calloc(1, sizeof *t);
    if (!t || !(t->parts = calloc(SV_PARTS, sizeof *t->parts))) {
        free(t);
        return gr_seterr(GR_ENOMEM, "out of memory for table %u", id);
    }
    t->id = id;
    t->dim = dim;
    t->nparts = SV_PARTS;
    if (name && *name) snprintf(t->name, sizeof t->name, "%s", name);
    else snprintf(t->name, sizeof t->name, "table-%u", id);
    for (uint32_t i = 0; i < SV_PARTS; i++) pthread_rwlock_init(&t->parts[i].lock, NULL);
    *out = t;
    return GR_OK;
}

void sv_table_destroy(sv_table *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->nparts; i++) {
        sv_part *p = &t->parts[i];
        pthread_rwlock_destroy(&p->lock);
        free(p->keys);
        free(p->versions);
        free(p->used);
        free(p->rows);
    }
    free(t->parts);
    free(t);
}

/* Index of key in p, or -1. Under p->lock (either mode). */
static long find(const sv_part *p, uint64_t key, uint64_t h)
{
    size_t cap = p->cap;
    if (!cap) return -1;
    const uint8_t *used = p->used;
    const uint64_t *ks = p->keys;
    size_t mask = cap - 1;
    for (size_t i = (h >> 6) & mask;; i = (i + 1) & mask) {
        if (!used[i]) return -1;
        if (ks[i] == key) return (long)i;
    }
}

static inline void prefetch_at(const void *base, size_t off)
{
    __builtin_prefetch((const void *)((uintptr_t)base + off));
}

/* Starts loading the lines key's lookup will touch (its slot's flag, key and row), without
 * the lock: rows are scattered over the whole store, and one lookup after another each waited
 * for its own cache misses (the store was 12 % of a one-example request's CPU). */
static void prefetch_slot(const sv_table *t, uint64_t key)
{
    uint64_t h = mix(key);
    const sv_part *p = &t->parts[h & (t->nparts - 1)];
    size_t cap = atomic_load_explicit(&p->cap, memory_order_relaxed);
    if (!cap) return;
    size_t i = (h >> 6) & (cap - 1), rb = t->dim * sizeof(float);
    prefetch_at(atomic_load_explicit(&p->used, memory_order_relaxed), i);
    prefetch_at(atomic_load_explicit(&p->keys, memory_order_relaxed), i * sizeof(uint64_t));
    const float *rows = atomic_load_explicit(&p->rows, memory_order_relaxed);
    prefetch_at(rows, i * rb);
    prefetch_at(rows, i * rb + rb - 1);
}

void sv_table_get(sv_table *t, const uint64_t *keys, size_t n, float *out, bool *found)
{
    enum { AHEAD = 8 }; /* lookups in flight: enough to overlap their misses */
    size_t rb = t->dim * sizeof(float);
    for (size_t i = 0; i < n && i < AHEAD; i++) prefetch_slot(t, keys[i]);
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n) prefetch_slot(t, keys[i + AHEAD]);
        uint64_t h = mix(keys[i]);
        sv_part *p = &t->parts[h & (t->nparts - 1)];
        pthread_rwlock_rdlock(&p->lock);
        long at = find(p, keys[i], h);
        if (at >= 0) memcpy(out + i * t->dim, (const float *)p->rows + (size_t)at * t->dim, rb);
        pthread_rwlock_unlock(&p->lock);
        if (at < 0) memset(out + i * t->dim, 0, rb);
        if (found) found[i] = at >= 0;
    }
}

/* Doubles p's capacity (or makes the first one) and rehashes. Under the write lock. */
static int grow(sv_part *p, uint32_t dim)
{
    size_t cap = p->cap ? p->cap * 2 : SV_INITIAL;
    uint64_t *keys = malloc(cap * sizeof *keys), *vers = malloc(cap * sizeof *vers);
    uint8_t *used = calloc(cap, 1);
    float *rows = malloc(cap * dim * sizeof *rows);
    if (!keys || !vers || !used || !rows) {
        free(keys), free(vers), free(used), free(rows);
        return gr_seterr(GR_ENOMEM, "replica table: out of memory growing to %zu rows", cap);
    }
    for (size_t i = 0; i < p->cap; i++) {
        if (!p->used[i]) continue;
        size_t j = (mix(p->keys[i]) >> 6) & (cap - 1);
        while (used[j]) j = (j + 1) & (cap - 1);
        used[j] = 1;
        keys[j] = p->keys[i];
        vers[j] = p->versions[i];
        memcpy(rows + j * dim, p->rows + i * dim, dim * sizeof *rows);
    }
    free(p->keys), free(p->versions), free(p->used), free(p->rows);
    p->keys = keys;
    p->versions = vers;
    p->used = used;
    p->rows = rows;
    p->cap = cap;
    return GR_OK;
}

int sv_table_put(sv_table *t, const uint64_t *keys, size_t n, const float *rows, uint64_t version,
                 uint64_t *written, uint64_t *ignored)
{
    uint64_t w = 0, ig = 0;
    int rc = GR_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t h = mix(keys[i]);
        sv_part *p = &t->parts[h & (t->nparts - 1)];
        pthread_rwlock_wrlock(&p->lock);
        long at = find(p, keys[i], h);
        if (at < 0) {
            if ((p->n + 1) * 10 > p->cap * 7 && (rc = grow(p, t->dim))) {
                pthread_rwlock_unlock(&p->lock);
                break;
            }
            size_t j = (h >> 6) & (p->cap - 1);
            while (p->used[j]) j = (j + 1) & (p->cap - 1);
            p->used[j] = 1;
            p->keys[j] = keys[i];
            p->n++;
            at = (long)j;
        } else if (p->versions[at] >= version) {
            pthread_rwlock_unlock(&p->lock);
            ig++;
            continue;
        }
        p->versions[at] = version;
        memcpy(p->rows + (size_t)at * t->dim, rows + i * t->dim, t->dim * sizeof *rows);
        pthread_rwlock_unlock(&p->lock);
        w++;
    }
    if (written) *written += w;
    if (ignored) *ignored += ig;
    return rc;
}

uint64_t sv_table_rows(sv_table *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        pthread_rwlock_rdlock(&t->parts[i].lock);
        n += t->parts[i].n;
        pthread_rwlock_unlock(&t->parts[i].lock);
    }
    return n;
}
