/* Internals of the table part, shared by its .c files and by its unit tests: the partition
 * and row layout, the per-partition lock, the index, the half-float conversion and the
 * optimizer/initializer kernels. Nothing outside src/table and tests/unit/table includes it. */
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

/* Row header: key + public metadata. Weights follow, then the optimizer state. */
typedef struct gr_row_hdr {
    uint64_t key; /* for a free slot: the next free slot (or GR_NO_ROW) */
    gr_row_meta meta;
} gr_row_hdr;

/* Test-and-test-and-set spinlock with pause, falling back to sched_yield so that oversubscribed
 * threads (more threads than cores) do not burn their time slice against a preempted holder. */
typedef struct gr_spin {
    atomic_uint v;
} gr_spin;

void gr_spin_lock_slow(gr_spin *l);
static inline void gr_spin_lock(gr_spin *l)
{
    if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire)) return;
    gr_spin_lock_slow(l);
}
static inline bool gr_spin_trylock(gr_spin *l)
{
    return atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
           !atomic_exchange_explicit(&l->v, 1, memory_order_acquire);
}
static inline void gr_spin_unlock(gr_spin *l)
{
    atomic_store_explicit(&l->v, 0, memory_order_release);
}

/* One partition: its lock, its index, its row slots and its counters. Everything except the
 * two atomics used for racy prefetching (idx, cap) is touched only under `lock`. */
typedef struct gr_part {
    gr_spin lock;
    uint32_t rows;      /* live rows (= index entries) */
    uint64_t *idx;      /* index entries */
    uint32_t cap;       /* index buckets; 0 before the first insert */
    uint32_t hw;        /* high-water mark of row slots */
    uint32_t free_head; /* intrusive free list of slots, GR_NO_ROW when empty */
    uint32_t row_cap;   /* capacity share of this partition, UINT32_MAX = none */
    uint32_t nchunks, chunks_cap;
    uint32_t c0_rows;  /* rows allocated in chunk 0, which grows by doubling */
    uint8_t **chunks;
    uint64_t *live;  /* 1 bit per slot */
    uint64_t *dirty; /* 4 bits per slot (one per tracker), 16 slots per word */
    uint32_t live_words, dirty_words;
    uint32_t gen;      /* bumped when a row is removed: cached slots must be re-probed */
    uint64_t rng;      /* eviction sampling */
    uint64_t dirty_n[GR_TABLE_TRACKERS];
    uint64_t hits, misses, admits, rejects, evictions, expirations, applies;
    uint32_t expire_cursor; /* next slot for gr_table_evict_expired (per pass) */
} __attribute__((aligned(64))) gr_part;

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
    uint32_t chunk_shift, chunk_mask;   /* rows per chunk = 1 << chunk_shift */
    uint32_t chunk_bytes;
    uint32_t pbits, nparts;
    gr_part *parts;
    uint64_t created_ns;
    atomic_uint pinned_clock;
    atomic_ullong mem_used; /* bytes counted against mem_limit */
    atomic_ullong nrows;    /* live rows, for messages; stats sum the partitions */
    atomic_uint start_ctr;  /* spreads the first partition each batch visits */
    uint64_t base_bytes;    /* fixed structures (partitions, sketch) */
    gr_cms cms;
    bool use_cms;
    uint64_t admit_threshold; /* probability as a 53-bit fraction */
    /* Chunk allocator: chunks come from 2 MiB-aligned slabs advised for huge pages once the
     * table is past a few MiB; small tables use malloc per chunk. */
    pthread_mutex_t alloc_lock;
    uint8_t *slab_cur;
    size_t slab_left;
    uint64_t malloc_bytes;
    void **blocks; /* every allocation made for chunks >= 1, freed at destroy */
    size_t nblocks, blocks_cap;
};

/* The table-internal hash; partitions from its high bits, index tag from its low 32 bits. */
#define GR_TABLE_HASH_SEED 0x67727461626c6531ull
uint64_t gr_table_hash(uint64_t key);

static inline uint32_t gr_part_of(const gr_table *t, uint64_t h)
{
    return t->pbits ? (uint32_t)(h >> (64 - t->pbits)) : 0;
}

static inline uint32_t gr_idx_home(uint32_t tag, uint32_t cap)
{
    return (uint32_t)(((uint64_t)tag * cap) >> 32);
}

static inline uint8_t *gr_row_ptr(const gr_table *t, const gr_part *p, uint32_t slot)
{
    return p->chunks[slot >> t->chunk_shift] + (size_t)(slot & t->chunk_mask) * t->stride;
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

/* Half floats (IEEE binary16), round to nearest even; portable bit manipulation. */
uint16_t gr_f32_to_f16(float f);
float gr_f16_to_f32(uint16_t h);

/* Kernels (opt.c). */
void gr_table_init_row(const gr_table *t, uint64_t key, float *w /* dim */);
void gr_table_init_state(const gr_table *t, float *state);
/* One optimizer step on f32 weights w with gradient g; state is the row's state. */
void gr_table_opt_step(const gr_table_spec *spec, uint32_t dim, float *w, float *state,
                       const float *g);

/* Admission (admit.c). */
int gr_cms_init(gr_cms *c, uint32_t width);
void gr_cms_fini(gr_cms *c);
/* Adds one sighting and returns the estimated count (after it). */
uint32_t gr_cms_add(gr_cms *c, uint64_t h);
uint32_t gr_cms_estimate(const gr_cms *c, uint64_t h);
/* Halves every counter when enough sightings accumulated; call outside partition locks. */
void gr_cms_maybe_age(gr_cms *c);

#endif
