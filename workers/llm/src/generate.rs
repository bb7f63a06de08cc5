//! A static-batch greedy driver of [`LlamaRunner`]: every sequence gets its own contiguous
//! blocks, prompts are prefilled in one step, then all decode together. The tests' "alone"
//! reference for the engine, and a way to run a model without it (the serving path, and the
//! CLI's, is `llm_engine::Engine`).
use crate::error::{Error, Result};
use crate::runner::{DeviceSample, LlamaRunner, ModelRunner, RowOutput, SeqChunk};
use std::time::Instant;

/// The largest logit's index (the first of equals).
pub fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// The greedy token of each sampled chunk of one step: drawn on the device where the
/// runner does that (only token ids come back), else [`argmax`] of the logits rows.
fn greedy_step(runner: &mut LlamaRunner, batch: &[SeqChunk]) -> Result<Vec<u32>> {
    if !runner.samples_on_device() {
        return Ok(runner.step(batch)?.iter().map(|row| argmax(row)).collect());
    }
    let greedy = Some(DeviceSample { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, key: [0, 0] });
    let n = batch.iter().filter(|c| c.sample).count();
    let rows = runner.step_sampled(batch, &vec![greedy; n])?;
    Ok(rows
        .into_iter()
        .map(|r| match r {
            RowOutput::Token(t) => t,
            RowOutput::Logits(l) => argmax(&l),
        })
        .collect())
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

/// Generates up to `max_new` greedy tokens for each prompt, all in one batch;
/// `on_token(seq, id)` sees each token as it comes. A sequence stops at one of `stop` (not
/// emitted).
pub fn generate(runner: &mut LlamaRunner, prompts: &[Vec<u32>], max_new: usize, stop: &[u32], mut on_token: impl FnMut(usize, u32)) -> Result<(Vec<Vec<u32>>, Timing)> {
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
    let first = greedy_step(runner, &batch)?;
    let mut live: Vec<usize> = vec![];
    for (i, t) in first.into_iter().enumerate() {
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
        let tokens = greedy_step(runner, &batch)?;
        let mut next = vec![];
        for (&i, t) in live.iter().zip(tokens) {
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
