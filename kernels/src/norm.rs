//! Row normalisations over the last dimension of a contiguous `rows x cols` tensor: RMSNorm
//! and LayerNorm, one work-group per row, f32 accumulation, optional affine weights.
//!
//! Rows that fit the register tiles (up to 16384 elements with 1024 work-items, 32768 of
//! 16-bit types on NVIDIA) and are whole 16-byte-aligned chunks
//! ([`whole_chunks`]: a width that is a multiple of 8 in buffers
//! that start aligned, as every allocation does) are read from memory once, with one
//! vector load per chunk and no scalar alternative in the code; LayerNorm takes the sums of
//! `x - x[0]` and of its square from the registers in one work-group reduction (the shift
//! keeps a large mean from cancelling). On NVIDIA and the CPU executor 16-bit rows stay
//! packed in registers ([`PackedTile`]): four chunks per work-item fit the 64-register cap of
//! 1024-item kernels, and the weight loads go out with the row's; LayerNorm's bias is
//! copied into shared memory beside them ([`bias_stage_words`]) and read back after the
//! reduction. Longer rows, and misaligned ones (views at odd offsets, odd widths), stream
//! the input twice: once for the statistics, once to write.
use crate::reduce::{block_reduce, block_sum2, MAX_WAVES};
use crate::row::{for_each_chunk, for_each_chunk_of, for_each_row_of_wave, load_chunk_as, load_chunk_scalar, map_chunks, map_chunks_of, row_chunks, whole_chunks, PackedTile, RowTile, CHUNK};

/// The register tile of one work-item.
type Tile = RowTile;
use crate::each_lane;
use crate::indexing::Words4;
use kernel_dsl::mma::{copy, SharedAddr};
use kernel_dsl::prelude::*;

/// `v * scale * w + b` per element of a chunk, where `w` / `b` are the chunk of the weight
/// and bias rows starting at `e` (an empty weight is 1, an empty bias -0: the additive
/// identity, so a `-0` product stays `-0` as in Candle's `x * rstd * w`).
#[device]
#[inline(always)]
fn affine_chunk<T: Float>(v: &[f32; CHUNK], shift: f32, scale: f32, weight: &[T], bias: &[T], e: usize) -> [f32; CHUNK] {
    affine_chunk_as::<T, false>(v, shift, scale, weight, bias, e)
}

/// [`affine_chunk`]; with `WHOLE` the weight and bias are [`whole_chunks`] (or empty).
#[device]
#[inline(always)]
fn affine_chunk_as<T: Float, const WHOLE: bool>(v: &[f32; CHUNK], shift: f32, scale: f32, weight: &[T], bias: &[T], e: usize) -> [f32; CHUNK] {
    // An empty slice loads as all padding: weight 1, bias 0.
    affine_with(v, shift, scale, load_chunk_as::<T, WHOLE>(weight, e, 1.0), load_chunk_as::<T, WHOLE>(bias, e, -0.0))
}

/// `true` when a row kernel's row `x`, output `y` and parameters `p` (each empty or
/// of `x.len()` elements) are [`whole_chunks`]: the straight-line vector path applies.
#[device]
#[inline(always)]
fn all_whole<T>(x: &[T], y: &[T], p: &[T], q: &[T]) -> bool {
    whole_chunks(x) && whole_chunks(y) && whole_chunks(p) && whole_chunks(q)
}

/// The register-tile RMSNorm of one row of whole chunks (see [`rms_norm`](fn@rms_norm)):
/// `x`, `y` and `w` are [`whole_chunks`].
#[device]
#[inline(always)]
fn rms_norm_tile<T: Float>(x: &[T], w: &[T], y: &mut [T], eps: f32, partials: &mut Shared<f32, MAX_WAVES>) {
    let cols = x.len();
    if core::mem::size_of::<T>() == 2 && !cfg!(target_arch = "amdgpu") {
        // 16-bit rows stay packed (see `PackedTile`), which leaves registers for the
        // weights: their loads go out with the row's, ahead of the reduction.
        let (part, parts) = (flat_thread_idx() as usize, flat_block_dim() as usize);
        let chunks = row_chunks(core::mem::size_of::<T>(), cols);
        // Chunks past the row read as 0 (nothing to the sum of squares), weights past it
        // (all of them for an empty weight row) as 1: no per-element choices.
        let mut t = PackedTile::load_whole(x, part, parts, chunks);
        let mut wt = PackedTile::load_whole_padded(w, part, parts, chunks, T::from_f32(1.0));
        let mut ss = 0.0f32;
        crate::each_tile_chunk!(k, t.chunks, {
            let v = t.get_whole(k);
            each_lane!(j, {
                ss += v[j] * v[j];
            });
        });
        let ss = block_reduce(ss, partials, |a, b| a + b);
        let scale = (ss / cols as f32 + eps).rsqrt();
        // Unpack both after the reduction (ptxas otherwise unpacked the weights early and
        // kept twice their registers alive across it).
        t.refresh();
        wt.refresh();
        crate::each_tile_chunk!(k, t.chunks, {
            let e = t.start(k);
            if e + CHUNK <= y.len() {
                let r = affine_with(&t.get_whole(k), 0.0, scale, wt.get_whole(k), [-0.0; CHUNK]);
                // SAFETY: in bounds (checked); aligned by `whole_chunks(y)`.
                unsafe { crate::row::store_full(y, e, &r, true) };
            }
        });
        return;
    }
    let none: &[T] = &[];
    let tile = Tile::load_as::<T, true>(x, 0.0, flat_thread_idx() as usize, flat_block_dim() as usize, row_chunks(core::mem::size_of::<T>(), cols));
    // Zero padding adds nothing to the sum of squares.
    let ss = block_reduce(tile.fold_padded(0.0, |a, v| a + v * v), partials, |a, b| a + b);
    let scale = (ss / cols as f32 + eps).rsqrt();
    tile.store_as::<T, true>(y, |v, e| affine_chunk_as::<T, true>(v, 0.0, scale, w, none, e));
}

/// [`affine_chunk`] with element-by-element weight loads: fewer registers than vector
/// loads (`layer_norm_long` spilled scalar registers on gfx90a with them).
#[device]
#[inline(always)]
fn affine_chunk_scalar<T: Float>(v: &[f32; CHUNK], shift: f32, scale: f32, weight: &[T], bias: &[T], e: usize) -> [f32; CHUNK] {
    affine_with(v, shift, scale, load_chunk_scalar(weight, e, 1.0), load_chunk_scalar(bias, e, -0.0))
}

/// `(v - shift) * scale * w + b`, elementwise.
#[device]
#[inline(always)]
fn affine_with(v: &[f32; CHUNK], shift: f32, scale: f32, w: [f32; CHUNK], b: [f32; CHUNK]) -> [f32; CHUNK] {
    let mut r = [0.0; CHUNK];
    each_lane!(j, {
        r[j] = (v[j] - shift).mul_add(scale * w[j], b[j]);
    });
    r
}

/// Largest `|mean * rstd|` for which LayerNorm's packed path takes [`affine_fused`]: its
/// rounding then moves an output by at most 2^-16 times the weight.
const FUSED_SHIFT_MAX: f32 = 256.0;

/// `(v * scale + shift_scaled) * w + b`, elementwise, in two fused multiply-adds: the
/// affine map of [`affine_with`] with `shift_scaled = -shift * scale`, one operation per
/// element fewer (1% of LayerNorm's time at bf16 4096x4096 on the H100), exact up to the
/// rounding of `shift_scaled` (see [`FUSED_SHIFT_MAX`]).
#[device]
#[inline(always)]
fn affine_fused(v: &[f32; CHUNK], scale: f32, shift_scaled: f32, w: [f32; CHUNK], b: [f32; CHUNK]) -> [f32; CHUNK] {
    let mut r = [0.0; CHUNK];
    each_lane!(j, {
        r[j] = v[j].mul_add(scale, shift_scaled).mul_add(w[j], b[j]);
    });
    r
}

/// RMSNorm: `out = x / sqrt(mean(x^2) + eps) * weight`; `weight` has `cols` elements or is
/// empty (no scaling). Launch with [`launch_config`].
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn rms_norm<T: Float>(input: &[T], weight: &[T], out: &mut [T], cols: u32, eps: f32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let w = if weight.is_empty() { weight } else { &weight[..cols] };
    let y = &mut out[start..end];
    let none: &[T] = &[];
    // Rows of whole aligned chunks that fit the tiles: read once. Others (longer, or
    // misaligned views and odd widths, rare): two streaming passes.
    if Tile::fits::<T>(cols) && all_whole(x, y, w, none) {
        rms_norm_tile(x, w, y, eps, &mut partials);
    } else {
        let mut s = 0.0f32;
        for_each_chunk(x, 0.0, |v, _| {
            each_lane!(j, {
                s += v[j] * v[j];
            });
        });
        let ss = block_reduce(s, &mut partials, |a, b| a + b);
        let scale = (ss / cols as f32 + eps).rsqrt();
        map_chunks(x, y, |v, e| affine_chunk(v, 0.0, scale, w, none, e));
    }
}

/// LayerNorm of rows that fit the work-group's register tiles of
/// [`row_chunks`] chunks per work-item:
/// `out = (x - mean) / sqrt(var + eps) * weight + bias` with the biased variance
/// `mean((x - mean)^2)`; `weight` and `bias` have `cols` elements or are empty (1 and 0).
/// The row is read once; the sums of `x - x[0]` and of its square come from the registers
/// in one work-group reduction (the shift keeps the variance free of cancellation for rows
/// whose mean is large against their spread, as in [`layer_norm_long`](fn@layer_norm_long)).
/// `bias_stage` holds [`bias_stage_words`] 16-byte words, or none (the bias is then read
/// after the reduction). Launch with [`layer_norm_launch_config`]. Longer rows abort the
/// launch: use [`layer_norm_long`](fn@layer_norm_long), or [`layer_norm_rows`], which picks.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn layer_norm<T: Float>(
    input: &[T],
    weight: &[T],
    bias: &[T],
    out: &mut [T],
    cols: u32,
    eps: f32,
    mut partials: Shared<f32, MAX_WAVES>,
    mut partials2: Shared<f32, MAX_WAVES>,
    mut bias_stage: SharedDyn<Words4>,
) {
    let cols = cols as usize;
    let chunks = row_chunks(core::mem::size_of::<T>(), cols);
    assert!(Tile::fits_with(cols, chunks));
    if cols == 0 {
        return;
    }
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let w = if weight.is_empty() { weight } else { &weight[..cols] };
    let b = if bias.is_empty() { bias } else { &bias[..cols] };
    let y = &mut out[start..end];
    // Misaligned views and odd widths (rare): the two streaming passes of `layer_norm_long`.
    if all_whole(x, y, w, b) {
        layer_norm_tile(x, w, b, y, eps, chunks, &mut partials, &mut partials2, &mut bias_stage);
    } else {
        layer_norm_stream(x, w, b, y, eps, &mut partials, &mut partials2);
    }
}

/// Adds a chunk's `v - k0` to `s` and its square to `q` (LayerNorm's shifted sums).
#[device]
#[inline(always)]
fn add_shifted(v: &[f32; CHUNK], k0: f32, s: &mut f32, q: &mut f32) {
    each_lane!(j, {
        let d = v[j] - k0;
        *s += d;
        *q = d.mul_add(d, *q);
    });
}

/// LayerNorm's statistics of a row of `cols` elements from each work-item's shifted sums
/// ([`add_shifted`]): `(mean - k0, 1 / sqrt(var + eps))`, in every work-item.
#[device]
#[inline(always)]
fn shifted_stats(s: f32, q: f32, cols: usize, eps: f32, partials: &mut Shared<f32, MAX_WAVES>, partials2: &mut Shared<f32, MAX_WAVES>) -> (f32, f32) {
    let inv_n = 1.0 / cols as f32;
    let (s, q) = block_sum2(s, q, partials, partials2);
    let (s, q) = (s * inv_n, q * inv_n);
    // Clamp rounding below zero, but keep a NaN (from inf inputs) a NaN.
    let var = q - s * s;
    (s, ((if var < 0.0 { 0.0 } else { var }) + eps).rsqrt())
}

/// The register-tile LayerNorm of one non-empty row of whole chunks (see
/// [`layer_norm`](fn@layer_norm)): `x`, `y`, `w` and `b` are [`whole_chunks`].
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_tile<T: Float>(
    x: &[T],
    w: &[T],
    b: &[T],
    y: &mut [T],
    eps: f32,
    chunks: usize,
    partials: &mut Shared<f32, MAX_WAVES>,
    partials2: &mut Shared<f32, MAX_WAVES>,
    bias_stage: &mut SharedDyn<Words4>,
) {
    let k0 = x[0].to_f32();
    let (part, parts) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    if core::mem::size_of::<T>() == 2 && !cfg!(target_arch = "amdgpu") {
        // 16-bit rows stay packed (see `PackedTile`): four chunks fit beside the weight
        // and bias loads. The row streams past L1 (evict-first loads), which keeps the
        // weight and bias lines every row reads.
        let mut t = PackedTile::load_whole_streaming(x, part, parts, chunks);
        // The weights load with the row, ahead of the reduction (as RMSNorm's).
        let mut wt = PackedTile::load_whole_padded(w, part, parts, chunks, T::from_f32(1.0));
        // With room for them (see `bias_stage_words`), the bias chunks are copied into
        // shared memory alongside, without registers (asynchronously on NVIDIA): after the
        // reduction they are there. (Loaded from global memory only after it, their
        // latency cost 3% at 4096 columns; held in registers from here, they spilled.)
        // Each work-item reads back only its own chunks: no barrier.
        let staged = !b.is_empty() && bias_stage.len() >= t.chunks * parts;
        // This work-item's slot of chunk k (its position in the tile: k * parts + part).
        let stage = SharedAddr::new(bias_stage.as_ptr());
        let slot = |k: usize| stage.add((k * parts + part) * core::mem::size_of::<Words4>());
        if staged {
            crate::each_tile_chunk!(k, t.chunks, {
                let e = t.start(k);
                if e + CHUNK <= b.len() {
                    // SAFETY: slot k * parts + part < chunks * parts <= bias_stage.len(),
                    // 16-byte aligned (`Words4`); the bias chunk is in bounds (checked) and
                    // 16-byte aligned by `whole_chunks(b)`.
                    unsafe { copy::copy_16_whole_cached_at(slot(k), b.as_ptr().add(e) as *const u8) };
                }
            });
            copy::commit();
        }
        let (mut s, mut q) = (0.0f32, 0.0f32);
        if t.chunks * parts * CHUNK <= x.len() {
            // No chunk past the row (the usual widths): no per-element choice.
            crate::each_tile_chunk!(k, t.chunks, {
                add_shifted(&t.get_whole(k), k0, &mut s, &mut q);
            });
        } else {
            crate::each_tile_chunk!(k, t.chunks, {
                // Padding reads as k0, so it adds nothing to either sum.
                add_shifted(&t.get(k, x.len(), k0), k0, &mut s, &mut q);
            });
        }
        let (s, rstd) = shifted_stats(s, q, x.len(), eps, partials, partials2);
        t.refresh();
        wt.refresh();
        let has_b = !b.is_empty();
        let mean = k0 + s;
        // Two multiply-adds per element where `mean * rstd` is small enough that rounding it
        // costs at most 2^-16 (far below a 16-bit output's ulp at 1); rows whose mean is
        // large against their spread (a constant row of 1000s: 3e5) keep the subtraction.
        let shift_scaled = -(mean * rstd);
        let fused = shift_scaled.abs() < FUSED_SHIFT_MAX;
        if staged {
            copy::wait_groups(0);
        }
        crate::each_tile_chunk!(k, t.chunks, {
            let e = t.start(k);
            if e + CHUNK <= y.len() {
                // A chunk inside the row (y is as long as x): all loaded, no padding.
                let v = t.get_whole(k);
                let bias = if staged {
                    // SAFETY: the slot this work-item filled above (its copies are complete).
                    let words = unsafe { copy::load_shared_u32x4(slot(k)) };
                    crate::row::unpack_chunk(&crate::row::words_chunk::<T>(words))
                } else if has_b {
                    // SAFETY: e + CHUNK <= y.len() == b.len(); aligned by `whole_chunks(b)`.
                    unsafe { crate::row::load_full(b, e, true) }
                } else {
                    [-0.0; CHUNK]
                };
                let r = if fused { affine_fused(&v, rstd, shift_scaled, wt.get_whole(k), bias) } else { affine_with(&v, mean, rstd, wt.get_whole(k), bias) };
                // SAFETY: in bounds (checked); aligned by `whole_chunks(y)`.
                unsafe { crate::row::store_full(y, e, &r, true) };
            }
        });
        return;
    }
    // Padding reads as k0, so it adds nothing to either sum.
    let tile = Tile::load_as::<T, true>(x, k0, part, parts, chunks);
    let s = tile.fold_padded(0.0, |a, v| a + (v - k0));
    let q = tile.fold_padded(0.0, |a, v| a + (v - k0) * (v - k0));
    let (s, rstd) = shifted_stats(s, q, x.len(), eps, partials, partials2);
    tile.store_as::<T, true>(y, |v, e| affine_chunk_as::<T, true>(v, k0 + s, rstd, w, b, e));
}

/// LayerNorm of rows of any length, as [`layer_norm`](fn@layer_norm), streaming the row twice: once for
/// the statistics (sums of `x - x[0]` and of its square: the shift keeps the variance free
/// of cancellation for rows whose mean is large against their spread), once to write.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn layer_norm_long<T: Float>(input: &[T], weight: &[T], bias: &[T], out: &mut [T], cols: u32, eps: f32, mut partials: Shared<f32, MAX_WAVES>, mut partials2: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let w = if weight.is_empty() { weight } else { &weight[..cols] };
    let b = if bias.is_empty() { bias } else { &bias[..cols] };
    let y = &mut out[start..end];
    layer_norm_stream(x, w, b, y, eps, &mut partials, &mut partials2);
}

/// LayerNorm of one row in two streaming passes (see [`layer_norm_long`](fn@layer_norm_long)).
#[device]
#[inline(always)]
fn layer_norm_stream<T: Float>(x: &[T], w: &[T], b: &[T], y: &mut [T], eps: f32, partials: &mut Shared<f32, MAX_WAVES>, partials2: &mut Shared<f32, MAX_WAVES>) {
    let cols = x.len();
    let k0 = if cols == 0 { 0.0 } else { x[0].to_f32() };
    let (mut s, mut q) = (0.0f32, 0.0f32);
    // Padding reads as k0, so it adds nothing.
    for_each_chunk(x, k0, |v, _| add_shifted(v, k0, &mut s, &mut q));
    let (s, rstd) = shifted_stats(s, q, cols, eps, partials, partials2);
    let mean = k0 + s;
    map_chunks(x, y, |v, e| affine_chunk_scalar(v, mean, rstd, w, b, e));
}

/// GroupNorm of a contiguous `(batch, channels, spatial)` tensor (Candle's `GroupNorm`
/// over `(b, c, h, w)` is `spatial = h * w`): one work-group per `(batch, group)`, whose
/// `channels / groups * spatial` elements are contiguous. Two streaming passes: the
/// shifted sums of `x - x[first]` and of its square in f32 (each work-item's partial
/// sums, then a tree over the work-group: the shift keeps a large mean from cancelling),
/// then `y = (x - mean) * rstd * weight[c] + bias[c]`, followed by SiLU when `silu != 0`
/// (the `GroupNorm -> SiLU` pair of a Stable Diffusion resnet block in one kernel).
/// `weight`/`bias` have `channels` elements or are empty (1 / 0). Launch with
/// [`group_norm_rows`] (it checks the shapes).
#[amdgpu_kernel(T = [f32, f16, bf16])]
#[allow(clippy::too_many_arguments)]
pub fn group_norm<T: Float>(
    input: &[T],
    weight: &[T],
    bias: &[T],
    out: &mut [T],
    cpg: u32,
    spatial: u32,
    groups: u32,
    eps: f32,
    silu: u32,
    mut partials: Shared<f32, MAX_WAVES>,
    mut partials2: Shared<f32, MAX_WAVES>,
) {
    let (cpg, spatial) = (cpg as usize, spatial as usize);
    let len = cpg * spatial;
    let bg = block_idx_x() as usize;
    let (start, end) = (bg * len, bg * len + len);
    let x = &input[start..end];
    let y = &mut out[start..end];
    let c0 = (bg % groups as usize) * cpg;
    let k0 = if len == 0 { 0.0 } else { x[0].to_f32() };
    let (mut s, mut q) = (0.0f32, 0.0f32);
    // Both passes stream 16-byte chunks, two loads in flight per work-item in the first:
    // element-wise loads kept one 2-byte load in flight per work-item, and with only
    // `batch * groups` work-groups that left the memory system mostly idle. Padding
    // reads as k0, so it adds nothing.
    for_each_chunk(x, k0, |v, _| add_shifted(v, k0, &mut s, &mut q));
    let (s, rstd) = shifted_stats(s, q, len, eps, &mut partials, &mut partials2);
    let mean = k0 + s;
    // 32-bit channel arithmetic (the launcher keeps every index below 2^31; a 64-bit
    // division per chunk spilled scalar registers on gfx9).
    let sp = spatial.max(1) as u32;
    let last = len.max(1) as u32 - 1;
    // A chunk lies in one channel when `spatial` is a multiple of the chunk (every SD
    // layer): one channel lookup per chunk, else one per element.
    let chunk_in_channel = sp.is_multiple_of(CHUNK as u32);
    if (!weight.is_empty() && weight.len() < c0 + cpg) || (!bias.is_empty() && bias.len() < c0 + cpg) {
        panic!("group_norm: weight or bias shorter than the channels");
    }
    let wb = |i: u32| -> (f32, f32) {
        let c = c0 + (i / sp) as usize;
        // SAFETY: c < c0 + cpg, within `weight`/`bias` when they are not empty (checked).
        let w = if weight.is_empty() { 1.0 } else { unsafe { weight.get_unchecked(c) }.to_f32() };
        // SAFETY: as above.
        let b = if bias.is_empty() { 0.0 } else { unsafe { bias.get_unchecked(c) }.to_f32() };
        (w * rstd, b)
    };
    map_chunks(x, y, |v, e| {
        let mut r = [0.0f32; CHUNK];
        let e = e as u32;
        let (mut ws, mut b) = wb(e);
        each_lane!(j, {
            if !chunk_in_channel && j > 0 {
                // (The padding of a partial last chunk takes the last element's channel.)
                (ws, b) = wb((e + j as u32).min(last));
            }
            let mut t = (v[j] - mean).mul_add(ws, b);
            if silu != 0 {
                t /= 1.0 + FloatMath::exp(-t);
            }
            r[j] = t;
        });
        r
    });
}

/// [`rms_norm`](fn@rms_norm) for many rows: one wave per row (no barriers, no shared memory).
/// Rows that fit the lanes' register tiles ([`RowTile::fits_wave`]) are read once; longer
/// ones take one pass for the sum of squares and a second that writes (re-reading the row
/// from cache).
/// `out.len() / cols` rows; launch with [`crate::row::wave_rows_config`].
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn rms_norm_wave<T: Float>(input: &[T], weight: &[T], out: &mut [T], cols: u32, eps: f32) {
    let cols = cols as usize;
    if cols == 0 {
        return;
    }
    let w = if weight.is_empty() { weight } else { &weight[..cols] };
    let none: &[T] = &[];
    let (lane, lanes) = (wave::lane_id() as usize, wave::size() as usize);
    if Tile::fits_wave::<T>(cols) {
        // Read once into the lanes' registers. (Outside `for_each_row_of_wave`: NVPTX
        // kept the closure of both paths out of line, with a stack frame.)
        let r = global_idx_x() / lanes;
        if r < out.len() / cols {
            let tile = Tile::load_of(&input[r * cols..r * cols + cols], 0.0, lane, lanes);
            let scale = (wave::sum(tile.fold_padded(0.0, |a, v| a + v * v)) / cols as f32 + eps).rsqrt();
            tile.store(&mut out[r * cols..r * cols + cols], |v, e| affine_chunk(v, 0.0, scale, w, none, e));
        }
        return;
    }
    for_each_row_of_wave(out.len() / cols, |r| {
        let x = &input[r * cols..r * cols + cols];
        let y = &mut out[r * cols..r * cols + cols];
        {
            let mut s = 0.0f32;
            for_each_chunk_of(x, 0.0, lane, lanes, |v, _| {
                each_lane!(j, {
                    s += v[j] * v[j];
                });
            });
            let scale = (wave::sum(s) / cols as f32 + eps).rsqrt();
            map_chunks_of(x, y, lane, lanes, |v, e| affine_chunk(v, 0.0, scale, w, none, e));
        }
    });
}

/// [`layer_norm_long`](fn@layer_norm_long) with one wave per row, as [`rms_norm_wave`](fn@rms_norm_wave).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn layer_norm_wave<T: Float>(input: &[T], weight: &[T], bias: &[T], out: &mut [T], cols: u32, eps: f32) {
    let cols = cols as usize;
    if cols == 0 {
        return;
    }
    let w = if weight.is_empty() { weight } else { &weight[..cols] };
    let b = if bias.is_empty() { bias } else { &bias[..cols] };
    let inv_n = 1.0 / cols as f32;
    let (lane, lanes) = (wave::lane_id() as usize, wave::size() as usize);
    for_each_row_of_wave(out.len() / cols, |r| {
        let x = &input[r * cols..r * cols + cols];
        if Tile::fits_wave::<T>(cols) {
            // Read once into the lanes' registers; two-pass variance as `layer_norm`.
            let tile = Tile::load_of(x, 0.0, lane, lanes);
            let mean = wave::sum(tile.fold_padded(0.0, |a, v| a + v)) * inv_n;
            let var = wave::sum(tile.fold(cols, 0.0, |a, v| a + (v - mean) * (v - mean))) * inv_n;
            let rstd = (var + eps).rsqrt();
            tile.store(&mut out[r * cols..r * cols + cols], |v, e| affine_chunk_scalar(v, mean, rstd, w, b, e));
            return;
        }
        let k0 = x[0].to_f32();
        let (mut s, mut q) = (0.0f32, 0.0f32);
        for_each_chunk_of(x, k0, lane, lanes, |v, _| {
            each_lane!(j, {
                let d = v[j] - k0;
                s += d;
                q += d * d;
            });
        });
        let (s, q) = (wave::sum(s) * inv_n, wave::sum(q) * inv_n);
        let var = q - s * s;
        let rstd = ((if var < 0.0 { 0.0 } else { var }) + eps).rsqrt();
        map_chunks_of(x, &mut out[r * cols..r * cols + cols], lane, lanes, |v, e| affine_chunk_scalar(v, k0 + s, rstd, w, b, e));
    });
}

/// Launch shape for `rows` rows of `cols` elements (one work-group per row).
/// Sized for the tiles of NVIDIA GPUs and the CPU executor ([`crate::row::tile_chunks`]);
/// the checked launchers size for the device they run on.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config<T>(rows: usize, cols: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    crate::row::launch_config("norm", rows, cols, core::mem::size_of::<T>())
}

/// Launch shape of [`layer_norm`](fn@layer_norm) for `rows` rows of `cols` elements: that
/// of [`launch_config`] (16-bit rows keep four chunks per work-item packed on NVIDIA, see
/// [`PackedTile`]).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn layer_norm_launch_config<T>(rows: usize, cols: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    crate::row::launch_config("layer_norm", rows, cols, core::mem::size_of::<T>())
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host {
    use crate::runtime::{Device, DeviceVec};
    use kernel_dsl::host::{KernelArgSlice, LaunchError, ScalarArg};
    use kernel_dsl::Float;

    /// A parameter buffer, or an empty slice (never read) when there is none.
    fn param<T>(p: Option<&DeviceVec<T>>) -> &dyn KernelArgSlice<T> {
        match p {
            Some(p) => p,
            None => &[] as &[T; 0],
        }
    }

    fn check_eps(kernel: &'static str, eps: f32) -> Result<(), LaunchError> {
        if eps.is_finite() && eps >= 0.0 {
            Ok(())
        } else {
            Err(LaunchError::InvalidArgument { kernel, reason: format!("eps must be finite and >= 0, got {eps}") })
        }
    }

    /// RMSNorm of each row of `cols` elements of `x` into `y`, with an optional weight of
    /// `cols` elements; checks every shape first (bad input: an error, nothing launched).
    /// Runs a wave per row for many short rows ([`use_wave_rows`](crate::row::use_wave_rows)).
    pub fn rms_norm_rows<T: Float + ScalarArg>(dev: &Device, x: &DeviceVec<T>, weight: Option<&DeviceVec<T>>, y: &mut DeviceVec<T>, cols: usize, eps: f32) -> Result<(), LaunchError> {
        let wl = weight.map_or(0, |w| w.len());
        if weight.is_some() && wl != cols {
            return Err(LaunchError::InvalidArgument { kernel: "rms_norm", reason: format!("weight has {wl} elements, rows have {cols}") });
        }
        let rows = crate::row::check_rows("rms_norm", x.len(), y.len(), cols)?;
        check_eps("rms_norm", eps)?;
        if crate::row::use_wave_rows(rows, cols) {
            return super::rms_norm_wave::launch::<T>(dev, crate::row::wave_rows_config(rows, dev.wave_lanes()), x, param(weight), y, cols as u32, eps);
        }
        let cfg = crate::row::launch_config_on(dev, "rms_norm", rows, cols, std::mem::size_of::<T>())?;
        super::rms_norm::launch::<T>(dev, cfg, x, param(weight), y, cols as u32, eps)
    }

    /// Largest bias stage of [`layer_norm`](fn@super::layer_norm), in bytes: the shared memory
    /// of the tiles of rows up to 16384 16-bit columns (512 work-items with four chunks).
    /// On the H100, staging 32768-column rows (64 KB) ran 5% slower than loading their bias
    /// after the reduction, and a stage twice the size (weights and bias) at 4096 columns
    /// 16% slower: the shared memory comes out of the first-level cache the rows stream
    /// through.
    pub const BIAS_STAGE_MAX_BYTES: usize = 32 * 1024;

    /// 16-byte words of [`layer_norm`](fn@super::layer_norm)'s bias stage (its
    /// `SharedDyn` parameter) for a launch of `threads` work-items with `chunks` chunks
    /// each: a word per chunk where the 16-bit packed path runs with a bias (not on AMD,
    /// rows of whole chunks) and the stage takes at most [`BIAS_STAGE_MAX_BYTES`]; else 0,
    /// and the kernel loads the bias from global memory after its reduction.
    pub fn bias_stage_words(dev: &Device, has_bias: bool, cols: usize, elem_bytes: usize, chunks: usize, threads: u32) -> usize {
        #[cfg(feature = "rocm")]
        if matches!(dev, Device::Rocm(_)) {
            return 0;
        }
        let _ = dev;
        let words = chunks * threads as usize;
        if has_bias && elem_bytes == 2 && cols % crate::row::CHUNK == 0 && words * 16 <= BIAS_STAGE_MAX_BYTES {
            words
        } else {
            0
        }
    }

    /// LayerNorm of each row, with optional weight and bias; checked as [`rms_norm_rows`].
    /// Runs [`layer_norm`](fn@super::layer_norm) or, for rows longer than its register tiles,
    /// [`layer_norm_long`](fn@super::layer_norm_long).
    pub fn layer_norm_rows<T: Float + ScalarArg>(dev: &Device, x: &DeviceVec<T>, weight: Option<&DeviceVec<T>>, bias: Option<&DeviceVec<T>>, y: &mut DeviceVec<T>, cols: usize, eps: f32) -> Result<(), LaunchError> {
        for (name, p) in [("weight", weight), ("bias", bias)] {
            if let Some(p) = p {
                if p.len() != cols {
                    return Err(LaunchError::InvalidArgument { kernel: "layer_norm", reason: format!("{name} has {} elements, rows have {cols}", p.len()) });
                }
            }
        }
        let rows = crate::row::check_rows("layer_norm", x.len(), y.len(), cols)?;
        check_eps("layer_norm", eps)?;
        if crate::row::use_wave_rows(rows, cols) {
            return super::layer_norm_wave::launch::<T>(dev, crate::row::wave_rows_config(rows, dev.wave_lanes()), x, param(weight), param(bias), y, cols as u32, eps);
        }
        let size = std::mem::size_of::<T>();
        let chunks = crate::row::row_chunks_on(dev, size, cols);
        let cfg = crate::row::launch_config_chunks("layer_norm", rows, cols, size, chunks)?;
        if cols <= chunks * crate::row::CHUNK * cfg.block.x as usize {
            let cfg = cfg.with_dynamic_shared(bias_stage_words(dev, bias.is_some(), cols, size, chunks, cfg.block.x));
            super::layer_norm::launch::<T>(dev, cfg, x, param(weight), param(bias), y, cols as u32, eps)
        } else {
            super::layer_norm_long::launch::<T>(dev, cfg, x, param(weight), param(bias), y, cols as u32, eps)
        }
    }
    /// Work-items per work-group of [`group_norm`](fn@super::group_norm): 1024 on a GPU
    /// (a group of a Stable Diffusion UNet is 10-40 thousand elements, and there are only
    /// `batch * groups` work-groups), 256 on the CPU executor.
    fn group_norm_threads(dev: &Device) -> u32 {
        if dev.is_gpu() {
            1024
        } else {
            256
        }
    }

    /// GroupNorm of the contiguous `(batch, channels, spatial)` tensor `x` into `y` (same
    /// size), `groups` groups of `channels / groups` channels, optional per-channel weight
    /// and bias (`channels` elements each), SiLU applied after the affine map when `silu`.
    /// Statistics in f32 ([`group_norm`](fn@super::group_norm)). Checks every shape first:
    /// a bad one is `InvalidArgument` and nothing runs.
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm_rows<T: Float + ScalarArg>(
        dev: &Device,
        x: &(impl KernelArgSlice<T> + ?Sized),
        weight: Option<&(dyn KernelArgSlice<T> + '_)>,
        bias: Option<&(dyn KernelArgSlice<T> + '_)>,
        y: &mut (impl kernel_dsl::host::KernelArgSliceMut<T> + ?Sized),
        (channels, spatial): (usize, usize),
        groups: usize,
        eps: f32,
        silu: bool,
    ) -> Result<(), LaunchError> {
        const K: &str = "group_norm";
        let bad = |reason: String| LaunchError::InvalidArgument { kernel: K, reason };
        if groups == 0 || channels % groups != 0 {
            return Err(bad(format!("{channels} channels do not split into {groups} groups")));
        }
        for (name, p) in [("weight", weight), ("bias", bias)] {
            if let Some(p) = p {
                let n = crate::dtype::host::arg_len(p);
                if n != channels {
                    return Err(bad(format!("{name} has {n} elements; there are {channels} channels")));
                }
            }
        }
        let per_batch = channels.checked_mul(spatial).ok_or_else(|| bad("shape overflows usize".into()))?;
        let n = crate::dtype::host::arg_len(x);
        if per_batch == 0 || n % per_batch != 0 {
            return Err(bad(format!("input of {n} elements is not a whole number of {channels} x {spatial} items")));
        }
        let m = crate::dtype::host::arg_len(y);
        if m != n {
            return Err(bad(format!("output has {m} elements, input {n}")));
        }
        crate::dtype::host::fits_i32(K, &[n])?;
        check_eps(K, eps)?;
        if n == 0 {
            return Ok(());
        }
        let work_groups = n / per_batch * groups;
        let cfg = kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(work_groups as u32), kernel_dsl::Dim3::x(group_norm_threads(dev)));
        let none: [T; 0] = [];
        let (w, b): (&dyn KernelArgSlice<T>, &dyn KernelArgSlice<T>) = (weight.unwrap_or(&none), bias.unwrap_or(&none));
        super::group_norm::launch::<T>(dev, cfg, x, w, b, y, (channels / groups) as u32, spatial as u32, groups as u32, eps, silu as u32)
    }
}
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;
