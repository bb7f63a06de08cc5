//! `llm-worker serve`: a model behind `llm-server`'s OpenAI-compatible HTTP API. The model,
//! tokenizer and engine load on the server's engine thread ([`load_served`]); the HTTP side
//! tokenizes and renders chat templates through [`ServedText`].

use crate::generate::blocks_needed;
use crate::tp::{tp_devices, TpRunner};
use crate::{Message, TextTools};
use llm_engine::{Engine, EngineConfig};
use std::path::PathBuf;

/// The text side `llm-server` needs: tokenizer, chat template, name, context length, EOS ids.
pub struct ServedText {
    pub text: TextTools,
    pub name: String,
    pub max_model_len: usize,
    pub eos_token_ids: Vec<u32>,
}

impl llm_server::ServedModel for ServedText {
    fn name(&self) -> &str {
        &self.name
    }
    fn max_model_len(&self) -> usize {
        self.max_model_len
    }
    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_ids.clone()
    }
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.text.encode_with(text, add_special_tokens).map_err(|e| e.to_string())
    }
    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.text.decode(ids).map_err(|e| e.to_string())
    }
    fn render_chat(&self, messages: &[llm_server::ChatMessage]) -> Result<String, String> {
        let m: Vec<Message> = messages.iter().map(|m| Message::new(&m.role, &m.content)).collect();
        self.text.render_chat(&m, true).map_err(|e| e.to_string())
    }
}

/// What `serve` loads and the engine's limits.
#[derive(Clone, Debug)]
pub struct ServeArgs {
    /// A Hugging Face folder or a GGUF file.
    pub model: PathBuf,
    pub tokenizer: Option<PathBuf>,
    /// cpu, cpu-executor, cuda:N, rocm:N.
    pub device: String,
    /// The id clients name (default: the file or folder name).
    pub name: Option<String>,
    /// Context length (default: the model's, at most 4096).
    pub max_model_len: Option<usize>,
    pub max_num_seqs: usize,
    pub max_batched_tokens: usize,
    pub block_size: usize,
    /// KV cache blocks (default: `max_num_seqs` sequences of `max_model_len`).
    pub num_blocks: Option<usize>,
    /// Devices the model is split across (tensor parallelism; 1: one device).
    pub tensor_parallel: usize,
}

/// Loads the model (split across `tensor_parallel` devices), its text tools and an engine
/// over a [`TpRunner`] (prefix caching on).
pub fn load_served(a: &ServeArgs) -> Result<(ServedText, Engine<TpRunner>), llm_server::LoadError> {
    let devs = tp_devices(&a.device, a.tensor_parallel)?;
    let dev_name = devs[0].1.clone();
    let t0 = std::time::Instant::now();
    let cfg = crate::shard::read_config(&a.model)?;
    let text = TextTools::load(&a.model, a.tokenizer.as_deref(), cfg.vocab_size)?;
    let max_len = a.max_model_len.unwrap_or(cfg.max_position_embeddings.min(4096));
    let eos_token_ids = cfg.eos_token_ids.clone();
    let name = a.name.clone().unwrap_or_else(|| a.model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()));
    let blocks = a.num_blocks.unwrap_or_else(|| blocks_needed(a.max_num_seqs, max_len, a.block_size));
    let devs: Vec<_> = devs.into_iter().map(|d| d.0).collect();
    let runner = TpRunner::load(&a.model, &devs, blocks, a.block_size)?;
    let config = EngineConfig {
        max_num_seqs: a.max_num_seqs,
        max_batched_tokens: a.max_batched_tokens.max(a.max_num_seqs),
        max_model_len: max_len,
        prefix_caching: true,
    };
    let mut engine = Engine::try_new(runner, config)?;
    warm_up(&mut engine)?;
    tracing::info!(model = %a.model.display(), device = %dev_name, tensor_parallel = a.tensor_parallel, blocks, block_size = a.block_size, max_model_len = max_len, load_s = t0.elapsed().as_secs_f64(), "loaded");
    Ok((ServedText { text, name, max_model_len: max_len, eos_token_ids }, engine))
}

/// Runs one short request (a prefill and a decode step) before the server says it is
/// ready, so that the first real requests do not wait for kernel modules to load (on NVIDIA
/// the driver compiles the PTX at first use: seconds per module on a fresh machine).
fn warm_up(engine: &mut Engine<TpRunner>) -> Result<(), llm_server::LoadError> {
    let (_, mut rx) = engine.add_request(vec![0, 0], llm_engine::SamplingParams::greedy(2)).map_err(|e| llm_server::LoadError::from(format!("warm-up request: {e}")))?;
    while engine.step().map_err(|e| llm_server::LoadError::from(format!("warm-up step: {e}")))? {}
    while rx.try_recv().is_ok() {}
    Ok(())
}
