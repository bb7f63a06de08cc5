//! [`LlamaRunner`]: the model side of `llm_engine::Engine`. It owns the weights and the paged
//! KV cache, turns a batch of [`SeqChunk`]s into one packed forward, and copies blocks.
//!
//! # Decode steps as graphs
//! A step whose every chunk is one token (pure decode) on the paged kernels takes a fast
//! path: its inputs (token ids, positions, cache slots, block tables, context lengths) go
//! into persistent device buffers of the step's *bucket* (the batch size rounded up to a
//! power of two, at most [`LlamaRunner::set_graph_max_batch`]) with a few host-to-device
//! copies and no allocation, and the forward over those buffers is captured into a graph
//! once per bucket and replayed. A batch smaller than its bucket is padded with rows that
//! write nothing (slot -1) and attend one position of the reserved *scratch block* (the
//! cache's last block, outside `0..num_blocks`, so the engine never hands it out); their
//! logits are dropped. The block tables have a fixed capacity per bucket: a step that needs
//! more blocks rebuilds the bucket with twice the capacity (a new capture), so a bucket is
//! captured a handful of times over a run, not once per context length. Where the device
//! has no graphs (the CPU executor) the same buffers run eagerly ([`DecodeGraphs::Eager`]),
//! so the buffer logic is tested there.
//!
//! # Mixed steps as graphs
//! A step of decodes plus at most [`MIXED_CHUNKS`] prompt chunks of at most
//! [`LlamaRunner::set_mixed_max_rows`] tokens together (chunked prefill beside running
//! sequences, what a server does at every arrival) takes the same road through a *mixed
//! bucket*: the decode rows as above, then the chunks' rows padded to a power of two
//! ([`MIN_CHUNK_ROWS`] at least). The paged prefill kernel reads the chunks through an index
//! of a fixed shape: [`MIXED_CHUNKS`] chunk slots (unused ones empty) and one padding
//! chunk whose rows write nothing and attend scratch-block positions; the rows whose logits
//! are wanted (every decode row, each chunk's last row) are a device buffer too. So one
//! graph per (decode bucket, chunk rows) serves every such step, and a step that admits a
//! prompt costs a replay instead of an eager forward of a few hundred launches. Steps of
//! prefill only, and larger or more chunks, take the packed path.
use crate::error::{Error, Result};
use crate::model::{chunk_mask, AttnBatch, AttnChunk, DecodeGroup, KvIndex, LayerCache, Model, PagedDecode, VarlenChunks};
use candle_core::Tensor;
use candle_rocm::paged::{CacheIndex, DecodeIndex};
pub use llm_engine::{DeviceSample, ModelRunner, RowOutput, SeqChunk};

/// How [`LlamaRunner`] runs pure-decode steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeGraphs {
    /// The packed path of every other step (inputs uploaded per step).
    Off,
    /// The persistent per-bucket buffers, run eagerly every step (what a graph replays).
    Eager,
    /// The persistent buffers with the forward captured once per bucket and replayed where
    /// the device has graphs; eager elsewhere (the CPU executor).
    Captured,
}

/// A llama-family model with its paged KV cache.
pub struct LlamaRunner {
    model: Model,
    cache: Vec<LayerCache>,
    block_size: usize,
    num_blocks: usize,
    graphs: DecodeGraphs,
    /// Largest bucket of the decode fast path (0: no fast path).
    graph_max_batch: usize,
    /// Most prompt tokens of a mixed step on the fast path (0: none).
    mixed_max_rows: usize,
    /// Per-bucket state of the decode fast path, by bucket size.
    buckets: Vec<Bucket>,
    /// The device inputs of the last step's device draws (parameters, keys) and the specs
    /// they hold: greedy steps reuse them with no upload.
    draws: Option<Draws>,
}

/// The uploaded inputs of [`candle_rocm::llm_ops::sample`] for some rows' specs.
struct Draws {
    specs: Vec<Option<DeviceSample>>,
    params: Tensor,
    keys: Tensor,
}

/// Blocks a bucket's block-table rows hold at least (its first capacity).
const MIN_TABLE_BLOCKS: usize = 16;

/// The largest decode bucket of a new runner ([`LlamaRunner::set_graph_max_batch`]).
pub const DEFAULT_GRAPH_MAX_BATCH: usize = 128;

/// Prompt chunks a mixed bucket holds at most (its prefill index's chunk slots).
pub const MIXED_CHUNKS: usize = 4;

/// Fewest prompt rows of a mixed bucket; its row counts are powers of two from here.
pub const MIN_CHUNK_ROWS: usize = 16;

/// Prompt tokens a mixed step takes at most by default ([`LlamaRunner::set_mixed_max_rows`]).
pub const DEFAULT_MIXED_MAX_ROWS: usize = 256;

/// The persistent inputs of steps of up to `size` decodes (and, in a mixed bucket, prompt
/// chunks of `chunk_rows` rows) and, once captured, the graph of their forward with its
/// logits (the graph's output buffer): `[size, vocab]` f32 for a decode bucket, `[size +
/// MIXED_CHUNKS, vocab]` for a mixed one (each chunk slot's last row after the decodes).
struct Bucket {
    size: usize,
    /// Prompt rows after the decode rows (0: a decode bucket).
    chunk_rows: usize,
    tokens: Tensor,
    kv: KvIndex,
    attn: AttnBatch,
    /// Mixed buckets: the rows whose logits the forward computes, `[size + MIXED_CHUNKS]` u32.
    sample_rows: Option<Tensor>,
    graph: Option<(kernel_runtime::Graph, Tensor)>,
    /// The capture failed once: this bucket runs eagerly.
    eager_only: bool,
    /// Host staging of the inputs, reused step after step.
    host: HostInputs,
}

#[derive(Default)]
struct HostInputs {
    tokens: Vec<u32>,
    slots: Vec<i64>,
    positions: Vec<u32>,
    tables: Vec<u32>,
    lens: Vec<u32>,
    /// Mixed buckets: the prefill index (chunk offsets, contexts, block tables) and the
    /// rows that sample.
    cu_q: Vec<u32>,
    chunk_lens: Vec<u32>,
    chunk_tables: Vec<u32>,
    sample_rows: Vec<u32>,
}

impl Bucket {
    fn max_blocks(&self) -> usize {
        self.attn.paged.as_ref().map_or(0, |p| p.index.max_blocks())
    }

    /// Stages a checked batch that fits this bucket (its decodes, then its chunks) in the
    /// host buffers, with the padding rows and chunks (see the module docs); `scratch` is
    /// the scratch block's id, `bs` the block size.
    fn fill(&mut self, batch: &[SeqChunk], bs: usize, scratch: u32) {
        let (size, chunk_rows, max_blocks) = (self.size, self.chunk_rows, self.max_blocks());
        let h = &mut self.host;
        h.tokens.clear();
        h.slots.clear();
        h.positions.clear();
        h.lens.clear();
        h.tables.clear();
        h.tables.resize(size * max_blocks, scratch);
        let slot = |c: &SeqChunk, p: usize| i64::from(c.block_table[p / bs]) * bs as i64 + (p % bs) as i64;
        for c in batch.iter().filter(|c| c.tokens.len() == 1) {
            let p = c.start_pos;
            let i = h.lens.len();
            h.tokens.push(c.tokens[0]);
            h.positions.push(p as u32);
            h.slots.push(slot(c, p));
            h.lens.push(p as u32 + 1);
            let used = (p + 1).div_ceil(bs);
            h.tables[i * max_blocks..][..used].copy_from_slice(&c.block_table[..used]);
        }
        // Padding rows: token 0 at position 0, written nowhere, attending the one (never
        // written, zeroed) position of the scratch block.
        for _ in h.lens.len()..size {
            h.tokens.push(0);
            h.positions.push(0);
            h.slots.push(-1);
            h.lens.push(1);
        }
        if chunk_rows == 0 {
            return;
        }
        // The chunks' rows after the decode rows; empty chunk slots; then the padding
        // chunk: rows written nowhere, causal over as many scratch-block positions.
        h.cu_q.clear();
        h.chunk_lens.clear();
        h.chunk_tables.clear();
        h.chunk_tables.resize((MIXED_CHUNKS + 1) * max_blocks, scratch);
        h.sample_rows.clear();
        h.sample_rows.extend(0..size as u32);
        h.cu_q.push(0);
        let mut rows = 0;
        for (j, c) in batch.iter().filter(|c| c.tokens.len() > 1).enumerate() {
            let end = c.start_pos + c.tokens.len();
            for (p, &t) in (c.start_pos..end).zip(&c.tokens) {
                h.tokens.push(t);
                h.positions.push(p as u32);
                h.slots.push(slot(c, p));
            }
            rows += c.tokens.len();
            h.cu_q.push(rows as u32);
            h.chunk_lens.push(end as u32);
            let used = end.div_ceil(bs);
            h.chunk_tables[j * max_blocks..][..used].copy_from_slice(&c.block_table[..used]);
            h.sample_rows.push((size + rows - 1) as u32);
        }
        for _ in h.chunk_lens.len()..MIXED_CHUNKS {
            h.cu_q.push(rows as u32);
            h.chunk_lens.push(0);
            h.sample_rows.push(0);
        }
        for _ in rows..chunk_rows {
            h.tokens.push(0);
            h.positions.push(0);
            h.slots.push(-1);
        }
        h.cu_q.push(chunk_rows as u32);
        h.chunk_lens.push((chunk_rows - rows) as u32);
    }

    /// Copies the staged host buffers into the persistent device inputs. Each write is
    /// checked before it copies (a repeated slot is an error); an error leaves the cache
    /// untouched, and the next step rewrites every buffer.
    fn upload(&mut self) -> Result<()> {
        let h = &self.host;
        if let KvIndex::Fused(ix) = &mut self.kv {
            ix.write(&h.slots, &h.positions)?;
        }
        candle_rocm::paged::write_into(&self.tokens, &h.tokens)?;
        if let Some(p) = &mut self.attn.paged {
            p.index.write(&h.tables, &h.lens)?;
        }
        if let Some(ix) = self.attn.varlen.as_mut().and_then(|v| v.paged.as_mut()) {
            ix.write(&h.cu_q, &h.chunk_lens, &h.chunk_tables)?;
        }
        if let Some(rows) = &self.sample_rows {
            candle_rocm::paged::write_into(rows, &h.sample_rows)?;
        }
        Ok(())
    }
}

impl LlamaRunner {
    /// A runner over `model` with a zeroed cache of `num_blocks` blocks of `block_size` tokens
    /// (plus one scratch block for the padding rows of decode graphs, never in a block
    /// table the engine makes). Decode steps of up to [`DEFAULT_GRAPH_MAX_BATCH`] sequences,
    /// and those beside prompt chunks of up to [`DEFAULT_MIXED_MAX_ROWS`] tokens, run as
    /// graphs where the device has them ([`DecodeGraphs::Captured`]).
    pub fn new(model: Model, num_blocks: usize, block_size: usize) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(Error::Invalid(format!("a cache of {num_blocks} blocks of {block_size} tokens")));
        }
        if num_blocks >= u32::MAX as usize {
            return Err(Error::Invalid(format!("a cache of {num_blocks} blocks: block ids are u32")));
        }
        let cache = model.new_cache(num_blocks + 1, block_size)?;
        Ok(LlamaRunner { model, cache, block_size, num_blocks, graphs: DecodeGraphs::Captured, graph_max_batch: DEFAULT_GRAPH_MAX_BATCH, mixed_max_rows: mixed_max_rows_default(), buckets: vec![], draws: None })
    }

    /// How pure-decode steps run (see [`DecodeGraphs`]); a change drops the buckets' buffers
    /// and graphs.
    pub fn set_decode_graphs(&mut self, mode: DecodeGraphs) {
        if mode != self.graphs {
            self.buckets.clear();
        }
        self.graphs = mode;
    }

    /// The largest decode batch the fast path takes (buckets 1, 2, 4, ... up to it; 0
    /// turns the fast path off); larger batches take the packed path. Drops the buckets.
    pub fn set_graph_max_batch(&mut self, n: usize) {
        self.graph_max_batch = n;
        self.buckets.clear();
    }

    /// The most prompt tokens a step that also decodes may hold and still take the fast
    /// path as a mixed bucket (see the module docs; rounded down to a power of two, 0 turns
    /// mixed buckets off). Drops the buckets.
    pub fn set_mixed_max_rows(&mut self, n: usize) {
        self.mixed_max_rows = if n < MIN_CHUNK_ROWS { 0 } else { 1 << n.ilog2() };
        self.buckets.clear();
    }

    /// The largest decode bucket ([`LlamaRunner::set_graph_max_batch`]).
    pub fn graph_max_batch(&self) -> usize {
        self.graph_max_batch
    }

    /// The prompt row counts of the mixed buckets this runner may build: powers of two
    /// from [`MIN_CHUNK_ROWS`] to [`LlamaRunner::set_mixed_max_rows`]'s.
    pub fn mixed_row_buckets(&self) -> Vec<usize> {
        mixed_row_buckets(self.mixed_max_rows)
    }

    /// The id of the scratch block (`num_blocks`): padding rows of decode graphs read it.
    pub fn scratch_block(&self) -> u32 {
        self.num_blocks as u32
    }

    /// The `(bucket size, block-table capacity, captured)` of each decode bucket built so far.
    pub fn decode_buckets(&self) -> Vec<(usize, usize, bool)> {
        self.buckets.iter().filter(|b| b.chunk_rows == 0).map(|b| (b.size, b.max_blocks(), b.graph.is_some())).collect()
    }

    /// The `(decode rows, prompt rows, block-table capacity, captured)` of each mixed bucket
    /// built so far.
    pub fn mixed_buckets(&self) -> Vec<(usize, usize, usize, bool)> {
        self.buckets.iter().filter(|b| b.chunk_rows > 0).map(|b| (b.size, b.chunk_rows, b.max_blocks(), b.graph.is_some())).collect()
    }

    /// The K (`keys == true`) or V cache of `layer`, `[num_blocks + 1, block_size, kv_heads,
    /// head_dim]` (the last block is the scratch block): for tests that check what a step wrote.
    pub fn cache_tensor(&self, layer: usize, keys: bool) -> Option<&Tensor> {
        self.cache.get(layer).map(|c| if keys { &c.k } else { &c.v })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Bytes of K/V one cache block holds over every layer.
    pub fn block_bytes(&self) -> usize {
        let c = &self.model.cfg;
        2 * c.num_layers * self.block_size * c.num_kv_heads * c.head_dim * self.model.dtype.size_in_bytes()
    }

    /// Runs one packed step (see [`ModelRunner::step`]); bad chunks are [`Error::Invalid`]
    /// and change nothing.
    pub fn run(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        self.run_with(batch, |l| Ok(match l {
            Some(l) => l.to_vec2::<f32>()?,
            None => vec![],
        }))
    }

    /// Runs one step for what it leaves behind (the keys and values in the cache; on a
    /// tensor-parallel rank its part of the collectives): the logits stay on the device,
    /// nothing comes back. Tensor-parallel ranks other than 0 step this way (rank 0 returns
    /// the step's outputs); a download of every sampled row's logits there would cost a
    /// `[rows, vocab]` f32 copy per step on the critical path of every rank.
    pub fn run_discarding(&mut self, batch: &[SeqChunk]) -> Result<()> {
        self.run_with(batch, |_| Ok(()))
    }

    /// Runs one step and draws the tokens of the rows with a spec on the device (see
    /// [`ModelRunner::step_sampled`]): `candle_rocm::llm_ops::sample` on the step's logits, so
    /// only token ids (and the logits rows of the rows without a spec) come back. Bad chunks
    /// or specs (a count other than the sampled chunks', a parameter out of range) are
    /// [`Error::Invalid`] and change nothing.
    pub fn run_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<Vec<RowOutput>> {
        self.check_draws(batch, sampling)?;
        if sampling.iter().all(Option::is_none) {
            return Ok(self.run(batch)?.into_iter().map(RowOutput::Logits).collect());
        }
        if sampling.iter().all(|s| s.is_some_and(|s| s.temperature == 0.0)) {
            // Greedy only: no draw inputs, the argmax by chunked reductions.
            return self.run_with(batch, |l| match l {
                Some(l) => Ok(greedy_rows(&l)?.into_iter().map(RowOutput::Token).collect()),
                None => Ok(vec![]),
            });
        }
        // Checked and uploaded before the step (reused while the specs repeat: greedy).
        let draws = match self.draws.take() {
            Some(d) if d.specs == sampling => d,
            _ => self.upload_draws(sampling)?,
        };
        let vocab = self.model.cfg.vocab_size;
        let out = self.run_with(batch, |l| match l {
            Some(l) => draw_rows(&l, &draws, vocab),
            None => Ok(vec![]),
        });
        self.draws = Some(draws);
        out
    }

    /// Checks the specs of [`LlamaRunner::run_sampled`] against `batch` (one per sampled
    /// chunk, every parameter in range) without running anything: tensor-parallel ranks
    /// check before any of them starts the step.
    pub fn check_draws(&self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<()> {
        let n = batch.iter().filter(|c| c.sample).count();
        if sampling.len() != n {
            return Err(Error::Invalid(format!("{} sampling specs for {n} sampled chunks", sampling.len())));
        }
        for (i, s) in sampling.iter().enumerate() {
            if let Some(s) = s {
                let p = candle_rocm::llm_ops::SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, min_p: s.min_p, repetition_penalty: 1.0 };
                if s.temperature.is_nan() || s.temperature < 0.0 {
                    return Err(Error::Invalid(format!("sampling spec {i}: temperature {} is not >= 0", s.temperature)));
                }
                p.check().map_err(|e| Error::Invalid(format!("sampling spec {i}: {e}")))?;
            }
        }
        Ok(())
    }

    /// Checks `sampling` and uploads it as [`candle_rocm::llm_ops::sample`] reads it (rows
    /// without a spec: greedy, their tokens unused).
    fn upload_draws(&self, sampling: &[Option<DeviceSample>]) -> Result<Draws> {
        let dev = &self.model.device;
        let mut params = Vec::with_capacity(sampling.len());
        let (mut seeds, mut steps) = (Vec::with_capacity(sampling.len()), Vec::with_capacity(sampling.len()));
        for s in sampling {
            let s = s.unwrap_or(DeviceSample { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, key: [0, 0] });
            params.push(candle_rocm::llm_ops::SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, min_p: s.min_p, repetition_penalty: 1.0 });
            seeds.push(s.key[0]);
            steps.push(s.key[1]);
        }
        Ok(Draws {
            specs: sampling.to_vec(),
            params: candle_rocm::llm_ops::sampling_params(&params, dev)?,
            keys: candle_rocm::llm_ops::sampling_keys(&seeds, &steps, dev)?,
        })
    }

    /// Runs one checked step and hands its logits (`[sampled rows, vocab]` f32 on the
    /// device, `None` when no chunk samples) to `finish` before anything else runs (a decode
    /// graph's output buffer is rewritten by the next replay).
    fn run_with<T>(&mut self, batch: &[SeqChunk], finish: impl FnOnce(Option<Tensor>) -> Result<T>) -> Result<T> {
        if batch.is_empty() {
            return finish(None);
        }
        for c in batch {
            self.check(c)?;
        }
        let finish = match self.graph_step(batch, finish)? {
            Ok(out) => return Ok(out),
            Err(finish) => finish,
        };
        let bs = self.block_size;
        let dev = self.model.device.clone();
        let window = self.model.window();
        let (mut tokens, mut positions, mut slots, mut rows) = (vec![], vec![], vec![], vec![]);
        let kernels = self.model.kernel_attention();
        let mut chunks = Vec::with_capacity(batch.len());
        // Multi-token chunks: packed offset, length, start position, context slots, block
        // table.
        let mut multi: Vec<MultiChunk<'_>> = vec![];
        // One-token chunks (decodes): packed row, context slots, block table.
        let mut decodes: Vec<(usize, Vec<u32>, &[u32])> = vec![];
        for c in batch {
            let (start, len) = (c.start_pos, c.tokens.len());
            let end = start + len;
            let slot = |p: usize| c.block_table[p / bs] * bs as u32 + (p % bs) as u32;
            let offset = tokens.len();
            tokens.extend_from_slice(&c.tokens);
            positions.extend((start..end).map(|p| p as u32));
            slots.extend((start..end).map(slot));
            let ctx: Vec<u32> = (0..end).map(slot).collect();
            if len == 1 {
                decodes.push((offset, ctx, &c.block_table));
            } else {
                multi.push((offset, len, start, ctx, &c.block_table));
            }
            if c.sample {
                rows.push((offset + len - 1) as u32);
            }
        }
        // Rows in the order paged_attention produces them: decodes, then the chunks.
        let produced: Vec<usize> = decodes.iter().map(|d| d.0).chain(multi.iter().flat_map(|c| c.0..c.0 + c.1)).collect();
        let order = if produced.iter().enumerate().all(|(i, &r)| i == r) {
            None
        } else {
            let mut inv = vec![0u32; produced.len()];
            for (i, &r) in produced.iter().enumerate() {
                inv[r] = i as u32;
            }
            Some(Tensor::new(inv.as_slice(), &dev)?)
        };
        let mut varlen = None;
        if kernels && !multi.is_empty() {
            // Every chunk's keys are its sequence's cached prefix plus its own (written by
            // rope_append_kv before attention), all in one call: over the step's own keys
            // when every chunk is fresh and they fill the step (`VarlenChunks::own_keys`),
            // else read through the block tables by the paged prefill kernel, else (head
            // sizes it lacks) gathered out of the cache.
            let (mut rows_q, mut ctx_slots, mut cu_q, mut cu_k) = (vec![], vec![], vec![0u32], vec![0u32]);
            let (mut max_q, mut max_k) = (0, 0);
            for (offset, len, _, ctx, _) in &multi {
                rows_q.extend((*offset..offset + len).map(|r| r as u32));
                ctx_slots.extend_from_slice(ctx);
                cu_q.push(rows_q.len() as u32);
                cu_k.push(ctx_slots.len() as u32);
                (max_q, max_k) = (max_q.max(*len), max_k.max(ctx.len()));
            }
            let mut v = VarlenChunks { rows: gather_rows(&rows_q, tokens.len(), &dev)?, ctx_slots: None, paged: None, cu_q, cu_k, max_q, max_k };
            if !v.own_keys() {
                if self.model.paged_prefill() && bs.is_power_of_two() {
                    // One row of `max_blocks` entries per chunk: the blocks its context uses.
                    let max_blocks = max_k.div_ceil(bs).max(1);
                    let mut tables = vec![0u32; multi.len() * max_blocks];
                    for (i, (.., ctx, table)) in multi.iter().enumerate() {
                        let n = ctx.len().div_ceil(bs);
                        tables[i * max_blocks..][..n].copy_from_slice(&table[..n]);
                    }
                    let lens: Vec<u32> = multi.iter().map(|c| c.3.len() as u32).collect();
                    // The cache's blocks: the engine's and the scratch block.
                    v.paged = Some(candle_rocm::paged_prefill::PrefillIndex::new(&dev, &v.cu_q, &lens, &tables, self.num_blocks + 1, bs)?);
                } else {
                    v.ctx_slots = Some(Tensor::new(ctx_slots.as_slice(), &dev)?);
                }
            }
            varlen = Some(v);
        } else {
            for (offset, len, start, ctx, _) in multi {
                let end = ctx.len();
                chunks.push(AttnChunk { offset, len, ctx_slots: Tensor::new(ctx.as_slice(), &dev)?, mask: Tensor::from_vec(chunk_mask(start, len, window), (len, end), &dev)? });
            }
        }
        // The paged kernel has no sliding window: a window shorter than a context keeps
        // the decodes on the plain path.
        let paged_ok = kernels && window.is_none_or(|w| decodes.iter().all(|d| d.1.len() <= w));
        let (mut decode, mut paged) = (None, None);
        if decodes.is_empty() {
            // Nothing to attend one token at a time.
        } else if paged_ok {
            let b = decodes.len();
            let max_blocks = decodes.iter().map(|d| d.1.len().div_ceil(bs)).max().unwrap_or(1);
            let mut tables = vec![0u32; b * max_blocks];
            for (i, d) in decodes.iter().enumerate() {
                let n = d.1.len().div_ceil(bs);
                tables[i * max_blocks..][..n].copy_from_slice(&d.2[..n]);
            }
            let lens: Vec<u32> = decodes.iter().map(|d| d.1.len() as u32).collect();
            let r: Vec<u32> = decodes.iter().map(|d| d.0 as u32).collect();
            paged = Some(PagedDecode { rows: gather_rows(&r, tokens.len(), &dev)?, // The cache's blocks: the engine's and the scratch block.
            index: candle_rocm::paged::DecodeIndex::new(&dev, &tables, &lens, self.num_blocks + 1, bs)? });
        } else {
            let ctx = decodes.iter().map(|d| d.1.len()).max().unwrap_or(1);
            let (mut pad_slots, mut mask) = (Vec::with_capacity(decodes.len() * ctx), Vec::with_capacity(decodes.len() * ctx));
            for (_, s, _) in &decodes {
                let p = s.len() - 1;
                for k in 0..ctx {
                    let visible = k < s.len() && window.is_none_or(|w| p - k < w);
                    pad_slots.push(if k < s.len() { s[k] } else { s[0] });
                    mask.push(if visible { 0f32 } else { f32::NEG_INFINITY });
                }
            }
            let b = decodes.len();
            let r: Vec<u32> = decodes.iter().map(|d| d.0 as u32).collect();
            decode = Some(DecodeGroup { rows: Tensor::new(r.as_slice(), &dev)?, slots: Tensor::new(pad_slots.as_slice(), &dev)?, mask: Tensor::from_vec(mask, (b, 1, 1, ctx), &dev)?, ctx });
        }
        let attn = AttnBatch { decode, paged, chunks, varlen, window, order };
        let logits = self.model.forward(&tokens, &positions, &slots, &attn, &rows, &self.cache)?;
        finish(logits)
    }
}

impl LlamaRunner {
    /// A chunk the cache and the model can run, or [`Error::Invalid`].
    fn check(&self, c: &SeqChunk) -> Result<()> {
        let bs = self.block_size;
        let (maxpos, vocab) = (self.model.max_positions(), self.model.cfg.vocab_size);
        let (start, len) = (c.start_pos, c.tokens.len());
        let end = start + len;
        let id = c.seq_id;
        if len == 0 {
            return Err(Error::Invalid(format!("sequence {id}: a chunk without tokens")));
        }
        if end > maxpos {
            return Err(Error::Invalid(format!("sequence {id}: position {} past the model's {maxpos}", end - 1)));
        }
        if c.block_table.len() * bs < end {
            return Err(Error::Invalid(format!("sequence {id}: {} blocks of {bs} cannot hold {end} positions", c.block_table.len())));
        }
        if let Some(b) = c.block_table.iter().find(|&&b| b as usize >= self.num_blocks) {
            return Err(Error::Invalid(format!("sequence {id}: block {b} of a cache of {}", self.num_blocks)));
        }
        if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Invalid(format!("sequence {id}: token {t} past the vocabulary of {vocab}")));
        }
        Ok(())
    }

    /// The bucket of a pure-decode batch of `n` sequences: `n` rounded up to a power of
    /// two, at most `graph_max_batch`.
    fn bucket_size(&self, n: usize) -> usize {
        n.next_power_of_two().min(self.graph_max_batch)
    }

    /// The fast path (see the module docs) for a checked batch of decodes, or of decodes
    /// and a few short prompt chunks (a mixed bucket). Returns `finish`'s result, or
    /// `finish` back when the batch is not for it (no decode; chunks too many, too long or
    /// without the paged prefill kernel; no paged kernels; a decode's context past the
    /// sliding window; more decodes than the largest bucket; graphs off).
    #[allow(clippy::type_complexity)]
    fn graph_step<T, F: FnOnce(Option<Tensor>) -> Result<T>>(&mut self, batch: &[SeqChunk], finish: F) -> Result<std::result::Result<T, F>> {
        let bs = self.block_size;
        let window = self.model.window();
        let fits = |c: &SeqChunk| c.tokens.len() > 1 || window.is_none_or(|w| c.start_pos < w);
        let decodes = batch.iter().filter(|c| c.tokens.len() == 1).count();
        let (chunks, chunk_tokens) = batch.iter().filter(|c| c.tokens.len() > 1).fold((0, 0), |(n, t), c| (n + 1, t + c.tokens.len()));
        let mixed_ok = chunks == 0 || (chunks <= MIXED_CHUNKS && chunk_tokens <= self.mixed_max_rows && self.model.paged_prefill() && bs.is_power_of_two());
        // Tensor-parallel ranks take it too: their all-reduces and all-gather are queued on
        // the rank's stream, so the capture records them (see crate::tp).
        if self.graphs == DecodeGraphs::Off || decodes == 0 || decodes > self.graph_max_batch || !mixed_ok || !self.model.kernel_attention() || !batch.iter().all(fits) {
            return Ok(Err(finish));
        }
        // Two chunks writing one slot (a block shared without its copy) are refused by
        // CacheIndex::write, as the packed path's CacheIndex::new refuses them.
        let size = self.bucket_size(decodes);
        let chunk_rows = if chunks == 0 { 0 } else { chunk_tokens.next_power_of_two().max(MIN_CHUNK_ROWS) };
        // Blocks a table row needs: every chunk's context, and the padding chunk's rows.
        let need = batch.iter().map(|c| (c.start_pos + c.tokens.len()).div_ceil(bs)).max().unwrap_or(1).max(chunk_rows.div_ceil(bs));
        // The most blocks one sequence can hold: the rope tables' positions, and the cache.
        let most = self.model.max_positions().div_ceil(bs).min(self.num_blocks).max(1);
        let at = match self.buckets.iter().position(|b| b.size == size && b.chunk_rows == chunk_rows) {
            Some(i) if self.buckets[i].max_blocks() >= need => i,
            found => {
                // New, or its block tables too short: (re)built with room to grow.
                let cap = need.next_power_of_two().max(MIN_TABLE_BLOCKS).min(most).max(need);
                let bucket = self.new_bucket(size, chunk_rows, cap)?;
                match found {
                    Some(i) => {
                        self.buckets[i] = bucket;
                        i
                    }
                    None => {
                        self.buckets.push(bucket);
                        self.buckets.len() - 1
                    }
                }
            }
        };
        let scratch = self.num_blocks as u32;
        let bucket = &mut self.buckets[at];
        bucket.fill(batch, bs, scratch);
        bucket.upload()?;
        // The output rows of the sampled chunks, in the batch's order: a decode's is its
        // place among the decodes, a chunk's its slot after the decode rows.
        let (mut picks, mut d, mut m) = (Vec::with_capacity(batch.len()), 0u32, size as u32);
        for c in batch {
            let row = if c.tokens.len() == 1 { &mut d } else { &mut m };
            if c.sample {
                picks.push(*row);
            }
            *row += 1;
        }
        let dev = self.model.device.clone();
        let pick = |out: &Tensor| -> Result<Option<Tensor>> {
            Ok(match picks.len() {
                0 => None,
                k if picks.iter().enumerate().all(|(i, &r)| r as usize == i) => Some(out.narrow(0, 0, k)?),
                _ => Some(out.index_select(&Tensor::new(picks.as_slice(), &dev)?, 0)?),
            })
        };
        let result = match &bucket.graph {
            Some((graph, out)) => {
                graph.replay().map_err(|e| candle_rocm::error::launch("decode graph replay", e))?;
                finish(pick(out)?)?
            }
            None => {
                let out = self.model.forward_on(&bucket.tokens, &bucket.kv, &bucket.attn, bucket.sample_rows.as_ref(), &self.cache)?;
                let result = finish(pick(&out)?)?;
                drop(out);
                // Captured after one eager run (kernels loaded, layouts uploaded); the
                // capture runs nothing, the next step replays it.
                let rocm = candle_rocm::RocmDevice::from_candle(&self.model.device);
                if let Some(dev) = rocm.filter(|d| self.graphs == DecodeGraphs::Captured && d.supports_graphs() && !d.is_profiling() && !bucket.eager_only) {
                    let (model, cache) = (&self.model, &self.cache);
                    let (tokens, kv, attn, rows) = (&bucket.tokens, &bucket.kv, &bucket.attn, bucket.sample_rows.as_ref());
                    match dev.capture(|| model.forward_on(tokens, kv, attn, rows, cache)) {
                        Ok(g) => bucket.graph = Some(g),
                        // The step is right without a graph: this bucket stays eager.
                        Err(e) => {
                            tracing::warn!("bucket of {size} decodes and {chunk_rows} prompt rows: capture failed, running it eagerly: {e}");
                            bucket.eager_only = true;
                        }
                    }
                }
                result
            }
        };
        Ok(Ok(result))
    }

    /// The persistent buffers of a bucket of `size` decode rows and `chunk_rows` prompt
    /// rows (0: a decode bucket) with block tables of `max_blocks` entries (every row empty
    /// until written).
    fn new_bucket(&self, size: usize, chunk_rows: usize, max_blocks: usize) -> Result<Bucket> {
        let dev = &self.model.device;
        let blocks = self.num_blocks + 1;
        let rows = size + chunk_rows;
        let kv = KvIndex::Fused(CacheIndex::with_capacity(dev, rows, self.model.max_positions(), blocks, self.block_size)?);
        let index = DecodeIndex::with_capacity(dev, size, max_blocks, blocks, self.block_size)?;
        let range = |a: usize, b: usize| Tensor::new((a as u32..b as u32).collect::<Vec<_>>().as_slice(), dev);
        let (paged, varlen, sample_rows, window) = if chunk_rows == 0 {
            (PagedDecode { rows: None, index }, None, None, None)
        } else {
            let prefill = candle_rocm::paged_prefill::PrefillIndex::with_capacity(dev, MIXED_CHUNKS + 1, chunk_rows, max_blocks, blocks, self.block_size)?;
            // cu_q/cu_k and the maxima serve the gathering paths only; this one is paged.
            let varlen = VarlenChunks { rows: Some(range(size, rows)?), ctx_slots: None, paged: Some(prefill), cu_q: vec![], cu_k: vec![], max_q: chunk_rows, max_k: max_blocks * self.block_size };
            (PagedDecode { rows: Some(range(0, size)?), index }, Some(varlen), Some(Tensor::zeros(size + MIXED_CHUNKS, candle_core::DType::U32, dev)?), self.model.window())
        };
        let attn = AttnBatch { decode: None, paged: Some(paged), chunks: vec![], varlen, window, order: None };
        let tokens = Tensor::zeros(rows, candle_core::DType::U32, dev)?;
        Ok(Bucket { size, chunk_rows, tokens, kv, attn, sample_rows, graph: None, eager_only: false, host: HostInputs::default() })
    }
}

/// [`DEFAULT_MIXED_MAX_ROWS`], or 0 (no mixed buckets: mixed steps take the packed path)
/// where `LLM_MIXED_GRAPHS=0` is in the environment (an A/B without code changes; read when
/// a runner is built).
fn mixed_max_rows_default() -> usize {
    if crate::model::env_off("LLM_MIXED_GRAPHS") {
        0
    } else {
        DEFAULT_MIXED_MAX_ROWS
    }
}

/// Powers of two from [`MIN_CHUNK_ROWS`] to `max`: the prompt rows of the mixed buckets.
pub fn mixed_row_buckets(max: usize) -> Vec<usize> {
    std::iter::successors(Some(MIN_CHUNK_ROWS), |r| Some(r * 2)).take_while(|&r| r <= max).collect()
}

/// Throwaway steps that make a runner pay its first-use costs (kernel loading, the driver's
/// JIT of PTX, library handles and plans, graph captures) before a timed run or a server's
/// first request, as serving engines warm up at start: for each batch size `b` of
/// `batches`, one prefill step of `b` chunks of `prompt_len` tokens (fewer, shorter chunks
/// where `max_tokens` per step says so: what the engine schedules), one decode step of `b`
/// sequences at position `prompt_len`, and for each `r` of `mixed_rows` one step of those
/// `b` decodes beside a prompt chunk of `r` tokens (the mixed buckets of
/// [`LlamaRunner`]), drawn on the device where the runner does so. It writes the K/V of
/// blocks `0..b * ceil((prompt_len + 1) / block_size) + ceil(max(mixed_rows) / block_size)`
/// (what the engine hands out next rewrites them before any read): run it only while the
/// engine holds no block. Every token is id 0.
/// [`Error::Invalid`] when the cache cannot hold the largest batch.
pub fn warm_up<R: ModelRunner>(runner: &mut R, prompt_len: usize, batches: &[usize], max_tokens: usize, mixed_rows: &[usize]) -> std::result::Result<(), WarmUpError<R::Error>> {
    let bs = runner.block_size();
    let per = (prompt_len + 1).div_ceil(bs.max(1));
    let most = batches.iter().copied().max().unwrap_or(0);
    if prompt_len == 0 || max_tokens == 0 || warm_up_blocks(prompt_len, most, bs, mixed_rows) > runner.num_blocks() {
        return Err(WarmUpError::Invalid(format!(
            "{most} sequences of {} positions and a chunk of {} tokens in a cache of {} blocks of {bs} (prompt {prompt_len}, {max_tokens} tokens a step)",
            prompt_len + 1,
            mixed_rows.iter().copied().max().unwrap_or(0),
            runner.num_blocks()
        )));
    }
    let table = |i: usize| ((i * per) as u32..((i + 1) * per) as u32).collect::<Vec<_>>();
    let greedy = DeviceSample { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, key: [0, 0] };
    let run = |runner: &mut R, batch: &[SeqChunk]| {
        let sampled = batch.iter().filter(|c| c.sample).count();
        match runner.samples_on_device() {
            true => runner.step_sampled(batch, &vec![Some(greedy); sampled]).map(drop),
            false => runner.step(batch).map(drop),
        }
        .map_err(WarmUpError::Runner)
    };
    for &b in batches {
        // Prefill: whole prompts while they fit the step's budget, then one shorter chunk.
        let (mut left, mut prefill) = (max_tokens, vec![]);
        for i in 0..b {
            let len = prompt_len.min(left);
            if len == 0 {
                break;
            }
            left -= len;
            prefill.push(SeqChunk { seq_id: i as u64, tokens: vec![0; len], start_pos: 0, block_table: table(i), sample: len == prompt_len });
        }
        runner.step(&prefill).map_err(WarmUpError::Runner)?;
        let decode: Vec<SeqChunk> = (0..b).map(|i| SeqChunk { seq_id: i as u64, tokens: vec![0], start_pos: prompt_len, block_table: table(i), sample: true }).collect();
        run(runner, &decode)?;
        for &r in mixed_rows {
            let chunk_table: Vec<u32> = ((b * per) as u32..(b * per + r.div_ceil(bs)) as u32).collect();
            let mut mixed = decode.clone();
            mixed.push(SeqChunk { seq_id: b as u64, tokens: vec![0; r], start_pos: 0, block_table: chunk_table, sample: true });
            run(runner, &mixed)?;
        }
    }
    Ok(())
}

/// Blocks of `block_size` tokens [`warm_up`] writes for a batch of `batch` sequences of
/// `prompt_len` tokens and the largest of `mixed_rows` beside them.
pub fn warm_up_blocks(prompt_len: usize, batch: usize, block_size: usize, mixed_rows: &[usize]) -> usize {
    let bs = block_size.max(1);
    batch * (prompt_len + 1).div_ceil(bs) + mixed_rows.iter().copied().max().unwrap_or(0).div_ceil(bs)
}

/// Why [`warm_up`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WarmUpError<E: std::error::Error + 'static> {
    /// The cache cannot hold the warm-up's sequences (or a size is 0).
    #[error("warm-up: {0}")]
    Invalid(String),
    /// A step failed.
    #[error("warm-up step: {0}")]
    Runner(#[source] E),
}

/// Values of one chunk of a logits row in [`greedy_rows`]: the smallest divisor of `vocab`
/// from 256 to 4096 (a few hundred values per reduction row), else the whole row.
fn chunk_len(vocab: usize) -> usize {
    (256..=vocab.min(4096)).find(|&c| vocab.is_multiple_of(c)).unwrap_or(vocab)
}

/// The greedy token of each row of `logits` (`[rows, vocab]` f32 on the device): the
/// largest value's id, the lowest of equal ones, NaN never chosen (as
/// [`crate::generate::argmax`]). Each row is cut into chunks of [`chunk_len`] values, and
/// one max and one argmax reduction over all chunks (many work-groups at once; a single
/// work-group per row would stream a 128k-entry row at one compute unit's pace) come back
/// as two values per chunk; the host picks the first chunk holding the row's largest value.
/// A row with a NaN (its chunk maxima say so) is read back whole and scanned on the host.
fn greedy_rows(logits: &Tensor) -> Result<Vec<u32>> {
    let (rows, vocab) = logits.dims2()?;
    let c = chunk_len(vocab);
    let g = vocab / c;
    let x = logits.contiguous()?.reshape((rows * g, c))?;
    let maxima: Vec<f32> = x.max_keepdim(1)?.flatten_all()?.to_vec1()?;
    let args: Vec<u32> = x.argmax_keepdim(1)?.flatten_all()?.to_vec1()?;
    let mut out = Vec::with_capacity(rows);
    for r in 0..rows {
        let (m, a) = (&maxima[r * g..(r + 1) * g], &args[r * g..(r + 1) * g]);
        let mut best = 0;
        for j in 1..g {
            if m[j] > m[best] {
                best = j;
            }
        }
        if m.iter().any(|v| v.is_nan()) || a[best] as usize >= c {
            out.push(crate::generate::argmax(&logits.get(r)?.to_vec1::<f32>()?));
        } else {
            out.push((best * c) as u32 + a[best]);
        }
    }
    Ok(out)
}

/// The rows of `logits` (`[rows, vocab]` f32 on the device) as [`RowOutput`]s: one
/// `sample` launch for the rows with a spec (only their token ids read back), the logits
/// rows of the others read back as they are.
fn draw_rows(logits: &Tensor, draws: &Draws, vocab: usize) -> Result<Vec<RowOutput>> {
    let rows = logits.dim(0)?;
    if rows != draws.specs.len() {
        return Err(Error::Invalid(format!("{rows} logits rows for {} sampling specs", draws.specs.len())));
    }
    let tokens: Vec<u32> = candle_rocm::llm_ops::sample(logits, &draws.params, None, &draws.keys)?.to_vec1()?;
    let host: Vec<u32> = (0..rows as u32).filter(|&r| draws.specs[r as usize].is_none()).collect();
    let mut host_rows = match host.len() {
        0 => vec![],
        _ => logits.index_select(&Tensor::new(host.as_slice(), logits.device())?, 0)?.to_vec2::<f32>()?,
    }
    .into_iter();
    let mut out = Vec::with_capacity(rows);
    for (r, (spec, t)) in draws.specs.iter().zip(tokens).enumerate() {
        if spec.is_none() {
            out.push(RowOutput::Logits(host_rows.next().expect("one logits row per row without a spec")));
        } else if (t as usize) < vocab {
            out.push(RowOutput::Token(t));
        } else {
            // The kernel's answer for a row of NaN logits: nothing to choose from.
            return Err(Error::Invalid(format!("logits row {r} has no value to sample (NaN everywhere)")));
        }
    }
    Ok(out)
}

/// A multi-token chunk of a step: packed offset, length, start position, context slots,
/// block table.
type MultiChunk<'a> = (usize, usize, usize, Vec<u32>, &'a [u32]);

/// The packed rows `rows` of a step of `total` tokens as a device tensor, or `None` when
/// they are every row in order (nothing to gather).
fn gather_rows(rows: &[u32], total: usize, dev: &candle_core::Device) -> Result<Option<Tensor>> {
    if rows.len() == total && rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
        return Ok(None);
    }
    Ok(Some(Tensor::new(rows, dev)?))
}

/// The decode graphs go before the model: a tensor-parallel rank's graphs recorded
/// collectives of the communicator the model owns, which must outlive them.
impl Drop for LlamaRunner {
    fn drop(&mut self) {
        self.buckets.clear();
    }
}

impl ModelRunner for LlamaRunner {
    type Error = Error;
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>> {
        self.run(batch)
    }
    /// Device draws on our device (the CPU executor included); plain Candle devices sample
    /// on the host.
    fn samples_on_device(&self) -> bool {
        crate::model::on_our_device(&self.model.device)
    }
    fn step_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<Vec<RowOutput>> {
        self.run_sampled(batch, sampling)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        if let Some(p) = pairs.iter().find(|(s, d)| *s as usize >= self.num_blocks || *d as usize >= self.num_blocks) {
            return Err(Error::Invalid(format!("copy of block {} to {} in a cache of {}", p.0, p.1, self.num_blocks)));
        }
        let dev = &self.model.device;
        let src: Vec<u32> = pairs.iter().map(|p| p.0).collect();
        let dst: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        let (src, dst) = (Tensor::new(src.as_slice(), dev)?, Tensor::new(dst.as_slice(), dev)?);
        for lc in &self.cache {
            lc.copy_blocks(&src, &dst)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `greedy_rows` on the CPU executor against the host argmax: ties inside a chunk and
    /// across chunks (the lowest id wins), NaN (never chosen; the row goes to the host),
    /// rows of only -inf (id 0), and vocabularies of one chunk (no divisor from 256) or many.
    #[test]
    fn greedy_rows_are_the_host_argmax() {
        let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
        for vocab in [100usize, 512, 1000, 2 * 1009] {
            let mut rows: Vec<Vec<f32>> = vec![];
            let base = |i: usize| ((i * 7919) % 613) as f32 / 61.0 - 5.0;
            rows.push((0..vocab).map(base).collect());
            // Ties: the same largest value in two chunks and twice in the first.
            let mut t: Vec<f32> = (0..vocab).map(base).collect();
            let (a, b, c) = (3, vocab / 2 + 1, vocab - 2);
            for &i in &[c, a, b] {
                t[i] = 50.0;
            }
            t[a + 1] = 50.0;
            rows.push(t);
            // NaN beside the largest value, and NaN first.
            let mut n: Vec<f32> = (0..vocab).map(base).collect();
            n[vocab - 1] = 60.0;
            n[1] = f32::NAN;
            n[0] = f32::NAN;
            rows.push(n);
            rows.push(vec![f32::NEG_INFINITY; vocab]);
            let mut inf = vec![f32::NEG_INFINITY; vocab];
            inf[vocab - 3] = f32::INFINITY;
            rows.push(inf);
            let flat: Vec<f32> = rows.concat();
            let l = Tensor::from_vec(flat, (rows.len(), vocab), &dev).unwrap();
            let got = greedy_rows(&l).unwrap();
            let want: Vec<u32> = rows.iter().map(|r| crate::generate::argmax(r)).collect();
            assert_eq!(got, want, "vocab {vocab} (chunks of {})", chunk_len(vocab));
        }
        assert_eq!(chunk_len(128_256), 256);
        assert_eq!(chunk_len(1000), 500);
        assert_eq!(chunk_len(100), 100);
    }
}
