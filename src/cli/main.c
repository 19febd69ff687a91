/* The single `granary` program: git-style subcommands. Each subcommand lives in its own file
 * and is listed once in the table below. */
#include "cli/cli.h"
#include "granary/train.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("granary %s\n", GR_VERSION_STRING);
    return 0;
}

static int cmd_help(int argc, char **argv);

static const gr_cli_command commands[] = {
#define GR_CLI_ENTRY(name, fn, summary) {name, fn, summary},
    GR_CLI_COMMANDS(GR_CLI_ENTRY)
#undef GR_CLI_ENTRY
    {"version", cmd_version, "print the version"},
    {"help", cmd_help, "list the subcommands"},
};

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("usage: granary <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        printf("  %-10s %s\n", commands[i].name, commands[i].summary);
    printf("\n`granary <command> --help` describes a command's options.\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        cmd_help(argc, argv);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc, argv);
    /* Every command talks over sockets or pipes (shards, replicas, metrics scrapes, a
     * supervisor's log pipe): a peer that hangs up must give EPIPE to the write, never kill
     * the process (a trainer killed so loses its final checkpoint). */
    signal(SIGPIPE, SIG_IGN);
    /* OpenBLAS's pool spins for 0.1 s of a core after the library loads: stop it before any
     * command's work starts. */
    gr_blas_one_thread();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "granary: unknown command '%s' (see granary --help)\n", argv[1]);
    return 2;
}
