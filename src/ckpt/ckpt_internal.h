/* Internal to the ckpt part: the shard file's byte layout (docs/checkpoints.md is the prose
 * version) and the shard file reader that verify, load, commit and
 * the fuzz target share. Little-endian host assumed (checked below). */
#ifndef GRANARY_CKPT_INTERNAL_H
#define GRANARY_CKPT_INTERNAL_H

#include "granary/ckpt.h"

#include <stdio.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "granary's checkpoint format is little-endian and the code assumes a little-endian host"
#endif

/* File layout:
 *   file header (64 bytes)
 *   per table: TABLE section, ROWS sections, (delta) KEYS sections
 *   END section (JSON summary)
 *   trailer (32 bytes)
 * Every section = 56-byte header + payload; the header carries the payload's XXH3-64 and its
 * own. */
#define CK_MAGIC "GRNRYCKP"
#define CK_TAIL_MAGIC "GRNRYEND"
#define CK_HEADER_SIZE 64u
#define CK_SECTION_SIZE 56u
#define CK_TAIL_SIZE 32u
#define CK_SECTION_MAGIC 0x54434553u /* "SECT" */

enum { CK_SEC_TABLE = 1, CK_SEC_ROWS = 2, CK_SEC_KEYS = 3, CK_SEC_END = 4 };
enum { CK_CODEC_NONE = 0, CK_CODEC_ZSTD = 1 };
enum { CK_W_F32 = 0, CK_W_F16 = 1 };
#define CK_FLAG_F16 1u

/* Reader limits: anything larger is corrupt (the writer stays far below them). */
#define CK_ROWS_RAW_MAX (64ull << 20)   /* one ROWS or KEYS section, uncompressed */
#define CK_TABLE_RAW_MAX (64ull << 10)  /* one TABLE section */
#define CK_END_RAW_MAX (16ull << 20)    /* the END section */
#define CK_BLOCK_BYTES (1u << 20)       /* the writer's section size: one lock wait at most */

typedef struct ck_file_header {
    char magic[8];
    uint32_t version;
    uint32_t kind;
    uint32_t shard, shards;
    uint64_t step;
    uint32_t ntables;
    uint32_t flags;
    uint64_t created;
    uint64_t reserved;
    uint64_t checksum; /* XXH3-64 of the 56 bytes above */
} ck_file_header;
_Static_assert(sizeof(ck_file_header) == CK_HEADER_SIZE, "file header layout");

typedef struct ck_section {
    uint32_t magic;
    uint16_t type;
    uint16_t codec;
    uint32_t table;
    uint32_t reserved;
    uint64_t count;
    uint64_t raw_len;
    uint64_t stored_len;
    uint64_t payload_checksum; /* XXH3-64 of the stored (possibly compressed) payload */
    uint64_t checksum;         /* XXH3-64 of the 48 bytes above */
} ck_section;
_Static_assert(sizeof(ck_section) == CK_SECTION_SIZE, "section header layout");

typedef struct ck_tail {
    uint64_t end_offset;       /* where the END section's header starts */
    uint64_t content_checksum; /* XXH3-64 of bytes [0, size - 32) */
    uint64_t content_size;     /* size - 32 */
    char magic[8];
} ck_tail;
_Static_assert(sizeof(ck_tail) == CK_TAIL_SIZE, "trailer layout");

/* The fixed part of a TABLE section's payload, followed by json_len bytes of spec JSON. */
typedef struct ck_table_info {
    uint32_t dim;
    uint32_t state_floats; /* 0 in exports */
    uint32_t weight_type;  /* CK_W_F32 / CK_W_F16 */
    uint32_t has_meta;     /* 0 in exports */
    uint32_t json_len;
    uint32_t reserved;
} ck_table_info;
_Static_assert(sizeof(ck_table_info) == 24, "table info layout");

/* Bytes of one row in a ROWS payload (key + weights + state + meta). */
static inline uint64_t ck_row_bytes(const ck_table_info *ti)
{
    return 8u + (uint64_t)ti->dim * (ti->weight_type == CK_W_F16 ? 2u : 4u) +
           (uint64_t)ti->state_floats * 4u + (ti->has_meta ? 8u : 0u);
}


/* ---- Reader ---- */

typedef struct ck_table_desc {
    ck_table_info info;
    gr_table_spec spec;
    bool seen;
} ck_table_desc;

/* What reading a compressed payload needs besides the output: the compressed bytes and a
 * zstd context. One per thread reading payloads. */
typedef struct ck_scratch {
    unsigned char *stored;
    size_t stored_cap;
    void *zctx; /* ZSTD_DCtx, lazily */
} ck_scratch;

typedef struct ck_reader {
    int fd;
    bool own_fd;
    bool verify;        /* check checksums (the fuzz target turns this off to reach decoders) */
    char path[4096];    /* for messages */
    uint64_t size;
    ck_file_header hdr;
    ck_tail tail;
    uint64_t off;       /* next section header */
    uint64_t payload_off; /* payload of the section ck_reader_next returned last */
    void *hash;         /* XXH3_state_t fed with every byte read in order (verify), or NULL */
    uint32_t nsection;  /* sections read so far */
    ck_table_desc *tables; /* hdr.ntables entries, filled as TABLE sections are read */
    ck_scratch scratch; /* ck_reader_payload's */
} ck_reader;

/* Opens a shard file and checks its header and trailer. expect_size 0 = not checked. */
int ck_reader_open(ck_reader *r, const char *path, uint64_t expect_size);
/* Same over an open descriptor of `size` bytes (the fuzz target's memfd). Takes no ownership. */
int ck_reader_open_fd(ck_reader *r, int fd, uint64_t size, const char *label, bool verify);
void ck_reader_close(ck_reader *r);
/* Reads the next section header (1), or 0 after the END section. */
int ck_reader_next(ck_reader *r, ck_section *s);
/* Reads and verifies the payload of the section just returned by ck_reader_next into
 * *buf (grown as needed; raw bytes after decompression). */
int ck_reader_payload(ck_reader *r, const ck_section *s, unsigned char **buf, size_t *cap);
/* ck_reader_payload for a section whose header was read before (at payload_off, section
 * number nsec for messages), with the caller's scratch: several threads may read payloads of
 * one reader at once. hash (an XXH3 state or NULL) is fed the stored bytes. */
int ck_payload_at(const ck_reader *r, const ck_section *s, uint64_t payload_off, uint32_t nsec,
                  unsigned char **buf, size_t *cap, ck_scratch *sc, void *hash);
void ck_scratch_fini(ck_scratch *sc);
/* Parses a TABLE payload into r->tables[s->table]. */
int ck_reader_table(ck_reader *r, const ck_section *s, const unsigned char *p);
/* Reads the END section the trailer points at (JSON, NUL-terminated; caller frees). */
int ck_reader_end_json(ck_reader *r, char **json);
/* Message prefix "PATH: section N at offset O". */
const char *ck_where(const ck_reader *r, char *buf, size_t cap);

/* Column pointers into a ROWS payload of `count` rows. */
typedef struct ck_rows {
    const uint64_t *keys;
    const void *weights; /* f32 or f16 */
    const float *state;  /* NULL when state_floats == 0 */
    const gr_row_meta *meta; /* NULL when !has_meta */
} ck_rows;
void ck_rows_view(const ck_table_info *ti, const unsigned char *p, uint64_t count, ck_rows *v);

/* Summary from an END section: per table spec, rows, keys. */
typedef struct ck_end_table {
    gr_table_spec spec;
    uint64_t rows, keys;
} ck_end_table;
int ck_end_parse(const char *json, size_t ntables_expect, ck_end_table **out);

/* ---- Writer internals shared with reshard ---- */

/* gr_ckpt_write_shard with the specs written into the file overridden (reshard writes the
 * source's specs from tables created without capacity/memory caps). specs may be NULL. */
int ck_write_shard(const char *dir, gr_table *const *tables, const gr_table_spec *specs,
                   size_t ntables, const gr_ckpt_write_opts *o, gr_ckpt_file_info *info);

/* A checkpoint and its ancestors, newest first (the full checkpoint last). */
typedef struct ck_chain {
    size_t len, cap;
    gr_ckpt_manifest **m;
    char (*dir)[4096];
} ck_chain;
/* Reads dir's manifest and, with follow, its parents' (which must be complete). */
int ck_chain_read(const char *dir, bool follow, ck_chain **out);
void ck_chain_free(ck_chain *c);
/* Opens file i of checkpoint m in dir and checks size, trailer checksum and header against the
 * manifest. */
int ck_open_checked(ck_reader *r, const char *dir, const gr_ckpt_manifest *m, uint32_t i);

/* gr_ckpt_load comparing the checkpoint's specs with specs[i] instead of the targets' own
 * (reshard's staging tables have no caps). specs may be NULL. */
int ck_load(const char *dir, gr_table *const *tables, const gr_table_spec *specs, size_t ntables,
            const gr_ckpt_load_opts *opts, gr_ckpt_load_stats *stats);

/* Inserts every ROWS section of an open shard file into the tables with the same name (the
 * fuzz target's entry to the restore path; no slot filter, no live set). */
int ck_apply_file(ck_reader *r, gr_table *const *tables, size_t ntables, bool export,
                  gr_ckpt_load_stats *st);

/* Spec comparison message: "field 'dim': checkpoint 16, table 32". */
void ck_spec_diff(const gr_table_spec *ckpt, const gr_table_spec *table, char *buf, size_t cap);

/* The one check of a row's values that the writer and the loader share, so that nothing is
 * committed that a restore would refuse: every weight finite (and, for f16 storage, within
 * the half-float range, as gr_f32_to_f16 would otherwise store inf) and every state value
 * finite. GR_ECORRUPT naming `where` (a file, or "save"), the table, the key and the element. */
int ck_check_row(const char *where, const char *table, uint64_t key, const float *w,
                 uint32_t dim, bool f16, const float *state, uint32_t nstate);

/* CPUs online (at least 1): how many threads a restore uses by default. */
uint32_t ck_online_cpus(void);
/* Joins dir and name into buf; GR_EINVAL when it does not fit. */
int ck_path(char *buf, size_t cap, const char *dir, const char *name);
/* Parent directory of a checkpoint dir (for resolving a parent name). */
void ck_dirname(const char *dir, char *buf, size_t cap);
/* mkdir -p for one level (parent must exist); ok if it exists. */
int ck_mkdir(const char *dir);
/* Removes a directory tree (files and subdirectories). */
int ck_rmtree(const char *dir);
/* True when name is "step-" followed by digits; *step gets the number. */
bool ck_parse_name(const char *name, uint64_t *step);

#endif
