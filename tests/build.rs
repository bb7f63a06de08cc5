//! This crate plays a user crate: its kernels are built exactly as `kernels`' are.
fn main() {
    build_support::KernelBuild::new().module("dsl_kernels").module("tutorial").build();
}
