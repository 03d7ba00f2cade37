/*
 * plan.c — from a descriptor to a plan: validation, defaults, key,
 * workspace.
 *
 * sdpa_desc_resolve checks every descriptor field and fills in the
 * defaults (packed strides, head_dim_v, scale, THD token bounds), so that
 * nothing downstream (config, key, execute, the kernels) sees a value it
 * was not written for. Every rejection names the field, its value and what
 * is allowed, because the caller is usually a framework several layers up
 * and sdpa_last_error() is all its user sees. Index arithmetic is checked
 * with the overflow builtins: the kernels compute element offsets in int64,
 * so the largest offset of every tensor must fit.
 *
 * sdpa_bwd_plan_create then asks config.c for tiles, builds the key
 * (key.c) and carves the workspace: the fp32 dQ accumulator, Delta (one
 * float per query row and head) and, when the main kernel writes dQ itself
 * or in deterministic mode, one int32 counter per (head, sequence, query
 * tile), each region 256-byte aligned.
 *
 * Who writes dQ (a key field: "dq=main" or "dq=convert"): by default the
 * convert kernel, after the main kernel, at full memory bandwidth. With
 * SDPA_JIT_DQ_CONVERT=main the main kernel converts each query tile once
 * its last kv tile is done with it: one kernel fewer (3-5 us less host
 * time a call launched kernel by kernel; none through execute's graph:
 * launch.h) but slower on the GPU at every size measured on an H200, by 3
 * to 31% on small problems and 3-4% on large ones (bench/NOTES.md): the
 * CTAs that finish a query tile convert it latency-bound at their ends.
 * It is a key field rather than a run-time flag because any hand-off code
 * in the main kernel changed the register allocation of its loop (1.5-2%
 * either way).
 */
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hopper.h"
#include "instantiate.h"
#include "key.h"
#include "nvrtc.h"
#include "runtime.h"
#include "status.h"
#include "../templates/sdpa_hopper_traits.h"

#define MAX_BATCH (1 << 24)
#define MAX_HEADS (1 << 16)
#define MAX_SEQLEN (1 << 30)
#define STRIDE_MULTIPLE 8 /* elements: 16-byte vector loads of fp16/bf16 */
#define WORKSPACE_ALIGN 256


/* Checks one dimension: 1 <= value <= limit. */
static sdpa_status check_dim(const char *field, int value, int limit) {
  if (value < 1 || value > limit)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.%s = %d is out of range: it must be between 1 "
                          "and %d",
                          field, value, limit);
  return SDPA_STATUS_SUCCESS;
}

/* *out = a*b + c, nonzero on int64 overflow (a, b, c >= 0). */
static int mul_add_overflows(int64_t a, int64_t b, int64_t c, int64_t *out) {
  int64_t product;
  return __builtin_mul_overflow(a, b, &product) ||
         __builtin_add_overflow(product, c, out);
}

/* Shapes of one [batch, seq, heads, dim] tensor. */
typedef struct tensor_shape {
  const char *name; /* "q", "k", ... */
  int64_t batch;    /* desc.batch (its stride is unused under THD) */
  int64_t rows;     /* BSHD: seqlen; THD: token bound              */
  int64_t heads, dim;
  int output;       /* written by the kernels: no two elements may share an address */
} tensor_shape;

/* Whether distinct elements can share an address (plan.h): sorted by
 * stride, each dimension of extent > 1 must step past everything the
 * smaller ones span. (A sufficient condition for distinct addresses, and
 * every layout a framework makes meets it.) */
int sdpa_elements_overlap(const int64_t extent[4], const int64_t stride[4]) {
  int order[4] = {0, 1, 2, 3};
  for (int i = 1; i < 4; i++) /* insertion sort by stride */
    for (int j = i; j > 0 && stride[order[j]] < stride[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  int64_t span = 0; /* largest offset the smaller dimensions reach */
  for (int i = 0; i < 4; i++) {
    const int k = order[i];
    if (extent[k] <= 1) continue;
    if (stride[k] <= span) return 1;
    int64_t reach;
    if (__builtin_mul_overflow(stride[k], extent[k] - 1, &reach) ||
        __builtin_add_overflow(span, reach, &span))
      return 0; /* offsets were checked to fit int64 */
  }
  return 0;
}

/* Whether two elements of an output can share an address (plan.h). */
static int output_overlaps(const sdpa_strides *s, sdpa_layout layout, int64_t batch,
                           int64_t rows, int64_t heads, int64_t dim) {
  const int thd = layout == SDPA_LAYOUT_THD;
  const int64_t extent[4] = {thd ? 1 : batch, rows, heads, dim};
  const int64_t stride[4] = {thd ? 0 : s->batch, s->seq, s->head, 1};
  return sdpa_elements_overlap(extent, stride);
}

/* Checks that no two elements of an output share an address (plan.h). */
sdpa_status sdpa_output_strides_check(const char *name, const sdpa_strides *s,
                                      sdpa_layout layout, int64_t batch, int64_t rows,
                                      int64_t heads, int64_t dim, const char *total_field) {
  const int thd = layout == SDPA_LAYOUT_THD;
  if (!output_overlaps(s, layout, batch, rows, heads, dim)) return SDPA_STATUS_SUCCESS;
  const char *fix = "an output needs every element at an address of its own (e.g. the "
                    "packed default, all strides 0)";
  if (thd && !total_field)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.%s strides (batch %lld, seq %lld, head %lld) make "
                          "elements of one token's %lld x %lld (heads x head_dim) "
                          "output share addresses: %s",
                          name, (long long)s->batch, (long long)s->seq, (long long)s->head,
                          (long long)heads, (long long)dim, fix);
  if (thd)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.%s strides (batch %lld, seq %lld, head %lld) make "
                          "elements of the 1 x %lld x %lld x %lld output share "
                          "addresses at %s = %lld: %s; a head-major output's head "
                          "stride must cover the call's tokens",
                          name, (long long)s->batch, (long long)s->seq, (long long)s->head,
                          (long long)rows, (long long)heads, (long long)dim, total_field,
                          (long long)rows, fix);
  return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                        "desc.%s strides (batch %lld, seq %lld, head %lld) make "
                        "elements of the %lld x %lld x %lld x %lld output share "
                        "addresses: %s",
                        name, (long long)s->batch, (long long)s->seq, (long long)s->head,
                        (long long)batch, (long long)rows, (long long)heads,
                        (long long)dim, fix);
}

/* Resolves and checks the strides of one data tensor (fp16/bf16 elements,
 * 2 bytes). All zero: packed for the layout. Otherwise seq >= 1, head >= 1,
 * batch >= 0 (>= 1 for BSHD with batch > 1), every stride a multiple of 8
 * elements, and the largest byte offset fits in int64. */
static sdpa_status resolve_strides(sdpa_strides *s, sdpa_layout layout,
                                   const tensor_shape *t) {
  const char *n = t->name;
  int packed = s->batch == 0 && s->seq == 0 && s->head == 0;
  if (layout == SDPA_LAYOUT_THD) s->batch = 0; /* ignored under THD */
  if (packed) {
    s->head = t->dim;
    s->seq = t->heads * t->dim;
    s->batch = layout == SDPA_LAYOUT_BSHD ? t->rows * t->heads * t->dim : 0;
  } else {
    if (s->seq < 1)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.%s.seq = %lld is not allowed: the sequence "
                            "stride must be >= 1 (or set all three strides of "
                            "desc.%s to 0 for packed)",
                            n, (long long)s->seq, n);
    if (s->head < 1)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.%s.head = %lld is not allowed: the head "
                            "stride must be >= 1 (or set all three strides of "
                            "desc.%s to 0 for packed)",
                            n, (long long)s->head, n);
    if (s->batch < 0 || (layout == SDPA_LAYOUT_BSHD && t->batch > 1 &&
                         s->batch < 1))
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.%s.batch = %lld is not allowed: the batch "
                            "stride must be >= %d%s",
                            n, (long long)s->batch,
                            t->batch > 1 ? 1 : 0,
                            t->batch > 1 ? " when desc.batch > 1" : "");
    const struct { const char *field; int64_t value; } all[] = {
        {"batch", s->batch}, {"seq", s->seq}, {"head", s->head}};
    for (size_t i = 0; i < 3; i++)
      if (all[i].value % STRIDE_MULTIPLE != 0)
        return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                              "desc.%s.%s = %lld is not a multiple of %d "
                              "elements: the kernels load 16-byte vectors, so "
                              "every stride must be a multiple of 8 elements "
                              "(make the tensor contiguous or pad it)",
                              n, all[i].field, (long long)all[i].value,
                              STRIDE_MULTIPLE);
  }
  /* Under THD the token totals arrive at execute (at most the bound):
   * here only one token's heads x dim; execute checks the call's totals. */
  sdpa_status status;
  if (t->output &&
      (status = sdpa_output_strides_check(n, s, layout, t->batch,
                                          layout == SDPA_LAYOUT_THD ? 1 : t->rows,
                                          t->heads, t->dim, NULL)))
    return status;
  /* largest element: (B-1)*batch + (S-1)*seq + (H-1)*head + (D-1) */
  int64_t offset = t->dim - 1;
  if (mul_add_overflows(t->heads - 1, s->head, offset, &offset) ||
      mul_add_overflows(t->rows - 1, s->seq, offset, &offset) ||
      (layout == SDPA_LAYOUT_BSHD &&
       mul_add_overflows(t->batch - 1, s->batch, offset, &offset)) ||
      mul_add_overflows(offset, 2, 1, &offset))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.%s strides (batch %lld, seq %lld, head %lld)%s "
                          "overflow: the largest byte offset of the tensor "
                          "does not fit in int64; reduce the shape or the "
                          "strides",
                          n, (long long)s->batch, (long long)s->seq,
                          (long long)s->head,
                          packed ? " (the packed default)" : "");
  return SDPA_STATUS_SUCCESS;
}

/* Resolves and checks the fp32 LSE strides (see sdpa_lse_strides). */
static sdpa_status resolve_lse(sdpa_bwd_desc *d) {
  sdpa_lse_strides *s = &d->lse;
  int packed = s->batch == 0 && s->head == 0 && s->seq == 0;
  int64_t heads = d->heads_q;
  int64_t rows = d->layout == SDPA_LAYOUT_BSHD ? d->seqlen_q : d->max_total_q;
  if (d->layout == SDPA_LAYOUT_THD) s->batch = 0; /* ignored under THD */
  if (packed) {
    s->seq = 1;
    s->head = rows;
    s->batch = d->layout == SDPA_LAYOUT_BSHD ? heads * rows : 0;
  } else {
    if (s->seq < 1)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.lse.seq = %lld is not allowed: the LSE "
                            "sequence stride must be >= 1 (or set all three "
                            "LSE strides to 0 for packed)",
                            (long long)s->seq);
    if (s->head < 0)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.lse.head = %lld is not allowed: the LSE head "
                            "stride must be >= 0",
                            (long long)s->head);
    if (s->batch < 0)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.lse.batch = %lld is not allowed: the LSE "
                            "batch stride must be >= 0",
                            (long long)s->batch);
  }
  int64_t offset = 0;
  if (mul_add_overflows(rows - 1, s->seq, offset, &offset) ||
      mul_add_overflows(heads - 1, s->head, offset, &offset) ||
      (d->layout == SDPA_LAYOUT_BSHD &&
       mul_add_overflows((int64_t)d->batch - 1, s->batch, offset, &offset)) ||
      mul_add_overflows(offset, 4, 3, &offset))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.lse strides (batch %lld, head %lld, seq %lld)%s "
                          "overflow: the largest byte offset of LSE does not "
                          "fit in int64",
                          (long long)s->batch, (long long)s->head,
                          (long long)s->seq,
                          packed ? " (the packed default)" : "");
  return SDPA_STATUS_SUCCESS;
}

/* Resolves a THD token bound: 0 -> batch * seqlen; 1 <= bound <= INT32_MAX
 * (cu_seqlens are int32). BSHD: batch * seqlen. */
static sdpa_status resolve_total(const char *field, int64_t *total,
                                 const sdpa_bwd_desc *d, int seqlen) {
  int64_t product = (int64_t)d->batch * seqlen; /* <= 2^54 */
  if (d->layout == SDPA_LAYOUT_BSHD) {
    *total = product;
    return SDPA_STATUS_SUCCESS;
  }
  int defaulted = *total == 0;
  if (defaulted) *total = product;
  if (*total < 1 || *total > INT32_MAX)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.%s = %lld%s is out of range: a THD token total "
                          "must be between 1 and %d (cu_seqlens are int32); "
                          "0 means batch x max_s",
                          field, (long long)*total,
                          defaulted ? " (the default batch x max_s)" : "",
                          INT32_MAX);
  return SDPA_STATUS_SUCCESS;
}

/* Checks the target arch: 0 -> NO_DEVICE (the message is
 * `no_device_message` when given: sdpa_runtime_arch's, which adds the
 * driver's reason), below 80 -> NOT_SUPPORTED, unknown to NVRTC ->
 * NOT_SUPPORTED. */
static sdpa_status check_arch(int arch, const char *origin,
                              const char *no_device_message) {
  if (arch == 0) {
    if (no_device_message && *no_device_message)
      return sdpa_error_set(SDPA_STATUS_NO_DEVICE, "%s", no_device_message);
    return sdpa_error_set(SDPA_STATUS_NO_DEVICE,
                          "no GPU found: set desc.arch or the runtime option "
                          "arch");
  }
  if (arch < 0)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "%s = %d is out of range: give a compute capability "
                          "as major*10+minor (e.g. 90), or 0 for the current "
                          "device's",
                          origin, arch);
  if (arch < 80)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "%s = %d (sm_%d) is not supported: sm_75 and older "
                          "are not supported; sdpa-jit needs sm_80 or newer",
                          origin, arch, arch);
  if (!sdpa_nvrtc_arch_known(arch))
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "%s = %d (sm_%d) is not a target NVRTC %s knows: it "
                          "knows %s",
                          origin, arch, arch, sdpa_nvrtc_version(),
                          sdpa_nvrtc_arch_list());
  return SDPA_STATUS_SUCCESS;
}

/* The body of sdpa_desc_resolve, with where the arch came from and the
 * message for a missing one, for the messages. */
static sdpa_status resolve_desc(const sdpa_bwd_desc *desc, int arch,
                                const char *arch_origin,
                                const char *no_device_message,
                                sdpa_bwd_desc *resolved) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!desc || !resolved)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "the descriptor is NULL");
  if (desc->version != SDPA_BWD_DESC_VERSION)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.version = %u is unknown: initialize the "
                          "descriptor with SDPA_BWD_DESC_INIT (version %d)",
                          desc->version, SDPA_BWD_DESC_VERSION);
  sdpa_bwd_desc d = *desc;

  if (d.dtype != SDPA_DTYPE_FP16 && d.dtype != SDPA_DTYPE_BF16)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.dtype = %d is not supported: use "
                          "SDPA_DTYPE_FP16 (%d) or SDPA_DTYPE_BF16 (%d)",
                          (int)d.dtype, SDPA_DTYPE_FP16, SDPA_DTYPE_BF16);
  if (d.layout != SDPA_LAYOUT_BSHD && d.layout != SDPA_LAYOUT_THD)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.layout = %d is not supported: use "
                          "SDPA_LAYOUT_BSHD (%d) or SDPA_LAYOUT_THD (%d)",
                          (int)d.layout, SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD);

  if ((status = check_dim("batch", d.batch, MAX_BATCH)) ||
      (status = check_dim("heads_q", d.heads_q, MAX_HEADS)) ||
      (status = check_dim("heads_kv", d.heads_kv, MAX_HEADS)) ||
      (status = check_dim("seqlen_q", d.seqlen_q, MAX_SEQLEN)) ||
      (status = check_dim("seqlen_kv", d.seqlen_kv, MAX_SEQLEN)))
    return status;
  if (d.heads_q % d.heads_kv != 0)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc: heads_q %d is not a multiple of heads_kv %d: "
                          "each key/value head serves a whole group of query "
                          "heads (GQA/MQA)",
                          d.heads_q, d.heads_kv);

  char dims[64];
  if (!sdpa_config_supports_head_dim(d.head_dim))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.head_dim = %d is not supported: supported are %s",
                          d.head_dim, sdpa_config_head_dim_list(dims, sizeof dims));
  if (d.head_dim_v == 0) d.head_dim_v = d.head_dim;
  if (!sdpa_config_supports_head_dim(d.head_dim_v))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.head_dim_v = %d is not supported: supported "
                          "are %s (and 0 for head_dim)",
                          d.head_dim_v, sdpa_config_head_dim_list(dims, sizeof dims));
  if (d.head_dim_v > d.head_dim)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.head_dim_v = %d is larger than desc.head_dim "
                          "= %d: head_dim_v must be <= head_dim",
                          d.head_dim_v, d.head_dim);

  switch (d.mask) {
  case SDPA_MASK_NONE:
  case SDPA_MASK_CAUSAL_TOP_LEFT:
  case SDPA_MASK_CAUSAL_BOTTOM_RIGHT:
    d.window_left = d.window_right = -1; /* ignored */
    break;
  case SDPA_MASK_SLIDING_WINDOW:
    if (d.window_left < -1)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.window_left = %d is not allowed: it must be "
                            ">= 0, or -1 for unbounded",
                            d.window_left);
    if (d.window_right < -1)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "desc.window_right = %d is not allowed: it must be "
                            ">= 0, or -1 for unbounded",
                            d.window_right);
    break;
  default:
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.mask = %d is not a mask kind: use "
                          "SDPA_MASK_NONE, SDPA_MASK_CAUSAL_TOP_LEFT, "
                          "SDPA_MASK_CAUSAL_BOTTOM_RIGHT or "
                          "SDPA_MASK_SLIDING_WINDOW (0..3)",
                          (int)d.mask);
  }

  if (!isfinite(d.scale))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.scale = %g is not a finite number: give the "
                          "softmax scale, or 0 for 1/sqrt(head_dim)",
                          (double)d.scale);
  if (d.scale == 0.0f) d.scale = (float)(1.0 / sqrt((double)d.head_dim));
  /* The kernels use scale * log2(e), in fp32: it must be finite too. */
  if (!isfinite(d.scale * 1.4426950408889634f))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "desc.scale = %g is too large: the kernels compute with "
                          "scale * log2(e) = inf in fp32; give a scale below %g",
                          (double)d.scale, (double)(FLT_MAX / 1.4426950408889634f));
  d.deterministic = d.deterministic ? 1 : 0;

  if ((status = resolve_total("max_total_q", &d.max_total_q, &d, d.seqlen_q)) ||
      (status = resolve_total("max_total_kv", &d.max_total_kv, &d, d.seqlen_kv)))
    return status;

  int thd = d.layout == SDPA_LAYOUT_THD;
  int64_t rows_q = thd ? d.max_total_q : d.seqlen_q;
  int64_t rows_kv = thd ? d.max_total_kv : d.seqlen_kv;
  const struct { sdpa_strides *s; tensor_shape t; } tensors[] = {
      {&d.q, {"q", d.batch, rows_q, d.heads_q, d.head_dim, 0}},
      {&d.k, {"k", d.batch, rows_kv, d.heads_kv, d.head_dim, 0}},
      {&d.v, {"v", d.batch, rows_kv, d.heads_kv, d.head_dim_v, 0}},
      {&d.o, {"o", d.batch, rows_q, d.heads_q, d.head_dim_v, 0}},
      {&d.dout, {"dout", d.batch, rows_q, d.heads_q, d.head_dim_v, 0}},
      {&d.dq, {"dq", d.batch, rows_q, d.heads_q, d.head_dim, 1}},
      {&d.dk, {"dk", d.batch, rows_kv, d.heads_kv, d.head_dim, 1}},
      {&d.dv, {"dv", d.batch, rows_kv, d.heads_kv, d.head_dim_v, 1}},
  };
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
    if ((status = resolve_strides(tensors[i].s, d.layout, &tensors[i].t)))
      return status;
  if ((status = resolve_lse(&d))) return status;

  if ((status = check_arch(arch, arch_origin, no_device_message)))
    return status;
  d.arch = arch;

  *resolved = d;
  return SDPA_STATUS_SUCCESS;
}

/* Fills a resolved copy of `desc` and validates it (plan.h). */
sdpa_status sdpa_desc_resolve(const sdpa_bwd_desc *desc, int arch,
                              sdpa_bwd_desc *resolved) {
  return resolve_desc(desc, arch, "desc.arch", NULL, resolved);
}

static size_t align_up(size_t n) {
  return (n + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}

/* Adds a region of count * element_bytes (each factor >= 0) at the end of
 * the workspace: *offset gets where it starts, *total grows by its aligned
 * size. Nonzero on size_t overflow. */
static int add_region(size_t *total, size_t *offset, const int64_t *factors,
                      size_t n) {
  size_t bytes = 1;
  for (size_t i = 0; i < n; i++)
    if (__builtin_mul_overflow(bytes, (size_t)factors[i], &bytes)) return 1;
  if (bytes > SIZE_MAX - WORKSPACE_ALIGN) return 1;
  *offset = *total;
  return __builtin_add_overflow(*total, align_up(bytes), total);
}

int64_t sdpa_dq_blocks(const sdpa_bwd_desc *d, int64_t rows_q) {
  return d->layout == SDPA_LAYOUT_THD ? rows_q / 16 + d->batch + 1
                                      : (int64_t)d->batch * ((d->seqlen_q + 15) / 16);
}

/* Blocks a group of the masked launch order aims at (sdpa_bwd.cuh,
 * decode_block): about two waves of a 132-SM part at one block per SM.
 * Fewer, and a group's heaviest kv tiles start while the last group's
 * light ones finish (a tail); more, and the tiles in flight span more
 * heads' Q, dO and dQ accumulator than L2 holds (bench/NOTES.md). */
#define ORDER_GROUP_BLOCKS 256

/* (sequence, kv head) pairs per group of the masked launch order (the
 * 8-warp kernels; the 4-warp ones run j-major and ignore it), for
 * `kv_tiles` >= 1 kv tiles a pair: ORDER_GROUP_BLOCKS worth of kv tiles
 * (deterministic plans in index order: every pair, so that a kv tile
 * never runs beside the lower kv tiles of its pair whose dQ adds it waits
 * for; the sm_90a family's that add in descending order launch a group's
 * lightest kv tiles first, sdpa_hopper_dq_descends: the default),
 * or options.order_group (tuning and testing: any positive count; the
 * grid is the same); at most every pair. */
static int launch_order_group(const sdpa_bwd_desc *d, const sdpa_key_fields *c,
                              const sdpa_bwd_plan_options *o, int64_t kv_tiles) {
  const int64_t pairs = (int64_t)d->batch * d->heads_kv;
  const int index_order =
      d->deterministic && !(c->family == SDPA_FAMILY_HOPPER &&
                            sdpa_hopper_dq_descends((int)d->mask, d->window_right,
                                                    d->heads_q / d->heads_kv));
  int64_t group = index_order ? pairs : (ORDER_GROUP_BLOCKS + kv_tiles - 1) / kv_tiles;
  if (o->order_group > 0) group = o->order_group;
  return (int)(group < pairs ? group : pairs);
}

/* Fills the plan's kernel parameter block (all but the call's pointers
 * and THD token totals) and launch grids; NOT_SUPPORTED when a grid
 * exceeds the launch limits (x < 2^31, y < 2^16) at the plan's bounds. */
static sdpa_status plan_launch(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_key_fields *c = &plan->fields;
  sdpa_kernel_params *p = &plan->params;
#define STRIDES(dst, src)                                                     \
  do {                                                                        \
    p->dst##_batch = d->src.batch;                                            \
    p->dst##_seq = d->src.seq;                                                \
    p->dst##_head = d->src.head;                                              \
  } while (0)
  STRIDES(q, q); STRIDES(k, k); STRIDES(v, v); STRIDES(o, o);
  STRIDES(do, dout); STRIDES(dq, dq); STRIDES(dk, dk); STRIDES(dv, dv);
#undef STRIDES
  p->lse_batch = d->lse.batch;
  p->lse_head = d->lse.head;
  p->lse_seq = d->lse.seq;
  p->rows_q = plan->rows_q;
  p->rows_kv = plan->rows_kv;
  p->dq_blocks = sdpa_dq_blocks(d, p->rows_q);
  p->batch = d->batch;
  p->heads_q = d->heads_q;
  p->heads_kv = d->heads_kv;
  p->group = d->heads_q / d->heads_kv;
  p->seqlen_q = d->seqlen_q;
  p->seqlen_kv = d->seqlen_kv;
  p->q_tiles = (d->seqlen_q + c->q_tile - 1) / c->q_tile;
  p->q_blocks = (d->seqlen_q + 15) / 16;
  p->window_left = d->window_left; /* -1 unless a sliding window */
  p->window_right = d->window_right;
  const int64_t kv_tiles = sdpa_tiles(d->seqlen_kv, c->kv_tile);
  p->order_group = launch_order_group(d, c, &plan->options, kv_tiles);
  p->head_chunks = plan->head_chunks;
  p->scale = d->scale;
  p->scale_log2 = d->scale * 1.4426950408889634f;

  if (c->family == SDPA_FAMILY_HOPPER) {
    plan->main_grid_x = sdpa_hopper_blocks_x(c, d->seqlen_kv, d->batch);
    plan->threads = sdpa_hopper_block_threads(c);
  } else {
    plan->main_grid_x = sdpa_mma_main_grid_x(sdpa_config_mma(c), d->seqlen_kv,
                                             d->batch); /* < 2^27 * 2^31 */
    plan->threads = sdpa_mma_threads(sdpa_config_mma(c));
  }
  /* THD: batch and max_s are bounded only each on its own, so the product
   * may pass int64; saturate (the check below rejects it). */
  if (__builtin_mul_overflow((int64_t)p->q_blocks * d->batch, (int64_t)d->heads_q,
                             &plan->convert_grid_x))
    plan->convert_grid_x = INT64_MAX;
  const int64_t aux_x = sdpa_aux_blocks(plan->rows_q * d->heads_q, d->head_dim_v); /* at most */
  int64_t largest = plan->main_grid_x > plan->convert_grid_x ? plan->main_grid_x
                                                             : plan->convert_grid_x;
  if (aux_x > largest) largest = aux_x;
  const int64_t dkv_x = plan->head_chunks > 1 ? sdpa_dkv_convert_blocks(plan->rows_kv, d->heads_kv,
                                                                        d->head_dim, d->head_dim_v)
                                              : 0;
  if (dkv_x > INT32_MAX - plan->convert_grid_x) largest = INT64_MAX;
  if (largest > INT32_MAX || (int64_t)d->heads_kv * plan->head_chunks > 65535)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "desc.batch = %d, desc.heads_q = %d, desc.heads_kv = "
                          "%d, desc.seqlen_q = %d, desc.seqlen_kv = %d and "
                          "desc.max_total_q = %lld need a launch grid of %lld "
                          "x %d blocks; at most %d x 65535 are possible: split "
                          "the batch, the heads or the sequences",
                          d->batch, d->heads_q, d->heads_kv, d->seqlen_q,
                          d->seqlen_kv, (long long)d->max_total_q,
                          (long long)largest, d->heads_kv * plan->head_chunks, INT32_MAX);
  return SDPA_STATUS_SUCCESS;
}

static sdpa_status workspace_overflow(const sdpa_bwd_plan *plan) {
  return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                        "the workspace for %lld query rows x %d heads x "
                        "head_dim %d does not fit in size_t",
                        (long long)plan->rows_q, plan->desc.heads_q,
                        plan->desc.head_dim);
}

/* The blocks a kv tile's query heads are split over (Hopper family, dQ
 * by the convert kernel; sdpa_hopper_head_chunks, grid y at most 65535):
 * > 1, each adds its dK / dV in fp32 to the workspace's dkv_accum. Read
 * by size_workspace and plan_launch. */
static void choose_head_chunks(sdpa_bwd_plan *plan) {
  const sdpa_key_fields *c = &plan->fields;
  plan->head_chunks = c->family == SDPA_FAMILY_HOPPER && !c->fold_dq
                          ? sdpa_hopper_split_heads(&plan->desc, &plan->options)
                          : 1;
}

/* The last wave's split (sdpa_hopper_tail_parts, the launch's
 * p.tail_*): where the key's kernel can split tiles
 * (sdpa_hopper_tail_covers), no head chunks are planned and options
 * .tail_split is not 1, the split tiles the workspace holds slots for (at
 * most SDPA_HOPPER_TAIL_MAX_TILES and what any multiprocessor count, or
 * the one tail_split names, leaves in a last wave). Read by
 * size_workspace and execute. */
static void choose_tail(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_key_fields *c = &plan->fields;
  plan->tail_cap = 0;
  if (c->family != SDPA_FAMILY_HOPPER || plan->head_chunks != 1 ||
      plan->options.tail_split == 1 ||
      !sdpa_hopper_tail_covers(d->head_dim, (int)d->layout, (int)d->mask, d->deterministic,
                               c->fold_dq))
    return;
  /* the split tiles, tiles % sms of them where tiles > sms, are at most
   * tiles - sms and sms - 1: with sms unknown until the module is loaded,
   * at most half the tiles */
  const int64_t tiles = sdpa_hopper_blocks_x(c, d->seqlen_kv, d->batch) * d->heads_kv;
  const int64_t sms = plan->options.tail_split;
  int64_t most = sms >= 2 ? (sms - 1 < tiles - sms ? sms - 1 : tiles - sms) : (tiles - 1) / 2;
  if (most > SDPA_HOPPER_TAIL_MAX_TILES) most = SDPA_HOPPER_TAIL_MAX_TILES;
  if (most <= 0) return;
  plan->tail_cap = (int)most;
}

/* The longest-first launch order (sdpa_hopper_longest_first, the
 * launch's p.seq_order): where the key's kernel has it and options
 * .longest_first is ON, the workspace holds the order (an int a
 * sequence) and execute asks the preprocess kernel for it. */
static void choose_order(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_key_fields *c = &plan->fields;
  plan->longest_first = c->family == SDPA_FAMILY_HOPPER &&
                        plan->options.longest_first == SDPA_SWITCH_ON &&
                        sdpa_hopper_longest_first((int)d->layout, (int)d->mask, d->deterministic,
                                                  c->fold_dq, d->batch);
}

int sdpa_tail_steps(const sdpa_kernel_params *p) {
  const int64_t steps = (int64_t)p->q_tiles * p->group;
  return steps < INT32_MAX ? (int)steps : INT32_MAX;
}

/* Sizes the workspace of a plan whose desc, config, dQ writer, head
 * chunks and tail slots are resolved (the writer decides whether the
 * counters are needed, the chunks whether dkv_accum is). */
static sdpa_status size_workspace(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_key_fields *c = &plan->fields;
  int thd = d->layout == SDPA_LAYOUT_THD;
  plan->rows_q = thd ? d->max_total_q : (int64_t)d->batch * d->seqlen_q;
  plan->rows_kv = thd ? d->max_total_kv : (int64_t)d->batch * d->seqlen_kv;

  size_t total = 0;
  int64_t q_tiles = (d->seqlen_q + (int64_t)c->q_tile - 1) / c->q_tile;
  const int64_t dq_accum[] = {sdpa_dq_blocks(d, plan->rows_q), 16, d->heads_q,
                               sdpa_dq_accum_dim(c), 4};
  const int64_t delta[] = {plan->rows_q, d->heads_q, 4};
  const int64_t semaphores[] = {d->heads_q, d->batch, q_tiles, 4};
  const int64_t none[] = {0};
  /* the counters when used; the second accumulator and counters where
   * the key has two copies (sdpa_dq_copies), else empty regions */
  plan->dq_copies = sdpa_dq_copies(c->family, c->deterministic, c->mask, c->head_dim);
  const int counters = plan->fields.fold_dq || d->deterministic;
  const int two = plan->dq_copies > 1;
  const int split = plan->head_chunks > 1;
  const int64_t dkv_accum[] = {plan->rows_kv, d->heads_kv, d->head_dim + d->head_dim_v, 4};
  const int tail = plan->tail_cap > 0;
  const int64_t tail_acc[] = {plan->tail_cap,
                              sdpa_hopper_tail_slot_floats(d->head_dim, d->head_dim_v), 4};
  const int64_t tail_count[] = {plan->tail_cap, 4};
  const int64_t seq_order[] = {d->batch, 4};
  if (add_region(&total, &plan->ws_dq_accum, dq_accum, 5) ||
      add_region(&total, &plan->ws_dq_accum_copy, two ? dq_accum : none, two ? 5 : 1) ||
      add_region(&total, &plan->ws_delta, delta, 3) ||
      add_region(&total, &plan->ws_semaphores, counters ? semaphores : none, counters ? 4 : 1) ||
      add_region(&total, &plan->ws_semaphores_copy, counters && two ? semaphores : none,
                 counters && two ? 4 : 1) ||
      add_region(&total, &plan->ws_dkv_accum, split ? dkv_accum : none, split ? 4 : 1) ||
      add_region(&total, &plan->ws_tail_acc, tail ? tail_acc : none, tail ? 3 : 1) ||
      add_region(&total, &plan->ws_tail_count, tail ? tail_count : none, tail ? 2 : 1) ||
      add_region(&total, &plan->ws_seq_order, plan->longest_first ? seq_order : none,
                 plan->longest_first ? 2 : 1))
    return workspace_overflow(plan);
  plan->workspace_bytes = total;
  return SDPA_STATUS_SUCCESS;
}

/* Picks the plan's family (options.family, AUTO resolved) and records
 * why. The Hopper family needs sm_90 and covers what
 * sdpa_hopper_covers() admits; AUTO falls back to mma.sync with the reason
 * recorded, a forced Hopper family fails with it. */
static sdpa_status choose_family(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  const sdpa_family asked = plan->options.family;
  char why[160] = "";
  const int hopper_ok = sdpa_hopper_covers(d, &plan->options, why, sizeof why);
  if (asked == SDPA_FAMILY_AUTO && hopper_ok && !SDPA_HOPPER_BY_DEFAULT) {
    plan->fields.family = SDPA_FAMILY_MMA;
    snprintf(plan->family_reason, sizeof plan->family_reason,
             "mma.sync: the Hopper family covers this descriptor but is taken only when "
             "asked for (options.family, SDPA_JIT_FAMILY=hopper) in this version");
    return SDPA_STATUS_SUCCESS;
  }
  if (asked == SDPA_FAMILY_MMA) {
    plan->fields.family = SDPA_FAMILY_MMA;
    snprintf(plan->family_reason, sizeof plan->family_reason,
             "mma.sync: asked for by options.family (or SDPA_JIT_FAMILY)");
  } else if (hopper_ok) {
    plan->fields.family = SDPA_FAMILY_HOPPER;
    snprintf(plan->family_reason, sizeof plan->family_reason, "hopper: %s%s",
             asked == SDPA_FAMILY_HOPPER ? "asked for; " : "", why);
  } else if (asked == SDPA_FAMILY_HOPPER) {
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "options.family = hopper (or SDPA_JIT_FAMILY=hopper) cannot "
                          "run this descriptor: %s; use SDPA_FAMILY_AUTO or "
                          "SDPA_FAMILY_MMA",
                          why);
  } else {
    plan->fields.family = SDPA_FAMILY_MMA;
    snprintf(plan->family_reason, sizeof plan->family_reason, "mma.sync: %s", why);
  }
  return SDPA_STATUS_SUCCESS;
}

/* Sets the key fields the descriptor decides (not the family, the dQ
 * writer, the tiles or `even`). */
static void descriptor_fields(sdpa_bwd_plan *plan) {
  const sdpa_bwd_desc *d = &plan->desc;
  sdpa_key_fields *f = &plan->fields;
  f->arch = d->arch;
  f->dtype = d->dtype;
  f->head_dim = d->head_dim;
  f->head_dim_v = d->head_dim_v;
  f->lse_packed = d->lse.seq == 1;
  f->layout = d->layout;
  f->mask = d->mask;
  f->deterministic = d->deterministic;
}

/* Creates a plan (sdpa_jit.h): validates, resolves the options, picks the
 * family and tiles, builds the key and sizes the workspace. */
static sdpa_status plan_create(sdpa_bwd_plan **out, sdpa_runtime *runtime,
                               const sdpa_bwd_desc *desc,
                               const sdpa_bwd_plan_options *options) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  sdpa_bwd_plan *plan = NULL;
  char no_device_message[1024] = "";
  int graphs_ready = 0; /* plan->graphs initialized: destroyed on failure */

  if (!out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_plan_create: out is NULL");
  *out = NULL;
  if (!runtime)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_plan_create: runtime is NULL");
  if (!desc)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_plan_create: desc is NULL");
  if (desc->version != SDPA_BWD_DESC_VERSION) {
    sdpa_bwd_desc unused;
    return resolve_desc(desc, 0, "desc.arch", NULL, &unused);
  }

  plan = calloc(1, sizeof *plan);
  if (!plan)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of host memory creating a plan");
  plan->runtime = runtime;
  if ((status = sdpa_options_resolve(&runtime->defaults, options, &plan->options)))
    goto done;

  int arch = desc->arch;
  const char *origin = "desc.arch";
  if (arch == 0) {
    origin = runtime->options.arch ? "the runtime option arch"
                                   : "the current device's arch";
    arch = sdpa_runtime_arch(runtime);
    if (arch == 0) /* sdpa_runtime_arch said why */
      snprintf(no_device_message, sizeof no_device_message, "%s",
               sdpa_last_error());
  }
  if ((status = resolve_desc(desc, arch, origin, no_device_message,
                             &plan->desc)))
    goto done;

  const sdpa_bwd_desc *d = &plan->desc;
  sdpa_key_fields *f = &plan->fields;
  /* options.any_head_dim OFF: the caller (the plan's options, or the
   * runtime's default from SDPA_JIT_ANY_HEAD_DIM=0) asked for the measured
   * table's head dims only. */
  if (plan->options.any_head_dim != SDPA_SWITCH_ON &&
      (!sdpa_config_head_dim_measured(d->head_dim) ||
       !sdpa_config_head_dim_measured(d->head_dim_v))) {
    const int own = options && options->version != 1 &&
                    options->any_head_dim == SDPA_SWITCH_OFF;
    status = sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                            "desc.head_dim = %d, head_dim_v = %d: %s restricts plans to the "
                            "measured head dims 32, 64, 96, 128, 192 and 256; %s to plan "
                            "every multiple of 8 from 8 to 256",
                            d->head_dim, d->head_dim_v,
                            own ? "options.any_head_dim = SDPA_SWITCH_OFF"
                                : "SDPA_JIT_ANY_HEAD_DIM=0 (the runtime's default of "
                                  "options.any_head_dim)",
                            own ? "set options.any_head_dim = SDPA_SWITCH_ON"
                                : "unset SDPA_JIT_ANY_HEAD_DIM (or set it to 1), or set "
                                  "options.any_head_dim = SDPA_SWITCH_ON");
    goto done;
  }
  descriptor_fields(plan);
  if ((status = choose_family(plan))) goto done;
  /* who writes dQ: as asked, else the family's default */
  f->fold_dq = plan->options.dq_writer == SDPA_DQ_MAIN ||
               (f->family == SDPA_FAMILY_HOPPER && sdpa_hopper_fold_by_default(d, &plan->options));
  if (f->family == SDPA_FAMILY_HOPPER)
    status = sdpa_hopper_config_select(d, &plan->options, f, &plan->smem_bytes);
  else
    status = sdpa_config_select(d, &plan->options, f, &plan->smem_bytes);
  if (status) goto done;
  /* Packed THD LSE is [heads, total_q]: its head stride is the launch's
   * token total, bound at execute. */
  plan->lse_packed_default =
      desc->lse.batch == 0 && desc->lse.head == 0 && desc->lse.seq == 0;
  /* A THD output whose elements are distinct at the token bound stays so
   * at any total below it: execute checks the call's totals only when
   * some output would overlap at the bound (a head-major one). */
  plan->thd_outputs_checked_per_call =
      d->layout == SDPA_LAYOUT_THD &&
      (output_overlaps(&d->dq, d->layout, 1, d->max_total_q, d->heads_q, d->head_dim) ||
       output_overlaps(&d->dk, d->layout, 1, d->max_total_kv, d->heads_kv, d->head_dim) ||
       output_overlaps(&d->dv, d->layout, 1, d->max_total_kv, d->heads_kv, d->head_dim_v));
  f->even = d->layout == SDPA_LAYOUT_BSHD && d->seqlen_q % f->q_tile == 0 &&
            d->seqlen_kv % f->kv_tile == 0;
  choose_head_chunks(plan);
  choose_tail(plan);
  choose_order(plan);
  if ((status = size_workspace(plan))) goto done;
  if ((status = sdpa_key_build(f, &plan->key))) goto done;
  if ((status = plan_launch(plan))) goto done;

  if ((status = sdpa_launch_graphs_init(&plan->graphs,
                                        plan->options.graphs == SDPA_SWITCH_ON)))
    goto done;
  graphs_ready = 1;
  if (pthread_mutex_init(&plan->lock, NULL) != 0) {
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                            "could not initialize the plan's mutex");
    goto done;
  }
  *out = plan;
  plan = NULL;

done:
  if (plan && graphs_ready) sdpa_launch_graphs_destroy(&plan->graphs, NULL);
  free(plan);
  return status;
}

sdpa_status sdpa_bwd_plan_create_with(sdpa_bwd_plan **out, sdpa_runtime *runtime,
                                      const sdpa_bwd_desc *desc,
                                      const sdpa_bwd_plan_options *options) {
  return SDPA_API_CALL(plan_create(out, runtime, desc, options));
}

sdpa_status sdpa_bwd_plan_create(sdpa_bwd_plan **out, sdpa_runtime *runtime,
                                 const sdpa_bwd_desc *desc) {
  return SDPA_API_CALL(plan_create(out, runtime, desc, NULL));
}

sdpa_status sdpa_bwd_plan_query(const sdpa_bwd_plan *plan, sdpa_bwd_plan_info *out) {
  if (!plan || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_plan_query: plan and out must not be NULL");
  if (out->version != SDPA_BWD_PLAN_INFO_VERSION)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_bwd_plan_query: out->version = %u is unknown: set it "
                          "to SDPA_BWD_PLAN_INFO_VERSION (%d)",
                          out->version, SDPA_BWD_PLAN_INFO_VERSION);
  const sdpa_key_fields *f = &plan->fields;
  out->family = (sdpa_family)f->family;
  out->family_reason = plan->family_reason;
  out->q_tile = f->q_tile;
  out->kv_tile = f->kv_tile;
  out->warps = f->warps;
  out->stages = f->stages;
  out->smem_bytes = plan->smem_bytes;
  out->dq_writer = f->fold_dq ? SDPA_DQ_MAIN : SDPA_DQ_CONVERT;
  out->graphs = plan->graphs.enabled;
  out->source = plan->source;
  out->stored = plan->stored;
  return SDPA_STATUS_SUCCESS;
}

/* Destroys a plan and its launch graphs; the module and cubin belong to
 * the runtime's table. */
void sdpa_bwd_plan_destroy(sdpa_bwd_plan *plan) {
  if (!plan) return;
  sdpa_launch_graphs_destroy(&plan->graphs, NULL);
  pthread_mutex_destroy(&plan->lock);
  free(plan->compile_log);
  free(plan);
}

size_t sdpa_bwd_workspace_size(const sdpa_bwd_plan *plan) {
  return plan ? plan->workspace_bytes : 0;
}

const char *sdpa_bwd_plan_key(const sdpa_bwd_plan *plan) {
  return plan ? plan->key.text : "";
}

const char *sdpa_bwd_plan_key_hash(const sdpa_bwd_plan *plan) {
  return plan ? plan->key.hash : "";
}

const char *sdpa_bwd_plan_compile_log(const sdpa_bwd_plan *plan) {
  return plan && plan->compile_log ? plan->compile_log : "";
}
