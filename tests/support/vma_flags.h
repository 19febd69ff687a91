/* Test support: what the kernel says of the mapping that holds an address (/proc/self/smaps). */
#ifndef GRANARY_TEST_VMA_FLAGS_H
#define GRANARY_TEST_VMA_FLAGS_H

#include <stdbool.h>

/* Whether the VmFlags of the mapping holding p include `flag` ("hg": advised for huge pages,
 * "nh": advised against them). *found is false (and the result false) when no mapping holds p
 * or smaps cannot be read. */
bool vma_has_flag(const void *p, const char *flag, bool *found);

#endif
