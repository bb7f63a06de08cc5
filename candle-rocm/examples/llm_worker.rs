//! An LLM worker on a GGUF llama model: loads the model and its tokenizer, runs the prompt
//! (prefill), then generates with a KV cache, streaming the text, and reports prefill and
//! decode tokens/s.
//!
//!   cargo run --release -p candle-rocm --features cuda --example llm_worker -- \
//!       --model model.gguf --tokenizer tokenizer.json --device cuda:0 --prompt "the" -n 32
//!
//! `--device rocm:N` (AMD GPU, `rocm` feature), `cuda:N` (NVIDIA GPU running our PTX, `cuda`
//! feature), `cpu-executor` (our kernels on the CPU executor, wave 64; `cpu-executor:32`),
//! `cpu` (Candle's own CPU backend, the reference). Sampling: greedy by default;
//! `--temperature T` samples, `--top-p P` with it keeps the top-p mass; `--seed N`.
//! A model for tests and benchmarks: `cargo run -p gguf-llama -- --out m.gguf --type q4_0`.
use candle_core::{Device, Tensor};
use candle_rocm::RocmDevice;
use candle_transformers::generation::LogitsProcessor;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: llm_worker --model FILE.gguf --tokenizer tokenizer.json [--device rocm:N|cuda:N|cpu|cpu-executor[:32]] [--prompt TEXT] [-n MAX_NEW_TOKENS] [--temperature T] [--top-p P] [--seed N]";

struct Args {
    model: PathBuf,
    tokenizer: PathBuf,
    device: String,
    prompt: String,
    max_new: usize,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: u64,
}

fn parse() -> Result<Args, String> {
    let (mut model, mut tokenizer) = (None, None);
    let mut a = Args { model: PathBuf::new(), tokenizer: PathBuf::new(), device: "cpu-executor".into(), prompt: "the".into(), max_new: 16, temperature: None, top_p: None, seed: 299792458 };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        let num = |s: String, what: &str| s.parse::<f64>().map_err(|e| format!("{what}: {e}"));
        match k.as_str() {
            "--model" => model = Some(PathBuf::from(v()?)),
            "--tokenizer" => tokenizer = Some(PathBuf::from(v()?)),
            "--device" => a.device = v()?,
            "--prompt" => a.prompt = v()?,
            "-n" | "--max-new-tokens" => a.max_new = v()?.parse().map_err(|e| format!("-n: {e}"))?,
            "--temperature" => a.temperature = Some(num(v()?, "--temperature")?),
            "--top-p" => a.top_p = Some(num(v()?, "--top-p")?),
            "--seed" => a.seed = v()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    a.model = model.ok_or("--model is required")?;
    a.tokenizer = tokenizer.unwrap_or_else(|| a.model.with_file_name("tokenizer.json"));
    if a.top_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err("--top-p must be in [0, 1]".into());
    }
    Ok(a)
}

/// An error's message without the backtrace Candle may attach (`RUST_BACKTRACE`).
fn msg(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    s.split("\n   0: ").next().unwrap_or_default().trim_end().to_string()
}

/// `cpu` (Candle's own CPU backend), or one of ours ([`RocmDevice::from_spec`]: `rocm:N`,
/// `cuda:N`, `cpu-executor[:32|:64]`).
fn device(spec: &str) -> Result<(Device, String), String> {
    if spec == "cpu" {
        return Ok((Device::Cpu, "Candle CPU backend".into()));
    }
    let d = RocmDevice::from_spec(spec).map_err(msg)?;
    Ok((d.as_candle(), d.name().to_string()))
}

fn run(a: Args) -> Result<(), String> {
    let (dev, name) = device(&a.device)?;
    let tok = gguf_llama::load_tokenizer(&a.tokenizer).map_err(msg)?;
    let t0 = Instant::now();
    let mut m = gguf_llama::load(&a.model, &dev).map_err(msg)?;
    eprintln!("model {} ({:?}) on {name}, loaded in {:.2} s", a.model.display(), m.dtype, t0.elapsed().as_secs_f64());
    let prompt = tok.encode(a.prompt.as_str(), false).map_err(|e| format!("tokenizing the prompt: {e}"))?.get_ids().to_vec();
    if prompt.is_empty() {
        return Err("the prompt encodes to no tokens".into());
    }
    if let Some(v) = m.vocab {
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= v) {
            return Err(format!("the tokenizer gives id {bad}, past the model's vocabulary of {v}: mismatched tokenizer"));
        }
    }
    let mut sampler = LogitsProcessor::new(a.seed, a.temperature, a.top_p);
    let e = |x: candle_core::Error| msg(x);
    let (mut tokens, mut printed) = (prompt.clone(), 0usize);
    let mut out = std::io::stdout();
    print!("{}", a.prompt);
    let t_prefill = Instant::now();
    let input = Tensor::new(prompt.as_slice(), &dev).and_then(|t| t.unsqueeze(0)).map_err(e)?;
    let logits = m.model.forward(&input, 0).and_then(|l| l.squeeze(0)).map_err(e)?;
    let mut next = sampler.sample(&logits).map_err(e)?;
    let prefill_s = t_prefill.elapsed().as_secs_f64();
    let t_decode = Instant::now();
    let mut generated = 0;
    while generated < a.max_new {
        tokens.push(next);
        generated += 1;
        // Stream: decode the generated part and print what is new.
        let text = tok.decode(&tokens[prompt.len()..], true).map_err(|e| format!("decoding: {e}"))?;
        if text.len() > printed && text.is_char_boundary(printed) {
            print!("{}", &text[printed..]);
            printed = text.len();
            let _ = out.flush();
        }
        if Some(next) == m.eos || generated == a.max_new {
            break;
        }
        let input = Tensor::new(&[next], &dev).and_then(|t| t.unsqueeze(0)).map_err(e)?;
        let logits = m.model.forward(&input, tokens.len() - 1).and_then(|l| l.squeeze(0)).map_err(e)?;
        next = sampler.sample(&logits).map_err(e)?;
    }
    let decode_s = t_decode.elapsed().as_secs_f64();
    println!();
    eprintln!(
        "prefill: {} tokens in {:.3} s = {:.1} tokens/s; decode: {} tokens in {:.3} s = {:.1} tokens/s",
        prompt.len(),
        prefill_s,
        prompt.len() as f64 / prefill_s,
        generated.saturating_sub(1),
        decode_s,
        generated.saturating_sub(1) as f64 / decode_s.max(1e-9)
    );
    Ok(())
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llm_worker: error: {e}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}
