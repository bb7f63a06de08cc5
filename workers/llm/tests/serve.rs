//! `llm-worker serve` over a random-weight model on Candle's CPU: greedy chat through the
//! HTTP API (whole and streamed) equals the same request run on the library's engine
//! directly, and SIGTERM exits 0.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_llm-worker"))
}

#[test]
fn serve_matches_the_engine_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    assert!(bin().args(["write-random", "--family", "qwen3", "--shape", "tiny", "--dtype", "f32", "--out"]).arg(&m).status().unwrap().success());
    // The reference: the same greedy request straight through the library's engine.
    let (want, prompt_len) = {
        use llm_engine::{Engine, EngineConfig, Event, SamplingParams};
        let model = llm_worker::Model::load(&m, &candle_core::Device::Cpu).unwrap();
        let text = llm_worker::TextTools::load(&m, None, model.cfg.vocab_size).unwrap();
        let ids = text.encode(&text.render_chat(&[llm_worker::Message::new("user", "hi")], true).unwrap()).unwrap();
        let params = SamplingParams { stop_token_ids: model.cfg.eos_token_ids.clone(), ..SamplingParams::greedy(6) };
        let runner = llm_worker::LlamaRunner::new(model, 8, 16).unwrap();
        let mut engine = Engine::new(runner, EngineConfig { max_num_seqs: 1, max_batched_tokens: 64, max_model_len: 64, prefix_caching: false });
        let (_, mut rx) = engine.add_request(ids.clone(), params).unwrap();
        while engine.step().unwrap() {}
        let mut toks = vec![];
        while let Ok(ev) = rx.try_recv() {
            if let Event::Token { id, .. } = ev {
                toks.push(id);
            }
        }
        assert!(!toks.is_empty());
        (text.decode(&toks).unwrap(), ids.len())
    };

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = bin()
        .args(["serve", "--device", "cpu", "--port", &port.to_string(), "--max-model-len", "64", "--max-num-seqs", "4", "--served-model-name", "tiny", "--model"])
        .arg(&m)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap();
    let t0 = Instant::now();
    while !matches!(c.get(format!("{base}/health")).send(), Ok(r) if r.status() == 200) {
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        assert!(child.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = |stream: bool| serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0, "stream": stream});
    let v: serde_json::Value = c.post(format!("{base}/v1/chat/completions")).json(&body(false)).send().unwrap().json().unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str(), "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
    let sse = c.post(format!("{base}/v1/chat/completions")).json(&body(true)).send().unwrap().text().unwrap();
    let mut streamed = String::new();
    let data: Vec<&str> = sse.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    for d in &data[..data.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        streamed.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, want);

    // Every engine step ran the runner once, and the warm-up before serving ran it twice
    // (its 2-token prefill, one decode): the runner's step counts by kind add up to that.
    let m = c.get(format!("{base}/metrics")).send().unwrap().text().unwrap();
    let val = |name: &str| -> f64 { m.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).unwrap_or_else(|| panic!("{name} missing:\n{m}")).parse().unwrap() };
    let engine_steps = val("llm_engine_step_seconds_count");
    let (decode, mixed) = (val("llm_runner_decode_steps_total"), val("llm_runner_mixed_steps_total"));
    assert!(engine_steps >= 2.0, "{m}");
    assert_eq!(decode + mixed, engine_steps + 2.0, "{m}");
    // The warm-up's prefill and each request's; the second request finds the prompt's full
    // blocks in the prefix cache, so its prefill is one token (counted as a decode row) when
    // the prompt is one past a block boundary. Requests run one at a time: one row a decode.
    let second_prefill = if (prompt_len - 1) % 16 != 0 { 1.0 } else { 0.0 };
    assert_eq!(mixed, 2.0 + second_prefill, "prompt of {prompt_len}: {m}");
    assert_eq!(val("llm_runner_decode_tokens_total"), decode, "{m}");
    assert!(val("llm_runner_decode_seconds_total") > 0.0 && val("llm_engine_step_seconds_sum") > 0.0, "{m}");

    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
