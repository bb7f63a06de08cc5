use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(x: &[f32], out: &mut [f32]) {
    let i = global_idx_x();
    out[i] = std::f32::consts::PI * x[i];
}

fn main() {}
