/* The REST API (docs/api.md) and the dashboard page. Every /v1 request is authenticated
 * first (401 without a known bearer token), then authorised by role and owner (403). */
#include "platform/platform_int.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "granary/ckpt.h"

typedef struct caller {
    char user[64];
    role role;
} caller;

static void reply_json(gr_http_response *resp, int status, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        gr_http_error(resp, 500, "out of memory");
        return;
    }
    size_t len = strlen(s);
    char *body = realloc(s, len + 2);
    if (body) {
        body[len] = '\n';
        body[len + 1] = '\0';
        len++;
    } else {
        body = s;
    }
    gr_http_take(resp, status, "application/json", body, len);
}

static bool authenticate(gr_controller *c, const gr_http_request *req, gr_http_response *resp,
                         caller *who)
{
    if (!c->auth) {
        snprintf(who->user, sizeof who->user, "local");
        who->role = ROLE_ADMIN;
        return true;
    }
    const char *h = gr_http_header(req, "Authorization");
    const token_entry *e = NULL;
    if (h && !strncmp(h, "Bearer ", 7)) e = tokens_find(&c->tokens, h + 7);
    if (!e) {
        gr_http_error(resp, 401, h ? "unknown token" : "an Authorization: Bearer TOKEN header "
                                                       "is required");
        snprintf(resp->extra_header[0], sizeof resp->extra_header[0],
                 "WWW-Authenticate: Bearer realm=\"granary\"");
        return false;
    }
    snprintf(who->user, sizeof who->user, "%s", e->user);
    who->role = e->role;
    return true;
}

static bool may_see(const caller *who, const job *j)
{
    return who->role != ROLE_USER || !strcmp(who->user, j->owner);
}

static bool may_change(const caller *who, const job *j)
{
    return who->role == ROLE_ADMIN || (who->role == ROLE_USER && !strcmp(who->user, j->owner));
}

static cJSON *checkpoints_json(const job *j)
{
    cJSON *a = cJSON_CreateArray();
    if (!j->ckpt_dir[0]) return a;
    DIR *d = opendir(j->ckpt_dir);
    if (!d) return a;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", j->ckpt_dir, e->d_name);
        gr_ckpt_manifest *m = NULL;
        if (gr_ckpt_manifest_read(path, &m) != 0) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", e->d_name);
        cJSON_AddNumberToObject(o, "step", (double)m->step);
        cJSON_AddStringToObject(o, "kind", gr_ckpt_kind_name(m->kind));
        cJSON_AddNumberToObject(o, "created", (double)m->created);
        uint64_t bytes = 0;
        for (uint32_t f = 0; f < m->map.shards; f++) bytes += m->files[f].size;
        cJSON_AddNumberToObject(o, "bytes", (double)bytes);
        cJSON_AddItemToArray(a, o);
        gr_ckpt_manifest_destroy(m);
    }
    closedir(d);
    /* Oldest first (directory order is arbitrary). */
    int n = cJSON_GetArraySize(a);
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0; k--) {
            double s0 = cJSON_GetObjectItem(cJSON_GetArrayItem(a, k - 1), "step")->valuedouble;
            double s1 = cJSON_GetObjectItem(cJSON_GetArrayItem(a, k), "step")->valuedouble;
            if (s0 <= s1) break;
            cJSON *item = cJSON_DetachItemFromArray(a, k);
            cJSON_InsertItemInArray(a, k - 1, item);
        }
    return a;
}

cJSON *job_to_json(gr_controller *c, const job *j, bool detail)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)j->id);
    cJSON_AddStringToObject(o, "name", j->name);
    cJSON_AddStringToObject(o, "kind", j->kind);
    cJSON_AddStringToObject(o, "owner", j->owner);
    cJSON_AddNumberToObject(o, "priority", j->priority);
    cJSON_AddNumberToObject(o, "cores", j->cores);
    cJSON_AddStringToObject(o, "state", job_state_name(j->state));
    bool stopping = false;
    for (int i = 0; i < JOB_MAX_PROCS; i++)
        stopping |= j->procs[i].pid && j->procs[i].stopping && j->procs[i].stopping != STOP_SCALE;
    cJSON_AddBoolToObject(o, "stopping", stopping);
    cJSON_AddNumberToObject(o, "created", j->created);
    cJSON_AddNumberToObject(o, "updated", j->updated);
    cJSON_AddNumberToObject(o, "runs", j->runs);
    if (j->exit_code >= 0) cJSON_AddNumberToObject(o, "exit_code", j->exit_code);
    else cJSON_AddNullToObject(o, "exit_code");
    cJSON *spec = cJSON_Parse(j->spec_json ? j->spec_json : "{}");
    cJSON *args = cJSON_DetachItemFromObject(spec, "args");
    cJSON_AddItemToObject(o, "args", args ? args : cJSON_CreateArray());
    cJSON_Delete(spec);
    cJSON *pr = cJSON_AddObjectToObject(o, "progress");
    cJSON_AddNumberToObject(pr, "examples", j->examples);
    cJSON_AddNumberToObject(pr, "loss", j->loss);
    cJSON_AddNumberToObject(pr, "auc", j->auc);
    cJSON_AddNumberToObject(pr, "logloss", j->logloss);
    cJSON_AddNumberToObject(pr, "examples_per_sec", j->eps);
    if (!strcmp(j->kind, "serve")) {
        cJSON_AddNumberToObject(pr, "requests_per_sec", j->rps);
        cJSON_AddNumberToObject(o, "replicas", j->replicas);
        cJSON_AddNumberToObject(o, "min_replicas", j->min_replicas);
        cJSON_AddNumberToObject(o, "max_replicas", j->max_replicas);
    } else {
        cJSON_AddStringToObject(o, "ckpt_dir", j->ckpt_dir);
    }
    cJSON *procs = cJSON_AddArrayToObject(o, "processes");
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        if (!j->procs[i].pid) continue;
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "pid", j->procs[i].pid);
        if (j->procs[i].port) cJSON_AddNumberToObject(p, "port", j->procs[i].port);
        cJSON_AddItemToArray(procs, p);
    }
    if (detail) {
        cJSON_AddItemToObject(o, "events", store_events(c->store, j->id, 200));
        cJSON_AddItemToObject(o, "checkpoints", checkpoints_json(j));
    }
    return o;
}

static int64_t parse_id(const char *s, const char **rest)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v <= 0) return -1;
    *rest = end;
    return v;
}

static void tail_log(const job *j, const gr_http_request *req, gr_http_response *resp)
{
    const char *t = gr_http_query(req, "tail");
    long tail = t ? atol(t) : 65536;
    if (tail <= 0 || tail > (1 << 24)) tail = 65536;
    char path[4200];
    snprintf(path, sizeof path, "%s/log", j->job_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        gr_http_printf(resp, 200, "text/plain; charset=utf-8", "%s", "");
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > tail ? size - tail : 0;
    fseek(f, from, SEEK_SET);
    char *buf = malloc((size_t)(size - from) + 1);
    size_t n = buf ? fread(buf, 1, (size_t)(size - from), f) : 0;
    fclose(f);
    if (!buf) {
        gr_http_error(resp, 500, "out of memory");
        return;
    }
    buf[n] = '\0';
    gr_http_take(resp, 200, "text/plain; charset=utf-8", buf, n);
}

/* Serving jobs: the controller spreads /v1/jobs/ID/predict over the replicas (round robin) and
 * counts the requests each gets, which is the load the autoscaler reads. */
static void proxy(gr_controller *c, job *j, const char *what, const gr_http_request *req,
                  gr_http_response *resp)
{
    static unsigned rr;
    int port = 0;
    job_proc *chosen = NULL;
    for (int k = 0; k < JOB_MAX_PROCS && !chosen; k++) {
        job_proc *p = &j->procs[(rr + (unsigned)k) % JOB_MAX_PROCS];
        if (p->pid && !p->stopping && p->port) chosen = p;
    }
    rr++;
    if (!chosen || j->state != JOB_RUNNING) {
        pthread_mutex_unlock(&c->mu);
        gr_http_error(resp, 503, "job %lld has no running replica", (long long)j->id);
        pthread_mutex_lock(&c->mu);
        return;
    }
    chosen->last_requests += 1;
    port = chosen->port;
    pthread_mutex_unlock(&c->mu);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/%s", port, what);
    gr_http_result r;
    if (gr_http_fetch(req->method, url, "Content-Type: application/json\r\n", req->body,
                      req->body_len, 10000, &r) != 0) {
        gr_http_error(resp, 502, "replica on port %d: %s", port, gr_errmsg());
    } else {
        gr_http_take(resp, r.status, r.content_type[0] ? r.content_type : NULL, r.body,
                     r.body_len);
        r.body = NULL;
    }
    pthread_mutex_lock(&c->mu);
}

static void jobs_collection(gr_controller *c, const caller *who, const gr_http_request *req,
                            gr_http_response *resp)
{
    if (!strcmp(req->method, "GET")) {
        cJSON *o = cJSON_CreateObject();
        cJSON *a = cJSON_AddArrayToObject(o, "jobs");
        const char *state = gr_http_query(req, "state");
        for (size_t i = 0; i < c->njobs; i++) {
            const job *j = c->jobs[i];
            if (!may_see(who, j)) continue;
            if (state && strcmp(state, job_state_name(j->state))) continue;
            cJSON_AddItemToArray(a, job_to_json(c, j, false));
        }
        reply_json(resp, 200, o);
        return;
    }
    if (strcmp(req->method, "POST")) {
        gr_http_error(resp, 405, "%s /v1/jobs: use GET or POST", req->method);
        return;
    }
    if (who->role == ROLE_VIEWER) {
        gr_http_error(resp, 403, "%s is a viewer and may not submit jobs", who->user);
        return;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        gr_http_error(resp, 500, "out of memory");
        return;
    }
    char err[1024];
    if (spec_parse(req->body, &c->cfg, c->data_root, j, err, sizeof err)) {
        job_free(j);
        gr_http_error(resp, 400, "%s", err);
        return;
    }
    snprintf(j->owner, sizeof j->owner, "%s", who->user);
    if (controller_submit(c, j)) {
        gr_http_error(resp, 500, "cannot record the job: %s", gr_errmsg());
        return;
    }
    reply_json(resp, 201, job_to_json(c, j, true));
}

static void one_job(gr_controller *c, const caller *who, const gr_http_request *req,
                    gr_http_response *resp, const char *rest)
{
    const char *tail = NULL;
    int64_t id = parse_id(rest, &tail);
    job *j = id > 0 ? controller_find(c, id) : NULL;
    if (!j) {
        gr_http_error(resp, 404, "no job %s", rest);
        return;
    }
    if (!may_see(who, j)) {
        gr_http_error(resp, 403, "job %lld belongs to another user", (long long)id);
        return;
    }
    bool get = !strcmp(req->method, "GET");
    if (!*tail) {
        if (get) {
            reply_json(resp, 200, job_to_json(c, j, true));
        } else if (!strcmp(req->method, "DELETE")) {
            if (!may_change(who, j)) {
                gr_http_error(resp, 403, "%s (%s) may not stop job %lld", who->user,
                              role_name(who->role), (long long)id);
                return;
            }
            controller_stop_job(c, j);
            reply_json(resp, 202, job_to_json(c, j, true));
        } else {
            gr_http_error(resp, 405, "%s /v1/jobs/ID: use GET or DELETE", req->method);
        }
    } else if (!strcmp(tail, "/logs") && get) {
        tail_log(j, req, resp);
    } else if (!strcmp(tail, "/metrics") && get) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)j->id);
        cJSON_AddItemToObject(o, "samples", store_samples(c->store, j->id, 2000));
        cJSON_AddItemToObject(o, "checkpoints", checkpoints_json(j));
        cJSON_AddItemToObject(o, "shards", store_shard_samples(c->store, j->id, 4000));
        reply_json(resp, 200, o);
    } else if ((!strcmp(tail, "/predict") || !strcmp(tail, "/lookup") || !strcmp(tail, "/model"))
               && strcmp(j->kind, "serve") == 0) {
        proxy(c, j, tail + 1, req, resp);
    } else {
        gr_http_error(resp, 404, "no such resource: %s %s", req->method, req->path);
    }
}

void api_handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    gr_controller *c = ctx;
    bool get = !strcmp(req->method, "GET");
    if (get && (!strcmp(req->path, "/") || !strcmp(req->path, "/index.html"))) {
        gr_http_printf(resp, 200, "text/html; charset=utf-8", "%s", gr_dashboard_html);
        return;
    }
    /* /healthz and /metrics (the collector takes c->mu itself). */
    if (gr_metrics_http_answer(c->metrics, NULL, NULL, req, resp)) return;
    pthread_mutex_lock(&c->mu);
    if (strncmp(req->path, "/v1/", 4) != 0) {
        gr_http_error(resp, 404, "no such page: %s", req->path);
    } else {
        caller who;
        if (!authenticate(c, req, resp, &who)) {
            /* the 401 is written */
        } else if (!strcmp(req->path, "/v1/whoami") && get) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "user", who.user);
            cJSON_AddStringToObject(o, "role", role_name(who.role));
            reply_json(resp, 200, o);
        } else if (!strcmp(req->path, "/v1/jobs")) {
            jobs_collection(c, &who, req, resp);
        } else if (!strncmp(req->path, "/v1/jobs/", 9)) {
            one_job(c, &who, req, resp, req->path + 9);
        } else {
            gr_http_error(resp, 404, "no such resource: %s", req->path);
        }
    }
    pthread_mutex_unlock(&c->mu);
}
