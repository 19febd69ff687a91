/* The job store: one SQLite database (WAL, synchronous commits) under the state directory
 * with the jobs, their events and their progress samples. Every change is committed before
 * the controller acts on it, so a controller killed with -9 finds all of it again. */
#include "platform/platform_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct store {
    sqlite3 *db;
};

static const char schema_sql[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=FULL;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, kind TEXT NOT NULL,"
    "  owner TEXT NOT NULL, priority INTEGER NOT NULL, cores INTEGER NOT NULL,"
    "  spec TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,"
    "  runs INTEGER NOT NULL DEFAULT 0, exit_code INTEGER NOT NULL DEFAULT -1,"
    "  ckpt_dir TEXT NOT NULL DEFAULT '', replicas INTEGER NOT NULL DEFAULT 0,"
    "  procs TEXT NOT NULL DEFAULT '[]', progress TEXT NOT NULL DEFAULT '{}');"
    "CREATE TABLE IF NOT EXISTS events ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, t REAL NOT NULL,"
    "  kind TEXT NOT NULL, message TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS events_job ON events(job_id, id);"
    "CREATE TABLE IF NOT EXISTS samples ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, t REAL NOT NULL,"
    "  examples REAL, loss REAL, auc REAL, eps REAL, rps REAL, replicas INTEGER);"
    "CREATE INDEX IF NOT EXISTS samples_job ON samples(job_id, id);"
    "CREATE TABLE IF NOT EXISTS shard_samples ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, t REAL NOT NULL,"
    "  shard INTEGER NOT NULL, rows REAL NOT NULL, requests REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS shard_samples_job ON shard_samples(job_id, id);";

static int db_err(store *s, const char *what)
{
    return gr_seterr(GR_EIO, "job store: %s: %s", what, sqlite3_errmsg(s->db));
}

int store_open(const char *state_dir, store **out)
{
    *out = NULL;
    if (mkdir(state_dir, 0700) != 0 && errno != EEXIST)
        return gr_seterr(GR_EIO, "cannot create the state directory %s: %s", state_dir,
                         strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/jobs.db", state_dir);
    store *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "job store: out of memory");
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                          SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        int rc = gr_seterr(GR_EIO, "cannot open the job store %s: %s", path,
                           s->db ? sqlite3_errmsg(s->db) : "out of memory");
        sqlite3_close(s->db);
        free(s);
        return rc;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char *msg = NULL;
    if (sqlite3_exec(s->db, schema_sql, NULL, NULL, &msg) != SQLITE_OK) {
        int rc = gr_seterr(GR_EIO, "job store %s: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        sqlite3_close(s->db);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void store_close(store *s)
{
    if (!s) return;
    sqlite3_close(s->db);
    free(s);
}

static char *procs_json(const job *j)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < JOB_MAX_PROCS; i++) {
        const job_proc *p = &j->procs[i];
        if (!p->pid) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "slot", i);
        cJSON_AddNumberToObject(o, "pid", p->pid);
        cJSON_AddNumberToObject(o, "start_ticks", (double)p->start_ticks);
        cJSON_AddNumberToObject(o, "port", p->port);
        cJSON_AddNumberToObject(o, "stopping", p->stopping);
        cJSON_AddItemToArray(a, o);
    }
    char *s = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return s;
}

static char *progress_json(const job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "examples", j->examples);
    cJSON_AddNumberToObject(o, "loss", j->loss);
    cJSON_AddNumberToObject(o, "auc", j->auc);
    cJSON_AddNumberToObject(o, "logloss", j->logloss);
    cJSON_AddNumberToObject(o, "eps", j->eps);
    cJSON_AddNumberToObject(o, "log_offset", (double)j->log_offset);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int store_insert(store *s, job *j)
{
    sqlite3_stmt *st;
    const char *sql = "INSERT INTO jobs(name, kind, owner, priority, cores, spec, state, created,"
                      " updated, replicas) VALUES(?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return db_err(s, "insert");
    sqlite3_bind_text(st, 1, j->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, j->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, j->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, j->priority);
    sqlite3_bind_int(st, 5, (int)j->cores);
    sqlite3_bind_text(st, 6, j->spec_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, job_state_name(j->state), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 8, j->created);
    sqlite3_bind_double(st, 9, j->updated);
    sqlite3_bind_int(st, 10, (int)j->replicas);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(s, "insert");
    sqlite3_finalize(st);
    if (!rc) j->id = sqlite3_last_insert_rowid(s->db);
    return rc;
}

int store_update(store *s, const job *j)
{
    sqlite3_stmt *st;
    const char *sql = "UPDATE jobs SET state=?, updated=?, runs=?, exit_code=?, ckpt_dir=?,"
                      " replicas=?, procs=?, progress=? WHERE id=?";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return db_err(s, "update");
    char *procs = procs_json(j), *progress = progress_json(j);
    sqlite3_bind_text(st, 1, job_state_name(j->state), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, j->updated);
    sqlite3_bind_int(st, 3, (int)j->runs);
    sqlite3_bind_int(st, 4, j->exit_code);
    sqlite3_bind_text(st, 5, j->ckpt_dir, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, (int)j->replicas);
    sqlite3_bind_text(st, 7, procs ? procs : "[]", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 8, progress ? progress : "{}", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 9, j->id);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(s, "update");
    sqlite3_finalize(st);
    free(procs);
    free(progress);
    return rc;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* Rebuilds the parts of a record that live only in the spec (args, replica bounds). */
static int job_from_row(sqlite3_stmt *st, job *j)
{
    j->id = sqlite3_column_int64(st, 0);
    snprintf(j->name, sizeof j->name, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(j->kind, sizeof j->kind, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(j->owner, sizeof j->owner, "%s", (const char *)sqlite3_column_text(st, 3));
    j->priority = sqlite3_column_int(st, 4);
    j->cores = (unsigned)sqlite3_column_int(st, 5);
    j->spec_json = strdup((const char *)sqlite3_column_text(st, 6));
    if (job_state_parse((const char *)sqlite3_column_text(st, 7), &j->state))
        j->state = JOB_FAILED;
    j->created = sqlite3_column_double(st, 8);
    j->updated = sqlite3_column_double(st, 9);
    j->runs = (unsigned)sqlite3_column_int(st, 10);
    j->exit_code = sqlite3_column_int(st, 11);
    snprintf(j->ckpt_dir, sizeof j->ckpt_dir, "%s", (const char *)sqlite3_column_text(st, 12));
    j->replicas = (unsigned)sqlite3_column_int(st, 13);
    cJSON *procs = cJSON_Parse((const char *)sqlite3_column_text(st, 14));
    const cJSON *p;
    cJSON_ArrayForEach(p, procs) {
        int slot = (int)num(p, "slot");
        if (slot < 0 || slot >= JOB_MAX_PROCS) continue;
        j->procs[slot].pid = (int)num(p, "pid");
        j->procs[slot].start_ticks = (uint64_t)num(p, "start_ticks");
        j->procs[slot].port = (int)num(p, "port");
        j->procs[slot].stopping = (stop_reason)num(p, "stopping");
    }
    cJSON_Delete(procs);
    cJSON *pr = cJSON_Parse((const char *)sqlite3_column_text(st, 15));
    j->examples = num(pr, "examples");
    j->loss = num(pr, "loss");
    j->auc = num(pr, "auc");
    j->logloss = num(pr, "logloss");
    j->eps = num(pr, "eps");
    j->log_offset = (long)num(pr, "log_offset");
    cJSON_Delete(pr);
    /* args and replica bounds from the spec */
    cJSON *spec = cJSON_Parse(j->spec_json ? j->spec_json : "");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(spec, "args");
    int n = cJSON_GetArraySize(args);
    j->args = calloc((size_t)n + 1, sizeof *j->args);
    if (!j->args) {
        cJSON_Delete(spec);
        return GR_ENOMEM;
    }
    const cJSON *a;
    cJSON_ArrayForEach(a, args) if (cJSON_IsString(a)) j->args[j->nargs++] = strdup(a->valuestring);
    j->min_replicas = (unsigned)num(spec, "min_replicas");
    j->max_replicas = (unsigned)num(spec, "max_replicas");
    cJSON_Delete(spec);
    return 0;
}

int store_load(store *s, job ***jobs, size_t *n)
{
    *jobs = NULL;
    *n = 0;
    sqlite3_stmt *st;
    const char *sql = "SELECT id, name, kind, owner, priority, cores, spec, state, created, "
                      "updated, runs, exit_code, ckpt_dir, replicas, procs, progress FROM jobs "
                      "ORDER BY id";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return db_err(s, "load");
    size_t cap = 0;
    int rc = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        job *j = calloc(1, sizeof *j);
        if (!j || job_from_row(st, j)) {
            job_free(j);
            rc = gr_seterr(GR_ENOMEM, "job store: out of memory");
            break;
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            job **nv = realloc(*jobs, cap * sizeof *nv);
            if (!nv) {
                job_free(j);
                rc = gr_seterr(GR_ENOMEM, "job store: out of memory");
                break;
            }
            *jobs = nv;
        }
        (*jobs)[(*n)++] = j;
    }
    sqlite3_finalize(st);
    return rc;
}

int store_event(store *s, int64_t job_id, const char *kind, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "INSERT INTO events(job_id, t, kind, message) VALUES(?,?,?,?)",
                           -1, &st, NULL) != SQLITE_OK)
        return db_err(s, "event");
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_double(st, 2, wall_now());
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, msg, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(s, "event");
    sqlite3_finalize(st);
    return rc;
}

/* The newest `limit` rows of one job in a time-series table, oldest first, as an array of
 * objects keyed by `keys` in column order: text columns as strings, numbers as numbers, NULL as
 * null. `sql` selects the columns in that order, with `?` for the job id and the limit. */
static cJSON *recent_rows(store *s, const char *sql, int64_t job_id, int limit,
                          const char *const *keys, int nkeys)
{
    cJSON *a = cJSON_CreateArray();
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return a;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int(st, 2, limit);
    while (sqlite3_step(st) == SQLITE_ROW) {
        cJSON *o = cJSON_CreateObject();
        for (int k = 0; k < nkeys; k++) {
            switch (sqlite3_column_type(st, k)) {
            case SQLITE_NULL: cJSON_AddNullToObject(o, keys[k]); break;
            case SQLITE_TEXT:
                cJSON_AddStringToObject(o, keys[k], (const char *)sqlite3_column_text(st, k));
                break;
            default: cJSON_AddNumberToObject(o, keys[k], sqlite3_column_double(st, k)); break;
            }
        }
        cJSON_AddItemToArray(a, o);
    }
    sqlite3_finalize(st);
    return a;
}

cJSON *store_events(store *s, int64_t job_id, int limit)
{
    static const char *const keys[] = {"t", "kind", "message"};
    return recent_rows(s,
                       "SELECT t, kind, message FROM (SELECT id, t, kind, message FROM events "
                       "WHERE job_id=? ORDER BY id DESC LIMIT ?) ORDER BY id",
                       job_id, limit, keys, 3);
}

int store_sample(store *s, const job *j)
{
    sqlite3_stmt *st;
    const char *sql = "INSERT INTO samples(job_id, t, examples, loss, auc, eps, rps, replicas) "
                      "VALUES(?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return db_err(s, "sample");
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_double(st, 2, wall_now());
    sqlite3_bind_double(st, 3, j->examples);
    sqlite3_bind_double(st, 4, j->loss);
    sqlite3_bind_double(st, 5, j->auc);
    sqlite3_bind_double(st, 6, j->eps);
    sqlite3_bind_double(st, 7, j->rps);
    sqlite3_bind_int(st, 8, (int)j->replicas);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(s, "sample");
    sqlite3_finalize(st);
    return rc;
}

cJSON *store_samples(store *s, int64_t job_id, int limit)
{
    static const char *const keys[] = {"t", "examples", "loss", "auc", "eps", "rps", "replicas"};
    return recent_rows(s,
                       "SELECT t, examples, loss, auc, eps, rps, replicas FROM (SELECT * FROM "
                       "samples WHERE job_id=? ORDER BY id DESC LIMIT ?) ORDER BY id",
                       job_id, limit, keys, 7);
}

int store_shard_sample(store *s, int64_t job_id, unsigned shard, double rows, double requests)
{
    sqlite3_stmt *st;
    const char *sql = "INSERT INTO shard_samples(job_id, t, shard, rows, requests) "
                      "VALUES(?,?,?,?,?)";
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return db_err(s, "shard");
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_double(st, 2, wall_now());
    sqlite3_bind_int(st, 3, (int)shard);
    sqlite3_bind_double(st, 4, rows);
    sqlite3_bind_double(st, 5, requests);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(s, "shard");
    sqlite3_finalize(st);
    return rc;
}

cJSON *store_shard_samples(store *s, int64_t job_id, int limit)
{
    static const char *const keys[] = {"t", "shard", "rows", "requests"};
    return recent_rows(s,
                       "SELECT t, shard, rows, requests FROM (SELECT * FROM shard_samples "
                       "WHERE job_id=? ORDER BY id DESC LIMIT ?) ORDER BY id",
                       job_id, limit, keys, 4);
}
