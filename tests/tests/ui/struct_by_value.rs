use kernel_dsl::prelude::*;

pub struct Params {
    pub scale: f32,
}

#[amdgpu_kernel]
pub fn k(out: &mut [f32], p: Params) {
    out[0] = p.scale;
}

fn main() {}
