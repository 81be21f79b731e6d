//! The HTTP side: routes, OpenAI request/response shapes, errors, SSE.

use crate::engine::{Done, Event, Handle, Logprob, Request as EngineRequest, SubmitError};
use crate::metrics::Metrics;
use crate::ServeOptions;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dspark_model::checkpoint::chat_template::{ChatMessage, ChatTemplate};
use dspark_model::checkpoint::tokenizer::Tokenizer;
use dspark_spec::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

/// Bodies larger than this answer 413.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

pub struct AppState {
    pub opts: ServeOptions,
    pub engine: Handle,
    pub metrics: Arc<Metrics>,
}

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    let mut r = Router::new();
    for prefix in ["/v1", ""] {
        r = r
            .route(&format!("{prefix}/chat/completions"), post(chat))
            .route(&format!("{prefix}/completions"), post(completions))
            .route(&format!("{prefix}/models"), get(models))
            .route(&format!("{prefix}/models/{{id}}"), get(model));
    }
    r.route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint", "not_found_error") })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>, kind: &'static str) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None }
    }
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message, "invalid_request_error")
    }
    fn param(mut self, p: &'static str) -> ApiError {
        self.param = Some(p);
        self
    }
    fn body(&self) -> Value {
        json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16().to_string(),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// `--api-key`: every route but `/health` needs `Authorization: Bearer <key>`. Also counts
/// every answer in `dspark_requests_total`.
async fn auth(State(s): St, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = path.strip_prefix("/v1").unwrap_or(&path).split('/').nth(1).unwrap_or("").to_string();
    let resp = match &s.opts.api_key {
        Some(key) if path != "/health" => {
            let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            if given.and_then(|v| v.strip_prefix("Bearer ")) == Some(key.as_str()) {
                next.run(req).await
            } else {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing or wrong API key (Authorization: Bearer …)",
                    "authentication_error",
                )
                .into_response()
            }
        }
        _ => next.run(req).await,
    };
    let endpoint = match endpoint.as_str() {
        "chat" | "completions" | "models" | "health" | "metrics" => endpoint,
        _ => "other".to_string(),
    };
    s.metrics.requests.with_label_values(&[endpoint.as_str(), resp.status().as_str()]).inc();
    resp
}

async fn health(State(s): St) -> Response {
    if s.engine.ready.get().is_some() {
        axum::Json(json!({"status": "ok"})).into_response()
    } else if let Some(e) = s.engine.failed.get() {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "error", "message": e}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "loading"}))).into_response()
    }
}

async fn metrics(State(s): St) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

fn model_object(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": 0, "owned_by": "dspark"})
}

async fn models(State(s): St) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&s.opts.model_name)]})).into_response()
}

async fn model(State(s): St, Path(id): Path<String>) -> Response {
    if id == s.opts.model_name {
        axum::Json(model_object(&id)).into_response()
    } else {
        ApiError::new(StatusCode::NOT_FOUND, format!("the model `{id}` does not exist"), "invalid_request_error")
            .param("model")
            .into_response()
    }
}

// ---- requests ----

#[derive(Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The fields chat and completions share; unknown fields are ignored.
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<StopField>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<i64>,
}

/// Most choices one request may ask for (`n`).
pub const MAX_N: i64 = 16;
/// Most alternatives per token: chat `top_logprobs`, completions `logprobs` (OpenAI's limits).
pub const MAX_TOP_LOGPROBS: i64 = 20;
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatKwargs {
    enable_thinking: Option<bool>,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<Message>,
    chat_template_kwargs: Option<ChatKwargs>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: PromptField,
    logprobs: Option<i64>,
    echo: Option<bool>,
    #[serde(flatten)]
    common: Common,
}

/// The body as JSON of type `T`; every failure (too large, not JSON, wrong types) is an
/// OpenAI-shaped error.
fn parse<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, format!("request body larger than {BODY_LIMIT} bytes"), "invalid_request_error")
        } else {
            ApiError::bad(format!("could not read the request body: {e}"))
        }
    })?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("malformed JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad(format!("invalid request: {e}")))
}

/// A request checked and ready for the engine.
struct Prepared {
    req: EngineRequest,
    stream: bool,
    include_usage: bool,
}

/// Chat's `logprobs` / `top_logprobs`: `Some(k)` when logprobs are asked, `k` alternatives.
/// As OpenAI, `top_logprobs` needs `logprobs: true` (vLLM lets 0 through without it, and so do
/// we: it asks for nothing).
fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    if let Some(k) = top {
        if !(0..=MAX_TOP_LOGPROBS).contains(&k) {
            return Err(ApiError::bad(format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}"))
                .param("top_logprobs"));
        }
        if k > 0 && logprobs != Some(true) {
            return Err(ApiError::bad("top_logprobs needs logprobs: true").param("top_logprobs"));
        }
    }
    Ok((logprobs == Some(true)).then(|| top.unwrap_or(0) as usize))
}

/// Completions' integer `logprobs` (0 ..= 5 alternatives).
fn completion_logprobs(logprobs: Option<i64>) -> Result<Option<usize>, ApiError> {
    match logprobs {
        None => Ok(None),
        Some(k) if (0..=MAX_COMPLETION_LOGPROBS).contains(&k) => Ok(Some(k as usize)),
        Some(k) => {
            Err(ApiError::bad(format!("logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {k}")).param("logprobs"))
        }
    }
}

fn prepare(s: &AppState, c: &Common, prompt: Vec<u32>, logprobs: Option<usize>) -> Result<Prepared, ApiError> {
    let ready = s.engine.ready.get().ok_or_else(not_ready)?;
    if s.opts.strict_model {
        if let Some(m) = &c.model {
            if *m != s.opts.model_name {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("the model `{m}` does not exist; this server serves `{}`", s.opts.model_name),
                    "invalid_request_error",
                )
                .param("model"));
            }
        }
    }
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad(format!("n must be in [1, {MAX_N}], got {n}")).param("n"));
    }
    let stop = match &c.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if stop.len() > 4 {
        return Err(ApiError::bad(format!("stop: at most 4 sequences, got {}", stop.len())).param("stop"));
    }
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let d = ready.defaults;
    let top_k = match c.top_k {
        None => d.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k < 0 => {
            return Err(ApiError::bad(format!("top_k must be ≥ 0 (or -1: off), got {k}")).param("top_k"))
        }
        Some(k) => usize::try_from(k).map_err(|_| ApiError::bad("top_k is too large").param("top_k"))?,
    };
    let params = SamplingParams {
        temperature: c.temperature.unwrap_or(d.temperature),
        top_k,
        top_p: c.top_p.unwrap_or(d.top_p),
        min_p: c.min_p.unwrap_or(d.min_p),
        seed: c.seed.map(|x| x as u64).unwrap_or_else(random_seed),
    };
    params.validate().map_err(|e| {
        let p = ["temperature", "top_p", "min_p", "top_k"].into_iter().find(|p| e.starts_with(p));
        let err = ApiError::bad(e);
        match p {
            Some(p) => err.param(p),
            None => err,
        }
    })?;
    if params.temperature > 2.0 {
        return Err(
            ApiError::bad(format!("temperature must be in [0, 2], got {}", params.temperature)).param("temperature")
        );
    }
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty").param("prompt"));
    }
    let vocab = ready.tokenizer.vocab_size();
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(format!("token id {bad} is outside the vocabulary ({vocab} ids)")).param("prompt"));
    }
    let room = ready.context.saturating_sub(prompt.len());
    let asked = c.max_completion_tokens.or(c.max_tokens);
    let max_tokens = match asked {
        Some(0) => return Err(ApiError::bad("max_tokens must be ≥ 1").param("max_tokens")),
        Some(m) if m as u128 > room as u128 => {
            return Err(ApiError::bad(format!(
                "this model's context is {} tokens; the prompt has {} tokens and max_tokens is {m} ({} in all)",
                ready.context,
                prompt.len(),
                prompt.len() as u128 + m as u128
            ))
            .param("max_tokens"))
        }
        Some(m) => m as usize,
        None if room == 0 => {
            return Err(ApiError::bad(format!(
                "the prompt has {} tokens and leaves no room in this model's context of {} tokens",
                prompt.len(),
                ready.context
            ))
            .param("messages"))
        }
        None => room,
    };
    Ok(Prepared {
        req: EngineRequest { prompt, max_tokens, params, stop, n: n as usize, logprobs },
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
    })
}

fn not_ready() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is still loading", "server_error")
}

fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut z = n.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & 0xFFFF_FFFF
}

/// The conversation through the model's chat template (its folder's, or Qwen3's built-in
/// format), with the assistant's turn opened; non-thinking unless
/// `chat_template_kwargs.enable_thinking` is true.
fn render_chat(template: &ChatTemplate, messages: &[Message], enable_thinking: bool) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad("messages must not be empty").param("messages"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "developer" | "user" | "assistant" => {}
            r => {
                return Err(ApiError::bad(format!(
                    "messages[{i}].role: unknown role {r:?} (expected system, user or assistant)"
                ))
                .param("messages"))
            }
        }
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(x)) => t.push_str(x),
                        (k, _) => {
                            return Err(ApiError::bad(format!(
                                "messages[{i}].content: only text parts are supported, got type {k:?}"
                            ))
                            .param("messages"))
                        }
                    }
                }
                t
            }
        };
        let role = if m.role == "developer" { "system" } else { m.role.as_str() };
        out.push(ChatMessage::new(role, text));
    }
    template
        .render(&out, true, enable_thinking)
        .map_err(|e| ApiError::bad(format!("could not render the chat template: {e}")).param("messages"))
}

fn encode(s: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    let ready = s.engine.ready.get().ok_or_else(not_ready)?;
    ready.tokenizer.encode(text).map_err(|e| ApiError::bad(format!("could not tokenize the prompt: {e}")))
}

async fn chat(State(s): St, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: ChatRequest = parse(body)?;
        let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
        let ready = s.engine.ready.get().ok_or_else(not_ready)?;
        let thinking = req.chat_template_kwargs.as_ref().and_then(|k| k.enable_thinking).unwrap_or(false);
        let text = render_chat(&ready.chat_template, &req.messages, thinking)?;
        let prompt = encode(&s, &text)?;
        let p = prepare(&s, &req.common, prompt, logprobs)?;
        let model = req.common.model.clone().unwrap_or_else(|| s.opts.model_name.clone());
        respond(&s, p, Kind::Chat, model).await
    };
    r.await.unwrap_or_else(|e| e.into_response())
}

async fn completions(State(s): St, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: CompletionRequest = parse(body)?;
        let logprobs = completion_logprobs(req.logprobs)?;
        if req.echo == Some(true) {
            return Err(ApiError::bad("echo is not supported").param("echo"));
        }
        let prompt = match req.prompt {
            PromptField::Text(t) => encode(&s, &t)?,
            PromptField::Ids(ids) => ids,
            PromptField::Texts(v) if v.len() == 1 => encode(&s, &v[0])?,
            PromptField::IdLists(v) if v.len() == 1 => v.into_iter().next().unwrap_or_default(),
            _ => return Err(ApiError::bad("prompt: give one prompt (a string or token ids)").param("prompt")),
        };
        let p = prepare(&s, &req.common, prompt, logprobs)?;
        let model = req.common.model.clone().unwrap_or_else(|| s.opts.model_name.clone());
        respond(&s, p, Kind::Completion, model).await
    };
    r.await.unwrap_or_else(|e| e.into_response())
}

// ---- responses ----

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    /// Set when logprobs were asked (the token strings are the tokenizer's decode of one id).
    tokenizer: Option<Arc<Tokenizer>>,
    /// Ids whose token string is empty, as their text is (the eos ids).
    silent: Vec<u32>,
}

/// The logprobs of one choice's tokens so far, in both OpenAI shapes' terms.
#[derive(Default)]
struct ChoiceLogprobs {
    /// Characters of the token strings so far (completions' `text_offset`, as vLLM counts it).
    offset: usize,
}

/// OpenAI's numbers must be finite JSON; vLLM clamps to −9999 as well.
fn finite(x: f64) -> f64 {
    if x.is_nan() {
        -9999.0
    } else {
        x.max(-9999.0)
    }
}

impl Meta {
    /// A token's string: the tokenizer's decode of the one id (as vLLM: a byte-level piece that
    /// is not UTF-8 alone is U+FFFD), and none for an eos id, which adds no text either — so the
    /// token strings concatenate to the text wherever every token completes its characters.
    fn token_text(&self, tok: &Tokenizer, id: u32) -> String {
        if self.silent.contains(&id) {
            String::new()
        } else {
            tok.decode(&[id]).unwrap_or_default()
        }
    }
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// The `logprobs` field of a choice or chunk covering `lps` (null when not asked).
    /// Chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`;
    /// completions: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`,
    /// each dict the `k` most likely and the chosen token (as OpenAI and vLLM return it).
    fn logprobs(&self, lps: &[Logprob], state: &mut ChoiceLogprobs) -> Value {
        let Some(tok) = &self.tokenizer else { return Value::Null };
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f64| {
                    let t = self.token_text(tok, id);
                    json!({"token": t, "logprob": finite(lp), "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|l| {
                        let mut e = entry(l.id, l.lp.logprob);
                        e["top_logprobs"] = l.lp.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Completion => {
                let (mut tokens, mut token_logprobs, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
                for l in lps {
                    let t = self.token_text(tok, l.id);
                    offsets.push(state.offset);
                    state.offset += t.chars().count();
                    let mut d = serde_json::Map::new();
                    for &(id, lp) in &l.lp.top {
                        d.entry(self.token_text(tok, id)).or_insert(json!(finite(lp)));
                    }
                    d.entry(t.clone()).or_insert(json!(finite(l.lp.logprob)));
                    tokens.push(json!(t));
                    token_logprobs.push(json!(finite(l.lp.logprob)));
                    top.push(Value::Object(d));
                }
                json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
            }
        }
    }

    /// A streamed chunk of choice `index` carrying `text` (and `finish` on its last one).
    fn chunk(&self, index: usize, text: Option<&str>, logprobs: Value, finish: Option<&str>, role: bool) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                    delta["content"] = json!("");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }
}

/// Usage over all choices: the prompt once, every choice's tokens.
fn usage(done: &[Done]) -> Value {
    let prompt = done.first().map_or(0, |d| d.prompt_tokens);
    let completion: usize = done.iter().map(|d| d.tokens.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// The `dspark` extension field: the generated ids and the speculative statistics.
fn extension(d: &Done) -> Value {
    let mut v = json!({"tokens": d.tokens});
    if let Some((rounds, mean)) = d.spec {
        v["rounds"] = json!(rounds);
        v["mean_accepted_length"] = json!(mean);
    }
    v
}

fn engine_error(message: String) -> ApiError {
    ApiError::bad(message)
}

async fn respond(s: &AppState, p: Prepared, kind: Kind, model: String) -> Result<Response, ApiError> {
    let n = p.req.n;
    let ready = s.engine.ready.get().ok_or_else(not_ready)?;
    let tokenizer = p.req.logprobs.map(|_| Arc::clone(&ready.tokenizer));
    let silent = ready.eos_token_ids.clone();
    let rx = s.engine.submit(p.req).map_err(|e| match e {
        SubmitError::Full => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("the request queue is full ({} waiting); retry later", s.opts.max_queue),
            "rate_limit_error",
        ),
        SubmitError::Gone => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped", "server_error"),
    })?;
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let meta = Meta { id: format!("{prefix}-{:016x}", random_seed()), created, model, kind, tokenizer, silent };
    if p.stream {
        Ok(stream_response(meta, rx, n, p.include_usage))
    } else {
        collect_response(meta, rx, n).await
    }
}

/// The non-streamed answer: every choice's events gathered, then one body. The top-level
/// `dspark` field is choice 0's, with every choice's under `dspark.choices` when n > 1.
async fn collect_response(meta: Meta, mut rx: UnboundedReceiver<Event>, n: usize) -> Result<Response, ApiError> {
    let mut text = vec![String::new(); n];
    let mut lps: Vec<Vec<Logprob>> = vec![Vec::new(); n];
    let mut done: Vec<Done> = Vec::with_capacity(n);
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text { index, text: t, logprobs } => {
                text[index].push_str(&t);
                lps[index].extend(logprobs);
            }
            Event::Error(e) => return Err(engine_error(e)),
            Event::Done { done: d, .. } => {
                done.push(d);
                if done.len() < n {
                    continue;
                }
                let choices: Vec<Value> = done
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let lp = meta.logprobs(&lps[i], &mut ChoiceLogprobs::default());
                        match meta.kind {
                            Kind::Chat => json!({"index": i, "message": {"role": "assistant", "content": text[i]},
                                "logprobs": lp, "finish_reason": d.finish_reason}),
                            Kind::Completion => {
                                json!({"index": i, "text": text[i], "logprobs": lp, "finish_reason": d.finish_reason})
                            }
                        }
                    })
                    .collect();
                let mut v = meta.envelope(false, json!(choices));
                v["usage"] = usage(&done);
                v["dspark"] = extension(&done[0]);
                if n > 1 {
                    v["dspark"]["choices"] = done.iter().map(extension).collect();
                }
                return Ok(axum::Json(v).into_response());
            }
        }
    }
    Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine dropped the request", "server_error"))
}

fn frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// SSE, per choice in order: its role chunk (chat), text chunks (each with the logprobs of its
/// tokens when asked), its finish chunk (with its `dspark` field); then the usage chunk when
/// asked (over all choices), `[DONE]` once. Dropping the body (client gone) drops `rx`, which
/// the engine sees as `is_closed()`.
fn stream_response(meta: Meta, rx: UnboundedReceiver<Event>, n: usize, include_usage: bool) -> Response {
    struct S {
        meta: Meta,
        rx: UnboundedReceiver<Event>,
        n: usize,
        include_usage: bool,
        /// Choices whose role chunk went out.
        started: usize,
        lps: Vec<ChoiceLogprobs>,
        finished: Vec<Done>,
        done: bool,
    }
    let lps = (0..n).map(|_| ChoiceLogprobs::default()).collect();
    let st = S { meta, rx, n, include_usage, started: 0, lps, finished: Vec::new(), done: false };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = String::new();
        let ev = st.rx.recv().await;
        // Role chunks for the choices this event reaches (all of them by the end).
        let upto = match &ev {
            Some(Event::Text { index, .. }) | Some(Event::Done { index, .. }) => index + 1,
            _ => 0,
        };
        while st.meta.kind == Kind::Chat && st.started < upto {
            out.push_str(&frame(&st.meta.chunk(st.started, None, Value::Null, None, true)));
            st.started += 1;
        }
        match ev {
            Some(Event::Text { index, text, logprobs }) => {
                let lp = st.meta.logprobs(&logprobs, &mut st.lps[index]);
                out.push_str(&frame(&st.meta.chunk(index, Some(&text), lp, None, false)));
            }
            Some(Event::Done { index, done: d }) => {
                let lp =
                    if st.meta.tokenizer.is_some() { st.meta.logprobs(&[], &mut st.lps[index]) } else { Value::Null };
                let mut last = st.meta.chunk(index, None, lp, Some(d.finish_reason), false);
                last["dspark"] = extension(&d);
                out.push_str(&frame(&last));
                st.finished.push(d);
                if st.finished.len() == st.n {
                    if st.include_usage {
                        let mut u = st.meta.envelope(true, json!([]));
                        u["usage"] = usage(&st.finished);
                        out.push_str(&frame(&u));
                    }
                    out.push_str("data: [DONE]\n\n");
                    st.done = true;
                }
            }
            Some(Event::Error(e)) => {
                out.push_str(&frame(&engine_error(e).body()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
            }
            None => {
                let e =
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine dropped the request", "server_error");
                out.push_str(&frame(&e.body()));
                out.push_str("data: [DONE]\n\n");
                st.done = true;
            }
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), st))
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h: &mut HeaderMap = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
