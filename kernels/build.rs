//! Compiles this crate's kernel modules for every configured GPU target.
fn main() {
    build_support::KernelBuild::new()
        .module("elementwise")
        .module("reduce")
        .module("softmax")
        .module("norm")
        .module("row")
        .module("rope")
        .module("indexing")
        .module("matmul_simple")
        .build();
}
