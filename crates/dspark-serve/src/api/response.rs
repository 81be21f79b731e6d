//! The answers: one JSON body, or server-sent events as the engine emits tokens, in chat or
//! completion shape, with usage and the engine's own stats.

use super::request::Prepared;
use super::{not_ready, random_seed, ApiError, AppState};
use crate::engine::{Done, Event, Logprob, SubmitError};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dspark_model::checkpoint::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
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

pub(super) async fn respond(s: &AppState, p: Prepared, kind: Kind, model: String) -> Result<Response, ApiError> {
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
