//! Row normalisations over the last dimension of a contiguous `rows x cols` tensor, one
//! work-group per row, f32 accumulation.
use crate::reduce::{block_reduce, MAX_WAVES};
use kernel_dsl::prelude::*;

/// RMSNorm: `out = x / sqrt(mean(x^2) + eps) * weight` (`weight` of length `cols`).
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn rms_norm<T: Float>(input: &[T], weight: &[T], out: &mut [T], cols: u32, eps: f32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let row = block_idx_x() as usize;
    let (start, end) = (row * cols, row * cols + cols);
    let x = &input[start..end];
    let w = &weight[..cols];
    let y = &mut out[start..end];
    let (t, n) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let mut s = 0.0f32;
    let mut i = t;
    while i < cols {
        let v = x[i].to_f32();
        s += v * v;
        i += n;
    }
    let ss = block_reduce(s, &mut partials, |a, b| a + b);
    let scale = (ss / cols as f32 + eps).rsqrt();
    let mut i = t;
    while i < cols {
        y[i] = T::from_f32(x[i].to_f32() * scale * w[i].to_f32());
        i += n;
    }
}
