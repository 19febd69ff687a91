/* How workers share the training file: static ranges or shared chunks, and the reader loop
 * over epochs (with the batches a resumed run already trained skipped). */
#include "train/trainer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One pass over the file: where every `stride`-th example line starts (byte offset and line
 * number), for up to cap entries; when the list fills, every other entry is dropped and the
 * stride doubles, so the entries stay at multiples of the batch. Empty lines (the reader
 * ignores them) are not examples. */
typedef struct unit_list {
    uint64_t *off, *line;
    size_t n, cap;
    uint64_t stride, examples;
} unit_list;

static void unit_add(unit_list *u, uint64_t off, uint64_t line)
{
    if (u->n == u->cap) {
        size_t k = 0;
        for (size_t i = 0; i < u->n; i += 2, k++) {
            u->off[k] = u->off[i];
            u->line[k] = u->line[i];
        }
        u->n = k;
        u->stride *= 2;
        /* This example starts a unit of the new stride only if it is a multiple of it. */
        if (u->examples % u->stride) return;
    }
    u->off[u->n] = off;
    u->line[u->n++] = line;
}

static int scan_units(const char *path, unit_list *u)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gr_seterr(errno == ENOENT ? GR_ENOENT : GR_EIO, "%s: cannot open: %s", path,
                         strerror(errno));
    enum { BLOCK = 1 << 20 };
    char *buf = malloc(BLOCK);
    if (!buf) {
        close(fd);
        return gr_seterr(GR_ENOMEM, "train: out of memory");
    }
    uint64_t base = 0, line = 1, pending_cr = UINT64_MAX; /* offset of a line that began '\r' */
    bool at_start = true;
    int rc = GR_OK;
    for (;;) {
        ssize_t got = read(fd, buf, BLOCK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = gr_seterr(GR_EIO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (got == 0) break;
        for (size_t i = 0; i < (size_t)got;) {
            char ch = buf[i];
            if (pending_cr != UINT64_MAX) {
                /* A line that began with '\r': "\r\n" is empty, anything else an example. */
                if (ch != '\n') {
                    if (u->examples % u->stride == 0) unit_add(u, pending_cr, line);
                    u->examples++;
                    at_start = false;
                }
                pending_cr = UINT64_MAX;
            }
            if (at_start) {
                if (ch == '\n') {
                    line++;
                    i++;
                    continue;
                }
                if (ch == '\r') {
                    pending_cr = base + i;
                    i++;
                    continue;
                }
                if (u->examples % u->stride == 0) unit_add(u, base + i, line);
                u->examples++;
                at_start = false;
            }
            const char *nl = memchr(buf + i, '\n', (size_t)got - i);
            if (!nl) break;
            i = (size_t)(nl - buf) + 1;
            line++;
            at_start = true;
        }
        base += (uint64_t)got;
    }
    /* A last line of just "\r" is empty too. */
    close(fd);
    free(buf);
    return rc;
}

/* Shared chunks of whole batches: up to nchunks chunks, each starting at a batch's first
 * example, so the reader cuts full batches everywhere but at the end of the file. */
static int split_batches(trainer *tr, uint64_t file_bytes)
{
    tr_data *d = &tr->data;
    unit_list u = {.cap = (size_t)d->nchunks * 16, .stride = tr->o->batch};
    u.off = malloc(u.cap * sizeof *u.off);
    u.line = malloc(u.cap * sizeof *u.line);
    int rc = u.off && u.line ? scan_units(tr->o->train_path, &u)
                             : gr_seterr(GR_ENOMEM, "train: out of memory");
    if (!rc && u.n == 0) {
        /* No example at all: one chunk over the whole file (the reader finds nothing). */
        u.off[0] = 0;
        u.line[0] = 1;
        u.n = 1;
    }
    unsigned c = u.n < d->nchunks ? (unsigned)u.n : d->nchunks;
    if (!rc) {
        d->chunk_off = calloc(c + 1, sizeof *d->chunk_off);
        d->chunk_line = calloc(c + 1, sizeof *d->chunk_line);
        if (!d->chunk_off || !d->chunk_line) rc = gr_seterr(GR_ENOMEM, "train: out of memory");
    }
    for (unsigned k = 0; !rc && k < c; k++) {
        size_t at = (size_t)((uint64_t)k * u.n / c);
        d->chunk_off[k] = k ? u.off[at] : 0;
        d->chunk_line[k] = k ? u.line[at] : 1;
    }
    if (!rc) {
        d->chunk_off[c] = file_bytes;
        d->nchunks = c;
    }
    free(u.off);
    free(u.line);
    return rc;
}

int tr_data_setup(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    tr_data *d = &tr->data;
    if (!d->shared) {
        /* Static: worker i reads the i-th of W contiguous ranges; in a job of several
         * processes, the job's worker rank * W + i reads the (rank * W + i)-th of ranks * W, as
         * one process with ranks * W workers would. */
        unsigned ranks = o->job ? o->job->ranks : 1, base = o->job ? o->job->rank * o->workers : 0;
        unsigned parts = ranks * o->workers;
        uint64_t *off = calloc(parts + 1, sizeof *off), *first = calloc(parts + 1, sizeof *first);
        int rc = off && first ? gr_criteo_split(o->train_path, parts, off, first)
                              : gr_seterr(GR_ENOMEM, "train: out of memory");
        for (unsigned i = 0; !rc && i < o->workers; i++) {
            tr->workers[i].start = off[base + i];
            tr->workers[i].end = off[base + i + 1];
            tr->workers[i].first_line = first[base + i];
        }
        free(off);
        free(first);
        return rc;
    }
    if (d->by_batch) {
        struct stat st;
        if (stat(o->train_path, &st) != 0)
            return gr_seterr(errno == ENOENT ? GR_ENOENT : GR_EIO, "%s: %s", o->train_path,
                             strerror(errno));
        return split_batches(tr, (uint64_t)st.st_size);
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

/* The most batches any worker has handed on, resumed ones included. Under mu. */
static uint64_t most_claimed(const trainer *tr)
{
    uint64_t m = 0;
    for (unsigned i = 0; i < tr->o->workers; i++) {
        const tr_worker *x = &tr->workers[i];
        if (x->base + x->read > m) m = x->base + x->read;
    }
    return m;
}

/* Whether the worker may hand on the batch it has just read (and counts it), or stops here
 * because a stop was asked for. Counted under mu so that the stop step, computed once from
 * every worker's count, is final: no worker can count past it afterwards. */
static bool claim_batch(tr_worker *w)
{
    trainer *tr = w->tr;
    const gr_train_opts *o = tr->o;
    pthread_mutex_lock(&tr->mu);
    if (!tr->stopping && o->should_stop && o->should_stop(o->stop_ctx)) {
        tr->stopping = true;
        /* Sync and hybrid steps take one batch of every worker: all stop after the same one.
         * The other modes stop each worker where it is (stop_at 0). */
        bool rounds = tr->stepped && (o->mode == GR_MODE_SYNC || o->mode == GR_MODE_HYBRID);
        tr->stop_at = rounds ? most_claimed(tr) : 0;
        pthread_cond_broadcast(&tr->cv);
    }
    bool ok = !tr->stopping || w->base + w->read < tr->stop_at;
    if (ok) w->read++;
    pthread_mutex_unlock(&tr->mu);
    return ok;
}

int tr_read_epochs(tr_worker *w, tr_queue *pool, tr_queue *out, tr_item *single, tr_batch_fn each)
{
    trainer *tr = w->tr;
    const gr_train_opts *o = tr->o;
    if (o->follow) return tr_read_follow(w, pool, out, single, each);
    unsigned epoch = 0;
    uint64_t start, end, line, chunk, range_skip;
    bool stopped = false;
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
        ro.schema = tr->schema;
        /* One log of bad lines for the whole file, not one per range (chunk). */
        ro.on_bad = tr_badlog_on_bad;
        ro.on_bad_ctx = &tr->badlog;
        gr_criteo_reader *r;
        int rc = gr_criteo_open(o->train_path, &ro, &r);
        if (rc) return rc;
        if (single) w->reader = r;
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
            if (rc || it->batch.n == 0 || !claim_batch(w)) {
                if (!single) tr_queue_push(pool, it);
                if (!rc && it->batch.n > 0) stopped = true;
                break;
            }
            it->chunk = chunk;
            it->seq = w->next_seq++;
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
        w->reader = NULL;
        gr_criteo_close(r);
        tr_badlog_add(&tr->badlog, &st);
        pthread_mutex_lock(&tr->mu);
        tr->bad_lines += st.bad_lines;
        pthread_mutex_unlock(&tr->mu);
        if (rc) return rc;
        if (stopped || tr_aborted(w) ||
            (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) ||
            (o->max_steps && w->base + w->read >= o->max_steps))
            break;
    }
    return GR_OK;
}
