/* The shard file reader: validates the header, the trailer and every section header against
 * the file's size and hard limits before allocating, verifies each payload's checksum before
 * decompressing or decoding it, and names the file, section and offset in every error. Used
 * by restore, verify, commit and the fuzz target. */
#include "ckpt/ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>
#include <zstd.h>

const char *ck_where(const ck_reader *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s: section %u at offset %llu", r->path, r->nsection,
             (unsigned long long)(r->off));
    return buf;
}

static int read_at(ck_reader *r, void *buf, size_t len, uint64_t off)
{
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = pread(r->fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return gr_seterr(GR_EIO, "%s: read at offset %llu failed: %s", r->path,
                             (unsigned long long)off, strerror(errno));
        }
        if (n == 0)
            return gr_seterr(GR_ECORRUPT, "%s: truncated (ends before offset %llu)", r->path,
                             (unsigned long long)(off + len));
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return GR_OK;
}

static int check_header(ck_reader *r)
{
    ck_file_header *h = &r->hdr;
    if (r->size < CK_HEADER_SIZE + CK_SECTION_SIZE + CK_TAIL_SIZE)
        return gr_seterr(GR_ECORRUPT, "%s: truncated (%llu bytes is too short for a shard file)",
                         r->path, (unsigned long long)r->size);
    int rc = read_at(r, h, sizeof *h, 0);
    if (rc != GR_OK) return rc;
    if (memcmp(h->magic, CK_MAGIC, 8) != 0)
        return gr_seterr(GR_ECORRUPT, "%s: not a granary shard file (bad magic)", r->path);
    if (r->verify && h->checksum != gr_checksum(h, offsetof(ck_file_header, checksum)))
        return gr_seterr(GR_ECORRUPT, "%s: file header checksum mismatch", r->path);
    if (h->version != GR_CKPT_VERSION)
        return gr_seterr(GR_EVERSION, "%s: format version %u, this build reads version %u",
                         r->path, h->version, GR_CKPT_VERSION);
    if (h->kind > GR_CKPT_EXPORT)
        return gr_seterr(GR_ECORRUPT, "%s: unknown checkpoint kind %u", r->path, h->kind);
    if (h->shards == 0 || h->shards > GR_CKPT_SHARDS_MAX || h->shard >= h->shards)
        return gr_seterr(GR_ECORRUPT, "%s: shard %u of %u is out of range", r->path, h->shard,
                         h->shards);
    if (h->ntables > GR_CKPT_TABLES_MAX)
        return gr_seterr(GR_ECORRUPT, "%s: %u tables exceed the limit of %d", r->path,
                         h->ntables, GR_CKPT_TABLES_MAX);
    if (h->flags & ~CK_FLAG_F16)
        return gr_seterr(GR_ECORRUPT, "%s: unknown flags 0x%x", r->path, h->flags);
    if ((h->flags & CK_FLAG_F16) && h->kind != GR_CKPT_EXPORT)
        return gr_seterr(GR_ECORRUPT, "%s: f16 flag on a non-export file", r->path);

    ck_tail *t = &r->tail;
    rc = read_at(r, t, sizeof *t, r->size - CK_TAIL_SIZE);
    if (rc != GR_OK) return rc;
    if (memcmp(t->magic, CK_TAIL_MAGIC, 8) != 0)
        return gr_seterr(GR_ECORRUPT, "%s: truncated or damaged (no trailer at the end)",
                         r->path);
    if (t->content_size != r->size - CK_TAIL_SIZE)
        return gr_seterr(GR_ECORRUPT, "%s: trailer records %llu content bytes, file has %llu",
                         r->path, (unsigned long long)t->content_size,
                         (unsigned long long)(r->size - CK_TAIL_SIZE));
    if (t->end_offset < CK_HEADER_SIZE || t->end_offset > t->content_size - CK_SECTION_SIZE)
        return gr_seterr(GR_ECORRUPT, "%s: trailer points outside the file", r->path);
    if (h->ntables) {
        r->tables = calloc(h->ntables, sizeof *r->tables);
        if (!r->tables) return gr_seterr(GR_ENOMEM, "%s: out of memory", r->path);
    }
    r->off = CK_HEADER_SIZE;
    return GR_OK;
}

int ck_reader_open_fd(ck_reader *r, int fd, uint64_t size, const char *label, bool verify)
{
    memset(r, 0, sizeof *r);
    r->fd = fd;
    r->verify = verify;
    r->size = size;
    snprintf(r->path, sizeof r->path, "%s", label);
    return check_header(r);
}

int ck_reader_open(ck_reader *r, const char *path, uint64_t expect_size)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    int fd;
    uint64_t size;
    int rc = gr_ckpt_open_regular(path, &fd, &size);
    if (rc == GR_ENOENT) return gr_seterr(GR_ENOENT, "%s: missing (incomplete checkpoint)", path);
    if (rc) return rc;
    if (expect_size && size != expect_size) {
        close(fd);
        return gr_seterr(GR_ECORRUPT, "%s: truncated or altered: %llu bytes, the manifest says %llu",
                         path, (unsigned long long)size, (unsigned long long)expect_size);
    }
    rc = ck_reader_open_fd(r, fd, size, path, true);
    r->own_fd = true;
    if (rc != GR_OK) ck_reader_close(r);
    return rc;
}

void ck_reader_close(ck_reader *r)
{
    if (r->own_fd && r->fd >= 0) close(r->fd);
    r->fd = -1;
    free(r->tables);
    r->tables = NULL;
    ck_scratch_fini(&r->scratch);
}

static const char *type_name(unsigned type)
{
    switch (type) {
    case CK_SEC_TABLE: return "table";
    case CK_SEC_ROWS: return "rows";
    case CK_SEC_KEYS: return "keys";
    case CK_SEC_END: return "end";
    }
    return "?";
}

/* The table index the reader is inside: TABLE sections come in order 0, 1, ... and ROWS/KEYS
 * sections belong to the last one. */
static long current_table(const ck_reader *r)
{
    long cur = -1;
    for (uint32_t i = 0; i < r->hdr.ntables; i++)
        if (r->tables[i].seen) cur = i;
        else break;
    return cur;
}

int ck_reader_next(ck_reader *r, ck_section *s)
{
    uint64_t content = r->tail.content_size;
    if (r->off == content) return 0; /* past the END section */
    char w[4200];
    ck_where(r, w, sizeof w);
    if (r->off > content - CK_SECTION_SIZE)
        return gr_seterr(GR_ECORRUPT, "%s: truncated section header", w);
    int rc = read_at(r, s, sizeof *s, r->off);
    if (rc != GR_OK) return rc;
    if (r->hash) XXH3_64bits_update(r->hash, s, sizeof *s);
    if (s->magic != CK_SECTION_MAGIC)
        return gr_seterr(GR_ECORRUPT, "%s: bad section magic", w);
    if (r->verify && s->checksum != gr_checksum(s, offsetof(ck_section, checksum)))
        return gr_seterr(GR_ECORRUPT, "%s: section header checksum mismatch", w);
    if (s->type < CK_SEC_TABLE || s->type > CK_SEC_END)
        return gr_seterr(GR_ECORRUPT, "%s: unknown section type %u", w, s->type);
    if (s->codec > CK_CODEC_ZSTD)
        return gr_seterr(GR_ECORRUPT, "%s: unknown codec %u", w, s->codec);
    uint64_t room = content - r->off - CK_SECTION_SIZE;
    if (s->stored_len > room)
        return gr_seterr(GR_ECORRUPT, "%s: %s payload of %llu bytes runs past the end of the file",
                         w, type_name(s->type), (unsigned long long)s->stored_len);
    if (s->codec == CK_CODEC_NONE && s->stored_len != s->raw_len)
        return gr_seterr(GR_ECORRUPT, "%s: raw payload with stored size %llu != size %llu", w,
                         (unsigned long long)s->stored_len, (unsigned long long)s->raw_len);
    bool is_end_pos = r->off == r->tail.end_offset;
    if ((s->type == CK_SEC_END) != is_end_pos)
        return gr_seterr(GR_ECORRUPT, "%s: %s section where the trailer puts the end", w,
                         type_name(s->type));
    long cur = current_table(r);
    switch (s->type) {
    case CK_SEC_TABLE:
        if (s->table != (uint32_t)(cur + 1) || s->table >= r->hdr.ntables)
            return gr_seterr(GR_ECORRUPT, "%s: table section %u out of order", w, s->table);
        if (s->raw_len < sizeof(ck_table_info) || s->raw_len > CK_TABLE_RAW_MAX ||
            s->codec != CK_CODEC_NONE)
            return gr_seterr(GR_ECORRUPT, "%s: bad table section size %llu", w,
                             (unsigned long long)s->raw_len);
        break;
    case CK_SEC_ROWS:
    case CK_SEC_KEYS: {
        if (cur < 0 || s->table != (uint32_t)cur)
            return gr_seterr(GR_ECORRUPT, "%s: %s section for table %u outside that table's "
                             "sections", w, type_name(s->type), s->table);
        if (s->type == CK_SEC_KEYS && r->hdr.kind != GR_CKPT_DELTA)
            return gr_seterr(GR_ECORRUPT, "%s: key section in a %s file", w,
                             gr_ckpt_kind_name((gr_ckpt_kind)r->hdr.kind));
        uint64_t per = s->type == CK_SEC_KEYS ? 8 : ck_row_bytes(&r->tables[cur].info);
        if (s->count == 0 || s->raw_len > CK_ROWS_RAW_MAX || s->count > CK_ROWS_RAW_MAX / per ||
            s->count * per != s->raw_len)
            return gr_seterr(GR_ECORRUPT, "%s: %s section claims %llu entries in %llu bytes", w,
                             type_name(s->type), (unsigned long long)s->count,
                             (unsigned long long)s->raw_len);
        if (s->codec == CK_CODEC_ZSTD && s->stored_len > ZSTD_compressBound(s->raw_len))
            return gr_seterr(GR_ECORRUPT, "%s: compressed size %llu exceeds zstd's bound", w,
                             (unsigned long long)s->stored_len);
        break;
    }
    case CK_SEC_END:
        if (s->table != UINT32_MAX || s->raw_len > CK_END_RAW_MAX || s->codec != CK_CODEC_NONE)
            return gr_seterr(GR_ECORRUPT, "%s: bad end section", w);
        if (r->off + CK_SECTION_SIZE + s->stored_len != content)
            return gr_seterr(GR_ECORRUPT, "%s: bytes after the end section", w);
        if (r->hdr.ntables && !r->tables[r->hdr.ntables - 1].seen)
            return gr_seterr(GR_ECORRUPT, "%s: end section before all %u table sections", w,
                             r->hdr.ntables);
        break;
    }
    r->payload_off = r->off + CK_SECTION_SIZE;
    r->off = r->payload_off + s->stored_len;
    r->nsection++;
    return 1;
}

static int grow(unsigned char **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf) return GR_OK;
    size_t n = need ? need : 1;
    unsigned char *p = malloc(n);
    if (!p) return gr_seterr(GR_ENOMEM, "out of memory (%zu bytes) reading a checkpoint", need);
    free(*buf);
    *buf = p;
    *cap = n;
    return GR_OK;
}

int ck_payload_at(const ck_reader *r, const ck_section *s, uint64_t payload_off, uint32_t nsec,
                  unsigned char **buf, size_t *cap, ck_scratch *sc, void *hash)
{
    char w[4200];
    snprintf(w, sizeof w, "%s: %s section %u at offset %llu", r->path, type_name(s->type), nsec,
             (unsigned long long)(payload_off - CK_SECTION_SIZE));
    /* read_at takes the reader only for its descriptor and path, which stay as they are. */
    ck_reader *rr = (ck_reader *)r;
    int rc;
    if (s->codec == CK_CODEC_NONE) {
        rc = grow(buf, cap, s->raw_len);
        if (rc == GR_OK) rc = read_at(rr, *buf, s->raw_len, payload_off);
        if (rc != GR_OK) return rc;
        if (hash) XXH3_64bits_update(hash, *buf, s->raw_len);
        if (r->verify && gr_checksum(*buf, s->raw_len) != s->payload_checksum)
            return gr_seterr(GR_ECORRUPT, "%s: payload checksum mismatch (corrupt data)", w);
        return GR_OK;
    }
    rc = grow(&sc->stored, &sc->stored_cap, s->stored_len);
    if (rc == GR_OK) rc = read_at(rr, sc->stored, s->stored_len, payload_off);
    if (rc != GR_OK) return rc;
    if (hash) XXH3_64bits_update(hash, sc->stored, s->stored_len);
    if (r->verify && gr_checksum(sc->stored, s->stored_len) != s->payload_checksum)
        return gr_seterr(GR_ECORRUPT, "%s: payload checksum mismatch (corrupt data)", w);
    rc = grow(buf, cap, s->raw_len);
    if (rc != GR_OK) return rc;
    if (!sc->zctx) {
        sc->zctx = ZSTD_createDCtx();
        if (!sc->zctx) return gr_seterr(GR_ENOMEM, "out of memory for zstd");
    }
    size_t got = ZSTD_decompressDCtx(sc->zctx, *buf, s->raw_len, sc->stored, s->stored_len);
    if (ZSTD_isError(got))
        return gr_seterr(GR_ECORRUPT, "%s: zstd: %s", w, ZSTD_getErrorName(got));
    if (got != s->raw_len)
        return gr_seterr(GR_ECORRUPT, "%s: decompressed to %zu bytes, expected %llu", w, got,
                         (unsigned long long)s->raw_len);
    return GR_OK;
}

void ck_scratch_fini(ck_scratch *sc)
{
    ZSTD_freeDCtx(sc->zctx);
    free(sc->stored);
    memset(sc, 0, sizeof *sc);
}

int ck_reader_payload(ck_reader *r, const ck_section *s, unsigned char **buf, size_t *cap)
{
    return ck_payload_at(r, s, r->payload_off, r->nsection - 1, buf, cap, &r->scratch, r->hash);
}

int ck_reader_table(ck_reader *r, const ck_section *s, const unsigned char *p)
{
    char w[4200];
    snprintf(w, sizeof w, "%s: table section %u", r->path, s->table);
    ck_table_desc *d = &r->tables[s->table];
    memcpy(&d->info, p, sizeof d->info);
    const ck_table_info *ti = &d->info;
    if (ti->json_len != s->raw_len - sizeof *ti)
        return gr_seterr(GR_ECORRUPT, "%s: spec length %u does not fit the section", w,
                         ti->json_len);
    char *json = malloc(ti->json_len + 1);
    if (!json) return gr_seterr(GR_ENOMEM, "out of memory");
    memcpy(json, p + sizeof *ti, ti->json_len);
    json[ti->json_len] = '\0';
    int rc = gr_table_spec_from_json(json, &d->spec);
    free(json);
    if (rc == GR_OK) rc = gr_table_spec_validate(&d->spec);
    if (rc != GR_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        return gr_seterr(GR_ECORRUPT, "%s: bad table spec: %s", w, msg);
    }
    for (uint32_t i = 0; i < s->table; i++)
        if (!strcmp(r->tables[i].spec.name, d->spec.name))
            return gr_seterr(GR_ECORRUPT, "%s: table '%s' appears twice", w, d->spec.name);
    bool exp = r->hdr.kind == GR_CKPT_EXPORT;
    uint32_t want_state = exp ? 0 : gr_table_state_floats(&d->spec);
    uint32_t want_w = exp ? ((r->hdr.flags & CK_FLAG_F16) ? CK_W_F16 : CK_W_F32)
                          : (d->spec.dtype == GR_DTYPE_F16 ? CK_W_F16 : CK_W_F32);
    if (ti->dim != d->spec.dim || ti->state_floats != want_state || ti->weight_type != want_w ||
        ti->has_meta != (exp ? 0u : 1u) || ti->reserved != 0)
        return gr_seterr(GR_ECORRUPT, "%s: row layout (dim %u, %u state floats, weights %s) does "
                         "not match table '%s'", w, ti->dim, ti->state_floats,
                         ti->weight_type == CK_W_F16 ? "f16" : "f32", d->spec.name);
    d->seen = true;
    return GR_OK;
}

void ck_rows_view(const ck_table_info *ti, const unsigned char *p, uint64_t count, ck_rows *v)
{
    size_t wsz = ti->weight_type == CK_W_F16 ? 2 : 4;
    v->keys = (const uint64_t *)p;
    p += 8 * count;
    v->weights = p;
    p += wsz * ti->dim * count;
    v->state = ti->state_floats ? (const float *)p : NULL;
    p += 4ull * ti->state_floats * count;
    v->meta = ti->has_meta ? (const gr_row_meta *)p : NULL;
}

int ck_reader_end_json(ck_reader *r, char **json)
{
    /* Read directly at the trailer's offset (commit and inspect skip the rows). */
    ck_section s;
    uint64_t at = r->tail.end_offset;
    int rc = read_at(r, &s, sizeof s, at);
    if (rc != GR_OK) return rc;
    if (s.magic != CK_SECTION_MAGIC || s.type != CK_SEC_END || s.codec != CK_CODEC_NONE ||
        s.table != UINT32_MAX || s.raw_len != s.stored_len || s.raw_len > CK_END_RAW_MAX ||
        at + CK_SECTION_SIZE + s.stored_len != r->tail.content_size)
        return gr_seterr(GR_ECORRUPT, "%s: no valid end section where the trailer points (%llu)",
                         r->path, (unsigned long long)at);
    if (r->verify && s.checksum != gr_checksum(&s, offsetof(ck_section, checksum)))
        return gr_seterr(GR_ECORRUPT, "%s: end section header checksum mismatch", r->path);
    unsigned char *buf = NULL;
    size_t cap = 0;
    rc = grow(&buf, &cap, s.raw_len + 1);
    if (rc == GR_OK) rc = read_at(r, buf, s.raw_len, at + CK_SECTION_SIZE);
    if (rc == GR_OK && r->verify && gr_checksum(buf, s.raw_len) != s.payload_checksum)
        rc = gr_seterr(GR_ECORRUPT, "%s: end section payload checksum mismatch", r->path);
    if (rc != GR_OK) {
        free(buf);
        return rc;
    }
    buf[s.raw_len] = '\0';
    *json = (char *)buf;
    return GR_OK;
}

static int u64_field(const cJSON *o, const char *name, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return GR_ECORRUPT;
    *out = (uint64_t)v->valuedouble;
    return GR_OK;
}

int ck_end_parse(const char *json, size_t ntables, ck_end_table **out)
{
    cJSON *root = cJSON_Parse(json);
    if (!root) return gr_seterr(GR_ECORRUPT, "end section is not JSON");
    int rc = GR_OK;
    ck_end_table *t = NULL;
    const cJSON *tabs = cJSON_GetObjectItemCaseSensitive(root, "tables");
    if (!cJSON_IsArray(tabs) || (size_t)cJSON_GetArraySize(tabs) != ntables) {
        rc = gr_seterr(GR_ECORRUPT, "end section lists %d tables, header says %zu",
                       cJSON_IsArray(tabs) ? cJSON_GetArraySize(tabs) : -1, ntables);
        goto out;
    }
    t = calloc(ntables ? ntables : 1, sizeof *t);
    if (!t) {
        rc = gr_seterr(GR_ENOMEM, "out of memory");
        goto out;
    }
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, tabs)
    {
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(it, "spec");
        char *sj = cJSON_IsObject(spec) ? cJSON_PrintUnformatted(spec) : NULL;
        if (!sj || gr_table_spec_from_json(sj, &t[i].spec) != GR_OK ||
            u64_field(it, "rows", &t[i].rows) != GR_OK ||
            u64_field(it, "keys", &t[i].keys) != GR_OK) {
            free(sj);
            rc = gr_seterr(GR_ECORRUPT, "end section: bad entry for table %zu", i);
            goto out;
        }
        free(sj);
        i++;
    }
out:
    cJSON_Delete(root);
    if (rc != GR_OK) free(t);
    else *out = t;
    return rc;
}
