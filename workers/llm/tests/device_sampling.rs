//! `LlamaRunner`'s device draws ([`ModelRunner::step_sampled`]) against references on the
//! host, on the CPU executor (and on a GPU where one is built in):
//! - greedy rows: exactly the argmax of the logits the same step returns ([`LlamaRunner::run`]
//!   on a twin runner), on the packed prefill path and the decode-graph path, rows without a
//!   spec coming back as those logits bit for bit;
//! - seeded rows: the token `candle_rocm::llm_ops::sample` gives on Candle's CPU for those
//!   logits and key (identity), and over many keys the frequencies of the softmax at the
//!   temperature over the top-k set computed in f64 (a chi-square bound);
//! - bad specs are typed errors that change nothing.
use candle_core::{DType, Device, Tensor};
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{warm_up, DeviceSample, ModelRunner, RowOutput, SeqChunk};
use llm_worker::{Error, Family, LlamaRunner, Model};

/// A head size the paged kernels have (64), 2 layers.
const SHAPE: Shape = Shape { vocab: 512, hidden: 128, intermediate: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 64, max_positions: 256 };
const BLOCK: usize = 4;
const BLOCKS: usize = 80;

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(Family::Llama, SHAPE);
    r.seed = 5;
    r.dtype = DType::F16;
    r.write(dir.path()).unwrap();
    dir
}

/// The CPU executor, or a GPU when the tests were built with one and it is there.
fn devices() -> Vec<(Device, String)> {
    let mut d = vec![(candle_rocm::cpu_executor(candle_rocm::WaveSize::W64), "cpu-executor".to_string())];
    if let Some(g) = ["cuda:0", "rocm:0"].iter().find_map(|s| llm_worker::device(s).ok()) {
        d.push(g);
    }
    d
}

fn runner(dir: &tempfile::TempDir, dev: &Device) -> LlamaRunner {
    LlamaRunner::new(Model::load(dir.path(), dev).unwrap(), BLOCKS, BLOCK).unwrap()
}

fn greedy() -> Option<DeviceSample> {
    Some(DeviceSample { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, key: [0, 0] })
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0 as u32
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 101 + 5) % 500).collect()
}

/// Sequence `i` of a batch: blocks `8 i .. 8 i + 8` (32 positions).
fn table(i: usize) -> Vec<u32> {
    (8 * i as u32..8 * i as u32 + 8).collect()
}

#[test]
fn greedy_draws_are_the_argmax_of_the_steps_logits_and_host_rows_are_those_logits() {
    let dir = model_dir();
    for (dev, name) in devices() {
        // `a` draws, `b` (same weights, same steps) returns logits: the reference.
        let (mut a, mut b) = (runner(&dir, &dev), runner(&dir, &dev));
        let lens = [7usize, 3, 12, 5];
        let mut toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| prompt(n, i as u32)).collect();
        let mut start = vec![0usize; lens.len()];
        let mut drawn = 0;
        for step in 0..6 {
            let batch: Vec<SeqChunk> = (0..lens.len())
                .map(|i| SeqChunk { seq_id: i as u64, tokens: toks[i][start[i]..].to_vec(), start_pos: start[i], block_table: table(i), sample: true })
                .collect();
            // Row 1 without a spec (a host row) on every other step.
            let specs: Vec<Option<DeviceSample>> = (0..lens.len()).map(|i| if i == 1 && step % 2 == 0 { None } else { greedy() }).collect();
            let got = a.step_sampled(&batch, &specs).unwrap();
            let want = b.step(&batch).unwrap();
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                match (g, &specs[i]) {
                    (RowOutput::Token(t), Some(_)) => {
                        assert_eq!(*t, argmax(w), "{name}: step {step}, row {i}");
                        drawn += 1;
                    }
                    (RowOutput::Logits(l), None) => {
                        let bits = |r: &[f32]| r.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(l), bits(w), "{name}: step {step}, row {i}: host row");
                    }
                    _ => panic!("{name}: step {step}, row {i}: {g:?} for spec {:?}", specs[i]),
                }
            }
            for i in 0..lens.len() {
                start[i] = toks[i].len();
                toks[i].push(argmax(&want[i]));
            }
        }
        assert_eq!(drawn, 6 * 4 - 3);
        // Steps 1.. were pure decodes: the bucket of 4 ran them.
        assert_eq!(a.decode_buckets().iter().map(|x| x.0).collect::<Vec<_>>(), [4], "{name}");
    }
}

/// `n` one-token sequences of the same token at position 0 (their own blocks): equal
/// inputs, one row each.
fn same_row_batch(n: usize) -> Vec<SeqChunk> {
    (0..n).map(|i| SeqChunk { seq_id: i as u64, tokens: vec![42], start_pos: 0, block_table: vec![i as u32], sample: true }).collect()
}

/// A step of [`same_row_batch`] drawn with keys `(seed, 0..n)`.
fn same_row_step(r: &mut LlamaRunner, n: usize, spec: DeviceSample, seed: u32) -> (Vec<u32>, Vec<[u32; 2]>) {
    let keys: Vec<[u32; 2]> = (0..n as u32).map(|k| [seed, k]).collect();
    let specs: Vec<Option<DeviceSample>> = keys.iter().map(|&key| Some(DeviceSample { key, ..spec })).collect();
    let out = r.step_sampled(&same_row_batch(n), &specs).unwrap();
    let tokens = out
        .into_iter()
        .map(|o| match o {
            RowOutput::Token(t) => t,
            RowOutput::Logits(_) => panic!("a drawn row came back as logits"),
        })
        .collect();
    (tokens, keys)
}

#[test]
fn seeded_draws_match_the_kernel_on_candles_cpu_and_follow_the_truncated_softmax() {
    let dir = model_dir();
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut r = runner(&dir, &dev);
    let (t, k) = (1.5f32, 6u32);
    let spec = DeviceSample { temperature: t, top_k: k, top_p: 1.0, min_p: 0.0, key: [0, 0] };
    let p = candle_rocm::llm_ops::SamplingParams { temperature: t, top_k: k, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0 };
    // The kernel on Candle's CPU (the host copy of the device op): `rows` rows of logits,
    // row `i` drawn with key `keys[i]`.
    let reference = |rows: &[f32], keys: &[[u32; 2]]| -> Vec<u32> {
        let n = keys.len();
        let logits = Tensor::from_vec(rows.to_vec(), (n, SHAPE.vocab), &Device::Cpu).unwrap();
        let params = candle_rocm::llm_ops::sampling_params(&vec![p; n], &Device::Cpu).unwrap();
        let (s, st): (Vec<u32>, Vec<u32>) = keys.iter().map(|k| (k[0], k[1])).unzip();
        let keys = candle_rocm::llm_ops::sampling_keys(&s, &st, &Device::Cpu).unwrap();
        candle_rocm::llm_ops::sample(&logits, &params, None, &keys).unwrap().to_vec1().unwrap()
    };
    // Identity: the runner's draws are the kernel's on the same step's logits and keys.
    let n = 16;
    let logits: Vec<f32> = r.step(&same_row_batch(n)).unwrap().concat();
    let (tokens, keys) = same_row_step(&mut r, n, spec, 1000);
    assert_eq!(tokens, reference(&logits, &keys), "runner draws vs the kernel on Candle's CPU");
    let distinct: std::collections::BTreeSet<u32> = tokens.iter().copied().collect();
    assert!(distinct.len() > 1, "16 keys drew one token: {tokens:?}");
    // Greedy rows: the argmax.
    let row = &logits[..SHAPE.vocab];
    let (g, _) = same_row_step(&mut r, 3, greedy().unwrap(), 0);
    assert_eq!(g, vec![argmax(row); 3]);
    // Distribution: many keys over that row against softmax(l / T) over the k largest in f64.
    let draws = 1200;
    let keys: Vec<[u32; 2]> = (0..draws as u32).map(|i| [77, i]).collect();
    let mut counts = vec![0usize; SHAPE.vocab];
    for t in reference(&row.repeat(draws), &keys) {
        counts[t as usize] += 1;
    }
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let top = &ids[..k as usize];
    let w: Vec<f64> = top.iter().map(|&i| ((row[i] as f64 - row[top[0]] as f64) / t as f64).exp()).collect();
    let total: f64 = w.iter().sum();
    let outside: usize = counts.iter().enumerate().filter(|(i, _)| !top.contains(i)).map(|(_, c)| c).sum();
    assert_eq!(outside, 0, "a token outside the top {k}");
    let chi2: f64 = top
        .iter()
        .zip(&w)
        .map(|(&i, &wi)| {
            let e = draws as f64 * wi / total;
            (counts[i] as f64 - e).powi(2) / e
        })
        .sum();
    // 5 degrees of freedom: P(chi2 > 25) ~ 1.4e-4 for a right sampler.
    let freq: Vec<usize> = top.iter().map(|&i| counts[i]).collect();
    let prob: Vec<f64> = w.iter().map(|x| x / total).collect();
    assert!(chi2 < 25.0, "chi-square {chi2:.1} over the top {k}: counts {freq:?} vs probabilities {prob:?}");
}

#[test]
fn bad_specs_are_typed_errors_that_change_nothing() {
    let dir = model_dir();
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut r = runner(&dir, &dev);
    let batch = vec![SeqChunk { seq_id: 0, tokens: prompt(5, 0), start_pos: 0, block_table: table(0), sample: true }];
    let before = r.cache_tensor(0, true).unwrap().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    let bad = |s: DeviceSample| vec![Some(s)];
    let g = greedy().unwrap();
    for (specs, what) in [
        (vec![], "0 sampling specs for 1"),
        (vec![greedy(), greedy()], "2 sampling specs for 1"),
        (bad(DeviceSample { temperature: -1.0, ..g }), "temperature"),
        (bad(DeviceSample { temperature: f32::NAN, ..g }), "temperature"),
        (bad(DeviceSample { top_p: 0.0, ..g }), "top_p"),
        (bad(DeviceSample { min_p: 1.5, ..g }), "min_p"),
        (bad(DeviceSample { top_k: 1 << 24, ..g }), "top_k"),
    ] {
        let e = r.step_sampled(&batch, &specs).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)) && e.to_string().contains(what), "{what}: {e}");
    }
    let after = r.cache_tensor(0, true).unwrap().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(before, after, "a refused step wrote the cache");
}

#[test]
fn warm_up_runs_each_batch_and_checks_the_cache_size() {
    let dir = model_dir();
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut r = runner(&dir, &dev);
    // 3 sequences of 9 positions: 3 blocks each.
    warm_up(&mut r, 8, &[1, 3], 16, &[16, 32]).unwrap();
    let buckets: Vec<usize> = r.decode_buckets().iter().map(|b| b.0).collect();
    assert_eq!(buckets, [1, 4], "one decode bucket per batch size");
    let mixed: Vec<(usize, usize)> = r.mixed_buckets().iter().map(|b| (b.0, b.1)).collect();
    assert_eq!(mixed, [(1, 16), (1, 32), (4, 16), (4, 32)], "one mixed bucket per batch size and chunk size");
    let e = warm_up(&mut r, 8, &[BLOCKS], 16, &[]).unwrap_err();
    assert!(e.to_string().contains("cache of 80 blocks"), "{e}");
    // The runner still steps after the warm-up.
    let out = r.step(&[SeqChunk { seq_id: 0, tokens: prompt(5, 1), start_pos: 0, block_table: table(0), sample: true }]).unwrap();
    assert_eq!(out[0].len(), SHAPE.vocab);
}
