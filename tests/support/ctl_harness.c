/* Test support: a `granary controller` process and calls to its API (ctl_harness.h). */
#include "tests/support/ctl_harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/core.h"
#include "granary/http.h"
#include "tests/support/ps_harness.h"

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Every controller started and not yet killed, so a failed test leaves none behind. */
static ctl_test started[16];

void ctl_test_cleanup(void)
{
    for (int i = 0; i < 16; i++)
        if (started[i].pid > 0) {
            ctl_kill_jobs(&started[i]);
            kill(started[i].pid, SIGKILL);
            waitpid(started[i].pid, NULL, 0);
            started[i].pid = 0;
        }
}

void ctl_test_start(ctl_test *c, const char *state_dir, const char *data, unsigned capacity,
                    const char *tokens_path, const char *log)
{
    c->port = free_port();
    char http[64], cap[16];
    snprintf(http, sizeof http, "127.0.0.1:%u", c->port);
    snprintf(cap, sizeof cap, "%u", capacity);
    snprintf(c->base, sizeof c->base, "http://%s", http);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        /* Both streams to the log: a controller left behind by a failed test must not hold
         * the test runner's pipe open. */
        if (!freopen(log, "a", stderr) || dup2(2, 1) < 0) _exit(126);
        const char *bin = ps_test_granary_bin();
        const char *argv[48] = {"granary", "controller", "--http", http, "--state", state_dir,
                                "--data-root", data, "--capacity", cap};
        int n = 10;
        if (tokens_path) {
            argv[n++] = "--tokens";
            argv[n++] = tokens_path;
        }
        for (int i = 0; c->extra && c->extra[i] && n < 46; i++) argv[n++] = c->extra[i];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    static bool registered;
    if (!registered) atexit(ctl_test_cleanup);
    registered = true;
    char url[128];
    snprintf(url, sizeof url, "%s/healthz", c->base);
    for (int i = 0; i < 400; i++) {
        gr_http_result r;
        if (gr_http_fetch("GET", url, NULL, NULL, 0, 1000, &r) == 0 && r.status == 200) {
            gr_http_result_free(&r);
            for (int k = 0; k < 16; k++)
                if (started[k].pid <= 0) {
                    started[k] = *c;
                    break;
                }
            return;
        }
        gr_http_result_free(&r);
        usleep(50000);
    }
    fail_msg("the controller did not answer on %s", c->base);
}

void ctl_test_kill(ctl_test *c, int sig)
{
    for (int i = 0; i < 16; i++)
        if (started[i].pid == c->pid) started[i].pid = 0;
    kill(c->pid, sig);
    int st;
    waitpid(c->pid, &st, 0);
}

/* One call: status, and the body parsed as JSON (NULL when not JSON) in *out. */
int ctl_api(const ctl_test *c, const char *method, const char *path, const char *token,
               const char *body, cJSON **out)
{
    char url[256], hdr[128] = "";
    snprintf(url, sizeof url, "%s%s", c->base, path);
    if (token) snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", token);
    gr_http_result r;
    int rc = gr_http_fetch(method, url, token ? hdr : NULL, body, body ? strlen(body) : 0, 30000,
                           &r);
    if (rc) fail_msg("%s %s: %s", method, path, gr_errmsg());
    if (out) *out = cJSON_Parse(r.body);
    int status = r.status;
    gr_http_result_free(&r);
    return status;
}

double ctl_jnum(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

const char *ctl_jstr(const cJSON *o, const char *k)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return s ? s : "";
}

cJSON *ctl_get_job(const ctl_test *c, int id)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d", id);
    cJSON *j = NULL;
    assert_int_equal(ctl_api(c, "GET", path, c->admin_token, NULL, &j), 200);
    return j;
}

/* Waits until job id is in state (or its run count reaches runs, when runs > 0). */
cJSON *ctl_wait_job(const ctl_test *c, int id, const char *state, double timeout_s)
{
    double until = gr_now_s() + timeout_s;
    for (;;) {
        cJSON *j = ctl_get_job(c, id);
        if (!strcmp(ctl_jstr(j, "state"), state)) return j;
        if (gr_now_s() > until) {
            char *s = cJSON_Print(j);
            fprintf(stderr, "job %d: %s\n", id, s);
            free(s);
            cJSON_Delete(j);
            fail_msg("job %d did not reach '%s' within %.0f s", id, state, timeout_s);
        }
        cJSON_Delete(j);
        usleep(100000);
    }
}

int ctl_submit(const ctl_test *c, const char *token, const char *body)
{
    cJSON *j = NULL;
    int st = ctl_api(c, "POST", "/v1/jobs", token, body, &j);
    if (st != 201) fail_msg("submit: %d %s", st, ctl_jstr(j, "error"));
    int id = (int)ctl_jnum(j, "id");
    cJSON_Delete(j);
    return id;
}

bool ctl_has_event(const cJSON *job, const char *kind)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(job, "events")) if (!strcmp(ctl_jstr(e, "kind"), kind))
        return true;
    return false;
}

/* Kills whatever a job still runs (its shim leads a process group). */
void ctl_kill_jobs(const ctl_test *c)
{
    cJSON *l = NULL;
    if (ctl_api(c, "GET", "/v1/jobs", c->admin_token, NULL, &l) != 200) return;
    const cJSON *j, *p;
    cJSON_ArrayForEach(j, cJSON_GetObjectItem(l, "jobs"))
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(j, "processes")) kill(-(pid_t)ctl_jnum(p, "pid"),
                                                                       SIGKILL);
    cJSON_Delete(l);
}

