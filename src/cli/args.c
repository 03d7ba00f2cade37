/*
 * args.c — reading command line tokens for every command of `sdpa-jit`.
 *
 * One small reader serves main.c (global options, then the command name)
 * and each command (its own options table). The global options --cache,
 * --readonly, --no-disk are accepted anywhere, so `sdpa-jit ls --cache X`
 * and `sdpa-jit --cache X ls` mean the same. Long options take their value
 * as the next token or after "="; a short alias takes it attached ("-j4")
 * or as the next token. "--" ends option parsing.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* The options every command understands. Negative ids stay inside this
 * file; cli_args_next applies them and moves on. */
enum { GLOBAL_CACHE = -100, GLOBAL_READONLY, GLOBAL_NO_DISK };

static const cli_option global_options[] = {
    {"--cache", NULL, 1, GLOBAL_CACHE},
    {"--readonly", NULL, 1, GLOBAL_READONLY},
    {"--no-disk", NULL, 0, GLOBAL_NO_DISK},
    {"--help", "-h", 0, CLI_ARG_HELP},
    {"--version", NULL, 0, CLI_ARG_VERSION},
    {NULL, NULL, 0, 0}};

int cli_usage_error(const cli_args *args, const char *fmt, ...) {
  va_list ap;
  const char *command = args && args->command ? args->command : NULL;
  fprintf(stderr, "%s%s%s: ", CLI_PROGRAM, command ? " " : "",
          command ? command : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(see %s%s%s --help)\n", CLI_PROGRAM, command ? " " : "",
          command ? command : "");
  return CLI_EXIT_USAGE;
}

void cli_globals_free(cli_globals *globals) {
  if (!globals) return;
  free(globals->readonly_paths);
  globals->readonly_paths = NULL;
  globals->readonly_count = 0;
}

/* Finds `token` in `table`: a long name ("--name" or "--name=value") or a
 * short alias ("-j" or "-jVALUE" for options with a value). On a match sets
 * *inline_value to the attached value (or NULL) and returns the entry. */
static const cli_option *match_option(const cli_option *table,
                                      const char *token,
                                      const char **inline_value) {
  if (!table) return NULL;
  for (const cli_option *o = table; o->name; o++) {
    size_t n = strlen(o->name);
    if (strncmp(token, o->name, n) == 0) {
      if (token[n] == '\0') {
        *inline_value = NULL;
        return o;
      }
      if (token[n] == '=' && o->takes_value) {
        *inline_value = token + n + 1;
        return o;
      }
    }
    if (o->alias) {
      size_t a = strlen(o->alias);
      if (strncmp(token, o->alias, a) == 0) {
        if (token[a] == '\0') {
          *inline_value = NULL;
          return o;
        }
        if (o->takes_value) {
          *inline_value = token + a;
          return o;
        }
      }
    }
  }
  return NULL;
}

/* Records a global option. Returns 0, or -1 when out of memory. */
static int apply_global(cli_globals *globals, int id, const char *value) {
  switch (id) {
  case GLOBAL_CACHE: globals->cache_path = value; return 0;
  case GLOBAL_NO_DISK: globals->no_disk = 1; return 0;
  case GLOBAL_READONLY: {
    const char **grown = realloc(
        globals->readonly_paths,
        (globals->readonly_count + 1) * sizeof *globals->readonly_paths);
    if (!grown) return -1;
    globals->readonly_paths = grown;
    globals->readonly_paths[globals->readonly_count++] = value;
    return 0;
  }
  default: return 0;
  }
}

int cli_args_next(cli_args *args, const cli_option *options,
                  const char **value) {
  *value = NULL;
  for (;;) {
    if (args->next >= args->argc) return CLI_ARG_END;
    const char *token = args->argv[args->next++];
    if (args->positional_only || token[0] != '-' || token[1] == '\0') {
      *value = token; /* "-" alone is a positional (stdout / stdin) */
      return CLI_ARG_POSITIONAL;
    }
    if (strcmp(token, "--") == 0) {
      args->positional_only = 1;
      continue;
    }
    const char *attached = NULL;
    const cli_option *o = match_option(options, token, &attached);
    if (!o) o = match_option(global_options, token, &attached);
    if (!o) {
      cli_usage_error(args, "unknown option '%s'", token);
      return CLI_ARG_ERROR;
    }
    const char *v = attached;
    if (o->takes_value && !v) {
      if (args->next >= args->argc) {
        cli_usage_error(args, "option %s needs a value", o->name);
        return CLI_ARG_ERROR;
      }
      v = args->argv[args->next++];
    }
    if (o->id <= GLOBAL_NO_DISK) {
      if (apply_global(args->globals, o->id, v) != 0) {
        fprintf(stderr, "%s: out of memory\n", CLI_PROGRAM);
        return CLI_ARG_ERROR;
      }
      continue;
    }
    *value = v;
    return o->id;
  }
}

int cli_parse_simple(cli_args *args, const cli_option *options, const char *help,
                     int *json, const char **positional, int max_positional) {
  const char *value = NULL;
  int id, seen = 0;
  while ((id = cli_args_next(args, options, &value)) != CLI_ARG_END) {
    switch (id) {
    case CLI_ARG_HELP: fputs(help, stdout); return CLI_EXIT_OK;
    case CLI_ARG_VERSION: printf("%s %s\n", CLI_PROGRAM, sdpa_version());
      return CLI_EXIT_OK;
    case CLI_ARG_ERROR: return CLI_EXIT_USAGE;
    case CLI_ARG_POSITIONAL:
      if (seen >= max_positional)
        return cli_usage_error(args, "unexpected argument '%s'", value);
      positional[seen++] = value;
      break;
    case CLI_OPT_JSON: *json = 1; break;
    default: break;
    }
  }
  if (seen < max_positional)
    return cli_usage_error(args, "missing KEY (a hash, hash prefix or key)");
  return -1;
}
