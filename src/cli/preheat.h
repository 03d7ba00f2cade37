/*
 * preheat.h — the compile jobs of `sdpa-jit preheat` and the worker pool
 * that runs them.
 *
 * preheat.c builds one plan per distinct key; workers.c compiles them on N
 * threads (the runtime is thread-safe, and each plan is compiled by exactly
 * one thread, as the header requires) and prints a progress line per key
 * on stderr as each finishes.
 */
#ifndef SDPA_CLI_PREHEAT_H
#define SDPA_CLI_PREHEAT_H

#include <stddef.h>

#include "sdpa_jit.h"

/* One distinct key to make ready. */
typedef struct cli_job {
  sdpa_bwd_plan *plan; /* owned by the job                              */
  sdpa_status status;  /* of sdpa_bwd_compile                           */
  sdpa_source source;  /* where the kernel came from                    */
  double ms;           /* wall time of sdpa_bwd_compile                 */
  int stored;          /* its cubin is in a database afterwards         */
  char *error;         /* malloc'd sdpa_last_error() text on failure    */
} cli_job;

/* Compiles every job on up to `threads` threads, printing
 * "[i/N] compiled|cached|FAILED <key> ..." on stderr per job (the compile
 * log, indented, after a failure). Fills status, source, ms and error. */
void cli_jobs_run(cli_job *jobs, size_t count, int threads);

/* "compiled" for SDPA_SOURCE_COMPILED, else "cached"; "failed" when
 * `status` is not SUCCESS; "not stored" when it succeeded but the cubin
 * reached no database (the cache could not be written). */
const char *cli_job_outcome(const cli_job *job);

/* "memory", "shipped", "disk", "compiled" or "none". */
const char *cli_source_name(sdpa_source source);

#endif /* SDPA_CLI_PREHEAT_H */
