/* granary's CPython extension (module granary._granary): the pieces its files share. The
 * extension is a thin layer over libgranary's public C API; every call that waits on the
 * network or on the CPU for long releases the GIL. Arrays come in through the buffer protocol
 * (numpy arrays, torch tensors' .numpy() views, bytearrays), so rows are written straight into
 * the caller's memory without a copy. */
#ifndef GRANARY_PY_EXT_H
#define GRANARY_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "granary/client.h"
#include "granary/core.h"

/* granary.GranaryError: .code (the negative gr_err), .name ("GR_EDIM") and the message. */
extern PyObject *gr_py_error;

/* Raises GranaryError for rc with granary's thread-local message; returns NULL. */
PyObject *gr_py_raise(int rc);

/* What an array argument must be. */
typedef enum { GR_PY_U64, GR_PY_F32, GR_PY_U32 } gr_py_kind;

/* Gets a C-contiguous buffer of 8-byte integers (U64: int64 or uint64), 4-byte floats (F32)
 * or 4-byte unsigned/signed integers (U32) from obj, writable if asked. On failure raises
 * TypeError/ValueError naming `what` and returns -1 (no buffer is held). *n gets the number
 * of elements. */
int gr_py_buffer(PyObject *obj, gr_py_kind kind, int writable, const char *what, Py_buffer *view,
                 size_t *n);

/* granary._granary.Client. The gr_client is destroyed by close() when nothing is in flight
 * (no call running with the GIL released, no unfinished Op), else when the last of those ends. */
typedef struct {
    PyObject_HEAD
    gr_client *c;  /* NULL once destroyed */
    int closed;    /* close() was called: new calls raise */
    long inflight; /* calls running without the GIL plus unfinished Ops (under the GIL) */
} gr_py_client;

/* An Op finished or was freed: drops its count and destroys a closed client when idle. */
void gr_py_client_op_done(gr_py_client *self);

/* Module parts: each adds its types/functions to the module. */
extern PyTypeObject gr_py_client_type;
extern PyTypeObject gr_py_op_type;
extern PyTypeObject gr_py_cluster_type;
extern PyTypeObject gr_py_reader_type;
extern PyMethodDef gr_py_util_methods[];

/* An op that holds the buffers it writes into until it finishes (op.c). Takes ownership of
 * the views (released when the op finishes or is freed) and a reference to the client. */
PyObject *gr_py_op_new(PyObject *client, gr_client_op *op, Py_buffer *views, int nviews);

#endif
