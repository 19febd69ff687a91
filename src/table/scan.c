/* Whole-table passes: scans (checkpoints), dirty scans (incremental checkpoints, serving
 * sync), TTL expiry and stats. Every pass walks row slots in order, one partition at a time,
 * and holds a partition lock for a bounded slice of slots, so lookups never wait long. */
#include "table/table_internal.h"

#include <stdlib.h>
#include <string.h>

#define SCAN_SLICE 1024u        /* slots per lock hold in scans (a multiple of 16) */
#define EXPIRE_SLICE 1024u      /* slots per lock hold in TTL expiry */
#define EXPIRE_SLICE_NS 200000u /* and at most this long (checked every 64 slots) */

typedef struct scan_buf {
    float w[GR_TABLE_DIM_MAX];
} scan_buf;

static int visit(gr_table *t, gr_part *p, uint32_t s, gr_table_scan_fn fn, void *ctx,
                 scan_buf *b)
{
    (void)p;
    uint8_t *row = gr_row_ptr(t, s);
    const gr_row_hdr *hd = gr_row_hdr_of(row);
    const float *w;
    if (t->spec.dtype == GR_DTYPE_F32) {
        w = gr_row_weights(row);
    } else {
        const uint16_t *hw = gr_row_weights(row);
        for (uint32_t i = 0; i < t->dim; i++) b->w[i] = gr_f16_to_f32(hw[i]);
        w = b->w;
    }
    gr_row_meta meta = hd->meta;
    return fn(ctx, hd->key, w, t->state_floats ? gr_row_state(t, row) : NULL, &meta);
}

int gr_table_scan(gr_table *t, gr_table_scan_fn fn, void *ctx)
{
    if (!t || !fn) return gr_seterr(GR_EINVAL, "gr_table_scan: table or callback is NULL");
    scan_buf *b = t->spec.dtype == GR_DTYPE_F16 ? malloc(sizeof *b) : NULL;
    if (t->spec.dtype == GR_DTYPE_F16 && !b)
        return gr_seterr(GR_ENOMEM, "scan of table '%s': out of memory", t->spec.name);
    int rc = 0;
    for (uint32_t q = 0; q < t->nparts && !rc; q++) {
        gr_part *p = &t->parts[q];
        /* Positions (not slots) advance between lock holds: a partition's chunks only ever
         * get appended, so position k names the same slot across slices. */
        for (uint32_t base = 0; !rc; base += SCAN_SLICE) {
            gr_spin_lock(&p->lock);
            uint32_t span = gr_part_span(t, p);
            if (base >= span) {
                gr_spin_unlock(&p->lock);
                break;
            }
            uint32_t end = span - base > SCAN_SLICE ? base + SCAN_SLICE : span;
            for (uint32_t k = base; k < end && !rc; k++) {
                uint32_t s = gr_part_slot(t, p, k);
                if (gr_live_get(t, s)) rc = visit(t, p, s, fn, ctx, b);
            }
            gr_spin_unlock(&p->lock);
        }
    }
    free(b);
    return rc;
}

int gr_table_scan_dirty(gr_table *t, unsigned tracker, gr_table_scan_fn fn, void *ctx)
{
    if (!t || !fn) return gr_seterr(GR_EINVAL, "gr_table_scan_dirty: table or callback is NULL");
    if (tracker >= GR_TABLE_TRACKERS)
        return gr_seterr(GR_EINVAL, "table '%s': dirty tracker %u is out of range 0..%d",
                         t->spec.name, tracker, GR_TABLE_TRACKERS - 1);
    scan_buf *b = t->spec.dtype == GR_DTYPE_F16 ? malloc(sizeof *b) : NULL;
    if (t->spec.dtype == GR_DTYPE_F16 && !b)
        return gr_seterr(GR_ENOMEM, "dirty scan of table '%s': out of memory", t->spec.name);
    const uint64_t mask = 0x1111111111111111ull << tracker;
    int rc = 0;
    for (uint32_t q = 0; q < t->nparts && !rc; q++) {
        gr_part *p = &t->parts[q];
        /* SCAN_SLICE is a multiple of 16, so a slice covers whole dirty words of one chunk. */
        for (uint32_t base = 0; !rc; base += SCAN_SLICE) {
            gr_spin_lock(&p->lock);
            uint32_t span = gr_part_span(t, p);
            if (p->dirty_n[tracker] == 0 || base >= span) {
                gr_spin_unlock(&p->lock);
                break;
            }
            uint32_t end = span - base > SCAN_SLICE ? base + SCAN_SLICE : span;
            for (uint32_t k = base; k < end && !rc; k += 16) {
                uint32_t s0 = gr_part_slot(t, p, k);
                uint64_t *wp = &t->dirty[s0 >> 4];
                uint64_t bits = *wp & mask;
                while (bits && !rc) {
                    unsigned bit = (unsigned)__builtin_ctzll(bits);
                    bits &= bits - 1;
                    rc = visit(t, p, s0 + bit / 4, fn, ctx, b);
                    /* A row the callback refused stays marked for the next scan. */
                    if (!rc) {
                        *wp &= ~(1ull << bit);
                        p->dirty_n[tracker]--;
                    }
                }
            }
            gr_spin_unlock(&p->lock);
        }
    }
    free(b);
    return rc;
}

uint64_t gr_table_dirty_count(gr_table *t, unsigned tracker)
{
    if (!t || tracker >= GR_TABLE_TRACKERS) {
        gr_seterr(GR_EINVAL, "gr_table_dirty_count: bad table or tracker %u", tracker);
        return 0;
    }
    uint64_t n = 0;
    for (uint32_t q = 0; q < t->nparts; q++) {
        gr_part *p = &t->parts[q];
        gr_spin_lock(&p->lock);
        n += p->dirty_n[tracker];
        gr_spin_unlock(&p->lock);
    }
    return n;
}

static void note_slice(gr_table *t, uint32_t slots)
{
    atomic_fetch_add_explicit(&t->expire_holds, 1, memory_order_relaxed);
    unsigned cur = atomic_load_explicit(&t->expire_max_slice, memory_order_relaxed);
    while (slots > cur && !atomic_compare_exchange_weak_explicit(&t->expire_max_slice, &cur,
                                                                 slots, memory_order_relaxed,
                                                                 memory_order_relaxed)) {
    }
}

int gr_table_evict_expired(gr_table *t, uint64_t *evicted)
{
    if (evicted) *evicted = 0;
    if (!t) return gr_seterr(GR_EINVAL, "gr_table_evict_expired: table is NULL");
    uint64_t ttl = t->spec.ttl_s;
    if (!ttl) return GR_OK;
    uint32_t now = gr_table_clock(t);
    if (ttl >= now) return GR_OK; /* nothing can be older than the clock */
    uint32_t cutoff = now - (uint32_t)ttl; /* expired: last_update < cutoff */
    uint64_t total = 0;
    for (uint32_t q = 0; q < t->nparts; q++) {
        gr_part *p = &t->parts[q];
        uint32_t k = 0;
        for (;;) {
            gr_spin_lock(&p->lock);
            uint32_t span = gr_part_span(t, p);
            if (k >= span) {
                gr_spin_unlock(&p->lock);
                break;
            }
            uint64_t t0 = gr_now_ns();
            const uint32_t slice_start = k;
            uint32_t end = span - k > EXPIRE_SLICE ? k + EXPIRE_SLICE : span;
            for (uint32_t start = k; k < end; k++) {
                if (k != start && (k & 63) == 0 && gr_now_ns() - t0 > EXPIRE_SLICE_NS) break;
                uint32_t s = gr_part_slot(t, p, k);
                if (!gr_live_get(t, s)) continue;
                gr_row_hdr *hd = gr_row_hdr_of(gr_row_ptr(t, s));
                if (hd->meta.last_update >= cutoff) continue;
                uint32_t pos;
                uint64_t key = hd->key;
                if (gr_part_find_locked(t, p, key, gr_table_hash(key), &pos) != s) continue;
                gr_part_write_begin(p);
                gr_part_remove_locked(t, p, pos, s);
                gr_part_write_end(p);
                p->expirations++;
                total++;
            }
            gr_spin_unlock(&p->lock);
            note_slice(t, k - slice_start);
        }
    }
    if (evicted) *evicted = total;
    return GR_OK;
}

void gr_table_get_stats(gr_table *t, gr_table_stats *st)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    if (!t) return;
    for (uint32_t q = 0; q < t->nparts; q++) {
        gr_part *p = &t->parts[q];
        gr_spin_lock(&p->lock);
        st->rows += p->rows;
        st->hits += p->hits;
        st->misses += p->misses;
        st->admits += p->admits;
        st->rejects += p->rejects;
        st->evictions += p->evictions;
        st->expirations += p->expirations;
        st->applies += p->applies;
        st->nonfinite_rejected += p->nonfinite_rejected;
        st->nonfinite_clipped += p->nonfinite_clipped;
        gr_spin_unlock(&p->lock);
    }
    /* Lookups served without the lock are counted per batch in the table, not per partition. */
    st->hits += atomic_load_explicit(&t->lookup_hits, memory_order_relaxed);
    st->bytes = t->base_bytes + atomic_load_explicit(&t->mem_used, memory_order_relaxed);
    st->row_bytes = t->stride;
    st->payload_bytes = (uint64_t)t->dim * (t->spec.dtype == GR_DTYPE_F16 ? 2u : 4u) +
                        4ull * t->state_floats;
    st->bytes_per_row = st->rows ? (double)st->bytes / (double)st->rows : 0.0;
    st->mem_limit = t->spec.mem_limit;
}
