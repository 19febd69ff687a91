/* The shard file writer. The caller's thread reads the tables into 1 MiB column blocks and a
 * writer thread checksums, optionally compresses (zstd, streamed over the block's columns) and
 * writes them behind it; a flusher thread starts writeback. Table locks are never held while
 * waiting for the disk: full saves list the keys (a scan that only copies keys) and read rows
 * in batches with gr_table_get, waiting between batches; delta saves stop their dirty scan
 * when the blocks run out and resume it after waiting. The file is written under a temporary
 * name, fsynced, renamed and its directory fsynced. */
#include "ckpt/ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>
#include <zstd.h>

#define OBUF_BYTES (1u << 20)
#define POOL_MIB 64        /* default blocks in flight at most (1 MiB each) */
#define SCAN_PAUSE 1       /* scan callback result: stop here, resume after the writer caught up */
#define KEY_CHUNK (1u << 17) /* keys per chunk of a key list (1 MiB) */
#define WRITEBACK_EVERY (64ull << 20) /* start writeback every 64 MiB (keeps fsync short) */

typedef struct ck_job {
    struct ck_job *next;
    uint16_t type;
    uint32_t table;
    uint64_t count;
    ck_table_info ti;     /* ROWS geometry */
    uint64_t cap;         /* rows (or keys) the block has room for */
    unsigned char *buf;   /* CK_BLOCK_BYTES for ROWS/KEYS; else malloc'd small payload */
    size_t len;           /* small payload length */
} ck_job;

typedef struct ck_writer {
    int fd;
    const char *path; /* temporary path, for messages */
    XXH3_state_t *fh; /* hash of the content written so far */
    XXH3_state_t *sh; /* hash of the section being written */
    uint64_t off;
    /* The flusher thread asks the kernel to write back what the writer wrote, so the final
     * fsync stays short; it runs apart because sync_file_range blocks while the device queue
     * is full, and the writer must keep draining blocks for the scan meanwhile. */
    pthread_mutex_t fl_mu;
    pthread_cond_t fl_cv;
    uint64_t fl_written; /* bytes handed to write() so far */
    bool fl_closing;
    pthread_t fl_thr;
    bool fl_started;
    unsigned char *obuf;
    size_t olen;
    ZSTD_CCtx *zc;
    int level;
    unsigned char *zbuf;
    size_t zcap;
    uint64_t end_offset;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_free;
    ck_job *qhead, *qtail;
    ck_job *free_blocks;
    int nblocks; /* allocated, pooled or in flight */
    int nfree;   /* in the free list */
    int pool_blocks;
    bool closing;
    int err;          /* first error of the writer thread */
    char errmsg[512]; /* its message (gr_errmsg is per thread) */
    pthread_t thr;
    bool thr_started;

    /* producer side */
    ck_job *cur;
    ck_table_info ti;
    uint32_t table;
    const char *table_name; /* for messages */
    uint64_t rows, keys, fault_after;
    uint64_t table_rows, table_keys;
    int cb_err;
} ck_writer;

/* ---- raw output (writer thread, or the caller before/after it runs) ---- */

/* Tells the flusher how far the file has been written (w->off counts bytes passed to
 * write(); called after each write so the flusher never asks for unwritten ranges). */
static void note_written(ck_writer *w)
{
    pthread_mutex_lock(&w->fl_mu);
    w->fl_written = w->off - w->olen;
    pthread_cond_signal(&w->fl_cv);
    pthread_mutex_unlock(&w->fl_mu);
}

static void *flusher_main(void *arg)
{
    ck_writer *w = arg;
    uint64_t done = 0;
    pthread_mutex_lock(&w->fl_mu);
    for (;;) {
        while (!w->fl_closing && w->fl_written - done < WRITEBACK_EVERY)
            pthread_cond_wait(&w->fl_cv, &w->fl_mu);
        if (w->fl_closing) break;
        uint64_t upto = w->fl_written;
        pthread_mutex_unlock(&w->fl_mu);
        /* Advisory: errors are ignored (the final fsync reports real ones). */
        (void)sync_file_range(w->fd, (off_t)done, (off_t)(upto - done), SYNC_FILE_RANGE_WRITE);
        done = upto;
        pthread_mutex_lock(&w->fl_mu);
    }
    pthread_mutex_unlock(&w->fl_mu);
    return NULL;
}

static void stop_flusher(ck_writer *w)
{
    if (!w->fl_started) return;
    pthread_mutex_lock(&w->fl_mu);
    w->fl_closing = true;
    pthread_cond_signal(&w->fl_cv);
    pthread_mutex_unlock(&w->fl_mu);
    pthread_join(w->fl_thr, NULL);
    w->fl_started = false;
}

static int out_flush(ck_writer *w)
{
    size_t done = 0;
    while (done < w->olen) {
        ssize_t n = write(w->fd, w->obuf + done, w->olen - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return gr_seterr(GR_EIO, "write to %s failed: %s", w->path, strerror(errno));
        }
        done += (size_t)n;
    }
    w->olen = 0;
    note_written(w);
    return GR_OK;
}

static int out_write(ck_writer *w, const void *data, size_t len)
{
    XXH3_64bits_update(w->fh, data, len);
    w->off += len;
    const unsigned char *p = data;
    while (len > 0) {
        size_t room = OBUF_BYTES - w->olen;
        size_t n = len < room ? len : room;
        memcpy(w->obuf + w->olen, p, n);
        w->olen += n;
        p += n;
        len -= n;
        if (w->olen == OBUF_BYTES) {
            int rc = out_flush(w);
            if (rc != GR_OK) return rc;
        }
    }
    return GR_OK;
}

static void fill_section(ck_section *s, uint16_t type, uint16_t codec, uint32_t table,
                         uint64_t count, uint64_t raw, uint64_t stored, uint64_t sum)
{
    memset(s, 0, sizeof *s);
    s->magic = CK_SECTION_MAGIC;
    s->type = type;
    s->codec = codec;
    s->table = table;
    s->count = count;
    s->raw_len = raw;
    s->stored_len = stored;
    s->payload_checksum = sum;
    s->checksum = gr_checksum(s, offsetof(ck_section, checksum));
}

/* Writes one section whose payload is the concatenation of pieces, compressing it when a
 * level is set. The payload checksum covers the stored bytes, so a reader verifies before it
 * decompresses. */
static int write_section(ck_writer *w, uint16_t type, uint32_t table, uint64_t count,
                         const struct iovec *pieces, int npieces)
{
    uint64_t raw = 0;
    for (int i = 0; i < npieces; i++) raw += pieces[i].iov_len;
    ck_section s;
    if (w->level > 0 && (type == CK_SEC_ROWS || type == CK_SEC_KEYS)) {
        size_t bound = ZSTD_compressBound(raw);
        if (bound > w->zcap) {
            free(w->zbuf);
            w->zbuf = malloc(bound);
            w->zcap = w->zbuf ? bound : 0;
            if (!w->zbuf) return gr_seterr(GR_ENOMEM, "out of memory compressing %s", w->path);
        }
        ZSTD_CCtx_reset(w->zc, ZSTD_reset_session_only);
        ZSTD_CCtx_setPledgedSrcSize(w->zc, raw);
        ZSTD_outBuffer out = {w->zbuf, w->zcap, 0};
        for (int i = 0; i < npieces; i++) {
            ZSTD_inBuffer in = {pieces[i].iov_base, pieces[i].iov_len, 0};
            ZSTD_EndDirective mode = i == npieces - 1 ? ZSTD_e_end : ZSTD_e_continue;
            for (;;) {
                size_t r = ZSTD_compressStream2(w->zc, &out, &in, mode);
                if (ZSTD_isError(r))
                    return gr_seterr(GR_EINTERNAL, "zstd compression for %s failed: %s", w->path,
                                     ZSTD_getErrorName(r));
                if (mode == ZSTD_e_end ? r == 0 : in.pos == in.size) break;
            }
        }
        fill_section(&s, type, CK_CODEC_ZSTD, table, count, raw, out.pos,
                     gr_checksum(w->zbuf, out.pos));
        int rc = out_write(w, &s, sizeof s);
        if (rc == GR_OK) rc = out_write(w, w->zbuf, out.pos);
        return rc;
    }
    XXH3_64bits_reset(w->sh);
    for (int i = 0; i < npieces; i++) XXH3_64bits_update(w->sh, pieces[i].iov_base, pieces[i].iov_len);
    fill_section(&s, type, CK_CODEC_NONE, table, count, raw, raw, XXH3_64bits_digest(w->sh));
    int rc = out_write(w, &s, sizeof s);
    if (rc != GR_OK) return rc;
    if (raw < OBUF_BYTES / 4) {
        for (int i = 0; rc == GR_OK && i < npieces; i++)
            rc = out_write(w, pieces[i].iov_base, pieces[i].iov_len);
        return rc;
    }
    /* Large payloads go from the block to the file without another copy. */
    rc = out_flush(w);
    for (int i = 0; rc == GR_OK && i < npieces; i++) {
        XXH3_64bits_update(w->fh, pieces[i].iov_base, pieces[i].iov_len);
        const unsigned char *p = pieces[i].iov_base;
        size_t left = pieces[i].iov_len;
        while (left > 0) {
            ssize_t n = write(w->fd, p, left);
            if (n < 0) {
                if (errno == EINTR) continue;
                return gr_seterr(GR_EIO, "write to %s failed: %s", w->path, strerror(errno));
            }
            p += n;
            left -= (size_t)n;
        }
        w->off += pieces[i].iov_len;
        note_written(w);
    }
    return rc;
}

/* Column layout of a ROWS block with room for cap rows: keys, weights, state, meta. */
static void block_columns(const ck_table_info *ti, unsigned char *buf, uint64_t cap,
                          uint64_t **keys, unsigned char **weights, float **state,
                          gr_row_meta **meta)
{
    size_t wsz = ti->weight_type == CK_W_F16 ? 2 : 4;
    *keys = (uint64_t *)buf;
    *weights = buf + 8 * cap;
    *state = (float *)(*weights + wsz * ti->dim * cap);
    *meta = (gr_row_meta *)((unsigned char *)*state + 4ull * ti->state_floats * cap);
}

static int write_job(ck_writer *w, ck_job *j)
{
    if (j->type == CK_SEC_ROWS) {
        uint64_t *keys;
        unsigned char *weights;
        float *state;
        gr_row_meta *meta;
        block_columns(&j->ti, j->buf, j->cap, &keys, &weights, &state, &meta);
        size_t wsz = j->ti.weight_type == CK_W_F16 ? 2 : 4;
        struct iovec v[4];
        int n = 0;
        v[n++] = (struct iovec){keys, 8 * j->count};
        v[n++] = (struct iovec){weights, wsz * j->ti.dim * j->count};
        if (j->ti.state_floats) v[n++] = (struct iovec){state, 4ull * j->ti.state_floats * j->count};
        if (j->ti.has_meta) v[n++] = (struct iovec){meta, 8 * j->count};
        return write_section(w, CK_SEC_ROWS, j->table, j->count, v, n);
    }
    if (j->type == CK_SEC_KEYS) {
        struct iovec v = {j->buf, 8 * j->count};
        return write_section(w, CK_SEC_KEYS, j->table, j->count, &v, 1);
    }
    if (j->type == CK_SEC_END) w->end_offset = w->off;
    struct iovec v = {j->buf, j->len};
    return write_section(w, j->type, j->table, j->count, &v, 1);
}

static void *writer_main(void *arg)
{
    ck_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->qhead && !w->closing) pthread_cond_wait(&w->cv_work, &w->mu);
        ck_job *j = w->qhead;
        if (!j) break; /* closing and drained */
        w->qhead = j->next;
        if (!w->qhead) w->qtail = NULL;
        int failed = w->err;
        pthread_mutex_unlock(&w->mu);
        int rc = failed ? GR_OK : write_job(w, j);
        pthread_mutex_lock(&w->mu);
        if (rc != GR_OK && !w->err) {
            w->err = rc;
            snprintf(w->errmsg, sizeof w->errmsg, "%s", gr_errmsg());
        }
        if (j->type == CK_SEC_ROWS || j->type == CK_SEC_KEYS) {
            /* Blocks past the pool are kept too: allocating them again would page-fault
             * under the scan's partition lock. All are freed when the save ends. */
            j->next = w->free_blocks;
            w->free_blocks = j;
            w->nfree++;
            pthread_cond_broadcast(&w->cv_free);
        } else {
            free(j->buf);
            free(j);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void submit(ck_writer *w, ck_job *j)
{
    pthread_mutex_lock(&w->mu);
    j->next = NULL;
    if (w->qtail) w->qtail->next = j;
    else w->qhead = j;
    w->qtail = j;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
}

static int submit_small(ck_writer *w, uint16_t type, uint32_t table, uint64_t count, void *buf,
                        size_t len)
{
    ck_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(buf);
        return gr_seterr(GR_ENOMEM, "out of memory writing %s", w->path);
    }
    j->type = type;
    j->table = table;
    j->count = count;
    j->buf = buf;
    j->len = len;
    submit(w, j);
    return GR_OK;
}

/* Blocks in flight (queued or being written). */
static int inflight_locked(const ck_writer *w) { return w->nblocks - w->nfree; }

/* Waits, holding no table lock, until at most `max_inflight` blocks are queued: the scans
 * pace themselves here, between partitions or between dirty-scan passes. */
static void wait_inflight(ck_writer *w, int max_inflight)
{
    int held = w->cur ? 1 : 0; /* the block the scan is filling is not waiting for the writer */
    pthread_mutex_lock(&w->mu);
    while (!w->err && inflight_locked(w) - held > max_inflight)
        pthread_cond_wait(&w->cv_free, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* A block to fill: a pooled one, or a new one while fewer than pool_blocks exist. When all
 * are in flight, a caller holding no table lock waits for the writer; the dirty-scan callback,
 * which holds a partition lock, gets NULL with *pause set instead, stops its scan, and waits
 * after the lock is released (wait_inflight), so no table lock is ever held across a wait for
 * the disk. */
static ck_job *get_block(ck_writer *w, bool under_lock, bool *pause)
{
    *pause = false;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (w->err) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        if (w->free_blocks) {
            ck_job *j = w->free_blocks;
            w->free_blocks = j->next;
            w->nfree--;
            pthread_mutex_unlock(&w->mu);
            return j;
        }
        if (w->nblocks < w->pool_blocks) {
            w->nblocks++;
            pthread_mutex_unlock(&w->mu);
            ck_job *j = calloc(1, sizeof *j);
            void *buf = NULL;
            if (j && posix_memalign(&buf, 4096, CK_BLOCK_BYTES) == 0) {
                /* Touch it now: see prefault_blocks. */
                memset(buf, 0, CK_BLOCK_BYTES);
                j->buf = buf;
                return j;
            }
            free(j);
            pthread_mutex_lock(&w->mu);
            w->nblocks--;
            if (inflight_locked(w) == 0) {
                pthread_mutex_unlock(&w->mu);
                gr_seterr(GR_ENOMEM, "out of memory for checkpoint blocks (%s)", w->path);
                return NULL;
            }
        }
        if (under_lock) {
            pthread_mutex_unlock(&w->mu);
            *pause = true;
            return NULL;
        }
        pthread_cond_wait(&w->cv_free, &w->mu);
    }
}

static void put_block(ck_writer *w, ck_job *j)
{
    pthread_mutex_lock(&w->mu);
    j->next = w->free_blocks;
    w->free_blocks = j;
    w->nfree++;
    pthread_cond_broadcast(&w->cv_free);
    pthread_mutex_unlock(&w->mu);
}

static int writer_error(ck_writer *w)
{
    pthread_mutex_lock(&w->mu);
    int err = w->err;
    if (err) gr_seterr(err, "%s", w->errmsg);
    pthread_mutex_unlock(&w->mu);
    return err;
}

/* get_block failed: either the writer thread failed (carry its message over to this thread)
 * or there was no memory (message already set). Stops the scan. */
static int block_failed(ck_writer *w)
{
    int err = writer_error(w);
    w->cb_err = err ? err : GR_ENOMEM;
    return w->cb_err;
}

static void flush_block(ck_writer *w)
{
    if (w->cur && w->cur->count > 0) {
        submit(w, w->cur);
        w->cur = NULL;
    }
}

static int row_cb(void *ctx, uint64_t key, const float *weights, const float *state,
                  const gr_row_meta *meta)
{
    ck_writer *w = ctx;
    if (w->fault_after && w->rows >= w->fault_after) {
        w->cb_err = gr_seterr(GR_EIO, "injected failure after %llu rows (testing hook)",
                              (unsigned long long)w->rows);
        return w->cb_err;
    }
    /* What the loader would refuse is never written: the save fails, naming the row. */
    int bad = ck_check_row("checkpoint save (nothing committed)", w->table_name, key, weights,
                           w->ti.dim, w->ti.weight_type == CK_W_F16, state, w->ti.state_floats);
    if (bad) {
        w->cb_err = bad;
        return bad;
    }
    if (!w->cur) {
        bool pause;
        w->cur = get_block(w, true, &pause);
        if (pause) return SCAN_PAUSE; /* this row stays dirty and is visited after the wait */
        if (!w->cur) return block_failed(w);
        w->cur->type = CK_SEC_ROWS;
        w->cur->table = w->table;
        w->cur->ti = w->ti;
        w->cur->count = 0;
        uint64_t cap = CK_BLOCK_BYTES / ck_row_bytes(&w->ti);
        w->cur->cap = cap ? cap : 1;
    }
    ck_job *j = w->cur;
    uint64_t *keys;
    unsigned char *wcol;
    float *scol;
    gr_row_meta *mcol;
    block_columns(&j->ti, j->buf, j->cap, &keys, &wcol, &scol, &mcol);
    uint64_t i = j->count;
    uint32_t dim = j->ti.dim;
    keys[i] = key;
    if (j->ti.weight_type == CK_W_F16) {
        uint16_t *h = (uint16_t *)wcol + (size_t)i * dim;
        for (uint32_t d = 0; d < dim; d++) h[d] = gr_f32_to_f16(weights[d]);
    } else {
        memcpy((float *)wcol + (size_t)i * dim, weights, 4ull * dim);
    }
    if (j->ti.state_floats)
        memcpy(scol + (size_t)i * j->ti.state_floats, state, 4ull * j->ti.state_floats);
    if (j->ti.has_meta) mcol[i] = *meta;
    j->count++;
    w->rows++;
    w->table_rows++;
    if (j->count == j->cap) {
        submit(w, j);
        w->cur = NULL;
    }
    return 0;
}

/* Keys collected by a scan, in chunks (never moved, so appending under a partition lock
 * costs a store, and a new chunk is only an allocation). */
typedef struct keylist {
    uint64_t **chunks;
    size_t nchunks, cap_chunks; /* chunks allocated, room for pointers */
    uint64_t n;
    bool failed;
} keylist;

static void keylist_free(keylist *kl)
{
    for (size_t i = 0; i < kl->nchunks; i++) free(kl->chunks[i]);
    free(kl->chunks);
    memset(kl, 0, sizeof *kl);
}

static int keylist_cb(void *ctx, uint64_t key, const float *weights, const float *state,
                      const gr_row_meta *meta)
{
    (void)weights;
    (void)state;
    (void)meta;
    keylist *kl = ctx;
    size_t c = (size_t)(kl->n / KEY_CHUNK);
    if (c == kl->nchunks) { /* past the pre-faulted chunks: the table grew during the scan */
        if (kl->nchunks == kl->cap_chunks) {
            size_t nc = kl->cap_chunks ? 2 * kl->cap_chunks : 16;
            uint64_t **p = realloc(kl->chunks, nc * sizeof *p);
            if (!p) goto oom;
            kl->chunks = p;
            kl->cap_chunks = nc;
        }
        kl->chunks[c] = malloc((size_t)KEY_CHUNK * sizeof(uint64_t));
        if (!kl->chunks[c]) goto oom;
        kl->nchunks++;
    }
    kl->chunks[c][kl->n % KEY_CHUNK] = key;
    kl->n++;
    return 0;
oom:
    kl->failed = true;
    return gr_seterr(GR_ENOMEM, "out of memory listing the keys of a table");
}

/* Every key of t, read with gr_table_scan: the partition locks are held only to copy keys. */
static int collect_keys(gr_table *t, keylist *kl)
{
    memset(kl, 0, sizeof *kl);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    /* Chunks for the current size and some growth, allocated and touched here, so the scan
     * callback (under a partition lock) never page-faults: under memory pressure a fault can
     * wait for reclaim, which waits for the disk. */
    size_t want = (size_t)((st.rows + st.rows / 16) / KEY_CHUNK) + 1;
    kl->chunks = malloc((want + 8) * sizeof *kl->chunks);
    if (!kl->chunks) return gr_seterr(GR_ENOMEM, "out of memory listing the keys of a table");
    kl->cap_chunks = want + 8;
    for (; kl->nchunks < want; kl->nchunks++) {
        size_t bytes = (size_t)KEY_CHUNK * sizeof(uint64_t);
        if (kl->nchunks == 0 && st.rows < KEY_CHUNK) bytes = (size_t)(st.rows + 64) * 8;
        kl->chunks[kl->nchunks] = malloc((size_t)KEY_CHUNK * sizeof(uint64_t));
        if (!kl->chunks[kl->nchunks]) {
            keylist_free(kl);
            return gr_seterr(GR_ENOMEM, "out of memory listing the keys of a table");
        }
        memset(kl->chunks[kl->nchunks], 0, bytes);
    }
    int rc = gr_table_scan(t, keylist_cb, kl);
    if (rc != 0) {
        keylist_free(kl);
        return rc < 0 ? rc : GR_EINTERNAL;
    }
    return GR_OK;
}

static uint64_t keylist_at(const keylist *kl, uint64_t i)
{
    return kl->chunks[i / KEY_CHUNK][i % KEY_CHUNK];
}

/* KEYS sections from a key list (no table lock is held: waiting for blocks is fine). */
static int write_keys(ck_writer *w, const keylist *kl)
{
    uint64_t per = CK_BLOCK_BYTES / 8;
    for (uint64_t at = 0; at < kl->n;) {
        bool pause;
        ck_job *j = get_block(w, false, &pause);
        if (!j) return block_failed(w);
        uint64_t n = kl->n - at < per ? kl->n - at : per;
        uint64_t *dst = (uint64_t *)j->buf;
        for (uint64_t i = 0; i < n; i++) dst[i] = keylist_at(kl, at + i);
        j->type = CK_SEC_KEYS;
        j->table = w->table;
        j->count = n;
        j->cap = per;
        submit(w, j);
        at += n;
        w->keys += n;
        w->table_keys += n;
    }
    return GR_OK;
}

/* Full and export files: the rows of the listed keys, read in block-sized batches with
 * gr_table_get (which locks each partition only for its part of the batch). Waiting for the
 * disk happens between batches, holding no lock. Keys deleted since they were listed are
 * skipped; rows created since are left to the next delta (their dirty marks are set). */
static int write_rows_by_key(ck_writer *w, gr_table *t, const keylist *kl)
{
    const ck_table_info *ti = &w->ti;
    uint64_t cap = CK_BLOCK_BYTES / ck_row_bytes(ti);
    if (cap == 0) cap = 1;
    uint32_t dim = ti->dim, sf = ti->state_floats;
    bool f16 = ti->weight_type == CK_W_F16;
    float *wtmp = f16 ? malloc(cap * dim * sizeof *wtmp) : NULL;
    bool *found = malloc(cap * sizeof *found);
    int rc = GR_OK;
    if ((f16 && !wtmp) || !found) rc = gr_seterr(GR_ENOMEM, "out of memory writing %s", w->path);
    for (uint64_t at = 0; rc == GR_OK && at < kl->n;) {
        bool pause;
        ck_job *j = get_block(w, false, &pause);
        if (!j) {
            rc = block_failed(w);
            break;
        }
        uint64_t n = kl->n - at < cap ? kl->n - at : cap;
        j->type = CK_SEC_ROWS;
        j->table = w->table;
        j->ti = *ti;
        j->cap = cap;
        uint64_t *keys;
        unsigned char *wcol;
        float *scol;
        gr_row_meta *mcol;
        block_columns(ti, j->buf, cap, &keys, &wcol, &scol, &mcol);
        for (uint64_t i = 0; i < n; i++) keys[i] = keylist_at(kl, at + i);
        float *wout = f16 ? wtmp : (float *)wcol;
        rc = gr_table_get(t, keys, n, wout, sf ? scol : NULL, ti->has_meta ? mcol : NULL, found);
        if (rc != GR_OK) {
            put_block(w, j);
            break;
        }
        uint64_t m = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (!found[i]) continue;
            if (m != i) {
                keys[m] = keys[i];
                memmove(wout + m * dim, wout + i * dim, 4ull * dim);
                if (sf) memmove(scol + m * sf, scol + i * sf, 4ull * sf);
                if (ti->has_meta) mcol[m] = mcol[i];
            }
            m++;
        }
        /* What the loader would refuse is never written: the save fails, naming the row. */
        for (uint64_t i = 0; rc == GR_OK && i < m; i++)
            rc = ck_check_row("checkpoint save (nothing committed)", w->table_name, keys[i],
                              wout + i * dim, dim, f16, sf ? scol + i * sf : NULL, sf);
        if (rc != GR_OK) {
            put_block(w, j);
            break;
        }
        if (f16) {
            uint16_t *h = (uint16_t *)wcol;
            for (uint64_t i = 0; i < m * dim; i++) h[i] = gr_f32_to_f16(wtmp[i]);
        }
        if (w->fault_after && w->rows + m > w->fault_after) {
            put_block(w, j);
            rc = gr_seterr(GR_EIO, "injected failure after %llu rows (testing hook)",
                           (unsigned long long)w->rows);
            break;
        }
        j->count = m;
        w->rows += m;
        w->table_rows += m;
        if (m) submit(w, j);
        else put_block(w, j);
        at += n;
    }
    free(wtmp);
    free(found);
    return rc;
}

static int noop_cb(void *ctx, uint64_t key, const float *weights, const float *state,
                   const gr_row_meta *meta)
{
    (void)ctx;
    (void)key;
    (void)weights;
    (void)state;
    (void)meta;
    return 0;
}

/* Allocates (and touches) the blocks for about `bytes` of rows ahead of a dirty scan, whose
 * callback runs under a partition lock: a first touch there could page-fault, and under
 * memory pressure a fault can wait for reclaim, which waits for the disk. */
static void prefault_blocks(ck_writer *w, uint64_t bytes)
{
    uint64_t want = bytes / CK_BLOCK_BYTES + 1;
    if (want > (uint64_t)w->pool_blocks) want = (uint64_t)w->pool_blocks;
    ck_job *got = NULL;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        bool more = (uint64_t)w->nblocks < want;
        pthread_mutex_unlock(&w->mu);
        if (!more) break;
        bool pause;
        ck_job *j = get_block(w, false, &pause);
        if (!j) break;
        j->next = got;
        got = j;
    }
    while (got) {
        ck_job *n = got->next;
        put_block(w, got);
        got = n;
    }
}

/* The dirty rows of t. The scan stops (SCAN_PAUSE) when the pool is used up; the row it
 * refused stays marked, so after waiting for the writer, holding no lock, the next pass
 * continues where it stopped. */
static int dirty_scan(ck_writer *w, gr_table *t)
{
    prefault_blocks(w, gr_table_dirty_count(t, 0) * ck_row_bytes(&w->ti));
    int rc;
    for (;;) {
        rc = gr_table_scan_dirty(t, 0, row_cb, w);
        if (rc != SCAN_PAUSE) break;
        wait_inflight(w, w->pool_blocks / 2);
    }
    return rc;
}

static int table_section(ck_writer *w, uint32_t index, const gr_table_spec *spec,
                         const ck_table_info *ti_in)
{
    char *json = gr_table_spec_to_json(spec);
    if (!json) return gr_seterr(GR_ENOMEM, "out of memory serialising table '%s'", spec->name);
    size_t jl = strlen(json);
    ck_table_info ti = *ti_in;
    ti.json_len = (uint32_t)jl;
    unsigned char *buf = malloc(sizeof ti + jl);
    if (!buf) {
        free(json);
        return gr_seterr(GR_ENOMEM, "out of memory writing %s", w->path);
    }
    memcpy(buf, &ti, sizeof ti);
    memcpy(buf + sizeof ti, json, jl);
    free(json);
    return submit_small(w, CK_SEC_TABLE, index, 1, buf, sizeof ti + jl);
}

static char *end_json(const gr_ckpt_write_opts *o, const gr_table_spec *specs, size_t n,
                      const uint64_t *rows, const uint64_t *keys, uint64_t total_rows,
                      uint64_t total_keys)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *tabs = cJSON_AddArrayToObject(root, "tables");
    bool ok = root && tabs;
    cJSON_AddStringToObject(root, "kind", gr_ckpt_kind_name(o->kind));
    cJSON_AddNumberToObject(root, "step", (double)o->step);
    cJSON_AddNumberToObject(root, "shard", o->shard);
    cJSON_AddNumberToObject(root, "shards", o->shards);
    cJSON_AddStringToObject(root, "compression", o->zstd_level > 0 ? "zstd" : "none");
    cJSON_AddNumberToObject(root, "rows", (double)total_rows);
    cJSON_AddNumberToObject(root, "keys", (double)total_keys);
    for (size_t i = 0; ok && i < n; i++) {
        char *sj = gr_table_spec_to_json(&specs[i]);
        cJSON *spec = sj ? cJSON_Parse(sj) : NULL;
        free(sj);
        cJSON *t = cJSON_CreateObject();
        if (!spec || !t) {
            cJSON_Delete(spec);
            cJSON_Delete(t);
            ok = false;
            break;
        }
        cJSON_AddItemToObject(t, "spec", spec);
        cJSON_AddNumberToObject(t, "rows", (double)rows[i]);
        cJSON_AddNumberToObject(t, "keys", (double)keys[i]);
        cJSON_AddItemToArray(tabs, t);
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

static int write_file_header(ck_writer *w, const gr_ckpt_write_opts *o, size_t ntables)
{
    ck_file_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CK_MAGIC, 8);
    h.version = GR_CKPT_VERSION;
    h.kind = (uint32_t)o->kind;
    h.shard = o->shard;
    h.shards = o->shards;
    h.step = o->step;
    h.ntables = (uint32_t)ntables;
    h.flags = (o->kind == GR_CKPT_EXPORT && o->export_f16) ? CK_FLAG_F16 : 0;
    h.created = gr_wall_s();
    h.checksum = gr_checksum(&h, offsetof(ck_file_header, checksum));
    return out_write(w, &h, sizeof h);
}

static int check_opts(const char *dir, gr_table *const *tables, size_t ntables,
                      const gr_ckpt_write_opts *o)
{
    if (!dir || !o || (ntables && !tables))
        return gr_seterr(GR_EINVAL, "gr_ckpt_write_shard: NULL argument");
    if (o->kind != GR_CKPT_FULL && o->kind != GR_CKPT_DELTA && o->kind != GR_CKPT_EXPORT)
        return gr_seterr(GR_EINVAL, "unknown checkpoint kind %d", (int)o->kind);
    if (o->shards == 0 || o->shards > GR_CKPT_SHARDS_MAX || o->shard >= o->shards)
        return gr_seterr(GR_EINVAL, "shard %u of %u is out of range", o->shard, o->shards);
    if (ntables > GR_CKPT_TABLES_MAX)
        return gr_seterr(GR_ETOOBIG, "%zu tables exceed the checkpoint limit of %d", ntables,
                         GR_CKPT_TABLES_MAX);
    if (o->zstd_level < 0 || o->zstd_level > ZSTD_maxCLevel())
        return gr_seterr(GR_EINVAL, "zstd level %d is out of range 0..%d", o->zstd_level,
                         ZSTD_maxCLevel());
    if (o->buffer_mib > 65536)
        return gr_seterr(GR_EINVAL, "buffer of %u MiB is above the 64 GiB limit", o->buffer_mib);
    if (o->export_f16 && o->kind != GR_CKPT_EXPORT)
        return gr_seterr(GR_EINVAL, "f16 weights are for exports only");
    return GR_OK;
}

int ck_write_shard(const char *dir, gr_table *const *tables, const gr_table_spec *specs_in,
                   size_t ntables, const gr_ckpt_write_opts *o, gr_ckpt_file_info *info)
{
    int rc = check_opts(dir, tables, ntables, o);
    if (rc != GR_OK) return rc;
    uint64_t t0 = gr_now_ns(), sync_ns = 0;
    rc = ck_mkdir(dir);
    if (rc != GR_OK) return rc;

    char name[GR_CKPT_NAME_MAX], final[4096], tmp[4096 + 32];
    gr_ckpt_shard_file_name(o->shard, o->shards, name);
    rc = ck_path(final, sizeof final, dir, name);
    if (rc != GR_OK) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", final, (int)getpid());

    gr_table_spec *specs = calloc(ntables ? ntables : 1, sizeof *specs);
    uint64_t *trows = calloc(ntables ? ntables : 1, sizeof *trows);
    uint64_t *tkeys = calloc(ntables ? ntables : 1, sizeof *tkeys);
    ck_writer *w = calloc(1, sizeof *w);
    if (!specs || !trows || !tkeys || !w) {
        free(specs);
        free(trows);
        free(tkeys);
        free(w);
        return gr_seterr(GR_ENOMEM, "out of memory writing %s", final);
    }
    for (size_t i = 0; i < ntables; i++) {
        specs[i] = specs_in ? specs_in[i] : *gr_table_get_spec(tables[i]);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(specs[k].name, specs[i].name)) {
                rc = gr_seterr(GR_EINVAL, "table '%s' is given twice", specs[i].name);
                free(specs);
                free(trows);
                free(tkeys);
                free(w);
                return rc;
            }
    }

    w->path = tmp;
    w->fd = -1;
    w->level = o->zstd_level;
    w->pool_blocks = o->buffer_mib ? (int)o->buffer_mib : POOL_MIB;
    w->fault_after = o->fault_after_rows;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_free, NULL);
    pthread_mutex_init(&w->fl_mu, NULL);
    pthread_cond_init(&w->fl_cv, NULL);
    w->fh = XXH3_createState();
    w->sh = XXH3_createState();
    w->obuf = malloc(OBUF_BYTES);
    if (w->level > 0) {
        w->zc = ZSTD_createCCtx();
        if (w->zc) ZSTD_CCtx_setParameter(w->zc, ZSTD_c_compressionLevel, w->level);
    }
    if (!w->fh || !w->sh || !w->obuf || (w->level > 0 && !w->zc)) {
        rc = gr_seterr(GR_ENOMEM, "out of memory writing %s", final);
        goto out;
    }
    XXH3_64bits_reset(w->fh);

    /* A fresh file, never whatever already has the name (a FIFO there would block the open). */
    unlink(tmp);
    w->fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = gr_seterr(GR_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = write_file_header(w, o, ntables);
    if (rc != GR_OK) goto out;
    if (pthread_create(&w->thr, NULL, writer_main, w) != 0) {
        rc = gr_seterr(GR_EINTERNAL, "cannot start the checkpoint writer thread");
        goto out;
    }
    w->thr_started = true;
    if (pthread_create(&w->fl_thr, NULL, flusher_main, w) == 0) w->fl_started = true;

    for (size_t i = 0; i < ntables && rc == GR_OK; i++) {
        const gr_table_spec *sp = &specs[i];
        ck_table_info ti = {0};
        ti.dim = sp->dim;
        if (o->kind == GR_CKPT_EXPORT) {
            ti.weight_type = o->export_f16 ? CK_W_F16 : CK_W_F32;
        } else {
            ti.state_floats = gr_table_state_floats(sp);
            ti.weight_type = sp->dtype == GR_DTYPE_F16 ? CK_W_F16 : CK_W_F32;
            ti.has_meta = 1;
        }
        rc = table_section(w, (uint32_t)i, sp, &ti);
        if (rc != GR_OK) break;
        w->ti = ti;
        w->table = (uint32_t)i;
        w->table_name = sp->name;
        w->table_rows = w->table_keys = 0;
        keylist kl;
        if (o->kind == GR_CKPT_DELTA) {
            int src = dirty_scan(w, tables[i]);
            flush_block(w);
            if (src != 0) {
                rc = w->cb_err ? w->cb_err : (src < 0 ? src : GR_EINTERNAL);
                break;
            }
            /* Deltas also list every live key, so a restore can drop rows deleted or evicted
             * since an older checkpoint (the table does not track deletions). */
            rc = collect_keys(tables[i], &kl);
            if (rc != GR_OK) break;
            rc = write_keys(w, &kl);
        } else {
            if (o->kind == GR_CKPT_FULL) {
                /* Clear the marks first: a row updated after this point is in this file if
                 * it is read later, and in the next delta in any case. */
                int src = gr_table_scan_dirty(tables[i], 0, noop_cb, NULL);
                if (src != 0) {
                    rc = src < 0 ? src : GR_EINTERNAL;
                    break;
                }
            }
            rc = collect_keys(tables[i], &kl);
            if (rc != GR_OK) break;
            rc = write_rows_by_key(w, tables[i], &kl);
        }
        keylist_free(&kl);
        if (rc != GR_OK) break;
        trows[i] = w->table_rows;
        tkeys[i] = w->table_keys;
    }
    if (rc == GR_OK) {
        char *ej = end_json(o, specs, ntables, trows, tkeys, w->rows, w->keys);
        if (!ej) rc = gr_seterr(GR_ENOMEM, "out of memory writing %s", final);
        else rc = submit_small(w, CK_SEC_END, UINT32_MAX, ntables, ej, strlen(ej));
    }
    /* Drain and stop the writer thread. */
    pthread_mutex_lock(&w->mu);
    w->closing = true;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thr, NULL);
    w->thr_started = false;
    stop_flusher(w);
    if (rc == GR_OK) rc = writer_error(w);
    if (rc == GR_OK) {
        ck_tail tail;
        memset(&tail, 0, sizeof tail);
        tail.end_offset = w->end_offset;
        tail.content_checksum = XXH3_64bits_digest(w->fh);
        tail.content_size = w->off;
        memcpy(tail.magic, CK_TAIL_MAGIC, 8);
        uint64_t content_sum = tail.content_checksum;
        rc = out_write(w, &tail, sizeof tail);
        if (rc == GR_OK) rc = out_flush(w);
        uint64_t ts = gr_now_ns();
        if (rc == GR_OK && fsync(w->fd) != 0)
            rc = gr_seterr(GR_EIO, "fsync of %s failed: %s", tmp, strerror(errno));
        sync_ns = gr_now_ns() - ts;
        if (rc == GR_OK) {
            close(w->fd);
            w->fd = -1;
            if (rename(tmp, final) != 0)
                rc = gr_seterr(GR_EIO, "rename %s -> %s failed: %s", tmp, final, strerror(errno));
        }
        if (rc == GR_OK) rc = gr_fsync_dir(dir);
        if (rc == GR_OK && info) {
            memset(info, 0, sizeof *info);
            snprintf(info->name, sizeof info->name, "%s", name);
            info->shard = o->shard;
            info->shards = o->shards;
            info->kind = o->kind;
            info->step = o->step;
            info->size = w->off;
            info->checksum = content_sum;
            info->rows = w->rows;
            info->keys = w->keys;
            info->seconds = (double)(gr_now_ns() - t0) / 1e9;
            info->sync_seconds = (double)sync_ns / 1e9;
        }
    }
out:
    stop_flusher(w);
    if (w->thr_started) {
        pthread_mutex_lock(&w->mu);
        w->closing = true;
        pthread_cond_signal(&w->cv_work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thr, NULL);
    }
    if (w->fd >= 0) close(w->fd);
    if (rc != GR_OK) unlink(tmp);
    if (w->cur) {
        w->cur->next = w->free_blocks;
        w->free_blocks = w->cur;
    }
    for (ck_job *j = w->free_blocks; j;) {
        ck_job *n = j->next;
        free(j->buf);
        free(j);
        j = n;
    }
    for (ck_job *j = w->qhead; j;) { /* only left when the thread never started */
        ck_job *n = j->next;
        free(j->buf);
        free(j);
        j = n;
    }
    XXH3_freeState(w->fh);
    XXH3_freeState(w->sh);
    ZSTD_freeCCtx(w->zc);
    free(w->zbuf);
    free(w->obuf);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_free);
    pthread_mutex_destroy(&w->fl_mu);
    pthread_cond_destroy(&w->fl_cv);
    free(w);
    free(specs);
    free(trows);
    free(tkeys);
    return rc;
}

int gr_ckpt_write_shard(const char *dir, gr_table *const *tables, size_t ntables,
                        const gr_ckpt_write_opts *opts, gr_ckpt_file_info *info)
{
    return ck_write_shard(dir, tables, NULL, ntables, opts, info);
}
