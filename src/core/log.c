/* Logging to stderr: one line per call, timestamped, level from GRANARY_LOG. */
#include "granary/core.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int log_level = -1;

static gr_log_level level_from_env(void)
{
    const char *e = getenv("GRANARY_LOG");
    if (!e) return GR_LOG_INFO;
    if (!strcmp(e, "error")) return GR_LOG_ERROR;
    if (!strcmp(e, "warn")) return GR_LOG_WARN;
    if (!strcmp(e, "debug")) return GR_LOG_DEBUG;
    return GR_LOG_INFO;
}

void gr_log_set_level(gr_log_level level) { atomic_store(&log_level, (int)level); }

gr_log_level gr_log_get_level(void)
{
    int l = atomic_load(&log_level);
    if (l < 0) {
        l = (int)level_from_env();
        atomic_store(&log_level, l);
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
