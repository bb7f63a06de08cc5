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
        .module("gemm")
        .max_work_group("gemm_tiled", 256)
        .build();
}
