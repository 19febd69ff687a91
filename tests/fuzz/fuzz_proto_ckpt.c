/* libFuzzer target for the checkpoint frames' bodies (CKPT_SAVE, CKPT_COMMIT, CKPT_LOAD and
 * their replies): every decoder runs on the input; whatever decodes must re-encode to exactly
 * the same bytes (one encoding per frame) and its strings must lie inside the input. */
#include "granary/proto.h"

#include <stdlib.h>
#include <string.h>

static void inside(const uint8_t *body, size_t len, gr_proto_strv v)
{
    if (v.n && ((const uint8_t *)v.p < body || (const uint8_t *)v.p + v.n > body + len)) abort();
    if (v.n && memchr(v.p, '\0', v.n)) abort();
}

static void same(const gr_proto_buf *b, const uint8_t *body, size_t len)
{
    if (b->len != len || memcmp(b->data, body, len) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Bodies are 8-byte aligned in the server (malloc'd): give the decoders a copy. */
    uint8_t *body = malloc(size ? size : 1);
    if (!body) return 0;
    memcpy(body, data, size);
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_string = 4096;
    gr_proto_buf b;
    gr_proto_buf_init(&b);

    gr_proto_ckpt_save sv;
    if (gr_proto_decode_ckpt_save(body, size, &lim, &sv) == GR_OK) {
        inside(body, size, sv.root);
        inside(body, size, sv.name);
        inside(body, size, sv.parent);
        b.len = 0;
        if (gr_proto_put_ckpt_save(&b, &sv)) abort();
        same(&b, body, size);
    }
    gr_proto_ckpt_saved sd;
    if (gr_proto_decode_ckpt_saved(body, size, &sd) == GR_OK) {
        b.len = 0;
        if (gr_proto_put_ckpt_saved(&b, &sd)) abort();
        same(&b, body, size);
    }
    gr_proto_ckpt_commit cm;
    if (gr_proto_decode_ckpt_commit(body, size, &lim, &cm) == GR_OK) {
        inside(body, size, cm.root);
        inside(body, size, cm.name);
        inside(body, size, cm.parent);
        inside(body, size, cm.meta);
        b.len = 0;
        if (gr_proto_put_ckpt_commit(&b, &cm)) abort();
        same(&b, body, size);
    }
    gr_proto_ckpt_committed cd;
    if (gr_proto_decode_ckpt_committed(body, size, &cd) == GR_OK) {
        b.len = 0;
        if (gr_proto_put_ckpt_committed(&b, &cd)) abort();
        same(&b, body, size);
    }
    gr_proto_ckpt_load ld;
    if (gr_proto_decode_ckpt_load(body, size, &lim, &ld) == GR_OK) {
        inside(body, size, ld.root);
        inside(body, size, ld.name);
        b.len = 0;
        if (gr_proto_put_ckpt_load(&b, &ld)) abort();
        same(&b, body, size);
    }
    gr_proto_ckpt_loaded lo;
    if (gr_proto_decode_ckpt_loaded(body, size, &lim, &lo) == GR_OK) {
        inside(body, size, lo.name);
        inside(body, size, lo.meta);
        b.len = 0;
        if (gr_proto_put_ckpt_loaded(&b, &lo)) abort();
        same(&b, body, size);
    }
    gr_proto_buf_fini(&b);
    free(body);
    return 0;
}
