//! An unmodified `candle-transformers` llama (small config, random weights) on our backend:
//! prefill, then decode steps with the KV cache; logits compared with Candle's CPU backend
//! running the same weights and tokens.
mod common;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama};
use common::models::{rel_err, rms_err, seeded_weights, small_llama_config};
use std::collections::HashMap;

/// Deterministic random weights with Candle's shapes: every tensor Candle initialises to a
/// constant (the norm scales) is kept; the others get uniform values of standard deviation
/// 1 (embeddings) or 1/sqrt(fan_in) (linear layers), from a seed per tensor name, so every
/// run (CI included) checks the same model.
fn weights(cfg: &Config, seed: u64) -> HashMap<String, Tensor> {
    let vm = VarMap::new();
    Llama::load(VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu), cfg).unwrap();
    seeded_weights(&vm, seed, |name, dims| if name.contains("embed") { 1.0 } else { 1.0 / (dims[1] as f32).sqrt() })
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

fn check(dtype: DType, bound: f32) {
    let seed = std::env::var("LLAMA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(2024);
    let cfg = small_llama_config(2);
    let w = weights(&cfg, seed);
    let want = run(&cfg, &w, dtype, &Device::Cpu).unwrap();
    // Candle's own error at this dtype: its CPU run against the f32 CPU run.
    let exact = run(&cfg, &w, DType::F32, &Device::Cpu).unwrap();
    let cpu_rms = rms_err(&exact, &want);
    for dev in common::devices() {
        let got = run(&cfg, &w, dtype, &dev.as_candle()).unwrap_or_else(|e| panic!("llama {dtype:?} on {}: {e}", dev.name()));
        for (step, (a, b)) in want.iter().zip(&got).enumerate() {
            let e = rel_err(a, b) as f32;
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
