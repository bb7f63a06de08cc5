use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub async fn k(out: &mut [f32]) {
    out[0] = 1.0;
}

fn main() {}
