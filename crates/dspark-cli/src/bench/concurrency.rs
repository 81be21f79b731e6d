//! `dspark bench --concurrency 1,2,4,8,16`: batched speculative rounds of many requests
//! (issue #30) on Qwen3-8B / DSpark-8B shapes with random weights.
//!
//! Every request holds `ctx` positions (a real prefill each). One timed round is what the
//! batched scheduler runs: each request's committed captures appended to its draft context, the
//! draft's proposals for all requests (`BatchDrafter::propose_batch`), one target forward over
//! all requests' verify rows (`CudaBatch::forward_batch`), then every sequence rolled back so the
//! context stays `ctx`. Acceptance is modelled, not measured: each request accepts draft i with
//! prefix survival α^i, α chosen so a full block commits τ tokens (`TAU`, the paper's chat
//! range), so a request verifying k drafts commits 1 + Σ_{i≤k} α^i on average.
//!
//! Two rows per request count, their rounds alternating (so a drift in clocks touches both):
//! `full` verifies every request's whole block; `budget` chooses
//! each request's drafts by the paper's Algorithm 1 (`dspark_spec::verify_budget`) over a cost
//! table of this GPU's forwards measured first, at k + 1 rows per request for k = 0..=block (in
//! between, linear), with the same modelled survival for every request.

use super::report::Profile;
use super::{median, profile, COMMITTED};
use anyhow::{bail, Result};
use dspark_kernels::cuda::Gpu;
use dspark_model::cuda::dspark::{CudaDraft, CudaDrafts};
use dspark_model::cuda::qwen3::CHUNK;
use dspark_model::cuda::qwen3::{CudaBatch, CudaQwen3};
use dspark_model::{BatchDrafter, BatchTarget, Drafter, LogitRows, SeqId, TargetModel};
use dspark_spec::verify_len::CostTable;
use std::time::Instant;

/// Modelled tokens a full-block round commits (the paper's chat range).
pub const TAU: f64 = 3.5;

/// One (requests, policy) row of the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConcurrencyRow {
    /// The target's weight format (`bf16`, `fp8`: `--weights`).
    pub weights: String,
    pub requests: usize,
    pub ctx: usize,
    /// `full` (every request verifies its block) or `budget` (Algorithm 1).
    pub policy: String,
    /// Target rows of one round, all requests together.
    pub verify_rows: usize,
    pub round_micros: f64,
    /// Of the round: the draft's appends and proposals for every request (median).
    pub draft_micros: f64,
    /// Of the round: the target's batched forward over every request's verify rows (median).
    pub target_micros: f64,
    /// The target's forward over as many rows of one sequence (one attention segment): what the
    /// projections cost without the per-request work; `None` above one step's rows.
    pub one_sequence_micros: Option<f64>,
    /// Modelled tokens committed per round, all requests together.
    pub tokens_per_round: f64,
    pub aggregate_tokens_per_s: f64,
    pub per_request_tokens_per_s: f64,
}

/// The per-draft survival α with 1 + Σ_{i=1..block} α^i = τ (bisection).
pub fn alpha_for(tau: f64, block: usize) -> f64 {
    let committed = |a: f64| 1.0 + (1..=block).map(|i| a.powi(i as i32)).sum::<f64>();
    let (mut lo, mut hi) = (0.0, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if committed(mid) < tau {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Measures every level of `levels` at context `ctx` (see the module docs).
///
/// Also returns kernel profiles of one full-block round at the largest level: its draft half
/// (`batched_draft_R`) and its target half (`batched_target_R`), suffixed `_fp8` for an FP8 target.
pub fn measure(
    gpu: &Gpu,
    mut target: CudaQwen3,
    mut draft: CudaDraft,
    (ctx, paged, weights): (usize, bool, &str),
    levels: &[usize],
    iters: usize,
    token: &mut dyn FnMut() -> u32,
) -> Result<(Vec<ConcurrencyRow>, Vec<Profile>)> {
    let most = levels.iter().copied().max().unwrap_or(1);
    let block = draft.block_size();
    target.set_capture(draft.target_layer_ids())?;
    let mut batch = if paged {
        // Room for every request's context and a full verify past it, each rounded up to whole
        // pages (a page holds at most 2,048 positions of Qwen3-8B's rows).
        let b = CudaBatch::paged(target, most, most * (ctx + 2 * (block + 1) + 2048))?;
        let budget = b.kv_budget().ok_or_else(|| anyhow::anyhow!("paged caches without a budget"))?;
        draft.reserve_sequences_paged(most, budget)?;
        eprintln!("bench: paged K/V, {} pages of {} positions", budget.pages, budget.page);
        b
    } else {
        draft.reserve_sequences(most)?;
        CudaBatch::new(target, most)?
    };
    let mut drafts = CudaDrafts::new(draft);
    let mut seqs: Vec<(SeqId, SeqId, u32)> = Vec::with_capacity(most);
    eprintln!("bench: {most} requests of {ctx} positions");
    for _ in 0..most {
        let (tid, did) = (batch.open()?, drafts.open()?);
        let prompt: Vec<u32> = (0..ctx).map(|_| token()).collect();
        let f = batch.forward_batch(&[(tid, &prompt, LogitRows::Last)])?.remove(0);
        drafts.append_captured(did, &f.captured)?;
        seqs.push((tid, did, f.ids[0]));
    }
    let alpha = alpha_for(TAU, block);
    let survival: Vec<f32> = (1..=block).map(|i| alpha.powi(i as i32) as f32).collect();
    let committed = |k: usize| 1.0 + (1..=k).map(|i| alpha.powi(i as i32)).sum::<f64>();
    let mut rows = Vec::new();
    for &r in levels {
        let active = &seqs[..r];
        // The cost table: a round's forward at k + 1 rows per request, k = 0..=block.
        let mut at_k = Vec::with_capacity(block + 1);
        for k in 0..=block {
            at_k.push(time_rounds(&mut batch, &mut drafts, active, &[vec![k; r]], ctx, iters.min(8))?[0].round);
        }
        let seconds = (r..=r * (block + 1))
            .map(|b| {
                let (lo, frac) = ((b - r) / r, ((b - r) % r) as f64 / r as f64);
                let hi = (lo + 1).min(block);
                1e-6 * (at_k[lo] + frac * (at_k[hi] - at_k[lo]))
            })
            .collect::<Vec<_>>();
        // verify_budget indexes the table by total tokens from 1: pad below r with the first.
        let mut table = vec![seconds[0]; r - 1];
        table.extend(seconds);
        // As a start-up measurement is taken: a shorter forward timed above a longer one is noise.
        let costs = CostTable { seconds: table }.envelope();
        let survivals: Vec<&[f32]> = vec![survival.as_slice(); r];
        let budget = dspark_spec::verify_budget(&survivals, &vec![block; r], &costs);
        // Both policies' rounds alternate, so drift in the GPU's clocks or the host touches both.
        let policies: [(&str, Vec<usize>); 2] = [("full", vec![block; r]), ("budget", budget)];
        let kss: Vec<Vec<usize>> = policies.iter().map(|p| p.1.clone()).collect();
        let times = time_rounds(&mut batch, &mut drafts, active, &kss, ctx, iters)?;
        for ((policy, ks), t) in policies.into_iter().zip(times) {
            let us = t.round;
            let tokens: f64 = ks.iter().map(|&k| committed(k)).sum();
            let verify_rows = ks.iter().map(|k| k + 1).sum();
            let one_sequence_micros = match verify_rows <= CHUNK {
                true => Some(time_one_sequence(&mut batch, active[0].0, verify_rows, ctx, iters, token)?),
                false => None,
            };
            rows.push(ConcurrencyRow {
                weights: weights.into(),
                requests: r,
                ctx,
                policy: policy.into(),
                verify_rows,
                round_micros: us,
                draft_micros: t.draft,
                target_micros: t.target,
                one_sequence_micros,
                tokens_per_round: tokens,
                aggregate_tokens_per_s: tokens / us * 1e6,
                per_request_tokens_per_s: tokens / r as f64 / us * 1e6,
            });
        }
    }
    let active = &seqs[..most];
    let full = rows.iter().find(|r| r.requests == most && r.policy == "full");
    let (draft_us, target_us) = full.map_or((0.0, 0.0), |r| (r.draft_micros, r.target_micros));
    gpu.set_profiling(true)?;
    let items: Vec<(SeqId, u32)> = active.iter().map(|&(_, did, anchor)| (did, anchor)).collect();
    let proposals = drafts.propose_batch(&items)?;
    let sfx = if weights == "bf16" { String::new() } else { format!("_{weights}") };
    let draft_profile = profile(gpu, &format!("batched_draft_{most}{sfx}"), ctx, draft_us)?;
    let inputs: Vec<Vec<u32>> = active
        .iter()
        .zip(&proposals)
        .map(|(&(_, _, anchor), p)| std::iter::once(anchor).chain(p.tokens.iter().copied()).collect())
        .collect();
    let forward: Vec<(SeqId, &[u32], LogitRows)> =
        active.iter().zip(&inputs).map(|(&(tid, ..), rows)| (tid, rows.as_slice(), LogitRows::All)).collect();
    batch.forward_batch(&forward)?;
    let target_profile = profile(gpu, &format!("batched_target_{most}{sfx}"), ctx, target_us)?;
    gpu.set_profiling(false)?;
    for &(tid, did, _) in active {
        batch.truncate(tid, ctx)?;
        drafts.with(did, |d| d.truncate_context(ctx))?;
    }
    Ok((rows, vec![draft_profile, target_profile]))
}

/// Median µs of a round and of its two halves.
struct RoundTimes {
    round: f64,
    draft: f64,
    target: f64,
}

/// Median µs of the target's forward over `rows` rows of sequence `tid` alone (one segment),
/// rolled back to `ctx` after each.
fn time_one_sequence(
    batch: &mut CudaBatch,
    tid: SeqId,
    rows: usize,
    ctx: usize,
    iters: usize,
    token: &mut dyn FnMut() -> u32,
) -> Result<f64> {
    let input: Vec<u32> = (0..rows).map(|_| token()).collect();
    let mut xs = Vec::with_capacity(iters);
    for i in 0..iters + 2 {
        let t = Instant::now();
        batch.forward_batch(&[(tid, &input, LogitRows::All)])?;
        if i >= 2 {
            xs.push(t.elapsed().as_secs_f64() * 1e6);
        }
        batch.truncate(tid, ctx)?;
    }
    Ok(median(&mut xs))
}

/// Median µs of batched rounds (after 2 warm-up rounds of each) for each policy of `policies`,
/// where request i verifies `ks[i]` drafts; the policies' rounds alternate.
fn time_rounds(
    batch: &mut CudaBatch,
    drafts: &mut CudaDrafts,
    active: &[(SeqId, SeqId, u32)],
    policies: &[Vec<usize>],
    ctx: usize,
    iters: usize,
) -> Result<Vec<RoundTimes>> {
    if let Some(ks) = policies.iter().find(|ks| ks.len() != active.len()) {
        bail!("{} verify lengths for {} requests", ks.len(), active.len());
    }
    // The captures each request appends at the start of a round (from the round before, which
    // may be the other policy's: device captures last only until the next forward).
    let mut pending = Vec::new();
    let mut samples: Vec<[Vec<f64>; 3]> = vec![Default::default(); policies.len()];
    for i in 0..iters + 2 {
        for (ks, sample) in policies.iter().zip(samples.iter_mut()) {
            let t = Instant::now();
            for (&(_, did, _), p) in active.iter().zip(&pending) {
                drafts.append_captured(did, p)?;
            }
            let items: Vec<(SeqId, u32)> = active.iter().map(|&(_, did, anchor)| (did, anchor)).collect();
            let proposals = drafts.propose_batch(&items)?;
            let drafted = t.elapsed();
            let inputs: Vec<Vec<u32>> = active
                .iter()
                .zip(&proposals)
                .zip(ks)
                .map(|((&(_, _, anchor), p), &k)| {
                    std::iter::once(anchor).chain(p.tokens[..k].iter().copied()).collect()
                })
                .collect();
            let forward: Vec<(SeqId, &[u32], LogitRows)> =
                active.iter().zip(&inputs).map(|(&(tid, ..), rows)| (tid, rows.as_slice(), LogitRows::All)).collect();
            let out = batch.forward_batch(&forward)?;
            let verified = t.elapsed();
            pending = out.iter().zip(ks).map(|(g, &k)| g.captured.prefix(COMMITTED.min(k + 1), 0)).collect();
            for &(tid, did, _) in active {
                batch.truncate(tid, ctx)?;
                drafts.with(did, |d| d.truncate_context(ctx))?;
            }
            if i >= 2 {
                sample[0].push(t.elapsed().as_secs_f64() * 1e6);
                sample[1].push(drafted.as_secs_f64() * 1e6);
                sample[2].push((verified - drafted).as_secs_f64() * 1e6);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|[mut xs, mut ds, mut ts]| RoundTimes {
            round: median(&mut xs),
            draft: median(&mut ds),
            target: median(&mut ts),
        })
        .collect())
}

/// The report's table: each row against one request's full-block round at the same context.
pub fn markdown(rows: &[ConcurrencyRow]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "\n### Batched rounds (`--concurrency`; acceptance modelled at τ = {TAU} a full block)\n");
    let _ = writeln!(
        s,
        "| weights | requests | ctx | policy | verify rows | round µs | draft µs | target µs | target, same rows as one sequence µs | tokens / round | aggregate tok/s | per-request tok/s | aggregate ÷ 1 request's | per request ÷ 1 request's |"
    );
    let _ = writeln!(s, "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let single = rows
            .iter()
            .find(|o| o.requests == 1 && o.ctx == r.ctx && o.policy == "full" && o.weights == r.weights)
            .map(|o| o.aggregate_tokens_per_s);
        let ratio = |x: f64| single.map_or("—".to_string(), |one| format!("{:.2}×", x / one));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.2} | {:.0} | {:.0} | {} | {} |",
            r.weights,
            r.requests,
            r.ctx,
            r.policy,
            r.verify_rows,
            r.round_micros,
            r.draft_micros,
            r.target_micros,
            r.one_sequence_micros.map_or("—".to_string(), |u| format!("{u:.0}")),
            r.tokens_per_round,
            r.aggregate_tokens_per_s,
            r.per_request_tokens_per_s,
            ratio(r.aggregate_tokens_per_s),
            ratio(r.per_request_tokens_per_s),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_gives_tau_for_a_full_block() {
        for (tau, block) in [(3.5, 7), (2.0, 4), (6.0, 7)] {
            let a = alpha_for(tau, block);
            let committed = 1.0 + (1..=block).map(|i| a.powi(i as i32)).sum::<f64>();
            assert!((committed - tau).abs() < 1e-9, "τ {tau}, block {block}: α {a} commits {committed}");
        }
    }
}
