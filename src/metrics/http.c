/* The /metrics and /healthz endpoint of `--metrics HOST:PORT`, on the shared HTTP server
 * (include/granary/http.h). One handler thread is enough: a scrape every few seconds. */
#include "metrics/metrics_int.h"
#include "granary/http.h"

#include <stdlib.h>
#include <string.h>

struct gr_metrics_http {
    gr_metrics *r;
    gr_metrics_health_fn health;
    void *health_ctx;
    gr_http_server *srv;
};

bool gr_metrics_http_answer(gr_metrics *r, gr_metrics_health_fn health, void *health_ctx,
                            const gr_http_request *req, gr_http_response *resp)
{
    bool metrics = !strcmp(req->path, "/metrics"), healthz = !strcmp(req->path, "/healthz");
    if (!metrics && !healthz) return false;
    if (strcmp(req->method, "GET") && strcmp(req->method, "HEAD")) {
        gr_http_printf(resp, 405, "text/plain; charset=utf-8", "%s wants GET, not %s\n", req->path,
                       req->method);
        return true;
    }
    if (healthz) {
        char why[256] = "";
        if (health && !health(health_ctx, why, sizeof why))
            gr_http_printf(resp, 503, "text/plain; charset=utf-8", "unhealthy: %s\n",
                           why[0] ? why : "no reason given");
        else
            gr_http_printf(resp, 200, "text/plain; charset=utf-8", "ok\n");
        return true;
    }
    char *text = NULL;
    size_t len = 0;
    if (gr_metrics_format(r, &text, &len)) {
        gr_http_printf(resp, 500, "text/plain; charset=utf-8", "%s\n", gr_errmsg());
        return true;
    }
    gr_http_take(resp, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    return true;
}

static void handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    gr_metrics_http *h = ctx;
    if (!gr_metrics_http_answer(h->r, h->health, h->health_ctx, req, resp))
        gr_http_printf(resp, 404, "text/plain; charset=utf-8",
                       "not found: this endpoint serves /metrics and /healthz\n");
}

int gr_metrics_http_start(gr_metrics *r, const char *listen, gr_metrics_health_fn health,
                          void *health_ctx, gr_metrics_http **out)
{
    if (!r || !listen || !out) return gr_seterr(GR_EINVAL, "metrics: NULL argument");
    gr_metrics_http *h = calloc(1, sizeof *h);
    if (!h) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    h->r = r;
    h->health = health;
    h->health_ctx = health_ctx;
    gr_http_config cfg = {.listen = listen,
                          .threads = 1,
                          .max_body = 4096,
                          .timeout_s = 30,
                          .handler = handle,
                          .ctx = h};
    int rc = gr_http_start(&cfg, &h->srv);
    if (rc) {
        free(h);
        return gr_seterr(rc, "--metrics %s: %s", listen, gr_errmsg());
    }
    *out = h;
    return GR_OK;
}

uint16_t gr_metrics_http_port(const gr_metrics_http *h)
{
    return h ? gr_http_port(h->srv) : 0;
}

void gr_metrics_http_stop(gr_metrics_http *h)
{
    if (!h) return;
    gr_http_stop(h->srv);
    free(h);
}
