//! The open issues' targets, judged on one `dspark bench` run: each a measured figure beside its
//! bound, so a run says by itself which goals it meets.
//!
//! * #31 (the last 20% of decode): plain decode ≤ 1.10× its floor, bf16 and FP8; verify of 8 ≤
//!   1.04× a decode step, at every context measured (the issue names 16,384 keys too); the draft
//!   round ≤ 1.15× its floor.
//! * #29 (FP8 weights): FP8 decode ≤ 1.15× its floor; every FP8 projection of 32 MB or more at
//!   ≥ 85% of the copy ceiling (bf16 ones too, #5's goal); Qwen3-8B-FP8 + its bf16 draft in ≤ 12
//!   GB at 8k context, bf16 KV.
//! * #27 (sampling): a device-sampled round ≤ 1.03× a greedy one.
//! * #30 (many requests): at 8 requests the aggregate ≥ 5× one request's and each request ≥ 0.6×
//!   one request's alone; the verify budget ≥ 1.10× full blocks' aggregate at 16 requests and
//!   ≥ 0.99× at one. The budget is the engine's policy, so its rows are the ones judged, against
//!   one request's budget row.
//! * #5 (projections): 1024-row projections ≥ 2.5× faster than cuBLAS.

use super::report::Report;

/// One of the issue's targets, evaluated on a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    pub name: String,
    pub target: f64,
    /// Whether the measured figure must be at most (ratios to a floor) or at least the target.
    pub at_most: bool,
    pub measured: f64,
}

impl Goal {
    fn at_most(name: String, target: f64, measured: f64) -> Goal {
        Goal { name, target, at_most: true, measured }
    }

    fn at_least(name: String, target: f64, measured: f64) -> Goal {
        Goal { name, target, at_most: false, measured }
    }

    pub fn met(&self) -> bool {
        if self.at_most {
            self.measured <= self.target
        } else {
            self.measured >= self.target
        }
    }
}

impl Report {
    /// The targets of the module docs that this run measured.
    pub fn goals(&self) -> Vec<Goal> {
        let mut out = Vec::new();
        let find = |name: &str, ctx: usize| self.phases.iter().find(|p| p.name == name && p.ctx == ctx);
        let mut ctxs: Vec<usize> = self.phases.iter().map(|p| p.ctx).collect();
        ctxs.sort_unstable();
        ctxs.dedup();
        for ctx in ctxs {
            for sfx in ["", "_fp8"] {
                if let Some(d) = find(&format!("decode{sfx}"), ctx) {
                    out.push(Goal::at_most(format!("decode{sfx} / floor, ctx {ctx} (#31)"), 1.10, d.ratio));
                    if let Some(v) = find(&format!("verify8{sfx}"), ctx) {
                        let name = format!("verify8{sfx} / decode{sfx}, ctx {ctx} (#31)");
                        out.push(Goal::at_most(name, 1.04, v.micros / d.micros));
                    }
                }
            }
            if let Some(d) = find("decode_fp8", ctx) {
                out.push(Goal::at_most(format!("decode_fp8 / floor, ctx {ctx} (#29)"), 1.15, d.ratio));
            }
            if let Some(r) = find("draft_round", ctx) {
                out.push(Goal::at_most(format!("draft_round / floor, ctx {ctx} (#31)"), 1.15, r.ratio));
            }
            if let Some(r) = find("round", ctx) {
                for name in ["round_sampled", "round_sampled_t1", "round_sampled_law"] {
                    if let Some(sr) = find(name, ctx) {
                        out.push(Goal::at_most(format!("{name} / round, ctx {ctx} (#27)"), 1.03, sr.micros / r.micros));
                    }
                }
            }
        }
        for m in &self.memory {
            if m.weights == "fp8" && m.kv == "bf16" && m.ctx >= 8176 {
                let name = format!("fp8 target + draft device memory GB, ctx {} (#29)", m.ctx);
                out.push(Goal::at_most(name, 12.0, m.target_gb + m.draft_gb));
            }
        }
        for p in &self.projections {
            if p.weight_bytes >= 32e6 {
                // FP8 projections (`…_fp8`) are #29's; bf16 ones were #5's.
                let issue = if p.name.ends_with("_fp8") { "#29" } else { "#5" };
                out.push(Goal::at_least(format!("{} % of ceiling ({issue})", p.name), 85.0, p.ours_pct_ceiling));
            }
            if p.out_features == 1024 {
                out.push(Goal::at_least(format!("{} vs cuBLAS (#5)", p.name), 2.5, p.speedup));
            }
        }
        out.extend(self.concurrency_goals());
        out
    }

    /// #30's targets (bf16), per context of the `--concurrency` rows.
    fn concurrency_goals(&self) -> Vec<Goal> {
        let mut out = Vec::new();
        let rows: Vec<_> = self.concurrency.iter().filter(|r| r.weights == "bf16").collect();
        let row = |n: usize, ctx: usize, policy: &str| {
            rows.iter().copied().find(|r| r.requests == n && r.ctx == ctx && r.policy == policy)
        };
        let mut ctxs: Vec<usize> = rows.iter().map(|r| r.ctx).collect();
        ctxs.sort_unstable();
        ctxs.dedup();
        for ctx in ctxs {
            if let (Some(one), Some(eight)) = (row(1, ctx, "budget"), row(8, ctx, "budget")) {
                let agg = eight.aggregate_tokens_per_s / one.aggregate_tokens_per_s;
                out.push(Goal::at_least(format!("aggregate at 8 requests / one request's, ctx {ctx} (#30)"), 5.0, agg));
                let each = eight.per_request_tokens_per_s / one.per_request_tokens_per_s;
                out.push(Goal::at_least(format!("per request at 8 / one request's, ctx {ctx} (#30)"), 0.6, each));
            }
            for (n, target) in [(16, 1.10), (1, 0.99)] {
                if let (Some(b), Some(f)) = (row(n, ctx, "budget"), row(n, ctx, "full")) {
                    let name = format!(
                        "budget / full blocks at {n} request{}, ctx {ctx} (#30)",
                        if n == 1 { "" } else { "s" }
                    );
                    out.push(Goal::at_least(name, target, b.aggregate_tokens_per_s / f.aggregate_tokens_per_s));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::bench::concurrency::ConcurrencyRow;
    use crate::bench::report::{MemoryRow, Phase, Projection, Report};

    fn conc(requests: usize, policy: &str, aggregate: f64) -> ConcurrencyRow {
        ConcurrencyRow {
            weights: "bf16".into(),
            requests,
            ctx: 512,
            policy: policy.into(),
            verify_rows: 8 * requests,
            round_micros: 0.0,
            draft_micros: 0.0,
            target_micros: 0.0,
            one_sequence_micros: None,
            tokens_per_round: 0.0,
            aggregate_tokens_per_s: aggregate,
            per_request_tokens_per_s: aggregate / requests as f64,
        }
    }

    #[test]
    fn goals_are_judged_in_the_right_direction() {
        // An FP8 gate|up: 100.7 MB (one byte a weight) in 30 µs at 4000 GB/s is 83.9%.
        let mut fp8_gate_up = Projection::new("gate_up_fp8", 24576, 4096, 7, 30.0, 60.0, 4000.0);
        fp8_gate_up.set_weight_bytes((24576 * 4096) as f64, 4000.0);
        let r = Report {
            device: String::new(),
            date_utc: String::new(),
            command: String::new(),
            ceiling_gbps: 4000.0,
            phases: vec![
                Phase::new("decode", 512, 1000.0, 4e9, 4000.0),     // 1.0× the floor
                Phase::new("verify8", 512, 1100.0, 4e9, 4000.0),    // 1.1× decode
                Phase::new("draft_round", 512, 300.0, 1e9, 4000.0), // 1.2× the floor
                Phase::new("decode_fp8", 512, 1120.0, 4e9, 4000.0), // 1.12× the floor
            ],
            projections: vec![
                Projection::new("q_proj", 4096, 4096, 7, 8.388608, 20.0, 4000.0), // 100%
                Projection::new("k_proj", 1024, 4096, 7, 4.0, 12.0, 4000.0),      // 3.0× cuBLAS
                fp8_gate_up,
            ],
            modelled: vec![],
            profiles: vec![],
            prefill: vec![],
            // One request 100 tok/s (budget) and 101 (full); 8 requests 520 (5.2×, 0.65 each);
            // 16 requests 1,000 against 950 full blocks (1.05×: short of 1.10).
            concurrency: vec![
                // An FP8 target's rows are reported, not judged: counted, this one would make
                // 8 requests 0.5× one request's.
                ConcurrencyRow { weights: "fp8".into(), ..conc(1, "budget", 1040.0) },
                conc(1, "full", 101.0),
                conc(1, "budget", 100.0),
                conc(8, "full", 400.0),
                conc(8, "budget", 520.0),
                conc(16, "full", 950.0),
                conc(16, "budget", 1000.0),
            ],
            memory: vec![
                MemoryRow { weights: "fp8".into(), ctx: 8192, kv: "bf16".into(), target_gb: 9.6, draft_gb: 2.5 },
                MemoryRow { weights: "fp8".into(), ctx: 512, kv: "bf16".into(), target_gb: 9.0, draft_gb: 2.5 },
                MemoryRow { weights: "bf16".into(), ctx: 8192, kv: "bf16".into(), target_gb: 16.0, draft_gb: 2.5 },
            ],
            notes: vec![],
            traces: vec![],
        };
        let met: Vec<(String, bool)> = r.goals().into_iter().map(|g| (g.name.clone(), g.met())).collect();
        let want = [
            ("decode / floor, ctx 512 (#31)", true),
            ("verify8 / decode, ctx 512 (#31)", false),
            // 1.12×: over #31's 1.10, under #29's 1.15.
            ("decode_fp8 / floor, ctx 512 (#31)", false),
            ("decode_fp8 / floor, ctx 512 (#29)", true),
            ("draft_round / floor, ctx 512 (#31)", false),
            // 12.1 GB: over; the short context and the bf16 target are not judged.
            ("fp8 target + draft device memory GB, ctx 8192 (#29)", false),
            ("q_proj % of ceiling (#5)", true),
            ("k_proj vs cuBLAS (#5)", true),
            ("gate_up_fp8 % of ceiling (#29)", false),
            ("aggregate at 8 requests / one request's, ctx 512 (#30)", true),
            ("per request at 8 / one request's, ctx 512 (#30)", true),
            ("budget / full blocks at 16 requests, ctx 512 (#30)", false),
            // 100 / 101 = 0.990: within 1%.
            ("budget / full blocks at 1 request, ctx 512 (#30)", true),
        ];
        let want: Vec<(String, bool)> = want.iter().map(|(n, m)| (n.to_string(), *m)).collect();
        assert_eq!(met, want);
    }
}
