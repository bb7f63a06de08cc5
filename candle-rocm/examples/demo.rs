//! `cargo xtask demo`: what the build produced, then a small LLM generating on the best device.
//!
//! 1. A summary of the kernels built into the `kernels` crate: architectures, code-object and
//!    PTX sizes, kernel and instance counts, spills and scratch (`--full`: every kernel's
//!    registers, LDS and occupancy per architecture).
//! 2. A tiny llama (`candle_transformers::models::llama`, unmodified; random weights from a
//!    fixed seed, written here) on the best device this build reaches: an AMD GPU (`rocm`
//!    feature), an NVIDIA GPU (`cuda` feature), else the CPU executor. It prefills a prompt,
//!    generates greedily with the KV cache, prints the tokens and tokens/s, and checks the
//!    tokens against Candle's own CPU backend running the same weights.
//!
//!   cargo run --release -p candle-rocm --example demo [--features cuda|rocm] [-- --full] [-- -n TOKENS]
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use candle_rocm::RocmDevice;
use candle_transformers::models::llama::{Cache, Config, Llama};
use std::collections::HashMap;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--full");
    let steps = args
        .iter()
        .position(|a| a == "-n")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(24usize);
    build_summary(full);
    if let Err(e) = llm(steps) {
        eprintln!("demo: error: {e}");
        std::process::exit(1);
    }
}

/// What `build-support` compiled into the `kernels` crate.
fn build_summary(full: bool) {
    let b = &kernels::__KERNEL_BINARIES;
    let archs = b.archs();
    let mut symbols: Vec<&str> = Vec::new();
    for s in b.stats {
        if !symbols.contains(&s.symbol) {
            symbols.push(s.symbol);
        }
    }
    let kernels = b.kernels().count();
    let bytes: usize = b.code_objects.iter().map(|c| c.bytes.len()).sum();
    let spills: u32 = b.stats.iter().map(|s| s.vgpr_spills + s.sgpr_spills).sum();
    let scratch: u32 = b.stats.iter().map(|s| s.scratch_bytes).sum();
    println!("== built: crate `{}` ==", b.crate_name);
    if archs.is_empty() {
        println!("no AMD code objects (KERNEL_SKIP_GPU_BUILD or KERNEL_ARCHS empty)");
    } else {
        println!("AMD code objects for {} architectures: {} ({:.1} MB in all)", archs.len(), archs.join(", "), bytes as f64 / 1e6);
    }
    match b.ptx {
        Some(ptx) => println!("NVIDIA PTX for {}: {:.1} MB", b.ptx_target, ptx.len() as f64 / 1e6),
        None => println!("no PTX (KERNEL_PTX=0)"),
    }
    println!(
        "{kernels} kernels, {} instances (one per type); spills: {spills}, scratch bytes: {scratch} (over every instance and architecture)",
        symbols.len()
    );
    if !full {
        println!("(every instance's registers, LDS and occupancy per architecture: cargo xtask demo --full)");
        return;
    }
    println!("\nper instance and architecture: VGPR/SGPR, LDS bytes, waves per SIMD");
    print!("{:<36}", "instance");
    for a in &archs {
        print!(" {:>20}", a);
    }
    println!();
    for sym in &symbols {
        print!("{sym:<36}");
        for a in &archs {
            match b.stats_for(sym, a) {
                Some(s) => print!(" {:>20}", format!("{}/{} {} {}", s.vgpr, s.sgpr, s.lds_bytes, s.occupancy)),
                None => print!(" {:>20}", "-"),
            }
        }
        println!();
    }
}

/// The demo model: 4 layers, 256 wide, 8 query and 4 key/value heads, 512 tokens.
fn config() -> Config {
    Config {
        hidden_size: 256,
        intermediate_size: 512,
        vocab_size: 512,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: 256,
        tie_word_embeddings: false,
    }
}

/// Random weights with Candle's names and shapes, from a fixed seed: every tensor Candle
/// initialises to a constant (the norm scales) is kept, the others get uniform values of
/// standard deviation 1 (embeddings) or 1/sqrt(fan_in).
fn weights(cfg: &Config) -> candle_core::Result<HashMap<String, Tensor>> {
    let vm = VarMap::new();
    Llama::load(VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu), cfg)?;
    let data = vm.data().lock().unwrap();
    let mut out = HashMap::new();
    for (name, var) in data.iter() {
        let t = var.as_tensor();
        let flat = t.flatten_all()?.to_vec1::<f32>()?;
        if flat.iter().all(|x| *x == flat[0]) {
            out.insert(name.clone(), t.clone());
            continue;
        }
        let std = if name.contains("embed") { 1.0 } else { 1.0 / (t.dims()[1] as f32).sqrt() };
        let b = 3f32.sqrt() * std;
        // splitmix64 seeded by the tensor's name.
        let mut s = name.bytes().fold(0x5eed_u64, |h, c| h.wrapping_mul(0x100_0000_01b3) ^ c as u64);
        let values: Vec<f32> = (0..flat.len())
            .map(|_| {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                let u = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
                (2.0 * u - 1.0) * b
            })
            .collect();
        out.insert(name.clone(), Tensor::from_vec(values, t.shape(), &Device::Cpu)?);
    }
    Ok(out)
}

/// The best device of this build, and why the GPUs were not taken.
fn best_device() -> (Device, String, Vec<String>) {
    let mut skipped = Vec::new();
    for spec in ["rocm:0", "cuda:0"] {
        match RocmDevice::from_spec(spec) {
            Ok(d) => return (d.as_candle(), d.name().to_string(), skipped),
            Err(e) => {
                let msg = e.to_string();
                skipped.push(format!("{spec}: {}", msg.lines().next().unwrap_or_default()));
            }
        }
    }
    let d = RocmDevice::from_spec("cpu-executor").expect("the CPU executor is always there");
    (d.as_candle(), d.name().to_string(), skipped)
}

struct Run {
    tokens: Vec<u32>,
    prefill_s: f64,
    decode_s: f64,
}

/// Prefill `prompt`, then `steps` greedy decode steps with the KV cache.
fn generate(cfg: &Config, w: &HashMap<String, Tensor>, dev: &Device, prompt: &[u32], steps: usize) -> candle_core::Result<Run> {
    let w = w.iter().map(|(k, v)| Ok((k.clone(), v.to_device(dev)?))).collect::<candle_core::Result<HashMap<_, _>>>()?;
    let model = Llama::load(VarBuilder::from_tensors(w, DType::F32, dev), cfg)?;
    let mut cache = Cache::new(true, DType::F32, cfg, dev)?;
    let t = Instant::now();
    let logits = model.forward(&Tensor::new(prompt, dev)?.unsqueeze(0)?, 0, &mut cache)?;
    let mut next = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?[0];
    let prefill_s = t.elapsed().as_secs_f64();
    let mut tokens = vec![next];
    let t = Instant::now();
    for i in 0..steps.saturating_sub(1) {
        let logits = model.forward(&Tensor::new(&[next], dev)?.unsqueeze(0)?, prompt.len() + i, &mut cache)?;
        next = logits.argmax(D::Minus1)?.flatten_all()?.to_vec1::<u32>()?[0];
        tokens.push(next);
    }
    Ok(Run { tokens, prefill_s, decode_s: t.elapsed().as_secs_f64() })
}

fn llm(steps: usize) -> candle_core::Result<()> {
    let cfg = config();
    let steps = steps.clamp(1, cfg.max_position_embeddings - 16);
    let (dev, name, skipped) = best_device();
    println!("\n== LLM: candle-transformers llama, random weights ==");
    println!(
        "model: {} layers, hidden {}, {} heads ({} key/value), vocabulary {}, f32; prompt 8 tokens, {steps} greedy steps",
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size
    );
    println!("device: {name}");
    for s in &skipped {
        println!("  (not used: {s})");
    }
    let w = weights(&cfg)?;
    let prompt: Vec<u32> = vec![1, 17, 42, 5, 88, 23, 60, 7];
    let ours = generate(&cfg, &w, &dev, &prompt, steps)?;
    println!("prompt tokens:    {prompt:?}");
    println!("generated tokens: {:?}", ours.tokens);
    println!(
        "prefill: {} tokens in {:.1} ms; decode: {} tokens in {:.1} ms = {:.1} tokens/s",
        prompt.len(),
        ours.prefill_s * 1e3,
        ours.tokens.len() - 1,
        ours.decode_s * 1e3,
        (ours.tokens.len() - 1) as f64 / ours.decode_s.max(1e-9)
    );
    let reference = generate(&cfg, &w, &Device::Cpu, &prompt, steps)?;
    let same = reference.tokens.iter().zip(&ours.tokens).take_while(|(a, b)| a == b).count();
    if same == ours.tokens.len() {
        println!("Candle's CPU backend generates the same {same} tokens from the same weights");
    } else {
        println!(
            "Candle's CPU backend agrees on the first {same} of {} tokens (random weights make near-ties; f32 sums differ in order)",
            ours.tokens.len()
        );
    }
    println!("(random weights: the tokens mean nothing; a real model: `llm-worker generate`, docs/workers.md)");
    Ok(())
}
