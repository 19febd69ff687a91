/* Hashing and checksums over libxxhash (XXH3). The key hash and the slot function are part of
 * the wire and checkpoint contract: changing them moves every row to another shard. */
#include "granary/core.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t gr_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t gr_hash_key(uint64_t key, uint64_t seed)
{
    return XXH3_64bits_withSeed(&key, sizeof key, seed);
}

uint64_t gr_checksum(const void *data, size_t len) { return XXH3_64bits(data, len); }

uint64_t gr_random_id(void)
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&v, sizeof v, 1, f) != 1) v = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v ^= gr_hash_key((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                     (uint64_t)getpid());
    return v ? v : 1;
}
