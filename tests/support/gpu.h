/*
 * gpu.h — device-side helpers for the GPU tests and the benchmarks.
 *
 * Everything goes through the dlopen'd driver table (src/driver.h): no
 * libcuda or cudart is linked, so a binary starts on a machine without a
 * GPU and says so ("skipped: no CUDA device", exit 77). A problem from
 * reference.h is uploaded in any layout the reference can describe; the
 * padding of input buffers holds a NaN pattern, and outputs and workspace
 * are filled with the same pattern (0xFF bytes: NaN in fp16, bf16 and fp32)
 * before every launch, so an element the library forgets to write, a
 * workspace it forgets to clear, or a padding element it reads or writes
 * shows up as NaN or as a changed byte. No Check here: benchmarks link it.
 */
#ifndef SDPA_TEST_GPU_H
#define SDPA_TEST_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "reference.h"
#include "sdpa_jit.h"

/* One device, its context (the primary context, current on the thread that
 * opened it) and a stream of our own. */
typedef struct sdpa_gpu {
  const sdpa_driver *drv;
  CUcontext ctx;
  CUdevice device;
  CUstream stream;
  int arch; /* major*10 + minor */
  int sm_count;
  char name[256];
} sdpa_gpu;

/* Opens device 0. Returns SDPA_STATUS_NO_DEVICE (sdpa_last_error says why)
 * when there is no driver or no device. */
sdpa_status sdpa_gpu_open(sdpa_gpu *out);

/* sdpa_gpu_open, or print "skipped: no CUDA device" (and the reason on
 * stderr) and exit(77), which ctest counts as skipped. */
void sdpa_gpu_require(sdpa_gpu *out);

/* Destroys the stream (the primary context stays retained). */
void sdpa_gpu_close(sdpa_gpu *gpu);

/* Device memory. alloc of 0 bytes gives 0 (no allocation). */
sdpa_status sdpa_gpu_alloc(const sdpa_gpu *gpu, size_t bytes, CUdeviceptr *out);
void sdpa_gpu_free(const sdpa_gpu *gpu, CUdeviceptr pointer);
sdpa_status sdpa_gpu_upload(const sdpa_gpu *gpu, CUdeviceptr dst,
                            const void *src, size_t bytes);
sdpa_status sdpa_gpu_download(const sdpa_gpu *gpu, void *dst, CUdeviceptr src,
                              size_t bytes);
/* Fills bytes with 0xFF (NaN in fp16, bf16 and fp32; -1 as int32). */
sdpa_status sdpa_gpu_poison(const sdpa_gpu *gpu, CUdeviceptr pointer,
                            size_t bytes);

/* A problem on the device, laid out as `layout`. */
typedef struct sdpa_gpu_problem {
  sdpa_ref_layout layout;
  CUdeviceptr buffers[SDPA_REF_MAX_BUFFERS];
  size_t buffer_bytes[SDPA_REF_MAX_BUFFERS];
  uint16_t *host_inputs[SDPA_REF_MAX_BUFFERS]; /* what input buffers hold */
  CUdeviceptr lse, cu_seqlens_q, cu_seqlens_kv;
  size_t lse_bytes;
  float *host_lse;
  sdpa_bwd_tensors tensors; /* pointers (and THD totals) ready to execute */
} sdpa_gpu_problem;

/* Allocates and uploads p laid out as l (input padding holds the NaN
 * pattern; outputs are not touched). On failure frees what it made. */
sdpa_status sdpa_gpu_problem_upload(const sdpa_gpu *gpu,
                                    const sdpa_ref_problem *p,
                                    const sdpa_ref_layout *l,
                                    sdpa_gpu_problem *out);
/* Fills every output buffer with the NaN pattern. */
sdpa_status sdpa_gpu_problem_poison_outputs(const sdpa_gpu *gpu,
                                            const sdpa_gpu_problem *d);
void sdpa_gpu_problem_free(const sdpa_gpu *gpu, sdpa_gpu_problem *d);

/* Outputs as read back. */
typedef struct sdpa_gpu_grads {
  float *dq, *dk, *dv; /* logical [row][head][dim], as reference.h     */
  uint16_t *raw[SDPA_REF_MAX_BUFFERS]; /* output buffers' bits, else NULL */
  size_t raw_elements[SDPA_REF_MAX_BUFFERS];
  int64_t padding_written; /* output-buffer elements outside every tensor
                              that no longer hold the poison pattern     */
  int64_t inputs_changed;  /* input-buffer (and LSE) elements that differ
                              from what was uploaded                     */
} sdpa_gpu_grads;

/* Downloads the outputs (and re-reads the inputs to count changes). */
sdpa_status sdpa_gpu_problem_download(const sdpa_gpu *gpu,
                                      const sdpa_ref_problem *p,
                                      const sdpa_gpu_problem *d,
                                      sdpa_gpu_grads *out);
void sdpa_gpu_grads_free(sdpa_gpu_grads *g);

/* What one run did. */
typedef struct sdpa_gpu_outcome {
  sdpa_status status;
  const char *stage; /* "plan", "compile", "upload", "workspace", "execute",
                        "sync_check", "download", or "" on success       */
  char message[1024];
  sdpa_source source;       /* where compile found the kernel          */
  char key_hash[33];
  sdpa_gpu_grads grads;
} sdpa_gpu_outcome;

/* Runs a compiled plan on p: upload, poison outputs and workspace,
 * sdpa_bwd_execute on gpu->stream, sdpa_bwd_sync_check, download.
 * `out` is filled either way; free it with sdpa_gpu_outcome_free. */
sdpa_status sdpa_gpu_execute_problem(const sdpa_gpu *gpu, sdpa_bwd_plan *plan,
                                     const sdpa_ref_problem *p,
                                     const sdpa_ref_layout *l,
                                     sdpa_gpu_outcome *out);

/* sdpa_gpu_execute_problem on `stream`; with `capture`, the execute call is
 * recorded by stream capture into a graph that is then launched (the
 * library must launch kernels a capture records). */
sdpa_status sdpa_gpu_execute_problem_on(const sdpa_gpu *gpu, sdpa_bwd_plan *plan,
                                        const sdpa_ref_problem *p,
                                        const sdpa_ref_layout *l, CUstream stream,
                                        int capture, sdpa_gpu_outcome *out);

/* The whole public chain for one problem: sdpa_bwd_plan_create_with
 * (`options` may be NULL) -> sdpa_bwd_compile -> sdpa_gpu_execute_problem
 * -> sdpa_bwd_plan_destroy. */
sdpa_status sdpa_gpu_run_problem_with(const sdpa_gpu *gpu, sdpa_runtime *runtime,
                                      const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                                      const sdpa_bwd_desc *desc,
                                      const sdpa_bwd_plan_options *options,
                                      sdpa_gpu_outcome *out);
sdpa_status sdpa_gpu_run_problem(const sdpa_gpu *gpu, sdpa_runtime *runtime,
                                 const sdpa_ref_problem *p,
                                 const sdpa_ref_layout *l,
                                 const sdpa_bwd_desc *desc,
                                 sdpa_gpu_outcome *out);

void sdpa_gpu_outcome_free(sdpa_gpu_outcome *out);

#endif /* SDPA_TEST_GPU_H */
