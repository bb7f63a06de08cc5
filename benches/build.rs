//! Builds the benchmark-only kernels (an empty kernel for launch overhead).
fn main() {
    build_support::KernelBuild::new().module("bench_kernels").build();
}
