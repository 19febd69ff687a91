/* Integration: the control plane, end to end through `granary controller` processes.
 *  - the API's answers and the access-control matrix (401, 403, 404, 405, 400 naming the
 *    field) for admin, user, another user and viewer; `granary job` as the client;
 *  - a training job runs to success with progress, a checkpoint and events;
 *  - preemption: a sync job of low priority is checkpointed and stopped for an urgent one,
 *    resumes from its checkpoint and ends bitwise equal (AUC and logloss to 17 digits) to the
 *    same run never interrupted;
 *  - a controller killed with -9 loses nothing: the new one reattaches to a job still running
 *    and learns how a job that ended meanwhile ended. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/core.h"
#include "granary/http.h"
#include "tests/support/ctl_harness.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"

static char tmp[256], data[300], state_dir[300], tokens_path[300];

#define ADMIN "admin-token-0001"
#define ALICE "alice-token-0002"
#define BOB "bob-token-00003"
#define VIEWER "viewer-token-004"

static int setup(void **state)
{
    (void)state;
    assert_int_equal(ps_test_tmpdir(tmp, sizeof tmp), 0);
    snprintf(data, sizeof data, "%s/data", tmp);
    mkdir(data, 0700);
    snprintf(tokens_path, sizeof tokens_path, "%s/tokens", tmp);
    FILE *f = fopen(tokens_path, "w");
    fprintf(f, "# token user role\n%s root admin\n%s alice user\n%s bob user\n%s vic viewer\n",
            ADMIN, ALICE, BOB, VIEWER);
    fclose(f);
    const char *gen[] = {"datagen", "--out", data, "--train-rows", "20000", "--test-rows",
                         "2000", NULL};
    char out[4096];
    assert_int_equal(ps_test_run_granary(gen, out, sizeof out), 0);
    return 0;
}

/* After each test, passed or failed: nothing of it keeps running. */
static int stop_controllers(void **state)
{
    (void)state;
    ctl_test_cleanup();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ctl_test_cleanup();
    ps_test_rmdir(tmp);
    return 0;
}

static const char *ctl_log(void)
{
    static char log[400];
    snprintf(log, sizeof log, "%s/controller.log", tmp);
    return log;
}

static void fresh_state(const char *name)
{
    snprintf(state_dir, sizeof state_dir, "%s/%s", tmp, name);
}

/* A sync job slowed down by a straggler (sync results do not depend on timing). */
#define SLOW_SYNC_ARGS                                                                          \
    "\"--train\",\"train.tsv\",\"--test\",\"test.tsv\",\"--mode\",\"sync\",\"--workers\",\"2\"," \
    "\"--batch\",\"32\",\"--shards\",\"2\",\"--dim\",\"4\",\"--bottom\",\"8\",\"--top\",\"8\","   \
    "\"--ckpt-every\",\"16\",\"--ckpt-keep\",\"2\""

static void test_api_and_access_control(void **state)
{
    (void)state;
    fresh_state("state-api");
    ctl_test c = {.admin_token = ADMIN};
    ctl_test_start(&c, state_dir, data, 1, tokens_path, ctl_log());
    cJSON *r = NULL;
    /* Who may do anything at all. */
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs", NULL, NULL, &r), 401);
    assert_non_null(strstr(ctl_jstr(r, "error"), "Bearer"));
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs", "not-a-token-at-all", NULL, NULL), 401);
    assert_int_equal(ctl_api(&c, "GET", "/v1/whoami", BOB, NULL, &r), 200);
    assert_string_equal(ctl_jstr(r, "user"), "bob");
    assert_string_equal(ctl_jstr(r, "role"), "user");
    cJSON_Delete(r);
    const char *spec = "{\"name\":\"alice-job\",\"kind\":\"train\",\"args\":[" SLOW_SYNC_ARGS
                       ",\"--straggler\",\"1:30\"]}";
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", VIEWER, spec, &r), 403);
    cJSON_Delete(r);
    /* Bad specs: 400 naming the field. */
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", ALICE,
                         "{\"name\":\"x\",\"kind\":\"train\",\"args\":[\"--train\","
                         "\"/etc/passwd\"]}", &r), 400);
    assert_non_null(strstr(ctl_jstr(r, "error"), "not under the data root"));
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", ALICE,
                         "{\"name\":\"x\",\"kind\":\"train\",\"args\":[\"--batch\",\"0\"]}", &r),
                     400);
    assert_non_null(strstr(ctl_jstr(r, "error"), "--batch"));
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", ALICE,
                         "{\"name\":\"x\",\"kind\":\"train\",\"args\":[],\"cores\":2}", &r), 400);
    assert_non_null(strstr(ctl_jstr(r, "error"), "cores"));
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", ALICE, "{\"name\":", &r), 400);
    cJSON_Delete(r);
    /* A good one. */
    assert_int_equal(ctl_api(&c, "POST", "/v1/jobs", ALICE, spec, &r), 201);
    int id = (int)ctl_jnum(r, "id");
    assert_string_equal(ctl_jstr(r, "owner"), "alice");
    assert_string_equal(ctl_jstr(r, "state"), "queued");
    cJSON_Delete(r);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d", id);
    /* Who sees it. */
    assert_int_equal(ctl_api(&c, "GET", path, BOB, NULL, &r), 403);
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs", BOB, NULL, &r), 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "jobs")), 0);
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs", VIEWER, NULL, &r), 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "jobs")), 1);
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "GET", path, VIEWER, NULL, NULL), 200);
    /* Other resources, and what does not exist. */
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs/999", ADMIN, NULL, NULL), 404);
    assert_int_equal(ctl_api(&c, "GET", "/v1/jobs/abc", ADMIN, NULL, NULL), 404);
    assert_int_equal(ctl_api(&c, "PUT", "/v1/jobs", ADMIN, "{}", NULL), 405);
    assert_int_equal(ctl_api(&c, "GET", "/nothing", ADMIN, NULL, NULL), 404);
    cJSON_Delete(ctl_wait_job(&c, id, "running", 60));
    char logs[80], metrics[80];
    snprintf(logs, sizeof logs, "%s/logs", path);
    snprintf(metrics, sizeof metrics, "%s/metrics", path);
    assert_int_equal(ctl_api(&c, "GET", metrics, ALICE, NULL, &r), 200);
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(r, "samples")));
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(r, "checkpoints")));
    cJSON_Delete(r);
    assert_int_equal(ctl_api(&c, "GET", logs, BOB, NULL, NULL), 403);
    /* The command-line client, as the viewer: it lists and reads, and may not stop. */
    char idtxt[16];
    snprintf(idtxt, sizeof idtxt, "%d", id);
    char out[16384];
    const char *list[] = {"job", "list", "--controller", c.base, "--token", VIEWER, "--json",
                          NULL};
    assert_int_equal(ps_test_run_granary(list, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"alice-job\""));
    const char *stop_v[] = {"job", "stop", idtxt, "--controller", c.base, "--token", VIEWER, NULL};
    assert_int_equal(ps_test_run_granary(stop_v, out, sizeof out), 1);
    assert_non_null(strstr(out, "403"));
    /* Stopping: bob may not, alice may (and the job is stopped, not failed). */
    assert_int_equal(ctl_api(&c, "DELETE", path, BOB, NULL, NULL), 403);
    const char *stop_a[] = {"job", "stop", idtxt, "--controller", c.base, "--token", ALICE, NULL};
    assert_int_equal(ps_test_run_granary(stop_a, out, sizeof out), 0);
    cJSON *j = ctl_wait_job(&c, id, "stopped", 120);
    assert_true(ctl_has_event(j, "stopping"));
    cJSON_Delete(j);
    const char *status[] = {"job", "status", idtxt, "--controller", c.base, "--token", ADMIN,
                            NULL};
    assert_int_equal(ps_test_run_granary(status, out, sizeof out), 0);
    assert_non_null(strstr(out, "alice-job"));
    assert_non_null(strstr(out, "stopped"));
    ctl_kill_jobs(&c);
    ctl_test_kill(&c, SIGTERM);
}

/* "auc" and "logloss" of a --metrics-out file, as printed (17 significant digits). */
static void read_metrics(const char *path, char *auc, char *logloss)
{
    assert_int_equal(tr_metrics_text(path, "auc", auc, 64), 0);
    assert_int_equal(tr_metrics_text(path, "logloss", logloss, 64), 0);
}

static void test_preemption_resumes_bitwise(void **state)
{
    (void)state;
    fresh_state("state-preempt");
    /* The same run, never interrupted. */
    char ref_metrics[400], ref_ckpt[400];
    snprintf(ref_metrics, sizeof ref_metrics, "%s/ref-metrics.json", tmp);
    snprintf(ref_ckpt, sizeof ref_ckpt, "%s/ref-ckpt", tmp);
    char train[400], test[400];
    snprintf(train, sizeof train, "%s/train.tsv", data);
    snprintf(test, sizeof test, "%s/test.tsv", data);
    const char *ref[] = {"train", "--train", train, "--test", test, "--mode", "sync",
                         "--workers", "2", "--batch", "32", "--shards", "2", "--dim", "4",
                         "--bottom", "8", "--top", "8", "--ckpt-every", "16", "--ckpt-keep",
                         "2", "--ckpt-dir", ref_ckpt, "--metrics-out", ref_metrics, "--progress",
                         "0", NULL};
    char out[8192];
    assert_int_equal(ps_test_run_granary(ref, out, sizeof out), 0);
    ctl_test c = {.admin_token = ADMIN};
    ctl_test_start(&c, state_dir, data, 2, NULL, ctl_log());
    int low = ctl_submit(&c, NULL, "{\"name\":\"low\",\"kind\":\"train\",\"priority\":0,\"cores\":2,"
                               "\"args\":[" SLOW_SYNC_ARGS ",\"--straggler\",\"1:12\"]}");
    cJSON_Delete(ctl_wait_job(&c, low, "running", 60));
    /* Once it has a checkpoint, an urgent job arrives that needs every core. */
    double until = gr_now_s() + 120;
    for (;;) {
        cJSON *j = ctl_get_job(&c, low);
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(j, "checkpoints"));
        bool running = !strcmp(ctl_jstr(j, "state"), "running");
        cJSON_Delete(j);
        if (n > 0) break;
        assert_true(running);
        assert_true(gr_now_s() < until);
        usleep(50000);
    }
    int high = ctl_submit(&c, NULL, "{\"name\":\"urgent\",\"kind\":\"train\",\"priority\":10,"
                                "\"cores\":2,\"args\":[\"--train\",\"train.tsv\",\"--workers\","
                                "\"1\",\"--shards\",\"1\",\"--max-examples\",\"4096\"]}");
    cJSON *j = ctl_wait_job(&c, low, "preempted", 120);
    assert_true(ctl_has_event(j, "preempting"));
    cJSON_Delete(j);
    j = ctl_wait_job(&c, high, "succeeded", 120);
    cJSON_Delete(j);
    j = ctl_wait_job(&c, low, "succeeded", 300);
    assert_int_equal((int)ctl_jnum(j, "runs"), 2);
    assert_true(ctl_has_event(j, "resume"));
    cJSON_Delete(j);
    char m[400], auc[64], ll[64], ref_auc[64], ref_ll[64];
    snprintf(m, sizeof m, "%s/jobs/%d/metrics.json", state_dir, low);
    read_metrics(m, auc, ll);
    read_metrics(ref_metrics, ref_auc, ref_ll);
    fprintf(stderr, "platform: uninterrupted auc %s logloss %s; preempted and resumed auc %s "
                    "logloss %s\n", ref_auc, ref_ll, auc, ll);
    assert_string_equal(auc, ref_auc);
    assert_string_equal(ll, ref_ll);
    /* The controller's own series: what the scheduler did, read from its registry. */
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/metrics", c.port);
    gr_http_result r;
    assert_int_equal(gr_http_fetch("GET", url, NULL, NULL, 0, 5000, &r), 0);
    assert_int_equal(r.status, 200);
    const char *want[] = {"\ngranary_controller_jobs_submitted_total 2\n",
                          "\ngranary_controller_preemptions_total 1\n",
                          "\ngranary_controller_jobs{state=\"succeeded\"} 2\n",
                          "\ngranary_controller_jobs{state=\"running\"} 0\n",
                          "\ngranary_controller_capacity_cores 2\n",
                          "\ngranary_controller_cores_in_use 0\n",
                          "\nprocess_resident_memory_bytes "};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!strstr(r.body, want[i])) fprintf(stderr, "missing %s in:\n%s\n", want[i], r.body);
        assert_non_null(strstr(r.body, want[i]));
    }
    gr_http_result_free(&r);
    ctl_kill_jobs(&c);
    ctl_test_kill(&c, SIGTERM);
}

static void test_controller_killed_loses_nothing(void **state)
{
    (void)state;
    fresh_state("state-restart");
    ctl_test c = {.admin_token = ADMIN};
    ctl_test_start(&c, state_dir, data, 2, NULL, ctl_log());
    /* One short job, and one that runs until it is stopped (a thousand epochs), both running
     * when the controller dies. */
    int quick = ctl_submit(&c, NULL, "{\"name\":\"quick\",\"kind\":\"train\",\"args\":[\"--train\","
                                 "\"train.tsv\",\"--workers\",\"1\",\"--shards\",\"1\","
                                 "\"--max-examples\",\"8192\",\"--straggler\",\"0:4\"]}");
    int slow = ctl_submit(&c, NULL, "{\"name\":\"slow\",\"kind\":\"train\",\"args\":[" SLOW_SYNC_ARGS
                                ",\"--epochs\",\"1000\",\"--straggler\",\"1:4\"]}");
    /* Both start at the same tick (2 cores); the quick one may even have ended already. */
    cJSON_Delete(ctl_wait_job(&c, slow, "running", 60));
    ctl_test_kill(&c, SIGKILL);
    /* The quick one ends while nobody watches. */
    char exit_file[400];
    snprintf(exit_file, sizeof exit_file, "%s/jobs/%d/exit", state_dir, quick);
    double until = gr_now_s() + 120;
    while (access(exit_file, F_OK) != 0) {
        assert_true(gr_now_s() < until);
        usleep(50000);
    }
    ctl_test c2 = {.admin_token = ADMIN};
    ctl_test_start(&c2, state_dir, data, 2, NULL, ctl_log());
    cJSON *l = NULL;
    assert_int_equal(ctl_api(&c2, "GET", "/v1/jobs", NULL, NULL, &l), 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(l, "jobs")), 2);
    cJSON_Delete(l);
    cJSON *j = ctl_wait_job(&c2, quick, "succeeded", 30);
    assert_int_equal((int)ctl_jnum(j, "exit_code"), 0);
    assert_int_equal((int)ctl_jnum(j, "runs"), 1);
    cJSON_Delete(j);
    j = ctl_get_job(&c2, slow);
    assert_string_equal(ctl_jstr(j, "state"), "running");
    assert_true(ctl_has_event(j, "reattached"));
    cJSON_Delete(j);
    /* The new controller can stop what it did not start (through /proc), and learns how it
     * ended from the exit file. */
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d", slow);
    assert_int_equal(ctl_api(&c2, "DELETE", path, NULL, NULL, NULL), 202);
    j = ctl_wait_job(&c2, slow, "stopped", 300);
    assert_int_equal((int)ctl_jnum(j, "runs"), 1); /* watched to its end, not restarted */
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(j, "exit_code")));
    cJSON_Delete(j);
    ctl_kill_jobs(&c2);
    ctl_test_kill(&c2, SIGTERM);
}


/* Serving jobs scale on their load: a replica more while the requests per replica stay above
 * --scale-up-rps, one fewer once they fall below --scale-down-rps, each change an event. */
static void test_serving_autoscales(void **state)
{
    (void)state;
    fresh_state("state-scale");
    char model[400], train[400], test[400];
    snprintf(model, sizeof model, "%s/model", data);
    snprintf(train, sizeof train, "%s/train.tsv", data);
    snprintf(test, sizeof test, "%s/test.tsv", data);
    const char *fit[] = {"train", "--train", train, "--workers", "1", "--shards", "1",
                         "--max-examples", "4096", "--progress", "0", "--ckpt-dir", model, NULL};
    char out[8192];
    assert_int_equal(ps_test_run_granary(fit, out, sizeof out), 0);
    /* One example in the predict form: the test line without its label. */
    FILE *f = fopen(test, "r");
    char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    line[strcspn(line, "\n")] = '\0';
    char body[4200];
    snprintf(body, sizeof body, "{\"lines\": [\"%s\"]}", strchr(line, '\t') + 1);
    for (char *t = body; (t = strchr(t, '\t'));) {
        memmove(t + 2, t + 1, strlen(t + 1) + 1);
        t[0] = '\\';
        t[1] = 't';
    }
    const char *extra[] = {"--scale-up-rps", "20", "--scale-down-rps", "2", NULL};
    ctl_test c = {.admin_token = ADMIN, .extra = extra};
    ctl_test_start(&c, state_dir, data, 2, NULL, ctl_log());
    int id = ctl_submit(&c, NULL, "{\"name\":\"srv\",\"kind\":\"serve\",\"cores\":1,"
                                  "\"min_replicas\":1,\"max_replicas\":2,\"args\":[\"--model\","
                                  "\"model\",\"--threads\",\"1\"]}");
    cJSON_Delete(ctl_wait_job(&c, id, "running", 60));
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%d/predict", id);
    /* Load until a second replica serves (each request goes through the controller). */
    double until = gr_now_s() + 120;
    int replicas = 1, ok = 0;
    while (replicas < 2) {
        assert_true(gr_now_s() < until);
        for (int i = 0; i < 20; i++) {
            cJSON *r = NULL;
            if (ctl_api(&c, "POST", path, NULL, body, &r) == 200 &&
                cJSON_GetArraySize(cJSON_GetObjectItem(r, "predictions")) == 1)
                ok++;
            cJSON_Delete(r);
        }
        cJSON *j = ctl_get_job(&c, id);
        replicas = (int)ctl_jnum(j, "replicas");
        cJSON_Delete(j);
    }
    assert_true(ok > 0);
    cJSON *j = ctl_get_job(&c, id);
    assert_true(ctl_has_event(j, "scaled"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "processes")), 2);
    cJSON_Delete(j);
    /* Idle: back to one. */
    until = gr_now_s() + 120;
    while (replicas > 1) {
        assert_true(gr_now_s() < until);
        usleep(200000);
        j = ctl_get_job(&c, id);
        replicas = (int)ctl_jnum(j, "replicas");
        cJSON_Delete(j);
    }
    j = ctl_get_job(&c, id);
    int scaled = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "events")) scaled += !strcmp(ctl_jstr(e, "kind"), "scaled");
    assert_true(scaled >= 2);
    cJSON_Delete(j);
    /* Requests still served by the one left; then the job stops. */
    cJSON *r = NULL;
    assert_int_equal(ctl_api(&c, "POST", path, NULL, body, &r), 200);
    cJSON_Delete(r);
    snprintf(path, sizeof path, "/v1/jobs/%d", id);
    assert_int_equal(ctl_api(&c, "DELETE", path, NULL, NULL, NULL), 202);
    cJSON_Delete(ctl_wait_job(&c, id, "stopped", 60));
    ctl_test_kill(&c, SIGTERM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_api_and_access_control, stop_controllers),
        cmocka_unit_test_teardown(test_preemption_resumes_bitwise, stop_controllers),
        cmocka_unit_test_teardown(test_controller_killed_loses_nothing, stop_controllers),
        cmocka_unit_test_teardown(test_serving_autoscales, stop_controllers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
