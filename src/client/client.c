/* The client instance: configuration (server list or cluster file, secret), create (connect
 * and check every shard), destroy, and the client's counters. The calls themselves live by
 * concept: batch.c (pull, push, delete), control.c (tables, dense, stats, shutdown), step.c
 * (sync jobs), ckpt.c (checkpoints); op.c runs their operations, plan.c plans their batches and
 * conn.c carries their frames. */
#include "client/op.h"

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <ctype.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ---- */

void gr_client_config_default(gr_client_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->connect_timeout_ms = 5000;
    cfg->request_timeout_ms = 30000;
    cfg->backoff_initial_ms = 10;
    cfg->backoff_max_ms = 500;
}

static int read_secret(const char *path, uint8_t **out, size_t *len)
{
    char *buf;
    size_t n;
    int rc = gr_read_file(path, &buf, &n);
    if (rc) return gr_seterr(rc, "cannot read the auth file: %s", gr_errmsg());
    while (n > 0 && isspace((unsigned char)buf[n - 1])) n--;
    if (n == 0) {
        free(buf);
        return gr_seterr(GR_EINVAL, "auth file %s is empty", path);
    }
    *out = (uint8_t *)buf;
    *len = n;
    return GR_OK;
}

static int add_shards_from_list(gr_client *c, const char *list)
{
    char *copy = strdup(list);
    if (!copy) return gr_seterr(GR_ENOMEM, "out of memory");
    uint32_t n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    if (n > GR_SLOTS) {
        free(copy);
        return gr_seterr(GR_EINVAL, "%u servers given; at most %u shards", n, GR_SLOTS);
    }
    c->conns = calloc(n, sizeof *c->conns);
    if (!c->conns) {
        free(copy);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    int rc = GR_OK;
    char *save = NULL, *tok = strtok_r(copy, ",", &save);
    uint32_t i = 0;
    for (; tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        char *e = tok + strlen(tok);
        while (e > tok && isspace((unsigned char)e[-1])) *--e = '\0';
        rc = cl_conn_init(&c->conns[i], &c->link, i, tok);
        if (!rc) i++;
    }
    c->link.nshards = i;
    free(copy);
    if (!rc && (i != n || i == 0)) rc = gr_seterr(GR_EINVAL, "bad server list '%s'", list);
    return rc;
}

static int load_cluster_file(gr_client *c, const char *path, char **auth_path)
{
    char *txt;
    int rc = gr_read_file(path, &txt, NULL);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *shards = root ? cJSON_GetObjectItemCaseSensitive(root, "shards") : NULL;
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) == 0) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "cluster file %s: needs \"shards\": [\"host:port\", ...]", path);
    }
    size_t cap = 1;
    cJSON *s;
    cJSON_ArrayForEach(s, shards)
    {
        if (!cJSON_IsString(s)) {
            cJSON_Delete(root);
            return gr_seterr(GR_EINVAL, "cluster file %s: shard entries must be strings", path);
        }
        cap += strlen(s->valuestring) + 1;
    }
    char *list = malloc(cap);
    if (!list) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    list[0] = '\0';
    cJSON_ArrayForEach(s, shards)
    {
        if (list[0]) strcat(list, ",");
        strcat(list, s->valuestring);
    }
    rc = add_shards_from_list(c, list);
    free(list);
    cJSON *af = cJSON_GetObjectItemCaseSensitive(root, "auth_file");
    if (!rc && cJSON_IsString(af) && af->valuestring[0]) {
        /* A relative auth file is relative to the cluster file's folder. */
        if (af->valuestring[0] == '/') {
            *auth_path = strdup(af->valuestring);
        } else {
            char *dup = strdup(path);
            const char *dir = dup ? dirname(dup) : ".";
            size_t n = strlen(dir) + strlen(af->valuestring) + 2;
            *auth_path = malloc(n);
            if (*auth_path) snprintf(*auth_path, n, "%s/%s", dir, af->valuestring);
            free(dup);
        }
        if (!*auth_path) rc = gr_seterr(GR_ENOMEM, "out of memory");
    }
    cJSON_Delete(root);
    return rc;
}

int gr_client_create(const gr_client_config *cfg, gr_client **out)
{
    *out = NULL;
    if (!cfg || (!cfg->servers == !cfg->cluster_file))
        return gr_seterr(GR_EINVAL, "give either a server list or a cluster file");
    gr_client *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "cannot allocate a client");
    c->link.cfg = *cfg;
    gr_client_config d;
    gr_client_config_default(&d);
    if (!c->link.cfg.connect_timeout_ms) c->link.cfg.connect_timeout_ms = d.connect_timeout_ms;
    if (!c->link.cfg.request_timeout_ms) c->link.cfg.request_timeout_ms = d.request_timeout_ms;
    if (!c->link.cfg.backoff_initial_ms) c->link.cfg.backoff_initial_ms = d.backoff_initial_ms;
    if (!c->link.cfg.backoff_max_ms) c->link.cfg.backoff_max_ms = d.backoff_max_ms;
    c->link.cfg.servers = c->link.cfg.cluster_file = c->link.cfg.auth_file = NULL;
    c->link.cfg.secret = NULL;
    atomic_init(&c->link.next_id, 1);
    char *auth_path = NULL;
    int rc = cfg->servers ? add_shards_from_list(c, cfg->servers)
                          : load_cluster_file(c, cfg->cluster_file, &auth_path);
    if (!rc && cfg->slice_us && (cfg->slice_us < 100 || cfg->slice_us > 100000))
        rc = gr_seterr(GR_EINVAL, "slice_us must be 0 (the kernel's default) or 100..100000, "
                       "got %u", cfg->slice_us);
    if (!rc && cfg->any_shard && c->link.nshards != 1)
        rc = gr_seterr(GR_EINVAL, "any_shard needs exactly one server");
    if (!rc && cfg->secret) {
        if (!cfg->secret_len) rc = gr_seterr(GR_EINVAL, "empty secret");
        c->link.secret = malloc(cfg->secret_len ? cfg->secret_len : 1);
        if (!rc && !c->link.secret) rc = gr_seterr(GR_ENOMEM, "out of memory");
        if (!rc) {
            memcpy(c->link.secret, cfg->secret, cfg->secret_len);
            c->link.secret_len = cfg->secret_len;
        }
    } else if (!rc && (cfg->auth_file || auth_path)) {
        rc = read_secret(cfg->auth_file ? cfg->auth_file : auth_path, &c->link.secret, &c->link.secret_len);
    }
    free(auth_path);
    for (uint32_t i = 0; !rc && i < c->link.nshards; i++) rc = cl_conn_ensure(&c->conns[i]);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        gr_client_destroy(c);
        return gr_seterr(rc, "%s", msg);
    }
    *out = c;
    return GR_OK;
}

void gr_client_destroy(gr_client *c)
{
    if (!c) return;
    for (uint32_t i = 0; i < c->link.nshards; i++) cl_conn_fini(&c->conns[i]);
    free(c->conns);
    if (c->link.secret) OPENSSL_cleanse(c->link.secret, c->link.secret_len);
    free(c->link.secret);
    free(c);
}

uint32_t gr_client_shards(const gr_client *c) { return c->link.nshards; }

const char *gr_client_shard_addr(const gr_client *c, uint32_t shard)
{
    return shard < c->link.nshards ? c->conns[shard].addr : NULL;
}

void gr_client_get_stats(gr_client *c, gr_client_stats_t *st)
{
    memset(st, 0, sizeof *st);
    st->requests = atomic_load(&c->link.requests);
    st->bytes_sent = atomic_load(&c->link.bytes_sent);
    st->bytes_received = atomic_load(&c->link.bytes_received);
    st->keys_in = atomic_load(&c->keys_in);
    st->keys_sent = atomic_load(&c->keys_sent);
    st->direct_calls = atomic_load(&c->direct_calls);
    st->direct_ns = atomic_load(&c->direct_ns);
    st->reconnects = atomic_load(&c->link.reconnects);
    st->plan_ns = atomic_load(&c->plan_ns);
    st->frame_ns = atomic_load(&c->frame_ns);
    st->send_ns = atomic_load(&c->link.send_ns);
    st->recv_ns = atomic_load(&c->link.recv_ns);
    st->scatter_ns = atomic_load(&c->scatter_ns);
}

/* ---- coordination ---- */

int gr_client_set_epoch(gr_client *c, uint32_t epoch)
{
    if (epoch > GR_PROTO_EPOCH_MAX)
        return gr_seterr(GR_EINVAL, "layout epoch %u is over the limit of %u", epoch,
                         GR_PROTO_EPOCH_MAX);
    atomic_store(&c->link.epoch, epoch);
    return GR_OK;
}

uint32_t gr_client_epoch(const gr_client *c)
{
    return atomic_load(&((gr_client *)c)->link.epoch);
}

void gr_client_set_stale_hook(gr_client *c, gr_client_stale_fn fn, void *ctx)
{
    c->link.stale_fn = fn;
    c->link.stale_ctx = ctx;
}

int gr_client_set_shard_addr(gr_client *c, uint32_t shard, const char *addr)
{
    if (!c || shard >= c->link.nshards || !addr)
        return gr_seterr(GR_EINVAL, "no shard %u to re-point", shard);
    return cl_conn_set_addr(&c->conns[shard], addr);
}
