/* The reference models: logistic regression and DLRM (bottom MLP, pairwise dot interaction of
 * the bottom output with one vector per sparse column, top MLP), forward and backward over a
 * batch with OpenBLAS, for any number of dense and sparse columns (Criteo's 13 and 26 by
 * default). Dense parameters are one flat float array so they can live on a parameter server
 * as one dense tensor; embedding rows come in and their gradients go out per sparse slot. */
#include "granary/train.h"
#include "train/gemm.h"
#include "train/hot_loops.h"
#include "train/interact.h"
#include "train/model_prep.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SPARSE 4096                      /* vectors per example a model takes, at most */
#define MAX_LAYERS (GR_MODEL_MAX_LAYERS + 1) /* hidden layers + the output layer */

typedef struct layer {
    uint32_t in, out;
    size_t w, b; /* offsets into the dense array: W is out x in, row-major */
    bool relu;
} layer;

struct gr_model {
    gr_model_config c;
    gr_schema *schema;   /* owned copy (c.schema points to it) */
    uint32_t nd, ns;     /* dense features, sparse vectors per example */
    uint32_t nvec, npairs; /* DLRM: bottom output + one vector per slot; their dot products */
    layer bot[MAX_LAYERS], top[MAX_LAYERS];
    uint32_t nbot, ntop;
    uint32_t top_in;
    uint32_t ldz; /* a training step's row stride of z: top_in rounded up to 16 floats */
    size_t dense_size;
    uint32_t max_width;
};

struct gr_model_ws {
    size_t cap;
    float *bot_out[MAX_LAYERS], *top_out[MAX_LAYERS];
    float *z;          /* top input: n x top_in, rows ldz apart (64-byte aligned) */
    size_t ldz;        /* z's row stride this step: m->ldz in training, top_in to predict */
    float *dz;         /* its gradient */
    float *da, *db;    /* ping-pong gradient buffers, n x max_width */
    float *dbot;       /* gradient of the bottom output, n x dim */
    float *vt;         /* interaction: one example's vectors transposed (interact.c) */
    float *lanes;      /* interaction: a block of examples in lanes (interact.c), or NULL */
    float *dsym;       /* one example's dot gradients as a full nvec x nvec matrix */
    float *wt;         /* training step: each layer's W transposed (in x out), dense_size */
    float *panel;      /* training step: gemm.c's scratch (64-byte aligned) */
    const gr_model_prepared *prep; /* set by the predict calls for one example, or with each */
    bool each;         /* gr_model_predict_each: every example computed as if alone */
};

/* Weights laid out for scoring one example (model_prep.c): each layer's W transposed, and
 * the K blocking that reproduces cblas_sgemm's bits for it (q == 0: that layer keeps sgemm). */
struct gr_model_prepared {
    const float *params; /* the parameters it was made from: used only with those */
    float *wt;           /* dense_size floats, W of each layer transposed (in x out) */
    uint32_t bot_q[MAX_LAYERS], bot_u[MAX_LAYERS], top_q[MAX_LAYERS], top_u[MAX_LAYERS];
};

void gr_model_config_default(gr_model_config *c, gr_model_kind kind)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->dim = kind == GR_MODEL_LR ? 1 : 16;
    c->bottom[0] = 64;
    c->bottom[1] = 32;
    c->n_bottom = 2;
    c->top[0] = 128;
    c->top[1] = 64;
    c->n_top = 2;
    c->seed = 1;
    c->n_dense = c->n_sparse = 0; /* from the schema: Criteo's 13 and 26 */
    c->schema = NULL;
}

int gr_model_parse_layers(const char *s, uint32_t *sizes, uint32_t *n)
{
    uint32_t k = 0;
    const char *p = s;
    if (!s) return gr_seterr(GR_EINVAL, "layer list missing");
    if (!*p) {
        *n = 0;
        return GR_OK;
    }
    for (;;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != ','))
            return gr_seterr(GR_EINVAL, "bad layer list '%s': want sizes like 512,256,64", s);
        if (k == GR_MODEL_MAX_LAYERS)
            return gr_seterr(GR_EINVAL, "layer list '%s' has more than %d layers", s,
                             GR_MODEL_MAX_LAYERS);
        sizes[k++] = (uint32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    *n = k;
    return GR_OK;
}

static size_t add_layer(layer *l, uint32_t in, uint32_t out, bool relu, size_t at)
{
    l->in = in;
    l->out = out;
    l->w = at;
    l->b = at + (size_t)in * out;
    l->relu = relu;
    return l->b + out;
}

int gr_model_create(const gr_model_config *c, gr_model **out)
{
    *out = NULL;
    if (c->kind != GR_MODEL_LR && c->kind != GR_MODEL_DLRM)
        return gr_seterr(GR_EINVAL, "unknown model kind %d", (int)c->kind);
    if (c->kind == GR_MODEL_DLRM && (c->dim < 1 || c->dim > GR_TABLE_DIM_MAX))
        return gr_seterr(GR_EINVAL, "dlrm: dim %u is out of range 1..%d", c->dim,
                         GR_TABLE_DIM_MAX);
    if (c->n_bottom > GR_MODEL_MAX_LAYERS || c->n_top > GR_MODEL_MAX_LAYERS)
        return gr_seterr(GR_EINVAL, "at most %d hidden layers", GR_MODEL_MAX_LAYERS);
    for (uint32_t i = 0; i < c->n_bottom; i++)
        if (c->bottom[i] < 1 || c->bottom[i] > 65536)
            return gr_seterr(GR_EINVAL, "bottom layer %u has size %u", i, c->bottom[i]);
    for (uint32_t i = 0; i < c->n_top; i++)
        if (c->top[i] < 1 || c->top[i] > 65536)
            return gr_seterr(GR_EINVAL, "top layer %u has size %u", i, c->top[i]);
    const gr_schema *schema = c->schema ? c->schema : gr_schema_criteo();
    uint32_t nd = c->n_dense, ns = c->n_sparse;
    if (!c->schema && nd == 0 && ns == 0) {
        nd = GR_CRITEO_DENSE;
        ns = GR_CRITEO_SPARSE;
    }
    if (c->schema && ((nd && nd != gr_schema_n_dense(schema)) ||
                      (ns && ns != gr_schema_n_sparse(schema))))
        return gr_seterr(GR_EINVAL, "model: %u dense and %u sparse inputs, but the schema has %u "
                         "and %u", nd, ns, gr_schema_n_dense(schema), gr_schema_n_sparse(schema));
    if (c->schema) {
        nd = gr_schema_n_dense(schema);
        ns = gr_schema_n_sparse(schema);
    } else if (nd != GR_CRITEO_DENSE || ns != GR_CRITEO_SPARSE) {
        schema = NULL; /* shapes without a file layout (a caller that feeds arrays itself) */
    }
    if (ns > MAX_SPARSE) return gr_seterr(GR_EINVAL, "model: %u sparse inputs, at most %d", ns, MAX_SPARSE);
    if (nd > 65536) return gr_seterr(GR_EINVAL, "model: %u dense inputs, at most 65536", nd);
    if (nd + ns == 0) return gr_seterr(GR_EINVAL, "model: no inputs (0 dense, 0 sparse)");
    if (c->kind == GR_MODEL_DLRM && nd == 0)
        return gr_seterr(GR_EINVAL, "dlrm needs at least one dense feature (its bottom MLP's "
                         "input); use --model lr for ids only");
    gr_model *m = calloc(1, sizeof *m);
    if (!m) return gr_seterr(GR_ENOMEM, "cannot allocate a model");
    m->c = *c;
    m->c.schema = NULL;
    if (schema) {
        int rc = gr_schema_clone(schema, &m->schema);
        if (rc) {
            free(m);
            return rc;
        }
        m->c.schema = m->schema;
    }
    m->nd = m->c.n_dense = nd;
    m->ns = m->c.n_sparse = ns;
    if (c->kind == GR_MODEL_LR) {
        m->c.dim = 1;
        m->dense_size = nd + 1;
        m->max_width = 1; /* the workspace then holds the n logits */
        m->top_in = 1;
        m->ldz = 1;
        *out = m;
        return GR_OK;
    }
    m->nvec = ns + 1;
    m->npairs = m->nvec * (m->nvec - 1) / 2;
    size_t at = 0;
    uint32_t in = nd, w = nd;
    for (uint32_t i = 0; i <= c->n_bottom; i++) {
        uint32_t o = i < c->n_bottom ? c->bottom[i] : c->dim;
        at = add_layer(&m->bot[i], in, o, true, at); /* DLRM: ReLU on every bottom layer */
        in = o;
        if (o > w) w = o;
    }
    m->nbot = c->n_bottom + 1;
    m->top_in = c->dim + m->npairs;
    m->ldz = (m->top_in + 15) / 16 * 16;
    in = m->top_in;
    if (in > w) w = in;
    for (uint32_t i = 0; i <= c->n_top; i++) {
        bool last = i == c->n_top;
        uint32_t o = last ? 1 : c->top[i];
        at = add_layer(&m->top[i], in, o, !last, at);
        in = o;
        if (o > w) w = o;
    }
    m->ntop = c->n_top + 1;
    m->dense_size = at;
    m->max_width = w;
    *out = m;
    return GR_OK;
}

void gr_model_destroy(gr_model *m)
{
    if (!m) return;
    gr_schema_destroy(m->schema);
    free(m);
}
const gr_model_config *gr_model_get_config(const gr_model *m) { return &m->c; }
uint32_t gr_model_n_dense(const gr_model *m) { return m->nd; }
uint32_t gr_model_n_sparse(const gr_model *m) { return m->ns; }
const gr_schema *gr_model_schema(const gr_model *m) { return m->schema; }
size_t gr_model_dense_size(const gr_model *m) { return m->dense_size; }
uint32_t gr_model_emb_dim(const gr_model *m) { return m->c.dim; }

const char *gr_model_dense_name(const gr_model *m)
{
    return m->c.kind == GR_MODEL_LR ? "lr.dense" : "dlrm.dense";
}

void gr_model_init_dense(const gr_model *m, float *p)
{
    memset(p, 0, m->dense_size * sizeof *p);
    if (m->c.kind == GR_MODEL_LR) return;
    gr_rng r;
    gr_rng_seed(&r, m->c.seed ^ 0x646c726d64656e73ull);
    for (int part = 0; part < 2; part++) {
        const layer *ls = part ? m->top : m->bot;
        uint32_t nl = part ? m->ntop : m->nbot;
        for (uint32_t i = 0; i < nl; i++) {
            const layer *l = &ls[i];
            /* As DLRM: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0, sqrt(1 / out)). */
            double sw = sqrt(2.0 / (l->in + l->out)), sb = sqrt(1.0 / l->out);
            for (size_t k = 0; k < (size_t)l->in * l->out; k++)
                p[l->w + k] = (float)(sw * gr_rng_normal(&r));
            for (uint32_t k = 0; k < l->out; k++) p[l->b + k] = (float)(sb * gr_rng_normal(&r));
        }
    }
}

void gr_model_describe(const gr_model *m, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    if (m->c.kind == GR_MODEL_LR) {
        snprintf(buf, len, "lr: dense.w %u @0, bias 1 @%u; embedding dim 1", m->nd, m->nd);
        return;
    }
    for (int part = 0; part < 2; part++) {
        const layer *ls = part ? m->top : m->bot;
        uint32_t nl = part ? m->ntop : m->nbot;
        for (uint32_t i = 0; i < nl && at < len; i++) {
            const layer *l = &ls[i];
            int w = snprintf(buf + at, len - at, "%s%s%u.w %ux%u @%zu, %s%u.b %u @%zu",
                             at ? ", " : "", part ? "top" : "bottom", i, l->out, l->in, l->w,
                             part ? "top" : "bottom", i, l->out, l->b);
            if (w < 0) return;
            at += (size_t)w;
        }
    }
}

/* ---- workspace ---------------------------------------------------------------------------- */

static void ws_free_buffers(gr_model_ws *ws)
{
    for (int i = 0; i < MAX_LAYERS; i++) {
        free(ws->bot_out[i]);
        free(ws->top_out[i]);
        ws->bot_out[i] = ws->top_out[i] = NULL;
    }
    free(ws->z);
    free(ws->dz);
    free(ws->da);
    free(ws->db);
    free(ws->dbot);
    free(ws->vt);
    free(ws->lanes);
    free(ws->dsym);
    free(ws->wt);
    free(ws->panel);
    ws->z = ws->dz = ws->da = ws->db = ws->dbot = ws->vt = ws->lanes = ws->dsym = ws->wt = ws->panel = NULL;
    ws->cap = 0;
}

int gr_model_ws_create(const gr_model *m, gr_model_ws **out)
{
    (void)m;
    *out = calloc(1, sizeof **out);
    return *out ? GR_OK : gr_seterr(GR_ENOMEM, "cannot allocate a model workspace");
}

void gr_model_ws_destroy(gr_model_ws *ws)
{
    if (!ws) return;
    ws_free_buffers(ws);
    free(ws);
}

/* count floats on 64-byte lines: the interaction reads and writes rows 16 floats at a time */
static float *alloc_lines(size_t count)
{
    return aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64);
}

static int ws_reserve(const gr_model *m, gr_model_ws *ws, size_t n)
{
    if (ws->cap >= n) return GR_OK;
    ws_free_buffers(ws);
    bool ok = true;
    for (uint32_t i = 0; i < m->nbot; i++)
        ok &= (ws->bot_out[i] = alloc_lines(n * m->bot[i].out)) != NULL;
    for (uint32_t i = 0; i < m->ntop; i++)
        ok &= (ws->top_out[i] = malloc(n * m->top[i].out * sizeof(float))) != NULL;
    /* z's rows start on 64-byte lines in training (ldz a multiple of 16 floats): the
     * interaction writes them 16 floats at a time, and a store across two lines costs two. */
    ok &= (ws->z = alloc_lines(n * m->ldz)) != NULL;
    ok &= (ws->dz = malloc(n * m->top_in * sizeof(float))) != NULL;
    ok &= (ws->da = malloc(n * m->max_width * sizeof(float))) != NULL;
    ok &= (ws->db = malloc(n * m->max_width * sizeof(float))) != NULL;
    ok &= (ws->dbot = malloc(n * m->c.dim * sizeof(float))) != NULL;
    ok &= (ws->vt = calloc(tr_interact_vt_floats(m->nvec, m->c.dim), sizeof(float))) != NULL;
    size_t lanes = tr_interact_lanes_floats(m->nvec, m->c.dim);
    if (lanes) ok &= (ws->lanes = malloc(lanes * sizeof(float))) != NULL;
    ok &= (ws->dsym = malloc(((size_t)m->nvec * m->nvec + 1) * sizeof(float))) != NULL;
    /* The products' right operands have at most max(top_in, max_width, nd) columns. */
    size_t cols = m->top_in > m->max_width ? m->top_in : m->max_width;
    if (cols < m->nd) cols = m->nd;
    ok &= (ws->wt = malloc((m->dense_size ? m->dense_size : 1) * sizeof(float))) != NULL;
    ok &= (ws->panel = aligned_alloc(64, tr_gemm_scratch_floats(cols) * sizeof(float))) != NULL;
    if (!ok) {
        ws_free_buffers(ws);
        return gr_seterr(GR_ENOMEM, "cannot allocate a workspace for %zu examples", n);
    }
    ws->cap = n;
    return GR_OK;
}

/* ---- shared pieces ------------------------------------------------------------------------ */

/* The element-wise loops of a step: one copy per instruction set (hot_loops.h). */
GR_HOT_LOOPS static void relu_inplace(float *restrict y, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

/* dx = 0 where x (the layer's input, a ReLU output) is not positive. */
GR_HOT_LOOPS static void relu_mask(float *restrict dx, const float *restrict x, size_t cnt)
{
    for (size_t i = 0; i < cnt; i++) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}

/* db = the column sums of dy (n x out), rows added in order. */
GR_HOT_LOOPS static void bias_grad(float *restrict db, const float *restrict dy, size_t n,
                                   size_t out)
{
    memset(db, 0, out * sizeof *db);
    for (size_t i = 0; i < n; i++) {
        const float *row = dy + i * out;
        for (size_t k = 0; k < out; k++) db[k] += row[k];
    }
}

/* Y = X W^T + b, then ReLU if the layer has one. X: n x in, Y: n x out. With a prepared copy
 * (one example, q != 0) the product is model_prep.c's, which gives sgemm's bits. With ws->each
 * every row is what it is for n = 1: model_prep.c's multi-example kernel (q != 0), else sgemm
 * with M = 1 per row (sgemm's rows depend on M, so never one call for all). */
static void layer_forward(const gr_model_ws *ws, uint32_t q, uint32_t u, const layer *l,
                          const float *p, size_t n, const float *x, size_t ldx, float *y,
                          bool train)
{
    if (train) {
        /* The training step's own kernel (gemm.c) on W^T, transposed once per step. */
        tr_gemm_nn(n, l->out, l->in, x, ldx, ws->wt + l->w, l->out, p + l->b, y, l->out,
                   ws->panel);
    } else if (ws->prep && q && ws->each) {
        tr_gemv_exact_multi(l->in, l->out, n, x, ldx, ws->prep->wt + l->w, p + l->b, q, u, y,
                            l->out);
    } else if (ws->prep && q) {
        tr_gemv_exact(l->in, l->out, x, ws->prep->wt + l->w, p + l->b, q, u, y);
    } else if (ws->each) {
        for (size_t i = 0; i < n; i++) {
            float *yi = y + i * l->out;
            memcpy(yi, p + l->b, l->out * sizeof *y);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, (int)l->out, (int)l->in, 1.0f,
                        x + i * ldx, (int)ldx, p + l->w, (int)l->in, 1.0f, yi, (int)l->out);
        }
    } else {
        for (size_t i = 0; i < n; i++) memcpy(y + i * l->out, p + l->b, l->out * sizeof *y);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)l->out, (int)l->in,
                    1.0f, x, (int)ldx, p + l->w, (int)l->in, 1.0f, y, (int)l->out);
    }
    if (l->relu) relu_inplace(y, n * l->out);
}

/* Whether dW = dY^T X computes as X^T dY, transposed: gemm.c pads the product's columns to
 * TR_GEMM_NR, so a layer with few inputs (Criteo's 13 dense features into 64: 13 columns padded
 * to 32, against 64 in two full panels) does 2.5 times the work the other way round. Only
 * where it saves a quarter or more. */
static bool dw_transposed(const layer *l)
{
    const size_t pad_in = (l->in + TR_GEMM_NR - 1) / TR_GEMM_NR * TR_GEMM_NR;
    const size_t pad_out = (l->out + TR_GEMM_NR - 1) / TR_GEMM_NR * TR_GEMM_NR;
    return 4 * (size_t)l->in * pad_out <= 3 * (size_t)l->out * pad_in;
}

/* Given dY (already through the ReLU mask), writes dW and db of the layer into g and, if dx
 * is not NULL, dX = dY W masked by the ReLU of the layer below (x > 0) when mask_x. */
static void layer_backward(const gr_model_ws *ws, const layer *l, const float *p, size_t n,
                           const float *x, size_t ldx, const float *dy, float *g, float *dx,
                           bool mask_x)
{
    if (dw_transposed(l)) {
        /* dW^T = X^T dY: each element summed over the examples in the same order, so the same
         * bits, in fewer padded columns; then transposed into g. */
        float *gt = ws->wt + l->w; /* W^T's place: the forward is done with it */
        tr_gemm_tn(l->in, l->out, n, x, ldx, dy, l->out, gt, l->out, ws->panel);
        for (uint32_t o = 0; o < l->out; o++)
            for (uint32_t k = 0; k < l->in; k++)
                g[l->w + (size_t)o * l->in + k] = gt[(size_t)k * l->out + o];
    } else {
        tr_gemm_tn(l->out, l->in, n, dy, l->out, x, ldx, g + l->w, l->in, ws->panel);
    }
    bias_grad(g + l->b, dy, n, l->out);
    if (!dx) return;
    tr_gemm_nn(n, l->in, l->out, dy, l->out, p + l->w, l->in, NULL, dx, l->in, ws->panel);
    if (mask_x) relu_mask(dx, x, n * l->in); /* x below z: rows l->in apart */
}

/* Each layer's W (out x in) transposed into wt at the same offset: the training step's forward
 * products take W^T as their right operand, row-major. */
static void transpose_weights(const gr_model *m, const float *p, float *wt)
{
    for (int part = 0; part < 2; part++) {
        const layer *ls = part ? m->top : m->bot;
        const uint32_t nl = part ? m->ntop : m->nbot;
        for (uint32_t i = 0; i < nl; i++) {
            const layer *l = &ls[i];
            for (uint32_t o = 0; o < l->out; o++)
                for (uint32_t k = 0; k < l->in; k++)
                    wt[l->w + (size_t)k * l->out + o] = p[l->w + (size_t)o * l->in + k];
        }
    }
}

/* Numerically stable log loss from a logit: softplus(z) - y z. */
static double logloss_logit(float z, float y)
{
    double zz = z;
    return (zz > 0 ? zz : 0) + log1p(exp(-fabs(zz))) - y * zz;
}

static float sigmoidf(float z) { return (float)(1.0 / (1.0 + exp(-(double)z))); }

static int check_args(const gr_model *m, const float *params, size_t n, const float *dense,
                      const float *emb)
{
    (void)m;
    if (n == 0) return GR_OK;
    if (!params || !dense || !emb)
        return gr_seterr(GR_EINVAL, "model: params, dense features and embeddings needed");
    return GR_OK;
}

/* ---- logistic regression ------------------------------------------------------------------ */

static void lr_logits(const gr_model *m, const float *p, size_t n, const float *dense,
                      const float *emb, float *z)
{
    const uint32_t nd = m->nd, ns = m->ns;
    for (size_t i = 0; i < n; i++) {
        double s = p[nd];
        for (uint32_t j = 0; j < nd; j++) s += (double)p[j] * dense[i * nd + j];
        for (uint32_t k = 0; k < ns; k++) s += emb[i * ns + k];
        z[i] = (float)s;
    }
}

/* ---- DLRM ---------------------------------------------------------------------------------- */

/* Forward to the logits (ws->top_out[ntop-1], n x 1). */
static void dlrm_forward(const gr_model *m, gr_model_ws *ws, const float *p, size_t n,
                         const float *dense, const float *emb, bool train)
{
    const float *x = dense;
    const gr_model_prepared *pr = ws->prep;
    for (uint32_t l = 0; l < m->nbot; l++) {
        layer_forward(ws, pr ? pr->bot_q[l] : 0, pr ? pr->bot_u[l] : 0, &m->bot[l], p, n, x,
                      m->bot[l].in, ws->bot_out[l], train);
        x = ws->bot_out[l];
    }
    ws->ldz = train ? m->ldz : m->top_in; /* predictions: sgemm's bits as they always were */
    if (ws->each) /* as n = 1 computes it: the one-example path, whatever n */
        for (size_t i = 0; i < n; i++)
            tr_interact_forward(ws->z + i * ws->ldz, (uint32_t)ws->ldz, x + i * m->c.dim,
                                emb + i * m->ns * m->c.dim, 1, m->c.dim, m->ns, m->nvec, ws->vt,
                                ws->lanes);
    else
        tr_interact_forward(ws->z, (uint32_t)ws->ldz, x, emb, n, m->c.dim, m->ns, m->nvec,
                            ws->vt, ws->lanes);
    x = ws->z;
    for (uint32_t l = 0; l < m->ntop; l++) {
        layer_forward(ws, pr ? pr->top_q[l] : 0, pr ? pr->top_u[l] : 0, &m->top[l], p, n, x,
                      l ? m->top[l].in : ws->ldz, ws->top_out[l], train);
        x = ws->top_out[l];
    }
}

static void dlrm_backward(const gr_model *m, gr_model_ws *ws, const float *p, size_t n,
                          const float *dense, float *g, const float *emb, float *gemb)
{
    const uint32_t d = m->c.dim;
    /* ws->da holds dlogit (n x 1) on entry. Top MLP, last layer first. */
    float *dy = ws->da, *dx = ws->db;
    for (int l = (int)m->ntop - 1; l >= 0; l--) {
        const float *x = l ? ws->top_out[l - 1] : ws->z;
        float *target = l ? dx : ws->dz;
        layer_backward(ws, &m->top[l], p, n, x, l ? m->top[l].in : ws->ldz, dy, g, target, l > 0);
        if (l) {
            float *t = dy;
            dy = dx;
            dx = t;
        }
    }
    /* Interaction: z = [bot, dots(a > b)]. */
    const float *bot = ws->bot_out[m->nbot - 1];
    tr_interact_backward(ws->dz, m->top_in, bot, emb, n, d, m->ns, m->nvec, ws->dbot, gemb,
                          ws->dsym);
    /* Bottom MLP: its output went through a ReLU. */
    dy = ws->da;
    dx = ws->db;
    memcpy(dy, ws->dbot, n * d * sizeof *dy);
    relu_mask(dy, bot, n * d);
    for (int l = (int)m->nbot - 1; l >= 0; l--) {
        const float *x = l ? ws->bot_out[l - 1] : dense;
        layer_backward(ws, &m->bot[l], p, n, x, m->bot[l].in, dy, g, l ? dx : NULL, true);
        float *t = dy;
        dy = dx;
        dx = t;
    }
}

/* ---- entry points -------------------------------------------------------------------------- */

int gr_model_train_step(const gr_model *m, gr_model_ws *ws, const float *params, size_t n,
                        const float *dense, const float *emb, const float *labels, double *loss,
                        float *probs, float *grad_dense, float *grad_emb)
{
    int rc = check_args(m, params, n, dense, emb);
    if (rc) return rc;
    *loss = 0;
    memset(grad_dense, 0, m->dense_size * sizeof *grad_dense);
    if (n == 0) return GR_OK;
    if ((rc = ws_reserve(m, ws, n))) return rc;
    const float inv_n = 1.0f / (float)n;
    double sum = 0;
    if (m->c.kind == GR_MODEL_LR) {
        float *z = ws->da; /* n floats fit: max_width >= 1 */
        const uint32_t nd = m->nd, ns = m->ns;
        lr_logits(m, params, n, dense, emb, z);
        for (size_t i = 0; i < n; i++) {
            float pr = sigmoidf(z[i]);
            if (probs) probs[i] = pr;
            sum += logloss_logit(z[i], labels[i]);
            float dz = (pr - labels[i]) * inv_n;
            for (uint32_t j = 0; j < nd; j++) grad_dense[j] += dz * dense[i * nd + j];
            grad_dense[nd] += dz;
            for (uint32_t k = 0; k < ns; k++) grad_emb[i * ns + k] = dz;
        }
        *loss = sum / (double)n;
        return GR_OK;
    }
    transpose_weights(m, params, ws->wt);
    dlrm_forward(m, ws, params, n, dense, emb, true);
    const float *z = ws->top_out[m->ntop - 1];
    for (size_t i = 0; i < n; i++) {
        float pr = sigmoidf(z[i]);
        if (probs) probs[i] = pr;
        sum += logloss_logit(z[i], labels[i]);
        ws->da[i] = (pr - labels[i]) * inv_n;
    }
    *loss = sum / (double)n;
    dlrm_backward(m, ws, params, n, dense, grad_dense, emb, grad_emb);
    return GR_OK;
}

int gr_model_predict(const gr_model *m, gr_model_ws *ws, const float *params, size_t n,
                     const float *dense, const float *emb, float *probs)
{
    return gr_model_predict_prepared(m, ws, params, NULL, n, dense, emb, probs);
}

/* The forward pass of both predict entry points: with `each`, every example as n = 1 computes
 * it (prep then non-NULL and made from params). */
static int predict(const gr_model *m, gr_model_ws *ws, const float *params,
                   const gr_model_prepared *prep, bool each, size_t n, const float *dense,
                   const float *emb, float *probs)
{
    int rc = check_args(m, params, n, dense, emb);
    if (rc || n == 0) return rc;
    if ((rc = ws_reserve(m, ws, n))) return rc;
    if (m->c.kind == GR_MODEL_LR) {
        /* Each example's logit is its own sum (lr_logits): the same bits for any n. */
        lr_logits(m, params, n, dense, emb, probs);
    } else {
        /* The prepared path is for one example (the n that makes sgemm pack a panel per call
         * for one row of work) or examples each computed alone, and only with the parameters
         * it was made from. */
        ws->prep = prep && (n == 1 || each) && prep->params == params ? prep : NULL;
        ws->each = each;
        dlrm_forward(m, ws, params, n, dense, emb, false);
        ws->prep = NULL;
        ws->each = false;
        memcpy(probs, ws->top_out[m->ntop - 1], n * sizeof *probs);
    }
    for (size_t i = 0; i < n; i++) probs[i] = sigmoidf(probs[i]);
    return GR_OK;
}

int gr_model_predict_prepared(const gr_model *m, gr_model_ws *ws, const float *params,
                              const gr_model_prepared *prep, size_t n, const float *dense,
                              const float *emb, float *probs)
{
    return predict(m, ws, params, prep, false, n, dense, emb, probs);
}

int gr_model_predict_each(const gr_model *m, gr_model_ws *ws, const float *params,
                          const gr_model_prepared *prep, size_t n, const float *dense,
                          const float *emb, float *probs)
{
    if (!prep)
        return gr_seterr(GR_EINVAL, "predict each: no prepared weights (gr_model_prepare)");
    if (prep->params != params)
        return gr_seterr(GR_EINVAL, "predict each: the prepared weights were made from other "
                         "parameters than these");
    return predict(m, ws, params, prep, true, n, dense, emb, probs);
}

/* ---- weights prepared for one example at a time (model_prep.c) ---------------------------- */

static void prepare_layers(const layer *ls, uint32_t nl, const float *params, float *wt,
                           uint32_t *qs, uint32_t *us, uint32_t *hint_q, uint32_t *hint_u)
{
    for (uint32_t i = 0; i < nl; i++) {
        const layer *l = &ls[i];
        for (uint32_t j = 0; j < l->out; j++)
            for (uint32_t k = 0; k < l->in; k++)
                wt[l->w + (size_t)k * l->out + j] = params[l->w + (size_t)j * l->in + k];
        tr_gemv_find_split(l->in, l->out, params + l->w, wt + l->w, params + l->b, &qs[i], &us[i],
                           hint_q, hint_u);
    }
}

int gr_model_prepare(const gr_model *m, const float *params, gr_model_prepared **out)
{
    *out = NULL;
    gr_model_prepared *p = calloc(1, sizeof *p);
    if (!p || !(p->wt = malloc((m->dense_size ? m->dense_size : 1) * sizeof *p->wt))) {
        free(p);
        return gr_seterr(GR_ENOMEM, "cannot allocate prepared weights (%zu floats)", m->dense_size);
    }
    p->params = params;
    if (m->c.kind == GR_MODEL_DLRM) {
        static _Atomic uint32_t hint_q, hint_u; /* the same for every model in one process */
        uint32_t hq = atomic_load(&hint_q), hu = atomic_load(&hint_u);
        prepare_layers(m->bot, m->nbot, params, p->wt, p->bot_q, p->bot_u, &hq, &hu);
        prepare_layers(m->top, m->ntop, params, p->wt, p->top_q, p->top_u, &hq, &hu);
        atomic_store(&hint_q, hq);
        atomic_store(&hint_u, hu);
    }
    *out = p;
    return GR_OK;
}

void gr_model_prepared_destroy(gr_model_prepared *p)
{
    if (!p) return;
    free(p->wt);
    free(p);
}

int gr_model_prepared_layers(const gr_model_prepared *p)
{
    int k = 0;
    for (int i = 0; i < MAX_LAYERS; i++) k += (p->bot_q[i] != 0) + (p->top_q[i] != 0);
    return k;
}
