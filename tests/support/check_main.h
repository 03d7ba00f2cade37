/*
 * check_main.h — helpers shared by every Check suite.
 *
 * sdpa_test_run(suite) runs a suite in CK_NORMAL verbosity and returns the
 * process exit code (0 when every test passed). sdpa_test_tmpdir() makes a
 * fresh private directory under $TMPDIR for one test; sdpa_test_rmtree()
 * removes it. The file helpers fail the running test when the file system
 * does.
 */
#ifndef SDPA_TEST_CHECK_MAIN_H
#define SDPA_TEST_CHECK_MAIN_H

#include <check.h>
#include <stddef.h>

int sdpa_test_run(Suite *suite);
char *sdpa_test_tmpdir(const char *tag); /* malloc'd path */
void sdpa_test_rmtree(const char *path);
char *sdpa_test_path(const char *dir, const char *name); /* malloc'd dir/name */
/* The whole file (malloc'd, *size bytes), or a write of `size` bytes. */
unsigned char *sdpa_test_read_file(const char *path, size_t *size);
void sdpa_test_write_file(const char *path, const void *data, size_t size);

#endif
