/*
 * sdpa_jit.h — the one public header of sdpa-jit.
 *
 * sdpa-jit computes the backward pass of scaled-dot-product attention
 * (dQ, dK, dV) on NVIDIA GPUs with kernels specialized per shape class,
 * compiled at run time by NVRTC and kept in an SQLite cache on disk.
 *
 * Lifecycle
 * ---------
 *   sdpa_runtime_create        once per process (or per cache location)
 *     sdpa_bwd_plan_create     validate a descriptor, pick tiles, build the key
 *     sdpa_bwd_workspace_size  the caller allocates that many device bytes
 *     sdpa_bwd_compile         find or build the cubin, load it in the current
 *                              CUDA context (memory → SQLite → NVRTC)
 *     sdpa_bwd_execute         bind pointers and launch on the caller's stream
 *     sdpa_bwd_plan_destroy
 *   sdpa_runtime_destroy       after every plan made from it is destroyed
 *
 * Ownership
 * ---------
 * Every handle returned through an `out` parameter belongs to the caller and
 * has a destroy/free function that accepts NULL. Strings returned by the
 * library (`sdpa_bwd_plan_key`, `sdpa_last_error`, ...) are owned by the
 * object they came from and live as long as it does (the thread, for
 * `sdpa_last_error`, until the next failing call on that thread).
 * Device memory (tensors, workspace) always belongs to the caller.
 *
 * Threads and processes
 * ---------------------
 * A runtime may be shared by any number of threads. A plan may be executed
 * from several threads at once once it is compiled; compiling a plan and
 * destroying it must not race with other calls on the same plan. The cache
 * file may be shared by any number of processes: each key is compiled once
 * and stored once across them. Work runs in the calling thread's current
 * CUDA context; when none is current, the device's primary context is
 * retained and made current (so PyTorch tensors and streams work).
 *
 * Errors
 * ------
 * Every call that can fail returns sdpa_status. `sdpa_status_name()` names a
 * code; `sdpa_last_error()` returns a thread-local message a person can act
 * on. Nothing in the library prints to stdout, exits or aborts; warnings
 * (e.g. an unwritable cache location) go to the runtime's log callback, by
 * default one line on stderr.
 *
 * The header needs no CUDA header: device pointers are `void *` (a
 * CUdeviceptr / PyTorch data_ptr cast to a pointer) and the stream is a
 * `CUstream` / `cudaStream_t` passed as `void *` (NULL: the legacy stream).
 */
#ifndef SDPA_JIT_H
#define SDPA_JIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SDPA_JIT_VERSION_MAJOR 0
#define SDPA_JIT_VERSION_MINOR 1
#define SDPA_JIT_VERSION_PATCH 0
#define SDPA_JIT_VERSION_STRING "0.1.0"

#if defined(_WIN32)
#define SDPA_API
#else
#define SDPA_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- status */

/* Status codes. Append-only: values never change meaning. */
typedef enum sdpa_status {
  SDPA_STATUS_SUCCESS = 0,
  SDPA_STATUS_INVALID_ARGUMENT = 1, /* a field or argument is out of range  */
  SDPA_STATUS_NOT_SUPPORTED = 2,    /* valid, but not on this arch/build    */
  SDPA_STATUS_OUT_OF_MEMORY = 3,    /* host or device allocation failed     */
  SDPA_STATUS_COMPILE_FAILED = 4,   /* NVRTC rejected the kernel: see log   */
  SDPA_STATUS_DRIVER_ERROR = 5,     /* a CUDA driver call failed            */
  SDPA_STATUS_NO_DEVICE = 6,        /* no CUDA driver or device available   */
  SDPA_STATUS_CACHE_ERROR = 7,      /* the cache could not be read/written  */
  SDPA_STATUS_NOT_FOUND = 8,        /* no such cache entry                  */
  SDPA_STATUS_NOT_COMPILED = 9,     /* execute before a successful compile  */
  SDPA_STATUS_DEVICE_ERROR = 10,    /* a kernel reported bad input (e.g. a
                                       THD sequence longer than its max_s)  */
  SDPA_STATUS_INTERNAL = 11         /* a bug: please report with the message */
} sdpa_status;

/* Returns a static string naming `status` ("SDPA_STATUS_INVALID_ARGUMENT"),
 * or "SDPA_STATUS_UNKNOWN" for a value outside the enum. Never NULL. */
SDPA_API const char *sdpa_status_name(sdpa_status status);

/* Returns the message of the last failing call on this thread, or "" when
 * none has failed. The string lives until the next failing call on the
 * same thread. Never NULL. */
SDPA_API const char *sdpa_last_error(void);

/* Returns the library's version string, e.g. "0.1.0". */
SDPA_API const char *sdpa_version(void);

/* ---------------------------------------------------------------- runtime */

typedef struct sdpa_runtime sdpa_runtime;

/* Log levels passed to a log callback. */
typedef enum sdpa_log_level {
  SDPA_LOG_WARNING = 1,
  SDPA_LOG_INFO = 2
} sdpa_log_level;

typedef void (*sdpa_log_fn)(sdpa_log_level level, const char *message,
                            void *user);

#define SDPA_RUNTIME_OPTIONS_VERSION 2

/* How the runtime may use the user's cache database. */
typedef enum sdpa_cache_access {
  /* Open it, creating the file and its directory when missing; store
   * what NVRTC compiles (the default). */
  SDPA_CACHE_READ_WRITE = 0,
  /* Open an existing file read-only (immutable on a read-only file
   * system); create and write nothing, no directory, no lock file. What
   * NVRTC compiles stays in memory. For inspection. */
  SDPA_CACHE_READ_ONLY = 1,
  /* Open an existing file for writing (maintenance: prune, verify); create
   * nothing. */
  SDPA_CACHE_READ_WRITE_EXISTING = 2
} sdpa_cache_access;

/* Options for sdpa_runtime_create. Initialize with
 * SDPA_RUNTIME_OPTIONS_INIT (or sdpa_runtime_options_init) and set what you
 * need; zero means "default" everywhere. A struct of version 1 (the
 * fields up to `log_user`) is still accepted. */
typedef struct sdpa_runtime_options {
  unsigned int version; /* SDPA_RUNTIME_OPTIONS_VERSION */

  /* The user's writable cache database. NULL: $SDPA_JIT_CACHE, else
   * $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else
   * ~/.cache/sdpa-jit/kernels.sqlite, else a temporary directory. The
   * directory must be the user's own (see "The cache's trust model"). */
  const char *cache_path;

  /* Read-only databases shipped with an image, searched before the user's
   * database, opened immutable. May be NULL when count is 0. They are
   * trusted as the files they are: whoever can write them decides what
   * this process runs. */
  const char *const *readonly_cache_paths;
  size_t readonly_cache_count;

  /* Nonzero: keep compiled kernels in memory only (no database at all). */
  int disable_disk_cache;

  /* Size cap of the user's database in bytes; least recently used entries
   * are pruned when a store passes it. 0: 4 GiB. */
  int64_t cache_max_bytes;

  /* Target compute capability as major*10+minor (80, 86, 89, 90, 120). 0:
   * the current device's. Lets a build host without a GPU compile and
   * preheat. Plans may override it per descriptor. */
  int arch;

  /* Warnings and notes. NULL: one line on stderr per warning. */
  sdpa_log_fn log;
  void *log_user;

  /* ---- version 2 ---- */

  /* SDPA_CACHE_READ_WRITE (default) or SDPA_CACHE_READ_ONLY. */
  sdpa_cache_access cache_access;

  /* Nonzero: a user database that cannot be used (not ours, damaged and
   * not recoverable, an untrusted directory, missing under READ_ONLY)
   * fails sdpa_runtime_create with SDPA_STATUS_CACHE_ERROR instead of
   * falling back to memory with a warning. */
  int cache_required;

  /* A file holding the secret of keyed checksums (at least 16 bytes; owned
   * by root or the user, writable by nobody else). NULL:
   * $SDPA_JIT_CACHE_KEY_FILE, else the secret $SDPA_JIT_CACHE_KEY itself,
   * else none. With a secret every row is stored with an HMAC-SHA256 of
   * its key and cubin, and a row whose MAC does not verify is never
   * loaded: for fleets that share a cache over a network file system. */
  const char *cache_key_file;
} sdpa_runtime_options;

#define SDPA_RUNTIME_OPTIONS_INIT                                             \
  {SDPA_RUNTIME_OPTIONS_VERSION, NULL, NULL, 0, 0, 0, 0, NULL, NULL,          \
   SDPA_CACHE_READ_WRITE, 0, NULL}

/* Initializes `opts` to defaults for struct `version`. Returns
 * SDPA_STATUS_INVALID_ARGUMENT when opts is NULL or version is unknown. */
SDPA_API sdpa_status sdpa_runtime_options_init(sdpa_runtime_options *opts,
                                               unsigned int version);

/* Creates a runtime: opens (or creates) the cache databases and loads NVRTC.
 * Does not need a GPU or a CUDA driver. A cache location that cannot be
 * used is not an error unless options.cache_required is set: the runtime
 * warns once and keeps compiled kernels in memory. Reads the tuning
 * environment variables (SDPA_JIT_FAMILY, SDPA_JIT_TILES, ...: README)
 * once, as the defaults of its plans' options. `opts` may be NULL for all
 * defaults. On success *out is a runtime the caller frees with
 * sdpa_runtime_destroy.
 *
 * The cache's trust model. A cubin loaded from the cache runs with the
 * process's rights, so the user's database is trusted only when its
 * directory (symbolic links resolved once) is owned by the effective user
 * and writable by nobody else, every directory above it is owned by the
 * user or root and writable by nobody else (or sticky, like /tmp), and
 * the file itself is a regular file (not a link) owned by the user and
 * writable by nobody else; otherwise the runtime warns once and works in
 * memory. A file is ours when it is an SQLite database with our
 * application_id and schema; a file that is not provably ours is never
 * renamed, rewritten or adopted, only reported. An empty file or a new
 * path is created only under SDPA_CACHE_READ_WRITE. Lock files are opened
 * without following links and without blocking, and must be regular
 * files. Every cubin is checked to be an ELF image of the CUDA machine for
 * the key's arch, with its sections inside the blob, before the driver
 * sees it; with a keyed checksum (cache_key_file) it must also carry a
 * valid MAC. Shipped databases (readonly_cache_paths) are trusted as the
 * files they are. */
SDPA_API sdpa_status sdpa_runtime_create(sdpa_runtime **out,
                                         const sdpa_runtime_options *opts);

/* Destroys a runtime: flushes cache hit counters, unloads modules it
 * loaded, closes the databases. NULL is a no-op. Destroy every plan first. */
SDPA_API void sdpa_runtime_destroy(sdpa_runtime *runtime);

/* The path of the user's cache database (its directory resolved), or NULL
 * when the runtime works in memory (disabled, or the location could not be
 * used). */
SDPA_API const char *sdpa_runtime_cache_path(const sdpa_runtime *runtime);

/* Where the user's cache database is by default: $SDPA_JIT_CACHE, else
 * $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else
 * ~/.cache/sdpa-jit/kernels.sqlite, else <temp dir>/sdpa-jit-<uid>/
 * kernels.sqlite. Writes it into buf (size bytes) and returns buf ("" when
 * it does not fit). Creates nothing. */
SDPA_API const char *sdpa_cache_default_location(char *buf, size_t size);

/* The arch (major*10+minor) plans use when their descriptor says 0: the
 * options' arch, else the current device's. Returns 0 and records a
 * message when neither is available. */
SDPA_API int sdpa_runtime_arch(sdpa_runtime *runtime);

/* ------------------------------------------------------------ descriptor */

typedef enum sdpa_dtype {
  SDPA_DTYPE_FP16 = 1,
  SDPA_DTYPE_BF16 = 2
} sdpa_dtype;

typedef enum sdpa_layout {
  SDPA_LAYOUT_BSHD = 1, /* [batch, seq, heads, dim] with declared strides */
  SDPA_LAYOUT_THD = 2   /* packed varlen [tokens, heads, dim], cu_seqlens  */
} sdpa_layout;

typedef enum sdpa_mask {
  SDPA_MASK_NONE = 0,
  SDPA_MASK_CAUSAL_TOP_LEFT = 1,     /* key j visible to query i iff j <= i */
  SDPA_MASK_CAUSAL_BOTTOM_RIGHT = 2, /* iff j <= i + seqlen_kv - seqlen_q  */
  SDPA_MASK_SLIDING_WINDOW = 3       /* iff i+off-left <= j <= i+off+right,
                                        off = seqlen_kv - seqlen_q; -1 is
                                        unbounded on that side             */
} sdpa_mask;

/* Element strides of a [batch, seq, heads, dim] tensor; the last dim is
 * contiguous. Under THD `batch` is ignored and `seq` is the token stride.
 * All three zero: the packed default for the layout. */
typedef struct sdpa_strides {
  int64_t batch, seq, head;
} sdpa_strides;

/* LSE, the forward's log-sum-exp: for query row i of head h,
 *   LSE[h, i] = ln( sum_j exp(scale * q_i . k_j) )  over the keys j the
 * mask lets row i see, natural log, fp32 (FlashAttention's softmax_lse, the
 * logsumexp PyTorch's fused forwards return); -inf for a row that sees no
 * key. The backward recomputes P = exp(scale * q.k - LSE) from it.
 *
 * Element strides of the fp32 LSE tensor. BSHD: LSE[b, h, s] at
 * b*batch + h*head + s*seq. THD: LSE[h, t] at h*head + t*seq (batch
 * ignored). All three zero: packed ([b, h, s], or [h, total_q]). */
typedef struct sdpa_lse_strides {
  int64_t batch, head, seq;
} sdpa_lse_strides;

#define SDPA_BWD_DESC_VERSION 1

/* What to compute. Initialize with SDPA_BWD_DESC_INIT, then set fields. */
typedef struct sdpa_bwd_desc {
  unsigned int version; /* SDPA_BWD_DESC_VERSION */
  sdpa_dtype dtype;
  sdpa_layout layout;
  int batch;      /* BSHD: batch size; THD: number of sequences          */
  int heads_q;    /* query heads                                         */
  int heads_kv;   /* key/value heads; divides heads_q (GQA, MQA)          */
  int seqlen_q;   /* BSHD: query length; THD: max query length (max_s)   */
  int seqlen_kv;  /* BSHD: key length;   THD: max key length (max_s)     */
  int head_dim;   /* of Q and K                                          */
  int head_dim_v; /* of V, O, dO; 0 means head_dim                       */
  /* Element strides; zero means packed. dout is dO, the output gradient. */
  sdpa_strides q, k, v, o, dout, dq, dk, dv;
  sdpa_lse_strides lse;
  /* THD only: upper bounds on total query / key tokens the workspace is
   * sized for; 0 means batch * seqlen_q (resp. seqlen_kv). */
  int64_t max_total_q, max_total_kv;
  sdpa_mask mask;
  int window_left, window_right; /* SDPA_MASK_SLIDING_WINDOW; -1 unbounded */
  float scale;                   /* 0: 1/sqrt(head_dim)                    */
  int deterministic;             /* nonzero: bitwise reproducible results */
  int arch;                      /* 0: the runtime's arch                  */
} sdpa_bwd_desc;

#define SDPA_BWD_DESC_INIT                                                    \
  {SDPA_BWD_DESC_VERSION, (sdpa_dtype)0, (sdpa_layout)0, 0, 0, 0, 0, 0, 0, 0, \
   {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0},          \
   {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, 0, 0, SDPA_MASK_NONE, -1, -1, 0.0f, 0, 0}

/* ------------------------------------------------------------------ plan */

typedef struct sdpa_bwd_plan sdpa_bwd_plan;

/* Kernel families. The family is a key field. */
typedef enum sdpa_family {
  SDPA_FAMILY_AUTO = 0,  /* the fastest family that covers the descriptor */
  SDPA_FAMILY_MMA = 1,   /* mma.sync: sm_80 and later (every arch)        */
  SDPA_FAMILY_HOPPER = 2 /* wgmma + TMA, warp-specialized: sm_90 (H100,
                            H200); compiled for sm_90a                    */
} sdpa_family;

/* Who writes dQ (a key field). */
typedef enum sdpa_dq_writer {
  SDPA_DQ_DEFAULT = 0, /* $SDPA_JIT_DQ_CONVERT, else the convert kernel  */
  SDPA_DQ_CONVERT = 1, /* a convert kernel after the main kernel         */
  SDPA_DQ_MAIN = 2     /* the main kernel itself (one kernel fewer)      */
} sdpa_dq_writer;

/* A two-valued plan choice. */
typedef enum sdpa_switch {
  SDPA_SWITCH_DEFAULT = 0, /* the runtime's default (its environment)   */
  SDPA_SWITCH_ON = 1,
  SDPA_SWITCH_OFF = 2
} sdpa_switch;

#define SDPA_BWD_PLAN_OPTIONS_VERSION 5 /* versions 1 to 4 (without the later fields) are accepted */

/* Choices of a plan beyond the descriptor: tuning and testing. Initialize
 * with SDPA_BWD_PLAN_OPTIONS_INIT; zero means "the runtime's default",
 * which is the environment variable named with each field (read once,
 * when the runtime was created) or else the library's choice. */
typedef struct sdpa_bwd_plan_options {
  unsigned int version; /* SDPA_BWD_PLAN_OPTIONS_VERSION */
  /* SDPA_JIT_FAMILY (auto, mma, hopper): AUTO takes the Hopper family on
   * sm_90 where it covers the descriptor, else mma.sync; a forced family
   * that cannot run the descriptor fails the plan (NOT_SUPPORTED). */
  sdpa_family family;
  /* SDPA_JIT_TILES ("q_tile,kv_tile,warps,stages"): all four zero: the
   * tile rule's; else these (the mma.sync family: tiles 32, 64 or 128,
   * warps 4 or 8, stages 1 or 2; they must fit shared memory). */
  int q_tile, kv_tile, warps, stages;
  /* SDPA_JIT_DQ_CONVERT (convert, main). */
  sdpa_dq_writer dq_writer;
  /* SDPA_JIT_SMALL_GRID (1, 0): 64-row kv tiles for small BSHD grids. */
  sdpa_switch small_grid;
  /* SDPA_JIT_GRAPHS (1, 0): execute through CUDA graphs. */
  sdpa_switch graphs;
  /* SDPA_JIT_ORDER_GROUP: (sequence, kv head) pairs one group of the
   * masked launch order spans; 0: about 256 blocks' worth (deterministic
   * plans whose dQ adds go in index order: every pair). Any count is
   * correct; it changes the speed only. */
  int order_group;
  /* SDPA_JIT_CONFIG_ARCH (testing): pick tiles as for this arch's shared
   * memory (at most the target's) while compiling for the target. */
  int config_arch;
  /* Version 2. SDPA_JIT_ANY_HEAD_DIM (1, 0): ON (the default) plans every
   * head dim the kernels are built for (head_dim a multiple of 8 from 8 to
   * 256, head_dim_v a multiple of 8 up to head_dim), each compiled for its
   * exact value; OFF restricts plans to the measured table's head dims,
   * 32, 64, 96, 128, 192 and 256 (either head dim), and a plan for another
   * fails with NOT_SUPPORTED naming the restriction. */
  sdpa_switch any_head_dim;
  /* Version 3. SDPA_JIT_HEAD_CHUNKS: the Hopper family (not deterministic)
   * may split a kv tile's group of query heads (GQA / MQA) over this many
   * blocks, each adding its dK / dV in fp32 to the workspace, which the
   * convert kernel writes out; the largest divisor of the group up to it
   * is taken (1: never split). 0: the library's rule. Any count is
   * correct; it changes the speed and the workspace size only. */
  int head_chunks;
  /* Version 4. SDPA_JIT_TAIL_SPLIT: the Hopper family's grids of equal
   * tiles (BSHD, no mask, not deterministic, head_dim <= 128 but the
   * persistent keys) end with a partial wave; its tiles may each run as
   * several blocks over shares of the query rows, summing dK / dV in fp32
   * in the workspace. 0: the library's rule on the device's
   * multiprocessors; 1: never split; n >= 2: the rule as if the device had
   * n multiprocessors (testing: small grids split). Any value is correct;
   * it changes the speed and the workspace size only. */
  int tail_split;
  /* Version 5. SDPA_JIT_LONGEST_FIRST (1, 0): ON (the default): the
   * Hopper family's THD grids without a mask (not deterministic, dQ by
   * the convert kernel) launch their tiles sequence by sequence, the
   * longest query sequence first (the order worked out on the device by
   * the preprocess kernel from cu_seqlens_q, for batches of 2 to 512
   * sequences, kept in the workspace), so that the long tiles do not end
   * the grid (+5% at 8 sequences of 512-4096 tokens, hd 128, on an H100);
   * OFF: batch order. Either is correct; it changes the speed only. */
  sdpa_switch longest_first;
} sdpa_bwd_plan_options;

#define SDPA_BWD_PLAN_OPTIONS_INIT                                            \
  {SDPA_BWD_PLAN_OPTIONS_VERSION, SDPA_FAMILY_AUTO, 0, 0, 0, 0,               \
   SDPA_DQ_DEFAULT, SDPA_SWITCH_DEFAULT, SDPA_SWITCH_DEFAULT, 0, 0,          \
   SDPA_SWITCH_DEFAULT, 0, 0, SDPA_SWITCH_DEFAULT}

/* Validates `desc`, picks the family and tiles for its arch and builds the
 * specialization key and workspace size. Needs no GPU (give an arch). On a
 * bad field returns SDPA_STATUS_INVALID_ARGUMENT (or NOT_SUPPORTED for a
 * valid value this arch cannot run) and sdpa_last_error() names the field
 * and what is allowed. The runtime must outlive the plan. Same as
 * sdpa_bwd_plan_create_with(out, runtime, desc, NULL). */
SDPA_API sdpa_status sdpa_bwd_plan_create(sdpa_bwd_plan **out,
                                          sdpa_runtime *runtime,
                                          const sdpa_bwd_desc *desc);

/* sdpa_bwd_plan_create with plan options (NULL: every default). */
SDPA_API sdpa_status sdpa_bwd_plan_create_with(
    sdpa_bwd_plan **out, sdpa_runtime *runtime, const sdpa_bwd_desc *desc,
    const sdpa_bwd_plan_options *options);

/* Destroys a plan. NULL is a no-op. */
SDPA_API void sdpa_bwd_plan_destroy(sdpa_bwd_plan *plan);

/* Device bytes execute needs as workspace (fp32 dQ accumulator, Delta,
 * flags; where a plan may split tiles, their fp32 dK / dV slots),
 * 256-byte aligned. Under THD sized from max_total_q/kv. */
SDPA_API size_t sdpa_bwd_workspace_size(const sdpa_bwd_plan *plan);

/* The canonical key text of the plan's kernel
 * ("sdpa_bwd;arch=90;dtype=bf16;hd=128;...").
 * Owned by the plan. */
SDPA_API const char *sdpa_bwd_plan_key(const sdpa_bwd_plan *plan);

/* The 32-hex-digit XXH3-128 of the key text, template sources, NVRTC
 * version, options and runtime version: the cache row's id. */
SDPA_API const char *sdpa_bwd_plan_key_hash(const sdpa_bwd_plan *plan);

/* Where the last sdpa_bwd_compile found the kernel. */
typedef enum sdpa_source {
  SDPA_SOURCE_NONE = 0,     /* not compiled yet               */
  SDPA_SOURCE_MEMORY = 1,   /* the in-process table           */
  SDPA_SOURCE_SHIPPED = 2,  /* a read-only shipped database   */
  SDPA_SOURCE_DISK = 3,     /* the user's database            */
  SDPA_SOURCE_COMPILED = 4  /* compiled now by NVRTC          */
} sdpa_source;

/* Makes the plan's kernels ready: from the in-process table, else the
 * databases, else NVRTC (stored afterwards). When a CUDA device is present
 * (and its arch matches the plan's) the module is also loaded into the
 * current context (the primary context is retained if none is current).
 * On a machine without a GPU it stops after the cubin is cached, which is
 * what preheating needs. On NVRTC failure returns
 * SDPA_STATUS_COMPILE_FAILED and sdpa_bwd_plan_compile_log() has the log.
 * Optional OUT `source` says where the kernel came from. */
SDPA_API sdpa_status sdpa_bwd_compile(sdpa_bwd_plan *plan,
                                      sdpa_source *source);

/* NVRTC's log of the last compile of this plan ("" when none). */
SDPA_API const char *sdpa_bwd_plan_compile_log(const sdpa_bwd_plan *plan);

#define SDPA_BWD_PLAN_INFO_VERSION 1

/* What a plan chose, and what its last compile did. Strings are owned by
 * the plan. */
typedef struct sdpa_bwd_plan_info {
  unsigned int version;     /* SDPA_BWD_PLAN_INFO_VERSION                */
  sdpa_family family;       /* MMA or HOPPER                             */
  const char *family_reason; /* why this family, e.g. "sm_90: the Hopper
                               family covers this descriptor" or
                               "deterministic at head_dim 256: the Hopper
                               family's deterministic kernels cover
                               head_dim <= 192"                          */
  int q_tile, kv_tile, warps, stages;
  int smem_bytes;           /* dynamic shared memory of the main kernel */
  sdpa_dq_writer dq_writer; /* CONVERT or MAIN                           */
  int graphs;               /* execute launches through CUDA graphs     */
  sdpa_source source;       /* of the last successful compile            */
  /* After a successful compile: nonzero when the cubin is in a database
   * (found there, or compiled and stored); 0 when it lives in this process
   * only (memory-only cache, a store that failed or was skipped). */
  int stored;
} sdpa_bwd_plan_info;

#define SDPA_BWD_PLAN_INFO_INIT                                               \
  {SDPA_BWD_PLAN_INFO_VERSION, SDPA_FAMILY_AUTO, NULL, 0, 0, 0, 0, 0,          \
   SDPA_DQ_DEFAULT, 0, SDPA_SOURCE_NONE, 0}

/* Fills *out (initialized with SDPA_BWD_PLAN_INFO_INIT: its `version`
 * says which fields the caller knows). */
SDPA_API sdpa_status sdpa_bwd_plan_query(const sdpa_bwd_plan *plan,
                                         sdpa_bwd_plan_info *out);

/* -------------------------------------------------------------- execute */

#define SDPA_BWD_TENSORS_VERSION 1

/* Device pointers. In: q, k, v, o, dout (dtype), lse (fp32). Out: dq, dk,
 * dv (dtype), fully overwritten. THD: cu_seqlens_q/kv are int32 device
 * arrays of batch+1 offsets, total_q/total_kv the token totals (at most the
 * descriptor's max_total_q/kv). Tensor pointers must be 16-byte aligned;
 * lse and cu_seqlens 4-byte aligned. */
typedef struct sdpa_bwd_tensors {
  unsigned int version; /* SDPA_BWD_TENSORS_VERSION */
  const void *q, *k, *v, *o, *dout;
  const float *lse;
  void *dq, *dk, *dv;
  const int32_t *cu_seqlens_q, *cu_seqlens_kv;
  int64_t total_q, total_kv;
} sdpa_bwd_tensors;

#define SDPA_BWD_TENSORS_INIT                                                 \
  {SDPA_BWD_TENSORS_VERSION, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,  \
   NULL, NULL, NULL, 0, 0}

/* Launches preprocess → main (→ dQ convert) on `stream` (a CUstream, or NULL)
 * in the current context. Binds pointers, strides and token totals; never
 * compiles (returns SDPA_STATUS_NOT_COMPILED when the plan's module is not
 * loaded in this context: call sdpa_bwd_compile first). From its second
 * call on a stream the plan launches the kernels as one CUDA graph, made
 * then (up to four streams; held until the plan is destroyed) and updated
 * in place on later calls. Kernel by kernel instead on a stream's first
 * call, while the stream is being captured (the capture records the
 * kernels), on further streams, while another thread is launching the
 * same plan, or with SDPA_JIT_GRAPHS=0. `workspace` is
 * device memory of at least sdpa_bwd_workspace_size() bytes, 256-byte
 * aligned; its contents need not be initialized. Under THD the plan
 * checked dq, dk and dv one token at a time (their token totals are the
 * call's); execute checks them at tensors.total_q / total_kv and returns
 * SDPA_STATUS_INVALID_ARGUMENT, naming the output, when two of its
 * elements would share an address (e.g. a head-major output whose head
 * stride does not cover the call's tokens). Returns
 * SDPA_STATUS_DEVICE_ERROR when an earlier launch of this plan in this
 * context found bad input on the device (a THD sequence longer than its
 * max_s hint, offsets past the token totals); the flag is then cleared. */
SDPA_API sdpa_status sdpa_bwd_execute(sdpa_bwd_plan *plan,
                                      const sdpa_bwd_tensors *tensors,
                                      void *workspace,
                                      size_t workspace_bytes, void *stream);

/* Synchronizes `stream` and reports a device-side input error of this
 * plan's launches (see sdpa_bwd_execute), clearing it. */
SDPA_API sdpa_status sdpa_bwd_sync_check(sdpa_bwd_plan *plan, void *stream);

/* ---------------------------------------------------------- cache access */

/* One cache row, as the inspection calls return it. Strings owned by the
 * array they came in. */
typedef struct sdpa_cache_entry {
  char key_hash[33];
  const char *key_text;
  int arch;
  const char *dtype;  /* "fp16", "bf16"                              */
  int head_dim, head_dim_v;
  int q_tile, kv_tile, warps, stages;
  const char *mask;   /* "none", "causal_tl", "causal_br", "window"  */
  const char *layout; /* "bshd", "thd"                               */
  const char *nvrtc_version;
  int64_t cubin_bytes;
  double compile_ms;
  int64_t created, last_used; /* unix seconds */
  int64_t hits;
  int readonly; /* from a shipped database */
  /* Key fields added with the second cache layout (NULL / -1 on rows of
   * the first, which lacked them). */
  const char *family; /* "mma", "hopper"                                */
  const char *lse;    /* "packed", "strided"                            */
  int deterministic;  /* 0, 1                                           */
  int even;           /* 0, 1                                           */
  const char *dq;     /* "convert", "main"                              */
} sdpa_cache_entry;

/* Calls `fn` once per row of the user's database and of the shipped
 * databases, most recently used first, holding one row at a time (the
 * entry and its strings live until `fn` returns). A nonzero return from
 * `fn` stops the walk (the call then returns SUCCESS). */
typedef int (*sdpa_cache_entry_fn)(const sdpa_cache_entry *entry, void *user);
SDPA_API sdpa_status sdpa_cache_foreach(sdpa_runtime *runtime,
                                        sdpa_cache_entry_fn fn, void *user);

/* Lists the rows of the user's database and of the shipped databases,
 * most recently used first. *out is freed with sdpa_cache_entries_free. */
SDPA_API sdpa_status sdpa_cache_list(sdpa_runtime *runtime,
                                     sdpa_cache_entry **out, size_t *count);

/* Frees what sdpa_cache_list returned. NULL is a no-op. */
SDPA_API void sdpa_cache_entries_free(sdpa_cache_entry *entries,
                                      size_t count);

/* Finds a row by its hash (or a unique prefix of at least 6 hex digits) or
 * by its full key text. Returns SDPA_STATUS_NOT_FOUND when none matches.
 * *out is one entry freed with sdpa_cache_entries_free(*out, 1). */
SDPA_API sdpa_status sdpa_cache_get(sdpa_runtime *runtime, const char *key,
                                    sdpa_cache_entry **out);

/* Copies the cubin of a row (looked up as in sdpa_cache_get) into a buffer
 * the caller frees with sdpa_free. The checksum is verified first. */
SDPA_API sdpa_status sdpa_cache_get_cubin(sdpa_runtime *runtime,
                                          const char *key, void **out,
                                          size_t *size);

/* Frees memory the library returned. NULL is a no-op. */
SDPA_API void sdpa_free(void *pointer);

typedef struct sdpa_cache_stats {
  int64_t entries;
  int64_t cubin_bytes;
  int64_t file_bytes; /* size of the database file(s) on disk */
  int64_t hits;
  double compile_ms_total;
  int64_t readonly_entries;
} sdpa_cache_stats;

/* Totals over the user's and the shipped databases. */
SDPA_API sdpa_status sdpa_cache_stats_get(sdpa_runtime *runtime,
                                          sdpa_cache_stats *out);

/* Verifies every row: its checksum (and MAC, with a keyed checksum) and
 * that its blob is a cubin for its arch, and integrity_check of each file;
 * removes rows that fail from the user's database (never from a shipped
 * one, nor from a database opened read-only). OUT counts may be NULL.
 * sdpa_cache_verify_report also calls `fn` (may be NULL) once per failing
 * row: its hash, key text, what is wrong, and whether it was removed. */
typedef void (*sdpa_cache_problem_fn)(const char *key_hash,
                                      const char *key_text,
                                      const char *problem, int removed,
                                      void *user);
SDPA_API sdpa_status sdpa_cache_verify_report(sdpa_runtime *runtime,
                                              sdpa_cache_problem_fn fn,
                                              void *user, int64_t *checked,
                                              int64_t *removed);
SDPA_API sdpa_status sdpa_cache_verify(sdpa_runtime *runtime,
                                       int64_t *checked, int64_t *removed);

/* Removes least recently used rows of the user's database until its
 * cubins total at most `max_bytes` (negative: no size limit), and rows
 * unused for more than `older_than_seconds` (negative: no age limit).
 * OUT `removed` may be NULL. */
SDPA_API sdpa_status sdpa_cache_prune(sdpa_runtime *runtime,
                                      int64_t max_bytes,
                                      int64_t older_than_seconds,
                                      int64_t *removed);

#ifdef __cplusplus
}
#endif

#endif /* SDPA_JIT_H */
