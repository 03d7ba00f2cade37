/*
 * key_fields.h — the specialization key's fields, listed once.
 *
 * Every field selects different code. From this one list come the key
 * struct (sdpa_key_fields), the canonical key text (key.c), the NVRTC
 * defines of the translation unit (instantiate.c), the cache's readable
 * columns (written by cache_rows.c, read back into sdpa_cache_entry by
 * cache_inspect.c; cache/schema.sql declares them and
 * tests/test_cpu_key.c checks the two agree) and the fields `sdpa-jit
 * show` prints. Adding a field is one line here, its column in
 * schema.sql (with a migration step in cache_file.c) and its member in
 * sdpa_cache_entry.
 *
 * X(member, text, column, kind, define, entry):
 *   member  the int member of sdpa_key_fields
 *   text    its name in the key text ("hd=128")
 *   column  its column in the cache's kernels table
 *   kind    how its value is written: INT (a number), BOOL (0/1) or a
 *           named kind (DTYPE, FAMILY, LSE, LAYOUT, MASK, DQ) whose names
 *           key.c gives; named kinds are TEXT columns, the others INTEGER
 *   define  the translation unit's #define (its value: sdpa_key_define)
 *   entry   the member of sdpa_cache_entry that shows it
 */
#ifndef SDPA_KEY_FIELDS_H
#define SDPA_KEY_FIELDS_H

#define SDPA_KEY_FIELDS(X)                                                          \
  X(arch, "arch", "arch", INT, "SDPA_ARCH", arch)                                   \
  X(family, "family", "family", FAMILY, "SDPA_FAMILY", family)                      \
  X(dtype, "dtype", "dtype", DTYPE, "SDPA_DTYPE", dtype)                            \
  X(head_dim, "hd", "head_dim", INT, "SDPA_HEAD_DIM", head_dim)                     \
  X(head_dim_v, "hdv", "head_dim_v", INT, "SDPA_HEAD_DIM_V", head_dim_v)            \
  X(q_tile, "qt", "q_tile", INT, "SDPA_Q_TILE", q_tile)                             \
  X(kv_tile, "kvt", "kv_tile", INT, "SDPA_KV_TILE", kv_tile)                        \
  X(warps, "warps", "warps", INT, "SDPA_WARPS", warps)                              \
  X(stages, "stages", "stages", INT, "SDPA_STAGES", stages)                         \
  X(lse_packed, "lse", "lse", LSE, "SDPA_LSE_PACKED", lse)                          \
  X(layout, "layout", "layout", LAYOUT, "SDPA_LAYOUT", layout)                      \
  X(mask, "mask", "mask", MASK, "SDPA_MASK", mask)                                  \
  X(deterministic, "det", "deterministic", BOOL, "SDPA_DETERMINISTIC", deterministic) \
  X(even, "even", "even", BOOL, "SDPA_EVEN", even)                                  \
  X(fold_dq, "dq", "dq", DQ, "SDPA_FOLD_DQ", dq)

/* The fields that enter the key (values as the descriptor's enums, and
 * 0/1 flags: lse_packed = LSE seq stride 1, even = BSHD lengths multiples
 * of the tiles, fold_dq = the main kernel writes dQ). */
typedef struct sdpa_key_fields {
#define SDPA_KEY_MEMBER(member, text, column, kind, define, entry) int member;
  SDPA_KEY_FIELDS(SDPA_KEY_MEMBER)
#undef SDPA_KEY_MEMBER
} sdpa_key_fields;

/* How a field's kind is stored in the cache: 1 TEXT (a name), 0 INTEGER. */
#define SDPA_KEY_KIND_TEXT_INT 0
#define SDPA_KEY_KIND_TEXT_BOOL 0
#define SDPA_KEY_KIND_TEXT_DTYPE 1
#define SDPA_KEY_KIND_TEXT_FAMILY 1
#define SDPA_KEY_KIND_TEXT_LSE 1
#define SDPA_KEY_KIND_TEXT_LAYOUT 1
#define SDPA_KEY_KIND_TEXT_MASK 1
#define SDPA_KEY_KIND_TEXT_DQ 1
#define SDPA_KEY_KIND_IS_TEXT(kind) SDPA_KEY_KIND_TEXT_##kind

/* Named kinds, as numbers for key.c's name tables. */
typedef enum sdpa_key_kind {
  SDPA_KEY_KIND_INT,
  SDPA_KEY_KIND_BOOL,
  SDPA_KEY_KIND_DTYPE,
  SDPA_KEY_KIND_FAMILY,
  SDPA_KEY_KIND_LSE,
  SDPA_KEY_KIND_LAYOUT,
  SDPA_KEY_KIND_MASK,
  SDPA_KEY_KIND_DQ
} sdpa_key_kind;

/* The number of key fields. */
enum {
#define SDPA_KEY_COUNT_ONE(member, text, column, kind, define, entry) sdpa_key_index_##member,
  SDPA_KEY_FIELDS(SDPA_KEY_COUNT_ONE)
#undef SDPA_KEY_COUNT_ONE
  SDPA_KEY_FIELD_COUNT
};

#endif /* SDPA_KEY_FIELDS_H */
