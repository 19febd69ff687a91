/* Internals of the platform part: the job record, the store, auth, specs, the scheduler's
 * pure decision function, the executor and the API. */
#ifndef GRANARY_PLATFORM_INT_H
#define GRANARY_PLATFORM_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "granary/http.h"
#include "granary/metrics.h"
#include "granary/platform.h"

#include <time.h>

typedef struct cJSON cJSON;

/* Wall clock in seconds with a fraction: job records and events are shown as dates. */
static inline double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
typedef struct sqlite3 sqlite3;

/* ---- jobs ---------------------------------------------------------------------------------- */

typedef enum {
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_PREEMPTED,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_STOPPED,
} job_state;

const char *job_state_name(job_state s);
int job_state_parse(const char *name, job_state *out);
static inline bool job_state_final(job_state s)
{
    return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_STOPPED;
}

/* What the controller asked a running job to do. */
typedef enum { STOP_NONE, STOP_USER, STOP_PREEMPT, STOP_SCALE } stop_reason;

#define JOB_MAX_PROCS 8
#define JOB_NAME_MAX 64
#define JOB_MAX_ARGS 64

/* One process of a job (the trainer; or one serving replica). */
typedef struct job_proc {
    int pid;              /* the shim's pid; 0 = none */
    uint64_t start_ticks; /* its start time from /proc (guards against pid reuse) */
    int port;             /* serving: the replica's HTTP port; train: its --metrics port */
    int child;            /* 1: started by this controller process (waitpid reaps it) */
    stop_reason stopping;
    double stop_sent;     /* when SIGTERM was sent (SIGKILL follows after a grace period) */
    double last_rps;      /* serving: requests/s measured at the last scrape */
    double last_requests, last_scrape;
} job_proc;

typedef struct job {
    int64_t id;
    char name[JOB_NAME_MAX + 1];
    char kind[8];         /* "train" | "serve" */
    char owner[64];
    int priority;
    unsigned cores;       /* per process */
    char *spec_json;      /* the submitted spec, normalised (owned) */
    char **args;          /* the user's arguments (owned), NULL-terminated */
    int nargs;
    unsigned min_replicas, max_replicas, replicas; /* serving */
    job_state state;
    double created, updated;
    unsigned runs;        /* times started */
    int exit_code;        /* last exit status (-1: none yet) */
    char ckpt_dir[4096];  /* train: the checkpoint root (resume from it) */
    char job_dir[4096];   /* state_dir/jobs/ID: log, exit status, metrics */
    job_proc procs[JOB_MAX_PROCS];
    /* latest progress */
    double examples, loss, auc, logloss, eps, rps;
    long log_offset;      /* how far the log has been read for progress lines */
    double shards_scraped; /* train: when its shards' series were last read (gr_now_s) */
} job;

void job_free(job *j);

/* ---- store (SQLite) ------------------------------------------------------------------------ */

typedef struct store store;
int store_open(const char *state_dir, store **out);
void store_close(store *s);
/* Inserts a new job and sets j->id. */
int store_insert(store *s, job *j);
/* Writes the job's mutable fields (state, procs, runs, exit, progress). */
int store_update(store *s, const job *j);
/* Loads every job, oldest first. */
int store_load(store *s, job ***jobs, size_t *n);
int store_event(store *s, int64_t job_id, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The job's events as a JSON array [{t, kind, message}], newest last (at most limit). */
cJSON *store_events(store *s, int64_t job_id, int limit);
int store_sample(store *s, const job *j);
/* The job's progress samples as a JSON array [{t, examples, loss, auc, eps, rps}]. */
cJSON *store_samples(store *s, int64_t job_id, int limit);
/* One reading of a training job's shards: rows held and requests served so far. */
int store_shard_sample(store *s, int64_t job_id, unsigned shard, double rows, double requests);
/* [{t, shard, rows, requests}] oldest first (at most limit). */
cJSON *store_shard_samples(store *s, int64_t job_id, int limit);

/* ---- auth ---------------------------------------------------------------------------------- */

typedef enum { ROLE_NONE = 0, ROLE_VIEWER, ROLE_USER, ROLE_ADMIN } role;
typedef struct token_entry { char token[128], user[64]; role role; } token_entry;
typedef struct tokens { token_entry *v; size_t n; } tokens;

/* Parses "TOKEN USER ROLE" lines (# comments and blank lines ignored). */
int tokens_load(const char *path, tokens *out);
int tokens_parse(const char *text, tokens *out);
void tokens_free(tokens *t);
/* The entry of a bearer token, compared in constant time with every entry; NULL if none. */
const token_entry *tokens_find(const tokens *t, const char *bearer);
const char *role_name(role r);

/* ---- specs --------------------------------------------------------------------------------- */

/* Parses and checks a submitted spec into j (name, kind, args, priority, cores, replicas).
 * Returns 0 or GR_EINVAL with err naming the field. Paths must lie under data_root. */
int spec_parse(const char *body, const gr_controller_config *cfg, const char *data_root,
               job *j, char *err, size_t errcap);
/* Whether path (relative to data_root, or absolute) lies under data_root after resolving
 * "..", "." and symbolic links of its existing part. */
bool path_under(const char *data_root, const char *path);

/* ---- scheduler (pure) ---------------------------------------------------------------------- */

typedef struct sched_job {
    int64_t id;
    int priority;
    unsigned cores;      /* all its processes */
    job_state state;     /* QUEUED/PREEMPTED wait; RUNNING holds cores */
    bool stopping;       /* running but asked to stop: its cores free soon */
    bool preemptible;    /* training jobs can be checkpointed and stopped */
} sched_job;

typedef enum { ACT_START, ACT_PREEMPT } sched_act_kind;
typedef struct sched_action { sched_act_kind kind; int64_t id; } sched_action;

/* Decides what to start and what to preempt: waiting jobs by priority (then by age); a job
 * that fits starts; one that does not preempts running jobs of lower priority (lowest first,
 * newest first among equals) when that makes room, and nothing of lower priority starts
 * while it waits. Returns the number of actions written (at most cap). */
size_t sched_decide(const sched_job *jobs, size_t n, unsigned capacity, sched_action *out,
                    size_t cap);

/* ---- executor ------------------------------------------------------------------------------ */

/* Starts one process for the job (argv is the full command line after the shim). */
int exec_start(const char *granary_bin, const char *job_dir, const char *cwd, char **argv,
               job_proc *p);
/* Whether the process still runs; when it ended, *exit_code is its status (from waitpid for
 * a child, else from the shim's exit file; -1 when unknown). */
bool exec_alive(const char *job_dir, job_proc *p, int *exit_code);
void exec_signal(job_proc *p, int sig);
uint64_t exec_start_ticks(int pid);

/* ---- the controller ------------------------------------------------------------------------ */

struct gr_controller {
    gr_controller_config cfg;
    char state_dir[3000], data_root[3000], granary_bin[4096];
    tokens tokens;
    bool auth;
    store *store;
    pthread_mutex_t mu;
    job **jobs;
    size_t njobs, cap;
    gr_http_server *http;
    gr_metrics *metrics;            /* GET /metrics: the registry, filled by a collector */
    gr_metric_family *m_jobs, *m_capacity, *m_cores_used, *m_replicas;
    gr_metric *m_preemptions, *m_submitted, *m_scaled;
    pthread_t ticker;
    pthread_cond_t wake;
    bool stopping;
};

job *controller_find(gr_controller *c, int64_t id);
int controller_submit(gr_controller *c, job *j);   /* takes j */
int controller_stop_job(gr_controller *c, job *j); /* user stop */
void controller_tick(gr_controller *c);

/* The controller's Prometheus series (GET /metrics, docs/platform.md). */
int controller_metrics_init(gr_controller *c);
void controller_metrics_free(gr_controller *c);

/* The HTTP handler of the API and the page. */
void api_handle(void *ctx, const gr_http_request *req, gr_http_response *resp);
cJSON *job_to_json(gr_controller *c, const job *j, bool detail);

/* The dashboard page (src/platform/web/index.html, embedded at build time). */
extern const char gr_dashboard_html[];

#endif
