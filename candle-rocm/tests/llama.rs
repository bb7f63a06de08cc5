//! An unmodified `candle-transformers` llama (small config, random weights) on our backend:
//! prefill, then decode steps with the KV cache; logits compared with Candle's CPU backend
//! running the same weights and tokens.
mod common;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama};
use std::collections::HashMap;

fn config() -> Config {
    Config {
        hidden_size: 64,
        intermediate_size: 128,
        vocab_size: 96,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 32,
        tie_word_embeddings: false,
    }
}

/// Deterministic random weights with Candle's shapes: every tensor Candle initialises to a
/// constant (the norm scales) is kept; the others get uniform values of standard deviation
/// 1 (embeddings) or 1/sqrt(fan_in) (linear layers), from a seed per tensor name, so every
/// run (CI included) checks the same model.
fn weights(cfg: &Config, seed: u64) -> HashMap<String, Tensor> {
    let vm = VarMap::new();
    Llama::load(VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu), cfg).unwrap();
    let data = vm.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| {
            let t = v.as_tensor();
            let flat = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            if flat.iter().all(|x| *x == flat[0]) {
                return (k.clone(), t.clone());
            }
            let std = if k.contains("embed") { 1.0 } else { 1.0 / (t.dim(1).unwrap() as f32).sqrt() };
            let b = 3f32.sqrt() * std;
            let name_seed = k.bytes().fold(seed, |h, c| h.wrapping_mul(0x100_0000_01b3) ^ c as u64);
            let vals = common::values(flat.len(), name_seed, -b, b, false);
            (k.clone(), Tensor::from_vec(vals, t.shape(), &Device::Cpu).unwrap())
        })
        .collect()
}

/// Logits of a 7-token prefill, then of 3 single-token decode steps (KV cache on).
fn run(cfg: &Config, w: &HashMap<String, Tensor>, dtype: DType, dev: &Device) -> Result<Vec<Tensor>> {
    let w = w.iter().map(|(k, v)| Ok((k.clone(), v.to_dtype(dtype)?.to_device(dev)?))).collect::<Result<HashMap<_, _>>>()?;
    let model = Llama::load(VarBuilder::from_tensors(w, dtype, dev), cfg)?;
    let mut cache = Cache::new(true, dtype, cfg, dev)?;
    let prompt = [1u32, 17, 42, 5, 88, 23, 60];
    let mut out = vec![model.forward(&Tensor::new(&prompt, dev)?.unsqueeze(0)?, 0, &mut cache)?];
    for (i, tok) in [7u32, 91, 33].into_iter().enumerate() {
        out.push(model.forward(&Tensor::new(&[tok], dev)?.unsqueeze(0)?, prompt.len() + i, &mut cache)?);
    }
    out.into_iter().map(|t| t.to_device(&Device::Cpu)).collect()
}

/// Largest `|a - b|` relative to the largest `|a|`.
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len());
    assert!(b.iter().all(|x| x.is_finite()), "non-finite logits");
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Root-mean-square of `a - b` over every step, relative to the RMS of `a`: the accuracy
/// measure for half types, where one logit's error is too noisy to compare backends.
fn rms_err(a: &[Tensor], b: &[Tensor]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in a.iter().zip(b) {
        for (x, y) in flat(a).into_iter().zip(flat(b)) {
            num += (x as f64 - y as f64).powi(2);
            den += (x as f64).powi(2);
        }
    }
    (num / den).sqrt()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
}

fn check(dtype: DType, bound: f32) {
    let seed = std::env::var("LLAMA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(2024);
    let cfg = config();
    let w = weights(&cfg, seed);
    let want = run(&cfg, &w, dtype, &Device::Cpu).unwrap();
    // Candle's own error at this dtype: its CPU run against the f32 CPU run.
    let exact = run(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let cpu_rms = rms_err(&exact, &want);
    for dev in common::devices() {
        let got = run(&cfg, &w, dtype, &dev.as_candle()).unwrap_or_else(|e| panic!("llama {dtype:?} on {}: {e}", dev.name()));
        for (step, (a, b)) in want.iter().zip(&got).enumerate() {
            let e = rel_err(a, b);
            eprintln!("llama {dtype:?} on {}: step {step}: max error vs Candle CPU {e:.2e} of the logit scale", dev.name());
            assert!(e <= bound, "llama {dtype:?} on {}: step {step}: relative error {e} > {bound}", dev.name());
        }
        let ours = rms_err(&exact, &got);
        eprintln!("llama {dtype:?} on {}: RMS error vs the f32 run: ours {ours:.2e}, Candle CPU {cpu_rms:.2e}", dev.name());
        // Half types: no less accurate than Candle's own CPU backend (x2 slack).
        assert!(
            dtype == DType::F32 || ours <= 2.0 * cpu_rms + 1e-6,
            "llama {dtype:?} on {}: RMS error vs f32 {ours:.2e} > 2 x Candle's {cpu_rms:.2e}",
            dev.name()
        );
    }
}

/// f32: both sides compute in f32 with different summation orders (matmul, norms,
/// softmax); over two layers the logits agree to ~1e-6 of their scale: 1e-4 leaves room.
#[test]
fn llama_f32_prefill_and_decode_match_cpu() {
    check(DType::F32, 1e-4);
}

/// bf16 (8-bit mantissa, 2^-8 = 0.4% per rounding): activations are rounded after every
/// op on both sides, at different points (our kernels keep f32 inside fused ops), so the
/// logits drift by a few roundings: bound 5% of the logit scale per logit, and our RMS
/// error against the f32 run (all steps) must stay within twice Candle's own bf16 error.
#[test]
fn llama_bf16_prefill_and_decode_match_cpu() {
    check(DType::BF16, 5e-2);
}
