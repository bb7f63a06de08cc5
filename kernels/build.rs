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
        // On the H100 the decode matvec and its activations' quantization overlap the
        // kernel before each (`kernel_dsl::grid`: `griddepcontrol` needs sm_90).
        .ptx_variant_preferred(
            "sm_90a",
            &[
                "quantize_q8_1_f32",
                "quantize_q8_1_f16",
                "quantize_q8_1_bf16",
                "matvec_stream_q4_0",
                "matvec_stream_q4_1",
                "matvec_stream_q5_0",
                "matvec_stream_q5_1",
                "matvec_stream_q8_0",
                "matvec_stream_q4_k",
                "matvec_stream_q6_k",
                "matvec_stream_batch_q4_0_batch2",
                "matvec_stream_batch_q4_0_batch4",
                "matvec_stream_batch_q4_0_batch8",
                "matvec_stream_batch_q4_1_batch2",
                "matvec_stream_batch_q4_1_batch4",
                "matvec_stream_batch_q4_1_batch8",
                "matvec_stream_batch_q5_0_batch2",
                "matvec_stream_batch_q5_0_batch4",
                "matvec_stream_batch_q5_0_batch8",
                "matvec_stream_batch_q5_1_batch2",
                "matvec_stream_batch_q5_1_batch4",
                "matvec_stream_batch_q5_1_batch8",
                "matvec_stream_batch_q8_0_batch2",
                "matvec_stream_batch_q8_0_batch4",
                "matvec_stream_batch_q8_0_batch8",
                "matvec_stream_batch_q4_k_batch2",
                "matvec_stream_batch_q4_k_batch4",
                "matvec_stream_batch_q4_k_batch8",
                "matvec_stream_batch_q6_k_batch2",
                "matvec_stream_batch_q6_k_batch4",
                "matvec_stream_batch_q6_k_batch8",
            ],
        )
        .build();
}
