/*
 * make_seeds.c — writes the seed corpus of fuzz_cache_open.
 *
 * Usage: fuzz_make_seeds DIR. Writes small cache files into DIR (512-byte
 * pages keep them a few KB, so mutations reach every page):
 *   valid-wal.sqlite       the schema and three rows (keys 1..3 with the
 *                          texts fuzz_cache_open looks up), WAL mode
 *   valid-rollback.sqlite  the same in rollback-journal mode
 *   schema-only.sqlite     the schema, no rows
 *   newer.sqlite           user_version 2 (a newer sdpa-jit's layout)
 *   foreign.sqlite         another application_id
 *   bad-checksum.sqlite    a row whose cubin fails its checksum
 *   header-only.bin        the first 100 bytes of a valid file
 *   empty.bin              no bytes
 * Each file is checkpointed, so everything is in the one file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache.h"

static int fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_make_seeds: %s: %s\n", what, detail ? detail : "");
  return 1;
}

static int exec(const char *path, const char *sql) {
  sqlite3 *db = NULL;
  char *message = NULL;
  int rc = sqlite3_open(path, &db);
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql, NULL, NULL, &message);
  if (rc != SQLITE_OK) fail(sql, message ? message : sqlite3_errstr(rc));
  sqlite3_free(message);
  sqlite3_close(db);
  return rc == SQLITE_OK ? 0 : 1;
}

/* A cache with 512-byte pages, the embedded schema and `rows` rows. */
static int make_cache(const char *path, int rows) {
  unlink(path);
  /* page_size takes effect with the first write, which the schema makes */
  char *sql = sqlite3_mprintf("PRAGMA page_size = 512;\n%s",
                              sdpa_embedded_schema_sql);
  int rc = sql ? exec(path, sql) : 1;
  sqlite3_free(sql);
  if (rc) return 1;
  sdpa_cache_config cfg = {0};
  sdpa_cache *cache = NULL;
  cfg.path = path;
  if (sdpa_cache_open(&cache, &cfg) != SDPA_STATUS_SUCCESS)
    return fail("sdpa_cache_open", sdpa_last_error());
  for (int n = 1; n <= rows; n++) {
    char hash[33], text[64];
    uint8_t cubin[300];
    snprintf(hash, sizeof hash, "%032x", n);
    snprintf(text, sizeof text, "sdpa_bwd;fuzz;key=%d", n);
    for (size_t i = 0; i < sizeof cubin; i++)
      cubin[i] = (uint8_t)(i * 31u + (unsigned)n);
    sdpa_key_fields fields = {0};
    fields.arch = 90;
    fields.family = SDPA_FAMILY_MMA;
    fields.dtype = n % 2 ? SDPA_DTYPE_BF16 : SDPA_DTYPE_FP16;
    fields.head_dim = fields.head_dim_v = 64;
    fields.q_tile = 64;
    fields.kv_tile = 128;
    fields.warps = 8;
    fields.stages = 2;
    fields.lse_packed = 1;
    fields.mask = SDPA_MASK_NONE;
    fields.layout = SDPA_LAYOUT_BSHD;
    sdpa_cache_meta meta = {0};
    meta.key_hash = hash;
    meta.key_text = text;
    meta.fields = &fields;
    meta.nvrtc_version = "13.0";
    meta.compile_ms = 1.5;
    sdpa_cache_store(cache, &meta, cubin, sizeof cubin, NULL);
  }
  sdpa_cache_close(cache);
  return exec(path, "PRAGMA wal_checkpoint(TRUNCATE);");
}

static int copy_prefix(const char *from, const char *to, long bytes) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  int rc = 1;
  if (in && out) {
    char buffer[512];
    size_t n;
    long left = bytes;
    rc = 0;
    while (left != 0 && (n = fread(buffer, 1, sizeof buffer, in)) > 0) {
      if (left > 0 && (long)n > left) n = (size_t)left;
      if (fwrite(buffer, 1, n, out) != n) rc = 1;
      if (left > 0) left -= (long)n;
    }
  }
  if (in) fclose(in);
  if (out) fclose(out);
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  char p[4096];
  int rc = 0;
#define AT(name) (snprintf(p, sizeof p, "%s/%s", dir, name), p)
  rc |= make_cache(AT("valid-wal.sqlite"), 3);
  rc |= make_cache(AT("valid-rollback.sqlite"), 3);
  rc |= exec(p, "PRAGMA journal_mode = DELETE;");
  rc |= make_cache(AT("schema-only.sqlite"), 0);
  rc |= make_cache(AT("newer.sqlite"), 1);
  rc |= exec(p, "PRAGMA user_version = 2; PRAGMA wal_checkpoint(TRUNCATE);");
  rc |= make_cache(AT("foreign.sqlite"), 1);
  rc |= exec(p, "PRAGMA application_id = 7; PRAGMA wal_checkpoint(TRUNCATE);");
  rc |= make_cache(AT("bad-checksum.sqlite"), 2);
  rc |= exec(p, "UPDATE kernels SET checksum = checksum + 1 WHERE rowid = 1;"
                "PRAGMA wal_checkpoint(TRUNCATE);");
  char valid[4096];
  snprintf(valid, sizeof valid, "%s/valid-wal.sqlite", dir);
  rc |= copy_prefix(valid, AT("header-only.bin"), 100);
  rc |= copy_prefix(valid, AT("empty.bin"), 0);
#undef AT
  if (rc == 0) printf("fuzz_make_seeds: seeds written to %s\n", dir);
  return rc;
}
