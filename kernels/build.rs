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
        .module("indexing_any")
        .module("dtype")
        .module("convert")
        .module("cmp")
        .module("arith")
        .module("conv")
        .module("pool")
        .module("random")
        .module("reduce_any")
        .module("unary_f64")
        .module("gemm")
        .module("quantized")
        // The H100's warpgroup matrix units (`wgmma`) exist only in `sm_90a` PTX.
        .ptx_variant("sm_90a", &["gemm_wgmma"])
        .build();
}
