/* Memory made ready before a fill: a standby that will restore a shard when another dies
 * creates its tables early and has the kernel hand out (and zero) the pages their rows and
 * index will take, while it has nothing else to do. A restore into fresh tables spends most
 * of its CPU on those page faults (docs/benchmarks.md, "Restore at the cp rate"); into a
 * prepared table it only writes. What the table shows (rows, `bytes`, every row) is the
 * same as for a table that was not prepared: only where its memory came from differs. */
#include "table/table_internal.h"

#include <errno.h>
#include <sys/mman.h>

/* Has the kernel back [p, p + len) with written (zeroed) pages now. MADV_POPULATE_WRITE does
 * it in one call; on kernels without it (before 5.14), one write per page. The pages hold
 * nothing yet (the table is empty), but each write puts back the byte it read, so the loop
 * is safe on any memory. */
static int populate(gr_mem_range r)
{
    if (!r.len) return GR_OK;
#ifdef MADV_POPULATE_WRITE
    if (madvise(r.p, r.len, MADV_POPULATE_WRITE) == 0) return GR_OK;
    if (errno != EINVAL) return GR_ENOMEM;
#endif
    for (size_t off = 0; off < r.len; off += 4096) {
        volatile uint8_t *b = r.p + off;
        *b = *b;
    }
    return GR_OK;
}

/* populate() in pieces, asking stop() before each; *got counts the bytes done. */
#define PREFAULT_PIECE ((size_t)32 << 20)
static int populate_until(gr_mem_range r, bool (*stop)(void *), void *arg, bool *stopped,
                          uint64_t *got)
{
    for (size_t off = 0; off < r.len; off += PREFAULT_PIECE) {
        if (stop && stop(arg)) {
            *stopped = true;
            return GR_OK;
        }
        size_t len = r.len - off < PREFAULT_PIECE ? r.len - off : PREFAULT_PIECE;
        int rc = populate((gr_mem_range){r.p + off, len});
        if (rc) return rc;
        *got += len;
    }
    return GR_OK;
}

/* The bytes of the index arrays gr_table_reserve(t, rows) allocates, as idx_alloc lays them
 * out (blocks of a page or more start on a page). */
static size_t index_bytes(const gr_table *t, uint64_t rows)
{
    uint64_t each = gr_table_reserve_each(t, rows);
    uint32_t cap = 0;
    while (each * GR_IDX_LOAD_DEN > (uint64_t)cap * GR_IDX_LOAD_NUM) {
        uint32_t next = gr_idx_next_cap(cap);
        if (next <= cap) break;
        cap = next;
    }
    size_t b = gr_idx_block_bytes(cap);
    size_t align = b >= GR_IDX_PAGE_ALIGN ? GR_IDX_PAGE_ALIGN : 64;
    return (size_t)t->nparts * ((b + align - 1) & ~(align - 1));
}

int gr_table_prefault(gr_table *t, uint64_t rows)
{
    bool stopped;
    return gr_table_prefault_until(t, rows, NULL, NULL, &stopped);
}

int gr_table_prefault_until(gr_table *t, uint64_t rows, bool (*stop)(void *arg), void *arg,
                            bool *stopped)
{
    *stopped = false;
    if (!t) return gr_seterr(GR_EINVAL, "gr_table_prefault: table is NULL");
    if (atomic_load_explicit(&t->nrows, memory_order_relaxed) || t->prefaulted || t->nireg)
        return gr_seterr(GR_EINVAL, "table '%s': only a new, empty table can be prefaulted",
                         t->spec.name);
    if (rows == 0) return GR_OK;
    if (t->spec.capacity && rows > t->spec.capacity) rows = t->spec.capacity;
    /* Each partition fills whole chunks: at most one partly used chunk per partition. */
    uint64_t slots = rows + (uint64_t)t->nparts * t->chunk_rows;
    if (slots > t->max_rows) slots = t->max_rows;
    gr_mem_range arena[3], idx = {0};
    int rc = gr_table_arena_open(t, (uint32_t)slots, arena);
    if (!rc) rc = gr_table_idx_open(t, index_bytes(t, rows), &idx);
    /* The rows' share of the arena only (it is committed in larger steps). */
    size_t row_bytes = ((size_t)slots * t->stride + 4095) & ~(size_t)4095;
    if (arena[0].len > row_bytes) arena[0].len = row_bytes;
    uint64_t got = 0;
    for (int i = 0; !rc && !*stopped && i < 3; i++)
        rc = populate_until(arena[i], stop, arg, stopped, &got);
    if (!rc && !*stopped) rc = populate_until(idx, stop, arg, stopped, &got);
    t->prefaulted = got;
    if (rc == GR_ENOMEM)
        return gr_seterr(GR_ENOMEM, "table '%s': the kernel has no memory for %llu prefaulted "
                         "rows", t->spec.name, (unsigned long long)rows);
    return rc;
}

int gr_table_prefault_ahead(gr_table *t, size_t ahead, uint64_t *bytes)
{
    *bytes = 0;
    if (!t) return gr_seterr(GR_EINVAL, "gr_table_prefault_ahead: table is NULL");
    gr_mem_range r;
    int rc = gr_table_arena_ahead(t, ahead, &r);
    if (rc || !r.len) return rc;
    /* In pieces of one huge page, so that a stop or the caller's other tables do not wait
     * behind a long call. Only MADV_POPULATE_WRITE: rows created meanwhile in these pages are
     * safe with it (a page that is there is left as it is), where populate()'s fallback of a
     * write per page could put back a byte another thread just wrote. Without it (kernels
     * before 5.14) nothing is done: the rows fault as they are created. */
    size_t done = 0;
    while (done < r.len) {
        size_t len = r.len - done < (2u << 20) ? r.len - done : (2u << 20);
#ifdef MADV_POPULATE_WRITE
        if (madvise(r.p + done, len, MADV_POPULATE_WRITE) != 0) {
            if (errno != EINVAL) rc = GR_ENOMEM;
            break;
        }
#else
        break;
#endif
        done += len;
    }
    gr_table_ahead_done(t, (size_t)(r.p - t->rowmem) + done, done);
    *bytes = done;
    return rc ? gr_seterr(GR_ENOMEM, "table '%s': the kernel has no memory for rows ahead",
                          t->spec.name)
              : GR_OK;
}

uint64_t gr_table_ahead_bytes(const gr_table *t)
{
    if (!t) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&t->alloc_lock);
    uint64_t b = t->ahead_bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&t->alloc_lock);
    return b;
}

uint64_t gr_table_prefault_bytes(const gr_table *t)
{
    return t ? t->prefaulted : 0;
}
