use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(out: &mut [f32], a: SharedDyn<f32>, b: SharedDyn<f32>) {
    out[0] = a[0] + b[0];
}

fn main() {}
