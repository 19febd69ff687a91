/* The batch planner: dedup, routing by slot, requests that fit each shard's limits, frame
 * sections, summed push gradients and the scatter of replies. Pure code (plan.h says the
 * steps); the operations in batch.c and step.c drive it and do the I/O. */
#include "client/plan.h"
#include "client/check.h"

#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CL_WIDE 1 /* AVX-512 loops, chosen at run time (the build targets baseline x86-64) */
static bool cl_have_avx512;
__attribute__((constructor)) static void detect_avx512(void)
{
    __builtin_cpu_init();
    cl_have_avx512 = __builtin_cpu_supports("avx512f");
}
#endif

static int check_tables(const gr_client_batch *b, size_t nb, bool rows, bool grads)
{
    if (nb == 0 || !b) return gr_seterr(GR_EINVAL, "a batch needs at least one table");
    for (size_t i = 0; i < nb; i++) {
        if (b[i].dim == 0 || b[i].dim > GR_PROTO_DIM_MAX)
            return gr_seterr(GR_EINVAL, "table %u: dim %u is out of range 1..%u", b[i].table,
                             b[i].dim, GR_PROTO_DIM_MAX);
        if (b[i].n > (size_t)INT32_MAX / 2)
            return gr_seterr(GR_ETOOBIG, "table %u: %zu keys in one batch is too many", b[i].table,
                             b[i].n);
        if (b[i].n && (!b[i].keys || (rows && !b[i].rows) || (grads && !b[i].grads)))
            return gr_seterr(GR_EINVAL, "table %u: NULL keys, rows or gradients", b[i].table);
        if (b[i].flags & ~GR_CLIENT_BATCH_UNIQUE)
            return gr_seterr(GR_EINVAL, "table %u: unknown batch flags 0x%x", b[i].table,
                             b[i].flags);
    }
    return GR_OK;
}

/* Arena bytes one table needs (see the carving in cl_plan_tables). */
static size_t table_bytes(const gr_client_batch *b, uint32_t nshards, bool rows, bool grads)
{
    size_t n = b->n, per = 4 + 4; /* order, shard of each unique key */
    if (!(b->flags & GR_CLIENT_BATCH_UNIQUE)) {
        per += 8;                 /* uniq (and two more, see dedup_table) */
        if (rows) per += 4 + 4;   /* first, next */
        if (grads) per += 4;      /* inv */
    }
    if (grads) per += sizeof(float *);
    return n * per + ((size_t)nshards + 1) * 4 + 16 + 16;
}

/* Scratch shared by the tables of one plan: the dedup's open-addressing map (unique index + 1,
 * 0 = empty; a power of two at least twice the largest table) and the last occurrence seen of
 * each key (zeroed once, so it is never read uninitialised). */
typedef struct dedup_map {
    uint32_t *idx, *last;
    size_t mask;
} dedup_map;

/* One pass over a table's keys: its unique keys in first-seen order, and what the op needs of
 * each occurrence: the chain of a key's occurrences in the caller's order (first, next: the
 * scatter of rows) and/or its unique index (inv: the sums of gradients). Whether a key is new
 * is a coin toss on Zipf batches (half the keys are repeats), so the loop has no branch on it:
 * the map slot, the unique key and the chain link are written either way, with selects, and
 * the only branch is the probe loop, which rarely runs twice. The map holds unique indices
 * and compares against uniq[], so a probe touches two small arrays (4096 keys: 32 KiB each).
 * first[] sits right after next[] (cl_plan_tables carves them so): a key's chain head is
 * next[n + u], so the first link and a later one are the same store. */
static uint32_t dedup_table(cl_tbl *t, const uint64_t *keys, dedup_map *m)
{
    const size_t n = t->n, mask = m->mask;
    /* base[0] is a sentinel set to the key being probed, so an empty slot (0) and a match end
     * the probe with one comparison; base[u + 1] is unique key u, written one ahead. */
    uint64_t *base = (uint64_t *)t->uniq - 1;
    int32_t *links = t->next; /* next[0 .. n), then first[0 .. n) */
    uint32_t *inv = t->inv, *last = m->last, *idx = m->idx;
    memset(idx, 0, (mask + 1) * sizeof *idx);
    uint32_t nu = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t k = keys[i];
        /* Fibonacci hashing: keys are often already hashes, but not always. */
        size_t h = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20) & mask;
        base[0] = k;
        uint32_t e = idx[h];
        while (base[e] != k) {
            h = (h + 1) & mask;
            e = idx[h];
        }
        uint32_t fresh = e == 0;
#if defined(__GNUC__)
        /* Unpredictable by nature: hidden from the optimiser, which would otherwise turn the
         * masks below back into a branch on it (measured: a mispredict on half the keys). */
        __asm__("" : "+r"(fresh));
#endif
        const uint32_t keep = fresh - 1; /* all ones when the key was seen before */
        const uint32_t u = (nu & ~keep) | ((e - 1) & keep);
        idx[h] = u + 1;
        base[nu + 1] = k; /* kept only when fresh: otherwise the next fresh key overwrites it */
        nu += fresh;
        if (links) {
            const uint32_t prev = last[u]; /* stale when fresh, and then not used */
            const size_t at = ((n + u) & ~(size_t)keep) | ((size_t)prev & (size_t)keep);
            links[at] = (int32_t)i;
            links[i] = -1;
            last[u] = (uint32_t)i;
        }
        if (inv) inv[i] = u;
    }
    return nu;
}

int cl_plan_tables(cl_plan *p, uint32_t nshards, const gr_client_batch *b, size_t nb, bool rows,
                   bool grads)
{
    memset(p, 0, sizeof *p);
    p->nshards = nshards;
    int rc = check_tables(b, nb, rows, grads);
    if (rc) return rc;
    size_t bytes = 0, out_bytes = 0, nmax = 0;
    for (size_t i = 0; i < nb; i++) {
        bytes += table_bytes(&b[i], nshards, rows, grads);
        out_bytes += rows ? b[i].n * b[i].dim * sizeof(float) : 0;
        if (!(b[i].flags & GR_CLIENT_BATCH_UNIQUE) && b[i].n > nmax) nmax = b[i].n;
    }
    size_t cap = 16;
    while (cap < nmax * 4) cap <<= 1;
    dedup_map m = {NULL, NULL, cap - 1};
    p->stream_rows = out_bytes >= CL_STREAM_ROWS_BYTES;
    p->tb = calloc(nb, sizeof *p->tb);
    p->arena = malloc(bytes);
    uint32_t *count = calloc((size_t)nshards + 1, sizeof *count);
    if (nmax) {
        m.idx = malloc(cap * sizeof *m.idx);
        m.last = rows ? calloc(nmax, sizeof *m.last) : NULL;
    }
    if (!p->tb || !p->arena || !count || (nmax && (!m.idx || (rows && !m.last)))) {
        free(count);
        free(m.idx);
        free(m.last);
        return gr_seterr(GR_ENOMEM, "cannot allocate a batch of %zu bytes", bytes);
    }
    p->nb = nb;
    uint8_t *a = p->arena;
    for (size_t bi = 0; bi < nb; bi++) {
        cl_tbl *t = &p->tb[bi];
        size_t n = b[bi].n;
        t->table = b[bi].table;
        t->dim = b[bi].dim;
        t->n = n;
        t->rows = b[bi].rows;
        t->unique = (b[bi].flags & GR_CLIENT_BATCH_UNIQUE) != 0;
        /* 8-byte arrays first, so every array stays aligned. */
        if (grads) {
            t->dst = (float **)(void *)a;
            a += n * sizeof(float *);
        }
        if (!t->unique) {
            t->uniq = (const uint64_t *)(void *)a + 1; /* a sentinel before, one spare after */
            a += (n + 2) * 8;
            if (rows) { /* first right after next: dedup_table links through both */
                t->next = (int32_t *)(void *)a;
                a += n * 4;
                t->first = (int32_t *)(void *)a;
                a += n * 4;
            }
            if (grads) {
                t->inv = (uint32_t *)(void *)a;
                a += n * 4;
            }
        }
        t->order = (uint32_t *)(void *)a;
        a += n * 4;
        uint32_t *shard_of = (uint32_t *)(void *)a; /* per unique key */
        a += n * 4;
        t->shard_start = (uint32_t *)(void *)a;
        a += ((size_t)nshards + 1) * 4;
        a = (uint8_t *)(((uintptr_t)a + 7) & ~(uintptr_t)7);
        memset(t->shard_start, 0, ((size_t)nshards + 1) * 4);
        if (n == 0) continue;
        if (t->unique) {
            t->uniq = b[bi].keys;
            t->nuniq = (uint32_t)n;
        } else {
            t->nuniq = dedup_table(t, b[bi].keys, &m);
        }
        /* Counting sort of the unique keys by shard (their slots first, in one call). */
        memset(count, 0, ((size_t)nshards + 1) * sizeof *count);
        if (nshards > 1) gr_slots_of(t->uniq, t->nuniq, shard_of);
        for (uint32_t u = 0; u < t->nuniq; u++) {
            uint32_t s = nshards > 1 ? gr_slot_shard(shard_of[u], nshards) : 0;
            shard_of[u] = s;
            count[s + 1]++;
        }
        for (uint32_t s = 0; s < nshards; s++) count[s + 1] += count[s];
        memcpy(t->shard_start, count, ((size_t)nshards + 1) * 4);
        for (uint32_t u = 0; u < t->nuniq; u++) t->order[count[shard_of[u]]++] = u;
        p->keys_in += n;
        p->keys_sent += t->nuniq;
    }
    free(count);
    free(m.idx);
    free(m.last);
    return rc;
}

static cl_plan_req *add_req(cl_plan *p, uint32_t shard)
{
    if (p->nreqs == p->reqcap) {
        size_t cap = p->reqcap ? p->reqcap * 2 : 8;
        cl_plan_req *r = realloc(p->reqs, cap * sizeof *r);
        if (!r) return NULL;
        p->reqs = r;
        p->reqcap = cap;
    }
    cl_plan_req *r = &p->reqs[p->nreqs++];
    memset(r, 0, sizeof *r);
    r->shard = shard;
    return r;
}

static int add_piece(cl_plan_req *r, uint32_t bi, uint32_t count, const uint32_t *uidx)
{
    if (r->npieces == r->cap) {
        uint32_t nc = r->cap ? r->cap * 2 : 8;
        cl_piece *pc = realloc(r->pieces, nc * sizeof *pc);
        if (!pc) return gr_seterr(GR_ENOMEM, "out of memory");
        r->pieces = pc;
        r->cap = nc;
    }
    r->pieces[r->npieces++] = (cl_piece){bi, count, uidx};
    return GR_OK;
}

int cl_plan_split(cl_plan *p, const gr_proto_limits *lims, gr_proto_layout layout,
                  bool reply_rows)
{
    for (uint32_t s = 0; s < p->nshards; s++) {
        const gr_proto_limits *lim = &lims[s];
        uint64_t budget = lim->max_body > 64 ? lim->max_body - 64 : 0;
        cl_plan_req *cur = NULL;
        uint64_t keys_used = 0, req_bytes = 0, resp_bytes = 0;
        for (uint32_t bi = 0; bi < p->nb; bi++) {
            const cl_tbl *t = &p->tb[bi];
            uint32_t off = t->shard_start[s], end = t->shard_start[s + 1];
            uint64_t per_req = 8 + (layout == GR_PROTO_KEYS_VALUES ? (uint64_t)t->dim * 4 : 0);
            uint64_t per_resp = reply_rows ? (uint64_t)t->dim * 4 : 0;
            const uint64_t fixed = 16 + 8; /* section header and padding */
            while (off < end) {
                uint64_t room = 0;
                if (cur && cur->npieces < lim->max_tables && req_bytes + fixed < budget &&
                    resp_bytes + fixed < budget) {
                    room = lim->max_keys - keys_used;
                    uint64_t r1 = (budget - req_bytes - fixed) / per_req;
                    if (r1 < room) room = r1;
                    if (per_resp) {
                        uint64_t r2 = (budget - resp_bytes - fixed) / per_resp;
                        if (r2 < room) room = r2;
                    }
                }
                if (room == 0) {
                    if (cur && cur->npieces == 0) {
                        p->fail_shard = s;
                        return gr_seterr(GR_ETOOBIG, "one row of dim %u does not fit the shard's "
                                         "%u-byte frame limit", t->dim, lim->max_body);
                    }
                    /* Requests may move when the array grows: only the last one is current. */
                    cur = add_req(p, s);
                    if (!cur) return gr_seterr(GR_ENOMEM, "out of memory");
                    keys_used = 0;
                    req_bytes = resp_bytes = 8;
                    continue;
                }
                uint32_t take = end - off < room ? end - off : (uint32_t)room;
                int rc = add_piece(cur, bi, take, t->order + off);
                if (rc) return rc;
                keys_used += take;
                req_bytes += fixed + per_req * take;
                resp_bytes += fixed + per_resp * take;
                off += take;
            }
        }
    }
    return GR_OK;
}

int cl_plan_per_shard(cl_plan *p)
{
    for (uint32_t s = 0; s < p->nshards; s++) {
        cl_plan_req *r = add_req(p, s);
        if (!r) return gr_seterr(GR_ENOMEM, "out of memory");
        for (uint32_t bi = 0; bi < p->nb; bi++) {
            const cl_tbl *t = &p->tb[bi];
            uint32_t off = t->shard_start[s], cnt = t->shard_start[s + 1] - off;
            int rc = cnt ? add_piece(r, bi, cnt, t->order + off) : GR_OK;
            if (rc) return rc;
        }
    }
    return GR_OK;
}

size_t cl_plan_body_size(const cl_plan *p, size_t ri, gr_proto_layout layout)
{
    const cl_plan_req *r = &p->reqs[ri];
    size_t size = 8;
    for (uint32_t k = 0; k < r->npieces; k++)
        size += gr_proto_section_size(layout, r->pieces[k].count, p->tb[r->pieces[k].bi].dim);
    return size;
}

int cl_plan_put_sections(cl_plan *p, size_t ri, gr_proto_layout layout, gr_proto_buf *frame)
{
    const cl_plan_req *r = &p->reqs[ri];
    int rc = gr_proto_put_batch_head(frame, r->npieces);
    for (uint32_t k = 0; !rc && k < r->npieces; k++) {
        const cl_piece *pc = &r->pieces[k];
        cl_tbl *t = &p->tb[pc->bi];
        uint64_t *keys;
        float *vals;
        rc = gr_proto_put_section(frame, layout, t->table, t->dim, pc->count, &keys, &vals);
        if (rc) break;
        for (uint32_t j = 0; j < pc->count; j++) keys[j] = t->uniq[pc->uidx[j]];
        if (layout == GR_PROTO_KEYS_VALUES)
            for (uint32_t j = 0; j < pc->count; j++) t->dst[pc->uidx[j]] = vals + (size_t)j * t->dim;
    }
    return rc;
}

static inline uint32_t nonfinite(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x7f800000u) == 0x7f800000u;
}

/* The frame rows the sums write are scattered over the frames (a key's place is its unique
 * index, in first-seen order per shard), and the first write of each one misses: the frames
 * are fresh from the heap. Prefetching the row SUM_PF_D occurrences ahead, for writing, lets
 * those misses overlap. Measured on the planner alone (26 x 4096 Zipf ids, dim 64, 2 shards,
 * 6 alternations of 30 batches): the sums' minimum 1812 -> 1719 us, median 2652 -> 2043 us
 * per batch (docs/server.md, "Session 6"). */
#define SUM_PF_D 8
static inline void prefetch_frame_row(const cl_tbl *t, size_t i, size_t rowb)
{
    const char *row = (const char *)t->dst[t->unique ? (uint32_t)i : t->inv[i]];
    for (size_t o = 0; o < rowb; o += 64) __builtin_prefetch(row + o, 1, 3);
}

#if CL_WIDE
/* cl_plan_sum_grads for one table of a dim that is a multiple of 16, 16 floats at a time.
 * Same additions in the same order as the portable loop (a + b is exact-commutative), so the
 * sums are bit for bit the same. Returns nonzero when a gradient is NaN or inf. */
__attribute__((target("avx512f"))) static uint32_t sum_table16(const cl_tbl *t, const float *g)
{
    const __m512i em = _mm512_set1_epi32(0x7f800000);
    const size_t dim = t->dim;
    __mmask16 bad = 0;
    uint32_t fresh = 0;
    const size_t n = t->n, rowb = dim * sizeof(float), ahead = n > SUM_PF_D ? n - SUM_PF_D : 0;
    for (size_t i = 0; i < n; i++) {
        const float *src = g + i * dim;
        const uint32_t u = t->unique ? (uint32_t)i : t->inv[i];
        float *dst = t->dst[u];
        if (i < ahead) prefetch_frame_row(t, i + SUM_PF_D, rowb);
        if (u == fresh) { /* the key's first occurrence: unique indices are in first-seen order */
            fresh++;
            for (size_t d = 0; d < dim; d += 16) {
                __m512 x = _mm512_loadu_ps(src + d);
                _mm512_storeu_ps(dst + d, x);
                bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), em), em);
            }
        } else {
            for (size_t d = 0; d < dim; d += 16) {
                __m512 x = _mm512_loadu_ps(src + d);
                _mm512_storeu_ps(dst + d, _mm512_add_ps(_mm512_loadu_ps(dst + d), x));
                bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), em), em);
            }
        }
    }
    return bad != 0;
}
#endif

/* It walks the gradients in the caller's order (a sequential read of the largest array) and
 * adds into each key's slot in the frame; repeated keys are the hot ones, so their slots stay
 * in cache. Walking key by key instead would jump across the caller's array for every repeat
 * (measured: twice the client's push CPU). The finite check rides along: it is the same
 * single read of the gradients that a separate pass would repeat (check.c words the error).
 * A key's first occurrence is the one whose unique index is the next unseen one (dedup numbers
 * keys in first-seen order), so no per-key table is read to tell a copy from an add. */
int cl_plan_sum_grads(cl_plan *p, const gr_client_batch *b)
{
    for (size_t bi = 0; bi < p->nb; bi++) {
        const cl_tbl *t = &p->tb[bi];
        const float *g = b[bi].grads;
        size_t dim = t->dim;
        uint32_t bad = 0;
#if CL_WIDE
        if (cl_have_avx512 && dim % 16 == 0) {
            if (sum_table16(t, g)) return cl_check_grads(&b[bi], 1);
            continue;
        }
#endif
        uint32_t fresh = 0;
        const size_t ahead = t->n > SUM_PF_D ? t->n - SUM_PF_D : 0;
        for (size_t i = 0; i < t->n; i++) {
            const float *src = g + i * dim;
            const uint32_t u = t->unique ? (uint32_t)i : t->inv[i];
            float *dst = t->dst[u];
            if (i < ahead) prefetch_frame_row(t, i + SUM_PF_D, dim * sizeof(float));
            if (u == fresh) {
                fresh++;
                for (size_t d = 0; d < dim; d++) {
                    dst[d] = src[d];
                    bad |= nonfinite(src[d]);
                }
            } else {
                for (size_t d = 0; d < dim; d++) {
                    dst[d] += src[d];
                    bad |= nonfinite(src[d]);
                }
            }
        }
        if (bad) return cl_check_grads(&b[bi], 1);
    }
    return GR_OK;
}

void cl_plan_scatter_rows(const cl_plan *p, size_t ri, uint32_t k, uint32_t j0, uint32_t count,
                          const float *vals)
{
    const cl_piece *pc = &p->reqs[ri].pieces[k];
    const cl_tbl *t = &p->tb[pc->bi];
    const uint32_t *uidx = pc->uidx + j0;
    size_t dim = t->dim, rowb = dim * sizeof(float);
    if (t->unique) {
        for (uint32_t j = 0; j < count; j++)
            memcpy(t->rows + (size_t)uidx[j] * dim, vals + (size_t)j * dim, rowb);
        return;
    }
#if defined(__SSE2__)
    if (p->stream_rows && (dim & 3) == 0 && ((uintptr_t)t->rows & 15) == 0) {
        for (uint32_t j = 0; j < count; j++) {
            const float *src = vals + (size_t)j * dim;
            for (int32_t i = t->first[uidx[j]]; i >= 0; i = t->next[i]) {
                float *dst = t->rows + (size_t)i * dim;
                for (size_t d = 0; d < dim; d += 4) _mm_stream_ps(dst + d, _mm_loadu_ps(src + d));
            }
        }
        return;
    }
#endif
    for (uint32_t j = 0; j < count; j++) {
        const float *src = vals + (size_t)j * dim;
        for (int32_t i = t->first[uidx[j]]; i >= 0; i = t->next[i])
            memcpy(t->rows + (size_t)i * dim, src, rowb);
    }
}

void cl_plan_scatter_end(const cl_plan *p)
{
#if defined(__SSE2__)
    /* Streaming stores are weakly ordered: fence before the request is marked complete. */
    if (p->stream_rows) _mm_sfence();
#else
    (void)p;
#endif
}

int cl_plan_scatter(const cl_plan *p, size_t ri, const gr_proto_batch *reply)
{
    const cl_plan_req *r = &p->reqs[ri];
    if (reply->ntables != r->npieces)
        return gr_seterr(GR_EPROTO, "reply has %u tables, expected %u", reply->ntables,
                         r->npieces);
    int rc = GR_OK;
    for (uint32_t k = 0; k < reply->ntables; k++) {
        const gr_proto_section *sec = &reply->sections[k];
        const cl_piece *pc = &r->pieces[k];
        const cl_tbl *t = &p->tb[pc->bi];
        if (sec->table != t->table || sec->dim != t->dim || sec->n != pc->count) {
            rc = gr_seterr(GR_EPROTO, "reply section %u does not match the request", k);
            break;
        }
        cl_plan_scatter_rows(p, ri, k, 0, pc->count, sec->values);
    }
    cl_plan_scatter_end(p);
    return rc;
}

void cl_plan_fini(cl_plan *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->nreqs; i++) free(p->reqs[i].pieces);
    free(p->reqs);
    free(p->tb);
    free(p->arena);
    memset(p, 0, sizeof *p);
}
