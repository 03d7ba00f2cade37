/*
 * mac.c — SHA-256 and HMAC-SHA256 (mac.h), written from FIPS 180-4 and
 * RFC 2104; tests/test_cpu_mac.c checks them against the published test
 * vectors (FIPS 180-4 examples, RFC 4231).
 */
#include "mac.h"

#include <string.h>

static const uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t state[8], const unsigned char block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
           (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int i = 0; i < 64; i++) {
    uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + round_constants[i] + w[i];
    uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
  state[4] += e;
  state[5] += f;
  state[6] += g;
  state[7] += h;
}

void sdpa_sha256_init(sdpa_sha256 *ctx) {
  static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(ctx->state, initial, sizeof initial);
  ctx->bytes = 0;
  ctx->used = 0;
}

void sdpa_sha256_update(sdpa_sha256 *ctx, const void *data, size_t size) {
  const unsigned char *p = data;
  ctx->bytes += size;
  while (size > 0) {
    size_t take = 64 - ctx->used < size ? 64 - ctx->used : size;
    memcpy(ctx->block + ctx->used, p, take);
    ctx->used += take;
    p += take;
    size -= take;
    if (ctx->used == 64) {
      compress(ctx->state, ctx->block);
      ctx->used = 0;
    }
  }
}

void sdpa_sha256_final(sdpa_sha256 *ctx, unsigned char digest[32]) {
  const uint64_t bits = ctx->bytes * 8;
  unsigned char pad = 0x80;
  sdpa_sha256_update(ctx, &pad, 1);
  pad = 0;
  while (ctx->used != 56) sdpa_sha256_update(ctx, &pad, 1);
  unsigned char length[8];
  for (int i = 0; i < 8; i++) length[i] = (unsigned char)(bits >> (56 - 8 * i));
  sdpa_sha256_update(ctx, length, 8);
  for (int i = 0; i < 8; i++) {
    digest[4 * i] = (unsigned char)(ctx->state[i] >> 24);
    digest[4 * i + 1] = (unsigned char)(ctx->state[i] >> 16);
    digest[4 * i + 2] = (unsigned char)(ctx->state[i] >> 8);
    digest[4 * i + 3] = (unsigned char)ctx->state[i];
  }
}

void sdpa_hmac_sha256(const unsigned char *key, size_t key_size,
                      const sdpa_mac_piece *pieces, size_t count,
                      unsigned char mac[32]) {
  unsigned char block[64] = {0}, pad[64], inner[32];
  sdpa_sha256 ctx;
  if (key_size > 64) {
    sdpa_sha256_init(&ctx);
    sdpa_sha256_update(&ctx, key, key_size);
    sdpa_sha256_final(&ctx, block);
  } else if (key_size > 0) {
    memcpy(block, key, key_size);
  }
  for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
  sdpa_sha256_init(&ctx);
  sdpa_sha256_update(&ctx, pad, 64);
  for (size_t i = 0; i < count; i++) sdpa_sha256_update(&ctx, pieces[i].data, pieces[i].size);
  sdpa_sha256_final(&ctx, inner);
  for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
  sdpa_sha256_init(&ctx);
  sdpa_sha256_update(&ctx, pad, 64);
  sdpa_sha256_update(&ctx, inner, 32);
  sdpa_sha256_final(&ctx, mac);
}

void sdpa_mac_hex(const unsigned char mac[32], char out[65]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[mac[i] >> 4];
    out[2 * i + 1] = hex[mac[i] & 15];
  }
  out[64] = '\0';
}
