/*
 * fuzz_damage.c -- the fuzz harness's operations on the NumPy handler and those that damage
 * the region (see fuzz_objstore.c for the whole harness and the contract they check).
 */
#include "fuzz_objstore.h"

/* ------------------------------------------------------------------ NumPy handler */

static void *fb_malloc(void *ctx, size_t size) { return malloc(size == 0 ? 1 : size); }
static void *fb_calloc(void *ctx, size_t n, size_t size) { return calloc(n == 0 ? 1 : n, size == 0 ? 1 : size); }
static void *fb_realloc(void *ctx, void *p, size_t size) { return realloc(p, size == 0 ? 1 : size); }
static void fb_free(void *ctx, void *p, size_t size) { free(p); }

static const np_handler_t fallback_handler = {
    "fuzz_fallback", 1, {NULL, fb_malloc, fb_calloc, fb_realloc, fb_free}};

static int in_mapping(const void *p) {
    uint64_t size;
    const void *b;
    objstore_mapping(F.h[0], &b, &size);
    return (const char *)p >= (const char *)b && (const char *)p < (const char *)b + size;
}

void op_numpy(in_t *in) {
    if (F.np == NULL) {
        uint64_t threshold = 1 + u16(in) % 2048, limit = (u8(in) & 1) ? 0 : u32(in);
        void *hd = NULL;
        objstore_status_t rc = objstore_np_handler(F.h[0], threshold, limit, &fallback_handler, &hd);
        CHECK(rc == OBJSTORE_OK, "np_handler: %s", ST(rc));
        if (rc != OBJSTORE_OK) return;
        F.np = hd;
    }
    np_allocator_t *A = &F.np->allocator;
    uint8_t what = u8(in);
    np_t *a = &F.arrays[what % NNP];
    switch ((what >> 3) % 4) {
    case 0: /* malloc (or calloc) into a free slot */
    case 1: {
        if (a->p != NULL) return;
        uint64_t size = draw_size(in) % (F.capacity + 4096);
        char *p = (what >> 3) % 4 == 0 ? A->malloc(A->ctx, size) : A->calloc(A->ctx, size, 1);
        if (p == NULL) return;
        a->p = p;
        a->size = size;
        a->in_store = in_mapping(p);
        CHECK(!a->in_store || (what >> 3) % 4 == 0, "calloc gave store memory");
        a->seed = F.next_seed++;
        fill(p, size, a->seed);
        break;
    }
    case 2: { /* realloc: the bytes kept must survive the move */
        if (a->p == NULL) return;
        uint64_t size = draw_size(in) % (F.capacity + 4096);
        char *p = A->realloc(A->ctx, a->p, size);
        if (p == NULL) return; /* the old array stays */
        uint64_t kept = size < a->size ? size : a->size;
        CHECK(same(p, kept, a->seed), "realloc lost the array's bytes");
        a->p = p;
        a->size = size;
        a->in_store = in_mapping(p);
        fill(p, size, a->seed);
        break;
    }
    default: /* free */
        if (a->p == NULL) return;
        A->free(A->ctx, a->p, a->size);
        memset(a, 0, sizeof *a);
        break;
    }
}

/* ------------------------------------------------------------------ damage */

/* Offsets of the metadata an input may damage: the header but the mutex, the undo
 * journal (JOURNAL does that) and nothing else; the tables; block headers. */
static uint64_t draw_meta_offset(in_t *in, const os_header_t *h) {
    uint8_t where = u8(in);
    uint64_t mutex_lo = offsetof(os_header_t, mutex), mutex_hi = mutex_lo + sizeof(pthread_mutex_t);
    switch (where % 4) {
    case 0: { /* header fields */
        uint64_t off = u16(in) % offsetof(os_header_t, undo);
        return off >= mutex_lo && off < mutex_hi ? mutex_hi : off;
    }
    case 1: /* tables */
        return h->slots_off + u32(in) % (h->heap_off - h->slots_off);
    default: { /* the header of a live object's block, or of the block after it */
        const obj_t *o = &F.o[u8(in) % NIDS];
        uint64_t off = o->live ? o->off - OS_BLOCK_HDR : h->heap_off;
        if ((where & 4) && o->live) off += OS_BLOCK_HDR + ((o->size + 63) & ~(uint64_t)63);
        if (o->live && o->size == 0 && (where & 4)) off += 64;
        return off + u8(in) % OS_BLOCK_HDR;
    }
    }
}

/* Keep the committed bytes (header, tables, heap below the mark) to restore them if
 * validate refuses the damage: a corrupt region may not be closed safely, and the
 * handles must be closed (the region's name removed) before the next input. */
void snapshot(void) {
    uint64_t len = os_hdr(F.h[0])->committed;
    F.snap = malloc(len);
    if (F.snap == NULL) FAILF("no memory for a snapshot of %llu bytes", (unsigned long long)len);
    memcpy(F.snap, base(0), len);
    F.snap_len = len;
}

void damage(in_t *in) {
    char *b = base(0);
    os_header_t h; /* the layout before the damage: offsets come from it */
    memcpy(&h, b, sizeof h);
    int n = 1 + u8(in) % 8;
    for (int i = 0; i < n; i++) {
        uint64_t off = draw_meta_offset(in, &h);
        if (off >= h.committed) continue; /* no pages there */
        uint8_t how = u8(in), v = u8(in);
        if (how % 3 == 0) b[off] = (char)v;
        else if (how % 3 == 1) b[off] ^= (char)(1u << (v % 8));
        else b[off] = (char)(b[off] + (v % 2 ? 1 : -1));
    }
    /* a zero magic means "creator still initialising": attach would wait its timeout */
    if (os_hdr(F.h[0])->magic == 0) os_hdr(F.h[0])->magic = 1;
}

/* After damage: validate must not crash; OK means the store claims consistency, and the
 * remaining operations run without the model's checks. */
int after_damage(void) {
    F.lenient = 1;
    char msg[256];
    objstore_status_t rc = objstore_validate(F.h[0], msg, sizeof msg);
    if (rc == OBJSTORE_OK) return 1;
    memcpy(base(0), F.snap, F.snap_len); /* undo the damage: the handles can be closed */
    return 0;
}

void op_journal(in_t *in) {
    os_header_t *h = os_hdr(F.h[0]);
    uint64_t n = u8(in) % 6;
    for (uint64_t i = 0; i < n; i++) {
        os_undo_t *u = &h->undo[i];
        uint8_t how = u8(in);
        switch (how % 4) {
        case 0: u->off = u64(in); break;
        case 1: u->off = u32(in) % h->committed; break;
        case 2: u->off = offsetof(os_header_t, free_head) + u8(in) * 4u; break;
        default: u->off = h->heap_off + 64u * u8(in) + (u8(in) % 8) * 8u; break;
        }
        u->old = u64(in);
        uint8_t w = u8(in);
        u->width = w % 4 == 0 ? 4 : w % 4 == 1 ? 8 : w;
    }
    h->undo_count = (u8(in) & 0x80) ? u64(in) : n;
}

void op_header(in_t *in) {
    char *b = base(0);
    int n = 1 + u8(in) % 4;
    for (int i = 0; i < n; i++) {
        uint64_t off = u8(in) % offsetof(os_header_t, mutex);
        b[off] = (char)(b[off] ^ (1u << (u8(in) % 8)));
    }
    if (os_hdr(F.h[0])->magic == 0) os_hdr(F.h[0])->magic = 1;
    int h = F.h[1] == NULL ? 1 : F.h[2] == NULL ? 2 : 0;
    if (h == 0) return;
    objstore_status_t rc = objstore_attach(F.name, getenv("OBJSTORE_FUZZ_FALLBACK"), &F.h[h]);
    if (rc == OBJSTORE_OK) objstore_set_lock_timeout(F.h[h], 2000);
}

