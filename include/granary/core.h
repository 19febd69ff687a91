/* granary core: errors, logging, time, hashing, random numbers, small helpers.
 * Every other part includes this header. Nothing here allocates behind the caller's back
 * except where a function says so. */
#ifndef GRANARY_CORE_H
#define GRANARY_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#if defined(GR_BUILDING)
#define GR_API __attribute__((visibility("default")))
#else
#define GR_API
#endif

#define GR_VERSION_STRING "0.1.0"

/* Errors are negative values; 0 is success. gr_strerror() names the class; the thread-local
 * detail message set by the failing call (gr_errmsg()) says what exactly was wrong. */
#define GR_ERRORS(X)                                                     \
    X(GR_OK, 0, "success")                                               \
    X(GR_EINVAL, -1, "invalid argument")                                 \
    X(GR_ENOMEM, -2, "out of memory or memory cap reached")              \
    X(GR_ENOENT, -3, "not found")                                        \
    X(GR_EEXIST, -4, "already exists")                                   \
    X(GR_EDIM, -5, "dimension mismatch")                                 \
    X(GR_EIO, -6, "I/O error")                                           \
    X(GR_EPROTO, -7, "malformed message")                                \
    X(GR_ETOOBIG, -8, "limit exceeded")                                  \
    X(GR_EAUTH, -9, "authentication failed")                             \
    X(GR_ETIMEDOUT, -10, "timed out")                                    \
    X(GR_ECONN, -11, "connection failed")                                \
    X(GR_EVERSION, -12, "unsupported version")                           \
    X(GR_ECORRUPT, -13, "corrupt data")                                  \
    X(GR_ESHUTDOWN, -14, "shutting down")                                \
    X(GR_EAGAIN, -15, "try again")                                       \
    X(GR_ESTALE, -16, "stale")                                           \
    X(GR_EBUSY, -17, "busy")                                             \
    X(GR_ECAPACITY, -18, "capacity reached")                             \
    X(GR_EINTERNAL, -19, "internal error")

typedef enum {
#define GR_ERR_ENUM(name, value, text) name = value,
    GR_ERRORS(GR_ERR_ENUM)
#undef GR_ERR_ENUM
} gr_err;

/* Short, static description of an error class. Never NULL. */
GR_API const char *gr_strerror(int err);
/* Detail message of the last error set on this thread (""), valid until the next error. */
GR_API const char *gr_errmsg(void);
/* Sets this thread's detail message and returns err, for `return gr_seterr(...)`. */
GR_API int gr_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears this thread's detail message. */
GR_API void gr_clearerr(void);

/* Logging to stderr with a timestamp. Level from GRANARY_LOG (error|warn|info|debug). */
typedef enum { GR_LOG_ERROR = 0, GR_LOG_WARN = 1, GR_LOG_INFO = 2, GR_LOG_DEBUG = 3 } gr_log_level;
GR_API void gr_log_set_level(gr_log_level level);
GR_API gr_log_level gr_log_get_level(void);
GR_API void gr_log(gr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define GR_LOGE(...) gr_log(GR_LOG_ERROR, __VA_ARGS__)
#define GR_LOGW(...) gr_log(GR_LOG_WARN, __VA_ARGS__)
#define GR_LOGI(...) gr_log(GR_LOG_INFO, __VA_ARGS__)
#define GR_LOGD(...) gr_log(GR_LOG_DEBUG, __VA_ARGS__)

/* Sockets. On a TCP connection to a loopback peer, picks a congestion control that does not
 * pace (cubic, else reno): pacing only costs where there is no link. Returns whether it did;
 * other peers (and Unix sockets) are left as they are. */
GR_API bool gr_sock_unpaced_loopback(int fd);

/* Scheduling. Asks the kernel for a time slice of `us` microseconds (100 to 100000) for the
 * calling thread, which stays SCHED_OTHER with its weight: on Linux 6.12 and later (EEVDF's
 * custom slices) a thread with a short slice that wakes runs ahead of, and preempts, threads
 * on the default slice, so a thread answering short requests does not wait behind another's
 * slice. 0 goes back to the kernel's default. GR_EINVAL where the kernel has no custom
 * slices (the thread runs as before). */
GR_API int gr_thread_set_slice_us(unsigned us);
/* The same, best effort, for threads that only prefer a short slice: 0 does nothing; where the
 * kernel keeps its own, a debug line says that `who` does and the error is cleared. */
GR_API void gr_thread_want_slice_us(unsigned us, const char *who);

/* Time. */
GR_API uint64_t gr_now_ns(void);   /* monotonic clock */
GR_API uint64_t gr_thread_cpu_ns(void); /* CPU time of the calling thread (a syscall: ~0.3 us) */
GR_API double gr_now_s(void);      /* monotonic clock, seconds */
GR_API uint64_t gr_wall_s(void);   /* wall clock, seconds since the epoch */
GR_API void gr_sleep_ms(unsigned ms);

/* Hashing (XXH3). gr_hash_key is the fixed hash every part uses for a uint64 key; its
 * value is part of the on-disk and on-wire contract and never changes. */
GR_API uint64_t gr_hash64(const void *data, size_t len, uint64_t seed);
GR_API uint64_t gr_hash_key(uint64_t key, uint64_t seed);
/* A random nonzero id (the kernel's random bytes mixed with the time and the pid), for ids
 * that two processes must never share: a trainer's job owner, a job's run id. */
GR_API uint64_t gr_random_id(void);
/* Checksum of a byte range (XXH3-64), used by checkpoint files. */
GR_API uint64_t gr_checksum(const void *data, size_t len);

/* Slots: keys map to one of GR_SLOTS slots by a fixed hash; a slot map assigns slots to
 * shards. */
#define GR_SLOTS 16384u
GR_API uint32_t gr_slot_of(uint64_t key);
/* gr_slot_of of n keys into slots (n entries): the same values, without a call per key. */
GR_API void gr_slots_of(const uint64_t *keys, size_t n, uint32_t *slots);

/* ---- Formats shared by the wire, the checkpoint files and every part (src/core/formats.c).
 * Each is defined here once; the names other headers use for them are aliases. ---- */

/* The default slot map: slot s belongs to shard (s * shards) / GR_SLOTS (contiguous ranges).
 * Clients route by it, shards refuse keys it does not give them, checkpoints record it. */
GR_API uint32_t gr_slot_shard(uint32_t slot, uint32_t shards);

/* IEEE 754 half <-> single, round to nearest even; every half value survives
 * f16 -> f32 -> f16 exactly (NaNs stay quiet NaNs). f16 tables and f16 exports use them. */
GR_API uint16_t gr_f32_to_f16(float f);
GR_API float gr_f16_to_f32(uint16_t h);

/* Sync modes of a training job, with the values they have on the wire (SYNC_CONFIG) and in
 * configs (docs/sync.md). */
typedef enum {
    GR_SYNC_ASYNC = 0,
    GR_SYNC_SYNC = 1,
    GR_SYNC_SEMISYNC = 2,
    GR_SYNC_SSP = 3,
} gr_sync_mode;
/* "async", "sync", "semisync", "ssp"; "unknown" for any other value. Never NULL. */
GR_API const char *gr_sync_mode_name(uint32_t mode);
/* Parses one of those names; GR_EINVAL naming the bad word otherwise. */
GR_API int gr_sync_mode_parse(const char *s, gr_sync_mode *out);

/* Read-only access, one bit with one value everywhere: a pull or lookup with it reads the
 * default row for a missing key and creates nothing. It is also the bit in the wire header's
 * flags (GR_PROTO_F_READONLY), so the server passes it through unchanged. */
#define GR_READONLY 1u

/* Deterministic pseudo-random numbers (splitmix64 seeding xoshiro256**). */
typedef struct gr_rng { uint64_t s[4]; } gr_rng;
GR_API void gr_rng_seed(gr_rng *r, uint64_t seed);
GR_API uint64_t gr_rng_next(gr_rng *r);
GR_API double gr_rng_uniform(gr_rng *r);             /* [0, 1) */
GR_API double gr_rng_normal(gr_rng *r);              /* standard normal */
GR_API uint64_t gr_splitmix64(uint64_t *state);

/* Zipf(s) sampler over ranks 1..n (rejection-inversion, Hörmann & Derflinger): O(1) per
 * draw, no table. Returns a rank in [1, n]. */
typedef struct gr_zipf {
    double s, n, h_x1, h_n, c;
} gr_zipf;
GR_API int gr_zipf_init(gr_zipf *z, uint64_t n, double s);
GR_API uint64_t gr_zipf_draw(const gr_zipf *z, gr_rng *r);

/* Deduplicate n keys: writes the unique keys (in first-seen order) to uniq, and for every
 * input position i the index of its key in uniq to inverse[i]. Returns the number of unique
 * keys, or a negative gr_err. uniq must hold n keys, inverse n entries. Allocates a scratch
 * hash map of about 16*n bytes per call unless a gr_dedup_scratch is given. */
typedef struct gr_dedup_scratch { uint64_t *slots; uint32_t *idx; size_t cap; } gr_dedup_scratch;
GR_API long gr_dedup(const uint64_t *keys, size_t n, uint64_t *uniq, uint32_t *inverse,
                     gr_dedup_scratch *scratch);
GR_API void gr_dedup_scratch_fini(gr_dedup_scratch *scratch);

/* Reads a whole file into a NUL-terminated buffer the caller frees. The file is opened
 * without blocking and must be a regular file (else GR_EINVAL) of at most GR_READ_FILE_MAX
 * bytes (else GR_ETOOBIG); GR_ENOENT when it does not exist, GR_EIO on other failures. */
#define GR_READ_FILE_MAX (64ull << 20)
GR_API int gr_read_file(const char *path, char **out, size_t *len_out);
/* Writes data to path atomically: temporary file, fsync, rename, fsync of the directory. */
GR_API int gr_write_file_atomic(const char *path, const void *data, size_t len);
/* fsync a directory. */
GR_API int gr_fsync_dir(const char *dir);

/* Parses a size like "64", "4k", "10M", "2G" (powers of 1024). */
GR_API int gr_parse_size(const char *s, uint64_t *out);

#endif
