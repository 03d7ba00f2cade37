/*
 * driver.c — dlopen of libcuda.so.1 and the helpers the runtime needs
 * around it (error text, current context, compute capability).
 *
 * Symbols are resolved by the names the driver exports for the ABI cuda.h
 * describes (cuMemAlloc_v2 and friends), so the table matches the types.
 */
#include "driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "status.h"

static sdpa_driver table;
static sdpa_status load_status = SDPA_STATUS_INTERNAL;
static char load_message[512];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary_ctx;

#define RESOLVE(field, name)                                                  \
  do {                                                                        \
    void *sym_ = dlsym(lib, name);                                            \
    if (!sym_) {                                                              \
      snprintf(load_message, sizeof load_message,                             \
               "libcuda.so.1 lacks %s: the CUDA driver is too old "           \
               "(need CUDA 12 or later)", name);                              \
      load_status = SDPA_STATUS_NO_DEVICE;                                    \
      return;                                                                 \
    }                                                                         \
    memcpy(&table.field, &sym_, sizeof sym_);                                 \
  } while (0)

/* An entry point the library can do without: NULL when absent. */
#define RESOLVE_OPTIONAL(field, name)                                         \
  do {                                                                        \
    void *sym_ = dlsym(lib, name);                                            \
    memcpy(&table.field, &sym_, sizeof sym_);                                 \
  } while (0)

static void load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_message, sizeof load_message,
             "no CUDA driver: dlopen(libcuda.so.1) failed (%s); install the "
             "NVIDIA driver or pass an arch to compile without a GPU",
             dlerror());
    load_status = SDPA_STATUS_NO_DEVICE;
    return;
  }
  RESOLVE(cuInit, "cuInit");
  RESOLVE(cuGetErrorName, "cuGetErrorName");
  RESOLVE(cuGetErrorString, "cuGetErrorString");
  RESOLVE(cuDeviceGetCount, "cuDeviceGetCount");
  RESOLVE(cuDeviceGet, "cuDeviceGet");
  RESOLVE(cuDeviceGetAttribute, "cuDeviceGetAttribute");
  RESOLVE(cuDeviceGetName, "cuDeviceGetName");
  RESOLVE(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  RESOLVE(cuCtxGetCurrent, "cuCtxGetCurrent");
  RESOLVE(cuCtxSetCurrent, "cuCtxSetCurrent");
  RESOLVE(cuCtxGetDevice, "cuCtxGetDevice");
  RESOLVE(cuCtxSynchronize, "cuCtxSynchronize");
  RESOLVE(cuModuleLoadData, "cuModuleLoadData");
  RESOLVE(cuModuleUnload, "cuModuleUnload");
  RESOLVE(cuModuleGetFunction, "cuModuleGetFunction");
  RESOLVE(cuFuncSetAttribute, "cuFuncSetAttribute");
  RESOLVE(cuLaunchKernel, "cuLaunchKernel");
  RESOLVE(cuMemAlloc, "cuMemAlloc_v2");
  RESOLVE(cuMemFree, "cuMemFree_v2");
  RESOLVE(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  RESOLVE(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  RESOLVE(cuMemsetD8, "cuMemsetD8_v2");
  RESOLVE(cuMemHostRegister, "cuMemHostRegister_v2");
  RESOLVE(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  RESOLVE(cuMemHostUnregister, "cuMemHostUnregister");
  RESOLVE(cuStreamCreate, "cuStreamCreate");
  RESOLVE(cuStreamDestroy, "cuStreamDestroy_v2");
  RESOLVE(cuStreamSynchronize, "cuStreamSynchronize");
  RESOLVE(cuEventCreate, "cuEventCreate");
  RESOLVE(cuEventDestroy, "cuEventDestroy_v2");
  RESOLVE(cuEventRecord, "cuEventRecord");
  RESOLVE(cuEventElapsedTime, "cuEventElapsedTime_v2");
  RESOLVE_OPTIONAL(cuStreamIsCapturing, "cuStreamIsCapturing");
  RESOLVE_OPTIONAL(cuGraphCreate, "cuGraphCreate");
  RESOLVE_OPTIONAL(cuGraphAddKernelNode, "cuGraphAddKernelNode_v2");
  RESOLVE_OPTIONAL(cuGraphInstantiate, "cuGraphInstantiateWithFlags");
  RESOLVE_OPTIONAL(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2");
  RESOLVE_OPTIONAL(cuGraphLaunch, "cuGraphLaunch");
  RESOLVE_OPTIONAL(cuGraphExecDestroy, "cuGraphExecDestroy");
  RESOLVE_OPTIONAL(cuGraphDestroy, "cuGraphDestroy");
  RESOLVE_OPTIONAL(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
  RESOLVE_OPTIONAL(cuStreamEndCapture, "cuStreamEndCapture");
  table.has_graphs = table.cuStreamIsCapturing && table.cuGraphCreate &&
                     table.cuGraphAddKernelNode && table.cuGraphInstantiate &&
                     table.cuGraphExecKernelNodeSetParams && table.cuGraphLaunch &&
                     table.cuGraphExecDestroy && table.cuGraphDestroy;
  RESOLVE_OPTIONAL(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  RESOLVE_OPTIONAL(cuFuncGetAttribute, "cuFuncGetAttribute");
  RESOLVE_OPTIONAL(cuModuleGetGlobal, "cuModuleGetGlobal_v2");

  CUresult rc = table.cuInit(0);
  if (rc != CUDA_SUCCESS) {
    const char *name = "?";
    table.cuGetErrorName(rc, &name);
    snprintf(load_message, sizeof load_message,
             "no usable CUDA device: cuInit failed with %s", name);
    load_status = SDPA_STATUS_NO_DEVICE;
    return;
  }
  int count = 0;
  if (table.cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= 0) {
    snprintf(load_message, sizeof load_message,
             "no CUDA device: the driver reports %d devices", count);
    load_status = SDPA_STATUS_NO_DEVICE;
    return;
  }
  load_status = SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_driver_get(const sdpa_driver **out) {
  pthread_once(&load_once, load_driver);
  if (load_status != SDPA_STATUS_SUCCESS) {
    if (out) *out = NULL;
    return sdpa_error_set(load_status, "%s", load_message);
  }
  if (out) *out = &table;
  return SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_driver_error(const sdpa_driver *drv, CUresult rc,
                              const char *what) {
  const char *name = "CUDA_ERROR_UNKNOWN", *text = "";
  if (drv) {
    drv->cuGetErrorName(rc, &name);
    drv->cuGetErrorString(rc, &text);
  }
  sdpa_status st = rc == CUDA_ERROR_OUT_OF_MEMORY
                       ? SDPA_STATUS_OUT_OF_MEMORY
                       : SDPA_STATUS_DRIVER_ERROR;
  return sdpa_error_set(st, "%s failed: %s (%s)", what, name, text);
}

sdpa_status sdpa_driver_context(const sdpa_driver *drv, CUcontext *ctx,
                                CUdevice *device) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  CUcontext cur = NULL;
  SDPA_CU_CHECK(drv, drv->cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (!cur) {
    pthread_mutex_lock(&primary_lock);
    if (!primary_ctx) {
      CUdevice dev0;
      CUresult rc = drv->cuDeviceGet(&dev0, 0);
      if (rc == CUDA_SUCCESS) rc = drv->cuDevicePrimaryCtxRetain(&primary_ctx, dev0);
      if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&primary_lock);
        status = sdpa_driver_error(drv, rc, "retaining device 0's primary context");
        goto done;
      }
    }
    cur = primary_ctx;
    pthread_mutex_unlock(&primary_lock);
    SDPA_CU_CHECK(drv, drv->cuCtxSetCurrent(cur), "cuCtxSetCurrent(primary)");
  }
  if (ctx) *ctx = cur;
  if (device) SDPA_CU_CHECK(drv, drv->cuCtxGetDevice(device), "cuCtxGetDevice");
done:
  return status;
}

sdpa_status sdpa_driver_arch(const sdpa_driver *drv, CUdevice device,
                             int *arch) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int major = 0, minor = 0;
  SDPA_CU_CHECK(drv, drv->cuDeviceGetAttribute(
                         &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
                "reading the compute capability");
  SDPA_CU_CHECK(drv, drv->cuDeviceGetAttribute(
                         &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
                "reading the compute capability");
  *arch = major * 10 + minor;
done:
  return status;
}
