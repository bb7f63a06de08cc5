//! Paged prefill: flash attention of prompt chunks whose keys and values are read from the
//! paged KV cache through the block tables, so a chunk with a cached prefix (a continued
//! chunked prefill, a prefix-cache hit) attends without first gathering its context out
//! of the cache into contiguous tensors.
//!
//! # Layout
//! - `q`, `out [total_q, heads, D]`: sequence `b`'s chunk at rows `cu_q[b]..cu_q[b + 1]`;
//!   `lse [heads, total_q]` (f32, natural log).
//! - `k_cache`, `v_cache [num_blocks, block_size, kv_heads, D]` as in [`crate::paged`]:
//!   token `t` of sequence `b` lives in block `block_tables[b * max_blocks + t /
//!   block_size]`, row `t % block_size`.
//! - `context_lens [batch]`: tokens of sequence `b` in the cache, the chunk's own included
//!   (they are written first, e.g. by `rope_and_cache`). The chunk's `n` queries are the
//!   sequence's positions `context_lens[b] - n ..`; query `i` sees keys `0 ..=
//!   context_lens[b] - n + i` (causal, bottom-right aligned as in [`crate::flash`]), or
//!   with a left window `w` only the keys from `context_lens[b] - n + i - w`.
//! - `meta` (u32): `cu_q` (`batch + 1`), then `context_lens` (`batch`), then the block
//!   tables (`batch * max_blocks`), uploaded once per step ([`host::PrefillIndex`]).
//!
//! # Work decomposition
//! That of [`flash_fwd`](fn@crate::flash::flash_fwd), whose tile step it runs
//! ([`add_tile_rows`]): a work-group of [`WAVES`] waves takes [`block_rows`] query rows of
//! one (sequence, head, value chunk); the Q tile is staged once; key/value tiles of
//! [`prefill_bn`] keys stream through shared memory in 16-byte copies (`cp.async` with two
//! K buffers on NVIDIA sm_80+). The only difference is where a tile's rows come from: key
//! `j` of the sequence is row `j % block_size` of block `block_tables[j / block_size]`,
//! looked up per copied row ([`copy_rows`]; block sizes are powers of two, a shift and a
//! mask); rows of a K/V tile past the work-group's last
//! visible key are zeros. Key tiles wholly outside the causal (and window) range of the
//! work-group's rows are not visited. Built for head dimensions 64 and 128 (the models the
//! engine serves); other head dimensions stay on the gather path.
use crate::flash::{add_tile_rows, block_rows, copy_rows, prefill_bn, row_tiles, smem_elems, stages, value_chunk, write_rows, HeadDim, PrefillScore, RowState, PAD, WAVES};
// The head-dimension types name the device instances (the host launcher finds them by name).
#[allow(unused_imports)]
use crate::flash::{Hd128, Hd64};
use kernel_dsl::mma::{self, copy, Lowering, MmaFloat, SharedAddr};
use kernel_dsl::prelude::*;

/// Head dimensions [`paged_prefill`](fn@paged_prefill) is built for.
pub const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];

/// Value columns one work-group accumulates: [`value_chunk`]'s, except hd64 on RDNA3's WMMA
/// (gfx11), which takes 16: with 32 its bf16 instance needed more than the 192 registers a
/// work-item had there while code objects were compiled for 1024 work-items (the
/// block-table row lookups on top of `flash_fwd`'s tile) and spilled. The price is twice
/// the work-groups per head on that target. Compiled for its bound of 256, 32 columns take
/// 210 VGPRs on gfx1100 without spills (16 take 194; 6 waves per SIMD either way): this
/// exception can go once an RDNA3 card confirms it is faster.
pub const fn prefill_value_chunk(d: usize, low: Lowering) -> usize {
    match (low, d) {
        (Lowering::Wmma, 64) => 16,
        _ => value_chunk(d, low),
    }
}

/// Value chunks per head: the grid's y extent is `heads *` this.
pub const fn prefill_value_chunks(d: usize, low: Lowering) -> usize {
    d / prefill_value_chunk(d, low)
}

/// Compiling for AMD GPUs: the work-group size is read at run time there (as in
/// [`crate::flash`]).
const AMD: bool = cfg!(target_arch = "amdgpu");

/// Flash attention of one (query block, sequence, head, value chunk) of a batch of prompt
/// chunks over the sequences' paged caches: see the module docs. Grid: x = query blocks
/// of [`block_rows`]`(D, lowering)` rows (of the longest chunk), y = `heads *
/// [`prefill_value_chunks`]`(D, lowering)`, z = sequences; [`WAVES`] waves per work-group; dynamic
/// shared memory of [`smem_elems`]`(D, block_rows(D, lowering), lowering)` elements.
/// `meta`: see the module docs (the tables start at `2 * batch + 1`). `window_left`
/// negative: unbounded. Launch through [`host::paged_prefill`], which checks every size
/// and index first; the kernel checks once per work-group that its rows lie in the
/// buffers and that the table entries it reads name blocks inside the caches.
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd128], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    out: &mut [T],
    lse: &mut [f32],
    meta: &[u32],
    heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    total_q: u32,
    scale: f32,
    window_left: i32,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let d = H::D;
    let dv = prefill_value_chunk(d, low);
    let (ldq, ldk, ldv) = (d + PAD, d + PAD, dv + PAD);
    let (rows, mt) = (block_rows(d, low), row_tiles(d, low));
    if smem.len() < smem_elems(d, rows, low) {
        panic!("paged_prefill: shared memory too small");
    }
    let chunks = prefill_value_chunks(d, low);
    let (h, vc) = (block_idx_y() as usize / chunks, block_idx_y() as usize % chunks);
    let nof = dv / 16;
    let b = block_idx_z() as usize;
    let nb = grid_dim_z() as usize;
    let (heads_n, kv_n) = (heads as usize, kv_heads as usize);
    let hk = h / (heads_n / kv_n);
    let (bs, mb) = (block_size as usize, max_blocks as usize);
    let table = 2 * nb + 1 + b * mb;
    if table + mb > meta.len() || h >= heads_n {
        panic!("paged_prefill: the index is shorter than the grid needs");
    }
    let (q_row0, q_end_row, ctx) = (meta[b] as usize, meta[b + 1] as usize, meta[nb + 1 + b] as usize);
    let len_q = q_end_row.wrapping_sub(q_row0);
    // Query blocks in reverse order: the last blocks see the most keys.
    let q0 = (grid_dim_x() - 1 - block_idx_x()) as usize * rows;
    if q0 >= len_q {
        return;
    }
    let q_hi = if q0 + rows < len_q { q0 + rows } else { len_q };
    let q_stride = heads_n * d;
    let row_elems = kv_n * d;
    // Every element this work-group touches lies in its buffer (one uniform check).
    let q_end = (q_row0 + q_hi) * q_stride;
    let lse_end = h * total_q as usize + q_row0 + q_hi;
    if q_end_row < q_row0 || len_q > ctx || ctx > mb * bs || !bs.is_power_of_two() || q_end > q.len() || q_end > out.len() || lse_end > lse.len() || k_cache.len() != v_cache.len() {
        panic!("paged_prefill: a buffer is shorter than the shape needs");
    }
    let num_blocks = k_cache.len() / row_elems / bs;
    let (qp, kp, vp, op, tp) = (q.as_ptr(), k_cache.as_ptr(), v_cache.as_ptr(), out.as_mut_ptr(), meta.as_ptr());
    let lse_p = lse.as_mut_ptr();
    // The diagonal offset (bottom-right alignment) and the keys any row of the block sees.
    let off = (ctx - len_q) as i32;
    let mut kv_lo = 0i32;
    if window_left >= 0 {
        kv_lo = (q0 as i32 + off - window_left).max(0);
    }
    let kv_hi = q_hi as i32 + off;
    let bn = prefill_bn(d, low);
    let n_tiles = if kv_hi > kv_lo { ((kv_hi - kv_lo) as usize).div_ceil(bn) } else { 0 };
    let (kv_lo, kv_hi) = (kv_lo as usize, kv_hi as usize);

    let tid = flat_thread_idx() as usize;
    let nthreads = if AMD { flat_block_dim() as usize } else { WAVES * wave::size() as usize };
    if !AMD {
        if flat_block_dim() as usize != nthreads {
            panic!("paged_prefill: work-group size is not WAVES waves");
        }
        // SAFETY: a work-item index is below the work-group size (checked just above).
        unsafe { core::hint::assert_unchecked(tid < nthreads) };
    }
    // The table entries of the keys this work-group reads name blocks inside the caches
    // (each wave checks them all, a lane per entry).
    let lanes = wave::size() as usize;
    let mut blk = kv_lo / bs + tid % lanes;
    let blk_end = kv_hi.div_ceil(bs);
    let mut outside = false;
    while blk < blk_end {
        // SAFETY: blk < ctx / bs rounded up <= mb: inside the sequence's row (checked above).
        outside |= unsafe { *tp.add(table + blk) } as usize >= num_blocks;
        blk += lanes;
    }
    if wave::any(outside) {
        panic!("paged_prefill: a block table entry is outside the cache");
    }
    // The cache row of key `key` (below kv_hi): the block size is a power of two (checked
    // above), so a shift and a mask (no division: its registers spilled on gfx11).
    let shift = bs.trailing_zeros();
    let row_of = |key: usize| -> usize {
        // SAFETY: the entries of keys below kv_hi lie in the row and inside the caches
        // (checked above).
        unsafe { ((*tp.add(table + (key >> shift)) as usize) << shift) | (key & (bs - 1)) }
    };

    let wave = tid / lanes;
    let sp = smem.as_ptr();
    let q_lds = sp;
    let kbufs = stages(low);
    let size = core::mem::size_of::<T>();
    let k_lds = sp.wrapping_add(rows * ldq);
    let v_lds = k_lds.wrapping_add(kbufs * bn * ldk);
    let (k_sa, v_sa) = (SharedAddr::new(k_lds), SharedAddr::new(v_lds));

    // The Q tile, zero past the chunk (the first copy group, with K tile 0).
    let q_base = (q_row0 + q0) * q_stride + h * d;
    // SAFETY: rows below q_hi lie in q (checked above), 16-byte aligned (d and the strides
    // are multiples of 8 elements); the Q region holds `rows` rows of ldq.
    unsafe {
        copy_rows::<T>(SharedAddr::new(q_lds), ldq, rows, d, tid, nthreads, |r| {
            let ok = q0 + r < len_q;
            (if ok { qp.wrapping_add(q_base + r * q_stride) } else { qp }, ok)
        })
    };

    let row0 = q0 + wave * 16 * mt;
    let mut st = [RowState::new(); 2];
    let (k_off, v_off) = (hk * d, hk * d + vc * dv);
    // The copies of key tile `t` into K buffer `t % kbufs` and of its values into the V
    // buffer, gathered through the block table; keys past kv_hi are zeros (masked: their
    // probabilities are 0, and 0 * garbage could be NaN).
    // SAFETY (both): keys below kv_hi map to rows inside the caches (checked above), rows
    // 16-byte aligned; a K buffer holds bn rows of ldk, the V buffer bn rows of ldv.
    let issue_k = |t: usize| {
        let k0 = kv_lo + t * bn;
        let dst = k_sa.add((t % kbufs) * bn * ldk * size);
        unsafe {
            copy_rows::<T>(dst, ldk, bn, d, tid, nthreads, |j| {
                let ok = k0 + j < kv_hi;
                (if ok { kp.wrapping_add(row_of(k0 + j) * row_elems + k_off) } else { kp }, ok)
            })
        };
    };
    let issue_v = |t: usize| {
        let k0 = kv_lo + t * bn;
        unsafe {
            copy_rows::<T>(v_sa, ldv, bn, dv, tid, nthreads, |j| {
                let ok = k0 + j < kv_hi;
                (if ok { vp.wrapping_add(row_of(k0 + j) * row_elems + v_off) } else { vp }, ok)
            })
        };
    };
    // The copy schedule of `flash_fwd`: with two K buffers tile t's values and tile t + 1's
    // keys are issued at the top of iteration t; with one, tile t's keys and values.
    if kbufs > 1 && n_tiles > 0 {
        issue_k(0);
    }
    copy::commit();
    let before_pv = || {
        if kbufs > 1 {
            copy::wait_groups(1);
            barrier();
        }
    };
    let mut t = 0;
    while t < n_tiles {
        let k0 = kv_lo + t * bn;
        if kbufs == 1 {
            issue_k(t);
            // The table reads and copies of one tile at a time (hoisted, bf16 hd64 spilled
            // on gfx11's 192 VGPRs).
            mma::schedule_fence();
            issue_v(t);
            mma::schedule_fence();
            copy::commit();
        }
        copy::wait_groups(0);
        barrier();
        if kbufs > 1 {
            issue_v(t);
            copy::commit();
            if t + 1 < n_tiles {
                issue_k(t + 1);
            }
            copy::commit();
        }
        let score = PrefillScore {
            diag0: row0 as i32 + off,
            rows: (16 * mt) as i32,
            k0: k0 as i32,
            bn: bn as i32,
            len_k: ctx as i32,
            window_left,
            window_right: 0,
            scale,
            softcap: 0.0,
            inv_cap: 0.0,
            slope: 0.0,
        };
        let kt_lds = k_lds.wrapping_add((t % kbufs) * bn * ldk);
        let q_w = q_lds.wrapping_add(wave * 16 * mt * ldq);
        // SAFETY: the tiles lie in `smem` with rows 16-byte aligned.
        unsafe {
            if bn == 64 {
                add_tile_rows::<T, 4, 2>(&mut st, q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score, &before_pv);
            } else {
                add_tile_rows::<T, 2, 1>(core::array::from_mut(&mut st[0]), q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score, &before_pv);
            }
        }
        if kbufs == 1 {
            barrier();
        }
        t += 1;
    }
    copy::commit();
    copy::wait_groups(0);

    // Normalise, write the chunk's rows and (first value chunk) the LSE.
    let o_base = q_row0 * q_stride + h * d + vc * dv;
    // SAFETY: rows below q_hi lie in out, and their LSE entries below lse_end (checked above).
    unsafe { write_rows(&mut st, mt, nof, row0, len_q, (op, o_base, q_stride), (lse_p, h * total_q as usize + q_row0, vc == 0)) };
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
