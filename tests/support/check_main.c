/*
 * check_main.c — running a Check suite, and temp directories for tests.
 */
#include "check_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sdpa_test_run(Suite *suite) {
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? 0 : 1;
}

char *sdpa_test_tmpdir(const char *tag) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  char *path = NULL;
  if (asprintf(&path, "%s/sdpa-test-%s-XXXXXX", base, tag) < 0) return NULL;
  if (!mkdtemp(path)) {
    free(path);
    return NULL;
  }
  return path;
}

void sdpa_test_rmtree(const char *path) {
  if (!path) return;
  char *cmd = NULL;
  if (asprintf(&cmd, "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", path, path) < 0) return;
  if (system(cmd) != 0) { /* best effort */ }
  free(cmd);
}
