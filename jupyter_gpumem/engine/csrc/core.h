/* The allocator's C core: shared types and the functions its files call across.
 *
 * policy.c   the caching-allocator policy: pools, rounding, split and merge, the retry ladder
 * history.c  events in a ring buffer, Python stacks walked and interned (Note [History in C])
 * export.c   the ring's events as columns for a snapshot (Note [Exporting ten million events])
 * module.c   the Core type: its Python methods, and the module
 * replay.c   a recorded alloc/free program run through the core in one loop (whatif)
 * hooks.c    the malloc/free pair CuPy's PythonFunctionAllocator calls, and a whole CuPy allocator
 * torch.c    the alloc/free pair PyTorch's CUDAPluggableAllocator calls, with or without the GIL
 *
 * It implements exactly the policy of the pure-Python core in pycore.py (the reference, whose
 * module docstring states the rules), with the same interface, so CachingAllocator can use
 * either. tests/test_native.py drives both with the same random programs and compares every
 * counter and every block.
 *
 * Layout:
 *   Block      a range of a segment; doubly linked with its neighbours in the segment.
 *   Segment    one device allocation; kept in a list for snapshots.
 *   Pool       the cached free blocks of the small or the large pool, per stream, each stream's
 *              blocks in a sorted array ordered by (size, address): best fit is a binary search.
 *   AddrMap    open-addressing hash map from address to live (handed-out) block.
 *
 * Thread safety: a re-entrant lock, taken by every method, guards the core's state. Most callers
 * hold the GIL, and the core may call back into Python under the lock (device malloc/free, the
 * history recorder, the OOM handler), where the same thread may re-enter (the OOM handler reads
 * the state it reports). PyTorch's threads call torch.c's entry points with or without the GIL:
 * Note [Calls without the GIL] there says what they may do without it. core_lock (the caller
 * holds the GIL) and core_lock_nogil (it does not) are defined below, in this header, so that
 * history.c, which takes the lock, needs nothing from policy.c, which records into history.c:
 * the policy calls the history, never the other way round. The few readers that skip the lock
 * (allocated(), reserved()) read one aligned 64-bit counter, which may be a moment old.
 */
#ifndef JUPYTER_GPUMEM_CORE_H
#define JUPYTER_GPUMEM_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <pthread.h>
#include <pythread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MIN_BLOCK_SIZE 512LL
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define NO_LIMIT INT64_MAX
/* requests above it are out of memory at once (data/sizes.MAX_ALLOC_SIZE) */
#define MAX_ALLOC_SIZE (1LL << 62)
/* the most an expandable segment's virtual range is, before rounding to pages (sizes.py) */
#define MAX_VIRTUAL_RANGE (1LL << 50)
#define NO_STACK (-1LL)

/* history actions, as history.py numbers them */
enum { A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED, A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_OOM,
       A_SNAPSHOT, A_SEGMENT_MAP, A_SEGMENT_UNMAP };
/* who released a segment (data/codes.RELEASE_REASONS; 0: not recorded) */
enum { R_NONE, R_EMPTY_CACHE, R_RETRY, R_OVERSIZE, R_GC };
/* what a stack walk does with a frame of a code object (_history.classify_code) */
enum { K_KEEP, K_SKIP, K_STOP };
#define MAX_FRAMES 24
/* kept code objects no stack refers to, let go of past this many (_history.CODE_CACHE_SLACK) */
#define CODE_CACHE_SLACK 256

/* pooled counters, in the order of stats() */
enum { S_ALLOCATION, S_SEGMENT, S_INACTIVE_SPLIT, S_ALLOCATED_BYTES, S_RESERVED_BYTES,
       S_INACTIVE_SPLIT_BYTES, S_REQUESTED_BYTES, N_POOLED };
enum { P_ALL, P_LARGE, P_SMALL };

typedef struct Stat { int64_t current, peak, allocated, freed; } Stat;

typedef struct Segment {
    int64_t addr, size, stream, stack;
    int64_t mapped; /* expandable: bytes of pages mapped (Note [Expandable segments]) */
    int small, expandable;
    struct Segment *prev, *next;
} Segment;

typedef struct Block {
    int64_t addr, size, requested, stream, gc_base, stack;
    Segment *segment;
    struct Block *prev, *next;
    int small, allocated, mapped; /* mapped: 0 only in an expandable segment */
} Block;

/* Note [Block structs are raw memory]: a Block struct comes from PyMem_RawMalloc, never
 * PyMem_Malloc, because a cached free (torch.c, without the GIL) merges blocks and lets their
 * structs go, and only the raw allocator may be called without the GIL. Every other buffer of
 * the core (pools, the address map, segments, history) is allocated and freed only with the GIL
 * held, so it stays on PyMem_Malloc. Always use these two for a Block. */
static inline Block *block_struct_new(void) { return PyMem_RawMalloc(sizeof(Block)); }
static inline void block_struct_delete(Block *b) { PyMem_RawFree(b); }

typedef struct StreamBlocks {
    int64_t stream;
    Block **v; /* n blocks, head slots after the start of their buffer of cap slots */
    Py_ssize_t n, cap, head;
} StreamBlocks;

typedef struct Pool {
    StreamBlocks *streams;
    Py_ssize_t nstreams, capstreams;
    /* unmapped blocks of expandable segments, per stream, by address */
    StreamBlocks *ustreams;
    Py_ssize_t nustreams, capustreams;
    /* stream -> 1 + its index in streams (ustreams), 0 empty: open addressing, nslots a power
       of two, none until a pool has STREAM_SCAN streams (policy.c's stream_in) */
    Py_ssize_t *slots, *uslots;
    Py_ssize_t nslots, nuslots;
    int64_t searches;
    int small;
} Pool;

typedef struct AddrMap {
    uint64_t *keys;
    Block **vals;
    Py_ssize_t cap, n; /* cap is a power of two */
} AddrMap;

/* Note [History in C]: an event is a fixed-size record in a ring buffer that grows by doubling
 * up to max_entries, then overwrites its oldest entry. A stack is the list of (code, offset)
 * pairs of the frames the walk keeps, interned in StackTable; code objects are classified once
 * (keep, skip our own frames, stop at IPython's run_code) by a Python function and kept alive
 * by CodeKinds, so their addresses can key the tables. Lines are looked up only in Python,
 * when a snapshot asks for frames.
 *
 * Stacks and code objects are reference-counted as Note [Interned stacks are reference-counted]
 * in _history.py says: an event in the ring, a live block and a live segment each hold one
 * reference to their stack; a stack holds one on each code object of its pairs. A released
 * stack frees its slot; its id, (generation << 32) | slot, is not given out again because the
 * slot's generation moves on. Code objects no stack refers to stay classified until more than
 * CODE_CACHE_SLACK (and more than the referenced ones) pile up, then all of them go. */
/* An event as it was recorded: what push_event takes and unpack_event gives back. */
typedef struct FullEvent {
    int64_t action, addr, size, block_size, stream, time_ns, stack, cell, device_free;
} FullEvent;

/* Note [A ring of 32-byte events]: the ring keeps an event in 32 bytes, whatever the options:
 * address, size and time in full, the stack's slot (an event holds a reference to its stack,
 * so the slot names it while the event lives), the action, the stream as an index into a small
 * table of the streams seen, and the block size as its excess over the rounded request in
 * 512-byte steps plus one (0: none). What does not fit (a 256th stream, an excess of 32 MiB or
 * more, an OOM's request and free bytes, a mapping's base, a release reason) goes to a side
 * list of Rare records, in event order, and the action's top bit says so. Cell numbers change
 * once per notebook cell, so they are kept as runs (first event, cell). Both side lists are
 * keyed by the event's position since recording began (dropped + index), so they stay right
 * while the ring wraps, and lose their head as old events fall out. */
#define RARE_FLAG 0x80
#define STREAM_RARE 255
typedef struct Event {
    int64_t addr, size, time_ns;
    int32_t stack;      /* slot in the stack table, -1: none */
    uint8_t action;     /* A_*, | RARE_FLAG when a Rare record holds the fields below */
    uint8_t stream;     /* index into History.streams; STREAM_RARE: in the Rare record */
    uint16_t excess;    /* (block_size - round_512(size)) / 512 + 1; 0: no block size */
} Event;

typedef struct Rare { int64_t seq, block_size, stream, device_free; } Rare;
typedef struct CellRun { int64_t seq, cell; } CellRun;

typedef struct Pair { PyObject *code; int64_t lasti; } Pair;

typedef struct Stack {
    uint64_t hash;
    Py_ssize_t n;
    Pair *pairs;        /* NULL: the slot is free */
    int64_t refs;       /* events, live blocks and live segments that hold it */
    int64_t gen;        /* the slot's generation, bumped when the stack is released */
    Py_ssize_t next_free;
} Stack;

typedef struct CodeKinds {
    PyObject **codes; /* keys; each holds a reference */
    int *kinds;
    int64_t *refs;    /* stacks whose pairs name it */
    Py_ssize_t cap, n, unused; /* unused: entries of kind K_KEEP with no stack */
} CodeKinds;

typedef struct History {
    int on, stacks;
    Event *ev;
    Py_ssize_t alloc, len, start, max_entries;
    int64_t dropped, last_stack, cell;
    /* Note [A ring of 32-byte events]: its side lists, each from index *_head on */
    Rare *rare;
    Py_ssize_t rare_head, rare_n, rare_cap;
    CellRun *runs;
    Py_ssize_t runs_head, runs_n, runs_cap;
    int64_t streams[STREAM_RARE];
    int nstreams;
    /* Note [Recording empty_cache] in history.py: positions of empty_cache() calls, counted
       from the start of recording, increasing; reason: the R_* of the next segment_free */
    int64_t *ec_at;
    Py_ssize_t ec_n, ec_cap;
    int64_t reason;
    PyObject *clock, *classify, *device_free; /* clock NULL: CLOCK_MONOTONIC, as perf_counter */
    CodeKinds kinds;
    Stack *stacks_v;
    Py_ssize_t nstacks, capstacks, used, free_head; /* nstacks interned now; used: slots ever */
    int64_t *index; /* open addressing: slots of stacks_v, -1 empty */
    Py_ssize_t index_cap;
    int walking; /* a stack walk is under way (code objects must stay) */
} History;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock; /* core_lock: a pthread mutex, which takes no clock reading */
    int lock_made;
    unsigned long owner;
    int depth;
    Pool pools[2]; /* [0] large, [1] small */
    AddrMap active;
    Block *spare; /* a block struct kept for the next split (Note [Expandable splits are cheap]) */
    Segment *segments;
    Py_ssize_t nsegments;
    int64_t reserved;
    int64_t max_split, cap, divisions;
    double gc_threshold;
    Stat pooled[N_POOLED][3];
    Stat oversize_allocations, oversize_segments;
    int64_t num_alloc_retries, num_ooms, num_device_alloc, num_device_free, num_sync_all_streams;
    int64_t mark_allocated, mark_reserved;
    PyObject *device_malloc, *device_free, *device_oom, *recorder, *oom_handler;
    /* Note [Expandable segments] in engine/expandable.py */
    int expandable, any_expandable;
    PyObject *vmm_reserve, *vmm_release, *vmm_map, *vmm_unmap;
    int64_t vmm_total;
    History h;
} Core;

#define RECORDING(c) ((c)->recorder != NULL || (c)->h.on)

/* the re-entrant lock ("Thread safety" above). Inline here rather than in one .c file: every
 * file takes it, and malloc and free take it once each, so it costs no call on the hot path.
 * A pthread mutex: CPython's own lock (3.11) reads the clock on every acquire, even one that
 * does not wait, which cost a quarter of a cached malloc+free. owner is read by threads that do
 * not hold the lock (is it mine?), so it is read and written atomically; only its owner ever
 * stores its own id there, and clears it before releasing, so a thread sees its own id only
 * while it holds the lock. depth is touched only by the owner. */

static inline unsigned long this_thread(void) { /* as PyThread_get_thread_ident() */
    return (unsigned long)(uintptr_t)pthread_self();
}

static inline unsigned long core_owner(const Core *c) {
    return __atomic_load_n(&c->owner, __ATOMIC_RELAXED);
}

/* 1 if this thread already holds the lock (depth bumped), else 0 */
static inline int core_relock(Core *c, unsigned long me) {
    if (core_owner(c) != me) return 0;
    c->depth++;
    return 1;
}

static inline void core_own(Core *c, unsigned long me) {
    __atomic_store_n(&c->owner, me, __ATOMIC_RELAXED);
    c->depth = 1;
}

/* For a caller that holds the GIL: waits with the GIL released, so that the holder (perhaps a
   thread without the GIL, Note [Calls without the GIL] in torch.c) can go on. */
static inline int core_lock(Core *c) {
    unsigned long me = this_thread();
    if (core_relock(c, me)) return 0;
    if (pthread_mutex_trylock(&c->lock) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&c->lock);
        Py_END_ALLOW_THREADS
    }
    core_own(c, me);
    return 0;
}

/* For a caller that does not hold the GIL (torch.c): a plain wait, no Python API. */
static inline void core_lock_nogil(Core *c) {
    unsigned long me = this_thread();
    if (core_relock(c, me)) return;
    pthread_mutex_lock(&c->lock);
    core_own(c, me);
}

static inline void core_unlock(Core *c) {
    if (--c->depth == 0) {
        __atomic_store_n(&c->owner, 0UL, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&c->lock);
    }
}

/* a 64-bit hash mix (MurmurHash3's finaliser, first half): the history's and the export's
   open-addressing tables */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* counters: Note [Sizes near 2**63] in stats.py. current never passes INT64_MAX (reserved bytes
   are bounded by it); the accumulated allocated and freed saturate there. amount >= 0. */

static inline int64_t add_saturating(int64_t total, int64_t amount) {
#if defined(__GNUC__) || defined(__clang__)
    int64_t sum; /* an add and a branch never taken: this runs several times per malloc */
    return __builtin_add_overflow(total, amount, &sum) ? INT64_MAX : sum;
#else
    return amount > INT64_MAX - total ? INT64_MAX : total + amount;
#endif
}

static inline void stat_inc(Stat *s, int64_t amount) {
    s->current += amount;
    s->allocated = add_saturating(s->allocated, amount);
    if (s->current > s->peak) s->peak = s->current;
}

static inline void stat_dec(Stat *s, int64_t amount) {
    s->current -= amount;
    s->freed = add_saturating(s->freed, amount);
}

static inline void pooled_inc(Core *c, int which, int small, int64_t amount) {
    stat_inc(&c->pooled[which][P_ALL], amount);
    stat_inc(&c->pooled[which][small ? P_SMALL : P_LARGE], amount);
}

static inline void pooled_dec(Core *c, int which, int small, int64_t amount) {
    stat_dec(&c->pooled[which][P_ALL], amount);
    stat_dec(&c->pooled[which][small ? P_SMALL : P_LARGE], amount);
}

/* policy.c */
int64_t round_size(int64_t size, int64_t divisions);
Block *map_get(const AddrMap *m, uint64_t key);
PyObject *core_malloc_locked(Core *c, int64_t nbytes, int64_t stream);
PyObject *core_oom_too_large(Core *c, PyObject *nbytes_obj, int64_t stream);
int core_free_addr(Core *c, unsigned long long ptr);
int core_malloc_cached(Core *c, int64_t nbytes, int64_t stream, int64_t *addr);
int core_free_cached(Core *c, uint64_t ptr);
int release_cached_blocks(Core *c, int reason);
int64_t segment_reserved(const Segment *s);

/* history.c */
int64_t record(Core *c, int action, int64_t addr, int64_t size, int64_t block_size,
               int64_t stream);
int64_t native_record(Core *c, int action, int64_t addr, int64_t size, int64_t block_size,
                      int64_t stream);
const Event *event_at(const History *h, Py_ssize_t i);
void unpack_event(const History *h, Py_ssize_t i, FullEvent *out);
void history_free_events(History *h);
void stack_release(History *h, int64_t sid);
PyObject *stack_pairs(const History *h, int64_t sid);
int history_add_stacks(PyObject *stacks, const History *h);
void history_dealloc(History *h);
int history_mark_empty_cache(History *h);
PyObject *history_empty_cache_positions(const History *h);
/* the Core methods of the history; each takes its argument(s) as METH_O/NOARGS/VARARGS */
PyObject *Core_history_configure(Core *c, PyObject *arg);
PyObject *Core_history_stop(Core *c, PyObject *arg);
PyObject *Core_history_clear(Core *c, PyObject *arg);
PyObject *Core_history_info(Core *c, PyObject *arg);
PyObject *Core_events(Core *c, PyObject *arg);
PyObject *Core_stack(Core *c, PyObject *arg);
PyObject *Core_history_stats(Core *c, PyObject *arg);
PyObject *Core_history_bytes(Core *c, PyObject *arg);
PyObject *Core_set_cell(Core *c, PyObject *arg);
PyObject *Core_record_snapshot(Core *c, PyObject *arg);

/* export.c */
PyObject *history_event_columns(const History *h);
int add_export_functions(PyObject *module);

/* replay.c */
PyObject *Core_replay(Core *c, PyObject *args);

/* module.c */
extern PyTypeObject *CoreType;
int add_hooks_type(PyObject *module);

/* torch.c */
int add_torch_functions(PyObject *module);

#endif
