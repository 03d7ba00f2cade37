/*
 * session.c — opening a runtime from the global options, and reporting the
 * library's errors and the output's fate the same way for every command.
 *
 * Every command that touches the cache goes through cli_runtime_open, so
 * --cache, --readonly and --no-disk mean the same thing everywhere:
 * inspection opens the user's database read-only and creates nothing;
 * maintenance writes only an existing file; preheat creates it. A --cache
 * the command cannot use is an error (exit 1), never a silent memory
 * cache. Every library failure is printed as "sdpa-jit CMD: what:
 * message" with the thread's sdpa_last_error() text (the status name when
 * it is empty).
 */
#include <errno.h>
#include <string.h>

#include "cli.h"

const char *cli_error_text(sdpa_status status) {
  const char *message = sdpa_last_error();
  return message && *message ? message : sdpa_status_name(status);
}

/* "sdpa-jit CMD" into buf, for messages. */
static const char *who(const cli_args *args, char *buf, size_t size) {
  const char *command = args && args->command ? args->command : NULL;
  snprintf(buf, size, "%s%s%s", CLI_PROGRAM, command ? " " : "", command ? command : "");
  return buf;
}

int cli_fail(const cli_args *args, sdpa_status status, const char *what) {
  char name[64];
  fprintf(stderr, "%s: %s: %s\n", who(args, name, sizeof name), what,
          cli_error_text(status));
  return CLI_EXIT_FAILURE;
}

int cli_runtime_open(const cli_args *args, cli_cache_use use, sdpa_runtime **out) {
  *out = NULL;
  sdpa_runtime_options options = SDPA_RUNTIME_OPTIONS_INIT;
  const cli_globals *globals = args->globals;
  options.cache_path = globals->cache_path;
  options.readonly_cache_paths = globals->readonly_paths;
  options.readonly_cache_count = globals->readonly_count;
  options.disable_disk_cache = globals->no_disk;
  options.cache_access = use == CLI_CACHE_INSPECT    ? SDPA_CACHE_READ_ONLY
                         : use == CLI_CACHE_MAINTAIN ? SDPA_CACHE_READ_WRITE_EXISTING
                                                     : SDPA_CACHE_READ_WRITE;
  options.cache_required =
      !globals->no_disk && (globals->cache_path != NULL || use == CLI_CACHE_FILL);
  sdpa_status status = sdpa_runtime_create(out, &options);
  if (status != SDPA_STATUS_SUCCESS) {
    *out = NULL;
    return cli_fail(args, status, "cannot open the cache");
  }
  return CLI_EXIT_OK;
}

const char *cli_cache_location(const sdpa_runtime *runtime) {
  const char *path = sdpa_runtime_cache_path(runtime);
  return path ? path : "(memory)";
}

int cli_no_user_cache(const cli_args *args, const sdpa_runtime *runtime) {
  if (sdpa_runtime_cache_path(runtime) || args->globals->no_disk) return 0;
  char where[4096], name[64];
  sdpa_cache_default_location(where, sizeof where);
  fprintf(stderr, "%s: no cache at %s%s\n", who(args, name, sizeof name), where,
          args->globals->readonly_count ? " (only the shipped databases are read)" : "");
  return args->globals->readonly_count ? 0 : 1;
}

int cli_finish_output(const cli_args *args, int rc) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  char name[64];
  const int err = errno;
  fprintf(stderr, "%s: cannot write the output: %s\n", who(args, name, sizeof name),
          err ? strerror(err) : "write error");
  return CLI_EXIT_FAILURE;
}
