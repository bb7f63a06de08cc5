//! The LLM worker: llama-family models (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) loaded from
//! Hugging Face safetensors folders or GGUF files onto any Candle device (Candle's CPU, or
//! ours: the CPU executor, `cuda:N`, `rocm:N`), a paged-KV-cache [`runner::LlamaRunner`]
//! for `llm_engine`, the tokenizer and chat template ([`text`]), a static-batch driver
//! ([`generate`]) and a random-weight model writer ([`random`]).
pub mod config;
pub mod error;
pub mod generate;
pub mod model;
pub mod random;
pub mod runner;
pub mod serve;
pub mod shard;
pub mod text;
pub mod tp;

pub use config::{Family, ModelConfig, RopeScaling};
pub use error::{Error, Result};
pub use model::Model;
pub use runner::LlamaRunner;
pub use text::{Message, TextTools};
pub use tp::TpRunner;

/// The Candle device of a `--device` spec: `cpu` (Candle's own CPU backend), `cpu-executor`
/// (our backend on the CPU executor; `cpu-executor:32` for wave 32), `cuda:N` / `rocm:N` (our
/// backend on a GPU; needs the `cuda` / `rocm` feature).
pub fn device(spec: &str) -> Result<(candle_core::Device, String)> {
    if spec == "cpu" {
        return Ok((candle_core::Device::Cpu, "Candle CPU backend".into()));
    }
    let d = candle_rocm::RocmDevice::from_spec(spec).map_err(|e| Error::Invalid(format!("device {spec:?}: {}", e.to_string().split("\n   0: ").next().unwrap_or_default())))?;
    Ok((d.as_candle(), d.name().to_string()))
}
