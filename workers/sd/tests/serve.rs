//! `sd-worker serve` over real HTTP on 127.0.0.1, with the tiny random-weights model on
//! Candle's CPU backend: images equal to the library's, the OpenAI error shapes, the queue,
//! disconnecting clients, health, metrics, and shutdown (in process, and SIGTERM to the binary).

use candle_core::{DType, Device};
use reqwest::StatusCode;
use sd_worker::serve::{ServeConfig, Server};
use sd_worker::{random, Pipeline, Request, Shape};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    random::write_model(Shape::Tiny, dir.path(), 5, DType::F32).unwrap();
    dir
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(120)).build().unwrap()
}

async fn start(dir: &Path, config: ServeConfig) -> (Server, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = dir.to_path_buf();
    let server = Server::start(config, listener, move || Pipeline::load(&dir, Shape::Tiny.config(), &Device::Cpu, DType::F32)).unwrap();
    tokio::time::timeout(Duration::from_secs(60), server.ready()).await.expect("load timed out").unwrap();
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

fn config() -> ServeConfig {
    ServeConfig { model_name: "tiny".into(), ..Default::default() }
}

/// The value of an unlabelled (or fully labelled) series in Prometheus text.
fn metric(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' '))).unwrap_or_else(|| panic!("no {series} in\n{text}")).parse().unwrap()
}

async fn metrics(c: &reqwest::Client, base: &str) -> String {
    let r = c.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// Polls `/metrics` until `series` reaches `want` (bounded).
async fn wait_metric(c: &reqwest::Client, base: &str, series: &str, want: f64) {
    let t0 = Instant::now();
    loop {
        let text = metrics(c, base).await;
        if text.lines().any(|l| l.starts_with(series)) && metric(&text, series) == want {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{series} never reached {want}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the OpenAI error object of a response and returns it.
async fn error_of(r: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(r.status(), status);
    let v: Value = r.json().await.unwrap();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    v
}

fn decode_b64(v: &Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(v["b64_json"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_equal_the_library_pipeline() {
    let dir = tiny_model();
    let (mut server, base) = start(dir.path(), config()).await;
    let c = client();
    let t_before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let body = json!({"prompt": "a red fox", "model": "tiny", "n": 2, "size": "24x16", "seed": 7, "steps": 2, "response_format": "b64_json"});
    let r = c.post(format!("{base}/v1/images/generations")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let created = v["created"].as_u64().unwrap();
    assert!(created >= t_before && created <= t_before + 120, "{created}");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);

    // The same requests through the library (image k uses seed 7 + k), same device: the
    // same arithmetic in the same order, so the PNG bytes are equal, not merely close.
    let pipe = Pipeline::load(dir.path(), Shape::Tiny.config(), &Device::Cpu, DType::F32).unwrap();
    let mut pixels = Vec::new();
    for (k, d) in data.iter().enumerate() {
        let png = decode_b64(d);
        let img = image::load_from_memory_with_format(&png, image::ImageFormat::Png).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (24, 16));
        let mut req = Request::new(&pipe.cfg, "a red fox", 7 + k as u64);
        (req.width, req.height, req.steps) = (24, 16, 2);
        let want = sd_worker::png_bytes(&pipe.generate(&req, &mut ()).unwrap().image).unwrap();
        assert!(png == want, "image {k}: the server's PNG differs from the library's");
        let spread = img.as_raw().iter().max().unwrap() - img.as_raw().iter().min().unwrap();
        assert!(spread > 0, "flat image");
        pixels.push(img.into_raw());
    }
    assert_ne!(pixels[0], pixels[1], "two seeds gave the same image");

    // Defaults: the model's native size, one image, no model named.
    let r = c.post(format!("{base}/v1/images/generations")).json(&json!({"prompt": "x", "steps": 1})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    let img = image::load_from_memory(&decode_b64(&v["data"][0])).unwrap();
    assert_eq!((img.width(), img.height()), (16, 16));

    let m = metrics(&c, &base).await;
    assert_eq!(metric(&m, "sd_images_generated_total"), 3.0);
    assert_eq!(metric(&m, "sd_image_generation_seconds_count"), 3.0);
    assert!(metric(&m, "sd_image_generation_seconds_sum") > 0.0);
    assert_eq!(metric(&m, "sd_requests_total{endpoint=\"/v1/images/generations\",status=\"200\"}"), 2.0);
    assert_eq!(metric(&m, "sd_queue_depth"), 0.0);
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(30), server.wait()).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors() {
    let dir = tiny_model();
    // Loading: 503 on /health and the API until the loader returns.
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let path = dir.path().to_path_buf();
    let cfg = ServeConfig { api_key: Some("k1".into()), max_body_bytes: 4096, ..config() };
    let mut server = Server::start(cfg, listener, move || {
        let _ = gate.recv();
        Pipeline::load(&path, Shape::Tiny.config(), &Device::Cpu, DType::F32)
    })
    .unwrap();
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let url = format!("{base}/v1/images/generations");
    let auth = |rb: reqwest::RequestBuilder| rb.header("Authorization", "Bearer k1");
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!((r.status(), r.text().await.unwrap().as_str()), (StatusCode::SERVICE_UNAVAILABLE, "loading\n"));
    let e = error_of(auth(c.post(&url)).json(&json!({"prompt": "x"})).send().await.unwrap(), StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(e["error"]["type"], "service_unavailable");
    release.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), server.ready()).await.unwrap().unwrap();
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    let post = |body: String| auth(c.post(&url)).header("Content-Type", "application/json").body(body).send();
    let bad = |v: &Value| (v["error"]["type"].clone(), v["error"]["param"].clone());

    let v = error_of(post("{\"prompt\": ".into()).await.unwrap(), StatusCode::BAD_REQUEST).await;
    assert_eq!(bad(&v), (json!("invalid_request_error"), Value::Null));
    assert!(v["error"]["message"].as_str().unwrap().contains("invalid request body"), "{v}");
    let v = error_of(post(json!({"n": 1}).to_string()).await.unwrap(), StatusCode::BAD_REQUEST).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("prompt"), "{v}");
    for size in ["17x16", "16x17", "16", "16x16x", "x16", "0x16", "8x48", "-8x16", "1024x1024", "16X16"] {
        let v = error_of(post(json!({"prompt": "x", "size": size}).to_string()).await.unwrap(), StatusCode::BAD_REQUEST).await;
        assert_eq!(bad(&v), (json!("invalid_request_error"), json!("size")), "{size}");
        assert!(v["error"]["message"].as_str().unwrap().contains("multiples of 8"), "{v}");
    }
    let v = error_of(post(json!({"prompt": "x", "response_format": "url"}).to_string()).await.unwrap(), StatusCode::BAD_REQUEST).await;
    assert_eq!(bad(&v), (json!("invalid_request_error"), json!("response_format")));
    assert!(v["error"]["message"].as_str().unwrap().contains("b64_json"), "{v}");
    for (field, value) in [("n", json!(0)), ("n", json!(5)), ("n", json!(-1)), ("steps", json!(0)), ("steps", json!(151)), ("guidance_scale", json!(-1.0)), ("prompt", json!(" "))] {
        let mut body = json!({"prompt": "x"});
        body[field] = value.clone();
        let v = error_of(post(body.to_string()).await.unwrap(), StatusCode::BAD_REQUEST).await;
        assert_eq!(bad(&v), (json!("invalid_request_error"), json!(field)), "{field} = {value}");
    }
    let v = error_of(post(json!({"prompt": "x", "model": "dall-e-3"}).to_string()).await.unwrap(), StatusCode::NOT_FOUND).await;
    assert_eq!((v["error"]["param"].as_str(), v["error"]["code"].as_str()), (Some("model"), Some("model_not_found")));
    // Over the 4096-byte limit: 413 before any parsing.
    let v = error_of(post(json!({"prompt": "x".repeat(5000)}).to_string()).await.unwrap(), StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(v["error"]["type"], "request_too_large");
    // Keys: none, wrong, and a wrong scheme.
    let v = error_of(c.post(&url).json(&json!({"prompt": "x"})).send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
    assert_eq!((v["error"]["type"].as_str(), v["error"]["code"].as_str()), (Some("authentication_error"), Some("invalid_api_key")));
    for h in ["Bearer k2", "Basic k1", "k1"] {
        error_of(c.post(&url).header("Authorization", h).json(&json!({"prompt": "x"})).send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
    }
    error_of(c.get(format!("{base}/v1/models")).send().await.unwrap(), StatusCode::UNAUTHORIZED).await;
    error_of(c.get(format!("{base}/v1/nothing")).send().await.unwrap(), StatusCode::NOT_FOUND).await;

    let models: Value = auth(c.get(format!("{base}/v1/models"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["default_size"], "16x16");

    // Nothing was generated; every refusal was counted by status.
    let m = metrics(&c, &base).await;
    assert_eq!(metric(&m, "sd_images_generated_total"), 0.0);
    assert_eq!(metric(&m, "sd_requests_total{endpoint=\"/v1/images/generations\",status=\"400\"}"), 20.0);
    assert_eq!(metric(&m, "sd_requests_total{endpoint=\"/v1/images/generations\",status=\"401\"}"), 4.0);
    assert_eq!(metric(&m, "sd_requests_total{endpoint=\"/v1/images/generations\",status=\"413\"}"), 1.0);
    assert_eq!(metric(&m, "sd_requests_total{endpoint=\"/v1/images/generations\",status=\"503\"}"), 1.0);
    assert!(m.contains("# TYPE sd_image_generation_seconds histogram"));
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(30), server.wait()).await.unwrap().unwrap();
}

/// A request that keeps the worker busy for seconds (150 guided steps, four times, at 32x32;
/// each step takes milliseconds even optimised).
fn long_body() -> Value {
    json!({"prompt": "slow", "n": 4, "size": "32x32", "steps": 150, "seed": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_429_and_gone_clients_are_skipped() {
    let dir = tiny_model();
    let (mut server, base) = start(dir.path(), ServeConfig { max_queue: 1, retry_after_s: 7, ..config() }).await;
    let c = client();
    let url = format!("{base}/v1/images/generations");
    // A runs, B waits in the queue, C finds it full.
    let a = tokio::spawn(c.post(&url).json(&long_body()).send());
    wait_metric(&c, &base, "sd_requests_in_flight", 1.0).await;
    let b = tokio::spawn(c.post(&url).json(&long_body()).send());
    wait_metric(&c, &base, "sd_queue_depth", 1.0).await;
    let r = c.post(&url).json(&json!({"prompt": "x"})).send().await.unwrap();
    assert_eq!(r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string()).as_deref(), Some("7"));
    let v = error_of(r, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!((v["error"]["type"].as_str(), v["error"]["code"].as_str()), (Some("rate_limit_error"), Some("queue_full")));
    // Both clients hang up: B is skipped when its turn comes, A stops at its next step.
    b.abort();
    a.abort();
    wait_metric(&c, &base, "sd_requests_abandoned_total", 2.0).await;
    wait_metric(&c, &base, "sd_requests_in_flight", 0.0).await;
    let m = metrics(&c, &base).await;
    assert_eq!(metric(&m, "sd_images_generated_total"), 0.0, "an abandoned request ran to its end");
    // The worker is free again.
    let r = c.post(&url).json(&json!({"prompt": "x", "steps": 1})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    wait_metric(&c, &base, "sd_images_generated_total", 1.0).await;
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(30), server.wait()).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_in_flight_and_ends() {
    let dir = tiny_model();
    let (mut server, base) = start(dir.path(), ServeConfig { shutdown_grace: Duration::from_millis(100), ..config() }).await;
    let c = client();
    let url = format!("{base}/v1/images/generations");
    let a = tokio::spawn(c.post(&url).json(&long_body()).send());
    wait_metric(&c, &base, "sd_requests_in_flight", 1.0).await;
    let t0 = Instant::now();
    server.shutdown();
    // Draining: new requests and /health get 503 (or find the listener already closed).
    if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), c.post(&url).json(&json!({"prompt": "x"})).send()).await {
        error_of(r, StatusCode::SERVICE_UNAVAILABLE).await;
    }
    let r = tokio::time::timeout(Duration::from_secs(30), a).await.expect("in-flight request never answered").unwrap().unwrap();
    let v = error_of(r, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("cancelled"), "{v}");
    tokio::time::timeout(Duration::from_secs(30), server.wait()).await.expect("server never stopped").unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// The binary: `serve --help` documents the endpoint; SIGTERM with a request in flight ends
/// the process with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_and_exits_cleanly_on_sigterm() {
    let exe = env!("CARGO_BIN_EXE_sd-worker");
    let help = std::process::Command::new(exe).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("/v1/images/generations") && help.contains("--api-key") && help.contains("curl"), "{help}");

    let dir = tiny_model();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(exe)
        .args(["serve", "--shape", "tiny", "--device", "cpu", "--shutdown-grace", "0.1", "--served-model-name", "tiny", "--port", &port.to_string(), "--model"])
        .arg(dir.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let c = client();
    let t0 = Instant::now();
    while !matches!(c.get(format!("{base}/health")).send().await, Ok(r) if r.status() == 200) {
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        assert!(child.try_wait().unwrap().is_none(), "the server exited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = c.post(format!("{base}/v1/images/generations")).json(&json!({"prompt": "x", "model": "tiny", "steps": 1, "seed": 3})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let a = tokio::spawn(c.post(format!("{base}/v1/images/generations")).json(&long_body()).send());
    wait_metric(&c, &base, "sd_requests_in_flight", 1.0).await;
    let kill = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let r = tokio::time::timeout(Duration::from_secs(30), a).await.expect("in-flight request never answered").unwrap().unwrap();
    error_of(r, StatusCode::SERVICE_UNAVAILABLE).await;
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t1.elapsed() < Duration::from_secs(30), "still running after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}

/// A model that does not load: `ready` reports it, the API and `/health` answer 503, and the
/// binary exits with status 1 and the typed error (no panic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_failure_is_reported() {
    let empty = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let path = empty.path().to_path_buf();
    let mut server = Server::start(config(), listener, move || Pipeline::load(&path, Shape::Tiny.config(), &Device::Cpu, DType::F32)).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), server.ready()).await.unwrap().unwrap_err();
    assert!(e.to_string().contains("missing UNet weights"), "{e}");
    let base = format!("http://{}", server.local_addr());
    let c = client();
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!((r.status(), r.text().await.unwrap().as_str()), (StatusCode::SERVICE_UNAVAILABLE, "worker stopped\n"));
    error_of(c.post(format!("{base}/v1/images/generations")).json(&json!({"prompt": "x"})).send().await.unwrap(), StatusCode::SERVICE_UNAVAILABLE).await;
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(30), server.wait()).await.unwrap().unwrap();

    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sd-worker"))
        .args(["serve", "--shape", "tiny", "--device", "cpu", "--port", "0", "--model"])
        .arg(empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("sd-worker: loading the model: missing UNet weights") && !err.contains("panicked"), "{err}");
}
