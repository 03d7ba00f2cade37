/*
 * cache_hits.c — hit counts kept in memory.
 *
 * A hit writes nothing to the database (readers never queue behind each
 * other): lookups count hits and last-used times here, in a small hash
 * table with a lock of its own, and the counts of user rows are written in
 * one short transaction when the cache is closed or when pruning needs
 * them. Inspection adds the pending counts to what the file says.
 */
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"

static unsigned bucket_of(const char *hash) {
  unsigned value = 0;
  for (int i = 0; i < 2; i++) {
    char c = hash[i];
    value = value * 16 + (unsigned)(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return value % HIT_BUCKETS;
}

static hit_record *find(hit_table *t, const char *hash, sdpa_source source) {
  for (hit_record *r = t->buckets[bucket_of(hash)]; r; r = r->next)
    if (r->source == source && strcmp(r->hash, hash) == 0) return r;
  return NULL;
}

int cache_hits_init(hit_table *t) {
  memset(t, 0, sizeof *t);
  return pthread_mutex_init(&t->lock, NULL);
}

/* Drops records: those of user rows (`disk_only`) or all. Lock held. */
static void drop(hit_table *t, int disk_only) {
  for (int b = 0; b < HIT_BUCKETS; b++) {
    hit_record **p = &t->buckets[b];
    while (*p) {
      if (!disk_only || (*p)->source == SDPA_SOURCE_DISK) {
        hit_record *dead = *p;
        *p = dead->next;
        free(dead);
      } else {
        p = &(*p)->next;
      }
    }
  }
}

void cache_hits_destroy(hit_table *t) {
  drop(t, 0);
  pthread_mutex_destroy(&t->lock);
}

/* Out of memory: the hit goes uncounted. */
void cache_hit_note(hit_table *t, const char *hash, sdpa_source source) {
  pthread_mutex_lock(&t->lock);
  hit_record *record = find(t, hash, source);
  if (!record && (record = calloc(1, sizeof *record))) {
    memcpy(record->hash, hash, 33);
    record->source = source;
    unsigned b = bucket_of(hash);
    record->next = t->buckets[b];
    t->buckets[b] = record;
  }
  if (record) {
    record->hits++;
    record->last_used = cache_now_seconds();
  }
  pthread_mutex_unlock(&t->lock);
}

void cache_hit_forget(hit_table *t, const char *hash, sdpa_source source) {
  pthread_mutex_lock(&t->lock);
  for (hit_record **p = &t->buckets[bucket_of(hash)]; *p; p = &(*p)->next) {
    if ((*p)->source == source && strcmp((*p)->hash, hash) == 0) {
      hit_record *dead = *p;
      *p = dead->next;
      free(dead);
      break;
    }
  }
  pthread_mutex_unlock(&t->lock);
}

int64_t cache_hits_total(hit_table *t) {
  int64_t total = 0;
  pthread_mutex_lock(&t->lock);
  for (int b = 0; b < HIT_BUCKETS; b++)
    for (hit_record *r = t->buckets[b]; r; r = r->next)
      total = cache_count_add(total, r->hits);
  pthread_mutex_unlock(&t->lock);
  return total;
}

/* Orders records by hash, then source. */
static int record_order(const void *a, const void *b) {
  const hit_record *x = a, *y = b;
  int c = strcmp(x->hash, y->hash);
  if (c) return c;
  return (x->source > y->source) - (x->source < y->source);
}

int cache_hits_snapshot(hit_table *t, hit_snapshot *out) {
  out->records = NULL;
  out->count = 0;
  pthread_mutex_lock(&t->lock);
  size_t count = 0;
  for (int b = 0; b < HIT_BUCKETS; b++)
    for (hit_record *r = t->buckets[b]; r; r = r->next) count++;
  hit_record *records = count ? malloc(count * sizeof *records) : NULL;
  if (count && !records) {
    pthread_mutex_unlock(&t->lock);
    return -1;
  }
  size_t used = 0;
  for (int b = 0; b < HIT_BUCKETS; b++)
    for (hit_record *r = t->buckets[b]; r; r = r->next) {
      records[used] = *r;
      records[used++].next = NULL;
    }
  pthread_mutex_unlock(&t->lock);
  if (count) qsort(records, count, sizeof *records, record_order);
  out->records = records;
  out->count = count;
  return 0;
}

void cache_hits_snapshot_free(hit_snapshot *s) {
  free(s->records);
  s->records = NULL;
  s->count = 0;
}

const hit_record *cache_hits_find(const hit_snapshot *s, const char *hash,
                                  sdpa_source source) {
  if (!s->count || strlen(hash) != 32) return NULL;
  hit_record probe;
  memcpy(probe.hash, hash, 33);
  probe.source = source;
  return bsearch(&probe, s->records, s->count, sizeof probe, record_order);
}

int cache_hits_write(hit_table *t, sqlite3 *db) {
  sqlite3_stmt *stmt = NULL;
  int rc = SQLITE_OK;
  pthread_mutex_lock(&t->lock);
  for (int b = 0; b < HIT_BUCKETS && rc == SQLITE_OK; b++) {
    for (hit_record *r = t->buckets[b]; r && rc == SQLITE_OK; r = r->next) {
      if (r->source != SDPA_SOURCE_DISK) continue;
      if (!stmt) {
        rc = sqlite3_prepare_v2(db,
                                "UPDATE kernels SET hits = hits + ?1, "
                                "last_used = max(last_used, ?2) "
                                "WHERE key_hash = ?3",
                                -1, &stmt, NULL);
        if (rc != SQLITE_OK) break;
      }
      sqlite3_bind_int64(stmt, 1, r->hits);
      sqlite3_bind_int64(stmt, 2, r->last_used);
      sqlite3_bind_text(stmt, 3, r->hash, -1, SQLITE_STATIC);
      rc = sqlite3_step(stmt);
      sqlite3_reset(stmt);
      rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
  }
  pthread_mutex_unlock(&t->lock);
  sqlite3_finalize(stmt);
  return rc;
}

void cache_hits_clear_disk(hit_table *t) {
  pthread_mutex_lock(&t->lock);
  drop(t, 1);
  pthread_mutex_unlock(&t->lock);
}
