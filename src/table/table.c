/* The table engine: partitions, their open-addressing indexes and row arenas, and the batch
 * operations (lookup, apply, get, insert, delete). A batch is hashed once, grouped by
 * partition, and each group runs under one hold of its partition's lock with a software
 * pipeline (index buckets prefetched two stages ahead, rows one stage ahead). */
#include "table/table_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PF_D 6     /* pipeline distance (keys) between stages */
#define PF_RING 8  /* ring of probed slots; power of two > PF_D */
#define CHUNK_TARGET 24576u             /* rows per chunk: smallest power of two reaching this */
#define SMALL_CHUNK_BYTES (4u << 20)    /* malloc per chunk until this much is in chunks */
#define SLAB_TARGET (32u << 20)         /* then carve chunks from slabs of about this size */
#define HUGE_PAGE (2u << 20)
#define EVICT_SAMPLES 8
#define EVICT_SAMPLE_ALL 16 /* partitions with this few slots are searched exhaustively */
#define FIRST_CHUNK_ROWS 4

uint64_t gr_table_hash(uint64_t key)
{
    return XXH3_64bits_withSeed(&key, sizeof key, GR_TABLE_HASH_SEED);
}

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

/* ---- chunk allocator ---- */

static int block_push(gr_table *t, void *b)
{
    if (t->nblocks == t->blocks_cap) {
        size_t nc = t->blocks_cap ? t->blocks_cap * 2 : 64;
        void **nb = realloc(t->blocks, nc * sizeof *nb);
        if (!nb) return GR_ENOMEM;
        t->blocks = nb;
        t->blocks_cap = nc;
    }
    t->blocks[t->nblocks++] = b;
    return GR_OK;
}

/* A chunk for rows >= one chunk (chunk 0 of each partition is a growable malloc). Small
 * tables malloc each chunk; past SMALL_CHUNK_BYTES chunks are carved from 2 MiB-aligned slabs
 * advised for transparent huge pages, which saves most TLB misses on random row access. */
static uint8_t *chunk_get(gr_table *t)
{
    uint8_t *c = NULL;
    size_t cb = t->chunk_bytes;
    pthread_mutex_lock(&t->alloc_lock);
    if (t->malloc_bytes + cb <= SMALL_CHUNK_BYTES) {
        c = malloc(cb);
        if (c && block_push(t, c) == GR_OK) {
            t->malloc_bytes += cb;
        } else {
            free(c);
            c = NULL;
        }
    } else {
        if (t->slab_left < cb) {
            size_t sz = cb * (SLAB_TARGET / cb > 0 ? SLAB_TARGET / cb : 1);
            void *s = NULL;
            if (posix_memalign(&s, HUGE_PAGE, sz) != 0) s = NULL;
            if (s && block_push(t, s) != GR_OK) {
                free(s);
                s = NULL;
            }
            if (s) {
#ifdef MADV_HUGEPAGE
                if (sz >= HUGE_PAGE) madvise(s, sz & ~(size_t)(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
                t->slab_cur = s;
                t->slab_left = sz;
            }
        }
        if (t->slab_left >= cb) {
            c = t->slab_cur;
            t->slab_cur += cb;
            t->slab_left -= cb;
        }
    }
    pthread_mutex_unlock(&t->alloc_lock);
    return c;
}

/* ---- index ---- */

static void idx_put(gr_part *p, uint64_t entry)
{
    uint32_t cap = p->cap;
    uint32_t i = gr_idx_home((uint32_t)entry, cap);
    while (p->idx[i] != GR_IDX_EMPTY)
        if (++i == cap) i = 0;
    p->idx[i] = entry;
}

/* Grows one partition's index by rehashing its entries from their stored tags (no row is
 * read). Only this partition is locked while it happens. */
static int idx_grow(gr_table *t, gr_part *p)
{
    uint32_t old = p->cap;
    /* Doubling while small; past 4096 buckets, 1.25x steps keep the load between 0.64 and 0.8,
     * which holds the index near 11 bytes per row (amortised rehash cost: ~4 moves per insert). */
    uint64_t nc64 = old == 0 ? GR_IDX_MIN_CAP : old < 4096 ? (uint64_t)old * 2 : (uint64_t)old * 5 / 4;
    if (nc64 > UINT32_MAX - 1) nc64 = UINT32_MAX - 1;
    uint32_t nc = (uint32_t)nc64;
    if (nc <= old) return gr_seterr(GR_ECAPACITY, "table '%s': partition index is full", t->spec.name);
    size_t nb = (size_t)nc * sizeof(uint64_t);
    if (mem_take(t, nb)) return cap_error(t);
    uint64_t *ni = malloc(nb);
    if (!ni) {
        mem_give(t, nb);
        return oom_error(t, nb);
    }
    memset(ni, 0xff, nb);
    uint64_t *oi = p->idx;
    p->idx = ni;
    p->cap = nc;
    for (uint32_t i = 0; i < old; i++)
        if (oi[i] != GR_IDX_EMPTY) idx_put(p, oi[i]);
    free(oi);
    mem_give(t, (uint64_t)old * sizeof(uint64_t));
    return GR_OK;
}

/* Backward-shift deletion: no tombstones, so probe lengths stay those of the live entries. */
static void idx_erase(gr_part *p, uint32_t i)
{
    uint32_t cap = p->cap, j = i;
    uint64_t *e = p->idx;
    for (;;) {
        if (++j == cap) j = 0;
        uint64_t x = e[j];
        if (x == GR_IDX_EMPTY) break;
        uint32_t home = gr_idx_home((uint32_t)x, cap);
        uint32_t dj = j >= home ? j - home : j + cap - home;
        uint32_t di = j >= i ? j - i : j + cap - i;
        if (dj >= di) {
            e[i] = x;
            i = j;
        }
    }
    e[i] = GR_IDX_EMPTY;
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
            if (gr_row_hdr_of(gr_row_ptr(t, p, s))->key == key) {
                if (pos) *pos = i;
                return s;
            }
        }
        if (++i == cap) i = 0;
    }
}

/* First slot whose tag matches, without reading the row (the pipeline's probe stage). */
static inline uint32_t idx_probe_tag(const gr_part *p, uint64_t h)
{
    uint32_t cap = p->cap;
    if (!cap) return GR_NO_ROW;
    uint32_t tag = (uint32_t)h, i = gr_idx_home(tag, cap);
    for (;;) {
        uint64_t x = p->idx[i];
        if (x == GR_IDX_EMPTY) return GR_NO_ROW;
        if ((uint32_t)x == tag) return (uint32_t)(x >> 32);
        if (++i == cap) i = 0;
    }
}

static inline void prefetch_bucket(const gr_part *p, uint64_t h)
{
    uint32_t cap = p->cap;
    if (cap) __builtin_prefetch(p->idx + gr_idx_home((uint32_t)h, cap), 0, 3);
}

/* ---- row slots ---- */

static inline bool live_get(const gr_part *p, uint32_t s)
{
    return (p->live[s >> 6] >> (s & 63)) & 1u;
}

static void dirty_clear(gr_part *p, uint32_t s)
{
    uint64_t *w = &p->dirty[s >> 4];
    unsigned sh = (s & 15u) * 4u;
    uint64_t old = (*w >> sh) & 0xfu;
    if (!old) return;
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) p->dirty_n[k] -= (old >> k) & 1u;
    *w &= ~(0xfull << sh);
}

static inline void dirty_mark(gr_part *p, uint32_t s)
{
    uint64_t *w = &p->dirty[s >> 4];
    unsigned sh = (s & 15u) * 4u;
    uint64_t old = (*w >> sh) & 0xfu;
    if (old == 0xfu) return;
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) p->dirty_n[k] += !((old >> k) & 1u);
    *w |= 0xfull << sh;
}

static int bits_ensure(gr_table *t, gr_part *p, uint32_t need)
{
    uint32_t lw = (need + 63) / 64, dw = (need + 15) / 16;
    if (lw > p->live_words) {
        uint32_t n = p->live_words * 3 / 2 > lw ? p->live_words * 3 / 2 : lw;
        int rc = grow_array(t, (void **)&p->live, p->live_words * 8ull, n * 8ull);
        if (rc) return rc;
        memset(p->live + p->live_words, 0, (n - p->live_words) * 8ull);
        p->live_words = n;
    }
    if (dw > p->dirty_words) {
        uint32_t n = p->dirty_words * 3 / 2 > dw ? p->dirty_words * 3 / 2 : dw;
        int rc = grow_array(t, (void **)&p->dirty, p->dirty_words * 8ull, n * 8ull);
        if (rc) return rc;
        memset(p->dirty + p->dirty_words, 0, (n - p->dirty_words) * 8ull);
        p->dirty_words = n;
    }
    return GR_OK;
}

/* Makes slot s addressable: chunk 0 grows by realloc (so tiny partitions stay tiny; slots,
 * not pointers, are what anyone holds), later chunks come whole from chunk_get. */
static int chunk_ensure(gr_table *t, gr_part *p, uint32_t s)
{
    uint32_t ci = s >> t->chunk_shift, rows_per = t->chunk_mask + 1;
    if (ci == 0) {
        if (p->nchunks > 0 && (s & t->chunk_mask) < p->c0_rows) return GR_OK;
        if (p->chunks_cap == 0) {
            int rc = grow_array(t, (void **)&p->chunks, 0, 4 * sizeof *p->chunks);
            if (rc) return rc;
            p->chunks_cap = 4;
            p->chunks[0] = NULL;
        }
        uint32_t nr = p->c0_rows ? p->c0_rows * 2 : FIRST_CHUNK_ROWS;
        if (nr > rows_per) nr = rows_per;
        while (nr <= (s & t->chunk_mask)) nr *= 2;
        void *c0 = p->chunks[0];
        int rc = grow_array(t, &c0, (size_t)p->c0_rows * t->stride, (size_t)nr * t->stride);
        if (rc) return rc;
        p->chunks[0] = c0;
        p->c0_rows = nr;
        p->nchunks = 1;
        return GR_OK;
    }
    if (ci < p->nchunks) return GR_OK;
    if (p->c0_rows < rows_per) {
        /* Chunk 0 must be whole before chunk 1 exists. */
        int rc = chunk_ensure(t, p, t->chunk_mask);
        if (rc) return rc;
    }
    if (p->nchunks == p->chunks_cap) {
        uint32_t nc = p->chunks_cap * 2;
        int rc = grow_array(t, (void **)&p->chunks, p->chunks_cap * sizeof *p->chunks,
                            nc * sizeof *p->chunks);
        if (rc) return rc;
        p->chunks_cap = nc;
    }
    if (mem_take(t, t->chunk_bytes)) return cap_error(t);
    uint8_t *c = chunk_get(t);
    if (!c) {
        mem_give(t, t->chunk_bytes);
        return oom_error(t, t->chunk_bytes);
    }
    p->chunks[p->nchunks++] = c;
    return GR_OK;
}

static int slot_alloc(gr_table *t, gr_part *p, uint32_t *out)
{
    if (p->free_head != GR_NO_ROW) {
        uint32_t s = p->free_head;
        p->free_head = (uint32_t)gr_row_hdr_of(gr_row_ptr(t, p, s))->key;
        *out = s;
        return GR_OK;
    }
    uint32_t s = p->hw;
    if (s >= GR_NO_ROW - 1)
        return gr_seterr(GR_ECAPACITY, "table '%s': a partition is full (%u rows)", t->spec.name, s);
    int rc = chunk_ensure(t, p, s);
    if (!rc) rc = bits_ensure(t, p, s + 1);
    if (rc) return rc;
    p->hw = s + 1;
    *out = s;
    return GR_OK;
}

/* Removes the row in `slot` whose index entry is at `pos`. Caller holds the lock. */
void gr_part_remove_locked(gr_table *t, gr_part *p, uint32_t pos, uint32_t slot)
{
    idx_erase(p, pos);
    p->live[slot >> 6] &= ~(1ull << (slot & 63));
    dirty_clear(p, slot);
    gr_row_hdr_of(gr_row_ptr(t, p, slot))->key = p->free_head;
    p->free_head = slot;
    p->rows--;
    p->gen++;
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
    uint32_t hw = p->hw;
    unsigned got = 0;
    for (uint32_t k = 0, tries = 0; got < EVICT_SAMPLES || hw <= EVICT_SAMPLE_ALL; k++) {
        uint32_t s;
        if (hw <= EVICT_SAMPLE_ALL) {
            if (k >= hw) break;
            s = k;
        } else {
            if (++tries > 64 * EVICT_SAMPLES) break;
            s = (uint32_t)(part_rand(p) % hw);
        }
        if (!live_get(p, s)) continue;
        got++;
        gr_row_meta m = gr_row_hdr_of(gr_row_ptr(t, p, s))->meta;
        if (best == GR_NO_ROW || m.last_update < bm.last_update ||
            (m.last_update == bm.last_update && m.hits < bm.hits)) {
            best = s;
            bm = m;
        }
    }
    if (best == GR_NO_ROW) /* sampling found nothing live: take the first live slot */
        for (uint32_t s = 0; s < hw && best == GR_NO_ROW; s++)
            if (live_get(p, s)) best = s;
    if (best == GR_NO_ROW) return;
    uint64_t key = gr_row_hdr_of(gr_row_ptr(t, p, best))->key;
    uint32_t pos;
    uint32_t s = gr_part_find_locked(t, p, key, gr_table_hash(key), &pos);
    if (s != best) return; /* cannot happen: every live row is indexed */
    gr_part_remove_locked(t, p, pos, best);
    p->evictions++;
}

/* Creates the row for a missing key. With init, weights and state come from the initializer;
 * without, the caller fills them. Fallible steps all run before anything is committed. */
static int row_create(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t now, bool init,
                      uint32_t *out)
{
    if (p->rows >= p->row_cap) evict_one_locked(t, p);
    if ((uint64_t)(p->rows + 1) * GR_IDX_LOAD_DEN > (uint64_t)p->cap * GR_IDX_LOAD_NUM) {
        int rc = idx_grow(t, p);
        if (rc) return rc;
    }
    uint32_t s = GR_NO_ROW;
    int rc = slot_alloc(t, p, &s);
    if (rc) return rc;
    uint8_t *row = gr_row_ptr(t, p, s);
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
    p->live[s >> 6] |= 1ull << (s & 63);
    p->rows++;
    atomic_fetch_add_explicit(&t->nrows, 1, memory_order_relaxed);
    *out = s;
    return GR_OK;
}

/* ---- create / destroy ---- */

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
    t->wbytes = spec->dim * (spec->dtype == GR_DTYPE_F16 ? 2u : 4u);
    uint32_t stride = (uint32_t)sizeof(gr_row_hdr) + t->wbytes + 4u * t->state_floats;
    t->stride = (stride + 7u) & ~7u;
    uint32_t rows = 1;
    while ((uint64_t)rows * t->stride < CHUNK_TARGET) rows *= 2;
    t->chunk_shift = (uint32_t)__builtin_ctz(rows);
    t->chunk_mask = rows - 1;
    t->chunk_bytes = rows * t->stride;
    /* A capacity below the partition count would leave partitions with no room at all. */
    uint32_t np = t->spec.partitions;
    if (spec->capacity && spec->capacity < np)
        while (np > spec->capacity) np /= 2;
    t->nparts = np;
    t->pbits = (uint32_t)__builtin_ctz(np);
    t->created_ns = gr_now_ns();
    atomic_init(&t->pinned_clock, 0);
    atomic_init(&t->mem_used, 0);
    atomic_init(&t->nrows, 0);
    atomic_init(&t->start_ctr, 0);
    pthread_mutex_init(&t->alloc_lock, NULL);
    t->parts = aligned_alloc(64, (size_t)np * sizeof *t->parts);
    if (!t->parts) {
        pthread_mutex_destroy(&t->alloc_lock);
        free(t);
        return gr_seterr(GR_ENOMEM, "cannot allocate %u partitions for table '%s'", np,
                         spec->name);
    }
    memset(t->parts, 0, (size_t)np * sizeof *t->parts);
    for (uint32_t i = 0; i < np; i++) {
        gr_part *p = &t->parts[i];
        atomic_init(&p->lock.v, 0);
        p->free_head = GR_NO_ROW;
        p->rng = gr_hash_key(i, spec->seed ^ 0x65766963ull);
        if (spec->capacity) {
            uint64_t c = spec->capacity / np + (i < spec->capacity % np ? 1 : 0);
            p->row_cap = c > UINT32_MAX - 2 ? UINT32_MAX - 2 : (uint32_t)c;
        } else {
            p->row_cap = UINT32_MAX;
        }
    }
    t->base_bytes = sizeof *t + (uint64_t)np * sizeof *t->parts;
    t->use_cms = spec->admit_min_count > 1;
    if (t->use_cms) {
        rc = gr_cms_init(&t->cms, GR_CMS_WIDTH);
        if (rc) {
            gr_table_destroy(t);
            return rc;
        }
        t->base_bytes += (uint64_t)GR_CMS_DEPTH * GR_CMS_WIDTH * sizeof(atomic_uint);
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
        for (uint32_t i = 0; i < t->nparts; i++) {
            gr_part *p = &t->parts[i];
            free(p->idx);
            if (p->chunks) free(p->chunks[0]);
            free(p->chunks);
            free(p->live);
            free(p->dirty);
        }
        free(t->parts);
    }
    for (size_t i = 0; i < t->nblocks; i++) free(t->blocks[i]);
    free(t->blocks);
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

/* ---- batches ---- */

enum { OP_LOOKUP, OP_LOOKUP_RO, OP_APPLY, OP_GET, OP_INSERT, OP_DELETE };

typedef struct op_ctx {
    const uint64_t *keys;
    const uint64_t *h;
    float *out;          /* lookup / get weights */
    const float *grads;  /* apply */
    const float *win;    /* insert weights */
    const float *sin;    /* insert state */
    const gr_row_meta *min; /* insert meta */
    float *sout;         /* get state */
    gr_row_meta *mout;   /* get meta */
    bool *found;         /* get */
    size_t count;        /* delete: rows removed */
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
    if (hd->meta.hits != UINT32_MAX) hd->meta.hits++;
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

static inline void prefetch_row(const gr_table *t, const gr_part *p, uint32_t s, size_t bytes,
                                int write)
{
    const uint8_t *r = gr_row_ptr(t, p, s);
    for (size_t off = 0; off < bytes; off += 64) {
        if (write) __builtin_prefetch(r + off, 1, 3);
        else __builtin_prefetch(r + off, 0, 3);
    }
}

static inline void apply_row(gr_table *t, gr_part *p, uint32_t s, const float *g, uint32_t now)
{
    uint8_t *row = gr_row_ptr(t, p, s);
    gr_row_hdr *hd = gr_row_hdr_of(row);
    bump_hits(hd);
    hd->meta.last_update = now;
    float *st = gr_row_state(t, row);
    if (t->spec.dtype == GR_DTYPE_F32) {
        gr_table_opt_step(&t->spec, t->dim, gr_row_weights(row), st, g);
    } else {
        float w[GR_TABLE_DIM_MAX];
        copy_weights_out(t, row, w);
        gr_table_opt_step(&t->spec, t->dim, w, st, g);
        write_weights_in(t, row, w);
    }
    dirty_mark(p, s);
    p->applies++;
}

/* Runs one op over the keys ix[0..m) of partition p, lock held. `op` is a constant at every
 * call site, so each op gets its own specialised copy of the pipeline. */
static inline __attribute__((always_inline)) void run_group(gr_table *t, gr_part *p, op_ctx *c,
                                                            const uint32_t *ix, uint32_t m,
                                                            const int op)
{
    const uint64_t *h = c->h, *keys = c->keys;
    const uint32_t dim = t->dim;
    uint32_t rs[PF_RING], rg[PF_RING];
    size_t pf_bytes = op == OP_APPLY || op == OP_INSERT ? t->stride
                      : op == OP_GET && c->sout     ? t->stride
                                                    : sizeof(gr_row_hdr) + t->wbytes;
    const int pf_write = op != OP_GET && op != OP_DELETE;
    uint32_t pre = m < 2 * PF_D ? m : 2 * PF_D;
    for (uint32_t j = 0; j < pre; j++) prefetch_bucket(p, h[ix[j]]);
#define PROBE(k)                                                                                  \
    do {                                                                                          \
        uint32_t s_ = idx_probe_tag(p, h[ix[k]]);                                                 \
        rs[(k) & (PF_RING - 1)] = s_;                                                             \
        rg[(k) & (PF_RING - 1)] = p->gen;                                                         \
        if (s_ != GR_NO_ROW) prefetch_row(t, p, s_, pf_bytes, pf_write);                          \
    } while (0)
    for (uint32_t j = 0; j < (m < PF_D ? m : PF_D); j++) PROBE(j);
    for (uint32_t j = 0; j < m; j++) {
        if (j + 2 * PF_D < m) prefetch_bucket(p, h[ix[j + 2 * PF_D]]);
        if (j + PF_D < m) PROBE(j + PF_D);
        const uint32_t i = ix[j];
        const uint64_t key = keys[i];
        uint32_t s = rs[j & (PF_RING - 1)], pos = 0;
        bool need_pos = op == OP_DELETE;
        if (s == GR_NO_ROW || rg[j & (PF_RING - 1)] != p->gen || need_pos ||
            gr_row_hdr_of(gr_row_ptr(t, p, s))->key != key)
            s = gr_part_find_locked(t, p, key, h[i], &pos);
        if (op == OP_LOOKUP || op == OP_LOOKUP_RO) {
            float *dst = c->out + (size_t)i * dim;
            if (s != GR_NO_ROW) {
                uint8_t *row = gr_row_ptr(t, p, s);
                copy_weights_out(t, row, dst);
                bump_hits(gr_row_hdr_of(row));
                p->hits++;
                continue;
            }
            p->misses++;
            if (op == OP_LOOKUP && admit(t, key, h[i], true)) {
                int rc = row_create(t, p, key, h[i], c->now, true, &s);
                if (rc == GR_OK) {
                    uint8_t *row = gr_row_ptr(t, p, s);
                    copy_weights_out(t, row, dst);
                    bump_hits(gr_row_hdr_of(row));
                    p->admits++;
                    continue;
                }
                if (!c->rc) c->rc = rc;
            } else if (op == OP_LOOKUP) {
                p->rejects++;
            }
            memset(dst, 0, dim * sizeof *dst);
        } else if (op == OP_APPLY) {
            if (s == GR_NO_ROW) {
                if (!admit(t, key, h[i], false)) {
                    p->rejects++;
                    continue;
                }
                int rc = row_create(t, p, key, h[i], c->now, true, &s);
                if (rc) {
                    if (!c->rc) c->rc = rc;
                    continue;
                }
                p->admits++;
            }
            apply_row(t, p, s, c->grads + (size_t)i * dim, c->now);
        } else if (op == OP_GET) {
            if (c->found) c->found[i] = s != GR_NO_ROW;
            if (s == GR_NO_ROW) {
                if (c->out) memset(c->out + (size_t)i * dim, 0, dim * sizeof(float));
                if (c->sout)
                    memset(c->sout + (size_t)i * t->state_floats, 0,
                           t->state_floats * sizeof(float));
                if (c->mout) memset(&c->mout[i], 0, sizeof c->mout[i]);
                continue;
            }
            uint8_t *row = gr_row_ptr(t, p, s);
            if (c->out) copy_weights_out(t, row, c->out + (size_t)i * dim);
            if (c->sout)
                memcpy(c->sout + (size_t)i * t->state_floats, gr_row_state(t, row),
                       t->state_floats * sizeof(float));
            if (c->mout) c->mout[i] = gr_row_hdr_of(row)->meta;
        } else if (op == OP_INSERT) {
            if (s == GR_NO_ROW) {
                int rc = row_create(t, p, key, h[i], c->now, false, &s);
                if (rc) {
                    if (!c->rc) c->rc = rc;
                    continue;
                }
            }
            uint8_t *row = gr_row_ptr(t, p, s);
            write_weights_in(t, row, c->win + (size_t)i * dim);
            if (c->sin)
                memcpy(gr_row_state(t, row), c->sin + (size_t)i * t->state_floats,
                       t->state_floats * sizeof(float));
            else
                gr_table_init_state(t, gr_row_state(t, row));
            if (c->min) {
                gr_row_hdr_of(row)->meta = c->min[i];
            } else {
                gr_row_hdr_of(row)->meta.last_update = c->now;
                gr_row_hdr_of(row)->meta.hits = 0;
            }
            dirty_mark(p, s);
        } else if (op == OP_DELETE) {
            if (s != GR_NO_ROW) {
                gr_part_remove_locked(t, p, pos, s);
                c->count++;
            }
        }
    }
#undef PROBE
}

static void run_group_op(gr_table *t, gr_part *p, op_ctx *c, const uint32_t *ix, uint32_t m,
                         int op)
{
    switch (op) {
    case OP_LOOKUP: run_group(t, p, c, ix, m, OP_LOOKUP); break;
    case OP_LOOKUP_RO: run_group(t, p, c, ix, m, OP_LOOKUP_RO); break;
    case OP_APPLY: run_group(t, p, c, ix, m, OP_APPLY); break;
    case OP_GET: run_group(t, p, c, ix, m, OP_GET); break;
    case OP_INSERT: run_group(t, p, c, ix, m, OP_INSERT); break;
    case OP_DELETE: run_group(t, p, c, ix, m, OP_DELETE); break;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Hashes the batch, groups its keys by partition (stable, so repeated keys keep their order)
 * and runs each group under one lock hold. Groups whose lock is busy are deferred to a second
 * pass, so two threads working on the same table rarely wait for each other. */
static int run_batch(gr_table *t, op_ctx *c, size_t n, int op)
{
    if (n == 0) return GR_OK;
    if (n > UINT32_MAX / 2)
        return gr_seterr(GR_ETOOBIG, "table '%s': batch of %zu keys is too large", t->spec.name, n);
    uint32_t np = t->nparts;
    bool counting = np <= 4096 || n >= np / 8;
    size_t ng_max = n < np ? n : np;
    size_t bytes = n * 8 /* h */ + n * 4 /* order */ + (ng_max + 1) * 4 /* gstart */ +
                   ng_max * 4 /* gpart */ + ng_max /* deferred */ +
                   (counting ? ((size_t)np + 1) * 4 : n * 8) + 8 /* alignment */;
    uint8_t *buf = malloc(bytes);
    if (!buf) return oom_error(t, bytes);
    uint64_t *h = (uint64_t *)buf;
    uint32_t *order = (uint32_t *)(h + n);
    uint32_t *gstart = order + n;
    uint32_t *gpart = gstart + ng_max + 1;
    uint8_t *deferred = (uint8_t *)(gpart + ng_max);
    uint32_t ng = 0;
    for (size_t i = 0; i < n; i++) h[i] = gr_table_hash(c->keys[i]);
    c->h = h;
    if (np == 1) {
        for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
        gstart[0] = 0;
        gpart[0] = 0;
        ng = 1;
    } else if (counting) {
        uint32_t *cnt = (uint32_t *)(((uintptr_t)(deferred + ng_max) + 3) & ~(uintptr_t)3);
        memset(cnt, 0, ((size_t)np + 1) * 4);
        for (size_t i = 0; i < n; i++) cnt[gr_part_of(t, h[i]) + 1]++;
        for (uint32_t q = 0; q < np; q++) {
            if (cnt[q + 1]) {
                gstart[ng] = cnt[q];
                gpart[ng++] = q;
            }
            cnt[q + 1] += cnt[q];
        }
        for (size_t i = 0; i < n; i++) order[cnt[gr_part_of(t, h[i])]++] = (uint32_t)i;
    } else {
        uint64_t *pairs = (uint64_t *)(((uintptr_t)(deferred + ng_max) + 7) & ~(uintptr_t)7);
        for (size_t i = 0; i < n; i++) pairs[i] = ((uint64_t)gr_part_of(t, h[i]) << 32) | i;
        qsort(pairs, n, sizeof *pairs, cmp_u64);
        for (size_t i = 0; i < n; i++) {
            uint32_t q = (uint32_t)(pairs[i] >> 32);
            if (ng == 0 || gpart[ng - 1] != q) {
                gstart[ng] = (uint32_t)i;
                gpart[ng++] = q;
            }
            order[i] = (uint32_t)pairs[i];
        }
    }
    gstart[ng] = (uint32_t)n;
    c->now = gr_table_clock(t);
    uint32_t first = atomic_fetch_add_explicit(&t->start_ctr, 0x9e3779b9u, memory_order_relaxed);
    first = (uint32_t)(((uint64_t)first * ng) >> 32);
    uint32_t ndef = 0;
    for (uint32_t k = 0; k < ng; k++) {
        uint32_t g = first + k < ng ? first + k : first + k - ng;
        gr_part *p = &t->parts[gpart[g]];
        if (ng > 1 && !gr_spin_trylock(&p->lock)) {
            deferred[g] = 1;
            ndef++;
            continue;
        }
        if (ng == 1) gr_spin_lock(&p->lock);
        deferred[g] = 0;
        run_group_op(t, p, c, order + gstart[g], gstart[g + 1] - gstart[g], op);
        gr_spin_unlock(&p->lock);
    }
    for (uint32_t g = 0; ndef && g < ng; g++) {
        if (!deferred[g]) continue;
        gr_part *p = &t->parts[gpart[g]];
        gr_spin_lock(&p->lock);
        run_group_op(t, p, c, order + gstart[g], gstart[g + 1] - gstart[g], op);
        gr_spin_unlock(&p->lock);
    }
    free(buf);
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

int gr_table_lookup(gr_table *t, const uint64_t *keys, size_t n, float *out, unsigned flags)
{
    CHECK_T("gr_table_lookup");
    CHECK_PTR(keys, "lookup", "keys");
    CHECK_PTR(out, "lookup", "out");
    if (flags & ~GR_LOOKUP_READONLY)
        return gr_seterr(GR_EINVAL, "lookup on table '%s': unknown flags 0x%x", t->spec.name,
                         flags & ~GR_LOOKUP_READONLY);
    op_ctx c = {.keys = keys, .out = out};
    return run_batch(t, &c, n, (flags & GR_LOOKUP_READONLY) ? OP_LOOKUP_RO : OP_LOOKUP);
}

static int check_finite(gr_table *t, const char *what, const uint64_t *keys, const float *v,
                        size_t n, uint32_t per)
{
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

int gr_table_apply(gr_table *t, const uint64_t *keys, size_t n, const float *grads)
{
    CHECK_T("gr_table_apply");
    CHECK_PTR(keys, "apply", "keys");
    CHECK_PTR(grads, "apply", "grads");
    int rc = check_finite(t, "gradient", keys, grads, n, t->dim);
    if (rc) return rc;
    op_ctx c = {.keys = keys, .grads = grads};
    return run_batch(t, &c, n, OP_APPLY);
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
