/*
 * options.h — plan options: the runtime's defaults, read from the
 * environment once when the runtime is created, and a plan's options
 * resolved against them.
 *
 * Every tuning or testing choice that is a key field or a plan parameter
 * (family, tiles, dQ writer, small-grid rule, graphs, launch-order group,
 * the arch tiles are picked for) reaches a plan through
 * sdpa_bwd_plan_options. The environment variables of README's table are
 * only the defaults of those fields: nothing reads them after the runtime
 * exists, so the CLI and benchmarks set options, never the environment.
 */
#ifndef SDPA_OPTIONS_H
#define SDPA_OPTIONS_H

#include "sdpa_jit.h"

/* The option fields that have an environment default. */
typedef enum sdpa_option_field {
  SDPA_OPTION_FAMILY,
  SDPA_OPTION_TILES,
  SDPA_OPTION_DQ_WRITER,
  SDPA_OPTION_SMALL_GRID,
  SDPA_OPTION_GRAPHS,
  SDPA_OPTION_ORDER_GROUP,
  SDPA_OPTION_CONFIG_ARCH,
  SDPA_OPTION_ANY_HEAD_DIM,
  SDPA_OPTION_HEAD_CHUNKS,
  SDPA_OPTION_TAIL_SPLIT,
  SDPA_OPTION_LONGEST_FIRST,
  SDPA_OPTION_COUNT
} sdpa_option_field;

/* A runtime's defaults. A field whose variable was not valid keeps its
 * message: plans that take that default fail with it (INVALID_ARGUMENT),
 * plans that set the field themselves do not. */
typedef struct sdpa_option_defaults {
  sdpa_bwd_plan_options values;
  char errors[SDPA_OPTION_COUNT][320];
} sdpa_option_defaults;

/* Reads SDPA_JIT_FAMILY, SDPA_JIT_TILES, SDPA_JIT_DQ_CONVERT,
 * SDPA_JIT_SMALL_GRID, SDPA_JIT_GRAPHS, SDPA_JIT_ORDER_GROUP,
 * SDPA_JIT_CONFIG_ARCH, SDPA_JIT_ANY_HEAD_DIM, SDPA_JIT_HEAD_CHUNKS,
 * SDPA_JIT_TAIL_SPLIT and SDPA_JIT_LONGEST_FIRST into `out`. Never
 * fails. */
void sdpa_options_read_defaults(sdpa_option_defaults *out);

/* Resolves `given` (NULL: every default) into `out`: each zero field takes
 * the runtime's default; the result has family AUTO/MMA/HOPPER, tiles all
 * zero (the tile rule's) or all given, dq_writer CONVERT or MAIN,
 * small_grid, graphs, any_head_dim and longest_first ON or OFF,
 * order_group >= 0, config_arch >= 0, version the current one (a version
 * 1 to 4 struct is read without its later fields).
 * INVALID_ARGUMENT, naming the field (or the variable) and what is
 * allowed, for an unknown version or value. */
sdpa_status sdpa_options_resolve(const sdpa_option_defaults *defaults,
                                 const sdpa_bwd_plan_options *given,
                                 sdpa_bwd_plan_options *out);

#endif /* SDPA_OPTIONS_H */
