//! A deterministic model runner simulating a paged KV cache, and an independent reference.
//!
//! "K/V" of position p is a hash of the sequence's tokens 0..=p (chained, like a transformer's
//! K/V depends on everything before), stored in the slot the block table names. The logits of
//! a position are a fixed function of that hash and of the sum of the hashes of every slot the
//! chunk attends to, so a wrong block table, a slot overwritten by another sequence (a missing
//! copy-on-write) or a stale cached block all change the tokens. The simulator panics when a
//! slot is written twice without being freshly allocated in between, when a read slot was not
//! written or holds another position, and when a batch breaks the engine's limits.
#![allow(dead_code)]

use llm_engine::{Event, FinishReason, ModelRunner, Receiver, SeqChunk};
use std::collections::HashMap;

pub const SEED: u64 = 0x5eed;

pub fn mix(a: u64, b: u64) -> u64 {
    // splitmix64 finaliser of a combination.
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub fn kv_hash(prev: u64, token: u32, pos: usize) -> u64 {
    mix(mix(prev, token as u64 + 1), pos as u64 + 7)
}

pub fn logits_of(h: u64, acc: u64, vocab: usize) -> Vec<f32> {
    let k = mix(h, acc);
    (0..vocab).map(|t| ((mix(k, t as u64) >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0).collect()
}

/// The logits after `history` computed directly (no engine, no cache).
pub fn reference_logits(history: &[u32], vocab: usize) -> Vec<f32> {
    let (mut h, mut acc) = (SEED, 0u64);
    for (p, &t) in history.iter().enumerate() {
        h = kv_hash(h, t, p);
        acc = acc.wrapping_add(h);
    }
    logits_of(h, acc, vocab)
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy continuation of `prompt` computed directly.
pub fn reference_greedy(prompt: &[u32], n: usize, vocab: usize) -> Vec<u32> {
    let mut h = prompt.to_vec();
    for _ in 0..n {
        let t = argmax(&reference_logits(&h, vocab));
        h.push(t);
    }
    h[prompt.len()..].to_vec()
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    pos: usize,
    h: u64,
    writer: u64,
}

#[derive(Debug)]
pub struct SimError(pub String);
impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for SimError {}

pub struct PagedSim {
    pub block_size: usize,
    pub num_blocks: usize,
    pub vocab: usize,
    /// Limits every batch must respect.
    pub max_num_seqs: usize,
    pub max_batched_tokens: usize,
    slots: Vec<Option<Slot>>,
    pub steps: usize,
    pub copies: usize,
    pub partial_chunks: usize,
    pub max_batch: usize,
    pub fail_at_step: Option<usize>,
}

impl PagedSim {
    pub fn new(block_size: usize, num_blocks: usize, vocab: usize) -> Self {
        Self {
            block_size,
            num_blocks,
            vocab,
            max_num_seqs: usize::MAX,
            max_batched_tokens: usize::MAX,
            slots: vec![None; block_size * num_blocks],
            steps: 0,
            copies: 0,
            partial_chunks: 0,
            max_batch: 0,
            fail_at_step: None,
        }
    }

    fn slot_of(&self, table: &[u32], pos: usize) -> usize {
        let b = table[pos / self.block_size] as usize;
        assert!(b < self.num_blocks, "block id {b} out of range");
        b * self.block_size + pos % self.block_size
    }
}

impl ModelRunner for PagedSim {
    type Error = SimError;

    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, SimError> {
        if self.fail_at_step == Some(self.steps) {
            self.steps += 1;
            return Err(SimError("injected failure".into()));
        }
        self.steps += 1;
        assert!(!batch.is_empty(), "empty batch");
        assert!(batch.len() <= self.max_num_seqs, "batch of {} > max_num_seqs", batch.len());
        let total: usize = batch.iter().map(|c| c.tokens.len()).sum();
        assert!(total <= self.max_batched_tokens, "{total} tokens > max_batched_tokens");
        self.max_batch = self.max_batch.max(batch.len());
        let mut ids: Vec<u64> = batch.iter().map(|c| c.seq_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), batch.len(), "a sequence twice in one batch");
        // Slot -> writer of this step: no chunk may read what another writes in the same step.
        let mut written: HashMap<usize, u64> = HashMap::new();
        let mut out = Vec::new();
        for c in batch {
            assert!(!c.tokens.is_empty(), "empty chunk");
            let end = c.start_pos + c.tokens.len();
            assert_eq!(c.block_table.len(), end.div_ceil(self.block_size), "block table length of seq {}", c.seq_id);
            let mut t = c.block_table.clone();
            t.sort();
            t.dedup();
            assert_eq!(t.len(), c.block_table.len(), "a block twice in one table");
            let mut acc = 0u64;
            let mut h = SEED;
            for q in 0..c.start_pos {
                let s = self.slot_of(&c.block_table, q);
                let slot = self.slots[s].unwrap_or_else(|| panic!("seq {} reads unwritten position {q}", c.seq_id));
                assert_eq!(slot.pos, q, "seq {} reads position {q} from a slot holding {}", c.seq_id, slot.pos);
                if let Some(&w) = written.get(&s) {
                    assert_eq!(w, c.seq_id, "seq {} reads a slot seq {w} writes in the same step", c.seq_id);
                }
                acc = acc.wrapping_add(slot.h);
                h = slot.h;
            }
            for (i, &tok) in c.tokens.iter().enumerate() {
                let pos = c.start_pos + i;
                h = kv_hash(h, tok, pos);
                acc = acc.wrapping_add(h);
                let s = self.slot_of(&c.block_table, pos);
                if let Some(old) = self.slots[s] {
                    panic!("seq {} writes position {pos} into a slot written before (pos {}, by seq {})", c.seq_id, old.pos, old.writer);
                }
                self.slots[s] = Some(Slot { pos, h, writer: c.seq_id });
                written.insert(s, c.seq_id);
            }
            if c.sample {
                out.push(logits_of(h, acc, self.vocab));
            } else {
                self.partial_chunks += 1;
            }
        }
        Ok(out)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), SimError> {
        let bs = self.block_size;
        for &(src, dst) in pairs {
            let (src, dst) = (src as usize, dst as usize);
            assert!(self.slots[dst * bs..(dst + 1) * bs].iter().all(Option::is_none), "copy into a used block {dst}");
            assert!(self.slots[src * bs..(src + 1) * bs].iter().any(Option::is_some), "copy of an empty block {src}");
            for o in 0..bs {
                self.slots[dst * bs + o] = self.slots[src * bs + o];
            }
            self.copies += 1;
        }
        Ok(())
    }

    fn blocks_allocated(&mut self, blocks: &[u32]) {
        let bs = self.block_size;
        for &b in blocks {
            self.slots[b as usize * bs..(b as usize + 1) * bs].fill(None);
        }
    }
}

/// A token's logprob and top logprobs.
pub type TokenLogprobs = (Option<f32>, Vec<(u32, f32)>);

/// What a receiver got: tokens (with logprobs) and the finish event.
#[derive(Debug, Default)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
    pub finished: Option<(FinishReason, usize, usize)>,
    pub after_finish: usize,
}

pub fn drain(rx: &mut Receiver<Event>, out: &mut Outcome) {
    while let Ok(ev) = rx.try_recv() {
        if out.finished.is_some() {
            out.after_finish += 1;
        }
        match ev {
            Event::Token { id, logprob, top_logprobs } => {
                out.tokens.push(id);
                out.logprobs.push((logprob, top_logprobs));
            }
            Event::Finished { reason, prompt_tokens, completion_tokens } => {
                out.finished = Some((reason, prompt_tokens, completion_tokens))
            }
        }
    }
}

/// A deterministic token list.
pub fn tokens(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| (mix(seed, i as u64) % vocab as u64) as u32).collect()
}
