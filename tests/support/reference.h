/*
 * reference.h — the float64 CPU reference of attention forward and
 * backward, and the host-side tools the GPU tests and benchmarks build on.
 *
 * A "problem" holds shapes like a descriptor does, plus host arrays in
 * float whose values are already representable in the problem's dtype
 * (what the GPU will read). Arrays are logical and packed, one row per
 * token: X[row][head][dim], row = b*seqlen + s under BSHD and the token
 * index t under THD; LSE is lse[row][head_q]. Device placement (strides,
 * padding, interleaved buffers) is described apart, by a layout, so one
 * problem can be laid out many ways.
 *
 * The reference computes in float64 from exactly the inputs the GPU gets:
 * the backward reads the problem's O (rounded to the dtype) and LSE
 * (fp32), so the GPU and the reference evaluate the same formula.
 * Nothing here needs a GPU or Check, so benchmarks link it as well.
 */
#ifndef SDPA_TEST_REFERENCE_H
#define SDPA_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa_jit.h"

/* ------------------------------------------------------------ numbers */

/* Round-to-nearest-even conversions; NaN stays NaN, overflow goes to inf,
 * fp16 subnormals are exact. */
uint16_t sdpa_ref_float_to_half(float value);
float sdpa_ref_half_to_float(uint16_t bits);
uint16_t sdpa_ref_float_to_bf16(float value);
float sdpa_ref_bf16_to_float(uint16_t bits);

/* The two above chosen by dtype, and value rounded to dtype and back. */
uint16_t sdpa_ref_to_bits(float value, sdpa_dtype dtype);
float sdpa_ref_from_bits(uint16_t bits, sdpa_dtype dtype);
float sdpa_ref_round(float value, sdpa_dtype dtype);

/* A seeded generator (splitmix64 + xoshiro256**). */
typedef struct sdpa_ref_rng {
  uint64_t s[4];
} sdpa_ref_rng;

void sdpa_ref_rng_seed(sdpa_ref_rng *rng, uint64_t seed);
uint64_t sdpa_ref_rng_next(sdpa_ref_rng *rng);
/* Uniform integer in [lo, hi] (inclusive). */
int sdpa_ref_rng_int(sdpa_ref_rng *rng, int lo, int hi);
/* Uniform double in [0, 1). */
double sdpa_ref_rng_uniform(sdpa_ref_rng *rng);
/* Standard normal (Box-Muller). */
double sdpa_ref_rng_normal(sdpa_ref_rng *rng);

/* ------------------------------------------------------------ problem */

/* Shapes (set by the caller before sdpa_ref_problem_alloc) and host
 * arrays (owned, allocated by it). */
typedef struct sdpa_ref_problem {
  sdpa_dtype dtype;
  sdpa_layout layout;
  int batch;               /* BSHD batch; THD number of sequences        */
  int heads_q, heads_kv;
  int seqlen_q, seqlen_kv; /* BSHD lengths; THD max_s hints (0 on alloc:
                              the longest sequence, at least 1)          */
  int head_dim, head_dim_v;/* head_dim_v 0 on alloc: head_dim            */
  sdpa_mask mask;
  int window_left, window_right;
  float scale;             /* as in the descriptor: 0 = 1/sqrt(head_dim) */

  /* Set by alloc. */
  int32_t *cu_seqlens_q, *cu_seqlens_kv; /* host, batch+1 (THD)           */
  int64_t rows_q, rows_kv; /* BSHD batch*seqlen; THD token totals       */
  float *q, *k, *v, *o, *dout; /* [row][head][dim]                      */
  float *lse;                  /* [row][head_q]                         */
} sdpa_ref_problem;

/* Allocates the arrays for the shapes in `p`. THD takes per-sequence
 * lengths (batch entries each, may be 0); BSHD ignores them (NULL).
 * Arrays are zeroed. Returns 0, or -1 on a bad shape or no memory. */
int sdpa_ref_problem_alloc(sdpa_ref_problem *p, const int *seqlens_q,
                           const int *seqlens_kv);

/* Frees what alloc made; the shape fields are kept. NULL is a no-op. */
void sdpa_ref_problem_free(sdpa_ref_problem *p);

/* Fills q, k, v, dout with standard normal values rounded to the dtype
 * (seeded), then O and LSE with the reference forward. */
void sdpa_ref_problem_fill(sdpa_ref_problem *p, uint64_t seed, int threads);

/* Sequence bounds of `row`: its sequence index and, for the query/key
 * side, where the sequence starts and how long it is. */
void sdpa_ref_sequence_q(const sdpa_ref_problem *p, int b, int64_t *start,
                         int *length);
void sdpa_ref_sequence_kv(const sdpa_ref_problem *p, int b, int64_t *start,
                          int *length);

/* Nonzero when key j is visible to query i in a sequence of sq queries and
 * skv keys under the problem's mask. */
int sdpa_ref_visible(const sdpa_ref_problem *p, int i, int j, int sq,
                     int skv);

/* The resolved softmax scale in double. */
double sdpa_ref_scale(const sdpa_ref_problem *p);

/* Element counts of the logical tensors. */
size_t sdpa_ref_elements(const sdpa_ref_problem *p, int tensor);

/* ---------------------------------------------------------- reference */

/* Forward in float64: o [rows_q][heads_q][head_dim_v], lse [rows_q][heads_q]
 * (natural log; -inf and O = 0 for a row with no visible key). `threads`
 * 0 = one per online CPU. */
void sdpa_ref_forward_f64(const sdpa_ref_problem *p, double *o, double *lse,
                          int threads);

/* Forward into the problem: O rounded to the dtype, LSE as fp32. */
void sdpa_ref_forward(sdpa_ref_problem *p, int threads);

/* Backward in float64 from the problem's q, k, v, dout and the given O and
 * LSE (P = exp(scale*S - LSE), dV = P^T dO, dP = dO V^T, Delta = rowsum(dO*O),
 * dS = P*(dP - Delta), dQ = scale*dS K, dK = scale*dS^T Q, GQA summed over
 * the group). Outputs are logical arrays the caller allocated. */
void sdpa_ref_backward_f64(const sdpa_ref_problem *p, const double *o,
                           const double *lse, double *dq, double *dk,
                           double *dv, int threads);

/* Reference gradients (malloc'd). */
typedef struct sdpa_ref_grads {
  double *dq, *dk, *dv;
} sdpa_ref_grads;

/* Backward from the problem's own O and LSE. Returns 0, -1 on no memory. */
int sdpa_ref_backward(const sdpa_ref_problem *p, sdpa_ref_grads *out,
                      int threads);
void sdpa_ref_grads_free(sdpa_ref_grads *g);

/* ||x - ref|| / ||ref||; when ref is all zero, ||x|| (0 is exact). */
double sdpa_ref_rel_error(const float *x, const double *ref, size_t n);
/* Count of NaN / inf values in x. */
size_t sdpa_ref_count_nonfinite(const float *x, size_t n);

/* ------------------------------------------------------------- layout */

/* Tensor ids, in the order of sdpa_bwd_tensors. */
enum {
  SDPA_REF_Q = 0,
  SDPA_REF_K,
  SDPA_REF_V,
  SDPA_REF_O,
  SDPA_REF_DOUT,
  SDPA_REF_DQ,
  SDPA_REF_DK,
  SDPA_REF_DV,
  SDPA_REF_TENSORS
};

/* How the 8 dtype tensors are placed in device buffers. */
typedef enum sdpa_ref_style {
  SDPA_REF_STYLE_PACKED = 0,  /* descriptor strides zero (library default)  */
  SDPA_REF_STYLE_PADDED,      /* explicit strides, padding after dim, heads
                                 and batch (all multiples of 8 elements)   */
  SDPA_REF_STYLE_HEAD_MAJOR,  /* BSHD: [b,h,s,d] (BHSD); THD: [h,t,d]      */
  SDPA_REF_STYLE_INTERLEAVED, /* q,k,v share one [.., q heads|k heads|v heads]
                                 buffer per token; dq,dk,dv likewise       */
  SDPA_REF_STYLE_COUNT
} sdpa_ref_style;

typedef enum sdpa_ref_lse_style {
  SDPA_REF_LSE_PACKED = 0,  /* descriptor strides zero: [b,h,s] / [h,t]   */
  SDPA_REF_LSE_PADDED,      /* explicit, seq stride 1, padded head/batch   */
  SDPA_REF_LSE_TOKEN_MAJOR, /* [b,s,h] / [t,h]: strided class              */
  SDPA_REF_LSE_COUNT
} sdpa_ref_lse_style;

#define SDPA_REF_MAX_BUFFERS SDPA_REF_TENSORS

typedef struct sdpa_ref_placement {
  int buffer;           /* index of the device buffer it lives in */
  int64_t offset;       /* element offset inside that buffer      */
  sdpa_strides strides; /* actual element strides                 */
} sdpa_ref_placement;

typedef struct sdpa_ref_layout {
  sdpa_ref_style style;
  sdpa_ref_lse_style lse_style;
  sdpa_strides declared[SDPA_REF_TENSORS]; /* what the descriptor says  */
  sdpa_ref_placement place[SDPA_REF_TENSORS];
  int buffer_count;
  int64_t buffer_elements[SDPA_REF_MAX_BUFFERS];
  int buffer_is_output[SDPA_REF_MAX_BUFFERS];
  sdpa_lse_strides lse_declared, lse_actual;
  int64_t lse_elements;
} sdpa_ref_layout;

const char *sdpa_ref_style_name(sdpa_ref_style style);
const char *sdpa_ref_lse_style_name(sdpa_ref_lse_style style);
const char *sdpa_ref_mask_name(sdpa_mask mask);
const char *sdpa_ref_dtype_name(sdpa_dtype dtype);

/* Plans the placement of p's tensors in `style` / `lse_style`. */
void sdpa_ref_layout_make(sdpa_ref_layout *out, const sdpa_ref_problem *p,
                          sdpa_ref_style style, sdpa_ref_lse_style lse_style);

/* A descriptor for p laid out as l (deterministic 0, arch 0, THD totals
 * bounds 0: the caller sets those). */
void sdpa_ref_desc(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                   sdpa_bwd_desc *out);

/* Writes logical tensor `tensor` (from src) into `buffer` (its host
 * buffer, dtype bits) at its placement. */
void sdpa_ref_pack(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                   int tensor, const float *src, uint16_t *buffer);
/* Reads tensor `tensor` from its host buffer into logical dst. */
void sdpa_ref_unpack(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                     int tensor, const uint16_t *buffer, float *dst);
/* Writes the logical lse [row][head] at the layout's LSE strides. */
void sdpa_ref_pack_lse(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       const float *lse, float *buffer);

/* Marks (sets to 1) the elements of buffer `buffer` that some tensor
 * covers; map has buffer_elements[buffer] bytes, zeroed by the caller. */
void sdpa_ref_coverage(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       int buffer, unsigned char *map);

/* One line describing the problem and its layout (for failure reports). */
void sdpa_ref_describe(const sdpa_ref_problem *p, const sdpa_ref_layout *l,
                       char *text, size_t size);

/* The descriptor's fields, all of them, on several lines. */
void sdpa_ref_describe_desc(const sdpa_bwd_desc *d, char *text, size_t size);

/* Online CPUs (at least 1). */
int sdpa_ref_cpu_count(void);

#endif /* SDPA_TEST_REFERENCE_H */
