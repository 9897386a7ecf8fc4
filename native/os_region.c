/*
 * os_region.c -- the region: create / attach / close / unlink, the robust lock, process
 * slots and reaping, and the status strings.
 *
 * Room, committed lazily: containers often give /dev/shm only 64 MB, and a mapping of a
 * tmpfs file that has no pages behind it dies with SIGBUS on first touch. So the region
 * is mapped at its full size (mapping past the end of a file is allowed) but the file
 * holds only a committed prefix: the tables and a first step of heap (4 MiB) at creation,
 * then more, in 64 MiB steps, by os_commit_to whenever the allocator needs it. Creation
 * checks that the filesystem could ever hold the whole region (its total size) and has room now for the first step
 * (fstatvfs), then reserves that step (posix_fallocate). When /dev/shm fails either
 * check and the caller named a fallback directory, the region is a file there instead,
 * and attach looks there after /dev/shm. A commitment that fails later (the filesystem
 * filled up) makes that allocation FULL; the region stays usable.
 *
 * Publication: the creator fills the header and writes the magic number last (release
 * order); an attacher that finds the name before that polls for the magic until its lock
 * timeout, then gives up with BAD_REGION.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "os_internal.h"

/* ---------------------------------------------------------------- time, names, /proc */

static uint64_t os_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void os_nap(void) {
    struct timespec ts = {0, 1000000}; /* 1 ms: only while racing a creator's init */
    nanosleep(&ts, NULL);
}

static int os_name_ok(const char *name) {
    if (name == NULL || name[0] == '\0' || name[0] == '.') return 0;
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok || n >= OS_NAME_MAX) return 0;
    }
    return 1;
}

/* State (field 3) and start time (field 22) of /proc/PID/stat. 0 on success. */
static int os_proc_stat(pid_t pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may contain spaces and ')' */
    if (p == NULL || p[1] != ' ') return -1;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) { /* advance to field 22 */
        p = strchr(p, ' ');
        if (p == NULL) return -1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

/* 1 if the process that took a slot as (pid, start) still runs. Unreadable /proc entries
 * of a pid that exists count as alive: wrongly reaping a live process is the worse error. */
static int os_alive(pid_t pid, uint64_t start) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state;
    uint64_t now_start;
    if (os_proc_stat(pid, &state, &now_start) != 0) return errno == ENOENT ? 0 : 1;
    if (state == 'Z' || state == 'X') return 0;
    return now_start == start;
}

/* ---------------------------------------------------------------- lock */

objstore_status_t os_lock(objstore_t *s) {
    if (getpid() != s->pid) return OBJSTORE_E_FORKED;
    os_header_t *h = os_hdr(s);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += s->timeout_ms / 1000;
    ts.tv_nsec += (long)(s->timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_mutex_timedlock(&h->mutex, &ts);
    if (rc == EOWNERDEAD) {
        /* The holder died inside a critical section: undo its update, then declare the
         * mutex consistent. If we die here too, the next locker gets EOWNERDEAD again and
         * replays the same journal. */
        int64_t dead = h->holder_pid;
        uint64_t op = h->intent_op;
        if (os_rollback(s) != 0) {
            /* A damaged journal: the half-done update cannot be undone. Unlocking without
             * marking the mutex consistent makes it unrecoverable: every later call answers
             * CORRUPT instead of working on a half-updated region. */
            pthread_mutex_unlock(&h->mutex);
            return OBJSTORE_E_CORRUPT;
        }
        h->recoveries++;
        h->last_recovered_op = op;
        h->last_recovered_pid = (uint64_t)dead;
        if (pthread_mutex_consistent(&h->mutex) != 0) {
            pthread_mutex_unlock(&h->mutex);
            return OBJSTORE_E_CORRUPT;
        }
        rc = 0;
    }
    if (rc == ETIMEDOUT) {
        s->last_holder_pid = (int32_t)__atomic_load_n(&h->holder_pid, __ATOMIC_RELAXED);
        return OBJSTORE_E_LOCK_TIMEOUT;
    }
    if (rc == ENOTRECOVERABLE) return OBJSTORE_E_CORRUPT;
    if (rc != 0) {
        s->last_errno = rc;
        return OBJSTORE_E_SYSTEM;
    }
    __atomic_store_n(&h->holder_pid, (int64_t)s->pid, __ATOMIC_RELAXED);
    /* never expected; never leave a half update (nor act on a damaged journal) */
    if (h->undo_count != 0 && os_rollback(s) != 0) {
        __atomic_store_n(&h->holder_pid, 0, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&h->mutex);
        return OBJSTORE_E_CORRUPT;
    }
    return OBJSTORE_OK;
}

void os_unlock(objstore_t *s) {
    os_header_t *h = os_hdr(s);
    __atomic_store_n(&h->holder_pid, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&h->mutex);
}

/* ---------------------------------------------------------------- slots and reaping */

static objstore_status_t os_slot_claim(objstore_t *s) {
    char state;
    uint64_t start;
    if (os_proc_stat(s->pid, &state, &start) != 0) {
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    objstore_status_t st = os_lock(s);
    if (st != OBJSTORE_OK) return st;
    os_header_t *h = os_hdr(s);
    os_slot_t *S = os_slots(s);
    st = OBJSTORE_E_NO_SLOT;
    for (uint32_t i = 0; i < h->max_slots; i++) {
        if (S[i].pid != 0) continue;
        os_begin(s, OS_OP_ATTACH, NULL);
        os_j64(s, &S[i].pid, (uint64_t)s->pid);
        os_j64(s, &S[i].start_time, start);
        os_j64(s, &S[i].refs, 0);
        os_j64(s, &h->processes, h->processes + 1);
        os_commit(s);
        s->slot = i;
        st = OBJSTORE_OK;
        break;
    }
    os_unlock(s);
    return st;
}

/* Free slot i after dropping its references. Lock held. */
static void os_slot_free(objstore_t *s, uint32_t i, int reaped) {
    os_header_t *h = os_hdr(s);
    os_slot_t *S = os_slots(s);
    os_drop_slot_refs(s, i, reaped);
    os_begin(s, reaped ? OS_OP_REAP : OS_OP_DETACH, NULL);
    os_j64(s, &S[i].pid, 0);
    os_j64(s, &S[i].start_time, 0);
    os_j64(s, &h->processes, h->processes - 1);
    if (reaped) os_j64(s, &h->reaped_processes, h->reaped_processes + 1);
    os_commit(s);
}

objstore_status_t objstore_reap(objstore_t *s, uint32_t *reaped) {
    if (reaped != NULL) *reaped = 0;
    if (s == NULL) return OBJSTORE_E_INVALID;
    if (getpid() != s->pid) return OBJSTORE_E_FORKED;
    os_header_t *h = os_hdr(s);
    os_slot_t *S = os_slots(s);
    uint32_t count = 0;
    for (uint32_t i = 0; i < h->max_slots; i++) {
        /* Liveness is checked without the lock (it reads /proc); the slot is re-checked
         * under the lock before anything is freed. */
        uint64_t pid = __atomic_load_n(&S[i].pid, __ATOMIC_RELAXED);
        uint64_t start = __atomic_load_n(&S[i].start_time, __ATOMIC_RELAXED);
        if (pid == 0 || i == s->slot || os_alive((pid_t)pid, start)) continue;
        objstore_status_t st = os_lock(s);
        if (st != OBJSTORE_OK) return st;
        if (S[i].pid == pid && S[i].start_time == start) {
            os_slot_free(s, i, 1);
            count++;
        }
        os_unlock(s);
    }
    if (reaped != NULL) *reaped = count;
    return OBJSTORE_OK;
}

/* ---------------------------------------------------------------- layout and init */

static uint64_t os_round(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static uint64_t os_pow2(uint64_t x) {
    uint64_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

static objstore_status_t os_layout(const objstore_options_t *o, os_header_t *L) {
    if (o->capacity < 1024 || o->capacity > (1ULL << 48)) return OBJSTORE_E_INVALID;
    uint64_t cap = os_round(o->capacity, OS_ALIGN);
    uint64_t nobj = o->max_objects;
    if (nobj == 0) {
        nobj = cap / 8192;
        if (nobj < 256) nobj = 256;
        if (nobj > (4u << 20)) nobj = 4u << 20;
    }
    uint64_t nslots = o->max_processes == 0 ? OS_DEFAULT_SLOTS : o->max_processes;
    if (nobj > (1u << 26) || nslots > OS_MAX_SLOTS) return OBJSTORE_E_INVALID;
    memset(L, 0, sizeof *L);
    L->max_slots = nslots;
    L->max_objects = nobj;
    L->nbuckets = os_pow2(nobj);
    L->max_refs = nobj * 4 > nslots * 2 ? nobj * 4 : nslots * 2;
    L->nref_buckets = os_pow2(L->max_refs);
    uint64_t off = os_round(sizeof(os_header_t), OS_ALIGN);
    L->slots_off = off;
    off = os_round(off + nslots * sizeof(os_slot_t), OS_ALIGN);
    L->entries_off = off;
    off = os_round(off + nobj * sizeof(os_entry_t), OS_ALIGN);
    L->buckets_off = off;
    off = os_round(off + L->nbuckets * sizeof(uint32_t), OS_ALIGN);
    L->refs_off = off;
    off = os_round(off + L->max_refs * sizeof(os_ref_t), OS_ALIGN);
    L->ref_buckets_off = off;
    off = os_round(off + L->nref_buckets * sizeof(uint32_t), OS_ALIGN);
    L->heap_off = os_round(off, OS_PAGE);
    L->heap_size = cap;
    L->region_size = L->heap_off + cap;
    return OBJSTORE_OK;
}

/* Whether the layout fields of header `h` are the ones os_layout computes from its own
 * capacity, max_objects and max_slots (all the layout follows from these three), and the
 * region is `size` bytes (0: any). The header lives in shared memory that any process
 * mapping it can damage; a layout that does not add up would send every table access
 * outside the mapping, so attach and validate check it (it never changes). */
int os_layout_ok(const os_header_t *h, uint64_t size) {
    uint64_t nslots = h->max_slots, nobj = h->max_objects;
    if (nslots == 0 || nslots > OS_MAX_SLOTS || nobj == 0 || nobj > (1u << 26)) return 0;
    objstore_options_t o = {.capacity = h->heap_size, .max_objects = nobj,
                            .max_processes = (uint32_t)nslots};
    os_header_t L;
    if (h->heap_size % OS_ALIGN != 0 || os_layout(&o, &L) != OBJSTORE_OK) return 0;
    return L.region_size == h->region_size && L.slots_off == h->slots_off &&
           L.entries_off == h->entries_off && L.buckets_off == h->buckets_off &&
           L.refs_off == h->refs_off && L.ref_buckets_off == h->ref_buckets_off &&
           L.heap_off == h->heap_off && L.heap_size == h->heap_size &&
           L.nbuckets == h->nbuckets && L.max_refs == h->max_refs &&
           L.nref_buckets == h->nref_buckets && (size == 0 || size == h->region_size);
}

static objstore_status_t os_init_region(objstore_t *s, const os_header_t *L, uint64_t first) {
    os_header_t *h = os_hdr(s);
    memcpy(h, L, sizeof *h); /* the mapping is zero-filled; this sets the layout */
    h->version = OS_VERSION;
    h->committed = first;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->hash_seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)s->pid << 40) ^
                   (uint64_t)(uintptr_t)s;
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc == 0) rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (rc == 0) rc = pthread_mutex_init(&h->mutex, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        s->last_errno = rc;
        return OBJSTORE_E_SYSTEM;
    }
    os_tables_init(s);
    os_heap_init(s);
    __atomic_store_n(&h->magic, OS_MAGIC, __ATOMIC_RELEASE);
    return OBJSTORE_OK;
}

/* ---------------------------------------------------------------- create / attach */

/* posix_fallocate [from, to) of s->fd, retried on EINTR; 0 or the error number. The
 * test limit of the handle makes any commitment past it fail as a full filesystem. */
static int os_fallocate(objstore_t *s, uint64_t from, uint64_t to) {
    if (s->test_commit_limit != 0 && to > s->test_commit_limit) return ENOSPC;
    int rc;
    do rc = posix_fallocate(s->fd, (off_t)from, (off_t)(to - from));
    while (rc == EINTR);
    return rc;
}

/* Check that fd's filesystem could hold `total` bytes at all and has `first` free now,
 * then allocate the first `first` bytes. */
static objstore_status_t os_reserve(objstore_t *s, uint64_t total, uint64_t first,
                                    uint64_t avail_override) {
    struct statvfs v;
    if (fstatvfs(s->fd, &v) != 0) {
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    uint64_t size = (uint64_t)v.f_blocks * (uint64_t)v.f_frsize;
    uint64_t avail = avail_override != 0 ? avail_override : (uint64_t)v.f_bavail * v.f_frsize;
    /* A region larger than the whole filesystem could never be filled: better the
     * fallback (or a clear NO_SPACE) now than FULL errors at a fraction of the capacity. */
    if (avail < first || size < total) return OBJSTORE_E_NO_SPACE;
    int rc = os_fallocate(s, 0, first);
    if (rc == ENOSPC || rc == EFBIG) return OBJSTORE_E_NO_SPACE;
    if (rc != 0) {
        s->last_errno = rc;
        return OBJSTORE_E_SYSTEM;
    }
    return OBJSTORE_OK;
}

/* The committed mark for `end` bytes: a whole `step` past `from` (fewer fallocate calls),
 * page aligned, never past the region. */
static uint64_t os_commit_target(uint64_t from, uint64_t end, uint64_t region_size, uint64_t step) {
    uint64_t want = end > from + step ? end : from + step;
    want = os_round(want, OS_PAGE);
    return want < region_size ? want : region_size;
}

objstore_status_t os_commit_to(objstore_t *s, uint64_t end) {
    os_header_t *h = os_hdr(s);
    uint64_t from = h->committed;
    if (end <= from) return OBJSTORE_OK;
    if (end > h->region_size) return OBJSTORE_E_FULL; /* cannot happen: blocks end inside */
    uint64_t to = os_commit_target(from, end, h->region_size, OS_COMMIT_STEP);
    /* Allocate first, record after: the mark never exceeds what the file holds. A holder
     * that dies in between leaves a longer file and the old mark, which is harmless (the
     * next commitment allocates the same range again, a no-op for those pages). */
    int rc = os_fallocate(s, from, to);
    if ((rc == ENOSPC || rc == EFBIG) && to > os_round(end, OS_PAGE)) {
        to = os_round(end, OS_PAGE) < h->region_size ? os_round(end, OS_PAGE) : h->region_size;
        rc = os_fallocate(s, from, to); /* a whole step did not fit: just what is needed */
    }
    if (rc != 0) {
        s->last_errno = rc;
        return rc == ENOSPC || rc == EFBIG ? OBJSTORE_E_FULL : OBJSTORE_E_SYSTEM;
    }
    /* Its own committed update, so a later crash in the caller's update (which is rolled
     * back) keeps the commitment: the pages are there either way. */
    os_begin(s, OS_OP_GROW, NULL);
    os_j64(s, &h->committed, to);
    os_crash(s, OBJSTORE_CRASH_GROW);
    os_commit(s);
    return OBJSTORE_OK;
}

static int os_file_path(char *out, size_t n, const char *dir, const char *name) {
    int w = snprintf(out, n, "%s/%s", dir, name);
    return w > 0 && (size_t)w < n;
}

/* Open a new backing object with its first `first` of `total` bytes reserved: /dev/shm
 * first, else the fallback file. On success s->fd, s->path, s->file_backed are set and
 * the name exists. */
static objstore_status_t os_open_new(objstore_t *s, const objstore_options_t *o, uint64_t total,
                                     uint64_t first) {
    char shm[OS_NAME_MAX + 4], fpath[sizeof s->path];
    snprintf(shm, sizeof shm, "/%s", s->name);
    if (o->fallback_dir != NULL) {
        if (!os_file_path(fpath, sizeof fpath, o->fallback_dir, s->name)) return OBJSTORE_E_INVALID;
        if (access(fpath, F_OK) == 0) return OBJSTORE_E_REGION_EXISTS;
    }
    s->fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        if (errno == EEXIST) return OBJSTORE_E_REGION_EXISTS;
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    snprintf(s->path, sizeof s->path, "/dev/shm/%s", s->name);
    objstore_status_t st = fchmod(s->fd, 0600) == 0 ? OBJSTORE_OK : OBJSTORE_E_SYSTEM;
    if (st == OBJSTORE_OK) st = os_reserve(s, total, first, o->test_shm_avail);
    if (st == OBJSTORE_OK) return st;
    if (st == OBJSTORE_E_SYSTEM && s->last_errno == 0) s->last_errno = errno;
    close(s->fd);
    s->fd = -1;
    shm_unlink(shm);
    if (st != OBJSTORE_E_NO_SPACE || o->fallback_dir == NULL) return st;

    s->fd = open(fpath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (s->fd < 0) {
        if (errno == EEXIST) return OBJSTORE_E_REGION_EXISTS;
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    memcpy(s->path, fpath, sizeof fpath);
    s->file_backed = 1;
    st = os_reserve(s, total, first, 0);
    if (st != OBJSTORE_OK) {
        close(s->fd);
        s->fd = -1;
        unlink(fpath);
    }
    return st;
}

static objstore_t *os_handle_new(const char *name) {
    objstore_t *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->fd = -1;
    s->slot = OS_NIL;
    s->pid = getpid();
    s->timeout_ms = OS_DEFAULT_TIMEOUT_MS;
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static void os_handle_free(objstore_t *s) {
    if (s->base != NULL) munmap(s->base, s->size);
    if (s->fd >= 0) close(s->fd);
    free(s->populated);
    free(s);
}

objstore_status_t objstore_create_region(const char *name, const objstore_options_t *opts,
                                         objstore_t **out) {
    if (out == NULL) return OBJSTORE_E_INVALID;
    *out = NULL;
    if (!os_name_ok(name) || opts == NULL) return OBJSTORE_E_INVALID;
    os_header_t L;
    objstore_status_t st = os_layout(opts, &L);
    if (st != OBJSTORE_OK) return st;
    objstore_t *s = os_handle_new(name);
    if (s == NULL) return OBJSTORE_E_SYSTEM;
    int named = 0;
    /* the tables, written in full by os_init_region, and the first step of heap */
    uint64_t first = os_commit_target(L.heap_off, L.heap_off, L.region_size, OS_FIRST_STEP);
    st = os_open_new(s, opts, L.region_size, first);
    if (st != OBJSTORE_OK) goto fail;
    named = 1;
    void *m = mmap(NULL, L.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED) {
        s->last_errno = errno;
        st = OBJSTORE_E_SYSTEM;
        goto fail;
    }
    s->base = m;
    s->size = L.region_size;
    st = os_init_region(s, &L, first);
    if (st == OBJSTORE_OK) st = os_slot_claim(s);
    if (st != OBJSTORE_OK) goto fail;
    *out = s;
    return OBJSTORE_OK;
fail:
    if (named) {
        if (s->file_backed) unlink(s->path);
        else {
            char shm[OS_NAME_MAX + 4];
            snprintf(shm, sizeof shm, "/%s", s->name);
            shm_unlink(shm);
        }
    }
    os_handle_free(s);
    return st;
}

/* Map an existing backing object once its creator has published it: first its header
 * (to learn the region's size, which the file's length no longer tells), then the whole
 * region, past the end of the file like the creator's mapping. */
static objstore_status_t os_map_existing(objstore_t *s) {
    uint64_t deadline = os_now_ms() + s->timeout_ms;
    struct stat sb;
    for (;;) {
        if (fstat(s->fd, &sb) != 0) {
            s->last_errno = errno;
            return OBJSTORE_E_SYSTEM;
        }
        if ((uint64_t)sb.st_size >= sizeof(os_header_t)) break;
        if (os_now_ms() > deadline) return OBJSTORE_E_BAD_REGION;
        os_nap();
    }
    void *m = mmap(NULL, sizeof(os_header_t), PROT_READ, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED) {
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    const os_header_t *h = m;
    uint64_t size = 0;
    objstore_status_t st = OBJSTORE_OK;
    for (;;) {
        uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
        if (magic == OS_MAGIC) break;
        if (magic != 0 || os_now_ms() > deadline) {
            st = OBJSTORE_E_BAD_REGION;
            break;
        }
        os_nap();
    }
    if (st == OBJSTORE_OK) {
        /* The layout must add up, and the file must hold the tables and every committed
         * byte: the header is shared memory that another process may have damaged, and a
         * table read past the end of the file would be SIGBUS. */
        size = h->region_size;
        if (h->version != OS_VERSION || !os_layout_ok(h, 0) ||
            h->committed < h->heap_off + OS_MIN_BLOCK || h->committed > size ||
            fstat(s->fd, &sb) != 0 || (uint64_t)sb.st_size < h->committed)
            st = OBJSTORE_E_BAD_REGION;
    }
    munmap(m, sizeof(os_header_t));
    if (st != OBJSTORE_OK) return st;
    m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED) {
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    s->base = m;
    s->size = size;
    return OBJSTORE_OK;
}

objstore_status_t objstore_attach(const char *name, const char *fallback_dir, objstore_t **out) {
    if (out == NULL) return OBJSTORE_E_INVALID;
    *out = NULL;
    if (!os_name_ok(name)) return OBJSTORE_E_INVALID;
    objstore_t *s = os_handle_new(name);
    if (s == NULL) return OBJSTORE_E_SYSTEM;
    objstore_status_t st;
    char shm[OS_NAME_MAX + 4];
    snprintf(shm, sizeof shm, "/%s", name);
    s->fd = shm_open(shm, O_RDWR | O_CLOEXEC, 0);
    int err = errno;
    snprintf(s->path, sizeof s->path, "/dev/shm/%s", name);
    if (s->fd < 0 && err == ENOENT && fallback_dir != NULL) {
        if (!os_file_path(s->path, sizeof s->path, fallback_dir, name)) {
            st = OBJSTORE_E_INVALID;
            goto fail;
        }
        s->fd = open(s->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        err = errno;
        s->file_backed = 1;
    }
    if (s->fd < 0) {
        st = err == ENOENT ? OBJSTORE_E_NO_REGION : OBJSTORE_E_SYSTEM;
        s->last_errno = err;
        goto fail;
    }
    st = os_map_existing(s);
    if (st == OBJSTORE_OK) st = objstore_reap(s, NULL);
    if (st == OBJSTORE_OK) st = os_slot_claim(s);
    if (st != OBJSTORE_OK) goto fail;
    *out = s;
    return OBJSTORE_OK;
fail:
    os_handle_free(s);
    return st;
}

void objstore_close(objstore_t *s) {
    if (s == NULL) return;
    if (s->base != NULL && s->slot != OS_NIL && getpid() == s->pid &&
        os_lock(s) == OBJSTORE_OK) {
        os_slot_free(s, s->slot, 0);
        os_unlock(s);
    }
    os_handle_free(s);
}

objstore_status_t objstore_unlink_name(const char *name, const char *fallback_dir) {
    if (!os_name_ok(name)) return OBJSTORE_E_INVALID;
    char shm[OS_NAME_MAX + 4], path[4096];
    snprintf(shm, sizeof shm, "/%s", name);
    if (shm_unlink(shm) == 0) return OBJSTORE_OK;
    if (errno != ENOENT) return OBJSTORE_E_SYSTEM;
    if (fallback_dir == NULL) return OBJSTORE_E_NO_REGION;
    if (!os_file_path(path, sizeof path, fallback_dir, name)) return OBJSTORE_E_INVALID;
    if (unlink(path) == 0) return OBJSTORE_OK;
    return errno == ENOENT ? OBJSTORE_E_NO_REGION : OBJSTORE_E_SYSTEM;
}

objstore_status_t objstore_unlink(objstore_t *s) {
    if (s == NULL) return OBJSTORE_E_INVALID;
    int rc;
    if (s->file_backed) {
        rc = unlink(s->path);
    } else {
        char shm[OS_NAME_MAX + 4];
        snprintf(shm, sizeof shm, "/%s", s->name);
        rc = shm_unlink(shm);
    }
    if (rc == 0) return OBJSTORE_OK;
    s->last_errno = errno;
    return errno == ENOENT ? OBJSTORE_E_NO_REGION : OBJSTORE_E_SYSTEM;
}

/* ---------------------------------------------------------------- accessors */

const char *objstore_path(const objstore_t *s) { return s == NULL ? "" : s->path; }

void objstore_mapping(const objstore_t *s, const void **base, uint64_t *size) {
    if (base != NULL) *base = s == NULL ? NULL : s->base;
    if (size != NULL) *size = s == NULL ? 0 : s->size;
}

void objstore_test_set_commit_limit(objstore_t *s, uint64_t bytes) {
    if (s != NULL) s->test_commit_limit = bytes;
}

void objstore_set_lock_timeout(objstore_t *s, uint32_t ms) {
    if (s != NULL) s->timeout_ms = ms == 0 ? OS_DEFAULT_TIMEOUT_MS : ms;
}

int32_t objstore_last_holder_pid(const objstore_t *s) { return s == NULL ? 0 : s->last_holder_pid; }

int objstore_last_errno(const objstore_t *s) { return s == NULL ? 0 : s->last_errno; }

static const struct {
    const char *name, *message;
} os_status_text[] = {
    {"OK", "success"},
    {"INVALID", "invalid argument"},
    {"NOT_FOUND", "no such object (or it is being deleted)"},
    {"EXISTS", "an object with this id already exists"},
    {"NOT_SEALED", "the object is not sealed yet"},
    {"SEALED", "the object is already sealed"},
    {"NOT_HELD", "this process holds no reference on the object, or did not create it"},
    {"FULL", "the object store is full: release or delete objects, or create a larger store"},
    {"TABLE_FULL", "the object index or reference table is full: raise max_objects"},
    {"LOCK_TIMEOUT", "timed out waiting for the store lock (see the holder pid)"},
    {"NO_SPACE", "not enough room for the region in /dev/shm: give a fallback directory, "
                 "enlarge /dev/shm (docker run --shm-size=...), or ask for less capacity"},
    {"REGION_EXISTS", "a store region with this name already exists"},
    {"NO_REGION", "no store region with this name"},
    {"BAD_REGION", "not a store region of this version, or its creator never finished it"},
    {"NO_SLOT", "too many processes attached to the store: raise max_processes"},
    {"CORRUPT", "the store's invariants do not hold"},
    {"FORKED", "the store handle belongs to the parent process: attach again after fork"},
    {"SYSTEM", "a system call failed"},
};

const char *objstore_status_name(objstore_status_t st) {
    size_t i = (size_t)st;
    return i < sizeof os_status_text / sizeof os_status_text[0] ? os_status_text[i].name : "UNKNOWN";
}

const char *objstore_status_message(objstore_status_t st) {
    size_t i = (size_t)st;
    return i < sizeof os_status_text / sizeof os_status_text[0] ? os_status_text[i].message
                                                                : "unknown status";
}

objstore_status_t objstore_privatize(objstore_t *s) {
    if (s == NULL) return OBJSTORE_E_INVALID;
    if (getpid() == s->pid) return OBJSTORE_E_INVALID;
    void *p = mmap(s->base, s->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, s->fd, 0);
    if (p == MAP_FAILED) {
        s->last_errno = errno;
        return OBJSTORE_E_SYSTEM;
    }
    if (s->populated != NULL) /* a new mapping: nothing of it is populated yet */
        memset(s->populated, 0, s->size / OS_POPULATE_CHUNK / 8 + 1);
    return OBJSTORE_OK;
}

int objstore_populate_write(void *addr, uint64_t len) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = ((uintptr_t)addr + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)addr + (uintptr_t)len) & ~(page - 1);
    if (addr == NULL || end <= start) return 0;
    return madvise((void *)start, end - start, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
#else
    (void)addr;
    (void)len;
    return EINVAL;
#endif
}
