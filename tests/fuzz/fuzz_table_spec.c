/* libFuzzer target for the table spec parser (JSON config): whatever parses must validate,
 * serialise, and parse back to an equal spec. */
#include "granary/table.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    gr_table_spec *specs = NULL;
    size_t n = 0;
    if (gr_table_specs_from_json(s, &specs, &n) == GR_OK) {
        for (size_t i = 0; i < n; i++) {
            if (gr_table_spec_validate(&specs[i]) != GR_OK) abort();
            char *js = gr_table_spec_to_json(&specs[i]);
            if (!js) abort();
            gr_table_spec back;
            if (gr_table_spec_from_json(js, &back) != GR_OK) abort();
            if (!gr_table_spec_equal(&specs[i], &back)) abort();
            free(js);
        }
        free(specs);
    }
    gr_table_spec one;
    gr_table_spec_from_json(s, &one);
    free(s);
    return 0;
}
