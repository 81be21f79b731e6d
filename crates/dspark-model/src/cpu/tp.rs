//! The tensor-parallel reference (issue #32): a Qwen3 target split over N ranks as
//! [`crate::tp`] plans it, the ranks run one after another on the CPU, with the collectives as
//! plain sums in rank order. It defines what a multi-GPU run must compute: the same shards, the
//! same partial sums, the same reduction order, the same argmax gather.
//!
//! ```text
//! x = all_reduce_r(embed_r(ids))                     (the owning rank's rows; exact)
//! per layer, each rank r:  q, k, v of its heads (CpuQwen3's attention_inputs on its slices)
//!                          o_r = attention over its KV cache;  p_r = o_proj[:, heads(r)] · o_r
//!          x += all_reduce_r(p_r)
//!          each rank r:    d_r = down[:, ff(r)] · swiglu(gate_r u, up_r u),  u = RMSNorm_post(x)
//!          x += all_reduce_r(d_r)
//! logits_r = lm_head[vocab(r)] · RMSNorm(x);  ids = gather_argmax(argmax of each rank's rows)
//! ```
//!
//! At N = 1 every op is [`CpuQwen3`]'s own on the same inputs, so logits and tokens are its bits
//! (tests/tp.rs). `forward` (full logits, for sampling and logprobs) concatenates the ranks'
//! logits — on GPUs an all-gather of `[rows, V/N]`; `forward_greedy` gathers only each row's
//! candidates, so no rank holds the whole vocabulary's logits.

use crate::backend::{check_capture, check_forward, check_truncate, Captured, Forward, Greedy, LogitRows, TargetModel};
use crate::checkpoint::config::Qwen3Config;
use crate::cpu::kv_cache::KvCache;
use crate::cpu::qwen3::{CpuQwen3, LayerWeights, Qwen3Weights};
use crate::error::Result;
use crate::tp::{all_reduce, gather_argmax, take_cols, take_rows, TpShard};
use dspark_kernels::cpu::activation::swiglu_inplace;
use dspark_kernels::cpu::argmax::{argmax, argmax_rows};
use dspark_kernels::cpu::attention::{attention_rows, AttnShape, Mask};
use dspark_kernels::cpu::matmul::linear;
use dspark_kernels::cpu::rmsnorm::rmsnorm;
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::KvDtype;

/// One rank: its shard, its layers' slices, its vocabulary rows and its KV cache.
struct Rank {
    shard: TpShard,
    /// The config its layers see (its heads, KV heads and intermediate size).
    cfg: Qwen3Config,
    layers: Vec<LayerWeights>,
    embed: Vec<f32>,
    head: Vec<f32>,
    kv: KvCache,
}

/// A Qwen3 target split over N ranks (see the module docs).
pub struct CpuQwen3Tp {
    cfg: Qwen3Config,
    norm: Vec<f32>,
    inv_freq: Vec<f32>,
    ranks: Vec<Rank>,
    capture: Vec<usize>,
}

impl CpuQwen3Tp {
    /// Splits `w` over `n` ranks (an error naming what `n` does not divide), each with a KV
    /// cache of `kv` elements.
    pub fn new(cfg: Qwen3Config, w: &Qwen3Weights, n: usize, kv: KvDtype) -> Result<CpuQwen3Tp> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let ranks = TpShard::plan(&cfg, n)?
            .into_iter()
            .map(|s| {
                let lc = s.layer_config(&cfg);
                let (q, kvr) = (s.heads.start * hd..s.heads.end * hd, s.kv_heads.start * hd..s.kv_heads.end * hd);
                let layers = w
                    .layers
                    .iter()
                    .map(|l| LayerWeights {
                        input_layernorm: l.input_layernorm.clone(),
                        q_proj: take_rows(&l.q_proj, h, q.clone()),
                        k_proj: take_rows(&l.k_proj, h, kvr.clone()),
                        v_proj: take_rows(&l.v_proj, h, kvr.clone()),
                        o_proj: take_cols(&l.o_proj, cfg.q_dim(), q.clone()),
                        q_norm: l.q_norm.clone(),
                        k_norm: l.k_norm.clone(),
                        post_attention_layernorm: l.post_attention_layernorm.clone(),
                        gate_proj: take_rows(&l.gate_proj, h, s.ff.clone()),
                        up_proj: take_rows(&l.up_proj, h, s.ff.clone()),
                        down_proj: take_cols(&l.down_proj, cfg.intermediate_size, s.ff.clone()),
                    })
                    .collect();
                let kv = KvCache::with_dtype(cfg.num_hidden_layers, lc.kv_dim(), kv);
                Rank {
                    embed: take_rows(&w.embed_tokens, h, s.vocab.clone()),
                    head: take_rows(w.head(), h, s.vocab.clone()),
                    cfg: lc,
                    layers,
                    kv,
                    shard: s,
                }
            })
            .collect();
        let inv_freq = inv_freq(cfg.rope_theta as f32, cfg.head_dim);
        Ok(CpuQwen3Tp { norm: w.norm.clone(), inv_freq, ranks, capture: Vec::new(), cfg })
    }

    /// The same weights split over `n` ranks, from a loaded single-rank model.
    pub fn split(model: &CpuQwen3, n: usize, kv: KvDtype) -> Result<CpuQwen3Tp> {
        Self::new(model.config().clone(), model.weights(), n, kv)
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// The hidden states after every layer (`[rows, H]`, replicated on every rank), the final
    /// norm applied to the rows from `first_row` on.
    fn hidden(&mut self, tokens: &[u32], first_row: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = &self.cfg;
        check_forward(c, self.len(), self.max_len(), tokens)?;
        let (n, h, eps) = (tokens.len(), c.hidden_size, c.rms_norm_eps as f32);
        let first_pos = self.len();
        let positions: Vec<usize> = (first_pos..first_pos + n).collect();
        let t = self.capture.len();
        let mut captured = vec![0f32; n * t * h];
        for r in &mut self.ranks {
            r.kv.reserve(n)?;
        }
        // Embedding: each rank has its vocabulary's rows, zeros for the others' tokens.
        let embeds = self.ranks.iter().map(|r| {
            let mut x = vec![0f32; n * h];
            for (row, &tok) in x.chunks_exact_mut(h).zip(tokens) {
                if r.shard.vocab.contains(&(tok as usize)) {
                    row.copy_from_slice(&r.embed[(tok as usize - r.shard.vocab.start) * h..][..h]);
                }
            }
            x
        });
        let mut x = all_reduce(embeds.collect());
        for l in 0..c.num_hidden_layers {
            let partials = self.ranks.iter_mut().map(|r| {
                let (lw, lc) = (&r.layers[l], &r.cfg);
                let (q, k, v) = lw.attention_inputs(lc, &x, &positions, &self.inv_freq);
                r.kv.append(l, &k, &v);
                let (kc, vc) = r.kv.layer(l);
                let shape = AttnShape {
                    rows: n,
                    kv_len: first_pos + n,
                    n_heads: lc.num_attention_heads,
                    n_kv_heads: lc.num_key_value_heads,
                    head_dim: lc.head_dim,
                };
                let o = attention_rows(&q, &kc, &vc, shape, Mask::Causal { first_pos });
                linear(&o, &lw.o_proj, n, lc.q_dim(), h)
            });
            let attn_out = all_reduce(partials.collect());
            x.iter_mut().zip(&attn_out).for_each(|(a, b)| *a += b);
            let partials = self.ranks.iter().map(|r| {
                let (lw, lc) = (&r.layers[l], &r.cfg);
                let u = rmsnorm(&x, &lw.post_attention_layernorm, eps);
                let mut g = linear(&u, &lw.gate_proj, n, h, lc.intermediate_size);
                let up = linear(&u, &lw.up_proj, n, h, lc.intermediate_size);
                swiglu_inplace(&mut g, &up);
                linear(&g, &lw.down_proj, n, lc.intermediate_size, h)
            });
            let mlp_out = all_reduce(partials.collect());
            x.iter_mut().zip(&mlp_out).for_each(|(a, b)| *a += b);
            for (slot, _) in self.capture.iter().enumerate().filter(|(_, &cl)| cl == l) {
                for r in 0..n {
                    captured[(r * t + slot) * h..][..h].copy_from_slice(&x[r * h..][..h]);
                }
            }
        }
        for r in &mut self.ranks {
            r.kv.commit(n);
        }
        Ok((rmsnorm(&x[first_row * h..], &self.norm, eps), captured))
    }

    /// Each rank's logits of the normed rows `hn` (`[rows, V/N]` each).
    fn rank_logits(&self, hn: &[f32]) -> Vec<Vec<f32>> {
        let (h, rows) = (self.cfg.hidden_size, hn.len() / self.cfg.hidden_size);
        self.ranks.iter().map(|r| linear(hn, &r.head, rows, h, r.shard.vocab.len())).collect()
    }
}

fn first_row(rows: LogitRows, n: usize) -> usize {
    match rows {
        LogitRows::All => 0,
        LogitRows::Last => n.saturating_sub(1),
    }
}

impl TargetModel for CpuQwen3Tp {
    fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    fn len(&self) -> usize {
        self.ranks.first().map_or(0, |r| r.kv.len())
    }

    fn max_len(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        check_truncate(self.len(), len)?;
        self.ranks.iter_mut().for_each(|r| r.kv.truncate(len));
        Ok(())
    }

    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        check_capture(&self.cfg, layers)?;
        self.capture = layers.to_vec();
        Ok(())
    }

    fn prefill_chunk(&self) -> usize {
        crate::cpu::PREFILL_CHUNK
    }

    /// Full logits: each rank's `[rows, V/N]` concatenated along the vocabulary (an all-gather);
    /// prompts in chunks, as `CpuQwen3`'s.
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        check_forward(&self.cfg, self.len(), self.max_len(), tokens)?;
        crate::cpu::forward_chunked(tokens, rows, |chunk, rows| self.forward_one(chunk, rows))
    }

    /// Ids from each rank's per-row candidate (its best value and global index), gathered; a
    /// prompt longer than a chunk through `forward` (whose argmax the gather equals exactly).
    fn forward_greedy(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Greedy> {
        if tokens.len() > crate::cpu::PREFILL_CHUNK {
            let f = self.forward(tokens, rows)?;
            let ids = argmax_rows(&f.logits, self.cfg.vocab_size).into_iter().map(|i| i as u32).collect();
            return Ok(Greedy { ids, captured: Captured::Host(f.captured) });
        }
        let first = first_row(rows, tokens.len());
        let (hn, captured) = self.hidden(tokens, first)?;
        let candidates: Vec<Vec<(f32, usize)>> = self
            .rank_logits(&hn)
            .iter()
            .zip(&self.ranks)
            .map(|(p, r)| {
                p.chunks_exact(r.shard.vocab.len())
                    .map(|row| {
                        let i = argmax(row);
                        (row[i], r.shard.vocab.start + i)
                    })
                    .collect()
            })
            .collect();
        Ok(Greedy { ids: gather_argmax(&candidates), captured: Captured::Host(captured) })
    }
}

impl CpuQwen3Tp {
    /// One forward of at most a chunk.
    fn forward_one(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        let first = first_row(rows, tokens.len());
        let (hn, captured) = self.hidden(tokens, first)?;
        let out_rows = tokens.len() - first;
        let parts = self.rank_logits(&hn);
        let mut logits = Vec::with_capacity(out_rows * self.cfg.vocab_size);
        for row in 0..out_rows {
            for (r, p) in self.ranks.iter().zip(&parts) {
                let w = r.shard.vocab.len();
                logits.extend_from_slice(&p[row * w..][..w]);
            }
        }
        Ok(Forward { logits, rows: out_rows, captured })
    }
}
