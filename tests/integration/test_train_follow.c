/* `granary train` on streams: `datagen --stream | train --train -` trains on every row until
 * stdin ends, then checkpoints and exits 0; `train --follow FILE` trains on the rows already in
 * the file and on those appended later, keeps the metrics file current while it runs, and on
 * SIGTERM finishes, checkpoints and exits 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/core.h"
#include "granary/train.h"
#include "support/ps_harness.h"

static double metric(const char *path, const char *key, bool *running)
{
    char *text = NULL;
    size_t len;
    if (gr_read_file(path, &text, &len)) return -1;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    double v = -1;
    if (j) {
        cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
        if (cJSON_IsNumber(x)) v = x->valuedouble;
        if (running) *running = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "running"));
    }
    cJSON_Delete(j);
    return v;
}

static void append_rows(const char *path, uint64_t seed, unsigned n)
{
    gr_datagen_stream *g;
    assert_int_equal(gr_datagen_stream_create(seed, 0.0, &g), 0);
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    char row[GR_DATAGEN_ROW_MAX];
    for (unsigned i = 0; i < n; i++) fwrite(row, 1, gr_datagen_stream_next(g, row, NULL, NULL), f);
    fclose(f);
    gr_datagen_stream_destroy(g);
}

static void test_stdin_until_eof(void **state)
{
    (void)state;
    char dir[256], cmd[2048], metrics[300], ck[300];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(metrics, sizeof metrics, "%s/m.json", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    const char *bin = ps_test_granary_bin();
    snprintf(cmd, sizeof cmd, "%s datagen --stream --rows 20000 --seed 3 --drift 0.5 | %s train "
             "--train - --shards 1 --workers 1 --batch 512 --progress 0 --metrics-out %s "
             "--ckpt-dir %s", bin, bin, metrics, ck);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(metric(metrics, "examples", NULL) == 20000);
    double auc = metric(metrics, "window_auc", NULL);
    assert_true(auc > 0.55 && auc < 1.0);
    char out[4096];
    const char *latest[] = {"ckpt", "latest", ck, NULL};
    assert_int_equal(ps_test_run_granary(latest, out, sizeof out), 0);
    assert_non_null(strstr(out, "step-"));
    ps_test_rmdir(dir);
}

static void test_follow_file_until_sigterm(void **state)
{
    (void)state;
    char dir[256], file[300], metrics[300], ck[300];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(file, sizeof file, "%s/stream.tsv", dir);
    snprintf(metrics, sizeof metrics, "%s/m.json", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    append_rows(file, 4, 5000);
    pid_t parent = getpid(), pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execl(ps_test_granary_bin(), ps_test_granary_bin(), "train", "--train", file, "--follow",
              "--shards", "1", "--workers", "1", "--batch", "512", "--progress", "0.2",
              "--metrics-out", metrics, "--ckpt-dir", ck, (char *)NULL);
        _exit(127);
    }
    /* The rows already there are trained on (the last partial batch after the idle flush). */
    bool running = false;
    double ex = -1;
    for (int i = 0; i < 300 && !(running && ex >= 5000); i++) {
        usleep(100000);
        ex = metric(metrics, "examples", &running);
    }
    assert_true(running);
    assert_true(ex == 5000);
    /* Rows appended later are trained on too. */
    append_rows(file, 5, 3000);
    for (int i = 0; i < 300 && ex < 8000; i++) {
        usleep(100000);
        ex = metric(metrics, "examples", &running);
    }
    assert_true(ex == 8000);
    kill(pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    running = true;
    assert_true(metric(metrics, "examples", &running) == 8000);
    assert_false(running); /* the final metrics replaced the running ones */
    char out[4096];
    const char *latest[] = {"ckpt", "latest", ck, NULL};
    assert_int_equal(ps_test_run_granary(latest, out, sizeof out), 0);
    assert_non_null(strstr(out, "step-"));
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stdin_until_eof),
        cmocka_unit_test(test_follow_file_until_sigterm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
