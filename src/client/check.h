/* Client-side checks of what a push is about to send (check.c). Kept in their own file so the
 * push paths each call one function. */
#ifndef GRANARY_CLIENT_CHECK_H
#define GRANARY_CLIENT_CHECK_H

#include "granary/client.h"

/* GR_EINVAL naming the table, key and element when any gradient of any batch is NaN or inf;
 * nothing is sent then. NULL batches or gradients are left to the caller's own checks. */
int cl_check_grads(const gr_client_batch *b, size_t nb);
/* The same for dense gradients. */
int cl_check_dense_grads(const gr_client_dense_grad *d, size_t nd);

#endif
