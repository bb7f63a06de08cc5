//! The engine: the scheduler, one runner step per iteration, sampling and stop handling.

use crate::block::{BlockHash, BlockManager};
use crate::sampling::{DeviceSample, HostSampler, SampleInput, Sampled, Sampler, SamplingParams};
use crate::{Event, FinishReason, ModelRunner, Receiver, RowOutput, SeqChunk, SeqId};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use std::collections::{HashMap, VecDeque};
use thiserror::Error;
use tokio::sync::mpsc::UnboundedSender;

/// Detokeniser used for stop strings: token ids (a slice of a request's completion, possibly
/// empty) to text, e.g. `tokenizer.decode(ids, false)`. Called a few times per sampled token of
/// requests with stop strings, on the unsent tokens and the 4 tokens before them.
pub type Decoder = Box<dyn Fn(&[u32]) -> String + Send>;

/// Engine limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences running at once (in one batch) at most. Keep it <= `max_batched_tokens`, or
    /// some running sequences skip steps (decodes are served oldest first).
    pub max_num_seqs: usize,
    /// Tokens (decode tokens + prefill chunk tokens) in one step at most.
    pub max_batched_tokens: usize,
    /// Longest sequence (prompt + generated); longer prompts are rejected, a sequence that
    /// reaches it finishes with `Length`. The runner's cache must hold one such sequence.
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
    /// The runner failed; the sequences of that step finished with `FinishReason::Error`.
    #[error("model runner: {0}")]
    Runner(Box<dyn std::error::Error + Send + Sync>),
    /// The runner (or a replacement sampler) broke its contract, e.g. returned the wrong
    /// number of logits rows; the sequences of that step finished with `FinishReason::Error`.
    #[error("model runner returned {0}")]
    RunnerOutput(String),
}

/// A snapshot of the engine's state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences holding a batch slot (and their KV blocks).
    pub running: usize,
    /// Sequences queued (new, or preempted to be recomputed).
    pub waiting: usize,
    pub blocks_total: usize,
    /// Blocks referenced by a sequence.
    pub blocks_used: usize,
    /// Blocks that can be allocated (`blocks_total - blocks_used`), cached ones included.
    pub blocks_free: usize,
    /// Free blocks still holding a reusable prefix (prefix caching).
    pub blocks_cached: usize,
    /// Tokens run through the model other than decode inputs: prompts and recomputation.
    pub prompt_tokens_processed: u64,
    /// Tokens run through the model in total.
    pub tokens_processed: u64,
    /// Tokens sampled.
    pub generated_tokens: u64,
    /// Prompt tokens whose KV came from the prefix cache instead of the model.
    pub prefix_cache_hit_tokens: u64,
    /// Sequences preempted (blocks taken, recomputed later).
    pub preemptions: u64,
    /// Runner steps run.
    pub steps: u64,
}

/// A batch plan: each sequence and how many of its tokens run.
type Plan = Vec<(SeqId, usize)>;

struct Sequence {
    /// Prompt then generated tokens; the last one is not yet in the KV cache while decoding.
    tokens: Vec<u32>,
    /// Prompt length reported in `Finished` (a fork's prompt is its parent's tokens at fork).
    prompt_len: usize,
    /// Tokens whose KV is in `table`.
    num_computed: usize,
    table: Vec<u32>,
    /// Content hashes of the full blocks of `tokens` computed so far (prefix caching).
    hashes: Vec<BlockHash>,
    params: SamplingParams,
    rng: ChaCha12Rng,
    tx: UnboundedSender<Event>,
    /// Sampled tokens not yet sent (held back while they may start a stop string).
    pending: Vec<Sampled>,
    /// Completion tokens sent so far.
    emitted: usize,
}

impl Sequence {
    fn completion(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// Continuous-batching engine over a [`ModelRunner`]. See the crate doc for the step loop.
pub struct Engine<R: ModelRunner> {
    runner: R,
    config: EngineConfig,
    decoder: Option<Decoder>,
    sampler: Box<dyn Sampler>,
    /// Rows the runner can draw go to it ([`ModelRunner::step_sampled`]).
    device_sampling: bool,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    /// Admission order: the last is the first to be preempted.
    running: Vec<SeqId>,
    waiting: VecDeque<SeqId>,
    next_id: SeqId,
    stats: EngineStats,
    /// Prompt tokens one step runs at most while some sequence decodes in it (see
    /// [`Engine::with_prefill_chunk_while_decoding`]); `usize::MAX`: no cap.
    prefill_cap: usize,
    /// The cap holds only while at most this many requests wait for admission (see
    /// [`Engine::with_prefill_cap_backlog`]); `usize::MAX`: always.
    prefill_cap_backlog: usize,
}

impl<R: ModelRunner> Engine<R> {
    /// An engine over `runner`; panics on an invalid config (see [`Engine::try_new`]).
    pub fn new(runner: R, config: EngineConfig) -> Self {
        Self::try_new(runner, config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An engine over `runner`, or why the config cannot work: every limit must be >= 1 and
    /// the runner's cache must hold one sequence of `max_model_len` tokens.
    pub fn try_new(runner: R, config: EngineConfig) -> Result<Self, EngineError> {
        let bs = runner.block_size();
        let nb = runner.num_blocks();
        let bad = |m: String| Err(EngineError::InvalidConfig(m));
        if bs == 0 {
            return bad("runner block_size is 0".into());
        }
        if config.max_num_seqs == 0 || config.max_batched_tokens == 0 || config.max_model_len == 0 {
            return bad(format!("max_num_seqs, max_batched_tokens and max_model_len must be >= 1: {config:?}"));
        }
        if nb < config.max_model_len.div_ceil(bs) || nb > u32::MAX as usize {
            return bad(format!(
                "the runner's {nb} blocks of {bs} tokens cannot hold one sequence of max_model_len {}",
                config.max_model_len
            ));
        }
        Ok(Self {
            blocks: BlockManager::new(nb, bs, config.prefix_caching),
            runner,
            config,
            decoder: None,
            sampler: Box::new(HostSampler),
            device_sampling: true,
            seqs: HashMap::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            stats: EngineStats::default(),
            prefill_cap: usize::MAX,
            prefill_cap_backlog: usize::MAX,
        })
    }

    /// Sets the detokeniser that stop strings are matched against (required for requests
    /// with `stop_strings`).
    pub fn with_decoder(mut self, decoder: Decoder) -> Self {
        self.decoder = Some(decoder);
        self
    }

    /// Caps the prompt tokens (prefill chunks and admissions together) of a step that also
    /// runs decodes at `tokens` (>= 1), so an arriving prompt is prefilled over several
    /// steps instead of stalling every running sequence for one long step (chunked prefill
    /// for inter-token latency). Steps without decodes keep the whole `max_batched_tokens`
    /// budget. Default: no cap.
    pub fn with_prefill_chunk_while_decoding(mut self, tokens: usize) -> Result<Self, EngineError> {
        if tokens == 0 {
            return Err(EngineError::InvalidConfig("the prefill chunk while decoding must be >= 1 token".into()));
        }
        self.prefill_cap = tokens;
        Ok(self)
    }

    /// Lifts the prefill cap ([`Engine::with_prefill_chunk_while_decoding`]) while more than
    /// `waiting` requests wait for admission: below saturation arriving prompts are spread
    /// over steps (inter-token latency), while a backlog builds the steps take the whole
    /// budget (throughput). Default: the cap always holds.
    pub fn with_prefill_cap_backlog(mut self, waiting: usize) -> Self {
        self.prefill_cap_backlog = waiting;
        self
    }

    /// Replaces the host sampler; every row is then sampled by it (device sampling off).
    pub fn with_sampler(mut self, sampler: Box<dyn Sampler>) -> Self {
        self.sampler = sampler;
        self.device_sampling = false;
        self
    }

    /// Whether rows that need no host processing (no repetition penalty, no logprobs) are
    /// drawn by a runner that [`samples on its device`](ModelRunner::samples_on_device), so
    /// only token ids come back (default: on). Greedy rows give the same tokens either way;
    /// seeded rows with a temperature draw from the same distribution with the device's
    /// generator, so their tokens differ from the host sampler's.
    pub fn with_device_sampling(mut self, on: bool) -> Self {
        self.device_sampling = on;
        self
    }

    fn check_params(&self, params: &SamplingParams) -> Result<(), EngineError> {
        params.validate().map_err(EngineError::InvalidParams)?;
        if !params.stop_strings.is_empty() && self.decoder.is_none() {
            return Err(EngineError::InvalidParams("stop_strings need a decoder (Engine::with_decoder)".into()));
        }
        Ok(())
    }

    fn new_seq(&mut self, tokens: Vec<u32>, params: SamplingParams) -> (SeqId, Sequence, Receiver<Event>) {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rng = match params.seed {
            Some(s) => ChaCha12Rng::seed_from_u64(s),
            None => ChaCha12Rng::from_os_rng(),
        };
        let seq = Sequence {
            prompt_len: tokens.len(),
            tokens,
            num_computed: 0,
            table: Vec::new(),
            hashes: Vec::new(),
            params,
            rng,
            tx,
            pending: Vec::new(),
            emitted: 0,
        };
        (id, seq, rx)
    }

    /// Queues a request; its events stream through the returned receiver. Rejects (changing
    /// nothing) an empty prompt, one longer than `max_model_len`, and bad params.
    pub fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
    ) -> Result<(SeqId, Receiver<Event>), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.config.max_model_len {
            return Err(EngineError::PromptTooLong { len: prompt.len(), max: self.config.max_model_len });
        }
        self.check_params(&params)?;
        let (id, seq, rx) = self.new_seq(prompt, params);
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        Ok((id, rx))
    }

    /// Starts a new sequence that continues `parent`'s tokens (prompt and generated so far,
    /// which become the child's prompt) with its own params. A running parent's KV blocks are
    /// shared copy-on-write while a batch slot is free; otherwise the child queues and
    /// computes its prompt (from the prefix cache where it can).
    pub fn fork(
        &mut self,
        parent: SeqId,
        params: SamplingParams,
    ) -> Result<(SeqId, Receiver<Event>), EngineError> {
        let p = self.seqs.get(&parent).ok_or(EngineError::UnknownSequence(parent))?;
        if p.tokens.len() >= self.config.max_model_len {
            return Err(EngineError::PromptTooLong { len: p.tokens.len(), max: self.config.max_model_len });
        }
        self.check_params(&params)?;
        let tokens = p.tokens.clone();
        let share = self.running.contains(&parent) && self.running.len() < self.config.max_num_seqs;
        let (num_computed, table, hashes) =
            if share { (p.num_computed, p.table.clone(), p.hashes.clone()) } else { (0, Vec::new(), Vec::new()) };
        let (id, mut seq, rx) = self.new_seq(tokens, params);
        self.blocks.share(&table);
        seq.num_computed = num_computed;
        seq.table = table;
        seq.hashes = hashes;
        self.seqs.insert(id, seq);
        if share {
            self.running.push(id);
        } else {
            self.waiting.push_back(id);
        }
        Ok((id, rx))
    }

    /// Ends a request: frees its blocks at once and sends `Finished { Cancelled }`. Unknown
    /// (or already finished) ids are ignored.
    pub fn cancel(&mut self, id: SeqId) {
        self.finish(id, FinishReason::Cancelled);
    }

    /// Whether any request is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            blocks_total: self.blocks.num_blocks(),
            blocks_used: self.blocks.num_used(),
            blocks_free: self.blocks.num_free(),
            blocks_cached: self.blocks.num_cached_free(),
            ..self.stats.clone()
        }
    }

    /// The limits the engine runs under.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The block manager (read-only: occupancy, reference counts).
    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// The runner.
    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// The runner, mutably (e.g. to read its counters); do not touch KV blocks the engine owns.
    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Removes a sequence: frees its blocks, sends what is pending (unless cancelled or
    /// failed) and `Finished`.
    fn finish(&mut self, id: SeqId, reason: FinishReason) {
        let Some(mut seq) = self.seqs.remove(&id) else { return };
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        self.blocks.free_table(&mut seq.table);
        if matches!(reason, FinishReason::Length) {
            for s in std::mem::take(&mut seq.pending) {
                let _ = seq.tx.send(token_event(&seq.params, s));
            }
        }
        let completion_tokens = seq.tokens.len() - seq.prompt_len;
        let _ = seq.tx.send(Event::Finished { reason, prompt_tokens: seq.prompt_len, completion_tokens });
    }

    /// Takes the blocks of `id` and queues it first to be recomputed.
    fn preempt(&mut self, id: SeqId) {
        let seq = self.seqs.get_mut(&id).expect("running sequence");
        self.blocks.free_table(&mut seq.table);
        seq.num_computed = 0;
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
    }

    /// Makes the blocks of `id` cover `n` more tokens from `num_computed` (allocating and
    /// copying a shared block that will be written); all or nothing.
    fn reserve(&mut self, id: SeqId, n: usize, copies: &mut Vec<(u32, u32)>) -> bool {
        let bs = self.blocks.block_size();
        let seq = self.seqs.get_mut(&id).expect("sequence");
        let first = seq.num_computed / bs;
        let need_new = self.blocks.blocks_for(seq.num_computed + n).saturating_sub(seq.table.len());
        let needs_cow = first < seq.table.len() && self.blocks.ref_count(seq.table[first]) > 1;
        if need_new + needs_cow as usize > self.blocks.num_free() {
            return false;
        }
        if needs_cow {
            if let Some(pair) = self.blocks.cow(&mut seq.table, first).expect("checked free blocks") {
                copies.push(pair);
            }
        }
        self.blocks.grow(&mut seq.table, seq.num_computed + n).expect("checked free blocks");
        true
    }

    /// How many of `want` tokens from `num_computed` fit the free blocks minus `keep_free`.
    fn fit(&self, id: SeqId, want: usize, keep_free: usize) -> usize {
        let bs = self.blocks.block_size();
        let seq = &self.seqs[&id];
        let avail = self.blocks.num_free().saturating_sub(keep_free);
        let first = seq.num_computed / bs;
        let cow = (first < seq.table.len() && self.blocks.ref_count(seq.table[first]) > 1) as usize;
        if avail < cow {
            return 0;
        }
        let cap = (seq.table.len() + avail - cow) * bs;
        want.min(cap.saturating_sub(seq.num_computed))
    }

    /// Takes cached blocks for the longest cached full-block prefix of a sequence without
    /// blocks (never its last token, whose logits are needed).
    fn attach_prefix(&mut self, id: SeqId) {
        let bs = self.blocks.block_size();
        let seq = self.seqs.get_mut(&id).expect("sequence");
        if !self.blocks.prefix_caching() || !seq.table.is_empty() {
            return;
        }
        let max_blocks = (seq.tokens.len() - 1) / bs;
        seq.hashes.clear();
        for i in 0..max_blocks {
            match self.blocks.lookup(seq.hashes.last().copied(), &seq.tokens[i * bs..(i + 1) * bs]) {
                Some((b, h)) => {
                    seq.table.push(b);
                    seq.hashes.push(h);
                }
                None => break,
            }
        }
        seq.num_computed = seq.table.len() * bs;
        self.stats.prefix_cache_hit_tokens += seq.num_computed as u64;
    }

    /// The sequence to preempt: the newest running one not yet in `plan`.
    fn victim(&self, plan: &[(SeqId, usize)]) -> Option<SeqId> {
        self.running.iter().rev().copied().find(|id| plan.iter().all(|(p, _)| p != id))
    }

    /// Plans one batch: decodes first, then prefill chunks of running sequences, then new
    /// admissions, under the token budget. When blocks run out for a running sequence, the
    /// newest running sequence not yet scheduled is preempted (possibly itself).
    fn schedule(&mut self) -> (Plan, Vec<(u32, u32)>) {
        let mut plan: Plan = Vec::new();
        let mut copies = Vec::new();
        let mut budget = self.config.max_batched_tokens;
        let remaining = |s: &Sequence| s.tokens.len() - s.num_computed;
        let preemptions = self.stats.preemptions;

        // 1. Decodes (one token each), then 2. prefill chunks, each pass oldest first.
        for decode_pass in [true, false] {
            if !decode_pass && !plan.is_empty() && self.waiting.len() <= self.prefill_cap_backlog {
                // Decodes are in this step and no backlog: the prompts' share is capped
                // (admissions too).
                budget = budget.min(self.prefill_cap);
            }
            let mut i = 0;
            while i < self.running.len() && budget > 0 {
                let id = self.running[i];
                let rem = remaining(&self.seqs[&id]);
                if (rem == 1) != decode_pass || plan.iter().any(|(p, _)| *p == id) {
                    i += 1;
                    continue;
                }
                loop {
                    let n = self.fit(id, rem.min(budget), 0);
                    if n > 0 && self.reserve(id, n, &mut copies) {
                        plan.push((id, n));
                        budget -= n;
                        i += 1;
                        break;
                    }
                    let victim = self.victim(&plan).expect("this sequence is unscheduled");
                    self.preempt(victim);
                    if victim == id {
                        break;
                    }
                    if let Some(v) = self.running.iter().position(|&r| r == id) {
                        i = v;
                    }
                }
            }
        }

        // 3. Admissions, first come first served (none after a preemption, which would
        //    thrash), keeping one free block per running sequence so the next decodes need
        //    not preempt what was just admitted.
        let preempted = self.stats.preemptions != preemptions && !plan.is_empty();
        while !preempted && budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else { break };
            self.attach_prefix(id);
            let rem = remaining(&self.seqs[&id]);
            let n = self.fit(id, rem.min(budget), self.running.len());
            if n == 0 || !self.reserve(id, n, &mut copies) {
                let seq = self.seqs.get_mut(&id).expect("sequence");
                self.stats.prefix_cache_hit_tokens -= seq.num_computed as u64;
                seq.num_computed = 0;
                self.blocks.free_table(&mut seq.table);
                break;
            }
            self.waiting.pop_front();
            self.running.push(id);
            plan.push((id, n));
            budget -= n;
        }
        (plan, copies)
    }

    /// One scheduling iteration + one runner step + sampling; returns whether work remains.
    ///
    /// Sequences whose receiver was dropped are cancelled first. If the runner fails, the
    /// sequences of the batch finish with `FinishReason::Error` (their blocks freed) and the
    /// error is returned; the engine stays usable.
    pub fn step(&mut self) -> Result<bool, EngineError> {
        let closed: Vec<SeqId> = self.seqs.iter().filter(|(_, s)| s.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in closed {
            self.finish(id, FinishReason::Cancelled);
        }
        if self.seqs.is_empty() {
            return Ok(false);
        }
        let (plan, copies) = self.schedule();
        if plan.is_empty() {
            debug_assert!(false, "work remains but nothing was scheduled");
            return Ok(self.has_work());
        }

        let batch: Vec<SeqChunk> = plan
            .iter()
            .map(|&(id, n)| {
                let s = &self.seqs[&id];
                let end = s.num_computed + n;
                SeqChunk {
                    seq_id: id,
                    tokens: s.tokens[s.num_computed..end].to_vec(),
                    start_pos: s.num_computed,
                    block_table: s.table.clone(),
                    sample: end == s.tokens.len(),
                }
            })
            .collect();
        // Device draws: one spec per sampled chunk, keys taken from each request's RNG.
        let mut specs: Vec<Option<DeviceSample>> = Vec::new();
        if self.device_sampling && self.runner.samples_on_device() {
            for c in batch.iter().filter(|c| c.sample) {
                let s = self.seqs.get_mut(&c.seq_id).expect("sequence");
                specs.push(DeviceSample::of(&s.params, &mut s.rng));
            }
        }
        let fresh = self.blocks.take_fresh();
        if !fresh.is_empty() {
            self.runner.blocks_allocated(&fresh);
        }
        let result = if copies.is_empty() { Ok(()) } else { self.runner.copy_blocks(&copies) };
        self.blocks.copies_issued();
        let result = result.and_then(|()| {
            if specs.iter().any(Option::is_some) {
                self.runner.step_sampled(&batch, &specs)
            } else {
                Ok(self.runner.step(&batch)?.into_iter().map(RowOutput::Logits).collect())
            }
        });
        self.stats.steps += 1;
        let n_sample = batch.iter().filter(|c| c.sample).count();
        let well_formed = |rows: &[RowOutput]| {
            rows.len() == n_sample
                && rows.iter().enumerate().all(|(i, r)| match r {
                    RowOutput::Logits(l) => !l.is_empty(),
                    RowOutput::Token(_) => specs.get(i).is_some_and(Option::is_some),
                })
        };
        let rows = match result {
            Ok(rows) if well_formed(&rows) => rows,
            Ok(rows) => {
                let msg = format!("{} rows for {n_sample} sampled chunks (or an empty logits row, or a token for a row not drawn on the device)", rows.len());
                self.fail_batch(&batch, &msg);
                return Err(EngineError::RunnerOutput(msg));
            }
            Err(e) => {
                self.fail_batch(&batch, &e.to_string());
                return Err(EngineError::Runner(Box::new(e)));
            }
        };

        // The chunks' KV is in the cache now; register newly full blocks for prefix caching.
        let bs = self.blocks.block_size();
        for c in &batch {
            let s = self.seqs.get_mut(&c.seq_id).expect("sequence");
            let n = c.tokens.len() as u64;
            let decode = c.tokens.len() == 1 && c.sample && s.tokens.len() > s.prompt_len;
            self.stats.tokens_processed += n;
            if !decode {
                self.stats.prompt_tokens_processed += n;
            }
            s.num_computed += c.tokens.len();
            if self.blocks.prefix_caching() {
                while (s.hashes.len() + 1) * bs <= s.num_computed {
                    let i = s.hashes.len();
                    let h = self.blocks.register(s.table[i], s.hashes.last().copied(), &s.tokens[i * bs..(i + 1) * bs]);
                    s.hashes.push(h);
                }
            }
        }

        // Sample the logits rows on the host; device tokens are taken as they are.
        let sampled_ids: Vec<SeqId> = batch.iter().filter(|c| c.sample).map(|c| c.seq_id).collect();
        let host_ids: Vec<SeqId> =
            sampled_ids.iter().zip(&rows).filter(|(_, r)| matches!(r, RowOutput::Logits(_))).map(|(&id, _)| id).collect();
        let host_sampled = if host_ids.is_empty() {
            Vec::new()
        } else {
            let mut by_id: HashMap<SeqId, &mut Sequence> =
                self.seqs.iter_mut().filter(|(id, _)| host_ids.contains(id)).map(|(&id, s)| (id, s)).collect();
            let mut inputs: Vec<SampleInput<'_>> = Vec::with_capacity(host_ids.len());
            // Borrow each sequence once, in batch order.
            let mut ordered: Vec<&mut Sequence> = host_ids.iter().map(|id| by_id.remove(id).expect("sequence")).collect();
            let logits = rows.iter().filter_map(|r| match r {
                RowOutput::Logits(l) => Some(l),
                RowOutput::Token(_) => None,
            });
            for (s, row) in ordered.iter_mut().zip(logits) {
                let s: &mut Sequence = s;
                inputs.push(SampleInput { logits: row, params: &s.params, history: &s.tokens, rng: &mut s.rng });
            }
            self.sampler.sample(&mut inputs)
        };
        if host_sampled.len() != host_ids.len() {
            let msg = format!("the sampler returned {} tokens for {} rows", host_sampled.len(), host_ids.len());
            self.fail_batch(&batch, &msg);
            return Err(EngineError::RunnerOutput(msg));
        }
        let mut host_sampled = host_sampled.into_iter();
        let sampled: Vec<Sampled> = rows
            .iter()
            .map(|r| match r {
                RowOutput::Token(t) => Sampled { token: *t, logprob: None, top_logprobs: Vec::new() },
                RowOutput::Logits(_) => host_sampled.next().expect("one host token per logits row"),
            })
            .collect();
        for (id, s) in sampled_ids.into_iter().zip(sampled) {
            self.stats.generated_tokens += 1;
            self.accept(id, s);
        }
        Ok(self.has_work())
    }

    fn fail_batch(&mut self, batch: &[SeqChunk], msg: &str) {
        for c in batch {
            self.finish(c.seq_id, FinishReason::Error(msg.to_string()));
        }
    }

    /// Appends a sampled token and applies the stop rules: stop ids, stop strings (the match
    /// and the tokens it starts in are not sent), max_tokens and max_model_len.
    fn accept(&mut self, id: SeqId, sampled: Sampled) {
        let max_model_len = self.config.max_model_len;
        let seq = self.seqs.get_mut(&id).expect("sequence");
        let token = sampled.token;
        seq.tokens.push(token);
        if seq.params.stop_token_ids.contains(&token) {
            flush(seq, seq.pending.len());
            return self.finish(id, FinishReason::Stop);
        }
        seq.pending.push(sampled);
        if seq.params.stop_strings.is_empty() {
            flush(seq, seq.pending.len());
        } else {
            let decoder = self.decoder.as_ref().expect("checked at add_request");
            let (send, stop) = stop_string_scan(seq, decoder);
            flush(seq, send.len());
            if stop {
                return self.finish(id, FinishReason::Stop);
            }
        }
        if seq.tokens.len() - seq.prompt_len >= seq.params.max_tokens || seq.tokens.len() >= max_model_len {
            self.finish(id, FinishReason::Length);
        }
    }
}

fn token_event(params: &SamplingParams, s: Sampled) -> Event {
    let logprob = params.logprobs.and(s.logprob);
    Event::Token { id: s.token, logprob, top_logprobs: s.top_logprobs }
}

/// Sends the first `n` pending tokens. A send to a dropped receiver is ignored here; the
/// next step cancels the sequence.
fn flush(seq: &mut Sequence, n: usize) {
    for s in seq.pending.drain(..n) {
        let _ = seq.tx.send(token_event(&seq.params, s));
        seq.emitted += 1;
    }
}

/// Which pending tokens can be sent (their text end offsets) and whether a stop string
/// matched. A token is sent when its text ends before the earliest full match, or, with no
/// match, before the earliest tail of the text that could still grow into a stop string and
/// before any incomplete character at the end (a byte-level tokenizer decodes a partial UTF-8
/// sequence as U+FFFD until its last byte arrives).
fn stop_string_scan(seq: &Sequence, decoder: &Decoder) -> (Vec<usize>, bool) {
    // Decode a window: the unsent tokens and a few sent ones before them as context (for a
    // character or a leading space spanning tokens), so the cost per token stays constant.
    const CONTEXT: usize = 4;
    let completion = seq.completion();
    let base = seq.emitted.saturating_sub(CONTEXT);
    let full = decoder(&completion[base..]);
    let stable = full.trim_end_matches('\u{FFFD}').len();
    // Where the unsent text starts.
    let from = common_prefix_len(&decoder(&completion[base..seq.emitted]), &full);
    let stops = &seq.params.stop_strings;
    let matched = stops.iter().filter_map(|s| full[from..].find(s.as_str()).map(|i| from + i)).min();
    let limit = matched.unwrap_or_else(|| {
        // The earliest start of a suffix of `full` that is a proper prefix of a stop string.
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let lo = full.len().saturating_sub(longest.saturating_sub(1)).max(from);
        let partial = (lo..full.len())
            .filter(|&j| full.is_char_boundary(j))
            .find(|&j| stops.iter().any(|s| s.len() > full.len() - j && s.starts_with(&full[j..])))
            .unwrap_or(full.len());
        partial.min(stable)
    });
    let mut send = Vec::new();
    for k in 0..seq.pending.len() {
        let text = decoder(&completion[base..seq.emitted + k + 1]);
        let common = common_prefix_len(&text, &full);
        // A token whose text is not a prefix of the full text ends inside the character
        // where they differ (a partial UTF-8 sequence): it covers that whole character.
        let end = if common == text.len() {
            common
        } else {
            full[common..].chars().next().map_or(text.len(), |c| common + c.len_utf8())
        };
        if end > limit {
            break;
        }
        send.push(end);
    }
    (send, matched.is_some())
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}
