/*
 * The commitlog record's layout (FORMATS 1.1), shared by tierd's C modules: the decoder
 * (tierd/format/_batchdecode.c) and the put_batch encoder (tierd/local/_batchencode.c).
 * Python's view of the same layout is tierd/format/record.py.
 *
 * Written for tierd from the record layout; no code of other projects.
 */
#ifndef TIERD_RECORD_LAYOUT_H
#define TIERD_RECORD_LAYOUT_H

#include <stdint.h>

/* Byte positions in a record with IPv4 hosts (both SYSFLAG host bits clear). */
enum {
    POS_TOTAL = 0,
    POS_MAGIC = 4,
    POS_BODY_CRC = 8,
    POS_QUEUE_ID = 12,
    POS_FLAG = 16,
    POS_QUEUE_OFFSET = 20,
    POS_PHYSICAL_OFFSET = 28,
    POS_SYSFLAG = 36,
    POS_BORN_TIMESTAMP = 40,
    POS_BORN_HOST = 48,
    POS_STORE_TIMESTAMP = 56,
    POS_STORE_HOST = 64,
    POS_RECONSUME_TIMES = 72,
    POS_PREPARED_OFFSET = 76,
    POS_BODY_LENGTH = 84,
    HEADER_V4 = 88,
};

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define SYSFLAG_HOSTS_V6 0x30 /* BORNHOST_V6 | STOREHOST_V6 */

/* Big-endian fields, read and written byte by byte: the same on any host. */
static inline uint32_t be_u32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline int32_t be_i32(const uint8_t *p) { return (int32_t)be_u32(p); }

static inline uint64_t be_u64(const uint8_t *p) {
    return ((uint64_t)be_u32(p) << 32) | be_u32(p + 4);
}

static inline int64_t be_i64(const uint8_t *p) { return (int64_t)be_u64(p); }

static inline void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void put_u64(uint8_t *p, uint64_t v) {
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

#endif
