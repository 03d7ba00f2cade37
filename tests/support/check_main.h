/*
 * check_main.h — helpers shared by every Check suite.
 *
 * sdpa_test_run(suite) runs a suite in CK_NORMAL verbosity and returns the
 * process exit code (0 when every test passed). sdpa_test_tmpdir() makes a
 * fresh private directory under $TMPDIR for one test; sdpa_test_rmtree()
 * removes it. The file helpers fail the running test when the file system
 * does. The clock helpers carry no Check assert, so forked children may
 * use them too.
 */
#ifndef SDPA_TEST_CHECK_MAIN_H
#define SDPA_TEST_CHECK_MAIN_H

#include <check.h>
#include <stddef.h>

int sdpa_test_run(Suite *suite);
char *sdpa_test_tmpdir(const char *tag); /* malloc'd path */
void sdpa_test_rmtree(const char *path);
char *sdpa_test_path(const char *dir, const char *name); /* malloc'd dir/name */
/* The whole file, malloc'd, with a NUL byte after its *size bytes (so a
 * text file reads as a C string; `size` may be NULL). Fails the test when
 * the file cannot be read. */
unsigned char *sdpa_test_read_file(const char *path, size_t *size);
/* Writes `size` bytes of `data` to `path` (created or truncated). */
void sdpa_test_write_file(const char *path, const void *data, size_t size);

/* Number of entries of the directory `dir` (which must exist) whose name
 * starts with `prefix` ("" counts every entry, "." and ".." included);
 * when `found` is not NULL, *found (freed first) gets the malloc'd path of
 * the last one listed. */
int sdpa_test_count_prefixed(const char *dir, const char *prefix, char **found);

/* Milliseconds on CLOCK_MONOTONIC (differences only mean something). */
double sdpa_test_now_ms(void);
/* Sleeps `ms` milliseconds, resuming after signals. */
void sdpa_test_sleep_ms(int ms);

#endif
