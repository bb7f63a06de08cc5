//! The peer of the end-to-end LLM benchmark: the `candle-transformers` llama on Candle's
//! own CUDA backend (cuBLAS + Candle's CUDA kernels), same code as our side.
mod llama_e2e;

fn main() -> candle_core::Result<()> {
    let device = candle_core::Device::new_cuda(0)?;
    llama_e2e::bench("candle-cuda", &device)?;
    Ok(())
}
