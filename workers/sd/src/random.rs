//! Random weights with the exact names and shapes the pipeline loads (no weights can be
//! downloaded here): written as a diffusers-layout model directory for tests, or handed to
//! the models directly for benchmarks.
//!
//! The values are a deterministic function of (seed, tensor name): tensors the models
//! initialise to a constant (norm scales and shifts) keep it; the others are uniform with a
//! standard deviation of 1/sqrt(fan_in) (weights, fan_in = the product of all dims but the
//! first) or 0.05 (biases), which keeps activations of order one through the networks.

use crate::{tokenizer, Models, Result, SdConfig, SdError, Shape};
use candle_core::{DType, Device, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

/// Elements per independently seeded chunk (the values do not depend on the thread count).
const CHUNK: usize = 1 << 20;

/// A `VarBuilder` backend that makes every tensor it is asked for from the seed and the
/// tensor's name, and optionally keeps a copy of each (for writing them out).
pub struct RandomBackend {
    seed: u64,
    kept: Option<Mutex<HashMap<String, Tensor>>>,
}

impl RandomBackend {
    /// A backend for `seed`; `keep` records every tensor handed out.
    pub fn new(seed: u64, keep: bool) -> Self {
        Self { seed, kept: keep.then(Mutex::default) }
    }

    /// The tensors handed out so far (empty unless made with `keep`).
    pub fn take(&self) -> HashMap<String, Tensor> {
        self.kept.as_ref().map(|m| std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()))).unwrap_or_default()
    }
}

/// `n` values uniform in [-b, b], from `seed`, filled in parallel chunks.
pub fn uniform(n: usize, seed: u64, b: f32) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [f32])> = v.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
    for c in chunks {
        if groups.last().is_none_or(|g| g.len() == per) {
            groups.push(Vec::new());
        }
        if let Some(g) = groups.last_mut() {
            g.push(c);
        }
    }
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || {
                for (i, c) in g {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                    for x in c.iter_mut() {
                        *x = rng.random_range(-b..=b);
                    }
                }
            });
        }
    });
    v
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

impl SimpleBackend for RandomBackend {
    fn get(&self, s: candle_core::Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = match h {
            Init::Const(c) => Tensor::full(c as f32, s, &Device::Cpu)?,
            _ => {
                let dims = s.dims();
                let std = match dims {
                    [] | [_] => 0.05,
                    [_, rest @ ..] => 1.0 / (rest.iter().product::<usize>().max(1) as f32).sqrt(),
                };
                Tensor::from_vec(uniform(s.elem_count(), name_seed(self.seed, name), 3f32.sqrt() * std), s, &Device::Cpu)?
            }
        }
        .to_dtype(dtype)?;
        if let Some(kept) = &self.kept {
            kept.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), t.clone());
        }
        t.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("random weights: {name} asked for without a shape")
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

/// A variable builder of random weights on `dev` (seeded per component by `seed`).
pub fn var_builder(seed: u64, dtype: DType, dev: &Device) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(RandomBackend::new(seed, false)), dtype, dev.clone())
}

/// Component seeds: each network gets its own stream.
pub const SEEDS: [u64; 4] = [11, 12, 13, 14];

/// The pipeline's networks with random weights, built on `dev` (benchmarks).
pub fn models(cfg: &SdConfig, seed: u64, dtype: DType, dev: &Device) -> candle_core::Result<Models> {
    let vb = |k: u64| var_builder(seed ^ k, dtype, dev);
    Models::build(cfg, vb(SEEDS[0]), cfg.clip2.as_ref().map(|_| vb(SEEDS[1])), vb(SEEDS[2]), vb(SEEDS[3]))
}

fn save(dir: &Path, sub: &str, file: &str, t: HashMap<String, Tensor>) -> Result<()> {
    let d = dir.join(sub);
    std::fs::create_dir_all(&d).map_err(|source| SdError::Io { path: d.clone(), source })?;
    candle_core::safetensors::save(&t, d.join(file))?;
    Ok(())
}

/// Writes a random-weights model of `shape` at `dtype` into `dir` in the diffusers layout
/// (`text_encoder[_2]/model.safetensors`, `unet/` and `vae/diffusion_pytorch_model.safetensors`,
/// `tokenizer[_2]/vocab.json` + `merges.txt`: the tiny tokenizer, whose ids fit every
/// shape's vocabulary). The same `seed` writes the same files.
pub fn write_model(shape: Shape, dir: &Path, seed: u64, dtype: DType) -> Result<()> {
    let cfg = shape.config();
    let kept = |k: u64| RandomBackend::new(seed ^ k, true);
    let (b_clip, b_clip2, b_unet, b_vae) = (kept(SEEDS[0]), kept(SEEDS[1]), kept(SEEDS[2]), kept(SEEDS[3]));
    fn vb(b: &RandomBackend, dtype: DType) -> VarBuilder<'_> {
        VarBuilder::from_backend(Box::new(Borrowed(b)), dtype, Device::Cpu)
    }
    // Built one network at a time, so at most one is held twice in memory.
    drop(cfg.clip.build(vb(&b_clip, dtype))?);
    save(dir, "text_encoder", "model.safetensors", b_clip.take())?;
    if let Some(c2) = &cfg.clip2 {
        drop(c2.build(vb(&b_clip2, dtype))?);
        save(dir, "text_encoder_2", "model.safetensors", b_clip2.take())?;
    }
    drop(candle_transformers::models::stable_diffusion::unet_2d::UNet2DConditionModel::new(vb(&b_unet, dtype), 4, 4, false, cfg.unet.clone())?);
    save(dir, "unet", "diffusion_pytorch_model.safetensors", b_unet.take())?;
    drop(candle_transformers::models::stable_diffusion::vae::AutoEncoderKL::new(vb(&b_vae, dtype), 3, 3, cfg.vae.clone())?);
    save(dir, "vae", "diffusion_pytorch_model.safetensors", b_vae.take())?;
    let subs: &[&str] = if cfg.clip2.is_some() { &["tokenizer", "tokenizer_2"] } else { &["tokenizer"] };
    for sub in subs {
        let d = dir.join(sub);
        tokenizer::write_tiny(&d).map_err(|source| SdError::Io { path: d, source })?;
    }
    Ok(())
}

/// A borrowed [`RandomBackend`] (so the caller keeps the recorded tensors).
struct Borrowed<'a>(&'a RandomBackend);

impl SimpleBackend for Borrowed<'_> {
    fn get(&self, s: candle_core::Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.0.get(s, name, h, dtype, dev)
    }
    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.0.get_unchecked(name, dtype, dev)
    }
    fn contains_tensor(&self, name: &str) -> bool {
        self.0.contains_tensor(name)
    }
}
