//! Reductions: sum, mean, max, min, argmax and argmin over any set of dimensions, plus the
//! work-group reductions the row-wise families share (a butterfly inside each wave, then
//! one value per wave through shared memory).
//!
//! Three kernel pairs cover every case; [`plan`] picks one for a shape and a dimension set:
//! * [`reduce_rows`](fn@reduce_rows) / [`argreduce_rows`](fn@argreduce_rows): one work-group per output, for reductions over
//!   the innermost dimensions of a contiguous tensor (16-byte vector loads) or, given a
//!   layout, over any dimensions of any strided view;
//! * [`reduce_rows_wave`](fn@reduce_rows_wave) / [`argreduce_rows_wave`](fn@argreduce_rows_wave): one wave per output, for many
//!   contiguous rows (shuffles only, no barriers);
//! * [`reduce_cols`](fn@reduce_cols) / [`argreduce_cols`](fn@argreduce_cols): several work-items per output ([`col_block`]), for
//!   reductions over outer or middle dimensions of a contiguous tensor (`(outer, r, inner)`
//!   reduced over `r`), where neighbouring work-items read neighbouring elements.
//!
//! f16/bf16 accumulate in f32. Max and min propagate NaN; argmax and argmin return the
//! index of the first NaN if there is one, else of the first extreme value (ties go to the
//! lowest index), as PyTorch does.
use crate::elementwise::strided_offset;
use crate::each_lane;
use crate::row::{for_each_chunk, for_each_chunk_of, for_each_row_of_wave};
use kernel_dsl::prelude::*;

/// Most waves a work-group can have (1024 work-items in waves of 32).
pub const MAX_WAVES: usize = 32;

/// Folds `v` over the whole work-group with `op` (associative, commutative), returning the
/// result in every work-item. All work-items must call it (uniform control flow) and the
/// work-group size must be a multiple of the wave size. `partials` is scratch shared memory
/// it reuses; it is free again when this returns.
#[device]
#[inline(always)]
pub fn block_reduce(v: f32, partials: &mut Shared<f32, MAX_WAVES>, op: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    let w = wave::reduce(v, op);
    if wave::lane_id() == 0 {
        partials[wave::wave_id() as usize] = w;
    }
    barrier();
    // Every wave folds the per-wave results with shuffles, a lane each, as a tree over the
    // first `waves` lanes (five steps for 32 waves, where a sequential fold in every
    // work-item read all 32 from shared memory); lane 0's total goes to every lane.
    let (waves, lane) = (flat_block_dim() / wave::size(), wave::lane_id());
    let mut r = partials[lane.min(waves - 1) as usize];
    let mut offset = waves.next_power_of_two() / 2;
    while offset > 0 {
        let o = wave::shuffle(r, (lane + offset).min(wave::size() - 1));
        if lane + offset < waves {
            r = op(r, o);
        }
        offset /= 2;
    }
    let r = wave::shuffle(r, 0);
    // Everyone has read the partials before anyone writes the next reduction's.
    barrier();
    r
}

/// Two sums over the whole work-group at once, [`block_reduce`] style but with one pair
/// of barriers for both; every work-item gets both totals. `pa` and `pb` are scratch
/// shared memory, free again when this returns.
#[device]
#[inline(always)]
pub fn block_sum2(a: f32, b: f32, pa: &mut Shared<f32, MAX_WAVES>, pb: &mut Shared<f32, MAX_WAVES>) -> (f32, f32) {
    let (wa, wb) = wave::reduce_pair(a, b, |x, y| x + y);
    if wave::lane_id() == 0 {
        pa[wave::wave_id() as usize] = wa;
        pb[wave::wave_id() as usize] = wb;
    }
    barrier();
    // A 32-bit count (a 64-bit one cost ptxas two instructions per compare and step).
    let waves = flat_block_dim() / wave::size();
    let (mut ra, mut rb) = (pa[0], pb[0]);
    let mut k = 1u32;
    while k < waves {
        ra += pa[k as usize];
        rb += pb[k as usize];
        k += 1;
    }
    barrier();
    (ra, rb)
}

/// A reduction producing a value: how to start, combine and finish.
pub trait ReduceOp: 'static {
    /// Value of an empty reduction before [`ReduceOp::finish`].
    const INIT: f32;
    /// Combines two partial results (associative and commutative).
    fn combine(a: f32, b: f32) -> f32;
    /// Turns the combined value of `n` elements into the result.
    fn finish(acc: f32, n: usize) -> f32;
    /// `true` when reducing no elements has a value (sum: 0, mean: NaN); max and min of
    /// nothing are errors.
    const EMPTY_OK: bool;
}

/// `max(a, b)`, NaN if either is NaN.
#[inline(always)]
fn max_nan(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() { a } else { b }
}

/// `min(a, b)`, NaN if either is NaN.
#[inline(always)]
fn min_nan(a: f32, b: f32) -> f32 {
    if a < b || a.is_nan() { a } else { b }
}

/// Sum of the elements (0 for none).
pub struct Sum;
impl ReduceOp for Sum {
    const INIT: f32 = 0.0;
    const EMPTY_OK: bool = true;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 { a + b }
    #[inline(always)]
    fn finish(acc: f32, _n: usize) -> f32 { acc }
}

/// Arithmetic mean (NaN for no elements).
pub struct Mean;
impl ReduceOp for Mean {
    const INIT: f32 = 0.0;
    const EMPTY_OK: bool = true;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 { a + b }
    #[inline(always)]
    fn finish(acc: f32, n: usize) -> f32 { acc / n as f32 }
}

/// Largest element (NaN if any is NaN).
pub struct Max;
impl ReduceOp for Max {
    const INIT: f32 = f32::NEG_INFINITY;
    const EMPTY_OK: bool = false;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 { max_nan(a, b) }
    #[inline(always)]
    fn finish(acc: f32, _n: usize) -> f32 { acc }
}

/// Smallest element (NaN if any is NaN).
pub struct Min;
impl ReduceOp for Min {
    const INIT: f32 = f32::INFINITY;
    const EMPTY_OK: bool = false;
    #[inline(always)]
    fn combine(a: f32, b: f32) -> f32 { min_nan(a, b) }
    #[inline(always)]
    fn finish(acc: f32, _n: usize) -> f32 { acc }
}

/// A reduction producing the index of the extreme element.
pub trait ArgOp: 'static {
    /// Value every element beats or ties.
    const INIT: f32;
    /// `true` when `a` is strictly more extreme than `b` (neither is NaN).
    fn beats(a: f32, b: f32) -> bool;
}

/// Index of the largest element.
pub struct ArgMax;
impl ArgOp for ArgMax {
    const INIT: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn beats(a: f32, b: f32) -> bool { a > b }
}

/// Index of the smallest element.
pub struct ArgMin;
impl ArgOp for ArgMin {
    const INIT: f32 = f32::INFINITY;
    #[inline(always)]
    fn beats(a: f32, b: f32) -> bool { a < b }
}

/// Index that no element has: the starting point of an arg reduction.
const NO_INDEX: u32 = u32::MAX;

/// Of `(va, ia)` and `(vb, ib)`, the pair an arg reduction keeps: NaN first, then the more
/// extreme value, then the lower index.
#[inline(always)]
fn arg_pick<Op: ArgOp>(va: f32, ia: u32, vb: f32, ib: u32) -> (f32, u32) {
    let (na, nb) = (va.is_nan(), vb.is_nan());
    let take_b = if na || nb {
        nb && (!na || ib < ia)
    } else {
        Op::beats(vb, va) || (vb == va && ib < ia)
    };
    if take_b { (vb, ib) } else { (va, ia) }
}

/// One element `(x, ix)` folded into a work-item's running `(v, i)`, for elements visited
/// in increasing index order: ties keep the earlier element without comparing indices.
#[inline(always)]
fn arg_step<Op: ArgOp>(v: f32, i: u32, x: f32, ix: u32) -> (f32, u32) {
    let take = i == NO_INDEX || Op::beats(x, v) || (x != x && v == v);
    if take { (x, ix) } else { (v, i) }
}

/// [`block_reduce`] for `(value, index)` pairs of an arg reduction.
#[device]
#[inline(always)]
pub fn block_arg_reduce<Op: ArgOp>(v: f32, i: u32, values: &mut Shared<f32, MAX_WAVES>, indices: &mut Shared<u32, MAX_WAVES>) -> (f32, u32) {
    let (mut v, mut i) = (v, i);
    let mut offset = wave::size() / 2;
    while offset > 0 {
        let (ov, oi) = (wave::shuffle_xor(v, offset), wave::shuffle_xor(i, offset));
        (v, i) = arg_pick::<Op>(v, i, ov, oi);
        offset /= 2;
    }
    if wave::lane_id() == 0 {
        values[wave::wave_id() as usize] = v;
        indices[wave::wave_id() as usize] = i;
    }
    barrier();
    // Every wave folds the per-wave results with shuffles (a lane each; `arg_pick` is a
    // total order, so the tree picks what a sequential fold would) instead of every
    // work-item reading all of them one after another.
    let (waves, lane) = (flat_block_dim() / wave::size(), wave::lane_id());
    let (mut rv, mut ri) = if lane < waves { (values[lane as usize], indices[lane as usize]) } else { (Op::INIT, NO_INDEX) };
    let mut offset = wave::size() / 2;
    while offset > 0 {
        let (ov, oi) = (wave::shuffle_xor(rv, offset), wave::shuffle_xor(ri, offset));
        (rv, ri) = arg_pick::<Op>(rv, ri, ov, oi);
        offset /= 2;
    }
    barrier();
    (rv, ri)
}

/// `out[o] = Op over the cols elements of row o`. Row `o` is `input[o*cols .. o*cols+cols]`
/// when `layout` is empty; otherwise element `c` of row `o` is at
/// `strided_offset(o*cols + c, layout)` (`layout` = the input's dims and strides permuted
/// so that the reduced dims come last). One work-group per output (see [`ReducePlan`]).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min])]
pub fn reduce_rows<T: Float, Op: ReduceOp>(input: &[T], layout: &[usize], out: &mut [T], cols: u32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let o = block_idx_x() as usize;
    let mut acc = Op::INIT;
    if layout.is_empty() {
        for_each_chunk(&input[o * cols..o * cols + cols], Op::INIT, |v, _| {
            each_lane!(j, {
                acc = Op::combine(acc, v[j]);
            });
        });
    } else {
        let (mut c, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
        while c < cols {
            acc = Op::combine(acc, input[strided_offset(o * cols + c, layout)].to_f32());
            c += n;
        }
    }
    let r = block_reduce(acc, &mut partials, Op::combine);
    if flat_thread_idx() == 0 {
        out[o] = T::from_f32(Op::finish(r, cols));
    }
}

/// Index (`0..cols`) of the extreme element of each row, rows as in [`reduce_rows`](fn@reduce_rows).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [ArgMax, ArgMin])]
pub fn argreduce_rows<T: Float, Op: ArgOp>(input: &[T], layout: &[usize], out: &mut [u32], cols: u32, mut values: Shared<f32, MAX_WAVES>, mut indices: Shared<u32, MAX_WAVES>) {
    let cols = cols as usize;
    let o = block_idx_x() as usize;
    let (mut v, mut i) = (Op::INIT, NO_INDEX);
    if layout.is_empty() {
        for_each_chunk(&input[o * cols..o * cols + cols], Op::INIT, |x, e| {
            each_lane!(j, {
                // Padding is Op::INIT, which never beats a kept value, and the first
                // element this work-item visits is inside the row, so the past-the-end
                // lanes need no branch.
                (v, i) = arg_step::<Op>(v, i, x[j], (e + j) as u32);
            });
        });
    } else {
        let (mut c, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
        while c < cols {
            (v, i) = arg_step::<Op>(v, i, input[strided_offset(o * cols + c, layout)].to_f32(), c as u32);
            c += n;
        }
    }
    let (_, r) = block_arg_reduce::<Op>(v, i, &mut values, &mut indices);
    if flat_thread_idx() == 0 {
        out[o] = r;
    }
}

/// [`reduce_rows`](fn@reduce_rows) for many contiguous rows: one wave per row (waves reduce with shuffles
/// only: no shared memory, no barriers): the wave with global index `r` takes row `r`.
/// `out` has one element per row; launch with [`crate::row::wave_rows_config`].
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min], max_threads = 256)]
pub fn reduce_rows_wave<T: Float, Op: ReduceOp>(input: &[T], out: &mut [T], cols: u32) {
    let cols = cols as usize;
    let lanes = wave::size() as usize;
    for_each_row_of_wave(out.len(), |r| {
        let mut acc = Op::INIT;
        for_each_chunk_of(&input[r * cols..r * cols + cols], Op::INIT, wave::lane_id() as usize, lanes, |v, _| {
            each_lane!(j, {
                acc = Op::combine(acc, v[j]);
            });
        });
        let v = wave::reduce(acc, Op::combine);
        if wave::lane_id() == 0 {
            out[r] = T::from_f32(Op::finish(v, cols));
        }
    });
}

/// [`argreduce_rows`](fn@argreduce_rows) with one wave per row, as [`reduce_rows_wave`](fn@reduce_rows_wave).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [ArgMax, ArgMin], max_threads = 256)]
pub fn argreduce_rows_wave<T: Float, Op: ArgOp>(input: &[T], out: &mut [u32], cols: u32) {
    let cols = cols as usize;
    let lanes = wave::size() as usize;
    for_each_row_of_wave(out.len(), |r| {
        let (mut v, mut i) = (Op::INIT, NO_INDEX);
        for_each_chunk_of(&input[r * cols..r * cols + cols], Op::INIT, wave::lane_id() as usize, lanes, |x, e| {
            each_lane!(j, {
                (v, i) = arg_step::<Op>(v, i, x[j], (e + j) as u32);
            });
        });
        let mut offset = wave::size() / 2;
        while offset > 0 {
            let (ov, oi) = (wave::shuffle_xor(v, offset), wave::shuffle_xor(i, offset));
            (v, i) = arg_pick::<Op>(v, i, ov, oi);
            offset /= 2;
        }
        if wave::lane_id() == 0 {
            out[r] = i;
        }
    });
}

/// The elements `start + k * inner` (`k < r`) of `input` as a slice that holds them all
/// (checked once here, so the loops index it unchecked).
#[device]
#[inline(always)]
fn column<T>(input: &[T], start: usize, r: usize, inner: usize) -> &[T] {
    if r == 0 {
        return &[];
    }
    &input[start..=start + (r - 1) * inner]
}

/// Columns one work-group of the column kernels covers (its x size), at most: see
/// [`col_block`].
pub const COL_TILE: u32 = 32;
/// Work-items that share one column of the column kernels (the work-group's y size), at
/// most: see [`col_block`].
pub const COL_SPLIT: u32 = 64;

/// Work-group shape `(columns, work-items per column)` of the column kernels for
/// reductions of length `r` over elements of `elem_bytes` bytes. Long f32 columns take
/// 16 x 64 (1024-item groups, twice as many groups as 32 x 16: 4096 x 4096 went from 0.92
/// to 1.02 of PyTorch's time on an H100); 16-bit types and short columns keep 32 x 16
/// (16 x 64 halved bf16 4096 x 4096 and made 64-long columns 6x slower).
pub const fn col_block(r: usize, elem_bytes: usize) -> (u32, u32) {
    if elem_bytes >= 4 && r >= 1024 { (16, 64) } else { (32, 16) }
}
/// Work-items of a column-kernel work-group.
pub const COL_THREADS: usize = 1024;

/// `Op` over `input[a][k][b]` for `k` in `k0..k1` of a contiguous `(outer, r, inner)`
/// input, by the work-items of a column-kernel work-group (work-item `(tx, ty)` folds
/// every `by`-th element of column `b` from `k0 + ty`, four loads in flight, then the
/// partials meet in shared memory); the result is in work-items `ty == 0`.
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fold_column_range<T: Float, Op: ReduceOp>(input: &[T], a: usize, b: usize, r: usize, inner: usize, k0: usize, k1: usize, partials: &mut Shared<f32, COL_THREADS>) -> f32 {
    let (tx, ty) = (thread_idx_x() as usize, thread_idx_y() as usize);
    let (bx, by) = (block_dim_x() as usize, block_dim_y() as usize);
    let mut acc = Op::INIT;
    if b < inner {
        let col = column(input, a * r * inner + b, r, inner);
        let k1 = k1.min(r);
        // SAFETY (each `at`): k < k1 <= r, checked by `column`.
        let at = |k: usize| unsafe { col.get_unchecked(k * inner) }.to_f32();
        let mut k = k0 + ty;
        while k + 3 * by < k1 {
            let (x0, x1, x2, x3) = (at(k), at(k + by), at(k + 2 * by), at(k + 3 * by));
            acc = Op::combine(Op::combine(acc, x0), Op::combine(Op::combine(x1, x2), x3));
            k += 4 * by;
        }
        while k < k1 {
            acc = Op::combine(acc, at(k));
            k += by;
        }
    }
    partials[ty * bx + tx] = acc;
    barrier();
    let mut v = partials[tx];
    if ty == 0 {
        let mut y = 1;
        while y < by {
            v = Op::combine(v, partials[y * bx + tx]);
            y += 1;
        }
    }
    v
}

/// `out[a][b] = Op over k of input[a][k][b]` for a contiguous `(outer, r, inner)` input
/// and an `(outer, inner)` output. A work-group covers `bx` neighbouring columns
/// (coalesced loads) with `by` work-items per column, each folding every `by`-th element
/// (four loads in flight), then the partials meet in shared memory. Grid:
/// `outer * ceil(inner / bx)` work-groups, block `(bx, by)` = [`col_block`] (any shape of
/// at most 1024 work-items works).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min])]
pub fn reduce_cols<T: Float, Op: ReduceOp>(input: &[T], out: &mut [T], outer: u32, r: u32, inner: u32, mut partials: Shared<f32, COL_THREADS>) {
    let (outer, r, inner) = (outer as usize, r as usize, inner as usize);
    let bx = block_dim_x() as usize;
    // Work-group g covers columns [tile * bx, tile * bx + bx) of outer index a.
    let tiles = inner.div_ceil(bx);
    let g = block_idx_x() as usize;
    let (a, b) = (g / tiles, (g % tiles) * bx + thread_idx_x() as usize);
    if a < outer {
        let v = fold_column_range::<T, Op>(input, a, b, r, inner, 0, r, &mut partials);
        if thread_idx_y() == 0 && b < inner {
            out[a * inner + b] = T::from_f32(Op::finish(v, r));
        }
    }
}

/// First pass of a column reduction split over `grid_dim_y()` work-groups per column
/// tile (more work-groups, hence more loads in flight, than [`reduce_cols`](fn@reduce_cols)
/// has when the output is narrow: bf16 4096 x 4096 summed over the first dimension is 128
/// work-groups for 132 compute units): work-group `(g, s)` folds rows
/// `s * ceil(r / splits) ..` of the columns of `g` (as in `reduce_cols`) into
/// `part[(s * outer + a) * inner + b]` (no `finish`). Second pass:
/// [`reduce_cols_finish`](fn@reduce_cols_finish).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min])]
pub fn reduce_cols_part<T: Float, Op: ReduceOp>(input: &[T], part: &mut [f32], outer: u32, r: u32, inner: u32, mut partials: Shared<f32, COL_THREADS>) {
    let (outer, r, inner) = (outer as usize, r as usize, inner as usize);
    let bx = block_dim_x() as usize;
    let tiles = inner.div_ceil(bx);
    let g = block_idx_x() as usize;
    let (s, splits) = (block_idx_y() as usize, grid_dim_y() as usize);
    let (a, b) = (g / tiles, (g % tiles) * bx + thread_idx_x() as usize);
    if a < outer {
        let chunk = r.div_ceil(splits);
        let k0 = (s * chunk).min(r);
        let v = fold_column_range::<T, Op>(input, a, b, r, inner, k0, k0 + chunk, &mut partials);
        if thread_idx_y() == 0 && b < inner {
            part[(s * outer + a) * inner + b] = v;
        }
    }
}

/// Second pass of [`reduce_cols_part`](fn@reduce_cols_part): `out[o] = finish(Op over s of
/// part[s * out.len() + o], r)`, the splits in order. Launch with one work-item per output
/// (any 1-D grid: the loop is grid-stride).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min])]
pub fn reduce_cols_finish<T: Float, Op: ReduceOp>(part: &[f32], out: &mut [T], splits: u32, r: u32) {
    let n = out.len();
    let part = &part[..n * splits as usize];
    let splits = splits as usize;
    let mut o = global_idx_x();
    while o < n {
        let mut v = part[o];
        let mut s = 1;
        // Four partials in flight at a time (a loop of one load each waited a full memory
        // latency per split), combined in split order all the same. Unchecked: s + 3 <
        // splits and o < n keep every index below n * splits = part.len() (eight at a time
        // spilled gfx90a's registers).
        let mut at = n + o;
        while s + 4 <= splits {
            // SAFETY: see above; `at` = s * n + o.
            let p = unsafe { [*part.get_unchecked(at), *part.get_unchecked(at + n), *part.get_unchecked(at + 2 * n), *part.get_unchecked(at + 3 * n)] };
            v = Op::combine(Op::combine(Op::combine(Op::combine(v, p[0]), p[1]), p[2]), p[3]);
            s += 4;
            at += 4 * n;
        }
        while s < splits {
            v = Op::combine(v, part[s * n + o]);
            s += 1;
        }
        out[o] = T::from_f32(Op::finish(v, r as usize));
        o += global_size_x();
    }
}

/// Work-items along the columns of a [`reduce_cols_vec`](fn@reduce_cols_vec) work-group;
/// each holds [`CHUNK`](crate::row::CHUNK) neighbouring columns, so a wave reads 256
/// contiguous elements of a row (512 bytes of bf16, 1 KiB of f32) per load.
pub const VEC_COL_LANES: u32 = 32;
/// Work-items along the rows of a [`reduce_cols_vec`](fn@reduce_cols_vec) work-group.
pub const VEC_COL_ROWS: u32 = 8;
/// Shared-memory partials of [`reduce_cols_vec`](fn@reduce_cols_vec): one per column of
/// every work-item.
pub const VEC_COL_PARTIALS: usize = (VEC_COL_LANES * VEC_COL_ROWS) as usize * crate::row::CHUNK;

/// `Op` over the rows of long columns, as vectors: for a contiguous `(outer, r, inner)`
/// input with `inner` a multiple of [`CHUNK`](crate::row::CHUNK). Work-group `(g, s)` of
/// a `(outer * ceil(inner / 256), splits)` grid (block 32 x 8) covers 256 columns of
/// outer index `g / tiles` and rows `s * ceil(r / splits) ..`; work-item `(tx, ty)` folds
/// the 8 columns at `tx * 8` over every 8th of those rows (two 8-element loads in flight),
/// then the 8 partial rows meet in shared memory in a fixed order. With one split it
/// writes `finish` to `out`; with several, the plain partial to `part[(s * outer + a) *
/// inner + b]` for [`reduce_cols_finish`](fn@reduce_cols_finish). The vector loads (16
/// bytes a work-item, 512 bytes and more a wave) are what the scalar
/// [`reduce_cols`](fn@reduce_cols) lacks on long columns.
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Sum, Mean, Max, Min], max_threads = 256)]
pub fn reduce_cols_vec<T: Float, Op: ReduceOp>(input: &[T], part: &mut [f32], out: &mut [T], outer: u32, r: u32, inner: u32, mut partials: Shared<f32, VEC_COL_PARTIALS>) {
    use crate::row::CHUNK;
    let (outer, r, inner) = (outer as usize, r as usize, inner as usize);
    let (tx, ty) = (thread_idx_x() as usize, thread_idx_y() as usize);
    let (bx, by) = (block_dim_x() as usize, block_dim_y() as usize);
    if inner % CHUNK != 0 || outer * r * inner > input.len() || bx * by * CHUNK > VEC_COL_PARTIALS {
        panic!("reduce_cols_vec: shape, buffer or block do not match");
    }
    let width = bx * CHUNK;
    let tiles = inner.div_ceil(width);
    let g = block_idx_x() as usize;
    let (s, splits) = (block_idx_y() as usize, grid_dim_y() as usize);
    let (a, b) = (g / tiles, (g % tiles) * width + tx * CHUNK);
    let chunk = r.div_ceil(splits);
    let k0 = (s * chunk).min(r);
    let k1 = (k0 + chunk).min(r);
    let mut acc = [Op::INIT; CHUNK];
    if a < outer && b < inner {
        let vec = crate::row::vectorizable(input.as_ptr());
        let base = a * r * inner + b;
        let mut k = k0 + ty;
        // SAFETY (each load): k < k1 <= r and b + CHUNK <= inner (inner is a multiple of
        // CHUNK), so the chunk lies in `input` (checked above); base + k * inner is a
        // multiple of CHUNK.
        // Four rows in flight (two left 16-bit rows waiting on latency), then pairs.
        while k + 3 * by < k1 {
            let x0 = unsafe { crate::row::load_full(input, base + k * inner, vec) };
            let x1 = unsafe { crate::row::load_full(input, base + (k + by) * inner, vec) };
            let x2 = unsafe { crate::row::load_full(input, base + (k + 2 * by) * inner, vec) };
            let x3 = unsafe { crate::row::load_full(input, base + (k + 3 * by) * inner, vec) };
            each_lane!(j, {
                acc[j] = Op::combine(acc[j], Op::combine(Op::combine(x0[j], x1[j]), Op::combine(x2[j], x3[j])));
            });
            k += 4 * by;
        }
        while k + by < k1 {
            let x0 = unsafe { crate::row::load_full(input, base + k * inner, vec) };
            let x1 = unsafe { crate::row::load_full(input, base + (k + by) * inner, vec) };
            each_lane!(j, {
                acc[j] = Op::combine(acc[j], Op::combine(x0[j], x1[j]));
            });
            k += 2 * by;
        }
        if k < k1 {
            let x0 = unsafe { crate::row::load_full(input, base + k * inner, vec) };
            each_lane!(j, {
                acc[j] = Op::combine(acc[j], x0[j]);
            });
        }
    }
    each_lane!(j, {
        partials[(ty * bx + tx) * CHUNK + j] = acc[j];
    });
    barrier();
    if ty == 0 && a < outer && b < inner {
        let mut y = 1;
        while y < by {
            each_lane!(j, {
                acc[j] = Op::combine(acc[j], partials[(y * bx + tx) * CHUNK + j]);
            });
            y += 1;
        }
        if splits == 1 {
            each_lane!(j, {
                out[a * inner + b + j] = T::from_f32(Op::finish(acc[j], r));
            });
        } else {
            each_lane!(j, {
                part[(s * outer + a) * inner + b + j] = acc[j];
            });
        }
    }
}

/// Splits of a [`reduce_cols_vec`](fn@reduce_cols_vec) launch whose first pass has
/// `groups` work-groups of 256 work-items over `r` rows: about 128 work-groups (one per
/// compute unit of an H100, each with four 16-byte loads per work-item in flight), each
/// at least 256 rows. H100, 4096 x 4096 over dim 0 (`bench-llm --sweep`): 8 splits took
/// 16.2 us (bf16) / 32.8 us (f32), 16 splits 16.7 / 33.5, 64 splits 22.9 / 41.9 (the
/// second pass folds `splits` partials per output).
pub const fn vec_col_splits(groups: usize, r: usize) -> usize {
    if groups == 0 || groups >= 128 {
        return 1;
    }
    let s = 128 / groups;
    let most = r / 256;
    let s = if s < most { s } else { most };
    if s > 1 { if s > 65535 { 65535 } else { s } } else { 1 }
}

/// Column tiles of a [`reduce_cols_vec`](fn@reduce_cols_vec) launch over `inner` columns
/// (each tile: [`VEC_COL_LANES`] work-items of [`CHUNK`](crate::row::CHUNK) columns).
pub const fn vec_col_tiles(inner: usize) -> usize {
    inner.div_ceil(VEC_COL_LANES as usize * crate::row::CHUNK)
}

/// `true` when a column reduction over `r` rows of `inner` columns takes
/// [`reduce_cols_vec`](fn@reduce_cols_vec): whole chunks of columns, and columns long
/// enough (256 rows) that the scalar kernel's narrow loads are what limits it.
pub const fn vec_cols(r: usize, inner: usize) -> bool {
    inner % crate::row::CHUNK == 0 && inner >= 128 && r >= 256
}

/// Splits of a column reduction over `r` rows whose [`reduce_cols`](fn@reduce_cols) grid
/// has `groups` work-groups: enough for about 1024 work-groups (8 per compute unit of an
/// H100), each at least 256 rows; 1 (no split) from 512 work-groups or under 512 rows.
pub const fn col_splits(groups: usize, r: usize) -> usize {
    if groups >= 512 || groups == 0 {
        return 1;
    }
    let s = 1024 / groups;
    let most = r / 256;
    let s = if s < most { s } else { most };
    if s > 1 { if s > 65535 { 65535 } else { s } } else { 1 }
}

/// Index (`0..r`) of the extreme element along `r`, shapes and launch as in
/// [`reduce_cols`](fn@reduce_cols).
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [ArgMax, ArgMin])]
pub fn argreduce_cols<T: Float, Op: ArgOp>(input: &[T], out: &mut [u32], outer: u32, r: u32, inner: u32, mut values: Shared<f32, COL_THREADS>, mut indices: Shared<u32, COL_THREADS>) {
    let (outer, r, inner) = (outer as usize, r as usize, inner as usize);
    let (tx, ty) = (thread_idx_x() as usize, thread_idx_y() as usize);
    let (bx, by) = (block_dim_x() as usize, block_dim_y() as usize);
    // Work-group g covers columns [tile * bx, tile * bx + bx) of outer index a.
    let tiles = inner.div_ceil(bx);
    let g = block_idx_x() as usize;
    let (a, b) = (g / tiles, (g % tiles) * bx + tx);
    if a < outer {
        let (mut v, mut i) = (Op::INIT, NO_INDEX);
        if b < inner {
            let col = column(input, a * r * inner + b, r, inner);
            let mut k = ty;
            while k < r {
                // SAFETY: k < r, checked by `column`.
                (v, i) = arg_step::<Op>(v, i, unsafe { col.get_unchecked(k * inner) }.to_f32(), k as u32);
                k += by;
            }
        }
        values[ty * bx + tx] = v;
        indices[ty * bx + tx] = i;
        barrier();
        if ty == 0 && b < inner {
            let (mut rv, mut ri) = (values[tx], indices[tx]);
            let mut y = 1;
            while y < by {
                (rv, ri) = arg_pick::<Op>(rv, ri, values[y * bx + tx], indices[y * bx + tx]);
                y += 1;
            }
            out[a * inner + b] = ri;
        }
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host {
    use super::{ArgOp, ReduceOp};
    use crate::runtime::{Device, DeviceVec};
    use kernel_dsl::host::{LaunchConfig, LaunchError};
    use kernel_dsl::{Dim3, Float};

    /// Checks a planned reduction against its buffers: the input covers the view and the
    /// output has one element per result.
    fn check(plan: &ReducePlan, dims: &[usize], strides: &[usize], input: usize, out: usize, empty_ok: bool) -> Result<(), LaunchError> {
        let bad = |reason: String| LaunchError::InvalidArgument { kernel: "reduce", reason };
        if plan.outputs() != out {
            return Err(bad(format!("output has {out} elements, the reduction produces {}", plan.outputs())));
        }
        if plan.outputs() > 0 && plan.reduced() == 0 && !empty_ok {
            return Err(bad("max, min, argmax and argmin of an empty dimension have no value".into()));
        }
        if dims.iter().all(|&d| d > 0) {
            let last: usize = dims.iter().zip(strides).map(|(d, s)| (d - 1) * s).sum();
            if last >= input {
                return Err(bad(format!("the view reaches element {last} of a {input}-element input")));
            }
        }
        Ok(())
    }

    /// The checked plan and launch shape of a reduction, `None` when it has no outputs.
    #[allow(clippy::too_many_arguments)]
    fn prepare(dev: &Device, dims: &[usize], strides: &[usize], reduce: &[usize], input: usize, out: usize, empty_ok: bool, elem_bytes: usize) -> Result<Option<(ReducePlan, LaunchConfig)>, LaunchError> {
        let p = plan(dims, strides, reduce)?;
        check(&p, dims, strides, input, out, empty_ok)?;
        if p.outputs() == 0 {
            return Ok(None);
        }
        let cfg = p.launch_config(dev.wave_lanes(), elem_bytes);
        Ok(Some((p, cfg)))
    }

    /// Reduces the view `dims`/`strides` of `input` over the dimensions `reduce` into the
    /// contiguous `out` (the kept dimensions in order) with `Op`
    /// ([`Sum`](super::Sum), [`Mean`](super::Mean), [`Max`](super::Max), [`Min`](super::Min)).
    /// Checks every size first; bad input returns an error and launches nothing.
    pub fn reduce<T: Float, Op: ReduceOp>(
        dev: &Device,
        input: &DeviceVec<T>,
        dims: &[usize],
        strides: &[usize],
        reduce: &[usize],
        out: &mut DeviceVec<T>,
    ) -> Result<(), LaunchError> {
        let Some((p, cfg)) = prepare(dev, dims, strides, reduce, input.len(), out.len(), Op::EMPTY_OK, std::mem::size_of::<T>())? else {
            return Ok(());
        };
        match &p {
            // Contiguous rows pass an empty layout without a buffer; other layouts come from
            // the device's shared uploads (one upload per distinct layout).
            ReducePlan::Rows { cols, layout, .. } if layout.is_empty() => super::reduce_rows::launch::<T, Op>(dev, cfg, input, &[] as &[usize; 0], out, *cols as u32),
            ReducePlan::Rows { cols, layout, .. } => {
                let layout = dev.upload_shared(layout)?;
                super::reduce_rows::launch::<T, Op>(dev, cfg, input, &*layout, out, *cols as u32)
            }
            ReducePlan::WaveRows { cols, .. } => super::reduce_rows_wave::launch::<T, Op>(dev, cfg, input, out, *cols as u32),
            ReducePlan::Cols { outer, r, inner } if super::vec_cols(*r, *inner) => {
                let splits = super::vec_col_splits(outer * super::vec_col_tiles(*inner), *r);
                reduce_long_columns::<T, Op>(dev, input, (*outer, *r, *inner), splits, out)
            }
            ReducePlan::Cols { outer, r, inner } => {
                let splits = super::col_splits(cfg.grid.x as usize, *r);
                if splits > 1 {
                    // Split rows: partials in scratch, then a second pass (see `reduce_cols_part`).
                    let mut part = dev.scratch::<f32>(splits * outer * inner)?;
                    let cfg1 = LaunchConfig::new(Dim3::new(cfg.grid.x, splits as u32, 1), cfg.block);
                    super::reduce_cols_part::launch::<T, Op>(dev, cfg1, input, &mut part, *outer as u32, *r as u32, *inner as u32)?;
                    return finish_split_columns::<T, Op>(dev, &part, out, splits, *r);
                }
                super::reduce_cols::launch::<T, Op>(dev, cfg, input, out, *outer as u32, *r as u32, *inner as u32)
            }
        }
    }

    /// The column reduction of a contiguous `(outer, r, inner)` `input` into `out`
    /// (`outer * inner`) by [`reduce_cols_vec`](fn@super::reduce_cols_vec) with its rows
    /// split `splits` ways (1: one pass; more: partials in scratch, then
    /// [`reduce_cols_finish`](fn@super::reduce_cols_finish) in split order). [`reduce`]
    /// picks it and the split count ([`vec_cols`](super::vec_cols),
    /// [`vec_col_splits`](super::vec_col_splits)); public for tests of both passes.
    pub fn reduce_long_columns<T: Float, Op: ReduceOp>(
        dev: &Device,
        input: &DeviceVec<T>,
        (outer, r, inner): (usize, usize, usize),
        splits: usize,
        out: &mut DeviceVec<T>,
    ) -> Result<(), LaunchError> {
        let bad = |reason: String| Err(LaunchError::InvalidArgument { kernel: "reduce_cols_vec", reason });
        if inner % crate::row::CHUNK != 0 || splits == 0 || splits > 65535 {
            return bad(format!("inner {inner} must be a multiple of {}, splits {splits} in 1..=65535", crate::row::CHUNK));
        }
        let n = outer.checked_mul(r).and_then(|v| v.checked_mul(inner));
        if n.is_none_or(|n| n > input.len() || n > u32::MAX as usize) || outer * inner != out.len() {
            return bad(format!("input {} / output {} do not hold {outer} x {r} x {inner}", input.len(), out.len()));
        }
        if outer * inner == 0 {
            return Ok(());
        }
        let tiles = super::vec_col_tiles(inner);
        let block = Dim3::new(super::VEC_COL_LANES, super::VEC_COL_ROWS, 1);
        let cfg1 = LaunchConfig::new(Dim3::new((outer * tiles) as u32, splits as u32, 1), block);
        if splits == 1 {
            let mut none = dev.scratch::<f32>(0)?;
            return super::reduce_cols_vec::launch::<T, Op>(dev, cfg1, input, &mut none, out, outer as u32, r as u32, inner as u32);
        }
        let mut part = dev.scratch::<f32>(splits * outer * inner)?;
        super::reduce_cols_vec::launch::<T, Op>(dev, cfg1, input, &mut part, out, outer as u32, r as u32, inner as u32)?;
        finish_split_columns::<T, Op>(dev, &part, out, splits, r)
    }

    /// The second pass of both split column reductions: `out` from the `splits` partial
    /// rows in `part` ([`reduce_cols_finish`](fn@super::reduce_cols_finish), split order).
    fn finish_split_columns<T: Float, Op: ReduceOp>(dev: &Device, part: &DeviceVec<f32>, out: &mut DeviceVec<T>, splits: usize, r: usize) -> Result<(), LaunchError> {
        let cfg = crate::indexing::elements_config(out.len());
        super::reduce_cols_finish::launch::<T, Op>(dev, cfg, part, out, splits as u32, r as u32)
    }

    /// As [`reduce`], writing the index (along the reduced dimensions, row-major) of the
    /// extreme element with `Op` ([`ArgMax`](super::ArgMax), [`ArgMin`](super::ArgMin)).
    pub fn arg_reduce<T: Float, Op: ArgOp>(
        dev: &Device,
        input: &DeviceVec<T>,
        dims: &[usize],
        strides: &[usize],
        reduce: &[usize],
        out: &mut DeviceVec<u32>,
    ) -> Result<(), LaunchError> {
        let Some((p, cfg)) = prepare(dev, dims, strides, reduce, input.len(), out.len(), false, std::mem::size_of::<T>())? else {
            return Ok(());
        };
        match &p {
            // Contiguous rows pass an empty layout without a buffer; other layouts come from
            // the device's shared uploads (one upload per distinct layout).
            ReducePlan::Rows { cols, layout, .. } if layout.is_empty() => super::argreduce_rows::launch::<T, Op>(dev, cfg, input, &[] as &[usize; 0], out, *cols as u32),
            ReducePlan::Rows { cols, layout, .. } => {
                let layout = dev.upload_shared(layout)?;
                super::argreduce_rows::launch::<T, Op>(dev, cfg, input, &*layout, out, *cols as u32)
            }
            ReducePlan::WaveRows { cols, .. } => super::argreduce_rows_wave::launch::<T, Op>(dev, cfg, input, out, *cols as u32),
            ReducePlan::Cols { outer, r, inner } => super::argreduce_cols::launch::<T, Op>(dev, cfg, input, out, *outer as u32, *r as u32, *inner as u32),
        }
    }

    /// How to run a reduction of a strided tensor over a set of dimensions.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum ReducePlan {
        /// [`reduce_rows`](fn@super::reduce_rows) with this `layout` (empty: contiguous rows)
        /// over `rows` outputs of `cols` elements each.
        Rows { rows: usize, cols: usize, layout: Vec<usize> },
        /// [`reduce_rows_wave`](fn@super::reduce_rows_wave): one wave per contiguous row, for
        /// many rows.
        WaveRows { rows: usize, cols: usize },
        /// [`reduce_cols`](fn@super::reduce_cols) over a contiguous `(outer, r, inner)` view.
        Cols { outer: usize, r: usize, inner: usize },
    }

    impl ReducePlan {
        /// Number of output elements.
        pub fn outputs(&self) -> usize {
            match self {
                ReducePlan::Rows { rows, .. } | ReducePlan::WaveRows { rows, .. } => *rows,
                ReducePlan::Cols { outer, inner, .. } => outer * inner,
            }
        }

        /// Elements folded into each output.
        pub fn reduced(&self) -> usize {
            match self {
                ReducePlan::Rows { cols, .. } | ReducePlan::WaveRows { cols, .. } => *cols,
                ReducePlan::Cols { r, .. } => *r,
            }
        }

        /// Launch shape of the plan's kernel on a device with waves of `wave_lanes` lanes,
        /// for elements of `elem_bytes` bytes.
        pub fn launch_config(&self, wave_lanes: u32, elem_bytes: usize) -> LaunchConfig {
            match self {
                ReducePlan::WaveRows { rows, .. } => crate::row::wave_rows_config(*rows, wave_lanes),
                ReducePlan::Rows { rows, cols, .. } => {
                    LaunchConfig::new(Dim3::x(*rows as u32), Dim3::x(crate::row::reduce_threads(*cols)))
                }
                ReducePlan::Cols { outer, r, inner } => {
                    let (bx, by) = super::col_block(*r, elem_bytes);
                    LaunchConfig::new(Dim3::x((outer * inner.div_ceil(bx as usize)) as u32), Dim3::new(bx, by, 1))
                }
            }
        }
    }

    /// Contiguous rows: a wave per row when there are enough rows to fill a GPU with
    /// waves (an H100 holds 132 x 64 of them), else a work-group per row.
    fn row_plan(rows: usize, cols: usize) -> ReducePlan {
        if rows >= crate::row::WAVE_ROWS_MIN {
            ReducePlan::WaveRows { rows, cols }
        } else {
            ReducePlan::Rows { rows, cols, layout: vec![] }
        }
    }

    /// Plans the reduction of the view `dims`/`strides` (element units) over the
    /// dimensions `reduce` (any order, no repeats). The output is contiguous with the
    /// kept dimensions in order (reduced ones have size 1, or are dropped: same layout).
    /// Errors for an out-of-range or repeated dimension, or sizes past the kernels' 32-bit
    /// counters.
    pub fn plan(dims: &[usize], strides: &[usize], reduce: &[usize]) -> Result<ReducePlan, LaunchError> {
        let bad = |reason: String| LaunchError::InvalidArgument { kernel: "reduce", reason };
        if dims.len() != strides.len() {
            return Err(bad(format!("{} dims but {} strides", dims.len(), strides.len())));
        }
        let mut reduced = vec![false; dims.len()];
        for &d in reduce {
            if d >= dims.len() {
                return Err(bad(format!("dimension {d} out of range for a rank-{} tensor", dims.len())));
            }
            if std::mem::replace(&mut reduced[d], true) {
                return Err(bad(format!("dimension {d} listed twice")));
            }
        }
        let kept = (0..dims.len()).filter(|&d| !reduced[d]);
        let cut = (0..dims.len()).filter(|&d| reduced[d]);
        let outputs: usize = kept.clone().map(|d| dims[d]).product();
        let r: usize = cut.clone().map(|d| dims[d]).product();
        if u32::try_from(r).is_err() || u32::try_from(outputs).is_err() {
            return Err(bad(format!("{outputs} outputs of {r} elements exceed the 2^32 the kernels count to")));
        }
        let contiguous = {
            let mut expect = 1;
            let mut ok = true;
            for d in (0..dims.len()).rev() {
                if dims[d] != 1 && strides[d] != expect {
                    ok = false;
                }
                expect *= dims[d];
            }
            ok
        };
        // The reduced dims, ignoring size-1 ones, as one block [first, last].
        let real: Vec<usize> = cut.clone().filter(|&d| dims[d] != 1).collect();
        if contiguous && !real.is_empty() && real.windows(2).all(|w| (w[0] + 1..w[1]).all(|d| dims[d] == 1)) {
            let (first, last) = (real[0], *real.last().unwrap());
            let outer: usize = dims[..first].iter().product();
            let inner: usize = dims[last + 1..].iter().product();
            if inner == 1 {
                return Ok(row_plan(outer, r));
            }
            // Narrow, long columns would leave most of a column work-group idle: those go
            // through the work-group-per-output kernel.
            let groups = outer * inner.div_ceil(super::COL_TILE as usize);
            if (inner >= super::COL_TILE as usize || outer * inner >= 4096 || r <= 64) && groups < 1 << 31 {
                return Ok(ReducePlan::Cols { outer, r, inner });
            }
        }
        if contiguous && real.is_empty() {
            return Ok(row_plan(outputs, r));
        }
        let order: Vec<usize> = kept.chain(cut).collect();
        let mut layout: Vec<usize> = order.iter().map(|&d| dims[d]).collect();
        layout.extend(order.iter().map(|&d| strides[d]));
        Ok(ReducePlan::Rows { rows: outputs, cols: r, layout })
    }
}
