/* granary._granary.Op: a started pull or push. It owns the buffers the C client writes into
 * (rows of a pull) until the operation finishes, so Python cannot free them under the
 * client's reader threads; wait() releases the GIL. An Op dropped unfinished is waited for
 * in its destructor for the same reason. */
#include "ext.h"

typedef struct {
    PyObject_HEAD
    PyObject *client; /* keeps the gr_client alive while the op is in flight */
    gr_client_op *op; /* NULL once finished */
    Py_buffer *views; /* malloc'd, nviews entries */
    int nviews;
} gr_py_op;

static void release_views(gr_py_op *self)
{
    for (int i = 0; i < self->nviews; i++) PyBuffer_Release(&self->views[i]);
    self->nviews = 0;
    PyMem_Free(self->views);
    self->views = NULL;
}

PyObject *gr_py_op_new(PyObject *client, gr_client_op *op, Py_buffer *views, int nviews)
{
    gr_py_op *self = PyObject_New(gr_py_op, &gr_py_op_type);
    Py_buffer *copy = nviews ? PyMem_Malloc((size_t)nviews * sizeof *copy) : NULL;
    if (!self || (nviews && !copy)) {
        if (self) {
            self->client = NULL;
            self->op = NULL;
            self->views = NULL;
            self->nviews = 0;
            Py_DECREF(self);
        }
        PyMem_Free(copy);
        if (nviews && !copy) PyErr_NoMemory();
        /* Nowhere to hold the buffers: finish the op here before they are released. */
        Py_BEGIN_ALLOW_THREADS
        gr_client_wait(op, -1);
        Py_END_ALLOW_THREADS
        for (int i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
        return NULL;
    }
    Py_INCREF(client);
    self->client = client;
    ((gr_py_client *)client)->inflight++;
    self->op = op;
    self->views = copy;
    self->nviews = nviews;
    for (int i = 0; i < nviews; i++) self->views[i] = views[i];
    return (PyObject *)self;
}

static PyObject *op_wait(gr_py_op *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    int timeout_ms = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", kwlist, &timeout_ms)) return NULL;
    if (!self->op) Py_RETURN_TRUE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = gr_client_wait(self->op, timeout_ms);
    Py_END_ALLOW_THREADS
    if (rc == GR_EAGAIN) Py_RETURN_FALSE;
    self->op = NULL;
    release_views(self);
    /* The exception first: destroying a closed client may overwrite granary's message. */
    PyObject *ret = rc ? gr_py_raise(rc) : Py_NewRef(Py_True);
    gr_py_client_op_done((gr_py_client *)self->client);
    return ret;
}

static PyObject *op_done(gr_py_op *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->op == NULL);
}

static void op_dealloc(gr_py_op *self)
{
    if (self->op) {
        Py_BEGIN_ALLOW_THREADS
        gr_client_wait(self->op, -1);
        Py_END_ALLOW_THREADS
        self->op = NULL;
        release_views(self);
        gr_py_client_op_done((gr_py_client *)self->client);
    }
    release_views(self);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static PyMethodDef op_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))op_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=-1) -> bool: True once finished (raises GranaryError if it failed), "
     "False if still running after timeout_ms."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef op_getset[] = {
    {"done", (getter)op_done, NULL, "True once wait() has seen it finish.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject gr_py_op_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "granary._granary.Op",
    .tp_basicsize = sizeof(gr_py_op),
    .tp_dealloc = (destructor)op_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A started pull or push: call wait(). Created by Client.pull_start/push_start.",
    .tp_methods = op_methods,
    .tp_getset = op_getset,
};
