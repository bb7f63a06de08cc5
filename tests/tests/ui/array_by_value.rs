use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(x: [f32; 4], out: &mut [f32]) {
    out[0] = x[0];
}

fn main() {}
