/*
 * gpu.c — device memory, poisoning and the "one problem through the public
 * API" helper for the GPU tests and benchmarks (see gpu.h).
 *
 * Failures are returned as sdpa_status with the driver's message recorded
 * by sdpa_driver_error(), so a caller prints sdpa_last_error() and moves
 * on to the next case instead of stopping.
 */
#include "gpu.h"

#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sdpa_status sdpa_gpu_open(sdpa_gpu *out) {
  memset(out, 0, sizeof *out);
  sdpa_status status = sdpa_driver_get(&out->drv);
  if (status != SDPA_STATUS_SUCCESS) return status;
  const sdpa_driver *drv = out->drv;
  if ((status = sdpa_driver_context(drv, &out->ctx, &out->device)) != SDPA_STATUS_SUCCESS)
    goto done;
  if ((status = sdpa_driver_arch(drv, out->device, &out->arch)) != SDPA_STATUS_SUCCESS)
    goto done;
  SDPA_CU_CHECK(drv, drv->cuDeviceGetName(out->name, (int)sizeof out->name, out->device),
                "cuDeviceGetName");
  SDPA_CU_CHECK(drv, drv->cuDeviceGetAttribute(&out->sm_count,
                                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                               out->device),
                "reading the multiprocessor count");
  SDPA_CU_CHECK(drv, drv->cuStreamCreate(&out->stream, 0), "cuStreamCreate");
done:
  return status;
}

void sdpa_gpu_require(sdpa_gpu *out) {
  sdpa_status status = sdpa_gpu_open(out);
  if (status == SDPA_STATUS_SUCCESS) return;
  printf("skipped: no CUDA device\n");
  fprintf(stderr, "(%s: %s)\n", sdpa_status_name(status), sdpa_last_error());
  fflush(stdout);
  exit(77);
}

void sdpa_gpu_close(sdpa_gpu *gpu) {
  if (gpu && gpu->drv && gpu->stream) gpu->drv->cuStreamDestroy(gpu->stream);
  if (gpu) gpu->stream = NULL;
}

sdpa_status sdpa_gpu_alloc(const sdpa_gpu *gpu, size_t bytes, CUdeviceptr *out) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  *out = 0;
  if (bytes == 0) return status;
  SDPA_CU_CHECK(gpu->drv, gpu->drv->cuMemAlloc(out, bytes), "cuMemAlloc");
done:
  return status;
}

void sdpa_gpu_free(const sdpa_gpu *gpu, CUdeviceptr pointer) {
  if (pointer) gpu->drv->cuMemFree(pointer);
}

sdpa_status sdpa_gpu_upload(const sdpa_gpu *gpu, CUdeviceptr dst,
                            const void *src, size_t bytes) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (bytes == 0) return status;
  SDPA_CU_CHECK(gpu->drv, gpu->drv->cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
done:
  return status;
}

sdpa_status sdpa_gpu_download(const sdpa_gpu *gpu, void *dst, CUdeviceptr src,
                              size_t bytes) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (bytes == 0) return status;
  SDPA_CU_CHECK(gpu->drv, gpu->drv->cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
done:
  return status;
}

sdpa_status sdpa_gpu_poison(const sdpa_gpu *gpu, CUdeviceptr pointer,
                            size_t bytes) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (bytes == 0) return status;
  SDPA_CU_CHECK(gpu->drv, gpu->drv->cuMemsetD8(pointer, 0xff, bytes), "cuMemsetD8 (poison)");
done:
  return status;
}

/* ------------------------------------------------------------ problems */

static const float *input_source(const sdpa_ref_problem *p, int tensor) {
  switch (tensor) {
  case SDPA_REF_Q: return p->q;
  case SDPA_REF_K: return p->k;
  case SDPA_REF_V: return p->v;
  case SDPA_REF_O: return p->o;
  case SDPA_REF_DOUT: return p->dout;
  default: return NULL;
  }
}

sdpa_status sdpa_gpu_problem_upload(const sdpa_gpu *gpu,
                                    const sdpa_ref_problem *p,
                                    const sdpa_ref_layout *l,
                                    sdpa_gpu_problem *out) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  memset(out, 0, sizeof *out);
  out->layout = *l;
  for (int b = 0; b < l->buffer_count; b++) {
    out->buffer_bytes[b] = (size_t)l->buffer_elements[b] * sizeof(uint16_t);
    if ((status = sdpa_gpu_alloc(gpu, out->buffer_bytes[b], &out->buffers[b])) !=
        SDPA_STATUS_SUCCESS)
      goto done;
    if (l->buffer_is_output[b]) continue;
    out->host_inputs[b] = malloc(out->buffer_bytes[b]);
    if (!out->host_inputs[b]) {
      status = SDPA_STATUS_OUT_OF_MEMORY;
      goto done;
    }
    memset(out->host_inputs[b], 0xff, out->buffer_bytes[b]); /* NaN padding */
    for (int t = 0; t < SDPA_REF_DQ; t++)
      if (l->place[t].buffer == b)
        sdpa_ref_pack(p, l, t, input_source(p, t), out->host_inputs[b]);
    if ((status = sdpa_gpu_upload(gpu, out->buffers[b], out->host_inputs[b],
                                  out->buffer_bytes[b])) != SDPA_STATUS_SUCCESS)
      goto done;
  }
  out->lse_bytes = (size_t)l->lse_elements * sizeof(float);
  out->host_lse = malloc(out->lse_bytes);
  if (!out->host_lse) {
    status = SDPA_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  memset(out->host_lse, 0xff, out->lse_bytes);
  sdpa_ref_pack_lse(p, l, p->lse, out->host_lse);
  if ((status = sdpa_gpu_alloc(gpu, out->lse_bytes, &out->lse)) != SDPA_STATUS_SUCCESS ||
      (status = sdpa_gpu_upload(gpu, out->lse, out->host_lse, out->lse_bytes)) !=
          SDPA_STATUS_SUCCESS)
    goto done;
  if (p->layout == SDPA_LAYOUT_THD) {
    size_t bytes = ((size_t)p->batch + 1) * sizeof(int32_t);
    if ((status = sdpa_gpu_alloc(gpu, bytes, &out->cu_seqlens_q)) != SDPA_STATUS_SUCCESS ||
        (status = sdpa_gpu_upload(gpu, out->cu_seqlens_q, p->cu_seqlens_q, bytes)) !=
            SDPA_STATUS_SUCCESS ||
        (status = sdpa_gpu_alloc(gpu, bytes, &out->cu_seqlens_kv)) != SDPA_STATUS_SUCCESS ||
        (status = sdpa_gpu_upload(gpu, out->cu_seqlens_kv, p->cu_seqlens_kv, bytes)) !=
            SDPA_STATUS_SUCCESS)
      goto done;
  }

  sdpa_bwd_tensors *t = &out->tensors;
  memset(t, 0, sizeof *t);
  t->version = SDPA_BWD_TENSORS_VERSION;
  void *at[SDPA_REF_TENSORS];
  for (int i = 0; i < SDPA_REF_TENSORS; i++) {
    const sdpa_ref_placement *pl = &l->place[i];
    at[i] = (void *)(uintptr_t)(out->buffers[pl->buffer] +
                                (CUdeviceptr)pl->offset * sizeof(uint16_t));
  }
  t->q = at[SDPA_REF_Q];
  t->k = at[SDPA_REF_K];
  t->v = at[SDPA_REF_V];
  t->o = at[SDPA_REF_O];
  t->dout = at[SDPA_REF_DOUT];
  t->dq = at[SDPA_REF_DQ];
  t->dk = at[SDPA_REF_DK];
  t->dv = at[SDPA_REF_DV];
  t->lse = (const float *)(uintptr_t)out->lse;
  if (p->layout == SDPA_LAYOUT_THD) {
    t->cu_seqlens_q = (const int32_t *)(uintptr_t)out->cu_seqlens_q;
    t->cu_seqlens_kv = (const int32_t *)(uintptr_t)out->cu_seqlens_kv;
    t->total_q = p->rows_q;
    t->total_kv = p->rows_kv;
  }
done:
  if (status != SDPA_STATUS_SUCCESS) sdpa_gpu_problem_free(gpu, out);
  return status;
}

sdpa_status sdpa_gpu_problem_poison_outputs(const sdpa_gpu *gpu,
                                            const sdpa_gpu_problem *d) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  for (int b = 0; b < d->layout.buffer_count && status == SDPA_STATUS_SUCCESS; b++)
    if (d->layout.buffer_is_output[b])
      status = sdpa_gpu_poison(gpu, d->buffers[b], d->buffer_bytes[b]);
  return status;
}

void sdpa_gpu_problem_free(const sdpa_gpu *gpu, sdpa_gpu_problem *d) {
  if (!d) return;
  for (int b = 0; b < SDPA_REF_MAX_BUFFERS; b++) {
    sdpa_gpu_free(gpu, d->buffers[b]);
    free(d->host_inputs[b]);
    d->buffers[b] = 0;
    d->host_inputs[b] = NULL;
  }
  sdpa_gpu_free(gpu, d->lse);
  sdpa_gpu_free(gpu, d->cu_seqlens_q);
  sdpa_gpu_free(gpu, d->cu_seqlens_kv);
  free(d->host_lse);
  d->lse = d->cu_seqlens_q = d->cu_seqlens_kv = 0;
  d->host_lse = NULL;
}

sdpa_status sdpa_gpu_problem_download(const sdpa_gpu *gpu,
                                      const sdpa_ref_problem *p,
                                      const sdpa_gpu_problem *d,
                                      sdpa_gpu_grads *out) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  const sdpa_ref_layout *l = &d->layout;
  unsigned char *map = NULL;
  void *scratch = NULL;
  memset(out, 0, sizeof *out);
  out->dq = malloc((sdpa_ref_elements(p, SDPA_REF_DQ) + 1) * sizeof(float));
  out->dk = malloc((sdpa_ref_elements(p, SDPA_REF_DK) + 1) * sizeof(float));
  out->dv = malloc((sdpa_ref_elements(p, SDPA_REF_DV) + 1) * sizeof(float));
  if (!out->dq || !out->dk || !out->dv) {
    status = SDPA_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  for (int b = 0; b < l->buffer_count; b++) {
    size_t n = (size_t)l->buffer_elements[b];
    if (l->buffer_is_output[b]) {
      out->raw[b] = malloc(d->buffer_bytes[b]);
      map = calloc(n, 1);
      if (!out->raw[b] || !map) {
        status = SDPA_STATUS_OUT_OF_MEMORY;
        goto done;
      }
      out->raw_elements[b] = n;
      if ((status = sdpa_gpu_download(gpu, out->raw[b], d->buffers[b], d->buffer_bytes[b])) !=
          SDPA_STATUS_SUCCESS)
        goto done;
      sdpa_ref_coverage(p, l, b, map);
      for (size_t i = 0; i < n; i++)
        if (!map[i] && out->raw[b][i] != 0xffffu) out->padding_written++;
      free(map);
      map = NULL;
    } else {
      scratch = malloc(d->buffer_bytes[b]);
      if (!scratch) {
        status = SDPA_STATUS_OUT_OF_MEMORY;
        goto done;
      }
      if ((status = sdpa_gpu_download(gpu, scratch, d->buffers[b], d->buffer_bytes[b])) !=
          SDPA_STATUS_SUCCESS)
        goto done;
      const uint16_t *now = scratch;
      for (size_t i = 0; i < n; i++)
        if (now[i] != d->host_inputs[b][i]) out->inputs_changed++;
      free(scratch);
      scratch = NULL;
    }
  }
  scratch = malloc(d->lse_bytes);
  if (!scratch) {
    status = SDPA_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  if ((status = sdpa_gpu_download(gpu, scratch, d->lse, d->lse_bytes)) != SDPA_STATUS_SUCCESS)
    goto done;
  if (memcmp(scratch, d->host_lse, d->lse_bytes) != 0) {
    const uint32_t *now = scratch, *was = (const uint32_t *)d->host_lse;
    for (size_t i = 0; i < d->lse_bytes / 4; i++) out->inputs_changed += now[i] != was[i];
  }
  sdpa_ref_unpack(p, l, SDPA_REF_DQ, out->raw[l->place[SDPA_REF_DQ].buffer], out->dq);
  sdpa_ref_unpack(p, l, SDPA_REF_DK, out->raw[l->place[SDPA_REF_DK].buffer], out->dk);
  sdpa_ref_unpack(p, l, SDPA_REF_DV, out->raw[l->place[SDPA_REF_DV].buffer], out->dv);
done:
  free(map);
  free(scratch);
  if (status != SDPA_STATUS_SUCCESS) sdpa_gpu_grads_free(out);
  return status;
}

void sdpa_gpu_grads_free(sdpa_gpu_grads *g) {
  if (!g) return;
  free(g->dq);
  free(g->dk);
  free(g->dv);
  g->dq = g->dk = g->dv = NULL;
  for (int b = 0; b < SDPA_REF_MAX_BUFFERS; b++) {
    free(g->raw[b]);
    g->raw[b] = NULL;
  }
}

/* ----------------------------------------------------------------- runs */

static sdpa_status fail(sdpa_gpu_outcome *out, sdpa_status status, const char *stage) {
  out->status = status;
  out->stage = stage;
  snprintf(out->message, sizeof out->message, "%s: %s: %s", stage, sdpa_status_name(status),
           sdpa_last_error());
  return status;
}

/* Runs the library's launches for one call on `stream`, or (capture) records
 * them into a graph of the stream's capture and launches that. */
static sdpa_status execute_on(const sdpa_gpu *gpu, sdpa_bwd_plan *plan,
                              const sdpa_bwd_tensors *t, CUdeviceptr workspace,
                              size_t workspace_bytes, CUstream stream, int capture) {
  const sdpa_driver *drv = gpu->drv;
  sdpa_status status;
  void *ws = (void *)(uintptr_t)workspace;
  if (!capture) return sdpa_bwd_execute(plan, t, ws, workspace_bytes, stream);
  if (!drv->cuStreamBeginCapture || !drv->cuStreamEndCapture || !drv->has_graphs)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED, "the driver lacks stream capture");
  CUgraph graph = NULL;
  CUgraphExec exec = NULL;
  SDPA_CU_CHECK(drv, drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture");
  status = sdpa_bwd_execute(plan, t, ws, workspace_bytes, stream);
  CUresult rc = drv->cuStreamEndCapture(stream, &graph);
  if (status != SDPA_STATUS_SUCCESS) goto done;
  SDPA_CU_CHECK(drv, rc, "cuStreamEndCapture");
  SDPA_CU_CHECK(drv, drv->cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
  SDPA_CU_CHECK(drv, drv->cuGraphLaunch(exec, stream), "cuGraphLaunch of the capture");
done:
  if (exec) drv->cuGraphExecDestroy(exec);
  if (graph) drv->cuGraphDestroy(graph);
  return status;
}

sdpa_status sdpa_gpu_execute_problem(const sdpa_gpu *gpu, sdpa_bwd_plan *plan,
                                     const sdpa_ref_problem *p,
                                     const sdpa_ref_layout *l,
                                     sdpa_gpu_outcome *out) {
  return sdpa_gpu_execute_problem_on(gpu, plan, p, l, gpu->stream, 0, out);
}

sdpa_status sdpa_gpu_execute_problem_on(const sdpa_gpu *gpu, sdpa_bwd_plan *plan,
                                        const sdpa_ref_problem *p,
                                        const sdpa_ref_layout *l, CUstream stream,
                                        int capture, sdpa_gpu_outcome *out) {
  sdpa_gpu_problem d;
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = sdpa_bwd_workspace_size(plan);
  sdpa_status status;
  int uploaded = 0;
  memset(&out->grads, 0, sizeof out->grads);
  out->status = SDPA_STATUS_SUCCESS;
  out->stage = "";
  out->message[0] = '\0';
  if ((status = sdpa_gpu_problem_upload(gpu, p, l, &d)) != SDPA_STATUS_SUCCESS) {
    fail(out, status, "upload");
    goto done;
  }
  uploaded = 1;
  if ((status = sdpa_gpu_alloc(gpu, workspace_bytes, &workspace)) != SDPA_STATUS_SUCCESS ||
      (status = sdpa_gpu_poison(gpu, workspace, workspace_bytes)) != SDPA_STATUS_SUCCESS ||
      (status = sdpa_gpu_problem_poison_outputs(gpu, &d)) != SDPA_STATUS_SUCCESS) {
    fail(out, status, "workspace");
    goto done;
  }
  /* The poison must be in place before the library's stream runs. */
  CUresult rc = gpu->drv->cuCtxSynchronize();
  if (rc != CUDA_SUCCESS) {
    status = sdpa_driver_error(gpu->drv, rc, "cuCtxSynchronize after poisoning");
    fail(out, status, "workspace");
    goto done;
  }
  status = execute_on(gpu, plan, &d.tensors, workspace, workspace_bytes, stream, capture);
  if (status != SDPA_STATUS_SUCCESS) {
    fail(out, status, "execute");
    goto done;
  }
  status = sdpa_bwd_sync_check(plan, stream);
  if (status != SDPA_STATUS_SUCCESS) {
    fail(out, status, "sync_check");
    goto done;
  }
  if ((status = sdpa_gpu_problem_download(gpu, p, &d, &out->grads)) != SDPA_STATUS_SUCCESS) {
    fail(out, status, "download");
    goto done;
  }
done:
  sdpa_gpu_free(gpu, workspace);
  if (uploaded) sdpa_gpu_problem_free(gpu, &d);
  return status;
}

sdpa_status sdpa_gpu_run_problem(const sdpa_gpu *gpu, sdpa_runtime *runtime,
                                 const sdpa_ref_problem *p,
                                 const sdpa_ref_layout *l,
                                 const sdpa_bwd_desc *desc,
                                 sdpa_gpu_outcome *out) {
  return sdpa_gpu_run_problem_with(gpu, runtime, p, l, desc, NULL, out);
}

sdpa_status sdpa_gpu_run_problem_with(const sdpa_gpu *gpu, sdpa_runtime *runtime,
                                      const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                                      const sdpa_bwd_desc *desc,
                                      const sdpa_bwd_plan_options *options,
                                      sdpa_gpu_outcome *out) {
  sdpa_bwd_plan *plan = NULL;
  memset(out, 0, sizeof *out);
  out->stage = "";
  sdpa_status status = sdpa_bwd_plan_create_with(&plan, runtime, desc, options);
  if (status != SDPA_STATUS_SUCCESS) {
    fail(out, status, "plan");
    goto done;
  }
  snprintf(out->key_hash, sizeof out->key_hash, "%s", sdpa_bwd_plan_key_hash(plan));
  status = sdpa_bwd_compile(plan, &out->source);
  if (status != SDPA_STATUS_SUCCESS) {
    fail(out, status, "compile");
    goto done;
  }
  status = sdpa_gpu_execute_problem(gpu, plan, p, l, out);
done:
  sdpa_bwd_plan_destroy(plan);
  return status;
}

void sdpa_gpu_outcome_free(sdpa_gpu_outcome *out) {
  if (out) sdpa_gpu_grads_free(&out->grads);
}
