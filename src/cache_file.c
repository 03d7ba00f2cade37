/*
 * cache_file.c — where the user's database lives and whether it may be
 * used: the default location, the trust checks, what a file at that path
 * is, attaching (creating, migrating), and recovering our own damaged
 * files.
 *
 * Trust (sdpa_jit.h, "The cache's trust model"). The directory is
 * resolved once (realpath) and everything after uses the canonical path,
 * so a link an attacker owns cannot be re-pointed between the check and
 * the use. The directory must be owned by the effective user and
 * writable by nobody else; every directory above it owned by the user or
 * root and writable by nobody else unless sticky (/tmp: others cannot
 * rename what is ours there). The file: a regular file (lstat: a link is
 * refused), owned by the user, writable by nobody else.
 *
 * Ownership. What a file at the path is comes from its first bytes,
 * before SQLite is let near it: zero bytes (empty: may be initialized), no
 * SQLite header (not ours: left alone), our application_id (ours), or
 * application_id 0 with no table at all (an empty database: may be
 * initialized). A WAL file whose header is not yet checkpointed is asked
 * through a read-only connection, which never writes the database (the
 * application_id and the schema from one snapshot). Only a
 * file that is ours is ever moved aside (damaged) or migrated.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cache_internal.h"

/* ------------------------------------------------------- default path */

char *sdpa_cache_default_path(char *buf, size_t size) {
  const char *value;
  int n;
  if (!buf || size == 0) return buf;
  if ((value = getenv("SDPA_JIT_CACHE")) && *value) {
    n = snprintf(buf, size, "%s", value);
  } else if ((value = getenv("XDG_CACHE_HOME")) && value[0] == '/') {
    /* The XDG rules ignore a relative XDG_CACHE_HOME. */
    n = snprintf(buf, size, "%s/sdpa-jit/kernels.sqlite", value);
  } else if ((value = getenv("HOME")) && *value) {
    n = snprintf(buf, size, "%s/.cache/sdpa-jit/kernels.sqlite", value);
  } else {
    value = getenv("TMPDIR");
    if (!value || !*value) value = "/tmp";
    n = snprintf(buf, size, "%s/sdpa-jit-%ld/kernels.sqlite", value, (long)geteuid());
  }
  if (n < 0 || (size_t)n >= size) buf[0] = '\0'; /* did not fit */
  return buf;
}

/* --------------------------------------------------------------- trust */

/* Creates `dir` and its missing parents (mode 0700, as the XDG base
 * directory rules ask). Returns 0, or an errno value. */
static int make_directories(const char *dir) {
  size_t length = strlen(dir);
  char *copy = malloc(length + 1);
  int err = 0;
  if (!copy) return ENOMEM;
  memcpy(copy, dir, length + 1);
  for (size_t i = 1; i <= length; i++) {
    if (copy[i] != '/' && copy[i] != '\0') continue;
    if (copy[i - 1] == '/') continue; /* "a//b" */
    char saved = copy[i];
    copy[i] = '\0';
    if (mkdir(copy, 0700) != 0 && errno != EEXIST) {
      err = errno;
      break;
    }
    copy[i] = saved;
  }
  free(copy);
  return err;
}

/* The directory part of `path` ("." when it has none), malloc'd. */
static char *directory_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* Checks the canonical directory `dir` and its ancestors (see the file
 * comment). Returns 0, or -1 with `why`. */
static int directory_trusted(const char *dir, char *why, size_t why_size) {
  const uid_t me = geteuid();
  struct stat st;
  if (lstat(dir, &st) != 0) {
    snprintf(why, why_size, "cannot read the directory %s (%s)", dir, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, why_size, "%s is not a directory", dir);
    return -1;
  }
  if (st.st_uid != me) {
    snprintf(why, why_size,
             "the directory %s belongs to uid %ld, not to this user (uid %ld): "
             "another user could change what this process runs",
             dir, (long)st.st_uid, (long)me);
    return -1;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, why_size,
             "the directory %s is writable by %s (mode %04o): another user could "
             "plant files in it; run chmod go-w on it",
             dir, (st.st_mode & S_IWOTH) ? "others" : "its group",
             (unsigned)(st.st_mode & 07777));
    return -1;
  }
  char *up = strdup(dir);
  if (!up) {
    snprintf(why, why_size, "out of memory");
    return -1;
  }
  int ok = 0;
  for (char *slash = strrchr(up, '/'); slash && ok == 0; slash = strrchr(up, '/')) {
    if (slash == up)
      slash[1] = '\0'; /* "/" */
    else
      *slash = '\0';
    if (lstat(up, &st) != 0 || !S_ISDIR(st.st_mode)) {
      snprintf(why, why_size, "cannot read the directory %s", up);
      ok = -1;
    } else if (st.st_uid != me && st.st_uid != 0) {
      snprintf(why, why_size,
               "the directory %s above the cache belongs to uid %ld (neither this "
               "user nor root)",
               up, (long)st.st_uid);
      ok = -1;
    } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
      snprintf(why, why_size,
               "the directory %s above the cache is writable by others (mode %04o) "
               "and not sticky: they could replace the cache directory",
               up, (unsigned)(st.st_mode & 07777));
      ok = -1;
    }
    if (strcmp(up, "/") == 0) break;
  }
  free(up);
  return ok;
}

/* ------------------------------------------------------------ ownership */

typedef enum file_kind {
  FILE_NONE,      /* nothing at the path                          */
  FILE_EMPTY,     /* zero bytes, or an SQLite database with nothing */
  FILE_OURS,      /* our application_id                            */
  FILE_FOREIGN,   /* another program's database                   */
  FILE_UNKNOWN,   /* not an SQLite database: whose, we cannot tell */
  FILE_BAD        /* not a regular file, or not the user's          */
} file_kind;

static uint32_t big_endian32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads the application_id and the count of schema objects through a
 * read-only connection (WAL content included), both from one snapshot:
 * read in two transactions, another process's schema commit between them
 * gave "application_id 0 with tables", another program's database.
 * Returns an SQLite code. */
static int read_app_id(const char *path, int *app_id, int *tables) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
    rc = cache_exec(db, "BEGIN", NULL, 0);
    if (rc == SQLITE_OK) rc = cache_pragma_int(db, "PRAGMA application_id", app_id);
    if (rc == SQLITE_OK) rc = cache_pragma_int(db, "SELECT count(*) FROM sqlite_master", tables);
    cache_rollback(db); /* ends the read transaction */
  }
  sqlite3_close_v2(db);
  return rc;
}

/* What is at `path` (see the file comment); `why` says it for FILE_BAD,
 * FILE_FOREIGN and FILE_UNKNOWN; *readonly_file when the owner may not
 * write it. */
static file_kind classify(const char *path, int *readonly_file, char *why,
                          size_t why_size) {
  struct stat st;
  *readonly_file = 0;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return FILE_NONE;
    snprintf(why, why_size, "cannot read %s (%s)", path, strerror(errno));
    return FILE_BAD;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(why, why_size, "%s is %s, not a regular file", path,
             S_ISLNK(st.st_mode)  ? "a symbolic link"
             : S_ISDIR(st.st_mode) ? "a directory"
                                   : "a special file");
    return FILE_BAD;
  }
  if (st.st_uid != geteuid()) {
    snprintf(why, why_size, "%s belongs to uid %ld, not to this user", path,
             (long)st.st_uid);
    return FILE_BAD;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(why, why_size, "%s is writable by %s (mode %04o); run chmod go-w on it",
             path, (st.st_mode & S_IWOTH) ? "others" : "its group",
             (unsigned)(st.st_mode & 07777));
    return FILE_BAD;
  }
  *readonly_file = !(st.st_mode & S_IWUSR) || access(path, W_OK) != 0;
  if (st.st_size == 0) return FILE_EMPTY;

  unsigned char head[108];
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, head, sizeof head) : -1;
  if (fd >= 0) close(fd);
  if (got < 100 || memcmp(head, "SQLite format 3", 16) != 0) {
    snprintf(why, why_size, "%s is not an SQLite database", path);
    return FILE_UNKNOWN;
  }
  uint32_t app_id = big_endian32(head + 68);
  if (app_id == SDPA_CACHE_APPLICATION_ID) return FILE_OURS;
  const int wal = head[18] == 2 && head[19] == 2;
  char wal_path[4200];
  snprintf(wal_path, sizeof wal_path, "%s-wal", path);
  if (wal && stat(wal_path, &st) == 0 && st.st_size > 0) {
    /* Header not checkpointed yet: ask SQLite, read-only (another process
     * may be initializing or recovering the file: wait for it while busy;
     * a file SQLite cannot answer for is nobody's we can name). */
    int id = 0, tables = 0, rc;
    const int64_t start = cache_monotonic_ms();
    /* busy: as long as a writer may hold it; other codes (the last
     * connection of another process removing its -wal and -shm as we
     * open) a moment */
    while ((rc = read_app_id(path, &id, &tables)) != SQLITE_OK &&
           cache_monotonic_ms() - start < (cache_is_busy(rc) ? BUSY_TIMEOUT_MS : 1000))
      cache_sleep_ms(LOCK_POLL_MS);
    if (rc != SQLITE_OK) {
      snprintf(why, why_size, "%s could not be read (%s)", path, sqlite3_errstr(rc));
      return FILE_UNKNOWN;
    }
    if ((uint32_t)id == SDPA_CACHE_APPLICATION_ID) return FILE_OURS;
    if (id == 0 && tables == 0) return FILE_EMPTY;
    app_id = (uint32_t)id;
  } else if (app_id == 0 && got >= 105 && head[100] == 0x0d &&
             head[103] == 0 && head[104] == 0) {
    return FILE_EMPTY; /* page 1 a leaf with no cell: no table at all */
  }
  snprintf(why, why_size, "%s is another program's SQLite database (application_id "
           "0x%08x, not 0x%08x)",
           path, (unsigned)app_id, (unsigned)SDPA_CACHE_APPLICATION_ID);
  return FILE_FOREIGN;
}

/* ------------------------------------------------------------ connecting */

/* "file:<path>?<query>" with the characters URIs reserve escaped; an
 * absolute path gets an empty authority ("file:///..."). */
static char *file_uri(const char *path, const char *query) {
  size_t length = strlen(path);
  char *uri = malloc(length * 3 + strlen(query) + 16);
  char *p = uri;
  if (!uri) return NULL;
  p += sprintf(p, path[0] == '/' ? "file://" : "file:");
  for (const unsigned char *s = (const unsigned char *)path; *s; s++) {
    if (*s == '%' || *s == '?' || *s == '#' || *s < 0x20 || *s == 0x7f)
      p += sprintf(p, "%%%02X", *s);
    else
      *p++ = (char)*s;
  }
  sprintf(p, "?%s", query);
  return uri;
}

/* Opens `path`: read-write (no create), read-only, or immutable. */
static int connect(const char *path, int readonly, int immutable, sqlite3 **out) {
  char *uri = file_uri(path, immutable ? "immutable=1" : readonly ? "mode=ro" : "mode=rw");
  *out = NULL;
  if (!uri) return SQLITE_NOMEM;
  int rc = sqlite3_open_v2(uri,
                           out, (readonly || immutable ? SQLITE_OPEN_READONLY
                                                       : SQLITE_OPEN_READWRITE) |
                                    SQLITE_OPEN_URI,
                           NULL);
  free(uri);
  if (rc != SQLITE_OK) {
    sqlite3_close_v2(*out);
    *out = NULL;
    return rc;
  }
  sqlite3_extended_result_codes(*out, 1);
  sqlite3_busy_timeout(*out, BUSY_TIMEOUT_MS);
  return SQLITE_OK;
}

int cache_layer_connect(const sdpa_cache *cache, const cache_layer *layer, sqlite3 **out) {
  (void)cache;
  return connect(layer->path, 1, layer->immutable, out);
}

/* Checks that the kernels table has every column this layout reads. */
static int check_layout(sqlite3 *db, int v2, char *why, size_t why_size) {
  sqlite3_stmt *stmt = NULL;
  int rc = sqlite3_prepare_v2(
      db,
      v2 ? "SELECT key_hash, key_text, arch, dtype, head_dim, head_dim_v, q_tile, "
           "kv_tile, warps, stages, mask, layout, nvrtc_version, cubin_bytes, "
           "compile_ms, created, last_used, hits, runtime_version, cubin, checksum, "
           "compile_log, family, lse, deterministic, even, dq, mac FROM kernels LIMIT 0"
         : "SELECT key_hash, key_text, arch, dtype, head_dim, head_dim_v, q_tile, "
           "kv_tile, warps, stages, mask, layout, nvrtc_version, cubin_bytes, "
           "compile_ms, created, last_used, hits, runtime_version, cubin, checksum, "
           "compile_log FROM kernels LIMIT 0",
      -1, &stmt, NULL);
  if (rc != SQLITE_OK) snprintf(why, why_size, "%s", sqlite3_errmsg(db));
  sqlite3_finalize(stmt);
  return rc;
}

/* Runs the embedded schema (a new or empty file), retrying while busy. */
static int run_schema(sqlite3 *db, char *why, size_t why_size) {
  int64_t deadline = cache_monotonic_ms() + BUSY_TIMEOUT_MS;
  for (;;) {
    int rc = cache_exec(db, sdpa_embedded_schema_sql, why, why_size);
    if (rc == SQLITE_OK) return rc;
    cache_rollback(db);
    if (!cache_is_busy(rc) || cache_monotonic_ms() >= deadline) return rc;
    cache_sleep_ms(LOCK_POLL_MS);
  }
}

/* Migrates a first-layout file (user_version 1) to the second: the key
 * columns it lacked and the MAC column, NULL on its rows (their keys
 * predate the family field, so no current key finds them: they age out). */
static int migrate(sqlite3 *db, char *why, size_t why_size) {
  static const char *const columns[][2] = {{"family", "TEXT"},       {"lse", "TEXT"},
                                           {"deterministic", "INTEGER"},
                                           {"even", "INTEGER"},      {"dq", "TEXT"},
                                           {"mac", "TEXT"}};
  int rc = cache_begin_write(db, BUSY_TIMEOUT_MS, why, why_size);
  int version = 0;
  if (rc != SQLITE_OK) return rc;
  rc = cache_pragma_int(db, "PRAGMA user_version", &version);
  for (size_t i = 0; rc == SQLITE_OK && version < 2 && i < sizeof columns / sizeof columns[0];
       i++) {
    if (cache_has_column(db, columns[i][0])) continue;
    char sql[128];
    snprintf(sql, sizeof sql, "ALTER TABLE kernels ADD COLUMN %s %s", columns[i][0],
             columns[i][1]);
    rc = cache_exec(db, sql, why, why_size);
  }
  if (rc == SQLITE_OK && version < 2)
    rc = cache_exec(db, "PRAGMA user_version = 2", why, why_size);
  if (rc == SQLITE_OK) return cache_commit(db, why, why_size);
  cache_rollback(db);
  return rc;
}

/* Sets the connection options of a writable user database. */
static void tune_writer(sqlite3 *db) {
  cache_exec(db, "PRAGMA synchronous = NORMAL", NULL, 0);
  /* The WAL is truncated to this after each checkpoint (a prune writes
   * many pages; without a limit the file keeps its largest size). */
  cache_exec(db, "PRAGMA journal_size_limit = 4194304", NULL, 0);
}

/* How attaching went. */
typedef enum attach_result {
  ATTACH_OK,       /* connections made                          */
  ATTACH_DAMAGED,  /* ours but not a usable database: move aside */
  ATTACH_NEWER,    /* a newer sdpa-jit's layout: leave it alone  */
  ATTACH_FAILED    /* cannot be used (why says)                 */
} attach_result;

/* Creates the user's file with owner-only permissions, without following
 * a link, before SQLite opens it. Returns 0, EEXIST (another process made
 * it first: classify it again) or another errno value. */
static int create_file(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

/* Opens the user's database at cache->user.path, which is ours or empty
 * (the caller classified it, and created it when it was absent): creates
 * the schema or migrates when writing is allowed, checks the layout, makes
 * the reader and (writable) the writer. */
static attach_result attach_user(sdpa_cache *cache, file_kind kind, int readonly,
                                 int immutable, char *why, size_t why_size) {
  cache_layer *user = &cache->user;
  sqlite3 *db = NULL, *reader = NULL;
  int version = 0, app_id = 0, rc;
  attach_result result = ATTACH_FAILED;

  rc = connect(user->path, readonly, immutable, &db);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errstr(rc));
    return cache_is_damage(rc) && kind == FILE_OURS ? ATTACH_DAMAGED : ATTACH_FAILED;
  }
  rc = cache_pragma_int(db, "PRAGMA application_id", &app_id);
  if (rc == SQLITE_OK) rc = cache_pragma_int(db, "PRAGMA user_version", &version);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    result = cache_is_damage(rc) && kind == FILE_OURS ? ATTACH_DAMAGED : ATTACH_FAILED;
    goto done;
  }
  if (version > SDPA_CACHE_SCHEMA_VERSION) {
    snprintf(why, why_size, "schema version %d; this sdpa-jit reads 1 to %d", version,
             SDPA_CACHE_SCHEMA_VERSION);
    /* Closing must not checkpoint a WAL into a file this version does not
     * know how to write. */
    sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    result = ATTACH_NEWER;
    goto done;
  }
  if (version < 1 || app_id != SDPA_CACHE_APPLICATION_ID) {
    /* Empty (zero bytes or no table): ours to initialize. */
    if (readonly || immutable) {
      snprintf(why, why_size, "the file holds no cache yet and may not be written");
      goto done;
    }
    rc = run_schema(db, why, why_size);
  } else if (version < SDPA_CACHE_SCHEMA_VERSION && !readonly && !immutable) {
    rc = migrate(db, why, why_size);
  }
  if (rc != SQLITE_OK) {
    result = cache_is_damage(rc) ? ATTACH_DAMAGED : ATTACH_FAILED;
    goto done;
  }
  if (!readonly && !immutable) {
    /* A no-op on our files; one left in another journal mode is switched
     * back (if busy now, it works in its current mode). */
    rc = cache_exec(db, "PRAGMA journal_mode = WAL", why, why_size);
    if (cache_is_damage(rc)) {
      result = ATTACH_DAMAGED;
      goto done;
    }
    if ((rc & 0xff) == SQLITE_READONLY) readonly = 1;
  }
  user->v2 = cache_has_column(db, "mac");
  rc = check_layout(db, user->v2, why, why_size);
  if (rc != SQLITE_OK) {
    result = cache_is_damage(rc) ? ATTACH_DAMAGED : ATTACH_FAILED;
    if (result == ATTACH_FAILED)
      snprintf(why + strlen(why), why_size - strlen(why),
               "; its kernels table is not the one sdpa-jit writes");
    goto done;
  }
  if (readonly || immutable) {
    reader = db; /* the one connection; no writer */
    db = NULL;
  } else {
    tune_writer(db);
    rc = connect(user->path, 1, 0, &reader);
    if (rc != SQLITE_OK) {
      snprintf(why, why_size, "a second connection failed: %s", sqlite3_errstr(rc));
      goto done;
    }
  }
  user->db = reader;
  user->readonly = readonly || immutable;
  user->immutable = immutable;
  cache->writer = db;
  db = NULL;
  result = ATTACH_OK;
done:
  sqlite3_close_v2(db);
  return result;
}

/* --------------------------------------------------------- moving aside */

/* Removes our moved-aside copies of `path` beyond the newest kept ones
 * (regular files of ours named <name>.corrupt-*, and their companions). */
static void reap_copies(const char *dir, const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s.corrupt-", base);
  DIR *d = opendir(dir);
  if (!d) return;
  struct copy {
    char name[512];
    time_t mtime;
  } copies[64];
  size_t count = 0;
  struct dirent *e;
  while ((e = readdir(d)) && count < 64) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    size_t n = strlen(e->d_name);
    if ((n > 4 && !strcmp(e->d_name + n - 4, "-wal")) ||
        (n > 8 && !strcmp(e->d_name + n - 8, "-journal")))
      continue;
    char full[4200];
    struct stat st;
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    snprintf(copies[count].name, sizeof copies[count].name, "%s", e->d_name);
    copies[count++].mtime = st.st_mtime;
  }
  closedir(d);
  for (; count > CORRUPT_COPIES_KEPT; count--) {
    size_t oldest = 0;
    for (size_t i = 1; i < count; i++)
      if (copies[i].mtime < copies[oldest].mtime) oldest = i;
    static const char *const suffixes[] = {"", "-wal", "-journal"};
    for (size_t s = 0; s < 3; s++) {
      char *full = NULL;
      if (asprintf(&full, "%s/%s%s", dir, copies[oldest].name, suffixes[s]) < 0) continue;
      unlink(full);
      free(full);
    }
    copies[oldest] = copies[count - 1];
  }
}

/* Renames our damaged database (and its -wal / -journal files) to
 * <path>.corrupt-<unixtime>-<pid>[-n] and removes its -shm index.
 * Returns 0, or an errno value (the file then stays where it was). */
static int move_aside(const char *path, char *dest, size_t dest_size) {
  struct stat st;
  char from[4200], to[4200];
  int n = snprintf(dest, dest_size, "%s.corrupt-%lld-%ld", path,
                   (long long)cache_now_seconds(), (long)getpid());
  if (n < 0 || (size_t)n >= dest_size) return ENAMETOOLONG;
  for (int i = 2; lstat(dest, &st) == 0 && i < 100; i++) {
    n = snprintf(dest, dest_size, "%s.corrupt-%lld-%ld-%d", path,
                 (long long)cache_now_seconds(), (long)getpid(), i);
    if (n < 0 || (size_t)n >= dest_size) return ENAMETOOLONG;
  }
  if (rename(path, dest) != 0) return errno;
  static const char *const companions[] = {"-wal", "-journal"};
  for (size_t i = 0; i < sizeof companions / sizeof companions[0]; i++) {
    snprintf(from, sizeof from, "%s%s", path, companions[i]);
    snprintf(to, sizeof to, "%s%s", dest, companions[i]);
    if (lstat(from, &st) == 0 && rename(from, to) != 0) unlink(from);
  }
  snprintf(from, sizeof from, "%s-shm", path);
  unlink(from);
  return 0;
}

/* Closes the user's connections (both locks held, or while opening). */
static void close_user(sdpa_cache *cache) {
  sqlite3_close_v2(cache->user.db);
  sqlite3_close_v2(cache->writer);
  cache->user.db = NULL;
  cache->writer = NULL;
}

void cache_user_replace(sdpa_cache *cache, warning_list *w, const char *reason) {
  char dest[4200], why[512] = "";
  const char *path = cache->user.path;
  close_user(cache);
  cache->generation++;
  if (cache->access == SDPA_CACHE_READ_ONLY || cache->user.readonly) {
    cache->user.readonly = 0;
    cache_warn(w,
               "the kernel cache %s %s; it is opened read-only here, so it is left "
               "as it is: compiled kernels are kept in memory; run `sdpa-jit verify` "
               "to recover it",
               path, reason);
    return;
  }
  int err = move_aside(path, dest, sizeof dest);
  if (err != 0) {
    cache_warn(w,
               "the kernel cache %s %s and could not be moved aside (%s): compiled "
               "kernels are kept in memory for this process only; remove the file "
               "or set SDPA_JIT_CACHE to another path",
               path, reason, strerror(err));
    return;
  }
  reap_copies(cache->dir, path);
  err = create_file(path);
  if (err != 0 && err != EEXIST) snprintf(why, sizeof why, "%s", strerror(err));
  int readonly_file = 0;
  char seen[512];
  const file_kind kind = err == 0 ? FILE_EMPTY : err == EEXIST
                             ? classify(path, &readonly_file, seen, sizeof seen)
                             : FILE_BAD;
  if ((kind == FILE_EMPTY || kind == FILE_OURS) && !readonly_file &&
      attach_user(cache, kind, 0, 0, why, sizeof why) == ATTACH_OK) {
    cache_warn(w, "the kernel cache %s %s; moved it to %s and started a new one", path,
               reason, dest);
    return;
  }
  close_user(cache);
  cache_warn(w,
             "the kernel cache %s %s; moved it to %s, but a new one could not be "
             "started (%s): compiled kernels are kept in memory for this process "
             "only; set SDPA_JIT_CACHE to a writable file path",
             path, reason, dest, why);
}

void cache_layer_failed(sdpa_cache *cache, cache_layer *layer, int rc, const char *what,
                        const char *message, warning_list *w) {
  char reason[700];
  if (!message || !message[0])
    message = layer->db ? sqlite3_errmsg(layer->db) : sqlite3_errstr(rc);
  if (!layer->shipped && cache_is_damage(rc)) {
    snprintf(reason, sizeof reason, "is damaged (%s)", message);
    cache_user_replace(cache, w, reason);
    return;
  }
  if (layer->warned) return;
  layer->warned = 1;
  cache_warn(w,
             "could not %s the %skernel cache %s (%s); its kernels are treated as "
             "missing%s",
             what, layer->shipped ? "shipped " : "", layer->path, message,
             layer->shipped ? "; rebuild or remove that file"
                            : "; run `sdpa-jit verify`, or set SDPA_JIT_CACHE to "
                              "another file");
}

/* ----------------------------------------------------------- user's open */

/* The warning (and, when required, the error) of an unusable location. */
static sdpa_status unusable(warning_list *w, const char *path, const char *why) {
  cache_warn(w,
             "cannot use %s as the kernel cache: %s; compiled kernels are kept in "
             "memory for this process only (set SDPA_JIT_CACHE to a file in a "
             "directory of your own)",
             path, why);
  return sdpa_error_set(SDPA_STATUS_CACHE_ERROR, "cannot use %s as the kernel cache: %s",
                        path, why);
}

sdpa_status cache_user_open(sdpa_cache *cache, const char *path, warning_list *w) {
  const int write_access = cache->access != SDPA_CACHE_READ_ONLY;
  const int may_create = cache->access == SDPA_CACHE_READ_WRITE;
  char why[700] = "", reason[800];
  char *dir = directory_of(path), *canonical = NULL;
  sdpa_status status = SDPA_STATUS_SUCCESS;
  if (!dir) return sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "out of host memory");

  struct stat st;
  if (stat(dir, &st) != 0) {
    const int err = errno, missing = err == ENOENT || err == ENOTDIR;
    if (!missing || !may_create || make_directories(dir) != 0) {
      if (missing && !may_create)
        snprintf(why, sizeof why, "there is no cache there (its directory %s does not "
                                  "exist, and this command creates nothing)",
                 dir);
      else
        snprintf(why, sizeof why, "its directory %s cannot be %s (%s)", dir,
                 missing ? "created" : "read", strerror(missing ? errno : err));
      status = unusable(w, path, why);
      goto done;
    }
  }
  canonical = realpath(dir, NULL);
  if (!canonical) {
    snprintf(why, sizeof why, "cannot resolve the directory %s (%s)", dir, strerror(errno));
    status = unusable(w, path, why);
    goto done;
  }
  if (directory_trusted(canonical, why, sizeof why) != 0) {
    status = unusable(w, path, why);
    goto done;
  }
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
    status = unusable(w, path, "it names a directory, not a file");
    goto done;
  }
  free(cache->dir);
  cache->dir = canonical;
  canonical = NULL;
  free(cache->user.path);
  if (asprintf(&cache->user.path, "%s/%s", cache->dir, base) < 0) {
    cache->user.path = NULL;
    status = sdpa_error_set(SDPA_STATUS_OUT_OF_MEMORY, "out of host memory");
    goto done;
  }
  const char *file = cache->user.path;

  int readonly_file = 0;
  file_kind kind = classify(file, &readonly_file, why, sizeof why);
  for (int tries = 0; kind == FILE_NONE && may_create && tries < 3; tries++) {
    const int err = create_file(file);
    if (err == 0) {
      kind = FILE_EMPTY;
    } else if (err == EEXIST) { /* another process made it first */
      kind = classify(file, &readonly_file, why, sizeof why);
    } else {
      snprintf(why, sizeof why, "cannot create it (%s)", strerror(err));
      status = unusable(w, file, why);
      goto done;
    }
  }
  switch (kind) {
  case FILE_BAD: status = unusable(w, file, why); goto done;
  case FILE_FOREIGN:
  case FILE_UNKNOWN:
    snprintf(reason, sizeof reason, "%s; it is left untouched", why);
    status = unusable(w, file, reason);
    goto done;
  case FILE_NONE:
  case FILE_EMPTY:
    if (!may_create) {
      status = unusable(w, file,
                        kind == FILE_NONE ? "there is no cache there (this command "
                                            "creates nothing)"
                                          : "the file holds no cache yet");
      goto done;
    }
    break;
  case FILE_OURS: break;
  }

  struct statvfs fs;
  const int readonly_fs = statvfs(cache->dir, &fs) == 0 && (fs.f_flag & ST_RDONLY);
  const int dir_writable = access(cache->dir, W_OK) == 0;
  const int immutable = readonly_fs || (kind == FILE_OURS && !dir_writable);
  const int readonly = !write_access || readonly_file || immutable;
  if (kind != FILE_OURS && (readonly_fs || !dir_writable)) {
    status = unusable(w, file, "its directory cannot be written");
    goto done;
  }

  switch (attach_user(cache, kind, readonly, immutable, why, sizeof why)) {
  case ATTACH_OK:
    if (cache->user.readonly && write_access)
      cache_warn(w,
                 "the kernel cache %s cannot be written (%s): kernels already in it "
                 "are used, new ones are kept in memory for this process only",
                 file,
                 readonly_fs ? "a read-only file system"
                 : readonly_file ? "a read-only file"
                                 : "its directory is read-only");
    break;
  case ATTACH_DAMAGED:
    if (!write_access) {
      snprintf(reason, sizeof reason, "it is damaged (%s); run `sdpa-jit verify`", why);
      status = unusable(w, file, reason);
      break;
    }
    snprintf(reason, sizeof reason, "is not a usable database (%s)", why);
    cache_user_replace(cache, w, reason);
    if (!cache->user.db)
      status = sdpa_error_set(SDPA_STATUS_CACHE_ERROR, "%s", w->text[w->count - 1]);
    break;
  case ATTACH_NEWER:
    snprintf(reason, sizeof reason,
             "it was written by a newer sdpa-jit (%s) and is left untouched", why);
    status = unusable(w, file, reason);
    break;
  case ATTACH_FAILED: status = unusable(w, file, why); break;
  }
done:
  if (status != SDPA_STATUS_SUCCESS) close_user(cache);
  free(dir);
  free(canonical);
  return status;
}

/* --------------------------------------------------------------- shipped */

int cache_shipped_attach(cache_layer *layer, char *why, size_t why_size) {
  sqlite3 *db = NULL;
  int app_id = 0, version = 0, ok = -1;
  int rc = connect(layer->path, 1, 1, &db);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errstr(rc));
    return -1;
  }
  rc = cache_pragma_int(db, "PRAGMA application_id", &app_id);
  if (rc == SQLITE_OK) rc = cache_pragma_int(db, "PRAGMA user_version", &version);
  if (rc != SQLITE_OK) {
    snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    goto done;
  }
  if (app_id != SDPA_CACHE_APPLICATION_ID) {
    snprintf(why, why_size, "not an sdpa-jit cache (application_id 0x%08x)",
             (unsigned)app_id);
    goto done;
  }
  if (version < 1 || version > SDPA_CACHE_SCHEMA_VERSION) {
    snprintf(why, why_size, "schema version %d; this sdpa-jit reads 1 to %d", version,
             SDPA_CACHE_SCHEMA_VERSION);
    goto done;
  }
  layer->v2 = cache_has_column(db, "mac");
  if (check_layout(db, layer->v2, why, why_size) != SQLITE_OK) goto done;
  ok = 0;
done:
  if (ok == 0) {
    layer->db = db;
    layer->immutable = 1;
  } else {
    sqlite3_close_v2(db);
  }
  return ok;
}
