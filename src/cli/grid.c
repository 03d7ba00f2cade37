/*
 * grid.c — parsing preheat's comma lists and turning grid points into
 * descriptors.
 *
 * Only the key fields vary across the grid; every other descriptor field
 * is a launch argument, so one representative value serves them all (see
 * grid.h). The lengths are chosen so the plan's "even tiles" decision is
 * the one asked for: 1024 is a multiple of every tile size, 1000 of none of
 * them. A strided LSE uses a sequence stride of 2 (any value but 1 makes
 * the key's LSE class "strided").
 */
#include "grid.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* BSHD lengths: a multiple of every tile, and a multiple of none. */
enum { EVEN_LENGTH = 1024, UNEVEN_LENGTH = 1000, THD_MAX_S = 1024 };
enum { WINDOW_LEFT = 128, WINDOW_RIGHT = 0 };

const char cli_dtype_names[] = "bf16,fp16";
const char cli_mask_names[] = "none,causal_tl,causal_br,window";
const char cli_layout_names[] = "bshd,thd";
const char cli_lse_names[] = "packed,strided";
const char cli_dq_names[] = "main,convert";
const char cli_tiles_names[] = "default,small";

typedef struct named_value {
  const char *name;
  int value;
} named_value;

static const named_value dtypes[] = {
    {"bf16", SDPA_DTYPE_BF16}, {"fp16", SDPA_DTYPE_FP16}, {NULL, 0}};
static const named_value masks[] = {
    {"none", SDPA_MASK_NONE},
    {"causal_tl", SDPA_MASK_CAUSAL_TOP_LEFT},
    {"causal_br", SDPA_MASK_CAUSAL_BOTTOM_RIGHT},
    {"window", SDPA_MASK_SLIDING_WINDOW},
    {NULL, 0}};
static const named_value layouts[] = {
    {"bshd", SDPA_LAYOUT_BSHD}, {"thd", SDPA_LAYOUT_THD}, {NULL, 0}};
static const named_value lse_classes[] = {
    {"packed", 0}, {"strided", 1}, {NULL, 0}};
static const named_value dq_writers[] = {
    {"main", 1}, {"convert", 0}, {NULL, 0}};
static const named_value tile_classes[] = {
    {"default", 0}, {"small", 1}, {NULL, 0}};

/* The name of `value` in `table`, or "?". */
static const char *name_of(const named_value *table, int value) {
  for (; table->name; table++)
    if (table->value == value) return table->name;
  return "?";
}

/* Appends `value` to `list` unless present. Returns 0, or -1 when full. */
static int list_add(cli_list *list, int value) {
  for (size_t i = 0; i < list->count; i++)
    if (list->values[i] == value) return 0;
  if (list->count == CLI_LIST_MAX) return -1;
  list->values[list->count++] = value;
  return 0;
}

/* Splits `text` on commas (spaces around items ignored) and calls `item`
 * on each. Returns NULL, or the message of the first item that fails, or
 * `empty_message` for an empty list or item. */
typedef const char *(*item_fn)(const char *item, const void *context,
                               cli_list *out);

static const char *parse_list(const char *text, item_fn item,
                              const void *context, const char *empty_message,
                              cli_list *out) {
  char buf[64];
  out->count = 0;
  const char *p = text;
  for (;;) {
    while (isspace((unsigned char)*p)) p++;
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n > 0 && isspace((unsigned char)p[n - 1])) n--;
    if (n == 0 || n >= sizeof buf) return empty_message;
    memcpy(buf, p, n);
    buf[n] = '\0';
    const char *error = item(buf, context, out);
    if (error) return error;
    if (!end) return NULL;
    p = end + 1;
  }
}

typedef struct int_range {
  int min, max;
  const char *message;
} int_range;

static const char *int_item(const char *item, const void *context,
                            cli_list *out) {
  const int_range *range = context;
  errno = 0;
  char *stop = NULL;
  long v = strtol(item, &stop, 10);
  if (errno || *stop || v < range->min || v > range->max)
    return range->message;
  return list_add(out, (int)v) == 0 ? NULL : "too many values in the list";
}

typedef struct name_table {
  const named_value *table;
  const char *message;
} name_table;

static const char *name_item(const char *item, const void *context,
                             cli_list *out) {
  const name_table *names = context;
  for (const named_value *n = names->table; n->name; n++)
    if (strcmp(n->name, item) == 0)
      return list_add(out, n->value) == 0 ? NULL
                                          : "too many values in the list";
  return names->message;
}

const char *cli_list_parse_ints(const char *text, int min, int max,
                                cli_list *out) {
  static char message[96];
  snprintf(message, sizeof message,
           "expected a comma list of integers from %d to %d", min, max);
  int_range range = {min, max, message};
  return parse_list(text, int_item, &range, message, out);
}

const char *cli_list_parse_dtypes(const char *text, cli_list *out) {
  static const name_table names = {dtypes,
                                   "expected a comma list of bf16, fp16"};
  return parse_list(text, name_item, &names, names.message, out);
}

const char *cli_list_parse_masks(const char *text, cli_list *out) {
  static const name_table names = {
      masks, "expected a comma list of none, causal_tl, causal_br, window"};
  return parse_list(text, name_item, &names, names.message, out);
}

const char *cli_list_parse_layouts(const char *text, cli_list *out) {
  static const name_table names = {layouts,
                                   "expected a comma list of bshd, thd"};
  return parse_list(text, name_item, &names, names.message, out);
}

const char *cli_list_parse_lse(const char *text, cli_list *out) {
  static const name_table names = {
      lse_classes, "expected a comma list of packed, strided"};
  return parse_list(text, name_item, &names, names.message, out);
}

const char *cli_list_parse_dq(const char *text, cli_list *out) {
  static const name_table names = {
      dq_writers, "expected a comma list of main, convert"};
  return parse_list(text, name_item, &names, names.message, out);
}

const char *cli_list_parse_tiles(const char *text, cli_list *out) {
  static const name_table names = {
      tile_classes, "expected a comma list of default, small"};
  return parse_list(text, name_item, &names, names.message, out);
}

/* Sets `list` to `values` when it is empty. */
static void default_list(cli_list *list, const int *values, size_t count) {
  if (list->count) return;
  for (size_t i = 0; i < count; i++) list_add(list, values[i]);
}

void cli_grid_fill_defaults(cli_grid *grid, int arch, int also_uneven) {
  static const int dtype_defaults[] = {SDPA_DTYPE_BF16, SDPA_DTYPE_FP16};
  static const int head_dim_defaults[] = {64, 128};
  static const int mask_defaults[] = {SDPA_MASK_NONE,
                                      SDPA_MASK_CAUSAL_BOTTOM_RIGHT};
  static const int layout_defaults[] = {SDPA_LAYOUT_BSHD, SDPA_LAYOUT_THD};
  static const int zero[] = {0};
  static const int even_defaults[] = {1, 0};
  static const int dq_defaults[] = {0};
  static const int tiles_defaults[] = {0, 1};
  default_list(&grid->arch, &arch, 1);
  default_list(&grid->dtype, dtype_defaults, 2);
  default_list(&grid->head_dim, head_dim_defaults, 2);
  default_list(&grid->mask, mask_defaults, 2);
  default_list(&grid->layout, layout_defaults, 2);
  default_list(&grid->lse_strided, zero, 1);
  default_list(&grid->deterministic, zero, 1);
  default_list(&grid->even, even_defaults, also_uneven ? 2 : 1);
  default_list(&grid->dq_main, dq_defaults, 1);
  default_list(&grid->tiles, tiles_defaults, 2);
}

enum { LISTS = 10 };

/* The lists in the order points are enumerated (last varies fastest). */
static void grid_lists(const cli_grid *grid, const cli_list *lists[LISTS]) {
  lists[0] = &grid->arch;
  lists[1] = &grid->dtype;
  lists[2] = &grid->head_dim;
  lists[3] = &grid->layout;
  lists[4] = &grid->mask;
  lists[5] = &grid->even;
  lists[6] = &grid->lse_strided;
  lists[7] = &grid->deterministic;
  lists[8] = &grid->dq_main;
  lists[9] = &grid->tiles;
}

size_t cli_grid_size(const cli_grid *grid) {
  const cli_list *lists[LISTS];
  grid_lists(grid, lists);
  size_t size = 1;
  for (int i = 0; i < LISTS; i++) size *= lists[i]->count;
  return size;
}

int cli_grid_point_at(const cli_grid *grid, size_t index,
                      cli_grid_point *out) {
  const cli_list *lists[LISTS];
  int picked[LISTS];
  size_t positions[LISTS];
  grid_lists(grid, lists);
  for (int i = LISTS - 1; i >= 0; i--) {
    positions[i] = index % lists[i]->count;
    picked[i] = lists[i]->values[positions[i]];
    index /= lists[i]->count;
  }
  out->arch = picked[0];
  out->dtype = (sdpa_dtype)picked[1];
  out->head_dim = picked[2];
  out->head_dim_v = grid->head_dim_v ? grid->head_dim_v : picked[2];
  out->layout = (sdpa_layout)picked[3];
  out->mask = (sdpa_mask)picked[4];
  out->even = out->layout == SDPA_LAYOUT_THD ? -1 : picked[5];
  out->lse_strided = picked[6];
  out->deterministic = picked[7];
  out->dq_main = picked[8];
  out->small = picked[9];
  out->any_head_dim = grid->any_head_dim;
  return (out->layout == SDPA_LAYOUT_THD && positions[5] > 0) ||
         (out->small && (out->layout == SDPA_LAYOUT_THD || out->deterministic));
}

void cli_grid_options(const cli_grid_point *point, sdpa_bwd_plan_options *out) {
  const sdpa_bwd_plan_options init = SDPA_BWD_PLAN_OPTIONS_INIT;
  *out = init;
  out->dq_writer = point->dq_main ? SDPA_DQ_MAIN : SDPA_DQ_CONVERT;
  if (point->any_head_dim) out->any_head_dim = SDPA_SWITCH_ON;
}

void cli_grid_desc(const cli_grid_point *point, sdpa_bwd_desc *out) {
  sdpa_bwd_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.version = SDPA_BWD_DESC_VERSION;
  desc.dtype = point->dtype;
  desc.layout = point->layout;
  desc.heads_q = desc.heads_kv = 1;
  if (point->layout == SDPA_LAYOUT_THD) {
    desc.batch = 1;
    desc.seqlen_q = desc.seqlen_kv = THD_MAX_S;
  } else {
    /* 8 blocks of 128 kv rows (small) or 512 (default) */
    desc.batch = point->small ? 1 : 64;
    desc.seqlen_q = desc.seqlen_kv = point->even ? EVEN_LENGTH : UNEVEN_LENGTH;
  }
  desc.head_dim = point->head_dim;
  desc.head_dim_v = point->head_dim_v;
  desc.mask = point->mask;
  if (point->mask == SDPA_MASK_SLIDING_WINDOW) {
    desc.window_left = WINDOW_LEFT;
    desc.window_right = WINDOW_RIGHT;
  }
  if (point->lse_strided) {
    /* Every other float: [b, h, s] with s stride 2 (THD: [h, t]). */
    int64_t rows = (int64_t)desc.batch * desc.seqlen_q;
    desc.lse.seq = 2;
    desc.lse.head = 2 * (point->layout == SDPA_LAYOUT_THD ? rows
                                                          : desc.seqlen_q);
    desc.lse.batch = point->layout == SDPA_LAYOUT_THD
                         ? 0
                         : desc.lse.head * desc.heads_q;
  }
  desc.deterministic = point->deterministic;
  desc.arch = point->arch;
  *out = desc;
}

void cli_grid_describe(const cli_grid_point *point, char *buf, size_t size) {
  char even[24];
  if (point->even < 0)
    snprintf(even, sizeof even, "%s", "");
  else
    snprintf(even, sizeof even, " even=%d", point->even);
  snprintf(buf, size,
           "arch=%d dtype=%s hd=%d hdv=%d mask=%s layout=%s lse=%s det=%d%s dq=%s "
           "tiles=%s",
           point->arch, name_of(dtypes, point->dtype), point->head_dim,
           point->head_dim_v, name_of(masks, point->mask),
           name_of(layouts, point->layout),
           name_of(lse_classes, point->lse_strided), point->deterministic,
           even, name_of(dq_writers, point->dq_main),
           name_of(tile_classes, point->small));
}
