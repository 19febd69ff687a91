/* Error classes and the thread-local detail message behind gr_errmsg(). */
#include "granary/core.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_detail[512];

const char *gr_strerror(int err)
{
    switch (err) {
#define GR_ERR_CASE(name, value, text) \
    case value: return text;
        GR_ERRORS(GR_ERR_CASE)
#undef GR_ERR_CASE
    default: return "unknown error";
    }
}

const char *gr_errmsg(void) { return err_detail; }

void gr_clearerr(void) { err_detail[0] = '\0'; }

int gr_seterr(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_detail, sizeof err_detail, fmt, ap);
    va_end(ap);
    return err;
}
