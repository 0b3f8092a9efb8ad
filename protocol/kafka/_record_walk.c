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
            for (int64_t i = 0; i < h && st == OK; i++) {
                if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
                int64_t size = zigzag(raw);
                if (size < 0) {
                    snprintf(message, sizeof message, "record %zd has header key length %lld",
                             index, (long long)size);
                    st = DEFECT;
                    break;
                }
                if (size > e - p) {
                    snprintf(message, sizeof message, "record %zd's header runs past its length",
                             index);
                    st = DEFECT;
                    break;
                }
                p += (Py_ssize_t)size;
                if ((st = uvarint(buf, end, &p, 5, &raw)) != OK) break;
                size = zigzag(raw);
                if (size < -1) {
                    snprintf(message, sizeof message, "record %zd has header value length %lld",
                             index, (long long)size);
                    st = DEFECT;
                    break;
                }
                if (size > e - p) {
                    snprintf(message, sizeof message, "record %zd's header runs past its length",
                             index);
                    st = DEFECT;
                    break;
                }
                if (size > 0) p += (Py_ssize_t)size;
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

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Walk the records wholly held in a buffer (record_stream)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_walk", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_walk(void) { return PyModule_Create(&module); }
