/*
 * os_internal.h -- the region's layout and the helpers shared by the store's C files.
 *
 * Region layout (every offset 64-byte aligned, the heap page aligned):
 *
 *   [ os_header_t | slots[max_slots] | entries[max_objects] | buckets[nbuckets]
 *     | refs[max_refs] | ref_buckets[nref_buckets] | heap ... ]
 *
 * Lazy commitment: the whole region is mapped, but the backing file only holds its first
 * `committed` bytes (tables + the start of the heap); touching a page beyond would be
 * SIGBUS. The allocator keeps every block header and every used block below that mark
 * and raises it (os_commit_to, posix_fallocate on the shared file, so the pages become
 * valid in every process's mapping at once) before taking a block that reaches past it.
 *
 * No pointers are stored in the region (each process maps it at its own address): blocks
 * are named by their offset from the region base, entries and reference records by index.
 *
 * Journal: every write to region metadata made under the lock goes through os_j64/os_j32,
 * which first append (offset, old value) to the undo log in the header. os_commit empties
 * the log; a process that takes the lock with EOWNERDEAD replays the log backwards
 * (os_recover), which undoes the dead holder's half-done update. Object *bytes* are never
 * journaled: they are written outside the lock, by the creator only.
 */
#ifndef SCALER_OS_INTERNAL_H
#define SCALER_OS_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "objstore.h"

#define OS_MAGIC 0x31305453424f4353ULL /* "SCOBST01" little-endian */
#define OS_VERSION 3u /* 2: lazily committed heap (os_header_t.committed); 3: fresh tables */
#define OS_ALIGN 64u
#define OS_BLOCK_HDR 64u           /* block header size; data follows, 64-byte aligned */
#define OS_MIN_BLOCK 128u          /* header + one 64-byte line */
#define OS_NCLASSES 48             /* size classes: [64*2^k, 64*2^(k+1)) */
#define OS_JOURNAL_CAP 256         /* largest update writes ~40 words (create + split) */
#define OS_NIL 0xffffffffu         /* "no index" */
#define OS_BLOCK_MAGIC 0x6b636f6c62736fULL
#define OS_DEFAULT_SLOTS 128u
#define OS_MAX_SLOTS 4096u
#define OS_DEFAULT_TIMEOUT_MS 10000u
#define OS_NAME_MAX 200
#define OS_PAGE 4096u
#define OS_POPULATE_CHUNK (2u << 20) /* what a bit of objstore_t.populated covers */
/* Commitment grows by at least this much at a time: one posix_fallocate of 64 MiB on
 * tmpfs takes ~10 ms under the lock, and amortised over 64 MiB of objects that is noise,
 * while creating a store costs only its tables plus one step. */
#define OS_COMMIT_STEP (64ULL << 20)
/* What creation reserves of the heap: a 64 MiB first step cost ~9 ms of posix_fallocate
 * on tmpfs (the pages are zeroed), on the way to an embedded cluster's first result, for
 * objects that may never come; the first allocation past it commits a whole step. */
#define OS_FIRST_STEP (4ULL << 20)

enum { OS_ENTRY_FREE = 0, OS_ENTRY_CREATED = 1, OS_ENTRY_SEALED = 2 };
enum { OS_FLAG_DELETE_PENDING = 1 };

enum {
    OS_OP_NONE = 0, OS_OP_CREATE, OS_OP_SEAL, OS_OP_ABORT, OS_OP_GET, OS_OP_RELEASE,
    OS_OP_DELETE, OS_OP_ATTACH, OS_OP_DETACH, OS_OP_REAP, OS_OP_GROW
};

typedef struct {
    uint64_t off;   /* offset of the word from the region base */
    uint64_t old;   /* its value before the write */
    uint64_t width; /* 4 or 8 */
} os_undo_t;

typedef struct {
    uint64_t pid;        /* 0: free */
    uint64_t start_time; /* /proc/PID/stat field 22, to tell a reused pid apart */
    uint64_t refs;       /* references this slot holds */
    uint64_t pad;
} os_slot_t;

typedef struct {
    uint64_t id[2];    /* the 16-byte object id, as two words (journaled as such) */
    uint64_t block;    /* offset of the block header */
    uint64_t size;     /* object bytes */
    uint32_t refcount; /* references, all slots */
    uint32_t state;    /* OS_ENTRY_* */
    uint32_t flags;    /* OS_FLAG_* */
    uint32_t creator;  /* slot index of the creator */
    uint32_t next;     /* next entry in the hash chain, or in the free list */
    uint32_t pad0;
    uint64_t pad1;
} os_entry_t;

typedef struct {
    uint32_t slot;  /* OS_NIL: record free */
    uint32_t entry;
    uint32_t count; /* references this slot holds on this entry */
    uint32_t next;  /* next record in the hash chain, or in the free list */
} os_ref_t;

typedef struct {
    uint64_t size;      /* whole block, header included */
    uint64_t prev_size; /* size of the block before (0 for the first) */
    uint64_t is_free;
    uint64_t next_free; /* offsets; 0: none */
    uint64_t prev_free;
    uint64_t entry;     /* entry index when in use */
    uint64_t magic;
    uint64_t pad;
} os_block_t;

typedef struct {
    /* layout: written once by the creator, read-only afterwards */
    uint64_t magic; /* written last, with release order */
    uint64_t version;
    uint64_t region_size;
    uint64_t slots_off, entries_off, buckets_off, refs_off, ref_buckets_off;
    uint64_t heap_off, heap_size;
    uint64_t max_slots, max_objects, nbuckets, max_refs, nref_buckets;
    uint64_t hash_seed;

    pthread_mutex_t mutex __attribute__((aligned(64)));
    int64_t holder_pid; /* pid holding the mutex, 0 when free */

    /* intent record + undo journal of the update in progress */
    uint64_t intent_op;
    int64_t intent_pid;
    unsigned char intent_id[OBJSTORE_ID_SIZE];
    uint64_t undo_count;

    /* allocator, tables and counters: journaled */
    uint64_t free_head[OS_NCLASSES];
    uint64_t entry_free; /* OS_NIL-terminated list through os_entry_t.next */
    uint64_t ref_free;
    /* Entries and reference records from these on have never been used: free, and still
     * the zeroes of the new file. Creation writes none of them (for the default 6 GiB
     * store, 12 MiB of free lists written in full took ~4 ms of a cold start); a record is
     * taken from its free list first, else the next fresh one. */
    uint64_t entry_fresh, ref_fresh;
    uint64_t in_use, data_bytes, objects, sealed, pending, refs_total, processes;
    uint64_t recoveries, last_recovered_op, last_recovered_pid, reaped_processes;
    /* bytes of the backing file (from the region base) that are allocated: every block
     * header and every used block lies below it; only the last block, free, may reach
     * beyond. Never more than the file really holds (see os_commit_to). */
    uint64_t committed;

    os_undo_t undo[OS_JOURNAL_CAP];
} os_header_t;

struct objstore {
    char *base;             /* the mapping */
    uint64_t size;
    int fd;
    int file_backed;
    pid_t pid;              /* process that opened the handle */
    uint32_t slot;          /* our slot index, OS_NIL before attaching */
    uint32_t timeout_ms;
    int32_t last_holder_pid;
    int last_errno;
    int crash_point, crash_action;
    uint32_t crash_countdown;
    uint64_t test_commit_limit; /* tests: growing past this fails as ENOSPC (0: off) */
    unsigned char *populated;   /* 2 MiB chunks of the mapping written through by puts (bits) */
    int populate_off;           /* the kernel has no MADV_POPULATE_WRITE */
    char name[OS_NAME_MAX + 2];
    char path[4096];
};

static inline os_header_t *os_hdr(const objstore_t *s) { return (os_header_t *)s->base; }
static inline os_slot_t *os_slots(const objstore_t *s) {
    return (os_slot_t *)(s->base + os_hdr(s)->slots_off);
}
static inline os_entry_t *os_entries(const objstore_t *s) {
    return (os_entry_t *)(s->base + os_hdr(s)->entries_off);
}
static inline uint32_t *os_buckets(const objstore_t *s) {
    return (uint32_t *)(s->base + os_hdr(s)->buckets_off);
}
static inline os_ref_t *os_refs(const objstore_t *s) {
    return (os_ref_t *)(s->base + os_hdr(s)->refs_off);
}
static inline uint32_t *os_ref_buckets(const objstore_t *s) {
    return (uint32_t *)(s->base + os_hdr(s)->ref_buckets_off);
}
static inline os_block_t *os_block(const objstore_t *s, uint64_t off) {
    return (os_block_t *)(s->base + off);
}
/* Whether an entry (a reference record) can still be taken: a freed one or a fresh one. */
static inline int os_entry_left(const os_header_t *h) {
    return h->entry_free != OS_NIL || h->entry_fresh < h->max_objects;
}
static inline int os_ref_left(const os_header_t *h) {
    return h->ref_free != OS_NIL || h->ref_fresh < h->max_refs;
}

/* journal (os_journal.c) */
void os_j64(objstore_t *s, uint64_t *p, uint64_t v);
void os_j32(objstore_t *s, uint32_t *p, uint32_t v);
void os_begin(objstore_t *s, int op, const char *id);
void os_commit(objstore_t *s);
int os_rollback(objstore_t *s);
void os_crash(objstore_t *s, int point);

/* lock (os_region.c): os_lock recovers a dead holder's update before returning OK */
objstore_status_t os_lock(objstore_t *s);
void os_unlock(objstore_t *s);

/* layout check (os_region.c): 1 if the header's layout adds up (and the region is
 * `size` bytes, unless 0) */
int os_layout_ok(const os_header_t *h, uint64_t size);

/* commitment (os_region.c): make the file hold at least `end` bytes; lock held */
objstore_status_t os_commit_to(objstore_t *s, uint64_t end);

/* allocator (os_alloc.c) */
unsigned os_class_of(uint64_t size);
uint64_t os_block_need(uint64_t size);
uint64_t os_alloc_find(const objstore_t *s, uint64_t need);
uint64_t os_alloc_find_within(const objstore_t *s, uint64_t need, uint64_t limit);
uint64_t os_take_end(const objstore_t *s, uint64_t off, uint64_t need);
void os_alloc_take(objstore_t *s, uint64_t off, uint64_t need);
void os_free_block(objstore_t *s, uint64_t off);
void os_heap_init(objstore_t *s);
int os_validate_heap(const objstore_t *s, char *msg, size_t msglen, uint64_t *used_blocks);

/* objects (objstore.c) used by os_region.c to drop the references of a slot */
void os_drop_slot_refs(objstore_t *s, uint32_t slot, int crash_between);
void os_tables_init(objstore_t *s);

#endif /* SCALER_OS_INTERNAL_H */
