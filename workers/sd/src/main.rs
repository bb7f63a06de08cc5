//! `sd-worker`: text-to-image with Stable Diffusion on this project's Candle backend.
//!
//! - `sd-worker generate --model DIR --shape sd15 --prompt "..." --out img.png`
//! - `sd-worker write-random --shape tiny|sd15|sd21|sdxl|sdxl-turbo OUT_DIR`
//! - `sd-worker bench --shape sd15 --steps N --device cuda:0` (random weights; JSON lines)
//! - `sd-worker serve --model DIR --shape sd15 --device rocm:0` (OpenAI images API over HTTP)

use candle_core::{DType, Tensor};
use clap::{Parser, Subcommand, ValueEnum};
use sd_worker::{random, Pipeline, Progress, Request, SchedulerKind, SdError, Shape};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "sd-worker", about = "Stable Diffusion text-to-image on rocm-kernels-rs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dt {
    F32,
    F16,
    Bf16,
}

impl From<Dt> for DType {
    fn from(d: Dt) -> DType {
        match d {
            Dt::F32 => DType::F32,
            Dt::F16 => DType::F16,
            Dt::Bf16 => DType::BF16,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Generates images from a prompt and writes them as PNGs.
    Generate {
        /// Model directory in the diffusers layout (unet/, vae/, text_encoder/, tokenizer/...).
        #[arg(long)]
        model: PathBuf,
        #[arg(long, value_enum, default_value = "sd15")]
        shape: Shape,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value = "")]
        negative_prompt: String,
        /// rocm[:N], cuda[:N], cpu (Candle's CPU backend), cpu-executor[:32|:64].
        #[arg(long, default_value = "cpu-executor")]
        device: String,
        #[arg(long, value_enum, default_value = "f32")]
        dtype: Dt,
        #[arg(long)]
        width: Option<usize>,
        #[arg(long)]
        height: Option<usize>,
        /// Denoising steps (the shape's default if absent).
        #[arg(long)]
        steps: Option<usize>,
        /// Classifier-free guidance scale (<= 1: off; the shape's default if absent).
        #[arg(long)]
        guidance: Option<f64>,
        #[arg(long, value_enum)]
        scheduler: Option<SchedulerKind>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Images to make (seeds seed, seed+1, ...).
        #[arg(long, default_value_t = 1)]
        images: usize,
        /// Output PNG; with several images, `_N` is added before the extension.
        #[arg(long, default_value = "sd.png")]
        out: PathBuf,
    },
    /// Writes a random-weights model directory (diffusers layout) for tests and benchmarks.
    WriteRandom {
        #[arg(long, value_enum)]
        shape: Shape,
        #[arg(long, value_enum, default_value = "f32")]
        dtype: Dt,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        out_dir: PathBuf,
    },
    /// Serves OpenAI's images API over HTTP until SIGTERM/SIGINT.
    ///
    /// `POST /v1/images/generations` takes `{"prompt", "n", "size": "WxH", "response_format":
    /// "b64_json", "model"}` plus the extensions `seed`, `steps`, `guidance_scale`,
    /// `negative_prompt`, and answers `{"created", "data": [{"b64_json": PNG}]}`; image k of a
    /// request uses seed + k. Also `GET /v1/models`, `GET /health` (503 until loaded and while
    /// shutting down) and `GET /metrics` (Prometheus text). Errors are OpenAI error objects;
    /// a full queue answers 429 with Retry-After. Logs go to stderr (RUST_LOG filters them).
    #[command(after_help = "Example:\n  sd-worker serve --model ./sd15 --shape sd15 --device rocm:0 --api-key secret\n  curl -s localhost:8080/v1/images/generations -H 'Authorization: Bearer secret' \\\n    -H 'Content-Type: application/json' -d '{\"prompt\": \"a red fox\", \"size\": \"512x512\", \"seed\": 7}'")]
    Serve {
        /// Model directory in the diffusers layout.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, value_enum, default_value = "sd15")]
        shape: Shape,
        /// rocm[:N], cuda[:N], cpu (Candle's CPU backend), cpu-executor[:32|:64].
        #[arg(long, default_value = "cpu-executor")]
        device: String,
        #[arg(long, value_enum, default_value = "f32")]
        dtype: Dt,
        #[command(flatten)]
        listen: openai_http::Listen,
        /// Requests waiting besides the one generating, at most (429 beyond).
        #[arg(long, default_value_t = 16)]
        max_queue: usize,
        /// Largest `n` (images per request).
        #[arg(long, default_value_t = 4)]
        max_images: usize,
        /// The model id clients send (default: the model directory's name).
        #[arg(long)]
        served_model_name: Option<String>,
        /// Seconds running and queued requests may go on after SIGTERM before they are cancelled.
        #[arg(long, default_value_t = 30.0)]
        shutdown_grace: f64,
    },
    /// Times UNet steps and VAE decodes on random weights; prints JSON lines.
    Bench {
        #[arg(long, value_enum, default_value = "sd15")]
        shape: Shape,
        #[arg(long, default_value_t = 10)]
        steps: usize,
        #[arg(long, default_value = "cpu-executor")]
        device: String,
        #[arg(long, value_enum, default_value = "f16")]
        dtype: Dt,
        /// Batch of the UNet (2: classifier-free guidance).
        #[arg(long, default_value_t = 2)]
        batch: usize,
        #[arg(long)]
        width: Option<usize>,
        #[arg(long)]
        height: Option<usize>,
    },
}

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn step(&mut self, step: usize, steps: usize) {
        self.0.set_length(steps as u64);
        self.0.set_position(step as u64);
    }
}

fn generate_cmd(cmd: Cmd) -> Result<(), SdError> {
    let Cmd::Generate { model, shape, prompt, negative_prompt, device, dtype, width, height, steps, guidance, scheduler, seed, images, out } = cmd else {
        unreachable!("called for generate only")
    };
    let dev = sd_worker::device(&device)?;
    let t0 = Instant::now();
    let pipe = Pipeline::load(&model, shape.config(), &dev, dtype.into())?;
    eprintln!("loaded {} on {device} in {:.2?}", model.display(), t0.elapsed());
    for k in 0..images {
        let mut req = Request::new(&pipe.cfg, &prompt, seed.wrapping_add(k as u64));
        req.negative_prompt = negative_prompt.clone();
        req.width = width.unwrap_or(req.width);
        req.height = height.unwrap_or(req.height);
        req.steps = steps.unwrap_or(req.steps);
        req.guidance = guidance.unwrap_or(req.guidance);
        req.scheduler = scheduler.unwrap_or(req.scheduler);
        let bar = indicatif::ProgressBar::new(req.steps as u64);
        bar.set_style(indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} steps {elapsed_precise} ({per_sec})").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
        bar.set_message(format!("image {}/{images}", k + 1));
        let mut progress = Bar(bar);
        let g = pipe.generate(&req, &mut progress)?;
        progress.0.finish_and_clear();
        let path = if images == 1 {
            out.clone()
        } else {
            let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            out.with_file_name(format!("{stem}_{}.png", k + 1))
        };
        sd_worker::save_png(&g.image, &path)?;
        let t = &g.timings;
        let per: Vec<String> = t.steps.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1e3)).collect();
        eprintln!(
            "wrote {} (seed {}): text {:.1} ms, steps [{}] ms, decode {:.1} ms, total {:.2?}",
            path.display(),
            req.seed,
            t.text.as_secs_f64() * 1e3,
            per.join(", "),
            t.decode.as_secs_f64() * 1e3,
            t.total
        );
    }
    Ok(())
}

fn serve_cmd(cmd: Cmd) -> Result<(), Box<dyn std::error::Error>> {
    let Cmd::Serve { model, shape, device, dtype, listen, max_queue, max_images, served_model_name, shutdown_grace } = cmd else {
        unreachable!("called for serve only")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let addr = listen.addr()?;
    if !(shutdown_grace >= 0.0 && shutdown_grace.is_finite()) {
        return Err("--shutdown-grace must be a number of seconds >= 0".into());
    }
    if max_images == 0 {
        return Err("--max-images must be at least 1".into());
    }
    let dev = sd_worker::device(&device)?; // a bad --device fails before binding
    drop(dev);
    let name = served_model_name.unwrap_or_else(|| model.canonicalize().unwrap_or_else(|_| model.clone()).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "sd".into()));
    let config = sd_worker::serve::ServeConfig { model_name: name, api_key: listen.api_key, max_queue, max_images, shutdown_grace: std::time::Duration::from_secs_f64(shutdown_grace), ..Default::default() };
    sd_worker::serve::run(config, addr, move || {
        let dev = sd_worker::device(&device)?;
        Pipeline::load(&model, shape.config(), &dev, dtype.into())
    })
    .map_err(Into::into)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn bench_cmd(shape: Shape, steps: usize, device: &str, dtype: DType, batch: usize, width: Option<usize>, height: Option<usize>) -> Result<(), SdError> {
    let dev = sd_worker::device(device)?;
    let cfg = shape.config();
    let (w, h) = (width.unwrap_or(cfg.width), height.unwrap_or(cfg.height));
    let s = cfg.latent_scale();
    if !w.is_multiple_of(s) || !h.is_multiple_of(s) || steps == 0 || batch == 0 {
        return Err(SdError::Invalid(format!("{w}x{h} must be multiples of {s}; steps and batch at least 1")));
    }
    let models = random::models(&cfg, 0, dtype, &dev)?;
    let text_dim = cfg.unet.cross_attention_dim;
    let lat = sd_worker::host_noise(1, &[batch, 4, h / s, w / s])?.to_dtype(dtype)?.to_device(&dev)?;
    let text = sd_worker::host_noise(2, &[batch, cfg.clip.max_len(), text_dim])?.to_dtype(dtype)?.to_device(&dev)?;
    let line = |op: &str, ms: &[f64]| {
        let j = serde_json::json!({
            "shape": format!("{shape:?}").to_lowercase(), "op": op, "device": device, "dtype": format!("{dtype:?}").to_lowercase(),
            "width": w, "height": h, "batch": batch, "runs": ms.len(), "median_ms": median(ms.to_vec()),
            "min_ms": ms.iter().cloned().fold(f64::INFINITY, f64::min), "ms": ms,
        });
        println!("{j}");
    };
    // One warm-up each (kernel loading, GEMM heuristics, allocator), then timed runs.
    let unet = |t: f64| -> Result<f64, SdError> {
        let t0 = Instant::now();
        let y = models.unet.forward(&lat, t, &text)?;
        sd_worker::sync(&y)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    unet(999.0)?;
    let ms = (0..steps).map(|i| unet(999.0 - i as f64)).collect::<Result<Vec<_>, _>>()?;
    line("unet_step", &ms);
    profile("unet_step", &dev, || unet(500.0).map(|_| ()))?;
    let z: Tensor = lat.narrow(0, 0, 1)?;
    let vae = || -> Result<f64, SdError> {
        let t0 = Instant::now();
        let y = models.vae.decode(&z)?;
        sd_worker::sync(&y)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    vae()?;
    let ms = (0..steps.min(3)).map(|_| vae()).collect::<Result<Vec<_>, _>>()?;
    line("vae_decode", &ms);
    profile("vae_decode", &dev, || vae().map(|_| ()))?;
    Ok(())
}

/// One more run of `f` with the backend's per-op profiler on (this project's devices
/// only), printed to stderr as a table: where the time of a step goes, op by op
/// (convolutions by shape). Runs after the timed ones: the profiler's events cost time.
fn profile(what: &str, dev: &candle_core::Device, f: impl FnOnce() -> Result<(), SdError>) -> Result<(), SdError> {
    let Some(rd) = candle_rocm::RocmDevice::from_candle(dev) else { return Ok(()) };
    rd.set_profiling(true);
    let r = f();
    rd.set_profiling(false);
    let p = rd.take_profile()?;
    r?;
    eprintln!("profile of one {what} (device time per backend op, summed over calls):\n{}", p.table());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r: Result<(), Box<dyn std::error::Error>> = match cli.cmd {
        c @ Cmd::Generate { .. } => generate_cmd(c).map_err(Into::into),
        c @ Cmd::Serve { .. } => serve_cmd(c),
        Cmd::WriteRandom { shape, dtype, seed, out_dir } => random::write_model(shape, &out_dir, seed, dtype.into()).map(|()| eprintln!("wrote {:?} random weights to {}", shape, out_dir.display())).map_err(Into::into),
        Cmd::Bench { shape, steps, device, dtype, batch, width, height } => bench_cmd(shape, steps, &device, dtype.into(), batch, width, height).map_err(Into::into),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sd-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
