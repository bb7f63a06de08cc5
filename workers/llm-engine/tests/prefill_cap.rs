//! The prefill chunk cap while decoding (`Engine::with_prefill_chunk_while_decoding`): steps
//! with decodes carry at most the cap of prompt tokens, steps without keep the whole budget,
//! and the tokens stay those of the direct reference.

mod common;

use common::*;
use llm_engine::{Engine, EngineConfig, EngineError, ModelRunner, SamplingParams, SeqChunk};

const VOCAB: usize = 64;
const BS: usize = 16;

/// The simulator, recording (decode chunks, prompt tokens) of every step.
struct Rec {
    sim: PagedSim,
    steps: Vec<(usize, usize)>,
}

impl ModelRunner for Rec {
    type Error = SimError;
    fn block_size(&self) -> usize {
        self.sim.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.sim.num_blocks()
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, SimError> {
        // A one-token chunk at a position past its prompt is a decode; the rest are prompt
        // tokens (the test's prompts are longer than one token).
        let decodes = batch.iter().filter(|c| c.tokens.len() == 1 && c.start_pos >= 5).count();
        let prompt: usize = batch.iter().filter(|c| !(c.tokens.len() == 1 && c.start_pos >= 5)).map(|c| c.tokens.len()).sum();
        self.steps.push((decodes, prompt));
        self.sim.step(batch)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), SimError> {
        self.sim.copy_blocks(pairs)
    }
    fn blocks_allocated(&mut self, blocks: &[u32]) {
        self.sim.blocks_allocated(blocks)
    }
}

/// A (5-token prompt, 40 tokens) decodes while B (100-token prompt, 3 tokens) arrives after
/// A's first step; returns each step's (decodes, prompt tokens) and the outputs.
fn scenario(cap: Option<usize>) -> (Vec<(usize, usize)>, Vec<u32>, Vec<u32>) {
    let cfg = EngineConfig { max_num_seqs: 4, max_batched_tokens: 64, max_model_len: 128, prefix_caching: false };
    let rec = Rec { sim: PagedSim::new(BS, 32, VOCAB), steps: vec![] };
    let mut e = Engine::new(rec, cfg);
    if let Some(c) = cap {
        e = e.with_prefill_chunk_while_decoding(c).unwrap();
    }
    let (a, b) = (tokens(1, 5, VOCAB), tokens(2, 100, VOCAB));
    let (mut oa, mut ob) = (Outcome::default(), Outcome::default());
    let (_, mut ra) = e.add_request(a.clone(), SamplingParams::greedy(40)).unwrap();
    assert!(e.step().unwrap());
    let (_, mut rb) = e.add_request(b.clone(), SamplingParams::greedy(3)).unwrap();
    let mut n = 0;
    while e.step().unwrap() {
        n += 1;
        assert!(n < 1000, "no progress");
    }
    drain(&mut ra, &mut oa);
    drain(&mut rb, &mut ob);
    assert_eq!(oa.tokens, reference_greedy(&a, 40, VOCAB));
    assert_eq!(ob.tokens, reference_greedy(&b, 3, VOCAB));
    (e.runner().steps.clone(), oa.tokens, ob.tokens)
}

#[test]
fn prefill_is_chunked_to_the_cap_while_decoding() {
    let (free, ..) = scenario(None);
    // Without a cap B's prompt takes the rest of the budget: 63 tokens, then 37.
    assert_eq!(&free[1..3], &[(1, 63), (1, 37)], "{free:?}");
    let (capped, ..) = scenario(Some(8));
    // With it: 8 prompt tokens per step beside A's decode, 13 steps for 100 tokens.
    let with_prompt: Vec<_> = capped.iter().skip(1).filter(|s| s.1 > 0).copied().collect();
    assert_eq!(with_prompt.len(), 13, "{capped:?}");
    assert!(with_prompt.iter().all(|&(d, p)| d == 1 && p <= 8), "{capped:?}");
    assert_eq!(with_prompt.iter().map(|s| s.1).sum::<usize>(), 100);
    // The first step has no decode: A's whole prompt, uncapped.
    assert_eq!(capped[0], (0, 5));
}

#[test]
fn a_backlog_lifts_the_cap_until_it_drains() {
    // A decodes; B, C, D (100-token prompts) arrive together after A's first step. With the
    // cap at 8 while at most one request waits: uncapped steps while two or three wait.
    let cfg = EngineConfig { max_num_seqs: 4, max_batched_tokens: 64, max_model_len: 128, prefix_caching: false };
    let rec = Rec { sim: PagedSim::new(BS, 32, VOCAB), steps: vec![] };
    let mut e = Engine::new(rec, cfg).with_prefill_chunk_while_decoding(8).unwrap().with_prefill_cap_backlog(1);
    let a = tokens(1, 5, VOCAB);
    let (_, mut ra) = e.add_request(a.clone(), SamplingParams::greedy(60)).unwrap();
    assert!(e.step().unwrap());
    let prompts: Vec<Vec<u32>> = (2..5).map(|s| tokens(s, 100, VOCAB)).collect();
    let mut rxs: Vec<_> = prompts.iter().map(|p| e.add_request(p.clone(), SamplingParams::greedy(3)).unwrap().1).collect();
    let mut n = 0;
    while e.step().unwrap() {
        n += 1;
        assert!(n < 1000, "no progress");
    }
    let steps = e.runner().steps.clone();
    // Three, then two waiting: B's prompt takes the rest of the budget twice (63 + 37 and
    // C's first 26).
    assert_eq!(&steps[1..3], &[(1, 63), (1, 63)], "{steps:?}");
    // From then on at most one waits: every step with A's decode carries at most 8 prompt
    // tokens.
    assert!(steps[3..].iter().all(|&(d, p)| d == 0 || p <= 8), "{steps:?}");
    assert!(steps[3..].iter().any(|&(d, p)| d == 1 && p == 8), "{steps:?}");
    let mut oa = Outcome::default();
    drain(&mut ra, &mut oa);
    assert_eq!(oa.tokens, reference_greedy(&a, 60, VOCAB));
    for (p, rx) in prompts.iter().zip(&mut rxs) {
        let mut o = Outcome::default();
        drain(rx, &mut o);
        assert_eq!(o.tokens, reference_greedy(p, 3, VOCAB));
    }
}

#[test]
fn a_zero_cap_is_refused() {
    let cfg = EngineConfig { max_num_seqs: 1, max_batched_tokens: 16, max_model_len: 32, prefix_caching: false };
    let e = Engine::new(PagedSim::new(BS, 4, VOCAB), cfg);
    assert!(matches!(e.with_prefill_chunk_while_decoding(0), Err(EngineError::InvalidConfig(_))));
}
