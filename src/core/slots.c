/* The slot of a key (part of the wire and checkpoint contract, like gr_hash_key: changing it
 * moves every row to another shard), one key at a time or a whole array. XXH3 is compiled in
 * here (XXH_INLINE_ALL: the same function, so the same values as libxxhash's), so the array
 * version hashes each key without a library call: the client routes every unique key of a
 * batch and a shard checks the routing of every key it is sent. */
#include "granary/core.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Seed chosen once; never change it. */
#define SLOT_SEED 0x736c6f74u

static inline uint32_t slot_of(uint64_t key)
{
    return (uint32_t)(XXH3_64bits_withSeed(&key, sizeof key, SLOT_SEED) & (GR_SLOTS - 1));
}

uint32_t gr_slot_of(uint64_t key) { return slot_of(key); }

void gr_slots_of(const uint64_t *keys, size_t n, uint32_t *slots)
{
    for (size_t i = 0; i < n; i++) slots[i] = slot_of(keys[i]);
}
