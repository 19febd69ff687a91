/* How workers share the training file: static ranges or shared chunks, and the reader loop
 * over epochs (with the batches a resumed run already trained skipped). */
#include "train/trainer_int.h"

#include <stdlib.h>
#include <string.h>

int tr_data_setup(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    tr_data *d = &tr->data;
    if (!d->shared) {
        /* Static: worker i reads the i-th of W contiguous ranges. */
        uint64_t *off = calloc(o->workers + 1, sizeof *off), *first = calloc(o->workers + 1, sizeof *first);
        int rc = off && first ? gr_criteo_split(o->train_path, o->workers, off, first)
                              : gr_seterr(GR_ENOMEM, "train: out of memory");
        for (unsigned i = 0; !rc && i < o->workers; i++) {
            tr->workers[i].start = off[i];
            tr->workers[i].end = off[i + 1];
            tr->workers[i].first_line = first[i];
        }
        free(off);
        free(first);
        return rc;
    }
    d->chunk_off = calloc(d->nchunks + 1, sizeof *d->chunk_off);
    d->chunk_line = calloc(d->nchunks + 1, sizeof *d->chunk_line);
    if (!d->chunk_off || !d->chunk_line) return gr_seterr(GR_ENOMEM, "train: out of memory");
    return gr_criteo_split(o->train_path, d->nchunks, d->chunk_off, d->chunk_line);
}

int tr_data_track(trainer *tr)
{
    tr_data *d = &tr->data;
    if (!d->shared) return GR_OK;
    d->nchunk_total = (uint64_t)tr->o->epochs * d->nchunks;
    d->chunk_owner = malloc(d->nchunk_total * sizeof *d->chunk_owner);
    d->chunk_pushed = calloc(d->nchunk_total, sizeof *d->chunk_pushed);
    d->chunk_done = calloc(d->nchunk_total, sizeof *d->chunk_done);
    if (!d->chunk_owner || !d->chunk_pushed || !d->chunk_done)
        return gr_seterr(GR_ENOMEM, "train: out of memory");
    for (uint64_t c = 0; c < d->nchunk_total; c++) d->chunk_owner[c] = -1;
    return GR_OK;
}

void tr_data_fini(tr_data *d)
{
    free(d->chunk_off);
    free(d->chunk_line);
    free(d->chunk_owner);
    free(d->chunk_pushed);
    free(d->chunk_done);
}

/* The next byte range this worker reads: its own range once per epoch (static data), or the
 * next chunk of the shared list. false when there is none left. */
static bool next_range(tr_worker *w, unsigned *epoch, uint64_t *start, uint64_t *end, uint64_t *line,
                       uint64_t *chunk, uint64_t *skip)
{
    trainer *tr = w->tr;
    *chunk = UINT64_MAX;
    *skip = 0;
    if (!tr->data.shared) {
        if (*epoch >= tr->o->epochs || w->start >= w->end) return false;
        *start = w->start;
        *end = w->end;
        *line = w->first_line;
        (*epoch)++;
        return true;
    }
    for (;;) {
        uint64_t c = atomic_fetch_add(&tr->data.next_chunk, 1);
        if (c >= (uint64_t)tr->o->epochs * tr->data.nchunks) return false;
        unsigned k = (unsigned)(c % tr->data.nchunks);
        if (tr->data.chunk_off[k] >= tr->data.chunk_off[k + 1]) continue; /* empty chunk */
        if (tr->data.chunk_owner) {
            /* Checkpoints track who reads which chunk; a resumed run skips what is done. */
            pthread_mutex_lock(&tr->mu);
            bool done = tr->data.chunk_done[c];
            tr->data.chunk_owner[c] = (int32_t)w->id;
            *skip = tr->data.chunk_pushed[c];
            pthread_mutex_unlock(&tr->mu);
            if (done) continue;
        }
        *chunk = c;
        *start = tr->data.chunk_off[k];
        *end = tr->data.chunk_off[k + 1];
        *line = tr->data.chunk_line[k];
        return true;
    }
}

int tr_read_epochs(tr_worker *w, tr_queue *pool, tr_queue *out, tr_item *single, tr_batch_fn each)
{
    trainer *tr = w->tr;
    const gr_train_opts *o = tr->o;
    if (o->follow) return tr_read_follow(w, pool, out, single, each);
    unsigned epoch = 0;
    uint64_t start, end, line, chunk, range_skip;
    while (next_range(w, &epoch, &start, &end, &line, &chunk, &range_skip)) {
        /* Batches a resumed run already trained are read again and dropped: static data skips
         * the worker's count across epochs, shared data each chunk's own count. */
        uint64_t *skip = tr->data.shared ? &range_skip : &w->skip;
        gr_criteo_opts ro;
        gr_criteo_opts_default(&ro);
        ro.batch = o->batch;
        ro.threads = o->parse_threads;
        ro.strict = o->strict;
        ro.start = start;
        ro.end = end;
        ro.first_line = line;
        gr_criteo_reader *r;
        int rc = gr_criteo_open(o->train_path, &ro, &r);
        if (rc) return rc;
        for (;;) {
            if (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) break;
            if (o->max_steps && w->base + w->read >= o->max_steps) break;
            tr_item *it = single ? single : tr_queue_pop(pool);
            if (!it) break; /* tr_aborted */
            double t0 = gr_now_s();
            rc = gr_criteo_next(r, &it->batch);
            while (!rc && it->batch.n > 0 && *skip > 0) {
                (*skip)--;
                rc = gr_criteo_next(r, &it->batch);
            }
            memset(&it->t, 0, sizeof it->t);
            it->t.read = gr_now_s() - t0;
            it->dropped = false;
            if (rc || it->batch.n == 0) {
                if (!single) tr_queue_push(pool, it);
                break;
            }
            it->chunk = chunk;
            it->seq = w->next_seq++;
            w->read++;
            atomic_fetch_add(&tr->read_examples, it->batch.n);
            if (single) {
                rc = each(w, it);
                if (rc) break;
            } else {
                tr_queue_push(out, it);
            }
            if (tr_aborted(w)) break;
        }
        gr_criteo_stats st;
        gr_criteo_get_stats(r, &st);
        gr_criteo_close(r);
        pthread_mutex_lock(&tr->mu);
        tr->bad_lines += st.bad_lines;
        pthread_mutex_unlock(&tr->mu);
        if (rc) return rc;
        if (tr_aborted(w) ||
            (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) ||
            (o->max_steps && w->base + w->read >= o->max_steps))
            break;
    }
    return GR_OK;
}
