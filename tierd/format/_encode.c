/*
 * tierd.format._records, the encoding unit: put_batch's and put's records, checked and encoded
 * in C, for every shape (see tierd.local.prepare).
 *
 * encode() takes any batch the Python paths accept - several topics, explicit queue ids or the
 * store's round-robin choice, tags, user properties (UNIQ_KEY, TAGS among them), flags, born
 * hosts and timestamps, v2 topics, IPv4 or IPv6 hosts, keys or none - in two loops over the
 * messages: the first checks every rule and sizes each record, the second writes the records
 * back to back into one new buffer with their body CRCs, and the key index's hashes of the
 * "topic#key" strings (never made as strings), a message's UNIQ_KEY before its KEYS (the order
 * RocketMQ's IndexService writes them in). The fields that depend on where and when the
 * batch lands (queue offset, physical offset, store timestamp) are written by stamp() under the
 * commitlog lock, just before the buffer is written to the file. Every position and flag comes
 * from _record_layout.h, generated from tierd/format/layout.py.
 *
 * The contract is the Python path's: byte-identical records and the same columns and index
 * keys for every batch it accepts, and None for any batch a rule rejects or whose values are of
 * other types than the builtin ones (the caller then runs the Python path, which raises the
 * precise typed error or converts); nothing is written to an object passed in.
 *
 * Written for tierd from the record layout (FORMATS 1.1); no code of other projects.
 */
#include "_records.h"
#include <structmember.h> /* T_OBJECT_EX (Python 3.11) */
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

#include "_record_layout.h"


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
static const char *const FIELD_NAMES[N_FIELDS] = {
    "topic", "body", "keys", "queue_id", "tags", "born_host", "born_timestamp", "flag", "properties",
};

/* What bind() set up (one binding per process: the module is single-phase). */
static Py_ssize_t field_offset[N_FIELDS];
static PyTypeObject *message_type = NULL;
static PyObject *host_function = NULL;
static PyObject *empty_properties = NULL; /* Message's default properties mapping */

static inline PyObject *field(PyObject *msg, int k) { /* borrowed; NULL when the slot is unset */
    return *(PyObject **)((char *)msg + field_offset[k]);
}

PyDoc_STRVAR(bind_doc,
             "bind_encoder(cls, encode_host, empty_properties, /)\n--\n\n"
             "Read messages of exactly class cls (Message) through its slots; encode_host(str) -> bytes "
             "encodes a born host; empty_properties is the mapping a message without properties "
             "carries (body CRCs: bind_crc32()). TypeError unless each field is an object slot of cls.");

static PyObject *bind(PyObject *module, PyObject *args) {
    PyObject *cls_obj, *host, *empty;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!OO:bind_encoder", &PyType_Type, &cls_obj, &host, &empty))
        return NULL;
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    if (!PyCallable_Check(host)) {
        PyErr_SetString(PyExc_TypeError, "encode_host must be callable");
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
    Py_XSETREF(host_function, Py_NewRef(host));
    Py_XSETREF(empty_properties, Py_NewRef(empty));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ encode */

/* A string's UTF-8 bytes: the string's own for ASCII, else a new bytes object in *owned (not
 * cached on the caller's string: PyUnicode_AsUTF8 would keep a copy alive there). */
typedef struct {
    const char *data;
    Py_ssize_t len;
} Utf8;

/* The bytes a string of the properties must not hold: none (a UNIQ_KEY value hashed for the
 * index), the separators 0x01 and 0x02 (names, values, tags), or those and a space (a key: KEYS
 * joins keys with spaces). */
typedef enum { ANY_BYTE = 0, NO_SEPARATORS = 1, NO_SEPARATORS_OR_SPACE = 2 } Forbidden;

/* Whether data holds a byte `forbidden` names. Plain comparisons in one pass: every string of a
 * message is scanned (keys, tags, property names and values), and a strchr() call a byte was a
 * tenth of put_batch's encoding time for messages with properties. */
static inline int has_forbidden(const uint8_t *data, Py_ssize_t len, Forbidden forbidden) {
    if (forbidden == ANY_BYTE)
        return 0;
    uint8_t space = forbidden == NO_SEPARATORS_OR_SPACE ? ' ' : 0x01;
    for (Py_ssize_t i = 0; i < len; i++) {
        uint8_t x = data[i];
        if (x == 0x01 || x == 0x02 || x == space)
            return 1;
    }
    return 0;
}

/* 1 and *out filled for a non-empty exact str free of the bytes in `forbidden` (ASCII; UTF-8
 * never uses ASCII bytes inside a multi-byte sequence, so a byte search finds exactly them);
 * 0 for any other value (the Python path then names it); -1 with an exception on a real error. */
static int text_utf8(PyObject *s, Utf8 *out, PyObject **owned, Forbidden forbidden) {
    *owned = NULL;
    if (!PyUnicode_CheckExact(s))
        return 0;
    if (PyUnicode_READY(s) < 0)
        return -1;
    if (PyUnicode_GET_LENGTH(s) == 0)
        return 0;
    if (PyUnicode_IS_ASCII(s)) {
        out->data = (const char *)PyUnicode_DATA(s);
        out->len = PyUnicode_GET_LENGTH(s);
    } else {
        PyObject *b = PyUnicode_AsUTF8String(s);
        if (b == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return -1;
            PyErr_Clear(); /* a lone surrogate: the Python path reports it */
            return 0;
        }
        *owned = b;
        out->data = PyBytes_AS_STRING(b);
        out->len = PyBytes_GET_SIZE(b);
    }
    if (has_forbidden((const uint8_t *)out->data, out->len, forbidden)) {
        Py_CLEAR(*owned);
        return 0;
    }
    return 1;
}


/* Java's String.hashCode of a str (UTF-16 code units, int32 wrap-around): the tags code. */
static int32_t java_hash(PyObject *s) {
    uint32_t h = 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(s); i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int32_t)h;
}

/* One message as pass 1 found it. */
typedef struct {
    PyObject *body, *keys, *tags, *props, *born; /* held; born is NULL for the store host */
    PyObject *topic_entry;                       /* borrowed from topics: (magic, topic part) */
    int64_t born_ts;
    int32_t flag, queue_id;
    Py_ssize_t props_len, key_count;
    PyObject *uniq; /* borrowed from props: its UNIQ_KEY value, or NULL */
} Item;

static const char KEYS_NAME[] = "KEYS", TAGS_NAME[] = "TAGS", UNIQ_NAME[] = "UNIQ_KEY";

/* Whether the (ready, exact) str s is the ASCII name of n bytes: a length and a memcmp, not a
 * comparison call per property and name. A str holding non-ASCII text never equals one. */
static inline int is_ascii_name(PyObject *s, const char *name, size_t n) {
    return PyUnicode_IS_ASCII(s) && (size_t)PyUnicode_GET_LENGTH(s) == n && memcmp(PyUnicode_DATA(s), name, n) == 0;
}

/* Whether two ready exact strs hold the same text (same kind, length and code units: the
 * canonical form makes that equality). */
static inline int same_text(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

typedef struct {
    PyObject *topics, *choose, *chosen; /* encode(): a batch's topics, its queue chooser */
    PyObject *topic, *entry;            /* encode_one(): the message's topic and its entry */
    long queue_id;                      /* encode_one(): the queue of a message without one */
    long max_queues;
    Py_ssize_t max_body, max_record, max_properties;
    int64_t now_ms;
    Py_ssize_t store_host_len;
} Rules;

static void release_items(Item *items, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_XDECREF(items[j].body);
        Py_XDECREF(items[j].keys);
        Py_XDECREF(items[j].tags);
        Py_XDECREF(items[j].props);
        Py_XDECREF(items[j].born);
    }
}

/* Length a str adds to the properties as UTF-8, or 0 when it breaks a rule, -1 on error. */
static Py_ssize_t text_len(PyObject *s, Forbidden forbidden) {
    Utf8 u;
    PyObject *owned;
    int ok = text_utf8(s, &u, &owned, forbidden);
    if (ok <= 0)
        return ok;
    Py_XDECREF(owned);
    return u.len;
}

/* Pass 1 for one message: every rule the Python path checks; 1 when it holds, 0 when not (the
 * Python path then runs and raises its typed error), -1 on error. */
static int check_one(const Rules *r, PyObject *m, Item *it, int64_t *size) {
    if (!Py_IS_TYPE(m, message_type))
        return 0;
    for (int k = 0; k < N_FIELDS; k++)
        if (field(m, k) == NULL)
            return 0;
    PyObject *topic = field(m, F_TOPIC);
    if (!PyUnicode_CheckExact(topic))
        return 0;
    PyObject *entry;
    if (r->topics != NULL) {
        entry = PyDict_GetItemWithError(r->topics, topic);
        if (entry == NULL)
            return PyErr_Occurred() ? -1 : 0;
    } else {
        if (topic != r->topic) /* changed since the caller looked it up */
            return 0;
        entry = r->entry;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 1)))
        return 0;
    it->topic_entry = entry;
    PyObject *body = field(m, F_BODY);
    if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) > r->max_body)
        return 0;
    /* queue id */
    PyObject *q = field(m, F_QUEUE_ID);
    if (q == Py_None && r->chosen == NULL) {
        if (r->queue_id < 0)
            return 0;
        it->queue_id = (int32_t)r->queue_id;
    } else if (q == Py_None) {
        PyObject *got = PyDict_GetItemWithError(r->chosen, topic);
        if (got == NULL) {
            if (PyErr_Occurred())
                return -1;
            got = PyObject_CallOneArg(r->choose, topic);
            if (got == NULL)
                return -1;
            int rc = PyDict_SetItem(r->chosen, topic, got);
            Py_DECREF(got);
            if (rc < 0)
                return -1;
        }
        it->queue_id = (int32_t)PyLong_AsLong(got);
        if (it->queue_id == -1 && PyErr_Occurred())
            return -1;
    } else {
        if (!PyLong_CheckExact(q))
            return 0;
        int overflow;
        long v = PyLong_AsLongAndOverflow(q, &overflow);
        if (overflow || v < 0 || v >= r->max_queues)
            return 0;
        it->queue_id = (int32_t)v;
    }
    /* flag */
    PyObject *flag = field(m, F_FLAG);
    if (!PyLong_CheckExact(flag))
        return 0;
    int overflow;
    long long fv = PyLong_AsLongLongAndOverflow(flag, &overflow);
    if (overflow || fv < INT32_MIN || fv > INT32_MAX)
        return 0;
    it->flag = (int32_t)fv;
    /* born timestamp */
    PyObject *bts = field(m, F_BORN_TIMESTAMP);
    if (bts == Py_None) {
        it->born_ts = r->now_ms;
    } else {
        if (!PyLong_CheckExact(bts))
            return 0;
        long long v = PyLong_AsLongLongAndOverflow(bts, &overflow);
        if (overflow || v < 0)
            return 0;
        it->born_ts = v;
    }
    /* born host */
    PyObject *bh = field(m, F_BORN_HOST);
    if (bh != Py_None) {
        if (!PyUnicode_CheckExact(bh))
            return 0;
        PyObject *raw = PyObject_CallOneArg(host_function, bh);
        if (raw == NULL) {
            PyErr_Clear(); /* the Python path raises the typed error */
            return 0;
        }
        if (!PyBytes_CheckExact(raw) || (PyBytes_GET_SIZE(raw) != HOST_V4 && PyBytes_GET_SIZE(raw) != HOST_V6)) {
            Py_DECREF(raw);
            return 0;
        }
        it->born = raw;
    }
    /* properties: user pairs, then KEYS, then TAGS */
    PyObject *keys = field(m, F_KEYS), *tags = field(m, F_TAGS), *props = field(m, F_PROPERTIES);
    Py_ssize_t plen = 0;
    if (!PyTuple_CheckExact(keys) && !PyList_CheckExact(keys))
        return 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(keys);
    if (tags != Py_None) {
        Py_ssize_t t = text_len(tags, NO_SEPARATORS);
        if (t <= 0)
            return (int)t;
        plen += (Py_ssize_t)sizeof TAGS_NAME - 1 + 2 + t;
    }
    it->uniq = NULL;
    if (props != empty_properties) {
        if (!PyDict_CheckExact(props))
            return 0;
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(props, &pos, &name, &value)) {
            Py_ssize_t a = text_len(name, NO_SEPARATORS), b;
            if (a <= 0)
                return (int)a;
            b = text_len(value, NO_SEPARATORS);
            if (b <= 0)
                return (int)b;
            if (count && is_ascii_name(name, KEYS_NAME, sizeof KEYS_NAME - 1))
                return 0;
            if (tags != Py_None && is_ascii_name(name, TAGS_NAME, sizeof TAGS_NAME - 1))
                return 0;
            if (is_ascii_name(name, UNIQ_NAME, sizeof UNIQ_NAME - 1))
                it->uniq = value;
            plen += a + 2 + b;
        }
    }
    if (count) {
        PyObject **ks = PySequence_Fast_ITEMS(keys);
        plen += (Py_ssize_t)sizeof KEYS_NAME - 1 + 1 + count; /* name, 0x01, count - 1 spaces, 0x02 */
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t k = text_len(ks[i], NO_SEPARATORS_OR_SPACE);
            if (k <= 0)
                return (int)k;
            plen += k;
        }
    }
    if (plen > r->max_properties)
        return 0;
    Py_ssize_t topic_part = PyBytes_GET_SIZE(PyTuple_GET_ITEM(entry, 1));
    Py_ssize_t born_len = it->born ? PyBytes_GET_SIZE(it->born) : r->store_host_len;
    int64_t total = HEADER_FIXED + born_len + r->store_host_len + PyBytes_GET_SIZE(body) + topic_part +
                    PROPERTIES_LENGTH_WIDTH + plen;
    if (total > r->max_record)
        return 0;
    it->body = Py_NewRef(body);
    it->keys = Py_NewRef(keys);
    it->tags = Py_NewRef(tags);
    it->props = Py_NewRef(props);
    it->props_len = plen;
    it->key_count = count;
    *size = total;
    return 1;
}

/* Bounded writer: every copy checked against the record's size from pass 1. */
typedef struct {
    uint8_t *at, *end;
} Out;

static inline int put(Out *o, const void *p, Py_ssize_t n) {
    if (n < 0 || o->end - o->at < n)
        return -1;
    memcpy(o->at, p, (size_t)n);
    o->at += n;
    return 0;
}

static inline int put_byte(Out *o, uint8_t b) { return put(o, &b, 1); }

/* A str into the record (and, with scratch, its "topic#" hash); -1 when it changed. */
static int put_text(Out *o, PyObject *s, Forbidden forbidden, uint8_t *scratch, Py_ssize_t prefix,
                    Py_ssize_t room, uint32_t *hash) {
    Utf8 u;
    PyObject *owned;
    if (text_utf8(s, &u, &owned, forbidden) != 1) {
        if (PyErr_Occurred())
            return -2;
        return -1;
    }
    int rc = put(o, u.data, u.len);
    if (rc == 0 && scratch != NULL) {
        if (u.len > room)
            rc = -1;
        else {
            memcpy(scratch + prefix, u.data, (size_t)u.len);
            *hash = murmur3_32(scratch, (size_t)(prefix + u.len));
        }
    }
    Py_XDECREF(owned);
    return rc;
}

/* Pass 2 for one message: the record into o. 0, -1 when the message changed, -2 on error. */
static int write_one(const Item *it, Out *o, int64_t size, const uint8_t *store_host, Py_ssize_t store_len,
                     uint8_t *scratch, Py_ssize_t prefix, Py_ssize_t scratch_room, uint32_t *hashes,
                     Py_ssize_t *key_at, Py_ssize_t total_keys) {
    PyObject *body = it->body, *entry = it->topic_entry;
    PyObject *topic_part = PyTuple_GET_ITEM(entry, 1);
    unsigned long magic = PyLong_AsUnsignedLongMask(PyTuple_GET_ITEM(entry, 0));
    if (magic == (unsigned long)-1 && PyErr_Occurred())
        return -2;
    uint32_t crc;
    if (records_crc32(PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), body, &crc) < 0)
        return -2;
    const uint8_t *born = it->born ? (const uint8_t *)PyBytes_AS_STRING(it->born) : store_host;
    Py_ssize_t born_len = it->born ? PyBytes_GET_SIZE(it->born) : store_len;
    Py_ssize_t header = HEADER_FIXED + born_len + store_len;
    if (o->end - o->at < header)
        return -1;
    uint8_t *r = o->at;
    memset(r, 0, (size_t)header);
    uint32_t sys_flag = (born_len == HOST_V6 ? SYSFLAG_BORNHOST_V6 : 0) | (store_len == HOST_V6 ? SYSFLAG_STOREHOST_V6 : 0);
    /* Positions after BORNHOST move by its extra width, after STOREHOST by both. */
    Py_ssize_t after_born = born_len - HOST_V4, after_store = after_born + store_len - HOST_V4;
    put_u32(r + POS_TOTAL, (uint32_t)size);
    put_u32(r + POS_MAGIC, (uint32_t)magic);
    put_u32(r + POS_BODY_CRC, (uint32_t)(crc & BODY_CRC_MASK));
    put_u32(r + POS_QUEUE_ID, (uint32_t)it->queue_id);
    put_u32(r + POS_FLAG, (uint32_t)it->flag);
    put_u32(r + POS_SYSFLAG, sys_flag);
    put_u64(r + POS_BORN_TIMESTAMP, (uint64_t)it->born_ts);
    memcpy(r + POS_BORN_HOST, born, (size_t)born_len);
    memcpy(r + POS_STORE_HOST + after_born, store_host, (size_t)store_len);
    put_u32(r + POS_BODY_LENGTH + after_store, (uint32_t)PyBytes_GET_SIZE(body));
    o->at += header;
    if (put(o, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body)) < 0 ||
        put(o, PyBytes_AS_STRING(topic_part), PyBytes_GET_SIZE(topic_part)) < 0)
        return -1;
    uint8_t plen[PROPERTIES_LENGTH_WIDTH];
    for (int i = 0; i < PROPERTIES_LENGTH_WIDTH; i++)
        plen[i] = (uint8_t)(it->props_len >> (8 * (PROPERTIES_LENGTH_WIDTH - 1 - i)));
    if (put(o, plen, PROPERTIES_LENGTH_WIDTH) < 0)
        return -1;
    uint8_t *props_start = o->at;
    int rc;
    if (it->props != empty_properties) {
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(it->props, &pos, &name, &value)) {
            if ((rc = put_text(o, name, NO_SEPARATORS, NULL, 0, 0, NULL)) < 0 || (rc = put_byte(o, 1)) < 0 ||
                (rc = put_text(o, value, NO_SEPARATORS, NULL, 0, 0, NULL)) < 0 || (rc = put_byte(o, 2)) < 0)
                return rc;
        }
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(it->keys);
    if (count != it->key_count)
        return -1;
    if (count) {
        if (put(o, KEYS_NAME, (Py_ssize_t)sizeof KEYS_NAME - 1) < 0 || put_byte(o, 1) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (i >= PySequence_Fast_GET_SIZE(it->keys) || *key_at >= total_keys)
                return -1;
            if (i && put_byte(o, ' ') < 0)
                return -1;
            PyObject *key = Py_NewRef(PySequence_Fast_GET_ITEM(it->keys, i));
            rc = put_text(o, key, NO_SEPARATORS_OR_SPACE, scratch, prefix, scratch_room - prefix,
                          &hashes[*key_at]);
            Py_DECREF(key);
            if (rc < 0)
                return rc;
            ++*key_at;
        }
        if (put_byte(o, 2) < 0)
            return -1;
    }
    if (it->tags != Py_None) {
        if (put(o, TAGS_NAME, (Py_ssize_t)sizeof TAGS_NAME - 1) < 0 || put_byte(o, 1) < 0 ||
            (rc = put_text(o, it->tags, NO_SEPARATORS, NULL, 0, 0, NULL)) < 0 || put_byte(o, 2) < 0)
            return -1;
    }
    if (o->at - props_start != it->props_len || o->at != o->end)
        return -1;
    return 0;
}

/* The consume queue's tags code of a checked message: of TAGS, or of the TAGS property. */
static int64_t tags_code_of(const Item *it) {
    PyObject *tag = it->tags;
    if (tag == Py_None && it->props != empty_properties) {
        tag = PyDict_GetItemString(it->props, TAGS_NAME); /* borrowed */
        if (tag == NULL)
            tag = Py_None;
    }
    return (tag != Py_None && PyUnicode_GET_LENGTH(tag)) ? java_hash(tag) : 0;
}

/* The index hash of a message's "topic#UNIQ_KEY" (scratch holds "topic#" already): 0, -1 when
 * the value changed, -2 on error. */
static int hash_uniq(const Item *it, uint8_t *scratch, Py_ssize_t prefix, Py_ssize_t room, uint32_t *hash) {
    Out u = {scratch + prefix, scratch + room};
    int rc = put_text(&u, it->uniq, ANY_BYTE, NULL, 0, 0, NULL);
    if (rc < 0)
        return rc;
    *hash = murmur3_32(scratch, (size_t)(u.at - scratch));
    return 0;
}

PyDoc_STRVAR(encode_doc,
             "encode(messages, topics, choose, max_queues, max_body, max_record, max_properties, "
             "store_host, now_ms, max_buffer, /)\n--\n\n"
             "The records of a batch back to back, without queue offset, physical offset and store "
             "timestamp (see stamp()). topics maps each topic of the batch to (magic, topic part); "
             "choose(topic) -> queue id picks the queue of a topic's messages without one (once per "
             "topic and call). Returns (records bytearray, sizes int64 bytes, queue ids int32 bytes, "
             "message indexes ordered by group (stable) and each group's bounds in that order, both "
             "Py_ssize_t bytes, group keys [(topic, queue id)] in first-seen order, "
             "tags codes int64 bytes, index hashes uint32 bytes, index messages int64 bytes), all native; "
             "None for any batch the Python path must handle (a rule broken: it raises the typed error), "
             "and for one whose records exceed max_buffer bytes.");

/* The "topic#" prefix of the index keys: the scratch buffer holds it, then the key. */
static int set_prefix(uint8_t *scratch, PyObject *topic, Py_ssize_t *prefix) {
    Py_ssize_t n;
    const char *t = PyUnicode_AsUTF8AndSize(topic, &n);
    if (t == NULL)
        return -1;
    memcpy(scratch, t, (size_t)n);
    scratch[n] = '#';
    *prefix = n + 1;
    return 0;
}

/* A direct-mapped cache of a batch's (topic, queue id) groups in front of the dict of key tuples:
 * messages of several queues or topics interleaved (explicit queue ids, several topics a batch)
 * would otherwise build a tuple and look it up for every message whose group differs from the
 * one before. The topic is compared by text: equal topics are often distinct str objects. */
#define GROUP_SLOTS 64
typedef struct {
    PyObject *topic; /* borrowed from the group's key tuple; NULL: empty */
    int32_t queue_id, group;
} GroupSlot;

/* The slot of (topic, queue id); NULL with an exception when the topic cannot be hashed. */
static inline GroupSlot *group_slot(GroupSlot *slots, PyObject *topic, int32_t queue_id) {
    Py_hash_t h = PyObject_Hash(topic);
    if (h == -1)
        return NULL;
    uint64_t mix = ((uint64_t)h ^ ((uint64_t)(uint32_t)queue_id * 0x9E3779B97F4A7C15ULL)) * 0x9E3779B97F4A7C15ULL;
    return &slots[mix >> 58]; /* the top 6 bits: GROUP_SLOTS == 64 */
}

/* Message indexes ordered by group, stable (a counting sort), and each group's bounds in that
 * order: group g is order[bounds[g]:bounds[g + 1]]. Both as native Py_ssize_t bytes. */
static int group_order(const int32_t *gids, Py_ssize_t n, Py_ssize_t groups, PyObject **order_obj,
                       PyObject **bounds_obj) {
    *order_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Py_ssize_t));
    *bounds_obj = PyBytes_FromStringAndSize(NULL, (groups + 1) * (Py_ssize_t)sizeof(Py_ssize_t));
    Py_ssize_t *next = PyMem_Calloc((size_t)groups + 1, sizeof(Py_ssize_t));
    if (*order_obj == NULL || *bounds_obj == NULL || next == NULL) {
        if (next == NULL)
            PyErr_NoMemory();
        PyMem_Free(next);
        return -1;
    }
    Py_ssize_t *order = (Py_ssize_t *)PyBytes_AS_STRING(*order_obj);
    Py_ssize_t *bounds = (Py_ssize_t *)PyBytes_AS_STRING(*bounds_obj);
    for (Py_ssize_t j = 0; j < n; j++)
        next[gids[j] + 1]++;
    for (Py_ssize_t g = 0; g < groups; g++)
        next[g + 1] += next[g];
    memcpy(bounds, next, ((size_t)groups + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t j = 0; j < n; j++)
        order[next[gids[j]]++] = j;
    PyMem_Free(next);
    return 0;
}

static PyObject *encode(PyObject *module, PyObject *args) {
    PyObject *seq;
    Py_buffer host;
    long long now_ms;
    Py_ssize_t max_buffer;
    Rules r = {0};
    (void)module;
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode before bind()");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!Olnnny*Ln:encode", &seq, &PyDict_Type, &r.topics, &r.choose, &r.max_queues,
                          &r.max_body, &r.max_record, &r.max_properties, &host, &now_ms, &max_buffer))
        return NULL;
    r.now_ms = now_ms;
    r.store_host_len = host.len;
    PyObject *result = NULL, *pinned = NULL, *records = NULL, *sizes_obj = NULL, *qids_obj = NULL,
             *gids_obj = NULL, *gkeys = NULL, *gindex = NULL, *tags_obj = NULL, *hashes_obj = NULL,
             *imsg_obj = NULL, *order_obj = NULL, *bounds_obj = NULL;
    Item *items = NULL;
    uint8_t *scratch = NULL;
    Py_ssize_t n = 0, filled = 0;
    r.chosen = PyDict_New();
    if (r.chosen == NULL)
        goto done;
    if ((!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) || (host.len != HOST_V4 && host.len != HOST_V6) ||
        PySequence_Fast_GET_SIZE(seq) == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    pinned = PySequence_Tuple(seq); /* a list could change under us; a tuple cannot */
    if (pinned == NULL)
        goto done;
    n = PyTuple_GET_SIZE(pinned);
    items = PyMem_Calloc((size_t)n, sizeof(Item));
    sizes_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    qids_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    gids_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    tags_obj = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    gkeys = PyList_New(0);
    gindex = PyDict_New();
    if (items == NULL || sizes_obj == NULL || qids_obj == NULL || gids_obj == NULL || tags_obj == NULL ||
        gkeys == NULL || gindex == NULL) {
        if (items == NULL)
            PyErr_NoMemory();
        goto done;
    }
    int64_t *sizes = (int64_t *)PyBytes_AS_STRING(sizes_obj);
    int32_t *qids = (int32_t *)PyBytes_AS_STRING(qids_obj), *gids = (int32_t *)PyBytes_AS_STRING(gids_obj);
    int64_t *tcodes = (int64_t *)PyBytes_AS_STRING(tags_obj);
    Py_ssize_t total_bytes = 0, total_keys = 0, longest = 0;
    PyObject *last_topic = NULL;
    long last_qid = -1, last_gid = -1;
    GroupSlot slots[GROUP_SLOTS];
    memset(slots, 0, sizeof slots);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *m = PyTuple_GET_ITEM(pinned, j);
        int ok = check_one(&r, m, &items[j], &sizes[j]);
        filled = j + 1;
        if (ok < 0)
            goto done;
        if (ok == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        total_bytes += sizes[j];
        total_keys += items[j].key_count + (items[j].uniq != NULL);
        if (items[j].props_len > longest)
            longest = items[j].props_len;
        qids[j] = items[j].queue_id;
        /* the (topic, queue id) group, in first-seen order */
        PyObject *topic = field(m, F_TOPIC);
        GroupSlot *slot = NULL;
        if (topic == last_topic && qids[j] == last_qid) {
            gids[j] = (int32_t)last_gid;
        } else if ((slot = group_slot(slots, topic, qids[j])) == NULL) {
            goto done;
        } else if (slot->topic != NULL && slot->queue_id == qids[j] && same_text(slot->topic, topic)) {
            last_gid = slot->group;
            last_topic = topic;
            last_qid = qids[j];
            gids[j] = (int32_t)last_gid;
        } else {
            PyObject *key = Py_BuildValue("(Oi)", topic, qids[j]);
            if (key == NULL)
                goto done;
            PyObject *g = PyDict_GetItemWithError(gindex, key);
            if (g == NULL) {
                if (PyErr_Occurred() || PyList_Append(gkeys, key) < 0) {
                    Py_DECREF(key);
                    goto done;
                }
                g = PyLong_FromSsize_t(PyList_GET_SIZE(gkeys) - 1);
                if (g == NULL || PyDict_SetItem(gindex, key, g) < 0) {
                    Py_XDECREF(g);
                    Py_DECREF(key);
                    goto done;
                }
                Py_DECREF(g);
            }
            last_gid = PyLong_AsLong(g);
            Py_DECREF(key);
            /* the group's key tuple in gkeys holds its topic for the rest of the call */
            *slot = (GroupSlot){PyTuple_GET_ITEM(PyList_GET_ITEM(gkeys, last_gid), 0), qids[j], (int32_t)last_gid};
            last_topic = topic;
            last_qid = qids[j];
            gids[j] = (int32_t)last_gid;
        }
        tcodes[j] = tags_code_of(&items[j]);
    }
    if (total_bytes > max_buffer) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    records = PyByteArray_FromStringAndSize(NULL, total_bytes);
    hashes_obj = PyBytes_FromStringAndSize(NULL, total_keys * (Py_ssize_t)sizeof(uint32_t));
    imsg_obj = PyBytes_FromStringAndSize(NULL, total_keys * (Py_ssize_t)sizeof(int64_t));
    Py_ssize_t room = 4 * 32767 + longest; /* a topic's UTF-8 bytes, '#', the longest key */
    scratch = PyMem_Malloc((size_t)room);
    if (records == NULL || hashes_obj == NULL || imsg_obj == NULL || scratch == NULL) {
        if (scratch == NULL)
            PyErr_NoMemory();
        goto done;
    }
    uint32_t *hashes = (uint32_t *)PyBytes_AS_STRING(hashes_obj);
    int64_t *imsgs = (int64_t *)PyBytes_AS_STRING(imsg_obj);
    Out o = {(uint8_t *)PyByteArray_AS_STRING(records), (uint8_t *)PyByteArray_AS_STRING(records)};
    Py_ssize_t key_at = 0, prefix = 0;
    last_topic = NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *topic = field(PyTuple_GET_ITEM(pinned, j), F_TOPIC);
        if (topic == NULL || !PyUnicode_CheckExact(topic))
            goto changed;
        if (topic != last_topic) {
            if (set_prefix(scratch, topic, &prefix) < 0)
                goto done;
            last_topic = topic;
        }
        o.end = o.at + sizes[j];
        Py_ssize_t first_key = key_at;
        int rc = 0;
        if (items[j].uniq != NULL) /* the UNIQ_KEY's item first, then the KEYS', as RocketMQ */
            rc = key_at < total_keys ? hash_uniq(&items[j], scratch, prefix, room, &hashes[key_at++]) : -1;
        if (rc == 0)
            rc = write_one(&items[j], &o, sizes[j], host.buf, host.len, scratch, prefix, room, hashes, &key_at,
                           total_keys);
        if (rc == -2)
            goto done;
        if (rc < 0)
            goto changed;
        for (Py_ssize_t k = first_key; k < key_at; k++)
            imsgs[k] = j;
    }
    if (key_at != total_keys)
        goto changed;
    if (group_order(gids, n, PyList_GET_SIZE(gkeys), &order_obj, &bounds_obj) < 0)
        goto done;
    result = Py_BuildValue("(OOOOOOOOO)", records, sizes_obj, qids_obj, order_obj, bounds_obj, gkeys, tags_obj,
                           hashes_obj, imsg_obj);
    goto done;
changed:
    PyErr_SetString(PyExc_RuntimeError, "a message of the batch changed while it was being encoded");
done:
    if (items != NULL)
        release_items(items, filled);
    PyMem_Free(items);
    PyMem_Free(scratch);
    Py_XDECREF(r.chosen);
    Py_XDECREF(pinned);
    Py_XDECREF(records);
    Py_XDECREF(sizes_obj);
    Py_XDECREF(qids_obj);
    Py_XDECREF(gids_obj);
    Py_XDECREF(order_obj);
    Py_XDECREF(bounds_obj);
    Py_XDECREF(gkeys);
    Py_XDECREF(gindex);
    Py_XDECREF(tags_obj);
    Py_XDECREF(hashes_obj);
    Py_XDECREF(imsg_obj);
    PyBuffer_Release(&host);
    return result;
}

/* ------------------------------------------------------------------ encode_one */

PyDoc_STRVAR(encode_one_doc,
             "encode_one(message, topic, entry, key, limits, store_host, now_ms, topic_keys, /)\n--\n\n"
             "The single put's record, checked and written as encode() writes a batch's: "
             "(key, record bytes, tags code, index hashes, position of STORETIMESTAMP in the record, "
             "record size) - what tierd.local.prepare calls PreparedOne - or None for a message a rule "
             "rejects or whose values are of other types (the Python path then raises or converts). "
             "topic is message.topic as the caller read it and entry its (magic, topic part); key the "
             "(topic, queue id) the store chose for a message without a queue id, else None; limits "
             "(max_queues, max_body, max_record, max_properties); topic_keys the topic's cached "
             "(topic, queue id) tuples by queue id (or None): a message with its own queue id gets "
             "the cached tuple, not a new one that would live until dispatched. Index hashes: an int "
             "for one key, else a tuple. Queue offset, physical offset and store timestamp stay zero: "
             "place() writes them.");

/* topic_keys[queue_id] when it is that topic's (topic, queue_id) tuple, else NULL (borrowed).
 * Every tracked object a put makes lives until the dispatcher takes the record; one per put
 * fewer halves what young collections promote, and so how often a full one runs. */
static PyObject *cached_key(PyObject *topic_keys, PyObject *topic, int32_t queue_id) {
    if (!PyList_CheckExact(topic_keys) || queue_id < 0 || queue_id >= PyList_GET_SIZE(topic_keys))
        return NULL;
    PyObject *k = PyList_GET_ITEM(topic_keys, queue_id);
    int overflow = 0;
    if (!PyTuple_CheckExact(k) || PyTuple_GET_SIZE(k) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(k, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(k, 1)) ||
        PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(k, 1), &overflow) != queue_id || overflow != 0 ||
        !same_text(PyTuple_GET_ITEM(k, 0), topic))
        return NULL;
    return k;
}

static int as_ssize(PyObject *o, Py_ssize_t *out) {
    *out = PyLong_AsSsize_t(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *encode_one(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "encode_one takes 8 arguments");
        return NULL;
    }
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_one before bind()");
        return NULL;
    }
    PyObject *m = args[0], *key = args[3], *limits = args[4], *host = args[5];
    Rules r = {0};
    r.topic = args[1];
    r.entry = args[2];
    r.queue_id = -1;
    if (!PyTuple_CheckExact(limits) || PyTuple_GET_SIZE(limits) != 4 || !PyBytes_CheckExact(host) ||
        !PyTuple_CheckExact(r.entry) || PyTuple_GET_SIZE(r.entry) != 2 ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(r.entry, 1))) {
        PyErr_SetString(PyExc_TypeError, "encode_one: limits, store_host or entry of the wrong type");
        return NULL;
    }
    Py_ssize_t max_queues;
    long long now_ms = PyLong_AsLongLong(args[6]);
    if ((now_ms == -1 && PyErr_Occurred()) || as_ssize(PyTuple_GET_ITEM(limits, 0), &max_queues) < 0 ||
        as_ssize(PyTuple_GET_ITEM(limits, 1), &r.max_body) < 0 ||
        as_ssize(PyTuple_GET_ITEM(limits, 2), &r.max_record) < 0 ||
        as_ssize(PyTuple_GET_ITEM(limits, 3), &r.max_properties) < 0)
        return NULL;
    r.max_queues = (long)max_queues;
    r.now_ms = now_ms;
    r.store_host_len = PyBytes_GET_SIZE(host);
    if (key != Py_None) {
        if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(key, 1))) {
            PyErr_SetString(PyExc_TypeError, "encode_one: key must be (topic, queue id)");
            return NULL;
        }
        r.queue_id = PyLong_AsLong(PyTuple_GET_ITEM(key, 1));
        if (r.queue_id == -1 && PyErr_Occurred())
            return NULL;
    }
    if (r.store_host_len != HOST_V4 && r.store_host_len != HOST_V6)
        Py_RETURN_NONE;
    Item it;
    memset(&it, 0, sizeof it);
    int64_t size = 0;
    PyObject *result = NULL, *record = NULL, *hashes = NULL, *qkey = NULL;
    uint32_t hash_room[16], *hs = hash_room;
    uint8_t scratch_room[512], *scratch = scratch_room;
    int ok = check_one(&r, m, &it, &size);
    if (ok <= 0) {
        if (ok == 0)
            result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t total_keys = it.key_count + (it.uniq != NULL), prefix = 0;
    Py_ssize_t topic_len;
    if (PyUnicode_AsUTF8AndSize(r.topic, &topic_len) == NULL)
        goto done;
    Py_ssize_t room = topic_len + 1 + it.props_len; /* "topic#" and any key or UNIQ_KEY value */
    if (total_keys > (Py_ssize_t)(sizeof hash_room / sizeof hash_room[0]))
        hs = PyMem_Malloc((size_t)total_keys * sizeof(uint32_t));
    if (room > (Py_ssize_t)sizeof scratch_room)
        scratch = PyMem_Malloc((size_t)room);
    record = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (hs == NULL || scratch == NULL || record == NULL) {
        if (record != NULL)
            PyErr_NoMemory();
        goto done;
    }
    if (set_prefix(scratch, r.topic, &prefix) < 0)
        goto done;
    uint8_t *at = (uint8_t *)PyBytes_AS_STRING(record);
    Out o = {at, at + size};
    Py_ssize_t key_at = 0;
    int rc = it.uniq != NULL ? hash_uniq(&it, scratch, prefix, room, &hs[key_at++]) : 0; /* as in encode() */
    if (rc == 0)
        rc = write_one(&it, &o, size, (const uint8_t *)PyBytes_AS_STRING(host), r.store_host_len, scratch, prefix,
                       room, hs, &key_at, total_keys);
    if (rc == -2)
        goto done;
    if (rc < 0 || key_at != total_keys) {
        PyErr_SetString(PyExc_RuntimeError, "the message changed while it was being encoded");
        goto done;
    }
    if (total_keys == 1) {
        hashes = PyLong_FromUnsignedLong(hs[0]);
    } else {
        hashes = PyTuple_New(total_keys);
        for (Py_ssize_t k = 0; hashes != NULL && k < total_keys; k++) {
            PyObject *h = PyLong_FromUnsignedLong(hs[k]);
            if (h == NULL)
                Py_CLEAR(hashes);
            else
                PyTuple_SET_ITEM(hashes, k, h);
        }
    }
    if (key != Py_None) {
        qkey = Py_NewRef(key);
    } else if ((qkey = cached_key(args[7], r.topic, it.queue_id)) != NULL) {
        Py_INCREF(qkey);
    } else {
        PyObject *qid = PyLong_FromLong(it.queue_id);
        qkey = qid != NULL ? PyTuple_Pack(2, r.topic, qid) : NULL;
        Py_XDECREF(qid);
    }
    if (hashes == NULL || qkey == NULL)
        goto done;
    Py_ssize_t born_len = it.born ? PyBytes_GET_SIZE(it.born) : r.store_host_len;
    /* The tuple built directly: Py_BuildValue parses its format string on every put. */
    PyObject *tags = PyLong_FromLongLong((long long)tags_code_of(&it));
    PyObject *ts_at = PyLong_FromSsize_t((Py_ssize_t)(POS_STORE_TIMESTAMP + born_len - HOST_V4));
    PyObject *sz = PyLong_FromSsize_t((Py_ssize_t)size);
    if (tags != NULL && ts_at != NULL && sz != NULL)
        result = PyTuple_Pack(6, qkey, record, tags, hashes, ts_at, sz);
    Py_XDECREF(tags);
    Py_XDECREF(ts_at);
    Py_XDECREF(sz);
done:
    release_items(&it, 1);
    if (hs != hash_room)
        PyMem_Free(hs);
    if (scratch != scratch_room)
        PyMem_Free(scratch);
    Py_XDECREF(record);
    Py_XDECREF(hashes);
    Py_XDECREF(qkey);
    return result;
}

PyDoc_STRVAR(place_doc,
             "place(buffer, position, record, queue_offset, physical_offset, store_timestamp, "
             "store_timestamp_at, /)\n--\n\n"
             "Copy a record encode_one() made into the writable buffer at position and write where and "
             "when it landed (STORETIMESTAMP at store_timestamp_at within the record). ValueError when "
             "it does not fit.");

static PyObject *place(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7 || !PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "place takes 7 arguments, the record as bytes");
        return NULL;
    }
    Py_ssize_t pos, ts_at;
    long long qoff = PyLong_AsLongLong(args[3]), phys, store_ts;
    if (qoff == -1 && PyErr_Occurred())
        return NULL;
    phys = PyLong_AsLongLong(args[4]);
    if (phys == -1 && PyErr_Occurred())
        return NULL;
    store_ts = PyLong_AsLongLong(args[5]);
    if ((store_ts == -1 && PyErr_Occurred()) || as_ssize(args[1], &pos) < 0 || as_ssize(args[6], &ts_at) < 0)
        return NULL;
    Py_buffer dst;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE) < 0)
        return NULL;
    Py_ssize_t len = PyBytes_GET_SIZE(args[2]);
    if (len < MIN_RECORD_SIZE || pos < 0 || pos > dst.len - len || ts_at < POS_STORE_TIMESTAMP ||
        ts_at > len - (Py_ssize_t)sizeof(uint64_t)) {
        PyBuffer_Release(&dst);
        PyErr_Format(PyExc_ValueError, "a record of %zd bytes does not fit at %zd of %zd bytes", len, pos, dst.len);
        return NULL;
    }
    uint8_t *r = (uint8_t *)dst.buf + pos;
    memcpy(r, PyBytes_AS_STRING(args[2]), (size_t)len);
    put_u64(r + POS_QUEUE_OFFSET, (uint64_t)qoff);
    put_u64(r + POS_PHYSICAL_OFFSET, (uint64_t)phys);
    put_u64(r + ts_at, (uint64_t)store_ts);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ untrack_tuple */

PyDoc_STRVAR(untrack_tuple_doc,
             "untrack_tuple(t, /)\n--\n\n"
             "t itself, taken off the cyclic collector's lists when every item is an int, str, bytes, "
             "None or a tuple of those: such a tuple can never be part of a reference cycle. A single "
             "put's dispatch record lives until the dispatcher takes it, so young collections promote "
             "many of them, and every promoted object brings the next full pass over the application's "
             "whole heap closer. Any other tuple is returned as it is, still tracked.");

static inline int atomic(PyObject *o) {
    return PyLong_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o) || o == Py_None;
}

static PyObject *untrack_tuple(PyObject *module, PyObject *t) {
    (void)module;
    if (!PyTuple_CheckExact(t)) {
        PyErr_SetString(PyExc_TypeError, "untrack_tuple takes a tuple");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *o = PyTuple_GET_ITEM(t, i);
        if (atomic(o))
            continue;
        if (!PyTuple_CheckExact(o))
            return Py_NewRef(t);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(o); j++)
            if (!atomic(PyTuple_GET_ITEM(o, j)))
                return Py_NewRef(t);
    }
    if (PyObject_GC_IsTracked(t))
        PyObject_GC_UnTrack(t);
    return Py_NewRef(t);
}

/* ------------------------------------------------------------------ stamp */

PyDoc_STRVAR(stamp_doc,
             "stamp(records, start, count, queue_offsets, first_physical_offset, store_timestamp, /) -> int\n"
             "--\n\n"
             "Write the placement of count records of records (as encode made them) starting at byte "
             "start: queue offsets from queue_offsets (native int64, one per record), physical offsets "
             "first_physical_offset + (position - start), the store timestamp. Returns the byte after the "
             "last one; ValueError when the records do not fit in the buffer.");

static PyObject *stamp(PyObject *module, PyObject *args) {
    Py_buffer buf, qoffs;
    Py_ssize_t start, count;
    long long first_phys, store_ts;
    (void)module;
    if (!PyArg_ParseTuple(args, "w*ny*nLL:stamp", &buf, &start, &qoffs, &count, &first_phys, &store_ts))
        return NULL;
    uint8_t *data = buf.buf;
    const int64_t *q = qoffs.buf;
    Py_ssize_t pos = start;
    PyObject *result = NULL;
    if (qoffs.len < count * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "fewer queue offsets than records");
        goto out;
    }
    Py_ssize_t i = 0;
    for (; i < count; i++) {
        if (pos < 0 || pos > buf.len - HEADER_V4)
            break;
        uint32_t size = be_u32(data + pos + POS_TOTAL);
        uint32_t sys_flag = be_u32(data + pos + POS_SYSFLAG);
        Py_ssize_t after_born = (sys_flag & SYSFLAG_BORNHOST_V6) ? HOST_V6 - HOST_V4 : 0;
        if (size < MIN_RECORD_SIZE || (Py_ssize_t)size > buf.len - pos)
            break;
        uint8_t *r = data + pos;
        put_u64(r + POS_QUEUE_OFFSET, (uint64_t)q[i]);
        put_u64(r + POS_PHYSICAL_OFFSET, (uint64_t)first_phys + (uint64_t)(pos - start));
        put_u64(r + POS_STORE_TIMESTAMP + after_born, (uint64_t)store_ts);
        pos += size;
    }
    if (i == count) {
        result = PyLong_FromSsize_t(pos);
        goto out;
    }
    PyErr_Format(PyExc_ValueError, "%zd records from byte %zd do not fit in the buffer", count, start);
out:
    PyBuffer_Release(&qoffs);
    PyBuffer_Release(&buf);
    return result;
}

/* ------------------------------------------------------------------ the functions (_records.c) */

PyMethodDef records_encode_methods[] = {
    {"bind_encoder", bind, METH_VARARGS, bind_doc},
    {"encode", encode, METH_VARARGS, encode_doc},
    {"stamp", stamp, METH_VARARGS, stamp_doc},
    {"encode_one", (PyCFunction)(void (*)(void))encode_one, METH_FASTCALL, encode_one_doc},
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, place_doc},
    {"key_hash", key_hash, METH_O, key_hash_doc},
    {"untrack_tuple", untrack_tuple, METH_O, untrack_tuple_doc},
    {NULL, NULL, 0, NULL},
};
