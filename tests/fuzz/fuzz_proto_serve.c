/* libFuzzer target for the serving frames' bodies (SUBSCRIBE, publications, PREDICT and its
 * reply): every decoder runs on the input; whatever decodes must point only inside the input
 * (every key, value and dense part is read back), and a subscribe re-encodes to the same bytes. */
#include "granary/proto.h"

#include <stdlib.h>
#include <string.h>

static void inside(const uint8_t *body, size_t len, const void *p, size_t n)
{
    if (n && ((const uint8_t *)p < body || (const uint8_t *)p + n > body + len)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *body = malloc(size ? size : 1);
    if (!body) return 0;
    memcpy(body, data, size);
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_keys = 1 << 16;
    lim.max_tables = 64;
    volatile uint64_t sink = 0;

    gr_proto_subscribe sub;
    if (gr_proto_decode_subscribe(body, size, &sub) == GR_OK) {
        gr_proto_buf b;
        gr_proto_buf_init(&b);
        if (gr_proto_put_subscribe(&b, &sub) || b.len != size || memcmp(b.data, body, size)) abort();
        gr_proto_buf_fini(&b);
    }
    gr_proto_publication p;
    if (gr_proto_decode_publication(body, size, &lim, &p) == GR_OK) {
        for (uint32_t i = 0; i < p.nsparse; i++) {
            const gr_proto_pub_section *s = &p.sparse[i];
            size_t vb = (size_t)s->n * s->dim * (p.f16 ? 2 : 4);
            inside(body, size, s->keys, (size_t)s->n * 8);
            inside(body, size, s->values, vb);
            for (size_t j = 0; j < vb; j++) sink += ((const uint8_t *)s->values)[j];
        }
        for (uint32_t i = 0; i < p.ndense; i++) {
            inside(body, size, p.dense[i].name, p.dense[i].name_len);
            inside(body, size, p.dense[i].values, p.dense[i].size * 4);
        }
        gr_proto_publication_fini(&p);
    }
    gr_proto_predict q;
    if (gr_proto_decode_predict(body, size, &lim, &q) == GR_OK) {
        inside(body, size, q.dense, (size_t)q.n * q.ndense * 4);
        inside(body, size, q.ids, (size_t)q.n * q.nsparse * 8);
    }
    uint64_t ver;
    const float *probs;
    uint32_t n;
    if (gr_proto_decode_predict_reply(body, size, &ver, &probs, &n) == GR_OK)
        inside(body, size, probs, (size_t)n * 4);
    (void)sink;
    free(body);
    return 0;
}
