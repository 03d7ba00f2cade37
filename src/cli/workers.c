/*
 * workers.c — compiling preheat's jobs on a pool of threads.
 *
 * Threads take the next job index under one mutex, compile without holding
 * it (NVRTC runs in parallel; the runtime does its own locking and
 * single-flight), and print the finished job's progress line under the
 * mutex so lines never interleave. sdpa_last_error() is per thread, so a
 * failure's message is copied in the thread that saw it. When no thread
 * can be started the caller's thread does the work.
 */
#include "cli.h"
#include "preheat.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Lines of a compile log shown after a failure; the rest is elided. */
enum { LOG_LINES_SHOWN = 40 };

typedef struct pool {
  cli_job *jobs;
  size_t count;
  size_t next; /* next job to take   */
  size_t done; /* jobs finished       */
  pthread_mutex_t lock;
} pool;

const char *cli_source_name(sdpa_source source) {
  switch (source) {
  case SDPA_SOURCE_MEMORY: return "memory";
  case SDPA_SOURCE_SHIPPED: return "shipped";
  case SDPA_SOURCE_DISK: return "disk";
  case SDPA_SOURCE_COMPILED: return "compiled";
  default: return "none";
  }
}

const char *cli_job_outcome(const cli_job *job) {
  if (job->status != SDPA_STATUS_SUCCESS) return "failed";
  if (!job->stored) return "not stored";
  return job->source == SDPA_SOURCE_COMPILED ? "compiled" : "cached";
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Prints the first LOG_LINES_SHOWN lines of `log`, indented. */
static void print_log(const char *log) {
  int lines = 0;
  const char *p = log;
  while (*p && lines < LOG_LINES_SHOWN) {
    const char *end = strchr(p, '\n');
    int n = end ? (int)(end - p) : (int)strlen(p);
    fprintf(stderr, "    %.*s\n", n, p);
    lines++;
    p = end ? end + 1 : p + n;
  }
  if (*p) fprintf(stderr, "    ... (log truncated)\n");
}

/* Prints job `job`'s progress line; called with the pool locked. */
static void report(pool *p, const cli_job *job) {
  const char *key = sdpa_bwd_plan_key(job->plan);
  if (job->status == SDPA_STATUS_SUCCESS) {
    fprintf(stderr, "[%zu/%zu] %s %s", p->done, p->count,
            cli_job_outcome(job), key);
    if (job->source != SDPA_SOURCE_COMPILED)
      fprintf(stderr, " (%s)", cli_source_name(job->source));
    fprintf(stderr, " %.0f ms\n", job->ms);
  } else {
    fprintf(stderr, "[%zu/%zu] FAILED %s: %s: %s\n", p->done, p->count, key,
            sdpa_status_name(job->status),
            job->error ? job->error : "(no message)");
    const char *log = sdpa_bwd_plan_compile_log(job->plan);
    if (log && *log) print_log(log);
  }
  fflush(stderr);
}

/* Compiles one job in the calling thread. */
static void compile_job(cli_job *job) {
  double start = now_ms();
  job->source = SDPA_SOURCE_NONE;
  job->status = sdpa_bwd_compile(job->plan, &job->source);
  job->ms = now_ms() - start;
  if (job->status != SDPA_STATUS_SUCCESS) {
    job->error = strdup(cli_error_text(job->status));
    return;
  }
  sdpa_bwd_plan_info info = SDPA_BWD_PLAN_INFO_INIT;
  job->stored = sdpa_bwd_plan_query(job->plan, &info) == SDPA_STATUS_SUCCESS && info.stored;
}

static void *worker(void *argument) {
  pool *p = argument;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    size_t index = p->next < p->count ? p->next++ : p->count;
    pthread_mutex_unlock(&p->lock);
    if (index == p->count) return NULL;
    compile_job(&p->jobs[index]);
    pthread_mutex_lock(&p->lock);
    p->done++;
    report(p, &p->jobs[index]);
    pthread_mutex_unlock(&p->lock);
  }
}

void cli_jobs_run(cli_job *jobs, size_t count, int threads) {
  pool p = {jobs, count, 0, 0, PTHREAD_MUTEX_INITIALIZER};
  if (count == 0) return;
  if (threads < 1) threads = 1;
  if ((size_t)threads > count) threads = (int)count;
  pthread_t *ids = calloc((size_t)threads, sizeof *ids);
  int started = 0;
  for (int i = 0; ids && i < threads; i++) {
    if (pthread_create(&ids[started], NULL, worker, &p) != 0) break;
    started++;
  }
  if (started == 0) worker(&p); /* no threads: do it here */
  for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
  free(ids);
  pthread_mutex_destroy(&p.lock);
}
