/* Streaming input for `granary train --follow` and `--train -`: a reader that tails a growing
 * training file (tail -F semantics: waits for new lines, starts over when the file is
 * truncated, switches to the new file when it is rotated, after draining the old one) or
 * reads a pipe such as stdin, and hands out batches to every worker of the trainer in turn.
 * It ends when the caller's stop flag is set (or a pipe reaches its end); the trainer then
 * finishes the batches in flight, saves its last checkpoint and reports. */
#include "train/trainer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FOLLOW_BUF (1u << 20)
#define FOLLOW_POLL_MS 100
/* A partial batch is handed out when no new line came for this long, so a slow stream still
 * trains (and its rows still reach the replicas) instead of waiting for a full batch. */
#define FOLLOW_FLUSH_S 0.5

struct gr_follow {
    char *path; /* NULL: stdin */
    int fd;
    bool is_file;
    dev_t dev;
    ino_t ino;
    uint64_t pos; /* bytes read from the current file */
    char *buf;    /* unparsed bytes: at most one partial line between reads */
    size_t len;
    uint64_t line;
    const atomic_bool *stop;
    bool (*stop_fn)(void *ctx); /* the trainer's should_stop, asked as often as stop is read */
    void *stop_ctx;
    bool eof; /* a pipe ended */
    gr_criteo_stats st;
    pthread_mutex_t mu; /* workers take batches in turn */
};

static int open_path(gr_follow *f)
{
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return -1;
    }
    if (f->fd >= 0) close(f->fd);
    f->fd = fd;
    f->is_file = S_ISREG(sb.st_mode);
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
    f->pos = 0;
    return 0;
}

int gr_follow_open(const char *path, const atomic_bool *stop, gr_follow **out)
{
    *out = NULL;
    gr_follow *f = calloc(1, sizeof *f);
    if (!f || !(f->buf = malloc(FOLLOW_BUF))) {
        free(f);
        return gr_seterr(GR_ENOMEM, "follow: out of memory");
    }
    f->fd = -1;
    f->stop = stop;
    f->line = 1;
    pthread_mutex_init(&f->mu, NULL);
    if (!path || !strcmp(path, "-")) {
        f->fd = dup(0);
        f->is_file = false;
    } else if (!(f->path = strdup(path)) || open_path(f)) {
        int e = errno;
        gr_follow_close(f);
        return gr_seterr(e == ENOENT ? GR_ENOENT : GR_EIO, "cannot open %s: %s", path, strerror(e));
    }
    *out = f;
    return GR_OK;
}

void gr_follow_close(gr_follow *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    pthread_mutex_destroy(&f->mu);
    free(f->path);
    free(f->buf);
    free(f);
}

static bool stopped(const gr_follow *f)
{
    return (f->stop && atomic_load(f->stop)) || (f->stop_fn && f->stop_fn(f->stop_ctx));
}

void tr_follow_set_stop(gr_follow *f, bool (*fn)(void *ctx), void *ctx)
{
    f->stop_fn = fn;
    f->stop_ctx = ctx;
}

/* A file that was rotated (the path names another file now) or truncated (shorter than what
 * was read). Only asked once the current file has nothing more to read. */
static void check_rotation(gr_follow *f)
{
    struct stat cur, sb;
    if (!f->is_file || stat(f->path, &sb) != 0) return;
    if (sb.st_dev != f->dev || sb.st_ino != f->ino) {
        GR_LOGI("follow: %s was rotated; reading the new file", f->path);
        f->len = 0; /* a partial last line of the old file never completes */
        open_path(f);
    } else if (fstat(f->fd, &cur) == 0 && (uint64_t)cur.st_size < f->pos) {
        GR_LOGI("follow: %s was truncated; reading it from the start", f->path);
        f->pos = 0;
        f->len = 0;
    }
}

/* Reads what is there now (waiting up to FOLLOW_POLL_MS for a pipe); true when it got bytes. */
static bool read_more(gr_follow *f)
{
    if (f->len == FOLLOW_BUF) { /* a line longer than the buffer: drop it as bad */
        f->st.bad_lines++;
        f->st.lines++;
        f->len = 0;
    }
    ssize_t got;
    if (f->is_file) {
        got = pread(f->fd, f->buf + f->len, FOLLOW_BUF - f->len, (off_t)f->pos);
    } else {
        struct pollfd pf = {f->fd, POLLIN, 0};
        if (poll(&pf, 1, FOLLOW_POLL_MS) <= 0) return false;
        got = read(f->fd, f->buf + f->len, FOLLOW_BUF - f->len);
        if (got == 0) f->eof = true;
    }
    if (got <= 0) return false;
    f->pos += (uint64_t)got;
    f->len += (size_t)got;
    return true;
}

/* Parses complete lines from the buffer into b until it holds max examples. */
static void take_lines(gr_follow *f, gr_batch *b, size_t max)
{
    size_t off = 0;
    while (b->n < max) {
        char *nl = memchr(f->buf + off, '\n', f->len - off);
        if (!nl) break;
        size_t n = (size_t)(nl - (f->buf + off));
        f->st.lines++;
        if (n == 0 || (n == 1 && f->buf[off] == '\r')) {
            f->st.empty_lines++;
        } else if (gr_criteo_parse_line(f->buf + off, n, &b->labels[b->n],
                                        &b->dense[b->n * GR_CRITEO_DENSE],
                                        &b->ids[b->n * GR_CRITEO_SPARSE]) == GR_OK) {
            b->n++;
            f->st.examples++;
        } else {
            if (!f->st.bad_lines++) {
                f->st.first_bad_line = f->line;
                snprintf(f->st.first_bad_msg, sizeof f->st.first_bad_msg, "%s", gr_errmsg());
                GR_LOGW("follow: line %llu skipped: %s", (unsigned long long)f->line, gr_errmsg());
            }
        }
        f->line++;
        off += n + 1;
    }
    memmove(f->buf, f->buf + off, f->len - off);
    f->len -= off;
}

int gr_follow_next(gr_follow *f, gr_batch *b, size_t max)
{
    /* A stream is read in the Criteo layout (the trainer refuses another schema with it). */
    if (b->n_dense != GR_CRITEO_DENSE || b->n_sparse != GR_CRITEO_SPARSE || b->bag_off)
        return gr_seterr(GR_EINVAL, "follow: streams are read in the Criteo layout only");
    if (max > b->cap) max = b->cap;
    b->n = 0;
    b->n_ids = 0;
    pthread_mutex_lock(&f->mu);
    double last = gr_now_s();
    while (b->n < max && !stopped(f)) {
        take_lines(f, b, max);
        if (b->n == max) break;
        if (read_more(f)) {
            last = gr_now_s();
            continue;
        }
        if (f->eof) {
            take_lines(f, b, max);
            break;
        }
        if (b->n && gr_now_s() - last >= FOLLOW_FLUSH_S) break;
        if (f->is_file) {
            check_rotation(f);
            pthread_mutex_unlock(&f->mu);
            usleep(FOLLOW_POLL_MS * 1000);
            pthread_mutex_lock(&f->mu);
        }
    }
    pthread_mutex_unlock(&f->mu);
    b->n_ids = b->n * GR_CRITEO_SPARSE;
    return GR_OK;
}

void gr_follow_get_stats(gr_follow *f, gr_criteo_stats *st)
{
    pthread_mutex_lock(&f->mu);
    *st = f->st;
    pthread_mutex_unlock(&f->mu);
}

/* The trainer's reader stage in follow mode: batches from the shared stream until it ends. */
int tr_read_follow(tr_worker *w, tr_queue *pool, tr_queue *out, tr_item *single, tr_batch_fn each)
{
    trainer *tr = w->tr;
    const gr_train_opts *o = tr->o;
    int rc = GR_OK;
    for (;;) {
        if (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) break;
        if (o->max_steps && w->base + w->read >= o->max_steps) break;
        tr_item *it = single ? single : tr_queue_pop(pool);
        if (!it) break;
        double t0 = gr_now_s();
        rc = gr_follow_next(tr->follow, &it->batch, o->batch);
        memset(&it->t, 0, sizeof it->t);
        it->t.read = gr_now_s() - t0;
        it->dropped = false;
        if (rc || it->batch.n == 0) {
            if (!single) tr_queue_push(pool, it);
            break;
        }
        it->chunk = 0;
        it->seq = w->next_seq++;
        w->read++;
        atomic_fetch_add(&tr->read_examples, it->batch.n);
        if (single) {
            if ((rc = each(w, it))) break;
        } else {
            tr_queue_push(out, it);
        }
        if (tr_aborted(w)) break;
    }
    return rc;
}
