/* libFuzzer target for the replica's predict body (POST /v1/predict, gr_serve_parse_predict):
 * {"examples": [{"dense": [...], "cat": [...]}]} or {"lines": ["TSV without a label"]}. Any
 * input either fails with a message or yields n examples whose every value was written (read
 * back here, so ASan sees the whole arrays) and whose dense values are what the line parser
 * makes of Criteo integers (finite). */
#include "granary/serve.h"

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
    free(dense);
    free(ids);
    free(body);
    return 0;
}
