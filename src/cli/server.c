/* Placeholder: server lands with its issue. */
#include "cli/cli.h"
#include <stdio.h>
int gr_cli_server(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'server' is not built yet\n");
    return 1;
}
