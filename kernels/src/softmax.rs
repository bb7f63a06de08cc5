//! Softmax and log-softmax over the last dimension of a contiguous `rows x cols` tensor:
//! one work-group per row, numerically stable (the row maximum is subtracted first), f32
//! accumulation for every element type.
//!
//! Rows of up to 16 elements per work-item (16384 with 1024 work-items) in whole
//! 16-byte-aligned chunks ([`whole_chunks`]) are read from
//! memory once: each work-item keeps its share in registers ([`RowTile`]), so `exp` runs
//! once per element and the row is written straight from registers. Longer rows, and
//! misaligned ones, use the online softmax: one streaming pass computes the maximum and
//! the exponential sum together (rescaling the sum when the maximum grows), a second pass
//! writes the result.
use crate::reduce::{block_reduce, MAX_WAVES};
use crate::row::{for_each_chunk, for_each_chunk_of, for_each_row_of_wave, map_chunks, map_chunks_of, row_chunks, whole_chunks, RowTile, ShortRows, CHUNK};

/// The register tile of one work-item.
type Tile = RowTile;
use crate::{each_lane, each_tile_chunk};
use kernel_dsl::prelude::*;

/// Running `(max, sum of exp(x - max))` of a stream of values, for the online softmax.
#[derive(Clone, Copy)]
pub struct MaxExpSum {
    /// Largest value seen.
    pub max: f32,
    /// `sum exp(x - max)` over the values seen.
    pub sum: f32,
}

impl MaxExpSum {
    /// Nothing seen yet.
    pub const EMPTY: MaxExpSum = MaxExpSum { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Merges two partial results.
    #[inline(always)]
    pub fn merge(self, o: MaxExpSum) -> MaxExpSum {
        let max = self.max.max(o.max);
        // A side that has seen only -inf (max = -inf) contributes its sum as is: 0, or NaN
        // when it saw a NaN (not exp(-inf - -inf)).
        let scale = |p: MaxExpSum| if p.max == f32::NEG_INFINITY { p.sum } else { p.sum * (p.max - max).exp() };
        MaxExpSum { max, sum: scale(self) + scale(o) }
    }

    /// Adds one chunk of values (padding must be -inf).
    #[inline(always)]
    pub fn add_chunk(self, v: &[f32; CHUNK]) -> MaxExpSum {
        let mut m = v[0];
        each_lane!(j, {
            m = m.max(v[j]);
        });
        let mut s = 0.0;
        if m != f32::NEG_INFINITY {
            each_lane!(j, {
                s += (v[j] - m).exp();
            });
        } else {
            // Only -inf and NaN here (`max` skips NaN): a NaN must still poison the sum
            // (a row whose last chunk holds one NaN and -inf padding).
            each_lane!(j, {
                if v[j] != v[j] {
                    s = f32::NAN;
                }
            });
        }
        self.merge(MaxExpSum { max: m, sum: s })
    }
}

/// The row's maximum `m` and `sum_c exp(x[c] - m)`, in every work-item of the group,
/// streaming the row once (online softmax).
#[device]
#[inline(always)]
pub fn row_max_and_exp_sum<T: Float>(x: &[T], partials: &mut Shared<f32, MAX_WAVES>) -> (f32, f32) {
    let mut acc = MaxExpSum::EMPTY;
    for_each_chunk(x, f32::NEG_INFINITY, |v, _| acc = acc.add_chunk(v));
    // NaN inputs: f32::max ignores them, but exp(NaN - m) makes the sum NaN, so the whole
    // row comes out NaN, as in the reference.
    let m = block_reduce(acc.max, partials, f32::max);
    let s = if acc.max == f32::NEG_INFINITY { acc.sum } else { acc.sum * (acc.max - m).exp() };
    (m, block_reduce(s, partials, |a, b| a + b))
}

/// `out[r][c] = exp(x[r][c] - max_r) / sum_c exp(x[r][c] - max_r)`. Launch with
/// [`launch_config`].
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn softmax<T: Float>(input: &[T], out: &mut [T], cols: u32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let y = &mut out[start..end];
    // Rows of whole aligned chunks that fit the tiles: read once. Others (longer, or
    // misaligned views and odd widths, rare): the online softmax's two streaming passes.
    if Tile::fits::<T>(cols) && whole_chunks(x) && whole_chunks(y) {
        softmax_tile(x, y, &mut partials);
    } else {
        let (m, s) = row_max_and_exp_sum(x, &mut partials);
        let inv = 1.0 / s;
        map_chunks(x, y, |v, _| v.map(|e| (e - m).exp() * inv));
    }
}

/// The register-tile softmax of one row (see [`softmax`](fn@softmax)); `x` and `y` are
/// [`whole_chunks`].
#[device]
#[inline(always)]
fn softmax_tile<T: Float>(x: &[T], y: &mut [T], partials: &mut Shared<f32, MAX_WAVES>) {
    let chunks = row_chunks(core::mem::size_of::<T>(), x.len());
    let mut tile = Tile::load_as::<T, true>(x, f32::NEG_INFINITY, flat_thread_idx() as usize, flat_block_dim() as usize, chunks);
    // -inf padding leaves the maximum alone, and exp(-inf - m) = 0 the sum.
    let m = block_reduce(tile.fold_padded(f32::NEG_INFINITY, f32::max), partials, f32::max);
    // exp once per element, kept in the tile; padding becomes exp(-inf) = 0.
    each_tile_chunk!(k, tile.chunks, {
        each_lane!(j, {
            tile.v[k][j] = (tile.v[k][j] - m).exp();
        });
    });
    let s = block_reduce(tile.fold_padded(0.0, |a, b| a + b), partials, |a, b| a + b);
    let inv = 1.0 / s;
    tile.store_as::<T, true>(y, |v, _| v.map(|e| e * inv));
}

/// `out[r][c] = x[r][c] - max_r - ln(sum_c exp(x[r][c] - max_r))`. Launch with
/// [`launch_config`].
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn log_softmax<T: Float>(input: &[T], out: &mut [T], cols: u32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let y = &mut out[start..end];
    // Rows of whole aligned chunks that fit the tiles: read once. Others (longer, or
    // misaligned views and odd widths, rare): the online softmax's two streaming passes.
    if Tile::fits::<T>(cols) && whole_chunks(x) && whole_chunks(y) {
        log_softmax_tile(x, y, &mut partials);
    } else {
        let (m, s) = row_max_and_exp_sum(x, &mut partials);
        let lse = m + s.ln();
        map_chunks(x, y, |v, _| v.map(|e| e - lse));
    }
}

/// The register-tile log-softmax of one row (see [`log_softmax`](fn@log_softmax)); `x`
/// and `y` are [`whole_chunks`].
#[device]
#[inline(always)]
fn log_softmax_tile<T: Float>(x: &[T], y: &mut [T], partials: &mut Shared<f32, MAX_WAVES>) {
    let chunks = row_chunks(core::mem::size_of::<T>(), x.len());
    let tile = Tile::load_as::<T, true>(x, f32::NEG_INFINITY, flat_thread_idx() as usize, flat_block_dim() as usize, chunks);
    // As in `softmax`: -inf padding leaves the maximum alone and adds exp(-inf - m) = 0
    // (or NaN when m = -inf, where the row's own terms are NaN too), so the folds skip
    // per-element bounds tests (registers: 4-chunk f32 tiles spilled with them).
    let m = block_reduce(tile.fold_padded(f32::NEG_INFINITY, f32::max), partials, f32::max);
    let s = block_reduce(tile.fold_padded(0.0, |a, v| a + (v - m).exp()), partials, |a, b| a + b);
    let lse = m + s.ln();
    tile.store_as::<T, true>(y, |v, _| v.map(|e| e - lse));
}

/// `(max, exp-sum)` of this wave's lanes merged into every lane.
#[device]
#[inline(always)]
fn wave_merge(mut acc: MaxExpSum) -> MaxExpSum {
    let mut offset = wave::size() / 2;
    while offset > 0 {
        let other = MaxExpSum { max: wave::shuffle_xor(acc.max, offset), sum: wave::shuffle_xor(acc.sum, offset) };
        acc = acc.merge(other);
        offset /= 2;
    }
    acc
}

/// The maximum and exponential sum of row `x`, in every lane of the wave that owns it.
#[device]
#[inline(always)]
fn wave_row_max_exp_sum<T: Float>(x: &[T]) -> (f32, f32) {
    let mut acc = MaxExpSum::EMPTY;
    for_each_chunk_of(x, f32::NEG_INFINITY, wave::lane_id() as usize, wave::size() as usize, |v, _| acc = acc.add_chunk(v));
    let MaxExpSum { max, sum } = wave_merge(acc);
    (max, sum)
}

/// [`softmax`](fn@softmax) for many rows: one wave per row (no barriers, no shared memory).
/// Rows that fit the lanes' register tiles ([`RowTile::fits_wave`]: 512 elements on
/// waves of 32) are read once; longer ones take an online pass for the maximum and
/// exponential sum, then a second pass that writes (re-reading the row from cache). `out.len() / cols` rows; launch
/// with [`crate::row::wave_rows_config`].
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn softmax_wave<T: Float>(input: &[T], out: &mut [T], cols: u32) {
    let cols = cols as usize;
    if cols == 0 {
        return;
    }
    let (lane, lanes) = (wave::lane_id() as usize, wave::size() as usize);
    for_each_row_of_wave(out.len() / cols, |r| {
        let x = &input[r * cols..r * cols + cols];
        let y = &mut out[r * cols..r * cols + cols];
        if Tile::fits_wave::<T>(cols) {
            // Read once into the lanes' registers, one exp per element (as `softmax`).
            let mut tile = Tile::load_of(x, f32::NEG_INFINITY, lane, lanes);
            let m = wave::reduce(tile.fold_padded(f32::NEG_INFINITY, f32::max), f32::max);
            each_tile_chunk!(k, tile.chunks, {
                each_lane!(j, {
                    tile.v[k][j] = (tile.v[k][j] - m).exp();
                });
            });
            let inv = 1.0 / wave::sum(tile.fold_padded(0.0, |a, b| a + b));
            tile.store(y, |v, _| v.map(|e| e * inv));
        } else {
            let (m, s) = wave_row_max_exp_sum(x);
            let inv = 1.0 / s;
            map_chunks_of(x, y, lane, lanes, |v, _| v.map(|e| (e - m).exp() * inv));
        }
    });
}

/// [`softmax`](fn@softmax) for many short rows ([`ShortRows::fits`]: at most
/// `8 * wave::size()` elements): a wave takes [`ShortRows::per_wave`] rows at once, one
/// chunk of each per lane (4 bf16 rows of 256 on an H100, where a wave per row left three
/// of its four tile chunks as padding); same arithmetic, in the same order, as
/// [`softmax_wave`](fn@softmax_wave)'s register tiles. Launch with
/// [`crate::row::short_rows_config`].
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn softmax_short<T: Float>(input: &[T], out: &mut [T], cols: u32) {
    let cols = cols as usize;
    if cols == 0 || !ShortRows::fits(cols) {
        return;
    }
    let rows = out.len() / cols;
    let Some(first) = ShortRows::first_row::<T>(rows) else { return };
    let mut t = ShortRows::load(input, rows, cols, first, f32::NEG_INFINITY);
    let m = t.wave_reduce(t.fold_padded(f32::NEG_INFINITY, f32::max), f32::max);
    each_tile_chunk!(k, t.rows, {
        each_lane!(j, {
            t.v[k][j] = (t.v[k][j] - m[k]).exp();
        });
    });
    let s = t.wave_reduce(t.fold_padded(0.0, |a, b| a + b), |a, b| a + b);
    let mut inv = [0.0f32; crate::row::TILE_CHUNKS];
    each_tile_chunk!(k, t.rows, {
        inv[k] = 1.0 / s[k];
    });
    t.store(out, rows, cols, |k, v| v.map(|e| e * inv[k]));
}

/// [`log_softmax`](fn@log_softmax) for many short rows, as [`softmax_short`](fn@softmax_short).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn log_softmax_short<T: Float>(input: &[T], out: &mut [T], cols: u32) {
    let cols = cols as usize;
    if cols == 0 || !ShortRows::fits(cols) {
        return;
    }
    let rows = out.len() / cols;
    let Some(first) = ShortRows::first_row::<T>(rows) else { return };
    let t = ShortRows::load(input, rows, cols, first, f32::NEG_INFINITY);
    let m = t.wave_reduce(t.fold_padded(f32::NEG_INFINITY, f32::max), f32::max);
    let mut part = [0.0f32; crate::row::TILE_CHUNKS];
    each_tile_chunk!(k, t.rows, {
        each_lane!(j, {
            part[k] += (t.v[k][j] - m[k]).exp();
        });
    });
    let s = t.wave_reduce(part, |a, b| a + b);
    let mut lse = [0.0f32; crate::row::TILE_CHUNKS];
    each_tile_chunk!(k, t.rows, {
        lse[k] = m[k] + s[k].ln();
    });
    t.store(out, rows, cols, |k, v| v.map(|e| e - lse[k]));
}

/// [`log_softmax`](fn@log_softmax) with one wave per row, as [`softmax_wave`](fn@softmax_wave).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
pub fn log_softmax_wave<T: Float>(input: &[T], out: &mut [T], cols: u32) {
    let cols = cols as usize;
    if cols == 0 {
        return;
    }
    let (lane, lanes) = (wave::lane_id() as usize, wave::size() as usize);
    for_each_row_of_wave(out.len() / cols, |r| {
        let x = &input[r * cols..r * cols + cols];
        let y = &mut out[r * cols..r * cols + cols];
        if Tile::fits_wave::<T>(cols) {
            let tile = Tile::load_of(x, f32::NEG_INFINITY, lane, lanes);
            let m = wave::reduce(tile.fold_padded(f32::NEG_INFINITY, f32::max), f32::max);
            let lse = m + wave::sum(tile.fold_padded(0.0, |a, v| a + (v - m).exp())).ln();
            tile.store(y, |v, _| v.map(|e| e - lse));
        } else {
            let (m, s) = wave_row_max_exp_sum(x);
            let lse = m + s.ln();
            map_chunks_of(x, y, lane, lanes, |v, _| v.map(|e| e - lse));
        }
    });
}

/// Launch shape for `rows` rows of `cols` elements: one work-group per row, sized so that
/// rows up to 16384 elements fit the register tiles.
/// Sized for the tiles of NVIDIA GPUs and the CPU executor ([`crate::row::tile_chunks`]);
/// the checked launchers size for the device they run on.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config<T>(rows: usize, cols: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    crate::row::launch_config("softmax", rows, cols, core::mem::size_of::<T>())
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host {
    use crate::runtime::{Device, DeviceVec};
    use kernel_dsl::host::{LaunchError, ScalarArg};
    use kernel_dsl::Float;

    /// Softmax over the last dimension of `x` (rows of `cols`) into `y`, after checking the
    /// shapes (bad input: an error, nothing launched). Runs a wave per row for
    /// many short rows ([`use_wave_rows`](crate::row::use_wave_rows)), else a work-group per row.
    pub fn softmax_last_dim<T: Float + ScalarArg>(dev: &Device, x: &DeviceVec<T>, y: &mut DeviceVec<T>, cols: usize) -> Result<(), LaunchError> {
        let rows = crate::row::check_rows("softmax", x.len(), y.len(), cols)?;
        if crate::row::use_wave_rows(rows, cols) {
            if cols <= crate::row::CHUNK * dev.wave_lanes() as usize {
                let cfg = crate::row::short_rows_config(rows, crate::row::tile_chunks_on(dev, std::mem::size_of::<T>()), dev.wave_lanes());
                return super::softmax_short::launch::<T>(dev, cfg, x, y, cols as u32);
            }
            return super::softmax_wave::launch::<T>(dev, crate::row::wave_rows_config(rows, dev.wave_lanes()), x, y, cols as u32);
        }
        let cfg = crate::row::launch_config_on(dev, "softmax", rows, cols, std::mem::size_of::<T>())?;
        super::softmax::launch::<T>(dev, cfg, x, y, cols as u32)
    }

    /// Log-softmax over the last dimension, checked as [`softmax_last_dim`].
    pub fn log_softmax_last_dim<T: Float + ScalarArg>(dev: &Device, x: &DeviceVec<T>, y: &mut DeviceVec<T>, cols: usize) -> Result<(), LaunchError> {
        let rows = crate::row::check_rows("log_softmax", x.len(), y.len(), cols)?;
        if crate::row::use_wave_rows(rows, cols) {
            if cols <= crate::row::CHUNK * dev.wave_lanes() as usize {
                let cfg = crate::row::short_rows_config(rows, crate::row::tile_chunks_on(dev, std::mem::size_of::<T>()), dev.wave_lanes());
                return super::log_softmax_short::launch::<T>(dev, cfg, x, y, cols as u32);
            }
            return super::log_softmax_wave::launch::<T>(dev, crate::row::wave_rows_config(rows, dev.wave_lanes()), x, y, cols as u32);
        }
        let cfg = crate::row::launch_config_on(dev, "log_softmax", rows, cols, std::mem::size_of::<T>())?;
        super::log_softmax::launch::<T>(dev, cfg, x, y, cols as u32)
    }
}
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;
