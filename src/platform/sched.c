/* The scheduler's decision: a pure function of the jobs and the capacity, so every case of
 * priorities, preemption and waiting is tested without processes. */
#include "platform/platform_int.h"

#include <stdlib.h>

static int by_priority_then_age(const void *a, const void *b)
{
    const sched_job *x = *(const sched_job *const *)a, *y = *(const sched_job *const *)b;
    if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Victims: lowest priority first, and among equals the newest (it has lost the least). */
static int by_victim_order(const void *a, const void *b)
{
    const sched_job *x = *(const sched_job *const *)a, *y = *(const sched_job *const *)b;
    if (x->priority != y->priority) return x->priority < y->priority ? -1 : 1;
    return x->id > y->id ? -1 : x->id < y->id;
}

size_t sched_decide(const sched_job *jobs, size_t n, unsigned capacity, sched_action *out,
                    size_t cap)
{
    size_t nout = 0;
    const sched_job **waiting = malloc((n + 1) * sizeof *waiting);
    const sched_job **running = malloc((n + 1) * sizeof *running);
    bool *taken = calloc(n + 1, sizeof *taken);
    if (!waiting || !running || !taken) goto done;
    size_t nw = 0, nr = 0;
    unsigned used = 0, freeing = 0;
    for (size_t i = 0; i < n; i++) {
        const sched_job *j = &jobs[i];
        if (j->state == JOB_QUEUED || j->state == JOB_PREEMPTED) waiting[nw++] = j;
        if (j->state == JOB_RUNNING) {
            used += j->cores;
            if (j->stopping) freeing += j->cores;
            else running[nr++] = j;
        }
    }
    qsort(waiting, nw, sizeof *waiting, by_priority_then_age);
    qsort(running, nr, sizeof *running, by_victim_order);
    for (size_t w = 0; w < nw && nout < cap; w++) {
        const sched_job *c = waiting[w];
        if (c->cores > capacity) continue; /* can never run here; the API refuses such specs */
        unsigned free_now = capacity > used ? capacity - used : 0;
        if (c->cores <= free_now) {
            out[nout++] = (sched_action){ACT_START, c->id};
            used += c->cores;
            continue;
        }
        /* It does not fit. Cores already on their way back count first; then running jobs
         * of lower priority, lowest first, until there is room. */
        unsigned room = free_now + freeing;
        size_t chosen[64], nchosen = 0;
        for (size_t r = 0; r < nr && room < c->cores && nchosen < 64; r++) {
            size_t idx = (size_t)(running[r] - jobs);
            if (taken[idx] || running[r]->priority >= c->priority || !running[r]->preemptible)
                continue;
            chosen[nchosen++] = idx;
            room += running[r]->cores;
        }
        if (room >= c->cores) {
            for (size_t k = 0; k < nchosen && nout < cap; k++) {
                taken[chosen[k]] = true;
                freeing += jobs[chosen[k]].cores;
                out[nout++] = (sched_action){ACT_PREEMPT, jobs[chosen[k]].id};
            }
        }
        /* Nothing of lower priority starts while this one waits for its cores. */
        break;
    }
done:
    free(waiting);
    free(running);
    free(taken);
    return nout;
}
