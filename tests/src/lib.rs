//! A crate using the DSL the way a user crate does: kernels in `dsl_kernels`, built by
//! `build-support` from `build.rs`, embedded with `embed_kernels!()`. Its tests exercise
//! the whole kernel model (shared memory, barriers, wave operations, atomics) on the CPU
//! executor and inspect the code objects of this crate and of `kernels`.
pub mod dsl_kernels;
/// The kernel of the book's tutorial (`docs/adding-a-kernel.md`).
pub mod tutorial;

kernel_dsl::embed_kernels!();
