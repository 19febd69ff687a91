/* deploy/grafana/granary.json and deploy/prometheus/granary-rules.yml: the dashboard parses,
 * `promtool check rules` accepts the alerts, and every series their queries name exists in
 * granary's exposition: an embedded cluster (its shards' series) and a semisync training run
 * with checkpoints (the trainer's, the sync job's and the checkpoints' series) counted into
 * one registry, formatted as /metrics would. A renamed metric fails here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/metrics.h"
#include "granary/train.h"
#include "support/ps_harness.h"
#include "support/train_fixture.h"

#define DASHBOARD "deploy/grafana/granary.json"
#define RULES "deploy/prometheus/granary-rules.yml"

typedef struct names {
    char v[256][128];
    size_t n;
    size_t exprs;
} names;

static void add_name(names *ns, const char *s, size_t len)
{
    if (len >= sizeof ns->v[0]) return;
    for (size_t i = 0; i < ns->n; i++)
        if (strlen(ns->v[i]) == len && !memcmp(ns->v[i], s, len)) return;
    assert_true(ns->n < 256);
    memcpy(ns->v[ns->n], s, len);
    ns->v[ns->n++][len] = '\0';
}

/* Every granary_* and process_* identifier of a PromQL expression. */
static void scan_expr(names *ns, const char *e)
{
    for (const char *p = e; *p;) {
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *s = p;
            while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
                p++;
            size_t len = (size_t)(p - s);
            bool quoted = s > e && (s[-1] == '"' || s[-1] == '$' || s[-1] == '{' || s[-1] == '=');
            if (!quoted && ((len > 8 && !strncmp(s, "granary_", 8)) ||
                            (len > 8 && !strncmp(s, "process_", 8))))
                add_name(ns, s, len);
        } else {
            p++;
        }
    }
}

static void walk(names *ns, cJSON *j)
{
    cJSON *c;
    cJSON_ArrayForEach(c, j)
    {
        if (c->string && !strcmp(c->string, "expr") && cJSON_IsString(c)) {
            ns->exprs++;
            scan_expr(ns, c->valuestring);
        }
        if (cJSON_IsObject(c) || cJSON_IsArray(c)) walk(ns, c);
    }
}

/* Does the exposition declare this series (a family, or a histogram's _bucket/_sum/_count)? */
static bool declared(const char *text, const char *name)
{
    char want[200];
    snprintf(want, sizeof want, "# TYPE %s ", name);
    if (strstr(text, want)) return true;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    size_t len = strlen(name);
    for (int i = 0; i < 3; i++) {
        size_t sl = strlen(suffixes[i]);
        if (len > sl && !strcmp(name + len - sl, suffixes[i])) {
            snprintf(want, sizeof want, "# TYPE %.*s histogram", (int)(len - sl), name);
            if (strstr(text, want)) return true;
        }
    }
    return false;
}

static void test_dashboard_series_exist(void **state)
{
    (void)state;
    char *json;
    size_t len;
    assert_int_equal(gr_read_file(DASHBOARD, &json, &len), 0);
    cJSON *dash = cJSON_Parse(json);
    free(json);
    if (!dash) fail_msg("%s is not JSON (near: %.40s)", DASHBOARD, cJSON_GetErrorPtr());
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(dash, "panels")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(dash, "title")), "granary");
    names ns = {0};
    walk(&ns, dash);
    cJSON_Delete(dash);
    assert_true(ns.exprs >= 20);
    assert_true(ns.n >= 25);
    /* The alert rules: valid for Prometheus, and their expressions scanned too. */
    size_t dash_exprs = ns.exprs;
    assert_int_equal(system("promtool check rules " RULES " > /dev/null"), 0);
    char *rules;
    assert_int_equal(gr_read_file(RULES, &rules, &len), 0);
    for (char *line = strtok(rules, "\n"); line; line = strtok(NULL, "\n")) {
        char *e = strstr(line, "expr: ");
        if (e) {
            ns.exprs++;
            scan_expr(&ns, e + 6);
        }
    }
    free(rules);
    assert_true(ns.exprs >= dash_exprs + 8);

    /* Everything counted into one registry. */
    tr_fixture fx;
    assert_int_equal(tr_fixture_make(&fx, "grafana", 9), 0);
    char ckroot[128];
    assert_int_equal(ps_test_tmpdir(ckroot, sizeof ckroot), 0);
    gr_metrics *reg;
    assert_int_equal(gr_metrics_create(&reg), 0);
    assert_int_equal(gr_metrics_add_process(reg), 0);
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start_metrics(2, 2, reg, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    gr_client *client;
    assert_int_equal(gr_client_create(&cc, &client), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = client;
    po.mode = GR_MODE_SEMISYNC;
    po.workers = 2;
    po.aggregate = 1;
    po.timeout_ms = 20000;
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    tr_fixture_small_dlrm(&fx, &o, GR_MODE_SEMISYNC, 2);
    o.test_path = NULL;
    o.max_examples = 8000;
    o.ckpt_dir = ckroot;
    o.ckpt_every = 5;
    o.metrics = reg;
    gr_train_result r;
    int rc = gr_train_run(&o, &be, &r);
    if (rc) fprintf(stderr, "train: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_true(r.ckpt_saves >= 1);
    char *text;
    assert_int_equal(gr_metrics_format(reg, &text, NULL), 0); /* the sync job is still on */
    size_t missing = 0;
    for (size_t i = 0; i < ns.n; i++)
        if (!declared(text, ns.v[i])) {
            fprintf(stderr,
                    "a dashboard or alert query names %s, which granary does not "
                    "export\n",
                    ns.v[i]);
            missing++;
        }
    free(text);
    assert_int_equal(missing, 0);
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cl);
    gr_metrics_destroy(reg);
    ps_test_rmdir(ckroot);
    tr_fixture_remove(&fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dashboard_series_exist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
