//! `/metrics`: Prometheus text through the `prometheus` crate's registry and encoder.

use dspark_spec::{AcceptanceCheck, SpecStats};
use prometheus::{Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use std::sync::Mutex;

pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and HTTP status.
    pub requests: IntCounterVec,
    /// Requests waiting for the engine (not the one it runs).
    pub queue_depth: IntGauge,
    pub generated_tokens: IntCounter,
    /// Decode tokens/s of the last finished generation.
    pub tokens_per_second: Gauge,
    pub rounds: IntCounter,
    /// Tokens committed per speculative round over every round served.
    pub mean_accepted_length: Gauge,
    /// (Σ rounds × mean accepted length, Σ rounds) behind `mean_accepted_length`.
    accepted: Mutex<(f64, f64)>,
    /// 1 when the start-up check judged the draft's first rounds far below its usual acceptance
    /// (also logged once), else 0.
    pub draft_low_acceptance: IntGauge,
    check: Mutex<AcceptanceCheck>,
    /// Requests in the batched rounds (`--max-batch`), and those taken from the queue that wait
    /// for K/V capacity (`--kv-capacity`).
    pub running: IntGauge,
    pub waiting: IntGauge,
    /// KV positions the running requests have reserved, and what the pool holds (`--kv-capacity`;
    /// 0 when unbounded).
    pub kv_reserved: IntGauge,
    pub kv_capacity: IntGauge,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("dspark_requests_total", "HTTP requests answered, by endpoint and status"),
            &["endpoint", "status"],
        )?;
        let queue_depth = IntGauge::new("dspark_queue_depth", "Requests waiting for the engine")?;
        let generated_tokens = IntCounter::new("dspark_generated_tokens_total", "Tokens generated")?;
        let tokens_per_second =
            Gauge::new("dspark_tokens_per_second", "Decode tokens per second of the last finished generation")?;
        let rounds = IntCounter::new("dspark_speculative_rounds_total", "Speculative rounds (target verifies)")?;
        let mean_accepted_length = Gauge::new(
            "dspark_mean_accepted_length",
            "Tokens committed per speculative round, over every round served",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(generated_tokens.clone()))?;
        registry.register(Box::new(tokens_per_second.clone()))?;
        registry.register(Box::new(rounds.clone()))?;
        let draft_low_acceptance = IntGauge::new(
            "dspark_draft_low_acceptance",
            "1 when the draft's first speculative rounds accepted almost nothing (a draft that does not match the target)",
        )?;
        registry.register(Box::new(mean_accepted_length.clone()))?;
        registry.register(Box::new(draft_low_acceptance.clone()))?;
        let running = IntGauge::new("dspark_running_requests", "Requests in the batched rounds now")?;
        let waiting =
            IntGauge::new("dspark_waiting_requests", "Requests taken from the queue that wait for K/V capacity")?;
        registry.register(Box::new(waiting.clone()))?;
        let kv_reserved = IntGauge::new(
            "dspark_kv_reserved_positions",
            "KV positions the running requests have reserved (prompt + max_tokens, in whole pages)",
        )?;
        let kv_capacity =
            IntGauge::new("dspark_kv_capacity_positions", "KV positions planned at start-up (0: no --kv-capacity)")?;
        registry.register(Box::new(running.clone()))?;
        registry.register(Box::new(kv_reserved.clone()))?;
        registry.register(Box::new(kv_capacity.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            queue_depth,
            generated_tokens,
            tokens_per_second,
            rounds,
            mean_accepted_length,
            accepted: Mutex::new((0.0, 0.0)),
            draft_low_acceptance,
            check: Mutex::new(AcceptanceCheck::new()),
            running,
            waiting,
            kv_reserved,
            kv_capacity,
        })
    }

    /// Records one speculative generation's rounds, and feeds the server's first rounds to the
    /// start-up acceptance check (dspark_spec::acceptance), which logs its warning once.
    pub fn record_spec(&self, spec: &SpecStats) {
        let low = self.check.lock().unwrap_or_else(|p| p.into_inner()).observe(spec);
        if let Some(low) = low {
            eprintln!("dspark serve: warning: {low}");
            self.draft_low_acceptance.set(1);
        }
        let (rounds, mean) = (spec.rounds(), spec.mean_accepted_length());
        if rounds == 0 {
            return;
        }
        self.rounds.inc_by(rounds as u64);
        let mut a = self.accepted.lock().unwrap_or_else(|p| p.into_inner());
        a.0 += mean * rounds as f64;
        a.1 += rounds as f64;
        self.mean_accepted_length.set(a.0 / a.1);
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
