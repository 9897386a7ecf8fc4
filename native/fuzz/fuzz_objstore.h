/*
 * fuzz_objstore.h -- what the two files of the object store's fuzz harness share
 * (fuzz_objstore.c: the driver, the model and the API operations; fuzz_damage.c: the NumPy
 * handler's allocations and the operations that damage the region).
 */
#ifndef FUZZ_OBJSTORE_H
#define FUZZ_OBJSTORE_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "os_internal.h"

#define NH 3   /* handles: 0 is the creator and stays open */
#define NIDS 8 /* ids the model tracks */
#define NNP 8  /* NumPy-handler arrays the model tracks */

typedef struct {
    const uint8_t *p;
    size_t n;
} in_t;

static inline uint8_t u8(in_t *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}
static inline uint16_t u16(in_t *in) { return (uint16_t)(u8(in) | (u8(in) << 8)); }
static inline uint32_t u32(in_t *in) { return (uint32_t)u16(in) | ((uint32_t)u16(in) << 16); }
static inline uint64_t u64(in_t *in) { return (uint64_t)u32(in) | ((uint64_t)u32(in) << 32); }

typedef struct {
    int live, sealed, pending, creator;
    uint64_t size, off; /* data offset from a mapping's base */
    uint8_t seed;
    uint32_t refs[NH];
} obj_t;

/* An array allocated through the NumPy handler (os_numpy.c) of handle 0: in the store (an
 * unsealed object of handle 0 with an id of the handler's) or from the fallback. */
typedef struct {
    char *p;
    uint64_t size;
    int in_store;
    uint8_t seed;
} np_t;

/* NumPy's PyDataMem_Handler, version 1 (the layout os_numpy.c declares) */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} np_allocator_t;
typedef struct {
    char name[127];
    uint8_t version;
    np_allocator_t allocator;
} np_handler_t;

typedef struct {
    objstore_t *h[NH];
    np_handler_t *np; /* objstore_np_handler of handle 0, made on first use */
    np_t arrays[NNP];
    char name[128];
    obj_t o[NIDS];
    uint64_t capacity, max_objects;
    uint32_t max_processes;
    int lenient;      /* the region was damaged and validate accepted it: no model checks */
    int limited;      /* handle 0 has a commit limit: FULL may come from "the filesystem" */
    char *snap;       /* the committed bytes before a damage, restored if validate refuses */
    uint64_t snap_len;
    uint8_t next_seed;
} fuzz_state_t;

extern fuzz_state_t F; /* the state of the input being run */

#define FAILF(...)                                                 \
    do {                                                           \
        fprintf(stderr, "fuzz_objstore: invariant broken at %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                              \
        fprintf(stderr, "\n");                                     \
        abort();                                                   \
    } while (0)
#define CHECK(c, ...)                     \
    do {                                  \
        if (!F.lenient && !(c)) FAILF(__VA_ARGS__); \
    } while (0)
#define ST(st) objstore_status_name(st)

static inline uint8_t pattern(uint8_t seed, uint64_t i) { return (uint8_t)(seed + i * 31u + (i >> 9)); }

static inline void fill(char *p, uint64_t size, uint8_t seed) {
    for (uint64_t i = 0; i < size; i++) p[i] = (char)pattern(seed, i);
}

/* Whether the bytes match (all of them up to 64 KiB, else both ends and a stride). */
static inline int same(const char *p, uint64_t size, uint8_t seed) {
    for (uint64_t i = 0; i < size;) {
        if ((uint8_t)p[i] != pattern(seed, i)) return 0;
        i += (size <= 65536 || i < 4096 || size - i <= 4096) ? 1 : 509;
    }
    return 1;
}

static inline char *base(int h) {
    const void *b;
    objstore_mapping(F.h[h], &b, NULL);
    return (char *)b;
}

/* fuzz_objstore.c */
uint64_t draw_size(in_t *in);

/* fuzz_damage.c */
void op_numpy(in_t *in);
void snapshot(void);
void damage(in_t *in);
int after_damage(void);
void op_journal(in_t *in);
void op_header(in_t *in);

#endif /* FUZZ_OBJSTORE_H */
