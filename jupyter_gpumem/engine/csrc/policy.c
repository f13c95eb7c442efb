/* The caching-allocator policy; the rules are listed at the top of allocator.py. */
#include "core.h"

/* ---------------------------------------------------------------------------------------- */
/* size rules                                                                                */

int64_t round_size(int64_t size, int64_t divisions) {
    if (size < MIN_BLOCK_SIZE) return MIN_BLOCK_SIZE;
    if (divisions > 1 && size > MIN_BLOCK_SIZE * divisions) {
        if ((size & (size - 1)) == 0) return size;
        int64_t floor = 1;
        while (floor <= size / 2) floor <<= 1;
        int64_t step = floor / divisions;
        if (step == 0) return floor << 1;
        int64_t rounded = size & ~(step - 1);
        return rounded == size ? size : rounded + step;
    }
    return (size + MIN_BLOCK_SIZE - 1) / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE;
}

static int64_t segment_size_for(int64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (size < MIN_LARGE_ALLOC) return LARGE_BUFFER;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* ---------------------------------------------------------------------------------------- */
/* address map                                                                               */

static inline Py_ssize_t map_slot(const AddrMap *m, uint64_t key) {
    uint64_t h = (key >> 9) * 0x9E3779B97F4A7C15ULL;
    return (Py_ssize_t)(h >> 20) & (m->cap - 1);
}

static int map_grow(AddrMap *m) {
    Py_ssize_t old_cap = m->cap, new_cap = old_cap ? old_cap * 2 : 64;
    uint64_t *old_keys = m->keys;
    Block **old_vals = m->vals;
    uint64_t *keys = PyMem_Calloc((size_t)new_cap, sizeof(uint64_t));
    Block **vals = PyMem_Calloc((size_t)new_cap, sizeof(Block *));
    if (!keys || !vals) {
        PyMem_Free(keys);
        PyMem_Free(vals);
        PyErr_NoMemory();
        return -1;
    }
    m->keys = keys;
    m->vals = vals;
    m->cap = new_cap;
    for (Py_ssize_t i = 0; i < old_cap; i++) {
        if (old_keys[i]) {
            Py_ssize_t j = map_slot(m, old_keys[i]);
            while (keys[j]) j = (j + 1) & (new_cap - 1);
            keys[j] = old_keys[i];
            vals[j] = old_vals[i];
        }
    }
    PyMem_Free(old_keys);
    PyMem_Free(old_vals);
    return 0;
}

/* whether the next map_put must grow the map (allocate) */
static inline int map_full(const AddrMap *m) { return (m->n + 1) * 2 > m->cap; }

static int map_put(AddrMap *m, uint64_t key, Block *b) {
    if (map_full(m) && map_grow(m) < 0) return -1;
    Py_ssize_t j = map_slot(m, key);
    while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->n++;
    m->keys[j] = key;
    m->vals[j] = b;
    return 0;
}

Block *map_get(const AddrMap *m, uint64_t key) {
    if (!m->cap || !key) return NULL;
    Py_ssize_t j = map_slot(m, key);
    while (m->keys[j]) {
        if (m->keys[j] == key) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

static Block *map_pop(AddrMap *m, uint64_t key) {
    if (!m->cap || !key) return NULL;
    Py_ssize_t mask = m->cap - 1, j = map_slot(m, key);
    while (m->keys[j] && m->keys[j] != key) j = (j + 1) & mask;
    if (!m->keys[j]) return NULL;
    Block *found = m->vals[j];
    /* backward-shift deletion keeps every probe chain unbroken */
    Py_ssize_t hole = j, k = (j + 1) & mask;
    while (m->keys[k]) {
        Py_ssize_t home = map_slot(m, m->keys[k]);
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            m->keys[hole] = m->keys[k];
            m->vals[hole] = m->vals[k];
            hole = k;
        }
        k = (k + 1) & mask;
    }
    m->keys[hole] = 0;
    m->vals[hole] = NULL;
    m->n--;
    return found;
}

/* ---------------------------------------------------------------------------------------- */
/* pools                                                                                     */

/* A pool finds a stream's list by a scan while it has fewer than STREAM_SCAN streams, then by
   a hash index (a trace may name a million streams: a scan made its replay quadratic). */
enum { STREAM_SCAN = 8 };

typedef struct StreamList {
    StreamBlocks **v;
    Py_ssize_t *n, *cap, **slots, *nslots;
} StreamList;

static inline size_t stream_home(int64_t stream, Py_ssize_t nslots) {
    return (size_t)(((uint64_t)stream * 0x9E3779B97F4A7C15ULL) >> 32) & (size_t)(nslots - 1);
}

static void slot_put(Py_ssize_t *slots, Py_ssize_t nslots, int64_t stream, Py_ssize_t index) {
    size_t j = stream_home(stream, nslots);
    while (slots[j]) j = (j + 1) & (size_t)(nslots - 1);
    slots[j] = index + 1;
}

/* Index every stream of l again, in a table of at least 4 slots a stream; -1 on out of
   memory (exception set). */
static int slots_rebuild(const StreamList *l) {
    Py_ssize_t want = 16;
    while (want < *l->n * 4) want *= 2;
    Py_ssize_t *slots = PyMem_Calloc((size_t)want, sizeof(Py_ssize_t));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *l->n; i++) slot_put(slots, want, (*l->v)[i].stream, i);
    PyMem_Free(*l->slots);
    *l->slots = slots;
    *l->nslots = want;
    return 0;
}

/* The blocks of one stream in a list of per-stream lists, added (at the end: lists keep their
   first-use order) when create is set; NULL when absent, or on out of memory (exception
   set). */
static StreamBlocks *stream_in(const StreamList *l, int64_t stream, int create) {
    StreamBlocks *v = *l->v;
    if (*l->nslots) {
        size_t mask = (size_t)(*l->nslots - 1);
        for (size_t j = stream_home(stream, *l->nslots); (*l->slots)[j]; j = (j + 1) & mask)
            if (v[(*l->slots)[j] - 1].stream == stream) return &v[(*l->slots)[j] - 1];
    } else {
        for (Py_ssize_t i = 0; i < *l->n; i++)
            if (v[i].stream == stream) return &v[i];
    }
    if (!create) return NULL;
    if (*l->n == *l->cap) {
        Py_ssize_t bigger = *l->cap ? *l->cap * 2 : 4;
        v = PyMem_Realloc(*l->v, (size_t)bigger * sizeof(StreamBlocks));
        if (!v) {
            PyErr_NoMemory();
            return NULL;
        }
        *l->v = v;
        *l->cap = bigger;
    }
    Py_ssize_t i = (*l->n)++;
    StreamBlocks *s = &v[i];
    s->stream = stream;
    s->v = NULL;
    s->n = s->cap = s->head = 0;
    if (*l->n >= STREAM_SCAN && *l->n * 2 > *l->nslots) {
        if (slots_rebuild(l) < 0) {
            (*l->n)--;
            return NULL;
        }
    } else if (*l->nslots) {
        slot_put(*l->slots, *l->nslots, stream, i);
    }
    return s;
}

/* A stream's sorted list moves the shorter side on an insert or a removal: its buffer keeps
   room at both ends, so blocks freed in descending address order (inserted at the front of
   their size's run) cost no more than ascending ones. */

/* whether putting a block at index i of s needs a new buffer (allocates) */
static inline int stream_full_at(const StreamBlocks *s, Py_ssize_t i) {
    return i < s->n - i ? s->head == 0 : s->head + s->n == s->cap;
}

/* Put b at index i of s (its first buffer of first_cap slots); -1 on out of memory. */
static int stream_insert_at(StreamBlocks *s, Py_ssize_t i, Block *b, Py_ssize_t first_cap) {
    if (stream_full_at(s, i)) {
        /* by the count, not the old size: a list used as a queue (in at one end, out at the
           other) is recentred now and then, not grown without end */
        Py_ssize_t cap = s->n * 2 + 2 > first_cap ? s->n * 2 + 2 : first_cap;
        Block **buf = PyMem_Malloc((size_t)cap * sizeof(Block *));
        if (!buf) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t head = (cap - s->n - 1) / 2;
        if (s->n) {
            memcpy(buf + head, s->v, (size_t)i * sizeof(Block *));
            memcpy(buf + head + i + 1, s->v + i, (size_t)(s->n - i) * sizeof(Block *));
        }
        PyMem_Free(s->v ? s->v - s->head : NULL);
        s->v = buf + head;
        s->head = head;
        s->cap = cap;
    } else if (i < s->n - i) {
        memmove(s->v - 1, s->v, (size_t)i * sizeof(Block *));
        s->v--;
        s->head--;
    } else {
        memmove(&s->v[i + 1], &s->v[i], (size_t)(s->n - i) * sizeof(Block *));
    }
    s->v[i] = b;
    s->n++;
    return 0;
}

static StreamBlocks *pool_stream(Pool *p, int64_t stream, int create) {
    StreamList l = {&p->streams, &p->nstreams, &p->capstreams, &p->slots, &p->nslots};
    return stream_in(&l, stream, create);
}

/* first index in [lo, hi) whose (size, addr) >= (size, addr), else hi */
static Py_ssize_t lower_bound_in(const StreamBlocks *s, Py_ssize_t lo, Py_ssize_t hi,
                                 int64_t size, int64_t addr) {
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        const Block *b = s->v[mid];
        if (b->size < size || (b->size == size && b->addr < addr)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* first index whose (size, addr) >= (size, addr) */
static Py_ssize_t lower_bound(const StreamBlocks *s, int64_t size, int64_t addr) {
    return lower_bound_in(s, 0, s->n, size, addr);
}

static inline int block_less(const Block *a, const Block *b) {
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* Note [Expandable splits are cheap]: with expandable segments every split follows the small
   pool's rule, so a 16 MiB request in a 20 MiB page is split on every malloc and merged again on
   every free, which the default policy (a 16 MiB segment of its own) never does; PyTorch pays
   for both. Two things make them cheap without changing any block, counter or order: a split's
   remainder takes the pool slot of the block it was cut from, and a merged block the slot of a
   neighbour it swallowed (pool_replace_at: one search, and a move of only the blocks between
   the two places, instead of a removal and an insertion); and the struct of a block merged away
   is kept for the next split (Core.spare), not freed and allocated again. */

/* Put b (of the pool p, s its stream's list) in slot i, whose block has just left, and move it
   to its place in (size, address) order: what pool_remove_at(s, i) and pool_insert(p, b) do,
   with one search and one move of the blocks between (Note [Expandable splits are cheap]). */
static void pool_move_into(StreamBlocks *s, Py_ssize_t i, Block *b) {
    Block **v = s->v;
    if (i > 0 && block_less(b, v[i - 1])) {
        Py_ssize_t j = lower_bound_in(s, 0, i - 1, b->size, b->addr);
        memmove(&v[j + 1], &v[j], (size_t)(i - j) * sizeof(Block *));
        i = j;
    } else if (i + 1 < s->n && block_less(v[i + 1], b)) {
        Py_ssize_t j = lower_bound_in(s, i + 2, s->n, b->size, b->addr) - 1;
        memmove(&v[i], &v[i + 1], (size_t)(j - i) * sizeof(Block *));
        i = j;
    }
    v[i] = b;
}

static inline void pool_replace_at(Pool *p, StreamBlocks *s, Py_ssize_t i, Block *b) {
    Block **v = s->v;
    if ((i > 0 && block_less(b, v[i - 1])) || (i + 1 < s->n && block_less(v[i + 1], b)))
        pool_move_into(s, i, b);
    else
        v[i] = b; /* its place already: in a steady state, the only block of its stream */
    b->gc_base = p->searches;
}

/* Index b in s, its stream's list of the pool p; -1 on out of memory. */
static int stream_insert(Pool *p, StreamBlocks *s, Block *b) {
    if (stream_insert_at(s, lower_bound(s, b->size, b->addr), b, 16) < 0) return -1;
    b->gc_base = p->searches;
    return 0;
}

static int pool_insert(Pool *p, Block *b) {
    StreamBlocks *s = pool_stream(p, b->stream, 1);
    return s ? stream_insert(p, s, b) : -1;
}

/* Block structs: one merged away is kept for the next split (Note [Expandable splits are
   cheap]); a struct from block_struct has every field to set. */
static inline Block *block_struct(Core *c) {
    Block *b = c->spare;
    if (!b) return block_struct_new();
    c->spare = NULL;
    return b;
}

static inline void block_struct_free(Core *c, Block *b) {
    if (c->spare) block_struct_delete(b);
    else c->spare = b;
}

/* Take out the block at index i of s: the blocks after it are then at i onwards (loops that
   remove as they walk rely on it). */
static void pool_remove_at(StreamBlocks *s, Py_ssize_t i) {
    if (i < s->n - 1 - i) {
        memmove(s->v + 1, s->v, (size_t)i * sizeof(Block *));
        s->v++;
        s->head++;
    } else {
        memmove(&s->v[i], &s->v[i + 1], (size_t)(s->n - i - 1) * sizeof(Block *));
    }
    s->n--;
}

static void pool_remove(Pool *p, Block *b) {
    StreamBlocks *s = pool_stream(p, b->stream, 0);
    Py_ssize_t i = lower_bound(s, b->size, b->addr);
    pool_remove_at(s, i);
}

static Py_ssize_t pool_count(const Pool *p) {
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < p->nstreams; i++) n += p->streams[i].n;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* segments                                                                                  */

/* Take a segment out of the core's list of segments. */
static void segment_unlink(Core *c, Segment *seg) {
    if (seg->prev) seg->prev->next = seg->next;
    else c->segments = seg->next;
    if (seg->next) seg->next->prev = seg->prev;
    c->nsegments--;
}

/* Note [Sizes near 2**63] in stats.py: the address r a device gave for a range of size bytes,
   checked to lie in [1, 2**63), so that every sum of an address and a size in a segment fits
   in 64 bits. Otherwise the range goes back to the device (a segment through its free, a
   virtual range through release) and it is -1 with ValueError set (PyCore._device_range). */
static int64_t device_range(Core *c, PyObject *r, int64_t size, int virtual_range) {
    int overflow;
    long long addr = PyLong_AsLongLongAndOverflow(r, &overflow);
    if (addr == -1 && PyErr_Occurred()) return -1;
    if (!overflow && addr > 0 && addr <= INT64_MAX - size) return addr;
    PyObject *give_back = virtual_range ? c->vmm_release : c->device_free;
    PyObject *g = !give_back ? NULL
                  : virtual_range ? PyObject_CallFunction(give_back, "OL", r, (long long)size)
                                  : PyObject_CallFunctionObjArgs(give_back, r, NULL);
    if (!g) PyErr_Clear(); /* the error below says what went wrong */
    Py_XDECREF(g);
    PyObject *hex = PyNumber_ToBase(r, 16);
    if (hex) {
        PyErr_Format(PyExc_ValueError,
                     "the device's %s returned %U for %lld B: the range must lie in [1, 2**63)",
                     virtual_range ? "reserve" : "malloc", hex, (long long)size);
        Py_DECREF(hex);
    }
    return -1;
}

/* A new segment: its whole-segment block in *out, or NULL when the device refused.
   Returns -1 (exception set) on any other error. */
static int alloc_expandable(Core *c, int small, int64_t size, int64_t stream, Block **out);

static int alloc_block(Core *c, int64_t size, int64_t stream, int small, int64_t request,
                       int retry, Block **out) {
    *out = NULL;
    if (retry) c->num_alloc_retries++;
    /* Note [Sizes near 2**63] in stats.py: reserved + size may not fit in 64 bits */
    if (c->cap >= 0 && size > c->cap - c->reserved) return 0;
    if (c->expandable) return alloc_expandable(c, small, request, stream, out);
    if (size > INT64_MAX - c->reserved) return 0;
    if (!c->device_malloc) {
        PyErr_SetString(PyExc_RuntimeError, "the allocator core was cleared");
        return -1;
    }
    PyObject *r = PyObject_CallFunction(c->device_malloc, "LL", (long long)size,
                                        (long long)stream);
    if (!r) {
        if (PyErr_ExceptionMatches(c->device_oom)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int64_t addr = device_range(c, r, size, 0);
    Py_DECREF(r);
    if (addr < 0) return -1;
    Segment *seg = PyMem_Malloc(sizeof(Segment));
    Block *b = block_struct_new();
    if (!seg || !b) {
        PyMem_Free(seg);
        block_struct_delete(b);
        PyErr_NoMemory();
        return -1;
    }
    seg->addr = addr;
    seg->size = size;
    seg->stream = stream;
    seg->small = small;
    seg->stack = NO_STACK;
    seg->expandable = 0;
    seg->mapped = 0;
    seg->prev = NULL;
    seg->next = c->segments;
    if (c->segments) c->segments->prev = seg;
    c->segments = seg;
    c->nsegments++;
    c->reserved += size;
    c->num_device_alloc++;
    pooled_inc(c, S_SEGMENT, small, 1);
    pooled_inc(c, S_RESERVED_BYTES, small, size);
    if (size >= c->max_split) stat_inc(&c->oversize_segments, 1);
    if (c->reserved > c->mark_reserved) c->mark_reserved = c->reserved;
    memset(b, 0, sizeof(Block));
    b->mapped = 1;
    b->addr = addr;
    b->size = size;
    b->stream = stream;
    b->small = small;
    b->segment = seg;
    b->stack = NO_STACK;
    *out = b;
    if (RECORDING(c)) {
        int64_t sid = record(c, A_SEGMENT_ALLOC, addr, size, 0, stream);
        if (sid == -2) return -1; /* the block is in a consistent state; the caller frees it */
        seg->stack = sid;
    }
    return 0;
}

/* A segment off the books, not yet given back to the device. */
typedef struct Detached { int64_t addr, size, stream; } Detached;

/* Take a cached whole-segment block off the books (pool, segment list, counters) and free its
   structs; return_segments gives it to the device. No Python code runs here. */
static void detach(Core *c, Block *b, Detached *out) {
    Pool *p = &c->pools[b->small];
    Segment *seg = b->segment;
    pool_remove(p, b);
    segment_unlink(c, seg);
    c->reserved -= b->size;
    c->num_device_free++;
    pooled_dec(c, S_SEGMENT, b->small, 1);
    pooled_dec(c, S_RESERVED_BYTES, b->small, b->size);
    if (b->size >= c->max_split) stat_dec(&c->oversize_segments, 1);
    out->addr = b->addr;
    out->size = b->size;
    out->stream = b->stream;
    stack_release(&c->h, seg->stack); /* Note [History in C] in core.h; pure C, no Python runs */
    PyMem_Free(seg);
    block_struct_delete(b);
}

/* Give detached segments to the device; Note [Device calls come last] in _allocator.py. The
   device's free may re-enter malloc/free: only the plain values in v are used across it. Every
   segment is tried; the first error is restored at the end. Frees v. */
static int return_segments(Core *c, Detached *v, Py_ssize_t n, int reason) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *device_free = c->device_free;
        if (!device_free) continue; /* cleared: the device object is gone */
        Py_INCREF(device_free);
        PyObject *r = PyObject_CallFunction(device_free, "L", (long long)v[i].addr);
        Py_DECREF(device_free);
        int failed = r == NULL;
        Py_XDECREF(r);
        if (!failed && RECORDING(c)) {
            c->h.reason = reason; /* Note [Recording empty_cache] in history.py */
            if (record(c, A_SEGMENT_FREE, v[i].addr, v[i].size, 0, v[i].stream) == -2)
                failed = 1;
        }
        if (failed) {
            if (type) PyErr_Clear();
            else PyErr_Fetch(&type, &value, &tb);
        }
    }
    PyMem_Free(v);
    if (type) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return 0;
}

/* Detach the n blocks of chosen (whole cached segments) and give them back. Frees nothing of
   chosen; -1 with an exception set on error. */
static int release_blocks(Core *c, Block **chosen, Py_ssize_t n, int reason) {
    if (n == 0) return 0;
    Detached *v = PyMem_Malloc((size_t)n * sizeof(Detached));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) detach(c, chosen[i], &v[i]);
    return return_segments(c, v, n, reason);
}

static int is_whole(const Block *b) { return b->prev == NULL && b->next == NULL; }

/* a whole classic segment: what release_block may give back (never an expandable one) */
static int is_whole_classic(const Block *b) { return is_whole(b) && !b->segment->expandable; }

int64_t segment_reserved(const Segment *s) { return s->expandable ? s->mapped : s->size; }

typedef struct StreamOrder { int64_t stream; Py_ssize_t index; } StreamOrder;

static int by_stream_id(const void *a, const void *b) {
    int64_t x = ((const StreamOrder *)a)->stream, y = ((const StreamOrder *)b)->stream;
    return (x > y) - (x < y);
}

/* Blocks of a pool in (stream, size, address) order, into a new array (for release loops). */
static Block **pool_snapshot(Pool *p, Py_ssize_t *n) {
    Py_ssize_t total = pool_count(p), k = 0, ns = p->nstreams;
    Block **v = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Block *));
    StreamOrder *order = PyMem_Malloc((size_t)(ns ? ns : 1) * sizeof(StreamOrder));
    if (!v || !order) {
        PyMem_Free(v);
        PyMem_Free(order);
        PyErr_NoMemory();
        return NULL;
    }
    /* streams are kept in first-use order: sort their indices by stream id */
    for (Py_ssize_t i = 0; i < ns; i++) order[i] = (StreamOrder){p->streams[i].stream, i};
    qsort(order, (size_t)ns, sizeof(StreamOrder), by_stream_id);
    for (Py_ssize_t i = 0; i < ns; i++) {
        StreamBlocks *s = &p->streams[order[i].index];
        for (Py_ssize_t j = 0; j < s->n; j++) v[k++] = s->v[j];
    }
    PyMem_Free(order);
    *n = k;
    return v;
}

typedef struct Unmapping { Block *b; int64_t addr, size; } Unmapping;
static void claim_unmap(Core *c, Block *b, Unmapping *out, Py_ssize_t *n);
static int unmap_claimed(Core *c, Unmapping *v, Py_ssize_t n, int reason);
static int release_unmapped_segments(Core *c);

int release_cached_blocks(Core *c, int reason) {
    c->num_sync_all_streams++;
    Py_ssize_t n[2], kept = 0;
    Block **v[2] = {NULL, NULL};
    for (int which = 0; which < 2; which++) { /* large pool first, then small */
        v[which] = pool_snapshot(&c->pools[which], &n[which]);
        if (!v[which]) {
            PyMem_Free(v[0]);
            return -1;
        }
    }
    Block **chosen = PyMem_Malloc((size_t)(n[0] + n[1] + 1) * sizeof(Block *));
    Unmapping *u = PyMem_Malloc((size_t)(n[0] + n[1] + 1) * sizeof(Unmapping));
    if (!chosen || !u) {
        PyMem_Free(chosen);
        PyMem_Free(u);
        PyMem_Free(v[0]);
        PyMem_Free(v[1]);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t nu = 0;
    for (int which = 0; which < 2; which++) {
        for (Py_ssize_t i = 0; i < n[which]; i++) {
            Block *b = v[which][i];
            if (b->segment->expandable) claim_unmap(c, b, u, &nu);
            else if (is_whole(b)) chosen[kept++] = b;
        }
        PyMem_Free(v[which]);
    }
    int r = release_blocks(c, chosen, kept, reason);
    PyMem_Free(chosen);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (r < 0) PyErr_Fetch(&type, &value, &tb);
    int r2 = unmap_claimed(c, u, nu, reason);
    if (r2 < 0) {
        if (r < 0) PyErr_Clear();
        else PyErr_Fetch(&type, &value, &tb);
        r = -1;
    }
    r2 = release_unmapped_segments(c);
    if (r < 0) {
        if (r2 < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return r2;
}

/* 1 if it released what is needed, 0 if not, -1 on error.
   See Note [Oversize blocks after a runtime change] in _allocator.py: whole segments only. */
static int release_available_cached_blocks(Core *c, Pool *p, int64_t size, int64_t stream) {
    int64_t ms = c->max_split;
    if (ms == NO_LIMIT) return 0;
    int64_t want = size > ms ? size : ms;
    StreamBlocks *s = pool_stream(p, stream, 0);
    if (!s || s->n == 0) return 0;
    Block **chosen = PyMem_Malloc((size_t)s->n * sizeof(Block *));
    if (!chosen) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t kept = 0;
    int64_t released = 0;
    for (Py_ssize_t i = lower_bound(s, want, 0); i < s->n; i++)
        if (is_whole_classic(s->v[i])) {
            chosen[kept++] = s->v[i];
            released = want;
            break;
        }
    if (!kept) {
        for (Py_ssize_t i = s->n - 1; i >= 0 && released < want && s->v[i]->size >= ms; i--)
            if (is_whole_classic(s->v[i])) {
                chosen[kept++] = s->v[i];
                released += s->v[i]->size;
            }
    }
    int r = release_blocks(c, chosen, kept, R_OVERSIZE);
    PyMem_Free(chosen);
    if (r < 0) return -1;
    return released >= want;
}

static int garbage_collect(Core *c) {
    int64_t threshold = (int64_t)(c->gc_threshold * (double)c->cap);
    if (c->reserved <= threshold) return 0;
    int64_t target = c->reserved - threshold;
    Pool *p = &c->pools[0];
    Py_ssize_t n;
    Block **v = pool_snapshot(p, &n);
    if (!v) return -1;
    int64_t total_age = 0, count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (is_whole_classic(v[i])) {
            total_age += p->searches - v[i]->gc_base;
            count++;
        }
    PyMem_Free(v);
    int64_t reclaimed = 0;
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double average = (double)total_age / (double)count;
        freed = 0;
        v = pool_snapshot(p, &n);
        if (!v) return -1;
        Py_ssize_t kept = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Block *b = v[i];
            int64_t age = p->searches - b->gc_base;
            if (is_whole_classic(b) && (double)age >= average) {
                freed = 1;
                reclaimed += b->size;
                total_age -= age;
                count--;
                v[kept++] = b; /* compacts in place: kept <= i */
            }
        }
        int r = release_blocks(c, v, kept, R_GC);
        PyMem_Free(v);
        if (r < 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* malloc and free                                                                           */

static Py_ssize_t expandable_fit(Core *c, const StreamBlocks *s, Py_ssize_t i);

/* A search of the pool, for the ages garbage collection reads. */
static inline void count_search(Core *c, Pool *p) {
    if (c->gc_threshold > 0 && c->cap >= 0) p->searches++;
}

/* The cached block a request of size bytes takes, or NULL; the search is not counted. It stays
   in the pool, at index *at of *in: the caller takes it out, or puts a split's remainder in its
   slot. Changes nothing and calls no Python. */
static Block *find_free_block(Core *c, Pool *p, int64_t size, int64_t stream,
                              StreamBlocks **in, Py_ssize_t *at) {
    StreamBlocks *s = pool_stream(p, stream, 0);
    if (!s || s->n == 0) return NULL;
    Py_ssize_t i = lower_bound(s, size, 0);
    if (i == s->n) return NULL;
    Block *b = s->v[i];
    if (c->any_expandable && b->segment->expandable) {
        i = expandable_fit(c, s, i);
        if (i < 0) return NULL;
        b = s->v[i];
    }
    int64_t ms = c->max_split;
    if (size < ms) {
        if (b->size >= ms) return NULL;
    } else if (b->size >= size + LARGE_BUFFER) {
        return NULL;
    }
    *in = s;
    *at = i;
    return b;
}

static Block *get_free_block(Core *c, Pool *p, int64_t size, int64_t stream,
                             StreamBlocks **in, Py_ssize_t *at) {
    count_search(c, p);
    return find_free_block(c, p, size, stream, in, at);
}

/* Count, record and raise an out-of-memory error. args (stolen; NULL on error) are the OOM
   handler's (nbytes, rounded, segment_size, stream); size is the recorded event's size and
   requested the bytes asked for (its block_size: Note [Recording empty_cache] in history.py). */
static PyObject *raise_oom_args(Core *c, int64_t size, int64_t requested, int64_t stream,
                                PyObject *args) {
    if (!args) return NULL;
    c->num_ooms++;
    if (RECORDING(c) && record(c, A_OOM, 0, size, requested, stream) == -2) {
        Py_DECREF(args);
        return NULL;
    }
    if (!c->oom_handler) {
        Py_DECREF(args);
        return PyErr_NoMemory();
    }
    PyObject *exc = PyObject_Call(c->oom_handler, args, NULL);
    Py_DECREF(args);
    if (!exc) return NULL;
    PyObject *type = PyObject_Type(exc);
    PyErr_SetObject(type, exc);
    Py_DECREF(type);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *raise_oom(Core *c, int64_t nbytes, int64_t size, int64_t segment_size,
                           int64_t stream) {
    return raise_oom_args(c, size, nbytes, stream,
                          Py_BuildValue("(LLLL)", (long long)nbytes, (long long)size,
                                        (long long)segment_size, (long long)stream));
}

/* A request above MAX_ALLOC_SIZE (nbytes_obj, any size): out of memory at once, the cache left
   alone; see Note [Arguments of the cores] in _allocator.py. Called with the lock held. */
PyObject *core_oom_too_large(Core *c, PyObject *nbytes_obj, int64_t stream) {
    int overflow;
    long long size = PyLong_AsLongLongAndOverflow(nbytes_obj, &overflow);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (overflow) size = INT64_MAX;
    return raise_oom_args(c, size, size, stream,
                          Py_BuildValue("(OOOL)", nbytes_obj, nbytes_obj, nbytes_obj,
                                        (long long)stream));
}

static void free_block(Core *c, Block *b) {
    /* Merge with free neighbours, then cache. See Note [Stats of a split] in pycore.py. The
       merged block takes a neighbour's slot in the pool (Note [Expandable splits are cheap]):
       the slots are found before any neighbour's struct is let go. */
    Pool *p = &c->pools[b->small];
    int64_t net_blocks = 0, net_bytes = 0;
    Block *prev = b->prev, *next = b->next;
    int with_prev = prev && !prev->allocated && prev->mapped;
    int with_next = next && !next->allocated && next->mapped;
    StreamBlocks *s = pool_stream(p, b->stream, 1); /* NULL: out of memory, no neighbour */
    Py_ssize_t slot = -1;
    if (s && with_prev) slot = lower_bound(s, prev->size, prev->addr);
    if (s && with_next) {
        Py_ssize_t j = lower_bound(s, next->size, next->addr);
        if (slot < 0) {
            slot = j;
        } else {
            pool_remove_at(s, j);
            if (j < slot) slot--;
        }
    }
    if (with_prev) {
        b->addr = prev->addr;
        b->size += prev->size;
        b->prev = prev->prev;
        if (prev->prev) prev->prev->next = b;
        net_blocks -= 1;
        net_bytes -= prev->size;
        block_struct_free(c, prev);
    }
    if (with_next) {
        b->size += next->size;
        b->next = next->next;
        if (next->next) next->next->prev = b;
        net_blocks -= 1;
        net_bytes -= next->size;
        block_struct_free(c, next);
    }
    b->allocated = 0;
    stack_release(&c->h, b->stack); /* Note [History in C] in core.h */
    b->stack = NO_STACK;
    if (slot >= 0) pool_replace_at(p, s, slot, b);
    else if (!s || stream_insert(p, s, b) < 0)
        PyErr_Clear(); /* out of memory: the block is leaked to the map */
    if (!is_whole(b)) {
        net_blocks += 1;
        net_bytes += b->size;
    }
    int small = b->small;
    if (c->any_expandable && b->segment->expandable) net_blocks = net_bytes = 0; /* no counts */
    if (net_blocks > 0) pooled_inc(c, S_INACTIVE_SPLIT, small, net_blocks);
    else if (net_blocks < 0) pooled_dec(c, S_INACTIVE_SPLIT, small, -net_blocks);
    if (net_bytes > 0) pooled_inc(c, S_INACTIVE_SPLIT_BYTES, small, net_bytes);
    else if (net_bytes < 0) pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, -net_bytes);
    pooled_dec(c, S_REQUESTED_BYTES, small, b->requested);
    b->requested = 0;
}

/* A live block, already out of the address map, goes back to the cache: counters and merge. */
static void unaccount_and_cache(Core *c, Block *b) {
    int small = b->small;
    pooled_dec(c, S_ALLOCATION, small, 1);
    pooled_dec(c, S_ALLOCATED_BYTES, small, b->size);
    if (b->size >= c->max_split) stat_dec(&c->oversize_allocations, 1);
    free_block(c, b);
}

/* Hand b out for a request of nbytes rounded to size: split off what it does not need, take it
   off the pool (it sits at found_in[found_at]; found_at < 0: a new segment's block, in no pool),
   index it as live and count it. 0, or -1 with an exception set, only where it must allocate:
   a split with no spare struct, a new segment's remainder, a full address map, none of which
   core_malloc_cached lets happen. Calls no Python. */
static int take_block(Core *c, Pool *p, Block *b, StreamBlocks *found_in, Py_ssize_t found_at,
                      int64_t size, int64_t nbytes) {
    int small = p->small;
    /* See Note [Stats of a split] in pycore.py. */
    int64_t remaining = b->size - size;
    /* Note [Expandable segments]: no inactive_split counts for their blocks; with the policy
       on, every split follows the small pool's rule */
    int counted = !(c->any_expandable && b->segment->expandable);
    int already_split = counted && !is_whole(b);
    int split = (small || c->expandable) ? remaining >= MIN_BLOCK_SIZE
                                         : (size < c->max_split && remaining > SMALL_SIZE);
    if (split) {
        Block *rest = block_struct(c);
        if (!rest) {
            if (found_at < 0) pool_insert(p, b); /* a new segment: cached, not lost */
            PyErr_NoMemory();
            return -1;
        }
        rest->addr = b->addr + size; /* every field: Note [Expandable splits are cheap] */
        rest->size = remaining;
        rest->requested = 0;
        rest->stream = b->stream;
        rest->gc_base = 0;
        rest->stack = NO_STACK;
        rest->segment = b->segment;
        rest->small = small;
        rest->allocated = 0;
        rest->mapped = 1;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        b->size = size;
        if (found_at >= 0) pool_replace_at(p, found_in, found_at, rest);
        else if (pool_insert(p, rest) < 0) return -1;
        if (already_split) {
            pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, size);
        } else if (counted) {
            pooled_inc(c, S_INACTIVE_SPLIT_BYTES, small, remaining);
            pooled_inc(c, S_INACTIVE_SPLIT, small, 1);
        }
    } else {
        if (found_at >= 0) pool_remove_at(found_in, found_at);
        if (already_split) {
            pooled_dec(c, S_INACTIVE_SPLIT_BYTES, small, b->size);
            pooled_dec(c, S_INACTIVE_SPLIT, small, 1);
        }
    }
    b->allocated = 1;
    b->requested = nbytes;
    if (map_put(&c->active, (uint64_t)b->addr, b) < 0) return -1;
    pooled_inc(c, S_ALLOCATION, small, 1);
    pooled_inc(c, S_ALLOCATED_BYTES, small, b->size);
    pooled_inc(c, S_REQUESTED_BYTES, small, nbytes);
    if (b->size >= c->max_split) stat_inc(&c->oversize_allocations, 1);
    int64_t allocated = c->pooled[S_ALLOCATED_BYTES][P_ALL].current;
    if (allocated > c->mark_allocated) c->mark_allocated = allocated;
    return 0;
}

PyObject *core_malloc_locked(Core *c, int64_t nbytes, int64_t stream) {
    if (nbytes > MAX_ALLOC_SIZE) {
        PyObject *obj = PyLong_FromLongLong(nbytes);
        if (!obj) return NULL;
        PyObject *r = core_oom_too_large(c, obj, stream);
        Py_DECREF(obj);
        return r;
    }
    int64_t size = round_size(nbytes, c->divisions);
    int small = size <= SMALL_SIZE;
    Pool *p = &c->pools[small];
    StreamBlocks *found_in = NULL;
    Py_ssize_t found_at = -1; /* where b is in the pool; -1: a new segment's block */
    Block *b = get_free_block(c, p, size, stream, &found_in, &found_at);
    if (!b) {
        if (c->gc_threshold > 0 && c->cap >= 0 && garbage_collect(c) < 0) return NULL;
        int64_t segment_size = segment_size_for(size);
        if (alloc_block(c, segment_size, stream, small, size, 0, &b) < 0) goto segment_error;
        if (!b) {
            int r = release_available_cached_blocks(c, p, size, stream);
            if (r < 0) return NULL;
            if (r && alloc_block(c, segment_size, stream, small, size, 0, &b) < 0) goto segment_error;
        }
        if (!b) {
            if (release_cached_blocks(c, R_RETRY) < 0) return NULL;
            if (alloc_block(c, segment_size, stream, small, size, 1, &b) < 0) goto segment_error;
        }
        if (!b) return raise_oom(c, nbytes, size, segment_size, stream);
    }
    if (take_block(c, p, b, found_in, found_at, size, nbytes) < 0) return NULL;
    if (RECORDING(c)) {
        int64_t sid = record(c, A_ALLOC, b->addr, nbytes, b->size, b->stream);
        if (sid == -2) {
            /* The caller never sees this block: give it back so nothing is lost. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            map_pop(&c->active, (uint64_t)b->addr);
            unaccount_and_cache(c, b);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        b->stack = sid;
    }
    return PyLong_FromLongLong(b->addr);

segment_error:
    /* A recorder failed after a segment was made: cache the segment so nothing is lost. */
    if (b) pool_insert(p, b);
    return NULL;
}

/* Free one address; 0 on success, -1 with an exception set. */
int core_free_addr(Core *c, unsigned long long ptr) {
    if (ptr == 0) return 0;
    core_lock(c);
    Block *b = map_pop(&c->active, ptr);
    if (!b) {
        core_unlock(c);
        char message[160]; /* PyErr_Format's hex support differs between Python versions */
        snprintf(message, sizeof message,
                 "free of address 0x%llx, which this allocator did not hand out or "
                 "which was already freed", ptr);
        PyErr_SetString(PyExc_ValueError, message);
        return -1;
    }
    int failed = 0;
    if (RECORDING(c)) {
        /* one call: the recorder logs free_requested and free_completed together */
        failed = record(c, A_FREE_REQUESTED, b->addr, b->requested, b->size, b->stream) == -2;
    }
    if (failed) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        unaccount_and_cache(c, b);
        PyErr_Restore(type, value, tb);
    } else {
        unaccount_and_cache(c, b);
    }
    core_unlock(c);
    return failed ? -1 : 0;
}

/* The cached paths of malloc and free for torch.c: Note [Calls without the GIL] there. Each runs
   with the core's lock held, by a thread that may not hold the GIL, so each calls no Python and
   allocates only raw memory (Note [Block structs are raw memory]). Each first checks that it can
   finish without anything else; if not it returns 0 having changed nothing, and the caller takes
   the GIL and goes the whole way (core_malloc_locked, core_free_addr). */

/* A cached block for nbytes (> 0) on stream: 1 with its address in *addr, or 0. What
   core_malloc_locked does on a hit, when no history is recorded. */
int core_malloc_cached(Core *c, int64_t nbytes, int64_t stream, int64_t *addr) {
    if (nbytes > MAX_ALLOC_SIZE || RECORDING(c) || map_full(&c->active)) return 0;
    int64_t size = round_size(nbytes, c->divisions);
    int small = size <= SMALL_SIZE;
    Pool *p = &c->pools[small];
    StreamBlocks *found_in = NULL;
    Py_ssize_t found_at = -1;
    Block *b = find_free_block(c, p, size, stream, &found_in, &found_at);
    if (!b) return 0;
    /* a split takes the spare struct: have one ready (it is kept for the next split if not) */
    if (!c->spare && !(c->spare = block_struct_new())) return 0;
    count_search(c, p);
    take_block(c, p, b, found_in, found_at, size, nbytes); /* cannot fail: checked above */
    *addr = b->addr;
    return 1;
}

/* Give back the live block at ptr: 1 done, 0 the slow path must do it, -1 no live block of
   this core is at ptr. What core_free_addr does when no stack is to be released and the block
   finds its place in the pool without a bigger buffer. */
int core_free_cached(Core *c, uint64_t ptr) {
    Block *b = map_get(&c->active, ptr);
    if (!b) return -1;
    if (RECORDING(c) || b->stack != NO_STACK) return 0; /* stack_release frees with PyMem */
    StreamBlocks *s = pool_stream(&c->pools[b->small], b->stream, 0);
    if (!s) return 0;
    int merges = (b->prev && !b->prev->allocated && b->prev->mapped) ||
                 (b->next && !b->next->allocated && b->next->mapped);
    /* a merged block takes a neighbour's slot; an unmerged one is inserted */
    if (!merges && stream_full_at(s, lower_bound(s, b->size, b->addr))) return 0;
    map_pop(&c->active, ptr);
    unaccount_and_cache(c, b);
    return 1;
}



/* ---------------------------------------------------------------------------------------- */
/* expandable segments: Note [Expandable segments] in engine/expandable.py; the functions     */
/* translate PyCore's of the same names                                                      */

static StreamBlocks *unmapped_stream(Pool *p, int64_t stream, int create) {
    StreamList l = {&p->ustreams, &p->nustreams, &p->capustreams, &p->uslots, &p->nuslots};
    return stream_in(&l, stream, create);
}

static Py_ssize_t addr_bound(const StreamBlocks *s, int64_t addr) {
    Py_ssize_t lo = 0, hi = s->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (s->v[mid]->addr < addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int unmapped_insert(Pool *p, Block *b) {
    StreamBlocks *s = unmapped_stream(p, b->stream, 1);
    if (!s || stream_insert_at(s, addr_bound(s, b->addr), b, 8) < 0) return -1;
    return 0;
}

static void unmapped_remove(Pool *p, Block *b) {
    StreamBlocks *s = unmapped_stream(p, b->stream, 0);
    pool_remove_at(s, addr_bound(s, b->addr));
}

/* what a block can grow to: its size plus the unmapped block right after it */
static int64_t room_of(const Block *b) {
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
}

static Py_ssize_t expandable_fit(Core *c, const StreamBlocks *s, Py_ssize_t i) {
    if (!c->expandable) { /* switched off: only blocks of classic segments */
        while (i < s->n && s->v[i]->segment->expandable) i++;
        return i < s->n ? i : -1;
    }
    while (s->v[i]->segment->expandable && i + 1 < s->n &&
           room_of(s->v[i + 1]) < room_of(s->v[i]))
        i++;
    return i;
}

static Block *new_block(int64_t addr, int64_t size, const Block *like) {
    Block *b = block_struct_new();
    if (!b) return NULL;
    memset(b, 0, sizeof(Block));
    b->addr = addr;
    b->size = size;
    b->stream = like->stream;
    b->small = like->small;
    b->segment = like->segment;
    b->stack = NO_STACK;
    b->mapped = 1;
    return b;
}

static void link_after(Block *b, Block *n) {
    n->prev = b;
    n->next = b->next;
    if (b->next) b->next->prev = n;
    b->next = n;
}

static void link_before(Block *b, Block *n) {
    n->next = b;
    n->prev = b->prev;
    if (b->prev) b->prev->next = n;
    b->prev = n;
}

/* dst takes over its neighbour src (either side); src is freed */
static void absorb(Block *dst, Block *src) {
    if (src == dst->prev) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (src->prev) src->prev->next = dst;
    } else {
        dst->next = src->next;
        if (src->next) src->next->prev = dst;
    }
    dst->size += src->size;
    block_struct_delete(src);
}

/* merge with free neighbours in the same mapped state, then index */
static void settle(Core *c, Block *b) {
    Pool *p = &c->pools[b->small];
    Block *others[2] = {b->prev, b->next};
    for (int k = 0; k < 2; k++) {
        Block *o = others[k];
        if (o && !o->allocated && o->mapped == b->mapped) {
            if (o->mapped) pool_remove(p, o);
            else unmapped_remove(p, o);
            absorb(b, o);
        }
    }
    if ((b->mapped ? pool_insert(p, b) : unmapped_insert(p, b)) < 0)
        PyErr_Clear(); /* out of memory: the block is lost to the indexes, as in free_block */
}

static void settle_chain(Core *c, Block **chain, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) chain[i]->allocated = 0;
    Block *run = chain[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (chain[i]->mapped == run->mapped) {
            absorb(run, chain[i]);
        } else {
            settle(c, run);
            run = chain[i];
        }
    }
    settle(c, run);
}

/* The start of the lowest run of size free bytes in an expandable segment of the pool and
   stream, or a new segment; *out NULL when the device has no address space. */
static int find_expandable(Core *c, Pool *p, int64_t size, int64_t stream, Block **out) {
    *out = NULL;
    StreamBlocks *s = unmapped_stream(p, stream, 0);
    for (Py_ssize_t i = 0; s && i < s->n; i++) {
        Block *start = s->v[i];
        if (start->prev && !start->prev->allocated) start = start->prev;
        int64_t room = 0;
        for (Block *b = start; b && room < size && !b->allocated; b = b->next) room += b->size;
        if (room >= size) {
            *out = start;
            return 0;
        }
    }
    if (!c->vmm_reserve) {
        PyErr_SetString(PyExc_RuntimeError, "the allocator core was cleared");
        return -1;
    }
    int64_t page = p->small ? SMALL_BUFFER : LARGE_BUFFER;
    /* address_space_size: total plus an eighth, at most MAX_VIRTUAL_RANGE, in whole pages */
    int64_t total = c->vmm_total;
    int64_t range = total > MAX_VIRTUAL_RANGE ? MAX_VIRTUAL_RANGE : total + total / 8;
    if (range > MAX_VIRTUAL_RANGE) range = MAX_VIRTUAL_RANGE;
    int64_t span = (range + page - 1) / page * page;
    if (span < size) return 0; /* more than one segment holds: out of memory, nothing reserved */
    PyObject *r = PyObject_CallFunction(c->vmm_reserve, "L", (long long)span);
    if (!r) {
        if (PyErr_ExceptionMatches(c->device_oom)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int64_t base = device_range(c, r, span, 1);
    Py_DECREF(r);
    if (base < 0) return -1;
    Segment *seg = PyMem_Malloc(sizeof(Segment));
    Block *b = block_struct_new();
    if (!seg || !b || unmapped_stream(p, stream, 1) == NULL) {
        PyMem_Free(seg);
        block_struct_delete(b);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    memset(seg, 0, sizeof(Segment));
    seg->addr = base;
    seg->size = span;
    seg->stream = stream;
    seg->small = p->small;
    seg->stack = NO_STACK;
    seg->expandable = 1;
    seg->next = c->segments;
    if (c->segments) c->segments->prev = seg;
    c->segments = seg;
    c->nsegments++;
    memset(b, 0, sizeof(Block));
    b->addr = base;
    b->size = span;
    b->stream = stream;
    b->small = p->small;
    b->segment = seg;
    b->stack = NO_STACK;
    b->mapped = 0;
    if (unmapped_insert(p, b) < 0) {
        block_struct_delete(b); /* the segment stays, with no blocks: released by nobody */
        return -1;
    }
    c->any_expandable = 1;
    *out = b;
    return 0;
}

/* What a segment_map or segment_unmap event carries in its block_size slot: the segment's
   base, plus 1 in the small pool (Note [Recording empty_cache] in history.py). */
static inline int64_t segment_tag(const Segment *seg) { return seg->addr + seg->small; }

/* Map pages so that a run of an expandable segment holds size bytes: the run, mapped and off
   the pools, in *out; NULL when a map failed (an OOM for the ladder). -1 on other errors. */
static int alloc_expandable(Core *c, int small, int64_t size, int64_t stream, Block **out) {
    *out = NULL;
    Pool *p = &c->pools[small];
    Block *start;
    if (find_expandable(c, p, size, stream, &start) < 0) return -1;
    if (!start) return 0;
    Py_ssize_t n = 0;
    int64_t covered = 0;
    for (Block *b = start; covered < size; b = b->next) {
        covered += b->size;
        n++;
    }
    Block **chain = PyMem_Malloc((size_t)(n + 1) * sizeof(Block *));
    if (!chain) {
        PyErr_NoMemory();
        return -1;
    }
    Block *b = start;
    for (Py_ssize_t i = 0; i < n; i++, b = b->next) { /* claimed */
        chain[i] = b;
        if (b->mapped) pool_remove(p, b);
        else unmapped_remove(p, b);
        b->allocated = 1;
    }
    Segment *seg = start->segment;
    int64_t page = small ? SMALL_BUFFER : LARGE_BUFFER, have = 0;
    int status = 1; /* 1 mapped, 0 a map failed, -1 error */
    Py_ssize_t m = n;
    for (Py_ssize_t i = 0; i < m; i++) {
        b = chain[i];
        if (b->mapped) {
            have += b->size;
            continue;
        }
        int64_t need = (size - have + page - 1) / page * page;
        int64_t want = b->size < need ? b->size : need;
        if (want > INT64_MAX - c->reserved) { /* Note [Sizes near 2**63] in stats.py */
            status = 0;
            break;
        }
        Block *tail = NULL;
        if (want < b->size && !(tail = new_block(b->addr + want, b->size - want, b))) {
            PyErr_NoMemory();
            status = -1;
            break;
        }
        PyObject *r = c->vmm_map ? PyObject_CallFunction(c->vmm_map, "LL", (long long)b->addr,
                                                         (long long)want)
                                 : (PyErr_SetString(PyExc_RuntimeError,
                                                    "the allocator core was cleared"), NULL);
        if (!r) {
            block_struct_delete(tail);
            if (PyErr_ExceptionMatches(c->device_oom)) {
                PyErr_Clear();
                status = 0;
            } else {
                status = -1;
            }
            break;
        }
        Py_DECREF(r);
        if (tail) {
            tail->mapped = 0;
            tail->allocated = 1;
            link_after(b, tail);
            b->size = want;
            chain[n++] = tail;
        }
        b->mapped = 1;
        seg->mapped += want;
        c->reserved += want;
        c->num_device_alloc++;
        pooled_inc(c, S_RESERVED_BYTES, small, want);
        if (c->reserved > c->mark_reserved) c->mark_reserved = c->reserved;
        have += want;
        if (RECORDING(c)) {
            int64_t sid = record(c, A_SEGMENT_MAP, b->addr, want, segment_tag(seg), stream);
            if (sid == -2) {
                status = -1;
                break;
            }
            if (seg->stack == NO_STACK) seg->stack = sid;
            else stack_release(&c->h, sid);
        }
    }
    if (status == 1) {
        Block *head = chain[0];
        for (Py_ssize_t i = 1; i < n; i++) {
            if (chain[i]->mapped) {
                absorb(head, chain[i]);
            } else {
                chain[i]->allocated = 0;
                settle(c, chain[i]);
            }
        }
        Block *next = head->next;
        if (next && !next->allocated && next->mapped) {
            pool_remove(p, next);
            absorb(head, next);
        }
        *out = head;
    } else {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        settle_chain(c, chain, n);
        PyErr_Restore(type, value, tb);
    }
    PyMem_Free(chain);
    return status < 0 ? -1 : 0;
}

/* Take the whole pages inside a cached block of an expandable segment off the books
   (unmap_block); unmap_claimed gives them to the device. Out of memory: the block stays. */
static void claim_unmap(Core *c, Block *b, Unmapping *out, Py_ssize_t *n) {
    Segment *seg = b->segment;
    int64_t page = b->small ? SMALL_BUFFER : LARGE_BUFFER;
    int64_t offset = b->addr - seg->addr;
    int64_t begin = seg->addr + (offset + page - 1) / page * page;
    int64_t end = seg->addr + (offset + b->size) / page * page;
    if (begin >= end) return;
    Pool *p = &c->pools[b->small];
    Block *before = NULL, *after = NULL;
    if (begin > b->addr && !(before = new_block(b->addr, begin - b->addr, b))) return;
    if (end < b->addr + b->size && !(after = new_block(end, b->addr + b->size - end, b))) {
        block_struct_delete(before);
        return;
    }
    pool_remove(p, b);
    if (before) {
        link_before(b, before);
        if (pool_insert(p, before) < 0) PyErr_Clear();
    }
    if (after) {
        link_after(b, after);
        if (pool_insert(p, after) < 0) PyErr_Clear();
    }
    int64_t size = end - begin;
    b->addr = begin;
    b->size = size;
    b->mapped = 0;
    b->allocated = 1; /* claimed until the device has unmapped it */
    seg->mapped -= size;
    c->reserved -= size;
    c->num_device_free++;
    pooled_dec(c, S_RESERVED_BYTES, b->small, size);
    out[*n].b = b;
    out[*n].addr = begin;
    out[*n].size = size;
    (*n)++;
}

/* Give a segment's reserved range back to the device; the first error of a series is kept in
   *type/*value/*tb (fetched), later ones are dropped. */
static void vmm_release_keeping_error(Core *c, int64_t addr, int64_t size, PyObject **type,
                                      PyObject **value, PyObject **tb) {
    if (!c->vmm_release) return;
    PyObject *release = c->vmm_release;
    Py_INCREF(release);
    PyObject *r = PyObject_CallFunction(release, "LL", (long long)addr, (long long)size);
    Py_DECREF(release);
    if (!r) {
        if (*type) PyErr_Clear();
        else PyErr_Fetch(type, value, tb);
    }
    Py_XDECREF(r);
}

/* Unmap claimed pages, settle their blocks, release every segment left with no mapped page.
   Every call is tried; the first error is restored at the end. Frees v. */
static int unmap_claimed(Core *c, Unmapping *v, Py_ssize_t n, int reason) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Block *b = v[i].b;
        int failed = 0;
        if (c->vmm_unmap) {
            PyObject *unmap = c->vmm_unmap;
            Py_INCREF(unmap);
            PyObject *r = PyObject_CallFunction(unmap, "LL", (long long)v[i].addr,
                                                (long long)v[i].size);
            Py_DECREF(unmap);
            failed = r == NULL;
            Py_XDECREF(r);
            if (!failed && RECORDING(c)) {
                c->h.reason = reason;
                if (record(c, A_SEGMENT_UNMAP, v[i].addr, v[i].size, segment_tag(b->segment),
                           b->stream) == -2)
                    failed = 1;
            }
            if (failed) {
                if (type) PyErr_Clear();
                else PyErr_Fetch(&type, &value, &tb);
            }
        }
        b->allocated = 0;
        settle(c, b);
        if (is_whole(b)) { /* release_expandable_segment */
            Segment *seg = b->segment;
            unmapped_remove(&c->pools[b->small], b);
            segment_unlink(c, seg);
            stack_release(&c->h, seg->stack);
            int64_t addr = seg->addr, size = seg->size;
            PyMem_Free(seg);
            block_struct_delete(b);
            vmm_release_keeping_error(c, addr, size, &type, &value, &tb);
        }
    }
    PyMem_Free(v);
    if (type) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return 0;
}

/* Release every expandable segment with no mapped page (PyCore._release_unmapped_segments). */
static int release_unmapped_segments(Core *c) {
    if (!c->any_expandable) return 0;
    Py_ssize_t total = 0, n = 0;
    for (int w = 0; w < 2; w++)
        for (Py_ssize_t i = 0; i < c->pools[w].nustreams; i++) total += c->pools[w].ustreams[i].n;
    if (total == 0) return 0;
    Detached *v = PyMem_Malloc((size_t)total * sizeof(Detached));
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (int w = 0; w < 2; w++) { /* large pool first, as PyCore's dicts are walked */
        Pool *p = &c->pools[w];
        for (Py_ssize_t i = 0; i < p->nustreams; i++) {
            StreamBlocks *s = &p->ustreams[i];
            for (Py_ssize_t j = 0; j < s->n;) {
                Block *b = s->v[j];
                if (!is_whole(b)) {
                    j++;
                    continue;
                }
                Segment *seg = b->segment;
                pool_remove_at(s, j);
                segment_unlink(c, seg);
                stack_release(&c->h, seg->stack);
                v[n].addr = seg->addr;
                v[n].size = seg->size;
                v[n].stream = seg->stream;
                n++;
                PyMem_Free(seg);
                block_struct_delete(b);
            }
        }
    }
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        vmm_release_keeping_error(c, v[i].addr, v[i].size, &type, &value, &tb);
    PyMem_Free(v);
    if (type) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return 0;
}
