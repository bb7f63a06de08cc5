//! The LLM server's series, in the Prometheus text format through `openai_http::prom`.

use llm_engine::EngineStats;
use openai_http::prom::{write_value, Histogram, StatusCounts};
use std::sync::atomic::{AtomicU64, Ordering};

/// Everything `/metrics` reports.
#[derive(Default)]
pub(crate) struct Metrics {
    /// Responses by (endpoint, status).
    pub(crate) requests: StatusCounts,
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
        self.requests.write(&mut o, "llm_requests_total", "HTTP responses by endpoint and status.");
        let gauge = |o: &mut String, name: &str, kind: &str, help: &str, v: u64| write_value(o, name, kind, help, v);
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
        write_value(&mut o, "llm_engine_between_steps_seconds_total", "counter", "Engine-thread time between steps while it had work (commands, gauges).", between);
        self.step.write(&mut o, "llm_engine_step_seconds", "Wall time of one engine step (schedule, forward, logits download, sampling, token events); llm_engine_generated_tokens_total over its count is the mean sampled batch.");
        o.push_str(extra);
        o
    }
}
