/*
 * dump.c — `sdpa-jit dump KEY`: write one entry's cubin out, so a
 * performance engineer can read its SASS (cuobjdump -sass, nvdisasm).
 *
 * The cubin is binary: it goes to -o FILE, or to stdout only when stdout
 * is not a terminal (a pipe or a redirect); on a terminal the command
 * refuses and says to use -o. The library checks the row's checksum
 * before handing the bytes over.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char dump_help[] =
    "usage: " CLI_PROGRAM " dump KEY [-o FILE]\n"
    "\n"
    "Write the cubin of one cache entry. KEY is the entry's hash, a unique\n"
    "prefix of it (at least 6 hex digits) or its full key text.\n"
    "\n"
    "  -o, --output FILE   write to FILE (default: stdout, which must not\n"
    "                      be a terminal: redirect it or use -o)\n"
    "\n"
    "Global options: --cache PATH, --readonly PATH, --no-disk.\n";

enum { OPT_OUTPUT = 1 };

/* Writes `size` bytes to `path` ("-" or NULL: stdout). Returns 0, or -1
 * with a message printed. */
static int write_cubin(const cli_args *args, const char *path,
                       const void *data, size_t size) {
  int to_stdout = !path || strcmp(path, "-") == 0;
  FILE *out = to_stdout ? stdout : fopen(path, "wb");
  if (!out) {
    fprintf(stderr, "%s %s: cannot open '%s' for writing: %s\n", CLI_PROGRAM,
            args->command, path, strerror(errno));
    return -1;
  }
  int ok = fwrite(data, 1, size, out) == size;
  ok = (to_stdout ? fflush(out) : fclose(out)) == 0 && ok;
  if (!ok) {
    fprintf(stderr, "%s %s: cannot write '%s': %s\n", CLI_PROGRAM,
            args->command, to_stdout ? "(stdout)" : path, strerror(errno));
    return -1;
  }
  return 0;
}

int cli_dump(cli_args *args) {
  static const cli_option options[] = {{"--output", "-o", 1, OPT_OUTPUT},
                                       {NULL, NULL, 0, 0}};
  const char *key = NULL, *output = NULL, *value = NULL;
  int id;
  while ((id = cli_args_next(args, options, &value)) != CLI_ARG_END) {
    switch (id) {
    case CLI_ARG_HELP: fputs(dump_help, stdout); return CLI_EXIT_OK;
    case CLI_ARG_VERSION: printf("%s %s\n", CLI_PROGRAM, sdpa_version());
      return CLI_EXIT_OK;
    case CLI_ARG_ERROR: return CLI_EXIT_USAGE;
    case CLI_ARG_POSITIONAL:
      if (key) return cli_usage_error(args, "unexpected argument '%s'", value);
      key = value;
      break;
    case OPT_OUTPUT: output = value; break;
    default: break;
    }
  }
  if (!key)
    return cli_usage_error(args, "missing KEY (a hash, hash prefix or key)");
  int to_stdout = !output || strcmp(output, "-") == 0;
  if (to_stdout && isatty(STDOUT_FILENO))
    return cli_usage_error(args,
                           "refusing to write a binary cubin to a terminal; "
                           "use -o FILE or redirect stdout");

  sdpa_runtime *runtime = NULL;
  void *cubin = NULL;
  size_t size = 0;
  int rc = cli_runtime_open(args, CLI_CACHE_INSPECT, &runtime);
  if (rc != CLI_EXIT_OK) goto done;
  sdpa_status status = sdpa_cache_get_cubin(runtime, key, &cubin, &size);
  if (status != SDPA_STATUS_SUCCESS) {
    char safe[600];
    cubin = NULL;
    cli_no_user_cache(args, runtime);
    rc = cli_fail(args, status, cli_escape(key, safe, sizeof safe));
    goto done;
  }
  if (write_cubin(args, output, cubin, size) != 0) {
    rc = CLI_EXIT_FAILURE;
    goto done;
  }
  if (!to_stdout)
    fprintf(stderr, "wrote %zu bytes to %s\n", size, output);
  rc = CLI_EXIT_OK;
done:
  sdpa_free(cubin);
  sdpa_runtime_destroy(runtime);
  return rc;
}
