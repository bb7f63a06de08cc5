//! The tiny random-weights pipeline on our backend (CPU executor) against Candle's own CPU
//! backend, the `sd-worker` binary end to end, and bad model files.

use candle_core::{DType, Device, Tensor};
use sd_worker::{random, Pipeline, Request, SchedulerKind, SdError, Shape};
use std::path::Path;

fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    random::write_model(Shape::Tiny, dir.path(), 5, DType::F32).unwrap();
    dir
}

/// Max |a - b| over max |a|: the error relative to the output's scale.
fn rel_err(want: &Tensor, got: &Tensor) -> f64 {
    assert_eq!(want.dims(), got.dims());
    let w = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let g = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale = w.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let diff = w.iter().zip(&g).fold(0f32, |m, (a, b)| m.max((a - b).abs())) as f64;
    assert!(scale > 0.0 && diff.is_finite(), "degenerate output");
    diff / scale
}

fn run(dir: &Path, dev: &Device, sched: SchedulerKind) -> sd_worker::Generated {
    let pipe = Pipeline::load(dir, Shape::Tiny.config(), dev, DType::F32).unwrap();
    let mut req = Request::new(&pipe.cfg, "a photo of the cat, painting", 42);
    req.negative_prompt = "blurry".into();
    req.steps = 2;
    req.scheduler = sched;
    assert!(req.guided());
    pipe.generate(&req, &mut ()).unwrap()
}

/// f32 on both sides, with different summation orders (im2col + GEMM convolutions, other
/// reduction orders in norms and softmax): each op differs by a few ulp (~1e-7 relative);
/// through CLIP, two guided UNet steps and the VAE, about 60 layers deep, candle-rocm's own
/// UNet/VAE tests measure ~1.5e-6 of the output scale per network; here measured 3.7e-6
/// (latents) and 3.9e-6 (image) with DDIM, 3.3e-6 and 3.4e-6 with Euler ancestral. 1e-4 leaves room for
/// that growth while a wrong op (or noise that differs by device) moves the output by
/// orders of magnitude more (the latents are dominated by the seeded noise: a different
/// draw changes them by ~100% of their scale).
const F32_BOUND: f64 = 1e-4;

fn check(sched: SchedulerKind, spec: &str) {
    let dir = tiny_model();
    let want = run(dir.path(), &Device::Cpu, sched);
    assert_eq!(want.latents.dims(), &[1, 4, 8, 8]);
    assert_eq!(want.image.dims(), &[3, 16, 16]);
    {
        let got = run(dir.path(), &sd_worker::device(spec).unwrap(), sched);
        let (el, ei) = (rel_err(&want.latents, &got.latents), rel_err(&want.image, &got.image));
        eprintln!("{sched:?} on {spec}: latents {el:.2e}, image {ei:.2e} of the output scale");
        assert!(el <= F32_BOUND, "{sched:?} latents on {spec}: {el:.2e}");
        assert!(ei <= F32_BOUND, "{sched:?} image on {spec}: {ei:.2e}");
    }
}

#[test]
fn tiny_ddim_two_steps_match_candle_cpu() {
    check(SchedulerKind::Ddim, "cpu-executor:64");
}

/// Euler ancestral adds noise at every step: drawn on the host, it is the same on every
/// device. (Waves of 32 here, 64 above: each executor run takes ~30 s unoptimised.)
#[test]
fn tiny_euler_ancestral_two_steps_match_candle_cpu() {
    check(SchedulerKind::EulerAncestral, "cpu-executor:32");
}

#[test]
fn tiny_tokenizer_merges_and_pads() {
    let dir = tiny_model();
    let cfg = Shape::Tiny.config();
    let tok = sd_worker::tokenizer::ClipTokenizer::load(&dir.path().join("tokenizer"), &cfg.clip).unwrap();
    let vocab: std::collections::HashMap<String, u32> = serde_json::from_str(&std::fs::read_to_string(dir.path().join("tokenizer/vocab.json")).unwrap()).unwrap();
    let ids = tok.encode("The  Cat").unwrap();
    let v = |s: &str| vocab[s];
    // Lower-cased, split into words, "the" merged by BPE, "cat" left as byte symbols.
    let mut want = vec![v("<|startoftext|>"), v("the</w>"), v("c"), v("a"), v("t</w>"), v("<|endoftext|>")];
    want.resize(cfg.clip.max_len(), v("<|endoftext|>"));
    assert_eq!(ids, want);
    // Over-long prompts are cut to the encoder's length, keeping the end token.
    let long = tok.encode(&"and ".repeat(50)).unwrap();
    assert_eq!(long.len(), cfg.clip.max_len());
    assert_eq!(*long.last().unwrap(), v("<|endoftext|>"));
}

#[test]
fn worker_writes_png_equal_to_library_image() {
    let dir = tiny_model();
    let out = dir.path().join("out.png");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_sd-worker"))
        .args(["generate", "--shape", "tiny", "--device", "cpu-executor", "--steps", "2", "--seed", "7", "--prompt", "a red fox"])
        .arg("--model")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let png = image::open(&out).unwrap().to_rgb8();
    assert_eq!(png.dimensions(), (16, 16));
    // The same request through the library on Candle's CPU: pixels within one 8-bit step.
    let pipe = Pipeline::load(dir.path(), Shape::Tiny.config(), &Device::Cpu, DType::F32).unwrap();
    let mut req = Request::new(&pipe.cfg, "a red fox", 7);
    req.steps = 2;
    let img = pipe.generate(&req, &mut ()).unwrap().image;
    let want = (img.permute((1, 2, 0)).unwrap() * 255.).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let worst = png.as_raw().iter().zip(&want).map(|(&g, &w)| (g as f32 - w).abs()).fold(0f32, f32::max);
    assert!(worst <= 1.0, "PNG differs from the library's image by {worst} levels");
    let spread = png.as_raw().iter().max().unwrap() - png.as_raw().iter().min().unwrap();
    assert!(spread > 0, "flat image");
}

fn load_err(dir: &Path) -> SdError {
    match Pipeline::load(dir, Shape::Tiny.config(), &Device::Cpu, DType::F32) {
        Ok(_) => panic!("loaded a broken model"),
        Err(e) => e,
    }
}

#[test]
fn missing_and_malformed_files_are_errors() {
    let dir = tiny_model();
    let p = dir.path();
    let unet = p.join("unet/diffusion_pytorch_model.safetensors");
    let vae = p.join("vae/diffusion_pytorch_model.safetensors");
    let good_unet = std::fs::read(&unet).unwrap();

    std::fs::remove_file(&unet).unwrap();
    assert!(matches!(load_err(p), SdError::MissingFile { ref path, .. } if *path == unet));

    // Truncated: the header promises more data than the file has.
    std::fs::write(&unet, &good_unet[..good_unet.len() / 2]).unwrap();
    assert!(matches!(load_err(p), SdError::Malformed { ref path, .. } if *path == unet), "{}", load_err(p));

    // Not safetensors at all.
    std::fs::write(&unet, b"not a safetensors file").unwrap();
    assert!(matches!(load_err(p), SdError::Malformed { ref path, .. } if *path == unet));
    std::fs::write(&unet, &good_unet).unwrap();

    // Valid safetensors, one tensor missing, then one of the wrong shape.
    let mut t = candle_core::safetensors::load(&vae, &Device::Cpu).unwrap();
    let name = "decoder.conv_in.weight";
    let w = t.remove(name).unwrap();
    candle_core::safetensors::save(&t, &vae).unwrap();
    let e = load_err(p);
    assert!(matches!(e, SdError::Malformed { ref path, .. } if *path == vae), "{e}");
    t.insert(name.into(), w.narrow(0, 0, 1).unwrap());
    candle_core::safetensors::save(&t, &vae).unwrap();
    let e = load_err(p);
    assert!(matches!(e, SdError::Malformed { ref path, .. } if *path == vae), "{e}");

    // The binary reports it and fails, without a panic.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sd-worker"))
        .args(["generate", "--shape", "tiny", "--device", "cpu", "--prompt", "x", "--out"])
        .arg(p.join("x.png"))
        .arg("--model")
        .arg(p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("malformed VAE weights") && !err.contains("panicked"), "{err}");
    assert!(!p.join("x.png").exists());

    // Tokenizer: a vocabulary that is not JSON.
    std::fs::write(p.join("tokenizer/vocab.json"), b"{oops").unwrap();
    assert!(matches!(load_err(p), SdError::Tokenizer { .. }));
}
