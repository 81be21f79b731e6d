//! Launch wrappers of the sampler (kernels/sample.cu): a verify's rows transformed by a
//! request's filters, the accept/reject of its drafts (one-hot under the greedy draft law, or
//! against the rows a sampled draft drew from, [`SampleIo::q`]), and the residual or bonus draw,
//! all on the device, with the same bits as `cpu::sample` and the speculative loop's host path.
//! A sampled draft calls the same phases on each slot's row ([`Gpu::sample_rows`], k = 0).
//! With top-k on and at most [`TOPK_FUSED_MAX`] the whole sequence is one launch
//! (kernels/sample_topk.cu, [`SampleShape::fused`]), compared with the phases by the GPU tier.
//!
//! The filters and uniforms live in device memory (a [`SampleCfg`] written by the caller with
//! the step's other inputs), so a captured graph replays a sampled verify; only which phases
//! run ([`SampleShape`]) is fixed at capture. The result is four words in
//! [`SampleScratch::out`]: `[m, token, overflow, row]` — drafts accepted, the token emitted
//! after them, whether top-p's candidates ran out (then the caller redoes the round on the host
//! from the logits, which gives the same answer), and the row the token was drawn from.

use super::ops::check;
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaResult, Gpu};
use crate::cpu::sample::Filters;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};
use std::sync::Arc;

/// Leaf block of the sampler's trees (ids per block), as kernels/sample.cu's `LEAVES`.
pub const LEAVES: usize = 2048;
/// top-k values up to this skip the candidate select (the top-k set is the candidate list).
pub const CAND: usize = 1024;
/// Most candidates top-p's walk holds (`CAND_MAX`).
pub const CAND_MAX: usize = 2048;
/// Most leaf blocks (`MAX_BLOCKS`): vocabularies up to 2²⁰.
pub const MAX_BLOCKS: usize = 512;
/// Most uniforms of one sampled verify (k accept uniforms and the draw's).
pub const MAX_UNIFORMS: usize = 65;
/// u32 words of a `SampleCfg`: 8 header words, then the uniforms as f64.
pub const CFG_WORDS: usize = 8 + 2 * MAX_UNIFORMS;
/// u32 words of one `SampleRow`.
pub const ROW_WORDS: usize = 14;

/// The u32 words of a `SampleCfg`: the filters, `k` drafts to judge, and the uniforms
/// (`k` accept uniforms, then the draw's), each an f64 of the request's stream.
pub fn sample_cfg(f: &Filters, k: usize, uniforms: &[f64]) -> Vec<u32> {
    assert!(uniforms.len() == k + 1 && uniforms.len() <= MAX_UNIFORMS, "{} uniforms for k = {k}", uniforms.len());
    let mut w = vec![0u32; CFG_WORDS];
    w[0] = f.temperature.to_bits();
    w[1] = f.top_k as u32;
    w[2] = f.top_p.to_bits();
    w[3] = f.min_p.to_bits();
    w[4] = k as u32;
    for (i, u) in uniforms.iter().enumerate() {
        let b = u.to_bits();
        w[8 + 2 * i] = b as u32;
        w[9 + 2 * i] = (b >> 32) as u32;
    }
    w
}

/// top-k values up to this take the fused sampler (kernels/sample_topk.cu: one launch).
pub const TOPK_FUSED_MAX: usize = 64;

/// Which phases a sampled verify runs (fixed when a graph captures it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleShape {
    pub top_k: bool,
    pub top_p: bool,
    /// top-p over more than [`CAND`] tokens: select a candidate bound first.
    pub select: bool,
    /// The whole sampler in one launch (`sample_topk_f32`): top-k on and at most
    /// [`TOPK_FUSED_MAX`]. The phase-per-launch sequence is its reference (`DSPARK_NO_FUSED_SAMPLE=1`
    /// takes it for A/B runs).
    pub fused: bool,
}

impl SampleShape {
    pub fn of(f: &Filters, vocab: usize) -> SampleShape {
        static NO_FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let no_fused = *NO_FUSED.get_or_init(|| std::env::var_os("DSPARK_NO_FUSED_SAMPLE").is_some_and(|v| v == "1"));
        let top_k = f.top_k > 0 && f.top_k < vocab;
        let top_p = f.top_p < 1.0;
        let fused = top_k && f.top_k <= TOPK_FUSED_MAX && !no_fused;
        SampleShape { top_k, top_p, select: top_p && !(top_k && f.top_k <= CAND), fused }
    }

    /// The same filters through the phase-per-launch sequence (the fused path's reference).
    pub fn unfused(self) -> SampleShape {
        SampleShape { fused: false, ..self }
    }
}

/// The sampler's device scratch for up to `rows` rows of `vocab` logits. A model takes the
/// buffers from its arena at load ([`SampleScratch::sizes`]); tests use [`SampleScratch::new`].
/// The tickets must start at zero; the kernels leave them so.
pub struct SampleScratch {
    pub rows: usize,
    pub blocks: usize,
    pub state: CudaSlice<u32>,
    pub part_f: CudaSlice<f32>,
    pub part_u: CudaSlice<u32>,
    pub part_d: CudaSlice<f64>,
    pub cands: CudaSlice<u64>,
    pub tickets: CudaSlice<u32>,
    /// `[m, token, overflow, row]` of the last [`Gpu::sample_verify`].
    pub out: CudaSlice<u32>,
}

/// Element counts of a [`SampleScratch`]'s buffers, in field order.
#[derive(Clone, Copy, Debug)]
pub struct SampleSizes {
    pub blocks: usize,
    pub state: usize,
    pub part_f: usize,
    pub part_u: usize,
    pub part_d: usize,
    pub cands: usize,
    pub tickets: usize,
    pub out: usize,
}

impl SampleScratch {
    pub fn sizes(rows: usize, vocab: usize) -> SampleSizes {
        let blocks = vocab.div_ceil(LEAVES).max(1);
        SampleSizes {
            blocks,
            state: rows * ROW_WORDS,
            part_f: rows * blocks,
            // The radix histograms; the fused sampler's per-block lists (128 u64 each) reuse them.
            part_u: rows * blocks * 256,
            part_d: (rows * blocks).max(2 * blocks),
            cands: rows * CAND_MAX,
            // One per row, and the fused sampler's ticket over rows.
            tickets: rows + 1,
            out: 4,
        }
    }

    /// Zeroed buffers straight from the stream (tests).
    pub fn new(stream: &Arc<CudaStream>, rows: usize, vocab: usize) -> Result<SampleScratch, DriverError> {
        let z = SampleScratch::sizes(rows, vocab);
        Ok(SampleScratch {
            rows,
            blocks: z.blocks,
            state: stream.alloc_zeros(z.state)?,
            part_f: stream.alloc_zeros(z.part_f)?,
            part_u: stream.alloc_zeros(z.part_u)?,
            part_d: stream.alloc_zeros(z.part_d)?,
            cands: stream.alloc_zeros(z.cands)?,
            tickets: stream.alloc_zeros(z.tickets)?,
            out: stream.alloc_zeros(z.out)?,
        })
    }
}

/// Where a sampled call keeps its row states, whose draft law it judges, and where its result
/// goes; [`SampleIo::default`] is a target's plain verify (the scratch's own state and out
/// words, one-hot drafts).
#[derive(Default)]
pub struct SampleIo<'a> {
    /// The rows' states (`rows` · [`ROW_WORDS`] words) instead of `scratch.state`: a draft keeps
    /// each slot's for the verify's ratio.
    pub state: Option<CudaViewMut<'a, u32>>,
    /// A sampled draft's law: its logits rows (`[k, ld]`, the rows it drew each draft from) and
    /// their states, as a draft's slot calls left them. `None`: one-hot drafts.
    pub q: Option<(CudaView<'a, f32>, usize, CudaView<'a, u32>)>,
    /// The out words instead of `scratch.out`.
    pub out: Option<CudaViewMut<'a, u32>>,
    /// Also write the drawn token here (a draft slot's token, read by the next slot's gather and
    /// by the verify).
    pub token: Option<CudaViewMut<'a, u32>>,
}

impl Gpu {
    /// A sampled verify of `rows` = k + 1 logits rows (`[rows, ld]`, `vocab` each) against the
    /// k drafts at `drafts`, with the filters and uniforms at `cfg` ([`sample_cfg`]); k = 0 is a
    /// plain sampled step (the draw from row 0). The result is in `scratch.out`.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_verify(
        &self,
        logits: &CudaView<f32>,
        dims: (usize, usize, usize),
        cfg: &CudaView<u32>,
        drafts: &CudaView<u32>,
        shape: SampleShape,
        scratch: &mut SampleScratch,
    ) -> CudaResult<()> {
        self.sample_rows(logits, dims, cfg, drafts, shape, scratch, SampleIo::default())
    }

    /// [`Gpu::sample_verify`] with the states, the draft law and the outputs of `io`.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &self,
        logits: &CudaView<f32>,
        (rows, vocab, ld): (usize, usize, usize),
        cfg: &CudaView<u32>,
        drafts: &CudaView<u32>,
        shape: SampleShape,
        scratch: &mut SampleScratch,
        mut io: SampleIo<'_>,
    ) -> CudaResult<()> {
        let blocks = vocab.div_ceil(LEAVES).max(1);
        if rows == 0 || rows > scratch.rows || rows > MAX_UNIFORMS || blocks > scratch.blocks || blocks > MAX_BLOCKS {
            return Err(super::CudaError::Shape(format!(
                "sample_verify: {rows} rows of {vocab} (scratch: {} rows, {} blocks)",
                scratch.rows, scratch.blocks
            )));
        }
        check("sample logits", logits.len(), (rows - 1) * ld + vocab)?;
        check("sample cfg", cfg.len(), CFG_WORDS)?;
        if drafts.len() < rows - 1 {
            check("sample drafts", drafts.len(), rows - 1)?;
        }
        let s = scratch;
        let state = match &mut io.state {
            Some(v) => {
                check("sample state", v.len(), rows * ROW_WORDS)?;
                dptr_mut(self, v)
            }
            None => dptr_mut(self, &mut s.state),
        };
        let (q_logits, q_ld, q_st) = match &io.q {
            Some((l, q_ld, st)) => {
                if rows > 1 {
                    check("sample q logits", l.len(), (rows - 2) * q_ld + vocab)?;
                    check("sample q states", st.len(), (rows - 1) * ROW_WORDS)?;
                }
                (dptr(self, l), Arg::I32(*q_ld as i32), dptr(self, st))
            }
            None => (Arg::Ptr(0), Arg::I32(0), Arg::Ptr(0)),
        };
        let out = match &mut io.out {
            Some(v) => {
                check("sample out", v.len(), 4)?;
                dptr_mut(self, v)
            }
            None => dptr_mut(self, &mut s.out),
        };
        let token = match &mut io.token {
            Some(v) => dptr_mut(self, v),
            None => Arg::Ptr(0),
        };
        let grid = (blocks as u32, rows as u32, 1);
        let (v, l) = (Arg::I32(vocab as i32), Arg::I32(ld as i32));
        if shape.fused {
            // sample_topk_f32(logits, ld, vocab, cfg, st, drafts, q_logits, q_ld, q_st, part,
            //                 lists, kept, tickets, out, token_out); the lists use part_u's
            //                 words as u64 (128 per row and block), the kept ids cands.
            let a = [
                dptr(self, logits),
                l,
                v,
                dptr(self, cfg),
                state,
                dptr(self, drafts),
                q_logits,
                q_ld,
                q_st,
                dptr_mut(self, &mut s.part_f),
                dptr_mut(self, &mut s.part_u),
                dptr_mut(self, &mut s.cands),
                dptr_mut(self, &mut s.tickets),
                out,
                token,
            ];
            return self.launch_pdl("sample_topk_f32", grid, 1024, &a);
        }
        // sample_max_f32(logits, ld, vocab, cfg, st, part, tickets)
        let args = [dptr(self, logits), l, v, dptr(self, cfg), state];
        let tail = [dptr_mut(self, &mut s.part_f), dptr_mut(self, &mut s.tickets)];
        self.launch_pdl("sample_max_f32", grid, 1024, &[&args[..], &tail[..]].concat())?;
        let radix = |mode: i32, s: &mut SampleScratch| -> CudaResult<()> {
            for round in 0..4 {
                // sample_radix_f32(logits, ld, vocab, cfg, st, part, tickets, round, mode)
                let a = [
                    dptr(self, logits),
                    l,
                    v,
                    dptr(self, cfg),
                    state,
                    dptr_mut(self, &mut s.part_u),
                    dptr_mut(self, &mut s.tickets),
                    Arg::I32(round),
                    Arg::I32(mode),
                ];
                self.launch_pdl("sample_radix_f32", grid, 1024, &a)?;
            }
            Ok(())
        };
        let tree = |phase: i32, s: &mut SampleScratch| -> CudaResult<()> {
            // sample_tree_f32(logits, ld, vocab, cfg, st, part, tickets, phase)
            let a = [
                dptr(self, logits),
                l,
                v,
                dptr(self, cfg),
                state,
                dptr_mut(self, &mut s.part_d),
                dptr_mut(self, &mut s.tickets),
                Arg::I32(phase),
            ];
            self.launch_pdl("sample_tree_f32", grid, 1024, &a)
        };
        if shape.top_k {
            radix(0, s)?;
        }
        if shape.top_p {
            tree(0, s)?;
            if shape.select {
                radix(1, s)?;
            }
            // sample_gather_f32(logits, ld, vocab, st, cands)
            let a = [dptr(self, logits), l, v, state, dptr_mut(self, &mut s.cands)];
            self.launch_pdl("sample_gather_f32", grid, 1024, &a)?;
            // sample_cut_f32(logits, ld, cfg, st, cands), one block per row
            let a = [dptr(self, logits), l, dptr(self, cfg), state, dptr(self, &s.cands)];
            self.launch_pdl("sample_cut_f32", (rows as u32, 1, 1), 1024, &a)?;
        }
        tree(1, s)?;
        // sample_draw_f32(logits, ld, vocab, cfg, st, drafts, q_logits, q_ld, q_st, part,
        //                 tickets, out, token_out), one row
        let a = [
            dptr(self, logits),
            l,
            v,
            dptr(self, cfg),
            state,
            dptr(self, drafts),
            q_logits,
            q_ld,
            q_st,
            dptr_mut(self, &mut s.part_d),
            dptr_mut(self, &mut s.tickets),
            out,
            token,
        ];
        self.launch_pdl("sample_draw_f32", (blocks as u32, 1, 1), 1024, &a)
    }

    /// The out words `[m, token, overflow, row]` of the last sampled verify (synchronises).
    pub fn sample_result(&self, scratch: &SampleScratch) -> CudaResult<[u32; 4]> {
        let mut host = [0u32; 4];
        self.stream.memcpy_dtoh(&scratch.out, &mut host).map_err(super::CudaError::Driver)?;
        Ok(host)
    }
}
