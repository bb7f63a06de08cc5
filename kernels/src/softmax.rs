//! Softmax and log-softmax over the last dimension of a contiguous `rows x cols` tensor:
//! one work-group per row, numerically stable (the row maximum is subtracted first), f32
//! accumulation for every element type.
use crate::reduce::{block_reduce, MAX_WAVES};
use kernel_dsl::prelude::*;

/// The row's maximum `m` and `sum_c exp(x[c] - m)`, in every work-item of the group.
#[device]
#[inline(always)]
pub fn row_max_and_exp_sum<T: Float>(x: &[T], partials: &mut Shared<f32, MAX_WAVES>) -> (f32, f32) {
    let (t, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let mut m = f32::NEG_INFINITY;
    let mut i = t;
    while i < x.len() {
        m = m.max(x[i].to_f32());
        i += n;
    }
    let m = block_reduce(m, partials, f32::max);
    let mut s = 0.0f32;
    let mut i = t;
    while i < x.len() {
        s += (x[i].to_f32() - m).exp();
        i += n;
    }
    (m, block_reduce(s, partials, |a, b| a + b))
}

/// `out[r][c] = exp(x[r][c] - max_r) / sum_c exp(x[r][c] - max_r)`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn softmax<T: Float>(input: &[T], out: &mut [T], cols: u32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let y = &mut out[start..end];
    let (t, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let (m, s) = row_max_and_exp_sum(x, &mut partials);
    let inv = 1.0 / s;
    let mut i = t;
    while i < cols {
        y[i] = T::from_f32((x[i].to_f32() - m).exp() * inv);
        i += n;
    }
}

/// `out[r][c] = x[r][c] - max_r - ln(sum_c exp(x[r][c] - max_r))`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn log_softmax<T: Float>(input: &[T], out: &mut [T], cols: u32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let y = &mut out[start..end];
    let (t, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let (m, s) = row_max_and_exp_sum(x, &mut partials);
    let lse = m + s.ln();
    let mut i = t;
    while i < cols {
        y[i] = T::from_f32(x[i].to_f32() - lse);
        i += n;
    }
}

/// Launch shape for `rows` rows: one work-group of 256 work-items per row.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config(rows: usize) -> Result<kernel_dsl::host::LaunchConfig, kernel_dsl::host::LaunchError> {
    let rows = u32::try_from(rows).map_err(|_| kernel_dsl::host::LaunchError::InvalidArgument {
        kernel: "softmax",
        reason: format!("{rows} rows exceed one work-group per row (2^32)"),
    })?;
    Ok(kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(rows), kernel_dsl::Dim3::x(256)))
}
