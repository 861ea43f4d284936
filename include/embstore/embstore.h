/**
 * @file embstore.h
 * @brief embstore: a GPU-resident store of embedding tables with an asynchronous, incremental
 * checkpoint pipeline.
 *
 * Plain C99, usable from C++ and from FFIs. Conventions:
 *  - Every call returns an embstore_status_t (a few accessors return a value directly).
 *    Outputs go through trailing pointers; a CUDA stream, where taken, is the last argument.
 *  - On failure, embstore_last_error() gives this thread's detail message.
 *  - Config structs start with struct_size and must be filled by their _init() function
 *    before fields are set, so that later versions can append fields.
 *  - No call throws or aborts on bad input: every bad argument gets a status and a message.
 *  - Thread safety: calls on different tables may run concurrently; calls on one table are
 *    serialized internally. Table handles stay valid until the store is destroyed.
 *
 * The declarations are grouped by feature (Doxygen's "Modules"): version and status, store,
 * tables, data path (with sharded tables, eviction and admission), checkpoints (with restore
 * and warm start), and serving (followers).
 */
#ifndef EMBSTORE_EMBSTORE_H_
#define EMBSTORE_EMBSTORE_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EMBSTORE_API
#else
/** Marks the library's exported calls (default symbol visibility; empty on Windows). */
#define EMBSTORE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version and status -- */
/** @defgroup status Version and status
    The header's and the library's versions, the status every call returns, and the detail
    message of a failed call.
    @{ */

#define EMBSTORE_VERSION_MAJOR 0 /**< the major version of this header */
#define EMBSTORE_VERSION_MINOR 4 /**< the minor version of this header */
#define EMBSTORE_VERSION_PATCH 0 /**< the patch version of this header */
/** This header's version: `MAJOR*10000 + MINOR*100 + PATCH`. */
#define EMBSTORE_VERSION_CODE \
  (EMBSTORE_VERSION_MAJOR * 10000 + EMBSTORE_VERSION_MINOR * 100 + EMBSTORE_VERSION_PATCH)

/** The version of the library that is loaded (may differ from EMBSTORE_VERSION_CODE). */
EMBSTORE_API int embstore_version(void);

/** What a call returns. Numbered from 0; numbers are never reused or renumbered. */
typedef enum embstore_status {
  EMBSTORE_OK = 0, /**< success */
  EMBSTORE_INVALID_ARGUMENT = 1,  /**< null pointer, bad size, bad name, mismatched dim ... */
  EMBSTORE_NOT_FOUND = 2,         /**< table, checkpoint directory, version, attachment */
  EMBSTORE_ALREADY_EXISTS = 3,    /**< a table of that name exists */
  EMBSTORE_OUT_OF_MEMORY = 4,     /**< host or device allocation failed */
  EMBSTORE_CAPACITY_EXCEEDED = 5, /**< max_capacity reached and nothing can be evicted */
  EMBSTORE_IO_ERROR = 6,          /**< read, write, fsync, rename failed (errno text in
                                       last_error) */
  EMBSTORE_CORRUPT = 7,           /**< checksum or format mismatch (file and offset in
                                       last_error) */
  EMBSTORE_UNSUPPORTED = 8,       /**< not built, no device, or not implemented in this version */
  EMBSTORE_BUSY = 9,              /**< another writer holds the checkpoint directory (it is named);
                                      a restore and calls on the store's tables met (see
                                      "data path"); a cancelled follower's poll */
  EMBSTORE_DEVICE_ERROR = 10,     /**< CUDA or NCCL failure */
  EMBSTORE_INTERNAL = 11,         /**< a bug in embstore: please report it with last_error */
  EMBSTORE_COMM_ERROR = 12        /**< an exchange through the store's communicator failed (MPI
                                      or a callback reported an error): the ranks' tables may
                                      differ; restore every rank from the last checkpoint */
} embstore_status_t;

/** The name of a status: "EMBSTORE_CORRUPT" for EMBSTORE_CORRUPT; "EMBSTORE_UNKNOWN_STATUS"
    for a number that is not a status. Never NULL; the string is static.
    @param s a status, or any number
    @return the status's name */
EMBSTORE_API const char* embstore_status_name(embstore_status_t s);

/** This thread's message for its last failed call, "" if none has failed. A successful call
    does not clear it. The string stays valid until this thread's next failed call. */
EMBSTORE_API const char* embstore_last_error(void);

/** @} */

/* ------------------------------------------------------------------------------- store -- */
/** @defgroup store Store
    A store holds the tables of one process (or of one rank of a sharded job) on one backend,
    and their checkpoint pipeline.
    @{ */

/** A store (opaque): created by embstore_store_create, freed by embstore_store_destroy. */
typedef struct embstore_store embstore_store_t;
/** A table of a store (opaque): valid until its store is destroyed. */
typedef struct embstore_table embstore_table_t;

/** Where a store keeps its tables and runs its calls. */
typedef enum {
  EMBSTORE_BACKEND_AUTO = 0, /**< CUDA where a device is usable, else HOST */
  EMBSTORE_BACKEND_HOST = 1, /**< host memory, parallel over host_threads */
  EMBSTORE_BACKEND_CUDA = 2  /**< device memory of config.device */
} embstore_backend_t;

/** When embstore_restore parks the host tables it replaces in a spill file (their rows written
    there and their memory given back until the restore ends), so that it needs about one table's
    worth of memory beside the store instead of all the restored tables'. */
typedef enum {
  EMBSTORE_SPILL_AUTO = 0,  /**< when the restored tables would not fit in the memory available
                                (MemAvailable, and the cgroup's memory.max where it has one) */
  EMBSTORE_SPILL_NEVER = 1, /**< keep them in memory: the restored tables need room beside them */
  EMBSTORE_SPILL_ALWAYS = 2 /**< always (costs writing and, after a failure, reading them back) */
} embstore_spill_t;

/** A process group other than MPI (PyTorch's gloo, a trainer's own transport) as C callbacks,
    for sharded stores (the data path on the host backend; control messages on either). Each
    callback is collective: every rank of the store calls it, in the same order, from the thread
    that made the embstore call. Each returns 0, or nonzero on failure (the embstore call then
    fails with COMM_ERROR on that rank). Byte counts and buffers are packed in rank order: rank
    q's part starts after the parts of ranks 0..q-1. */
typedef struct embstore_comm_callbacks {
  size_t struct_size; /**< set by embstore_comm_callbacks_init */
  void* context;      /**< passed to every callback; must outlive the store */
  /** Every rank contributes `bytes` bytes (the same count on every rank); recv receives
      world_size * bytes: rank q's at recv + q * bytes. */
  int (*all_gather)(void* context, const void* send, size_t bytes, void* recv);
  /** send_bytes[q] bytes of send go to rank q; recv_bytes[q] bytes of recv come from rank q
      (what q sends to this rank: the caller knows it, since a count exchange comes first). */
  int (*all_to_all)(void* context, const void* send, const size_t* send_bytes, void* recv,
                    const size_t* recv_bytes);
} embstore_comm_callbacks_t;

/** Zeroes callbacks and sets struct_size. NULL is a no-op.
    @param callbacks the struct to initialize, or NULL */
EMBSTORE_API void embstore_comm_callbacks_init(embstore_comm_callbacks_t* callbacks);

/** A store's configuration (embstore_store_create): fill it with embstore_store_config_init,
    then set the fields wanted. */
typedef struct embstore_store_config {
  size_t struct_size;         /**< set by embstore_store_config_init */
  embstore_backend_t backend; /**< default AUTO */
  int device;                 /**< CUDA device ordinal, >= 0 (also on the host backend);
                                   default 0 */
  int rank;                   /**< 0 for a single process; default 0 */
  int world_size;             /**< 1 for a single process; default 1 */
  void* nccl_comm;            /**< ncclComm_t when world_size > 1 on CUDA, else NULL: the
                                  data path of a sharded CUDA store (keys, rows and gradients
                                  between the ranks' devices), besides mpi_comm or
                                  comm_callbacks for control. Its rank, size and device must
                                  match rank, world_size and device; embstore duplicates it at
                                  create (ncclCommSplit: collective) and destroys the duplicate
                                  at destroy. With backend AUTO and world_size > 1 it picks
                                  CUDA (else the host). Needs a build with NCCL */
  size_t staging_bytes;       /**< pinned staging budget of the checkpoint pipeline, at least
                                  1 MiB (a chunk holds the widest row); default 256 MiB */
  int io_queue_depth;         /**< writes in flight per writer, 1..4096; default 16 */
  int host_threads;           /**< host backend worker threads, 0 (default): one per core; at
                                  most 4 per core (at least 16) */
  /* Fields below came after 0.4.0. embstore_store_create gives a config whose struct_size ends
     before them their defaults; embstore_store_config_init writes every field of this header,
     so a program must be compiled against the header of the library it runs with. */
  embstore_spill_t restore_spill; /**< default AUTO */
  const char* spill_dir;          /**< directory of restore's spill file (unnamed, gone when the
                                      restore returns); NULL (default): /var/tmp. Copied at
                                      create. */
  /* The communicator of a sharded store (world_size > 1, see "Sharded tables"): exactly one of
     these two, on either backend (on CUDA for control messages and checkpoints; nccl_comm
     carries the data). */
  void* mpi_comm; /**< a pointer to the trainer's MPI_Comm (rank and size must match rank and
                      world_size); embstore duplicates it at create (collective: every rank
                      creates its store together) and frees the duplicate at destroy, so no
                      message of its own can match the trainer's. Needs a build with MPI
                      (embstore_store_create: UNSUPPORTED otherwise). Default NULL */
  const embstore_comm_callbacks_t* comm_callbacks; /**< or callbacks; copied at create.
                                                       Default NULL */
  /* Fields below came after 0.5 (see "Tiers"). */
  const char* tier_dir; /**< directory of the SSD tier's files, for tables with a memory_rows
                            budget: a cache, never a checkpoint (each table's file is unnamed
                            and goes with the process). Must be on a disk (not tmpfs), writable.
                            Copied at create. NULL (default): no SSD tier */
} embstore_store_config_t;

/** Fills config with the defaults above. NULL is a no-op.
    @param config the config to fill, or NULL */
EMBSTORE_API void embstore_store_config_init(embstore_store_config_t* config);

/** The rank that owns key among world_size ranks (world_size 0 is taken as 1). One hash,
    the same on every backend and machine and in every version, since checkpoints and serving
    layouts depend on it: h = splitmix64_finalizer(key ^ 0x2545f4914f6cdd1d), then
    ((h >> 32) * world_size) >> 32.
    @param key the key
    @param world_size the number of ranks (0 is taken as 1) */
EMBSTORE_API uint32_t embstore_shard_of(int64_t key, uint32_t world_size);

/** Creates a store. config NULL: the defaults. A sharded store (world_size > 1) is created by
    every rank together (the MPI communicator is duplicated collectively).
    @param [in] config the configuration, or NULL for the defaults
    @param [out] store_out the new store
    @return OK; INVALID_ARGUMENT (store_out NULL, struct_size too small, bad backend, negative
    host_threads, io_queue_depth outside 1..4096, staging_bytes below 1 MiB, device below 0,
    rank/world_size out of range, unknown restore_spill, an empty tier_dir; world_size > 1
    without a communicator or with both kinds, callbacks with a NULL function or a struct_size
    too small, an MPI
    communicator whose rank or size differ from rank and world_size, or MPI not initialized);
    UNSUPPORTED (CUDA asked for where this build has no CUDA or no device is usable; mpi_comm in a
    build without MPI; world_size > 1 on the CUDA backend in a build without NCCL); COMM_ERROR;
    DEVICE_ERROR; OUT_OF_MEMORY. */
EMBSTORE_API embstore_status_t embstore_store_create(const embstore_store_config_t* config,
                                                     embstore_store_t** store_out);

/** Waits for in-flight checkpoints, then frees every table and the store, and lets go of the
    checkpoint directories it held (see "Checkpoints"). NULL is a no-op. On a sharded store it is
    collective while a checkpoint is in flight (every rank destroys its store), and frees the
    duplicated MPI communicator: destroy stores before MPI_Finalize. Table handles of the
    store become invalid. @return OK, or the failure of a checkpoint that nobody has been told of
    yet (by embstore_checkpoint_wait or embstore_step); the store is freed all the same. */
EMBSTORE_API embstore_status_t embstore_store_destroy(embstore_store_t* store);

/** HOST or CUDA: the backend the store runs on (AUTO resolved). HOST for NULL. */
EMBSTORE_API embstore_backend_t embstore_store_backend(const embstore_store_t* store);

/** @} */

/* ------------------------------------------------------------------------------- table -- */
/** @defgroup table Tables
    A table's configuration (dim, optimizer, initializer, admission and eviction rules),
    creating and finding tables.
    @{ */

/** The optimizer a table's embstore_apply_gradients applies (lr: learning_rate). */
typedef enum {
  EMBSTORE_OPT_SGD = 0,             /**< w -= lr * g */
  EMBSTORE_OPT_ADAGRAD = 1,         /**< a += g^2;  w -= lr * g / (sqrt(a) + epsilon) */
  EMBSTORE_OPT_ROWWISE_ADAGRAD = 2, /**< one a per row: a += mean(g^2) over the row */
  EMBSTORE_OPT_ADAM = 3             /**< bias-corrected, per-row step count */
} embstore_optimizer_t;

/** The initializer of a table's new rows. */
typedef enum {
  EMBSTORE_INIT_ZEROS = 0,    /**< zeros */
  EMBSTORE_INIT_CONSTANT = 1, /**< init_a */
  EMBSTORE_INIT_UNIFORM = 2,  /**< [init_a, init_b] (init_b itself only by float rounding);
                                  init_b - init_a must be finite in float */
  EMBSTORE_INIT_NORMAL = 3    /**< mean init_a, standard deviation init_b; |init_a| + 16 init_b
                                  must be finite in float (no value is then infinite) */
} embstore_init_t;

/** How a table's rows are stored in its checkpoint files (value_codec, state_codec). Each
    block of a row file is encoded on its own, so files still stream and checksum by block;
    every reader (restore, warm start, followers, embstore-ckpt) decodes. See
    docs/checkpoints.md, "Codecs". */
typedef enum {
  EMBSTORE_CODEC_NONE = 0,     /**< floats as they are (the format before codecs) */
  EMBSTORE_CODEC_LOSSLESS = 1, /**< the floats' bytes shuffled, then zstd: bit-exact */
  EMBSTORE_CODEC_BF16 = 2,     /**< bfloat16, rounded to nearest even: each value within a
                                   relative 2^-8 of the float */
  EMBSTORE_CODEC_INT8 = 3      /**< a scale and offset per row and a byte per value (FBGEMM's
                                   fused 8-bit rows): each value within half a step of its
                                   row's range, (max - min) / 510 */
} embstore_codec_t;

/** A table's configuration (embstore_table_create): fill it with embstore_table_config_init,
    then set name, dim and the fields wanted. */
typedef struct embstore_table_config {
  size_t struct_size;             /**< set by embstore_table_config_init */
  const char* name;               /**< unique in the store, [A-Za-z0-9_.-]{1,128}, not "." or
                                      ".."; copied. Default NULL: must be set */
  uint32_t dim;                   /**< 1..4096. Default 0: must be set */
  uint64_t initial_capacity;      /**< rows allocated up front; default 1024; 0: default. The
                                      host backend faults more than 65,536 of them in at
                                      embstore_table_create, on a thread of its own (Linux
                                      5.14+): their memory is resident from the start, as on
                                      CUDA. A restore's tables hold what they load */
  uint64_t max_capacity;          /**< rows; 0 (default): grow as long as memory lasts */
  embstore_optimizer_t optimizer; /**< default ADAGRAD */
  float learning_rate;            /**< default 0.01 */
  float epsilon;                  /**< default 1e-8 */
  /** @{ */
  float beta1, beta2;             /**< Adam; default 0.9, 0.999 */
  /** @} */
  float weight_decay;             /**< L2: g += weight_decay * w before the update; default 0 */
  float initial_accumulator;      /**< Adagrad accumulators start here; default 0 */
  embstore_init_t init;           /**< default UNIFORM */
  /** @{ */
  float init_a, init_b;           /**< default -0.01, 0.01 */
  /** @} */
  uint64_t seed;                  /**< a row's initial value depends only on (seed, key,
                                      column); default 0 */
  uint32_t admit_after;           /**< a key gets a row at its N-th occurrence in training
                                      lookups (see "Admission" below); 0 or 1 (default): at once */
  uint64_t evict_idle_steps;      /**< rows untouched for more than this many steps are evicted
                                      (see "Eviction" below); 0 (default): never */
  /* Fields below were added in 0.2; a caller built against an older header (a smaller
     struct_size) gets their defaults. */
  double evict_idle_seconds; /**< rows untouched for longer are evicted; 0 (default): never */
  uint32_t evict_when_full;  /**< 1: at max_capacity, an insert evicts the least recently
                                 used rows to make room; 0 (default): it fails with
                                 CAPACITY_EXCEEDED unless an idle rule is set */
  /* Fields below were added in 0.3. */
  uint64_t admit_bloom_bytes; /**< admission counts in a counting Bloom filter of this many
                                  one-byte counters instead of exactly (see "Admission");
                                  0 (default): exact counting; at most
                                  EMBSTORE_MAX_ADMIT_BLOOM_BYTES */
  /* Fields below came after 0.5: tier budgets (see "Tiers"). Not part of a checkpoint: a
     restore keeps an existing table's budgets, and a table a restore creates has none. */
  uint64_t device_rows; /**< CUDA: rows kept in device memory; the rest live in mapped host
                            memory, which the kernels read and write over the bus (see
                            "Tiers"). 0 (default): every row. Ignored by the host backend */
  uint64_t memory_rows; /**< rows kept in host memory (the host backend's first tier; on CUDA,
                            below device_rows, and with device_rows 0 seven eighths of them in
                            device memory: see "Tiers"); the rest live in the store's tier_dir.
                            0 (default): every row in memory. A call on more distinct rows than
                            this holds them all in memory while it runs */
  /* Fields below came after 0.5: codecs of checkpointed rows (see embstore_codec_t). Part of a
     checkpoint: its manifest records them, and a table a restore creates gets them. A lossy
     codec is never a default: a checkpoint of a table that asks for one restores rows within
     the codec's bound, not bit for bit. */
  embstore_codec_t value_codec; /**< values in this table's checkpoint files; default NONE */
  embstore_codec_t state_codec; /**< optimizer state; default NONE; INT8 is refused (Adagrad's
                                    accumulators and Adam's moments span orders of magnitude
                                    within a row) */
  embstore_codec_t serving_codec; /**< values in the values-only copies of deltas that followers
                                      read (embstore_checkpoint_policy_t::serving_deltas):
                                      NONE (default) floats as they are; LOSSLESS; BF16 (rounded
                                      to nearest even, then shuffled and zstd-compressed: the
                                      fewest bytes within bf16's bound); INT8 */
} embstore_table_config_t;

#define EMBSTORE_MAX_ADMIT_BLOOM_BYTES (16ull << 30) /**< 16 GiB: 16 bytes a key for 2^30 keys */

/** Fills config with the defaults above. NULL is a no-op.
    @param config the config to fill, or NULL */
EMBSTORE_API void embstore_table_config_init(embstore_table_config_t* config);

/** Creates a table. Every int64 value is a valid key: no key is reserved.
    @param store the store
    @param [in] config the table's configuration
    @param [out] table_out the new table
    @return OK; INVALID_ARGUMENT (NULL pointer, struct_size too small, bad name, dim out of
    range, initial_capacity above 4294967040 rows, max_capacity below initial_capacity, unknown
    optimizer or initializer, negative or non-finite hyperparameters, beta outside [0,1), Adam
    with epsilon 0, Adagrad (either kind) with both epsilon and initial_accumulator 0, NORMAL
    with negative deviation, UNIFORM with init_b < init_a, an initializer whose values would
    overflow a float (see embstore_init_t), negative or non-finite evict_idle_seconds,
    evict_when_full not 0 or 1, admit_bloom_bytes set while admit_after <= 1, below 64, above
    EMBSTORE_MAX_ADMIT_BLOOM_BYTES or with admit_after above 255; an unknown value_codec,
    state_codec or serving_codec, or state_codec INT8; memory_rows without the
    store's tier_dir, or a tier_dir that is missing, not a directory or on tmpfs: see "Tiers");
    ALREADY_EXISTS; OUT_OF_MEMORY (also at once for a Bloom filter larger than the memory
    available); IO_ERROR (no file can be created in tier_dir); DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_table_create(embstore_store_t* store,
                                                     const embstore_table_config_t* config,
                                                     embstore_table_t** table_out);

/** Finds a table by name.
    @param store the store
    @param [in] name the table's name
    @param [out] table_out the table
    @return OK, INVALID_ARGUMENT (NULL pointer), NOT_FOUND. */
EMBSTORE_API embstore_status_t embstore_table_get(embstore_store_t* store, const char* name,
                                                  embstore_table_t** table_out);

/** The table's dim, or 0 for NULL. */
EMBSTORE_API uint32_t embstore_table_dim(const embstore_table_t* table);

/** @} */

/* --------------------------------------------------------------------------- data path -- */
/** @defgroup datapath Data path
    Lookups and gradient updates, step boundaries, table stats, eviction and admission.

    Pointers are device pointers on the CUDA backend, host pointers on the host backend.
   stream is a cudaStream_t (NULL: the legacy default stream) and is ignored on the host
   backend. On CUDA the calls are stream-ordered and return once the work is enqueued; on the
   host backend they return when the work is done. n == 0 is a no-op (pointers may then be
   NULL); n above 2^32 - 1 (4294967295) is INVALID_ARGUMENT: split such a batch.
   A restore or warm start replaces the store's tables: lookups, updates, table stats,
   embstore_table_evict and (on a store of one rank) embstore_step made on other threads while
   one runs fail with BUSY, doing nothing (also during the moment a restore that is itself
   refused holds its place), and one started while such calls run, or while another restore of
   the store runs, fails with BUSY (a sharded store's restore waits for such calls instead: it
   cannot fail on one rank alone; its sharded calls are serialized with it). So each of these
   calls may return BUSY, but only when the caller runs restores on one thread and the calls on
   another.
   @{ */

#define EMBSTORE_LOOKUP_INSERT 1u /**< training: admitted keys without a row get a new row */

/** Reads n rows into values_out (n x dim floats, row-major). Without EMBSTORE_LOOKUP_INSERT
    nothing is stored or counted: keys without a row read as zeros. With it, a key without a
    row gets one, filled by the table's initializer, and is marked dirty; duplicate keys in one
    call get one row. On a table with admission (admit_after > 1) only admitted keys get a row;
    a key still pending reads as the values its row would start with, and no row is stored.
    The new rows' last-touched step is the store's current step; on a table with an eviction
    rule, so is that of every row the call finds (training touched it). When the new
    rows would pass max_capacity, a table with an eviction rule first evicts as many of its
    least recently used rows as it needs (see "Eviction"), never one this call reads.
    @param table the table
    @param [in] keys n keys (CUDA: device memory; host backend: host memory)
    @param n the number of keys
    @param [out] values_out n x dim floats (CUDA: device memory; host backend: host memory)
    @param flags 0 or EMBSTORE_LOOKUP_INSERT
    @param stream a cudaStream_t, NULL: the legacy default stream (ignored on the host backend)
    @return OK; INVALID_ARGUMENT (NULL table, NULL keys or values_out with n > 0, unknown
    flags); CAPACITY_EXCEEDED (the new rows would pass max_capacity and too few rows can be
    evicted: nothing was inserted or evicted, and values_out is unspecified; the call's keys
    are still counted for admission); OUT_OF_MEMORY;
    DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_lookup(embstore_table_t* table, const int64_t* keys,
                                               size_t n, float* values_out, uint32_t flags,
                                               void* stream);

/** Gradients of n rows (n x dim floats, row-major). A key's occurrences in the batch are summed
    by a fixed blocked rule: up to 32 occurrences one after the other in the order they appear;
    more, as consecutive blocks of 32 summed that way, whose sums are then summed by the same rule
    (so a key's occurrences are the leaves, in batch order, of a tree of fan-in 32, each node
    adding its children left to right); then one fused pass per row updates value and optimizer
    state, marks the row dirty and stamps the store's current step. Keys without a row are
    skipped and counted in skipped_keys. The result is bit-identical for the same inputs on every
    run, every host_threads and both backends. (Up to 0.4.0 every occurrence was added one after
    the other: rows with more than 32 occurrences in a batch may differ in the last bits.)
    @param table the table
    @param [in] keys n keys (CUDA: device memory; host backend: host memory)
    @param [in] grads n x dim floats (CUDA: device memory; host backend: host memory)
    @param n the number of keys
    @param stream a cudaStream_t, NULL: the legacy default stream (ignored on the host backend)
    @return OK; INVALID_ARGUMENT (NULL table, NULL keys or grads with n > 0); OUT_OF_MEMORY;
    DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_apply_gradients(embstore_table_t* table,
                                                        const int64_t* keys, const float* grads,
                                                        size_t n, void* stream);

/** @defgroup sharded Sharded tables
   Lookups and updates that route each rank's batch to the keys' owners.

   Sharded tables (world_size > 1). Each rank's store holds the rows of the keys
   embstore_shard_of(key, world_size) gives its rank: its shard of every table. Tables are
   created on every rank with the same configs. embstore_lookup and embstore_apply_gradients act
   on the rank's own shard, for trainers that route keys themselves: a key the rank does not own
   is INVALID_ARGUMENT (nothing is read, inserted or updated). The sharded calls below take each
   rank's own batch and route it.

   They are collective: every rank calls them for the same table in the same order, and the
   exchange runs on the calling thread through the store's communicator (a duplicate of the
   trainer's MPI communicator, or its callbacks), so they never race with the trainer's own
   collectives on its communicator. With MPI, the thread that calls them must be allowed to call
   MPI at the level the trainer initialized it with (FUNNELED: the main thread; SERIALIZED: one
   thread at a time; MULTIPLE: any). One call at a time per store: a sharded call waits for
   another one of the same store. Every rank returns the same status: when a rank's own part
   fails (bad arguments that still name a table, CAPACITY_EXCEEDED, OUT_OF_MEMORY), every rank
   fails with that status and a message naming the rank. Each owner carries out its part on
   its own shard: one that fails leaves its shard as the plain call does on failure, and the
   parts the other owners carried out stay (rows they inserted, gradients they applied). A NULL
   table returns at once on that rank only: the other ranks then wait for it (pass a table on
   every rank). On a store of one rank they are the plain calls.
   On CUDA (a store with nccl_comm) keys, values and gradients are device memory: the rank's
   keys are copied to the host for the plan (the same code as the host backend's), counts and
   outcomes go through the control communicator, and keys, rows and gradients travel between
   the devices as grouped NCCL sends and receives on `stream`; the calls return when their work
   is done. The plain calls of a sharded CUDA store copy the keys to the host for the ownership
   check (waiting for the stream). In this version the CUDA path is compiled, not yet run: no
   machine with two GPUs was available to its tests.
   Checkpoints and restores of a sharded store are collective too (see "Checkpoints of a
   sharded store"), and so is warm start.
   @{ */

/** Reads the rows of the rank's n keys into values_out, as embstore_lookup would in one
    process: each distinct key goes once to its owner (every occurrence, for an insert on a table
    with admission, so that occurrences count as in one process) and its row comes back to each
    of its positions. W ranks, each with its own batch, read, insert and count exactly what one
    process would for the ranks' batches concatenated in rank order. Flags as embstore_lookup.
    @param table the table (on every rank)
    @param [in] keys the rank's n keys (CUDA: device memory; host backend: host memory)
    @param n the number of the rank's keys
    @param [out] values_out n x dim floats (CUDA: device memory; host backend: host memory)
    @param flags 0 or EMBSTORE_LOOKUP_INSERT
    @param stream a cudaStream_t, NULL: the legacy default stream (ignored on the host backend)
    @return OK; INVALID_ARGUMENT (NULL pointer with n > 0, unknown flags, n too large: on every
    rank); CAPACITY_EXCEEDED; OUT_OF_MEMORY; COMM_ERROR. */
EMBSTORE_API embstore_status_t embstore_sharded_lookup(embstore_table_t* table, const int64_t* keys,
                                                       size_t n, float* values_out, uint32_t flags,
                                                       void* stream);

/** Applies the rank's n gradients: every occurrence goes to the owner of its key, which sums
    what it receives in rank order, then batch order (the blocked rule of embstore_apply_gradients
    over that sequence), and updates as embstore_apply_gradients.
    The tables of W ranks are therefore bit-identical to one process's after it applied the
    ranks' batches concatenated in rank order. Keys without a row are skipped and counted in the
    owner's skipped_keys.
    @param table the table (on every rank)
    @param [in] keys the rank's n keys (CUDA: device memory; host backend: host memory)
    @param [in] grads n x dim floats (CUDA: device memory; host backend: host memory)
    @param n the number of the rank's keys
    @param stream a cudaStream_t, NULL: the legacy default stream (ignored on the host backend)
    @return OK; INVALID_ARGUMENT (on every rank); OUT_OF_MEMORY;
    COMM_ERROR. */
EMBSTORE_API embstore_status_t embstore_sharded_apply_gradients(embstore_table_t* table,
                                                                const int64_t* keys,
                                                                const float* grads, size_t n,
                                                                void* stream);

/** @} */

/** A step boundary: sets the global step that later updates stamp on their rows and that the
    next checkpoint is named by, runs the tables' eviction rules when due (see "Eviction"), then
    the checkpoint policy (see embstore_checkpoint_set_policy). Steps need not be consecutive.
    @param store the store
    @param global_step the new global step
    @return OK; INVALID_ARGUMENT (NULL store); or, once, the outcome of a policy checkpoint that
    failed since the last call (IO_ERROR ...; the store stays usable and the step is set); or
    the error of starting a due policy checkpoint (the step is set all the same). */
EMBSTORE_API embstore_status_t embstore_step(embstore_store_t* store, uint64_t global_step);

/** A table's counters (embstore_table_stats). */
typedef struct embstore_table_stats {
  size_t struct_size;         /**< set by the caller to sizeof(embstore_table_stats_t) */
  uint64_t rows;              /**< live rows */
  uint64_t capacity;          /**< rows the table holds before it allocates more */
  uint64_t dirty_rows;        /**< rows inserted or updated since the last capture */
  uint64_t inserted;          /**< rows ever inserted */
  uint64_t evicted;           /**< rows ever evicted */
  uint64_t pending_admission; /**< keys counted but not yet admitted; with admit_bloom_bytes an
                                  estimate of the distinct keys the filter has counted, those
                                  admitted since included (see "Admission") */
  uint64_t skipped_keys;      /**< gradient keys that had no row */
  /* Fields below were added in 0.3; a smaller struct_size (0.2) gets the fields above. */
  uint64_t admitted; /**< rows that training lookups inserted (restored rows are not
                         counted); without admission, every new key */
  /* Fields below came after 0.5 (see "Tiers"); a smaller struct_size gets the fields above. */
  uint64_t rows_in_device;     /**< live rows in device memory (CUDA: every row, without
                                    device_rows) */
  uint64_t rows_in_memory;     /**< live rows in host memory: on CUDA those beyond device_rows */
  uint64_t rows_on_disk;       /**< live rows in the SSD tier */
  uint64_t rows_moved_up;      /**< rows brought up from a lower tier, ever */
  uint64_t rows_moved_down;    /**< rows moved down to a lower tier, ever */
  uint64_t tier_bytes_read;    /**< bytes read from the SSD tier's file, ever */
  uint64_t tier_bytes_written; /**< bytes written to the SSD tier's file, ever */
} embstore_table_stats_t;

/** Fills out with the table's counters. On CUDA it waits for the table's earlier work.
    @return OK; INVALID_ARGUMENT (NULL pointer, struct_size below the 0.2 size); DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_table_stats(embstore_table_t* table,
                                                    embstore_table_stats_t* out);

/** @defgroup eviction Eviction
   When a table drops rows: idle rules (steps, seconds) and room at max_capacity.

   Eviction. A row's last-touched step is the store's step when a training call last inserted,
   updated or (on a table with an eviction rule) looked it up with EMBSTORE_LOOKUP_INSERT. A
   table evicts a row
   - when it is idle for more than evict_idle_steps steps: last-touched step < step - N;
   - when it is idle for longer than evict_idle_seconds: its last-touched step began more than
     that many seconds ago (the store notes the time of its steps, 64 times per such period);
   - when an insert needs room at max_capacity (evict_when_full, or any idle rule): the least
     recently used rows go first (ties: the lowest key, so that tables fed the same calls
     evict the same keys on either backend). Rows touched in the current step
     (those the insert reads among them) are never evicted for room: when too few others
     exist, the insert fails with CAPACITY_EXCEEDED (also before the first embstore_step,
     while every row has step 0). Finding the victims reads every row's stamp, so at
     max_capacity each insert that needs room costs a pass over the table.

   embstore_step runs the idle rules every ceil(evict_idle_steps / 8) steps and every
   evict_idle_seconds / 8 seconds; embstore_table_evict runs them at once. So a row may stay
   up to 1/8 longer than evict_idle_steps; for the seconds rule add the rest of the step in
   which the row was last touched and 1/64 of the limit (the marks' spacing). Without
   embstore_step calls, time alone evicts nothing. Restored rows count as touched at the
   restored version (the checkpoint does not hold rows' last-touched steps in this version),
   and a restore forgets the times of earlier steps. An evicted row's key leaves the table (a later
   lookup inserts it anew, from the initializer), its memory is reused, and the next
   incremental checkpoint records a tombstone for the key, unless the key was inserted again
   before that checkpoint's capture (then the checkpoint holds the new row). A checkpoint in
   flight still writes the row as it was at its capture. */

/** @defgroup admission Admission
   A key gets a row only at its N-th occurrence in training lookups.

   Admission (admit_after = N > 1). Each occurrence of a key without a row in a lookup with
   EMBSTORE_LOOKUP_INSERT counts; the key gets its row at its N-th occurrence (duplicates in one
   call count one by one, and the call that admits a key reads the new row at each of them).
   Until then the key is pending: the lookup returns its initial values (those of the row it
   will get), apply_gradients skips it (counted in skipped_keys), and nothing is checkpointed
   for it but its count.
   - Exact counting (default): pending keys live in a side table of (key, count, last step
     seen), 24 bytes per slot, at most half full. An admitted key's count is dropped; evicted
     later, it starts again from 0. With an idle rule, each eviction pass also forgets the
     counts of keys not seen for as long as a row may stay idle. The side table otherwise
     grows with the distinct pending keys.
   - Counting Bloom filter (admit_bloom_bytes = m): memory stays m bytes. Each key counts in 4
     of m one-byte counters (saturating at 255, so N <= 255), increasing only the smallest of
     them (conservative update); its count is their minimum, never below the true count, so a
     key is never admitted late. It may be admitted early: after n distinct keys have been
     counted, a key seen fewer than N times is admitted with probability at most
     (1 - exp(-4n/m))^4: 0.02% for n = m/32, 0.24% for n = m/16, 56% for n = m/2 (so give it
     16 or more bytes per distinct key; exact counting takes 48 to 96). pending_admission
     reports the estimate of n. Counts are never removed, so the rate only grows, and an
     evicted key is admitted again at once.

   Checkpoints: a full checkpoint saves every count, a delta the changes since its parent (the
   keys whose counts were dropped, and the counts that changed); a Bloom filter goes whole into
   both. Restore loads them along the chain, so the restored counts are those at the restored
   version, and training restored from any version goes on as it would have. On the host a
   capture does not copy the counts: it shares them in 64 KiB pieces, and counting copies a
   piece that a checkpoint in flight still holds before it changes it. A CUDA table's exact
   counts are copied at capture, device to device (24 bytes per slot of a table at most half
   full), into a copy kept for the next capture. Admission alone evicts nothing.
   On CUDA, exact counts are kept in device memory (but for a table with memory_rows and
   max_capacity, whose counts are on the host: see "Tiers") and counted by the lookup's
   kernels, with the same results as the host backend's (a key's count is its occurrences,
   whatever order they are counted in): a lookup with EMBSTORE_LOOKUP_INSERT returns once its
   work is enqueued, and waits for the device only when the counts' table must grow (about
   every slots / 2n calls). A Bloom filter's counts, whose conservative update depends on the
   order of the keys, are kept in host memory and counted there in batch order: such a lookup
   copies its keys without a row to the host, so it waits for the table's earlier work. Counts
   saturate at 2^32 - 3 on both backends (0.4.0 saturated at 2^32 - 1). In this version the
   device counting is compiled, not yet run on a GPU. */

/** Runs the table's idle rules now, at the store's current step and time; *evicted_out (may be
    NULL) = the rows evicted. A table without idle rules evicts nothing.
    @return OK; INVALID_ARGUMENT (NULL table); DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_table_evict(embstore_table_t* table, uint64_t* evicted_out);

/** @defgroup tiers Tiers
   Tables larger than memory: a memory budget over an SSD tier (host backend); tables larger
   than the GPU: a device budget over host memory (CUDA backend).

   Tiers (host backend). A table with memory_rows = M > 0 keeps at most M rows in host memory
   between calls and the rest in a file of the store's tier_dir (unnamed, read and written
   through the io engine: io_uring and O_DIRECT where the kernel and file system allow). Each
   row has one home: its value and optimizer state move between memory and the file whole, and
   the table's index, metadata, dirty bits and admission counts stay in memory for every row
   (41 to 61 bytes a row beside the budget). A lookup or update first brings the rows it needs
   up, in one batched read; to make room it moves rows down, in one batched write, an eighth of
   the budget at a time so that the choice (a pass over the budget's rows) is paid once per that
   many rows. The rows moved down are the coldest: those used in the fewest calls (a count kept
   for every row wherever it lives, halved each time the table has counted eight budgets' worth
   of uses, so that it follows a shifting hot set), the least recently used among equals; a
   pass over many rows used once does not push out the rows every batch uses. Rows used by the
   last two calls go last of all (a prefetch of the next batch spares the rows that the current
   batch's update is about to use).
   embstore_prefetch moves rows down and reads a coming batch's rows in the background while the
   current one trains. A table that does not prefetch gets its room made between its calls: once
   fewer than a sixteenth of its budget's frames are free, a thread of the table's writes an
   eighth of the budget's coldest rows down, and the next call that needs room takes their
   frames. Rows a call needs that are on disk are read in the call (only a prefetch knows them
   ahead), and so are moves a call needs beyond that room.

   Device tier (CUDA backend). A table with device_rows = D > 0 keeps the values and optimizer
   state of its first D rows (row ids, in the order rows are created; an evicted row's id goes
   to a later key) in device memory and those of the rest in page-locked host memory mapped
   into the device's address space, which the lookup, update, checkpoint and restore kernels
   read and write in place over the bus (HierarchicalKV's hybrid mode). The index, the keys,
   the dirty bits and the admission counts of every row stay in device memory (about 50 bytes a
   row). Rows are placed by id, in the order they are created (in training, the keys seen
   first, which on skewed streams are mostly hot ones; after a restore, the checkpoint's first
   rows). embstore_prefetch moves a coming batch's rows that are in host memory to the device:
   each trades places with a device row not inserted or updated for two steps (steps as given
   to embstore_step) and not wanted by this prefetch or the one before (the current batch's),
   found by a sweep over the device rows, round robin; rows of a checkpoint in flight do not
   move. These moves change no row's stamp, so eviction at max_capacity takes the rows an
   untiered table would (ties: the lowest key). Lookups and updates move nothing: a host-memory
   row costs a transfer over the bus at each use. Its tests passed on one H200 (2026-11-28 and 2026-12-04), where
   with 10% of the rows on the device it trained Zipf 1.1 keys at 0.57-0.88 of the untiered
   steps/s (docs/tiers.md).

   SSD tier below a CUDA table (memory_rows on CUDA). The table is a stack of two: the CUDA
   table (device_rows on the device, the rest of seven eighths of memory_rows in mapped host
   memory; with device_rows 0, those rows on the device) over a host table holding the other
   rows, an eighth of memory_rows of them in host memory and the rest in tier_dir. Each row
   lives whole in one of them. A call copies its keys to the host, brings the rows it needs up
   from the table below (moving the CUDA table's least recently used rows down to make room,
   those of this call and the one before last) and then runs on the CUDA table, stream-ordered
   but with the host waiting for the moves. embstore_prefetch hands the coming rows that are
   below to the host table's prefetch (read on its thread); the call that needs them moves them
   up. max_capacity holds over both tables: the least recently used rows go wherever they are,
   as in an untiered table, with admission too (the CUDA table then counts exactly on the host,
   where the stack can ask, before a call at the limit, how many keys it admits).
   Built and tested on the host (the host backend's tables built as such a stack); not yet run
   on a device.

   Results do not depend on tiers: a tiered table trained on a stream holds what an untiered
   one holds, bit for bit, and its checkpoints hold the same rows (a delta the same dirty rows,
   wherever they live; a row moved while a checkpoint is in flight is written once, with its
   value at the capture). Checkpoints do not record tiers: one of a tiered table restores into
   an untiered one and back. The tier's file is a cache: after a crash it is gone with the
   process, and the table comes back from its checkpoint.

   Failures: a table whose tier_dir is missing, not a directory, on tmpfs or ramfs (its pages
   would be memory), or not writable fails embstore_table_create (memory_rows without a
   tier_dir is INVALID_ARGUMENT); a full disk or a failed read or write fails the call that
   needed the move with IO_ERROR naming the directory, and nothing is lost: a row leaves memory
   only once its copy is written, and a failed call leaves every row where it was or in memory.
   @{ */

/** Brings the rows of keys[0..n) up to the table's first tier ahead of a lookup or update of
    them; keys without a row (and, on a sharded store, keys of other ranks) are ignored. A table
    without tiers does nothing. On the host backend the call, under the table's lock like a
    lookup, picks the memory for the rows on disk (free frames, else those of colder rows, which
    must move down first) and returns; a thread of the table's writes the colder rows down and
    reads the rows up meanwhile, and the first call that needs one of those rows, either way (or
    that may evict rows, captures a checkpoint while rows move down, or prefetches again: one
    prefetch is in flight at a time), waits for it to end. Calls on other rows in memory go on
    beside it; a call that needs room, or reads or writes the tier itself, waits for it (the
    tier's file takes one batch at a time), and so does embstore_table_stats.
    On CUDA with device_rows, the call enqueues the moves on stream and returns (it waits for
    the device only when its scratch, or the table, has grown): the rows of keys in host memory trade places with
    device rows not inserted or updated for two steps and not wanted by this prefetch or the one
    before (the current batch's), up to one per key, searched among at most max(4n, 1024)
    device rows a call, in turn; rows of a checkpoint in flight do not trade.
    Only the rows that fit in the budget beside those of the call before (the current batch's)
    are read; the call that needs the others reads them. The rows count as moved up and down in
    embstore_table_stats once a call has waited for them. A failed write or read is not reported
    here: when the write fails nothing moves and nothing is read; when the read fails the rows
    stay on disk; the call that needs them reads them itself (and reports IO_ERROR if that fails
    too).
    @param table the table
    @param [in] keys n keys (host memory on the host backend; device memory on CUDA, read on
                stream: keep them until that work is done), or NULL when n is 0
    @param n the number of keys
    @param stream unused on the host backend; stream-ordered on CUDA
    @return OK; INVALID_ARGUMENT (NULL table or keys); BUSY (a restore is replacing the table);
    IO_ERROR (the tier's file; nothing is lost). */
EMBSTORE_API embstore_status_t embstore_prefetch(embstore_table_t* table, const int64_t* keys,
                                                 size_t n, void* stream);

/** @} */

/** @} */

/* ------------------------------------------------------------------------- checkpoints -- */
/** @defgroup checkpoints Checkpoints
    Asynchronous, incremental checkpoints, their policy and stats; restore and warm start.

    A checkpoint directory holds one subdirectory per version, named by the global step at
    capture ("00000000000000001000.full"), each with a MANIFEST.json, `tables/<table>/` (row files
    and admission counts) and `attachments/<name>`: separate namespaces, so that no table or
    attachment name can stand for another file (format 2, written since 0.4; format 1 is still
    read). A version is written into a hidden temporary directory and renamed into place only
    once every file is durable, so a crash never leaves a half-written version behind; the
    leftovers are removed at the next checkpoint into dir. An incremental checkpoint
    ("...delta") holds only the rows changed since the previous checkpoint of the store in that
    dir, and names it as its parent (its version, its chain's lineage and its manifest's
    checksum); restore follows the chain back to a full checkpoint.

    One writer per directory: a store takes dir's writer lock (dir/embstore.lock) when it first
    checkpoints into dir or sets it as its policy's dir, and holds it until it is destroyed.
    Another store, in this process or another, is refused with BUSY and a message that names the
    holder (pid, host, since when). A writer that dies loses its lock with it (the kernel drops
    it), so a crashed trainer never wedges its directory. On NFS the lock needs the server's lock
    manager (NFSv4, or NFSv3 with lockd; not -o nolock); see io/format/dir_lock.hpp and the README.

    The invariant: embstore_checkpoint_wait returns OK only for a version that embstore_restore
    loads, with every table exactly as it was at the capture.

    Files read from a checkpoint directory. A directory is often shared (followers read a
    trainer's), so what another process plants there is read as hostile: every reader (restore,
    warm start, followers, retention, leases, the writer's lock, every embstore-ckpt command)
    opens a file only when it is a regular file, without following a link and without blocking
    (a FIFO, a link to /dev/zero, a socket, a directory named like the file: the version is
    CORRUPT, "not a regular file"; a lease is skipped; the writer's lock is an IO_ERROR that
    names it), and reads it only up to a size known beforehand: the size the manifest gives
    (admission counts, attachments; row files a block at a time, each block at most 64 MiB) or
    the cap of its kind below. A manifest larger than the cap is never written (that checkpoint
    fails). JSON nested deeper than EMBSTORE_MAX_JSON_DEPTH levels is refused while it is
    parsed. A manifest that asks for a Bloom filter its counts file cannot hold is CORRUPT, and a
    table a restore creates takes from its manifest an initial_capacity of at most the rows it
    loads. Configurations are checked at restore as at create: a checkpoint of a table whose
    configuration this version refuses (an initializer whose values overflow, a filter above
    EMBSTORE_MAX_ADMIT_BLOOM_BYTES) is CORRUPT.
    @{ */
#define EMBSTORE_MAX_MANIFEST_BYTES (64u << 20) /**< MANIFEST.json */
#define EMBSTORE_MAX_LEASE_BYTES 4096u          /**< embstore.lease.\<id\> */
#define EMBSTORE_MAX_LOCK_RECORD_BYTES 4096u    /**< embstore.lock: only its first 4 KiB is read */
#define EMBSTORE_MAX_JSON_DEPTH 32              /**< manifests; a lease is one flat object */

/** @defgroup sharded_checkpoints Checkpoints of a sharded store
   Which rank writes what, and how the ranks commit a version together.

   Checkpoints of a sharded store (world_size > 1). embstore_checkpoint, embstore_checkpoint_wait,
   embstore_step, embstore_restore and embstore_store_destroy are collective: every rank calls
   them in the same order, with the same dir (one directory of a file system every rank
   shares: NFS, Lustre, a local disk for ranks of one machine), and checkpoints at the same step.
   - Each rank writes only its own files: `tables/<t>/shard-<rank>-of-<W>.rows`, its admission
     counts (`tables/<t>/admission-<rank>-of-<W>.counts`) and its attachments
     (`attachments/rank-<rank>/<name>`), into the temporary directory rank 0 creates. Each rank
     fsyncs its own files (the writing client's fsync is what makes them durable on NFS).
   - Rank 0 alone takes dir's writer lock, removes leftovers, writes the manifest (every rank's
     files with sizes and checksums, gathered through the communicator) and renames, only once
     every rank's files are written and durable; it alone applies retention. No file is written
     by two ranks, so the shared file system needs no locks beyond rank 0's.
   - The ranks meet only in the calls above, on the calling thread, never on embstore's own
     threads: the communicator needs no thread level beyond the one the trainer uses. While a
     checkpoint is in flight, each embstore_step makes one small all-gather to learn whether
     every rank has written its files; the version commits at the first step (or wait, or the
     next checkpoint) at which all have.
   - Any rank's failure fails the version on every rank (the others' status names the rank that
     failed); earlier versions stay intact. A delta is written only where every rank can write
     one on the same parent, else every rank writes a full checkpoint.
   - A policy (embstore_checkpoint_set_policy) must be set alike on every rank; rank 0 decides
     when one is due (a schedule by seconds would differ across ranks).
   - A rank that dies mid-checkpoint (SIGKILL) leaves no visible part of that version: only rank
     0 renames, after hearing from every rank. The others wait for it in the communicator: with
     MPI, mpirun ends them when a rank dies.

   A checkpoint of W ranks restores into a store of any world size (see embstore_restore). */

/** A checkpoint's kind. */
typedef enum {
  EMBSTORE_CKPT_FULL = 1,       /**< every row of every table */
  EMBSTORE_CKPT_INCREMENTAL = 2 /**< a delta: the rows changed since its parent */
} embstore_ckpt_kind_t;
/** The newest committed version (as a version argument); no version (in stats). */
#define EMBSTORE_LATEST UINT64_MAX

/** Captures every table after all earlier calls (no row is copied) and writes the checkpoint
    in the background while training goes on: a training call that updates a row not yet
    written copies it out first, so the checkpoint holds exactly the state at capture. dir is
    created with missing parents. *version_out (may be NULL) = the global step of the last
    embstore_step. A checkpoint still being written is finished first (this call then blocks;
    the wait is counted in embstore_checkpoint_stats). Pending attachments are saved with it and
    cleared. Call it between steps, not concurrently with calls on the store's tables.
    @param store the store
    @param [in] dir the checkpoint directory
    @param kind FULL or INCREMENTAL
    @param [out] version_out the version (the global step), or NULL
    @return OK once captured (embstore_checkpoint_wait gives the outcome); INVALID_ARGUMENT
    (NULL store or dir, empty dir, bad kind); ALREADY_EXISTS (dir holds this version already);
    BUSY (another writer holds dir: nothing was captured or written); IO_ERROR (dir, its lock or
    its temporary directory cannot be created); COMM_ERROR; OUT_OF_MEMORY; DEVICE_ERROR. On a
    sharded store any rank's failure is every rank's (see "Checkpoints of a sharded store"), and
    INVALID_ARGUMENT also when the ranks are at different steps.

    INCREMENTAL is taken as FULL when the store's last committed (or restored) version is not
    in dir, is not older than this one (the step went backwards: a delta always has a newer
    version than its parent), is no longer the version this store committed there, or when the
    chain is due for a rebaseline (see embstore_checkpoint_policy_t); embstore_checkpoint_info
    tells which kind was written. */
EMBSTORE_API embstore_status_t embstore_checkpoint(embstore_store_t* store, const char* dir,
                                                   embstore_ckpt_kind_t kind,
                                                   uint64_t* version_out);

/** Blocks until that version (taken by this store) is committed or has failed, and returns its
    outcome: OK; IO_ERROR (a write, fsync or rename failed: that version does not exist, earlier
    ones are intact, its rows stay dirty and its attachments pending for the next checkpoint);
    DEVICE_ERROR, OUT_OF_MEMORY or INTERNAL (the same, for other failures while writing);
    NOT_FOUND (this store took no checkpoint of that version, or took it more than 4096
    checkpoints ago); INVALID_ARGUMENT (NULL store). An outcome is returned by every wait for
    its version; a failure counts as reported once waited for.
    @param store the store
    @param version a version this store took */
EMBSTORE_API embstore_status_t embstore_checkpoint_wait(embstore_store_t* store, uint64_t version);

/** Copies bytes to be saved with the next checkpoint (dense weights, reader offsets, RNG state
    ...) as `attachments/<name>`; attaching a name again replaces it. name: [A-Za-z0-9_.-]{1,128}.
    data may be NULL when bytes is 0. @return OK; INVALID_ARGUMENT; OUT_OF_MEMORY. */
EMBSTORE_API embstore_status_t embstore_checkpoint_attach(embstore_store_t* store, const char* name,
                                                          const void* data, size_t bytes);

/** When embstore_step takes checkpoints, and how many are kept (see
    embstore_checkpoint_set_policy); fill it with embstore_checkpoint_policy_init. */
typedef struct embstore_checkpoint_policy {
  size_t struct_size; /**< set by embstore_checkpoint_policy_init */
  const char* dir;    /**< the checkpoint directory; NULL: none (then everything off) */
  /** @{ */
  uint64_t full_every_steps, incremental_every_steps;   /**< 0: off */
  /** @} */
  /** @{ */
  double full_every_seconds, incremental_every_seconds; /**< 0: off */
  /** @} */
  uint32_t keep_full; /**< full checkpoints kept with their deltas; 0: all */
  /** Rebaseline: an incremental checkpoint is taken as a full one once the chain since the
      last full holds max_chain_length deltas, or their bytes exceed rebaseline_fraction of the
      full's. Defaults 32 and 0.5. Apply to every incremental checkpoint of the store. */
  uint32_t max_chain_length;
  double rebaseline_fraction; /**< see max_chain_length */
  /* Fields below came after 0.5. */
  /** 1: every delta the store writes (by the policy or by embstore_checkpoint) also gets a
      values-only copy of each table's rows, in the table's serving_codec, that followers read
      instead of the whole delta (docs/serving.md, "Values-only deltas"); restore and the tools
      never need it. 0 (default): none. With several ranks, rank 0's policy decides. */
  uint32_t serving_deltas;
  /** A serving-only directory (docs/serving.md, "A serving-only directory"): after each
      checkpoint of the policy's dir commits, its tables' values, without optimizer state and in
      each table's serving_codec, are published here as a version of their own (full or delta,
      as in dir; the values-only files are hard links where both directories share a file
      system), for followers to follow; keep_full applies here too, and versions of a run
      abandoned by a restore of an older version are deleted when the new run reaches them.
      Restores refuse it; a warm start reads it with EMBSTORE_WARM_START_VALUES_ONLY. A failed
      publication never fails the checkpoint: it is counted
      (embstore_checkpoint_stats_t::serving_skipped) and reported on stderr, and the next full
      checkpoint publishes again. Publishing ends the checkpoint (its outcome waits for it): hard
      links take a few file operations, a copy to another file system its bytes' time. Must not
      be dir. NULL or "": none. With several ranks, rank 0's policy decides, and it alone writes
      here. */
  const char* serving_dir;
} embstore_checkpoint_policy_t;

/** Fills policy with: dir NULL, everything off, keep_full 0 (keep all). NULL is a no-op. */
EMBSTORE_API void embstore_checkpoint_policy_init(embstore_checkpoint_policy_t* policy);
/** Replaces the store's policy (dir is copied). embstore_step then takes a full checkpoint into
    dir when the step crosses a multiple of full_every_steps, or when full_every_seconds have
    passed since the policy was set or the last policy checkpoint; one due while another is
    still being written is deferred to a later step, never skipped. After each checkpoint
    committed into dir, only the newest keep_full full checkpoints are kept; older ones are
    deleted only after the newer one is committed. Retention counts only versions up to the one
    just written: after a restore of an older version, the newer versions of the abandoned run
    are left in dir (and EMBSTORE_LATEST would pick them: write the new run into a new dir, or
    delete them). Retention deletes the newest versions first, so that a crash half-way leaves
    an older part of a chain, never a delta without its parent. The step schedule restarts at
    set_policy and at a restore. dir NULL with everything off turns the policy off; a dir is
    created and its writer lock taken here, and a policy with a schedule has the checkpoint's
    staging_bytes of staging allocated, so that the step taking its first checkpoint does not
    pay for it: on the host in the background from here on; on CUDA allocated and pinned
    before this call returns (about 0.1 s for 256 MiB), since pinning stalls the device's other
    calls and would otherwise land on the training steps. A serving_dir is created
    and its writer lock taken here too. @return OK; INVALID_ARGUMENT (NULL pointer, struct_size
    too small, negative or NaN seconds, a schedule, or a serving_dir, without dir; serving_dir
    is dir or holds a version that is not serving-only; serving_deltas not 0 or 1); BUSY (another writer holds dir or serving_dir); IO_ERROR
    (dir, serving_dir or a lock cannot be created).

    Incremental checkpoints follow the same rules, by incremental_every_steps/_seconds; a full
    one due at the same step wins. */
EMBSTORE_API embstore_status_t
embstore_checkpoint_set_policy(embstore_store_t* store, const embstore_checkpoint_policy_t* policy);

/** A store's checkpoint counters (embstore_checkpoint_stats). */
typedef struct embstore_checkpoint_stats {
  size_t struct_size;          /**< set by the caller to sizeof(embstore_checkpoint_stats_t) */
  uint64_t committed;          /**< checkpoints this store committed */
  uint64_t failed;             /**< checkpoints this store failed to write */
  uint64_t last_version;       /**< newest committed version, EMBSTORE_LATEST when none */
  uint64_t in_flight;          /**< checkpoints captured and not yet committed or failed: 0 or 1 */
  uint64_t rows_written;       /**< rows in committed checkpoints */
  uint64_t bytes_written;      /**< bytes of committed checkpoints (row files, attachments) */
  uint64_t copy_on_write_rows; /**< rows that training calls copied out before updating them */
  double stall_seconds_total;  /**< training calls waiting on the pipeline (staging full, or a
                                   checkpoint call finishing the previous checkpoint) */
  double stall_seconds_max;    /**< the longest single such wait */
  double capture_seconds_last; /**< how long the last capture held the tables */
  uint64_t deltas_committed;   /**< of committed: incremental ones */
  uint64_t deferred;           /**< policy checkpoints deferred because one was in flight */
  /* Fields below came after 0.5 (a smaller struct_size from before gets the fields above). */
  uint64_t serving_published;  /**< versions published to the policy's serving_dir */
  uint64_t serving_skipped;    /**< committed versions of the policy's dir not published there:
                                    the publication failed, or a delta's parent is not there */
} embstore_checkpoint_stats_t;

/** Fills out with the store's checkpoint counters (as many as its struct_size holds).
    @return OK; INVALID_ARGUMENT (NULL pointer, struct_size smaller than 0.5's struct). */
EMBSTORE_API embstore_status_t embstore_checkpoint_stats(embstore_store_t* store,
                                                         embstore_checkpoint_stats_t* out);

/** One checkpoint, as its store saw it: what was written and what training paid for it. */
typedef struct embstore_checkpoint_info {
  size_t struct_size;          /**< set by the caller to sizeof(embstore_checkpoint_info_t) */
  embstore_status_t status;    /**< OK while in flight and once committed; else its failure */
  uint32_t in_flight;          /**< 1 while being written */
  embstore_ckpt_kind_t kind;   /**< as written: an INCREMENTAL request may have been taken FULL */
  uint32_t from_policy;        /**< 1 when embstore_step took it */
  uint64_t version;            /**< the global step at capture */
  uint64_t parent;             /**< incremental: the version it applies on; else EMBSTORE_LATEST */
  uint64_t rows_captured;      /**< rows captured in all tables */
  uint64_t rows_written;       /**< rows in its files, once committed (else 0) */
  uint64_t bytes_written;      /**< bytes of its files, once committed (else 0) */
  double capture_seconds;      /**< how long capture held the tables */
  double write_seconds;        /**< from the end of capture to the commit (or failure, or now) */
  double stall_seconds;        /**< training calls waiting for staging room while it was in
                                   flight, plus the checkpoint call's wait for the previous one */
  uint64_t copy_on_write_rows; /**< rows training calls copied out for it */
} embstore_checkpoint_info_t;

/** Fills out for version, one taken by this store (among its latest 4096); does not wait.
    @return OK; NOT_FOUND (no such version); INVALID_ARGUMENT (NULL pointer, struct_size too
    small). */
EMBSTORE_API embstore_status_t embstore_checkpoint_info(embstore_store_t* store, uint64_t version,
                                                        embstore_checkpoint_info_t* out);

/** Loads version (EMBSTORE_LATEST: the newest committed) from dir and returns it in
    *restored_version_out (may be NULL); sets the store's global step to it. EMBSTORE_LATEST
    passes over version directories without a manifest (not committed) but fails on one whose
    manifest is corrupt; an exact version number takes the full checkpoint when a directory
    holds both kinds. A delta is restored through its chain: the full checkpoint it descends
    from, then each delta, every link checked (the parent exists, is older, of the same lineage,
    and is the version the delta names by its manifest checksum). Everything read is checked
    before the store is changed (each manifest's checksum, names and paths; every file's size,
    block checksums and whole-file checksum; row counts): on any error the store is left as it
    was. embstore-ckpt verify makes the same checks and exits 0 exactly when this succeeds. Tables
    missing from the store are created exactly as they were configured (optimizer and
    hyperparameters, initializer and seed), so training continues as if it had never stopped; an
    existing table must match in dim and optimizer, keeps its own hyperparameters and has its rows
    replaced. Tables of the store that the checkpoint lacks are left alone. The checkpoint's
    attachments become readable by embstore_restore_attachment. Works across backends (a checkpoint
    of a HOST store restores into a CUDA one, and back). Waits for a checkpoint in flight. Not
    concurrently with calls on the store's tables.
    A checkpoint written by any number of ranks restores into a store of one process (every
    table whole, no communicator needed) or, collectively, into the W' ranks of a sharded store:
    each rank keeps the rows of the keys embstore_shard_of gives it among W' (each row file is
    read once in all: at W' equal to the writers' world size each rank reads its own files,
    else the ranks share the files out and send each row to its owner through the
    communicator, in rounds of about 8 MB per rank; admission count files, small, are read by
    every rank), exact
    admission counts follow their keys, a Bloom filter is the rank's own where W' equals the
    writers' world size and else the sum of every rank's (so keys may be admitted sooner), and
    each rank gets the attachments its rank wrote (none where the writers had fewer ranks; those
    of writer ranks at or past W' are not restored: embstore-ckpt reshard refuses to drop them).
    Before any rank installs anything, the ranks agree that they loaded the same version and
    that their rows add up to each table's rows (every row loaded once); any rank's failure fails
    the restore on every rank, and every store is left as it was.
    Needs memory for the restored tables beside the ones they replace, unless the store's
    restore_spill parks the replaced host tables in a spill file first (then about one table's
    worth beside the store; a failed restore reads them back, and if that read fails the restore
    returns IO_ERROR naming the tables whose rows are lost). Takes no lock: reading a directory
    while its writer goes on is safe, except that the writer's retention may delete the version
    being read (restore then fails, and can be retried).
    @param store the store
    @param [in] dir the checkpoint directory
    @param version the version, or EMBSTORE_LATEST
    @param [out] restored_version_out the version restored, or NULL
    @return OK; BUSY (other threads are
    inside calls on the store's tables, see "data path"; nothing was done);
    INVALID_ARGUMENT (NULL store or dir, dim or optimizer mismatch); NOT_FOUND (dir missing, no
    committed checkpoint, or no such version); CORRUPT (checksum, size or format mismatch, or a
    broken chain: file and offset in embstore_last_error()); IO_ERROR; COMM_ERROR;
    CAPACITY_EXCEEDED (more rows than an existing table's max_capacity); OUT_OF_MEMORY;
    DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_restore(embstore_store_t* store, const char* dir,
                                                uint64_t version, uint64_t* restored_version_out);
/** Copies the attachment `name` of the last restored checkpoint into buf and its size into
    *bytes_out. buf may be NULL with capacity 0 to ask for the size.
    @param store the store
    @param [in] name the attachment's name
    @param [out] buf capacity bytes of host memory, or NULL
    @param capacity buf's size in bytes
    @param [out] bytes_out the attachment's size
    @return OK; NOT_FOUND (no
    restore yet, or no such attachment); INVALID_ARGUMENT (NULL store, name or bytes_out;
    capacity smaller than the attachment: *bytes_out is still set). */
EMBSTORE_API embstore_status_t embstore_restore_attachment(embstore_store_t* store,
                                                           const char* name, void* buf,
                                                           size_t capacity, size_t* bytes_out);

/** Table regexes (a warm start source's and a follower's tables_regex) are RE2's syntax
    (github.com/google/re2/wiki/Syntax), not ECMAScript's: no backreferences (`\1`) and no
    lookaround ((?=...), (?!...), (?<=...)), which are INVALID_ARGUMENT; the rest of what table
    names need (., *, +, ?, {n,m}, |, groups, classes, `\d`, `\w`, ^, $) is the same. A regex
    matches in time linear in the name whatever its form, and is at most this many bytes long
    (a longer one is INVALID_ARGUMENT). */
#define EMBSTORE_MAX_TABLES_REGEX_BYTES 1024

/** One source of a warm start (embstore_warm_start); fill it with
    embstore_warm_start_source_init. */
typedef struct embstore_warm_start_source {
  size_t struct_size;       /**< set by embstore_warm_start_source_init */
  const char* dir;          /**< the checkpoint directory; must be set */
  uint64_t version;         /**< default EMBSTORE_LATEST: the newest committed */
  const char* tables_regex; /**< default ".*": every table */
  uint32_t flags;           /**< 0 (default) or EMBSTORE_WARM_START_VALUES_ONLY */
} embstore_warm_start_source_t;
#define EMBSTORE_WARM_START_VALUES_ONLY 1u /**< values without optimizer state or counts */

/** Fills source with the defaults above (dir NULL). NULL is a no-op.
    @param source the source to fill, or NULL */
EMBSTORE_API void embstore_warm_start_source_init(embstore_warm_start_source_t* source);

/** Warm start: loads chosen tables of other checkpoints into the store, for transfer learning
    and fine-tuning. Each source names a checkpoint directory, a version of it (EMBSTORE_LATEST:
    the newest committed) and a regular expression, tables_regex (RE2 syntax, above), that must
    match a table's whole name. Each table that sources match is loaded from the last source
    that matches it (a later source overrides an earlier one, table by table); tables that no
    source matches keep their rows and state; a matched table the store lacks is created with the
    configuration its manifest records. A source whose version has no table its regex matches is
    NOT_FOUND: a regex that selects nothing is taken as a mistake.
    A loaded table replaces the store's table of that name whole (its rows the source lacks are
    gone; its handle stays valid) with the source's values, optimizer state and admission counts,
    as embstore_restore loads them: the chain applied, every checksum verified, from a
    checkpoint of any world size (a sharded store keeps each rank's keys, a store of one process
    every key). With flags EMBSTORE_WARM_START_VALUES_ONLY a source gives values only: each
    row's optimizer state is a new row's for the store's table (whose optimizer may then differ
    from the source's) and admission counts start empty, for fine-tuning with a fresh optimizer.
    The store's global step does not change (loaded rows count as touched at it). Every source's
    attachments of this rank become readable by embstore_restore_attachment (a later source's
    replacing an earlier one's of the same name; none from a source of fewer ranks). The store's
    next checkpoint is full: the loaded rows are not dirty, so no delta could hold them.
    Collective on a sharded store: every rank passes the same sources, and the ranks agree that
    they loaded the same tables of the same versions. Like embstore_restore, nothing changes
    unless every chosen table loaded and checked, memory is needed (or spilled) the same way, and
    a checkpoint in flight is waited for.
    @param store the store
    @param [in] sources n sources, each filled by embstore_warm_start_source_init first
    @param n the number of sources, at least 1
    @return OK; BUSY (as embstore_restore); INVALID_ARGUMENT
    (NULL store; n == 0;
    NULL sources; a source with struct_size too small, a NULL or empty dir, a NULL tables_regex,
    one longer than EMBSTORE_MAX_TABLES_REGEX_BYTES or one that does not compile, unknown flags;
    a dim mismatch, or an optimizer mismatch without VALUES_ONLY); NOT_FOUND; CORRUPT;
    IO_ERROR; COMM_ERROR; CAPACITY_EXCEEDED; OUT_OF_MEMORY; DEVICE_ERROR. */
EMBSTORE_API embstore_status_t embstore_warm_start(embstore_store_t* store,
                                                   const embstore_warm_start_source_t* sources,
                                                   size_t n);

/** @} */

/* ------------------------------------------------------------------------------ serving -- */
/** @defgroup serving Serving: followers
    Read-only stores that serve a training run's checkpoint directory and follow its new
    versions.
    @{ */

/** A follower: a read-only store that serves the values of a training run's checkpoint
    directory and moves to its newly committed versions, for serving replicas that keep up with
    training. It loads the newest committed version at create (the chain applied, every checksum
    verified, from a checkpoint of any world size) and keeps values and keys only: no optimizer
    state, no admission counts (keys still pending admission have no row in any checkpoint, so
    they are not served). embstore_follower_poll applies each delta committed since, in order,
    or, when the chain was rebased or pruned, loads the newest version whole. A lookup batch
    reads exactly one version, and a poll never blocks lookups longer than the swap of one
    pointer: a delta's rows are served from beside the table until no lookup of an older version
    is running, then merged into it (memory: the delta's rows, once). A whole version (at create
    and after a rebase) is loaded beside the one served, then swapped in.
    With world_size > 1 the follower is rank `rank` of a serving layout: it holds and serves only
    the keys embstore_shard_of(key, world_size) gives it, whatever the world size of the
    training job.
    Leases: the follower reads the directory without a lock, and writes a lease file into it
    (`embstore.lease.<id>`: pid, host, the version served, an expiry lease_seconds ahead, renewed
    by polls). The trainer's retention (keep_full) keeps the chain of every live lease's version
    and everything newer, ignores expired leases, and removes leases expired for an hour. A
    follower whose version was deleted anyway (its lease expired, files removed by hand) loads
    the newest version whole and counts it in chain_lost; it never serves a partial version.
    Expiry compares wall clocks: followers on other hosts need clocks in sync (NTP).
    Background polling: with poll_interval_ms, a thread polls at that interval, and at once when
    a version is committed where inotify reports it (local file systems; not NFS); its failures
    are in the stats (last_poll_status), and it keeps serving the last version applied. Without
    it, poll at least every lease_seconds / 2 to keep the lease. The rows stay in host memory on
    either backend; with backend CUDA, lookups take device pointers (see the config). */
typedef struct embstore_follower embstore_follower_t;

/** A follower's configuration (embstore_follower_create): fill it with
    embstore_follower_config_init, then set dir and the fields wanted. */
typedef struct embstore_follower_config {
  size_t struct_size;         /**< set by embstore_follower_config_init */
  const char* dir;            /**< the checkpoint directory; copied */
  embstore_backend_t backend; /**< AUTO (default) and HOST: lookups take host pointers; CUDA:
                                  device pointers of `device` (the rows stay in host memory:
                                  each lookup copies its keys to the host and its rows back) */
  const char* tables_regex;   /**< RE2 syntax (EMBSTORE_MAX_TABLES_REGEX_BYTES), matching whole
                                  names; NULL or ".*" (default): every table of the version
                                  loaded at create */
  int rank;                   /**< the serving layout; default 0 */
  int world_size;             /**< default 1: every key */
  uint32_t flags;             /**< 0 (default): keys without a row read as zeros;
                                  EMBSTORE_FOLLOWER_INITIAL_VALUES: as the table's initializer
                                  gives them (what training would insert);
                                  EMBSTORE_FOLLOWER_INTERVAL_ONLY: background polls at the
                                  interval only, never woken by inotify (to measure or bound
                                  what a directory without inotify, such as NFS, gives) */
  uint32_t poll_interval_ms;  /**< 0 (default): polls by embstore_follower_poll only; else a
                                  background thread polls at this interval */
  uint32_t lease_seconds;     /**< the lease's length; default 60; 0: no lease (retention may then
                                  delete what the follower reads) */
  uint64_t apply_bytes_per_second; /**< 0 (default): no limit; else a poll reads its deltas at
                                       most this fast (the rows read: keys, values and optimizer
                                       state), leaving memory bandwidth and caches to the lookups
                                       meanwhile at the cost of a longer lag. The merge that
                                       makes a delta visible, and whole loads, are not paced.
                                       Keep it above the rate the trainer writes deltas at, and a
                                       delta's time well under half of lease_seconds. */
  int device;                      /**< CUDA: the device of the lookups' pointers; default 0 */
} embstore_follower_config_t;
#define EMBSTORE_FOLLOWER_INITIAL_VALUES 1u /**< flags: keys without a row read as initialized */
#define EMBSTORE_FOLLOWER_INTERVAL_ONLY 2u  /**< flags: background polls at the interval only */

/** A follower's counters (embstore_follower_stats). */
typedef struct embstore_follower_stats {
  size_t struct_size;                 /**< set by the caller to sizeof(embstore_follower_stats_t) */
  uint64_t version;                   /**< the version served */
  uint64_t versions_applied;          /**< deltas applied by polls */
  uint64_t full_loads;                /**< whole versions loaded: at create, and after rebases */
  uint64_t lookups;                   /**< lookup batches served */
  double last_apply_seconds;          /**< the last poll's (or load's) reading and applying */
  uint64_t polls;                     /**< polls done, by the caller and the background thread */
  uint64_t chain_lost;                /**< the version served was deleted: the newest loaded
                                           whole */
  embstore_status_t last_poll_status; /**< OK, or why the last poll failed (then see
                                          embstore_last_error of that poll, or the log line) */
  double last_lag_seconds; /**< from the commit of the newest version a poll made visible (its
                               directory's rename, as its ctime says) to lookups reading it;
                               0 before the first (the version loaded at create is not
                               counted: it may have been committed long before) */
  double lag_p50_seconds;  /**< the same over the last 1024 versions polls made visible
                               (median) */
  double lag_p99_seconds;  /**< the same, 99th percentile */
  /* Fields below came after 0.5; a caller built against an older header gets the others. */
  uint64_t delta_bytes_read;   /**< bytes of the deltas' row files whose rows polls applied */
  uint64_t serving_files_read; /**< values-only files (serving_deltas) whose rows were applied */
  uint64_t serving_fallbacks;  /**< values-only files that did not read (missing, corrupt): the
                                   delta's whole files were read instead */
} embstore_follower_stats_t;

/** Fills config with the defaults above. NULL is a no-op.
    @param config the config to fill, or NULL */
EMBSTORE_API void embstore_follower_config_init(embstore_follower_config_t* config);
/** Creates a follower of config->dir (see embstore_follower_t) into *out.
    @param [in] config the configuration
    @param [out] out the new follower
    @return OK; INVALID_ARGUMENT (NULL pointer, struct_size too small, empty dir, rank outside
    world_size, unknown flags, a regex longer than EMBSTORE_MAX_TABLES_REGEX_BYTES or that does
    not compile, device < 0); UNSUPPORTED (CUDA without a usable device or a CUDA build);
    NOT_FOUND (no directory, no committed version, no table matching); CORRUPT; IO_ERROR;
    OUT_OF_MEMORY. */
EMBSTORE_API embstore_status_t embstore_follower_create(const embstore_follower_config_t* config,
                                                        embstore_follower_t** out);
/** Reads the rows of keys (n x dim floats out) of one version: host memory, or on CUDA device
    memory, with the copies enqueued on stream (a cudaStream_t; NULL: the legacy default stream)
    and waited for before the call returns. Any number of threads, also while another polls.
    @param follower the follower
    @param [in] table the table's name
    @param [in] keys n keys: host memory, or device memory on CUDA
    @param n the number of keys
    @param [out] values_out n x dim floats: host memory, or device memory on CUDA
    @param stream a cudaStream_t on CUDA, NULL: the legacy default stream
    @return OK; INVALID_ARGUMENT (NULL pointer with n > 0, a table not served, a key of another
    rank of the serving layout); DEVICE_ERROR (a copy failed). */
EMBSTORE_API embstore_status_t embstore_follower_lookup(embstore_follower_t* follower,
                                                        const char* table, const int64_t* keys,
                                                        size_t n, float* values_out, void* stream);
/** Moves to the newest committed version and sets *version_out (may be NULL) to the version
    served. One poll at a time per follower (others wait). A delta that fails its checks is not
    served: the poll returns CORRUPT and the follower stays on the last version it applied
    (the deltas before the bad one are applied). Tables created after the version loaded at
    create are not served until the next whole load. A table served keeps its dim: a newer
    full checkpoint that changes it is refused with INVALID_ARGUMENT (create a new follower).
    @param follower the follower
    @param [out] version_out the version served, or NULL
    @return OK; CORRUPT; IO_ERROR; NOT_FOUND (the directory or its versions went);
    INVALID_ARGUMENT (a dim changed); OUT_OF_MEMORY; BUSY (embstore_follower_cancel was
    called). */
EMBSTORE_API embstore_status_t embstore_follower_poll(embstore_follower_t* follower,
                                                      uint64_t* version_out);
/** Sets *version_out to the version the follower serves, without polling. @return OK;
    INVALID_ARGUMENT (NULL pointer). */
EMBSTORE_API embstore_status_t embstore_follower_version(embstore_follower_t* follower,
                                                         uint64_t* version_out);
/** Sets *dim_out to the dim of a table the follower serves. @return OK; INVALID_ARGUMENT (NULL
    pointer); NOT_FOUND (the follower serves no such table). */
EMBSTORE_API embstore_status_t embstore_follower_table_dim(embstore_follower_t* follower,
                                                           const char* table, uint32_t* dim_out);
/** Fills out with the follower's counters.
    A struct_size of the first version (up to last_apply_seconds) gets those fields only.
    @return OK; INVALID_ARGUMENT (NULL pointer, struct_size too small). */
EMBSTORE_API embstore_status_t embstore_follower_stats(embstore_follower_t* follower,
                                                       embstore_follower_stats_t* out);
/** Stops the background thread and removes the lease. NULL is a no-op. No lookup or poll of the
    caller's may be running. */
EMBSTORE_API embstore_status_t embstore_follower_destroy(embstore_follower_t* follower);
/** For a caller about to destroy the follower while another thread may be in
    embstore_follower_poll: that poll returns soon with BUSY (at its next block of rows, pace
    check or version; a paced poll stops waiting out its pace), applying no further version
    (deltas it applied before stay applied), and later polls fail with BUSY; lookups go on,
    serving what the follower served. Not reversible. The caller still waits for the cancelled
    poll to return before embstore_follower_destroy. @return OK; INVALID_ARGUMENT (NULL
    follower). */
EMBSTORE_API embstore_status_t embstore_follower_cancel(embstore_follower_t* follower);

/** @} */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EMBSTORE_EMBSTORE_H_ */
