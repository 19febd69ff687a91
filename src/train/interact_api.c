/* The interaction kernels (interact.c) behind the public API, with their scratch. */
#include "granary/train.h"
#include "train/interact.h"

#include <stdlib.h>

static int check(uint32_t d, uint32_t ns, const void *a, const void *b, const void *c)
{
    if (!a || !b || !c) return gr_seterr(GR_EINVAL, "interaction: NULL buffer");
    if (!d || !ns || ns > 1024)
        return gr_seterr(GR_EINVAL, "interaction: dim %u and %u slots (want dim >= 1 and 1 to "
                         "1024 slots)", d, ns);
    return GR_OK;
}

int gr_dlrm_interact_forward(const float *bot, const float *emb, size_t n, uint32_t d,
                             uint32_t ns, float *z)
{
    int rc = check(d, ns, bot, emb, z);
    if (rc || !n) return rc;
    uint32_t nvec = ns + 1, top_in = d + nvec * (nvec - 1) / 2;
    size_t nl = tr_interact_lanes_floats(nvec, d);
    float *vt = calloc(tr_interact_vt_floats(nvec, d), sizeof *vt);
    float *lanes = nl ? malloc(nl * sizeof *lanes) : NULL;
    if (!vt || (nl && !lanes)) {
        free(vt);
        free(lanes);
        return gr_seterr(GR_ENOMEM, "interaction: out of memory");
    }
    tr_interact_forward(z, top_in, bot, emb, n, d, ns, nvec, vt, lanes);
    free(vt);
    free(lanes);
    return GR_OK;
}

int gr_dlrm_interact_backward(const float *dz, const float *bot, const float *emb, size_t n,
                              uint32_t d, uint32_t ns, float *dbot, float *gemb)
{
    int rc = check(d, ns, dz, bot, emb);
    if (!rc && (!dbot || !gemb)) rc = gr_seterr(GR_EINVAL, "interaction: NULL buffer");
    if (rc || !n) return rc;
    uint32_t nvec = ns + 1, top_in = d + nvec * (nvec - 1) / 2;
    float *dsym = malloc(((size_t)nvec * nvec + 1) * sizeof *dsym);
    if (!dsym) return gr_seterr(GR_ENOMEM, "interaction: out of memory");
    tr_interact_backward(dz, top_in, bot, emb, n, d, ns, nvec, dbot, gemb, dsym);
    free(dsym);
    return GR_OK;
}
