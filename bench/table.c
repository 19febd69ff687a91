/* `granary bench table`: the table engine against the memory limit of its access pattern.
 * A table of N rows (dim 64, Adagrad) is filled, then batches of 4096 x 26 Zipf(1.05) ids are
 * looked up, and looked up + deduplicated + applied, from 1 and T threads. Baselines in the
 * same run: a flat-array gather of the same rows (huge pages, prefetched) and PyTorch's
 * EmbeddingBag + sparse Adagrad (bench/torch_embedding.py, when /usr/bin/python3 has torch). */
#include "bench/bench.h"
#include "cli/opts.h"
#include "granary/table.h"

#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIM 64
#define EXAMPLES 4096
#define BAG 26
#define IDS (EXAMPLES * BAG)
#define ZIPF_S 1.05
#define POOL_MAX 8
#define PERM_MUL 2654435761ull /* row = ((rank - 1) * PERM_MUL) % rows, as in the torch script */
#define MAX_THREADS 64

/* Every option of `granary bench table`, declared once. */
#define TABLE_BENCH_OPTIONS(X)                                                                 \
    X(TB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                               \
      "print a final JSON line with the figures")                                             \
    X(TB_FULL, "full", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "50M rows unless --rows")     \
    X(TB_ROWS, "rows", GR_CLI_INT, NULL, 1, 4294967295.0, NULL, "N", "10M", "table rows")      \
    X(TB_BATCHES, "batches", GR_CLI_INT, NULL, 1, 1000000, NULL, "B", "100",                    \
      "batches of 4096 x 26 ids per thread per measurement")                                  \
    X(TB_THREADS, "threads", GR_CLI_INT, NULL, 1, 64, NULL, "T", "2",                           \
      "measure with 1 and T threads")                                                         \
    X(TB_REPEAT, "repeat", GR_CLI_INT, NULL, 1, 100, NULL, "R", "1",                            \
      "measure the flat gather and the lookup R times, alternating, and report\n"             \
      "medians (for A/B comparisons on a busy machine)")                                       \
    X(TB_ONLY, "only", GR_CLI_CHOICE, NULL, 0, 0, "all|lookup", NULL, "all",                     \
      "lookup: skip the adagrad and PyTorch figures")                                          \
    X(TB_WIDE, "wide", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                                 \
      "also gather from a flat array at the table's 528-byte row stride, to\n"                \
      "separate the cost of the row layout from the cost of finding a row; and\n"             \
      "through a model index (8-byte buckets at load 0.7, read before the row):\n"            \
      "the two dependent misses of a lookup with no other work")

enum { TABLE_BENCH_OPTIONS(GR_CLI_ENUM) TB_COUNT };
static const gr_cli_opt table_bench_opts[] = {TABLE_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec table_bench_spec = {
    .command = "bench table",
    .synopsis = "granary bench table [--json] [--full] [--rows N] [--batches B] [--threads T]\n"
                "                          [--repeat R] [--only all|lookup] [--wide]",
    .opts = table_bench_opts,
    .n_opts = TB_COUNT,
};

typedef struct opts {
    uint64_t rows;
    unsigned batches, threads, repeat;
    bool json, full, lookup_only, wide;
} opts;

/* Keys are a fixed bijection of the Zipf rank, so hot keys land in all partitions. */
static uint64_t key_of_rank(uint64_t rank)
{
    uint64_t z = rank + 0x6a09e667f3bcc909ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct worker {
    pthread_t th;
    int id, kind;
    unsigned batches, pool_n;
    uint64_t **keys;  /* pool_n batches of IDS keys */
    uint32_t **rowix; /* the same ids as flat-array rows */
    float *out, *ugrad;
    uint64_t *uniq;
    uint32_t *inverse;
    gr_dedup_scratch scratch;
    gr_table *t;
    const float *flat;
    pthread_barrier_t *bar;
    double cpu_s; /* this thread's CPU time for its batches */
    int rc;
    char err[256];
} worker;

enum { KIND_FLAT, KIND_LOOKUP, KIND_ADAGRAD, KIND_FILL, KIND_WIDE, KIND_MODEL };
#define WIDE 132 /* floats per row of the wide baseline: the table's 528-byte row stride */
static const float *g_wide;
/* The model index of --wide: open addressing over row numbers, g_model_cap buckets. */
static uint64_t *g_model;
static uint64_t g_model_cap;

static inline uint64_t model_home(uint32_t row)
{
    uint64_t z = (uint64_t)row * 0x9e3779b97f4a7c15ull;
    return (uint64_t)(((unsigned __int128)(z ^ (z >> 29)) * g_model_cap) >> 64);
}

/* The lookup's memory pattern with none of its work: bucket prefetched 2D ids ahead, read D
 * ids ahead (probing to the row's entry), the row's header + weights prefetched, then copied.
 * The gathers are noinline so that callgrind (--toggle-collect=worker_main) reports each
 * apart from the lookup (docs/table.md, the per-row budget). */
static __attribute__((noinline)) void model_gather(const uint32_t *ix, size_t n, float *out)
{
    enum { D = 8, R = 32 };
    uint64_t home[R], slot[R];
    for (size_t j = 0; j < n + 2 * D; j++) {
        if (j < n) {
            home[j & (R - 1)] = model_home(ix[j]);
            __builtin_prefetch(&g_model[home[j & (R - 1)]], 0, 3);
        }
        if (j >= D && j - D < n) {
            size_t k = j - D;
            uint64_t b = home[k & (R - 1)];
            while (g_model[b] != ix[k])
                if (++b == g_model_cap) b = 0;
            slot[k & (R - 1)] = g_model[b];
            const char *r = (const char *)(g_wide + g_model[b] * WIDE);
            for (int l = 0; l < DIM * 4 + 64; l += 64) __builtin_prefetch(r + l, 0, 3);
        }
        if (j >= 2 * D) {
            size_t i = j - 2 * D;
            memcpy(out + i * DIM, g_wide + slot[i & (R - 1)] * WIDE + 4, DIM * sizeof(float));
        }
    }
}

static __attribute__((noinline)) void wide_gather(const float *flat, const uint32_t *ix, size_t n,
                                                  float *out)
{
    const size_t pf = 16;
    for (size_t i = 0; i < n; i++) {
        if (i + pf < n) {
            const char *r = (const char *)(flat + (size_t)ix[i + pf] * WIDE);
            for (int l = 0; l < DIM * 4 + 64; l += 64) __builtin_prefetch(r + l, 0, 3);
        }
        memcpy(out + i * DIM, flat + (size_t)ix[i] * WIDE + 4, DIM * sizeof(float));
    }
}

static __attribute__((noinline)) void flat_gather(const float *flat, const uint32_t *ix, size_t n,
                                                  float *out)
{
    const size_t pf = 16;
    for (size_t i = 0; i < n; i++) {
        if (i + pf < n) {
            const char *r = (const char *)(flat + (size_t)ix[i + pf] * DIM);
            for (int l = 0; l < DIM * 4; l += 64) __builtin_prefetch(r + l, 0, 3);
        }
        memcpy(out + i * DIM, flat + (size_t)ix[i] * DIM, DIM * sizeof(float));
    }
}

static int adagrad_batch(worker *w, const uint64_t *keys)
{
    int rc = gr_table_lookup(w->t, keys, IDS, w->out, 0);
    if (rc) return rc;
    long nu = gr_dedup(keys, IDS, w->uniq, w->inverse, &w->scratch);
    if (nu < 0) return (int)nu;
    /* A stand-in gradient per occurrence (a fraction of the row read), summed per unique id
     * as a client does before pushing. */
    memset(w->ugrad, 0, (size_t)nu * DIM * sizeof(float));
    for (size_t i = 0; i < IDS; i++) {
        float *g = w->ugrad + (size_t)w->inverse[i] * DIM;
        const float *o = w->out + i * DIM;
        for (int j = 0; j < DIM; j++) g[j] += 1e-3f + 1e-2f * o[j];
    }
    return gr_table_apply(w->t, w->uniq, (size_t)nu, w->ugrad);
}

static void *worker_main(void *p)
{
    worker *w = p;
    pthread_barrier_wait(w->bar);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    for (unsigned b = 0; b < w->batches && !w->rc; b++) {
        unsigned k = b % w->pool_n;
        if (w->kind == KIND_FLAT) {
            flat_gather(w->flat, w->rowix[k], IDS, w->out);
        } else if (w->kind == KIND_WIDE) {
            wide_gather(g_wide, w->rowix[k], IDS, w->out);
        } else if (w->kind == KIND_MODEL) {
            model_gather(w->rowix[k], IDS, w->out);
        } else if (w->kind == KIND_LOOKUP) {
            w->rc = gr_table_lookup(w->t, w->keys[k], IDS, w->out, 0);
        } else {
            w->rc = adagrad_batch(w, w->keys[k]);
        }
        if (w->rc) snprintf(w->err, sizeof w->err, "%s", gr_errmsg());
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    w->cpu_s = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
    return NULL;
}

/* Runs `kind` on nt workers; returns ids (or rows) per second of wall time, or -1 on error.
 * *cpu_rate gets the sum over threads of ids per second of that thread's CPU time: on a
 * machine shared with other work it leaves out the time a thread was not running. */
static double measure(worker *ws, unsigned nt, int kind, double *cpu_rate)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, nt + 1);
    for (unsigned i = 0; i < nt; i++) {
        ws[i].kind = kind;
        ws[i].bar = &bar;
        ws[i].rc = 0;
        pthread_create(&ws[i].th, NULL, worker_main, &ws[i]);
    }
    pthread_barrier_wait(&bar);
    uint64_t t0 = gr_now_ns();
    for (unsigned i = 0; i < nt; i++) pthread_join(ws[i].th, NULL);
    double secs = (double)(gr_now_ns() - t0) / 1e9;
    pthread_barrier_destroy(&bar);
    uint64_t ids = 0;
    for (unsigned i = 0; i < nt; i++) {
        if (ws[i].rc) {
            fprintf(stderr, "granary bench table: worker %u failed: %s\n", i, ws[i].err);
            return -1;
        }
        ids += (uint64_t)ws[i].batches * IDS;
    }
    if (cpu_rate) {
        *cpu_rate = 0;
        for (unsigned i = 0; i < nt; i++)
            *cpu_rate += (double)ws[i].batches * IDS / (ws[i].cpu_s > 0 ? ws[i].cpu_s : 1e-9);
    }
    return (double)ids / secs;
}

typedef struct fill_arg {
    gr_table *t;
    uint64_t lo, hi;
    int rc;
} fill_arg;

static void *fill_main(void *p)
{
    fill_arg *a = p;
    enum { CH = 65536 };
    uint64_t *keys = malloc(CH * sizeof *keys);
    float *out = malloc((size_t)CH * DIM * sizeof *out);
    if (!keys || !out) a->rc = GR_ENOMEM;
    for (uint64_t r = a->lo; r < a->hi && !a->rc; r += CH) {
        size_t n = a->hi - r < CH ? (size_t)(a->hi - r) : CH;
        for (size_t i = 0; i < n; i++) keys[i] = key_of_rank(r + i + 1);
        a->rc = gr_table_lookup(a->t, keys, n, out, 0);
    }
    free(keys);
    free(out);
    return NULL;
}

/* Path of bench/torch_embedding.py: $GR_TORCH_SCRIPT, ./bench/, or beside the executable's
 * build folder (build/granary or build/<sanitizer>/granary). */

/* Runs the PyTorch baseline as a child process; returns ids/s or -1 when unavailable. */
static double run_torch(uint64_t rows, unsigned batches, unsigned threads)
{
    if (access("/usr/bin/python3", X_OK) != 0) return -1;
    char script[PATH_MAX];
    if (!gr_bench_find_script("GR_TORCH_SCRIPT", "torch_embedding.py", script, sizeof script)) return -1;
    char cmd[PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s' --rows %" PRIu64 " --dim %d --batch %d --bag %d "
             "--batches %u --threads %u --zipf %g 2>&1",
             script, rows, DIM, EXAMPLES, BAG, batches, threads, ZIPF_S);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[1024];
    double ids = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"ids_per_sec\":");
        char *end;
        double x = p ? strtod(p + 14, &end) : 0;
        if (p && end != p + 14 && x > 0) ids = x;
    }
    int st = pclose(f);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    return ids;
}

typedef struct result {
    unsigned threads;
    double flat, lookup, adagrad, torch;
    double ratio, ratio_cpu; /* medians of lookup / flat pairs, in wall and in CPU time */
    double wide, wide_cpu;   /* the same for the flat gather at the row stride (--wide) */
    double model, model_cpu; /* and for the model index + row (--wide) */
} result;

static double tv_s(const struct timeval *tv)
{
    return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n values (sorts them). */
static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void json_num(char *buf, size_t cap, double v)
{
    if (v < 0) snprintf(buf, cap, "null");
    else snprintf(buf, cap, "%.0f", v);
}

int gr_bench_table(int argc, char **argv)
{
    gr_cli_value v[TB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&table_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    opts o = {.rows = (uint64_t)v[TB_ROWS].i,
              .batches = (unsigned)v[TB_BATCHES].i,
              .threads = (unsigned)v[TB_THREADS].i,
              .repeat = (unsigned)v[TB_REPEAT].i,
              .json = v[TB_JSON].b,
              .full = v[TB_FULL].b,
              .lookup_only = v[TB_ONLY].i == 1,
              .wide = v[TB_WIDE].b};
    bool rows_set = v[TB_ROWS].given;
    if (o.full && !rows_set) o.rows = 50000000;
    if (o.rows > UINT32_MAX) {
        fprintf(stderr, "granary bench table: at most %u rows\n", UINT32_MAX);
        return 2;
    }

    gr_table_spec spec;
    gr_table_spec_default(&spec, "bench", DIM);
    spec.seed = 42;
    spec.init.kind = GR_INIT_UNIFORM;
    spec.init.low = -0.01f;
    spec.init.high = 0.01f;
    spec.opt.kind = GR_OPT_ADAGRAD;
    spec.opt.lr = 0.01f;
    spec.opt.eps = 1e-8f;

    /* Refuse sizes this machine cannot hold rather than swapping or being killed. */
    double need = (double)o.rows * (528 + 32 + DIM * 4 + (o.wide ? WIDE * 4 + 12 : 0)) + 64e6 * o.threads;
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (need > 0.85 * ram) {
        fprintf(stderr,
                "granary bench table: %" PRIu64 " rows need about %.1f GiB; this machine has "
                "%.1f GiB (use --rows)\n",
                o.rows, need / 1073741824.0, ram / 1073741824.0);
        return 1;
    }

    printf("granary bench table: %" PRIu64 " rows, dim %d, adagrad, batches of %d x %d ids "
           "Zipf(%.2f), %u batches per thread per figure\n",
           o.rows, DIM, EXAMPLES, BAG, ZIPF_S, o.batches);
    fflush(stdout);

    /* Id pools: drawn once per thread, cycled through by every measurement. */
    unsigned nt_max = o.threads ? o.threads : 1;
    unsigned pool_n = o.batches < POOL_MAX ? o.batches : POOL_MAX;
    if (pool_n == 0) pool_n = 1;
    worker *ws = calloc(nt_max, sizeof *ws);
    if (!ws) {
        fprintf(stderr, "granary bench table: out of memory\n");
        return 1;
    }
    gr_zipf z;
    gr_zipf_init(&z, o.rows, ZIPF_S);
    int ret = 1;
    for (unsigned i = 0; i < nt_max; i++) {
        worker *w = &ws[i];
        w->id = (int)i;
        w->batches = o.batches;
        w->pool_n = pool_n;
        w->keys = calloc(pool_n, sizeof *w->keys);
        w->rowix = calloc(pool_n, sizeof *w->rowix);
        w->out = malloc((size_t)IDS * DIM * sizeof(float));
        w->ugrad = malloc((size_t)IDS * DIM * sizeof(float));
        w->uniq = malloc(IDS * sizeof(uint64_t));
        w->inverse = malloc(IDS * sizeof(uint32_t));
        if (!w->keys || !w->rowix || !w->out || !w->ugrad || !w->uniq || !w->inverse) goto oom;
        gr_rng r;
        gr_rng_seed(&r, 1000 + i);
        for (unsigned b = 0; b < pool_n; b++) {
            w->keys[b] = malloc(IDS * sizeof(uint64_t));
            w->rowix[b] = malloc(IDS * sizeof(uint32_t));
            if (!w->keys[b] || !w->rowix[b]) goto oom;
            for (size_t k = 0; k < IDS; k++) {
                uint64_t rank = gr_zipf_draw(&z, &r);
                w->keys[b][k] = key_of_rank(rank);
                w->rowix[b][k] = (uint32_t)(((rank - 1) * PERM_MUL) % o.rows);
            }
        }
    }

    /* Flat baseline array, on huge pages where the kernel gives them. */
    size_t flat_bytes = (size_t)o.rows * DIM * sizeof(float);
    size_t flat_alloc = (flat_bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *flat = NULL;
    if (posix_memalign(&flat, 2u << 20, flat_alloc) != 0) goto oom;
#ifdef MADV_HUGEPAGE
    madvise(flat, flat_alloc, MADV_HUGEPAGE);
#endif
    {
        float *f = flat;
        for (size_t i = 0; i < (size_t)o.rows * DIM; i++) f[i] = (float)(i & 1023) * 1e-5f;
    }

    void *wide = NULL;
    if (o.wide) {
        size_t wb = ((size_t)o.rows * WIDE * 4 + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        if (posix_memalign(&wide, 2u << 20, wb) != 0) {
            free(flat);
            goto oom;
        }
#ifdef MADV_HUGEPAGE
        madvise(wide, wb, MADV_HUGEPAGE);
#endif
        memset(wide, 1, wb);
        g_wide = wide;
        g_model_cap = o.rows * 10 / 7 + 1;
        size_t mb = ((size_t)g_model_cap * 8 + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        if (posix_memalign((void **)&g_model, 2u << 20, mb) != 0) {
            free(flat);
            free(wide);
            goto oom;
        }
#ifdef MADV_HUGEPAGE
        madvise(g_model, mb, MADV_HUGEPAGE);
#endif
        memset(g_model, 0xff, mb);
        for (uint64_t r = 0; r < o.rows; r++) {
            uint64_t b = model_home((uint32_t)r);
            while (g_model[b] != UINT64_MAX)
                if (++b == g_model_cap) b = 0;
            g_model[b] = r;
        }
    }
    gr_table *t = NULL;
    double fill_rate = 0, fill_cpu_ns = 0, fill_sys_ns = 0;
    uint64_t fill_faults = 0;
    if (gr_table_create(&spec, &t) != GR_OK) {
        fprintf(stderr, "granary bench table: %s\n", gr_errmsg());
        free(flat);
        free(wide);
        goto out;
    }
    {
        fill_arg fa[MAX_THREADS];
        pthread_t ft[MAX_THREADS];
        /* The fill is the "pull of new ids" stage: every key is missing, so every lookup
         * creates its row (lock, slot, initializer, index insert) in fresh memory. Its process
         * CPU time and minor faults are reported per row (the fault count depends on how the
         * kernel backs the arena: huge pages or 4 KiB ones). */
        struct rusage ru0, ru1;
        getrusage(RUSAGE_SELF, &ru0);
        uint64_t t0 = gr_now_ns();
        for (unsigned i = 0; i < nt_max; i++) {
            fa[i] = (fill_arg){t, o.rows * i / nt_max, o.rows * (i + 1) / nt_max, 0};
            pthread_create(&ft[i], NULL, fill_main, &fa[i]);
        }
        int frc = 0;
        for (unsigned i = 0; i < nt_max; i++) {
            pthread_join(ft[i], NULL);
            if (fa[i].rc) frc = fa[i].rc;
        }
        double secs = (double)(gr_now_ns() - t0) / 1e9;
        getrusage(RUSAGE_SELF, &ru1);
        fill_rate = (double)o.rows / secs;
        fill_cpu_ns = (tv_s(&ru1.ru_utime) + tv_s(&ru1.ru_stime) - tv_s(&ru0.ru_utime) -
                       tv_s(&ru0.ru_stime)) * 1e9 / (double)o.rows;
        fill_sys_ns = (tv_s(&ru1.ru_stime) - tv_s(&ru0.ru_stime)) * 1e9 / (double)o.rows;
        fill_faults = (uint64_t)(ru1.ru_minflt - ru0.ru_minflt);
        if (frc) {
            fprintf(stderr, "granary bench table: fill failed: %s\n", gr_strerror(frc));
            gr_table_destroy(t);
            free(flat);
            free(wide);
            goto out;
        }
        printf("fill: %" PRIu64 " rows created by lookups in %.2f s (%.2f M rows/s, %u threads); "
               "process CPU %.0f ns/row (kernel %.0f), %" PRIu64 " minor faults\n",
               o.rows, secs, (double)o.rows / secs / 1e6, nt_max, fill_cpu_ns, fill_sys_ns,
               fill_faults);
    }
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    double overhead = st.bytes_per_row - (double)st.payload_bytes;

    result res[2];
    unsigned nres = 0;
    unsigned tcounts[2] = {1, nt_max};
    for (unsigned k = 0; k < (nt_max > 1 ? 2u : 1u); k++) {
        unsigned nt = tcounts[k];
        for (unsigned i = 0; i < nt; i++) {
            ws[i].t = t;
            ws[i].flat = flat;
        }
        result *r = &res[nres++];
        r->threads = nt;
        r->torch = -1;
        /* Alternating the two, R times, lets each lookup figure be read against a flat
         * gather taken moments before on the same (shared) machine. */
        double fl[100], lk[100], ratio[100], fl_cpu, lk_cpu, ratio_cpu[100];
        bool failed = false;
        unsigned done = 0;
        double wd[100], wd_cpu[100], md[100], md_cpu[100], x_cpu;
        for (; done < o.repeat && !failed; done++) {
            fl[done] = measure(ws, nt, KIND_FLAT, &fl_cpu);
            if (g_wide) {
                wd[done] = measure(ws, nt, KIND_WIDE, &x_cpu) / fl[done];
                wd_cpu[done] = x_cpu / fl_cpu;
                md[done] = measure(ws, nt, KIND_MODEL, &x_cpu) / fl[done];
                md_cpu[done] = x_cpu / fl_cpu;
            }
            lk[done] = measure(ws, nt, KIND_LOOKUP, &lk_cpu);
            ratio[done] = lk[done] / fl[done];
            ratio_cpu[done] = lk_cpu / fl_cpu;
            failed = fl[done] < 0 || lk[done] < 0;
        }
        r->flat = median(fl, done);
        r->lookup = median(lk, done);
        r->wide = g_wide ? median(wd, done) : -1;
        r->wide_cpu = g_wide ? median(wd_cpu, done) : -1;
        r->model = g_wide ? median(md, done) : -1;
        r->model_cpu = g_wide ? median(md_cpu, done) : -1;
        r->ratio = median(ratio, done);
        r->ratio_cpu = median(ratio_cpu, done);
        r->adagrad = o.lookup_only || failed ? -1 : measure(ws, nt, KIND_ADAGRAD, NULL);
        if (failed || (!o.lookup_only && r->adagrad < 0)) {
            gr_table_destroy(t);
            free(flat);
            free(wide);
            goto out;
        }
    }
    gr_table_get_stats(t, &st);
    /* Give the memory back before PyTorch allocates its own copy of the table. */
    gr_table_destroy(t);
    free(flat);
    free(wide);
    unsigned torch_batches = o.batches < 30 ? o.batches : 30;
    for (unsigned k = 0; k < nres && !o.lookup_only; k++) {
        res[k].torch = run_torch(o.rows, torch_batches, res[k].threads);
        if (res[k].torch < 0) break; /* no torch here: skip the other thread counts */
    }

    printf("\n%-8s %14s %14s %9s %9s %14s %14s %9s\n", "threads", "flat M rows/s",
           "lookup M rows/s", "x flat", "(cpu)", "adagrad M ids/s", "torch M ids/s", "x torch");
    for (unsigned k = 0; k < nres; k++) {
        result *r = &res[k];
        char tb[32] = "n/a", xb[32] = "n/a", ab[32] = "n/a";
        if (r->adagrad >= 0) snprintf(ab, sizeof ab, "%.2f", r->adagrad / 1e6);
        if (r->torch > 0) {
            snprintf(tb, sizeof tb, "%.2f", r->torch / 1e6);
            snprintf(xb, sizeof xb, "%.1f", r->adagrad / r->torch);
        }
        printf("%-8u %14.2f %15.2f %9.2f %9.2f %15s %14s %9s\n", r->threads, r->flat / 1e6,
               r->lookup / 1e6, r->ratio, r->ratio_cpu, ab, tb, xb);
        if (r->wide >= 0)
            printf("         flat gather at the 528-byte row stride: %.2f x flat (cpu %.2f); model "
                   "index + row: %.2f x flat (cpu %.2f)\n",
                   r->wide, r->wide_cpu, r->model, r->model_cpu);
    }
    result *top = &res[nres - 1];
    printf("\nmemory: %.2f GiB for %" PRIu64 " rows = %.1f B/row; payload (weights + adagrad) "
           "%" PRIu64 " B/row; overhead %.1f B/row (target <= 32)\n",
           (double)st.bytes / 1073741824.0, st.rows, st.bytes_per_row, st.payload_bytes, overhead);
    printf("targets at %u threads: lookup >= 0.6 x flat gather: %s (%.2f); adagrad >= 5 x torch: "
           "%s; overhead <= 32 B/row: %s\n",
           top->threads, top->ratio >= 0.6 ? "met" : "NOT met", top->ratio,
           top->torch > 0 ? (top->adagrad >= 5 * top->torch ? "met" : "NOT met") : "no torch",
           overhead <= 32 ? "met" : "NOT met");
    printf("(PyTorch: nn.EmbeddingBag(sparse=True, mode='sum') + torch.optim.Adagrad, %u "
           "batches, same id distribution; run by /usr/bin/python3 bench/torch_embedding.py)\n",
           torch_batches);
    if (o.json) {
        char tj[32], aj[32];
        json_num(tj, sizeof tj, top->torch);
        json_num(aj, sizeof aj, top->adagrad);
        printf("{\"bench\":\"table\",\"rows\":%" PRIu64 ",\"dim\":%d,\"threads\":%u,\"batches\":%u,"
               "\"repeat\":%u,\"lookup_rows_per_sec\":%.0f,\"flat_gather_rows_per_sec\":%.0f,"
               "\"lookup_per_flat\":%.3f,\"adagrad_ids_per_sec\":%s,\"torch_adagrad_ids_per_sec\":%s,"
               "\"overhead_bytes_per_row\":%.2f,\"bytes_per_row\":%.2f,"
               "\"fill_rows_per_sec\":%.0f,\"fill_cpu_ns_per_row\":%.1f,"
               "\"fill_sys_ns_per_row\":%.1f,\"fill_minor_faults\":%" PRIu64 ",\"by_threads\":[",
               o.rows, DIM, top->threads, o.batches, o.repeat, top->lookup, top->flat, top->ratio,
               aj, tj, overhead, st.bytes_per_row, fill_rate, fill_cpu_ns, fill_sys_ns,
               fill_faults);
        for (unsigned k = 0; k < nres; k++) {
            json_num(tj, sizeof tj, res[k].torch);
            json_num(aj, sizeof aj, res[k].adagrad);
            printf("%s{\"threads\":%u,\"lookup_rows_per_sec\":%.0f,\"flat_gather_rows_per_sec\":"
                   "%.0f,\"lookup_per_flat\":%.3f,\"lookup_per_flat_cpu\":%.3f,"
                   "\"wide_per_flat\":%.3f,\"wide_per_flat_cpu\":%.3f,"
                   "\"model_per_flat\":%.3f,\"model_per_flat_cpu\":%.3f,"
                   "\"adagrad_ids_per_sec\":%s,\"torch_adagrad_ids_per_sec\":%s}",
                   k ? "," : "", res[k].threads, res[k].lookup, res[k].flat, res[k].ratio,
                   res[k].ratio_cpu, res[k].wide, res[k].wide_cpu, res[k].model,
                   res[k].model_cpu, aj, tj);
        }
        printf("]}\n");
    }
    ret = 0;
    goto out;
oom:
    fprintf(stderr, "granary bench table: out of memory\n");
out:
    free(g_model);
    g_model = NULL;
    g_wide = NULL;
    for (unsigned i = 0; i < nt_max; i++) {
        worker *w = &ws[i];
        for (unsigned b = 0; b < pool_n; b++) {
            if (w->keys) free(w->keys[b]);
            if (w->rowix) free(w->rowix[b]);
        }
        free(w->keys);
        free(w->rowix);
        free(w->out);
        free(w->ugrad);
        free(w->uniq);
        free(w->inverse);
        gr_dedup_scratch_fini(&w->scratch);
    }
    free(ws);
    return ret;
}
