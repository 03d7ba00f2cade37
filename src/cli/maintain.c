/*
 * maintain.c — the commands that change the user's database: `verify`
 * (drop rows whose checksum fails) and `prune` (drop rows by size cap or
 * age).
 *
 * Both report what they did on stdout, verify naming every row it found
 * bad. Removing rows is not a failure: they exit 1 only when the library
 * could not do the work (or an explicit --cache cannot be used). They
 * write an existing database only, never create one; shipped databases
 * are never changed.
 */
#include <string.h>

#include "cli.h"

static const char verify_help[] =
    "usage: " CLI_PROGRAM " verify\n"
    "\n"
    "Check every entry's cubin against its checksum (and MAC, with a keyed\n"
    "checksum), that it is a cubin for its arch, and the database file with\n"
    "SQLite's integrity check; remove entries of the user's database that\n"
    "fail. Prints one line per bad entry (\"removed HASH KEY: why\", or\n"
    "\"bad\" for one in a shipped database), then \"checked N, removed M\".\n"
    "Exit status 0 even when entries were removed; 1 when the check could\n"
    "not run.\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

/* Prints one bad row (sdpa_cache_problem_fn), escaped. */
static void report_bad(const char *hash, const char *key_text, const char *problem,
                       int removed, void *user) {
  char text[2048], why[512];
  (void)user;
  printf("%s %s %s: %s\n", removed ? "removed" : "bad", *hash ? hash : "(the file)",
         cli_escape(key_text ? key_text : "", text, sizeof text),
         cli_escape(problem, why, sizeof why));
}

int cli_verify(cli_args *args) {
  static const cli_option options[] = {{NULL, NULL, 0, 0}};
  int rc = cli_parse_simple(args, options, verify_help, NULL, NULL, 0);
  if (rc >= 0) return rc;
  sdpa_runtime *runtime = NULL;
  rc = cli_runtime_open(args, CLI_CACHE_MAINTAIN, &runtime);
  if (rc != CLI_EXIT_OK) return rc;
  if (cli_no_user_cache(args, runtime)) {
    printf("checked 0, removed 0\n");
    sdpa_runtime_destroy(runtime);
    return CLI_EXIT_OK;
  }
  int64_t checked = 0, removed = 0;
  sdpa_status status = sdpa_cache_verify_report(runtime, report_bad, NULL, &checked, &removed);
  if (status != SDPA_STATUS_SUCCESS) {
    rc = cli_fail(args, status, "cannot verify the cache");
  } else {
    printf("checked %lld, removed %lld\n", (long long)checked,
           (long long)removed);
  }
  sdpa_runtime_destroy(runtime);
  return rc;
}

static const char prune_help[] =
    "usage: " CLI_PROGRAM
    " prune [--max-bytes N[K|M|G]] [--older-than N[s|m|h|d]]\n"
    "\n"
    "Remove entries of the user's database: least recently used first\n"
    "until the cubins total at most --max-bytes, and every entry unused for\n"
    "longer than --older-than. At least one of the two is needed. Prints\n"
    "\"removed N\".\n"
    "\n"
    "  --max-bytes N[K|M|G]     size cap (K = 1024 bytes); 0 empties it\n"
    "  --older-than N[s|m|h|d]  age limit (seconds without a suffix)\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

enum { OPT_MAX_BYTES = 1, OPT_OLDER_THAN };

int cli_prune(cli_args *args) {
  static const cli_option options[] = {
      {"--max-bytes", NULL, 1, OPT_MAX_BYTES},
      {"--older-than", NULL, 1, OPT_OLDER_THAN},
      {NULL, NULL, 0, 0}};
  int64_t max_bytes = -1, older_than = -1;
  const char *value = NULL;
  int id;
  while ((id = cli_args_next(args, options, &value)) != CLI_ARG_END) {
    switch (id) {
    case CLI_ARG_HELP: fputs(prune_help, stdout); return CLI_EXIT_OK;
    case CLI_ARG_VERSION: printf("%s %s\n", CLI_PROGRAM, sdpa_version());
      return CLI_EXIT_OK;
    case CLI_ARG_ERROR: return CLI_EXIT_USAGE;
    case CLI_ARG_POSITIONAL:
      return cli_usage_error(args, "unexpected argument '%s'", value);
    case OPT_MAX_BYTES:
      if (cli_parse_bytes(value, &max_bytes) != 0)
        return cli_usage_error(args,
                               "--max-bytes '%s': expected N, NK, NM or NG "
                               "(N >= 0)",
                               value);
      break;
    case OPT_OLDER_THAN:
      if (cli_parse_seconds(value, &older_than) != 0)
        return cli_usage_error(args,
                               "--older-than '%s': expected N, Ns, Nm, Nh or "
                               "Nd (N >= 0)",
                               value);
      break;
    default: break;
    }
  }
  if (max_bytes < 0 && older_than < 0)
    return cli_usage_error(args, "give --max-bytes or --older-than (or both)");
  sdpa_runtime *runtime = NULL;
  int rc = cli_runtime_open(args, CLI_CACHE_MAINTAIN, &runtime);
  if (rc != CLI_EXIT_OK) return rc;
  if (cli_no_user_cache(args, runtime)) {
    printf("removed 0\n");
    sdpa_runtime_destroy(runtime);
    return CLI_EXIT_OK;
  }
  int64_t removed = 0;
  sdpa_status status =
      sdpa_cache_prune(runtime, max_bytes, older_than, &removed);
  if (status != SDPA_STATUS_SUCCESS)
    rc = cli_fail(args, status, "cannot prune the cache");
  else
    printf("removed %lld\n", (long long)removed);
  sdpa_runtime_destroy(runtime);
  return rc;
}
