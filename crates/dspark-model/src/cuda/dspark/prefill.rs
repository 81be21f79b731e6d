//! `CudaDraft`'s context append of a prompt on the GEMM path (crate::cuda::prefill's
//! `DraftPrefill`): from host rows, or straight from the target's prefill capture buffer.

use super::build::ctx_kv_of;
use super::CudaDraft;
use crate::cuda::handoff::SharedCapture;
use crate::cuda::layers::{drv, gpu_err};
use crate::cuda::qwen3::CHUNK;
use crate::error::{Error, Result};
use cudarc::driver::CudaView;
use dspark_kernels::cuda::ops::StepLens;

impl CudaDraft {
    /// A context append of many host rows (a prompt's) on the GEMM path, in chunks of the
    /// draft prefill's rows, each uploaded and then projected by [`CudaDraft::gemm_append`].
    pub(super) fn append_context_gemm(&mut self, features: &[f32]) -> Result<()> {
        let th = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        let (rows, buf) = match self.prefill.as_mut() {
            Some(pf) => (pf.rows, pf.features.take()),
            None => (0, None),
        };
        let mut buf = buf.ok_or_else(|| Error::Request("the draft's GEMM context append was not planned".into()))?;
        let mut r = Ok(());
        for chunk in features.chunks(rows * th) {
            r = self.gpu.stream.memcpy_htod(chunk, &mut buf.slice_mut(..chunk.len())).map_err(drv);
            r = r.and_then(|()| self.gemm_append(&buf.slice(..chunk.len()), chunk.len() / th));
            if r.is_err() {
                break;
            }
        }
        if let Some(pf) = self.prefill.as_mut() {
            pf.features = Some(buf);
        }
        r
    }

    /// A prompt chunk's captures straight from the target's prefill buffer (`d` names it), in
    /// chunks of the draft prefill's rows: no activation passes through the host.
    pub(super) fn append_prefill_captures(
        &mut self,
        shared: &SharedCapture,
        d: &crate::backend::DeviceRows,
    ) -> Result<()> {
        let cap = shared.lock().map_err(|_| Error::Request("prefill capture buffer poisoned".into()))?;
        if d.generation != cap.generation {
            return Err(Error::Request(
                "prefill captures are stale: append them before the target's next prefill".into(),
            ));
        }
        self.check_room(d.rows)?;
        let th = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        let rows = self.prefill.as_ref().map_or(CHUNK, |p| p.rows);
        for start in (d.first..d.first + d.rows).step_by(rows) {
            let n = (d.first + d.rows - start).min(rows);
            self.gemm_append(&cap.data.slice(start * th..(start + n) * th), n)?;
        }
        Ok(())
    }

    /// `n` feature rows `[n, T·H]` into every layer's cache on the GEMM path: fc and the
    /// k|v projection (stacked, or a layer at a time) as GEMMs ([`DraftPrefill::project`]), then the one-launch
    /// norm + RoPE + append of every layer, as [`CudaDraft::launch_append`] ends.
    fn gemm_append(&mut self, features: &CudaView<f32>, n: usize) -> Result<()> {
        let l = &self.cfg.layer;
        let (h, t, kv, eps) = (l.hidden_size, self.cfg.num_taps(), l.kv_dim(), l.rms_norm_eps as f32);
        let nkv = l.num_key_value_heads;
        let width = self.caches.layers() * 2 * kv;
        let gpu = self.gpu.clone();
        let Some(pf) = self.prefill.as_mut() else {
            return Err(Error::Request("the draft's GEMM context append was not planned".into()));
        };
        let first_pos = self.ctx_len;
        let lens = [first_pos as u32, (first_pos + n) as u32];
        // The copy also orders the append after every earlier kernel (ARCHITECTURE.md).
        gpu.stream.memcpy_htod(&lens, &mut self.step_in.slice_mut(..2)).map_err(drv)?;
        let ctx_kv = ctx_kv_of(&self.ctx_kv, &self.layers, l.q_dim());
        pf.project(&gpu, features, &self.fc, &self.hidden_norm, ctx_kv, n, (t, h, width), eps)?;
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos, kv_cap: first_pos + n };
        gpu.kv_rope_append_layers(
            &pf.ctx_out.slice(..n * width),
            (&self.ctx_k_norm.as_view(), &self.inv_freq.as_view()),
            &mut self.caches,
            (n, nkv),
            &lens,
            eps,
            ctx_kv.layout(),
        )
        .map_err(gpu_err)?;
        self.ctx_len += n;
        Ok(())
    }
}
