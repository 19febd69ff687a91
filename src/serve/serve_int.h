/* Internal to the serve part: the replica's row store (store.c), the replica itself
 * (replica.c), its HTTP face (http.c), its binary listener (listen.c) and its subscriptions to
 * training shards (follow.c). docs/serving.md has a line on each. */
#ifndef GRANARY_SERVE_INT_H
#define GRANARY_SERVE_INT_H

#include "granary/client.h"
#include "granary/http.h"
#include "granary/serve.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- store.c: one weights-only table. Keys hash to partitions; each partition is an open
 * addressing map with its own rwlock, and each row carries the version it was written at. */
typedef struct sv_part sv_part;
typedef struct sv_table {
    uint32_t id, dim;
    char name[64];
    uint32_t nparts; /* power of two */
    sv_part *parts;
} sv_table;

int sv_table_create(uint32_t id, const char *name, uint32_t dim, sv_table **out);
void sv_table_destroy(sv_table *t);
/* Rows of n keys (zeros when absent); found may be NULL. Each key's partition is read-locked
 * only while its row is copied. */
void sv_table_get(sv_table *t, const uint64_t *keys, size_t n, float *out, bool *found);
/* Writes each row whose stored version is older than version (or that is absent);
 * *written and *ignored count them. GR_ENOMEM when a partition cannot grow. */
int sv_table_put(sv_table *t, const uint64_t *keys, size_t n, const float *rows,
                 uint64_t version, uint64_t *written, uint64_t *ignored);
uint64_t sv_table_rows(sv_table *t);

/* ---- replica.c ---- */

/* The dense parameters of one version; a request holds a reference while it scores. */
typedef struct sv_dense {
    atomic_int refs;
    uint64_t version;
    gr_model_prepared *prep; /* params laid out for one-example requests (same bits) */
    size_t n;
    float params[];
} sv_dense;

typedef struct sv_follow sv_follow;

struct gr_serve {
    gr_serve_config cfg;
    char *model_dir, *from, *auth_file, *http_addr, *listen_addr;
    gr_model *model;
    uint32_t emb_table; /* the table the model's categorical columns read */
    sv_table *emb;      /* that table, set once at create (tables are never removed) */
    pthread_mutex_t mu; /* guards tables (the array, not their rows), dense, ws_free */
    sv_table **tables;
    size_t ntables;
    sv_dense *dense;
    struct sv_ws *ws_free; /* scoring scratch kept for reuse between requests */
    gr_http_server *http;
    struct sv_listen *listen;
    sv_follow *follow;
    atomic_uint_fast64_t model_version, publications, rows_applied, rows_ignored,
        last_apply_wall_ns, predicts, predict_examples, lookups, errors, coalesced_runs,
        coalesced_requests;
    atomic_uint shards_connected;
};

/* The table of that id, or NULL. Tables are never removed while the replica lives, so the
 * pointer stays valid. */
sv_table *sv_find_table(gr_serve *s, uint32_t id);
uint64_t sv_wall_ns(void);
/* Adds an empty table (an existing one of that id must have that dim). */
int sv_add_table(gr_serve *s, uint32_t id, const char *name, uint32_t dim);

/* ---- reply.c: {"predictions":[...],"model_version":V} of n probabilities, malloc'd into
 * *body (GR_ENOMEM when it cannot be). */
int sv_predict_reply(const float *probs, size_t n, uint64_t version, char **body, size_t *len);

/* ---- lines.c: {"lines": [...]} without cJSON. True with *n examples (arrays malloc'd, as
 * gr_serve_parse_predict gives them) when it read the body exactly as the cJSON path would
 * have; false (nothing allocated) when that path must answer: any other body, and every
 * error. */
bool sv_parse_lines_fast(const char *body, size_t len, uint32_t max, size_t *n, float **dense,
                         uint64_t **ids);

/* ---- http.c: the handler of the HTTP API. sv_parse_predict_json: the predict body through
 * cJSON (both forms, every error message); gr_serve_parse_predict tries lines.c first. */
int sv_parse_predict_json(const char *body, size_t len, uint32_t max, size_t *n, float **dense,
                          uint64_t **ids, char *err, size_t errlen);
void sv_http_handle(void *ctx, const gr_http_request *req, gr_http_response *resp);
/* Coalescing of one-example predicts (gr_http_config.park / run / reply). */
int sv_http_park(void *ctx, const gr_http_request *req, gr_http_response *resp, void **job);
void sv_http_run(void *ctx, void **jobs, size_t n);
void sv_http_reply(void *ctx, void *job, gr_http_response *resp);

/* ---- listen.c: the binary protocol (HELLO, PREDICT, LOOKUP) on its own port. */
typedef struct sv_listen sv_listen;
int sv_listen_start(gr_serve *s, const char *addr, sv_listen **out);
uint16_t sv_listen_port(const sv_listen *l);
void sv_listen_stop(sv_listen *l);

/* ---- follow.c: one thread per training shard long-polling SUBSCRIBE. */
int sv_follow_start(gr_serve *s, sv_follow **out);
void sv_follow_stop(sv_follow *f);

/* ---- load.c: bootstrap from a saved model. */
int sv_load_model_dir(gr_serve *s, const char *dir);

#endif
