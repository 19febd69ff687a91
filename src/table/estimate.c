/* Memory a table will use at a given row count, predicted from the same layout and growth
 * rules the engine allocates with (gr_table_geometry_of, gr_idx_next_cap, gr_chunk_bytes), so
 * the capacity planner and the engine cannot disagree about what a row costs. The one thing
 * not known ahead is how the keys fall into partitions: the hash spreads them evenly, so a
 * partition's count is Poisson with mean rows / partitions, and the estimate is the expected
 * bytes over that distribution (partitions pay for whole chunks and whole index blocks, so
 * the spread matters for small tables). */
#include "table/table_internal.h"

#include <math.h>

/* Bytes one partition holding r rows has accounted (mem_used's share). */
static double part_bytes(const gr_table_geometry *g, uint64_t r)
{
    if (r == 0) return 0;
    uint64_t chunks = (r + g->chunk_rows - 1) / g->chunk_rows;
    uint64_t ids_cap = 4;
    while (ids_cap < chunks)
        ids_cap *= 2;
    double b = (double)chunks * (double)gr_chunk_bytes(g->chunk_rows, g->stride) +
               (double)ids_cap * sizeof(uint32_t);
    /* The index grows before the insert that would pass the load factor; a retired block
     * under a page stays counted (idx_retire gives back whole pages only). */
    uint32_t cap = 0;
    while (r * GR_IDX_LOAD_DEN > (uint64_t)cap * GR_IDX_LOAD_NUM) {
        uint32_t next = gr_idx_next_cap(cap);
        if (next <= cap) break;
        if (cap && gr_idx_block_bytes(cap) < GR_IDX_PAGE_ALIGN)
            b += (double)gr_idx_block_bytes(cap);
        cap = next;
    }
    return b + (double)gr_idx_block_bytes(cap);
}

int gr_table_estimate_bytes(const gr_table_spec *spec, uint64_t rows, gr_table_estimate *out)
{
    int rc = gr_table_spec_validate(spec);
    if (rc) return rc;
    gr_table_geometry g;
    gr_table_geometry_of(spec, &g);
    if (spec->capacity && rows > spec->capacity) rows = spec->capacity;
    /* A partition's row cap: the capacity split evenly (as gr_table_create sets it). */
    uint64_t part_cap = spec->capacity ? (spec->capacity + g.nparts - 1) / g.nparts : UINT64_MAX;
    double mean = (double)rows / g.nparts, sd = sqrt(mean);
    uint64_t lo = mean > 8 * sd + 8 ? (uint64_t)(mean - 8 * sd) : 0;
    uint64_t hi = (uint64_t)(mean + 8 * sd + 16);
    double expect = 0, mass = 0;
    for (uint64_t k = lo; k <= hi; k++) {
        double p = exp((double)k * log(mean > 0 ? mean : 1e-300) - mean - lgamma((double)k + 1));
        if (mean == 0) p = k == 0;
        expect += p * part_bytes(&g, k < part_cap ? k : part_cap);
        mass += p;
    }
    if (mass > 0) expect /= mass;
    out->rows = rows;
    out->bytes = g.base_bytes + (uint64_t)llround(expect * g.nparts);
    out->row_bytes = g.stride;
    out->payload_bytes = (uint64_t)spec->dim * (spec->dtype == GR_DTYPE_F16 ? 2u : 4u) +
                         4ull * gr_table_state_floats(spec);
    out->bytes_per_row = rows ? (double)out->bytes / (double)rows : 0;
    return GR_OK;
}
