//! [`LlamaRunner`]: the model side of `llm_engine::Engine`. It owns the weights and the paged
//! KV cache, turns a batch of [`SeqChunk`]s into one packed forward, and copies blocks.
use crate::error::{Error, Result};
use crate::model::{chunk_mask, AttnBatch, AttnChunk, DecodeGroup, LayerCache, Model, PagedDecode, VarlenChunks};
use candle_core::Tensor;
pub use llm_engine::{ModelRunner, SeqChunk};

/// A llama-family model with its paged KV cache.
pub struct LlamaRunner {
    model: Model,
    cache: Vec<LayerCache>,
    block_size: usize,
    num_blocks: usize,
}

impl LlamaRunner {
    /// A runner over `model` with a zeroed cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: Model, num_blocks: usize, block_size: usize) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(Error::Invalid(format!("a cache of {num_blocks} blocks of {block_size} tokens")));
        }
        let cache = model.new_cache(num_blocks, block_size)?;
        Ok(LlamaRunner { model, cache, block_size, num_blocks })
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
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let bs = self.block_size;
        let (maxpos, vocab) = (self.model.max_positions(), self.model.cfg.vocab_size);
        let dev = self.model.device.clone();
        let window = self.model.window();
        let (mut tokens, mut positions, mut slots, mut rows) = (vec![], vec![], vec![], vec![]);
        let kernels = self.model.kernel_attention();
        let mut chunks = Vec::with_capacity(batch.len());
        // Multi-token chunks: packed offset, length, start position, context slots.
        let mut multi: Vec<(usize, usize, usize, Vec<u32>)> = vec![];
        // One-token chunks (decodes): packed row, context slots, block table.
        let mut decodes: Vec<(usize, Vec<u32>, &[u32])> = vec![];
        for c in batch {
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
            let slot = |p: usize| c.block_table[p / bs] * bs as u32 + (p % bs) as u32;
            let offset = tokens.len();
            tokens.extend_from_slice(&c.tokens);
            positions.extend((start..end).map(|p| p as u32));
            slots.extend((start..end).map(slot));
            let ctx: Vec<u32> = (0..end).map(slot).collect();
            if len == 1 {
                decodes.push((offset, ctx, &c.block_table));
            } else {
                multi.push((offset, len, start, ctx));
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
            // rope_append_kv before attention): one gather, one varlen call.
            let (mut rows_q, mut ctx_slots, mut cu_q, mut cu_k) = (vec![], vec![], vec![0u32], vec![0u32]);
            let (mut max_q, mut max_k) = (0, 0);
            for (offset, len, _, ctx) in &multi {
                rows_q.extend((*offset..offset + len).map(|r| r as u32));
                ctx_slots.extend_from_slice(ctx);
                cu_q.push(rows_q.len() as u32);
                cu_k.push(ctx_slots.len() as u32);
                (max_q, max_k) = (max_q.max(*len), max_k.max(ctx.len()));
            }
            varlen = Some(VarlenChunks {
                rows: gather_rows(&rows_q, tokens.len(), &dev)?,
                ctx_slots: Tensor::new(ctx_slots.as_slice(), &dev)?,
                cu_q: Tensor::new(cu_q.as_slice(), &dev)?,
                cu_k: Tensor::new(cu_k.as_slice(), &dev)?,
                max_q,
                max_k,
            });
        } else {
            for (offset, len, start, ctx) in multi {
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
            paged = Some(PagedDecode { rows: gather_rows(&r, tokens.len(), &dev)?, index: candle_rocm::paged::DecodeIndex::new(&dev, &tables, &lens, self.num_blocks, bs)? });
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
        match self.model.forward(&tokens, &positions, &slots, &attn, &rows, &self.cache)? {
            Some(l) => Ok(l.to_vec2::<f32>()?),
            None => Ok(vec![]),
        }
    }
}

/// The packed rows `rows` of a step of `total` tokens as a device tensor, or `None` when
/// they are every row in order (nothing to gather).
fn gather_rows(rows: &[u32], total: usize, dev: &candle_core::Device) -> Result<Option<Tensor>> {
    if rows.len() == total && rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
        return Ok(None);
    }
    Ok(Some(Tensor::new(rows, dev)?))
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
