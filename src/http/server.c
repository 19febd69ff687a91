/* The HTTP server: libmicrohttpd with its own thread pool; each request's body is gathered
 * whole (up to max_body) and handed to one handler that fills a gr_http_response. */
#include "granary/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "http/http_int.h"

struct gr_http_server {
    struct MHD_Daemon *daemon;
    gr_http_config cfg;
    uint16_t port;
};

/* What we keep for one request between libmicrohttpd's calls. */
typedef struct pending {
    char *body;
    size_t len, cap;
    int too_big;
} pending;

static enum MHD_Result send_response(struct MHD_Connection *conn, gr_http_response *resp)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        resp->body_len, resp->body ? resp->body : (void *)"",
        resp->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(resp->body);
        return MHD_NO;
    }
    resp->body = NULL;
    if (resp->content_type[0])
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
    for (int i = 0; i < 2; i++) {
        char line[256];
        snprintf(line, sizeof line, "%s", resp->extra_header[i]);
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = '\0';
        const char *value = colon + 1;
        while (*value == ' ') value++;
        MHD_add_response_header(r, line, value);
    }
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void response_init(gr_http_response *resp)
{
    memset(resp, 0, sizeof *resp);
    resp->status = 200;
    snprintf(resp->content_type, sizeof resp->content_type, "application/json");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    gr_http_server *s = cls;
    pending *p = *con_cls;
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p) return MHD_NO;
        *con_cls = p;
        /* A declared length over the limit is refused before a byte of it is read. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
            gr_http_response resp;
            response_init(&resp);
            gr_http_error(&resp, 413, "request body of %s bytes is over the limit of %zu",
                          cl, s->cfg.max_body);
            return send_response(conn, &resp);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (p->too_big || p->len + n > s->cfg.max_body) {
            p->too_big = 1; /* keep reading (and dropping) so the reply can be sent */
            return MHD_YES;
        }
        if (p->len + n + 1 > p->cap) {
            size_t cap = p->cap ? p->cap : 4096;
            while (cap < p->len + n + 1) cap *= 2;
            char *nb = realloc(p->body, cap);
            if (!nb) return MHD_NO;
            p->body = nb;
            p->cap = cap;
        }
        memcpy(p->body + p->len, upload_data, n);
        p->len += n;
        return MHD_YES;
    }
    gr_http_response resp;
    response_init(&resp);
    if (p->too_big) {
        gr_http_error(&resp, 413, "request body is over the limit of %zu bytes", s->cfg.max_body);
    } else {
        gr_http_request req = {
            .method = method,
            .path = url,
            .body = p->body ? p->body : "",
            .body_len = p->len,
            .internal = conn,
        };
        if (p->body) p->body[p->len] = '\0';
        s->cfg.handler(s->cfg.ctx, &req, &resp);
    }
    return send_response(conn, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)conn, (void)toe;
    pending *p = *con_cls;
    if (p) {
        free(p->body);
        free(p);
        *con_cls = NULL;
    }
}

int gr_http_start(const gr_http_config *cfg, gr_http_server **out)
{
    *out = NULL;
    if (!cfg || !cfg->handler || !cfg->listen)
        return gr_seterr(GR_EINVAL, "http: a listen address and a handler are required");
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int rc = gr_http_resolve(cfg->listen, 1, &addr, &addr_len);
    if (rc) return rc;
    gr_http_server *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "http: out of memory");
    s->cfg = *cfg;
    if (!s->cfg.threads) s->cfg.threads = 1;
    if (!s->cfg.max_body) s->cfg.max_body = 1u << 20;
    if (!s->cfg.timeout_s) s->cfg.timeout_s = 30;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE,
        s->cfg.threads, MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.timeout_s,
        MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        return gr_seterr(GR_EIO, "http: cannot listen on %s (in use, or not an address of "
                                 "this machine)", cfg->listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : 0;
    *out = s;
    return 0;
}

uint16_t gr_http_port(const gr_http_server *s) { return s ? s->port : 0; }

void gr_http_stop(gr_http_server *s)
{
    if (!s) return;
    MHD_stop_daemon(s->daemon);
    free(s);
}

const char *gr_http_header(const gr_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->internal, MHD_HEADER_KIND, name);
}

const char *gr_http_query(const gr_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->internal, MHD_GET_ARGUMENT_KIND, name);
}
