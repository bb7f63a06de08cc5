//! The end-to-end quantized LLM benchmark on our backend: the same source as the
//! Candle-CUDA peer (`benches/candle-peer/src/qllama_e2e.rs`: `candle-transformers`'
//! `quantized_llama` on a GGUF file), with the device line changed to ours.
//!
//!   cargo run -p gguf-llama --release -- --out m.gguf --type q4_0 --shape 8b
//!   cargo run --release -p candle-rocm --features cuda --example qllama_e2e -- m.gguf --device cuda
//!   (`--device rocm` on an AMD GPU; `--device cpu` runs the CPU executor, a smoke test with
//!   a tiny model and `--prompt 8 --steps 2 --reps 1`)
//!
//! `--profile`: the runs with the per-op profile on (`candle_rocm::profile`: host time
//! and device events around each backend op), one table for everything after the load
//! (use `--prompt 1 --reps 1` to see decode alone); its timings include the profiler's
//! overhead and are not the benchmark's numbers.
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
    let profile = a.iter().any(|x| x == "--profile");
    dev.set_profiling(false);
    qllama_e2e::bench_with(&format!("candle-rocm ({})", dev.name()), &dev.as_candle(), &mut |loaded| {
        if profile && loaded {
            dev.take_profile()?;
            dev.set_profiling(true);
        }
        Ok(())
    })?;
    if profile {
        let p = dev.take_profile()?;
        println!("\n== profile ({:.1} ms over {} calls)\n{}", p.total_ms(), p.calls(), p.table());
    }
    eprintln!("memory: {:?}", dev.memory_stats());
    Ok(())
}
