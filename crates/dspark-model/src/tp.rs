//! Tensor parallelism (issue #32): how a Qwen3 target splits over N ranks, Megatron-style —
//! the plan every backend follows ([`crate::cpu::tp`] is its reference).
//!
//! ```text
//! rank r of N holds                                   after it, the ranks
//! embed_tokens rows  vocab(r)                         all-reduce: the owner's row, zeros elsewhere (exact)
//! q_proj rows of heads(r), k/v rows of kv_heads(r)    — (attention over its own heads and KV cache)
//! o_proj columns of heads(r)                          all-reduce: Σ_r partial → x += o
//! gate/up rows ff(r), down columns ff(r)              all-reduce: Σ_r partial → x += mlp
//! lm_head rows vocab(r)                               all-gather (max, index) per row → the argmax
//! every RMSNorm weight, whole
//! ```
//!
//! Whole KV heads go to a rank (its query heads are exactly the ones that read them, so
//! attention needs no communication and each rank's KV cache is 1/N of the whole). N must divide
//! the KV heads and the intermediate size; the vocabulary splits into N ranges differing by at
//! most one row. The all-reduce sums the ranks' partials in rank order, so at N = 1 every value
//! is the unsplit model's, bit for bit; at N > 1 the o and down sums are split in N parts, which
//! moves the last bits (the CPU reference's logits stay within 1e-4 of N = 1 on the fixtures;
//! tests/tp.rs). The argmax gather is exact: each rank's candidate is the largest value of its
//! range with the lowest index on ties, and the gather keeps the largest with the lowest index.

use crate::{Error, Qwen3Config, Result};
use std::ops::Range;

/// Rank `rank`'s share of a Qwen3 target split over `n` ranks (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpShard {
    pub rank: usize,
    pub n: usize,
    /// Query heads (q_proj rows `heads · head_dim`, o_proj columns likewise).
    pub heads: Range<usize>,
    /// KV heads (k_proj / v_proj rows).
    pub kv_heads: Range<usize>,
    /// Intermediate rows of gate_proj / up_proj, columns of down_proj.
    pub ff: Range<usize>,
    /// Vocabulary rows of embed_tokens and lm_head.
    pub vocab: Range<usize>,
}

impl TpShard {
    /// Every rank's share, or an error naming what `n` does not divide.
    pub fn plan(cfg: &Qwen3Config, n: usize) -> Result<Vec<TpShard>> {
        let (kv, i, v) = (cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size);
        if n == 0 || !kv.is_multiple_of(n) || !i.is_multiple_of(n) || v < n {
            return Err(Error::Request(format!(
                "--tensor-parallel {n}: must divide the {kv} KV heads and the intermediate size {i} (and be at most the vocabulary, {v})"
            )));
        }
        let group = cfg.num_attention_heads / kv;
        let split = |total: usize, r: usize| (total * r / n)..(total * (r + 1) / n);
        Ok((0..n)
            .map(|r| {
                let kv_heads = split(kv, r);
                TpShard {
                    rank: r,
                    n,
                    heads: kv_heads.start * group..kv_heads.end * group,
                    kv_heads,
                    ff: split(i, r),
                    vocab: split(v, r),
                }
            })
            .collect())
    }

    /// The config a rank's layers see: its heads, KV heads and intermediate size (the hidden
    /// size, norms and vocabulary as the whole model's).
    pub fn layer_config(&self, cfg: &Qwen3Config) -> Qwen3Config {
        Qwen3Config {
            num_attention_heads: self.heads.len(),
            num_key_value_heads: self.kv_heads.len(),
            intermediate_size: self.ff.len(),
            ..cfg.clone()
        }
    }
}

/// Rows `rows` of a row-major `[_, cols]` matrix.
pub fn take_rows(m: &[f32], cols: usize, rows: Range<usize>) -> Vec<f32> {
    m[rows.start * cols..rows.end * cols].to_vec()
}

/// Columns `keep` of a row-major `[rows, cols]` matrix, as a `[rows, keep.len()]` one.
pub fn take_cols(m: &[f32], cols: usize, keep: Range<usize>) -> Vec<f32> {
    m.chunks_exact(cols).flat_map(|row| row[keep.clone()].iter().copied()).collect()
}

/// The ranks' partial sums added in rank order (every rank then holds the result).
pub fn all_reduce(partials: Vec<Vec<f32>>) -> Vec<f32> {
    let mut it = partials.into_iter();
    let mut out = it.next().unwrap_or_default();
    for p in it {
        out.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
    }
    out
}

/// Each row's argmax from the ranks' candidates (`(value, global index)` per row, rank-major):
/// the largest value, the lowest index among equals — the argmax of the whole row.
pub fn gather_argmax(candidates: &[Vec<(f32, usize)>]) -> Vec<u32> {
    let rows = candidates.first().map_or(0, Vec::len);
    (0..rows)
        .map(|r| {
            let mut best = (f32::NEG_INFINITY, usize::MAX);
            for c in candidates {
                let (v, i) = c[r];
                if v > best.0 || (v == best.0 && i < best.1) || best.1 == usize::MAX {
                    best = (v, i);
                }
            }
            best.1 as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{gather_argmax, take_cols, TpShard};
    use crate::testing::target_config;

    #[test]
    fn shards_cover_every_head_row_and_token_once() {
        // vocab 97 (not a multiple), 8 query heads over 4 KV heads, intermediate 2·64 + 8 = 136.
        let cfg = target_config(97, 64, 2, 8, 4, 16, 64);
        for n in [1, 2, 4] {
            let plan = TpShard::plan(&cfg, n).map_err(|e| e.to_string());
            let plan = plan.unwrap_or_else(|e| panic!("{e}"));
            let ends = |f: fn(&TpShard) -> std::ops::Range<usize>| {
                plan.windows(2).all(|w| f(&w[0]).end == f(&w[1]).start) && plan.first().map(|s| f(s).start) == Some(0)
            };
            assert!(ends(|s| s.heads.clone()) && ends(|s| s.kv_heads.clone()));
            assert!(ends(|s| s.ff.clone()) && ends(|s| s.vocab.clone()));
            let last = &plan[n - 1];
            assert_eq!((last.heads.end, last.kv_heads.end, last.ff.end, last.vocab.end), (8, 4, 136, 97));
            for s in &plan {
                // Each rank's query heads are exactly those reading its KV heads.
                assert_eq!((s.heads.start, s.heads.end), (2 * s.kv_heads.start, 2 * s.kv_heads.end));
                assert!(s.vocab.len().abs_diff(97 / n) <= 1);
            }
        }
        for bad in [0, 3, 8] {
            let e = TpShard::plan(&cfg, bad).map(|_| ()).map_err(|e| e.to_string());
            assert!(e.is_err_and(|e| e.contains(&format!("--tensor-parallel {bad}"))), "n = {bad}");
        }
        assert_eq!(take_cols(&[1., 2., 3., 4., 5., 6.], 3, 1..3), [2., 3., 5., 6.]);
    }

    #[test]
    fn the_gathered_argmax_is_the_whole_rows_with_ties_to_the_lowest_index() {
        // Row 0: the max (5) in rank 1 and rank 2 → index 4 (rank 1's); row 1: all equal → 0.
        let c = vec![vec![(1.0, 0), (2.0, 0)], vec![(5.0, 4), (2.0, 3)], vec![(5.0, 7), (2.0, 6)]];
        assert_eq!(gather_argmax(&c), [4, 0]);
    }
}
