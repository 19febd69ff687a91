/* granary platform: the control plane. A controller keeps job records in SQLite, serves a
 * REST API (bearer tokens with roles admin/user/viewer) and a dashboard page over the shared
 * HTTP part, runs jobs as local processes within a core budget, preempts lower-priority
 * training jobs by checkpoint-and-stop when an urgent one does not fit and resumes them from
 * their checkpoint later, and scales serving jobs between a minimum and a maximum replica
 * count on their measured load. docs/platform.md and docs/api.md. */
#ifndef GRANARY_PLATFORM_H
#define GRANARY_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "granary/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_controller gr_controller;

/* Checks a job's arguments against the command's own option table. kind is "train" or
 * "serve"; argv[0] is the command name. Returns 0, or non-zero with err filled. The
 * controller does not know the commands' options itself (they live in the cli part). */
typedef int (*gr_job_args_check)(const char *kind, int argc, char **argv, char *err,
                                 size_t errcap);
/* What a flag of that command takes (flag without "--"), so the controller can find the paths
 * in a job's arguments: they must lie under the data root. */
typedef enum {
    GR_JOB_FLAG_UNKNOWN = 0,
    GR_JOB_FLAG_SWITCH,  /* no value */
    GR_JOB_FLAG_VALUE,   /* a value that is not a path */
    GR_JOB_FLAG_PATH,    /* a file or directory */
} gr_job_flag_kind;
typedef gr_job_flag_kind (*gr_job_flag_info)(const char *kind, const char *flag);

typedef struct gr_controller_config {
    const char *http;        /* "HOST:PORT" of the API and the page */
    const char *state_dir;   /* the SQLite database and each job's log */
    const char *data_root;   /* every path a job names lies under it; jobs run there */
    unsigned capacity;       /* cores the executor may hand out; 0 = the machine's */
    const char *tokens_file; /* "TOKEN USER ROLE" lines; NULL = no auth (loopback only) */
    const char *granary_bin; /* the program jobs run ("granary"); NULL = this program */
    gr_job_args_check check_args;
    gr_job_flag_info flag_info;
    unsigned tick_ms;        /* scheduler period; 0 = 200 */
    double scale_up_rps;     /* serving: requests/s per replica above which one is added */
    double scale_down_rps;   /* ... and below which one is removed */
} gr_controller_config;

/* Opens (or creates) the state, reattaches to or restarts the jobs a previous controller was
 * running, starts the HTTP API and the scheduler. */
GR_API int gr_controller_start(const gr_controller_config *cfg, gr_controller **out);
GR_API uint16_t gr_controller_port(const gr_controller *c);
/* Stops the API and the scheduler. Running jobs are left running (a new controller
 * reattaches) unless stop_jobs, which stops them with a checkpoint first. */
GR_API void gr_controller_stop(gr_controller *c, int stop_jobs);

/* `granary job exec EXIT_FILE -- PROGRAM ARGS...`: runs the program as a child, forwards
 * SIGTERM/SIGINT/SIGHUP to it, writes its exit status (128+signal when killed) to EXIT_FILE
 * and exits with it. The executor starts every job process through it. */
GR_API int gr_platform_shim(const char *exit_file, char **argv);

#ifdef __cplusplus
}
#endif
#endif
