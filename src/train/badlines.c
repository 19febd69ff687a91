/* Bad lines of one data file across all the readers of a run: the first few are logged once
 * (file:line and why), then one summary, and a file with no valid example, or fewer valid
 * lines than the run's share, fails the run instead of training nothing and reporting the AUC
 * of an untrained model. A probe reads a file up to its first valid example before any
 * training, so a file in the wrong format fails in a second, not after an epoch. */
#include "train/trainer_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

void tr_badlog_init(tr_badlog *l, const char *path, const char *what)
{
    memset(l, 0, sizeof *l);
    l->path = path;
    l->what = what;
    atomic_init(&l->logged, 0);
    pthread_mutex_init(&l->mu, NULL);
}

void tr_badlog_fini(tr_badlog *l) { pthread_mutex_destroy(&l->mu); }

void tr_badlog_on_bad(void *ctx, const char *path, uint64_t line, const char *why)
{
    tr_badlog *l = ctx;
    unsigned k = atomic_fetch_add(&l->logged, 1);
    /* The earliest line, whichever parser thread saw it first (bad lines are the slow path). */
    pthread_mutex_lock(&l->mu);
    if (!l->first_line || line < l->first_line) {
        l->first_line = line;
        snprintf(l->first_msg, sizeof l->first_msg, "%s", why);
    }
    pthread_mutex_unlock(&l->mu);
    if (l->quiet) return;
    /* Printed, not logged: the log level may silence warnings (quiet shards under train), and
     * these are about the user's own file. */
    if (k < TR_BAD_LOGGED)
        fprintf(stderr, "%s: %s:%llu: skipping bad line: %s\n", l->what, path,
                (unsigned long long)line, why);
    else if (k == TR_BAD_LOGGED)
        fprintf(stderr, "%s: %s: more bad lines are skipped without a message; the count comes "
                        "at the end\n", l->what, path);
}

void tr_badlog_add(tr_badlog *l, const gr_criteo_stats *st)
{
    pthread_mutex_lock(&l->mu);
    l->good += st->examples;
    l->bad += st->bad_lines;
    pthread_mutex_unlock(&l->mu);
}

static int no_valid(const tr_badlog *l, uint64_t lines, bool all)
{
    return gr_seterr(GR_ECORRUPT, "%s: none of %s %llu line%s is a valid example (first: line "
                     "%llu: %s); is the file in the format the schema says? (--schema, "
                     "docs/data.md)", l->path, all ? "its" : "the first",
                     (unsigned long long)lines, lines == 1 ? "" : "s",
                     (unsigned long long)l->first_line, l->first_msg);
}

int tr_badlog_check(tr_badlog *l, double min_valid)
{
    uint64_t good = l->good, bad = l->bad, lines = good + bad;
    if (lines == 0) return GR_OK; /* nothing read (a resumed run that was done): the probe
                                   * vouched for the file */
    if (bad) {
        fprintf(stderr, "%s: %s: %llu of %llu lines were bad and skipped (%.2f%%); the first: line "
                "%llu: %s\n", l->what, l->path, (unsigned long long)bad, (unsigned long long)lines,
                100.0 * (double)bad / (double)lines, (unsigned long long)l->first_line,
                l->first_msg);
    }
    if (good == 0) return no_valid(l, lines, true);
    double share = (double)good / (double)lines;
    if (share < min_valid)
        return gr_seterr(GR_ECORRUPT, "%s: only %llu of %llu lines (%.2f%%) are valid examples, "
                         "fewer than the share required (--min-valid %g); the first bad: line "
                         "%llu: %s", l->path, (unsigned long long)good, (unsigned long long)lines,
                         100.0 * share, min_valid, (unsigned long long)l->first_line, l->first_msg);
    return GR_OK;
}

int tr_probe_file(const char *path, const gr_schema *schema, double min_valid)
{
    tr_badlog l;
    tr_badlog_init(&l, path, "probe");
    l.quiet = true;
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = 1;
    ro.block_bytes = 64u << 10;
    ro.schema = schema;
    /* The first TR_PROBE_BYTES are enough to tell a file in the wrong format (a 10 GB CSV read
     * as Criteo fails in a moment); only a run that requires no share reads on. */
    if (min_valid > 0) ro.end = TR_PROBE_BYTES;
    ro.on_bad = tr_badlog_on_bad;
    ro.on_bad_ctx = &l;
    gr_criteo_reader *r = NULL;
    gr_batch b = {0};
    int rc = gr_criteo_open(path, &ro, &r);
    if (!rc) rc = gr_batch_init_schema(&b, 1, schema);
    if (!rc) rc = gr_criteo_next(r, &b);
    if (!rc && b.n == 0) {
        gr_criteo_stats st;
        gr_criteo_get_stats(r, &st);
        struct stat sb;
        bool all = ro.end == 0 || (stat(path, &sb) == 0 && (uint64_t)sb.st_size <= ro.end);
        if (st.bad_lines)
            rc = no_valid(&l, st.bad_lines + st.empty_lines, all);
        else
            rc = gr_seterr(GR_ECORRUPT, "%s has no examples: it is empty%s", path,
                           st.empty_lines ? " but for empty lines or a header" : "");
    }
    gr_batch_fini(&b);
    gr_criteo_close(r);
    tr_badlog_fini(&l);
    return rc;
}
