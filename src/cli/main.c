/*
 * main.c — `sdpa-jit`: the command line tool of the sdpa-jit kernel cache.
 *
 * Reads the global options up to the command name, then hands the rest of
 * the arguments to the command (which still accepts global options). An
 * operator preheats a cache on a build host and ships it; a performance
 * engineer lists, shows, dumps and prunes entries. Built on the public
 * API (sdpa_jit.h) only.
 */
#include <string.h>

#include "cli.h"

typedef struct command {
  const char *name;
  int (*run)(cli_args *args);
  const char *summary;
} command;

static const command commands[] = {
    {"preheat", cli_preheat, "compile a grid of keys into the cache"},
    {"ls", cli_ls, "list the cache's entries"},
    {"show", cli_show, "print every field of one entry"},
    {"stats", cli_stats, "totals: entries, bytes, hits, compile time"},
    {"verify", cli_verify, "check checksums; remove entries that fail"},
    {"prune", cli_prune, "remove entries by size cap or age"},
    {"dump", cli_dump, "write one entry's cubin"},
    {"path", cli_path, "print the cache's path"},
    {NULL, NULL, NULL}};

static void print_help(FILE *out) {
  fprintf(out,
          "usage: %s [global options] COMMAND [options]\n"
          "\n"
          "Inspect and fill the sdpa-jit kernel cache.\n"
          "\n"
          "Commands:\n",
          CLI_PROGRAM);
  for (const command *c = commands; c->name; c++)
    fprintf(out, "  %-9s %s\n", c->name, c->summary);
  fprintf(out,
          "\n"
          "Global options (before or after the command):\n"
          "  --cache PATH      the user's cache database (default:\n"
          "                    $SDPA_JIT_CACHE, else\n"
          "                    $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else\n"
          "                    ~/.cache/sdpa-jit/kernels.sqlite)\n"
          "  --readonly PATH   a shipped read-only database (repeatable)\n"
          "  --no-disk         keep kernels in memory only\n"
          "  -h, --help        this help; COMMAND --help for a command's\n"
          "  --version         print the version\n"
          "\n"
          "Exit status: 0 success, 1 failure (including output that could not\n"
          "be written, and a preheat that stored nothing), 2 usage error.\n");
}

int main(int argc, char **argv) {
  cli_globals globals = {NULL, NULL, 0, 0};
  cli_args args = {argc - 1, argv + 1, 0, 0, NULL, &globals};
  const char *name = NULL;
  int rc = CLI_EXIT_USAGE;
  while (!name) {
    int id = cli_args_next(&args, NULL, &name);
    if (id == CLI_ARG_POSITIONAL) break;
    if (id == CLI_ARG_HELP) {
      print_help(stdout);
      rc = cli_finish_output(&args, CLI_EXIT_OK);
      goto done;
    }
    if (id == CLI_ARG_VERSION) {
      printf("%s %s\n", CLI_PROGRAM, sdpa_version());
      rc = cli_finish_output(&args, CLI_EXIT_OK);
      goto done;
    }
    if (id == CLI_ARG_ERROR) goto done;
    if (id == CLI_ARG_END) {
      print_help(stderr);
      goto done;
    }
  }
  for (const command *c = commands; c->name; c++) {
    if (strcmp(c->name, name) == 0) {
      args.command = c->name;
      rc = cli_finish_output(&args, c->run(&args));
      goto done;
    }
  }
  rc = cli_usage_error(&args, "unknown command '%s'", name);
done:
  cli_globals_free(&globals);
  return rc;
}
