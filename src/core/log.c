/* Logging to stderr: one line per call, timestamped, level from GRANARY_LOG. */
#include "granary/core.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static atomic_int log_level = -1;

/* The level GRANARY_LOG names; *bad when it names none (then info). */
static gr_log_level level_from_env(bool *bad)
{
    const char *e = getenv("GRANARY_LOG");
    *bad = false;
    if (!e || !*e) return GR_LOG_INFO;
    if (!strcasecmp(e, "error")) return GR_LOG_ERROR;
    if (!strcasecmp(e, "warn") || !strcasecmp(e, "warning")) return GR_LOG_WARN;
    if (!strcasecmp(e, "info")) return GR_LOG_INFO;
    if (!strcasecmp(e, "debug")) return GR_LOG_DEBUG;
    *bad = true;
    return GR_LOG_INFO;
}

void gr_log_set_level(gr_log_level level) { atomic_store(&log_level, (int)level); }

gr_log_level gr_log_get_level(void)
{
    int l = atomic_load(&log_level);
    if (l < 0) {
        bool bad;
        int want = (int)level_from_env(&bad);
        int unset = -1;
        /* The thread that sets it says once that the variable was not understood: a typo
         * must not silently change nothing. */
        if (atomic_compare_exchange_strong(&log_level, &unset, want) && bad)
            fprintf(stderr, "granary: GRANARY_LOG=%s is not one of error, warn, info, debug; "
                            "logging at info\n", getenv("GRANARY_LOG"));
        l = atomic_load(&log_level);
    }
    return (gr_log_level)l;
}

void gr_log(gr_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"E", "W", "I", "D"};
    if (level > gr_log_get_level()) return;
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %s ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
