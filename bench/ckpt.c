/* `granary bench ckpt`: save and restore of one Adagrad table (dim 64) as a one-shard
 * checkpoint, against `cp` + `sync` of a file of the same size on the same disk as the
 * baseline (both fsync their output, neither drops the page cache). While the save runs, a
 * thread does read-only lookups of 8 random keys, 100 us apart, and records the longest one:
 * the pause a training or serving thread would see. Also an incremental save after 1% of the
 * rows changed. Then the same through the servers: a 2-shard embedded cluster saves (CKPT_SAVE
 * + CKPT_COMMIT) while another client pulls 8 random keys every 100 us (the longest pull is the
 * pause a worker would see), and a 3-shard cluster restores it. The restore is also timed into
 * new tables against tables prepared first (gr_table_prefault, a warm standby's), alternating,
 * with the CPU time of each (medians of 3). */
#include "bench/bench.h"
#include "cli/opts.h"
#include "granary/ckpt.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM 64
#define WARM_ROUNDS 3

/* CPU seconds this process has used (every thread, user + system). */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double median3(const double v[3])
{
    double a = v[0], b = v[1], c = v[2];
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* One restore of the checkpoint into a new table (prepared for every row first when
 * `prefault`, as a warm standby's is, docs/coord.md): its wall and CPU seconds, and the
 * preparation's wall seconds (not part of the restore). */
static int timed_restore(const gr_table_spec *sp, const char *ckdir, uint64_t rows, bool prefault,
                         double *wall, double *cpu, double *prep)
{
    gr_table *u = NULL;
    int rc = gr_table_create(sp, &u);
    double p0 = gr_now_s();
    if (!rc && prefault) rc = gr_table_prefault(u, rows);
    *prep = gr_now_s() - p0;
    double t0 = gr_now_s(), c0 = cpu_s();
    gr_ckpt_load_stats ls;
    if (!rc) rc = gr_ckpt_load(ckdir, &u, 1, NULL, &ls);
    *wall = gr_now_s() - t0;
    *cpu = cpu_s() - c0;
    if (!rc && ls.rows_loaded != rows)
        rc = gr_seterr(GR_EINTERNAL, "restored %llu rows of %llu",
                       (unsigned long long)ls.rows_loaded, (unsigned long long)rows);
    gr_table_destroy(u);
    return rc;
}

typedef struct opts {
    bool json, full, keep;
    uint64_t rows;
    int zstd;
    const char *dir;
} opts;

/* Every option of `granary bench ckpt`, declared once. --rows has no default in the table
 * because its default follows --full. */
#define CKPT_BENCH_OPTIONS(X)                                                                  \
    X(CB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")    \
    X(CB_FULL, "full", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "10M rows unless --rows")     \
    X(CB_ROWS, "rows", GR_CLI_INT, NULL, 1, 4294967295.0, NULL, "N", NULL,                     \
      "rows (default 2M; --full 10M)")                                                         \
    X(CB_ZSTD, "zstd", GR_CLI_INT, NULL, 0, 19, NULL, "L",                                      \
      "0", "compress sections with zstd level L (0: raw)")                                     \
    X(CB_DIR, "dir", GR_CLI_STR, NULL, 0, 0, NULL, "PATH", NULL,                                \
      "where to write (default $TMPDIR or /tmp); removed afterwards")                          \
    X(CB_KEEP, "keep", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "do not remove the checkpoint")

enum { CKPT_BENCH_OPTIONS(GR_CLI_ENUM) CB_COUNT };
static const gr_cli_opt ckpt_bench_opts[] = {CKPT_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec ckpt_bench_spec = {
    .command = "bench ckpt",
    .synopsis =
        "granary bench ckpt [--json] [--full] [--rows N] [--zstd L] [--dir PATH] [--keep]\n"
        "  one table, dim 64, Adagrad state; save (full), restore, cp+sync baseline,\n"
        "  longest concurrent lookup during the save, and a delta save after 1% changes;\n"
        "  then through the servers: 2 shards save while a client pulls, 3 shards restore",
    .opts = ckpt_bench_opts,
    .n_opts = CB_COUNT,
};

static uint64_t key_of(uint64_t i)
{
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills the table with n rows of random weights and accumulators, in batches. */
static int fill(gr_table *t, uint64_t n)
{
    const size_t B = 4096;
    uint64_t *keys = malloc(B * 8);
    float *w = malloc(B * DIM * 4), *s = malloc(B * DIM * 4);
    if (!keys || !w || !s) {
        free(keys);
        free(w);
        free(s);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    gr_rng r;
    gr_rng_seed(&r, 1);
    int rc = GR_OK;
    for (uint64_t i = 0; i < n && rc == GR_OK; i += B) {
        size_t m = n - i < B ? (size_t)(n - i) : B;
        for (size_t j = 0; j < m; j++) keys[j] = key_of(i + j);
        for (size_t j = 0; j < m * DIM; j++) {
            uint64_t x = gr_rng_next(&r);
            w[j] = (float)((int32_t)(uint32_t)x) * 1e-11f;
            s[j] = (float)(uint32_t)(x >> 32) * 1e-10f;
        }
        rc = gr_table_insert(t, keys, m, w, s, NULL);
    }
    free(keys);
    free(w);
    free(s);
    return rc;
}

typedef struct prober {
    gr_table *t;
    uint64_t rows;
    atomic_int stop;
    uint64_t max_ns, calls;
} prober;

static void *probe_main(void *arg)
{
    prober *p = arg;
    gr_rng r;
    gr_rng_seed(&r, 7);
    uint64_t keys[8];
    float out[8 * DIM];
    while (!atomic_load(&p->stop)) {
        for (int i = 0; i < 8; i++) keys[i] = key_of(gr_rng_next(&r) % p->rows);
        uint64_t t0 = gr_now_ns();
        gr_table_lookup(p->t, keys, 8, out, GR_LOOKUP_READONLY);
        uint64_t d = gr_now_ns() - t0;
        if (d > p->max_ns) p->max_ns = d;
        p->calls++;
        /* A training thread computes between lookups; spinning here would take a whole core
         * from the save on a 2-core machine and measure CPU contention, not the save. */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---- through the servers ---- */

typedef struct net_prober {
    gr_client *c;
    uint64_t rows;
    atomic_int stop;
    uint64_t max_ns, calls;
    int rc;
} net_prober;

static void *net_probe_main(void *arg)
{
    net_prober *p = arg;
    gr_rng r;
    gr_rng_seed(&r, 9);
    uint64_t keys[8];
    float out[8 * DIM];
    while (!atomic_load(&p->stop)) {
        for (int i = 0; i < 8; i++) keys[i] = key_of(gr_rng_next(&r) % p->rows);
        uint64_t t0 = gr_now_ns();
        if ((p->rc = gr_client_pull_many(p->c, &(gr_client_batch){1, DIM, 8, keys, out, NULL, 0}, 1,
                                         GR_CLIENT_READONLY)))
            break;
        uint64_t d = gr_now_ns() - t0;
        if (d > p->max_ns) p->max_ns = d;
        p->calls++;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static gr_client *bench_client(const char *servers)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    cc.request_timeout_ms = 120000;
    gr_client *c = NULL;
    return gr_client_create(&cc, &c) == GR_OK ? c : NULL;
}

typedef struct net_result {
    double fill_s, save_s, restore_s, idle_max_ms, save_max_ms, shard_s;
    uint64_t bytes, calls;
} net_result;

/* 2 shards save, 3 shards restore. */
static int server_part(const opts *o, const char *root, net_result *nr)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/servers", root);
    gr_local_cluster *a = NULL, *b = NULL;
    gr_client *c = NULL, *c2 = NULL, *cb = NULL;
    uint64_t *keys = NULL;
    float *g = NULL;
    int rc = gr_local_cluster_start(2, 2, &a);
    if (!rc) c = bench_client(gr_local_cluster_servers(a));
    if (!rc) c2 = bench_client(gr_local_cluster_servers(a));
    if (!rc && (!c || !c2)) rc = GR_ECONN;
    char spec[256];
    snprintf(spec, sizeof spec, "{\"name\":\"bench\",\"id\":1,\"dim\":%d,\"partitions\":256,"
             "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05}}", DIM);
    if (!rc) rc = gr_client_create_table(c, spec);
    const size_t B = 32768;
    keys = malloc(B * 8);
    g = malloc(B * DIM * 4);
    if (!rc && (!keys || !g)) rc = gr_seterr(GR_ENOMEM, "out of memory");
    double t0 = gr_now_s();
    for (uint64_t i = 0; !rc && i < o->rows; i += B) {
        size_t m = o->rows - i < B ? (size_t)(o->rows - i) : B;
        for (size_t j = 0; j < m; j++) keys[j] = key_of(i + j);
        for (size_t j = 0; j < m * DIM; j++) g[j] = (float)((j * 7 + i) % 13) * 0.01f - 0.06f;
        rc = gr_client_push(c, 1, DIM, keys, m, g);
    }
    nr->fill_s = gr_now_s() - t0;
    net_prober pb = {c2, o->rows, 0, 0, 0, 0};
    pthread_t th;
    if (!rc) {
        pthread_create(&th, NULL, net_probe_main, &pb);
        gr_sleep_ms(300);
        atomic_store(&pb.stop, 1);
        pthread_join(th, NULL);
        nr->idle_max_ms = pb.max_ns / 1e6;
        atomic_store(&pb.stop, 0);
        pb.max_ns = pb.calls = 0;
        pthread_create(&th, NULL, net_probe_main, &pb);
        gr_client_ckpt_opts co = {.root = dir, .step = 1, .zstd_level = o->zstd};
        gr_client_ckpt_info info;
        t0 = gr_now_s();
        rc = gr_client_ckpt_save(c, &co, &info);
        nr->save_s = gr_now_s() - t0;
        atomic_store(&pb.stop, 1);
        pthread_join(th, NULL);
        if (!rc && pb.rc) rc = pb.rc;
        nr->save_max_ms = pb.max_ns / 1e6;
        nr->calls = pb.calls;
        nr->bytes = info.bytes;
        nr->shard_s = info.shard_seconds_max;
    }
    if (!rc) rc = gr_local_cluster_start(3, 2, &b);
    if (!rc && !(cb = bench_client(gr_local_cluster_servers(b)))) rc = GR_ECONN;
    if (!rc) {
        gr_client_ckpt_loaded ld;
        t0 = gr_now_s();
        rc = gr_client_ckpt_load(cb, dir, NULL, false, &ld);
        nr->restore_s = gr_now_s() - t0;
        if (!rc && ld.rows != o->rows)
            rc = gr_seterr(GR_EINTERNAL, "restored %llu rows of %llu", (unsigned long long)ld.rows,
                           (unsigned long long)o->rows);
        if (!rc) free(ld.meta);
    }
    free(keys);
    free(g);
    gr_client_destroy(c);
    gr_client_destroy(c2);
    gr_client_destroy(cb);
    gr_local_cluster_stop(a);
    gr_local_cluster_stop(b);
    return rc;
}

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return rc == 0 ? 0 : -1;
}

int gr_bench_ckpt(int argc, char **argv)
{
    gr_cli_value v[CB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&ckpt_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    opts o = {.json = v[CB_JSON].b,
              .full = v[CB_FULL].b,
              .keep = v[CB_KEEP].b,
              .rows = (uint64_t)v[CB_ROWS].i,
              .zstd = (int)v[CB_ZSTD].i,
              .dir = v[CB_DIR].s};
    if (!o.rows) o.rows = o.full ? 10000000ull : 2000000ull;
    const char *base = o.dir ? o.dir : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char root[1024], ckdir[1100], copy[1100], src[1200], cmd[4096];
    snprintf(root, sizeof root, "%s/granary-bench-ckpt-%d", base, (int)getpid());
    snprintf(ckdir, sizeof ckdir, "%s/full", root);
    snprintf(copy, sizeof copy, "%s/cp-baseline.bin", root);
    if (mkdir(root, 0755) != 0) {
        fprintf(stderr, "granary bench ckpt: cannot create %s\n", root);
        return 1;
    }

    gr_table_spec sp;
    gr_table_spec_default(&sp, "bench", DIM);
    sp.opt.kind = GR_OPT_ADAGRAD;
    sp.opt.lr = 0.05f;
    sp.partitions = 256;
    gr_table *t = NULL, *u = NULL;
    int rc = gr_table_create(&sp, &t);
    int status = 1;
    double t0 = gr_now_s();
    if (rc == GR_OK) rc = fill(t, o.rows);
    if (rc != GR_OK) goto fail;
    fprintf(stderr, "filled %" PRIu64 " rows in %.1f s\n", o.rows, gr_now_s() - t0);

    /* Lookup latency with nothing else running: the floor the pause is measured against. */
    prober pb = {t, o.rows, 0, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, probe_main, &pb);
    gr_sleep_ms(300);
    atomic_store(&pb.stop, 1);
    pthread_join(th, NULL);
    double idle_max_ms = pb.max_ns / 1e6;

    /* Save, with the prober running. */
    atomic_store(&pb.stop, 0);
    pb.max_ns = pb.calls = 0;
    pthread_create(&th, NULL, probe_main, &pb);
    gr_ckpt_write_opts wo = {.kind = GR_CKPT_FULL, .shard = 0, .shards = 1, .step = 1,
                             .zstd_level = o.zstd};
    gr_ckpt_file_info fi;
    t0 = gr_now_s();
    rc = gr_ckpt_write_shard(ckdir, &t, 1, &wo, &fi);
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    if (rc == GR_OK) rc = gr_ckpt_commit(ckdir, &co);
    double save_s = gr_now_s() - t0;
    atomic_store(&pb.stop, 1);
    pthread_join(th, NULL);
    if (rc != GR_OK) goto fail;
    double max_pause_ms = pb.max_ns / 1e6;
    uint64_t bytes = fi.size;

    /* Restore into a fresh table. */
    rc = gr_table_create(&sp, &u);
    if (rc != GR_OK) goto fail;
    gr_ckpt_load_stats ls;
    t0 = gr_now_s();
    rc = gr_ckpt_load(ckdir, &u, 1, NULL, &ls);
    double restore_s = gr_now_s() - t0;
    if (rc != GR_OK) goto fail;
    if (ls.rows_loaded != o.rows) {
        fprintf(stderr, "granary bench ckpt: restored %" PRIu64 " rows of %" PRIu64 "\n",
                ls.rows_loaded, o.rows);
        goto fail_quiet;
    }
    {
        /* Spot check: 1000 rows bitwise equal. */
        uint64_t keys[1000];
        static float a[1000 * DIM], b[1000 * DIM], sa[1000 * DIM], sb[1000 * DIM];
        for (int i = 0; i < 1000; i++) keys[i] = key_of((uint64_t)i * (o.rows / 1000));
        gr_table_get(t, keys, 1000, a, sa, NULL, NULL);
        gr_table_get(u, keys, 1000, b, sb, NULL, NULL);
        if (memcmp(a, b, sizeof a) || memcmp(sa, sb, sizeof sa)) {
            fprintf(stderr, "granary bench ckpt: restored rows differ\n");
            goto fail_quiet;
        }
    }
    gr_table_destroy(u);
    u = NULL;
    /* The same restore into new tables and into prepared ones, alternating: CPU time is what
     * the page faults cost, whatever else the machine runs. */
    double fw[WARM_ROUNDS], fc[WARM_ROUNDS], pw[WARM_ROUNDS], pc[WARM_ROUNDS], pp[WARM_ROUNDS], unused;
    for (int k = 0; rc == GR_OK && k < WARM_ROUNDS; k++) {
        rc = timed_restore(&sp, ckdir, o.rows, false, &fw[k], &fc[k], &unused);
        if (rc == GR_OK) rc = timed_restore(&sp, ckdir, o.rows, true, &pw[k], &pc[k], &pp[k]);
    }
    if (rc != GR_OK) goto fail;
    double fresh_s = median3(fw), fresh_cpu = median3(fc), warm_s = median3(pw);
    double warm_cpu = median3(pc), prefault_s = median3(pp);

    /* Baseline: cp of the shard file to the same disk, then sync of the copy. */
    char fname[GR_CKPT_NAME_MAX];
    gr_ckpt_shard_file_name(0, 1, fname);
    snprintf(src, sizeof src, "%s/%s", ckdir, fname);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && sync '%s'", src, copy, copy);
    t0 = gr_now_s();
    if (run_cmd(cmd) != 0) {
        fprintf(stderr, "granary bench ckpt: '%s' failed\n", cmd);
        goto fail_quiet;
    }
    double cp_s = gr_now_s() - t0;
    unlink(copy);

    /* Incremental: 1% of the rows change, then a delta on top of the full checkpoint. */
    {
        uint64_t n = o.rows / 100 ? o.rows / 100 : 1;
        uint64_t *keys = malloc(n * 8);
        float *g = malloc(n * DIM * 4);
        for (uint64_t i = 0; i < n; i++) keys[i] = key_of(i * 100);
        for (uint64_t i = 0; i < n * DIM; i++) g[i] = 0.01f;
        rc = keys && g ? gr_table_apply(t, keys, n, g) : GR_ENOMEM;
        free(keys);
        free(g);
        if (rc != GR_OK) goto fail;
    }
    char ddir[1100];
    snprintf(ddir, sizeof ddir, "%s/delta", root);
    wo.kind = GR_CKPT_DELTA;
    wo.step = 2;
    gr_ckpt_file_info di;
    t0 = gr_now_s();
    rc = gr_ckpt_write_shard(ddir, &t, 1, &wo, &di);
    gr_ckpt_commit_opts dco = {1, NULL, "full"};
    if (rc == GR_OK) rc = gr_ckpt_commit(ddir, &dco);
    double delta_s = gr_now_s() - t0;
    if (rc != GR_OK) goto fail;

    /* The library's tables are no longer needed: free them before the servers fill theirs. */
    gr_table_destroy(t);
    t = NULL;
    net_result nr;
    memset(&nr, 0, sizeof nr);
    gr_log_level lvl = gr_log_get_level();
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_WARN);
    rc = server_part(&o, root, &nr);
    gr_log_set_level(lvl);
    if (rc != GR_OK) goto fail;

    double save_bps = bytes / save_s, restore_bps = bytes / restore_s, cp_bps = bytes / cp_s;
    printf("checkpoint of %" PRIu64 " rows x dim %d, Adagrad (%.2f GB, %s)\n", o.rows, DIM,
           bytes / 1e9, o.zstd ? "zstd" : "raw sections");
    printf("  %-34s %8.2f s  %8.0f MB/s  (%.2f x cp)\n", "save (read rows, write, fsync)", save_s,
           save_bps / 1e6, save_bps / cp_bps);
    printf("  %-34s %8.2f s  %8.0f MB/s  (%.2f x cp)\n", "restore (read, verify, insert)",
           restore_s, restore_bps / 1e6, restore_bps / cp_bps);
    printf("  %-34s %8.2f s  CPU %.2f s  (median of %d)\n", "restore into new tables", fresh_s,
           fresh_cpu, WARM_ROUNDS);
    printf("  %-34s %8.2f s  CPU %.2f s  (%.2f x the CPU; prepared in %.2f s before)\n",
           "restore into prepared tables", warm_s, warm_cpu, fresh_cpu > 0 ? warm_cpu / fresh_cpu : 0,
           prefault_s);
    printf("  %-34s %8.2f s  %8.0f MB/s\n", "baseline: cp + sync of the file", cp_s,
           cp_bps / 1e6);
    printf("  %-34s %8.2f ms  (idle: %.2f ms; %" PRIu64 " lookups during the save)\n",
           "longest lookup during the save", max_pause_ms, idle_max_ms, pb.calls);
    printf("  %-34s %8.2f s\n", "  of which the final fsync", fi.sync_seconds);
    printf("  %-34s %8.2f s  %8.1f MB  (%" PRIu64 " changed rows + %" PRIu64 " live keys)\n",
           "delta save after 1% changed", delta_s, di.size / 1e6, di.rows, di.keys);
    printf("through the servers (2 shards save, 3 restore; filled by pushes in %.1f s)\n",
           nr.fill_s);
    printf("  %-34s %8.2f s  %8.0f MB/s  (slowest shard %.2f s)\n", "save (both shards + commit)",
           nr.save_s, nr.bytes / nr.save_s / 1e6, nr.shard_s);
    printf("  %-34s %8.2f s  %8.0f MB/s\n", "restore onto 3 shards", nr.restore_s,
           nr.bytes / nr.restore_s / 1e6);
    printf("  %-34s %8.2f ms  (idle: %.2f ms; %" PRIu64 " pulls during the save)\n",
           "longest 8-key pull during the save", nr.save_max_ms, nr.idle_max_ms, nr.calls);
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "bench", "ckpt");
        cJSON_AddNumberToObject(j, "rows", (double)o.rows);
        cJSON_AddNumberToObject(j, "dim", DIM);
        cJSON_AddNumberToObject(j, "zstd", o.zstd);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON_AddNumberToObject(j, "save_s", save_s);
        cJSON_AddNumberToObject(j, "restore_s", restore_s);
        cJSON_AddNumberToObject(j, "cp_s", cp_s);
        cJSON_AddNumberToObject(j, "restore_new_s", fresh_s);
        cJSON_AddNumberToObject(j, "restore_new_cpu_s", fresh_cpu);
        cJSON_AddNumberToObject(j, "restore_prefaulted_s", warm_s);
        cJSON_AddNumberToObject(j, "restore_prefaulted_cpu_s", warm_cpu);
        cJSON_AddNumberToObject(j, "prefault_s", prefault_s);
        cJSON_AddNumberToObject(j, "delta_s", delta_s);
        cJSON_AddNumberToObject(j, "delta_bytes", (double)di.size);
        cJSON_AddNumberToObject(j, "idle_max_lookup_ms", idle_max_ms);
        cJSON_AddNumberToObject(j, "save_bytes_per_sec", save_bps);
        cJSON_AddNumberToObject(j, "restore_bytes_per_sec", restore_bps);
        cJSON_AddNumberToObject(j, "cp_bytes_per_sec", cp_bps);
        cJSON_AddNumberToObject(j, "max_pause_ms", max_pause_ms);
        cJSON_AddNumberToObject(j, "server_bytes", (double)nr.bytes);
        cJSON_AddNumberToObject(j, "server_save_s", nr.save_s);
        cJSON_AddNumberToObject(j, "server_restore_s", nr.restore_s);
        cJSON_AddNumberToObject(j, "server_idle_max_pull_ms", nr.idle_max_ms);
        cJSON_AddNumberToObject(j, "server_max_pull_ms", nr.save_max_ms);
        char *s = cJSON_PrintUnformatted(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    }
    status = 0;
    goto out;
fail:
    fprintf(stderr, "granary bench ckpt: %s (%s)\n", gr_errmsg(), gr_strerror(rc));
fail_quiet:
    status = 1;
out:
    gr_table_destroy(t);
    gr_table_destroy(u);
    if (!o.keep) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (run_cmd(cmd) != 0) fprintf(stderr, "granary bench ckpt: could not remove %s\n", root);
    } else {
        fprintf(stderr, "kept %s\n", root);
    }
    return status;
}
