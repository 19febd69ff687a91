/* Internal to the cli part: the capacity planner behind `granary plan` (plan.c computes,
 * plan_emit.c writes a kustomize overlay from the result). Pure arithmetic over the table
 * specs, the table engine's own byte accounting (gr_table_estimate_bytes) and a few rates. */
#ifndef GRANARY_CLI_PLAN_H
#define GRANARY_CLI_PLAN_H

#include "granary/table.h"

#define PLAN_MAX_TABLES 256

typedef struct plan_table {
    gr_table_spec spec;
    uint64_t rows;            /* expected rows in the whole cluster */
    double ids_per_example;   /* ids of this table one training example looks up */
    /* Results. */
    gr_table_estimate whole;  /* the table on one shard holding every row */
    gr_table_estimate shard;  /* one shard's part (rows / shards) */
    uint64_t ckpt_bytes_shard; /* one shard's checkpoint file part */
} plan_table;

typedef struct plan_input {
    plan_table tables[PLAN_MAX_TABLES];
    size_t ntables;
    double examples_per_sec;   /* training examples per second, all workers */
    int mode;                  /* gr_train_mode value: 0 async .. 4 hybrid */
    unsigned workers;          /* worker threads (sync staging) */
    uint64_t batch;            /* examples per worker step */
    uint64_t dense_floats;     /* dense parameters (on one shard) */
    uint64_t machine_bytes;    /* memory of one machine (one shard per machine) */
    double headroom;           /* fraction on top of the steady state: growth, buffers */
    unsigned shards;           /* 0: the fewest that fit */
    double disk_bytes_per_sec; /* checkpoint write speed of one shard */
    unsigned cpus;             /* CPUs per shard (its worker threads) */
} plan_input;

typedef struct plan_shard {
    uint64_t rows;             /* rows of one shard, all tables */
    uint64_t table_bytes;      /* its tables, by the engine's accounting */
    uint64_t staging_bytes;    /* sync modes: gradients staged for one step */
    uint64_t dense_bytes;      /* dense parameters and their optimizer state (one shard) */
    uint64_t memory_bytes;     /* the three above */
    uint64_t request_bytes;    /* memory_bytes with the headroom: the pod's request */
    uint64_t restore_peak_bytes; /* a restore into a shard that holds its tables: both */
    double net_in_bytes_per_sec, net_out_bytes_per_sec;
    uint64_t ckpt_bytes;       /* one full checkpoint file */
    double ckpt_seconds;       /* writing it at disk_bytes_per_sec */
} plan_shard;

typedef struct plan_result {
    unsigned shards;
    plan_shard shard;          /* every shard alike (keys spread evenly over slots) */
    uint64_t cluster_rows, cluster_memory_bytes, cluster_ckpt_bytes;
} plan_result;

/* Reads {"tables": [spec + "rows" + "ids_per_example", ...], "examples_per_second",
 * "workers", "batch", "dense_params"} into in (defaults first). GR_EINVAL names what is
 * wrong (file, table, field). */
int plan_read_spec(const char *json, plan_input *in);
/* "N" for every table, or "name=N,name=N" (tables not named keep theirs). */
int plan_set_rows(plan_input *in, const char *list);
/* Computes the plan; GR_ECAPACITY when no shard count up to 16384 fits the machine. */
int plan_compute(plan_input *in, plan_result *out);
/* The plan as JSON (malloc'd). */
char *plan_json(const plan_input *in, const plan_result *r);
/* Writes DIR/kustomization.yaml (and its patches) for the plan on top of base (a path
 * relative to DIR). */
int plan_emit_kustomize(const plan_input *in, const plan_result *r, const char *dir,
                        const char *base);

#endif
