use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(x: &[f32]) -> f32 {
    x[0]
}

fn main() {}
