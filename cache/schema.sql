-- schema.sql - the tables of the sdpa-jit kernel cache (one SQLite file).
--
-- One row per compiled kernel: the cubin NVRTC produced for one
-- specialization key, plus readable columns so the sqlite3 shell can answer
-- questions without the sdpa-jit tool (see cache/inspect.sql).
--
-- This text is embedded into the library at build time (src/embed.cmake)
-- and executed by src/cache_file.c when it opens a new or empty file (a
-- file of layout 1 is migrated there instead: the columns this layout
-- added, NULL on its rows). Every statement is idempotent, so
-- running it again, or from two processes at once, changes nothing. It
-- also works by hand: `sqlite3 kernels.sqlite < cache/schema.sql`.
--
-- Versioning: application_id marks the file as ours (0x53445041, "SDPA");
-- a file without it is never changed by sdpa-jit. user_version is the
-- layout version; a file with a newer one is left untouched and the
-- library keeps kernels in memory. Bump it (and SDPA_CACHE_SCHEMA_VERSION
-- in src/cache.h, with a migration step in src/cache_file.c) whenever the
-- layout changes. The key columns are the fields of src/key_fields.h
-- (tests/test_cpu_key.c checks that the two lists agree).

-- Both pragmas must come before the first write to a new file: auto_vacuum
-- can only be chosen while the file holds no table, and switching to WAL
-- writes the file header. On an existing file they change nothing
-- (auto_vacuum then stays as it was). INCREMENTAL lets pruning give freed
-- pages back to the file system (PRAGMA incremental_vacuum).
PRAGMA auto_vacuum = INCREMENTAL;
-- WAL: readers never wait for a writer, and a hit writes nothing.
PRAGMA journal_mode = WAL;

BEGIN IMMEDIATE;

CREATE TABLE IF NOT EXISTS kernels (
  -- 32 lowercase hex digits: XXH3-128 of the key text, the template
  -- sources, the NVRTC version, the compile options and the runtime
  -- version. The row's identity.
  key_hash        TEXT PRIMARY KEY NOT NULL,
  -- Canonical key text ("sdpa_bwd;arch=90;dtype=bf16;hd=128;..."),
  -- compared in full on every hit: a hash match with another text is a miss.
  key_text        TEXT NOT NULL,
  -- Readable copies of the key's fields, for queries (key_fields.h).
  arch            INTEGER,          -- compute capability, major*10+minor
  dtype           TEXT,             -- 'fp16' | 'bf16'
  head_dim        INTEGER,          -- of Q and K
  head_dim_v      INTEGER,          -- of V, O, dO
  q_tile          INTEGER,          -- query rows per thread block
  kv_tile         INTEGER,          -- key rows per thread block
  warps           INTEGER,
  stages          INTEGER,          -- software pipeline depth
  mask            TEXT,             -- 'none' | 'causal_tl' | 'causal_br' | 'window'
  layout          TEXT,             -- 'bshd' | 'thd'
  family          TEXT,             -- 'mma' (mma.sync) | 'hopper' (sm_90a)
  lse             TEXT,             -- 'packed' | 'strided' (LSE seq stride 1 or not)
  deterministic   INTEGER,          -- 0 | 1
  even            INTEGER,          -- 1: BSHD lengths multiples of the tiles
  dq              TEXT,             -- who writes dQ: 'convert' | 'main'
  -- Toolchain that produced the cubin ("13.0") and the sdpa-jit version
  -- ("0.1.0"). Both enter key_hash, so rows of an older toolchain are never
  -- returned; they age out through pruning (see inspect.sql, "stale").
  nvrtc_version   TEXT,
  runtime_version TEXT,
  -- The compiled kernel image, its size, and XXH3-64 of its bytes stored
  -- as a signed 64-bit integer; checked on every load. With a keyed
  -- checksum, mac is the HMAC-SHA256 (64 hex digits) of the key hash, key
  -- text and cubin under the fleet's secret; NULL without one.
  cubin           BLOB NOT NULL,
  cubin_bytes     INTEGER NOT NULL,
  checksum        INTEGER NOT NULL,
  mac             TEXT,
  -- How long NVRTC took, and what it said (NULL when it said nothing).
  compile_ms      REAL,
  compile_log     TEXT,
  -- Unix seconds. last_used and hits are updated in batches (when a
  -- process closes its cache), never on the hit itself.
  created         INTEGER NOT NULL,
  last_used       INTEGER NOT NULL,
  hits            INTEGER NOT NULL DEFAULT 0
);

-- Least-recently-used pruning and "most recently used first" listings.
CREATE INDEX IF NOT EXISTS kernels_last_used ON kernels (last_used);
-- `sdpa-jit show '<key text>'` finds a row by its full key text.
CREATE INDEX IF NOT EXISTS kernels_key_text ON kernels (key_text);

PRAGMA application_id = 1396985921; -- 0x53445041, "SDPA"
PRAGMA user_version = 2;

COMMIT;
