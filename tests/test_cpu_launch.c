/*
 * test_cpu_launch.c — execute's launch paths (src/launch.c) against a
 * recording stand-in for the CUDA driver, so that every rule runs without
 * a GPU: a stream's first call goes kernel by kernel and its second makes
 * the graph; later calls update only the nodes whose parameters or grid
 * changed; four streams at most; capture, a held lock, a different kernel
 * count, the switch and a driver without graphs all go kernel by kernel;
 * a graph that cannot be made turns the graphs off for the plan, one that
 * refuses an update is remade; driver errors come back as statuses; every
 * graph made is destroyed. (test_gpu_bwd checks the results on a GPU.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "launch.h"
#include "sdpa_jit.h"

/* ------------------------------------------------------ the stand-in */

static struct {
  int launches, graph_launches, creates, nodes, instantiates, set_params;
  int exec_destroys, graph_destroys, set_current;
  unsigned last_grid_x;         /* of the last kernel launch or update */
  CUstream last_stream;
  CUstreamCaptureStatus capture; /* what IsCapturing reports           */
  CUresult instantiate_result, set_params_result, graph_launch_result;
  uintptr_t next_handle;
  void *last_args[2];            /* the last launch's or node's kernel params */
  int expect_maps;               /* the main kernel takes two parameters  */
} fake;

static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *out) {
  (void)s;
  *out = fake.capture;
  return CUDA_SUCCESS;
}
static CUresult fake_graph_create(CUgraph *g, unsigned flags) {
  (void)flags;
  fake.creates++;
  *g = (CUgraph)++fake.next_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_add_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_KERNEL_NODE_PARAMS *p) {
  (void)g;
  fake.last_args[0] = p->kernelParams[0];
  if (fake.expect_maps && p->func == (CUfunction)0xf1) fake.last_args[1] = p->kernelParams[1];
  /* a chain: every node but the first after the one before */
  ck_assert_uint_eq(ndeps, fake.nodes % 3 == 0 ? 0 : 1);
  ck_assert(ndeps == 0 || deps != NULL);
  fake.nodes++;
  *n = (CUgraphNode)++fake.next_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  (void)g;
  (void)flags;
  fake.instantiates++;
  if (fake.instantiate_result != CUDA_SUCCESS) return fake.instantiate_result;
  *e = (CUgraphExec)++fake.next_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_set_params(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
  (void)e;
  (void)n;
  fake.set_params++;
  fake.last_grid_x = p->gridDimX;
  return fake.set_params_result;
}
static CUresult fake_graph_launch(CUgraphExec e, CUstream s) {
  (void)e;
  fake.graph_launches++;
  fake.last_stream = s;
  return fake.graph_launch_result;
}
static CUresult fake_exec_destroy(CUgraphExec e) {
  (void)e;
  fake.exec_destroys++;
  return CUDA_SUCCESS;
}
static CUresult fake_graph_destroy(CUgraph g) {
  (void)g;
  fake.graph_destroys++;
  return CUDA_SUCCESS;
}
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned smem, CUstream s, void **args,
                            void **extra) {
  (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)extra;
  ck_assert_ptr_nonnull(args);
  fake.last_args[0] = args[0];
  if (fake.expect_maps && f == (CUfunction)0xf1) fake.last_args[1] = args[1];
  fake.launches++;
  fake.last_grid_x = gx;
  fake.last_stream = s;
  return CUDA_SUCCESS;
}
static CUresult fake_ctx_get(CUcontext *c) {
  *c = NULL;
  return CUDA_SUCCESS;
}
static CUresult fake_ctx_set(CUcontext c) {
  (void)c;
  fake.set_current++;
  return CUDA_SUCCESS;
}
static CUresult fake_error_name(CUresult rc, const char **s) {
  (void)rc;
  *s = "CUDA_ERROR_LAUNCH_FAILED";
  return CUDA_SUCCESS;
}
static CUresult fake_error_string(CUresult rc, const char **s) {
  (void)rc;
  *s = "unspecified launch failure";
  return CUDA_SUCCESS;
}

static sdpa_driver drv;

static void setup(void) {
  memset(&fake, 0, sizeof fake);
  fake.next_handle = 0x1000;
  memset(&drv, 0, sizeof drv);
  drv.cuStreamIsCapturing = fake_is_capturing;
  drv.cuGraphCreate = fake_graph_create;
  drv.cuGraphAddKernelNode = fake_add_node;
  drv.cuGraphInstantiate = fake_instantiate;
  drv.cuGraphExecKernelNodeSetParams = fake_set_params;
  drv.cuGraphLaunch = fake_graph_launch;
  drv.cuGraphExecDestroy = fake_exec_destroy;
  drv.cuGraphDestroy = fake_graph_destroy;
  drv.cuLaunchKernel = fake_launch;
  drv.cuCtxGetCurrent = fake_ctx_get;
  drv.cuCtxSetCurrent = fake_ctx_set;
  drv.cuGetErrorName = fake_error_name;
  drv.cuGetErrorString = fake_error_string;
  drv.has_graphs = 1;
}

/* ------------------------------------------------------------ helpers */

static const CUcontext ctx_a = (CUcontext)0xc0;
static const CUstream stream_a = (CUstream)0x5a, stream_b = (CUstream)0x5b;

/* Kernel launches, graph launches and graphs created so far. */
#define EXPECT_CALLS(launches_, graph_launches_, creates_)                         \
  ck_assert_msg(fake.launches == (launches_) && fake.graph_launches == (graph_launches_) && \
                    fake.creates == (creates_),                                       \
                "kernel launches %d, graph launches %d, graphs created %d; "       \
                "expected %d, %d, %d",                                              \
                fake.launches, fake.graph_launches, fake.creates, (launches_),     \
                (graph_launches_), (creates_))

/* A call's three launches (preprocess, main, convert), `grid` the
 * preprocess grid; `count` of them. */
static void make_launches(sdpa_launch *l, unsigned grid) {
  l[0] = (sdpa_launch){(CUfunction)0xf0, "launching sdpa_bwd_preprocess", grid, 1, 256, 0, 0};
  l[1] = (sdpa_launch){(CUfunction)0xf1, "launching sdpa_bwd_main", 64, 8, 256, 90000, 0};
  l[2] = (sdpa_launch){(CUfunction)0xf2, "launching sdpa_bwd_convert_dq", 96, 1, 256, 0, 0};
}

static sdpa_status call(sdpa_launch_graphs *g, CUstream s, unsigned grid, const void *q,
                        int count) {
  sdpa_launch l[3];
  make_launches(l, grid);
  sdpa_kernel_params p;
  memset(&p, 0, sizeof p);
  p.q = q;
  return sdpa_launch_run(g, &drv, ctx_a, s, l, count, &p, NULL);
}

/* A plan's graphs, on (enabled) or off (the plan's options.graphs). */
static sdpa_launch_graphs *graphs_switched(int enabled) {
  sdpa_launch_graphs *g = malloc(sizeof *g);
  ck_assert_ptr_nonnull(g);
  ck_assert_int_eq(sdpa_launch_graphs_init(g, enabled), SDPA_STATUS_SUCCESS);
  return g;
}

static sdpa_launch_graphs *new_graphs(void) { return graphs_switched(1); }

/* Graphs after two calls on stream_a: one graph of 3 nodes made, 3
 * kernel launches and 1 graph launch counted. */
static sdpa_launch_graphs *graphs_with_one(void) {
  sdpa_launch_graphs *g = new_graphs();
  call(g, stream_a, 10, (void *)0x100, 3);
  call(g, stream_a, 10, (void *)0x100, 3);
  EXPECT_CALLS(3, 1, 1);
  return g;
}

static void free_graphs(sdpa_launch_graphs *g) {
  sdpa_launch_graphs_destroy(g, &drv);
  free(g);
}

/* -------------------------------------------------------------- tests */

START_TEST(first_call_direct_second_makes_graph) {
  sdpa_launch_graphs *g = new_graphs();
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  EXPECT_CALLS(3, 0, 0);
  ck_assert_ptr_eq(fake.last_stream, stream_a);
  ck_assert_int_eq(sdpa_launch_graphs_made(g), 0);

  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x200, 3), SDPA_STATUS_SUCCESS);
  EXPECT_CALLS(3, 1, 1); /* no kernel launch more */
  ck_assert_int_eq(fake.nodes, 3);
  ck_assert_int_eq(fake.instantiates, 1);
  ck_assert_int_eq(fake.set_params, 0); /* made with this call's values */
  ck_assert_ptr_eq(fake.last_stream, stream_a);
  ck_assert_int_eq(sdpa_launch_graphs_made(g), 1);
  free_graphs(g);
  ck_assert_int_eq(fake.exec_destroys, 1);
  ck_assert_int_eq(fake.graph_destroys, 1);
}
END_TEST

START_TEST(updates_only_what_changed) {
  sdpa_launch_graphs *g = graphs_with_one(); /* stream_a's, 3 nodes */
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.set_params, 0); /* the same call again */
  ck_assert_int_eq(fake.graph_launches, 2);
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x300, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.set_params, 3); /* a pointer: every node */
  ck_assert_int_eq(call(g, stream_a, 11, (void *)0x300, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.set_params, 4); /* a grid: its node only */
  ck_assert_uint_eq(fake.last_grid_x, 11);
  EXPECT_CALLS(3, 4, 1);
  free_graphs(g);
}
END_TEST

START_TEST(four_streams_at_most) {
  sdpa_launch_graphs *g = new_graphs();
  for (uintptr_t s = 1; s <= 5; ++s)
    for (int i = 0; i < 2; ++i)
      ck_assert_int_eq(call(g, (CUstream)s, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(sdpa_launch_graphs_made(g), SDPA_LAUNCH_GRAPHS);
  EXPECT_CALLS(3 * (4 + 2), 4, 4); /* four first calls, the fifth stream twice */
  ck_assert_ptr_eq(fake.last_stream, (CUstream)5);
  free_graphs(g);
  ck_assert_int_eq(fake.exec_destroys, 4);
  ck_assert_int_eq(fake.graph_destroys, 4);
  ck_assert_int_ge(fake.set_current, 5); /* each graph's context, then the caller's */
}
END_TEST

START_TEST(capture_goes_kernel_by_kernel) {
  sdpa_launch_graphs *g = graphs_with_one(); /* stream_a's, 3 nodes */
  fake.capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(call(g, stream_b, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  EXPECT_CALLS(9, 1, 1);
  ck_assert_int_eq(g->used, 1); /* a captured stream takes no slot */
  fake.capture = CU_STREAM_CAPTURE_STATUS_NONE;
  call(g, stream_a, 10, (void *)0x100, 3);
  ck_assert_int_eq(fake.graph_launches, 2);
  free_graphs(g);
}
END_TEST

START_TEST(other_kernel_count_keeps_the_graph) {
  sdpa_launch_graphs *g = graphs_with_one(); /* stream_a's, 3 nodes */
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 1), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.launches, 4);
  ck_assert_int_eq(sdpa_launch_graphs_made(g), 1);
  call(g, stream_a, 10, (void *)0x100, 3);
  EXPECT_CALLS(4, 2, 1);
  free_graphs(g);
}
END_TEST

START_TEST(graph_not_made_turns_graphs_off) {
  sdpa_launch_graphs *g = new_graphs();
  fake.instantiate_result = CUDA_ERROR_OUT_OF_MEMORY;
  call(g, stream_a, 10, (void *)0x100, 3);
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.launches, 6); /* the failed make fell back */
  ck_assert_int_eq(fake.graph_destroys, 1); /* nothing kept */
  fake.instantiate_result = CUDA_SUCCESS;
  for (int i = 0; i < 3; ++i) call(g, stream_b, 10, (void *)0x100, 3);
  ck_assert_int_eq(fake.instantiates, 1); /* not tried again */
  ck_assert_int_eq(fake.launches, 15);
  ck_assert_int_eq(sdpa_launch_graphs_made(g), 0);
  free_graphs(g);
}
END_TEST

START_TEST(refused_update_remakes_graph) {
  sdpa_launch_graphs *g = graphs_with_one(); /* stream_a's, 3 nodes */
  fake.set_params_result = CUDA_ERROR_INVALID_VALUE;
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x200, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.launches, 6); /* this call kernel by kernel */
  ck_assert_int_eq(sdpa_launch_graphs_made(g), 0);
  ck_assert_int_eq(fake.exec_destroys, 1);
  fake.set_params_result = CUDA_SUCCESS;
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x300, 3), SDPA_STATUS_SUCCESS);
  EXPECT_CALLS(6, 2, 2); /* remade */
  free_graphs(g);
}
END_TEST

START_TEST(switch_driver_and_lock) {
  sdpa_launch_graphs *g = new_graphs();
  sdpa_launch_graphs *off = graphs_switched(0);
  for (int i = 0; i < 3; ++i) call(off, stream_a, 10, (void *)0x100, 3);
  EXPECT_CALLS(9, 0, 0);
  free_graphs(off);

  drv.has_graphs = 0;
  for (int i = 0; i < 3; ++i) call(g, stream_a, 10, (void *)0x100, 3);
  EXPECT_CALLS(18, 0, 0);
  drv.has_graphs = 1;

  call(g, stream_a, 10, (void *)0x100, 3);
  call(g, stream_a, 10, (void *)0x100, 3); /* graph */
  ck_assert_int_eq(pthread_mutex_lock(&g->lock), 0); /* another thread's call */
  const int before = fake.launches;
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.launches, before + 3);
  ck_assert_int_eq(fake.graph_launches, 1);
  pthread_mutex_unlock(&g->lock);
  free_graphs(g);
}
END_TEST

/* The Hopper family's main kernel takes the call's tensor maps as its
 * second parameter, kernel by kernel and through the graph; the other
 * kernels take the block alone. */
START_TEST(maps_reach_the_main_kernel) {
  sdpa_launch_graphs *g = new_graphs();
  sdpa_launch l[3];
  make_launches(l, 10);
  l[1].takes_maps = 1;
  sdpa_kernel_params p;
  memset(&p, 0, sizeof p);
  sdpa_tensor_maps maps;
  memset(&maps, 0x5a, sizeof maps);
  fake.expect_maps = 1;
  /* first call, kernel by kernel: main (launched second) saw both */
  ck_assert_int_eq(sdpa_launch_run(g, &drv, ctx_a, stream_a, l, 2, &p, &maps),
                   SDPA_STATUS_SUCCESS);
  ck_assert_ptr_eq(fake.last_args[0], &p);
  ck_assert_ptr_eq(fake.last_args[1], &maps);
  /* second call makes the graph: the main node gets both */
  ck_assert_int_eq(sdpa_launch_run(g, &drv, ctx_a, stream_a, l, 2, &p, &maps),
                   SDPA_STATUS_SUCCESS);
  ck_assert_int_eq(fake.creates, 1);
  ck_assert_ptr_eq(fake.last_args[1], &maps);
  fake.expect_maps = 0;
  free_graphs(g);
}
END_TEST

START_TEST(launch_error_is_a_status) {
  sdpa_launch_graphs *g = new_graphs();
  call(g, stream_a, 10, (void *)0x100, 3);
  fake.graph_launch_result = CUDA_ERROR_LAUNCH_FAILED;
  ck_assert_int_eq(call(g, stream_a, 10, (void *)0x100, 3), SDPA_STATUS_DRIVER_ERROR);
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "launching the backward's graph"));
  ck_assert_ptr_nonnull(strstr(sdpa_last_error(), "CUDA_ERROR_LAUNCH_FAILED"));
  free_graphs(g);
}
END_TEST

static Suite *launch_suite(void) {
  Suite *s = suite_create("launch");
  TCase *tc = tcase_create("launch");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, first_call_direct_second_makes_graph);
  tcase_add_test(tc, updates_only_what_changed);
  tcase_add_test(tc, four_streams_at_most);
  tcase_add_test(tc, capture_goes_kernel_by_kernel);
  tcase_add_test(tc, other_kernel_count_keeps_the_graph);
  tcase_add_test(tc, graph_not_made_turns_graphs_off);
  tcase_add_test(tc, refused_update_remakes_graph);
  tcase_add_test(tc, switch_driver_and_lock);
  tcase_add_test(tc, maps_reach_the_main_kernel);
  tcase_add_test(tc, launch_error_is_a_status);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return sdpa_test_run(launch_suite()); }
