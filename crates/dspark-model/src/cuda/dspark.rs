//! The DSpark draft on the GPU, behind the same [`Drafter`] trait as the CPU reference
//! (math in [`crate::cpu::dspark`] and [`crate::cpu::markov`]).
//!
//! Per layer the K/V cache holds `max_len` context rows plus `B` block rows: each round the
//! block's keys are written just past the context and attention reads context + block with no
//! mask; the next round overwrites them, which is how the block K/V are "discarded". The Markov
//! chain runs slot by slot on the device — the previous token is read from device memory
//! (the anchor, or the argmax just written for the previous slot) — so only the final draft
//! ids and confidence logits are copied back.

use crate::backend::{Captured, Deferred, DeviceTokens, Drafter, Proposal};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::draft_config::{DraftConfig, MarkovKind};
use crate::checkpoint::safetensors::Checkpoint;
use crate::cpu::dspark::check_tensors;
use crate::cpu::markov::prefix_survival;
use crate::cuda::graphs::StepGraphs;
use crate::cuda::layers::{drv, gpu_err, kv_caches, run_layers, GpuLayer, Scratch};
use crate::cuda::prefill::{DraftPrefill, MAX_DRAFT_PREFILL_ROWS};

mod prefill;
use crate::cuda::qwen3::{handoff_id, CudaQwen3, SharedCapture, SharedTokens, CHUNK};
use crate::cuda::weights::{CheckpointUpload, WeightSource};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaView};
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::cuda::kv_layers::LayerCaches;
use dspark_kernels::cuda::ops::{StepLens, WeightBuf};
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::path::Path;
use std::sync::Arc;

enum Variant {
    Vanilla,
    Gated { weight: CudaSlice<f32>, bias: CudaSlice<f32> },
    Rnn { weight: CudaSlice<f32>, bias: CudaSlice<f32>, state: CudaSlice<f32>, scratch: CudaSlice<f32> },
}

struct Markov {
    rank: usize,
    w1: WeightBuf,
    w2: WeightBuf,
    variant: Variant,
}

struct Confidence {
    weight: CudaSlice<f32>,
    bias: f32,
    with_markov: bool,
}

/// The shape of a draft step, the key of its CUDA graph: appending `rows` context rows from the
/// feature buffer at device address `features`, or a proposal whose attention covers `kv_cap`
/// keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DraftStep {
    Append { rows: usize, features: u64 },
    Propose { kv_cap: usize },
}

/// A DSpark draft on one GPU.
pub struct CudaDraft {
    gpu: Arc<Gpu>,
    pub arena: Arena,
    cfg: DraftConfig,
    max_len: usize,
    embed_tokens: Arc<WeightBuf>,
    lm_head: Arc<WeightBuf>,
    fc: WeightBuf,
    hidden_norm: CudaSlice<f32>,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    markov: Option<Markov>,
    confidence: Option<Confidence>,
    inv_freq: CudaSlice<f32>,
    /// Every layer's K/V cache, with the addresses the one-launch context append reads.
    caches: LayerCaches,
    /// Every layer's k_proj|v_proj rows stacked `[layers · 2·kv, H]` (a device copy of the rows
    /// in `layers`, 84 MB for DSpark-8B): context rows take one projection for all layers.
    ctx_kv: WeightBuf,
    /// Every layer's k_norm, `[layers, head_dim]`.
    ctx_k_norm: CudaSlice<f32>,
    /// `[CHUNK, layers · 2·kv]`: the stacked projection of a chunk of context rows.
    ctx_out: CudaSlice<f32>,
    ctx_len: usize,
    scratch: Scratch,
    /// Host-fed feature rows (taken out while a chunk is projected from it).
    features: Option<CudaSlice<f32>>,
    /// The target's capture buffer, read directly when the loop hands over device rows.
    capture: SharedCapture,
    c: CudaSlice<f32>,
    x: CudaSlice<f32>,
    hidden: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// `[first_pos, kv_len, anchor, mask × (B−1)]`: the step's [`StepLens`] and, for a
    /// proposal, the block's ids.
    step_in: CudaSlice<u32>,
    /// The B chosen tokens, in the buffer the target's verify reads them from.
    tokens: SharedTokens,
    graphs: StepGraphs<DraftStep>,
    e: CudaSlice<f32>,
    u: CudaSlice<f32>,
    conf_logits: CudaSlice<f32>,
    /// The GEMM path for context appends of more than [`CHUNK`] rows (a prompt's), planned when
    /// the target prefills on GEMMs.
    prefill: Option<DraftPrefill>,
    /// The target's prefill capture buffer, read directly for a prompt chunk's rows.
    prefill_capture: Option<SharedCapture>,
}

impl CudaDraft {
    /// Loads a draft folder for `target` (borrowing its embedding / output head when the draft
    /// has none), with a context of `target.max_len()` positions.
    pub fn load(dir: &Path, target: &CudaQwen3) -> Result<CudaDraft> {
        let cfg = DraftConfig::from_dir(dir)?;
        let ck = Checkpoint::open_dir(dir)?;
        check_tensors(&cfg, &ck)?;
        let up = CheckpointUpload::new(&ck, &target.gpu.ctx, 0)?;
        let d = Self::from_source(cfg, &up, target)?;
        up.finish()?;
        Ok(d)
    }

    /// Builds the draft from any [`WeightSource`] (a checkpoint, or random bench weights).
    pub fn from_source(cfg: DraftConfig, ck: &dyn WeightSource, target: &CudaQwen3) -> Result<CudaDraft> {
        use crate::backend::TargetModel;
        let tcfg: &Qwen3Config = target.config();
        cfg.validate_against(tcfg)?;
        let gpu = target.gpu.clone();
        let arena = Arena::new(gpu.stream.clone());
        let l = &cfg.layer;
        let (h, v, r, b) = (l.hidden_size, l.vocab_size, cfg.markov_rank, cfg.block_size);
        if b + 1 > CHUNK {
            return Err(Error::Config {
                path: "config.json".into(),
                field: "block_size".into(),
                msg: format!("{b}: the CUDA draft verifies at most {} drafts per round", CHUNK - 1),
            });
        }
        let own = |name: &str| -> Result<Option<Arc<WeightBuf>>> {
            if ck.contains(name) {
                Ok(Some(Arc::new(ck.matrix(&arena, name, &[v, h])?)))
            } else {
                Ok(None)
            }
        };
        let embed_tokens = own("embed_tokens.weight")?.unwrap_or_else(|| target.embed_tokens.clone());
        let lm_head = match own("lm_head.weight")? {
            Some(w) => w,
            None => target.lm_head.clone().unwrap_or_else(|| target.embed_tokens.clone()),
        };
        let markov = if r > 0 {
            let variant = match cfg.markov_kind {
                MarkovKind::Vanilla => Variant::Vanilla,
                MarkovKind::Gated => Variant::Gated {
                    weight: ck.vector(&arena, "markov_head.gate_proj.weight", &[r, h + r])?,
                    bias: ck.vector(&arena, "markov_head.gate_proj.bias", &[r])?,
                },
                MarkovKind::Rnn => Variant::Rnn {
                    weight: ck.vector(&arena, "markov_head.joint_proj.weight", &[3 * r, 2 * r + h])?,
                    bias: ck.vector(&arena, "markov_head.joint_proj.bias", &[3 * r])?,
                    state: arena.zeros(r).map_err(drv)?,
                    scratch: arena.zeros(3 * r).map_err(drv)?,
                },
            };
            Some(Markov {
                rank: r,
                w1: ck.matrix(&arena, "markov_head.markov_w1.weight", &[v, r])?,
                w2: ck.matrix(&arena, "markov_head.markov_w2.weight", &[v, r])?,
                variant,
            })
        } else {
            None
        };
        let confidence = if cfg.confidence_head {
            let bias = if ck.contains("confidence_head.proj.bias") {
                ck.host("confidence_head.proj.bias", &[1])?[0]
            } else {
                0.0
            };
            Some(Confidence {
                weight: ck.vector(&arena, "confidence_head.proj.weight", &[1, cfg.confidence_in()])?,
                bias,
                with_markov: cfg.confidence_with_markov,
            })
        } else {
            None
        };
        let max_len = target.max_len();
        let kv = l.kv_dim();
        let t = cfg.num_taps();
        let rows = CHUNK.max(b);
        let z = |n: usize| arena.zeros::<f32>(n).map_err(drv);
        let n_layers = l.num_hidden_layers;
        let layers = (0..n_layers)
            .map(|i| GpuLayer::load(&arena, l, ck, &format!("layers.{i}.")))
            .collect::<Result<Vec<_>>>()?;
        let ctx_kv = stack_kv_rows(&arena, &gpu, &layers, (l.q_dim(), kv, h))?;
        let hd = l.head_dim;
        let mut ctx_k_norm = z(n_layers * hd)?;
        for (i, lw) in layers.iter().enumerate() {
            gpu.stream.memcpy_dtod(&lw.k_norm, &mut ctx_k_norm.slice_mut(i * hd..(i + 1) * hd)).map_err(drv)?;
        }
        // The draft's caches take the target's element type (`--kv-cache`).
        let cache_len = (max_len + b) * kv;
        let caches = kv_caches(&arena, target.kv_dtype(), n_layers, cache_len)?;
        let ptrs = (arena.zeros::<u64>(n_layers).map_err(drv)?, arena.zeros::<u64>(n_layers).map_err(drv)?);
        let caches = LayerCaches::new(&gpu, caches, ptrs, kv).map_err(gpu_err)?;
        let fc = ck.matrix(&arena, "fc.weight", &[h, t * h])?;
        let prefill = match target.prefill_blas() {
            Some(blas) if max_len > CHUNK => {
                let rows = max_len.min(MAX_DRAFT_PREFILL_ROWS);
                Some(DraftPrefill::new(&arena, blas, rows, (t, h, n_layers * 2 * kv), &fc, &ctx_kv)?)
            }
            _ => None,
        };
        Ok(CudaDraft {
            prefill_capture: prefill.as_ref().and(target.shared_prefill_capture()),
            prefill,
            fc,
            hidden_norm: ck.vector(&arena, "hidden_norm.weight", &[h])?,
            layers,
            norm: ck.vector(&arena, "norm.weight", &[h])?,
            inv_freq: arena.upload(&inv_freq(l.rope_theta as f32, l.head_dim)).map_err(drv)?,
            caches,
            ctx_kv,
            ctx_k_norm,
            ctx_out: z(CHUNK * n_layers * 2 * kv)?,
            scratch: Scratch::new(&arena, l, rows)?,
            features: Some(z(CHUNK * t * h)?),
            capture: target.shared_capture(),
            c: z(CHUNK * h)?,
            x: z(rows * h)?,
            hidden: z(b * h)?,
            logits: z(b * v)?,
            step_in: arena.zeros::<u32>(2 + b).map_err(drv)?,
            graphs: StepGraphs::new(),
            tokens: target.shared_tokens(),
            e: z((b * r).max(1))?,
            u: z(r.max(1))?,
            conf_logits: z(b)?,
            gpu,
            arena,
            cfg,
            max_len,
            embed_tokens,
            lm_head,
            markov,
            confidence,
            ctx_len: 0,
        })
    }

    pub fn config(&self) -> &DraftConfig {
        &self.cfg
    }

    /// Keeps context positions `0..len` (the draft-side rollback; the bench uses it to hold the
    /// context length fixed across timed rounds).
    pub fn truncate_context(&mut self, len: usize) -> Result<()> {
        if len > self.ctx_len {
            return Err(Error::Request(format!("cannot truncate a {}-position draft context to {len}", self.ctx_len)));
        }
        self.ctx_len = len;
        Ok(())
    }

    /// Bytes of the matrices one round streams: (fc, decoder layers, lm_head, Markov W2).
    /// W2 is read once per sequential Markov step, so a round streams it `block_size` times.
    pub fn matrix_bytes(&self) -> (usize, usize, usize, usize) {
        let layers = self.layers.iter().map(GpuLayer::matrix_bytes).sum();
        let w2 = self.markov.as_ref().map_or(0, |m| m.w2.bytes());
        (self.fc.bytes(), layers, self.lm_head.bytes(), w2)
    }

    /// Projects `n ≤ CHUNK` feature rows `[n, T·H]` into every layer's cache: the fused fc, the
    /// hidden norm, then one matvec over all layers' k|v rows (`ctx_kv`) and one fused
    /// norm + RoPE + append launch for all layers (`kv_layers.rs`). Context rows enter k/v
    /// directly: no input_layernorm (DSPARK.md §2.2). A few rows replay a CUDA graph.
    fn append_chunk(&mut self, features: &CudaView<f32>, n: usize) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let gpu = self.gpu.clone();
        let first_pos = self.ctx_len;
        let lens = [first_pos as u32, (first_pos + n) as u32];
        // The copy also waits for every earlier kernel: the attention kernels rely on it to read
        // settled cache rows before their PDL wait (ARCHITECTURE.md).
        gpu.stream.memcpy_htod(&lens, &mut self.step_in.slice_mut(..2)).map_err(drv)?;
        let key = DraftStep::Append { rows: n, features: features.device_ptr(&gpu.stream).0 };
        let mut graphs = std::mem::take(&mut self.graphs);
        let ran = graphs.run(&gpu, n, key, || self.launch_append(features, n, first_pos));
        self.graphs = graphs;
        ran?;
        self.ctx_len += n;
        Ok(())
    }

    fn launch_append(&mut self, features: &CudaView<f32>, n: usize, first_pos: usize) -> Result<()> {
        let l = &self.cfg.layer;
        let (h, t, kv, eps) = (l.hidden_size, self.cfg.num_taps(), l.kv_dim(), l.rms_norm_eps as f32);
        let gpu = self.gpu.clone();
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos, kv_cap: first_pos + n };
        gpu.matvec(&self.fc, &features.slice(..n * t * h), &mut self.c.slice_mut(..n * h), (n, t * h, h), false)
            .map_err(gpu_err)?;
        gpu.rmsnorm(
            &self.c.slice(..n * h),
            &self.hidden_norm.as_view(),
            eps,
            n,
            &mut self.scratch.u.slice_mut(..n * h),
        )
        .map_err(gpu_err)?;
        // Every layer's keys and values of these rows: one projection, one append.
        let width = self.caches.layers() * 2 * kv;
        let u = self.scratch.u.slice(..n * h);
        gpu.matvec(&self.ctx_kv, &u, &mut self.ctx_out.slice_mut(..n * width), (n, h, width), false)
            .map_err(gpu_err)?;
        gpu.kv_rope_append_layers(
            &self.ctx_out.slice(..n * width),
            (&self.ctx_k_norm.as_view(), &self.inv_freq.as_view()),
            &mut self.caches,
            (n, l.num_key_value_heads),
            &lens,
            eps,
        )
        .map_err(gpu_err)?;
        Ok(())
    }

    /// The launches of a proposal at context length `p` (block ids already in `step_in`):
    /// the block forward, lm_head, the Markov chain and the confidence head.
    fn launch_propose(&mut self, p: usize, kv_cap: usize) -> Result<()> {
        let l = self.cfg.layer.clone();
        let (b, h, v, eps) = (self.cfg.block_size, l.hidden_size, l.vocab_size, l.rms_norm_eps as f32);
        let gpu = self.gpu.clone();
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos: p, kv_cap };
        let ids = self.step_in.slice(2..2 + b);
        gpu.embedding(&self.embed_tokens, h, &ids, b, &mut self.x.slice_mut(..b * h)).map_err(gpu_err)?;
        // The final norm runs on its own: the Markov chain and the confidence head read the
        // normalised rows too.
        run_layers(
            &gpu,
            &l,
            &self.layers,
            &mut self.scratch,
            &mut self.x.slice_mut(..b * h),
            (b, false),
            &lens,
            &self.inv_freq,
            self.caches.caches_mut(),
            None,
            |_, _| Ok(()),
        )?;
        gpu.rmsnorm(&self.x.slice(..b * h), &self.norm.as_view(), eps, b, &mut self.hidden.slice_mut(..b * h))
            .map_err(gpu_err)?;
        gpu.matvec(&self.lm_head, &self.hidden.slice(..b * h), &mut self.logits.slice_mut(..b * v), (b, h, v), false)
            .map_err(gpu_err)?;

        // The sequential chain: slot s reads its previous token from device memory.
        if let Some(Markov { variant: Variant::Rnn { state, .. }, .. }) = &mut self.markov {
            gpu.stream.memset_zeros(state).map_err(drv)?;
        }
        // e holds every slot's W1 row: slot 0's is gathered here, slot s + 1's by slot s's argmax.
        let r = self.markov.as_ref().map_or(0, |m| m.rank);
        if let Some(m) = &self.markov {
            gpu.gather_row(&m.w1, r, &ids.slice(0..1), &mut self.e.slice_mut(..r)).map_err(gpu_err)?;
        }
        // The chosen tokens go to the buffer the target's verify reads.
        let shared = self.tokens.clone();
        let mut chosen = shared.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
        for s in 0..b {
            let h_s = self.hidden.slice(s * h..(s + 1) * h);
            let mut logits_s = self.logits.slice_mut(s * v..(s + 1) * v);
            let mut token_s = chosen.data.slice_mut(s..s + 1);
            let Some(m) = &mut self.markov else {
                gpu.argmax_split(&logits_s.as_view(), v, v, 1, &mut token_s, &mut self.scratch.ops).map_err(gpu_err)?;
                continue;
            };
            // e_s, and the slot of the W1 row this step's token picks (none after the last slot).
            let mut pair = self.e.slice_mut(s * r..(s + 2).min(b) * r);
            let (e_s, mut e_next) = pair.split_at_mut(r);
            let e_s = e_s.as_view();
            let input = match &mut m.variant {
                Variant::Vanilla => e_s,
                Variant::Gated { weight, bias } => {
                    gpu.markov_gated_prep(&weight.as_view(), &bias.as_view(), &h_s, &e_s, &mut self.u.slice_mut(..r))
                        .map_err(gpu_err)?;
                    self.u.slice(..r)
                }
                Variant::Rnn { weight, bias, state, scratch } => {
                    gpu.markov_rnn_prep(
                        &weight.as_view(),
                        &bias.as_view(),
                        &h_s,
                        &e_s,
                        &mut state.as_view_mut(),
                        &mut scratch.as_view_mut(),
                        &mut self.u.slice_mut(..r),
                    )
                    .map_err(gpu_err)?;
                    self.u.slice(..r)
                }
            };
            // logits_s += W2·u, its argmax, and the next W1 row: one launch on the tensor cores.
            let gather = if s + 1 < b { Some(((&m.w1, r), &mut e_next)) } else { None };
            gpu.matvec_argmax(&m.w2, &input, &mut logits_s, (r, v), true, &mut token_s, &mut self.scratch.ops, gather)
                .map_err(gpu_err)?;
        }
        if let Some(c) = &self.confidence {
            gpu.confidence(
                &c.weight.as_view(),
                c.bias,
                &self.hidden.slice(..b * h),
                &self.e.slice(..(b * r).max(1)),
                (b, h, r),
                c.with_markov && r > 0,
                &mut self.conf_logits.slice_mut(..b),
            )
            .map_err(gpu_err)?;
        }
        Ok(())
    }

    /// Turns CUDA graphs on or off for later steps (tests compare both paths).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if self.ctx_len + n > self.max_len {
            return Err(Error::Request(format!(
                "draft context of {} positions exceeds {}",
                self.ctx_len + n,
                self.max_len
            )));
        }
        Ok(())
    }
}

impl Drafter for CudaDraft {
    fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    fn target_layer_ids(&self) -> &[usize] {
        &self.cfg.target_layer_ids
    }

    fn context_len(&self) -> usize {
        self.ctx_len
    }

    fn reset(&mut self) {
        self.ctx_len = 0;
    }

    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        let row = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        let rows = self.cfg.feature_rows(features.len())?;
        self.check_room(rows)?;
        if rows > CHUNK && self.prefill.is_some() {
            return self.append_context_gemm(features);
        }
        for chunk in features.chunks(CHUNK * row) {
            let m = chunk.len() / row;
            let mut buf = self.features.take().ok_or_else(|| Error::Request("draft feature buffer in use".into()))?;
            let r = self.gpu.stream.memcpy_htod(chunk, &mut buf.slice_mut(..chunk.len())).map_err(drv);
            let r = r.and_then(|()| self.append_chunk(&buf.slice(..), m));
            self.features = Some(buf);
            r?;
        }
        Ok(())
    }

    fn append_captured(&mut self, captured: &Captured) -> Result<()> {
        let d = match captured {
            Captured::Host(v) => return self.append_context(v),
            Captured::Device(d) => d,
        };
        if let Some(pc) = self.prefill_capture.clone() {
            if d.buffer == handoff_id(&pc) {
                return self.append_prefill_captures(&pc, d);
            }
        }
        let shared = self.capture.clone();
        let cap = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        if d.buffer != handoff_id(&shared) || d.generation != cap.generation || d.rows > CHUNK {
            return Err(Error::Request(
                "device captures are stale or from another target: append them before the next forward".into(),
            ));
        }
        self.check_room(d.rows)?;
        let row = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        self.append_chunk(&cap.data.slice(..d.rows * row), d.rows)
    }

    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let deferred = self.propose_deferred(anchor)?;
        self.finish_proposal(deferred)
    }

    fn propose_deferred(&mut self, anchor: u32) -> Result<Deferred> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        if anchor as usize >= v {
            return Err(Error::Request(format!("anchor token {anchor} is outside the vocabulary ({v})")));
        }
        let gpu = self.gpu.clone();
        let p = self.ctx_len;
        // [first_pos, kv_len, anchor, mask × (B−1)] in one copy.
        let mut step = vec![self.cfg.mask_token_id; 2 + b];
        step[0] = p as u32;
        step[1] = (p + b) as u32;
        step[2] = anchor;
        // The copy also waits for every earlier kernel: the attention kernels rely on it to read
        // settled cache rows before their PDL wait (ARCHITECTURE.md).
        gpu.stream.memcpy_htod(&step, &mut self.step_in.slice_mut(..2 + b)).map_err(drv)?;
        let kv_cap = self.graphs.kv_cap(&gpu, b, p + b, self.max_len + b);
        let mut graphs = std::mem::take(&mut self.graphs);
        let ran = graphs.run(&gpu, b, DraftStep::Propose { kv_cap }, || self.launch_propose(p, kv_cap));
        self.graphs = graphs;
        ran?;
        let generation = {
            let mut t = self.tokens.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
            t.generation += 1;
            t.generation
        };
        Ok(Deferred::OnDevice(DeviceTokens { buffer: handoff_id(&self.tokens), generation, len: b }))
    }

    fn finish_proposal(&mut self, deferred: Deferred) -> Result<Proposal> {
        let d = match deferred {
            Deferred::Ready(p) => return Ok(p),
            Deferred::OnDevice(d) => d,
        };
        let (b, gpu) = (self.cfg.block_size, self.gpu.clone());
        let t = self.tokens.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
        if d.buffer != handoff_id(&self.tokens) || d.generation != t.generation || d.len != b {
            return Err(Error::Request("device draft tokens are stale or from another draft".into()));
        }
        let mut tokens = vec![0u32; b];
        gpu.stream.memcpy_dtoh(&t.data.slice(..b), &mut tokens).map_err(drv)?;
        let survival = if self.confidence.is_some() {
            let mut logits = vec![0f32; b];
            gpu.stream.memcpy_dtoh(&self.conf_logits.slice(..b), &mut logits).map_err(drv)?;
            Some(prefix_survival(&logits))
        } else {
            None
        };
        Ok(Proposal { tokens, survival })
    }
}

/// Every layer's k_proj|v_proj rows — rows `q .. q + 2·kv` of its stacked q|k|v matrix — in one
/// `[layers · 2·kv, H]` matrix, copied on the device so it always matches the layers' own.
fn stack_kv_rows(
    arena: &Arena,
    gpu: &Gpu,
    layers: &[GpuLayer],
    (q, kv, h): (usize, usize, usize),
) -> Result<WeightBuf> {
    let n = layers.len() * 2 * kv * h;
    let src = q * h..(q + 2 * kv) * h;
    let dst = |i: usize| i * 2 * kv * h..(i + 1) * 2 * kv * h;
    let mut out = match layers.first().map(|lw| &lw.qkv_proj) {
        Some(WeightBuf::F32(_)) => WeightBuf::F32(arena.zeros(n).map_err(drv)?),
        Some(WeightBuf::F16(_)) => WeightBuf::F16(arena.zeros(n).map_err(drv)?),
        _ => WeightBuf::Bf16(arena.zeros(n).map_err(drv)?),
    };
    for (i, lw) in layers.iter().enumerate() {
        match (&lw.qkv_proj, &mut out) {
            (WeightBuf::Bf16(s), WeightBuf::Bf16(d)) | (WeightBuf::F16(s), WeightBuf::F16(d)) => {
                gpu.stream.memcpy_dtod(&s.slice(src.clone()), &mut d.slice_mut(dst(i)))
            }
            (WeightBuf::F32(s), WeightBuf::F32(d)) => {
                gpu.stream.memcpy_dtod(&s.slice(src.clone()), &mut d.slice_mut(dst(i)))
            }
            _ => {
                return Err(Error::Request(format!(
                    "draft layers.{i}.self_attn: q/k/v_proj load in another dtype than layers.0's; \
                     the CUDA draft needs one dtype for all layers' k_proj|v_proj"
                )))
            }
        }
        .map_err(drv)?;
    }
    Ok(out)
}
