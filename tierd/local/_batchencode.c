/*
 * tierd.local._batchencode: the put_batch path's usual batch, checked and encoded in C.
 *
 * The usual batch (one topic, bytes bodies, keys in tuples or lists, every other field at its
 * default, an IPv4 store host - see Preparer._prepare_plain) costs ~0.75 us per message to
 * check and turn into columns with C-level Python passes, and ~0.1 us more to pack the headers
 * and list the pieces of the write. encode_plain() does both in two loops over the messages:
 * the first checks every rule and sizes each record, the second writes the records back to back
 * into one new buffer (header, body, topic, properties: "KEYS" 0x01 keys 0x02) with their body
 * CRCs, and the key index's hashes of the "topic#key" strings (never made as strings). The fields that depend on where
 * and when the batch lands (queue id, queue offset, physical offset, store timestamp) are
 * written by stamp() under the commitlog lock, just before the buffer is written to the file.
 *
 * The contract is the Python path's: byte-identical records and the same index keys for every
 * batch it accepts, and None for any batch it would not take (the caller then runs the Python
 * path, which raises the precise typed error); nothing is written to an object passed in.
 *
 * Written for tierd from the record layout (FORMATS 1.1); no code of other projects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX (Python 3.11) */
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

#include "../format/_record_layout.h"

static const char KEYS_PREFIX[] = "KEYS\x01"; /* the KEYS property's name and separator */
#define KEYS_PREFIX_LEN 5

/* The key index's hash (tierd/format/key_hash.py): MurmurHash3 x86 32-bit, seed 0, of the UTF-8
 * "topic#key", the value mmh3.hash(key, 0, signed=False) gives. Blocks are read little-endian
 * byte by byte, as the reference algorithm defines them, on any host. */
static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t mix_block(uint32_t k) {
    k *= 0xcc9e2d51u;
    k = rotl32(k, 15);
    return k * 0x1b873593u;
}

static uint32_t murmur3_32(const uint8_t *data, size_t len) {
    uint32_t h = 0;
    size_t blocks = len / 4;
    for (size_t i = 0; i < blocks; i++) {
        const uint8_t *b = data + 4 * i;
        uint32_t k = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        h ^= mix_block(k);
        h = rotl32(h, 13);
        h = h * 5 + 0xe6546b64u;
    }
    const uint8_t *tail = data + 4 * blocks;
    uint32_t k = 0;
    switch (len & 3) {
    case 3:
        k ^= (uint32_t)tail[2] << 16; /* fall through */
    case 2:
        k ^= (uint32_t)tail[1] << 8; /* fall through */
    case 1:
        k ^= tail[0];
        h ^= mix_block(k);
        break;
    default:
        break;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

PyDoc_STRVAR(key_hash_doc, "key_hash(data, /) -> int\n--\n\nThe key index's hash of the bytes data (for tests).");

static PyObject *key_hash(PyObject *module, PyObject *arg) {
    Py_buffer b;
    (void)module;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t h = murmur3_32(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(h);
}

/* ------------------------------------------------------------------ Message's slots */
enum { F_TOPIC, F_BODY, F_KEYS, F_QUEUE_ID, F_TAGS, F_BORN_HOST, F_BORN_TIMESTAMP, F_FLAG, F_PROPERTIES, N_FIELDS };
/* The fields after F_KEYS must equal their defaults (bind()'s tuple, in this order). */
#define FIRST_DEFAULTED F_QUEUE_ID
#define N_DEFAULTED (N_FIELDS - FIRST_DEFAULTED)
static const char *const FIELD_NAMES[N_FIELDS] = {
    "topic", "body", "keys", "queue_id", "tags", "born_host", "born_timestamp", "flag", "properties",
};

/* What bind() set up (one binding per process: the module is single-phase). */
static Py_ssize_t field_offset[N_FIELDS];
static PyTypeObject *message_type = NULL;
static PyObject *crc_function = NULL;
static PyObject *defaults = NULL; /* tuple of N_DEFAULTED objects */

static inline PyObject *field(PyObject *msg, int k) { /* borrowed; NULL when the slot is unset */
    return *(PyObject **)((char *)msg + field_offset[k]);
}

PyDoc_STRVAR(bind_doc,
             "bind(cls, crc32, defaults, /)\n--\n\n"
             "Read messages of exactly class cls (Message) through its slots; crc32(bytes) -> int "
             "computes body CRCs; defaults are the values of queue_id, tags, born_host, "
             "born_timestamp, flag, properties that a plain message carries. TypeError unless "
             "each of those fields and topic, body, keys is an object slot of cls.");

static PyObject *bind(PyObject *module, PyObject *args) {
    PyObject *cls_obj, *crc, *defs;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!OO!:bind", &PyType_Type, &cls_obj, &crc, &PyTuple_Type, &defs))
        return NULL;
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    if (!PyCallable_Check(crc)) {
        PyErr_SetString(PyExc_TypeError, "crc32 must be callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(defs) != N_DEFAULTED) {
        PyErr_Format(PyExc_TypeError, "defaults must hold %d values", N_DEFAULTED);
        return NULL;
    }
    Py_ssize_t offsets[N_FIELDS];
    for (int k = 0; k < N_FIELDS; k++) {
        PyObject *descr = PyDict_GetItemString(cls->tp_dict, FIELD_NAMES[k]); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", cls->tp_name, FIELD_NAMES[k]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != Py_T_OBJECT_EX || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", cls->tp_name, FIELD_NAMES[k]);
            return NULL;
        }
        offsets[k] = m->offset;
    }
    memcpy(field_offset, offsets, sizeof offsets);
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(cls_obj));
    Py_XSETREF(crc_function, Py_NewRef(crc));
    Py_XSETREF(defaults, Py_NewRef(defs));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ encode_plain */

/* A key's UTF-8 bytes: the string's own for ASCII, else a new bytes object in *owned. */
typedef struct {
    const char *data;
    Py_ssize_t len;
} Utf8;

/* 1 and *out filled for a key the KEYS property can carry (non-empty str, no space, 0x01 or
 * 0x02); 0 for any other key; -1 with an exception set on a real error. */
static int key_utf8(PyObject *key, Utf8 *out, PyObject **owned) {
    *owned = NULL;
    if (!PyUnicode_CheckExact(key))
        return 0;
    if (PyUnicode_READY(key) < 0)
        return -1;
    if (PyUnicode_GET_LENGTH(key) == 0)
        return 0;
    if (PyUnicode_IS_ASCII(key)) {
        out->data = (const char *)PyUnicode_DATA(key);
        out->len = PyUnicode_GET_LENGTH(key);
    } else {
        /* Not cached on the caller's string (PyUnicode_AsUTF8 would keep a copy alive there);
         * a lone surrogate cannot be encoded: the Python path reports it. */
        PyObject *b = PyUnicode_AsUTF8String(key);
        if (b == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        *owned = b;
        out->data = PyBytes_AS_STRING(b);
        out->len = PyBytes_GET_SIZE(b);
    }
    /* The forbidden characters are ASCII, and UTF-8 never uses ASCII bytes inside a
     * multi-byte sequence, so a byte search finds exactly them. */
    for (Py_ssize_t i = 0; i < out->len; i++) {
        char c = out->data[i];
        if (c == ' ' || c == '\x01' || c == '\x02') {
            Py_CLEAR(*owned);
            return 0;
        }
    }
    return 1;
}

typedef struct {
    PyObject *messages; /* list or tuple (fast sequence) */
    Py_ssize_t n;
    PyObject *topic;
    const char *topic_part;
    Py_ssize_t topic_part_len;
    uint32_t magic;
    Py_ssize_t max_body, max_record, max_properties;
} Plain;

/* Pass 1: every rule of the plain batch; sizes[j] and the properties length of each record.
 * Returns 1 when the batch is plain, 0 when not, -1 on error (exception set). */
static int check_plain(const Plain *p, int64_t *sizes, int64_t *props_lengths, Py_ssize_t *total_keys,
                       Py_ssize_t *total_bytes) {
    PyObject **items = PySequence_Fast_ITEMS(p->messages);
    int with_keys = -1;
    Py_ssize_t keys_seen = 0, bytes = 0;
    for (Py_ssize_t j = 0; j < p->n; j++) {
        PyObject *m = items[j];
        if (!Py_IS_TYPE(m, message_type))
            return 0;
        for (int k = 0; k < N_FIELDS; k++)
            if (field(m, k) == NULL)
                return 0;
        PyObject *topic = field(m, F_TOPIC);
        if (topic != p->topic) {
            if (!PyUnicode_CheckExact(topic))
                return 0;
            int eq = PyUnicode_Compare(topic, p->topic);
            if (eq == -1 && PyErr_Occurred())
                return -1;
            if (eq != 0)
                return 0;
        }
        for (int k = 0; k < N_DEFAULTED; k++) {
            PyObject *v = field(m, FIRST_DEFAULTED + k), *d = PyTuple_GET_ITEM(defaults, k);
            if (v != d) {
                /* Compared as the Python path's tuple comparison does (0 == False, an empty
                 * dict == the empty mapping), but only for builtin types whose comparison with
                 * these defaults runs no Python code (not a mapping proxy: it compares the
                 * mapping it wraps, which may be anything): others take the Python path. */
                PyTypeObject *t = Py_TYPE(v);
                if (t != &PyLong_Type && t != &PyBool_Type && t != &PyFloat_Type && t != &PyUnicode_Type &&
                    t != &PyDict_Type)
                    return 0;
                int eq = PyObject_RichCompareBool(v, d, Py_EQ);
                if (eq < 0)
                    return -1;
                if (!eq)
                    return 0;
            }
        }
        PyObject *body = field(m, F_BODY), *keys = field(m, F_KEYS);
        if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) > p->max_body)
            return 0;
        if (!PyTuple_CheckExact(keys) && !PyList_CheckExact(keys))
            return 0;
        Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
        if (with_keys < 0)
            with_keys = count > 0;
        else if (with_keys != (count > 0)) /* some messages with keys, some without */
            return 0;
        Py_ssize_t props = 0;
        if (count) {
            props = KEYS_PREFIX_LEN + count; /* the name, count - 1 spaces, the 0x02 */
            PyObject **ks = PySequence_Fast_ITEMS(keys);
            for (Py_ssize_t i = 0; i < count; i++) {
                Utf8 u;
                PyObject *owned;
                int ok = key_utf8(ks[i], &u, &owned);
                if (ok <= 0)
                    return ok;
                props += u.len;
                Py_XDECREF(owned);
            }
            if (props > p->max_properties)
                return 0;
            keys_seen += count;
        }
        int64_t size = HEADER_V4 + PyBytes_GET_SIZE(body) + p->topic_part_len + 2 + props;
        if (size > p->max_record)
            return 0;
        sizes[j] = size;
        props_lengths[j] = props;
        bytes += size;
    }
    *total_keys = keys_seen;
    *total_bytes = bytes;
    return 1;
}

/* Pass 2: the records into out (sized by pass 1) and the key hashes into hashes. No Python
 * code runs between the passes, but the CRC function may release the GIL: every write is checked
 * against the record's size from pass 1 and the objects in use are held, so a message changed
 * meanwhile by another thread (through object.__setattr__) fails the call instead of writing
 * outside the buffer. */
static int write_plain(const Plain *p, const int64_t *sizes, const int64_t *props_lengths, uint8_t *out,
                       Py_ssize_t total_keys, const uint8_t host[8], int64_t born_ts, uint8_t *scratch,
                       Py_ssize_t prefix_len, uint32_t *hashes) {
    PyObject **items = PySequence_Fast_ITEMS(p->messages); /* a tuple: its items cannot change */
    Py_ssize_t key_at = 0;
    int rc = -1;
    for (Py_ssize_t j = 0; j < p->n; j++) {
        PyObject *m = items[j];
        PyObject *body = field(m, F_BODY), *keys = field(m, F_KEYS);
        if (body == NULL || keys == NULL || !PyBytes_CheckExact(body) ||
            (!PyTuple_CheckExact(keys) && !PyList_CheckExact(keys)))
            goto changed;
        Py_INCREF(body);
        Py_INCREF(keys);
        uint8_t *r = out, *end = out + sizes[j];
        Py_ssize_t body_len = PyBytes_GET_SIZE(body);
        Py_ssize_t props = props_lengths[j];
        if (HEADER_V4 + body_len + p->topic_part_len + 2 + props != sizes[j])
            goto changed_held;
        PyObject *crc_obj = PyObject_CallOneArg(crc_function, body);
        if (crc_obj == NULL)
            goto error_held;
        unsigned long crc = PyLong_AsUnsignedLongMask(crc_obj);
        Py_DECREF(crc_obj);
        if (crc == (unsigned long)-1 && PyErr_Occurred())
            goto error_held;
        memset(r, 0, HEADER_V4);
        put_u32(r + POS_TOTAL, (uint32_t)sizes[j]);
        put_u32(r + POS_MAGIC, p->magic);
        put_u32(r + POS_BODY_CRC, (uint32_t)(crc & BODY_CRC_MASK));
        put_u64(r + POS_BORN_TIMESTAMP, (uint64_t)born_ts);
        memcpy(r + POS_BORN_HOST, host, 8);
        memcpy(r + POS_STORE_HOST, host, 8);
        put_u32(r + POS_BODY_LENGTH, (uint32_t)body_len);
        r += HEADER_V4;
        memcpy(r, PyBytes_AS_STRING(body), (size_t)body_len);
        r += body_len;
        memcpy(r, p->topic_part, (size_t)p->topic_part_len);
        r += p->topic_part_len;
        r[0] = (uint8_t)(props >> 8);
        r[1] = (uint8_t)props;
        r += 2;
        Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
        if ((count > 0) != (props > 0))
            goto changed_held;
        if (count) {
            memcpy(r, KEYS_PREFIX, KEYS_PREFIX_LEN); /* props >= KEYS_PREFIX_LEN + 1 */
            r += KEYS_PREFIX_LEN;
            for (Py_ssize_t i = 0; i < count; i++) {
                if (i >= PySequence_Fast_GET_SIZE(keys) || key_at >= total_keys)
                    goto changed_held;
                PyObject *key = Py_NewRef(PySequence_Fast_GET_ITEM(keys, i));
                Utf8 u;
                PyObject *owned;
                int ok = key_utf8(key, &u, &owned);
                if (ok != 1 || r + (i ? 1 : 0) + u.len + 1 > end) {
                    Py_XDECREF(owned);
                    Py_DECREF(key);
                    if (ok < 0)
                        goto error_held;
                    goto changed_held;
                }
                if (i)
                    *r++ = ' ';
                memcpy(r, u.data, (size_t)u.len);
                r += u.len;
                /* scratch holds "topic#" and room for the longest key pass 1 allowed */
                memcpy(scratch + prefix_len, u.data, (size_t)u.len);
                hashes[key_at++] = murmur3_32(scratch, (size_t)(prefix_len + u.len));
                Py_XDECREF(owned);
                Py_DECREF(key);
            }
            *r++ = 0x02;
        }
        Py_DECREF(body);
        Py_DECREF(keys);
        if (r != end)
            goto changed;
        out = end;
        continue;
    changed_held:
        Py_DECREF(body);
        Py_DECREF(keys);
        goto changed;
    error_held:
        Py_DECREF(body);
        Py_DECREF(keys);
        return -1;
    }
    if (key_at != total_keys)
        goto changed;
    rc = 0;
    return rc;
changed:
    PyErr_SetString(PyExc_RuntimeError, "a message of the batch changed while it was being encoded");
    return -1;
}

PyDoc_STRVAR(encode_plain_doc,
             "encode_plain(messages, topic, topic_part, magic, max_body, max_record, max_properties, "
             "store_host, born_timestamp, max_buffer, /)\n--\n\n"
             "The records of a plain batch (see Preparer._prepare_plain) back to back, without queue id, "
             "queue offset, physical offset and store timestamp (see stamp()): (records bytearray, sizes "
             "as native int64 bytes, the key index's hashes of 'topic#key' in message order as native uint32 "
             "bytes, keys per message: 0 or 1 when every message has at most one, else -1). None for any "
             "other batch, and for one whose records exceed max_buffer bytes.");

static PyObject *encode_plain(PyObject *module, PyObject *args) {
    PyObject *seq, *topic;
    Py_buffer topic_part, host;
    unsigned int magic;
    long long born_ts;
    Plain p;
    (void)module;
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_plain before bind()");
        return NULL;
    }
    Py_ssize_t max_buffer;
    if (!PyArg_ParseTuple(args, "OUy*Innny*Ln:encode_plain", &seq, &topic, &topic_part, &magic, &p.max_body,
                          &p.max_record, &p.max_properties, &host, &born_ts, &max_buffer))
        return NULL;
    PyObject *result = NULL, *records = NULL, *sizes_obj = NULL, *props_obj = NULL, *hashes_obj = NULL,
             *pinned = NULL;
    uint8_t *scratch = NULL;
    if ((!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) || host.len != 8 ||
        PySequence_Fast_GET_SIZE(seq) == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    pinned = PySequence_Tuple(seq); /* a list could change under us; a tuple cannot */
    if (pinned == NULL)
        goto done;
    p.messages = pinned;
    p.n = PyTuple_GET_SIZE(pinned);
    p.topic = topic;
    p.topic_part = topic_part.buf;
    p.topic_part_len = topic_part.len;
    p.magic = magic;
    sizes_obj = PyBytes_FromStringAndSize(NULL, p.n * (Py_ssize_t)sizeof(int64_t));
    props_obj = PyBytes_FromStringAndSize(NULL, p.n * (Py_ssize_t)sizeof(int64_t));
    if (sizes_obj == NULL || props_obj == NULL)
        goto done;
    int64_t *sizes = (int64_t *)PyBytes_AS_STRING(sizes_obj);
    int64_t *props = (int64_t *)PyBytes_AS_STRING(props_obj);
    Py_ssize_t total_keys, total_bytes;
    int plain = check_plain(&p, sizes, props, &total_keys, &total_bytes);
    if (plain < 0)
        goto done;
    if (plain == 0 || total_bytes > max_buffer) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t topic_len;
    const char *topic_utf8 = PyUnicode_AsUTF8AndSize(topic, &topic_len);
    if (topic_utf8 == NULL)
        goto done;
    records = PyByteArray_FromStringAndSize(NULL, total_bytes);
    hashes_obj = PyBytes_FromStringAndSize(NULL, total_keys * (Py_ssize_t)sizeof(uint32_t));
    scratch = PyMem_Malloc((size_t)(topic_len + 1 + p.max_properties));
    if (records == NULL || hashes_obj == NULL || scratch == NULL) {
        if (scratch == NULL)
            PyErr_NoMemory();
        goto done;
    }
    memcpy(scratch, topic_utf8, (size_t)topic_len);
    scratch[topic_len] = '#';
    if (write_plain(&p, sizes, props, (uint8_t *)PyByteArray_AS_STRING(records), total_keys, host.buf, born_ts,
                    scratch, topic_len + 1, (uint32_t *)PyBytes_AS_STRING(hashes_obj)) < 0)
        goto done;
    int per_message = total_keys == 0 ? 0 : (total_keys == p.n ? 1 : -1);
    result = Py_BuildValue("(OOOi)", records, sizes_obj, hashes_obj, per_message);
done:
    Py_XDECREF(records);
    Py_XDECREF(sizes_obj);
    Py_XDECREF(props_obj);
    Py_XDECREF(hashes_obj);
    PyMem_Free(scratch);
    Py_XDECREF(pinned);
    PyBuffer_Release(&topic_part);
    PyBuffer_Release(&host);
    return result;
}

/* ------------------------------------------------------------------ stamp */

PyDoc_STRVAR(stamp_doc,
             "stamp(records, start, count, queue_id, first_queue_offset, first_physical_offset, "
             "store_timestamp, /) -> int\n--\n\n"
             "Write the placement of count records of records (as encode_plain made them) starting at "
             "byte start: the queue id, queue offsets first_queue_offset + i, physical offsets "
             "first_physical_offset + (position - start), the store timestamp. Returns the byte after "
             "the last one; ValueError when the records do not fit in the buffer.");

static PyObject *stamp(PyObject *module, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start, count;
    int queue_id;
    long long first_qoff, first_phys, store_ts;
    (void)module;
    if (!PyArg_ParseTuple(args, "w*nniLLL:stamp", &buf, &start, &count, &queue_id, &first_qoff, &first_phys,
                          &store_ts))
        return NULL;
    uint8_t *data = buf.buf;
    Py_ssize_t pos = start;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (pos < 0 || pos > buf.len - HEADER_V4)
            break;
        uint32_t size = be_u32(data + pos + POS_TOTAL);
        if (size < HEADER_V4 || (Py_ssize_t)size > buf.len - pos)
            break;
        uint8_t *r = data + pos;
        put_u32(r + POS_QUEUE_ID, (uint32_t)queue_id);
        put_u64(r + POS_QUEUE_OFFSET, (uint64_t)first_qoff + (uint64_t)i);
        put_u64(r + POS_PHYSICAL_OFFSET, (uint64_t)first_phys + (uint64_t)(pos - start));
        put_u64(r + POS_STORE_TIMESTAMP, (uint64_t)store_ts);
        pos += size;
        if (i == count - 1) {
            PyBuffer_Release(&buf);
            return PyLong_FromSsize_t(pos);
        }
    }
    PyBuffer_Release(&buf);
    if (count == 0)
        return PyLong_FromSsize_t(start);
    PyErr_Format(PyExc_ValueError, "%zd records from byte %zd do not fit in the buffer", count, start);
    return NULL;
}

/* ------------------------------------------------------------------ the module */

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, bind_doc},
    {"encode_plain", encode_plain, METH_VARARGS, encode_plain_doc},
    {"stamp", stamp, METH_VARARGS, stamp_doc},
    {"key_hash", key_hash, METH_O, key_hash_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "tierd.local._batchencode",
    "The put_batch path's plain-batch encoder in C (see tierd.local.prepare).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__batchencode(void) { return PyModule_Create(&module_def); }
