//! The engine: scheduler + runner step + sampling (skeleton).

use crate::{Event, HostSampler, ModelRunner, Receiver, Sampler, SamplingParams, SeqId};
use thiserror::Error;

/// Detokeniser used for stop strings: token ids of a completion to its text.
pub type Decoder = Box<dyn Fn(&[u32]) -> String + Send>;

/// Engine limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences running at once (in one batch) at most.
    pub max_num_seqs: usize,
    /// Tokens (decode tokens + prefill chunk tokens) in one step at most.
    pub max_batched_tokens: usize,
    /// Longest sequence (prompt + generated); longer prompts are rejected.
    pub max_model_len: usize,
    /// Reuse full KV blocks across requests by hash of their token prefix.
    pub prefix_caching: bool,
}

/// Typed errors of the engine. Rejected requests change nothing.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("prompt of {len} tokens exceeds max_model_len {max}")]
    PromptTooLong { len: usize, max: usize },
    #[error("invalid sampling parameter: {0}")]
    InvalidParams(String),
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    #[error("model runner: {0}")]
    Runner(Box<dyn std::error::Error + Send + Sync>),
}

/// A snapshot of the engine's state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub blocks_free: usize,
    pub prompt_tokens_processed: u64,
    pub generated_tokens: u64,
}

/// Continuous-batching engine over a [`ModelRunner`].
pub struct Engine<R: ModelRunner> {
    runner: R,
    config: EngineConfig,
    decoder: Option<Decoder>,
    sampler: Box<dyn Sampler>,
}

impl<R: ModelRunner> Engine<R> {
    /// An engine over `runner`; panics on an invalid config (see [`Engine::try_new`]).
    pub fn new(runner: R, config: EngineConfig) -> Self {
        Self::try_new(runner, config).unwrap_or_else(|e| panic!("{e}"))
    }
    /// An engine over `runner`, or why the config cannot work.
    pub fn try_new(runner: R, config: EngineConfig) -> Result<Self, EngineError> {
        Ok(Self { runner, config, decoder: None, sampler: Box::new(HostSampler) })
    }
    /// Queues a request; its events stream through the returned receiver.
    pub fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(SeqId, Receiver<Event>), EngineError> {
        let _ = (prompt, params, &self.config);
        todo!()
    }
    /// Ends a request: frees its blocks at once and sends `Finished { Cancelled }`.
    pub fn cancel(&mut self, id: SeqId) {
        let _ = id;
        todo!()
    }
    /// One scheduling iteration + one runner step + sampling; returns whether work remains.
    pub fn step(&mut self) -> Result<bool, EngineError> {
        todo!()
    }
    /// Whether any request is running or waiting.
    pub fn has_work(&self) -> bool {
        todo!()
    }
    /// Counters and occupancy.
    pub fn stats(&self) -> EngineStats {
        todo!()
    }
    /// Sets the detokeniser that stop strings are matched against (required for requests
    /// with `stop_strings`).
    pub fn with_decoder(mut self, decoder: Decoder) -> Self {
        self.decoder = Some(decoder);
        self
    }
    /// Replaces the host sampler (e.g. by a device sampler).
    pub fn with_sampler(mut self, sampler: Box<dyn Sampler>) -> Self {
        self.sampler = sampler;
        self
    }
    /// Starts a new sequence that continues `parent`'s tokens (prompt and generated so far)
    /// with its own params, sharing the parent's KV blocks copy-on-write.
    pub fn fork(
        &mut self,
        parent: SeqId,
        params: SamplingParams,
    ) -> Result<(SeqId, Receiver<Event>), EngineError> {
        let _ = (parent, params);
        todo!()
    }
    /// The runner.
    pub fn runner(&self) -> &R {
        &self.runner
    }
}
