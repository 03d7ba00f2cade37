/*
 * driver.h — the CUDA driver API, loaded at run time with dlopen.
 *
 * The library must start on a machine with no GPU and no driver (a build
 * host preheating the cache), so it never links libcuda. sdpa_driver_get()
 * dlopens libcuda.so.1 once per process and resolves the entry points below
 * by their versioned symbol names. Tests and benchmarks use the same table.
 */
#ifndef SDPA_DRIVER_H
#define SDPA_DRIVER_H

#include <cuda.h>

#include "sdpa_jit.h"

typedef struct sdpa_driver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuGetErrorString)(CUresult, const char **);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetDevice)(CUdevice *);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuModuleLoadData)(CUmodule *, const void *);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemHostRegister)(void *, size_t, unsigned int);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
  CUresult (*cuMemHostUnregister)(void *);
  CUresult (*cuStreamCreate)(CUstream *, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent *, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
  /* Optional (NULL when the driver lacks them; execute then launches each
   * kernel itself): the per-plan launch graphs (launch.c) and, for tests,
   * stream capture. */
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*cuGraphCreate)(CUgraph *, unsigned int);
  CUresult (*cuGraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *,
                                   size_t, const CUDA_KERNEL_NODE_PARAMS *);
  CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode,
                                             const CUDA_KERNEL_NODE_PARAMS *);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuStreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
  int has_graphs; /* every graph entry point above resolved */
  /* Optional: tensor maps for the sm_90a family's bulk tensor copies
   * (CUDA 12.0+ drivers), and kernel attributes (registers, for tests). */
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType,
                                     cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion,
                                     CUtensorMapFloatOOBfill);
  CUresult (*cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
  /* Optional, for benchmarks: a module's global (bench_hopper --trace). */
  CUresult (*cuModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
} sdpa_driver;

/* Loads the driver (once per process, thread-safe) and calls cuInit(0).
 * On success *out points at the process-wide table. Returns
 * SDPA_STATUS_NO_DEVICE, with a message, when libcuda.so.1 cannot be
 * loaded, an entry point is missing, or cuInit fails (no GPU). */
sdpa_status sdpa_driver_get(const sdpa_driver **out);

/* Records "what failed: CUDA_ERROR_X (driver's text)" and returns
 * SDPA_STATUS_DRIVER_ERROR (SDPA_STATUS_OUT_OF_MEMORY for
 * CUDA_ERROR_OUT_OF_MEMORY). `what` names the call and its purpose. */
sdpa_status sdpa_driver_error(const sdpa_driver *drv, CUresult rc,
                              const char *what);

/* One check macro for the driver: on failure record where and jump to the
 * function's cleanup label `done` with `status` set. */
#define SDPA_CU_CHECK(drv, call, what)                                        \
  do {                                                                        \
    CUresult cu_rc_ = (call);                                                 \
    if (cu_rc_ != CUDA_SUCCESS) {                                             \
      status = sdpa_driver_error((drv), cu_rc_, (what));                      \
      goto done;                                                              \
    }                                                                         \
  } while (0)

/* Makes sure a context is current on this thread: the current one, else
 * the primary context of device 0 (retained once per process and kept).
 * OUT ctx and device may be NULL. */
sdpa_status sdpa_driver_context(const sdpa_driver *drv, CUcontext *ctx,
                                CUdevice *device);

/* Compute capability major*10+minor of `device`. */
sdpa_status sdpa_driver_arch(const sdpa_driver *drv, CUdevice device,
                             int *arch);

#endif /* SDPA_DRIVER_H */
