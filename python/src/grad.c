/* The lookup of an embedding without pooling, and its backward, in C for the PyTorch module:
 * gather_rows copies each id's unique row out (forward), segment_sum adds the gradients of
 * every occurrence of a unique id into its row (backward, the sum granary pushes). Both run
 * without the GIL, so the pipeline's loader thread keeps going; torch's embedding backward
 * did the same sum through several dispatched operators (sort, index_add) per step. */
#include "ext.h"

#include <string.h>

/* The shared argument checks: values (n*dim floats), inverse (n int32 indexes < nu), rows (nu*dim
 * floats, writable when `write_rows`). Returns 0 with the views held, or -1 with an error set. */
static int rows_args(PyObject *args, int write_rows, Py_buffer *vals, Py_buffer *inv,
                     Py_buffer *rows, size_t *n, size_t *nu, size_t *dim)
{
    PyObject *vo, *io, *ro;
    Py_ssize_t d;
    if (!PyArg_ParseTuple(args, "OOOn", &vo, &io, &ro, &d)) return -1;
    if (d < 1 || d > 65536) {
        PyErr_Format(PyExc_ValueError, "dim must be 1..65536, got %zd", d);
        return -1;
    }
    size_t nv, nr;
    if (gr_py_buffer(io, GR_PY_U32, 0, "inverse", inv, n)) return -1;
    if (gr_py_buffer(vo, GR_PY_F32, !write_rows, write_rows ? "grads" : "out", vals, &nv)) {
        PyBuffer_Release(inv);
        return -1;
    }
    if (gr_py_buffer(ro, GR_PY_F32, write_rows, write_rows ? "out" : "rows", rows, &nr)) {
        PyBuffer_Release(inv);
        PyBuffer_Release(vals);
        return -1;
    }
    *dim = (size_t)d;
    *nu = nr / *dim;
    const char *vname = write_rows ? "grads" : "out", *rname = write_rows ? "out" : "rows";
    int bad = nv != *n * *dim || nr % *dim;
    if (nv != *n * *dim)
        PyErr_Format(PyExc_ValueError, "%s has %zu floats: want %zu ids x dim %zu", vname, nv, *n,
                     *dim);
    else if (nr % *dim)
        PyErr_Format(PyExc_ValueError, "%s has %zu floats: not whole rows of dim %zu", rname, nr,
                     *dim);
    if (bad) {
        PyBuffer_Release(inv);
        PyBuffer_Release(vals);
        PyBuffer_Release(rows);
        return -1;
    }
    const uint32_t *ix = inv->buf;
    for (size_t i = 0; i < *n; i++)
        if (ix[i] >= *nu) {
            PyErr_Format(PyExc_ValueError, "inverse[%zu] = %u: only %zu rows", i, ix[i], *nu);
            PyBuffer_Release(inv);
            PyBuffer_Release(vals);
            PyBuffer_Release(rows);
            return -1;
        }
    return 0;
}

/* gather_rows(out, inverse, rows, dim): out[i] = rows[inverse[i]]. */
static PyObject *py_gather_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer out, inv, rows;
    size_t n, nu, dim;
    if (rows_args(args, 0, &out, &inv, &rows, &n, &nu, &dim)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *ix = inv.buf;
    const float *r = rows.buf;
    float *o = out.buf;
    for (size_t i = 0; i < n; i++) memcpy(o + i * dim, r + (size_t)ix[i] * dim, dim * sizeof(float));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    PyBuffer_Release(&inv);
    PyBuffer_Release(&rows);
    Py_RETURN_NONE;
}

/* segment_sum(grads, inverse, out, dim): out = 0, then out[inverse[i]] += grads[i] in order of
 * i (the order the C client sums a push's duplicate keys in). */
static PyObject *py_segment_sum(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer grads, inv, out;
    size_t n, nu, dim;
    if (rows_args(args, 1, &grads, &inv, &out, &n, &nu, &dim)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *ix = inv.buf;
    const float *g = grads.buf;
    float *o = out.buf;
    memset(o, 0, nu * dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *dst = o + (size_t)ix[i] * dim;
        const float *src = g + i * dim;
        for (size_t k = 0; k < dim; k++) dst[k] += src[k];
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&grads);
    PyBuffer_Release(&inv);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

PyMethodDef gr_py_grad_methods[] = {
    {"gather_rows", py_gather_rows, METH_VARARGS,
     "gather_rows(out, inverse, rows, dim): out[i] = rows[inverse[i]] (float32, int32 inverse)"},
    {"segment_sum", py_segment_sum, METH_VARARGS,
     "segment_sum(grads, inverse, out, dim): out = per-row sums of grads by inverse"},
    {NULL, NULL, 0, NULL},
};
