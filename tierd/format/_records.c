/*
 * tierd.format._records: the record format's C extension - one module, one binding of the body
 * CRC, two units: _decode.c (the cold read path's batch decoder, the Spark framing and checks)
 * and _encode.c (put and put_batch's encoder). Every position and flag comes from
 * _record_layout.h, generated from tierd/format/layout.py. tierd.format.compiled imports and
 * binds it; where it is not built, tierd runs the Python code that writes and reads the same
 * bytes.
 *
 * Written for tierd from the record layout (FORMATS 1.1); no code of other projects.
 */
#include "_records.h"

PyObject *records_crc32_function = NULL;

int records_crc32(const void *p, Py_ssize_t len, PyObject *obj, uint32_t *out) {
    if (records_crc32_function == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a body CRC before bind_crc32()");
        return -1;
    }
    /* Without an object, a read-only view of the bytes (no copy). The callable is isal_zlib.crc32
     * (or zlib.crc32): neither keeps its argument, so the view does not outlive the call. */
    PyObject *view = NULL;
    if (obj == NULL) {
        view = PyMemoryView_FromMemory((char *)p, len, PyBUF_READ);
        if (view == NULL)
            return -1;
        obj = view;
    }
    PyObject *got = PyObject_CallOneArg(records_crc32_function, obj);
    Py_XDECREF(view);
    if (got == NULL)
        return -1;
    unsigned long v = PyLong_AsUnsignedLongMask(got);
    Py_DECREF(got);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint32_t)v;
    return 0;
}

PyDoc_STRVAR(bind_crc32_doc,
             "bind_crc32(crc32, /)\n--\n\n"
             "Compute every body CRC with crc32(bytes-like) -> int, zlib's CRC-32 through a public "
             "Python API (tierd.format.record.crc32: isal.isal_zlib.crc32).");

static PyObject *bind_crc32(PyObject *module, PyObject *fn) {
    (void)module;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "crc32 must be callable");
        return NULL;
    }
    Py_XSETREF(records_crc32_function, Py_NewRef(fn));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(crc32_doc, "crc32(data, /)\n--\n\nzlib's CRC-32 of data as the bound hookup computes it.");

static PyObject *crc32_bound(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    int rc = records_crc32(view.buf, view.len, arg, &crc);
    PyBuffer_Release(&view);
    return rc < 0 ? NULL : PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32_function_doc,
             "crc32_function() -> callable | None\n--\n\nThe bound body CRC function (None before bind_crc32()).");

static PyObject *crc32_function(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return Py_NewRef(records_crc32_function != NULL ? records_crc32_function : Py_None);
}

static PyMethodDef methods[] = {
    {"bind_crc32", bind_crc32, METH_O, bind_crc32_doc},
    {"crc32", crc32_bound, METH_O, crc32_doc},
    {"crc32_function", crc32_function, METH_NOARGS, crc32_function_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "tierd.format._records",
    "The record format's C extension: encoder and decoders (see tierd.format.compiled).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, records_decode_methods) < 0 || PyModule_AddFunctions(m, records_encode_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
