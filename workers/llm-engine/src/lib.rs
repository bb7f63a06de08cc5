//! Model-independent core of the LLM serving engine (skeleton: bodies follow).

mod block;
mod engine;
mod sampling;

pub use block::{BlockHash, BlockManager, BlockManagerError};
pub use engine::{Decoder, Engine, EngineConfig, EngineError, EngineStats};
pub use sampling::{HostSampler, SampleInput, Sampled, Sampler, SamplingParams};

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
    /// Position of tokens[0]; tokens cover positions start_pos..start_pos+tokens.len().
    pub start_pos: usize,
    /// Physical KV block ids holding positions 0..start_pos+tokens.len() (block_size each).
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
    /// Told (before the `copy_blocks`/`step` of the same iteration) which blocks were freshly
    /// allocated: their previous contents will never be read again. Default: nothing. A runner
    /// may use it to check its cache (the tests do) or to clear memory.
    fn blocks_allocated(&mut self, _blocks: &[u32]) {}
}

/// What a request's receiver sees: its tokens as they are generated, then one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token; `logprob`/`top_logprobs` when the request asked for logprobs.
    Token { id: u32, logprob: Option<f32>, top_logprobs: Vec<(u32, f32)> },
    /// The last event of a stream.
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
