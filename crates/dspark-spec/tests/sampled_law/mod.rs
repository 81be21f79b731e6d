//! Shared by the sampled-decoding tests: a toy DSpark-shaped target/draft pair with hand-set
//! tables, the exact law of a target's first tokens by enumeration, and Pearson's chi-square.

#![allow(dead_code)]

use dspark_model::backend::{SampleRow, SampledProposal};
use dspark_model::checkpoint::config::Qwen3Config;
use dspark_model::testing::{target_config, Rng};
use dspark_model::{Drafter, Error, Forward, LogitRows, Proposal, Result, TargetModel};
use dspark_spec::sampled::{speculative_sampled_with_fault, Fault};
use dspark_spec::sampler::{transform, SamplingParams};
use dspark_spec::{sample, DraftLaw, GenerateOptions, VerifyLen};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// A target over a vocabulary of `V` whose next-token logits are a table of the last two tokens
/// of the prefix (prompt and generated alike) and of the position's parity. Its "captured layer"
/// is one float per position: the token there, which the toy draft reads as its context.
pub struct ToyTarget {
    cfg: Qwen3Config,
    v: usize,
    hist: Vec<u32>,
    /// `[2 (parity), V (prev2), V (prev1), V]`.
    table: Vec<f32>,
    capture: bool,
}

impl ToyTarget {
    pub fn new(seed: u64, v: usize, spread: f32) -> ToyTarget {
        let mut rng = Rng(seed);
        ToyTarget {
            cfg: target_config(v, 1, 1, 1, 1, 1, 64),
            v,
            hist: Vec::new(),
            table: rng.normal_vec(2 * v * v * v, spread),
            capture: false,
        }
    }

    /// The logits after `prefix` (its last token at position `prefix.len() − 1`).
    pub fn logits_after(&self, prefix: &[u32]) -> &[f32] {
        let n = prefix.len();
        let p1 = prefix[n - 1] as usize;
        let p2 = if n >= 2 { prefix[n - 2] as usize } else { 0 };
        let v = self.v;
        &self.table[((n % 2 * v + p2) * v + p1) * v..][..v]
    }
}

impl TargetModel for ToyTarget {
    fn config(&self) -> &Qwen3Config {
        &self.cfg
    }
    fn len(&self) -> usize {
        self.hist.len()
    }
    fn max_len(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.hist.len() {
            return Err(Error::Request("truncate past the end".into()));
        }
        self.hist.truncate(len);
        Ok(())
    }
    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        self.capture = !layers.is_empty();
        Ok(())
    }
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        if tokens.is_empty() || self.hist.len() + tokens.len() > self.max_len() {
            return Err(Error::Request("bad toy forward".into()));
        }
        let mut logits = Vec::new();
        let mut captured = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            self.hist.push(t);
            if rows == LogitRows::All || i + 1 == tokens.len() {
                logits.extend_from_slice(self.logits_after(&self.hist));
            }
            if self.capture {
                captured.push(t as f32);
            }
        }
        let rows = if rows == LogitRows::All { tokens.len() } else { 1 };
        Ok(Forward { logits, rows, captured })
    }
}

/// A DSpark-shaped draft: slot s's base logits are a table of (the last committed token, the
/// anchor, s) — they never see in-block tokens — plus a Markov bias that is a table of the
/// previous slot's token; the confidence is a table of the previous token too.
pub struct ToyDraft {
    v: usize,
    b: usize,
    ctx: Vec<u32>,
    /// `[V (ctx last), V (anchor), B, V]`.
    base: Vec<f32>,
    /// `[V (prev), V]`.
    mark: Vec<f32>,
    /// `[V (prev)]` confidence logits.
    conf: Vec<f32>,
    taps: Vec<usize>,
}

impl ToyDraft {
    pub fn new(seed: u64, v: usize, b: usize, spread: f32, markov: f32) -> ToyDraft {
        let mut rng = Rng(seed);
        ToyDraft {
            v,
            b,
            ctx: Vec::new(),
            base: rng.normal_vec(v * v * b * v, spread),
            mark: rng.normal_vec(v * v, markov),
            conf: rng.normal_vec(v, 1.5),
            taps: vec![0],
        }
    }

    fn chain(&self, anchor: u32, pick: &mut dyn FnMut(&[f32]) -> u32) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        let v = self.v;
        let last = self.ctx.last().copied().unwrap_or(0) as usize;
        let base = &self.base[(last * v + anchor as usize) * self.b * v..][..self.b * v];
        let (mut prev, mut tokens, mut survival, mut acc) = (anchor as usize, Vec::new(), Vec::new(), 1f32);
        for s in 0..self.b {
            let z: Vec<f32> = base[s * v..][..v].iter().zip(&self.mark[prev * v..][..v]).map(|(a, b)| a + b).collect();
            acc *= 1.0 / (1.0 + (-self.conf[prev]).exp());
            survival.push(acc);
            let d = pick(&z);
            tokens.push(d);
            prev = d as usize;
        }
        (tokens, survival, base.to_vec())
    }
}

impl Drafter for ToyDraft {
    fn block_size(&self) -> usize {
        self.b
    }
    fn target_layer_ids(&self) -> &[usize] {
        &self.taps
    }
    fn context_len(&self) -> usize {
        self.ctx.len()
    }
    fn reset(&mut self) {
        self.ctx.clear();
    }
    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        self.ctx.extend(features.iter().map(|&f| f as u32));
        Ok(())
    }
    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let (tokens, survival, _) = self.chain(anchor, &mut |z| dspark_kernels::cpu::argmax::argmax(z) as u32);
        Ok(Proposal { tokens, survival: Some(survival) })
    }
    fn can_sample_block(&self) -> bool {
        true
    }
    fn propose_sampled(&mut self, anchor: u32, sample_row: &mut SampleRow<'_>) -> Result<SampledProposal> {
        let mut q = Vec::new();
        let (tokens, survival, base) = self.chain(anchor, &mut |z| {
            let (d, row) = sample_row(z);
            q.push(row);
            d
        });
        Ok(SampledProposal { tokens, q, survival: Some(survival), base_logits: Some(base) })
    }
}

/// The exact law of the first `len` generated tokens (a shorter sequence where it ends in an
/// eos), from the target alone: one forward per prefix, in f64 from its f32 logits.
pub fn exact_law<T: TargetModel + ?Sized>(
    target: &mut T,
    prompt: &[u32],
    len: usize,
    params: &SamplingParams,
    eos: &[u32],
) -> BTreeMap<Vec<u32>, f64> {
    let vocab = target.config().vocab_size;
    let mut law = BTreeMap::new();
    let mut frontier: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 1.0)];
    while let Some((seq, prob)) = frontier.pop() {
        if seq.len() == len || seq.last().is_some_and(|t| eos.contains(t)) {
            law.insert(seq, prob);
            continue;
        }
        target.truncate(0).unwrap();
        let input: Vec<u32> = prompt.iter().chain(&seq).copied().collect();
        let f = target.forward(&input, LogitRows::Last).unwrap();
        let p = transform(params, f.row(0, vocab));
        for (t, &pt) in p.iter().enumerate() {
            if pt > 0.0 {
                let mut next = seq.clone();
                next.push(t as u32);
                frontier.push((next, prob * pt));
            }
        }
    }
    target.truncate(0).unwrap();
    law
}

/// Pearson's chi-square of observed sequences against a law.
#[derive(Debug)]
pub struct ChiSquare {
    pub n: usize,
    pub cells: usize,
    pub stat: f64,
    pub df: usize,
    pub p_value: f64,
    /// Observations the law gives probability 0.
    pub impossible: usize,
}

impl ChiSquare {
    /// Cells with expected count ≥ 5 each, the rest pooled into one cell.
    pub fn new(law: &BTreeMap<Vec<u32>, f64>, observed: &BTreeMap<Vec<u32>, usize>) -> ChiSquare {
        let n: usize = observed.values().sum();
        let impossible = observed.iter().filter(|(k, _)| !law.contains_key(*k)).map(|(_, c)| c).sum();
        let (mut stat, mut cells) = (0.0, 0usize);
        let (mut pool_e, mut pool_o) = (0.0, 0.0);
        for (k, &p) in law {
            let e = p * n as f64;
            let o = *observed.get(k).unwrap_or(&0) as f64;
            if e >= 5.0 {
                stat += (o - e) * (o - e) / e;
                cells += 1;
            } else {
                pool_e += e;
                pool_o += o;
            }
        }
        if pool_e > 0.0 {
            stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
            cells += 1;
        }
        let df = cells.saturating_sub(1).max(1);
        ChiSquare { n, cells, stat, df, p_value: gamma_q(df as f64 / 2.0, stat / 2.0), impossible }
    }

    /// Consistent with the law at α = 1e-4, with no impossible outcome.
    pub fn passes(&self) -> bool {
        self.impossible == 0 && self.p_value > 1e-4
    }
}

fn ln_gamma(x: f64) -> f64 {
    // Lanczos, g = 7, n = 9.
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let t = x + 7.5;
    let mut a = C[0];
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised upper incomplete gamma Q(a, x) (Numerical Recipes' gammq).
pub fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut ap, mut sum) = (a, 1.0 / a);
        let mut del = sum;
        for _ in 0..10_000 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if del.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-15 {
                break;
            }
        }
        front * h
    }
}

/// How a run is generated for the law test.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Plain,
    Spec(DraftLaw, Fault),
}

/// Runs `n` generations with seeds `seed0 ..` and counts their first `len` tokens.
#[allow(clippy::too_many_arguments)]
pub fn observe<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    len: usize,
    params: &SamplingParams,
    verify: &VerifyLen,
    eos: &[u32],
    mode: Mode,
    n: usize,
    seed0: u64,
) -> BTreeMap<Vec<u32>, usize> {
    // B tokens more than counted, so rounds verify whole blocks and cross into the next.
    let opts =
        GenerateOptions { max_tokens: len + draft.block_size().max(2), eos_token_ids: eos.to_vec(), logprobs: None };
    let mut counts = BTreeMap::new();
    for i in 0..n {
        let params = SamplingParams { seed: seed0 + i as u64, ..*params };
        let g = match mode {
            Mode::Plain => sample(target, prompt, &opts, &params, |_| ControlFlow::Continue(())),
            Mode::Spec(law, fault) => {
                speculative_sampled_with_fault(target, draft, prompt, &opts, verify, &params, law, fault, |_| {
                    ControlFlow::Continue(())
                })
            }
        }
        .unwrap();
        let key: Vec<u32> = g.tokens[..len.min(g.tokens.len())].to_vec();
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

/// Samples for the law: ~400 expected per cell with mass, within bounds.
pub fn runs_for(law: &BTreeMap<Vec<u32>, f64>, per_cell: usize, lo: usize, hi: usize) -> usize {
    (law.len() * per_cell).clamp(lo, hi)
}
