/*
 * cache_lock.c — cross-process single flight for one key: an flock() on
 * <db dir>/locks/<key hash>.lock.
 *
 * The lock directory lives inside the user's cache directory, which the
 * trust checks found to be the user's own. The directory and the file are
 * still opened as if someone else could have planted them: the directory
 * must be a real directory of ours (lstat), and the file is opened with
 * O_NOFOLLOW (a link is refused), O_NONBLOCK (a FIFO cannot hang the open)
 * and checked with fstat to be a regular file before flock waits on it —
 * with LOCK_NB in a loop, so the configured timeout always applies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_internal.h"

/* Makes <dir>/locks (0700) if missing and checks it. Returns 0 or -1. */
static int lock_directory(const char *dir, char *out, size_t size) {
  struct stat st;
  int n = snprintf(out, size, "%s/locks", dir);
  if (n < 0 || (size_t)n >= size) return -1;
  if (mkdir(out, 0700) != 0 && errno != EEXIST) return -1;
  if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & (S_IWGRP | S_IWOTH)))
    return -1;
  return 0;
}

void sdpa_cache_lock_key(sdpa_cache *cache, const char *key_hash, sdpa_cache_lock **out) {
  warning_list warnings = {0};
  char hash[33], dir[4200], file[4300];
  int fd = -1;
  if (!out) return;
  *out = NULL;
  if (!cache || !cache_normalize_hash(key_hash, hash) || !cache->dir) return;
  pthread_mutex_lock(&cache->write_lock);
  const int writable = cache->writer != NULL;
  pthread_mutex_unlock(&cache->write_lock);
  if (!writable) return; /* memory-only or read-only: nothing shared to guard */

  if (lock_directory(cache->dir, dir, sizeof dir) != 0) {
    cache_warn(&warnings,
               "cannot use the lock directory %s/locks (not a directory of this user "
               "writable by nobody else); compiling kernel %s without the "
               "cross-process lock",
               cache->dir, hash);
    goto done;
  }
  snprintf(file, sizeof file, "%s/%s.lock", dir, hash);
  /* flock needs no write access; O_RDWR would refuse a lock file made
   * read-only by another process of this user for no gain. */
  fd = open(file, O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    cache_warn(&warnings,
               "cannot use the lock file %s (%s); compiling kernel %s without the "
               "cross-process lock",
               file, fd < 0 ? strerror(errno) : "not a regular file", hash);
    if (fd >= 0) close(fd);
    fd = -1;
    goto done;
  }
  int64_t start = cache_monotonic_ms();
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    int64_t waited = cache_monotonic_ms() - start;
    if (errno != EWOULDBLOCK || waited >= cache->lock_timeout_ms) {
      if (errno == EWOULDBLOCK)
        cache_warn(&warnings,
                   "waited %lld ms for another process compiling kernel %s (lock %s); "
                   "compiling it here as well",
                   (long long)waited, hash, file);
      close(fd);
      fd = -1;
      goto done;
    }
    int64_t left = cache->lock_timeout_ms - waited;
    cache_sleep_ms(left < LOCK_POLL_MS ? (int)left : LOCK_POLL_MS);
  }
  *out = malloc(sizeof **out);
  if (!*out) {
    close(fd); /* releases the lock */
    goto done;
  }
  (*out)->fd = fd;
done:
  cache_emit(cache, &warnings);
}

void sdpa_cache_unlock_key(sdpa_cache_lock *lock) {
  if (!lock) return;
  flock(lock->fd, LOCK_UN);
  close(lock->fd);
  free(lock);
}
