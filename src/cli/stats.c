/* Placeholder: stats lands with its issue. */
#include "cli/cli.h"
#include <stdio.h>
int gr_cli_stats(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'stats' is not built yet\n");
    return 1;
}
