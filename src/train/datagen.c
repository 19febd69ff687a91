/* Synthetic Criteo-layout data with a planted teacher, so that training has something to
 * learn and a known ceiling: ids are Zipf-distributed per slot, labels are drawn from the
 * teacher's probability, and the teacher's own test AUC/logloss go to oracle.json. Every
 * random choice derives from (seed, split, chunk) or (seed, slot, id), so the bytes written
 * depend only on the seed and row counts, never on the thread count. */
#include "train/datagen_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_ROWS 16384
#define LATENT 4
#define MAX_ROW_BYTES 512 /* 40 fields at most 20 bytes each, with room to spare */

/* Per-slot shape: vocabulary (a handful to ~1M), Zipf exponent, share of missing values and
 * the scale of the teacher's per-id weight (small-vocabulary slots matter more, as the tail
 * of a huge slot cannot be learned from a few sightings anyway). */
typedef struct slot_shape {
    uint32_t vocab;
    double zipf_s;
    double missing;
    double weight;
} slot_shape;

static const slot_shape SLOTS[GR_CRITEO_SPARSE] = {
    {1000000, 1.05, 0.00, 0.25}, {500, 1.10, 0.00, 0.60},    {200000, 1.10, 0.05, 0.30},
    {50000, 1.15, 0.05, 0.35},   {200, 1.20, 0.00, 0.60},     {20, 1.00, 0.10, 0.50},
    {10000, 1.10, 0.00, 0.45},   {300, 1.15, 0.00, 0.50},     {3, 0.50, 0.00, 0.40},
    {30000, 1.10, 0.00, 0.40},   {5000, 1.10, 0.00, 0.45},    {800000, 1.05, 0.20, 0.25},
    {3000, 1.20, 0.00, 0.50},    {25, 1.00, 0.00, 0.50},      {8000, 1.10, 0.00, 0.40},
    {300000, 1.05, 0.00, 0.30},  {10, 1.00, 0.00, 0.60},      {4000, 1.15, 0.00, 0.40},
    {2000, 1.10, 0.30, 0.40},    {5, 0.80, 0.30, 0.50},       {100000, 1.10, 0.00, 0.35},
    {15, 1.00, 0.00, 0.50},      {80, 1.10, 0.00, 0.50},      {500000, 1.05, 0.40, 0.25},
    {50, 1.10, 0.00, 0.50},      {70000, 1.10, 0.40, 0.35},
};

/* Slot pairs with a latent interaction <v_a, v_b>. */
static const uint8_t PAIRS[][2] = {{1, 4},  {1, 6},   {4, 7},  {6, 10}, {5, 13}, {9, 12},
                                   {0, 1},  {2, 16},  {7, 22}, {3, 24}, {14, 21}, {10, 17}};
#define NPAIRS_T (sizeof PAIRS / sizeof PAIRS[0])

/* Dense feature j: a count whose log-mean follows an "activity" of slot DENSE_SLOT[j]'s id. */
static const uint8_t DENSE_SLOT[GR_CRITEO_DENSE] = {0, 2, 3, 6, 9, 10, 12, 14, 15, 17, 20, 1, 4};
static const double DENSE_MU[GR_CRITEO_DENSE] = {0.5, 2.0, 1.0, 3.0, 1.5, 4.0, 0.8,
                                                 2.5, 1.2, 0.3, 5.0, 1.8, 2.2};
static const double DENSE_MISSING[GR_CRITEO_DENSE] = {0.4, 0.0, 0.2, 0.2, 0.0, 0.1, 0.0,
                                                      0.0, 0.4, 0.0, 0.7, 0.7, 0.2};
static const double DENSE_U[GR_CRITEO_DENSE] = {0.30, -0.15, 0.20, -0.10, 0.15, 0.10, -0.25,
                                                0.10, 0.20, 0.30, -0.05, 0.15, -0.20};
#define BIAS (-2.1)
#define WEIGHT_SCALE 1.1
#define LATENT_SCALE 0.5
/* Past this rank an id's weight fades as TAIL_RANK / rank (latent vectors as its square
 * root), so 1 M rows are enough to learn most of the signal. */
#define TAIL_RANK 30.0
#define TAIL_POW 1.0

typedef struct gen {
    uint64_t seed;
    gr_zipf zipf[GR_CRITEO_SPARSE];
    int8_t in_pair[GR_CRITEO_SPARSE]; /* whether the slot has latent vectors */
} gen;

static inline double u16(uint64_t h, int k) /* k-th 16-bit lane as a value in [-1, 1) */
{
    return (double)((h >> (16 * k)) & 0xffff) / 32768.0 - 1.0;
}

static inline uint64_t id_hash(const gen *g, unsigned slot, uint32_t value, uint64_t what)
{
    return gr_hash_key(((uint64_t)slot << 40) ^ ((uint64_t)value) ^ (what << 56), g->seed);
}

/* The value (what its hex spells) of rank r in a slot. */
static inline uint32_t rank_value(const gen *g, unsigned slot, uint64_t rank)
{
    return (uint32_t)gr_hash_key((rank << 8) | slot, g->seed ^ 0x72616e6bull);
}

/* Writes one row into buf, returns its length; *prob gets the teacher's probability. theta
 * (radians; 0 for the fixed teacher) turns every id's weight from its first draw towards an
 * independent second one, w = cos(theta) w1 + sin(theta) w2: a drifting world whose
 * weights keep their scale. */
static size_t gen_row_drift(const gen *g, gr_rng *r, char *buf, float *label_out, float *prob_out,
                            double theta)
{
    static const char hex[] = "0123456789abcdef";
    uint32_t value[GR_CRITEO_SPARSE];
    bool present[GR_CRITEO_SPARSE];
    double logit = BIAS;
    double lat[GR_CRITEO_SPARSE][LATENT];
    double act[GR_CRITEO_SPARSE];
    for (unsigned s = 0; s < GR_CRITEO_SPARSE; s++) {
        present[s] = !(SLOTS[s].missing > 0 && gr_rng_uniform(r) < SLOTS[s].missing);
        /* A missing value has its own teacher weight, keyed by an impossible rank. */
        uint64_t rank = present[s] ? gr_zipf_draw(&g->zipf[s], r) : 0;
        uint32_t v = rank_value(g, s, present[s] ? rank : UINT32_MAX + 1ull);
        /* Rare ids speak softly: an id's effect fades past rank TAIL_RANK, so most of the
         * signal sits on ids seen often enough to be learned. */
        double fade = rank > TAIL_RANK ? pow((double)TAIL_RANK / (double)rank, TAIL_POW) : 1.0;
        value[s] = v;
        uint64_t h = id_hash(g, s, v, 1);
        double w = u16(h, 0);
        if (theta != 0) w = cos(theta) * w + sin(theta) * u16(id_hash(g, s, v, 3), 0);
        logit += SLOTS[s].weight * w * WEIGHT_SCALE * fade;
        act[s] = u16(h, 1);
        if (g->in_pair[s]) {
            uint64_t h2 = id_hash(g, s, v, 2);
            for (int k = 0; k < LATENT; k++) lat[s][k] = u16(h2, k) * LATENT_SCALE * sqrt(fade);
        }
    }
    for (size_t p = 0; p < NPAIRS_T; p++) {
        double d = 0;
        for (int k = 0; k < LATENT; k++) d += lat[PAIRS[p][0]][k] * lat[PAIRS[p][1]][k];
        logit += d;
    }
    int64_t dense[GR_CRITEO_DENSE];
    bool dense_present[GR_CRITEO_DENSE];
    for (int j = 0; j < GR_CRITEO_DENSE; j++) {
        dense_present[j] = !(DENSE_MISSING[j] > 0 && gr_rng_uniform(r) < DENSE_MISSING[j]);
        double z = gr_rng_normal(r);
        double x = floor(exp(DENSE_MU[j] + 0.9 * act[DENSE_SLOT[j]] + 0.8 * z) - 0.5);
        if (x < 0) x = 0;
        if (x > 1e9) x = 1e9;
        dense[j] = (int64_t)x;
        /* A few -1 values, as in the real I2. */
        if (j == 1 && gr_rng_uniform(r) < 0.02) dense[j] = -1;
        if (dense_present[j] && dense[j] > 0) logit += DENSE_U[j] * log1p((double)dense[j]);
    }
    double prob = 1.0 / (1.0 + exp(-logit));
    int label = gr_rng_uniform(r) < prob;
    *label_out = (float)label;
    *prob_out = (float)prob;

    char *p = buf;
    *p++ = (char)('0' + label);
    for (int j = 0; j < GR_CRITEO_DENSE; j++) {
        *p++ = '\t';
        if (!dense_present[j]) continue;
        int64_t v = dense[j];
        if (v < 0) {
            *p++ = '-';
            v = -v;
        }
        char tmp[24];
        int n = 0;
        do {
            tmp[n++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (n) *p++ = tmp[--n];
    }
    for (unsigned s = 0; s < GR_CRITEO_SPARSE; s++) {
        *p++ = '\t';
        if (!present[s]) continue;
        for (int k = 7; k >= 0; k--) *p++ = hex[(value[s] >> (4 * k)) & 15];
    }
    *p++ = '\n';
    return (size_t)(p - buf);
}

/* The fixed teacher's row, in the shape every schema's row writer has. */
static size_t gen_row(const void *gv, gr_rng *r, char *buf, float *label_out, float *prob_out)
{
    return gen_row_drift(gv, r, buf, label_out, prob_out, 0.0);
}

/* ---- the threaded writer ------------------------------------------------------------------- */

typedef struct chunk_buf {
    char *text;
    size_t len;
    uint64_t chunk; /* which chunk it holds */
    bool ready;
    double positives;
} chunk_buf;

typedef struct job {
    const void *g;
    dg_row_fn row;
    uint64_t seed;
    size_t max_row;
    uint64_t rows, nchunks, split;
    unsigned threads, nbufs;
    chunk_buf *bufs;
    dg_row *rows_out; /* test split: label + teacher probability per row; NULL for train */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t written; /* chunks written so far */
    bool stop;
} job;

typedef struct worker_arg {
    job *j;
    unsigned t;
} worker_arg;

static void *gen_worker(void *arg)
{
    worker_arg *wa = arg;
    job *j = wa->j;
    for (uint64_t c = wa->t; c < j->nchunks; c += j->threads) {
        chunk_buf *b = &j->bufs[c % j->nbufs];
        pthread_mutex_lock(&j->mu);
        /* The buffer is free once the chunk that used it before has been written. */
        while (!j->stop && c >= j->written + j->nbufs) pthread_cond_wait(&j->cv, &j->mu);
        bool stop = j->stop;
        pthread_mutex_unlock(&j->mu);
        if (stop) break;
        gr_rng r;
        uint64_t st = j->seed ^ (j->split << 62) ^ (c * 0x9e3779b97f4a7c15ull);
        gr_rng_seed(&r, gr_splitmix64(&st));
        uint64_t first = c * CHUNK_ROWS;
        uint64_t n = j->rows - first < CHUNK_ROWS ? j->rows - first : CHUNK_ROWS;
        size_t len = 0;
        double pos = 0;
        for (uint64_t i = 0; i < n; i++) {
            float label, prob;
            len += j->row(j->g, &r, b->text + len, &label, &prob);
            pos += label;
            if (j->rows_out) {
                j->rows_out[first + i].label = label;
                j->rows_out[first + i].prob = prob;
            }
        }
        pthread_mutex_lock(&j->mu);
        b->len = len;
        b->chunk = c;
        b->positives = pos;
        b->ready = true;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    return NULL;
}

static int write_all(int fd, const char *p, size_t n, const char *path)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return gr_seterr(GR_EIO, "write %s: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return GR_OK;
}

int dg_write_split(const dg_split *sp, dg_row *rows_out, double *positives)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", sp->dir, sp->name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return gr_seterr(GR_EIO, "cannot create %s: %s", tmp, strerror(errno));
    unsigned threads = sp->threads;
    uint64_t rows = sp->rows;
    job j = {.g = sp->gen, .row = sp->row, .seed = sp->seed, .max_row = sp->max_row_bytes,
             .rows = rows, .split = sp->split, .threads = threads, .rows_out = rows_out};
    j.nchunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    j.nbufs = 2 * threads;
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    int rc = GR_OK;
    pthread_t *tid = calloc(threads, sizeof *tid);
    worker_arg *wa = calloc(threads, sizeof *wa);
    j.bufs = calloc(j.nbufs, sizeof *j.bufs);
    unsigned started = 0;
    if (!tid || !wa || !j.bufs) {
        rc = gr_seterr(GR_ENOMEM, "datagen: out of memory");
        goto out;
    }
    for (unsigned i = 0; i < j.nbufs; i++) {
        j.bufs[i].text = malloc((size_t)CHUNK_ROWS * j.max_row);
        if (!j.bufs[i].text) {
            rc = gr_seterr(GR_ENOMEM, "datagen: cannot allocate chunk buffers");
            goto out;
        }
    }
    for (; started < threads; started++) {
        wa[started] = (worker_arg){&j, started};
        if (pthread_create(&tid[started], NULL, gen_worker, &wa[started]) != 0) {
            rc = gr_seterr(GR_ENOMEM, "datagen: cannot start a thread");
            goto out;
        }
    }
    *positives = 0;
    if (sp->header) rc = write_all(fd, sp->header, strlen(sp->header), tmp);
    for (uint64_t c = 0; !rc && c < j.nchunks; c++) {
        chunk_buf *b = &j.bufs[c % j.nbufs];
        pthread_mutex_lock(&j.mu);
        while (!(b->ready && b->chunk == c)) pthread_cond_wait(&j.cv, &j.mu);
        pthread_mutex_unlock(&j.mu);
        rc = write_all(fd, b->text, b->len, tmp);
        *positives += b->positives;
        pthread_mutex_lock(&j.mu);
        b->ready = false;
        j.written = c + 1;
        if (rc) j.stop = true;
        pthread_cond_broadcast(&j.cv);
        pthread_mutex_unlock(&j.mu);
        if (rc) break;
    }
out:
    pthread_mutex_lock(&j.mu);
    if (rc) j.stop = true;
    pthread_cond_broadcast(&j.cv);
    pthread_mutex_unlock(&j.mu);
    for (unsigned i = 0; i < started; i++) pthread_join(tid[i], NULL);
    if (j.bufs)
        for (unsigned i = 0; i < j.nbufs; i++) free(j.bufs[i].text);
    free(j.bufs);
    free(tid);
    free(wa);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
    if (close(fd) != 0 && !rc) rc = gr_seterr(GR_EIO, "close %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = gr_seterr(GR_EIO, "rename %s: %s", tmp, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

/* ---- the endless, drifting stream ----------------------------------------------------------- */

struct gr_datagen_stream {
    gen g;
    gr_rng r;
    double drift;  /* radians per 100 000 rows */
    uint64_t rows; /* rows made so far */
};

static int gen_init(gen *g, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->seed = seed;
    for (unsigned s = 0; s < GR_CRITEO_SPARSE; s++) {
        int rc = gr_zipf_init(&g->zipf[s], SLOTS[s].vocab, SLOTS[s].zipf_s);
        if (rc) return rc;
    }
    for (size_t p = 0; p < NPAIRS_T; p++) g->in_pair[PAIRS[p][0]] = g->in_pair[PAIRS[p][1]] = 1;
    return GR_OK;
}

int gr_datagen_stream_create(uint64_t seed, double drift, gr_datagen_stream **out)
{
    *out = NULL;
    if (!isfinite(drift) || drift < 0 || drift > 1000)
        return gr_seterr(GR_EINVAL, "datagen: drift %g is not 0..1000 radians per 100000 rows", drift);
    gr_datagen_stream *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "datagen: out of memory");
    int rc = gen_init(&s->g, seed);
    if (rc) {
        free(s);
        return rc;
    }
    uint64_t st = seed ^ (3ull << 62);
    gr_rng_seed(&s->r, gr_splitmix64(&st));
    s->drift = drift;
    *out = s;
    return GR_OK;
}

size_t gr_datagen_stream_next(gr_datagen_stream *s, char *buf, float *label, float *prob)
{
    double theta = s->drift * (double)s->rows / 100000.0;
    s->rows++;
    float l, p;
    size_t n = gen_row_drift(&s->g, &s->r, buf, &l, &p, theta);
    if (label) *label = l;
    if (prob) *prob = p;
    return n;
}

uint64_t gr_datagen_stream_rows(const gr_datagen_stream *s) { return s->rows; }

void gr_datagen_stream_destroy(gr_datagen_stream *s) { free(s); }

int dg_run(const char *dir, const gr_datagen_opts *opts, const dg_split *train_split,
           gr_datagen_result *res)
{
    double t0 = gr_now_s();
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return gr_seterr(GR_EIO, "cannot create %s: %s", dir, strerror(errno));
    dg_split sp = *train_split;
    sp.dir = dir;
    sp.threads = opts->threads ? opts->threads : 2;
    sp.seed = opts->seed;
    dg_row *test = malloc((opts->test_rows ? opts->test_rows : 1) * sizeof *test);
    if (!test) return gr_seterr(GR_ENOMEM, "datagen: cannot hold %llu test rows",
                                (unsigned long long)opts->test_rows);
    double pos_train = 0, pos_test = 0;
    sp.name = res->train_file;
    sp.rows = opts->train_rows;
    sp.split = 0;
    int rc = dg_write_split(&sp, NULL, &pos_train);
    sp.name = res->test_file;
    sp.rows = opts->test_rows;
    sp.split = 1;
    if (!rc) rc = dg_write_split(&sp, test, &pos_test);
    if (rc) {
        free(test);
        return rc;
    }
    res->train_rows = opts->train_rows;
    res->test_rows = opts->test_rows;
    res->train_positive_rate = opts->train_rows ? pos_train / (double)opts->train_rows : 0;
    res->test_positive_rate = opts->test_rows ? pos_test / (double)opts->test_rows : 0;
    size_t n = opts->test_rows;
    float *probs = malloc((n ? n : 1) * sizeof *probs), *labels = malloc((n ? n : 1) * sizeof *labels);
    if (!probs || !labels) {
        free(probs);
        free(labels);
        free(test);
        return gr_seterr(GR_ENOMEM, "datagen: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        probs[i] = test[i].prob;
        labels[i] = test[i].label;
    }
    free(test);
    rc = gr_auc(probs, labels, n, &res->teacher_auc);
    res->teacher_logloss = gr_logloss(probs, labels, n);
    for (size_t i = 0; i < n; i++) probs[i] = (float)res->test_positive_rate;
    res->base_logloss = gr_logloss(probs, labels, n);
    free(probs);
    free(labels);
    if (rc) return rc;
    res->seconds = gr_now_s() - t0;

    cJSON *o = cJSON_CreateObject();
    if (!o) return gr_seterr(GR_ENOMEM, "datagen: out of memory");
    cJSON_AddStringToObject(o, "generator", "granary datagen v1");
    cJSON_AddNumberToObject(o, "seed", (double)opts->seed);
    cJSON_AddNumberToObject(o, "train_rows", (double)res->train_rows);
    cJSON_AddNumberToObject(o, "test_rows", (double)res->test_rows);
    cJSON_AddNumberToObject(o, "train_positive_rate", res->train_positive_rate);
    cJSON_AddNumberToObject(o, "positive_rate", res->test_positive_rate);
    /* NaN is not JSON: an undefined AUC (one-class or empty test set) is null. */
    if (isnan(res->teacher_auc))
        cJSON_AddNullToObject(o, "teacher_auc");
    else
        cJSON_AddNumberToObject(o, "teacher_auc", res->teacher_auc);
    cJSON_AddNumberToObject(o, "teacher_logloss", res->teacher_logloss);
    cJSON_AddNumberToObject(o, "base_logloss", res->base_logloss);
    if (opts->schema && !gr_schema_is_criteo(opts->schema)) {
        /* Only files of a schema say which they are: Criteo's oracle stays as it was. */
        cJSON_AddStringToObject(o, "train_file", res->train_file);
        cJSON_AddStringToObject(o, "test_file", res->test_file);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return gr_seterr(GR_ENOMEM, "datagen: out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    size_t len = strlen(text);
    text[len] = '\n'; /* cJSON allocates len + 1: the NUL becomes a newline */
    rc = gr_write_file_atomic(path, text, len + 1);
    free(text);
    return rc;
}

int gr_datagen_run(const char *dir, const gr_datagen_opts *opts, gr_datagen_result *res)
{
    memset(res, 0, sizeof *res);
    if (!dir || !*dir) return gr_seterr(GR_EINVAL, "datagen: an output directory is needed");
    if (opts->threads > 64) return gr_seterr(GR_EINVAL, "datagen: at most 64 threads");
    if (opts->train_rows > (1ull << 40) || opts->test_rows > (1ull << 32))
        return gr_seterr(GR_ETOOBIG, "datagen: too many rows");
    if (opts->schema && !gr_schema_is_criteo(opts->schema)) return dg_schema_run(dir, opts, res);
    gen g;
    int rc = gen_init(&g, opts->seed);
    if (rc) return rc;
    snprintf(res->train_file, sizeof res->train_file, "train.tsv");
    snprintf(res->test_file, sizeof res->test_file, "test.tsv");
    dg_split sp = {.gen = &g, .row = gen_row, .max_row_bytes = MAX_ROW_BYTES};
    return dg_run(dir, opts, &sp, res);
}
