//! Typed launch wrappers, one per kernel family of `kernels/*.cu`.
//!
//! Each wrapper checks every buffer length against the shape it is given, then launches on the
//! GPU's stream. Activations are f32 views; large weights are a [`WeightBuf`] in the
//! checkpoint's dtype, small per-channel weights (norms, head vectors) f32.

use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// A weight matrix on the device in its checkpoint dtype (bf16 and f16 stored as raw u16).
pub enum WeightBuf {
    Bf16(CudaSlice<u16>),
    F16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

impl WeightBuf {
    pub fn len(&self) -> usize {
        match self {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => s.len(),
            WeightBuf::F32(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => 2 * s.len(),
            WeightBuf::F32(s) => 4 * s.len(),
        }
    }

    fn suffix(&self) -> &'static str {
        match self {
            WeightBuf::Bf16(_) => "bf16",
            WeightBuf::F16(_) => "f16",
            WeightBuf::F32(_) => "f32",
        }
    }
}

fn check(what: &str, got: usize, want: usize) -> CudaResult<()> {
    if got < want {
        return Err(CudaError::Shape(format!("{what}: buffer holds {got} values, needs {want}")));
    }
    Ok(())
}

fn cfg(grid: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Pushes a weight buffer as the kernel's first argument and launches (macro so the builder's
/// borrow of the buffer lives as long as the launch).
macro_rules! launch_w {
    ($gpu:expr, $name:expr, $w:expr, $cfg:expr, |$b:ident| $push:block) => {{
        let f = $gpu.function(&format!("{}_{}", $name, $w.suffix()))?;
        let mut $b = $gpu.stream.launch_builder(f);
        match $w {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => {
                $b.arg(s);
            }
            WeightBuf::F32(s) => {
                $b.arg(s);
            }
        }
        $push;
        // SAFETY: argument types and order match the kernel signature in kernels/*.cu, and the
        // lengths were checked by the caller against the launch shape.
        unsafe { $b.launch($cfg) }?;
    }};
}

impl Gpu {
    /// `out[r, :] = table[ids[r], :]`; table `[vocab, dim]`.
    pub fn embedding(
        &self,
        table: &WeightBuf,
        dim: usize,
        ids: &CudaView<u32>,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        check("embedding ids", ids.len(), rows)?;
        check("embedding out", out.len(), rows * dim)?;
        let d = dim as i32;
        launch_w!(self, "embedding", table, cfg(rows, 256), |b| {
            b.arg(ids).arg(out).arg(&d);
        });
        Ok(())
    }

    /// `out = rmsnorm(x) · w` per row of `w.len()`.
    pub fn rmsnorm(
        &self,
        x: &CudaView<f32>,
        w: &CudaView<f32>,
        eps: f32,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let dim = w.len();
        check("rmsnorm x", x.len(), rows * dim)?;
        check("rmsnorm out", out.len(), rows * dim)?;
        let d = dim as i32;
        let mut b = self.stream.launch_builder(self.function("rmsnorm_f32")?);
        b.arg(x).arg(w).arg(out).arg(&d).arg(&eps);
        // SAFETY: matches rmsnorm_f32(x, w, out, dim, eps); lengths checked above.
        unsafe { b.launch(cfg(rows, 256)) }?;
        Ok(())
    }

    /// `residual += delta; out = rmsnorm(residual) · w`.
    pub fn add_rmsnorm(
        &self,
        residual: &mut CudaViewMut<f32>,
        delta: &CudaView<f32>,
        w: &CudaView<f32>,
        eps: f32,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let dim = w.len();
        check("add_rmsnorm residual", residual.len(), rows * dim)?;
        check("add_rmsnorm delta", delta.len(), rows * dim)?;
        check("add_rmsnorm out", out.len(), rows * dim)?;
        let d = dim as i32;
        let mut b = self.stream.launch_builder(self.function("add_rmsnorm_f32")?);
        b.arg(residual).arg(delta).arg(w).arg(out).arg(&d).arg(&eps);
        // SAFETY: matches add_rmsnorm_f32(residual, delta, w, out, dim, eps).
        unsafe { b.launch(cfg(rows, 256)) }?;
        Ok(())
    }

    /// Per-head RMSNorm (`w` of length head_dim) then RoPE at positions `first_pos ..`, in place
    /// on `x` `[rows, heads, head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_rope(
        &self,
        x: &mut CudaViewMut<f32>,
        w: &CudaView<f32>,
        inv_freq: &CudaView<f32>,
        rows: usize,
        heads: usize,
        first_pos: usize,
        eps: f32,
    ) -> CudaResult<()> {
        let hd = w.len();
        if hd % 2 != 0 || hd > 512 || inv_freq.len() != hd / 2 {
            return Err(CudaError::Shape(format!("qk_norm_rope: head_dim {hd} with {} frequencies", inv_freq.len())));
        }
        check("qk_norm_rope x", x.len(), rows * heads * hd)?;
        let threads = ((hd / 2).div_ceil(32) * 32) as u32;
        let (h, d, p) = (heads as i32, hd as i32, first_pos as i32);
        let mut b = self.stream.launch_builder(self.function("qk_norm_rope_f32")?);
        b.arg(x).arg(w).arg(inv_freq).arg(&h).arg(&d).arg(&p).arg(&eps);
        // SAFETY: matches qk_norm_rope_f32(x, w, inv_freq, heads, hd, first_pos, eps).
        unsafe { b.launch(cfg(rows * heads, threads)) }?;
        Ok(())
    }

    /// Attention of `rows` queries over the first `kv_len` cache rows. `causal`: row r sits at
    /// `first_pos + r` and sees keys `0..=first_pos + r`; otherwise every key.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &CudaView<f32>,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        kv_len: usize,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: Option<usize>,
    ) -> CudaResult<()> {
        if head_dim % 32 != 0 || head_dim > 256 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(CudaError::Shape(format!(
                "attention: head_dim {head_dim} must be a multiple of 32 up to 256, heads {n_heads} a multiple of kv heads {n_kv_heads}"
            )));
        }
        check("attention q", q.len(), rows * n_heads * head_dim)?;
        check("attention k", k.len(), kv_len * n_kv_heads * head_dim)?;
        check("attention v", v.len(), kv_len * n_kv_heads * head_dim)?;
        check("attention out", out.len(), rows * n_heads * head_dim)?;
        let (nh, nkv, hd, kl) = (n_heads as i32, n_kv_heads as i32, head_dim as i32, kv_len as i32);
        let (c, fp) = match causal {
            Some(p) => (1i32, p as i32),
            None => (0, 0),
        };
        let mut b = self.stream.launch_builder(self.function("attention_f32")?);
        b.arg(q).arg(k).arg(v).arg(out).arg(&nh).arg(&nkv).arg(&hd).arg(&kl).arg(&c).arg(&fp);
        // SAFETY: matches attention_f32(q, k, v, out, nh, nkv, hd, kv_len, causal, first_pos).
        unsafe { b.launch(cfg(rows * n_heads, 128)) }?;
        Ok(())
    }

    /// `out = silu(gate) ⊙ up` from the fused `[rows, 2·inter]` gate|up buffer.
    pub fn swiglu(
        &self,
        gate_up: &CudaView<f32>,
        inter: usize,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        check("swiglu gate_up", gate_up.len(), rows * 2 * inter)?;
        check("swiglu out", out.len(), rows * inter)?;
        let (i, r) = (inter as i32, rows as i32);
        let mut b = self.stream.launch_builder(self.function("swiglu_f32")?);
        b.arg(gate_up).arg(out).arg(&i).arg(&r);
        // SAFETY: matches swiglu_f32(gate_up, out, inter, rows).
        unsafe { b.launch(cfg((rows * inter).div_ceil(256), 256)) }?;
        Ok(())
    }

    /// `y[m, o] (+)= Σ_k x[m, k] · W[o, k]` for `m` rows (any m; chunks of 16 per launch).
    pub fn matvec(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        check("matvec w", w.len(), d_out * d_in)?;
        check("matvec x", x.len(), m * d_in)?;
        check("matvec y", y.len(), m * d_out)?;
        let mut start = 0;
        while start < m {
            let rows = (m - start).min(16);
            let xs = x.slice(start * d_in..(start + rows) * d_in);
            let mut ys = y.slice_mut(start * d_out..(start + rows) * d_out);
            let (mm, di, dout, acc) = (rows as i32, d_in as i32, d_out as i32, accumulate as i32);
            launch_w!(self, "matvec", w, cfg(d_out.div_ceil(8), 256), |b| {
                b.arg(&xs).arg(&mut ys).arg(&mm).arg(&di).arg(&dout).arg(&acc);
            });
            start += rows;
        }
        Ok(())
    }

    /// `out[r] = argmax(logits[r·row_stride .. + vocab])` for `rows` rows.
    pub fn argmax(
        &self,
        logits: &CudaView<f32>,
        vocab: usize,
        row_stride: usize,
        rows: usize,
        out: &mut CudaViewMut<u32>,
    ) -> CudaResult<()> {
        if rows > 0 {
            check("argmax logits", logits.len(), (rows - 1) * row_stride + vocab)?;
        }
        check("argmax out", out.len(), rows)?;
        let (v, s) = (vocab as i32, row_stride as i32);
        let mut b = self.stream.launch_builder(self.function("argmax_f32")?);
        b.arg(logits).arg(out).arg(&v).arg(&s);
        // SAFETY: matches argmax_f32(logits, out, vocab, row_stride).
        unsafe { b.launch(cfg(rows, 1024)) }?;
        Ok(())
    }

    /// `out = table[*idx, :]` where `idx` is one id in device memory; table `[n, dim]`.
    pub fn gather_row(
        &self,
        table: &WeightBuf,
        dim: usize,
        idx: &CudaView<u32>,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        check("gather_row idx", idx.len(), 1)?;
        check("gather_row out", out.len(), dim)?;
        let d = dim as i32;
        launch_w!(self, "gather_row", table, cfg(1, 256), |b| {
            b.arg(idx).arg(out).arg(&d);
        });
        Ok(())
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
        let (hh, rr) = (hd as i32, r as i32);
        let mut b = self.stream.launch_builder(self.function("markov_gated_prep_f32")?);
        b.arg(g).arg(bias).arg(h).arg(e).arg(u).arg(&hh).arg(&rr);
        // SAFETY: matches markov_gated_prep_f32(G, b, h, e, u, H, r).
        unsafe { b.launch(cfg(1, 256)) }?;
        Ok(())
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
        let (hh, rr) = (hd as i32, r as i32);
        let mut b = self.stream.launch_builder(self.function("markov_rnn_prep_f32")?);
        b.arg(j).arg(bias).arg(h).arg(e).arg(state).arg(scratch).arg(u).arg(&hh).arg(&rr);
        // SAFETY: matches markov_rnn_prep_f32(J, b, h, e, state, scratch, u, H, r).
        unsafe { b.launch(cfg(1, 256)) }?;
        Ok(())
    }

    /// Confidence logit `w[..H]·h + (w[H..]·e if with_markov) + bias` into `logit[0]`.
    pub fn confidence(
        &self,
        w: &CudaView<f32>,
        bias: f32,
        h: &CudaView<f32>,
        e: &CudaView<f32>,
        with_markov: bool,
        logit: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let (hd, r) = (h.len(), if with_markov { e.len() } else { 0 });
        check("confidence weight", w.len(), hd + r)?;
        check("confidence out", logit.len(), 1)?;
        let (hh, rr, wm) = (hd as i32, r as i32, with_markov as i32);
        let mut b = self.stream.launch_builder(self.function("confidence_f32")?);
        b.arg(w).arg(&bias).arg(h).arg(e).arg(logit).arg(&hh).arg(&rr).arg(&wm);
        // SAFETY: matches confidence_f32(w, b, h, e, logit, H, r, with_markov).
        unsafe { b.launch(cfg(1, 256)) }?;
        Ok(())
    }
}
