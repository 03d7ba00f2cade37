/*
 * execute.c — binding a call's pointers (and THD token totals) into the
 * plan's launch parameter block and launching preprocess → main (→ dQ
 * convert, unless the plan has main write dQ: plan.c) on the caller's
 * stream, in the current context.
 *
 * Execute never compiles: the plan's module must already be loaded in the
 * current context (sdpa_bwd_compile). The hot path is one cuCtxGetCurrent,
 * a host-memory read of the device error word, and the launches: one
 * graph launch after updating the nodes whose parameters changed, or two
 * or three cuLaunchKernel (launch.c).
 */
#include <stdint.h>

#include "hopper.h"
#include "launch.h"
#include "plan.h"
#include "runtime.h"
#include "status.h"
#include "../templates/sdpa_params.h"
#include "../templates/sdpa_hopper_traits.h" /* sdpa_hopper_tail_parts */

#define ALIGNED(p, n) ((((uintptr_t)(p)) & ((n)-1)) == 0)

static sdpa_status check_pointer(const void *ptr, const char *name) {
  if (!ptr)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "tensors.%s is NULL: pass a device pointer", name);
  if (!ALIGNED(ptr, 16))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "tensors.%s = %p is not 16-byte aligned (the kernels "
                          "use 16-byte loads and stores)",
                          name, ptr);
  return SDPA_STATUS_SUCCESS;
}

/* Whether the call's THD query (kv) tokens are none: then the tensors
 * that hold them may be NULL (as empty framework tensors are). */
static int no_q_tokens(const sdpa_bwd_plan *plan, const sdpa_bwd_tensors *t) {
  return plan->desc.layout == SDPA_LAYOUT_THD && t->total_q == 0;
}
static int no_kv_tokens(const sdpa_bwd_plan *plan, const sdpa_bwd_tensors *t) {
  return plan->desc.layout == SDPA_LAYOUT_THD && t->total_kv == 0;
}

/* Validates the call's arguments against the plan, before any driver
 * call: the pointers, the workspace and, under THD, the token totals and
 * the outputs' strides at those totals. */
static sdpa_status check_call(const sdpa_bwd_plan *plan,
                              const sdpa_bwd_tensors *t, const void *workspace,
                              size_t workspace_bytes) {
  sdpa_status st;
  if (!t)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "tensors is NULL");
  if (t->version != SDPA_BWD_TENSORS_VERSION)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "tensors.version = %u: initialize with "
                          "SDPA_BWD_TENSORS_INIT (version %d)",
                          t->version, SDPA_BWD_TENSORS_VERSION);
  const int q_none = no_q_tokens(plan, t), kv_none = no_kv_tokens(plan, t);
  const struct {
    const void *ptr;
    const char *name;
    int empty; /* covers no tokens: NULL is fine */
  } ptrs[] = {{t->q, "q", q_none},       {t->k, "k", kv_none},   {t->v, "v", kv_none},
              {t->o, "o", q_none},       {t->dout, "dout", q_none}, {t->dq, "dq", q_none},
              {t->dk, "dk", kv_none},    {t->dv, "dv", kv_none}};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; ++i)
    if (!(ptrs[i].empty && !ptrs[i].ptr) && (st = check_pointer(ptrs[i].ptr, ptrs[i].name)))
      return st;
  if (!(q_none && !t->lse) && (!t->lse || !ALIGNED(t->lse, 4)))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "tensors.lse = %p must be a 4-byte aligned device "
                          "pointer to fp32", (const void *)t->lse);
  if (!workspace && plan->workspace_bytes)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "workspace is NULL: allocate "
                          "sdpa_bwd_workspace_size() = %zu device bytes",
                          plan->workspace_bytes);
  if (!ALIGNED(workspace, 256))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "workspace = %p is not 256-byte aligned", workspace);
  if (workspace_bytes < plan->workspace_bytes)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "workspace_bytes = %zu is too small: this plan needs "
                          "%zu (sdpa_bwd_workspace_size)",
                          workspace_bytes, plan->workspace_bytes);
  if (plan->desc.layout == SDPA_LAYOUT_THD) {
    if (!t->cu_seqlens_q || !t->cu_seqlens_kv || !ALIGNED(t->cu_seqlens_q, 4) ||
        !ALIGNED(t->cu_seqlens_kv, 4))
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "THD needs tensors.cu_seqlens_q and cu_seqlens_kv: "
                            "4-byte aligned int32 device arrays of batch+1 "
                            "offsets");
    if (t->total_q < 0 || t->total_q > plan->desc.max_total_q)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "tensors.total_q = %lld is outside [0, %lld] "
                            "(desc.max_total_q, which sized the workspace)",
                            (long long)t->total_q,
                            (long long)plan->desc.max_total_q);
    if (t->total_kv < 0 || t->total_kv > plan->desc.max_total_kv)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "tensors.total_kv = %lld is outside [0, %lld] "
                            "(desc.max_total_kv)",
                            (long long)t->total_kv,
                            (long long)plan->desc.max_total_kv);
    /* The outputs at the call's token totals, where the plan found that
     * its bound would overlap them (a head-major output's head stride
     * covers the call's tokens, not the bound). Skipped for a side of no
     * tokens. */
    const sdpa_bwd_desc *d = &plan->desc;
    if (!plan->thd_outputs_checked_per_call) return SDPA_STATUS_SUCCESS;
    if (t->total_q > 0 &&
        (st = sdpa_output_strides_check("dq", &d->dq, d->layout, 1, t->total_q, d->heads_q,
                                        d->head_dim, "tensors.total_q")))
      return st;
    if (t->total_kv > 0 &&
        ((st = sdpa_output_strides_check("dk", &d->dk, d->layout, 1, t->total_kv, d->heads_kv,
                                         d->head_dim, "tensors.total_kv")) ||
         (st = sdpa_output_strides_check("dv", &d->dv, d->layout, 1, t->total_kv, d->heads_kv,
                                         d->head_dim_v, "tensors.total_kv"))))
      return st;
  }
  return SDPA_STATUS_SUCCESS;
}

/* Reads and clears the module's device error word (THD modules; the BSHD
 * kernels check nothing on the device and have none). */
static sdpa_status take_device_error(sdpa_module_entry *m) {
  volatile int *flag = m->error_host;
  if (!flag) return SDPA_STATUS_SUCCESS;
  int bits = *flag;
  if (!bits) return SDPA_STATUS_SUCCESS;
  *flag = 0;
  return sdpa_error_set(
      SDPA_STATUS_DEVICE_ERROR,
      "an earlier launch of this kernel found bad THD input:%s%s%s (those "
      "outputs are not valid; the flag is now cleared)",
      (bits & SDPA_DEVICE_ERR_SEQLEN_Q) ? " a query sequence longer than desc.seqlen_q (max_s)" : "",
      (bits & SDPA_DEVICE_ERR_SEQLEN_KV) ? " a key sequence longer than desc.seqlen_kv (max_s)" : "",
      (bits & SDPA_DEVICE_ERR_OFFSETS) ? " cu_seqlens not increasing or past total_q/total_kv" : "");
}

/* The plan's module in the current context, or NOT_COMPILED. */
static sdpa_status current_module(sdpa_bwd_plan *plan, const sdpa_driver **drv,
                                  CUcontext *ctx_out, sdpa_module_entry **out) {
  sdpa_status status = sdpa_driver_get(drv);
  if (status) return status;
  CUcontext ctx = NULL;
  if ((status = sdpa_driver_context(*drv, &ctx, NULL))) return status;
  if (ctx_out) *ctx_out = ctx;
  if (!plan->module || plan->module_ctx != (void *)ctx)
    return sdpa_error_set(SDPA_STATUS_NOT_COMPILED,
                          "the plan's kernels are not loaded in the current "
                          "CUDA context: call sdpa_bwd_compile in this "
                          "context first (key %s)",
                          plan->key.text);
  *out = plan->module;
  return SDPA_STATUS_SUCCESS;
}

static sdpa_status execute(sdpa_bwd_plan *plan, const sdpa_bwd_tensors *t, void *workspace,
                           size_t workspace_bytes, void *stream) {
  sdpa_status status;
  const sdpa_driver *drv = NULL;
  sdpa_module_entry *m = NULL;
  CUcontext ctx = NULL;
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "plan is NULL");
  if ((status = check_call(plan, t, workspace, workspace_bytes))) return status;
  if ((status = current_module(plan, &drv, &ctx, &m))) return status;
  if ((status = take_device_error(m))) return status;
  /* A THD batch of no tokens at all: nothing to compute, nothing to write. */
  if (no_q_tokens(plan, t) && no_kv_tokens(plan, t)) return SDPA_STATUS_SUCCESS;

  const sdpa_bwd_desc *d = &plan->desc;
  /* The plan holds everything but the call's pointers and THD totals.
   * NULL tensors of no tokens (THD) get the workspace as a stand-in: no
   * kernel reads or writes them (no row is in range), but the tensor maps
   * of the sm_90a family need an address to describe. */
  unsigned char *ws = workspace;
  const void *none = ws;
  sdpa_kernel_params p = plan->params;
  p.q = t->q ? t->q : none; p.k = t->k ? t->k : none; p.v = t->v ? t->v : none;
  p.o = t->o ? t->o : none; p.dout = t->dout ? t->dout : none;
  p.lse = t->lse ? t->lse : (const float *)none;
  p.dq = t->dq ? t->dq : (void *)ws; p.dk = t->dk ? t->dk : (void *)ws;
  p.dv = t->dv ? t->dv : (void *)ws;
  p.dq_accum = (float *)(ws + plan->ws_dq_accum);
  p.delta = (float *)(ws + plan->ws_delta);
  const int fold_dq = plan->fields.fold_dq;
  p.semaphores = fold_dq || d->deterministic ? (sdpa_i32 *)(ws + plan->ws_semaphores)
                                             : NULL;
  p.dq_accum_copy = plan->dq_copies > 1 ? (float *)(ws + plan->ws_dq_accum_copy) : NULL;
  p.semaphores_copy = plan->dq_copies > 1 ? (sdpa_i32 *)(ws + plan->ws_semaphores_copy) : NULL;
  const int split = plan->head_chunks > 1; /* dK / dV through dkv_accum */
  p.dkv_accum = split ? (float *)(ws + plan->ws_dkv_accum) : NULL;
  p.seq_order = plan->longest_first ? (sdpa_i32 *)(ws + plan->ws_seq_order) : NULL;
  p.error_flag = (sdpa_i32 *)(uintptr_t)m->error_device;
  p.sm_count = m->sm_count;
  if (d->layout == SDPA_LAYOUT_THD) {
    p.cu_seqlens_q = t->cu_seqlens_q;
    p.cu_seqlens_kv = t->cu_seqlens_kv;
    p.rows_q = t->total_q;
    p.rows_kv = t->total_kv;
    p.dq_blocks = sdpa_dq_blocks(d, p.rows_q);
    if (plan->lse_packed_default) p.lse_head = t->total_q;
  }

  /* Grids: checked against the launch limits at the plan's bounds. */
  const int64_t aux_blocks = sdpa_aux_blocks(p.rows_q * p.heads_q, d->head_dim_v);
  const int64_t main_x = plan->main_grid_x;
  const int64_t dkv_x = split ? sdpa_dkv_convert_blocks(p.rows_kv, d->heads_kv, d->head_dim,
                                                        d->head_dim_v)
                              : 0;
  /* the convert kernel's dQ blocks come first (it tells them by index) */
  const int64_t convert_x =
      split ? plan->convert_grid_x + dkv_x : aux_blocks > 0 ? plan->convert_grid_x : 0;
  const unsigned heads_y = (unsigned)(d->heads_kv * plan->head_chunks);
  sdpa_launch launches[3];
  int count = 0;
  if (aux_blocks > 0 || p.semaphores || dkv_x > 0 || p.seq_order) /* what main counts on */
    launches[count++] = (sdpa_launch){m->preprocess, "launching sdpa_bwd_preprocess",
                                      aux_blocks > 0 ? (unsigned)aux_blocks : 1u, 1u,
                                      SDPA_AUX_THREADS, 0u, 0};
  const int hopper = plan->fields.family == SDPA_FAMILY_HOPPER;
  sdpa_tensor_maps maps;
  if (hopper && main_x > 0 &&
      (status = sdpa_hopper_tensor_maps(drv, &plan->fields, d, &p, &maps)))
    return status;
  /* a persistent kernel (one block an SM, each over every blocks-th tile):
   * at most the device's multiprocessors; one block a tile where the count
   * is unknown */
  const long long persistent =
      hopper ? sdpa_hopper_persistent_grid(&plan->fields, main_x * heads_y, m->sm_count) : 0;
  /* the last wave's split tiles (sdpa_hopper_tail_parts): a
   * one-dimensional grid of the whole tiles, then each split tile's parts */
  const int64_t tiles = main_x * heads_y;
  int64_t main_blocks = 0;
  if (plan->tail_cap > 0) {
    const int sms = plan->options.tail_split >= 2 ? plan->options.tail_split : m->sm_count;
    const int parts =
        sdpa_hopper_tail_parts(tiles, sms, sdpa_tail_steps(&p), p.q_tiles, plan->tail_cap);
    const int64_t tail_tiles = parts > 1 ? tiles % sms : 0;
    if (tail_tiles > 0 && tiles + tail_tiles * (parts - 1) <= INT32_MAX) {
      p.tail_first = tiles - tail_tiles;
      p.tail_parts = parts;
      p.tail_tiles = (int)tail_tiles;
      p.tail_acc = (float *)(ws + plan->ws_tail_acc);
      p.tail_count = (sdpa_i32 *)(ws + plan->ws_tail_count);
      main_blocks = tiles + tail_tiles * (parts - 1);
    }
  }
  if (main_x > 0)
    launches[count++] = (sdpa_launch){m->main, "launching sdpa_bwd_main",
                                      main_blocks    ? (unsigned)main_blocks
                                      : persistent ? (unsigned)persistent
                                                   : (unsigned)main_x,
                                      main_blocks || persistent ? 1u : heads_y,
                                      (unsigned)plan->threads, (unsigned)plan->smem_bytes,
                                      hopper};
  if (!fold_dq && convert_x > 0) /* dQ where there are query rows; dK, dV when split */
    launches[count++] = (sdpa_launch){m->convert, "launching sdpa_bwd_convert_dq",
                                      (unsigned)convert_x, 1u, SDPA_AUX_THREADS, 0u, 0};
  return sdpa_launch_run(&plan->graphs, drv, ctx, (CUstream)stream, launches,
                         count, &p, hopper ? &maps : NULL);
}

sdpa_status sdpa_bwd_execute(sdpa_bwd_plan *plan, const sdpa_bwd_tensors *t,
                             void *workspace, size_t workspace_bytes, void *stream) {
  return SDPA_API_CALL(execute(plan, t, workspace, workspace_bytes, stream));
}

static sdpa_status sync_check(sdpa_bwd_plan *plan, void *stream) {
  sdpa_status status;
  const sdpa_driver *drv = NULL;
  sdpa_module_entry *m = NULL;
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "plan is NULL");
  if ((status = current_module(plan, &drv, NULL, &m))) return status;
  SDPA_CU_CHECK(drv, drv->cuStreamSynchronize((CUstream)stream),
                "synchronizing the stream after the backward");
  status = take_device_error(m);
done:
  return status;
}

sdpa_status sdpa_bwd_sync_check(sdpa_bwd_plan *plan, void *stream) {
  return SDPA_API_CALL(sync_check(plan, stream));
}
