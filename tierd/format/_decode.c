/*
 * tierd.format._records, the decoding unit: the cold read path's decoder and the Spark checks.
 *
 * A cold batch is thousands of consecutive records of one queue (FORMATS §1.1) in one buffer.
 * Decoding it in Python costs ~1.4 µs per message, most of it making intermediate objects:
 * slices, lists of ints, a dataclass __init__ frame per message. This module builds the
 * MessageExt objects in one loop straight from the buffer: per message one bytes for the body,
 * one for the properties, the ints that differ from the previous record's, and the object.
 *
 * The contract is the pure-Python decoder's (tierd/format/batch.py, RecordBatch): the same
 * messages for a well-formed batch, None when any record of the range differs from the shape
 * the fast path handles (a foreign record, a bad body CRC, properties that are not UTF-8,
 * IPv6 hosts, framing that does not add up) - the caller then decodes record by record and
 * names the bad one. check_queue() checks a whole batch's framing and identity once (what
 * RecordBatch._columns and _is_queue check with numpy); decode_queue() checks each record of
 * its range again anyway, every offset against the buffer, so no input can make this code
 * read outside it.
 *
 * Written for tierd from the record layout; no code of other projects.
 */
#include "_records.h"
#include <structmember.h> /* T_OBJECT_EX, READONLY (Python 3.11) */
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

/* ------------------------------------------------------------------ the record layout */
#include "_record_layout.h"

/* ------------------------------------------------------------------ MessageExt's slots */
/*
 * The fields in the order this module fills them; bind() finds each one's member descriptor
 * on the class and keeps its offset. "_properties" is the lazily parsed properties cache
 * (None until first access).
 */
enum {
    F_TOPIC,
    F_QUEUE_ID,
    F_QUEUE_OFFSET,
    F_BODY,
    F_RAW_PROPERTIES,
    F_STORE_TIMESTAMP,
    F_BORN_TIMESTAMP,
    F_BORN_HOST,
    F_STORE_HOST,
    F_COMMITLOG_OFFSET,
    F_SIZE,
    F_FLAG,
    F_SYS_FLAG,
    F_RECONSUME_TIMES,
    F_PREPARED_OFFSET,
    F_BODY_CRC,
    F_PROPERTIES_CACHE,
    N_FIELDS
};

static const char *const FIELD_NAMES[N_FIELDS] = {
    "topic",
    "queue_id",
    "queue_offset",
    "body",
    "raw_properties",
    "store_timestamp",
    "born_timestamp",
    "born_host",
    "store_host",
    "commitlog_offset",
    "size",
    "flag",
    "sys_flag",
    "reconsume_times",
    "prepared_transaction_offset",
    "body_crc",
    "_properties",
};

/* What bind() set up. One binding per process: the module is single-phase (m_size -1). */
static PyTypeObject *message_type = NULL;
static Py_ssize_t field_offset[N_FIELDS];
static int untrack_messages = 0;

/* ------------------------------------------------------------------ helpers */

/* 1 when p[0:n] is valid UTF-8 as Python's strict decoder defines it (no overlong forms, no
 * surrogates, nothing above U+10FFFF), else 0. ASCII runs are skipped 8 bytes at a time. */
static int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t c = p[i];
        if (c < 0x80) {
            i += 1;
            continue;
        }
        if (c < 0xC2) /* a continuation byte as a lead, or an overlong 2-byte form */
            return 0;
        if (c < 0xE0) {
            if (n - i < 2 || (p[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
            continue;
        }
        if (c < 0xF0) {
            if (n - i < 3)
                return 0;
            uint8_t lo = c == 0xE0 ? 0xA0 : 0x80; /* E0: no overlong forms */
            uint8_t hi = c == 0xED ? 0x9F : 0xBF; /* ED: no surrogates */
            if (p[i + 1] < lo || p[i + 1] > hi || (p[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
            continue;
        }
        if (c < 0xF5) {
            if (n - i < 4)
                return 0;
            uint8_t lo = c == 0xF0 ? 0x90 : 0x80; /* F0: no overlong forms */
            uint8_t hi = c == 0xF4 ? 0x8F : 0xBF; /* F4: nothing above U+10FFFF */
            if (p[i + 1] < lo || p[i + 1] > hi || (p[i + 2] & 0xC0) != 0x80 || (p[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

/*
 * The last value of one int column and its object: consecutive records mostly repeat
 * timestamps, sizes, flags, so they share one int object instead of one each (fewer
 * allocations now, fewer frees when the result is dropped).
 */
typedef struct {
    long long value;
    PyObject *obj; /* strong reference, or NULL */
} IntCache;

/* A new reference to an int equal to v, shared with the previous call's when equal. */
static PyObject *cached_int(IntCache *c, long long v) {
    if (c->obj == NULL || c->value != v) {
        PyObject *o = PyLong_FromLongLong(v);
        if (o == NULL)
            return NULL;
        Py_XSETREF(c->obj, o);
        c->value = v;
    }
    Py_INCREF(c->obj);
    return c->obj;
}

/* The same for the two host columns: "a.b.c.d:port" from the 8 stored bytes. */
typedef struct {
    uint64_t raw;
    PyObject *obj;
} HostCache;

static PyObject *cached_host(HostCache *c, const uint8_t *p) {
    uint64_t raw = be_u64(p);
    if (c->obj == NULL || c->raw != raw) {
        /* The port is stored as a signed 4-byte int, as tierd.format.host reads it. */
        PyObject *o = PyUnicode_FromFormat("%u.%u.%u.%u:%d", p[0], p[1], p[2], p[3], (int)be_i32(p + 4));
        if (o == NULL)
            return NULL;
        Py_XSETREF(c->obj, o);
        c->raw = raw;
    }
    Py_INCREF(c->obj);
    return c->obj;
}

/* 1 when buffer `view` is a C-contiguous vector of native 8-byte signed ints (a numpy int64
 * array), else 0 with TypeError set. */
static int is_int64_vector(const Py_buffer *view, const char *name) {
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=')
        f++;
    if (view->itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0) || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 vector", name);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ one record */

/* The queue a batch's records must belong to. */
typedef struct {
    const char *topic_utf8;
    Py_ssize_t topic_len;
    long long queue_id;
    long long first_queue_offset; /* of record 0 of the batch */
} Queue;

/* Where a well-framed record's variable parts are, relative to its start. */
typedef struct {
    const uint8_t *r; /* the record */
    int64_t total;
    int64_t body_len;
    int64_t topic_start;
    int64_t topic_len;
    int64_t props_start;
    int64_t props_len;
} Record;

/*
 * The record at s of `total` bytes, framed: inside the buffer, its TOTALSIZE, magic v1 or v2,
 * IPv4 hosts, and body, topic and properties lengths that add up to the total. 1 and *out
 * filled when it is, else 0. Who the record belongs to is the caller's to check.
 */
static int frame_record(const uint8_t *base, int64_t len, int64_t s, int64_t total, Record *out) {
    /* framing: everything read below lies inside [s, s + total), so inside the buffer */
    if (s < 0 || total < MIN_RECORD_SIZE || total > len || s > len - total)
        return 0;
    const uint8_t *r = base + s;
    if (be_i32(r + POS_TOTAL) != total)
        return 0;
    const uint32_t magic = be_u32(r + POS_MAGIC);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return 0;
    if (be_i32(r + POS_SYSFLAG) & SYSFLAG_HOSTS_V6)
        return 0;
    const int64_t body_len = be_i32(r + POS_BODY_LENGTH);
    if (body_len < 0 || MIN_RECORD_SIZE + body_len > total)
        return 0;
    const int64_t body_end = HEADER_V4 + body_len;
    int64_t topic_start, topic_len;
    if (magic == MAGIC_V2) { /* a 2-byte topic length: body_end + 1 < total from the check above */
        topic_len = ((int64_t)r[body_end] << 8) | r[body_end + 1];
        topic_start = body_end + 2;
    } else {
        topic_len = r[body_end];
        topic_start = body_end + 1;
    }
    const int64_t topic_end = topic_start + topic_len;
    if (topic_end + 2 > total)
        return 0;
    const int64_t props_len = ((int64_t)r[topic_end] << 8) | r[topic_end + 1];
    if (topic_end + 2 + props_len != total)
        return 0;
    out->r = r;
    out->total = total;
    out->body_len = body_len;
    out->topic_start = topic_start;
    out->topic_len = topic_len;
    out->props_start = topic_end + 2;
    out->props_len = props_len;
    return 1;
}

/* Whether a framed record's topic is the queue's. */
static int same_topic(const Record *rec, const char *topic, Py_ssize_t topic_len) {
    return rec->topic_len == topic_len && memcmp(rec->r + rec->topic_start, topic, (size_t)topic_len) == 0;
}

/*
 * Record i of the batch (at starts[i], sizes[i] bytes) checked as RecordBatch._columns and
 * _is_queue check it: framed (frame_record), and this queue's topic, queue id and offset. 1 and
 * *out filled when it is, else 0.
 */
static int parse_record(const uint8_t *base, int64_t len, int64_t s, int64_t total, Py_ssize_t i,
                        const Queue *q, Record *out) {
    if (!frame_record(base, len, s, total, out))
        return 0;
    /* identity: this queue's record at its offset (the sum wraps, as numpy's does, rather
     * than overflow: signed overflow is undefined in C) */
    const int64_t offset = (int64_t)((uint64_t)q->first_queue_offset + (uint64_t)i);
    return be_i32(out->r + POS_QUEUE_ID) == q->queue_id && be_i64(out->r + POS_QUEUE_OFFSET) == offset &&
           same_topic(out, q->topic_utf8, q->topic_len);
}

/* The buffers a call reads: the records, and their starts and sizes (int64 vectors). */
typedef struct {
    Py_buffer data, starts, sizes;
    int held; /* how many of the three are acquired */
} Views;

static void release_views(Views *v) {
    if (v->held > 2)
        PyBuffer_Release(&v->sizes);
    if (v->held > 1)
        PyBuffer_Release(&v->starts);
    if (v->held > 0)
        PyBuffer_Release(&v->data);
    v->held = 0;
}

/* Acquire the three buffers (0), or set an exception and release what was taken (-1). */
static int acquire_views(Views *v, PyObject *data, PyObject *starts, PyObject *sizes) {
    v->held = 0;
    if (PyObject_GetBuffer(data, &v->data, PyBUF_SIMPLE) < 0)
        return -1;
    v->held = 1;
    if (PyObject_GetBuffer(starts, &v->starts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto fail;
    v->held = 2;
    if (PyObject_GetBuffer(sizes, &v->sizes, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto fail;
    v->held = 3;
    if (!is_int64_vector(&v->starts, "starts") || !is_int64_vector(&v->sizes, "sizes"))
        goto fail;
    if (v->starts.len != v->sizes.len) {
        PyErr_SetString(PyExc_ValueError, "starts and sizes differ in length");
        goto fail;
    }
    return 0;
fail:
    release_views(v);
    return -1;
}

/* ------------------------------------------------------------------ check_queue */

PyDoc_STRVAR(check_queue_doc,
             "check_queue(data, starts, sizes, topic_utf8, queue_id, first_queue_offset, /)\n--\n\n"
             "Whether every record of the batch is well framed, has IPv4 hosts and is record i of "
             "the queue: topic, queue id, queue offset first_queue_offset + i (RecordBatch._columns "
             "and _is_queue, without building columns). False for an empty batch.");

static PyObject *check_queue(PyObject *module, PyObject *args) {
    PyObject *data, *starts_obj, *sizes_obj;
    Queue q;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOOy#LL:check_queue", &data, &starts_obj, &sizes_obj, &q.topic_utf8,
                          &q.topic_len, &q.queue_id, &q.first_queue_offset))
        return NULL;
    Views v;
    if (acquire_views(&v, data, starts_obj, sizes_obj) < 0)
        return NULL;
    const int64_t *starts = (const int64_t *)v.starts.buf;
    const int64_t *sizes = (const int64_t *)v.sizes.buf;
    const Py_ssize_t count = v.starts.len / 8;
    int ok = count > 0;
    Record rec;
    for (Py_ssize_t i = 0; ok && i < count; i++)
        ok = parse_record((const uint8_t *)v.data.buf, (int64_t)v.data.len, starts[i], sizes[i], i, &q, &rec);
    release_views(&v);
    return PyBool_FromLong(ok);
}

/* ------------------------------------------------------------------ decode_queue */

PyDoc_STRVAR(decode_queue_doc,
             "decode_queue(data, starts, sizes, start, stop, topic, topic_utf8, queue_id, "
             "first_queue_offset, /)\n--\n\n"
             "Records [start, stop) of a batch as a list of MessageExt, or None when any of them "
             "is not a good record of this queue (see tierd.format.batch).");

static PyObject *decode_queue(PyObject *module, PyObject *args) {
    PyObject *data, *starts_obj, *sizes_obj, *topic, *queue_id_obj;
    Py_ssize_t start, stop;
    Queue q;
    (void)module;

    if (!PyArg_ParseTuple(args, "OOOnnUy#O!L:decode_queue", &data, &starts_obj, &sizes_obj, &start, &stop,
                          &topic, &q.topic_utf8, &q.topic_len, &PyLong_Type, &queue_id_obj,
                          &q.first_queue_offset))
        return NULL;
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_queue before bind()");
        return NULL;
    }
    q.queue_id = PyLong_AsLongLong(queue_id_obj);
    if (q.queue_id == -1 && PyErr_Occurred())
        return NULL;
    Views views;
    if (acquire_views(&views, data, starts_obj, sizes_obj) < 0)
        return NULL;

    PyObject *result = NULL; /* the list, None, or NULL with an exception: what is returned */
    PyObject *list = NULL;
    IntCache store_ts_c = {0}, born_ts_c = {0}, size_c = {0}, flag_c = {0}, sysflag_c = {0},
             reconsume_c = {0}, prepared_c = {0}, crc_c = {0};
    HostCache born_c = {0}, store_c = {0};

    if (start < 0 || stop < start || stop > views.starts.len / 8) {
        PyErr_SetString(PyExc_ValueError, "records [start, stop) are not inside starts and sizes");
        goto done;
    }
    const int64_t *starts = (const int64_t *)views.starts.buf;
    const int64_t *sizes = (const int64_t *)views.sizes.buf;
    const uint8_t *base = (const uint8_t *)views.data.buf;
    const int64_t len = (int64_t)views.data.len;

    list = PyList_New(stop - start);
    if (list == NULL)
        goto done;

    for (Py_ssize_t i = start; i < stop; i++) {
        Record rec;
        if (!parse_record(base, len, starts[i], sizes[i], i, &q, &rec))
            goto mismatch;
        const uint8_t *r = rec.r;

        /* -- content: properties UTF-8, body CRC (zlib's CRC-32, masked to 31 bits) */
        const uint8_t *props = r + rec.props_start;
        if (!utf8_valid(props, rec.props_len))
            goto mismatch;
        PyObject *v[N_FIELDS];
        v[F_BODY] = PyBytes_FromStringAndSize((const char *)r + HEADER_V4, rec.body_len);
        if (v[F_BODY] == NULL)
            goto error;
        const uint32_t stored_crc = be_u32(r + POS_BODY_CRC);
        uint32_t computed;
        if (records_crc32(r + HEADER_V4, rec.body_len, v[F_BODY], &computed) < 0) {
            Py_DECREF(v[F_BODY]);
            goto error;
        }
        if ((computed & BODY_CRC_MASK) != stored_crc) {
            Py_DECREF(v[F_BODY]);
            goto mismatch;
        }

        /* -- the field values (new references), then the object, which steals them */
        v[F_TOPIC] = Py_NewRef(topic);
        v[F_QUEUE_ID] = Py_NewRef(queue_id_obj);
        v[F_PROPERTIES_CACHE] = Py_NewRef(Py_None);
        v[F_QUEUE_OFFSET] = PyLong_FromLongLong(be_i64(r + POS_QUEUE_OFFSET));
        v[F_RAW_PROPERTIES] = PyBytes_FromStringAndSize((const char *)props, rec.props_len);
        v[F_STORE_TIMESTAMP] = cached_int(&store_ts_c, be_i64(r + POS_STORE_TIMESTAMP));
        v[F_BORN_TIMESTAMP] = cached_int(&born_ts_c, be_i64(r + POS_BORN_TIMESTAMP));
        v[F_BORN_HOST] = cached_host(&born_c, r + POS_BORN_HOST);
        v[F_STORE_HOST] = cached_host(&store_c, r + POS_STORE_HOST);
        v[F_COMMITLOG_OFFSET] = PyLong_FromLongLong(be_i64(r + POS_PHYSICAL_OFFSET));
        v[F_SIZE] = cached_int(&size_c, rec.total);
        v[F_FLAG] = cached_int(&flag_c, be_i32(r + POS_FLAG));
        v[F_SYS_FLAG] = cached_int(&sysflag_c, be_i32(r + POS_SYSFLAG));
        v[F_RECONSUME_TIMES] = cached_int(&reconsume_c, be_i32(r + POS_RECONSUME_TIMES));
        v[F_PREPARED_OFFSET] = cached_int(&prepared_c, be_i64(r + POS_PREPARED_OFFSET));
        v[F_BODY_CRC] = cached_int(&crc_c, stored_crc);
        PyObject *msg = NULL;
        int failed = 0;
        for (int k = 0; k < N_FIELDS; k++)
            failed |= v[k] == NULL;
        if (!failed)
            msg = message_type->tp_alloc(message_type, 0);
        if (msg == NULL) {
            for (int k = 0; k < N_FIELDS; k++)
                Py_XDECREF(v[k]);
            goto error;
        }
        /* tp_alloc zeroed the slots; nothing below can fail or run Python code. */
        for (int k = 0; k < N_FIELDS; k++)
            *(PyObject **)((char *)msg + field_offset[k]) = v[k];
        if (untrack_messages)
            PyObject_GC_UnTrack(msg);
        PyList_SET_ITEM(list, i - start, msg);
    }
    result = list;
    list = NULL;
    goto done;

mismatch:
    result = Py_NewRef(Py_None);
    goto done;

error:
    result = NULL;

done:
    Py_XDECREF(list); /* a partly filled list: its unset items are NULL, which it skips */
    IntCache *caches[] = {&store_ts_c, &born_ts_c, &size_c, &flag_c, &sysflag_c, &reconsume_c, &prepared_c, &crc_c};
    for (size_t k = 0; k < sizeof caches / sizeof caches[0]; k++)
        Py_XDECREF(caches[k]->obj);
    Py_XDECREF(born_c.obj);
    Py_XDECREF(store_c.obj);
    release_views(&views);
    return result;
}

/* ------------------------------------------------------------------ bind */

PyDoc_STRVAR(bind_doc,
             "bind_decoder(cls, untrack, /)\n--\n\n"
             "Use cls (MessageExt) for the messages (body CRCs: bind_crc32()). Raises "
             "TypeError unless cls is a plain slotted class whose member slots are exactly the "
             "fields this module fills.");

static PyObject *bind(PyObject *module, PyObject *args) {
    PyObject *cls_obj;
    int untrack;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!p:bind_decoder", &PyType_Type, &cls_obj, &untrack))
        return NULL;
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    /* Filling slots directly is only right for a class whose instances are those slots and
     * nothing else: no __dict__, no variable part, no base with state of its own. */
    if (cls->tp_base != &PyBaseObject_Type || cls->tp_dictoffset != 0 || cls->tp_itemsize != 0 ||
        cls->tp_alloc == NULL || !(cls->tp_flags & Py_TPFLAGS_HAVE_GC)) {
        PyErr_Format(PyExc_TypeError, "%s is not a plain slotted class", cls->tp_name);
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
        if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", cls->tp_name, FIELD_NAMES[k]);
            return NULL;
        }
        for (int j = 0; j < k; j++)
            if (offsets[j] == m->offset) {
                PyErr_Format(PyExc_TypeError, "%s.%s shares a slot", cls->tp_name, FIELD_NAMES[k]);
                return NULL;
            }
        offsets[k] = m->offset;
    }
    /* Every slot of the class must be filled: a slot this module does not know would be left
     * unset (AttributeError on read) - a changed class must fail here, not later. */
    Py_ssize_t slots = (cls->tp_basicsize - (Py_ssize_t)sizeof(PyObject)) / (Py_ssize_t)sizeof(PyObject *);
    if (slots != N_FIELDS) {
        PyErr_Format(PyExc_TypeError, "%s has %zd slots, expected %d", cls->tp_name, slots, N_FIELDS);
        return NULL;
    }
    memcpy(field_offset, offsets, sizeof offsets);
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(cls_obj));
    untrack_messages = untrack;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the Spark decoder */
/*
 * tierd.spark.decode turns a 16 MiB piece of a commitlog segment into Arrow columns. What costs
 * there, per record, in Python is the TOTALSIZE chain, a CRC call per body and the field checks;
 * frame_records() and spark_check() do those in C. The body CRC is the bound hookup's
 * (isal.isal_zlib.crc32 through its public Python API: bind_crc32() in _records.c), one call per
 * body with a memoryview of it, in a second pass with the GIL held. The contract: spark_check() accepts a batch only when every record is one the Python
 * decoder accepts, with the same values; for anything else (IPv6 hosts, any bad record) it
 * says so and the caller decodes the batch in Python, which names the bad record. Every offset
 * is checked against the buffer first, so no input can make this code read outside it.
 */

PyDoc_STRVAR(frame_records_doc,
             "frame_records(data, starts, min_size, max_size, /)\n--\n\n"
             "Follow the TOTALSIZE chain from byte 0: write the start of each complete record into "
             "starts (a writable int64 vector with room for len(data) // min_size + 1) and return "
             "(count, consumed, -1, 0); stop at a record running past the end. A total size outside "
             "[min_size, max_size] ends the walk with (count, consumed, its position, the size).");

static PyObject *frame_records(PyObject *module, PyObject *args) {
    PyObject *data_obj, *starts_obj;
    long long lo, hi;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOLL:frame_records", &data_obj, &starts_obj, &lo, &hi))
        return NULL;
    if (lo < 4) {
        PyErr_SetString(PyExc_ValueError, "min_size must be at least 4");
        return NULL;
    }
    Py_buffer data, starts;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(starts_obj, &starts, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t n = (int64_t)data.len;
    if (!is_int64_vector(&starts, "starts"))
        goto done;
    if (starts.len / 8 < n / lo + 1) {
        PyErr_SetString(PyExc_ValueError, "starts has no room for every record");
        goto done;
    }
    const uint8_t *base = (const uint8_t *)data.buf;
    int64_t *out = (int64_t *)starts.buf;
    int64_t pos = 0, count = 0, bad = -1, bad_size = 0;
    Py_BEGIN_ALLOW_THREADS /* plain C over buffers held until the end: the read-ahead runs on */
    while (pos <= n - 4) {
        const int64_t size = be_i32(base + pos);
        if (size < lo || size > hi) {
            bad = pos;
            bad_size = size;
            break;
        }
        if (size > n - pos)
            break;
        out[count++] = pos; /* count <= pos / lo < n / lo + 1 */
        pos += size;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("LLLL", (long long)count, (long long)pos, (long long)bad, (long long)bad_size);
done:
    PyBuffer_Release(&starts);
    PyBuffer_Release(&data);
    return result;
}

/* One row of spark_check()'s output: the fields a batch's columns are built from, native-endian
 * except the two hosts (their stored bytes). tierd.spark.decode declares the same layout. */
typedef struct {
    int64_t queue_offset;
    int64_t physical_offset;
    int64_t born_timestamp;
    int64_t store_timestamp;
    uint8_t born_host[8];
    uint8_t store_host[8];
    int64_t props_start; /* in the buffer */
    int32_t sysflag;
    int32_t reconsume_times;
} SparkRow;

_Static_assert(sizeof(SparkRow) == 64, "SparkRow is 64 bytes, as tierd.spark.decode declares");

/* Acquire a writable, C-contiguous buffer of at least `need` bytes (0), or set an exception (-1). */
static int writable(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len < need) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes, %zd needed", name, view->len, need);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(spark_check_doc,
             "spark_check(data, starts, end, flat_base, topic_utf8, queue_id, rows, body_offsets, "
             "bodies, /)\n--\n\n"
             "Check the records at starts (int64; the last one ends at end) as tierd.spark.decode "
             "does — magic, lengths adding up to the total size, this queue's topic and queue id, "
             "PHYSICALOFFSET == flat_base + start, the body CRC, UTF-8 properties — and fill rows "
             "(64 bytes per record), body_offsets (int32, one more than the records) and bodies "
             "(the bodies end to end). Returns -1 when every record passed, else the index of the "
             "first record that is not such a record with IPv4 hosts (nothing else is promised of "
             "the outputs then).");

static PyObject *spark_check(PyObject *module, PyObject *args) {
    PyObject *data_obj, *starts_obj, *rows_obj, *offsets_obj, *bodies_obj;
    long long end, flat_base, queue_id;
    const char *topic;
    Py_ssize_t topic_len;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOLLy#LOOO:spark_check", &data_obj, &starts_obj, &end, &flat_base, &topic,
                          &topic_len, &queue_id, &rows_obj, &offsets_obj, &bodies_obj))
        return NULL;
    Py_buffer data, starts, rows, offsets, bodies;
    int held = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0)
        goto done;
    held = 1;
    if (PyObject_GetBuffer(starts_obj, &starts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    held = 2;
    if (!is_int64_vector(&starts, "starts"))
        goto done;
    const Py_ssize_t count = starts.len / 8;
    if (writable(rows_obj, &rows, count * (Py_ssize_t)sizeof(SparkRow), "rows") < 0)
        goto done;
    held = 3;
    if (writable(offsets_obj, &offsets, (count + 1) * 4, "body_offsets") < 0)
        goto done;
    held = 4;
    if (writable(bodies_obj, &bodies, 0, "bodies") < 0)
        goto done;
    held = 5;

    const uint8_t *base = (const uint8_t *)data.buf;
    const int64_t len = (int64_t)data.len;
    const int64_t *st = (const int64_t *)starts.buf;
    SparkRow *row = (SparkRow *)rows.buf;
    int32_t *off = (int32_t *)offsets.buf;
    uint8_t *out = (uint8_t *)bodies.buf;
    const int64_t room = (int64_t)bodies.len < INT32_MAX ? (int64_t)bodies.len : INT32_MAX;
    int64_t used = 0;
    Py_ssize_t i = 0;
    if (end < 0 || end > len)
        goto checked;
    off[0] = 0;
    Py_BEGIN_ALLOW_THREADS /* plain C over buffers held until the end: the read-ahead runs on */
    for (; i < count; i++, row++) {
        const int64_t s = st[i];
        const int64_t e = i + 1 < count ? st[i + 1] : end;
        Record rec;
        if (!frame_record(base, end, s, e - s, &rec)) /* inside [0, end): see the check of end */
            break;
        const uint8_t *r = rec.r;
        const int64_t body_len = rec.body_len;
        /* this queue's record, where the flat file says (wrapping sum: see parse_record) */
        if (!same_topic(&rec, topic, topic_len) || be_i32(r + POS_QUEUE_ID) != queue_id ||
            be_i64(r + POS_PHYSICAL_OFFSET) != (int64_t)((uint64_t)flat_base + (uint64_t)s))
            break;
        if (!utf8_valid(r + rec.props_start, rec.props_len))
            break;
        if (body_len > room - used)
            break;
        memcpy(out + used, r + HEADER_V4, (size_t)body_len);
        used += body_len;
        off[i + 1] = (int32_t)used;
        row->queue_offset = be_i64(r + POS_QUEUE_OFFSET);
        row->physical_offset = be_i64(r + POS_PHYSICAL_OFFSET);
        row->born_timestamp = be_i64(r + POS_BORN_TIMESTAMP);
        row->store_timestamp = be_i64(r + POS_STORE_TIMESTAMP);
        memcpy(row->born_host, r + POS_BORN_HOST, 8);
        memcpy(row->store_host, r + POS_STORE_HOST, 8);
        row->props_start = s + rec.props_start;
        row->sysflag = be_i32(r + POS_SYSFLAG);
        row->reconsume_times = be_i32(r + POS_RECONSUME_TIMES);
    }
    Py_END_ALLOW_THREADS
    /* The body CRCs of the records that passed everything else, in order, with the GIL (a Python
     * call each): the first mismatch is the first record that is not such a record. */
    for (Py_ssize_t j = 0; j < i; j++) {
        uint32_t crc;
        const uint8_t *r = base + st[j]; /* framed above: header and body inside the buffer */
        if (records_crc32(r + HEADER_V4, (Py_ssize_t)off[j + 1] - off[j], NULL, &crc) < 0)
            goto done;
        if ((crc & BODY_CRC_MASK) != be_u32(r + POS_BODY_CRC)) {
            i = j;
            break;
        }
    }
checked:
    result = PyLong_FromSsize_t(i == count ? -1 : i);
done:
    if (held > 4)
        PyBuffer_Release(&bodies);
    if (held > 3)
        PyBuffer_Release(&offsets);
    if (held > 2)
        PyBuffer_Release(&rows);
    if (held > 1)
        PyBuffer_Release(&starts);
    if (held > 0)
        PyBuffer_Release(&data);
    return result;
}

/* ------------------------------------------------------------------ the functions (_records.c) */

PyMethodDef records_decode_methods[] = {
    {"bind_decoder", bind, METH_VARARGS, bind_doc},
    {"check_queue", check_queue, METH_VARARGS, check_queue_doc},
    {"decode_queue", decode_queue, METH_VARARGS, decode_queue_doc},
    {"frame_records", frame_records, METH_VARARGS, frame_records_doc},
    {"spark_check", spark_check, METH_VARARGS, spark_check_doc},
    {NULL, NULL, 0, NULL},
};
