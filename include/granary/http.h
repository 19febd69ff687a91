/* granary http: the one HTTP server (Debian's libmicrohttpd) and a small blocking client that
 * every part with an HTTP face shares: /metrics and /healthz of servers and trainers, the
 * serving replica's /v1 API and the controller's REST API and dashboard.
 *
 * The server hands each complete request (method, path, query, headers, whole body) to one
 * handler callback, which fills a response; bodies over max_body are refused with 413 before
 * the handler runs. The handler runs on one of the server's threads and may be called
 * concurrently from several when threads > 1. */
#ifndef GRANARY_HTTP_H
#define GRANARY_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "granary/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_http_server gr_http_server;

typedef struct gr_http_request {
    const char *method;   /* "GET", "POST", "DELETE", ... */
    const char *path;     /* the URL path without the query, e.g. "/v1/jobs/3" */
    const char *body;     /* NUL-terminated copy of the body ("" when none) */
    size_t body_len;
    void *internal;       /* for gr_http_header / gr_http_query */
} gr_http_request;

typedef struct gr_http_response {
    int status;               /* default 200 */
    char content_type[64];    /* default "application/json" */
    char *body;               /* malloc'd; the server frees it. NULL = empty body */
    size_t body_len;
    char extra_header[2][256]; /* optional "Name: value" lines, e.g. WWW-Authenticate */
} gr_http_response;

typedef void (*gr_http_handler)(void *ctx, const gr_http_request *req, gr_http_response *resp);

/* Coalescing (optional): requests cheaper to answer together than one by one (a serving
 * replica's one-example predicts share one pass over the model's weights). When `park` is
 * set, every complete request is offered to it first, on the handler thread that read it:
 *   GR_HTTP_DECLINED   the request goes to `handler` as usual;
 *   GR_HTTP_ANSWERED   park filled resp itself (an error found while reading it, say);
 *   GR_HTTP_PARKED     park made a job (*job) and the response waits.
 * After that thread has read every request that was ready (its event loop's next pass, so a
 * job waits microseconds, not for more traffic), it calls `run` once with all the jobs it
 * parked meanwhile (at most max_parked: a full thread runs them at once), then `reply` for
 * each, which fills that request's
 * response and frees the job. A job whose connection closed before its reply goes to `reply`
 * with resp NULL: free it. park, run and reply run on handler threads, concurrently on
 * several when threads > 1 (each thread runs only the jobs it parked). */
enum { GR_HTTP_DECLINED = 0, GR_HTTP_ANSWERED = 1, GR_HTTP_PARKED = 2 };
typedef int (*gr_http_park_fn)(void *ctx, const gr_http_request *req, gr_http_response *resp,
                               void **job);
typedef void (*gr_http_run_fn)(void *ctx, void **jobs, size_t n);
typedef void (*gr_http_reply_fn)(void *ctx, void *job, gr_http_response *resp);

typedef struct gr_http_config {
    const char *listen;     /* "HOST:PORT"; port 0 picks a free one (see gr_http_port) */
    unsigned threads;       /* handler threads; 0 = 1 */
    size_t max_body;        /* bytes; 0 = 1 MiB. Larger bodies get 413 */
    unsigned timeout_s;     /* idle connection timeout; 0 = 30 */
    unsigned slice_us;      /* time slice handler threads ask for (gr_thread_set_slice_us);
                               0 = the kernel's default */
    size_t conn_memory;     /* bytes of libmicrohttpd's memory pool per connection: the
                               request line and headers must fit (larger ones get 431); it is
                               zeroed after every request on a kept-alive connection. 0 = its
                               default, 32 KiB; at least 4 KiB */
    gr_http_handler handler;
    void *ctx;
    gr_http_park_fn park;   /* optional coalescing, above: park, run and reply all, or none */
    gr_http_run_fn run;
    gr_http_reply_fn reply;
    unsigned max_parked;    /* jobs one thread holds for one run; 0 = 64 */
} gr_http_config;

/* Starts serving. GR_EINVAL for a bad address, GR_EIO (naming the address) when it cannot
 * bind. */
GR_API int gr_http_start(const gr_http_config *cfg, gr_http_server **out);
/* The bound port (useful with port 0). */
GR_API uint16_t gr_http_port(const gr_http_server *s);
/* Stops accepting, waits for handlers in flight, frees. NULL is a no-op. */
GR_API void gr_http_stop(gr_http_server *s);

/* A request header's value (case-insensitive name) or NULL. */
GR_API const char *gr_http_header(const gr_http_request *req, const char *name);
/* A query argument's value ("?a=1&b=2") or NULL. */
GR_API const char *gr_http_query(const gr_http_request *req, const char *name);

/* Response helpers. Each replaces any body already set. */
/* printf-style body with a content type (NULL keeps the current one). */
GR_API void gr_http_printf(gr_http_response *resp, int status, const char *content_type,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Takes ownership of a malloc'd body. */
GR_API void gr_http_take(gr_http_response *resp, int status, const char *content_type,
                         char *body, size_t len);
/* {"error": "<message>"} with the status; the message is JSON-escaped. */
GR_API void gr_http_error(gr_http_response *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A blocking HTTP/1.1 client for tests, the command line and benchmarks.
 * url: "http://HOST:PORT/path?query". headers: extra "Name: value\r\n" lines or NULL. */
typedef struct gr_http_result {
    int status;
    char *body;        /* malloc'd, NUL-terminated; free with gr_http_result_free */
    size_t body_len;
    char content_type[64];
} gr_http_result;

/* GR_EINVAL for a bad URL, GR_ECONN when it cannot connect, GR_ETIMEDOUT past timeout_ms,
 * GR_EPROTO for a reply that is not HTTP (all with a message). A non-2xx status is not an
 * error: it is in out->status. */
GR_API int gr_http_fetch(const char *method, const char *url, const char *headers,
                         const void *body, size_t body_len, int timeout_ms, gr_http_result *out);
GR_API void gr_http_result_free(gr_http_result *r);

#ifdef __cplusplus
}
#endif
#endif
