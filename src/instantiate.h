/*
 * instantiate.h — from key fields to the NVRTC translation unit.
 *
 * The translation unit is a handful of #defines (one per key field,
 * key_fields.h) and an #include of the family's entry header
 * (sdpa_bwd.cuh for mma.sync, sdpa_hopper.cuh for sm_90a); the kernels are
 * declared extern "C", so their names in the cubin are the plain names
 * below. Launch shapes: templates/sdpa_traits.h.
 */
#ifndef SDPA_INSTANTIATE_H
#define SDPA_INSTANTIATE_H

#include <stddef.h>
#include <stdint.h>

#include "key_fields.h"
#include "sdpa_jit.h"

#define SDPA_KERNEL_PREPROCESS "sdpa_bwd_preprocess"
#define SDPA_KERNEL_MAIN "sdpa_bwd_main"
#define SDPA_KERNEL_CONVERT "sdpa_bwd_convert_dq"

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
