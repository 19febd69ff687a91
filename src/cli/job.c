/* `granary job submit|list|status|stop|logs`: the controller's command-line client
 * (docs/api.md); and `granary job exec`, the shim the controller runs every job under. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "granary/http.h"
#include "granary/platform.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOB_OPTIONS(X)                                                                         \
    X(JO_CONTROLLER, "controller", GR_CLI_STR, "controller", 0, 0, NULL, "URL", NULL,          \
      "the controller (default $GRANARY_CONTROLLER or http://127.0.0.1:8470)")                 \
    X(JO_TOKEN, "token", GR_CLI_STR, "token", 0, 0, NULL, "TOKEN", NULL,                       \
      "bearer token (default $GRANARY_TOKEN)")                                                 \
    X(JO_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print the reply as JSON")   \
    X(JO_NAME, "name", GR_CLI_STR, "name", 0, 0, NULL, "NAME", NULL, "submit: the job's name") \
    X(JO_KIND, "kind", GR_CLI_CHOICE, "kind", 0, 0, "train|serve", NULL, "train",              \
      "submit: what the job runs")                                                             \
    X(JO_PRIO, "priority", GR_CLI_INT, "priority", -1000000, 1000000, NULL, "P", "0",          \
      "submit: higher runs first and may preempt lower")                                       \
    X(JO_CORES, "cores", GR_CLI_INT, "cores", 1, 4096, NULL, "N", "1",                         \
      "submit: cores it needs (per replica for serving)")                                      \
    X(JO_MINR, "min-replicas", GR_CLI_INT, "min_replicas", 1, 8, NULL, "N", NULL,              \
      "submit, serving: fewest replicas")                                                      \
    X(JO_MAXR, "max-replicas", GR_CLI_INT, "max_replicas", 1, 8, NULL, "N", NULL,              \
      "submit, serving: most replicas")                                                        \
    X(JO_SPEC, "spec", GR_CLI_STR, NULL, 0, 0, NULL, "FILE", NULL,                             \
      "submit: the whole job spec as a JSON file instead")                                     \
    X(JO_TAIL, "tail", GR_CLI_SIZE, NULL, 1, 1 << 24, NULL, "BYTES", "64k",                    \
      "logs: the last BYTES of the log")

enum { JOB_OPTIONS(GR_CLI_ENUM) JO_COUNT };
static const gr_cli_opt job_opts[] = {JOB_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec job_spec = {
    .command = "job",
    .synopsis = "granary job submit --name NAME [--kind train|serve] [--priority P] [--cores N] "
                "-- ARGS...\n"
                "       granary job list|status ID|stop ID|logs ID [--controller URL] "
                "[--token T] [--json]",
    .opts = job_opts,
    .n_opts = JO_COUNT,
    .config_section = NULL,
    .max_args = 2,
    .epilog = "ARGS are the `granary train` (or `granary serve`) options of the job; every path\n"
              "must lie under the controller's --data-root. docs/api.md.\n",
};

typedef struct ctx {
    char base[512];
    char headers[256];
    bool json;
} ctx;

/* One call; prints the error and returns 1 for a non-2xx reply. */
static int call(const ctx *c, const char *method, const char *path, const char *body,
                gr_http_result *r)
{
    char url[1024];
    snprintf(url, sizeof url, "%s%s", c->base, path);
    if (gr_http_fetch(method, url, c->headers, body, body ? strlen(body) : 0, 30000, r)) {
        fprintf(stderr, "granary job: %s\n", gr_errmsg());
        return 1;
    }
    if (r->status / 100 != 2) {
        cJSON *e = cJSON_Parse(r->body);
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(e, "error"));
        fprintf(stderr, "granary job: %d: %s\n", r->status, msg ? msg : r->body);
        cJSON_Delete(e);
        gr_http_result_free(r);
        return 1;
    }
    return 0;
}

static double num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static const char *str(const cJSON *o, const char *k)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return s ? s : "";
}

static void print_job_line(const cJSON *j)
{
    const cJSON *p = cJSON_GetObjectItem(j, "progress");
    printf("%-5.0f %-20s %-6s %-10s %8.0f  %-10s %12.0f %9.4f %7.4f\n", num(j, "id"),
           str(j, "name"), str(j, "kind"), str(j, "owner"), num(j, "priority"), str(j, "state"),
           num(p, "examples"), num(p, "loss"), num(p, "auc"));
}

static int print_reply(const ctx *c, gr_http_result *r, void (*human)(const cJSON *))
{
    if (c->json) {
        fputs(r->body, stdout);
    } else {
        cJSON *o = cJSON_Parse(r->body);
        human(o);
        cJSON_Delete(o);
    }
    gr_http_result_free(r);
    return 0;
}

static void human_list(const cJSON *o)
{
    printf("%-5s %-20s %-6s %-10s %8s  %-10s %12s %9s %7s\n", "id", "name", "kind", "owner",
           "priority", "state", "examples", "loss", "auc");
    const cJSON *j;
    cJSON_ArrayForEach(j, cJSON_GetObjectItem(o, "jobs")) print_job_line(j);
}

static void human_status(const cJSON *j)
{
    const cJSON *p = cJSON_GetObjectItem(j, "progress");
    printf("job %.0f %s (%s, owner %s, priority %.0f, %.0f core(s)): %s%s, run %.0f\n",
           num(j, "id"), str(j, "name"), str(j, "kind"), str(j, "owner"), num(j, "priority"),
           num(j, "cores"), str(j, "state"),
           cJSON_IsTrue(cJSON_GetObjectItem(j, "stopping")) ? " (stopping)" : "", num(j, "runs"));
    printf("progress: %.0f examples, loss %.5f, AUC %.4f, %.0f examples/s\n",
           num(p, "examples"), num(p, "loss"), num(p, "auc"), num(p, "examples_per_sec"));
    const cJSON *ck;
    cJSON_ArrayForEach(ck, cJSON_GetObjectItem(j, "checkpoints"))
        printf("checkpoint %s: step %.0f, %s, %.0f bytes\n", str(ck, "name"), num(ck, "step"),
               str(ck, "kind"), num(ck, "bytes"));
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, "events"))
        printf("event %-12s %s\n", str(e, "kind"), str(e, "message"));
}

static void human_submitted(const cJSON *j)
{
    printf("job %.0f (%s) %s\n", num(j, "id"), str(j, "name"), str(j, "state"));
}

static char *spec_from_flags(const gr_cli_value *v, int nargs, char **args)
{
    if (!v[JO_NAME].s) {
        fprintf(stderr, "granary job submit: --name NAME is required (or --spec FILE)\n");
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", v[JO_NAME].s);
    cJSON_AddStringToObject(o, "kind", v[JO_KIND].s);
    cJSON_AddNumberToObject(o, "priority", (double)v[JO_PRIO].i);
    cJSON_AddNumberToObject(o, "cores", (double)v[JO_CORES].i);
    if (v[JO_MINR].given) cJSON_AddNumberToObject(o, "min_replicas", (double)v[JO_MINR].i);
    if (v[JO_MAXR].given) cJSON_AddNumberToObject(o, "max_replicas", (double)v[JO_MAXR].i);
    cJSON *a = cJSON_AddArrayToObject(o, "args");
    for (int i = 0; i < nargs; i++) cJSON_AddItemToArray(a, cJSON_CreateString(args[i]));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int run(const gr_cli_value *v, const gr_cli_parsed *p, int nargs, char **args)
{
    if (p->n_args < 1) {
        fprintf(stderr, "granary job: submit, list, status ID, stop ID or logs ID (see granary "
                        "job --help)\n");
        return 2;
    }
    ctx c = {.json = v[JO_JSON].b};
    const char *base = v[JO_CONTROLLER].s ? v[JO_CONTROLLER].s : getenv("GRANARY_CONTROLLER");
    snprintf(c.base, sizeof c.base, "%s", base ? base : "http://127.0.0.1:8470");
    size_t bl = strlen(c.base);
    if (bl && c.base[bl - 1] == '/') c.base[bl - 1] = '\0';
    const char *token = v[JO_TOKEN].s ? v[JO_TOKEN].s : getenv("GRANARY_TOKEN");
    if (token) snprintf(c.headers, sizeof c.headers, "Authorization: Bearer %s\r\n", token);
    const char *verb = p->args[0];
    bool wants_id = !strcmp(verb, "status") || !strcmp(verb, "stop") || !strcmp(verb, "logs");
    if (wants_id != (p->n_args == 2)) {
        fprintf(stderr, "granary job %s: %s\n", verb,
                wants_id ? "give the job's ID" : "takes no ID");
        return 2;
    }
    char path[256];
    gr_http_result r;
    if (!strcmp(verb, "submit")) {
        char *body = NULL;
        if (v[JO_SPEC].s) {
            size_t len;
            if (gr_read_file(v[JO_SPEC].s, &body, &len)) {
                fprintf(stderr, "granary job submit: --spec: %s\n", gr_errmsg());
                return 2;
            }
        } else if (!(body = spec_from_flags(v, nargs, args))) {
            return 2;
        }
        int rc = call(&c, "POST", "/v1/jobs", body, &r);
        free(body);
        return rc ? rc : print_reply(&c, &r, human_submitted);
    }
    if (nargs) {
        fprintf(stderr, "granary job %s: arguments after -- only go with submit\n", verb);
        return 2;
    }
    if (!strcmp(verb, "list")) {
        if (call(&c, "GET", "/v1/jobs", NULL, &r)) return 1;
        return print_reply(&c, &r, human_list);
    }
    if (!wants_id) {
        fprintf(stderr, "granary job: unknown verb '%s' (submit, list, status, stop, logs)\n",
                verb);
        return 2;
    }
    const char *id = p->args[1];
    if (!strcmp(verb, "status")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        if (call(&c, "GET", path, NULL, &r)) return 1;
        return print_reply(&c, &r, human_status);
    }
    if (!strcmp(verb, "stop")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        if (call(&c, "DELETE", path, NULL, &r)) return 1;
        if (!c.json) {
            printf("job %s: stopping (a checkpoint first)\n", id);
            gr_http_result_free(&r);
            return 0;
        }
        return print_reply(&c, &r, human_submitted);
    }
    snprintf(path, sizeof path, "/v1/jobs/%s/logs?tail=%llu", id,
             (unsigned long long)v[JO_TAIL].u);
    if (call(&c, "GET", path, NULL, &r)) return 1;
    fputs(r.body, stdout);
    gr_http_result_free(&r);
    return 0;
}

int gr_cli_job(int argc, char **argv)
{
    /* The shim: `granary job exec EXIT_FILE -- PROGRAM ARGS...` (internal). */
    if (argc >= 5 && !strcmp(argv[1], "exec") && !strcmp(argv[3], "--"))
        return gr_platform_shim(argv[2], argv + 4);
    int split = argc;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            split = i;
            break;
        }
    /* --help after the job's arguments still means this command's help (a job may not take
     * --help: the controller refuses it). */
    char *help_argv[] = {argv[0], (char *)"--help", NULL};
    for (int i = split; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            argv = help_argv;
            argc = split = 2;
            break;
        }
    gr_cli_value v[JO_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&job_spec, split, argv, v, &p);
    if (status < 0)
        status = run(v, &p, split < argc ? argc - split - 1 : 0, argv + (split < argc ? split + 1 : argc));
    gr_cli_parsed_fini(&p);
    return status;
}
