/* The hot loop of record_stream._Walk.run in C: the same checks, the same messages.
 *
 * Optional: record_stream.py falls back to its Python loop when this module is not
 * built (setup.py builds it where a C compiler is present). Both are held to the same
 * table of malformed batches and a differential test (tests/unit/test_record_stream.py).
 *
 * scan(buf, pos, index, count, base_ts, max_ts, lo, hi, need_key, final)
 *   -> (pos, index, max_ts, flagged)
 * walks the records wholly held in buf from pos, as _Walk.run documents; ``flagged`` is
 * a list of (record index, timestamp, is_key_error) for the per-record rule breaches.
 * A defect raises ValueError with the message the Python loop gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef enum { OK = 0, SHORT = 1, DEFECT = 2 } status_t;

static char message[160];

/* An unsigned varint of at most max_bytes bytes at *p; SHORT when buf ends inside it. */
static status_t uvarint(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *p, int max_bytes,
                        uint64_t *out) {
    uint64_t value = 0;
    Py_ssize_t at = *p;
    for (int i = 0; i < max_bytes; i++) {
        if (at >= end) return SHORT;
        uint8_t b = buf[at++];
        value |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *p = at;
            *out = value;
            return OK;
        }
    }
    snprintf(message, sizeof message, "varint at byte %zd is longer than %d bytes", *p,
             max_bytes);
    return DEFECT;
}

static inline int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t p, index, count;
    long long base_ts, max_ts, lo, hi;
    int need_key, final;
    if (!PyArg_ParseTuple(args, "y*nnnLLLLpp", &view, &p, &index, &count, &base_ts, &max_ts,
                          &lo, &hi, &need_key, &final))
        return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t end = view.len;
    PyObject *flagged = PyList_New(0);
    if (flagged == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    status_t st = OK;
    Py_ssize_t start = p, e = -1;
    uint64_t raw;
    while (index < count && p < end) {
        start = p;
        e = -1;
        if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
        int64_t n = zigzag(raw);
        if (n < 6) {
            snprintf(message, sizeof message, "record %zd has length %lld, below the minimum",
                     index, (long long)n);
            st = DEFECT;
            break;
        }
        if (n > end - p) {
            if (final) {
                snprintf(message, sizeof message, "record %zd of %lld bytes runs past the batch's end",
                         index, (long long)n);
                st = DEFECT;
            } else {
                st = SHORT;
            }
            break;
        }
        e = p + n;
        p += 1; /* attributes: unused in v2 */
        if ((st = uvarint(buf, end, &p, 10, &raw)) != OK) break;
        int64_t delta = zigzag(raw), ts;
        if (__builtin_add_overflow((int64_t)base_ts, delta, &ts)) {
            snprintf(message, sizeof message, "record %zd's timestamp delta overflows", index);
            st = DEFECT;
            break;
        }
        if (ts > max_ts) max_ts = ts;
        if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
        if (raw != (uint64_t)index << 1) {
            snprintf(message, sizeof message, "record %zd has offset delta %lld, not %zd", index,
                     (long long)zigzag(raw), index);
            st = DEFECT;
            break;
        }
        int keyless = 0;
        const char *what[2] = {"key", "value"};
        for (int field = 0; field < 2; field++) {
            if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
            if (raw & 1) {
                if (raw != 1) {
                    snprintf(message, sizeof message, "record %zd has %s length %lld", index,
                             what[field], (long long)zigzag(raw));
                    st = DEFECT;
                    break;
                }
                if (field == 0) keyless = 1;
            } else {
                if ((int64_t)(raw >> 1) > e - p) {
                    snprintf(message, sizeof message, "record %zd's %s runs past its length",
                             index, what[field]);
                    st = DEFECT;
                    break;
                }
                p += (Py_ssize_t)(raw >> 1);
            }
        }
        if (st != OK) break;
        if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
        if (raw) {
            int64_t h = zigzag(raw);
            if (h < 0 || h > (e - p) / 2) {
                snprintf(message, sizeof message, "record %zd has %lld headers", index,
                         (long long)h);
                st = DEFECT;
                break;
            }
            /* A header's key and value: one grammar, each with the least length it may
             * have (a key is never null), as record_stream._HEADER_FIELDS. */
            static const char *header_what[2] = {"key", "value"};
            static const int64_t header_least[2] = {0, -1};
            for (int64_t i = 0; i < h && st == OK; i++) {
                for (int field = 0; field < 2; field++) {
                    if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
                    int64_t size = zigzag(raw);
                    if (size < header_least[field]) {
                        snprintf(message, sizeof message,
                                 "record %zd has header %s length %lld", index,
                                 header_what[field], (long long)size);
                        st = DEFECT;
                        break;
                    }
                    if (size > e - p) {
                        snprintf(message, sizeof message,
                                 "record %zd's header runs past its length", index);
                        st = DEFECT;
                        break;
                    }
                    if (size > 0) p += (Py_ssize_t)size;
                }
            }
            if (st != OK) break;
        }
        if (p != e) {
            snprintf(message, sizeof message,
                     "record %zd declares %lld bytes but holds other fields", index, (long long)n);
            st = DEFECT;
            break;
        }
        int bad_key = need_key && keyless;
        int bad_ts = (ts < lo || ts > hi) && ts != -1;
        if (bad_key || bad_ts) {
            PyObject *item = Py_BuildValue("(nLi)", index, (long long)ts, bad_key);
            if (item == NULL || PyList_Append(flagged, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(flagged);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(item);
        }
        index++;
    }
    PyBuffer_Release(&view);
    if (st == SHORT) {
        if (e >= 0 || final) {
            snprintf(message, sizeof message, "record %zd's fields run past the batch's end",
                     index);
            st = DEFECT;
        } else {
            p = start;
        }
    }
    if (st == DEFECT) {
        Py_DECREF(flagged);
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    return Py_BuildValue("(nnLN)", p, index, max_ts, flagged);
}

/* --- our own batches' records: a msgpack array of [ts_delta, key, value(, headers)] --- */

/* The length of a msgpack array header at *p (fixarray, array16, array32); -1 if not one. */
static int64_t mp_array(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *p) {
    if (*p >= end) return -1;
    uint8_t b = buf[*p];
    if (b >= 0x90 && b <= 0x9F) {
        *p += 1;
        return b & 0x0F;
    }
    if (b == 0xDC && end - *p >= 3) {
        int64_t n = ((int64_t)buf[*p + 1] << 8) | buf[*p + 2];
        *p += 3;
        return n;
    }
    if (b == 0xDD && end - *p >= 5) {
        int64_t n = ((int64_t)buf[*p + 1] << 24) | ((int64_t)buf[*p + 2] << 16) |
                    ((int64_t)buf[*p + 3] << 8) | buf[*p + 4];
        *p += 5;
        return n;
    }
    return -1;
}

/* A msgpack integer that fits int64; 0 on success. */
static int mp_int(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *p, int64_t *out) {
    if (*p >= end) return -1;
    uint8_t b = buf[*p];
    if (b <= 0x7F || b >= 0xE0) {
        *out = (int8_t)b;
        *p += 1;
        return 0;
    }
    int size;
    int is_signed;
    switch (b) {
    case 0xCC: size = 1; is_signed = 0; break;
    case 0xCD: size = 2; is_signed = 0; break;
    case 0xCE: size = 4; is_signed = 0; break;
    case 0xCF: size = 8; is_signed = 0; break;
    case 0xD0: size = 1; is_signed = 1; break;
    case 0xD1: size = 2; is_signed = 1; break;
    case 0xD2: size = 4; is_signed = 1; break;
    case 0xD3: size = 8; is_signed = 1; break;
    default: return -1;
    }
    if (end - *p < 1 + size) return -1;
    uint64_t v = 0;
    for (int i = 1; i <= size; i++) v = (v << 8) | buf[*p + i];
    if (is_signed) {
        int shift = 64 - 8 * size;
        *out = shift ? ((int64_t)(v << shift)) >> shift : (int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
    }
    *p += 1 + size;
    return 0;
}

/* A str (name = 1) or a bin or nil (name = 0: *is_nil says which); 0 on success. */
static int mp_blob(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *p, int name, int *is_nil) {
    if (*p >= end) return -1;
    uint8_t b = buf[*p];
    *is_nil = 0;
    int64_t n;
    int head;
    if (!name && b == 0xC0) {
        *is_nil = 1;
        *p += 1;
        return 0;
    }
    if (name && b >= 0xA0 && b <= 0xBF) {
        n = b & 0x1F;
        head = 1;
    } else if (b == (name ? 0xD9 : 0xC4)) {
        if (end - *p < 2) return -1;
        n = buf[*p + 1];
        head = 2;
    } else if (b == (name ? 0xDA : 0xC5)) {
        if (end - *p < 3) return -1;
        n = ((int64_t)buf[*p + 1] << 8) | buf[*p + 2];
        head = 3;
    } else if (b == (name ? 0xDB : 0xC6)) {
        if (end - *p < 5) return -1;
        n = ((int64_t)buf[*p + 1] << 24) | ((int64_t)buf[*p + 2] << 16) |
            ((int64_t)buf[*p + 3] << 8) | buf[*p + 4];
        head = 5;
    } else {
        return -1;
    }
    if (n > end - *p - head) return -1;
    *p += head + n;
    return 0;
}

/* scan_rows(buf, pos, end, count, first_ts, lo, hi, need_key) -> (max_ts, flagged)
 * Our batch's records (buf[pos:end], a msgpack array of count records), each
 * [int ts_delta, bin/nil key, bin/nil value(, [[str name, bin/nil value], ...])] and
 * nothing after them; ValueError naming the first that is not. ``flagged`` as scan's. */
static PyObject *scan_rows(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t p, end, count;
    long long first_ts, lo, hi;
    int need_key;
    if (!PyArg_ParseTuple(args, "y*nnnLLLp", &view, &p, &end, &count, &first_ts, &lo, &hi,
                          &need_key))
        return NULL;
    const uint8_t *buf = view.buf;
    if (end > view.len || p < 0 || p > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records out of the buffer");
        return NULL;
    }
    PyObject *flagged = PyList_New(0);
    if (flagged == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t max_ts = INT64_MIN;
    Py_ssize_t index = 0;
    const char *bad = NULL;
    if (mp_array(buf, end, &p) != count) {
        PyBuffer_Release(&view);
        Py_DECREF(flagged);
        PyErr_SetString(PyExc_ValueError, "the records are not an array of record_count records");
        return NULL;
    }
    for (; bad == NULL && index < count; index++) {
        int64_t fields = mp_array(buf, end, &p);
        if (fields != 3 && fields != 4) {
            bad = "is not [ts_delta, key, value(, headers)]";
            break;
        }
        int64_t delta, ts;
        int key_nil, value_nil, nil;
        (void)value_nil;
        if (mp_int(buf, end, &p, &delta) != 0) {
            bad = "has a timestamp delta that is not an int64";
            break;
        }
        if (__builtin_add_overflow((int64_t)first_ts, delta, &ts)) {
            bad = "has a timestamp delta that overflows";
            break;
        }
        if (mp_blob(buf, end, &p, 0, &key_nil) != 0 || mp_blob(buf, end, &p, 0, &value_nil) != 0) {
            bad = "has a key or value that is not bytes or nil";
            break;
        }
        if (fields == 4) {
            int64_t headers = mp_array(buf, end, &p);
            if (headers < 0) {
                bad = "has headers that are not an array";
                break;
            }
            for (int64_t h = 0; h < headers; h++) {
                if (mp_array(buf, end, &p) != 2 || mp_blob(buf, end, &p, 1, &nil) != 0 ||
                    mp_blob(buf, end, &p, 0, &nil) != 0) {
                    bad = "has a header that is not [str, bytes/nil]";
                    break;
                }
            }
            if (bad != NULL) break;
        }
        if (ts > max_ts) max_ts = ts;
        int bad_key = need_key && key_nil;
        int bad_ts = (ts < lo || ts > hi) && ts != -1;
        if (bad_key || bad_ts) {
            PyObject *item = Py_BuildValue("(nLi)", index, (long long)ts, bad_key);
            if (item == NULL || PyList_Append(flagged, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(flagged);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(item);
        }
    }
    if (bad == NULL && p != end) {
        index = count - 1;
        bad = "is followed by bytes that are no record";
    }
    PyBuffer_Release(&view);
    if (bad != NULL) {
        Py_DECREF(flagged);
        snprintf(message, sizeof message, "record %zd %s", index, bad);
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    return Py_BuildValue("(LN)", (long long)max_ts, flagged);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Walk the records wholly held in a buffer (record_stream)."},
    {"scan_rows", scan_rows, METH_VARARGS, "Walk our own batch's msgpack records."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) { return PyModule_Create(&module); }
