/* gr_table_lookup: the table's hottest path (every pull of every worker), with a pipeline of
 * its own. Rows that exist are read without the partition lock (a seqlock read, below); rows
 * below GR_HITS_EXACT hits then take the lock only to count; everything else goes through
 * gr_lookup_locked (table.c), which does what every other batch op does under the lock. The
 * loop runs a group of keys per stage, is specialised per weight size (f32 of the common
 * dims: rows copied by fixed vector moves and prefetched by a fixed number of lines), and is
 * compiled twice, for AVX-512 (x86-64-v4: the group's hashes in one vector loop, 64-byte
 * row moves) and for the x86-64 baseline, chosen at load time. docs/table.md ("Lookup speed,
 * session 5") has the instruction counts that chose each part. */
#include "table/table_internal.h"

#include <string.h>

#define LK_G 8 /* keys per group: the pipeline runs stage A on group g + 2, B on g + 1, C on g */

/* What the stages hand on for a group of keys, an array per field (so that stage A's hashes
 * of a whole group are computed by one vector loop in the AVX-512 build). */
typedef struct lk_group {
    uint64_t h[LK_G];
    gr_part *p[LK_G];
    const uint64_t *e[LK_G]; /* the index array stage A read */
    uint8_t *row[LK_G];      /* the hinted row, after stage B (when there is a hint) */
    uint32_t home[LK_G];
    uint32_t cs[LK_G]; /* e's capacity after stage A, the hint (or GR_NO_ROW) after stage B */
} lk_group;

/* The batch's constants, in locals: the caller's output may alias anything whose address
 * escaped (the build uses -fno-strict-aliasing), so fields read through `t` would be read
 * again after every row copied. */
typedef struct lk_batch {
    uint8_t *rowmem;
    size_t stride;
    gr_part *parts;
    uint32_t pshift;
} lk_batch;

/* The weight bytes of a row as the loop knows them: a constant for the specialised f32 dims
 * (kdim > 0), else the table's. */
#define WBYTES(t, kdim) ((kdim) ? (size_t)(kdim) * 4u : (size_t)(t)->wbytes)

/* Stage A (group g + 2): hashes, partitions, and the prefetch of each key's home bucket in
 * its partition's published index (read without the lock; never NULL, see gr_idx_none). The
 * partition's first line, read here, is the one that lock-free readers share. */
static inline __attribute__((always_inline)) void stage_a(const lk_batch *b, const uint64_t *keys,
                                                          size_t m, lk_group *g)
{
    if (m == LK_G) {
        for (size_t j = 0; j < LK_G; j++) g->h[j] = gr_table_hash_inline(keys[j]);
    } else {
        for (size_t j = 0; j < m; j++) g->h[j] = gr_table_hash_inline(keys[j]);
    }
    for (size_t j = 0; j < m; j++) {
        const uint64_t h = g->h[j];
        gr_part *p = &b->parts[(uint32_t)((h >> 32) >> b->pshift)];
        const uint64_t *e = atomic_load_explicit(&p->pf_idx, memory_order_acquire);
        const uint32_t cap = (uint32_t)gr_idx_load(e - 1);
        const uint32_t home = gr_idx_home((uint32_t)h, cap);
        __builtin_prefetch(e + home, 0, 3);
        g->p[j] = p;
        g->e[j] = e;
        g->home[j] = home;
        g->cs[j] = cap;
    }
}

/* Stage B (group g + 1): each bucket run's first entry with the key's tag, a hint for the
 * row, whose header and weights are prefetched for reading (so that a row read by several
 * cores stays shared in all of them). A hint may be stale or wrong; stage C checks it. */
static inline __attribute__((always_inline)) void stage_b(const gr_table *t, const lk_batch *b,
                                                          size_t m, lk_group *g,
                                                          const uint32_t kdim)
{
    const size_t bytes = sizeof(gr_row_hdr) + WBYTES(t, kdim);
    for (size_t j = 0; j < m; j++) {
        const uint32_t s = gr_idx_probe_hint(g->e[j], g->cs[j], g->home[j], (uint32_t)g->h[j]);
        g->cs[j] = s;
        if (__builtin_expect(s == GR_NO_ROW, 0)) continue;
        const char *row = (const char *)(b->rowmem + s * b->stride);
        g->row[j] = (uint8_t *)row;
        if (kdim) {
            /* A fixed count of prefetches: one per 64 bytes from the row's start, and its
             * last byte, which covers every line whatever the row's offset in its first
             * line. */
            for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(row + o, 0, 3);
            __builtin_prefetch(row + bytes - 1, 0, 3);
        } else {
            const char *a = (const char *)((uintptr_t)row & ~(uintptr_t)63);
            const char *last = (const char *)(((uintptr_t)row + bytes - 1) & ~(uintptr_t)63);
            for (; a <= last; a += 64) __builtin_prefetch(a, 0, 3);
        }
    }
}

/* ---- lock-free lookups ----
 * A lookup whose probe stage found a slot reads that row without the partition lock, as a
 * seqlock reader: it reads the partition's write sequence, the row header (it must hold this
 * key and not be free) and the weights, then the sequence again, and keeps the copy only if
 * the sequence was even and unchanged. Writers (creation, apply, insert, delete, eviction,
 * expiry) hold the lock and make the sequence odd while they change a row. The slot is one of
 * the partition's own (gr_idx_probe_hint), and rows never move between partitions, so a header
 * holding the key while the sequence stood still is the key's row, whole. Nothing is written:
 * the hot rows and partition lines of a Zipf workload stay shared in the caches of every core
 * that reads them, and there is no atomic read-modify-write (whose store-buffer drain waited
 * for the previous row's output stores). Hits are counted per batch (t->lookup_hits) and in
 * the row only when gr_hits_step says so, under the lock.
 * A row below GR_HITS_EXACT hits (a cold row) must count this lookup exactly: it is read the
 * same way, then the lock is taken only to count, and only if the sequence still stands where
 * it stood before the read (so the copy is the row as it is under the lock); otherwise the
 * lookup starts again on the locked path (gr_lookup_locked). */

/* Copies a constant `bytes` of f32 weights: the compiler expands it into fixed vector moves
 * (one 64-byte move each way per 64 bytes in the AVX-512 build, four 16-byte ones in the
 * baseline build), with no call and no size dispatch as in libc's memcpy. (A loop of 64-byte
 * vector types instead made the baseline build copy through stack temporaries, and an AVX2
 * build split each 32-byte access in two under GCC's generic tuning: 59 instructions for 256
 * bytes; so there is no AVX2 build.) */
static inline __attribute__((always_inline)) void copy_f32(float *dst, const uint8_t *src,
                                                           const size_t bytes)
{
    memcpy(dst, src, bytes);
}

/* Reads the row's header and copies its weights out, racing with writers by design: the
 * caller discards the result unless the sequence check passes. Not instrumented by TSan (the
 * race is the protocol); under TSan the copy is a plain loop so that no intercepted memcpy
 * sees it either. Returns the hit count read, or GR_HITS_FREE when the slot is free or holds
 * another key (nothing copied). */
#if defined(__SANITIZE_THREAD__)
static __attribute__((no_sanitize_thread, noinline)) uint32_t
row_read_racy(const gr_table *t, const uint8_t *row, uint64_t key, float *dst, const uint32_t kdim)
{
    const gr_row_hdr *hd = (const gr_row_hdr *)row;
    if (hd->key != key) return GR_HITS_FREE;
    const uint32_t h = hd->meta.hits;
    if (h == GR_HITS_FREE) return h;
    const volatile uint8_t *src = row + sizeof(gr_row_hdr);
    if (t->spec.dtype == GR_DTYPE_F32) {
        uint8_t *d = (uint8_t *)dst;
        for (size_t i = 0; i < WBYTES(t, kdim); i++) d[i] = src[i];
    } else {
        for (uint32_t i = 0; i < t->dim; i++)
            dst[i] = gr_f16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
    }
    return h;
}
#else
static inline __attribute__((always_inline)) uint32_t
row_read_racy(const gr_table *t, const uint8_t *row, uint64_t key, float *dst, const uint32_t kdim)
{
    /* The weights are copied whatever the header says (the slot is committed memory, and a
     * copy that is not kept is overwritten by the locked path): one branch fewer. */
    const gr_row_hdr *hd = (const gr_row_hdr *)row;
    const uint32_t h = hd->key == key ? hd->meta.hits : GR_HITS_FREE;
    if (kdim) {
        copy_f32(dst, row + sizeof(gr_row_hdr), WBYTES(t, kdim));
    } else if (t->spec.dtype == GR_DTYPE_F32) {
        memcpy(dst, row + sizeof(gr_row_hdr), t->wbytes);
    } else {
        const uint16_t *hw = (const uint16_t *)(row + sizeof(gr_row_hdr));
        for (uint32_t i = 0; i < t->dim; i++) dst[i] = gr_f16_to_f32(hw[i]);
    }
    return h;
}
#endif

/* Adds m to the hit count of `key`'s row in `slot`, if it is still there. */
static __attribute__((noinline)) void hits_add_locked_once(gr_table *t, gr_part *p,
                                                           uint32_t slot, uint64_t key,
                                                           uint32_t m)
{
    gr_spin_lock(&p->lock);
    gr_row_hdr *hd = gr_row_hdr_of(gr_row_ptr(t, slot));
    if (hd->key == key && hd->meta.hits != GR_HITS_FREE)
        hd->meta.hits = gr_hits_add(hd->meta.hits, m);
    gr_spin_unlock(&p->lock);
}

/* The batch state the loop keeps in registers: its address never escapes (the locked path
 * gets the caller's gr_lookup_ctx, synchronised around the call), so stores to the output
 * (which, with -fno-strict-aliasing, may alias anything whose address escaped) do not make
 * the compiler reload it. */
typedef struct lk_state {
    uint64_t fast_hits; /* lookups served without the lock */
    uint32_t committed; /* slots known usable: re-read after every locked lookup */
    gr_hit_rng rng;
} lk_state;

/* Counts a cold row's lookup under the lock, if the partition's sequence is still q (no row
 * of it changed since the lock-free read, so that read is the row as it stands now). Hit
 * counts change only under the lock, so the step is taken from the count seen here. */
static inline __attribute__((always_inline)) bool count_cold(gr_table *t, gr_part *p, unsigned q,
                                                             gr_row_hdr *hd, gr_hit_rng *rng)
{
    gr_spin_lock(&p->lock);
    const bool same = atomic_load_explicit(&p->seq, memory_order_relaxed) == q;
    if (same) {
        hd->meta.hits = gr_hits_add(hd->meta.hits, gr_lookup_hits_step(t, rng, hd->meta.hits));
        p->hits++;
    }
    gr_spin_unlock(&p->lock);
    return same;
}

/* Stage C (one key of group g): the seqlock read of the hinted row; hot rows are done there,
 * cold rows count under the lock; anything else takes the locked path. */
static inline __attribute__((always_inline)) void stage_c(gr_table *t, gr_lookup_ctx *c,
                                                          lk_state *st, const lk_group *g,
                                                          size_t j, uint64_t key, float *dst,
                                                          const uint32_t kdim)
{
    const uint32_t s = g->cs[j]; /* GR_NO_ROW is never below committed */
    gr_part *p = g->p[j];
    if (__builtin_expect(s < st->committed, 1)) {
        uint8_t *row = g->row[j];
        const unsigned q = atomic_load_explicit(&p->seq, memory_order_acquire);
        const uint32_t hits = row_read_racy(t, row, key, dst, kdim);
#ifdef __SANITIZE_THREAD__
        const unsigned q2 = atomic_load_explicit(&p->seq, memory_order_acquire);
#else
        atomic_thread_fence(memory_order_acquire);
        const unsigned q2 = atomic_load_explicit(&p->seq, memory_order_relaxed);
#endif
        /* Kept if no writer was active when the read began (q even) nor since (q2 == q). */
        if (__builtin_expect(((q2 ^ q) | (q & 1u)) == 0 && hits != GR_HITS_FREE, 1)) {
            if (__builtin_expect(hits >= GR_HITS_EXACT, 1)) {
                st->fast_hits++;
                const uint32_t m = gr_lookup_hits_step(t, &st->rng, hits);
                if (__builtin_expect(m != 0, 0)) hits_add_locked_once(t, p, s, key, m);
                return;
            }
            if (count_cold(t, p, q, gr_row_hdr_of(row), &st->rng)) return;
        }
    }
    c->rng = st->rng;
    gr_lookup_locked(t, p, key, g->h[j], s, dst, c);
    st->rng = c->rng;
    st->committed = atomic_load_explicit(&t->committed, memory_order_acquire);
}

/* The pipeline over a batch, a group of LK_G keys at a time: stage A runs two groups ahead of
 * stage C, stage B one group ahead, each as a short loop over its group (few live values,
 * so the compiler keeps them in registers). */
static inline __attribute__((always_inline)) void lookup_pipeline(gr_table *t, gr_lookup_ctx *c,
                                                                  const uint64_t *keys,
                                                                  size_t n, float *out,
                                                                  const uint32_t kdim)
{
    const lk_batch b = {t->rowmem, t->stride, t->parts, 32 - t->pbits};
    const size_t dim = kdim ? kdim : t->dim;
    lk_group ring[4];
    lk_state st = {0, atomic_load_explicit(&t->committed, memory_order_acquire), c->rng};
    const size_t ng = (n + LK_G - 1) / LK_G;
#define GROUP_KEYS(x) ((x) + 1 < ng ? (size_t)LK_G : n - (x) * LK_G)
    for (size_t x = 0; x < ng + 2; x++) {
        if (x < ng) stage_a(&b, keys + x * LK_G, GROUP_KEYS(x), &ring[x & 3]);
        if (x >= 1 && x - 1 < ng) stage_b(t, &b, GROUP_KEYS(x - 1), &ring[(x - 1) & 3], kdim);
        if (x >= 2) {
            const size_t y = x - 2, m = GROUP_KEYS(y);
            const uint64_t *ky = keys + y * LK_G;
            float *oy = out + y * LK_G * dim;
            for (size_t j = 0; j < m; j++)
                stage_c(t, c, &st, &ring[y & 3], j, ky[j], oy + j * dim, kdim);
        }
    }
#undef GROUP_KEYS
    c->rng = st.rng;
    if (st.fast_hits)
        atomic_fetch_add_explicit(&t->lookup_hits, st.fast_hits, memory_order_relaxed);
}

/* One build of the loop per instruction set (the resolver picks at load time); each holds a
 * copy of the pipeline per common f32 dim, where the row copy and the prefetches are fixed. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&                           \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define LK_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define LK_CLONES
#endif

LK_CLONES static void lookup_run(gr_table *t, gr_lookup_ctx *c, const uint64_t *keys, size_t n,
                                 float *out)
{
    if (t->spec.dtype == GR_DTYPE_F32) {
        switch (t->dim) {
        case 16: lookup_pipeline(t, c, keys, n, out, 16); return;
        case 32: lookup_pipeline(t, c, keys, n, out, 32); return;
        case 64: lookup_pipeline(t, c, keys, n, out, 64); return;
        case 128: lookup_pipeline(t, c, keys, n, out, 128); return;
        default: break;
        }
    }
    lookup_pipeline(t, c, keys, n, out, 0);
}

int gr_table_lookup(gr_table *t, const uint64_t *keys, size_t n, float *out, unsigned flags)
{
    if (!t) return gr_seterr(GR_EINVAL, "gr_table_lookup: table is NULL");
    if (n > 0 && !keys)
        return gr_seterr(GR_EINVAL, "lookup on table '%s': keys is NULL with n = %zu",
                         t->spec.name, n);
    if (n > 0 && !out)
        return gr_seterr(GR_EINVAL, "lookup on table '%s': out is NULL with n = %zu",
                         t->spec.name, n);
    if (flags & ~GR_LOOKUP_READONLY)
        return gr_seterr(GR_EINVAL, "lookup on table '%s': unknown flags 0x%x", t->spec.name,
                         flags & ~GR_LOOKUP_READONLY);
    if (n == 0) return GR_OK;
    gr_lookup_ctx c = {.create = !(flags & GR_LOOKUP_READONLY), .now = gr_table_clock(t)};
    lookup_run(t, &c, keys, n, out);
    if (c.created) atomic_fetch_add_explicit(&t->nrows, c.created, memory_order_relaxed);
    if (t->use_cms) gr_cms_maybe_age(&t->cms);
    return c.rc;
}
