/* The trace's export: the ring's events as columns numpy reads with no copy (Note [Columns of a
 * trace] in data/columns.py), written in one pass into zeroed buffers of our own, and the
 * stack column renumbered in place (Note [Exporting ten million events]). */
#include "core.h"

#include <sys/mman.h>
#include <unistd.h>

/* Note [Exporting ten million events]: a snapshot of a ring of 10 M events writes ~530 MB of
 * columns, and on fresh memory the page faults cost as much as the copying: 4 KiB at a time,
 * over 100k faults, each zeroing its page. So:
 * - a column of 2 MiB or more is a mapping of its own; one that every event writes is faulted
 *   in whole by the mmap call (MAP_POPULATE: one call, not a fault a page; measured at 10 M
 *   events, 0.33 s a snapshot became 0.24 s). Transparent huge pages (MADV_HUGEPAGE) made a
 *   later snapshot faster (0.10 s) but the first one slower and erratic (0.17 to 0.6 s: the
 *   kernel finds or compacts 2 MiB of never-used memory for each), so they are not asked for;
 *   smaller columns come from PyMem_Calloc;
 * - the buffers start zeroed, so a zero is never written: the columns that are mostly zero
 *   (stream on the default stream, device_free) are not faulted in, and a reader finds the
 *   kernel's shared zero page where no event wrote;
 * - the events are read once, oldest first, in the ring's two runs, with a cursor over the
 *   Rare side list (Note [A ring of 32-byte events]); the cell column is filled run by run;
 * - the stack column holds each event's slot in the stack table; the export names the slots
 *   some event uses, and the snapshot renumbers the column in place (``renumber``) to its
 *   stacks, deduplicated by content (Note [One stack, two ids] in data/columns.py), only when
 *   that numbering is not the slots themselves;
 * - each event's partner (Note [Paired events] in data/columns.py) is found in the same pass,
 *   with a table of the allocations open so far (as many as live blocks, so it stays in
 *   cache): 30 ms at 10 M events, where sorting its 7 M allocs and frees by address took 0.7 s. */

/* A zeroed, writable buffer of bytes (the buffer protocol): one exported column. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;   /* bytes */
    size_t mapped;     /* bytes of our own mapping (0: data is PyMem's) */
} Column;

static PyTypeObject *ColumnType;

#define COLUMN_MAP_MIN ((Py_ssize_t)2 << 20) /* a mapping of its own from 2 MiB */

/* A new zeroed Column of size bytes; NULL with an exception set. dense: every page will be
   written, so a mapping of our own is faulted in at once (Note [Exporting ten million events]). */
static PyObject *column_new(Py_ssize_t size, int dense) {
    Column *col = PyObject_New(Column, ColumnType);
    if (!col) return NULL;
    col->data = NULL;
    col->size = size;
    col->mapped = 0;
    if (size >= COLUMN_MAP_MIN) {
        long page = sysconf(_SC_PAGESIZE);
        size_t step = page > 0 ? (size_t)page : 4096;
        size_t len = ((size_t)size + step - 1) / step * step;
        int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_POPULATE
        if (dense) flags |= MAP_POPULATE;
#endif
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p != MAP_FAILED) {
            col->data = p;
            col->mapped = len;
        }
    }
    if (!col->data && !(col->data = PyMem_Calloc((size_t)(size ? size : 1), 1))) {
        Py_DECREF(col);
        return PyErr_NoMemory();
    }
    return (PyObject *)col;
}

static void Column_dealloc(Column *col) {
    if (col->mapped) munmap(col->data, col->mapped);
    else PyMem_Free(col->data);
    PyTypeObject *tp = Py_TYPE(col);
    PyObject_Free(col);
    Py_DECREF(tp); /* a heap type: each instance holds a reference to it */
}

static int Column_getbuffer(Column *col, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)col, col->data, col->size, 0, flags);
}

static PyType_Slot Column_slots[] = {
    {Py_tp_doc, "One exported trace column: zeroed bytes, writable, read through the buffer "
                "protocol (numpy.frombuffer)."},
    {Py_tp_dealloc, (void *)Column_dealloc},
    {Py_bf_getbuffer, (void *)Column_getbuffer},
    {0, NULL},
};

static PyType_Spec Column_spec = {
    "jupyter_gpumem._native.Column", sizeof(Column), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, Column_slots,
};

/* Where the export writes: the columns of data/columns.py's FIELDS, in that order. */
enum { C_ACTION, C_ADDR, C_SIZE, C_STREAM, C_TIME, C_STACK, C_CELL, C_TASK, C_EXTRA,
       C_DEVICE_FREE, N_COLUMNS, C_PAIRED = N_COLUMNS }; /* and the pairing beside them */
static const int column_width[N_COLUMNS + 1] = {1, 8, 8, 8, 8, 4, 4, 4, 8, 8, 8};

/* Open allocations while the export walks the events: address -> the index of its alloc (or
   segment_alloc) event, by open addressing; an index of -1 marks an empty slot. */
typedef struct OpenMap {
    int64_t *keys, *vals;
    Py_ssize_t cap, n; /* cap is a power of two */
} OpenMap;

static inline Py_ssize_t open_home(const OpenMap *m, int64_t key) {
    return (Py_ssize_t)(mix64((uint64_t)key) & (uint64_t)(m->cap - 1));
}

static void open_free(OpenMap *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->vals);
    m->keys = m->vals = NULL;
    m->cap = m->n = 0;
}

/* Room for one more entry; 0, or -1 with MemoryError set. */
static int open_room(OpenMap *m) {
    if ((m->n + 1) * 2 <= m->cap) return 0;
    OpenMap grown = {PyMem_Malloc(sizeof(int64_t) * (size_t)(m->cap ? m->cap * 2 : 1024)),
                     PyMem_Malloc(sizeof(int64_t) * (size_t)(m->cap ? m->cap * 2 : 1024)),
                     m->cap ? m->cap * 2 : 1024, m->n};
    if (!grown.keys || !grown.vals) {
        open_free(&grown);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < grown.cap; j++) grown.vals[j] = -1;
    for (Py_ssize_t i = 0; i < m->cap; i++) {
        if (m->vals[i] < 0) continue;
        Py_ssize_t j = open_home(&grown, m->keys[i]);
        while (grown.vals[j] >= 0) j = (j + 1) & (grown.cap - 1);
        grown.keys[j] = m->keys[i];
        grown.vals[j] = m->vals[i];
    }
    open_free(m);
    *m = grown;
    return 0;
}

/* key's allocation opens at event index (a later one at the same address replaces it). */
static inline int open_put(OpenMap *m, int64_t key, int64_t index) {
    if (open_room(m) < 0) return -1;
    Py_ssize_t j = open_home(m, key);
    while (m->vals[j] >= 0 && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
    if (m->vals[j] < 0) m->n++;
    m->keys[j] = key;
    m->vals[j] = index;
    return 0;
}

/* The open allocation at key, taken out of the map; -1: none. */
static inline int64_t open_take(OpenMap *m, int64_t key) {
    if (!m->n) return -1;
    Py_ssize_t mask = m->cap - 1, j = open_home(m, key);
    while (m->vals[j] >= 0 && m->keys[j] != key) j = (j + 1) & mask;
    int64_t found = m->vals[j];
    if (found < 0) return -1;
    /* backward-shift deletion keeps every probe chain unbroken (as policy.c's map_pop) */
    Py_ssize_t hole = j, k = (j + 1) & mask;
    while (m->vals[k] >= 0) {
        Py_ssize_t home = open_home(m, m->keys[k]);
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            m->keys[hole] = m->keys[k];
            m->vals[hole] = m->vals[k];
            hole = k;
        }
        k = (k + 1) & mask;
    }
    m->vals[hole] = -1;
    m->n--;
    return found;
}

typedef struct Out {
    uint8_t *action;
    int64_t *addr, *size, *stream, *time_us, *extra, *device_free;
    int32_t *stack;
    uint8_t *used; /* used[slot]: some event names the stack of that slot */
    int64_t *paired; /* Note [Paired events] in data/columns.py */
    OpenMap blocks, segments;
    int freed; /* some free_requested event was met */
} Out;

/* count events of the ring from ev on, oldest first, to the columns from row i0; *rare is the
   cursor in the Rare side list. Zeros are not written (Note [Exporting ten million events]).
   0, or -1 with an exception set. */
static int export_run(const History *h, const Event *ev, Py_ssize_t count, Py_ssize_t i0,
                      Py_ssize_t *rare, Out *o) {
    /* the columns in locals: a store through a uint8_t pointer could change anything in *o,
       and the compiler would read every pointer again after it */
    uint8_t *restrict action_col = o->action, *restrict used = o->used;
    int64_t *restrict addr_col = o->addr, *restrict size_col = o->size;
    int64_t *restrict time_col = o->time_us, *restrict stream_col = o->stream;
    int64_t *restrict extra_col = o->extra, *restrict free_col = o->device_free;
    int64_t *restrict paired = o->paired;
    int32_t *restrict stack_col = o->stack;
    const int64_t *streams = h->streams;
    Py_ssize_t r = *rare;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Event *e = &ev[k];
        Py_ssize_t i = i0 + k;
        uint8_t action = e->action & ~RARE_FLAG;
        int64_t addr = e->addr, size = e->size, partner = -1;
        action_col[i] = action;
        addr_col[i] = addr;
        size_col[i] = size;
        time_col[i] = e->time_ns / 1000;
        int32_t slot = e->stack; /* an event holds its stack: the slot names it while it lives */
        stack_col[i] = slot;
        if (slot >= 0) used[slot] = 1;
        if (e->action & RARE_FLAG) {
            int64_t seq = h->dropped + i;
            while (h->rare[r].seq < seq) r++;
            stream_col[i] = h->rare[r].stream;
            extra_col[i] = h->rare[r].block_size;
            free_col[i] = h->rare[r].device_free;
        } else {
            int64_t stream = streams[e->stream];
            if (stream) stream_col[i] = stream;
            if (e->excess)
                extra_col[i] = ((size + 511) & ~(int64_t)511) + (int64_t)(e->excess - 1) * 512;
        }
        switch (action) { /* Note [Paired events] in data/columns.py */
        case A_ALLOC:
            if (open_put(&o->blocks, addr, i) < 0) return -1;
            break;
        case A_SEGMENT_ALLOC:
            if (open_put(&o->segments, addr, i) < 0) return -1;
            break;
        case A_FREE_REQUESTED:
            o->freed = 1;
            partner = open_take(&o->blocks, addr);
            break;
        case A_SEGMENT_FREE:
            partner = open_take(&o->segments, addr);
            break;
        default:
            break;
        }
        paired[i] = partner;
        if (partner >= 0) paired[partner] = i;
    }
    *rare = r;
    return 0;
}

/* The cell of every event: one run of cells at a time. */
static void export_cells(const History *h, int32_t *cell, Py_ssize_t n) {
    if (!n || h->runs_n == h->runs_head) return;
    Py_ssize_t run = h->runs_head;
    while (run + 1 < h->runs_n && h->runs[run + 1].seq <= h->dropped) run++;
    for (Py_ssize_t i = 0; run < h->runs_n && i < n; run++) {
        Py_ssize_t end = run + 1 < h->runs_n ? (Py_ssize_t)(h->runs[run + 1].seq - h->dropped) : n;
        if (end > n) end = n;
        int32_t value = (int32_t)h->runs[run].cell;
        for (; i < end; i++) cell[i] = value;
    }
}

/* The events, oldest first, as columns in data/columns.py's FIELDS order and dtypes: one
   Column each; then each event's partner (Note [Paired events] in data/columns.py: an int64
   Column, or None when the trace has no free_requested event); then a list giving, for each
   slot of the stack table, the id of its stack if some event names it (the stack column holds
   slots), else -1. Caller holds the lock. */
PyObject *history_event_columns(const History *h) {
    Py_ssize_t n = h->len;
    PyObject *cols[N_COLUMNS + 1] = {NULL}, *sids = NULL, *out = NULL;
    Out o = {0};
    if (!(o.used = PyMem_Calloc((size_t)h->used + 1, 1))) return PyErr_NoMemory();
    for (int f = 0; f <= N_COLUMNS; f++)
        if (!(cols[f] = column_new(column_width[f] * n, f != C_STREAM && f != C_DEVICE_FREE)))
            goto done;
#define COL(f, type) ((type *)((Column *)cols[f])->data)
    o.action = COL(C_ACTION, uint8_t);
    o.addr = COL(C_ADDR, int64_t);
    o.size = COL(C_SIZE, int64_t);
    o.stream = COL(C_STREAM, int64_t);
    o.time_us = COL(C_TIME, int64_t);
    o.extra = COL(C_EXTRA, int64_t);
    o.device_free = COL(C_DEVICE_FREE, int64_t);
    o.stack = COL(C_STACK, int32_t);
    o.paired = COL(C_PAIRED, int64_t);
    memset(COL(C_TASK, int32_t), 0xff, (size_t)n * 4); /* NO_TASK (-1): no Dask task here */
    export_cells(h, COL(C_CELL, int32_t), n);
#undef COL
    /* the ring in two runs, oldest first (it wraps only once full) */
    Py_ssize_t first = h->len == h->max_entries ? h->start : 0;
    Py_ssize_t rare = h->rare_head;
    if (export_run(h, h->ev + first, n - first, 0, &rare, &o) < 0 ||
        export_run(h, h->ev, first, n - first, &rare, &o) < 0)
        goto done;
    if (!o.freed) Py_SETREF(cols[C_PAIRED], Py_NewRef(Py_None)); /* frees are free_completed */
    if (!(sids = PyList_New(h->used))) goto done;
    for (Py_ssize_t slot = 0; slot < h->used; slot++) {
        const Stack *s = &h->stacks_v[slot];
        PyObject *v = PyLong_FromLongLong(o.used[slot] && s->pairs ? (s->gen << 32) | slot : -1);
        if (!v) goto done;
        PyList_SET_ITEM(sids, slot, v);
    }
    if (!(out = PyTuple_New(N_COLUMNS + 2))) goto done;
    for (int f = 0; f <= N_COLUMNS; f++) {
        PyTuple_SET_ITEM(out, f, cols[f]);
        cols[f] = NULL;
    }
    PyTuple_SET_ITEM(out, N_COLUMNS + 1, sids);
    sids = NULL;
done:
    for (int f = 0; f <= N_COLUMNS; f++) Py_XDECREF(cols[f]);
    Py_XDECREF(sids);
    PyMem_Free(o.used);
    open_free(&o.blocks);
    open_free(&o.segments);
    return out;
}

/* renumber(column, table): each value v >= 0 of an int32 column becomes table[v] (an int32
   buffer), in place; negative values (NO_STACK) stay. */
static PyObject *renumber(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer col, table;
    if (!PyArg_ParseTuple(args, "w*y*", &col, &table)) return NULL;
    PyObject *out = NULL;
    if (col.len % 4 || table.len % 4 || ((uintptr_t)col.buf | (uintptr_t)table.buf) % 4) {
        PyErr_SetString(PyExc_ValueError, "renumber: aligned int32 buffers wanted");
        goto done;
    }
    int32_t *v = col.buf;
    const int32_t *map = table.buf;
    Py_ssize_t n = col.len / 4, k = table.len / 4, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t x = v[i];
        if (x < 0) continue;
        if (x >= k) {
            bad = i;
            break;
        }
        v[i] = map[x];
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "renumber: value %d at %zd is past the table of %zd",
                     (int)v[bad], bad, k);
        goto done;
    }
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&col);
    PyBuffer_Release(&table);
    return out;
}

static PyMethodDef export_functions[] = {
    {"renumber", (PyCFunction)renumber, METH_VARARGS,
     "renumber(column, table): each value v >= 0 of an int32 column becomes table[v], in place"},
    {NULL, NULL, 0, NULL},
};

int add_export_functions(PyObject *module) {
    PyObject *type = PyType_FromSpec(&Column_spec);
    if (!type) return -1;
    ColumnType = (PyTypeObject *)type;
    Py_INCREF(type); /* ColumnType keeps one reference for the module's lifetime */
    if (PyModule_AddObject(module, "Column", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return PyModule_AddFunctions(module, export_functions);
}
