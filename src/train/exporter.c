/* The trainer's Prometheus series. The run already counts what a person watches (examples,
 * steps, loss, dropped gradients, seconds per stage) under the trainer's mutex; a collector
 * copies those counts at each scrape, so the workers' loop gains no work. Only checkpoint
 * pauses are observed as they happen (a histogram cannot be copied). docs/operations.md lists
 * the names. */
#include "train/trainer_int.h"

#include <math.h>
#include <stdlib.h>

typedef struct tr_metrics {
    gr_metrics *r;
    gr_metric *examples, *steps, *loss, *rate, *dropped, *bad_lines, *wait, *running, *workers;
    gr_metric *stage[5];
    gr_metric *stale_max, *stale_mean, *ckpts, *ckpt_failures, *ckpt_pause;
} tr_metrics;

static gr_metric *series(gr_metrics *r, gr_metric_type t, const char *name, const char *help,
                         int *rc)
{
    gr_metric_family *f = NULL;
    if (!*rc) *rc = gr_metrics_family(r, t, name, help, NULL, NULL, 0, 0, &f);
    gr_metric *m = *rc ? NULL : gr_metric_at(f);
    if (!*rc && !m) *rc = gr_seterr(GR_ENOMEM, "metrics: out of memory");
    return m;
}

static void collect(void *ctx, gr_metrics *r)
{
    (void)r;
    trainer *tr = ctx;
    tr_metrics *mx = tr->mx;
    pthread_mutex_lock(&tr->mu);
    gr_metric_set(mx->examples, (double)tr->examples);
    gr_metric_set(mx->steps, (double)tr->steps);
    /* The loss since the last progress line, or that line's when no batch came since. */
    gr_metric_set(mx->loss, tr->loss_n ? tr->loss_sum / (double)tr->loss_n : tr->window_loss);
    /* The last progress window's rate; without progress lines, the run's average. */
    double elapsed = gr_now_s() - tr->t0;
    gr_metric_set(mx->rate, tr->o->progress_s > 0 || elapsed <= 0 ? tr->window_rate
                                                                  : (double)tr->examples / elapsed);
    gr_metric_set(mx->dropped, (double)tr->dropped);
    gr_metric_set(mx->bad_lines, (double)tr->bad_lines);
    gr_metric_set(mx->wait, tr->wait_s);
    gr_metric_set(mx->running, tr->running);
    const double stage[5] = {tr->t.read, tr->t.pull, tr->t.compute, tr->t.push, tr->t.wait};
    for (int i = 0; i < 5; i++)
        gr_metric_set(mx->stage[i], stage[i]);
    if (tr->hybrid) {
        gr_metric_set(mx->stale_max, (double)tr->stale_max);
        gr_metric_set(mx->stale_mean, tr->steps ? (double)tr->stale_sum / (double)tr->steps : 0);
    }
    gr_metric_set(mx->ckpts, tr->res->ckpt_saves);
    gr_metric_set(mx->ckpt_failures, tr->res->ckpt_failures);
    pthread_mutex_unlock(&tr->mu);
}

int tr_metrics_start(trainer *tr)
{
    gr_metrics *r = tr->o->metrics;
    if (!r) return GR_OK;
    tr_metrics *mx = calloc(1, sizeof *mx);
    if (!mx) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    mx->r = r;
    int rc = GR_OK;
    const gr_metric_type C = GR_METRIC_COUNTER, G = GR_METRIC_GAUGE;
    mx->examples =
        series(r, C, "granary_train_examples_total", "Training examples processed.", &rc);
    mx->steps = series(r, C, "granary_train_steps_total", "Batches pushed, all workers.", &rc);
    mx->loss = series(r, G, "granary_train_loss",
                      "Mean training loss (logloss) over the recent batches.", &rc);
    mx->rate = series(r, G, "granary_train_examples_per_second",
                      "Examples per second over the last progress window.", &rc);
    mx->dropped = series(r, C, "granary_train_dropped_gradients_total",
                         "Gradient commits refused as stale (semisync).", &rc);
    mx->bad_lines =
        series(r, C, "granary_train_bad_lines_total", "Input lines skipped as bad.", &rc);
    mx->wait = series(r, C, "granary_train_step_wait_seconds_total",
                      "Seconds workers waited for step tokens, summed.", &rc);
    mx->running = series(r, G, "granary_train_workers_running", "Workers still training.", &rc);
    mx->workers = series(r, G, "granary_train_workers", "Workers of the run.", &rc);
    gr_metric_family *sf = NULL;
    if (!rc)
        rc = gr_metrics_family(r, C, "granary_train_stage_seconds_total",
                               "Seconds per pipeline stage, summed over every batch of every "
                               "worker.",
                               "stage", NULL, 0, 0, &sf);
    static const char *const stages[5] = {"read", "pull", "compute", "push", "wait"};
    for (int i = 0; i < 5 && !rc; i++)
        if (!(mx->stage[i] = gr_metric_at(sf, stages[i])))
            rc = gr_seterr(GR_ENOMEM, "metrics: out of memory");
    if (tr->hybrid) {
        mx->stale_max = series(r, G, "granary_train_embedding_staleness_max",
                               "Hybrid: most own batches not yet pushed at a pull.", &rc);
        mx->stale_mean = series(r, G, "granary_train_embedding_staleness_mean",
                                "Hybrid: mean own batches not yet pushed at a pull.", &rc);
    }
    mx->ckpts = series(r, C, "granary_train_checkpoints_total", "Checkpoints committed.", &rc);
    mx->ckpt_failures = series(r, C, "granary_train_checkpoint_failures_total",
                               "Checkpoints that failed (training went on).", &rc);
    gr_metric_family *pf = NULL;
    if (!rc)
        rc = gr_metrics_family(r, GR_METRIC_HISTOGRAM, "granary_train_checkpoint_pause_seconds",
                               "Seconds the workers stood paused for one checkpoint.", NULL,
                               gr_metric_slow_buckets, gr_metric_slow_nbuckets, 0, &pf);
    if (!rc && !(mx->ckpt_pause = gr_metric_at(pf)))
        rc = gr_seterr(GR_ENOMEM, "metrics: out of memory");
    if (!rc) {
        gr_metric_set(mx->workers, tr->o->workers);
        tr->mx = mx;
        rc = gr_metrics_add_collector(r, collect, tr);
    }
    if (rc) {
        tr->mx = NULL;
        free(mx);
    }
    return rc;
}

void tr_metrics_stop(trainer *tr)
{
    tr_metrics *mx = tr->mx;
    if (!mx) return;
    gr_metrics_remove_collector(mx->r, collect, tr);
    collect(tr, mx->r); /* the final values stay in the exposition */
    tr->mx = NULL;
    free(mx);
}

void tr_metrics_ckpt(trainer *tr, double secs)
{
    if (tr->mx) gr_metric_observe(tr->mx->ckpt_pause, secs);
}
