//! A static-batch driver of [`LlamaRunner`]: every sequence gets its own contiguous blocks,
//! prompts are prefilled in one step, then all decode together. It is what the CLI and the
//! tests use to run a model directly (the serving path is `llm_engine::Engine`).
use crate::error::{Error, Result};
use crate::runner::{LlamaRunner, ModelRunner, SeqChunk};
use std::time::Instant;

/// Host sampling: greedy (temperature 0) or temperature with an optional top-p, seeded.
#[derive(Clone, Debug)]
pub struct HostSampling {
    pub temperature: f64,
    pub top_p: Option<f64>,
    state: u64,
}

impl HostSampling {
    /// A sampler; `temperature <= 0` is greedy.
    pub fn new(temperature: f64, top_p: Option<f64>, seed: u64) -> Self {
        HostSampling { temperature, top_p, state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    fn uniform(&mut self) -> f64 {
        let s = &mut self.state;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One token from a logits row.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let argmax = || logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32;
        if self.temperature <= 0.0 {
            return argmax();
        }
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut p: Vec<(u32, f64)> = logits.iter().enumerate().map(|(i, &x)| (i as u32, ((x as f64 - max) / self.temperature).exp())).collect();
        p.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = p.iter().map(|x| x.1).sum();
        if let Some(top) = self.top_p {
            let mut acc = 0.0;
            let keep = p.iter().position(|x| {
                acc += x.1 / total;
                acc >= top
            });
            p.truncate(keep.map_or(p.len(), |k| k + 1));
        }
        let total: f64 = p.iter().map(|x| x.1).sum();
        let mut u = self.uniform() * total;
        for (i, w) in &p {
            if u < *w {
                return *i;
            }
            u -= w;
        }
        p.last().map_or_else(argmax, |x| x.0)
    }
}

/// Timings of a [`generate`] run.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Seconds of the prefill step (all prompts): the time to first token.
    pub prefill_s: f64,
    pub prompt_tokens: usize,
    /// Seconds of the decode steps.
    pub decode_s: f64,
    /// Tokens produced by the decode steps (the first token of each sequence comes from prefill).
    pub decode_tokens: usize,
}

/// Blocks a run of `seqs` sequences of at most `max_len` tokens needs.
pub fn blocks_needed(seqs: usize, max_len: usize, block_size: usize) -> usize {
    seqs * max_len.div_ceil(block_size)
}

/// Generates up to `max_new` tokens for each prompt, all in one batch; `on_token(seq, id)`
/// sees each token as it comes. A sequence stops at one of `stop` (not emitted).
pub fn generate(runner: &mut LlamaRunner, prompts: &[Vec<u32>], max_new: usize, sampling: &mut HostSampling, stop: &[u32], mut on_token: impl FnMut(usize, u32)) -> Result<(Vec<Vec<u32>>, Timing)> {
    let bs = runner.block_size();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_new;
    let per = longest.div_ceil(bs);
    if prompts.iter().any(Vec::is_empty) {
        return Err(Error::Invalid("an empty prompt".into()));
    }
    if prompts.len() * per > runner.num_blocks() {
        return Err(Error::Invalid(format!("{} sequences of up to {longest} tokens need {} blocks; the cache has {}", prompts.len(), prompts.len() * per, runner.num_blocks())));
    }
    let table = |i: usize| ((i * per) as u32..((i + 1) * per) as u32).collect::<Vec<_>>();
    let mut out: Vec<Vec<u32>> = vec![vec![]; prompts.len()];
    let mut timing = Timing { prompt_tokens: prompts.iter().map(Vec::len).sum(), ..Default::default() };
    let t0 = Instant::now();
    let batch: Vec<SeqChunk> = prompts.iter().enumerate().map(|(i, p)| SeqChunk { seq_id: i as u64, tokens: p.clone(), start_pos: 0, block_table: table(i), sample: true }).collect();
    let logits = runner.step(&batch)?;
    let mut live: Vec<usize> = vec![];
    for (i, row) in logits.iter().enumerate() {
        let t = sampling.sample(row);
        if max_new > 0 && !stop.contains(&t) {
            out[i].push(t);
            on_token(i, t);
            if max_new > 1 {
                live.push(i);
            }
        }
    }
    timing.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    while !live.is_empty() {
        let batch: Vec<SeqChunk> = live
            .iter()
            .map(|&i| SeqChunk { seq_id: i as u64, tokens: vec![*out[i].last().expect("one token")], start_pos: prompts[i].len() + out[i].len() - 1, block_table: table(i), sample: true })
            .collect();
        let logits = runner.step(&batch)?;
        let mut next = vec![];
        for (&i, row) in live.iter().zip(&logits) {
            let t = sampling.sample(row);
            if stop.contains(&t) {
                continue;
            }
            out[i].push(t);
            timing.decode_tokens += 1;
            on_token(i, t);
            if out[i].len() < max_new {
                next.push(i);
            }
        }
        live = next;
    }
    timing.decode_s = t1.elapsed().as_secs_f64();
    Ok((out, timing))
}
