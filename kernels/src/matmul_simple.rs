//! A simple, correct batched GEMM: 16 x 16 output tiles, operands staged through shared
//! memory in `f32`, `f32` accumulation. Any strides (so transposed operands need no copy).
//! It is the reference GEMM of the Candle backend on the CPU executor and wherever no BLAS
//! library or faster kernel is available; it makes no claim to speed.
use kernel_dsl::prelude::*;

/// Tile edge: a work-group of `TILE x TILE` work-items computes a `TILE x TILE` block of C.
pub const TILE: usize = 16;

/// `c[bi] (m x n, contiguous row-major) = a[bi] (m x k) * b[bi] (k x n)` for `bi < batch`
/// (the grid's z), where element `(i, p)` of `a[bi]` is `a[bi * sa.0 + i * sa.1 + p * sa.2]`
/// and element `(p, j)` of `b[bi]` is `b[bi * sb.0 + p * sb.1 + j * sb.2]` (element units).
/// Launch with [`launch_config`].
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn matmul_simple<T: Float>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    a_batch: usize,
    a_row: usize,
    a_col: usize,
    b_batch: usize,
    b_row: usize,
    b_col: usize,
    mut ta: Shared<f32, 256>,
    mut tb: Shared<f32, 256>,
) {
    let tx = thread_idx_x() as usize;
    let ty = thread_idx_y() as usize;
    let bi = block_idx_z() as usize;
    let row = block_idx_y() as usize * TILE + ty;
    let col = block_idx_x() as usize * TILE + tx;
    let a0 = bi * a_batch;
    let b0 = bi * b_batch;
    let mut acc = 0.0f32;
    let mut p0 = 0;
    while p0 < k {
        // Each work-item loads one element of each tile (0 outside the matrices).
        let pa = p0 + tx;
        ta[ty * TILE + tx] = if row < m && pa < k { a[a0 + row * a_row + pa * a_col].to_f32() } else { 0.0 };
        let pb = p0 + ty;
        tb[ty * TILE + tx] = if pb < k && col < n { b[b0 + pb * b_row + col * b_col].to_f32() } else { 0.0 };
        barrier();
        let mut q = 0;
        while q < TILE {
            acc += ta[ty * TILE + q] * tb[q * TILE + tx];
            q += 1;
        }
        barrier();
        p0 += TILE;
    }
    if row < m && col < n {
        c[bi * m * n + row * n + col] = T::from_f32(acc);
    }
}

/// Launch shape of [`matmul_simple`](fn@matmul_simple) for `batch` products of `m x n`.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config(batch: usize, m: usize, n: usize) -> kernel_dsl::host::LaunchConfig {
    use kernel_dsl::Dim3;
    let t = TILE as u32;
    kernel_dsl::host::LaunchConfig::new(
        Dim3::new(n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, batch as u32),
        Dim3::new(t, t, 1),
    )
}
