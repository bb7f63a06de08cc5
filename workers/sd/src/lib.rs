//! Stable Diffusion text-to-image on this project's Candle backend.
//!
//! The models are `candle-transformers`' own (CLIP text encoder, `UNet2DConditionModel`,
//! `AutoEncoderKL`), unmodified; this crate adds what a worker needs around them: the model
//! shapes of SD 1.5, SD 2.1, SDXL and SDXL Turbo (and a `tiny` one for CI), loading of the
//! Hugging Face repository layout with typed errors, the CLIP tokenizer from
//! `vocab.json` + `merges.txt`, classifier-free guidance, DDIM and Euler-ancestral
//! schedulers whose noise is drawn on the host (the same image on every device for a seed),
//! PNG output, and a random-weights writer ([`random`]) for tests and benchmarks.

pub mod random;
pub mod scheduler;
pub mod serve;
pub mod tokenizer;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::clip::text_model::{Activation, ClipTextConfig, ClipTextTransformer};
use candle_transformers::models::stable_diffusion::clip as sd_clip;
use candle_transformers::models::stable_diffusion::schedulers::PredictionType;
use candle_transformers::models::stable_diffusion::unet_2d::{BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig};
use candle_transformers::models::stable_diffusion::vae::{AutoEncoderKL, AutoEncoderKLConfig};
use rand::SeedableRng;
use rand_distr::Distribution;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use scheduler::SchedulerKind;

/// Everything that can go wrong in the worker, by cause.
#[derive(Debug, thiserror::Error)]
pub enum SdError {
    /// A file of the model directory is not there.
    #[error("missing {what}: {path} does not exist")]
    MissingFile { what: &'static str, path: PathBuf },
    /// A weights file that is not valid safetensors, or lacks a tensor (or has one of the
    /// wrong shape) that the model loads.
    #[error("malformed {what} ({path}): {source}")]
    Malformed { what: &'static str, path: PathBuf, source: Box<candle_core::Error> },
    /// The tokenizer files could not be read or used.
    #[error("tokenizer ({path}): {msg}")]
    Tokenizer { path: PathBuf, msg: String },
    /// A request the model cannot serve (size not a multiple of the latent scale, ...).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A tensor op failed while running the models.
    #[error(transparent)]
    Candle(Box<candle_core::Error>),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Image { path: PathBuf, source: Box<image::ImageError> },
    /// [`Progress::cancelled`] asked to stop (a client gone, a server shutting down).
    #[error("generation cancelled")]
    Cancelled,
}

impl From<candle_core::Error> for SdError {
    fn from(e: candle_core::Error) -> Self {
        SdError::Candle(Box::new(e))
    }
}

pub type Result<T> = std::result::Result<T, SdError>;

/// A model family: fixes the network shapes, the default size, scheduler and guidance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// A few channels, one block per level, 16x16 images: for CI on the CPU executor.
    Tiny,
    /// Stable Diffusion 1.5 (512x512, epsilon prediction).
    Sd15,
    /// Stable Diffusion 2.1 (768x768, v-prediction, OpenCLIP-H text encoder).
    Sd21,
    /// SDXL base (1024x1024, two text encoders).
    Sdxl,
    /// SDXL Turbo (512x512, one step, no guidance, Euler ancestral trailing).
    SdxlTurbo,
}

/// The full configuration of one [`Shape`]: the three networks and the sampling defaults.
#[derive(Clone, Debug)]
pub struct SdConfig {
    pub clip: ClipConfig,
    /// SDXL's second text encoder (its states are concatenated to the first's).
    pub clip2: Option<ClipConfig>,
    pub unet: UNet2DConditionModelConfig,
    pub vae: AutoEncoderKLConfig,
    pub prediction: PredictionType,
    pub scheduler: SchedulerKind,
    /// Latents are `vae_scale` times the VAE encoder's output (the model card's scaling factor).
    pub vae_scale: f64,
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    /// Classifier-free guidance scale; `<= 1` runs the conditional pass only.
    pub guidance: f64,
}

/// A CLIP text encoder's configuration: one of candle-transformers' SD presets (their
/// fields are private), or a free-form QuickGELU encoder (the tiny shape) run by
/// candle-transformers' general CLIP text model; both load the same tensor names.
#[derive(Clone, Debug)]
pub enum ClipConfig {
    Sd(sd_clip::Config),
    QuickGelu(ClipTextConfig),
}

/// Vocabulary of every SD preset's CLIP.
const CLIP_VOCAB: usize = 49408;

impl ClipConfig {
    pub fn vocab_size(&self) -> usize {
        match self {
            ClipConfig::Sd(_) => CLIP_VOCAB,
            ClipConfig::QuickGelu(c) => c.vocab_size,
        }
    }

    /// Tokens per prompt (the position embeddings).
    pub fn max_len(&self) -> usize {
        match self {
            ClipConfig::Sd(c) => c.max_position_embeddings,
            ClipConfig::QuickGelu(c) => c.max_position_embeddings,
        }
    }

    /// The padding token (the end token when `None`).
    pub fn pad_with(&self) -> Option<&str> {
        match self {
            ClipConfig::Sd(c) => c.pad_with.as_deref(),
            ClipConfig::QuickGelu(c) => c.pad_with.as_deref(),
        }
    }

    /// Builds the encoder from a builder rooted at the file's top (`text_model.` names).
    pub fn build(&self, vb: VarBuilder) -> candle_core::Result<TextEncoder> {
        Ok(match self {
            ClipConfig::Sd(c) => TextEncoder::Sd(sd_clip::ClipTextTransformer::new(vb, c)?),
            ClipConfig::QuickGelu(c) => TextEncoder::QuickGelu(ClipTextTransformer::new(vb.pp("text_model"), c)?),
        })
    }
}

/// A CLIP text encoder (see [`ClipConfig`]).
pub enum TextEncoder {
    Sd(sd_clip::ClipTextTransformer),
    QuickGelu(ClipTextTransformer),
}

impl TextEncoder {
    /// The last hidden states (after the final layer norm) of token ids `[batch, len]`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            TextEncoder::Sd(m) => m.forward_with_mask(ids, usize::MAX),
            TextEncoder::QuickGelu(m) => m.forward_with_mask(ids, usize::MAX),
        }
    }
}

fn unet_cfg(blocks: &[(usize, Option<usize>, usize)], cross: usize, linear: bool, layers: usize, groups: usize) -> UNet2DConditionModelConfig {
    UNet2DConditionModelConfig {
        blocks: blocks.iter().map(|&(out_channels, use_cross_attn, attention_head_dim)| BlockConfig { out_channels, use_cross_attn, attention_head_dim }).collect(),
        center_input_sample: false,
        cross_attention_dim: cross,
        downsample_padding: 1,
        flip_sin_to_cos: true,
        freq_shift: 0.,
        layers_per_block: layers,
        mid_block_scale_factor: 1.,
        norm_eps: 1e-5,
        norm_num_groups: groups,
        sliced_attention_size: None,
        use_linear_projection: linear,
    }
}

fn sd_vae() -> AutoEncoderKLConfig {
    AutoEncoderKLConfig {
        block_out_channels: vec![128, 256, 512, 512],
        layers_per_block: 2,
        latent_channels: 4,
        norm_num_groups: 32,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

/// Vocabulary of the tiny tokenizer [`random`] writes (and of the tiny CLIP).
pub const TINY_VOCAB: usize = tokenizer::TINY_VOCAB_SIZE;

impl Shape {
    /// The configuration of this shape, as in the models' Hugging Face `config.json`s
    /// (the same values as candle-transformers' `StableDiffusionConfig`).
    pub fn config(self) -> SdConfig {
        match self {
            Shape::Tiny => SdConfig {
                clip: ClipConfig::QuickGelu(ClipTextConfig {
                    vocab_size: TINY_VOCAB,
                    embed_dim: 32,
                    activation: Activation::QuickGelu,
                    intermediate_size: 64,
                    max_position_embeddings: 16,
                    pad_with: None,
                    num_hidden_layers: 2,
                    num_attention_heads: 4,
                    projection_dim: 32,
                }),
                clip2: None,
                unet: unet_cfg(&[(32, Some(1), 4), (64, None, 4)], 32, false, 1, 8),
                vae: AutoEncoderKLConfig { block_out_channels: vec![32, 64], layers_per_block: 1, latent_channels: 4, norm_num_groups: 8, use_quant_conv: true, use_post_quant_conv: true },
                prediction: PredictionType::Epsilon,
                scheduler: SchedulerKind::Ddim,
                vae_scale: 0.18215,
                width: 16,
                height: 16,
                steps: 2,
                guidance: 7.5,
            },
            Shape::Sd15 => SdConfig {
                clip: ClipConfig::Sd(sd_clip::Config::v1_5()),
                clip2: None,
                unet: unet_cfg(&[(320, Some(1), 8), (640, Some(1), 8), (1280, Some(1), 8), (1280, None, 8)], 768, false, 2, 32),
                vae: sd_vae(),
                prediction: PredictionType::Epsilon,
                scheduler: SchedulerKind::Ddim,
                vae_scale: 0.18215,
                width: 512,
                height: 512,
                steps: 30,
                guidance: 7.5,
            },
            Shape::Sd21 => SdConfig {
                clip: ClipConfig::Sd(sd_clip::Config::v2_1()),
                clip2: None,
                unet: unet_cfg(&[(320, Some(1), 5), (640, Some(1), 10), (1280, Some(1), 20), (1280, None, 20)], 1024, true, 2, 32),
                vae: sd_vae(),
                prediction: PredictionType::VPrediction,
                scheduler: SchedulerKind::Ddim,
                vae_scale: 0.18215,
                width: 768,
                height: 768,
                steps: 30,
                guidance: 7.5,
            },
            Shape::Sdxl | Shape::SdxlTurbo => {
                let turbo = self == Shape::SdxlTurbo;
                SdConfig {
                    clip: ClipConfig::Sd(sd_clip::Config::sdxl()),
                    clip2: Some(ClipConfig::Sd(sd_clip::Config::sdxl2())),
                    unet: unet_cfg(&[(320, None, 5), (640, Some(2), 10), (1280, Some(10), 20)], 2048, true, 2, 32),
                    vae: sd_vae(),
                    prediction: PredictionType::Epsilon,
                    scheduler: if turbo { SchedulerKind::EulerAncestralTrailing } else { SchedulerKind::Ddim },
                    vae_scale: 0.13025,
                    width: if turbo { 512 } else { 1024 },
                    height: if turbo { 512 } else { 1024 },
                    steps: if turbo { 1 } else { 30 },
                    guidance: if turbo { 0.0 } else { 7.5 },
                }
            }
        }
    }
}

impl SdConfig {
    /// Image pixels per latent pixel: 2 per VAE level after the first (8 for SD).
    pub fn latent_scale(&self) -> usize {
        1 << (self.vae.block_out_channels.len() - 1)
    }
}

/// The files of a model directory in the Hugging Face diffusers layout.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    pub unet: PathBuf,
    pub vae: PathBuf,
    pub text_encoder: PathBuf,
    pub text_encoder_2: Option<PathBuf>,
    pub tokenizer: PathBuf,
    pub tokenizer_2: Option<PathBuf>,
}

fn weights_file(dir: &Path, sub: &str, stem: &str, what: &'static str) -> Result<PathBuf> {
    // Full-precision file first, then the `.fp16` variant the repositories also ship.
    let full = dir.join(sub).join(format!("{stem}.safetensors"));
    let half = dir.join(sub).join(format!("{stem}.fp16.safetensors"));
    if full.is_file() {
        Ok(full)
    } else if half.is_file() {
        Ok(half)
    } else {
        Err(SdError::MissingFile { what, path: full })
    }
}

fn dir_of(dir: &Path, sub: &str, what: &'static str) -> Result<PathBuf> {
    let p = dir.join(sub);
    if p.is_dir() {
        Ok(p)
    } else {
        Err(SdError::MissingFile { what, path: p })
    }
}

impl ModelFiles {
    /// Finds the files of `cfg`'s model under `dir` (`unet/`, `vae/`, `text_encoder/`,
    /// `tokenizer/`, and `text_encoder_2/`, `tokenizer_2/` for SDXL); a missing one is
    /// [`SdError::MissingFile`].
    pub fn locate(dir: &Path, cfg: &SdConfig) -> Result<Self> {
        let two = cfg.clip2.is_some();
        Ok(Self {
            unet: weights_file(dir, "unet", "diffusion_pytorch_model", "UNet weights")?,
            vae: weights_file(dir, "vae", "diffusion_pytorch_model", "VAE weights")?,
            text_encoder: weights_file(dir, "text_encoder", "model", "text encoder weights")?,
            text_encoder_2: if two { Some(weights_file(dir, "text_encoder_2", "model", "second text encoder weights")?) } else { None },
            tokenizer: dir_of(dir, "tokenizer", "tokenizer directory")?,
            tokenizer_2: if two { Some(dir_of(dir, "tokenizer_2", "second tokenizer directory")?) } else { None },
        })
    }
}

/// Reads a safetensors file into a `VarBuilder` (no memory map: a file changed or truncated
/// while loading cannot fault the process); a file that does not parse is
/// [`SdError::Malformed`].
fn var_builder(path: &Path, what: &'static str, dtype: DType, dev: &Device) -> Result<VarBuilder<'static>> {
    let data = std::fs::read(path).map_err(|source| SdError::Io { path: path.into(), source })?;
    VarBuilder::from_buffered_safetensors(data, dtype, dev).map_err(|source| SdError::Malformed { what, path: path.into(), source: Box::new(source) })
}

/// The three networks of a pipeline, on one device at one dtype.
pub struct Models {
    pub clip: TextEncoder,
    pub clip2: Option<TextEncoder>,
    pub unet: UNet2DConditionModel,
    pub vae: AutoEncoderKL,
}

impl Models {
    /// Builds the networks of `cfg` from variable builders (files, or random weights).
    pub fn build(cfg: &SdConfig, clip: VarBuilder, clip2: Option<VarBuilder>, unet: VarBuilder, vae: VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            clip: cfg.clip.build(clip)?,
            clip2: match (&cfg.clip2, clip2) {
                (Some(c), Some(vb)) => Some(c.build(vb)?),
                (None, _) => None,
                (Some(_), None) => candle_core::bail!("this model has a second text encoder"),
            },
            unet: UNet2DConditionModel::new(unet, 4, 4, false, cfg.unet.clone())?,
            vae: AutoEncoderKL::new(vae, 3, 3, cfg.vae.clone())?,
        })
    }

    /// Loads the networks from `files`; each file that does not parse or lacks a tensor of
    /// the right shape is [`SdError::Malformed`] naming it.
    pub fn load(cfg: &SdConfig, files: &ModelFiles, dtype: DType, dev: &Device) -> Result<Self> {
        fn mal<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(candle_core::Error) -> SdError + 'a {
            move |source| SdError::Malformed { what, path: path.into(), source: Box::new(source) }
        }
        let clip = cfg.clip.build(var_builder(&files.text_encoder, "text encoder weights", dtype, dev)?).map_err(mal("text encoder weights", &files.text_encoder))?;
        let clip2 = match (&cfg.clip2, &files.text_encoder_2) {
            (Some(c), Some(p)) => Some(c.build(var_builder(p, "second text encoder weights", dtype, dev)?).map_err(mal("second text encoder weights", p))?),
            _ => None,
        };
        let unet = UNet2DConditionModel::new(var_builder(&files.unet, "UNet weights", dtype, dev)?, 4, 4, false, cfg.unet.clone()).map_err(mal("UNet weights", &files.unet))?;
        let vae = AutoEncoderKL::new(var_builder(&files.vae, "VAE weights", dtype, dev)?, 3, 3, cfg.vae.clone()).map_err(mal("VAE weights", &files.vae))?;
        Ok(Self { clip, clip2, unet, vae })
    }
}

/// One text-to-image request.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: String,
    pub negative_prompt: String,
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    pub guidance: f64,
    pub scheduler: SchedulerKind,
    pub seed: u64,
}

impl Request {
    /// A request with `cfg`'s defaults.
    pub fn new(cfg: &SdConfig, prompt: &str, seed: u64) -> Self {
        Self {
            prompt: prompt.into(),
            negative_prompt: String::new(),
            width: cfg.width,
            height: cfg.height,
            steps: cfg.steps,
            guidance: cfg.guidance,
            scheduler: cfg.scheduler,
            seed,
        }
    }

    /// Guidance runs the unconditional pass too (batch 2) when its scale is above 1.
    pub fn guided(&self) -> bool {
        self.guidance > 1.0
    }
}

/// Timings of one image.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub text: Duration,
    /// One entry per denoising step (UNet, guidance and scheduler update).
    pub steps: Vec<Duration>,
    pub decode: Duration,
    pub total: Duration,
}

/// The standard-normal noise of `seed` with `shape`, drawn on the host (ChaCha8, f32):
/// the same values for every device and dtype.
pub fn host_noise(seed: u64, shape: &[usize]) -> Result<Tensor> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rand_distr::StandardNormal.sample(&mut rng)).collect();
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

/// A loaded pipeline: tokenizers, networks and configuration, on one device.
pub struct Pipeline {
    pub cfg: SdConfig,
    pub models: Models,
    pub tokenizers: Vec<tokenizer::ClipTokenizer>,
    pub device: Device,
    pub dtype: DType,
}

/// What [`Pipeline::generate`] can report while it runs.
pub trait Progress {
    /// Called after each denoising step (`step` of `steps`, counting from 1).
    fn step(&mut self, _step: usize, _steps: usize) {}
    /// Polled before each denoising step and before decoding: `true` stops the generation
    /// with [`SdError::Cancelled`].
    fn cancelled(&self) -> bool {
        false
    }
}

impl Progress for () {}

/// The intermediate and final results of one generation.
pub struct Generated {
    /// The latents after the last step (before scaling for the VAE), f32 on the host.
    pub latents: Tensor,
    /// The decoded image, `[3, height, width]` in [0, 1], f32 on the host.
    pub image: Tensor,
    pub timings: Timings,
}

impl Pipeline {
    /// Loads the model of `cfg` from a diffusers-layout directory.
    pub fn load(dir: &Path, cfg: SdConfig, device: &Device, dtype: DType) -> Result<Self> {
        let files = ModelFiles::locate(dir, &cfg)?;
        let mut tokenizers = vec![tokenizer::ClipTokenizer::load(&files.tokenizer, &cfg.clip)?];
        if let (Some(p), Some(c)) = (&files.tokenizer_2, &cfg.clip2) {
            tokenizers.push(tokenizer::ClipTokenizer::load(p, c)?);
        }
        let models = Models::load(&cfg, &files, dtype, device)?;
        Ok(Self { cfg, models, tokenizers, device: device.clone(), dtype })
    }

    /// The text states the UNet attends to: `[2, seq, dim]` (unconditional then
    /// conditional) when guided, `[1, seq, dim]` otherwise; SDXL concatenates both
    /// encoders' states along the features.
    pub fn text_embeddings(&self, req: &Request) -> Result<Tensor> {
        let mut parts = Vec::new();
        let encoders = std::iter::once(&self.models.clip).chain(self.models.clip2.as_ref());
        for (enc, tok) in encoders.zip(&self.tokenizers) {
            let mut rows = Vec::new();
            if req.guided() {
                rows.push(tok.encode(&req.negative_prompt)?);
            }
            rows.push(tok.encode(&req.prompt)?);
            let len = rows[0].len();
            let ids: Vec<u32> = rows.concat();
            let ids = Tensor::from_vec(ids, (rows.len(), len), &self.device)?;
            parts.push(enc.forward(&ids)?);
        }
        Ok(Tensor::cat(&parts, candle_core::D::Minus1)?.to_dtype(self.dtype)?)
    }

    /// Runs the whole request: text encoding, `req.steps` denoising steps, VAE decode.
    pub fn generate(&self, req: &Request, progress: &mut dyn Progress) -> Result<Generated> {
        let scale = self.cfg.latent_scale();
        if req.width == 0 || req.height == 0 || !req.width.is_multiple_of(scale) || !req.height.is_multiple_of(scale) {
            return Err(SdError::Invalid(format!("{}x{} is not a positive multiple of {scale}", req.width, req.height)));
        }
        if req.steps == 0 {
            return Err(SdError::Invalid("steps must be at least 1".into()));
        }
        let start = Instant::now();
        let mut timings = Timings::default();
        let text = self.text_embeddings(req)?;
        sync(&text)?;
        timings.text = start.elapsed();

        let mut sched = req.scheduler.build(req.steps, self.cfg.prediction, req.seed)?;
        let shape = [1, 4, req.height / scale, req.width / scale];
        let noise = (host_noise(req.seed, &shape)? * sched.init_noise_sigma())?;
        let mut latents = noise.to_dtype(self.dtype)?.to_device(&self.device)?;
        let timesteps = sched.timesteps().to_vec();
        for (i, &t) in timesteps.iter().enumerate() {
            if progress.cancelled() {
                return Err(SdError::Cancelled);
            }
            let t0 = Instant::now();
            let input = if req.guided() { Tensor::cat(&[&latents, &latents], 0)? } else { latents.clone() };
            let input = sched.scale_model_input(input, t)?;
            let pred = self.models.unet.forward(&input, t as f64, &text)?;
            let pred = if req.guided() {
                let (uncond, cond) = (pred.i(0..1)?, pred.i(1..2)?);
                (&uncond + ((cond - &uncond)? * req.guidance)?)?
            } else {
                pred
            };
            latents = sched.step(&pred, t, &latents)?;
            sync(&latents)?;
            timings.steps.push(t0.elapsed());
            progress.step(i + 1, timesteps.len());
        }
        if progress.cancelled() {
            return Err(SdError::Cancelled);
        }
        let t0 = Instant::now();
        let image = self.decode(&latents)?;
        timings.decode = t0.elapsed();
        timings.total = start.elapsed();
        Ok(Generated { latents: latents.to_dtype(DType::F32)?.to_device(&Device::Cpu)?, image, timings })
    }

    /// Decodes latents to an image `[3, h, w]` in [0, 1] (f32, on the host).
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor> {
        let img = self.models.vae.decode(&(latents / self.cfg.vae_scale)?)?;
        let img = ((img / 2.)? + 0.5)?.clamp(0f32, 1f32)?;
        Ok(img.i(0)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)
    }
}

/// Waits for `t`'s device work (a one-element read), so timings cover the work itself.
pub fn sync(t: &Tensor) -> Result<()> {
    if !matches!(t.device(), Device::Cpu) {
        t.flatten_all()?.i(0..1)?.to_device(&Device::Cpu)?;
    }
    Ok(())
}

/// An image `[3, h, w]` in [0, 1] as 8-bit RGB (each value times 255, rounded).
pub fn to_rgb8(image: &Tensor) -> Result<image::RgbImage> {
    let (c, h, w) = image.dims3()?;
    if c != 3 {
        return Err(SdError::Invalid(format!("image has {c} channels, not 3")));
    }
    let px = (image.permute((1, 2, 0))? * 255.)?.round()?.clamp(0f32, 255f32)?.to_dtype(DType::U8)?;
    let px = px.flatten_all()?.to_vec1::<u8>()?;
    image::RgbImage::from_raw(w as u32, h as u32, px).ok_or_else(|| SdError::Invalid("image buffer size".into()))
}

/// Writes an image `[3, h, w]` in [0, 1] as an 8-bit RGB PNG.
pub fn save_png(image: &Tensor, path: &Path) -> Result<()> {
    to_rgb8(image)?.save_with_format(path, image::ImageFormat::Png).map_err(|source| SdError::Image { path: path.into(), source: Box::new(source) })
}

/// The bytes of the PNG [`save_png`] would write (what `sd-worker serve` sends).
pub fn png_bytes(image: &Tensor) -> Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    to_rgb8(image)?.write_to(&mut out, image::ImageFormat::Png).map_err(|source| SdError::Image { path: "<memory>".into(), source: Box::new(source) })?;
    Ok(out.into_inner())
}

/// Parses `--device`: `cpu` (Candle's own CPU backend) or any [`candle_rocm::RocmDevice::from_spec`]
/// name (`rocm:N`, `cuda:N`, `cpu-executor[:32|:64]`).
pub fn device(spec: &str) -> Result<Device> {
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    candle_rocm::RocmDevice::from_spec(spec).map(|d| d.as_candle()).map_err(|e| SdError::Invalid(format!("{e}; or cpu (Candle's CPU backend)")))
}
