/*
 * hopper.c — the sm_90a family on the host (hopper.h).
 *
 * Coverage. The family's kernel (templates/sdpa_hopper.cuh) compiles for
 * sm_90a only (wgmma and setmaxnreg are arch-specific), for head dims
 * that are multiples of 8 with head_dim_v <= head_dim <= 256 (and
 * head_dim_v > 64 above 128: sdpa_hopper_supported), deterministic or not
 * (with SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT 0 deterministic plans take it
 * only when they ask for it), with the convert kernel writing dQ; every mask,
 * BSHD and THD, GQA, packed and strided LSE. Its
 * Q, K, V and dO tiles arrive by bulk tensor copies, whose maps need
 * 16-byte-aligned byte strides below 2^40 (the descriptor's 8-element
 * multiples give the alignment) and rows at least as long as the head
 * dim. Anything else plans to the mma.sync family under AUTO, with the
 * reason recorded, and fails a plan that forces this family.
 *
 * Tensor maps are encoded per call: they hold the tensors' addresses and,
 * under THD, the call's token totals (so no row past a tensor is read).
 */
#include "hopper.h"

#include <stdio.h>
#include <string.h>

#include "status.h"
#include "../templates/sdpa_hopper_traits.h"

_Static_assert(sizeof(CUtensorMap) == sizeof(sdpa_tensor_map),
               "a map slot holds one CUtensorMap");

#define STRIDE_LIMIT ((int64_t)1 << 40) /* bytes, cuTensorMapEncodeTiled */

/* Whether the strides of one TMA-loaded tensor can be mapped; `why` names
 * the field when not. */
static int strides_mappable(const char *name, const sdpa_strides *s, int cols,
                            sdpa_layout layout, char *why, size_t why_size) {
  const int64_t elements[3] = {s->seq, s->head, s->batch}; /* any int64 a plan admits */
  const char *fields[3] = {"seq", "head", "batch"};
  if (s->seq < cols) {
    snprintf(why, why_size,
             "desc.%s.seq = %lld is shorter than a row of %d elements: the bulk tensor "
             "copies need rows that do not overlap",
             name, (long long)s->seq, cols);
    return 0;
  }
  for (int i = 0; i < (layout == SDPA_LAYOUT_BSHD ? 3 : 2); i++)
    if (elements[i] >= STRIDE_LIMIT / 2) { /* 2-byte elements; no product to overflow */
      snprintf(why, why_size,
               "desc.%s.%s = %lld elements is 2^39 or more: the bulk tensor copies need "
               "strides below 2^40 bytes",
               name, fields[i], (long long)elements[i]);
      return 0;
    }
  return 1;
}

int sdpa_hopper_covers(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o, char *why,
                       size_t why_size) {
  if (d->arch != 90) {
    snprintf(why, why_size, "sm_%d: the Hopper family needs sm_90 (H100, H200)", d->arch);
    return 0;
  }
  if (!sdpa_hopper_supported(d->head_dim, d->head_dim_v)) {
    snprintf(why, why_size,
             "head_dim %d, head_dim_v %d: the Hopper family covers head dims that are "
             "multiples of 8 with head_dim_v <= head_dim <= 256 (head_dim_v > 64 where "
             "head_dim > 128)",
             d->head_dim, d->head_dim_v);
    return 0;
  }
  if (d->deterministic && !SDPA_HOPPER_DETERMINISTIC_BY_DEFAULT &&
      o->family != SDPA_FAMILY_HOPPER) {
    snprintf(why, why_size,
             "deterministic: the Hopper family's deterministic kernels run only when asked "
             "for (options.family = SDPA_FAMILY_HOPPER, SDPA_JIT_FAMILY=hopper) in this version");
    return 0;
  }
  if (o->dq_writer == SDPA_DQ_MAIN &&
      !sdpa_hopper_fold_covers(d->head_dim, d->head_dim_v, (int)d->layout, (int)d->mask,
                               d->deterministic)) {
    snprintf(why, why_size,
             "dq_writer main: the Hopper family's main kernel writes dQ itself where the "
             "plan is not deterministic and head_dim <= 128 (not BSHD without a mask at "
             "head_dim <= 64: the persistent kernel) or head_dim 192 with head_dim_v <= 128");
    return 0;
  }
  if (o->q_tile) {
    snprintf(why, why_size,
             "tiles given (options or SDPA_JIT_TILES): those are the mma.sync family's");
    return 0;
  }
  const struct {
    const char *name;
    const sdpa_strides *s;
    int cols;
  } tensors[] = {{"q", &d->q, d->head_dim},
                 {"k", &d->k, d->head_dim},
                 {"v", &d->v, d->head_dim_v},
                 {"dout", &d->dout, d->head_dim_v}};
  for (size_t i = 0; i < 4; i++)
    if (!strides_mappable(tensors[i].name, tensors[i].s, tensors[i].cols, d->layout, why,
                          why_size))
      return 0;
  snprintf(why, why_size, "sm_90, head_dim %d: the Hopper family covers this descriptor",
           d->head_dim);
  return 1;
}

/* The traits configuration of key fields `f`. */
static sdpa_hopper_config config_of(const sdpa_key_fields *f) {
  sdpa_hopper_config c = {f->head_dim, f->head_dim_v, f->q_tile, f->kv_tile, f->warps,
                          f->stages};
  return c;
}

sdpa_status sdpa_hopper_config_select(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o,
                                      sdpa_key_fields *f, int *smem_bytes) {
  (void)o;
  const sdpa_hopper_config c = sdpa_hopper_choose(d->head_dim, d->head_dim_v, d->deterministic);
  f->q_tile = c.q_tile;
  f->kv_tile = c.kv_tile;
  f->warps = c.warps;
  f->stages = c.stages;
  *smem_bytes = sdpa_hopper_smem_layout(c, (int)d->layout, (int)d->mask, d->deterministic).total +
                sdpa_hopper_fold_bytes(c, f->fold_dq);
  /* sm_90's 227 KiB (config.c's sdpa_arch_smem_limit) */
  if (*smem_bytes > 232448)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "the Hopper family needs %d bytes of shared memory at head_dim %d; "
                          "sm_90 allows 232448",
                          *smem_bytes, d->head_dim);
  return SDPA_STATUS_SUCCESS;
}

int sdpa_hopper_split_heads(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  return sdpa_hopper_head_chunks(d->heads_q / d->heads_kv, d->head_dim, (int)d->layout,
                                 (int)d->mask, d->deterministic, o->head_chunks,
                                 65535 / d->heads_kv);
}

int sdpa_hopper_fold_by_default(const sdpa_bwd_desc *d, const sdpa_bwd_plan_options *o) {
  return SDPA_HOPPER_FOLD_BY_DEFAULT && o->dq_writer == SDPA_DQ_DEFAULT &&
         sdpa_hopper_fold_covers(d->head_dim, d->head_dim_v, (int)d->layout, (int)d->mask,
                                 d->deterministic) &&
         sdpa_hopper_split_heads(d, o) == 1;
}

int sdpa_hopper_block_threads(const sdpa_key_fields *f) {
  return sdpa_hopper_threads(config_of(f));
}

long long sdpa_hopper_blocks_x(const sdpa_key_fields *f, int seqlen_kv, int batch) {
  return sdpa_hopper_grid_x(config_of(f), seqlen_kv, batch);
}

long long sdpa_hopper_persistent_grid(const sdpa_key_fields *f, long long tiles, int sm_count) {
  if (f->family != SDPA_FAMILY_HOPPER ||
      !sdpa_hopper_persistent_kernel(f->head_dim, (int)f->layout, (int)f->mask,
                                     f->deterministic))
    return 0;
  return sdpa_hopper_persistent_blocks(tiles, sm_count);
}

/* Encodes one map (see templates/sdpa_tensor_maps.h). */
static sdpa_status encode(const sdpa_driver *drv, const char *name, const void *base,
                          int dtype, sdpa_layout layout, int cols, int64_t rows, int heads,
                          int batch, int64_t seq, int64_t head, int64_t batch_stride,
                          int box_rows, sdpa_tensor_map *out) {
  cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)(rows > 0 ? rows : 1),
                        (cuuint64_t)heads, (cuuint64_t)batch};
  cuuint64_t strides[3] = {(cuuint64_t)seq * 2, (cuuint64_t)head * 2, 0};
  const cuuint32_t box[4] = {SDPA_HOPPER_BOX_COLS, (cuuint32_t)box_rows, 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  cuuint32_t rank = layout == SDPA_LAYOUT_THD ? 3 : 4;
  if (rank == 4) {
    /* batch 1: its stride is never used, but must be a valid one */
    int64_t b = batch > 1 ? batch_stride : seq * rows;
    if (b < 8) b = 8;
    strides[2] = (cuuint64_t)b * 2;
  }
  CUresult rc = drv->cuTensorMapEncodeTiled(
      (CUtensorMap *)out,
      dtype == SDPA_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                               : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      rank, (void *)base, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "cuTensorMapEncodeTiled (the tensor map of %s)", name);
    return sdpa_driver_error(drv, rc, what);
  }
  return SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_hopper_tensor_maps(const sdpa_driver *drv, const sdpa_key_fields *f,
                                    const sdpa_bwd_desc *d, const sdpa_kernel_params *p,
                                    sdpa_tensor_maps *out) {
  if (!drv->cuTensorMapEncodeTiled)
    return sdpa_error_set(SDPA_STATUS_NOT_SUPPORTED,
                          "the CUDA driver lacks cuTensorMapEncodeTiled (CUDA 12.0 or "
                          "newer is needed for the Hopper family); use SDPA_FAMILY_MMA");
  const int thd = d->layout == SDPA_LAYOUT_THD;
  const int64_t rows_q = thd ? p->rows_q : d->seqlen_q, rows_kv = thd ? p->rows_kv : d->seqlen_kv;
  sdpa_status st;
  if ((st = encode(drv, "q", p->q, f->dtype, d->layout, d->head_dim, rows_q, d->heads_q,
                   d->batch, p->q_seq, p->q_head, p->q_batch, f->q_tile, &out->q)) ||
      (st = encode(drv, "k", p->k, f->dtype, d->layout, d->head_dim, rows_kv, d->heads_kv,
                   d->batch, p->k_seq, p->k_head, p->k_batch, f->kv_tile, &out->k)) ||
      (st = encode(drv, "v", p->v, f->dtype, d->layout, d->head_dim_v, rows_kv, d->heads_kv,
                   d->batch, p->v_seq, p->v_head, p->v_batch, f->kv_tile, &out->v)) ||
      (st = encode(drv, "dout", p->dout, f->dtype, d->layout, d->head_dim_v, rows_q,
                   d->heads_q, d->batch, p->do_seq, p->do_head, p->do_batch, f->q_tile,
                   &out->dout)))
    return st;
  return SDPA_STATUS_SUCCESS;
}
