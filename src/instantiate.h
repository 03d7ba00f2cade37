/*
 * instantiate.h — from key fields to the NVRTC translation unit.
 *
 * The translation unit is a handful of #defines (one per key field) and an
 * #include of the template family's entry header; the kernels are declared
 * extern "C", so their names in the cubin are the plain names below.
 */
#ifndef SDPA_INSTANTIATE_H
#define SDPA_INSTANTIATE_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#define SDPA_KERNEL_PREPROCESS "sdpa_bwd_preprocess"
#define SDPA_KERNEL_MAIN "sdpa_bwd_main"
#define SDPA_KERNEL_CONVERT "sdpa_bwd_convert_dq"

/* Threads per block of the preprocess and convert kernels. */
#define SDPA_AUX_THREADS 256

/* Lanes of the preprocess kernel per (row, head) of Delta, 8 elements a
 * lane (the template's PRE_LANES). The kernel is correct for any grid;
 * sized by sdpa_aux_blocks(), each lane has one item. */
static inline int sdpa_aux_lanes(int head_dim_v) {
  return head_dim_v <= 32 ? 4 : head_dim_v <= 64 ? 8 : head_dim_v <= 128 ? 16 : 32;
}

/* Blocks of the preprocess kernel for `items` (row, head) pairs. */
static inline int64_t sdpa_aux_blocks(int64_t items, int head_dim_v) {
  const int64_t per_block = SDPA_AUX_THREADS / sdpa_aux_lanes(head_dim_v);
  return (items + per_block - 1) / per_block;
}

/* The embedded templates (every .cuh and .h of templates/), sorted by name,
 * terminated by a {NULL, NULL, 0} row. */
typedef struct sdpa_embedded_file {
  const char *name;
  const char *data;
  size_t size;
} sdpa_embedded_file;
extern const sdpa_embedded_file sdpa_embedded_templates[];
extern const size_t sdpa_embedded_templates_count;

/* Writes the translation unit for `fields` into a malloc'd string *out. */
sdpa_status sdpa_instantiate_source(const sdpa_key_fields *fields, char **out);

#endif /* SDPA_INSTANTIATE_H */
