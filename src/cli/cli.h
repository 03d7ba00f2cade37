/*
 * cli.h — what the files of the `sdpa-jit` command line tool share.
 *
 * The tool is built on the public API only (sdpa_jit.h). main.c reads the
 * global options and the command name and dispatches; each command lives in
 * its own file (preheat.c, inspect.c, maintain.c, dump.c) and keeps parsing
 * the same argument vector with args.c, which also accepts the global
 * options after the command. session.c opens a runtime from the global
 * options and reports library errors the same way for every command.
 *
 * Exit codes: 0 success, 1 failure (the library said no, nothing was
 * stored, output could not be written), 2 usage error (including values
 * the library rejects, checked before any work). Everything meant for a
 * program goes to stdout; progress, notes and errors go to stderr. Every
 * string read from a cache file is escaped before it is printed
 * (text.c, json.c).
 */
#ifndef SDPA_CLI_H
#define SDPA_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sdpa_jit.h"

#define CLI_PROGRAM "sdpa-jit"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* ------------------------------------------------------------- arguments */

/* Options that apply to every command; they may come before or after it. */
typedef struct cli_globals {
  const char *cache_path;      /* --cache PATH                          */
  const char **readonly_paths; /* --readonly PATH, repeatable (malloc'd) */
  size_t readonly_count;
  int no_disk;                 /* --no-disk                             */
} cli_globals;

/* One option a command accepts. `id` is what cli_args_next returns for it
 * and must be positive; a table ends with an entry whose name is NULL. */
typedef struct cli_option {
  const char *name;  /* "--arch"              */
  const char *alias; /* "-j", or NULL         */
  int takes_value;   /* nonzero: needs a value */
  int id;
} cli_option;

/* The argument vector being read, and where. */
typedef struct cli_args {
  int argc;
  char **argv;
  int next;                /* index of the next token                 */
  int positional_only;     /* a "--" was seen                          */
  const char *command;     /* for messages; NULL before the command    */
  cli_globals *globals;
} cli_args;

/* What cli_args_next returns besides a command option's id. */
enum {
  CLI_ARG_END = 0,         /* no tokens left                          */
  CLI_ARG_POSITIONAL = -1, /* *value is a plain argument              */
  CLI_ARG_HELP = -2,       /* -h / --help                             */
  CLI_ARG_VERSION = -3,    /* --version                               */
  CLI_ARG_ERROR = -4       /* a usage error, already printed          */
};

/* Reads the next token. Global options are applied to args->globals and
 * skipped; an option of `options` (may be NULL) returns its id with its
 * value in *value ("--name VALUE", "--name=VALUE", "-jVALUE"). An unknown
 * option or a missing value prints a usage message naming the command and
 * returns CLI_ARG_ERROR. */
int cli_args_next(cli_args *args, const cli_option *options,
                  const char **value);

/* Frees what parsing allocated in `globals`. */
void cli_globals_free(cli_globals *globals);

/* Prints "sdpa-jit CMD: <message>\n(see sdpa-jit CMD --help)" on stderr
 * and returns CLI_EXIT_USAGE. */
int cli_usage_error(const cli_args *args, const char *fmt, ...)
    CLI_PRINTF(2, 3);

/* Reads the options of a command that takes exactly `max_positional`
 * plain arguments (into positional[]; a missing one is reported as KEY)
 * and the `options` given: the option of id CLI_OPT_JSON sets *json (json
 * may be NULL when options has none). Prints `help` for --help. Returns
 * -1 to go on, else an exit code. */
enum { CLI_OPT_JSON = 1 };
int cli_parse_simple(cli_args *args, const cli_option *options, const char *help,
                     int *json, const char **positional, int max_positional);

/* --------------------------------------------------------------- session */

/* What a command does with the user's cache, which decides how it opens
 * it. An explicit --cache that cannot be used that way is an error for
 * every command; the default location is required only for filling. */
typedef enum cli_cache_use {
  CLI_CACHE_INSPECT,  /* ls, show, stats, path, dump: read-only, creates
                         nothing                                        */
  CLI_CACHE_MAINTAIN, /* verify, prune: writes an existing file only     */
  CLI_CACHE_FILL      /* preheat: creates and writes; must be on disk    */
} cli_cache_use;

/* Creates a runtime from the global options for `use`. On failure prints
 * the library's message and returns CLI_EXIT_FAILURE; on success *out is
 * the caller's (sdpa_runtime_destroy) and CLI_EXIT_OK comes back. */
int cli_runtime_open(const cli_args *args, cli_cache_use use, sdpa_runtime **out);

/* When the runtime has no database of the user's: prints "no cache at
 * <location>" on stderr and returns 1 (the caller then reports nothing
 * more), else 0. */
int cli_no_user_cache(const cli_args *args, const sdpa_runtime *runtime);

/* The end of every command: flushes stdout; when that or any earlier write
 * to it failed, prints why and returns CLI_EXIT_FAILURE, else `rc`. */
int cli_finish_output(const cli_args *args, int rc);

/* Prints "sdpa-jit CMD: <what>: <sdpa_last_error() or the status name>"
 * on stderr and returns CLI_EXIT_FAILURE. */
int cli_fail(const cli_args *args, sdpa_status status, const char *what);

/* This thread's sdpa_last_error() text, or the status name when it is
 * empty. */
const char *cli_error_text(sdpa_status status);

/* The cache location a runtime uses, for people: its path or "(memory)". */
const char *cli_cache_location(const sdpa_runtime *runtime);

/* ------------------------------------------------------------------ text */

/* The length of the valid UTF-8 sequence at `p` (1-4), 0 when none. */
size_t cli_utf8_length(const unsigned char *p);

/* Copies `text` (NULL: "") into out with control characters and bytes
 * that are not UTF-8 written as \xNN (truncated to `size`); returns out. */
const char *cli_escape(const char *text, char *out, size_t size);

/* ----------------------------------------------------------------- units */

/* Parses "N", "NK", "NM", "NG", "NT" (powers of 1024, case-insensitive, an
 * optional trailing "B"/"iB") into bytes. Returns 0, or -1 when malformed
 * or out of range. */
int cli_parse_bytes(const char *text, int64_t *out);

/* Parses "N", "Ns", "Nm", "Nh", "Nd" into seconds. Returns 0 or -1. */
int cli_parse_seconds(const char *text, int64_t *out);

/* Parses a decimal int in [min, max]. Returns 0 or -1. */
int cli_parse_int(const char *text, int min, int max, int *out);

/* Formats unix seconds as local "YYYY-MM-DD HH:MM" ("-" for 0). */
void cli_format_date(int64_t seconds, char *buf, size_t size);

/* Formats unix seconds as UTC "YYYY-MM-DDTHH:MM:SSZ" ("" for 0). */
void cli_format_iso_utc(int64_t seconds, char *buf, size_t size);

/* Formats a byte count for people: "812 B", "4.0 KiB", "1.3 MiB". */
void cli_format_bytes(int64_t bytes, char *buf, size_t size);

/* -------------------------------------------------------------- commands */

/* Each runs one command, reading its options from `args` (positioned after
 * the command name), and returns the process exit code. */
int cli_preheat(cli_args *args);
int cli_ls(cli_args *args);
int cli_show(cli_args *args);
int cli_stats(cli_args *args);
int cli_path(cli_args *args);
int cli_verify(cli_args *args);
int cli_prune(cli_args *args);
int cli_dump(cli_args *args);

#endif /* SDPA_CLI_H */
