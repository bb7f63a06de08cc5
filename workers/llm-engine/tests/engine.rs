//! The engine against the paged-cache simulator and the direct reference (tests/common).

mod common;

use common::*;
use llm_engine::{Engine, EngineConfig, EngineError, EngineStats, FinishReason, SamplingParams};

const VOCAB: usize = 64;
const BS: usize = 16;

fn config(max_num_seqs: usize, max_batched_tokens: usize, prefix_caching: bool) -> EngineConfig {
    EngineConfig { max_num_seqs, max_batched_tokens, max_model_len: 128, prefix_caching }
}

fn engine(num_blocks: usize, cfg: EngineConfig) -> Engine<PagedSim> {
    let mut sim = PagedSim::new(BS, num_blocks, VOCAB);
    sim.max_num_seqs = cfg.max_num_seqs;
    sim.max_batched_tokens = cfg.max_batched_tokens;
    Engine::new(sim, cfg)
}

/// Runs `reqs` together to the end; returns each request's outcome and the final stats.
fn run(mut e: Engine<PagedSim>, reqs: &[(Vec<u32>, SamplingParams)]) -> (Vec<Outcome>, EngineStats, Engine<PagedSim>) {
    let mut rxs: Vec<_> = reqs.iter().map(|(p, sp)| e.add_request(p.clone(), sp.clone()).unwrap().1).collect();
    let mut outs: Vec<Outcome> = reqs.iter().map(|_| Outcome::default()).collect();
    let mut steps = 0;
    while e.step().unwrap() {
        for (rx, o) in rxs.iter_mut().zip(&mut outs) {
            drain(rx, o);
        }
        e.block_manager().check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    for (rx, o) in rxs.iter_mut().zip(&mut outs) {
        drain(rx, o);
        assert!(o.finished.is_some(), "a request never finished");
        assert_eq!(o.after_finish, 0, "events after Finished");
    }
    let stats = e.stats();
    assert_eq!((stats.running, stats.waiting, stats.blocks_used), (0, 0, 0), "{stats:?}");
    assert_eq!(stats.blocks_free, stats.blocks_total);
    (outs, stats, e)
}

/// Eight prompts of different lengths (1..100), half sharing a 40-token prefix, with different
/// token limits.
fn eight_requests() -> Vec<(Vec<u32>, SamplingParams)> {
    let lens = [5, 17, 33, 1, 48, 60, 12, 26];
    let max = [20, 7, 33, 15, 9, 25, 40, 3];
    let shared = tokens(99, 40, VOCAB);
    (0..8)
        .map(|i| {
            let mut p = tokens(i as u64, lens[i], VOCAB);
            if i % 2 == 1 {
                p = [shared.clone(), p].concat();
            }
            (p, SamplingParams::greedy(max[i]))
        })
        .collect()
}

fn check_greedy(reqs: &[(Vec<u32>, SamplingParams)], outs: &[Outcome]) {
    for ((p, sp), o) in reqs.iter().zip(outs) {
        assert_eq!(o.tokens, reference_greedy(p, sp.max_tokens, VOCAB), "prompt of {}", p.len());
        assert_eq!(o.finished, Some((FinishReason::Length, p.len(), sp.max_tokens)));
    }
}

#[test]
fn greedy_alone_equals_reference() {
    for (p, sp) in eight_requests() {
        let (outs, stats, _) = run(engine(64, config(8, 64, false)), &[(p.clone(), sp.clone())]);
        check_greedy(&[(p, sp)], &outs);
        assert_eq!(stats.preemptions, 0);
    }
}

#[test]
fn greedy_batched_with_seven_others_equals_reference() {
    let reqs = eight_requests();
    for prefix_caching in [false, true] {
        let (outs, stats, e) = run(engine(64, config(8, 64, prefix_caching)), &reqs);
        check_greedy(&reqs, &outs);
        assert_eq!(stats.preemptions, 0);
        assert!(e.runner().max_batch >= 4, "batched: {}", e.runner().max_batch);
        if prefix_caching {
            // The 40-token prefix holds 2 full blocks; three of the four requests find them.
            assert!(stats.prefix_cache_hit_tokens >= 32, "{stats:?}");
        } else {
            assert_eq!(stats.prefix_cache_hit_tokens, 0);
        }
    }
}

#[test]
fn greedy_through_preemption_and_recompute_equals_reference() {
    let reqs = eight_requests();
    // 10 blocks of 16: one sequence of max_model_len 128 needs 8.
    for (prefix_caching, budget) in [(false, 64), (true, 64), (false, 7), (true, 7)] {
        let (outs, stats, _) = run(engine(10, config(8, budget, prefix_caching)), &reqs);
        check_greedy(&reqs, &outs);
        assert!(stats.preemptions > 0, "no preemption: {stats:?}");
        assert!(stats.prompt_tokens_processed > reqs.iter().map(|r| r.0.len() as u64).sum::<u64>() - stats.prefix_cache_hit_tokens);
    }
}

#[test]
fn chunked_prefill_equals_whole_prefill() {
    let reqs = eight_requests();
    let (whole, _, e1) = run(engine(64, config(8, 1024, false)), &reqs);
    assert_eq!(e1.runner().partial_chunks, 0);
    for budget in [1, 3, 16] {
        let (chunked, _, e2) = run(engine(64, config(8, budget, false)), &reqs);
        assert!(e2.runner().partial_chunks > 0);
        for (a, b) in whole.iter().zip(&chunked) {
            assert_eq!(a.tokens, b.tokens);
        }
    }
    check_greedy(&reqs, &whole);
}

#[test]
fn max_num_seqs_and_budget_are_respected() {
    // The simulator asserts both limits on every batch.
    let reqs = eight_requests();
    let (outs, _, e) = run(engine(64, config(3, 20, true)), &reqs);
    check_greedy(&reqs, &outs);
    assert_eq!(e.runner().max_batch, 3);
}

#[test]
fn fork_shares_blocks_copy_on_write() {
    let prompt = tokens(5, 37, VOCAB); // 2 full blocks and a partial one
    let mut e = engine(32, config(8, 64, false));
    let (pid, mut prx) = e.add_request(prompt.clone(), SamplingParams::greedy(12)).unwrap();
    let mut parent = Outcome::default();
    while parent.tokens.len() < 3 {
        e.step().unwrap();
        drain(&mut prx, &mut parent);
    }
    let used = e.stats().blocks_used;
    let (_, mut crx) = e.fork(pid, SamplingParams::greedy(10)).unwrap();
    assert_eq!(e.stats().blocks_used, used, "a fork shares its parent's blocks");
    let mut child = Outcome::default();
    while e.step().unwrap() {
        drain(&mut prx, &mut parent);
        drain(&mut crx, &mut child);
    }
    drain(&mut prx, &mut parent);
    drain(&mut crx, &mut child);
    assert_eq!(parent.tokens, reference_greedy(&prompt, 12, VOCAB));
    let child_prompt = [prompt.clone(), parent.tokens[..3].to_vec()].concat();
    assert_eq!(child.tokens, reference_greedy(&child_prompt, 10, VOCAB));
    assert_eq!(child.finished, Some((FinishReason::Length, 40, 10)));
    assert!(e.runner().copies >= 1, "the shared partial block was copied");
    assert_eq!(e.stats().blocks_used, 0);
    assert!(matches!(e.fork(pid, SamplingParams::greedy(1)), Err(EngineError::UnknownSequence(_))));
}

#[test]
fn prefix_cache_reuses_full_blocks_and_verifies_tokens() {
    let mut e = engine(32, config(8, 256, true));
    let a = tokens(1, 64, VOCAB);
    let (o, s, e2) = run(e, &[(a.clone(), SamplingParams::greedy(4))]);
    e = e2;
    check_greedy(&[(a.clone(), SamplingParams::greedy(4))], &o);
    assert_eq!(s.prefix_cache_hit_tokens, 0);
    assert!(s.blocks_cached >= 4, "{s:?}");
    // Same 48 first tokens, then different: 3 blocks come from the cache.
    let b = [a[..48].to_vec(), tokens(2, 20, VOCAB)].concat();
    let (o, s, e2) = run(e, &[(b.clone(), SamplingParams::greedy(5))]);
    e = e2;
    check_greedy(&[(b, SamplingParams::greedy(5))], &o);
    assert_eq!(s.prefix_cache_hit_tokens, 48);
    // A 32-token prompt equal to a cached prefix: its last token is recomputed, so 1 block hits.
    let c = a[..32].to_vec();
    let (o, s, e2) = run(e, &[(c.clone(), SamplingParams::greedy(3))]);
    e = e2;
    check_greedy(&[(c, SamplingParams::greedy(3))], &o);
    assert_eq!(s.prefix_cache_hit_tokens, 48 + 16);
    // A different first block: no hit, although later blocks hold the same tokens.
    let mut d = a.clone();
    d[0] = (d[0] + 1) % VOCAB as u32;
    let (o, s, _) = run(e, &[(d.clone(), SamplingParams::greedy(3))]);
    check_greedy(&[(d, SamplingParams::greedy(3))], &o);
    assert_eq!(s.prefix_cache_hit_tokens, 48 + 16);
}

#[test]
fn prefix_cache_evicts_lru_when_blocks_are_needed() {
    // 9 blocks: request a caches 4 full blocks; b (unrelated, 120 tokens) needs 8 and evicts.
    let mut e = engine(9, config(8, 256, true));
    let a = tokens(1, 64, VOCAB);
    let (_, _, e2) = run(e, &[(a.clone(), SamplingParams::greedy(1))]);
    e = e2;
    let b = tokens(3, 120, VOCAB);
    let (o, _, e2) = run(e, &[(b.clone(), SamplingParams::greedy(4))]);
    e = e2;
    check_greedy(&[(b, SamplingParams::greedy(4))], &o);
    let (o, s, _) = run(e, &[(a.clone(), SamplingParams::greedy(2))]);
    check_greedy(&[(a, SamplingParams::greedy(2))], &o);
    assert!(s.prefix_cache_hit_tokens < 48, "evicted blocks were reused: {s:?}");
}

#[test]
fn blocks_return_after_finish_stop_cancel_and_dropped_receiver() {
    for prefix_caching in [false, true] {
        let mut e = engine(32, config(8, 64, prefix_caching));
        let p: Vec<Vec<u32>> = (0..4).map(|i| tokens(10 + i, 20 + 7 * i as usize, VOCAB)).collect();
        let eos = reference_greedy(&p[1], 6, VOCAB)[5];
        let first_eos = reference_greedy(&p[1], 6, VOCAB).iter().position(|&t| t == eos).unwrap();
        let (_, mut r0) = e.add_request(p[0].clone(), SamplingParams::greedy(10)).unwrap();
        let stop = SamplingParams { stop_token_ids: vec![eos], ..SamplingParams::greedy(30) };
        let (_, mut r1) = e.add_request(p[1].clone(), stop).unwrap();
        let (id2, mut r2) = e.add_request(p[2].clone(), SamplingParams::greedy(50)).unwrap();
        let (_, r3) = e.add_request(p[3].clone(), SamplingParams::greedy(50)).unwrap();
        let mut o = [Outcome::default(), Outcome::default(), Outcome::default()];
        for _ in 0..3 {
            e.step().unwrap();
        }
        let before = e.stats().blocks_used;
        e.cancel(id2);
        assert!(e.stats().blocks_used < before, "cancel frees blocks at once");
        drop(r3);
        while e.step().unwrap() {}
        for (rx, o) in [&mut r0, &mut r1, &mut r2].into_iter().zip(&mut o) {
            drain(rx, o);
        }
        assert_eq!(o[0].finished, Some((FinishReason::Length, p[0].len(), 10)));
        assert_eq!(o[0].tokens, reference_greedy(&p[0], 10, VOCAB));
        // The stop token ends the stream and is not sent; it counts as generated.
        assert_eq!(o[1].finished, Some((FinishReason::Stop, p[1].len(), first_eos + 1)));
        assert_eq!(o[1].tokens, reference_greedy(&p[1], first_eos, VOCAB));
        assert_eq!(o[2].finished.as_ref().unwrap().0, FinishReason::Cancelled);
        assert_eq!(o[2].tokens, reference_greedy(&p[2], o[2].tokens.len(), VOCAB));
        let s = e.stats();
        assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0), "{s:?}");
        assert!(!e.has_work());
        e.block_manager().check_invariants().unwrap();
    }
}

#[test]
fn stops_at_max_model_len() {
    let p = tokens(4, 120, VOCAB);
    let (o, _, _) = run(engine(8, config(2, 64, false)), &[(p.clone(), SamplingParams::greedy(1000))]);
    assert_eq!(o[0].finished, Some((FinishReason::Length, 120, 8)));
    assert_eq!(o[0].tokens, reference_greedy(&p, 8, VOCAB));
    // A prompt of exactly max_model_len still yields its one token (never written to the cache).
    let p = tokens(4, 128, VOCAB);
    let (o, _, _) = run(engine(8, config(2, 64, false)), &[(p.clone(), SamplingParams::greedy(5))]);
    assert_eq!(o[0].finished, Some((FinishReason::Length, 128, 1)));
    assert_eq!(o[0].tokens, reference_greedy(&p, 1, VOCAB));
}

/// Token t's text; 1 or 2 characters so stop strings straddle tokens.
fn piece(t: u32) -> &'static str {
    ["a", "bb", "c", "dd", "e", "ff", "g", "hh"][t as usize % 8]
}
fn decode(ids: &[u32]) -> String {
    ids.iter().map(|&t| piece(t)).collect()
}

fn engine_with_decoder() -> Engine<PagedSim> {
    // The engine decodes short windows (unsent tokens and 4 before), not whole completions.
    engine(32, config(8, 64, false)).with_decoder(Box::new(|ids: &[u32]| {
        assert!(ids.len() <= 12, "decoding {} tokens", ids.len());
        decode(ids)
    }))
}

#[test]
fn stop_strings_cut_the_match_and_the_token_it_starts_in() {
    let prompt = tokens(21, 9, VOCAB);
    let reference = reference_greedy(&prompt, 40, VOCAB);
    let text = decode(&reference);
    // Token ends in the text.
    let ends: Vec<usize> = (1..=reference.len()).map(|n| decode(&reference[..n]).len()).collect();
    for start_tok in [3, 10, 20] {
        for (off, len) in [(0, 1), (0, 3), (1, 2), (1, 4)] {
            let start = if start_tok == 0 { 0 } else { ends[start_tok - 1] } + off;
            let stop: String = text[start..(start + len).min(text.len())].to_string();
            let m = text.find(&stop).unwrap(); // the first occurrence is the one that stops
            let expect_sent: Vec<u32> = reference.iter().zip(&ends).take_while(|(_, &e)| e <= m).map(|(&t, _)| t).collect();
            let generated = ends.iter().position(|&e| e >= m + stop.len()).unwrap() + 1;
            let sp = SamplingParams { stop_strings: vec!["zz".into(), stop.clone()], ..SamplingParams::greedy(40) };
            let (o, _, _) = run(engine_with_decoder(), &[(prompt.clone(), sp)]);
            assert_eq!(o[0].tokens, expect_sent, "stop {stop:?}");
            assert!(!decode(&o[0].tokens).contains(&stop));
            assert_eq!(o[0].finished, Some((FinishReason::Stop, prompt.len(), generated)), "stop {stop:?}");
        }
    }
    // A stop string that only ever half-matches at the end: everything is sent at Length.
    let tail = format!("{}q", &text[text.len() - 1..]);
    let sp = SamplingParams { stop_strings: vec![tail], ..SamplingParams::greedy(40) };
    let (o, _, _) = run(engine_with_decoder(), &[(prompt.clone(), sp)]);
    assert_eq!(o[0].tokens, reference);
    assert_eq!(o[0].finished, Some((FinishReason::Length, prompt.len(), 40)));
}

#[test]
fn stop_strings_hold_back_only_possible_starts() {
    // Streaming: with stop "zz" (no token text has a z) every token is sent in its own step.
    let prompt = tokens(21, 9, VOCAB);
    let mut e = engine_with_decoder();
    let sp = SamplingParams { stop_strings: vec!["zz".into()], ..SamplingParams::greedy(6) };
    let (_, mut rx) = e.add_request(prompt.clone(), sp).unwrap();
    let mut o = Outcome::default();
    let mut seen = Vec::new();
    while e.step().unwrap() {
        drain(&mut rx, &mut o);
        seen.push(o.tokens.len());
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    drain(&mut rx, &mut o);
    assert_eq!(o.tokens, reference_greedy(&prompt, 6, VOCAB));
}

#[test]
fn seeded_sampling_is_reproducible_alone_and_batched() {
    let p = tokens(7, 23, VOCAB);
    let sp = |seed| SamplingParams { temperature: 0.8, top_k: Some(20), top_p: Some(0.95), seed: Some(seed), max_tokens: 30, ..Default::default() };
    let (alone, _, _) = run(engine(64, config(8, 64, false)), &[(p.clone(), sp(7))]);
    let mut reqs = eight_requests();
    reqs[3] = (p.clone(), sp(7));
    reqs[5].1 = sp(8);
    let (batched, _, _) = run(engine(10, config(8, 7, true)), &reqs);
    assert_eq!(alone[0].tokens, batched[3].tokens);
    let (other, _, _) = run(engine(64, config(8, 64, false)), &[(p.clone(), sp(8))]);
    assert_ne!(alone[0].tokens, other[0].tokens, "different seeds, same 30 tokens");
    assert_ne!(alone[0].tokens, reference_greedy(&p, 30, VOCAB), "sampling equals greedy");
}

#[test]
fn logprobs_are_log_softmax_of_the_logits() {
    let p = tokens(8, 19, VOCAB);
    let sp = SamplingParams { logprobs: Some(3), ..SamplingParams::greedy(5) };
    let (o, _, _) = run(engine(64, config(8, 64, false)), &[(p.clone(), sp)]);
    let mut h = p.clone();
    for (t, (lp, top)) in o[0].tokens.iter().zip(&o[0].logprobs) {
        let l = reference_logits(&h, VOCAB);
        let max = l.iter().map(|&x| x as f64).fold(f64::MIN, f64::max);
        let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        assert!((lp.unwrap() as f64 - (l[*t as usize] as f64 - lse)).abs() < 1e-5);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].0, *t);
        assert!(top[0].1 >= top[1].1 && top[1].1 >= top[2].1);
        for &(id, v) in top {
            assert!((v as f64 - (l[id as usize] as f64 - lse)).abs() < 1e-5);
        }
        h.push(*t);
    }
}

#[test]
fn bad_requests_are_rejected_and_change_nothing() {
    let mut e = engine(32, config(8, 64, false));
    let ok = SamplingParams::greedy(4);
    let cases: Vec<(Vec<u32>, SamplingParams)> = vec![
        (vec![1], SamplingParams { temperature: -0.1, ..ok.clone() }),
        (vec![1], SamplingParams { temperature: f32::NAN, ..ok.clone() }),
        (vec![1], SamplingParams { top_p: Some(0.0), ..ok.clone() }),
        (vec![1], SamplingParams { top_p: Some(1.5), ..ok.clone() }),
        (vec![1], SamplingParams { top_k: Some(0), ..ok.clone() }),
        (vec![1], SamplingParams { min_p: Some(1.5), ..ok.clone() }),
        (vec![1], SamplingParams { repetition_penalty: Some(0.0), ..ok.clone() }),
        (vec![1], SamplingParams { max_tokens: 0, ..ok.clone() }),
        (vec![1], SamplingParams { stop_strings: vec!["x".into()], ..ok.clone() }), // no decoder
    ];
    for (p, sp) in cases {
        let err = e.add_request(p, sp.clone()).unwrap_err();
        assert!(matches!(err, EngineError::InvalidParams(_)), "{sp:?}: {err}");
    }
    assert!(matches!(e.add_request(vec![], ok.clone()), Err(EngineError::EmptyPrompt)));
    assert!(matches!(
        e.add_request(vec![0; 129], ok.clone()),
        Err(EngineError::PromptTooLong { len: 129, max: 128 })
    ));
    assert!(!e.has_work());
    assert_eq!(e.stats(), EngineStats { blocks_total: 32, blocks_free: 32, ..Default::default() });
    assert!(!e.step().unwrap());
    assert_eq!(e.runner().steps, 0);
    let mut e = e.with_decoder(Box::new(decode));
    let empty = SamplingParams { stop_strings: vec![String::new()], ..ok.clone() };
    assert!(matches!(e.add_request(vec![1], empty), Err(EngineError::InvalidParams(_))));
    // The cache must hold one sequence of max_model_len (128 tokens = 8 blocks of 16).
    let r = Engine::try_new(PagedSim::new(BS, 7, VOCAB), config(8, 64, false));
    assert!(matches!(r, Err(EngineError::InvalidConfig(_))));
    let r = Engine::try_new(PagedSim::new(BS, 8, VOCAB), config(0, 64, false));
    assert!(matches!(r, Err(EngineError::InvalidConfig(_))));
}

#[test]
fn runner_failure_ends_the_batch_and_frees_blocks() {
    let mut e = engine(32, config(8, 64, true));
    e.runner_mut().fail_at_step = Some(2);
    let p = tokens(30, 25, VOCAB);
    let (_, mut rx) = e.add_request(p.clone(), SamplingParams::greedy(10)).unwrap();
    e.step().unwrap();
    e.step().unwrap();
    assert!(matches!(e.step(), Err(EngineError::Runner(_))));
    let mut o = Outcome::default();
    drain(&mut rx, &mut o);
    assert_eq!(o.finished.unwrap().0, FinishReason::Error("injected failure".into()));
    assert_eq!(e.stats().blocks_used, 0);
    // Still usable.
    let (o, _, _) = run(e, &[(p.clone(), SamplingParams::greedy(4))]);
    assert_eq!(o[0].tokens, reference_greedy(&p, 4, VOCAB));
}

#[test]
fn engine_is_send_for_a_send_runner() {
    // A server moves the engine onto its own stepping thread.
    fn send<T: Send>(_: &T) {}
    send(&engine(8, config(1, 1, false)));
}

#[test]
fn requests_arriving_while_others_decode_and_waiting_cancels_and_forks() {
    let reqs = eight_requests();
    // Room for 3 at once, so later arrivals wait; 9 blocks force preemptions too.
    let mut e = engine(9, config(3, 24, true));
    let mut rxs = Vec::new();
    let mut outs: Vec<Outcome> = Vec::new();
    let mut ids = Vec::new();
    for (p, sp) in &reqs {
        let (id, rx) = e.add_request(p.clone(), sp.clone()).unwrap();
        ids.push(id);
        rxs.push(rx);
        outs.push(Outcome::default());
        e.step().unwrap();
    }
    // The last request is still waiting: cancelling it sends Finished with nothing else.
    assert!(e.stats().waiting > 0);
    e.cancel(ids[7]);
    // A fork of a waiting request computes its prompt itself.
    let (_, mut frx) = e.fork(ids[6], SamplingParams::greedy(5)).unwrap();
    let mut fork = Outcome::default();
    while e.step().unwrap() {
        e.block_manager().check_invariants().unwrap();
    }
    for (rx, o) in rxs.iter_mut().zip(&mut outs) {
        drain(rx, o);
    }
    drain(&mut frx, &mut fork);
    check_greedy(&reqs[..7], &outs[..7]);
    assert_eq!(outs[7].finished, Some((FinishReason::Cancelled, reqs[7].0.len(), 0)));
    assert!(outs[7].tokens.is_empty());
    assert_eq!(fork.tokens, reference_greedy(&reqs[6].0, 5, VOCAB));
    let s = e.stats();
    assert!(s.preemptions > 0, "{s:?}");
    assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0));
}

/// Token t's bytes: some tokens are lone UTF-8 lead or continuation bytes, as in a byte-level
/// tokenizer; C3 A9 is "é".
fn byte_piece(t: u32) -> &'static [u8] {
    [&b"a"[..], &[0xC3], &[0xA9], b"b", &[0xE2], &[0x82], &[0xAC], b" "][t as usize % 8]
}
fn byte_decode(ids: &[u32]) -> String {
    String::from_utf8_lossy(&ids.iter().flat_map(|&t| byte_piece(t).iter().copied()).collect::<Vec<u8>>()).into_owned()
}

#[test]
fn stop_strings_on_characters_split_across_tokens() {
    // A prompt whose greedy continuation contains "é" (made of two tokens).
    let (prompt, reference, n) = (0..100)
        .find_map(|seed| {
            let prompt = tokens(seed, 9, VOCAB);
            let r = reference_greedy(&prompt, 100, VOCAB);
            let n = (1..=r.len()).find(|&n| byte_decode(&r[..n]).contains('é'))?;
            Some((prompt, r, n))
        })
        .expect("some prompt yields an é");
    let mut e = engine(32, config(8, 64, false)).with_decoder(Box::new(byte_decode));
    let sp = SamplingParams { stop_strings: vec!["é".into()], ..SamplingParams::greedy(100) };
    let (_, mut rx) = e.add_request(prompt.clone(), sp).unwrap();
    let mut o = Outcome::default();
    while e.step().unwrap() {
        drain(&mut rx, &mut o);
        // A token ending in an incomplete character is held until the character completes.
        assert!(!byte_decode(&o.tokens).ends_with('\u{FFFD}'), "{:?}", o.tokens);
    }
    drain(&mut rx, &mut o);
    // The lead byte (token n-2) and the continuation byte (n-1) are not sent.
    assert_eq!(o.tokens, reference[..n - 2]);
    assert_eq!(o.finished, Some((FinishReason::Stop, prompt.len(), n)));
    // Without the stop string, every token is sent (none is held back forever).
    let (o, _, _) = run(
        engine(32, config(8, 64, false)).with_decoder(Box::new(byte_decode)),
        &[(prompt.clone(), SamplingParams { stop_strings: vec!["zz".into()], ..SamplingParams::greedy(100) })],
    );
    assert_eq!(o[0].tokens, reference);
}

#[test]
fn runner_returning_the_wrong_number_of_rows_is_an_error() {
    struct Short(PagedSim);
    impl llm_engine::ModelRunner for Short {
        type Error = SimError;
        fn block_size(&self) -> usize {
            self.0.block_size
        }
        fn num_blocks(&self) -> usize {
            self.0.num_blocks
        }
        fn step(&mut self, batch: &[llm_engine::SeqChunk]) -> Result<Vec<Vec<f32>>, SimError> {
            let mut rows = self.0.step(batch)?;
            rows.pop();
            Ok(rows)
        }
        fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), SimError> {
            self.0.copy_blocks(pairs)
        }
    }
    let mut e = Engine::new(Short(PagedSim::new(BS, 16, VOCAB)), config(4, 64, false));
    let (_, mut rx) = e.add_request(vec![1, 2, 3], SamplingParams::greedy(3)).unwrap();
    assert!(matches!(e.step(), Err(EngineError::RunnerOutput(_))));
    let mut o = Outcome::default();
    drain(&mut rx, &mut o);
    assert!(matches!(o.finished, Some((FinishReason::Error(_), 3, 0))));
    assert_eq!(e.stats().blocks_used, 0);
    assert!(!e.has_work());
}

#[test]
fn events_reach_async_and_blocking_readers_while_the_engine_steps_on_its_own_thread() {
    let a = tokens(40, 30, VOCAB);
    let b = tokens(41, 12, VOCAB);
    let mut e = engine(32, config(4, 64, false));
    let (_, mut rx_async) = e.add_request(a.clone(), SamplingParams::greedy(20)).unwrap();
    let (_, mut rx_blocking) = e.add_request(b.clone(), SamplingParams::greedy(15)).unwrap();
    let stepper = std::thread::spawn(move || while e.step().unwrap() {});
    let reader = std::thread::spawn(move || {
        let mut ids = Vec::new();
        while let Some(ev) = rx_blocking.blocking_recv() {
            if let llm_engine::Event::Token { id, .. } = ev {
                ids.push(id);
            }
        }
        ids
    });
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let got_a = rt.block_on(async move {
        let mut ids = Vec::new();
        while let Some(ev) = rx_async.recv().await {
            if let llm_engine::Event::Token { id, .. } = ev {
                ids.push(id);
            }
        }
        ids
    });
    stepper.join().unwrap();
    assert_eq!(got_a, reference_greedy(&a, 20, VOCAB));
    assert_eq!(reader.join().unwrap(), reference_greedy(&b, 15, VOCAB));
}

#[test]
fn prefix_cache_keys_blocks_by_their_whole_prefix() {
    // Blocks of equal tokens after different first blocks hold different K/V: a request must
    // get the one after its own first block.
    let mut e = engine(32, config(8, 256, true));
    let (p, p2, q) = (tokens(50, 16, VOCAB), tokens(51, 16, VOCAB), tokens(52, 16, VOCAB));
    let a = [p.clone(), q.clone(), tokens(53, 5, VOCAB)].concat();
    let b = [p2.clone(), q.clone(), tokens(54, 5, VOCAB)].concat();
    let n = [p2.clone(), q.clone(), tokens(55, 5, VOCAB)].concat();
    for (prompt, hits) in [(a, 0), (b, 0), (n, 32)] {
        let (o, s, e2) = run(e, &[(prompt.clone(), SamplingParams::greedy(4))]);
        e = e2;
        check_greedy(&[(prompt, SamplingParams::greedy(4))], &o);
        assert_eq!(s.prefix_cache_hit_tokens, hits, "{s:?}");
    }
}
