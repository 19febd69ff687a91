/* granary._granary.LocalCluster: an embedded cluster of S shards in this process (gr_server
 * threads on free loopback ports), for examples and tests that need no deployed servers. */
#include "ext.h"

#include "granary/cluster.h"

typedef struct {
    PyObject_HEAD
    gr_local_cluster *c;
} gr_py_cluster;

static int cluster_init(PyObject *o, PyObject *args, PyObject *kw)
{
    gr_py_cluster *self = (gr_py_cluster *)o;
    static char *kwlist[] = {"shards", "threads", NULL};
    unsigned shards = 2, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|II", kwlist, &shards, &threads)) return -1;
    if (self->c) {
        PyErr_SetString(PyExc_ValueError, "LocalCluster.__init__ called twice");
        return -1;
    }
    if (shards < 1 || shards > 256) {
        PyErr_Format(PyExc_ValueError, "shards must be 1..256, got %u", shards);
        return -1;
    }
    int rc;
    gr_local_cluster *c = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_local_cluster_start(shards, threads, &c);
    Py_END_ALLOW_THREADS
    if (rc) {
        gr_py_raise(rc);
        return -1;
    }
    self->c = c;
    return 0;
}

static void cluster_stop_now(gr_py_cluster *self)
{
    gr_local_cluster *c = self->c;
    self->c = NULL;
    if (!c) return;
    Py_BEGIN_ALLOW_THREADS
    gr_local_cluster_stop(c);
    Py_END_ALLOW_THREADS
}

static PyObject *cluster_stop(PyObject *o, PyObject *unused)
{
    (void)unused;
    cluster_stop_now((gr_py_cluster *)o);
    Py_RETURN_NONE;
}

static PyObject *cluster_servers(PyObject *o, void *closure)
{
    (void)closure;
    gr_py_cluster *self = (gr_py_cluster *)o;
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "the local cluster is stopped");
        return NULL;
    }
    return PyUnicode_FromString(gr_local_cluster_servers(self->c));
}

/* The same shards over abstract AF_UNIX sockets ("unix:@NAME,..."): for worker processes on
 * this machine, which then skip the TCP stack (docs/python.md, session 7). */
static PyObject *cluster_local_servers(PyObject *o, void *closure)
{
    (void)closure;
    gr_py_cluster *self = (gr_py_cluster *)o;
    if (!self->c) {
        PyErr_SetString(PyExc_ValueError, "the local cluster is stopped");
        return NULL;
    }
    return PyUnicode_FromString(gr_local_cluster_local_servers(self->c));
}

static void cluster_dealloc(PyObject *o)
{
    cluster_stop_now((gr_py_cluster *)o);
    Py_TYPE(o)->tp_free(o);
}

static PyMethodDef cluster_methods[] = {
    {"stop", cluster_stop, METH_NOARGS, "Stops every shard (gracefully); idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cluster_getset[] = {
    {"servers", cluster_servers, NULL, "'127.0.0.1:PORT,...' in shard order", NULL},
    {"local_servers", cluster_local_servers, NULL,
     "'unix:@NAME,...' in shard order: the same shards over AF_UNIX, for this machine", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject gr_py_cluster_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "granary._granary.LocalCluster",
    .tp_basicsize = sizeof(gr_py_cluster),
    .tp_dealloc = cluster_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LocalCluster(shards=2, threads=0): shards in this process on loopback.",
    .tp_methods = cluster_methods,
    .tp_getset = cluster_getset,
    .tp_init = cluster_init,
    .tp_new = PyType_GenericNew,
};
