/* interact.c: DLRM's pairwise dot interaction over a batch, forward and backward (model.c). */
#ifndef GRANARY_TRAIN_INTERACT_H
#define GRANARY_TRAIN_INTERACT_H

#include <stddef.h>
#include <stdint.h>

/* The scratch tr_interact_forward needs for nvec vectors of d floats: tr_interact_vt_floats
 * zeroed floats (calloc: lanes it never writes must read 0) and tr_interact_lanes_floats
 * others (0: the shape takes the one-example path only). */
size_t tr_interact_vt_floats(uint32_t nvec, uint32_t d);
size_t tr_interact_lanes_floats(uint32_t nvec, uint32_t d);

/* z (n x top_in) = [bot, <va, vb> for a > b, a-major] per example, vector 0 the example's
 * bottom output (bot, n x d), vector v > 0 its slot v - 1's row (emb, n x ns x d). Every dot is
 * 0 + va[0] vb[0] + ... + va[d-1] vb[d-1], added in that order, whichever path computes it.
 * vt and lanes: the scratch above (lanes NULL: one example at a time). */
void tr_interact_forward(float *zs, uint32_t top_in, const float *bot, const float *emb,
                         size_t n, uint32_t d, uint32_t ns, uint32_t nvec, float *vt,
                         float *lanes);

/* Its backward: the gradient of every slot's row (gemb, n x ns x d) and of the bottom output
 * (dbot, n x d) from dz (n x top_in); dsym holds nvec * nvec + 1 floats of scratch. */
void tr_interact_backward(const float *dzs, uint32_t top_in, const float *bot, const float *emb,
                          size_t n, uint32_t d, uint32_t ns, uint32_t nvec, float *dbots,
                          float *gemb, float *dsym);

#endif
