/*
 * sdpa_hopper.cuh - flash-attention backward for sm_90a (H100, H200):
 * wgmma, bulk tensor copies (TMA) on mbarriers, and warp specialization.
 * The translation unit's entry for the family: it includes the shared
 * preprocess and convert kernels (sdpa_aux.cuh) unchanged and defines the
 * main kernel under the same name as the mma family's.
 *
 *   sdpa_bwd_main   one CTA per (kv tile of N rows, kv head, sequence),
 *                   384 threads in three warpgroups:
 *     warpgroup 0   producer (setmaxnreg.dec to PRODUCER_REGS). Warp 0's
 *                   lane 0 loads K and V once and then, per step, the
 *                   step's Q and dO tiles into a STAGES-deep ring (TMA,
 *                   completing on the stage's `full` mbarrier; a one-stage
 *                   ring, HOP_SPLIT_DO, loads dO on barriers of its own);
 *                   warps 1-2 write the step's LSE * log2 e and Delta rows
 *                   into the ring (+inf and 0 for rows past the sequence,
 *                   +inf for rows that see no key) and arrive on the same
 *                   barrier. Both wait on the stage's `empty` barrier
 *                   before reuse. In deterministic kernels, lanes of warp
 *                   3 (or lane 0 of warps 3 and 2: DQ_WRITER_WARPS): the
 *                   dQ writers (write_dq), which add each step's staged
 *                   dQ tile in kv-tile order while the consumers go on.
 *     warpgroups 1, 2   consumers (setmaxnreg.inc to CONSUMER_REGS), each
 *                   owning 64 of the N kv rows (up to head_dim 128; above,
 *                   the wide kernel's consumers in sdpa_hopper_wide.cuh
 *                   split one 64-row tile's head-dim columns instead);
 *                   per step (query head h,
 *                   query tile it of M rows):
 *                     S^T  = K Q^T, dP^T = V dO^T   wgmma SS, M = 64 kv
 *                            rows, N = the query tile, K = head dim
 *                     P^T  = exp2(S^T * scale log2 e - LSE log2 e)
 *                            (0 where masked)
 *                     dS^T = P^T (dP^T - Delta)
 *                     dV  += P^T dO, dK += dS^T Q   wgmma RS: P^T and
 *                            dS^T stay in registers as the A operand
 *                            (an accumulator's 16 columns pack into one
 *                            k16 A fragment), dO and Q as MN-major B
 *                     dS^T to shared memory (stmatrix, 128-byte swizzle),
 *                            a named barrier over both consumers, then
 *                     dQ   = dS K     wgmma SS (dS MN-major, K MN-major),
 *                            the query tile split between the consumers
 *                            (M = 128: 64 rows each; M = 64: head-dim
 *                            columns [0, 64) and [64, D)), reduced into
 *                            dq_accum by bulk reduce-adds of its fragments
 *                            staged in shared memory at the step's end
 *                            (dq_accum's fragment order is the
 *                            accumulator's; dq_stage) and issued under the
 *                            next step's S^T GEMM (dq_send), or handed to
 *                            the dQ writer (deterministic)
 *                   and releases the stage. After the loop: dK * scale and
 *                   dV from registers, rows < the kv tile's length.
 *   dS is double-buffered: a consumer writes step st+1's dS only after
 *   passing step st's barrier, which both reached after finishing their
 *   dQ GEMM of step st-1 (the one that read that buffer).
 *
 * Parameters (the translation unit #defines them; key fields):
 *   SDPA_DTYPE 1 fp16 | 2 bf16; SDPA_HEAD_DIM, SDPA_HEAD_DIM_V (multiples
 *   of 8, head_dim_v <= head_dim <= 256: sdpa_hopper_supported);
 *   SDPA_Q_TILE, SDPA_KV_TILE, SDPA_WARPS, SDPA_STAGES as
 *   sdpa_hopper_choose gives them; SDPA_LSE_PACKED; SDPA_LAYOUT 1 BSHD |
 *   2 THD; SDPA_MASK 0..3; SDPA_DETERMINISTIC (1:
 *   each query tile's dQ adds in a fixed order of its kv tiles, each
 *   waiting for the previous tile's adds to be complete: bitwise-
 *   reproducible; kv-tile order, descending under a right-bounded
 *   mask, or without a mask the rotation's where a kv head's blocks fit
 *   the GPU, p.sm_count: dq_rank); SDPA_EVEN;
 *   SDPA_FOLD_DQ (0 only).
 *
 * Launch contract: sdpa_hopper_traits.h (grid, block, shared memory) and
 * sdpa_tensor_maps.h (the maps). Preprocess before, convert after, as for
 * the mma family (sdpa_aux.cuh). Reads q, k, v, dout (TMA), lse, delta,
 * cu_seqlens; writes dk, dv, dq_accum; sets *error_flag bits for bad THD
 * input. The block index order is the mma family's (decode_block).
 *
 * Compile-time variants besides the key (bench_hopper --define):
 * SDPA_HOPPER_DQ_BULK (default SDPA_HOPPER_DQ_BULK_DEFAULT(head_dim, det); 0:
 * dQ reduced from registers, its carve sdpa_hopper_smem_layout_variant(c,
 * 0, 1)), SDPA_HOPPER_DS_FP32_P, SDPA_HOPPER_STAGGER, SDPA_HOPPER_ABLATE,
 * SDPA_HOPPER_TRACE and SDPA_HOPPER_STAGES_VARIANT (measurement only),
 * SDPA_HOPPER_PRODUCER_REGS / _CONSUMER_REGS, SDPA_HOPPER_NARROW_DK_LAST;
 * the wide kernel's SDPA_HOPPER_WIDE_K_REGS and
 * SDPA_HOPPER_WIDE_DQ_INTERLEAVE.
 */
#include "sdpa_params.h"
#include "sdpa_tensor_maps.h"
#include "sdpa_hopper_traits.h"
#include "sdpa_mma.cuh"
#include "sdpa_wgmma.cuh"
#include "sdpa_seq.cuh"
#include "sdpa_aux.cuh" /* preprocess, convert; defines D, DV, DT */

#define HOP_M SDPA_Q_TILE
#define HOP_N SDPA_KV_TILE
#define HOP_STAGES SDPA_STAGES
#define HOP_THREADS (32 * SDPA_WARPS)

/* dQ reduction (default SDPA_HOPPER_DQ_BULK_DEFAULT, sdpa_hopper_traits.h):
 * 1 each warp stages its 16 x NQ fp32 slice in shared memory, in
 * dq_accum's fragment order, and one lane hands it to the bulk-copy unit
 * as a single reduce-add (cp.reduce.async.bulk ... .add.f32); the next step
 * waits for the unit to have read the slice before rewriting it. 0: one
 * red.global.add.v4.f32 per fragment from registers. */
#ifndef SDPA_HOPPER_DQ_BULK
#define SDPA_HOPPER_DQ_BULK SDPA_HOPPER_DQ_BULK_DEFAULT(SDPA_HEAD_DIM, SDPA_DETERMINISTIC)
#endif
/* Which kernel the tiles say (sdpa_hopper_choose): the wide one
 * (sdpa_hopper_wide.cuh) with a 64-row kv tile, a preprocessor test (its
 * consumers are a file of their own); the transposed-dQ one
 * (sdpa_hopper_dqt.cuh, HOP_DQT below) with 32-row query tiles; else the
 * narrow one. */
#define HOP_WIDE (SDPA_KV_TILE < 64 * SDPA_HOPPER_CONSUMERS) /* sdpa_hopper_config_wide */

/* dS from P in fp32 (1: FlashAttention-2's one rounding; its P stays
 * live across the dP GEMM's wait) or from the P rounded for dV (0). */
#ifndef SDPA_HOPPER_DS_FP32_P
#define SDPA_HOPPER_DS_FP32_P 1
#endif

/* The configuration of this key, and the one the traits choose for its
 * head dims: the translation unit's tiles must be those. */
constexpr sdpa_hopper_config HOP_CFG = {D, DV, HOP_M, HOP_N, SDPA_WARPS, HOP_STAGES};
constexpr sdpa_hopper_config HOP_CHOSEN = sdpa_hopper_choose(D, DV, SDPA_DETERMINISTIC);
constexpr bool HOP_DQT = sdpa_hopper_config_dqt(HOP_CFG);
static_assert(HOP_WIDE == sdpa_hopper_config_wide(HOP_CFG), "the wide kernel's test");
static_assert(sdpa_hopper_supported(D, DV), "head dims of the sm_90a family");
#ifndef SDPA_HOPPER_STAGES_VARIANT /* measurement only: bench_hopper --define */
#define SDPA_HOPPER_STAGES_VARIANT HOP_CHOSEN.stages
#endif
static_assert(HOP_M == HOP_CHOSEN.q_tile && HOP_N == HOP_CHOSEN.kv_tile &&
                  SDPA_WARPS == HOP_CHOSEN.warps && HOP_STAGES == SDPA_HOPPER_STAGES_VARIANT,
              "tiles, warps and stages as sdpa_hopper_choose gives them");
static_assert(HOP_N == (HOP_WIDE ? 64 : 64 * SDPA_HOPPER_CONSUMERS) &&
                  SDPA_WARPS == SDPA_HOPPER_WARPS,
              "each consumer warpgroup owns 64 kv rows (the wide kernel: both own the same)");
static_assert(HOP_M == 128 || HOP_M == 64 || (HOP_M == 32 && !HOP_WIDE), "query tile");

/* Measurement only (bench_hopper --define; wrong results): 1 leaves out
 * the dQ reductions, 2 the dQ GEMM and its barrier too; 3 stages each dQ
 * slice but sends none; 4 sends them without waiting for the previous
 * read; 5 stores them (a bulk copy) instead of adding (narrow kernel,
 * bulk adds). */
#ifndef SDPA_HOPPER_ABLATE
#define SDPA_HOPPER_ABLATE 0
#endif
/* Whether the consumers stage and send their dQ at all. */
#define DQ_OUT (SDPA_HOPPER_ABLATE != 1 && SDPA_HOPPER_ABLATE != 2)

/* 1 (the default): the narrow kernel issues dQ before dK and stages dQ
 * while dK runs (hd 128: +2%, bench/HOPPER-NOTES.md); 0, for measurement:
 * dK, then dQ, staged after both. */
#ifndef SDPA_HOPPER_NARROW_DK_LAST
#define SDPA_HOPPER_NARROW_DK_LAST 1
#endif
/* The transposed-dQ kernel (sdpa_hopper_dqt.cuh): 0 (the default) issues
 * dK's GEMM after the consumers' meeting, beside dQ^T, and stages dQ^T
 * while dK runs; 1 issues dK with dV, before the dS store and the
 * meeting, so that both run while the consumers meet: H100, 192/128 S8k,
 * full +0.8%, causal +1.6% (two rounds each; results equal to the
 * mma.sync family's at full size); with the step's descriptors
 * (SDPA_HOPPER_DESC_STEP) full +0.7%, causal -1.6%, one round
 * (bench/HOPPER-NOTES.md). A measurement variant (bench_hopper --define). */
#ifndef SDPA_HOPPER_DQT_DK_EARLY
#define SDPA_HOPPER_DQT_DK_EARLY 0
#endif
/* The transposed-dQ kernel's consumers: 0 (the default) each in its own
 * instantiation of consume (dQ^T chunks 2 and 1); 1 both in consume's
 * two-chunk one, consumer 1 issuing its one chunk's GEMM twice and
 * dropping the second (a wgmma under a predicate serializes the pipeline,
 * C7515): the kernel compiles in about two thirds of the time (one
 * consumer loop instead of two), for +7.7% of the step's tensor work.
 * H100, bf16 192/128 S8k, 1 against 0: full -4%, causal -7% (two rounds);
 * a measurement variant (bench/NOTES.md). */
#ifndef SDPA_HOPPER_DQT_ONE
#define SDPA_HOPPER_DQT_ONE 0
#endif
/* How the main loop's shared-memory descriptors (rows_gemm: S^T, dP^T;
 * dq_gemm; the wide kernel's wide_acc_gemm; the transposed-dQ kernel's
 * dQ^T) are made (SmemDescs): 1 (the default) in each step from opaque
 * bases plus constants; 0, for measurement, from the addresses, where the
 * compiler may hoist them out of the loop (a register each, spilled where
 * registers are tight). H100, bf16 BSHD, 1 against 0: +0 to +4% at hd 64
 * and 128 (S 1k-16k, two rounds), none slower (bench/HOPPER-NOTES.md). */
#ifndef SDPA_HOPPER_DESC_STEP
#define SDPA_HOPPER_DESC_STEP 1
#endif
template <u32 LBO, u32 SBO> using SmemDescs = gmma_descs<LBO, SBO, SDPA_HOPPER_DESC_STEP != 0>;
/* The query tiles' rotation between kv tiles (Work.it_first): kv tile j
 * starts at query tile j * STAGGER round its range; 0: every kv tile from
 * its first query tile. 1 for the wide kernel where it stages dQ
 * (SDPA_HOPPER_DQ_BULK: head dims 136-192) without a mask: H100, bf16 S8k
 * full, two rounds, hd 192 +2.5%, hd 160 +1.6%; within +-0.6% at hd 64
 * and 128 (S 1k-16k) and hd 256, where it stays 0 (on the H200 at hd 128:
 * +1.2 to +1.9% at S 1k-4k without a mask, -2.5 to -4% at S 16k causal).
 * Not in deterministic plans (their adds go in kv-tile order). */
#ifndef SDPA_HOPPER_STAGGER
#define SDPA_HOPPER_STAGGER (SDPA_MASK == 0 && HOP_WIDE && SDPA_HOPPER_DQ_BULK)
#endif

/* 1: the kernel takes its tiles in a loop (a persistent grid: block b
 * takes tiles b, b + gridDim.x, ...; sdpa_hopper_persistent_kernel says
 * for which keys the runtime launches it so); 0: one tile a block.
 * Measurement (bench_hopper --define): 0 where the traits say 1, or 1
 * under a mask (block b's tiles are then of unequal weight). */
#ifndef SDPA_HOPPER_PERSIST
#define SDPA_HOPPER_PERSIST \
  SDPA_HOPPER_PERSISTENT_KERNEL(SDPA_HEAD_DIM, SDPA_LAYOUT, SDPA_MASK, SDPA_DETERMINISTIC)
#endif

/* The last wave's split tiles (sdpa_hopper_tail.cuh; the launch asks
 * with p.tail_parts > 1 where sdpa_hopper_tail_covers): compiled into the
 * keys the traits name, but for the measurement variants that change a
 * tile's walk (STAGGER, PERSIST). */
#define HOP_TAIL                                                                             \
  (SDPA_HOPPER_TAIL_COVERS(SDPA_HEAD_DIM <= SDPA_HOPPER_WIDE_ABOVE, SDPA_HEAD_DIM, SDPA_LAYOUT, \
                           SDPA_MASK, SDPA_DETERMINISTIC, SDPA_FOLD_DQ) &&                     \
   !SDPA_HOPPER_STAGGER && !SDPA_HOPPER_PERSIST)
static_assert(!HOP_TAIL || (!HOP_WIDE && !HOP_DQT), "the split tiles: the narrow kernel");

/* Longest first (decode_block; the launch sets p.seq_order where
 * sdpa_hopper_longest_first): compiled into the keys the traits name. */
#define HOP_LONGEST_FIRST                                                                     \
  SDPA_HOPPER_LONGEST_FIRST(SDPA_LAYOUT, SDPA_MASK, SDPA_DETERMINISTIC, SDPA_FOLD_DQ)

/* Measurement only (bench_hopper --trace): SDPA_HOPPER_TRACE = N records,
 * for the first N blocks of the grid, SDPA_HOPPER_TRACE_SLOTS stamps in
 * the module's global sdpa_hopper_trace (block-major): 0 globaltimer at
 * entry, 1 SM id << 32 | steps + 1 (0: the block had no work), then SM
 * clocks: 2 entry, 3 K arrived (consumer 0), 4 its loop done, 5 both
 * consumers done with their GEMMs, 6 its dK / dV stored, 7 the
 * producer's last copy issued, 8 consumer 1's dK / dV stored, 9
 * globaltimer at consumer 0's end. Callers test SDPA_HOPPER_TRACE first,
 * so that without it the stamps compile away. */
#ifndef SDPA_HOPPER_TRACE
#define SDPA_HOPPER_TRACE 0
#endif
#if SDPA_HOPPER_TRACE
__device__ unsigned long long sdpa_hopper_trace[SDPA_HOPPER_TRACE * SDPA_HOPPER_TRACE_SLOTS];
SDPA_DEVICE void trace_mark(int slot, unsigned long long value) {
  const unsigned long long flat = (unsigned long long)blockIdx.y * gridDim.x + blockIdx.x;
  if (flat < SDPA_HOPPER_TRACE) sdpa_hopper_trace[flat * SDPA_HOPPER_TRACE_SLOTS + slot] = value;
}
SDPA_DEVICE unsigned long long trace_clock() { return clock64(); }
SDPA_DEVICE unsigned long long trace_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
SDPA_DEVICE unsigned trace_smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
#else
SDPA_DEVICE void trace_mark(int, unsigned long long) {}
SDPA_DEVICE unsigned long long trace_clock() { return 0; }
SDPA_DEVICE unsigned long long trace_globaltimer() { return 0; }
SDPA_DEVICE unsigned trace_smid() { return 0; }
#endif

/* Register budgets after setmaxnreg. The block starts with
 * ENTRY_REGS a thread (__launch_bounds__(THREADS, 1): 65536 / 384 rounded
 * down to a multiple of 8 = 168), and setmaxnreg.inc waits until the pool
 * has what it asks for, so the warpgroups' budgets must fit in what the
 * block holds: 128 * P + 128 * CONSUMERS * C <= ENTRY_REGS * THREADS. */
#ifndef SDPA_HOPPER_PRODUCER_REGS
#define SDPA_HOPPER_PRODUCER_REGS 24
#endif
#ifndef SDPA_HOPPER_CONSUMER_REGS
#define SDPA_HOPPER_CONSUMER_REGS 240
#endif
#define ENTRY_REGS ((65536 / HOP_THREADS) / 8 * 8)
static_assert(128 * SDPA_HOPPER_PRODUCER_REGS +
                      128 * SDPA_HOPPER_CONSUMERS * SDPA_HOPPER_CONSUMER_REGS <=
                  ENTRY_REGS * HOP_THREADS,
              "setmaxnreg budgets within the block's registers (else .inc never returns)");

/* One tile's work: kv rows [k0, k0 + kv_valid) of sequence b, kv head hk
 * (kv_valid 0: the tile has no rows, nothing to do); for each query head
 * of the group, query tiles [it_lo, it_hi], from it_first round to
 * it_first - 1 (SDPA_HOPPER_STAGGER). */
struct Work {
  int b, hk, sq, skv, k0, kv_valid, it_lo, it_hi, it_first, steps, h_first;
  /* deterministic: whether the adds' order follows the rotation, and
   * dq_rank's constants: K / T, K % T, j % T, j / T */
  int rotate, rot_q, rot_r, rot_jm, rot_jd;
  /* a split tile's part (-1: the whole tile) and slot (HOP_TAIL) */
  int part, slot;
  sdpa_i64 q0, kv0;
  Band band;
};

/* Shared-memory carve (sdpa_hopper_traits.h). */
/* dQ staging buffers (deterministic kernels: one writer thread each) */
constexpr int DQ_BUFFERS = sdpa_hopper_dq_buffers(HOP_CFG, SDPA_HOPPER_DQ_BULK, SDPA_DETERMINISTIC);
constexpr sdpa_hopper_smem HOP_SMEM =
    sdpa_hopper_smem_layout_variant(HOP_CFG, SDPA_HOPPER_DQ_BULK, DQ_BUFFERS, SDPA_HOPPER_PERSIST);
static_assert(!SDPA_HOPPER_PERSIST || (!HOP_WIDE && !SDPA_DETERMINISTIC),
              "persistent: the narrow kernel, not deterministic");
#define SMEM_K HOP_SMEM.k
#define SMEM_V HOP_SMEM.v
#define SMEM_Q HOP_SMEM.q
#define SMEM_DO HOP_SMEM.dout
#define SMEM_DS HOP_SMEM.ds
#define SMEM_P HOP_SMEM.p
#define SMEM_LSE HOP_SMEM.lse2
#define SMEM_DELTA HOP_SMEM.delta
#define SMEM_BAR HOP_SMEM.bar
#define SMEM_WORK HOP_SMEM.work
/* tile n's coordinates: slot n % 2 */
#define SMEM_WORK_SLOT(n) (SMEM_WORK + ((n) & 1) * SDPA_HOPPER_WORK_BYTES)
#define SMEM_DQ HOP_SMEM.dq
#define Q_TILE_BYTES sdpa_hopper_tile_bytes(HOP_M, D)
#define DO_TILE_BYTES sdpa_hopper_tile_bytes(HOP_M, DV)
#define DS_TILE_BYTES sdpa_hopper_tile_bytes(HOP_N, HOP_M)
/* Box strides of each tile (bytes between its 64-column boxes). */
#define BOX_KV (HOP_N * 128)
#define BOX_Q (HOP_M * 128)
#define BOX_DS (HOP_N * 128)
static_assert(SMEM_K % 1024 == 0 && SMEM_V % 1024 == 0 && SMEM_Q % 1024 == 0 &&
                  SMEM_DO % 1024 == 0 && SMEM_DS % 1024 == 0 && Q_TILE_BYTES % 1024 == 0 &&
                  DO_TILE_BYTES % 1024 == 0 && DS_TILE_BYTES % 1024 == 0,
              "swizzled tiles start 1024-aligned");
static_assert(sizeof(Work) <= SDPA_HOPPER_WORK_BYTES && SMEM_WORK % 16 == 0,
              "the block's coordinates fit their region");
static_assert(SMEM_BAR % 8 == 0 && HOP_SMEM.carve + 1024 == HOP_SMEM.total &&
                  HOP_SMEM.total <= 232448,
              "the carve fits sm_90's 227 KiB with the base's alignment");

/* Barriers (8 bytes each from SMEM_BAR, SDPA_HOPPER_BARRIERS of them):
 * full[s], empty[s], k (the K tile in), (deterministic plans) dq_full[b],
 * dq_empty[b]: the dQ tile staged by the consumers in buffer b for its
 * dQ writer, and handed back once it has been read, halves[2], v (the V
 * tile in: apart from K, so that the first S^T GEMM waits only for K and
 * Q); persistent kernels: kv_empty (the consumers are done with a tile's
 * K and V: the next tile's may come), work_full[2] (a tile's coordinates
 * written in slot n % 2) and work_empty[2] (every role done with them). */
#define BAR_FULL(s) (SMEM_BAR + 8 * (s))
#define BAR_EMPTY(s) (SMEM_BAR + 8 * (HOP_STAGES + (s)))
#define BAR_K (SMEM_BAR + 8 * 2 * HOP_STAGES)
#define BAR_DQ_FULL(b) (BAR_K + 8 + 8 * (b))
#define BAR_DQ_EMPTY(b) (BAR_K + 24 + 8 * (b))
/* The wide kernel: both consumers' P^T and dS^T halves of buffer b in
 * (sdpa_hopper_wide.cuh; an mbarrier, since the two consumers run
 * different instantiations and so different barrier instructions). */
#define BAR_HALVES(b) (BAR_K + 40 + 8 * (b))
#define BAR_V (BAR_K + 56)
#define BAR_KV_EMPTY (BAR_K + 64)
#define BAR_WORK_FULL(n) (BAR_K + 72 + 8 * ((n) & 1))
#define BAR_WORK_EMPTY(n) (BAR_K + 88 + 8 * ((n) & 1))
static_assert(BAR_WORK_EMPTY(1) + 8 == SMEM_BAR + 8 * SDPA_HOPPER_BARRIERS(HOP_STAGES),
              "the barriers' region");
/* A one-stage ring (sdpa_hopper_stages; the wide kernel, never
 * persistent) loads dO on barriers of its own, in the work slots' room:
 * the consumers' last GEMM of a step reads dO (sdpa_hopper_wide.cuh:
 * dK's GEMM before dV's), so Q is free
 * and the next step's Q (with its LSE / Delta rows) comes in while they
 * finish; full[0] and empty[0] are Q's, do_full / do_empty dO's. */
#define HOP_SPLIT_DO (HOP_STAGES == 1)
#define BAR_DO_FULL BAR_WORK_FULL(0)
#define BAR_DO_EMPTY BAR_WORK_EMPTY(0)
static_assert(!HOP_SPLIT_DO || (HOP_WIDE && !SDPA_HOPPER_PERSIST),
              "dO's barriers take the work slots' of a kernel that does not loop over tiles");

/* dQ staging buffer b of DQ_BUFFERS: a step's [HOP_M / 16][16 x D] fp32 */
SDPA_DEVICE u32 dq_buffer(u32 base, int b) { return base + SMEM_DQ + b * (HOP_M * D * 4); }
/* The dQ writers of a deterministic kernel (write_dq): writer k takes the
 * steps st with st % DQ_WRITERS == k, staged in buffer k % DQ_BUFFERS.
 * A writer's bulk completion wait holds its whole warp, so writers in one
 * warp take turns; with 64-row query tiles (short steps) the two writers
 * are lane 0 of warps 3 and 2 (DQ_WRITER_WARPS), even over one buffer,
 * and the LSE/Delta rows are warp 1's alone; else lanes of warp 3. */
#define DQ_WRITERS (SDPA_DETERMINISTIC ? (HOP_M <= 64 ? 2 : DQ_BUFFERS) : 1)
#define DQ_WRITER_WARPS (SDPA_DETERMINISTIC && HOP_M <= 64)
static_assert(DQ_WRITERS <= 2 && DQ_WRITERS % DQ_BUFFERS == 0, "dq_full barriers, one a writer");
/* Arrivals that complete a phase: full = the TMA thread (with its bytes)
 * + the ROW_THREADS threads of the LSE/Delta rows; empty and dq_full =
 * every consumer thread; dq_empty = the writer that read the buffer. */
#define ROW_THREADS (DQ_WRITER_WARPS || HOP_M < 64 ? 32 : 64)
#define CONSUMER_THREADS (128 * SDPA_HOPPER_CONSUMERS)
#define FULL_ARRIVALS (1 + ROW_THREADS)
/* work_empty: the TMA thread, the row threads and every consumer thread */
#define WORK_ARRIVALS (1 + ROW_THREADS + CONSUMER_THREADS)
static_assert(!SDPA_DETERMINISTIC || SDPA_HOPPER_DQ_BULK,
              "deterministic dQ goes through the writer's bulk reduce-adds");

/* dQ tile split between the consumers (sdpa_hopper_traits.h): M = 128,
 * 64 query rows each; else columns [0, split) and [split, D). */
#define DQ_SPLIT_M (HOP_M == 128)
#define DQ_N0 sdpa_hopper_dq_cols(HOP_CFG, 0)
#define DQ_N1 sdpa_hopper_dq_cols(HOP_CFG, 1)
static_assert(DQ_SPLIT_M || sdpa_hopper_dq_col0(HOP_CFG, 1) % 64 == 0,
              "each consumer's dQ columns start at a box");
/* k16 steps of the reductions over D and DV (columns past a tensor's
 * last one are zeros in shared memory: the bulk copies fill them) */
#define D_STEPS ((D + 15) / 16)
#define DV_STEPS ((DV + 15) / 16)

#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)

/* ----------------------------------------------------------- work split */

/* The orders of the deterministic adds (dq_rank): whether they may follow
 * the rotation (no mask), whether they descend (a launch-wide fact,
 * sdpa_hopper_traits.h) */
#define HOP_ROTATE (SDPA_DETERMINISTIC && SDPA_MASK == 0)
#define HOP_DESCENDS(p)                                                       \
  (SDPA_DETERMINISTIC && sdpa_hopper_dq_descends(SDPA_MASK, (p).window_right, (p).group))

/* Blocks a kv tile's query heads are split over (sdpa_params.h,
 * sdpa_hopper_head_chunks): 1 for deterministic and persistent kernels
 * (the plan splits neither: the fp32 path beside the stores spilled 24-28
 * bytes in the persistent hd 64 kernel). */
SDPA_DEVICE int head_chunks(const sdpa_kernel_params &p) {
  return SDPA_DETERMINISTIC || SDPA_HOPPER_PERSIST || p.head_chunks < 1 ? 1 : p.head_chunks;
}

/* Tile (bx, by)'s kv tile j, sequence b, kv head hk (one tile a block:
 * the block's index; persistent: the block's n-th tile, flat index
 * by * grid_x + bx); the mma family's order
 * (sdpa_bwd.cuh, decode_block): no mask: x = b * kv_tiles + j; masked:
 * within groups of p.order_group (sequence, kv head) pairs, kv tile j of
 * each before j + 1 (heaviest first; deterministic plans in index order
 * take every pair as one group), or j + 1 before j where the adds
 * descend (HOP_DESCENDS: lightest first, each block after those whose
 * adds it waits for). With the query heads split (head_chunks), hk is
 * the kv head times the chunks plus the chunk, make_work's to part.
 * THD without a mask where p.seq_order is set: the flat index's spans of
 * heads x kv tiles, the r-th for sequence seq_order[r] (longest first). */
SDPA_DEVICE void decode_block(const sdpa_kernel_params &p, unsigned bx, unsigned by,
                              unsigned grid_x, int &j, int &b, int &hk) {
  const int kv_tiles = (p.seqlen_kv + HOP_N - 1) / HOP_N;
#if SDPA_MASK == 0
#if HOP_LONGEST_FIRST
  if (p.seq_order) { /* spans of heads x kv tiles, a sequence each, longest first */
    const int heads = p.heads_kv * head_chunks(p);
    const sdpa_i64 flat = (sdpa_i64)by * grid_x + bx, span = (sdpa_i64)heads * kv_tiles;
    const sdpa_i64 r = flat / span;
    const int rem = (int)(flat - r * span);
    b = p.seq_order[r];
    hk = rem / kv_tiles;
    j = rem - hk * kv_tiles;
    return;
  }
#endif
  (void)grid_x;
  j = bx % kv_tiles;
  b = bx / kv_tiles;
  hk = by;
#else
  const int heads = p.heads_kv * head_chunks(p);
  const sdpa_i64 flat = (sdpa_i64)by * grid_x + bx;
  const sdpa_i64 pairs = (sdpa_i64)p.batch * heads;
  const sdpa_i64 span = (sdpa_i64)p.order_group * kv_tiles;
  const sdpa_i64 group = flat / span, first = group * p.order_group;
  const int members = (int)min((sdpa_i64)p.order_group, pairs - first);
  const int r = (int)(flat - group * span);
  j = HOP_DESCENDS(p) ? kv_tiles - 1 - r / members : r / members;
  const sdpa_i64 pair = first + r % members;
  b = (int)(pair / heads);
  hk = (int)(pair % heads);
#endif
}

/* Whether query tile `it` needs element-wise masking from the band (the
 * kv tile's end is handled apart, rows past a sequence by LSE2 = +inf). */
SDPA_DEVICE bool band_crosses(const Work &w, int it) {
  const int i0 = it * HOP_M, diag = w.k0 - w.band.off;
  bool cross = false;
  if (w.band.right >= 0 && diag + HOP_N - 1 - w.band.right > i0) cross = true;
  if (w.band.left >= 0 && diag < i0 + HOP_M - 1 - w.band.left) cross = true;
  return cross;
}

/* The next step's query tile and head: the group's heads one after the
 * other, each over its tiles it_lo..it_hi from it_first round. */
SDPA_DEVICE void advance_step(const Work &w, int &it, int &h) {
  if (++it > w.it_hi) it = w.it_lo;
  if (it == w.it_first) ++h;
}

/* -------------------------------------------------------------- producer */

/* TMA coordinates of row `row` (of a sequence starting at token `t0`),
 * head h, sequence b, column box `box`. */
SDPA_DEVICE void tma_tile(u32 dst, const sdpa_tensor_map *map, u32 bar, int box, int row,
                          sdpa_i64 t0, int h, int b) {
#if SDPA_LAYOUT == 1
  (void)t0;
  tma_load_4d(dst, map, bar, box * SDPA_HOPPER_BOX_COLS, row, h, b);
#else
  (void)b;
  tma_load_3d(dst, map, bar, box * SDPA_HOPPER_BOX_COLS, (int)(t0 + row), h);
#endif
}

/* The four tensor maps into the TMA unit's cache (once a block). */
SDPA_DEVICE void prefetch_maps(const sdpa_tensor_maps &maps) {
  tma_prefetch_map(&maps.q);
  tma_prefetch_map(&maps.k);
  tma_prefetch_map(&maps.v);
  tma_prefetch_map(&maps.dout);
}

/* Warp 0, one lane: a tile's K and V once, then each step's Q and dO;
 * g0 steps of the ring (earlier tiles') before its first. */
SDPA_DEVICE void produce_tiles(const sdpa_tensor_maps &maps, const Work &w, u32 base, int g0) {
  /* K, the first Q, V, the first dO: in the order the first step's
   * GEMMs read them */
  mbar_arrive_expect_tx(base + BAR_K, sdpa_hopper_tile_bytes(HOP_N, D));
#pragma unroll
  for (int x = 0; x < sdpa_hopper_boxes(D); ++x)
    tma_tile(base + SMEM_K + x * BOX_KV, &maps.k, base + BAR_K, x, w.k0, w.kv0, w.hk, w.b);
  int h = w.h_first, it = w.it_first;
#pragma unroll 1
  for (int st = 0; st < w.steps; ++st) {
    const int g = g0 + st, stage = g % HOP_STAGES, use = g / HOP_STAGES;
    if (use > 0) mbar_wait(base + BAR_EMPTY(stage), (use - 1) & 1);
    const u32 full = base + BAR_FULL(stage);
    mbar_arrive_expect_tx(full, Q_TILE_BYTES + (HOP_SPLIT_DO ? 0 : DO_TILE_BYTES));
    const u32 sq_ = base + SMEM_Q + stage * Q_TILE_BYTES;
    const u32 sdo = base + SMEM_DO + stage * DO_TILE_BYTES;
#pragma unroll
    for (int x = 0; x < sdpa_hopper_boxes(D); ++x)
      tma_tile(sq_ + x * BOX_Q, &maps.q, full, x, it * HOP_M, w.q0, h, w.b);
    if (st == 0) {
      mbar_arrive_expect_tx(base + BAR_V, sdpa_hopper_tile_bytes(HOP_N, DV));
#pragma unroll
      for (int x = 0; x < sdpa_hopper_boxes(DV); ++x)
        tma_tile(base + SMEM_V + x * BOX_KV, &maps.v, base + BAR_V, x, w.k0, w.kv0, w.hk, w.b);
    }
    u32 do_full = full;
    if (HOP_SPLIT_DO) {
      if (use > 0) mbar_wait(base + BAR_DO_EMPTY, (use - 1) & 1);
      do_full = base + BAR_DO_FULL;
      mbar_arrive_expect_tx(do_full, DO_TILE_BYTES);
    }
#pragma unroll
    for (int x = 0; x < sdpa_hopper_boxes(DV); ++x)
      tma_tile(sdo + x * BOX_Q, &maps.dout, do_full, x, it * HOP_M, w.q0, h, w.b);
    advance_step(w, it, h);
  }
}

/* Warps 1 and 2, or warp 1 alone (DQ_WRITER_WARPS, or 32-row query
 * tiles): ROW_THREADS threads, one or two rows each. Each step's LSE2 =
 * LSE * log2 e (+inf for rows past the sequence and rows with no visible
 * key, so that their P is 0) and Delta (0 past the sequence). */
static_assert(HOP_M % ROW_THREADS == 0, "rows per thread");
SDPA_DEVICE void produce_rows(const sdpa_kernel_params &p, const Work &w, u32 base,
                              unsigned char *smem, int g0) {
  const int tid = threadIdx.x - 32; /* 0 .. ROW_THREADS - 1 */
  int h = w.h_first, it = w.it_first;
#pragma unroll 1
  for (int st = 0; st < w.steps; ++st) {
    const int g = g0 + st, stage = g % HOP_STAGES, use = g / HOP_STAGES;
    if (use > 0) mbar_wait(base + BAR_EMPTY(stage), (use - 1) & 1);
#if SDPA_LAYOUT == 1
    const float *lse = p.lse + (sdpa_i64)w.b * p.lse_batch + (sdpa_i64)h * p.lse_head;
#else
    const float *lse = p.lse + (sdpa_i64)h * p.lse_head + w.q0 * p.lse_seq;
#endif
    const float *delta = p.delta + (sdpa_i64)h * p.rows_q + w.q0;
    float l[HOP_M / ROW_THREADS], dl[HOP_M / ROW_THREADS];
#pragma unroll
    for (int u = 0; u < HOP_M / ROW_THREADS; ++u) {
      const int i = it * HOP_M + tid + u * ROW_THREADS;
      l[u] = POS_INF;
      dl[u] = 0.f;
      if (SDPA_EVEN || i < w.sq) {
#if SDPA_LSE_PACKED
        l[u] = lse[i];
#else
        l[u] = lse[(sdpa_i64)i * p.lse_seq];
#endif
        dl[u] = delta[i];
      }
    }
    float *s_lse = (float *)(smem + SMEM_LSE) + stage * HOP_M;
    float *s_delta = (float *)(smem + SMEM_DELTA) + stage * HOP_M;
#pragma unroll
    for (int u = 0; u < HOP_M / ROW_THREADS; ++u) {
      s_lse[tid + u * ROW_THREADS] = l[u] == NEG_INF ? POS_INF : l[u] * LOG2E;
      s_delta[tid + u * ROW_THREADS] = dl[u];
    }
    mbar_arrive(base + BAR_FULL(stage));
    advance_step(w, it, h);
  }
}

/* The rank of this block's adds into query tile `it` (deterministic
 * plans): index order, kv tile j after the tiles from band_first_kv_tile
 * on, or (HOP_DESCENDS, main's w.rotate):
 *
 * Descending (a mask with a right bound, HOP_DESCENDS): kv tile j after
 * the tiles above it up to band_last_kv_tile. Kv tile j + 1 starts
 * HOP_N / HOP_M query tiles after j and so visits each tile of j's at
 * least that many steps before j does, and the launch runs it first: the
 * add j waits for was made steps earlier. In index order kv tile j's
 * first add waits for j - 1's at j - 1's own step: a chain through the
 * head, one add's latency a kv tile.
 *
 * The rotation (no mask): kv tile j visits tile i at step (i + j) mod
 * T of each head (T query tiles, w.it_first), and the K kv tiles of the
 * sequence add into it in the order of (that step, j), so that each adds
 * one step after the one before it instead of all waiting in a chain at
 * the same step. The rank counts the kv tiles j' < K before j: of the
 * values (i + j') mod T, K = q T + r of them (every value q times, then
 * i .. i + r - 1 mod T once more), those below a = (i + j) mod T, plus
 * the j / T earlier ones equal to a (the divisions made once, in main:
 * the writer runs on the producer's few registers). */
SDPA_DEVICE int dq_rank(const sdpa_kernel_params &p, const Work &w, int it) {
  const int i0 = it * HOP_M;
  if (SDPA_MASK != 0 && HOP_DESCENDS(p))
    return band_last_kv_tile(w.band, min(w.sq - 1, i0 + HOP_M - 1), w.skv, HOP_N) -
           w.k0 / HOP_N;
  if (!HOP_ROTATE || !w.rotate) return w.k0 / HOP_N - band_first_kv_tile(w.band, i0, HOP_N);
  const int T = w.it_hi - w.it_lo + 1, i = it - w.it_lo, r = w.rot_r;
  int a = i + w.rot_jm;
  if (a >= T) a -= T;
  const int below = i + r <= T ? min(max(a - i, 0), r)
                               : min(max(a - i, 0), T - i) + min(a, i + r - T);
  return w.rot_q * a + below + w.rot_jd;
}

/* Copy `chain`'s counter of query tile (h, b, it) (write_dq: derived where
 * used, with unsigned indices, so that no 64-bit value or sign word is
 * kept live across the writer's waits). */
SDPA_DEVICE sdpa_i32 *chain_counter(const sdpa_kernel_params &p, int chain, int h, int b, int it) {
  return q_tile_counter_of<unsigned long long>(counters_of(p, chain), p, h, b, it);
}

/* dQ writer k of DQ_WRITERS (deterministic plans): the dQ tile of each
 * step st with st % DQ_WRITERS == k, staged by the consumers in buffer
 * k % DQ_BUFFERS, into dq_accum in a fixed order of the kv tiles that
 * visit query tile (h, it) (dq_rank: index order, descending or the
 * rotation's).
 * The add of rank r goes into copy c = r % DQ_COPIES of dq_accum
 * (sdpa_dq_copies: two for the wide kernel without a mask, else one),
 * after the one of rank r - DQ_COPIES: wait until copy c's counter for
 * the tile reads r / DQ_COPIES (the chain's adds before this one are
 * complete) and for the staged tile (dq_full[k]); add it, one bulk
 * reduce-add per 16-row block inside the sequence; hand the staging
 * back once read (dq_empty of the buffer); wait for the adds to be
 * complete (not only read), then pass the chain's turn on. The
 * consumers run on meanwhile. The target is derived after the waits,
 * so that little is live across them (the producer warpgroup's
 * registers are few). */
SDPA_DEVICE void write_dq(const sdpa_kernel_params &p, const Work &w, u32 base, int k) {
  int h = w.h_first, it = w.it_first;
  if (k) advance_step(w, it, h);
#pragma unroll 1
  for (int st = k; st < w.steps; st += DQ_WRITERS) {
    const int kv_rank = dq_rank(p, w, it), chain = kv_rank % DQ_COPIES;
    dq_turn_wait(chain_counter(p, chain, h, w.b, it), kv_rank / DQ_COPIES);
    mbar_wait(base + BAR_DQ_FULL(k), (st / DQ_WRITERS) & 1);
    fence_proxy_async_global(); /* the adds after the counter's acquire */
    const int i0 = it * HOP_M;
    const unsigned long long blk_elems = sdpa_widen(p.heads_q, 0ull) * (D * 16);
    float *const dqa =
        dq_accum_of(p, chain) +
        ((unsigned long long)dq_block_base(p, w.b, w.q0) + sdpa_widen(i0 / 16, 0ull)) * blk_elems +
        sdpa_widen(h, 0ull) * (D * 16);
    const u32 staged = dq_buffer(base, k % DQ_BUFFERS);
#pragma unroll 1
    for (int rb = 0; rb < HOP_M / 16; ++rb)
      if (SDPA_EVEN || i0 + 16 * rb < w.sq)
        bulk_reduce_add_f32(dqa + rb * blk_elems, staged + rb * (D * 16 * 4), D * 16 * 4);
    bulk_wait_read();
    mbar_arrive(base + BAR_DQ_EMPTY(k % DQ_BUFFERS));
    bulk_wait_all();
    fence_proxy_async_global();
    __threadfence();
    dq_turn_pass(chain_counter(p, chain, h, w.b, it), kv_rank / DQ_COPIES + 1);
#pragma unroll 1
    for (int n = 0; n < DQ_WRITERS; ++n) advance_step(w, it, h);
  }
}

#include "sdpa_hopper_fold.cuh" /* SDPA_FOLD_DQ: fold_dq (warp 3), fold_report_* */
#if HOP_TAIL
#include "sdpa_hopper_tail.cuh" /* tail_tile, tail_share, tail_merge */
#endif

/* -------------------------------------------------------------- consumer */

/* P = 0 outside the band and in rows past the kv tile's end (after the
 * exponential, so any softmax scale's sign is safe), over COLS query
 * columns from i0. Element (kv row r, query column c) of the thread:
 * r = row0 + 8*(e/2), c = i0 + 8j + 2t + e%2. */
template <int COLS>
SDPA_DEVICE void mask_probs(float (&s)[COLS / 2], const Work &w, int row0, int t, int i0,
                            bool band) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = row0 + 8 * hf;
    const bool row_ok = SDPA_EVEN || r < w.kv_valid;
    /* key - query - off at column 0 of the tile */
    const int dk = w.k0 + r - i0 - w.band.off;
#pragma unroll
    for (int j = 0; j < COLS / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int dd = dk - (8 * j + 2 * t + e);
        bool ok = row_ok;
        if (band) {
          if (w.band.right >= 0 && dd > w.band.right) ok = false;
          if (w.band.left >= 0 && dd < -w.band.left) ok = false;
        }
        if (!ok) s[4 * j + 2 * hf + e] = 0.f;
      }
  }
}

/* acc (+)= A B^T over `steps` k16 steps, both K-major from 64-column
 * boxes: A = the kv tile's rows (K or V) from address a, B = the query
 * tile's rows (Q or dO) from address b: S^T = K Q^T and dP^T = V dO^T. */
template <int N, int STEPS>
SDPA_DEVICE void rows_gemm(float (&acc)[N / 2], u32 a, u32 b) {
  const SmemDescs<16, 1024> da(a), db(b);
#pragma unroll
  for (int kk = 0; kk < STEPS; ++kk) {
    const int x = kk / 4, c = (kk % 4) * 32;
    wgmma_ss<N, 0, 0>(acc, da.at(x * BOX_KV, c), db.at(x * BOX_Q, c), kk > 0);
  }
}

/* P^T = exp2(S^T scale log2 e - LSE log2 e) in place, over COLS query
 * columns whose LSE2 rows start at l2s. */
template <int COLS>
SDPA_DEVICE void exp_probs(float (&s)[COLS / 2], const float *l2s, int t, float scale_log2) {
#pragma unroll
  for (int j = 0; j < COLS / 8; ++j) {
    const float2 l = *(const float2 *)(l2s + 8 * j + 2 * t);
    s[4 * j + 0] = fast_exp2(fmaf(s[4 * j + 0], scale_log2, -l.x));
    s[4 * j + 1] = fast_exp2(fmaf(s[4 * j + 1], scale_log2, -l.y));
    s[4 * j + 2] = fast_exp2(fmaf(s[4 * j + 2], scale_log2, -l.x));
    s[4 * j + 3] = fast_exp2(fmaf(s[4 * j + 3], scale_log2, -l.y));
  }
}

/* One 16x16 fragment to shared memory: stmatrix x4, matrices (rows 0-7,
 * cols 0-7), (rows 8-15, same), (rows 0-7, cols 8-15), (rows 8-15, 8-15);
 * lane l gives the address of row l % 8 of matrix l / 8 (x2: the first
 * two matrices, lanes 0-15). TRANS: each matrix transposed, its column
 * l % 8 at lane l's address (sdpa_hopper_dqt.cuh). */
template <bool TRANS = false>
SDPA_DEVICE void stmatrix_x4(u32 addr, const u32 (&f)[4]) {
  if constexpr (TRANS) /* each matrix's columns stored as rows */
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     addr),
                 "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3])
                 : "memory");
  else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3])
                 : "memory");
}
SDPA_DEVICE void stmatrix_x2(u32 addr, const u32 (&f)[2]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(addr), "r"(f[0]),
               "r"(f[1])
               : "memory");
}

/* The epilogue's staging (finish_consumer): dK and dV as rows of bf16 /
 * fp16, OUT_PITCH_* bytes a row (sdpa_hopper_out_pitch: conflict-free
 * stmatrix and reads), in the buffers free once every GEMM of the tile
 * has retired: one tile a block, from Q on (Q, dO, dS); persistent, from
 * dS on (dS, P and the dQ staging, the carve grown to hold them), so that
 * the producer may fill the next tile's Q and dO stages meanwhile. */
#define OUT_PITCH_K sdpa_hopper_out_pitch(D)
#define OUT_PITCH_V sdpa_hopper_out_pitch(DV)
#define SMEM_OUT_K (SDPA_HOPPER_PERSIST ? SMEM_DS : SMEM_Q)
#define SMEM_OUT_V (SMEM_OUT_K + HOP_N * OUT_PITCH_K)
static_assert(HOP_N * (OUT_PITCH_K + OUT_PITCH_V) <= (SDPA_HOPPER_PERSIST ? SMEM_LSE : SMEM_DQ) -
                                                         SMEM_OUT_K,
              "the dK / dV staging fits in the buffers free at the epilogue");

/* This thread's accumulator fragments (NC columns from col0, times mul)
 * to the staging rows at out: the warp's 16 rows from rbase, stmatrix x4
 * per 16 columns (x2 for a last 8). */
template <int NC>
SDPA_DEVICE void stage_rows(u32 out, int pitch, const float (&acc)[NC / 2], float mul, int rbase,
                            int col0) {
  const int lane = threadIdx.x & 31, mq = lane >> 3;
  const u32 row = out + (u32)(rbase + (lane & 7) + 8 * (mq & 1)) * pitch + (col0 / 8) * 16;
#pragma unroll
  for (int jj = 0; jj < NC / 16; ++jj) {
    const u32 f[4] = {pack2<DT>(acc[8 * jj] * mul, acc[8 * jj + 1] * mul),
                      pack2<DT>(acc[8 * jj + 2] * mul, acc[8 * jj + 3] * mul),
                      pack2<DT>(acc[8 * jj + 4] * mul, acc[8 * jj + 5] * mul),
                      pack2<DT>(acc[8 * jj + 6] * mul, acc[8 * jj + 7] * mul)};
    stmatrix_x4(row + (2 * jj + (mq >> 1)) * 16, f);
  }
  if constexpr (NC % 16 == 8) {
    constexpr int j = NC / 8 - 1;
    const u32 f[2] = {pack2<DT>(acc[4 * j] * mul, acc[4 * j + 1] * mul),
                      pack2<DT>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul)};
    stmatrix_x2(row + j * 16, f);
  }
}

/* Staged rows (COLS columns, pitch bytes apart) to global memory at dst
 * (row stride ld elements), rows < valid: every consumer thread, one
 * 16-byte chunk at a time, consecutive threads on consecutive chunks. */
template <int COLS>
SDPA_DEVICE void copy_rows(u16 *dst, sdpa_i64 ld, u32 out, int pitch, int valid) {
  constexpr int CHUNKS = COLS / 8;
  const int tid = threadIdx.x - 128;
#pragma unroll 4
  for (int x = tid; x < HOP_N * CHUNKS; x += CONSUMER_THREADS) {
    const int r = x / CHUNKS, c = x % CHUNKS;
    if (SDPA_EVEN || r < valid) {
      u32 v0, v1, v2, v3;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                   : "r"(out + (u32)r * pitch + c * 16));
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst + r * ld + c * 8), "r"(v0),
                   "r"(v1), "r"(v2), "r"(v3)
                   : "memory");
    }
  }
}

/* This thread's accumulator fragments (NC columns from col0 of the kv
 * rows' dkv_accum rows, times mul) added to dkv_accum (sdpa_params.h):
 * the warp's 16 rows from rbase, rows < kv_valid, a column pair a
 * red.global.add.v2.f32. */
template <int NC>
SDPA_DEVICE void add_rows(const sdpa_kernel_params &p, const Work &w, const float (&acc)[NC / 2],
                          float mul, int rbase, int col0) {
  const int lane = threadIdx.x & 31;
  const sdpa_i64 pitch = (sdpa_i64)p.heads_kv * (D + DV); /* floats a kv token */
  float *const at = p.dkv_accum + (w.kv0 + w.k0) * pitch + (sdpa_i64)w.hk * (D + DV) + col0 +
                    2 * (lane & 3);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = rbase + (lane >> 2) + 8 * hf;
    if (r < w.kv_valid) {
      float *const row = at + r * pitch;
#pragma unroll
      for (int j = 0; j < NC / 8; ++j)
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(row + 8 * j),
                     "f"(acc[4 * j + 2 * hf] * mul), "f"(acc[4 * j + 2 * hf + 1] * mul)
                     : "memory");
    }
  }
}

/* P^T packed as 16x16 fragments (the A operand of a k16 wgmma from
 * registers, and stmatrix x4's four matrices): fragment kk holds query
 * columns 16kk..16kk+15 of this thread's rows. */
template <int COLS>
SDPA_DEVICE void pack_probs(u32 (&pf)[COLS / 16][4], const float (&s)[COLS / 2]) {
#pragma unroll
  for (int kk = 0; kk < COLS / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pf[kk][r] = pack2<DT>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

/* dS^T = P^T (dP^T - Delta) from the fp32 P (one rounding, FlashAttention-
 * 2's), packed as pack_probs packs P^T; Delta's rows from dls. P^T's pair
 * for (j, hf) is s[4j + 2hf], s[4j + 2hf + 1]. */
/* The packed dS^T pair of accumulator pair (j, hf): P^T (dP^T - Delta),
 * Delta of the pair's two query columns in dl. */
SDPA_DEVICE u32 ds_pair(float p0, float p1, float dp0, float dp1, float2 dl) {
  return pack2<DT>(p0 * (dp0 - dl.x), p1 * (dp1 - dl.y));
}
template <int COLS>
SDPA_DEVICE void ds_frags(u32 (&df)[COLS / 16][4], const float (&s)[COLS / 2],
                          const float (&dp)[COLS / 2], const float *dls, int t) {
#pragma unroll
  for (int j = 0; j < COLS / 8; ++j) {
    const float2 dl = *(const float2 *)(dls + 8 * j + 2 * t);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      df[j / 2][2 * (j % 2) + hf] = ds_pair(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1],
                                            dp[4 * j + 2 * hf], dp[4 * j + 2 * hf + 1], dl);
  }
}

/* The ring's stage and phase and the double-buffer index after a
 * consumer's step (the query tile and head advance apart). */
SDPA_DEVICE void advance_ring(int &stage, u32 &phase, int &buf) {
  buf ^= 1;
  if (++stage == HOP_STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

/* A consumer's end of a tile, both consumers together: once every GEMM
 * of the tile has retired, each stages its dK (times the scale) and dV
 * columns (NK from k_col, NV from v_col; its rows: the warp's 16 from
 * row0's 16-row block) in the freed buffers, then all of them store the
 * tile's rows < kv_valid; or, where the group's query heads are split
 * over blocks (head_chunks), each adds its columns to dkv_accum. The
 * bulk reduce-adds must have read their staged dQ: persistent, before
 * the staging (which covers it), and both consumers meet again after the
 * stores (the next tile's dS and dQ go where the rows were staged); else
 * last (the block's shared memory must
 * outlive the reads; the adds themselves complete before the kernel
 * does). */
template <int NK, int NV>
SDPA_DEVICE void finish_consumer(const sdpa_kernel_params &p, const Work &w_in, u32 base,
                                 const float (&acc_dk)[NK / 2], const float (&acc_dv)[NV / 2],
                                 int row0, int k_col, int v_col) {
  /* the consumers run different instantiations (the wide kernel, uneven
   * dQ splits): the unaligned barrier */
#if SDPA_HOPPER_PERSIST && SDPA_HOPPER_DQ_BULK
  bulk_wait_read();
#endif
  named_barrier_sync_unaligned(1, CONSUMER_THREADS);
  if (SDPA_HOPPER_TRACE && threadIdx.x == 128) trace_mark(5, trace_clock());
#if !SDPA_HOPPER_PERSIST
  /* the block's one Work slot, addressed anew from base: the generic
   * pointer the kernel's entry made held a register across the main loop
   * (spilled where the consumers' registers are tightest) */
  const Work &w = *(const Work *)shared_generic(base + SMEM_WORK);
  (void)w_in;
#else
  const Work &w = w_in;
#endif
  if (head_chunks(p) > 1) {
    add_rows<NK>(p, w, acc_dk, p.scale, row0 & ~15, k_col);
    add_rows<NV>(p, w, acc_dv, 1.f, row0 & ~15, D + v_col);
  } else {
    stage_rows<NK>(base + SMEM_OUT_K, OUT_PITCH_K, acc_dk, p.scale, row0 & ~15, k_col);
    stage_rows<NV>(base + SMEM_OUT_V, OUT_PITCH_V, acc_dv, 1.f, row0 & ~15, v_col);
    named_barrier_sync_unaligned(1, CONSUMER_THREADS);
    const sdpa_i64 dk_at = kv_row_offset(w.b, w.kv0, w.k0, w.hk, p.dk_batch, p.dk_seq, p.dk_head),
                   dv_at = kv_row_offset(w.b, w.kv0, w.k0, w.hk, p.dv_batch, p.dv_seq, p.dv_head);
    copy_rows<D>((u16 *)p.dk + dk_at, p.dk_seq, base + SMEM_OUT_K, OUT_PITCH_K, w.kv_valid);
    copy_rows<DV>((u16 *)p.dv + dv_at, p.dv_seq, base + SMEM_OUT_V, OUT_PITCH_V, w.kv_valid);
  }
#if SDPA_HOPPER_PERSIST
  named_barrier_sync_unaligned(1, CONSUMER_THREADS);
#elif SDPA_FOLD_DQ
  fold_report_end(base, w.steps);
#elif SDPA_HOPPER_DQ_BULK && !SDPA_DETERMINISTIC
  bulk_wait_read();
#endif
  if (SDPA_HOPPER_TRACE && threadIdx.x == 128) {
    trace_mark(6, trace_clock());
    trace_mark(9, trace_globaltimer());
  }
  if (SDPA_HOPPER_TRACE && threadIdx.x == 256) trace_mark(8, trace_clock());
}

/* The dQ GEMM of one consumer: dq = dS[q rows q_off.., all kv] *
 * K[all kv, d_off..d_off + NQ). */
template <int NQ>
SDPA_DEVICE void dq_gemm(float (&dq)[NQ / 2], u32 s_ds, u32 s_k, int q_off, int d_off) {
  const SmemDescs<BOX_DS, 1024> da(s_ds + (q_off / 64) * BOX_DS + (q_off % 64) * 2);
  const SmemDescs<BOX_KV, 1024> db(s_k + (d_off / 64) * BOX_KV + (d_off % 64) * 2);
#pragma unroll
  for (int kk = 0; kk < HOP_N / 16; ++kk)
    wgmma_ss<NQ, 1, 1>(dq, da.at(kk * 2048), db.at(kk * 2048), kk > 0);
}

/* A consumer warp's dQ piece of step st (query tile from row i0, head h):
 * its 16 query rows (row block rb of the tile) x NQ columns from d_off,
 * into dq_accum, in two halves so that a caller can put work between
 * them. dq_stage: SDPA_HOPPER_DQ_BULK: staged in shared memory at
 * fragment d_off / 8 of block rb (sdpa_hopper_traits.h; NQ / 8 fragments
 * of 128 floats, contiguous here and in dq_accum), once the unit (or,
 * deterministic, the dQ writer) has read the previous step's (the
 * step's FIRST piece waits; a later one goes elsewhere); else one
 * vector reduction per fragment from registers. It returns the slice's
 * target in dq_accum, or null for rows past the sequence (nothing staged).
 * dq_send: the staged slice made visible to the bulk-copy unit and added
 * to that target by one bulk reduce-add, or (deterministic) handed to the
 * dQ writer (write_dq), which adds the tiles in kv-tile order: the whole
 * tile once each consumer has staged its last piece (LAST; a consumer
 * that stages its columns in two GEMMs hands over after the second). */
SDPA_DEVICE u32 dq_slice(u32 base, int st, int rb, int d_off) {
  return dq_buffer(base, st % DQ_BUFFERS) + (rb * D * 16 + (d_off / 8) * 128) * 4;
}

template <int NQ, bool FIRST>
SDPA_DEVICE float *dq_stage(const Work &w, u32 base, int st, int i0, int h, int rb, int d_off,
                            const float (&dq)[NQ / 2], float *const dq_first,
                            sdpa_i64 blk_elems) {
  const int lane = threadIdx.x & 31;
  float *const dqa = dq_first + (sdpa_i64)(i0 / 16) * blk_elems + (sdpa_i64)h * (D * 16);
#if SDPA_DETERMINISTIC
  (void)w;
  /* the writer has read this buffer's previous step (st - DQ_BUFFERS) */
  if (FIRST && st >= DQ_BUFFERS)
    mbar_wait(base + BAR_DQ_EMPTY(st % DQ_BUFFERS), (st / DQ_BUFFERS - 1) & 1);
#else
  (void)st;
  if (!SDPA_EVEN && i0 + 16 * rb >= w.sq) return nullptr;
#endif
#if SDPA_HOPPER_DQ_BULK
#if !SDPA_DETERMINISTIC
  /* the unit has read this thread's earlier slices (the previous step's;
   * a step's later pieces go elsewhere in the buffer) */
  if (FIRST && SDPA_HOPPER_ABLATE != 4) bulk_wait_read();
  __syncwarp();
#endif
  const u32 slice = dq_slice(base, st, rb, d_off);
#pragma unroll
  for (int j = 0; j < NQ / 8; ++j)
    st_shared_v4(slice + j * 512 + lane * 16, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2],
                 dq[4 * j + 3]);
#else
  (void)base, (void)rb, (void)d_off;
#pragma unroll
  for (int j = 0; j < NQ / 8; ++j) {
    const float v4[4] = {dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]};
    red_frag(dqa + j * 128, lane, v4);
  }
#endif
  return dqa;
}

template <int NQ, bool LAST>
SDPA_DEVICE void dq_send(u32 base, int st, int rb, int d_off, float *const dqa) {
#if SDPA_HOPPER_DQ_BULK && SDPA_DETERMINISTIC
  (void)rb, (void)d_off, (void)dqa;
  if (!LAST) return; /* the writer takes the whole tile, once staged */
  fence_proxy_async();
  mbar_arrive(base + BAR_DQ_FULL(st % DQ_WRITERS));
#elif SDPA_HOPPER_DQ_BULK
  if (!dqa || SDPA_HOPPER_ABLATE == 3) return;
  fence_proxy_async();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    if (SDPA_HOPPER_ABLATE == 5)
      bulk_store(dqa, dq_slice(base, st, rb, d_off), NQ * 16 * 4);
    else
      bulk_reduce_add_f32(dqa, dq_slice(base, st, rb, d_off), NQ * 16 * 4);
  }
#else
  (void)base, (void)rb, (void)d_off, (void)dqa; /* reduced by dq_stage */
#endif
}

template <int NQ, bool FIRST = true, bool LAST = true>
SDPA_DEVICE void dq_out(const Work &w, u32 base, int st, int i0, int h, int rb, int d_off,
                        const float (&dq)[NQ / 2], float *const dq_first, sdpa_i64 blk_elems) {
  dq_send<NQ, LAST>(base, st, rb, d_off,
                    dq_stage<NQ, FIRST>(w, base, st, i0, h, rb, d_off, dq, dq_first, blk_elems));
}

#if !HOP_WIDE
/* acc (N columns) += A B: A this thread's fragments of one k16 step, B
 * the MN-major Q or dO tile from b (its 64-column boxes BOX_Q apart);
 * above 128 columns (the transposed-dQ kernel's dK) two GEMMs, the
 * widest wrapper being 128. */
template <int N>
SDPA_DEVICE void rs_acc(float (&acc)[N / 2], const u32 (&a)[4], u32 b) {
  if constexpr (N <= 128) {
    wgmma_rs<N, 1>(acc, a, gmma_desc(b, BOX_Q, 1024), 1);
  } else {
    static_assert(N <= 256, "two GEMMs");
    wgmma_rs<128, 1>(*reinterpret_cast<float(*)[64]>(&acc[0]), a, gmma_desc(b, BOX_Q, 1024), 1);
    wgmma_rs<N - 128, 1>(*reinterpret_cast<float(*)[(N - 128) / 2]>(&acc[64]), a,
                         gmma_desc(b + 2 * BOX_Q, BOX_Q, 1024), 1);
  }
}

#include "sdpa_hopper_dqt.cuh" /* dQ^T: dqt_store_ds, dqt_meet_gemm, dqt_stage, dqt_send */

/* acc = A B^T of one step for this consumer's 64 kv rows (S^T = K Q^T
 * from SMEM_K / SMEM_Q, dP^T = V dO^T from SMEM_V / SMEM_DO: rows and
 * tile as given), issued as one commit group. */
template <int STEPS>
SDPA_DEVICE void issue_rows(float (&acc)[HOP_M / 2], u32 kv_rows, u32 q_rows) {
  wgmma_fence();
  rows_gemm<HOP_M, STEPS>(acc, kv_rows, q_rows);
  wgmma_commit();
}

/* dQ = dS K once both consumers' dS rows are in (the consumers meet on
 * named barrier 1; the query tile split between them: M = 128, 64 rows
 * each; else columns [d_off, d_off + NQ)), one commit group. */
template <int NQ>
SDPA_DEVICE void dq_meet_gemm(float (&dq)[NQ / 2], u32 s_ds, u32 s_k, int q_off, int d_off) {
  if (SDPA_HOPPER_ABLATE < 2) {
    if (DQ_N0 == DQ_N1) /* both consumers in this instantiation */
      named_barrier_sync(1, CONSUMER_THREADS);
    else
      named_barrier_sync_unaligned(1, CONSUMER_THREADS);
    wgmma_fence();
    dq_gemm<NQ>(dq, s_ds, s_k, q_off, d_off);
  }
  wgmma_commit();
}

/* Consumer cw's loop over a tile, NQ its dQ columns; g0 steps of the ring
 * (earlier tiles') before its first, kv_n tiles' K and V before its own
 * (the parity of their barriers). Step st's dQ tile is staged in
 * shared memory at the step's end (dq_stage) and sent (the proxy fence
 * and the bulk issue, dq_send) once step st+1's S^T is in the tensor
 * pipe, so that the fence's wait does not leave the tensor cores idle
 * between steps. Every GEMM retires within its step and no register a
 * GEMM defined is read under a later step's GEMM: ptxas serializes the
 * wgmmas across the loop's back edge otherwise (C7514, C7517). */
template <int NQ>
SDPA_DEVICE void consume(const sdpa_kernel_params &p, const Work &w, u32 base,
                         const unsigned char *smem, int cw, int g0, int kv_n) {
  const int wi = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = 64 * cw + 16 * wi + g; /* kv row of e = 0, 1 */

  float acc_dk[D / 2], acc_dv[DV / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc_dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) acc_dv[i] = 0.f;

  const u32 s_k = base + SMEM_K;
  const bool kv_partial = !SDPA_EVEN && w.k0 + HOP_N > w.skv;
  const float scale_log2 = p.scale_log2;
  const int q_off = DQ_SPLIT_M ? 64 * cw : 0, d_off = sdpa_hopper_dq_col0(HOP_CFG, cw);
  /* dQ^T chunks of this consumer's own (HOP_DQT: NQ / 64, but for consumer
   * 1 under SDPA_HOPPER_DQT_ONE) */
  const int dq_chunks = sdpa_hopper_dq_cols(HOP_CFG, cw) / 64;
  const sdpa_i64 blk_elems = (sdpa_i64)p.heads_q * (D * 16);
  /* this thread's first reduction target: the block of query row q_off +
   * 16 wi of tile 0, head 0, column d_off (the transposed-dQ kernel:
   * block 0, column d_off + 16 wi) */
  float *const dq_first =
      p.dq_accum + (dq_block_base(p, w.b, w.q0) + (HOP_DQT ? 0 : q_off / 16 + wi)) * blk_elems +
      ((d_off + (HOP_DQT ? 16 * wi : 0)) / 8) * 128;

  /* Steps: the group's heads h, each head's query tiles it; stage and its
   * phase follow the ring, ds the dS buffer. */
  int h = w.h_first, it = w.it_first, stage = g0 % HOP_STAGES, ds = g0 & 1;
  u32 phase = (g0 / HOP_STAGES) & 1;
  const u32 s_kr = base + SMEM_K + cw * 64 * 128, s_vr = base + SMEM_V + cw * 64 * 128;
  float dq[HOP_DQT ? 1 : NQ / 2];
  float dqt[HOP_DQT ? NQ / 64 : 1][HOP_M / 2]; /* dQ^T's chunks (sdpa_hopper_dqt.cuh) */
  float *dq_target = nullptr; /* where the staged dQ slice goes (dq_stage) */
  int dq_blocks = 0;          /* and its 16-row blocks (dqt_stage) */
  /* The dQ GEMM once both consumers' dS rows are in (one commit group),
   * its staging and its send: the transposed-dQ kernel's
   * (sdpa_hopper_dqt.cuh) or the others'. */
  auto dq_issue = [&](u32 s_ds) {
    if constexpr (HOP_DQT)
      dqt_meet_gemm<NQ>(dqt, s_ds, s_k, d_off, dq_chunks);
    else
      dq_meet_gemm<NQ>(dq, s_ds, s_k, q_off, d_off);
  };
  auto dq_stage_step = [&](int st, int i0) { /* the GEMM has retired */
    if constexpr (HOP_DQT) {
#pragma unroll
      for (int c = 0; c < NQ / 64; ++c) reg_fence(dqt[c]);
      if (DQ_OUT)
        dq_target = dqt_stage<NQ>(w, base, g0 + st, i0, h, wi, d_off, dqt, dq_first, blk_elems,
                                  dq_blocks, dq_chunks);
    } else {
      reg_fence(dq);
      if (DQ_OUT)
        dq_target = dq_stage<NQ, true>(w, base, g0 + st, i0, h, q_off / 16 + wi, d_off, dq,
                                       dq_first, blk_elems);
    }
  };
  auto dq_send_step = [&](int st) { /* step st's, staged */
    if constexpr (HOP_DQT)
      dqt_send<NQ>(base, g0 + st, wi, d_off, dq_target, dq_blocks, blk_elems, dq_chunks);
    else
      dq_send<NQ, true>(base, g0 + st, q_off / 16 + wi, d_off, dq_target);
    fold_report_step(base, st, dq_target != nullptr);
  };
  if (w.steps > 0) mbar_wait(base + BAR_K, kv_n & 1); /* V: before the first dP^T */
  if (SDPA_HOPPER_TRACE && threadIdx.x == 128) trace_mark(3, trace_clock());
#pragma unroll 1
  for (int st = 0; st < w.steps; ++st) {
    const int i0 = it * HOP_M;
    const u32 s_q = base + SMEM_Q + stage * Q_TILE_BYTES;
    const u32 s_do = base + SMEM_DO + stage * DO_TILE_BYTES;
    const u32 s_ds = base + SMEM_DS + ds * DS_TILE_BYTES;

    /* ---- S^T = K Q^T, the previous step's dQ sent while it runs, then
     * dP^T = V dO^T (this consumer's 64 kv rows). */
    mbar_wait(base + BAR_FULL(stage), phase);
    float s[HOP_M / 2], dp[HOP_M / 2];
    issue_rows<D_STEPS>(s, s_kr, s_q);
    if (DQ_OUT && st > 0) dq_send_step(st - 1);
    if (st == 0) mbar_wait(base + BAR_V, kv_n & 1);
    issue_rows<DV_STEPS>(dp, s_vr, s_do);

    /* ---- P^T, packed as the A operand of dV += P^T dO. */
    wgmma_wait<1>();
    reg_fence(s);
    u32 pf[HOP_M / 16][4], df[HOP_M / 16][4];
    {
      const float *l2s = (const float *)(smem + SMEM_LSE) + stage * HOP_M;
      const float *dls = (const float *)(smem + SMEM_DELTA) + stage * HOP_M;
      exp_probs<HOP_M>(s, l2s, t, scale_log2);
      const bool band = band_crosses(w, it);
      if (band || kv_partial) mask_probs<HOP_M>(s, w, row0, t, i0, band);
      pack_probs<HOP_M>(pf, s);

      /* ---- dS^T = P^T (dP^T - Delta). SDPA_HOPPER_DS_FP32_P 1: from the
       * fp32 P, one rounding (FlashAttention-2's); 0: from the rounded P
       * that dV uses (bf16: the pairs multiplied packed, three roundings;
       * fp16: in fp32, two; dP - Delta may exceed fp16's range where dS
       * does not). P^T's pair for (j, hf) is s[4j + 2hf], s[4j + 2hf + 1]. */
      wgmma_wait<0>();
      reg_fence(dp);
#if SDPA_HOPPER_DS_FP32_P
      ds_frags<HOP_M>(df, s, dp, dls, t);
#else
#pragma unroll
      for (int j = 0; j < HOP_M / 8; ++j) {
        const float2 dl = *(const float2 *)(dls + 8 * j + 2 * t);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float x0 = dp[4 * j + 2 * hf] - dl.x, x1 = dp[4 * j + 2 * hf + 1] - dl.y;
          const u32 pp = pf[j / 2][2 * (j % 2) + hf];
#if SDPA_DTYPE == 2
          df[j / 2][2 * (j % 2) + hf] = mul_bf16x2(pp, pack2<DT>(x0, x1));
#else
          float p0, p1;
          asm("{ .reg .f16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n"
              " cvt.f32.f16 %1, hi; }"
              : "=f"(p0), "=f"(p1)
              : "r"(pp));
          df[j / 2][2 * (j % 2) + hf] = pack2<DT>(p0 * x0, p1 * x1);
#endif
        }
      }
#endif
    }

    /* ---- dV += P^T dO (dO MN-major: k = query rows down the tile). */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HOP_M / 16; ++kk) rs_acc<DV>(acc_dv, pf[kk], s_do + kk * 2048);
    if constexpr (HOP_DQT && SDPA_HOPPER_DQT_DK_EARLY) { /* dK += dS^T Q with it */
#pragma unroll
      for (int kk = 0; kk < HOP_M / 16; ++kk) rs_acc<D>(acc_dk, df[kk], s_q + kk * 2048);
    }
    wgmma_commit();

    /* ---- dS^T to shared memory: rows = kv rows, 64-column boxes of query
     * columns, 128-byte swizzle. stmatrix x4: matrices (rows 0-7, cols
     * 16kk..+7), (rows 8-15, same), (rows 0-7, cols +8), (rows 8-15, +8);
     * lane l addresses row l % 8 of matrix l / 8. */
    if constexpr (HOP_DQT) {
      dqt_store_ds(s_ds, df, cw, wi, lane); /* transposed: [query rows][kv columns] */
    } else {
      const int mq = lane >> 3, mi = lane & 7;
      const int r = 64 * cw + 16 * wi + mi + 8 * (mq & 1);
#pragma unroll
      for (int kk = 0; kk < HOP_M / 16; ++kk) {
        const int c = 2 * kk + (mq >> 1); /* 8-column chunk */
        stmatrix_x4(s_ds + (c / 8) * BOX_DS + r * 128 + (((c % 8) ^ mi) << 4), df[kk]);
      }
    }
    fence_proxy_async();

    /* Once dV and dK are done the stage's Q and dO are free, and its LSE
     * and Delta rows: every consumer thread arrives (an arrival releases
     * only its own thread's reads of them). */
    if constexpr (HOP_DQT && SDPA_HOPPER_DQT_DK_EARLY) { /* dV, dK run under the meeting */
      dq_issue(s_ds);
      wgmma_wait<0>();
      mbar_arrive(base + BAR_EMPTY(stage));
      dq_stage_step(st, i0);
    } else if constexpr (HOP_DQT || SDPA_HOPPER_NARROW_DK_LAST) { /* dQ staged while dK runs */
      dq_issue(s_ds);
#pragma unroll
      for (int kk = 0; kk < HOP_M / 16; ++kk) /* dK += dS^T Q (Q MN-major) */
        rs_acc<D>(acc_dk, df[kk], s_q + kk * 2048);
      wgmma_commit();
      wgmma_wait<1>();
      dq_stage_step(st, i0);
      wgmma_wait<0>();
      mbar_arrive(base + BAR_EMPTY(stage));
    } else {
#pragma unroll
      for (int kk = 0; kk < HOP_M / 16; ++kk) /* dK += dS^T Q (Q MN-major) */
        rs_acc<D>(acc_dk, df[kk], s_q + kk * 2048);
      wgmma_commit();
      dq_issue(s_ds);
      wgmma_wait<1>();
      mbar_arrive(base + BAR_EMPTY(stage));
      wgmma_wait<0>();
      dq_stage_step(st, i0);
    }
    advance_ring(stage, phase, ds);
    advance_step(w, it, h);
  }
  if (SDPA_HOPPER_TRACE && threadIdx.x == 128) trace_mark(4, trace_clock());
  /* every GEMM of the tile has retired: the next tile's K and V may come */
  if (SDPA_HOPPER_PERSIST && w.steps > 0) mbar_arrive(base + BAR_KV_EMPTY);
  if (DQ_OUT && w.steps > 0) dq_send_step(w.steps - 1);
#if HOP_TAIL
  /* a split tile's part: its sums, stored by the last part */
  if (w.part >= 0 && !tail_merge<D, DV>(p, w.slot, base, acc_dk, acc_dv)) {
    if (SDPA_HOPPER_DQ_BULK) bulk_wait_read(); /* the staged dQ outlives the unit's reads */
    return;
  }
#endif
  /* ---- epilogue: dK * scale, dV; rows < kv_valid. */
  finish_consumer<D, DV>(p, w, base, acc_dk, acc_dv, row0, 0, 0);
}

#else
#include "sdpa_hopper_wide.cuh" /* consume_wide */
#endif

/* ------------------------------------------------------------------ main */

/* Tile (bx, by)'s coordinates into w (its rows and steps 0 where it has
 * none, or where its THD sequence's bounds are bad: `report` flags them
 * then, from one tile of the sequence). */
SDPA_DEVICE void make_work(const sdpa_kernel_params &p, unsigned bx, unsigned by, unsigned grid_x,
                           bool reporter, Work &w) {
  int j, hv;
  w.part = -1;
#if HOP_TAIL
  if (p.tail_parts > 1) { /* one-dimensional: the tile's place in the x-major order */
    sdpa_i64 tile;
    w.part = tail_tile(p, bx, tile);
    w.slot = (int)(tile - p.tail_first);
    grid_x = (unsigned)sdpa_hopper_grid_x(HOP_CFG, p.seqlen_kv, p.batch);
    by = (unsigned)(tile / grid_x);
    bx = (unsigned)(tile - (sdpa_i64)by * grid_x);
  }
#endif
  decode_block(p, bx, by, grid_x, j, w.b, hv);
  const int chunks = head_chunks(p), heads = p.group / chunks; /* query heads a block */
  w.hk = hv / chunks;
  w.kv_valid = w.steps = 0;
  if (SDPA_FOLD_DQ) w.k0 = -1; /* bad bounds: no sequence's tile 0 (fold_zero_unseen) */
  w.h_first = w.hk * p.group + (hv % chunks) * heads;
  if (!sequence_bounds(p, w.b, w.q0, w.kv0, w.sq, w.skv, reporter && j == 0 && w.hk == 0))
    return;
  w.k0 = j * HOP_N;
  if (w.k0 >= w.skv) {
    if (SDPA_FOLD_DQ) w.band = make_band(p, w.sq, w.skv);
    return;
  }
  w.kv_valid = min(HOP_N, w.skv - w.k0);
  w.band = make_band(p, w.sq, w.skv);
  {
    int lo = 0, hi = w.sq - 1;
    if (w.band.right >= 0) lo = max(lo, w.k0 - w.band.off - w.band.right);
    if (w.band.left >= 0) hi = min(hi, w.k0 + w.kv_valid - 1 - w.band.off + w.band.left);
    w.it_lo = lo / HOP_M;
    w.it_hi = lo <= hi ? hi / HOP_M : w.it_lo - 1;
  }
#if HOP_TAIL
  if (w.part >= 0 && w.it_hi >= w.it_lo) tail_share(p, w);
#endif
  w.steps = w.it_hi >= w.it_lo ? (w.it_hi - w.it_lo + 1) * heads : 0;
  /* SDPA_HOPPER_STAGGER (not deterministic plans, whose adds go in
   * kv-tile order): kv tile j starts at query tile it_lo + j * STAGGER
   * (mod the range), so that the kv tiles of a head, running side by
   * side, add to different dQ rows at a time */
  w.it_first = w.it_lo;
  if (SDPA_HOPPER_STAGGER && !SDPA_DETERMINISTIC && w.it_hi > w.it_lo)
    w.it_first += (int)((sdpa_i64)j * SDPA_HOPPER_STAGGER % (w.it_hi - w.it_lo + 1));
  /* deterministic: the order of the adds into a query tile (dq_rank).
   * Descending under a right-bounded mask (the launch runs the kv tiles
   * lightest first, decode_block). The rotation without a mask may make a
   * block wait for a later block of its kv head; only where all of them
   * fit the GPU at once (the grid's kv tiles a sequence, one block an SM),
   * so that the earlier ones cannot hold every SM while they wait (launch
   * in index order, as the index order assumes). */
  w.rotate = w.rot_q = w.rot_r = w.rot_jm = w.rot_jd = 0;
#if HOP_ROTATE
  if ((p.seqlen_kv + HOP_N - 1) / HOP_N <= p.sm_count && w.it_hi >= w.it_lo) {
    const int T = w.it_hi - w.it_lo + 1, K = (w.skv + HOP_N - 1) / HOP_N;
    w.rotate = 1;
    w.rot_q = K / T;
    w.rot_r = K % T;
    w.rot_jm = j % T;
    w.rot_jd = j / T;
    w.it_first = w.it_lo + (T - w.rot_jm) % T;
  }
#endif
}

SDPA_DEVICE void init_barriers(u32 base) {
#pragma unroll
  for (int s = 0; s < HOP_STAGES; ++s) {
    mbar_init(base + BAR_FULL(s), FULL_ARRIVALS);
    mbar_init(base + BAR_EMPTY(s), CONSUMER_THREADS);
  }
  mbar_init(base + BAR_K, 1);
  mbar_init(base + BAR_V, 1);
  for (int b = 0; b < 2; ++b) {
    mbar_init(base + BAR_DQ_FULL(b), SDPA_FOLD_DQ ? 1 : CONSUMER_THREADS); /* fold: BAR_FOLD */
    mbar_init(base + BAR_DQ_EMPTY(b), 1);
    mbar_init(base + BAR_HALVES(b), CONSUMER_THREADS);
    mbar_init(base + BAR_WORK_FULL(b), 1);
    /* do_full (work_full[0]) takes the TMA thread's one arrival as well */
    mbar_init(base + BAR_WORK_EMPTY(b),
              HOP_SPLIT_DO && b == 0 ? CONSUMER_THREADS /* do_empty */ : WORK_ARRIVALS);
  }
  mbar_init(base + BAR_KV_EMPTY, CONSUMER_THREADS);
  mbar_init_fence();
}

/* A consumer warpgroup's tile: the narrow kernel's consume (NQ dQ
 * columns of consumer wg - 1) or the wide kernel's. */
SDPA_DEVICE void consume_tile(const sdpa_kernel_params &p, const Work &w, u32 base,
                              const unsigned char *smem, int wg, int g0, int kv_n) {
#if HOP_WIDE
  (void)g0, (void)kv_n;
  if (wg == 1)
    consume_wide<0>(p, w, base, smem);
  else
    consume_wide<1>(p, w, base, smem);
#else
  /* uneven dQ splits: each instantiation is one consumer's, its index a
   * constant (but SDPA_HOPPER_DQT_ONE) */
  if (DQ_N0 == DQ_N1 || (HOP_DQT && SDPA_HOPPER_DQT_ONE))
    consume<DQ_N0>(p, w, base, smem, wg - 1, g0, kv_n);
  else if (wg == 1)
    consume<DQ_N0>(p, w, base, smem, 0, g0, kv_n);
  else
    consume<DQ_N1>(p, w, base, smem, 1, g0, kv_n);
#endif
}

#if SDPA_HOPPER_PERSIST
/* Tile n's coordinates (slot n % 2, SMEM_WORK_SLOT). */
SDPA_DEVICE Work &work_slot(unsigned char *smem, int n) {
  return *(Work *)(smem + SMEM_WORK_SLOT(n));
}
SDPA_DEVICE const Work &work_slot(const unsigned char *smem, int n) {
  return *(const Work *)(smem + SMEM_WORK_SLOT(n));
}

/* Runs role(w) over the block's tiles n = 0, 1, ... (each once its
 * coordinates are in slot n % 2, work_full), until the end mark; then
 * arrives on work_empty (role reads what it needs of w before it returns:
 * the slot is rewritten after). */
template <class Role>
SDPA_DEVICE void each_tile(u32 base, const unsigned char *smem, Role &&role) {
#pragma unroll 1
  for (int n = 0;; ++n) {
    mbar_wait(base + BAR_WORK_FULL(n), (n >> 1) & 1);
    const Work &w = work_slot(smem, n);
    if (w.kv_valid < 0) return;
    role(w);
    mbar_arrive(base + BAR_WORK_EMPTY(n));
  }
}

/* The persistent block's roles over its tiles n = 0, 1, ... Warp 3's
 * lane 0 of the producer warpgroup writes tile n's coordinates in slot
 * n % 2 (once every role is done with tile n - 2's) and arrives on
 * work_full, and after the last tile an end mark (kv_valid -1); each role
 * waits for it, runs the tile, and arrives on work_empty (each_tile).
 * The ring (stages, the dS buffers, the dQ staging) runs on across
 * tiles; the producer loads a tile's K and V once the consumers are done
 * with the last tile's (kv_empty), while they store its dK and dV. The
 * producer warpgroup's roles and the consumers' are apart so that each
 * runs within its setmaxnreg budget. */
SDPA_DEVICE void persistent_producer(const sdpa_kernel_params &p, const sdpa_tensor_maps &maps,
                                     u32 base, unsigned char *smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp == 3) {
    if (lane != 0) return;
    /* tile (bx, by) of the x-major order over grid_x x heads_kv (times
     * the head chunks): the block's index, then every gridDim.x-th (a
     * grid of one row; a grid of the kernel's tiles, x by heads_kv, gives
     * each block one) */
    const unsigned grid_x = (unsigned)sdpa_hopper_grid_x(HOP_CFG, p.seqlen_kv, p.batch);
    const unsigned stride = gridDim.y > 1 ? 0u : gridDim.x;
    unsigned bx = blockIdx.x, by = blockIdx.y;
    while (bx >= grid_x) bx -= grid_x, ++by;
#pragma unroll 1
    for (int n = 0;; ++n) {
      if (n >= 2) mbar_wait(base + BAR_WORK_EMPTY(n), ((n - 2) >> 1) & 1);
      Work &w = work_slot(smem, n); /* built in place */
      if (by >= (unsigned)(p.heads_kv * head_chunks(p)) || (n > 0 && stride == 0)) {
        w.kv_valid = -1; /* the end */
        mbar_arrive(base + BAR_WORK_FULL(n));
        return;
      }
      make_work(p, bx, by, grid_x, true, w);
      mbar_arrive(base + BAR_WORK_FULL(n));
      for (bx += stride; bx >= grid_x;) bx -= grid_x, ++by;
    }
  }
  int g = 0, kv_n = 0; /* ring steps and K / V loads of the earlier tiles */
  if (warp == 0) {
    if (lane != 0) return;
    prefetch_maps(maps);
    each_tile(base, smem, [&](const Work &w) {
      if (w.steps > 0) {
        if (kv_n > 0) mbar_wait(base + BAR_KV_EMPTY, (kv_n - 1) & 1);
        produce_tiles(maps, w, base, g);
        g += w.steps;
        ++kv_n;
      }
    });
    return;
  }
  each_tile(base, smem, [&](const Work &w) { /* warps 1, 2 */
    produce_rows(p, w, base, smem, g);
    g += w.steps;
  });
}

/* Consumer cw's tiles (NQ its dQ columns: one instantiation in the loop,
 * so that the uneven dQ splits' two do not share its registers). */
template <int NQ>
SDPA_DEVICE void persistent_consumer(const sdpa_kernel_params &p, u32 base,
                                     const unsigned char *smem, int cw) {
  int g = 0, kv_n = 0;
  each_tile(base, smem, [&](const Work &w) {
    if (w.kv_valid > 0) consume<NQ>(p, w, base, smem, cw, g, kv_n);
    if (w.steps > 0) {
      g += w.steps;
      ++kv_n;
    }
  });
}
#endif

extern "C" __global__ void __launch_bounds__(HOP_THREADS, 1)
sdpa_bwd_main(const __grid_constant__ sdpa_kernel_params p,
              const __grid_constant__ sdpa_tensor_maps maps) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 raw = smem_u32(smem_raw);
  const u32 base = (raw + 1023) & ~1023u;
  unsigned char *smem = smem_raw + (base - raw);

  if (SDPA_HOPPER_TRACE && threadIdx.x == 0) {
    trace_mark(0, trace_globaltimer());
    trace_mark(1, (unsigned long long)trace_smid() << 32);
    trace_mark(2, trace_clock());
  }
#if SDPA_HOPPER_PERSIST
  if (threadIdx.x == 0) init_barriers(base);
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
  if (wg == 0) {
    setmaxnreg_dec<SDPA_HOPPER_PRODUCER_REGS>();
    persistent_producer(p, maps, base, smem);
  } else {
    setmaxnreg_inc<SDPA_HOPPER_CONSUMER_REGS>();
    if (DQ_N0 == DQ_N1 || wg == 1)
      persistent_consumer<DQ_N0>(p, base, smem, wg - 1);
    else
      persistent_consumer<DQ_N1>(p, base, smem, wg - 1);
  }
#else
  Work w;
  make_work(p, blockIdx.x, blockIdx.y, gridDim.x, threadIdx.x == 0, w);
  if (w.kv_valid == 0) {
#if SDPA_FOLD_DQ
    if (w.k0 == 0) fold_zero_unseen(p, w); /* a sequence without keys */
#endif
    return;
  }
  if (SDPA_HOPPER_TRACE && threadIdx.x == 0)
    trace_mark(1, (unsigned long long)trace_smid() << 32 | (unsigned)(w.steps + 1));

  if (threadIdx.x == 0) {
    *(Work *)(smem + SMEM_WORK) = w;
    init_barriers(base);
  }
#if SDPA_FOLD_DQ
  if (threadIdx.x < FOLD_WARPS) /* no step's adds complete yet */
    ((int *)(smem + SMEM_FOLD_PROGRESS))[threadIdx.x] = 0;
  if (w.k0 == 0) fold_zero_unseen(p, w);
#endif
  __syncthreads();

  /* the warpgroup, broadcast from lane 0 so that the compiler treats it
   * (and the shared-memory descriptors derived from it) as warp-uniform */
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
  if (wg == 0) {
    setmaxnreg_dec<SDPA_HOPPER_PRODUCER_REGS>();
    const int warp = threadIdx.x >> 5;
    if (warp == 0) {
      if ((threadIdx.x & 31) == 0 && w.steps > 0) {
        prefetch_maps(maps);
        produce_tiles(maps, w, base, 0);
        if (SDPA_HOPPER_TRACE) trace_mark(7, trace_clock());
      }
    } else if (warp == 1 || (warp == 2 && ROW_THREADS == 64)) {
      produce_rows(p, *(const Work *)(smem + SMEM_WORK), base, smem, 0);
    } else if (SDPA_DETERMINISTIC &&
               (DQ_WRITER_WARPS ? (threadIdx.x & 31) == 0 : (threadIdx.x & 31) < DQ_WRITERS)) {
      /* writer k: lane 0 of warp 3 - k, or lane k of warp 3 */
      write_dq(p, *(const Work *)(smem + SMEM_WORK), base,
               DQ_WRITER_WARPS ? 3 - warp : threadIdx.x & 31);
    }
#if SDPA_FOLD_DQ
    else if (warp == 3) {
      fold_dq(p, base, smem);
    }
#endif
  } else {
    setmaxnreg_inc<SDPA_HOPPER_CONSUMER_REGS>();
    /* the block's coordinates from shared memory, read where used */
    consume_tile(p, *(const Work *)(smem + SMEM_WORK), base, smem, wg, 0, 0);
  }
#endif
}
