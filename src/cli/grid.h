/*
 * grid.h — the preheat grid: comma lists of key fields, their cartesian
 * product, and one representative descriptor per grid point.
 *
 * A grid point fixes every field that enters the specialization key
 * (arch, dtype, head dims, mask, layout, LSE stride class, deterministic,
 * even tiles, who writes dQ, and whether the main kernel's grid is small
 * enough for the small-grid tiles). cli_grid_desc turns it into a
 * descriptor whose launch-time fields (batch, heads, lengths, strides) are
 * picked so the plan comes out with exactly that key: one head, lengths
 * of 1024 (divisible by every tile) or 1000 (divisible by none) for BSHD,
 * max_s 1024 for THD; 1 sequence (8 blocks of 128 kv rows: small) or 64
 * (512 blocks: default). Who writes dQ is not a matter of size: planning
 * a "dq=main" point needs SDPA_JIT_DQ_CONVERT=main (preheat sets it).
 */
#ifndef SDPA_CLI_GRID_H
#define SDPA_CLI_GRID_H

#include <stddef.h>

#include "sdpa_jit.h"

#define CLI_LIST_MAX 32

/* A list of distinct values in the order given. */
typedef struct cli_list {
  int values[CLI_LIST_MAX];
  size_t count;
} cli_list;

/* The lists preheat multiplies. `even` does not apply to THD, `tiles`
 * small (1) only to BSHD problems that are not deterministic. */
typedef struct cli_grid {
  cli_list arch, dtype, head_dim, mask, layout, lse_strided, deterministic,
      even, dq_main, tiles;
  int head_dim_v;   /* 0: same as head_dim */
  int any_head_dim; /* plans take options.any_head_dim ON, whatever
                       SDPA_JIT_ANY_HEAD_DIM says (--any-head-dim) */
} cli_grid;

/* One point of the grid. even is -1 under THD (does not apply). */
typedef struct cli_grid_point {
  int arch;
  sdpa_dtype dtype;
  int head_dim, head_dim_v;
  sdpa_mask mask;
  sdpa_layout layout;
  int lse_strided;
  int deterministic;
  int even;
  int dq_main; /* 1: "dq=main", 0: "dq=convert" */
  int small;   /* 1: a grid small enough for the small-grid tiles */
  int any_head_dim; /* the grid's */
} cli_grid_point;

/* The names the list options accept, for --help and messages. */
extern const char cli_dtype_names[];  /* "bf16,fp16"                     */
extern const char cli_mask_names[];   /* "none,causal_tl,causal_br,window" */
extern const char cli_layout_names[]; /* "bshd,thd"                      */
extern const char cli_lse_names[];    /* "packed,strided"                */
extern const char cli_dq_names[];     /* "main,convert"                  */
extern const char cli_tiles_names[];  /* "default,small"                 */

/* Parse a comma list for one option into `out` (duplicates dropped).
 * Return NULL on success, else a static message saying what is allowed. */
const char *cli_list_parse_ints(const char *text, int min, int max,
                                cli_list *out);
const char *cli_list_parse_dtypes(const char *text, cli_list *out);
const char *cli_list_parse_masks(const char *text, cli_list *out);
const char *cli_list_parse_layouts(const char *text, cli_list *out);
const char *cli_list_parse_lse(const char *text, cli_list *out);
const char *cli_list_parse_dq(const char *text, cli_list *out);
const char *cli_list_parse_tiles(const char *text, cli_list *out);

/* Fills each list of `grid` that is still empty with its default: dtype
 * bf16,fp16; head_dim 64,128; mask none,causal_br; layout bshd,thd; lse
 * packed; deterministic 0; even 1 (plus 0 when `also_uneven`); dQ
 * writer convert (the only one chosen without SDPA_JIT_DQ_CONVERT);
 * tiles default,small (a process may run problems of either size); arch
 * `arch` (preheat passes 0, "the local GPU's", and resolves it once a
 * runtime exists). */
void cli_grid_fill_defaults(cli_grid *grid, int arch, int also_uneven);

/* Number of points (the product of the list lengths). */
size_t cli_grid_size(const cli_grid *grid);

/* The point at `index` (0 <= index < cli_grid_size). Returns nonzero when
 * the point repeats an earlier one (a THD point for the second and later
 * values of `even`, a THD or deterministic point for small tiles: neither
 * applies there); callers skip those. */
int cli_grid_point_at(const cli_grid *grid, size_t index,
                      cli_grid_point *out);

/* The plan options that plan a point as preheat does: its dQ writer. */
void cli_grid_options(const cli_grid_point *point, sdpa_bwd_plan_options *out);

/* A representative descriptor for `point` (see the file comment). */
void cli_grid_desc(const cli_grid_point *point, sdpa_bwd_desc *out);

/* "arch=90 dtype=bf16 hd=128 mask=none layout=bshd lse=packed det=0 even=1
 * dq=main tiles=default"
 * for messages about a point that has no key (plan creation failed). */
void cli_grid_describe(const cli_grid_point *point, char *buf, size_t size);

#endif /* SDPA_CLI_GRID_H */
