/* Checkpoint coordination in training: the fetch-stage gate, the coordinator's turn, the
 * trainer's position (JSON beside the manifest) and resume. */
#include "train/trainer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Where checkpoints pause a worker: its fetch stage, before it takes the next step's token
 * (after = false) and, in the pause modes, again once it holds the token (after = true). A
 * parked worker's earlier items still go through compute and push, so when every worker is
 * parked (or finished) and drained, nothing is in flight and the coordinator saves. Sync mode
 * parks every worker before the token of the same step, so the shards are exactly at that
 * step's boundary; a worker blocked taking a token counts as quiet in the pause modes (a token
 * changes nothing on the shards) and, should the token come during the save, waits after it. */
/* A count that moves by one when a checkpoint pause starts and by one when it ends (odd while
 * one is on), so a step token that timed out can tell whether the others stood paused. */
uint64_t tr_ck_pauses(trainer *tr)
{
    pthread_mutex_lock(&tr->mu);
    uint64_t n = 2 * tr->ck.npause + (tr->ck.pause ? 1 : 0);
    pthread_mutex_unlock(&tr->mu);
    return n;
}

int tr_ck_gate(tr_worker *w, bool after)
{
    trainer *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    for (;;) {
        bool park = !tr->ck.chief ? false
                  : after ? !tr->ck.rounds && tr->ck.pause
                          : tr->ck.rounds ? tr->ck.target && w->base + w->fetched == tr->ck.target
                                          : tr->ck.pause;
        if (!park || tr->err) break;
        w->gate = after ? TR_GATE_HELD : TR_GATE_PARKED;
        pthread_cond_broadcast(&tr->cv);
        pthread_cond_wait(&tr->cv, &tr->mu);
    }
    if (!after) w->fetched++;
    w->gate = !after && tr->stepped ? TR_GATE_ACQUIRING : TR_GATE_RUN;
    int rc = tr->err ? gr_seterr(GR_ESHUTDOWN, "training stopped") : GR_OK;
    pthread_mutex_unlock(&tr->mu);
    return rc;
}

/* Batches pushed by all workers, before the resume included. Under mu. */
uint64_t tr_total_pushed(const trainer *tr)
{
    uint64_t t = tr->base_total;
    for (unsigned i = 0; i < tr->o->workers; i++) t += tr->workers[i].steps;
    return t;
}

/* True when every worker is finished or parked where the pause wants it, with nothing in
 * flight; *any when at least one is parked (not all finished). Under mu. */
static bool ck_quiet(const trainer *tr, bool *any)
{
    *any = false;
    for (unsigned i = 0; i < tr->o->workers; i++) {
        const tr_worker *w = &tr->workers[i];
        if (w->finished) continue;
        bool ok;
        if (tr->ck.rounds)
            ok = w->gate == TR_GATE_PARKED && w->base + w->fetched == tr->ck.target &&
                 w->steps == w->fetched;
        else
            ok = (w->gate == TR_GATE_PARKED && w->steps == w->fetched) ||
                 ((w->gate == TR_GATE_ACQUIRING || w->gate == TR_GATE_HELD) && w->steps + 1 == w->fetched);
        if (!ok) return false;
        *any = true;
    }
    return true;
}

static const char *data_name(const trainer *tr) { return tr->data.shared ? "shared" : "static"; }

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The trainer's position as JSON, stored beside the checkpoint's manifest (user.json): what a
 * resumed run needs to continue exactly where this one is. Under mu. */
static char *ck_meta(const trainer *tr, uint64_t step)
{
    const gr_train_opts *o = tr->o;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "format", "granary-train");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddStringToObject(j, "mode", gr_train_mode_name(o->mode));
    cJSON_AddNumberToObject(j, "workers", o->workers);
    /* A multi-process job: its processes (each with `workers` threads, each reading its own
     * ranges) and the rank of the chief whose workers' steps follow. */
    if (o->job && o->job->ranks > 1) {
        cJSON_AddNumberToObject(j, "job_ranks", o->job->ranks);
        cJSON_AddNumberToObject(j, "rank", o->job->rank);
    }
    cJSON_AddNumberToObject(j, "batch", (double)o->batch);
    cJSON_AddNumberToObject(j, "epochs", o->epochs);
    cJSON_AddStringToObject(j, "data", data_name(tr));
    cJSON_AddNumberToObject(j, "train_bytes", (double)file_size(o->train_path));
    cJSON_AddNumberToObject(j, "examples", (double)(tr->base_examples + tr->examples));
    cJSON_AddNumberToObject(j, "batches", (double)tr_total_pushed(tr));
    /* The files' layout: evaluation and serving rebuild the same feature ids from it. */
    char *schema = gr_schema_to_json(tr->schema);
    cJSON *sj = schema ? cJSON_Parse(schema) : NULL;
    free(schema);
    if (!sj || !cJSON_AddItemToObject(j, "schema", sj)) {
        cJSON_Delete(sj);
        cJSON_Delete(j);
        return NULL;
    }
    /* What the checkpoint is a model of: a saved-model loader rebuilds it from this. */
    cJSON *model = tr_model_meta(tr->m, &o->emb);
    if (model) cJSON_AddItemToObject(j, "model", model);
    cJSON *ws = cJSON_AddArrayToObject(j, "worker_steps");
    for (unsigned i = 0; i < o->workers; i++)
        cJSON_AddItemToArray(ws, cJSON_CreateNumber((double)(tr->workers[i].base + tr->workers[i].steps)));
    if (tr->data.shared) {
        /* Per chunk (counter value over epochs): -1 done, else batches pushed. A chunk is done
         * when the worker that took it has pushed from a later chunk (it reads its chunks in
         * order, and its items are pushed in order). */
        cJSON *ch = cJSON_AddObjectToObject(j, "chunks");
        cJSON_AddNumberToObject(ch, "count", tr->data.nchunks);
        /* Chunks of whole batches (absent: cut at byte offsets, as before this field). */
        if (tr->data.by_batch) cJSON_AddStringToObject(ch, "cut", "batch");
        cJSON *pr = cJSON_AddArrayToObject(ch, "progress");
        uint64_t last = 0;
        for (uint64_t c = 0; c < tr->data.nchunk_total; c++)
            if (tr->data.chunk_done[c] || tr->data.chunk_owner[c] >= 0 || tr->data.chunk_pushed[c]) last = c + 1;
        for (uint64_t c = 0; c < last; c++) {
            int32_t ow = tr->data.chunk_owner[c];
            bool done = tr->data.chunk_done[c] ||
                        (ow >= 0 && tr->workers[ow].cur_chunk != UINT64_MAX &&
                         c < tr->workers[ow].cur_chunk);
            cJSON_AddItemToArray(pr, cJSON_CreateNumber(done ? -1.0 : (double)tr->data.chunk_pushed[c]));
        }
    }
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return txt;
}

/* Saves checkpoint `step` (every worker is parked or finished). A failure is reported and
 * training goes on; the shards make the next one full. Returns the save's error (its message
 * in gr_errmsg()). */
static int ck_save(trainer *tr, uint64_t step)
{
    const gr_train_opts *o = tr->o;
    /* A new chief numbers its checkpoints above the job's newest, so the newest checkpoint is
     * the one with the highest step whoever wrote it. */
    if (o->job && o->job->last_ckpt_step) {
        uint64_t last = o->job->last_ckpt_step(o->job->ctx);
        if (step <= last) step = last + 1;
    }
    pthread_mutex_lock(&tr->mu);
    char *meta = ck_meta(tr, step);
    uint64_t total = tr_total_pushed(tr);
    gr_train_ckpt k;
    memset(&k, 0, sizeof k);
    k.root = o->ckpt_dir;
    k.step = step;
    k.parent = tr->ck.parent[0] ? tr->ck.parent : NULL;
    k.incremental = o->ckpt_incremental;
    k.full_every = o->ckpt_full_every;
    k.keep = o->ckpt_keep;
    k.zstd_level = o->ckpt_zstd;
    k.same_step = tr->ck.rounds;
    k.meta = meta;
    pthread_mutex_unlock(&tr->mu);
    double t0 = gr_now_s();
    int rc = meta ? tr->be->ckpt_save(tr->be->ctx, &k)
                  : gr_seterr(GR_ENOMEM, "out of memory for the checkpoint's metadata");
    double secs = gr_now_s() - t0;
    free(meta);
    pthread_mutex_lock(&tr->mu);
    gr_train_result *res = tr->res;
    res->ckpt_seconds += secs;
    tr_metrics_ckpt(tr, secs);
    if (rc) {
        res->ckpt_failures++;
        tr->ck.parent[0] = '\0';
        GR_LOGW("train: checkpoint of step %llu failed (training goes on; the next one is full): "
                "%s", (unsigned long long)step, gr_errmsg());
    } else {
        res->ckpt_saves++;
        snprintf(tr->ck.parent, sizeof tr->ck.parent, "%s", k.name);
        snprintf(res->ckpt_last, sizeof res->ckpt_last, "%s", k.name);
        if (o->progress_s > 0)
            fprintf(stderr, "train: checkpoint %s/%s (%s, %llu rows, %.1f MB, %.2f s)\n",
                    o->ckpt_dir, k.name, k.delta ? "delta" : "full", (unsigned long long)k.rows,
                    (double)k.bytes / 1e6, secs);
    }
    tr->ck.saved_total = total;
    tr->ck.last_failed = rc != GR_OK;
    pthread_mutex_unlock(&tr->mu);
    /* The job records it (a coordinator round trip: not under mu). */
    if (!rc && o->job && o->job->saved) o->job->saved(o->job->ctx, k.name, step);
    return rc;
}

/* The most steps any of this process's workers has begun (base + fetched). Under mu. */
static uint64_t most_fetched(const trainer *tr)
{
    uint64_t m = 0;
    for (unsigned i = 0; i < tr->o->workers; i++)
        if (tr->workers[i].base + tr->workers[i].fetched > m)
            m = tr->workers[i].base + tr->workers[i].fetched;
    return m;
}

/* A multi-process job: follows who leads it. A process that just became chief plans its first
 * checkpoint past where its workers are (they never parked for the old chief's); one that
 * stopped leading lets parked workers go. Under mu. */
static void ck_follow_chief(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    bool chief = !o->job || !o->job->is_chief || o->job->is_chief(o->job->ctx);
    if (chief == tr->ck.chief) return;
    tr->ck.chief = chief;
    if (chief && o->ckpt_every) {
        tr->ck.target = tr->ck.rounds ? (most_fetched(tr) / o->ckpt_every + 1) * o->ckpt_every : 0;
        tr->ck.next_total = tr_total_pushed(tr) + o->ckpt_every * o->workers;
        fprintf(stderr, "train: this process leads the job now: it saves the checkpoints\n");
    }
    if (!chief) tr->ck.pause = false;
    pthread_cond_broadcast(&tr->cv);
}

/* The coordinator's turn (the run's main thread, holding mu): start a pause when one is due,
 * and save once every worker is quiet. Returns true when it saved. */
bool tr_ck_turn(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    if (!tr->ck.on || tr->err) return false;
    ck_follow_chief(tr);
    if (!tr->ck.chief) return false;
    if (!tr->ck.rounds && !tr->ck.pause && o->ckpt_every &&
        tr_total_pushed(tr) >= tr->ck.next_total) {
        tr->ck.pause = true;
        pthread_cond_broadcast(&tr->cv);
    }
    bool due = tr->ck.rounds ? tr->ck.target != 0 : tr->ck.pause, any = false;
    if (!due || !ck_quiet(tr, &any) || !any) return false;
    uint64_t step = tr->ck.rounds ? tr->ck.target : tr_total_pushed(tr);
    pthread_mutex_unlock(&tr->mu);
    ck_save(tr, step);
    pthread_mutex_lock(&tr->mu);
    tr->ck.npause++;
    if (tr->ck.rounds) {
        tr->ck.target += o->ckpt_every;
    } else {
        tr->ck.pause = false;
        tr->ck.next_total = tr_total_pushed(tr) + o->ckpt_every * o->workers;
    }
    pthread_cond_broadcast(&tr->cv);
    return true;
}

/* The same directory as far as the text says ("a/b/" is "a/b"). */
static bool same_path(const char *a, const char *b)
{
    if (!a || !b) return false;
    size_t la = strlen(a), lb = strlen(b);
    while (la > 1 && a[la - 1] == '/') la--;
    while (lb > 1 && b[lb - 1] == '/') lb--;
    return la == lb && !strncmp(a, b, la);
}

static uint64_t json_u64(const cJSON *o, const char *k, bool *ok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0) {
        *ok = false;
        return 0;
    }
    return (uint64_t)v->valuedouble;
}

/* Restores the checkpoint to resume from and checks that its position fits this run.
 * *meta gets the position (NULL when there was nothing to resume). Sets tr->data.nchunks for shared
 * data (the checkpoint's chunking, so the worker count may change). */
int tr_ck_restore(trainer *tr, cJSON **meta)
{
    const gr_train_opts *o = tr->o;
    gr_train_backend *be = tr->be;
    *meta = NULL;
    gr_train_ckpt ld;
    memset(&ld, 0, sizeof ld);
    int rc = be->ckpt_load(be->ctx, o->resume, NULL, &ld);
    /* A root that does not exist is a mistyped path, unless this run also writes its
     * checkpoints there (one command that starts a job and restarts it). The shards say which
     * ENOENT it is only in the message ("no such checkpoint root", or "... directory" for a
     * checkpoint path), as it travels over the wire. */
    if (rc == GR_ENOENT && (strstr(gr_errmsg(), "no such checkpoint root") ||
                            strstr(gr_errmsg(), "no such checkpoint directory")) &&
        !same_path(o->resume, o->ckpt_dir))
        return gr_seterr(GR_ENOENT, "--resume %s: no such checkpoint root or checkpoint (%s); "
                         "to start a job that later resumes from there, give the same directory "
                         "as --ckpt-dir", o->resume, gr_errmsg());
    if (rc == GR_ENOENT) {
        fprintf(stderr, "train: nothing to resume under %s (%s): starting from scratch\n",
                o->resume, gr_errmsg());
        return GR_OK;
    }
    if (rc == GR_EDIM)
        return gr_seterr(rc, "%s (was it trained with another --schema or model shape?)",
                         gr_errmsg());
    if (rc) return rc;
    cJSON *j = ld.meta ? cJSON_Parse(ld.meta) : NULL;
    free(ld.meta);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "granary-train")) {
        cJSON_Delete(j);
        return gr_seterr(GR_EINVAL, "%s: checkpoint %s holds no training position (user.json): it "
                         "was not written by granary train", o->resume, ld.name);
    }
    bool ok = true;
    uint64_t workers = json_u64(j, "workers", &ok), batch = json_u64(j, "batch", &ok);
    uint64_t bytes = json_u64(j, "train_bytes", &ok);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "worker_steps");
    if (!ok || !cJSON_IsString(data) || !cJSON_IsArray(ws) ||
        (uint64_t)cJSON_GetArraySize(ws) != workers) {
        cJSON_Delete(j);
        return gr_seterr(GR_ECORRUPT, "%s: the training position in %s is malformed", o->resume,
                         ld.name);
    }
    rc = GR_OK;
    /* A checkpoint from before schemas read Criteo. */
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(j, "schema");
    gr_schema *was = NULL;
    if (sch) {
        char *txt = cJSON_PrintUnformatted(sch);
        rc = txt ? gr_schema_parse(txt, strlen(txt), &was) : gr_seterr(GR_ENOMEM, "out of memory");
        free(txt);
        if (rc) rc = gr_seterr(GR_ECORRUPT, "%s: the schema in its training position: %s", ld.name,
                               gr_errmsg());
    }
    if (!rc && !gr_schema_equal(was ? was : gr_schema_criteo(), tr->schema))
        rc = gr_seterr(GR_EINVAL, "%s was trained on files read with %s schema than this run's "
                       "(give --schema with the one it was trained with)", ld.name,
                       was && !gr_schema_is_criteo(was) ? "another" : "the Criteo");
    gr_schema_destroy(was);
    if (rc) {
        cJSON_Delete(j);
        return rc;
    }
    /* Static ranges are cut by the job's worker index: the same processes, the same ranges. */
    uint64_t ranks_was = cJSON_HasObjectItem(j, "job_ranks") ? json_u64(j, "job_ranks", &ok) : 1;
    if (strcmp(data->valuestring, data_name(tr)))
        rc = gr_seterr(GR_EINVAL, "%s was written with %s data assignment, this run has %s "
                       "(--data %s to resume it)", ld.name, data->valuestring, data_name(tr),
                       data->valuestring);
    else if (batch != o->batch)
        rc = gr_seterr(GR_EINVAL, "%s was written with batch %llu, this run has %zu: the data "
                       "position is counted in batches", ld.name, (unsigned long long)batch, o->batch);
    else if (!tr->data.shared && ranks_was != (o->job ? o->job->ranks : 1u))
        rc = gr_seterr(GR_EINVAL, "%s was written by a job of %llu worker processes, this run has "
                       "%u: the data ranges would differ", ld.name, (unsigned long long)ranks_was,
                       o->job ? o->job->ranks : 1u);
    else if (!tr->data.shared && workers != o->workers)
        rc = gr_seterr(GR_EINVAL, "%s was written by %llu workers with static data ranges, this "
                       "run has %u: the ranges would differ", ld.name, (unsigned long long)workers,
                       o->workers);
    else if (bytes != file_size(o->train_path))
        rc = gr_seterr(GR_EINVAL, "%s was trained on a %llu-byte file, %s has %llu bytes",
                       ld.name, (unsigned long long)bytes, o->train_path,
                       (unsigned long long)file_size(o->train_path));
    if (!rc && tr->data.shared) {
        const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "chunks");
        uint64_t n = json_u64(ch, "count", &ok);
        if (!ok || n == 0 || n > (1u << 20))
            rc = gr_seterr(GR_ECORRUPT, "%s: bad chunk count in the training position", ld.name);
        else
            tr->data.nchunks = (unsigned)n;
        /* A checkpoint from before chunks held whole batches resumes with its byte chunks. */
        const cJSON *cut = cJSON_GetObjectItemCaseSensitive(ch, "cut");
        tr->data.by_batch = cJSON_IsString(cut) && !strcmp(cut->valuestring, "batch");
    }
    if (rc) {
        cJSON_Delete(j);
        return rc;
    }
    tr->res->resumed_step = ld.step;
    snprintf(tr->res->resumed_from, sizeof tr->res->resumed_from, "%s", ld.name);
    if (o->progress_s > 0)
        fprintf(stderr, "train: resumed from %s/%s (step %llu, %llu rows loaded in %.2f s)\n",
                o->resume, ld.name, (unsigned long long)ld.step, (unsigned long long)ld.rows,
                ld.seconds);
    *meta = j;
    return GR_OK;
}

/* Applies a restored position to the workers (after tr_worker_init) and the chunk table. */
int tr_ck_apply(trainer *tr, const cJSON *j)
{
    const gr_train_opts *o = tr->o;
    bool ok = true;
    tr->base_examples = json_u64(j, "examples", &ok);
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "worker_steps");
    uint64_t sum = 0;
    unsigned i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ws)
    {
        uint64_t v = cJSON_IsNumber(it) && it->valuedouble >= 0 ? (uint64_t)it->valuedouble : 0;
        sum += v;
        /* Static data: worker i continues its own range. Shared data with the same worker
         * count: the step counts carry over (for max_steps); with another count they cannot. */
        if (i < o->workers && (!tr->data.shared || cJSON_GetArraySize(ws) == (int)o->workers)) {
            if (!tr->data.shared && o->job && o->job->position)
                v = o->job->position(o->job->ctx, i, v);
            tr->workers[i].base = v;
            if (!tr->data.shared) tr->workers[i].skip = v;
        }
        i++;
    }
    tr->base_total = sum;
    if (tr->data.shared) {
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "chunks"),
                                                          "progress");
        uint64_t c = 0;
        cJSON_ArrayForEach(it, pr)
        {
            if (c >= tr->data.nchunk_total) break;
            double v = cJSON_GetNumberValue(it);
            if (v < 0) tr->data.chunk_done[c] = 1;
            else if (v > 0) tr->data.chunk_pushed[c] = (uint64_t)v;
            c++;
        }
    }
    return ok ? GR_OK : gr_seterr(GR_ECORRUPT, "the training position's example count is malformed");
}

void tr_ck_setup(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    if (!tr->ck.on) return;
    /* Sync and hybrid pause every worker before the same step; the other modes pause all
     * workers wherever they are once enough batches were pushed. */
    tr->ck.rounds = (o->mode == GR_MODE_SYNC || o->mode == GR_MODE_HYBRID) && tr->stepped;
    uint64_t from = tr->res->resumed_step;
    tr->ck.target = tr->ck.rounds && o->ckpt_every ? (from / o->ckpt_every + 1) * o->ckpt_every : 0;
    tr->ck.next_total = tr->base_total + o->ckpt_every * o->workers;
    tr->ck.saved_total = tr->base_total;
    tr->ck.chief = !o->job || !o->job->is_chief || o->job->is_chief(o->job->ctx);
}

void tr_ck_finish(trainer *tr)
{
    /* The last periodic checkpoint already holds the final state, unless it failed (then
     * this is the last chance to keep the model). */
    if (!tr->ck.on || tr->err || (tr_total_pushed(tr) == tr->ck.saved_total && !tr->ck.last_failed))
        return;
    /* A multi-process job: the chief saves the job's final state (the others are done). */
    const gr_train_job *job = tr->o->job;
    if (job && job->is_chief && !job->is_chief(job->ctx)) return;
    uint64_t step = tr_total_pushed(tr);
    if (tr->ck.rounds) {
        step = 0;
        for (unsigned i = 0; i < tr->o->workers; i++)
            if (tr->workers[i].base + tr->workers[i].steps > step)
                step = tr->workers[i].base + tr->workers[i].steps;
    }
    if (ck_save(tr, step) != GR_OK) {
        tr->res->ckpt_final_failed = true;
        snprintf(tr->res->ckpt_final_error, sizeof tr->res->ckpt_final_error, "%s", gr_errmsg());
    }
}
