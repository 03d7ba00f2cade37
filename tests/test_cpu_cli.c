/*
 * test_cpu_cli.c — the `sdpa-jit` command line tool, run as a program.
 *
 * Runs the built binary ($SDPA_JIT_CLI, set by ctest; else
 * SDPA_TEST_BINARY_DIR/sdpa-jit) against a fresh temporary cache per test
 * and checks what a user sees: exit codes (0 success, 1 failure, 2 usage),
 * help texts that name each option, the summary line of `preheat`, the row
 * it leaves in the database (read with the sqlite3 shell, as a user
 * would), `ls --json`, `show`, `dump -o` producing the ELF cubin, and
 * `prune` removing it. No GPU is needed: preheat names its arch (sm_80).
 * $SDPA_JIT_CACHE points into the temporary directory so no test touches
 * the user's own cache.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "sdpa_jit.h"

/* ------------------------------------------------------------- helpers */

static const char *cli_binary(void) {
  const char *path = getenv("SDPA_JIT_CLI");
  return path && *path ? path : SDPA_TEST_BINARY_DIR "/sdpa-jit";
}

/* A finished run of the CLI: exit status, stdout, stderr. */
typedef struct run_result {
  int status;
  char *out;
  char *err;
} run_result;

static void run_result_free(run_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

/* Runs `sdpa-jit <args>` (args formatted, passed through /bin/sh, so the
 * caller quotes) with stdin from /dev/null and stdout/stderr captured in
 * files under `dir`. */
static run_result run_cli_args(const char *dir, const char *stdout_to, const char *args) {
  char command[8192], out_path[1024], err_path[1024];
  snprintf(out_path, sizeof out_path, "%s/cli.out", dir);
  snprintf(err_path, sizeof err_path, "%s/cli.err", dir);
  if (!stdout_to) stdout_to = out_path;
  snprintf(command, sizeof command, "'%s' %s </dev/null >'%s' 2>'%s'", cli_binary(), args,
           stdout_to, err_path);
  if (strcmp(stdout_to, out_path) != 0) sdpa_test_write_file(out_path, "", 0);
  int raw = system(command);
  run_result r;
  ck_assert_msg(raw != -1 && WIFEXITED(raw), "could not run: %s", command);
  r.status = WEXITSTATUS(raw);
  r.out = (char *)sdpa_test_read_file(out_path, NULL);
  r.err = (char *)sdpa_test_read_file(err_path, NULL);
  return r;
}

static run_result run_cli(const char *dir, const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return run_cli_args(dir, NULL, args);
}

/* run_cli with stdout sent to `target` (e.g. /dev/full). */
static run_result run_cli_to(const char *dir, const char *target, const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return run_cli_args(dir, target, args);
}

/* Makes an empty cache at `db` by hand, as README says one can. */
static void make_empty_cache(const char *db) {
  char command[2048];
  snprintf(command, sizeof command, "sqlite3 '%s' < '%s/cache/schema.sql' >/dev/null", db,
           SDPA_TEST_SOURCE_DIR);
  ck_assert_int_eq(system(command), 0);
}

/* The last non-empty line of `text`, copied into buf. */
static const char *last_line(const char *text, char *buf, size_t size) {
  size_t n = strlen(text);
  while (n > 0 && text[n - 1] == '\n') n--;
  size_t start = n;
  while (start > 0 && text[start - 1] != '\n') start--;
  snprintf(buf, size, "%.*s", (int)(n - start), text + start);
  return buf;
}

/* Runs the sqlite3 shell on `db` with `sql` and returns its trimmed
 * output (malloc'd). */
static char *sqlite_query(const char *db, const char *sql) {
  char command[2048];
  snprintf(command, sizeof command, "sqlite3 '%s' \"%s\" 2>&1", db, sql);
  FILE *p = popen(command, "r");
  ck_assert_msg(p != NULL, "popen failed: %s", command);
  char *out = calloc(1, 4096);
  ck_assert_ptr_nonnull(out);
  size_t n = fread(out, 1, 4095, p);
  out[n] = '\0';
  int status = pclose(p);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "sqlite3 failed on %s: %s", db, out);
  while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r')) out[--n] = 0;
  return out;
}

/* The value of the first "name":"..." string field in JSON text. */
static int json_string_field(const char *json, const char *name, char *buf,
                             size_t size) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":\"", name);
  const char *p = strstr(json, pattern);
  if (!p) return -1;
  p += strlen(pattern);
  const char *end = strchr(p, '"');
  if (!end) return -1;
  snprintf(buf, size, "%.*s", (int)(end - p), p);
  return 0;
}

/* The value of the first "name":N integer field in JSON text. */
static int json_int_field(const char *json, const char *name,
                          long long *out) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":", name);
  const char *p = strstr(json, pattern);
  if (!p) return -1;
  char *end = NULL;
  *out = strtoll(p + strlen(pattern), &end, 10);
  return end == p + strlen(pattern) ? -1 : 0;
}

/* A fresh directory per test; $SDPA_JIT_CACHE points into it. */
static char *test_dir;
static char cache_db[1024];

static void setup(void) {
  test_dir = sdpa_test_tmpdir("cli");
  ck_assert_ptr_nonnull(test_dir);
  snprintf(cache_db, sizeof cache_db, "%s/kernels.sqlite", test_dir);
  char fallback[1024];
  snprintf(fallback, sizeof fallback, "%s/default.sqlite", test_dir);
  setenv("SDPA_JIT_CACHE", fallback, 1);
  ck_assert_msg(access(cli_binary(), X_OK) == 0,
                "the CLI is not built at %s (set SDPA_JIT_CLI)",
                cli_binary());
}

static void teardown(void) {
  sdpa_test_rmtree(test_dir);
  free(test_dir);
  test_dir = NULL;
}

/* ------------------------------------------------ help and usage errors */

typedef struct command_help {
  const char *command;
  const char *mentions[16]; /* NULL-terminated */
} command_help;

static const command_help helps[] = {
    {"preheat",
     {"--arch", "--dtype", "--head-dim", "--head-dim-v", "--mask", "--layout",
      "--lse", "--deterministic", "--even", "--dq", "--tiles", "-j", "--json",
      NULL}},
    {"ls", {"--json", NULL}},
    {"show", {"KEY", NULL}},
    {"stats", {"entries", NULL}},
    {"verify", {"removed", NULL}},
    {"prune", {"--max-bytes", "--older-than", NULL}},
    {"dump", {"KEY", "-o", NULL}},
    {"path", {"(memory)", NULL}},
};

START_TEST(test_help_of_every_command) {
  size_t count = sizeof helps / sizeof helps[0];
  for (size_t i = 0; i < count; i++) {
    const command_help *h = &helps[i];
    run_result r = run_cli(test_dir, "%s --help", h->command);
    ck_assert_msg(r.status == 0, "%s --help exited %d: %s", h->command,
                  r.status, r.err);
    char usage[64];
    snprintf(usage, sizeof usage, "usage: sdpa-jit %s", h->command);
    ck_assert_msg(strstr(r.out, usage), "%s --help lacks '%s':\n%s",
                  h->command, usage, r.out);
    for (size_t m = 0; h->mentions[m]; m++)
      ck_assert_msg(strstr(r.out, h->mentions[m]),
                    "%s --help does not mention %s:\n%s", h->command,
                    h->mentions[m], r.out);
    /* Global options are named too, and -h works as well as --help. */
    ck_assert_msg(strstr(r.out, "--cache"), "%s --help lacks --cache",
                  h->command);
    run_result_free(&r);
    r = run_cli(test_dir, "-h %s", h->command);
    ck_assert_int_eq(r.status, 0);
    run_result_free(&r);
    r = run_cli(test_dir, "--cache '%s' %s -h", cache_db, h->command);
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(strstr(r.out, usage), "%s -h after --cache: %s",
                  h->command, r.out);
    run_result_free(&r);
  }
  /* The top-level help lists every command and the global options. */
  run_result r = run_cli(test_dir, "--help");
  ck_assert_int_eq(r.status, 0);
  for (size_t i = 0; i < count; i++)
    ck_assert_msg(strstr(r.out, helps[i].command), "--help lacks %s",
                  helps[i].command);
  const char *globals[] = {"--cache", "--readonly", "--no-disk", "--version"};
  for (size_t i = 0; i < 4; i++)
    ck_assert_msg(strstr(r.out, globals[i]), "--help lacks %s", globals[i]);
  run_result_free(&r);
}
END_TEST

START_TEST(test_version) {
  run_result r = run_cli(test_dir, "--version");
  ck_assert_int_eq(r.status, 0);
  ck_assert_msg(strstr(r.out, SDPA_JIT_VERSION_STRING), "--version: %s",
                r.out);
  run_result_free(&r);
}
END_TEST

/* Each of these is a usage error: exit 2, a message on stderr that says
 * what is wrong, nothing done. */
typedef struct usage_case {
  const char *args;
  const char *stderr_mentions;
} usage_case;

static const usage_case usage_cases[] = {
    {"frobnicate", "unknown command 'frobnicate'"},
    {"", "usage"},
    {"ls --bogus", "unknown option '--bogus'"},
    {"--cache", "needs a value"},
    {"ls extra", "unexpected argument 'extra'"},
    {"show", "missing KEY"},
    {"dump", "missing KEY"},
    {"preheat --dtype fp32", "bf16"},
    {"preheat --mask diagonal", "causal_br"},
    {"preheat --layout sbhd", "thd"},
    {"preheat --lse sparse", "strided"},
    {"preheat --head-dim 64,abc", "integers"},
    {"preheat --deterministic 2", "0 to 1"},
    {"preheat --even 0,1,7", "0 to 1"},
    {"preheat --dq both", "main, convert"},
    {"preheat --tiles big", "default, small"},
    {"preheat -j 0", "thread count"},
    {"preheat --head-dim 100", "--head-dim 100"},
    {"preheat --head-dim 64 --head-dim-v 72", "head_dim_v"},
    {"preheat --no-disk", "--no-disk"},
    {"preheat --arch", "needs a value"},
    {"prune", "--max-bytes or --older-than"},
    {"prune --max-bytes 12Q", "--max-bytes '12Q'"},
    {"prune --max-bytes -5", "--max-bytes '-5'"},
    {"prune --older-than 3w", "--older-than '3w'"},
};

START_TEST(test_usage_errors_exit_2) {
  for (size_t i = 0; i < sizeof usage_cases / sizeof usage_cases[0]; i++) {
    const usage_case *u = &usage_cases[i];
    run_result r = run_cli(test_dir, "--cache '%s' %s", cache_db, u->args);
    ck_assert_msg(r.status == 2, "'%s' exited %d (want 2); stderr: %s",
                  u->args, r.status, r.err);
    ck_assert_msg(strstr(r.err, u->stderr_mentions),
                  "'%s': stderr lacks '%s': %s", u->args, u->stderr_mentions,
                  r.err);
    ck_assert_msg(r.out[0] == '\0', "'%s' printed on stdout: %s", u->args,
                  r.out);
    run_result_free(&r);
  }
  /* Nothing above may have created the cache. */
  struct stat st;
  ck_assert_msg(stat(cache_db, &st) != 0,
                "a usage error created the cache file");
}
END_TEST

/* dump refuses to write a binary to a terminal, and says to use -o. */
START_TEST(test_dump_refuses_a_terminal) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0) {
    printf("skipped test_dump_refuses_a_terminal: no pseudo terminal\n");
    return;
  }
  ck_assert_int_eq(grantpt(master), 0);
  ck_assert_int_eq(unlockpt(master), 0);
  const char *slave_name = ptsname(master);
  ck_assert_ptr_nonnull(slave_name);
  char err_path[1024];
  snprintf(err_path, sizeof err_path, "%s/dump.err", test_dir);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int slave = open(slave_name, O_RDWR | O_NOCTTY);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (slave < 0 || err < 0) _exit(99);
    dup2(slave, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execl(cli_binary(), "sdpa-jit", "--cache", cache_db, "dump", "abcdef12",
          (char *)NULL);
    _exit(98);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  close(master);
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 2);
  char *err = (char *)sdpa_test_read_file(err_path, NULL);
  ck_assert_msg(strstr(err, "terminal") && strstr(err, "-o"),
                "dump on a terminal: %s", err);
  free(err);
}
END_TEST

/* ------------------------------------------------ an empty cache */

START_TEST(test_path_and_global_options) {
  char line[1200];
  /* An explicit --cache that holds no cache: inspection fails and creates
   * nothing. */
  run_result r = run_cli(test_dir, "--cache '%s' path", cache_db);
  ck_assert_msg(r.status == 1 && strstr(r.err, "no cache there"), "path: %d %s", r.status,
                r.err);
  run_result_free(&r);
  struct stat st;
  ck_assert(stat(cache_db, &st) != 0);

  make_empty_cache(cache_db);
  r = run_cli(test_dir, "--cache '%s' path", cache_db);
  ck_assert_msg(r.status == 0, "path: %s", r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), cache_db);
  run_result_free(&r);

  /* A global option after the command means the same. */
  r = run_cli(test_dir, "path --cache '%s'", cache_db);
  ck_assert_int_eq(r.status, 0);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), cache_db);
  run_result_free(&r);

  /* Without --cache the runtime's default ($SDPA_JIT_CACHE) applies, also
   * when nothing is there yet (a note says so). */
  r = run_cli(test_dir, "path");
  ck_assert_int_eq(r.status, 0);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), getenv("SDPA_JIT_CACHE"));
  ck_assert_msg(strstr(r.err, "no cache at"), "path: %s", r.err);
  run_result_free(&r);
  ck_assert(stat(getenv("SDPA_JIT_CACHE"), &st) != 0);

  r = run_cli(test_dir, "--no-disk path");
  ck_assert_int_eq(r.status, 0);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), "(memory)");
  run_result_free(&r);
}
END_TEST

/* Every command given a --cache it cannot use fails (1) and creates
 * nothing: a missing file, a typo'd directory. */
START_TEST(test_unusable_cache_is_an_error) {
  char missing_dir[1200];
  snprintf(missing_dir, sizeof missing_dir, "%s/no/such/dir/k.sqlite", test_dir);
  const char *paths[] = {cache_db, missing_dir};
  const char *commands[] = {"ls", "ls --json", "stats", "show 0123456789ab", "dump 0123456789ab -o x",
                            "verify", "prune --max-bytes 0", "path"};
  for (size_t p = 0; p < 2; p++)
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
      run_result r = run_cli(test_dir, "--cache '%s' %s", paths[p], commands[i]);
      ck_assert_msg(r.status == 1, "%s on %s exited %d: %s", commands[i], paths[p],
                    r.status, r.err);
      ck_assert_msg(strstr(r.err, "cannot use") && !strstr(r.out, "(memory)"),
                    "%s: %s / %s", commands[i], r.out, r.err);
      run_result_free(&r);
    }
  struct stat st;
  char no[1200];
  snprintf(no, sizeof no, "%s/no", test_dir);
  ck_assert(stat(cache_db, &st) != 0 && stat(no, &st) != 0);
}
END_TEST

START_TEST(test_empty_cache) {
  make_empty_cache(cache_db);
  run_result r = run_cli(test_dir, "--cache '%s' ls --json", cache_db);
  ck_assert_msg(r.status == 0, "ls --json: %s", r.err);
  char line[1200];
  ck_assert_str_eq(last_line(r.out, line, sizeof line), "[]");
  run_result_free(&r);

  r = run_cli(test_dir, "--cache '%s' ls", cache_db);
  ck_assert_msg(r.status == 0, "ls: %s", r.err);
  ck_assert_msg(strstr(r.out, "no entries in") && strstr(r.out, cache_db), "ls: %s", r.out);
  run_result_free(&r);

  r = run_cli(test_dir, "--cache '%s' stats --json", cache_db);
  ck_assert_msg(r.status == 0, "stats --json: %s", r.err);
  long long entries = -1;
  ck_assert_int_eq(json_int_field(r.out, "entries", &entries), 0);
  ck_assert_int_eq(entries, 0);
  run_result_free(&r);

  r = run_cli(test_dir, "--cache '%s' verify", cache_db);
  ck_assert_msg(r.status == 0, "verify: %s", r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line),
                   "checked 0, removed 0");
  run_result_free(&r);

  r = run_cli(test_dir, "--cache '%s' prune --older-than 1d", cache_db);
  ck_assert_msg(r.status == 0, "prune: %s", r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), "removed 0");
  run_result_free(&r);

  /* An unknown key is a failure (1) with a message, not a usage error. */
  r = run_cli(test_dir, "--cache '%s' show 0123456789abcdef", cache_db);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "sdpa-jit show") &&
                    strstr(r.err, "0123456789abcdef"),
                "show of an unknown key: %s", r.err);
  ck_assert_str_eq(r.out, "");
  run_result_free(&r);

  r = run_cli(test_dir, "--cache '%s' dump 0123456789abcdef -o '%s/x.cubin'",
              cache_db, test_dir);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strstr(r.err, "sdpa-jit dump"), "dump: %s", r.err);
  run_result_free(&r);

  /* The default location with no cache yet: inspection says so and
   * succeeds, maintenance has nothing to do; nothing is created. */
  r = run_cli(test_dir, "ls --json");
  ck_assert_msg(r.status == 0 && strstr(r.out, "[]") && strstr(r.err, "no cache at"),
                "ls at the default location: %s / %s", r.out, r.err);
  run_result_free(&r);
  r = run_cli(test_dir, "verify");
  ck_assert_msg(r.status == 0, "verify at the default location: %s", r.err);
  run_result_free(&r);
  struct stat st;
  ck_assert(stat(getenv("SDPA_JIT_CACHE"), &st) != 0);
}
END_TEST

/* Output that cannot be written is a failure: every command that prints
 * checks its stdout (sent to /dev/full here). */
START_TEST(test_output_write_errors) {
  struct stat st;
  if (stat("/dev/full", &st) != 0) {
    printf("skipped test_output_write_errors: no /dev/full\n");
    return;
  }
  make_empty_cache(cache_db);
  const char *commands[] = {"ls", "ls --json", "stats", "stats --json", "path",
                            "verify", "--help", "ls --help", "--version"};
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    run_result r = run_cli_to(test_dir, "/dev/full", "--cache '%s' %s", cache_db,
                              commands[i]);
    ck_assert_msg(r.status == 1 && strstr(r.err, "cannot write the output"),
                  "%s > /dev/full exited %d: %s", commands[i], r.status, r.err);
    run_result_free(&r);
  }
}
END_TEST

/* Strings from the database are escaped: a hostile row's key text with an
 * escape sequence and a bell in its dtype reach the terminal as text. */
START_TEST(test_database_strings_escaped) {
  make_empty_cache(cache_db);
  char sql[1024];
  snprintf(sql, sizeof sql,
           "INSERT INTO kernels (key_hash, key_text, arch, dtype, cubin, cubin_bytes, "
           "checksum, created, last_used) VALUES ('%s', 'evil' || char(27) || '[2J' || "
           "char(10) || 'x', 90, 'bf' || char(7), x'00', 1, 0, 1, 1)",
           "abcdefabcdefabcdefabcdefabcdef01");
  char *out = sqlite_query(cache_db, sql);
  free(out);
  const char *commands[] = {"ls", "show abcdefabcdef", "ls --json", "show abcdefabcdef --json",
                            "verify"};
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    run_result r = run_cli(test_dir, "--cache '%s' %s", cache_db, commands[i]);
    ck_assert_msg(!strchr(r.out, 27) && !strchr(r.out, 7) && !strchr(r.err, 27),
                  "%s printed a raw control character: %s", commands[i], r.out);
    ck_assert_msg(strstr(r.out, "evil") || strstr(r.out, "abcdefabcdef"), "%s: %s",
                  commands[i], r.out);
    run_result_free(&r);
  }
  /* verify named the bad row it removed (its blob is no cubin) */
  char *rows = sqlite_query(cache_db, "select count(*) from kernels");
  ck_assert_str_eq(rows, "0");
  free(rows);
}
END_TEST

/* Files that are not ours are never changed by any command: another
 * program's SQLite database, and a text file (as `stats --cache
 * /etc/passwd` would meet). */
START_TEST(test_other_files_untouched) {
  char other[1200], text[1200];
  snprintf(other, sizeof other, "%s/other.db", test_dir);
  snprintf(text, sizeof text, "%s/passwd", test_dir);
  char *out = sqlite_query(other, "create table t (x); insert into t values (1)");
  free(out);
  sdpa_test_write_file(text, "root:x:0:0:root:/root:/bin/bash\n", 32);
  const char *files[] = {other, text};
  const char *commands[] = {"ls", "stats", "verify", "prune --max-bytes 0",
                            "show 0123456789ab", "preheat --arch 80 --dtype bf16 --head-dim "
                            "64 --mask none --layout bshd --tiles default"};
  for (size_t f = 0; f < 2; f++) {
    size_t before_size = 0;
    unsigned char *before = sdpa_test_read_file(files[f], &before_size);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
      run_result r = run_cli(test_dir, "--cache '%s' %s", files[f], commands[i]);
      ck_assert_msg(r.status == 1, "%s on %s exited %d", commands[i], files[f], r.status);
      ck_assert_msg(strstr(r.err, "left untouched"), "%s: %s", commands[i], r.err);
      run_result_free(&r);
      size_t after_size = 0;
      unsigned char *after = sdpa_test_read_file(files[f], &after_size);
      ck_assert_msg(after_size == before_size && !memcmp(before, after, before_size),
                    "%s changed %s", commands[i], files[f]);
      free(after);
    }
    free(before);
  }
  ck_assert_int_eq(sdpa_test_count_prefixed(test_dir, "other.db", NULL), 1); /* no -wal */
  ck_assert_int_eq(sdpa_test_count_prefixed(test_dir, "passwd", NULL), 1);
}
END_TEST

/* ------------------------------------------------ preheat and its row */

#define ONE_KEY \
  "--arch 80 --dtype bf16 --head-dim 128 --mask none --layout bshd --dq convert " \
  "--tiles default"

START_TEST(test_preheat_lifecycle) {
  char line[1200];

  /* 1. First preheat compiles the key. */
  run_result r =
      run_cli(test_dir, "preheat " ONE_KEY " -j 2 --cache '%s'", cache_db);
  ck_assert_msg(r.status == 0, "first preheat exited %d:\n%s", r.status,
                r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line),
                   "compiled 1, cached 0, failed 0");
  ck_assert_msg(strstr(r.err, "[1/1] compiled ") && strstr(r.err, "arch=80"),
                "no progress line on stderr: %s", r.err);
  run_result_free(&r);

  /* 2. A second identical run finds it on disk. */
  r = run_cli(test_dir, "--cache '%s' preheat " ONE_KEY " -j 2", cache_db);
  ck_assert_msg(r.status == 0, "second preheat exited %d:\n%s", r.status,
                r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line),
                   "compiled 0, cached 1, failed 0");
  run_result_free(&r);

  /* 3. The row is there for the sqlite3 shell. */
  char *rows =
      sqlite_query(cache_db, "select count(*), min(arch) from kernels");
  ck_assert_str_eq(rows, "1|80");
  free(rows);

  /* 4. ls --json lists it with its fields. */
  r = run_cli(test_dir, "--cache '%s' ls --json", cache_db);
  ck_assert_msg(r.status == 0, "ls --json: %s", r.err);
  ck_assert_msg(r.out[0] == '[', "ls --json is not an array: %s", r.out);
  char hash[64], key_text[512], dtype[16];
  long long cubin_bytes = 0, arch = 0, head_dim = 0;
  ck_assert_int_eq(json_string_field(r.out, "key_hash", hash, sizeof hash), 0);
  ck_assert_int_eq(strlen(hash), 32);
  ck_assert_int_eq(
      json_string_field(r.out, "key_text", key_text, sizeof key_text), 0);
  ck_assert_int_eq(json_string_field(r.out, "dtype", dtype, sizeof dtype), 0);
  ck_assert_str_eq(dtype, "bf16");
  ck_assert_int_eq(json_int_field(r.out, "arch", &arch), 0);
  ck_assert_int_eq(arch, 80);
  ck_assert_int_eq(json_int_field(r.out, "head_dim", &head_dim), 0);
  ck_assert_int_eq(head_dim, 128);
  ck_assert_int_eq(json_int_field(r.out, "cubin_bytes", &cubin_bytes), 0);
  ck_assert_int_gt(cubin_bytes, 0);
  ck_assert_msg(strstr(r.out, "\"readonly\":false"), "ls --json: %s", r.out);
  run_result_free(&r);

  /* ... and the table shows its 12-digit hash prefix on one row. */
  r = run_cli(test_dir, "--cache '%s' ls", cache_db);
  ck_assert_msg(r.status == 0, "ls: %s", r.err);
  char prefix[16];
  snprintf(prefix, sizeof prefix, "%.12s ", hash);
  const char *row = strstr(r.out, prefix);
  ck_assert_msg(row && strstr(row, "bf16") && strstr(row, "128/128") &&
                    strstr(row, "bshd"),
                "ls: %s", r.out);
  run_result_free(&r);

  /* 5. preheat --json reports the same key as cached, then a summary. */
  r = run_cli(test_dir, "--cache '%s' preheat " ONE_KEY " --json", cache_db);
  ck_assert_msg(r.status == 0, "preheat --json: %s", r.err);
  char wanted[128];
  snprintf(wanted, sizeof wanted, "\"hash\":\"%s\"", hash);
  ck_assert_msg(strstr(r.out, wanted) && strstr(r.out, "\"status\":\"cached\""),
                "preheat --json: %s", r.out);
  const char *summary = "{\"compiled\":0,\"cached\":1,\"failed\":0,";
  last_line(r.out, line, sizeof line);
  ck_assert_msg(strncmp(line, summary, strlen(summary)) == 0,
                "preheat --json summary: %s", line);
  run_result_free(&r);

  /* 6. show finds it by hash prefix and by key text. */
  r = run_cli(test_dir, "--cache '%s' show %.12s", cache_db, hash);
  ck_assert_msg(r.status == 0, "show prefix: %s", r.err);
  ck_assert_msg(strstr(r.out, hash) && strstr(r.out, cache_db),
                "show prints the hash and the cache path: %s", r.out);
  run_result_free(&r);
  r = run_cli(test_dir, "--cache '%s' show '%s'", cache_db, key_text);
  ck_assert_msg(r.status == 0, "show key text: %s", r.err);
  ck_assert_msg(strstr(r.out, hash), "show by key text: %s", r.out);
  run_result_free(&r);

  /* 7. dump writes the ELF cubin, as many bytes as the row says. */
  char cubin_path[1200];
  snprintf(cubin_path, sizeof cubin_path, "%s/k.cubin", test_dir);
  r = run_cli(test_dir, "--cache '%s' dump %.10s -o '%s'", cache_db, hash,
              cubin_path);
  ck_assert_msg(r.status == 0, "dump: %s", r.err);
  run_result_free(&r);
  size_t size = 0;
  char *cubin = (char *)sdpa_test_read_file(cubin_path, &size);
  ck_assert_int_eq((long long)size, cubin_bytes);
  ck_assert_msg(size >= 4 && (unsigned char)cubin[0] == 0x7f &&
                    cubin[1] == 'E' && cubin[2] == 'L' && cubin[3] == 'F',
                "the dumped cubin is not ELF");
  free(cubin);

  /* 8. stats counts it. */
  r = run_cli(test_dir, "--cache '%s' stats --json", cache_db);
  ck_assert_msg(r.status == 0, "stats: %s", r.err);
  long long entries = 0, stat_bytes = 0;
  ck_assert_int_eq(json_int_field(r.out, "entries", &entries), 0);
  ck_assert_int_eq(entries, 1);
  ck_assert_int_eq(json_int_field(r.out, "cubin_bytes", &stat_bytes), 0);
  ck_assert_int_eq(stat_bytes, cubin_bytes);
  run_result_free(&r);

  /* 9. Shipped: the same file given as --readonly serves another cache,
   * and its entry is listed as read-only. */
  char other_db[1200];
  snprintf(other_db, sizeof other_db, "%s/other.sqlite", test_dir);
  r = run_cli(test_dir, "--cache '%s' --readonly '%s' preheat " ONE_KEY,
              other_db, cache_db);
  ck_assert_msg(r.status == 0, "preheat with --readonly: %s", r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line),
                   "compiled 0, cached 1, failed 0");
  ck_assert_msg(strstr(r.err, "(shipped)"), "not from the shipped file: %s",
                r.err);
  run_result_free(&r);
  r = run_cli(test_dir, "ls --json --cache '%s' --readonly '%s'", other_db,
              cache_db);
  ck_assert_msg(r.status == 0, "ls with --readonly: %s", r.err);
  ck_assert_msg(strstr(r.out, hash) && strstr(r.out, "\"readonly\":true"),
                "ls --json with --readonly: %s", r.out);
  run_result_free(&r);

  /* 10. An unknown key is a failure with a message. */
  r = run_cli(test_dir, "--cache '%s' show ffffffffffff", cache_db);
  ck_assert_int_eq(r.status, 1);
  ck_assert_msg(strlen(r.err) > 0, "show of an unknown key said nothing");
  run_result_free(&r);

  /* 11. prune --max-bytes 0 removes it. */
  r = run_cli(test_dir, "--cache '%s' prune --max-bytes 0", cache_db);
  ck_assert_msg(r.status == 0, "prune: %s", r.err);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), "removed 1");
  run_result_free(&r);
  rows = sqlite_query(cache_db, "select count(*) from kernels");
  ck_assert_str_eq(rows, "0");
  free(rows);
  r = run_cli(test_dir, "--cache '%s' ls --json", cache_db);
  ck_assert_int_eq(r.status, 0);
  ck_assert_str_eq(last_line(r.out, line, sizeof line), "[]");
  run_result_free(&r);
}
END_TEST

/* FNV-1a of the file at `path`, read in pieces (the test process never
 * holds the file: a forked child's peak would count it). */
static uint64_t file_digest(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char piece[65536];
  uint64_t h = 1469598103934665603ull, size = 0;
  size_t n;
  while ((n = fread(piece, 1, sizeof piece, f)) > 0) {
    for (size_t i = 0; i < n; i++) h = (h ^ piece[i]) * 1099511628211ull;
    size += n;
  }
  ck_assert_int_eq(ferror(f), 0);
  fclose(f);
  return h ^ size;
}

/* Runs the CLI with `args` (argv, NULL-terminated, without the program),
 * stdout and stderr to /dev/null; asserts exit 0 and returns the peak
 * resident size of that process alone, KiB. */
static long cli_peak_kib(const char *const *args) {
  const char *argv[16];
  int n = 0;
  argv[n++] = cli_binary();
  for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* under AddressSanitizer, freed memory waits in a quarantine (256 MiB)
     * instead of being reused: measure without it */
    char asan[1024];
    const char *given = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof asan, "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0",
             given ? given : "", given && *given ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  struct rusage u;
  ck_assert_int_eq(wait4(pid, &status, 0, &u), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s %s exited %d", argv[0],
                argv[1], WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return u.ru_maxrss;
}

/* A million-row cache: `ls` streams (its peak memory stays within 32 MiB
 * of listing an empty cache's, where holding the rows would take
 * hundreds), `show` of a prefix a few thousand rows share answers in
 * well under a second, both read-only (the file is byte-identical). */
START_TEST(test_million_rows) {
  make_empty_cache(cache_db);
  const char *const ls_args[] = {"--cache", cache_db, "ls", NULL};
  const long empty_kib = cli_peak_kib(ls_args);
  char command[2048];
  snprintf(command, sizeof command,
           "sqlite3 '%s' \"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
           "WHERE i < 1000000) INSERT INTO kernels (key_hash, key_text, arch, dtype, head_dim, "
           "head_dim_v, cubin, cubin_bytes, checksum, created, last_used) SELECT "
           "printf('%%08x%%024x', (i %% 4096) * 1048573, i), 'sdpa_bwd;arch=90;n=' || i, 90, "
           "'bf16', 128, 128, x'00', 1, 0, 1, 1 FROM n\"",
           cache_db);
  ck_assert_int_eq(system(command), 0);
  const uint64_t before = file_digest(cache_db);

  double start = sdpa_test_now_ms();
  const long ls_kib = cli_peak_kib(ls_args);
  const double ls_ms = sdpa_test_now_ms() - start;
  ck_assert_msg(ls_kib - empty_kib < 32 * 1024,
                "ls of a million rows peaked at %ld KiB, an empty cache's at %ld KiB", ls_kib,
                empty_kib);

  /* 1,000,000 / 4096 = 244 rows share each 8-digit prefix */
  start = sdpa_test_now_ms();
  run_result r = run_cli(test_dir, "--cache '%s' show 00000000", cache_db);
  const double show_ms = sdpa_test_now_ms() - start;
  ck_assert_msg(r.status != 0 && strstr(r.err, "00000000"), "show of a shared prefix: %d %s",
                r.status, r.err);
  run_result_free(&r);
  ck_assert_msg(show_ms < 1000, "show of a prefix took %.0f ms", show_ms);

  ck_assert_msg(file_digest(cache_db) == before, "the cache changed under ls and show");
  printf("cli: a million rows: ls %.0f ms, peak %ld KiB (empty cache %ld KiB); show of a "
         "shared prefix %.0f ms\n",
         ls_ms, ls_kib, empty_kib, show_ms);
}
END_TEST

/* Runs `preheat <grid> --json -j 2` on the suite's cache, asserts exit 0
 * and a summary of `compiled` fresh keys; returns the run (free it). */
static run_result preheat_json(const char *grid, int compiled) {
  char line[1200], summary[96];
  run_result r = run_cli(test_dir, "--cache '%s' preheat %s --json -j 2", cache_db, grid);
  ck_assert_msg(r.status == 0, "preheat exited %d:\n%s", r.status, r.err);
  snprintf(summary, sizeof summary, "{\"compiled\":%d,\"cached\":0,\"failed\":0,", compiled);
  last_line(r.out, line, sizeof line);
  ck_assert_msg(strncmp(line, summary, strlen(summary)) == 0, "summary: %s", line);
  return r;
}

/* The default grid reaches both tile classes of an mma.sync BSHD point:
 * the table's tiles and the small-grid ones (64-row kv tiles), both
 * written by the convert kernel; THD has one. */
START_TEST(test_preheat_default_tiles) {
  run_result r = preheat_json("--arch 80 --dtype bf16 --head-dim 64 --mask none", 3);
  ck_assert_msg(strstr(r.out, "qt=128;kvt=128;warps=8;stages=1;lse=packed;layout=bshd;"),
                "no key with the table's tiles: %s", r.out);
  ck_assert_msg(strstr(r.out, "qt=128;kvt=64;warps=8;stages=2;lse=packed;layout=bshd;"),
                "no key with the small-grid tiles: %s", r.out);
  ck_assert_msg(strstr(r.out, "layout=thd;") && !strstr(r.out, "dq=main"),
                "THD key, convert kernels only: %s", r.out);
  run_result_free(&r);
}
END_TEST

/* On sm_90 the default grid's keys are the ones AUTO plans there: the
 * Hopper family's where it covers the point (one key a layout: its tiles
 * have no small-grid class; deterministic above head_dim 192 with one
 * Q / dO stage), mma.sync's elsewhere (head_dim_v 64 under head_dim
 * 256). */
START_TEST(test_preheat_sm90_families) {
  run_result r =
      preheat_json("--arch 90 --dtype bf16 --head-dim 96,256 --mask none --deterministic 1", 4);
  ck_assert_msg(strstr(r.out, "family=hopper;dtype=bf16;hd=96;hdv=96;qt=64;kvt=128;warps=12;"),
                "no Hopper key at head_dim 96: %s", r.out);
  ck_assert_msg(
      strstr(r.out, "family=hopper;dtype=bf16;hd=256;hdv=256;qt=64;kvt=64;warps=12;stages=1;"),
      "no one-stage Hopper key at deterministic head_dim 256: %s", r.out);
  ck_assert_msg(!strstr(r.out, "family=mma;"), "an mma.sync key: %s", r.out);
  run_result_free(&r);
  r = preheat_json("--arch 90 --dtype bf16 --head-dim 256 --head-dim-v 64 --mask none "
                   "--deterministic 1",
                   2);
  ck_assert_msg(strstr(r.out, "family=mma;dtype=bf16;hd=256;hdv=64;"),
                "no mma.sync key at head_dim 256, head_dim_v 64: %s", r.out);
  ck_assert_msg(!strstr(r.out, "family=hopper;"), "a Hopper key at head_dim_v 64: %s", r.out);
  run_result_free(&r);
}
END_TEST

/* Every multiple of 8 up to 256 is planned by default. Under
 * SDPA_JIT_ANY_HEAD_DIM=0 (the measured six only) a head dim beyond them
 * is a usage error (exit 2, naming the variable and the option to pass)
 * unless --any-head-dim, with which it compiles. A head dim no kernel is
 * built for is a usage error either way. */
START_TEST(test_preheat_any_head_dim) {
  unsetenv("SDPA_JIT_ANY_HEAD_DIM");
  run_result r = preheat_json("--arch 80 --dtype bf16 --head-dim 80 --mask none --layout thd", 1);
  ck_assert_msg(strstr(r.out, "family=mma;dtype=bf16;hd=80;hdv=80;"), "keys: %s", r.out);
  run_result_free(&r);
  r = run_cli(test_dir, "--cache '%s' preheat --arch 80 --dtype bf16 --head-dim 84 "
              "--mask none --layout thd -j 2", cache_db);
  ck_assert_msg(r.status == 2, "preheat --head-dim 84 exited %d:\n%s", r.status, r.err);
  ck_assert_msg(strstr(r.err, "desc.head_dim = 84 is not supported: supported are multiples "
                              "of 8 from 8 to 256"),
                "stderr: %s", r.err);
  run_result_free(&r);

  ck_assert_int_eq(setenv("SDPA_JIT_ANY_HEAD_DIM", "0", 1), 0);
  r = run_cli(test_dir, "--cache '%s' preheat --arch 80 --dtype bf16 --head-dim 72 "
              "--mask none --layout thd -j 2", cache_db);
  ck_assert_msg(r.status == 2, "SDPA_JIT_ANY_HEAD_DIM=0 preheat --head-dim 72 exited %d:\n%s",
                r.status, r.err);
  ck_assert_msg(strstr(r.err, "--head-dim 72") && strstr(r.err, "SDPA_JIT_ANY_HEAD_DIM=0") &&
                    strstr(r.err, "--any-head-dim"),
                "stderr: %s", r.err);
  run_result_free(&r);
  r = preheat_json("--arch 80 --dtype bf16 --head-dim 72 --mask none --layout thd "
                   "--any-head-dim", 1);
  ck_assert_msg(strstr(r.out, "family=mma;dtype=bf16;hd=72;hdv=72;"), "keys: %s", r.out);
  run_result_free(&r);
  unsetenv("SDPA_JIT_ANY_HEAD_DIM");
}
END_TEST

static Suite *cli_suite(void) {
  Suite *s = suite_create("cli");
  TCase *usage = tcase_create("usage");
  tcase_add_checked_fixture(usage, setup, teardown);
  tcase_add_test(usage, test_help_of_every_command);
  tcase_add_test(usage, test_version);
  tcase_add_test(usage, test_usage_errors_exit_2);
  tcase_add_test(usage, test_dump_refuses_a_terminal);
  suite_add_tcase(s, usage);

  TCase *empty = tcase_create("empty cache");
  tcase_add_checked_fixture(empty, setup, teardown);
  tcase_set_timeout(empty, 60);
  tcase_add_test(empty, test_path_and_global_options);
  tcase_add_test(empty, test_unusable_cache_is_an_error);
  tcase_add_test(empty, test_empty_cache);
  tcase_add_test(empty, test_output_write_errors);
  tcase_add_test(empty, test_database_strings_escaped);
  tcase_add_test(empty, test_other_files_untouched);
  suite_add_tcase(s, empty);

  TCase *large = tcase_create("large cache");
  tcase_add_checked_fixture(large, setup, teardown);
  tcase_set_timeout(large, 600); /* a million rows made, listed and searched */
  tcase_add_test(large, test_million_rows);
  suite_add_tcase(s, large);

  TCase *preheat = tcase_create("preheat");
  tcase_add_checked_fixture(preheat, setup, teardown);
  tcase_set_timeout(preheat, 900); /* NVRTC compiles one kernel */
  tcase_add_test(preheat, test_preheat_lifecycle);
  tcase_add_test(preheat, test_preheat_default_tiles);
  tcase_add_test(preheat, test_preheat_sm90_families);
  tcase_add_test(preheat, test_preheat_any_head_dim);
  suite_add_tcase(s, preheat);
  return s;
}

int main(void) { return sdpa_test_run(cli_suite()); }
