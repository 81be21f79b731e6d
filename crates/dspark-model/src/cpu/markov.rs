//! DSpark's sequential heads: the Markov logit bias and the confidence head (DSPARK.md §3).
//!
//! The draft backbone produces base logits `U_s` for all block slots in one parallel pass. The
//! Markov head then adds a bias that depends on the token chosen for the previous slot, so
//! tokens are picked left to right (greedy):
//!
//! ```text
//! prev = anchor
//! for s in 0..B:  Z_s = U_s + bias(prev, h_s);  d_s = argmax Z_s;  prev = d_s
//! ```
//!
//! with `e = W1[prev]` (row of `markov_w1`, length r) and, per variant,
//! * vanilla: `bias = W2 · e`
//! * gated:   `g = σ(G · [h_s ; e] + b_G)`, `bias = W2 · (g ⊙ e)`
//! * rnn:     `z = [state ; e ; h_s]`, `(g, c, o) = split₃(J · z + b_J)`,
//!   `state ← σ(g) ⊙ state + (1 − σ(g)) ⊙ tanh(c)`, `bias = W2 · tanh(o)` (state starts at 0)
//!
//! where `W2 = markov_w2.weight` is `[V, r]`, so `W2 · e` is one dot product per vocabulary row.
//! The confidence head scores each slot: `logit_s = w · [h_s ; e(prev_s)] + b` (or `w · h_s + b`
//! without the Markov input), `c_s = σ(logit_s)` estimating P(d_s accepted | earlier accepted).

use dspark_kernels::cpu::argmax::argmax;
use dspark_kernels::cpu::matmul::linear;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The per-variant parameters beyond W1 and W2.
#[derive(Clone, Debug)]
pub enum MarkovVariant {
    Vanilla,
    /// `gate_proj`: weight `[r, H + r]`, bias `[r]`.
    Gated {
        weight: Vec<f32>,
        bias: Vec<f32>,
    },
    /// `joint_proj`: weight `[3r, 2r + H]`, bias `[3r]`.
    Rnn {
        weight: Vec<f32>,
        bias: Vec<f32>,
    },
}

/// A Markov head of rank `r` over a vocabulary of `V`.
#[derive(Clone, Debug)]
pub struct MarkovHead {
    pub rank: usize,
    /// `markov_w1.weight`, `[V, r]`: the embedding of the previous token.
    pub w1: Vec<f32>,
    /// `markov_w2.weight`, `[V, r]`.
    pub w2: Vec<f32>,
    pub variant: MarkovVariant,
}

/// The confidence head: a biased linear map to one logit per slot.
#[derive(Clone, Debug)]
pub struct ConfidenceHead {
    /// `confidence_head.proj.weight` flattened, length `H` or `H + r`.
    pub weight: Vec<f32>,
    pub bias: f32,
    /// Whether the input is `[h_s ; W1[prev]]` rather than `h_s` alone.
    pub with_markov: bool,
}

/// Result of the left-to-right greedy chain over one block.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    /// `d_1 .. d_B`.
    pub tokens: Vec<u32>,
    /// `[B, V]` logits after the Markov bias (equal to the base logits without a head).
    pub logits: Vec<f32>,
    /// `[B]` pre-sigmoid confidence logits; empty without a confidence head.
    pub confidence_logits: Vec<f32>,
}

impl MarkovHead {
    fn embed(&self, token: u32) -> &[f32] {
        &self.w1[token as usize * self.rank..][..self.rank]
    }

    /// `W2 · v` for a length-r vector `v`: one value per vocabulary row.
    fn project(&self, v: &[f32]) -> Vec<f32> {
        let vocab = self.w2.len() / self.rank;
        linear(v, &self.w2, 1, self.rank, vocab)
    }
}

/// Runs the greedy chain of DSPARK.md §3.2 over `rows` slots of base logits `[rows, V]` and
/// final-norm hiddens `[rows, H]`.
pub fn greedy_chain(
    base_logits: &[f32],
    hidden: &[f32],
    rows: usize,
    anchor: u32,
    markov: Option<&MarkovHead>,
    confidence: Option<&ConfidenceHead>,
) -> Chain {
    chain_with(base_logits, hidden, rows, anchor, markov, confidence, &mut |z| argmax(z) as u32)
}

/// The chain of [`greedy_chain`] with the token of each slot picked by `pick` from the slot's
/// final logits `Z_s` (Markov bias included), left to right: `pick` = argmax is the greedy
/// chain; a draw from the sampler's transform of `Z_s` is DeepSpec's sampled chain
/// (`sample_block_tokens`). The picked token feeds the next slot's bias and confidence.
pub fn chain_with(
    base_logits: &[f32],
    hidden: &[f32],
    rows: usize,
    anchor: u32,
    markov: Option<&MarkovHead>,
    confidence: Option<&ConfidenceHead>,
    pick: &mut dyn FnMut(&[f32]) -> u32,
) -> Chain {
    assert!(
        rows > 0 && base_logits.len().is_multiple_of(rows) && hidden.len().is_multiple_of(rows),
        "greedy_chain: ragged input"
    );
    let vocab = base_logits.len() / rows;
    let h_dim = hidden.len() / rows;
    let mut out =
        Chain { tokens: Vec::with_capacity(rows), logits: base_logits.to_vec(), confidence_logits: Vec::new() };
    let mut prev = anchor;
    let mut state = markov.map(|m| vec![0f32; m.rank]).unwrap_or_default();
    for s in 0..rows {
        let h_s = &hidden[s * h_dim..][..h_dim];
        let z = &mut out.logits[s * vocab..][..vocab];
        if let Some(m) = markov {
            let e = m.embed(prev);
            let r = m.rank;
            let bias = match &m.variant {
                MarkovVariant::Vanilla => m.project(e),
                MarkovVariant::Gated { weight, bias } => {
                    let input: Vec<f32> = h_s.iter().chain(e).copied().collect();
                    let g = linear(&input, weight, 1, input.len(), r);
                    let gated: Vec<f32> = g.iter().zip(bias).zip(e).map(|((g, b), e)| sigmoid(g + b) * e).collect();
                    m.project(&gated)
                }
                MarkovVariant::Rnn { weight, bias } => {
                    let input: Vec<f32> = state.iter().chain(e).chain(h_s).copied().collect();
                    let mut j = linear(&input, weight, 1, input.len(), 3 * r);
                    j.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
                    let (g, rest) = j.split_at(r);
                    let (c, o) = rest.split_at(r);
                    for i in 0..r {
                        let gi = sigmoid(g[i]);
                        state[i] = gi * state[i] + (1.0 - gi) * c[i].tanh();
                    }
                    let out: Vec<f32> = o.iter().map(|v| v.tanh()).collect();
                    m.project(&out)
                }
            };
            z.iter_mut().zip(&bias).for_each(|(a, b)| *a += b);
        }
        if let Some(c) = confidence {
            let mut logit = c.bias + c.weight[..h_dim].iter().zip(h_s).map(|(w, x)| w * x).sum::<f32>();
            if c.with_markov {
                if let Some(m) = markov {
                    logit += c.weight[h_dim..].iter().zip(m.embed(prev)).map(|(w, x)| w * x).sum::<f32>();
                }
            }
            out.confidence_logits.push(logit);
        }
        let d = pick(z);
        out.tokens.push(d);
        prev = d;
    }
    out
}

/// Prefix survival `a_s = Π_{i ≤ s} σ(logit_i)`: the probability that slots `0..=s` are all
/// accepted, under the head's conditional estimates.
pub fn prefix_survival(confidence_logits: &[f32]) -> Vec<f32> {
    let mut acc = 1.0f32;
    confidence_logits
        .iter()
        .map(|&l| {
            acc *= sigmoid(l);
            acc
        })
        .collect()
}
