/*
 * sdpa_hopper_tail.cuh - the last wave's split tiles in the sm_90a narrow
 * kernel (sdpa_hopper_traits.h: sdpa_hopper_tail_parts, which tiles and
 * why; p.tail_*: sdpa_params.h). A split tile runs as p.tail_parts blocks,
 * each over its share of the tile's query tiles; each adds its dK / dV
 * (fp32, before the scale) to the tile's slot, and the last to finish
 * reads the sum back and stores it as a whole tile's block would.
 * Included by sdpa_hopper.cuh (after Work) where HOP_TAIL.
 */

/* The tile (in the two-dimensional grid's order, x fastest) and part of
 * block bx of the one-dimensional grid: part -1 for a whole tile. */
SDPA_DEVICE int tail_tile(const sdpa_kernel_params &p, unsigned bx, sdpa_i64 &tile) {
  tile = bx;
  if (tile < p.tail_first) return -1;
  const sdpa_i64 u = tile - p.tail_first, slot = u / p.tail_parts;
  tile = p.tail_first + slot;
  return (int)(u - slot * p.tail_parts);
}

/* Part w.part's share of the query tiles [it_lo, it_hi]: the parts take
 * consecutive runs, of equal length within one (it_hi < it_lo when a
 * part has none). */
SDPA_DEVICE void tail_share(const sdpa_kernel_params &p, Work &w) {
  const int n = w.it_hi - w.it_lo + 1;
  const int a = (int)((sdpa_i64)n * w.part / p.tail_parts);
  const int z = (int)((sdpa_i64)n * (w.part + 1) / p.tail_parts);
  w.it_hi = w.it_lo + z - 1;
  w.it_lo += a;
}

/* A consumer thread's dK / dV fragments (NK / 2 then NV / 2 floats, as
 * float4 pieces k) added to split tile `slot`'s sums at piece k of
 * consumer thread t: tail_acc[slot][k][t] (a warp's 32 float4 of piece k
 * contiguous, as red_frag adds them). Then, once both consumers'
 * adds are in, one thread counts the part done; the last part's threads
 * read the sums back into dk / dv and return true (the caller stores
 * them); the others return false. The count's acquire-release (and the
 * fences around it) order the parts' adds before the last part's reads. */
template <int NK, int NV>
SDPA_DEVICE bool tail_merge(const sdpa_kernel_params &p, int slot, u32 base,
                            float (&dk)[NK / 2], float (&dv)[NV / 2]) {
  static_assert(NK % 8 == 0 && NV % 8 == 0, "float4 pieces of each");
  constexpr int PIECES = (NK + NV) / 8;
  const int t = (int)threadIdx.x - 128, lane = t & 31; /* consumer thread */
  float *const warp_at =
      p.tail_acc + (sdpa_i64)slot * sdpa_hopper_tail_slot_floats(D, DV) + 4 * (t - lane);
  float *const at = warp_at + 4 * lane;
#pragma unroll
  for (int k = 0; k < PIECES; ++k) {
    float *const x = k < NK / 8 ? &dk[4 * k] : &dv[4 * (k - NK / 8)];
    red_frag(warp_at + k * 4 * CONSUMER_THREADS, lane, *reinterpret_cast<const float(*)[4]>(x));
  }
  fence_acq_rel_gpu();
  named_barrier_sync_unaligned(1, CONSUMER_THREADS);
  /* the second Work slot (one tile a block: unused) holds the verdict */
  const u32 flag = base + SMEM_WORK + SDPA_HOPPER_WORK_BYTES;
  if (t == 0) {
    const int before = atom_add_acq_rel_gpu(p.tail_count + slot);
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(flag), "r"(before == p.tail_parts - 1 ? 1 : 0)
                 : "memory");
  }
  named_barrier_sync_unaligned(1, CONSUMER_THREADS);
  int last;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(last) : "r"(flag) : "memory");
  if (!last) return false;
  fence_acq_rel_gpu();
#pragma unroll
  for (int k = 0; k < PIECES; ++k) {
    float *const x = k < NK / 8 ? &dk[4 * k] : &dv[4 * (k - NK / 8)];
    asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                 : "l"(at + k * 4 * CONSUMER_THREADS)
                 : "memory");
  }
  return true;
}
