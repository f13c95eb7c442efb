/* History: events and interned Python stacks (Note [History in C] in core.h). */
#include "core.h"
/* ---------------------------------------------------------------------------------------- */
/* history                                                                                   */

#define SID_SLOT(sid) ((Py_ssize_t)((sid) & 0xffffffffLL))
#define SID_GEN(sid) ((sid) >> 32)
#define GEN_MASK 0x7fffffffLL

static inline Py_ssize_t code_home(const CodeKinds *k, const PyObject *code) {
    return (Py_ssize_t)(mix64((uint64_t)(uintptr_t)code) & (uint64_t)(k->cap - 1));
}

/* The slot of a kept code object, or -1. */
static Py_ssize_t code_find(const CodeKinds *k, const PyObject *code) {
    if (!k->cap) return -1;
    Py_ssize_t j = code_home(k, code);
    while (k->codes[j]) {
        if (k->codes[j] == code) return j;
        j = (j + 1) & (k->cap - 1);
    }
    return -1;
}

/* New arrays of cap slots holding the entries of k that keep() accepts; 0, or -1 on no memory
   (k unchanged). The entries left out go to *dropped (a new array, *ndropped long). */
static int codes_rebuild(CodeKinds *k, Py_ssize_t cap, int drop_unused, PyObject ***dropped,
                         Py_ssize_t *ndropped) {
    PyObject **codes = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
    int *kinds = PyMem_Calloc((size_t)cap, sizeof(int));
    int64_t *refs = PyMem_Calloc((size_t)cap, sizeof(int64_t));
    PyObject **out = drop_unused ? PyMem_Malloc((size_t)(k->unused + 1) * sizeof(PyObject *))
                                 : NULL;
    if (!codes || !kinds || !refs || (drop_unused && !out)) {
        PyMem_Free(codes);
        PyMem_Free(kinds);
        PyMem_Free(refs);
        PyMem_Free(out);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = 0, nout = 0;
    for (Py_ssize_t i = 0; i < k->cap; i++) {
        PyObject *code = k->codes[i];
        if (!code) continue;
        if (drop_unused && k->kinds[i] == K_KEEP && k->refs[i] == 0) {
            out[nout++] = code;
            continue;
        }
        Py_ssize_t j = (Py_ssize_t)(mix64((uint64_t)(uintptr_t)code) & (uint64_t)(cap - 1));
        while (codes[j]) j = (j + 1) & (cap - 1);
        codes[j] = code;
        kinds[j] = k->kinds[i];
        refs[j] = k->refs[i];
        n++;
    }
    PyMem_Free(k->codes);
    PyMem_Free(k->kinds);
    PyMem_Free(k->refs);
    k->codes = codes;
    k->kinds = kinds;
    k->refs = refs;
    k->cap = cap;
    k->n = n;
    if (drop_unused) k->unused = 0;
    if (dropped) {
        *dropped = out;
        *ndropped = nout;
    }
    return 0;
}

/* Let go of every kept code object no stack refers to. The table is whole again before the
   first Py_DECREF, which may run a weakref callback. */
static void codes_purge(History *h) {
    CodeKinds *k = &h->kinds;
    if (!k->unused || h->walking) return; /* a walk's pairs may name unreferenced codes */
    Py_ssize_t cap = 256;
    while ((k->n - k->unused + 1) * 2 > cap) cap *= 2;
    PyObject **dropped;
    Py_ssize_t ndropped;
    if (codes_rebuild(k, cap, 1, &dropped, &ndropped) < 0) {
        PyErr_Clear(); /* keep them: only memory is lost */
        return;
    }
    for (Py_ssize_t i = 0; i < ndropped; i++) Py_DECREF(dropped[i]);
    PyMem_Free(dropped);
}

/* The kind of a code object, classifying (and keeping) it on first sight; -1 on error. */
static int code_kind(History *h, PyObject *code) {
    if ((h->kinds.n + 1) * 2 > h->kinds.cap) {
        Py_ssize_t cap = h->kinds.cap ? h->kinds.cap * 2 : 256;
        if (codes_rebuild(&h->kinds, cap, 0, NULL, NULL) < 0) return -1;
    }
    Py_ssize_t mask = h->kinds.cap - 1;
    Py_ssize_t j = code_home(&h->kinds, code);
    while (h->kinds.codes[j]) {
        if (h->kinds.codes[j] == code) return h->kinds.kinds[j];
        j = (j + 1) & mask;
    }
    PyObject *r = PyObject_CallOneArg(h->classify, code);
    if (!r) return -1;
    long kind = PyLong_AsLong(r);
    Py_DECREF(r);
    if (kind == -1 && PyErr_Occurred()) return -1;
    /* classify may have run anything: find the slot again */
    if ((h->kinds.n + 1) * 2 > h->kinds.cap &&
        codes_rebuild(&h->kinds, h->kinds.cap * 2, 0, NULL, NULL) < 0)
        return -1;
    mask = h->kinds.cap - 1;
    j = code_home(&h->kinds, code);
    while (h->kinds.codes[j]) {
        if (h->kinds.codes[j] == code) return h->kinds.kinds[j];
        j = (j + 1) & mask;
    }
    Py_INCREF(code);
    h->kinds.codes[j] = code;
    h->kinds.kinds[j] = (int)kind;
    h->kinds.refs[j] = 0;
    h->kinds.n++;
    if (kind == K_KEEP) h->kinds.unused++;
    return (int)kind;
}

static inline Py_ssize_t index_home(const History *h, uint64_t hash) {
    return (Py_ssize_t)(hash & (uint64_t)(h->index_cap - 1));
}

static int index_insert(History *h, uint64_t hash, Py_ssize_t slot) {
    if ((h->nstacks + 1) * 2 > h->index_cap) {
        Py_ssize_t cap = h->index_cap ? h->index_cap * 2 : 256;
        int64_t *index = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        if (!index) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < cap; i++) index[i] = -1;
        for (Py_ssize_t k = 0; k < h->used; k++) {
            if (!h->stacks_v[k].pairs || k == slot) continue;
            Py_ssize_t j = (Py_ssize_t)(h->stacks_v[k].hash & (uint64_t)(cap - 1));
            while (index[j] >= 0) j = (j + 1) & (cap - 1);
            index[j] = k;
        }
        PyMem_Free(h->index);
        h->index = index;
        h->index_cap = cap;
    }
    Py_ssize_t j = index_home(h, hash);
    while (h->index[j] >= 0) j = (j + 1) & (h->index_cap - 1);
    h->index[j] = slot;
    return 0;
}

/* Take a slot out of the index, shifting later entries of its probe run back (no tombstones). */
static void index_remove(History *h, Py_ssize_t slot) {
    Py_ssize_t mask = h->index_cap - 1;
    Py_ssize_t i = index_home(h, h->stacks_v[slot].hash);
    while (h->index[i] != slot) i = (i + 1) & mask;
    for (;;) {
        h->index[i] = -1;
        Py_ssize_t k = i;
        for (;;) {
            k = (k + 1) & mask;
            if (h->index[k] < 0) return;
            Py_ssize_t home = index_home(h, h->stacks_v[h->index[k]].hash);
            /* the entry at k may move to i unless its home lies cyclically in (i, k] */
            if (i <= k ? (i < home && home <= k) : (i < home || home <= k)) continue;
            break;
        }
        h->index[i] = h->index[k];
        i = k;
    }
}

/* The interned stack of an id, or NULL when there is none (any more). */
static Stack *stack_get(const History *h, int64_t sid) {
    if (sid < 0) return NULL;
    Py_ssize_t slot = SID_SLOT(sid);
    if (slot >= h->used) return NULL;
    Stack *s = &h->stacks_v[slot];
    return s->pairs && s->gen == SID_GEN(sid) ? s : NULL;
}

static inline void stack_retain(History *h, int64_t sid) {
    Stack *s = stack_get(h, sid);
    if (s) s->refs++;
}

/* One holder fewer; the last one frees the stack and its hold on its code objects. Ids that are
   not interned (NO_STACK, or from a Python recorder) are ignored. */
void stack_release(History *h, int64_t sid) {
    Stack *s = stack_get(h, sid);
    if (!s || --s->refs > 0) return;
    Py_ssize_t slot = SID_SLOT(sid);
    index_remove(h, slot);
    for (Py_ssize_t i = 0; i < s->n; i++) {
        Py_ssize_t j = code_find(&h->kinds, s->pairs[i].code);
        if (j >= 0 && --h->kinds.refs[j] == 0) h->kinds.unused++;
    }
    PyMem_Free(s->pairs);
    s->pairs = NULL;
    s->n = 0;
    s->refs = 0;
    s->gen = (s->gen + 1) & GEN_MASK;
    s->next_free = h->free_head;
    h->free_head = slot;
    h->nstacks--;
}

/* A stack as a tuple of (code, instruction offset) pairs, innermost first; NULL with no
   exception set when the id is not interned. */
PyObject *stack_pairs(const History *h, int64_t sid) {
    Stack *s = stack_get(h, sid);
    if (!s) return NULL;
    PyObject *out = PyTuple_New(s->n);
    for (Py_ssize_t i = 0; out && i < s->n; i++) {
        PyObject *t = Py_BuildValue("(OL)", s->pairs[i].code, (long long)s->pairs[i].lasti);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
    return out;
}

/* Walk the caller's Python stack and intern it; returns its id (holding no reference: the
   caller retains it at once), or -2 with an exception set. */
static int64_t capture_stack(History *h) {
    if (h->kinds.unused > CODE_CACHE_SLACK && h->kinds.unused > h->kinds.n - h->kinds.unused)
        codes_purge(h); /* before the walk: no pair below holds a reference yet */
    Pair pairs[MAX_FRAMES];
    Py_ssize_t n = 0;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    h->walking++; /* classify may re-enter (a __del__ freeing a block): no purge meanwhile */
    while (f && n < MAX_FRAMES) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int kind = code_kind(h, (PyObject *)code);
        if (kind < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            h->walking--;
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
    h->walking--;
    uint64_t hash = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        hash = mix64(hash ^ (uint64_t)(uintptr_t)pairs[i].code) + (uint64_t)pairs[i].lasti;
    if (h->index_cap) {
        Py_ssize_t j = index_home(h, hash);
        while (h->index[j] >= 0) {
            Stack *s = &h->stacks_v[h->index[j]];
            if (s->hash == hash && s->n == n && memcmp(s->pairs, pairs, (size_t)n * sizeof(Pair)) == 0)
                return (s->gen << 32) | h->index[j];
            j = (j + 1) & (h->index_cap - 1);
        }
    }
    Py_ssize_t slot = h->free_head;
    if (slot < 0) {
        if (h->used == h->capstacks) {
            Py_ssize_t cap = h->capstacks ? h->capstacks * 2 : 64;
            Stack *v = PyMem_Realloc(h->stacks_v, (size_t)cap * sizeof(Stack));
            if (!v) {
                PyErr_NoMemory();
                return -2;
            }
            h->stacks_v = v;
            h->capstacks = cap;
        }
        slot = h->used;
        memset(&h->stacks_v[slot], 0, sizeof(Stack));
    }
    Stack *s = &h->stacks_v[slot];
    Pair *copy = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Pair));
    if (!copy) {
        PyErr_NoMemory();
        return -2;
    }
    memcpy(copy, pairs, (size_t)n * sizeof(Pair));
    s->hash = hash;
    if (index_insert(h, hash, slot) < 0) {
        PyMem_Free(copy);
        return -2;
    }
    if (slot == h->free_head) h->free_head = s->next_free;
    else h->used++;
    s->pairs = copy;
    s->n = n;
    s->refs = 0;
    h->nstacks++;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = code_find(&h->kinds, pairs[i].code);
        if (j >= 0 && h->kinds.refs[j]++ == 0) h->kinds.unused--;
    }
    return (s->gen << 32) | slot;
}

/* The stack id of a slot an event holds (Note [A ring of 32-byte events]). */
static inline int64_t slot_sid(const History *h, int32_t slot) {
    return slot < 0 ? NO_STACK : (h->stacks_v[slot].gen << 32) | slot;
}

/* Room for one more item in a side list, compacting its dropped head first; 0 or -1. */
static int side_room(void **v, Py_ssize_t *head, Py_ssize_t *n, Py_ssize_t *cap, size_t item) {
    if (*head && *head >= *n / 2) {
        memmove(*v, (char *)*v + (size_t)*head * item, (size_t)(*n - *head) * item);
        *n -= *head;
        *head = 0;
    }
    if (*n < *cap) return 0;
    Py_ssize_t grow = *cap ? *cap * 2 : 64;
    void *w = PyMem_Realloc(*v, (size_t)grow * item);
    if (!w) {
        PyErr_NoMemory();
        return -1;
    }
    *v = w;
    *cap = grow;
    return 0;
}

/* Forget side-list entries of events that fell out of the ring. */
static void side_prune(History *h) {
    while (h->rare_head < h->rare_n && h->rare[h->rare_head].seq < h->dropped) h->rare_head++;
    while (h->runs_n - h->runs_head >= 2 && h->runs[h->runs_head + 1].seq <= h->dropped)
        h->runs_head++;
}

/* The packed form of e (Note [A ring of 32-byte events]); *rare tells whether r is needed. */
static void pack_event(History *h, const FullEvent *e, Event *out, Rare *r, int *rare) {
    out->addr = e->addr;
    out->size = e->size;
    out->time_ns = e->time_ns;
    out->stack = e->stack < 0 ? -1 : (int32_t)SID_SLOT(e->stack);
    out->action = (uint8_t)e->action;
    *rare = e->device_free != 0;
    int s = 0;
    while (s < h->nstreams && h->streams[s] != e->stream) s++;
    if (s == h->nstreams && s < STREAM_RARE) h->streams[h->nstreams++] = e->stream;
    if (s == STREAM_RARE) *rare = 1;
    out->stream = (uint8_t)s;
    out->excess = 0;
    if (e->block_size) {
        int fits = e->size >= 0 && e->size <= INT64_MAX - 511;
        int64_t base = fits ? (e->size + 511) & ~(int64_t)511 : 0;
        uint64_t over = fits && e->block_size >= base ? (uint64_t)(e->block_size - base) : 1;
        if (fits && over % 512 == 0 && over / 512 + 1 <= UINT16_MAX)
            out->excess = (uint16_t)(over / 512 + 1);
        else
            *rare = 1;
    }
    if (*rare) {
        out->action |= RARE_FLAG;
        r->block_size = e->block_size;
        r->stream = e->stream;
        r->device_free = e->device_free;
    }
}

static int push_event(History *h, const FullEvent *e) {
    if (h->max_entries == 0) {
        h->dropped++;
        return 0;
    }
    if (h->len < h->max_entries && h->len == h->alloc) {
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
    Event packed;
    Rare r;
    int rare;
    int64_t seq = h->dropped + h->len;
    pack_event(h, e, &packed, &r, &rare);
    int new_run = h->runs_n == h->runs_head || h->runs[h->runs_n - 1].cell != e->cell;
    if ((rare && side_room((void **)&h->rare, &h->rare_head, &h->rare_n, &h->rare_cap,
                           sizeof(Rare)) < 0) ||
        (new_run && side_room((void **)&h->runs, &h->runs_head, &h->runs_n, &h->runs_cap,
                              sizeof(CellRun)) < 0))
        return -1;
    if (rare) {
        r.seq = seq;
        h->rare[h->rare_n++] = r;
    }
    if (new_run) h->runs[h->runs_n++] = (CellRun){seq, e->cell};
    if (h->len < h->max_entries) {
        h->ev[h->len++] = packed; /* start stays 0 until the buffer is full */
    } else {
        stack_release(h, slot_sid(h, h->ev[h->start].stack)); /* the oldest event falls out */
        h->ev[h->start] = packed;
        h->start = (h->start + 1) % h->max_entries;
        h->dropped++;
        side_prune(h);
    }
    stack_retain(h, e->stack);
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

/* Log an event. The stack id returned holds a reference for the caller after an alloc or a
   segment_alloc (the block or segment keeps it until it goes); -2 with an exception set. */
int64_t native_record(Core *c, int action, int64_t addr, int64_t size,
                             int64_t block_size, int64_t stream) {
    History *h = &c->h;
    int64_t sid = NO_STACK;
    if (h->stacks) {
        sid = capture_stack(h);
        if (sid == -2) return -2;
        stack_retain(h, sid); /* ours until the end */
    }
    FullEvent e = {action, addr, size, block_size, stream, 0, sid, h->cell, 0};
    if (action == A_SEGMENT_FREE || action == A_SEGMENT_UNMAP) e.device_free = h->reason; /* Note [Recording empty_cache] */
    e.time_ns = now_ns(h);
    if (e.time_ns == -2 && PyErr_Occurred()) goto fail;
    if (action == A_OOM && h->device_free) {
        PyObject *r = PyObject_CallNoArgs(h->device_free);
        if (!r) goto fail;
        e.device_free = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (e.device_free == -1 && PyErr_Occurred()) goto fail;
    }
    if (push_event(h, &e) < 0) goto fail;
    if (action == A_FREE_REQUESTED) { /* Note [No pending frees] in allocator.py */
        e.action = A_FREE_COMPLETED;
        if (push_event(h, &e) < 0) goto fail;
    }
    if (action != A_ALLOC && action != A_SEGMENT_ALLOC && action != A_SEGMENT_MAP)
        stack_release(h, sid);
    return sid;
fail:
    stack_release(h, sid);
    return -2;
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

/* The Rare record of the event at position seq (it has one), by binary search. */
static const Rare *rare_of(const History *h, int64_t seq) {
    Py_ssize_t lo = h->rare_head, hi = h->rare_n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (h->rare[mid].seq < seq) lo = mid + 1;
        else hi = mid;
    }
    return &h->rare[lo];
}

/* The cell of the event at position seq: the last run that starts at or before it. */
static int64_t cell_of(const History *h, int64_t seq) {
    Py_ssize_t lo = h->runs_head, hi = h->runs_n;
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (h->runs[mid].seq <= seq) lo = mid;
        else hi = mid;
    }
    return h->runs[lo].cell;
}

/* Fill *out from the packed event ev at position seq, with its Rare record r if it has one. */
static void unpack_with(const History *h, const Event *ev, const Rare *r, int64_t cell,
                        FullEvent *out) {
    out->action = ev->action & ~RARE_FLAG;
    out->addr = ev->addr;
    out->size = ev->size;
    out->time_ns = ev->time_ns;
    out->stack = slot_sid(h, ev->stack);
    out->cell = cell;
    if (ev->action & RARE_FLAG) {
        out->block_size = r->block_size;
        out->stream = r->stream;
        out->device_free = r->device_free;
        return;
    }
    out->stream = h->streams[ev->stream];
    out->block_size = ev->excess ? ((ev->size + 511) & ~(int64_t)511)
                                       + (int64_t)(ev->excess - 1) * 512 : 0;
    out->device_free = 0;
}

/* The i-th oldest event, unpacked (one binary search or two: not for loops over the ring). */
void unpack_event(const History *h, Py_ssize_t i, FullEvent *out) {
    const Event *ev = event_at(h, i);
    int64_t seq = h->dropped + i;
    unpack_with(h, ev, ev->action & RARE_FLAG ? rare_of(h, seq) : NULL, cell_of(h, seq), out);
}

void history_free_events(History *h) {
    for (Py_ssize_t i = 0; i < h->len; i++) stack_release(h, slot_sid(h, h->ev[i].stack));
    PyMem_Free(h->ev);
    h->ev = NULL;
    h->rare_head = h->rare_n = h->runs_head = h->runs_n = 0;
    h->nstreams = 0;
    h->alloc = h->len = h->start = 0;
    h->dropped = 0;
    h->ec_n = 0;
}

/* Note that empty_cache() is called now, before the next event (Note [Recording empty_cache]
   in history.py); 0, or -1 with an exception set. */
int history_mark_empty_cache(History *h) {
    if (!h->on || !h->max_entries) return 0;
    int64_t at = h->dropped + h->len;
    Py_ssize_t gone = 0;
    while (gone < h->ec_n && h->ec_at[gone] < h->dropped) gone++;
    if (gone) {
        memmove(h->ec_at, h->ec_at + gone, (size_t)(h->ec_n - gone) * sizeof(int64_t));
        h->ec_n -= gone;
    }
    if (h->ec_n && h->ec_at[h->ec_n - 1] == at) return 0;
    if (h->ec_n == h->ec_cap) {
        Py_ssize_t cap = h->ec_cap ? h->ec_cap * 2 : 16;
        int64_t *v = PyMem_Realloc(h->ec_at, (size_t)cap * sizeof(int64_t));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        h->ec_at = v;
        h->ec_cap = cap;
    }
    h->ec_at[h->ec_n++] = at;
    return 0;
}

/* The empty_cache() positions inside the kept events, as a new list. */
PyObject *history_empty_cache_positions(const History *h) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < h->ec_n; i++) {
        if (h->ec_at[i] < h->dropped) continue;
        PyObject *v = PyLong_FromLongLong(h->ec_at[i] - h->dropped);
        if (!v || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(v);
    }
    return out;
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
        for (Py_ssize_t i = 0; i < h->len - keep; i++)
            stack_release(h, slot_sid(h, event_at(h, i)->stack));
        int64_t dropped = h->dropped + (h->len - keep);
        PyMem_Free(h->ev);
        h->ev = ev;
        h->alloc = h->len = keep;
        h->start = 0;
        h->dropped = dropped;
        side_prune(h);
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
    history_free_events(&c->h); /* live blocks and segments keep their stacks */
    codes_purge(&c->h);
    core_unlock(c);
    Py_RETURN_NONE;
}

PyObject *Core_history_clear(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    history_free_events(&c->h);
    codes_purge(&c->h);
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
        FullEvent full, *e = &full;
        unpack_event(h, i, e);
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

/* Put the pairs of every interned stack into stacks {sid: pairs}: each is named by a kept
   event, a live block or a live segment (or is about to be), so a snapshot needs no walk over
   the events to find them. 0, or -1 with an exception set. */
int history_add_stacks(PyObject *stacks, const History *h) {
    for (Py_ssize_t slot = 0; slot < h->used; slot++) {
        const Stack *s = &h->stacks_v[slot];
        if (!s->pairs) continue;
        int64_t sid = (s->gen << 32) | slot;
        PyObject *key = PyLong_FromLongLong(sid);
        PyObject *pairs = key ? stack_pairs(h, sid) : NULL;
        int r = pairs ? PyDict_SetItem(stacks, key, pairs) : -1;
        Py_XDECREF(key);
        Py_XDECREF(pairs);
        if (r < 0) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_IndexError, "no stack %lld", (long long)sid);
            return -1;
        }
    }
    return 0;
}

/* A stack as a tuple of (code, instruction offset) pairs, innermost first. */
PyObject *Core_stack(Core *c, PyObject *arg) {
    long long sid = PyLong_AsLongLong(arg);
    if (sid == -1 && PyErr_Occurred()) return NULL;
    core_lock(c);
    PyObject *out = stack_pairs(&c->h, sid);
    if (!out && !PyErr_Occurred()) PyErr_Format(PyExc_IndexError, "no stack %lld", sid);
    core_unlock(c);
    return out;
}

/* (stacks interned, code objects kept alive): what the history holds now. */
PyObject *Core_history_stats(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *out = Py_BuildValue("(nn)", c->h.nstacks, c->h.kinds.n);
    core_unlock(c);
    return out;
}

/* (bytes of one event in the ring, bytes the ring and its side lists take now): Note [A ring of
   32-byte events]. */
PyObject *Core_history_bytes(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    const History *h = &c->h;
    long long total = (long long)h->alloc * (long long)sizeof(Event)
                      + (long long)h->rare_cap * (long long)sizeof(Rare)
                      + (long long)h->runs_cap * (long long)sizeof(CellRun);
    core_unlock(c);
    return Py_BuildValue("(nL)", (Py_ssize_t)sizeof(Event), total);
}

/* Free everything the history holds (the Core is going away). */
void history_dealloc(History *h) {
    PyMem_Free(h->ev);
    h->ev = NULL;
    PyMem_Free(h->rare);
    PyMem_Free(h->runs);
    h->rare = NULL;
    h->runs = NULL;
    h->rare_head = h->rare_n = h->rare_cap = h->runs_head = h->runs_n = h->runs_cap = 0;
    h->len = h->alloc = h->start = 0;
    PyMem_Free(h->ec_at);
    h->ec_at = NULL;
    h->ec_n = h->ec_cap = 0;
    for (Py_ssize_t i = 0; i < h->used; i++) PyMem_Free(h->stacks_v[i].pairs);
    PyMem_Free(h->stacks_v);
    h->stacks_v = NULL;
    h->used = h->nstacks = h->capstacks = 0;
    h->free_head = -1;
    PyMem_Free(h->index);
    h->index = NULL;
    h->index_cap = 0;
    for (Py_ssize_t i = 0; i < h->kinds.cap; i++) Py_XDECREF(h->kinds.codes[i]);
    PyMem_Free(h->kinds.codes);
    PyMem_Free(h->kinds.kinds);
    PyMem_Free(h->kinds.refs);
    memset(&h->kinds, 0, sizeof h->kinds);
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
