/* Response helpers: formatted bodies and JSON error objects. */
#include "granary/http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_type(gr_http_response *resp, const char *content_type)
{
    if (!content_type) return;
    size_t n = strnlen(content_type, sizeof resp->content_type - 1);
    memcpy(resp->content_type, content_type, n); /* cut as snprintf cut it */
    resp->content_type[n] = '\0';
}

void gr_http_take(gr_http_response *resp, int status, const char *content_type, char *body,
                  size_t len)
{
    free(resp->body);
    resp->status = status;
    set_type(resp, content_type);
    resp->body = body;
    resp->body_len = body ? len : 0;
}

static char *vformat(const char *fmt, va_list ap, size_t *len)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    *len = (size_t)n;
    return s;
}

void gr_http_printf(gr_http_response *resp, int status, const char *content_type,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t len = 0;
    char *s = vformat(fmt, ap, &len);
    va_end(ap);
    gr_http_take(resp, s ? status : 500, content_type, s, len);
}

/* JSON string escaping of a message: quotes, backslashes and control characters. */
static char *json_escape(const char *msg)
{
    size_t n = strlen(msg);
    char *out = malloc(n * 6 + 1);
    if (!out) return NULL;
    char *o = out;
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p == '"' || *p == '\\') {
            *o++ = '\\';
            *o++ = (char)*p;
        } else if (*p < 0x20) {
            o += sprintf(o, "\\u%04x", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o = '\0';
    return out;
}

void gr_http_error(gr_http_response *resp, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t len = 0;
    char *msg = vformat(fmt, ap, &len);
    va_end(ap);
    char *esc = msg ? json_escape(msg) : NULL;
    free(msg);
    if (!esc) {
        gr_http_take(resp, status, "application/json", NULL, 0);
        return;
    }
    gr_http_printf(resp, status, "application/json", "{\"error\":\"%s\"}\n", esc);
    free(esc);
}
