/*
 * options.c — plan options and their environment defaults (options.h).
 *
 * Each variable is parsed into the option field it stands for when the
 * runtime is created; a value that does not parse keeps a message naming
 * the variable, its value and what is allowed, and only the plans that
 * take that default see it. A plan's own options are checked the same
 * way, with messages naming the field.
 */
#include "options.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

/* Parses a whole decimal int in [min, max]. Returns 0, or -1. */
static int parse_int(const char *text, long min, long max, int *out) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (!*text || *end || v < min || v > max) return -1;
  *out = (int)v;
  return 0;
}

/* A two-valued variable: unset/empty or values[0] -> first, values[1] ->
 * second; else an error into `error`. */
static void read_choice(const char *name, const char *const values[2],
                        const char *const meanings[2], int first, int second,
                        int *out, char *error, size_t size) {
  const char *env = getenv(name);
  *out = first;
  if (!env || !*env || !strcmp(env, values[0])) return;
  if (!strcmp(env, values[1])) {
    *out = second;
    return;
  }
  snprintf(error, size,
           "%s = \"%s\" is not valid: expected \"%s\" or unset (%s) or \"%s\" (%s)",
           name, env, values[0], meanings[0], values[1], meanings[1]);
}

/* Checks one set of tiles (option fields or SDPA_JIT_TILES): all zero, or
 * each in its range. Returns 0, or -1. */
static int tiles_valid(int q, int kv, int warps, int stages) {
  if (!q && !kv && !warps && !stages) return 0;
  if (q < 16 || q > 256 || q % 16 || kv < 16 || kv > 256 || kv % 16) return -1;
  if (warps != 4 && warps != 8 && warps != 12) return -1;
  return stages == 1 || stages == 2 ? 0 : -1;
}

void sdpa_options_read_defaults(sdpa_option_defaults *out) {
  static const sdpa_bwd_plan_options init = SDPA_BWD_PLAN_OPTIONS_INIT;
  memset(out, 0, sizeof *out);
  out->values = init;
  sdpa_bwd_plan_options *v = &out->values;
  const size_t size = sizeof out->errors[0];
  const char *env;

  if ((env = getenv("SDPA_JIT_FAMILY")) && *env) {
    if (!strcmp(env, "auto"))
      v->family = SDPA_FAMILY_AUTO;
    else if (!strcmp(env, "mma"))
      v->family = SDPA_FAMILY_MMA;
    else if (!strcmp(env, "hopper"))
      v->family = SDPA_FAMILY_HOPPER;
    else
      snprintf(out->errors[SDPA_OPTION_FAMILY], size,
               "SDPA_JIT_FAMILY = \"%s\" is not valid: expected \"auto\" or unset "
               "(the fastest family that covers the descriptor), \"mma\" "
               "(mma.sync) or \"hopper\" (wgmma + TMA, sm_90)",
               env);
  }
  if ((env = getenv("SDPA_JIT_TILES")) && *env) {
    int t[4] = {0, 0, 0, 0};
    char tail = 0;
    if (sscanf(env, "%d,%d,%d,%d%c", &t[0], &t[1], &t[2], &t[3], &tail) != 4 ||
        !t[0] || tiles_valid(t[0], t[1], t[2], t[3]) != 0)
      snprintf(out->errors[SDPA_OPTION_TILES], size,
               "SDPA_JIT_TILES = \"%s\" is not valid: expected "
               "\"q_tile,kv_tile,warps,stages\" with tiles 32, 64 or 128, warps "
               "4 or 8, stages 1 or 2",
               env);
    else {
      v->q_tile = t[0];
      v->kv_tile = t[1];
      v->warps = t[2];
      v->stages = t[3];
    }
  }
  {
    static const char *const values[2] = {"convert", "main"};
    static const char *const meanings[2] = {"a convert kernel writes dQ",
                                            "the main kernel writes dQ"};
    int w = 0;
    read_choice("SDPA_JIT_DQ_CONVERT", values, meanings, SDPA_DQ_CONVERT, SDPA_DQ_MAIN,
                &w, out->errors[SDPA_OPTION_DQ_WRITER], size);
    v->dq_writer = (sdpa_dq_writer)w;
  }
  {
    static const char *const values[2] = {"1", "0"};
    static const char *const meanings[2] = {"64-row kv tiles for small grids",
                                            "the table's tiles for every grid"};
    int w = 0;
    read_choice("SDPA_JIT_SMALL_GRID", values, meanings, SDPA_SWITCH_ON, SDPA_SWITCH_OFF,
                &w, out->errors[SDPA_OPTION_SMALL_GRID], size);
    v->small_grid = (sdpa_switch)w;
  }
  {
    static const char *const values[2] = {"1", "0"};
    static const char *const meanings[2] = {
        "execute launches through a graph per stream", "kernel by kernel"};
    int w = 0;
    read_choice("SDPA_JIT_GRAPHS", values, meanings, SDPA_SWITCH_ON, SDPA_SWITCH_OFF, &w,
                out->errors[SDPA_OPTION_GRAPHS], size);
    v->graphs = (sdpa_switch)w;
  }
  {
    static const char *const values[2] = {"1", "0"};
    static const char *const meanings[2] = {
        "every multiple of 8 from 8 to 256",
        "only the measured table's head dims: 32, 64, 96, 128, 192, 256"};
    int w = 0;
    read_choice("SDPA_JIT_ANY_HEAD_DIM", values, meanings, SDPA_SWITCH_ON, SDPA_SWITCH_OFF, &w,
                out->errors[SDPA_OPTION_ANY_HEAD_DIM], size);
    v->any_head_dim = (sdpa_switch)w;
  }
  {
    static const char *const values[2] = {"1", "0"};
    static const char *const meanings[2] = {
        "the Hopper family's unmasked THD grids launch the longest query sequence first",
        "batch order"};
    int w = 0;
    read_choice("SDPA_JIT_LONGEST_FIRST", values, meanings, SDPA_SWITCH_ON, SDPA_SWITCH_OFF,
                &w, out->errors[SDPA_OPTION_LONGEST_FIRST], size);
    v->longest_first = (sdpa_switch)w;
  }
  if ((env = getenv("SDPA_JIT_ORDER_GROUP")) && *env &&
      parse_int(env, 1, 0x7fffffff, &v->order_group) != 0)
    snprintf(out->errors[SDPA_OPTION_ORDER_GROUP], size,
             "SDPA_JIT_ORDER_GROUP = \"%s\" is not valid: expected a count of "
             "(sequence, kv head) pairs from 1 to %d, or unset",
             env, 0x7fffffff);
  if ((env = getenv("SDPA_JIT_HEAD_CHUNKS")) && *env &&
      parse_int(env, 1, 65535, &v->head_chunks) != 0)
    snprintf(out->errors[SDPA_OPTION_HEAD_CHUNKS], size,
             "SDPA_JIT_HEAD_CHUNKS = \"%s\" is not valid: expected a count of "
             "blocks from 1 to 65535 to split a kv head's query heads over, or unset",
             env);
  if ((env = getenv("SDPA_JIT_TAIL_SPLIT")) && *env &&
      parse_int(env, 1, 65535, &v->tail_split) != 0)
    snprintf(out->errors[SDPA_OPTION_TAIL_SPLIT], size,
             "SDPA_JIT_TAIL_SPLIT = \"%s\" is not valid: expected 1 (never split the "
             "last wave's tiles), a count of multiprocessors from 2 to 65535 to "
             "apply the rule for, or unset (the device's)",
             env);
  /* Testing only, and it was never validated: a value that is not an arch
   * of 80 or more leaves the tiles to the target's arch. */
  if ((env = getenv("SDPA_JIT_CONFIG_ARCH")) && *env &&
      (parse_int(env, 80, 1000, &v->config_arch) != 0))
    v->config_arch = 0;
}

/* The message of a default that did not parse, as the plan's error. */
static sdpa_status default_error(const sdpa_option_defaults *d, sdpa_option_field f) {
  return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "%s", d->errors[f]);
}

/* A count option whose 0 means the runtime's default: `given` outside
 * [0, most] is an error saying what is `allowed`; 0 takes `fallback` (or
 * the default's own error, a variable that did not parse). */
static sdpa_status resolve_count(const sdpa_option_defaults *defaults, sdpa_option_field field,
                                 const char *name, int given, int most, const char *allowed,
                                 int fallback, int *out) {
  if (given < 0 || given > most)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "options.%s = %d is not valid: give %s",
                          name, given, allowed);
  if (given == 0) {
    if (defaults->errors[field][0]) return default_error(defaults, field);
    *out = fallback;
  }
  return SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_options_resolve(const sdpa_option_defaults *defaults,
                                 const sdpa_bwd_plan_options *given,
                                 sdpa_bwd_plan_options *out) {
  static const sdpa_bwd_plan_options none = SDPA_BWD_PLAN_OPTIONS_INIT;
  const sdpa_bwd_plan_options *def = &defaults->values;
  sdpa_bwd_plan_options upgraded = none; /* an older struct, read up to its end */
  if (!given) given = &none;
  if (given->version >= 1 && given->version <= 4) {
    memcpy(&upgraded, given,
           given->version == 1   ? offsetof(sdpa_bwd_plan_options, any_head_dim)
           : given->version == 2 ? offsetof(sdpa_bwd_plan_options, head_chunks)
           : given->version == 3 ? offsetof(sdpa_bwd_plan_options, tail_split)
                                 : offsetof(sdpa_bwd_plan_options, longest_first));
    upgraded.version = SDPA_BWD_PLAN_OPTIONS_VERSION;
    given = &upgraded;
  }
  if (given->version != SDPA_BWD_PLAN_OPTIONS_VERSION)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.version = %u is unknown: initialize the plan "
                          "options with SDPA_BWD_PLAN_OPTIONS_INIT (version %d)",
                          given->version, SDPA_BWD_PLAN_OPTIONS_VERSION);
  *out = *given;

  if (given->family < SDPA_FAMILY_AUTO || given->family > SDPA_FAMILY_HOPPER)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.family = %d is not a family: use SDPA_FAMILY_AUTO "
                          "(0), SDPA_FAMILY_MMA (1) or SDPA_FAMILY_HOPPER (2)",
                          (int)given->family);
  if (given->family == SDPA_FAMILY_AUTO) {
    if (defaults->errors[SDPA_OPTION_FAMILY][0])
      return default_error(defaults, SDPA_OPTION_FAMILY);
    out->family = def->family;
  }

  const int tiles_given = given->q_tile || given->kv_tile || given->warps || given->stages;
  if (tiles_given) {
    if (tiles_valid(given->q_tile, given->kv_tile, given->warps, given->stages) != 0)
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "options tiles (q_tile %d, kv_tile %d, warps %d, stages %d) "
                            "are not valid: give all four (tiles multiples of 16 up "
                            "to 256, warps 4, 8 or 12, stages 1 or 2) or all zero for "
                            "the tile rule's",
                            given->q_tile, given->kv_tile, given->warps, given->stages);
  } else {
    if (defaults->errors[SDPA_OPTION_TILES][0])
      return default_error(defaults, SDPA_OPTION_TILES);
    out->q_tile = def->q_tile;
    out->kv_tile = def->kv_tile;
    out->warps = def->warps;
    out->stages = def->stages;
  }

  if (given->dq_writer == SDPA_DQ_DEFAULT) {
    if (defaults->errors[SDPA_OPTION_DQ_WRITER][0])
      return default_error(defaults, SDPA_OPTION_DQ_WRITER);
    out->dq_writer = def->dq_writer;
  } else if (given->dq_writer != SDPA_DQ_CONVERT && given->dq_writer != SDPA_DQ_MAIN) {
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.dq_writer = %d is not valid: use SDPA_DQ_DEFAULT "
                          "(0), SDPA_DQ_CONVERT (1) or SDPA_DQ_MAIN (2)",
                          (int)given->dq_writer);
  }

  const struct {
    const char *name;
    sdpa_switch given, fallback;
    sdpa_option_field field;
    sdpa_switch *out;
  } switches[] = {
      {"small_grid", given->small_grid, def->small_grid, SDPA_OPTION_SMALL_GRID,
       &out->small_grid},
      {"graphs", given->graphs, def->graphs, SDPA_OPTION_GRAPHS, &out->graphs},
      {"any_head_dim", given->any_head_dim, def->any_head_dim, SDPA_OPTION_ANY_HEAD_DIM,
       &out->any_head_dim},
      {"longest_first", given->longest_first, def->longest_first, SDPA_OPTION_LONGEST_FIRST,
       &out->longest_first}};
  for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
    if (switches[i].given == SDPA_SWITCH_DEFAULT) {
      if (defaults->errors[switches[i].field][0])
        return default_error(defaults, switches[i].field);
      *switches[i].out = switches[i].fallback;
    } else if (switches[i].given != SDPA_SWITCH_ON && switches[i].given != SDPA_SWITCH_OFF) {
      return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                            "options.%s = %d is not valid: use SDPA_SWITCH_DEFAULT (0), "
                            "SDPA_SWITCH_ON (1) or SDPA_SWITCH_OFF (2)",
                            switches[i].name, (int)switches[i].given);
    }
  }

  sdpa_status status = resolve_count(
      defaults, SDPA_OPTION_ORDER_GROUP, "order_group", given->order_group, INT_MAX,
      "a count of (sequence, kv head) pairs >= 1, or 0 for the default", def->order_group,
      &out->order_group);
  if (status) return status;
  if (given->config_arch < 0 || (given->config_arch > 0 && given->config_arch < 80))
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "options.config_arch = %d is not valid: give an arch of 80 "
                          "or more, or 0 for the target's",
                          given->config_arch);
  if (given->config_arch == 0) out->config_arch = def->config_arch;
  status = resolve_count(defaults, SDPA_OPTION_HEAD_CHUNKS, "head_chunks", given->head_chunks,
                         65535, "a count of blocks from 1 to 65535, or 0 for the library's rule",
                         def->head_chunks, &out->head_chunks);
  if (status) return status;
  return resolve_count(defaults, SDPA_OPTION_TAIL_SPLIT, "tail_split", given->tail_split, 65535,
                       "1 (never split), a count of multiprocessors from 2 to 65535, or 0 "
                       "for the device's",
                       def->tail_split, &out->tail_split);
}
