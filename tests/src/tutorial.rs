//! The kernel of the book's tutorial, `docs/adding-a-kernel.md`: the code blocks there are
//! copied from this file and from `tests/tests/tutorial.rs` (a test checks that they still
//! match), so the tutorial is compiled and run by `cargo test --workspace`.

// ANCHOR: kernel
use kernel_dsl::prelude::*;

/// `a * x + y`, computed in f32 whatever the element type.
#[device]
pub fn axpy_one(a: f32, x: f32, y: f32) -> f32 {
    a * x + y
}

/// `out[i] = a * x[i] + y[i]` for every `i` of `out`; one work-item per element.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn axpy<T: Float>(a: f32, x: &[T], y: &[T], out: &mut [T]) {
    let i = global_idx_x();
    if i < out.len() {
        out[i] = T::from_f32(axpy_one(a, x[i].to_f32(), y[i].to_f32()));
    }
}
// ANCHOR_END: kernel
