/* Job arguments checked against the command's own option table: the same parser, ranges and
 * words as on the command line, so a spec the controller accepts is one the command accepts. */
#include "cli/job_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const gr_cli_spec *spec_of(const char *kind)
{
    if (!strcmp(kind, "train")) return gr_cli_train_spec();
    if (!strcmp(kind, "serve") && gr_cli_serve_spec) return gr_cli_serve_spec();
    return NULL;
}

int gr_cli_job_check_args(const char *kind, int argc, char **argv, char *err, size_t errcap)
{
    const gr_cli_spec *spec = spec_of(kind);
    if (!spec) {
        snprintf(err, errcap, "this granary cannot run %s jobs", kind);
        return -1;
    }
    gr_cli_value *v = calloc(spec->n_opts + 1, sizeof *v);
    if (!v) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    gr_cli_parsed p;
    FILE *sink = fopen("/dev/null", "w");
    int rc = gr_cli_parse(spec, argc, argv, v, &p, sink ? sink : stderr);
    if (sink) fclose(sink);
    if (rc == GR_CLI_BAD) snprintf(err, errcap, "%s", p.err);
    else if (rc == GR_CLI_HELP) snprintf(err, errcap, "--help is not a job");
    gr_cli_parsed_fini(&p);
    free(v);
    return rc == GR_CLI_OK ? 0 : -1;
}

/* Options whose value is a file or a directory say so in their placeholder. */
static bool path_metavar(const char *m)
{
    static const char *const words[] = {"FILE", "DIR", "F", "PATH", "ROOT", NULL};
    for (const char *const *w = words; m && *w; w++)
        if (!strcmp(m, *w)) return true;
    return false;
}

gr_job_flag_kind gr_cli_job_flag_info(const char *kind, const char *flag)
{
    const gr_cli_spec *spec = spec_of(kind);
    if (!spec) return GR_JOB_FLAG_UNKNOWN;
    if (!strcmp(flag, "config")) return GR_JOB_FLAG_PATH;
    if (!strcmp(flag, "help")) return GR_JOB_FLAG_SWITCH;
    for (size_t i = 0; i < spec->n_opts; i++) {
        const gr_cli_opt *o = &spec->opts[i];
        if (strcmp(o->name, flag)) continue;
        if (o->type == GR_CLI_FLAG) return GR_JOB_FLAG_SWITCH;
        return o->type == GR_CLI_STR && path_metavar(o->metavar) ? GR_JOB_FLAG_PATH
                                                                 : GR_JOB_FLAG_VALUE;
    }
    return GR_JOB_FLAG_UNKNOWN;
}
