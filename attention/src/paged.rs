//! Decode attention over a paged KV cache (one new query token per sequence), split-KV
//! (flash-decoding) with a merge pass, and `reshape_and_cache`, which writes new keys and
//! values into their cache slots.
//!
//! # Layout
//! - `q`, `out [batch, heads, D]`; `lse [batch, heads]` (f32, natural log).
//! - `k_cache`, `v_cache [num_blocks, block_size, kv_heads, D]`: token `t` of sequence `b`
//!   lives in block `block_tables[b * max_blocks + t / block_size]`, row `t % block_size`.
//! - `context_lens [batch]`: tokens of each sequence in the cache (the new one included).
//! - `slot_mapping [tokens]` for [`reshape_and_cache`](fn@reshape_and_cache): `block * block_size + row`, or
//!   negative to skip the token (padding).
//!
//! # Work decomposition
//! [`paged_decode`](fn@paged_decode) runs one work-group per (key split, KV head, value chunk, sequence).
//! The `heads / kv_heads` query heads that share a KV head are the rows of the work-group's
//! 16-row fragments (one wave per 16 heads), so each KV block is read once for all of them:
//! the same online-softmax tile step as [`flash_fwd`](fn@crate::flash::flash_fwd), over
//! tiles of [`decode_bn`] keys gathered through the block table into shared memory in
//! 16-byte copies (`cp.async` into [`decode_stages`] stages on NVIDIA sm_80+; one slot read per key row
//! for both its key and value chunks). The cache slots of a tile's keys are looked up one
//! tile ahead (one table read per key, by the first [`decode_bn`] work-items) and kept in
//! shared memory, so the copies issue without waiting on the table. Each split of `split_len`
//! keys writes its unnormalised f32 output and its (max, sum) to a workspace;
//! [`paged_merge`](fn@paged_merge) combines a sequence's splits (only the ones its context reaches) into
//! the output and the log-sum-exp. Shared memory: [`decode_smem_elems`].
//!
//! When the grid is too small to fill the GPU (a few sequences, short contexts), each
//! work-group may run several key waves per 16 query rows that take turns through the
//! split's tiles and combine their states in shared memory at the end; with a single split
//! the work-group then writes the output and the log-sum-exp itself and the merge pass is
//! skipped (see `paged_decode`'s docs and `host::decode_plan`).
// The head-dimension types name the device instances (the host launcher finds them by name).
#[allow(unused_imports)]
use crate::flash::{Hd128, Hd256, Hd64, Hd80, Hd96};
use crate::flash::{copy_rows, stage_elems, value_chunk, value_chunks, HeadDim, RowState, Score, BN, PAD};
use kernel_dsl::each;
use kernel_dsl::mma::{self, copy, Lowering, MmaFloat, SharedAddr};
use kernel_dsl::prelude::*;

/// Most query heads per KV head (four waves of 16 rows).
pub const MAX_GROUP: usize = 64;

/// Keys per K/V tile of [`paged_decode`](fn@paged_decode): 16 on `MmaSync`, [`BN`] (32)
/// elsewhere. Decode is bound by how many waves an SM keeps busy (each wave's tile step is
/// a chain of dependent instructions, and a decode wave has little math to overlap): two
/// 16-key stages halve the shared memory of two 32-key ones, so twice the work-groups fit
/// an SM. AMD keeps 32 (one stage, synchronous copies: there the longer tile amortises
/// the copy wait).
pub const fn decode_bn(low: Lowering) -> usize {
    match low {
        Lowering::MmaSync => 16,
        _ => BN,
    }
}

/// K/V stages of [`paged_decode`](fn@paged_decode): 2 on `MmaSync` (`cp.async` fills the
/// next tile while the wave works on the current one), one elsewhere (synchronous
/// copies). Three stages keep more bytes in flight per work-group but fit 7 work-groups
/// per SM instead of 10; the H200 profile (session s, batch 16, ctx 4096) has warps
/// waiting on their own instruction latencies (2.3 warps per scheduler, 5.3 cycles per
/// issue) far more than on the copies (the wait before a tile's barrier: 6% of the
/// samples), so the warps are worth more than the stage. The loop handles any count.
pub const fn decode_stages(low: Lowering) -> usize {
    match low {
        Lowering::MmaSync => 2,
        _ => 1,
    }
}

/// Shared-memory elements (16-bit) of a [`paged_decode`](fn@paged_decode) work-group of
/// `rows` query rows (16 per row wave) and `key_waves` key waves per row wave: the Q rows,
/// [`decode_stages`] K/V stages of `key_waves` [`decode_bn`]-key tiles and two steps' cache
/// slots (`2 * key_waves * decode_bn` u32 values). With `combine_rows > 0` (the kernel
/// combines its key waves, or writes the output itself) the stages are at least the f32
/// combine buffer of [`decode_combine_elems`] (it reuses them after the last tile).
/// `key_waves = 1, combine_rows = 0` is the one-wave-per-16-rows work-group.
pub const fn decode_smem_elems(d: usize, rows: usize, low: Lowering, key_waves: usize, combine_rows: usize) -> usize {
    let sb = key_waves * decode_bn(low);
    let stages = decode_stages(low) * stage_elems(d, sb, low);
    let combine = decode_combine_elems(d, low, key_waves, combine_rows);
    rows * (d + PAD) + if combine > stages { combine } else { stages } + 4 * sb
}

/// 16-bit elements of the f32 buffer in which the `key_waves` key waves of a
/// [`paged_decode`](fn@paged_decode) work-group combine their states: for each key wave
/// and each of the `rows` real query rows of the group, the unnormalised value-chunk
/// columns and (max, sum). 0 for `rows = 0`.
pub const fn decode_combine_elems(d: usize, low: Lowering, key_waves: usize, rows: usize) -> usize {
    2 * key_waves * rows * (value_chunk(d, low) + 2)
}

/// Decode scores: scaled into the log2 domain, keys past the split masked.
#[derive(Clone, Copy)]
struct DecodeScore {
    /// Keys of this tile inside the split.
    keys: u32,
    /// Keys of a full tile.
    bn: u32,
    /// `scale * log2(e)`.
    scale2: f32,
}

impl Score for DecodeScore {
    #[inline(always)]
    fn plain(&self) -> Option<f32> {
        if mma::lowering() == Lowering::MmaSync && self.keys >= self.bn && self.scale2 > 0.0 {
            Some(self.scale2)
        } else {
            None
        }
    }
    #[inline(always)]
    fn score(&self, _: usize, jt: usize, x: f32) -> f32 {
        if (jt as u32) < self.keys {
            x * self.scale2
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// One split of one sequence's keys for the query heads of one KV head (see the module
/// docs). Grid: x = splits, y = `kv_heads * value_chunks(D)`, z = sequences; `ceil(group /
/// 16)` waves; dynamic shared memory of [`decode_smem_elems`] elements. Sequence `b`'s
/// block-table row starts at `block_tables[table_at + b * max_blocks]` (so one buffer can
/// hold the context lengths and then the tables). Writes, for
/// every query head `h` of the group and split `s` its context reaches,
/// `part_o[((b * heads + h) * splits + s) * D ..]` (unnormalised) and
/// `part_ml[((b * heads + h) * splits + s) * 2 ..]` = (max in log2 units, sum).
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd80, Hd96, Hd128, Hd256], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    block_tables: &[u32],
    context_lens: &[u32],
    part_o: &mut [f32],
    part_ml: &mut [f32],
    heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    split_len: u32,
    table_at: u32,
    scale: f32,
    smem: SharedDyn<T>,
) {
    decode::<T, H, false, false>(
        (q, k_cache, v_cache, block_tables, context_lens),
        (part_o, part_ml, &mut [], &mut [], &[]),
        (heads, kv_heads, block_size, max_blocks, split_len, table_at, 1, MODE_PARTS),
        scale,
        smem,
    )
}

/// [`paged_decode`](fn@paged_decode) with key waves and direct writes, a separate instance so that
/// the one-wave kernel keeps its registers (the key-wave bookkeeping and the combine cost
/// about 40 more per work-item on sm_90a, which would cut the resident work-groups of large
/// grids). Grid as [`paged_decode`](fn@paged_decode); `ceil(group / 16) * key_waves` waves;
/// dynamic shared memory of [`decode_smem_elems`] elements (with the group's rows as
/// `combine_rows` when `key_waves > 1` or `mode` is not [`MODE_PARTS`]).
///
/// `mode`: [`MODE_PARTS`] (workspace, for the merge launch) or [`MODE_DIRECT`];
/// [`MODE_FUSED`] is [`paged_decode_fused`](fn@paged_decode_fused)'s.
///
/// Key waves: with `key_waves = w > 1` the work-group walks its split in steps of `w`
/// tiles (one gather of `w * decode_bn` keys per step, by all work-items), wave `i` of
/// each row wave adding tile `i` of the step to its own online-softmax state; at the end
/// the waves combine their (max, sum, unnormalised output) in shared memory. With
/// [`MODE_DIRECT`] (one split: the work-group sees its sequence's whole context) it writes
/// the normalised `out[(b * heads + h) * D ..]` and `lse[b * heads + h]` itself (zeros and
/// `-inf` for an empty context) and the workspace is not touched: no merge pass.
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd80, Hd96, Hd128, Hd256], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_waves<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    block_tables: &[u32],
    context_lens: &[u32],
    part_o: &mut [f32],
    part_ml: &mut [f32],
    out: &mut [T],
    lse: &mut [f32],
    heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    split_len: u32,
    table_at: u32,
    key_waves: u32,
    mode: u32,
    scale: f32,
    smem: SharedDyn<T>,
) {
    decode::<T, H, true, false>(
        (q, k_cache, v_cache, block_tables, context_lens),
        (part_o, part_ml, out, lse, &[]),
        (heads, kv_heads, block_size, max_blocks, split_len, table_at, key_waves, mode),
        scale,
        smem,
    )
}

/// [`paged_decode_waves`](fn@paged_decode_waves) in [`MODE_FUSED`]: the splits merge in
/// this launch through `counters` (`batch * kv_heads`, zero before the launch and left at
/// zero; see `fused_merge`). Its own instance, for hd64 and hd128 (the engine's models),
/// so that the merge's registers stay out of the other kernels (on gfx90a they cost
/// `paged_decode_waves` two SGPR spills at hd80 and hd96). Grid, waves and shared memory
/// as [`paged_decode_waves`](fn@paged_decode_waves) with `combine_rows` = the group's rows.
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd128], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_fused<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    block_tables: &[u32],
    context_lens: &[u32],
    part_o: &mut [f32],
    part_ml: &mut [f32],
    out: &mut [T],
    lse: &mut [f32],
    counters: &[AtomicU32],
    heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    split_len: u32,
    table_at: u32,
    key_waves: u32,
    scale: f32,
    smem: SharedDyn<T>,
) {
    decode::<T, H, true, true>(
        (q, k_cache, v_cache, block_tables, context_lens),
        (part_o, part_ml, out, lse, counters),
        (heads, kv_heads, block_size, max_blocks, split_len, table_at, key_waves, MODE_FUSED),
        scale,
        smem,
    )
}

/// The body of the decode kernels; `WAVES = false` fixes one key wave and the workspace
/// output (the code of the one-wave kernel); `FUSED` the in-launch merge (`mode` is
/// [`MODE_FUSED`]; without it that mode is refused).
#[inline(always)]
#[allow(clippy::type_complexity)]
fn decode<T: MmaFloat, H: HeadDim, const WAVES: bool, const FUSED: bool>(
    (q, k_cache, v_cache, block_tables, context_lens): (&[T], &[T], &[T], &[u32], &[u32]),
    (part_o, part_ml, out, lse, counters): (&mut [f32], &mut [f32], &mut [T], &mut [f32], &[AtomicU32]),
    (heads, kv_heads, block_size, max_blocks, split_len, table_at, key_waves, mode): (u32, u32, u32, u32, u32, u32, u32, u32),
    scale: f32,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let bn = decode_bn(low);
    let d = H::D;
    let dv = value_chunk(d, low);
    let (ldq, ldk, ldv) = (d + PAD, d + PAD, dv + PAD);
    let kw = if WAVES { key_waves as usize } else { 1 };
    let waves = flat_block_dim() as usize / wave::size() as usize;
    if kw == 0 || !waves.is_multiple_of(kw) {
        panic!("paged_decode: the work-group is not whole key waves");
    }
    // Row waves (16 query rows each), keys per step (one tile per key wave).
    let row_waves = waves / kw;
    let rows = row_waves * 16;
    let sb = kw * bn;
    let direct = WAVES && !FUSED && mode == MODE_DIRECT;
    // The splits merge in this launch: the last to finish (per sequence and KV head)
    // combines them all.
    let fused = WAVES && FUSED;
    if WAVES && (mode > MODE_FUSED || (mode == MODE_FUSED) != FUSED) {
        panic!("paged_decode: unknown output mode");
    }
    // Whether the key waves combine in shared memory (several, or the output written here).
    let combine = kw > 1 || direct || fused;
    let chunks = value_chunks(d, low);
    let (hk, vc) = (block_idx_y() as usize / chunks, block_idx_y() as usize % chunks);
    let nof = dv / 16;
    let (b, split) = (block_idx_z() as usize, block_idx_x() as usize);
    let (heads_n, kv_n) = (heads as usize, kv_heads as usize);
    let group = heads_n / kv_n;
    if smem.len() < decode_smem_elems(d, rows, low, kw, if combine { group } else { 0 }) {
        panic!("paged_decode: shared memory too small");
    }
    let splits = grid_dim_x() as usize;
    let k_lo = split * split_len as usize;
    let bs = block_size as usize;
    let mb = max_blocks as usize;
    let table = table_at as usize + b * mb;
    let h0 = hk * group;
    let row_elems = kv_n * d;
    // Uniform checks: the sequence's length and block-table row, the group's query rows
    // and workspace rows lie in their buffers (the cache rows are checked below).
    let part_end = ((b * heads_n + h0 + group) * splits) * d;
    let rows_end = b * heads_n + h0 + group;
    if b >= context_lens.len()
        || table + mb > block_tables.len()
        || rows_end * d > q.len()
        || (!direct && (part_end > part_o.len() || part_end / d * 2 > part_ml.len()))
        || ((direct || fused) && (rows_end * d > out.len() || rows_end > lse.len()))
        || (direct && splits != 1)
        || (fused && b * kv_n + hk >= counters.len())
        || k_cache.len() != v_cache.len()
    {
        panic!("paged_decode: a buffer is shorter than the shape needs");
    }
    let num_blocks = k_cache.len() / row_elems / bs;
    if num_blocks * bs > u32::MAX as usize - 1 || row_elems * core::mem::size_of::<T>() > u32::MAX as usize {
        panic!("paged_decode: the caches have more than 2^32 - 2 slots or rows of 4 GiB");
    }
    let (qp, kp, vp, tp) = (q.as_ptr(), k_cache.as_ptr(), v_cache.as_ptr(), block_tables.as_ptr());
    let tid = flat_thread_idx() as usize;
    let nthreads = flat_block_dim() as usize;
    let wave = tid / wave::size() as usize;
    // This wave's key wave and row wave.
    let (kwi, rw) = if WAVES { (wave / row_waves, wave % row_waves) } else { (0, wave) };
    let sp = smem.as_ptr();
    let q_lds = sp;
    let st_elems = stage_elems(d, sb, low);
    let nst = decode_stages(low);
    let size = core::mem::size_of::<T>();
    let kv_sa = SharedAddr::new(sp.wrapping_add(rows * ldq));
    let kv_lds = sp.wrapping_add(rows * ldq);
    // Two steps' cache slots (u32, 4-byte aligned: the element count before them is even).
    let slots = sp.wrapping_add(decode_smem_elems(d, rows, low, kw, if combine { group } else { 0 }) - 4 * sb) as *mut u32;

    // The group's query rows, zero past the group (the first copy group, with tile 0),
    // issued before the sequence's length is known: they do not depend on it.
    // SAFETY: the group's rows lie in q (checked above), 16-byte aligned; the Q region
    // holds `rows` rows of ldq (length checked above).
    unsafe {
        copy_rows::<T>(SharedAddr::new(q_lds), ldq, rows, d, tid, nthreads, |r| {
            let ok = r < group;
            (if ok { qp.wrapping_add((b * heads_n + h0 + r) * d) } else { qp }, ok)
        })
    };
    // Every block this split reads lies in the caches, so the gathers below index without
    // per-element checks. Each wave reads the split's table entries (those of the whole
    // split length inside the row, one per lane at a time) together with the sequence's
    // length, so the two loads overlap; only the entries the context reaches are checked
    // (the others may hold anything).
    let ctx = context_lens[b] as usize;
    let lanes = wave::size() as usize;
    let blk_end = (k_lo + split_len as usize).div_ceil(bs).min(mb);
    let mut blk = k_lo / bs + tid % lanes;
    let mut outside = false;
    while blk < blk_end {
        // SAFETY: inside the sequence's row (blk < mb; the row lies in block_tables).
        let entry = unsafe { *tp.add(table + blk) } as usize;
        outside |= blk * bs < ctx && entry >= num_blocks;
        blk += lanes;
    }
    if wave::any(outside) {
        panic!("paged_decode: a block table entry is outside the cache");
    }
    if ctx > mb * bs {
        panic!("paged_decode: a context is longer than its block table row");
    }
    if k_lo >= ctx {
        // Past this sequence's context: the merge pass does not read this split (the Q
        // copies land before the work-group ends). Written directly, an empty context
        // gives zero rows and a log-sum-exp of -inf.
        if direct {
            let (op, lp) = (out.as_mut_ptr(), lse.as_mut_ptr());
            let mut e = tid;
            while e < group * dv {
                let (r, c) = (e / dv, e % dv);
                // SAFETY: the group's rows lie in out and lse (checked above).
                unsafe {
                    *op.add((b * heads_n + h0 + r) * d + vc * dv + c) = T::from_f32(0.0);
                    if vc == 0 && c == 0 {
                        *lp.add(b * heads_n + h0 + r) = f32::NEG_INFINITY;
                    }
                }
                e += nthreads;
            }
        }
        copy::commit();
        copy::wait_groups(0);
        if fused {
            // An empty split still counts as arrived (the last one merges, with the splits
            // that hold keys: none for an empty context).
            // SAFETY: the combine buffer is not in use (no tile was read); checked above.
            unsafe { fused_merge::<T>(part_o, part_ml, out, lse, counters, kv_lds as *mut u32, (b, hk, h0, group, heads_n, kv_n, chunks), (d, splits, split_len as usize, ctx), (tid, nthreads)) };
        }
        return;
    }
    let k_hi = if k_lo + (split_len as usize) < ctx { k_lo + split_len as usize } else { ctx };
    // Steps of `sb` keys (one tile per key wave).
    let n_tiles = (k_hi - k_lo).div_ceil(sb);

    // The cache slot of key `key` of the sequence (u32::MAX past the split). Block sizes
    // that are powers of two (the usual 16, 32, 64) take a shift and a mask instead of a
    // division by a run-time value (about 20 instructions).
    let pow2 = bs.is_power_of_two();
    let shift = bs.trailing_zeros();
    let slot_of = |key: usize| -> u32 {
        if key < k_hi {
            let (blk, row) = if pow2 { (key >> shift, key & (bs - 1)) } else { (key / bs, key % bs) };
            // SAFETY: the table entries of this split lie in block_tables and name blocks
            // inside the caches (checked above); slots fit 32 bits (checked above).
            unsafe { *tp.add(table + blk) * block_size + row as u32 }
        } else {
            u32::MAX
        }
    };
    let (k_off, v_off) = (hk * d, hk * d + vc * dv);
    // Issues the copies of step `t`'s keys and values (gathered through the slots in
    // buffer `t % 2`) into stage `t % nst`; zeros past the split. The one-wave copy path
    // takes whole work-groups of one row wave.
    let whole_rows = if row_waves == 1 { kw } else { 0 };
    let issue = |t: usize| {
        let stage = kv_sa.add((t % nst) * st_elems * size);
        // SAFETY: the slots name rows inside the caches (checked above; v_cache has
        // k_cache's length), 16-byte aligned; the stage holds bn rows of ldk then bn
        // rows of ldv; the slots were written before the last barrier.
        unsafe {
            gather::<T>(stage, ldk, stage.add(sb * ldk * size), ldv, (sb, bn, d, dv), (tid, nthreads, whole_rows), slots.wrapping_add((t % 2) * sb), (kp, vp), row_elems, (k_off, v_off))
        };
    };
    // Slots of tiles 0 and 1, then tiles 0 .. nst - 1 in flight, one copy group each;
    // after issuing tile t, the slots of tile t + 2 go to its buffer (for nst > 2: the
    // loop below issues tile nst - 1 first and looks up tile nst).
    if tid < sb {
        let mut s = 0;
        while s < 2 {
            // SAFETY: inside the slot region (2 * sb values).
            unsafe { *slots.add(s * sb + tid) = slot_of(k_lo + s * sb + tid) };
            s += 1;
        }
    }
    barrier();
    let mut t = 0;
    while t + 1 < nst {
        if t < n_tiles {
            issue(t);
        }
        copy::commit();
        if t + 2 < nst {
            let next = if tid < sb { slot_of(k_lo + (t + 2) * sb + tid) } else { u32::MAX };
            barrier();
            if tid < sb {
                // SAFETY: inside the slot region.
                unsafe { *slots.add((t % 2) * sb + tid) = next };
            }
            barrier();
        }
        t += 1;
    }

    let mut st = RowState::new();
    let scale2 = scale * core::f32::consts::LOG2_E;
    let mut t = 0;
    while t < n_tiles {
        // This wave's tile of the step.
        let k0 = k_lo + t * sb + kwi * bn;
        // The slots of step t + nst are looked up now (the load overlaps the wait below)
        // and stored after the barrier, into the buffer step t + nst - 2 used.
        let ahead = if tid < sb { slot_of(k_lo + (t + nst) * sb + tid) } else { u32::MAX };
        if t + nst - 1 < n_tiles {
            issue(t + nst - 1);
        }
        copy::commit();
        copy::wait_groups(nst as u32 - 1);
        barrier();
        if tid < sb {
            // SAFETY: inside the slot region.
            unsafe { *slots.add(((t + nst) % 2) * sb + tid) = ahead };
        }
        // A tile wholly past the split (the last step's, with several key waves) is skipped
        // (wave-uniform).
        if !WAVES || k0 < k_hi {
            let score = DecodeScore { keys: (k_hi - k0) as u32, bn: bn as u32, scale2 };
            let stage = kv_lds.wrapping_add((t % nst) * st_elems);
            let kt_lds = stage.wrapping_add(kwi * bn * ldk);
            let v_lds = stage.wrapping_add(sb * ldk + kwi * bn * ldv);
            let q_w = q_lds.wrapping_add(rw * 16 * ldq);
            // SAFETY: the tiles lie in `smem`, rows 16-byte aligned.
            unsafe {
                if bn == 16 {
                    st.add_tile::<T, 1>(q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score)
                } else {
                    st.add_tile::<T, 2>(q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score)
                }
            };
        }
        // Every wave is done with this stage (and the slots) before they are refilled.
        barrier();
        t += 1;
    }
    copy::commit();
    copy::wait_groups(0);

    let row0 = rw * 16;
    let part = |r: usize| ((b * heads_n + h0 + r) * splits + split) * d;
    let (pop, pmp) = (part_o.as_mut_ptr(), part_ml.as_mut_ptr());
    if combine {
        // SAFETY: the loop above ended on a barrier after the last tile's copies landed,
        // so the stages are free; the combine buffer lies in them (decode_smem_elems).
        unsafe { combine_waves(&st, kv_lds as *mut f32, (kw, kwi, row0, group, nof, dv)) };
        // The key waves' (max, sum, output) of each real row and value column, one
        // work-item per (row, column): rescaled to their common max and summed.
        let (cs, ms) = (kv_lds as *const f32, (kv_lds as *const f32).wrapping_add(kw * group * dv));
        let (op, lp) = (out.as_mut_ptr(), lse.as_mut_ptr());
        let mut e = tid;
        while e < group * dv {
            let (r, c) = (e / dv, e % dv);
            let mut top = f32::NEG_INFINITY;
            let mut k = 0;
            while k < kw {
                // SAFETY: inside the combine buffer.
                top = top.max(unsafe { *ms.add((k * group + r) * 2) });
                k += 1;
            }
            // A wave that saw no key has max -inf: weight 0 (never NaN).
            let mu = if top == f32::NEG_INFINITY { 0.0 } else { top };
            let (mut sum, mut acc) = (0.0f32, 0.0f32);
            let mut k = 0;
            while k < kw {
                // SAFETY: inside the combine buffer.
                let (m, l, o) = unsafe { (*ms.add((k * group + r) * 2), *ms.add((k * group + r) * 2 + 1), *cs.add((k * group + r) * dv + c)) };
                if m != f32::NEG_INFINITY {
                    let w = (m - mu).exp2();
                    sum += l * w;
                    acc += o * w;
                }
                k += 1;
            }
            // SAFETY: the group's rows lie in out and lse (direct) or the workspace (checked above).
            unsafe {
                if direct {
                    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                    *op.add((b * heads_n + h0 + r) * d + vc * dv + c) = T::from_f32(acc * inv);
                    if vc == 0 && c == 0 {
                        *lp.add(b * heads_n + h0 + r) = if sum > 0.0 { (top + sum.log2()) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
                    }
                } else {
                    let at = (b * heads_n + h0 + r) * splits + split;
                    *pop.add(at * d + vc * dv + c) = acc;
                    if vc == 0 && c == 0 {
                        *pmp.add(at * 2) = top;
                        *pmp.add(at * 2 + 1) = sum;
                    }
                }
            }
            e += nthreads;
        }
        if fused {
            // SAFETY: every work-item is past its reads of the combine buffer (its loop
            // above) before `fused_merge`'s first barrier; checked above.
            unsafe { fused_merge::<T>(part_o, part_ml, out, lse, counters, kv_lds as *mut u32, (b, hk, h0, group, heads_n, kv_n, chunks), (d, splits, split_len as usize, ctx), (tid, nthreads)) };
        }
        return;
    }
    // This split's unnormalised rows and (first value chunk) their max and sum.
    each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
        if of < nof {
            st.o[of].for_each(|r, c, x| {
                if row0 + r < group {
                    // SAFETY: the group's workspace rows lie in part_o (checked above).
                    unsafe { *pop.add(part(row0 + r) + vc * dv + of * 16 + c) = x };
                }
            });
        }
    });
    if vc == 0 {
        st.m.for_each(|r, c, x| {
            if c == 0 && row0 + r < group {
                // SAFETY: inside part_ml (checked above).
                unsafe { *pmp.add(part(row0 + r) / d * 2) = x };
            }
        });
        st.l.for_each(|r, c, x| {
            if c == 0 && row0 + r < group {
                // SAFETY: inside part_ml (checked above).
                unsafe { *pmp.add(part(row0 + r) / d * 2 + 1) = x };
            }
        });
    }
}

/// Output mode of [`paged_decode_waves`](fn@paged_decode_waves): each split writes its
/// unnormalised rows and (max, sum) to the workspace for [`paged_merge`](fn@paged_merge).
pub const MODE_PARTS: u32 = 0;
/// Output mode: one split, the work-group writes `out` and `lse` itself.
pub const MODE_DIRECT: u32 = 1;
/// Output mode: each split writes the workspace, then bumps its (sequence, KV head)
/// counter; the last of the grid's work-groups of that pair (splits times value chunks) to
/// arrive merges them into `out` and `lse` and resets the counter to 0 (no merge launch;
/// see `fused_merge`).
pub const MODE_FUSED: u32 = 2;

/// The end of a [`MODE_FUSED`] work-group, after its split's workspace rows (if any) are
/// written by every work-item: each work-item fences (release, device scope), the
/// work-group meets at a barrier, work-item 0 bumps counter `b * kv_heads + hk` and tells
/// the others through `flag` whether it was the last of the `splits * chunks` arrivals
/// (every split and value chunk: the (max, sum) pairs come from chunk 0's work-groups).
/// The last work-group fences (acquire), merges the splits that hold keys (`ceil(ctx /
/// split_len)`: none for an empty context, which gives zero rows and a log-sum-exp of
/// `-inf`) for the group's `group` query heads from `h0`, all `d` columns, like
/// [`paged_merge`](fn@paged_merge), and resets
/// the counter to 0 (so the next launch, or graph replay, starts from zero: launches
/// on one stream are ordered).
///
/// # Safety
/// `flag` is one u32 of shared memory that no work-item uses until the first barrier
/// here; every work-item of the work-group calls this (work-group-uniform); the workspace
/// rows of the group, its `out` and `lse` rows and the counter lie in their buffers.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
unsafe fn fused_merge<T: Float>(
    part_o: &mut [f32],
    part_ml: &mut [f32],
    out: &mut [T],
    lse: &mut [f32],
    counters: &[AtomicU32],
    flag: *mut u32,
    (b, hk, h0, group, heads_n, kv_n, chunks): (usize, usize, usize, usize, usize, usize, usize),
    (d, splits, split_len, ctx): (usize, usize, usize, usize),
    (tid, nthreads): (usize, usize),
) {
    use kernel_dsl::atomic::fence_device;
    // This work-item's workspace stores are visible at device scope before the bump.
    fence_device(Ordering::Release);
    barrier();
    let counter = &counters[b * kv_n + hk];
    if tid == 0 {
        let before = counter.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { *flag = (before + 1 == (splits * chunks) as u32) as u32 };
    }
    barrier();
    // SAFETY: written before the barrier.
    let last = unsafe { *flag } != 0;
    if !last {
        return;
    }
    // Every split's stores (released before its bump) are visible to the loads below.
    fence_device(Ordering::Acquire);
    let n = ctx.div_ceil(split_len).min(splits);
    let (po, pm) = (part_o.as_ptr(), part_ml.as_ptr());
    let (op, lp) = (out.as_mut_ptr(), lse.as_mut_ptr());
    // Two elements (row, column) per work-item and round, `e` and `e + nthreads`, whose
    // loads issue together (hd128 with 4 query heads per KV head: 512 elements over 256
    // work-items in one round trip instead of two).
    let total = group * d;
    let mut e0 = tid;
    while e0 < total {
        // The second element past the end repeats the first (read, not written).
        let es = [e0, if e0 + nthreads < total { e0 + nthreads } else { e0 }];
        let rows = [b * heads_n + h0 + es[0] / d, b * heads_n + h0 + es[1] / d];
        let cols = [es[0] % d, es[1] % d];
        // Running max (log2 units), sum and output over the splits seen, [`MERGE_STEP`]
        // splits at a time so that a step's loads issue together (as `paged_merge`).
        let mut top = [f32::NEG_INFINITY; 2];
        let mut sum = [0.0f32; 2];
        let mut acc = [0.0f32; 2];
        let mut s0 = 0;
        while s0 < n {
            let mut m = [[f32::NEG_INFINITY; MERGE_STEP]; 2];
            let mut l = [[0.0f32; MERGE_STEP]; 2];
            let mut o = [[0.0f32; MERGE_STEP]; 2];
            each!(u in [0, 1] {
                each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    // Past the last split: the last one's values are read (in bounds) and left out.
                    let s = rows[u] * splits + if s0 + i < n { s0 + i } else { n - 1 };
                    // SAFETY: the caller's contract (s < rows[u] * splits + n, inside the workspace).
                    let (ms, ls, os) = unsafe { (*pm.add(s * 2), *pm.add(s * 2 + 1), *po.add(s * d + cols[u])) };
                    if s0 + i < n {
                        (m[u][i], l[u][i], o[u][i]) = (ms, ls, os);
                    }
                });
            });
            each!(u in [0, 1] {
                let mut mx = top[u];
                each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    mx = mx.max(m[u][i]);
                });
                // A split that saw no key has max -inf: weight 0 (never NaN).
                let mu = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
                let alpha = (top[u] - mu).exp2();
                sum[u] *= alpha;
                acc[u] *= alpha;
                each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if m[u][i] != f32::NEG_INFINITY {
                        let w = (m[u][i] - mu).exp2();
                        sum[u] += l[u][i] * w;
                        acc[u] += o[u][i] * w;
                    }
                });
                top[u] = mx;
            });
            s0 += MERGE_STEP;
        }
        each!(u in [0, 1] {
            if u == 0 || es[1] != es[0] {
                let inv = if sum[u] > 0.0 { 1.0 / sum[u] } else { 0.0 };
                // SAFETY: the caller's contract.
                unsafe {
                    *op.add(rows[u] * d + cols[u]) = T::from_f32(acc[u] * inv);
                    if cols[u] == 0 {
                        *lp.add(rows[u]) = if sum[u] > 0.0 { (top[u] + sum[u].log2()) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
                    }
                }
            }
        });
        e0 += 2 * nthreads;
    }
    if tid == 0 {
        counter.store(0, Ordering::Relaxed);
    }
}

/// Stores key wave `kwi`'s state of its 16 rows from `row0` (the real ones: below `group`)
/// in the combine buffer at `buf` (f32: `kw * group` rows of `dv` output columns, then `kw *
/// group` (max, sum) pairs), then waits for every wave (a work-group barrier).
///
/// # Safety
/// `buf` holds [`decode_combine_elems`] 16-bit elements of shared memory, 4-byte aligned,
/// that no work-item reads or writes until the barrier.
#[inline(always)]
unsafe fn combine_waves(st: &RowState, buf: *mut f32, (kw, kwi, row0, group, nof, dv): (usize, usize, usize, usize, usize, usize)) {
    // Closures that capture by value: AMD kept by-reference captures (and the closures'
    // pointers to them) in scratch memory.
    let ms = buf.wrapping_add(kw * group * dv);
    let base = kwi * group + row0;
    each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
        if of < nof {
            st.o[of].for_each(move |r, c, x| {
                if row0 + r < group {
                    // SAFETY: the caller's contract (row < kw * group, column < dv).
                    unsafe { *buf.add((base + r) * dv + of * 16 + c) = x };
                }
            });
        }
    });
    st.m.for_each(move |r, c, x| {
        if c == 0 && row0 + r < group {
            // SAFETY: the caller's contract.
            unsafe { *ms.add((base + r) * 2) = x };
        }
    });
    st.l.for_each(move |r, c, x| {
        if c == 0 && row0 + r < group {
            // SAFETY: the caller's contract.
            unsafe { *ms.add((base + r) * 2 + 1) = x };
        }
    });
    barrier();
}

/// Most rows one work-item copies per tile in [`gather`]'s one-wave path (hd128: 16 keys of
/// 16 chunks over 32 lanes). hd256 (16 rows) takes the loop: its 16-slot array stayed in
/// local memory in the sm_80 PTX.
const MAX_GATHER_ROWS: usize = 8;

/// Issues the 16-byte copies of one tile's `bn` keys (`d` columns, into `k_dst`, row
/// stride `ldk`) and values (`dv` columns, into `v_dst`, stride `ldv`), gathered from the
/// caches through the tile's cache slots (`u32::MAX`: past the split, zero-filled).
/// Work-item `tid` of `nthreads` (`whole_rows > 0`: one row wave of that many key waves, so
/// `nthreads` is `whole_rows = bn / tile` waves, one per `tile` keys, that may take the
/// unrolled path) takes every `nthreads`-th key chunk and the value chunk
/// of the same row and column: one slot read and one row address for both (half the
/// address work of two separate row copies). `cp.async` on NVIDIA sm_80+ (the caller
/// commits and waits), synchronous elsewhere.
///
/// # Safety
/// `slots` holds `bn` readable values in shared memory; every slot other than `u32::MAX`
/// names a row of both caches (`row_elems` elements per slot, under 4 GiB; slot 0 is a
/// row as well when any slot is `u32::MAX`; the key columns at
/// `k_off`, the value columns at `v_off`, 16-byte aligned); `k_dst` and `v_dst` hold `bn`
/// rows of their strides (16-byte aligned) in shared memory; `dv <= d`, both multiples of 8.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gather<T>(
    k_dst: SharedAddr,
    ldk: usize,
    v_dst: SharedAddr,
    ldv: usize,
    (bn, tile, d, dv): (usize, usize, usize, usize),
    (tid, nthreads, whole_rows): (usize, usize, usize),
    slots: *const u32,
    (kp, vp): (*const T, *const T),
    row_elems: usize,
    (k_off, v_off): (usize, usize),
) {
    let (per_row, per_v) = (d / 8, dv / 8);
    let size = core::mem::size_of::<T>();
    let lanes = wave::size() as usize;
    if !cfg!(target_arch = "amdgpu") && whole_rows > 0 && lanes.is_multiple_of(per_row) && (tile * per_row).is_multiple_of(lanes) && tile * per_row / lanes <= MAX_GATHER_ROWS {
        // One wave, whole rows per round (NVIDIA and the CPU executor at up to 16 query
        // heads per KV head, hd64 and hd128; AMD keeps the loop below, whose
        // register use its budgets were checked with): work-item `tid` copies column chunk
        // `c` of rows `j0 + i * step`, a loop of constant trip count. The rows' slots are
        // read first (independent shared loads: a slot read between copies would wait on
        // each), each copy is one `cp.async` whose source size is 0 past the split (zero
        // fill, no branch), and the sources are the row offset added to bases computed once.
        // Rounds of a compile-time count (`tile * per_row / lanes`, the slots stay in
        // registers): `nthreads / lanes` waves cover `bn / tile` tiles.
        let (j0, c, step) = (tid / per_row, tid % per_row, whole_rows * (lanes / per_row));
        let n = tile * per_row / lanes;
        let mut slot = [u32::MAX; MAX_GATHER_ROWS];
        let mut i = 0;
        while i < n {
            // SAFETY: the caller's contract (row j0 + i * step < bn).
            slot[i] = unsafe { *slots.add(j0 + i * step) };
            i += 1;
        }
        let kb = kp.wrapping_add(k_off + c * 8) as *const u8;
        let vb = vp.wrapping_add(v_off + c * 8) as *const u8;
        let (kd, vd) = (k_dst.add((j0 * ldk + c * 8) * size), v_dst.add((j0 * ldv + c * 8) * size));
        // Rows under 4 GiB (the caller's contract, checked by `paged_decode`): one 32 x
        // 32-bit multiply per address. Past the split the source is slot 0's row, not read.
        let row_bytes = (row_elems * size) as u32 as u64;
        let mut i = 0;
        while i < n {
            let ok = slot[i] != u32::MAX;
            let at = (if ok { slot[i] } else { 0 }) as u64 * row_bytes;
            let valid = if ok { 16 } else { 0 };
            // SAFETY: the caller's contract (a valid slot names a row of both caches; past
            // the split nothing is read).
            unsafe {
                copy::copy_16_at(kd.add(i * step * ldk * size), kb.wrapping_add(at as usize), valid);
                if c < per_v {
                    copy::copy_16_at(vd.add(i * step * ldv * size), vb.wrapping_add(at as usize), valid);
                }
            }
            i += 1;
        }
        return;
    }
    let mut e = tid;
    while e < bn * per_row {
        let (j, c) = (e / per_row, e % per_row);
        // SAFETY: the caller's contract.
        let s = unsafe { *slots.add(j) };
        let kd = k_dst.add((j * ldk + c * 8) * size);
        let vd = v_dst.add((j * ldv + c * 8) * size);
        if s != u32::MAX {
            let row = s as usize * row_elems + c * 8;
            // SAFETY: the caller's contract.
            unsafe {
                copy::copy_16_whole_at(kd, kp.wrapping_add(row + k_off) as *const u8);
                if c < per_v {
                    copy::copy_16_whole_at(vd, vp.wrapping_add(row + v_off) as *const u8);
                }
            }
        } else {
            // SAFETY: the caller's contract (nothing is read).
            unsafe {
                copy::copy_16_at(kd, kp as *const u8, 0);
                if c < per_v {
                    copy::copy_16_at(vd, vp as *const u8, 0);
                }
            }
        }
        e += nthreads;
    }
}

/// Splits the fused merge of [`paged_decode_fused`](fn@paged_decode_fused) combines per
/// step: their loads issue together, so a sequence's splits cost `ceil(splits /
/// MERGE_STEP)` memory round trips rather than one each.
pub const MERGE_STEP: usize = 8;
// The fused merge writes out a step's splits with `each!` over eight indices.
const _: () = assert!(MERGE_STEP == 8);

/// Splits one step of [`paged_merge()`] combines: their loads issue together, so a
/// sequence's splits cost `ceil(splits / MERGE_PASS_STEP)` memory round trips.
pub const MERGE_PASS_STEP: usize = 16;

/// Merges the splits of [`paged_decode`](fn@paged_decode): work-group `(h, b)` (grid x = heads, y =
/// sequences) reads the `ceil(context_lens[b] / split_len)` splits of head `h` and writes
/// `out[(b * heads + h) * d ..]` and `lse[b * heads + h]` (zeros and `-inf` for an empty
/// context). Each work-item takes columns `c = tid, tid + block size, ...` and combines the
/// splits [`MERGE_PASS_STEP`] at a time with the online-softmax rescale (a running max, sum
/// and output), so the loads of a step are independent; the first step's addresses do not
/// depend on the context length (they are clamped to the launch's `splits`), so its loads
/// issue beside that of `context_lens[b]`: one memory round trip for up to
/// [`MERGE_PASS_STEP`] splits. Any work-group size; `d` work-items give one column each.
#[amdgpu_kernel(T = [f16, bf16], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn paged_merge<T: Float>(
    part_o: &[f32],
    part_ml: &[f32],
    context_lens: &[u32],
    out: &mut [T],
    lse: &mut [f32],
    heads: u32,
    d: u32,
    splits: u32,
    split_len: u32,
) {
    let (h, b) = (block_idx_x() as usize, block_idx_y() as usize);
    let (heads, d, splits) = (heads as usize, d as usize, splits as usize);
    let row = b * heads + h;
    let first = row * splits;
    // Uniform checks, so the loads below index without per-load checks (and branches that
    // would keep a step's loads from issuing together).
    if splits == 0 || (first + splits) * d > part_o.len() || (first + splits) * 2 > part_ml.len() || (row + 1) * d > out.len() || row >= lse.len() {
        panic!("paged_merge: a buffer is shorter than the shape needs");
    }
    let n = (context_lens[b] as usize).div_ceil(split_len as usize);
    let (po, pm) = (part_o.as_ptr(), part_ml.as_ptr());
    let mut c = thread_idx_x() as usize;
    while c < d {
        // Running max (log2 units), sum and output over the splits seen.
        let (mut mx, mut sum, mut acc) = (f32::NEG_INFINITY, 0.0f32, 0.0f32);
        let mut s0 = 0;
        loop {
            let mut m = [f32::NEG_INFINITY; MERGE_PASS_STEP];
            let mut l = [0.0f32; MERGE_PASS_STEP];
            let mut o = [0.0f32; MERGE_PASS_STEP];
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                // Past the launch's last split: the last one's values are read (in bounds,
                // so the load needs no branch); splits past the sequence's are left out.
                let s = first + if s0 + i < splits { s0 + i } else { splits - 1 };
                // SAFETY: s < first + splits, inside both (checked above).
                let (ms, ls, os) = unsafe { (*pm.add(s * 2), *pm.add(s * 2 + 1), *po.add(s * d + c)) };
                if s0 + i < n {
                    (m[i], l[i], o[i]) = (ms, ls, os);
                }
            });
            let mut top = mx;
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                top = top.max(m[i]);
            });
            // A split that saw no key has max -inf: weight 0 (never NaN, as is the rescale
            // while nothing has been seen).
            let mu = if top == f32::NEG_INFINITY { 0.0 } else { top };
            let alpha = (mx - mu).exp2();
            sum *= alpha;
            acc *= alpha;
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if m[i] != f32::NEG_INFINITY {
                    let w = (m[i] - mu).exp2();
                    sum += l[i] * w;
                    acc += o[i] * w;
                }
            });
            mx = top;
            s0 += MERGE_PASS_STEP;
            if s0 >= n || s0 >= splits {
                break;
            }
        }
        if n > splits {
            panic!("paged_merge: a context is longer than the launch's splits cover");
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        // SAFETY: inside out (checked above).
        unsafe { *out.as_mut_ptr().add(row * d + c) = T::from_f32(acc * inv) };
        if c == 0 {
            lse[row] = if sum > 0.0 { (mx + sum.log2()) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
        }
        c += block_dim_x() as usize;
    }
}

/// Writes token `t`'s key and value rows (`row = kv_heads * D` elements of `k`, `v`
/// `[tokens, kv_heads, D]`) to slot `slot_mapping[t]` of the caches (`[slots, row]`);
/// negative slots are skipped. One work-item per element (grid-stride).
#[amdgpu_kernel(T = [f16, bf16, f32], max_threads = 256)]
pub fn reshape_and_cache<T: Element>(k: &[T], v: &[T], k_cache: &mut [T], v_cache: &mut [T], slot_mapping: &[i64], row: u32) {
    let row = row as usize;
    let n = slot_mapping.len() * row;
    let mut e = global_idx_x();
    while e < n {
        let (t, c) = (e / row, e % row);
        let slot = slot_mapping[t];
        if slot >= 0 {
            let at = slot as usize * row + c;
            k_cache[at] = k[e];
            v_cache[at] = v[e];
        }
        e += global_size_x();
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
