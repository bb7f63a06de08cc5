//! The peer of our end-to-end and quantized benchmarks: Candle's own CUDA backend (cuBLAS +
//! Candle's CUDA kernels), running the same code as our side.
//!
//! `candle-peer [llama options]`: the `candle-transformers` llama (see `llama_e2e`).
//! `candle-peer qmatvec`: Candle's quantized matvec (`QMatMul`) per GGML type and shape.
//! `candle-peer qllama FILE.gguf [--prompt N --steps N --reps N]`: `quantized_llama` on a
//! GGUF file (see `qllama_e2e`).
//! `candle-peer sd --shape sd15|sdxl [--steps N]`: the SD UNet step and VAE decode (see `sd_e2e`).
mod llama_e2e;
mod qllama_e2e;
mod qmatvec;
mod sd_e2e;

fn main() -> candle_core::Result<()> {
    let device = candle_core::Device::new_cuda(0)?;
    if std::env::args().nth(1).as_deref() == Some("qmatvec") {
        return qmatvec::bench(&device);
    }
    if std::env::args().nth(1).as_deref() == Some("sd") {
        return sd_e2e::bench(&device);
    }
    if std::env::args().nth(1).as_deref() == Some("qllama") {
        return qllama_e2e::bench("candle-cuda", &device);
    }
    llama_e2e::bench("candle-cuda", &device)?;
    Ok(())
}
