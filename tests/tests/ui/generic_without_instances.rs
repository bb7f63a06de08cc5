use kernel_dsl::prelude::*;

#[amdgpu_kernel]
pub fn k<T: Float>(x: &[T], out: &mut [T]) {
    out[0] = x[0];
}

fn main() {}
