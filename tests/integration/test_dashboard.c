/* Integration: the dashboard in a real browser. A controller runs a slow training job; Debian's
 * chromium, driven headless over the DevTools protocol by tests/browser/dashboard.mjs, sees
 * the job on the page, its loss chart with points, and stops it with the page's button; the
 * API then reports the job stopped. Skipped (with a message) only where chromium or node is
 * not installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/ctl_harness.h"
#include "tests/support/ps_harness.h"

static void test_dashboard_in_chromium(void **state)
{
    (void)state;
    if (system("command -v chromium >/dev/null && command -v node >/dev/null") != 0) {
        fprintf(stderr, "SKIP: chromium or node is not installed (scripts/setup installs them)\n");
        skip();
    }
    char tmp[256], data[300], st[300], log[300];
    assert_int_equal(ps_test_tmpdir(tmp, sizeof tmp), 0);
    snprintf(data, sizeof data, "%s/data", tmp);
    snprintf(st, sizeof st, "%s/state", tmp);
    snprintf(log, sizeof log, "%s/controller.log", tmp);
    mkdir(data, 0700);
    const char *gen[] = {"datagen", "--out", data, "--train-rows", "20000", "--test-rows",
                         "1000", NULL};
    char out[4096];
    assert_int_equal(ps_test_run_granary(gen, out, sizeof out), 0);
    ctl_test c = {0};
    ctl_test_start(&c, st, data, 2, NULL, log);
    int id = ctl_submit(&c, NULL, "{\"name\":\"browser-job\",\"kind\":\"train\",\"args\":["
                                  "\"--train\",\"train.tsv\",\"--workers\",\"1\",\"--shards\","
                                  "\"1\",\"--batch\",\"64\",\"--straggler\",\"0:20\"]}");
    cJSON_Delete(ctl_wait_job(&c, id, "running", 60));
    char cmd[512];
    snprintf(cmd, sizeof cmd, "node --experimental-websocket tests/browser/dashboard.mjs %s %d "
                              "2>&1", c.base, id);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    while (fgets(line, sizeof line, p)) fprintf(stderr, "%s", line);
    int rc = pclose(p);
    cJSON *j = ctl_get_job(&c, id);
    const char *state_now = ctl_jstr(j, "state");
    fprintf(stderr, "dashboard: browser script exit %d, job %s\n", rc, state_now);
    assert_int_equal(rc, 0);
    assert_true(!strcmp(state_now, "stopped") || ctl_jnum(j, "stopping") != 0);
    cJSON_Delete(j);
    cJSON_Delete(ctl_wait_job(&c, id, "stopped", 120));
    ctl_kill_jobs(&c);
    ctl_test_kill(&c, SIGTERM);
    ps_test_rmdir(tmp);
}

static int stop_controllers(void **state)
{
    (void)state;
    ctl_test_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_dashboard_in_chromium,
                                                                 stop_controllers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
