/* Debian's Prometheus scrapes a running local cluster (two `granary server --metrics` shards)
 * and a trainer (`granary train --metrics`) on loopback, and the series arrive with sensible
 * values, checked through Prometheus's own HTTP query API: every target up, the shards' rows
 * equal to what the shards report, pulls counted with a latency quantile, the trainer's
 * examples, rate and loss. Prometheus runs on a free port with its data in a temporary folder
 * and is stopped (by pid) afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/http.h"
#include "support/ps_harness.h"
#include "support/train_fixture.h"

#define PROMETHEUS "/usr/bin/prometheus"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A loopback port free at the time of asking (bound, read back, closed). */
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

static pid_t start_prometheus(const char *dir, uint16_t port)
{
    char cfg[256], data[256], listen[64], log[256];
    snprintf(cfg, sizeof cfg, "--config.file=%s/prometheus.yml", dir);
    snprintf(data, sizeof data, "--storage.tsdb.path=%s/data", dir);
    snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%u", port);
    snprintf(log, sizeof log, "%s/prometheus.log", dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(PROMETHEUS, PROMETHEUS, cfg, data, listen, "--storage.tsdb.retention.time=1h",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int http_get(uint16_t port, const char *path, char **body)
{
    char url[2048];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    gr_http_result res;
    if (gr_http_fetch("GET", url, NULL, NULL, 0, 10000, &res)) return -1;
    *body = res.body;
    return res.status;
}

/* Runs an instant query; the values of its vector result (at most cap), or -1 on error. */
static int query(uint16_t port, const char *promql, double *vals, int cap)
{
    char path[1536] = "/api/v1/query?query=";
    size_t n = strlen(path);
    for (const unsigned char *p = (const unsigned char *)promql; *p && n + 4 < sizeof path; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '_' || *p == '.')
            path[n++] = (char)*p;
        else
            n += (size_t)snprintf(path + n, sizeof path - n, "%%%02X", *p);
    }
    path[n] = '\0';
    char *body = NULL;
    int status = http_get(port, path, &body);
    int got = -1;
    cJSON *root = status == 200 ? cJSON_Parse(body) : NULL;
    cJSON *result =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "data"), "result");
    if (cJSON_IsArray(result)) {
        got = 0;
        cJSON *r;
        cJSON_ArrayForEach(r, result)
        {
            cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "value"), 1);
            if (got < cap && cJSON_IsString(v)) vals[got++] = strtod(v->valuestring, NULL);
        }
    } else if (status != -1) { /* -1: not listening yet */
        fprintf(stderr, "prometheus query %s: status %d: %s\n", promql, status, body ? body : "");
    }
    cJSON_Delete(root);
    free(body);
    return got;
}

/* Waits up to timeout_s for the query to return at least want series; the first value. */
static double wait_query(uint16_t port, const char *promql, int want, double timeout_s)
{
    double vals[8], t0 = now_s();
    for (;;) {
        int n = query(port, promql, vals, 8);
        if (n >= want) return vals[0];
        if (now_s() - t0 > timeout_s) {
            fprintf(stderr, "prometheus: '%s' returned %d series after %.0f s\n", promql, n,
                    timeout_s);
            return -1;
        }
        usleep(250 * 1000);
    }
}

typedef struct train_run {
    const char *const *args;
    char out[16384];
    int status;
} train_run;

static void *train_thread(void *arg)
{
    train_run *t = arg;
    t->status = ps_test_run_granary(t->args, t->out, sizeof t->out);
    return NULL;
}

static void test_prometheus_scrapes_cluster_and_trainer(void **state)
{
    (void)state;
    if (access(PROMETHEUS, X_OK) != 0) fail_msg("%s is missing: run scripts/setup", PROMETHEUS);
    tr_fixture fx;
    assert_int_equal(tr_fixture_make(&fx, "prom", 5), 0);
    char dir[128];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    ps_test_server srv[2];
    const char *extra[] = {"--metrics", "127.0.0.1:0", NULL};
    char list[256];
    assert_int_equal(ps_test_cluster_start(srv, 2, extra, list, sizeof list), 0);
    uint16_t train_port = free_port(), prom_port = free_port();
    char path[256];
    snprintf(path, sizeof path, "%s/prometheus.yml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
            "scrape_configs:\n"
            "  - job_name: granary-server\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%u', '127.0.0.1:%u']\n"
            "  - job_name: granary-train\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%u']\n",
            srv[0].metrics_port, srv[1].metrics_port, train_port);
    fclose(f);
    pid_t prom = start_prometheus(dir, prom_port);
    assert_true(prom > 0);
    /* Ready, and both shards scraped. */
    assert_true(wait_query(prom_port, "up{job=\"granary-server\"} == 1", 2, 30) == 1);

    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", train_port);
    const char *args[] = {"train",      "--train", fx.train,    "--servers", list,
                          "--workers",  "2",       "--mode",    "async",     "--dim",
                          "8",          "--batch", "256",       "--epochs",  "12",
                          "--progress", "0.5",     "--metrics", listen,      NULL};
    train_run t = {.args = args};
    pthread_t th;
    /* 12 epochs (~480 k examples, a few seconds): with 4 the run could end within one or two
     * scrapes of 500 ms, before a progress line had set the rate (seen once in CI). */
    assert_int_equal(pthread_create(&th, NULL, train_thread, &t), 0);
    /* While it trains: the trainer's target is up and its examples grow. */
    double seen = wait_query(prom_port, "granary_train_examples_total > 0", 1, 60);
    pthread_join(th, NULL);
    if (t.status != 0) fprintf(stderr, "train said:\n%s\n", t.out);
    assert_int_equal(t.status, 0);
    assert_true(seen > 0);
    /* stdout's last line: "auc A logloss L examples_per_sec R examples N mode M". */
    const char *ex = strstr(t.out, "examples_per_sec ");
    ex = ex ? strstr(ex, " examples ") : NULL;
    assert_non_null(ex);
    double examples = strtod(ex + strlen(" examples "), NULL);
    assert_true(examples >= 12 * 40000 * 0.9);
    /* What Prometheus kept of the run: at most what it trained, all 12 epochs' worth of
     * batches when the last scrape came late enough; a rate and a loss in range. */
    double vals[8];
    assert_int_equal(query(prom_port, "max_over_time(granary_train_examples_total[10m])", vals, 8),
                     1);
    assert_true(vals[0] > 0 && vals[0] <= examples);
    assert_int_equal(
        query(prom_port, "max_over_time(granary_train_examples_per_second[10m])", vals, 8), 1);
    assert_true(vals[0] > 100 && vals[0] < 1e7);
    assert_int_equal(query(prom_port, "min_over_time(granary_train_loss[10m])", vals, 8), 1);
    assert_true(vals[0] > 0 && vals[0] < 1.0);
    assert_int_equal(query(prom_port, "max_over_time(up{job=\"granary-train\"}[10m])", vals, 8), 1);
    assert_true(vals[0] == 1);

    /* The shards' rows as Prometheus has them equal what the shards report, once a scrape
     * after training has landed. */
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    double rows = 0;
    for (uint32_t s = 0; s < 2; s++) {
        char *txt;
        assert_int_equal(gr_client_stats(c, s, &txt), 0);
        cJSON *root = cJSON_Parse(txt);
        rows += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "rows"));
        cJSON_Delete(root);
        free(txt);
    }
    gr_client_destroy(c);
    assert_true(rows > 1000);
    char q[256];
    snprintf(q, sizeof q, "sum(granary_table_rows{table=\"embeddings\"}) == %.0f", rows);
    assert_true(wait_query(prom_port, q, 1, 30) == rows);
    assert_int_equal(
        query(prom_port, "sum(granary_server_requests_total{op=\"pull\"}) > 0", vals, 8), 1);
    /* A latency quantile over the run: a duration, under the 10 s top bucket. */
    assert_int_equal(query(prom_port,
                           "histogram_quantile(0.99, sum by (le) (increase("
                           "granary_server_request_duration_seconds_bucket{op=\"pull\"}[10m])))",
                           vals, 8),
                     1);
    assert_true(vals[0] > 0 && vals[0] < 10);
    assert_int_equal(query(prom_port, "granary_server_memory_bytes > 0", vals, 8), 2);
    assert_int_equal(
        query(prom_port, "process_resident_memory_bytes{job=\"granary-server\"} > 1e6", vals, 8),
        2);

    kill(prom, SIGTERM);
    int st;
    assert_int_equal(waitpid(prom, &st, 0), prom);
    ps_test_cluster_stop(srv, 2);
    ps_test_rmdir(dir);
    tr_fixture_remove(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prometheus_scrapes_cluster_and_trainer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
