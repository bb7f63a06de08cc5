//! Sampling parameters and the host sampler.
//!
//! Processing order (as vLLM and Hugging Face do it): repetition penalty, temperature, top-k,
//! top-p, min-p, then a draw from the softmax of what is left with the request's seeded
//! ChaCha RNG. Temperature 0 is greedy argmax (ties to the lowest id) and ignores
//! top-k/top-p/min-p and the RNG. Logprobs are the log-softmax of the processed logits, the
//! distribution the token was drawn from (excluded tokens have none); for greedy, of the
//! penalised logits at temperature 1.

use rand::Rng;
use rayon::prelude::*;
use std::collections::HashSet;
use rand_chacha::ChaCha12Rng;

/// Per-request generation settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy argmax; must be >= 0.
    pub temperature: f32,
    /// Keep only the k most likely tokens (k >= 1).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p, p in (0, 1].
    pub top_p: Option<f32>,
    /// Drop tokens whose probability is below min_p times the largest, min_p in [0, 1].
    pub min_p: Option<f32>,
    /// Divides positive logits (multiplies negative ones) of tokens already in the sequence
    /// (prompt and generated); > 0, 1 = off.
    pub repetition_penalty: Option<f32>,
    /// Seed of the request's RNG (ChaCha12); `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Tokens to generate at most (>= 1).
    pub max_tokens: usize,
    /// Token ids that end generation (EOS); not emitted.
    pub stop_token_ids: Vec<u32>,
    /// Non-empty strings that end generation when they appear in the decoded completion; the
    /// matched string is not emitted. Needs the engine's decoder.
    pub stop_strings: Vec<String>,
    /// Report the sampled token's logprob and this many top logprobs.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    /// Temperature 1, no truncation, 16 tokens (OpenAI's default), unseeded.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            seed: None,
            max_tokens: 16,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self { temperature: 0.0, max_tokens, ..Self::default() }
    }

    /// Checks every field's range; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !(t >= 0.0 && t.is_finite()) {
            return Err(format!("temperature must be finite and >= 0, got {t}"));
        }
        if self.top_k == Some(0) {
            return Err("top_k must be >= 1".into());
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("top_p must be in (0, 1], got {p}"));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("min_p must be in [0, 1], got {p}"));
            }
        }
        if let Some(r) = self.repetition_penalty {
            if !(r > 0.0 && r.is_finite()) {
                return Err(format!("repetition_penalty must be finite and > 0, got {r}"));
            }
        }
        if self.max_tokens == 0 {
            return Err("max_tokens must be >= 1".into());
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return Err("stop_strings must not contain an empty string".into());
        }
        Ok(())
    }
}

/// One row's draw on the runner's device ([`crate::ModelRunner::step_sampled`]): the
/// filters of [`SamplingParams`] a device sampler applies (Hugging Face's order: temperature,
/// top-k, top-p, min-p) and the key of its random draw. The device's draw uses its own
/// generator keyed by `key`, so a seeded request is reproducible on one path (device or
/// host) but the two paths draw different tokens from the same distribution; greedy rows
/// give the same token on both.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSample {
    /// 0: greedy (argmax, the lowest id of equal logits; NaN never chosen).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0: off.
    pub top_k: u32,
    /// Keep the fewest most likely tokens whose probability reaches `top_p`; 1: off.
    pub top_p: f32,
    /// Keep tokens at least `min_p` times as likely as the most likely one; 0: off.
    pub min_p: f32,
    /// Key of the draw, taken from the request's RNG each step (`[0, 0]` for greedy, which
    /// draws nothing): the same logits and key give the same token.
    pub key: [u32; 2],
}

impl DeviceSample {
    /// The device form of `params` with a key from `rng` (two words, only when the
    /// temperature is above 0), or `None` when the row needs the host sampler: a repetition
    /// penalty (it needs the sequence's history) or logprobs.
    pub fn of(params: &SamplingParams, rng: &mut ChaCha12Rng) -> Option<DeviceSample> {
        if params.logprobs.is_some() || params.repetition_penalty.is_some_and(|r| r != 1.0) {
            return None;
        }
        let key = if params.temperature > 0.0 { [rng.random(), rng.random()] } else { [0, 0] };
        // A top-k at or past the vocabulary keeps everything, as does any k this large.
        let top_k = params.top_k.map_or(0, |k| k.min((1 << 24) - 1) as u32);
        Some(DeviceSample { temperature: params.temperature, top_k, top_p: params.top_p.unwrap_or(1.0), min_p: params.min_p.unwrap_or(0.0), key })
    }
}

/// One row to sample: the logits and the request state the processors need.
pub struct SampleInput<'a> {
    /// One logit per vocabulary entry.
    pub logits: &'a [f32],
    pub params: &'a SamplingParams,
    /// Every token of the sequence so far (prompt and generated), for the repetition penalty.
    pub history: &'a [u32],
    /// The request's RNG.
    pub rng: &'a mut ChaCha12Rng,
}

/// A sampled token with its logprobs when asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: Option<f32>,
    /// The `logprobs` most likely tokens, most likely first (ties: lower id first).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Turns logits rows into tokens; the host implementation is [`HostSampler`], a device sampler
/// may replace it ([`crate::Engine::with_sampler`]).
pub trait Sampler: Send {
    /// Samples one token per input, in order.
    fn sample(&mut self, batch: &mut [SampleInput<'_>]) -> Vec<Sampled>;
}

/// Sampling on the host (probabilities in f64), rows in parallel on rayon's pool.
#[derive(Clone, Debug, Default)]
pub struct HostSampler;

impl Sampler for HostSampler {
    fn sample(&mut self, batch: &mut [SampleInput<'_>]) -> Vec<Sampled> {
        if batch.len() == 1 {
            return vec![sample_one(&mut batch[0])];
        }
        batch.par_iter_mut().map(sample_one).collect()
    }
}

/// Samples one row (see the module doc for the order of processing).
pub fn sample_one(input: &mut SampleInput<'_>) -> Sampled {
    let p = input.params;
    assert!(!input.logits.is_empty(), "empty logits row");
    let penalty = p.repetition_penalty.filter(|&r| r != 1.0).map(f64::from);
    let seen: HashSet<u32> = if penalty.is_some() { input.history.iter().copied().collect() } else { HashSet::new() };
    // NaN logits can never be chosen.
    let logit = |i: usize, x: f32| -> f64 {
        let x = if x.is_nan() { f64::NEG_INFINITY } else { x as f64 };
        match penalty {
            Some(r) if seen.contains(&(i as u32)) => {
                if x > 0.0 {
                    x / r
                } else {
                    x * r
                }
            }
            _ => x,
        }
    };
    if p.temperature == 0.0 && p.logprobs.is_none() {
        // Greedy without logprobs: one pass, no copy of the row.
        let (mut best, mut best_v) = (0, f64::NEG_INFINITY);
        for (i, &x) in input.logits.iter().enumerate() {
            let v = logit(i, x);
            if v > best_v {
                (best, best_v) = (i, v);
            }
        }
        return Sampled { token: best as u32, logprob: None, top_logprobs: Vec::new() };
    }
    let mut l: Vec<f64> = input.logits.iter().enumerate().map(|(i, &x)| logit(i, x)).collect();
    let token = if p.temperature == 0.0 {
        argmax(&l)
    } else {
        let t = p.temperature as f64;
        l.iter_mut().for_each(|x| *x /= t);
        truncate(&mut l, p);
        draw(&l, input.rng)
    };
    let (logprob, top_logprobs) = match p.logprobs {
        None => (None, Vec::new()),
        Some(n) => {
            let lp = log_softmax(&l);
            let mut top: Vec<u32> = (0..lp.len() as u32).filter(|&i| lp[i as usize].is_finite()).collect();
            top.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
            top.truncate(n);
            (Some(lp[token as usize] as f32), top.into_iter().map(|i| (i, lp[i as usize] as f32)).collect())
        }
    };
    Sampled { token, logprob, top_logprobs }
}

/// The largest logit's index, the lowest on ties.
fn argmax(l: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(l: &[f64]) -> Vec<f64> {
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return vec![-(l.len() as f64).ln(); l.len()];
    }
    let lse = max + l.iter().map(|&x| (x - max).exp()).sum::<f64>().ln();
    l.iter().map(|&x| x - lse).collect()
}

/// Most likely first, ties to the lower id: a total order, so selections are deterministic.
fn by_logit(l: &[f64]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    |&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b))
}

/// The `k` most likely token ids, most likely first, in O(n + k log k).
fn top_sorted(l: &[f64], k: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..l.len() as u32).collect();
    if k < ids.len() {
        ids.select_nth_unstable_by(k, by_logit(l));
        ids.truncate(k);
    }
    ids.sort_unstable_by(by_logit(l));
    ids
}

/// The smallest most-likely-first set of ids (ties: lower id first) whose weights `w` reach
/// `target`, found by partitioning around pivots (expected O(n), no sort of the vocabulary).
fn top_mass(l: &[f64], w: &[f64], target: f64) -> Vec<u32> {
    let mut kept = Vec::new();
    let mut cand: Vec<u32> = (0..l.len() as u32).filter(|&i| w[i as usize] > 0.0).collect();
    let mut need = target;
    while !cand.is_empty() {
        if cand.len() <= 64 {
            cand.sort_unstable_by(by_logit(l));
            for i in cand {
                kept.push(i);
                need -= w[i as usize];
                if need <= 0.0 {
                    break;
                }
            }
            return kept;
        }
        // Median of three as the pivot.
        let mut three = [l[cand[0] as usize], l[cand[cand.len() / 2] as usize], l[cand[cand.len() - 1] as usize]];
        three.sort_by(f64::total_cmp);
        let pivot = three[1];
        let (hi, rest): (Vec<u32>, Vec<u32>) = cand.iter().partition(|&&i| l[i as usize] > pivot);
        let hi_mass: f64 = hi.iter().map(|&i| w[i as usize]).sum();
        if hi_mass >= need {
            cand = hi;
            continue;
        }
        kept.extend_from_slice(&hi);
        need -= hi_mass;
        let (mut eq, lo): (Vec<u32>, Vec<u32>) = rest.into_iter().partition(|&i| l[i as usize] == pivot);
        eq.sort_unstable();
        for i in eq {
            kept.push(i);
            need -= w[i as usize];
            if need <= 0.0 {
                return kept;
            }
        }
        cand = lo;
    }
    kept
}

/// Sets the logits that top-k, top-p and min-p exclude to -inf (never the most likely one).
fn truncate(l: &mut [f64], p: &SamplingParams) {
    let n = l.len();
    if let Some(k) = p.top_k.filter(|&k| k < n) {
        let keep = top_sorted(l, k);
        let cut = l[keep[k - 1] as usize];
        // Everything below the k-th logit, and ties of it with a higher id than those kept.
        let last_id = keep[k - 1];
        for (i, x) in l.iter_mut().enumerate() {
            if *x < cut || (*x == cut && i as u32 > last_id) {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    if let Some(top_p) = p.top_p.filter(|&t| t < 1.0) {
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = l.iter().map(|&x| (x - max).exp()).collect();
        let target = top_p as f64 * w.iter().sum::<f64>();
        let mut kept = vec![false; n];
        for i in top_mass(l, &w, target) {
            kept[i as usize] = true;
        }
        for (x, k) in l.iter_mut().zip(kept) {
            if !k {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    if let Some(min_p) = p.min_p.filter(|&m| m > 0.0) {
        // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p).
        let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let cut = max + (min_p as f64).ln();
        for x in l.iter_mut() {
            if *x < cut {
                *x = f64::NEG_INFINITY;
            }
        }
    }
}

/// Draws an index from softmax(l) with one uniform number of `rng`.
fn draw(l: &[f64], rng: &mut ChaCha12Rng) -> u32 {
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return 0;
    }
    let w: Vec<f64> = l.iter().map(|&x| (x - max).exp()).collect();
    let total: f64 = w.iter().sum();
    let target = rng.random::<f64>() * total;
    let mut cum = 0.0;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            cum += x;
            last = i;
            if cum > target {
                return i as u32;
            }
        }
    }
    last as u32
}
