use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(out: &mut [f32]) {
    println!("hello from the GPU");
    out[0] = 1.0;
}

fn main() {}
