/*
 * fuzz_objstore.c -- libFuzzer harness of the C object store (build: build_fuzz.sh).
 *
 * Each fuzz input is a little program: a header (region options) and then a sequence of
 * API operations whose ids, sizes, handles and pointers are drawn from the input bytes.
 * The harness keeps a model of what the store must hold (every object: state, size,
 * content seed, references per handle) and after every operation checks
 *
 *   - each status against the model (a get of a sealed object succeeds and returns the
 *     bytes that were written; no object outlives its delete or its last release; FULL
 *     only when no free block is large enough, TABLE_FULL only when the index is full);
 *   - objstore_stats against the model (objects, sealed, pending, data bytes,
 *     references, processes) and objstore_validate (the store's own cross-invariants);
 *   - the bytes of every live object (two objects that overlap would clobber each other).
 *
 * Operations: create (+ write) / seal / abort / put / get (+ read back) / release /
 * delete / contains / list / the pointer calls (object_at, seal_at, release_at, with
 * real and arbitrary pointers), attach and close of up to two more handles (slots,
 * NO_SLOT, references dropped at close), a commit limit (FULL when "the filesystem" is
 * full), and a holder that dies inside a critical section: the operation runs in a
 * thread armed with a crash point whose action is OBJSTORE_CRASH_THREAD_EXIT, so the
 * thread exits holding the robust mutex and the next lock in this process gets
 * EOWNERDEAD and replays the undo journal (os_journal.c) -- the model must then find
 * the store exactly as before the operation.
 *
 * Then the untrusted-bytes part: what a region holds can be damaged by any process that
 * maps it (a buggy writer that runs past its object's end, a stray pointer). Three
 * operations (fuzz_damage.c, with the NumPy handler's) damage it on purpose and then hold the API to its contract:
 *
 *   - CORRUPT: overwrite bytes of the metadata (header, tables, block headers; never
 *     the mutex itself, nor object bytes, which are the user's) then objstore_validate
 *     must answer OK or CORRUPT without any memory error;
 *   - JOURNAL: write a garbage undo journal (offsets, widths, count) and take the lock,
 *     which replays it: the replay must never write outside the region's metadata;
 *   - HEADER: damage the region header's layout fields and attach a new handle: attach
 *     must answer BAD_REGION (or OK when the damage changed nothing that matters).
 *
 * After a damage that validate accepts, the remaining operations still run (the store
 * then claims to be consistent, so nothing may crash) but without the model's checks.
 *
 * Region names: OBJSTORE_FUZZ_PREFIX (default "osfuzz") + "-PID-N"; each input's region
 * is unlinked before the next input runs, so at most one is left if the process dies.
 * OBJSTORE_FUZZ_FALLBACK names a directory for file-backed regions (an input may ask for
 * one); default: no file-backed regions.
 */
#include "fuzz_objstore.h"

fuzz_state_t F;

static const char *prefix(void) {
    static char buf[96];
    if (buf[0] == '\0') {
        /* the pid too: a run that died leaves its last region, and the next must not trip
         * over the name (the test removes every name with its prefix) */
        const char *p = getenv("OBJSTORE_FUZZ_PREFIX");
        snprintf(buf, sizeof buf, "%s-%d", p != NULL && p[0] != '\0' ? p : "osfuzz", (int)getpid());
    }
    return buf;
}


static void make_id(int k, char id[OBJSTORE_ID_SIZE]) {
    memset(id, 0xa5, OBJSTORE_ID_SIZE);
    id[0] = (char)k;
    id[15] = 'F';
}


static uint32_t total_refs(const obj_t *o) {
    uint32_t t = 0;
    for (int h = 0; h < NH; h++) t += o->refs[h];
    return t;
}

static void model_drop(int k, int h, uint32_t n) {
    obj_t *o = &F.o[k];
    o->refs[h] -= n;
    if (total_refs(o) == 0 && (!o->sealed || o->pending)) memset(o, 0, sizeof *o);
}

static int np_at(uint64_t off) {
    for (int i = 0; i < NNP; i++)
        if (F.arrays[i].p != NULL && F.arrays[i].in_store && F.arrays[i].p == base(0) + off) return 1;
    return 0;
}

static int np_in_store(void) {
    int n = 0;
    for (int i = 0; i < NNP; i++) n += F.arrays[i].p != NULL && F.arrays[i].in_store;
    return n;
}

static int open_handles(void) {
    int n = 0;
    for (int h = 0; h < NH; h++) n += F.h[h] != NULL;
    return n;
}

/* ------------------------------------------------------------------ checks */

static void check_all(void) {
    if (F.lenient) return;
    objstore_stats_t st;
    objstore_status_t rc = objstore_stats(F.h[0], &st);
    CHECK(rc == OBJSTORE_OK, "stats: %s", ST(rc));
    uint64_t objects = 0, sealed = 0, pending = 0, data = 0, refs = 0, blocks = 0;
    for (int k = 0; k < NIDS; k++) {
        const obj_t *o = &F.o[k];
        if (!o->live) continue;
        objects++;
        sealed += o->sealed != 0;
        pending += o->pending != 0;
        data += o->size;
        refs += total_refs(o);
        blocks += os_block_need(o->size);
        CHECK(same(base(0) + o->off, o->size, o->seed), "object %d: bytes changed", k);
    }
    for (int i = 0; i < NNP; i++) {
        const np_t *a = &F.arrays[i];
        if (a->p == NULL) continue;
        CHECK(same(a->p, a->size, a->seed), "array %d: bytes changed", i);
        if (!a->in_store) continue;
        objects++;
        data += a->size;
        blocks += os_block_need(a->size);
        refs++;
    }
    /* usage: each block is its object's need, or one line more (a remainder too small to
     * split off stays with it); an empty store is one free block again (nothing leaked) */
    CHECK(st.in_use >= blocks && st.in_use <= blocks + 64 * objects,
          "in_use %llu for blocks needing %llu", (unsigned long long)st.in_use,
          (unsigned long long)blocks);
    CHECK(objects > 0 || (st.in_use == 0 && st.free_blocks == 1 &&
                          st.largest_free == st.capacity - OS_BLOCK_HDR),
          "an empty store: in_use %llu, %llu free blocks, largest %llu",
          (unsigned long long)st.in_use, (unsigned long long)st.free_blocks,
          (unsigned long long)st.largest_free);
    CHECK(st.objects == objects && st.sealed == sealed && st.pending_delete == pending &&
              st.data_bytes == data && st.references == refs,
          "stats disagree with the model: objects %llu/%llu sealed %llu/%llu pending %llu/%llu "
          "data %llu/%llu refs %llu/%llu",
          (unsigned long long)st.objects, (unsigned long long)objects,
          (unsigned long long)st.sealed, (unsigned long long)sealed,
          (unsigned long long)st.pending_delete, (unsigned long long)pending,
          (unsigned long long)st.data_bytes, (unsigned long long)data,
          (unsigned long long)st.references, (unsigned long long)refs);
    CHECK(st.processes == (uint64_t)open_handles(), "processes %llu, handles %d",
          (unsigned long long)st.processes, open_handles());
    CHECK(st.in_use <= st.capacity, "in_use past capacity");
    char msg[256];
    rc = objstore_validate(F.h[0], msg, sizeof msg);
    CHECK(rc == OBJSTORE_OK, "validate: %s: %s", ST(rc), msg);
}

/* A FULL answer is legitimate only when no free block can hold the object (or a limit
 * or a failed commitment said so). */
static void check_full(int h, uint64_t size, uint64_t limit) {
    if (F.lenient || limit != 0) return;
    if (h == 0 && F.limited && objstore_last_errno(F.h[0]) != 0) return;
    objstore_stats_t st;
    if (objstore_stats(F.h[h], &st) != OBJSTORE_OK) return;
    uint64_t rounded = size == 0 ? 64 : (size + 63) & ~(uint64_t)63;
    CHECK(size > st.capacity || st.largest_free < rounded,
          "FULL for %llu bytes with a free block of %llu", (unsigned long long)size,
          (unsigned long long)st.largest_free);
}

static void check_table_full(void) {
    if (F.lenient) return;
    uint64_t live = (uint64_t)np_in_store();
    for (int k = 0; k < NIDS; k++) live += F.o[k].live != 0;
    CHECK(live >= F.max_objects, "TABLE_FULL with %llu of %llu entries used",
          (unsigned long long)live, (unsigned long long)F.max_objects);
}

/* ------------------------------------------------------------------ operations */

/* Operation numbers are part of the corpus's meaning: an input byte picks one as byte % 32,
 * numbers past OP_NOPS do nothing. Never renumber; a new operation takes the next number
 * (the committed regression inputs would otherwise turn into other programs). */
enum {
    OP_CREATE, OP_SEAL, OP_ABORT, OP_PUT, OP_GET, OP_RELEASE, OP_DELETE, OP_CONTAINS,
    OP_LIST, OP_OBJECT_AT, OP_SEAL_AT, OP_RELEASE_AT, OP_ATTACH, OP_CLOSE, OP_LIMIT,
    OP_CRASH, OP_NUMPY, OP_CORRUPT, OP_JOURNAL, OP_HEADER, OP_NOPS
};

uint64_t draw_size(in_t *in) {
    uint8_t kind = u8(in);
    switch (kind % 8) {
    case 0: return 0;
    case 1: return u8(in);
    case 2: return u16(in) % 4096;
    case 3: return u16(in);
    case 4: return (uint64_t)u32(in) % (F.capacity + 256);
    case 5: return F.capacity - (kind >> 3); /* around the capacity */
    case 6: return u64(in);                  /* anything, overflow included */
    default: return 64u * (u8(in) % 16);     /* whole lines */
    }
}

/* handle index to use: an open one */
static int draw_handle(in_t *in) {
    int h = u8(in) % NH;
    return F.h[h] != NULL ? h : 0;
}

static void op_create(in_t *in, int h, int k, int bounded) {
    char id[OBJSTORE_ID_SIZE];
    make_id(k, id);
    uint64_t size = draw_size(in), limit = bounded ? (uint64_t)u32(in) : 0;
    void *data = NULL;
    objstore_status_t rc = objstore_create_bounded(F.h[h], id, size, limit, &data);
    obj_t *o = &F.o[k];
    if (o->live) { /* a size past the capacity is refused before the id is looked up */
        CHECK(rc == OBJSTORE_E_EXISTS || (rc == OBJSTORE_E_FULL && size > F.capacity),
              "create of a live id: %s", ST(rc));
        return;
    }
    if (rc == OBJSTORE_E_FULL) return check_full(h, size, limit);
    if (rc == OBJSTORE_E_TABLE_FULL) return check_table_full();
    CHECK(rc == OBJSTORE_OK, "create %llu bytes: %s", (unsigned long long)size, ST(rc));
    if (rc != OBJSTORE_OK) return;
    uint64_t off = (uint64_t)((char *)data - base(h));
    CHECK(off % 64 == 0, "object bytes not 64-byte aligned");
    memset(o, 0, sizeof *o);
    o->live = 1;
    o->creator = h;
    o->size = size;
    o->off = off;
    o->seed = F.next_seed++;
    o->refs[h] = 1;
    fill(data, size, o->seed);
}

static void op_put(in_t *in, int h, int k) {
    char id[OBJSTORE_ID_SIZE];
    make_id(k, id);
    uint64_t size = draw_size(in) % (F.capacity + 128); /* the source buffer must exist */
    uint8_t seed = F.next_seed++;
    char *buf = malloc(size == 0 ? 1 : size);
    if (buf == NULL) return;
    fill(buf, size, seed);
    objstore_status_t rc = objstore_put(F.h[h], id, buf, size);
    free(buf);
    obj_t *o = &F.o[k];
    if (o->live) {
        CHECK(rc == OBJSTORE_E_EXISTS || (rc == OBJSTORE_E_FULL && size > F.capacity), "put of a live id: %s", ST(rc));
        return;
    }
    if (rc == OBJSTORE_E_FULL) return check_full(h, size, 0);
    if (rc == OBJSTORE_E_TABLE_FULL) return check_table_full();
    CHECK(rc == OBJSTORE_OK, "put %llu bytes: %s", (unsigned long long)size, ST(rc));
    if (rc != OBJSTORE_OK) return;
    /* where it went: a get (then released) tells */
    const void *data;
    uint64_t got;
    rc = objstore_get(F.h[h], id, &data, &got);
    CHECK(rc == OBJSTORE_OK && got == size, "get after put: %s", ST(rc));
    if (rc != OBJSTORE_OK) return;
    memset(o, 0, sizeof *o);
    o->live = o->sealed = 1;
    o->creator = h;
    o->size = size;
    o->off = (uint64_t)((const char *)data - base(h));
    o->seed = seed;
    CHECK(same(data, size, seed), "put: bytes read back differ");
    rc = objstore_release(F.h[h], id);
    CHECK(rc == OBJSTORE_OK, "release after put: %s", ST(rc));
}

/* seal / abort: the expected answer for handle h on object k */
static objstore_status_t expect_own_unsealed(int h, int k) {
    const obj_t *o = &F.o[k];
    if (!o->live) return OBJSTORE_E_NOT_FOUND;
    if (o->sealed) return OBJSTORE_E_SEALED;
    if (o->creator != h) return OBJSTORE_E_NOT_HELD;
    return OBJSTORE_OK;
}

static void apply_seal(int k) { F.o[k].sealed = 1; }
static void apply_abort(int h, int k) { model_drop(k, h, F.o[k].refs[h]); }

static objstore_status_t expect_get(int k) {
    const obj_t *o = &F.o[k];
    if (!o->live || o->pending) return OBJSTORE_E_NOT_FOUND;
    if (!o->sealed) return OBJSTORE_E_NOT_SEALED;
    return OBJSTORE_OK;
}

static objstore_status_t expect_release(int h, int k) {
    const obj_t *o = &F.o[k];
    if (!o->live) return OBJSTORE_E_NOT_FOUND;
    if (o->refs[h] == 0) return OBJSTORE_E_NOT_HELD;
    return OBJSTORE_OK;
}

static objstore_status_t expect_delete(int k) {
    const obj_t *o = &F.o[k];
    if (!o->live || o->pending) return OBJSTORE_E_NOT_FOUND;
    if (!o->sealed) return OBJSTORE_E_NOT_SEALED;
    return OBJSTORE_OK;
}

static void apply_delete(int k, int deferred) {
    obj_t *o = &F.o[k];
    CHECK(deferred == (total_refs(o) > 0), "delete: deferred %d with %u references", deferred,
          total_refs(o));
    if (total_refs(o) > 0) o->pending = 1;
    else memset(o, 0, sizeof *o);
}

static void op_get(int h, int k, const char *id) {
    const void *data;
    uint64_t size;
    objstore_status_t rc = objstore_get(F.h[h], id, &data, &size);
    objstore_status_t want = k < 0 ? OBJSTORE_E_NOT_FOUND : expect_get(k);
    CHECK(rc == want, "get: %s, expected %s", ST(rc), ST(want));
    if (rc != OBJSTORE_OK || k < 0 || want != OBJSTORE_OK) return;
    obj_t *o = &F.o[k];
    CHECK(size == o->size, "get: size %llu, written %llu", (unsigned long long)size,
          (unsigned long long)o->size);
    CHECK((uint64_t)((const char *)data - base(h)) == o->off, "get: bytes moved");
    CHECK(same(data, size, o->seed), "get: bytes differ from what was written");
    o->refs[h]++;
}

static void op_pointer(in_t *in, int op, int h) {
    uint8_t how = u8(in);
    int k = how % NIDS;
    const obj_t *o = &F.o[k];
    uint64_t mapsize;
    const void *b;
    objstore_mapping(F.h[h], &b, &mapsize);
    uint64_t off;
    int real = o->live && (how & 0x80) == 0;
    if (real) off = o->off;
    else if (how & 0x40) off = o->off + (u8(in) % 129) - 64; /* near an object */
    else off = u64(in);
    off %= mapsize;
    /* which model object starts exactly there, if any */
    int at = -1;
    if (h == 0 && np_at(off)) return; /* a NumPy array's object: the handler's, not ours */
    for (int j = 0; j < NIDS; j++)
        if (F.o[j].live && F.o[j].off == off) at = j;
    const char *p = (const char *)b + off;
    char id[OBJSTORE_ID_SIZE], want_id[OBJSTORE_ID_SIZE];
    if (at >= 0) make_id(at, want_id);
    objstore_status_t rc;
    if (op == OP_OBJECT_AT) {
        uint64_t size = 0;
        int state = -1;
        rc = objstore_object_at(F.h[h], p, id, &size, &state);
        if (at < 0) {
            CHECK(rc == OBJSTORE_E_NOT_FOUND, "object_at(%llu): %s", (unsigned long long)off, ST(rc));
            return;
        }
        const obj_t *a = &F.o[at];
        int want_state = a->pending ? OBJSTORE_DELETE_PENDING
                         : a->sealed ? OBJSTORE_SEALED
                                     : OBJSTORE_UNSEALED;
        CHECK(rc == OBJSTORE_OK && memcmp(id, want_id, OBJSTORE_ID_SIZE) == 0 &&
                  size == a->size && state == want_state,
              "object_at: %s", ST(rc));
    } else if (op == OP_SEAL_AT) {
        uint64_t size = at >= 0 ? F.o[at].size : 0;
        if (u8(in) & 1) size = draw_size(in);
        rc = objstore_seal_at(F.h[h], p, size, id);
        objstore_status_t want = OBJSTORE_E_NOT_FOUND;
        if (at >= 0 && F.o[at].size == size) want = expect_own_unsealed(h, at);
        CHECK(rc == want, "seal_at: %s, expected %s", ST(rc), ST(want));
        if (rc == OBJSTORE_OK && want == OBJSTORE_OK) {
            CHECK(memcmp(id, want_id, OBJSTORE_ID_SIZE) == 0, "seal_at: wrong id");
            apply_seal(at);
        }
    } else {
        uint64_t size = 0;
        rc = objstore_release_at(F.h[h], p, &size);
        objstore_status_t want = at >= 0 ? expect_release(h, at) : OBJSTORE_E_NOT_FOUND;
        CHECK(rc == want, "release_at: %s, expected %s", ST(rc), ST(want));
        if (rc == OBJSTORE_OK && want == OBJSTORE_OK) {
            CHECK(size == F.o[at].size, "release_at: size");
            model_drop(at, h, 1);
        }
    }
}

static void op_list(int h) {
    char ids[(NIDS + NNP + 2) * OBJSTORE_ID_SIZE];
    uint64_t count = 0;
    objstore_status_t rc = objstore_list(F.h[h], ids, NIDS + NNP + 2, &count);
    CHECK(rc == OBJSTORE_OK, "list: %s", ST(rc));
    uint64_t live = (uint64_t)np_in_store(), others = 0;
    for (int k = 0; k < NIDS; k++) live += F.o[k].live != 0;
    CHECK(count == live, "list: %llu objects, model %llu", (unsigned long long)count,
          (unsigned long long)live);
    for (uint64_t i = 0; i < count && i < NIDS + NNP + 2; i++) {
        const char *id = ids + i * OBJSTORE_ID_SIZE;
        int k = (unsigned char)id[0];
        char want[OBJSTORE_ID_SIZE];
        if (k < NIDS) make_id(k, want);
        if (k < NIDS && memcmp(id, want, OBJSTORE_ID_SIZE) == 0) {
            CHECK(F.o[k].live, "list: object %d, which is gone", k);
        } else {
            others++; /* the NumPy handler's ids */
        }
    }
    CHECK(others == (uint64_t)np_in_store(), "list: %llu ids nobody stored",
          (unsigned long long)(others - (uint64_t)np_in_store()));
}

static void op_attach(int h) {
    if (h == 0 || F.h[h] != NULL) return;
    objstore_status_t rc = objstore_attach(F.name, getenv("OBJSTORE_FUZZ_FALLBACK"), &F.h[h]);
    if (rc == OBJSTORE_E_NO_SLOT) {
        CHECK((uint32_t)open_handles() >= F.max_processes, "NO_SLOT with %d of %u slots",
              open_handles(), F.max_processes);
        return;
    }
    CHECK(rc == OBJSTORE_OK, "attach: %s", ST(rc));
    if (F.h[h] != NULL) objstore_set_lock_timeout(F.h[h], 2000);
}

static void op_close(int h) {
    if (h == 0 || F.h[h] == NULL) return;
    objstore_close(F.h[h]);
    F.h[h] = NULL;
    for (int k = 0; k < NIDS; k++)
        if (F.o[k].live && F.o[k].refs[h] > 0) model_drop(k, h, F.o[k].refs[h]);
}

/* A holder that dies inside a critical section: run one operation in a thread armed to
 * exit at `point`; if it did, the store must be exactly as before the operation. */
typedef struct {
    int op, h, k, done;
    uint64_t size;
    objstore_status_t rc;
    int deferred;
    void *data;
} crash_job_t;

static void *crash_thread(void *arg) {
    crash_job_t *j = arg;
    char id[OBJSTORE_ID_SIZE];
    make_id(j->k, id);
    objstore_t *s = F.h[j->h];
    const void *d;
    uint64_t size;
    switch (j->op) {
    case 0: j->rc = objstore_create(s, id, j->size, &j->data); break;
    case 1: j->rc = objstore_seal(s, id); break;
    case 2: j->rc = objstore_get(s, id, &d, &size); break;
    case 3: j->rc = objstore_release(s, id); break;
    case 4: j->rc = objstore_delete(s, id, &j->deferred); break;
    default: j->rc = objstore_abort(s, id); break;
    }
    j->done = 1;
    return NULL;
}

static void op_crash(in_t *in, int h, int k) {
    crash_job_t j = {.op = u8(in) % 6, .h = h, .k = k};
    if (j.op == 0) j.size = draw_size(in) % (F.capacity + 128);
    int point = 1 + u8(in) % (OBJSTORE_CRASH_NPOINTS - 1);
    if (point == OBJSTORE_CRASH_REAP) point = OBJSTORE_CRASH_GROW;
    objstore_test_crash_point(F.h[h], point, 1 + u8(in) % 2, OBJSTORE_CRASH_THREAD_EXIT);
    pthread_t t;
    if (pthread_create(&t, NULL, crash_thread, &j) != 0) {
        objstore_test_crash_point(F.h[h], OBJSTORE_CRASH_NONE, 0, 0);
        return;
    }
    pthread_join(t, NULL);
    objstore_test_crash_point(F.h[h], OBJSTORE_CRASH_NONE, 0, 0);
    if (!j.done) {
        /* the next lock recovers; the model stays as it was */
        objstore_stats_t st;
        objstore_status_t rc = objstore_stats(F.h[0], &st);
        CHECK(rc == OBJSTORE_OK && st.recoveries > 0, "no recovery after a holder died: %s",
              ST(rc));
        return;
    }
    /* the crash point was not reached: the operation completed, apply it */
    obj_t *o = &F.o[k];
    objstore_status_t want;
    switch (j.op) {
    case 0:
        if (o->live)
            CHECK(j.rc == OBJSTORE_E_EXISTS || (j.rc == OBJSTORE_E_FULL && j.size > F.capacity),
                  "crash/create: %s", ST(j.rc));
        else if (j.rc == OBJSTORE_E_FULL) check_full(h, j.size, 0);
        else if (j.rc == OBJSTORE_E_TABLE_FULL) check_table_full();
        else if (j.rc == OBJSTORE_OK) {
            memset(o, 0, sizeof *o);
            o->live = 1;
            o->creator = h;
            o->size = j.size;
            o->off = (uint64_t)((char *)j.data - base(h));
            o->seed = F.next_seed++;
            o->refs[h] = 1;
            fill(j.data, j.size, o->seed);
        } else CHECK(0, "crash/create: %s", ST(j.rc));
        break;
    case 1:
        want = expect_own_unsealed(h, k);
        CHECK(j.rc == want, "crash/seal: %s, expected %s", ST(j.rc), ST(want));
        if (j.rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_seal(k);
        break;
    case 2:
        want = expect_get(k);
        CHECK(j.rc == want, "crash/get: %s, expected %s", ST(j.rc), ST(want));
        if (j.rc == OBJSTORE_OK && want == OBJSTORE_OK) o->refs[h]++;
        break;
    case 3:
        want = expect_release(h, k);
        CHECK(j.rc == want, "crash/release: %s, expected %s", ST(j.rc), ST(want));
        if (j.rc == OBJSTORE_OK && want == OBJSTORE_OK) model_drop(k, h, 1);
        break;
    case 4:
        want = expect_delete(k);
        CHECK(j.rc == want, "crash/delete: %s, expected %s", ST(j.rc), ST(want));
        if (j.rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_delete(k, j.deferred);
        break;
    default:
        want = expect_own_unsealed(h, k);
        CHECK(j.rc == want, "crash/abort: %s, expected %s", ST(j.rc), ST(want));
        if (j.rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_abort(h, k);
        break;
    }
}

/* ------------------------------------------------------------------ driver */

static void teardown(void) {
    /* arrays from the fallback are the harness's to free; store ones go with handle 0 */
    for (int i = 0; i < NNP; i++)
        if (F.arrays[i].p != NULL && !F.arrays[i].in_store) free(F.arrays[i].p);
    free(F.np); /* never freed by the library: NumPy arrays may point at it for ever */
    for (int h = NH - 1; h >= 0; h--) {
        if (F.h[h] == NULL) continue;
        if (h == 0) objstore_unlink(F.h[0]);
        objstore_close(F.h[h]);
        F.h[h] = NULL;
    }
    objstore_unlink_name(F.name, getenv("OBJSTORE_FUZZ_FALLBACK")); /* if damage kept it */
    free(F.snap);
    F.snap = NULL;
}

static const uint64_t capacities[8] = {
    1024, 4096, 8192, 65536, 1u << 20, (4u << 20) + 65536, 9u << 20, 2048,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned long counter;
    static int trace = -1; /* OBJSTORE_FUZZ_TRACE=1: print each step (to read a crash) */
    if (trace < 0) trace = getenv("OBJSTORE_FUZZ_TRACE") != NULL;
    in_t in = {data, size};
    memset(&F, 0, sizeof F);
    uint8_t opt = u8(&in);
    F.capacity = capacities[opt % 8];
    F.max_objects = (opt & 0x08) ? 1 + u8(&in) % 8 : 0;
    F.max_processes = (opt & 0x10) ? 1 + u8(&in) % 3 : 0;
    const char *fallback = getenv("OBJSTORE_FUZZ_FALLBACK");
    objstore_options_t o = {.capacity = F.capacity, .max_objects = F.max_objects,
                            .max_processes = F.max_processes};
    if ((opt & 0x20) && fallback != NULL) {
        o.fallback_dir = fallback;
        o.test_shm_avail = 1; /* /dev/shm "full": a file in the fallback directory */
    }
    snprintf(F.name, sizeof F.name, "%s-%lu", prefix(), counter++);
    objstore_status_t rc = objstore_create_region(F.name, &o, &F.h[0]);
    if (rc != OBJSTORE_OK) FAILF("create_region %s: %s", F.name, ST(rc));
    objstore_set_lock_timeout(F.h[0], 2000);
    /* The store seeds its hash from the clock; a fixed one (the store is empty: no bucket
     * holds anything yet) makes an input replay the same way, crash included. */
    os_hdr(F.h[0])->hash_seed = 0x9e3779b97f4a7c15ULL;
    objstore_stats_t st;
    objstore_stats(F.h[0], &st);
    F.capacity = st.capacity;
    F.max_objects = st.max_objects;
    F.max_processes = (uint32_t)st.max_processes;

    for (int steps = 0; in.n > 0 && steps < 256; steps++) {
        uint8_t op = u8(&in) % 32;
        if (op >= OP_NOPS) continue; /* numbers for operations to come */
        int h = draw_handle(&in);
        uint8_t which = u8(&in);
        int k = which % NIDS;
        char id[OBJSTORE_ID_SIZE];
        make_id(k, id);
        int alien = which >= 0xf0; /* an id nobody stored */
        if (alien) {
            for (int i = 0; i < OBJSTORE_ID_SIZE; i++) id[i] = (char)u8(&in);
            id[0] = (char)(NIDS + (unsigned char)id[0] % 100);
        }
        objstore_status_t want;
        int deferred = -1;
        if (trace) fprintf(stderr, "step %d: op %d handle %d id %d%s%s\n", steps, op, h, k,
                           alien ? " (alien)" : "", F.lenient ? " [lenient]" : "");
        switch (op) {
        case OP_CREATE: op_create(&in, h, k, which & 0x20); break;
        case OP_PUT: op_put(&in, h, k); break;
        case OP_SEAL:
            rc = objstore_seal(F.h[h], id);
            want = alien ? OBJSTORE_E_NOT_FOUND : expect_own_unsealed(h, k);
            CHECK(rc == want, "seal: %s, expected %s", ST(rc), ST(want));
            if (!alien && rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_seal(k);
            break;
        case OP_ABORT:
            rc = objstore_abort(F.h[h], id);
            want = alien ? OBJSTORE_E_NOT_FOUND : expect_own_unsealed(h, k);
            CHECK(rc == want, "abort: %s, expected %s", ST(rc), ST(want));
            if (!alien && rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_abort(h, k);
            break;
        case OP_GET: op_get(h, alien ? -1 : k, id); break;
        case OP_RELEASE:
            rc = objstore_release(F.h[h], id);
            want = alien ? OBJSTORE_E_NOT_FOUND : expect_release(h, k);
            CHECK(rc == want, "release: %s, expected %s", ST(rc), ST(want));
            if (!alien && rc == OBJSTORE_OK && want == OBJSTORE_OK) model_drop(k, h, 1);
            break;
        case OP_DELETE:
            rc = objstore_delete(F.h[h], id, &deferred);
            want = alien ? OBJSTORE_E_NOT_FOUND : expect_delete(k);
            CHECK(rc == want, "delete: %s, expected %s", ST(rc), ST(want));
            if (!alien && rc == OBJSTORE_OK && want == OBJSTORE_OK) apply_delete(k, deferred);
            break;
        case OP_CONTAINS: {
            int state = -1;
            rc = objstore_contains(F.h[h], id, &state);
            const obj_t *m = &F.o[k];
            int ws = alien || !m->live ? OBJSTORE_ABSENT
                     : m->pending      ? OBJSTORE_DELETE_PENDING
                     : m->sealed       ? OBJSTORE_SEALED
                                       : OBJSTORE_UNSEALED;
            CHECK(rc == OBJSTORE_OK && state == ws, "contains: %s state %d, expected %d", ST(rc),
                  state, ws);
            break;
        }
        case OP_LIST: op_list(h); break;
        case OP_OBJECT_AT:
        case OP_SEAL_AT:
        case OP_RELEASE_AT: op_pointer(&in, op, h); break;
        case OP_ATTACH: op_attach(1 + which % 2); break;
        case OP_CLOSE: op_close(1 + which % 2); break;
        case OP_LIMIT: {
            const os_header_t *hd = os_hdr(F.h[0]);
            uint64_t limit = (which & 1) ? 0 : hd->committed + 4096u * u8(&in);
            objstore_test_set_commit_limit(F.h[0], limit);
            F.limited = limit != 0;
            break;
        }
        case OP_CRASH:
            if (!alien && !F.lenient) op_crash(&in, h, k);
            break;
        case OP_NUMPY: op_numpy(&in); break;
        default: /* OP_CORRUPT, OP_JOURNAL, OP_HEADER: once per input */
            if (F.lenient) break;
            snapshot();
            if (op == OP_CORRUPT) damage(&in);
            else if (op == OP_JOURNAL) op_journal(&in);
            else op_header(&in);
            if (!after_damage()) goto done;
            break;
        }
        check_all();
    }
done:
    teardown();
    return 0;
}
