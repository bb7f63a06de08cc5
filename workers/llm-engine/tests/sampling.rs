//! The host sampler against f64 references: exclusion sets, frequencies, logprobs, seeding.

use llm_engine::{HostSampler, SampleInput, Sampled, Sampler, SamplingParams};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;

fn sample(logits: &[f32], params: &SamplingParams, history: &[u32], rng: &mut ChaCha12Rng) -> Sampled {
    let mut input = [SampleInput { logits, params, history, rng }];
    HostSampler.sample(&mut input).pop().unwrap()
}

/// Draw counts over `n` draws.
fn counts(logits: &[f32], params: &SamplingParams, n: usize) -> Vec<usize> {
    let mut rng = ChaCha12Rng::seed_from_u64(1);
    let mut c = vec![0; logits.len()];
    for _ in 0..n {
        c[sample(logits, params, &[], &mut rng).token as usize] += 1;
    }
    c
}

/// Checks the counts against probabilities `p` (0 = excluded: never drawn) within 5 sigma.
fn check_freq(c: &[usize], p: &[f64]) {
    let n: usize = c.iter().sum();
    for (i, (&k, &pi)) in c.iter().zip(p).enumerate() {
        if pi == 0.0 {
            assert_eq!(k, 0, "excluded token {i} drawn: {c:?}");
        } else {
            let sigma = (n as f64 * pi * (1.0 - pi)).sqrt();
            assert!((k as f64 - n as f64 * pi).abs() <= 5.0 * sigma + 1.0, "token {i}: {k} of {n}, p {pi}: {c:?}");
        }
    }
}

/// Softmax of `l / t` restricted to `keep`, in f64.
fn probs(l: &[f32], t: f64, keep: &[usize]) -> Vec<f64> {
    let w: Vec<f64> = (0..l.len()).map(|i| if keep.contains(&i) { (l[i] as f64 / t).exp() } else { 0.0 }).collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

fn temp(t: f32) -> SamplingParams {
    SamplingParams { temperature: t, max_tokens: 1, ..Default::default() }
}

#[test]
fn greedy_is_argmax_lowest_id_on_ties() {
    let mut rng = ChaCha12Rng::seed_from_u64(0);
    let s = sample(&[0.5, 2.0, -1.0, 2.0], &SamplingParams::greedy(1), &[], &mut rng);
    assert_eq!(s.token, 1);
    assert_eq!((s.logprob, s.top_logprobs.len()), (None, 0));
    // NaN is never chosen.
    let s = sample(&[f32::NAN, 0.1, 0.0], &SamplingParams::greedy(1), &[], &mut rng);
    assert_eq!(s.token, 1);
}

#[test]
fn temperature_sampling_follows_softmax() {
    let l = [1.0, 0.0, -0.5, 0.7];
    for t in [0.5f32, 1.0, 2.0] {
        check_freq(&counts(&l, &temp(t), 20_000), &probs(&l, t as f64, &[0, 1, 2, 3]));
    }
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let l = [1.0, 3.0, 2.0, 0.5, 2.9];
    let sp = SamplingParams { top_k: Some(2), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[1, 4]));
    let sp = SamplingParams { top_k: Some(1), ..temp(5.0) };
    check_freq(&counts(&l, &sp, 1_000), &probs(&l, 1.0, &[1]));
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let p = [0.5f64, 0.3, 0.15, 0.05];
    let l: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
    // 0.5 < 0.7 <= 0.5 + 0.3: tokens 0 and 1.
    let sp = SamplingParams { top_p: Some(0.7), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[0, 1]));
    let sp = SamplingParams { top_p: Some(0.9), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[0, 1, 2]));
    let sp = SamplingParams { top_p: Some(0.3), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 1_000), &probs(&l, 1.0, &[0]));
    let sp = SamplingParams { top_p: Some(1.0), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[0, 1, 2, 3]));
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_top() {
    let p = [0.5f64, 0.3, 0.15, 0.05];
    let l: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
    // Threshold 0.25 * 0.5 = 0.125: tokens 0..=2.
    let sp = SamplingParams { min_p: Some(0.25), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[0, 1, 2]));
    let sp = SamplingParams { min_p: Some(0.5), ..temp(1.0) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 1.0, &[0, 1]));
    // After temperature 0.5 the probabilities are p^2 renormalised: 0.25/0.3875 ... min_p 0.3
    // keeps p_i^2 >= 0.3 * 0.25, i.e. tokens 0 and 1 (0.09 >= 0.075), not 2 (0.0225).
    let sp = SamplingParams { min_p: Some(0.3), ..temp(0.5) };
    check_freq(&counts(&l, &sp, 10_000), &probs(&l, 0.5, &[0, 1]));
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    let mut rng = ChaCha12Rng::seed_from_u64(0);
    let pen = SamplingParams { repetition_penalty: Some(1.2), logprobs: Some(3), ..SamplingParams::greedy(1) };
    // 2.0 / 1.2 = 1.67 < 1.9: token 1 wins once token 0 was seen (seen twice: penalised once).
    assert_eq!(sample(&[2.0, 1.9, -1.0], &pen, &[0, 0], &mut rng).token, 1);
    assert_eq!(sample(&[2.0, 1.9, -1.0], &pen, &[2], &mut rng).token, 0);
    // -0.5 * 1.2 = -0.6 < -0.55: token 1 wins when token 0 was seen.
    let s = sample(&[-0.5, -0.55, -3.0], &pen, &[0, 7], &mut rng);
    assert_eq!(s.token, 1);
    // Logprobs are those of the penalised logits.
    let pl = [-0.6f64, -0.55, -3.0];
    let lse = pl.iter().map(|x| x.exp()).sum::<f64>().ln();
    assert!((s.logprob.unwrap() as f64 - (-0.55 - lse)).abs() < 1e-6);
    assert!((s.top_logprobs[1].1 as f64 - (-0.6 - lse)).abs() < 1e-6);
}

#[test]
fn logprobs_of_the_processed_distribution() {
    let l = [1.0f32, 3.0, 2.0, 0.5, 2.9];
    let sp = SamplingParams { temperature: 0.5, top_k: Some(3), logprobs: Some(5), seed: Some(3), ..temp(0.5) };
    let mut rng = ChaCha12Rng::seed_from_u64(3);
    let s = sample(&l, &sp, &[], &mut rng);
    let p = probs(&l, 0.5, &[1, 2, 4]);
    assert!([1, 2, 4].contains(&s.token));
    assert!((s.logprob.unwrap() as f64 - p[s.token as usize].ln()).abs() < 1e-6);
    // Excluded tokens have no logprob: only three listed, most likely first.
    let ids: Vec<u32> = s.top_logprobs.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![1, 4, 2]);
    for &(id, lp) in &s.top_logprobs {
        assert!((lp as f64 - p[id as usize].ln()).abs() < 1e-6);
    }
}

#[test]
fn seeded_draws_are_reproducible() {
    let l: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
    let draw = |seed| {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        (0..100).map(|_| sample(&l, &temp(1.0), &[], &mut rng).token).collect::<Vec<_>>()
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

#[test]
fn validate_names_the_bad_field() {
    let ok = SamplingParams::greedy(1);
    assert!(ok.validate().is_ok());
    let bad = [
        (SamplingParams { temperature: -1.0, ..ok.clone() }, "temperature"),
        (SamplingParams { temperature: f32::INFINITY, ..ok.clone() }, "temperature"),
        (SamplingParams { top_p: Some(f32::NAN), ..ok.clone() }, "top_p"),
        (SamplingParams { top_p: Some(-0.1), ..ok.clone() }, "top_p"),
        (SamplingParams { min_p: Some(-0.1), ..ok.clone() }, "min_p"),
        (SamplingParams { repetition_penalty: Some(-1.0), ..ok.clone() }, "repetition_penalty"),
        (SamplingParams { max_tokens: 0, ..ok.clone() }, "max_tokens"),
        (SamplingParams { top_k: Some(0), ..ok.clone() }, "top_k"),
    ];
    for (sp, field) in bad {
        let e = sp.validate().unwrap_err();
        assert!(e.contains(field), "{e}");
    }
}

#[test]
fn ties_and_wide_top_p_sets_are_exact() {
    // 1000 equal logits: top-k and top-p keep the lowest ids; top-p 0.5 needs 500 candidates,
    // more than the first selection of 64.
    let l = vec![0.0f32; 1000];
    let c = counts(&l, &SamplingParams { top_k: Some(3), ..temp(1.0) }, 1_000);
    let mut p = vec![0.0; 1000];
    p[..3].fill(1.0 / 3.0);
    check_freq(&c, &p);
    let c = counts(&l, &SamplingParams { top_p: Some(0.5), ..temp(1.0) }, 2_000);
    assert!(c[500..].iter().all(|&k| k == 0), "a token past the top-p set was drawn");
    // Uniform over the 500 kept: the first 250 get half the draws.
    let lo: usize = c[..250].iter().sum();
    check_freq(&[lo, 2_000 - lo], &[0.5, 0.5]);
}

#[test]
fn greedy_fast_path_agrees_with_the_logprobs_path() {
    // Random rows (with ties and NaN), penalties on and off: the token is the same whether
    // logprobs are asked for (full processing) or not (single pass).
    let mut rng = ChaCha12Rng::seed_from_u64(9);
    for case in 0..200u64 {
        let l: Vec<f32> = (0..50u64)
            .map(|i| match (case * 31 + i * 7) % 23 {
                0 => f32::NAN,
                k => (k % 6) as f32 - 2.5,
            })
            .collect();
        let history: Vec<u32> = (0..10).map(|i| ((case + i * 13) % 50) as u32).collect();
        for pen in [None, Some(1.3), Some(0.7)] {
            let fast = SamplingParams { repetition_penalty: pen, ..SamplingParams::greedy(1) };
            let full = SamplingParams { logprobs: Some(1), ..fast.clone() };
            let a = sample(&l, &fast, &history, &mut rng);
            let b = sample(&l, &full, &history, &mut rng);
            assert_eq!(a.token, b.token, "case {case} penalty {pen:?}");
            assert_eq!(b.top_logprobs[0].0, b.token);
        }
    }
}

#[test]
fn top_p_set_over_a_large_vocabulary_equals_a_sorted_reference() {
    // The kept set (tokens with a finite logprob) against sorting all 3000 probabilities.
    for case in 0..4u64 {
        let l: Vec<f32> = (0..3000u64).map(|i| ((i * 2654435761 + case * 97) % 10007) as f32 / 1000.0).collect();
        for top_p in [0.05f32, 0.5, 0.9, 0.99] {
            let sp = SamplingParams { top_p: Some(top_p), logprobs: Some(3000), ..temp(0.7) };
            let mut rng = ChaCha12Rng::seed_from_u64(case);
            let s = sample(&l, &sp, &[], &mut rng);
            let mut got: Vec<u32> = s.top_logprobs.iter().map(|x| x.0).collect();
            got.sort();
            let p = probs(&l, 0.7, &(0..3000).collect::<Vec<_>>());
            let mut order: Vec<usize> = (0..3000).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let mut cum = 0.0;
            let n = order.iter().position(|&i| {
                cum += p[i];
                cum >= top_p as f64
            });
            let mut want: Vec<u32> = order[..=n.unwrap()].iter().map(|&i| i as u32).collect();
            want.sort();
            assert_eq!(got, want, "case {case} top_p {top_p}");
            assert!(want.contains(&s.token));
        }
    }
}
