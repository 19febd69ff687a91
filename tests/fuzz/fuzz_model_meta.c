/* libFuzzer target for the saved-model metadata reader (a checkpoint's user.json, whose
 * "model" member gr_saved_model_open rebuilds the model from). Whatever parses must name a
 * model that gr_model_create accepts, with sizes within the documented limits. */
#include "granary/train.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gr_saved_model_info info;
    memset(&info, 0, sizeof info);
    if (gr_saved_model_parse_meta((const char *)data, size, "fuzz", &info) != GR_OK) return 0;
    if (info.model.n_bottom > GR_MODEL_MAX_LAYERS || info.model.n_top > GR_MODEL_MAX_LAYERS)
        abort();
    if (info.model.dim > GR_TABLE_DIM_MAX || !info.dense_name[0] || !info.table[0]) abort();
    if (info.batch > (1u << 20) || info.workers > 256) abort();
    gr_model *m = NULL;
    if (gr_model_create(&info.model, &m) == GR_OK) {
        if (!m || gr_model_dense_size(m) == 0) abort();
        gr_model_destroy(m);
    }
    return 0;
}
