//! Launch wrappers of the argmax family (kernels/argmax.cu): the greedy token of logits rows
//! on the device, and the Markov chain's step that also gathers the winner's W1 row.

use super::ops::{cfg, check, launch, wptr, OpScratch, WeightBuf, ARGMAX_ROWS, ARGMAX_SEGMENTS};
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Argmax of `rows` logits rows as one launch of many blocks per row (see argmax.cu).
    pub fn argmax_split(
        &self,
        logits: &CudaView<f32>,
        vocab: usize,
        row_stride: usize,
        rows: usize,
        out: &mut CudaViewMut<u32>,
        scratch: &mut OpScratch,
    ) -> CudaResult<()> {
        let segs = vocab.div_ceil(1024).clamp(1, ARGMAX_SEGMENTS);
        if rows > ARGMAX_ROWS || scratch.argmax_v.len() < rows * segs || scratch.argmax_tickets.len() < rows {
            return self.argmax(logits, vocab, row_stride, rows, out);
        }
        if rows == 0 {
            return Ok(());
        }
        check("argmax logits", logits.len(), (rows - 1) * row_stride + vocab)?;
        check("argmax out", out.len(), rows)?;
        let args = self.argmax_split_args(logits, out, scratch, vocab, row_stride);
        self.launch_pdl("argmax_split_f32", (segs as u32, rows as u32, 1), 256, &args)?;
        Ok(())
    }

    /// The arguments `argmax_split_f32` and `argmax_gather_*` share: (logits, out, partial_v,
    /// partial_i, tickets, vocab, row_stride). The tickets start zeroed (arena) and the kernels
    /// leave them zeroed.
    fn argmax_split_args(
        &self,
        logits: &CudaView<f32>,
        out: &mut CudaViewMut<u32>,
        scratch: &mut OpScratch,
        vocab: usize,
        row_stride: usize,
    ) -> [Arg; 7] {
        [
            dptr(self, logits),
            dptr_mut(self, out),
            dptr_mut(self, &mut scratch.argmax_v),
            dptr_mut(self, &mut scratch.argmax_i),
            dptr_mut(self, &mut scratch.argmax_tickets),
            Arg::I32(vocab as i32),
            Arg::I32(row_stride as i32),
        ]
    }

    /// [`Gpu::argmax_split`] of one row whose winner's row of `table` `[vocab, dim]` is then
    /// written to `gathered` (widened to f32) by the same launch: one step of the Markov chain
    /// (the token, then the W1 row the next step multiplies).
    pub fn argmax_gather(
        &self,
        logits: &CudaView<f32>,
        vocab: usize,
        out: &mut CudaViewMut<u32>,
        scratch: &mut OpScratch,
        (table, dim): (&WeightBuf, usize),
        gathered: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        check("argmax_gather logits", logits.len(), vocab)?;
        check("argmax_gather out", out.len(), 1)?;
        check("argmax_gather table", table.len(), vocab * dim)?;
        check("argmax_gather gathered", gathered.len(), dim)?;
        let segs = vocab.div_ceil(1024).clamp(1, ARGMAX_SEGMENTS);
        if scratch.argmax_v.len() < segs || scratch.argmax_tickets.is_empty() {
            self.argmax_split(logits, vocab, vocab, 1, out, scratch)?;
            return self.gather_row(table, dim, &out.as_view(), gathered);
        }
        // argmax_gather_*(the argmax_split_f32 arguments, table, gathered, dim)
        let mut args = [Arg::I32(0); 10];
        args[..7].copy_from_slice(&self.argmax_split_args(logits, out, scratch, vocab, vocab));
        args[7] = wptr(self, &table.view(0..table.len()));
        args[8] = dptr_mut(self, gathered);
        args[9] = Arg::I32(dim as i32);
        let name = match table {
            WeightBuf::Bf16(_) => "argmax_gather_bf16",
            WeightBuf::F16(_) => "argmax_gather_f16",
            WeightBuf::F32(_) => "argmax_gather_f32",
        };
        self.launch_pdl(name, (segs as u32, 1, 1), 256, &args)
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
        launch!(self, "argmax_f32", b, cfg(rows, 1024));
        Ok(())
    }
}
