/* granary._granary helpers that tie the PyTorch path to the C trainer: the Criteo reader
 * (the same parser and feature ids as `granary train`), dedup, the DLRM dense initializer and
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
} gr_py_reader;

static int reader_init(PyObject *o, PyObject *args, PyObject *kw)
{
    gr_py_reader *self = (gr_py_reader *)o;
    static char *kwlist[] = {"path", "batch", "threads", "start", "end", NULL};
    const char *path;
    Py_ssize_t batch;
    unsigned threads = 0;
    unsigned long long start = 0, end = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sn|IKK", kwlist, &path, &batch, &threads, &start,
                                     &end))
        return -1;
    if (self->r) {
        PyErr_SetString(PyExc_ValueError, "CriteoReader.__init__ called twice");
        return -1;
    }
    if (batch < 1 || batch > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "batch must be 1..1048576, got %zd", batch);
        return -1;
    }
    gr_criteo_opts opt;
    gr_criteo_opts_default(&opt);
    opt.batch = (size_t)batch;
    opt.threads = threads;
    opt.start = start;
    opt.end = end;
    int rc = gr_batch_init(&self->b, (size_t)batch);
    if (rc) {
        gr_py_raise(rc);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = gr_criteo_open(path, &opt, &self->r);
    Py_END_ALLOW_THREADS
    if (rc) {
        gr_batch_fini(&self->b);
        memset(&self->b, 0, sizeof self->b);
        gr_py_raise(rc);
        return -1;
    }
    self->batch = (size_t)batch;
    return 0;
}

/* next(labels, dense, ids) -> n: the next batch copied into float32 labels[batch], float32
 * dense[batch*13] and uint64/int64 ids[batch*26]; 0 at the end of the data. */
static PyObject *reader_next(PyObject *o, PyObject *args)
{
    gr_py_reader *self = (gr_py_reader *)o;
    PyObject *lo, *dobj, *io;
    if (!PyArg_ParseTuple(args, "OOO", &lo, &dobj, &io)) return NULL;
    if (!self->r) {
        PyErr_SetString(PyExc_ValueError, "the reader is closed");
        return NULL;
    }
    Py_buffer lv, dv, iv;
    size_t nl, nd, ni;
    if (gr_py_buffer(lo, GR_PY_F32, 1, "labels", &lv, &nl)) return NULL;
    if (gr_py_buffer(dobj, GR_PY_F32, 1, "dense", &dv, &nd)) {
        PyBuffer_Release(&lv);
        return NULL;
    }
    if (gr_py_buffer(io, GR_PY_U64, 1, "ids", &iv, &ni)) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&dv);
        return NULL;
    }
    PyObject *ret = NULL;
    if (nl < self->batch || nd < self->batch * GR_CRITEO_DENSE ||
        ni < self->batch * GR_CRITEO_SPARSE) {
        PyErr_Format(PyExc_ValueError,
                     "buffers too small for a batch of %zu: labels %zu, dense %zu, ids %zu "
                     "(want %zu, %zu, %zu)",
                     self->batch, nl, nd, ni, self->batch, self->batch * GR_CRITEO_DENSE,
                     self->batch * GR_CRITEO_SPARSE);
        goto out;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_criteo_next(self->r, &self->b);
    if (!rc) {
        size_t n = self->b.n;
        memcpy(lv.buf, self->b.labels, n * sizeof(float));
        memcpy(dv.buf, self->b.dense, n * GR_CRITEO_DENSE * sizeof(float));
        memcpy(iv.buf, self->b.ids, n * GR_CRITEO_SPARSE * sizeof(uint64_t));
    }
    Py_END_ALLOW_THREADS
    ret = rc ? gr_py_raise(rc) : PyLong_FromSize_t(self->b.n);
out:
    PyBuffer_Release(&lv);
    PyBuffer_Release(&dv);
    PyBuffer_Release(&iv);
    return ret;
}

static PyObject *reader_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    gr_py_reader *self = (gr_py_reader *)o;
    gr_criteo_close(self->r);
    self->r = NULL;
    gr_batch_fini(&self->b);
    memset(&self->b, 0, sizeof self->b);
    Py_RETURN_NONE;
}

static void reader_dealloc(PyObject *o)
{
    Py_XDECREF(reader_close(o, NULL));
    Py_TYPE(o)->tp_free(o);
}

static PyMethodDef reader_methods[] = {
    {"next", reader_next, METH_VARARGS,
     "next(labels, dense, ids) -> n examples copied in (0 at the end)"},
    {"close", reader_close, METH_NOARGS, "Stops the parser threads."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject gr_py_reader_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "granary._granary.CriteoReader",
    .tp_basicsize = sizeof(gr_py_reader),
    .tp_dealloc = reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CriteoReader(path, batch, threads=0, start=0, end=0): granary's Criteo TSV "
              "reader (log(1+x) dense features, salted uint64 ids), batches in file order.",
    .tp_methods = reader_methods,
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
                      unsigned long long seed, gr_model **m)
{
    gr_model_config cfg;
    gr_model_config_default(&cfg, GR_MODEL_DLRM);
    cfg.dim = dim;
    cfg.seed = seed;
    int rc = gr_model_parse_layers(bottom, cfg.bottom, &cfg.n_bottom);
    if (!rc) rc = gr_model_parse_layers(top, cfg.top, &cfg.n_top);
    if (!rc) rc = gr_model_create(&cfg, m);
    return rc;
}

/* dlrm_dense(dim, bottom, top, seed, out=None) -> (size, layout): the C trainer's initial
 * dense parameters (written to out when given, float32 of exactly size entries) and their
 * layout ("bottom0.w 64x13 @0, ..."). */
static PyObject *py_dlrm_dense(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"dim", "bottom", "top", "seed", "out", NULL};
    unsigned dim;
    const char *bottom, *top;
    unsigned long long seed;
    PyObject *out = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IssK|O", kwlist, &dim, &bottom, &top, &seed,
                                     &out))
        return NULL;
    gr_model *m = NULL;
    int rc = dlrm_model(dim, bottom, top, seed, &m);
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

PyMethodDef gr_py_util_methods[] = {
    {"dedup", py_dedup, METH_VARARGS, "dedup(keys, uniq_out, inverse_out) -> unique count"},
    {"dlrm_dense", (PyCFunction)(void (*)(void))py_dlrm_dense, METH_VARARGS | METH_KEYWORDS,
     "dlrm_dense(dim, bottom, top, seed, out=None) -> (size, layout)"},
    {"dlrm_table_spec", py_dlrm_table_spec, METH_VARARGS, "dlrm_table_spec(dim, seed) -> JSON"},
    {"auc", py_auc, METH_VARARGS, "auc(scores, labels) -> exact ROC AUC"},
    {"criteo_feature_id", py_criteo_feature_id, METH_VARARGS,
     "criteo_feature_id(slot, value) -> the uint64 id granary gives a categorical value"},
    {"datagen", (PyCFunction)(void (*)(void))py_datagen, METH_VARARGS | METH_KEYWORDS,
     "datagen(dir, train_rows, test_rows, seed=1) -> dict: granary's generated Criteo data"},
    {NULL, NULL, 0, NULL},
};
