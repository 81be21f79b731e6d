//! What `dspark bench` reports, and how: the figures of one run as JSON and as markdown tables.
//!
//! Every phase is given as measured time against its floor (bytes it must stream / the copy
//! ceiling measured in the same run); every projection as our matvec beside cuBLAS on the same
//! buffers. End-to-end speed-ups are *modelled* from the measured round and decode times at
//! assumed mean accepted lengths τ (tokens committed per round), and labelled so.

use serde::Serialize;
use std::fmt::Write;

/// One timed phase at one context length.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub name: String,
    pub ctx: usize,
    /// Median wall time of one iteration, host synchronisation included (what a user sees).
    pub micros: f64,
    /// Bytes the phase must stream: weights once (per sequential use) + KV + logits.
    pub bytes: f64,
    pub floor_micros: f64,
    /// micros / floor_micros.
    pub ratio: f64,
}

impl Phase {
    pub fn new(name: &str, ctx: usize, micros: f64, bytes: f64, ceiling_gbps: f64) -> Phase {
        let floor_micros = bytes / (ceiling_gbps * 1e3);
        Phase { name: name.into(), ctx, micros, bytes, floor_micros, ratio: micros / floor_micros }
    }
}

/// One projection at M rows: ours beside cuBLAS. The `*_micros` figures are per call replayed
/// from a CUDA graph (device time, as `generate` runs it); the `*_eager_micros` ones the same
/// calls launched one by one from the host.
#[derive(Clone, Debug, Serialize)]
pub struct Projection {
    pub name: String,
    pub out_features: usize,
    pub in_features: usize,
    pub m: usize,
    pub weight_bytes: f64,
    pub ours_micros: f64,
    /// Weight bytes / time as a share of the copy ceiling.
    pub ours_pct_ceiling: f64,
    pub cublas_micros: f64,
    pub cublas_pct_ceiling: f64,
    /// cublas_micros / ours_micros.
    pub speedup: f64,
    pub ours_eager_micros: f64,
    pub cublas_eager_micros: f64,
    /// cublas_eager_micros / ours_eager_micros.
    pub eager_speedup: f64,
    /// Kernel variants timed by `--matvec-variants` (tuning runs only): (name, µs, % ceiling).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<(String, f64, f64)>,
}

impl Projection {
    #[allow(clippy::too_many_arguments)]
    pub fn new(name: &str, out: usize, inp: usize, m: usize, ours: f64, cublas: f64, ceiling_gbps: f64) -> Projection {
        let weight_bytes = (out * inp * 2) as f64;
        let pct = |us: f64| 100.0 * weight_bytes / (us * 1e3) / ceiling_gbps;
        Projection {
            name: name.into(),
            out_features: out,
            in_features: inp,
            m,
            weight_bytes,
            ours_micros: ours,
            ours_pct_ceiling: pct(ours),
            cublas_micros: cublas,
            cublas_pct_ceiling: pct(cublas),
            speedup: cublas / ours,
            ours_eager_micros: f64::NAN,
            cublas_eager_micros: f64::NAN,
            eager_speedup: f64::NAN,
            variants: Vec::new(),
        }
    }

    /// Ours reads `bytes` of weights instead of the bf16 matrix (FP8: one byte a weight): its
    /// share of the ceiling counts those; cuBLAS's still counts the bf16 matrix it reads.
    pub fn set_weight_bytes(&mut self, bytes: f64, ceiling_gbps: f64) {
        self.weight_bytes = bytes;
        self.ours_pct_ceiling = 100.0 * bytes / (self.ours_micros * 1e3) / ceiling_gbps;
    }

    /// The same calls' per-call times when launched one by one from the host.
    pub fn set_eager(&mut self, ours: f64, cublas: f64) {
        self.ours_eager_micros = ours;
        self.cublas_eager_micros = cublas;
        self.eager_speedup = cublas / ours;
    }
}

/// Modelled end-to-end speed at an assumed τ.
#[derive(Clone, Debug, Serialize)]
pub struct Modelled {
    pub ctx: usize,
    pub tau: f64,
    pub round_micros: f64,
    pub tokens_per_s: f64,
    pub plain_tokens_per_s: f64,
    pub speedup: f64,
}

/// τ tokens per measured round against one token per measured decode step.
pub fn model(ctx: usize, tau: f64, round_micros: f64, decode_micros: f64) -> Modelled {
    let tokens_per_s = tau / round_micros * 1e6;
    let plain_tokens_per_s = 1e6 / decode_micros;
    Modelled { ctx, tau, round_micros, tokens_per_s, plain_tokens_per_s, speedup: tokens_per_s / plain_tokens_per_s }
}

/// Per-kernel totals of one profiled phase.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    pub phase: String,
    pub ctx: usize,
    /// Sum of the kernels' event-bracketed times. Each bracket also holds the launch's own
    /// start-up, so the sum exceeds the unprofiled time; compare with `unprofiled_micros`.
    pub kernel_micros: f64,
    /// The same phase's median wall time without per-launch events (from the phase table).
    pub unprofiled_micros: f64,
    pub kernels: Vec<KernelRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelRow {
    pub name: String,
    pub launches: usize,
    pub micros: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub device: String,
    pub date_utc: String,
    pub command: String,
    /// Device-to-device copy: (bytes read + bytes written) / time, GB/s (1e9).
    pub ceiling_gbps: f64,
    pub phases: Vec<Phase>,
    pub projections: Vec<Projection>,
    pub modelled: Vec<Modelled>,
    pub profiles: Vec<Profile>,
    pub prefill: Vec<PrefillRow>,
    /// Batched rounds of many requests (`--concurrency`, bench/concurrency.rs).
    pub concurrency: Vec<super::concurrency::ConcurrencyRow>,
    /// The device memory each weight format's target and draft took.
    pub memory: Vec<MemoryRow>,
    pub notes: Vec<String>,
    /// `--trace`: each traced phase's table (bench/trace.rs), as markdown.
    pub traces: Vec<String>,
}

/// The device memory of one weight format's models, as built for the run.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryRow {
    /// `bf16` or `fp8`.
    pub weights: String,
    /// KV positions planned, and their element type.
    pub ctx: usize,
    pub kv: String,
    /// The target's and the draft's arenas, GB (1e9).
    pub target_gb: f64,
    pub draft_gb: f64,
}

/// One prompt length of the prefill phase (bench/prefill.rs).
#[derive(Clone, Debug, Serialize)]
pub struct PrefillRow {
    /// The target's weight format when not bf16 (`fp8`), else empty.
    pub weights: String,
    pub tokens: usize,
    /// Median wall time of `forward_greedy` over the prompt (logits of its last row).
    pub micros: f64,
    /// Projection, attention and lm_head FLOPs / time.
    pub tflops: f64,
    /// The prefill's projection GEMMs alone through cuBLAS (bf16 in, f32 out), same shapes.
    pub cublas_gemm_micros: f64,
    pub cublas_tflops: f64,
    /// cublas_gemm_micros / micros: the share of cuBLAS's GEMM throughput the prefill reaches.
    pub gemm_share: f64,
    /// What the draft adds to the first token: the speculative loop's prefill (captures kept
    /// on the device, the draft's context append of every chunk) less the plain forward.
    pub draft_append_micros: f64,
}

impl Report {
    /// The markdown tables of the run.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## dspark bench — {} — {}\n", self.device, self.date_utc);
        let _ = writeln!(s, "Command: `{}`\n", self.command);
        let _ = writeln!(s, "Copy ceiling (device-to-device, read + write): **{:.0} GB/s**\n", self.ceiling_gbps);
        let _ = writeln!(s, "### Phases (median wall time per iteration; floor = bytes / ceiling)\n");
        let _ = writeln!(s, "| phase | ctx | time µs | bytes MB | floor µs | time / floor |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for p in &self.phases {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {:.1} | {:.1} | **{:.3}** |",
                p.name,
                p.ctx,
                p.micros,
                p.bytes / 1e6,
                p.floor_micros,
                p.ratio
            );
        }
        if !self.concurrency.is_empty() {
            s.push_str(&super::concurrency::markdown(&self.concurrency));
        }
        if !self.prefill.is_empty() {
            let _ = writeln!(s, "\n### Prefill (median wall time of the prompt's forward; roofline = its projection GEMMs alone in cuBLAS)\n");
            let _ = writeln!(s, "| prompt tokens | time ms | TFLOP/s | cuBLAS GEMMs ms | cuBLAS TFLOP/s | TFLOP/s ÷ cuBLAS's | GEMM share of time | draft adds ms | first token with draft / without |");
            let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for p in &self.prefill {
                let _ = writeln!(
                    s,
                    "| {}{} | {:.1} | {:.0} | {:.1} | {:.0} | **{:.2}** | {:.2} | {:.1} | {:.3} |",
                    p.tokens,
                    if p.weights.is_empty() { String::new() } else { format!(" ({})", p.weights) },
                    p.micros / 1e3,
                    p.tflops,
                    p.cublas_gemm_micros / 1e3,
                    p.cublas_tflops,
                    p.tflops / p.cublas_tflops,
                    p.gemm_share,
                    p.draft_append_micros / 1e3,
                    (p.micros + p.draft_append_micros) / p.micros
                );
            }
        }
        let goals = self.goals();
        if !goals.is_empty() {
            let _ = writeln!(s, "\n### Goals (the open issues' targets)\n");
            let _ = writeln!(s, "| goal | target | measured | met |");
            let _ = writeln!(s, "|---|---|---:|---|");
            for g in &goals {
                let _ = writeln!(
                    s,
                    "| {} | {} {:.2} | {:.3} | {} |",
                    g.name,
                    if g.at_most { "≤" } else { "≥" },
                    g.target,
                    g.measured,
                    if g.met() { "yes" } else { "no" }
                );
            }
        }
        let _ = writeln!(
            s,
            "\n### Projections at M = {} (bf16 weights; `_fp8`: ours on Qwen's block-scaled FP8, MB and ours % from the FP8 bytes, cuBLAS on bf16; µs per call replayed from a CUDA graph; % of the copy ceiling; eager: the same calls launched one by one)\n",
            self.projections.first().map_or(7, |p| p.m)
        );
        let _ = writeln!(
            s,
            "| projection | out × in | MB | ours µs | ours % | cuBLAS µs | cuBLAS % | ours vs cuBLAS | eager: ours µs | cuBLAS µs | ratio |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for p in &self.projections {
            let _ = writeln!(
                s,
                "| {} | {} × {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | **{:.2}×** | {:.2} | {:.2} | {:.2}× |",
                p.name,
                p.out_features,
                p.in_features,
                p.weight_bytes / 1e6,
                p.ours_micros,
                p.ours_pct_ceiling,
                p.cublas_micros,
                p.cublas_pct_ceiling,
                p.speedup,
                p.ours_eager_micros,
                p.cublas_eager_micros,
                p.eager_speedup
            );
        }
        for p in self.projections.iter().filter(|p| !p.variants.is_empty()) {
            let v: Vec<String> = p.variants.iter().map(|(n, us, pct)| format!("{n} {us:.2} µs ({pct:.1}%)")).collect();
            let _ = writeln!(s, "- variants {}: {}", p.name, v.join(", "));
        }
        let _ = writeln!(
            s,
            "\n### Modelled end-to-end (from the measured round and decode times; τ assumed, not measured)\n"
        );
        let _ = writeln!(s, "| ctx | τ | round µs | tok/s | plain tok/s | speed-up |");
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
        for m in &self.modelled {
            let _ = writeln!(
                s,
                "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2}× |",
                m.ctx, m.tau, m.round_micros, m.tokens_per_s, m.plain_tokens_per_s, m.speedup
            );
        }
        for p in &self.profiles {
            let _ = writeln!(
                s,
                "\n### Profile: {} at ctx {} (event-bracketed kernels sum to {:.1} µs; unprofiled phase {:.1} µs)\n",
                p.phase, p.ctx, p.kernel_micros, p.unprofiled_micros
            );
            let _ = writeln!(s, "| kernel | launches | µs | share |");
            let _ = writeln!(s, "|---|---:|---:|---:|");
            for k in &p.kernels {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} | {:.1}% |",
                    k.name,
                    k.launches,
                    k.micros,
                    100.0 * k.micros / p.kernel_micros.max(1e-9)
                );
            }
        }
        if !self.traces.is_empty() {
            let _ = writeln!(s, "\n### In-graph traces (`--trace`)");
            for t in &self.traces {
                s.push_str(t);
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(s, "\n### Notes\n");
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }
}

/// Median of a non-empty sample.
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::concurrency::ConcurrencyRow;

    #[test]
    fn floors_ratios_and_model() {
        // 4 GB at 4000 GB/s is 1000 µs; 1100 µs measured is 1.1× the floor.
        let p = Phase::new("decode", 512, 1100.0, 4e9, 4000.0);
        assert!((p.floor_micros - 1000.0).abs() < 1e-9 && (p.ratio - 1.1).abs() < 1e-12);
        // 32 MB weights in 8 µs at a 4000 GB/s ceiling is 100%.
        let q = Projection::new("q_proj", 4096, 4096, 7, 8.388608, 20.0, 4000.0);
        assert!((q.ours_pct_ceiling - 100.0).abs() < 1e-6, "{}", q.ours_pct_ceiling);
        assert!((q.speedup - 20.0 / 8.388608).abs() < 1e-9);
        // τ = 4 tokens per 5 ms round against 4 ms decode steps: 800 tok/s vs 250, 3.2×.
        let m = model(512, 4.0, 5000.0, 4000.0);
        assert!((m.tokens_per_s - 800.0).abs() < 1e-9 && (m.speedup - 3.2).abs() < 1e-12);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn markdown_has_every_section() {
        let r = Report {
            device: "test GPU".into(),
            date_utc: "2026-11-30".into(),
            command: "dspark bench".into(),
            ceiling_gbps: 4000.0,
            phases: vec![Phase::new("decode", 512, 1100.0, 4e9, 4000.0)],
            projections: vec![{
                let mut p = Projection::new("k_proj", 1024, 4096, 7, 4.0, 25.0, 4000.0);
                p.set_eager(5.0, 40.0);
                p
            }],
            modelled: vec![model(512, 2.0, 5000.0, 4000.0)],
            profiles: vec![Profile {
                phase: "decode".into(),
                ctx: 512,
                kernel_micros: 10.0,
                unprofiled_micros: 9.0,
                kernels: vec![KernelRow { name: "matvec_tc_bf16".into(), launches: 3, micros: 10.0 }],
            }],
            prefill: vec![PrefillRow {
                weights: String::new(),
                tokens: 4096,
                micros: 120e3,
                tflops: 600.0,
                cublas_gemm_micros: 90e3,
                cublas_tflops: 700.0,
                gemm_share: 0.75,
                draft_append_micros: 6e3,
            }],
            concurrency: vec![
                ConcurrencyRow {
                    weights: "bf16".into(),
                    requests: 1,
                    ctx: 512,
                    policy: "full".into(),
                    verify_rows: 8,
                    round_micros: 5000.0,
                    draft_micros: 1000.0,
                    target_micros: 4000.0,
                    one_sequence_micros: Some(4000.0),
                    tokens_per_round: 3.5,
                    aggregate_tokens_per_s: 700.0,
                    per_request_tokens_per_s: 700.0,
                },
                ConcurrencyRow {
                    weights: "bf16".into(),
                    requests: 8,
                    ctx: 512,
                    policy: "budget".into(),
                    verify_rows: 40,
                    round_micros: 10000.0,
                    draft_micros: 2000.0,
                    target_micros: 8000.0,
                    one_sequence_micros: None,
                    tokens_per_round: 26.0,
                    aggregate_tokens_per_s: 2600.0,
                    per_request_tokens_per_s: 325.0,
                },
            ],
            memory: vec![],
            notes: vec!["a note".into()],
            traces: vec!["\n#### decode at 512 keys: a traced table\n".into()],
        };
        let md = r.markdown();
        // The batched rows against one request's full-block round at the same context.
        assert!(
            md.contains("| 8 | 512 | budget | 40 | 10000 | 2000 | 8000 | — | 26.00 | 2600 | 325 | 3.71× | 0.46× |"),
            "{md}"
        );
        // The graph figures are the table's main ones and the goals'; the eager ones stand beside them.
        for want in [
            "**1.100**",
            "k_proj",
            "**6.25×**",
            "| 5.00 | 40.00 | 8.00× |",
            "matvec_tc_bf16",
            "100.0%",
            "a note",
            "In-graph traces",
            "a traced table",
        ] {
            assert!(md.contains(want), "missing {want} in\n{md}");
        }
        assert!(md.contains("Modelled") && md.contains("Goals"), "{md}");
        // The prefill row: 600 of cuBLAS's 700 TFLOP/s, its GEMMs 75% of the time, the draft adding 5%.
        assert!(md.contains("| 4096 | 120.0 | 600 | 90.0 | 700 | **0.86** | 0.75 | 6.0 | 1.050 |"), "{md}");
    }
}
