/*
 * inspect.c — the read-only commands: `ls`, `show`, `stats`, `path`.
 *
 * They answer what a performance engineer asks of the cache (which keys,
 * how big, how long they took to compile, how often they are used) through
 * the public sdpa_cache_* calls, as a table for people or as JSON for
 * programs. They open the user's database read-only and create nothing;
 * `ls` streams the rows (one at a time, however many there are). Every
 * string that comes from the database is escaped before it is printed.
 * The key's fields are printed from the key text (name=value pairs), so a
 * new key field shows up here without a line of this file.
 */
#include <string.h>

#include "cli.h"
#include "json.h"

static const cli_option json_options[] = {{"--json", NULL, 0, CLI_OPT_JSON},
                                          {NULL, NULL, 0, 0}};
static const cli_option no_options[] = {{NULL, NULL, 0, 0}};

/* Calls `field` for every name=value pair of a key text after its first
 * ';' ("sdpa_bwd;arch=90;..."). */
static void each_key_field(const char *key_text,
                           void (*field)(const char *name, const char *value, void *user),
                           void *user) {
  const char *p = key_text ? strchr(key_text, ';') : NULL;
  while (p && *p) {
    p++;
    const char *end = strchr(p, ';');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', n);
    if (eq && eq > p && n < 256) {
      char name[256], value[256];
      snprintf(name, sizeof name, "%.*s", (int)(eq - p), p);
      snprintf(value, sizeof value, "%.*s", (int)(n - (size_t)(eq - p) - 1), eq + 1);
      field(name, value, user);
    }
    p = end;
  }
}

static void json_key_field(const char *name, const char *value, void *user) {
  cli_json_str(user, name, value);
}

/* Writes one entry as a JSON object with every field. */
static void entry_json(const sdpa_cache_entry *e, const char *cache) {
  char created[32], last_used[32];
  cli_format_iso_utc(e->created, created, sizeof created);
  cli_format_iso_utc(e->last_used, last_used, sizeof last_used);
  cli_json_object o, key;
  cli_json_begin(&o, stdout);
  cli_json_str(&o, "key_hash", e->key_hash);
  cli_json_str(&o, "key_text", e->key_text);
  cli_json_int(&o, "arch", e->arch);
  cli_json_str(&o, "family", e->family);
  cli_json_str(&o, "dtype", e->dtype);
  cli_json_int(&o, "head_dim", e->head_dim);
  cli_json_int(&o, "head_dim_v", e->head_dim_v);
  cli_json_int(&o, "q_tile", e->q_tile);
  cli_json_int(&o, "kv_tile", e->kv_tile);
  cli_json_int(&o, "warps", e->warps);
  cli_json_int(&o, "stages", e->stages);
  cli_json_str(&o, "lse", e->lse);
  cli_json_str(&o, "mask", e->mask);
  cli_json_str(&o, "layout", e->layout);
  cli_json_int(&o, "deterministic", e->deterministic);
  cli_json_int(&o, "even", e->even);
  cli_json_str(&o, "dq", e->dq);
  /* Every key field, from the key text. */
  fputs(",\"key\":", stdout);
  cli_json_begin(&key, stdout);
  each_key_field(e->key_text, json_key_field, &key);
  cli_json_end(&key);
  cli_json_str(&o, "nvrtc_version", e->nvrtc_version);
  cli_json_int(&o, "cubin_bytes", e->cubin_bytes);
  cli_json_num(&o, "compile_ms", e->compile_ms);
  cli_json_int(&o, "created", e->created);
  cli_json_str(&o, "created_utc", created);
  cli_json_int(&o, "last_used", e->last_used);
  cli_json_str(&o, "last_used_utc", last_used);
  cli_json_int(&o, "hits", e->hits);
  cli_json_bool(&o, "readonly", e->readonly);
  if (cache) cli_json_str(&o, "cache", cache);
  cli_json_end(&o);
}

static const char ls_help[] =
    "usage: " CLI_PROGRAM " ls [--json]\n"
    "\n"
    "List the cache's entries (the user's database and the shipped ones),\n"
    "most recently used first: hash prefix, arch, family, dtype, head dims,\n"
    "tiles (q x kv, warps, stages), mask, layout, size, compile time, hits,\n"
    "last use; \"ro\" marks an entry of a shipped (read-only) database. The\n"
    "rows are read one at a time. Opens the cache read-only; an explicit\n"
    "--cache that holds no cache is an error.\n"
    "\n"
    "  --json   a JSON array of objects with every field (and \"key\": every\n"
    "           field of the key text)\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

typedef struct ls_state {
  int json;
  size_t rows;
} ls_state;

static int ls_row(const sdpa_cache_entry *e, void *user) {
  ls_state *st = user;
  if (st->json) {
    fputs(st->rows ? ",\n " : "[", stdout);
    entry_json(e, NULL);
  } else {
    char dims[24], tiles[48], date[32], dtype[64], mask[64], layout[64], family[64];
    if (st->rows == 0)
      printf("%-12s %4s %-6s %-5s %-9s %-15s %-9s %-6s %9s %10s %6s  %-16s\n", "HASH",
             "ARCH", "FAMILY", "DTYPE", "HD/HDV", "TILES", "MASK", "LAYOUT", "KIB",
             "COMPILE_MS", "HITS", "LAST_USED");
    snprintf(dims, sizeof dims, "%d/%d", e->head_dim, e->head_dim_v);
    snprintf(tiles, sizeof tiles, "%dx%d w%d s%d", e->q_tile, e->kv_tile, e->warps,
             e->stages);
    cli_format_date(e->last_used, date, sizeof date);
    printf("%-12.12s %4d %-6s %-5s %-9s %-15s %-9s %-6s %9.1f %10.1f %6lld  %-16s%s\n",
           e->key_hash, e->arch, cli_escape(e->family ? e->family : "?", family, sizeof family),
           cli_escape(e->dtype ? e->dtype : "?", dtype, sizeof dtype), dims, tiles,
           cli_escape(e->mask ? e->mask : "?", mask, sizeof mask),
           cli_escape(e->layout ? e->layout : "?", layout, sizeof layout),
           (double)e->cubin_bytes / 1024.0, e->compile_ms, (long long)e->hits, date,
           e->readonly ? "  ro" : "");
  }
  st->rows++;
  return ferror(stdout) ? 1 : 0; /* stop: the output is gone */
}

int cli_ls(cli_args *args) {
  int json = 0;
  int rc = cli_parse_simple(args, json_options, ls_help, &json, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  ls_state st = {json, 0};
  if ((rc = cli_runtime_open(args, CLI_CACHE_INSPECT, &runtime)) != CLI_EXIT_OK) goto done;
  if (cli_no_user_cache(args, runtime)) {
    if (json) fputs("[]\n", stdout);
    rc = CLI_EXIT_OK;
    goto done;
  }
  sdpa_status status = sdpa_cache_foreach(runtime, ls_row, &st);
  if (status != SDPA_STATUS_SUCCESS) {
    rc = cli_fail(args, status, "cannot list the cache");
    goto done;
  }
  if (json)
    fputs(st.rows ? "]\n" : "[]\n", stdout);
  else if (st.rows == 0)
    printf("no entries in %s\n", cli_cache_location(runtime));
  rc = CLI_EXIT_OK;
done:
  sdpa_runtime_destroy(runtime);
  return rc;
}

static const char show_help[] =
    "usage: " CLI_PROGRAM " show KEY [--json]\n"
    "\n"
    "Print every field of one cache entry and the cache's path. KEY is the\n"
    "entry's hash, a unique prefix of it (at least 6 hex digits) or its\n"
    "full key text (quote it: it contains ';').\n"
    "\n"
    "  --json   one JSON object with every field\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

static void print_key_field(const char *name, const char *value, void *user) {
  char safe_name[512], safe_value[512];
  (void)user;
  printf("  %-12s %s\n", cli_escape(name, safe_name, sizeof safe_name),
         cli_escape(value, safe_value, sizeof safe_value));
}

int cli_show(cli_args *args) {
  int json = 0;
  const char *key = NULL;
  int rc = cli_parse_simple(args, json_options, show_help, &json, &key, 1);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  sdpa_cache_entry *e = NULL;
  if ((rc = cli_runtime_open(args, CLI_CACHE_INSPECT, &runtime)) != CLI_EXIT_OK) goto done;
  sdpa_status status = sdpa_cache_get(runtime, key, &e);
  if (status != SDPA_STATUS_SUCCESS) {
    char safe[600];
    e = NULL;
    cli_no_user_cache(args, runtime);
    rc = cli_fail(args, status, cli_escape(key, safe, sizeof safe));
    goto done;
  }
  const char *cache = cli_cache_location(runtime);
  if (json) {
    entry_json(e, cache);
    fputc('\n', stdout);
  } else {
    char size[32], created[32], last_used[32], text[2048], version[128];
    cli_format_bytes(e->cubin_bytes, size, sizeof size);
    cli_format_date(e->created, created, sizeof created);
    cli_format_date(e->last_used, last_used, sizeof last_used);
    printf("hash:          %s\n", e->key_hash);
    printf("key:           %s\n", cli_escape(e->key_text, text, sizeof text));
    printf("fields:\n");
    each_key_field(e->key_text, print_key_field, NULL);
    printf("nvrtc_version: %s\n", cli_escape(e->nvrtc_version, version, sizeof version));
    printf("cubin_bytes:   %lld (%s)\n", (long long)e->cubin_bytes, size);
    printf("compile_ms:    %.1f\n", e->compile_ms);
    printf("created:       %s\n", created);
    printf("last_used:     %s\n", last_used);
    printf("hits:          %lld\n", (long long)e->hits);
    printf("readonly:      %s\n", e->readonly ? "yes (a shipped database)" : "no");
    printf("cache:         %s\n", cache);
  }
  rc = CLI_EXIT_OK;
done:
  sdpa_cache_entries_free(e, e ? 1 : 0);
  sdpa_runtime_destroy(runtime);
  return rc;
}

static const char stats_help[] =
    "usage: " CLI_PROGRAM " stats [--json]\n"
    "\n"
    "Totals over the user's and the shipped databases: entries (and how\n"
    "many are read-only), cubin bytes, database file bytes, hits, total\n"
    "compile time.\n"
    "\n"
    "  --json   one JSON object\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

int cli_stats(cli_args *args) {
  int json = 0;
  int rc = cli_parse_simple(args, json_options, stats_help, &json, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  sdpa_cache_stats s;
  memset(&s, 0, sizeof s);
  if ((rc = cli_runtime_open(args, CLI_CACHE_INSPECT, &runtime)) != CLI_EXIT_OK) goto done;
  cli_no_user_cache(args, runtime);
  sdpa_status status = sdpa_cache_stats_get(runtime, &s);
  if (status != SDPA_STATUS_SUCCESS) {
    rc = cli_fail(args, status, "cannot read the cache's totals");
    goto done;
  }
  const char *cache = cli_cache_location(runtime);
  if (json) {
    cli_json_object o;
    cli_json_begin(&o, stdout);
    cli_json_str(&o, "cache", cache);
    cli_json_int(&o, "entries", s.entries);
    cli_json_int(&o, "readonly_entries", s.readonly_entries);
    cli_json_int(&o, "cubin_bytes", s.cubin_bytes);
    cli_json_int(&o, "file_bytes", s.file_bytes);
    cli_json_int(&o, "hits", s.hits);
    cli_json_num(&o, "compile_ms_total", s.compile_ms_total);
    cli_json_end(&o);
    fputc('\n', stdout);
  } else {
    char cubin[32], file[32];
    cli_format_bytes(s.cubin_bytes, cubin, sizeof cubin);
    cli_format_bytes(s.file_bytes, file, sizeof file);
    printf("cache:         %s\n", cache);
    printf("entries:       %lld (%lld read-only)\n", (long long)s.entries,
           (long long)s.readonly_entries);
    printf("cubin bytes:   %lld (%s)\n", (long long)s.cubin_bytes, cubin);
    printf("file bytes:    %lld (%s)\n", (long long)s.file_bytes, file);
    printf("hits:          %lld\n", (long long)s.hits);
    printf("compile ms:    %.1f\n", s.compile_ms_total);
  }
  rc = CLI_EXIT_OK;
done:
  sdpa_runtime_destroy(runtime);
  return rc;
}

static const char path_help[] =
    "usage: " CLI_PROGRAM " path\n"
    "\n"
    "Print the path of the user's cache database (its directory resolved),\n"
    "or \"(memory)\" with --no-disk. Without --cache the path comes from\n"
    "$SDPA_JIT_CACHE, else $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else\n"
    "~/.cache/sdpa-jit/kernels.sqlite; when no cache is there yet, that\n"
    "path is printed and a note says so on stderr. Creates nothing.\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

int cli_path(cli_args *args) {
  int json = 0;
  int rc = cli_parse_simple(args, no_options, path_help, &json, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  if ((rc = cli_runtime_open(args, CLI_CACHE_INSPECT, &runtime)) != CLI_EXIT_OK) return rc;
  if (cli_no_user_cache(args, runtime)) {
    char where[4096];
    printf("%s\n", sdpa_cache_default_location(where, sizeof where));
  } else {
    printf("%s\n", cli_cache_location(runtime));
  }
  sdpa_runtime_destroy(runtime);
  return CLI_EXIT_OK;
}
