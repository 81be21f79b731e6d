//! `dspark serve`: an OpenAI-compatible HTTP server over the decoding loops.
//!
//! ```text
//! HTTP (axum, tokio)  ──try_send──►  bounded FIFO (std sync_channel, --max-queue)
//!   handler  ◄── tokio mpsc of Events ──  engine thread (owns the models; one job at a time,
//!                                          or up to --max-batch in shared rounds: batched.rs)
//! ```
//!
//! The listener starts first and `/health` answers 503 while the engine thread loads the
//! models (the [`Loader`] runs there, so the models never cross threads). Each request is
//! parsed, checked (model, sampling, context) and tokenized on the async side, then queued; a
//! full queue answers 429 with `Retry-After: 1`. The engine runs the request through the same
//! loops `dspark generate` uses, detokenizes incrementally (each token decodes the ids since the
//! last complete character; an incomplete one is held back), holds back text while a stop
//! string may be starting, and sends text deltas down the request's channel.
//!
//! Stopping a generation early (a stop string matched, or the client went away: the channel's
//! receiver dropped, `is_closed()`) is the token callback returning `ControlFlow::Break`: the
//! loop ends after that token (`StopReason::Stopped`); every loop starts from empty caches
//! (`truncate(0)`, `reset`), so the next request is unaffected.
//!
//! `n` choices run one after another on the engine thread, choice `i` with seed `seed + i`
//! (each its own Philox stream, as vLLM gives each choice its own generator). Logprobs
//! (`logprobs`/`top_logprobs` on chat, integer `logprobs` on completions) are the target's raw
//! logits row's log_softmax (`dspark_spec::logprobs`); asking for them puts the loops on the
//! host-logits path.

mod api;
mod batched;
mod engine;
mod metrics;

pub use engine::{Engine, Loader, Models};

use std::sync::Arc;

/// Server settings from the command line.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The id `/v1/models` lists and responses carry.
    pub model_name: String,
    /// When set, every request needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Requests waiting for the engine beyond the one it runs; more answer 429.
    pub max_queue: usize,
    /// Another `model` than `model_name` answers 404 (else any name is served).
    pub strict_model: bool,
    /// Positions of context a request's prompt + max tokens must fit in (capped by the model's).
    pub max_context: usize,
}

/// Binds `host:port`, prints `dspark serve: listening on http://ADDR` on stderr, and serves
/// until the process ends. The models load on the engine thread meanwhile.
pub fn run(host: &str, port: u16, opts: ServeOptions, load: Loader) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host, port)).await?;
        eprintln!("dspark serve: listening on http://{}", listener.local_addr()?);
        serve(listener, opts, load).await
    })
}

/// Serves on a bound listener (tests bind 127.0.0.1:0).
pub async fn serve(listener: tokio::net::TcpListener, opts: ServeOptions, load: Loader) -> anyhow::Result<()> {
    let metrics = Arc::new(metrics::Metrics::new()?);
    let handle = engine::start(opts.max_queue, opts.max_context, load, metrics.clone())?;
    let app = api::router(Arc::new(api::AppState { opts, engine: handle, metrics }));
    axum::serve(listener, app).await?;
    Ok(())
}
