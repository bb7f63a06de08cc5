//! The end-to-end quantized LLM benchmark on our backend: the same source as the
//! Candle-CUDA peer (`benches/candle-peer/src/qllama_e2e.rs`: `candle-transformers`'
//! `quantized_llama` on a GGUF file), with the device line changed to ours.
//!
//!   cargo run -p gguf-llama --release -- --out m.gguf --type q4_0 --shape 8b
//!   cargo run --release -p candle-rocm --features cuda --example qllama_e2e -- m.gguf --device cuda
//!   (`--device rocm` on an AMD GPU; `--device cpu` runs the CPU executor, a smoke test with
//!   a tiny model and `--prompt 8 --steps 2 --reps 1`)
#[path = "../../benches/candle-peer/src/qllama_e2e.rs"]
mod qllama_e2e;

use candle_rocm::RocmDevice;

fn main() -> candle_core::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let which = a.iter().position(|x| x == "--device").and_then(|i| a.get(i + 1)).cloned().unwrap_or_else(|| "cuda".into());
    // `cpu`: the CPU executor with waves of 32 (a smoke test); else `RocmDevice::from_spec`.
    let dev = match which.as_str() {
        "cpu" => RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W32),
        spec => RocmDevice::from_spec(spec)?,
    };
    eprintln!("device: {}", dev.name());
    dev.set_profiling(false);
    qllama_e2e::bench(&format!("candle-rocm ({})", dev.name()), &dev.as_candle())?;
    eprintln!("memory: {:?}", dev.memory_stats());
    Ok(())
}
