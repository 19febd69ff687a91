/* Formats shared by the wire, the checkpoint files and the tables: half floats, the default
 * slot -> shard map and the sync-mode names. Each exists here once; changing any of them
 * changes bytes on the wire or on disk. */
#include "granary/core.h"

#include <string.h>

/* Half floats: bit manipulation with round-to-nearest-even, so that every half value survives
 * f16 -> f32 -> f16 exactly (f16 tables and f16 checkpoint exports rely on it for bitwise round
 * trips). Checked equal, bit for bit over all 2^32 inputs, to the two copies it replaced. */
uint16_t gr_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, or NaN kept quiet with its top payload bits */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                    /* below 2^-14: subnormal half */
        if (ax < 0x33000000u) return sign;                     /* <= 2^-25 rounds to zero */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias the exponent from 127 to 15 */
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* may carry into the exponent */
    return (uint16_t)(sign | q);
}

float gr_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint32_t gr_slot_shard(uint32_t slot, uint32_t shards)
{
    return (uint32_t)(((uint64_t)slot * shards) / GR_SLOTS);
}

static const char *const sync_mode_names[] = {"async", "sync", "semisync", "ssp"};

const char *gr_sync_mode_name(uint32_t mode)
{
    return mode <= GR_SYNC_SSP ? sync_mode_names[mode] : "unknown";
}

int gr_sync_mode_parse(const char *s, gr_sync_mode *out)
{
    for (uint32_t m = GR_SYNC_ASYNC; m <= GR_SYNC_SSP; m++)
        if (s && !strcmp(s, sync_mode_names[m])) {
            *out = (gr_sync_mode)m;
            return GR_OK;
        }
    return gr_seterr(GR_EINVAL, "unknown mode '%s' (async, sync, semisync, ssp)", s ? s : "");
}
