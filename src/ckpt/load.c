/* Restore: resolves a checkpoint's delta chain down to its full checkpoint, checks everything
 * that can be checked before touching the target tables (manifests, file sizes, trailers,
 * specs), builds the live key set from the newest checkpoint when there are deltas, then
 * applies full and deltas oldest first, inserting only the rows whose slot the target shard
 * owns. A reader thread reads, verifies and decompresses the next section while the caller's
 * thread inserts the current one. */
#include "ckpt/ckpt_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- live key sets: open addressing over uint64 keys (0 kept aside) ---- */

typedef struct keyset {
    uint64_t *slots;
    size_t cap, n;
    bool has_zero;
} keyset;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int keyset_add(keyset *s, uint64_t k)
{
    if (k == 0) {
        s->has_zero = true;
        return GR_OK;
    }
    if ((s->n + 1) * 2 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 1024;
        uint64_t *ns = calloc(nc, sizeof *ns);
        if (!ns) return gr_seterr(GR_ENOMEM, "out of memory for the live key set");
        for (size_t i = 0; i < s->cap; i++) {
            uint64_t v = s->slots[i];
            if (!v) continue;
            size_t h = mix(v) & (nc - 1);
            while (ns[h]) h = (h + 1) & (nc - 1);
            ns[h] = v;
        }
        free(s->slots);
        s->slots = ns;
        s->cap = nc;
    }
    size_t h = mix(k) & (s->cap - 1);
    while (s->slots[h]) {
        if (s->slots[h] == k) return GR_OK;
        h = (h + 1) & (s->cap - 1);
    }
    s->slots[h] = k;
    s->n++;
    return GR_OK;
}

static bool keyset_has(const keyset *s, uint64_t k)
{
    if (k == 0) return s->has_zero;
    if (!s->cap) return false;
    size_t h = mix(k) & (s->cap - 1);
    while (s->slots[h]) {
        if (s->slots[h] == k) return true;
        h = (h + 1) & (s->cap - 1);
    }
    return false;
}

/* ---- the chain ---- */

void ck_chain_free(ck_chain *c)
{
    for (size_t i = 0; i < c->len; i++) gr_ckpt_manifest_destroy(c->m[i]);
    free(c->m);
    free(c->dir);
    free(c);
}

static int chain_grow(ck_chain *c)
{
    if (c->len < c->cap) return GR_OK;
    size_t nc = c->cap ? c->cap * 2 : 4;
    gr_ckpt_manifest **m = realloc(c->m, nc * sizeof *m);
    if (!m) return gr_seterr(GR_ENOMEM, "out of memory");
    c->m = m;
    char(*d)[4096] = realloc(c->dir, nc * sizeof *d);
    if (!d) return gr_seterr(GR_ENOMEM, "out of memory");
    c->dir = d;
    c->cap = nc;
    return GR_OK;
}

int ck_chain_read(const char *dir, bool follow, ck_chain **out)
{
    ck_chain *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "out of memory");
    char root[4096];
    ck_dirname(dir, root, sizeof root);
    int rc = chain_grow(c);
    if (rc != GR_OK) {
        ck_chain_free(c);
        return rc;
    }
    snprintf(c->dir[0], sizeof c->dir[0], "%s", dir);
    rc = gr_ckpt_manifest_read(dir, &c->m[0]);
    if (rc != GR_OK) {
        ck_chain_free(c);
        return rc;
    }
    c->len = 1;
    while (follow && c->m[c->len - 1]->kind == GR_CKPT_DELTA) {
        if (c->len > GR_CKPT_CHAIN_MAX) {
            rc = gr_seterr(GR_ETOOBIG, "%s: more than %d deltas in the chain", dir,
                           GR_CKPT_CHAIN_MAX);
            break;
        }
        if ((rc = chain_grow(c)) != GR_OK) break;
        gr_ckpt_manifest *cur = c->m[c->len - 1];
        char *pd = c->dir[c->len];
        if ((rc = ck_path(pd, 4096, root, cur->parent)) != GR_OK) break;
        gr_ckpt_manifest *pm = NULL;
        rc = gr_ckpt_manifest_read(pd, &pm);
        if (rc != GR_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            rc = gr_seterr(rc, "%s needs its parent %s: %s", c->dir[c->len - 1], cur->parent, msg);
            break;
        }
        c->m[c->len++] = pm;
        if (pm->step >= cur->step) {
            rc = gr_seterr(GR_ECORRUPT, "%s: parent %s has step %llu, not before %llu",
                           c->dir[c->len - 2], cur->parent, (unsigned long long)pm->step,
                           (unsigned long long)cur->step);
            break;
        }
        if (pm->kind == GR_CKPT_EXPORT) {
            rc = gr_seterr(GR_ECORRUPT, "%s: parent %s is an export", c->dir[c->len - 2],
                           cur->parent);
            break;
        }
    }
    if (rc != GR_OK) {
        ck_chain_free(c);
        return rc;
    }
    *out = c;
    return GR_OK;
}

/* Opens one file of a checkpoint and checks it against the manifest entry. */
int ck_open_checked(ck_reader *r, const char *dir, const gr_ckpt_manifest *m, uint32_t i)
{
    const gr_ckpt_manifest_file *f = &m->files[i];
    char path[4096];
    int rc = ck_path(path, sizeof path, dir, f->name);
    if (rc != GR_OK) return rc;
    rc = ck_reader_open(r, path, f->size);
    if (rc != GR_OK) return rc;
    const ck_file_header *h = &r->hdr;
    if (r->tail.content_checksum != f->checksum)
        rc = gr_seterr(GR_ECORRUPT, "%s: checksum %016llx, the manifest says %016llx (file "
                       "altered or replaced)", path, (unsigned long long)r->tail.content_checksum,
                       (unsigned long long)f->checksum);
    else if (h->step != m->step || h->shard != i || h->shards != m->map.shards ||
             h->kind != (uint32_t)f->kind || h->ntables != m->ntables)
        rc = gr_seterr(GR_ECORRUPT, "%s: header (step %llu, shard %u of %u, %u tables) does "
                       "not match the manifest", path, (unsigned long long)h->step, h->shard,
                       h->shards, h->ntables);
    if (rc != GR_OK) ck_reader_close(r);
    return rc;
}

static bool spec_matches(const gr_table_spec *ck, const gr_table_spec *t, bool export)
{
    if (export) return !strcmp(ck->name, t->name) && ck->dim == t->dim;
    return gr_table_spec_equal(ck, t);
}

/* ---- the section pipeline: a reader thread hands verified payloads to the inserter ---- */

#define PIPE_DEPTH 4

typedef struct pipe_item {
    ck_section s;
    unsigned char *buf;
    size_t cap;
} pipe_item;

typedef struct pipe {
    ck_reader *r;
    const int *want;  /* per file table: >= 0 when its ROWS (or KEYS) are wanted */
    uint16_t want_type;
    pipe_item items[PIPE_DEPTH];
    size_t head, count; /* ring of filled items */
    bool done, stop;
    int err;
    char errmsg[1024];
    pthread_mutex_t mu;
    pthread_cond_t cv;
} pipe;

/* Map each TABLE section of the file to a target (or -1) as the reader meets it. The reader
 * thread does this itself so it knows which ROWS sections are worth reading. */
typedef struct file_ctx {
    gr_table *const *tables;
    const gr_table_spec *specs; /* compared instead of the tables' own, or NULL */
    size_t ntables;
    bool export;
    int *want; /* per file table */
    const char *dir;
} file_ctx;

static int on_table(ck_reader *r, const ck_section *s, const unsigned char *p, file_ctx *fc)
{
    int rc = ck_reader_table(r, s, p);
    if (rc != GR_OK) return rc;
    const gr_table_spec *fs = &r->tables[s->table].spec;
    fc->want[s->table] = -1;
    for (size_t i = 0; i < fc->ntables; i++) {
        const gr_table_spec *ts = fc->specs ? &fc->specs[i] : gr_table_get_spec(fc->tables[i]);
        if (strcmp(ts->name, fs->name) != 0) continue;
        if (!spec_matches(fs, ts, fc->export)) {
            char d[512];
            ck_spec_diff(fs, ts, d, sizeof d);
            return gr_seterr(GR_EINVAL, "%s: table '%s' does not match the target table: %s",
                             r->path, fs->name, d);
        }
        fc->want[s->table] = (int)i;
    }
    return GR_OK;
}

typedef struct reader_args {
    pipe *p;
    file_ctx *fc;
} reader_args;

static void *reader_main(void *arg)
{
    reader_args *a = arg;
    pipe *p = a->p;
    ck_reader *r = p->r;
    unsigned char *tbuf = NULL;
    size_t tcap = 0;
    int rc = GR_OK;
    for (;;) {
        ck_section s;
        int n = ck_reader_next(r, &s);
        if (n <= 0) {
            rc = n;
            break;
        }
        if (s.type == CK_SEC_TABLE) {
            rc = ck_reader_payload(r, &s, &tbuf, &tcap);
            if (rc == GR_OK) rc = on_table(r, &s, tbuf, a->fc);
            if (rc != GR_OK) break;
            continue;
        }
        if (s.type != p->want_type || a->fc->want[s.table] < 0) continue;
        pthread_mutex_lock(&p->mu);
        while (p->count == PIPE_DEPTH && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        bool stop = p->stop;
        pipe_item *it = &p->items[(p->head + p->count) % PIPE_DEPTH];
        pthread_mutex_unlock(&p->mu);
        if (stop) break;
        rc = ck_reader_payload(r, &s, &it->buf, &it->cap);
        if (rc != GR_OK) break;
        it->s = s;
        pthread_mutex_lock(&p->mu);
        p->count++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    free(tbuf);
    pthread_mutex_lock(&p->mu);
    if (rc != GR_OK) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", gr_errmsg());
    }
    p->done = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Runs fn on every wanted section of one file, in file order, with the read of the next
 * section overlapping fn. */
typedef int (*section_fn)(void *ctx, ck_reader *r, const ck_section *s, int target,
                          const unsigned char *payload);

static int for_each_section(ck_reader *r, file_ctx *fc, uint16_t type, section_fn fn, void *ctx)
{
    pipe *p = calloc(1, sizeof *p);
    if (!p) return gr_seterr(GR_ENOMEM, "out of memory");
    p->r = r;
    p->want_type = type;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    reader_args a = {p, fc};
    pthread_t th;
    int rc = GR_OK;
    if (pthread_create(&th, NULL, reader_main, &a) != 0) {
        rc = gr_seterr(GR_EINTERNAL, "cannot start the checkpoint reader thread");
        goto out;
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->count == 0 && !p->done) pthread_cond_wait(&p->cv, &p->mu);
        if (p->count == 0) { /* done */
            pthread_mutex_unlock(&p->mu);
            break;
        }
        pipe_item *it = &p->items[p->head];
        pthread_mutex_unlock(&p->mu);
        /* The reader thread does not touch r->tables[] entries it already filled. */
        rc = fn(ctx, r, &it->s, fc->want[it->s.table], it->buf);
        pthread_mutex_lock(&p->mu);
        p->head = (p->head + 1) % PIPE_DEPTH;
        p->count--;
        if (rc != GR_OK) p->stop = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        if (rc != GR_OK) break;
    }
    pthread_join(th, NULL);
    if (rc == GR_OK && p->err) rc = gr_seterr(p->err, "%s", p->errmsg);
out:
    for (int i = 0; i < PIPE_DEPTH; i++) free(p->items[i].buf);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    return rc;
}

/* ---- applying rows ---- */

typedef struct apply_ctx {
    gr_table *const *tables;
    const bool *owned;   /* GR_SLOTS */
    keyset *live;        /* per target, or NULL */
    gr_ckpt_load_stats *st;
    /* scratch for filtered rows */
    uint64_t *keys;
    float *w, *state;
    gr_row_meta *meta;
    size_t cap_k, cap_m, cap_w, cap_s;
} apply_ctx;

static int reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return GR_OK;
    void *n = realloc(*p, need * elem);
    if (!n) return gr_seterr(GR_ENOMEM, "out of memory restoring rows");
    *p = n;
    *cap = need;
    return GR_OK;
}

/* True when none of n floats at p (any alignment) has an all-ones exponent. */
static bool all_finite(const void *p, uint64_t n)
{
    const unsigned char *b = p;
    uint32_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, b + 4 * i, 4);
        bad |= (uint32_t)((x & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

/* The rows of one ROWS section that go into the target, checked: the payload's columns when
 * every row is kept, else a filtered copy in a's scratch. */
typedef struct row_batch {
    gr_table *t;
    const uint64_t *keys;
    size_t n;
    const float *w, *state;
    const gr_row_meta *meta;
} row_batch;

static int prepare_rows(apply_ctx *a, const ck_reader *r, const ck_section *s, int target,
                        const unsigned char *payload, row_batch *out)
{
    memset(out, 0, sizeof *out);
    out->t = a->tables[target];
    const ck_table_info *ti = &r->tables[s->table].info;
    ck_rows v;
    ck_rows_view(ti, payload, s->count, &v);
    uint64_t n = s->count;
    a->st->rows_read += n;
    keyset *live = a->live ? &a->live[target] : NULL;
    uint32_t dim = ti->dim, sf = ti->state_floats;
    bool f16 = ti->weight_type == CK_W_F16;

    if (dim > GR_TABLE_DIM_MAX || sf > 2 * GR_TABLE_DIM_MAX + 1)
        return gr_seterr(GR_ECORRUPT, "%s: table '%s' has dim %u and %u state floats, over the "
                         "table limits", r->path, r->tables[s->table].spec.name, dim, sf);
    /* The writer's own check, per row, so a refusal names the file, table and key. f32
     * columns are first tested whole (a loop the compiler vectorizes); the per-row pass runs
     * only when that finds something, or for f16 weights (checked after conversion). */
    bool clean = !f16 && all_finite(v.weights, n * dim) && all_finite(v.state, n * sf);
    for (uint64_t i = 0; !clean && i < n; i++) {
        float wf[GR_TABLE_DIM_MAX], sf_row[2 * GR_TABLE_DIM_MAX + 1];
        const float *wp = wf;
        if (f16) {
            const unsigned char *hp = (const unsigned char *)v.weights + 2 * i * dim;
            for (uint32_t d = 0; d < dim && d < GR_TABLE_DIM_MAX; d++) {
                uint16_t h;
                memcpy(&h, hp + 2 * d, 2);
                wf[d] = gr_f16_to_f32(h);
            }
        } else {
            memcpy(wf, (const unsigned char *)v.weights + 4ull * i * dim, 4ull * dim);
        }
        /* memcpy: the state column may be only 2-byte aligned after f16 weights. */
        if (sf) memcpy(sf_row, (const unsigned char *)v.state + 4ull * sf * i, 4ull * sf);
        int bad = ck_check_row(r->path, r->tables[s->table].spec.name, v.keys[i], wp, dim, false,
                               sf_row, sf);
        if (bad) return bad;
    }
    /* Fast path: every row kept and columns usable in place. */
    bool all = true;
    for (uint64_t i = 0; i < n && all; i++)
        all = a->owned[gr_slot_of(v.keys[i])] && (!live || keyset_has(live, v.keys[i]));
    if (all && !f16) {
        *out = (row_batch){a->tables[target], v.keys, n, v.weights, v.state, v.meta};
        a->st->rows_loaded += n;
        return GR_OK;
    }
    int rc = reserve((void **)&a->keys, &a->cap_k, n, 8);
    if (rc == GR_OK) rc = reserve((void **)&a->meta, &a->cap_m, n, sizeof(gr_row_meta));
    if (rc == GR_OK) rc = reserve((void **)&a->w, &a->cap_w, n * dim, 4);
    if (rc == GR_OK && sf) rc = reserve((void **)&a->state, &a->cap_s, n * sf, 4);
    if (rc != GR_OK) return rc;
    size_t m = 0;
    const unsigned char *sbytes = (const unsigned char *)v.state;
    const unsigned char *mbytes = (const unsigned char *)v.meta;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = v.keys[i];
        if (!a->owned[gr_slot_of(k)]) continue;
        if (live && !keyset_has(live, k)) {
            a->st->rows_dropped++;
            continue;
        }
        a->keys[m] = k;
        if (f16) {
            const unsigned char *hp = (const unsigned char *)v.weights + 2 * i * dim;
            for (uint32_t d = 0; d < dim; d++) {
                uint16_t h;
                memcpy(&h, hp + 2 * d, 2);
                a->w[m * dim + d] = gr_f16_to_f32(h);
            }
        } else {
            memcpy(a->w + m * dim, (const float *)v.weights + i * dim, 4ull * dim);
        }
        /* memcpy: with f16 weights the state and meta columns may be only 2-byte aligned. */
        if (sf) memcpy(a->state + m * sf, sbytes + 4ull * sf * i, 4ull * sf);
        if (mbytes) memcpy(&a->meta[m], mbytes + 8 * i, 8);
        m++;
    }
    *out = (row_batch){a->tables[target], a->keys, m, a->w, sf ? a->state : NULL,
                       mbytes ? a->meta : NULL};
    a->st->rows_loaded += m;
    return GR_OK;
}

/* ---- applying a file's rows with several threads ----
 * The section headers are walked first (TABLE sections read and matched on the way). Then
 * each of T threads inserts, section by section in file order, the rows that fall in its own
 * group of table partitions (gr_table_insert_bulk, group t of T); a key always falls in the
 * same group, so its rows are applied in file order whatever T is, and two threads never want
 * the same partition lock. Sections are read, verified, decompressed and checked into a ring
 * of W slots by whichever thread finds the section it needs not read yet; a slot is reused
 * once every thread has inserted its rows. There is no barrier: a thread the scheduler parks
 * holds the others back only once they are W sections ahead of it. */

typedef struct sec_ref {
    ck_section s;
    uint64_t off;  /* payload offset */
    uint32_t nsec; /* section number, for messages */
} sec_ref;

static int list_sections(ck_reader *r, file_ctx *fc, uint16_t type, sec_ref **out, size_t *n)
{
    sec_ref *v = NULL;
    size_t len = 0, cap = 0;
    unsigned char *tbuf = NULL;
    size_t tcap = 0;
    int rc = GR_OK;
    for (;;) {
        ck_section s;
        int got = ck_reader_next(r, &s);
        if (got <= 0) {
            rc = got;
            break;
        }
        if (s.type == CK_SEC_TABLE) {
            rc = ck_reader_payload(r, &s, &tbuf, &tcap);
            if (rc == GR_OK) rc = on_table(r, &s, tbuf, fc);
            if (rc != GR_OK) break;
            continue;
        }
        if (s.type != type || fc->want[s.table] < 0) continue;
        if (len == cap) {
            size_t nc = cap ? cap * 2 : 64;
            sec_ref *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = gr_seterr(GR_ENOMEM, "out of memory listing %s", r->path);
                break;
            }
            v = nv;
            cap = nc;
        }
        v[len++] = (sec_ref){s, r->payload_off, r->nsection - 1};
    }
    free(tbuf);
    if (rc != GR_OK) {
        free(v);
        return rc;
    }
    *out = v;
    *n = len;
    return GR_OK;
}

typedef struct par_run par_run;

/* One section read and checked, waiting until every thread has inserted its rows. */
typedef struct par_slot {
    apply_ctx a; /* its scratch holds the filtered rows */
    gr_ckpt_load_stats st;
    unsigned char *buf;
    size_t cap;
    ck_scratch sc;
    row_batch b;
    uint64_t *hashes; /* the batch's table hashes, computed once for every group */
    size_t hcap;
    size_t sec;       /* the section it holds */
    bool reading;     /* a thread is reading `sec` into it */
    bool ready;       /* read; `pending` threads still to insert from it */
    uint32_t pending; /* free: none of the three */
} par_slot;

typedef struct par_worker {
    par_run *run;
    uint32_t id;
} par_worker;

struct par_run {
    const ck_reader *r;
    const int *want;
    const sec_ref *secs;
    size_t nsec;
    uint32_t T; /* threads = groups */
    uint32_t W; /* slots */
    par_slot *slots;
    size_t next_read; /* the next section to read; its slot is free once section - W is done */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool go; /* T is final: as many threads as could be started */
    atomic_int failed;
    int err;
    char errmsg[1024];
};

static void par_fail(par_run *p, int rc)
{
    pthread_mutex_lock(&p->mu);
    if (!p->err) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", gr_errmsg());
    }
    atomic_store(&p->failed, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static int read_slot(par_run *p, par_slot *sl, const sec_ref *sr)
{
    sl->b.n = 0;
    int rc = ck_payload_at(p->r, &sr->s, sr->off, sr->nsec, &sl->buf, &sl->cap, &sl->sc, NULL);
    if (rc == GR_OK) rc = prepare_rows(&sl->a, p->r, &sr->s, p->want[sr->s.table], sl->buf, &sl->b);
    if (rc == GR_OK) rc = reserve((void **)&sl->hashes, &sl->hcap, sl->b.n, sizeof *sl->hashes);
    if (rc == GR_OK) gr_table_hash_keys(sl->b.t, sl->b.keys, sl->b.n, sl->hashes);
    return rc;
}

/* Section k read into its slot: waits for it, reading whatever section is next meanwhile
 * when its slot is free. False when the restore failed. Called with mu held. */
static bool wait_section(par_run *p, size_t k)
{
    par_slot *want = &p->slots[k % p->W];
    while (!atomic_load(&p->failed)) {
        if (want->ready && want->sec == k) return true;
        par_slot *next = p->next_read < p->nsec ? &p->slots[p->next_read % p->W] : NULL;
        if (next && !next->reading && !next->ready && next->pending == 0) {
            size_t j = p->next_read++;
            next->reading = true;
            pthread_mutex_unlock(&p->mu);
            int rc = read_slot(p, next, &p->secs[j]);
            if (rc != GR_OK) par_fail(p, rc);
            pthread_mutex_lock(&p->mu);
            next->sec = j;
            next->pending = p->T;
            next->reading = false;
            next->ready = rc == GR_OK;
            pthread_cond_broadcast(&p->cv);
            continue;
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
    return false;
}

static void *par_main(void *arg)
{
    par_worker *w = arg;
    par_run *p = w->run;
    pthread_mutex_lock(&p->mu);
    while (!p->go) pthread_cond_wait(&p->cv, &p->mu);
    bool mine = w->id < p->T;
    for (size_t k = 0; mine && k < p->nsec; k++) {
        if (!wait_section(p, k)) break;
        par_slot *sl = &p->slots[k % p->W];
        pthread_mutex_unlock(&p->mu);
        const row_batch *b = &sl->b;
        if (b->n) {
            /* prepare_rows ran the writer's row check (every value finite); an f16 table also
             * needs the half-float range, which the insert checks itself. */
            gr_table_rows rows = {b->keys, b->n, b->w, b->state, b->meta, sl->hashes};
            unsigned flags = gr_table_get_spec(b->t)->dtype == GR_DTYPE_F32 ? GR_TABLE_BULK_CHECKED : 0;
            int rc = gr_table_insert_bulk(b->t, &rows, w->id, p->T, flags);
            if (rc != GR_OK) par_fail(p, rc);
        }
        pthread_mutex_lock(&p->mu);
        if (--sl->pending == 0) {
            sl->ready = false;
            pthread_cond_broadcast(&p->cv);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static uint32_t load_threads(const gr_ckpt_load_opts *o)
{
    if (o->threads) return o->threads > 64 ? 64 : o->threads;
    uint32_t n = ck_online_cpus();
    return n > 8 ? 8 : n;
}

/* Inserts every wanted ROWS section of r into the targets with up to T threads. */
static int apply_file(ck_reader *r, file_ctx *fc, const apply_ctx *proto, uint32_t T)
{
    sec_ref *secs = NULL;
    size_t nsec = 0;
    int rc = list_sections(r, fc, CK_SEC_ROWS, &secs, &nsec);
    if (rc != GR_OK) return rc;
    if (T > nsec) T = nsec ? (uint32_t)nsec : 1;
    /* Four sections per thread in flight: room for the others to run ahead of a thread the
     * scheduler parks (about 3 MiB per slot). */
    const uint32_t W = 4 * T;
    par_run *p = calloc(1, sizeof *p);
    par_worker *w = calloc(T, sizeof *w);
    par_slot *slots = calloc(W, sizeof *slots);
    pthread_t *th = calloc(T, sizeof *th);
    if (!p || !w || !slots || !th) {
        free(p);
        free(w);
        free(slots);
        free(th);
        free(secs);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    *p = (par_run){.r = r, .want = fc->want, .secs = secs, .nsec = nsec, .T = T, .W = W,
                   .slots = slots};
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->failed, 0);
    for (uint32_t i = 0; i < W; i++) {
        slots[i].a = *proto;
        slots[i].a.st = &slots[i].st;
    }
    for (uint32_t i = 0; i < T; i++) w[i] = (par_worker){p, i};
    /* Threads that cannot be started are done without: the others do their share. */
    uint32_t started = 1;
    while (started < T && pthread_create(&th[started], NULL, par_main, &w[started]) == 0)
        started++;
    pthread_mutex_lock(&p->mu);
    p->T = started;
    p->go = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    par_main(&w[0]);
    for (uint32_t i = 1; i < started; i++) pthread_join(th[i], NULL);
    if (rc == GR_OK && p->err) rc = gr_seterr(p->err, "%s", p->errmsg);
    for (uint32_t i = 0; i < W; i++) {
        par_slot *sl = &slots[i];
        proto->st->rows_read += sl->st.rows_read;
        proto->st->rows_loaded += sl->st.rows_loaded;
        proto->st->rows_dropped += sl->st.rows_dropped;
        free(sl->a.keys);
        free(sl->a.w);
        free(sl->a.state);
        free(sl->a.meta);
        free(sl->buf);
        free(sl->hashes);
        ck_scratch_fini(&sl->sc);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(th);
    free(slots);
    free(w);
    free(p);
    free(secs);
    return rc;
}

typedef struct live_ctx {
    keyset *live;
    const bool *owned;
} live_ctx;

static int collect_keys(void *vctx, ck_reader *r, const ck_section *s, int target,
                        const unsigned char *payload)
{
    (void)r;
    live_ctx *c = vctx;
    const uint64_t *keys = (const uint64_t *)payload; /* KEYS payload, or ROWS' key column */
    for (uint64_t i = 0; i < s->count; i++) {
        if (!c->owned[gr_slot_of(keys[i])]) continue;
        int rc = keyset_add(&c->live[target], keys[i]);
        if (rc != GR_OK) return rc;
    }
    return GR_OK;
}

/* Files of checkpoint m that own at least one slot the target owns. */
static bool file_relevant(const gr_ckpt_manifest *m, uint32_t f, const bool *owned)
{
    for (uint32_t s = 0; s < GR_SLOTS; s++)
        if (m->map.owner[s] == f && owned[s]) return true;
    return false;
}

/* Sizes each target's index for the rows its full checkpoint brings (each file's rows times
 * the share of that file's slots the target owns), so the restore does not rehash. */
static int reserve_targets(const ck_chain *c, gr_table *const *tables, const gr_table_spec *specs,
                           size_t ntables, const bool *owned)
{
    const gr_ckpt_manifest *m = c->m[c->len - 1];
    for (size_t i = 0; i < ntables; i++) {
        const gr_table_spec *ts = specs ? &specs[i] : gr_table_get_spec(tables[i]);
        long ix = gr_ckpt_manifest_table(m, ts->name);
        if (ix < 0) continue;
        double rows = 0;
        for (uint32_t f = 0; f < m->map.shards; f++) {
            uint32_t in_file = 0, mine = 0;
            for (uint32_t s = 0; s < GR_SLOTS; s++)
                if (m->map.owner[s] == f) {
                    in_file++;
                    mine += owned[s];
                }
            if (in_file) rows += (double)m->files[f].rows[ix] * mine / in_file;
        }
        int rc = gr_table_reserve(tables[i], (uint64_t)rows);
        if (rc != GR_OK) return rc;
    }
    return GR_OK;
}

int gr_ckpt_load(const char *dir, gr_table *const *tables, size_t ntables,
                 const gr_ckpt_load_opts *opts, gr_ckpt_load_stats *stats)
{
    return ck_load(dir, tables, NULL, ntables, opts, stats);
}

int ck_load(const char *dir, gr_table *const *tables, const gr_table_spec *specs,
            size_t ntables, const gr_ckpt_load_opts *opts, gr_ckpt_load_stats *stats)
{
    gr_ckpt_load_opts def = {0, 1, NULL, 0};
    const gr_ckpt_load_opts *o = opts ? opts : &def;
    gr_ckpt_load_stats st_local;
    gr_ckpt_load_stats *st = stats ? stats : &st_local;
    memset(st, 0, sizeof *st);
    if (!dir || (ntables && !tables)) return gr_seterr(GR_EINVAL, "gr_ckpt_load: NULL argument");
    gr_ckpt_slot_map *map = malloc(sizeof *map);
    bool *owned = calloc(GR_SLOTS, sizeof *owned);
    if (!map || !owned) {
        free(map);
        free(owned);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    int rc;
    if (o->map) {
        *map = *o->map;
        rc = gr_ckpt_slot_map_validate(map);
    } else {
        rc = gr_ckpt_slot_map_default(map, o->shards);
    }
    if (rc == GR_OK && o->shard >= map->shards)
        rc = gr_seterr(GR_EINVAL, "shard %u of a %u-shard map", o->shard, map->shards);
    if (rc != GR_OK) {
        free(map);
        free(owned);
        return rc;
    }
    for (uint32_t s = 0; s < GR_SLOTS; s++) owned[s] = map->owner[s] == o->shard;
    free(map);

    ck_chain *c = NULL;
    keyset *live = NULL;
    apply_ctx ac;
    memset(&ac, 0, sizeof ac);
    rc = ck_chain_read(dir, true, &c);
    if (rc != GR_OK) goto out;
    bool export = c->m[0]->kind == GR_CKPT_EXPORT;
    st->checkpoints = (uint32_t)c->len;

    /* Targets against every manifest of the chain. A table missing from an older checkpoint
     * was created after it: its rows are all in the later deltas. */
    for (size_t i = 0; i < ntables && rc == GR_OK; i++) {
        const gr_table_spec *ts = specs ? &specs[i] : gr_table_get_spec(tables[i]);
        for (size_t k = 0; k < i; k++)
            if (!strcmp((specs ? &specs[k] : gr_table_get_spec(tables[k]))->name, ts->name))
                rc = gr_seterr(GR_EINVAL, "table '%s' is given twice", ts->name);
        if (rc != GR_OK) break;
        if (gr_ckpt_manifest_table(c->m[0], ts->name) < 0) {
            rc = gr_seterr(GR_ENOENT, "%s: checkpoint has no table '%s'", dir, ts->name);
            break;
        }
        for (size_t k = 0; k < c->len && rc == GR_OK; k++) {
            long ix = gr_ckpt_manifest_table(c->m[k], ts->name);
            if (ix < 0) continue;
            if (!spec_matches(&c->m[k]->tables[ix], ts, export)) {
                char d[512];
                ck_spec_diff(&c->m[k]->tables[ix], ts, d, sizeof d);
                rc = gr_seterr(GR_EINVAL, "%s: table '%s' does not match the target table: %s",
                               c->dir[k], ts->name, d);
            }
        }
    }
    if (rc != GR_OK) goto out;

    /* Every file we will read: present, right size, trailer and checksum as recorded. */
    for (size_t k = 0; k < c->len && rc == GR_OK; k++)
        for (uint32_t f = 0; f < c->m[k]->map.shards && rc == GR_OK; f++) {
            if (!file_relevant(c->m[k], f, owned)) continue;
            ck_reader r;
            rc = ck_open_checked(&r, c->dir[k], c->m[k], f);
            if (rc == GR_OK) ck_reader_close(&r);
        }
    if (rc != GR_OK) goto out;

    int *want = calloc(GR_CKPT_TABLES_MAX, sizeof *want);
    if (!want) {
        rc = gr_seterr(GR_ENOMEM, "out of memory");
        goto out;
    }
    file_ctx fc = {tables, specs, ntables, export, want, NULL};

    if (c->len > 1 && ntables) {
        /* The newest checkpoint says which keys still exist: delta files list them in KEYS
         * sections, full files (a shard that had to save in full) by their rows. */
        live = calloc(ntables, sizeof *live);
        if (!live) rc = gr_seterr(GR_ENOMEM, "out of memory");
        live_ctx lc = {live, owned};
        for (uint32_t f = 0; rc == GR_OK && f < c->m[0]->map.shards; f++) {
            if (!file_relevant(c->m[0], f, owned)) continue;
            ck_reader r;
            rc = ck_open_checked(&r, c->dir[0], c->m[0], f);
            if (rc != GR_OK) break;
            uint16_t type = r.hdr.kind == GR_CKPT_DELTA ? CK_SEC_KEYS : CK_SEC_ROWS;
            rc = for_each_section(&r, &fc, type, collect_keys, &lc);
            ck_reader_close(&r);
        }
    }
    ac.tables = tables;
    ac.owned = owned;
    ac.live = live;
    ac.st = st;
    uint32_t threads = load_threads(o);
    if (rc == GR_OK) rc = reserve_targets(c, tables, specs, ntables, owned);
    for (size_t k = c->len; k-- > 0 && rc == GR_OK;) {
        for (uint32_t f = 0; f < c->m[k]->map.shards && rc == GR_OK; f++) {
            if (!file_relevant(c->m[k], f, owned)) continue;
            ck_reader r;
            rc = ck_open_checked(&r, c->dir[k], c->m[k], f);
            if (rc != GR_OK) break;
            rc = apply_file(&r, &fc, &ac, threads);
            st->files++;
            st->bytes += r.size;
            ck_reader_close(&r);
        }
    }
    free(want);
out:
    if (live)
        for (size_t i = 0; i < ntables; i++) free(live[i].slots);
    free(live);
    free(ac.keys);
    free(ac.w);
    free(ac.state);
    free(ac.meta);
    free(owned);
    if (c) ck_chain_free(c);
    return rc;
}

int ck_apply_file(ck_reader *r, gr_table *const *tables, size_t ntables, bool export,
                  gr_ckpt_load_stats *st)
{
    bool *owned = malloc(GR_SLOTS * sizeof *owned);
    int *want = malloc(GR_CKPT_TABLES_MAX * sizeof *want);
    int rc = GR_OK;
    if (!owned || !want) rc = gr_seterr(GR_ENOMEM, "out of memory");
    if (rc == GR_OK) {
        for (uint32_t s = 0; s < GR_SLOTS; s++) owned[s] = true;
        file_ctx fc = {tables, NULL, ntables, export, want, NULL};
        apply_ctx ac;
        memset(&ac, 0, sizeof ac);
        ac.tables = tables;
        ac.owned = owned;
        ac.st = st;
        rc = apply_file(r, &fc, &ac, 1);
        free(ac.keys);
        free(ac.w);
        free(ac.state);
        free(ac.meta);
    }
    free(owned);
    free(want);
    return rc;
}

int gr_ckpt_load_new(const char *dir, const gr_ckpt_load_opts *opts, gr_table ***tables_out,
                     size_t *n_out, gr_ckpt_load_stats *stats)
{
    gr_ckpt_manifest *m;
    int rc = gr_ckpt_manifest_read(dir, &m);
    if (rc != GR_OK) return rc;
    gr_table **t = calloc(m->ntables ? m->ntables : 1, sizeof *t);
    if (!t) {
        gr_ckpt_manifest_destroy(m);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    size_t n = 0;
    for (; n < m->ntables && rc == GR_OK; n++) {
        rc = gr_table_create(&m->tables[n], &t[n]);
        if (rc != GR_OK) break;
    }
    if (rc == GR_OK) rc = gr_ckpt_load(dir, t, m->ntables, opts, stats);
    gr_ckpt_manifest_destroy(m);
    if (rc != GR_OK) {
        for (size_t i = 0; i < n; i++) gr_table_destroy(t[i]);
        free(t);
        return rc;
    }
    *tables_out = t;
    *n_out = n;
    return GR_OK;
}
