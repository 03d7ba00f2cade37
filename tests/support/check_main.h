/*
 * check_main.h — helpers shared by every Check suite.
 *
 * sdpa_test_run(suite) runs a suite in CK_NORMAL verbosity and returns the
 * process exit code (0 when every test passed). sdpa_test_tmpdir() makes a
 * fresh private directory under $TMPDIR for one test; sdpa_test_rmtree()
 * removes it.
 */
#ifndef SDPA_TEST_CHECK_MAIN_H
#define SDPA_TEST_CHECK_MAIN_H

#include <check.h>

int sdpa_test_run(Suite *suite);
char *sdpa_test_tmpdir(const char *tag); /* malloc'd path */
void sdpa_test_rmtree(const char *path);

#endif
