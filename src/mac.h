/*
 * mac.h — SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for the cache's
 * keyed checksums.
 *
 * With a secret configured (sdpa_runtime_options.cache_key_file,
 * SDPA_JIT_CACHE_KEY_FILE or SDPA_JIT_CACHE_KEY) every row carries an
 * HMAC-SHA256 of its key hash, key text and cubin, so a cache shared over
 * a network file system cannot be fed a cubin by anyone who lacks the
 * secret: unlike the XXH3 checksum, which anyone can recompute, the MAC
 * cannot be forged without it.
 */
#ifndef SDPA_MAC_H
#define SDPA_MAC_H

#include <stddef.h>
#include <stdint.h>

typedef struct sdpa_sha256 {
  uint32_t state[8];
  uint64_t bytes;
  unsigned char block[64];
  size_t used;
} sdpa_sha256;

void sdpa_sha256_init(sdpa_sha256 *ctx);
void sdpa_sha256_update(sdpa_sha256 *ctx, const void *data, size_t size);
void sdpa_sha256_final(sdpa_sha256 *ctx, unsigned char digest[32]);

/* HMAC-SHA256 over the concatenation of `count` pieces. */
typedef struct sdpa_mac_piece {
  const void *data;
  size_t size;
} sdpa_mac_piece;
void sdpa_hmac_sha256(const unsigned char *key, size_t key_size,
                      const sdpa_mac_piece *pieces, size_t count,
                      unsigned char mac[32]);

/* 64 lowercase hex digits and a NUL. */
void sdpa_mac_hex(const unsigned char mac[32], char out[65]);

#endif /* SDPA_MAC_H */
