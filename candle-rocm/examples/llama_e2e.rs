//! The end-to-end LLM benchmark on our backend: the same source as the Candle-CUDA peer
//! (`benches/candle-peer/src/llama_e2e.rs`), with the device line changed to ours.
//!
//!   cargo run --release -p candle-rocm --features cuda --example llama_e2e -- --device cuda
//!   (`--device rocm` on an AMD GPU; `--device cpu` runs the CPU executor, for a smoke test
//!   with `--prompt 8 --steps 2 --reps 1`)
#[path = "../../benches/candle-peer/src/llama_e2e.rs"]
mod llama_e2e;

use candle_rocm::RocmDevice;

fn main() -> candle_core::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let which = a.iter().position(|x| x == "--device").and_then(|i| a.get(i + 1)).map_or("cuda", String::as_str);
    let dev = match which {
        "rocm" => RocmDevice::new_rocm(0)?,
        "cuda" => RocmDevice::new_cuda(0)?,
        "cpu" => RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W32),
        o => return Err(candle_core::Error::Msg(format!("--device {o}: rocm, cuda or cpu"))),
    };
    eprintln!("device: {}", dev.name());
    let r = llama_e2e::bench(&format!("candle-rocm ({})", dev.name()), &dev.as_candle())?;
    eprintln!("memory: {:?}", dev.memory_stats());
    eprintln!("first tokens: {:?}", &r.tokens[..r.tokens.len().min(8)]);
    Ok(())
}
