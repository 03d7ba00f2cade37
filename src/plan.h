/*
 * plan.h — the validated descriptor, its kernel configuration and key.
 *
 * sdpa_bwd_plan_create (plan.c) validates every descriptor field, resolves
 * defaults (packed strides, head_dim_v, scale, arch, THD token bounds),
 * picks a kernel configuration from the per-arch table (config.c), builds
 * the key (key.c) and sizes the workspace. Everything execute needs that
 * does not depend on the call's pointers is here.
 */
#ifndef SDPA_PLAN_H
#define SDPA_PLAN_H

#include <pthread.h>
#include <stdint.h>

#include "sdpa_jit.h"
#include "../templates/sdpa_params.h"
#include "launch.h"

typedef struct sdpa_runtime sdpa_runtime;
typedef struct sdpa_module_entry sdpa_module_entry;

/* A kernel configuration: what the template is instantiated with besides
 * the descriptor's own key fields. */
typedef struct sdpa_kernel_config {
  int q_tile;   /* rows of Q per inner step (M)                    */
  int kv_tile;  /* rows of K/V per CTA (N)                         */
  int warps;    /* warps per CTA of the main kernel                */
  int stages;   /* Q/dO shared-memory buffers (1 or 2)             */
  int smem_bytes; /* dynamic shared memory of the main kernel      */
} sdpa_kernel_config;

/* The fields that enter the key: each one selects different code. */
typedef struct sdpa_key_fields {
  int arch;            /* 80, 86, 89, 90, 100, 120, ...          */
  sdpa_dtype dtype;
  int head_dim, head_dim_v;
  sdpa_kernel_config config;
  int lse_packed;      /* LSE seq stride == 1                    */
  sdpa_layout layout;
  sdpa_mask mask;
  int deterministic;
  int even;            /* BSHD, seqlens multiples of the tiles   */
  int fold_dq;         /* main writes dQ (no convert kernel)     */
} sdpa_key_fields;

/* Text and hash of a key. */
typedef struct sdpa_key {
  char text[512]; /* canonical "arch=90;dtype=bf16;..."              */
  char hash[33];  /* XXH3-128 hex of text + sources + toolchain      */
} sdpa_key;

struct sdpa_bwd_plan {
  sdpa_runtime *runtime;
  sdpa_bwd_desc desc;      /* resolved: packed strides filled in, scale,
                              head_dim_v, arch, max totals set          */
  sdpa_key_fields fields;
  sdpa_key key;
  size_t workspace_bytes;
  /* workspace carve (byte offsets; each 256-aligned) */
  size_t ws_dq_accum, ws_delta, ws_semaphores;
  int64_t rows_q, rows_kv; /* rows the workspace is sized for          */
  int lse_packed_default;  /* LSE strides were all zero: under THD the
                              head stride is the launch's total_q       */
  /* The kernels' parameter block without the call's pointers (and, under
   * THD, its token totals), and the main and convert grids (x). */
  sdpa_kernel_params params;
  int64_t main_grid_x, convert_grid_x;

  /* set by compile */
  pthread_mutex_t lock;
  sdpa_module_entry *module; /* loaded in `module_ctx`, or NULL        */
  void *module_ctx;          /* CUcontext the module was loaded in      */
  void *cubin;               /* the plan's cubin (owned by runtime table)*/
  size_t cubin_size;
  sdpa_source source;
  char *compile_log;

  /* execute's launch graphs, one per (context, stream) (launch.h) */
  sdpa_launch_graphs graphs;
};

/* 16-row blocks of the dQ accumulator for `rows_q` query rows (layout in
 * templates/sdpa_params.h): BSHD batch * ceil(seqlen_q / 16); THD
 * rows_q / 16 + batch + 1, every sequence starting a block of its own. */
int64_t sdpa_dq_blocks(const sdpa_bwd_desc *resolved, int64_t rows_q);

/* Fills a resolved copy of `desc` and validates it; on failure returns the
 * status with a message naming the field. `arch` is the resolved arch. */
sdpa_status sdpa_desc_resolve(const sdpa_bwd_desc *desc, int arch,
                              sdpa_bwd_desc *resolved);

/* Picks the kernel configuration for a resolved descriptor on its arch;
 * NOT_SUPPORTED (with the reason: shared memory, head_dim) when none fits. */
sdpa_status sdpa_config_select(const sdpa_bwd_desc *resolved,
                               sdpa_kernel_config *out);

/* Whether the configuration table has a row for `head_dim`, and its head
 * dims as "32, 64, ..." in buf (returned). The table is the one list of
 * supported head dims. */
int sdpa_config_supports_head_dim(int head_dim);
const char *sdpa_config_head_dim_list(char *buf, size_t size);

/* Shared memory the main kernel needs for a configuration. */
int sdpa_config_smem_bytes(int head_dim, int head_dim_v,
                           const sdpa_kernel_config *config);

/* Largest dynamic shared memory per block of an arch (bytes). */
int sdpa_arch_smem_limit(int arch);

#endif /* SDPA_PLAN_H */
