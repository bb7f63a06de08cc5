use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k(out: &mut [f32], flag: bool) {
    out[0] = if flag { 1.0 } else { 0.0 };
}

fn main() {}
