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
#include "../templates/sdpa_traits.h"
#include "launch.h"

typedef struct sdpa_runtime sdpa_runtime;
typedef struct sdpa_module_entry sdpa_module_entry;

/* The key fields (key_fields.h) and the key (key.h). */
#include "key.h"
#include "options.h"

struct sdpa_bwd_plan {
  sdpa_runtime *runtime;
  sdpa_bwd_desc desc;      /* resolved: packed strides filled in, scale,
                              head_dim_v, arch, max totals set          */
  sdpa_bwd_plan_options options; /* resolved: the runtime's defaults
                                    applied (options.c)                 */
  sdpa_key_fields fields;
  sdpa_key key;
  char family_reason[200]; /* why fields.family (sdpa_bwd_plan_query)  */
  int smem_bytes;          /* dynamic shared memory of the main kernel */
  int threads;             /* threads per block of the main kernel     */
  size_t workspace_bytes;
  /* workspace carve (byte offsets; each 256-aligned) */
  size_t ws_dq_accum, ws_dq_accum_copy, ws_delta, ws_semaphores, ws_semaphores_copy,
      ws_dkv_accum, ws_tail_acc, ws_tail_count, ws_seq_order;
  int dq_copies;           /* sdpa_dq_copies of the key: 2 = the *_copy
                              regions are in use, else they are empty  */
  int head_chunks;         /* sdpa_hopper_head_chunks: > 1 = blocks a kv
                              tile's query heads are split over, the
                              dkv_accum region in use; else 1 (empty)  */
  /* the last wave's split (sdpa_hopper_tail_parts): the split tiles the
   * workspace has slots for (0: the plan never splits); execute decides
   * from the device's multiprocessors and sdpa_tail_steps */
  int tail_cap;
  /* the longest-first launch order (sdpa_hopper_longest_first): 1 = the
   * seq_order region in use, execute sets p.seq_order */
  int longest_first;
  int64_t rows_q, rows_kv; /* rows the workspace is sized for          */
  int lse_packed_default;  /* LSE strides were all zero: under THD the
                              head stride is the launch's total_q       */
  int thd_outputs_checked_per_call; /* THD outputs that overlap at the
                              token bound: execute checks each call's
                              totals (sdpa_output_strides_check)        */
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
  int stored;                /* the cubin is in a database             */
  char *compile_log;

  /* execute's launch graphs, one per (context, stream) (launch.h) */
  sdpa_launch_graphs graphs;
};

/* A split-eligible tile's steps (its query tiles times the group's query
 * heads, one block running them all: head chunks 1), at most INT32_MAX. */
int sdpa_tail_steps(const sdpa_kernel_params *p);

/* 16-row blocks of the dQ accumulator for `rows_q` query rows (layout in
 * templates/sdpa_params.h): BSHD batch * ceil(seqlen_q / 16); THD
 * rows_q / 16 + batch + 1, every sequence starting a block of its own. */
int64_t sdpa_dq_blocks(const sdpa_bwd_desc *resolved, int64_t rows_q);

/* Fills a resolved copy of `desc` and validates it; on failure returns the
 * status with a message naming the field. `arch` is the resolved arch. */
sdpa_status sdpa_desc_resolve(const sdpa_bwd_desc *desc, int arch,
                              sdpa_bwd_desc *resolved);

/* Whether distinct elements of a [batch, seq, heads, dim] tensor with
 * these extents and element strides (dim stride 1) can share an address:
 * nonzero when some dimension of extent > 1 does not step past everything
 * the dimensions of smaller stride span. Cheap (four values sorted). */
int sdpa_elements_overlap(const int64_t extent[4], const int64_t stride[4]);

/* Checks that no two elements of the output desc.<name> (resolved strides
 * `s`; batch x rows x heads x dim, batch ignored under THD) share an
 * address. The plan checks BSHD outputs whole and THD outputs one token
 * (rows 1): their token totals are the call's. Execute checks a THD call's
 * outputs with its totals: rows is the total, `total_field` names it
 * ("tensors.total_q"); NULL at plan time. INVALID_ARGUMENT with a message
 * naming desc.<name>, its strides and the extents, else SUCCESS. */
sdpa_status sdpa_output_strides_check(const char *name, const sdpa_strides *s,
                                      sdpa_layout layout, int64_t batch, int64_t rows,
                                      int64_t heads, int64_t dim, const char *total_field);

/* Picks the mma.sync family's tiles for a resolved descriptor on its arch
 * (config.c): fills fields->q_tile, kv_tile, warps, stages (the other
 * fields are set) and *smem_bytes; the options' tiles when given, else the
 * table's (with the small-grid rule). NOT_SUPPORTED (with the reason:
 * shared memory, head_dim) when none fits. */
sdpa_status sdpa_config_select(const sdpa_bwd_desc *resolved,
                               const sdpa_bwd_plan_options *options,
                               sdpa_key_fields *fields, int *smem_bytes);

/* Whether the mma.sync family (the one that covers every supported
 * shape) takes `head_dim` (of Q and K, or of V), and the supported head
 * dims in words in buf (returned): the one home of that rule. */
int sdpa_config_supports_head_dim(int head_dim);

/* Whether `head_dim` is one of the measured table's (32, 64, 96, 128,
 * 192, 256): the only ones a plan takes with options.any_head_dim OFF. */
int sdpa_config_head_dim_measured(int head_dim);
const char *sdpa_config_head_dim_list(char *buf, size_t size);

/* The traits configuration of the mma.sync kernel a key describes. */
sdpa_mma_config sdpa_config_mma(const sdpa_key_fields *fields);

/* Columns of one row of the fp32 dQ accumulator the kernels of `fields`
 * use (SDPA_DQ_ACCUM_DIM, templates/sdpa_aux.cuh): the mma.sync family's
 * GEMM head dim, head_dim for the Hopper family. */
int sdpa_dq_accum_dim(const sdpa_key_fields *fields);

/* The candidates the rule and the table can pick for `head_dim`,
 * `head_dim_v` (small-grid ones too, whether or not their warps tile the
 * GEMMs), for tests: writes up to `capacity` configurations and returns
 * how many there are. */
size_t sdpa_config_candidates(int head_dim, int head_dim_v, sdpa_mma_config *out,
                              size_t capacity);

/* Largest dynamic shared memory per block of an arch (bytes). */
int sdpa_arch_smem_limit(int arch);

#endif /* SDPA_PLAN_H */
