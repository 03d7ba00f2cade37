/*
 * session.c — opening a runtime from the global options, and reporting the
 * library's errors the same way for every command.
 *
 * Every command that touches the cache goes through cli_runtime_open, so
 * --cache, --readonly and --no-disk mean the same thing everywhere, and
 * every library failure is printed as "sdpa-jit CMD: what: message" with
 * the thread's sdpa_last_error() text (the status name when it is empty).
 */
#include "cli.h"

const char *cli_error_text(sdpa_status status) {
  const char *message = sdpa_last_error();
  return message && *message ? message : sdpa_status_name(status);
}

int cli_fail(const cli_args *args, sdpa_status status, const char *what) {
  const char *message = cli_error_text(status);
  const char *command = args && args->command ? args->command : NULL;
  fprintf(stderr, "%s%s%s: %s: %s\n", CLI_PROGRAM, command ? " " : "",
          command ? command : "", what, message);
  return CLI_EXIT_FAILURE;
}

int cli_runtime_open(const cli_args *args, sdpa_runtime **out) {
  *out = NULL;
  sdpa_runtime_options options = SDPA_RUNTIME_OPTIONS_INIT;
  const cli_globals *globals = args->globals;
  options.cache_path = globals->cache_path;
  options.readonly_cache_paths = globals->readonly_paths;
  options.readonly_cache_count = globals->readonly_count;
  options.disable_disk_cache = globals->no_disk;
  sdpa_status status = sdpa_runtime_create(out, &options);
  if (status != SDPA_STATUS_SUCCESS) {
    *out = NULL;
    return cli_fail(args, status, "cannot open the runtime");
  }
  return CLI_EXIT_OK;
}

const char *cli_cache_location(const sdpa_runtime *runtime) {
  const char *path = sdpa_runtime_cache_path(runtime);
  return path ? path : "(memory)";
}
