//! The runner's logits against the unmodified `candle-transformers` models on Candle's CPU,
//! for the same random weights: a prompt (prefill), then a few decode steps, for llama
//! (llama3 rope scaling), mistral (and its sliding window), qwen2 (qkv bias), qwen3 (q/k
//! norm, tied embeddings), a quantized llama GGUF, and llama on our CPU executor.
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models as ct;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::runner::{ModelRunner, SeqChunk};
use llm_worker::{Family, LlamaRunner, Model, ModelConfig};
use std::path::Path;

const BS: usize = 4;
const PROMPT: [u32; 7] = [3, 77, 120, 5, 300, 42, 9];
const DECODE_STEPS: usize = 3;

/// A reference model: logits of the last position of `ids` at `offset`, as a flat vector.
trait Reference {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32>;
}

fn input(ids: &[u32]) -> Tensor {
    Tensor::new(ids, &Device::Cpu).unwrap().unsqueeze(0).unwrap()
}

struct Llama(ct::llama::Llama, ct::llama::Cache);
impl Reference for Llama {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset, &mut self.1).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct Mistral(ct::mistral::Model);
impl Reference for Mistral {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct Qwen2(ct::qwen2::ModelForCausalLM);
impl Reference for Qwen2 {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct Qwen3(ct::qwen3::ModelForCausalLM);
impl Reference for Qwen3 {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct QQwen2(ct::quantized_qwen2::ModelWeights);
impl Reference for QQwen2 {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct QQwen3(ct::quantized_qwen3::ModelWeights);
impl Reference for QQwen3 {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        self.0.forward(&input(ids), offset).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }
}
struct QLlama(ct::quantized_llama::ModelWeights, Device);
impl Reference for QLlama {
    fn logits(&mut self, ids: &[u32], offset: usize) -> Vec<f32> {
        let x = input(ids).to_device(&self.1).unwrap();
        self.0.forward(&x, offset).unwrap().flatten_all().unwrap().to_device(&Device::Cpu).unwrap().to_vec1().unwrap()
    }
}

fn vb(dir: &Path) -> VarBuilder<'static> {
    vb_of(dir, DType::F32)
}

fn vb_of(dir: &Path, dtype: DType) -> VarBuilder<'static> {
    unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], dtype, &Device::Cpu).unwrap() }
}

fn llama_config(c: &ModelConfig) -> ct::llama::Config {
    ct::llama::Config {
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        vocab_size: c.vocab_size,
        num_hidden_layers: c.num_layers,
        num_attention_heads: c.num_heads,
        num_key_value_heads: c.num_kv_heads,
        use_flash_attn: false,
        rms_norm_eps: c.rms_norm_eps,
        rope_theta: c.rope_theta as f32,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: c.rope_scaling.map(|s| match s {
            llm_worker::RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                ct::llama::Llama3RopeConfig { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings, rope_type: ct::llama::Llama3RopeType::Llama3 }
            }
            other => panic!("{other:?}"),
        }),
        max_position_embeddings: c.max_position_embeddings,
        tie_word_embeddings: c.tie_word_embeddings,
    }
}

fn reference(dir: &Path, c: &ModelConfig) -> Box<dyn Reference> {
    let act = candle_nn::Activation::Silu;
    match c.family {
        Family::Llama => {
            let cfg = llama_config(c);
            let cache = ct::llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
            Box::new(Llama(ct::llama::Llama::load(vb(dir), &cfg).unwrap(), cache))
        }
        Family::Mistral => {
            // Candle's window admits one key more than Hugging Face's (and ours): w - 1 there.
            let cfg = ct::mistral::Config {
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                intermediate_size: c.intermediate_size,
                num_hidden_layers: c.num_layers,
                num_attention_heads: c.num_heads,
                head_dim: Some(c.head_dim),
                num_key_value_heads: c.num_kv_heads,
                hidden_act: act,
                max_position_embeddings: c.max_position_embeddings,
                rms_norm_eps: c.rms_norm_eps,
                rope_theta: c.rope_theta,
                sliding_window: c.sliding_window.map(|w| w - 1),
                use_flash_attn: false,
            };
            Box::new(Mistral(ct::mistral::Model::new(&cfg, vb(dir)).unwrap()))
        }
        Family::Qwen2 => {
            let cfg = ct::qwen2::Config {
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                intermediate_size: c.intermediate_size,
                num_hidden_layers: c.num_layers,
                num_attention_heads: c.num_heads,
                num_key_value_heads: c.num_kv_heads,
                max_position_embeddings: c.max_position_embeddings,
                sliding_window: c.max_position_embeddings,
                max_window_layers: c.num_layers,
                tie_word_embeddings: c.tie_word_embeddings,
                rope_theta: c.rope_theta,
                rms_norm_eps: c.rms_norm_eps,
                use_sliding_window: false,
                hidden_act: act,
            };
            Box::new(Qwen2(ct::qwen2::ModelForCausalLM::new(&cfg, vb(dir)).unwrap()))
        }
        Family::Qwen3 => {
            let cfg = ct::qwen3::Config {
                vocab_size: c.vocab_size,
                hidden_size: c.hidden_size,
                intermediate_size: c.intermediate_size,
                num_hidden_layers: c.num_layers,
                num_attention_heads: c.num_heads,
                head_dim: c.head_dim,
                attention_bias: c.qkv_bias,
                num_key_value_heads: c.num_kv_heads,
                max_position_embeddings: c.max_position_embeddings,
                sliding_window: None,
                max_window_layers: c.num_layers,
                tie_word_embeddings: c.tie_word_embeddings,
                rope_theta: c.rope_theta,
                rms_norm_eps: c.rms_norm_eps,
                use_sliding_window: false,
                hidden_act: act,
            };
            Box::new(Qwen3(ct::qwen3::ModelForCausalLM::new(&cfg, vb(dir)).unwrap()))
        }
    }
}

/// Largest |a - b| over the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// Prefill then `DECODE_STEPS` greedy decode steps through the runner (blocks in a
/// scrambled order, so paging is exercised) and through the reference; every step's
/// logits within `tol` (relative to the largest logit).
fn compare(model: Model, reference: Box<dyn Reference>, tol: f32) {
    compare_steps(model, reference, tol, DECODE_STEPS)
}

fn compare_steps(model: Model, mut reference: Box<dyn Reference>, tol: f32, decode_steps: usize) {
    let mut runner = LlamaRunner::new(model, 16, BS).unwrap();
    let table: Vec<u32> = vec![9, 2, 14, 5];
    let mut ids = PROMPT.to_vec();
    let mut start = 0;
    for step in 0..=decode_steps {
        let chunk = ids[start..].to_vec();
        let ours = runner.step(&[SeqChunk { seq_id: 1, tokens: chunk.clone(), start_pos: start, block_table: table.clone(), sample: true }]).unwrap();
        let theirs = reference.logits(&chunk, start);
        let e = rel_err(&ours[0], &theirs);
        eprintln!("step {step}: relative error {e:.2e}");
        assert!(e <= tol, "step {step}: relative error {e:.3e} > {tol:.1e}");
        start = ids.len();
        ids.push(argmax(&theirs));
    }
}

fn write(family: Family, f: impl FnOnce(&mut RandomModel)) -> (tempfile::TempDir, ModelConfig) {
    let dir = tempfile::tempdir().unwrap();
    let mut r = RandomModel::new(family, Shape::TINY);
    r.seed = 7;
    f(&mut r);
    r.write(dir.path()).unwrap();
    let c = ModelConfig::from_hf_file(&dir.path().join("config.json")).unwrap();
    (dir, c)
}

// f32 everywhere: the only differences are summation orders of the products (~1e-6 of the
// logits' scale); 1e-4 leaves room for that and catches any real difference (a wrong rope
// frequency or mask moves logits by > 1e-2).
const F32_TOL: f32 = 1e-4;

#[test]
fn llama_matches_candle_transformers() {
    let (dir, c) = write(Family::Llama, |r| r.llama3_scaling = Some((8.0, 1.0, 4.0, 64)));
    assert!(c.rope_scaling.is_some());
    compare(Model::load(dir.path(), &Device::Cpu).unwrap(), reference(dir.path(), &c), F32_TOL);
}

#[test]
fn mistral_matches_candle_transformers() {
    let (dir, c) = write(Family::Mistral, |_| {});
    compare(Model::load(dir.path(), &Device::Cpu).unwrap(), reference(dir.path(), &c), F32_TOL);
}

#[test]
fn mistral_sliding_window_matches_candle_transformers() {
    // A window of 4 over a prompt of 7: the prefill's last rows see only part of the prompt.
    let (dir, c) = write(Family::Mistral, |r| r.sliding_window = Some(4));
    assert_eq!(c.sliding_window, Some(4));
    let mut reference = reference(dir.path(), &c);
    let mut runner = LlamaRunner::new(Model::load(dir.path(), &Device::Cpu).unwrap(), 8, BS).unwrap();
    let chunk = |tokens: &[u32], start: usize| SeqChunk { seq_id: 0, tokens: tokens.to_vec(), start_pos: start, block_table: vec![0, 1, 2], sample: true };
    let full = runner.step(&[chunk(&PROMPT, 0)]).unwrap();
    let theirs = reference.logits(&PROMPT, 0);
    let e = rel_err(&full[0], &theirs);
    assert!(e <= F32_TOL, "prefill: {e:.3e}");
    // Decode (Candle's model does not apply the window when decoding): the last token as a
    // decode step over the cache equals the prefill's last row.
    runner.step(&[SeqChunk { sample: false, ..chunk(&PROMPT[..6], 0) }]).unwrap();
    let step = runner.step(&[chunk(&PROMPT[6..], 6)]).unwrap();
    let e = rel_err(&step[0], &full[0]);
    assert!(e <= F32_TOL, "decode vs prefill: {e:.3e}");
    // And the window matters: without it the logits differ.
    let (dir2, _) = write(Family::Mistral, |r| r.sliding_window = None);
    let mut no_window = LlamaRunner::new(Model::load(dir2.path(), &Device::Cpu).unwrap(), 8, BS).unwrap();
    let other = no_window.step(&[chunk(&PROMPT, 0)]).unwrap();
    assert!(rel_err(&other[0], &full[0]) > 1e-3);
}

#[test]
fn qwen2_matches_candle_transformers() {
    let (dir, c) = write(Family::Qwen2, |_| {});
    assert!(c.qkv_bias);
    compare(Model::load(dir.path(), &Device::Cpu).unwrap(), reference(dir.path(), &c), F32_TOL);
}

#[test]
fn qwen3_matches_candle_transformers() {
    let (dir, c) = write(Family::Qwen3, |_| {});
    assert!(c.qk_norm && c.tie_word_embeddings);
    compare(Model::load(dir.path(), &Device::Cpu).unwrap(), reference(dir.path(), &c), F32_TOL);
}

#[test]
fn quantized_llama_gguf_matches_candle_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    gguf_llama::write_gguf(&path, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(candle_core::quantized::GgmlDType::Q4K), 3).unwrap();
    let mut f = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let reference = ct::quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap();
    // The same Candle CPU kernels on the same blocks: f32 activations, summation order only.
    compare(Model::load(&path, &Device::Cpu).unwrap(), Box::new(QLlama(reference, Device::Cpu)), F32_TOL);
}

#[test]
fn llama_on_the_cpu_executor_matches_candle_transformers() {
    let (dir, c) = write(Family::Llama, |_| {});
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    // Our kernels' f32 GEMM and reductions sum in other orders than Candle's CPU: 1e-4 still.
    compare(Model::load(dir.path(), &dev).unwrap(), reference(dir.path(), &c), F32_TOL);
}

#[test]
fn llama_bf16_error_within_twice_candles() {
    // bf16 weights; the reference is the same weights in f32 math. Both bf16 forwards round
    // every activation to 8 bits of mantissa (attention softmax in f32 in both), in other
    // orders: ours must stay within twice Candle's own bf16 error.
    let (dir, c) = write(Family::Llama, |r| r.dtype = DType::BF16);
    let model = Model::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(model.dtype, DType::BF16);
    let mut ours = LlamaRunner::new(model, 8, BS).unwrap();
    let cfg = llama_config(&c);
    let mut f32_ref = Llama(ct::llama::Llama::load(vb_of(dir.path(), DType::F32), &cfg).unwrap(), ct::llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap());
    let mut bf16_ref = Llama(ct::llama::Llama::load(vb_of(dir.path(), DType::BF16), &cfg).unwrap(), ct::llama::Cache::new(true, DType::BF16, &cfg, &Device::Cpu).unwrap());
    let mut ids = PROMPT.to_vec();
    let mut start = 0;
    for step in 0..=DECODE_STEPS {
        let chunk = ids[start..].to_vec();
        let o = ours.step(&[SeqChunk { seq_id: 0, tokens: chunk.clone(), start_pos: start, block_table: vec![3, 1, 0], sample: true }]).unwrap().remove(0);
        let exact = f32_ref.logits(&chunk, start);
        let theirs: Vec<f32> = bf16_ref.0.forward(&input(&chunk), start, &mut bf16_ref.1).unwrap().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap();
        let (e_ours, e_candle) = (rel_err(&o, &exact), rel_err(&theirs, &exact));
        eprintln!("step {step}: bf16 error ours {e_ours:.2e}, Candle's {e_candle:.2e}");
        assert!(e_candle > 0.0 && e_ours <= 2.0 * e_candle, "step {step}: ours {e_ours:.3e} vs Candle's {e_candle:.3e}");
        start = ids.len();
        ids.push(argmax(&exact));
    }
}

#[test]
fn quantized_llama_gguf_on_the_cpu_executor() {
    // Q4_0 weights on our quantized kernels (int8 matvec on q8_1 activations), against the
    // unmodified quantized_llama on the same device: the same QMatMul kernels on both sides,
    // so only our attention's and norms' summation orders differ (f32: 1e-4). (Against
    // Candle's CPU the logits differ by ~1e-2 of their scale: its activations are q8_0 with
    // f16 scales, ours q8_1 with f32 scales; candle-rocm's gguf_llm test bounds that.)
    // Prefill and one decode step: the CPU executor is slow.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    gguf_llama::write_gguf(&path, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(candle_core::quantized::GgmlDType::Q4_0), 5).unwrap();
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let mut f = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let reference = ct::quantized_llama::ModelWeights::from_gguf(content, &mut f, &dev).unwrap();
    let model = Model::load_gguf_as(&path, &dev, DType::F32).unwrap();
    compare_steps(model, Box::new(QLlama(reference, dev.clone())), F32_TOL, 1);
}

/// A GGUF whose layers mix GGML types as a Q4_K_M file does: layer 0's `attn_v` and
/// `ffn_up` in Q6_K, everything else Q4_K, so layer 0's q/k/v and gate/up stay separate
/// products while layer 1's are stacked at load. On our device (CPU executor, f32
/// activations) against the unmodified quantized_llama on the same device (the same
/// QMatMul kernels: summation orders only, f32 tolerance). Prefill and one decode step.
#[test]
fn quantized_llama_gguf_mixed_types_on_the_cpu_executor() {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    let dir = tempfile::tempdir().unwrap();
    let (src, path) = (dir.path().join("src.gguf"), dir.path().join("m.gguf"));
    gguf_llama::write_gguf(&src, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(GgmlDType::Q4K), 6).unwrap();
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|n| {
            let t = content.tensor(&mut f, n, &Device::Cpu).unwrap();
            let t = if n == "blk.0.attn_v.weight" || n == "blk.0.ffn_up.weight" { QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), GgmlDType::Q6K).unwrap() } else { t };
            (n.clone(), t)
        })
        .collect();
    let meta: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &meta, &refs).unwrap();
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W32);
    let mut f = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    assert_eq!(content.tensor_infos["blk.0.ffn_up.weight"].ggml_dtype, GgmlDType::Q6K);
    let reference = ct::quantized_llama::ModelWeights::from_gguf(content, &mut f, &dev).unwrap();
    let model = Model::load_gguf_as(&path, &dev, DType::F32).unwrap();
    compare_steps(model, Box::new(QLlama(reference, dev.clone())), F32_TOL, 1);
}

/// A Q4_K GGUF on our device (CPU executor) as `llm-worker` loads it (bf16 activations and
/// cache, the paged decode kernel), ten sequences at once: one prefill step of all ten
/// prompts, then two decode steps of ten rows (every quantized product past one launch's
/// 8 rows: two tiles of the int8 matvec on activations quantized once). Against Candle's
/// own quantized llama on `Device::Cpu` (f32 activations, q8_K activation codes), one per
/// sequence, and both against the exact forward of the same weights dequantized (f32
/// GGUF): our error must stay within 3x Candle's (both round the activations to 8-bit codes
/// before each product; ours also rounds every activation to bf16, 2^-9 relative, about
/// as much again), and our greedy token must be Candle's wherever its top two logits are
/// further apart than the two errors together.
#[test]
fn quantized_llama_q4k_bf16_decode_batch_on_the_cpu_executor() {
    use candle_core::quantized::GgmlDType;
    const SEQS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let (qpath, fpath) = (dir.path().join("q.gguf"), dir.path().join("f.gguf"));
    gguf_llama::write_gguf(&qpath, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(GgmlDType::Q4K), 9).unwrap();
    gguf_llama::write_gguf(&fpath, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Dequantized(GgmlDType::Q4K), 9).unwrap();
    let load_ref = |p: &Path| {
        let mut f = std::fs::File::open(p).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        QLlama(ct::quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap(), Device::Cpu)
    };
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W32);
    let model = Model::load(&qpath, &dev).unwrap();
    assert_eq!(model.dtype, DType::BF16);
    assert!(model.kernel_attention());
    let mut runner = LlamaRunner::new(model, 3 * SEQS + 2, BS).unwrap();
    let mut candle: Vec<QLlama> = (0..SEQS).map(|_| load_ref(&qpath)).collect();
    let mut exact: Vec<QLlama> = (0..SEQS).map(|_| load_ref(&fpath)).collect();
    // Prompts of 3..=7 tokens; blocks of each sequence in a scrambled order.
    let mut ids: Vec<Vec<u32>> = (0..SEQS).map(|s| PROMPT[..3 + s % 5].iter().map(|t| (t + 37 * s as u32) % 512).collect()).collect();
    let table = |s: usize| vec![(3 * s + 2) as u32, (3 * s) as u32, (3 * s + 1) as u32];
    let mut start = [0usize; SEQS];
    for step in 0..3 {
        let chunks: Vec<SeqChunk> = (0..SEQS).map(|s| SeqChunk { seq_id: s as u64, tokens: ids[s][start[s]..].to_vec(), start_pos: start[s], block_table: table(s), sample: true }).collect();
        let ours = runner.step(&chunks).unwrap();
        assert_eq!(ours.len(), SEQS);
        for s in 0..SEQS {
            let c = &chunks[s];
            let (theirs, want) = (candle[s].logits(&c.tokens, c.start_pos), exact[s].logits(&c.tokens, c.start_pos));
            let (e_ours, e_candle) = (rel_err(&ours[s], &want), rel_err(&theirs, &want));
            eprintln!("step {step} seq {s}: error ours {e_ours:.2e}, Candle's {e_candle:.2e}");
            assert!(e_candle > 0.0 && e_ours <= 3.0 * e_candle, "step {step} seq {s}: ours {e_ours:.3e} vs Candle's {e_candle:.3e}");
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            let mut sorted = theirs.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > (e_ours + e_candle) * scale {
                assert_eq!(argmax(&ours[s]), argmax(&theirs), "step {step} seq {s}: greedy token");
            }
            start[s] = ids[s].len();
            ids[s].push(argmax(&theirs));
        }
    }
}

#[test]
fn quantized_qwen2_and_qwen3_gguf_match_candle_transformers() {
    // This crate's GGUF writer (the random folder's weights quantized to Q8_0); Candle's CPU
    // kernels on both sides, f32 activations: summation order only.
    for family in [Family::Qwen2, Family::Qwen3] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut r = RandomModel::new(family, Shape::TINY);
        r.seed = 9;
        r.write_gguf(&path, candle_core::quantized::GgmlDType::Q8_0).unwrap();
        let model = Model::load(&path, &Device::Cpu).unwrap();
        assert_eq!(model.cfg.family, family);
        assert_eq!((model.cfg.qkv_bias, model.cfg.qk_norm, model.cfg.rope_interleaved), (family == Family::Qwen2, family == Family::Qwen3, false));
        let mut f = std::fs::File::open(&path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        let reference: Box<dyn Reference> = match family {
            Family::Qwen2 => Box::new(QQwen2(ct::quantized_qwen2::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap())),
            _ => Box::new(QQwen3(ct::quantized_qwen3::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap())),
        };
        compare(model, reference, F32_TOL);
    }
}

/// A Q4_K GGUF as `llm-worker` loads it on our device (bf16, CPU executor), three
/// sequences decoding together (3 rows: the int8 matvec in one launch), with the q8_1
/// codes of the products' inputs written by the norms and the activation
/// (`Model::set_fused_quantize`, the default) and without (each product quantizes its
/// input). After every decode layer's first norm the two paths run the same kernels on
/// the same values (the fused codes are `quantize_q8_1`'s, `candle-rocm`'s
/// `activations_with_codes_give_the_quantizing_products_bits`); only the first layer's
/// input norm is another kernel (its sum of squares in another order: a unit in the last
/// place of bf16 here and there). So the two must agree far more closely than either
/// agrees with the exact forward of the same weights dequantized (f32 GGUF, whose error
/// is the activations' 8-bit codes and bf16 roundings): within a tenth of the fused path's
/// own error, and both within 3x Candle's error on `Device::Cpu` (as the batch test above).
#[test]
fn quantized_llama_q4k_bf16_fused_codes_match_separate_quantization() {
    use candle_core::quantized::GgmlDType;
    const SEQS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let (qpath, fpath) = (dir.path().join("q.gguf"), dir.path().join("f.gguf"));
    gguf_llama::write_gguf(&qpath, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Quantized(GgmlDType::Q4K), 11).unwrap();
    gguf_llama::write_gguf(&fpath, &gguf_llama::LlamaShape::TINY, gguf_llama::Storage::Dequantized(GgmlDType::Q4K), 11).unwrap();
    let load_ref = |p: &Path| {
        let mut f = std::fs::File::open(p).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
        QLlama(ct::quantized_llama::ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap(), Device::Cpu)
    };
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let runner = |fused_quantize: bool| {
        let mut model = Model::load(&qpath, &dev).unwrap();
        assert_eq!(model.dtype, DType::BF16);
        model.set_fused_quantize(fused_quantize);
        LlamaRunner::new(model, 3 * SEQS + 2, BS).unwrap()
    };
    let (mut fused, mut separate) = (runner(true), runner(false));
    let mut candle: Vec<QLlama> = (0..SEQS).map(|_| load_ref(&qpath)).collect();
    let mut exact: Vec<QLlama> = (0..SEQS).map(|_| load_ref(&fpath)).collect();
    let mut ids: Vec<Vec<u32>> = (0..SEQS).map(|s| PROMPT[..4 + s].iter().map(|t| (t + 53 * s as u32) % 512).collect()).collect();
    let table = |s: usize| vec![(3 * s + 1) as u32, (3 * s + 2) as u32, (3 * s) as u32];
    let mut start = [0usize; SEQS];
    for step in 0..3 {
        let chunks: Vec<SeqChunk> = (0..SEQS).map(|s| SeqChunk { seq_id: s as u64, tokens: ids[s][start[s]..].to_vec(), start_pos: start[s], block_table: table(s), sample: true }).collect();
        let (a, b) = (fused.step(&chunks).unwrap(), separate.step(&chunks).unwrap());
        for s in 0..SEQS {
            let c = &chunks[s];
            let (theirs, want) = (candle[s].logits(&c.tokens, c.start_pos), exact[s].logits(&c.tokens, c.start_pos));
            let (e_a, e_b, e_candle, e_ab) = (rel_err(&a[s], &want), rel_err(&b[s], &want), rel_err(&theirs, &want), rel_err(&a[s], &b[s]));
            eprintln!("step {step} seq {s}: fused {e_a:.2e}, separate {e_b:.2e}, Candle {e_candle:.2e}, fused vs separate {e_ab:.2e}");
            assert!(e_a <= 3.0 * e_candle && e_b <= 3.0 * e_candle, "step {step} seq {s}: fused {e_a:.3e}, separate {e_b:.3e} vs Candle's {e_candle:.3e}");
            if step > 0 {
                // Decode steps (1 row per sequence): the fused codes.
                assert!(e_ab <= 0.1 * e_a.max(e_b), "step {step} seq {s}: fused vs separate {e_ab:.3e}, errors {e_a:.3e} / {e_b:.3e}");
            }
            start[s] = ids[s].len();
            ids[s].push(argmax(&want));
        }
    }
}
