/* libFuzzer target for the checkpoint manifest parser. Whatever parses must serialise and
 * parse again to the same JSON (the manifest is written by gr_ckpt_manifest_to_json). */
#include "granary/ckpt.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gr_ckpt_manifest *m = NULL;
    if (gr_ckpt_manifest_parse((const char *)data, size, &m) != GR_OK) {
        if (m) abort(); /* nothing is returned on failure */
        return 0;
    }
    char *j1 = gr_ckpt_manifest_to_json(m);
    if (!j1) abort();
    gr_ckpt_manifest *m2 = NULL;
    if (gr_ckpt_manifest_parse(j1, strlen(j1), &m2) != GR_OK) abort();
    char *j2 = gr_ckpt_manifest_to_json(m2);
    if (!j2 || strcmp(j1, j2) != 0) abort();
    free(j1);
    free(j2);
    gr_ckpt_manifest_destroy(m);
    gr_ckpt_manifest_destroy(m2);
    return 0;
}
