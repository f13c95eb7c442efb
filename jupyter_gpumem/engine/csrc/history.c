/* History: events and interned Python stacks (Note [History in C] in core.h). */
#include "core.h"
/* ---------------------------------------------------------------------------------------- */
/* history                                                                                   */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* The kind of a code object, classifying (and keeping) it on first sight; -1 on error. */
static int code_kind(History *h, PyObject *code) {
    if ((h->kinds.n + 1) * 2 > h->kinds.cap) {
        Py_ssize_t old_cap = h->kinds.cap, cap = old_cap ? old_cap * 2 : 256;
        PyObject **codes = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
        int *kinds = PyMem_Calloc((size_t)cap, sizeof(int));
        if (!codes || !kinds) {
            PyMem_Free(codes);
            PyMem_Free(kinds);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < old_cap; i++) {
            if (!h->kinds.codes[i]) continue;
            Py_ssize_t j = (Py_ssize_t)(mix64((uint64_t)(uintptr_t)h->kinds.codes[i]) & (uint64_t)(cap - 1));
            while (codes[j]) j = (j + 1) & (cap - 1);
            codes[j] = h->kinds.codes[i];
            kinds[j] = h->kinds.kinds[i];
        }
        PyMem_Free(h->kinds.codes);
        PyMem_Free(h->kinds.kinds);
        h->kinds.codes = codes;
        h->kinds.kinds = kinds;
        h->kinds.cap = cap;
    }
    Py_ssize_t mask = h->kinds.cap - 1;
    Py_ssize_t j = (Py_ssize_t)(mix64((uint64_t)(uintptr_t)code) & (uint64_t)mask);
    while (h->kinds.codes[j]) {
        if (h->kinds.codes[j] == code) return h->kinds.kinds[j];
        j = (j + 1) & mask;
    }
    PyObject *r = PyObject_CallOneArg(h->classify, code);
    if (!r) return -1;
    long kind = PyLong_AsLong(r);
    Py_DECREF(r);
    if (kind == -1 && PyErr_Occurred()) return -1;
    Py_INCREF(code);
    h->kinds.codes[j] = code;
    h->kinds.kinds[j] = (int)kind;
    h->kinds.n++;
    return (int)kind;
}

static int index_insert(History *h, uint64_t hash, int64_t sid) {
    if ((h->nstacks + 1) * 2 > h->index_cap) {
        Py_ssize_t cap = h->index_cap ? h->index_cap * 2 : 256;
        int64_t *index = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        if (!index) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < cap; i++) index[i] = -1;
        for (Py_ssize_t k = 0; k < h->nstacks; k++) {
            Py_ssize_t j = (Py_ssize_t)(h->stacks_v[k].hash & (uint64_t)(cap - 1));
            while (index[j] >= 0) j = (j + 1) & (cap - 1);
            index[j] = k;
        }
        PyMem_Free(h->index);
        h->index = index;
        h->index_cap = cap;
    }
    Py_ssize_t j = (Py_ssize_t)(hash & (uint64_t)(h->index_cap - 1));
    while (h->index[j] >= 0) j = (j + 1) & (h->index_cap - 1);
    h->index[j] = sid;
    return 0;
}

/* Walk the caller's Python stack and intern it; returns its id, or -2 with an exception set. */
static int64_t capture_stack(History *h) {
    Pair pairs[MAX_FRAMES];
    Py_ssize_t n = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f && n < MAX_FRAMES) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int kind = code_kind(h, (PyObject *)code);
        if (kind < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            return -2;
        }
        if (kind == K_KEEP) {
            pairs[n].code = (PyObject *)code; /* kept alive by CodeKinds */
            pairs[n].lasti = PyFrame_GetLasti(f);
            n++;
        }
        Py_DECREF(code);
        if (kind == K_STOP) break;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    uint64_t hash = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        hash = mix64(hash ^ (uint64_t)(uintptr_t)pairs[i].code) + (uint64_t)pairs[i].lasti;
    if (h->index_cap) {
        Py_ssize_t j = (Py_ssize_t)(hash & (uint64_t)(h->index_cap - 1));
        while (h->index[j] >= 0) {
            Stack *s = &h->stacks_v[h->index[j]];
            if (s->hash == hash && s->n == n && memcmp(s->pairs, pairs, (size_t)n * sizeof(Pair)) == 0)
                return h->index[j];
            j = (j + 1) & (h->index_cap - 1);
        }
    }
    if (h->nstacks == h->capstacks) {
        Py_ssize_t cap = h->capstacks ? h->capstacks * 2 : 64;
        Stack *v = PyMem_Realloc(h->stacks_v, (size_t)cap * sizeof(Stack));
        if (!v) {
            PyErr_NoMemory();
            return -2;
        }
        h->stacks_v = v;
        h->capstacks = cap;
    }
    Stack *s = &h->stacks_v[h->nstacks];
    s->pairs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Pair));
    if (!s->pairs) {
        PyErr_NoMemory();
        return -2;
    }
    memcpy(s->pairs, pairs, (size_t)n * sizeof(Pair));
    s->n = n;
    s->hash = hash;
    int64_t sid = h->nstacks;
    if (index_insert(h, hash, sid) < 0) {
        PyMem_Free(s->pairs);
        return -2;
    }
    h->nstacks++;
    return sid;
}

static int push_event(History *h, const Event *e) {
    if (h->max_entries == 0) {
        h->dropped++;
        return 0;
    }
    if (h->len < h->max_entries) {
        if (h->len == h->alloc) {
            Py_ssize_t grow = h->alloc ? h->alloc * 2 : 1024;
            if (grow > h->max_entries) grow = h->max_entries;
            Event *ev = PyMem_Realloc(h->ev, (size_t)grow * sizeof(Event));
            if (!ev) {
                PyErr_NoMemory();
                return -1;
            }
            h->ev = ev;
            h->alloc = grow;
        }
        h->ev[h->len++] = *e; /* start stays 0 until the buffer is full */
    } else {
        h->ev[h->start] = *e;
        h->start = (h->start + 1) % h->max_entries;
        h->dropped++;
    }
    return 0;
}

static int64_t now_ns(History *h) {
    if (h->clock) {
        PyObject *r = PyObject_CallNoArgs(h->clock);
        if (!r) return -2;
        int64_t t = PyLong_AsLongLong(r);
        Py_DECREF(r);
        return (t == -1 && PyErr_Occurred()) ? -2 : t;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t native_record(Core *c, int action, int64_t addr, int64_t size,
                             int64_t block_size, int64_t stream) {
    History *h = &c->h;
    int64_t sid = NO_STACK;
    if (h->stacks) {
        sid = capture_stack(h);
        if (sid == -2) return -2;
    }
    Event e = {action, addr, size, block_size, stream, 0, sid, h->cell, 0};
    e.time_ns = now_ns(h);
    if (e.time_ns == -2 && PyErr_Occurred()) return -2;
    if (action == A_OOM && h->device_free) {
        PyObject *r = PyObject_CallNoArgs(h->device_free);
        if (!r) return -2;
        e.device_free = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (e.device_free == -1 && PyErr_Occurred()) return -2;
    }
    if (push_event(h, &e) < 0) return -2;
    if (action == A_FREE_REQUESTED) { /* Note [No pending frees] in allocator.py */
        e.action = A_FREE_COMPLETED;
        if (push_event(h, &e) < 0) return -2;
    }
    return sid;
}

/* Record an event; returns the stack id, or -2 with an exception set. */
int64_t record(Core *c, int action, int64_t addr, int64_t size, int64_t block_size,
                      int64_t stream) {
    if (c->h.on) return native_record(c, action, addr, size, block_size, stream);
    PyObject *r = PyObject_CallFunction(c->recorder, "iLLLL", action, (long long)addr,
                                        (long long)size, (long long)block_size,
                                        (long long)stream);
    if (!r) return -2;
    int64_t sid = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (sid == -1 && PyErr_Occurred()) return -2;
    return sid;
}

/* The i-th oldest event. The buffer wraps only once it holds max_entries events. */
const Event *event_at(const History *h, Py_ssize_t i) {
    return &h->ev[h->len == h->max_entries ? (h->start + i) % h->max_entries : i];
}

void history_free_events(History *h) {
    PyMem_Free(h->ev);
    h->ev = NULL;
    h->alloc = h->len = h->start = 0;
    h->dropped = 0;
}

/* Python methods of Core for the history (listed in module.c) */

PyObject *Core_history_configure(Core *c, PyObject *args) {
    Py_ssize_t max_entries;
    int stacks;
    PyObject *clock, *classify, *device_free;
    if (!PyArg_ParseTuple(args, "npOOO", &max_entries, &stacks, &clock, &classify, &device_free))
        return NULL;
    if (max_entries < 0) {
        PyErr_SetString(PyExc_ValueError, "max_entries must be >= 0");
        return NULL;
    }
    core_lock(c);
    History *h = &c->h;
    if (max_entries != h->max_entries && h->len) {
        /* keep the newest events that fit, oldest first */
        Py_ssize_t keep = h->len < max_entries ? h->len : max_entries;
        Event *ev = keep ? PyMem_Malloc((size_t)keep * sizeof(Event)) : NULL;
        if (keep && !ev) {
            core_unlock(c);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < keep; i++) ev[i] = *event_at(h, h->len - keep + i);
        int64_t dropped = h->dropped + (h->len - keep);
        PyMem_Free(h->ev);
        h->ev = ev;
        h->alloc = h->len = keep;
        h->start = 0;
        h->dropped = dropped;
    }
    h->max_entries = max_entries;
    h->stacks = stacks;
    PyObject *olds[3] = {h->clock, h->classify, h->device_free};
    h->clock = clock == Py_None ? NULL : (Py_INCREF(clock), clock);
    Py_INCREF(classify);
    h->classify = classify;
    h->device_free = device_free == Py_None ? NULL : (Py_INCREF(device_free), device_free);
    h->on = 1;
    for (int i = 0; i < 3; i++) Py_XDECREF(olds[i]);
    core_unlock(c);
    Py_RETURN_NONE;
}

PyObject *Core_history_stop(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    c->h.on = 0;
    history_free_events(&c->h);
    core_unlock(c);
    Py_RETURN_NONE;
}

PyObject *Core_history_clear(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    history_free_events(&c->h);
    core_unlock(c);
    Py_RETURN_NONE;
}

PyObject *Core_history_info(Core *c, PyObject *Py_UNUSED(ignored)) {
    History *h = &c->h;
    return Py_BuildValue("(iinLnn)", h->on, h->stacks, h->max_entries, (long long)h->dropped,
                         h->len, h->nstacks);
}

/* The events, oldest first, as (action, addr, size, block_size, stream, time_ns, stack, cell,
   device_free) tuples. */
PyObject *Core_events(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    History *h = &c->h;
    PyObject *out = PyList_New(h->len);
    for (Py_ssize_t i = 0; out && i < h->len; i++) {
        const Event *e = event_at(h, i);
        PyObject *t = Py_BuildValue("(LLLLLLLLL)", (long long)e->action, (long long)e->addr,
                                    (long long)e->size, (long long)e->block_size,
                                    (long long)e->stream, (long long)e->time_ns,
                                    (long long)e->stack, (long long)e->cell,
                                    (long long)e->device_free);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, t);
    }
    core_unlock(c);
    return out;
}

/* A stack as a tuple of (code, instruction offset) pairs, innermost first. */
PyObject *Core_stack(Core *c, PyObject *arg) {
    Py_ssize_t sid = PyLong_AsSsize_t(arg);
    if (sid == -1 && PyErr_Occurred()) return NULL;
    core_lock(c);
    History *h = &c->h;
    PyObject *out = NULL;
    if (sid < 0 || sid >= h->nstacks) {
        PyErr_Format(PyExc_IndexError, "no stack %zd", sid);
    } else {
        Stack *s = &h->stacks_v[sid];
        out = PyTuple_New(s->n);
        for (Py_ssize_t i = 0; out && i < s->n; i++) {
            PyObject *t = Py_BuildValue("(OL)", s->pairs[i].code, (long long)s->pairs[i].lasti);
            if (!t) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(out, i, t);
        }
    }
    core_unlock(c);
    return out;
}

PyObject *Core_set_cell(Core *c, PyObject *arg) {
    long long cell = PyLong_AsLongLong(arg);
    if (cell == -1 && PyErr_Occurred()) return NULL;
    c->h.cell = cell;
    Py_RETURN_NONE;
}

PyObject *Core_record_snapshot(Core *c, PyObject *arg) {
    long long size = PyLong_AsLongLong(arg);
    if (size == -1 && PyErr_Occurred()) return NULL;
    core_lock(c);
    int64_t r = c->h.on ? native_record(c, A_SNAPSHOT, 0, size, 0, 0) : 0;
    core_unlock(c);
    if (r == -2) return NULL;
    Py_RETURN_NONE;
}
