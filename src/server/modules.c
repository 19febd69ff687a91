/* The modules that plug into the shard's life cycle (server_int.h, srv_module), in start
 * order; they are stopped and destroyed in reverse. A new background part is one entry here. */
#include "server/server_int.h"

const srv_module *const srv_modules[] = {&srv_sync_module, &srv_ckpt_module, &srv_publish_module,
                                          &srv_grow_module};
const size_t srv_nmodules = sizeof srv_modules / sizeof srv_modules[0];
