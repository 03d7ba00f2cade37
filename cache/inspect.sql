-- inspect.sql - questions about the sdpa-jit kernel cache, answered in the
-- sqlite3 shell.
--
-- Run all of them:   sqlite3 ~/.cache/sdpa-jit/kernels.sqlite < inspect.sql
-- or paste one query at a time into `sqlite3 <cache file>`. Nothing here
-- writes to the file. The cache is in WAL mode, so this is safe while
-- programs are using it.
--
-- Times are unix seconds (shown as UTC below). `hits` and `last_used` are
-- written when a process closes its cache, so a running process's use
-- shows up after it exits. Default location: $SDPA_JIT_CACHE, else
-- $XDG_CACHE_HOME/sdpa-jit/kernels.sqlite, else
-- ~/.cache/sdpa-jit/kernels.sqlite.
--
-- To save one cubin for cuobjdump / nvdisasm (the shell's writefile()):
--   SELECT writefile('kernel.cubin', cubin) FROM kernels
--    WHERE key_hash LIKE 'abcdef%';
--   -- then: cuobjdump -sass kernel.cubin

.headers on
.mode column

-- Entries by size: the largest cubins first.
SELECT key_hash, key_text, cubin_bytes,
       round(compile_ms, 1) AS compile_ms
  FROM kernels
 ORDER BY cubin_bytes DESC;

-- Compile time by head dimension: how many kernels, and what NVRTC spent
-- on them (average, slowest, total).
SELECT head_dim, head_dim_v,
       count(*)                          AS kernels,
       round(avg(compile_ms), 1)         AS avg_ms,
       round(max(compile_ms), 1)         AS max_ms,
       round(sum(compile_ms) / 1000.0, 2) AS total_s
  FROM kernels
 GROUP BY head_dim, head_dim_v
 ORDER BY head_dim, head_dim_v;

-- Most used: the 20 kernels with the most hits.
SELECT key_hash, key_text, hits,
       datetime(last_used, 'unixepoch') AS last_used
  FROM kernels
 ORDER BY hits DESC, last_used DESC
 LIMIT 20;

-- Least used: the 20 kernels used longest ago (first to go when the cache
-- is pruned to its size cap).
SELECT key_hash, key_text, hits,
       datetime(last_used, 'unixepoch') AS last_used
  FROM kernels
 ORDER BY last_used ASC, hits ASC
 LIMIT 20;

-- Stale entries: unused for more than 30 days, or built by another NVRTC or
-- sdpa-jit version than the newest entry (their keys can no longer be
-- asked for: the versions are part of the key hash). Remove them with
-- `sdpa-jit prune`.
SELECT key_hash, key_text, nvrtc_version, runtime_version, cubin_bytes,
       datetime(last_used, 'unixepoch') AS last_used,
       CASE WHEN last_used < CAST(strftime('%s', 'now') AS INTEGER) - 30 * 86400
            THEN 'unused > 30 days' ELSE 'old toolchain' END AS why
  FROM kernels
 WHERE last_used < CAST(strftime('%s', 'now') AS INTEGER) - 30 * 86400
    OR nvrtc_version IS NOT (SELECT nvrtc_version FROM kernels
                              ORDER BY created DESC LIMIT 1)
    OR runtime_version IS NOT (SELECT runtime_version FROM kernels
                                ORDER BY created DESC LIMIT 1)
 ORDER BY last_used ASC;

-- Total: entries, cubin bytes, and the size of the file itself (the WAL
-- file next to it is not counted).
SELECT (SELECT count(*) FROM kernels)                       AS entries,
       (SELECT coalesce(sum(cubin_bytes), 0) FROM kernels)  AS cubin_bytes,
       (SELECT coalesce(sum(hits), 0) FROM kernels)         AS hits,
       (SELECT page_count * page_size
          FROM pragma_page_count(), pragma_page_size())     AS file_bytes;
