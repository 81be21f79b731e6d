//! RMSNorm folded into the matvecs around it, so a decoder layer's two norms cost no launch.
//!
//! In a Qwen3 layer every RMSNorm sits between a matvec that writes the residual stream and a
//! matvec that reads the normalised rows:
//!
//! ```text
//! x += Wo o;      u = x / rms(x) · γ_post;   gate|up = W_gu u
//! x += W_down a;  u = x / rms(x) · γ_in';    q|k|v  = W_qkv u      (next layer)
//! ```
//!
//! Since `W (x/rms · γ) = (W (x·γ)) / rms`, the norm splits in two halves that each fit in an
//! epilogue, leaving both matvecs' main loops — the weight stream — untouched:
//!
//! * the **producer** (`matvec_tc_*` with `gamma`): after writing `y = x + Wo·o` it also writes
//!   `u = y·γ` and, per block, the partial `Σ y²` of each row over the block's output rows,
//!   into `ss [m, grid]` — no atomics, so the result is deterministic;
//! * the **consumer** (`matvec_tc_*` with `ss_in`): warp c sums row c's `grid` partials in a
//!   fixed order, and the epilogue scales its outputs by `1/rms = 1/sqrt(Σ/d + eps)` (for the
//!   SwiGLU kernel, gate and up each, before the silu).
//!
//! The products differ from norm-then-matvec only by f32 rounding (the tests hold them to 1e-5
//! of the unfused path), and they do not depend on the number of rows. Earlier attempts that
//! applied `1/rms` or `γ` as the consumer loaded x (branch `norm-fold`, and the norm inside the
//! consumer's loop) cost more than the launch: anything between a warp's weight steps slows the
//! stream (docs/perf.md).
//!
//! Where either side cannot take the tensor-core kernel (f16/f32 weights, odd shapes), the
//! producer runs the plain matvec and `rmsnorm_f32` ([`Normed::Done`]), and a consumer handed
//! pending rows finishes them in place first (`rms_finish_f32`), so any pair of paths composes.

use super::matvec::{addr, Epilogue, NormIn, NormOut};
use super::ops::check;
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut};

/// What a norm-producing matvec left in `u` for the next matvec.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Normed {
    /// `u` holds the finished RMSNorm.
    Done,
    /// `u` holds `x·γ`; each row's `1/rms` is pending in `parts` partial sums of squares per
    /// row (`ss [rows, parts]`). `bf16`: as bf16 rows in `u`'s first half (`--activations
    /// bf16`; only a tensor-core consumer's `_x1h` kernel reads them).
    Pending { parts: usize, eps: f32, bf16: bool },
}

impl Normed {
    /// Partial sums per row in the `ss` buffer (0 when the norm is done).
    pub fn parts(&self) -> usize {
        match *self {
            Normed::Done => 0,
            Normed::Pending { parts, .. } => parts,
        }
    }
}

impl Gpu {
    /// `y (+)= W x` for `m` rows, and the RMSNorm of the new `y` with weight `gamma` left in `u`
    /// for the next matvec (pending in `ss` on the tensor-core path; `ss` needs `m · ⌈d_out/16⌉`
    /// values). `bf16_rows`: the caller's consumer reads bf16 rows ([`Gpu::reads_bf16_rows`]
    /// of its weights), so `u` may hold them — half the bytes it reads, the same bits (not for
    /// the final norm, whose lm_head kernels read f32). `x_bf16`: x holds bf16 rows (SwiGLU's act,
    /// [`Gpu::matvec_swiglu_normed`], or the split attention's output, [`Gpu::attention_split`]).
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_norm_out(
        &self,
        w: &super::ops::WeightBuf,
        (x, x_bf16): (&CudaView<f32>, bool),
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        accumulate: bool,
        (gamma, eps): (&CudaView<f32>, f32),
        u: &mut CudaViewMut<f32>,
        ss: &mut CudaViewMut<f32>,
        bf16_rows: bool,
    ) -> CudaResult<Normed> {
        check("matvec_norm_out w", w.len(), d_out * d_in)?;
        check("matvec_norm_out x", x.len(), m * d_in)?;
        check("matvec_norm_out y", y.len(), m * d_out)?;
        if x_bf16 && !(self.tc_path(w, x, d_in) && self.reads_bf16_rows(w, d_in)) {
            return Err(CudaError::Shape(format!(
                "matvec_norm_out x: bf16 rows of {d_in} need a bf16 tensor-core consumer"
            )));
        }
        if !self.tc_path(w, x, d_in) {
            self.matvec(w, x, y, (m, d_in, d_out), accumulate)?;
            self.rmsnorm(&y.as_view(), gamma, eps, m, u)?;
            return Ok(Normed::Done);
        }
        let name = self.tc_name(w, d_out, d_in);
        let bf16 = bf16_rows && self.reads_bf16_rows(w, d_out);
        let out = NormOut {
            gamma: addr(self, gamma, gamma.len()),
            xg: addr(self, &u.as_view(), u.len()),
            ss: addr(self, &ss.as_view(), ss.len()),
            bf16,
        };
        let epi = Epilogue { norm_out: Some(out), x_bf16, ..Epilogue::default() };
        let parts = self.matvec_tc_epi(name, w, x, y, (m, d_in, d_out), d_out, accumulate, epi)?;
        Ok(Normed::Pending { parts, eps, bf16 })
    }

    /// Whether a norm's rows may go as bf16 between a producer and a consumer of `d` inputs
    /// over `w` (each side asks for its own weights): bf16 activations with `x_bf16_rows`, bf16
    /// weights (the `_x1h` kernels; FP8 and f32 / f16 weights read f32 rows) and `d` a multiple
    /// of 16 (16-byte rows).
    pub fn reads_bf16_rows(&self, w: &super::ops::WeightBuf, d: usize) -> bool {
        self.x_bf16_rows
            && self.activations == crate::Activations::Bf16
            && matches!(w, super::ops::WeightBuf::Bf16(_))
            && d.is_multiple_of(16)
    }

    /// `y (+)= W u` for `m` rows of `u` as [`Gpu::matvec_norm_out`] left them (`norm`, with its
    /// partials in `ss`). A pending `u` is finished in place when W cannot take the
    /// tensor-core kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_normed(
        &self,
        w: &super::ops::WeightBuf,
        u: &mut CudaViewMut<f32>,
        norm: Normed,
        ss: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        check("matvec_normed w", w.len(), d_out * d_in)?;
        check("matvec_normed y", y.len(), m * d_out)?;
        match self.pending_norm(w, u, norm, ss, (m, d_in))? {
            None => self.matvec(w, &u.as_view(), y, (m, d_in, d_out), accumulate),
            Some(n) => {
                let name = self.tc_name(w, d_out, d_in);
                let x_bf16 = matches!(norm, Normed::Pending { bf16: true, .. });
                let epi = Epilogue { norm_in: Some(n), x_bf16, ..Epilogue::default() };
                self.matvec_tc_epi(name, w, &u.as_view(), y, (m, d_in, d_out), d_out, accumulate, epi)?;
                Ok(())
            }
        }
    }

    /// [`Gpu::matvec_swiglu`] over `u` as [`Gpu::matvec_norm_out`] left it. `bf16_rows`: the
    /// consumer of `act` reads bf16 rows ([`Gpu::reads_bf16_rows`] of its weights), so `act`
    /// may hold them (the tensor-core path only); returns whether it does — the consumer's
    /// `x_bf16` in [`Gpu::matvec_norm_out`].
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_swiglu_normed(
        &self,
        w: &super::ops::WeightBuf,
        u: &mut CudaViewMut<f32>,
        norm: Normed,
        ss: &CudaView<f32>,
        gate_up: &mut CudaViewMut<f32>,
        act: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
        bf16_rows: bool,
    ) -> CudaResult<bool> {
        let norm_in = self.pending_norm(w, u, norm, ss, (shape.0, shape.1))?;
        let x_bf16 = matches!(norm, Normed::Pending { bf16: true, .. });
        let y_bf16 = bf16_rows && self.tc_path(w, &u.as_view(), shape.1) && self.reads_bf16_rows(w, shape.2);
        self.swiglu_with(w, &u.as_view(), gate_up, act, shape, (norm_in, x_bf16, y_bf16))?;
        Ok(y_bf16)
    }

    /// What a consumer of `u` must do about `norm`: `Some` — scale in the tensor-core epilogue;
    /// `None` — nothing more (done already, or finished here in place because W cannot take
    /// the tensor-core kernel).
    fn pending_norm(
        &self,
        w: &super::ops::WeightBuf,
        u: &mut CudaViewMut<f32>,
        norm: Normed,
        ss: &CudaView<f32>,
        (m, d_in): (usize, usize),
    ) -> CudaResult<Option<NormIn>> {
        check("normed input u", u.len(), m * d_in)?;
        let Normed::Pending { parts, eps, bf16 } = norm else { return Ok(None) };
        if self.tc_path(w, &u.as_view(), d_in) {
            return Ok(Some(NormIn { ss: addr(self, ss, ss.len()), parts, eps }));
        }
        if bf16 {
            return Err(CudaError::Shape(format!(
                "normed input u: bf16 rows of {d_in} need a bf16 tensor-core consumer (a producer's bf16_rows)"
            )));
        }
        self.rms_finish(u, ss, (m, d_in), parts, eps)?;
        Ok(None)
    }

    /// Finishes pending rows in place: `u[r] *= 1/sqrt(Σ_p ss[r, p] / dim + eps)`.
    pub fn rms_finish(
        &self,
        u: &mut CudaViewMut<f32>,
        ss: &CudaView<f32>,
        (rows, dim): (usize, usize),
        parts: usize,
        eps: f32,
    ) -> CudaResult<()> {
        check("rms_finish u", u.len(), rows * dim)?;
        check("rms_finish ss", ss.len(), rows * parts)?;
        if rows == 0 {
            return Ok(());
        }
        // rms_finish_f32(u, ss, parts, dim, eps)
        let args = [dptr_mut(self, u), dptr(self, ss), Arg::I32(parts as i32), Arg::I32(dim as i32), Arg::F32(eps)];
        self.launch_pdl("rms_finish_f32", (rows as u32, 1, 1), 256, &args)
    }
}
