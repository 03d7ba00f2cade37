/*
 * cache_inspect.c — the public inspection and maintenance calls: walk and
 * list the rows, find one by hash, prefix or key text, read its cubin,
 * totals, verify, prune.
 *
 * Every scan reads through connections of its own (read-only, made per
 * call), so the lookups of other threads never wait for it, and holds one
 * row at a time: `ls` on a million-row cache streams (a k-way merge of
 * the layers' rows in "most recently used first" order), `show` reads at
 * most a few rows through the primary key's range. Only verify's and
 * prune's writes go through the user's write connection (write_lock).
 * The readable columns come from key_fields.h; a layer of the first
 * layout reads NULL for the columns it lacks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache_internal.h"

/* ----------------------------------------------------------- entries */

/* The select list of an entry over `db`: the fixed columns, then the key
 * columns of key_fields.h (NULL where the file lacks one). malloc'd. */
static char *entry_select(sqlite3 *db) {
  static const char *const columns[] = {
#define COLUMN_NAME(member, text, column, kind, define, entry) column,
      SDPA_KEY_FIELDS(COLUMN_NAME)
#undef COLUMN_NAME
  };
  char *sql = NULL;
  size_t size = 0;
  FILE *out = open_memstream(&sql, &size);
  if (!out) return NULL;
  fputs("SELECT key_hash, key_text, nvrtc_version, length(cubin), compile_ms, created, "
        "last_used, hits",
        out);
  for (size_t i = 0; i < sizeof columns / sizeof columns[0]; i++)
    fprintf(out, ", %s", cache_has_column(db, columns[i]) ? columns[i] : "NULL");
  fputs(" FROM kernels", out);
  if (fclose(out) != 0) {
    free(sql);
    return NULL;
  }
  return sql;
}
enum { ENTRY_FIXED = 8 }; /* columns before the key columns */

/* strdup of a text column; NULL for NULL (and out of memory). */
static char *column_text(sqlite3_stmt *stmt, int column, int *oom) {
  const char *text = (const char *)sqlite3_column_text(stmt, column);
  if (!text) return NULL;
  char *copy = strdup(text);
  if (!copy) *oom = 1;
  return copy;
}

static int column_number(sqlite3_stmt *stmt, int column) {
  return sqlite3_column_type(stmt, column) == SQLITE_NULL ? -1
                                                         : sqlite3_column_int(stmt, column);
}

/* The key columns of an entry are ints or names (const char *): each
 * per-field step below picks its helper by the member's type. */
static void fill_text(const char **dst, sqlite3_stmt *stmt, int col, int *oom) {
  *dst = column_text(stmt, col, oom);
}
static void fill_number(int *dst, sqlite3_stmt *stmt, int col, int *oom) {
  (void)oom;
  *dst = column_number(stmt, col);
}
#define FILL_FIELD(dst, stmt, col, oom)                                       \
  _Generic((dst), const char **: fill_text, int *: fill_number)(dst, stmt, col, oom)

static void free_text(const char **p) { free((void *)*p); }
static void free_number(int *p) { (void)p; }
#define FREE_FIELD(p) _Generic((p), const char **: free_text, int *: free_number)(p)

static void clear_text(const char **p) { *p = NULL; }
static void clear_number(int *p) { (void)p; }
#define CLEAR_FIELD(p) _Generic((p), const char **: clear_text, int *: clear_number)(p)

static void dup_text(const char **dst, const char *const *src, int *oom) {
  if (*src && !(*dst = strdup(*src))) *oom = 1;
}
static void dup_number(int *dst, const int *src, int *oom) { (void)dst, (void)src, (void)oom; }
#define DUP_FIELD(dst, src, oom)                                              \
  _Generic((dst), const char **: dup_text, int *: dup_number)(dst, src, oom)

/* Frees the strings one entry owns (not the entry itself). */
static void entry_strings_free(sdpa_cache_entry *e) {
  free((void *)e->key_text);
  free((void *)e->nvrtc_version);
#define FREE_ONE(member, text, column, kind, define, entry) FREE_FIELD(&e->entry);
  SDPA_KEY_FIELDS(FREE_ONE)
#undef FREE_ONE
}

void sdpa_cache_free_entries(sdpa_cache_entry *entries, size_t count) {
  if (!entries) return;
  for (size_t i = 0; i < count; i++) entry_strings_free(&entries[i]);
  free(entries);
}

/* Fills `e` from a row of entry_select, with its row's hits in `pending`
 * (a snapshot of those counted in memory) added. Returns 0, or -1 out of
 * memory (e cleared). */
static int entry_from_row(sqlite3_stmt *stmt, const cache_layer *layer,
                          const hit_snapshot *pending, sdpa_cache_entry *e) {
  int oom = 0, col = ENTRY_FIXED;
  memset(e, 0, sizeof *e);
  const char *hash = (const char *)sqlite3_column_text(stmt, 0);
  snprintf(e->key_hash, sizeof e->key_hash, "%s", hash ? hash : "");
  e->key_text = column_text(stmt, 1, &oom);
  e->nvrtc_version = column_text(stmt, 2, &oom);
  e->cubin_bytes = cache_count_add(sqlite3_column_int64(stmt, 3), 0);
  e->compile_ms = sqlite3_column_double(stmt, 4);
  e->created = sqlite3_column_int64(stmt, 5);
  e->last_used = sqlite3_column_int64(stmt, 6);
  e->hits = cache_count_add(sqlite3_column_int64(stmt, 7), 0);
#define FILL_ONE(member, text, column, kind, define, entry)                   \
  FILL_FIELD(&e->entry, stmt, col, &oom);                                     \
  col++;
  SDPA_KEY_FIELDS(FILL_ONE)
#undef FILL_ONE
  e->readonly = layer->shipped;
  if (oom) {
    entry_strings_free(e);
    memset(e, 0, sizeof *e);
    return -1;
  }
  const sdpa_source source = layer->shipped ? SDPA_SOURCE_SHIPPED : SDPA_SOURCE_DISK;
  const hit_record *r = cache_hits_find(pending, e->key_hash, source);
  if (r) {
    e->hits = cache_count_add(e->hits, r->hits);
    if (r->last_used > e->last_used) e->last_used = r->last_used;
  }
  return 0;
}

/* The status of a failed read of an inspection call on `layer`. */
static sdpa_status read_error(const cache_layer *layer, sqlite3 *db, int rc) {
  if ((rc & 0xff) == SQLITE_NOMEM)
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                          "out of host memory reading the kernel cache %s", layer->path);
  return sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                        "could not read the %skernel cache %s: %s%s",
                        layer->shipped ? "shipped " : "", layer->path,
                        db ? sqlite3_errmsg(db) : sqlite3_errstr(rc),
                        cache_is_damage(rc) ? " (run `sdpa-jit verify` to recover it)" : "");
}

/* A fresh read-only connection to `layer` for one scan. Returns 0 when the
 * layer is not open (skip it), else 1 with *rc the code of connecting. */
static int open_layer(sdpa_cache *cache, const cache_layer *layer, sqlite3 **db, int *rc) {
  pthread_mutex_lock(&cache->read_lock);
  const int open = layer->db != NULL;
  pthread_mutex_unlock(&cache->read_lock);
  *db = NULL;
  *rc = SQLITE_OK;
  if (!open) return 0;
  *rc = cache_layer_connect(cache, layer, db);
  return 1;
}

/* Where a row falls in a walk: most recently used first, then newest,
 * then by hash, then by layer (lookup order: shipped layers first). */
typedef struct walk_place {
  int64_t last_used, created;
  const char *hash;
  size_t layer;
} walk_place;

static int place_before(const walk_place *a, const walk_place *b) {
  if (a->last_used != b->last_used) return a->last_used > b->last_used;
  if (a->created != b->created) return a->created > b->created;
  int c = strcmp(a->hash, b->hash);
  if (c) return c < 0;
  return a->layer < b->layer;
}

/* One layer's cursor of the merged walk. Its connection holds one read
 * transaction for the walk, so its two statements see the same rows. */
typedef struct cursor {
  cache_layer *layer;
  sdpa_source source;
  sqlite3 *db;
  sqlite3_stmt *stmt; /* the layer's rows by last_used in the file       */
  sqlite3_stmt *one;  /* one row by key_hash (the rows moved ahead)      */
  int live;           /* stmt is on a row                                */
} cursor;

/* A row whose pending hits are newer than the last_used its file holds:
 * the walk reports it at its last use, ahead of its place in the file. */
typedef struct moved_row {
  walk_place place; /* place.hash points at hash                          */
  char hash[33];
} moved_row;

static int moved_order(const void *a, const void *b) {
  const moved_row *x = a, *y = b;
  return place_before(&x->place, &y->place) ? -1 : place_before(&y->place, &x->place);
}

/* Whether the row `stmt` is on has moved ahead (see moved_row). */
static int row_moved(const hit_snapshot *pending, sqlite3_stmt *stmt, sdpa_source source) {
  const char *hash = (const char *)sqlite3_column_text(stmt, 0);
  const hit_record *r = hash ? cache_hits_find(pending, hash, source) : NULL;
  return r && r->last_used > sqlite3_column_int64(stmt, 6);
}

/* Steps cursor `c` past the rows that moved ahead. Returns SQLITE_OK (row
 * or end) or an error code. */
static int advance(cursor *c, const hit_snapshot *pending) {
  int rc;
  while ((rc = sqlite3_step(c->stmt)) == SQLITE_ROW && row_moved(pending, c->stmt, c->source)) {
  }
  c->live = rc == SQLITE_ROW;
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Opens layer `index`'s cursor: its read transaction, its statements, and
 * the rows of it that moved ahead, appended to *moved. Returns an SQLite
 * code (SQLITE_NOMEM when *moved cannot grow). */
static int open_cursor(cursor *c, size_t index, const hit_snapshot *pending,
                       moved_row **moved, size_t *moved_count) {
  char *select = entry_select(c->db), *all = NULL, *one = NULL;
  int rc = select ? SQLITE_OK : SQLITE_NOMEM;
  if (rc == SQLITE_OK &&
      (asprintf(&all, "%s ORDER BY last_used DESC, created DESC, key_hash", select) < 0 ||
       asprintf(&one, "%s WHERE key_hash = ?1", select) < 0))
    rc = SQLITE_NOMEM;
  if (rc == SQLITE_OK) rc = sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(c->db, all, -1, &c->stmt, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(c->db, one, -1, &c->one, NULL);
  for (size_t i = 0; i < pending->count && rc == SQLITE_OK; i++) {
    const hit_record *r = &pending->records[i];
    if (r->source != c->source) continue;
    sqlite3_bind_text(c->one, 1, r->hash, -1, SQLITE_STATIC);
    rc = sqlite3_step(c->one);
    if (rc == SQLITE_ROW && r->last_used > sqlite3_column_int64(c->one, 6)) {
      void *grown = realloc(*moved, (*moved_count + 1) * sizeof **moved);
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      *moved = grown;
      moved_row *m = &(*moved)[(*moved_count)++];
      memcpy(m->hash, r->hash, 33);
      m->place = (walk_place){r->last_used, sqlite3_column_int64(c->one, 5), NULL, index};
    }
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
    sqlite3_reset(c->one);
  }
  if (rc == SQLITE_OK) rc = advance(c, pending);
  free(select);
  free(all);
  free(one);
  return rc;
}

/* The walk of sdpa_cache_foreach_entry: the layers' rows in the order of
 * walk_place, by the last use each reports. A row's pending hits (counted
 * in memory since they were last written) can make it more recent than
 * its file says; those rows, few, are found first and merged in from a
 * list, the others stream from each layer in the file's order. */
sdpa_status sdpa_cache_foreach_entry(sdpa_cache *cache, sdpa_cache_entry_fn fn, void *user) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  const size_t n = cache_layer_count(cache);
  hit_snapshot pending;
  moved_row *moved = NULL;
  size_t moved_count = 0, next_moved = 0;
  cursor *cursors = calloc(n ? n : 1, sizeof *cursors);
  if (!cursors || cache_hits_snapshot(&cache->hits, &pending) != 0) {
    free(cursors);
    return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "out of host memory listing the cache");
  }
  for (size_t i = 0; i < n && !status; i++) {
    cursor *c = &cursors[i];
    c->layer = cache_layer_at(cache, i);
    c->source = c->layer->shipped ? SDPA_SOURCE_SHIPPED : SDPA_SOURCE_DISK;
    int rc;
    if (!open_layer(cache, c->layer, &c->db, &rc)) continue;
    if (rc == SQLITE_OK) rc = open_cursor(c, i, &pending, &moved, &moved_count);
    if (rc != SQLITE_OK) status = read_error(c->layer, c->db, rc);
  }
  for (size_t i = 0; i < moved_count; i++) moved[i].place.hash = moved[i].hash;
  if (moved_count > 1) qsort(moved, moved_count, sizeof *moved, moved_order);
  while (!status) {
    cursor *next = NULL;
    walk_place best = {0}, here;
    for (size_t i = 0; i < n; i++) {
      if (!cursors[i].live) continue;
      const char *hash = (const char *)sqlite3_column_text(cursors[i].stmt, 0);
      here = (walk_place){sqlite3_column_int64(cursors[i].stmt, 6),
                          sqlite3_column_int64(cursors[i].stmt, 5), hash ? hash : "", i};
      if (!next || place_before(&here, &best)) next = &cursors[i], best = here;
    }
    sqlite3_stmt *row = next ? next->stmt : NULL;
    if (next_moved < moved_count && (!next || place_before(&moved[next_moved].place, &best))) {
      next = &cursors[moved[next_moved].place.layer];
      row = next->one;
      sqlite3_bind_text(row, 1, moved[next_moved++].hash, -1, SQLITE_TRANSIENT);
      int rc = sqlite3_step(row);
      if (rc == SQLITE_DONE) { /* gone: not within the read transaction, skipped if so */
        sqlite3_reset(row);
        continue;
      }
      if (rc != SQLITE_ROW) {
        status = read_error(next->layer, next->db, rc);
        break;
      }
    }
    if (!next) break;
    sdpa_cache_entry entry;
    const int failed = entry_from_row(row, next->layer, &pending, &entry);
    int rc = SQLITE_OK;
    if (row == next->one) sqlite3_reset(row);
    if (failed) {
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory listing the cache");
      break;
    }
    const int stop = fn(&entry, user);
    entry_strings_free(&entry);
    if (stop) break;
    if (row == next->stmt) rc = advance(next, &pending);
    if (rc != SQLITE_OK) status = read_error(next->layer, next->db, rc);
  }
  for (size_t i = 0; i < n; i++) {
    sqlite3_finalize(cursors[i].stmt);
    sqlite3_finalize(cursors[i].one);
    sqlite3_close_v2(cursors[i].db); /* ends the read transaction */
  }
  free(cursors);
  free(moved);
  cache_hits_snapshot_free(&pending);
  return status;
}

/* Collects entries into a growing array (sdpa_cache_list_entries). */
typedef struct collector {
  sdpa_cache_entry *entries;
  size_t used, capacity;
  int oom;
} collector;

static int collect(const sdpa_cache_entry *e, void *user) {
  collector *c = user;
  if (c->used == c->capacity) {
    size_t grown = c->capacity ? c->capacity * 2 : 16;
    void *p = realloc(c->entries, grown * sizeof *c->entries);
    if (!p) return c->oom = 1;
    c->entries = p;
    c->capacity = grown;
  }
  sdpa_cache_entry *copy = &c->entries[c->used];
  int oom = 0;
  *copy = *e; /* the numbers; every string cleared, then copied */
  CLEAR_FIELD(&copy->key_text);
  CLEAR_FIELD(&copy->nvrtc_version);
#define CLEAR_ONE(member, text, column, kind, define, entry) CLEAR_FIELD(&copy->entry);
  SDPA_KEY_FIELDS(CLEAR_ONE)
#undef CLEAR_ONE
  DUP_FIELD(&copy->key_text, &e->key_text, &oom);
  DUP_FIELD(&copy->nvrtc_version, &e->nvrtc_version, &oom);
#define DUP_ONE(member, text, column, kind, define, entry)                    \
  DUP_FIELD(&copy->entry, &e->entry, &oom);
  SDPA_KEY_FIELDS(DUP_ONE)
#undef DUP_ONE
  if (oom) {
    entry_strings_free(copy); /* the copies made; the rest are NULL */
    return c->oom = 1;
  }
  c->used++;
  return 0;
}

sdpa_status sdpa_cache_list_entries(sdpa_cache *cache, sdpa_cache_entry **out,
                                    size_t *count) {
  collector c = {NULL, 0, 0, 0};
  if (!cache || !out || !count)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_list_entries: cache, out and count must not be "
                          "NULL");
  *out = NULL;
  *count = 0;
  sdpa_status status = sdpa_cache_foreach_entry(cache, collect, &c);
  if (status == SDPA_STATUS_SUCCESS && c.oom)
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "out of host memory listing the cache");
  if (status != SDPA_STATUS_SUCCESS) {
    sdpa_cache_free_entries(c.entries, c.used);
    return status;
  }
  *out = c.used ? c.entries : NULL;
  if (!c.used) free(c.entries);
  *count = c.used;
  return SDPA_STATUS_SUCCESS;
}

/* ------------------------------------------------------------- finding */

/* Finds the row `key` names: a full 32-digit hash, a unique prefix of at
 * least 6 hex digits (a range of the primary key: reads the matches
 * only), or the full key text (the most recently used row of the first
 * layer that has it). Layers in lookup order. On success *layer_index and
 * `hash`. */
static sdpa_status find_key(sdpa_cache *cache, const char *key, size_t *layer_index,
                            char hash[33]) {
  size_t length = key ? strlen(key) : 0;
  int hex = length > 0;
  char low[34] = "", high[34] = "";
  char found[2][33];
  size_t distinct = 0, first_layer = 0;
  int64_t matches = 0;
  sdpa_status status = SDPA_STATUS_SUCCESS;

  if (!key || !key[0])
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "the cache key is empty; give a key hash, a prefix of at least "
                          "6 hex digits, or the full key text");
  for (size_t i = 0; i < length && hex; i++) hex = cache_is_hex(key[i]);
  if (hex) {
    if (length < 6 || length > 32)
      return sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                            "no cache entry matches '%s': a key hash has 32 hex digits "
                            "and a prefix needs at least 6",
                            key);
    for (size_t i = 0; i < length; i++)
      low[i] = (key[i] >= 'A' && key[i] <= 'F') ? (char)(key[i] - 'A' + 'a') : key[i];
    low[length] = '\0';
    snprintf(high, sizeof high, "%s~", low); /* '~' sorts after every hex digit */
  }
  const char *sql = hex ? "SELECT key_hash FROM kernels WHERE key_hash >= ?1 AND "
                          "key_hash < ?2 ORDER BY key_hash"
                        : "SELECT key_hash FROM kernels WHERE key_text = ?1 "
                          "ORDER BY last_used DESC, created DESC LIMIT 1";
  for (size_t i = 0; i < cache_layer_count(cache) && !status; i++) {
    cache_layer *layer = cache_layer_at(cache, i);
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    int rc;
    if (!open_layer(cache, layer, &db, &rc)) continue;
    if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(stmt, 1, hex ? low : key, -1, SQLITE_STATIC);
      if (hex) sqlite3_bind_text(stmt, 2, high, -1, SQLITE_STATIC);
    }
    while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      rc = SQLITE_OK;
      const char *h = (const char *)sqlite3_column_text(stmt, 0);
      if (!h || strlen(h) != 32) continue;
      if (distinct > 0 && strcmp(found[0], h) == 0) continue; /* the same row in a layer after */
      if (distinct > 1 && strcmp(found[1], h) == 0) continue;
      matches++;
      if (distinct < 2) {
        if (distinct == 0) first_layer = i;
        memcpy(found[distinct++], h, 33);
      }
    }
    if (rc != SQLITE_OK && rc != SQLITE_DONE) status = read_error(layer, db, rc);
    sqlite3_finalize(stmt);
    sqlite3_close_v2(db);
    if (distinct > 0 && (!hex || length == 32)) break;
  }
  if (status) return status;
  if (distinct == 0)
    return sdpa_error_set(SDPA_STATUS_NOT_FOUND,
                          "no cache entry matches '%s'; give a key hash, a prefix of at "
                          "least 6 hex digits, or the full key text (`sdpa-jit ls` lists "
                          "them)",
                          key);
  if (distinct > 1)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "the key prefix '%s' matches %lld cache entries (%s, %s%s); "
                          "give more hex digits",
                          key, (long long)matches, found[0], found[1],
                          matches > 2 ? ", ..." : "");
  *layer_index = first_layer;
  memcpy(hash, found[0], 33);
  return SDPA_STATUS_SUCCESS;
}

sdpa_status sdpa_cache_get_entry(sdpa_cache *cache, const char *key, sdpa_cache_entry **out) {
  sqlite3 *db = NULL;
  sqlite3_stmt *stmt = NULL;
  char *select = NULL, *sql = NULL;
  size_t index = 0;
  char hash[33];
  if (!cache || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get_entry: cache and out must not be NULL");
  *out = NULL;
  sdpa_status status = find_key(cache, key, &index, hash);
  if (status) return status;
  cache_layer *layer = cache_layer_at(cache, index);
  int rc = cache_layer_connect(cache, layer, &db);
  if (rc == SQLITE_OK && (!(select = entry_select(db)) ||
                          asprintf(&sql, "%s WHERE key_hash = ?1", select) < 0)) {
    sql = NULL;
    rc = SQLITE_NOMEM;
  }
  if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(stmt, 1, hash, -1, SQLITE_STATIC);
    rc = sqlite3_step(stmt);
  }
  if (rc == SQLITE_ROW) {
    hit_snapshot pending;
    sdpa_cache_entry *entry = malloc(sizeof *entry);
    const int snapped = cache_hits_snapshot(&cache->hits, &pending) == 0;
    if (!entry || !snapped || entry_from_row(stmt, layer, &pending, entry) != 0) {
      free(entry);
      status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY,
                              "out of host memory reading cache entry %s", hash);
    } else {
      *out = entry;
    }
    cache_hits_snapshot_free(&pending);
  } else if (rc == SQLITE_DONE) {
    status = sdpa_error_set(SDPA_STATUS_NOT_FOUND, "cache entry %s was removed meanwhile",
                            hash);
  } else {
    status = read_error(layer, db, rc);
  }
  sqlite3_finalize(stmt);
  sqlite3_close_v2(db);
  free(select);
  free(sql);
  return status;
}

sdpa_status sdpa_cache_read_cubin(sdpa_cache *cache, const char *key, void **out,
                                  size_t *size) {
  sqlite3 *db = NULL;
  size_t index = 0;
  char hash[33], why[512] = "";
  row_verdict verdict = ROW_MISSING;
  if (!cache || !out || !size)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_read_cubin: cache, out and size must not be NULL");
  *out = NULL;
  *size = 0;
  sdpa_status status = find_key(cache, key, &index, hash);
  if (status) return status;
  cache_layer *layer = cache_layer_at(cache, index);
  int rc = cache_layer_connect(cache, layer, &db);
  if (rc == SQLITE_OK)
    rc = cache_row_fetch(cache, db, hash, NULL, NULL, NULL, out, size, &verdict, why,
                         sizeof why);
  if (rc != SQLITE_OK)
    status = read_error(layer, db, rc);
  else if (verdict == ROW_MISSING)
    status = sdpa_error_set(SDPA_STATUS_NOT_FOUND, "cache entry %s was removed meanwhile",
                            hash);
  else if (verdict == ROW_BAD)
    status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                            "the cubin of cache entry %s in %s cannot be trusted: %s; "
                            "`sdpa-jit verify` removes it",
                            hash, layer->path, why);
  sqlite3_close_v2(db);
  return status;
}

/* ---------------------------------------------------------------- totals */

static int64_t file_bytes(const char *path, const char *suffix) {
  char name[4200];
  struct stat st;
  snprintf(name, sizeof name, "%s%s", path, suffix);
  return stat(name, &st) == 0 ? (int64_t)st.st_size : 0;
}

sdpa_status sdpa_cache_get_stats(sdpa_cache *cache, sdpa_cache_stats *out) {
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!cache || !out)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT,
                          "sdpa_cache_get_stats: cache and out must not be NULL");
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < cache_layer_count(cache) && !status; i++) {
    cache_layer *layer = cache_layer_at(cache, i);
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    int rc;
    if (!open_layer(cache, layer, &db, &rc)) continue;
    if (rc == SQLITE_OK)
      rc = sqlite3_prepare_v2(db,
                              "SELECT count(*), total(length(cubin)), total(hits), "
                              "total(compile_ms) FROM kernels",
                              -1, &stmt, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      int64_t entries = sqlite3_column_int64(stmt, 0);
      out->entries += entries;
      out->cubin_bytes = cache_count_add(
          out->cubin_bytes, cache_count_from_double(sqlite3_column_double(stmt, 1)));
      out->hits = cache_count_add(out->hits,
                                  cache_count_from_double(sqlite3_column_double(stmt, 2)));
      out->compile_ms_total += sqlite3_column_double(stmt, 3);
      if (layer->shipped) out->readonly_entries += entries;
      out->file_bytes += file_bytes(layer->path, "");
      if (!layer->shipped) out->file_bytes += file_bytes(layer->path, "-wal");
    } else {
      status = read_error(layer, db, rc);
    }
    sqlite3_finalize(stmt);
    sqlite3_close_v2(db);
  }
  out->hits = cache_count_add(out->hits, cache_hits_total(&cache->hits));
  return status;
}

/* ---------------------------------------------------------------- verify */

/* A failing row found by verify. */
typedef struct bad_row {
  char hash[33];
  char *key_text;
  char problem[200];
} bad_row;

/* Reads every row of `layer` through `db` and lists those that fail:
 * checksum, MAC when keyed, and `check` (may be NULL) on the blob. */
static int scan_rows(sdpa_cache *cache, sqlite3 *db, sdpa_cache_blob_check check,
                     void *check_context, int64_t *checked, bad_row **bad,
                     size_t *bad_count) {
  sqlite3_stmt *stmt = NULL;
  size_t capacity = 0;
  const int mac_column = cache_has_column(db, "mac");
  int rc = sqlite3_prepare_v2(db,
                              mac_column ? "SELECT key_hash, key_text, cubin, checksum, "
                                           "arch, mac FROM kernels"
                                         : "SELECT key_hash, key_text, cubin, checksum, "
                                           "arch, NULL FROM kernels",
                              -1, &stmt, NULL);
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    rc = SQLITE_OK;
    (*checked)++;
    const char *hash = (const char *)sqlite3_column_text(stmt, 0);
    const char *text = (const char *)sqlite3_column_text(stmt, 1);
    const void *blob = sqlite3_column_blob(stmt, 2);
    const int bytes = sqlite3_column_bytes(stmt, 2);
    char why[200] = "";
    if (cache_row_intact(cache, hash ? hash : "", text, blob, bytes,
                         sqlite3_column_int64(stmt, 3),
                         (const char *)sqlite3_column_text(stmt, 5), why, sizeof why) == 0 &&
        (!check || check(blob, (size_t)bytes, sqlite3_column_int(stmt, 4), check_context,
                         why, sizeof why) == 0))
      continue;
    if (*bad_count == capacity) {
      size_t grown = capacity ? capacity * 2 : 8;
      void *p = realloc(*bad, grown * sizeof **bad);
      if (!p) {
        rc = SQLITE_NOMEM;
        break;
      }
      *bad = p;
      capacity = grown;
    }
    bad_row *b = &(*bad)[(*bad_count)++];
    snprintf(b->hash, sizeof b->hash, "%s", hash ? hash : "");
    b->key_text = text ? strdup(text) : NULL;
    snprintf(b->problem, sizeof b->problem, "%s", why);
  }
  sqlite3_finalize(stmt);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* PRAGMA integrity_check of `db`: 0 when "ok", else its first line. */
static int integrity(sqlite3 *db, char *verdict, size_t size, int *rc_out) {
  sqlite3_stmt *stmt = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt, NULL);
  verdict[0] = '\0';
  if (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const char *text = (const char *)sqlite3_column_text(stmt, 0);
    snprintf(verdict, size, "%s", text ? text : "");
    rc = SQLITE_OK;
  }
  sqlite3_finalize(stmt);
  *rc_out = rc;
  return rc == SQLITE_OK && strcmp(verdict, "ok") == 0 ? 0 : -1;
}

sdpa_status sdpa_cache_verify_all(sdpa_cache *cache, sdpa_cache_blob_check check,
                                  void *check_context, sdpa_cache_problem_fn fn, void *user,
                                  int64_t *checked, int64_t *removed) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int64_t checked_rows = 0, removed_rows = 0;
  if (!cache)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "sdpa_cache_verify_all: cache is NULL");
  for (size_t i = 0; i < cache_layer_count(cache) && !status; i++) {
    cache_layer *layer = cache_layer_at(cache, i);
    sqlite3 *db = NULL;
    bad_row *bad = NULL;
    size_t bad_count = 0;
    char verdict[512];
    int rc = SQLITE_OK;
    pthread_mutex_lock(&cache->read_lock);
    const int writable = !layer->shipped && !layer->readonly;
    pthread_mutex_unlock(&cache->read_lock);
    if (!open_layer(cache, layer, &db, &rc)) continue;
    /* The file as a whole first: a damaged b-tree cannot be fixed by
     * removing rows. */
    if (rc == SQLITE_OK && integrity(db, verdict, sizeof verdict, &rc) != 0 &&
        rc == SQLITE_OK) {
      int rows = 0;
      cache_pragma_int(db, "SELECT count(*) FROM kernels", &rows);
      sqlite3_close_v2(db);
      db = NULL;
      if (writable) {
        char reason[700];
        snprintf(reason, sizeof reason, "fails integrity_check (%s)", verdict);
        pthread_mutex_lock(&cache->write_lock);
        pthread_mutex_lock(&cache->read_lock);
        cache_user_replace(cache, &warnings, reason);
        pthread_mutex_unlock(&cache->read_lock);
        pthread_mutex_unlock(&cache->write_lock);
        checked_rows += rows;
        removed_rows += rows;
        if (fn) fn("", NULL, reason, 1, user);
      } else {
        status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                                "the %skernel cache %s fails integrity_check (%s); %s",
                                layer->shipped ? "shipped " : "", layer->path, verdict,
                                layer->shipped ? "rebuild that file"
                                               : "it cannot be written here");
      }
      continue;
    }
    if (rc == SQLITE_OK)
      rc = scan_rows(cache, db, check, check_context, &checked_rows, &bad, &bad_count);
    if (rc != SQLITE_OK) status = read_error(layer, db, rc);
    sqlite3_close_v2(db);
    for (size_t b = 0; b < bad_count; b++) {
      int gone = 0;
      if (writable && !status) {
        char why[512] = "";
        pthread_mutex_lock(&cache->write_lock);
        rc = cache->writer ? cache_row_delete(cache, bad[b].hash, why, sizeof why)
                           : SQLITE_READONLY;
        pthread_mutex_unlock(&cache->write_lock);
        gone = rc == SQLITE_OK;
        if (!gone)
          status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                                  "could not remove entry %s from %s: %s", bad[b].hash,
                                  layer->path, why[0] ? why : sqlite3_errstr(rc));
      }
      removed_rows += gone;
      if (fn) fn(bad[b].hash, bad[b].key_text, bad[b].problem, gone, user);
      free(bad[b].key_text);
    }
    free(bad);
  }
  cache_emit(cache, &warnings);
  if (checked) *checked = checked_rows;
  if (removed) *removed = removed_rows;
  return status;
}

/* ----------------------------------------------------------------- prune */

sdpa_status sdpa_cache_prune_rows(sdpa_cache *cache, int64_t max_bytes,
                                  int64_t older_than_seconds, int64_t *removed) {
  warning_list warnings = {0};
  sdpa_status status = SDPA_STATUS_SUCCESS;
  int64_t count = 0;
  char why[512] = "";
  if (removed) *removed = 0;
  if (!cache)
    return sdpa_error_set(SDPA_STATUS_INVALID_ARGUMENT, "sdpa_cache_prune_rows: cache is NULL");
  pthread_mutex_lock(&cache->write_lock);
  if (!cache->writer) {
    pthread_mutex_lock(&cache->read_lock);
    const int open = cache->user.db != NULL;
    pthread_mutex_unlock(&cache->read_lock);
    if (open)
      status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR,
                              "the kernel cache %s is open read-only; nothing was pruned "
                              "(check the file's and its directory's permissions)",
                              cache->user.path);
    goto done; /* memory-only: nothing to prune */
  }
  int rc = cache_prune(cache, max_bytes, older_than_seconds, NULL, &count, why, sizeof why);
  if (rc != SQLITE_OK) {
    if (cache_is_damage(rc)) {
      pthread_mutex_lock(&cache->read_lock);
      cache_layer_failed(cache, &cache->user, rc, "prune", why, &warnings);
      pthread_mutex_unlock(&cache->read_lock);
    }
    status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR, "could not prune the kernel cache %s: %s%s",
                            cache->user.path ? cache->user.path : "", why,
                            cache_is_damage(rc) ? " (the damaged file was moved aside and "
                                                  "a new one started)"
                                                : "; retry when no other process is "
                                                  "writing to it");
  }
done:
  pthread_mutex_unlock(&cache->write_lock);
  cache_emit(cache, &warnings);
  if (removed) *removed = count;
  return status;
}
