/* Placeholder: datagen lands with its issue. */
#include "cli/cli.h"
#include <stdio.h>
int gr_cli_datagen(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'datagen' is not built yet\n");
    return 1;
}
