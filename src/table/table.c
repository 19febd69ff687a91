/* The table engine: the row arena, the partitions with their open-addressing indexes, and
 * the batch operations (apply, get, insert, delete; lookups: lookup.c), which run as a
 * three-stage software pipeline over the caller's keys (index buckets prefetched two
 * keys-distances ahead, rows one distance ahead), taking each key's partition lock only for
 * that key. */
#include "table/table_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef PF_D
#define PF_D 6 /* pipeline distance (keys) between stages */
#endif
#define PF_RING 32 /* ring of per-key pipeline state; power of two > 2 * PF_D */
#define COMMIT_ROWS 32768u  /* the arena is committed in multiples of this many slots */
#define HUGE_PAGE (2u << 20)
/* Rows past this offset are advised for huge pages: all of them. With the first 8 MiB on
 * 4 KiB pages (before session 7) a bench ps shard (26 tables of ~10 MB) kept four rows in five
 * on small pages, and the rows a Zipf batch touches most, created first, all of them: push CPU
 * per batch 0.94x and push rows/s 9.31x → 11.47x Redis (medians of 3 alternating runs against
 * 8 MiB; 2 MiB gained nothing), shards' push CPU −13 % in session 6 (docs/server.md). The
 * price: a table with a handful of rows pins a 2 MiB page. */
#define HUGE_FROM 0u
#define EVICT_SAMPLES 8
#define EVICT_SAMPLE_ALL 16 /* partitions with this few slots are searched exhaustively */

uint64_t gr_table_hash(uint64_t key)
{
    return XXH3_64bits_withSeed(&key, sizeof key, GR_TABLE_HASH_SEED);
}

const uint64_t gr_idx_none[2] = {1, GR_IDX_EMPTY};

/* ---- memory accounting ---- */

static int mem_take(gr_table *t, uint64_t bytes)
{
    uint64_t lim = t->spec.mem_limit;
    unsigned long long cur = atomic_load_explicit(&t->mem_used, memory_order_relaxed);
    for (;;) {
        if (lim && cur + bytes > lim) return GR_ENOMEM;
        if (atomic_compare_exchange_weak_explicit(&t->mem_used, &cur, cur + bytes,
                                                  memory_order_relaxed, memory_order_relaxed))
            return GR_OK;
    }
}

static void mem_give(gr_table *t, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&t->mem_used, bytes, memory_order_relaxed);
}

static int cap_error(gr_table *t)
{
    return gr_seterr(GR_ENOMEM,
                     "table '%s' reached its memory cap of %" PRIu64 " bytes at %llu rows; raise "
                     "mem_limit or set a capacity",
                     t->spec.name, t->spec.mem_limit,
                     (unsigned long long)atomic_load_explicit(&t->nrows, memory_order_relaxed));
}

static int oom_error(gr_table *t, size_t bytes)
{
    return gr_seterr(GR_ENOMEM, "table '%s': out of memory allocating %zu bytes", t->spec.name,
                     bytes);
}

/* realloc under the memory cap: accounts the size change. */
static int grow_array(gr_table *t, void **ptr, size_t old_bytes, size_t new_bytes)
{
    if (mem_take(t, new_bytes - old_bytes)) return cap_error(t);
    void *n = realloc(*ptr, new_bytes);
    if (!n) {
        mem_give(t, new_bytes - old_bytes);
        return oom_error(t, new_bytes);
    }
    *ptr = n;
    return GR_OK;
}

/* ---- the row arena ---- */

static void *reserve(size_t len)
{
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static size_t page_up(size_t n)
{
    return (n + 4095) & ~(size_t)4095;
}

/* Makes slots [t->committed, upto) usable. Caller holds alloc_lock. */
static int arena_commit(gr_table *t, uint32_t upto)
{
    uint64_t want = ((uint64_t)upto + COMMIT_ROWS - 1) / COMMIT_ROWS * COMMIT_ROWS;
    if (want > t->max_rows) want = t->max_rows;
    const uint32_t have = atomic_load_explicit(&t->committed, memory_order_relaxed);
    size_t r0 = (size_t)have * t->stride, r1 = (size_t)want * t->stride;
    size_t l0 = have / 8, l1 = page_up(want / 8);
    size_t d0 = have / 2, d1 = page_up(want / 2);
    r0 &= ~(size_t)4095;
    l0 &= ~(size_t)4095;
    d0 &= ~(size_t)4095;
    /* Row memory is opened in whole 2 MiB pages (rowmem is 2 MiB aligned): a protection
     * boundary inside a huge page's range keeps the kernel from backing that range with one,
     * which left about one row in ten on 4 KiB pages (the commit step is 8.25 huge pages). */
    size_t r1h = (r1 + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    size_t rend = t->res_rows_len - (size_t)(t->rowmem - (uint8_t *)t->res_rows);
    if (r1h > rend) r1h = rend & ~(size_t)4095;
    if (r1h < page_up(r1)) r1h = page_up(r1);
    if (mprotect(t->rowmem + r0, r1h - r0, PROT_READ | PROT_WRITE) != 0 ||
        mprotect((uint8_t *)t->live + l0, l1 - l0, PROT_READ | PROT_WRITE) != 0 ||
        mprotect((uint8_t *)t->dirty + d0, d1 - d0, PROT_READ | PROT_WRITE) != 0)
        return gr_seterr(GR_ENOMEM, "table '%s': cannot commit memory for %llu rows",
                         t->spec.name, (unsigned long long)want);
#ifdef MADV_HUGEPAGE
    /* Huge pages save most TLB misses on random row access (HUGE_FROM says which rows). */
    const size_t until = t->huge_until;
    size_t h0 = r0 > HUGE_FROM ? r0 : HUGE_FROM, h1 = r1h < until ? r1h : until;
    if (h1 > h0) madvise(t->rowmem + h0, h1 - h0, MADV_HUGEPAGE);
#endif
#ifdef MADV_NOHUGEPAGE
    /* Past gr_table_set_huge_rows' limit: 4 KiB pages, also where THP is "always". */
    size_t s0 = r0 > until ? r0 : until;
    if (r1h > s0) madvise(t->rowmem + s0, r1h - s0, MADV_NOHUGEPAGE);
#endif
    /* Published after the pages are usable: lock-free readers trust slots below it. */
    atomic_store_explicit(&t->committed, (uint32_t)want, memory_order_release);
    return GR_OK;
}

/* Hands a whole chunk of slots to a partition; returns its first slot. */
static int chunk_carve(gr_table *t, uint32_t *first)
{
    pthread_mutex_lock(&t->alloc_lock);
    int rc = GR_OK;
    if ((uint64_t)t->carved + t->chunk_rows > t->max_rows) {
        rc = gr_seterr(GR_ENOMEM,
                       "table '%s' filled its reserved row space of %u slots; set mem_limit or "
                       "capacity to size it",
                       t->spec.name, t->max_rows);
    } else if (t->carved + t->chunk_rows > atomic_load_explicit(&t->committed, memory_order_relaxed)) {
        rc = arena_commit(t, t->carved + t->chunk_rows);
    }
    if (rc == GR_OK) {
        *first = t->carved;
        t->carved += t->chunk_rows;
    }
    pthread_mutex_unlock(&t->alloc_lock);
    return rc;
}

/* ---- index memory ----
 * Index arrays come from per-table regions of reserved address space that are never unmapped
 * while the table lives, so the probe stage may read a partition's index without its lock:
 * what it reads may be stale (even a retired array, whose pages are handed back to the kernel
 * and then read as zeros), but never unmapped. Stage C re-checks everything under the lock.
 * Each array starts with a header word holding its capacity, so a lock-free reader always
 * pairs an array with its own size. Entries are read and written with relaxed atomics. */

#define IREGION_FIRST (8u << 20)
#define IDX_PAGE_ALIGN GR_IDX_PAGE_ALIGN

#define ild gr_idx_load
static inline void ist(uint64_t *e, uint64_t v) { __atomic_store_n(e, v, __ATOMIC_RELAXED); }

/* Returns `bytes` of zero-filled-on-first-touch index memory. Caller holds no lock but the
 * partition's; alloc_lock is taken here. */
static uint64_t *idx_alloc(gr_table *t, size_t bytes)
{
    size_t align = bytes >= IDX_PAGE_ALIGN ? IDX_PAGE_ALIGN : 64;
    uint64_t *out = NULL;
    pthread_mutex_lock(&t->alloc_lock);
    gr_iregion *r = t->nireg ? &t->ireg[t->nireg - 1] : NULL;
    size_t off = r ? (r->used + align - 1) & ~(align - 1) : 0;
    if (!r || off + bytes > r->len) {
        if (t->nireg == GR_IREGIONS) goto done;
        size_t len = r ? r->len * 2 : IREGION_FIRST;
        while (len < bytes) len *= 2;
        /* Regions past the first start on a 2 MiB boundary and are opened in whole 2 MiB
         * steps, so that the kernel can back them with huge pages: a bucket read is a random
         * access, and on 4 KiB pages nearly every one missed the TLB. */
        bool huge = len > IREGION_FIRST;
        size_t extra = huge ? HUGE_PAGE : 0;
        void *m = reserve(len + extra);
        if (!m) goto done;
        r = &t->ireg[t->nireg++];
        r->map = m;
        r->map_len = len + extra;
        r->base = huge ? (uint8_t *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1))
                       : m;
        r->len = len;
        r->used = 0;
        r->committed = 0;
#ifdef MADV_HUGEPAGE
        if (huge) madvise(r->base, len, MADV_HUGEPAGE);
#endif
        off = 0;
    }
    if (off + bytes > r->committed) {
        size_t want = page_up(off + bytes + (1u << 20));
        if (r->len > IREGION_FIRST) want = (want + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        if (want > r->len) want = r->len;
        if (mprotect(r->base + r->committed, want - r->committed, PROT_READ | PROT_WRITE) != 0)
            goto done;
        r->committed = want;
    }
    r->used = off + bytes;
    out = (uint64_t *)(r->base + off);
done:
    pthread_mutex_unlock(&t->alloc_lock);
    return out;
}

#define idx_block_bytes gr_idx_block_bytes

/* ---- memory opened ahead of a fill (gr_table_prefault, prefault.c) ---- */

int gr_table_arena_open(gr_table *t, uint32_t slots, gr_mem_range out[3])
{
    pthread_mutex_lock(&t->alloc_lock);
    int rc = GR_OK;
    if (slots > t->max_rows) slots = t->max_rows;
    if (slots > atomic_load_explicit(&t->committed, memory_order_relaxed))
        rc = arena_commit(t, slots);
    uint32_t have = atomic_load_explicit(&t->committed, memory_order_relaxed);
    out[0] = (gr_mem_range){t->rowmem, page_up((size_t)have * t->stride)};
    out[1] = (gr_mem_range){(uint8_t *)t->live, page_up(have / 8)};
    out[2] = (gr_mem_range){(uint8_t *)t->dirty, page_up(have / 2)};
    pthread_mutex_unlock(&t->alloc_lock);
    return rc;
}

int gr_table_arena_ahead(gr_table *t, size_t ahead, gr_mem_range *out)
{
    *out = (gr_mem_range){NULL, 0};
    pthread_mutex_lock(&t->alloc_lock);
    int rc = GR_OK;
    /* Nothing before the first row: a table that never grows keeps no memory it does not use. */
    if (t->carved) {
        size_t carved = (size_t)t->carved * t->stride;
        uint64_t want = (carved + ahead + t->stride - 1) / t->stride;
        if (want > t->max_rows) want = t->max_rows;
        if (want > atomic_load_explicit(&t->committed, memory_order_relaxed))
            rc = arena_commit(t, (uint32_t)want);
        size_t have = (size_t)atomic_load_explicit(&t->committed, memory_order_relaxed) * t->stride;
        size_t from = t->ahead_end > carved ? t->ahead_end : carved & ~(size_t)4095;
        size_t to = carved + ahead < have ? carved + ahead : have;
        to &= ~(size_t)4095;
        if (!rc && to > from) *out = (gr_mem_range){t->rowmem + from, to - from};
    }
    pthread_mutex_unlock(&t->alloc_lock);
    return rc;
}

void gr_table_ahead_done(gr_table *t, size_t end, uint64_t bytes)
{
    pthread_mutex_lock(&t->alloc_lock);
    if (end > t->ahead_end) t->ahead_end = end;
    t->ahead_bytes += bytes;
    pthread_mutex_unlock(&t->alloc_lock);
}

int gr_table_idx_open(gr_table *t, size_t bytes, gr_mem_range *out)
{
    pthread_mutex_lock(&t->alloc_lock);
    int rc = GR_OK;
    /* Huge-page aligned and sized, as idx_alloc's later regions are. */
    size_t len = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    if (len < IREGION_FIRST) len = IREGION_FIRST;
    void *m = NULL;
    if (t->nireg) {
        rc = gr_seterr(GR_EINVAL, "table '%s' has index memory already", t->spec.name);
    } else if (!(m = reserve(len + HUGE_PAGE))) {
        rc = oom_error(t, len);
    } else {
        uint8_t *base = (uint8_t *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
        madvise(base, len, MADV_HUGEPAGE);
#endif
        if (mprotect(base, len, PROT_READ | PROT_WRITE) != 0) {
            munmap(m, len + HUGE_PAGE);
            rc = oom_error(t, len);
        } else {
            gr_iregion *r = &t->ireg[t->nireg++];
            *r = (gr_iregion){base, len, 0, len, m, len + HUGE_PAGE};
            *out = (gr_mem_range){base, len};
        }
    }
    pthread_mutex_unlock(&t->alloc_lock);
    return rc;
}


/* Gives a retired block's whole pages back to the kernel; the mapping stays. Blocks under a
 * page stay as they are (and stay counted: at most a few KiB per partition). Returns the
 * bytes no longer counted. */
static size_t idx_retire(uint64_t *blk, size_t bytes)
{
    if (bytes < IDX_PAGE_ALIGN) return 0;
    size_t len = bytes & ~(size_t)(IDX_PAGE_ALIGN - 1);
    madvise(blk, len, MADV_DONTNEED);
    return bytes;
}

/* ---- index ---- */

static void idx_put(gr_part *p, uint64_t entry)
{
    uint32_t cap = p->cap;
    uint32_t i = gr_idx_home((uint32_t)entry, cap);
    while (ild(&p->idx[i]) != GR_IDX_EMPTY)
        if (++i == cap) i = 0;
    ist(&p->idx[i], entry);
}

/* Grows one partition's index by rehashing its entries from their stored tags (no row is
 * read). Only this partition is locked while it happens. */
static int idx_grow_to(gr_table *t, gr_part *p, uint32_t nc);

static int idx_grow(gr_table *t, gr_part *p)
{
    return idx_grow_to(t, p, gr_idx_next_cap(p->cap));
}

/* Rehashes p's index into a new array of nc buckets (a capacity of gr_idx_next_cap's
 * sequence, so memory is counted as step-by-step growth would count it). */
static int idx_grow_to(gr_table *t, gr_part *p, uint32_t nc)
{
    uint32_t old = p->cap;
    if (nc <= old) return gr_seterr(GR_ECAPACITY, "table '%s': partition index is full", t->spec.name);
    size_t nb = idx_block_bytes(nc);
    if (mem_take(t, nb)) return cap_error(t);
    uint64_t *blk = idx_alloc(t, nb);
    if (!blk) {
        mem_give(t, nb);
        return oom_error(t, nb);
    }
    /* Filled before it is published (release), so lock-free readers see it whole. */
    memset(blk, 0xff, nb);
    blk[0] = nc;
    uint64_t *ni = blk + 1, *oi = p->idx;
    for (uint32_t i = 0; i < old; i++) {
        uint64_t x = oi[i];
        if (x == GR_IDX_EMPTY) continue;
        uint32_t j = gr_idx_home((uint32_t)x, nc);
        while (ni[j] != GR_IDX_EMPTY)
            if (++j == nc) j = 0;
        ni[j] = x;
    }
    p->idx = ni;
    p->cap = nc;
    atomic_store_explicit(&p->pf_idx, ni, memory_order_release);
    if (oi) mem_give(t, idx_retire(oi - 1, idx_block_bytes(old)));
    return GR_OK;
}

/* Backward-shift deletion: no tombstones, so probe lengths stay those of the live entries. */
static void idx_erase(gr_part *p, uint32_t i)
{
    uint32_t cap = p->cap, j = i;
    uint64_t *e = p->idx;
    for (;;) {
        if (++j == cap) j = 0;
        uint64_t x = ild(&e[j]);
        if (x == GR_IDX_EMPTY) break;
        uint32_t home = gr_idx_home((uint32_t)x, cap);
        uint32_t dj = j >= home ? j - home : j + cap - home;
        uint32_t di = j >= i ? j - i : j + cap - i;
        if (dj >= di) {
            ist(&e[i], x);
            i = j;
        }
    }
    ist(&e[i], GR_IDX_EMPTY);
}

uint32_t gr_part_find_locked(const gr_table *t, gr_part *p, uint64_t key, uint64_t h,
                             uint32_t *pos)
{
    uint32_t cap = p->cap;
    if (!cap) return GR_NO_ROW;
    uint32_t tag = (uint32_t)h, i = gr_idx_home(tag, cap);
    const uint64_t *e = p->idx;
    for (;;) {
        uint64_t x = e[i];
        if (x == GR_IDX_EMPTY) return GR_NO_ROW;
        if ((uint32_t)x == tag) {
            uint32_t s = (uint32_t)(x >> 32);
            if (gr_row_hdr_of(gr_row_ptr(t, s))->key == key) {
                if (pos) *pos = i;
                return s;
            }
        }
        if (++i == cap) i = 0;
    }
}

/* ---- row slots ---- */

static void dirty_clear(gr_table *t, gr_part *p, uint32_t s)
{
    uint64_t *w = &t->dirty[s >> 4];
    unsigned sh = (s & 15u) * 4u;
    uint64_t old = (*w >> sh) & 0xfu;
    if (!old) return;
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) p->dirty_n[k] -= (old >> k) & 1u;
    *w &= ~(0xfull << sh);
}

static inline void dirty_mark(gr_table *t, gr_part *p, uint32_t s)
{
    uint64_t *w = &t->dirty[s >> 4];
    unsigned sh = (s & 15u) * 4u;
    uint64_t old = (*w >> sh) & 0xfu;
    if (old == 0xfu) return;
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) p->dirty_n[k] += !((old >> k) & 1u);
    *w |= 0xfull << sh;
}

static int slot_alloc(gr_table *t, gr_part *p, uint32_t *out)
{
    if (p->free_head != GR_NO_ROW) {
        uint32_t s = p->free_head;
        p->free_head = (uint32_t)gr_row_hdr_of(gr_row_ptr(t, s))->key;
        *out = s;
        return GR_OK;
    }
    if (p->nchunks == 0 || p->last_used == t->chunk_rows) {
        /* Account the chunk (rows and their bitset bits) before taking it. */
        uint64_t cb = gr_chunk_bytes(t->chunk_rows, t->stride);
        if (p->nchunks == p->chunks_cap) {
            uint32_t nc = p->chunks_cap ? p->chunks_cap * 2 : 4;
            int rc = grow_array(t, (void **)&p->chunk_ids, p->chunks_cap * sizeof(uint32_t),
                                nc * sizeof(uint32_t));
            if (rc) return rc;
            p->chunks_cap = nc;
        }
        if (mem_take(t, cb)) return cap_error(t);
        uint32_t first;
        int rc = chunk_carve(t, &first);
        if (rc) {
            mem_give(t, cb);
            return rc;
        }
        p->chunk_ids[p->nchunks++] = first >> t->chunk_shift;
        p->last_used = 0;
    }
    *out = (p->chunk_ids[p->nchunks - 1] << t->chunk_shift) + p->last_used++;
    return GR_OK;
}

/* Removes the row in `slot` whose index entry is at `pos`. Caller holds the lock. */
void gr_part_remove_locked(gr_table *t, gr_part *p, uint32_t pos, uint32_t slot)
{
    idx_erase(p, pos);
    t->live[slot >> 6] &= ~(1ull << (slot & 63));
    dirty_clear(t, p, slot);
    gr_row_hdr *hd = gr_row_hdr_of(gr_row_ptr(t, slot));
    hd->key = p->free_head;
    hd->meta.hits = GR_HITS_FREE; /* a free slot can never pass a lookup's key check */
    p->free_head = slot;
    p->rows--;
    atomic_fetch_sub_explicit(&t->nrows, 1, memory_order_relaxed);
}

static inline uint64_t part_rand(gr_part *p)
{
    return gr_splitmix64(&p->rng);
}

/* Sampled LRU: look at a few live rows and evict the one updated longest ago, ties going to
 * the one with the fewest hits. Small partitions are searched exhaustively. */
static void evict_one_locked(gr_table *t, gr_part *p)
{
    uint32_t best = GR_NO_ROW;
    gr_row_meta bm = {0, 0};
    const uint32_t span = gr_part_span(t, p);
    unsigned got = 0;
    for (uint32_t k = 0, tries = 0; got < EVICT_SAMPLES || span <= EVICT_SAMPLE_ALL; k++) {
        uint32_t pos;
        if (span <= EVICT_SAMPLE_ALL) {
            if (k >= span) break;
            pos = k;
        } else {
            if (++tries > 64 * EVICT_SAMPLES) break;
            pos = (uint32_t)(part_rand(p) % span);
        }
        uint32_t s = gr_part_slot(t, p, pos);
        if (!gr_live_get(t, s)) continue;
        got++;
        gr_row_meta m = gr_row_hdr_of(gr_row_ptr(t, s))->meta;
        if (best == GR_NO_ROW || m.last_update < bm.last_update ||
            (m.last_update == bm.last_update && m.hits < bm.hits)) {
            best = s;
            bm = m;
        }
    }
    for (uint32_t k = 0; best == GR_NO_ROW && k < span; k++) /* sampling found nothing live */
        if (gr_live_get(t, gr_part_slot(t, p, k))) best = gr_part_slot(t, p, k);
    if (best == GR_NO_ROW) return;
    uint64_t key = gr_row_hdr_of(gr_row_ptr(t, best))->key;
    uint32_t pos;
    uint32_t s = gr_part_find_locked(t, p, key, gr_table_hash(key), &pos);
    if (s != best) return; /* cannot happen: every live row is indexed */
    gr_part_remove_locked(t, p, pos, best);
    p->evictions++;
}

/* Creates the row for a missing key. With init, weights and state come from the initializer;
 * without, the caller fills them. Fallible steps all run before anything is committed. The
 * table's row count (t->nrows) is the caller's to add, once per batch (`*created` counts
 * here): one atomic add per batch instead of a locked instruction per new row, which waited
 * for the new row's stores (misses, in fresh memory) to drain. */
static int row_create(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t now, bool init,
                      uint32_t *out, uint64_t *created)
{
    if (p->rows >= p->row_cap) evict_one_locked(t, p);
    const bool grow = (uint64_t)(p->rows + 1) * GR_IDX_LOAD_DEN > (uint64_t)p->cap * GR_IDX_LOAD_NUM;
    if (grow || (p->free_head == GR_NO_ROW && (p->nchunks == 0 || p->last_used == t->chunk_rows))) {
        /* About to allocate (index or chunk), which may fail with a message that names the
         * table's row count: the batch's rows so far are counted first. */
        atomic_fetch_add_explicit(&t->nrows, *created, memory_order_relaxed);
        *created = 0;
    }
    if (grow) {
        int rc = idx_grow(t, p);
        if (rc) return rc;
    }
    uint32_t s = GR_NO_ROW;
    int rc = slot_alloc(t, p, &s);
    if (rc) return rc;
    uint8_t *row = gr_row_ptr(t, s);
    gr_row_hdr *hd = gr_row_hdr_of(row);
    hd->key = key;
    hd->meta.last_update = now;
    hd->meta.hits = 0;
    if (init) {
        if (t->spec.dtype == GR_DTYPE_F32) {
            gr_table_init_row(t, key, gr_row_weights(row));
        } else {
            float w[GR_TABLE_DIM_MAX];
            gr_table_init_row(t, key, w);
            uint16_t *hw = gr_row_weights(row);
            for (uint32_t i = 0; i < t->dim; i++) hw[i] = gr_f32_to_f16(w[i]);
        }
        gr_table_init_state(t, gr_row_state(t, row));
    }
    idx_put(p, ((uint64_t)s << 32) | (uint32_t)h);
    t->live[s >> 6] |= 1ull << (s & 63);
    p->rows++;
    (*created)++;
    *out = s;
    return GR_OK;
}

/* ---- create / destroy ---- */

void gr_table_geometry_of(const gr_table_spec *spec, gr_table_geometry *g)
{
    /* f16 weights of an odd dim are padded to 4 bytes so the f32 state after them is
     * aligned. */
    g->wbytes = spec->dtype == GR_DTYPE_F16 ? (spec->dim * 2u + 3u) & ~3u : spec->dim * 4u;
    uint32_t stride = (uint32_t)sizeof(gr_row_hdr) + g->wbytes + 4u * gr_table_state_floats(spec);
    g->stride = (stride + 7u) & ~7u;
    uint32_t rows = 64;
    while ((uint64_t)rows * g->stride < GR_CHUNK_TARGET) rows *= 2;
    g->chunk_rows = rows;
    /* A capacity below the partition count would leave partitions with no room at all. */
    uint32_t np = spec->partitions ? spec->partitions : 256;
    if (spec->capacity && spec->capacity < np)
        while (np > spec->capacity) np /= 2;
    g->nparts = np;
    g->base_bytes = sizeof(gr_table) + (uint64_t)np * sizeof(gr_part);
    if (spec->admit_min_count > 1)
        g->base_bytes += (uint64_t)GR_CMS_DEPTH * GR_CMS_WIDTH * sizeof(atomic_uint);
}

/* Slots to reserve address space for: the rows the memory cap (or, without one, the
 * machine's memory) could hold, or the capacity, plus one partly used chunk per partition.
 * Reserving is free; only what rows touch becomes memory. */
static uint32_t arena_slots(const gr_table *t)
{
    uint64_t bytes = t->spec.mem_limit;
    if (!bytes) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (64ull << 30);
    }
    uint64_t n = bytes / t->stride;
    if (t->spec.capacity && t->spec.capacity < n) n = t->spec.capacity;
    n += (uint64_t)t->nparts * t->chunk_rows + COMMIT_ROWS;
    uint64_t lim = (uint64_t)(UINT32_MAX - 1) & ~(uint64_t)(COMMIT_ROWS - 1);
    if (n > lim) n = lim;
    return (uint32_t)((n + COMMIT_ROWS - 1) / COMMIT_ROWS * COMMIT_ROWS);
}

int gr_table_create(const gr_table_spec *spec, gr_table **out)
{
    if (!out) return gr_seterr(GR_EINVAL, "gr_table_create: out is NULL");
    *out = NULL;
    int rc = gr_table_spec_validate(spec);
    if (rc) return rc;
    gr_table *t = calloc(1, sizeof *t);
    if (!t) return gr_seterr(GR_ENOMEM, "cannot allocate table '%s'", spec->name);
    t->spec = *spec;
    if (t->spec.partitions == 0) t->spec.partitions = 256;
    t->dim = spec->dim;
    t->state_floats = gr_table_state_floats(spec);
    gr_table_geometry geo;
    gr_table_geometry_of(&t->spec, &geo);
    t->wbytes = geo.wbytes;
    t->stride = geo.stride;
    t->huge_until = SIZE_MAX;
    t->chunk_shift = (uint32_t)__builtin_ctz(geo.chunk_rows);
    t->chunk_rows = geo.chunk_rows;
    uint32_t np = geo.nparts;
    t->nparts = np;
    t->pbits = (uint32_t)__builtin_ctz(np);
    t->created_ns = gr_now_ns();
    atomic_init(&t->pinned_clock, 0);
    atomic_init(&t->mem_used, 0);
    atomic_init(&t->nrows, 0);
    atomic_init(&t->committed, 0);
    atomic_init(&t->expire_holds, 0);
    atomic_init(&t->expire_max_slice, 0);
    atomic_init(&t->lookup_hits, 0);
    atomic_init(&t->hit_streams, 0);
    pthread_mutex_init(&t->alloc_lock, NULL);
    t->max_rows = arena_slots(t);
    t->res_rows_len = page_up((size_t)t->max_rows * t->stride) + HUGE_PAGE;
    t->res_live_len = page_up(t->max_rows / 8);
    t->res_dirty_len = page_up(t->max_rows / 2);
    t->res_rows = reserve(t->res_rows_len);
    t->res_live = reserve(t->res_live_len);
    t->res_dirty = reserve(t->res_dirty_len);
    t->parts = aligned_alloc(64, (size_t)np * sizeof *t->parts);
    if (!t->res_rows || !t->res_live || !t->res_dirty || !t->parts) {
        gr_table_destroy(t);
        return gr_seterr(GR_ENOMEM,
                         "table '%s': cannot reserve address space for %u rows of %u bytes",
                         spec->name, t->max_rows, t->stride);
    }
    t->rowmem = (uint8_t *)(((uintptr_t)t->res_rows + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    t->live = t->res_live;
    t->dirty = t->res_dirty;
    memset(t->parts, 0, (size_t)np * sizeof *t->parts);
    for (uint32_t i = 0; i < np; i++) {
        gr_part *p = &t->parts[i];
        atomic_init(&p->lock.v, 0);
        atomic_init(&p->pf_idx, &gr_idx_none[1]);
        atomic_init(&p->seq, 0);
        p->free_head = GR_NO_ROW;
        p->rng = gr_hash_key(i, spec->seed ^ 0x65766963ull);
        if (spec->capacity) {
            uint64_t c = spec->capacity / np + (i < spec->capacity % np ? 1 : 0);
            p->row_cap = c > UINT32_MAX - 2 ? UINT32_MAX - 2 : (uint32_t)c;
        } else {
            p->row_cap = UINT32_MAX;
        }
    }
    t->base_bytes = geo.base_bytes;
    t->use_cms = spec->admit_min_count > 1;
    if (t->use_cms) {
        rc = gr_cms_init(&t->cms, GR_CMS_WIDTH);
        if (rc) {
            t->use_cms = false;
            gr_table_destroy(t);
            return rc;
        }
    }
    double p = spec->admit_probability;
    t->admit_threshold = p >= 1.0 ? (1ull << 53) : (uint64_t)(p * 9007199254740992.0);
    *out = t;
    return GR_OK;
}

void gr_table_destroy(gr_table *t)
{
    if (!t) return;
    if (t->parts) {
        for (uint32_t i = 0; i < t->nparts; i++) free(t->parts[i].chunk_ids);
        free(t->parts);
    }
    for (uint32_t i = 0; i < t->nireg; i++) munmap(t->ireg[i].map, t->ireg[i].map_len);
    if (t->res_rows) munmap(t->res_rows, t->res_rows_len);
    if (t->res_live) munmap(t->res_live, t->res_live_len);
    if (t->res_dirty) munmap(t->res_dirty, t->res_dirty_len);
    if (t->use_cms) gr_cms_fini(&t->cms);
    pthread_mutex_destroy(&t->alloc_lock);
    free(t);
}

const gr_table_spec *gr_table_get_spec(const gr_table *t) { return t ? &t->spec : NULL; }

uint32_t gr_table_clock(const gr_table *t)
{
    uint32_t pin = atomic_load_explicit(&t->pinned_clock, memory_order_relaxed);
    if (pin) return pin;
    return (uint32_t)((gr_now_ns() - t->created_ns) / 1000000000ull);
}

void gr_table_set_clock(gr_table *t, uint32_t now)
{
    atomic_store_explicit(&t->pinned_clock, now, memory_order_relaxed);
}

void gr_table_set_huge_rows(gr_table *t, uint64_t bytes)
{
    if (!t) return;
    pthread_mutex_lock(&t->alloc_lock);
    t->huge_until = bytes && bytes < SIZE_MAX - HUGE_PAGE
                        ? (size_t)((bytes + HUGE_PAGE - 1) & ~(uint64_t)(HUGE_PAGE - 1))
                        : SIZE_MAX;
    pthread_mutex_unlock(&t->alloc_lock);
}

/* ---- batches ---- */

enum { OP_APPLY, OP_GET, OP_INSERT, OP_DELETE }; /* lookups: lookup.c */

typedef struct op_ctx {
    const uint64_t *keys;
    float *out;          /* lookup / get weights */
    const float *grads;  /* apply */
    const float *win;    /* insert weights */
    const float *sin;    /* insert state */
    const gr_row_meta *min; /* insert meta */
    float *sout;         /* get state */
    gr_row_meta *mout;   /* get meta */
    bool *found;         /* get */
    size_t count;        /* delete: rows removed */
    size_t nonfinite;    /* apply: rows refused by the finite policy */
    uint64_t nonfinite_key; /* the first of them */
    uint64_t created;    /* rows created, added to t->nrows once per batch */
    uint32_t now;
    int rc;
} op_ctx;

static inline void copy_weights_out(const gr_table *t, uint8_t *row, float *dst)
{
    if (t->spec.dtype == GR_DTYPE_F32) {
        memcpy(dst, gr_row_weights(row), t->wbytes);
    } else {
        const uint16_t *hw = gr_row_weights(row);
        for (uint32_t i = 0; i < t->dim; i++) dst[i] = gr_f16_to_f32(hw[i]);
    }
}

static inline void write_weights_in(const gr_table *t, uint8_t *row, const float *src)
{
    if (t->spec.dtype == GR_DTYPE_F32) {
        memcpy(gr_row_weights(row), src, t->wbytes);
    } else {
        uint16_t *hw = gr_row_weights(row);
        for (uint32_t i = 0; i < t->dim; i++) hw[i] = gr_f32_to_f16(src[i]);
    }
}

static inline void bump_hits(gr_row_hdr *hd)
{
    if (hd->meta.hits < GR_HITS_MAX) hd->meta.hits++;
}

/* Admission for a key with no row: lookups add a sighting to the sketch, applies only read it
 * (so a pull followed by a push counts once). */
static bool admit(gr_table *t, uint64_t key, uint64_t h, bool count)
{
    if (t->use_cms) {
        uint32_t c = count ? gr_cms_add(&t->cms, h) : gr_cms_estimate(&t->cms, h);
        if (c < t->spec.admit_min_count) return false;
    }
    if (t->admit_threshold < (1ull << 53)) {
        uint64_t u = gr_hash_key(key, t->spec.seed ^ 0x61646d6974ull) >> 11;
        if (u >= t->admit_threshold) return false;
    }
    return true;
}

/* Prefetches the cache lines covering [p, p + bytes), bytes > 0. A pointer walk from the
 * first line to the last (a counted loop with the read/write choice inside cost about 40
 * instructions per row, a fifth of a lookup's, by callgrind). */
static inline void prefetch_lines(const void *p, size_t bytes, const int write)
{
    const char *a = (const char *)((uintptr_t)p & ~(uintptr_t)63);
    const char *last = (const char *)(((uintptr_t)p + bytes - 1) & ~(uintptr_t)63);
    if (write)
        for (; a <= last; a += 64) __builtin_prefetch(a, 1, 3);
    else
        for (; a <= last; a += 64) __builtin_prefetch(a, 0, 3);
}

void gr_lookup_locked(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t hint,
                      float *dst, gr_lookup_ctx *c)
{
    gr_spin_lock(&p->lock);
    /* The hint stands if it names a committed slot holding this key (a free slot's header
     * never passes: its hit count is the free marker). Keys live in one partition only, so
     * that row is this key's row. Otherwise, search properly. */
    uint8_t *rowp = NULL;
    uint32_t s = hint;
    if (s < atomic_load_explicit(&t->committed, memory_order_relaxed)) {
        gr_row_hdr *hd = gr_row_hdr_of(gr_row_ptr(t, s));
        if (hd->key == key && hd->meta.hits != GR_HITS_FREE) rowp = (uint8_t *)hd;
    }
    if (!rowp) {
        s = gr_part_find_locked(t, p, key, h, NULL);
        rowp = s == GR_NO_ROW ? NULL : gr_row_ptr(t, s);
    }
    if (rowp) {
        copy_weights_out(t, rowp, dst);
        gr_row_hdr *hd = gr_row_hdr_of(rowp);
        hd->meta.hits = gr_hits_add(hd->meta.hits, gr_lookup_hits_step(t, &c->rng, hd->meta.hits));
        p->hits++;
    } else {
        p->misses++;
        bool made = false;
        if (c->create && admit(t, key, h, true)) {
            /* Row creation is a write: a seqlock write section around it. */
            gr_part_write_begin(p);
            int rc = row_create(t, p, key, h, c->now, true, &s, &c->created);
            gr_part_write_end(p);
            if (rc == GR_OK) {
                uint8_t *row = gr_row_ptr(t, s);
                copy_weights_out(t, row, dst);
                bump_hits(gr_row_hdr_of(row));
                p->admits++;
                made = true;
            } else if (!c->rc) {
                c->rc = rc;
            }
        } else if (c->create) {
            p->rejects++;
        }
        if (!made) memset(dst, 0, t->dim * sizeof *dst);
    }
    gr_spin_unlock(&p->lock);
}

/* F32_WMAX: any finite float. F16_WLIMIT: the smallest f32 that rounds to an f16 inf. */
#define F32_WMAX 3.40282347e38f
#define F16_WMAX 65504.0f
#define F16_WLIMIT 65520.0f

/* One optimizer step on one row, under the finite policy: the row (weights and state) is saved
 * first, and a step whose result is not finite is undone (reject) or clipped (clip). Returns
 * false when the row was refused. The copy is a few hundred bytes per row, next to the
 * optimizer's own reads and writes of the same lines. */
static inline bool apply_row(gr_table *t, gr_part *p, uint8_t *row, uint32_t s, const float *g,
                             uint32_t now)
{
    const uint32_t dim = t->dim, ns = t->state_floats;
    const bool f32 = t->spec.dtype == GR_DTYPE_F32;
    float *st = gr_row_state(t, row);
    float wbuf[GR_TABLE_DIM_MAX], w_old[GR_TABLE_DIM_MAX], s_old[2 * GR_TABLE_DIM_MAX + 1];
    float *w = f32 ? (float *)gr_row_weights(row) : wbuf;
    if (f32) memcpy(w_old, w, (size_t)dim * sizeof *w);
    else copy_weights_out(t, row, w_old);
    if (!f32) memcpy(wbuf, w_old, (size_t)dim * sizeof *w);
    memcpy(s_old, st, (size_t)ns * sizeof *st);
    gr_table_opt_step(&t->spec, dim, w, st, g);
    if (!gr_row_finite(w, dim, st, ns, f32 ? INFINITY : F16_WLIMIT)) {
        if (t->spec.nonfinite == GR_NONFINITE_CLIP) {
            gr_row_clip(w, w_old, dim, st, s_old, ns, f32 ? F32_WMAX : F16_WMAX);
            p->nonfinite_clipped++;
        } else {
            if (f32) memcpy(w, w_old, (size_t)dim * sizeof *w);
            memcpy(st, s_old, (size_t)ns * sizeof *st);
            p->nonfinite_rejected++;
            return false;
        }
    }
    if (!f32) write_weights_in(t, row, w);
    gr_row_hdr *hd = gr_row_hdr_of(row);
    bump_hits(hd);
    hd->meta.last_update = now;
    dirty_mark(t, p, s);
    p->applies++;
    return true;
}

/* Stage A: prefetches a key's partition lock line for writing (where the op will take the
 * lock) and its index bucket, without the lock; returns the index array it read, with its
 * capacity and the key's home bucket in it, for stage B. An array that was retired and given
 * back to the kernel reads as zeros, capacity 0 included: home is then 0 and the probe stops
 * at the first entry. */
static inline const uint64_t *prefetch_stage(gr_part *p, uint64_t h, uint32_t *home,
                                             uint32_t *cap_out)
{
    gr_prefetch_w(&p->lock);
    const uint64_t *e = atomic_load_explicit(&p->pf_idx, memory_order_acquire);
    uint32_t cap = (uint32_t)ild(e - 1);
    *cap_out = cap; /* stage B walks this array within the size it had here */
    *home = gr_idx_home((uint32_t)h, cap);
    __builtin_prefetch(e + *home, 0, 3);
    return e;
}

/* Runs one op over a batch (lookups have their own pipeline, lookup.c), keys in the caller's
 * order, as a three-stage software pipeline: stage A hashes key j + 2D and prefetches its
 * partition's lock line (lock and hot counters, for writing) and its index bucket; stage B
 * reads key j + D's bucket without any lock (a hint, see "index memory") and prefetches the
 * row it names; stage C takes key j's
 * partition lock, checks the hint (or searches properly) and does the work. Each lock is held
 * for one key, so other threads wait at most one key's work, and the caller's arrays are
 * walked in order, which the hardware prefetchers stream. (Grouping a window of keys by
 * partition, to take each lock once per group, measured no faster here, with one or two
 * threads; see docs/table.md.) `op` is a constant at every call site, so each op gets its
 * own specialised copy. */
static inline __attribute__((always_inline)) void run_ops(gr_table *t, op_ctx *c, size_t n,
                                                          const int op)
{
    const uint64_t *const keys = c->keys;
    const uint32_t dim = t->dim, pshift = 32 - t->pbits;
    gr_part *const parts = t->parts;
    uint64_t rh[PF_RING];
    gr_part *rpart[PF_RING];
    uint32_t rs[PF_RING], rhome[PF_RING], rcap[PF_RING];
    const uint64_t *ridx[PF_RING];
    const size_t pf_bytes = op == OP_APPLY || op == OP_INSERT ? t->stride
                            : op == OP_GET && c->sout     ? t->stride
                                                          : sizeof(gr_row_hdr) + t->wbytes;
    const int pf_write = op == OP_APPLY || op == OP_INSERT;
    const size_t total = n + 2 * PF_D;
    for (size_t jj = 0; jj < total; jj++) {
        if (jj < n) { /* stage A */
            uint64_t h = gr_table_hash(keys[jj]);
            gr_part *p = &parts[(uint32_t)((h >> 32) >> pshift)];
            rh[jj & (PF_RING - 1)] = h;
            rpart[jj & (PF_RING - 1)] = p;
            ridx[jj & (PF_RING - 1)] =
                prefetch_stage(p, h, &rhome[jj & (PF_RING - 1)], &rcap[jj & (PF_RING - 1)]);
        }
        if (jj >= PF_D && jj - PF_D < n) { /* stage B, lock-free: a hint for the row */
            const size_t b = (jj - PF_D) & (PF_RING - 1);
            uint32_t s = gr_idx_probe_hint(ridx[b], rcap[b], rhome[b], (uint32_t)rh[b]);
            rs[b] = s;
            if (s != GR_NO_ROW) {
                prefetch_lines(gr_row_ptr(t, s), pf_bytes, pf_write);
                /* Applies and inserts also mark the row's dirty bits. */
                if ((op == OP_APPLY || op == OP_INSERT) &&
                    s < atomic_load_explicit(&t->committed, memory_order_relaxed))
                    __builtin_prefetch(&t->dirty[s >> 4], 1, 3);
            }
        }
        if (jj < 2 * PF_D) continue;
        /* stage C */
        const size_t i = jj - 2 * PF_D, ri = i & (PF_RING - 1);
        const uint64_t key = keys[i], hj = rh[ri];
        gr_part *p = rpart[ri];
        uint32_t s = rs[ri], pos = 0;
        uint8_t *rowp = NULL;
        gr_spin_lock(&p->lock);
        /* Ops that change rows do it inside a seqlock write section. */
        const bool writes = op == OP_APPLY || op == OP_INSERT || op == OP_DELETE;
        if (writes) gr_part_write_begin(p);
        /* The hint stands if it names a committed slot holding this key (a free slot's header
         * never passes: its hit count is the free marker). Keys live in one partition only, so
         * that row is this key's row. Otherwise, search properly. */
        if (op != OP_DELETE && s < atomic_load_explicit(&t->committed, memory_order_relaxed)) {
            gr_row_hdr *hd = gr_row_hdr_of(gr_row_ptr(t, s));
            if (hd->key == key && hd->meta.hits != GR_HITS_FREE) rowp = (uint8_t *)hd;
        }
        if (!rowp) {
            s = gr_part_find_locked(t, p, key, hj, &pos);
            rowp = s == GR_NO_ROW ? NULL : gr_row_ptr(t, s);
        }
        if (op == OP_APPLY) {
            bool ok = true;
            if (!rowp) {
                if (!admit(t, key, hj, false)) {
                    p->rejects++;
                    ok = false;
                } else {
                    int rc = row_create(t, p, key, hj, c->now, true, &s, &c->created);
                    if (rc) {
                        if (!c->rc) c->rc = rc;
                        ok = false;
                    } else {
                        p->admits++;
                        rowp = gr_row_ptr(t, s);
                    }
                }
            }
            if (ok && !apply_row(t, p, rowp, s, c->grads + i * dim, c->now) &&
                c->nonfinite++ == 0)
                c->nonfinite_key = key;
        } else if (op == OP_GET) {
            if (c->found) c->found[i] = rowp != NULL;
            if (!rowp) {
                if (c->out) memset(c->out + i * dim, 0, dim * sizeof(float));
                if (c->sout)
                    memset(c->sout + i * t->state_floats, 0, t->state_floats * sizeof(float));
                if (c->mout) memset(&c->mout[i], 0, sizeof c->mout[i]);
            } else {
                if (c->out) copy_weights_out(t, rowp, c->out + i * dim);
                if (c->sout)
                    memcpy(c->sout + i * t->state_floats, gr_row_state(t, rowp),
                           t->state_floats * sizeof(float));
                if (c->mout) c->mout[i] = gr_row_hdr_of(rowp)->meta;
            }
        } else if (op == OP_INSERT) {
            int rc = GR_OK;
            if (!rowp) {
                rc = row_create(t, p, key, hj, c->now, false, &s, &c->created);
                if (rc) {
                    if (!c->rc) c->rc = rc;
                } else {
                    rowp = gr_row_ptr(t, s);
                }
            }
            if (rowp) {
                write_weights_in(t, rowp, c->win + i * dim);
                if (c->sin)
                    memcpy(gr_row_state(t, rowp), c->sin + i * t->state_floats,
                           t->state_floats * sizeof(float));
                else
                    gr_table_init_state(t, gr_row_state(t, rowp));
                if (c->min) {
                    gr_row_hdr_of(rowp)->meta = c->min[i];
                    if (c->min[i].hits > GR_HITS_MAX) gr_row_hdr_of(rowp)->meta.hits = GR_HITS_MAX;
                } else {
                    gr_row_hdr_of(rowp)->meta.last_update = c->now;
                    gr_row_hdr_of(rowp)->meta.hits = 0;
                }
                dirty_mark(t, p, s);
            }
        } else if (op == OP_DELETE) {
            if (rowp) {
                gr_part_remove_locked(t, p, pos, s);
                c->count++;
            }
        }
        if (writes) gr_part_write_end(p);
        gr_spin_unlock(&p->lock);
    }
}

static int run_batch(gr_table *t, op_ctx *c, size_t n, int op)
{
    if (n == 0) return GR_OK;
    c->now = gr_table_clock(t);
    switch (op) {
    case OP_APPLY: run_ops(t, c, n, OP_APPLY); break;
    case OP_GET: run_ops(t, c, n, OP_GET); break;
    case OP_INSERT: run_ops(t, c, n, OP_INSERT); break;
    case OP_DELETE: run_ops(t, c, n, OP_DELETE); break;
    }
    if (c->created) atomic_fetch_add_explicit(&t->nrows, c->created, memory_order_relaxed);
    if (t->use_cms) gr_cms_maybe_age(&t->cms);
    return c->rc;
}

#define CHECK_T(fn)                                                                               \
    do {                                                                                          \
        if (!t) return gr_seterr(GR_EINVAL, fn ": table is NULL");                                \
    } while (0)
#define CHECK_PTR(ptr, fn, what)                                                                  \
    do {                                                                                          \
        if (n > 0 && !(ptr))                                                                      \
            return gr_seterr(GR_EINVAL, fn " on table '%s': %s is NULL with n = %zu",             \
                             t->spec.name, what, n);                                              \
    } while (0)

static int check_finite(gr_table *t, const char *what, const uint64_t *keys, const float *v,
                        size_t n, uint32_t per)
{
    /* A float is not finite when its exponent bits are all ones. Checking the bits (a loop
     * the compiler vectorizes) is several times faster than isfinite() per element; the
     * slow search for the culprit runs only when something is wrong. */
    const size_t total = n * per;
    uint32_t bad = 0;
    for (size_t k = 0; k < total; k++) {
        uint32_t b;
        memcpy(&b, &v[k], sizeof b);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) return GR_OK;
    for (size_t i = 0; i < n; i++) {
        const float *r = v + i * per;
        for (uint32_t j = 0; j < per; j++)
            if (!isfinite(r[j]))
                return gr_seterr(GR_EINVAL,
                                 "table '%s': %s for key %" PRIu64
                                 " (row %zu, element %u) is not finite; nothing was applied",
                                 t->spec.name, what, keys[i], i, j);
    }
    return GR_OK;
}

/* An f16 table stores a weight of 65520 or more as inf: such rows are refused like
 * non-finite ones, so that an insert (a restore) never makes a row the table cannot hold. */
static int check_f16_range(gr_table *t, const uint64_t *keys, const float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < t->dim; j++)
            if (!(fabsf(w[i * t->dim + j]) < F16_WLIMIT))
                return gr_seterr(GR_EINVAL,
                                 "table '%s': weight %g for key %" PRIu64 " (row %zu, element %u) "
                                 "is outside the f16 range (+-65504); nothing was applied",
                                 t->spec.name, (double)w[i * t->dim + j], keys[i], i, j);
    return GR_OK;
}

/* grads_checked: the caller has checked the gradients (gr_table_apply_checked). */
static int apply_batch(gr_table *t, const uint64_t *keys, size_t n, const float *grads,
                       size_t *refused, bool grads_checked)
{
    if (refused) *refused = 0;
    CHECK_T("gr_table_apply");
    CHECK_PTR(keys, "apply", "keys");
    CHECK_PTR(grads, "apply", "grads");
    int rc = grads_checked ? GR_OK : check_finite(t, "gradient", keys, grads, n, t->dim);
    if (rc) return rc;
    op_ctx c = {.keys = keys, .grads = grads};
    rc = run_batch(t, &c, n, OP_APPLY);
    if (refused) {
        *refused = c.nonfinite;
        return rc;
    }
    if (!rc && c.nonfinite)
        rc = gr_seterr(GR_EINVAL,
                       "table '%s': the update of key %" PRIu64 " would make its row non-finite "
                       "(%s, lr %g); %zu of %zu rows refused and left unchanged, the others "
                       "applied (table setting \"nonfinite\": \"reject\")",
                       t->spec.name, c.nonfinite_key, gr_table_opt_name(t->spec.opt.kind),
                       (double)t->spec.opt.lr, c.nonfinite, n);
    return rc;
}

int gr_table_apply_counted(gr_table *t, const uint64_t *keys, size_t n, const float *grads,
                           size_t *refused)
{
    return apply_batch(t, keys, n, grads, refused, false);
}

int gr_table_apply(gr_table *t, const uint64_t *keys, size_t n, const float *grads)
{
    return apply_batch(t, keys, n, grads, NULL, false);
}

int gr_table_apply_checked(gr_table *t, const uint64_t *keys, size_t n, const float *grads)
{
    return apply_batch(t, keys, n, grads, NULL, true);
}

int gr_table_delete(gr_table *t, const uint64_t *keys, size_t n, size_t *deleted)
{
    if (deleted) *deleted = 0;
    CHECK_T("gr_table_delete");
    CHECK_PTR(keys, "delete", "keys");
    op_ctx c = {.keys = keys};
    int rc = run_batch(t, &c, n, OP_DELETE);
    if (deleted) *deleted = c.count;
    return rc;
}

int gr_table_insert(gr_table *t, const uint64_t *keys, size_t n, const float *weights,
                    const float *state, const gr_row_meta *meta)
{
    CHECK_T("gr_table_insert");
    CHECK_PTR(keys, "insert", "keys");
    CHECK_PTR(weights, "insert", "weights");
    int rc = check_finite(t, "weights", keys, weights, n, t->dim);
    if (!rc && t->spec.dtype == GR_DTYPE_F16) rc = check_f16_range(t, keys, weights, n);
    if (!rc && state) rc = check_finite(t, "optimizer state", keys, state, n, t->state_floats);
    if (rc) return rc;
    op_ctx c = {.keys = keys, .win = weights, .sin = state, .min = meta};
    return run_batch(t, &c, n, OP_INSERT);
}

int gr_table_get(gr_table *t, const uint64_t *keys, size_t n, float *weights, float *state,
                 gr_row_meta *meta, bool *found)
{
    CHECK_T("gr_table_get");
    CHECK_PTR(keys, "get", "keys");
    op_ctx c = {.keys = keys, .out = weights, .sout = state, .mout = meta, .found = found};
    return run_batch(t, &c, n, OP_GET);
}

/* ---- hooks for the bulk insert (bulk.c) ----
 * The pieces of an insert, so that bulk.c can take each partition's lock once per group of
 * rows and count the table's rows once per call, while the row layout, the index and the
 * dirty bits stay this file's business. */

int gr_table_check_insert(gr_table *t, const uint64_t *keys, size_t n, const float *weights,
                          const float *state)
{
    int rc = check_finite(t, "weights", keys, weights, n, t->dim);
    if (!rc && t->spec.dtype == GR_DTYPE_F16) rc = check_f16_range(t, keys, weights, n);
    if (!rc && state) rc = check_finite(t, "optimizer state", keys, state, n, t->state_floats);
    return rc;
}

int gr_part_reserve_locked(gr_table *t, gr_part *p, uint64_t rows)
{
    /* One rehash, to the first capacity of the growth sequence that fits: the steps in
     * between would each allocate, fill and retire an array. */
    uint32_t nc = p->cap;
    while (rows * GR_IDX_LOAD_DEN > (uint64_t)nc * GR_IDX_LOAD_NUM) {
        uint32_t next = gr_idx_next_cap(nc);
        if (next <= nc) break; /* at the limit: idx_grow_to says so */
        nc = next;
    }
    if (nc == p->cap) {
        if (rows * GR_IDX_LOAD_DEN > (uint64_t)nc * GR_IDX_LOAD_NUM)
            return gr_seterr(GR_ECAPACITY, "table '%s': partition index is full", t->spec.name);
        return GR_OK;
    }
    return idx_grow_to(t, p, nc);
}

int gr_part_new_row_locked(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t *slot)
{
    uint32_t s = GR_NO_ROW;
    int rc = slot_alloc(t, p, &s);
    if (rc) return rc;
    gr_row_hdr_of(gr_row_ptr(t, s))->key = key;
    idx_put(p, ((uint64_t)s << 32) | (uint32_t)h);
    t->live[s >> 6] |= 1ull << (s & 63);
    p->rows++;
    *slot = s;
    return GR_OK;
}

void gr_part_store_row_locked(gr_table *t, gr_part *p, uint32_t s, const float *w,
                              const float *state, const gr_row_meta *meta, uint32_t now)
{
    uint8_t *rowp = gr_row_ptr(t, s);
    write_weights_in(t, rowp, w);
    if (state) memcpy(gr_row_state(t, rowp), state, t->state_floats * sizeof(float));
    else gr_table_init_state(t, gr_row_state(t, rowp));
    gr_row_hdr *hd = gr_row_hdr_of(rowp);
    if (meta) {
        hd->meta = *meta;
        if (meta->hits > GR_HITS_MAX) hd->meta.hits = GR_HITS_MAX;
    } else {
        hd->meta.last_update = now;
        hd->meta.hits = 0;
    }
    dirty_mark(t, p, s);
}
