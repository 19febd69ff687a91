/* Internals of the table part, shared by its .c files and by its unit tests: the partition
 * and row layout, the per-partition lock, the index and the optimizer/initializer kernels
 * (half floats are core's gr_f32_to_f16 / gr_f16_to_f32). Nothing outside src/table and
 * tests/unit/table includes it. */
#ifndef GRANARY_TABLE_INTERNAL_H
#define GRANARY_TABLE_INTERNAL_H

#include "granary/table.h"

#include <pthread.h>
#include <stdatomic.h>

/* Index entries are 8 bytes: low 32 bits = the low 32 bits of the key's hash (the tag), high
 * 32 bits = row slot. The key itself lives in the row header, so a tag match is confirmed on
 * the row the lookup reads anyway. */
#define GR_IDX_EMPTY_ROW UINT32_MAX
#define GR_IDX_EMPTY UINT64_MAX
#define GR_NO_ROW UINT32_MAX
#define GR_IDX_MIN_CAP 16u
#define GR_IDX_LOAD_NUM 4u /* grow past 4/5 = 0.8 load */
#define GR_IDX_LOAD_DEN 5u
#define GR_IDX_PAGE_ALIGN 4096u /* index blocks this large are given back when retired */
#define GR_CHUNK_TARGET 8192u   /* bytes of a chunk of rows: the smallest power-of-two row
                                   count (>= 64) reaching this */

/* Bytes of an index block of `cap` buckets (header + entries). */
static inline size_t gr_idx_block_bytes(uint32_t cap) { return 8 + (size_t)cap * 8; }
/* The index capacity after `old`: doubling while small; past 4096 buckets, 1.25x steps keep
 * the load between 0.64 and 0.8, which holds the index near 11 bytes per row (amortised
 * rehash cost: ~4 moves per insert). */
static inline uint32_t gr_idx_next_cap(uint32_t old)
{
    uint64_t nc = old == 0 ? GR_IDX_MIN_CAP : old < 4096 ? (uint64_t)old * 2 : (uint64_t)old * 5 / 4;
    return nc > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)nc;
}
/* Bytes accounted for one chunk of rows: the rows and their tracker bits (live 1, dirty 4). */
static inline uint64_t gr_chunk_bytes(uint32_t chunk_rows, uint32_t stride)
{
    return (uint64_t)chunk_rows * stride + chunk_rows * 5 / 8;
}

/* Row header: key + public metadata. Weights follow, then the optimizer state. A free slot
 * has hits == GR_HITS_FREE (live rows saturate one below) and its key field links the
 * partition's free list. */
#define GR_HITS_FREE UINT32_MAX
#define GR_HITS_MAX (UINT32_MAX - 1)
typedef struct gr_row_hdr {
    uint64_t key; /* for a free slot: the next free slot (or GR_NO_ROW) */
    gr_row_meta meta;
} gr_row_hdr;

/* A partition's lock: test-and-test-and-set with pause for the short waits (a row's step, a
 * lookup), then asleep on a futex for the long ones, so that a waiter whose holder was
 * preempted or is faulting in memory (more threads than cores) gives its core to someone who
 * can use it. v: 0 free, 1 held, 2 held and someone may be asleep on it (the unlock wakes one). */
typedef struct gr_spin {
    atomic_uint v;
} gr_spin;

void gr_spin_lock_slow(gr_spin *l);
void gr_spin_wake(gr_spin *l);

/* Prefetch for writing where the CPU has it (PREFETCHW), else a plain prefetch; used on lock
 * lines about to be taken so they arrive owned instead of shared. */
extern bool gr_have_prefetchw;
static inline void gr_prefetch_w(const void *p)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (gr_have_prefetchw) {
        __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
        return;
    }
#endif
    __builtin_prefetch(p, 1, 3);
}
static inline void gr_spin_lock(gr_spin *l)
{
    unsigned free = 0;
    if (atomic_compare_exchange_strong_explicit(&l->v, &free, 1, memory_order_acquire,
                                                memory_order_relaxed))
        return;
    gr_spin_lock_slow(l);
}
static inline bool gr_spin_trylock(gr_spin *l)
{
    unsigned free = 0;
    return atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
           atomic_compare_exchange_strong_explicit(&l->v, &free, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}
static inline void gr_spin_unlock(gr_spin *l)
{
    if (atomic_exchange_explicit(&l->v, 0, memory_order_release) == 2) gr_spin_wake(l);
}

/* One partition: its lock, its index, its row slots and its counters. Everything but `seq`
 * and `pf_idx` is touched only under `lock`. The first cache line holds what a lock-free
 * lookup reads, and otherwise only what changes when `seq` changes anyway (row creation and
 * removal write both) or hardly ever; the lock and what lookups that take it write (counts
 * of cold rows and misses) start the second line. So lookups that lock (rows below
 * GR_HITS_EXACT hits) do not take the first line away from the lock-free readers on other
 * cores. Three lines in all, as before this split (the planner counts them). */
typedef struct gr_part {
    /* Write sequence (a seqlock beside the spinlock): odd while a holder of `lock` changes a
     * row's key, free marker or weights, even otherwise. Lookups read rows without the lock
     * and keep what they read only if `seq` was even and unchanged around it (see
     * "Lock-free lookups" in lookup.c). Written only under `lock`. */
    atomic_uint seq;
    uint32_t row_cap; /* capacity share of this partition, UINT32_MAX = none */
    /* idx as published for the lock-free probe stage (release-stored after the array is
     * filled); see "index memory" in table.c. Never NULL: gr_idx_none until the first
     * insert. */
    _Atomic(const uint64_t *) pf_idx;
    /* Row slots: the partition owns whole chunks of the table's arena. */
    uint32_t *chunk_ids; /* chunk k covers slots [id * chunk_rows, (id + 1) * chunk_rows) */
    uint32_t nchunks, chunks_cap;
    uint32_t last_used; /* slots handed out from the last chunk */
    uint32_t free_head; /* intrusive free list of slots, GR_NO_ROW when empty */
    uint64_t admits;
    uint64_t rng; /* eviction sampling */
    _Alignas(64) gr_spin lock;
    uint32_t cap;  /* index buckets; 0 before the first insert */
    uint64_t *idx; /* index entries (the block's header word, its capacity, is idx[-1]) */
    uint32_t rows; /* live rows (= index entries) */
    uint64_t hits, misses, applies; /* hits: those found under the lock (see lookup_hits) */
    uint64_t rejects, evictions;
    uint64_t expirations;
    uint64_t dirty_n[GR_TABLE_TRACKERS];
    uint64_t nonfinite_rejected, nonfinite_clipped; /* see gr_nonfinite */
} __attribute__((aligned(64))) gr_part;
_Static_assert(sizeof(gr_part) == 192, "gr_part: three cache lines");

/* The published index of a partition that has none yet: one empty bucket after its header
 * word (the capacity), so that the probe stages need no test for a missing index. */
extern const uint64_t gr_idx_none[2];

/* A region of address space that index arrays are carved from. */
#define GR_IREGIONS 40
typedef struct gr_iregion {
    uint8_t *base;           /* 2 MiB aligned past the first region */
    size_t len, used, committed;
    void *map;               /* the mapping, for munmap */
    size_t map_len;
} gr_iregion;

/* Count-min sketch for admission (depth 4), with aging: counters halve every 8 * width
 * increments so that the sketch forgets keys seen long ago. */
#define GR_CMS_DEPTH 4
#define GR_CMS_WIDTH (1u << 17)
typedef struct gr_cms {
    atomic_uint *c; /* depth * width */
    uint32_t width_mask;
    atomic_ullong events;
    atomic_flag aging;
} gr_cms;

struct gr_table {
    gr_table_spec spec;
    uint32_t dim, state_floats, wbytes; /* wbytes: bytes of the weights */
    uint32_t stride;                    /* bytes per row slot */
    uint32_t chunk_shift, chunk_rows;   /* rows per chunk = 1 << chunk_shift (>= 64) */
    uint32_t pbits, nparts;
    gr_part *parts;
    uint64_t created_ns;
    atomic_uint pinned_clock;
    atomic_ullong mem_used; /* bytes counted against mem_limit */
    atomic_ullong nrows;    /* live rows, for messages (creations are added once per batch,
                               so it may lag a batch in flight); stats sum the partitions */
    uint64_t base_bytes;    /* fixed structures (partitions, sketch) */
    gr_cms cms;
    bool use_cms;
    uint64_t admit_threshold; /* probability as a 53-bit fraction */
    /* The row arena: one reserved range of address space per table, committed as it fills,
     * so a row's address is rowmem + slot * stride (no lookup on the hot path) and rows never
     * move. live (1 bit per slot) and dirty (4 bits per slot, one per tracker) are reserved
     * alongside; chunks are 64-slot aligned, so no two partitions share a bitset word. */
    uint8_t *rowmem;
    uint64_t *live, *dirty;
    void *res_rows, *res_live, *res_dirty; /* the mappings, for munmap */
    size_t res_rows_len, res_live_len, res_dirty_len;
    uint32_t max_rows;       /* slots the reservation holds */
    pthread_mutex_t alloc_lock; /* guards carved, committed's updates and ireg */
    uint32_t carved;            /* slots handed to partitions (whole chunks) */
    atomic_uint committed;      /* slots made readable and writable (read without the lock) */
    /* Row memory past this many bytes is committed on 4 KiB pages (gr_table_set_huge_rows;
     * SIZE_MAX: all of it on huge pages). Under alloc_lock. */
    size_t huge_until;
    gr_iregion ireg[GR_IREGIONS]; /* index memory, see table.c */
    uint32_t nireg;
    /* TTL passes: lock holds so far and the most slots one hold visited (checked by tests). */
    atomic_ullong expire_holds;
    atomic_uint expire_max_slice;
    /* Lookups served without the lock, added once per batch (stats add them to the
     * partitions' hits), and the number of batches that drew random numbers for hit
     * counting (each such batch seeds its stream from it). Their own line: written once per
     * batch by every thread. */
    _Alignas(64) atomic_ullong lookup_hits;
    atomic_ullong hit_streams;
    uint64_t prefaulted; /* bytes gr_table_prefault had the kernel hand out (prefault.c) */
    /* gr_table_prefault_ahead (prefault.c): the row memory [rowmem, rowmem + ahead_end) has
     * been handed out by the kernel, and the bytes that took (under alloc_lock). */
    size_t ahead_end;
    uint64_t ahead_bytes;
};

/* A lookup batch's hit-counting random stream, seeded on its first draw. */
typedef struct gr_hit_rng {
    uint64_t s;
    bool seeded;
} gr_hit_rng;

/* A lookup batch's state shared by its lock-free path (lookup.c) and its locked path
 * (gr_lookup_locked). */
typedef struct gr_lookup_ctx {
    gr_hit_rng rng;
    bool create; /* create missing rows (not GR_LOOKUP_READONLY) */
    uint32_t now;
    uint64_t created; /* rows created, added to t->nrows once per batch */
    int rc; /* the first error of the batch (a row that could not be created) */
} gr_lookup_ctx;

/* Seqlock writer side, called with p->lock held around any change to a row's key, free marker
 * (hits == GR_HITS_FREE) or weights. The odd value must be visible before the row changes
 * (release fence after it) and the row changes before the even value (release store). Under
 * TSan, which does not model fences (and GCC warns about them), a compiler barrier stands in:
 * x86 keeps stores in order, and the optimistic reader is not instrumented anyway. */
static inline void gr_part_write_begin(gr_part *p)
{
    unsigned q = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, q + 1, memory_order_relaxed);
#ifdef __SANITIZE_THREAD__
    atomic_signal_fence(memory_order_seq_cst);
#else
    atomic_thread_fence(memory_order_release);
#endif
}
static inline void gr_part_write_end(gr_part *p)
{
    unsigned q = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, q + 1, memory_order_release);
}

/* Approximate hit counting for lookups (a Morris counter that keeps counting in hits). A
 * lookup that finds a row adds to its hit count the step gr_hits_step returns: 1 while the
 * count is below GR_HITS_EXACT (small counts are exact), above it
 * m = 2^(floor(log2(count)) - GR_HITS_EXACT_BITS + 1) with probability 1/m, else 0. Each
 * lookup adds 1 in expectation, so the count stays an unbiased estimate (m is 1/64 to 1/32 of
 * the count; simulated relative standard deviation 6 % at 100 hits, 11 % at 10^4), while a row
 * with c hits is written on about one lookup in c / 48 instead of every one: hot rows stay
 * clean in the caches of every core that reads them. `r` is a random 64-bit number (read only
 * above the exact range). Applies count exactly (they write the row anyway). */
#define GR_HITS_EXACT_BITS 6u
#define GR_HITS_EXACT (1u << GR_HITS_EXACT_BITS)
static inline uint32_t gr_hits_step(uint32_t hits, uint64_t r)
{
    if (hits < GR_HITS_EXACT) return 1;
    /* sh = floor(log2(hits)) - GR_HITS_EXACT_BITS + 1, in 1..26; the low sh bits of r are
     * all zero iff r shifted left by 64 - sh is zero (fewer instructions than the mask). */
    const unsigned lz = (unsigned)__builtin_clz(hits);
    const unsigned sh = 32u - GR_HITS_EXACT_BITS - lz;
    return (r << (64u - sh)) == 0 ? 1u << sh : 0;
}
static inline uint32_t gr_hits_add(uint32_t hits, uint32_t m)
{
    return hits >= GR_HITS_MAX - m ? GR_HITS_MAX : hits + m;
}

/* The hit-count step of one lookup (gr_hits_step), drawing from the batch's random stream
 * when the count is past the exact range. The stream is seeded from the table's seed and a
 * per-table counter of streams, so a single-threaded sequence of calls counts the same way
 * every run. */
static inline uint32_t gr_lookup_hits_step(gr_table *t, gr_hit_rng *r, uint32_t hits)
{
    if (hits < GR_HITS_EXACT) return 1;
    if (!r->seeded) {
        uint64_t n = atomic_fetch_add_explicit(&t->hit_streams, 1, memory_order_relaxed);
        r->s = gr_hash_key(n, t->spec.seed ^ 0x68697473ull);
        r->seeded = true;
    }
    /* splitmix64, inlined (core's gr_splitmix64 is a call per hot hit) */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return gr_hits_step(hits, z ^ (z >> 31));
}

/* A lookup's stage C with the partition lock (table.c): the row of `key` (hash h; `hint` is
 * the probe stage's slot, or GR_NO_ROW) copied to dst as f32, its hit counted; or, for a
 * missing key, the row created (admission permitting, unless !c->create) or zeros. Takes and
 * releases p's lock. */
void gr_lookup_locked(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t hint,
                      float *dst, gr_lookup_ctx *c);

/* The table-internal hash; partitions from its high bits, index tag from its low 32 bits. */
#define GR_TABLE_HASH_SEED 0x67727461626c6531ull
uint64_t gr_table_hash(uint64_t key);

/* gr_table_hash written out (the same values: test_table_lookup.c checks them against it),
 * so that a loop of them vectorises: XXH3_64bits_withSeed of an 8-byte input is XXH3's
 * 4-to-8-byte path, which reads the key's two halves swapped, XORs a constant made of the
 * default secret and the seed (GR_TABLE_HASH_BITFLIP, for GR_TABLE_HASH_SEED) and finishes
 * with the rrmxmx mix. */
#define GR_TABLE_HASH_BITFLIP 0x7123997163807071ull
static inline uint64_t gr_table_hash_inline(uint64_t key)
{
    uint64_t h = ((key << 32) | (key >> 32)) ^ GR_TABLE_HASH_BITFLIP;
    h ^= ((h << 49) | (h >> 15)) ^ ((h << 24) | (h >> 40));
    h *= 0x9FB21C651E98DF25ull;
    h ^= (h >> 35) + 8;
    h *= 0x9FB21C651E98DF25ull;
    return h ^ (h >> 28);
}

/* A table's layout from its spec, as gr_table_create lays it out (estimate.c predicts memory
 * from the same numbers). */
typedef struct gr_table_geometry {
    uint32_t wbytes, stride, chunk_rows, nparts;
    uint64_t base_bytes; /* the table and partition structs, and the admission sketch */
} gr_table_geometry;
void gr_table_geometry_of(const gr_table_spec *spec, gr_table_geometry *g);

/* The partition: the top pbits bits of the hash (two shifts so that pbits = 0 is defined). */
static inline uint32_t gr_part_of(const gr_table *t, uint64_t h)
{
    return (uint32_t)((h >> 32) >> (32 - t->pbits));
}

static inline uint32_t gr_idx_home(uint32_t tag, uint32_t cap)
{
    return (uint32_t)(((uint64_t)tag * cap) >> 32);
}

/* Index entries are read with relaxed atomics: the probe stages read them without the
 * partition's lock (see "index memory" in table.c). */
static inline uint64_t gr_idx_load(const uint64_t *e)
{
    return __atomic_load_n(e, __ATOMIC_RELAXED);
}

/* The probe stage, without the lock: the first slot whose tag matches in the index array `e`
 * of `cap` buckets (whatever array the partition had published when stage A read it),
 * starting at bucket i, or GR_NO_ROW. The result is a hint, checked in stage C; the walk is
 * bounded because a stale array may hold anything. */
static inline uint32_t gr_idx_probe_hint(const uint64_t *e, uint32_t cap, uint32_t i,
                                         uint32_t tag)
{
    /* The home bucket first, in straight-line code: most keys are found there. An empty
     * bucket whose tag bits happen to equal the tag names slot GR_NO_ROW, which is no hint. */
    uint64_t x = gr_idx_load(&e[i]);
    if (__builtin_expect((uint32_t)x == tag, 1))
        return x != 0 ? (uint32_t)(x >> 32) : GR_NO_ROW;
    for (unsigned step = 1; step < 64; step++) {
        /* 0 is what a retired array's returned pages read as: no hint (a real entry for slot
         * 0 with tag 0 only loses its prefetch). Every other entry of any of this partition's
         * arrays, current or retired, names a slot of this partition, which the lock-free
         * lookup relies on (its seqlock covers this partition's slots only). */
        if (x == GR_IDX_EMPTY || x == 0) return GR_NO_ROW;
        if (++i == cap) i = 0;
        x = gr_idx_load(&e[i]);
        if ((uint32_t)x == tag) return x != 0 ? (uint32_t)(x >> 32) : GR_NO_ROW;
    }
    return GR_NO_ROW;
}

static inline uint8_t *gr_row_ptr(const gr_table *t, uint32_t slot)
{
    return t->rowmem + (size_t)slot * t->stride;
}

static inline bool gr_live_get(const gr_table *t, uint32_t s)
{
    return (t->live[s >> 6] >> (s & 63)) & 1u;
}

/* Slots a partition has handed out, in its own order: position k of the partition. */
static inline uint32_t gr_part_span(const gr_table *t, const gr_part *p)
{
    return p->nchunks ? (p->nchunks - 1) * t->chunk_rows + p->last_used : 0;
}
static inline uint32_t gr_part_slot(const gr_table *t, const gr_part *p, uint32_t k)
{
    return (p->chunk_ids[k >> t->chunk_shift] << t->chunk_shift) | (k & (t->chunk_rows - 1));
}

static inline gr_row_hdr *gr_row_hdr_of(uint8_t *row) { return (gr_row_hdr *)row; }
static inline void *gr_row_weights(uint8_t *row) { return row + sizeof(gr_row_hdr); }
static inline float *gr_row_state(const gr_table *t, uint8_t *row)
{
    return (float *)(row + sizeof(gr_row_hdr) + t->wbytes);
}

/* Index and row removal, lock held (table.c). */
uint32_t gr_part_find_locked(const gr_table *t, gr_part *p, uint64_t key, uint64_t h,
                             uint32_t *pos);
void gr_part_remove_locked(gr_table *t, gr_part *p, uint32_t pos, uint32_t slot);

/* Hooks for the bulk insert (table.c, used by bulk.c). gr_table_check_insert: the checks
 * gr_table_insert runs before writing anything (finite, f16 range). With p's lock held:
 * gr_part_reserve_locked grows p's index until `rows` rows fit under its load factor;
 * gr_part_new_row_locked takes a slot for a key that is not in p (the caller reserved the
 * index, checked the capacity, and adds the row to t->nrows itself); gr_part_store_row_locked
 * writes a row's weights, state (NULL: initial) and metadata (NULL: now, 0 hits) and marks it
 * dirty, as gr_table_insert does. */
int gr_table_check_insert(gr_table *t, const uint64_t *keys, size_t n, const float *weights,
                          const float *state);
int gr_part_reserve_locked(gr_table *t, gr_part *p, uint64_t rows);
int gr_part_new_row_locked(gr_table *t, gr_part *p, uint64_t key, uint64_t h, uint32_t *slot);
void gr_part_store_row_locked(gr_table *t, gr_part *p, uint32_t s, const float *w,
                              const float *state, const gr_row_meta *meta, uint32_t now);

/* Hooks for gr_table_prefault (table.c, used by prefault.c; each takes alloc_lock).
 * gr_table_arena_open commits slots [0, slots) of the row arena as filling them would and
 * gives the committed ranges of the rows, the live bits and the dirty bits. gr_table_idx_open
 * opens the table's first index region, of at least `bytes` and committed whole, so that the
 * index arrays a fill sized by gr_table_reserve allocates are all carved from it; GR_EINVAL
 * when the table has index memory already. gr_table_reserve_each: the rows gr_table_reserve
 * sizes each partition's index for (bulk.c). */
typedef struct gr_mem_range {
    uint8_t *p;
    size_t len;
} gr_mem_range;
int gr_table_arena_open(gr_table *t, uint32_t slots, gr_mem_range out[3]);
/* gr_table_prefault_ahead's hook: the row memory from what is already handed out (ahead_end,
 * or the end of the carved slots' page) to `ahead` bytes past the carved slots, committed
 * first if it is not; empty when that is done already. Takes alloc_lock. */
int gr_table_arena_ahead(gr_table *t, size_t ahead, gr_mem_range *out);
/* Records that [rowmem, end) is handed out (ahead_end only grows) and `bytes` more were. */
void gr_table_ahead_done(gr_table *t, size_t end, uint64_t bytes);
int gr_table_idx_open(gr_table *t, size_t bytes, gr_mem_range *out);
uint64_t gr_table_reserve_each(const gr_table *t, uint64_t rows);

/* Kernels (opt.c). */
void gr_table_init_row(const gr_table *t, uint64_t key, float *w /* dim */);
void gr_table_init_state(const gr_table *t, float *state);
/* One optimizer step on f32 weights w with gradient g; state is the row's state. */
void gr_table_opt_step(const gr_table_spec *spec, uint32_t dim, float *w, float *state,
                       const float *g);
/* The finite policy (gr_nonfinite), opt.c. wmax is the largest weight the storage type holds
 * (FLT_MAX for f32, 65504 for f16). gr_row_finite: every weight within +-wmax (rounding
 * included: an f16 weight is finite below 65520) and every state value finite.
 * gr_row_clip: inf (or beyond wmax) clamped to +-wmax (state: +-FLT_MAX), NaN back to the
 * value before the step. */
bool gr_row_finite(const float *w, uint32_t dim, const float *state, uint32_t nstate,
                   float wlimit);
void gr_row_clip(float *w, const float *w_old, uint32_t dim, float *state,
                 const float *state_old, uint32_t nstate, float wmax);

/* Admission (admit.c). */
int gr_cms_init(gr_cms *c, uint32_t width);
void gr_cms_fini(gr_cms *c);
/* Adds one sighting and returns the estimated count (after it). */
uint32_t gr_cms_add(gr_cms *c, uint64_t h);
uint32_t gr_cms_estimate(const gr_cms *c, uint64_t h);
/* Halves every counter when enough sightings accumulated; call outside partition locks. */
void gr_cms_maybe_age(gr_cms *c);

#endif
