/* A warm standby: while it waits for a shard to take over, a standby reads the job's newest
 * checkpoint's manifest, creates the tables a takeover's restore will fill (with the
 * checkpoint's specs) and has the kernel hand out the memory of their rows and index now
 * (gr_table_prefault), sized for the largest shard it might take. The restore after a kill
 * then adopts them (CKPT_LOAD's new tables come from this set first, ckpt.c) and only writes
 * rows, instead of spending most of its time on page faults. The set is rebuilt when the
 * newest checkpoint changes (a new spec, or a row count more than 2 % off) and released once
 * the standby serves. docs/coord.md, "Warm standby". */
#include "server/server_int.h"
#include "server/warm.h"
#include "granary/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t ms_of(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Replaces *m by the full checkpoint at the bottom of its delta chain (itself when it is
 * full): its row counts are what a restore reserves for. */
static int full_of(const char *root, gr_ckpt_manifest **m)
{
    for (int hops = 0; (*m)->kind == GR_CKPT_DELTA; hops++) {
        char dir[4200];
        gr_ckpt_manifest *p = NULL;
        int rc = hops > GR_CKPT_CHAIN_MAX ? gr_seterr(GR_ETOOBIG, "%s: delta chain too long", root)
                 : snprintf(dir, sizeof dir, "%s/%s", root, (*m)->parent) >= (int)sizeof dir
                     ? gr_seterr(GR_EINVAL, "%s: path too long", root)
                     : gr_ckpt_manifest_read(dir, &p);
        if (rc) return rc;
        gr_ckpt_manifest_destroy(*m);
        *m = p;
    }
    return GR_OK;
}

/* rows[t]: the most rows of table t any shard of `shards` (default slot map) gets from m, as
 * the restore's reserve counts them (each file's rows times the share of its slots the shard
 * owns). Each slot brings its file's rows over the file's slot count to its shard. */
static int shard_rows_max(const gr_ckpt_manifest *m, uint32_t shards, uint64_t *rows)
{
    uint32_t *in_file = calloc(m->map.shards, sizeof *in_file);
    double *acc = calloc(shards, sizeof *acc);
    if (!in_file || !acc) {
        free(in_file);
        free(acc);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    for (uint32_t s = 0; s < GR_SLOTS; s++) in_file[m->map.owner[s]]++;
    for (size_t t = 0; t < m->ntables; t++) {
        memset(acc, 0, shards * sizeof *acc);
        for (uint32_t s = 0; s < GR_SLOTS; s++) {
            uint32_t f = m->map.owner[s];
            acc[gr_slot_shard(s, shards)] += (double)m->files[f].rows[t] / in_file[f];
        }
        double best = 0;
        for (uint32_t i = 0; i < shards; i++)
            if (acc[i] > best) best = acc[i];
        rows[t] = (uint64_t)(best + 0.5);
    }
    free(in_file);
    free(acc);
    return GR_OK;
}

/* Whether the prepared set still fits checkpoint m: same specs, rows within 2 %. */
static bool still_fits(const srv_warm *w, const gr_ckpt_manifest *m, const uint64_t *rows)
{
    if (w->partial || w->ntables != m->ntables || !w->specs) return false;
    for (size_t t = 0; t < m->ntables; t++) {
        if (!gr_table_spec_equal(&w->specs[t], &m->tables[t])) return false;
        double a = (double)w->rows[t], b = (double)rows[t];
        if (a < b || a > b * 1.02 + 64) return false;
    }
    return true;
}

static void forget(srv_warm *w)
{
    free(w->specs);
    free(w->rows);
    w->specs = NULL;
    w->rows = NULL;
    w->ntables = 0;
    w->info.rows = w->info.bytes = 0;
    w->info.tables = 0;
    w->partial = false;
}

void srv_warm_release(gr_server *s, srv_warm *w)
{
    srv_ckpt_warm_set(s, NULL, 0);
    forget(w);
}

/* Builds the set for m: its tables, each prefaulted for rows[t] (scaled down so that the
 * whole set stays within max_bytes when that is set). */
static int build(gr_server *s, srv_warm *w, const gr_ckpt_manifest *m, uint64_t *rows,
                 uint64_t max_bytes, bool (*stop)(void *), void *arg)
{
    double need = 0;
    for (size_t t = 0; t < m->ntables; t++) {
        gr_table_estimate est;
        if (!gr_table_estimate_bytes(&m->tables[t], rows[t], &est)) need += (double)est.bytes;
    }
    double scale = max_bytes && need > (double)max_bytes ? (double)max_bytes / need : 1.0;
    gr_table **tables = calloc(m->ntables ? m->ntables : 1, sizeof *tables);
    gr_table_spec *specs = calloc(m->ntables ? m->ntables : 1, sizeof *specs);
    if (!tables || !specs) {
        free(tables);
        free(specs);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    int rc = GR_OK;
    uint64_t bytes = 0, total = 0;
    bool stopped = false;
    for (size_t t = 0; t < m->ntables && !rc; t++) {
        specs[t] = m->tables[t];
        rc = gr_table_create(&m->tables[t], &tables[t]);
        uint64_t r = (uint64_t)((double)rows[t] * scale);
        /* Once stopped, the remaining tables are created unprepared: the set stays whole. */
        if (!rc && !stopped) rc = gr_table_prefault_until(tables[t], r, stop, arg, &stopped);
        bytes += gr_table_prefault_bytes(tables[t]);
        total += r;
    }
    if (rc) {
        for (size_t t = 0; t < m->ntables; t++) gr_table_destroy(tables[t]);
        free(tables);
        free(specs);
        return rc;
    }
    srv_ckpt_warm_set(s, tables, m->ntables);
    w->specs = specs;
    w->ntables = m->ntables;
    w->info.rows = total;
    w->info.bytes = bytes;
    w->info.tables = (uint32_t)m->ntables;
    w->info.capped = scale < 1.0;
    w->partial = stopped;
    return GR_OK;
}

int srv_warm_refresh(gr_server *s, srv_warm *w, const char *root, uint32_t shards,
                     uint64_t max_bytes, bool (*stop)(void *arg), void *arg)
{
    char dir[4096], name[GR_CKPT_NAME_MAX];
    uint64_t step;
    if (!shards) return GR_OK;
    int rc = srv_ckpt_resolve(s, root, dir, sizeof dir);
    if (!rc) rc = gr_ckpt_latest(dir, name, &step);
    if (rc) return rc == GR_ENOENT ? GR_OK : rc; /* no checkpoint yet: nothing to prepare */
    if (!w->partial && !strcmp(name, w->info.ckpt) && shards == w->shards) return GR_OK;
    /* Tried once per checkpoint, failed or not: a failure is logged by the caller, and the
     * restore does without. */
    snprintf(w->info.ckpt, sizeof w->info.ckpt, "%s", name);
    w->shards = shards;
    uint64_t t0 = ms_of(CLOCK_MONOTONIC), c0 = ms_of(CLOCK_THREAD_CPUTIME_ID);
    char cdir[4200];
    gr_ckpt_manifest *m = NULL;
    snprintf(cdir, sizeof cdir, "%s/%s", dir, name);
    if ((rc = gr_ckpt_manifest_read(cdir, &m))) return rc;
    if (m->kind == GR_CKPT_EXPORT) { /* not a shard's state */
        gr_ckpt_manifest_destroy(m);
        srv_warm_release(s, w);
        return GR_OK;
    }
    rc = full_of(dir, &m);
    uint64_t *rows = rc ? NULL : calloc(m->ntables ? m->ntables : 1, sizeof *rows);
    if (!rc) rc = rows ? shard_rows_max(m, shards, rows) : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc && !still_fits(w, m, rows)) {
        /* The old set goes first: the new one may need its memory. */
        srv_warm_release(s, w);
        rc = build(s, w, m, rows, max_bytes, stop, arg);
        if (!rc) {
            w->rows = rows;
            rows = NULL;
            w->info.ms = ms_of(CLOCK_MONOTONIC) - t0;
            w->info.cpu_ms = ms_of(CLOCK_THREAD_CPUTIME_ID) - c0;
            w->info.builds++;
        }
    }
    free(rows);
    gr_ckpt_manifest_destroy(m);
    return rc;
}

