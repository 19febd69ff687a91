/* libFuzzer target for the coord decoders of hostile znode data and cluster files: the layout
 * (whatever decodes must encode and decode back to the same layout) and the member record
 * (whatever decodes must encode and decode back to the same record). */
#include "coord/coord_int.h"

#include <stdlib.h>
#include <string.h>

static void layout_round_trip(const uint8_t *data, size_t size)
{
    gr_coord_layout l, back;
    if (gr_coord_layout_decode((const char *)data, size, &l) != GR_OK) return;
    if (coord_layout_check(&l) != GR_OK) abort();
    char *js = gr_coord_layout_encode(&l);
    if (!js) abort();
    if (gr_coord_layout_decode(js, strlen(js), &back) != GR_OK) abort();
    if (back.epoch != l.epoch || back.n_shards != l.n_shards ||
        memcmp(back.shards, l.shards, l.n_shards * sizeof *l.shards) != 0 ||
        memcmp(back.slot_map, l.slot_map, GR_SLOTS * sizeof *l.slot_map) != 0)
        abort();
    free(js);
    gr_coord_layout_fini(&back);
    gr_coord_layout_fini(&l);
}

static void member_round_trip(const uint8_t *data, size_t size)
{
    gr_coord_member m, back;
    if (coord_member_decode((const char *)data, size, &m) != GR_OK) return;
    char *js = coord_member_encode(&m);
    if (!js) abort();
    if (coord_member_decode(js, strlen(js), &back) != GR_OK) abort();
    if (memcmp(&m, &back, sizeof m) != 0) abort();
    free(js);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    layout_round_trip(data, size);
    member_round_trip(data, size);
    return 0;
}
