//! Indexing ops as in Candle: `index_select`, `gather`, `scatter_add`, `index_add`,
//! `where_cond` and `copy2d` (with the host helper [`ops::cat`]).
//!
//! Shapes: a tensor indexed along one dimension is viewed as `(left, dim, right)` (the
//! product of the dimensions before it, the dimension, the product of those after it);
//! buffers are contiguous and row-major in that view unless a strided [`ops::View`] is given.
//! Element types: `f32`, `f16`, `bf16` everywhere, plus `u8` and `u32` for the pure data
//! movements (`index_select`, `gather`, `where_cond`, `copy2d`); index types `u32` and `i64`.
//!
//! **Out-of-range indices** (`id >= dim`, or a negative `i64`) never touch memory outside a
//! buffer: `index_select` and `gather` write zero for them (Candle's CUDA kernels do the
//! same), `scatter_add` and `index_add` skip them.
//!
//! Speed: all of these are memory-bound. Row copies (`index_select`, `copy2d`) move one
//! 16-byte vector per work-item and step when both rows start on 16 bytes; work-items run
//! along the contiguous (`right`) dimension so every wave's accesses are coalesced; every
//! loop is grid-stride, so any launch shape is correct (`scatter_add` excepted: it takes
//! [`scatter_config`]). `scatter_add` / `index_add` are deterministic without atomics:
//! every destination gets its sources added in source order (Candle's CPU order),
//! f16/bf16 through `f32` for each add; `index_add` with one work-item per `(left, right)`
//! position, `scatter_add` with a wave per position and rounds of two sources per lane.
//!
//! The checked host wrappers are in [`ops`]; the raw launchers (`index_select::launch` ...)
//! check nothing beyond the kernel model (bounds-checked slices).
//!
//! ```
//! use kernels::indexing::ops;
//! use kernels::runtime::Device;
//!
//! let dev = Device::best();
//! let table = dev.upload(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap(); // 3 rows of 2
//! let ids = dev.upload(&[2u32, 0, 7]).unwrap(); // 7 is out of range: a zero row
//! let mut out = dev.alloc::<f32>(3 * 2).unwrap();
//! ops::index_select(&dev, &table, None, &ids, &mut out, 1, 3, 2).unwrap();
//! assert_eq!(dev.download(&out).unwrap(), [4.0, 5.0, 0.0, 1.0, 0.0, 0.0]);
//! ```
use core::num::{NonZeroU32, NonZeroUsize};
use kernel_dsl::mma::copy::{self, SharedAddr};
use kernel_dsl::prelude::*;

/// 16 bytes, aligned, as four words: one vector access (`global_load_dwordx4`,
/// `ld.global.v4.b32`) for pure data movement. (A `[u8; 16]` block is copied as two 64-bit
/// accesses in PTX.)
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Words4(pub [u32; 4]);

/// The four words of an aligned 16-byte block (one vector load; whole-struct copies went
/// through local memory on NVPTX).
///
/// # Safety
/// `p` is valid for a 16-byte read and 16-byte aligned.
#[device]
#[inline(always)]
pub unsafe fn ld4(p: *const Words4) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { [(*p).0[0], (*p).0[1], (*p).0[2], (*p).0[3]] }
}

/// Stores four words as one aligned 16-byte block.
///
/// # Safety
/// `p` is valid for a 16-byte write and 16-byte aligned.
#[device]
#[inline(always)]
pub unsafe fn st4(p: *mut Words4, v: [u32; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        (*p).0[0] = v[0];
        (*p).0[1] = v[1];
        (*p).0[2] = v[2];
        (*p).0[3] = v[3];
    }
}

mod sealed {
    pub trait Sealed {}
    macro_rules! sealed {
        ($($t:ty),*) => {$(impl Sealed for $t {})*};
    }
    sealed!(f32, f64, super::f16, super::bf16, u8, u32, i32, i64, u64);
}

/// Plain data: every bit pattern is a valid value, there are no padding bytes, and all-zero
/// bits are zero. The data-movement kernels copy such elements as raw 16-byte words.
pub trait Pod: Element + sealed::Sealed {}

macro_rules! pod {
    ($($t:ty),*) => {$(impl Pod for $t {})*};
}
pod!(f32, f64, f16, bf16, u8, u32, i32, i64, u64);

/// An index element type (`u32`, `i64`). Sealed: the kernels rely on `to_index` for
/// memory safety.
pub trait IndexType: Element + sealed::Sealed {
    /// The index as `usize` when it addresses one of `len` positions (always `< len`);
    /// `None` when it is out of range or negative.
    fn to_index(self, len: usize) -> Option<usize>;
    /// [`IndexType::to_index`] for a 32-bit `len`: the index, or `u32::MAX` when it is out
    /// of range or negative (32-bit compares only).
    fn to_row32(self, len: u32) -> u32;
}

impl IndexType for u32 {
    #[inline(always)]
    fn to_index(self, len: usize) -> Option<usize> {
        let i = self as usize;
        if i < len { Some(i) } else { None }
    }
    #[inline(always)]
    fn to_row32(self, len: u32) -> u32 {
        if self < len { self } else { u32::MAX }
    }
}

impl IndexType for i64 {
    #[inline(always)]
    fn to_index(self, len: usize) -> Option<usize> {
        if self >= 0 && (self as u64) < len as u64 { Some(self as usize) } else { None }
    }
    #[inline(always)]
    fn to_row32(self, len: u32) -> u32 {
        if self >= 0 && (self as u64) < len as u64 { self as u32 } else { u32::MAX }
    }
}

/// A condition element type for [`where_cond`](fn@where_cond) (`u8`, `u32`): nonzero is true.
pub trait CondType: Element + sealed::Sealed {
    /// `self != 0`.
    fn is_true(self) -> bool;
}

impl CondType for u8 {
    #[inline(always)]
    fn is_true(self) -> bool {
        self != 0
    }
}

impl CondType for u32 {
    #[inline(always)]
    fn is_true(self) -> bool {
        self != 0
    }
}

/// Offset of logical element `i` in a strided view `layout = [dims..., strides...]` (`i`
/// itself for an empty layout), as [`crate::elementwise::strided_offset`] but with 32-bit
/// divisions while the index and dimension fit and no panicking paths (a zero dimension
/// counts as 1: a view with one has no elements to ask for).
#[device]
#[inline(always)]
pub fn view_offset(i: usize, layout: &[usize]) -> usize {
    let nd = layout.len() / 2;
    let mut rem = i;
    let mut off = 0;
    let mut d = nd;
    if nd == 0 {
        return i;
    }
    while d > 0 {
        d -= 1;
        // SAFETY: d < nd and nd + d < 2 * nd <= layout.len().
        let (dim, stride) = unsafe { (*layout.get_unchecked(d), *layout.get_unchecked(nd + d)) };
        let (q, r) = divmod(rem, dim);
        off += r * stride;
        rem = q;
    }
    off
}

/// `(a / b, a % b)` for `b > 0` (`b = 0` counts as 1, without a panicking path), in 32-bit
/// arithmetic when both fit.
#[device]
#[inline(always)]
pub fn divmod(a: usize, b: usize) -> (usize, usize) {
    if (a | b) >> 32 == 0 {
        let d = NonZeroU32::new(b as u32).unwrap_or(NonZeroU32::MIN);
        ((a as u32 / d) as usize, (a as u32 % d) as usize)
    } else {
        let d = NonZeroUsize::new(b).unwrap_or(NonZeroUsize::MIN);
        (a / d, a % d)
    }
}

/// This work-item's y index and the y step of a grid-stride loop.
#[device]
#[inline(always)]
pub fn grid_y() -> (usize, usize) {
    (global_idx_y(), grid_dim_y() as usize * block_dim_y() as usize)
}

/// `dst = src` (equal lengths) by the work-items of one row: work-item `x` of `step`
/// moves 16-byte blocks `x, x + step, ...` when both rows start on 16 bytes, then the
/// remaining elements one at a time.
#[device]
#[inline(always)]
pub fn copy_row<T: Pod>(src: &[T], dst: &mut [T], x: usize, step: usize) {
    let n = dst.len();
    let src = &src[..n];
    let size = core::mem::size_of::<T>();
    let mut done = 0;
    if 16 % size == 0 && (src.as_ptr() as usize | dst.as_ptr() as usize) % 16 == 0 {
        let lanes = 16 / size;
        let blocks = n / lanes;
        let mut c = x;
        while c < blocks {
            // SAFETY: (c + 1) * lanes <= n elements of both rows; both start 16-byte aligned
            // and `lanes` elements are exactly 16 bytes, so each block is aligned and in bounds.
            unsafe {
                st4(dst.as_mut_ptr().add(c * lanes) as *mut Words4, ld4(src.as_ptr().add(c * lanes) as *const Words4));
            }
            c += step;
        }
        done = blocks * lanes;
    }
    let mut i = done + x;
    while i < n {
        dst[i] = src[i];
        i += step;
    }
}

/// `dst = 0` by the work-items of one row (as [`copy_row`]; zero bits are zero for every
/// [`Pod`] type).
#[device]
#[inline(always)]
pub fn zero_row<T: Pod>(dst: &mut [T], x: usize, step: usize) {
    let n = dst.len();
    let size = core::mem::size_of::<T>();
    let mut done = 0;
    if 16 % size == 0 && dst.as_ptr() as usize % 16 == 0 {
        let lanes = 16 / size;
        let blocks = n / lanes;
        let mut c = x;
        while c < blocks {
            // SAFETY: as in `copy_row`.
            unsafe {
                st4(dst.as_mut_ptr().add(c * lanes) as *mut Words4, [0; 4]);
            }
            c += step;
        }
        done = blocks * lanes;
    }
    let mut i = done + x;
    while i < n {
        dst[i] = T::ZERO;
        i += step;
    }
}

/// `out[l, i, r] = src[l, ids[i], r]` (zero for an out-of-range id), with `src` viewed as
/// `(left, src_dim, right)` through `layout` (`[dims..., strides...]` of any rank with
/// `left * src_dim * right` elements; empty: contiguous) and `out` contiguous
/// `(left, ids.len(), right)`. Launch with [`rows_config`]`(left * n, right / lanes)`.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32], I = [u32, i64])]
pub fn index_select<T: Pod, I: IndexType>(
    src: &[T],
    layout: &[usize],
    ids: &[I],
    out: &mut [T],
    left: usize,
    src_dim: usize,
    right: usize,
) {
    let n = ids.len();
    let rows = left * n;
    let (x, xs) = (global_idx_x(), global_size_x());
    let (y, ys) = grid_y();
    if !layout.is_empty() {
        // Strided source: one element per work-item and step, flattened over the grid.
        let total = rows * right;
        let mut e = y * xs + x;
        while e < total {
            let (row, r) = divmod(e, right);
            let (l, k) = divmod(row, n);
            // SAFETY: n > 0 here (total > 0), so k = row % n < n == ids.len().
            out[e] = match unsafe { ids.get_unchecked(k) }.to_index(src_dim) {
                Some(id) => src[view_offset((l * src_dim + id) * right + r, layout)],
                None => T::ZERO,
            };
            e += xs * ys;
        }
        return;
    }
    let mut row = y;
    while row < rows {
        let (l, k) = divmod(row, n);
        let dst = &mut out[row * right..][..right];
        // SAFETY: n > 0 here (rows = left * n > 0), so k = row % n < n == ids.len().
        match unsafe { ids.get_unchecked(k) }.to_index(src_dim) {
            Some(id) => copy_row(&src[(l * src_dim + id) * right..][..right], dst, x, xs),
            None => zero_row(dst, x, xs),
        }
        row += ys;
    }
}

/// `out[l, i, r] = src[l, ids[l, i, r], r]` (zero for an out-of-range id), with `src`
/// contiguous `(left, src_dim, right)` and `ids`, `out` contiguous `(left, n, right)`.
/// Launch with [`rows_config`]`(left * n, right)`.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32], I = [u32, i64])]
pub fn gather<T: Pod, I: IndexType>(
    src: &[T],
    ids: &[I],
    out: &mut [T],
    left: usize,
    src_dim: usize,
    n: usize,
    right: usize,
) {
    let (Some(plane), Some(rows)) = (src_dim.checked_mul(right), left.checked_mul(n)) else { return };
    let (x, xs) = (global_idx_x(), global_size_x());
    let (mut row, ys) = grid_y();
    while row < rows {
        let l = divmod(row, n).0;
        let p = &src[l * plane..][..plane];
        let idr = &ids[row * right..][..right];
        let dst = &mut out[row * right..][..right];
        let mut r = x;
        while r < right {
            dst[r] = match idr[r].to_index(src_dim) {
                // SAFETY: id < src_dim and r < right, so id * right + r < plane == p.len().
                Some(id) => unsafe { *p.get_unchecked(id * right + r) },
                None => T::ZERO,
            };
            r += xs;
        }
        row += ys;
    }
}

/// Work-items of one [`scatter_add`](fn@scatter_add) work-group: a round holds
/// `2 * wave::size()` sources of each of `256 / wave::size()` columns.
pub const SCATTER_TILE: usize = 256;

/// Tile slots of a [`scatter_add`](fn@scatter_add) round: two sources per work-item, in
/// columns of `2 * wave::size() + 4` slots (the padding spreads the cooperative accesses,
/// 8 columns x 4 sources per warp of 32, over all 32 shared-memory banks): at most
/// `256 / lanes * (2 * lanes + 4)` = 544 slots for waves of 32 or more.
const SCATTER_SLOTS: usize = 2 * SCATTER_TILE + 32;

/// An empty tile slot of [`scatter_add`](fn@scatter_add): no source there (past `n` or
/// past the last column), or its id is out of range.
const NO_TARGET: u32 = u32::MAX;

/// Lanes of `mask` above `lane`.
#[device]
#[inline(always)]
fn lanes_above(mask: u64, lane: u32) -> u64 {
    mask & !(((1u64 << lane) << 1).wrapping_sub(1))
}

/// Highest lane of `mask`, or `none` when it is empty.
#[device]
#[inline(always)]
fn highest_lane(mask: u64, none: u32) -> u32 {
    if mask != 0 { 63 - mask.leading_zeros() } else { none }
}

/// `dst[l, ids[l, i, r], r] += src[l, i, r]` for `i` in order (out-of-range ids skipped),
/// with `dst` contiguous `(left, dst_dim, right)` and `src`, `ids` contiguous
/// `(left, n, right)`; deterministic, no atomics, bit for bit the sequential loop's result
/// (Candle's CPU order; f16/bf16 round to their type after each add, computed in `f32`).
///
/// A work-group takes `C = 256 / wave::size()` adjacent `(l, r)` columns, one wave per
/// column, and walks their sources in rounds of `2 * wave::size()`: lane `j` holds sources
/// `j` (half A) and `wave::size() + j` (half B) of the round.
/// 1. The work-group loads the round's ids and sources coalesced (C adjacent columns per
///    source row; the next round's loads go out before this round's adds) into a shared tile.
/// 2. Each lane finds, for each of its sources, the latest earlier source of the round with
///    the same destination (`prev`: a lower lane of the same half, or for half B any lane
///    of half A), and whether a later one has it too: one ballot per bit of a destination
///    row and half (12 bits for 4096 rows).
/// 3. Sources without a `prev` have the work-group load their destination's current value
///    (adjacent columns of a destination row in one access).
/// 4. The adds run in source order per destination: a source is added to its `prev`'s
///    result (a shuffle) as soon as that is final; destinations are independent, so a half
///    takes as many steps as its longest run of one destination.
/// 5. The last source of each destination has its result stored; the next round starts.
///
/// `halves` = 1 keeps half B empty (rounds of `wave::size()` sources; AMD code objects
/// always run so). A `gate` whose first word is 0 makes the launch do nothing (an empty
/// one runs it): `ops::scatter_add` passes [`scatter_claim`](fn@scatter_claim)'s flag.
/// Each destination thus sees the adds in source order with the rounding of each, and a
/// round has one dependent global access (3) for `2 * wave::size()` sources of a column,
/// where a loop per column had one per source. `dst_dim` must be below `u32::MAX` (the
/// tile keeps 32-bit destinations; otherwise nothing is written: [`ops::scatter_add`]
/// rejects such shapes). Launch with [`scatter_config`]`(left, right)` (work-groups of
/// [`SCATTER_TILE`] work-items).
#[amdgpu_kernel(T = [f32, f16, bf16], I = [u32, i64], max_threads = 256)]
pub fn scatter_add<T: Float, I: IndexType>(
    src: &[T],
    ids: &[I],
    dst: &mut [T],
    left: usize,
    n: usize,
    dst_dim: usize,
    right: usize,
    halves: u32,
    gate: &[u32],
    mut target: Shared<u32, SCATTER_SLOTS>,
    mut value: Shared<f32, SCATTER_SLOTS>,
    mut flag: Shared<u32, SCATTER_SLOTS>,
) {
    if gate.first() == Some(&0) {
        return;
    }
    let (Some(plane), Some(dplane), Some(columns)) = (n.checked_mul(right), dst_dim.checked_mul(right), left.checked_mul(right)) else { return };
    // One check up front for all accesses below (then unchecked: fewer scalar registers).
    let (Some(src_len), Some(dst_len)) = (left.checked_mul(plane), left.checked_mul(dplane)) else { return };
    if dst_dim >= NO_TARGET as usize || src.len() < src_len || ids.len() < src_len || dst.len() < dst_len {
        return;
    }
    let lanes = wave::size();
    let cols = (flat_block_dim() / lanes).min(SCATTER_TILE as u32 / lanes);
    // Work-group g (a 2-D grid, x fastest) takes columns g * cols ..
    let g = block_idx_y() as usize * grid_dim_x() as usize + block_idx_x() as usize;
    if cols == 0 || g.saturating_mul(cols as usize) >= columns {
        return;
    }
    let f = flat_thread_idx();
    // Cooperative role: sources `row` and `lanes + row` of column `c` in every round (C
    // adjacent columns per source row: coalesced), tile slots `sa` and `sb`; wave role:
    // lane `lane` of wave `wc` takes the same two sources of column `wc`, slots `ma`, `mb`.
    let (row, c) = (f / cols, f % cols);
    let coop = f < cols * lanes;
    let stride = 2 * lanes + 4;
    let sa = (c * stride + row) as usize;
    let sb = sa + lanes as usize;
    let (wc, lane) = (wave::wave_id(), wave::lane_id());
    let in_wave_role = wc < cols;
    let ma = (wc * stride + lane) as usize;
    let mb = ma + lanes as usize;
    let w = g * cols as usize + c as usize;
    let col_ok = coop && w < columns;
    let (l, r) = if col_ok { divmod(w, right) } else { (0, 0) };
    // This work-item's column: source i at src_col + i * right, destination t at dst_col + t * right.
    let (src_col, dst_col) = (l * plane + r, l * dplane + r);
    let (lanes, row) = (lanes as usize, row as usize);
    // Source `i` of this work-item's column: (destination row or NO_TARGET, value).
    let fetch = |i: usize| -> (u32, f32) {
        if col_ok && i < n {
            let k = src_col + i * right;
            // SAFETY: l < left, i < n, r < right: k < left * plane <= src.len(), ids.len().
            unsafe { (ids.get_unchecked(k).to_index(dst_dim).map_or(NO_TARGET, |d| d as u32), src.get_unchecked(k).to_f32()) }
        } else {
            (NO_TARGET, 0.0)
        }
    };
    // Sources per lane and round: 2, or 1 (`halves` = 1, and always on AMD, where the
    // second half's masks spilled gfx9's scalar registers): half B stays empty.
    let two = !cfg!(target_arch = "amdgpu") && halves >= 2;
    let step = if two { 2 * lanes } else { lanes };
    let fetch_b = |i: usize| if two { fetch(i) } else { (NO_TARGET, 0.0) };
    // Bits that tell destination rows apart.
    let bits = usize::BITS - (dst_dim.max(2) - 1).leading_zeros();
    let (mut next_a, mut next_b) = (fetch(row), fetch_b(lanes + row));
    let mut base = 0;
    while base < n {
        if coop {
            (target[sa], value[sa]) = next_a;
            (target[sb], value[sb]) = next_b;
        }
        barrier();
        (next_a, next_b) = (fetch(base + step + row), fetch_b(base + step + lanes + row));
        // 2. Matching destinations. A source's `prev` is a lane (`prev_a`, `prev_b`: same
        // half; `from_a`: half A's lane that half B's source continues, possibly this
        // lane), or none (= lane).
        let (mut ta, mut tb, mut va, mut vb) = (NO_TARGET, NO_TARGET, 0.0f32, 0.0f32);
        let (mut prev_a, mut prev_b, mut from_a, mut last_a, mut last_b) = (lane, lane, lane, true, true);
        // Half B's source is the first of its destination in half B but continues half A.
        let mut continues_a = false;
        if in_wave_role {
            (ta, va) = (target[ma], value[ma]);
            if two {
                (tb, vb) = (target[mb], value[mb]);
            }
            // Lanes whose A (B) destination equals this lane's A (B) destination, and the
            // A lanes with this lane's B destination / the B lanes with its A destination.
            let (mut aa, mut bb) = (wave::ballot(ta != NO_TARGET), wave::ballot(tb != NO_TARGET));
            let (mut ab, mut ba) = (aa, bb);
            // Two passes over the bits, one per destination of this lane (A, then B): fewer
            // masks live at once (a single pass spilled gfx9's scalar registers).
            let mut bit = 0;
            while bit < bits {
                let xa = (ta >> bit) & 1 != 0;
                let ma_bits = wave::ballot(xa);
                aa &= if xa { ma_bits } else { !ma_bits };
                if two {
                    let mb_bits = wave::ballot((tb >> bit) & 1 != 0);
                    ba &= if xa { mb_bits } else { !mb_bits };
                }
                bit += 1;
            }
            bit = 0;
            while two && bit < bits {
                let xb = (tb >> bit) & 1 != 0;
                let (ma_bits, mb_bits) = (wave::ballot((ta >> bit) & 1 != 0), wave::ballot(xb));
                bb &= if xb { mb_bits } else { !mb_bits };
                ab &= if xb { ma_bits } else { !ma_bits };
                bit += 1;
            }
            let below = (1u64 << lane) - 1;
            prev_a = highest_lane(aa & below, lane);
            prev_b = highest_lane(bb & below, lane);
            from_a = highest_lane(ab, lane);
            last_a = ta != NO_TARGET && lanes_above(aa, lane) == 0 && ba == 0;
            last_b = tb != NO_TARGET && lanes_above(bb, lane) == 0;
            continues_a = prev_b == lane && ab != 0;
            let head_b = prev_b == lane && ab == 0;
            flag[ma] = (ta != NO_TARGET && prev_a == lane) as u32;
            flag[mb] = (tb != NO_TARGET && head_b) as u32;
        }
        barrier();
        // 3. Current values of the round's destinations (first source of each).
        if coop {
            // SAFETY (both): a flagged slot holds a destination row below dst_dim, so the
            // offset is below left * dplane <= dst.len().
            if flag[sa] != 0 {
                value[sa] = unsafe { dst.get_unchecked(dst_col + target[sa] as usize * right) }.to_f32();
            }
            if two && flag[sb] != 0 {
                value[sb] = unsafe { dst.get_unchecked(dst_col + target[sb] as usize * right) }.to_f32();
            }
        }
        barrier();
        // 4. The adds, in source order per destination: half A, then half B.
        if in_wave_role {
            let mut acc_a = T::from_f32(value[ma] + va).to_f32();
            let mut done = ta == NO_TARGET || prev_a == lane;
            while wave::any(!done) {
                let p = wave::shuffle(acc_a, prev_a);
                let p_done = wave::shuffle(done as u32, prev_a) != 0;
                if !done && p_done {
                    acc_a = T::from_f32(p + va).to_f32();
                    done = true;
                }
            }
            // Half B's first source of a destination continues half A's last one with it.
            let mut acc_b = 0.0;
            if two {
                let a_last = wave::shuffle(acc_a, from_a);
                let start = if continues_a { a_last } else { value[mb] };
                acc_b = T::from_f32(start + vb).to_f32();
                let mut done = tb == NO_TARGET || prev_b == lane;
                while wave::any(!done) {
                    let p = wave::shuffle(acc_b, prev_b);
                    let p_done = wave::shuffle(done as u32, prev_b) != 0;
                    if !done && p_done {
                        acc_b = T::from_f32(p + vb).to_f32();
                        done = true;
                    }
                }
            }
            value[ma] = acc_a;
            value[mb] = acc_b;
            flag[ma] = last_a as u32;
            flag[mb] = last_b as u32;
        }
        barrier();
        // 5. Each destination's final value of the round.
        if coop {
            // SAFETY: as in 3.
            if flag[sa] != 0 {
                unsafe { *dst.get_unchecked_mut(dst_col + target[sa] as usize * right) = T::from_f32(value[sa]) };
            }
            if two && flag[sb] != 0 {
                unsafe { *dst.get_unchecked_mut(dst_col + target[sb] as usize * right) = T::from_f32(value[sb]) };
            }
        }
        // The next round's step 3 may load, in another work-item, what step 5 just stored.
        barrier_global();
        base += step;
    }
}

/// Bytes of [`scatter_add_slab`](fn@scatter_add_slab)'s ring of staged sources (with a
/// 64 KiB slab, three work-groups still share an H100 SM).
pub const SLAB_RING_BYTES: usize = 10 * 1024;

/// Columns of one [`scatter_add_slab`](fn@scatter_add_slab) work-group for elements of
/// `size` bytes: one 16-byte chunk of a destination row (4 `f32`, 8 `f16`/`bf16`).
pub const fn slab_cols(size: usize) -> usize {
    16 / size
}

/// 16-byte words of one staged source row of [`scatter_add_slab`](fn@scatter_add_slab):
/// its ids (`index_size` bytes per column), then its values.
const fn slab_row_words(elem_size: usize, index_size: usize) -> usize {
    slab_cols(elem_size) * index_size / 16 + 1
}

/// Ring stages of [`scatter_add_slab`](fn@scatter_add_slab), each a round of `lanes`
/// source rows: as many as [`SLAB_RING_BYTES`] holds, 3 to 9 (the copies of the next
/// `stages - 2` rounds are in flight while one is added).
pub const fn slab_stages(lanes: usize, elem_size: usize, index_size: usize) -> usize {
    let s = SLAB_RING_BYTES / (lanes * slab_row_words(elem_size, index_size) * 16);
    if s < 3 {
        3
    } else if s > 9 {
        9
    } else {
        s
    }
}

/// 16-byte words of shared memory [`scatter_add_slab`](fn@scatter_add_slab) takes: the
/// destination slab (`dst_dim` rows of one word) and [`slab_stages`] rounds of `lanes`
/// source rows.
pub const fn slab_words(dst_dim: usize, lanes: usize, elem_size: usize, index_size: usize) -> usize {
    dst_dim + slab_stages(lanes, elem_size, index_size) * lanes * slab_row_words(elem_size, index_size)
}

/// [`scatter_add`](fn@scatter_add) with the work-group's destination columns resident in
/// shared memory: the same result bit for bit (each destination gets its sources added in
/// source order, f16/bf16 rounded to their type after each add).
///
/// A work-group of `W` waves (`W` divides `C`) takes `C` = [`slab_cols`] adjacent columns
/// (one 16-byte chunk of each destination row); wave `w` owns `C / W` of them:
/// 1. The work-group copies its `dst_dim x C` slab of `dst` into shared memory, and the
///    sources (ids and values, `wave::size()` source rows per round) into a ring of
///    [`slab_stages`] rounds, asynchronously where the target can (`cp.async`), the later
///    rounds' copies in flight while a round is added.
/// 2. A wave takes a round in `C / W` steps of `R = wave::size() * W / C` source rows; in a
///    step, lane `j * (C / W) + c` takes source row `j` of its column `c`. Each lane
///    compares its destination with the step's other rows of its column (`R / 2`
///    shuffles). Where no two rows of a step share a destination (one vote per round),
///    every lane adds its source to the slab at once, steps in order; a step with a shared
///    destination adds its rows one after another. Each column thus sees its sources in
///    order, with no chains through shuffles; the waves' columns are independent (one
///    work-group barrier per round, for the ring).
/// 3. The slab goes back to `dst` in 16-byte stores.
///
/// `gate` as in [`scatter_add`](fn@scatter_add). Needs `right % C == 0`, 16-byte aligned
/// buffers and [`slab_words`] words of `slab` (checked by [`ops::scatter_add`], which
/// otherwise runs [`scatter_add`](fn@scatter_add)).
/// Launch with `W` waves per work-group, one work-group per `C` columns (a 2-D grid, x
/// fastest): [`slab_config`].
#[amdgpu_kernel(T = [f32, f16, bf16], I = [u32, i64], max_threads = 256)]
pub fn scatter_add_slab<T: Float, I: IndexType>(
    src: &[T],
    ids: &[I],
    dst: &mut [T],
    left: usize,
    n: usize,
    dst_dim: usize,
    right: usize,
    gate: &[u32],
    slab: SharedDyn<Words4>,
) {
    if gate.first() == Some(&0) {
        return;
    }
    // One body per wave count: its lane mapping and loops are then constants (computed at
    // run time, the divisions and unrolled-loop guards made the rounds four times slower on the H100).
    let args = (src, ids, dst, left, n, dst_dim, right, slab);
    let waves = flat_block_dim() / wave::size();
    // Past the target's bound nothing runs (and on waves of 64, where the bound is one
    // wave, the other bodies, which spilled scalar registers there, are not generated).
    if waves > slab_max_waves(wave::size()) {
        return;
    }
    match waves {
        1 => slab_body::<T, I, 1>(args),
        2 => slab_body::<T, I, 2>(args),
        4 => slab_body::<T, I, 4>(args),
        8 => slab_body::<T, I, 8>(args),
        _ => {}
    }
}

/// The arguments of [`scatter_add_slab`](fn@scatter_add_slab).
type SlabArgs<'a, T, I> = (&'a [T], &'a [I], &'a mut [T], usize, usize, usize, usize, SharedDyn<Words4>);

/// [`scatter_add_slab`](fn@scatter_add_slab) with work-groups of `W` waves.
#[device]
#[inline(always)]
fn slab_body<T: Float, I: IndexType, const W: usize>((src, ids, dst, left, n, dst_dim, right, slab): SlabArgs<'_, T, I>) {
    let cols = slab_cols(core::mem::size_of::<T>());
    let lanes = wave::size() as usize;
    let waves = W;
    let nthreads = waves * lanes;
    let row_words = slab_row_words(core::mem::size_of::<T>(), core::mem::size_of::<I>());
    let id_words = row_words - 1;
    let stages = slab_stages(lanes, core::mem::size_of::<T>(), core::mem::size_of::<I>());
    let stage_words = lanes * row_words;
    let (Some(plane), Some(dplane), Some(columns)) = (n.checked_mul(right), dst_dim.checked_mul(right), left.checked_mul(right)) else { return };
    let (Some(src_len), Some(dst_len)) = (left.checked_mul(plane), left.checked_mul(dplane)) else { return };
    // Uniform checks that make every access below in bounds and every copy aligned.
    let aligned = (src.as_ptr() as usize | ids.as_ptr() as usize | dst.as_ptr() as usize) % 16 == 0;
    if dst_dim >= u32::MAX as usize
        || right % cols != 0
        || !aligned
        || src.len() < src_len
        || ids.len() < src_len
        || dst.len() < dst_len
        || slab.len() < dst_dim + stages * stage_words
        || flat_block_dim() as usize != nthreads
        || cols % waves != 0
    {
        return;
    }
    let g = block_idx_y() as usize * grid_dim_x() as usize + block_idx_x() as usize;
    if g.saturating_mul(cols) >= columns {
        return;
    }
    let (l, r0) = divmod(g * cols, right);
    let (src0, dst0) = (l * plane + r0, l * dplane + r0);
    let tid = flat_thread_idx() as usize;
    let base = SharedAddr::new(slab.as_ptr());
    let ring = base.add(dst_dim * 16);
    // 1. The slab (group 0), then the first rounds (one group each).
    let mut t = tid;
    while t < dst_dim {
        // SAFETY: row t < dst_dim of this group's columns: dst0 + t * right + cols <= dst_len
        // (right % cols == 0, r0 + cols <= right); 16-byte aligned (aligned base, right and
        // r0 multiples of cols = 16 bytes); slab word t < slab.len().
        unsafe { copy::copy_16_whole_at(base.add(t * 16), dst.as_ptr().add(dst0 + t * right) as *const u8) };
        t += nthreads;
    }
    copy::commit();
    // The copies of round `k` into its ring stage: this work-item copies words `tid + m *
    // nthreads` of the stage, word q being part `q % row_words` of source row `k * lanes +
    // q / row_words` (id chunks, then the values). Addresses use wrapping arithmetic:
    // dereferenced only for rows i < n.
    let issue = |k: usize| {
        let mut q = tid;
        while q < stage_words {
            let (row, part) = (q / row_words, q % row_words);
            let i = k * lanes + row;
            if i < n {
                let from = if part < id_words {
                    (ids.as_ptr().wrapping_add(src0 + i * right) as *const u8).wrapping_add(part * 16)
                } else {
                    src.as_ptr().wrapping_add(src0 + i * right) as *const u8
                };
                // SAFETY: source row i < n of this group's columns: inside `ids` / `src`
                // (src0 + i * right + cols <= src_len); 16-byte aligned as above; word q <
                // stage_words of round k's stage.
                unsafe { copy::copy_16_whole_at(ring.add(((k % stages) * stage_words + q) * 16), from) };
            }
            q += nthreads;
        }
        copy::commit();
    };
    let mut k = 0;
    while k + 1 < stages {
        issue(k);
        k += 1;
    }
    // 2. The rounds. Keys: the destination row, or `dst_dim` for none. This lane: row j of
    // each step, column c of the group (the wave's columns are wave_cols from its first).
    let none = dst_dim as u32;
    let wave_cols = cols / waves;
    let steps_rows = lanes / wave_cols;
    let lane = wave::lane_id() as usize;
    let (j, lc) = (lane / wave_cols, lane % wave_cols);
    let c = wave::wave_id() as usize * wave_cols + lc;
    // Plain accesses go through the kernel's own shared pointer (shared-memory loads and
    // stores; the copies take the 32-bit addresses of `base`).
    let words = slab.as_ptr();
    let slab_t = words as *mut T;
    // Source `s` (step s, row j, column c) of round k: (key, value).
    let read = |k: usize, s: usize| -> (u32, f32) {
        let row = s * steps_rows + j;
        if k * lanes + row >= n {
            return (none, 0.0);
        }
        // SAFETY: word `row * row_words` of round k's stage holds the ids of source row
        // `k * lanes + row` (column c at element c), word `+ id_words` its values.
        unsafe {
            let at = words.add(dst_dim + (k % stages) * stage_words + row * row_words) as *const Words4;
            let key = (*(at as *const I).add(c)).to_index(dst_dim).map_or(none, |d| d as u32);
            (key, (*(at.add(id_words) as *const T).add(c)).to_f32())
        }
    };
    // dst[key] += v in the slab (T's rounding).
    let add = |key: u32, v: f32| {
        if key != none {
            // SAFETY: key < dst_dim: slab element key * cols + c.
            unsafe {
                let p = slab_t.add(key as usize * cols + c);
                *p = T::from_f32((*p).to_f32() + v);
            }
        }
    };
    let rounds = n.div_ceil(lanes);
    k = 0;
    while k < rounds {
        // Round k's group has stages - 2 younger ones; the barrier makes every work-item's
        // copies visible, and the stage read last round takes round k + stages - 1.
        copy::wait_groups((stages - 2) as u32);
        barrier();
        // The wave's steps of the round (`C / W` <= 8 of them), unrolled: the arrays stay
        // in registers.
        let mut key = [none; 8];
        let mut val = [0.0f32; 8];
        crate::each_lane!(s, {
            if s < wave_cols {
                (key[s], val[s]) = read(k, s);
            }
        });
        issue(k + stages - 1);
        // Steps (bits) where this lane's destination recurs among the step's rows of its
        // column (rotations by 1..=R/2 rows cover every pair).
        let mut shared = 0u32;
        crate::each_lane!(s, {
            if s < wave_cols {
                let mut d = 1;
                while d <= steps_rows / 2 {
                    let other = wave::shuffle(key[s], (((j + d) % steps_rows) * wave_cols + lc) as u32);
                    if key[s] != none && other == key[s] {
                        shared |= 1 << s;
                    }
                    d += 1;
                }
            }
        });
        let any_shared = wave::ballot(shared != 0) != 0;
        crate::each_lane!(s, {
            if s < wave_cols {
                if !any_shared || !wave::any(shared & (1 << s) != 0) {
                    add(key[s], val[s]);
                } else {
                    // The step's rows one after another.
                    let mut row = 0;
                    while row < steps_rows {
                        if row == j {
                            add(key[s], val[s]);
                        }
                        wave::sync();
                        row += 1;
                    }
                }
                // The next step may read what this one stored (another lane).
                wave::sync();
            }
        });
        k += 1;
    }
    // 3. The slab back to `dst`.
    copy::wait_groups(0);
    barrier();
    let mut t = tid;
    while t < dst_dim {
        // SAFETY: as in 1.
        unsafe { st4(dst.as_mut_ptr().add(dst0 + t * right) as *mut Words4, ld4(words.add(t))) };
        t += nthreads;
    }
}

/// Elements per work-item and round of [`scatter_add_unordered`](fn@scatter_add_unordered)
/// (the kernel's `each!` lists write out its slots 0..4).
pub const UNORDERED_ROUND: usize = 4;

/// [`scatter_add`](fn@scatter_add) for `f32` with every element in parallel: each adds
/// itself to its destination with an atomic add (`red.add.f32` on NVIDIA, a
/// compare-and-swap loop elsewhere; NVIDIA's flushes subnormal values to zero, as CUDA's
/// `atomicAdd` and so PyTorch do), so the order of the
/// additions to one destination is unspecified and sums may differ in the last bits from
/// run to run (PyTorch's CUDA `scatter_add_` behaves the same way). Out-of-range ids are
/// skipped. Any 1-D launch of work-groups of at most 256 is correct;
/// [`elements_config`]`(left * n * right / UNORDERED_ROUND)` fills the GPU (the 256 bound
/// leaves ptxas the registers of the four-element rounds: it spilled 12 bytes at 1024).
#[amdgpu_kernel(I = [u32, i64], max_threads = 256)]
pub fn scatter_add_unordered<I: IndexType>(src: &[f32], ids: &[I], dst: &[AtomicF32], left: usize, n: usize, dst_dim: usize, right: usize) {
    let (Some(rows), Some(dplane)) = (left.checked_mul(n), dst_dim.checked_mul(right)) else { return };
    let Some(total) = rows.checked_mul(right) else { return };
    let (src, ids) = (&src[..total], &ids[..total]);
    let dst = &dst[..left * dplane];
    let step = global_size_x();
    let mut e = global_idx_x();
    // Four elements a grid apart per round: their id and value loads are all in flight
    // before the first add (one element at a time waited on the id, then on the value).
    while e < total {
        let mut id = [None; UNORDERED_ROUND];
        let mut v = [0.0f32; UNORDERED_ROUND];
        kernel_dsl::each!(k in [0, 1, 2, 3] {
            let ek = e + k * step;
            if ek < total {
                // SAFETY: ek < total == ids.len() == src.len().
                unsafe {
                    id[k] = ids.get_unchecked(ek).to_index(dst_dim);
                    v[k] = *src.get_unchecked(ek);
                }
            }
        });
        kernel_dsl::each!(k in [0, 1, 2, 3] {
            if let Some(t) = id[k] {
                let (row, r) = divmod(e + k * step, right);
                let l = divmod(row, n).0;
                // SAFETY: l < left, t < dst_dim, r < right: the offset is below left * dplane.
                unsafe { dst.get_unchecked(l * dplane + t * right + r) }.add(v[k]);
            }
        });
        e += UNORDERED_ROUND * step;
    }
}

/// Columns of one chunk of [`scatter_claim`](fn@scatter_claim): one word of its bitset,
/// claimed by 32 lanes together.
pub const CLAIM_CHUNK: usize = 32;

/// The code [`scatter_claim`](fn@scatter_claim) gives a chunk whose destinations are not
/// its elements' positions plus one offset (ids that differ along the chunk, an
/// out-of-range id, a chunk cut by the end of its row): [`scatter_add_claimed`](fn@scatter_add_claimed)
/// reads its ids again.
pub const CLAIM_MIXED: u32 = u32::MAX;

/// Source rows per work-item and round of [`scatter_claim`](fn@scatter_claim) (the
/// kernel's `each!` lists write out slots 0..2).
pub const CLAIM_ROUND: usize = 2;

/// Columns of one [`scatter_claim`](fn@scatter_claim) work-item (its `each!` lists write
/// out 0..8).
const CLAIM_COLS: usize = 8;

/// Work-items of one [`scatter_claim`](fn@scatter_claim) chunk, and the mask of their lanes.
const CLAIM_LANES: u32 = (CLAIM_CHUNK / CLAIM_COLS) as u32;
const CLAIM_LANES_MASK: u32 = (1 << CLAIM_LANES) - 1;

/// A work-item's ids, aligned for vector loads (two of 16 bytes for `u32`, four for `i64`).
#[repr(C, align(16))]
struct ClaimIds<I>([I; CLAIM_COLS]);

/// The first pass of the ordered `scatter_add` where no two sources may share a
/// destination: finds whether any do, and codes each chunk's destinations compactly.
///
/// With `q(e)` the destination offset of source element `e` (`(l, i, r)` to
/// `(l, ids[e], r)`, contiguous layouts as in [`scatter_add`](fn@scatter_add)), every
/// source sets bit `q(e)` of `seen` (a zeroed bitset over `dst`) with an atomic OR; one
/// that finds its bit already set sets `flag[0]` (two sources share a destination: their
/// order of additions matters). A work-item takes eight adjacent columns of
/// [`CLAIM_ROUND`] source rows per round (vector loads of ids where rows are whole aligned
/// groups of eight); 32 adjacent columns of a row form a chunk (four work-items;
/// `ceil(right / 32)` chunks per row, `code` row-major over them). Where a chunk's 32 ids
/// are one in-range id (as when ids are broadcast along a row), its destinations are
/// `e + d` for one `d`: its first work-item claims all 32 bits with one or two atomics and
/// writes `code[chunk] = d`; otherwise each work-item claims its own eight (one or two
/// atomics when its ids are one id, else one per element) and the chunk's code is
/// [`CLAIM_MIXED`]. Once `flag[0]` is set, work-items stop at their next round (`code`
/// is then unused).
///
/// Needs `left * n * right` and `left * dst_dim * right` below 2^32, work-groups whose x
/// size is a multiple of the wave size (a wave then lies along one row), `seen` of
/// `ceil(left * dst_dim * right / 32)` zeroed words, `code` of `left * n * ceil(right /
/// 32)` words and one `flag` word holding 0; anything else sets `flag[0]` (so the ordered
/// kernel runs instead). Any grid of such work-groups covers every element;
/// [`claim_config`] fills the GPU. Out-of-range ids claim nothing.
#[amdgpu_kernel(I = [u32, i64], max_threads = 256)]
pub fn scatter_claim<I: IndexType>(ids: &[I], seen: &[AtomicU32], code: &mut [u32], flag: &[AtomicU32], left: usize, n: usize, dst_dim: usize, right: usize) {
    let Some(fl) = flag.first() else { return };
    let rows = left.checked_mul(n);
    let total = rows.and_then(|v| v.checked_mul(right));
    let dst_len = left.checked_mul(dst_dim).and_then(|v| v.checked_mul(right));
    let (Some(rows), Some(total), Some(dst_len)) = (rows, total, dst_len) else {
        fl.store(1, Ordering::Relaxed);
        return;
    };
    let cw = right.div_ceil(CLAIM_CHUNK);
    if total >= u32::MAX as usize
        || dst_len >= u32::MAX as usize
        || block_dim_x() % wave::size() != 0
        || ids.len() < total
        || seen.len() < dst_len.div_ceil(32)
        || code.len() < rows * cw
    {
        fl.store(1, Ordering::Relaxed);
        return;
    }
    if total == 0 {
        return;
    }
    // Everything below fits in 32 bits (n, right > 0 once total > 0).
    let (right32, n32, dplane32, dst32) = (right as u32, n as u32, (dst_dim * right) as u32, dst_dim as u32);
    // Whole rows of aligned groups of ids: vector loads (else one load per id).
    let groups_vec = right % CLAIM_COLS == 0 && (ids.as_ptr() as usize) % 16 == 0;
    let lane = wave::lane_id();
    let kg = lane % CLAIM_LANES;
    let glead = lane - kg;
    let (x, xs) = (global_idx_x(), global_size_x());
    let (y, ys) = grid_y();
    // This work-item: columns CLAIM_COLS * x .. of its rows; the wave's first group decides
    // the loops (wave-uniform: a wave lies along a row).
    let mut group = x;
    while (group - lane as usize) * CLAIM_COLS < right {
        let col = group * CLAIM_COLS;
        let chunk_col = col - kg as usize * CLAIM_COLS;
        let mut row0 = y * CLAIM_ROUND;
        while row0 < rows {
            // This work-item's ids in each of the round's rows (NO_TARGET: none, or out of range).
            let mut t = [[NO_TARGET; CLAIM_COLS]; CLAIM_ROUND];
            kernel_dsl::each!(k in [0, 1] {
                if row0 + k < rows && col < right {
                    let e = (row0 + k) * right + col;
                    if groups_vec {
                        // SAFETY: col + CLAIM_COLS <= right (a multiple of it): e +
                        // CLAIM_COLS <= total <= ids.len(); aligned (aligned start, e a
                        // multiple of CLAIM_COLS: 32 or 64 bytes).
                        let v = unsafe { core::ptr::read(ids.as_ptr().add(e) as *const ClaimIds<I>) }.0;
                        kernel_dsl::each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                            t[k][j] = v[j].to_row32(dst32);
                        });
                    } else {
                        kernel_dsl::each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if col + j < right {
                                // SAFETY: e + j < total <= ids.len().
                                t[k][j] = unsafe { ids.get_unchecked(e + j) }.to_row32(dst32);
                            }
                        });
                    }
                }
            });
            // A shared destination found elsewhere ends the pass (checked once the round's
            // loads are out, so its own load waits beside theirs).
            if wave::shuffle(fl.load(Ordering::Relaxed), glead) != 0 {
                return;
            }
            // (32-bit division: row0 < rows < 2^32.)
            let (mut l, mut i) = crate::dtype::divmod32(row0 as u32, n32);
            // Previous words and the bits claimed in them by the one- and two-word claims
            // (ANDed only after the round: their atomics all go out first); the claims of
            // single elements (mixed ids, the rare case) are checked as they return.
            let mut old = [[0u32; 2]; CLAIM_ROUND];
            let mut bits = [[0u32; 2]; CLAIM_ROUND];
            let mut shared = 0u32;
            kernel_dsl::each!(k in [0, 1] {
                let row = row0 + k;
                let tk = t[k];
                // This work-item's ids are one id (and all inside the row).
                let mut own_one = tk[0] != NO_TARGET;
                kernel_dsl::each!(j in [1, 2, 3, 4, 5, 6, 7] {
                    own_one &= tk[j] == tk[0];
                });
                let t0 = wave::shuffle(tk[0], glead);
                // All work-items of the chunk: 32 destinations e + d.
                let one_id = (wave::ballot(own_one && tk[0] == t0) >> glead) as u32 & CLAIM_LANES_MASK == CLAIM_LANES_MASK;
                let base = l.wrapping_mul(dplane32).wrapping_add(col as u32);
                let at = row * cw + chunk_col / CLAIM_CHUNK;
                if one_id {
                    if kg == 0 {
                        let q = base.wrapping_add(tk[0].wrapping_mul(right32));
                        let e = (row as u32).wrapping_mul(right32).wrapping_add(col as u32);
                        // Destinations q .. q + 32 (all below dst_len): one or two words.
                        let (w, sh) = ((q / 32) as usize, q % 32);
                        bits[k][0] = u32::MAX << sh;
                        // SAFETY: q + 31 < dst_len, so word w and (when the range crosses
                        // into it) w + 1 are below ceil(dst_len / 32) <= seen.len(); the
                        // chunk (row < rows, inside the row) is below rows * cw <= code.len().
                        unsafe {
                            old[k][0] = seen.get_unchecked(w).fetch_or(bits[k][0], Ordering::Relaxed);
                            if sh != 0 {
                                bits[k][1] = !bits[k][0];
                                old[k][1] = seen.get_unchecked(w + 1).fetch_or(bits[k][1], Ordering::Relaxed);
                            }
                            *code.get_unchecked_mut(at) = q.wrapping_sub(e);
                        }
                    }
                } else {
                    if own_one {
                        // CLAIM_COLS adjacent destinations: one word, or two.
                        let q = base.wrapping_add(tk[0].wrapping_mul(right32));
                        let (w, sh) = ((q / 32) as usize, q % 32);
                        const OWN: u32 = (1 << CLAIM_COLS) - 1;
                        bits[k][0] = OWN << sh;
                        // SAFETY: q + CLAIM_COLS - 1 < dst_len: words below seen.len() as above.
                        unsafe {
                            old[k][0] = seen.get_unchecked(w).fetch_or(bits[k][0], Ordering::Relaxed);
                            if sh > 32 - CLAIM_COLS as u32 {
                                bits[k][1] = OWN >> (32 - sh);
                                old[k][1] = seen.get_unchecked(w + 1).fetch_or(bits[k][1], Ordering::Relaxed);
                            }
                        }
                    } else {
                        kernel_dsl::each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if tk[j] != NO_TARGET {
                                let q = base.wrapping_add(tk[j].wrapping_mul(right32)).wrapping_add(j as u32);
                                let bit = 1u32 << (q % 32);
                                // SAFETY: q < dst_len: word q / 32 < seen.len().
                                shared |= unsafe { seen.get_unchecked((q / 32) as usize) }.fetch_or(bit, Ordering::Relaxed) & bit;
                            }
                        });
                    }
                    if kg == 0 && row < rows && chunk_col < right {
                        // SAFETY: row < rows, chunk_col < right: at < rows * cw <= code.len().
                        unsafe { *code.get_unchecked_mut(at) = CLAIM_MIXED };
                    }
                }
                // The next row's (l, i).
                i += 1;
                while i >= n32 {
                    i -= n32;
                    l += 1;
                }
            });
            let _ = (l, i);
            kernel_dsl::each!(k in [0, 1] {
                shared |= (old[k][0] & bits[k][0]) | (old[k][1] & bits[k][1]);
            });
            if shared != 0 {
                fl.store(1, Ordering::Relaxed);
            }
            row0 += ys * CLAIM_ROUND;
        }
        group += xs;
    }
}

/// The second pass of the ordered `scatter_add` where [`scatter_claim`](fn@scatter_claim)
/// found no shared destination (`flag[0] == 0`; otherwise it does nothing and the ordered
/// kernel, gated on the same flag, runs): every source is the only one of its destination,
/// so all are added in parallel, `dst[q(e)] = T(dst[q(e)] + src[e])` (the sequential
/// loop's result bit for bit: one rounding per destination). A work-item takes pieces of
/// [`CHUNK`](crate::row::CHUNK) columns of a row: where the piece's chunk has a code
/// `d` (not [`CLAIM_MIXED`]) and the rows are whole 16-byte pieces (`right` a multiple of
/// 8, aligned buffers, `d` a multiple of 8), source and destination move as vectors;
/// otherwise element by element, destinations from the ids (out-of-range ids skipped).
/// Same arguments as the claim; if they do not match what it needs, this sets `flag[0]`
/// instead of adding anything. Any launch is correct; [`claimed_config`] fills the GPU.
#[amdgpu_kernel(T = [f32, f16, bf16], I = [u32, i64], max_threads = 256)]
pub fn scatter_add_claimed<T: Float, I: IndexType>(
    src: &[T],
    ids: &[I],
    dst: &mut [T],
    code: &[u32],
    flag: &[AtomicU32],
    left: usize,
    n: usize,
    dst_dim: usize,
    right: usize,
) {
    use crate::row::{load_full, store_full, vectorizable, CHUNK};
    let Some(fl) = flag.first() else { return };
    if fl.load(Ordering::Relaxed) != 0 {
        return;
    }
    let rows = left.checked_mul(n);
    let total = rows.and_then(|v| v.checked_mul(right));
    let dplane = dst_dim.checked_mul(right);
    let dst_len = dplane.and_then(|v| v.checked_mul(left));
    let (Some(rows), Some(total), Some(dplane), Some(dst_len)) = (rows, total, dplane, dst_len) else {
        fl.store(1, Ordering::Relaxed);
        return;
    };
    let cw = right.div_ceil(CLAIM_CHUNK);
    if total >= u32::MAX as usize || dst_len >= u32::MAX as usize || src.len() < total || ids.len() < total || dst.len() < dst_len || code.len() < rows * cw {
        fl.store(1, Ordering::Relaxed);
        return;
    }
    let (src, ids, dst) = (&src[..total], &ids[..total], &mut dst[..dst_len]);
    let vec = right % CHUNK == 0 && vectorizable(src.as_ptr()) && vectorizable(dst.as_ptr());
    let pieces = right.div_ceil(CHUNK);
    let (x, xs) = (global_idx_x(), global_size_x());
    let (mut row, ys) = grid_y();
    while row < rows {
        // (32-bit division: row < rows < 2^32.)
        let l = crate::dtype::divmod32(row as u32, n as u32).0 as usize;
        let mut p = x;
        while p < pieces {
            let r0 = p * CHUNK;
            let e0 = row * right + r0;
            // SAFETY: row < rows, r0 < right: the chunk index is below rows * cw <= code.len().
            let cd = unsafe { *code.get_unchecked(row * cw + r0 / CLAIM_CHUNK) };
            let q0 = (e0 as u32).wrapping_add(cd) as usize;
            if vec && cd != CLAIM_MIXED && cd as usize % CHUNK == 0 && q0 + CHUNK <= dst_len {
                // SAFETY: e0 + CHUNK <= total (right % CHUNK == 0) and q0 + CHUNK <= dst_len
                // (checked); both multiples of CHUNK in 16-byte aligned buffers.
                unsafe {
                    let (s, d) = (load_full(src, e0, true), load_full(dst, q0, true));
                    let mut v = [0.0f32; CHUNK];
                    crate::each_lane!(j, {
                        v[j] = d[j] + s[j];
                    });
                    store_full(dst, q0, &v, true);
                }
            } else {
                crate::each_lane!(j, {
                    let r = r0 + j;
                    if r < right {
                        // SAFETY: e0 + j < total.
                        if let Some(t) = unsafe { ids.get_unchecked(e0 + j) }.to_index(dst_dim) {
                            let q = l * dplane + t * right + r;
                            // SAFETY: l < left, t < dst_dim, r < right: q < dst_len; e0 + j < total.
                            unsafe {
                                let o = dst.get_unchecked_mut(q);
                                *o = T::from_f32(o.to_f32() + src.get_unchecked(e0 + j).to_f32());
                            }
                        }
                    }
                });
            }
            p += xs;
        }
        row += ys;
    }
}

/// `dst[l, ids[i], r] += src[l, i, r]` for `i` in order (out-of-range ids skipped), with
/// `dst` contiguous `(left, dst_dim, right)`, `src` contiguous `(left, ids.len(), right)`.
/// Same strategy and rounding as [`scatter_add`](fn@scatter_add). Launch with [`rows_config`]`(left, right)`.
#[amdgpu_kernel(T = [f32, f16, bf16], I = [u32, i64])]
pub fn index_add<T: Float, I: IndexType>(src: &[T], ids: &[I], dst: &mut [T], left: usize, dst_dim: usize, right: usize) {
    let n = ids.len();
    let (Some(plane), Some(dplane)) = (n.checked_mul(right), dst_dim.checked_mul(right)) else { return };
    let (x, xs) = (global_idx_x(), global_size_x());
    let (mut l, ys) = grid_y();
    while l < left {
        let s = &src[l * plane..][..plane];
        let d = &mut dst[l * dplane..][..dplane];
        let mut r = x;
        while r < right {
            let mut i = 0;
            while i < n {
                if let Some(id) = ids[i].to_index(dst_dim) {
                    // SAFETY: i < n and r < right, so i * right + r < plane == s.len(); id <
                    // dst_dim, so id * right + r < dplane == d.len().
                    unsafe {
                        let o = d.get_unchecked_mut(id * right + r);
                        *o = T::from_f32(o.to_f32() + s.get_unchecked(i * right + r).to_f32());
                    }
                }
                i += 1;
            }
            r += xs;
        }
        l += ys;
    }
}

/// `out[i] = if cond[i] != 0 { on_true[i] } else { on_false[i] }`, each input read through
/// its own layout (`[dims..., strides...]` with the output's element count, a stride of 0
/// broadcasts; empty: contiguous). All contiguous with 16-byte aligned values: each
/// work-item selects 16 bytes per step by bit masks. Launch with
/// [`elements_config`]`(out.len())` (or `out.len() / lanes` for the 16-byte path).
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32], C = [u8, u32])]
pub fn where_cond<T: Pod, C: CondType>(
    cond: &[C],
    cond_layout: &[usize],
    on_true: &[T],
    true_layout: &[usize],
    on_false: &[T],
    false_layout: &[usize],
    out: &mut [T],
) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    if cond_layout.is_empty() && true_layout.is_empty() && false_layout.is_empty() {
        let (c, t, f) = (&cond[..n], &on_true[..n], &on_false[..n]);
        let size = core::mem::size_of::<T>();
        let mut done = 0;
        if 4 % size == 0 && (t.as_ptr() as usize | f.as_ptr() as usize | out.as_ptr() as usize) % 16 == 0 {
            // 16 bytes of each value input per work-item and step, selected word by word
            // with a bit mask built from the conditions (bits pass through untouched).
            let per_word = 4 / size;
            let lanes = 4 * per_word;
            let elem_bits = if size == 4 { u32::MAX } else { (1u32 << (8 * size)) - 1 };
            let blocks = n / lanes;
            let mut b = i;
            while b < blocks {
                // SAFETY: (b + 1) * lanes <= n for all four slices; the value slices start on
                // 16 bytes and `lanes` elements are 16 bytes, so each block is aligned.
                unsafe {
                    let cs = c.as_ptr().add(b * lanes);
                    let tp = t.as_ptr().add(b * lanes) as *const Words4;
                    let fp = f.as_ptr().add(b * lanes) as *const Words4;
                    let op = out.as_mut_ptr().add(b * lanes) as *mut Words4;
                    // Whole blocks first, so each is one 16-byte access.
                    let (tv, fv) = (ld4(tp), ld4(fp));
                    let mut r = [0u32; 4];
                    let mut w = 0;
                    while w < 4 {
                        let mut mask = 0u32;
                        let mut j = 0;
                        while j < per_word {
                            if (*cs.add(w * per_word + j)).is_true() {
                                mask |= elem_bits << (8 * size * j);
                            }
                            j += 1;
                        }
                        r[w] = (tv[w] & mask) | (fv[w] & !mask);
                        w += 1;
                    }
                    st4(op, r);
                }
                b += step;
            }
            done = blocks * lanes;
        }
        i += done;
        while i < n {
            out[i] = if c[i].is_true() { t[i] } else { f[i] };
            i += step;
        }
    } else {
        while i < n {
            out[i] = if cond[view_offset(i, cond_layout)].is_true() {
                on_true[view_offset(i, true_layout)]
            } else {
                on_false[view_offset(i, false_layout)]
            };
            i += step;
        }
    }
}

/// `dst[dst_off + i * dst_stride + j] = src[src_off + i * src_stride + j]` for `i < d1`,
/// `j < d2` (Candle's `copy2d`, used for `cat` and slice assignment). Launch with
/// [`rows_config`]`(d1, d2 / lanes)`.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32])]
pub fn copy2d<T: Pod>(
    src: &[T],
    dst: &mut [T],
    d1: usize,
    d2: usize,
    src_stride: usize,
    dst_stride: usize,
    src_off: usize,
    dst_off: usize,
) {
    let (x, xs) = (global_idx_x(), global_size_x());
    let (mut i, ys) = grid_y();
    while i < d1 {
        let (s, d) = (src_off + i * src_stride, dst_off + i * dst_stride);
        copy_row(&src[s..s + d2], &mut dst[d..d + d2], x, xs);
        i += ys;
    }
}

/// Inputs one [`cat_rows`](fn@cat_rows) launch copies.
pub const CAT_INPUTS: usize = 4;

/// Up to [`CAT_INPUTS`] inputs of a concatenation in one launch: `out` holds `rows` rows
/// of `out_width` elements; row `i` of input `k` (`w_k` elements, contiguous `(rows, w_k)`)
/// goes to `out[i * out_width + at + w_0 + .. + w_{k-1} ..]`. The grid's z index picks the
/// input (unused inputs are empty with width 0), so a work-group copies one input like
/// [`copy2d`](fn@copy2d), as 16-byte blocks when both rows are aligned (then a work-item
/// moves its block of two rows a grid apart per step, loads before stores). Any grid is
/// correct; [`ops::cat`] launches [`rows_config`]`(rows, widest input row in units)` with
/// grid z = the number of inputs and, for aligned rows, half the y groups.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32], max_threads = 256)]
pub fn cat_rows<T: Pod>(
    a: &[T],
    b: &[T],
    c: &[T],
    d: &[T],
    out: &mut [T],
    rows: usize,
    out_width: usize,
    at: usize,
    wa: usize,
    wb: usize,
    wc: usize,
    wd: usize,
) {
    let k = block_idx_z();
    let (src, w, off) = match k {
        0 => (a, wa, 0),
        1 => (b, wb, wa),
        2 => (c, wc, wa + wb),
        3 => (d, wd, wa + wb + wc),
        _ => return,
    };
    let (x, xs) = (global_idx_x(), global_size_x());
    let (mut i, ys) = grid_y();
    let size = core::mem::size_of::<T>();
    // Rows of whole aligned 16-byte units on both sides (the usual case): each work-item
    // moves its unit of two rows a grid apart per step, both loads before both stores.
    let start = at + off;
    let whole = 16 % size == 0
        && (w * size) % 16 == 0
        && (out_width * size) % 16 == 0
        && (start * size) % 16 == 0
        && (src.as_ptr() as usize | out.as_ptr() as usize) % 16 == 0;
    let fits = rows.checked_mul(w).is_some_and(|n| n <= src.len())
        && (rows - 1).checked_mul(out_width).and_then(|v| v.checked_add(start + w)).is_some_and(|n| n <= out.len());
    if whole && fits && w > 0 {
        let lanes = 16 / size;
        let units = w / lanes;
        while i < rows {
            let i2 = i + ys;
            let two = i2 < rows;
            let mut c = x;
            while c < units {
                let e = c * lanes;
                // SAFETY: rows i, i2 < rows and e + lanes <= w: inside src (rows * w <= len)
                // and inside out ((rows - 1) * out_width + start + w <= len); every unit
                // starts 16-byte aligned (aligned buffers, widths, offsets in whole units).
                unsafe {
                    let a = ld4(src.as_ptr().add(i * w + e) as *const Words4);
                    let b = if two { ld4(src.as_ptr().add(i2 * w + e) as *const Words4) } else { a };
                    st4(out.as_mut_ptr().add(i * out_width + start + e) as *mut Words4, a);
                    if two {
                        st4(out.as_mut_ptr().add(i2 * out_width + start + e) as *mut Words4, b);
                    }
                }
                c += xs;
            }
            i += 2 * ys;
        }
        return;
    }
    while i < rows {
        let base = i * out_width + start;
        copy_row(&src[i * w..][..w], &mut out[base..][..w], x, xs);
        i += ys;
    }
}

/// Launch shape of [`scatter_add`](fn@scatter_add) for `left * right` columns: work-groups
/// of [`SCATTER_TILE`] work-items, one per 4 columns (a work-group takes 8 columns on waves
/// of 32, 4 on waves of 64; groups past the last column return at once), in a 2-D grid of
/// at most 65535 x 65535 groups.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn scatter_config(left: usize, right: usize) -> kernel_dsl::host::LaunchConfig {
    let groups = left.saturating_mul(right).div_ceil(4).max(1);
    let (gx, gy) = (groups.min(65535), groups.div_ceil(65535).min(65535));
    kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::new(gx as u32, gy as u32, 1), kernel_dsl::Dim3::x(SCATTER_TILE as u32))
}

/// Most work-items of a [`scatter_add_slab`](fn@scatter_add_slab) work-group (its launch
/// bound: at 512, ptxas held the kernel to 64 registers and spilled).
pub const SLAB_MAX_THREADS: u32 = 256;

/// Most waves of `lanes` lanes per [`scatter_add_slab`](fn@scatter_add_slab) work-group:
/// within [`SLAB_MAX_THREADS`], and 1 on waves of 64 (with more, gfx90a/gfx942/gfx950
/// spilled scalar registers).
pub const fn slab_max_waves(lanes: u32) -> u32 {
    if lanes >= 64 {
        1
    } else {
        SLAB_MAX_THREADS / lanes
    }
}

/// Waves per work-group [`ops::scatter_add`] launches [`scatter_add_slab`](fn@scatter_add_slab)
/// with, for elements of `elem_size` bytes on waves of `lanes`: one column per wave for
/// 16-bit types (8 waves on waves of 32), two for `f32`. Measured on the H100 (the
/// benchmark's 4096 x 4096 table, waves 1/2/4/8): bf16 376/261/176/166 us, f32
/// 334/278/295 us. f32 moves twice the bytes per column, in 16-byte pieces strided across
/// rows; more waves did not help it.
pub const fn slab_waves(elem_size: usize, lanes: u32) -> u32 {
    let waves = if elem_size == 4 { 2 } else { slab_cols(elem_size) as u32 };
    let most = slab_max_waves(lanes);
    if waves < most { waves } else { most }
}

/// Launch shape of [`scatter_add_slab`](fn@scatter_add_slab) on waves of `lanes`: one
/// work-group of `waves` waves per `C` = [`slab_cols`] columns (2-D grid), with
/// [`slab_words`] of shared memory; `None` when `right % C != 0`, `waves` does not divide
/// `C` or exceeds [`slab_max_waves`], or the grid is too large.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn slab_config<T, I>(left: usize, dst_dim: usize, right: usize, lanes: u32, waves: u32) -> Option<kernel_dsl::host::LaunchConfig> {
    use core::mem::size_of;
    let cols = slab_cols(size_of::<T>());
    let groups = left.checked_mul(right)? / cols;
    let (gx, gy) = (groups.clamp(1, 65535), groups.div_ceil(65535));
    if right % cols != 0 || gy > 65535 || waves == 0 || cols % waves as usize != 0 || waves > slab_max_waves(lanes) {
        return None;
    }
    let block = kernel_dsl::Dim3::x(lanes * waves);
    let words = slab_words(dst_dim, lanes as usize, size_of::<T>(), size_of::<I>());
    Some(kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::new(gx as u32, gy.max(1) as u32, 1), block).with_dynamic_shared(words))
}

/// Work-items per work-group of every launch here.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub const BLOCK: u32 = 256;

/// Launch shape for `rows` rows of `units` work units each (elements, or 16-byte blocks for
/// row copies): work-groups of [`BLOCK`] work-items, `x` along a row (a power of two, at most
/// `units` rounded up), `y` across rows; at most 65535 groups per dimension (the kernels
/// loop over the rest).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn rows_config(rows: usize, units: usize) -> kernel_dsl::host::LaunchConfig {
    use kernel_dsl::Dim3;
    let bx = units.max(1).next_power_of_two().min(BLOCK as usize);
    let by = BLOCK as usize / bx;
    let gx = units.div_ceil(bx).clamp(1, 65535);
    let gy = rows.div_ceil(by).clamp(1, 65535);
    kernel_dsl::host::LaunchConfig::new(Dim3::new(gx as u32, gy as u32, 1), Dim3::new(bx as u32, by as u32, 1))
}

/// Launch shape for `n` elements, one per work-item and step: `ceil(n / 256)` groups of
/// [`BLOCK`], at most 65536 (the kernel loops over the rest).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn elements_config(n: usize) -> kernel_dsl::host::LaunchConfig {
    let groups = n.div_ceil(BLOCK as usize).clamp(1, 65536) as u32;
    kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(groups), kernel_dsl::Dim3::x(BLOCK))
}

/// Launch shape of [`scatter_claim`](fn@scatter_claim) for `rows` source rows of `right`
/// columns: work-groups of 256 work-items, 64 to 256 of them along a row (a multiple of
/// any wave size) at eight columns each, [`CLAIM_ROUND`] rows per work-item and round, at
/// most [`CLAIM_GROUPS`] work-groups (each work-item then loops over several rounds: its
/// set-up is paid once).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn claim_config(rows: usize, right: usize) -> kernel_dsl::host::LaunchConfig {
    use kernel_dsl::Dim3;
    let groups = right.div_ceil(CLAIM_COLS);
    let bx = groups.max(1).next_power_of_two().clamp(64, BLOCK as usize);
    let by = BLOCK as usize / bx;
    let gx = groups.div_ceil(bx).clamp(1, 65535);
    let gy = rows.div_ceil(CLAIM_ROUND * by).clamp(1, (CLAIM_GROUPS / gx).max(1));
    kernel_dsl::host::LaunchConfig::new(Dim3::new(gx as u32, gy as u32, 1), Dim3::new(bx as u32, by as u32, 1))
}

/// Most work-groups of [`claim_config`] and [`claimed_config`] (about eight per compute
/// unit of the largest GPUs).
pub const CLAIM_GROUPS: usize = 2048;

/// Launch shape of [`scatter_add_claimed`](fn@scatter_add_claimed): [`rows_config`] over
/// pieces of [`CHUNK`](crate::row::CHUNK) columns, at most [`CLAIM_GROUPS`] work-groups.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn claimed_config(rows: usize, right: usize) -> kernel_dsl::host::LaunchConfig {
    let mut cfg = rows_config(rows, right.div_ceil(crate::row::CHUNK));
    cfg.grid.y = cfg.grid.y.min((CLAIM_GROUPS as u32 / cfg.grid.x).max(1));
    cfg
}

/// Checked launches: every shape and buffer length is validated before anything runs (a
/// rejected call returns [`LaunchError::InvalidArgument`](kernel_dsl::host::LaunchError)
/// and writes nothing); empty tensors are a no-op.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use super::{CondType, IndexType, Pod};
    use crate::runtime::{Device, DeviceVec};
    use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, KernelArgSliceMut, LaunchError};
    use kernel_dsl::Float;

    /// A strided view of an input: `dims` and `strides` (element units, row-major, a stride
    /// of 0 broadcasts), checked on the host and uploaded once as the kernels' `layout`.
    pub struct View {
        host: Vec<usize>,
        buf: std::sync::Arc<DeviceVec<usize>>,
    }

    impl View {
        /// Checks `dims`/`strides` (same rank; offsets fit `usize`) and uploads them to `dev`.
        pub fn new(dev: &Device, dims: &[usize], strides: &[usize]) -> Result<View, LaunchError> {
            let bad = |reason: String| invalid("View", reason);
            if dims.len() != strides.len() {
                return Err(bad(format!("{} dims but {} strides", dims.len(), strides.len())));
            }
            dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| bad(format!("dims {dims:?} overflow usize")))?;
            dims.iter()
                .zip(strides)
                .try_fold(0usize, |a, (&d, &s)| d.saturating_sub(1).checked_mul(s).and_then(|o| a.checked_add(o)))
                .ok_or_else(|| bad(format!("dims {dims:?} strides {strides:?}: offsets overflow usize")))?;
            let host: Vec<usize> = dims.iter().chain(strides).copied().collect();
            let buf = dev.upload_shared(&host)?;
            Ok(View { host, buf })
        }

        /// The view's dimensions.
        pub fn dims(&self) -> &[usize] {
            &self.host[..self.host.len() / 2]
        }

        /// The view's strides.
        pub fn strides(&self) -> &[usize] {
            &self.host[self.host.len() / 2..]
        }

        /// Elements of the view (product of `dims`).
        pub fn elems(&self) -> usize {
            self.dims().iter().product()
        }

        /// Checks that the view has `elems` elements and stays inside a buffer of `len`.
        fn check(&self, kernel: &'static str, arg: &str, elems: usize, len: usize) -> Result<(), LaunchError> {
            if self.elems() != elems {
                return Err(invalid(kernel, format!("view of `{arg}` has {} elements (dims {:?}), the op needs {elems}", self.elems(), self.dims())));
            }
            if elems > 0 {
                let last: usize = self.dims().iter().zip(self.strides()).map(|(d, s)| (d - 1) * s).sum();
                if last >= len {
                    return Err(invalid(
                        kernel,
                        format!("view of `{arg}` (dims {:?}, strides {:?}) reaches element {last} of a buffer of {len}", self.dims(), self.strides()),
                    ));
                }
            }
            Ok(())
        }
    }

    /// A kernel argument passed through as is (a view's buffer, or an empty layout).
    struct Raw(ArgValue);

    impl<T> KernelArgSlice<T> for Raw {
        fn kernel_arg(&self) -> ArgValue {
            self.0
        }
    }

    fn layout_arg(view: Option<&View>) -> Raw {
        Raw(match view {
            Some(v) => v.buf.kernel_arg(),
            None => KernelArgSlice::<usize>::kernel_arg(&[0usize; 0]),
        })
    }

    fn invalid(kernel: &'static str, reason: String) -> LaunchError {
        LaunchError::InvalidArgument { kernel, reason }
    }

    fn arg_len<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> usize {
        match b.kernel_arg() {
            ArgValue::Slice { len, .. } => len,
            _ => 0,
        }
    }

    /// `true` when rows of the buffer starting at `offset + k * row_elems` all start on 16
    /// bytes (`row_elems = 0`: the element at `offset` does).
    fn vec_rows<T>(b: &(impl KernelArgSlice<T> + ?Sized), row_elems: usize, offset: usize) -> bool {
        let size = std::mem::size_of::<T>();
        match b.kernel_arg() {
            ArgValue::Slice { addr, .. } => 16 % size == 0 && (addr as usize).wrapping_add(offset.wrapping_mul(size)) % 16 == 0 && (row_elems * size) % 16 == 0,
            _ => false,
        }
    }

    /// Work units along a row of `right` elements: 16-byte blocks when rows stay aligned.
    fn row_units<T>(right: usize, vectorized: bool) -> usize {
        if vectorized { right.div_ceil(16 / std::mem::size_of::<T>()) } else { right }
    }

    fn product(kernel: &'static str, dims: &[usize]) -> Result<usize, LaunchError> {
        dims.iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(kernel, format!("shape {dims:?} overflows usize")))
    }

    fn expect_len(kernel: &'static str, arg: &str, actual: usize, expected: usize) -> Result<(), LaunchError> {
        if actual != expected {
            return Err(invalid(kernel, format!("`{arg}` has {actual} elements; the shape needs {expected}")));
        }
        Ok(())
    }

    /// `out (left, n, right) = src (left, src_dim, right)` rows picked by `ids` (`n =
    /// ids.len()`; zero rows for out-of-range ids). `src` is contiguous with exactly
    /// `left * src_dim * right` elements, or read through `src_view` (any rank, that many
    /// elements, inside `src`).
    #[allow(clippy::too_many_arguments)]
    pub fn index_select<T: Pod, I: IndexType>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<T> + ?Sized),
        src_view: Option<&View>,
        ids: &(impl KernelArgSlice<I> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        src_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "index_select";
        let n = arg_len(ids);
        let src_elems = product(K, &[left, src_dim, right])?;
        let out_elems = product(K, &[left, n, right])?;
        match src_view {
            Some(v) => v.check(K, "src", src_elems, arg_len(src))?,
            None => expect_len(K, "src", arg_len(src), src_elems)?,
        }
        expect_len(K, "out", arg_len(out), out_elems)?;
        if out_elems == 0 {
            return Ok(());
        }
        let vectorized = src_view.is_none() && vec_rows(src, right, 0) && vec_rows(out, right, 0);
        let cfg = super::rows_config(left * n, row_units::<T>(right, vectorized));
        super::index_select::launch::<T, I>(exec, cfg, src, &layout_arg(src_view), ids, out, left, src_dim, right)
    }

    /// `out[l, i, r] = src[l, ids[l, i, r], r]` (zero for out-of-range ids): `src` contiguous
    /// `(left, src_dim, right)`, `ids` and `out` contiguous `(left, n, right)`.
    #[allow(clippy::too_many_arguments)]
    pub fn gather<T: Pod, I: IndexType>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        src_dim: usize,
        n: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "gather";
        let out_elems = product(K, &[left, n, right])?;
        expect_len(K, "src", arg_len(src), product(K, &[left, src_dim, right])?)?;
        expect_len(K, "ids", arg_len(ids), out_elems)?;
        expect_len(K, "out", arg_len(out), out_elems)?;
        if out_elems == 0 {
            return Ok(());
        }
        super::gather::launch::<T, I>(exec, super::rows_config(left * n, right), src, ids, out, left, src_dim, n, right)
    }

    /// [`scatter_add`](fn@super::scatter_add_unordered) for `f32` through atomics:
    /// every element in parallel, additions to one destination in unspecified order (the
    /// result may differ in the last bits between runs). Same shapes and checks as
    /// [`scatter_add`]; `dst` is any `f32` buffer (a `DeviceVec<f32>` on a GPU).
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add_unordered<I: IndexType>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<f32> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<f32> + ?Sized),
        left: usize,
        n: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        let lens = [arg_len(src), arg_len(ids), arg_len(dst)];
        let src_elems = check_scatter("scatter_add_unordered", lens, [left, n, dst_dim, right])?;
        if src_elems == 0 {
            return Ok(());
        }
        // The kernel sees `dst` as atomics: same bits and layout (`AtomicF32` is a
        // transparent `u32`), and `&mut` here means no one else uses it meanwhile.
        let atomic = AsAtomic(dst.kernel_arg());
        super::scatter_add_unordered::launch::<I>(exec, super::elements_config(src_elems.div_ceil(super::UNORDERED_ROUND)), src, ids, &atomic, left, n, dst_dim, right)
    }

    /// Checks a scatter-add's `[src, ids, dst]` lengths against `[left, n, dst_dim, right]`;
    /// the number of source elements, 0 when there is nothing to do.
    fn check_scatter(k: &'static str, lens: [usize; 3], [left, n, dst_dim, right]: [usize; 4]) -> Result<usize, LaunchError> {
        let src_elems = product(k, &[left, n, right])?;
        let dst_elems = product(k, &[left, dst_dim, right])?;
        expect_len(k, "src", lens[0], src_elems)?;
        expect_len(k, "ids", lens[1], src_elems)?;
        expect_len(k, "dst", lens[2], dst_elems)?;
        Ok(if dst_elems == 0 { 0 } else { src_elems })
    }

    /// A `u32` buffer's kernel argument, offered as a buffer of [`AtomicU32`](kernel_dsl::prelude::AtomicU32).
    struct AsAtomicU32(ArgValue);
    impl KernelArgSlice<kernel_dsl::prelude::AtomicU32> for AsAtomicU32 {
        fn kernel_arg(&self) -> ArgValue {
            self.0
        }
    }

    /// An `f32` buffer's kernel argument, offered as a buffer of [`AtomicF32`](kernel_dsl::prelude::AtomicF32).
    struct AsAtomic(ArgValue);
    impl KernelArgSlice<kernel_dsl::prelude::AtomicF32> for AsAtomic {
        fn kernel_arg(&self) -> ArgValue {
            self.0
        }
    }

    /// `dst[l, ids[l, i, r], r] += src[l, i, r]` (out-of-range ids skipped): `dst` contiguous
    /// `(left, dst_dim, right)`, `src` and `ids` contiguous `(left, n, right)`; each
    /// destination gets its sources added in source order (the sequential loop's result
    /// bit for bit).
    ///
    /// Where no column can be certain to repeat a destination (`n <= dst_dim`) and rows
    /// have at least [`CLAIM_CHUNK`](super::CLAIM_CHUNK) columns, a first pass
    /// ([`scatter_claim`](fn@super::scatter_claim), a bitset over `dst` in scratch) finds
    /// out whether any two sources share one; if none do,
    /// [`scatter_add_claimed`](fn@super::scatter_add_claimed) adds every source in parallel.
    /// Otherwise (or with `n > dst_dim`) the ordered kernel runs, gated on the claim's flag:
    /// [`scatter_add_slab`](fn@super::scatter_add_slab) where a work-group's destination
    /// columns fit in shared memory, else [`scatter_add`](fn@super::scatter_add). The
    /// choice is made on the device, so nothing here waits for the GPU.
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add<T: Float, I: IndexType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        n: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        let lens = [arg_len(src), arg_len(ids), arg_len(dst)];
        let total = check_scatter("scatter_add", lens, [left, n, dst_dim, right])?;
        if total == 0 {
            return Ok(());
        }
        if dst_dim >= u32::MAX as usize {
            return Err(invalid("scatter_add", format!("dst_dim {dst_dim}: the ordered kernel addresses destinations below u32::MAX")));
        }
        if left.saturating_mul(right).div_ceil(4) > 65535 * 65535 {
            return Err(invalid("scatter_add", format!("{left} x {right} columns exceed the launch grid (65535^2 work-groups of 4 columns)")));
        }
        let dst_len = lens[2];
        if n <= dst_dim && right >= super::CLAIM_CHUNK && total < u32::MAX as usize && dst_len < u32::MAX as usize {
            // Scratch: the zeroed bitset over dst, then the flag word; the chunk codes.
            let words = dst_len.div_ceil(32);
            let seen = dev.alloc::<u32>(words + 1)?;
            let rows = left * n;
            let mut code = dev.scratch::<u32>(rows * right.div_ceil(super::CLAIM_CHUNK))?;
            let flag_word = seen.view(words..)?;
            let (bits, flag) = (AsAtomicU32(seen.view(..words)?.kernel_arg()), AsAtomicU32(flag_word.kernel_arg()));
            super::scatter_claim::launch::<I>(dev, super::claim_config(rows, right), ids, &bits, &mut code, &flag, left, n, dst_dim, right)?;
            super::scatter_add_claimed::launch::<T, I>(dev, super::claimed_config(rows, right), src, ids, dst, &code, &flag, left, n, dst_dim, right)?;
            return scatter_add_ordered(dev, src, ids, dst, [left, n, dst_dim, right], &flag_word);
        }
        scatter_add_ordered(dev, src, ids, dst, [left, n, dst_dim, right], &[] as &[u32; 0])
    }

    /// The ordered kernels of [`scatter_add`] (checked shapes), gated on `gate`.
    fn scatter_add_ordered<T: Float, I: IndexType>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        [left, n, dst_dim, right]: [usize; 4],
        gate: &(impl KernelArgSlice<u32> + ?Sized),
    ) -> Result<(), LaunchError> {
        let aligned = [src.kernel_arg(), ids.kernel_arg(), dst.kernel_arg()].iter().all(|a| matches!(a, ArgValue::Slice { addr, .. } if addr % 16 == 0));
        // The slab kernel reads and writes all `dst_dim` rows of its columns (worth it once
        // there is a source per 8 destination rows), and its rounds are latency-bound: it
        // runs where two of its work-groups share a compute unit (half the per-work-group
        // limit; H100: dst_dim up to about 6500 for f32, as for 16-bit types with 8 columns).
        if aligned && n.saturating_mul(8) >= dst_dim {
            if let Some(cfg) = super::slab_config::<T, I>(left, dst_dim, right, exec.wave_lanes(), super::slab_waves(core::mem::size_of::<T>(), exec.wave_lanes())) {
                if cfg.dynamic_shared_elems * 16 * 2 <= exec.max_shared_bytes() {
                    return super::scatter_add_slab::launch::<T, I>(exec, cfg, src, ids, dst, left, n, dst_dim, right, gate);
                }
            }
        }
        super::scatter_add::launch::<T, I>(exec, super::scatter_config(left, right), src, ids, dst, left, n, dst_dim, right, 2, gate)
    }

    /// `dst[l, ids[i], r] += src[l, i, r]` (out-of-range ids skipped): `dst` contiguous
    /// `(left, dst_dim, right)`, `src` contiguous `(left, ids.len(), right)`.
    pub fn index_add<T: Float, I: IndexType>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "index_add";
        let n = arg_len(ids);
        let src_elems = product(K, &[left, n, right])?;
        let dst_elems = product(K, &[left, dst_dim, right])?;
        expect_len(K, "src", arg_len(src), src_elems)?;
        expect_len(K, "dst", arg_len(dst), dst_elems)?;
        if src_elems == 0 || dst_elems == 0 {
            return Ok(());
        }
        super::index_add::launch::<T, I>(exec, super::rows_config(left, right), src, ids, dst, left, dst_dim, right)
    }

    /// `out[i] = if cond[i] != 0 { on_true[i] } else { on_false[i] }` over `out.len()`
    /// elements; each input is contiguous of that length or read through its [`View`] (with
    /// that many elements; zero strides broadcast).
    pub fn where_cond<T: Pod, C: CondType>(
        exec: &(impl Executor + ?Sized),
        cond: (&(impl KernelArgSlice<C> + ?Sized), Option<&View>),
        on_true: (&(impl KernelArgSlice<T> + ?Sized), Option<&View>),
        on_false: (&(impl KernelArgSlice<T> + ?Sized), Option<&View>),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "where_cond";
        let n = arg_len(out);
        for (arg, len, view) in [("cond", arg_len(cond.0), cond.1), ("on_true", arg_len(on_true.0), on_true.1), ("on_false", arg_len(on_false.0), on_false.1)] {
            match view {
                Some(v) => v.check(K, arg, n, len)?,
                None => expect_len(K, arg, len, n)?,
            }
        }
        if n == 0 {
            return Ok(());
        }
        let (cl, tl, fl) = (layout_arg(cond.1), layout_arg(on_true.1), layout_arg(on_false.1));
        // Contiguous and aligned: each work-item moves 16 bytes of values per step.
        let size = std::mem::size_of::<T>();
        let blocks = cond.1.is_none()
            && on_true.1.is_none()
            && on_false.1.is_none()
            && 4 % size == 0
            && vec_rows(on_true.0, 0, 0)
            && vec_rows(on_false.0, 0, 0)
            && vec_rows(out, 0, 0);
        let cfg = super::elements_config(if blocks { n.div_ceil(16 / size) } else { n });
        super::where_cond::launch::<T, C>(exec, cfg, cond.0, &cl, on_true.0, &tl, on_false.0, &fl, out)
    }

    /// `dst[dst_off + i * dst_stride + j] = src[src_off + i * src_stride + j]` for `i < d1`,
    /// `j < d2`. Both regions must lie inside their buffers, and the destination rows must
    /// not overlap (`d2 <= dst_stride` when `d1 > 1`).
    #[allow(clippy::too_many_arguments)]
    pub fn copy2d<T: Pod>(
        exec: &(impl Executor + ?Sized),
        src: &(impl KernelArgSlice<T> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        d1: usize,
        d2: usize,
        src_stride: usize,
        dst_stride: usize,
        src_off: usize,
        dst_off: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "copy2d";
        if d1 == 0 || d2 == 0 {
            return Ok(());
        }
        if d1 > 1 && d2 > dst_stride {
            return Err(invalid(K, format!("rows of {d2} elements overlap at dst_stride {dst_stride}")));
        }
        for (arg, len, stride, off) in [("src", arg_len(src), src_stride, src_off), ("dst", arg_len(dst), dst_stride, dst_off)] {
            let end = (d1 - 1).checked_mul(stride).and_then(|v| v.checked_add(off)).and_then(|v| v.checked_add(d2));
            match end {
                Some(end) if end <= len => {}
                _ => {
                    return Err(invalid(
                        K,
                        format!("{d1} rows of {d2} at offset {off}, stride {stride} do not fit `{arg}` of {len} elements"),
                    ))
                }
            }
        }
        let vectorized = vec_rows(src, src_stride, src_off) && vec_rows(dst, dst_stride, dst_off);
        let cfg = super::rows_config(d1, row_units::<T>(d2, vectorized));
        super::copy2d::launch::<T>(exec, cfg, src, dst, d1, d2, src_stride, dst_stride, src_off, dst_off)
    }

    /// Shape of the concatenation of tensors of `shapes` along `dim`: equal ranks, equal
    /// sizes except along `dim`, at least one input.
    pub fn cat_shape(shapes: &[&[usize]], dim: usize) -> Result<Vec<usize>, LaunchError> {
        const K: &str = "cat";
        let first = shapes.first().ok_or_else(|| invalid(K, "no inputs".into()))?;
        if dim >= first.len() {
            return Err(invalid(K, format!("dim {dim} out of range for rank {}", first.len())));
        }
        let mut out = first.to_vec();
        for (k, s) in shapes.iter().enumerate().skip(1) {
            if s.len() != first.len() || s.iter().zip(first.iter()).enumerate().any(|(d, (a, b))| d != dim && a != b) {
                return Err(invalid(K, format!("input {k} has shape {s:?}, input 0 {first:?}; only dim {dim} may differ")));
            }
            out[dim] = out[dim].checked_add(s[dim]).ok_or_else(|| invalid(K, "concatenated size overflows usize".into()))?;
        }
        product(K, &out)?;
        Ok(out)
    }

    /// Concatenates contiguous tensors (`(buffer, shape)`) along `dim` into contiguous `out`
    /// of [`cat_shape`]: one [`cat_rows`](fn@super::cat_rows) launch per
    /// [`CAT_INPUTS`](super::CAT_INPUTS) inputs (Candle runs one `copy2d` per input). Shapes,
    /// lengths and buffer memory are all checked before the first copy.
    pub fn cat<T: Pod, S: KernelArgSlice<T> + ?Sized>(
        exec: &(impl Executor + ?Sized),
        inputs: &[(&S, &[usize])],
        dim: usize,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "cat";
        let shapes: Vec<&[usize]> = inputs.iter().map(|(_, s)| *s).collect();
        let out_shape = cat_shape(&shapes, dim)?;
        for (k, (buf, shape)) in inputs.iter().enumerate() {
            expect_len(K, &format!("input {k}"), arg_len(*buf), product(K, shape)?)?;
        }
        expect_len(K, "out", arg_len(out), product(K, &out_shape)?)?;
        // With more than CAT_INPUTS inputs there are several launches: check every
        // buffer's memory up front too, so a rejected call has copied nothing.
        let args = inputs.iter().map(|(b, _)| b.kernel_arg()).chain([out.kernel_arg()]);
        for (k, a) in args.enumerate() {
            if let ArgValue::Slice { location, len, .. } = a {
                if len > 0 && location != exec.memory() {
                    return Err(LaunchError::WrongMemory { kernel: K, arg: k, expected: exec.memory(), found: location });
                }
            }
        }
        let rows: usize = out_shape[..dim].iter().product();
        let inner: usize = out_shape[dim + 1..].iter().product();
        let out_width = out_shape[dim] * inner;
        if rows == 0 || out_width == 0 {
            return Ok(());
        }
        let none = Raw(KernelArgSlice::<T>::kernel_arg(&[] as &[T; 0]));
        let mut at = 0;
        for group in inputs.chunks(super::CAT_INPUTS) {
            let mut bufs: Vec<Raw> = group.iter().map(|(b, _)| Raw(b.kernel_arg())).collect();
            let mut widths: Vec<usize> = group.iter().map(|(_, s)| s[dim] * inner).collect();
            let vectorized = group.iter().zip(&widths).all(|((b, _), &w)| vec_rows(*b, w, 0)) && vec_rows(out, out_width, at) && widths.iter().all(|&w| vec_rows(out, 0, w));
            let units = widths.iter().map(|&w| row_units::<T>(w, vectorized)).max().unwrap_or(0);
            while bufs.len() < super::CAT_INPUTS {
                bufs.push(Raw(none.0));
                widths.push(0);
            }
            let mut cfg = super::rows_config(rows, units);
            cfg.grid.z = group.len() as u32;
            if vectorized {
                // Two rows per work-item and step (the kernel's aligned path).
                cfg.grid.y = cfg.grid.y.div_ceil(2);
            }
            super::cat_rows::launch::<T>(exec, cfg, &bufs[0], &bufs[1], &bufs[2], &bufs[3], out, rows, out_width, at, widths[0], widths[1], widths[2], widths[3])?;
            at += widths.iter().sum::<usize>();
        }
        Ok(())
    }
}
