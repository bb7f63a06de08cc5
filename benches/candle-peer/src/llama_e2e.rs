//! The end-to-end LLM benchmark both backends run: an unmodified `candle-transformers`
//! llama with random weights, prefill of a prompt, then greedy decode steps with the KV
//! cache. The same file is compiled against Candle's own CUDA backend (this crate) and
//! against our backend, so both sides run exactly this code.
use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig};
use std::time::Instant;

/// A llama-3.2-1B-shaped configuration (16 layers, hidden 2048, 32 heads / 8 KV heads,
/// MLP 8192, vocabulary 128256, tied embeddings).
pub fn config_1b() -> Config {
    LlamaConfig {
        hidden_size: 2048,
        intermediate_size: 8192,
        vocab_size: 128256,
        num_hidden_layers: 16,
        num_attention_heads: 32,
        num_key_value_heads: Some(8),
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        bos_token_id: Some(1),
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 4096,
        tie_word_embeddings: Some(true),
    }
    .into_config(false)
}

/// Timings of one run.
#[derive(Debug, Clone)]
pub struct Report {
    pub prompt_tokens: usize,
    pub decode_steps: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// The generated token ids (greedy).
    pub tokens: Vec<u32>,
}

impl Report {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s
    }
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode_s
    }
}

/// A model with random weights (Candle's default initialisers, drawn on `device`).
pub fn random_model(cfg: &Config, dtype: DType, device: &Device) -> Result<Llama> {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, dtype, device);
    Llama::load(vb, cfg)
}

/// The two timed parts of [`run`].
#[allow(dead_code)] // used by our side only (`--profile`)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    Decode,
}

/// Prefill `prompt_tokens` pseudo-random tokens, then `decode_steps` greedy steps.
pub fn run(model: &Llama, cfg: &Config, dtype: DType, device: &Device, prompt_tokens: usize, decode_steps: usize) -> Result<Report> {
    run_phased(model, cfg, dtype, device, prompt_tokens, decode_steps, &mut |_| Ok(()))
}

/// [`run`], calling `at(Some(phase))` before each phase's timed part and `at(None)` after
/// the last one (outside the timed parts: a profiler collects there).
pub fn run_phased(
    model: &Llama,
    cfg: &Config,
    dtype: DType,
    device: &Device,
    prompt_tokens: usize,
    decode_steps: usize,
    at: &mut dyn FnMut(Option<Phase>) -> Result<()>,
) -> Result<Report> {
    let mut cache = Cache::new(true, dtype, cfg, device)?;
    let mut s = 0x9e3779b97f4a7c15u64;
    let prompt: Vec<u32> = (0..prompt_tokens)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % cfg.vocab_size as u64) as u32
        })
        .collect();
    at(Some(Phase::Prefill))?;
    device.synchronize()?;
    let t = Instant::now();
    let input = Tensor::new(prompt.as_slice(), device)?.unsqueeze(0)?;
    let logits = model.forward(&input, 0, &mut cache)?;
    let mut next = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?[0];
    let prefill_s = t.elapsed().as_secs_f64();
    let mut tokens = vec![next];
    at(Some(Phase::Decode))?;
    let t = Instant::now();
    for i in 0..decode_steps {
        let input = Tensor::new(&[next], device)?.unsqueeze(0)?;
        let logits = model.forward(&input, prompt_tokens + i, &mut cache)?;
        next = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?[0];
        tokens.push(next);
    }
    let decode_s = t.elapsed().as_secs_f64();
    at(None)?;
    Ok(Report { prompt_tokens, decode_steps, prefill_s, decode_s, tokens })
}

/// Parses `--prompt N --steps N --dtype bf16|f16|f32 --reps N` (defaults 512, 128, bf16, 3).
pub fn args() -> (usize, usize, DType, usize) {
    let a: Vec<String> = std::env::args().collect();
    let get = |k: &str| a.iter().position(|x| x == k).and_then(|i| a.get(i + 1)).cloned();
    let prompt = get("--prompt").map_or(512, |v| v.parse().expect("--prompt N"));
    let steps = get("--steps").map_or(128, |v| v.parse().expect("--steps N"));
    let dtype = match get("--dtype").as_deref() {
        None | Some("bf16") => DType::BF16,
        Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        Some(o) => panic!("--dtype {o}: bf16, f16 or f32"),
    };
    let reps = get("--reps").map_or(3, |v| v.parse().expect("--reps N"));
    (prompt, steps, dtype, reps)
}

/// Warm-up, then `reps` timed runs; prints one JSON line per run and returns the best.
#[allow(dead_code)] // our side calls bench_keep
pub fn bench(backend: &str, device: &Device) -> Result<Report> {
    Ok(bench_keep(backend, device)?.0)
}

/// [`bench`], also returning the model and its configuration for more runs.
pub fn bench_keep(backend: &str, device: &Device) -> Result<(Report, Llama, Config)> {
    let (prompt, steps, dtype, reps) = args();
    let cfg = config_1b();
    let model = random_model(&cfg, dtype, device)?;
    run(&model, &cfg, dtype, device, 16, 4)?;
    let mut best: Option<Report> = None;
    for rep in 0..reps {
        let r = run(&model, &cfg, dtype, device, prompt, steps)?;
        println!(
            "{{\"backend\":\"{backend}\",\"rep\":{rep},\"dtype\":\"{dtype:?}\",\"prompt\":{prompt},\"steps\":{steps},\"prefill_s\":{:.6},\"decode_s\":{:.6},\"prefill_tok_s\":{:.1},\"decode_tok_s\":{:.2}}}",
            r.prefill_s,
            r.decode_s,
            r.prefill_tokens_per_s(),
            r.decode_tokens_per_s()
        );
        if best.as_ref().is_none_or(|b| r.decode_s + r.prefill_s < b.decode_s + b.prefill_s) {
            best = Some(r);
        }
    }
    Ok((best.expect("reps >= 1"), model, cfg))
}
