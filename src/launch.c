/*
 * launch.c — a call's kernels through the plan's graph for its stream, or
 * kernel by kernel (launch.h).
 */
#include "launch.h"

#include <stdlib.h>
#include <string.h>

#include "status.h"

sdpa_status sdpa_launch_graphs_init(sdpa_launch_graphs *g, int enabled) {
  memset(g, 0, sizeof *g);
  g->enabled = enabled != 0;
  if (pthread_mutex_init(&g->lock, NULL) != 0)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "could not initialize the plan's graph mutex");
  return SDPA_STATUS_SUCCESS;
}

/* Frees one graph's driver objects (in the current context, its own),
 * leaving the slot's stream and context. */
static void free_graph(const sdpa_driver *drv, sdpa_launch_graph *lg) {
  if (lg->exec) drv->cuGraphExecDestroy(lg->exec);
  if (lg->graph) drv->cuGraphDestroy(lg->graph);
  lg->exec = NULL;
  lg->graph = NULL;
  lg->count = 0;
}

void sdpa_launch_graphs_destroy(sdpa_launch_graphs *g, const sdpa_driver *drv) {
  if (g->used > 0 && !drv && sdpa_driver_get(&drv) != SDPA_STATUS_SUCCESS) drv = NULL;
  if (g->used > 0 && drv) {
    CUcontext saved = NULL;
    drv->cuCtxGetCurrent(&saved);
    for (int i = 0; i < g->used; ++i) {
      if (!g->graphs[i].graph) continue;
      drv->cuCtxSetCurrent(g->graphs[i].ctx);
      free_graph(drv, &g->graphs[i]);
    }
    drv->cuCtxSetCurrent(saved);
  }
  g->used = 0;
  pthread_mutex_destroy(&g->lock);
}

/* The kernel parameters of a launch: the block alone, or with the maps.
 * The driver copies them and never writes them. */
typedef struct launch_args {
  void *block[1];
  void *with_maps[2];
} launch_args;

static void args_init(launch_args *a, const sdpa_kernel_params *p,
                      const sdpa_tensor_maps *maps) {
  a->block[0] = (void *)p;
  a->with_maps[0] = (void *)p;
  a->with_maps[1] = (void *)maps;
}

static void **args_of(launch_args *a, const sdpa_launch *l) {
  return l->takes_maps ? a->with_maps : a->block;
}

static void node_params(const sdpa_launch *l, void **args,
                        CUDA_KERNEL_NODE_PARAMS *out) {
  memset(out, 0, sizeof *out);
  out->func = l->func;
  out->gridDimX = l->grid_x;
  out->gridDimY = l->grid_y;
  out->gridDimZ = 1;
  out->blockDimX = l->block_x;
  out->blockDimY = 1;
  out->blockDimZ = 1;
  out->sharedMemBytes = l->smem_bytes;
  out->kernelParams = args;
}

/* Makes lg's graph of `count` chained kernel nodes in the current
 * context; 0 on success, -1 on any driver failure (nothing kept). */
static int make_graph(const sdpa_driver *drv, const sdpa_launch *launches, int count,
                      const sdpa_kernel_params *p, const sdpa_tensor_maps *maps,
                      sdpa_launch_graph *lg) {
  launch_args args;
  args_init(&args, p, maps);
  if (drv->cuGraphCreate(&lg->graph, 0) != CUDA_SUCCESS) {
    lg->graph = NULL;
    return -1;
  }
  for (int i = 0; i < count; ++i) {
    CUDA_KERNEL_NODE_PARAMS np;
    node_params(&launches[i], args_of(&args, &launches[i]), &np);
    if (drv->cuGraphAddKernelNode(&lg->nodes[i], lg->graph,
                                  i ? &lg->nodes[i - 1] : NULL, i ? 1 : 0,
                                  &np) != CUDA_SUCCESS)
      goto fail;
  }
  if (drv->cuGraphInstantiate(&lg->exec, lg->graph, 0) != CUDA_SUCCESS) {
    lg->exec = NULL;
    goto fail;
  }
  lg->count = count;
  memcpy(lg->launches, launches, (size_t)count * sizeof *launches);
  lg->params = *p;
  return 0;
fail:
  free_graph(drv, lg);
  return -1;
}

/* Whether two launches are the same (field by field: the struct has
 * padding). */
static int same_launch(const sdpa_launch *a, const sdpa_launch *b) {
  return a->func == b->func && a->grid_x == b->grid_x && a->grid_y == b->grid_y &&
         a->block_x == b->block_x && a->smem_bytes == b->smem_bytes &&
         a->takes_maps == b->takes_maps;
}

/* Gives `lg` this call's launches and parameters where they differ from
 * its last; 0 on success, -1 when the graph cannot take them (the caller
 * drops it). Functions and the node count must match. */
static int update_graph(const sdpa_driver *drv, sdpa_launch_graph *lg,
                        const sdpa_launch *launches, int count,
                        const sdpa_kernel_params *p, const sdpa_tensor_maps *maps) {
  if (count != lg->count) return -1;
  for (int i = 0; i < count; ++i)
    if (launches[i].func != lg->launches[i].func) return -1;
  /* the maps follow from the block: unchanged with it */
  const int params_changed = memcmp(p, &lg->params, sizeof *p) != 0;
  launch_args args;
  args_init(&args, p, maps);
  for (int i = 0; i < count; ++i) {
    if (!params_changed && same_launch(&launches[i], &lg->launches[i])) continue;
    CUDA_KERNEL_NODE_PARAMS np;
    node_params(&launches[i], args_of(&args, &launches[i]), &np);
    if (drv->cuGraphExecKernelNodeSetParams(lg->exec, lg->nodes[i], &np) !=
        CUDA_SUCCESS)
      return -1;
    lg->launches[i] = launches[i];
  }
  lg->params = *p;
  return 0;
}

/* The slot of (ctx, stream), or a new one while there is room; NULL
 * when the plan has SDPA_LAUNCH_GRAPHS others. Lock held. */
static sdpa_launch_graph *slot_for(sdpa_launch_graphs *g, CUcontext ctx, CUstream stream) {
  for (int i = 0; i < g->used; ++i)
    if (g->graphs[i].ctx == ctx && g->graphs[i].stream == stream) return &g->graphs[i];
  if (g->used == SDPA_LAUNCH_GRAPHS) return NULL;
  sdpa_launch_graph *lg = &g->graphs[g->used++];
  memset(lg, 0, sizeof *lg);
  lg->ctx = ctx;
  lg->stream = stream;
  return lg;
}

int sdpa_launch_graphs_made(sdpa_launch_graphs *g) {
  int made = 0;
  pthread_mutex_lock(&g->lock);
  for (int i = 0; i < g->used; ++i) made += g->graphs[i].exec != NULL;
  pthread_mutex_unlock(&g->lock);
  return made;
}

/* Launches through the graph; 1 when done (or failed: *status set), 0
 * when the caller must launch directly. */
static int try_graph(sdpa_launch_graphs *g, const sdpa_driver *drv,
                     CUcontext ctx, CUstream stream, const sdpa_launch *launches,
                     int count, const sdpa_kernel_params *p, const sdpa_tensor_maps *maps,
                     sdpa_status *status) {
  if (!g->enabled || !drv->has_graphs) return 0;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (drv->cuStreamIsCapturing(stream, &capture) != CUDA_SUCCESS ||
      capture != CU_STREAM_CAPTURE_STATUS_NONE)
    return 0; /* captured launches become the caller's graph's nodes */
  if (pthread_mutex_trylock(&g->lock) != 0) return 0;
  int done = 0, fresh = 0;
  sdpa_launch_graph *lg = g->failed ? NULL : slot_for(g, ctx, stream);
  if (lg && !lg->exec) {
    if (!lg->seen) { /* a stream's first call goes kernel by kernel */
      lg->seen = 1;
      lg = NULL;
    } else if (make_graph(drv, launches, count, p, maps, lg) != 0) {
      g->failed = 1;
      lg = NULL;
    } else {
      fresh = 1;
    }
  }
  if (lg && !fresh && update_graph(drv, lg, launches, count, p, maps) != 0) {
    /* Not this graph's shape (a THD call with no query rows drops a
     * kernel: the graph stays for the next call) or other kernels, or the
     * driver refused the update (the graph is dropped and remade on the
     * stream's next call): this call goes kernel by kernel. */
    if (count == lg->count) free_graph(drv, lg);
    lg = NULL;
  }
  if (lg) {
    CUresult rc = drv->cuGraphLaunch(lg->exec, stream);
    *status = rc == CUDA_SUCCESS
                  ? SDPA_STATUS_SUCCESS
                  : sdpa_driver_error(drv, rc, "launching the backward's graph");
    done = 1;
  }
  pthread_mutex_unlock(&g->lock);
  return done;
}

sdpa_status sdpa_launch_run(sdpa_launch_graphs *g, const sdpa_driver *drv,
                            CUcontext ctx, CUstream stream,
                            const sdpa_launch *launches, int count,
                            const sdpa_kernel_params *p, const sdpa_tensor_maps *maps) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (try_graph(g, drv, ctx, stream, launches, count, p, maps, &status)) return status;
  launch_args args;
  args_init(&args, p, maps);
  for (int i = 0; i < count; ++i) {
    const sdpa_launch *l = &launches[i];
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(l->func, l->grid_x, l->grid_y, 1,
                                           l->block_x, 1, 1, l->smem_bytes,
                                           stream, args_of(&args, l), NULL),
                  l->what);
  }
done:
  return status;
}
