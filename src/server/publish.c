/* The publisher (module srv_publish_module): every publish_interval_ms it collects the rows
 * changed since the last publication (the table engine's dirty tracker PUB_TRACKER; weights
 * only, no optimizer state) and every dense parameter that changed (whole), stamps them with a
 * sequence number and a version (wall-clock nanoseconds), and keeps the newest publications in
 * a ring. Serving replicas long-poll with SUBSCRIBE (epoch, since): a replica that is current
 * is parked until the next publication (or its wait runs out: an empty reply); one behind gets
 * the next publication from the ring; one whose position the ring no longer holds, of another
 * epoch (this shard restarted) or new gets a snapshot of every row and dense parameter the
 * shard holds, stamped with the current sequence number. Replicas apply a row only when its
 * version is newer than their copy's, so replays and reordering are harmless.
 *
 * One thread does all of it (collect, snapshot, encode, send): the loop only parks requests,
 * so it never waits for a table scan. docs/serving.md describes the design. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PUB_TRACKER 1u         /* tracker 0 is the checkpoints' */
#define PUB_RING_MAX 256u      /* publications kept for replicas that fall behind */
#define PUB_RING_BYTES (256ull << 20)
#define PUB_WAIT_MAX_MS 60000u /* longest a SUBSCRIBE may ask to be parked */
#define PUB_IDLE_NS (60ull * 1000000000ull) /* no subscriber for this long: stop collecting */

typedef struct pub_rows {
    uint32_t table, dim;
    size_t n, cap;
    uint64_t *keys;
    float *vals;
    uint32_t lo, hi; /* a snapshot page keeps the rows of slots [lo, hi) */
} pub_rows;

typedef struct pub_dense {
    char name[GR_TABLE_NAME_MAX];
    uint64_t size;
    float *vals;
} pub_dense;

/* One publication (or a snapshot). Immutable once built; shared by reference between the ring
 * and replies being encoded. */
typedef struct pub_item {
    uint64_t seq, version;
    uint32_t kind;
    uint32_t next_slot; /* a snapshot page: where the next one starts (0: the last page) */
    uint64_t rows, bytes;
    pub_rows *sp;
    size_t nsp;
    pub_dense *dn;
    size_t ndn;
} pub_item;

typedef struct pub_waiter {
    srv_conn *c;
    uint64_t id;
    gr_proto_subscribe sub;
    uint64_t deadline_ns;
    struct pub_waiter *next;
} pub_waiter;

typedef struct srv_publish {
    gr_server *s;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    pthread_t thread;
    bool live, stopping;
    uint64_t epoch, seq;
    pub_item *ring[PUB_RING_MAX]; /* oldest first, consecutive seqs */
    size_t nring;
    uint64_t ring_bytes;
    pub_waiter *waiters;
    uint64_t last_sub_ns;
    /* counters for STATS */
    uint64_t publications, rows_published, snapshots, replies, bytes_sent, dropped;
} srv_publish;

static srv_publish *pub_of(gr_server *s) { return s->publish; }

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void item_free(pub_item *it)
{
    if (!it) return;
    for (size_t i = 0; i < it->nsp; i++) {
        free(it->sp[i].keys);
        free(it->sp[i].vals);
    }
    for (size_t i = 0; i < it->ndn; i++) free(it->dn[i].vals);
    free(it->sp);
    free(it->dn);
    free(it);
}

/* ---- collecting rows ---- */

static int rows_cb(void *ctx, uint64_t key, const float *w, const float *state, const gr_row_meta *m)
{
    (void)state;
    (void)m;
    pub_rows *r = ctx;
    if (r->hi) {
        uint32_t slot = gr_slot_of(key);
        if (slot < r->lo || slot >= r->hi) return 0;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        uint64_t *k = realloc(r->keys, cap * sizeof *k);
        if (k) r->keys = k;
        float *v = realloc(r->vals, cap * r->dim * sizeof *v);
        if (v) r->vals = v;
        if (!k || !v) return GR_ENOMEM;
        r->cap = cap;
    }
    r->keys[r->n] = key;
    memcpy(r->vals + r->n * r->dim, w, r->dim * sizeof *w);
    r->n++;
    return 0;
}

/* The whole array of a dense parameter (its chunked table read without creating anything). */
static int read_dense(srv_entry *e, pub_dense *d)
{
    uint64_t chunks = (e->dense_size + e->chunk - 1) / e->chunk;
    uint64_t *keys = malloc(chunks * sizeof *keys);
    float *vals = malloc(chunks * e->chunk * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return gr_seterr(GR_ENOMEM, "publisher: out of memory for dense '%s'", e->name);
    }
    for (uint64_t i = 0; i < chunks; i++) keys[i] = i;
    int rc = gr_table_get(e->table, keys, chunks, vals, NULL, NULL, NULL);
    free(keys);
    if (rc) {
        free(vals);
        return rc;
    }
    snprintf(d->name, sizeof d->name, "%s", e->name);
    d->size = e->dense_size;
    d->vals = vals;
    return GR_OK;
}

static int noop_cb(void *ctx, uint64_t key, const float *w, const float *st, const gr_row_meta *m)
{
    (void)ctx, (void)key, (void)w, (void)st, (void)m;
    return 0;
}

/* Builds a publication: the dirty rows and changed dense parameters (snapshot false), or the
 * rows of slots [lo, hi) and, on the first page (lo 0), every dense parameter (snapshot true;
 * dirty marks are left for the next publication). hi 0: every slot. */
static int collect(gr_server *s, bool snapshot, uint32_t lo, uint32_t hi, pub_item **out)
{
    *out = NULL;
    srv_entry **items = NULL;
    size_t n = 0;
    int rc = srv_registry_snapshot(&s->reg, &items, &n);
    if (rc) return rc;
    pub_item *it = calloc(1, sizeof *it);
    if (it) {
        it->sp = calloc(n ? n : 1, sizeof *it->sp);
        it->dn = calloc(n ? n : 1, sizeof *it->dn);
    }
    if (!it || !it->sp || !it->dn) rc = gr_seterr(GR_ENOMEM, "publisher: out of memory");
    if (it) it->kind = snapshot ? GR_PROTO_PUB_SNAPSHOT : GR_PROTO_PUB_DELTA;
    for (size_t i = 0; !rc && i < n; i++) {
        srv_entry *e = items[i];
        if (e->dense) {
            if (snapshot && lo > 0) continue; /* dense parameters ride on the first page */
            /* A snapshot leaves the marks alone: replicas that follow the deltas still need
             * the change in the next publication. */
            if (!snapshot) {
                if (!gr_table_dirty_count(e->table, PUB_TRACKER)) continue;
                gr_table_scan_dirty(e->table, PUB_TRACKER, noop_cb, NULL);
            }
            if (!(rc = read_dense(e, &it->dn[it->ndn]))) {
                it->bytes += e->dense_size * 4;
                it->ndn++;
            }
            continue;
        }
        pub_rows *r = &it->sp[it->nsp];
        r->table = e->id;
        r->dim = gr_table_get_spec(e->table)->dim;
        if (snapshot && (lo > 0 || (hi && hi < GR_SLOTS))) {
            r->lo = lo;
            r->hi = hi ? hi : GR_SLOTS;
        }
        rc = snapshot ? gr_table_scan(e->table, rows_cb, r)
                      : gr_table_scan_dirty(e->table, PUB_TRACKER, rows_cb, r);
        if (rc > 0) rc = gr_seterr(GR_ENOMEM, "publisher: out of memory for rows of '%s'", e->name);
        it->nsp++; /* counted even when empty or failed, so item_free frees its arrays */
        it->rows += r->n;
        it->bytes += r->n * (8 + r->dim * 4ull);
    }
    srv_registry_release(items, n);
    if (rc) {
        item_free(it);
        return rc;
    }
    it->version = wall_ns();
    *out = it;
    return GR_OK;
}

/* ---- replies ---- */

static int encode(const srv_publish *p, const pub_item *it, uint64_t id, bool f16, gr_proto_buf *b)
{
    uint32_t nsp = 0;
    for (size_t i = 0; it && i < it->nsp; i++) nsp += it->sp[i].n > 0;
    gr_proto_publication head = {.epoch = p->epoch,
                                 .seq = it ? it->seq : p->seq,
                                 .version = it ? it->version : 0,
                                 .kind = it ? it->kind : GR_PROTO_PUB_NONE,
                                 .shard = p->s->cfg.shard,
                                 .f16 = f16,
                                 .next_slot = it ? it->next_slot : 0,
                                 .nsparse = nsp,
                                 .ndense = it ? (uint32_t)it->ndn : 0};
    int rc = gr_proto_begin(b, GR_PROTO_RESPONSE, GR_OP_SUBSCRIBE, 0, 0, id);
    if (!rc) rc = gr_proto_put_pub_head(b, &head);
    for (size_t i = 0; !rc && it && i < it->nsp; i++) {
        const pub_rows *r = &it->sp[i];
        if (!r->n) continue;
        uint64_t *k;
        void *v;
        if ((rc = gr_proto_put_pub_section(b, r->table, r->dim, (uint32_t)r->n, f16, &k, &v))) break;
        memcpy(k, r->keys, r->n * 8);
        if (f16)
            for (size_t j = 0; j < r->n * r->dim; j++) ((uint16_t *)v)[j] = gr_f32_to_f16(r->vals[j]);
        else
            memcpy(v, r->vals, r->n * r->dim * 4);
    }
    for (size_t i = 0; !rc && it && i < it->ndn; i++)
        rc = gr_proto_put_dense_part(b, it->dn[i].name, it->dn[i].vals, it->dn[i].size);
    if (!rc) rc = gr_proto_end(b, 0);
    if (!rc && b->len - GR_PROTO_HEADER_SIZE > p->s->cfg.limits.max_body)
        rc = gr_seterr(GR_ETOOBIG, "publication %llu of shard %u is %zu bytes, over the body limit "
                       "of %u", (unsigned long long)head.seq, head.shard, b->len, p->s->cfg.limits.max_body);
    return rc;
}

/* Answers w with it (NULL: nothing new) and frees w. Called without mu. */
static void reply(srv_publish *p, pub_waiter *w, const pub_item *it)
{
    gr_server *s = p->s;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int rc = encode(p, it, w->id, w->sub.flags & GR_PROTO_SUB_F16, &b);
    if (rc) {
        atomic_fetch_add(&s->ops[GR_OP_SUBSCRIBE].errors, 1);
        srv_conn_send_error(w->c, GR_OP_SUBSCRIBE, w->id, rc, gr_errmsg());
    } else {
        srv_conn_send(w->c, b.data, b.len, GR_OP_SUBSCRIBE);
    }
    pthread_mutex_lock(&p->mu);
    p->replies++;
    if (!rc) p->bytes_sent += b.len;
    pthread_mutex_unlock(&p->mu);
    gr_proto_buf_fini(&b);
    srv_conn_put(w->c);
    free(w);
}

/* Slots per snapshot page: the shard's rows (weights and keys) are cut into a power of two of
 * equal slot ranges, each expected to fill at most half a frame body. */
static uint32_t page_slots(gr_server *s, bool f16)
{
    srv_entry **items = NULL;
    size_t n = 0;
    if (srv_registry_snapshot(&s->reg, &items, &n)) return GR_SLOTS;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i]->dense) continue;
        gr_table_stats st;
        gr_table_get_stats(items[i]->table, &st);
        bytes += st.rows * (8 + (uint64_t)gr_table_get_spec(items[i]->table)->dim * (f16 ? 2 : 4));
    }
    srv_registry_release(items, n);
    uint64_t budget = s->cfg.limits.max_body / 2 ? s->cfg.limits.max_body / 2 : 1;
    uint32_t pages = 1;
    while (pages < GR_SLOTS && bytes / pages > budget) pages *= 2;
    return GR_SLOTS / pages;
}

/* The ring's publication after `since` of this epoch; NULL when the replica is current;
 * *snapshot when the ring cannot continue from there (or the replica asks for the next page
 * of one). Under mu. */
static pub_item *next_for_locked(srv_publish *p, const gr_proto_subscribe *sub, bool *snapshot)
{
    *snapshot = false;
    if (sub->from_slot && sub->epoch == p->epoch) {
        *snapshot = true;
        return NULL;
    }
    if (sub->epoch != p->epoch || sub->since > p->seq) {
        *snapshot = true;
        return NULL;
    }
    if (sub->since == p->seq) return NULL;
    if (!p->nring || sub->since + 1 < p->ring[0]->seq) {
        *snapshot = true;
        return NULL;
    }
    return p->ring[sub->since + 1 - p->ring[0]->seq];
}

static void ring_add_locked(srv_publish *p, pub_item *it)
{
    while (p->nring && (p->nring == PUB_RING_MAX || p->ring_bytes + it->bytes > PUB_RING_BYTES)) {
        p->ring_bytes -= p->ring[0]->bytes;
        item_free(p->ring[0]);
        memmove(p->ring, p->ring + 1, (p->nring - 1) * sizeof *p->ring);
        p->nring--;
        p->dropped++;
    }
    p->ring[p->nring++] = it;
    p->ring_bytes += it->bytes;
}

/* Serves every waiter that can be served now. Ring items are freed only by this thread, so
 * they stay valid while the lock is dropped to encode. Under mu (dropped and retaken). */
static void serve_waiters_locked(srv_publish *p, uint64_t now)
{
    pub_waiter **pp = &p->waiters;
    while (*pp) {
        pub_waiter *w = *pp;
        bool snap;
        pub_item *it = next_for_locked(p, &w->sub, &snap);
        if (!snap && !it && now < w->deadline_ns && !p->stopping) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        pub_item *own = NULL;
        if (snap) {
            own = NULL;
            /* A new snapshot starts at slot 0 and is stamped with the current sequence number;
             * its next pages carry the number the replica brings back. */
            bool cont = w->sub.from_slot && w->sub.epoch == p->epoch;
            uint32_t lo = cont ? w->sub.from_slot : 0;
            uint64_t seq = cont ? w->sub.since : p->seq;
            pthread_mutex_unlock(&p->mu);
            uint32_t width = page_slots(p->s, w->sub.flags & GR_PROTO_SUB_F16);
            uint32_t hi = lo + width < GR_SLOTS ? lo + width : GR_SLOTS;
            int rc = collect(p->s, true, lo, hi, &own);
            if (!rc) own->next_slot = hi < GR_SLOTS ? hi : 0;
            pthread_mutex_lock(&p->mu);
            if (rc) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", gr_errmsg());
                pthread_mutex_unlock(&p->mu);
                srv_conn_send_error(w->c, GR_OP_SUBSCRIBE, w->id, rc, msg);
                srv_conn_put(w->c);
                free(w);
                pthread_mutex_lock(&p->mu);
                pp = &p->waiters;
                continue;
            }
            own->seq = seq;
            p->snapshots += lo == 0;
            it = own;
        }
        pthread_mutex_unlock(&p->mu);
        reply(p, w, it);
        item_free(own);
        pthread_mutex_lock(&p->mu);
        pp = &p->waiters; /* the list may have changed while unlocked */
    }
}

static void *publish_main(void *arg)
{
    srv_publish *p = arg;
    gr_server *s = p->s;
    uint64_t interval = (uint64_t)s->cfg.publish_interval_ms * 1000000ull;
    uint64_t next_pub = gr_now_ns() + interval;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        uint64_t now = gr_now_ns();
        if (now >= next_pub) {
            next_pub = now + interval;
            /* Nobody listening: leave the dirty marks to accumulate (the next subscriber gets a
             * snapshot anyway) instead of copying rows into the ring for no one. */
            if (p->last_sub_ns && now - p->last_sub_ns < PUB_IDLE_NS) {
                pthread_mutex_unlock(&p->mu);
                pub_item *it = NULL;
                int rc = collect(s, false, 0, 0, &it);
                if (rc) GR_LOGW("shard %u: publish failed: %s", s->cfg.shard, gr_errmsg());
                pthread_mutex_lock(&p->mu);
                if (it && (it->rows || it->ndn)) {
                    it->seq = ++p->seq;
                    p->publications++;
                    p->rows_published += it->rows;
                    ring_add_locked(p, it);
                } else {
                    item_free(it);
                }
            }
        }
        serve_waiters_locked(p, gr_now_ns());
        uint64_t wake = next_pub;
        for (pub_waiter *w = p->waiters; w; w = w->next)
            if (w->deadline_ns < wake) wake = w->deadline_ns;
        now = gr_now_ns();
        if (wake > now) {
            uint64_t wait = wake - now;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + wait;
            ts.tv_sec = (time_t)(t / 1000000000ull);
            ts.tv_nsec = (long)(t % 1000000000ull);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
    }
    serve_waiters_locked(p, UINT64_MAX); /* stopping: every waiter gets its empty reply */
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the SUBSCRIBE request (loop thread: parks it, never blocks) ---- */

void srv_publish_subscribe_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    srv_publish *p = pub_of(s);
    gr_proto_subscribe sub;
    int rc = gr_proto_decode_subscribe(body, h->body_len, &sub);
    free(body);
    char msg[256] = "";
    if (rc) snprintf(msg, sizeof msg, "%s", gr_errmsg());
    else if (!s->cfg.publish_interval_ms)
        rc = GR_EINVAL, snprintf(msg, sizeof msg, "shard %u does not publish updates (start it "
                                 "with --publish-interval MS)", s->cfg.shard);
    else if (sub.wait_ms > PUB_WAIT_MAX_MS)
        rc = GR_EINVAL, snprintf(msg, sizeof msg, "subscribe wait of %u ms is over %u ms",
                                 sub.wait_ms, PUB_WAIT_MAX_MS);
    pub_waiter *w = rc ? NULL : calloc(1, sizeof *w);
    if (!rc && !w) rc = GR_ENOMEM, snprintf(msg, sizeof msg, "out of memory for a subscription");
    if (!rc) {
        pthread_mutex_lock(&p->mu);
        if (p->stopping || !p->live) {
            rc = GR_ESHUTDOWN;
            snprintf(msg, sizeof msg, "shard is shutting down");
        } else {
            w->c = c;
            srv_conn_get(c);
            w->id = h->id;
            w->sub = sub;
            w->deadline_ns = gr_now_ns() + (uint64_t)sub.wait_ms * 1000000ull;
            w->next = p->waiters;
            p->waiters = w;
            p->last_sub_ns = gr_now_ns();
            pthread_cond_signal(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
        if (rc) free(w);
    }
    if (rc) {
        atomic_fetch_add(&s->ops[GR_OP_SUBSCRIBE].errors, 1);
        srv_conn_send_error(c, h->op, h->id, rc, msg);
    }
}

int srv_op_replica_only(srv_req *r)
{
    return gr_seterr(GR_EPROTO, "%s is answered by serving replicas (granary serve --listen), not "
                     "by training shards", gr_proto_op_name(r->h->op));
}

/* ---- life cycle ---- */

static int pub_create(gr_server *s)
{
    srv_publish *p = calloc(1, sizeof *p);
    if (!p) return gr_seterr(GR_ENOMEM, "out of memory for the publisher");
    p->s = s;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The epoch tells a replica whether this shard restarted since it last polled. */
    p->epoch = wall_ns();
    s->publish = p;
    return GR_OK;
}

static int pub_start(gr_server *s)
{
    srv_publish *p = pub_of(s);
    if (!s->cfg.publish_interval_ms) return GR_OK;
    /* live is read by the loop thread (under mu) as soon as a SUBSCRIBE arrives. */
    pthread_mutex_lock(&p->mu);
    p->live = pthread_create(&p->thread, NULL, publish_main, p) == 0;
    bool ok = p->live;
    pthread_mutex_unlock(&p->mu);
    return ok ? GR_OK : gr_seterr(GR_EINTERNAL, "cannot start the publisher thread");
}

static void pub_stop(gr_server *s)
{
    srv_publish *p = pub_of(s);
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    bool live = p->live;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (live) pthread_join(p->thread, NULL);
}

static void pub_destroy(gr_server *s)
{
    srv_publish *p = pub_of(s);
    if (!p) return;
    while (p->waiters) { /* never started: nobody could have parked, but be safe */
        pub_waiter *w = p->waiters;
        p->waiters = w->next;
        srv_conn_put(w->c);
        free(w);
    }
    for (size_t i = 0; i < p->nring; i++) item_free(p->ring[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    s->publish = NULL;
}

static void pub_conn_closed(gr_server *s, srv_conn *c)
{
    srv_publish *p = pub_of(s);
    pthread_mutex_lock(&p->mu);
    pub_waiter **pp = &p->waiters, *gone = NULL;
    while (*pp) {
        pub_waiter *w = *pp;
        if (w->c == c) {
            *pp = w->next;
            w->next = gone;
            gone = w;
        } else {
            pp = &w->next;
        }
    }
    pthread_mutex_unlock(&p->mu);
    while (gone) {
        pub_waiter *w = gone;
        gone = w->next;
        srv_conn_put(w->c);
        free(w);
    }
}

static void pub_stats_json(gr_server *s, void *root)
{
    srv_publish *p = pub_of(s);
    cJSON *o = cJSON_AddObjectToObject(root, "publish");
    if (!o) return;
    pthread_mutex_lock(&p->mu);
    unsigned waiting = 0;
    for (pub_waiter *w = p->waiters; w; w = w->next) waiting++;
    cJSON_AddNumberToObject(o, "interval_ms", s->cfg.publish_interval_ms);
    cJSON_AddNumberToObject(o, "epoch", (double)p->epoch);
    cJSON_AddNumberToObject(o, "seq", (double)p->seq);
    cJSON_AddNumberToObject(o, "publications", (double)p->publications);
    cJSON_AddNumberToObject(o, "rows_published", (double)p->rows_published);
    cJSON_AddNumberToObject(o, "snapshots", (double)p->snapshots);
    cJSON_AddNumberToObject(o, "replies", (double)p->replies);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)p->bytes_sent);
    cJSON_AddNumberToObject(o, "ring", (double)p->nring);
    cJSON_AddNumberToObject(o, "ring_bytes", (double)p->ring_bytes);
    cJSON_AddNumberToObject(o, "ring_dropped", (double)p->dropped);
    cJSON_AddNumberToObject(o, "subscribers_waiting", waiting);
    pthread_mutex_unlock(&p->mu);
}

const srv_module srv_publish_module = {
    .name = "publish",
    .create = pub_create,
    .start = pub_start,
    .stop = pub_stop,
    .destroy = pub_destroy,
    .stats_json = pub_stats_json,
    .conn_closed = pub_conn_closed,
};
