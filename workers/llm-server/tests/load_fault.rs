//! Load and faults over loopback: concurrent clients, some disconnecting mid-stream or sending
//! bad requests; afterwards every good request got exactly its own answer, every bad one its
//! status, and no KV block is left. Then a shutdown with requests in flight.

mod common;

use common::*;
use futures_util::future::join_all;
use llm_server::ServedModel;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const KEY: &str = "load-key";

fn of_kind(jobs: &[(usize, Kind)], k: Kind) -> usize {
    jobs.iter().filter(|(_, j)| *j == k).count()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Stream,
    Chat,
    Disconnect,
    Timeout,
    Malformed,
    TooLong,
    WrongKey,
}
const KINDS: [Kind; 7] = [Kind::Stream, Kind::Chat, Kind::Disconnect, Kind::Timeout, Kind::Malformed, Kind::TooLong, Kind::WrongKey];

/// A prompt for a leaving client whose greedy continuation has no EOS in 200 tokens, so that
/// only cancellation can stop it early.
fn leaving_prompt(i: usize) -> String {
    let m = TestModel { tok: tokenizer(), max_len: 256 };
    (0..).map(|j| format!("client {i} leaves {j}")).find(|p| !reference_greedy(&m.encode(p, true).unwrap(), 200).1).unwrap()
}

fn body(i: usize, kind: Kind) -> Value {
    let max = 20 + (i * 7) % 40;
    match kind {
        Kind::Chat => json!({"model": "tiny-test", "messages": [{"role": "user", "content": format!("client {i} asks")}], "max_tokens": max, "temperature": 0}),
        Kind::TooLong => json!({"model": "tiny-test", "prompt": "y".repeat(400 + i)}),
        Kind::Disconnect | Kind::Timeout => json!({"model": "tiny-test", "prompt": leaving_prompt(i), "max_tokens": 200, "temperature": 0, "stream": kind == Kind::Disconnect}),
        _ => json!({"model": "tiny-test", "prompt": format!("client {i} says"), "max_tokens": max, "temperature": 0, "stream": true}),
    }
}

/// The expected text and finish reason of a good request, computed without the server.
fn expected(i: usize, kind: Kind) -> (String, &'static str) {
    let m = TestModel { tok: tokenizer(), max_len: 256 };
    let b = body(i, kind);
    let ids = match kind {
        Kind::Chat => m.encode(&m.render_chat(&[llm_server::ChatMessage { role: "user".into(), content: format!("client {i} asks") }]).unwrap(), false).unwrap(),
        _ => m.encode(b["prompt"].as_str().unwrap(), true).unwrap(),
    };
    let (toks, eos) = reference_greedy(&ids, b["max_tokens"].as_u64().unwrap() as usize);
    (m.decode(&toks).unwrap(), if eos { "stop" } else { "length" })
}

/// What a client saw: status, and for a good request its text and finish reason.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Answer(String, String),
    Status(u16),
    Left,
}

async fn run_client(c: &reqwest::Client, base: &str, i: usize, kind: Kind) -> Outcome {
    let path = if kind == Kind::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    let key = if kind == Kind::WrongKey { "nope" } else { KEY };
    let mut req = c.post(format!("{base}{path}")).bearer_auth(key).header("content-type", "application/json");
    req = match kind {
        Kind::Malformed => req.body(format!("{{\"model\": \"tiny-test\", \"prompt\": \"client {i}\", ")),
        _ => req.body(body(i, kind).to_string()),
    };
    if kind == Kind::Timeout {
        req = req.timeout(Duration::from_millis(30));
    }
    let mut r = match req.send().await {
        Ok(r) => r,
        Err(e) if kind == Kind::Timeout && e.is_timeout() => return Outcome::Left,
        Err(e) => panic!("client {i} {kind:?}: {e}"),
    };
    if r.status() != StatusCode::OK {
        return Outcome::Status(r.status().as_u16());
    }
    match kind {
        Kind::Disconnect => {
            // Read a few chunks, then go away.
            for _ in 0..3 {
                r.chunk().await.unwrap();
            }
            Outcome::Left
        }
        Kind::Timeout => match r.text().await {
            Ok(t) => panic!("client {i} timed out yet got {t}"),
            Err(_) => Outcome::Left,
        },
        Kind::Chat => {
            let v: Value = r.json().await.unwrap();
            let c0 = &v["choices"][0];
            Outcome::Answer(c0["message"]["content"].as_str().unwrap().into(), c0["finish_reason"].as_str().unwrap().into())
        }
        _ => {
            let data = sse_data(&r.text().await.unwrap());
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
            let (mut text, mut fin) = (String::new(), String::new());
            for d in &data[..data.len() - 1] {
                let v: Value = serde_json::from_str(d).unwrap();
                text.push_str(v["choices"][0]["text"].as_str().unwrap());
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    fin = f.into();
                }
            }
            Outcome::Answer(text, fin)
        }
    }
}

async fn metrics(c: &reqwest::Client, base: &str) -> String {
    c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_faults_leave_no_trace() {
    let mut setup = Setup { max_num_seqs: 8, num_blocks: 40, ..Setup::default() };
    setup.config.api_key = Some(KEY.into());
    setup.config.max_queue = 64;
    let mut server = start(setup).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let n = 42;
    let jobs: Vec<(usize, Kind)> = (0..n).map(|i| (i, KINDS[i % KINDS.len()])).collect();
    let good = |k: Kind| matches!(k, Kind::Stream | Kind::Chat);

    // Each good request alone first: it equals the direct reference.
    let mut alone = vec![None; n];
    for &(i, k) in jobs.iter().filter(|(_, k)| good(*k)).take(4) {
        let o = run_client(&c, &base, i, k).await;
        let (t, f) = expected(i, k);
        assert_eq!(o, Outcome::Answer(t, f.into()), "client {i} alone");
        alone[i] = Some(o);
    }

    // All at once.
    let before = metric(&metrics(&c, &base).await, "llm_engine_generated_tokens_total");
    let t0 = Instant::now();
    let outcomes = join_all(jobs.iter().map(|&(i, k)| {
        let (c, base) = (c.clone(), base.clone());
        async move { run_client(&c, &base, i, k).await }
    }))
    .await;
    assert!(t0.elapsed() < Duration::from_secs(30));
    for (&(i, k), o) in jobs.iter().zip(&outcomes) {
        let want = match k {
            Kind::Stream | Kind::Chat => {
                let (t, f) = expected(i, k);
                Outcome::Answer(t, f.into())
            }
            Kind::Disconnect | Kind::Timeout => Outcome::Left,
            Kind::Malformed | Kind::TooLong => Outcome::Status(400),
            Kind::WrongKey => Outcome::Status(401),
        };
        assert_eq!(*o, want, "client {i} ({k:?})");
        if let Some(a) = &alone[i] {
            assert_eq!(o, a, "client {i}: batched differs from alone");
        }
    }
    let answers = outcomes.iter().filter(|o| matches!(o, Outcome::Answer(t, _) if !t.is_empty())).count();
    assert_eq!(answers, jobs.iter().filter(|(_, k)| good(*k)).count());

    // Every sequence ends and frees its blocks (the disconnected ones by cancellation).
    let t0 = Instant::now();
    let m = loop {
        let m = metrics(&c, &base).await;
        if metric(&m, "llm_kv_blocks_used") == 0.0 && metric(&m, "llm_requests_in_flight") == 0.0 && metric(&m, "llm_running_sequences") == 0.0 {
            break m;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "blocks or requests left:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(metric(&m, "llm_kv_blocks_free"), 40.0);
    // Leaving clients were cancelled before their end (un-cancelled, each would cost exactly
    // 200 tokens; `disconnect_frees_blocks_at_once` times one precisely).
    let m0 = TestModel { tok: tokenizer(), max_len: 256 };
    let good_tokens: usize = jobs
        .iter()
        .filter(|(_, k)| good(*k))
        .map(|&(i, k)| {
            let b = body(i, k);
            let ids = match k {
                Kind::Chat => m0.encode(&m0.render_chat(&[llm_server::ChatMessage { role: "user".into(), content: format!("client {i} asks") }]).unwrap(), false).unwrap(),
                _ => m0.encode(b["prompt"].as_str().unwrap(), true).unwrap(),
            };
            let (t, eos) = reference_greedy(&ids, b["max_tokens"].as_u64().unwrap() as usize);
            t.len() + eos as usize
        })
        .sum();
    let leaving = (of_kind(&jobs, Kind::Disconnect) + of_kind(&jobs, Kind::Timeout)) as f64;
    let extra = metric(&m, "llm_engine_generated_tokens_total") - before - good_tokens as f64;
    assert!((0.0..leaving * 170.0).contains(&extra), "{extra} tokens for {leaving} leaving clients");
    assert_eq!(metric(&m, "llm_queue_depth"), 0.0);
    let count = |st: u16| metric(&m, &format!("llm_requests_total{{endpoint=\"/v1/completions\",status=\"{st}\"}}"));
    let of = |k: Kind| jobs.iter().filter(|(_, j)| *j == k).count() as f64;
    assert_eq!(count(400), of(Kind::Malformed) + of(Kind::TooLong));
    assert_eq!(count(401), of(Kind::WrongKey));
    assert!(metric(&m, "llm_time_to_first_token_seconds_count") >= (n / 2) as f64);
    assert!(metric(&m, "llm_generation_tokens_total") > 0.0);

    // Still answering.
    let o = run_client(&c, &base, 0, Kind::Stream).await;
    let (t, f) = expected(0, Kind::Stream);
    assert_eq!(o, Outcome::Answer(t, f.into()));
    server.shutdown();
    server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_requests_in_flight() {
    let mut setup = Setup { step_delay: Duration::from_millis(10), ..Setup::default() };
    setup.config.shutdown_grace = Duration::from_millis(300);
    let mut server = start(setup).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    // Four long streams (prompts whose greedy continuation has no EOS in 150 tokens: over
    // 1.5 s each) and one short request.
    let m = TestModel { tok: tokenizer(), max_len: 256 };
    let prompts: Vec<(String, String)> = (0..)
        .map(|i| format!("long {i}"))
        .filter_map(|p| {
            let (t, eos) = reference_greedy(&m.encode(&p, true).unwrap(), 200);
            (!eos || t.len() >= 150).then(|| (p, m.decode(&t).unwrap()))
        })
        .take(4)
        .collect();
    let mut long = vec![];
    for (p, _) in &prompts {
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "tiny-test", "prompt": p, "max_tokens": 200, "temperature": 0, "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        long.push(tokio::spawn(async move { r.text().await.unwrap() }));
    }
    let short = {
        let (c, base) = (c.clone(), base.clone());
        tokio::spawn(async move {
            c.post(format!("{base}/v1/completions")).json(&json!({"model": "tiny-test", "prompt": "short", "max_tokens": 5, "temperature": 0})).send().await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    server.shutdown();
    // The short one finishes within the grace period; the long ones are cut off ("abort")
    // with a well-formed end of stream.
    let r = short.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    for (h, (_, reference)) in long.into_iter().zip(&prompts) {
        let data = sse_data(&h.await.unwrap());
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let mut text = String::new();
        for d in &data[..data.len() - 1] {
            let v: Value = serde_json::from_str(d).unwrap();
            text.push_str(v["choices"][0]["text"].as_str().unwrap());
        }
        let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "abort");
        // What was sent is the start of its own answer.
        assert!(reference.starts_with(&text) && text.len() < reference.len(), "{text:?} vs {reference:?}");
    }
    tokio::time::timeout(Duration::from_secs(10), server.wait()).await.expect("shutdown took too long").unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // Nothing listens any more.
    assert!(c.get(format!("{base}/health")).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_frees_blocks_at_once() {
    // 20 ms per step: the 200-token answers would take 4 s.
    let mut server = start(Setup { step_delay: Duration::from_millis(20), ..Setup::default() }).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    for stream in [true, false] {
        let before = metric(&metrics(&c, &base).await, "llm_engine_generated_tokens_total");
        let mut req = c.post(format!("{base}/v1/completions")).json(&json!({"model": "tiny-test", "prompt": leaving_prompt(99), "max_tokens": 200, "temperature": 0, "stream": stream}));
        if !stream {
            req = req.timeout(Duration::from_millis(200));
        }
        match req.send().await {
            Ok(mut r) => {
                assert!(stream);
                for _ in 0..3 {
                    r.chunk().await.unwrap();
                }
            }
            Err(e) => assert!(!stream && e.is_timeout(), "{e}"),
        }
        // The response is dropped here.
        let t0 = Instant::now();
        loop {
            let m = metrics(&c, &base).await;
            if metric(&m, "llm_kv_blocks_used") == 0.0 && metric(&m, "llm_requests_in_flight") == 0.0 {
                let generated = metric(&m, "llm_engine_generated_tokens_total") - before;
                assert!(generated < 60.0, "stream {stream}: {generated} tokens");
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(1), "stream {stream}: blocks still used after 1 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    server.shutdown();
    server.wait().await.unwrap();
}
