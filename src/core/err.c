/* Error classes and the thread-local detail message behind gr_errmsg(). */
#include "granary/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
    /* Formatted aside first: callers often wrap the current message ("cannot read X: %s",
     * gr_errmsg()), and formatting straight into err_detail would read it while overwriting it
     * (seen as "cannot read the auth file: cannot read the auth file: uch file or directory"). */
    char buf[sizeof err_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(err_detail, buf, sizeof err_detail);
    return err;
}
