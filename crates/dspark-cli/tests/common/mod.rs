//! Shared by the `serve*` integration tests: `dspark serve` on the embedded demo pair (CPU) as
//! the real binary on 127.0.0.1:0 (the listening line on stderr, then `/health` polled until
//! the models are loaded), a blocking HTTP client, and `dspark generate --json` for the
//! expected outputs.
#![allow(dead_code)] // each test crate uses part of it

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dspark"))
            .args(["serve", "--device", "cpu", "--port", "0"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start dspark serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("server exited before listening").unwrap();
            if let Some(a) = line.strip_prefix("dspark serve: listening on ") {
                break a.to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let server = Server { child, base: addr };
        let start = Instant::now();
        loop {
            if let Ok(r) = client().get(server.url("/health")).send() {
                if r.status() == 200 {
                    let body: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
                    assert_eq!(body, json!({"status": "ok"}), "/health when ready");
                    break;
                }
                assert_eq!(r.status(), 503, "health while loading");
            }
            assert!(start.elapsed() < Duration::from_secs(60), "server not ready after 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str, body: &Value) -> reqwest::blocking::Response {
        client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .expect("POST")
    }

    /// Whether the server process is still running (it has not exited or crashed).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

pub fn json_of(r: reqwest::blocking::Response) -> Value {
    let text = r.text().unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `dspark generate --device cpu --json ARGS`: `{"tokens", "text", "stats"}`.
pub fn generate(args: &[&str]) -> Value {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_dspark"))
        .args(["generate", "--device", "cpu", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_u64().unwrap()).collect()
}

/// The OpenAI error shape: `{"error": {"message": string, "type": string, "param", "code"}}`,
/// all four keys present (`param` and `code` may be null).
pub fn is_error_shape(v: &Value) -> bool {
    let e = &v["error"];
    e["message"].is_string()
        && e["type"].is_string()
        && e.get("param").is_some_and(|p| p.is_null() || p.is_string())
        && e.get("code").is_some_and(|c| c.is_null() || c.is_string() || c.is_number())
}

/// A chat or completions request body for `prompt` (a user message for chat).
pub fn request(chat: bool, prompt: &str, max_tokens: u64, stream: bool) -> Value {
    let mut v = json!({"max_tokens": max_tokens, "temperature": 0, "stream": stream});
    if chat {
        v["messages"] = json!([{"role": "user", "content": prompt}]);
    } else {
        v["prompt"] = json!(prompt);
    }
    v
}
