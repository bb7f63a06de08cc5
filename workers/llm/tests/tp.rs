//! Tensor parallelism on CPU-executor devices with the host stand-in collective: each rank's
//! weight slices equal the same slice of the full tensor (safetensors and GGUF), TP=2 logits
//! equal TP=1 logits (llama, qwen2, qwen3 in f32; a GGUF), greedy tokens through the engine
//! are identical, decode steps of a split model take the graph path's per-bucket buffers
//! (run eagerly here, the same code a GPU captures) with the packed path's logits, and the
//! error cases are typed errors.
use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use llm_engine::{Engine, EngineConfig, Event, SamplingParams};
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{DecodeGraphs, ModelRunner, SeqChunk};
use llm_worker::shard::{byte_ranges, GgufSource, SafetensorsSource, Split, TpPlan, WeightKind};
use llm_worker::tp::{tp_devices, TpRunner};
use llm_worker::{Error, Family, ModelConfig};

fn write(family: Family, tie: Option<bool>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(family, Shape::TINY);
    r.seed = 5;
    r.dtype = DType::F32;
    if let Some(t) = tie {
        r.tie_word_embeddings = t;
    }
    r.write(dir.path()).unwrap();
    dir
}

fn write_gguf(family: Family, ty: GgmlDType) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut r = RandomModel::new(family, Shape::TINY);
    r.seed = 9;
    r.write_gguf(&path, ty).unwrap();
    (dir, path)
}

fn cpu_devs(n: usize) -> Vec<Device> {
    tp_devices("cpu-executor", n).unwrap().into_iter().map(|d| d.0).collect()
}

/// The part `split` of `full` (the reference: Candle's `narrow` of the whole tensor).
fn slice(full: &Tensor, split: Split) -> Tensor {
    match (split, full.rank()) {
        (Split::Full, _) => full.clone(),
        (Split::Rows { start, len }, _) => full.narrow(0, start, len).unwrap(),
        (Split::Cols { start, len }, 2) => full.narrow(1, start, len).unwrap(),
        (s, r) => panic!("{s:?} of a rank-{r} tensor"),
    }
}

fn kind_of(name: &str) -> WeightKind {
    let k = [
        ("q_proj", WeightKind::Q),
        ("k_proj", WeightKind::K),
        ("v_proj", WeightKind::V),
        ("o_proj", WeightKind::O),
        ("gate_proj", WeightKind::Gate),
        ("up_proj", WeightKind::Up),
        ("down_proj", WeightKind::Down),
        ("embed_tokens", WeightKind::Embed),
        ("lm_head", WeightKind::LmHead),
        ("attn_q.", WeightKind::Q),
        ("attn_k.", WeightKind::K),
        ("attn_v.", WeightKind::V),
        ("attn_output", WeightKind::O),
        ("ffn_gate", WeightKind::Gate),
        ("ffn_up", WeightKind::Up),
        ("ffn_down", WeightKind::Down),
        ("token_embd", WeightKind::Embed),
        ("output.weight", WeightKind::LmHead),
    ];
    k.iter().find(|(p, _)| name.contains(p)).map_or(WeightKind::Norm, |x| x.1)
}

fn assert_same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}");
    let (a, b) = (a.flatten_all().unwrap().to_vec1::<f32>().unwrap(), b.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    assert!(a == b, "{what}: values differ");
}

#[test]
fn safetensors_shards_equal_slices_of_the_full_tensors() {
    // qwen2: q/k/v biases; qwen3: per-head q/k norms and a tied head; llama: an untied head.
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let dir = write(family, None);
        let cfg = ModelConfig::from_hf_file(&dir.path().join("config.json")).unwrap();
        let full = candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
        let src = SafetensorsSource::open(dir.path()).unwrap();
        let mut kinds = std::collections::HashSet::new();
        for world in [1, 2] {
            for rank in 0..world {
                let plan = TpPlan::new(&cfg, rank, world).unwrap();
                for (name, t) in &full {
                    let kind = kind_of(name);
                    kinds.insert(format!("{kind:?}{}", if name.ends_with(".bias") { " bias" } else { "" }));
                    let got = src.get(name, t.dims(), plan.split(kind), DType::F32, &Device::Cpu).unwrap();
                    assert_same(&got, &slice(t, plan.split(kind)), &format!("{family:?} {name} rank {rank}/{world}"));
                }
            }
        }
        // Every kind of weight the family has was checked.
        let want = match family {
            Family::Qwen2 => 13,  // 10 kinds (Norm, Embed, LmHead, Q, K, V, O, Gate, Up, Down) + 3 biases
            Family::Qwen3 => 9,   // tied head: no lm_head tensor
            _ => 10,
        };
        assert_eq!(kinds.len(), want, "{family:?}: {kinds:?}");
    }
}

#[test]
#[allow(clippy::single_range_in_vec_init)] // lists of byte ranges
fn the_split_arithmetic() {
    let dir = write(Family::Llama, None);
    let cfg = ModelConfig::from_hf_file(&dir.path().join("config.json")).unwrap();
    // TINY: 4 heads of 16, 2 kv heads, intermediate 128, vocabulary 512.
    let p = TpPlan::new(&cfg, 1, 2).unwrap();
    assert_eq!(p.split(WeightKind::Q), Split::Rows { start: 32, len: 32 });
    assert_eq!(p.split(WeightKind::K), Split::Rows { start: 16, len: 16 });
    assert_eq!(p.split(WeightKind::V), Split::Rows { start: 16, len: 16 });
    assert_eq!(p.split(WeightKind::O), Split::Cols { start: 32, len: 32 });
    assert_eq!(p.split(WeightKind::Gate), Split::Rows { start: 64, len: 64 });
    assert_eq!(p.split(WeightKind::Down), Split::Cols { start: 64, len: 64 });
    assert_eq!(p.split(WeightKind::LmHead), Split::Rows { start: 256, len: 256 });
    assert_eq!(p.split(WeightKind::Norm), Split::Full);
    assert_eq!((p.local_heads(), p.local_kv_heads(), p.vocab_range()), (2, 1, 256..512));
    // Heads not divisible by 3; kv heads (2) not by 4.
    for (world, what) in [(3, "attention heads (4)"), (4, "key/value heads (2)")] {
        match TpPlan::new(&cfg, 0, world) {
            Err(Error::TensorParallel(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(TpPlan::new(&cfg, 2, 2), Err(Error::TensorParallel(_))));
    // A K-quant (256-element blocks of 144 bytes) cannot be cut at column 352; rows can.
    match byte_ranges("blk.0.ffn_down.weight", &[64, 704], 256, 144, Split::Cols { start: 352, len: 352 }) {
        Err(Error::TensorParallel(m)) => assert!(m.contains("whole blocks of 256") && m.contains("ffn_down"), "{m}"),
        other => panic!("{other:?}"),
    }
    let (r, dims) = byte_ranges("w", &[4, 512], 256, 144, Split::Cols { start: 256, len: 256 }).unwrap();
    assert_eq!((r, dims), (vec![144..288, 432..576, 720..864, 1008..1152], vec![4, 256]));
    let (r, dims) = byte_ranges("w", &[6, 512], 256, 144, Split::Rows { start: 2, len: 2 }).unwrap();
    assert_eq!((r, dims), (vec![576..1152], vec![2, 512]));
}

#[test]
fn gguf_shards_equal_slices_of_the_full_tensors() {
    for (family, ty) in [(Family::Qwen2, GgmlDType::Q8_0), (Family::Qwen3, GgmlDType::Q4_0)] {
        let (_d, path) = write_gguf(family, ty);
        let mut f = std::fs::File::open(&path).unwrap();
        let ct = gguf_file::Content::read(&mut f).unwrap();
        let cfg = ModelConfig::from_gguf(&ct, &path).unwrap();
        let mut src = GgufSource::open(&path).unwrap();
        let mut quantized = 0;
        for rank in 0..2 {
            let plan = TpPlan::new(&cfg, rank, 2).unwrap();
            for name in ct.tensor_infos.keys() {
                let full = ct.tensor(&mut f, name, &Device::Cpu).unwrap();
                quantized += usize::from(full.dtype() == ty);
                let split = plan.split(kind_of(name));
                let got = src.get(name, split, &Device::Cpu).unwrap();
                assert_eq!(got.dtype(), full.dtype(), "{name}");
                // Whole blocks are copied: the shard dequantizes to the slice of the full dequantization.
                assert_same(&got.dequantize(&Device::Cpu).unwrap(), &slice(&full.dequantize(&Device::Cpu).unwrap(), split), &format!("{family:?} {ty:?} {name} rank {rank}"));
            }
        }
        assert!(quantized > 10, "{quantized}");
    }
}

fn chunk(id: u64, tokens: &[u32], start: usize, table: &[u32]) -> SeqChunk {
    SeqChunk { seq_id: id, tokens: tokens.to_vec(), start_pos: start, block_table: table.to_vec(), sample: true }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// Two prefills (7 and 5 tokens) in one step, then 3 greedy decode steps of both, on one
/// runner: every step's logits.
fn steps(r: &mut TpRunner) -> Vec<Vec<Vec<f32>>> {
    let (ta, tb) = ([2u32, 0, 5], [1u32, 4, 3]);
    let a: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % 500).collect();
    let b: Vec<u32> = (0..5).map(|i| (i * 91 + 300) % 510).collect();
    let mut out = vec![r.step(&[chunk(1, &a, 0, &ta), chunk(2, &b, 0, &tb)]).unwrap()];
    for s in 0..3 {
        let last = out.last().unwrap();
        let (na, nb) = (argmax(&last[0]), argmax(&last[1]));
        out.push(r.step(&[chunk(1, &[na], 7 + s, &ta), chunk(2, &[nb], 5 + s, &tb)]).unwrap());
    }
    out
}

/// Largest difference over the largest magnitude of the reference.
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

/// TP=1 against TP=2 on `path`: logits within `bound` of the largest, greedy tokens equal.
fn compare(path: &std::path::Path, what: &str, bound: f32) {
    let mut one = TpRunner::load(path, &cpu_devs(1), 8, 4).unwrap();
    let mut two = TpRunner::load(path, &cpu_devs(2), 8, 4).unwrap();
    assert_eq!((one.world(), two.world()), (1, 2));
    let (l1, l2) = (steps(&mut one), steps(&mut two));
    let mut worst = 0f32;
    for (s, (x, y)) in l1.iter().zip(&l2).enumerate() {
        for (row, (a, b)) in x.iter().zip(y).enumerate() {
            assert_eq!(a.len(), 512, "{what}: the whole vocabulary");
            let e = max_rel(b, a);
            worst = worst.max(e);
            assert!(e < bound, "{what} step {s} row {row}: {e:.2e}");
            assert_eq!(argmax(a), argmax(b), "{what} step {s} row {row}: greedy token");
        }
    }
    eprintln!("{what}: TP=2 against TP=1, largest difference {worst:.2e} of the largest logit");
}

#[test]
fn tp2_logits_equal_tp1() {
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let dir = write(family, None);
        // f32: each rank's partial sums of o and down (32 and 64 terms) are added in another
        // order than one product's: differences of a few f32 ulps of the activations (2^-24
        // each), carried through 2 layers; bound 1e-5 of the largest logit.
        compare(dir.path(), &format!("{family:?}"), 1e-5);
    }
}

#[test]
fn tp2_logits_equal_tp1_gguf() {
    // GGUF with f32 tensors: the sliced-file loader and the forward of GGML weights. On our
    // device (the CPU executor here) a GGUF model runs bf16 activations (`gguf_dtype`), so
    // the ranks' partial sums of o and down, added in another order, round to different
    // bf16 values (2^-9 relative of an activation) and carry that through 2 layers and the
    // head: about 1e-2 of the largest logit (measured 1.2e-2); bound 3e-2 as below, and
    // the greedy tokens must agree.
    let (_d, path) = write_gguf(Family::Qwen3, GgmlDType::F32);
    compare(&path, "qwen3 gguf f32", 3e-2);
    // Q8_0: the products quantize their activations to 8-bit blocks first, so the ~1e-7
    // ordering differences move an occasional activation across a rounding boundary: a
    // step of 1/127 of its block's largest value, about 1/127/sqrt(64) = 1e-3 of a logit of
    // this 64-wide model per step taken, several over 2 layers and the head (measured
    // 9.4e-3); bound 3e-2 of the largest logit, and the greedy tokens must agree.
    compare(&path, "qwen2 gguf q8_0", 3e-2);
}

#[test]
fn greedy_tokens_through_the_engine_are_identical() {
    let dir = write(Family::Llama, None);
    let run = |n: usize| -> Vec<Vec<u32>> {
        let runner = TpRunner::load(dir.path(), &cpu_devs(n), 24, 4).unwrap();
        // A tight token budget: chunked prefill beside decodes.
        let config = EngineConfig { max_num_seqs: 4, max_batched_tokens: 8, max_model_len: 32, prefix_caching: true };
        let mut engine = Engine::try_new(runner, config).unwrap();
        let mut rxs = vec![];
        for (i, len) in [9usize, 4, 13].into_iter().enumerate() {
            let p: Vec<u32> = (0..len as u32).map(|t| (t * 53 + i as u32 * 7 + 1) % 500).collect();
            rxs.push(engine.add_request(p, SamplingParams::greedy(6)).unwrap().1);
        }
        while engine.step().unwrap() {}
        assert_eq!(engine.stats().blocks_used, 0);
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
    let (one, two) = (run(1), run(2));
    assert!(one.iter().all(|t| t.len() == 6), "{one:?}");
    assert_eq!(one, two);
}

#[test]
fn error_cases() {
    let dir = write(Family::Llama, None);
    // 4 heads on 3 devices.
    match TpRunner::load(dir.path(), &cpu_devs(3), 8, 4) {
        Err(Error::TensorParallel(m)) => assert!(m.contains("attention heads (4)") && m.contains("3"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("loaded 4 heads on 3 ranks"),
    }
    // Candle's CPU backend has no communicator; a size of 0.
    for (spec, n) in [("cpu", 2), ("cpu-executor", 0)] {
        assert!(matches!(tp_devices(spec, n), Err(Error::TensorParallel(_))), "{spec} x {n}");
    }
    // GPUs this build or machine cannot open (this CI machine has none).
    if !cfg!(feature = "cuda") {
        match tp_devices("cuda:0", 2) {
            Err(Error::TensorParallel(m)) => assert!(m.contains("cuda:0..cuda:1") && m.contains("cannot be opened"), "{m}"),
            other => panic!("{:?}", other.map(|v| v.len())),
        }
    }
    // A bad chunk is refused by every rank before any collective: an error, not a hang, and
    // the runner still works.
    let mut r = TpRunner::load(dir.path(), &cpu_devs(2), 8, 4).unwrap();
    let t0 = std::time::Instant::now();
    assert!(matches!(r.step(&[chunk(1, &[600], 0, &[0])]), Err(Error::Invalid(_))));
    assert!(matches!(r.copy_blocks(&[(0, 9)]), Err(Error::Invalid(_))));
    assert!(t0.elapsed().as_secs() < 30);
    assert_eq!(r.step(&[chunk(1, &[3, 4], 0, &[0])]).unwrap()[0].len(), 512);
}

#[test]
fn collectives_on_tensors_of_two_cpu_executor_ranks() {
    use llm_worker::tp::{communicators, TpCollective};
    let devs = cpu_devs(2);
    let comms = communicators(&devs).unwrap();
    let outs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(&devs)
            .map(|(c, d)| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    // A transposed (strided) view: gathered into a contiguous buffer first.
                    let x = Tensor::from_vec((0..6).map(|i| i as f32 + 10.0 * r).collect::<Vec<_>>(), (3, 2), d).unwrap().t().unwrap();
                    let sum = c.all_reduce_sum(&x).unwrap();
                    let sum16 = c.all_reduce_sum(&x.to_dtype(DType::BF16).unwrap()).unwrap();
                    let all = c.all_gather(&x.contiguous().unwrap()).unwrap();
                    (sum.to_vec2::<f32>().unwrap(), sum16.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap(), all.to_vec3::<f32>().unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Rank r holds x_r = [[0, 2, 4], [1, 3, 5]] + 10 r: the sum is 2 x_0 + 10 (exact in bf16 too).
    let want = vec![vec![10.0, 14.0, 18.0], vec![12.0, 16.0, 20.0]];
    for (sum, sum16, all) in &outs {
        assert_eq!((sum, sum16), (&want, &want));
        assert_eq!(all, &vec![vec![vec![0.0, 2.0, 4.0], vec![1.0, 3.0, 5.0]], vec![vec![10.0, 12.0, 14.0], vec![11.0, 13.0, 15.0]]]);
    }
}

/// A head size the paged kernels have (64), so pure-decode steps take the graph path.
const PAGED: Shape = Shape { vocab: 512, hidden: 128, intermediate: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 64, max_positions: 256 };

#[test]
fn tp2_decode_steps_take_the_graph_path_with_the_packed_paths_logits() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = RandomModel::new(Family::Llama, PAGED);
    m.seed = 17;
    m.dtype = DType::F16;
    m.write(dir.path()).unwrap();
    let load = |n: usize, mode: DecodeGraphs| {
        let mut r = TpRunner::load(dir.path(), &cpu_devs(n), 32, 4).unwrap();
        assert!(r.model().kernel_attention(), "f16, head size 64: the paged kernels");
        r.set_decode_graphs(mode).unwrap();
        r
    };
    // TP=1 and TP=2 on the graph path (eager on the CPU executor), TP=2 on the packed path.
    let (mut one, mut two, mut packed) = (load(1, DecodeGraphs::Captured), load(2, DecodeGraphs::Captured), load(2, DecodeGraphs::Off));
    // Three sequences, 6 blocks of 4 positions each; greedy tokens from TP=1.
    let tables: Vec<Vec<u32>> = (0..3u32).map(|i| (6 * i..6 * i + 6).collect()).collect();
    let mut toks: Vec<Vec<u32>> = [5usize, 9, 3].iter().enumerate().map(|(i, &n)| (0..n as u32).map(|t| (t * 61 + i as u32 * 17 + 3) % 500).collect()).collect();
    let (mut worst_packed, mut worst_tp1) = (0f32, 0f32);
    let mut live = 3;
    for step in 0..10 {
        // Steps 0-6: three sequences (bucket 4, one padding row), across block boundaries;
        // then one (bucket 1).
        if step == 7 {
            live = 1;
        }
        let batch: Vec<SeqChunk> = (0..live)
            .map(|i| {
                let t = &toks[i];
                if step == 0 {
                    chunk(i as u64, t, 0, &tables[i])
                } else {
                    chunk(i as u64, &t[t.len() - 1..], t.len() - 1, &tables[i])
                }
            })
            .collect();
        let (a, b, c) = (one.step(&batch).unwrap(), two.step(&batch).unwrap(), packed.step(&batch).unwrap());
        for (row, ((x, y), z)) in a.iter().zip(&b).zip(&c).enumerate() {
            let (e_packed, e_tp1) = (max_rel(y, z), max_rel(y, x));
            (worst_packed, worst_tp1) = (worst_packed.max(e_packed), worst_tp1.max(e_tp1));
            // The same kernels on each rank's cache; the paths differ in the products' row
            // counts (padded bucket) and the attention's split sizes: f32 sums in another
            // order, rounded to f16 (eps 4.9e-4) between ops, over 2 layers and the head
            // (the bound of the one-device graph test).
            assert!(e_packed < 5e-3, "step {step} row {row}: graph path against packed path {e_packed:.2e}");
            // Against one device, each rank's o and down partial sums are rounded to f16
            // before the all-reduce adds them: one rounding more per product, 4 per step.
            assert!(e_tp1 < 1e-2, "step {step} row {row}: TP=2 against TP=1 {e_tp1:.2e}");
            assert_eq!(argmax(y), argmax(x), "step {step} row {row}: greedy token");
        }
        for (i, l) in a.iter().enumerate() {
            toks[i].push(argmax(l));
        }
    }
    eprintln!("TP=2 graph path: largest difference {worst_packed:.2e} against the packed path, {worst_tp1:.2e} against TP=1");
    // Both ranks built the buckets TP=1 did (4, then 1); nothing is captured on the CPU
    // executor, and the packed runner built none.
    let (b1, b2) = (one.decode_buckets().unwrap(), two.decode_buckets().unwrap());
    let sizes: Vec<usize> = b1[0].iter().map(|b| b.0).collect();
    assert_eq!(sizes, [4, 1]);
    assert_eq!(b2, vec![b1[0].clone(), b1[0].clone()], "every rank's buckets");
    assert!(b2.iter().flatten().all(|b| !b.2), "no graphs on the CPU executor");
    assert_eq!(packed.decode_buckets().unwrap(), vec![vec![], vec![]]);
}
