/*
 * instantiate.c — the NVRTC translation unit for a key.
 *
 * One #define per key field, then the family's entry header. The text is a
 * pure function of the key fields, so the key hash (which covers the
 * fields and every embedded template byte) covers everything compiled.
 */
#include "instantiate.h"

#include <stdio.h>
#include <stdlib.h>

#include "status.h"

sdpa_status sdpa_instantiate_source(const sdpa_key_fields *f, char **out) {
  char *text = NULL;
  int n = asprintf(&text,
                   "/* sdpa-jit instantiation */\n"
                   "#define SDPA_DTYPE %d\n"
                   "#define SDPA_HEAD_DIM %d\n"
                   "#define SDPA_HEAD_DIM_V %d\n"
                   "#define SDPA_Q_TILE %d\n"
                   "#define SDPA_KV_TILE %d\n"
                   "#define SDPA_WARPS %d\n"
                   "#define SDPA_STAGES %d\n"
                   "#define SDPA_LSE_PACKED %d\n"
                   "#define SDPA_LAYOUT %d\n"
                   "#define SDPA_MASK %d\n"
                   "#define SDPA_DETERMINISTIC %d\n"
                   "#define SDPA_EVEN %d\n"
                   "#define SDPA_FOLD_DQ %d\n"
                   "#include \"sdpa_bwd.cuh\"\n",
                   f->dtype == SDPA_DTYPE_FP16 ? 1 : 2, f->head_dim,
                   f->head_dim_v, f->config.q_tile, f->config.kv_tile,
                   f->config.warps, f->config.stages, f->lse_packed ? 1 : 0,
                   f->layout == SDPA_LAYOUT_THD ? 2 : 1, (int)f->mask,
                   f->deterministic ? 1 : 0, f->even ? 1 : 0, f->fold_dq ? 1 : 0);
  if (n < 0)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of memory building the kernel source");
  *out = text;
  return SDPA_STATUS_SUCCESS;
}
