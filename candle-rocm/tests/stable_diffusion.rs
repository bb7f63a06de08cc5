//! Unmodified `candle-transformers` Stable Diffusion models (small configs, random weights)
//! on our backend: one UNet denoising step (latent, timestep, text embeddings) and one VAE
//! decode, compared with Candle's CPU backend running the same weights and inputs.
//!
//! Together they run every op an SD worker needs: 3x3 convolutions (padding 1, stride 1
//! and the stride-2 downsampler), 1x1 convolutions, group norms, layer norms, self- and
//! cross-attention (head reshapes, batched matmuls, softmax), GEGLU (gelu), SiLU, the
//! sinusoidal timestep embedding, nearest-neighbour upsampling and skip concatenations.
mod common;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::stable_diffusion::unet_2d::{BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig};
use candle_transformers::models::stable_diffusion::vae::{AutoEncoderKL, AutoEncoderKLConfig};
use common::models::{rel_err, rms_err, seeded_weights};
use std::collections::HashMap;

/// Two levels (32 then 64 channels, one downsample/upsample), as SD 1.x's: a
/// cross-attention level (4 heads of 8, 1x1-convolution projections), a plain ResNet level,
/// the cross-attention mid block; 8 groups of 4 or 8 channels in every group norm; text
/// context of 32 features.
fn unet_config() -> UNet2DConditionModelConfig {
    UNet2DConditionModelConfig {
        blocks: vec![
            BlockConfig { out_channels: 32, use_cross_attn: Some(1), attention_head_dim: 4 },
            BlockConfig { out_channels: 64, use_cross_attn: None, attention_head_dim: 4 },
        ],
        layers_per_block: 1,
        norm_num_groups: 8,
        cross_attention_dim: 32,
        ..Default::default()
    }
}

/// The SD 2.x variants of [`unet_config`]: linear projections around the transformers,
/// two transformer blocks per attention, used below with an odd latent size (the stride-2 downsampler pads to 4x5 and the upsampler goes
/// back to 7x9 instead of doubling). Sliced attention stays off: candle-transformers
/// 0.11.1's `sliced_attention` fails on Candle's own CPU backend (it stacks the slices
/// into a rank-4 tensor that `reshape_batch_dim_to_heads` rejects).
fn unet_v2_config() -> UNet2DConditionModelConfig {
    UNet2DConditionModelConfig {
        blocks: vec![
            BlockConfig { out_channels: 32, use_cross_attn: Some(2), attention_head_dim: 4 },
            BlockConfig { out_channels: 64, use_cross_attn: None, attention_head_dim: 4 },
        ],
        use_linear_projection: true,
        ..unet_config()
    }
}

/// Two levels (32 and 64 channels, one 2x upsample), one head of self-attention in the mid
/// block, 8 groups per group norm; 4 latent channels, 3 image channels, as SD's VAE.
fn vae_config() -> AutoEncoderKLConfig {
    AutoEncoderKLConfig {
        block_out_channels: vec![32, 64],
        layers_per_block: 1,
        latent_channels: 4,
        norm_num_groups: 8,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

/// Batch 2: SD's conditional and unconditional passes.
const LATENT: [usize; 4] = [2, 4, 8, 8];
const LATENT_V2: [usize; 4] = [1, 4, 7, 9];
const TEXT_LEN: usize = 7;
const TIMESTEP: f64 = 261.0;

/// The seed of the weights and inputs: fixed (CI checks one model); `SD_TEST_SEED` picks
/// another, to see how the errors vary.
fn seed() -> u64 {
    std::env::var("SD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(2024)
}

/// Deterministic random weights with Candle's shapes (built through a `VarMap` by `build`):
/// every tensor Candle initialises to a constant (the norms' scales and shifts) is kept;
/// the others get uniform values of standard deviation 1/sqrt(fan_in) (linear and conv
/// weights, fan_in = in_channels x kernel area) or 0.05 (biases), from a seed per tensor
/// name, so every run (CI included) checks the same model.
fn weights(build: impl Fn(VarBuilder) -> Result<()>, seed: u64) -> HashMap<String, Tensor> {
    let vm = VarMap::new();
    build(VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu)).unwrap();
    seeded_weights(&vm, seed, |_, dims| match dims {
        [_] => 0.05,
        [_, rest @ ..] => 1.0 / (rest.iter().product::<usize>() as f32).sqrt(),
        [] => 1.0,
    })
}

fn build_unet(vb: VarBuilder, cfg: UNet2DConditionModelConfig) -> Result<UNet2DConditionModel> {
    UNet2DConditionModel::new(vb, 4, 4, false, cfg)
}

fn build_vae(vb: VarBuilder) -> Result<AutoEncoderKL> {
    AutoEncoderKL::new(vb, 3, 3, vae_config())
}

/// Inputs of standard deviation 1 (uniform), as SD's latents and (normalised) text states.
fn input(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    let b = 3f32.sqrt();
    Tensor::from_vec(common::values(n, seed, -b, b, false), shape, &Device::Cpu).unwrap()
}

fn on(w: &HashMap<String, Tensor>, dtype: DType, dev: &Device) -> Result<VarBuilder<'static>> {
    let w = w.iter().map(|(k, v)| Ok((k.clone(), v.to_dtype(dtype)?.to_device(dev)?))).collect::<Result<HashMap<_, _>>>()?;
    Ok(VarBuilder::from_tensors(w, dtype, dev))
}

/// The predicted noise of one UNet step on a `latent`-shaped input, back on the CPU.
fn unet(w: &HashMap<String, Tensor>, cfg: UNet2DConditionModelConfig, latent: [usize; 4], seed: u64, dtype: DType, dev: &Device) -> Result<Tensor> {
    let text_dim = cfg.cross_attention_dim;
    let model = build_unet(on(w, dtype, dev)?, cfg)?;
    let xs = input(&latent, seed ^ 1).to_dtype(dtype)?.to_device(dev)?;
    let text = input(&[latent[0], TEXT_LEN, text_dim], seed ^ 2).to_dtype(dtype)?.to_device(dev)?;
    model.forward(&xs, TIMESTEP, &text)?.to_device(&Device::Cpu)
}

/// The decoded image of one latent, back on the CPU.
fn vae(w: &HashMap<String, Tensor>, seed: u64, dtype: DType, dev: &Device) -> Result<Tensor> {
    let model = build_vae(on(w, dtype, dev)?)?;
    let latent = input(&[1, LATENT[1], LATENT[2], LATENT[3]], seed ^ 3).to_dtype(dtype)?.to_device(dev)?;
    model.decode(&latent)?.to_device(&Device::Cpu)
}

/// Runs `model` at `dtype` on Candle's CPU and on every device under test; every output
/// must be within `bound` (max error relative to the output's scale) of Candle's, and for
/// half types our RMS error against the f32 CPU run within twice Candle's own.
fn check(what: &str, model: impl Fn(u64, DType, &Device) -> Result<Tensor>, dtype: DType, bound: f64) {
    let seed = seed();
    let want = model(seed, dtype, &Device::Cpu).unwrap();
    let exact = model(seed, DType::F32, &Device::Cpu).unwrap();
    let cpu_rms = rms_err(std::slice::from_ref(&exact), std::slice::from_ref(&want));
    for dev in common::devices() {
        let got = model(seed, dtype, &dev.as_candle()).unwrap_or_else(|e| panic!("{what} {dtype:?} on {}: {e}", dev.name()));
        assert_eq!(got.dtype(), dtype, "{what}: output dtype");
        let e = rel_err(&want, &got);
        let ours = rms_err(std::slice::from_ref(&exact), std::slice::from_ref(&got));
        eprintln!(
            "{what} {dtype:?} on {}: max error vs Candle CPU {e:.2e} of the output scale; RMS error vs the f32 run: ours {ours:.2e}, Candle CPU {cpu_rms:.2e}",
            dev.name()
        );
        assert!(e <= bound, "{what} {dtype:?} on {}: relative error {e:.2e} > {bound:.0e}", dev.name());
        // Half types: no less accurate than Candle's own CPU backend (x2 slack).
        assert!(
            dtype == DType::F32 || ours <= 2.0 * cpu_rms + 1e-6,
            "{what} {dtype:?} on {}: RMS error vs f32 {ours:.2e} > 2 x Candle's {cpu_rms:.2e}",
            dev.name()
        );
    }
}

fn unet_check(cfg: fn() -> UNet2DConditionModelConfig, latent: [usize; 4], what: &str, dtype: DType, bound: f64) {
    let w = weights(|vb| build_unet(vb, cfg()).map(|_| ()), seed() ^ 7);
    check(what, |seed, dtype, dev| unet(&w, cfg(), latent, seed, dtype, dev), dtype, bound);
}

fn vae_check(dtype: DType, bound: f64) {
    let w = weights(|vb| build_vae(vb).map(|_| ()), seed() ^ 11);
    check("vae decode", |seed, dtype, dev| vae(&w, seed, dtype, dev), dtype, bound);
}

/// f32: both sides compute in f32, with different summation orders (our convolutions are
/// im2col + GEMM, Candle's CPU sums each output in its own order; norms and softmax reduce
/// in other orders): each such op differs by a few ulp (~1e-7 relative) and about 20 layers
/// deep the outputs agree to ~1e-6 of their scale (measured on the CPU executor over seeds
/// 2024, 1, 99: 1.1e-6 to 1.6e-6): 1e-4 leaves room for other summation orders (the GPU's)
/// without hiding a wrong op (a 1% change of one cross-attention weight moves the UNet's
/// output by 3e-3 of its scale).
#[test]
fn unet_f32_matches_cpu() {
    unet_check(unet_config, LATENT, "unet", DType::F32, 1e-4);
}

#[test]
fn unet_v2_odd_latent_f32_matches_cpu() {
    unet_check(unet_v2_config, LATENT_V2, "unet (SD 2.x variant, 7x9 latent)", DType::F32, 1e-4);
}

#[test]
fn vae_decode_f32_matches_cpu() {
    vae_check(DType::F32, 1e-4);
}

/// f16 (what SD workers run; 11-bit mantissa, 2^-11 = 0.05% per rounding): activations are
/// rounded after every op on both sides, at different points (our kernels keep f32 inside
/// fused ops and GEMMs), so outputs drift by a few roundings per layer: bound 2% of the
/// output scale per element (measured: 1.7e-3 to 2.6e-3 over seeds 2024, 1, 99), and our
/// RMS error against the f32 run (whole output) must stay within twice Candle's own f16
/// error (measured ratio ours/Candle's: 0.86 to 1.13).
#[test]
fn unet_f16_matches_cpu() {
    unet_check(unet_config, LATENT, "unet", DType::F16, 2e-2);
}

#[test]
fn unet_v2_odd_latent_f16_matches_cpu() {
    unet_check(unet_v2_config, LATENT_V2, "unet (SD 2.x variant, 7x9 latent)", DType::F16, 2e-2);
}

#[test]
fn vae_decode_f16_matches_cpu() {
    vae_check(DType::F16, 2e-2);
}

/// `candle_nn::ops::sdpa_bshd` (where the patched candle-transformers sends its
/// `CrossAttention`): on our devices the flash-attention prefill kernel, a head between
/// the built sizes zero-padded to the next one (SD 1.5's 40 -> 64 and 160 -> 256, 8 -> 64;
/// 80 is built), odd sequence lengths (partial query and key tiles), cross-attention
/// (`seq_k != seq_q`), and a head wider than any built one (300: the host fallback).
/// Reference: the same inputs on Candle's CPU (f32 scores, softmax and product, one
/// rounding). Tolerance: the kernel rounds the probabilities to the half type before the
/// `P V` product (f16 2^-11, bf16 2^-8 relative per weight) and the output once: outputs
/// are means of `v` in [-3, 3], so a few half-type ulps of 3.
#[test]
fn sdpa_bshd_matches_cpu() {
    use common::Tol;
    for dev in common::devices() {
        for dtype in [DType::F16, DType::BF16] {
            let t = if dtype == DType::F16 { Tol { rtol: 4e-3, atol: 6e-3 } } else { Tol { rtol: 2e-2, atol: 4e-2 } };
            for (i, &(d, sq, sk)) in [(40, 67, 67), (80, 33, 77), (160, 70, 19), (8, 16, 16), (300, 5, 7)].iter().enumerate() {
                let (b, h) = (2, 3);
                let s = 100 + i as u64;
                let q = common::rand(&[b, sq, h, d], dtype, s, false);
                let k = common::rand(&[b, sk, h, d], dtype, s ^ 1, false);
                let v = common::rand(&[b, sk, h, d], dtype, s ^ 2, false);
                let scale = 1.0 / (d as f32).sqrt();
                dev.set_profiling(true);
                common::check(&format!("sdpa_bshd {dtype:?} d {d} seq {sq}x{sk}"), &dev, t, |on| {
                    candle_nn::ops::sdpa_bshd(&q.to_device(on)?, &k.to_device(on)?, &v.to_device(on)?, scale)
                });
                dev.set_profiling(false);
                let p = dev.take_profile().unwrap();
                // Every head up to 256 runs as one fused op on the device (no host round trip).
                if d <= 256 {
                    assert_eq!(p.calls_of("fused.attention"), 1, "d {d}: {}", p.table());
                    assert_eq!(p.calls_of("download"), 1, "d {d}: only the result leaves the device: {}", p.table());
                }
            }
        }
    }
}

/// `GroupNorm::forward_silu` (the candle-nn patch; the ResNet blocks' norm + SiLU in the
/// patched candle-transformers): one kernel, against the norm and SiLU computed in f32 on
/// Candle's CPU from the same inputs and rounded once (so one rounding of the dtype apart).
#[test]
fn group_norm_silu_matches_cpu() {
    for dev in common::devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let x = common::rand(&[2, 12, 5, 7], dtype, 31, false);
            let w = common::rand(&[12], dtype, 32, false);
            let b = common::rand(&[12], dtype, 33, false);
            let gn = |on: &Device, dt: DType| -> Result<candle_nn::GroupNorm> {
                candle_nn::GroupNorm::new(w.to_dtype(dt)?.to_device(on)?, b.to_dtype(dt)?.to_device(on)?, 12, 4, 1e-5)
            };
            dev.set_profiling(true);
            common::check_ref(
                &format!("group_norm_silu {dtype:?}"),
                &dev,
                common::tol(dtype),
                |on| gn(on, DType::F32)?.forward_silu(&x.to_dtype(DType::F32)?.to_device(on)?)?.to_dtype(dtype),
                |on| gn(on, dtype)?.forward_silu(&x.to_device(on)?),
            );
            dev.set_profiling(false);
            let p = dev.take_profile().unwrap();
            assert_eq!(p.calls_of("fused.group_norm_silu"), 1, "{}", p.table());
            assert_eq!(p.calls_of("unary.silu"), 0, "{}", p.table());
        }
    }
}

/// A 1x1 convolution of a channels-last view (`(b, h, w, c)` permuted to `(b, c, h, w)`,
/// as `SpatialTransformer`'s `proj_out` sees its input) is one GEMM on the view in place
/// (a transposed operand), against Candle's CPU convolution of the same view.
#[test]
fn conv2d_1x1_channels_last_view_matches_cpu() {
    for dev in common::devices() {
        for dtype in [DType::F32, DType::F16] {
            let x = common::rand(&[2, 5, 6, 8], dtype, 41, false);
            let k = common::rand(&[10, 8, 1, 1], dtype, 42, false);
            // Sums of 8 products in [-9, 9]: f32 within a few ulp of the sum's magnitude;
            // half types against the f32 convolution rounded once (we accumulate in f32).
            let t = if dtype == DType::F32 { common::Tol { rtol: 1e-5, atol: 1e-5 } } else { common::tol(dtype) };
            dev.set_profiling(true);
            common::check_ref(
                &format!("conv2d 1x1 channels-last {dtype:?}"),
                &dev,
                t,
                |on| x.to_dtype(DType::F32)?.to_device(on)?.permute((0, 3, 1, 2))?.conv2d(&k.to_dtype(DType::F32)?.to_device(on)?, 0, 1, 1, 1)?.to_dtype(dtype),
                |on| x.to_device(on)?.permute((0, 3, 1, 2))?.conv2d(&k.to_device(on)?, 0, 1, 1, 1),
            );
            dev.set_profiling(false);
            let p = dev.take_profile().unwrap();
            // No contiguous copy of the view first.
            assert_eq!(p.calls_of("copy_strided"), 0, "{}", p.table());
            assert_eq!(p.calls_of("conv2d.1x1s1.8->10@5x6.nc"), 1, "{}", p.table());
        }
    }
}
