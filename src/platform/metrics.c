/* The controller's Prometheus series: jobs by state, cores, replicas, and counts of what the
 * scheduler did. Gauges are read from the job table at each scrape (a collector), so they are
 * never stale; counters are counted where the action happens. */
#include "platform/platform_int.h"

#include <string.h>

static void collect(void *ctx, gr_metrics *r)
{
    (void)r;
    gr_controller *c = ctx;
    enum { NSTATES = JOB_STOPPED + 1 };
    unsigned by_state[NSTATES] = {0}, used = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->njobs; i++) {
        const job *j = c->jobs[i];
        if ((unsigned)j->state < NSTATES) by_state[j->state]++;
        if (j->state != JOB_RUNNING) continue;
        bool serve = !strcmp(j->kind, "serve");
        used += j->cores * (serve ? (j->replicas ? j->replicas : 1) : 1);
        if (serve)
            gr_metric_set(gr_metric_at(c->m_replicas, j->name), (double)j->replicas);
    }
    pthread_mutex_unlock(&c->mu);
    for (int s = 0; s < NSTATES; s++)
        gr_metric_set(gr_metric_at(c->m_jobs, job_state_name((job_state)s)), by_state[s]);
    gr_metric_set(gr_metric_at(c->m_capacity), c->cfg.capacity);
    gr_metric_set(gr_metric_at(c->m_cores_used), used);
}

int controller_metrics_init(gr_controller *c)
{
    gr_metric_family *f;
    int rc = gr_metrics_create(&c->metrics);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_GAUGE, "granary_controller_jobs",
                                    "Jobs known to the controller, by state.", "state", NULL, 0,
                                    0, &c->m_jobs);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_GAUGE,
                                    "granary_controller_capacity_cores",
                                    "Cores the executor may hand out.", NULL, NULL, 0, 0,
                                    &c->m_capacity);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_GAUGE,
                                    "granary_controller_cores_in_use",
                                    "Cores held by running jobs (serving: per replica).", NULL,
                                    NULL, 0, 0, &c->m_cores_used);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_GAUGE,
                                    "granary_controller_serving_replicas",
                                    "Replicas of each running serving job, by job name.", "job",
                                    NULL, 0, GR_METRIC_MIRRORED, &c->m_replicas);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_COUNTER,
                                    "granary_controller_jobs_submitted_total",
                                    "Jobs accepted by POST /v1/jobs since the controller started.",
                                    NULL, NULL, 0, 0, &f);
    if (!rc) c->m_submitted = gr_metric_at(f);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_COUNTER,
                                    "granary_controller_preemptions_total",
                                    "Training jobs preempted for a job of higher priority.", NULL,
                                    NULL, 0, 0, &f);
    if (!rc) c->m_preemptions = gr_metric_at(f);
    if (!rc) rc = gr_metrics_family(c->metrics, GR_METRIC_COUNTER,
                                    "granary_controller_scale_events_total",
                                    "Serving replicas started or stopped by the autoscaler.",
                                    NULL, NULL, 0, 0, &f);
    if (!rc) c->m_scaled = gr_metric_at(f);
    if (!rc) rc = gr_metrics_add_process(c->metrics);
    if (!rc) rc = gr_metrics_add_collector(c->metrics, collect, c);
    if (rc) controller_metrics_free(c);
    return rc;
}

void controller_metrics_free(gr_controller *c)
{
    if (!c->metrics) return;
    gr_metrics_remove_collector(c->metrics, collect, c);
    gr_metrics_destroy(c->metrics);
    c->metrics = NULL;
}
