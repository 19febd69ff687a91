/* libFuzzer target for the replica's predict body (POST /v1/predict, gr_serve_parse_predict):
 * {"examples": [{"dense": [...], "cat": [...]}]} or {"lines": ["TSV without a label"]}. Any
 * input either fails with a message or yields n examples whose every value was written (read
 * back here, so ASan sees the whole arrays) and whose dense values are what the line parser
 * makes of Criteo integers (finite). And the two ways of reading a body agree: wherever the
 * fast path for {"lines": [...]} (src/serve/lines.c) answers, the cJSON path answers the same,
 * bit for bit. */
#include "granary/serve.h"
#include "serve/serve_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size + 1);
    if (!body) return 0;
    memcpy(body, data, size);
    body[size] = '\0';
    size_t n = 0;
    float *dense = NULL;
    uint64_t *ids = NULL;
    char err[512];
    int rc = gr_serve_parse_predict(body, size, 64, &n, &dense, &ids, err, sizeof err);
    if (rc == GR_OK) {
        if (n == 0 || n > 64 || !dense || !ids) abort();
        volatile uint64_t sink = 0;
        for (size_t i = 0; i < n * GR_CRITEO_DENSE; i++) {
            if (!isfinite(dense[i])) abort();
            sink += (uint64_t)(dense[i] != 0.0f);
        }
        for (size_t i = 0; i < n * GR_CRITEO_SPARSE; i++) sink += ids[i];
        (void)sink;
    } else {
        if (dense || ids || n || !memchr(err, '\0', sizeof err) || !err[0]) abort();
    }
    size_t nf = 0, ns = 0;
    float *df = NULL, *ds = NULL;
    uint64_t *xf = NULL, *xs = NULL;
    if (sv_parse_lines_fast(body, size, 64, &nf, &df, &xf)) {
        if (sv_parse_predict_json(body, size, 64, &ns, &ds, &xs, err, sizeof err) != GR_OK ||
            nf != ns || memcmp(df, ds, nf * GR_CRITEO_DENSE * sizeof *df) ||
            memcmp(xf, xs, nf * GR_CRITEO_SPARSE * sizeof *xf))
            abort();
    }
    free(df), free(xf), free(ds), free(xs);
    free(dense);
    free(ids);
    free(body);
    return 0;
}
