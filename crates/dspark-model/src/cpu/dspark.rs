//! The DSpark draft on the CPU reference path (DSPARK.md §2).
//!
//! The draft is a stack of Qwen3 decoder layers whose attention sees two things: a projected
//! copy of the target's hidden states for every committed position (the *context*), and the
//! block being drafted. For committed position j with tapped target features `F_j` (the
//! outputs of the `target_layer_ids` layers, concatenated):
//!
//! ```text
//! c_j = RMSNorm_hidden_norm(fc · F_j)                       (once, shared by all layers)
//! K_ctx,ℓ(j) = RoPE_j(k_norm(Wk,ℓ c_j)),  V_ctx,ℓ(j) = Wv,ℓ c_j   (cached, append-only)
//! ```
//!
//! The block input is `embed([anchor, mask × (B−1)])` at positions `p .. p+B−1`, where `p` is
//! the anchor's position and the context holds exactly positions `0 .. p−1`. Each layer runs the
//! normal Qwen3 block on it, with attention over `[K_ctx ; K_blk]` and **no mask** (every slot
//! sees all context and all slots). The block's own K/V are discarded after the pass. Slot `s`
//! of `lm_head(RMSNorm_norm(x))` predicts the token at position `p + s + 1`; the Markov chain
//! in [`crate::cpu::markov`] then picks the tokens left to right.

use crate::backend::{Drafter, Proposal, SampleRow, SampledProposal};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::draft_config::{DraftConfig, MarkovKind, Packaging};
use crate::checkpoint::safetensors::Checkpoint;
use crate::checkpoint::shared_heads::SharedHeads;
use crate::cpu::kv_cache::{KvCache, KvSeq};
use crate::cpu::markov::{chain_with, greedy_chain, prefix_survival, Chain, ConfidenceHead, MarkovHead, MarkovVariant};
use crate::cpu::qwen3::{layer_tensors, LayerWeights, Qwen3Weights};
use crate::error::{Error, Result};
use dspark_kernels::cpu::attention::{attention, AttnShape, Mask};
use dspark_kernels::cpu::matmul::linear;
use dspark_kernels::cpu::rmsnorm::{rmsnorm, rmsnorm_inplace};
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::KvDtype;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// All draft weights, f32.
#[derive(Clone, Debug)]
pub struct DraftWeights {
    /// `[V, H]`: the target's matrix when the draft file has none or its copy is byte for byte
    /// the target's ([`SharedHeads`]), else the draft's own.
    pub embed_tokens: Arc<Vec<f32>>,
    /// `[V, H]`: likewise, against the target's output head.
    pub lm_head: Arc<Vec<f32>>,
    /// Which of the draft's own copies were found equal to the target's and not kept.
    pub shared: SharedHeads,
    /// `[H, T·H]`.
    pub fc: Vec<f32>,
    pub hidden_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    pub markov: Option<MarkovHead>,
    pub confidence: Option<ConfidenceHead>,
}

/// Every tensor a draft of this config must hold (name, shape), besides the optional
/// `embed_tokens` / `lm_head` copies. Names are as on disk (no `model.` prefix).
pub fn draft_tensors(cfg: &DraftConfig) -> Vec<(String, Vec<usize>)> {
    let l = &cfg.layer;
    let (h, v, r) = (l.hidden_size, l.vocab_size, cfg.markov_rank);
    let mut out = vec![
        ("fc.weight".to_string(), vec![h, cfg.num_taps() * h]),
        ("hidden_norm.weight".to_string(), vec![h]),
        ("norm.weight".to_string(), vec![h]),
    ];
    for i in 0..l.num_hidden_layers {
        for (name, shape) in layer_tensors(l) {
            out.push((format!("layers.{i}.{name}"), shape));
        }
    }
    if r > 0 {
        out.push(("markov_head.markov_w1.weight".into(), vec![v, r]));
        out.push(("markov_head.markov_w2.weight".into(), vec![v, r]));
        match cfg.markov_kind {
            MarkovKind::Vanilla => {}
            MarkovKind::Gated => {
                out.push(("markov_head.gate_proj.weight".into(), vec![r, h + r]));
                out.push(("markov_head.gate_proj.bias".into(), vec![r]));
            }
            MarkovKind::Rnn => {
                out.push(("markov_head.joint_proj.weight".into(), vec![3 * r, 2 * r + h]));
                out.push(("markov_head.joint_proj.bias".into(), vec![3 * r]));
            }
        }
    }
    if cfg.confidence_head {
        out.push(("confidence_head.proj.weight".into(), vec![1, cfg.confidence_in()]));
    }
    out
}

/// The tensors a draft may hold besides [`draft_tensors`].
pub const OPTIONAL_TENSORS: [&str; 3] = ["embed_tokens.weight", "lm_head.weight", "confidence_head.proj.bias"];

/// Checks a draft checkpoint against its config without reading weights. Every tensor the
/// config implies must be present with its shape and a supported dtype, and every tensor present
/// must be one the config implies: a partly matching draft would run with near-zero acceptance
/// and no error (DSPARK.md §1.7), so it is refused.
pub fn check_tensors(cfg: &DraftConfig, ck: &Checkpoint) -> Result<()> {
    let (h, v) = (cfg.layer.hidden_size, cfg.layer.vocab_size);
    let required = draft_tensors(cfg);
    let mut allowed: BTreeMap<&str, ()> = required.iter().map(|(n, _)| (n.as_str(), ())).collect();
    for optional in OPTIONAL_TENSORS {
        allowed.insert(optional, ());
    }
    if let Some(extra) = ck.tensors.keys().find(|n| !allowed.contains_key(n.as_str())) {
        return Err(Error::tensor(
            ck.path_of(extra),
            extra,
            format!(
                "unexpected in a draft with markov_rank {}, markov_head_type {:?}, confidence head {} (wrong config or wrong checkpoint?)",
                cfg.markov_rank, cfg.markov_kind, cfg.confidence_head
            ),
        ));
    }
    for (name, shape) in &required {
        ck.check(name, shape)?;
    }
    for name in ["embed_tokens.weight", "lm_head.weight"] {
        if ck.contains(name) {
            ck.check(name, &[v, h])?;
        }
    }
    if ck.contains("confidence_head.proj.bias") {
        ck.check("confidence_head.proj.bias", &[1])?;
    }
    Ok(())
}

impl DraftWeights {
    /// Loads a draft checkpoint after [`check_tensors`]. `embed_tokens` / `lm_head` are taken
    /// from the draft when present, else from `target` (the same matrices, not copies).
    pub fn load(cfg: &DraftConfig, ck: &Checkpoint, target: &Qwen3Weights) -> Result<DraftWeights> {
        DraftWeights::load_sharing(cfg, ck, target, SharedHeads::default())
    }

    /// [`DraftWeights::load`], also using the target's matrices for the draft's own copies that
    /// `shared` found equal to them.
    pub fn load_sharing(
        cfg: &DraftConfig,
        ck: &Checkpoint,
        target: &Qwen3Weights,
        shared: SharedHeads,
    ) -> Result<DraftWeights> {
        let l = &cfg.layer;
        let (h, v, r) = (l.hidden_size, l.vocab_size, cfg.markov_rank);
        check_tensors(cfg, ck)?;
        let own = |name: &str, share: bool| -> Result<Option<Arc<Vec<f32>>>> {
            if ck.contains(name) && !share {
                Ok(Some(Arc::new(ck.f32(name, &[v, h])?)))
            } else {
                Ok(None)
            }
        };
        let embed_tokens =
            own("embed_tokens.weight", shared.embed_tokens)?.unwrap_or_else(|| target.embed_tokens.clone());
        let lm_head = own("lm_head.weight", shared.lm_head)?.unwrap_or_else(|| target.head().clone());
        let markov = if r > 0 {
            let variant = match cfg.markov_kind {
                MarkovKind::Vanilla => MarkovVariant::Vanilla,
                MarkovKind::Gated => MarkovVariant::Gated {
                    weight: ck.f32("markov_head.gate_proj.weight", &[r, h + r])?,
                    bias: ck.f32("markov_head.gate_proj.bias", &[r])?,
                },
                MarkovKind::Rnn => MarkovVariant::Rnn {
                    weight: ck.f32("markov_head.joint_proj.weight", &[3 * r, 2 * r + h])?,
                    bias: ck.f32("markov_head.joint_proj.bias", &[3 * r])?,
                },
            };
            Some(MarkovHead {
                rank: r,
                w1: ck.f32("markov_head.markov_w1.weight", &[v, r])?,
                w2: ck.f32("markov_head.markov_w2.weight", &[v, r])?,
                variant,
            })
        } else {
            None
        };
        let confidence = if cfg.confidence_head {
            let bias = if ck.contains("confidence_head.proj.bias") {
                ck.f32("confidence_head.proj.bias", &[1])?[0]
            } else {
                0.0
            };
            Some(ConfidenceHead {
                weight: ck.f32("confidence_head.proj.weight", &[1, cfg.confidence_in()])?,
                bias,
                with_markov: cfg.confidence_with_markov,
            })
        } else {
            None
        };
        Ok(DraftWeights {
            embed_tokens,
            lm_head,
            shared,
            fc: ck.f32("fc.weight", &[h, cfg.num_taps() * h])?,
            hidden_norm: ck.f32("hidden_norm.weight", &[h])?,
            layers: (0..l.num_hidden_layers)
                .map(|i| LayerWeights::load(l, ck, &format!("layers.{i}.")))
                .collect::<Result<Vec<_>>>()?,
            norm: ck.f32("norm.weight", &[h])?,
            markov,
            confidence,
        })
    }
}

/// The draft backbone's output for one block, before the sequential chain.
#[derive(Clone, Debug)]
pub struct BlockOutput {
    /// `[B, H]` after the draft's final norm.
    pub hidden: Vec<f32>,
    /// `[B, V]` = `lm_head · hidden`.
    pub base_logits: Vec<f32>,
}

/// A DSpark draft computed on the CPU in f32, with its append-only context cache.
pub struct CpuDraft {
    cfg: DraftConfig,
    w: DraftWeights,
    inv_freq: Vec<f32>,
    /// Per layer, context keys / values (rows `[kv_heads, head_dim]`), paged as the target's.
    ctx: KvCache,
    /// What the keys and values attention reads are rounded to (`--kv-cache`; the GPU draft
    /// rounds its context rows and its block's rows as it caches them).
    kv: KvDtype,
}

impl CpuDraft {
    /// Loads a draft folder (native or speculators packaging) and checks it against the target.
    pub fn load(dir: &Path, target_cfg: &Qwen3Config, target: &Qwen3Weights) -> Result<CpuDraft> {
        let cfg = DraftConfig::from_dir(dir)?;
        cfg.validate_against(target_cfg)?;
        let ck = Checkpoint::open_dir(dir)?;
        let w = DraftWeights::load(&cfg, &ck, target)?;
        Ok(Self::new(cfg, w))
    }

    pub fn new(cfg: DraftConfig, w: DraftWeights) -> CpuDraft {
        let inv_freq = inv_freq(cfg.layer.rope_theta as f32, cfg.layer.head_dim);
        let ctx = KvCache::new(cfg.layer.num_hidden_layers, cfg.layer.kv_dim());
        CpuDraft { cfg, w, inv_freq, ctx, kv: KvDtype::F32 }
    }

    /// The same draft with its keys and values rounded to `kv` (an empty context, as at
    /// construction): the CPU reference of the GPU draft under `--kv-cache bf16`.
    pub fn with_kv_dtype(mut self, kv: KvDtype) -> CpuDraft {
        self.ctx = KvCache::with_dtype(self.cfg.layer.num_hidden_layers, self.cfg.layer.kv_dim(), kv);
        self.kv = kv;
        self
    }

    /// The same draft with its sequences' contexts in exactly `pages` pages of `page` positions,
    /// allocated now (`--kv-capacity`, as the target's; the element type kept, the context
    /// empty).
    pub fn with_kv_pages(mut self, page: usize, pages: usize) -> Result<CpuDraft> {
        let l = &self.cfg.layer;
        self.ctx = KvCache::bounded(l.num_hidden_layers, l.kv_dim(), self.kv, page, pages)?;
        Ok(self)
    }

    /// Bytes the K/V storage takes now (all of it, for a bounded pool).
    pub fn kv_bytes(&self) -> usize {
        self.ctx.bytes()
    }

    /// The context pool: (positions a page holds, pages free, pages in all).
    pub fn kv_pages(&self) -> (usize, usize, usize) {
        self.ctx.pages()
    }

    /// `x` as the cache keeps it.
    fn cached(&self, mut x: Vec<f32>) -> Vec<f32> {
        x.iter_mut().for_each(|v| *v = self.kv.keep(*v));
        x
    }

    pub fn config(&self) -> &DraftConfig {
        &self.cfg
    }

    pub fn weights(&self) -> &DraftWeights {
        &self.w
    }

    /// The parallel pass over the block `[anchor, mask × (B−1)]` at positions
    /// `ctx_len .. ctx_len + B`.
    pub fn block(&self, anchor: u32) -> Result<BlockOutput> {
        let l = &self.cfg.layer;
        let (b, h, v) = (self.cfg.block_size, l.hidden_size, l.vocab_size);
        if anchor as usize >= v {
            return Err(Error::Request(format!("anchor token {anchor} is outside the vocabulary ({v})")));
        }
        let p = self.ctx.len();
        let positions: Vec<usize> = (p..p + b).collect();
        let mut x = Vec::with_capacity(b * h);
        for s in 0..b {
            let id = if s == 0 { anchor } else { self.cfg.mask_token_id } as usize;
            x.extend_from_slice(&self.w.embed_tokens[id * h..][..h]);
        }
        let kv_row = l.kv_dim();
        for (i, lw) in self.w.layers.iter().enumerate() {
            let (q, k, vv) = lw.attention_inputs(l, &x, &positions, &self.inv_freq);
            let (k, vv) = (self.cached(k), self.cached(vv));
            let (mut keys, mut values) = self.ctx.gather(i, p, b);
            keys.extend_from_slice(&k);
            values.extend_from_slice(&vv);
            debug_assert_eq!(keys.len(), (p + b) * kv_row);
            let shape = AttnShape {
                rows: b,
                kv_len: p + b,
                n_heads: l.num_attention_heads,
                n_kv_heads: l.num_key_value_heads,
                head_dim: l.head_dim,
            };
            let o = attention(&q, &keys, &values, shape, Mask::None);
            lw.finish(l, &mut x, &o);
        }
        let hidden = rmsnorm(&x, &self.w.norm, l.rms_norm_eps as f32);
        let base_logits = linear(&hidden, &self.w.lm_head, b, h, v);
        Ok(BlockOutput { hidden, base_logits })
    }

    /// Backbone pass plus the greedy Markov chain and confidence head.
    pub fn propose_detailed(&self, anchor: u32) -> Result<(BlockOutput, Chain)> {
        let out = self.block(anchor)?;
        let chain = greedy_chain(
            &out.base_logits,
            &out.hidden,
            self.cfg.block_size,
            anchor,
            self.w.markov.as_ref(),
            self.w.confidence.as_ref(),
        );
        Ok((out, chain))
    }

    /// Packaging the draft was loaded from.
    pub fn packaging(&self) -> Packaging {
        self.cfg.packaging
    }
}

/// A sequence's state is its view of the draft's context cache (pages and length); a closed
/// sequence's pages go back to the pool.
impl crate::batch::SeqState for CpuDraft {
    type State = KvSeq;

    fn new_state(&mut self) -> Result<KvSeq> {
        Ok(self.ctx.new_seq())
    }

    fn swap_state(&mut self, state: &mut KvSeq) {
        self.ctx.swap_seq(state);
    }

    fn release_state(&mut self, state: KvSeq) {
        self.ctx.release_seq(state);
    }

    fn kv_budget(&self) -> Option<crate::batch::KvBudget> {
        self.ctx.budget()
    }
}

impl Drafter for CpuDraft {
    fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    fn target_layer_ids(&self) -> &[usize] {
        &self.cfg.target_layer_ids
    }

    fn shared_with_target(&self) -> usize {
        let l = &self.cfg.layer;
        self.w.shared.count() * l.vocab_size * l.hidden_size * std::mem::size_of::<f32>()
    }

    fn context_len(&self) -> usize {
        self.ctx.len()
    }

    fn reset(&mut self) {
        self.ctx.truncate(0);
    }

    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        let n = self.cfg.feature_rows(features.len())?;
        let l = &self.cfg.layer;
        let (h, t) = (l.hidden_size, self.cfg.num_taps());
        if n == 0 {
            return Ok(());
        }
        let mut c = linear(features, &self.w.fc, n, t * h, h);
        rmsnorm_inplace(&mut c, &self.w.hidden_norm, l.rms_norm_eps as f32);
        let first = self.ctx.len();
        let positions: Vec<usize> = (first..first + n).collect();
        self.ctx.reserve(n)?;
        for (i, lw) in self.w.layers.iter().enumerate() {
            // Context rows go straight into k/v: no input_layernorm (DSPARK.md §2.2).
            let mut k = linear(&c, &lw.k_proj, n, h, l.kv_dim());
            let v = linear(&c, &lw.v_proj, n, h, l.kv_dim());
            rmsnorm_inplace(&mut k, &lw.k_norm, l.rms_norm_eps as f32);
            dspark_kernels::cpu::rope::rope_inplace(&mut k, &positions, l.num_key_value_heads, &self.inv_freq);
            // The cache rounds them to its element type as they are appended.
            self.ctx.append(i, &k, &v);
        }
        self.ctx.commit(n);
        Ok(())
    }

    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let (_, chain) = self.propose_detailed(anchor)?;
        let survival =
            if chain.confidence_logits.is_empty() { None } else { Some(prefix_survival(&chain.confidence_logits)) };
        Ok(Proposal { tokens: chain.tokens, survival })
    }

    fn can_sample_block(&self) -> bool {
        true
    }

    /// The sampled chain: slot s's logits `lm_head(h_s) + bias(d_{s-1})` (what the greedy
    /// chain computes before its argmax, `d_0` = the anchor) go to `sample_row`, whose token
    /// feeds the next slot and whose distribution is kept as `q_s`.
    fn propose_sampled(&mut self, anchor: u32, sample_row: &mut SampleRow<'_>) -> Result<SampledProposal> {
        let out = self.block(anchor)?;
        let mut q = Vec::with_capacity(self.cfg.block_size);
        let chain = chain_with(
            &out.base_logits,
            &out.hidden,
            self.cfg.block_size,
            anchor,
            self.w.markov.as_ref(),
            self.w.confidence.as_ref(),
            &mut |z| {
                let (d, row) = sample_row(z);
                q.push(row);
                d
            },
        );
        let survival =
            if chain.confidence_logits.is_empty() { None } else { Some(prefix_survival(&chain.confidence_logits)) };
        Ok(SampledProposal { tokens: chain.tokens, q, survival, base_logits: Some(out.base_logits) })
    }
}
