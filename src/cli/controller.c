/* `granary controller`: the control plane (docs/platform.md). It checks job arguments with
 * the commands' own option tables, which live here in the cli part. */
#include "cli/cli.h"
#include "cli/job_args.h"
#include "cli/opts.h"
#include "granary/platform.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CONTROLLER_OPTIONS(X)                                                                  \
    X(CO_HTTP, "http", GR_CLI_STR, "http", 0, 0, NULL, "HOST:PORT", "127.0.0.1:8470",          \
      "address of the REST API and the dashboard page")                                        \
    X(CO_STATE, "state", GR_CLI_STR, "state", 0, 0, NULL, "DIR", NULL,                         \
      "where the job database (SQLite) and the jobs' logs live; required")                     \
    X(CO_DATA, "data-root", GR_CLI_STR, "data_root", 0, 0, NULL, "DIR", NULL,                  \
      "every path a job names lies under DIR; jobs run there; required")                       \
    X(CO_CAP, "capacity", GR_CLI_INT, "capacity", 0, 4096, NULL, "CORES", "0",                 \
      "cores the executor hands out (0: this machine's)")                                      \
    X(CO_TOKENS, "tokens", GR_CLI_STR, "tokens", 0, 0, NULL, "FILE", NULL,                     \
      "bearer tokens, one `TOKEN USER ROLE` per line (role admin|user|viewer)")                \
    X(CO_INSECURE, "insecure", GR_CLI_FLAG, "insecure", 0, 0, NULL, NULL, NULL,                \
      "allow a non-loopback --http without --tokens")                                          \
    X(CO_STOPJOBS, "stop-jobs", GR_CLI_FLAG, "stop_jobs", 0, 0, NULL, NULL, NULL,              \
      "on SIGTERM, stop the running jobs (checkpoint first) instead of leaving\n"             \
      "them running for the next controller")                                                  \
    X(CO_UP, "scale-up-rps", GR_CLI_NUM, "scale_up_rps", 0.001, 1e9, NULL, "R", "50",          \
      "serving: add a replica above R requests/s per replica")                                 \
    X(CO_DOWN, "scale-down-rps", GR_CLI_NUM, "scale_down_rps", 0, 1e9, NULL, "R", "5",         \
      "serving: remove a replica below R requests/s per replica")

enum { CONTROLLER_OPTIONS(GR_CLI_ENUM) CO_COUNT };
static const gr_cli_opt controller_opts[] = {CONTROLLER_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec controller_spec = {
    .command = "controller",
    .synopsis = "granary controller --state DIR --data-root DIR [--http HOST:PORT] "
                "[--capacity CORES] [--tokens FILE]",
    .opts = controller_opts,
    .n_opts = CO_COUNT,
    .config_section = "controller",
    .epilog = "The API: docs/api.md. Submit jobs with `granary job submit`; the page is at\n"
              "http://HOST:PORT/.\n",
};

static bool loopback(const char *hostport)
{
    return !strncmp(hostport, "127.", 4) || !strncmp(hostport, "localhost:", 10) ||
           !strncmp(hostport, "[::1]:", 6);
}

static int run(const gr_cli_value *v)
{
    if (!v[CO_STATE].s || !v[CO_DATA].s) {
        fprintf(stderr, "granary controller: --state DIR and --data-root DIR are required\n");
        return 2;
    }
    if (!v[CO_TOKENS].s && !v[CO_INSECURE].b && !loopback(v[CO_HTTP].s)) {
        fprintf(stderr, "granary controller: refusing to listen on %s without --tokens; pass "
                        "--insecure to allow it\n", v[CO_HTTP].s);
        return 2;
    }
    if (v[CO_DOWN].d >= v[CO_UP].d) {
        fprintf(stderr, "granary controller: --scale-down-rps must be below --scale-up-rps\n");
        return 2;
    }
    gr_controller_config cfg = {
        .http = v[CO_HTTP].s,
        .state_dir = v[CO_STATE].s,
        .data_root = v[CO_DATA].s,
        .capacity = (unsigned)v[CO_CAP].i,
        .tokens_file = v[CO_TOKENS].s,
        .check_args = gr_cli_job_check_args,
        .flag_info = gr_cli_job_flag_info,
        .scale_up_rps = v[CO_UP].d,
        .scale_down_rps = v[CO_DOWN].d,
    };
    /* Blocked before any thread starts (they inherit the mask), taken by sigwait below. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    gr_controller *c = NULL;
    if (gr_controller_start(&cfg, &c)) {
        fprintf(stderr, "granary controller: %s\n", gr_errmsg());
        return 1;
    }
    fprintf(stderr, "controller: serving http://%s (port %u), state %s, data root %s%s\n",
            v[CO_HTTP].s, gr_controller_port(c), v[CO_STATE].s, v[CO_DATA].s,
            v[CO_TOKENS].s ? ", tokens required" : ", no tokens (everyone is admin)");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "controller: stopping%s\n",
            v[CO_STOPJOBS].b ? " (and its jobs, with a checkpoint first)" : "; jobs keep running");
    gr_controller_stop(c, v[CO_STOPJOBS].b);
    return 0;
}

int gr_cli_controller(int argc, char **argv)
{
    gr_cli_value v[CO_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&controller_spec, argc, argv, v, &p);
    if (status < 0) status = run(v);
    gr_cli_parsed_fini(&p);
    return status;
}
