//! Counters, gauges and histograms written in the Prometheus text format (0.0.4) directly:
//! a handful of series do not need a metrics framework.

use llm_engine::EngineStats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 16] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Default)]
pub(crate) struct Histogram {
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    pub(crate) fn observe(&self, secs: f64) {
        let mut g = self.inner.lock().unwrap();
        if g.0.is_empty() {
            g.0 = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            g.0[i] += 1;
        }
        g.1 += secs;
        g.2 += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let g = self.inner.lock().unwrap();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += g.0.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", g.2, g.1, g.2);
    }
}

/// Everything `/metrics` reports.
#[derive(Default)]
pub(crate) struct Metrics {
    /// Responses by (endpoint, status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generation_tokens: AtomicU64,
    pub(crate) ttft: Histogram,
    pub(crate) itl: Histogram,
    pub(crate) e2e: Histogram,
    running: AtomicU64,
    waiting: AtomicU64,
    blocks_used: AtomicU64,
    blocks_free: AtomicU64,
    blocks_total: AtomicU64,
    preemptions: AtomicU64,
    engine_generated: AtomicU64,
    /// Wall time of each `Engine::step` on the engine thread (scheduling, the runner's
    /// forward and logits download, sampling, sending the tokens to the handlers).
    pub(crate) step: Histogram,
    /// Engine-thread nanoseconds outside `Engine::step` while it had work (taking commands,
    /// publishing these gauges): the server's own cost between steps.
    between_steps_ns: AtomicU64,
}

impl Metrics {
    pub(crate) fn count_request(&self, endpoint: &str, status: u16) {
        *self.requests.lock().unwrap().entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// The engine thread's occupancy after a step.
    pub(crate) fn publish(&self, s: &EngineStats) {
        self.running.store(s.running as u64, Ordering::Relaxed);
        self.waiting.store(s.waiting as u64, Ordering::Relaxed);
        self.blocks_used.store(s.blocks_used as u64, Ordering::Relaxed);
        self.blocks_free.store(s.blocks_free as u64, Ordering::Relaxed);
        self.blocks_total.store(s.blocks_total as u64, Ordering::Relaxed);
        self.preemptions.store(s.preemptions, Ordering::Relaxed);
        self.engine_generated.store(s.generated_tokens, Ordering::Relaxed);
    }

    /// One `Engine::step` of `secs` seconds, after `between` seconds of engine-thread work
    /// since the previous step (0 for the first step after idling).
    pub(crate) fn engine_step(&self, secs: f64, between: f64) {
        self.step.observe(secs);
        self.between_steps_ns.fetch_add((between * 1e9) as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition; `extra` (a served model's own series) goes at the end.
    pub(crate) fn render(&self, in_flight: usize, extra: &str) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# HELP llm_requests_total HTTP responses by endpoint and status.\n# TYPE llm_requests_total counter");
        for ((ep, st), n) in self.requests.lock().unwrap().iter() {
            let _ = writeln!(o, "llm_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
        }
        let gauge = |o: &mut String, name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(&mut o, "llm_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", ld(&self.prompt_tokens));
        gauge(&mut o, "llm_generation_tokens_total", "counter", "Tokens sent to clients.", ld(&self.generation_tokens));
        gauge(&mut o, "llm_requests_in_flight", "gauge", "Requests admitted and not finished.", in_flight as u64);
        gauge(&mut o, "llm_queue_depth", "gauge", "Requests waiting for a batch slot.", ld(&self.waiting));
        gauge(&mut o, "llm_running_sequences", "gauge", "Sequences in the running batch.", ld(&self.running));
        gauge(&mut o, "llm_kv_blocks_used", "gauge", "KV cache blocks referenced by a sequence.", ld(&self.blocks_used));
        gauge(&mut o, "llm_kv_blocks_free", "gauge", "KV cache blocks free (prefix-cached ones included).", ld(&self.blocks_free));
        gauge(&mut o, "llm_kv_blocks_total", "gauge", "KV cache blocks.", ld(&self.blocks_total));
        gauge(&mut o, "llm_preemptions_total", "counter", "Sequences preempted for recompute.", ld(&self.preemptions));
        gauge(&mut o, "llm_engine_generated_tokens_total", "counter", "Tokens the engine sampled (sent, stop tokens, and those of requests cancelled later).", ld(&self.engine_generated));
        self.ttft.write(&mut o, "llm_time_to_first_token_seconds", "Time from request arrival to its first token.");
        self.itl.write(&mut o, "llm_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
        self.e2e.write(&mut o, "llm_request_duration_seconds", "Time from request arrival to its last event.");
        let between = ld(&self.between_steps_ns) as f64 * 1e-9;
        let _ = writeln!(o, "# HELP llm_engine_between_steps_seconds_total Engine-thread time between steps while it had work (commands, gauges).\n# TYPE llm_engine_between_steps_seconds_total counter\nllm_engine_between_steps_seconds_total {between}");
        self.step.write(&mut o, "llm_engine_step_seconds", "Wall time of one engine step (schedule, forward, logits download, sampling, token events); llm_engine_generated_tokens_total over its count is the mean sampled batch.");
        o.push_str(extra);
        o
    }
}
