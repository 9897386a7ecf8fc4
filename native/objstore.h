/*
 * objstore.h -- a shared-memory object store for one host.
 *
 * One region (a POSIX shared-memory object in /dev/shm, or a file-backed mapping in a
 * directory the caller gives when /dev/shm has no room) holds a header, an index from
 * 16-byte object ids to blocks, and a heap. Every local process maps the region once
 * (objstore_attach) and uses it through this library.
 *
 * Object lifecycle (Arrow Plasma's):
 *
 *     objstore_create ──► write through the returned pointer ──► objstore_seal
 *           │                                                         │
 *           └──► objstore_abort (unsealed only)        objstore_get / objstore_release
 *                                                                     │
 *                                                              objstore_delete
 *
 * Reference counts: objstore_create gives the creator one reference; objstore_get adds
 * one; objstore_release drops one. An unsealed object whose last reference is dropped is
 * aborted. objstore_delete of an object that still has references marks it "delete
 * pending": it disappears for new readers at once and its memory is freed when the last
 * reference is released.
 *
 * Crash safety: a process-shared robust mutex guards the region. Every update made under
 * it is journaled (undo log + intent record in the header), so the next process that
 * acquires the mutex after a holder died rolls the half-done update back before marking
 * the mutex consistent. Each attached process owns a slot (pid + start time); references
 * are recorded against the slot, and objstore_reap returns the references of processes
 * that are gone.
 *
 * Conventions: every function that can fail returns an objstore_status_t and writes its
 * outputs through pointers; no globals; handles are opaque; a handle must not be used by
 * a process other than the one that opened it (fork: attach again in the child). A handle
 * may be used by several threads of its process.
 */
#ifndef SCALER_OBJSTORE_H
#define SCALER_OBJSTORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OBJSTORE_ID_SIZE 16
/* Exit code of a process stopped by a test crash point (objstore_test_crash_point). */
#define OBJSTORE_CRASH_EXIT_CODE 86

typedef struct objstore objstore_t;

typedef enum {
    OBJSTORE_OK = 0,
    OBJSTORE_E_INVALID = 1,        /* bad argument (name, size, id, options) */
    OBJSTORE_E_NOT_FOUND = 2,      /* no such object (or it is delete-pending) */
    OBJSTORE_E_EXISTS = 3,         /* an object with this id exists */
    OBJSTORE_E_NOT_SEALED = 4,     /* the object is not sealed yet (get, delete) */
    OBJSTORE_E_SEALED = 5,         /* the object is already sealed (seal, abort) */
    OBJSTORE_E_NOT_HELD = 6,       /* this process holds no reference / is not the creator */
    OBJSTORE_E_FULL = 7,           /* no free block large enough: the memory limit is reached,
                                      or /dev/shm (the fallback filesystem) has no room left
                                      to commit more of the region (objstore_last_errno) */
    OBJSTORE_E_TABLE_FULL = 8,     /* the object index or the reference table is full */
    OBJSTORE_E_LOCK_TIMEOUT = 9,   /* the region lock was not acquired in time */
    OBJSTORE_E_NO_SPACE = 10,      /* no room for the region in /dev/shm (nor the fallback) */
    OBJSTORE_E_REGION_EXISTS = 11, /* a region with this name already exists */
    OBJSTORE_E_NO_REGION = 12,     /* no region with this name */
    OBJSTORE_E_BAD_REGION = 13,    /* not a region of this version, or never initialised */
    OBJSTORE_E_NO_SLOT = 14,       /* every process slot is taken by a live process */
    OBJSTORE_E_CORRUPT = 15,       /* an invariant does not hold / the lock is unrecoverable /
                                      the undo journal a dead holder left is damaged (never
                                      replayed then: see os_journal.c) */
    OBJSTORE_E_FORKED = 16,        /* the handle was opened by another process (fork) */
    OBJSTORE_E_SYSTEM = 17         /* a system call failed: see objstore_last_errno */
} objstore_status_t;

/* Object states reported by objstore_contains. */
typedef enum {
    OBJSTORE_ABSENT = 0,
    OBJSTORE_UNSEALED = 1,
    OBJSTORE_SEALED = 2,
    OBJSTORE_DELETE_PENDING = 3
} objstore_state_t;

/* Named points inside critical sections where a test can make the process stop. */
typedef enum {
    OBJSTORE_CRASH_NONE = 0,
    OBJSTORE_CRASH_CREATE_AFTER_ALLOC = 1,   /* block taken from the free list, not indexed */
    OBJSTORE_CRASH_CREATE_AFTER_INDEX = 2,   /* object indexed, creator reference not recorded */
    OBJSTORE_CRASH_SEAL = 3,                 /* state written, update not committed */
    OBJSTORE_CRASH_GET_AFTER_INCREF = 4,     /* refcount raised, reference record not written */
    OBJSTORE_CRASH_RELEASE_AFTER_DECREF = 5, /* refcount lowered, reference record not updated */
    OBJSTORE_CRASH_FREE_AFTER_UNLINK = 6,    /* freeing: neighbours unlinked, not re-listed */
    OBJSTORE_CRASH_DELETE_AFTER_UNINDEX = 7, /* object removed from the index, block not freed */
    OBJSTORE_CRASH_REAP = 8,                 /* reaping: between two reference releases */
    OBJSTORE_CRASH_GROW = 9,                 /* file extended, new committed mark not committed */
    OBJSTORE_CRASH_NPOINTS = 10
} objstore_crash_point_t;

/* What the process does at a crash point. */
typedef enum {
    OBJSTORE_CRASH_EXIT = 0, /* _exit(OBJSTORE_CRASH_EXIT_CODE) */
    OBJSTORE_CRASH_STOP = 1, /* raise(SIGSTOP): the lock stays held until someone kills it */
    OBJSTORE_CRASH_THREAD_EXIT = 2 /* pthread_exit(): only the calling thread dies, holding
                                      the lock, so the next locker in this very process gets
                                      EOWNERDEAD and recovers (the fuzzer's in-process death) */
} objstore_crash_action_t;

typedef struct {
    uint64_t capacity;     /* heap bytes (the memory limit for objects, headers included) */
    uint64_t max_objects;  /* 0: capacity / 8 KiB, clamped to [256, 4 Mi] */
    uint32_t max_processes;/* 0: 128 slots */
    uint32_t reserved;
    const char *fallback_dir; /* NULL: no fallback; else a file-backed region here */
    uint64_t test_shm_avail;  /* tests only: pretend /dev/shm has this many bytes free */
} objstore_options_t;

typedef struct {
    uint64_t capacity;       /* heap bytes */
    uint64_t in_use;         /* bytes of allocated blocks (64-byte headers included) */
    uint64_t data_bytes;     /* sum of object sizes */
    uint64_t objects;        /* objects in the index (any state) */
    uint64_t sealed;
    uint64_t pending_delete;
    uint64_t free_blocks;
    uint64_t largest_free;   /* largest object size that fits now */
    uint64_t max_objects;
    uint64_t references;     /* references held, all processes */
    uint64_t processes;      /* attached processes (slots in use) */
    uint64_t max_processes;
    uint64_t recoveries;     /* updates rolled back after a holder died */
    uint64_t reaped_processes;
    uint64_t region_size;    /* bytes mapped */
    uint64_t file_backed;    /* 1 if the region lives in the fallback directory */
    uint64_t committed;      /* bytes of the region backed by memory (or disk) so far */
} objstore_stats_t;

typedef struct {
    uint64_t capacity;       /* heap bytes */
    uint64_t in_use;         /* bytes of allocated blocks (64-byte headers included) */
    uint64_t data_bytes;     /* sum of object sizes */
    uint64_t objects;        /* objects in the index (any state) */
} objstore_usage_t;

/* ---------------------------------------------------------------- regions */

/*
 * objstore_create_region: create region `name` (1-200 chars of [A-Za-z0-9._-], not
 * starting with '.') with mode 0600, initialise it and attach to it.
 * Memory is committed lazily: the whole region is mapped, but only its tables and a
 * first step of heap (4 MiB, or all of a smaller heap) are reserved now
 * (posix_fallocate); objstore_create reserves more, in 64 MiB steps, as objects need it. So a
 * write never dies with SIGBUS; a store that cannot grow (the filesystem filled up)
 * answers FULL. Creation needs room for the first step now, and a filesystem at least
 * as large as the region. If /dev/shm fails that and opts->fallback_dir is set, the
 * region is a file there instead. Returns OK and *out, or: INVALID, REGION_EXISTS,
 * NO_SPACE (the message from objstore_status_message names the fix), SYSTEM. On error
 * *out is NULL and nothing is left behind.
 */
objstore_status_t objstore_create_region(const char *name, const objstore_options_t *opts,
                                         objstore_t **out);

/*
 * objstore_attach: map the existing region `name` (looked up in /dev/shm, then in
 * fallback_dir if not NULL), reap the slots of dead processes, and take a slot.
 * Returns OK and *out, or: INVALID, NO_REGION, BAD_REGION (wrong version, a header whose
 * layout does not add up or that claims more committed bytes than the file holds -- the
 * region was damaged --, or the creator never finished initialising it within the lock
 * timeout), NO_SLOT, LOCK_TIMEOUT, SYSTEM.
 */
objstore_status_t objstore_attach(const char *name, const char *fallback_dir, objstore_t **out);

/*
 * objstore_close: release every reference this handle holds (aborting its unsealed
 * objects), free its slot, unmap the region and free the handle. Pointers into the region
 * are invalid afterwards. If the lock cannot be taken the slot stays until the process is
 * gone and reaped. NULL is ignored. The region itself survives (see objstore_unlink).
 */
void objstore_close(objstore_t *s);

/*
 * objstore_unlink: remove the region's name so that no new process can attach. Mappings
 * stay valid until closed; the memory is returned when the last one goes. Returns OK,
 * NO_REGION (already removed), SYSTEM.
 */
objstore_status_t objstore_unlink(objstore_t *s);

/* objstore_unlink_name: remove a region by name without attaching (stale-region cleanup).
 * Returns OK, INVALID, NO_REGION, SYSTEM. */
objstore_status_t objstore_unlink_name(const char *name, const char *fallback_dir);

/* objstore_path: where the region lives ("/dev/shm/NAME" or "DIR/NAME"); owned by s. */
const char *objstore_path(const objstore_t *s);

/* objstore_mapping: this handle's mapping of the region: *base and *size (either may be
 * NULL). Every object's bytes lie inside it; valid until objstore_close. */
void objstore_mapping(const objstore_t *s, const void **base, uint64_t *size);

/* ---------------------------------------------------------------- objects */

/*
 * objstore_create: allocate `size` bytes (64-byte aligned) for a new unsealed object and
 * give the creator a reference; *data points at the bytes to write. Never blocks for
 * room. If the block reaches past the committed part of the region, commits more first
 * (under the lock, from this process: the pages are then valid in every mapping).
 * Returns OK, INVALID, EXISTS (also while an old object with this id is delete pending),
 * FULL (objstore_last_errno is ENOSPC or EFBIG when the filesystem had no room to commit
 * more, else 0), TABLE_FULL, LOCK_TIMEOUT, FORKED, CORRUPT, SYSTEM (committing failed
 * otherwise).
 */
objstore_status_t objstore_create(objstore_t *s, const char *id, uint64_t size, void **data);

/* objstore_create_bounded: objstore_create that also answers FULL when the store's
 * allocated bytes (objstore_stats_t.in_use) would pass `limit` with this object; 0 means
 * no limit. For allocations that must leave room for everything else (see os_numpy.c). */
objstore_status_t objstore_create_bounded(objstore_t *s, const char *id, uint64_t size,
                                          uint64_t limit, void **data);

/* objstore_seal: make an object created by this handle immutable and visible to get.
 * The creator keeps its reference (release it). Returns OK, NOT_FOUND, SEALED, NOT_HELD
 * (created by another handle), LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_seal(objstore_t *s, const char *id);

/* objstore_abort: drop an unsealed object created by this handle and free its memory.
 * Returns OK, NOT_FOUND, SEALED, NOT_HELD, LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_abort(objstore_t *s, const char *id);

/* objstore_put: create + copy `size` bytes from `data` (outside the lock) + seal +
 * release, in one call. Statuses as objstore_create; on failure nothing is left, except
 * after a LOCK_TIMEOUT at the seal step: the unsealed object then stays with this handle
 * (aborted by objstore_close, or by reaping if the process dies). */
objstore_status_t objstore_put(objstore_t *s, const char *id, const void *data, uint64_t size);

/* objstore_get: take a reference on a sealed object; *data and *size describe its bytes,
 * valid until the matching objstore_release. Never blocks for the object. Returns OK,
 * NOT_FOUND (absent or delete pending), NOT_SEALED, TABLE_FULL (reference table),
 * LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_get(objstore_t *s, const char *id, const void **data,
                               uint64_t *size);

/* objstore_release: drop one reference this handle holds on the object (from create or
 * get). Frees a delete-pending object, aborts an unsealed one, when it was the last.
 * Returns OK, NOT_FOUND, NOT_HELD, LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_release(objstore_t *s, const char *id);

/* objstore_delete: remove a sealed object. If references remain it becomes delete
 * pending (*deferred = 1, may be NULL) and is freed by the last release. Returns OK,
 * NOT_FOUND (absent or already pending), NOT_SEALED (use abort), LOCK_TIMEOUT, FORKED,
 * CORRUPT. */
objstore_status_t objstore_delete(objstore_t *s, const char *id, int *deferred);

/* objstore_object_at: the object whose bytes start at `data`, a pointer into this
 * handle's mapping: its id (OBJSTORE_ID_SIZE bytes), size and objstore_state_t, each
 * written when not NULL. A pointer anywhere else (inside an object, outside the heap)
 * is NOT_FOUND. Returns OK, INVALID, NOT_FOUND, LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_object_at(objstore_t *s, const void *data, char *id, uint64_t *size,
                                     int *state);

/* objstore_seal_at: seal the unsealed object this handle created whose bytes start at
 * `data` and are exactly `size` long, and write its id: how memory handed out by
 * objstore_create becomes an object without a copy once its writer is done. Returns OK,
 * NOT_FOUND (no object starts there, or its size differs), SEALED, NOT_HELD (another
 * handle created it), LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_seal_at(objstore_t *s, const void *data, uint64_t size, char *id);

/* objstore_release_at: objstore_release of the object whose bytes start at `data`;
 * *size (may be NULL) = its size. Returns OK, NOT_FOUND, NOT_HELD, LOCK_TIMEOUT, FORKED,
 * CORRUPT. */
objstore_status_t objstore_release_at(objstore_t *s, const void *data, uint64_t *size);

/* objstore_contains: *state = an objstore_state_t. Returns OK, LOCK_TIMEOUT, FORKED. */
objstore_status_t objstore_contains(objstore_t *s, const char *id, int *state);

/* objstore_list: copy the ids of up to `max` objects (any state) into `ids`
 * (OBJSTORE_ID_SIZE bytes each, in index order); *count = how many there are in all,
 * which may exceed `max`. A snapshot: objects may come and go right after. Returns OK,
 * INVALID, LOCK_TIMEOUT, FORKED. */
objstore_status_t objstore_list(objstore_t *s, char *ids, uint64_t max, uint64_t *count);

/* ---------------------------------------------------------------- maintenance */

/* objstore_stats: a consistent snapshot (taken under the lock). */
objstore_status_t objstore_stats(objstore_t *s, objstore_stats_t *out);

/* objstore_usage: capacity, allocated bytes, object bytes and objects, read WITHOUT the
 * lock: O(1), and it never waits, not even while a stopped or dying process holds the lock
 * (objstore_stats walks the free lists under it). Each figure is one aligned 64-bit load,
 * so none is torn, but an update in progress (or being rolled back) may show in some
 * figures and not yet in others: for monitoring (a worker's heartbeat reads it), not for
 * accounting. Works in a forked child too. Returns OK, or INVALID for a NULL argument. */
objstore_status_t objstore_usage(const objstore_t *s, objstore_usage_t *out);

/* objstore_reap: check every slot; for each process that is gone (no such pid, a zombie,
 * or a different start time) release its references, abort its unsealed objects and free
 * its slot. Liveness is checked outside the lock. *reaped (may be NULL) = slots freed.
 * Also run by objstore_attach. Returns OK, LOCK_TIMEOUT, FORKED, CORRUPT. */
objstore_status_t objstore_reap(objstore_t *s, uint32_t *reaped);

/* objstore_validate: walk the heap, free lists, index, reference table and slots and
 * check every cross-invariant. Returns OK or CORRUPT with a description in msg (may be
 * NULL), or LOCK_TIMEOUT, FORKED. Safe on a region that another process damaged (any byte
 * of its metadata but the mutex): nothing read from the region is followed before it is
 * bounded (native/fuzz holds it to that). The other calls trust the metadata; after
 * damage, validate first. */
objstore_status_t objstore_validate(objstore_t *s, char *msg, size_t msglen);

/* objstore_set_lock_timeout: how long lock waits last for this handle (default 10000 ms;
 * 0 means the default). */
void objstore_set_lock_timeout(objstore_t *s, uint32_t ms);

/* objstore_last_holder_pid: pid that held the lock when this handle last timed out
 * (0 if unknown or never). */
int32_t objstore_last_holder_pid(const objstore_t *s);

/* objstore_last_errno: errno of this handle's last SYSTEM status, or of the failed
 * commitment behind objstore_create's last FULL (0 if none). */
int objstore_last_errno(const objstore_t *s);

/* objstore_status_name / objstore_status_message: static strings for a status. */
const char *objstore_status_name(objstore_status_t st);
const char *objstore_status_message(objstore_status_t st);

/* ---------------------------------------------------------------- NumPy arrays */

/* Counters of a NumPy handler (objstore_np_stats). */
typedef enum {
    OBJSTORE_NP_STORE_ALLOCS = 0, /* arrays given a block of the store */
    OBJSTORE_NP_DECLINED = 1,     /* large requests sent to NumPy's allocator (limit, FULL, ...) */
    OBJSTORE_NP_RELEASED = 2,     /* store arrays freed (their reference released) */
    OBJSTORE_NP_LOST = 3,         /* store arrays whose release failed (left to the slot) */
    OBJSTORE_NP_NSTATS = 4
} objstore_np_stat_t;

/*
 * objstore_np_handler: a NumPy memory handler (NEP 49; the layout of NumPy's
 * PyDataMem_Handler, version 1) that gives array data of at least `threshold` bytes a
 * block of this store, as an unsealed object of this handle, while the store has fewer
 * than `limit` bytes in use (0: no limit); everything else goes to `fallback`, NumPy's
 * default PyDataMem_Handler, whose functions are copied. Wrap *handler in a capsule
 * named objstore_np_capsule_name() and install it with PyDataMem_SetHandler. Such an
 * array's bytes can become an object without a copy (objstore_seal_at); freeing the
 * array releases its reference. The handler lives as long as the process (arrays point
 * at it), and so must the handle: never close `s` while arrays from it exist. See
 * os_numpy.c. Returns OK, INVALID (threshold 0, an unknown handler version), SYSTEM.
 */
objstore_status_t objstore_np_handler(objstore_t *s, uint64_t threshold, uint64_t limit,
                                      const void *fallback, void **handler);
const char *objstore_np_capsule_name(void);
/* objstore_np_disable: the handler takes no more store blocks (frees still work). */
void objstore_np_disable(void *handler);

/* objstore_privatize: in a child forked from the process that opened `s`, turn the
 * child's mapping of the region into a private copy-on-write one (MAP_PRIVATE|MAP_FIXED
 * at the same address), so that what the child writes into memory it inherited (arrays
 * allocated in the store) stays in the child, as with private memory after fork. The
 * handle stays unusable in the child (FORKED). Returns OK, INVALID (not a forked child),
 * SYSTEM. */
objstore_status_t objstore_privatize(objstore_t *s);
/* objstore_np_stats: the handler's counters, indexed by objstore_np_stat_t. */
void objstore_np_stats(const void *handler, uint64_t out[OBJSTORE_NP_NSTATS]);

/* ---------------------------------------------------------------- reading into fresh memory */

/* objstore_populate_write: fault in the whole pages inside [addr, addr + len) for writing,
 * in one madvise(MADV_POPULATE_WRITE) call (Linux 5.14), so that a copy into fresh memory
 * that follows takes no page fault per 4 KiB page; the contents do not change. For any
 * writable memory of the caller (a reader filling a new `bytes` from a socket: see
 * scaler_executor/protocol/prefault.py). Returns 0, or the errno: EINVAL where the kernel
 * (or this build) has no MADV_POPULATE_WRITE, so the caller can stop asking. */
int objstore_populate_write(void *addr, uint64_t len);

/* objstore_test_crash_point: tests only. The `countdown`-th time this handle reaches
 * `point` inside a critical section, perform `action`. point NONE disarms. */
void objstore_test_crash_point(objstore_t *s, int point, uint32_t countdown, int action);

/* objstore_test_set_commit_limit: tests only. Committing the region past `bytes` (an
 * offset from the region's start, tables included) fails for this handle as if the
 * filesystem were full (ENOSPC). 0 removes the limit. */
void objstore_test_set_commit_limit(objstore_t *s, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* SCALER_OBJSTORE_H */
