//! Random requests at `dspark serve` (demo pair, CPU): proptest builds JSON objects from the
//! fields chat and completions read (each with a plausible value or a random one of any JSON
//! type) plus unknown keys, random JSON that is not an object, and random bytes, and POSTs them
//! to `/v1/chat/completions` and `/v1/completions`. Every answer must be 2xx or 4xx, never
//! 5xx; every 4xx must be OpenAI's error shape `{"error": {"message", "type", "param",
//! "code"}}`; a 2xx stream must end with `[DONE]`; and the server must still be running and
//! serving afterwards. Generation is kept short: a `max_tokens` / `max_completion_tokens` that
//! would run long is cut to 8, one is added when the body has neither, and `n` stays small.

mod common;

use common::{is_error_shape, json_of, Server};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use std::time::Instant;

/// Any JSON value: scalars of every type with the edges (huge, negative, fractional numbers,
/// odd strings), nested up to three levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|x| json!(x)),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(2), Just(4), Just(i64::MIN), Just(i64::MAX)]
            .prop_map(|x| json!(x)),
        Just(json!(u64::MAX)),
        (-1e6f64..1e6).prop_map(|x| json!(x)),
        prop_oneof![Just(0.5f64), Just(-0.0), Just(1e300), Just(-1e-300), Just(2.5)].prop_map(|x| json!(x)),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![Just(""), Just("\u{0}"), Just("user"), Just("text"), Just("<|im_end|>"), Just("\u{1F600}")]
            .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn small_int() -> impl Strategy<Value = Value> {
    (-2i64..10).prop_map(|x| json!(x))
}

fn unit_float() -> impl Strategy<Value = Value> {
    (-0.5f64..2.5).prop_map(|x| json!(x))
}

fn text() -> impl Strategy<Value = Value> {
    prop_oneof!["[a-z ]{0,16}".prop_map(Value::String), "\\PC{0,8}".prop_map(Value::String)]
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just(json!("user")),
        Just(json!("system")),
        Just(json!("assistant")),
        Just(json!("developer")),
        Just(json!("tool")),
        any_json()
    ];
    let part = prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        text().prop_map(|t| json!({"type": "image_url", "image_url": {"url": t}})),
        any_json(),
    ];
    let content = prop_oneof![text(), prop::collection::vec(part, 0..3).prop_map(Value::Array), any_json()];
    (role, prop::option::of(content), any::<bool>()).prop_map(|(role, content, full)| {
        let mut m = json!({"role": role});
        if let Some(c) = content {
            m["content"] = c;
        }
        if !full {
            m.as_object_mut().unwrap().remove("role");
        }
        m
    })
}

/// The known fields, each with plausible values and random ones.
fn field(name: &'static str) -> BoxedStrategy<Value> {
    let plausible: BoxedStrategy<Value> = match name {
        "messages" => prop::collection::vec(message(), 0..3).prop_map(Value::Array).boxed(),
        "prompt" => prop_oneof![
            text(),
            prop::collection::vec(0u32..2000, 0..6).prop_map(|v| json!(v)),
            prop::collection::vec(any::<u32>(), 1..3).prop_map(|v| json!(v)),
            prop::collection::vec(text(), 0..3).prop_map(Value::Array),
            prop::collection::vec(prop::collection::vec(0u32..2000, 0..4), 0..3).prop_map(|v| json!(v)),
        ]
        .boxed(),
        "max_tokens" | "max_completion_tokens" | "n" | "top_k" | "top_logprobs" | "seed" => small_int().boxed(),
        "temperature" | "top_p" | "min_p" | "frequency_penalty" | "presence_penalty" => unit_float().boxed(),
        "stop" => prop_oneof![text(), prop::collection::vec(text(), 0..6).prop_map(Value::Array)].boxed(),
        "stream" | "echo" => any::<bool>().prop_map(Value::Bool).boxed(),
        "logprobs" => prop_oneof![any::<bool>().prop_map(Value::Bool), small_int()].boxed(),
        "stream_options" => prop_oneof![
            any::<bool>().prop_map(|b| json!({"include_usage": b})),
            any_json().prop_map(|v| json!({"include_usage": v})),
        ]
        .boxed(),
        "chat_template_kwargs" => any::<bool>().prop_map(|b| json!({"enable_thinking": b})).boxed(),
        "model" => prop_oneof![Just(json!("dspark-demo-coder")), text()].boxed(),
        _ => any_json().boxed(),
    };
    prop_oneof![3 => plausible, 1 => any_json()].boxed()
}

const FIELDS: [&str; 22] = [
    "messages",
    "prompt",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "echo",
    "chat_template_kwargs",
    "frequency_penalty",
    "presence_penalty",
    "user",
    "response_format",
];

/// Values a server must accept for each field (within the demo model's limits).
fn valid(name: &'static str, chat: bool) -> BoxedStrategy<Value> {
    match name {
        "max_tokens" | "max_completion_tokens" => (1u64..=8).prop_map(|x| json!(x)).boxed(),
        "temperature" => prop_oneof![Just(json!(0)), (0.0f64..1.5).prop_map(|x| json!(x))].boxed(),
        "top_p" => (0.05f64..=1.0).prop_map(|x| json!(x)).boxed(),
        "top_k" => (-1i64..50).prop_map(|x| json!(x)).boxed(),
        "min_p" => (0.0f64..0.5).prop_map(|x| json!(x)).boxed(),
        "seed" => any::<u32>().prop_map(|x| json!(x)).boxed(),
        "stop" => prop_oneof![text(), prop::collection::vec(text(), 0..4).prop_map(Value::Array)].boxed(),
        "n" => (1u64..=2).prop_map(|x| json!(x)).boxed(),
        "logprobs" if chat => any::<bool>().prop_map(Value::Bool).boxed(),
        "logprobs" => (0u64..=3).prop_map(|x| json!(x)).boxed(),
        "top_logprobs" => (0u64..=5).prop_map(|x| json!(x)).boxed(),
        "echo" => Just(json!(false)).boxed(),
        "model" => Just(json!("dspark-demo-coder")).boxed(),
        "frequency_penalty" | "presence_penalty" => Just(json!(0)).boxed(),
        _ => field(name),
    }
}

/// The field a request cannot do without, valid: one user message, or a prompt.
fn required(chat: bool) -> BoxedStrategy<(&'static str, Value)> {
    if chat {
        let content = prop_oneof![
            "[a-z ]{1,16}".prop_map(Value::String),
            "\\PC{1,8}".prop_map(Value::String),
            "[a-z ]{1,8}".prop_map(|t| json!([{"type": "text", "text": t}])),
        ];
        (prop::option::of("[a-z ]{0,12}"), content)
            .prop_map(|(system, content)| {
                let mut m = Vec::new();
                if let Some(s) = system {
                    m.push(json!({"role": "system", "content": s}));
                }
                m.push(json!({"role": "user", "content": content}));
                ("messages", Value::Array(m))
            })
            .boxed()
    } else {
        prop_oneof![
            "[a-z ():]{1,16}".prop_map(|t| ("prompt", json!(t))),
            prop::collection::vec(0u32..1000, 1..6).prop_map(|v| ("prompt", json!(v))),
        ]
        .boxed()
    }
}

/// A request body for chat (`chat`) or completions: a valid request with some fields
/// changed or added (each known field valid, plausible or random; unknown keys), an object of
/// random known and unknown fields, random JSON that is not such an object, or random bytes.
fn body(chat: bool) -> impl Strategy<Value = Vec<u8>> {
    let unknown = || prop::collection::vec(("[a-z_]{1,10}", any_json()), 0..3);
    let near_fields =
        FIELDS.map(|f| prop::option::weighted(0.2, prop_oneof![4 => valid(f, chat), 1 => field(f)]).boxed()).to_vec();
    let near = (required(chat), near_fields, unknown()).prop_map(|((key, req), known, unknown)| {
        let mut m = Map::new();
        for (name, v) in FIELDS.iter().zip(known) {
            if let Some(v) = v {
                m.insert(name.to_string(), v);
            }
        }
        m.insert(key.to_string(), req);
        object(m, unknown)
    });
    let fields = FIELDS.map(|f| prop::option::weighted(0.4, field(f)).boxed()).to_vec();
    let random = (fields, unknown()).prop_map(|(known, unknown)| {
        let mut m = Map::new();
        for (name, v) in FIELDS.iter().zip(known) {
            if let Some(v) = v {
                m.insert(name.to_string(), v);
            }
        }
        object(m, unknown)
    });
    prop_oneof![
        5 => near,
        3 => random,
        1 => any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
    ]
}

fn object(mut m: Map<String, Value>, unknown: Vec<(String, Value)>) -> Vec<u8> {
    for (k, v) in unknown {
        m.entry(k).or_insert(v);
    }
    bound(&mut m);
    serde_json::to_vec(&Value::Object(m)).unwrap()
}

/// Keeps a valid request short: `max_tokens` / `max_completion_tokens` at most 8 where they
/// are numbers that could be valid, one of them present, `n` at most 3, `top_logprobs` ≤ 20.
fn bound(m: &mut Map<String, Value>) {
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = m.get_mut(key) {
            if v.as_f64().is_some_and(|x| x > 8.0) {
                *v = json!(8);
            }
        }
    }
    if !m.contains_key("max_tokens") && !m.contains_key("max_completion_tokens") {
        m.insert("max_tokens".into(), json!(4));
    }
    if let Some(v) = m.get_mut("n") {
        if v.as_f64().is_some_and(|x| x > 3.0) {
            *v = json!(3);
        }
    }
    if let Some(v) = m.get_mut("top_logprobs") {
        if v.as_f64().is_some_and(|x| x > 20.0) {
            *v = json!(20);
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

#[test]
fn random_requests_are_2xx_or_4xx_in_the_error_shape() {
    let t0 = Instant::now();
    let mut s = Server::start(&[]);
    let base = s.base.clone();
    let client = common::client();
    let config = Config { cases: cases(), failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let counts = std::cell::RefCell::new([0usize; 3]); // 2xx, 4xx, streamed 2xx
    let result = runner.run(&any::<bool>().prop_flat_map(|chat| (Just(chat), body(chat))), |(chat, body)| {
        let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
        let r = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .map_err(|e| TestCaseError::fail(format!("{path}: no answer ({e})")))?;
        let status = r.status().as_u16();
        let shown = String::from_utf8_lossy(&body).into_owned();
        let stream = r.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let text = r.text().map_err(|e| TestCaseError::fail(format!("{path} {shown}: reading the body: {e}")))?;
        match status {
            200..=299 if stream => {
                prop_assert!(text.ends_with("data: [DONE]\n\n"), "{path} {shown}: a stream without [DONE]: {text}");
                // Each event is a JSON object without an `error` member. (A substring test for
                // `"error"` failed on a stream whose model wrote the token `error`.)
                for data in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
                    let v: Value = serde_json::from_str(data)
                        .map_err(|e| TestCaseError::fail(format!("{path} {shown}: an event not JSON ({e}): {text}")))?;
                    prop_assert!(v.get("error").is_none(), "{path} {shown}: an error inside the stream: {text}");
                }
                counts.borrow_mut()[2] += 1;
            }
            200..=299 => {
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{path} {shown}: 2xx not JSON ({e}): {text}")))?;
                prop_assert!(v["choices"].is_array(), "{path} {shown}: 2xx without choices: {text}");
                counts.borrow_mut()[0] += 1;
            }
            400..=499 => {
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{path} {shown}: {status} not JSON ({e}): {text}")))?;
                prop_assert!(is_error_shape(&v), "{path} {shown}: {status} not in the error shape: {text}");
                counts.borrow_mut()[1] += 1;
            }
            _ => prop_assert!(false, "{path} {shown}: status {status}: {text}"),
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(s.alive(), "the server exited during the fuzzing");
    let r = s.post("/v1/completions", &json!({"prompt": "def f(x):\n", "max_tokens": 3}));
    assert_eq!(r.status(), 200, "the server no longer serves after the fuzzing");
    assert_eq!(json_of(r)["usage"]["completion_tokens"], 3);
    let [ok, bad, streamed] = *counts.borrow();
    eprintln!(
        "fuzz: {} cases: {ok} 2xx JSON, {streamed} 2xx streams, {bad} 4xx; {:.2} s",
        cases(),
        t0.elapsed().as_secs_f64()
    );
}
