//! `llm_server::run` (what `llm-worker serve` calls) ends with `Ok` on SIGTERM with a request
//! in flight. Its own test binary: the signal goes to the whole process.

mod common;

use common::*;
use llm_engine::{Engine, EngineConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Log lines captured by the global subscriber.
#[derive(Clone, Default)]
struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn sigterm_stops_run_cleanly() {
    let logs = Buf::default();
    let w = logs.clone();
    tracing_subscriber::fmt().with_ansi(false).with_writer(move || w.clone()).init();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = llm_server::ServerConfig { shutdown_grace: Duration::from_millis(200), ..Default::default() };
    let server = std::thread::spawn(move || {
        llm_server::run(config, addr, || {
            let runner = TestRunner { block_size: 16, slots: vec![None; 32 * 16], step_delay: Duration::from_millis(10) };
            let cfg = EngineConfig { max_num_seqs: 4, max_batched_tokens: 128, max_model_len: 256, prefix_caching: false };
            Ok((TestModel { tok: tokenizer(), max_len: 256 }, Engine::try_new(runner, cfg)?))
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = client();
        let base = format!("http://{addr}");
        let t0 = Instant::now();
        while !matches!(c.get(format!("{base}/health")).send().await, Ok(r) if r.status() == 200) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "tiny-test", "prompt": "abc", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let kill = std::process::Command::new("kill").args(["-TERM", &std::process::id().to_string()]).status().unwrap();
        assert!(kill.success());
        let data = sse_data(&r.text().await.unwrap());
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "abort");
    });
    let t0 = Instant::now();
    while !server.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(10), "run did not return");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.join().unwrap().unwrap();
    // One structured line for the request, with its timings.
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("llm_server::request")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    for field in ["endpoint=\"completions\"", "stream=true", "prompt_tokens=4", "finish=\"abort\"", "ttft_ms=", "mean_itl_ms=", "total_ms="] {
        assert!(lines[0].contains(field), "{field} not in {}", lines[0]);
    }
}
