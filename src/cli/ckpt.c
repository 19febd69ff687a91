/* Placeholder: ckpt lands with its issue. */
#include "cli/cli.h"
#include <stdio.h>
int gr_cli_ckpt(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'ckpt' is not built yet\n");
    return 1;
}
