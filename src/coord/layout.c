/* The layout value: shard list, slot map and epoch, and its JSON form (the zookeeper layout
 * znode's data and the static cluster file). Pure: no I/O. The decoder takes hostile input
 * (whatever is in the znode or the file) and is fuzzed (tests/fuzz/fuzz_coord_layout.c). */
#include "coord/coord_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gr_coord_layout_init(gr_coord_layout *l, uint32_t n_shards)
{
    memset(l, 0, sizeof *l);
    if (n_shards < 1 || n_shards > GR_SLOTS)
        return gr_seterr(GR_EINVAL, "layout: %u shards (want 1..%u)", n_shards, GR_SLOTS);
    l->shards = calloc(n_shards, sizeof *l->shards);
    l->slot_map = malloc(GR_SLOTS * sizeof *l->slot_map);
    if (!l->shards || !l->slot_map) {
        gr_coord_layout_fini(l);
        return gr_seterr(GR_ENOMEM, "layout: out of memory for %u shards", n_shards);
    }
    l->n_shards = n_shards;
    for (uint32_t i = 0; i < n_shards; i++) l->shards[i].index = i;
    for (uint32_t s = 0; s < GR_SLOTS; s++) l->slot_map[s] = (uint16_t)gr_slot_shard(s, n_shards);
    l->epoch = 1;
    l->version = -1;
    return 0;
}

void gr_coord_layout_fini(gr_coord_layout *l)
{
    if (!l) return;
    free(l->shards);
    free(l->slot_map);
    memset(l, 0, sizeof *l);
}

int gr_coord_layout_copy(gr_coord_layout *dst, const gr_coord_layout *src)
{
    int rc = gr_coord_layout_init(dst, src->n_shards);
    if (rc) return rc;
    memcpy(dst->shards, src->shards, src->n_shards * sizeof *src->shards);
    memcpy(dst->slot_map, src->slot_map, GR_SLOTS * sizeof *src->slot_map);
    dst->epoch = src->epoch;
    dst->version = src->version;
    return 0;
}

/* The slot map as ranges [first, last, shard]: a default map of N shards is N entries. */
static cJSON *encode_slots(const gr_coord_layout *l)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return NULL;
    uint32_t first = 0;
    for (uint32_t s = 1; s <= GR_SLOTS; s++) {
        if (s < GR_SLOTS && l->slot_map[s] == l->slot_map[first]) continue;
        const double r[3] = {first, s - 1, l->slot_map[first]};
        cJSON *range = cJSON_CreateDoubleArray(r, 3);
        if (!range || !cJSON_AddItemToArray(arr, range)) {
            cJSON_Delete(range);
            cJSON_Delete(arr);
            return NULL;
        }
        first = s;
    }
    return arr;
}

char *gr_coord_layout_encode(const gr_coord_layout *l)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    bool ok = root && shards && cJSON_AddNumberToObject(root, "epoch", (double)l->epoch);
    for (uint32_t i = 0; ok && i < l->n_shards; i++) {
        cJSON *s = cJSON_CreateObject();
        if (!s || !cJSON_AddItemToArray(shards, s)) {
            cJSON_Delete(s);
            ok = false;
            break;
        }
        ok = cJSON_AddNumberToObject(s, "index", l->shards[i].index) &&
             cJSON_AddStringToObject(s, "address", l->shards[i].address) &&
             cJSON_AddStringToObject(s, "member", l->shards[i].member);
    }
    cJSON *slots = ok ? encode_slots(l) : NULL;
    if (slots && !cJSON_AddItemToObject(root, "slots", slots)) {
        cJSON_Delete(slots);
        slots = NULL;
    }
    char *out = slots ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!out) gr_seterr(GR_ENOMEM, "layout: out of memory encoding it");
    return out;
}

/* Copies a JSON string into a fixed field; false when it is not a string or too long. */
static bool take_text(const cJSON *item, char *dst, size_t cap)
{
    if (!cJSON_IsString(item) || strlen(item->valuestring) >= cap) return false;
    strcpy(dst, item->valuestring);
    return true;
}

/* A whole number in [lo, hi] (JSON numbers are doubles: exact below 2^53). */
static bool take_uint(const cJSON *item, double lo, double hi, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= lo && d <= hi) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static int decode_shard(const cJSON *item, uint32_t i, gr_coord_shard *s)
{
    s->index = i;
    if (cJSON_IsString(item)) { /* the client's cluster file: "host:port" */
        if (!take_text(item, s->address, sizeof s->address))
            return gr_seterr(GR_EINVAL, "layout: shards[%u]: address longer than %d bytes", i,
                             GR_COORD_ADDR_MAX - 1);
        return 0;
    }
    if (!cJSON_IsObject(item))
        return gr_seterr(GR_EINVAL, "layout: shards[%u] must be an object or \"host:port\"", i);
    uint64_t index;
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(item, "index");
    if (idx && (!take_uint(idx, 0, GR_SLOTS, &index) || index != i))
        return gr_seterr(GR_EINVAL, "layout: shards[%u] has \"index\" other than %u", i, i);
    const cJSON *addr = cJSON_GetObjectItemCaseSensitive(item, "address");
    if (addr && !take_text(addr, s->address, sizeof s->address))
        return gr_seterr(GR_EINVAL, "layout: shards[%u].address must be a string under %d bytes",
                         i, GR_COORD_ADDR_MAX);
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(item, "member");
    if (mem && !take_text(mem, s->member, sizeof s->member))
        return gr_seterr(GR_EINVAL, "layout: shards[%u].member must be a string under %d bytes",
                         i, GR_COORD_ID_MAX);
    return 0;
}

/* Ranges must cover 0..GR_SLOTS-1 in order, each slot once, each naming a listed shard. */
static int decode_slots(const cJSON *slots, gr_coord_layout *l)
{
    if (!cJSON_IsArray(slots)) return gr_seterr(GR_EINVAL, "layout: \"slots\" must be an array");
    uint64_t next = 0;
    int i = 0;
    for (const cJSON *r = slots->child; r; r = r->next, i++) {
        uint64_t first, last, shard;
        if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 3 ||
            !take_uint(r->child, 0, GR_SLOTS - 1, &first) ||
            !take_uint(r->child->next, 0, GR_SLOTS - 1, &last) ||
            !take_uint(r->child->next->next, 0, GR_SLOTS - 1, &shard))
            return gr_seterr(GR_EINVAL, "layout: slots[%d] must be [first, last, shard] with "
                             "whole numbers below %u", i, GR_SLOTS);
        if (first != next || last < first)
            return gr_seterr(GR_EINVAL, "layout: slots[%d] is [%llu, %llu]; slot %llu comes next",
                             i, (unsigned long long)first, (unsigned long long)last,
                             (unsigned long long)next);
        if (shard >= l->n_shards)
            return gr_seterr(GR_EINVAL, "layout: slots[%d] names shard %llu of %u", i,
                             (unsigned long long)shard, l->n_shards);
        for (uint64_t s = first; s <= last; s++) l->slot_map[s] = (uint16_t)shard;
        next = last + 1;
    }
    if (next != GR_SLOTS)
        return gr_seterr(GR_EINVAL, "layout: slots cover 0..%llu, not all %u slots",
                         (unsigned long long)next - 1, GR_SLOTS);
    return 0;
}

static int decode_root(const cJSON *root, gr_coord_layout *out)
{
    if (!cJSON_IsObject(root)) return gr_seterr(GR_EINVAL, "layout: not a JSON object");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    int n = cJSON_IsArray(shards) ? cJSON_GetArraySize(shards) : -1;
    if (n < 1 || n > (int)GR_SLOTS)
        return gr_seterr(GR_EINVAL, "layout: needs \"shards\": a list of 1..%u shards", GR_SLOTS);
    int rc = gr_coord_layout_init(out, (uint32_t)n);
    if (rc) return rc;
    uint32_t i = 0;
    for (const cJSON *s = shards->child; s && !rc; s = s->next, i++)
        rc = decode_shard(s, i, &out->shards[i]);
    const cJSON *epoch = cJSON_GetObjectItemCaseSensitive(root, "epoch");
    if (!rc && epoch && !take_uint(epoch, 1, 9007199254740992.0, &out->epoch))
        rc = gr_seterr(GR_EINVAL, "layout: \"epoch\" must be a whole number from 1");
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(root, "slots");
    if (!rc && slots) rc = decode_slots(slots, out);
    if (rc) gr_coord_layout_fini(out);
    return rc;
}

int gr_coord_layout_decode(const char *json, size_t len, gr_coord_layout *out)
{
    memset(out, 0, sizeof *out);
    if (!json) return gr_seterr(GR_EINVAL, "layout: no data");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return gr_seterr(GR_EINVAL, "layout: not valid JSON");
    int rc = decode_root(root, out);
    cJSON_Delete(root);
    return rc;
}

int gr_coord_layout_servers(const gr_coord_layout *l, char *buf, size_t cap)
{
    size_t off = 0;
    if (!cap) return gr_seterr(GR_ETOOBIG, "layout: no room for the server list");
    buf[0] = '\0';
    for (uint32_t i = 0; i < l->n_shards; i++) {
        int w = snprintf(buf + off, cap - off, "%s%s", i ? "," : "", l->shards[i].address);
        if (w < 0 || (size_t)w >= cap - off)
            return gr_seterr(GR_ETOOBIG, "layout: server list longer than %zu bytes", cap);
        off += (size_t)w;
    }
    return 0;
}

int coord_layout_check(const gr_coord_layout *l)
{
    if (!l || l->n_shards < 1 || l->n_shards > GR_SLOTS || !l->shards || !l->slot_map)
        return gr_seterr(GR_EINVAL, "layout: needs 1..%u shards and a slot map", GR_SLOTS);
    if (l->epoch < 1) return gr_seterr(GR_EINVAL, "layout: epoch 0 never names a layout");
    for (uint32_t i = 0; i < l->n_shards; i++) {
        if (l->shards[i].index != i)
            return gr_seterr(GR_EINVAL, "layout: shards[%u] has index %u", i, l->shards[i].index);
        if (!memchr(l->shards[i].address, 0, sizeof l->shards[i].address) ||
            !memchr(l->shards[i].member, 0, sizeof l->shards[i].member))
            return gr_seterr(GR_EINVAL, "layout: shards[%u] has an unterminated field", i);
    }
    for (uint32_t s = 0; s < GR_SLOTS; s++)
        if (l->slot_map[s] >= l->n_shards)
            return gr_seterr(GR_EINVAL, "layout: slot %u names shard %u of %u", s, l->slot_map[s],
                             l->n_shards);
    return 0;
}
