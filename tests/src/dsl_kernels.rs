//! Kernels that use every part of the device API.
use kernel_dsl::prelude::*;

/// Work-group size of [`block_sum`](fn@block_sum).
pub const BLOCK_SUM_THREADS: usize = 256;

/// Sums each work-group's slice of `input` with a shared-memory tree, one partial sum per
/// work-group.
#[amdgpu_kernel]
pub fn block_sum(input: &[f32], partial: &mut [f32], mut scratch: Shared<f32, BLOCK_SUM_THREADS>) {
    let t = thread_idx_x() as usize;
    let i = global_idx_x();
    scratch[t] = if i < input.len() { input[i] } else { 0.0 };
    barrier();
    let mut stride = BLOCK_SUM_THREADS / 2;
    while stride > 0 {
        if t < stride {
            scratch[t] += scratch[t + stride];
        }
        barrier();
        stride /= 2;
    }
    if t == 0 {
        partial[block_idx_x() as usize] = scratch[0];
    }
}

/// Sums each wave's values with shuffles; lane 0 of each wave writes its wave's sum,
/// every lane writes its lane id and the wave size (so tests see the wave layout).
#[amdgpu_kernel]
pub fn wave_sums(input: &[f32], sums: &mut [f32], lanes: &mut [u32], size: &mut [u32]) {
    let i = global_idx_x();
    let v = if i < input.len() { input[i] } else { 0.0 };
    let s = wave::sum(v);
    if i < lanes.len() {
        lanes[i] = wave::lane_id();
        size[i] = wave::size();
    }
    let wave_index = i / wave::size() as usize;
    if wave::lane_id() == 0 && wave_index < sums.len() {
        sums[wave_index] = s;
    }
}

/// `wave::reduce_pair` in every lane: the wave's maxima of `x` and of `-x`, and its sums
/// of `x` and of 1 (inputs past `x` read as 0).
#[amdgpu_kernel]
pub fn wave_pairs(input: &[f32], max_x: &mut [f32], max_neg: &mut [f32], sum_x: &mut [f32], count: &mut [f32]) {
    let i = global_idx_x();
    let v = if i < input.len() { input[i] } else { 0.0 };
    let (a, b) = wave::reduce_pair(v, -v, f32::max);
    let (s, n) = wave::reduce_pair(v, 1.0f32, |p, q| p + q);
    if i < max_x.len() {
        max_x[i] = a;
        max_neg[i] = b;
        sum_x[i] = s;
        count[i] = n;
    }
}

/// Reverses each work-group's block of `data` through launch-sized shared memory.
#[amdgpu_kernel]
pub fn reverse_blocks(data: &[u32], out: &mut [u32], mut tile: SharedDyn<u32>) {
    let n = block_dim_x() as usize;
    let t = thread_idx_x() as usize;
    let base = block_idx_x() as usize * n;
    if t < tile.len() {
        tile[t] = data[base + t];
    }
    barrier();
    if t < tile.len() {
        out[base + t] = tile[n - 1 - t];
    }
}

/// Histogram of `values` into `bins` with atomics; `ballot` counts odd values per wave.
#[amdgpu_kernel]
pub fn histogram(values: &[u32], bins: &[AtomicU32], odd_per_wave: &[AtomicU32]) {
    let i = global_idx_x();
    let v = if i < values.len() { values[i] } else { u32::MAX };
    if v != u32::MAX {
        bins[(v as usize) % bins.len()].fetch_add(1, Ordering::Relaxed);
    }
    let odd = wave::ballot(v != u32::MAX && v % 2 == 1);
    if wave::lane_id() == 0 {
        odd_per_wave[0].fetch_add(odd.count_ones(), Ordering::Relaxed);
    }
}

/// `lo[i]`/`hi[i]`: the lanes of work-item i's wave whose key agrees with its key in the
/// low `bits` bits (`wave::match_any`, mask bits 0..32 and 32..64); work-items past the
/// keys take `u32::MAX`. After a `wave::sync`, `seen[i]` is what lane `(i + 1) % wave`
/// of the wave stored in shared memory before it.
#[amdgpu_kernel]
pub fn wave_match(keys: &[u32], bits: u32, lo: &mut [u32], hi: &mut [u32], seen: &mut [u32], mut stage: Shared<u32, 256>) {
    let i = global_idx_x();
    let k = if i < keys.len() { keys[i] } else { u32::MAX };
    let m = wave::match_any(k, bits);
    let t = flat_thread_idx() as usize;
    stage[t % 256] = k;
    wave::sync();
    let lanes = wave::size() as usize;
    let next = t - t % lanes + (t + 1) % lanes;
    let s = stage[next % 256];
    if i < lo.len() {
        lo[i] = m as u32;
        hi[i] = (m >> 32) as u32;
        seen[i] = s;
    }
}

/// `out[i] = a[i] * scale` in half precision with a `f16` scalar argument.
#[amdgpu_kernel(T = [f16, bf16])]
pub fn scale_half<T: Float>(a: &[T], out: &mut [T], scale: T) {
    let i = global_idx_x();
    if i < out.len() {
        out[i] = T::from_f32(a[i].to_f32() * scale.to_f32());
    }
}

/// 2-D indexing: `out[y][x] = x + 1000 y` over a `width x height` grid of 2-D groups.
#[amdgpu_kernel]
pub fn grid_2d(out: &mut [u32], width: u32, height: u32) {
    let x = global_idx_x() as u32;
    let y = global_idx_y() as u32;
    if x < width && y < height {
        out[(y * width + x) as usize] = x + 1000 * y;
    }
}

/// Device helper used by [`clamp_kernel`](fn@clamp_kernel).
#[device]
pub fn clamp_unit(x: f32) -> f32 {
    x.clamp(0.0, 1.0)
}

/// Calls a `#[device]` helper.
#[amdgpu_kernel]
pub fn clamp_kernel(x: &[f32], out: &mut [f32]) {
    let i = global_idx_x();
    if i < out.len() {
        out[i] = clamp_unit(x[i]);
    }
}

/// Launch bound of [`bounded_iota`](fn@bounded_iota).
pub const BOUNDED_THREADS: u32 = 128;

/// `out[i] = i`, compiled for work-groups of at most [`BOUNDED_THREADS`] work-items (the
/// PTX entry gets `.maxntid 128`; larger launches are rejected before they run).
#[amdgpu_kernel(max_threads = 128)]
pub fn bounded_iota(out: &mut [u32]) {
    let i = global_idx_x();
    if i < out.len() {
        out[i] = i as u32;
    }
}

/// A generic kernel with a launch bound after its instance list.
#[amdgpu_kernel(T = [f32, bf16], max_threads = 64)]
pub fn bounded_fill<T: Float>(out: &mut [T], v: f32) {
    let i = global_idx_x();
    if i < out.len() {
        out[i] = T::from_f32(v);
    }
}
