/* `granary bench train`'s parts, shared between its files: the PyTorch baseline
 * (train_torch.c) and the rounds that give its speed ratio (train_rounds.c). */
#ifndef GRANARY_BENCH_TRAIN_INT_H
#define GRANARY_BENCH_TRAIN_INT_H

#include <stdbool.h>
#include <stddef.h>

/* PyTorch DLRM on dir/train.tsv and dir/test.tsv with granary's DLRM defaults (dim 16, bottom
 * 64,32, top 128,64, Adagrad 0.05 for embeddings, Adam 1e-3 dense, batch 1024) with `threads`
 * torch (and OpenBLAS) threads: examples/s and AUC, or -1 when unavailable, and then
 * gr_bench_torch_why says why. */
void gr_bench_run_torch(const char *dir, unsigned threads, double *eps, double *auc);
extern char gr_bench_torch_why[320];

/* One round of the speed ratio: a fresh `granary train` process with its defaults beside a
 * PyTorch run. */
typedef struct gr_bench_round {
    double eps, auc;             /* granary train's examples/s and test AUC (-1: none) */
    double torch_eps, torch_auc; /* PyTorch's (-1: none) */
    bool torch_first;            /* which of the two ran first */
} gr_bench_round;

/* A round's speed ratio: granary train's examples/s over PyTorch's. */
static inline double gr_bench_round_ratio(const gr_bench_round *r)
{
    return r->eps / r->torch_eps;
}

/* What `granary train` is given besides the files: --no-direct, and --dense-lag L when
 * dense_lag >= 0. */
typedef struct gr_bench_cli_args {
    bool no_direct;
    long dense_lag;
} gr_bench_cli_args;

/* Runs `exe train` (NULL: this binary) on dir's files as a user would, in a child process
 * with only the files and `a` given: its examples/s and test AUC from its metrics JSON.
 * Returns 0, or -1 with a reason in why (cap bytes). */
int gr_bench_cli_train(const char *exe, const char *dir, const gr_bench_cli_args *a,
                       double *eps, double *auc, char *why, size_t cap);

/* n rounds, alternating which runs first (round 0: PyTorch, then granary train; round 1 the
 * other way; ...), PyTorch with `threads` threads. Round 0 takes PyTorch's figures from
 * first_torch_eps / first_torch_auc instead of a new run when first_torch_eps > 0 (a run done
 * just before). Returns the rounds that gave both figures; why says what stopped a round. */
size_t gr_bench_rounds(const char *dir, const gr_bench_cli_args *a, unsigned threads, size_t n,
                       double first_torch_eps, double first_torch_auc, gr_bench_round *out,
                       char *why, size_t cap);

/* The median of the n rounds' ratios granary / PyTorch (the mean of the middle two when n is
 * even); -1 when n is 0. */
double gr_bench_rounds_median_ratio(const gr_bench_round *r, size_t n);

#endif
