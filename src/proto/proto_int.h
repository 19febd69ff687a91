/* Internal to the proto part: little-endian reads from unaligned bytes and the 8-byte padding
 * rule shared by the codec files. */
#ifndef GRANARY_PROTO_INT_H
#define GRANARY_PROTO_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

#endif
