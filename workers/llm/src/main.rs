//! `llm-worker`: generate text with a llama-family model, benchmark decode throughput, or
//! write a random-weight model. `llm-worker --help` lists the options.
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use llm_engine::{Engine, EngineConfig, Event, FinishReason, SamplingParams};
use llm_worker::generate::blocks_needed;
use llm_worker::random::{RandomModel, Shape};
use llm_worker::serve::{load_served, ServeArgs};
use llm_worker::tp::tp_devices;
use llm_worker::{Family, Message, TextTools, TpRunner};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "llm-worker", about = "Llama-family LLM worker on Candle (our backend or Candle's CPU)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate from a prompt through the engine, streaming the text; prints prefill and
    /// decode tokens/s.
    Generate {
        /// A Hugging Face folder (config.json + safetensors) or a GGUF file.
        #[arg(long)]
        model: PathBuf,
        /// tokenizer.json (default: in the folder, or next to the GGUF file).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[arg(long, default_value = "the")]
        prompt: String,
        /// Render the prompt as a user message through the model's chat template.
        #[arg(long)]
        chat: bool,
        /// A system message (with --chat).
        #[arg(long)]
        system: Option<String>,
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long)]
        top_p: Option<f64>,
        #[arg(long, default_value_t = 299792458)]
        seed: u64,
        /// cpu (Candle's CPU), cpu-executor, cuda:N, rocm:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Split the model across this many devices (tensor parallelism): cuda:K..K+N-1,
        /// rocm:K..K+N-1, or N CPU-executor devices.
        #[arg(long, default_value_t = 1)]
        tensor_parallel: usize,
    },
    /// Decode throughput and time to first token at several concurrencies, through the
    /// engine (random prompts, greedy, all requests at once; one JSON line per concurrency).
    Bench {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value_t = 512)]
        prompt_len: usize,
        #[arg(long, default_value_t = 256)]
        gen: usize,
        /// Comma-separated numbers of concurrent sequences.
        #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
        concurrency: Vec<usize>,
        #[arg(long, default_value = "cpu")]
        device: String,
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// The engine's token budget per step (chunked prefill beyond it).
        #[arg(long, default_value_t = 4096)]
        max_batched_tokens: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Split the model across this many devices (tensor parallelism): cuda:K..K+N-1,
        /// rocm:K..K+N-1, or N CPU-executor devices.
        #[arg(long, default_value_t = 1)]
        tensor_parallel: usize,
        /// Decode steps of up to this many sequences run as graphs (captured once per
        /// power-of-two batch size, replayed); 0: every step on the packed path.
        #[arg(long, default_value_t = 128)]
        graph_max_batch: usize,
        /// Before the timed runs: a prefill step of --prompt-len tokens and a mixed step (that
        /// prefill beside one decode), timed, then once more under the backend's per-op
        /// profiler (tables on stderr; our devices only).
        #[arg(long)]
        profile: bool,
    },
    /// An OpenAI-compatible HTTP server (llm-server): /v1/completions, /v1/chat/completions
    /// (streamed or not), /v1/models, /health, /metrics; exits 0 on SIGTERM/SIGINT.
    Serve {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// cpu (Candle's CPU), cpu-executor, cuda:N, rocm:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        #[command(flatten)]
        listen: openai_http::Listen,
        /// Requests waiting for a batch slot at most (429 beyond).
        #[arg(long, default_value_t = 256)]
        max_queue: usize,
        /// Context length (default: the model's, at most 4096).
        #[arg(long)]
        max_model_len: Option<usize>,
        /// The model id clients send (default: the file or folder name).
        #[arg(long)]
        served_model_name: Option<String>,
        #[arg(long, default_value_t = 64)]
        max_num_seqs: usize,
        #[arg(long, default_value_t = 4096)]
        max_batched_tokens: usize,
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// KV cache blocks (default: max-num-seqs sequences of max-model-len).
        #[arg(long)]
        num_blocks: Option<usize>,
        /// Seconds in-flight requests may run on after SIGTERM before they are cancelled.
        #[arg(long, default_value_t = 30.0)]
        shutdown_grace: f64,
        /// Split the model across this many devices (tensor parallelism): cuda:K..K+N-1,
        /// rocm:K..K+N-1, or N CPU-executor devices.
        #[arg(long, default_value_t = 1)]
        tensor_parallel: usize,
        /// Prompt tokens a step that also decodes runs at most (chunked prefill: an arriving
        /// prompt spreads over several steps instead of stalling the running sequences for
        /// one long step; steps without decodes keep --max-batched-tokens). 0: no cap. The
        /// default's reasons: `llm_worker::serve::DEFAULT_PREFILL_CHUNK_WHILE_DECODING`.
        #[arg(long, default_value_t = llm_worker::serve::DEFAULT_PREFILL_CHUNK_WHILE_DECODING)]
        prefill_chunk_while_decoding: usize,
        /// Lift that cap while more than this many requests wait for admission (a backlog:
        /// throughput first); a value past --max-queue keeps the cap always. The default's
        /// reasons: `llm_worker::serve::DEFAULT_PREFILL_CAP_BACKLOG`.
        #[arg(long, default_value_t = llm_worker::serve::DEFAULT_PREFILL_CAP_BACKLOG)]
        prefill_cap_backlog: usize,
    },
    /// Write a model with seeded random weights (a Hugging Face folder, or a llama GGUF file).
    WriteRandom {
        /// The folder (safetensors) or the .gguf file (with --gguf) to write.
        #[arg(long)]
        out: PathBuf,
        /// llama, mistral, qwen2, qwen3.
        #[arg(long, default_value = "llama")]
        family: String,
        /// tiny, 1b, 8b, 48b (Llama 70B's layers, 54 of them; not for llama GGUF files).
        #[arg(long, default_value = "tiny")]
        shape: String,
        /// f32, f16, bf16.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// rope_theta at the top level of config.json (older transformers) instead of rope_parameters.
        #[arg(long)]
        legacy_rope: bool,
        /// Shards of about this many MiB, with model.safetensors.index.json.
        #[arg(long)]
        shard_mib: Option<usize>,
        /// Mistral's sliding window.
        #[arg(long)]
        sliding_window: Option<usize>,
        /// Write a GGUF of this GGML type instead (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2k
        /// q3k q4k q5k q6k): llama through gguf-llama, qwen2/qwen3 from this crate's weights;
        /// tokenizer.json next to it.
        #[arg(long)]
        gguf: Option<String>,
    },
}

/// The model at `model` on `tp` devices of `spec` (one: the whole model), with a cache of
/// `blocks` blocks of `block_size` tokens per device.
fn load(model: &std::path::Path, spec: &str, tp: usize, blocks: usize, block_size: usize) -> Result<(TpRunner, String)> {
    let devs = tp_devices(spec, tp)?;
    let name = if tp == 1 { devs[0].1.clone() } else { format!("{tp} x {}", devs[0].1) };
    let t0 = Instant::now();
    let devs: Vec<_> = devs.into_iter().map(|d| d.0).collect();
    let r = TpRunner::load(model, &devs, blocks, block_size)?;
    let m = r.model();
    eprintln!("model {} ({:?}, {:?}, {} layers) on {name}, loaded in {:.2} s", model.display(), m.cfg.family, m.dtype, m.cfg.num_layers, t0.elapsed().as_secs_f64());
    Ok((r, name))
}

/// `bench --profile`: a prefill step of `prompt_len` tokens, and a mixed step (a second
/// sequence's prefill beside one decode), each timed on the wall clock (best of 3), then
/// run once more under the backend's per-op profiler: where an eager (ungraphed) step's
/// time goes, and how much of it is host time. Uses the first two sequences' blocks, which
/// the engine rewrites before reading (it holds none yet).
fn profile_steps(runner: &mut TpRunner, prompt_len: usize) -> Result<()> {
    use llm_engine::{ModelRunner, SeqChunk};
    let bs = runner.block_size();
    let per = (prompt_len + 1).div_ceil(bs);
    if 2 * per > runner.num_blocks() {
        eprintln!("profile: skipped (the cache holds fewer than two sequences of {} positions)", prompt_len + 1);
        return Ok(());
    }
    let table = |i: usize| ((i * per) as u32..((i + 1) * per) as u32).collect::<Vec<_>>();
    let prefill = |i: usize| SeqChunk { seq_id: i as u64, tokens: vec![1; prompt_len], start_pos: 0, block_table: table(i), sample: true };
    let decode = SeqChunk { seq_id: 0, tokens: vec![1], start_pos: prompt_len, block_table: table(0), sample: true };
    let steps = [(format!("prefill {prompt_len}"), vec![prefill(0)]), (format!("prefill {prompt_len} + 1 decode"), vec![decode, prefill(1)])];
    let dev = runner.model().device.clone();
    let rocm = candle_rocm::RocmDevice::from_candle(&dev);
    for (name, batch) in &steps {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = Instant::now();
            runner.step(batch)?;
            best = best.min(t0.elapsed().as_secs_f64() * 1e3);
        }
        eprintln!("profile: {name} step: {best:.3} ms wall (best of 3, logits read back)");
        if let Some(rd) = &rocm {
            rd.set_profiling(true);
            let r = runner.step(batch);
            rd.set_profiling(false);
            let p = rd.take_profile()?;
            r?;
            eprintln!("profile of one {name} step: {} op calls, {:.3} ms device time (rank 0)\n{}", p.calls(), p.total_ms(), p.table());
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Generate { model, tokenizer, prompt, chat, system, max_tokens, temperature, top_p, seed, device, block_size, tensor_parallel } => {
            if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
                bail!("--top-p must be in (0, 1]");
            }
            let cfg = llm_worker::shard::read_config(&model)?;
            let text = TextTools::load(&model, tokenizer.as_deref(), cfg.vocab_size)?;
            let prompt_text = if chat {
                let mut msgs = vec![];
                if let Some(s) = &system {
                    msgs.push(Message::new("system", s));
                }
                msgs.push(Message::new("user", &prompt));
                text.render_chat(&msgs, true)?
            } else {
                prompt.clone()
            };
            // A rendered template carries its own special tokens; a plain prompt gets the
            // tokenizer's (a Llama BOS).
            let ids = text.encode_with(&prompt_text, !chat)?;
            if ids.is_empty() {
                bail!("the prompt encodes to no tokens");
            }
            let stop = cfg.eos_token_ids.clone();
            let max_len = ids.len() + max_tokens;
            let (runner, _) = load(&model, &device, tensor_parallel, blocks_needed(1, max_len, block_size), block_size)?;
            let config = EngineConfig { max_num_seqs: 1, max_batched_tokens: ids.len().max(16), max_model_len: max_len, prefix_caching: false };
            let mut engine = Engine::try_new(runner, config)?;
            let params = SamplingParams { temperature: temperature as f32, top_p: top_p.map(|p| p as f32), seed: Some(seed), max_tokens, stop_token_ids: stop, ..SamplingParams::default() };
            let t0 = Instant::now();
            let (_, mut rx) = engine.add_request(ids.clone(), params)?;
            print!("{prompt_text}");
            let mut out = std::io::stdout();
            let (mut got, mut printed, mut first) = (vec![], 0usize, None);
            // Drain after every step, the last one (which reports no work left) included.
            let mut more = true;
            while more {
                more = engine.step()?;
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        Event::Token { id, .. } => {
                            first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                            got.push(id);
                            let s = text.decode(&got)?;
                            // Hold back a character whose bytes are not all generated yet.
                            if s.len() > printed && s.is_char_boundary(printed) && !s.ends_with('\u{FFFD}') {
                                print!("{}", &s[printed..]);
                                printed = s.len();
                                let _ = out.flush();
                            }
                        }
                        Event::Finished { reason: FinishReason::Error(e), .. } => bail!("generation failed: {e}"),
                        Event::Finished { .. } => {}
                    }
                }
            }
            // What was held back for a character still incomplete at the end (printed lossily).
            let s = text.decode(&got)?;
            if s.len() > printed && s.is_char_boundary(printed) {
                print!("{}", &s[printed..]);
            }
            println!();
            let total = t0.elapsed().as_secs_f64();
            let prefill_s = first.unwrap_or(total);
            let decoded = got.len().saturating_sub(1);
            eprintln!(
                "prefill: {} tokens in {:.3} s = {:.1} tokens/s; decode: {} tokens in {:.3} s = {:.1} tokens/s",
                ids.len(),
                prefill_s,
                ids.len() as f64 / prefill_s.max(1e-9),
                decoded,
                total - prefill_s,
                decoded as f64 / (total - prefill_s).max(1e-9)
            );
        }
        Cmd::Serve { model, tokenizer, device, listen, max_queue, max_model_len, served_model_name, max_num_seqs, max_batched_tokens, block_size, num_blocks, shutdown_grace, tensor_parallel, prefill_chunk_while_decoding, prefill_cap_backlog } => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            tracing_subscriber::fmt().with_env_filter(filter).init();
            let addr = listen.addr().map_err(anyhow::Error::msg)?;
            if !(shutdown_grace >= 0.0 && shutdown_grace.is_finite()) {
                bail!("--shutdown-grace must be a number of seconds >= 0");
            }
            let config = llm_server::ServerConfig { api_key: listen.api_key, max_queue, shutdown_grace: std::time::Duration::from_secs_f64(shutdown_grace), ..Default::default() };
            let prefill_chunk_while_decoding = (prefill_chunk_while_decoding > 0).then_some(prefill_chunk_while_decoding);
            let args = ServeArgs { model, tokenizer, device, name: served_model_name, max_model_len, max_num_seqs, max_batched_tokens, block_size, num_blocks, tensor_parallel, prefill_chunk_while_decoding, prefill_cap_backlog: Some(prefill_cap_backlog) };
            llm_server::run(config, addr, move || load_served(&args))?;
        }
        Cmd::Bench { model, prompt_len, gen, concurrency, device, block_size, max_batched_tokens, seed, tensor_parallel, graph_max_batch, profile } => {
            if prompt_len == 0 || gen == 0 || concurrency.contains(&0) {
                bail!("--prompt-len, --gen and every --concurrency must be positive");
            }
            let max_c = concurrency.iter().copied().max().unwrap_or(1);
            let max_len = prompt_len + gen;
            // The sequences', and room for the warm-up's prompt chunk beside them (the
            // largest a runner may take).
            let most_mixed = llm_worker::runner::mixed_row_buckets(llm_worker::runner::DEFAULT_MIXED_MAX_ROWS);
            let blocks = blocks_needed(max_c, max_len, block_size) + llm_worker::runner::warm_up_blocks(0, 0, block_size, &most_mixed);
            let (mut runner, dev_name) = load(&model, &device, tensor_parallel, blocks, block_size)?;
            let vocab = runner.model().cfg.vocab_size;
            runner.set_graph_max_batch(graph_max_batch)?;
            let mixed = runner.mixed_row_buckets();
            eprintln!("KV cache: {blocks} blocks of {block_size} tokens, {:.1} MiB", (blocks * runner.block_bytes()) as f64 / (1u64 << 20) as f64);
            let config = EngineConfig { max_num_seqs: max_c, max_batched_tokens: max_batched_tokens.max(max_c), max_model_len: max_len, prefix_caching: false };
            // First-use costs (kernel loads, PTX JIT, graph captures) before the clock starts.
            let t_warm = Instant::now();
            llm_worker::runner::warm_up(&mut runner, prompt_len, &concurrency, config.max_batched_tokens, &mixed)?;
            eprintln!("warm-up ({prompt_len}-token prefill, one decode step and decodes beside prompt chunks of {mixed:?} tokens at each concurrency): {:.2} s", t_warm.elapsed().as_secs_f64());
            if profile {
                profile_steps(&mut runner, prompt_len)?;
            }
            let mut engine = Engine::try_new(runner, config)?;
            for &c in &concurrency {
                // Random prompts below the last two ids (the written models' special tokens).
                let t0 = Instant::now();
                let mut rxs = vec![];
                for i in 0..c {
                    let p = gguf_llama::seeded_values(prompt_len, seed ^ (i as u64 + 1), 0.0, (vocab - 2) as f32).into_iter().map(|x| x as u32).collect();
                    rxs.push(engine.add_request(p, SamplingParams::greedy(gen))?.1);
                }
                // Per request: arrival time of each token.
                let mut times: Vec<Vec<f64>> = vec![vec![]; c];
                let mut more = true;
                while more {
                    more = engine.step()?;
                    let now = t0.elapsed().as_secs_f64();
                    for (rx, t) in rxs.iter_mut().zip(&mut times) {
                        while let Ok(ev) = rx.try_recv() {
                            match ev {
                                Event::Token { .. } => t.push(now),
                                Event::Finished { reason: FinishReason::Error(e), .. } => bail!("generation failed: {e}"),
                                Event::Finished { .. } => {}
                            }
                        }
                    }
                }
                let end = t0.elapsed().as_secs_f64();
                let ttft = times.iter().map(|t| t.first().copied().unwrap_or(end)).sum::<f64>() / c as f64;
                // Aggregate decode rate once every sequence is decoding: tokens after the last
                // first token, over that time.
                let all_started = times.iter().map(|t| t.first().copied().unwrap_or(end)).fold(0f64, f64::max);
                let after: usize = times.iter().map(|t| t.iter().filter(|&&x| x > all_started).count()).sum();
                let decode_tok_s = after as f64 / (end - all_started).max(1e-9);
                let total: usize = times.iter().map(Vec::len).sum();
                eprintln!("concurrency {c}: decode {decode_tok_s:.1} tokens/s aggregate, time to first token {:.1} ms (mean), {total} tokens in {end:.2} s", ttft * 1e3);
                // Per rank: the decode buckets captured as graphs so far (empty where steps
                // ran eagerly: no graphs on the device, or a failed capture).
                let captured: Vec<Vec<usize>> = engine.runner_mut().decode_buckets()?.into_iter().map(|r| r.into_iter().filter(|b| b.2).map(|b| b.0).collect()).collect();
                let j = serde_json::json!({
                    "model": model.display().to_string(), "device": dev_name, "tensor_parallel": tensor_parallel, "concurrency": c, "graph_max_batch": graph_max_batch, "prompt_len": prompt_len, "gen": gen,
                    "decode_tok_s": decode_tok_s, "ttft_ms": ttft * 1e3, "output_tok_s": total as f64 / end, "seconds": end, "captured_buckets": captured,
                });
                println!("{j}");
            }
        }
        Cmd::WriteRandom { out, family, shape, dtype, seed, legacy_rope, shard_mib, sliding_window, gguf } => {
            if let Some(ty) = gguf.as_deref().filter(|_| family != "llama") {
                let fam = Family::from_name(&family).with_context(|| format!("unknown family {family:?} (llama, qwen2, qwen3 for GGUF)"))?;
                let t = gguf_llama::parse_type(ty).with_context(|| format!("unknown GGML type {ty:?}"))?;
                let sh = Shape::by_name(&shape).with_context(|| format!("unknown shape {shape:?} (tiny, 1b, 8b, 48b)"))?;
                let mut r = RandomModel::new(fam, sh);
                r.seed = seed;
                r.write_gguf(&out, t)?;
            } else if let Some(ty) = gguf {
                let t = gguf_llama::parse_type(&ty).with_context(|| format!("unknown GGML type {ty:?}"))?;
                let s = gguf_llama::LlamaShape::by_name(&shape).with_context(|| format!("unknown shape {shape:?} (tiny, 1b, 8b)"))?;
                gguf_llama::write_gguf(&out, &s, gguf_llama::Storage::Quantized(t), seed)?;
                gguf_llama::write_tokenizer(&out.with_file_name("tokenizer.json"), s.vocab)?;
            } else {
                let fam = Family::from_name(&family).with_context(|| format!("unknown family {family:?} (llama, mistral, qwen2, qwen3)"))?;
                let sh = Shape::by_name(&shape).with_context(|| format!("unknown shape {shape:?} (tiny, 1b, 8b, 48b)"))?;
                let mut r = RandomModel::new(fam, sh);
                r.dtype = match dtype.as_str() {
                    "f32" => candle_core::DType::F32,
                    "f16" => candle_core::DType::F16,
                    "bf16" => candle_core::DType::BF16,
                    d => bail!("unknown dtype {d:?} (f32, f16, bf16)"),
                };
                r.seed = seed;
                r.legacy_rope = legacy_rope;
                r.shard_bytes = shard_mib.map(|m| m << 20);
                if sliding_window.is_some() {
                    r.sliding_window = sliding_window;
                }
                r.write(&out)?;
            }
            eprintln!("wrote {}", out.display());
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llm-worker: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
