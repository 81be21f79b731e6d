//! The Qwen3 decoder on the CPU reference path.
//!
//! Math per layer (pre-norm, as transformers' `Qwen3DecoderLayer`):
//!
//! ```text
//! u = RMSNorm_in(x)
//! q = RoPE(q_norm(heads(Wq u)))   k = RoPE(k_norm(heads(Wk u)))   v = heads(Wv u)
//! x = x + Wo · attention(q, K_cache ∪ k, V_cache ∪ v)              (causal, GQA)
//! x = x + down(silu(gate(RMSNorm_post(x))) ⊙ up(RMSNorm_post(x)))
//! ```
//!
//! then `logits = lm_head(RMSNorm_final(x))`, where `lm_head` is the embedding matrix when
//! `tie_word_embeddings` is set. Every weight is widened to f32 at load and every op runs in
//! f32, whatever the on-disk dtype; this path is the engine's oracle, so it favours plain code
//! over speed, except that projections go through the multithreaded `gemm` in
//! `dspark_kernels::cpu::matmul` so that real checkpoints remain usable.

use crate::backend::{check_capture, check_forward, check_truncate, Forward, LogitRows, TargetModel};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::safetensors::Checkpoint;
use crate::cpu::kv_cache::{KvCache, KvSeq};
use crate::error::Result;
use dspark_kernels::cpu::activation::swiglu_inplace;
use dspark_kernels::cpu::attention::{attention_rows, AttnShape, Mask};
use dspark_kernels::cpu::matmul::linear;
use dspark_kernels::cpu::rmsnorm::{rmsnorm, rmsnorm_inplace};
use dspark_kernels::cpu::rope::{inv_freq, rope_inplace};
use dspark_kernels::KvDtype;
use std::path::Path;
use std::sync::Arc;

/// Weights of one decoder layer, f32, PyTorch `[out, in]` layout.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub input_layernorm: Vec<f32>,
    pub q_proj: Vec<f32>,
    pub k_proj: Vec<f32>,
    pub v_proj: Vec<f32>,
    pub o_proj: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    pub gate_proj: Vec<f32>,
    pub up_proj: Vec<f32>,
    pub down_proj: Vec<f32>,
}

/// All weights of a Qwen3 causal LM.
#[derive(Clone, Debug)]
pub struct Qwen3Weights {
    /// Shared (`Arc`) so a draft can use the same matrix instead of a copy.
    pub embed_tokens: Arc<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `None` when the output projection is tied to `embed_tokens`.
    pub lm_head: Option<Arc<Vec<f32>>>,
}

/// The tensors of one decoder layer (name suffix after the layer prefix, shape), in the order
/// [`LayerWeights::from_tensors`] takes them. The DSpark draft's layers use the same names.
pub fn layer_tensors(cfg: &Qwen3Config) -> Vec<(&'static str, Vec<usize>)> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    vec![
        ("input_layernorm.weight", vec![h]),
        ("self_attn.q_proj.weight", vec![q, h]),
        ("self_attn.k_proj.weight", vec![kv, h]),
        ("self_attn.v_proj.weight", vec![kv, h]),
        ("self_attn.o_proj.weight", vec![h, q]),
        ("self_attn.q_norm.weight", vec![hd]),
        ("self_attn.k_norm.weight", vec![hd]),
        ("post_attention_layernorm.weight", vec![h]),
        ("mlp.gate_proj.weight", vec![i, h]),
        ("mlp.up_proj.weight", vec![i, h]),
        ("mlp.down_proj.weight", vec![h, i]),
    ]
}

/// Every tensor `Qwen3ForCausalLM` reads, with its shape, in load order.
pub fn expected_tensors(cfg: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_hidden_layers {
        for (name, shape) in layer_tensors(cfg) {
            out.push((format!("model.layers.{l}.{name}"), shape));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    out
}

impl LayerWeights {
    /// The projection named as in the checkpoint (`self_attn.q_proj.weight`, …), for writers of
    /// test checkpoints.
    pub fn linear_mut(&mut self, name: &str) -> Option<&mut Vec<f32>> {
        Some(match name {
            "self_attn.q_proj.weight" => &mut self.q_proj,
            "self_attn.k_proj.weight" => &mut self.k_proj,
            "self_attn.v_proj.weight" => &mut self.v_proj,
            "self_attn.o_proj.weight" => &mut self.o_proj,
            "mlp.gate_proj.weight" => &mut self.gate_proj,
            "mlp.up_proj.weight" => &mut self.up_proj,
            "mlp.down_proj.weight" => &mut self.down_proj,
            _ => return None,
        })
    }

    /// Loads the layer under `prefix` (e.g. `model.layers.3.`), checking every tensor.
    pub fn load(cfg: &Qwen3Config, ck: &Checkpoint, prefix: &str) -> Result<LayerWeights> {
        let mut t = layer_tensors(cfg)
            .into_iter()
            .map(|(name, shape)| {
                // FP8 checkpoints: the projections dequantized by their block scales (W8A16).
                let linear = name.ends_with("_proj.weight");
                match &cfg.quantization {
                    Some(q) if linear => q.load_linear(
                        ck,
                        &format!("{prefix}{}", name.trim_end_matches(".weight")),
                        (shape[0], shape[1]),
                    ),
                    _ => ck.f32(&format!("{prefix}{name}"), &shape),
                }
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        // `layer_tensors` lists the fields in declaration order.
        let mut next = move || t.next().unwrap_or_default();
        Ok(LayerWeights {
            input_layernorm: next(),
            q_proj: next(),
            k_proj: next(),
            v_proj: next(),
            o_proj: next(),
            q_norm: next(),
            k_norm: next(),
            post_attention_layernorm: next(),
            gate_proj: next(),
            up_proj: next(),
            down_proj: next(),
        })
    }

    /// First half of a decoder layer: `u = RMSNorm_in(x)`, then q, k (per-head norm + RoPE at
    /// `positions`) and v. Returns `(q, k, v)`, each `[rows, heads, head_dim]`.
    pub fn attention_inputs(
        &self,
        cfg: &Qwen3Config,
        x: &[f32],
        positions: &[usize],
        inv_freq: &[f32],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (n, h, eps) = (positions.len(), cfg.hidden_size, cfg.rms_norm_eps as f32);
        let u = rmsnorm(x, &self.input_layernorm, eps);
        let mut q = linear(&u, &self.q_proj, n, h, cfg.q_dim());
        let mut k = linear(&u, &self.k_proj, n, h, cfg.kv_dim());
        let v = linear(&u, &self.v_proj, n, h, cfg.kv_dim());
        rmsnorm_inplace(&mut q, &self.q_norm, eps);
        rmsnorm_inplace(&mut k, &self.k_norm, eps);
        rope_inplace(&mut q, positions, cfg.num_attention_heads, inv_freq);
        rope_inplace(&mut k, positions, cfg.num_key_value_heads, inv_freq);
        (q, k, v)
    }

    /// Second half: `x += Wo·o`, then `x += down(silu(gate(u)) ⊙ up(u))` with
    /// `u = RMSNorm_post(x)`. `o` is the attention output `[rows, heads · head_dim]`.
    pub fn finish(&self, cfg: &Qwen3Config, x: &mut [f32], o: &[f32]) {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
        let n = x.len() / h;
        let attn_out = linear(o, &self.o_proj, n, cfg.q_dim(), h);
        x.iter_mut().zip(&attn_out).for_each(|(a, b)| *a += b);
        let u = rmsnorm(x, &self.post_attention_layernorm, eps);
        let mut g = linear(&u, &self.gate_proj, n, h, cfg.intermediate_size);
        let up = linear(&u, &self.up_proj, n, h, cfg.intermediate_size);
        swiglu_inplace(&mut g, &up);
        let mlp_out = linear(&g, &self.down_proj, n, cfg.intermediate_size, h);
        x.iter_mut().zip(&mlp_out).for_each(|(a, b)| *a += b);
    }
}

impl Qwen3Weights {
    /// Loads every tensor of [`expected_tensors`] from `ck`, checking names, shapes and dtypes.
    pub fn load(cfg: &Qwen3Config, ck: &Checkpoint) -> Result<Qwen3Weights> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed_tokens = Arc::new(ck.f32("model.embed_tokens.weight", &[v, h])?);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| LayerWeights::load(cfg, ck, &format!("model.layers.{l}.")))
            .collect::<Result<Vec<_>>>()?;
        let norm = ck.f32("model.norm.weight", &[h])?;
        crate::checkpoint::config::check_tied_head(cfg, ck.contains("lm_head.weight"))?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(Arc::new(ck.f32("lm_head.weight", &[v, h])?)) };
        Ok(Qwen3Weights { embed_tokens, layers, norm, lm_head })
    }

    /// The output head: `lm_head`, or the embedding when tied.
    pub fn head(&self) -> &Arc<Vec<f32>> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }
}

/// A Qwen3 target computed on the CPU in f32.
pub struct CpuQwen3 {
    cfg: Qwen3Config,
    w: Qwen3Weights,
    inv_freq: Vec<f32>,
    kv: KvCache,
    capture: Vec<usize>,
}

impl CpuQwen3 {
    /// Loads `config.json` and the safetensors weights from an HF model folder.
    pub fn load(dir: &Path) -> Result<CpuQwen3> {
        let cfg = Qwen3Config::from_dir(dir)?;
        let ck = Checkpoint::open_dir(dir)?;
        let w = Qwen3Weights::load(&cfg, &ck)?;
        Ok(Self::new(cfg, w))
    }

    pub fn new(cfg: Qwen3Config, w: Qwen3Weights) -> CpuQwen3 {
        let inv_freq = inv_freq(cfg.rope_theta as f32, cfg.head_dim);
        let kv = KvCache::new(cfg.num_hidden_layers, cfg.kv_dim());
        CpuQwen3 { cfg, w, inv_freq, kv, capture: Vec::new() }
    }

    /// The same model with a KV cache of element type `kv` (empty, as at construction): the
    /// CPU reference of the GPU's `--kv-cache bf16`.
    pub fn with_kv_dtype(mut self, kv: KvDtype) -> CpuQwen3 {
        self.kv = KvCache::with_dtype(self.cfg.num_hidden_layers, self.cfg.kv_dim(), kv);
        self
    }

    /// The same model with its sequences' K/V in exactly `pages` pages of `page` positions,
    /// allocated now (`--kv-capacity`; the element type kept, the cache empty).
    pub fn with_kv_pages(mut self, page: usize, pages: usize) -> Result<CpuQwen3> {
        self.kv = KvCache::bounded(self.cfg.num_hidden_layers, self.cfg.kv_dim(), self.kv.dtype(), page, pages)?;
        Ok(self)
    }

    /// Bytes the K/V storage takes now (all of it, for a bounded pool).
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// The K/V pool: (positions a page holds, pages free, pages in all).
    pub fn kv_pages(&self) -> (usize, usize, usize) {
        self.kv.pages()
    }

    pub fn weights(&self) -> &Qwen3Weights {
        &self.w
    }
}

/// A sequence's state is its view of the KV cache (its pages and length): `batch::Sequences`
/// swaps it in, and a closed sequence's pages go back to the pool.
impl crate::batch::SeqState for CpuQwen3 {
    type State = KvSeq;

    fn new_state(&mut self) -> Result<KvSeq> {
        Ok(self.kv.new_seq())
    }

    fn swap_state(&mut self, state: &mut KvSeq) {
        self.kv.swap_seq(state);
    }

    fn release_state(&mut self, state: KvSeq) {
        self.kv.release_seq(state);
    }

    fn kv_budget(&self) -> Option<crate::batch::KvBudget> {
        self.kv.budget()
    }
}

impl TargetModel for CpuQwen3 {
    fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    fn len(&self) -> usize {
        self.kv.len()
    }

    fn max_len(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        check_truncate(self.kv.len(), len)?;
        self.kv.truncate(len);
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

    /// Prompts longer than [`crate::cpu::PREFILL_CHUNK`] run as consecutive chunks.
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        check_forward(&self.cfg, self.kv.len(), self.max_len(), tokens)?;
        crate::cpu::forward_chunked(tokens, rows, |chunk, rows| self.forward_one(chunk, rows))
    }
}

impl CpuQwen3 {
    /// One forward of at most [`crate::cpu::PREFILL_CHUNK`] tokens.
    fn forward_one(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        let c = &self.cfg;
        let (n, h, eps) = (tokens.len(), c.hidden_size, c.rms_norm_eps as f32);
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let first_pos = self.kv.len();
        let positions: Vec<usize> = (first_pos..first_pos + n).collect();
        let t = self.capture.len();
        let mut captured = vec![0f32; n * t * h];

        self.kv.reserve(n)?;
        let mut x: Vec<f32> = Vec::with_capacity(n * h);
        for &tok in tokens {
            x.extend_from_slice(&self.w.embed_tokens[tok as usize * h..][..h]);
        }

        for (l, lw) in self.w.layers.iter().enumerate() {
            let (q, k, v) = lw.attention_inputs(c, &x, &positions, &self.inv_freq);
            self.kv.append(l, &k, &v);
            let (kc, vc) = self.kv.layer(l);
            let shape = AttnShape { rows: n, kv_len: first_pos + n, n_heads: nh, n_kv_heads: nkv, head_dim: hd };
            let o = attention_rows(&q, &kc, &vc, shape, Mask::Causal { first_pos });
            lw.finish(c, &mut x, &o);

            for (slot, _) in self.capture.iter().enumerate().filter(|(_, &cl)| cl == l) {
                for r in 0..n {
                    captured[(r * t + slot) * h..][..h].copy_from_slice(&x[r * h..][..h]);
                }
            }
        }
        self.kv.commit(n);

        let first_row = match rows {
            LogitRows::All => 0,
            LogitRows::Last => n - 1,
        };
        let out_rows = n - first_row;
        let hn = rmsnorm(&x[first_row * h..], &self.w.norm, eps);
        let head = self.w.lm_head.as_ref().unwrap_or(&self.w.embed_tokens);
        let logits = linear(&hn, head, out_rows, h, c.vocab_size);
        Ok(Forward { logits, rows: out_rows, captured })
    }
}
