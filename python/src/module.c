/* granary._granary: module init, the GranaryError exception and the buffer checks every call
 * shares. The types live in client.c (Client), op.c (Op), cluster.c (LocalCluster) and
 * util.c (Criteo reader, dedup, DLRM dense initializer, AUC). */
#include "ext.h"

#include <string.h>

PyObject *gr_py_error;

static const char *err_name(int rc)
{
    switch (rc) {
#define GR_PY_ERR_NAME(name, value, text) \
    case value: return #name;
        GR_ERRORS(GR_PY_ERR_NAME)
#undef GR_PY_ERR_NAME
    default: return "GR_E?";
    }
}

PyObject *gr_py_raise(int rc)
{
    const char *msg = gr_errmsg();
    if (!msg || !*msg) msg = gr_strerror(rc);
    PyObject *args = Py_BuildValue("(s)", msg);
    if (!args) return NULL;
    PyObject *exc = PyObject_Call(gr_py_error, args, NULL);
    Py_DECREF(args);
    if (!exc) return NULL;
    PyObject *code = PyLong_FromLong(rc), *name = PyUnicode_FromString(err_name(rc));
    if (code && name) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "name", name);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    PyErr_SetObject(gr_py_error, exc);
    Py_DECREF(exc);
    return NULL;
}

/* Buffer format characters of each kind (native byte order; '=' and '<' prefixes allowed on
 * this little-endian build). */
static int format_ok(const char *fmt, gr_py_kind kind, Py_ssize_t itemsize)
{
    if (!fmt) fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++;
    if (strlen(fmt) != 1) return 0;
    switch (kind) {
    case GR_PY_U64: return itemsize == 8 && strchr("qQlLn", *fmt) != NULL;
    case GR_PY_U32: return itemsize == 4 && strchr("iIlL", *fmt) != NULL;
    case GR_PY_F32: return itemsize == 4 && *fmt == 'f';
    }
    return 0;
}

static const char *kind_name(gr_py_kind kind)
{
    switch (kind) {
    case GR_PY_U64: return "int64 or uint64";
    case GR_PY_U32: return "int32 or uint32";
    case GR_PY_F32: return "float32";
    }
    return "?";
}

int gr_py_buffer(PyObject *obj, gr_py_kind kind, int writable, const char *what, Py_buffer *view,
                 size_t *n)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s: want a C-contiguous%s %s array (numpy array or tensor.numpy()), got %s",
                     what, writable ? " writable" : "", kind_name(kind), Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!format_ok(view->format, kind, view->itemsize)) {
        PyErr_Format(PyExc_TypeError, "%s: want %s elements, got format '%s' (%zd bytes each)",
                     what, kind_name(kind), view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *n = (size_t)(view->len / view->itemsize);
    return 0;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_granary",
    "granary's C client, local cluster and training helpers (see docs/python.md).", -1,
    gr_py_util_methods, NULL, NULL, NULL, NULL,
};

static int add_type(PyObject *m, PyTypeObject *t, const char *name)
{
    if (PyType_Ready(t) < 0) return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__granary(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    gr_py_error = PyErr_NewExceptionWithDoc(
        "granary.GranaryError",
        "An error from granary: .code is the negative gr_err, .name its name (e.g. "
        "'GR_EDIM'), str() granary's message.",
        PyExc_RuntimeError, NULL);
    if (!gr_py_error) goto fail;
    Py_INCREF(gr_py_error);
    if (PyModule_AddObject(m, "GranaryError", gr_py_error) < 0) goto fail;
    if (PyModule_AddFunctions(m, gr_py_grad_methods) < 0) goto fail;
    if (add_type(m, &gr_py_client_type, "Client") || add_type(m, &gr_py_op_type, "Op") ||
        add_type(m, &gr_py_cluster_type, "LocalCluster") ||
        add_type(m, &gr_py_reader_type, "CriteoReader"))
        goto fail;
    PyModule_AddIntConstant(m, "SYNC_ASYNC", GR_CLIENT_SYNC_ASYNC);
    PyModule_AddIntConstant(m, "SYNC_SYNC", GR_CLIENT_SYNC_SYNC);
    PyModule_AddIntConstant(m, "SYNC_SEMISYNC", GR_CLIENT_SYNC_SEMISYNC);
    PyModule_AddIntConstant(m, "SYNC_SSP", GR_CLIENT_SYNC_SSP);
    PyModule_AddIntConstant(m, "PUSH_APPLIED", GR_CLIENT_PUSH_APPLIED);
    PyModule_AddIntConstant(m, "PUSH_STAGED", GR_CLIENT_PUSH_STAGED);
    PyModule_AddIntConstant(m, "PUSH_DROPPED", GR_CLIENT_PUSH_DROPPED);
    PyModule_AddIntConstant(m, "PUSH_DUPLICATE", GR_CLIENT_PUSH_DUPLICATE);
    PyModule_AddStringConstant(m, "VERSION", GR_VERSION_STRING);
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
