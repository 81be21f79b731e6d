//! The HTTP side: routes, auth, errors in OpenAI's shape, health, metrics and models; the
//! request shapes and their checks are `request.rs`, the answers (JSON or SSE) `response.rs`.

mod request;
mod response;

use crate::engine::Handle;
use crate::metrics::Metrics;
use crate::ServeOptions;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use request::{chat, completions};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

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
