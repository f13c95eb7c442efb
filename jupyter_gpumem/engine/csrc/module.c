/* The Core type: its Python methods, and the module jupyter_gpumem._native. */
#include "core.h"

PyTypeObject *CoreType;
/* ---------------------------------------------------------------------------------------- */
/* Python methods                                                                            */

/* Note [Arguments of the cores] in _allocator.py: an int, or anything __index__ accepts, never
   a bool. A new reference to an exact int, or NULL with TypeError set. */
static PyObject *int_arg(PyObject *o, const char *what) {
    if (PyLong_CheckExact(o)) {
        Py_INCREF(o);
        return o;
    }
    if (!PyBool_Check(o) && PyIndex_Check(o)) return PyNumber_Index(o);
    PyObject *name = PyType_GetName(Py_TYPE(o));
    if (name) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %U", what, name);
        Py_DECREF(name);
    }
    return NULL;
}

static PyObject *Core_malloc(Core *c, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    PyObject *nbytes_obj = nargs > 0 ? args[0] : NULL, *stream_obj = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs > 2) goto usage;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GetItem(kwnames, i);
        PyObject *value = args[nargs + i];
        if (PyUnicode_CompareWithASCIIString(name, "nbytes") == 0 && !nbytes_obj)
            nbytes_obj = value;
        else if (PyUnicode_CompareWithASCIIString(name, "stream") == 0 && !stream_obj)
            stream_obj = value;
        else goto usage;
    }
    if (!nbytes_obj) goto usage;
    PyObject *n = int_arg(nbytes_obj, "nbytes");
    if (!n) return NULL;
    int overflow;
    long long nbytes = PyLong_AsLongLongAndOverflow(n, &overflow);
    long long stream = 0;
    if (stream_obj) {
        PyObject *s = int_arg(stream_obj, "stream");
        if (!s) {
            Py_DECREF(n);
            return NULL;
        }
        int stream_overflow;
        stream = PyLong_AsLongLongAndOverflow(s, &stream_overflow);
        if (stream_overflow)
            PyErr_Format(PyExc_ValueError, "stream %S is out of range (a signed 64-bit integer)",
                         s);
        Py_DECREF(s);
        if (PyErr_Occurred()) {
            Py_DECREF(n);
            return NULL;
        }
    }
    PyObject *r;
    if (overflow < 0 || (!overflow && nbytes < 0)) {
        r = PyErr_Format(PyExc_ValueError, "cannot allocate a negative size (%S B)", n);
    } else if (!overflow && nbytes == 0) {
        r = PyLong_FromLong(0);
    } else {
        core_lock(c);
        r = overflow ? core_oom_too_large(c, n, stream) : core_malloc_locked(c, nbytes, stream);
        core_unlock(c);
    }
    Py_DECREF(n);
    return r;
usage:
    PyErr_SetString(PyExc_TypeError, "malloc(nbytes, stream=0): bad arguments");
    return NULL;
}

static PyObject *Core_free(Core *c, PyObject *arg) {
    PyObject *n = int_arg(arg, "ptr");
    if (!n) return NULL;
    unsigned long long ptr = PyLong_AsUnsignedLongLong(n);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        /* negative or above 64 bits: no block has that address */
        PyObject *hex = PyErr_ExceptionMatches(PyExc_OverflowError) ? PyNumber_ToBase(n, 16)
                                                                    : NULL;
        if (hex) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "free of address %U, which this allocator did not hand out or which "
                         "was already freed", hex);
            Py_DECREF(hex);
        }
        Py_DECREF(n);
        return NULL;
    }
    Py_DECREF(n);
    if (core_free_addr(c, ptr) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_set_vmm(Core *c, PyObject *args) {
    PyObject *reserve, *release, *map, *unmap, *total_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &reserve, &release, &map, &unmap, &total_obj))
        return NULL;
    PyObject *n = int_arg(total_obj, "total");
    if (!n) return NULL;
    int overflow;
    long long total = PyLong_AsLongLongAndOverflow(n, &overflow);
    Py_DECREF(n);
    if (total == -1 && PyErr_Occurred()) return NULL;
    if (overflow || total <= 0) { /* Note [Sizes near 2**63] in stats.py */
        PyErr_SetString(PyExc_ValueError, "set_vmm: total must be positive and at most 2**63 - 1");
        return NULL;
    }
    core_lock(c);
    Py_INCREF(reserve);
    Py_INCREF(release);
    Py_INCREF(map);
    Py_INCREF(unmap);
    Py_XSETREF(c->vmm_reserve, reserve);
    Py_XSETREF(c->vmm_release, release);
    Py_XSETREF(c->vmm_map, map);
    Py_XSETREF(c->vmm_unmap, unmap);
    c->vmm_total = total;
    core_unlock(c);
    Py_RETURN_NONE;
}

/* o (an int, as int_arg reads it) in *out; 1 when it does not fit in 64 bits, -1 on error. */
static int int64_arg(PyObject *o, const char *what, long long *out) {
    PyObject *n = int_arg(o, what);
    if (!n) return -1;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(n, &overflow);
    Py_DECREF(n);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return overflow != 0;
}

static PyObject *Core_configure(Core *c, PyObject *args) {
    PyObject *objs[3];
    long long vals[3];
    double gc;
    int expandable = 0, out_of_range = 0;
    if (!PyArg_ParseTuple(args, "OOOd|p", &objs[0], &objs[1], &objs[2], &gc, &expandable))
        return NULL;
    static const char *names[] = {"max_split", "divisions", "cap"};
    for (int k = 0; k < 3; k++) {
        int r = int64_arg(objs[k], names[k], &vals[k]);
        if (r < 0) return NULL;
        out_of_range |= r; /* Note [Sizes near 2**63] in stats.py: ValueError, as PyCore's */
    }
    long long max_split = vals[0], divisions = vals[1], cap = vals[2];
    /* AllocatorConfig checks the user's values; this guards the core's own invariants */
    if (out_of_range || max_split <= 0 || divisions < 0 || divisions > MAX_ALLOC_SIZE ||
        cap < -1) {
        PyErr_SetString(PyExc_ValueError, "configure: a value is out of range");
        return NULL;
    }
    if (expandable && !c->vmm_map) {
        PyErr_SetString(PyExc_ValueError, "configure: expandable segments need set_vmm first");
        return NULL;
    }
    core_lock(c);
    c->expandable = expandable;
    c->max_split = max_split;
    c->divisions = divisions;
    c->cap = cap;
    c->gc_threshold = gc;
    /* oversize counters follow the new threshold */
    int64_t allocations = 0, segments = 0;
    for (Py_ssize_t i = 0; i < c->active.cap; i++)
        if (c->active.keys[i] && c->active.vals[i]->size >= max_split) allocations++;
    for (Segment *s = c->segments; s; s = s->next)
        if (s->size >= max_split && !s->expandable) segments++;
    Stat *pairs[2] = {&c->oversize_allocations, &c->oversize_segments};
    int64_t want[2] = {allocations, segments};
    for (int k = 0; k < 2; k++) {
        if (want[k] > pairs[k]->current) stat_inc(pairs[k], want[k] - pairs[k]->current);
        else if (want[k] < pairs[k]->current) stat_dec(pairs[k], pairs[k]->current - want[k]);
    }
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_empty_cache(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    int64_t before = c->reserved;
    int r = history_mark_empty_cache(&c->h);
    if (r == 0) r = release_cached_blocks(c, R_EMPTY_CACHE);
    int64_t released = before - c->reserved;
    core_unlock(c);
    if (r < 0) return NULL;
    return PyLong_FromLongLong(released);
}

static PyObject *stat_tuple_into(PyObject *t, Py_ssize_t *k, const Stat *s) {
    int64_t vals[4] = {s->current, s->peak, s->allocated, s->freed};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyLong_FromLongLong(vals[i]);
        if (!v) return NULL;
        PyTuple_SetItem(t, (*k)++, v);
    }
    return t;
}

static PyObject *Core_stats(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *t = PyTuple_New(N_POOLED * 3 * 4 + 8 + 5);
    Py_ssize_t k = 0;
    if (!t) goto done;
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++)
            if (!stat_tuple_into(t, &k, &c->pooled[s][p])) goto fail;
    if (!stat_tuple_into(t, &k, &c->oversize_allocations)) goto fail;
    if (!stat_tuple_into(t, &k, &c->oversize_segments)) goto fail;
    int64_t scalars[5] = {c->num_alloc_retries, c->num_ooms, c->num_device_alloc,
                          c->num_device_free, c->num_sync_all_streams};
    for (int i = 0; i < 5; i++) {
        PyObject *v = PyLong_FromLongLong(scalars[i]);
        if (!v) goto fail;
        PyTuple_SetItem(t, k++, v);
    }
    goto done;
fail:
    Py_CLEAR(t);
done:
    core_unlock(c);
    return t;
}

static PyObject *Core_reset_peak(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++) c->pooled[s][p].peak = c->pooled[s][p].current;
    c->oversize_allocations.peak = c->oversize_allocations.current;
    c->oversize_segments.peak = c->oversize_segments.current;
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_reset_accumulated(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    for (int s = 0; s < N_POOLED; s++)
        for (int p = 0; p < 3; p++) c->pooled[s][p].allocated = c->pooled[s][p].freed = 0;
    c->oversize_allocations.allocated = c->oversize_allocations.freed = 0;
    c->oversize_segments.allocated = c->oversize_segments.freed = 0;
    c->num_alloc_retries = c->num_ooms = c->num_device_alloc = c->num_device_free = 0;
    c->num_sync_all_streams = 0;
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *block_tuple(const Block *b) {
    return Py_BuildValue("(LLLLiLiL)", (long long)b->addr, (long long)b->size,
                         (long long)b->requested, (long long)b->stream, b->small,
                         (long long)b->segment->addr, b->allocated, (long long)b->stack);
}

/* One locked moment: (segments, blocks, stats), segments as (addr, size, stream, small, stack),
   blocks as (addr, size, requested, stream, small, segment_addr, allocated, stack), stats as
   stats() gives them. */
static PyObject *Core_state(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *segs = PyList_New(0), *blocks = PyList_New(0), *stats = NULL, *out = NULL;
    if (!segs || !blocks) goto done;
    for (Segment *s = c->segments; s; s = s->next) {
        PyObject *t = Py_BuildValue("(LLLiLNL)", (long long)s->addr,
                                    (long long)segment_reserved(s), (long long)s->stream,
                                    s->small, (long long)s->stack,
                                    PyBool_FromLong(s->expandable), (long long)s->size);
        if (!t || PyList_Append(segs, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    for (Py_ssize_t i = 0; i < c->active.cap; i++) {
        if (!c->active.keys[i]) continue;
        PyObject *t = block_tuple(c->active.vals[i]);
        if (!t || PyList_Append(blocks, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
    }
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++)
            for (Py_ssize_t j = 0; j < p->streams[i].n; j++) {
                PyObject *t = block_tuple(p->streams[i].v[j]);
                if (!t || PyList_Append(blocks, t) < 0) {
                    Py_XDECREF(t);
                    goto done;
                }
                Py_DECREF(t);
            }
    }
    if (!(stats = Core_stats(c, NULL))) goto done;
    out = PyTuple_Pack(3, segs, blocks, stats);
done:
    Py_XDECREF(segs);
    Py_XDECREF(blocks);
    Py_XDECREF(stats);
    core_unlock(c);
    return out;
}

/* Add the pairs of stack sid to stacks {sid: pairs}, unless there or not interned. */
static int add_stack(PyObject *stacks, const History *h, int64_t sid) {
    if (sid < 0) return 0;
    PyObject *key = PyLong_FromLongLong(sid);
    if (!key) return -1;
    int has = PyDict_Contains(stacks, key);
    PyObject *pairs = has == 0 ? stack_pairs(h, sid) : NULL;
    int r = has < 0 || (has == 0 && !pairs && PyErr_Occurred()) ? -1 : 0;
    if (pairs) {
        r = PyDict_SetItem(stacks, key, pairs);
        Py_DECREF(pairs);
    }
    Py_DECREF(key);
    return r;
}

/* One locked moment: log a snapshot event (when recording and mark; the tool's own views pass
   mark=False), then (segments, blocks, stats, events, history_info, {stack id: pairs} of every
   stack they name, empty_cache positions); events as history_event_columns gives them. */
static PyObject *Core_snapshot(Core *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mark", NULL};
    int mark = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p", kwlist, &mark)) return NULL;
    core_lock(c);
    PyObject *state = NULL, *events = NULL, *info = NULL, *stacks = NULL, *marks = NULL;
    PyObject *out = NULL;
    History *h = &c->h;
    if (mark && h->on && native_record(c, A_SNAPSHOT, 0, c->pooled[S_ALLOCATED_BYTES][P_ALL].current,
                               0, 0) == -2)
        goto done;
    if (!(state = Core_state(c, NULL)) || !(events = history_event_columns(h)) ||
        !(info = Core_history_info(c, NULL)) || !(stacks = PyDict_New()) ||
        !(marks = history_empty_cache_positions(h)))
        goto done;
    for (Segment *s = c->segments; s; s = s->next)
        if (add_stack(stacks, h, s->stack) < 0) goto done;
    for (Py_ssize_t i = 0; i < c->active.cap; i++)
        if (c->active.keys[i] && add_stack(stacks, h, c->active.vals[i]->stack) < 0) goto done;
    if (history_add_stacks(stacks, h) < 0) goto done;
    out = Py_BuildValue("(OOOOOOO)", PyTuple_GET_ITEM(state, 0), PyTuple_GET_ITEM(state, 1),
                        PyTuple_GET_ITEM(state, 2), events, info, stacks, marks);
done:
    Py_XDECREF(state);
    Py_XDECREF(events);
    Py_XDECREF(info);
    Py_XDECREF(stacks);
    Py_XDECREF(marks);
    core_unlock(c);
    return out;
}

static PyObject *Core_check(Core *c, PyObject *Py_UNUSED(ignored)) {
    /* Structural checks the Python side cannot see: pool order and links, the address map, and
       the reserved-bytes total against the segments and their counter. */
    core_lock(c);
    const char *err = NULL;
    int64_t reserved = 0;
    for (Segment *s = c->segments; s; s = s->next) reserved += segment_reserved(s);
    if (reserved != c->reserved) err = "the reserved total is not the sum of the segments";
    else if (c->reserved != c->pooled[S_RESERVED_BYTES][P_ALL].current)
        err = "the reserved total disagrees with reserved_bytes";
    for (int w = 0; w < 2 && !err; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams && !err; i++) {
            StreamBlocks *s = &p->streams[i];
            for (Py_ssize_t j = 0; j < s->n && !err; j++) {
                Block *b = s->v[j];
                if (b->allocated) err = "an allocated block is in a pool";
                else if (b->stream != s->stream) err = "a block is filed under another stream";
                else if (b->small != p->small) err = "a block is in the wrong pool";
                else if (j && (s->v[j - 1]->size > b->size ||
                               (s->v[j - 1]->size == b->size && s->v[j - 1]->addr >= b->addr)))
                    err = "a pool is out of (size, address) order";
                else if ((b->prev && b->prev->next != b) || (b->next && b->next->prev != b))
                    err = "broken neighbour links";
            }
        }
    }
    for (Py_ssize_t i = 0; i < c->active.cap && !err; i++) {
        if (!c->active.keys[i]) continue;
        Block *b = c->active.vals[i];
        if (!b->allocated || (uint64_t)b->addr != c->active.keys[i]) err = "address map is stale";
        if (map_get(&c->active, c->active.keys[i]) != b) err = "address map probe is broken";
    }
    core_unlock(c);
    if (err) {
        PyErr_SetString(PyExc_AssertionError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_owns(Core *c, PyObject *arg) {
    unsigned long long ptr = PyLong_AsUnsignedLongLong(arg);
    if (ptr == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    core_lock(c);
    int found = map_get(&c->active, ptr) != NULL;
    core_unlock(c);
    return PyBool_FromLong(found);
}

static PyObject *Core_take_mark(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    PyObject *r = Py_BuildValue("(LL)", (long long)c->mark_allocated, (long long)c->mark_reserved);
    c->mark_allocated = c->pooled[S_ALLOCATED_BYTES][P_ALL].current;
    c->mark_reserved = c->reserved;
    core_unlock(c);
    return r;
}

static PyObject *Core_set_recorder(Core *c, PyObject *arg) {
    core_lock(c);
    PyObject *old = c->recorder;
    if (arg == Py_None) {
        c->recorder = NULL;
    } else {
        Py_INCREF(arg);
        c->recorder = arg;
    }
    Py_XDECREF(old);
    core_unlock(c);
    Py_RETURN_NONE;
}

static PyObject *Core_allocated(Core *c, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(c->pooled[S_ALLOCATED_BYTES][P_ALL].current);
}

static PyObject *Core_reserved(Core *c, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(c->reserved);
}

static PyObject *Core_largest_free_block(Core *c, PyObject *Py_UNUSED(ignored)) {
    core_lock(c);
    int64_t best = 0;
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++)
            if (p->streams[i].n && p->streams[i].v[p->streams[i].n - 1]->size > best)
                best = p->streams[i].v[p->streams[i].n - 1]->size;
    }
    core_unlock(c);
    return PyLong_FromLongLong(best);
}

/* ---------------------------------------------------------------------------------------- */
/* type                                                                                      */

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"device_malloc", "device_free", "device_oom", "oom_handler", NULL};
    PyObject *dm, *df, *doom, *oh;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO", kwlist, &dm, &df, &doom, &oh))
        return -1;
    if (c->lock_made) {
        PyErr_SetString(PyExc_RuntimeError, "Core is already initialised");
        return -1;
    }
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    c->lock_made = 1;
    c->pools[0].small = 0;
    c->pools[1].small = 1;
    c->max_split = NO_LIMIT;
    c->cap = -1;
    c->h.last_stack = NO_STACK;
    c->h.free_head = -1;
    c->h.cell = -1;
    Py_INCREF(dm);
    Py_INCREF(df);
    Py_INCREF(doom);
    Py_INCREF(oh);
    c->device_malloc = dm;
    c->device_free = df;
    c->device_oom = doom;
    c->oom_handler = oh;
    return 0;
}

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(c));
    Py_VISIT(c->device_malloc);
    Py_VISIT(c->device_free);
    Py_VISIT(c->device_oom);
    Py_VISIT(c->recorder);
    Py_VISIT(c->oom_handler);
    Py_VISIT(c->h.clock);
    Py_VISIT(c->h.classify);
    Py_VISIT(c->h.device_free);
    Py_VISIT(c->vmm_reserve);
    Py_VISIT(c->vmm_release);
    Py_VISIT(c->vmm_map);
    Py_VISIT(c->vmm_unmap);
    return 0;
}

static int Core_clear(Core *c) {
    Py_CLEAR(c->device_malloc);
    Py_CLEAR(c->device_free);
    Py_CLEAR(c->device_oom);
    Py_CLEAR(c->recorder);
    Py_CLEAR(c->oom_handler);
    Py_CLEAR(c->h.clock);
    Py_CLEAR(c->h.classify);
    Py_CLEAR(c->h.device_free);
    Py_CLEAR(c->vmm_reserve);
    Py_CLEAR(c->vmm_release);
    Py_CLEAR(c->vmm_map);
    Py_CLEAR(c->vmm_unmap);
    c->h.on = 0;
    return 0;
}

static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    /* Segments still held go back to nobody: the device object may be gone. Free our memory. */
    for (int w = 0; w < 2; w++) {
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nstreams; i++) {
            for (Py_ssize_t j = 0; j < p->streams[i].n; j++)
                block_struct_delete(p->streams[i].v[j]);
            PyMem_Free(p->streams[i].v ? p->streams[i].v - p->streams[i].head : NULL);
        }
        PyMem_Free(p->streams);
        for (Py_ssize_t i = 0; i < p->nustreams; i++) {
            for (Py_ssize_t j = 0; j < p->ustreams[i].n; j++)
                block_struct_delete(p->ustreams[i].v[j]);
            PyMem_Free(p->ustreams[i].v ? p->ustreams[i].v - p->ustreams[i].head : NULL);
        }
        PyMem_Free(p->ustreams);
        PyMem_Free(p->slots);
        PyMem_Free(p->uslots);
    }
    for (Py_ssize_t i = 0; i < c->active.cap; i++)
        if (c->active.keys[i]) block_struct_delete(c->active.vals[i]);
    PyMem_Free(c->active.keys);
    PyMem_Free(c->active.vals);
    block_struct_delete(c->spare);
    Segment *s = c->segments;
    while (s) {
        Segment *next = s->next;
        PyMem_Free(s);
        s = next;
    }
    history_dealloc(&c->h);
    Core_clear(c);
    if (c->lock_made) pthread_mutex_destroy(&c->lock);
    PyTypeObject *tp = (PyTypeObject *)PyObject_Type((PyObject *)c);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(c);
    Py_DECREF(tp); /* the reference PyObject_Type gave */
    Py_DECREF(tp); /* the instance's own reference to its heap type */
}

static PyMethodDef Core_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))Core_malloc, METH_FASTCALL | METH_KEYWORDS,
     "malloc(nbytes, stream=0) -> address"},
    {"free", (PyCFunction)Core_free, METH_O, "free(address)"},
    {"configure", (PyCFunction)Core_configure, METH_VARARGS,
     "configure(max_split, divisions, cap, gc_threshold, expandable=False); max_split NO_LIMIT "
     "and cap -1 unset"},
    {"set_vmm", (PyCFunction)Core_set_vmm, METH_VARARGS,
     "set_vmm(reserve, release, map, unmap, total): the device's virtual-memory operations"},
    {"empty_cache", (PyCFunction)Core_empty_cache, METH_NOARGS, "release whole cached segments"},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS, "every counter, as a flat tuple"},
    {"reset_peak", (PyCFunction)Core_reset_peak, METH_NOARGS, ""},
    {"reset_accumulated", (PyCFunction)Core_reset_accumulated, METH_NOARGS, ""},
    {"state", (PyCFunction)Core_state, METH_NOARGS, "(segments, blocks, stats) as tuples, in one locked moment"},
    {"check", (PyCFunction)Core_check, METH_NOARGS, "assert the internal structures agree"},
    {"owns", (PyCFunction)Core_owns, METH_O, "whether an address is a live block"},
    {"take_mark", (PyCFunction)Core_take_mark, METH_NOARGS,
     "(peak allocated, peak reserved) since the last call; restarts the mark"},
    {"set_recorder", (PyCFunction)Core_set_recorder, METH_O,
     "a Python history callback or None (tests); the C history below is faster"},
    {"history_configure", (PyCFunction)Core_history_configure, METH_VARARGS,
     "history_configure(max_entries, stacks, clock|None, classify, device_free|None)"},
    {"history_stop", (PyCFunction)Core_history_stop, METH_NOARGS, "stop and drop the events"},
    {"history_clear", (PyCFunction)Core_history_clear, METH_NOARGS, "drop the events"},
    {"history_info", (PyCFunction)Core_history_info, METH_NOARGS,
     "(on, stacks, max_entries, dropped, events, stacks interned)"},
    {"events", (PyCFunction)Core_events, METH_NOARGS, "the recorded events, oldest first"},
    {"stack", (PyCFunction)Core_stack, METH_O, "stack id -> ((code, offset), ...)"},
    {"set_cell", (PyCFunction)Core_set_cell, METH_O, "the cell number tagged on events"},
    {"record_snapshot", (PyCFunction)Core_record_snapshot, METH_O, "log a snapshot event"},
    {"snapshot", (PyCFunction)(void (*)(void))Core_snapshot, METH_VARARGS | METH_KEYWORDS,
     "snapshot(*, mark=True) -> (segments, blocks, stats, events, history_info, "
     "{stack id: pairs}, empty_cache positions) at one moment; mark logs a snapshot event"},
    {"history_bytes", (PyCFunction)Core_history_bytes, METH_NOARGS,
     "(bytes per event in the ring, bytes the ring and its side lists take)"},
    {"history_stats", (PyCFunction)Core_history_stats, METH_NOARGS,
     "(stacks interned, code objects kept alive)"},
    {"replay", (PyCFunction)Core_replay, METH_VARARGS,
     "replay(ops, addrs, sizes, streams, init_recorded, init_replayed, oom_type, reserved_out, "
     "allocated_out) -> (first failed op or -1, unmatched frees); see whatif.replay"},
    {"allocated", (PyCFunction)Core_allocated, METH_NOARGS, ""},
    {"reserved", (PyCFunction)Core_reserved, METH_NOARGS, ""},
    {"largest_free_block", (PyCFunction)Core_largest_free_block, METH_NOARGS, ""},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Core_slots[] = {
    {Py_tp_doc, "The caching allocator's policy in C; see _pycore.PyCore for the reference."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, (void *)Core_init},
    {Py_tp_dealloc, (void *)Core_dealloc},
    {Py_tp_traverse, (void *)Core_traverse},
    {Py_tp_clear, (void *)Core_clear},
    {Py_tp_methods, Core_methods},
    {0, NULL},
};

static PyType_Spec Core_spec = {
    "jupyter_gpumem._native.Core", sizeof(Core), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    Core_slots,
};

static PyMethodDef module_methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "jupyter_gpumem._native", "The allocator's fast core.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *type = PyType_FromSpec(&Core_spec);
    if (!type) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    CoreType = (PyTypeObject *)type;
    Py_INCREF(type); /* CoreType keeps one reference for the module's lifetime */
    if (PyModule_AddObject(m, "Core", type) < 0) {
        Py_DECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    if (add_hooks_type(m) < 0 || add_torch_functions(m) < 0 ||
        add_export_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

