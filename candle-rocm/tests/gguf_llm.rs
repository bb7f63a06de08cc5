//! The LLM worker's model path (`gguf_llama::load` + candle-transformers' quantized llama)
//! on our device against Candle's CPU backend, on a tiny random GGUF written by the
//! `gguf-llama` tool; malformed files are errors.
//!
//! Tolerance. Quantized inference is not exact on either backend: every `QMatMul` rounds
//! its activations to 8 bits (ours: q8_1 with f32 scales per 32 values; Candle's CPU: q8_0
//! per 32 with f16 scales for Q4_0, q8_K per 256 for the k-quants), and that noise goes
//! through the layers. So the reference is the *same weights without quantization*: the
//! tool writes the quantized weights dequantized to f32 (`--dequantized`), and Candle's CPU
//! runs that file with plain f32 matmuls. Checks, over prefill + decode steps:
//! - our run of the f32 file equals the reference to f32 rounding (summation order):
//!   `|ours - ref| <= 1e-3 * rms(ref)` per logit;
//! - our quantized run is no farther from the reference than twice Candle's own quantized
//!   run (RMS over all logits of all steps): the same 8-bit activation scheme class, ours
//!   with blocks no larger than Candle's, so the expected error is at most Candle's; 2x
//!   leaves room for the randomness of a few thousand logits, and a real bug (a wrong
//!   block, scale or layout) gives errors of the order of the logits themselves.
mod common;

use candle_core::{Device, Tensor};
use gguf_llama::{load, write_gguf, LlamaShape, Storage};
use std::path::{Path, PathBuf};

const PROMPT: [u32; 5] = [3, 77, 140, 260, 509];
const DECODE: [u32; 3] = [12, 400, 7];

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("candle-rocm-gguf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Logits of the prompt (last position) and of each decode step, flattened.
fn logits(path: &Path, dev: &Device) -> Vec<f32> {
    let mut m = load(path, dev).unwrap_or_else(|e| panic!("loading on {dev:?}: {e}")).model;
    let mut out = Vec::new();
    let x = Tensor::new(&PROMPT, dev).unwrap().unsqueeze(0).unwrap();
    out.extend(m.forward(&x, 0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    for (i, t) in DECODE.iter().enumerate() {
        let x = Tensor::new(&[*t], dev).unwrap().unsqueeze(0).unwrap();
        out.extend(m.forward(&x, PROMPT.len() + i).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    out
}

fn rms(a: &[f32], b: &[f32]) -> f64 {
    (a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
}

#[test]
fn tiny_llama_logits_match_candle_cpu() {
    let dir = temp_dir("logits");
    for (i, dtype) in [candle_core::quantized::GgmlDType::Q4_0, candle_core::quantized::GgmlDType::Q4K].into_iter().enumerate() {
        let (q, f) = (dir.join(format!("q{i}.gguf")), dir.join(format!("f{i}.gguf")));
        write_gguf(&q, &LlamaShape::TINY, Storage::Quantized(dtype), 11).unwrap();
        write_gguf(&f, &LlamaShape::TINY, Storage::Dequantized(dtype), 11).unwrap();
        let reference = logits(&f, &Device::Cpu);
        let candle_q = logits(&q, &Device::Cpu);
        let scale = rms(&reference, &vec![0.0; reference.len()]);
        let candle_err = rms(&candle_q, &reference);
        assert!(scale > 0.0 && reference.iter().all(|x| x.is_finite()));
        // Q4_0 on every device; Q4K (the same model path, another format) on the last one
        // only (the GPU when there is one), to keep CI short.
        let devs = common::devices();
        let devs = if i == 0 { devs } else { devs[devs.len() - 1..].to_vec() };
        for dev in devs {
            let d = dev.as_candle();
            let ours_f = logits(&f, &d);
            for (k, (a, b)) in ours_f.iter().zip(&reference).enumerate() {
                assert!(((a - b).abs() as f64) <= 1e-3 * scale, "{dtype:?} f32 file on {}: logit {k}: {a} vs {b} (rms {scale})", dev.name());
            }
            let ours_q = logits(&q, &d);
            let ours_err = rms(&ours_q, &reference);
            eprintln!("{dtype:?} on {}: rms(logits) {scale:.4}, quantized error: ours {ours_err:.4e}, Candle CPU {candle_err:.4e}", dev.name());
            assert!(ours_err <= 2.0 * candle_err, "{dtype:?} on {}: our quantized logits are {ours_err:.3e} (RMS) from the f32 model, Candle's {candle_err:.3e}", dev.name());
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn malformed_files_are_errors() {
    let dir = temp_dir("bad");
    let good = dir.join("good.gguf");
    write_gguf(&good, &LlamaShape::TINY, Storage::Quantized(candle_core::quantized::GgmlDType::Q4_0), 1).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let ours = common::devices()[0].as_candle();
    let expect_err = |name: &str, data: &[u8], what: &str| {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        for d in [&Device::Cpu, &ours] {
            match load(&p, d) {
                Ok(_) => panic!("{name}: loaded a {what} file"),
                Err(e) => assert!(e.to_string().contains(name), "{name}: the error names the file: {e}"),
            }
        }
    };
    // Truncated: in the metadata, and in the tensor data.
    expect_err("short.gguf", &bytes[..100], "truncated");
    expect_err("half.gguf", &bytes[..bytes.len() / 2], "truncated");
    expect_err("tail.gguf", &bytes[..bytes.len() - 1000], "truncated");
    // Not a GGUF.
    let mut magic = bytes.clone();
    magic[..4].copy_from_slice(b"GGUX");
    expect_err("magic.gguf", &magic, "bad-magic");
    // An unknown tensor type id: the u32 after token_embd.weight's name and two dims.
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 2, "two dims");
    let ty = at + 4 + 16;
    assert_eq!(u32::from_le_bytes(bytes[ty..ty + 4].try_into().unwrap()), 2, "Q4_0 is GGML type 2");
    for id in [99u32, 1000] {
        let mut bad = bytes.clone();
        bad[ty..ty + 4].copy_from_slice(&id.to_le_bytes());
        expect_err(&format!("type{id}.gguf"), &bad, "wrong-type");
    }
    // Missing model and tokenizer files.
    let missing = dir.join("missing.gguf");
    assert!(load(&missing, &Device::Cpu).err().unwrap().to_string().contains("not found"));
    assert!(gguf_llama::load_tokenizer(&dir.join("missing.json")).is_err());
    std::fs::write(dir.join("bad.json"), b"{ not json").unwrap();
    assert!(gguf_llama::load_tokenizer(&dir.join("bad.json")).is_err());
    // The good file loads.
    assert!(load(&good, &ours).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tokenizer_round_trip() {
    let dir = temp_dir("tok");
    let p = dir.join("tokenizer.json");
    gguf_llama::write_tokenizer(&p, LlamaShape::TINY.vocab).unwrap();
    let tok = gguf_llama::load_tokenizer(&p).unwrap();
    assert_eq!(tok.get_vocab_size(true), LlamaShape::TINY.vocab);
    let text = "the rain in Spain, 42 times: ünïcode!";
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert!(ids.iter().all(|&i| (i as usize) < LlamaShape::TINY.vocab));
    assert!(ids.len() < text.len(), "merges shorten the text ({} ids for {} bytes)", ids.len(), text.len());
    assert_eq!(tok.decode(&ids, true).unwrap(), text);
    // The 1b/8b vocabulary (128256 ids) is built the same way.
    let big = dir.join("big.json");
    gguf_llama::write_tokenizer(&big, LlamaShape::LLAMA_8B.vocab).unwrap();
    let tok = gguf_llama::load_tokenizer(&big).unwrap();
    assert_eq!(tok.get_vocab_size(true), LlamaShape::LLAMA_8B.vocab);
    let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
    assert_eq!(tok.decode(&ids, true).unwrap(), text);
    std::fs::remove_dir_all(&dir).ok();
}
