/* Internal to the cli part: what the controller needs to know of the commands' options to
 * check a job's arguments (the option tables live in the cli part). */
#ifndef GRANARY_CLI_JOB_ARGS_H
#define GRANARY_CLI_JOB_ARGS_H

#include <stddef.h>

#include "cli/opts.h"
#include "granary/platform.h"

/* The option tables of the commands a job may run. */
const gr_cli_spec *gr_cli_train_spec(void);
/* Defined by `granary serve` where that command is built in; weak here. */
const gr_cli_spec *gr_cli_serve_spec(void) __attribute__((weak));

int gr_cli_job_check_args(const char *kind, int argc, char **argv, char *err, size_t errcap);
gr_job_flag_kind gr_cli_job_flag_info(const char *kind, const char *flag);

#endif
