//! Compiles this crate's kernel modules for every configured GPU target.
fn main() {
    build_support::KernelBuild::new().module("flash").module("paged").module("cache").module("prefill").build();
}
