/* The data reader: streams a file (or a byte range of it) in blocks cut at line ends and
 * parses the blocks on a few threads into examples: Criteo TSV by default (label, 13
 * log-transformed dense features, 26 hashed categorical ids, its own fast parser), or any
 * layout a schema describes (schema.c parses its lines; list columns give bags of ids).
 * Batches come out in file order whatever the thread count, so training runs are
 * reproducible. */
#include "granary/train.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FEATURE_SEED 0x63726974656f3031ull /* "criteo01": part of the id contract */
#define MISSING_BIT (1ull << 32)
#define MAX_LINE (1u << 20) /* a longer "line" is a corrupt file, not data */

uint64_t gr_criteo_feature_id(unsigned slot, uint32_t value)
{
    return gr_hash_key(((uint64_t)slot << 33) | value, FEATURE_SEED);
}

uint64_t gr_criteo_missing_id(unsigned slot)
{
    return gr_hash_key(((uint64_t)slot << 33) | MISSING_BIT, FEATURE_SEED);
}

/* malloc(0) may return NULL: a schema without dense features still gets a buffer. */
static size_t nonzero(size_t n) { return n ? n : 1; }

int gr_batch_init_schema(gr_batch *b, size_t cap, const gr_schema *s)
{
    memset(b, 0, sizeof *b);
    if (!s) s = gr_schema_criteo();
    if (cap == 0) return gr_seterr(GR_EINVAL, "batch capacity must be > 0");
    b->n_dense = gr_schema_n_dense(s);
    b->n_sparse = gr_schema_n_sparse(s);
    b->ids_cap = cap * gr_schema_max_ids(s);
    b->labels = malloc(cap * sizeof *b->labels);
    b->dense = malloc(nonzero(cap * b->n_dense) * sizeof *b->dense);
    b->ids = malloc(nonzero(b->ids_cap) * sizeof *b->ids);
    if (gr_schema_has_lists(s)) b->bag_off = malloc((cap * b->n_sparse + 1) * sizeof *b->bag_off);
    if (!b->labels || !b->dense || !b->ids || (gr_schema_has_lists(s) && !b->bag_off)) {
        gr_batch_fini(b);
        return gr_seterr(GR_ENOMEM, "cannot allocate a batch of %zu examples", cap);
    }
    if (b->bag_off) b->bag_off[0] = 0;
    b->cap = cap;
    return GR_OK;
}

int gr_batch_init(gr_batch *b, size_t cap) { return gr_batch_init_schema(b, cap, NULL); }

void gr_batch_fini(gr_batch *b)
{
    if (!b) return;
    free(b->labels);
    free(b->dense);
    free(b->ids);
    free(b->bag_off);
    memset(b, 0, sizeof *b);
}

/* ---- one line ---------------------------------------------------------------------------- */

static void field_name(int f, char *buf, size_t len)
{
    if (f == 0)
        snprintf(buf, len, "label");
    else if (f <= GR_CRITEO_DENSE)
        snprintf(buf, len, "I%d", f);
    else
        snprintf(buf, len, "C%d", f - GR_CRITEO_DENSE);
}

static int bad_field(int f, const char *what, const char *p, size_t n)
{
    char name[16];
    field_name(f, name, sizeof name);
    int shown = n > 24 ? 24 : (int)n;
    return gr_seterr(GR_ECORRUPT, "field %d (%s): %s: '%.*s%s'", f + 1, name, what, shown, p,
                     n > 24 ? "..." : "");
}

static inline int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* log1p of the small counts, which most dense fields hold: the same float as computing it. */
#define LOG1P_TABLE 4096
static float log1p_table[LOG1P_TABLE];
/* Each byte's hex digit value, -1 if it is none: a lookup instead of hexval's branches, which
 * random hex digits mispredicted (a third of the parse). */
static int8_t hex_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void tables_init(void)
{
    for (int v = 0; v < LOG1P_TABLE; v++) log1p_table[v] = (float)log1p((double)v);
    for (int c = 0; c < 256; c++) hex_table[c] = (int8_t)hexval((unsigned char)c);
}

static inline float dense_value(uint64_t v)
{
    return v < LOG1P_TABLE ? log1p_table[v] : (float)log1p((double)v);
}

/* A well-formed line in one pass, without a memchr per field (a line has 40 short fields,
 * and the reader's time went to the calls). Returns false for anything it is not sure of
 * (a bad field, a sign without digits, too many digits, a missing or extra field): the full
 * parser below then gives the result or the error message, so both accept the same lines and
 * give the same values. */
static bool parse_line_fast(const char *p, const char *end, float *label, float *dense,
                            uint64_t *ids)
{
    if (end - p < 2 || (p[0] != '0' && p[0] != '1') || p[1] != '\t') return false;
    *label = (float)(p[0] - '0');
    p += 2;
    for (int f = 0; f < GR_CRITEO_DENSE; f++) {
        const char *s = p;
        bool neg = false;
        if (s < end && (*s == '-' || *s == '+')) neg = *s++ == '-';
        const char *digits = s;
        uint64_t v = 0;
        while (s < end && (unsigned)(*s - '0') <= 9 && s - digits < 19)
            v = v * 10 + (unsigned)(*s++ - '0');
        if (s == end || *s != '\t') return false; /* another character, or the line ended */
        if (s == p) {
            dense[f] = 0.0f; /* missing */
        } else {
            if (s == digits || s - digits > 18) return false;
            dense[f] = neg ? 0.0f : dense_value(v);
        }
        p = s + 1;
    }
    for (unsigned slot = 0; slot < GR_CRITEO_SPARSE; slot++) {
        const char *s = p;
        uint32_t v = 0;
        while (s < end && *s != '\t') {
            int h = hex_table[(unsigned char)*s];
            if (h < 0 || s - p >= 8) return false;
            v = (v << 4) | (uint32_t)h;
            s++;
        }
        if ((slot == GR_CRITEO_SPARSE - 1) != (s == end)) return false;
        ids[slot] = s == p ? gr_criteo_missing_id(slot) : gr_criteo_feature_id(slot, v);
        p = s + 1;
    }
    return true;
}

int gr_criteo_parse_line(const char *line, size_t len, float *label, float *dense, uint64_t *ids)
{
    if (len && line[len - 1] == '\r') len--;
    pthread_once(&tables_once, tables_init);
    if (parse_line_fast(line, line + len, label, dense, ids)) return GR_OK;
    const char *p = line, *end = line + len;
    for (int f = 0; f < GR_CRITEO_FIELDS; f++) {
        const char *q = memchr(p, '\t', (size_t)(end - p));
        if (!q) q = end;
        if (f < GR_CRITEO_FIELDS - 1 && q == end) {
            return gr_seterr(GR_ECORRUPT, "has %d fields, expected %d", f + 1, GR_CRITEO_FIELDS);
        }
        size_t n = (size_t)(q - p);
        if (f == 0) {
            if (n != 1 || (p[0] != '0' && p[0] != '1'))
                return bad_field(f, "label must be 0 or 1", p, n);
            *label = (float)(p[0] - '0');
        } else if (f <= GR_CRITEO_DENSE) {
            float x = 0.0f;
            if (n) {
                const char *s = p;
                bool neg = false;
                if (*s == '-' || *s == '+') {
                    neg = *s == '-';
                    s++;
                }
                if (s == q || q - s > 18) return bad_field(f, "not an integer", p, n);
                int64_t v = 0;
                for (; s < q; s++) {
                    unsigned d = (unsigned char)*s - '0';
                    if (d > 9) return bad_field(f, "not an integer", p, n);
                    v = v * 10 + d;
                }
                x = neg ? 0.0f : dense_value((uint64_t)v);
            }
            dense[f - 1] = x;
        } else {
            unsigned slot = (unsigned)(f - 1 - GR_CRITEO_DENSE);
            if (n == 0) {
                ids[slot] = gr_criteo_missing_id(slot);
            } else {
                if (n > 8) return bad_field(f, "more than 8 hex digits", p, n);
                uint32_t v = 0;
                for (size_t i = 0; i < n; i++) {
                    int h = hexval((unsigned char)p[i]);
                    if (h < 0) return bad_field(f, "not hex", p, n);
                    v = (v << 4) | (uint32_t)h;
                }
                ids[slot] = gr_criteo_feature_id(slot, v);
            }
        }
        if (f == GR_CRITEO_FIELDS - 1 && q != end) {
            int extra = 1;
            for (const char *s = q + 1; s < end; s++) extra += *s == '\t';
            return gr_seterr(GR_ECORRUPT, "has %d fields, expected %d", GR_CRITEO_FIELDS + extra,
                             GR_CRITEO_FIELDS);
        }
        p = q + 1;
    }
    return GR_OK;
}

/* ---- blocks -------------------------------------------------------------------------------- */

enum { BLK_FREE = 0, BLK_RAW, BLK_PARSING, BLK_PARSED };

typedef struct block {
    int state;
    uint64_t seq;
    char *text;
    size_t len, cap;
    uint64_t first_line, nlines; /* nlines: line count of text (last may lack '\n') */
    /* parsed */
    size_t n, ex_cap, taken;
    float *labels, *dense;
    uint64_t *ids;
    /* With list columns: ids grow as lines come (ids_cap); example i's ids start at
     * ex_ids[i] (n + 1 entries) and bag_len[i * S + s] are its bags' sizes. */
    size_t ids_cap;
    size_t *ex_ids;
    uint32_t *bag_len;
    uint64_t bad, empty;
    uint64_t first_bad_line;
    char first_bad_msg[256];
    int err; /* strict mode: the first bad line */
    char errmsg[320];
} block;

struct gr_criteo_reader {
    char *path;
    gr_criteo_opts o;
    const gr_schema *schema; /* never NULL */
    uint32_t nd, ns, max_ids;
    bool lists;
    int fd;
    uint64_t pos, end;   /* next byte to read, end of range */
    uint64_t next_line;  /* line number of the first line of the next block */
    char *carry;         /* the incomplete line at the end of the last read */
    size_t carry_len, carry_cap;
    bool eof;

    block *blocks;
    unsigned nblocks;
    uint64_t cur; /* seq of the block being consumed */

    /* threaded mode */
    pthread_t io_thread, *parsers;
    unsigned nparsers;
    bool io_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    uint64_t total_blocks; /* known when the io thread is done; UINT64_MAX before */
    int io_err;
    char io_errmsg[320];
    atomic_uint logged;

    gr_criteo_stats st;
    int done_err; /* sticky error once returned */
};

static int block_reserve_text(block *b, size_t need)
{
    if (b->cap >= need) return GR_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) cap *= 2;
    char *t = realloc(b->text, cap);
    if (!t) return gr_seterr(GR_ENOMEM, "cannot allocate a %zu-byte read block", cap);
    b->text = t;
    b->cap = cap;
    return GR_OK;
}

static int block_reserve_examples(const gr_criteo_reader *r, block *b, size_t n)
{
    if (b->ex_cap >= n) return GR_OK;
    float *l = realloc(b->labels, n * sizeof *l);
    if (l) b->labels = l;
    float *d = realloc(b->dense, nonzero(n * r->nd) * sizeof *d);
    if (d) b->dense = d;
    bool ok = l && d;
    if (!r->lists) {
        /* Every example has exactly ns ids. */
        uint64_t *i = realloc(b->ids, nonzero(n * r->ns) * sizeof *i);
        if (i) b->ids = i;
        ok = ok && i;
    } else {
        size_t *e = realloc(b->ex_ids, (n + 1) * sizeof *e);
        if (e) b->ex_ids = e;
        uint32_t *g = realloc(b->bag_len, nonzero(n * r->ns) * sizeof *g);
        if (g) b->bag_len = g;
        ok = ok && e && g;
    }
    if (!ok) return gr_seterr(GR_ENOMEM, "cannot allocate %zu parsed examples", n);
    b->ex_cap = n;
    return GR_OK;
}

/* With list columns: room for one more line's ids after `used`. */
static int block_reserve_ids(const gr_criteo_reader *r, block *b, size_t used)
{
    size_t need = used + r->max_ids;
    if (b->ids_cap >= need) return GR_OK;
    size_t cap = b->ids_cap ? b->ids_cap : 4096;
    while (cap < need) cap *= 2;
    uint64_t *i = realloc(b->ids, cap * sizeof *i);
    if (!i) return gr_seterr(GR_ENOMEM, "cannot allocate %zu parsed ids", cap);
    b->ids = i;
    b->ids_cap = cap;
    return GR_OK;
}

static size_t count_newlines(const char *p, size_t n)
{
    size_t c = 0;
    const char *end = p + n;
    while (p < end) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) break;
        c++;
        p = q + 1;
    }
    return c;
}

/* Reads the next block of whole lines into b. Returns 1 with a block, 0 at the end of the
 * range, or a negative gr_err. Called by one thread at a time. */
static int read_block(gr_criteo_reader *r, block *b)
{
    if (r->eof && r->carry_len == 0) return 0;
    int rc = block_reserve_text(b, r->carry_len + r->o.block_bytes + 1);
    if (rc) return rc;
    if (r->carry_len) memcpy(b->text, r->carry, r->carry_len);
    size_t len = r->carry_len;
    r->carry_len = 0;
    for (;;) {
        size_t lo = len; /* the carried bytes hold no newline */
        while (!r->eof && len < b->cap - 1) {
            uint64_t want = b->cap - 1 - len;
            if (r->end - r->pos < want) want = r->end - r->pos;
            if (want == 0) {
                r->eof = true;
                break;
            }
            ssize_t got = pread(r->fd, b->text + len, want, (off_t)r->pos);
            if (got < 0) {
                if (errno == EINTR) continue;
                return gr_seterr(GR_EIO, "%s: read at byte %llu: %s", r->path,
                                 (unsigned long long)r->pos, strerror(errno));
            }
            if (got == 0) {
                r->eof = true;
                break;
            }
            len += (size_t)got;
            r->pos += (uint64_t)got;
            if (len >= r->o.block_bytes) break;
        }
        /* Cut after the last newline; the rest waits for the next block. */
        const char *nl = len > lo ? memrchr(b->text + lo, '\n', len - lo) : NULL;
        if (nl || r->eof) {
            size_t cut = r->eof ? len : (size_t)(nl - b->text) + 1;
            size_t rest = len - cut;
            if (rest) {
                if (r->carry_cap < rest) {
                    char *c = realloc(r->carry, rest);
                    if (!c) return gr_seterr(GR_ENOMEM, "cannot allocate a line buffer");
                    r->carry = c;
                    r->carry_cap = rest;
                }
                memcpy(r->carry, b->text + cut, rest);
                r->carry_len = rest;
            }
            b->len = cut;
            break;
        }
        /* No newline in a whole block: a long line. Grow, up to MAX_LINE. */
        if (len >= MAX_LINE)
            return gr_seterr(GR_ECORRUPT, "%s:%llu: line longer than %u bytes", r->path,
                             (unsigned long long)r->next_line, MAX_LINE);
        rc = block_reserve_text(b, b->cap * 2);
        if (rc) return rc;
    }
    if (b->len == 0) return 0;
    size_t nl = count_newlines(b->text, b->len);
    b->nlines = nl + (b->text[b->len - 1] != '\n');
    b->first_line = r->next_line;
    r->next_line += b->nlines;
    return 1;
}

/* One line of a schema file into example b->n (list columns: its ids after the last one's). */
static int parse_schema_line(gr_criteo_reader *r, block *b, const char *p, size_t n)
{
    size_t i = b->n, n_ids;
    if (!r->lists)
        return gr_schema_parse_line(r->schema, p, n, &b->labels[i], &b->dense[i * r->nd],
                                    &b->ids[i * r->ns], NULL, &n_ids);
    size_t at = b->ex_ids[i];
    int rc = block_reserve_ids(r, b, at);
    if (rc) return rc;
    rc = gr_schema_parse_line(r->schema, p, n, &b->labels[i], &b->dense[i * r->nd], &b->ids[at],
                              &b->bag_len[i * r->ns], &n_ids);
    if (rc == 0) b->ex_ids[i + 1] = at + n_ids;
    return rc;
}

static void parse_block(gr_criteo_reader *r, block *b)
{
    b->n = b->taken = 0;
    b->bad = b->empty = 0;
    b->first_bad_line = 0;
    b->err = 0;
    if (block_reserve_examples(r, b, b->nlines ? b->nlines : 1)) {
        b->err = GR_ENOMEM;
        snprintf(b->errmsg, sizeof b->errmsg, "%s", gr_errmsg());
        return;
    }
    if (r->lists) b->ex_ids[0] = 0;
    bool criteo = gr_schema_is_criteo(r->schema);
    bool header = gr_schema_header(r->schema);
    const char *p = b->text, *end = b->text + b->len;
    uint64_t line = b->first_line;
    while (p < end) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) q = end;
        size_t n = (size_t)(q - p);
        if (n == 0 || (n == 1 && p[0] == '\r') || (header && line == 1)) {
            b->empty++;
        } else {
            size_t i = b->n;
            /* Criteo keeps its own parser: the schema's one adds nothing but a hint, and only
             * a bad line pays for that. */
            int rc = criteo ? gr_criteo_parse_line(p, n, &b->labels[i], &b->dense[i * GR_CRITEO_DENSE],
                                                   &b->ids[i * GR_CRITEO_SPARSE])
                            : parse_schema_line(r, b, p, n);
            if (rc == GR_ECORRUPT && criteo) {
                size_t n_ids;
                uint32_t bags[GR_CRITEO_SPARSE];
                rc = gr_schema_parse_line(r->schema, p, n, &b->labels[i],
                                          &b->dense[i * GR_CRITEO_DENSE],
                                          &b->ids[i * GR_CRITEO_SPARSE], bags, &n_ids);
            }
            if (rc == GR_ENOMEM) {
                b->err = rc;
                snprintf(b->errmsg, sizeof b->errmsg, "%s", gr_errmsg());
                return;
            }
            if (rc == 0) {
                b->n++;
            } else if (r->o.strict) {
                b->err = rc;
                snprintf(b->errmsg, sizeof b->errmsg, "%s:%llu: %s", r->path,
                         (unsigned long long)line, gr_errmsg());
                return;
            } else {
                if (b->bad++ == 0) {
                    b->first_bad_line = line;
                    snprintf(b->first_bad_msg, sizeof b->first_bad_msg, "%s", gr_errmsg());
                }
                if (r->o.on_bad)
                    r->o.on_bad(r->o.on_bad_ctx, r->path, line, gr_errmsg());
                else if (atomic_fetch_add(&r->logged, 1) < r->o.log_bad)
                    GR_LOGW("%s:%llu: skipping bad line: %s", r->path, (unsigned long long)line,
                            gr_errmsg());
            }
        }
        line++;
        p = q + 1;
    }
}

/* ---- threads ------------------------------------------------------------------------------- */

static void *io_main(void *arg)
{
    gr_criteo_reader *r = arg;
    for (uint64_t seq = 0;; seq++) {
        block *b = &r->blocks[seq % r->nblocks];
        pthread_mutex_lock(&r->mu);
        while (!r->stop && b->state != BLK_FREE) pthread_cond_wait(&r->cv, &r->mu);
        bool stop = r->stop;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        int rc = read_block(r, b);
        pthread_mutex_lock(&r->mu);
        if (rc == 1) {
            b->seq = seq;
            b->state = BLK_RAW;
        } else {
            if (rc < 0) {
                r->io_err = rc;
                snprintf(r->io_errmsg, sizeof r->io_errmsg, "%s", gr_errmsg());
            }
            r->total_blocks = seq;
        }
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (rc != 1) break;
    }
    return NULL;
}

static void *parser_main(void *arg)
{
    gr_criteo_reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        block *pick = NULL;
        for (unsigned i = 0; i < r->nblocks; i++) {
            block *b = &r->blocks[i];
            if (b->state == BLK_RAW && (!pick || b->seq < pick->seq)) pick = b;
        }
        if (r->stop) break;
        if (!pick) {
            if (r->total_blocks != UINT64_MAX) break; /* nothing more will come */
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        pick->state = BLK_PARSING;
        pthread_mutex_unlock(&r->mu);
        parse_block(r, pick);
        pthread_mutex_lock(&r->mu);
        pick->state = BLK_PARSED;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

void gr_criteo_opts_default(gr_criteo_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 1024;
    o->first_line = 1;
    o->block_bytes = 1u << 20;
    o->log_bad = 5;
}

int gr_criteo_open(const char *path, const gr_criteo_opts *opts, gr_criteo_reader **out)
{
    *out = NULL;
    if (!path || !opts) return gr_seterr(GR_EINVAL, "criteo reader: path and options needed");
    if (opts->batch == 0) return gr_seterr(GR_EINVAL, "criteo reader: batch must be > 0");
    if (opts->threads > 64) return gr_seterr(GR_EINVAL, "criteo reader: at most 64 threads");
    gr_criteo_reader *r = calloc(1, sizeof *r);
    if (!r) return gr_seterr(GR_ENOMEM, "cannot allocate a reader");
    r->fd = -1;
    r->o = *opts;
    r->schema = opts->schema ? opts->schema : gr_schema_criteo();
    r->nd = gr_schema_n_dense(r->schema);
    r->ns = gr_schema_n_sparse(r->schema);
    r->max_ids = gr_schema_max_ids(r->schema);
    r->lists = gr_schema_has_lists(r->schema);
    if (!r->o.block_bytes) r->o.block_bytes = 1u << 20;
    if (r->o.block_bytes < 64) r->o.block_bytes = 64;
    if (!r->o.first_line) r->o.first_line = 1;
    if (!r->o.log_bad) r->o.log_bad = 5;
    r->path = strdup(path);
    r->total_blocks = UINT64_MAX;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc;
    if (!r->path) {
        rc = gr_seterr(GR_ENOMEM, "cannot allocate a reader");
        goto fail;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        rc = gr_seterr(errno == ENOENT ? GR_ENOENT : GR_EIO, "cannot open %s: %s", path,
                       strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(r->fd, &sb) != 0) {
        rc = gr_seterr(GR_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    r->end = opts->end && opts->end < size ? opts->end : size;
    if (opts->start > r->end) {
        rc = gr_seterr(GR_EINVAL, "%s: range start %llu is past its end %llu", path,
                       (unsigned long long)opts->start, (unsigned long long)r->end);
        goto fail;
    }
    r->pos = opts->start;
    r->next_line = r->o.first_line;
    posix_fadvise(r->fd, (off_t)r->pos, (off_t)(r->end - r->pos), POSIX_FADV_SEQUENTIAL);
    /* Unthreaded: the block being taken and one parsed ahead (gr_criteo_read_ahead; its
     * buffers are allocated only when that is used). */
    r->nblocks = r->o.threads ? 2 * r->o.threads + 1 : 2;
    r->blocks = calloc(r->nblocks, sizeof *r->blocks);
    if (!r->blocks) {
        rc = gr_seterr(GR_ENOMEM, "cannot allocate read blocks");
        goto fail;
    }
    if (r->o.threads) {
        r->parsers = calloc(r->o.threads, sizeof *r->parsers);
        if (!r->parsers) {
            rc = gr_seterr(GR_ENOMEM, "cannot allocate parser threads");
            goto fail;
        }
        if (pthread_create(&r->io_thread, NULL, io_main, r) != 0) {
            rc = gr_seterr(GR_ENOMEM, "cannot start the reader thread");
            goto fail;
        }
        r->io_started = true;
        for (unsigned i = 0; i < r->o.threads; i++) {
            if (pthread_create(&r->parsers[i], NULL, parser_main, r) != 0) {
                rc = gr_seterr(GR_ENOMEM, "cannot start parser thread %u", i);
                goto fail;
            }
            r->nparsers++;
        }
    }
    *out = r;
    return GR_OK;
fail:
    gr_criteo_close(r);
    return rc;
}

/* Makes r->blocks[cur] a parsed block. Returns 1, 0 at the end, or a negative gr_err. */
static int current_block(gr_criteo_reader *r, block **out)
{
    if (!r->o.threads) {
        block *b = &r->blocks[r->cur % 2];
        if (b->state == BLK_PARSED) {
            *out = b;
            return 1;
        }
        int rc = read_block(r, b);
        if (rc <= 0) return rc;
        parse_block(r, b);
        b->state = BLK_PARSED;
        *out = b;
        return 1;
    }
    block *b = &r->blocks[r->cur % r->nblocks];
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (b->state == BLK_PARSED && b->seq == r->cur) break;
        if (r->total_blocks != UINT64_MAX && r->cur >= r->total_blocks) {
            int rc = r->io_err;
            if (rc) gr_seterr(rc, "%s", r->io_errmsg);
            pthread_mutex_unlock(&r->mu);
            return rc ? rc : 0;
        }
        pthread_cond_wait(&r->cv, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    *out = b;
    return 1;
}

static void release_block(gr_criteo_reader *r, block *b)
{
    r->st.lines += b->nlines;
    r->st.bad_lines += b->bad;
    r->st.empty_lines += b->empty;
    if (b->bad && !r->st.first_bad_line) {
        r->st.first_bad_line = b->first_bad_line;
        snprintf(r->st.first_bad_msg, sizeof r->st.first_bad_msg, "%s", b->first_bad_msg);
    }
    if (!r->o.threads) {
        b->state = BLK_FREE;
        r->cur++;
        return;
    }
    pthread_mutex_lock(&r->mu);
    b->state = BLK_FREE;
    r->cur++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Appends k examples of block b (from its example j) to a batch of a schema with lists. */
static void copy_bags(const gr_criteo_reader *r, const block *b, size_t j, size_t k, gr_batch *out)
{
    const uint32_t S = r->ns;
    size_t from = b->ex_ids[j], count = b->ex_ids[j + k] - from;
    memcpy(out->ids + out->n_ids, b->ids + from, count * sizeof *out->ids);
    uint32_t *off = out->bag_off + out->n * S;
    uint32_t at = off[0];
    const uint32_t *len = b->bag_len + j * S;
    for (size_t t = 0; t < k * S; t++) {
        at += len[t];
        off[t + 1] = at;
    }
    out->n_ids += count;
}

int gr_criteo_next(gr_criteo_reader *r, gr_batch *out)
{
    out->n = 0;
    out->n_ids = 0;
    if (out->bag_off) out->bag_off[0] = 0;
    if (r->done_err) return gr_seterr(r->done_err, "reader already failed");
    if (out->n_dense != r->nd || out->n_sparse != r->ns || (r->lists && !out->bag_off) ||
        out->ids_cap < out->cap * r->max_ids)
        return gr_seterr(GR_EINVAL, "reader: the batch was made for another schema (%u dense, %u "
                         "sparse; the file's has %u and %u)", out->n_dense, out->n_sparse, r->nd,
                         r->ns);
    size_t want = r->o.batch < out->cap ? r->o.batch : out->cap;
    while (out->n < want) {
        block *b = NULL;
        int rc = current_block(r, &b);
        if (rc < 0) {
            r->done_err = rc;
            return rc;
        }
        if (rc == 0) break;
        if (b->err) {
            r->done_err = b->err;
            return gr_seterr(b->err, "%s", b->errmsg);
        }
        size_t k = b->n - b->taken;
        if (k > want - out->n) k = want - out->n;
        size_t i = out->n, j = b->taken;
        memcpy(out->labels + i, b->labels + j, k * sizeof *out->labels);
        memcpy(out->dense + i * r->nd, b->dense + j * r->nd, k * r->nd * sizeof *out->dense);
        if (r->lists) {
            copy_bags(r, b, j, k, out);
        } else {
            memcpy(out->ids + i * r->ns, b->ids + j * r->ns, k * r->ns * sizeof *out->ids);
            out->n_ids += k * r->ns;
        }
        out->n += k;
        b->taken += k;
        if (b->taken == b->n) release_block(r, b);
    }
    r->st.examples += out->n;
    return GR_OK;
}

int gr_criteo_read_ahead(gr_criteo_reader *r)
{
    if (r->o.threads || r->done_err) return 0;
    /* The block the next examples come from, else the one after it: blocks are read and
     * parsed in file order, one at most ahead of the block being taken. */
    block *b = &r->blocks[r->cur % 2];
    if (b->state == BLK_PARSED) b = &r->blocks[(r->cur + 1) % 2];
    if (b->state == BLK_PARSED) return 0;
    int rc = read_block(r, b);
    if (rc == 0) return 0;
    if (rc < 0) {
        /* Handed out where the block's examples would have been, as a parse error is. */
        b->n = b->taken = 0;
        b->bad = b->empty = b->nlines = 0;
        b->err = rc;
        snprintf(b->errmsg, sizeof b->errmsg, "%s", gr_errmsg());
        b->state = BLK_PARSED;
        return rc;
    }
    parse_block(r, b);
    b->state = BLK_PARSED;
    return 1;
}

void gr_criteo_get_stats(const gr_criteo_reader *r, gr_criteo_stats *st) { *st = r->st; }

void gr_criteo_close(gr_criteo_reader *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->io_started) pthread_join(r->io_thread, NULL);
    for (unsigned i = 0; i < r->nparsers; i++) pthread_join(r->parsers[i], NULL);
    free(r->parsers);
    if (r->blocks) {
        for (unsigned i = 0; i < r->nblocks; i++) {
            free(r->blocks[i].text);
            free(r->blocks[i].labels);
            free(r->blocks[i].dense);
            free(r->blocks[i].ids);
            free(r->blocks[i].ex_ids);
            free(r->blocks[i].bag_len);
        }
        free(r->blocks);
    }
    if (r->fd >= 0) close(r->fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->carry);
    free(r->path);
    free(r);
}

int gr_criteo_split(const char *path, unsigned parts, uint64_t *offsets, uint64_t *first_lines)
{
    if (parts == 0) return gr_seterr(GR_EINVAL, "split: parts must be > 0");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gr_seterr(errno == ENOENT ? GR_ENOENT : GR_EIO, "cannot open %s: %s", path,
                         strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return gr_seterr(GR_EIO, "cannot stat %s: %s", path, strerror(errno));
    }
    uint64_t size = (uint64_t)sb.st_size;
    offsets[0] = 0;
    if (first_lines) first_lines[0] = 1;
    offsets[parts] = size;
    if (first_lines) first_lines[parts] = 0;
    size_t bufsz = 1u << 20;
    char *buf = malloc(bufsz);
    if (!buf) {
        close(fd);
        return gr_seterr(GR_ENOMEM, "split: cannot allocate a buffer");
    }
    /* One sequential pass: count newlines; boundary k is just after the first newline at or
     * after byte k*size/parts - 1. */
    uint64_t pos = 0, lines = 0;
    unsigned k = 1;
    int rc = GR_OK;
    while (k < parts) {
        uint64_t nominal = size / parts * k + (size % parts) * k / parts;
        if (nominal == 0) {
            offsets[k] = 0;
            if (first_lines) first_lines[k] = 1;
            k++;
            continue;
        }
        ssize_t got = pread(fd, buf, bufsz, (off_t)pos);
        if (got < 0) {
            if (errno == EINTR) continue;
            rc = gr_seterr(GR_EIO, "%s: read: %s", path, strerror(errno));
            break;
        }
        if (got == 0) { /* past the last newline: the rest of the ranges are empty */
            for (; k < parts; k++) {
                offsets[k] = size;
                if (first_lines) first_lines[k] = lines + 1;
            }
            break;
        }
        size_t i = 0;
        while (k < parts && i < (size_t)got) {
            nominal = size / parts * k + (size % parts) * k / parts;
            const char *q = memchr(buf + i, '\n', (size_t)got - i);
            if (!q) break;
            size_t at = (size_t)(q - buf);
            lines++;
            i = at + 1;
            if (pos + at >= nominal - 1) {
                uint64_t off = pos + at + 1;
                while (k < parts && size / parts * k + (size % parts) * k / parts <= off) {
                    offsets[k] = off;
                    if (first_lines) first_lines[k] = lines + 1;
                    k++;
                }
            }
        }
        pos += (uint64_t)got;
    }
    free(buf);
    close(fd);
    return rc;
}
