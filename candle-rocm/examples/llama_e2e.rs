//! The end-to-end LLM benchmark on our backend: the same source as the Candle-CUDA peer
//! (`benches/candle-peer/src/llama_e2e.rs`), with the device line changed to ours.
//!
//!   cargo run --release -p candle-rocm --features cuda --example llama_e2e -- --device cuda
//!   (`--device rocm` on an AMD GPU; `--device cpu` runs the CPU executor, for a smoke test
//!   with `--prompt 8 --steps 2 --reps 1`)
//!
//! `--profile [PREFIX]`: after the timed runs, one more run with the per-op profile on
//! (`candle_rocm::profile`: device events around each backend op); prints a table per phase
//! (prefill, decode) sorted by total time and, with PREFIX, writes `PREFIX.json` (both
//! phases) and `PREFIX.prefill.csv` / `PREFIX.decode.csv`. The profiled run's own timings
//! include the profiler's overhead and are not the benchmark's numbers.
#[path = "../../benches/candle-peer/src/llama_e2e.rs"]
mod llama_e2e;

use candle_rocm::{Profile, RocmDevice};
use llama_e2e::Phase;

fn main() -> candle_core::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let value = |k: &str| a.iter().position(|x| x == k).and_then(|i| a.get(i + 1)).filter(|v| !v.starts_with("--")).cloned();
    let which = value("--device").unwrap_or_else(|| "cuda".into());
    // `cpu`: the CPU executor with waves of 32 (a smoke test); else `RocmDevice::from_spec`.
    let dev = match which.as_str() {
        "cpu" => RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W32),
        spec => RocmDevice::from_spec(spec)?,
    };
    eprintln!("device: {}", dev.name());
    // The timed runs are never profiled (CANDLE_ROCM_PROFILE is for other programs).
    dev.set_profiling(false);
    let backend = format!("candle-rocm ({})", dev.name());
    let (r, model, cfg) = llama_e2e::bench_keep(&backend, &dev.as_candle())?;
    eprintln!("memory: {:?}", dev.memory_stats());
    eprintln!("first tokens: {:?}", &r.tokens[..r.tokens.len().min(8)]);
    if a.iter().any(|x| x == "--profile") {
        profile(&dev, &model, &cfg, value("--profile"))?;
    }
    Ok(())
}

/// One run with the per-op profile on; a table per phase, files under `prefix`.
fn profile(dev: &RocmDevice, model: &candle_transformers::models::llama::Llama, cfg: &candle_transformers::models::llama::Config, prefix: Option<String>) -> candle_core::Result<()> {
    let (prompt, steps, dtype, _) = llama_e2e::args();
    let mut phases: Vec<(Phase, Profile)> = Vec::new();
    let mut current: Option<Phase> = None;
    let r = llama_e2e::run_phased(model, cfg, dtype, &dev.as_candle(), prompt, steps, &mut |next| {
        // Everything recorded since the last boundary belongs to the phase that just ended.
        match current {
            Some(p) => phases.push((p, dev.take_profile()?)),
            None => {
                dev.take_profile()?;
            }
        }
        dev.set_profiling(next.is_some());
        current = next;
        Ok(())
    })?;
    let mut json = Vec::new();
    for (phase, p) in &phases {
        let (wall_s, tokens) = match phase {
            Phase::Prefill => (r.prefill_s, r.prompt_tokens),
            Phase::Decode => (r.decode_s, r.decode_steps),
        };
        println!(
            "\n== {phase:?} ({tokens} tokens; profiled wall {:.1} ms, ops {:.1} ms over {} calls)\n{}",
            wall_s * 1e3,
            p.total_ms(),
            p.calls(),
            p.table()
        );
        json.push(format!("\"{}\":{{\"tokens\":{tokens},\"wall_ms\":{:.3},\"ops\":{}}}", format!("{phase:?}").to_lowercase(), wall_s * 1e3, p.to_json()));
        if let Some(prefix) = &prefix {
            let path = format!("{prefix}.{}.csv", format!("{phase:?}").to_lowercase());
            std::fs::write(&path, p.to_csv()).map_err(|e| candle_core::Error::Msg(format!("{path}: {e}")))?;
        }
    }
    if let Some(prefix) = &prefix {
        let path = format!("{prefix}.json");
        let body = format!("{{\"device\":\"{}\",\"dtype\":\"{dtype:?}\",{}}}\n", dev.name().escape_default(), json.join(","));
        std::fs::write(&path, body).map_err(|e| candle_core::Error::Msg(format!("{path}: {e}")))?;
        eprintln!("profile written to {path} and {prefix}.{{prefill,decode}}.csv");
    }
    Ok(())
}
