//! The OpenAI request shapes, each checked into an engine request: the body parsed, the
//! sampling and logprob fields checked by name, the chat rendered through the model's template.

use super::response::{respond, Kind};
use super::{not_ready, random_seed, ApiError, AppState, St, BODY_LIMIT};
use crate::engine::Request as EngineRequest;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dspark_model::checkpoint::chat_template::{ChatMessage, ChatTemplate};
use dspark_spec::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

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
pub(super) struct Prepared {
    pub(super) req: EngineRequest,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
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

pub(super) async fn chat(State(s): St, body: Result<Bytes, BytesRejection>) -> Response {
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

pub(super) async fn completions(State(s): St, body: Result<Bytes, BytesRejection>) -> Response {
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
