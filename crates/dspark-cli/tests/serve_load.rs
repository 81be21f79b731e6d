//! Load on `dspark serve` (demo pair, CPU): 32 concurrent streaming clients send 200 greedy
//! requests in all, mixed prompts, chat and completions, and max_tokens, to a server running one
//! request at a time and to one batching 8 (`--max-batch 8`). None may be lost (each stream ends
//! with `[DONE]` after a chunk with a finish_reason) and each output must equal its solo run (the
//! same request, non-streamed, with nothing else in flight, on a one-at-a-time server). Request
//! latency, time to first token, inter-token latency and throughput are printed, not asserted.
//! Beside it: streams dropped while their requests wait in the queue are skipped by the engine;
//! on the batching server, streams started together all get their first token before any ends,
//! and a sampled request (run alone between rounds) gives its seed's tokens.

mod common;

use common::{client, ids, json_of, request, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 32;
const REQUESTS: usize = 200;
/// The whole concurrent phase must finish in this time (it takes ~22 s on 2 cores).
const DEADLINE: Duration = Duration::from_secs(300);

const PROMPTS: [&str; 8] = [
    "def fibonacci(n):\n",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "# sort a list of numbers\ndef sort(xs):\n",
    "def is_prime(n):\n    if n < 2:\n",
    "for i in range(10):\n",
    "Write a sort function",
    "What does a hash map do?",
];
const MAX_TOKENS: [u64; 5] = [1, 3, 8, 17, 32];

/// (prompt index, chat, max_tokens) of request `i`: every combination of the prompts and the
/// lengths appears; the last two prompts go through chat.
fn job(i: usize) -> Job {
    let p = i % PROMPTS.len();
    let m = MAX_TOKENS[(i / PROMPTS.len() + i) % MAX_TOKENS.len()];
    (p, p >= 6, m)
}

/// A request: (prompt index, chat, max_tokens).
type Job = (usize, bool, u64);
/// A solo run's (text, tokens, finish_reason).
type Solo = (String, Vec<u64>, String);
/// Each request's index and what its stream gave.
type Results = Arc<Mutex<Vec<(usize, Result<Streamed, String>)>>>;

/// What one streamed request saw.
struct Streamed {
    text: String,
    tokens: Vec<u64>,
    finish: String,
    latency: Duration,
    first_token: Option<Duration>,
    /// Gaps between consecutive chunks that carried text.
    gaps: Vec<Duration>,
}

fn stream_one(base: &str, chat: bool, prompt: &str, max_tokens: u64) -> Result<Streamed, String> {
    let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
    let t0 = Instant::now();
    let r = client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(request(chat, prompt, max_tokens, true).to_string())
        .send()
        .map_err(|e| format!("send: {e}"))?;
    if r.status() != 200 {
        return Err(format!("status {}: {}", r.status(), r.text().unwrap_or_default()));
    }
    let mut out = Streamed {
        text: String::new(),
        tokens: Vec::new(),
        finish: String::new(),
        latency: Duration::ZERO,
        first_token: None,
        gaps: Vec::new(),
    };
    let mut last_piece: Option<Instant> = None;
    let mut done = false;
    for line in BufReader::new(r).lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let data = line.strip_prefix("data: ").ok_or_else(|| format!("not an SSE data line: {line:?}"))?;
        if data == "[DONE]" {
            done = true;
            continue;
        }
        if done {
            return Err("data after [DONE]".into());
        }
        let now = Instant::now();
        let e: serde_json::Value = serde_json::from_str(data).map_err(|e| format!("chunk {data:?}: {e}"))?;
        let Some(c) = e["choices"].as_array().and_then(|c| c.first()) else { continue };
        let piece = if chat { &c["delta"]["content"] } else { &c["text"] };
        let piece = piece.as_str().unwrap_or("");
        if !piece.is_empty() {
            out.first_token.get_or_insert(now - t0);
            if let Some(prev) = last_piece {
                out.gaps.push(now - prev);
            }
            last_piece = Some(now);
            out.text.push_str(piece);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            out.finish = f.to_string();
            out.tokens = ids(&e["dspark"]["tokens"]);
        }
    }
    if !done {
        return Err("stream ended without [DONE]".into());
    }
    if out.finish.is_empty() {
        return Err("no finish_reason".into());
    }
    out.latency = t0.elapsed();
    Ok(out)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

#[test]
fn load_32_streaming_clients_200_requests() {
    load(&[], "one at a time");
}

#[test]
fn load_32_streaming_clients_200_requests_batched() {
    load(&["--max-batch", "8"], "--max-batch 8");
}

/// The load test against a server started with `extra` flags (see the module docs).
fn load(extra: &[&str], label: &str) {
    let t0 = Instant::now();
    let plain = Server::start(&["--max-queue", "256"]);
    let batched = (!extra.is_empty()).then(|| Server::start(&[&["--max-queue", "256"], extra].concat()));

    // Solo runs: each distinct request once, non-streamed, nothing else in flight.
    let s = &plain;
    let mut solo: HashMap<Job, Solo> = HashMap::new();
    for i in 0..REQUESTS {
        let (p, chat, m) = job(i);
        if solo.contains_key(&(p, chat, m)) {
            continue;
        }
        let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
        let r = s.post(path, &request(chat, PROMPTS[p], m, false));
        assert_eq!(r.status(), 200);
        let v = json_of(r);
        let c = &v["choices"][0];
        let text = if chat { &c["message"]["content"] } else { &c["text"] };
        solo.insert(
            (p, chat, m),
            (
                text.as_str().unwrap().to_string(),
                ids(&v["dspark"]["tokens"]),
                c["finish_reason"].as_str().unwrap().into(),
            ),
        );
    }
    let solo_s = t0.elapsed().as_secs_f64();
    let s = batched.as_ref().unwrap_or(&plain);

    let next = Arc::new(AtomicUsize::new(0));
    let results: Results = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, results, base) = (next.clone(), results.clone(), s.base.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= REQUESTS || start.elapsed() > DEADLINE {
                    break;
                }
                let (p, chat, m) = job(i);
                let r = stream_one(&base, chat, PROMPTS[p], m);
                results.lock().unwrap().push((i, r));
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let wall = start.elapsed();
    assert!(wall < DEADLINE + Duration::from_secs(120), "the load ran {wall:?}, past its deadline");
    let mut results = std::mem::take(&mut *results.lock().unwrap());
    results.sort_by_key(|(i, _)| *i);
    assert_eq!(results.len(), REQUESTS, "{} of {REQUESTS} requests ran before the deadline", results.len());

    let (mut latency, mut ttft, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
    let mut tokens = 0usize;
    for (i, r) in results {
        let (p, chat, m) = job(i);
        let got = r.unwrap_or_else(|e| panic!("request {i} (prompt {p}, chat {chat}, max_tokens {m}) lost: {e}"));
        let (text, toks, finish) = &solo[&(p, chat, m)];
        assert_eq!(&got.tokens, toks, "request {i}: tokens differ from the solo run");
        assert_eq!(&got.text, text, "request {i}: text differs from the solo run");
        assert_eq!(&got.finish, finish, "request {i}: finish_reason differs from the solo run");
        tokens += got.tokens.len();
        latency.push(got.latency);
        ttft.extend(got.first_token);
        gaps.extend(got.gaps);
    }
    assert!(s.post("/v1/completions", &request(false, PROMPTS[0], 2, false)).status() == 200);
    eprintln!(
        "load ({label}): {CLIENTS} clients, {REQUESTS} streamed requests, {tokens} tokens in {:.2} s = {:.1} tok/s, {:.1} req/s; \
         request latency p50 {:.0} ms p99 {:.0} ms; first token p50 {:.0} ms p99 {:.0} ms; \
         inter-token p50 {:.1} ms p99 {:.1} ms; solo runs {solo_s:.2} s; total {:.2} s",
        wall.as_secs_f64(),
        tokens as f64 / wall.as_secs_f64(),
        REQUESTS as f64 / wall.as_secs_f64(),
        pct(&mut latency, 0.5),
        pct(&mut latency, 0.99),
        pct(&mut ttft, 0.5),
        pct(&mut ttft, 0.99),
        pct(&mut gaps, 0.5),
        pct(&mut gaps, 0.99),
        t0.elapsed().as_secs_f64()
    );
    // The metrics agree that nothing was lost.
    let m = client().get(s.url("/metrics")).send().unwrap().text().unwrap();
    assert!(m.contains("dspark_queue_depth 0"), "queue not empty after the load:\n{m}");
}

fn generated_tokens(s: &Server) -> u64 {
    metric(s, "dspark_generated_tokens_total") as u64
}

/// The value of `/metrics`' line `name`.
fn metric(s: &Server, name: &str) -> f64 {
    let m = client().get(s.url("/metrics")).send().unwrap().text().unwrap();
    let line = m.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("{name}: {m}"));
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap()
}

/// Clients that leave while their requests wait in the queue (and the one that leaves while
/// its request runs) cost the engine nothing more: the next request is served at once, and
/// the long generations they asked for never run. (`serve.rs` covers one running stream.)
#[test]
fn streams_dropped_while_queued_are_skipped() {
    dropped(&[]);
}

/// The same on a server batching 2: two long streams run in the rounds and four wait; all are
/// dropped, and the rounds stop them.
#[test]
fn streams_dropped_while_batched_or_queued_are_stopped() {
    dropped(&["--max-batch", "2"]);
}

fn dropped(extra: &[&str]) {
    let t0 = Instant::now();
    let s = Server::start(&[&["--max-queue", "16"], extra].concat());
    let long = json!({"prompt": PROMPTS[0], "max_tokens": 1500, "stream": true});
    // One runs, five wait; each has its 200 and headers.
    let streams: Vec<_> = (0..6).map(|_| s.post("/v1/completions", &long)).collect();
    assert!(streams.iter().all(|r| r.status() == 200));
    std::thread::sleep(Duration::from_millis(200));
    drop(streams);
    let start = Instant::now();
    let r = s.post("/v1/completions", &request(false, PROMPTS[1], 4, false));
    assert_eq!(r.status(), 200);
    let served = start.elapsed();
    assert_eq!(json_of(r)["usage"]["completion_tokens"], 4);
    let total = generated_tokens(&s);
    // A full long generation is 1500 tokens; each dropped one may run a round or so.
    assert!(total < 300, "dropped streams ran on: {total} tokens generated");
    assert!(served < Duration::from_secs(10), "the next request waited {served:?}");
    eprintln!(
        "dropped streams: next request served in {:.0} ms, {total} tokens generated in all; {:.2} s",
        served.as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64()
    );
}

/// First-token and end times (from the common start) of `n` streams of `max_tokens` each,
/// started together.
fn together(base: &str, n: usize, max_tokens: u64) -> Vec<(Duration, Duration)> {
    let start = Instant::now();
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let base = base.to_string();
            std::thread::spawn(move || {
                let got = stream_one(&base, false, PROMPTS[i % 6], max_tokens).unwrap();
                let first = got.first_token.expect("a streamed token");
                (start.elapsed() - got.latency + first, start.elapsed())
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

#[test]
fn batched_streams_advance_together() {
    let s = Server::start(&["--max-batch", "4"]);
    // Four long streams at once: each gets its first token before any of them ends. (On the
    // one-at-a-time server the fourth waits for the three before it: checked below.)
    let times = together(&s.base, 4, 48);
    let first_end = times.iter().map(|t| t.1).min().unwrap();
    for (i, (first, _)) in times.iter().enumerate() {
        assert!(*first < first_end, "stream {i}: first token at {first:?}, after a stream ended at {first_end:?}");
    }
    let plain = Server::start(&[]);
    let times = together(&plain.base, 4, 48);
    let first_end = times.iter().map(|t| t.1).min().unwrap();
    let waited = times.iter().filter(|t| t.0 > first_end).count();
    assert!(waited >= 1, "one at a time, some stream should start after another ended: {times:?}");

    // Sampled requests sharing rounds with greedy ones (one with logprobs, one sampled with
    // logprobs): each gives its seed's tokens, and the same logprobs, as the one-at-a-time server.
    let bodies: Vec<Value> = (0..5)
        .map(|i| match i {
            0 => json!({"prompt": PROMPTS[1], "max_tokens": 24, "logprobs": 2}),
            4 => json!({"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0.9, "seed": 3, "logprobs": 3}),
            _ => json!({"prompt": PROMPTS[i + 1], "max_tokens": 24, "temperature": 0.6 + 0.2 * i as f64,
                        "top_p": 0.9, "seed": 7 + i}),
        })
        .collect();
    let base = s.base.clone();
    let batched: Vec<Value> = bodies
        .iter()
        .map(|b| {
            let (base, b) = (base.clone(), b.clone());
            std::thread::spawn(move || {
                let r = client()
                    .post(format!("{base}/v1/completions"))
                    .header("content-type", "application/json")
                    .body(b.to_string())
                    .send()
                    .unwrap();
                json_of(r)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (i, (body, a)) in bodies.iter().zip(&batched).enumerate() {
        let b = json_of(plain.post("/v1/completions", body));
        assert_eq!(
            ids(&a["dspark"]["tokens"]),
            ids(&b["dspark"]["tokens"]),
            "request {i}: tokens on the batching server"
        );
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "request {i}");
        // Logprobs bit for bit: the CPU's small products are batch-invariant (a row's sums do
        // not depend on the rows sharing its call, as on the GPU), so a verify the budget
        // shortens gives each row the logits it has in the one-at-a-time server's full block.
        assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"], "request {i}: logprobs");
    }
    // n = 3 greedy choices run one after another in the rounds: three equal texts, in order.
    let body = json!({"prompt": PROMPTS[3], "max_tokens": 12, "n": 3});
    let v = json_of(s.post("/v1/completions", &body));
    let want = json_of(plain.post("/v1/completions", &json!({"prompt": PROMPTS[3], "max_tokens": 12})));
    for i in 0..3 {
        assert_eq!(v["choices"][i]["index"], i, "{v}");
        assert_eq!(v["choices"][i]["text"], want["choices"][0]["text"], "choice {i}");
    }
    // The rounds are in the metrics, as the one-at-a-time server reports them.
    let m = client().get(s.url("/metrics")).send().unwrap().text().unwrap();
    let value = |name: &str| -> f64 {
        let line = m.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in\n{m}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(value("dspark_speculative_rounds_total ") > 0.0, "{m}");
    assert!(value("dspark_mean_accepted_length ") >= 1.0, "{m}");
}

/// `--kv-capacity`: the requests' K/V share 96 positions (6 pages of 16). Six streams of 24
/// tokens started together on a server batching 6 cannot all fit (each reserves at least 2
/// pages), so some wait for pages — and every one still gives its solo tokens. Afterwards every
/// reservation is returned, and a request that could not fit even alone is a 400 naming
/// max_tokens, not a stream that fails midway.
#[test]
fn kv_capacity_admits_what_fits_and_loses_nothing() {
    let s = Server::start(&["--max-batch", "6", "--kv-capacity", "96"]);
    let plain = Server::start(&[]);
    let start = Instant::now();
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let base = s.base.clone();
            std::thread::spawn(move || {
                let got = stream_one(&base, false, PROMPTS[i], 24).unwrap();
                let first = start.elapsed() - got.latency + got.first_token.expect("a streamed token");
                (got, first, start.elapsed())
            })
        })
        .collect();
    let got: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (i, (g, _, _)) in got.iter().enumerate() {
        let want = json_of(plain.post("/v1/completions", &request(false, PROMPTS[i], 24, false)));
        assert_eq!(g.tokens, ids(&want["dspark"]["tokens"]), "stream {i}");
        assert_eq!(g.text, want["choices"][0]["text"].as_str().unwrap(), "stream {i}");
    }
    let first_end = got.iter().map(|g| g.2).min().unwrap();
    let waited = got.iter().filter(|g| g.1 > first_end).count();
    assert!(waited >= 1, "six streams of ≥ 2 pages in 6 pages: some must wait for pages");
    assert_eq!(metric(&s, "dspark_kv_capacity_positions"), 96.0);
    assert_eq!((metric(&s, "dspark_kv_reserved_positions"), metric(&s, "dspark_running_requests")), (0.0, 0.0));
    let r = s.post("/v1/completions", &request(false, PROMPTS[0], 95, false));
    assert_eq!(r.status(), 400);
    let e = json_of(r);
    assert_eq!(e["error"]["param"], "max_tokens", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("context is 96 tokens"), "{e}");
    // The server still serves after it.
    assert_eq!(s.post("/v1/completions", &request(false, PROMPTS[1], 4, false)).status(), 200);
}

/// A client that leaves while its request waits for K/V pages costs nothing: the request is
/// cancelled at the next round, while the pages are still taken (a choice left waiting would be
/// admitted and prefilled when they free, only to stop at its first token), and the request
/// behind it runs as soon as they free.
#[test]
fn a_request_waiting_for_pages_whose_client_left_never_runs() {
    let s = Server::start(&["--max-batch", "4", "--kv-capacity", "512"]);
    let until = |what: &str, cond: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while !cond() {
            assert!(t0.elapsed() < Duration::from_secs(60), "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let base = s.base.clone();
    // A holds every page (prompt + 500 tokens = 32 pages of 16) for a while.
    let a = std::thread::spawn(move || stream_one(&base, false, PROMPTS[0], 500).unwrap());
    until("A runs", &|| metric(&s, "dspark_running_requests") == 1.0);
    // B streams, waits for pages, and leaves.
    let b = s.post("/v1/completions", &json!({"prompt": PROMPTS[1], "max_tokens": 8, "stream": true}));
    assert_eq!(b.status(), 200);
    until("B waits for pages", &|| metric(&s, "dspark_waiting_requests") == 1.0);
    drop(b);
    until("B is cancelled", &|| metric(&s, "dspark_waiting_requests") == 0.0);
    assert!(!a.is_finished(), "B was dropped only when A ended and freed the pages");
    let c = json_of(s.post("/v1/completions", &request(false, PROMPTS[2], 4, false)));
    let a = a.join().unwrap();
    let used = c["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(generated_tokens(&s), a.tokens.len() as u64 + used, "B generated tokens");
    assert_eq!(metric(&s, "dspark_kv_reserved_positions"), 0.0);
}
