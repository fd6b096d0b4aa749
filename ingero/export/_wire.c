/* The Perfetto export's per-event loops in C: the same bytes as threads.py's numpy path.
 *
 * threads.py uses this module where it was built (setup.py builds it with the
 * package: `pip install -e .`, `make setup`) and its numpy code otherwise;
 * tests/unit/test_export_perfetto.py checks that both give the same bytes.
 * markers(): clip and order one window's markers; encode(): their TracePackets.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int vlen(uint64_t v) { return 1 + (63 - __builtin_clzll(v | 1)) / 7; }

static inline uint8_t *put(uint8_t *p, uint64_t v) {
    while (v >= 0x80) { *p++ = (uint8_t)(v | 0x80); v >>= 7; }
    *p++ = (uint8_t)v;
    return p;
}

/* a key (field number, wire type) as a varint */
static inline uint8_t *key(uint8_t *p, unsigned field, unsigned wire) { return put(p, (field << 3) | wire); }
static inline int key_len(unsigned field, unsigned wire) { return vlen((field << 3) | wire); }

/* Markers of one window, thread after thread.
 *
 * markers(order, tidx, ts, end, is_slice, fixed, has_dly, cutoff, last_ts, endc, row, what, delta) -> count
 *   order: the rows sorted by (thread, start, longest first).  The stack walk of clip() (end: a
 *   fixed row's final end; endc[row] written), and in the same pass the markers in the order
 *   threads._markers_numpy sorts them, i.e. by (time, group, order) per thread, i the row's place
 *   among its thread's rows: a begin or instant (ts, 1, 3i), an end (endc, 0, -i) or for a
 *   zero-length slice (ts, 1, 3i+2), a "delayed" instant (max(ts, endc - 1), 1, 3i+1); ends come
 *   off the stack innermost first.  Markers at or after cutoff are not written (the rows stay
 *   open: the caller carries them).  Per marker: row, what (0 begin/instant, 1 end, 2 delayed),
 *   delta (time since the thread's previous marker; last_ts[thread] updated).  Fixed rows
 *   (carried, begun) write no begin.
 */
typedef struct { int64_t time, order, row; } pend_t;

typedef struct {
    int64_t *row, *delta, *last;
    uint8_t *what;
    Py_ssize_t k, cap;
    int64_t cutoff;
    int full;
} sink_t;

static inline int emit(sink_t *s, int64_t time, int64_t row, uint8_t what) {
    if (time >= s->cutoff) return 0;
    if (s->k >= s->cap) { s->full = 1; return 0; }
    s->row[s->k] = row;
    s->what[s->k] = what;
    s->delta[s->k] = time - *s->last;
    *s->last = time;
    s->k++;
    return 1;
}

/* write the pending delayed marks whose key (time, 1, order) is before (time, grp, order) */
static inline void flush_pend(sink_t *s, pend_t *p, Py_ssize_t *np_, int64_t time, int grp, int64_t order) {
    while (*np_) {
        Py_ssize_t best = 0;
        for (Py_ssize_t j = 1; j < *np_; j++)
            if (p[j].time < p[best].time || (p[j].time == p[best].time && p[j].order < p[best].order)) best = j;
        if (p[best].time > time || (p[best].time == time && (grp == 0 || p[best].order >= order))) return;
        emit(s, p[best].time, p[best].row, 2);
        p[best] = p[--*np_];
    }
}

static PyObject *markers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[12];
    long long cutoff;
    if (!PyArg_ParseTuple(args, "OOOOOOOLOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &cutoff,
                          &o[7], &o[8], &o[9], &o[10], &o[11]))
        return NULL;
    const int nb = 12;
    Py_buffer b[12];
    int got = 0;
    PyObject *result = NULL;
    int64_t *stack = NULL;
    pend_t *pend = NULL;
    for (; got < nb; got++) {
        int flags = PyBUF_C_CONTIGUOUS | (got >= 7 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o[got], &b[got], flags) < 0) goto done;
    }
    Py_ssize_t n = b[0].len / 8, cap = b[9].len / 8, nthreads = b[7].len / 8;
    if (b[1].len != n * 8 || b[2].len != n * 8 || b[3].len != n * 8 || b[4].len != n || b[5].len != n ||
        b[6].len != n || b[8].len != n * 8 || b[10].len != cap || b[11].len != cap * 8) {
        PyErr_SetString(PyExc_ValueError, "markers: arrays of inconsistent sizes");
        goto done;
    }
    const int64_t *order = b[0].buf, *tidx = b[1].buf, *ts = b[2].buf, *end = b[3].buf;
    const uint8_t *is_slice = b[4].buf, *fixed = b[5].buf, *has_dly = b[6].buf;
    for (Py_ssize_t i = 0; i < n; i++)
        if (order[i] < 0 || order[i] >= n || tidx[order[i]] < 0 || tidx[order[i]] >= nthreads ||
            (i && tidx[order[i]] < tidx[order[i - 1]])) {
            PyErr_SetString(PyExc_ValueError, "markers: order or thread index out of range, or not sorted");
            goto done;
        }
    int64_t *endc = b[8].buf, *last_ts = b[7].buf;
    stack = PyMem_Malloc((n ? n : 1) * sizeof(int64_t));  /* places in order of the open slices */
    pend = PyMem_Malloc((n ? n : 1) * sizeof(pend_t));
    if (!stack || !pend) { PyErr_NoMemory(); goto done; }
    sink_t s = {b[9].buf, b[11].buf, NULL, b[10].buf, 0, cap, (int64_t)cutoff, 0};
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t a = 0;
    while (a < n) {
        Py_ssize_t z = a;
        int64_t thread = tidx[order[a]];
        while (z < n && tidx[order[z]] == thread) z++;
        s.last = &last_ts[thread];
        Py_ssize_t depth = 0, npend = 0;
        for (Py_ssize_t i = a; i < z; i++) {
            Py_ssize_t r = order[i];
            int64_t t = ts[r], pos = i - a;
            while (depth && endc[order[stack[depth - 1]]] <= t) {  /* ends due: innermost first */
                Py_ssize_t top = stack[--depth];
                int64_t e = endc[order[top]];
                flush_pend(&s, pend, &npend, e, 0, -(top - a));
                emit(&s, e, order[top], 1);
            }
            int64_t e = t;
            if (is_slice[r]) {
                e = end[r];
                if (!fixed[r] && depth && e > endc[order[stack[depth - 1]]]) e = endc[order[stack[depth - 1]]];
            }
            endc[r] = e;
            if (!fixed[r]) {
                flush_pend(&s, pend, &npend, t, 1, 3 * pos);
                emit(&s, t, r, 0);
            }
            if (!is_slice[r]) continue;
            if (has_dly[r]) {
                pend[npend].time = e - 1 > t ? e - 1 : t;
                pend[npend].order = 3 * pos + 1;
                pend[npend].row = r;
                npend++;
            }
            if (e == t) {
                flush_pend(&s, pend, &npend, t, 1, 3 * pos + 2);
                emit(&s, t, r, 1);
            } else {
                stack[depth++] = i;
            }
        }
        while (depth) {
            Py_ssize_t top = stack[--depth];
            int64_t e = endc[order[top]];
            flush_pend(&s, pend, &npend, e, 0, -(top - a));
            emit(&s, e, order[top], 1);
        }
        flush_pend(&s, pend, &npend, INT64_MAX, 1, INT64_MAX);
        a = z;
    }
    Py_END_ALLOW_THREADS
    if (s.full) PyErr_SetString(PyExc_ValueError, "markers: more markers than room");
    else result = PyLong_FromSsize_t(s.k);
done:
    PyMem_Free(stack);
    PyMem_Free(pend);
    for (int j = 0; j < got; j++) PyBuffer_Release(&b[j]);
    return result;
}

enum { MAXARGS = 8 };

/* encode(row, what, delta, seq, is_slice, name, has, val, sval, ann_iids, vfields, delayed_iid,
 *        fout, fin, xoff, extra) -> bytes: one TracePacket per marker (see the top of the file);
 *   name, has, val, sval and fout cover the first rows only (the new ones); the others
 *   (carried from the last window) write no begin.
 *   A begin/instant (what 0) carries row's name, args (has: bit a = numeric arg a present;
 *   sval: string iids, 0 absent) and its flow_ids, extra[xoff[f]:xoff[f + 1]] for f = fout[row];
 *   an end (what 1) only its type; a delayed instant (what 2) delayed_iid and its
 *   terminating_flow_ids, the same for f = fin[row] (entry 0: none). */
static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[15];
    long long delayed;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOLOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9], &o[10], &delayed, &o[11], &o[12], &o[13], &o[14]))
        return NULL;
    Py_buffer b[15];
    int got = 0;
    PyObject *result = NULL;
    int64_t *te = NULL;
    for (; got < 15; got++)
        if (PyObject_GetBuffer(o[got], &b[got], PyBUF_C_CONTIGUOUS) < 0) goto done;
    Py_ssize_t q = b[0].len / 8;              /* markers */
    Py_ssize_t n = b[3].len / 8;              /* rows: seq, is_slice, fin */
    Py_ssize_t nn = b[5].len / 8;             /* the new rows, first (name, has, val, sval, fout): carried
                                                 rows write no begin */
    Py_ssize_t k = b[10].len;                 /* numeric args */
    Py_ssize_t m = b[9].len - k;              /* string args */
    if (b[1].len != q || b[2].len != q * 8 || b[4].len != n || nn > n || b[6].len != nn ||
        b[7].len != k * nn * 8 || m < 0 || b[8].len != m * nn * 8 || b[11].len != nn * 8 ||
        b[12].len != n * 8 || b[13].len < 16 || b[13].len % 8 || k + m > MAXARGS || k > 8) {
        PyErr_SetString(PyExc_ValueError, "encode: arrays of inconsistent sizes");
        goto done;
    }
    const int64_t *row = b[0].buf, *delta = b[2].buf, *seq = b[3].buf, *name = b[5].buf;
    const uint8_t *what = b[1].buf, *is_slice = b[4].buf, *has = b[6].buf;
    const int64_t *val = b[7].buf, *sval = b[8].buf, *fout = b[11].buf, *fin = b[12].buf, *xoff = b[13].buf;
    const uint8_t *iid = b[9].buf, *vfield = b[10].buf, *extra = b[14].buf;
    Py_ssize_t nx = b[13].len / 8 - 1;  /* entries of the extra table */
    for (Py_ssize_t f = 0; f < nx; f++)
        if (xoff[f] < 0 || xoff[f + 1] < xoff[f] || xoff[f + 1] > b[14].len) {
            PyErr_SetString(PyExc_ValueError, "encode: extra offsets out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < n; i++)
        if ((i < nn && (fout[i] < 0 || fout[i] >= nx)) || fin[i] < 0 || fin[i] >= nx) {
            PyErr_SetString(PyExc_ValueError, "encode: flow entry out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < q; i++)
        if (row[i] < 0 || row[i] >= n || what[i] > 2 || (what[i] == 0 && row[i] >= nn)) {
            PyErr_SetString(PyExc_ValueError, "encode: marker out of range");
            goto done;
        }
    for (Py_ssize_t a = 0; a < k + m; a++)
        if (iid[a] >= 0x80) { PyErr_SetString(PyExc_ValueError, "encode: arg iid >= 128"); goto done; }
    int vkey[MAXARGS];
    for (Py_ssize_t a = 0; a < k; a++) vkey[a] = key_len(vfield[a], 0);
    const int skey = key_len(17, 0);
    te = PyMem_Malloc((q ? q : 1) * sizeof(int64_t));
    if (!te) { PyErr_NoMemory(); goto done; }
    Py_ssize_t total = 0;
    for (Py_ssize_t j = 0; j < q; j++) {
        Py_ssize_t i = row[j];
        int w = what[j];
        int64_t body;
        if (w == 1) {
            body = 2;  /* type END */
        } else if (w == 2) {
            body = 2 + 1 + vlen((uint64_t)delayed) + (xoff[fin[i] + 1] - xoff[fin[i]]);
        } else {
            body = 2;  /* type BEGIN or INSTANT */
            if (name[i]) body += 1 + vlen((uint64_t)name[i]);
            for (Py_ssize_t a = 0; a < k; a++)
                if (has[i] >> a & 1) body += 2 + 2 + vkey[a] + vlen((uint64_t)val[a * nn + i]);
            for (Py_ssize_t a = 0; a < m; a++)
                if (sval[a * nn + i]) body += 2 + 2 + skey + vlen((uint64_t)sval[a * nn + i]);
            body += xoff[fout[i] + 1] - xoff[fout[i]];
        }
        te[j] = body;
        int64_t pkt = 1 + vlen((uint64_t)delta[j]) + 1 + vlen((uint64_t)seq[i]) + 1 + vlen((uint64_t)body) + body;
        total += 1 + vlen((uint64_t)pkt) + pkt;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result) goto done;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < q; j++) {
        Py_ssize_t i = row[j];
        int w = what[j];
        int64_t body = te[j];
        int64_t pkt = 1 + vlen((uint64_t)delta[j]) + 1 + vlen((uint64_t)seq[i]) + 1 + vlen((uint64_t)body) + body;
        p = key(p, 1, 2); p = put(p, (uint64_t)pkt);                 /* Trace.packet */
        p = key(p, 8, 0); p = put(p, (uint64_t)delta[j]);            /* timestamp */
        p = key(p, 10, 0); p = put(p, (uint64_t)seq[i]);             /* trusted_packet_sequence_id */
        p = key(p, 11, 2); p = put(p, (uint64_t)body);               /* track_event */
        p = key(p, 9, 0);                                            /* type */
        if (w == 1) { *p++ = 2; continue; }                          /* TYPE_SLICE_END */
        if (w == 2) {
            *p++ = 3;                                                /* TYPE_INSTANT */
            p = key(p, 10, 0); p = put(p, (uint64_t)delayed);        /* name_iid */
            int64_t x = xoff[fin[i] + 1] - xoff[fin[i]];
            if (x) { memcpy(p, extra + xoff[fin[i]], (size_t)x); p += x; }
            continue;
        }
        *p++ = is_slice[i] ? 1 : 3;                                  /* TYPE_SLICE_BEGIN / TYPE_INSTANT */
        if (name[i]) { p = key(p, 10, 0); p = put(p, (uint64_t)name[i]); }
        for (Py_ssize_t a = 0; a < k; a++)
            if (has[i] >> a & 1) {
                uint64_t v = (uint64_t)val[a * nn + i];
                p = key(p, 4, 2); p = put(p, (uint64_t)(2 + vkey[a] + vlen(v)));  /* debug_annotations */
                p = key(p, 1, 0); *p++ = iid[a];                                 /* name_iid */
                p = key(p, vfield[a], 0); p = put(p, v);
            }
        for (Py_ssize_t a = 0; a < m; a++)
            if (sval[a * nn + i]) {
                uint64_t v = (uint64_t)sval[a * nn + i];
                p = key(p, 4, 2); p = put(p, (uint64_t)(2 + skey + vlen(v)));
                p = key(p, 1, 0); *p++ = iid[k + a];
                p = key(p, 17, 0); p = put(p, v);                                /* string_value_iid */
            }
        int64_t x = xoff[fout[i] + 1] - xoff[fout[i]];
        if (x) { memcpy(p, extra + xoff[fout[i]], (size_t)x); p += x; }
    }
    Py_END_ALLOW_THREADS
    if (p != (uint8_t *)PyBytes_AS_STRING(result) + total) {  /* the two passes disagree: a bug here */
        Py_CLEAR(result);
        PyErr_SetString(PyExc_SystemError, "encode: sized and written bytes differ");
    }
done:
    PyMem_Free(te);
    for (int j = 0; j < got; j++) PyBuffer_Release(&b[j]);
    return result;
}

static PyMethodDef methods[] = {
    {"markers", markers, METH_VARARGS, "Clip and order one window's markers, thread after thread."},
    {"encode", encode, METH_VARARGS, "Encode the track-event packets of a window's markers, in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__wire(void) { return PyModule_Create(&module); }
