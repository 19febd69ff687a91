/* The controller: the jobs in memory (mirrored to the store on every change), and a ticker
 * that reaps ended processes, reads progress, applies the scheduler's decisions, escalates
 * stops that take too long, and scales serving jobs. One mutex guards all of it; the HTTP
 * handlers take it too. */
#include "platform/platform_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "granary/ckpt.h"

/* A stop (user or preemption) waits this long for the checkpoint before SIGKILL. */
#define STOP_GRACE_S 120.0

const char *job_state_name(job_state s)
{
    static const char *const names[] = {"queued", "running", "preempted",
                                        "succeeded", "failed", "stopped"};
    return (unsigned)s < 6 ? names[s] : "unknown";
}

int job_state_parse(const char *name, job_state *out)
{
    for (int i = 0; i < 6; i++)
        if (name && !strcmp(name, job_state_name((job_state)i))) {
            *out = (job_state)i;
            return 0;
        }
    return GR_EINVAL;
}

void job_free(job *j)
{
    if (!j) return;
    for (int i = 0; i < j->nargs; i++) free(j->args[i]);
    free(j->args);
    free(j->spec_json);
    free(j);
}

job *controller_find(gr_controller *c, int64_t id)
{
    for (size_t i = 0; i < c->njobs; i++)
        if (c->jobs[i]->id == id) return c->jobs[i];
    return NULL;
}

static int add_job(gr_controller *c, job *j)
{
    if (c->njobs == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        job **nv = realloc(c->jobs, cap * sizeof *nv);
        if (!nv) return gr_seterr(GR_ENOMEM, "controller: out of memory");
        c->jobs = nv;
        c->cap = cap;
    }
    c->jobs[c->njobs++] = j;
    return 0;
}

static void set_state(gr_controller *c, job *j, job_state s, const char *why)
{
    if (j->state != s) store_event(c->store, j->id, job_state_name(s), "%s", why);
    j->state = s;
    j->updated = wall_now();
    store_update(c->store, j);
}

static void job_dirs(gr_controller *c, job *j)
{
    snprintf(j->job_dir, sizeof j->job_dir, "%s/jobs/%lld", c->state_dir, (long long)j->id);
    char parent[4200];
    snprintf(parent, sizeof parent, "%s/jobs", c->state_dir);
    mkdir(parent, 0700);
    mkdir(j->job_dir, 0700);
}

int controller_submit(gr_controller *c, job *j)
{
    j->state = JOB_QUEUED;
    j->created = j->updated = wall_now();
    j->exit_code = -1;
    int rc = store_insert(c->store, j);
    if (rc) return rc;
    gr_metric_inc(c->m_submitted, 1);
    job_dirs(c, j);
    if (!strcmp(j->kind, "train")) {
        /* The checkpoint root: the job's own --ckpt-dir, or one the controller picks. */
        const char *given = NULL;
        for (int i = 0; i < j->nargs; i++) {
            if (!strcmp(j->args[i], "--ckpt-dir") && i + 1 < j->nargs) given = j->args[i + 1];
            else if (!strncmp(j->args[i], "--ckpt-dir=", 11)) given = j->args[i] + 11;
        }
        /* Paths were checked to fit and to lie under the data root when the spec was read. */
        if (given && given[0] == '/')
            snprintf(j->ckpt_dir, sizeof j->ckpt_dir, "%s", given);
        else if (given)
            snprintf(j->ckpt_dir, sizeof j->ckpt_dir, "%.2999s/%.1000s", c->data_root, given);
        else
            snprintf(j->ckpt_dir, sizeof j->ckpt_dir, "%.2999s/ckpt/job-%lld", c->data_root,
                     (long long)j->id);
    }
    store_event(c->store, j->id, "submitted", "by %s, priority %d, %u core(s)", j->owner,
                j->priority, j->cores);
    store_update(c->store, j);
    rc = add_job(c, j);
    pthread_cond_signal(&c->wake);
    return rc;
}

static unsigned live_procs(const job *j)
{
    unsigned n = 0;
    for (int i = 0; i < JOB_MAX_PROCS; i++) n += j->procs[i].pid != 0;
    return n;
}

static void stop_procs(gr_controller *c, job *j, stop_reason why)
{
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        job_proc *p = &j->procs[i];
        if (!p->pid || p->stopping) continue;
        p->stopping = why;
        p->stop_sent = gr_now_s();
        exec_signal(p, SIGTERM);
    }
    store_update(c->store, j);
}

int controller_stop_job(gr_controller *c, job *j)
{
    if (job_state_final(j->state)) return 0;
    if (j->state == JOB_QUEUED || j->state == JOB_PREEMPTED || !live_procs(j)) {
        set_state(c, j, JOB_STOPPED, "stopped before it ran again");
        return 0;
    }
    store_event(c->store, j->id, "stopping", "stop requested: checkpoint, then stop");
    stop_procs(c, j, STOP_USER);
    return 0;
}

/* ---- starting ------------------------------------------------------------------------------ */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static bool has_flag(const job *j, const char *flag)
{
    size_t n = strlen(flag);
    for (int i = 0; i < j->nargs; i++)
        if (!strcmp(j->args[i], flag) || (!strncmp(j->args[i], flag, n) && j->args[i][n] == '='))
            return true;
    return false;
}

static int start_proc(gr_controller *c, job *j, int slot)
{
    char *argv[JOB_MAX_ARGS + 16];
    int n = 0;
    char metrics[4200], port_arg[64], progress[8] = "1";
    argv[n++] = c->granary_bin;
    argv[n++] = j->kind;
    for (int i = 0; i < j->nargs; i++) argv[n++] = j->args[i];
    job_proc *p = &j->procs[slot];
    memset(p, 0, sizeof *p);
    if (!strcmp(j->kind, "train")) {
        snprintf(metrics, sizeof metrics, "%s/metrics.json", j->job_dir);
        unlink(metrics);
        argv[n++] = (char *)"--metrics-out";
        argv[n++] = metrics;
        if (!has_flag(j, "--progress")) {
            argv[n++] = (char *)"--progress";
            argv[n++] = progress;
        }
        /* Its embedded shards' series (rows, requests) come from the trainer's /metrics. */
        p->port = free_port();
        snprintf(port_arg, sizeof port_arg, "127.0.0.1:%d", p->port);
        argv[n++] = (char *)"--metrics";
        argv[n++] = port_arg;
        if (!has_flag(j, "--ckpt-dir")) {
            argv[n++] = (char *)"--ckpt-dir";
            argv[n++] = j->ckpt_dir;
        }
        /* Started before: continue from its newest checkpoint, if it wrote one. */
        char name[256];
        uint64_t step;
        if (j->runs > 0 && gr_ckpt_latest(j->ckpt_dir, name, &step) == 0) {
            argv[n++] = (char *)"--resume";
            argv[n++] = j->ckpt_dir;
            store_event(c->store, j->id, "resume", "from checkpoint %s (step %llu)", name,
                        (unsigned long long)step);
        }
    } else {
        p->port = free_port();
        snprintf(port_arg, sizeof port_arg, "127.0.0.1:%d", p->port);
        argv[n++] = (char *)"--http";
        argv[n++] = port_arg;
    }
    argv[n] = NULL;
    int rc = exec_start(c->granary_bin, j->job_dir, c->data_root, argv, p);
    if (rc) {
        store_event(c->store, j->id, "error", "cannot start: %s", gr_errmsg());
        return rc;
    }
    return 0;
}

static void start_job(gr_controller *c, job *j)
{
    unsigned want = strcmp(j->kind, "serve") ? 1 : (j->replicas ? j->replicas : 1);
    j->replicas = strcmp(j->kind, "serve") ? 0 : want;
    for (unsigned i = 0; i < want; i++)
        if (start_proc(c, j, (int)i)) {
            stop_procs(c, j, STOP_USER);
            set_state(c, j, JOB_FAILED, "could not start its processes");
            return;
        }
    j->runs++;
    j->exit_code = -1;
    set_state(c, j, JOB_RUNNING, j->runs > 1 ? "running again" : "running");
}

/* ---- progress ------------------------------------------------------------------------------ */

/* "train: 12.0s 40960 examples, 3400 examples/s, loss 0.51234; ..." -- the numbers are found
 * by the words after them, so added fields (%, epoch, ETA) do not break it. */
static bool parse_progress(const char *line, job *j)
{
    if (strncmp(line, "train: ", 7) != 0) return false;
    const char *eps = strstr(line, " examples/s");
    const char *ex = strstr(line, " examples,");
    const char *loss = strstr(line, "loss ");
    if (!eps || !ex) return false;
    const char *p = ex;
    while (p > line && p[-1] != ' ') p--;
    j->examples = strtod(p, NULL);
    p = eps;
    while (p > line && p[-1] != ' ') p--;
    j->eps = strtod(p, NULL);
    if (loss) {
        double l = strtod(loss + 5, NULL);
        if (isfinite(l)) j->loss = l;
    }
    return true;
}

static void read_progress(gr_controller *c, job *j)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/log", j->job_dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fseek(f, j->log_offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char line[2048];
    bool got = false;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len && line[len - 1] != '\n' && !feof(f)) continue; /* over-long line: skip */
        if (len && line[len - 1] != '\n') break;                /* not complete yet */
        j->log_offset += (long)len;
        if (parse_progress(line, j)) {
            got = true;
            store_sample(c->store, j);
        }
    }
    fclose(f);
    if (got) store_update(c->store, j);
}

static void read_final_metrics(gr_controller *c, job *j)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.json", j->job_dir);
    char *text = NULL;
    size_t len = 0;
    if (gr_read_file(path, &text, &len) != 0) return;
    cJSON *m = cJSON_Parse(text);
    free(text);
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(m, "auc")) && cJSON_IsNumber(v)) j->auc = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(m, "logloss")) && cJSON_IsNumber(v))
        j->logloss = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(m, "examples_per_sec")) && cJSON_IsNumber(v))
        j->eps = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(m, "train_loss")) && cJSON_IsNumber(v))
        j->loss = v->valuedouble;
    cJSON_Delete(m);
    store_sample(c->store, j);
}

/* Reads a training job's shards from its trainer's Prometheus page: rows held
 * (granary_server_rows) and requests served (granary_server_requests_total, all operations),
 * per shard label. A trainer without the page (still starting) is tried again later. */
static void read_shards(gr_controller *c, job *j)
{
    double now = gr_now_s();
    if (!j->procs[0].port || now - j->shards_scraped < 2.0) return;
    j->shards_scraped = now;
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", j->procs[0].port);
    gr_http_result r;
    if (gr_http_fetch("GET", url, NULL, NULL, 0, 500, &r) != 0) return;
    enum { MAX_SHARDS = 64 };
    double rows[MAX_SHARDS] = {0}, reqs[MAX_SHARDS] = {0};
    bool seen[MAX_SHARDS] = {false};
    for (char *line = r.status == 200 ? r.body : NULL; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        bool is_rows = !strncmp(line, "granary_server_rows{", 20);
        bool is_reqs = !strncmp(line, "granary_server_requests_total{", 30);
        const char *sh = (is_rows || is_reqs) ? strstr(line, "shard=\"") : NULL;
        const char *val = sh ? strchr(sh, '}') : NULL;
        if (sh && val) {
            unsigned k = (unsigned)strtoul(sh + 7, NULL, 10);
            double v = strtod(val + 1, NULL);
            if (k < MAX_SHARDS && isfinite(v)) {
                seen[k] = true;
                if (is_rows) rows[k] = v;
                else reqs[k] += v;
            }
        }
        line = next;
    }
    gr_http_result_free(&r);
    for (unsigned k = 0; k < MAX_SHARDS; k++)
        if (seen[k]) store_shard_sample(c->store, j->id, k, rows[k], reqs[k]);
}

/* ---- the tick ------------------------------------------------------------------------------ */

/* What a job's ending means, given why its processes were stopped. */
static void job_ended(gr_controller *c, job *j, stop_reason why, int code)
{
    j->exit_code = code;
    read_progress(c, j);
    if (!strcmp(j->kind, "train")) read_final_metrics(c, j);
    char msg[128];
    snprintf(msg, sizeof msg, "exit status %d", code);
    if (why == STOP_PREEMPT) {
        set_state(c, j, JOB_PREEMPTED, "checkpointed and stopped for a job of higher priority");
    } else if (why == STOP_USER) {
        set_state(c, j, JOB_STOPPED, msg);
    } else if (code == 0) {
        set_state(c, j, JOB_SUCCEEDED, msg);
    } else if (code < 0) {
        /* Ended while no controller watched and left no status: run it again from its
         * checkpoint rather than guess. */
        set_state(c, j, JOB_PREEMPTED, "ended while the controller was away; resumes from its "
                                        "checkpoint");
    } else {
        set_state(c, j, JOB_FAILED, msg);
    }
}

static void reap(gr_controller *c, job *j)
{
    if (j->state != JOB_RUNNING) return;
    double now = gr_now_s();
    stop_reason why = STOP_NONE;
    int last_code = 0;
    unsigned alive = 0, ended = 0;
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        job_proc *p = &j->procs[i];
        if (!p->pid) continue;
        int code;
        if (exec_alive(j->job_dir, p, &code)) {
            alive++;
            if (p->stopping && p->stop_sent && now - p->stop_sent > STOP_GRACE_S) {
                store_event(c->store, j->id, "killed", "no exit %.0f s after SIGTERM: SIGKILL",
                            STOP_GRACE_S);
                exec_signal(p, SIGKILL);
                p->stop_sent = now;
            }
            continue;
        }
        ended++;
        if (p->stopping == STOP_SCALE) {
            memset(p, 0, sizeof *p);
            continue;
        }
        if (p->stopping > why) why = p->stopping;
        last_code = code;
        memset(p, 0, sizeof *p);
    }
    if (!ended) return;
    if (!strcmp(j->kind, "serve") && alive && why == STOP_NONE) {
        /* A replica died on its own: the others serve on; start a new one in its place. */
        store_event(c->store, j->id, "replica", "a replica exited (%d); starting another",
                    last_code);
        for (int i = 0; i < JOB_MAX_PROCS; i++)
            if (!j->procs[i].pid && (unsigned)i < j->replicas) start_proc(c, j, i);
        store_update(c->store, j);
        return;
    }
    if (alive) {
        /* The others of a stopping job end soon; stop the rest too. */
        stop_procs(c, j, why ? why : STOP_USER);
        store_update(c->store, j);
        return;
    }
    job_ended(c, j, why, last_code);
}

/* Serving: one replica more when each takes more than scale_up_rps, one fewer below
 * scale_down_rps, within [min, max], at most one change every few seconds. */
static void autoscale(gr_controller *c, job *j, unsigned *free_cores)
{
    if (strcmp(j->kind, "serve") || j->state != JOB_RUNNING) return;
    double now = gr_now_s();
    double total = 0, window = 0;
    unsigned n = 0;
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        job_proc *p = &j->procs[i];
        if (!p->pid || p->stopping) continue;
        if (!p->last_scrape) p->last_scrape = now;
        window = now - p->last_scrape;
        total += p->last_requests;
        n++;
    }
    if (!n || window < 2.0) return;
    double rps = total / window / n;
    j->rps = rps;
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        j->procs[i].last_requests = 0;
        j->procs[i].last_scrape = now;
        j->procs[i].last_rps = rps;
    }
    store_sample(c->store, j);
    if (rps > c->cfg.scale_up_rps && j->replicas < j->max_replicas && *free_cores >= j->cores) {
        for (int i = 0; i < JOB_MAX_PROCS; i++)
            if (!j->procs[i].pid) {
                if (start_proc(c, j, i) == 0) {
                    j->replicas++;
                    *free_cores -= j->cores;
                    gr_metric_inc(c->m_scaled, 1);
                    store_event(c->store, j->id, "scaled",
                                "up to %u replicas (%.1f requests/s per replica)", j->replicas,
                                rps);
                }
                break;
            }
    } else if (rps < c->cfg.scale_down_rps && j->replicas > j->min_replicas) {
        for (int i = JOB_MAX_PROCS - 1; i >= 0; i--)
            if (j->procs[i].pid && !j->procs[i].stopping) {
                j->procs[i].stopping = STOP_SCALE;
                j->procs[i].stop_sent = now;
                exec_signal(&j->procs[i], SIGTERM);
                j->replicas--;
                gr_metric_inc(c->m_scaled, 1);
                store_event(c->store, j->id, "scaled",
                            "down to %u replicas (%.1f requests/s per replica)", j->replicas, rps);
                break;
            }
    }
    store_update(c->store, j);
}

static bool job_stopping(const job *j)
{
    for (int i = 0; i < JOB_MAX_PROCS; i++)
        if (j->procs[i].pid && j->procs[i].stopping && j->procs[i].stopping != STOP_SCALE)
            return true;
    return false;
}

void controller_tick(gr_controller *c)
{
    for (size_t i = 0; i < c->njobs; i++) {
        job *j = c->jobs[i];
        reap(c, j);
        if (j->state == JOB_RUNNING && !strcmp(j->kind, "train")) {
            read_progress(c, j);
            read_shards(c, j);
        }
    }
    sched_job *sj = calloc(c->njobs + 1, sizeof *sj);
    sched_action act[64];
    if (!sj) return;
    unsigned used = 0;
    for (size_t i = 0; i < c->njobs; i++) {
        const job *j = c->jobs[i];
        unsigned procs = strcmp(j->kind, "serve") ? 1 : (j->replicas ? j->replicas : 1);
        sj[i] = (sched_job){.id = j->id, .priority = j->priority, .cores = j->cores * procs,
                            .state = j->state, .stopping = job_stopping(j),
                            .preemptible = !strcmp(j->kind, "train")};
        if (j->state == JOB_RUNNING) used += sj[i].cores;
    }
    size_t na = sched_decide(sj, c->njobs, c->cfg.capacity, act, 64);
    free(sj);
    for (size_t a = 0; a < na; a++) {
        job *j = controller_find(c, act[a].id);
        if (!j) continue;
        if (act[a].kind == ACT_START) {
            start_job(c, j);
            used += j->cores * (strcmp(j->kind, "serve") ? 1 : j->replicas);
        } else {
            gr_metric_inc(c->m_preemptions, 1);
            store_event(c->store, j->id, "preempting",
                        "a job of higher priority needs its cores: checkpoint, then stop");
            stop_procs(c, j, STOP_PREEMPT);
        }
    }
    unsigned free_cores = c->cfg.capacity > used ? c->cfg.capacity - used : 0;
    for (size_t i = 0; i < c->njobs; i++) autoscale(c, c->jobs[i], &free_cores);
}

static void *ticker_main(void *arg)
{
    gr_controller *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        controller_tick(c);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->cfg.tick_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&c->wake, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------------------ */

/* A restarted controller: jobs still running are watched again (through /proc and their
 * exit files); jobs that ended meanwhile get their final state at the first tick. */
static void reattach(gr_controller *c)
{
    for (size_t i = 0; i < c->njobs; i++) {
        job *j = c->jobs[i];
        job_dirs(c, j);
        if (j->state != JOB_RUNNING) continue;
        unsigned alive = 0;
        for (int k = 0; k < JOB_MAX_PROCS; k++) {
            job_proc *p = &j->procs[k];
            if (!p->pid) continue;
            p->child = 0;
            int code;
            if (exec_alive(j->job_dir, p, &code)) alive++;
        }
        store_event(c->store, j->id, "reattached", "controller restarted; %u process(es) of "
                    "this job still run", alive);
    }
}

int gr_controller_start(const gr_controller_config *cfg, gr_controller **out)
{
    *out = NULL;
    if (!cfg->http || !cfg->state_dir || !cfg->data_root)
        return gr_seterr(GR_EINVAL, "controller: --http, --state and --data-root are required");
    gr_controller *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "controller: out of memory");
    c->cfg = *cfg;
    if (!c->cfg.tick_ms) c->cfg.tick_ms = 200;
    if (!c->cfg.capacity) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->cfg.capacity = n > 0 ? (unsigned)n : 1;
    }
    if (c->cfg.scale_up_rps <= 0) c->cfg.scale_up_rps = 50;
    if (c->cfg.scale_down_rps <= 0) c->cfg.scale_down_rps = 5;
    int rc = 0;
    char real[PATH_MAX];
    if (strlen(cfg->data_root) >= sizeof c->data_root || strlen(cfg->state_dir) >= sizeof c->state_dir) {
        free(c);
        return gr_seterr(GR_EINVAL, "controller: --data-root and --state must be shorter than %zu",
                         sizeof c->data_root);
    }
    if (!realpath(cfg->data_root, real) || strlen(real) >= sizeof c->data_root) {
        rc = gr_seterr(GR_ENOENT, "controller: the data root %s: %s", cfg->data_root,
                       strerror(errno));
        free(c);
        return rc;
    }
    snprintf(c->data_root, sizeof c->data_root, "%s", real);
    if (mkdir(cfg->state_dir, 0700) != 0 && errno != EEXIST) {
        rc = gr_seterr(GR_EIO, "controller: cannot create %s: %s", cfg->state_dir,
                       strerror(errno));
        free(c);
        return rc;
    }
    if (!realpath(cfg->state_dir, real) || strlen(real) >= sizeof c->state_dir) {
        free(c);
        return gr_seterr(GR_EIO, "controller: %s: %s", cfg->state_dir, strerror(errno));
    }
    snprintf(c->state_dir, sizeof c->state_dir, "%s", real);
    if (cfg->granary_bin) snprintf(c->granary_bin, sizeof c->granary_bin, "%s", cfg->granary_bin);
    else {
        ssize_t n = readlink("/proc/self/exe", c->granary_bin, sizeof c->granary_bin - 1);
        if (n <= 0) {
            free(c);
            return gr_seterr(GR_EIO, "controller: cannot find its own program");
        }
        c->granary_bin[n] = '\0';
    }
    if (cfg->tokens_file) {
        if ((rc = tokens_load(cfg->tokens_file, &c->tokens))) {
            free(c);
            return rc;
        }
        c->auth = true;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->wake, NULL);
    if ((rc = store_open(c->state_dir, &c->store))) goto fail;
    if ((rc = store_load(c->store, &c->jobs, &c->njobs))) goto fail;
    c->cap = c->njobs;
    reattach(c);
    if ((rc = controller_metrics_init(c))) goto fail;
    gr_http_config hc = {.listen = cfg->http, .threads = 4, .max_body = 1u << 20,
                         .handler = api_handle, .ctx = c};
    if ((rc = gr_http_start(&hc, &c->http))) goto fail;
    if (pthread_create(&c->ticker, NULL, ticker_main, c) != 0) {
        rc = gr_seterr(GR_EIO, "controller: cannot start the scheduler thread");
        gr_http_stop(c->http);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    controller_metrics_free(c);
    store_close(c->store);
    for (size_t i = 0; i < c->njobs; i++) job_free(c->jobs[i]);
    free(c->jobs);
    tokens_free(&c->tokens);
    free(c);
    return rc;
}

uint16_t gr_controller_port(const gr_controller *c) { return gr_http_port(c->http); }

void gr_controller_stop(gr_controller *c, int stop_jobs)
{
    if (!c) return;
    gr_http_stop(c->http);
    pthread_mutex_lock(&c->mu);
    if (stop_jobs) {
        for (size_t i = 0; i < c->njobs; i++)
            if (c->jobs[i]->state == JOB_RUNNING) stop_procs(c, c->jobs[i], STOP_USER);
        /* Wait for them (they checkpoint first), then record how they ended. */
        for (int round = 0; round < 600; round++) {
            bool any = false;
            for (size_t i = 0; i < c->njobs; i++) {
                reap(c, c->jobs[i]);
                any |= c->jobs[i]->state == JOB_RUNNING;
            }
            if (!any) break;
            pthread_mutex_unlock(&c->mu);
            usleep(200000);
            pthread_mutex_lock(&c->mu);
        }
    }
    c->stopping = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->ticker, NULL);
    controller_metrics_free(c);
    store_close(c->store);
    for (size_t i = 0; i < c->njobs; i++) job_free(c->jobs[i]);
    free(c->jobs);
    tokens_free(&c->tokens);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
