/* granary ckpt: sharded checkpoints of embedding tables — the shard file writer and reader,
 * the manifest, incremental (delta) chains, resharding restore, retention and serving exports.
 *
 * A checkpoint is a directory holding one file per shard ("shard-00001-of-00004.gck") and
 * manifest.json, which is written last: a directory without a manifest is incomplete and is
 * never loaded. Every file is written under a temporary name, fsynced, renamed and the
 * directory fsynced. Checkpoints that share a root directory are named "step-<12 digits>"; a
 * delta names its parent (a sibling directory) in its manifest. docs/checkpoints.md describes
 * every byte and the consistency contract.
 *
 * Errors: functions return 0 or a negative gr_err and set gr_errmsg() with the file and what
 * is wrong. Nothing here aborts on bad input. */
#ifndef GRANARY_CKPT_H
#define GRANARY_CKPT_H

#include "granary/core.h"
#include "granary/table.h"

#define GR_CKPT_VERSION 1
#define GR_CKPT_NAME_MAX 64       /* checkpoint and shard file names, NUL included */
#define GR_CKPT_SHARDS_MAX GR_SLOTS /* a shard owns at least one slot */
#define GR_CKPT_TABLES_MAX 4096   /* tables in one checkpoint */
#define GR_CKPT_CHAIN_MAX 1024    /* deltas on top of one full checkpoint */

typedef enum {
    GR_CKPT_FULL = 0,   /* every row with optimizer state and metadata */
    GR_CKPT_DELTA = 1,  /* rows changed since the parent, plus the set of live keys */
    GR_CKPT_EXPORT = 2, /* weights only (no optimizer state, no metadata), for serving */
} gr_ckpt_kind;

/* "full", "delta" or "export". */
GR_API const char *gr_ckpt_kind_name(gr_ckpt_kind kind);

/* Which shard owns each slot. The default map gives slot s to shard (s * shards) / GR_SLOTS. */
typedef struct gr_ckpt_slot_map {
    uint32_t shards;
    uint32_t owner[GR_SLOTS];
} gr_ckpt_slot_map;

/* Fills the default map; GR_EINVAL when shards is 0 or above GR_CKPT_SHARDS_MAX. */
GR_API int gr_ckpt_slot_map_default(gr_ckpt_slot_map *map, uint32_t shards);
/* GR_EINVAL unless every owner is below shards and every shard owns at least one slot. */
GR_API int gr_ckpt_slot_map_validate(const gr_ckpt_slot_map *map);

/* "step-000000001234" for a step. out must hold GR_CKPT_NAME_MAX bytes. */
GR_API void gr_ckpt_name(uint64_t step, char *out);
/* "shard-00001-of-00004.gck". out must hold GR_CKPT_NAME_MAX bytes. */
GR_API void gr_ckpt_shard_file_name(uint32_t shard, uint32_t shards, char *out);

/* ---- Writing one shard's file (what a server calls for "save my tables as shard I of N") -- */

typedef struct gr_ckpt_write_opts {
    gr_ckpt_kind kind;
    uint32_t shard, shards; /* this file is shard `shard` of `shards` */
    uint64_t step;          /* training step the checkpoint is taken at */
    int zstd_level;         /* 0 = sections stored raw; 1..19 = zstd-compressed sections */
    bool export_f16;        /* GR_CKPT_EXPORT only: weights stored as IEEE half floats */
    uint32_t buffer_mib;    /* rows copied ahead of the disk, MiB (0 = 64); up to 3x while one
                               partition is copied, so the scan never waits under its lock */
    /* Testing hook: fail the save with GR_EIO once this many rows were written (0 = off).
     * Lets tests exercise "a save failed after its dirty marks were consumed". */
    uint64_t fault_after_rows;
} gr_ckpt_write_opts;

typedef struct gr_ckpt_file_info {
    char name[GR_CKPT_NAME_MAX]; /* file name inside the checkpoint directory */
    uint32_t shard, shards;
    gr_ckpt_kind kind;
    uint64_t step;
    uint64_t size;        /* bytes, the trailer included */
    uint64_t checksum;    /* XXH3-64 of the file's bytes before its 32-byte trailer */
    uint64_t rows;        /* rows written, all tables */
    uint64_t keys;        /* live keys written (deltas), all tables */
    double seconds;       /* wall time of the write, fsyncs included */
    double sync_seconds;  /* of which the final fsync of the file */
} gr_ckpt_file_info;

/* Writes the rows of tables[0..ntables) as one shard file into dir (created if missing).
 *  FULL:   clears the tables' checkpoint dirty marks (tracker 0), lists every key
 *          (gr_table_scan), then reads the rows in batches (gr_table_get); rows updated during
 *          the save are in this file or the next delta (or both), rows created during it are
 *          in the next delta.
 *  DELTA:  gr_table_scan_dirty(t, 0, ...): the rows applied to or inserted since the previous
 *          save of these tables, then every live key (so a restore drops deleted rows).
 *  EXPORT: like FULL, key and weights only; dirty marks are left alone.
 * Table locks are held only to copy a slice of rows or keys, never while waiting for the
 * disk; a writer thread checksums, compresses and writes behind the reads.
 * If a FULL or DELTA save fails, dirty marks may already be consumed: the next save of these
 * tables must be FULL (gr_ckpt_saver does this by itself). info may be NULL. */
GR_API int gr_ckpt_write_shard(const char *dir, gr_table *const *tables, size_t ntables,
                               const gr_ckpt_write_opts *opts, gr_ckpt_file_info *info);

typedef struct gr_ckpt_commit_opts {
    uint32_t shards;             /* how many shard files the checkpoint has */
    const gr_ckpt_slot_map *map; /* slot map the shards used; NULL = default for shards */
    const char *parent;          /* parent checkpoint's name (sibling directory); needed when
                                    any file is a delta, else NULL */
} gr_ckpt_commit_opts;

/* Completes a checkpoint once every shard file is written: reads each file's trailer and
 * summary, checks they agree (step, tables, kind), checks the parent and every part are
 * complete, then writes manifest.json atomically. Until then the checkpoint does not exist
 * for readers. */
GR_API int gr_ckpt_commit(const char *dir, const gr_ckpt_commit_opts *opts);
/* gr_ckpt_commit with parts: subdirectories of dir that are complete checkpoints of their own
 * and belong to this one (the servers' dense parameters, "dense-I-of-N"). Each must be
 * committed already; the manifest lists them ("parts"), verify reads them, and a load through
 * the servers refuses the checkpoint when one is missing. */
GR_API int gr_ckpt_commit_parts(const char *dir, const gr_ckpt_commit_opts *opts,
                                const char *const *parts, size_t nparts);

/* ---- The manifest ---- */

typedef struct gr_ckpt_manifest_file {
    uint32_t shard;
    gr_ckpt_kind kind; /* a delta checkpoint may hold full files (a shard that had to restart) */
    char name[GR_CKPT_NAME_MAX];
    uint64_t size, checksum;
    uint64_t *rows; /* per table (manifest order) */
    uint64_t *keys; /* per table: live keys recorded (delta files), else 0 */
} gr_ckpt_manifest_file;

typedef struct gr_ckpt_manifest {
    uint32_t version;
    gr_ckpt_kind kind; /* FULL when every file is full, DELTA when any is, or EXPORT */
    uint64_t step;
    uint64_t created;                  /* wall clock, seconds */
    char parent[GR_CKPT_NAME_MAX];     /* "" when none */
    char compression[16];              /* "none" or "zstd" */
    bool weights_f16;                  /* exports only */
    gr_ckpt_slot_map map;              /* map.shards = number of files */
    size_t ntables;
    gr_table_spec *tables;
    gr_ckpt_manifest_file *files;      /* map.shards entries, files[i].shard == i */
    size_t nparts;                     /* sub-checkpoints (gr_ckpt_commit_opts.parts) */
    char (*parts)[GR_CKPT_NAME_MAX];
} gr_ckpt_manifest;

/* Reads DIR/manifest.json. GR_ENOENT "incomplete checkpoint" when there is none. */
GR_API int gr_ckpt_manifest_read(const char *dir, gr_ckpt_manifest **out);
/* Parses manifest JSON (len bytes, need not be NUL-terminated); every field is checked. */
GR_API int gr_ckpt_manifest_parse(const char *json, size_t len, gr_ckpt_manifest **out);
/* Serialises a manifest; malloc'd string the caller frees, NULL when out of memory. */
GR_API char *gr_ckpt_manifest_to_json(const gr_ckpt_manifest *m);
GR_API void gr_ckpt_manifest_destroy(gr_ckpt_manifest *m);
/* Index of the table named name in m->tables, or -1. */
GR_API long gr_ckpt_manifest_table(const gr_ckpt_manifest *m, const char *name);

/* ---- Restore ("load from DIR the rows whose slots I own") ---- */

typedef struct gr_ckpt_load_opts {
    uint32_t shard, shards;      /* the target tables are shard `shard` of `shards` (0 of 1:
                                    everything) */
    const gr_ckpt_slot_map *map; /* target slot map; NULL = default for shards */
    uint32_t threads;            /* threads that read and insert rows at once (the caller's
                                    included); 0 = one per online CPU, at most 8. The result
                                    is the same for every count. */
} gr_ckpt_load_opts;

typedef struct gr_ckpt_load_stats {
    uint32_t checkpoints; /* length of the chain applied (1 for a full checkpoint) */
    uint32_t files;       /* shard files read */
    uint64_t bytes;       /* bytes read */
    uint64_t rows_read;   /* rows decoded, before filtering by slot */
    uint64_t rows_loaded; /* rows inserted into the target tables */
    uint64_t rows_dropped;/* rows skipped because a later delta no longer lists their key */
} gr_ckpt_load_stats;

/* Restores checkpoint dir into tables[0..ntables), each matched by name to a table of the
 * checkpoint: follows the parent chain to its full checkpoint and applies full, then each
 * delta in order, inserting only the rows whose slot the target shard owns and whose key the
 * newest checkpoint lists as live. Checkpoint tables not among the targets are skipped.
 * Before inserting anything it checks every manifest in the chain, every file's presence,
 * size and trailer, and each target's spec (gr_table_spec_equal; for an export, name and dim);
 * each section's checksum is verified before its rows are inserted. On error the targets may
 * hold part of the checkpoint: discard them. opts NULL = shard 0 of 1; stats may be NULL. */
GR_API int gr_ckpt_load(const char *dir, gr_table *const *tables, size_t ntables,
                        const gr_ckpt_load_opts *opts, gr_ckpt_load_stats *stats);

/* Creates one table per table of the checkpoint (specs from its manifest) and loads shard
 * `shard` of `shards` into them. *tables (free() it, after destroying each table) and *n. */
GR_API int gr_ckpt_load_new(const char *dir, const gr_ckpt_load_opts *opts, gr_table ***tables,
                            size_t *n, gr_ckpt_load_stats *stats);

/* ---- Verification, resharding, exports ---- */

typedef struct gr_ckpt_verify_stats {
    uint32_t checkpoints, files;
    uint64_t bytes, sections, rows, keys;
} gr_ckpt_verify_stats;

/* Reads every byte of every file of dir (and, with chain, of its ancestors): file sizes and
 * checksums, every section header and payload checksum, row counts against the manifest and
 * table specs against the manifest. The first failure's message names the file, the section
 * and what is wrong. stats may be NULL. */
GR_API int gr_ckpt_verify(const char *dir, bool chain, gr_ckpt_verify_stats *stats);

/* Rewrites checkpoint src (its chain flattened) as a full checkpoint of `shards` shards in dst
 * (which must not hold a manifest), with the default slot map. Holds one target shard's rows
 * in memory at a time. zstd_level as in gr_ckpt_write_opts. */
GR_API int gr_ckpt_reshard(const char *src, const char *dst, uint32_t shards, int zstd_level);

/* One-process export for serving: tables as shard 0 of 1 of an EXPORT checkpoint in dir,
 * recorded at `step` (weights only; f16 halves it). Dirty marks are not touched. */
GR_API int gr_ckpt_export(const char *dir, gr_table *const *tables, size_t ntables,
                          uint64_t step, bool f16, int zstd_level, gr_ckpt_file_info *info);

/* ---- Opening files of a checkpoint directory ---- */

/* Every file read from a checkpoint directory is opened with these, so that a FIFO, a device
 * or a directory in place of a file is refused at once (never waited on) and a metadata file
 * is sized before a byte of it is read. */
#define GR_CKPT_MANIFEST_MAX (64u << 20) /* manifest.json */
#define GR_CKPT_META_MAX (16u << 20)     /* user.json, dense.json */

/* Opens path read-only without blocking and checks that it is a regular file: *fd (the
 * caller closes it) and *size. GR_ENOENT when missing, GR_ECORRUPT when it is not a regular
 * file, GR_EIO otherwise. */
GR_API int gr_ckpt_open_regular(const char *path, int *fd, uint64_t *size);
/* Reads a whole regular file of at most max bytes into a NUL-terminated buffer (*out, the
 * caller frees it). GR_ETOOBIG, naming the size and the limit, before anything is read. */
GR_API int gr_ckpt_read_small(const char *path, size_t max, char **out, size_t *len);

/* ---- A root of checkpoints: the newest, retention ---- */

/* The newest complete checkpoint ("step-*" with a manifest) under root: its name and step.
 * GR_ENOENT when there is none. Incomplete directories and temporary files are ignored. */
GR_API int gr_ckpt_latest(const char *root, char *name_out, uint64_t *step_out);

/* Keeps the newest `keep` complete checkpoints under root and every checkpoint their delta
 * chains need; deletes the other complete ones (manifest first, so a half-deleted checkpoint
 * is never taken for a complete one), incomplete "step-*" directories older than the newest
 * complete checkpoint, and temporary files left in kept checkpoints. keep 0 = keep all
 * (still cleans). *deleted (may be NULL) gets how many checkpoints were removed. */
GR_API int gr_ckpt_retain(const char *root, uint32_t keep, uint32_t *deleted);

/* What a path names, as `granary train --resume` reads it: a checkpoint directory itself
 * (it holds manifest.json) or a root of checkpoints (its newest complete one). dir_out (cap
 * bytes) gets the checkpoint directory. GR_ENOENT naming the path when it does not exist or
 * holds no complete checkpoint. */
GR_API int gr_ckpt_resolve(const char *path, char *dir_out, size_t cap);

/* One "step-N" directory of a root, as gr_ckpt_list reports it. */
typedef struct gr_ckpt_entry {
    char name[GR_CKPT_NAME_MAX];
    uint64_t step;
    bool complete;     /* manifest present and, for a delta, its whole chain present */
    bool has_manifest; /* false: a save that never committed (or was interrupted) */
    gr_ckpt_kind kind; /* from the manifest (FULL when there is none) */
    uint64_t created;  /* manifest time, unix seconds (0 without a manifest) */
    uint64_t bytes;    /* bytes on disk: every regular file in it and its subdirectories */
    char parent[GR_CKPT_NAME_MAX];
} gr_ckpt_entry;

/* Every "step-N" directory under root, newest first (*out: free() it). */
GR_API int gr_ckpt_list(const char *root, gr_ckpt_entry **out, size_t *n);

/* ---- Dense parameters (the servers' "dense-I-of-N" parts) ---- */

/* A dense parameter of a checkpoint: a named flat float array. The servers store each one in
 * the dense part of the shard that owns it, as a table of chunk rows (keys 0, 1, ...; the
 * chunk is min(size, GR_TABLE_DIM_MAX) floats), named with its size in the part's dense.json. */
typedef struct gr_ckpt_dense_info {
    char name[GR_TABLE_NAME_MAX];
    uint64_t size;               /* floats */
    char part[GR_CKPT_NAME_MAX]; /* the part (subdirectory) that holds it */
} gr_ckpt_dense_info;

/* Every dense parameter of checkpoint dir, over all its parts (*out: free() it; *n may be 0:
 * a checkpoint written without dense parts). A dense part listed in dense.json but missing,
 * or a malformed dense.json, is an error naming the file. */
GR_API int gr_ckpt_dense_list(const char *dir, gr_ckpt_dense_info **out, size_t *n);
/* Reads the dense parameter `name` of checkpoint dir into a malloc'd array (*values, *n
 * floats). GR_ENOENT when the checkpoint has no dense parameter of that name. */
GR_API int gr_ckpt_dense_read(const char *dir, const char *name, float **values, uint64_t *n);

/* A complete export for serving (docs/checkpoints.md, "Export for serving"): from checkpoint
 * src (a checkpoint or a root: its newest), writes into dst (which must not hold a manifest)
 * every embedding table weights only (f16 on request), every dense parameter in f32 as the
 * part dense-00000-of-00001 (weights only), and the trainer's metadata (user.json: the
 * model's kind, shapes and settings), then the manifest, last. */
typedef struct gr_ckpt_export_info {
    uint64_t step;
    uint64_t rows;        /* embedding rows written */
    uint64_t bytes;       /* bytes written, dense part included */
    uint32_t dense;       /* dense parameters written */
    uint64_t dense_floats;
    bool has_meta;        /* the trainer's metadata was copied */
} gr_ckpt_export_info;

GR_API int gr_ckpt_export_dir(const char *src, const char *dst, bool f16, int zstd_level,
                              gr_ckpt_export_info *info);

/* The trainer's metadata beside checkpoint dir (user.json) as a malloc'd string, or *out NULL
 * when there is none. */
GR_API int gr_ckpt_read_user(const char *dir, char **out);

/* ---- The saver: full/delta policy with automatic recovery ---- */

typedef struct gr_ckpt_saver_opts {
    uint32_t shard, shards; /* this process's shard (0 of 1 for a single process) */
    bool incremental;       /* write deltas when allowed (else every save is full) */
    uint32_t full_every;    /* at most full_every - 1 deltas after a full (0 = no bound) */
    int zstd_level;
    uint32_t keep;          /* gr_ckpt_saver_save: retention after each save (0 = keep all) */
} gr_ckpt_saver_opts;

typedef struct gr_ckpt_saver gr_ckpt_saver;

/* A saver for checkpoints under root (created if missing). opts NULL = shard 0 of 1, full
 * saves, no compression, keep all. */
GR_API int gr_ckpt_saver_create(const char *root, const gr_ckpt_saver_opts *opts,
                                gr_ckpt_saver **out);
GR_API void gr_ckpt_saver_destroy(gr_ckpt_saver *s);

/* Writes this shard's file of checkpoint root/name. It is a delta only when incremental is on,
 * `parent` (may be NULL) is the checkpoint this saver last wrote successfully, that
 * checkpoint is committed with this saver's file in it (its manifest lists the same
 * checksum), and the full_every bound allows; otherwise full. A failed write makes the next
 * one full. The caller commits (gr_ckpt_commit) once every shard wrote. */
GR_API int gr_ckpt_saver_write(gr_ckpt_saver *s, const char *name, const char *parent,
                               uint64_t step, gr_table *const *tables, size_t ntables,
                               gr_ckpt_file_info *info);

/* One-process save (shards must be 1): writes root/step-<step> (delta on the previous one
 * when allowed), commits it and applies retention. name_out (GR_CKPT_NAME_MAX bytes, may be
 * NULL) gets the name. In sync training call it between steps: the checkpoint then holds
 * exactly the state after `step`. */
GR_API int gr_ckpt_saver_save(gr_ckpt_saver *s, uint64_t step, gr_table *const *tables,
                              size_t ntables, char *name_out, gr_ckpt_file_info *info);

/* The next write is full whatever the policy says (e.g. after the tables were restored). */
GR_API void gr_ckpt_saver_force_full(gr_ckpt_saver *s);
/* Testing hook: the next write fails with GR_EIO after this many rows (0 = off). */
GR_API void gr_ckpt_saver_set_fault(gr_ckpt_saver *s, uint64_t after_rows);

#endif
