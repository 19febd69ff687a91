/* The bulk insert of a restore: a batch of whole rows is grouped by partition (a stable
 * counting sort, so a key's rows keep their order), then each partition is locked once, its
 * index grown once to hold what comes, and its rows written; no admission, hit counting or
 * eviction, and one update of the table's row count per call. Against gr_table_insert's
 * per-key pipeline (a lock, a load-factor check and an atomic count per row) this is what
 * lets a restore run at the speed of copying rows. Several threads fill one table at once by
 * taking disjoint groups of partitions (docs/table.md, "Bulk insert"). */
#include "table/table_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BULK_PF 4 /* rows between a prefetch and its use */

/* Capacity tables evict while they fill: the group's rows go through gr_table_insert. */
static int insert_group_plain(gr_table *t, const gr_table_rows *r, const bool *mine,
                              uint32_t groups)
{
    const uint64_t *keys = r->keys;
    const float *w = r->weights, *state = r->state;
    const gr_row_meta *meta = r->meta;
    const size_t n = r->n;
    if (groups == 1) return gr_table_insert(t, keys, n, w, state, meta);
    const uint32_t dim = t->dim, sf = t->state_floats;
    size_t m = 0;
    uint64_t *k2 = malloc(n * sizeof *k2);
    float *w2 = malloc(n * dim * sizeof *w2);
    float *s2 = state && sf ? malloc(n * sf * sizeof *s2) : NULL;
    gr_row_meta *m2 = meta ? malloc(n * sizeof *m2) : NULL;
    int rc = GR_OK;
    if (!k2 || !w2 || (state && sf && !s2) || (meta && !m2))
        rc = gr_seterr(GR_ENOMEM, "table '%s': out of memory for a bulk insert", t->spec.name);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!mine[gr_part_of(t, r->hashes ? r->hashes[i] : gr_table_hash(keys[i]))]) continue;
        k2[m] = keys[i];
        memcpy(w2 + m * dim, w + i * dim, dim * sizeof *w2);
        if (s2) memcpy(s2 + m * sf, state + i * sf, sf * sizeof *s2);
        if (m2) m2[m] = meta[i];
        m++;
    }
    if (!rc && m) rc = gr_table_insert(t, k2, m, w2, state && sf ? s2 : state, meta ? m2 : NULL);
    free(k2);
    free(w2);
    free(s2);
    free(m2);
    return rc;
}

void gr_table_hash_keys(const gr_table *t, const uint64_t *keys, size_t n, uint64_t *out)
{
    (void)t; /* one hash for every table today; the table is named for the day it is not */
    for (size_t i = 0; i < n; i++) out[i] = gr_table_hash(keys[i]);
}

int gr_table_insert_bulk(gr_table *t, const gr_table_rows *r, uint32_t group, uint32_t groups,
                         unsigned flags)
{
    if (!t || !r) return gr_seterr(GR_EINVAL, "gr_table_insert_bulk: table or rows is NULL");
    const size_t n = r->n;
    const uint64_t *keys = r->keys;
    const float *weights = r->weights, *state = r->state;
    const gr_row_meta *meta = r->meta;
    if (n > 0 && (!keys || !weights))
        return gr_seterr(GR_EINVAL, "bulk insert on table '%s': %s is NULL with n = %zu",
                         t->spec.name, keys ? "weights" : "keys", n);
    if (groups == 0 || group >= groups)
        return gr_seterr(GR_EINVAL, "bulk insert on table '%s': group %u of %u", t->spec.name,
                         group, groups);
    if (flags & ~GR_TABLE_BULK_CHECKED)
        return gr_seterr(GR_EINVAL, "bulk insert on table '%s': unknown flags 0x%x", t->spec.name,
                         flags & ~GR_TABLE_BULK_CHECKED);
    if (n == 0) return GR_OK;
    if (n > UINT32_MAX)
        return gr_seterr(GR_ETOOBIG, "bulk insert on table '%s': %zu rows in one call",
                         t->spec.name, n);
    /* The whole batch, whatever the group: a loop the compiler vectorizes, and every group's
     * call refuses the same batch. */
    int rc = (flags & GR_TABLE_BULK_CHECKED) ? GR_OK
                                             : gr_table_check_insert(t, keys, n, weights, state);
    if (rc) return rc;

    const uint32_t np = t->nparts, dim = t->dim, sf = t->state_floats;
    bool *mine = malloc(np * sizeof *mine);
    uint64_t *hbuf = r->hashes ? NULL : malloc(n * sizeof *hbuf);
    uint32_t *part = malloc(n * sizeof *part);
    uint32_t *order = malloc(n * sizeof *order);
    uint32_t *start = calloc((size_t)np + 1, sizeof *start);
    if (!mine || (!r->hashes && !hbuf) || !part || !order || !start) {
        rc = gr_seterr(GR_ENOMEM, "table '%s': out of memory for a bulk insert", t->spec.name);
        goto out;
    }
    for (uint32_t pi = 0; pi < np; pi++) mine[pi] = pi % groups == group;
    if (t->spec.capacity) {
        rc = insert_group_plain(t, r, mine, groups);
        goto out;
    }
    const uint64_t *h = r->hashes;
    if (!h) {
        gr_table_hash_keys(t, keys, n, hbuf);
        h = hbuf;
    }
    /* The group's rows, counted by partition, then placed in partition order (stable). */
    for (size_t i = 0; i < n; i++) {
        uint32_t pi = gr_part_of(t, h[i]);
        part[i] = mine[pi] ? pi : UINT32_MAX;
        start[pi + 1] += mine[pi];
    }
    for (uint32_t pi = 0; pi < np; pi++) start[pi + 1] += start[pi];
    for (size_t i = 0; i < n; i++)
        if (part[i] != UINT32_MAX) order[start[part[i]]++] = (uint32_t)i;
    /* start[pi] is now the end of partition pi's rows in order[]; its beginning is the end of
     * the partition before. */
    const uint32_t now = gr_table_clock(t);
    uint64_t created = 0;
    for (uint32_t pi = group; pi < np && !rc; pi += groups) {
        uint32_t b = pi ? start[pi - 1] : 0, e = start[pi];
        if (b == e) continue;
        gr_part *p = &t->parts[pi];
        gr_spin_lock(&p->lock);
        /* Rows change: a seqlock write section, so lock-free lookups of this partition (on a
         * table already serving) retry instead of copying a half-written row. */
        gr_part_write_begin(p);
        rc = gr_part_reserve_locked(t, p, (uint64_t)p->rows + (e - b));
        /* The index bucket a few rows ahead is fetched while this row is written: the
         * partitions' indexes together are far larger than the caches. */
        for (uint32_t j = b; j < e && j < b + BULK_PF; j++)
            __builtin_prefetch(&p->idx[gr_idx_home((uint32_t)h[order[j]], p->cap)], 0, 3);
        for (uint32_t j = b; !rc && j < e; j++) {
            const uint32_t i = order[j];
            if (j + BULK_PF < e) {
                const uint32_t ia = order[j + BULK_PF];
                __builtin_prefetch(&p->idx[gr_idx_home((uint32_t)h[ia], p->cap)], 0, 3);
                __builtin_prefetch(weights + (size_t)ia * dim, 0, 3);
                if (state) __builtin_prefetch(state + (size_t)ia * sf, 0, 3);
            }
            uint32_t s = gr_part_find_locked(t, p, keys[i], h[i], NULL);
            if (s == GR_NO_ROW) {
                rc = gr_part_new_row_locked(t, p, keys[i], h[i], &s);
                if (rc) break;
                created++;
            }
            gr_part_store_row_locked(t, p, s, weights + (size_t)i * dim,
                                     state ? state + (size_t)i * sf : NULL, meta ? &meta[i] : NULL,
                                     now);
        }
        gr_part_write_end(p);
        gr_spin_unlock(&p->lock);
    }
    atomic_fetch_add_explicit(&t->nrows, created, memory_order_relaxed);
out:
    free(mine);
    free(hbuf);
    free(part);
    free(order);
    free(start);
    return rc;
}

uint64_t gr_table_reserve_each(const gr_table *t, uint64_t rows)
{
    /* The share of one partition plus three standard deviations of a Poisson count. */
    double mean = (double)rows / t->nparts;
    uint64_t each = (uint64_t)(mean + 3.0 * sqrt(mean)) + 1;
    if (t->spec.capacity) {
        uint64_t cap_each = t->spec.capacity / t->nparts + 1;
        if (each > cap_each) each = cap_each;
    }
    return each;
}

int gr_table_reserve(gr_table *t, uint64_t rows)
{
    if (!t) return gr_seterr(GR_EINVAL, "gr_table_reserve: table is NULL");
    if (rows == 0) return GR_OK;
    uint64_t each = gr_table_reserve_each(t, rows);
    int rc = GR_OK;
    for (uint32_t pi = 0; pi < t->nparts && !rc; pi++) {
        gr_part *p = &t->parts[pi];
        gr_spin_lock(&p->lock);
        rc = gr_part_reserve_locked(t, p, (uint64_t)p->rows + each);
        gr_spin_unlock(&p->lock);
    }
    return rc;
}
