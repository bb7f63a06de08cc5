use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(x: Vec<f32>, out: &mut [f32]) {
    out[0] = x[0];
}

fn main() {}
