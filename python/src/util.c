/* granary._granary helpers that tie the PyTorch path to the C trainer: the data reader
 * (the same parser, schemas and feature ids as `granary train`; Criteo by default), dedup, the DLRM dense initializer and
 * its embedding table spec, and the exact AUC. */
#include "ext.h"

#include "granary/train.h"

#include <stdlib.h>
#include <string.h>

/* ---- CriteoReader ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    gr_criteo_reader *r;
    gr_batch b;
    size_t batch;
    gr_schema *schema; /* owned; NULL: Criteo */
    uint32_t n_dense, n_sparse, max_ids;
    int lists;
} gr_py_reader;

/* A schema from the reader's argument: "criteo", a file's path, or the JSON text itself. */
static int load_schema(const char *arg, gr_schema **out)
{
    *out = NULL;
    if (!arg) return GR_OK;
    const char *p = arg;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return *p == '{' ? gr_schema_parse(arg, strlen(arg), out) : gr_schema_load(arg, out);
}

static int reader_init(PyObject *o, PyObject *args, PyObject *kw)
{
    gr_py_reader *self = (gr_py_reader *)o;
    static char *kwlist[] = {"path", "batch", "threads", "start", "end", "schema", NULL};
    const char *path, *schema_arg = NULL;
    Py_ssize_t batch;
    unsigned threads = 0;
    unsigned long long start = 0, end = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sn|IKKz", kwlist, &path, &batch, &threads, &start,
                                     &end, &schema_arg))
        return -1;
    if (self->r) {
        PyErr_SetString(PyExc_ValueError, "CriteoReader.__init__ called twice");
        return -1;
    }
    if (batch < 1 || batch > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "batch must be 1..1048576, got %zd", batch);
        return -1;
    }
    gr_schema *schema = NULL;
    int rc = load_schema(schema_arg, &schema);
    if (rc) {
        gr_py_raise(rc);
        return -1;
    }
    const gr_schema *sc = schema ? schema : gr_schema_criteo();
    gr_criteo_opts opt;
    gr_criteo_opts_default(&opt);
    opt.batch = (size_t)batch;
    opt.threads = threads;
    opt.start = start;
    opt.end = end;
    opt.schema = schema;
    rc = gr_batch_init_schema(&self->b, (size_t)batch, schema);
    if (rc) {
        gr_schema_destroy(schema);
        gr_py_raise(rc);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = gr_criteo_open(path, &opt, &self->r);
    Py_END_ALLOW_THREADS
    if (rc) {
        gr_batch_fini(&self->b);
        memset(&self->b, 0, sizeof self->b);
        gr_schema_destroy(schema);
        gr_py_raise(rc);
        return -1;
    }
    self->batch = (size_t)batch;
    self->schema = schema;
    self->n_dense = gr_schema_n_dense(sc);
    self->n_sparse = gr_schema_n_sparse(sc);
    self->max_ids = gr_schema_max_ids(sc);
    self->lists = gr_schema_has_lists(sc);
    return 0;
}

/* next(labels, dense, ids, bag_off=None) -> n: the next batch copied into float32
 * labels[batch], float32 dense[batch * n_dense] and uint64/int64 ids; 0 at the end of the data.
 * Without list columns example i's sparse column s is ids[i * n_sparse + s]; with them ids gets
 * every bag's ids and uint32 bag_off[batch * n_sparse + 1] where each bag starts (example-major),
 * so bag_off[n * n_sparse] ids were written. */
static PyObject *reader_next(PyObject *o, PyObject *args)
{
    gr_py_reader *self = (gr_py_reader *)o;
    PyObject *lo, *dobj, *io, *bo = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O", &lo, &dobj, &io, &bo)) return NULL;
    if (!self->r) {
        PyErr_SetString(PyExc_ValueError, "the reader is closed");
        return NULL;
    }
    if (self->lists && bo == Py_None) {
        PyErr_SetString(PyExc_ValueError, "this schema has list columns: next() needs bag_off, "
                                          "uint32 of batch * n_sparse + 1 entries");
        return NULL;
    }
    Py_buffer v[4];
    size_t n[4] = {0, 0, 0, 0};
    int held = 0;
    PyObject *ret = NULL;
    if (gr_py_buffer(lo, GR_PY_F32, 1, "labels", &v[0], &n[0])) goto out;
    held++;
    if (gr_py_buffer(dobj, GR_PY_F32, 1, "dense", &v[1], &n[1])) goto out;
    held++;
    if (gr_py_buffer(io, GR_PY_U64, 1, "ids", &v[2], &n[2])) goto out;
    held++;
    if (bo != Py_None) {
        if (gr_py_buffer(bo, GR_PY_U32, 1, "bag_off", &v[3], &n[3])) goto out;
        held++;
    }
    size_t want[4] = {self->batch, self->batch * self->n_dense, self->batch * self->max_ids,
                      self->lists ? self->batch * self->n_sparse + 1 : 0};
    if (n[0] < want[0] || n[1] < want[1] || n[2] < want[2] || n[3] < want[3]) {
        PyErr_Format(PyExc_ValueError,
                     "buffers too small for a batch of %zu: labels %zu, dense %zu, ids %zu, "
                     "bag_off %zu (want %zu, %zu, %zu, %zu)",
                     self->batch, n[0], n[1], n[2], n[3], want[0], want[1], want[2], want[3]);
        goto out;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_criteo_next(self->r, &self->b);
    if (!rc) {
        size_t k = self->b.n;
        memcpy(v[0].buf, self->b.labels, k * sizeof(float));
        memcpy(v[1].buf, self->b.dense, k * self->n_dense * sizeof(float));
        memcpy(v[2].buf, self->b.ids, self->b.n_ids * sizeof(uint64_t));
        if (self->lists) memcpy(v[3].buf, self->b.bag_off, (k * self->n_sparse + 1) * sizeof(uint32_t));
    }
    Py_END_ALLOW_THREADS
    ret = rc ? gr_py_raise(rc) : PyLong_FromSize_t(self->b.n);
out:
    for (int i = 0; i < held; i++) PyBuffer_Release(&v[i]);
    return ret;
}

/* The schema's columns: [(name, type, pooling or None), ...] for the sparse ones in slot order
 * (type "categorical" or "list"), or the dense ones in feature order. */
static PyObject *columns_of(gr_py_reader *self, int sparse)
{
    const gr_schema *sc = self->schema ? self->schema : gr_schema_criteo();
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (uint32_t i = 0; i < gr_schema_n_columns(sc); i++) {
        const gr_schema_column *c = gr_schema_column_at(sc, i);
        int is_sparse = c->type == GR_COL_CATEGORICAL || c->type == GR_COL_LIST;
        if ((sparse && !is_sparse) || (!sparse && c->type != GR_COL_DENSE)) continue;
        PyObject *item;
        if (!sparse)
            item = PyUnicode_FromString(c->name);
        else if (c->type == GR_COL_LIST)
            item = Py_BuildValue("(sss)", c->name, "list", c->pooling == GR_POOL_MEAN ? "mean" : "sum");
        else
            item = Py_BuildValue("(ssO)", c->name, "categorical", Py_None);
        if (!item || PyList_Append(list, item)) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static PyObject *reader_sparse_columns(PyObject *o, void *c)
{
    (void)c;
    return columns_of((gr_py_reader *)o, 1);
}
static PyObject *reader_dense_columns(PyObject *o, void *c)
{
    (void)c;
    return columns_of((gr_py_reader *)o, 0);
}
static PyObject *reader_n_dense(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(((gr_py_reader *)o)->n_dense);
}
static PyObject *reader_n_sparse(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(((gr_py_reader *)o)->n_sparse);
}
static PyObject *reader_max_ids(PyObject *o, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(((gr_py_reader *)o)->max_ids);
}
static PyObject *reader_has_lists(PyObject *o, void *c)
{
    (void)c;
    return PyBool_FromLong(((gr_py_reader *)o)->lists);
}
static PyObject *reader_is_criteo(PyObject *o, void *c)
{
    (void)c;
    gr_py_reader *self = (gr_py_reader *)o;
    return PyBool_FromLong(!self->schema || gr_schema_is_criteo(self->schema));
}

static PyGetSetDef reader_getset[] = {
    {"n_dense", reader_n_dense, NULL, "dense features per example", NULL},
    {"n_sparse", reader_n_sparse, NULL, "sparse columns (categorical and list) per example", NULL},
    {"max_ids", reader_max_ids, NULL, "the most ids one example can give", NULL},
    {"has_lists", reader_has_lists, NULL, "some column is a list (next() needs bag_off)", NULL},
    {"is_criteo", reader_is_criteo, NULL, "the schema is the built-in Criteo layout", NULL},
    {"sparse_columns", reader_sparse_columns, NULL,
     "[(name, 'categorical' | 'list', pooling or None), ...] in slot order", NULL},
    {"dense_columns", reader_dense_columns, NULL, "the dense columns' names in order", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *reader_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    gr_py_reader *self = (gr_py_reader *)o;
    gr_criteo_close(self->r);
    self->r = NULL;
    gr_batch_fini(&self->b);
    memset(&self->b, 0, sizeof self->b);
    gr_schema_destroy(self->schema); /* after the reader, which used it */
    self->schema = NULL;
    Py_RETURN_NONE;
}

static void reader_dealloc(PyObject *o)
{
    Py_XDECREF(reader_close(o, NULL));
    Py_TYPE(o)->tp_free(o);
}

static PyMethodDef reader_methods[] = {
    {"next", reader_next, METH_VARARGS,
     "next(labels, dense, ids, bag_off=None) -> n examples copied in (0 at the end)"},
    {"close", reader_close, METH_NOARGS, "Stops the parser threads."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject gr_py_reader_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "granary._granary.CriteoReader",
    .tp_basicsize = sizeof(gr_py_reader),
    .tp_dealloc = reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CriteoReader(path, batch, threads=0, start=0, end=0, schema=None): granary's "
              "data reader (`granary train`'s parser and feature ids), batches in file order; "
              "schema: 'criteo' (the default), a schema file's path or its JSON text "
              "(docs/data.md).",
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
    .tp_init = reader_init,
    .tp_new = PyType_GenericNew,
};

/* ---- functions ------------------------------------------------------------------------------ */

/* dedup(keys, uniq_out, inverse_out) -> number of unique keys (first-seen order). */
static PyObject *py_dedup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ko, *uo, *io;
    if (!PyArg_ParseTuple(args, "OOO", &ko, &uo, &io)) return NULL;
    Py_buffer kv, uv, iv;
    size_t n, nu, ni;
    if (gr_py_buffer(ko, GR_PY_U64, 0, "keys", &kv, &n)) return NULL;
    if (gr_py_buffer(uo, GR_PY_U64, 1, "uniq_out", &uv, &nu)) {
        PyBuffer_Release(&kv);
        return NULL;
    }
    if (gr_py_buffer(io, GR_PY_U32, 1, "inverse_out", &iv, &ni)) {
        PyBuffer_Release(&kv);
        PyBuffer_Release(&uv);
        return NULL;
    }
    PyObject *ret = NULL;
    if (nu < n || ni < n) {
        PyErr_Format(PyExc_ValueError, "dedup of %zu keys needs uniq_out and inverse_out of %zu "
                     "entries (got %zu and %zu)", n, n, nu, ni);
    } else {
        long u;
        Py_BEGIN_ALLOW_THREADS
        u = gr_dedup(kv.buf, n, uv.buf, iv.buf, NULL);
        Py_END_ALLOW_THREADS
        ret = u < 0 ? gr_py_raise((int)u) : PyLong_FromLong(u);
    }
    PyBuffer_Release(&kv);
    PyBuffer_Release(&uv);
    PyBuffer_Release(&iv);
    return ret;
}

/* Builds a DLRM model from (dim, "bottom", "top", seed). */
static int dlrm_model(unsigned dim, const char *bottom, const char *top,
                      unsigned long long seed, unsigned n_dense, unsigned n_sparse, gr_model **m)
{
    gr_model_config cfg;
    gr_model_config_default(&cfg, GR_MODEL_DLRM);
    cfg.dim = dim;
    cfg.seed = seed;
    cfg.n_dense = n_dense; /* 0 and 0: Criteo's 13 and 26 */
    cfg.n_sparse = n_sparse;
    int rc = gr_model_parse_layers(bottom, cfg.bottom, &cfg.n_bottom);
    if (!rc) rc = gr_model_parse_layers(top, cfg.top, &cfg.n_top);
    if (!rc) rc = gr_model_create(&cfg, m);
    return rc;
}

/* dlrm_dense(dim, bottom, top, seed, out=None, n_dense=0, n_sparse=0) -> (size, layout): the C
 * trainer's initial dense parameters (written to out when given, float32 of exactly size
 * entries) and their layout ("bottom0.w 64x13 @0, ..."); n_dense/n_sparse 0: Criteo's. */
static PyObject *py_dlrm_dense(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"dim", "bottom", "top", "seed", "out", "n_dense", "n_sparse", NULL};
    unsigned dim, n_dense = 0, n_sparse = 0;
    const char *bottom, *top;
    unsigned long long seed;
    PyObject *out = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IssK|OII", kwlist, &dim, &bottom, &top, &seed,
                                     &out, &n_dense, &n_sparse))
        return NULL;
    if (!n_dense != !n_sparse)
        return PyErr_Format(PyExc_ValueError, "dlrm_dense: give both n_dense and n_sparse (or "
                            "neither, for Criteo's), got %u and %u", n_dense, n_sparse);
    gr_model *m = NULL;
    int rc = dlrm_model(dim, bottom, top, seed, n_dense, n_sparse, &m);
    if (rc) return gr_py_raise(rc);
    size_t size = gr_model_dense_size(m);
    PyObject *ret = NULL;
    if (out != Py_None) {
        Py_buffer v;
        size_t n;
        if (gr_py_buffer(out, GR_PY_F32, 1, "out", &v, &n)) goto done;
        if (n != size) {
            PyErr_Format(PyExc_ValueError, "out has %zu floats; this DLRM has %zu", n, size);
            PyBuffer_Release(&v);
            goto done;
        }
        gr_model_init_dense(m, v.buf);
        PyBuffer_Release(&v);
    }
    size_t cap = 4096;
    char *layout = malloc(cap);
    if (!layout) {
        PyErr_NoMemory();
        goto done;
    }
    gr_model_describe(m, layout, cap);
    ret = Py_BuildValue("(ns)", (Py_ssize_t)size, layout);
    free(layout);
done:
    gr_model_destroy(m);
    return ret;
}

/* dlrm_table_spec(dim, seed) -> JSON: the embedding table `granary train --model dlrm --dim D
 * --seed S` creates (its defaults, no flags changing the optimizer). */
static PyObject *py_dlrm_table_spec(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned dim;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "IK", &dim, &seed)) return NULL;
    gr_train_opts o;
    gr_train_opts_default(&o, GR_MODEL_DLRM);
    o.emb.dim = dim;
    o.emb.seed = seed ^ 0x656d62; /* as src/cli/train.c derives it from --seed */
    int rc = gr_table_spec_validate(&o.emb);
    if (rc) return gr_py_raise(rc);
    char *json = gr_table_spec_to_json(&o.emb);
    if (!json) return PyErr_NoMemory();
    PyObject *s = PyUnicode_FromString(json);
    free(json);
    return s;
}

/* auc(scores, labels) -> exact ROC AUC (NaN with one class). */
static PyObject *py_auc(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *so, *lo;
    if (!PyArg_ParseTuple(args, "OO", &so, &lo)) return NULL;
    Py_buffer sv, lv;
    size_t ns, nl;
    if (gr_py_buffer(so, GR_PY_F32, 0, "scores", &sv, &ns)) return NULL;
    if (gr_py_buffer(lo, GR_PY_F32, 0, "labels", &lv, &nl)) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    PyObject *ret = NULL;
    if (ns != nl) {
        PyErr_Format(PyExc_ValueError, "%zu scores but %zu labels", ns, nl);
    } else {
        double a = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = gr_auc(sv.buf, lv.buf, ns, &a);
        Py_END_ALLOW_THREADS
        ret = rc ? gr_py_raise(rc) : PyFloat_FromDouble(a);
    }
    PyBuffer_Release(&sv);
    PyBuffer_Release(&lv);
    return ret;
}

static PyObject *py_criteo_feature_id(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned slot;
    unsigned long value;
    if (!PyArg_ParseTuple(args, "Ik", &slot, &value)) return NULL;
    if (slot >= GR_CRITEO_SPARSE)
        return PyErr_Format(PyExc_ValueError, "slot %u: want 0..%d", slot, GR_CRITEO_SPARSE - 1);
    return PyLong_FromUnsignedLongLong(gr_criteo_feature_id(slot, (uint32_t)value));
}

static PyObject *py_datagen(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"dir", "train_rows", "test_rows", "seed", NULL};
    const char *dir;
    unsigned long long train = 0, test = 0, seed = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKK|K", kwlist, &dir, &train, &test, &seed))
        return NULL;
    gr_datagen_opts o = {.train_rows = train, .test_rows = test, .seed = seed, .threads = 0};
    gr_datagen_result r;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_datagen_run(dir, &o, &r);
    Py_END_ALLOW_THREADS
    if (rc) return gr_py_raise(rc);
    return Py_BuildValue("{s:K,s:K,s:d,s:d}", "train_rows", r.train_rows, "test_rows",
                         r.test_rows, "teacher_auc", r.teacher_auc, "seconds", r.seconds);
}

/* Checks the sizes of an interaction's buffers: bot n*d, emb n*ns*d, z n*(d + pairs). */
static int interact_sizes(size_t nb, size_t ne, size_t nz, unsigned long long n, unsigned d,
                          unsigned ns, const char *zname)
{
    size_t nvec = (size_t)ns + 1, top_in = d + nvec * (nvec - 1) / 2;
    if (nb != n * d || ne != n * ns * d || nz != n * top_in) {
        PyErr_Format(PyExc_ValueError, "interaction of %llu examples, dim %u, %u slots: want bot "
                     "%llu, emb %llu and %s %llu floats, got %zu, %zu and %zu", n, d, ns,
                     n * d, n * ns * d, zname, (unsigned long long)(n * top_in), nb, ne, nz);
        return -1;
    }
    return 0;
}

/* dlrm_interact(bot, emb, z, n, d, ns): the trainer's DLRM interaction forward (train.h,
 * gr_dlrm_interact_forward) on float32 C-contiguous buffers, z written; the GIL released. */
static PyObject *py_dlrm_interact(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *bo, *eo, *zo;
    unsigned long long n;
    unsigned d, ns;
    if (!PyArg_ParseTuple(args, "OOOKII", &bo, &eo, &zo, &n, &d, &ns)) return NULL;
    Py_buffer v[3];
    size_t k[3];
    int got = 0;
    PyObject *ret = NULL;
    if (gr_py_buffer(bo, GR_PY_F32, 0, "bot", &v[0], &k[0])) goto out;
    got++;
    if (gr_py_buffer(eo, GR_PY_F32, 0, "emb", &v[1], &k[1])) goto out;
    got++;
    if (gr_py_buffer(zo, GR_PY_F32, 1, "z", &v[2], &k[2])) goto out;
    got++;
    if (interact_sizes(k[0], k[1], k[2], n, d, ns, "z")) goto out;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_dlrm_interact_forward(v[0].buf, v[1].buf, (size_t)n, d, ns, v[2].buf);
    Py_END_ALLOW_THREADS
    ret = rc ? gr_py_raise(rc) : (Py_INCREF(Py_None), Py_None);
out:
    while (got > 0) PyBuffer_Release(&v[--got]);
    return ret;
}

/* dlrm_interact_backward(dz, bot, emb, dbot, gemb, n, d, ns): its backward (dbot and gemb
 * written). */
static PyObject *py_dlrm_interact_backward(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o[5];
    unsigned long long n;
    unsigned d, ns;
    if (!PyArg_ParseTuple(args, "OOOOOKII", &o[0], &o[1], &o[2], &o[3], &o[4], &n, &d, &ns))
        return NULL;
    static const char *const names[5] = {"dz", "bot", "emb", "dbot", "gemb"};
    Py_buffer v[5];
    size_t k[5];
    int got = 0;
    PyObject *ret = NULL;
    for (; got < 5; got++)
        if (gr_py_buffer(o[got], GR_PY_F32, got >= 3, names[got], &v[got], &k[got])) goto out;
    if (interact_sizes(k[1], k[2], k[0], n, d, ns, "dz")) goto out;
    if (k[3] != k[1] || k[4] != k[2]) {
        PyErr_Format(PyExc_ValueError, "dbot and gemb must have bot's and emb's sizes (%zu and "
                     "%zu floats), got %zu and %zu", k[1], k[2], k[3], k[4]);
        goto out;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_dlrm_interact_backward(v[0].buf, v[1].buf, v[2].buf, (size_t)n, d, ns, v[3].buf,
                                   v[4].buf);
    Py_END_ALLOW_THREADS
    ret = rc ? gr_py_raise(rc) : (Py_INCREF(Py_None), Py_None);
out:
    while (got > 0) PyBuffer_Release(&v[--got]);
    return ret;
}

PyMethodDef gr_py_util_methods[] = {
    {"dlrm_interact", py_dlrm_interact, METH_VARARGS,
     "dlrm_interact(bot, emb, z, n, d, ns): the trainer's DLRM interaction, z = [bot, dots]"},
    {"dlrm_interact_backward", py_dlrm_interact_backward, METH_VARARGS,
     "dlrm_interact_backward(dz, bot, emb, dbot, gemb, n, d, ns): its backward"},
    {"dedup", py_dedup, METH_VARARGS, "dedup(keys, uniq_out, inverse_out) -> unique count"},
    {"dlrm_dense", (PyCFunction)(void (*)(void))py_dlrm_dense, METH_VARARGS | METH_KEYWORDS,
     "dlrm_dense(dim, bottom, top, seed, out=None, n_dense=0, n_sparse=0) -> (size, layout)"},
    {"dlrm_table_spec", py_dlrm_table_spec, METH_VARARGS, "dlrm_table_spec(dim, seed) -> JSON"},
    {"auc", py_auc, METH_VARARGS, "auc(scores, labels) -> exact ROC AUC"},
    {"criteo_feature_id", py_criteo_feature_id, METH_VARARGS,
     "criteo_feature_id(slot, value) -> the uint64 id granary gives a categorical value"},
    {"datagen", (PyCFunction)(void (*)(void))py_datagen, METH_VARARGS | METH_KEYWORDS,
     "datagen(dir, train_rows, test_rows, seed=1) -> dict: granary's generated Criteo data"},
    {NULL, NULL, 0, NULL},
};
