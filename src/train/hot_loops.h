/* GR_HOT_LOOPS: the attribute that builds a loop of a training step three times (baseline,
 * AVX2, AVX-512 / x86-64-v4), picked at load time by what the CPU has (model.c, interact.c). */
#ifndef GRANARY_TRAIN_HOT_LOOPS_H
#define GRANARY_TRAIN_HOT_LOOPS_H

/* Every loop so marked works on independent lanes and keeps each sum in the scalar order, and
 * the build does not contract a * b + c into one instruction (-std=c11 means
 * -ffp-contract=off), so every copy gives bitwise the same results. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                          \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
/* Not under the sanitizers: the copy is picked by an ifunc resolver that runs while the
 * program is being relocated, before their runtimes are up (it crashed under TSan). */
#define GR_HOT_LOOPS __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define GR_HOT_LOOPS
#endif

#endif
