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

/* The coordinator behind Client(coord=...) (coord.c). */
typedef struct gr_py_coord gr_py_coord;
/* Opens the coordinator spec, waits (base->connect_timeout_ms) for a layout whose shards all
 * have addresses, and creates a client over them (base's other settings) that stamps the
 * layout's epoch and re-reads the layout when a shard refuses a request as stale. */
int gr_py_coord_connect(const char *spec, const gr_client_config *base, gr_py_coord **pc,
                        gr_client **c);
/* Re-reads the layout (waiting up to timeout_ms for every shard to have an address), points
 * the connections of moved shards at their new addresses (*moved counts them) and takes the
 * layout's epoch. Nothing may be in flight on c. */
int gr_py_coord_refresh(gr_py_coord *pc, gr_client *c, uint32_t timeout_ms, uint32_t *moved);
/* Leaves the coordinator (after the client it served was destroyed). NULL is a no-op. */
void gr_py_coord_close(gr_py_coord *pc);

/* granary._granary.Client. The gr_client is destroyed by close() when nothing is in flight
 * (no call running with the GIL released, no unfinished Op), else when the last of those ends. */
typedef struct {
    PyObject_HEAD
    gr_client *c;  /* NULL once destroyed */
    int closed;    /* close() was called: new calls raise */
    long inflight; /* calls running without the GIL plus unfinished Ops (under the GIL) */
    gr_py_coord *coord;       /* coord=: the layout's source, closed after c is destroyed */
    unsigned int connect_ms; /* coord=: how long refresh() waits for a served layout */
} gr_py_client;

/* An Op finished or was freed: drops its count and destroys a closed client when idle. */
void gr_py_client_op_done(gr_py_client *self);

/* Module parts: each adds its types/functions to the module. */
extern PyTypeObject gr_py_client_type;
extern PyTypeObject gr_py_op_type;
extern PyTypeObject gr_py_cluster_type;
extern PyTypeObject gr_py_reader_type;
extern PyMethodDef gr_py_util_methods[];
extern PyMethodDef gr_py_grad_methods[];

/* An op that holds the buffers it writes into until it finishes (op.c). Takes ownership of
 * the views (released when the op finishes or is freed) and a reference to the client. */
PyObject *gr_py_op_new(PyObject *client, gr_client_op *op, Py_buffer *views, int nviews);

#endif
