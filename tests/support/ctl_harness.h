/* Test support: a `granary controller` process on a free loopback port, and calls to its API. */
#ifndef GRANARY_TEST_CTL_HARNESS_H
#define GRANARY_TEST_CTL_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct cJSON cJSON;

typedef struct ctl_test {
    pid_t pid;
    uint16_t port;
    char base[96]; /* "http://127.0.0.1:PORT" */
    const char *admin_token; /* used by ctl_get_job/ctl_wait_job/ctl_kill_jobs; NULL = none */
    const char *const *extra; /* more controller flags (NULL-terminated), or NULL */
} ctl_test;

/* Starts a controller (stderr appended to log) and waits for /healthz. tokens may be NULL. */
void ctl_test_start(ctl_test *c, const char *state_dir, const char *data_root, unsigned capacity,
                    const char *tokens, const char *log);
void ctl_test_kill(ctl_test *c, int sig);
/* One call: the HTTP status; the body parsed as JSON in *out (NULL if not JSON). */
int ctl_api(const ctl_test *c, const char *method, const char *path, const char *token,
            const char *body, cJSON **out);
double ctl_jnum(const cJSON *o, const char *k);
const char *ctl_jstr(const cJSON *o, const char *k);
cJSON *ctl_get_job(const ctl_test *c, int id);
/* Waits until job id is in state; fails the test after timeout_s. */
cJSON *ctl_wait_job(const ctl_test *c, int id, const char *state, double timeout_s);
/* Submits a spec (201 expected); returns the id. */
int ctl_submit(const ctl_test *c, const char *token, const char *body);
bool ctl_has_event(const cJSON *job, const char *kind);
/* Kills every controller still running, and their jobs (at exit, and from a teardown). */
void ctl_test_cleanup(void);
/* Kills what jobs still run (each job's shim leads a process group). */
void ctl_kill_jobs(const ctl_test *c);

#endif
