use kernel_dsl::prelude::*;

#[amdgpu_kernel(max_threads = 2048)]
pub fn k(out: &mut [f32]) {
    out[0] = 0.0;
}

fn main() {}
