/* The member record: role names, its JSON form (a member znode's data), and the sequence
 * order of ZooKeeper's sequential names. Pure: no I/O. */
#include "coord/coord_int.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"shard", "standby", "worker", "observer"};

const char *gr_coord_role_name(int role)
{
    if (role < 0 || role >= (int)(sizeof role_names / sizeof role_names[0])) return "unknown";
    return role_names[role];
}

int gr_coord_role_parse(const char *s, gr_coord_role *out)
{
    for (size_t i = 0; s && i < sizeof role_names / sizeof role_names[0]; i++)
        if (!strcmp(s, role_names[i])) {
            *out = (gr_coord_role)i;
            return 0;
        }
    return gr_seterr(GR_EINVAL, "role '%s' (want shard, standby, worker or observer)",
                     s ? s : "");
}

const char *gr_coord_session_name(int state)
{
    switch (state) {
    case GR_COORD_CONNECTED: return "connected";
    case GR_COORD_SUSPENDED: return "suspended";
    case GR_COORD_EXPIRED: return "expired";
    default: return "unknown";
    }
}

void gr_coord_member_init(gr_coord_member *m, gr_coord_role role)
{
    memset(m, 0, sizeof *m);
    m->role = role;
    m->index = -1;
}

char *coord_member_encode(const gr_coord_member *m)
{
    cJSON *o = cJSON_CreateObject();
    char *out = NULL;
    if (o && cJSON_AddStringToObject(o, "id", m->id) &&
        cJSON_AddStringToObject(o, "role", gr_coord_role_name((int)m->role)) &&
        cJSON_AddNumberToObject(o, "index", m->index) &&
        cJSON_AddStringToObject(o, "address", m->address) &&
        cJSON_AddStringToObject(o, "host", m->host) &&
        cJSON_AddNumberToObject(o, "pid", (double)m->pid))
        out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!out) gr_seterr(GR_ENOMEM, "member: out of memory encoding it");
    return out;
}

static int take_text(const cJSON *o, const char *key, char *dst, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return gr_seterr(GR_EINVAL, "member: \"%s\" must be a string under %zu bytes", key, cap);
    strcpy(dst, v->valuestring);
    return 0;
}

static int decode_obj(const cJSON *o, gr_coord_member *out)
{
    if (!cJSON_IsObject(o)) return gr_seterr(GR_EINVAL, "member: not a JSON object");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(o, "role");
    if (!cJSON_IsString(role)) return gr_seterr(GR_EINVAL, "member: needs a \"role\"");
    int rc = gr_coord_role_parse(role->valuestring, &out->role);
    if (rc) return rc;
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(o, "index");
    if (idx) {
        if (!cJSON_IsNumber(idx) || idx->valuedouble < -1 || idx->valuedouble >= GR_SLOTS ||
            idx->valuedouble != (double)(int32_t)idx->valuedouble)
            return gr_seterr(GR_EINVAL, "member: \"index\" must be a whole number in -1..%u",
                             GR_SLOTS - 1);
        out->index = (int32_t)idx->valuedouble;
    }
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(o, "pid");
    if (pid) {
        if (!cJSON_IsNumber(pid) || !(pid->valuedouble >= 0 && pid->valuedouble < 4294967296.0))
            return gr_seterr(GR_EINVAL, "member: \"pid\" must be a whole number");
        out->pid = (int64_t)pid->valuedouble;
    }
    if ((rc = take_text(o, "id", out->id, sizeof out->id))) return rc;
    if ((rc = take_text(o, "address", out->address, sizeof out->address))) return rc;
    return take_text(o, "host", out->host, sizeof out->host);
}

int coord_member_decode(const char *json, size_t len, gr_coord_member *out)
{
    gr_coord_member_init(out, GR_COORD_OBSERVER);
    cJSON *o = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!o) return gr_seterr(GR_EINVAL, "member: not valid JSON");
    int rc = decode_obj(o, out);
    cJSON_Delete(o);
    return rc;
}

long long coord_seq_of(const char *name)
{
    size_t n = strlen(name);
    if (n < 10) return -1;
    long long v = 0;
    for (size_t i = n - 10; i < n; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

static int cmp_member(const void *a, const void *b)
{
    const gr_coord_member *x = a, *y = b;
    long long sx = coord_seq_of(x->id), sy = coord_seq_of(y->id);
    if (sx != sy) return sx < sy ? -1 : 1;
    return strcmp(x->id, y->id);
}

void coord_members_sort(gr_coord_member *m, size_t n)
{
    if (n > 1) qsort(m, n, sizeof *m, cmp_member);
}
