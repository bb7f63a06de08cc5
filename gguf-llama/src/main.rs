//! `gguf-llama --out model.gguf [--type q4_0] [--shape tiny|1b|8b] [--seed N]
//! [--tokenizer tokenizer.json] [--dequantized]`: writes a llama GGUF with seeded random
//! weights and a matching `tokenizer.json` (next to the model unless `--tokenizer` says
//! where). `--dequantized` stores the quantized weights dequantized as f32 (the same model
//! without quantization). Large shapes hold every quantized tensor in memory while writing
//! (8b: about 4.5 GB for q4_0, 16 GB for f16).
use gguf_llama::{parse_type, write_gguf, write_tokenizer, LlamaShape, Storage};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: gguf-llama --out FILE [--type f32|f16|bf16|q4_0|q4_1|q5_0|q5_1|q8_0|q2k|q3k|q4k|q5k|q6k] [--shape tiny|1b|8b] [--seed N] [--tokenizer FILE] [--dequantized]";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gguf-llama: error: {e}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (mut out, mut ty, mut shape, mut seed, mut tok, mut deq) = (None, "q4_0".to_string(), "tiny".to_string(), 0u64, None, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--out" => out = Some(PathBuf::from(val()?)),
            "--type" => ty = val()?,
            "--shape" => shape = val()?,
            "--seed" => seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--tokenizer" => tok = Some(PathBuf::from(val()?)),
            "--dequantized" => deq = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let out = out.ok_or("--out is required")?;
    let dtype = parse_type(&ty).ok_or_else(|| format!("unknown --type {ty}"))?;
    let sh = LlamaShape::by_name(&shape).ok_or_else(|| format!("unknown --shape {shape} (tiny, 1b, 8b)"))?;
    let tok = tok.unwrap_or_else(|| out.with_file_name("tokenizer.json"));
    let storage = if deq { Storage::Dequantized(dtype) } else { Storage::Quantized(dtype) };
    for f in [&out, &tok] {
        if let Some(dir) = f.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let t0 = std::time::Instant::now();
    write_gguf(&out, &sh, storage, seed).map_err(|e| e.to_string())?;
    write_tokenizer(&tok, sh.vocab).map_err(|e| e.to_string())?;
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!("wrote {} ({shape}, {dtype:?}{}, seed {seed}, {bytes} bytes) and {} in {:.1} s", out.display(), if deq { " dequantized to f32" } else { "" }, tok.display(), t0.elapsed().as_secs_f64());
    Ok(())
}
