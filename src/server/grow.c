/* The grow thread (module): has the kernel hand out the row memory growing tables will take
 * next (gr_table_prefault_ahead) on a thread of its own, so that the page faults of new rows
 * are taken beside the requests instead of inside the pull or push that creates the rows (and
 * under that row's partition lock, which the shard's other worker then spins on). Why: in
 * training nearly every row is created during the run, and on a VM a huge page fresh from the
 * host costs milliseconds of fault; with the shard inside the trainer (the embedded cluster)
 * the request that takes it holds up a worker's step while the cores are far from busy
 * (docs/server.md, "Row memory ahead"). A table op that ran wakes the thread (srv_grow_kick);
 * it walks the tables once and sleeps again. Normal priority, not SCHED_IDLE: populating holds
 * the process's mmap lock for reading, and an idle-priority thread preempted there on busy
 * cores would hold every mmap, munmap and mprotect of the process (a row arena's commit among
 * them) for as long as it starves; measured no slower either (docs/train.md, "Session 8").
 * Started only with gr_server_config.populate_ahead. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct srv_grow {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, running;
    atomic_bool kicked;
    pthread_t thread;
    atomic_uint_fast64_t bytes, passes;
} srv_grow;

static void *grow_main(void *arg)
{
    gr_server *s = arg;
    srv_grow *g = s->grow;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->stop && !atomic_load(&g->kicked)) pthread_cond_wait(&g->cv, &g->mu);
        bool stop = g->stop;
        atomic_store(&g->kicked, false);
        pthread_mutex_unlock(&g->mu);
        if (stop) break;
        srv_entry **items;
        size_t n;
        if (srv_registry_snapshot(&s->reg, &items, &n)) continue;
        for (size_t i = 0; i < n; i++) {
            uint64_t b = 0;
            if (!items[i]->dense && gr_table_prefault_ahead(items[i]->table, s->cfg.populate_ahead, &b))
                gr_clearerr(); /* no memory now: the rows fault as they are created */
            atomic_fetch_add(&g->bytes, b);
        }
        srv_registry_release(items, n);
        atomic_fetch_add(&g->passes, 1);
    }
    return NULL;
}

void srv_grow_kick(gr_server *s)
{
    srv_grow *g = s->grow;
    if (!g || atomic_load_explicit(&g->kicked, memory_order_relaxed)) return;
    pthread_mutex_lock(&g->mu);
    atomic_store(&g->kicked, true);
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static int grow_create(gr_server *s)
{
    if (!s->cfg.populate_ahead) return GR_OK;
    srv_grow *g = calloc(1, sizeof *g);
    if (!g) return gr_seterr(GR_ENOMEM, "out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    s->grow = g;
    return GR_OK;
}

static int grow_start(gr_server *s)
{
    srv_grow *g = s->grow;
    if (!g) return GR_OK;
    if (pthread_create(&g->thread, NULL, grow_main, s) != 0)
        return gr_seterr(GR_ENOMEM, "cannot start the grow thread");
    g->running = true;
    return GR_OK;
}

static void grow_stop(gr_server *s)
{
    srv_grow *g = s->grow;
    if (!g || !g->running) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    g->running = false;
}

static void grow_destroy(gr_server *s)
{
    srv_grow *g = s->grow;
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
    s->grow = NULL;
}

/* "grow": {"ahead": bytes asked past each table's rows, "bytes": handed out so far,
 * "passes": walks over the tables}; absent when the thread is off. */
static void grow_stats_json(gr_server *s, void *root)
{
    srv_grow *g = s->grow;
    if (!g) return;
    cJSON *o = cJSON_AddObjectToObject(root, "grow");
    if (!o) return;
    cJSON_AddNumberToObject(o, "ahead", (double)s->cfg.populate_ahead);
    cJSON_AddNumberToObject(o, "bytes", (double)atomic_load(&g->bytes));
    cJSON_AddNumberToObject(o, "passes", (double)atomic_load(&g->passes));
}

const srv_module srv_grow_module = {
    .name = "grow",
    .create = grow_create,
    .start = grow_start,
    .stop = grow_stop,
    .destroy = grow_destroy,
    .stats_json = grow_stats_json,
    .conn_closed = NULL,
};
