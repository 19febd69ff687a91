/* Bounded queues joining a worker's pipeline stages; one mutex per worker guards all its
 * queues, and its abort flag stops them all at once. */
#include "train/trainer_int.h"

#include <stdlib.h>
#include <string.h>

int tr_queue_init(tr_queue *q, size_t cap, pthread_mutex_t *mu, bool *abort)
{
    memset(q, 0, sizeof *q);
    q->q = calloc(cap, sizeof *q->q);
    if (!q->q) return gr_seterr(GR_ENOMEM, "cannot allocate a queue");
    q->cap = cap;
    q->mu = mu;
    q->abort = abort;
    pthread_cond_init(&q->cv, NULL);
    return GR_OK;
}

void tr_queue_fini(tr_queue *q)
{
    free(q->q);
    if (q->cap) pthread_cond_destroy(&q->cv);
    memset(q, 0, sizeof *q);
}

/* Never blocks for long: the tr_queue holds every tr_item of its worker. */
void tr_queue_push(tr_queue *q, tr_item *it)
{
    pthread_mutex_lock(q->mu);
    while (q->len == q->cap && !*q->abort) pthread_cond_wait(&q->cv, q->mu);
    if (!*q->abort) {
        q->q[(q->head + q->len++) % q->cap] = it;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(q->mu);
}

/* The head item, or NULL when empty or aborted (caller holds q->mu). */
static tr_item *take_locked(tr_queue *q)
{
    if (!q->len || *q->abort) return NULL;
    tr_item *it = q->q[q->head];
    q->head = (q->head + 1) % q->cap;
    q->len--;
    pthread_cond_broadcast(&q->cv);
    return it;
}

/* NULL when closed and empty, or aborted. */
tr_item *tr_queue_pop(tr_queue *q)
{
    pthread_mutex_lock(q->mu);
    while (q->len == 0 && !q->closed && !*q->abort) pthread_cond_wait(&q->cv, q->mu);
    tr_item *it = take_locked(q);
    pthread_mutex_unlock(q->mu);
    return it;
}

tr_item *tr_queue_try_pop(tr_queue *q)
{
    pthread_mutex_lock(q->mu);
    tr_item *it = take_locked(q);
    pthread_mutex_unlock(q->mu);
    return it;
}

void tr_queue_close(tr_queue *q)
{
    pthread_mutex_lock(q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(q->mu);
}

