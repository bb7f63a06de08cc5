//! Flash-attention prefill on Hopper's warpgroup matrix units (`wgmma`, NVIDIA sm_90a):
//! the same forward, masks, options and layouts as [`flash_fwd`](fn@crate::flash::flash_fwd)
//! (see [`crate::flash`]) for head dimensions 64 and 128, with the products issued by
//! whole warpgroups of 128 work-items straight from shared memory.
//!
//! # Work decomposition
//! A work-group of two warpgroups takes [`WG_ROWS`] = 128 query rows of one (sequence,
//! head), 64 per warpgroup, and streams the keys and values in tiles of [`WG_KEYS`] = 128
//! through [`WG_STAGES`] = 2 shared-memory stages each (`cp.async`, one step ahead of the
//! products). Per tile each warpgroup computes `S = Q K^T` (64 x 128, f32, `d / 16`
//! products with Q and K read from shared memory), masks and scales it, updates its row
//! maxima and sums, rescales its output and adds `P V` with `P` rounded to 16 bits in
//! registers ([`wgmma::acc_to_a`]) and V read from shared memory (MN-major): the output
//! (64 x d f32) never leaves the registers until the end. The products of `S` for tile t
//! and of `P V` for tile t - 1 are issued together, so the softmax of tile t runs while
//! the tensor units add tile t - 1's values (FlashAttention-3's intra-warpgroup overlap).
//!
//! Q, K and V tiles share one shared-memory layout ([`tile_offset`]): 128-byte swizzled
//! atoms of 8 rows x 64 columns, the `d / 64` column groups of 8 rows side by side, so a
//! descriptor's stride between 8-row atoms is `d / 64` KiB. K as the B operand of `Q K^T`
//! is K-major (keys along N); V as the B operand of `P V` is MN-major (head dimension along
//! N, 64-column groups 1 KiB apart).
//!
//! Only the sm_90a PTX variant has the instructions; every other target compiles the
//! kernel to an immediate return, and the launcher ([`crate::flash::host`]) picks it only
//! where [`wgmma_runs`](crate::flash::host::wgmma_runs) (an sm_90 GPU, or the CPU executor
//! in its `mma.sync` mode, which emulates `wgmma`).
use crate::flash::{HeadDim, PrefillScore, Score};
// The head-dimension types name the device instances (the host launcher finds them by name).
#[allow(unused_imports)]
use crate::flash::{Hd128, Hd64};
use kernel_dsl::each;
use kernel_dsl::math::exp2_approx;
use kernel_dsl::mma::{copy, wgmma, MmaFloat, SharedAddr};
use kernel_dsl::prelude::*;

/// Query rows per work-group (two warpgroups of 64).
pub const WG_ROWS: usize = 128;
/// Keys per K/V tile.
pub const WG_KEYS: usize = 128;
/// Work-items per work-group: two warpgroups.
pub const WG_THREADS: usize = 2 * wgmma::WARPGROUP;
/// K/V stages in shared memory.
pub const WG_STAGES: usize = 2;
/// The head dimensions of this kernel.
pub const WG_HEAD_DIMS: [usize; 2] = [64, 128];

/// Bytes of one 128-row tile of `d` 16-bit columns.
pub const fn tile_bytes(d: usize) -> usize {
    WG_ROWS * d * 2
}

/// Dynamic shared memory of a work-group in 16-bit elements: the Q tile, [`WG_STAGES`] K
/// and V tiles, and 1 KiB to align them (hd128: 160 KiB + 1 KiB).
pub const fn smem_elems(d: usize) -> usize {
    (1024 + tile_bytes(d) * (1 + 2 * WG_STAGES)) / 2
}

/// Byte offset of 16-byte chunk `c` (8 columns) of row `r` in a tile of `d` columns:
/// 8-row atoms `d / 64` KiB apart, column group `c / 8` 1 KiB into the atom, the chunk
/// swizzled within its 128-byte row ([`wgmma::sw128_offset`]).
#[inline(always)]
pub const fn tile_offset(r: usize, c: usize, d: usize) -> usize {
    (r / 8) * (d / 64) * 1024 + (c / 8) * 1024 + wgmma::sw128_offset(r % 8, c % 8)
}

/// Issues the `cp.async` copies of a 128-row tile whose row `j` starts at `src + j *
/// stride` (`d` columns) into the swizzled tile at `dst`; rows `valid..` are zero-filled
/// and not read. Work-item `tid` of [`WG_THREADS`].
///
/// # Safety
/// Rows below `valid` have `d` readable elements, 16-byte aligned; `dst` is a 1024-byte
/// aligned tile of [`tile_bytes`]`(d)` in shared memory.
#[inline(always)]
unsafe fn copy_tile<T>(dst: SharedAddr, d: usize, tid: usize, src: *const T, stride: usize, valid: usize) {
    // Row `tid / per_row` + `apart` per round, chunk `tid % per_row` (the same swizzle in
    // every round: `apart` is a multiple of 8).
    let per_row = d / 8;
    let apart = WG_THREADS / per_row;
    let (r0, c) = (tid / per_row, tid % per_row);
    let at = dst.add(tile_offset(r0, c, d));
    let p = src.wrapping_add(r0 * stride + c * 8);
    each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        if i < WG_ROWS / apart {
            let dst = at.add(i * (apart / 8) * (d / 64) * 1024);
            let src = p.wrapping_add(i * apart * stride) as *const u8;
            // SAFETY: the caller's contract (a row past `valid` is not read: size 0).
            unsafe {
                if valid >= WG_ROWS || r0 + i * apart < valid {
                    copy::copy_16_whole_at(dst, src);
                } else {
                    copy::copy_16_at(dst, src, 0);
                }
            }
        }
    });
}

/// The running softmax state of a work-item's two rows (`g` and `g + 8` of its wave's 16):
/// maxima in log2 units, this work-item's share of the row sums (its columns only; the
/// row's four work-items add theirs at the end).
struct Rows {
    m: [f32; 2],
    l: [f32; 2],
}

/// The row (0 or 1 of the work-item's two) of accumulator `i`.
#[inline(always)]
const fn half(i: usize) -> usize {
    (i / 2) % 2
}

/// The maximum of `x` over the four work-items of its row (lanes `4 g .. 4 g + 4`).
#[inline(always)]
fn quad_max(x: f32) -> f32 {
    let x = x.max(wave::shuffle_xor(x, 1));
    x.max(wave::shuffle_xor(x, 2))
}

/// The sum of `x` over the four work-items of its row.
#[inline(always)]
fn quad_sum(x: f32) -> f32 {
    let x = x + wave::shuffle_xor(x, 1);
    x + wave::shuffle_xor(x, 2)
}

/// [`probabilities`] mode: every score is `c x` ([`Score::plain`]).
const PLAIN: u8 = 0;
/// [`probabilities`] mode: `c x` inside each row's key range, `-inf` outside
/// ([`Score::masked_plain`]: causal diagonals, window edges, a sequence's last keys).
const MASK: u8 = 1;
/// [`probabilities`] mode: each score through [`Score::score`], `c` = 1.
const SCORE: u8 = 2;

/// One tile's online-softmax step for a work-item's accumulators `s` of `S = Q K^T` (raw
/// scores), turned into the probabilities, with the row maxima and sums updated. Returns
/// each row's rescale factor for the output so far and whether no row's maximum moved
/// (then every factor is 1, or the output is still 0). The mode ([`PLAIN`], [`MASK`],
/// [`SCORE`]) says how scores become softmax inputs (rows of the warpgroup's 64, keys of
/// the tile).
#[inline(always)]
fn probabilities<const MODE: u8>(s: &mut [f32; wgmma::ACC_N128], st: &mut Rows, c: f32, score: &PrefillScore, t: usize) -> ([f32; 2], bool) {
    if MODE == MASK {
        // Each row's seen keys as a range of tile columns: two compares per score.
        let mut range = [(0i32, 0i32); 2];
        each!(h in [0, 1] {
            let diag = score.diag0 + wgmma::acc_coord(t, 2 * h).0 as i32;
            let mut hi = score.len_k - 1;
            if score.window_right >= 0 {
                hi = hi.min(diag + score.window_right);
            }
            let lo = if score.window_left >= 0 { diag - score.window_left } else { 0 };
            range[h] = (lo - score.k0, hi - score.k0);
        });
        each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
            each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                let i = p * 8 + q;
                let col = wgmma::acc_coord(t, i).1 as i32;
                let (lo, hi) = range[half(i)];
                if col < lo || col > hi {
                    s[i] = f32::NEG_INFINITY;
                }
            });
        });
    }
    if MODE == SCORE {
        each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
            each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                let i = p * 8 + q;
                let (r, col) = wgmma::acc_coord(t, i);
                s[i] = score.score(r, col, s[i]);
            });
        });
    }
    let mut tmax = [f32::NEG_INFINITY; 2];
    each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
        each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
            let i = p * 8 + q;
            tmax[half(i)] = tmax[half(i)].max(s[i]);
        });
    });
    let mut mu = [0f32; 2];
    let mut alpha = [1f32; 2];
    let mut same = true;
    each!(h in [0, 1] {
        let mn = st.m[h].max(quad_max(tmax[h]) * c);
        same &= mn == st.m[h] || mn == f32::NEG_INFINITY;
        // A row that has seen no key keeps max -inf and uses 0 as its reference: every
        // exp2 is of -inf (zeros), never NaN.
        mu[h] = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
        alpha[h] = exp2_approx(st.m[h] - mu[h]);
        st.m[h] = mn;
    });
    let mut psum = [0f32; 2];
    each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
        each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
            let i = p * 8 + q;
            s[i] = exp2_approx(FloatMath::mul_add(s[i], c, -mu[half(i)]));
            psum[half(i)] += s[i];
        });
    });
    each!(h in [0, 1] {
        st.l[h] = st.l[h] * alpha[h] + psum[h];
    });
    (alpha, same)
}

/// Issues `S = Q K^T` of one tile (not waited for) with the warpgroup's Q rows at
/// descriptor `dq` and the keys at `dk` (`d / 16` slices of 16 columns, 32 bytes into
/// their 64-column group's rows). The first product starts from zero, so no instruction
/// but the products defines the accumulators (zeroing moves inside the pipeline stage make
/// ptxas serialise the products).
///
/// # Safety
/// sm_90a or the emulation; both warpgroups pass descriptors of complete tiles (waited,
/// fenced, barrier) that are not rewritten before this warpgroup's wait.
#[inline(always)]
unsafe fn issue_s<T: MmaFloat>(dq: u64, dk: u64, d: usize) -> [f32; wgmma::ACC_N128] {
    // SAFETY (both): the caller's contract.
    let mut s = unsafe { wgmma::mma_m64n128k16_zero::<T, false>(dq, dk) };
    each!(ks in [1, 2, 3, 4, 5, 6, 7] {
        if ks < d / 16 {
            let at = ((ks / 4) * 1024 + (ks % 4) * 32) as u64 / 16;
            unsafe { wgmma::mma_m64n128k16::<T, false>(&mut s, dq + at, dk + at) };
        }
    });
    s
}

/// Issues `O += P V` of one tile (not waited for): P's 16-key slices from registers, V's
/// 16 key rows (two 8-row atoms, `sbo` bytes each) per slice at descriptor `dv`.
///
/// # Safety
/// As [`issue_s`]; `pa` and `o` are not touched until the wait.
#[inline(always)]
unsafe fn issue_pv<T: MmaFloat>(dv: u64, sbo: u32, d: usize, pa: &[[u32; 4]; WG_KEYS / 16], o: &mut [f32; wgmma::ACC_N128]) {
    each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
        let at = (j * 2 * sbo as usize) as u64 / 16;
        // SAFETY: the caller's contract.
        unsafe {
            if d == 128 {
                wgmma::mma_rs_m64n128k16::<T, true>(o, &pa[j], dv + at);
            } else {
                wgmma::mma_rs_m64n64k16::<T, true>(sub_acc(o), &pa[j], dv + at);
            }
        }
    });
}

/// The softmax of one tile's scores `s` (raw, in place: the probabilities) for the rows of
/// `st`: [`probabilities`] in the tile's mode. Returns the output's rescale.
#[inline(always)]
fn softmax(s: &mut [f32; wgmma::ACC_N128], st: &mut Rows, score: &PrefillScore, t: usize) -> ([f32; 2], bool) {
    match (score.plain(), score.masked_plain()) {
        (Some(c), _) => probabilities::<PLAIN>(s, st, c, score, t),
        (None, Some(c)) => probabilities::<MASK>(s, st, c, score, t),
        (None, None) => probabilities::<SCORE>(s, st, 1.0, score, t),
    }
}

/// The output so far (its first `used` accumulators) to the new maxima, skipped when no
/// row of the wave moved its maximum (most tiles after the first few), and the
/// probabilities `s` as the A operand of the next `P V`.
#[inline(always)]
fn finish<T: MmaFloat>(s: &[f32; wgmma::ACC_N128], (alpha, same): ([f32; 2], bool), used: usize, o: &mut [f32; wgmma::ACC_N128], pa: &mut [[u32; 4]; WG_KEYS / 16]) {
    if !wave::all(same) {
        each!(p in [0, 1, 2, 3, 4, 5, 6, 7] {
            each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                let i = p * 8 + q;
                if i < used {
                    o[i] *= alpha[half(i)];
                }
            });
        });
    }
    each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
        pa[j] = wgmma::acc_to_a::<T, { wgmma::ACC_N128 }>(s, j);
    });
}

/// Flash-attention forward on `wgmma` for one (query block of [`WG_ROWS`], head,
/// sequence): the arguments, masks, layouts and results of
/// [`flash_fwd`](fn@crate::flash::flash_fwd) (one value chunk: grid y = `heads`),
/// [`WG_THREADS`] work-items, dynamic shared memory of [`smem_elems`]`(D)` elements.
/// Returns at once where `wgmma` does not exist (the launcher never picks it there).
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd128], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn flash_fwd_wgmma<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: &mut [f32],
    cu: &[u32],
    alibi: &[f32],
    seq_q: u32,
    seq_k: u32,
    heads: u32,
    kv_heads: u32,
    total_q: u32,
    alibi_bs: u32,
    scale: f32,
    softcap: f32,
    window_left: i32,
    window_right: i32,
    smem: SharedDyn<T>,
) {
    if !wgmma::available() {
        return;
    }
    let d = H::D;
    if smem.len() < smem_elems(d) || flat_block_dim() as usize != WG_THREADS || (d != 64 && d != 128) {
        panic!("flash_fwd_wgmma: shared memory, work-group size or head dimension do not fit");
    }
    let (h, b) = (block_idx_y() as usize, block_idx_z() as usize);
    let heads_n = heads as usize;
    let hk = h / (heads / kv_heads) as usize;
    let varlen = !cu.is_empty();
    let (q_row0, len_q, k_row0, len_k) = if varlen {
        let nb = grid_dim_z() as usize + 1;
        let (q0, q1, k0, k1) = (cu[b] as usize, cu[b + 1] as usize, cu[nb + b] as usize, cu[nb + b + 1] as usize);
        (q0, q1 - q0, k0, k1 - k0)
    } else {
        (b * seq_q as usize, seq_q as usize, b * seq_k as usize, seq_k as usize)
    };
    // Query blocks in reverse order: with a causal mask the last blocks see the most keys.
    let q0 = (grid_dim_x() - 1 - block_idx_x()) as usize * WG_ROWS;
    if q0 >= len_q {
        return;
    }
    let q_hi = if q0 + WG_ROWS < len_q { q0 + WG_ROWS } else { len_q };
    let (q_stride, kv_stride) = (heads_n * d, kv_heads as usize * d);
    let q_end = (q_row0 + q_hi) * q_stride;
    let k_end = (k_row0 + len_k) * kv_stride;
    let lse_end = if varlen { h * total_q as usize + q_row0 + q_hi } else { (b * heads_n + h) * seq_q as usize + q_hi };
    if q_end > q.len() || q_end > out.len() || k_end > k.len() || k_end > v.len() || lse_end > lse.len() || h >= heads_n {
        panic!("flash_fwd_wgmma: a buffer is shorter than the shape needs");
    }
    let off = len_k as i32 - len_q as i32;
    let mut kv_lo = 0i32;
    let mut kv_hi = len_k as i32;
    if window_left >= 0 {
        kv_lo = (q0 as i32 + off - window_left).max(0);
    }
    if window_right >= 0 {
        kv_hi = kv_hi.min(q_hi as i32 + off + window_right);
    }
    let n_tiles = if kv_hi > kv_lo { ((kv_hi - kv_lo) as usize).div_ceil(WG_KEYS) } else { 0 };

    let tid = flat_thread_idx() as usize;
    let (wg, t) = (tid / wgmma::WARPGROUP, tid % wgmma::WARPGROUP);
    let ring = SharedAddr::new(smem.as_ptr()).align_up(1024);
    let tb = tile_bytes(d);
    let q_sa = ring;
    let k_sa = |stage: usize| ring.add(tb * (1 + stage));
    let v_sa = |stage: usize| ring.add(tb * (1 + WG_STAGES + stage));
    let (qp, kp, vp) = (q.as_ptr(), k.as_ptr(), v.as_ptr());
    let kv_base = k_row0 * kv_stride + hk * d;
    // SAFETY (all copies): rows below the valid counts lie in the buffers (checked above),
    // 16-byte aligned (d and the strides are multiples of 8 elements); the tiles lie in the
    // ring (smem_elems).
    unsafe { copy_tile::<T>(q_sa, d, tid, qp.wrapping_add((q_row0 + q0) * q_stride + h * d), q_stride, len_q - q0) };
    let issue_k = |tile: usize| {
        let k0 = kv_lo as usize + tile * WG_KEYS;
        unsafe { copy_tile::<T>(k_sa(tile % WG_STAGES), d, tid, kp.wrapping_add(kv_base + k0 * kv_stride), kv_stride, len_k - k0) };
    };
    let issue_v = |tile: usize| {
        let k0 = kv_lo as usize + tile * WG_KEYS;
        unsafe { copy_tile::<T>(v_sa(tile % WG_STAGES), d, tid, vp.wrapping_add(kv_base + k0 * kv_stride), kv_stride, len_k - k0) };
    };
    if n_tiles > 0 {
        issue_k(0);
    }
    copy::commit();

    let slope = if alibi.is_empty() { 0.0 } else { alibi[b * alibi_bs as usize + h] };
    let inv_cap = if softcap > 0.0 { 1.0 / softcap } else { 0.0 };
    let row0 = q0 + wg * 64;
    // Descriptor strides: 8-row atoms `d / 64` KiB apart; V's 64-column groups 1 KiB apart.
    let sbo = (d / 64 * 1024) as u32;
    let dq = wgmma::descriptor(q_sa.add(wg * 8 * sbo as usize), 16, sbo);
    let mut st = Rows { m: [f32::NEG_INFINITY; 2], l: [0.0; 2] };
    // SAFETY: all-zero bits are 0.0.
    let mut o: [f32; wgmma::ACC_N128] = unsafe { core::mem::zeroed() };
    // P of the previous tile as the register A operand of `P V`.
    let mut pa = [[0u32; 4]; WG_KEYS / 16];
    // The copies issued one step earlier are done; the fence hands them to the tensor
    // units, the barrier to the other warpgroup (and says every work-item is done with the
    // products of the step before, whose stages the copies issued next overwrite). Then
    // K of tile `step + 1` and V of tile `step`, one step ahead of their products.
    let sync_and_copy = |step: usize| {
        copy::wait_groups(0);
        wgmma::fence_proxy_async();
        barrier();
        if step + 1 < n_tiles {
            issue_k(step + 1);
        }
        if step < n_tiles {
            issue_v(step);
        }
        copy::commit();
    };
    // The descriptors of tile `step`'s K (K-major B of `Q K^T`) and V (MN-major B of
    // `P V`, 64-column groups 1 KiB apart).
    let dk = |step: usize| wgmma::descriptor(k_sa(step % WG_STAGES), 16, sbo);
    let dv = |step: usize| wgmma::descriptor(v_sa(step % WG_STAGES), 1024, sbo);
    // Scale, soft-cap, ALiBi and mask of this warpgroup's rows (`k0` set per tile).
    let mut score = PrefillScore {
        diag0: row0 as i32 + off,
        rows: 64,
        k0: 0,
        bn: WG_KEYS as i32,
        len_k: len_k as i32,
        window_left,
        window_right,
        scale,
        softcap,
        inv_cap,
        slope,
    };
    // Step 0: S of tile 0 alone. Steps 1 .. n_tiles: S of tile `step` issued beside P V of
    // tile `step - 1`, so the softmax of one tile runs while the tensor units add the
    // values of the one before; S is local to its step (only P crosses steps). Last: P V
    // of the last tile.
    if n_tiles > 0 {
        sync_and_copy(0);
        wgmma::fence();
        // SAFETY (all products): sm_90a (checked at the start) or the emulation; the tiles
        // are complete (sync_and_copy) and not rewritten before the next step's barrier,
        // after this warpgroup's waits.
        let mut s = unsafe { issue_s::<T>(dq, dk(0), d) };
        wgmma::commit();
        wgmma::wait::<0>();
        score.k0 = kv_lo;
        let rescale = softmax(&mut s, &mut st, &score, t);
        finish::<T>(&s, rescale, d / 2, &mut o, &mut pa);
        let mut step = 1;
        while step < n_tiles {
            sync_and_copy(step);
            wgmma::fence();
            let mut s = unsafe { issue_s::<T>(dq, dk(step), d) };
            wgmma::commit();
            unsafe { issue_pv::<T>(dv(step - 1), sbo, d, &pa, &mut o) };
            wgmma::commit();
            // S is done (the older group); P V may still run.
            wgmma::wait::<1>();
            score.k0 = kv_lo + (step * WG_KEYS) as i32;
            let rescale = softmax(&mut s, &mut st, &score, t);
            wgmma::wait::<0>();
            finish::<T>(&s, rescale, d / 2, &mut o, &mut pa);
            step += 1;
        }
        sync_and_copy(n_tiles);
        wgmma::fence();
        unsafe { issue_pv::<T>(dv(n_tiles - 1), sbo, d, &pa, &mut o) };
        wgmma::commit();
        wgmma::wait::<0>();
    }
    copy::wait_groups(0);

    // Normalise and write the rows (pairs of columns per store) and the LSE.
    let (g, lane) = ((t % 32) / 4 + (t / 32) * 16, t % 4);
    let o_base = q_row0 * q_stride + h * d;
    let lse_base = if varlen { h * total_q as usize + q_row0 } else { (b * heads_n + h) * seq_q as usize };
    let (op, lse_p) = (out.as_mut_ptr(), lse.as_mut_ptr());
    each!(hh in [0, 1] {
        let l = quad_sum(st.l[hh]);
        let seen = l > 0.0;
        let inv = if seen { 1.0 / l } else { 0.0 };
        let i = row0 + g + 8 * hh;
        if i < len_q {
            each!(p in [0, 1, 2, 3] {
                each!(qq in [0, 1, 2, 3] {
                    // Accumulators 4 n + 2 hh, + 1: columns 8 n + 2 lane, + 1 of this row.
                    let n = p * 4 + qq;
                    if n * 8 < d {
                        let a = 4 * n + 2 * hh;
                        let [x, y] = T::from_f32x2([o[a] * inv, o[a + 1] * inv]);
                        // SAFETY: row i < len_q lies in out (checked at the start); the pair
                        // is 4-byte aligned (even column, even strides).
                        unsafe { *(op.add(o_base + i * q_stride + 8 * n + 2 * lane) as *mut u32) = x.bits() as u32 | (y.bits() as u32) << 16 };
                    }
                });
            });
            if lane == 0 {
                let x = if seen { (st.m[hh] + l.log2()) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
                // SAFETY: below lse_end (checked at the start).
                unsafe { *lse_p.add(lse_base + i) = x };
            }
        }
    });
}

/// The first [`wgmma::ACC_N64`] accumulators of a 128-column product's: an `m64n64`
/// product's accumulators are the first 64 columns of [`wgmma::acc_coord`]'s layout.
#[inline(always)]
fn sub_acc(o: &mut [f32; wgmma::ACC_N128]) -> &mut [f32; wgmma::ACC_N64] {
    // SAFETY: a prefix of the array, same element type.
    unsafe { &mut *(o.as_mut_ptr() as *mut [f32; wgmma::ACC_N64]) }
}
