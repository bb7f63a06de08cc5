//! Host overhead of one engine step (scheduling, block bookkeeping, sampling, events) with a
//! runner that does no work: `cargo run --release -p llm-engine --example overhead`.
//! Prints microseconds per decode step for several batch sizes and vocabulary 128256.

use llm_engine::{Engine, EngineConfig, ModelRunner, SamplingParams, SeqChunk};
use std::time::Instant;

struct Null {
    vocab: usize,
    row: Vec<f32>,
}

impl ModelRunner for Null {
    type Error = std::convert::Infallible;
    fn block_size(&self) -> usize {
        16
    }
    fn num_blocks(&self) -> usize {
        16384
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, Self::Error> {
        // Fresh rows like a runner copying logits to the host; token 1 never wins so nothing stops.
        Ok(batch.iter().filter(|c| c.sample).map(|_| self.row.clone()).collect())
    }
    fn copy_blocks(&mut self, _: &[(u32, u32)]) -> Result<(), Self::Error> {
        Ok(())
    }
}

fn main() {
    let vocab = 128_256;
    let row: Vec<f32> = (0..vocab).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    for (label, params) in [
        ("greedy", SamplingParams::greedy(10_000)),
        ("top-p 0.9, T 0.8", SamplingParams { temperature: 0.8, top_p: Some(0.9), seed: Some(1), max_tokens: 10_000, ..Default::default() }),
    ] {
        for batch in [1usize, 8, 64, 128] {
            let config = EngineConfig { max_num_seqs: 256, max_batched_tokens: 8192, max_model_len: 1024, prefix_caching: true };
            let mut e = Engine::new(Null { vocab, row: row.clone() }, config);
            let rxs: Vec<_> = (0..batch).map(|i| e.add_request(vec![i as u32 + 2; 512], params.clone()).unwrap().1).collect();
            e.step().unwrap(); // prefill
            let steps = 50;
            let t = Instant::now();
            for _ in 0..steps {
                e.step().unwrap();
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / steps as f64;
            println!("{label:>18}  batch {batch:>3}: {us:>9.1} us/step, {:>6.2} us/sequence", us / batch as f64);
            assert_eq!(e.runner().vocab, vocab);
            drop(rxs);
        }
    }
}
