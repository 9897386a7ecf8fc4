/*
 * os_alloc.c -- the heap allocator: boundary tags, segregated LIFO free lists, coalescing.
 *
 * Every block starts with a 64-byte header (os_block_t) and its size is a multiple of 64,
 * so object bytes are 64-byte aligned (cache lines; AVX-512 loads). Each header records
 * the size of the block before it, so a freed block finds both neighbours in O(1) and
 * merges with the free ones: no two free blocks are ever adjacent.
 *
 * Free blocks sit in one of OS_NCLASSES doubly linked lists by size class
 * [64*2^k, 64*2^(k+1)). A freed block goes to the *head* of its list and allocation takes
 * the first fit from the head, so the most recently freed memory (whose pages are
 * resident and likely cached) is reused first. A request first scans its own class
 * (first fit), then takes the head of the first non-empty larger class, whose blocks all
 * fit. Splitting keeps the front of a block (the hot end) and lists the remainder.
 *
 * All writes go through the journal (os_j64), so a holder that dies half-way is undone.
 *
 * Lazy commitment (see os_internal.h): the last block, when free, may reach past the
 * committed mark; objstore_create commits up to os_take_end before os_alloc_take, so a
 * header or used block is never written there. When the first fit would need more
 * commitment, any committed block that fits is taken instead (os_alloc_find_within), so
 * the mark only grows when the committed memory is really used up.
 */
#include <stdio.h>
#include <string.h>

#include "os_internal.h"

unsigned os_class_of(uint64_t size) {
    uint64_t units = size / OS_ALIGN;
    if (units == 0) units = 1;
    unsigned k = 63u - (unsigned)__builtin_clzll(units);
    return k >= OS_NCLASSES ? OS_NCLASSES - 1 : k;
}

/* Block size for an object of `size` bytes; the caller has bounded size by the heap size,
 * so this cannot overflow. Empty objects still get one line so that every block has a
 * distinct address. */
uint64_t os_block_need(uint64_t size) {
    uint64_t data = size == 0 ? OS_ALIGN : (size + OS_ALIGN - 1) & ~(uint64_t)(OS_ALIGN - 1);
    return OS_BLOCK_HDR + data;
}

static uint64_t os_heap_end(const objstore_t *s) {
    return os_hdr(s)->heap_off + os_hdr(s)->heap_size;
}

static void os_list_remove(objstore_t *s, uint64_t off) {
    os_header_t *h = os_hdr(s);
    os_block_t *b = os_block(s, off);
    unsigned k = os_class_of(b->size);
    if (b->prev_free != 0) os_j64(s, &os_block(s, b->prev_free)->next_free, b->next_free);
    else os_j64(s, &h->free_head[k], b->next_free);
    if (b->next_free != 0) os_j64(s, &os_block(s, b->next_free)->prev_free, b->prev_free);
    os_j64(s, &b->next_free, 0);
    os_j64(s, &b->prev_free, 0);
}

static void os_list_push(objstore_t *s, uint64_t off) {
    os_header_t *h = os_hdr(s);
    os_block_t *b = os_block(s, off);
    unsigned k = os_class_of(b->size);
    uint64_t head = h->free_head[k];
    os_j64(s, &b->next_free, head);
    os_j64(s, &b->prev_free, 0);
    if (head != 0) os_j64(s, &os_block(s, head)->prev_free, off);
    os_j64(s, &h->free_head[k], off);
}

/* Offset of a free block of at least `need` bytes, or 0. Reads only: the caller checks
 * every other precondition before os_alloc_take starts writing. */
uint64_t os_alloc_find(const objstore_t *s, uint64_t need) {
    const os_header_t *h = os_hdr(s);
    if (need > h->heap_size) return 0;
    unsigned k = os_class_of(need);
    uint64_t bound = h->heap_size / OS_MIN_BLOCK + 1; /* guards a corrupt cycle */
    for (uint64_t off = h->free_head[k]; off != 0 && bound > 0; bound--) {
        const os_block_t *b = os_block(s, off);
        if (b->size >= need) return off;
        off = b->next_free;
    }
    for (unsigned c = k + 1; c < OS_NCLASSES; c++)
        if (h->free_head[c] != 0) return h->free_head[c];
    return 0;
}

/* End (region offset) of the memory that taking the free block at `off` for `need` bytes
 * writes: the block's front, plus the header of the remainder when it is split off, or
 * the whole block when it is not. The caller commits up to it first. */
uint64_t os_take_end(const objstore_t *s, uint64_t off, uint64_t need) {
    uint64_t size = os_block(s, off)->size;
    return size - need >= OS_MIN_BLOCK ? off + need + OS_BLOCK_HDR : off + size;
}

/* Like os_alloc_find, but only a block that can be taken without committing past
 * `limit` (os_take_end <= limit), largest class first. Only the last block can straddle
 * the mark, so in a larger class the first block that is not it fits; only the request's
 * own class is scanned for a fit. Used when the first fit would need more commitment.
 * 0 if none. */
uint64_t os_alloc_find_within(const objstore_t *s, uint64_t need, uint64_t limit) {
    const os_header_t *h = os_hdr(s);
    if (need > h->heap_size) return 0;
    uint64_t bound = h->heap_size / OS_MIN_BLOCK + 1;
    for (unsigned c = OS_NCLASSES; c-- > os_class_of(need);) {
        for (uint64_t off = h->free_head[c]; off != 0 && bound > 0; bound--) {
            const os_block_t *b = os_block(s, off);
            if (b->size >= need && os_take_end(s, off, need) <= limit) return off;
            off = b->next_free;
        }
    }
    return 0;
}

/* Take the free block at `off` (found by os_alloc_find) for `need` bytes, splitting off
 * the rest when it can hold a block of its own. */
void os_alloc_take(objstore_t *s, uint64_t off, uint64_t need) {
    os_header_t *h = os_hdr(s);
    os_block_t *b = os_block(s, off);
    os_list_remove(s, off);
    if (b->size - need >= OS_MIN_BLOCK) {
        uint64_t rem = off + need, rsize = b->size - need;
        os_block_t *r = os_block(s, rem);
        os_j64(s, &r->size, rsize);
        os_j64(s, &r->prev_size, need);
        os_j64(s, &r->is_free, 1);
        os_j64(s, &r->entry, 0);
        os_j64(s, &r->magic, OS_BLOCK_MAGIC);
        os_j64(s, &r->next_free, 0);
        os_j64(s, &r->prev_free, 0);
        if (rem + rsize < os_heap_end(s)) os_j64(s, &os_block(s, rem + rsize)->prev_size, rsize);
        os_j64(s, &b->size, need);
        os_list_push(s, rem);
    }
    os_j64(s, &b->is_free, 0);
    os_j64(s, &h->in_use, h->in_use + b->size);
}

/* Free the block at `off`, merging it with free neighbours, and list it at the head. */
void os_free_block(objstore_t *s, uint64_t off) {
    os_header_t *h = os_hdr(s);
    os_block_t *b = os_block(s, off);
    uint64_t end = os_heap_end(s);
    os_j64(s, &h->in_use, h->in_use - b->size);
    os_j64(s, &b->is_free, 1);
    os_j64(s, &b->entry, 0);
    if (off > h->heap_off) {
        uint64_t poff = off - b->prev_size;
        os_block_t *p = os_block(s, poff);
        if (p->is_free) {
            os_list_remove(s, poff);
            os_j64(s, &p->size, p->size + b->size);
            os_j64(s, &b->magic, 0);
            off = poff;
            b = p;
        }
    }
    uint64_t noff = off + b->size;
    if (noff < end) {
        os_block_t *n = os_block(s, noff);
        if (n->is_free) {
            os_list_remove(s, noff);
            os_j64(s, &b->size, b->size + n->size);
            os_j64(s, &n->magic, 0);
        }
    }
    os_crash(s, OBJSTORE_CRASH_FREE_AFTER_UNLINK);
    noff = off + b->size;
    if (noff < end) os_j64(s, &os_block(s, noff)->prev_size, b->size);
    os_list_push(s, off);
}

/* One free block spanning the heap (only its header is touched: the rest may lie beyond
 * the committed mark). Runs before the region is published: no journal. */
void os_heap_init(objstore_t *s) {
    os_header_t *h = os_hdr(s);
    os_block_t *b = os_block(s, h->heap_off);
    memset(b, 0, sizeof *b);
    b->size = h->heap_size;
    b->is_free = 1;
    b->magic = OS_BLOCK_MAGIC;
    h->free_head[os_class_of(b->size)] = h->heap_off;
}

#define FAIL(...)                                         \
    do {                                                  \
        if (msg != NULL) snprintf(msg, msglen, __VA_ARGS__); \
        return 0;                                         \
    } while (0)

/* Walk the heap and the free lists; 1 if consistent, else 0 with msg. *used_blocks is
 * the number of blocks in use (to match against the index). */
int os_validate_heap(const objstore_t *s, char *msg, size_t msglen, uint64_t *used_blocks) {
    const os_header_t *h = os_hdr(s);
    const os_entry_t *E = os_entries(s);
    uint64_t end = os_heap_end(s), prev_size = 0, used = 0, used_bytes = 0, nfree = 0;
    int prev_free = 0;
    /* The region may be damaged: nothing read from it is used as an index or an offset
     * before it is checked (a block header past the committed mark may lie past the end of
     * the file, where a read is SIGBUS; os_validate_commitment checked the mark first). */
    if (h->entry_fresh > h->max_objects) FAIL("entry fresh mark past the table");
    for (uint64_t off = h->heap_off; off < end;) {
        if (off % OS_ALIGN != 0) FAIL("block %llu misaligned", (unsigned long long)off);
        if (off + OS_BLOCK_HDR > h->committed)
            FAIL("block %llu lies past the committed mark %llu", (unsigned long long)off,
                 (unsigned long long)h->committed);
        const os_block_t *b = os_block(s, off);
        if (b->magic != OS_BLOCK_MAGIC) FAIL("block %llu: bad magic", (unsigned long long)off);
        if (b->size < OS_MIN_BLOCK || b->size % OS_ALIGN != 0 || b->size > end - off)
            FAIL("block %llu: bad size %llu", (unsigned long long)off,
                 (unsigned long long)b->size);
        if (off + OS_BLOCK_HDR > h->committed || (!b->is_free && off + b->size > h->committed))
            FAIL("block %llu (size %llu) reaches past the committed mark %llu",
                 (unsigned long long)off, (unsigned long long)b->size,
                 (unsigned long long)h->committed);
        if (b->prev_size != prev_size)
            FAIL("block %llu: prev_size %llu, previous block is %llu", (unsigned long long)off,
                 (unsigned long long)b->prev_size, (unsigned long long)prev_size);
        if (b->is_free) {
            if (prev_free) FAIL("blocks before %llu and it are both free", (unsigned long long)off);
            nfree++;
        } else {
            if (b->entry >= h->entry_fresh || E[b->entry].state == OS_ENTRY_FREE ||
                E[b->entry].block != off)
                FAIL("used block %llu: entry %llu does not point back", (unsigned long long)off,
                     (unsigned long long)b->entry);
            if (os_block_need(E[b->entry].size) > b->size)
                FAIL("used block %llu smaller than its object", (unsigned long long)off);
            used++;
            used_bytes += b->size;
        }
        prev_free = (int)b->is_free;
        prev_size = b->size;
        off += b->size;
    }
    if (used_bytes != h->in_use)
        FAIL("in_use %llu, used blocks sum to %llu", (unsigned long long)h->in_use,
             (unsigned long long)used_bytes);
    uint64_t listed = 0, bound = h->heap_size / OS_MIN_BLOCK + 1;
    for (unsigned k = 0; k < OS_NCLASSES; k++) {
        uint64_t prev = 0;
        for (uint64_t off = h->free_head[k]; off != 0;) {
            if (off < h->heap_off || off >= end || off % OS_ALIGN != 0 ||
                off + OS_BLOCK_HDR > h->committed)
                FAIL("free list %u: bad offset %llu", k, (unsigned long long)off);
            const os_block_t *b = os_block(s, off);
            if (!b->is_free || b->magic != OS_BLOCK_MAGIC)
                FAIL("free list %u holds a used block %llu", k, (unsigned long long)off);
            if (os_class_of(b->size) != k)
                FAIL("block %llu of size %llu in class %u", (unsigned long long)off,
                     (unsigned long long)b->size, k);
            if (b->prev_free != prev) FAIL("free list %u: broken back link", k);
            if (++listed > bound) FAIL("free list %u: cycle", k);
            prev = off;
            off = b->next_free;
        }
    }
    if (listed != nfree)
        FAIL("%llu free blocks, %llu listed", (unsigned long long)nfree,
             (unsigned long long)listed);
    *used_blocks = used;
    return 1;
}
