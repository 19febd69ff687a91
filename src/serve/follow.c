/* The replica's subscriptions: one thread per training shard long-polls SUBSCRIBE with the
 * (epoch, seq) of the last publication it applied from that shard, and applies each reply.
 * A shard that restarted (new epoch), or whose ring no longer reaches back to that seq, answers
 * with a snapshot, so a replica that fell behind, restarted or lost its shard catches up by
 * itself; a shard that is down is retried with backoff while the replica keeps serving what it
 * has. */
#include "serve/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct sv_shard {
    struct sv_follow *f;
    uint32_t index;
    pthread_t thread;
    bool started;
    uint64_t epoch, seq;
    uint32_t next_slot; /* inside a paged snapshot: the slot its next page starts at */
    bool connected;
} sv_shard;

struct sv_follow {
    gr_serve *s;
    pthread_t boot;
    bool boot_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    gr_client *cl;
    sv_shard *shards;
    uint32_t nshards;
};

/* Sleeps up to ms unless stopping; true when stopping. */
static bool nap(sv_follow *f, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&f->mu);
    if (!f->stopping) pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->mu);
    return stop;
}

static bool stopping(sv_follow *f)
{
    pthread_mutex_lock(&f->mu);
    bool stop = f->stopping;
    pthread_mutex_unlock(&f->mu);
    return stop;
}

static void set_connected(sv_shard *sh, bool up)
{
    if (sh->connected == up) return;
    sh->connected = up;
    if (up) atomic_fetch_add(&sh->f->s->shards_connected, 1);
    else atomic_fetch_sub(&sh->f->s->shards_connected, 1);
}

static void *shard_main(void *arg)
{
    sv_shard *sh = arg;
    sv_follow *f = sh->f;
    gr_serve *s = f->s;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    /* The shard authenticated itself and its frames are bounded by the client's body limit;
     * a snapshot may carry more keys than a request ever does. */
    lim.max_keys = UINT32_MAX;
    lim.max_tables = 65536;
    uint32_t backoff = 100;
    bool quiet = false;
    while (!stopping(f)) {
        gr_proto_buf b;
        gr_proto_buf_init(&b);
        gr_proto_subscribe sub = {sh->epoch, sh->seq, s->cfg.poll_wait_ms,
                                  s->cfg.f16 ? GR_PROTO_SUB_F16 : 0, sh->next_slot};
        void *reply = NULL;
        size_t rlen = 0;
        int rc = gr_proto_put_subscribe(&b, &sub);
        if (!rc) rc = gr_client_call(f->cl, sh->index, GR_OP_SUBSCRIBE, b.data, b.len,
                                     s->cfg.poll_wait_ms + 10000, &reply, &rlen);
        gr_proto_buf_fini(&b);
        gr_proto_publication p;
        if (!rc && !(rc = gr_proto_decode_publication(reply, rlen, &lim, &p))) {
            int arc = gr_serve_apply(s, &p);
            if (arc) {
                atomic_fetch_add(&s->errors, 1);
                GR_LOGW("replica: publication %llu of shard %u not fully applied: %s",
                        (unsigned long long)p.seq, sh->index, gr_errmsg());
            }
            /* Moved on even when the apply failed: polling the same publication again would
             * fail the same way forever; the next snapshot repairs what was missed. */
            sh->epoch = p.epoch;
            sh->seq = p.seq;
            sh->next_slot = p.next_slot;
            gr_proto_publication_fini(&p);
        }
        free(reply);
        if (rc) {
            set_connected(sh, false);
            if (!quiet && !stopping(f))
                GR_LOGW("replica: shard %u (%s): %s; retrying", sh->index,
                        gr_client_shard_addr(f->cl, sh->index), gr_errmsg());
            quiet = true;
            if (nap(f, backoff)) break;
            backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
            continue;
        }
        if (quiet) GR_LOGI("replica: shard %u is back", sh->index);
        quiet = false;
        backoff = 100;
        set_connected(sh, true);
    }
    set_connected(sh, false);
    return NULL;
}

/* Connects (retrying while the shards are not up yet), then starts one thread per shard. */
static void *boot_main(void *arg)
{
    sv_follow *f = arg;
    gr_serve *s = f->s;
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = s->cfg.from;
    cc.auth_file = s->cfg.auth_file;
    bool said = false;
    while (!stopping(f)) {
        gr_client *cl = NULL;
        if (gr_client_create(&cc, &cl) == GR_OK) {
            f->cl = cl;
            break;
        }
        if (!said) GR_LOGW("replica: cannot reach the training shards yet: %s; retrying", gr_errmsg());
        said = true;
        if (nap(f, 500)) break;
    }
    if (!f->cl) return NULL;
    uint32_t n = gr_client_shards(f->cl);
    f->shards = calloc(n, sizeof *f->shards);
    if (!f->shards) {
        GR_LOGE("replica: out of memory for %u subscriptions", n);
        return NULL;
    }
    f->nshards = n;
    for (uint32_t i = 0; i < n; i++) {
        f->shards[i] = (sv_shard){.f = f, .index = i};
        f->shards[i].started = pthread_create(&f->shards[i].thread, NULL, shard_main, &f->shards[i]) == 0;
        if (!f->shards[i].started) GR_LOGE("replica: cannot start the subscription of shard %u", i);
    }
    GR_LOGI("replica: subscribed to %u training shard(s) at %s", n, s->cfg.from);
    return NULL;
}

int sv_follow_start(gr_serve *s, sv_follow **out)
{
    *out = NULL;
    sv_follow *f = calloc(1, sizeof *f);
    if (!f) return gr_seterr(GR_ENOMEM, "out of memory for subscriptions");
    f->s = s;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pthread_create(&f->boot, NULL, boot_main, f)) {
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->cv);
        free(f);
        return gr_seterr(GR_EINTERNAL, "cannot start the subscription thread");
    }
    f->boot_started = true;
    *out = f;
    return GR_OK;
}

void sv_follow_stop(sv_follow *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    if (f->boot_started) pthread_join(f->boot, NULL);
    for (uint32_t i = 0; i < f->nshards; i++)
        if (f->shards[i].started) pthread_join(f->shards[i].thread, NULL);
    gr_client_destroy(f->cl);
    free(f->shards);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}
