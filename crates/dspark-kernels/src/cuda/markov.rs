//! Launch wrappers of DSpark's sequential heads (kernels/markov.cu): the W1 row gather, the
//! gated and recurrent Markov preps, and the confidence logits.

use super::host_table::TableRef;
use super::ops::check;
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut};

impl Gpu {
    /// `out = table[*idx, :]` where `idx` is one id in device memory; table `[n, dim]`, on the
    /// device or in mapped host memory (`--embeddings host` keeps Markov W1 there). One row of
    /// the embedding gather (kernels/embedding.cu): a row of whole 16-byte chunks in one round
    /// trip, any other row by its element loop (slow from host memory, but correct).
    pub fn gather_row<'t>(
        &self,
        table: impl Into<TableRef<'t>>,
        dim: usize,
        idx: &CudaView<u32>,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let table = table.into();
        check("gather_row idx", idx.len(), 1)?;
        check("gather_row out", out.len(), dim)?;
        if table.suffix() == "fp8" || dim == 0 || !table.len().is_multiple_of(dim) {
            return Err(CudaError::Shape(format!(
                "gather_row: a {} table of {} values in rows of {dim}",
                table.suffix(),
                table.len()
            )));
        }
        // embedding_*(table, ids, out, dim), one row
        let args = [table.arg(self), dptr(self, idx), dptr_mut(self, out), Arg::I32(dim as i32)];
        self.launch_pdl(&format!("embedding_{}", table.suffix()), (1, 1, 1), 256, &args)
    }

    /// Gated Markov head: `u = σ(G·[h ; e] + b) ⊙ e`. G `[r, H + r]`.
    pub fn markov_gated_prep(
        &self,
        g: &CudaView<f32>,
        bias: &CudaView<f32>,
        h: &CudaView<f32>,
        e: &CudaView<f32>,
        u: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let (hd, r) = (h.len(), e.len());
        check("markov gate weight", g.len(), r * (hd + r))?;
        check("markov gate bias", bias.len(), r)?;
        check("markov u", u.len(), r)?;
        // markov_gated_prep_f32(G, b, h, e, u, H, r)
        let args = [
            dptr(self, g),
            dptr(self, bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, u),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
        ];
        self.launch_pdl("markov_gated_prep_f32", (1, 1, 1), 256, &args)
    }

    /// Recurrent Markov head step (state updated in place), `u = tanh(o)`. J `[3r, 2r + H]`.
    #[allow(clippy::too_many_arguments)]
    pub fn markov_rnn_prep(
        &self,
        j: &CudaView<f32>,
        bias: &CudaView<f32>,
        h: &CudaView<f32>,
        e: &CudaView<f32>,
        state: &mut CudaViewMut<f32>,
        scratch: &mut CudaViewMut<f32>,
        u: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let (hd, r) = (h.len(), e.len());
        check("markov joint weight", j.len(), 3 * r * (2 * r + hd))?;
        check("markov joint bias", bias.len(), 3 * r)?;
        check("markov state", state.len(), r)?;
        check("markov scratch", scratch.len(), 3 * r)?;
        check("markov u", u.len(), r)?;
        // markov_rnn_prep_f32(J, b, h, e, state, scratch, u, H, r)
        let args = [
            dptr(self, j),
            dptr(self, bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, state),
            dptr_mut(self, scratch),
            dptr_mut(self, u),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
        ];
        self.launch_pdl("markov_rnn_prep_f32", (1, 1, 1), 256, &args)
    }

    /// Confidence logits of `rows` slots: `logit[s] = w[..H]·h_s + (w[H..]·e_s if with_markov) +
    /// bias`, h `[rows, H]`, e `[rows, r]`.
    #[allow(clippy::too_many_arguments)]
    pub fn confidence(
        &self,
        w: &CudaView<f32>,
        bias: f32,
        h: &CudaView<f32>,
        e: &CudaView<f32>,
        (rows, hd, r): (usize, usize, usize),
        with_markov: bool,
        logit: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let r = if with_markov { r } else { 0 };
        check("confidence weight", w.len(), hd + r)?;
        check("confidence h", h.len(), rows * hd)?;
        check("confidence e", e.len(), rows * r)?;
        check("confidence out", logit.len(), rows)?;
        if rows == 0 {
            return Ok(());
        }
        // confidence_f32(w, b, h, e, logit, H, r, with_markov), one block per row
        let args = [
            dptr(self, w),
            Arg::F32(bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, logit),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
            Arg::I32(with_markov as i32),
        ];
        self.launch_pdl("confidence_f32", (rows as u32, 1, 1), 1024, &args)
    }
}
