//! Shared by the model checks (llama, Stable Diffusion, profile): deterministic random
//! weights with Candle's shapes, a small llama configuration, and the error measures.
use super::values;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use candle_transformers::models::llama::Config;
use std::collections::HashMap;

/// The variables of `vm` (built on the CPU by a model's constructor) with deterministic
/// values: tensors Candle initialises to a constant (norm scales and shifts) are kept, every
/// other gets uniform values of standard deviation `std(name, dims)` from a seed per tensor
/// name, so every run (CI included) checks the same model.
pub fn seeded_weights(vm: &VarMap, seed: u64, std: impl Fn(&str, &[usize]) -> f32) -> HashMap<String, Tensor> {
    let data = vm.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| {
            let t = v.as_tensor();
            let flat = flat(t);
            if flat.iter().all(|x| *x == flat[0]) {
                return (k.clone(), t.clone());
            }
            let b = 3f32.sqrt() * std(k, t.dims());
            let name_seed = k.bytes().fold(seed, |h, c| h.wrapping_mul(0x100_0000_01b3) ^ c as u64);
            (k.clone(), Tensor::from_vec(values(flat.len(), name_seed, -b, b, false), t.shape(), &Device::Cpu).unwrap())
        })
        .collect()
}

/// A llama of `layers` layers, 64 wide, 4 query and 2 key/value heads, 96 tokens.
pub fn small_llama_config(layers: usize) -> Config {
    Config {
        hidden_size: 64,
        intermediate_size: 128,
        vocab_size: 96,
        num_hidden_layers: layers,
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

/// Every element of `t` as f32.
pub fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
}

/// Largest `|a - b|` relative to the largest `|a|`; `b` must be finite.
pub fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "output shape");
    let (a, b) = (flat(a), flat(b));
    assert!(b.iter().all(|x| x.is_finite()), "non-finite output");
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs())) / scale
}

/// Root-mean-square of `a - b` over every element of every pair, relative to the RMS of
/// `a`: the accuracy measure for half types, where one element's error is too noisy to
/// compare backends.
pub fn rms_err(a: &[Tensor], b: &[Tensor]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.dims(), b.dims(), "output shape");
        for (x, y) in flat(a).into_iter().zip(flat(b)) {
            num += (x as f64 - y as f64).powi(2);
            den += (x as f64).powi(2);
        }
    }
    (num / den).sqrt()
}
