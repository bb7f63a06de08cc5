//! Device sampling through the engine: a runner that draws tokens itself
//! ([`ModelRunner::step_sampled`]) gets one [`DeviceSample`] per sampled row; rows that need
//! the host (logprobs, repetition penalty) come back as logits and take the host sampler in
//! the same step. The simulated "device" here draws greedy rows by argmax and other rows by
//! the host sampler with an RNG seeded from the row's key, so the tests check the plumbing
//! (which row goes where, the keys, the output checks) against the direct reference.

mod common;

use common::*;
use llm_engine::rand_chacha::rand_core::SeedableRng;
use llm_engine::rand_chacha::ChaCha12Rng;
use llm_engine::{sample_one, DeviceSample, Engine, EngineConfig, EngineError, FinishReason, ModelRunner, RowOutput, SampleInput, Sampled, Sampler, SamplingParams, SeqChunk};

const VOCAB: usize = 64;
const BS: usize = 16;

/// What the simulated device does wrong, for the output checks.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// A token for a row the engine kept on the host.
    TokenForHostRow,
    /// One row too few.
    MissingRow,
}

/// [`PagedSim`] with device draws; records every step's specs.
struct DeviceSim {
    sim: PagedSim,
    specs: Vec<Vec<Option<DeviceSample>>>,
    plain_steps: usize,
    fault: Fault,
}

impl ModelRunner for DeviceSim {
    type Error = SimError;
    fn block_size(&self) -> usize {
        self.sim.block_size
    }
    fn num_blocks(&self) -> usize {
        self.sim.num_blocks
    }
    fn step(&mut self, batch: &[SeqChunk]) -> Result<Vec<Vec<f32>>, SimError> {
        self.plain_steps += 1;
        self.sim.step(batch)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), SimError> {
        self.sim.copy_blocks(pairs)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn step_sampled(&mut self, batch: &[SeqChunk], sampling: &[Option<DeviceSample>]) -> Result<Vec<RowOutput>, SimError> {
        assert_eq!(sampling.len(), batch.iter().filter(|c| c.sample).count(), "one spec per sampled chunk");
        self.specs.push(sampling.to_vec());
        let rows = self.sim.step(batch)?;
        let mut out: Vec<RowOutput> = rows
            .into_iter()
            .zip(sampling)
            .map(|(l, s)| match s {
                None if self.fault == Fault::TokenForHostRow => RowOutput::Token(0),
                None => RowOutput::Logits(l),
                Some(s) if s.temperature == 0.0 => RowOutput::Token(argmax(&l)),
                Some(s) => {
                    let params = SamplingParams { temperature: s.temperature, top_k: Some(s.top_k as usize).filter(|&k| k > 0), top_p: Some(s.top_p), min_p: Some(s.min_p), ..SamplingParams::default() };
                    let mut rng = ChaCha12Rng::seed_from_u64(((s.key[0] as u64) << 32) | s.key[1] as u64);
                    RowOutput::Token(sample_one(&mut SampleInput { logits: &l, params: &params, history: &[], rng: &mut rng }).token)
                }
            })
            .collect();
        if self.fault == Fault::MissingRow {
            out.pop();
        }
        Ok(out)
    }
}

fn engine(cfg: EngineConfig, fault: Fault) -> Engine<DeviceSim> {
    let mut sim = PagedSim::new(BS, 64, VOCAB);
    sim.max_num_seqs = cfg.max_num_seqs;
    sim.max_batched_tokens = cfg.max_batched_tokens;
    Engine::new(DeviceSim { sim, specs: vec![], plain_steps: 0, fault }, cfg)
}

fn config() -> EngineConfig {
    EngineConfig { max_num_seqs: 8, max_batched_tokens: 64, max_model_len: 128, prefix_caching: true }
}

/// Runs `reqs` together to the end; each request's outcome.
fn run(e: &mut Engine<DeviceSim>, reqs: &[(Vec<u32>, SamplingParams)]) -> Vec<Outcome> {
    let mut rxs: Vec<_> = reqs.iter().map(|(p, sp)| e.add_request(p.clone(), sp.clone()).unwrap().1).collect();
    let mut outs: Vec<Outcome> = reqs.iter().map(|_| Outcome::default()).collect();
    while e.step().unwrap() {
        for (rx, o) in rxs.iter_mut().zip(&mut outs) {
            drain(rx, o);
        }
    }
    for (rx, o) in rxs.iter_mut().zip(&mut outs) {
        drain(rx, o);
    }
    outs
}

fn greedy_requests() -> Vec<(Vec<u32>, SamplingParams)> {
    [5, 17, 33, 1, 48, 60].iter().enumerate().map(|(i, &n)| (tokens(i as u64, n, VOCAB), SamplingParams::greedy(12 + i))).collect()
}

#[test]
fn greedy_rows_are_drawn_by_the_runner_and_equal_the_reference() {
    let reqs = greedy_requests();
    let mut e = engine(config(), Fault::None);
    let outs = run(&mut e, &reqs);
    for ((p, sp), o) in reqs.iter().zip(&outs) {
        assert_eq!(o.tokens, reference_greedy(p, sp.max_tokens, VOCAB), "prompt of {}", p.len());
        assert_eq!(o.finished, Some((FinishReason::Length, p.len(), sp.max_tokens)));
    }
    let r = e.runner();
    assert_eq!(r.plain_steps, 0, "every step with a sampled row went through step_sampled");
    let greedy = DeviceSample { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, key: [0, 0] };
    assert!(r.specs.iter().flatten().all(|s| *s == Some(greedy)), "greedy specs draw no key");
    // Steps of partial prefill chunks only sample nothing: they take `step`.
    let drawn: usize = r.specs.iter().map(Vec::len).sum();
    assert_eq!(drawn, reqs.iter().map(|r| r.1.max_tokens).sum::<usize>());
}

#[test]
fn device_sampling_off_or_a_replaced_sampler_keeps_every_row_on_the_host() {
    let reqs = greedy_requests();
    let mut e = engine(config(), Fault::None).with_device_sampling(false);
    let outs = run(&mut e, &reqs);
    assert!(e.runner().specs.is_empty());
    assert!(e.runner().plain_steps > 0);
    for ((p, sp), o) in reqs.iter().zip(&outs) {
        assert_eq!(o.tokens, reference_greedy(p, sp.max_tokens, VOCAB));
    }

    /// Counts the rows it samples (greedy).
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Sampler for Counting {
        fn sample(&mut self, batch: &mut [SampleInput<'_>]) -> Vec<Sampled> {
            self.0.fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
            batch.iter().map(|b| Sampled { token: argmax(b.logits), logprob: None, top_logprobs: vec![] }).collect()
        }
    }
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut e = engine(config(), Fault::None).with_sampler(Box::new(Counting(n.clone())));
    run(&mut e, &reqs);
    assert!(e.runner().specs.is_empty(), "a replaced sampler turns device draws off");
    assert_eq!(n.load(std::sync::atomic::Ordering::Relaxed), reqs.iter().map(|r| r.1.max_tokens).sum::<usize>());
}

#[test]
fn logprobs_and_penalty_rows_stay_on_the_host_in_the_same_step() {
    let mut reqs = greedy_requests();
    reqs[1].1.logprobs = Some(3);
    reqs[3].1.repetition_penalty = Some(1.3);
    let mut e = engine(config(), Fault::None);
    let outs = run(&mut e, &reqs);
    // Greedy with logprobs: the reference tokens, each with its logprobs.
    assert_eq!(outs[1].tokens, reference_greedy(&reqs[1].0, reqs[1].1.max_tokens, VOCAB));
    assert_eq!(outs[1].logprobs.len(), outs[1].tokens.len());
    assert!(outs[1].logprobs.iter().all(|l| l.0.is_some() && l.1.len() == 3), "logprobs of every token");
    // The penalty row: the host sampler's tokens (what a host-only engine gives).
    let mut host = engine(config(), Fault::None).with_device_sampling(false);
    let host_outs = run(&mut host, &reqs);
    for (i, (a, b)) in outs.iter().zip(&host_outs).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}: device draws vs host sampling");
    }
    // Mixed steps: some rows drawn, some on the host, in one step_sampled call.
    let mixed = e.runner().specs.iter().filter(|s| s.iter().any(Option::is_some) && s.iter().any(Option::is_none)).count();
    assert!(mixed > 0, "no step mixed device and host rows");
}

#[test]
fn seeded_rows_draw_keys_from_their_rng_and_repeat_with_the_seed() {
    let params = |seed| SamplingParams { temperature: 0.8, top_k: Some(20), top_p: Some(0.9), seed: Some(seed), max_tokens: 10, ..SamplingParams::default() };
    let reqs: Vec<_> = (0..4).map(|i| (tokens(50 + i, 9, VOCAB), params(1000 + i))).collect();
    let (mut a, mut b) = (engine(config(), Fault::None), engine(config(), Fault::None));
    let (ta, tb) = (run(&mut a, &reqs), run(&mut b, &reqs));
    for (x, y) in ta.iter().zip(&tb) {
        assert_eq!(x.tokens, y.tokens, "same seed, same tokens");
        assert_eq!(x.tokens.len(), 10);
    }
    assert_eq!(a.runner().specs, b.runner().specs, "same seeds, same keys");
    let specs: Vec<DeviceSample> = a.runner().specs.iter().flatten().map(|s| s.expect("drawn on the device")).collect();
    assert!(specs.iter().all(|s| s.temperature == 0.8 && s.top_k == 20 && s.top_p == 0.9 && s.min_p == 0.0));
    let mut keys: Vec<[u32; 2]> = specs.iter().map(|s| s.key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), specs.len(), "every draw its own key");
    // Another seed: other keys.
    let mut other = reqs.clone();
    other[0].1.seed = Some(7);
    let mut c = engine(config(), Fault::None);
    run(&mut c, &other);
    assert_ne!(c.runner().specs[0][0], a.runner().specs[0][0]);
}

#[test]
fn malformed_runner_outputs_fail_the_batch_with_a_typed_error() {
    for fault in [Fault::TokenForHostRow, Fault::MissingRow] {
        let mut e = engine(config(), fault);
        // One row drawn on the device, one (logprobs) kept on the host.
        let mut host = SamplingParams::greedy(4);
        host.logprobs = Some(1);
        let mut rxs = vec![e.add_request(tokens(3, 5, VOCAB), SamplingParams::greedy(4)).unwrap().1, e.add_request(tokens(4, 6, VOCAB), host).unwrap().1];
        let err = e.step().unwrap_err();
        assert!(matches!(err, EngineError::RunnerOutput(_)), "{err}");
        for rx in &mut rxs {
            let mut o = Outcome::default();
            drain(rx, &mut o);
            assert!(matches!(o.finished, Some((FinishReason::Error(_), _, _))), "{:?}", o.finished);
        }
        assert_eq!(e.stats().blocks_used, 0);
    }
}
