/*
 * bench_hopper.c — the sm_90a family's kernels (templates/sdpa_hopper.cuh)
 * checked and timed on their own, beside the mma.sync family run through
 * the public API, before the runtime launches them.
 *
 * The harness compiles the family's translation unit (the key's #defines,
 * then #include "sdpa_hopper.cuh") with NVRTC for sm_90a, with the
 * embedded templates as named headers (as src/nvrtc.c does), prints each
 * key's ptxas report for sdpa_bwd_main (registers, spills, every warning)
 * and the compile time, builds the four tensor maps with
 * cuTensorMapEncodeTiled (templates/sdpa_tensor_maps.h), fills the
 * parameter block itself (templates/sdpa_params.h, as plan.c and
 * execute.c do, with this family's tiles) and launches preprocess → main
 * → convert from its own module.
 *
 * Check cases: a problem with fresh random data (the seed is printed),
 * the float64 reference (tests/support/reference.h), the mma.sync family
 * through plan/compile/execute on the same data, then this family on
 * poisoned outputs and workspace (NaN). A case passes when every dq, dk,
 * dv element is finite, ‖x − ref‖/‖ref‖ is within the dtype's tolerance
 * (bf16 1e-2, fp16 2e-3) and within 1.5× the mma family's error (+2e-4),
 * nothing outside the output tensors was written and no input changed.
 * Timed cases: B·S = 16k tokens, H·D = 2048 (and GQA, THD): each kernel
 * chain timed with CUDA events (median of --runs after 3 warm-ups, inputs
 * rotated over 2 sets), TFLOP/s = 2.5 · 4 · B·H·Sq·Skv·D (halved for
 * causal); its outputs compared with the mma family's on the same data
 * (relative difference, must be under the tolerance), and a small twin of
 * the case (same key) checked against the reference.
 *
 * Options:
 *   --compile-only    compile every key class (no GPU needed) and print the
 *                     reports; exit 1 on a spill, a warning or an error, or
 *                     when the --case filters leave no class
 *   --quick           a few check and timed cases
 *   --case SUBSTR     only cases (with --compile-only: key classes) whose name
 *                     contains SUBSTR (repeatable)
 *   --checks | --timed  only the check or the timed cases
 *   --no-twin         timed cases without their small twin's check (the
 *                     comparison with the mma family at full size stays)
 *   --blocks N        launch a persistent kernel (sdpa_hopper_persistent_kernel,
 *                     or --define SDPA_HOPPER_PERSIST=1) with N blocks instead
 *                     of one an SM (checks: every block takes many tiles)
 *   --define TEXT     add "#define TEXT" to every translation unit
 *                     (variants: e.g. SDPA_HOPPER_PRODUCER_REGS=40)
 *   --runs N          timed runs per case (default 20)
 *   --order-group N   (sequence, kv head) pairs per group of the masked
 *                     launch order (default: the plan's rule, 256 blocks)
 *   --longest-first   THD without a mask: launch the sequences longest
 *                     first (options.longest_first ON,
 *                     sdpa_hopper_longest_first) instead of in batch order
 *   --memory ORDER    bshd (default: [B, S, H, D], packed BSHD) or bhsd
 *                     ([B, H, S, D]: the same BSHD descriptor with other
 *                     strides) for the BSHD problems
 *   --seed N          the check data's seed (default: from the clock)
 *   --cubin-dir DIR   write each compiled key's cubin and PTX to DIR (for
 *                     cuobjdump, and the lines ptxas messages cite)
 *   --trace DIR       compile with SDPA_HOPPER_TRACE (per-block clock stamps,
 *                     sdpa_hopper.cuh) and write each timed case's stamps
 *                     of one more run to DIR/<case>.csv (bench/trace_summary.py
 *                     reads them)
 * Exit: 0 when every case passed, 1 when one failed, 77 without a GPU.
 */
#include <crt/../nvrtc.h> /* the toolkit's: src/nvrtc.h shadows <nvrtc.h> */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "reference.h"
#include "status.h"
#include "../templates/sdpa_params.h"
#include "../templates/sdpa_tensor_maps.h"
#include "../templates/sdpa_hopper_traits.h"
#include "../templates/sdpa_traits.h" /* sdpa_aux_blocks */

_Static_assert(sizeof(CUtensorMap) == sizeof(sdpa_tensor_map), "a slot holds a CUtensorMap");

/* The templates embedded into the library (src/embed.cmake's table). */
typedef struct embedded_file {
  const char *name;
  const char *data;
  size_t size;
} embedded_file;
extern const embedded_file sdpa_embedded_templates[];

#define MAX_SEQS 16
#define MAX_CASES 96
#define MAX_MODULES 1024
#define MAX_DEFINES 8
#define AUX_THREADS SDPA_AUX_THREADS
#define SETS 2
#define WARMUP 3
#define LOG2E 1.4426950408889634

static sdpa_gpu gpu;
static int have_gpu;
static sdpa_runtime *runtime;
static const char *extra_defines[MAX_DEFINES];
static const char *cubin_dir; /* --cubin-dir: each key's cubin is written there */
static int blocks_given; /* --blocks N: a persistent kernel's blocks (else one an SM) */
static int extra_define_count;
static int order_group_given; /* --order-group; 0: the plan's rule */
static int longest_first;     /* --longest-first: options.longest_first ON */
static int memory_bhsd;       /* --memory bhsd: BSHD problems in [B, H, S, D] memory */
static const char *trace_dir; /* --trace: each timed case's block stamps go there */
#define TRACE_BLOCKS 16384
#define TRACE_SLOTS SDPA_HOPPER_TRACE_SLOTS

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

/* A case that takes longer than WATCHDOG_S seconds (a kernel that never
 * finishes) ends the process with its name and exit status 3, so that a
 * session's later steps still run. */
#define WATCHDOG_S 60
static atomic_llong watchdog_since; /* ms, 0 = disarmed */
static char watchdog_case[128];

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec d = {1, 0};
    nanosleep(&d, NULL);
    const long long since = atomic_load(&watchdog_since);
    if (since && now_ms() - (double)since > WATCHDOG_S * 1e3) {
      printf("\nHANG: case \"%s\" ran over %d s; exiting\n", watchdog_case, WATCHDOG_S);
      fflush(stdout);
      _exit(3);
    }
  }
  return NULL;
}

static void watchdog_arm(const char *name) {
  snprintf(watchdog_case, sizeof watchdog_case, "%.127s", name);
  atomic_store(&watchdog_since, (long long)now_ms());
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ keys */

/* The key fields the family's translation unit takes. */
typedef struct hkey {
  sdpa_dtype dtype;
  int head_dim, head_dim_v;
  sdpa_layout layout;
  sdpa_mask mask;
  int lse_packed, even;
} hkey;

/* A compiled key: its module and kernels (when a GPU is there), its
 * ptxas report for sdpa_bwd_main and compile time. */
typedef struct hmodule {
  hkey key;
  char source[2048];
  int compiled, failed;
  double compile_ms;
  int spill_bytes, warnings;
  char report[2048];
  CUmodule module;
  CUfunction pre, main, convert;
} hmodule;

static hmodule modules[MAX_MODULES];
static int module_count;

/* The value of the first --define NAME=0 or NAME=1, else `fallback`. */
static int define_switch(const char *name, int fallback) {
  const size_t n = strlen(name);
  for (int i = 0; i < extra_define_count; i++) {
    const char *d = extra_defines[i];
    if (!strncmp(d, name, n) && d[n] == '=' && (d[n + 1] == '0' || d[n + 1] == '1') && !d[n + 2])
      return d[n + 1] - '0';
  }
  return fallback;
}

/* Whether the kernels reduce dQ by bulk reduce-adds (the default, or a
 * --define SDPA_HOPPER_DQ_BULK=0/1: it changes the shared-memory carve). */
static int dq_bulk_defined(int head_dim) {
  return define_switch("SDPA_HOPPER_DQ_BULK", SDPA_HOPPER_DQ_BULK_DEFAULT(head_dim, 0));
}

/* Whether the kernel of a key with this head dim, layout and mask takes its tiles
 * in a loop (the traits' rule for non-deterministic keys, or a --define
 * SDPA_HOPPER_PERSIST=0/1): launched then with one block an SM. */
static int persist_defined(int head_dim, int layout, int mask) {
  return define_switch("SDPA_HOPPER_PERSIST",
                       sdpa_hopper_persistent_kernel(head_dim, layout, mask, 0));
}

/* Whether the main kernel converts dQ itself (the key field dq=main; a
 * --define SDPA_FOLD_DQ=1 here, which replaces the key's 0): no convert
 * launch then, a counter a query tile, and the kernel's conversion
 * buffers past its carve. */
static int fold_defined(void) { return define_switch("SDPA_FOLD_DQ", 0); }

/* The key's configuration; a --define SDPA_HOPPER_STAGES_VARIANT=N
 * (measurement only) deepens or shortens the Q/dO ring. */
static sdpa_hopper_config with_variants(sdpa_hopper_config c) {
  for (int i = 0; i < extra_define_count; i++)
    if (!strncmp(extra_defines[i], "SDPA_HOPPER_STAGES_VARIANT=", 27))
      c.stages = atoi(extra_defines[i] + 27);
  return c;
}

static sdpa_hopper_config key_config(const hkey *k) {
  return with_variants(sdpa_hopper_choose(k->head_dim, k->head_dim_v, 0));
}

static void key_name(const hkey *k, char *out, size_t size) {
  static const char *masks[] = {"none", "causal_tl", "causal_br", "window"};
  char dims[24];
  if (k->head_dim_v == k->head_dim) snprintf(dims, sizeof dims, "%d", k->head_dim);
  else snprintf(dims, sizeof dims, "%d/%d", k->head_dim, k->head_dim_v);
  snprintf(out, size, "%s hd%s %s %s lse=%s even=%d", sdpa_ref_dtype_name(k->dtype), dims,
           k->layout == SDPA_LAYOUT_THD ? "thd" : "bshd", masks[k->mask],
           k->lse_packed ? "packed" : "strided", k->even);
}

/* The translation unit of a key, as src/instantiate.c writes it (with the
 * family's tiles), plus the --define lines. */
static void key_source(const hkey *k, char *out, size_t size) {
  const sdpa_hopper_config c = key_config(k);
  int n = snprintf(out, size,
                   "/* sdpa-jit instantiation */\n#define SDPA_ARCH 90\n#define SDPA_FAMILY 2\n"
                   "#define SDPA_DTYPE %d\n#define SDPA_HEAD_DIM %d\n#define SDPA_HEAD_DIM_V %d\n"
                   "#define SDPA_Q_TILE %d\n#define SDPA_KV_TILE %d\n#define SDPA_WARPS %d\n"
                   "#define SDPA_STAGES %d\n#define SDPA_LSE_PACKED %d\n#define SDPA_LAYOUT %d\n"
                   "#define SDPA_MASK %d\n#define SDPA_DETERMINISTIC 0\n#define SDPA_EVEN %d\n"
                   "#define SDPA_FOLD_DQ %d\n",
                   k->dtype == SDPA_DTYPE_FP16 ? 1 : 2, k->head_dim, k->head_dim_v, c.q_tile,
                   c.kv_tile, c.warps, c.stages, k->lse_packed, k->layout == SDPA_LAYOUT_THD ? 2 : 1,
                   (int)k->mask, k->even, fold_defined());
  for (int i = 0; i < extra_define_count && n > 0 && (size_t)n < size; i++) {
    char line[256];
    if (!strncmp(extra_defines[i], "SDPA_FOLD_DQ=", 13)) continue; /* the key's line above */
    snprintf(line, sizeof line, "%s", extra_defines[i]);
    char *eq = strchr(line, '=');
    if (eq) *eq = ' ';
    n += snprintf(out + n, size - (size_t)n, "#define %s\n", line);
  }
  if (n > 0 && (size_t)n < size) snprintf(out + n, size - (size_t)n, "#include \"sdpa_hopper.cuh\"\n");
}

/* Keeps from the NVRTC log the lines about sdpa_bwd_main and every
 * warning; counts spill bytes and warnings. */
static void read_report(hmodule *m, const char *log) {
  int in_main = 0;
  size_t used = 0;
  m->report[0] = '\0';
  m->spill_bytes = 0;
  m->warnings = 0;
  for (const char *line = log; line && *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char text[512];
    snprintf(text, sizeof text, "%.*s", (int)(len < 511 ? len : 511), line);
    if (strstr(text, "Compiling entry function")) in_main = strstr(text, "'sdpa_bwd_main'") != NULL;
    const int warning = strstr(text, "warning") || strstr(text, "Warning") || strstr(text, "C75");
    m->warnings += warning != 0;
    int stores = 0;
    const char *sp = strstr(text, "bytes spill stores");
    if (in_main && sp) {
      const char *p = sp;
      while (p > text && p[-1] == ' ') p--;
      while (p > text && p[-1] >= '0' && p[-1] <= '9') p--;
      stores = atoi(p);
      m->spill_bytes += stores;
    }
    if ((in_main && (strstr(text, "Used") || sp)) || warning) {
      int n = snprintf(m->report + used, sizeof m->report - used, "    %s\n", text);
      if (n > 0 && used + (size_t)n < sizeof m->report) used += (size_t)n;
    }
    line = end ? end + 1 : NULL;
  }
}

/* Compiles a key with NVRTC for sm_90a; loads it when there is a GPU. */
static int compile_key(hmodule *m) {
  const char *names[64], *data[64];
  int headers = 0;
  for (; sdpa_embedded_templates[headers].name && headers < 64; headers++) {
    names[headers] = sdpa_embedded_templates[headers].name;
    data[headers] = sdpa_embedded_templates[headers].data;
  }
  static const char *const options[] = {"--gpu-architecture=sm_90a", "-std=c++17",
                                        "--device-as-default-execution-space",
                                        "--ptxas-options=-v"};
  nvrtcProgram program = NULL;
  char *log = NULL, *cubin = NULL;
  int ok = 0;
  const double t0 = now_ms();
  if (nvrtcCreateProgram(&program, m->source, "sdpa_hopper.cu", headers, data, names) !=
      NVRTC_SUCCESS)
    goto done;
  nvrtcResult rc = nvrtcCompileProgram(program, 4, options);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  log = calloc(log_size + 1, 1);
  if (log) nvrtcGetProgramLog(program, log);
  size_t cubin_size = 0;
  if (rc == NVRTC_SUCCESS && nvrtcGetCUBINSize(program, &cubin_size) == NVRTC_SUCCESS &&
      (cubin = malloc(cubin_size)) && nvrtcGetCUBIN(program, cubin) == NVRTC_SUCCESS)
    ok = 1;
  m->compile_ms = now_ms() - t0;
  read_report(m, log ? log : "");
  if (!ok) {
    char key[160];
    key_name(&m->key, key, sizeof key);
    printf("COMPILE FAILED: %s: %s\n%.3000s\n", key, nvrtcGetErrorString(rc), log ? log : "");
  }
  if (ok && cubin_dir) {
    char name[160], path[512];
    key_name(&m->key, name, sizeof name);
    for (char *p = name; *p; p++)
      if (*p == ' ' || *p == '=' || *p == '/') *p = '_';
    snprintf(path, sizeof path, "%s/%s.cubin", cubin_dir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
      fwrite(cubin, 1, cubin_size, f);
      fclose(f);
    }
    size_t ptx_size = 0;
    char *ptx = NULL;
    if (nvrtcGetPTXSize(program, &ptx_size) == NVRTC_SUCCESS && (ptx = malloc(ptx_size)) &&
        nvrtcGetPTX(program, ptx) == NVRTC_SUCCESS) {
      snprintf(path, sizeof path, "%s/%s.ptx", cubin_dir, name);
      if ((f = fopen(path, "wb"))) {
        fwrite(ptx, 1, ptx_size ? ptx_size - 1 : 0, f);
        fclose(f);
      }
    }
    free(ptx);
  }
  if (ok && have_gpu) {
    const sdpa_driver *drv = gpu.drv;
    const sdpa_hopper_smem smem =
        sdpa_hopper_smem_layout_variant(key_config(&m->key), dq_bulk_defined(m->key.head_dim),
                                        1 /* not deterministic: one dQ buffer */,
                                        persist_defined(m->key.head_dim, (int)m->key.layout,
                                                        (int)m->key.mask));
    ok = drv->cuModuleLoadData(&m->module, cubin) == CUDA_SUCCESS &&
         drv->cuModuleGetFunction(&m->pre, m->module, "sdpa_bwd_preprocess") == CUDA_SUCCESS &&
         drv->cuModuleGetFunction(&m->main, m->module, "sdpa_bwd_main") == CUDA_SUCCESS &&
         drv->cuModuleGetFunction(&m->convert, m->module, "sdpa_bwd_convert_dq") == CUDA_SUCCESS &&
         drv->cuFuncSetAttribute(m->main, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 smem.total + sdpa_hopper_fold_bytes(key_config(&m->key),
                                                                     fold_defined())) ==
             CUDA_SUCCESS;
    if (!ok) printf("module load failed for %s\n", m->source);
  }
done:
  if (program) nvrtcDestroyProgram(&program);
  free(log);
  free(cubin);
  m->compiled = ok;
  m->failed = !ok;
  return ok;
}

static int key_equal(const hkey *a, const hkey *b) {
  return a->dtype == b->dtype && a->head_dim == b->head_dim && a->head_dim_v == b->head_dim_v &&
         a->layout == b->layout && a->mask == b->mask && a->lse_packed == b->lse_packed &&
         a->even == b->even;
}

/* The module of a key, compiled on first use (NULL when it failed). */
static hmodule *module_for(const hkey *k) {
  for (int i = 0; i < module_count; i++)
    if (key_equal(&modules[i].key, k)) return modules[i].failed ? NULL : &modules[i];
  if (module_count == MAX_MODULES) return NULL;
  hmodule *m = &modules[module_count++];
  memset(m, 0, sizeof *m);
  m->key = *k;
  key_source(k, m->source, sizeof m->source);
  compile_key(m);
  char name[160];
  key_name(k, name, sizeof name);
  printf("  compiled %-44s %7.0f ms  spill %d B  warnings %d\n%s", name, m->compile_ms,
         m->spill_bytes, m->warnings, m->report);
  return m->failed ? NULL : m;
}

/* ----------------------------------------------------------------- cases */

typedef struct hcase {
  char name[96];
  sdpa_dtype dtype;
  sdpa_layout layout;
  sdpa_mask mask;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, head_dim_v;
  int window_left, window_right;
  int lse_strided;   /* LSE token-major ([b,s,h] / [t,h]): the strided class */
  int lens_q[MAX_SEQS], lens_kv[MAX_SEQS];
  int timed;
  /* results */
  int ran, passed, twin_ran;
  double err[3], mma_err[3], diff[3];
  double ms, mma_ms, tflops, mma_tflops;
  char message[512];
} hcase;

static hcase cases[MAX_CASES];
static int case_count;

static int case_even(const hcase *c) {
  const sdpa_hopper_config cfg = sdpa_hopper_choose(c->head_dim, c->head_dim_v, 0);
  return c->layout == SDPA_LAYOUT_BSHD && c->seqlen_q % cfg.q_tile == 0 &&
         c->seqlen_kv % cfg.kv_tile == 0;
}

static hkey case_key(const hcase *c) {
  hkey k = {c->dtype, c->head_dim, c->head_dim_v, c->layout, c->mask, !c->lse_strided,
            case_even(c)};
  return k;
}

static double case_flops(const hcase *c) {
  double pairs = 0;
  if (c->layout == SDPA_LAYOUT_THD)
    for (int b = 0; b < c->batch; b++) pairs += (double)c->lens_q[b] * c->lens_kv[b];
  else
    pairs = (double)c->batch * c->seqlen_q * c->seqlen_kv;
  /* S, dQ, dK over head_dim; dP, dV over head_dim_v (4 x 2.5 x D when equal) */
  const double flops = 2.0 * pairs * c->heads_q * (3.0 * c->head_dim + 2.0 * c->head_dim_v);
  return c->mask == SDPA_MASK_CAUSAL_TOP_LEFT || c->mask == SDPA_MASK_CAUSAL_BOTTOM_RIGHT
             ? flops / 2 : flops;
}

static hcase *add_case(const char *name, sdpa_dtype dtype, sdpa_layout layout, sdpa_mask mask,
                       int batch, int hq, int hkv, int sq, int skv, int hd) {
  if (case_count == MAX_CASES) return NULL;
  hcase *c = &cases[case_count++];
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  c->dtype = dtype;
  c->layout = layout;
  c->mask = mask;
  c->batch = batch;
  c->heads_q = hq;
  c->heads_kv = hkv;
  c->seqlen_q = sq;
  c->seqlen_kv = skv;
  c->head_dim = c->head_dim_v = hd;
  c->window_left = c->window_right = -1;
  return c;
}

/* THD lengths (0 allowed); seqlen_q/kv become the longest (max_s). */
static void set_lens(hcase *c, int n, const int *lq, const int *lkv) {
  c->batch = n;
  c->seqlen_q = c->seqlen_kv = 1;
  for (int b = 0; b < n; b++) {
    c->lens_q[b] = lq[b];
    c->lens_kv[b] = lkv[b];
    if (lq[b] > c->seqlen_q) c->seqlen_q = lq[b];
    if (lkv[b] > c->seqlen_kv) c->seqlen_kv = lkv[b];
  }
}

/* --------------------------------------------------------- device problem */

/* Where a problem lives on the device, and its element strides. */
typedef struct dev_problem {
  CUdeviceptr q, k, v, o, dout, dq, dk, dv, lse, cu_q, cu_kv;
  sdpa_strides strides[8]; /* q, k, v, o, dout, dq, dk, dv */
  sdpa_lse_strides lse_strides;
  int64_t total_q, total_kv; /* THD token totals */
} dev_problem;

/* One map: BSHD rank 4 {cols, seqlen, heads, batch}, THD rank 3 {cols,
 * tokens, heads}; box {64, rows, 1, 1}; 128-byte swizzle (see
 * sdpa_tensor_maps.h). */
static CUresult encode_map(sdpa_tensor_map *out, const hcase *c, CUdeviceptr base, int cols,
                           int64_t rows, int heads, const sdpa_strides *s, int box_rows) {
  CUtensorMap map;
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4] = {SDPA_HOPPER_BOX_COLS, (cuuint32_t)box_rows, 1, 1}, estr[4] = {1, 1, 1, 1};
  cuuint32_t rank;
  if (c->layout == SDPA_LAYOUT_THD) {
    rank = 3;
    dims[0] = (cuuint64_t)cols;
    dims[1] = (cuuint64_t)(rows > 0 ? rows : 1);
    dims[2] = (cuuint64_t)heads;
    strides[0] = (cuuint64_t)s->seq * 2;
    strides[1] = (cuuint64_t)s->head * 2;
  } else {
    rank = 4;
    dims[0] = (cuuint64_t)cols;
    dims[1] = (cuuint64_t)rows;
    dims[2] = (cuuint64_t)heads;
    dims[3] = (cuuint64_t)c->batch;
    strides[0] = (cuuint64_t)s->seq * 2;
    strides[1] = (cuuint64_t)s->head * 2;
    strides[2] = c->batch > 1 ? (cuuint64_t)s->batch * 2 : (cuuint64_t)s->seq * 2 * (cuuint64_t)rows;
  }
  CUresult rc = gpu.drv->cuTensorMapEncodeTiled(
      &map, c->dtype == SDPA_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      rank, (void *)(uintptr_t)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  memcpy(out, &map, sizeof map);
  return rc;
}

/* The family's launch: parameter block, workspace carve, tensor maps. */
typedef struct hlaunch {
  sdpa_kernel_params p;
  sdpa_tensor_maps maps;
  CUdeviceptr workspace, error_flag;
  size_t workspace_bytes;
  unsigned main_x, main_y, pre_x, convert_x;
  int smem;
} hlaunch;

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* Fills the launch for case c on problem d (as plan.c and execute.c fill
 * theirs, with this family's tiles). */
static sdpa_status launch_make(const hcase *c, const dev_problem *d, hlaunch *L) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  const sdpa_hopper_config cfg = sdpa_hopper_choose(c->head_dim, c->head_dim_v, 0);
  sdpa_kernel_params *p = &L->p;
  memset(L, 0, sizeof *L);
  const int thd = c->layout == SDPA_LAYOUT_THD;
  p->q = (const void *)(uintptr_t)d->q;
  p->k = (const void *)(uintptr_t)d->k;
  p->v = (const void *)(uintptr_t)d->v;
  p->o = (const void *)(uintptr_t)d->o;
  p->dout = (const void *)(uintptr_t)d->dout;
  p->lse = (const float *)(uintptr_t)d->lse;
  p->dq = (void *)(uintptr_t)d->dq;
  p->dk = (void *)(uintptr_t)d->dk;
  p->dv = (void *)(uintptr_t)d->dv;
  p->cu_seqlens_q = (const sdpa_i32 *)(uintptr_t)d->cu_q;
  p->cu_seqlens_kv = (const sdpa_i32 *)(uintptr_t)d->cu_kv;
#define STRIDES(dst, i)                                                                          \
  p->dst##_batch = d->strides[i].batch;                                                          \
  p->dst##_seq = d->strides[i].seq;                                                              \
  p->dst##_head = d->strides[i].head;
  STRIDES(q, 0) STRIDES(k, 1) STRIDES(v, 2) STRIDES(o, 3) STRIDES(do, 4) STRIDES(dq, 5)
  STRIDES(dk, 6) STRIDES(dv, 7)
#undef STRIDES
  p->lse_batch = d->lse_strides.batch;
  p->lse_head = d->lse_strides.head;
  p->lse_seq = d->lse_strides.seq;
  p->rows_q = thd ? d->total_q : (int64_t)c->batch * c->seqlen_q;
  p->rows_kv = thd ? d->total_kv : (int64_t)c->batch * c->seqlen_kv;
  p->batch = c->batch;
  p->heads_q = c->heads_q;
  p->heads_kv = c->heads_kv;
  p->group = c->heads_q / c->heads_kv;
  p->seqlen_q = c->seqlen_q;
  p->seqlen_kv = c->seqlen_kv;
  p->q_tiles = (c->seqlen_q + cfg.q_tile - 1) / cfg.q_tile;
  p->q_blocks = (c->seqlen_q + 15) / 16;
  p->dq_blocks = thd ? p->rows_q / 16 + c->batch + 1 : (int64_t)c->batch * p->q_blocks;
  p->window_left = c->mask == SDPA_MASK_SLIDING_WINDOW ? c->window_left : -1;
  p->window_right = c->mask == SDPA_MASK_SLIDING_WINDOW ? c->window_right : -1;
  const int64_t kv_tiles = (c->seqlen_kv + cfg.kv_tile - 1) / cfg.kv_tile;
  const int64_t pairs = (int64_t)c->batch * c->heads_kv;
  int64_t group = order_group_given > 0 ? order_group_given : (256 + kv_tiles - 1) / kv_tiles;
  p->order_group = (int)(group < pairs ? group : pairs);
  p->scale = (float)(1.0 / sqrt((double)c->head_dim));
  p->scale_log2 = p->scale * (float)LOG2E;

  const size_t dq_bytes = (size_t)p->dq_blocks * 16 * c->heads_q * c->head_dim * 4;
  const size_t delta_bytes = (size_t)(p->rows_q > 0 ? p->rows_q : 1) * c->heads_q * 4;
  const size_t counter_bytes =
      fold_defined() ? (size_t)c->heads_q * c->batch * (p->q_tiles > 0 ? p->q_tiles : 1) * 4 : 0;
  const size_t order_bytes =
      longest_first && sdpa_hopper_longest_first((int)c->layout, (int)c->mask, 0, fold_defined(),
                                                c->batch)
          ? (size_t)c->batch * 4
          : 0;
  /* the regions in order, each 256-aligned: dq_accum, delta, counters, order */
  const size_t at_delta = align256(dq_bytes), at_counters = at_delta + align256(delta_bytes),
               at_order = at_counters + align256(counter_bytes);
  L->workspace_bytes = at_order + align256(order_bytes);
  if ((status = sdpa_gpu_alloc(&gpu, L->workspace_bytes, &L->workspace)) ||
      (status = sdpa_gpu_alloc(&gpu, 256, &L->error_flag)))
    return status;
  p->dq_accum = (float *)(uintptr_t)L->workspace;
  p->delta = (float *)(uintptr_t)(L->workspace + at_delta);
  p->semaphores = counter_bytes ? (sdpa_i32 *)(uintptr_t)(L->workspace + at_counters) : NULL;
  p->seq_order = order_bytes ? (sdpa_i32 *)(uintptr_t)(L->workspace + at_order) : NULL;
  p->error_flag = (sdpa_i32 *)(uintptr_t)L->error_flag;
  if ((status = sdpa_gpu_upload(&gpu, L->error_flag, &(int32_t){0}, 4))) return status;

  const int64_t rows_q = thd ? d->total_q : c->seqlen_q;
  const int64_t rows_kv = thd ? d->total_kv : c->seqlen_kv;
  CUresult rc;
  if ((rc = encode_map(&L->maps.q, c, d->q, c->head_dim, rows_q, c->heads_q, &d->strides[0],
                       cfg.q_tile)) ||
      (rc = encode_map(&L->maps.k, c, d->k, c->head_dim, rows_kv, c->heads_kv, &d->strides[1],
                       cfg.kv_tile)) ||
      (rc = encode_map(&L->maps.v, c, d->v, c->head_dim_v, rows_kv, c->heads_kv, &d->strides[2],
                       cfg.kv_tile)) ||
      (rc = encode_map(&L->maps.dout, c, d->dout, c->head_dim_v, rows_q, c->heads_q,
                       &d->strides[4], cfg.q_tile)))
    return sdpa_driver_error(gpu.drv, rc, "cuTensorMapEncodeTiled");

  L->pre_x = (unsigned)sdpa_aux_blocks(p->rows_q * c->heads_q, c->head_dim_v);
  if (L->pre_x == 0) L->pre_x = 1;
  L->main_x = (unsigned)sdpa_hopper_grid_x(cfg, c->seqlen_kv, c->batch);
  L->main_y = (unsigned)c->heads_kv;
  const int persist = persist_defined(cfg.head_dim, (int)c->layout, (int)c->mask);
  const long long blocks =
      persist ? sdpa_hopper_persistent_blocks((long long)L->main_x * L->main_y,
                                              blocks_given > 0 ? blocks_given : gpu.sm_count)
              : 0;
  if (blocks > 0) {
    L->main_x = (unsigned)blocks;
    L->main_y = 1;
  }
  L->convert_x = fold_defined() ? 0 : (unsigned)((int64_t)p->q_blocks * c->batch * c->heads_q);
  L->smem =
      sdpa_hopper_smem_layout_variant(with_variants(cfg), dq_bulk_defined(cfg.head_dim), 1, persist)
          .total +
      sdpa_hopper_fold_bytes(with_variants(cfg), fold_defined());
  return status;
}

static void launch_free(hlaunch *L) {
  sdpa_gpu_free(&gpu, L->workspace);
  sdpa_gpu_free(&gpu, L->error_flag);
  L->workspace = L->error_flag = 0;
}

/* preprocess → main → convert on the harness's stream. */
static sdpa_status launch_run(const hmodule *m, hlaunch *L) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  const sdpa_driver *drv = gpu.drv;
  void *one[] = {&L->p};
  void *two[] = {&L->p, &L->maps};
  SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->pre, L->pre_x, 1, 1, AUX_THREADS, 1, 1, 0, gpu.stream,
                                         one, NULL),
                "launching sdpa_bwd_preprocess");
  if (L->main_x > 0)
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->main, L->main_x, L->main_y, 1,
                                           32 * SDPA_HOPPER_WARPS, 1, 1, (unsigned)L->smem,
                                           gpu.stream, two, NULL),
                  "launching sdpa_bwd_main (sm_90a)");
  if (L->convert_x > 0)
    SDPA_CU_CHECK(drv, drv->cuLaunchKernel(m->convert, L->convert_x, 1, 1, AUX_THREADS, 1, 1, 0,
                                           gpu.stream, one, NULL),
                  "launching sdpa_bwd_convert_dq");
done:
  return status;
}

/* Synchronizes and reads the device error word. */
static sdpa_status launch_finish(hlaunch *L) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int32_t flag = 0;
  SDPA_CU_CHECK(gpu.drv, gpu.drv->cuStreamSynchronize(gpu.stream), "synchronizing (sm_90a)");
  if ((status = sdpa_gpu_download(&gpu, &flag, L->error_flag, 4))) goto done;
  if (flag) status = sdpa_error_set(SDPA_STATUS_DEVICE_ERROR, "device error flag %d", flag);
done:
  return status;
}

/* ----------------------------------------------------------------- check */

static double tolerance(sdpa_dtype dtype) { return dtype == SDPA_DTYPE_BF16 ? 1e-2 : 2e-3; }

static uint64_t base_seed;

/* A check problem of case c (small: the float64 reference runs on it). */
static int check_problem(const hcase *c, sdpa_ref_problem *p, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->dtype = c->dtype;
  p->layout = c->layout;
  p->batch = c->batch;
  p->heads_q = c->heads_q;
  p->heads_kv = c->heads_kv;
  p->head_dim = c->head_dim;
  p->head_dim_v = c->head_dim_v;
  p->mask = c->mask;
  p->window_left = c->window_left;
  p->window_right = c->window_right;
  if (c->layout == SDPA_LAYOUT_THD) {
    p->seqlen_q = c->seqlen_q;
    p->seqlen_kv = c->seqlen_kv;
  } else {
    p->seqlen_q = c->seqlen_q;
    p->seqlen_kv = c->seqlen_kv;
  }
  if (sdpa_ref_problem_alloc(p, c->layout == SDPA_LAYOUT_THD ? c->lens_q : NULL,
                             c->layout == SDPA_LAYOUT_THD ? c->lens_kv : NULL))
    return -1;
  sdpa_ref_problem_fill(p, seed, 0);
  return 0;
}

static void errors_of(const sdpa_ref_problem *p, const sdpa_gpu_grads *g, const sdpa_ref_grads *r,
                      double err[3], size_t *bad) {
  const size_t nq = sdpa_ref_elements(p, SDPA_REF_DQ), nk = sdpa_ref_elements(p, SDPA_REF_DK),
               nv = sdpa_ref_elements(p, SDPA_REF_DV);
  err[0] = sdpa_ref_rel_error(g->dq, r->dq, nq);
  err[1] = sdpa_ref_rel_error(g->dk, r->dk, nk);
  err[2] = sdpa_ref_rel_error(g->dv, r->dv, nv);
  *bad = sdpa_ref_count_nonfinite(g->dq, nq) + sdpa_ref_count_nonfinite(g->dk, nk) +
         sdpa_ref_count_nonfinite(g->dv, nv);
}

/* Where |x - ref| is largest in a [row][head][dim] tensor, as text. */
static void worst_element(const float *x, const double *ref, size_t n, int heads, int dim,
                          char *out, size_t size) {
  size_t at = 0;
  double worst = -1;
  for (size_t i = 0; i < n; i++) {
    const double e = isfinite(x[i]) ? fabs(x[i] - ref[i]) : INFINITY;
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  if (n == 0) {
    snprintf(out, size, "(empty)");
    return;
  }
  snprintf(out, size, "row %zu head %zu d %zu: %.4g vs %.4g", at / ((size_t)heads * dim),
           at / dim % heads, at % dim, (double)x[at], ref[at]);
}

static double max3(const double x[3]) {
  double m = x[0] > x[1] ? x[0] : x[1];
  return m > x[2] ? m : x[2];
}

/* Runs case c's check problem through both families; fills err,
 * mma_err; returns 1 when it passed. */
static int run_check(hcase *c, const hcase *as) {
  sdpa_ref_problem p;
  sdpa_ref_layout l;
  sdpa_bwd_desc desc;
  sdpa_ref_grads ref = {0};
  sdpa_gpu_outcome mma;
  sdpa_gpu_problem d;
  sdpa_gpu_grads g;
  hlaunch L;
  int uploaded = 0, passed = 0;
  size_t bad_mma = 0, bad = 0;
  memset(&mma, 0, sizeof mma);
  memset(&g, 0, sizeof g);
  memset(&L, 0, sizeof L);
  const uint64_t seed = base_seed + (uint64_t)(c - cases) * 7919u;
  if (check_problem(as, &p, seed)) {
    snprintf(c->message, sizeof c->message, "check problem: bad shape or out of memory");
    return 0;
  }
  sdpa_ref_layout_make(&l, &p, SDPA_REF_STYLE_PACKED,
                       as->lse_strided ? SDPA_REF_LSE_TOKEN_MAJOR : SDPA_REF_LSE_PACKED);
  sdpa_ref_desc(&p, &l, &desc);
  if (p.layout == SDPA_LAYOUT_THD) {
    desc.max_total_q = p.rows_q > 0 ? p.rows_q : 1;
    desc.max_total_kv = p.rows_kv > 0 ? p.rows_kv : 1;
  }
  if (sdpa_ref_backward(&p, &ref, 0)) {
    snprintf(c->message, sizeof c->message, "reference: out of memory");
    goto done;
  }
  /* the mma.sync family, through the public API */
  sdpa_gpu_run_problem(&gpu, runtime, &p, &l, &desc, &mma);
  if (mma.status != SDPA_STATUS_SUCCESS) {
    snprintf(c->message, sizeof c->message, "mma family: %.400s", mma.message);
    goto done;
  }
  errors_of(&p, &mma.grads, &ref, c->mma_err, &bad_mma);

  /* this family */
  hkey key = case_key(as);
  hmodule *m = module_for(&key);
  if (!m) {
    snprintf(c->message, sizeof c->message, "sm_90a compile failed");
    goto done;
  }
  sdpa_status st = sdpa_gpu_problem_upload(&gpu, &p, &l, &d);
  if (st) {
    snprintf(c->message, sizeof c->message, "upload: %s", sdpa_last_error());
    goto done;
  }
  uploaded = 1;
  dev_problem dp;
  memset(&dp, 0, sizeof dp);
  const sdpa_bwd_tensors *t = &d.tensors;
  dp.q = (CUdeviceptr)(uintptr_t)t->q;
  dp.k = (CUdeviceptr)(uintptr_t)t->k;
  dp.v = (CUdeviceptr)(uintptr_t)t->v;
  dp.o = (CUdeviceptr)(uintptr_t)t->o;
  dp.dout = (CUdeviceptr)(uintptr_t)t->dout;
  dp.dq = (CUdeviceptr)(uintptr_t)t->dq;
  dp.dk = (CUdeviceptr)(uintptr_t)t->dk;
  dp.dv = (CUdeviceptr)(uintptr_t)t->dv;
  dp.lse = (CUdeviceptr)(uintptr_t)t->lse;
  dp.cu_q = (CUdeviceptr)(uintptr_t)t->cu_seqlens_q;
  dp.cu_kv = (CUdeviceptr)(uintptr_t)t->cu_seqlens_kv;
  for (int i = 0; i < 8; i++) dp.strides[i] = l.place[i].strides;
  dp.lse_strides = l.lse_actual;
  dp.total_q = p.rows_q;
  dp.total_kv = p.rows_kv;
  if ((st = launch_make(as, &dp, &L)) || (st = sdpa_gpu_problem_poison_outputs(&gpu, &d)) ||
      (st = sdpa_gpu_poison(&gpu, L.workspace, L.workspace_bytes))) {
    snprintf(c->message, sizeof c->message, "launch setup: %s", sdpa_last_error());
    goto done;
  }
  gpu.drv->cuCtxSynchronize();
  if ((st = launch_run(m, &L)) || (st = launch_finish(&L))) {
    snprintf(c->message, sizeof c->message, "sm_90a run: %s: %s", sdpa_status_name(st),
             sdpa_last_error());
    goto done;
  }
  if ((st = sdpa_gpu_problem_download(&gpu, &p, &d, &g))) {
    snprintf(c->message, sizeof c->message, "download: %s", sdpa_last_error());
    goto done;
  }
  errors_of(&p, &g, &ref, c->err, &bad);
  const double tol = tolerance(c->dtype);
  passed = bad == 0 && max3(c->err) <= tol && bad_mma == 0;
  for (int i = 0; i < 3; i++) passed = passed && c->err[i] <= 1.5 * c->mma_err[i] + 2e-4;
  passed = passed && g.padding_written == 0 && g.inputs_changed == 0;
  if (!passed)
    snprintf(c->message, sizeof c->message,
             "FAILED: err dq %.2e dk %.2e dv %.2e (mma %.2e %.2e %.2e, tol %.0e), %zu non-finite "
             "(mma %zu), padding written %lld, inputs changed %lld",
             c->err[0], c->err[1], c->err[2], c->mma_err[0], c->mma_err[1], c->mma_err[2], tol, bad,
             bad_mma, (long long)g.padding_written, (long long)g.inputs_changed);
  if (!passed) {
    char wq[160], wk[160], wv[160];
    worst_element(g.dq, ref.dq, sdpa_ref_elements(&p, SDPA_REF_DQ), p.heads_q, p.head_dim, wq,
                  sizeof wq);
    worst_element(g.dk, ref.dk, sdpa_ref_elements(&p, SDPA_REF_DK), p.heads_kv, p.head_dim, wk,
                  sizeof wk);
    worst_element(g.dv, ref.dv, sdpa_ref_elements(&p, SDPA_REF_DV), p.heads_kv, p.head_dim_v,
                  wv, sizeof wv);
    printf("  worst: dq %s; dk %s; dv %s\n", wq, wk, wv);
  }
done:
  launch_free(&L);
  sdpa_gpu_grads_free(&g);
  if (uploaded) sdpa_gpu_problem_free(&gpu, &d);
  sdpa_gpu_outcome_free(&mma);
  sdpa_ref_grads_free(&ref);
  sdpa_ref_problem_free(&p);
  return passed;
}

/* ----------------------------------------------------------------- timed */

/* A pool of N(0,1) values in the dtype; tensors are tiled from it. */
#define POOL (1 << 20)
static uint16_t *pools[3];

static sdpa_status upload_random(CUdeviceptr dst, size_t elements, size_t salt, sdpa_dtype dtype) {
  const size_t chunk = (size_t)1 << 24;
  uint16_t *host = malloc(chunk * sizeof *host);
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!host) return SDPA_STATUS_OUT_OF_MEMORY;
  for (size_t at = 0; at < elements && !status; at += chunk) {
    const size_t n = elements - at < chunk ? elements - at : chunk;
    for (size_t i = 0; i < n; i++) host[i] = pools[dtype][(at + i + salt * 7919u) % (POOL - 1)];
    status = sdpa_gpu_upload(&gpu, dst + at * 2, host, n * 2);
  }
  free(host);
  return status;
}

/* Packed LSE [b,h,s] / [h,t] consistent with N(0,1) inputs at scale
 * 1/sqrt(D): log(visible keys) + 0.5. */
static sdpa_status upload_lse(const hcase *c, CUdeviceptr dst, int64_t rows) {
  float *host = malloc((size_t)rows * c->heads_q * sizeof *host);
  if (!host) return SDPA_STATUS_OUT_OF_MEMORY;
  const int causal = c->mask == SDPA_MASK_CAUSAL_TOP_LEFT || c->mask == SDPA_MASK_CAUSAL_BOTTOM_RIGHT;
  for (int h = 0; h < c->heads_q; h++)
    for (int64_t r = 0; r < rows; r++) {
      int64_t i = r, len = c->seqlen_kv, start = 0;
      int b = 0;
      if (c->layout == SDPA_LAYOUT_THD) {
        while (b < c->batch - 1 && r >= start + c->lens_q[b]) start += c->lens_q[b++];
        i = r - start;
        len = c->lens_kv[b];
      } else {
        b = (int)(r / c->seqlen_q);
        i = r % c->seqlen_q;
      }
      const int64_t visible = causal ? (i + 1 < len ? i + 1 : len) : len;
      const size_t at = c->layout == SDPA_LAYOUT_THD
                            ? (size_t)h * rows + (size_t)r
                            : ((size_t)b * c->heads_q + h) * c->seqlen_q + (size_t)i;
      host[at] = (float)(log((double)(visible > 0 ? visible : 1)) + 0.5);
    }
  sdpa_status status = sdpa_gpu_upload(&gpu, dst, host, (size_t)rows * c->heads_q * 4);
  free(host);
  return status;
}

typedef struct tensor_set {
  dev_problem d;
  sdpa_bwd_tensors tensors;
} tensor_set;

static void set_free(tensor_set *s) {
  CUdeviceptr all[] = {s->d.q, s->d.k, s->d.v, s->d.o, s->d.dout, s->d.dq, s->d.dk, s->d.dv, s->d.lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sdpa_gpu_free(&gpu, all[i]);
}

/* One set of packed full-size tensors for case c (cu_seqlens shared). */
static sdpa_status set_make(const hcase *c, tensor_set *s, CUdeviceptr cu, int index) {
  const int thd = c->layout == SDPA_LAYOUT_THD;
  int64_t rows_q = (int64_t)c->batch * c->seqlen_q, rows_kv = (int64_t)c->batch * c->seqlen_kv;
  if (thd) {
    rows_q = rows_kv = 0;
    for (int b = 0; b < c->batch; b++) rows_q += c->lens_q[b], rows_kv += c->lens_kv[b];
  }
  /* Q, dQ and K, dK: head_dim columns; O, dO and V, dV: head_dim_v */
  const size_t nq = (size_t)rows_q * c->heads_q * c->head_dim;
  const size_t nk = (size_t)rows_kv * c->heads_kv * c->head_dim;
  const size_t no = (size_t)rows_q * c->heads_q * c->head_dim_v;
  const size_t nv = (size_t)rows_kv * c->heads_kv * c->head_dim_v;
  sdpa_status st;
  memset(s, 0, sizeof *s);
  dev_problem *d = &s->d;
  if ((st = sdpa_gpu_alloc(&gpu, nq * 2, &d->q)) || (st = sdpa_gpu_alloc(&gpu, nk * 2, &d->k)) ||
      (st = sdpa_gpu_alloc(&gpu, nv * 2, &d->v)) || (st = sdpa_gpu_alloc(&gpu, no * 2, &d->o)) ||
      (st = sdpa_gpu_alloc(&gpu, no * 2, &d->dout)) || (st = sdpa_gpu_alloc(&gpu, nq * 2, &d->dq)) ||
      (st = sdpa_gpu_alloc(&gpu, nk * 2, &d->dk)) || (st = sdpa_gpu_alloc(&gpu, nv * 2, &d->dv)) ||
      (st = sdpa_gpu_alloc(&gpu, (size_t)rows_q * c->heads_q * 4, &d->lse)))
    return st;
  const size_t salt = (size_t)index * 5;
  if ((st = upload_random(d->q, nq, salt, c->dtype)) ||
      (st = upload_random(d->k, nk, salt + 1, c->dtype)) ||
      (st = upload_random(d->v, nv, salt + 2, c->dtype)) ||
      (st = upload_random(d->o, no, salt + 3, c->dtype)) ||
      (st = upload_random(d->dout, no, salt + 4, c->dtype)) || (st = upload_lse(c, d->lse, rows_q)))
    return st;
  for (int i = 0; i < 8; i++) { /* q k v o dout dq dk dv */
    const int kv = i == 1 || i == 2 || i == 6 || i == 7;
    const int64_t hd = i == 2 || i == 3 || i == 4 || i == 7 ? c->head_dim_v : c->head_dim;
    const int64_t heads = kv ? c->heads_kv : c->heads_q, seqlen = kv ? c->seqlen_kv : c->seqlen_q;
    d->strides[i].head = memory_bhsd && !thd ? seqlen * hd : hd;
    d->strides[i].seq = memory_bhsd && !thd ? hd : heads * hd;
    d->strides[i].batch = thd ? 0 : seqlen * heads * hd;
  }
  d->lse_strides.seq = 1;
  d->lse_strides.head = thd ? rows_q : c->seqlen_q;
  d->lse_strides.batch = thd ? 0 : (int64_t)c->heads_q * c->seqlen_q;
  d->cu_q = d->cu_kv = 0;
  if (thd) {
    d->cu_q = cu;
    d->cu_kv = cu + (MAX_SEQS + 1) * 4;
  }
  d->total_q = rows_q;
  d->total_kv = rows_kv;
  sdpa_bwd_tensors *t = &s->tensors;
  memset(t, 0, sizeof *t);
  t->version = SDPA_BWD_TENSORS_VERSION;
  t->q = (const void *)(uintptr_t)d->q;
  t->k = (const void *)(uintptr_t)d->k;
  t->v = (const void *)(uintptr_t)d->v;
  t->o = (const void *)(uintptr_t)d->o;
  t->dout = (const void *)(uintptr_t)d->dout;
  t->lse = (const float *)(uintptr_t)d->lse;
  t->dq = (void *)(uintptr_t)d->dq;
  t->dk = (void *)(uintptr_t)d->dk;
  t->dv = (void *)(uintptr_t)d->dv;
  if (thd) {
    t->cu_seqlens_q = (const int32_t *)(uintptr_t)d->cu_q;
    t->cu_seqlens_kv = (const int32_t *)(uintptr_t)d->cu_kv;
    t->total_q = rows_q;
    t->total_kv = rows_kv;
  }
  return SDPA_STATUS_SUCCESS;
}

/* ‖a − b‖ / ‖b‖ over n 16-bit values; NaN if any is not finite. */
static double rel_diff(const uint16_t *a, const uint16_t *b, size_t n, sdpa_dtype dtype) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    const double x = sdpa_ref_from_bits(a[i], dtype), y = sdpa_ref_from_bits(b[i], dtype);
    if (!isfinite(x) || !isfinite(y)) return NAN;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static sdpa_status download_outputs(const tensor_set *s, uint16_t *out[3], size_t nq, size_t nk,
                                    size_t nv) {
  sdpa_status st;
  if ((st = sdpa_gpu_download(&gpu, out[0], s->d.dq, nq * 2)) ||
      (st = sdpa_gpu_download(&gpu, out[1], s->d.dk, nk * 2)) ||
      (st = sdpa_gpu_download(&gpu, out[2], s->d.dv, nv * 2)))
    return st;
  return SDPA_STATUS_SUCCESS;
}

/* Median event time (ms) of `runs` calls of one family. */
typedef sdpa_status (*run_fn)(void *ctx, int set);

static sdpa_status time_runs(run_fn fn, void *ctx, int runs, double *median_ms) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  const sdpa_driver *drv = gpu.drv;
  CUevent *events = calloc((size_t)runs * 2, sizeof *events);
  double *ms = calloc((size_t)runs, sizeof *ms);
  int created = 0;
  if (!events || !ms) {
    status = SDPA_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  for (int i = 0; i < WARMUP; i++)
    if ((status = fn(ctx, i % SETS))) goto done;
  for (; created < 2 * runs; created++)
    SDPA_CU_CHECK(drv, drv->cuEventCreate(&events[created], CU_EVENT_DEFAULT), "cuEventCreate");
  for (int r = 0; r < runs; r++) {
    SDPA_CU_CHECK(drv, drv->cuEventRecord(events[2 * r], gpu.stream), "cuEventRecord");
    if ((status = fn(ctx, r % SETS))) goto done;
    SDPA_CU_CHECK(drv, drv->cuEventRecord(events[2 * r + 1], gpu.stream), "cuEventRecord");
  }
  SDPA_CU_CHECK(drv, drv->cuStreamSynchronize(gpu.stream), "synchronizing the timed runs");
  for (int r = 0; r < runs; r++) {
    float e = 0;
    SDPA_CU_CHECK(drv, drv->cuEventElapsedTime(&e, events[2 * r], events[2 * r + 1]),
                  "cuEventElapsedTime");
    ms[r] = e;
  }
  qsort(ms, (size_t)runs, sizeof *ms, compare_double);
  *median_ms = runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
done:
  for (int i = 0; i < created; i++) drv->cuEventDestroy(events[i]);
  free(events);
  free(ms);
  return status;
}

typedef struct mma_ctx {
  sdpa_bwd_plan *plan;
  tensor_set *sets;
  CUdeviceptr workspace;
  size_t workspace_bytes;
} mma_ctx;

static sdpa_status mma_once(void *arg, int set) {
  mma_ctx *x = arg;
  return sdpa_bwd_execute(x->plan, &x->sets[set].tensors, (void *)(uintptr_t)x->workspace,
                          x->workspace_bytes, gpu.stream);
}

typedef struct hop_ctx {
  const hmodule *m;
  hlaunch launches[SETS];
} hop_ctx;

static sdpa_status hop_once(void *arg, int set) {
  hop_ctx *x = arg;
  return launch_run(x->m, &x->launches[set]);
}

/* --trace: one more run of the sm_90a chain with the stamps cleared, then
 * the stamps of its blocks (up to TRACE_BLOCKS) written to
 * trace_dir/<case name, spaces as '_'>.csv. */
static sdpa_status write_trace(const hcase *c, hop_ctx *hx) {
  const sdpa_driver *drv = gpu.drv;
  CUdeviceptr g = 0;
  size_t bytes = 0;
  if (!drv->cuModuleGetGlobal ||
      drv->cuModuleGetGlobal(&g, &bytes, hx->m->module, "sdpa_hopper_trace") != CUDA_SUCCESS ||
      bytes != (size_t)TRACE_BLOCKS * TRACE_SLOTS * 8)
    return sdpa_error_set(SDPA_STATUS_INTERNAL, "--trace: the module has no sdpa_hopper_trace of %d blocks",
                          TRACE_BLOCKS);
  if (drv->cuMemsetD8(g, 0, bytes) != CUDA_SUCCESS)
    return sdpa_error_set(SDPA_STATUS_DRIVER_ERROR, "--trace: clearing the stamps");
  sdpa_status st = hop_once(hx, 0);
  if (st || (st = launch_finish(&hx->launches[0]))) return st;
  unsigned long long *t = malloc(bytes);
  if (!t) return SDPA_STATUS_OUT_OF_MEMORY;
  if (drv->cuMemcpyDtoH(t, g, bytes) != CUDA_SUCCESS) {
    free(t);
    return sdpa_error_set(SDPA_STATUS_DRIVER_ERROR, "--trace: reading the stamps");
  }
  char path[1024];
  int n = snprintf(path, sizeof path, "%s/", trace_dir);
  for (const char *q = c->name; *q && n < (int)sizeof path - 5; q++)
    path[n++] = *q == ' ' || *q == '/' ? '_' : *q;
  snprintf(path + n, sizeof path - n, ".csv");
  FILE *f = fopen(path, "w");
  if (!f) {
    free(t);
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "--trace: cannot write %s", path);
  }
  fprintf(f, "block,gt_entry,smid,steps,clk_entry,clk_kv,clk_loop,clk_bulk,clk_store,clk_producer,"
             "clk_store1,gt_end\n");
  for (int b = 0; b < TRACE_BLOCKS; b++) {
    const unsigned long long *r = t + (size_t)b * TRACE_SLOTS;
    if (!r[0]) continue; /* past the grid */
    fprintf(f, "%d,%llu,%llu,%lld,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", b, r[0], r[1] >> 32,
            (long long)(r[1] & 0xffffffffu) - 1, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]);
  }
  fclose(f);
  free(t);
  return SDPA_STATUS_SUCCESS;
}

/* Times case c at full size through both families and compares their
 * outputs on the same data. */
static int run_timed(hcase *c, int runs) {
  tensor_set sets[SETS];
  int made = 0, passed = 0;
  CUdeviceptr cu = 0;
  mma_ctx mx = {NULL, sets, 0, 0};
  hop_ctx hx;
  memset(&hx, 0, sizeof hx);
  uint16_t *outs[2][3] = {{NULL}};
  sdpa_status st;
  const int thd = c->layout == SDPA_LAYOUT_THD;
  hkey key = case_key(c);
  hx.m = module_for(&key);
  if (!hx.m) {
    snprintf(c->message, sizeof c->message, "sm_90a compile failed");
    return 0;
  }
  if (thd) {
    int32_t offsets[2][MAX_SEQS + 1];
    memset(offsets, 0, sizeof offsets);
    for (int b = 0; b < c->batch; b++) {
      offsets[0][b + 1] = offsets[0][b] + c->lens_q[b];
      offsets[1][b + 1] = offsets[1][b] + c->lens_kv[b];
    }
    if ((st = sdpa_gpu_alloc(&gpu, sizeof offsets, &cu)) ||
        (st = sdpa_gpu_upload(&gpu, cu, offsets, sizeof offsets)))
      goto fail;
  }
  for (; made < SETS; made++)
    if ((st = set_make(c, &sets[made], cu, made))) goto fail;

  sdpa_bwd_desc desc = SDPA_BWD_DESC_INIT;
  desc.dtype = c->dtype;
  desc.layout = c->layout;
  desc.batch = c->batch;
  desc.heads_q = c->heads_q;
  desc.heads_kv = c->heads_kv;
  desc.seqlen_q = c->seqlen_q;
  desc.seqlen_kv = c->seqlen_kv;
  desc.head_dim = c->head_dim;
  desc.head_dim_v = c->head_dim_v;
  desc.mask = c->mask;
  desc.window_left = c->window_left;
  desc.window_right = c->window_right;
  if (thd) {
    desc.max_total_q = sets[0].d.total_q;
    desc.max_total_kv = sets[0].d.total_kv;
  }
  if (memory_bhsd && !thd) { /* the mma family on the same memory */
    sdpa_strides *const to[8] = {&desc.q, &desc.k, &desc.v, &desc.o,
                                 &desc.dout, &desc.dq, &desc.dk, &desc.dv};
    for (int i = 0; i < 8; i++) *to[i] = sets[0].d.strides[i];
  }
  if ((st = sdpa_bwd_plan_create(&mx.plan, runtime, &desc)) ||
      (st = sdpa_bwd_compile(mx.plan, NULL)))
    goto fail;
  mx.workspace_bytes = sdpa_bwd_workspace_size(mx.plan);
  if ((st = sdpa_gpu_alloc(&gpu, mx.workspace_bytes, &mx.workspace))) goto fail;
  for (int s = 0; s < SETS; s++)
    if ((st = launch_make(c, &sets[s].d, &hx.launches[s]))) goto fail;

  /* same data, both families: set 0's outputs after one run each */
  const size_t nq = (size_t)sets[0].d.total_q * c->heads_q * c->head_dim;
  const size_t nk = (size_t)sets[0].d.total_kv * c->heads_kv * c->head_dim;
  const size_t nv = (size_t)sets[0].d.total_kv * c->heads_kv * c->head_dim_v;
  for (int f = 0; f < 2; f++)
    for (int i = 0; i < 3; i++)
      if (!(outs[f][i] = malloc((i == 0 ? nq : i == 1 ? nk : nv) * 2 + 2))) {
        st = SDPA_STATUS_OUT_OF_MEMORY;
        goto fail;
      }
  if ((st = sdpa_gpu_poison(&gpu, sets[0].d.dq, nq * 2)) ||
      (st = sdpa_gpu_poison(&gpu, sets[0].d.dk, nk * 2)) ||
      (st = sdpa_gpu_poison(&gpu, sets[0].d.dv, nv * 2)) || (st = mma_once(&mx, 0)) ||
      (st = sdpa_bwd_sync_check(mx.plan, gpu.stream)) ||
      (st = download_outputs(&sets[0], outs[0], nq, nk, nv)) ||
      (st = sdpa_gpu_poison(&gpu, sets[0].d.dq, nq * 2)) ||
      (st = sdpa_gpu_poison(&gpu, sets[0].d.dk, nk * 2)) ||
      (st = sdpa_gpu_poison(&gpu, sets[0].d.dv, nv * 2)) || (st = hop_once(&hx, 0)) ||
      (st = launch_finish(&hx.launches[0])) || (st = download_outputs(&sets[0], outs[1], nq, nk, nv)))
    goto fail;
  c->diff[0] = rel_diff(outs[1][0], outs[0][0], nq, c->dtype);
  c->diff[1] = rel_diff(outs[1][1], outs[0][1], nk, c->dtype);
  c->diff[2] = rel_diff(outs[1][2], outs[0][2], nv, c->dtype);

  if ((st = time_runs(mma_once, &mx, runs, &c->mma_ms)) ||
      (st = time_runs(hop_once, &hx, runs, &c->ms)) || (st = launch_finish(&hx.launches[0])) ||
      (trace_dir && (st = write_trace(c, &hx))))
    goto fail;
  c->tflops = case_flops(c) / (c->ms * 1e-3) / 1e12;
  c->mma_tflops = case_flops(c) / (c->mma_ms * 1e-3) / 1e12;
  passed = 1;
  for (int i = 0; i < 3; i++) passed = passed && isfinite(c->diff[i]) && c->diff[i] <= tolerance(c->dtype);
  if (!passed)
    snprintf(c->message, sizeof c->message, "FAILED: differs from the mma family: dq %.2e dk %.2e dv %.2e",
             c->diff[0], c->diff[1], c->diff[2]);
  goto done;
fail:
  snprintf(c->message, sizeof c->message, "FAILED: %s: %.400s", sdpa_status_name(st), sdpa_last_error());
done:
  for (int f = 0; f < 2; f++)
    for (int i = 0; i < 3; i++) free(outs[f][i]);
  for (int s = 0; s < SETS; s++) launch_free(&hx.launches[s]);
  sdpa_gpu_free(&gpu, mx.workspace);
  sdpa_bwd_plan_destroy(mx.plan);
  for (int i = 0; i < made; i++) set_free(&sets[i]);
  sdpa_gpu_free(&gpu, cu);
  return passed;
}

/* The small twin of a timed case: same key class, sizes the reference
 * can afford. */
static void twin_of(const hcase *c, hcase *t) {
  *t = *c;
  t->timed = 0;
  t->heads_q = c->heads_q == c->heads_kv ? 2 : c->heads_q / c->heads_kv;
  t->heads_kv = c->heads_q == c->heads_kv ? 2 : 1;
  if (c->layout == SDPA_LAYOUT_THD) {
    static const int lq[] = {300, 512, 37, 129};
    set_lens(t, 4, lq, lq);
    t->heads_q = t->heads_kv = 2;
  } else {
    const int even = case_even(c);
    t->batch = 1;
    t->seqlen_q = t->seqlen_kv = even ? 512 : 500;
  }
}

/* ------------------------------------------------------------ case lists */

static void standard_cases(int quick) {
  const sdpa_dtype B = SDPA_DTYPE_BF16, F = SDPA_DTYPE_FP16;
  const sdpa_layout S = SDPA_LAYOUT_BSHD, T = SDPA_LAYOUT_THD;
  hcase *c;
  /* checks */
  add_case("bf16 hd128 bshd none S512", B, S, SDPA_MASK_NONE, 2, 4, 4, 512, 512, 128);
  add_case("bf16 hd128 bshd causal_tl S512", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 512, 512, 128);
  add_case("bf16 hd64 bshd none S512", B, S, SDPA_MASK_NONE, 2, 4, 4, 512, 512, 64);
  add_case("bf16 hd64 bshd causal_tl S512", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 512, 512, 64);
  {
    static const int lq[] = {300, 0, 512, 37, 129, 1}, lkv[] = {300, 0, 512, 37, 129, 1};
    c = add_case("bf16 hd128 thd none mixed+empty", B, T, SDPA_MASK_NONE, 0, 4, 4, 0, 0, 128);
    set_lens(c, 6, lq, lkv);
  }
  if (!quick) {
    add_case("bf16 hd128 bshd causal_br 384/512", B, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 384, 512, 128);
    add_case("bf16 hd128 bshd none S500", B, S, SDPA_MASK_NONE, 2, 4, 4, 500, 500, 128);
    add_case("bf16 hd128 bshd causal_tl S500", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 500, 500, 128);
    add_case("bf16 hd128 bshd causal_br 333/517", B, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 333, 517, 128);
    add_case("bf16 hd128 bshd causal_br 517/333", B, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 517, 333, 128);
    add_case("bf16 hd64 bshd causal_tl S500", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 500, 500, 64);
    add_case("bf16 hd64 bshd causal_br 200/700", B, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 4, 200, 700, 64);
    add_case("fp16 hd128 bshd none S512", F, S, SDPA_MASK_NONE, 2, 4, 4, 512, 512, 128);
    add_case("fp16 hd128 bshd causal_tl S500", F, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 500, 500, 128);
    add_case("fp16 hd64 bshd causal_tl S512", F, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 4, 4, 512, 512, 64);
    add_case("fp16 hd64 bshd none S300", F, S, SDPA_MASK_NONE, 2, 4, 4, 300, 300, 64);
    add_case("bf16 hd128 gqa 8/2 causal_tl S384", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 1, 8, 2, 384, 384, 128);
    add_case("bf16 hd64 mqa 4/1 none S300", B, S, SDPA_MASK_NONE, 2, 4, 1, 300, 300, 64);
    add_case("bf16 hd128 gqa 8/2 none S300", B, S, SDPA_MASK_NONE, 1, 8, 2, 300, 300, 128);
    add_case("fp16 hd96 bshd none S300", F, S, SDPA_MASK_NONE, 2, 4, 4, 300, 300, 96);
    {
      static const int lq[] = {300, 0, 512, 37, 129, 1}, lkv[] = {300, 0, 512, 37, 129, 1};
      c = add_case("bf16 hd128 thd causal_tl mixed+empty", B, T, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 4, 4, 0, 0, 128);
      set_lens(c, 6, lq, lkv);
      c = add_case("bf16 hd64 thd none mixed+empty", B, T, SDPA_MASK_NONE, 0, 4, 4, 0, 0, 64);
      set_lens(c, 6, lq, lkv);
      c = add_case("fp16 hd64 thd causal_tl mixed+empty", F, T, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 4, 4, 0, 0, 64);
      set_lens(c, 6, lq, lkv);
    }
    {
      static const int lq[] = {100, 0, 257, 64, 0}, lkv[] = {300, 5, 128, 0, 7};
      c = add_case("bf16 hd128 thd causal_br q!=kv", B, T, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 0, 4, 2, 0, 0, 128);
      set_lens(c, 5, lq, lkv);
      c = add_case("bf16 hd64 thd none q!=kv gqa", B, T, SDPA_MASK_NONE, 0, 4, 2, 0, 0, 64);
      set_lens(c, 5, lq, lkv);
    }
    c = add_case("bf16 hd128 bshd window(64,32) S500", B, S, SDPA_MASK_SLIDING_WINDOW, 2, 4, 4, 500, 500, 128);
    c->window_left = 64, c->window_right = 32;
    c = add_case("bf16 hd64 bshd window(-1,0) 300/600", B, S, SDPA_MASK_SLIDING_WINDOW, 1, 4, 4, 300, 600, 64);
    c->window_left = -1, c->window_right = 0;
    c = add_case("bf16 hd128 bshd window(200,-1) S512", B, S, SDPA_MASK_SLIDING_WINDOW, 1, 4, 4, 512, 512, 128);
    c->window_left = 200, c->window_right = -1;
    {
      static const int lq[] = {300, 0, 512, 37, 129, 1}, lkv[] = {300, 0, 512, 37, 129, 1};
      c = add_case("bf16 hd64 thd window(100,0)", B, T, SDPA_MASK_SLIDING_WINDOW, 0, 4, 4, 0, 0, 64);
      set_lens(c, 6, lq, lkv);
      c->window_left = 100, c->window_right = 0;
      c = add_case("bf16 hd128 thd lse strided causal_tl", B, T, SDPA_MASK_CAUSAL_TOP_LEFT, 0, 4, 4, 0, 0, 128);
      set_lens(c, 6, lq, lkv);
      c->lse_strided = 1;
    }
    /* the wide kernel (head dims above 128) */
    add_case("bf16 hd256 bshd causal_tl S300", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 1, 2, 2, 300, 300, 256);
    add_case("fp16 hd192 bshd none S200", F, S, SDPA_MASK_NONE, 2, 2, 1, 200, 200, 192);
    /* above 192: dQ reduced from registers (an uneven split at 200:
     * 128 + 72 columns) */
    add_case("fp16 hd256 bshd none S500", F, S, SDPA_MASK_NONE, 2, 2, 2, 500, 500, 256);
    add_case("fp16 hd200 bshd causal_br 333/517", F, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 2, 1, 333, 517, 200);
    c = add_case("bf16 hd192/128 bshd causal_tl S500", B, S, SDPA_MASK_CAUSAL_TOP_LEFT, 2, 2, 1, 500, 500, 192);
    c->head_dim_v = 128;
    c = add_case("fp16 hd256/128 bshd none S300", F, S, SDPA_MASK_NONE, 1, 2, 2, 300, 300, 256);
    c->head_dim_v = 128;
    c = add_case("bf16 hd256 bshd window(64,32) S500", B, S, SDPA_MASK_SLIDING_WINDOW, 1, 2, 2, 500, 500, 256);
    c->window_left = 64, c->window_right = 32;
    {
      static const int lq[] = {300, 0, 512, 37, 129, 1}, lkv[] = {300, 0, 512, 37, 129, 1};
      c = add_case("bf16 hd248 thd none mixed+empty", B, T, SDPA_MASK_NONE, 0, 4, 2, 0, 0, 248);
      set_lens(c, 6, lq, lkv);
    }
    c = add_case("bf16 hd64 bshd lse strided none S512", B, S, SDPA_MASK_NONE, 2, 4, 4, 512, 512, 64);
    c->lse_strided = 1;
    c = add_case("bf16 hd128 bshd lse strided causal_br S500", B, S, SDPA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 500, 500, 128);
    c->lse_strided = 1;
  }
  /* timed: B*S = 16k tokens, H*D = 2048 */
  static const int lengths[] = {1024, 2048, 4096, 16384};
  for (int hi = 0; hi < 2; hi++) {
    const int hd = hi ? 128 : 64;
    for (int causal = 0; causal < 2; causal++)
      for (int si = 0; si < 4; si++) {
        const int s = lengths[si];
        if (quick && s != 4096) continue;
        char name[96];
        snprintf(name, sizeof name, "time bf16 hd%d bshd S%dk %s", hd, s / 1024, causal ? "causal" : "full");
        c = add_case(name, B, S, causal ? SDPA_MASK_CAUSAL_TOP_LEFT : SDPA_MASK_NONE, 16384 / s,
                     2048 / hd, 2048 / hd, s, s, hd);
        c->timed = 1;
      }
  }
  if (!quick) {
    /* the other timed problems, each full and causal (top-left); THD
     * with 8 sequences of mixed lengths (16k tokens) */
    static const int lens[] = {4096, 512, 3000, 1500, 2048, 777, 3333, 1118};
    static const struct {
      const char *name; /* " full" / " causal" appended */
      sdpa_dtype dtype;
      sdpa_layout layout;
      int batch, heads_q, heads_kv, seqlen, head_dim, head_dim_v;
    } more[] = {
        {"time fp16 hd128 bshd S4k", SDPA_DTYPE_FP16, SDPA_LAYOUT_BSHD, 4, 16, 16, 4096, 128, 128},
        {"time bf16 hd128 gqa64/8 S4k", SDPA_DTYPE_BF16, SDPA_LAYOUT_BSHD, 4, 64, 8, 4096, 128, 128},
        {"time bf16 hd128 thd mixed", SDPA_DTYPE_BF16, SDPA_LAYOUT_THD, 0, 16, 16, 0, 128, 128},
        {"time bf16 hd256 bshd S8k", SDPA_DTYPE_BF16, SDPA_LAYOUT_BSHD, 2, 8, 8, 8192, 256, 256},
        {"time bf16 hd192 bshd S8k", SDPA_DTYPE_BF16, SDPA_LAYOUT_BSHD, 2, 10, 10, 8192, 192, 192},
        {"time bf16 hd160 bshd S8k", SDPA_DTYPE_BF16, SDPA_LAYOUT_BSHD, 2, 12, 12, 8192, 160, 160},
        {"time bf16 hd192/128 bshd S8k", SDPA_DTYPE_BF16, SDPA_LAYOUT_BSHD, 2, 10, 10, 8192, 192, 128},
    };
    for (int causal = 0; causal < 2; causal++)
      for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s %s", more[i].name, causal ? "causal" : "full");
        c = add_case(name, more[i].dtype, more[i].layout,
                     causal ? SDPA_MASK_CAUSAL_TOP_LEFT : SDPA_MASK_NONE, more[i].batch,
                     more[i].heads_q, more[i].heads_kv, more[i].seqlen, more[i].seqlen,
                     more[i].head_dim);
        c->head_dim_v = more[i].head_dim_v;
        if (more[i].layout == SDPA_LAYOUT_THD) set_lens(c, 8, lens, lens);
        c->timed = 1;
      }
  }
}

/* Every key class the family compiles at the head dims given (--hd;
 * default 64 and 128), for --compile-only. */
static int compile_all_classes(const char *const *filters, int filter_count, const int (*dims)[2],
                               int dim_count) {
  static const int standard[2][2] = {{64, 64}, {128, 128}};
  if (dim_count == 0) {
    dims = standard;
    dim_count = 2;
  }
  int failures = 0;
  const double t0 = now_ms();
  double slowest = 0;
  for (int dt = 1; dt <= 2; dt++)
    for (int di = 0; di < dim_count; di++)
      for (int layout = 1; layout <= 2; layout++)
        for (int mask = 0; mask < 4; mask++)
          for (int even = 0; even <= (layout == 1); even++)
            for (int lse = 0; lse < 2; lse++) {
              hkey k = {(sdpa_dtype)dt, dims[di][0], dims[di][1], (sdpa_layout)layout,
                        (sdpa_mask)mask, lse, even};
              char name[128];
              key_name(&k, name, sizeof name);
              int selected = filter_count == 0;
              for (int f = 0; f < filter_count; f++) selected |= strstr(name, filters[f]) != NULL;
              if (!selected) continue;
              hmodule *m = module_for(&k);
              const hmodule *r = &modules[module_count - 1];
              failures += !m || r->spill_bytes || r->warnings;
              if (r->compile_ms > slowest) slowest = r->compile_ms;
            }
  printf("%d classes compiled in %.1f s (slowest %.0f ms), %d with a spill, warning or error\n",
         module_count, (now_ms() - t0) / 1e3, slowest, failures);
  if (module_count == 0) {
    printf("no key class matches the --case filters\n");
    return 1;
  }
  return failures;
}

static void usage(void) {
  printf("usage: bench_hopper [--compile-only [--hd D[/DV]]...] [--quick] [--checks|--timed]\n"
         "                    [--case SUBSTR]...\n"
         "                    [--no-twin] [--define NAME=VALUE]... [--runs N] [--seed N]\n"
         "                    [--blocks N]\n"
         "                    [--order-group N] [--longest-first] [--memory bshd|bhsd]\n"
         "                    [--cubin-dir DIR] [--trace DIR]\n");
}

int main(int argc, char **argv) {
  int compile_only = 0, quick = 0, only_checks = 0, only_timed = 0, runs = 20, twins = 1;
  const char *filters[16];
  int filter_count = 0, dims[16][2], dim_count = 0;
  base_seed = (uint64_t)time(NULL);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--compile-only")) compile_only = 1;
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--checks")) only_checks = 1;
    else if (!strcmp(argv[i], "--timed")) only_timed = 1;
    else if (!strcmp(argv[i], "--no-twin")) twins = 0;
    else if (!strcmp(argv[i], "--case") && i + 1 < argc && filter_count < 16) filters[filter_count++] = argv[++i];
    else if (!strcmp(argv[i], "--define") && i + 1 < argc && extra_define_count < MAX_DEFINES)
      extra_defines[extra_define_count++] = argv[++i];
    else if (!strcmp(argv[i], "--hd") && i + 1 < argc && dim_count < 16) {
      char *end;
      const char *text = argv[++i];
      const long d = strtol(text, &end, 10), dv = *end == '/' ? strtol(end + 1, &end, 10) : d;
      if (*end || d < 8 || d > 256 || d % 8 || dv < 8 || dv > d || dv % 8) {
        printf("--hd %s: expected D or D/DV, multiples of 8 with 8 <= DV <= D <= 256\n", text);
        return 2;
      }
      dims[dim_count][0] = (int)d;
      dims[dim_count++][1] = (int)dv;
    }
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--order-group") && i + 1 < argc) order_group_given = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--longest-first")) longest_first = 1;
    else if (!strcmp(argv[i], "--memory") && i + 1 < argc) memory_bhsd = !strcmp(argv[++i], "bhsd");
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) base_seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--cubin-dir") && i + 1 < argc) cubin_dir = argv[++i];
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks_given = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--trace") && i + 1 < argc && extra_define_count < MAX_DEFINES) {
      trace_dir = argv[++i];
      static char define[64];
      snprintf(define, sizeof define, "SDPA_HOPPER_TRACE=%d", TRACE_BLOCKS);
      extra_defines[extra_define_count++] = define;
    }
    else {
      usage();
      return !strcmp(argv[i], "--help") ? 0 : 2;
    }
  }
  if (runs < 5) runs = 5;
  for (int i = 0; i < extra_define_count; i++) printf("define %s\n", extra_defines[i]);
  if (compile_only)
    return compile_all_classes(filters, filter_count, (const int(*)[2])dims, dim_count) ? 1 : 0;

  /* the mma family for the comparison, whatever the default family is */
  setenv("SDPA_JIT_FAMILY", "mma", 0);
  sdpa_gpu_require(&gpu);
  have_gpu = 1;
  if (gpu.arch != 90) {
    printf("skipped: the sm_90a family needs an sm_90 GPU (this is sm_%d)\n", gpu.arch);
    return 77;
  }
  sdpa_runtime_options opts = SDPA_RUNTIME_OPTIONS_INIT;
  opts.disable_disk_cache = 1;
  sdpa_status st = sdpa_runtime_create(&runtime, &opts);
  if (st) {
    printf("sdpa_runtime_create: %s: %s\n", sdpa_status_name(st), sdpa_last_error());
    return 1;
  }
  pools[SDPA_DTYPE_FP16] = malloc(POOL * sizeof(uint16_t));
  pools[SDPA_DTYPE_BF16] = malloc(POOL * sizeof(uint16_t));
  if (!pools[SDPA_DTYPE_FP16] || !pools[SDPA_DTYPE_BF16]) return 1;
  sdpa_ref_rng rng;
  sdpa_ref_rng_seed(&rng, 1234);
  for (int i = 0; i < POOL; i++) {
    const float x = (float)sdpa_ref_rng_normal(&rng);
    pools[SDPA_DTYPE_FP16][i] = sdpa_ref_to_bits(x, SDPA_DTYPE_FP16);
    pools[SDPA_DTYPE_BF16][i] = sdpa_ref_to_bits(x, SDPA_DTYPE_BF16);
  }
  printf("device: %s (sm_%d, %d SMs); check seed %llu\n", gpu.name, gpu.arch, gpu.sm_count,
         (unsigned long long)base_seed);

  standard_cases(quick);
  pthread_t dog;
  if (!getenv("HOPPER_NO_WATCHDOG")) pthread_create(&dog, NULL, watchdog, NULL);
  int failures = 0, ran = 0;
  for (int i = 0; i < case_count; i++) {
    hcase *c = &cases[i];
    int selected = filter_count == 0;
    for (int f = 0; f < filter_count; f++) selected |= strstr(c->name, filters[f]) != NULL;
    if (!selected || (only_checks && c->timed) || (only_timed && !c->timed)) continue;
    c->ran = 1;
    ran++;
    watchdog_arm(c->name);
    if (c->timed) {
      hcase twin;
      twin_of(c, &twin);
      const int twin_ok = twins ? run_check(c, &twin) : 1;
      c->twin_ran = twins;
      double keep_err[3], keep_mma[3];
      memcpy(keep_err, c->err, sizeof keep_err);
      memcpy(keep_mma, c->mma_err, sizeof keep_mma);
      char twin_message[512];
      snprintf(twin_message, sizeof twin_message, "%s", c->message);
      const int timed_ok = run_timed(c, runs); /* timed even when the twin failed */
      c->passed = twin_ok && timed_ok;
      memcpy(c->err, keep_err, sizeof keep_err);
      memcpy(c->mma_err, keep_mma, sizeof keep_mma);
      if (!twin_ok) snprintf(c->message, sizeof c->message, "twin %.500s", twin_message);
      char errs[64] = "twin not checked";
      if (c->twin_ran)
        snprintf(errs, sizeof errs, "err %.1e (mma %.1e)", max3(c->err), max3(c->mma_err));
      printf("%-40s %s  diff %.1e  %7.1f vs %7.1f TFLOP/s  x%.2f  %s\n", c->name, errs,
             max3(c->diff), c->tflops, c->mma_tflops,
             c->mma_tflops > 0 ? c->tflops / c->mma_tflops : 0, c->passed ? "ok" : c->message);
    } else {
      c->passed = run_check(c, c);
      printf("%-40s err dq %.1e dk %.1e dv %.1e  (mma %.1e %.1e %.1e)  %s\n", c->name, c->err[0],
             c->err[1], c->err[2], c->mma_err[0], c->mma_err[1], c->mma_err[2],
             c->passed ? "ok" : c->message);
    }
    failures += !c->passed;
    fflush(stdout);
  }
  atomic_store(&watchdog_since, 0);

  printf("\nkeys (ptxas, sdpa_bwd_main):\n");
  for (int i = 0; i < module_count; i++) {
    char name[160];
    key_name(&modules[i].key, name, sizeof name);
    printf("  %-44s compile %6.0f ms  spill %d B  warnings %d%s\n", name, modules[i].compile_ms,
           modules[i].spill_bytes, modules[i].warnings, modules[i].failed ? "  FAILED" : "");
  }
  printf("\n%-40s %9s %9s %9s %9s %6s  (timed: err of the small twin, diff vs mma at full "
         "size)\n",
         "case", "err", "mma err", "TFLOP/s", "mma", "ratio");
  for (int i = 0; i < case_count; i++) {
    const hcase *c = &cases[i];
    if (!c->ran) continue;
    if (c->timed && c->twin_ran)
      printf("%-40s %9.1e %9.1e %9.1f %9.1f %6.2f diff %.1e %s\n", c->name, max3(c->err),
             max3(c->mma_err), c->tflops, c->mma_tflops,
             c->mma_tflops > 0 ? c->tflops / c->mma_tflops : 0, max3(c->diff),
             c->passed ? "" : "FAILED");
    else if (c->timed)
      printf("%-40s %9s %9s %9.1f %9.1f %6.2f diff %.1e %s\n", c->name, "-", "-", c->tflops,
             c->mma_tflops, c->mma_tflops > 0 ? c->tflops / c->mma_tflops : 0, max3(c->diff),
             c->passed ? "" : "FAILED");
    else
      printf("%-40s %9.1e %9.1e %9s %9s %6s %s\n", c->name, max3(c->err), max3(c->mma_err), "-",
             "-", "-", c->passed ? "" : "FAILED");
  }
  printf("%d of %d cases passed\n", ran - failures, ran);
  sdpa_runtime_destroy(runtime);
  sdpa_gpu_close(&gpu);
  return failures ? 1 : 0;
}
