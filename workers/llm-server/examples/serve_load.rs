//! Load generator for an OpenAI-compatible server (ours: `llm-worker serve`): streamed
//! completions with token-id prompts of a fixed length and a fixed output length
//! (`ignore_eos`), Poisson arrivals at each request rate from light to saturation (`inf`: all
//! at once). One JSON line per rate: throughput, time to first token and inter-token latency
//! percentiles.
//!
//! ```text
//! cargo run --release -p llm-server --example serve_load -- --url http://127.0.0.1:8080 \
//!     --model NAME --rates 1,2,4,8,inf --requests 64 --prompt-len 512 --max-tokens 256
//! cargo run --release -p llm-server --example serve_load -- --demo   # an in-process test server
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use futures_util::future::join_all;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Args {
    url: Option<String>,
    model: String,
    api_key: Option<String>,
    rates: Vec<f64>,
    requests: usize,
    prompt_len: usize,
    max_tokens: usize,
    vocab: u32,
    seed: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        url: None,
        model: "tiny-test".into(),
        api_key: None,
        rates: vec![1.0, 4.0, 16.0, f64::INFINITY],
        requests: 32,
        prompt_len: 512,
        max_tokens: 256,
        vocab: 1000,
        seed: 1,
    };
    let mut it = std::env::args().skip(1);
    let mut demo = false;
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--url" => a.url = Some(v()),
            "--model" => a.model = v(),
            "--api-key" => a.api_key = Some(v()),
            "--rates" => a.rates = v().split(',').map(|r| if r == "inf" { f64::INFINITY } else { r.parse().expect("--rates: numbers or inf") }).collect(),
            "--requests" => a.requests = v().parse().expect("--requests"),
            "--prompt-len" => a.prompt_len = v().parse().expect("--prompt-len"),
            "--max-tokens" => a.max_tokens = v().parse().expect("--max-tokens"),
            "--vocab" => a.vocab = v().parse().expect("--vocab"),
            "--seed" => a.seed = v().parse().expect("--seed"),
            "--demo" => demo = true,
            _ => panic!("unknown argument {k} (see the file's doc comment)"),
        }
    }
    if demo {
        // The demo model's context is 256 tokens and its vocabulary 256 bytes.
        a.prompt_len = a.prompt_len.min(64);
        a.max_tokens = a.max_tokens.min(128);
        a.vocab = 256;
    }
    assert!(demo || a.url.is_some(), "--url URL or --demo");
    a
}

/// xorshift64*: reproducible prompts and arrival gaps without another dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One request's timings: (ttft, inter-token gaps, output tokens), or an error.
async fn one(c: &reqwest::Client, a: &Args, url: &str, prompt: Vec<u32>) -> Result<(f64, Vec<f64>, usize), String> {
    let t0 = Instant::now();
    let mut req = c.post(format!("{url}/v1/completions")).json(&json!({
        "model": a.model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true}
    }));
    if let Some(k) = &a.api_key {
        req = req.bearer_auth(k);
    }
    let mut r = req.send().await.map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("status {}", r.status()));
    }
    let (mut buf, mut times, mut tokens) = (String::new(), Vec::new(), 0usize);
    while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
        let now = t0.elapsed().as_secs_f64();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
            } else if v["choices"][0]["finish_reason"].is_null() {
                times.push(now); // one chunk per generated token
            }
        }
    }
    let ttft = *times.first().ok_or("no token")?;
    Ok((ttft, times.windows(2).map(|w| w[1] - w[0]).collect(), tokens))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let a = parse_args();
    let mut demo_server = None;
    let url = match &a.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            let setup = common::Setup { max_num_seqs: 16, num_blocks: 16 * 16, step_delay: Duration::from_millis(2), ..common::Setup::default() };
            let s = common::start(setup).await;
            s.ready().await.expect("demo server");
            let u = format!("http://{}", s.local_addr());
            demo_server = Some(s);
            u
        }
    };
    let c = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(1024).build().unwrap();
    let mut rng = Rng(a.seed.max(1));
    for &rate in &a.rates {
        let prompts: Vec<Vec<u32>> = (0..a.requests).map(|_| (0..a.prompt_len).map(|_| (rng.next() % a.vocab as u64) as u32).collect()).collect();
        let mut offsets = Vec::with_capacity(a.requests);
        let mut t = 0.0;
        for _ in 0..a.requests {
            offsets.push(t);
            if rate.is_finite() {
                t += -(1.0 - rng.unit()).ln() / rate;
            }
        }
        let start = Instant::now();
        let results = join_all(prompts.into_iter().zip(offsets).map(|(p, off)| {
            let (c, a, url) = (&c, &a, &url);
            async move {
                tokio::time::sleep_until((start + Duration::from_secs_f64(off)).into()).await;
                one(c, a, url, p).await
            }
        }))
        .await;
        let wall = start.elapsed().as_secs_f64();
        let (mut ttft, mut itl, mut tokens, mut errors) = (vec![], vec![], 0usize, vec![]);
        for r in results {
            match r {
                Ok((t, gaps, n)) => {
                    ttft.push(t);
                    itl.extend(gaps);
                    tokens += n;
                }
                Err(e) => errors.push(e),
            }
        }
        errors.dedup();
        let line = json!({
            "rate_req_s": if rate.is_finite() { json!(rate) } else { json!("inf") },
            "requests": a.requests, "ok": ttft.len(), "errors": errors,
            "prompt_len": a.prompt_len, "max_tokens": a.max_tokens, "wall_s": wall,
            "output_tok_s": tokens as f64 / wall, "req_s": ttft.len() as f64 / wall,
            "ttft_ms_p50": pct(&mut ttft, 0.5) * 1e3, "ttft_ms_p99": pct(&mut ttft, 0.99) * 1e3,
            "itl_ms_p50": pct(&mut itl, 0.5) * 1e3, "itl_ms_p99": pct(&mut itl, 0.99) * 1e3,
        });
        println!("{line}");
    }
    if let Some(mut s) = demo_server {
        s.shutdown();
        s.wait().await.unwrap();
    }
}
