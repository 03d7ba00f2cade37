/*
 * execute.c — binding a call's pointers, strides and token totals into the
 * launch parameter block and launching preprocess → main → dQ convert on
 * the caller's stream, in the current context.
 *
 * Execute never compiles: the plan's module must already be loaded in the
 * current context (sdpa_bwd_compile). The hot path is one cuCtxGetCurrent,
 * a host-memory read of the device error word and three cuLaunchKernel.
 */
#include <stdint.h>
#include <string.h>

#include "instantiate.h"
#include "runtime.h"
#include "status.h"
#include "../templates/sdpa_params.h"

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

/* Validates the call's arguments against the plan. */
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
  const struct {
    const void *ptr;
    const char *name;
  } ptrs[] = {{t->q, "q"},   {t->k, "k"},       {t->v, "v"},   {t->o, "o"},
              {t->dout, "dout"}, {t->lse, "lse"}, {t->dq, "dq"}, {t->dk, "dk"},
              {t->dv, "dv"}};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; ++i)
    if (i != 5 && (st = check_pointer(ptrs[i].ptr, ptrs[i].name)))
      return st;
  if (!t->lse || !ALIGNED(t->lse, 4))
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
  }
  return SDPA_STATUS_SUCCESS;
}

/* Reads and clears the module's device error word. */
static sdpa_status take_device_error(sdpa_module_entry *m) {
  volatile int *flag = m->error_host;
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
                                  sdpa_module_entry **out) {
  sdpa_status status = sdpa_driver_get(drv);
  if (status) return status;
  CUcontext ctx = NULL;
  if ((status = sdpa_driver_context(*drv, &ctx, NULL))) return status;
  if (!plan->module || plan->module_ctx != (void *)ctx)
    return sdpa_error_set(SDPA_STATUS_NOT_COMPILED,
                          "the plan's kernels are not loaded in the current "
                          "CUDA context: call sdpa_bwd_compile in this "
                          "context first (key %s)",
                          plan->key.text);
  *out = plan->module;
  return SDPA_STATUS_SUCCESS;
}

#define STRIDES(dst, src)                                                     \
  do {                                                                        \
    p.dst##_batch = d->src.batch;                                             \
    p.dst##_seq = d->src.seq;                                                 \
    p.dst##_head = d->src.head;                                               \
  } while (0)

sdpa_status sdpa_bwd_execute(sdpa_bwd_plan *plan,
                             const sdpa_bwd_tensors *t, void *workspace,
                             size_t workspace_bytes, void *stream) {
  sdpa_status status;
  const sdpa_driver *drv = NULL;
  sdpa_module_entry *m = NULL;
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "plan is NULL");
  if ((status = check_call(plan, t, workspace, workspace_bytes))) return status;
  if ((status = current_module(plan, &drv, &m))) return status;
  if ((status = take_device_error(m))) return status;

  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_kernel_config *c = &plan->fields.config;
  const int thd = d->layout == SDPA_LAYOUT_THD;
  sdpa_kernel_params p;
  memset(&p, 0, sizeof p);
  p.q = t->q; p.k = t->k; p.v = t->v; p.o = t->o; p.dout = t->dout;
  p.lse = t->lse;
  p.dq = t->dq; p.dk = t->dk; p.dv = t->dv;
  unsigned char *ws = workspace;
  p.dq_accum = (float *)(ws + plan->ws_dq_accum);
  p.delta = (float *)(ws + plan->ws_delta);
  p.semaphores = d->deterministic ? (sdpa_i32 *)(ws + plan->ws_semaphores) : NULL;
  p.error_flag = (sdpa_i32 *)(uintptr_t)m->error_device;
  p.cu_seqlens_q = thd ? t->cu_seqlens_q : NULL;
  p.cu_seqlens_kv = thd ? t->cu_seqlens_kv : NULL;
  STRIDES(q, q); STRIDES(k, k); STRIDES(v, v); STRIDES(o, o);
  STRIDES(do, dout); STRIDES(dq, dq); STRIDES(dk, dk); STRIDES(dv, dv);
  p.lse_batch = d->lse.batch;
  p.lse_head = d->lse.head;
  p.lse_seq = d->lse.seq;
  if (thd && plan->lse_packed_default) p.lse_head = t->total_q;
  p.rows_q = thd ? t->total_q : (int64_t)d->batch * d->seqlen_q;
  p.rows_kv = thd ? t->total_kv : (int64_t)d->batch * d->seqlen_kv;
  p.batch = d->batch;
  p.heads_q = d->heads_q;
  p.heads_kv = d->heads_kv;
  p.group = d->heads_q / d->heads_kv;
  p.seqlen_q = d->seqlen_q;
  p.seqlen_kv = d->seqlen_kv;
  p.q_tiles = (d->seqlen_q + c->q_tile - 1) / c->q_tile;
  p.q_blocks = (d->seqlen_q + 15) / 16;
  p.dq_blocks = thd ? p.rows_q / 16 + d->batch + 1 : (int64_t)d->batch * p.q_blocks;
  p.window_left = d->mask == SDPA_MASK_SLIDING_WINDOW ? d->window_left : -1;
  p.window_right = d->mask == SDPA_MASK_SLIDING_WINDOW ? d->window_right : -1;
  p.scale = d->scale;
  p.scale_log2 = d->scale * 1.4426950408889634f;

  CUstream s = (CUstream)stream;
  void *args[] = {&p};
  const int64_t items = p.rows_q * p.heads_q;
  const int64_t aux_blocks = (items + 7) / 8;
  const int64_t kv_tiles = (d->seqlen_kv + c->kv_tile - 1) / c->kv_tile;
  const int64_t main_x = kv_tiles * d->batch;
  const int64_t convert_x = (int64_t)p.q_blocks * d->batch * d->heads_q;
  int64_t largest = aux_blocks > main_x ? aux_blocks : main_x;
  if (convert_x > largest) largest = convert_x;
  if (largest > INT32_MAX || d->heads_kv > 65535)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "the launch grid is too large (%lld x %d blocks): "
                          "split the batch",
                          (long long)largest, d->heads_kv);
  if (aux_blocks > 0 || (d->deterministic && p.q_tiles > 0)) {
    unsigned blocks = aux_blocks > 0 ? (unsigned)aux_blocks : 1;
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->preprocess, blocks, 1, 1,
                                           SDPA_AUX_THREADS, 1, 1, 0, s, args, NULL),
                  "launching sdpa_bwd_preprocess");
  }
  if (main_x > 0)
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->main, (unsigned)main_x,
                                           (unsigned)d->heads_kv, 1,
                                           32u * (unsigned)c->warps, 1, 1,
                                           (unsigned)c->smem_bytes, s, args, NULL),
                  "launching sdpa_bwd_main");
  if (aux_blocks > 0 && convert_x > 0)
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->convert, (unsigned)convert_x, 1, 1,
                                           SDPA_AUX_THREADS, 1, 1, 0, s, args, NULL),
                  "launching sdpa_bwd_convert_dq");
  status = SDPA_STATUS_SUCCESS;
done:
  return status;
}

sdpa_status sdpa_bwd_sync_check(sdpa_bwd_plan *plan, void *stream) {
  sdpa_status status;
  const sdpa_driver *drv = NULL;
  sdpa_module_entry *m = NULL;
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "plan is NULL");
  if ((status = current_module(plan, &drv, &m))) return status;
  SDPA_CU_CHECK(drv, drv->cuStreamSynchronize((CUstream)stream),
                "synchronizing the stream after the backward");
  status = take_device_error(m);
done:
  return status;
}
