/* The client refuses non-finite gradients before sending them: the shard would refuse the
 * whole request anyway (docs/protocol.md), and failing here names the caller's own array
 * index instead of a shard's view of it. */
#include "client/check.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* Index of the first non-finite value of v[0..n), or n. The exponent-bits test vectorizes;
 * the exact position is searched for only after a hit. */
static size_t first_nonfinite(const float *v, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], sizeof b);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) return n;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return n;
}

int cl_check_grads(const gr_client_batch *b, size_t nb)
{
    for (size_t t = 0; b && t < nb; t++) {
        if (!b[t].grads || !b[t].keys || !b[t].dim) continue;
        size_t total = b[t].n * b[t].dim, i = first_nonfinite(b[t].grads, total);
        if (i < total)
            return gr_seterr(GR_EINVAL,
                             "gradient for table %u, key %" PRIu64 " (row %zu, element %zu) is "
                             "not finite (%g); nothing was sent",
                             b[t].table, b[t].keys[i / b[t].dim], i / b[t].dim, i % b[t].dim,
                             (double)b[t].grads[i]);
    }
    return GR_OK;
}

int cl_check_dense_grads(const gr_client_dense_grad *d, size_t nd)
{
    for (size_t k = 0; d && k < nd; k++) {
        if (!d[k].grad) continue;
        size_t i = first_nonfinite(d[k].grad, d[k].n);
        if (i < d[k].n)
            return gr_seterr(GR_EINVAL,
                             "dense gradient '%s' element %zu is not finite (%g); nothing was sent",
                             d[k].name ? d[k].name : "?", i, (double)d[k].grad[i]);
    }
    return GR_OK;
}
