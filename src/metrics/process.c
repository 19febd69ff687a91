/* The process's own series under Prometheus's standard names (the ones every client library
 * exports, so stock dashboards and alerts work): memory, CPU, descriptors, threads and start
 * time, read from /proc/self at each scrape. */
#include "metrics/metrics_int.h"

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct mx_process {
    gr_metric *rss, *vsz, *cpu, *fds, *threads, *start;
} mx_process;

static double count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    double n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* /proc/self/stat fields after the command name: utime 14, stime 15, num_threads 20,
 * starttime 22, vsize 23, rss 24 (1-based, as proc(5) numbers them). */
static void collect(void *ctx, gr_metrics *r)
{
    (void)r;
    mx_process *p = ctx;
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *s = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    if (!s) return;
    unsigned long long v[26] = {0};
    int field = 3;
    char *save = NULL;
    for (char *tok = strtok_r(s + 2, " ", &save); tok && field < 26;
         tok = strtok_r(NULL, " ", &save), field++)
        v[field] = strtoull(tok, NULL, 10);
    double tick = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
    gr_metric_set(p->cpu, (double)(v[14] + v[15]) / tick);
    gr_metric_set(p->threads, (double)v[20]);
    gr_metric_set(p->vsz, (double)v[23]);
    gr_metric_set(p->rss, (double)v[24] * page);
    gr_metric_set(p->fds, count_fds());
    /* Start time: boot time (btime of /proc/stat) + starttime ticks. */
    f = fopen("/proc/stat", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "btime ", 6)) {
                gr_metric_set(p->start,
                              (double)strtoull(line + 6, NULL, 10) + (double)v[22] / tick);
                break;
            }
        fclose(f);
    }
}

int gr_metrics_add_process(gr_metrics *r)
{
    static const struct {
        gr_metric_type t;
        const char *name, *help;
        size_t off;
    } rows[] = {
        {GR_METRIC_GAUGE, "process_resident_memory_bytes", "Resident memory size in bytes.",
         offsetof(mx_process, rss)},
        {GR_METRIC_GAUGE, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
         offsetof(mx_process, vsz)},
        {GR_METRIC_COUNTER, "process_cpu_seconds_total", "User and system CPU time in seconds.",
         offsetof(mx_process, cpu)},
        {GR_METRIC_GAUGE, "process_open_fds", "Open file descriptors.", offsetof(mx_process, fds)},
        {GR_METRIC_GAUGE, "process_threads", "Threads of the process.",
         offsetof(mx_process, threads)},
        {GR_METRIC_GAUGE, "process_start_time_seconds",
         "Start time of the process since the Unix epoch in seconds.", offsetof(mx_process, start)},
    };
    if (r->process) return GR_OK; /* one set per registry */
    mx_process *p = calloc(1, sizeof *p);
    if (!p) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        gr_metric_family *f;
        int rc = gr_metrics_family(r, rows[i].t, rows[i].name, rows[i].help, NULL, NULL, 0,
                                   GR_METRIC_MIRRORED, &f);
        gr_metric *m = rc ? NULL : gr_metric_at(f);
        if (!m) {
            free(p);
            return rc ? rc : gr_seterr(GR_ENOMEM, "metrics: out of memory");
        }
        *(gr_metric **)((char *)p + rows[i].off) = m;
    }
    int rc = gr_metrics_add_collector(r, collect, p);
    if (rc)
        free(p);
    else
        r->process = p; /* freed with the registry */
    return rc;
}
