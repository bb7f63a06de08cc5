use kernel_dsl::prelude::*;

#[amdgpu_kernel(U = [f32])]
pub fn k<T: Float>(out: &mut [T]) {
    out[0] = T::ZERO;
}

fn main() {}
