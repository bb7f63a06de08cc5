//! Model-independent core of the LLM serving engine: what vLLM calls the block manager, the
//! scheduler and the sampler, with the model behind the [`ModelRunner`] trait. Pure host
//! Rust; `workers/llm` supplies the runner (weights, paged KV cache, kernels).
//!
//! # Parts
//! - [`BlockManager`]: the paged KV cache's bookkeeping. Physical blocks of `block_size`
//!   tokens with reference counts; sequences share blocks (a [`Engine::fork`] shares its
//!   parent's) and a write into a shared block copies it first (copy-on-write, done by
//!   [`ModelRunner::copy_blocks`]). With [`EngineConfig::prefix_caching`], every full block is
//!   registered under the hash of its tokens chained with its parent block's hash; a new
//!   request takes the cached blocks of its longest cached prefix, and freed blocks stay
//!   findable until they are reallocated, least recently freed first (LRU).
//! - The scheduler (inside [`Engine::step`]): continuous batching under `max_num_seqs` and a
//!   token budget `max_batched_tokens`. Running decodes come first (one token each), then
//!   prefill chunks of running sequences, then waiting requests first come first served, a
//!   chunk each as far as the budget and free blocks allow (chunked prefill). When a running
//!   sequence needs a block and none is free, the newest running sequence loses its blocks
//!   and goes back to the front of the queue with its generated tokens appended to its prompt
//!   (preemption by recompute; the prefix cache often makes the recompute cheap).
//! - [`Sampler`] / [`HostSampler`]: repetition penalty, temperature (0 = greedy), top-k,
//!   top-p, min-p and logprobs on the host with a per-request seeded ChaCha RNG; another
//!   host sampler can replace it ([`Engine::with_sampler`]).
//! - Device sampling: a runner that can draw tokens where its logits are
//!   ([`ModelRunner::samples_on_device`]) gets each row's [`DeviceSample`] (greedy,
//!   temperature, top-k, top-p, min-p and a key from the request's RNG) and sends back only
//!   token ids ([`ModelRunner::step_sampled`]); rows that need the host (repetition penalty,
//!   logprobs) come back as logits in the same step. On by default
//!   ([`Engine::with_device_sampling`]).
//! - Stop handling: `max_tokens`, `max_model_len`, stop token ids, stop strings (matched on
//!   the completion decoded by the [`Decoder`] given to [`Engine::with_decoder`]; tokens are
//!   held back while they might start a stop string, and the match is never sent),
//!   [`Engine::cancel`] and a dropped receiver (blocks freed at once).
//!
//! # The step loop
//! Each [`Engine::step`]: cancel requests whose receiver was dropped; schedule a batch of
//! [`SeqChunk`]s (allocating blocks, collecting copy-on-write pairs, preempting); tell the
//! runner which blocks are fresh ([`ModelRunner::blocks_allocated`]), copy blocks, run
//! [`ModelRunner::step`]; register newly full blocks in the prefix cache; sample one token
//! per chunk that reached the end of its sequence; apply the stop rules and send
//! [`Event`]s. A server calls `step` in a loop on its own thread while [`Engine::has_work`];
//! events go out through tokio unbounded channels ([`Receiver`]), readable from async and
//! sync code. Sequence lengths never exceed `max_model_len` KV positions, so the runner's
//! cache must hold one such sequence ([`Engine::try_new`] checks).
//!
//! ```
//! use llm_engine::{Engine, EngineConfig, Event, ModelRunner, SamplingParams, SeqChunk};
//!
//! /// A "model" whose next token is always (last token + 1) mod 8.
//! struct Counter;
//! impl ModelRunner for Counter {
//!     type Error = std::convert::Infallible;
//!     fn block_size(&self) -> usize { 16 }
//!     fn num_blocks(&self) -> usize { 8 }
//!     fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error> {
//!         Ok(batch.iter().filter(|c| c.sample).map(|c| {
//!             let next = (*c.tokens.last().unwrap() as usize + 1) % 8;
//!             (0..8).map(|t| if t == next { 1.0 } else { 0.0 }).collect()
//!         }).collect())
//!     }
//!     fn copy_blocks(&mut self, _pairs: &[(u32, u32)]) -> Result<(), Self::Error> { Ok(()) }
//! }
//!
//! let config = EngineConfig { max_num_seqs: 4, max_batched_tokens: 64, max_model_len: 128, prefix_caching: true };
//! let mut engine = Engine::new(Counter, config);
//! let params = SamplingParams { stop_token_ids: vec![0], ..SamplingParams::greedy(10) };
//! let (_id, mut rx) = engine.add_request(vec![3, 4], params).unwrap();
//! while engine.step().unwrap() {}
//! let mut tokens = Vec::new();
//! while let Ok(ev) = rx.try_recv() {
//!     if let Event::Token { id, .. } = ev { tokens.push(id) }
//! }
//! assert_eq!(tokens, [5, 6, 7]); // then 0, the stop token, ends it unsent
//! assert_eq!(engine.stats().blocks_used, 0);
//! ```

mod block;
mod engine;
mod sampling;

pub use block::{BlockHash, BlockManager, BlockManagerError};
pub use engine::{Decoder, Engine, EngineConfig, EngineError, EngineStats};
pub use sampling::{sample_one, DeviceSample, HostSampler, SampleInput, Sampled, Sampler, SamplingParams};
/// The RNG crate of [`SampleInput::rng`], for samplers written elsewhere.
pub use rand_chacha;

/// Identifies one request (sequence) inside an [`Engine`].
pub type SeqId = u64;

/// The receiving end of a request's event stream: tokio's unbounded mpsc receiver. Use
/// `recv().await` from async code (a tokio server) and `blocking_recv()` from plain threads
/// (never inside a runtime), or `try_recv()` to poll after [`Engine::step`].
pub type Receiver<T> = tokio::sync::mpsc::UnboundedReceiver<T>;

/// One sequence's work in one engine step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    pub seq_id: SeqId,
    /// Token ids to run now: a (chunk of a) prompt, or the one token sampled last step.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`; tokens cover positions `start_pos..start_pos+tokens.len()`.
    pub start_pos: usize,
    /// Physical KV block ids holding positions `0..start_pos+tokens.len()` (`block_size` each).
    pub block_table: Vec<u32>,
    /// Whether logits are needed for the last token of this chunk (false for non-final prefill chunks).
    pub sample: bool,
}

/// The model side of the engine: owns the weights and the paged KV cache.
pub trait ModelRunner {
    type Error: std::error::Error + Send + Sync + 'static;
    /// Tokens per KV block (16, 32 or 64).
    fn block_size(&self) -> usize;
    /// The number of blocks the runner's cache holds (block ids are `0..num_blocks`).
    fn num_blocks(&self) -> usize;
    /// Runs one step: writes K/V of every chunk's tokens into its blocks, returns one logits row
    /// (vocab f32) per chunk with `sample == true`, in batch order.
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error>;
    /// Copies whole blocks src -> dst (copy-on-write of a shared block before a write).
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), Self::Error>;
    /// Whether [`ModelRunner::step_sampled`] draws tokens where the logits are (only token
    /// ids come back to the host). Default: false (the engine samples every row on the host).
    fn samples_on_device(&self) -> bool {
        false
    }
    /// [`ModelRunner::step`], with one output per chunk with `sample == true` (batch order):
    /// where `sampling[i]` (the `i`-th sampled chunk) is `Some`, the token drawn by the runner
    /// with it ([`RowOutput::Token`], an id below the vocabulary size); where it is `None`, the
    /// logits row ([`RowOutput::Logits`]) for the host sampler. `sampling` has one entry per
    /// sampled chunk. The default runs `step` and returns every row as logits (the engine then
    /// samples them all on the host).
    fn step_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<Vec<RowOutput>, Self::Error> {
        let _ = sampling;
        Ok(self.step(batch)?.into_iter().map(RowOutput::Logits).collect())
    }
    /// Told (before the `copy_blocks`/`step` of the same iteration) which blocks were freshly
    /// allocated: their previous contents will never be read again. Default: nothing. A runner
    /// may use it to check its cache (the tests do) or to clear memory.
    fn blocks_allocated(&mut self, _blocks: &[u32]) {}
}

/// One sampled chunk's result of [`ModelRunner::step_sampled`].
#[derive(Clone, Debug, PartialEq)]
pub enum RowOutput {
    /// The token the runner drew (device sampling).
    Token(u32),
    /// The logits row (vocab f32), sampled on the host.
    Logits(Vec<f32>),
}

/// What a request's receiver sees: its tokens as they are generated, then one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token; `logprob`/`top_logprobs` when the request asked for logprobs.
    Token { id: u32, logprob: Option<f32>, top_logprobs: Vec<(u32, f32)> },
    /// The last event of a stream. `prompt_tokens`: the prompt's length (a fork's: its parent's
    /// tokens at the fork); `completion_tokens`: every token sampled, including a stop token
    /// and tokens withheld because they formed a stop string.
    Finished { reason: FinishReason, prompt_tokens: usize, completion_tokens: usize },
}

/// Why a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` generated, or the sequence reached `max_model_len`.
    Length,
    /// A stop token id or stop string was produced (and not emitted).
    Stop,
    /// [`Engine::cancel`] or the receiver was dropped.
    Cancelled,
    /// The model runner failed on a step that included this sequence.
    Error(String),
}
