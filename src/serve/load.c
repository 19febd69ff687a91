/* Bootstrap of a replica from a saved model (a checkpoint root, one checkpoint or an export):
 * the model kind and shapes, the dense parameters and the embedding rows, through the train
 * part's saved-model loader, so a replica reads a model exactly as evaluation does. */
#include "serve/serve_int.h"

int sv_load_model_dir(gr_serve *s, const char *dir)
{
    (void)s;
    return gr_seterr(GR_EINVAL, "cannot load '%s': this build has no saved-model loader yet", dir);
}
