/* Internal to the cli part: what `granary ckpt inspect` and `ckpt list` show beyond the
 * manifest (ckpt_show.c): the dense parameters, the trainer's position and settings, the
 * model, and the checkpoints of a root. */
#ifndef GRANARY_CLI_CKPT_SHOW_H
#define GRANARY_CLI_CKPT_SHOW_H

#include <stdbool.h>

typedef struct cJSON cJSON;

/* Adds "dense", "trainer" and "model" to o (JSON), or prints them (o NULL). 0 or a gr_err
 * (a dense part that cannot be read). */
int ckpt_show_model(const char *dir, cJSON *o);
/* `granary ckpt list ROOT [--json]`: the exit status. */
int ckpt_list(const char *root, bool json);

#endif
