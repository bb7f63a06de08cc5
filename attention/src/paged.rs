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
//! 16-byte copies (`cp.async` into two stages on NVIDIA sm_80+; one slot read per key row
//! for both its key and value chunks). The cache slots of a tile's keys are looked up one
//! tile ahead (one table read per key, by the first [`decode_bn`] work-items) and kept in
//! shared memory, so the copies issue without waiting on the table. Each split of `split_len`
//! keys writes its unnormalised f32 output and its (max, sum) to a workspace;
//! [`paged_merge`](fn@paged_merge) combines a sequence's splits (only the ones its context reaches) into
//! the output and the log-sum-exp. Shared memory: [`decode_smem_elems`].
// The head-dimension types name the device instances (the host launcher finds them by name).
#[allow(unused_imports)]
use crate::flash::{Hd128, Hd256, Hd64, Hd80, Hd96};
use crate::flash::{copy_rows, stage_elems, stages, value_chunk, value_chunks, HeadDim, RowState, Score, BN, PAD};
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

/// Shared-memory elements (16-bit) of a [`paged_decode`](fn@paged_decode) work-group of
/// `rows` query rows: the Q rows, [`stages`] K/V stages of [`decode_bn`] keys and two tiles'
/// cache slots (`2 * decode_bn` u32 values).
pub const fn decode_smem_elems(d: usize, rows: usize, low: Lowering) -> usize {
    let bn = decode_bn(low);
    rows * (d + PAD) + stages(low) * stage_elems(d, bn, low) + 4 * bn
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

/// Runs `$body` with `$i` bound to each listed constant.
macro_rules! each {
    ($i:ident in [$($n:literal),*] $body:block) => {$({
        #[allow(non_upper_case_globals)]
        const $i: usize = $n;
        $body
    })*};
}

/// One split of one sequence's keys for the query heads of one KV head (see the module
/// docs). Grid: x = splits, y = `kv_heads * value_chunks(D)`, z = sequences; `ceil(group /
/// 16)` waves; dynamic shared memory of [`decode_smem_elems`] elements. Writes, for
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
    scale: f32,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let bn = decode_bn(low);
    let d = H::D;
    let dv = value_chunk(d, low);
    let (ldq, ldk, ldv) = (d + PAD, d + PAD, dv + PAD);
    let rows = flat_block_dim() as usize / wave::size() as usize * 16;
    if smem.len() < decode_smem_elems(d, rows, low) {
        panic!("paged_decode: shared memory too small");
    }
    let chunks = value_chunks(d, low);
    let (hk, vc) = (block_idx_y() as usize / chunks, block_idx_y() as usize % chunks);
    let nof = dv / 16;
    let (b, split) = (block_idx_z() as usize, block_idx_x() as usize);
    let (heads_n, kv_n) = (heads as usize, kv_heads as usize);
    let group = heads_n / kv_n;
    let splits = grid_dim_x() as usize;
    let ctx = context_lens[b] as usize;
    let k_lo = split * split_len as usize;
    if k_lo >= ctx {
        // Past this sequence's context: the merge pass does not read this split.
        return;
    }
    let k_hi = if k_lo + (split_len as usize) < ctx { k_lo + split_len as usize } else { ctx };
    let n_tiles = (k_hi - k_lo).div_ceil(bn);
    let bs = block_size as usize;
    let table = b * max_blocks as usize;
    let h0 = hk * group;
    let row_elems = kv_n * d;
    // Uniform checks: the group's query rows, this split's block-table entries and
    // workspace rows lie in their buffers (the cache rows are checked per tile).
    let part_end = ((b * heads_n + h0 + group) * splits) * d;
    if (b * heads_n + h0 + group) * d > q.len()
        || table + (k_hi - 1) / bs >= block_tables.len()
        || part_end > part_o.len()
        || part_end / d * 2 > part_ml.len()
        || k_cache.len() != v_cache.len()
    {
        panic!("paged_decode: a buffer is shorter than the shape needs");
    }
    // Every block this split reads lies in the caches (each wave checks the split's table
    // entries, one per lane at a time, so the loads overlap instead of one table read per
    // round trip), so the gathers below index without per-element checks.
    let num_blocks = k_cache.len() / row_elems / bs;
    if num_blocks * bs > u32::MAX as usize - 1 {
        panic!("paged_decode: the caches have more than 2^32 - 2 slots");
    }
    let lanes = wave::size() as usize;
    let mut blk = k_lo / bs + flat_thread_idx() as usize % lanes;
    let mut outside = false;
    while blk <= (k_hi - 1) / bs {
        outside |= block_tables[table + blk] as usize >= num_blocks;
        blk += lanes;
    }
    if wave::any(outside) {
        panic!("paged_decode: a block table entry is outside the cache");
    }
    let (qp, kp, vp, tp) = (q.as_ptr(), k_cache.as_ptr(), v_cache.as_ptr(), block_tables.as_ptr());

    let tid = flat_thread_idx() as usize;
    let nthreads = flat_block_dim() as usize;
    let wave = tid / wave::size() as usize;
    let sp = smem.as_ptr();
    let q_lds = sp;
    let st_elems = stage_elems(d, bn, low);
    let nst = stages(low);
    let size = core::mem::size_of::<T>();
    let kv_sa = SharedAddr::new(sp.wrapping_add(rows * ldq));
    let kv_lds = sp.wrapping_add(rows * ldq);
    // Two tiles' cache slots (u32, 4-byte aligned: the element count before them is even).
    let slots = sp.wrapping_add(decode_smem_elems(d, rows, low) - 4 * bn) as *mut u32;

    // The group's query rows, zero past the group (the first copy group, with tile 0).
    // SAFETY: the group's rows lie in q (checked above), 16-byte aligned; the Q region
    // holds `rows` rows of ldq (length checked above).
    unsafe {
        copy_rows::<T>(SharedAddr::new(q_lds), ldq, rows, d, tid, nthreads, |r| {
            let ok = r < group;
            (if ok { qp.wrapping_add((b * heads_n + h0 + r) * d) } else { qp }, ok)
        })
    };
    // The cache slot of key `key` of the sequence (u32::MAX past the split).
    let slot_of = |key: usize| -> u32 {
        if key < k_hi {
            // SAFETY: the table entries of this split lie in block_tables and name blocks
            // inside the caches (checked above); slots fit 32 bits (checked above).
            unsafe { *tp.add(table + key / bs) * block_size + (key % bs) as u32 }
        } else {
            u32::MAX
        }
    };
    let (k_off, v_off) = (hk * d, hk * d + vc * dv);
    // Issues the copies of tile `t`'s keys and values (gathered through the slots the
    // previous iteration stored) into stage `t % nst`; zeros past the split.
    let issue = |t: usize| {
        let stage = kv_sa.add((t % nst) * st_elems * size);
        // SAFETY: the slots name rows inside the caches (checked above; v_cache has
        // k_cache's length), 16-byte aligned; the stage holds bn rows of ldk then bn
        // rows of ldv; the slots were written before the last barrier.
        unsafe {
            gather::<T>(stage, ldk, stage.add(bn * ldk * size), ldv, (bn, d, dv), (tid, nthreads), slots.wrapping_add((t % 2) * bn), (kp, vp), row_elems, (k_off, v_off))
        };
    };
    // Slots of tiles 0 .. nst, then tiles 0 .. nst - 1 in flight, one copy group each.
    if tid < bn {
        let mut s = 0;
        while s < nst {
            // SAFETY: inside the slot region (2 * bn values, nst <= 2).
            unsafe { *slots.add(s * bn + tid) = slot_of(k_lo + s * bn + tid) };
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
        t += 1;
    }

    let mut st = RowState::new();
    let scale2 = scale * core::f32::consts::LOG2_E;
    let mut t = 0;
    while t < n_tiles {
        let k0 = k_lo + t * bn;
        // The slots of tile t + nst are looked up now (the load overlaps the wait below)
        // and stored after the barrier, into the buffer tile t + nst - 2 used.
        let ahead = if tid < bn { slot_of(k_lo + (t + nst) * bn + tid) } else { u32::MAX };
        if t + nst - 1 < n_tiles {
            issue(t + nst - 1);
        }
        copy::commit();
        copy::wait_groups(nst as u32 - 1);
        barrier();
        if tid < bn {
            // SAFETY: inside the slot region.
            unsafe { *slots.add(((t + nst) % 2) * bn + tid) = ahead };
        }
        let score = DecodeScore { keys: (k_hi - k0) as u32, bn: bn as u32, scale2 };
        let kt_lds = kv_lds.wrapping_add((t % nst) * st_elems);
        let v_lds = kt_lds.wrapping_add(bn * ldk);
        let q_w = q_lds.wrapping_add(wave * 16 * ldq);
        // SAFETY: the tiles lie in `smem`, rows 16-byte aligned.
        unsafe {
            if bn == 16 {
                st.add_tile::<T, 1>(q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score)
            } else {
                st.add_tile::<T, 2>(q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score)
            }
        };
        // Every wave is done with this stage (and the slots) before they are refilled.
        barrier();
        t += 1;
    }
    copy::commit();
    copy::wait_groups(0);

    // This split's unnormalised rows and (first value chunk) their max and sum.
    let row0 = wave * 16;
    let part = |r: usize| ((b * heads_n + h0 + r) * splits + split) * d;
    let (pop, pmp) = (part_o.as_mut_ptr(), part_ml.as_mut_ptr());
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

/// Issues the 16-byte copies of one tile's `bn` keys (`d` columns, into `k_dst`, row
/// stride `ldk`) and values (`dv` columns, into `v_dst`, stride `ldv`), gathered from the
/// caches through the tile's cache slots (`u32::MAX`: past the split, zero-filled).
/// Work-item `tid` of `nthreads` takes every `nthreads`-th key chunk and the value chunk
/// of the same row and column: one slot read and one row address for both (half the
/// address work of two separate row copies). `cp.async` on NVIDIA sm_80+ (the caller
/// commits and waits), synchronous elsewhere.
///
/// # Safety
/// `slots` holds `bn` readable values in shared memory; every slot other than `u32::MAX`
/// names a row of both caches (`row_elems` elements per slot, the key columns at
/// `k_off`, the value columns at `v_off`, 16-byte aligned); `k_dst` and `v_dst` hold `bn`
/// rows of their strides (16-byte aligned) in shared memory; `dv <= d`, both multiples of 8.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gather<T>(
    k_dst: SharedAddr,
    ldk: usize,
    v_dst: SharedAddr,
    ldv: usize,
    (bn, d, dv): (usize, usize, usize),
    (tid, nthreads): (usize, usize),
    slots: *const u32,
    (kp, vp): (*const T, *const T),
    row_elems: usize,
    (k_off, v_off): (usize, usize),
) {
    let (per_row, per_v) = (d / 8, dv / 8);
    let size = core::mem::size_of::<T>();
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

/// Splits [`paged_merge`] combines per step: their loads issue together, so a sequence's
/// splits cost `ceil(splits / MERGE_STEP)` memory round trips rather than one each.
pub const MERGE_STEP: usize = 8;
// `paged_merge` writes out a step's splits with `each!` over eight indices.
const _: () = assert!(MERGE_STEP == 8);

/// Merges the splits of [`paged_decode`](fn@paged_decode): work-group `(h, b)` (grid x = heads, y =
/// sequences) reads the `ceil(context_lens[b] / split_len)` splits of head `h` and writes
/// `out[(b * heads + h) * d ..]` and `lse[b * heads + h]` (zeros and `-inf` for an empty
/// context). Each work-item takes columns `c = tid, tid + block size, ...` and combines the
/// splits [`MERGE_STEP`] at a time with the online-softmax rescale (a running max, sum and
/// output), so the loads of a step are independent. Any work-group size; `d` work-items
/// give one column each.
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
    let n = (context_lens[b] as usize).div_ceil(split_len as usize);
    let row = b * heads + h;
    let first = row * splits;
    // Uniform checks, so the loads below index without per-load checks (and branches that
    // would keep a step's loads from issuing together).
    if n > splits || (first + splits) * d > part_o.len() || (first + splits) * 2 > part_ml.len() || (row + 1) * d > out.len() || row >= lse.len() {
        panic!("paged_merge: a buffer is shorter than the shape needs");
    }
    let (po, pm) = (part_o.as_ptr(), part_ml.as_ptr());
    let mut c = thread_idx_x() as usize;
    while c < d {
        // Running max (log2 units), sum and output over the splits seen.
        let (mut mx, mut sum, mut acc) = (f32::NEG_INFINITY, 0.0f32, 0.0f32);
        let mut s0 = 0;
        while s0 < n {
            let mut m = [f32::NEG_INFINITY; MERGE_STEP];
            let mut l = [0.0f32; MERGE_STEP];
            let mut o = [0.0f32; MERGE_STEP];
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                // Past the last split: the last one's values are read (in bounds, so the
                // load needs no branch) and left out.
                let s = first + if s0 + i < n { s0 + i } else { n - 1 };
                // SAFETY: s < first + n <= first + splits, inside both (checked above).
                let (ms, ls, os) = unsafe { (*pm.add(s * 2), *pm.add(s * 2 + 1), *po.add(s * d + c)) };
                if s0 + i < n {
                    (m[i], l[i], o[i]) = (ms, ls, os);
                }
            });
            let mut top = mx;
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                top = top.max(m[i]);
            });
            // A split that saw no key has max -inf: weight 0 (never NaN, as is the rescale
            // while nothing has been seen).
            let mu = if top == f32::NEG_INFINITY { 0.0 } else { top };
            let alpha = (mx - mu).exp2();
            sum *= alpha;
            acc *= alpha;
            each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if m[i] != f32::NEG_INFINITY {
                    let w = (m[i] - mu).exp2();
                    sum += l[i] * w;
                    acc += o[i] * w;
                }
            });
            mx = top;
            s0 += MERGE_STEP;
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
