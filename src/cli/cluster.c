/* `granary cluster up|status`: the subcommands over a coordinated job. `status` reads the
 * job from the coordinator (layout, members, chief) and prints it, as text or JSON; `up`
 * starts and supervises local shard processes (cluster_up.c). */
#include "cli/cli.h"
#include "cli/cluster.h"
#include "cli/opts.h"
#include "granary/coord.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STATUS_OPTIONS(X)                                                                      \
    X(CS_COORD, "coord", GR_CLI_STR, "coord", 0, 0, NULL, "zk://HOSTS/PATH", NULL,              \
      "the job's coordinator (or a static server list / cluster file); required")            \
    X(CS_JSON, "json", GR_CLI_FLAG, "json", 0, 0, NULL, NULL, NULL, "print one JSON object")    \
    X(CS_TIMEOUT, "timeout", GR_CLI_INT, "timeout_ms", 100, 600000, NULL, "MS", "5000",         \
      "give up when the coordinator does not answer within MS")

enum { STATUS_OPTIONS(GR_CLI_ENUM) CS_COUNT };
static const gr_cli_opt status_opts[] = {STATUS_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec status_spec = {
    .command = "cluster status",
    .synopsis = "granary cluster status --coord zk://HOSTS/PATH [--json]",
    .opts = status_opts,
    .n_opts = CS_COUNT,
    .config_section = "cluster",
    .epilog = "Prints the layout's epoch, each shard (index, address, slots, member, pid when\n"
              "the process runs on this machine), the standbys, the workers and the chief,\n"
              "and the ranks of `granary train --job-workers` processes.\n",
};

/* What `cluster status` gathered. */
typedef struct job_view {
    bool have_layout;
    gr_coord_layout layout;
    gr_coord_member *members;
    size_t n_members;
    bool have_chief;
    gr_coord_member chief;
    char host[GR_COORD_HOST_MAX];
    /* The run of `granary train --job-workers N` processes (the job value "workers",
     * cli/train_job.c), or NULL when there is none. */
    cJSON *run;
} job_view;

static const gr_coord_member *member_by_id(const job_view *j, const char *id)
{
    for (size_t i = 0; id[0] && i < j->n_members; i++)
        if (!strcmp(j->members[i].id, id)) return &j->members[i];
    return NULL;
}

/* The member serving shard i: the one the layout names, else a shard member claiming index
 * i at the layout's address (a static layout names no members). */
static const gr_coord_member *shard_member(const job_view *j, uint32_t i)
{
    const gr_coord_shard *s = &j->layout.shards[i];
    const gr_coord_member *m = member_by_id(j, s->member);
    for (size_t k = 0; !m && k < j->n_members; k++)
        if (j->members[k].role == GR_COORD_SHARD && j->members[k].index == (int32_t)i &&
            !strcmp(j->members[k].address, s->address))
            m = &j->members[k];
    return m;
}

static bool local(const job_view *j, const gr_coord_member *m)
{
    return m && m->pid > 0 && !strcmp(m->host, j->host);
}

static uint32_t slots_of(const gr_coord_layout *l, uint32_t shard, char *ranges, size_t cap)
{
    uint32_t n = 0;
    size_t off = 0;
    if (cap) ranges[0] = '\0';
    for (uint32_t s = 0; s < GR_SLOTS; s++) {
        if (l->slot_map[s] != shard) continue;
        uint32_t e = s;
        while (e + 1 < GR_SLOTS && l->slot_map[e + 1] == shard) e++;
        n += e - s + 1;
        int w = snprintf(ranges + off, off < cap ? cap - off : 0, "%s%u-%u", off ? "," : "", s, e);
        if (w > 0) off += (size_t)w;
        if (off >= cap && cap) strcpy(ranges + cap - 4, "...");
        s = e;
    }
    return n;
}

static const char *claim_member(const cJSON *claim)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(claim, "member");
    return cJSON_IsString(m) ? m->valuestring : "";
}

/* The worker processes' run: its ranks, who holds each and in what state. */
static void print_run(const job_view *j)
{
    const cJSON *r = j->run;
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(r, "run");
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(r, "ckpt");
    const cJSON *claims = cJSON_GetObjectItemCaseSensitive(r, "claims");
    printf("worker processes: run %s, %d ranks, %s", cJSON_IsString(run) ? run->valuestring : "?",
           cJSON_GetArraySize(claims),
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "done"))    ? "done"
           : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "ready")) ? "training"
                                                                        : "starting");
    if (cJSON_IsString(ck) && ck->valuestring[0]) printf(", last checkpoint %s", ck->valuestring);
    printf("\n");
    for (int i = 0; i < cJSON_GetArraySize(claims); i++) {
        const cJSON *cl = cJSON_GetArrayItem(claims, i);
        if (!cJSON_IsObject(cl)) {
            printf("  rank %-3d (free)\n", i);
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(cl, "state");
        const gr_coord_member *m = member_by_id(j, claim_member(cl));
        printf("  rank %-3d %-30s %s%s", i, claim_member(cl),
               cJSON_IsString(st) ? st->valuestring : "?", m ? "" : " (gone)");
        if (local(j, m)) printf("  pid %lld", (long long)m->pid);
        if (m && j->have_chief && !strcmp(m->id, j->chief.id)) printf("  chief");
        printf("\n");
    }
}

static cJSON *member_json(const job_view *j, const gr_coord_member *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "role", gr_coord_role_name((int)m->role));
    cJSON_AddNumberToObject(o, "index", m->index);
    cJSON_AddStringToObject(o, "address", m->address);
    cJSON_AddStringToObject(o, "host", m->host);
    if (local(j, m)) cJSON_AddNumberToObject(o, "pid", (double)m->pid);
    return o;
}

static void print_json(const char *spec, const job_view *j)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "coord", spec);
    if (j->have_layout) {
        cJSON_AddNumberToObject(root, "epoch", (double)j->layout.epoch);
        cJSON_AddNumberToObject(root, "version", (double)j->layout.version);
    } else {
        cJSON_AddNullToObject(root, "epoch");
    }
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    for (uint32_t i = 0; j->have_layout && i < j->layout.n_shards; i++) {
        const gr_coord_shard *s = &j->layout.shards[i];
        const gr_coord_member *m = shard_member(j, i);
        char ranges[256];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", i);
        cJSON_AddStringToObject(o, "address", s->address);
        cJSON_AddNumberToObject(o, "slots", slots_of(&j->layout, i, ranges, sizeof ranges));
        cJSON_AddStringToObject(o, "slot_ranges", ranges);
        cJSON_AddStringToObject(o, "member", m ? m->id : s->member);
        /* Up: a registered member serves it (static layouts have none to ask). */
        if (m) cJSON_AddBoolToObject(o, "up", true);
        else if (s->member[0] || !s->address[0]) cJSON_AddBoolToObject(o, "up", false);
        if (m) cJSON_AddStringToObject(o, "host", m->host);
        if (local(j, m)) cJSON_AddNumberToObject(o, "pid", (double)m->pid);
        cJSON_AddItemToArray(shards, o);
    }
    cJSON *standbys = cJSON_AddArrayToObject(root, "standbys");
    cJSON *workers = cJSON_AddArrayToObject(root, "workers");
    for (size_t i = 0; i < j->n_members; i++) {
        const gr_coord_member *m = &j->members[i];
        if (m->role == GR_COORD_STANDBY) cJSON_AddItemToArray(standbys, member_json(j, m));
        if (m->role == GR_COORD_WORKER) cJSON_AddItemToArray(workers, member_json(j, m));
    }
    if (j->have_chief) cJSON_AddItemToObject(root, "chief", member_json(j, &j->chief));
    else cJSON_AddNullToObject(root, "chief");
    /* The worker processes' run as stored, each claim with "up": its member is registered. */
    if (j->run) {
        cJSON *run = cJSON_Duplicate(j->run, true);
        cJSON *cl;
        cJSON_ArrayForEach(cl, cJSON_GetObjectItemCaseSensitive(run, "claims"))
            if (cJSON_IsObject(cl))
                cJSON_AddBoolToObject(cl, "up", member_by_id(j, claim_member(cl)) != NULL);
        cJSON_AddItemToObject(root, "worker_run", run);
    } else {
        cJSON_AddNullToObject(root, "worker_run");
    }
    char *text = cJSON_PrintUnformatted(root);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(root);
}

static void print_member_line(const job_view *j, const gr_coord_member *m)
{
    printf("  %-30s", m->id);
    if (m->index >= 0) printf(" %s %d", gr_coord_role_name((int)m->role), m->index);
    if (m->address[0]) printf("  %s", m->address);
    if (local(j, m)) printf("  pid %lld", (long long)m->pid);
    else if (m->host[0]) printf("  on %s", m->host);
    printf("\n");
}

static void print_text(const char *spec, const job_view *j)
{
    printf("job %s\n", spec);
    if (!j->have_layout) printf("no layout yet (no shard has joined)\n");
    else
        printf("epoch %llu (layout version %lld), %u shards\n",
               (unsigned long long)j->layout.epoch, (long long)j->layout.version,
               j->layout.n_shards);
    for (uint32_t i = 0; j->have_layout && i < j->layout.n_shards; i++) {
        const gr_coord_shard *s = &j->layout.shards[i];
        const gr_coord_member *m = shard_member(j, i);
        char ranges[64];
        uint32_t n = slots_of(&j->layout, i, ranges, sizeof ranges);
        printf("  shard %-4u %-22s slots %s (%u)", i, s->address[0] ? s->address : "(vacant)",
               ranges, n);
        if (m) printf("  %s", m->id);
        if (local(j, m)) printf("  pid %lld", (long long)m->pid);
        else if (m) printf("  on %s", m->host);
        else if (s->member[0]) printf("  LOST (member %s is gone)", s->member);
        printf("\n");
    }
    size_t ns = 0, nw = 0;
    for (size_t i = 0; i < j->n_members; i++) {
        ns += j->members[i].role == GR_COORD_STANDBY;
        nw += j->members[i].role == GR_COORD_WORKER;
    }
    printf("standbys: %zu\n", ns);
    for (size_t i = 0; i < j->n_members; i++)
        if (j->members[i].role == GR_COORD_STANDBY) print_member_line(j, &j->members[i]);
    printf("workers: %zu\n", nw);
    for (size_t i = 0; i < j->n_members; i++)
        if (j->members[i].role == GR_COORD_WORKER) print_member_line(j, &j->members[i]);
    if (j->have_chief) {
        printf("chief:");
        print_member_line(j, &j->chief);
    } else {
        printf("chief: none\n");
    }
    if (j->run) print_run(j);
}

static int gather(gr_coord *c, job_view *j)
{
    int rc = gr_coord_layout_get(c, &j->layout);
    if (rc && rc != GR_ENOENT) return rc;
    j->have_layout = rc == 0;
    if ((rc = gr_coord_members(c, &j->members, &j->n_members))) return rc;
    rc = gr_coord_leader(c, &j->chief);
    if (rc && rc != GR_ENOENT) return rc;
    j->have_chief = rc == 0;
    char *run = NULL;
    rc = gr_coord_value_get(c, "workers", &run, NULL);
    if (rc && rc != GR_ENOENT) return rc;
    j->run = run ? cJSON_Parse(run) : NULL;
    free(run);
    if (gethostname(j->host, sizeof j->host) != 0) j->host[0] = '\0';
    j->host[sizeof j->host - 1] = '\0';
    return 0;
}

static int cluster_status(int argc, char **argv)
{
    gr_cli_value v[CS_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&status_spec, argc, argv, v, &p);
    if (status >= 0) {
        gr_cli_parsed_fini(&p);
        return status;
    }
    status = 1;
    gr_coord *c = NULL;
    job_view j;
    memset(&j, 0, sizeof j);
    if (!v[CS_COORD].s) {
        fprintf(stderr, "granary cluster status: --coord is required (see --help)\n");
        status = 2;
        goto out;
    }
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.connect_timeout_ms = (uint32_t)v[CS_TIMEOUT].i;
    if (gr_coord_open(v[CS_COORD].s, &o, &c) || gather(c, &j)) {
        fprintf(stderr, "granary cluster status: %s\n", gr_errmsg());
        goto out;
    }
    if (v[CS_JSON].b) print_json(v[CS_COORD].s, &j);
    else print_text(v[CS_COORD].s, &j);
    status = 0;
out:
    fflush(stdout);
    gr_coord_close(c);
    gr_coord_layout_fini(&j.layout);
    free(j.members);
    cJSON_Delete(j.run);
    gr_cli_parsed_fini(&p);
    return status;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: granary cluster up --coord zk://HOSTS/PATH --shards N [--standby K] "
               "[--ckpt-dir DIR] [options]\n"
               "       granary cluster status --coord zk://HOSTS/PATH [--json]\n"
               "`granary cluster up --help` and `granary cluster status --help` list the "
               "options.\n");
}

int gr_cli_cluster(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* argv[1] is the subcommand; its options follow. */
    if (!strcmp(argv[1], "status")) return cluster_status(argc - 1, argv + 1);
    if (!strcmp(argv[1], "up")) return gr_cli_cluster_up(argc - 1, argv + 1);
    fprintf(stderr, "granary cluster: unknown subcommand '%s' (want up or status)\n", argv[1]);
    return 2;
}
