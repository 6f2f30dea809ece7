/*
 * tierd.format._records: what its units share - the decoding unit (_decode.c), the encoding
 * unit (_encode.c) and the module with the one CRC hookup (_records.c).
 */
#ifndef TIERD_RECORDS_H
#define TIERD_RECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* The one CRC hookup, set by bind_crc32(): the Python crc32 every body CRC is computed with
 * (isal.isal_zlib.crc32 through its public API, bound by tierd.format.compiled). */
extern PyObject *records_crc32_function;

/* zlib's CRC-32 of the len bytes at p into *out (unmasked); obj is the same bytes as an object,
 * or NULL (a memoryview of them is passed then). Needs the GIL. 0, or -1 with an exception set
 * (not bound, or the call failed). */
int records_crc32(const void *p, Py_ssize_t len, PyObject *obj, uint32_t *out);

/* The functions of each unit, added to the module by _records.c. */
extern PyMethodDef records_decode_methods[];
extern PyMethodDef records_encode_methods[];

#endif
