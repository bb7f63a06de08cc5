//! The HTTP routes: OpenAI request parsing and validation, responses and SSE chunks, errors.

use crate::{Cmd, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use openai_http::ApiError;
use llm_engine::{EngineError, Event, FinishReason, Receiver, SamplingParams};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

type St = State<Arc<Shared>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.max_body_bytes;
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models));
    openai_http::api_router(shared, v1, get(metrics), limit)
}

/// One chat message (`content` given as a string or as a list of text parts).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

async fn metrics(State(s): St) -> Response {
    let extra = s.model.get().map(|m| m.metrics()).unwrap_or_default();
    let text = s.metrics.render(s.in_flight.load(Ordering::SeqCst), &extra);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(s): St) -> Response {
    let m = s.model.get().expect("gate checked");
    Json(json!({"object": "list", "data": [{
        "id": m.name(), "object": "model", "created": 0, "owned_by": "llm-worker", "max_model_len": m.max_model_len()
    }]}))
    .into_response()
}

// ---------------------------------------------------------------------------------------------
// Requests

/// A string or a list of strings (`stop`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `prompt` of a completion: text, or token ids; a list of one of either.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Fields both endpoints share.
#[derive(Deserialize)]
struct Common {
    model: String,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u32>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    stop: Option<OneOrMany>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// vLLM's extension: generate `max_tokens` even past EOS (benchmarks).
    #[serde(default)]
    ignore_eos: bool,
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    logprobs: Option<u32>,
    #[serde(default)]
    echo: bool,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<InMessage>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    #[serde(flatten)]
    common: Common,
}

/// Which endpoint a generation serves.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

/// A validated generation request.
struct Job {
    kind: Kind,
    prompt: Vec<u32>,
    params: SamplingParams,
    stream: bool,
    include_usage: bool,
    /// Top logprobs per token (`Some(0)`: the sampled token's only).
    logprobs: Option<usize>,
}

fn sampling(c: &Common, model: &dyn crate::ServedModel, prompt_len: usize, default_max: Option<u64>) -> Result<SamplingParams, ApiError> {
    openai_http::check_model(&c.model, model.name())?;
    if c.n.unwrap_or(1) != 1 {
        return Err(ApiError::bad("only n = 1 is supported", Some("n")));
    }
    for (v, name) in [(c.presence_penalty, "presence_penalty"), (c.frequency_penalty, "frequency_penalty")] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(ApiError::bad(format!("{name} is not supported (only 0)"), Some(if name == "presence_penalty" { "presence_penalty" } else { "frequency_penalty" })));
        }
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(format!("temperature must be in [0, 2], got {temperature}"), Some("temperature")));
    }
    if let Some(p) = c.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad(format!("top_p must be in (0, 1], got {p}"), Some("top_p")));
        }
    }
    let stop_strings = match &c.stop {
        None => vec![],
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    if stop_strings.len() > 4 || stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop must be at most 4 non-empty strings", Some("stop")));
    }
    let max_len = model.max_model_len();
    if prompt_len >= max_len {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the prompt has {prompt_len} tokens; this model's maximum context length is {max_len} tokens (prompt and completion)"),
            Some("prompt"),
            Some("context_length_exceeded"),
        ));
    }
    let room = (max_len - prompt_len) as u64;
    let max_tokens = match c.max_completion_tokens.or(c.max_tokens) {
        Some(0) => return Err(ApiError::bad("max_tokens must be >= 1", Some("max_tokens"))),
        Some(m) if m > room => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("max_tokens {m} + the prompt's {prompt_len} tokens exceed this model's maximum context length of {max_len} tokens"),
                Some("max_tokens"),
                Some("context_length_exceeded"),
            ))
        }
        Some(m) => m,
        None => default_max.unwrap_or(room).min(room),
    };
    Ok(SamplingParams {
        temperature,
        top_p: c.top_p,
        seed: c.seed.map(|s| s as u64),
        max_tokens: max_tokens as usize,
        stop_token_ids: if c.ignore_eos { Vec::new() } else { model.eos_token_ids() },
        stop_strings,
        ..SamplingParams::default()
    })
}

fn completion_job(r: CompletionRequest, model: &dyn crate::ServedModel) -> Result<Job, ApiError> {
    if r.echo {
        return Err(ApiError::bad("echo is not supported", Some("echo")));
    }
    let enc = |t: &str| model.encode(t, true).map_err(|e| ApiError::bad(format!("tokenizing the prompt: {e}"), Some("prompt")));
    let prompt = match r.prompt {
        Prompt::Text(t) => enc(&t)?,
        Prompt::Texts(v) if v.len() == 1 => enc(&v[0])?,
        Prompt::Tokens(t) => t,
        Prompt::TokenLists(mut v) if v.len() == 1 => v.pop().unwrap(),
        _ => return Err(ApiError::bad("only one prompt per request is supported", Some("prompt"))),
    };
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty", Some("prompt")));
    }
    if let Some(n) = r.logprobs {
        if n > 5 {
            return Err(ApiError::bad("logprobs must be in [0, 5]", Some("logprobs")));
        }
    }
    let mut params = sampling(&r.common, model, prompt.len(), Some(16))?;
    params.logprobs = r.logprobs.map(|n| n as usize);
    let include_usage = r.common.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok(Job { kind: Kind::Completion, prompt, params: params.clone(), stream: r.common.stream, include_usage, logprobs: params.logprobs })
}

fn chat_job(r: ChatRequest, model: &dyn crate::ServedModel) -> Result<Job, ApiError> {
    if r.messages.is_empty() {
        return Err(ApiError::bad("messages must not be empty", Some("messages")));
    }
    let mut messages = Vec::with_capacity(r.messages.len());
    for m in r.messages {
        if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant") {
            return Err(ApiError::bad(format!("unsupported role `{}`", m.role), Some("messages")));
        }
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => s.push_str(&t),
                        _ => return Err(ApiError::bad("only text content parts are supported", Some("messages"))),
                    }
                }
                s
            }
        };
        let role = if m.role == "developer" { "system".to_string() } else { m.role };
        messages.push(crate::ChatMessage { role, content });
    }
    let text = model.render_chat(&messages).map_err(|e| ApiError::bad(format!("chat template: {e}"), Some("messages")))?;
    let prompt = model.encode(&text, false).map_err(|e| ApiError::bad(format!("tokenizing the messages: {e}"), Some("messages")))?;
    if prompt.is_empty() {
        return Err(ApiError::bad("the rendered prompt is empty", Some("messages")));
    }
    let logprobs = match (r.logprobs, r.top_logprobs) {
        (_, Some(n)) if n > 20 => return Err(ApiError::bad("top_logprobs must be in [0, 20]", Some("top_logprobs"))),
        (false, Some(_)) => return Err(ApiError::bad("top_logprobs needs logprobs: true", Some("top_logprobs"))),
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let mut params = sampling(&r.common, model, prompt.len(), None)?;
    params.logprobs = logprobs;
    let include_usage = r.common.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok(Job { kind: Kind::Chat, prompt, params, stream: r.common.stream, include_usage, logprobs })
}

async fn completions(State(s): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let r: CompletionRequest = openai_http::parse_json(body)?;
    let model = s.model.get().expect("gate checked").clone();
    let job = completion_job(r, &*model)?;
    generate(s, model, job).await
}

async fn chat_completions(State(s): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let r: ChatRequest = openai_http::parse_json(body)?;
    let model = s.model.get().expect("gate checked").clone();
    let job = chat_job(r, &*model)?;
    generate(s, model, job).await
}

// ---------------------------------------------------------------------------------------------
// Generation

/// One admitted request: releases its in-flight slot, records its metrics and writes its log
/// line when dropped (finished, failed, or its client gone).
struct Tracker {
    shared: Arc<Shared>,
    id: String,
    kind: Kind,
    stream: bool,
    start: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    prompt_tokens: usize,
    tokens: usize,
    finish: Option<&'static str>,
}

impl Tracker {
    fn token(&mut self) {
        let now = Instant::now();
        match self.last {
            None => {
                self.first = Some(now);
                self.shared.metrics.ttft.observe((now - self.start).as_secs_f64());
            }
            Some(l) => self.shared.metrics.itl.observe((now - l).as_secs_f64()),
        }
        self.last = Some(now);
        self.tokens += 1;
        self.shared.metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        let total = self.start.elapsed();
        self.shared.metrics.e2e.observe(total.as_secs_f64());
        let ms = |d: Option<Instant>| d.map(|t| (t - self.start).as_secs_f64() * 1e3);
        let itl_ms = match (self.first, self.last) {
            (Some(f), Some(l)) if self.tokens > 1 => Some((l - f).as_secs_f64() * 1e3 / (self.tokens - 1) as f64),
            _ => None,
        };
        tracing::info!(
            target: "llm_server::request",
            id = %self.id,
            endpoint = if self.kind == Kind::Chat { "chat" } else { "completions" },
            stream = self.stream,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.tokens,
            finish = self.finish.unwrap_or("client_gone"),
            ttft_ms = ms(self.first),
            mean_itl_ms = itl_ms,
            total_ms = total.as_secs_f64() * 1e3,
            "request"
        );
    }
}

fn finish_str(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Stop => "stop",
        FinishReason::Cancelled => "abort",
        FinishReason::Error(_) => "error",
    }
}

/// Detokenizes a growing completion, giving the new text once it is complete characters.
struct Detok {
    ids: Vec<u32>,
    sent: usize,
}

impl Detok {
    fn push(&mut self, model: &dyn crate::ServedModel, id: u32) -> String {
        self.ids.push(id);
        let full = model.decode(&self.ids).unwrap_or_default();
        if full.ends_with('\u{FFFD}') || full.len() <= self.sent || !full.is_char_boundary(self.sent) {
            return String::new();
        }
        let d = full[self.sent..].to_string();
        self.sent = full.len();
        d
    }
    fn rest(&mut self, model: &dyn crate::ServedModel) -> String {
        let full = model.decode(&self.ids).unwrap_or_default();
        let d = if full.len() > self.sent && full.is_char_boundary(self.sent) { full[self.sent..].to_string() } else { String::new() };
        self.sent = full.len();
        d
    }
}

/// Per-token logprobs in the endpoint's shape.
fn logprob_entry(kind: Kind, model: &dyn crate::ServedModel, id: u32, lp: f32, top: &[(u32, f32)]) -> Value {
    let text = |t: u32| model.decode(&[t]).unwrap_or_default();
    match kind {
        Kind::Chat => {
            let tok = text(id);
            json!({
                "token": tok, "logprob": lp, "bytes": tok.as_bytes(),
                "top_logprobs": top.iter().map(|&(t, l)| { let s = text(t); json!({"token": s, "logprob": l, "bytes": s.as_bytes()}) }).collect::<Vec<_>>()
            })
        }
        Kind::Completion => {
            let mut m = serde_json::Map::new();
            for &(t, l) in top {
                m.entry(text(t)).or_insert(json!(l));
            }
            json!({"token": text(id), "logprob": lp, "top": m})
        }
    }
}

/// The completions endpoint's `logprobs` object from per-token entries.
fn completion_logprobs(entries: &[Value], offsets: &[usize]) -> Value {
    json!({
        "tokens": entries.iter().map(|e| e["token"].clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e["logprob"].clone()).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| e["top"].clone()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

async fn generate(s: Arc<Shared>, model: Arc<dyn crate::ServedModel>, job: Job) -> Result<Response, ApiError> {
    // Admission.
    let limit = s.max_in_flight.load(Ordering::SeqCst);
    if s.in_flight.fetch_add(1, Ordering::SeqCst) >= limit {
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::queue_full(s.config.retry_after_s));
    }
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let created = openai_http::unix_now();
    let prefix = if job.kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{created:x}{n:06x}");
    let mut tracker = Tracker {
        shared: s.clone(),
        id: id.clone(),
        kind: job.kind,
        stream: job.stream,
        start: Instant::now(),
        first: None,
        last: None,
        prompt_tokens: job.prompt.len(),
        tokens: 0,
        finish: None,
    };
    let (reply, rx) = tokio::sync::oneshot::channel();
    if !s.send(Cmd::Add { prompt: job.prompt.clone(), params: job.params.clone(), reply }) {
        tracker.finish = Some("rejected");
        return Err(ApiError::unavailable("the engine is not running"));
    }
    let events = match rx.await {
        Ok(Ok((_, events))) => events,
        Ok(Err(e)) => {
            tracker.finish = Some("rejected");
            return Err(match e {
                EngineError::PromptTooLong { .. } => ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", e.to_string(), Some("prompt"), Some("context_length_exceeded")),
                EngineError::InvalidParams(m) => ApiError::bad(m, None),
                e => ApiError::bad(e.to_string(), None),
            });
        }
        Err(_) => {
            tracker.finish = Some("rejected");
            return Err(ApiError::unavailable("the engine stopped"));
        }
    };
    s.metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
    let ctx = Ctx { id, created, model_name: model.name().to_string(), kind: job.kind, logprobs: job.logprobs, include_usage: job.include_usage };
    if job.stream {
        // Comment lines every 15 s keep idle proxies from closing a stream during a long prefill.
        Ok(Sse::new(sse_stream(ctx, model, events, tracker)).keep_alive(KeepAlive::default()).into_response())
    } else {
        whole(ctx, &*model, events, tracker).await
    }
}

struct Ctx {
    id: String,
    created: u64,
    model_name: String,
    kind: Kind,
    logprobs: Option<usize>,
    include_usage: bool,
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// A non-streamed answer: every event, then one JSON object.
async fn whole(ctx: Ctx, model: &dyn crate::ServedModel, mut events: Receiver<Event>, mut tracker: Tracker) -> Result<Response, ApiError> {
    let mut ids = Vec::new();
    let mut lps = Vec::new();
    let mut offsets = Vec::new();
    let mut detok = Detok { ids: Vec::new(), sent: 0 };
    loop {
        match events.recv().await {
            Some(Event::Token { id, logprob, top_logprobs }) => {
                tracker.token();
                ids.push(id);
                if ctx.logprobs.is_some() {
                    offsets.push(detok.sent);
                    lps.push(logprob_entry(ctx.kind, model, id, logprob.unwrap_or(f32::NAN), &top_logprobs));
                }
                detok.push(model, id);
            }
            Some(Event::Finished { reason, prompt_tokens, completion_tokens }) => {
                tracker.finish = Some(finish_str(&reason));
                if let FinishReason::Error(e) = reason {
                    return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", format!("generation failed: {e}"), None, None));
                }
                let text = model.decode(&ids).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e, None, None))?;
                let fr = finish_str(&reason);
                let choice = match ctx.kind {
                    Kind::Completion => json!({
                        "index": 0, "text": text, "finish_reason": fr,
                        "logprobs": ctx.logprobs.map(|_| completion_logprobs(&lps, &offsets)),
                    }),
                    Kind::Chat => json!({
                        "index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": fr,
                        "logprobs": ctx.logprobs.map(|_| json!({"content": lps})),
                    }),
                };
                let object = if ctx.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
                return Ok(Json(json!({
                    "id": ctx.id, "object": object, "created": ctx.created, "model": ctx.model_name,
                    "choices": [choice], "usage": usage(prompt_tokens, completion_tokens), "system_fingerprint": null,
                }))
                .into_response());
            }
            None => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the engine dropped the request", None, None));
            }
        }
    }
}

struct StreamState {
    ctx: Ctx,
    model: Arc<dyn crate::ServedModel>,
    events: Receiver<Event>,
    tracker: Tracker,
    detok: Detok,
    started: bool,
    done: bool,
    queued: Vec<String>,
}

impl StreamState {
    fn chunk(&self, text: String, lp: Option<Value>, finish: Option<&str>) -> String {
        let c = &self.ctx;
        let (object, choice) = match c.kind {
            Kind::Completion => ("text_completion", json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish})),
            Kind::Chat => {
                let delta = if finish.is_some() && text.is_empty() { json!({}) } else { json!({"content": text}) };
                ("chat.completion.chunk", json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}))
            }
        };
        json!({"id": c.id, "object": object, "created": c.created, "model": c.model_name, "choices": [choice], "system_fingerprint": null}).to_string()
    }

    /// The next SSE data lines (one or more), or `None` when the stream is over.
    async fn next(&mut self) -> Option<Vec<String>> {
        if !self.queued.is_empty() {
            return Some(std::mem::take(&mut self.queued));
        }
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        if !self.started && self.ctx.kind == Kind::Chat {
            let c = &self.ctx;
            out.push(
                json!({"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model_name,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}], "system_fingerprint": null})
                .to_string(),
            );
        }
        self.started = true;
        match self.events.recv().await {
            Some(Event::Token { id, logprob, top_logprobs }) => {
                self.tracker.token();
                let offset = self.detok.sent;
                let lp = self.ctx.logprobs.map(|_| logprob_entry(self.ctx.kind, &*self.model, id, logprob.unwrap_or(f32::NAN), &top_logprobs));
                let text = self.detok.push(&*self.model, id);
                let lp = lp.map(|e| match self.ctx.kind {
                    Kind::Chat => json!({"content": [e]}),
                    Kind::Completion => completion_logprobs(&[e], &[offset]),
                });
                out.push(self.chunk(text, lp, None));
            }
            Some(Event::Finished { reason, prompt_tokens, completion_tokens }) => {
                self.done = true;
                self.tracker.finish = Some(finish_str(&reason));
                if let FinishReason::Error(e) = &reason {
                    out.push(json!({"error": {"message": format!("generation failed: {e}"), "type": "server_error", "param": null, "code": null}}).to_string());
                } else {
                    let rest = self.detok.rest(&*self.model);
                    out.push(self.chunk(rest, None, Some(finish_str(&reason))));
                    if self.ctx.include_usage {
                        let c = &self.ctx;
                        let object = if c.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
                        out.push(json!({"id": c.id, "object": object, "created": c.created, "model": c.model_name, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}).to_string());
                    }
                }
                out.push("[DONE]".to_string());
            }
            None => {
                self.done = true;
                out.push(json!({"error": {"message": "the engine stopped", "type": "server_error", "param": null, "code": null}}).to_string());
                out.push("[DONE]".to_string());
            }
        }
        Some(out)
    }
}

fn sse_stream(ctx: Ctx, model: Arc<dyn crate::ServedModel>, events: Receiver<Event>, tracker: Tracker) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let st = StreamState { ctx, model, events, tracker, detok: Detok { ids: Vec::new(), sent: 0 }, started: false, done: false, queued: Vec::new() };
    stream::unfold(st, |mut st| async move {
        let lines = st.next().await?;
        Some((stream::iter(lines.into_iter().map(|l| Ok(SseEvent::default().data(l)))), st))
    })
    .flatten()
}
