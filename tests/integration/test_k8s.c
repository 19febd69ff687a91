/* The Kubernetes manifests, checked without a cluster (scripts/k8s-check): the base and every
 * overlay render with `kubectl kustomize` and every object is valid against the Kubernetes
 * OpenAPI schemas; an overlay written by `granary plan --emit-kustomize` renders and
 * validates too; the prod overlay's plan is exactly what the planner says for its tables; and
 * the check fails, naming the field, on a manifest with a misspelt field. Runs from the
 * repository root (as scripts/run-tests does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "granary/core.h"
#include "support/ps_harness.h"

static char g_out[1 << 16];

/* Runs a shell command; its exit status, its output in g_out. */
static int run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A scratch folder under build/ (the overlays name the base by a relative path, as kustomize
 * wants): "build/k8s-test-XXXXXX", base "../../deploy/k8s/base". */
static void scratch(char *dir, size_t cap)
{
    mkdir("build", 0755);
    snprintf(dir, cap, "build/k8s-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void test_prod_plan_is_the_planners(void **state)
{
    (void)state;
    char dir[64], cmd[512];
    scratch(dir, sizeof dir);
    const char *gr = ps_test_granary_bin();
    snprintf(cmd, sizeof cmd,
             "%s plan --tables deploy/k8s/overlays/prod/tables.json --memory-per-shard 128G "
             "--cpus 8 --emit-kustomize %s/plan --base ../../../base 2>&1",
             gr, dir);
    assert_int_equal(run(cmd), 0);
    static const char *const files[] = {"kustomization.yaml", "shard-resources.yaml", "plan.json"};
    for (size_t i = 0; i < 3; i++) {
        char a[256], b[256], *ta, *tb;
        size_t la, lb;
        snprintf(a, sizeof a, "deploy/k8s/overlays/prod/plan/%s", files[i]);
        snprintf(b, sizeof b, "%s/plan/%s", dir, files[i]);
        assert_int_equal(gr_read_file(a, &ta, &la), 0);
        assert_int_equal(gr_read_file(b, &tb, &lb), 0);
        if (la != lb || memcmp(ta, tb, la))
            fail_msg("%s differs from what `granary plan` writes now: regenerate it (the "
                     "command is in deploy/k8s/overlays/prod/kustomization.yaml)",
                     a);
        free(ta);
        free(tb);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run(cmd), 0);
}

static void test_overlays_render_and_validate(void **state)
{
    (void)state;
    char dir[64], cmd[768];
    scratch(dir, sizeof dir);
    /* A planner overlay of its own, for a small job. */
    snprintf(cmd, sizeof cmd,
             "printf '{\"tables\": [{\"name\": \"t\", \"id\": 1, \"dim\": 8, \"rows\": 1e6}]}' "
             "> %s/tables.json && %s plan --tables %s/tables.json --memory-per-shard 1G "
             "--emit-kustomize %s/small --base ../../../deploy/k8s/base 2>&1",
             dir, ps_test_granary_bin(), dir, dir);
    assert_int_equal(run(cmd), 0);
    snprintf(cmd, sizeof cmd, "bash scripts/k8s-check %s/small 2>&1", dir);
    int rc = run(cmd);
    if (rc) fprintf(stderr, "%s\n", g_out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(g_out, "rendered deploy/k8s/overlays/dev"));
    assert_non_null(strstr(g_out, "rendered deploy/k8s/overlays/prod"));
    assert_non_null(strstr(g_out, "rendered build/k8s-test-"));
    assert_non_null(strstr(g_out, " objects checked, 0 invalid"));
    /* Every kind the issue asks for is there. */
    snprintf(cmd, sizeof cmd, "kubectl kustomize deploy/k8s/overlays/prod 2>&1");
    assert_int_equal(run(cmd), 0);
    static const char *const kinds[] = {"kind: StatefulSet",
                                        "kind: Job",
                                        "kind: Deployment",
                                        "kind: HorizontalPodAutoscaler",
                                        "kind: PodDisruptionBudget",
                                        "kind: PriorityClass",
                                        "kind: PersistentVolumeClaim",
                                        "clusterIP: None",
                                        "completionMode: Indexed",
                                        "volumeClaimTemplates:",
                                        "path: /healthz",
                                        "prometheus.io/scrape: \"true\"",
                                        "secretName: granary-auth"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strstr(g_out, kinds[i])) fail_msg("prod overlay lacks '%s'", kinds[i]);

    /* A misspelt field must fail the check, naming it. */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/typo && printf 'resources:\\n  - ../../../deploy/k8s/base\\npatches:\\n"
             "  - target:\\n      kind: StatefulSet\\n      name: granary-shard\\n    patch: |-\\n"
             "      - op: add\\n        path: /spec/replicaz\\n        value: 3\\n' "
             "> %s/typo/kustomization.yaml && bash scripts/k8s-check %s/typo 2>&1",
             dir, dir, dir);
    assert_int_not_equal(run(cmd), 0);
    assert_non_null(strstr(g_out, "/spec/replicaz: unknown field"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prod_plan_is_the_planners),
        cmocka_unit_test(test_overlays_render_and_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
