/* A `granary train --coord ... --job-workers N` process: one of N worker processes of a job
 * (train_job.h). What the processes agree on lives in one job value, "workers" (a znode under
 * the job's PATH, changed only by compare-and-set on its version, gr_coord_value_cas):
 *
 *   {"run":"<hex>","owner":"<hex>","ranks":N,"threads":T,"mode":"hybrid","ready":false,
 *    "done":false,"ckpt_step":0,"ckpt":"","claims":[{"member":"m-..","pid":P,
 *    "state":"running|finished|lost"} or null, ...]}
 *
 * A rank is claimed by writing our member id into the lowest free entry of "claims" (free:
 * null, or naming a member that is gone, before the run started) with compare-and-set: of two
 * processes claiming the same rank exactly one write succeeds. A claim and not the member
 * order, because the order changes when a process dies and another registers, and a rank must
 * keep naming the same share of the data. Liveness is the member list: a claim whose member
 * znode is gone belongs to a dead process. The chief is the election's leader. */
#include "cli/train_job.h"
#include "granary/client.h"
#include "granary/coord.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VALUE "workers"
#define POLL_MS 100
#define WATCH_MS 250

struct tj_job {
    tc_job *tc;
    gr_coord *c;
    tj_want want;
    char mode[32];
    char me[GR_COORD_ID_MAX];
    unsigned rank;
    uint64_t owner;
    char run[17];
    bool initialises;
    bool stepped;       /* the mode has a sync job (leaves are sent for lost processes) */
    gr_train_job hooks;
    pthread_t watcher;
    bool watching;
    atomic_bool stop;
    /* The client for leaves and clears (created when first needed), used by the watcher and
     * by the set-up after a recovery (the main thread): under leaver_mu. */
    gr_client *leaver;
    pthread_mutex_t leaver_mu;
    /* The shards' addresses for it: a copy the main thread refreshes after a recovery healed
     * the layout (tc_servers is the main thread's). Under leaver_mu. */
    char *leaver_servers;
    bool was_chief;     /* the watcher's: for the log line */
    /* The run was done by another chief when this process finished waiting: it leads nothing
     * any more (the final checkpoint and the job's metrics are that chief's). */
    atomic_bool ended_by_other;
    /* Recovery: the generation ("recovery":{"gen"}) this process's run belongs to; a run that
     * returned from its wait for the others because the job recovers; this process took over
     * a lost rank of a running run, and that rank's recorded data position (UINT64_MAX: none);
     * the joining member the watcher last stopped the sync job for (re-admission). */
    uint64_t gen;
    atomic_bool must_recover;
    bool joining;
    uint64_t pos;
    char admitted[GR_COORD_ID_MAX];
};

static int leaver_reset(tj_job *j);

/* ---- the job value ---- */

/* Reads the value: *rec (NULL when none is stored) and its version (-1 then). */
static int rec_get(tj_job *j, cJSON **rec, int64_t *version)
{
    *rec = NULL;
    *version = -1;
    char *txt = NULL;
    int rc = gr_coord_value_get(j->c, VALUE, &txt, version);
    if (rc == GR_ENOENT) {
        gr_clearerr();
        *version = -1;
        return GR_OK;
    }
    if (rc) return rc;
    *rec = cJSON_Parse(txt);
    free(txt);
    if (!*rec || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(*rec, "claims"))) {
        cJSON_Delete(*rec);
        *rec = NULL;
        GR_LOGW("coord: the job value '%s' does not parse: it is replaced by a new run", VALUE);
    }
    return GR_OK;
}

/* The job's record and the live members together, for a look at every claim: true when both
 * were read (free them with view_free); false leaves nothing to free. */
static bool view_get(tj_job *j, cJSON **rec, gr_coord_member **ms, size_t *n)
{
    int64_t ver;
    *ms = NULL;
    *n = 0;
    if (rec_get(j, rec, &ver) || !*rec || gr_coord_members(j->c, ms, n)) {
        free(*ms);
        cJSON_Delete(*rec);
        *rec = NULL;
        *ms = NULL;
        return false;
    }
    return true;
}

static void view_free(cJSON *rec, gr_coord_member *ms)
{
    free(ms);
    cJSON_Delete(rec);
}

static int rec_put(tj_job *j, const cJSON *rec, int64_t *version)
{
    char *txt = cJSON_PrintUnformatted(rec);
    if (!txt) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = gr_coord_value_cas(j->c, VALUE, txt, version);
    free(txt);
    return rc;
}

static bool rec_bool(const cJSON *rec, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, k));
}

static double rec_num(const cJSON *rec, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *rec_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void obj_set(cJSON *o, const char *k, cJSON *v)
{
    if (cJSON_HasObjectItem(o, k)) cJSON_ReplaceItemInObjectCaseSensitive(o, k, v);
    else cJSON_AddItemToObject(o, k, v);
}

/* The job's recovery generation and whether its leader has restored it. */
static uint64_t rec_gen(const cJSON *rec, bool *restored)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(rec, "recovery");
    if (restored) *restored = !r || rec_bool(r, "restored");
    return r ? (uint64_t)rec_num(r, "gen") : 0;
}

static bool member_alive(const gr_coord_member *ms, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ms[i].id, id)) return true;
    return false;
}

/* A claim's member is registered now. */
static bool claim_alive(const cJSON *claim, const gr_coord_member *ms, size_t n)
{
    return cJSON_IsObject(claim) && member_alive(ms, n, rec_str(claim, "member"));
}

/* A run goes on while it is not done and either one of its claims' members is registered or
 * nothing is claimed yet (a run just started); a run whose claimed processes are all gone is
 * over (they crashed), and the leader starts a new one. */
static bool run_live(const cJSON *rec, const gr_coord_member *ms, size_t n)
{
    if (!rec || rec_bool(rec, "done")) return false;
    bool claimed = false;
    const cJSON *cl;
    cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(rec, "claims"))
    {
        if (claim_alive(cl, ms, n)) return true;
        claimed |= cJSON_IsObject(cl);
    }
    return !claimed;
}

/* A new run of the job, written by the leader when none is live. */
static cJSON *new_run(const tj_job *j)
{
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)gr_random_id());
    cJSON_AddStringToObject(r, "run", buf);
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)gr_random_id());
    cJSON_AddStringToObject(r, "owner", buf);
    cJSON_AddNumberToObject(r, "ranks", j->want.ranks);
    cJSON_AddNumberToObject(r, "threads", j->want.threads);
    cJSON_AddStringToObject(r, "mode", j->mode);
    cJSON_AddBoolToObject(r, "ready", false);
    cJSON_AddBoolToObject(r, "done", false);
    cJSON_AddNumberToObject(r, "ckpt_step", 0);
    cJSON_AddStringToObject(r, "ckpt", "");
    cJSON *cl = cJSON_AddArrayToObject(r, "claims");
    for (unsigned i = 0; i < j->want.ranks; i++) cJSON_AddItemToArray(cl, cJSON_CreateNull());
    return r;
}

/* The run asks for what this process asks for. */
static int check_settings(const tj_job *j, const cJSON *rec)
{
    unsigned ranks = (unsigned)rec_num(rec, "ranks"), threads = (unsigned)rec_num(rec, "threads");
    const char *mode = rec_str(rec, "mode");
    if (ranks == j->want.ranks && threads == j->want.threads && !strcmp(mode, j->mode))
        return GR_OK;
    return gr_seterr(GR_EINVAL, "the job's run %s has %u worker processes of %u workers each in "
                     "mode %s; this process asks for %u of %u in mode %s: give every process of "
                     "a job the same --job-workers, --workers and --mode", rec_str(rec, "run"),
                     ranks, threads, mode, j->want.ranks, j->want.threads, j->mode);
}

/* One attempt at a rank: 1 claimed, 0 not yet (try again), or an error. */
static int try_claim(tj_job *j)
{
    cJSON *rec = NULL;
    int64_t ver = -1;
    gr_coord_member *ms = NULL;
    size_t n = 0;
    int rc = rec_get(j, &rec, &ver);
    if (!rc) rc = gr_coord_members(j->c, &ms, &n);
    if (rc) goto out;
    if (!run_live(rec, ms, n)) {
        /* No run, a finished one, or one whose processes are all gone: the leader starts a
         * new run (the others wait for it). */
        if (gr_coord_is_leader(j->c)) {
            cJSON_Delete(rec);
            rec = new_run(j);
            rc = rec ? rec_put(j, rec, &ver) : gr_seterr(GR_ENOMEM, "out of memory");
            if (!rc) fprintf(stderr, "train: started run %s of the job (%u worker processes)\n",
                             rec_str(rec, "run"), j->want.ranks);
            if (rc == GR_ESTALE) rc = 0;
        }
        goto out;
    }
    if ((rc = check_settings(j, rec))) goto out;
    bool running = rec_bool(rec, "ready");
    cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
    /* Our own claim, written by an earlier attempt whose answer was lost with the connection:
     * it is ours (a second one would leave a rank without a process). */
    for (int r = 0; r < cJSON_GetArraySize(claims); r++)
        if (!strcmp(rec_str(cJSON_GetArrayItem(claims, r), "member"), j->me)) {
            j->rank = (unsigned)r;
            snprintf(j->run, sizeof j->run, "%s", rec_str(rec, "run"));
            j->owner = strtoull(rec_str(rec, "owner"), NULL, 16);
            j->gen = rec_gen(rec, NULL);
            rc = 1;
            goto out;
        }
    /* A free rank: before the run starts, any whose process is gone; in a running run, one
     * whose process is gone before it finished its data (lost): this process takes it over. */
    int free_rank = -1;
    for (int r = 0; r < cJSON_GetArraySize(claims) && free_rank < 0; r++) {
        const cJSON *was = cJSON_GetArrayItem(claims, r);
        if (!claim_alive(was, ms, n) && !(running && !strcmp(rec_str(was, "state"), "finished")))
            free_rank = r;
    }
    if (free_rank < 0) {
        /* A lost process's rank frees when its session ends (one session timeout after a
         * kill -9): a replacement started sooner waits for it. */
        rc = running ? 0 : gr_seterr(GR_EBUSY, "all %u ranks of the job's run %s are claimed by "
                                     "live processes", j->want.ranks, rec_str(rec, "run"));
        goto out;
    }
    /* The lost rank's recorded position, copied: its claim is replaced (freed) below. */
    const cJSON *was_pos = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(claims, free_rank),
                                                            "pos");
    bool has_pos = running && cJSON_IsNumber(was_pos);
    double pos = has_pos ? was_pos->valuedouble : 0;
    cJSON *cl = cJSON_CreateObject();
    if (!cl) {
        rc = gr_seterr(GR_ENOMEM, "out of memory");
        goto out;
    }
    cJSON_AddStringToObject(cl, "member", j->me);
    cJSON_AddNumberToObject(cl, "pid", (double)getpid());
    cJSON_AddStringToObject(cl, "state", "running");
    /* A replacement in a mode with a sync job is re-admitted by a recovery of the whole job
     * (the chief resets the sync job, which takes every worker in again): it asks for one. */
    if (running && j->stepped) {
        cJSON_AddBoolToObject(cl, "recovering", true);
        cJSON_AddBoolToObject(cl, "joining", true);
    }
    if (has_pos) cJSON_AddNumberToObject(cl, "pos", pos);
    cJSON_ReplaceItemInArray(claims, free_rank, cl);
    rc = rec_put(j, rec, &ver);
    if (rc == GR_ESTALE) {
        rc = 0; /* someone else wrote first: look again */
        goto out;
    }
    if (!rc) {
        j->rank = (unsigned)free_rank;
        snprintf(j->run, sizeof j->run, "%s", rec_str(rec, "run"));
        j->owner = strtoull(rec_str(rec, "owner"), NULL, 16);
        j->joining = running;
        j->gen = rec_gen(rec, NULL);
        j->pos = has_pos ? (uint64_t)pos : UINT64_MAX;
        rc = 1;
    }
out:
    free(ms);
    cJSON_Delete(rec);
    return rc;
}

/* Every rank claimed by a live process (the startup barrier): 1 yes, 0 not yet, or an error.
 * *seen: live claims. */
static int all_claimed(tj_job *j, unsigned *seen, bool *ready)
{
    cJSON *rec = NULL;
    int64_t ver;
    gr_coord_member *ms = NULL;
    size_t n = 0;
    int rc = rec_get(j, &rec, &ver);
    if (!rc) rc = gr_coord_members(j->c, &ms, &n);
    if (!rc && (!rec || strcmp(rec_str(rec, "run"), j->run)))
        rc = gr_seterr(GR_ESTALE, "the job's run %s was replaced while it waited for its worker "
                       "processes", j->run);
    *seen = 0;
    const cJSON *cl;
    if (!rc) cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(rec, "claims"))
        *seen += claim_alive(cl, ms, n);
    *ready = rec && rec_bool(rec, "ready");
    free(ms);
    cJSON_Delete(rec);
    return rc ? rc : *seen == j->want.ranks;
}

int tj_open(const char *spec, const tj_want *want, tj_job **out)
{
    *out = NULL;
    tj_job *j = calloc(1, sizeof *j);
    if (!j) return gr_seterr(GR_ENOMEM, "out of memory");
    j->want = *want;
    snprintf(j->mode, sizeof j->mode, "%s", want->mode);
    j->stepped = strcmp(want->mode, "async") != 0;
    j->pos = UINT64_MAX;
    pthread_mutex_init(&j->leaver_mu, NULL);
    uint64_t deadline = gr_now_ns() + (uint64_t)want->timeout_ms * 1000000u;
    int rc = tc_open_member(spec, want->timeout_ms, &j->tc);
    if (!rc) {
        /* A shard refusing our epoch with the same layout is fenced for a moment (its session
         * was suspended) or still restoring: a job of several processes does not restart its
         * run, so it waits for it longer than a lone trainer (which recovers instead). */
        tc_set_stale_patience(j->tc, 250);
        j->c = tc_coord(j->tc);
        rc = leaver_reset(j);
        gr_coord_member self;
        gr_coord_self(j->c, &self);
        snprintf(j->me, sizeof j->me, "%s", self.id);
    }
    /* A rank. */
    while (!rc) {
        int got = try_claim(j);
        if (got == 1) break;
        if (got < 0 && got != GR_EAGAIN) rc = got;
        else if (gr_now_ns() >= deadline)
            rc = gr_seterr(GR_ETIMEDOUT, "no rank of the job could be claimed within %u ms (no "
                           "run was started, or every rank of the running run is held by a live "
                           "process)", want->timeout_ms);
        else gr_sleep_ms(POLL_MS);
    }
    if (!rc) {
        gr_coord_member self;
        gr_coord_self(j->c, &self);
        self.index = (int32_t)j->rank;
        (void)gr_coord_update(j->c, &self); /* `cluster status` shows the rank */
        if (j->joining)
            fprintf(stderr, "train: rank %u of the running run %s was lost; this process (member "
                    "%s) takes it over\n", j->rank, j->run, j->me);
        else
            fprintf(stderr, "train: worker process of rank %u of %u (member %s, run %s); waiting "
                    "for the others\n", j->rank, want->ranks, j->me, j->run);
    }
    /* The barrier: every rank claimed by a live process. */
    unsigned seen = 0;
    bool ready = false;
    while (!rc) {
        int got = all_claimed(j, &seen, &ready);
        if (got == 1) break;
        if (got < 0 && got != GR_EAGAIN) rc = got;
        else if (gr_now_ns() >= deadline)
            rc = gr_seterr(GR_ETIMEDOUT, "only %u of the job's %u worker processes registered "
                           "within %u ms", seen, want->ranks, want->timeout_ms);
        else gr_sleep_ms(POLL_MS);
    }
    /* Who sets the job up: the leader, unless it is set up already; the others wait for it. A
     * leader that dies before it is done is replaced by the next, which then does it. */
    while (!rc) {
        int got = all_claimed(j, &seen, &ready);
        if (got < 0 && got != GR_EAGAIN) rc = got;
        else if (ready) break;
        else if (gr_coord_is_leader(j->c)) {
            j->initialises = true;
            break;
        } else if (gr_now_ns() >= deadline)
            rc = gr_seterr(GR_ETIMEDOUT, "the job's chief did not set the job up within %u ms",
                           want->timeout_ms);
        else gr_sleep_ms(POLL_MS);
    }
    /* A replacement in a mode with a sync job waits until the chief has reset the job (which
     * re-admits its workers) and restored the newest checkpoint for everyone. */
    if (!rc && j->joining && j->stepped && !j->initialises) rc = tj_recover_join(j, want->timeout_ms);
    if (rc) {
        tj_close(j);
        return rc;
    }
    if (j->joining)
        fprintf(stderr, "train: rank %u rejoins the running job; %s\n", j->rank,
                j->initialises ? "this one leads: it sets the job up" : "the chief has re-admitted it");
    else
        fprintf(stderr, "train: all %u worker processes are in; %s\n", want->ranks,
                j->initialises ? "this one leads: it sets the job up" : "the chief has set the job up");
    *out = j;
    return GR_OK;
}

unsigned tj_rank(const tj_job *j) { return j->rank; }
uint64_t tj_owner(const tj_job *j) { return j->owner; }
bool tj_initialises(const tj_job *j) { return j->initialises; }
bool tj_joining(const tj_job *j) { return j->joining; }
tc_job *tj_tc(tj_job *j) { return j->tc; }
bool tj_is_chief(tj_job *j)
{
    return !atomic_load(&j->ended_by_other) && gr_coord_is_leader(j->c);
}

/* Changes the value with fn until the compare-and-set holds (or fn says there is nothing to
 * do: returns false). Gives up after a few seconds of a coordinator that does not answer. */
static int rec_update(tj_job *j, bool (*fn)(tj_job *j, cJSON *rec, void *arg), void *arg)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        cJSON *rec = NULL;
        int64_t ver;
        int rc = rec_get(j, &rec, &ver);
        if (!rc && (!rec || strcmp(rec_str(rec, "run"), j->run)))
            rc = gr_seterr(GR_ESTALE, "the job's run %s is no longer the job's", j->run);
        if (!rc && !fn(j, rec, arg)) {
            cJSON_Delete(rec);
            return GR_OK;
        }
        if (!rc) rc = rec_put(j, rec, &ver);
        cJSON_Delete(rec);
        if (rc != GR_ESTALE && rc != GR_EAGAIN) return rc;
        if (rc == GR_ESTALE && strstr(gr_errmsg(), "no longer the job's")) return rc;
        gr_sleep_ms(rc == GR_EAGAIN ? 200 : 10);
    }
    return gr_seterr(GR_EAGAIN, "the job value could not be written");
}

static bool set_true(tj_job *j, cJSON *rec, void *arg)
{
    (void)j;
    const char *key = arg;
    if (rec_bool(rec, key)) return false;
    cJSON_ReplaceItemInObjectCaseSensitive(rec, key, cJSON_CreateTrue());
    return true;
}

typedef struct claim_state {
    unsigned rank;
    const char *state;
} claim_state;

static bool set_claim_state(tj_job *j, cJSON *rec, void *arg)
{
    (void)j;
    const claim_state *cs = arg;
    cJSON *cl = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "claims"), (int)cs->rank);
    if (!cJSON_IsObject(cl) || !strcmp(rec_str(cl, "state"), cs->state)) return false;
    cJSON_ReplaceItemInObjectCaseSensitive(cl, "state", cJSON_CreateString(cs->state));
    return true;
}

typedef struct saved_ckpt {
    const char *name;
    uint64_t step;
} saved_ckpt;

static bool set_ckpt(tj_job *j, cJSON *rec, void *arg)
{
    (void)j;
    const saved_ckpt *k = arg;
    if (rec_num(rec, "ckpt_step") >= (double)k->step) return false;
    cJSON_ReplaceItemInObjectCaseSensitive(rec, "ckpt_step", cJSON_CreateNumber((double)k->step));
    cJSON_ReplaceItemInObjectCaseSensitive(rec, "ckpt", cJSON_CreateString(k->name));
    return true;
}

/* ---- the chief's watch over lost processes ---- */

/* The client the chief sends leaves and clears with (made when first needed, and again after
 * a failure: the layout may have moved). */
static int leaver(tj_job *j)
{
    if (j->leaver) return GR_OK;
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = j->leaver_servers;
    cc.auth_file = j->want.auth_file;
    cc.connect_timeout_ms = 1000;
    int rc = gr_client_create(&cc, &j->leaver);
    if (!rc) tc_attach(j->tc, j->leaver);
    return rc;
}

/* After the layout healed (main thread): the next leave connects to the new addresses. */
static int leaver_reset(tj_job *j)
{
    char *copy = strdup(tc_servers(j->tc));
    if (!copy) return gr_seterr(GR_ENOMEM, "out of memory");
    pthread_mutex_lock(&j->leaver_mu);
    free(j->leaver_servers);
    j->leaver_servers = copy;
    gr_client_destroy(j->leaver);
    j->leaver = NULL;
    pthread_mutex_unlock(&j->leaver_mu);
    return GR_OK;
}

/* Rank r's workers leave the shards' sync job: steps stop waiting for them. */
static int send_leaves(tj_job *j, unsigned r)
{
    pthread_mutex_lock(&j->leaver_mu);
    int rc = leaver(j);
    for (unsigned w = 0; !rc && w < j->want.threads; w++)
        rc = gr_client_sync_leave(j->leaver, r * j->want.threads + w);
    if (rc) {
        gr_client_destroy(j->leaver);
        j->leaver = NULL;
    }
    pthread_mutex_unlock(&j->leaver_mu);
    return rc;
}

/* A process whose member is gone: its workers leave the shards' sync job, so steps stop
 * waiting for them, and its claim reads "lost". */
static void lose_rank(tj_job *j, unsigned r, const cJSON *claim)
{
    int rc = j->stepped ? send_leaves(j, r) : GR_OK;
    if (rc) {
        GR_LOGW("train: the workers of lost rank %u could not leave the sync job (tried again "
                "shortly): %s", r, gr_errmsg());
        return;
    }
    claim_state cs = {r, "lost"};
    if (rec_update(j, set_claim_state, &cs)) return;
    fprintf(stderr, "train: worker process of rank %u (member %s, pid %.0f) was lost; the job "
            "goes on without its %u worker(s)\n", r, rec_str(claim, "member"),
            rec_num(claim, "pid"), j->want.threads);
}

/* A replacement took over rank r in a mode with a sync job. The shards have no way to take a
 * worker back into a job it left but a reset, and a reset under running steps would mix two
 * runs: so the chief clears the sync job, every process's steps fail (GR_ESHUTDOWN) and the
 * whole job recovers (tj_recover_join), the reset re-admitting the rank's workers. */
static void admit_rank(tj_job *j, unsigned r, const cJSON *claim)
{
    gr_client_sync_config sc;
    memset(&sc, 0, sizeof sc);
    gr_client_sync_owner ow = {j->owner, 0, ""};
    pthread_mutex_lock(&j->leaver_mu);
    int rc = leaver(j);
    if (!rc) rc = gr_client_sync_configure_owned(j->leaver, &sc, &ow,
                                                 GR_CLIENT_SYNC_CLEAR | GR_CLIENT_SYNC_LIVE, NULL);
    if (rc) {
        gr_client_destroy(j->leaver);
        j->leaver = NULL;
    }
    pthread_mutex_unlock(&j->leaver_mu);
    if (rc) {
        GR_LOGW("train: could not stop the sync job to re-admit rank %u (tried again shortly): %s",
                r, gr_errmsg());
        return;
    }
    snprintf(j->admitted, sizeof j->admitted, "%s", rec_str(claim, "member"));
    fprintf(stderr, "train: process %s (pid %.0f) takes over rank %u; the job returns to its "
            "newest checkpoint to take its workers in again\n", rec_str(claim, "member"),
            rec_num(claim, "pid"), r);
}

static void watch_once(tj_job *j)
{
    if (!gr_coord_is_leader(j->c)) {
        j->was_chief = false;
        return;
    }
    cJSON *rec;
    gr_coord_member *ms;
    size_t n;
    if (!view_get(j, &rec, &ms, &n)) return;
    /* The chief that finished the run leaves the election when it exits: the process that
     * inherits the lead of a done run leads nothing, and does not say it does. */
    if (rec_bool(rec, "done") || strcmp(rec_str(rec, "run"), j->run)) {
        view_free(rec, ms);
        return;
    }
    if (!j->was_chief) fprintf(stderr, "train: this process (rank %u) is the job's chief\n", j->rank);
    j->was_chief = true;
    const cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
    for (int r = 0; r < cJSON_GetArraySize(claims); r++) {
        const cJSON *cl = cJSON_GetArrayItem(claims, r);
        if ((unsigned)r == j->rank || !cJSON_IsObject(cl) || !strcmp(rec_str(cl, "state"), "lost"))
            continue;
        /* A finished process's workers left already; one that exits after the job is done
         * is not lost either. */
        if (!claim_alive(cl, ms, n) && strcmp(rec_str(cl, "state"), "finished"))
            lose_rank(j, (unsigned)r, cl);
        else if (j->stepped && rec_bool(cl, "joining") && claim_alive(cl, ms, n) &&
                 strcmp(rec_str(cl, "member"), j->admitted))
            admit_rank(j, (unsigned)r, cl);
    }
    view_free(rec, ms);
}

static void *watch_main(void *arg)
{
    tj_job *j = arg;
    while (!atomic_load(&j->stop)) {
        watch_once(j);
        for (int t = 0; t < WATCH_MS / 50 && !atomic_load(&j->stop); t++) gr_sleep_ms(50);
    }
    return NULL;
}

/* ---- the trainer's hooks ---- */

static bool hook_is_chief(void *ctx)
{
    tj_job *j = ctx;
    /* A run leaving its wait for a recovery saves no final checkpoint. */
    return !atomic_load(&j->must_recover) && tj_is_chief(j);
}

/* The set-up is done: ready, the recovery generation restored (the leader's), and this
 * process's claim running again. */
static bool set_started(tj_job *j, cJSON *rec, void *arg)
{
    (void)arg;
    bool changed = false;
    if (j->initialises) {
        changed |= !rec_bool(rec, "ready");
        obj_set(rec, "ready", cJSON_CreateTrue());
        cJSON *r = cJSON_GetObjectItemCaseSensitive(rec, "recovery");
        if (r && (uint64_t)rec_num(r, "gen") == j->gen && !rec_bool(r, "restored")) {
            obj_set(r, "restored", cJSON_CreateTrue());
            changed = true;
        }
    }
    cJSON *cl = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "claims"), (int)j->rank);
    if (cJSON_IsObject(cl) && (rec_bool(cl, "recovering") || rec_bool(cl, "joining"))) {
        obj_set(cl, "recovering", cJSON_CreateFalse());
        obj_set(cl, "joining", cJSON_CreateFalse());
        changed = true;
    }
    return changed;
}

static int hook_started(void *ctx)
{
    tj_job *j = ctx;
    /* The rank's own position served the replacement's first run (it was applied before this
     * hook); a later recovery returns it to the checkpoint's with everyone. */
    j->pos = UINT64_MAX;
    if (j->initialises && j->stepped) {
        /* A restore reset the sync job, which takes every worker in again: the workers of
         * ranks that finished or are gone leave it again before anyone steps. */
        cJSON *rec = NULL;
        int64_t ver;
        gr_coord_member *ms = NULL;
        size_t n = 0;
        int rc = rec_get(j, &rec, &ver);
        if (!rc && rec) rc = gr_coord_members(j->c, &ms, &n);
        const cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
        for (int r = 0; !rc && r < cJSON_GetArraySize(claims); r++) {
            const cJSON *cl = cJSON_GetArrayItem(claims, r);
            if ((unsigned)r != j->rank && cJSON_IsObject(cl) &&
                (!claim_alive(cl, ms, n) || !strcmp(rec_str(cl, "state"), "finished")))
                rc = send_leaves(j, (unsigned)r);
        }
        free(ms);
        cJSON_Delete(rec);
        if (rc) return gr_seterr(rc, "could not make the workers of finished or lost ranks leave "
                                 "the reset sync job: %s", gr_errmsg());
    }
    int rc = rec_update(j, set_started, NULL);
    if (rc) return gr_seterr(rc, "could not tell the job's processes it is set up: %s", gr_errmsg());
    return GR_OK;
}

/* While this process waits for the others: whether the job recovers, so its run must end and
 * run again through the recovery. The leader: another live process stopped for one (a mode
 * with a sync job, or rollback: the leader sets the job up again). Any other process, under
 * rollback: the leader started a recovery it has not restored yet (everyone returns to the
 * checkpoint, finished or not). */
static bool recovery_pending(tj_job *j, const cJSON *rec, const gr_coord_member *ms, size_t n)
{
    bool restored;
    uint64_t gen = rec_gen(rec, &restored);
    if (!gr_coord_is_leader(j->c)) return j->want.rollback && gen > j->gen && !restored;
    if (!j->stepped && !j->want.rollback) return false;
    const cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
    for (int r = 0; r < cJSON_GetArraySize(claims); r++) {
        const cJSON *cl = cJSON_GetArrayItem(claims, r);
        if ((unsigned)r != j->rank && rec_bool(cl, "recovering") && claim_alive(cl, ms, n))
            return true;
    }
    return false;
}

/* Whether every other rank is finished or gone; *done: the run is done. */
static bool others_done(tj_job *j, bool *done)
{
    cJSON *rec;
    gr_coord_member *ms;
    size_t n;
    *done = false;
    if (!view_get(j, &rec, &ms, &n)) return false;
    *done = rec_bool(rec, "done") || strcmp(rec_str(rec, "run"), j->run);
    if (!*done && recovery_pending(j, rec, ms, n)) atomic_store(&j->must_recover, true);
    bool all = true;
    const cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
    for (int r = 0; r < cJSON_GetArraySize(claims) && all; r++) {
        const cJSON *cl = cJSON_GetArrayItem(claims, r);
        if ((unsigned)r == j->rank || !cJSON_IsObject(cl)) continue;
        all = !claim_alive(cl, ms, n) || !strcmp(rec_str(cl, "state"), "finished");
    }
    view_free(rec, ms);
    return all;
}

static void hook_wait_others(void *ctx)
{
    tj_job *j = ctx;
    claim_state cs = {j->rank, "finished"};
    if (rec_update(j, set_claim_state, &cs))
        GR_LOGW("train: could not mark rank %u finished: %s", j->rank, gr_errmsg());
    bool said = false;
    for (;;) {
        bool done = false, all = others_done(j, &done);
        if (atomic_load(&j->must_recover)) {
            fprintf(stderr, "train: rank %u was done with its data, but the job recovers: it runs "
                    "again from the job's checkpoint\n", j->rank);
            break;
        }
        /* The chief waits for the others' data; the others wait for the chief's final
         * checkpoint, unless they lead by now (then the final checkpoint is theirs). */
        if (done) {
            /* Its chief may have exited already, making this process the leader: it must not
             * save the final checkpoint (or write the job's metrics) a second time. */
            atomic_store(&j->ended_by_other, true);
            break;
        }
        if (all && gr_coord_is_leader(j->c)) break;
        if (!said) {
            fprintf(stderr, "train: rank %u is done with its data; waiting for the job's other "
                    "worker processes\n", j->rank);
            said = true;
        }
        gr_sleep_ms(POLL_MS * 2);
    }
}

static uint64_t hook_last_step(void *ctx)
{
    tj_job *j = ctx;
    cJSON *rec = NULL;
    int64_t ver;
    uint64_t step = 0;
    if (!rec_get(j, &rec, &ver) && rec) step = (uint64_t)rec_num(rec, "ckpt_step");
    cJSON_Delete(rec);
    return step;
}

/* Sync and hybrid checkpoint at a step every live running rank has reached (the steps are in
 * lock-step): that is each such rank's data position, kept in its claim for a replacement. A
 * lost rank keeps the position of the last checkpoint it was alive for. */
static void record_positions(tj_job *j, uint64_t step)
{
    if (strcmp(j->mode, "sync") && strcmp(j->mode, "hybrid")) return;
    for (int attempt = 0; attempt < 20; attempt++) {
        cJSON *rec = NULL;
        int64_t ver;
        gr_coord_member *ms = NULL;
        size_t n = 0;
        int rc = rec_get(j, &rec, &ver);
        if (!rc && rec) rc = gr_coord_members(j->c, &ms, &n);
        if (!rc && rec && !strcmp(rec_str(rec, "run"), j->run)) {
            cJSON *cl;
            cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(rec, "claims"))
                if (claim_alive(cl, ms, n) && !strcmp(rec_str(cl, "state"), "running") &&
                    !rec_bool(cl, "recovering"))
                    obj_set(cl, "pos", cJSON_CreateNumber((double)step));
            rc = rec_put(j, rec, &ver);
        }
        free(ms);
        cJSON_Delete(rec);
        if (rc != GR_ESTALE) return;
    }
}

static void hook_saved(void *ctx, const char *name, uint64_t step)
{
    saved_ckpt k = {name, step};
    if (rec_update(ctx, set_ckpt, &k))
        GR_LOGW("train: could not record checkpoint %s in the job: %s", name, gr_errmsg());
    record_positions(ctx, step);
}

static uint64_t hook_position(void *ctx, unsigned worker, uint64_t from_ckpt)
{
    (void)worker;
    tj_job *j = ctx;
    /* The replacement's first run only (hook_started forgets it). */
    if (!j->joining || j->pos == UINT64_MAX) return from_ckpt;
    fprintf(stderr, "train: rank %u resumes at its own data position, batch %llu (the "
            "checkpoint's is %llu)\n", j->rank, (unsigned long long)j->pos,
            (unsigned long long)from_ckpt);
    return j->pos;
}

const gr_train_job *tj_train_hooks(tj_job *j)
{
    j->hooks = (gr_train_job){.ranks = j->want.ranks, .rank = j->rank, .ctx = j,
                              .is_chief = hook_is_chief, .started = hook_started,
                              .wait_others = hook_wait_others, .last_ckpt_step = hook_last_step,
                              .saved = hook_saved, .position = hook_position};
    if (!j->watching && pthread_create(&j->watcher, NULL, watch_main, j) == 0) j->watching = true;
    return &j->hooks;
}

/* ---- recovery inside the job ---- */

static bool set_recovering(tj_job *j, cJSON *rec, void *arg)
{
    (void)arg;
    cJSON *cl = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "claims"), (int)j->rank);
    if (!cJSON_IsObject(cl) || strcmp(rec_str(cl, "member"), j->me)) return false;
    obj_set(cl, "recovering", cJSON_CreateTrue());
    obj_set(cl, "state", cJSON_CreateString("running")); /* a finished rank runs again */
    return true;
}

void tj_recover_mark(tj_job *j)
{
    if (rec_update(j, set_recovering, NULL))
        GR_LOGW("train: could not mark rank %u recovering in the job: %s", j->rank, gr_errmsg());
}

/* The leader's: adopt the generation a former leader started and did not restore, or start
 * the next one. */
static bool begin_gen(tj_job *j, cJSON *rec, void *arg)
{
    (void)arg;
    bool restored;
    uint64_t gen = rec_gen(rec, &restored);
    if (!restored && gen > j->gen) {
        j->gen = gen;
        return false;
    }
    j->gen = (gen > j->gen ? gen : j->gen) + 1;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "gen", (double)j->gen);
    cJSON_AddBoolToObject(r, "restored", false);
    obj_set(rec, "recovery", r);
    return true;
}

/* Every other live process that must stop has: a rank still running (or, under rollback, one
 * that finished and must run again) has marked itself recovering. *late: the first that has
 * not. */
static bool others_stopped(tj_job *j, unsigned *late)
{
    cJSON *rec;
    gr_coord_member *ms;
    size_t n;
    if (!view_get(j, &rec, &ms, &n)) return false;
    bool all = true;
    const cJSON *claims = cJSON_GetObjectItemCaseSensitive(rec, "claims");
    for (int r = 0; r < cJSON_GetArraySize(claims) && all; r++) {
        const cJSON *cl = cJSON_GetArrayItem(claims, r);
        if ((unsigned)r == j->rank || !claim_alive(cl, ms, n) || !strcmp(rec_str(cl, "state"), "lost"))
            continue;
        if (!j->want.rollback && !strcmp(rec_str(cl, "state"), "finished")) continue;
        if (!rec_bool(cl, "recovering")) {
            all = false;
            *late = (unsigned)r;
        }
    }
    view_free(rec, ms);
    return all;
}

static int lead_recovery(tj_job *j, uint64_t deadline)
{
    j->initialises = true;
    int rc = rec_update(j, begin_gen, NULL);
    if (rc) return gr_seterr(rc, "could not start the job's recovery: %s", gr_errmsg());
    fprintf(stderr, "train: rank %u leads the job's recovery %llu (%s)\n", j->rank,
            (unsigned long long)j->gen, j->want.rollback ? "rollback" : "partial");
    /* With no sync job and no rows to restore (async, partial) nobody needs to stop. */
    if (!j->stepped && !j->want.rollback) return GR_OK;
    unsigned late = 0;
    while (!others_stopped(j, &late)) {
        if (gr_now_ns() >= deadline) {
            fprintf(stderr, "train: rank %u did not stop for the recovery in time; the job is set "
                    "up again without waiting for it\n", late);
            break;
        }
        gr_sleep_ms(POLL_MS);
    }
    return GR_OK;
}

int tj_recover_join(tj_job *j, uint32_t timeout_ms)
{
    atomic_store(&j->must_recover, false);
    int rc = leaver_reset(j);
    if (rc) return rc;
    uint64_t deadline = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        if (gr_coord_is_leader(j->c)) return lead_recovery(j, deadline);
        j->initialises = false;
        /* Async, partial: the shards keep their rows and there is no sync job to reset. */
        if (!j->stepped && !j->want.rollback) return GR_OK;
        cJSON *rec = NULL;
        int64_t ver;
        bool restored = false;
        uint64_t gen = 0;
        rc = rec_get(j, &rec, &ver);
        if (!rc && rec) gen = rec_gen(rec, &restored);
        if (!rc && (!rec || strcmp(rec_str(rec, "run"), j->run)))
            rc = gr_seterr(GR_ESTALE, "the job's run %s ended while this process recovered", j->run);
        cJSON_Delete(rec);
        if (rc) return rc;
        if (gen > j->gen && restored) {
            j->gen = gen;
            return GR_OK;
        }
        if (gr_now_ns() >= deadline)
            return gr_seterr(GR_ETIMEDOUT, "the job's chief did not set the job up again within "
                             "%u ms", timeout_ms);
        gr_sleep_ms(POLL_MS);
    }
}

bool tj_must_recover(tj_job *j) { return atomic_exchange(&j->must_recover, false); }

bool tj_recovering(tj_job *j)
{
    cJSON *rec = NULL;
    int64_t ver;
    if (rec_get(j, &rec, &ver) || !rec || strcmp(rec_str(rec, "run"), j->run)) {
        cJSON_Delete(rec);
        return false;
    }
    bool restored;
    (void)rec_gen(rec, &restored);
    bool on = !restored;
    const cJSON *cl;
    cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(rec, "claims"))
        on = on || rec_bool(cl, "recovering") || rec_bool(cl, "joining");
    cJSON_Delete(rec);
    return on;
}

void tj_done(tj_job *j)
{
    if (rec_update(j, set_true, "done"))
        GR_LOGW("train: could not mark the job's run done: %s", gr_errmsg());
}

void tj_close(tj_job *j)
{
    if (!j) return;
    atomic_store(&j->stop, true);
    if (j->watching) pthread_join(j->watcher, NULL);
    gr_client_destroy(j->leaver);
    free(j->leaver_servers);
    pthread_mutex_destroy(&j->leaver_mu);
    tc_close(j->tc);
    free(j);
}
