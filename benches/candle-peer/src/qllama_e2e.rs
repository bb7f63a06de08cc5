//! The end-to-end quantized LLM benchmark both backends run: `candle-transformers`'
//! `quantized_llama` on a GGUF file (written by the project's `gguf-llama` tool: random
//! weights, real llama shapes and block formats), prefill of a pseudo-random prompt, then
//! greedy decode steps with the KV cache. Compiled against Candle's own CUDA backend (the
//! peer, `candle-peer qllama FILE`) and against ours (`candle-rocm` example `qllama_e2e`),
//! so both sides run exactly this code on the same file.
use candle_core::quantized::gguf_file;
use candle_core::{Device, Result, Tensor, D};
use candle_transformers::models::quantized_llama::ModelWeights;
use std::time::Instant;

/// Loads the GGUF model at `path` onto `device`; also returns its vocabulary size.
pub fn load(path: &str, device: &Device) -> Result<(ModelWeights, usize)> {
    let mut file = std::fs::File::open(path).map_err(|e| candle_core::Error::Msg(format!("{path}: {e}")))?;
    let content = gguf_file::Content::read(&mut file).map_err(|e| e.with_path(path))?;
    let vocab = content.tensor_infos.get("token_embd.weight").map(|t| t.shape.dims()[0]).unwrap_or(32000);
    Ok((ModelWeights::from_gguf(content, &mut file, device)?, vocab))
}

/// One run: prefill `prompt` tokens, then `steps` greedy steps; `(prefill_s, decode_s,
/// first tokens)`. Both timed parts end with the next token on the host.
pub fn run(model: &mut ModelWeights, vocab: usize, device: &Device, prompt: usize, steps: usize) -> Result<(f64, f64, Vec<u32>)> {
    let mut s = 0x9e3779b97f4a7c15u64;
    let ids: Vec<u32> = (0..prompt)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect();
    device.synchronize()?;
    let t = Instant::now();
    let logits = model.forward(&Tensor::new(ids.as_slice(), device)?.unsqueeze(0)?, 0)?;
    let mut next = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?[0];
    let prefill_s = t.elapsed().as_secs_f64();
    let mut tokens = vec![next];
    let t = Instant::now();
    for i in 0..steps {
        let logits = model.forward(&Tensor::new(&[next], device)?.unsqueeze(0)?, prompt + i)?;
        next = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?[0];
        tokens.push(next);
    }
    Ok((prefill_s, t.elapsed().as_secs_f64(), tokens))
}

/// `FILE [--prompt N] [--steps N] [--reps N]` (defaults 512, 128, 5), from the arguments
/// after the first one that ends in `.gguf`.
pub fn args() -> Result<(String, usize, usize, usize)> {
    let a: Vec<String> = std::env::args().collect();
    let file = a.iter().find(|x| x.ends_with(".gguf")).cloned().ok_or_else(|| candle_core::Error::Msg("a .gguf file is required".into()))?;
    let get = |k: &str, d: usize| -> Result<usize> {
        match a.iter().position(|x| x == k).and_then(|i| a.get(i + 1)) {
            Some(v) => v.parse().map_err(|e| candle_core::Error::Msg(format!("{k}: {e}"))),
            None => Ok(d),
        }
    };
    Ok((file, get("--prompt", 512)?, get("--steps", 128)?, get("--reps", 5)?))
}

/// Loads the model, warms up, then prints one JSON line per timed run.
#[allow(dead_code)] // used by the peer only (our example calls `bench_with`)
pub fn bench(backend: &str, device: &Device) -> Result<()> {
    bench_with(backend, device, &mut |_| Ok(()))
}

/// [`bench`], calling `at(true)` after the load and warm-up, before the timed runs (a
/// profiler starts there).
pub fn bench_with(backend: &str, device: &Device, at: &mut dyn FnMut(bool) -> Result<()>) -> Result<()> {
    let (file, prompt, steps, reps) = args()?;
    let t = Instant::now();
    let (mut model, vocab) = load(&file, device)?;
    device.synchronize()?;
    let load_s = t.elapsed().as_secs_f64();
    run(&mut model, vocab, device, 16, 4)?;
    at(true)?;
    let name = std::path::Path::new(&file).file_name().map_or(file.clone(), |n| n.to_string_lossy().into_owned());
    for rep in 0..reps {
        let (p, d, tokens) = run(&mut model, vocab, device, prompt, steps)?;
        println!(
            "{{\"backend\":\"{backend}\",\"model\":\"{name}\",\"rep\":{rep},\"dtype\":\"gguf\",\"prompt\":{prompt},\"steps\":{steps},\"load_s\":{load_s:.3},\"prefill_s\":{p:.6},\"decode_s\":{d:.6},\"prefill_tok_s\":{:.1},\"decode_tok_s\":{:.2},\"first_tokens\":{:?}}}",
            prompt as f64 / p,
            steps as f64 / d,
            &tokens[..tokens.len().min(4)]
        );
    }
    Ok(())
}
