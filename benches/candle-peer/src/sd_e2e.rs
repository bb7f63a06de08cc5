//! The Stable Diffusion peer of `sd-worker bench` (issue 32): candle-transformers' UNet and
//! VAE on Candle's own CUDA backend, at the SD 1.5 (512x512) and SDXL (1024x1024) shapes,
//! f16, random weights. Times one UNet step at batch 2 (classifier-free guidance) and one
//! VAE decode of a single latent, and prints one JSON line per op in `sd-worker bench`'s
//! schema (`benches/python/report_sd.py` reads both).
//!
//! `candle-peer sd --shape sd15|sdxl [--steps N]`
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::stable_diffusion::unet_2d::{BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig};
use candle_transformers::models::stable_diffusion::vae::{AutoEncoderKL, AutoEncoderKLConfig};
use std::time::Instant;

/// The UNet of a shape as in its Hugging Face `unet/config.json` (the values of
/// candle-transformers' `StableDiffusionConfig::{v1_5, sdxl}`, whose fields are private).
fn unet_config(sdxl: bool) -> UNet2DConditionModelConfig {
    let blocks: &[(usize, Option<usize>, usize)] =
        if sdxl { &[(320, None, 5), (640, Some(2), 10), (1280, Some(10), 20)] } else { &[(320, Some(1), 8), (640, Some(1), 8), (1280, Some(1), 8), (1280, None, 8)] };
    UNet2DConditionModelConfig {
        blocks: blocks.iter().map(|&(out_channels, use_cross_attn, attention_head_dim)| BlockConfig { out_channels, use_cross_attn, attention_head_dim }).collect(),
        center_input_sample: false,
        cross_attention_dim: if sdxl { 2048 } else { 768 },
        downsample_padding: 1,
        flip_sin_to_cos: true,
        freq_shift: 0.,
        layers_per_block: 2,
        mid_block_scale_factor: 1.,
        norm_eps: 1e-5,
        norm_num_groups: 32,
        sliced_attention_size: None,
        use_linear_projection: sdxl,
    }
}

/// The VAE of both shapes (`vae/config.json`).
fn vae_config() -> AutoEncoderKLConfig {
    AutoEncoderKLConfig { block_out_channels: vec![128, 256, 512, 512], layers_per_block: 2, latent_channels: 4, norm_num_groups: 32, use_quant_conv: true, use_post_quant_conv: true }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn line(shape: &str, op: &str, w: usize, h: usize, batch: usize, ms: &[f64]) {
    let list = ms.iter().map(|m| format!("{m:.4}")).collect::<Vec<_>>().join(",");
    let min = ms.iter().cloned().fold(f64::INFINITY, f64::min);
    println!(
        "{{\"shape\":\"{shape}\",\"op\":\"{op}\",\"backend\":\"candle-cuda\",\"device\":\"cuda:0\",\"dtype\":\"f16\",\"width\":{w},\"height\":{h},\"batch\":{batch},\"runs\":{},\"median_ms\":{:.4},\"min_ms\":{min:.4},\"ms\":[{list}]}}",
        ms.len(),
        median(ms.to_vec())
    );
}

fn sync(t: &Tensor, device: &Device) -> Result<()> {
    // A one-element read waits for the stream that produced `t`.
    t.flatten_all()?.narrow(0, 0, 1)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    device.synchronize()
}

pub fn bench(device: &Device) -> Result<()> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut shape = "sd15".to_string();
    let mut steps = 5usize;
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--shape" => shape = v,
            "--steps" => steps = v.parse().map_err(|_| candle_core::Error::Msg(format!("--steps {v}: not a number")))?,
            a => candle_core::bail!("candle-peer sd: unknown argument {a}"),
        }
        i += 2;
    }
    let sdxl = match shape.as_str() {
        "sdxl" => true,
        "sd15" => false,
        s => candle_core::bail!("candle-peer sd: --shape sd15|sdxl, not {s}"),
    };
    let (w, h, batch) = if sdxl { (1024, 1024, 2) } else { (512, 512, 2) };
    let dtype = DType::F16;
    let ucfg = unet_config(sdxl);
    let text_dim = ucfg.cross_attention_dim;
    let vm = VarMap::new();
    let unet = UNet2DConditionModel::new(VarBuilder::from_varmap(&vm, dtype, device), 4, 4, false, ucfg)?;
    let vm2 = VarMap::new();
    let vae = AutoEncoderKL::new(VarBuilder::from_varmap(&vm2, dtype, device), 3, 3, vae_config())?;
    let lat = Tensor::randn(0f32, 1., (batch, 4, h / 8, w / 8), device)?.to_dtype(dtype)?;
    let text = Tensor::randn(0f32, 1., (batch, 77, text_dim), device)?.to_dtype(dtype)?;
    let step = |t: f64| -> Result<f64> {
        let t0 = Instant::now();
        let y = unet.forward(&lat, t, &text)?;
        sync(&y, device)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    step(999.0)?; // warm-up: kernel loading, cuBLAS heuristics, allocator
    let ms = (0..steps).map(|i| step(999.0 - i as f64)).collect::<Result<Vec<_>>>()?;
    line(&shape, "unet_step", w, h, batch, &ms);
    let z = lat.narrow(0, 0, 1)?;
    let decode = || -> Result<f64> {
        let t0 = Instant::now();
        let y = vae.decode(&z)?;
        sync(&y, device)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    decode()?;
    let ms = (0..steps.min(3)).map(|_| decode()).collect::<Result<Vec<_>>>()?;
    line(&shape, "vae_decode", w, h, 1, &ms);
    Ok(())
}
