/*
 * launch.h — one execute call's kernels (preprocess, main, dQ convert, in
 * that order) put on the caller's stream: as one CUDA graph launch when
 * the plan has a graph for the (context, stream), else kernel by kernel.
 *
 * A graph launch costs the host a fraction of three kernel launches
 * (bench/NOTES.md), so each plan keeps up to SDPA_LAUNCH_GRAPHS executable
 * graphs, one per (context, stream) it was executed on, made on the second
 * execute there (a plan executed once never pays for a graph) and given
 * the call's parameters before each launch. One graph per stream keeps
 * launches on different streams as independent as the kernels' own
 * launches would be (a graph's launches are ordered behind each other).
 * Execute launches each kernel itself, with the same result, on a
 * stream's first call, while the stream is being captured into a graph
 * (the capture records the kernels), when another thread holds the plan's
 * graphs, when the plan has seen SDPA_LAUNCH_GRAPHS other streams, when
 * the driver lacks graphs, after a graph could not be made, or with the
 * plan's graphs off (options.graphs, SDPA_JIT_GRAPHS=0).
 */
#ifndef SDPA_LAUNCH_H
#define SDPA_LAUNCH_H

#include <pthread.h>

#include "driver.h"
#include "../templates/sdpa_params.h"
#include "../templates/sdpa_tensor_maps.h"

#define SDPA_LAUNCH_GRAPHS 4

/* One kernel launch of a call. */
typedef struct sdpa_launch {
  CUfunction func;
  const char *what; /* "launching sdpa_bwd_main", for error messages */
  unsigned grid_x, grid_y, block_x, smem_bytes;
  int takes_maps;   /* a second parameter: the call's tensor maps    */
} sdpa_launch;

/* One (context, stream) the plan was executed on, and its graph once made
 * (exec != NULL): its nodes run `launches` in order; `params` is what they
 * were last given. */
typedef struct sdpa_launch_graph {
  CUcontext ctx;
  CUstream stream;
  int seen; /* executed here before: the next call makes the graph */
  CUgraph graph;
  CUgraphExec exec;
  CUgraphNode nodes[3];
  int count;
  sdpa_launch launches[3];
  sdpa_kernel_params params;
} sdpa_launch_graph;

/* A plan's graphs. */
typedef struct sdpa_launch_graphs {
  pthread_mutex_t lock; /* held by one execute at a time (try-locked) */
  int enabled;          /* the plan's options.graphs                 */
  int failed;           /* a graph could not be made: launch directly */
  int used;             /* graphs[0..used) are in use                 */
  sdpa_launch_graph graphs[SDPA_LAUNCH_GRAPHS];
} sdpa_launch_graphs;

/* Initializes `g` (no graph yet); `enabled` zero: kernel by kernel
 * always (the plan's options.graphs). */
sdpa_status sdpa_launch_graphs_init(sdpa_launch_graphs *g, int enabled);

/* Destroys `g`'s graphs through `drv` (NULL: the process's driver, when
 * there are graphs), each in its own context (driver errors ignored: the
 * context may be gone), restoring the caller's current context. */
void sdpa_launch_graphs_destroy(sdpa_launch_graphs *g, const sdpa_driver *drv);

/* How many of `g`'s slots hold a graph (tests). */
int sdpa_launch_graphs_made(sdpa_launch_graphs *g);

/* Puts `count` (1-3) launches with parameter block *p (and, for the
 * launches that take them, the tensor maps *maps, a pure function of *p's
 * pointers, strides and totals) on `stream` in the current context `ctx`:
 * through the plan's graph for (ctx, stream) when it can (see above),
 * else with cuLaunchKernel each. Returns SUCCESS or the driver's error as
 * a status with a message. */
sdpa_status sdpa_launch_run(sdpa_launch_graphs *g, const sdpa_driver *drv,
                            CUcontext ctx, CUstream stream,
                            const sdpa_launch *launches, int count,
                            const sdpa_kernel_params *p, const sdpa_tensor_maps *maps);

#endif /* SDPA_LAUNCH_H */
