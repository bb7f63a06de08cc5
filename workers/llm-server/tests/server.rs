//! End to end through real HTTP on 127.0.0.1 with the test model of `common` (a real
//! `tokenizers` tokenizer, a deterministic paged runner, the real `llm_engine::Engine`).

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn model() -> TestModel {
    TestModel { tok: tokenizer(), max_len: 256 }
}

/// Token ids of a plain prompt as the server encodes it (BOS + one id per byte).
fn prompt_ids(text: &str) -> Vec<u32> {
    std::iter::once(BOS).chain(text.bytes().map(u32::from)).collect()
}

fn decode(ids: &[u32]) -> String {
    use llm_server::ServedModel;
    model().decode(ids).unwrap()
}

async fn post(c: &reqwest::Client, base: &str, path: &str, body: Value) -> (StatusCode, String) {
    let r = c.post(format!("{base}{path}")).json(&body).send().await.unwrap();
    (r.status(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_fields_and_reference_text() {
    let mut server = start(Setup::default()).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let prompt = "the quick brown fox";
    let ids = prompt_ids(prompt);
    let (want, eos) = reference_greedy(&ids, 40);
    let t0 = now_s();
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": prompt, "max_tokens": 40, "temperature": 0})).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    let created = v["created"].as_u64().unwrap();
    assert!(created >= t0 && created <= now_s());
    assert_eq!(v["model"], "tiny-test");
    let ch = &v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 1);
    assert_eq!(ch[0]["index"], 0);
    assert_eq!(ch[0]["text"], decode(&want));
    assert_eq!(ch[0]["logprobs"], Value::Null);
    assert_eq!(ch[0]["finish_reason"], if eos { "stop" } else { "length" });
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    // The engine counts the EOS it sampled.
    let completion = want.len() + eos as usize;
    assert_eq!(v["usage"]["completion_tokens"], completion);
    assert_eq!(v["usage"]["total_tokens"], ids.len() + completion);

    // The default max_tokens of a completion is 16.
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": "zzzz", "temperature": 0})).await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    let (want, eos) = reference_greedy(&prompt_ids("zzzz"), 16);
    assert_eq!(v["choices"][0]["text"], decode(&want));
    assert_eq!(v["usage"]["completion_tokens"], want.len() + eos as usize);

    // ignore_eos (vLLM's extension) generates max_tokens whatever the model says.
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": [BOS, 97], "max_tokens": 200, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 200);
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // /v1/models and /health.
    let m: Value = c.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tiny-test");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(c.get(format!("{base}/health")).send().await.unwrap().status(), StatusCode::OK);
    server.shutdown();
    server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_equals_whole_for_a_seed() {
    let mut server = start(Setup::default()).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let body = |stream: bool| {
        json!({"model": "tiny-test", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
            "max_tokens": 60, "temperature": 0.9, "top_p": 0.95, "seed": 1234, "stream": stream, "stream_options": {"include_usage": true},
            "logprobs": true, "top_logprobs": 2})
    };
    let (st, whole) = post(&c, &base, "/v1/chat/completions", body(false)).await;
    assert_eq!(st, StatusCode::OK, "{whole}");
    let w: Value = serde_json::from_str(&whole).unwrap();
    assert!(w["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(w["object"], "chat.completion");
    assert_eq!(w["model"], "tiny-test");
    let msg = &w["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let text = msg["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    let lp = w["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let ntok = w["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let fr = w["choices"][0]["finish_reason"].as_str().unwrap().to_string();
    // One logprob entry per sent token (an EOS is counted but not sent).
    assert_eq!(lp.len(), if fr == "stop" { ntok - 1 } else { ntok });
    for e in lp {
        let l = e["logprob"].as_f64().unwrap();
        assert!(l <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
        assert!(l <= top[0]["logprob"].as_f64().unwrap() + 1e-6);
    }
    // The prompt: the rendered template, encoded as is.
    let rendered = "<s>[system] be brief\n[user] hello there\n[assistant] ";
    let pids = {
        use llm_server::ServedModel;
        model().encode(rendered, false).unwrap()
    };
    assert_eq!(pids[0], BOS);
    assert_eq!(w["usage"]["prompt_tokens"], pids.len());

    let r = c.post(format!("{base}/v1/chat/completions")).json(&body(true)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut streamed, mut lps, mut finish) = (String::new(), vec![], None);
    for ch in &chunks {
        assert_eq!(ch["id"], id);
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["model"], "tiny-test");
        if let Some(c0) = ch["choices"].as_array().unwrap().first() {
            assert!(finish.is_none(), "a chunk after the finish");
            streamed.push_str(c0["delta"]["content"].as_str().unwrap_or(""));
            if let Some(c) = c0["logprobs"]["content"].as_array() {
                lps.extend(c.iter().cloned());
            }
            finish = c0["finish_reason"].as_str().map(String::from);
        }
    }
    assert_eq!(streamed, text);
    assert_eq!(finish.as_deref(), Some(fr.as_str()));
    assert_eq!(&lps, lp);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"], w["usage"]);
    server.shutdown();
    server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_stream_logprobs_and_stop_string() {
    let mut server = start(Setup::default()).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let prompt = "an example prompt";
    let (full, _) = reference_greedy(&prompt_ids(prompt), 80);
    let full_text = decode(&full);
    // A stop string from the middle of the reference continuation.
    let cut = full_text.char_indices().map(|(i, _)| i).find(|&i| i >= 10).unwrap();
    let stop: String = full_text[cut..].chars().take(3).collect();
    let first = full_text.find(&stop).unwrap();
    let req = |stream: bool| json!({"model": "tiny-test", "prompt": prompt, "max_tokens": 80, "temperature": 0, "stop": [stop.clone()], "logprobs": 1, "stream": stream});
    let (st, body) = post(&c, &base, "/v1/completions", req(false)).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let w: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(w["choices"][0]["text"], full_text[..first]);
    assert_eq!(w["choices"][0]["finish_reason"], "stop");
    let lp = &w["choices"][0]["logprobs"];
    let toks: Vec<String> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), toks.len());
    assert_eq!(lp["text_offset"][0], 0);
    // Greedy: the sampled token is the top one.
    for (t, top) in toks.iter().zip(lp["top_logprobs"].as_array().unwrap()) {
        assert!(top.as_object().unwrap().contains_key(t.as_str()));
    }

    let r = c.post(format!("{base}/v1/completions")).json(&req(true)).send().await.unwrap();
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let mut text = String::new();
    let mut stoks = vec![];
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["object"], "text_completion");
        text.push_str(v["choices"][0]["text"].as_str().unwrap());
        if let Some(t) = v["choices"][0]["logprobs"]["tokens"].as_array() {
            stoks.extend(t.iter().map(|x| x.as_str().unwrap().to_string()));
        }
    }
    assert_eq!(text, full_text[..first]);
    assert_eq!(stoks, toks);
    server.shutdown();
    server.wait().await.unwrap();
}

fn err_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let e = v["error"].clone();
    assert!(e["message"].is_string() && e["type"].is_string(), "{body}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{body}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_their_status_and_shape() {
    let mut setup = Setup { max_num_seqs: 1, step_delay: Duration::from_millis(20), ..Setup::default() };
    setup.config.api_key = Some("sekrit".into());
    setup.config.max_queue = 0;
    let mut server = start(setup).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let send = |path: &str, body: String, key: Option<&str>| {
        let mut r = c.post(format!("{base}{path}")).header("content-type", "application/json").body(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    let ok = json!({"model": "tiny-test", "prompt": "hi", "max_tokens": 2}).to_string();
    let r = send("/v1/completions", ok.clone(), None).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(err_of(&r.text().await.unwrap())["code"], "invalid_api_key");
    let r = send("/v1/completions", ok.clone(), Some("wrong")).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = send("/v1/completions", ok.clone(), Some("sekrit")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let k = Some("sekrit");
    let r = send("/v1/completions", "{\"model\": \"tiny-test\", \"prompt\": ".into(), k).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    err_of(&r.text().await.unwrap());
    let r = send("/v1/completions", json!({"model": "tiny-test", "prompt": "hi", "max_tokens": "lots"}).to_string(), k).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = send("/v1/chat/completions", json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}).to_string(), k).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let e = err_of(&r.text().await.unwrap());
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["param"], "model");
    for (body, param) in [
        (json!({"model": "tiny-test", "prompt": "hi", "n": 2}), "n"),
        (json!({"model": "tiny-test", "prompt": "hi", "temperature": 3.0}), "temperature"),
        (json!({"model": "tiny-test", "prompt": "hi", "top_p": 0}), "top_p"),
        (json!({"model": "tiny-test", "prompt": "hi", "stop": [""]}), "stop"),
        (json!({"model": "tiny-test", "prompt": "hi", "max_tokens": 0}), "max_tokens"),
        (json!({"model": "tiny-test", "prompt": "hi", "logprobs": 9}), "logprobs"),
        (json!({"model": "tiny-test", "prompt": "hi", "max_tokens": 300}), "max_tokens"),
        (json!({"model": "tiny-test", "prompt": "x".repeat(300)}), "prompt"),
        (json!({"model": "tiny-test", "prompt": "x".repeat(255)}), "prompt"),
        (json!({"model": "tiny-test", "messages": []}), "messages"),
    ] {
        let path = if body.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" };
        let r = send(path, body.to_string(), k).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(err_of(&r.text().await.unwrap())["param"], param, "{body}");
    }
    // Too long: never truncated.
    let r = send("/v1/completions", json!({"model": "tiny-test", "prompt": "x".repeat(300)}).to_string(), k).await.unwrap();
    assert_eq!(err_of(&r.text().await.unwrap())["code"], "context_length_exceeded");
    // Over the body limit (64 KiB in the tests).
    let r = send("/v1/completions", json!({"model": "tiny-test", "prompt": "x".repeat(100_000)}).to_string(), k).await.unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    err_of(&r.text().await.unwrap());

    // A full queue: one slot, no queue; a long stream holds the slot.
    let long = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth("sekrit")
        .json(&json!({"model": "tiny-test", "prompt": "hold", "max_tokens": 200, "stream": true, "temperature": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), StatusCode::OK);
    let r = send("/v1/completions", ok.clone(), k).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    err_of(&r.text().await.unwrap());
    drop(long);
    // The slot comes back once the dropped stream is cancelled.
    let t0 = Instant::now();
    loop {
        let r = send("/v1/completions", ok.clone(), k).await.unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(t0.elapsed() < Duration::from_secs(10), "the cancelled stream kept its slot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("llm_requests_total{endpoint=\"/v1/completions\",status=\"429\"}"), "{m}");
    assert!(m.contains("llm_requests_total{endpoint=\"/v1/completions\",status=\"401\"} 2"), "{m}");
    server.shutdown();
    server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_waits_for_the_model() {
    let setup = Setup { load_delay: Duration::from_millis(400), ..Setup::default() };
    let mut server = start(setup).await;
    let base = format!("http://{}", server.local_addr());
    let c = client();
    assert_eq!(c.get(format!("{base}/health")).send().await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": "hi"})).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    err_of(&body);
    server.ready().await.unwrap();
    assert_eq!(c.get(format!("{base}/health")).send().await.unwrap().status(), StatusCode::OK);
    server.shutdown();
    server.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_failure_and_engine_panic() {
    let mut server = start(Setup::default()).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    // A failing step: 500 for that request (streamed: an error event, then [DONE]); the
    // server goes on.
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": [BOS, 1, 97]})).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(err_of(&body)["type"], "server_error");
    let r = c.post(format!("{base}/v1/completions")).json(&json!({"model": "tiny-test", "prompt": [BOS, 1], "stream": true})).send().await.unwrap();
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    err_of(&data[data.len() - 2]);
    let (st, _) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": "fine", "max_tokens": 3})).await;
    assert_eq!(st, StatusCode::OK);
    let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&m, "llm_kv_blocks_used"), 0.0);

    // A panicking runner takes the engine thread down: the request gets 500, then /health
    // and new requests 503, and wait() reports it.
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": [BOS, 2]})).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let t0 = Instant::now();
    while c.get(format!("{base}/health")).send().await.unwrap().status() != StatusCode::SERVICE_UNAVAILABLE {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": "x"})).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    err_of(&body);
    server.shutdown();
    assert!(matches!(server.wait().await, Err(llm_server::ServerError::EnginePanicked)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_steps_are_timed_in_metrics() {
    // Steps of at least 5 ms: a request of 6 tokens is one prefill step and 5 decode steps.
    let mut server = start(Setup { step_delay: Duration::from_millis(5), ..Setup::default() }).await;
    server.ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let m0 = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let (st, body) = post(&c, &base, "/v1/completions", json!({"model": "tiny-test", "prompt": "hi", "max_tokens": 6, "ignore_eos": true, "temperature": 0})).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let m = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let d = |name: &str| metric(&m, name) - metric(&m0, name);
    assert_eq!(d("llm_engine_step_seconds_count"), 6.0, "{m}");
    assert!(d("llm_engine_step_seconds_sum") >= 6.0 * 0.005, "{m}");
    assert_eq!(metric(&m, "llm_engine_step_seconds_bucket{le=\"0.001\"}"), 0.0, "{m}");
    assert!(d("llm_engine_between_steps_seconds_total") >= 0.0, "{m}");
    server.shutdown();
    server.wait().await.unwrap();
}

/// Every connection the server accepts has Nagle's algorithm off (a streamed token is one
/// small write that must not wait for the client's delayed ACK of the previous one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_connections_have_nagle_off() {
    use axum::serve::Listener;
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    let mut listener = llm_server::no_delay(plain);
    let client = tokio::spawn(async move { tokio::net::TcpStream::connect(addr).await.unwrap() });
    let (io, peer) = listener.accept().await;
    let client = client.await.unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    assert!(io.nodelay().unwrap(), "the accepted connection still has Nagle's algorithm on");
}
