//! `llm-worker serve`: a model behind `llm-server`'s OpenAI-compatible HTTP API. The model,
//! tokenizer and engine load on the server's engine thread ([`load_served`]); the HTTP side
//! tokenizes and renders chat templates through [`ServedText`].

use crate::generate::blocks_needed;
use crate::tp::{tp_devices, TpRunner};
use crate::{Message, TextTools};
use llm_engine::{DeviceSample, Engine, EngineConfig, ModelRunner, RowOutput, SeqChunk};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The text side `llm-server` needs: tokenizer, chat template, name, context length, EOS ids.
pub struct ServedText {
    pub text: TextTools,
    pub name: String,
    pub max_model_len: usize,
    pub eos_token_ids: Vec<u32>,
    /// The runner's step times (for `/metrics`).
    pub times: Arc<RunnerTimes>,
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
    fn metrics(&self) -> String {
        self.times.render()
    }
}

/// Time the runner spends in its steps (forward and logits download), split into pure-decode
/// steps and steps with prompt tokens: with the server's `llm_engine_step_seconds`, where an
/// engine step's time goes (runner vs scheduling, sampling and token events).
#[derive(Debug, Default)]
pub struct RunnerTimes {
    decode_steps: AtomicU64,
    decode_rows: AtomicU64,
    decode_ns: AtomicU64,
    mixed_steps: AtomicU64,
    mixed_tokens: AtomicU64,
    mixed_ns: AtomicU64,
}

impl RunnerTimes {
    fn record(&self, batch: &[SeqChunk], ns: u64) {
        let tokens: usize = batch.iter().map(|c| c.tokens.len()).sum();
        let (steps, n, t) = if tokens == batch.len() { (&self.decode_steps, &self.decode_rows, &self.decode_ns) } else { (&self.mixed_steps, &self.mixed_tokens, &self.mixed_ns) };
        steps.fetch_add(1, Ordering::Relaxed);
        n.fetch_add(tokens as u64, Ordering::Relaxed);
        t.fetch_add(ns, Ordering::Relaxed);
    }

    /// The Prometheus series: steps, rows (tokens) and seconds of each kind of step.
    pub fn render(&self) -> String {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut o = String::new();
        for (kind, steps, n, ns) in [("decode", &self.decode_steps, &self.decode_rows, &self.decode_ns), ("mixed", &self.mixed_steps, &self.mixed_tokens, &self.mixed_ns)] {
            let what = if kind == "decode" { "pure-decode steps (every chunk one token)" } else { "steps with prompt tokens" };
            o += &format!("# HELP llm_runner_{kind}_steps_total Runner {what}.\n# TYPE llm_runner_{kind}_steps_total counter\nllm_runner_{kind}_steps_total {}\n", ld(steps));
            o += &format!("# HELP llm_runner_{kind}_tokens_total Tokens run by runner {what}.\n# TYPE llm_runner_{kind}_tokens_total counter\nllm_runner_{kind}_tokens_total {}\n", ld(n));
            o += &format!("# HELP llm_runner_{kind}_seconds_total Wall time of runner {what} (forward and logits download).\n# TYPE llm_runner_{kind}_seconds_total counter\nllm_runner_{kind}_seconds_total {}\n", ld(ns) as f64 * 1e-9);
        }
        o
    }
}

/// A runner that times each step into [`RunnerTimes`].
pub struct TimedRunner<R> {
    pub inner: R,
    times: Arc<RunnerTimes>,
}

impl<R: ModelRunner> ModelRunner for TimedRunner<R> {
    type Error = R::Error;
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, R::Error> {
        let t = Instant::now();
        let r = self.inner.step(batch);
        self.times.record(batch, t.elapsed().as_nanos() as u64);
        r
    }
    fn samples_on_device(&self) -> bool {
        self.inner.samples_on_device()
    }
    fn step_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<Vec<RowOutput>, R::Error> {
        let t = Instant::now();
        let r = self.inner.step_sampled(batch, sampling);
        self.times.record(batch, t.elapsed().as_nanos() as u64);
        r
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), R::Error> {
        self.inner.copy_blocks(pairs)
    }
    fn blocks_allocated(&mut self, blocks: &[u32]) {
        self.inner.blocks_allocated(blocks)
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
    /// Prompt tokens a step that also decodes runs at most (chunked prefill for inter-token
    /// latency; `None`: up to `max_batched_tokens`). `llm-worker serve` passes
    /// [`DEFAULT_PREFILL_CHUNK_WHILE_DECODING`] unless told otherwise.
    pub prefill_chunk_while_decoding: Option<usize>,
    /// The cap holds only while at most this many requests wait for admission
    /// (`Engine::with_prefill_cap_backlog`; `None`: always).
    pub prefill_cap_backlog: Option<usize>,
}

/// `llm-worker serve`'s default cap on the prompt tokens of a step that also decodes
/// (`--prefill-chunk-while-decoding`; 0: none, a step takes up to `max_batched_tokens`).
/// An arriving 512-token prompt then joins the running sequences' steps 128 tokens at a
/// time, each such step a replayed mixed graph ([`crate::runner`]) a little longer than a
/// decode step, instead of one eager step several times longer: the inter-token latency's
/// tail stays within 2x its median at half of saturation, where uncapped it is about 3x
/// (`benches/results/h200-2026-11-28d/`).
pub const DEFAULT_PREFILL_CHUNK_WHILE_DECODING: usize = 128;

/// `llm-worker serve`'s default backlog above which the prompt cap is lifted
/// (`--prefill-cap-backlog`): with more than 4 requests waiting, steps take whole prompts
/// again, so a burst is admitted at the offline engine's pace (saturated throughput is
/// that of no cap).
pub const DEFAULT_PREFILL_CAP_BACKLOG: usize = 4;

/// Loads the model (split across `tensor_parallel` devices), its text tools and an engine
/// over a [`TpRunner`] (prefix caching on), timed by [`TimedRunner`].
pub fn load_served(a: &ServeArgs) -> Result<(ServedText, Engine<TimedRunner<TpRunner>>), llm_server::LoadError> {
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
    let graphs = candle_rocm::RocmDevice::from_candle(&devs[0]).is_some_and(|d| d.supports_graphs());
    let times = Arc::new(RunnerTimes::default());
    let runner = TimedRunner { inner: TpRunner::load(&a.model, &devs, blocks, a.block_size)?, times: times.clone() };
    let config = EngineConfig {
        max_num_seqs: a.max_num_seqs,
        max_batched_tokens: a.max_batched_tokens.max(a.max_num_seqs),
        max_model_len: max_len,
        prefix_caching: true,
    };
    let mut engine = Engine::try_new(runner, config)?;
    if let Some(n) = a.prefill_chunk_while_decoding {
        engine = engine.with_prefill_chunk_while_decoding(n)?;
    }
    if let Some(w) = a.prefill_cap_backlog {
        engine = engine.with_prefill_cap_backlog(w);
    }
    warm_up(&mut engine)?;
    if graphs {
        warm_graphs(&mut engine.runner_mut().inner, a.max_num_seqs, a.max_batched_tokens)?;
    }
    tracing::info!(model = %a.model.display(), device = %dev_name, tensor_parallel = a.tensor_parallel, blocks, block_size = a.block_size, max_model_len = max_len, load_s = t0.elapsed().as_secs_f64(), "loaded");
    Ok((ServedText { text, name, max_model_len: max_len, eos_token_ids, times }, engine))
}

/// Captures the runner's graphs before the server says it is ready (a capture costs a few
/// times a step; taken at the first step of each shape, the captures would land on the
/// inter-token latency of the first requests): decode steps of every bucket up to
/// `max_num_seqs` (as many as the cache holds) and the mixed steps of those decodes beside
/// prompt chunks of every mixed bucket's size ([`crate::runner::warm_up`]). Runs while the
/// engine holds no block.
fn warm_graphs(runner: &mut TpRunner, max_num_seqs: usize, max_batched_tokens: usize) -> Result<(), llm_server::LoadError> {
    let prompt: usize = 16;
    let mixed = runner.mixed_row_buckets();
    let (bs, blocks, largest) = (runner.block_size(), runner.num_blocks(), max_num_seqs.next_power_of_two().min(runner.graph_max_batch()));
    let batches: Vec<usize> = std::iter::successors(Some(1usize), |b| Some(b * 2))
        .take_while(|&b| b <= largest && crate::runner::warm_up_blocks(prompt, b, bs, &mixed) <= blocks)
        .collect();
    let t0 = std::time::Instant::now();
    crate::runner::warm_up(runner, prompt, &batches, max_batched_tokens.max(1), &mixed).map_err(|e| llm_server::LoadError::from(format!("graph warm-up: {e}")))?;
    tracing::info!(decode_batches = ?batches, prompt_rows = ?mixed, seconds = t0.elapsed().as_secs_f64(), "graphs captured");
    Ok(())
}

/// Runs one short request (a prefill and a decode step) before the server says it is
/// ready, so that the first real requests do not wait for kernel modules to load (on NVIDIA
/// the driver compiles the PTX at first use: seconds per module on a fresh machine).
fn warm_up<R: ModelRunner>(engine: &mut Engine<R>) -> Result<(), llm_server::LoadError> {
    let (_, mut rx) = engine.add_request(vec![0, 0], llm_engine::SamplingParams::greedy(2)).map_err(|e| llm_server::LoadError::from(format!("warm-up request: {e}")))?;
    while engine.step().map_err(|e| llm_server::LoadError::from(format!("warm-up step: {e}")))? {}
    while rx.try_recv().is_ok() {}
    Ok(())
}
