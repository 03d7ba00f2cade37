/*
 * inspect.c — the read-only commands: `ls`, `show`, `stats`, `path`.
 *
 * They answer what a performance engineer asks of the cache (which keys,
 * how big, how long they took to compile, how often they are used) through
 * the public sdpa_cache_* calls, as a table for people or as JSON for
 * programs. Nothing here writes to the cache.
 */
#include <string.h>

#include "cli.h"
#include "json.h"

static const cli_option json_options[] = {{"--json", NULL, 0, CLI_OPT_JSON},
                                          {NULL, NULL, 0, 0}};
static const cli_option no_options[] = {{NULL, NULL, 0, 0}};

/* Writes one entry as a JSON object with every field. */
static void entry_json(const sdpa_cache_entry *e, const char *cache) {
  char created[32], last_used[32];
  cli_format_iso_utc(e->created, created, sizeof created);
  cli_format_iso_utc(e->last_used, last_used, sizeof last_used);
  cli_json_object o;
  cli_json_begin(&o, stdout);
  cli_json_str(&o, "key_hash", e->key_hash);
  cli_json_str(&o, "key_text", e->key_text);
  cli_json_int(&o, "arch", e->arch);
  cli_json_str(&o, "dtype", e->dtype);
  cli_json_int(&o, "head_dim", e->head_dim);
  cli_json_int(&o, "head_dim_v", e->head_dim_v);
  cli_json_int(&o, "q_tile", e->q_tile);
  cli_json_int(&o, "kv_tile", e->kv_tile);
  cli_json_int(&o, "warps", e->warps);
  cli_json_int(&o, "stages", e->stages);
  cli_json_str(&o, "mask", e->mask);
  cli_json_str(&o, "layout", e->layout);
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
    "most recently used first: hash prefix, arch, dtype, head dims, tiles\n"
    "(q x kv, warps, stages), mask, layout, size, compile time, hits, last\n"
    "use; \"ro\" marks an entry of a shipped (read-only) database.\n"
    "\n"
    "  --json   a JSON array of objects with every field\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

int cli_ls(cli_args *args) {
  int json = 0;
  int rc = cli_parse_simple(args, json_options, ls_help, &json, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  sdpa_cache_entry *entries = NULL;
  size_t count = 0;
  if ((rc = cli_runtime_open(args, &runtime)) != CLI_EXIT_OK) goto done;
  sdpa_status status = sdpa_cache_list(runtime, &entries, &count);
  if (status != SDPA_STATUS_SUCCESS) {
    rc = cli_fail(args, status, "cannot list the cache");
    goto done;
  }
  if (json) {
    fputc('[', stdout);
    for (size_t i = 0; i < count; i++) {
      if (i) fputs(",\n ", stdout);
      entry_json(&entries[i], NULL);
    }
    fputs("]\n", stdout);
  } else if (count == 0) {
    printf("no entries in %s\n", cli_cache_location(runtime));
  } else {
    printf("%-12s %4s %-5s %-9s %-15s %-9s %-6s %9s %10s %6s  %-16s\n",
           "HASH", "ARCH", "DTYPE", "HD/HDV", "TILES", "MASK", "LAYOUT",
           "KIB", "COMPILE_MS", "HITS", "LAST_USED");
    for (size_t i = 0; i < count; i++) {
      const sdpa_cache_entry *e = &entries[i];
      char dims[24], tiles[48], date[32];
      snprintf(dims, sizeof dims, "%d/%d", e->head_dim, e->head_dim_v);
      snprintf(tiles, sizeof tiles, "%dx%d w%d s%d", e->q_tile, e->kv_tile,
               e->warps, e->stages);
      cli_format_date(e->last_used, date, sizeof date);
      printf("%-12.12s %4d %-5s %-9s %-15s %-9s %-6s %9.1f %10.1f %6lld  "
             "%-16s%s\n",
             e->key_hash, e->arch, e->dtype ? e->dtype : "?", dims, tiles,
             e->mask ? e->mask : "?", e->layout ? e->layout : "?",
             (double)e->cubin_bytes / 1024.0, e->compile_ms,
             (long long)e->hits, date, e->readonly ? "  ro" : "");
    }
  }
  rc = CLI_EXIT_OK;
done:
  sdpa_cache_entries_free(entries, count);
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

int cli_show(cli_args *args) {
  int json = 0;
  const char *key = NULL;
  int rc = cli_parse_simple(args, json_options, show_help, &json, &key, 1);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  sdpa_cache_entry *e = NULL;
  if ((rc = cli_runtime_open(args, &runtime)) != CLI_EXIT_OK) goto done;
  sdpa_status status = sdpa_cache_get(runtime, key, &e);
  if (status != SDPA_STATUS_SUCCESS) {
    e = NULL;
    rc = cli_fail(args, status, key);
    goto done;
  }
  const char *cache = cli_cache_location(runtime);
  if (json) {
    entry_json(e, cache);
    fputc('\n', stdout);
  } else {
    char size[32], created[32], last_used[32];
    cli_format_bytes(e->cubin_bytes, size, sizeof size);
    cli_format_date(e->created, created, sizeof created);
    cli_format_date(e->last_used, last_used, sizeof last_used);
    printf("hash:          %s\n", e->key_hash);
    printf("key:           %s\n", e->key_text ? e->key_text : "");
    printf("arch:          %d\n", e->arch);
    printf("dtype:         %s\n", e->dtype ? e->dtype : "");
    printf("head_dim:      %d\n", e->head_dim);
    printf("head_dim_v:    %d\n", e->head_dim_v);
    printf("q_tile:        %d\n", e->q_tile);
    printf("kv_tile:       %d\n", e->kv_tile);
    printf("warps:         %d\n", e->warps);
    printf("stages:        %d\n", e->stages);
    printf("mask:          %s\n", e->mask ? e->mask : "");
    printf("layout:        %s\n", e->layout ? e->layout : "");
    printf("nvrtc_version: %s\n", e->nvrtc_version ? e->nvrtc_version : "");
    printf("cubin_bytes:   %lld (%s)\n", (long long)e->cubin_bytes, size);
    printf("compile_ms:    %.1f\n", e->compile_ms);
    printf("created:       %s\n", created);
    printf("last_used:     %s\n", last_used);
    printf("hits:          %lld\n", (long long)e->hits);
    printf("readonly:      %s\n",
           e->readonly ? "yes (a shipped database)" : "no");
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
  if ((rc = cli_runtime_open(args, &runtime)) != CLI_EXIT_OK) goto done;
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
    "Print the path of the user's cache database, or \"(memory)\" when the\n"
    "runtime keeps kernels in memory only (--no-disk, or the location\n"
    "cannot be written). Without --cache the path comes from\n"
    "$SDPA_JIT_CACHE, else $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else\n"
    "~/.cache/sdpa-jit/kernels.sqlite.\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

int cli_path(cli_args *args) {
  int json = 0;
  int rc = cli_parse_simple(args, no_options, path_help, &json, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  if ((rc = cli_runtime_open(args, &runtime)) != CLI_EXIT_OK) return rc;
  printf("%s\n", cli_cache_location(runtime));
  sdpa_runtime_destroy(runtime);
  return CLI_EXIT_OK;
}
