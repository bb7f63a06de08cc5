//! Tensor parallelism on two GPUs (NCCL with the `cuda` feature, RCCL with `rocm`): TP=2
//! over GPUs 0 and 1 against TP=1 on GPU 0, logits and greedy tokens through the engine.
//!
//! Needs two GPUs and the library (`NCCL_LIBRARY` / `RCCL_LIBRARY` or the default names);
//! with fewer it prints SKIPPED and why on stderr and passes, unless
//! `COLLECTIVES_REQUIRE_GPU=1` (set by `tests/gpu/nvidia.sh` on a 2-GPU machine), which
//! makes that a failure.
#![cfg(any(feature = "cuda", feature = "rocm"))]
use candle_core::{DType, Device};
use llm_engine::{Engine, EngineConfig, Event, SamplingParams};
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::tp::{tp_devices, TpRunner};
use llm_worker::Family;

const KIND: &str = if cfg!(feature = "cuda") { "cuda" } else { "rocm" };

fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Two GPUs, or `None` after saying why the test is skipped.
fn two_gpus(test: &str) -> Option<Vec<Device>> {
    match tp_devices(&format!("{KIND}:0"), 2) {
        Ok(d) => {
            say(&format!("{test}: {} and {}", d[0].1, d[1].1));
            Some(d.into_iter().map(|d| d.0).collect())
        }
        Err(e) => {
            let reason = format!("needs 2 GPUs: {e}");
            if std::env::var("COLLECTIVES_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: {reason} (COLLECTIVES_REQUIRE_GPU=1)");
            }
            say(&format!("SKIPPED {test}: {reason}"));
            None
        }
    }
}

fn write(family: Family, dtype: DType) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(family, Shape::TINY);
    r.seed = 5;
    r.dtype = dtype;
    r.write(dir.path()).unwrap();
    dir
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

#[test]
fn tp2_logits_equal_tp1_on_two_gpus() {
    let Some(devs) = two_gpus("tp2_logits_equal_tp1_on_two_gpus") else { return };
    // f32: partial sums added in another order, and the GPU products' own blocking; bound
    // 1e-4 of the largest logit. bf16: each rank's partial o/down products are rounded to
    // bf16 before the sum (one rounding more than TP=1's), bound 3e-2 (a few bf16 ulps, 2^-8
    // each, accumulated over 2 layers).
    for (family, dtype, bound) in [(Family::Llama, DType::F32, 1e-4), (Family::Qwen2, DType::F32, 1e-4), (Family::Qwen3, DType::F32, 1e-4), (Family::Llama, DType::BF16, 3e-2)] {
        let dir = write(family, dtype);
        let mut one = TpRunner::load(dir.path(), &devs[..1], 8, 16).unwrap();
        let mut two = TpRunner::load(dir.path(), &devs, 8, 16).unwrap();
        let p: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 500).collect();
        let mut tok = p.clone();
        let mut start = 0;
        for step in 0..4 {
            let c = [SeqChunk { seq_id: 1, tokens: tok.clone(), start_pos: start, block_table: vec![3], sample: true }];
            let (a, b) = (one.step(&c).unwrap(), two.step(&c).unwrap());
            let e = max_rel(&b[0], &a[0]);
            say(&format!("{family:?} {dtype:?} step {step}: max relative difference {e:.2e}"));
            assert!(e < bound, "{family:?} {dtype:?} step {step}: {e:.2e}");
            start += tok.len();
            tok = vec![argmax(&a[0]) as u32];
        }
    }
}

#[test]
fn tp2_greedy_tokens_through_the_engine() {
    let Some(devs) = two_gpus("tp2_greedy_tokens_through_the_engine") else { return };
    let dir = write(Family::Llama, DType::F32);
    let run = |devs: &[Device]| -> Vec<Vec<u32>> {
        let runner = TpRunner::load(dir.path(), devs, 32, 16).unwrap();
        let config = EngineConfig { max_num_seqs: 4, max_batched_tokens: 16, max_model_len: 64, prefix_caching: true };
        let mut engine = Engine::try_new(runner, config).unwrap();
        let rxs: Vec<_> = [9u32, 4, 21].iter().map(|&n| engine.add_request((0..n).map(|t| (t * 53 + n) % 500).collect(), SamplingParams::greedy(12)).unwrap().1).collect();
        while engine.step().unwrap() {}
        rxs.into_iter()
            .map(|mut rx| {
                let mut t = vec![];
                while let Ok(ev) = rx.try_recv() {
                    if let Event::Token { id, .. } = ev {
                        t.push(id);
                    }
                }
                t
            })
            .collect()
    };
    let (one, two) = (run(&devs[..1]), run(&devs));
    say(&format!("TP=1 {one:?}\nTP=2 {two:?}"));
    assert_eq!(one, two);
}
