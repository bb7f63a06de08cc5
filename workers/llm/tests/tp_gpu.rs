//! Tensor parallelism on two GPUs (NCCL with the `cuda` feature, RCCL with `rocm`): TP=2
//! over GPUs 0 and 1 against TP=1 on GPU 0, logits and greedy tokens through the engine;
//! decode steps captured as graphs on both ranks (their all-reduces inside) against the
//! packed path; the errors for too few GPUs and a communicator that cannot be set up.
//!
//! Needs two GPUs and the library (`NCCL_LIBRARY` / `RCCL_LIBRARY` or the default names);
//! with fewer it prints SKIPPED and why on stderr and passes, unless
//! `COLLECTIVES_REQUIRE_GPU=1` (set by `tests/gpu/nvidia.sh` on a 2-GPU machine), which
//! makes that a failure.
#![cfg(any(feature = "cuda", feature = "rocm"))]
use candle_core::{DType, Device};
use llm_engine::{Engine, EngineConfig, Event, SamplingParams};
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{DecodeGraphs, ModelRunner, SeqChunk};
use llm_worker::tp::{tp_devices, TpRunner};
use llm_worker::{Error, Family};

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

/// A head size the paged kernels have (64), so pure-decode steps take the graph path.
const PAGED: Shape = Shape { vocab: 512, hidden: 128, intermediate: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 64, max_positions: 256 };

#[test]
fn tp2_decode_graphs_are_captured_on_both_ranks_and_match_the_packed_path() {
    let Some(devs) = two_gpus("tp2_decode_graphs_are_captured_on_both_ranks_and_match_the_packed_path") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut m = RandomModel::new(Family::Llama, PAGED);
    m.seed = 17;
    m.dtype = DType::BF16;
    m.write(dir.path()).unwrap();
    let load = |d: &[Device], mode: DecodeGraphs| {
        let mut r = TpRunner::load(dir.path(), d, 32, 16).unwrap();
        r.set_decode_graphs(mode).unwrap();
        r
    };
    let (mut one, mut two, mut packed) = (load(&devs[..1], DecodeGraphs::Captured), load(&devs, DecodeGraphs::Captured), load(&devs, DecodeGraphs::Off));
    // The same buffers run eagerly every step: what the graphs replay.
    let mut eager = load(&devs, DecodeGraphs::Eager);
    let tables: Vec<Vec<u32>> = (0..3u32).map(|i| vec![2 * i, 2 * i + 1]).collect();
    let mut toks: Vec<Vec<u32>> = [5usize, 9, 3].iter().enumerate().map(|(i, &n)| (0..n as u32).map(|t| (t * 61 + i as u32 * 17 + 3) % 500).collect()).collect();
    let (mut worst_packed, mut worst_tp1) = (0f32, 0f32);
    for step in 0..8 {
        // Step 0: the prefills; 1: the bucket's eager run and capture; 2..: replays.
        let batch: Vec<SeqChunk> = (0..3)
            .map(|i| {
                let t = &toks[i];
                let (tokens, start) = if step == 0 { (t.clone(), 0) } else { (t[t.len() - 1..].to_vec(), t.len() - 1) };
                SeqChunk { seq_id: i as u64, tokens, start_pos: start, block_table: tables[i].clone(), sample: true }
            })
            .collect();
        let (a, b, c) = (one.step(&batch).unwrap(), two.step(&batch).unwrap(), packed.step(&batch).unwrap());
        // A replay runs the eager step's kernels and collectives on the same buffers, in
        // the same order: the same bits.
        assert_eq!(b, eager.step(&batch).unwrap(), "step {step}: graph replay against the eager step");
        for (row, ((x, y), z)) in a.iter().zip(&b).zip(&c).enumerate() {
            let (e_packed, e_tp1) = (max_rel(y, z), max_rel(y, x));
            (worst_packed, worst_tp1) = (worst_packed.max(e_packed), worst_tp1.max(e_tp1));
            // bf16 (eps 3.9e-3): another summation order (padded bucket, split sizes)
            // against the packed path, one rounding more per row-parallel product against
            // TP=1; a few ulps over 2 layers and the head: bound 3e-2 (as the TP=1 test).
            assert!(e_packed < 3e-2, "step {step} row {row}: graph replay against packed {e_packed:.2e}");
            assert!(e_tp1 < 3e-2, "step {step} row {row}: TP=2 against TP=1 {e_tp1:.2e}");
        }
        for (i, l) in a.iter().enumerate() {
            toks[i].push(argmax(l) as u32);
        }
    }
    say(&format!("TP=2 decode graphs: largest difference {worst_packed:.2e} against the packed path, {worst_tp1:.2e} against TP=1"));
    let buckets = two.decode_buckets().unwrap();
    say(&format!("TP=2 decode buckets per rank: {buckets:?}"));
    assert_eq!(buckets.len(), 2);
    for (r, b) in buckets.iter().enumerate() {
        assert_eq!(b.iter().map(|b| (b.0, b.2)).collect::<Vec<_>>(), [(4, true)], "rank {r}: bucket 4 captured");
    }
    assert!(one.decode_buckets().unwrap()[0].iter().all(|b| b.2));
    assert!(eager.decode_buckets().unwrap().iter().flatten().all(|b| !b.2), "the eager runner captured nothing");
}

/// The child process of `errors_for_too_few_gpus_and_a_communicator_that_fails`: a
/// communicator over a library that cannot be loaded.
#[test]
fn communicator_failure_child() {
    if std::env::var("TP_GPU_CHILD").is_err() {
        return;
    }
    let devs: Vec<Device> = tp_devices(&format!("{KIND}:0"), 2).unwrap().into_iter().map(|d| d.0).collect();
    let dir = write(Family::Llama, DType::F32);
    match TpRunner::load(dir.path(), &devs, 8, 16) {
        Err(Error::Collective(m)) => {
            assert!(m.contains("/nonexistent/libtp-test.so") && m.contains("could not be loaded"), "{m}");
            say(&format!("CHILD OK: {m}"));
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a communicator over a missing library"),
    }
}

#[test]
fn errors_for_too_few_gpus_and_a_communicator_that_fails() {
    let Some(_devs) = two_gpus("errors_for_too_few_gpus_and_a_communicator_that_fails") else { return };
    // More ranks than GPUs.
    match tp_devices(&format!("{KIND}:0"), 64) {
        Err(Error::TensorParallel(m)) => assert!(m.contains("cannot be opened") && m.contains(&format!("{KIND}:0..{KIND}:63")), "{m}"),
        other => panic!("{:?}", other.map(|v| v.len())),
    }
    // The library is loaded once per process: the failing set-up runs in a child process
    // whose NCCL_LIBRARY / RCCL_LIBRARY name a file that does not exist.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "communicator_failure_child", "--nocapture", "--test-threads=1"])
        .env("TP_GPU_CHILD", "1")
        .env("NCCL_LIBRARY", "/nonexistent/libtp-test.so")
        .env("RCCL_LIBRARY", "/nonexistent/libtp-test.so")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    say(&text);
    assert!(out.status.success() && text.contains("CHILD OK"), "{text}");
}
