//! Random workloads (proptest): any block size, pool size, budget, prefill cap (lifted under a
//! backlog or not), slot count,
//! prefix caching, arrival times, shared prefixes, forks and cancellations give every request
//! exactly its reference tokens.

mod common;

use common::*;
use llm_engine::{Engine, EngineConfig, FinishReason, SamplingParams};
use proptest::prelude::*;

const VOCAB: usize = 64;
const MAX_LEN: usize = 128;

#[derive(Clone, Debug)]
struct Req {
    /// Tokens of the shared prefix to start with, then own tokens.
    shared: usize,
    own: usize,
    max_tokens: usize,
    arrive_at: usize,
    cancel_at: Option<usize>,
    /// Fork a greedy child of this many tokens this many steps after arrival.
    fork: Option<(usize, usize)>,
}

fn req() -> impl Strategy<Value = Req> {
    (
        0usize..50,
        1usize..60,
        1usize..30,
        0usize..20,
        prop::option::weighted(0.2, 0usize..30),
        prop::option::weighted(0.3, (0usize..20, 1usize..20)),
    )
        .prop_map(|(shared, own, max_tokens, arrive_at, cancel_at, fork)| Req {
            shared,
            own,
            max_tokens,
            arrive_at,
            cancel_at,
            fork,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn every_request_gets_its_reference_tokens(
        reqs in prop::collection::vec(req(), 1..9),
        num_blocks in 8usize..24,
        budget in 1usize..80,
        max_num_seqs in 1usize..9,
        prefix_caching in any::<bool>(),
        block_size_log2 in 0u32..5,
        prefill_cap in prop::option::of((1usize..40, prop::option::of(0usize..4))),
    ) {
        // Block sizes 1..=16 over the same KV capacity (8..24 blocks of 16 tokens): small
        // blocks make many more copy-on-write and prefix-cache boundaries.
        let block_size = 1usize << block_size_log2;
        let num_blocks = num_blocks * 16 / block_size;
        let cfg = EngineConfig { max_num_seqs, max_batched_tokens: budget, max_model_len: MAX_LEN, prefix_caching };
        let mut sim = PagedSim::new(block_size, num_blocks, VOCAB);
        sim.max_num_seqs = max_num_seqs;
        sim.max_batched_tokens = budget;
        let mut e = Engine::new(sim, cfg);
        if let Some((cap, backlog)) = prefill_cap {
            e = e.with_prefill_chunk_while_decoding(cap).unwrap();
            if let Some(w) = backlog {
                e = e.with_prefill_cap_backlog(w);
            }
        }
        let shared = tokens(1234, 50, VOCAB);
        let prompts: Vec<Vec<u32>> = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| [&shared[..r.shared], &tokens(i as u64, r.own, VOCAB)[..]].concat())
            .collect();
        let mut live: Vec<Option<(u64, llm_engine::Receiver<llm_engine::Event>)>> = reqs.iter().map(|_| None).collect();
        let mut outs: Vec<Outcome> = reqs.iter().map(|_| Outcome::default()).collect();
        // Forks: (child prompt, max tokens, receiver, outcome).
        let mut forks = Vec::new();
        let mut step = 0;
        loop {
            for (i, r) in reqs.iter().enumerate() {
                if r.arrive_at == step {
                    live[i] = Some(e.add_request(prompts[i].clone(), SamplingParams::greedy(r.max_tokens)).unwrap());
                }
                if let (Some((at, m)), Some((id, _))) = (r.fork, &live[i]) {
                    if at + r.arrive_at == step && outs[i].finished.is_none() {
                        let child_prompt = [&prompts[i][..], &outs[i].tokens[..]].concat();
                        match e.fork(*id, SamplingParams::greedy(m)) {
                            Ok((_, rx)) => forks.push((child_prompt, m, rx, Outcome::default())),
                            Err(err) => prop_assert!(child_prompt.len() >= MAX_LEN, "{}", err),
                        }
                    }
                }
                if r.cancel_at.map(|c| c + r.arrive_at) == Some(step) {
                    if let Some((id, _)) = &live[i] {
                        e.cancel(*id);
                    }
                }
            }
            let more = e.step().unwrap();
            e.block_manager().check_invariants().map_err(TestCaseError::fail)?;
            for (l, o) in live.iter_mut().zip(&mut outs) {
                if let Some((_, rx)) = l {
                    drain(rx, o);
                }
            }
            for (_, _, rx, o) in &mut forks {
                drain(rx, o);
            }
            step += 1;
            prop_assert!(step < 5_000, "no progress");
            if !more && step > 20 + 30 {
                break;
            }
        }
        for (i, (r, o)) in reqs.iter().zip(&outs).enumerate() {
            let n = r.max_tokens.min(MAX_LEN - prompts[i].len());
            let reference = reference_greedy(&prompts[i], n, VOCAB);
            let (reason, prompt_tokens, completion) = o.finished.clone().expect("finished");
            prop_assert_eq!(prompt_tokens, prompts[i].len());
            match reason {
                FinishReason::Length => {
                    prop_assert_eq!(&o.tokens, &reference);
                    prop_assert_eq!(completion, n);
                }
                FinishReason::Cancelled => {
                    prop_assert!(r.cancel_at.is_some());
                    prop_assert_eq!(&o.tokens[..], &reference[..o.tokens.len()]);
                }
                other => prop_assert!(false, "unexpected finish {:?}", other),
            }
        }
        for (prompt, m, _, o) in &forks {
            let n = (*m).min(MAX_LEN - prompt.len());
            prop_assert_eq!(&o.tokens, &reference_greedy(prompt, n, VOCAB));
            prop_assert_eq!(o.finished.clone(), Some((FinishReason::Length, prompt.len(), n)));
        }
        let s = e.stats();
        prop_assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0));
    }
}
