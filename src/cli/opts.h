/* Internal to the cli part: command-line options declared once. A command lists its options
 * in one table (name, type, range, help, JSON key); from it come the argv parser, the range
 * checks, `--help`, and the keys a `--config FILE` JSON object may hold (flags win over the
 * file). Nothing here converts a number without checking all of it and its range.
 *
 * Declare a command's options with an X-macro so the enum of indexes and the table cannot
 * drift apart:
 *
 *   #define SERVER_OPTIONS(X)                                                             \
 *       X(SO_LISTEN, "listen", GR_CLI_STR, "listen", 0, 0, NULL, "HOST:PORT", NULL,        \
 *         "address to serve")                                                             \
 *       X(SO_SHARDS, "shards", GR_CLI_INT, "shards", 1, 16384, NULL, "N", "1", "shards")
 *   enum { SERVER_OPTIONS(GR_CLI_ENUM) SO_COUNT };
 *   static const gr_cli_opt server_opts[] = {SERVER_OPTIONS(GR_CLI_ROW)};
 *
 * then gr_cli_parse() fills one gr_cli_value per option, read as v[SO_SHARDS].i. */
#ifndef GRANARY_CLI_OPTS_H
#define GRANARY_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct cJSON cJSON;

typedef enum gr_cli_type {
    GR_CLI_FLAG,   /* no value on the command line (--insecure); a JSON bool in a config */
    GR_CLI_STR,    /* any text (a path, an address); a JSON string */
    GR_CLI_INT,    /* a whole decimal number in [lo, hi] (lo, hi exact below 2^53) */
    GR_CLI_NUM,    /* a finite real number in [lo, hi] */
    GR_CLI_SIZE,   /* a byte count: 64, 4k, 10M, 2G, 1T (powers of 1024) in [lo, hi]; a JSON
                      number or string */
    GR_CLI_CHOICE, /* one word of `choices` ("lr|dlrm"); .i is its index */
} gr_cli_type;

typedef struct gr_cli_opt {
    int id;               /* its index in the table (the enum the X-macro made) */
    const char *name;     /* the flag without "--": "max-body" */
    gr_cli_type type;
    const char *json_key; /* key in the --config object; NULL: command line only */
    double lo, hi;        /* the range of INT, NUM and SIZE (inclusive) */
    const char *choices;  /* CHOICE: the words, '|' between them */
    const char *metavar;  /* the value's placeholder in --help ("HOST:PORT"); NULL: from type */
    const char *def;      /* default as it would be typed, parsed like a flag; NULL: none */
    const char *help;     /* one sentence; '\n' continues on the next --help line */
} gr_cli_opt;

#define GR_CLI_ENUM(id, name, type, key, lo, hi, choices, metavar, def, help) id,
#define GR_CLI_ROW(id, name, type, key, lo, hi, choices, metavar, def, help)                   \
    {id, name, type, key, lo, hi, choices, metavar, def, help},

/* One option's value after parsing. `given` says the command line or the config file set it
 * (a default leaves it false); the field that holds the value follows the type: FLAG .b, STR
 * .s, INT .i, NUM .d, SIZE .u, CHOICE .i (and .s, the word). */
typedef struct gr_cli_value {
    bool given;
    bool b;
    const char *s;
    int64_t i;
    double d;
    uint64_t u;
} gr_cli_value;

typedef struct gr_cli_spec {
    const char *command;  /* "server": error messages start "granary server: " */
    const char *synopsis; /* the usage line(s) --help prints first, without "usage: " */
    const gr_cli_opt *opts;
    size_t n_opts;
    /* Where --config keys live: NULL means the command takes no --config; "" means the file's
     * top-level object; a name means that member of it ("server" in {"server": {...}}), and
     * the other top-level members are the command's own business (tables, dense). */
    const char *config_section;
    unsigned max_args;    /* positional arguments accepted (ckpt's DIR); more is an error */
    const char *epilog;   /* printed after the options by --help; NULL: nothing */
} gr_cli_spec;

/* What gr_cli_parse found besides the option values. */
typedef struct gr_cli_parsed {
    const char *args[8];  /* positional arguments, in order (at most spec->max_args) */
    unsigned n_args;
    const char *config_path; /* --config FILE, or NULL */
    char *config_text;       /* the file's text, owned (some commands parse more of it) */
    cJSON *config;           /* the whole parsed file, owned */
    char err[512];           /* what was wrong, when gr_cli_parse returns GR_CLI_BAD */
} gr_cli_parsed;

enum {
    GR_CLI_OK = 0,    /* run the command */
    GR_CLI_HELP = 1,  /* --help was printed to stdout: exit 0 */
    GR_CLI_BAD = -1,  /* p->err says what was wrong: exit 2 */
};

/* Parses argv[1..argc) (argv[0] is the command's name) into vals[n_opts]: defaults first,
 * then the config file's keys, then the flags, so flags win. `--name VALUE` and
 * `--name=VALUE` both work; the last of a repeated flag wins; `--help`/`-h` prints the help
 * to `out` and returns GR_CLI_HELP. Returns GR_CLI_BAD with p->err naming the flag or key and
 * what it wanted for an unknown flag, a missing value, a malformed or out-of-range number, an
 * unknown word, an unknown or mistyped config key, an unreadable config file, or too many
 * positional arguments. Call gr_cli_parsed_fini afterwards in every case. */
int gr_cli_parse(const gr_cli_spec *spec, int argc, char **argv, gr_cli_value *vals,
                 gr_cli_parsed *p, FILE *out);
void gr_cli_parsed_fini(gr_cli_parsed *p);

/* The whole flow for a command's main: parse, print p->err as "granary CMD: ERR (see granary
 * CMD --help)" on stderr. Returns -1 to continue (options parsed), or the exit status to
 * return now (0 after --help, 2 after an error). */
int gr_cli_parse_or_exit(const gr_cli_spec *spec, int argc, char **argv, gr_cli_value *vals,
                         gr_cli_parsed *p);

/* Writes the usage line and one entry per option (flag, value placeholder, help, default,
 * range or words, config key). */
void gr_cli_help(const gr_cli_spec *spec, FILE *out);
/* The same without the usage line, for a command that writes its own (ckpt's subcommands). */
void gr_cli_help_options(const gr_cli_spec *spec, FILE *out);

/* Checks one text value against an option and stores it (what the parser does per flag);
 * exposed for tests and for commands with a value that arrives another way. */
int gr_cli_set_text(const gr_cli_opt *opt, const char *text, gr_cli_value *v, char *err,
                    size_t errcap);

#endif
