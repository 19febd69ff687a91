/* granary._granary.Client: one gr_client (connections to every shard) and its calls. Arrays
 * come through the buffer protocol: keys int64/uint64, rows and gradients float32, rows
 * written in place. Every call that talks to the shards releases the GIL. */
#include "ext.h"

#include <stdlib.h>
#include <string.h>

#define CLIENT(o) ((gr_py_client *)(o))

static void destroy_if_idle(gr_py_client *self)
{
    if (self->closed && self->inflight == 0 && self->c) {
        gr_client *c = self->c;
        gr_py_coord *pc = self->coord;
        self->c = NULL;
        self->coord = NULL;
        Py_BEGIN_ALLOW_THREADS
        gr_client_destroy(c);
        gr_py_coord_close(pc); /* after the client: its stale hook uses the coordinator */
        Py_END_ALLOW_THREADS
    }
}

void gr_py_client_op_done(gr_py_client *self)
{
    self->inflight--;
    destroy_if_idle(self);
}

/* The client for a call, or NULL with ValueError when it was closed. */
static gr_client *use(gr_py_client *self)
{
    if (self->closed || !self->c) {
        PyErr_SetString(PyExc_ValueError, "granary client is closed");
        return NULL;
    }
    return self->c;
}

/* Brackets a call that releases the GIL so close() in another thread defers the destroy. */
#define CALL_BEGIN(self) \
    (self)->inflight++;  \
    Py_BEGIN_ALLOW_THREADS
#define CALL_END(self)  \
    Py_END_ALLOW_THREADS \
    (self)->inflight--;

static int client_init(PyObject *o, PyObject *args, PyObject *kw)
{
    gr_py_client *self = CLIENT(o);
    static char *kwlist[] = {"servers", "cluster_file", "auth_file", "connect_timeout_ms",
                             "request_timeout_ms", "any_shard", "coord", NULL};
    const char *servers = NULL, *cluster_file = NULL, *auth_file = NULL, *coord = NULL;
    unsigned int connect_ms = 5000, request_ms = 30000;
    int any_shard = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzIIpz", kwlist, &servers, &cluster_file,
                                     &auth_file, &connect_ms, &request_ms, &any_shard, &coord))
        return -1;
    if (self->c) {
        PyErr_SetString(PyExc_ValueError, "Client.__init__ called twice");
        return -1;
    }
    if ((servers != NULL) + (cluster_file != NULL) + (coord != NULL) != 1) {
        PyErr_SetString(PyExc_ValueError, "Client: give exactly one of servers='host:port,...', "
                                          "cluster_file= or coord='zk://HOSTS/PATH'");
        return -1;
    }
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = servers;
    cfg.cluster_file = cluster_file;
    cfg.auth_file = auth_file;
    cfg.connect_timeout_ms = connect_ms;
    cfg.request_timeout_ms = request_ms;
    cfg.any_shard = any_shard;
    gr_client *c = NULL;
    gr_py_coord *pc = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = coord ? gr_py_coord_connect(coord, &cfg, &pc, &c) : gr_client_create(&cfg, &c);
    Py_END_ALLOW_THREADS
    if (rc) {
        gr_py_raise(rc);
        return -1;
    }
    self->c = c;
    self->coord = pc;
    self->connect_ms = connect_ms;
    self->closed = 0;
    return 0;
}

static void client_dealloc(PyObject *o)
{
    gr_py_client *self = CLIENT(o);
    /* Ops and running calls hold references, so nothing is in flight here. */
    self->closed = 1;
    self->inflight = 0;
    destroy_if_idle(self);
    Py_TYPE(o)->tp_free(o);
}

static PyObject *client_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    CLIENT(o)->closed = 1;
    destroy_if_idle(CLIENT(o));
    Py_RETURN_NONE;
}

static PyObject *client_shards(PyObject *o, void *closure)
{
    (void)closure;
    gr_client *c = use(CLIENT(o));
    return c ? PyLong_FromUnsignedLong(gr_client_shards(c)) : NULL;
}

static PyObject *client_shard_addr(PyObject *o, PyObject *args)
{
    unsigned int shard;
    if (!PyArg_ParseTuple(args, "I", &shard)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    const char *a = gr_client_shard_addr(c, shard);
    if (!a) return PyErr_Format(PyExc_IndexError, "shard %u: the client has %u shards", shard,
                                gr_client_shards(c));
    return PyUnicode_FromString(a);
}

static PyObject *client_epoch(PyObject *o, void *closure)
{
    (void)closure;
    gr_client *c = use(CLIENT(o));
    return c ? PyLong_FromUnsignedLong(gr_client_epoch(c)) : NULL;
}

/* refresh() -> shards re-pointed: see gr_py_coord_refresh. */
static PyObject *client_refresh(PyObject *o, PyObject *unused)
{
    (void)unused;
    gr_py_client *self = CLIENT(o);
    gr_client *c = use(self);
    if (!c) return NULL;
    if (!self->coord) {
        PyErr_SetString(PyExc_ValueError, "refresh(): this client was not made with coord=");
        return NULL;
    }
    if (self->inflight) {
        PyErr_Format(PyExc_RuntimeError, "refresh(): %ld operation(s) still in flight on this "
                     "client: wait for them first", self->inflight);
        return NULL;
    }
    uint32_t moved = 0;
    int rc;
    CALL_BEGIN(self)
    rc = gr_py_coord_refresh(self->coord, c, self->connect_ms, &moved);
    CALL_END(self)
    return rc ? gr_py_raise(rc) : PyLong_FromUnsignedLong(moved);
}

/* ---- one table's batch: keys, and rows or gradients -------------------------------------- */

typedef struct {
    Py_buffer keys, vals;
    int have_keys, have_vals;
    gr_client_batch b;
} batch_args;

static void batch_release(batch_args *a)
{
    if (a->have_keys) PyBuffer_Release(&a->keys);
    if (a->have_vals) PyBuffer_Release(&a->vals);
    a->have_keys = a->have_vals = 0;
}

/* Fills a->b from (table, dim, keys, values); values are rows to write (writable) or
 * gradients to read. Checks that values hold exactly n * dim floats. */
static int batch_get(batch_args *a, unsigned table, unsigned dim, PyObject *keys, PyObject *vals,
                     int writable, int unique)
{
    memset(a, 0, sizeof *a);
    size_t n = 0, nv = 0;
    if (dim == 0) {
        PyErr_SetString(PyExc_ValueError, "dim must be at least 1");
        return -1;
    }
    if (gr_py_buffer(keys, GR_PY_U64, 0, "keys", &a->keys, &n)) return -1;
    a->have_keys = 1;
    if (gr_py_buffer(vals, GR_PY_F32, writable, writable ? "out" : "grads", &a->vals, &nv)) {
        batch_release(a);
        return -1;
    }
    a->have_vals = 1;
    if (nv != n * (size_t)dim) {
        PyErr_Format(PyExc_ValueError, "%s has %zu floats; %zu keys of dim %u need %zu",
                     writable ? "out" : "grads", nv, n, dim, n * (size_t)dim);
        batch_release(a);
        return -1;
    }
    a->b.table = table;
    a->b.dim = dim;
    a->b.n = n;
    a->b.keys = a->keys.buf;
    if (writable)
        a->b.rows = a->vals.buf;
    else
        a->b.grads = a->vals.buf;
    a->b.flags = unique ? GR_CLIENT_BATCH_UNIQUE : 0;
    return 0;
}

/* A list of (table, dim, keys, values) tuples: several tables in one call (one request per
 * shard for all of them). On success *out is a calloc'd array of *nb parsed batches. */
static int batches_get(PyObject *seq, int writable, int unique, batch_args **out, size_t *nb)
{
    *out = NULL;
    *nb = 0;
    PyObject *fast = PySequence_Fast(seq, "batches: want a list of (table, dim, keys, values)");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    batch_args *a = calloc(n ? (size_t)n : 1, sizeof *a);
    if (!a) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(fast, i), *keys, *vals;
        unsigned table, dim;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "IIOO", &table, &dim, &keys, &vals)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "batches[%zd]: want a tuple (table, dim, keys, values)", i);
            }
            break;
        }
        if (batch_get(&a[i], table, dim, keys, vals, writable, unique)) break;
    }
    Py_DECREF(fast);
    if (i < n) {
        for (Py_ssize_t j = 0; j < i; j++) batch_release(&a[j]);
        free(a);
        return -1;
    }
    *out = a;
    *nb = (size_t)n;
    return 0;
}

static void batches_release(batch_args *a, size_t nb)
{
    for (size_t i = 0; a && i < nb; i++) batch_release(&a[i]);
    free(a);
}

/* The gr_client_batch array of parsed batches (NULL with MemoryError). */
static gr_client_batch *batches_plain(const batch_args *a, size_t nb)
{
    gr_client_batch *b = calloc(nb ? nb : 1, sizeof *b);
    if (!b) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < nb; i++) b[i] = a[i].b;
    return b;
}

static char *many_kw[] = {"batches", "readonly", "unique", NULL};

/* pull_many(batches, readonly=False, unique=False, start=False) */
static PyObject *pull_many(PyObject *o, PyObject *args, PyObject *kw, int start)
{
    PyObject *seq;
    int readonly = 0, unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|pp", many_kw, &seq, &readonly, &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args *a;
    size_t nb;
    if (!c || batches_get(seq, 1, unique, &a, &nb)) return NULL;
    gr_client_batch *b = batches_plain(a, nb);
    if (!b) {
        batches_release(a, nb);
        return NULL;
    }
    unsigned flags = readonly ? GR_CLIENT_READONLY : 0;
    gr_client_op *op = NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = start ? gr_client_pull_start(c, b, nb, flags, &op) : gr_client_pull_many(c, b, nb, flags);
    CALL_END(CLIENT(o))
    free(b);
    if (rc || !start) {
        batches_release(a, nb);
        if (rc) return gr_py_raise(rc);
        Py_RETURN_NONE;
    }
    /* The op keeps the rows buffers it writes; the keys were read during the start call. */
    Py_buffer *views = malloc((nb ? nb : 1) * sizeof *views);
    if (!views) {
        /* Nowhere to keep the buffers: finish the pull before they are released. */
        CALL_BEGIN(CLIENT(o))
        gr_client_wait(op, -1);
        CALL_END(CLIENT(o))
        batches_release(a, nb);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < nb; i++) {
        PyBuffer_Release(&a[i].keys);
        views[i] = a[i].vals;
    }
    free(a);
    PyObject *ret = gr_py_op_new(o, op, views, (int)nb);
    free(views);
    return ret;
}

static PyObject *client_pull_many(PyObject *o, PyObject *a, PyObject *k) { return pull_many(o, a, k, 0); }
static PyObject *client_pull_many_start(PyObject *o, PyObject *a, PyObject *k)
{
    return pull_many(o, a, k, 1);
}

/* push_many(batches, unique=False, start=False); gradients are copied during the call. */
static PyObject *push_many(PyObject *o, PyObject *args, PyObject *kw, int start)
{
    static char *kwlist[] = {"batches", "unique", NULL};
    PyObject *seq;
    int unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p", kwlist, &seq, &unique)) return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args *a;
    size_t nb;
    if (!c || batches_get(seq, 0, unique, &a, &nb)) return NULL;
    gr_client_batch *b = batches_plain(a, nb);
    if (!b) {
        batches_release(a, nb);
        return NULL;
    }
    gr_client_op *op = NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = start ? gr_client_push_start(c, b, nb, &op) : gr_client_push_many(c, b, nb);
    CALL_END(CLIENT(o))
    free(b);
    batches_release(a, nb);
    if (rc) return gr_py_raise(rc);
    if (!start) Py_RETURN_NONE;
    return gr_py_op_new(o, op, NULL, 0);
}

static PyObject *client_push_many(PyObject *o, PyObject *a, PyObject *k) { return push_many(o, a, k, 0); }
static PyObject *client_push_many_start(PyObject *o, PyObject *a, PyObject *k)
{
    return push_many(o, a, k, 1);
}

static char *pull_kw[] = {"table", "dim", "keys", "out", "readonly", "unique", NULL};

static PyObject *client_pull(PyObject *o, PyObject *args, PyObject *kw)
{
    unsigned table, dim;
    PyObject *keys, *out;
    int readonly = 0, unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIOO|pp", pull_kw, &table, &dim, &keys, &out,
                                     &readonly, &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args a;
    if (!c || batch_get(&a, table, dim, keys, out, 1, unique)) return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_pull_many(c, &a.b, 1, readonly ? GR_CLIENT_READONLY : 0);
    CALL_END(CLIENT(o))
    batch_release(&a);
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_pull_start(PyObject *o, PyObject *args, PyObject *kw)
{
    unsigned table, dim;
    PyObject *keys, *out;
    int readonly = 0, unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIOO|pp", pull_kw, &table, &dim, &keys, &out,
                                     &readonly, &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args a;
    if (!c || batch_get(&a, table, dim, keys, out, 1, unique)) return NULL;
    gr_client_op *op = NULL;
    int rc;
    /* Starting plans and sends the frames (dedup and routing in C): without the GIL. */
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_pull_start(c, &a.b, 1, readonly ? GR_CLIENT_READONLY : 0, &op);
    CALL_END(CLIENT(o))
    if (rc) {
        batch_release(&a);
        return gr_py_raise(rc);
    }
    /* The keys were read during the call; the op keeps only the rows it writes. */
    PyBuffer_Release(&a.keys);
    return gr_py_op_new(o, op, &a.vals, 1);
}

static char *push_kw[] = {"table", "dim", "keys", "grads", "unique", NULL};

static PyObject *client_push(PyObject *o, PyObject *args, PyObject *kw)
{
    unsigned table, dim;
    PyObject *keys, *grads;
    int unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIOO|p", push_kw, &table, &dim, &keys, &grads,
                                     &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args a;
    if (!c || batch_get(&a, table, dim, keys, grads, 0, unique)) return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_push_many(c, &a.b, 1);
    CALL_END(CLIENT(o))
    batch_release(&a);
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_push_start(PyObject *o, PyObject *args, PyObject *kw)
{
    unsigned table, dim;
    PyObject *keys, *grads;
    int unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIOO|p", push_kw, &table, &dim, &keys, &grads,
                                     &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args a;
    if (!c || batch_get(&a, table, dim, keys, grads, 0, unique)) return NULL;
    gr_client_op *op = NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_push_start(c, &a.b, 1, &op);
    CALL_END(CLIENT(o))
    batch_release(&a); /* gradients are copied during the start call */
    if (rc) return gr_py_raise(rc);
    return gr_py_op_new(o, op, NULL, 0);
}

static PyObject *client_push_pull(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"table", "dim", "keys", "grads", "out", NULL};
    unsigned table, dim;
    PyObject *keys, *grads, *out;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIOOO", kwlist, &table, &dim, &keys, &grads,
                                     &out))
        return NULL;
    gr_client *c = use(CLIENT(o));
    batch_args a, r;
    if (!c || batch_get(&a, table, dim, keys, grads, 0, 0)) return NULL;
    if (batch_get(&r, table, dim, keys, out, 1, 0)) {
        batch_release(&a);
        return NULL;
    }
    a.b.rows = r.b.rows;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_push_pull_many(c, &a.b, 1);
    CALL_END(CLIENT(o))
    batch_release(&a);
    batch_release(&r);
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_delete(PyObject *o, PyObject *args)
{
    unsigned table, dim;
    PyObject *keys;
    if (!PyArg_ParseTuple(args, "IIO", &table, &dim, &keys)) return NULL;
    gr_client *c = use(CLIENT(o));
    Py_buffer kb;
    size_t n;
    if (!c || gr_py_buffer(keys, GR_PY_U64, 0, "keys", &kb, &n)) return NULL;
    uint64_t deleted = 0;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_delete(c, table, dim, kb.buf, n, &deleted);
    CALL_END(CLIENT(o))
    PyBuffer_Release(&kb);
    if (rc) return gr_py_raise(rc);
    return PyLong_FromUnsignedLongLong(deleted);
}

/* ---- tables and dense parameters --------------------------------------------------------- */

/* Calls f(c, text) for a one-string call. */
static PyObject *string_call(PyObject *o, PyObject *args, int (*f)(gr_client *, const char *))
{
    const char *s;
    if (!PyArg_ParseTuple(args, "s", &s)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = f(c, s);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_create_table(PyObject *o, PyObject *a)
{
    return string_call(o, a, gr_client_create_table);
}
static PyObject *client_drop_table(PyObject *o, PyObject *a)
{
    return string_call(o, a, gr_client_drop_table);
}
static PyObject *client_dense_create(PyObject *o, PyObject *a)
{
    return string_call(o, a, gr_client_dense_create);
}

/* A call that fills a malloc'd JSON string. */
static PyObject *json_result(int rc, char *json)
{
    if (rc) {
        free(json);
        return gr_py_raise(rc);
    }
    PyObject *s = PyUnicode_FromString(json ? json : "null");
    free(json);
    return s;
}

static PyObject *client_describe_table(PyObject *o, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    char *json = NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_describe_table(c, name, &json);
    CALL_END(CLIENT(o))
    return json_result(rc, json);
}

static PyObject *client_stats(PyObject *o, PyObject *args)
{
    unsigned shard;
    if (!PyArg_ParseTuple(args, "I", &shard)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    char *json = NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_stats(c, shard, &json);
    CALL_END(CLIENT(o))
    return json_result(rc, json);
}

static PyObject *client_client_stats(PyObject *o, PyObject *unused)
{
    (void)unused;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    gr_client_stats_t st;
    gr_client_get_stats(c, &st);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "requests", st.requests, "bytes_sent",
                         st.bytes_sent, "bytes_received", st.bytes_received, "keys_in",
                         st.keys_in, "keys_sent", st.keys_sent, "reconnects", st.reconnects);
}

/* dense_pull(name, out) / dense_push(name, grad) / dense_set(name, values). */
static PyObject *dense_call(PyObject *o, PyObject *args, int writable,
                            int (*f)(gr_client *, const char *, float *, size_t))
{
    const char *name;
    PyObject *arr;
    if (!PyArg_ParseTuple(args, "sO", &name, &arr)) return NULL;
    gr_client *c = use(CLIENT(o));
    Py_buffer v;
    size_t n;
    if (!c || gr_py_buffer(arr, GR_PY_F32, writable, writable ? "out" : "values", &v, &n))
        return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = f(c, name, v.buf, n);
    CALL_END(CLIENT(o))
    PyBuffer_Release(&v);
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

static int dense_push_w(gr_client *c, const char *name, float *v, size_t n)
{
    return gr_client_dense_push(c, name, v, n);
}
static int dense_set_w(gr_client *c, const char *name, float *v, size_t n)
{
    return gr_client_dense_set(c, name, v, n);
}
static PyObject *client_dense_pull(PyObject *o, PyObject *a)
{
    return dense_call(o, a, 1, gr_client_dense_pull);
}
static PyObject *client_dense_push(PyObject *o, PyObject *a) { return dense_call(o, a, 0, dense_push_w); }
static PyObject *client_dense_set(PyObject *o, PyObject *a) { return dense_call(o, a, 0, dense_set_w); }

/* ---- sync jobs ------------------------------------------------------------------------------ */

static PyObject *client_sync_configure(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mode", "workers", "aggregate", "staleness", "reset", "clear", NULL};
    unsigned mode = 0, workers = 1, aggregate = 0, staleness = 0;
    int reset = 0, clear = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "I|IIIpp", kwlist, &mode, &workers, &aggregate,
                                     &staleness, &reset, &clear))
        return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    gr_client_sync_config cfg = {mode, workers, aggregate, staleness, 0};
    unsigned flags = (reset ? GR_CLIENT_SYNC_RESET : 0) | (clear ? GR_CLIENT_SYNC_CLEAR : 0);
    uint64_t step = 0;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_sync_configure(c, &cfg, flags, &step);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    return PyLong_FromUnsignedLongLong(step);
}

/* A uint64 array of exactly one entry per shard. */
static int shard_array(gr_client *c, PyObject *obj, int writable, const char *what, Py_buffer *v)
{
    size_t n;
    if (gr_py_buffer(obj, GR_PY_U64, writable, what, v, &n)) return -1;
    if (n != gr_client_shards(c)) {
        PyErr_Format(PyExc_ValueError, "%s has %zu entries; the client has %u shards", what, n,
                     gr_client_shards(c));
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *client_sync_acquire(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"worker", "want", "tags", "timeout_ms", NULL};
    unsigned worker, timeout_ms = 60000;
    PyObject *want, *tags;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IOO|I", kwlist, &worker, &want, &tags,
                                     &timeout_ms))
        return NULL;
    gr_client *c = use(CLIENT(o));
    Py_buffer wv, tv;
    if (!c || shard_array(c, want, 0, "want", &wv)) return NULL;
    if (shard_array(c, tags, 1, "tags", &tv)) {
        PyBuffer_Release(&wv);
        return NULL;
    }
    uint64_t step = 0;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_sync_acquire(c, worker, wv.buf, timeout_ms, tv.buf, &step);
    CALL_END(CLIENT(o))
    PyBuffer_Release(&wv);
    PyBuffer_Release(&tv);
    if (rc) return gr_py_raise(rc);
    return PyLong_FromUnsignedLongLong(step);
}

/* push_step(worker, tags, batches, unique=False) -> outcomes per shard: one step's gradients
 * of every table in one frame per shard (an empty list still tells every shard). */
static PyObject *client_push_step(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"worker", "tags", "batches", "unique", NULL};
    unsigned worker;
    PyObject *tags, *seq;
    int unique = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IOO|p", kwlist, &worker, &tags, &seq, &unique))
        return NULL;
    gr_client *c = use(CLIENT(o));
    Py_buffer tv;
    batch_args *a;
    size_t nb;
    if (!c || shard_array(c, tags, 0, "tags", &tv)) return NULL;
    if (batches_get(seq, 0, unique, &a, &nb)) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    uint32_t shards = gr_client_shards(c);
    uint32_t *outcomes = calloc(shards, sizeof *outcomes);
    gr_client_batch *b = outcomes ? batches_plain(a, nb) : NULL;
    if (!b) {
        free(outcomes);
        PyBuffer_Release(&tv);
        batches_release(a, nb);
        return outcomes ? NULL : PyErr_NoMemory();
    }
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_push_step(c, worker, tv.buf, b, nb, NULL, 0, outcomes);
    CALL_END(CLIENT(o))
    free(b);
    PyBuffer_Release(&tv);
    batches_release(a, nb);
    PyObject *list = rc ? NULL : PyList_New(shards);
    for (uint32_t s = 0; list && s < shards; s++)
        PyList_SET_ITEM(list, s, PyLong_FromUnsignedLong(outcomes[s]));
    free(outcomes);
    if (rc) return gr_py_raise(rc);
    return list;
}

static PyObject *client_sync_leave(PyObject *o, PyObject *args)
{
    unsigned worker;
    if (!PyArg_ParseTuple(args, "I", &worker)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_sync_leave(c, worker);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

/* ---- checkpoints and admin ----------------------------------------------------------------- */

static PyObject *client_ckpt_save(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"root", "step", "keep", "incremental", "meta", "same_step", NULL};
    gr_client_ckpt_opts opt;
    memset(&opt, 0, sizeof opt);
    unsigned long long step = 0;
    unsigned keep = 0;
    int incremental = 0, same_step = 0;
    const char *root, *meta = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sK|Ipzp", kwlist, &root, &step, &keep,
                                     &incremental, &meta, &same_step))
        return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    opt.root = root;
    opt.step = step;
    opt.keep = keep;
    opt.incremental = incremental;
    opt.meta = meta;
    opt.same_step = same_step;
    gr_client_ckpt_info info;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_ckpt_save(c, &opt, &info);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    return Py_BuildValue("{s:s,s:K,s:O,s:K,s:K,s:I,s:d}", "name", info.name, "step", info.step,
                         "delta", info.delta ? Py_True : Py_False, "rows", info.rows, "bytes",
                         info.bytes, "dense", info.dense, "seconds", info.seconds);
}

static PyObject *client_ckpt_load(PyObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"root", "name", "resolve_only", NULL};
    const char *root, *name = NULL;
    int resolve_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zp", kwlist, &root, &name, &resolve_only))
        return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    gr_client_ckpt_loaded out;
    memset(&out, 0, sizeof out);
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_ckpt_load(c, root, name, resolve_only, &out);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    PyObject *d = Py_BuildValue("{s:s,s:K,s:I,s:K,s:d,s:z}", "name", out.name, "step", out.step,
                                "shards", out.shards, "rows", out.rows, "seconds", out.seconds,
                                "meta", out.meta);
    free(out.meta);
    return d;
}

static PyObject *client_shutdown(PyObject *o, PyObject *args)
{
    int shard = -1;
    if (!PyArg_ParseTuple(args, "|i", &shard)) return NULL;
    gr_client *c = use(CLIENT(o));
    if (!c) return NULL;
    int rc;
    CALL_BEGIN(CLIENT(o))
    rc = gr_client_shutdown(c, shard);
    CALL_END(CLIENT(o))
    if (rc) return gr_py_raise(rc);
    Py_RETURN_NONE;
}

#define KW METH_VARARGS | METH_KEYWORDS
#define M(name, fn, flags, doc) {name, (PyCFunction)(void (*)(void))fn, flags, doc}
static PyMethodDef client_methods[] = {
    M("close", client_close, METH_NOARGS, "Closes the connections (after what is in flight)."),
    M("shard_addr", client_shard_addr, METH_VARARGS, "shard_addr(i) -> 'host:port'"),
    M("refresh", client_refresh, METH_NOARGS,
      "refresh() -> shards re-pointed: coord= only; re-reads the layout, follows moved shards "
      "and takes its epoch (nothing may be in flight)."),
    M("pull", client_pull, KW,
      "pull(table, dim, keys, out, readonly=False, unique=False): rows of keys into out "
      "(float32, len(keys)*dim), in place."),
    M("pull_start", client_pull_start, KW, "As pull, but returns an Op to wait() on."),
    M("push", client_push, KW,
      "push(table, dim, keys, grads, unique=False): gradients (duplicates summed in C)."),
    M("push_start", client_push_start, KW, "As push, but returns an Op (grads copied at once)."),
    M("push_pull", client_push_pull, KW, "push_pull(table, dim, keys, grads, out)"),
    M("delete", client_delete, METH_VARARGS, "delete(table, dim, keys) -> rows that existed"),
    M("create_table", client_create_table, METH_VARARGS, "create_table(spec_json)"),
    M("drop_table", client_drop_table, METH_VARARGS, "drop_table(name)"),
    M("describe_table", client_describe_table, METH_VARARGS, "describe_table(name) -> JSON text"),
    M("dense_create", client_dense_create, METH_VARARGS, "dense_create(spec_json)"),
    M("dense_pull", client_dense_pull, METH_VARARGS, "dense_pull(name, out)"),
    M("dense_push", client_dense_push, METH_VARARGS, "dense_push(name, grad)"),
    M("dense_set", client_dense_set, METH_VARARGS, "dense_set(name, values)"),
    M("sync_configure", client_sync_configure, KW,
      "sync_configure(mode, workers=1, aggregate=0, staleness=0, reset=False, clear=False) "
      "-> step"),
    M("sync_acquire", client_sync_acquire, KW,
      "sync_acquire(worker, want, tags, timeout_ms=60000) -> step (tags written per shard)"),
    M("push_step", client_push_step, KW,
      "push_step(worker, tags, batches, unique=False) -> outcomes per shard"),
    M("pull_many", client_pull_many, KW,
      "pull_many([(table, dim, keys, out), ...], readonly=False, unique=False)"),
    M("pull_many_start", client_pull_many_start, KW, "As pull_many, but returns an Op to wait() on"),
    M("push_many", client_push_many, KW, "push_many([(table, dim, keys, grads), ...], unique=False)"),
    M("push_many_start", client_push_many_start, KW, "As push_many; -> Op"),
    M("sync_leave", client_sync_leave, METH_VARARGS, "sync_leave(worker)"),
    M("stats", client_stats, METH_VARARGS, "stats(shard) -> the shard's stats JSON"),
    M("client_stats", client_client_stats, METH_NOARGS, "client-side counters (dict)"),
    M("ckpt_save", client_ckpt_save, KW,
      "ckpt_save(root, step, keep=0, incremental=False, meta=None, same_step=False) -> dict"),
    M("ckpt_load", client_ckpt_load, KW, "ckpt_load(root, name=None, resolve_only=False) -> dict"),
    M("shutdown", client_shutdown, METH_VARARGS, "shutdown(shard=-1)"),
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"shards", client_shards, NULL, "number of shards", NULL},
    {"epoch", client_epoch, NULL, "the layout epoch stamped on requests (0: not coordinated)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject gr_py_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "granary._granary.Client",
    .tp_basicsize = sizeof(gr_py_client),
    .tp_dealloc = client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Client(servers='host:port,...' | cluster_file=PATH | coord='zk://HOSTS/PATH', "
              "auth_file=None, connect_timeout_ms=5000, request_timeout_ms=30000, "
              "any_shard=False)",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = client_init,
    .tp_new = PyType_GenericNew,
};
