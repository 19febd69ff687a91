/* Placeholder: train lands with its issue. */
#include "cli/cli.h"
#include <stdio.h>
int gr_cli_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'train' is not built yet\n");
    return 1;
}
