/*
 * check_main.c — running a Check suite, and temp directories, files and
 * clocks for tests.
 */
#include "check_main.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

char *sdpa_test_path(const char *dir, const char *name) {
  char *path = NULL;
  ck_assert_int_gt(asprintf(&path, "%s/%s", dir, name), 0);
  return path;
}

unsigned char *sdpa_test_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot read %s", path);
  fseek(f, 0, SEEK_END);
  long length = ftell(f);
  fseek(f, 0, SEEK_SET);
  ck_assert_msg(length >= 0, "cannot tell the size of %s", path);
  unsigned char *data = malloc((size_t)length + 1);
  ck_assert_ptr_nonnull(data);
  ck_assert_uint_eq(fread(data, 1, (size_t)length, f), (size_t)length);
  fclose(f);
  data[length] = '\0';
  if (size) *size = (size_t)length;
  return data;
}

void sdpa_test_write_file(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot write %s", path);
  ck_assert_uint_eq(fwrite(data, 1, size, f), size);
  fclose(f);
}

int sdpa_test_count_prefixed(const char *dir, const char *prefix, char **found) {
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "cannot list %s", dir);
  size_t length = strlen(prefix);
  int count = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, length) != 0) continue;
    count++;
    if (found) {
      free(*found);
      *found = sdpa_test_path(dir, e->d_name);
    }
  }
  closedir(d);
  return count;
}

double sdpa_test_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

void sdpa_test_sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}
