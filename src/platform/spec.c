/* Job specs: the JSON a user submits, checked field by field. A spec cannot escape its
 * sandbox: its arguments go through the command's own option table (the cli part's check),
 * flags the controller sets itself are refused, and every path lies under the data root. */
#include "platform/platform_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flags a job may not set: the controller owns ports, its metrics files and where the
 * servers are; a config file would bring flags nobody checked. */
static const char *const denied_train[] = {"config", "servers", "coord", "metrics-out",
                                           "metrics", "auth-file", NULL};
static const char *const denied_serve[] = {"config", "http", "listen", "metrics", "from",
                                           "auth-file", NULL};

static int fail(char *err, size_t errcap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errcap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errcap, fmt, ap);
    va_end(ap);
    return GR_EINVAL;
}

/* Resolves the longest existing prefix of path with realpath and appends the rest, refusing
 * any ".." in the rest (it could climb out once created). */
static bool resolve(const char *path, char *out, size_t cap)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return false;
    size_t len = strlen(buf);
    char rest[PATH_MAX] = "";
    for (;;) {
        char real[PATH_MAX];
        if (realpath(buf, real)) {
            if (strstr(rest, "/../") || !strcmp(rest, "/..")) return false;
            return snprintf(out, cap, "%s%s", real, rest) < (int)cap;
        }
        char *slash = strrchr(buf, '/');
        if (!slash || slash == buf) return false;
        char tail[PATH_MAX];
        snprintf(tail, sizeof tail, "%s%s", slash, rest);
        snprintf(rest, sizeof rest, "%s", tail);
        *slash = '\0';
        len = strlen(buf);
        (void)len;
    }
}

bool path_under(const char *data_root, const char *path)
{
    if (!path || !*path) return false;
    char joined[PATH_MAX];
    if (path[0] == '/') snprintf(joined, sizeof joined, "%s", path);
    else if (snprintf(joined, sizeof joined, "%s/%s", data_root, path) >= (int)sizeof joined)
        return false;
    char root[PATH_MAX], full[PATH_MAX];
    if (!realpath(data_root, root) || !resolve(joined, full, sizeof full)) return false;
    size_t rl = strlen(root);
    return !strncmp(full, root, rl) && (full[rl] == '/' || full[rl] == '\0');
}

static bool denied(const char *kind, const char *flag)
{
    const char *const *list = strcmp(kind, "serve") ? denied_train : denied_serve;
    for (; *list; list++)
        if (!strcmp(*list, flag)) return true;
    return false;
}

static int check_paths(const gr_controller_config *cfg, const char *data_root, const job *j,
                       char *err, size_t errcap)
{
    for (int i = 0; i < j->nargs; i++) {
        const char *a = j->args[i];
        if (strncmp(a, "--", 2) != 0) continue;
        char flag[128];
        const char *eq = strchr(a, '=');
        size_t fl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (fl >= sizeof flag) return fail(err, errcap, "args: flag %s is too long", a);
        memcpy(flag, a + 2, fl);
        flag[fl] = '\0';
        if (denied(j->kind, flag))
            return fail(err, errcap, "args: --%s is set by the controller, not by a job spec",
                        flag);
        gr_job_flag_kind k = cfg->flag_info ? cfg->flag_info(j->kind, flag) : GR_JOB_FLAG_VALUE;
        if (k == GR_JOB_FLAG_UNKNOWN)
            return fail(err, errcap, "args: granary %s has no option --%s", j->kind, flag);
        if (k == GR_JOB_FLAG_SWITCH) continue;
        const char *value = eq ? eq + 1 : (i + 1 < j->nargs ? j->args[++i] : NULL);
        if (!value) return fail(err, errcap, "args: --%s needs a value", flag);
        if (k == GR_JOB_FLAG_PATH) {
            /* A list of files (comma-separated) is checked entry by entry. */
            char copy[PATH_MAX];
            if (snprintf(copy, sizeof copy, "%s", value) >= (int)sizeof copy)
                return fail(err, errcap, "args: --%s: path too long", flag);
            char *save = NULL;
            for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save))
                if (!path_under(data_root, p))
                    return fail(err, errcap, "args: --%s %s is not under the data root", flag, p);
        }
    }
    return 0;
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > JOB_NAME_MAX) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

static int get_int(const cJSON *o, const char *key, long lo, long hi, long def, long *out,
                   char *err, size_t errcap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble ||
        v->valuedouble < lo || v->valuedouble > hi)
        return fail(err, errcap, "%s: expected an integer in %ld..%ld", key, lo, hi);
    *out = (long)v->valuedouble;
    return 0;
}

int spec_parse(const char *body, const gr_controller_config *cfg, const char *data_root, job *j,
               char *err, size_t errcap)
{
    static const char *const known[] = {"name", "kind", "args", "priority", "cores",
                                        "min_replicas", "max_replicas", NULL};
    cJSON *o = cJSON_Parse(body);
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        rc = fail(err, errcap, "the body is not a JSON object");
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        bool ok = false;
        for (const char *const *k = known; *k; k++) ok |= !strcmp(*k, it->string);
        if (!ok) {
            rc = fail(err, errcap, "%s: unknown field (known: name, kind, args, priority, "
                      "cores, min_replicas, max_replicas)", it->string);
            goto out;
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name_ok(name->valuestring)) {
        rc = fail(err, errcap, "name: expected 1 to %d letters, digits, '-', '_' or '.'",
                  JOB_NAME_MAX);
        goto out;
    }
    snprintf(j->name, sizeof j->name, "%s", name->valuestring);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    if (!cJSON_IsString(kind) ||
        (strcmp(kind->valuestring, "train") && strcmp(kind->valuestring, "serve"))) {
        rc = fail(err, errcap, "kind: expected \"train\" or \"serve\"");
        goto out;
    }
    snprintf(j->kind, sizeof j->kind, "%s", kind->valuestring);
    long prio = 0, cores = 1, minr = 0, maxr = 0;
    unsigned capacity = cfg->capacity ? cfg->capacity : 1;
    if ((rc = get_int(o, "priority", -1000000, 1000000, 0, &prio, err, errcap)) ||
        (rc = get_int(o, "cores", 1, capacity, 1, &cores, err, errcap)))
        goto out;
    bool serve = !strcmp(j->kind, "serve");
    if ((rc = get_int(o, "min_replicas", serve ? 1 : 0, JOB_MAX_PROCS, serve ? 1 : 0, &minr,
                      err, errcap)) ||
        (rc = get_int(o, "max_replicas", serve ? 1 : 0, JOB_MAX_PROCS, minr, &maxr, err,
                      errcap)))
        goto out;
    if (!serve && (minr || maxr)) {
        rc = fail(err, errcap, "min_replicas: only serving jobs have replicas");
        goto out;
    }
    if (maxr < minr) {
        rc = fail(err, errcap, "max_replicas: must be at least min_replicas (%ld)", minr);
        goto out;
    }
    if (serve && (unsigned long)cores * (unsigned long)maxr > capacity) {
        rc = fail(err, errcap, "cores: %ld cores x %ld replicas exceed the capacity of %u", cores,
                  maxr, capacity);
        goto out;
    }
    j->priority = (int)prio;
    j->cores = (unsigned)cores;
    j->min_replicas = (unsigned)minr;
    j->max_replicas = (unsigned)maxr;
    j->replicas = (unsigned)minr;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "args");
    if (!cJSON_IsArray(args) || cJSON_GetArraySize(args) > JOB_MAX_ARGS) {
        rc = fail(err, errcap, "args: expected an array of at most %d strings", JOB_MAX_ARGS);
        goto out;
    }
    j->args = calloc((size_t)cJSON_GetArraySize(args) + 1, sizeof *j->args);
    if (!j->args) {
        rc = fail(err, errcap, "out of memory");
        goto out;
    }
    cJSON_ArrayForEach(it, args) {
        if (!cJSON_IsString(it) || strlen(it->valuestring) > 4096) {
            rc = fail(err, errcap, "args[%d]: expected a string of at most 4096 bytes", j->nargs);
            goto out;
        }
        j->args[j->nargs++] = strdup(it->valuestring);
    }
    if ((rc = check_paths(cfg, data_root, j, err, errcap))) goto out;
    if (cfg->check_args) {
        char **argv = calloc((size_t)j->nargs + 2, sizeof *argv);
        if (!argv) {
            rc = fail(err, errcap, "out of memory");
            goto out;
        }
        argv[0] = j->kind;
        for (int i = 0; i < j->nargs; i++) argv[i + 1] = j->args[i];
        char why[512] = "";
        if (cfg->check_args(j->kind, j->nargs + 1, argv, why, sizeof why))
            rc = fail(err, errcap, "args: %s", why);
        free(argv);
        if (rc) goto out;
    }
    cJSON *norm = cJSON_CreateObject();
    cJSON_AddStringToObject(norm, "name", j->name);
    cJSON_AddStringToObject(norm, "kind", j->kind);
    cJSON_AddItemToObject(norm, "args", cJSON_Duplicate(args, 1));
    cJSON_AddNumberToObject(norm, "priority", j->priority);
    cJSON_AddNumberToObject(norm, "cores", j->cores);
    if (serve) {
        cJSON_AddNumberToObject(norm, "min_replicas", j->min_replicas);
        cJSON_AddNumberToObject(norm, "max_replicas", j->max_replicas);
    }
    j->spec_json = cJSON_PrintUnformatted(norm);
    cJSON_Delete(norm);
out:
    cJSON_Delete(o);
    return rc;
}
