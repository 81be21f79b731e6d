//! Launch wrappers of the argmax family (kernels/argmax.cu): the greedy token of logits rows
//! on the device, the Markov chain's step that also gathers the winner's W1 row, and that step
//! fused with the W2 product before it (`matvec_tc_argmax_bf16`, or its tile-looping twin
//! `matvec_tc_loop_argmax_bf16` for Markov W2's many short tiles; kernels/matvec.cu).

use super::host_table::TableRef;
use super::matvec::{addr, ArgmaxEpi, Epilogue};
use super::matvec_pick::{tc_argmax_kernel, tc_launch_grid};
use super::ops::{cfg, check, launch, OpScratch, WeightBuf, ARGMAX_ROWS, ARGMAX_SEGMENTS};
use super::pdl::{device_addr, dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
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
        (table, dim): (TableRef<'_>, usize),
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
        args[7] = table.arg(self);
        args[8] = dptr_mut(self, gathered);
        args[9] = Arg::I32(dim as i32);
        let name = match table.suffix() {
            "bf16" => "argmax_gather_bf16",
            "f16" => "argmax_gather_f16",
            "f32" => "argmax_gather_f32",
            // Tables are embeddings (W1 rows), never FP8 in Qwen's layout.
            _ => return Err(CudaError::Shape("argmax_gather: an FP8 table is not supported".into())),
        };
        self.launch_pdl(name, (segs as u32, 1, 1), 256, &args)
    }

    /// One step of the draft's Markov chain: `logits (+)= W·x` for one row (`W` `[vocab, d_in]`),
    /// `out = argmax(logits)` and, with `gather`, the winner's row of `table` `[vocab, dim]` into
    /// `gathered` — [`Gpu::matvec`] then [`Gpu::argmax_gather`] (or [`Gpu::argmax_split`]
    /// without a gather), in one launch where the product takes the tensor-core path and the
    /// table is bf16: the W2 matvec's epilogue reduces its outputs (kernels/matvec.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_argmax(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        logits: &mut CudaViewMut<f32>,
        (d_in, vocab): (usize, usize),
        accumulate: bool,
        out: &mut CudaViewMut<u32>,
        scratch: &mut OpScratch,
        gather: Option<((TableRef<'_>, usize), &mut CudaViewMut<f32>)>,
    ) -> CudaResult<()> {
        check("matvec_argmax w", w.len(), vocab * d_in)?;
        check("matvec_argmax x", x.len(), d_in)?;
        check("matvec_argmax logits", logits.len(), vocab)?;
        check("matvec_argmax out", out.len(), 1)?;
        let name = tc_argmax_kernel(vocab.div_ceil(16), d_in, self.sms);
        let (_, grid) = tc_launch_grid(name, vocab.div_ceil(16), d_in, self.sms);
        let table_ok = gather.as_ref().is_none_or(|((t, _), _)| t.suffix() == "bf16");
        let room = scratch.argmax_v.len().min(scratch.argmax_i.len()) >= grid && !scratch.argmax_tickets.is_empty();
        if !(self.tc_path(w, x, d_in) && table_ok && room) {
            self.matvec(w, x, logits, (1, d_in, vocab), accumulate)?;
            return match gather {
                Some((table, gathered)) => self.argmax_gather(&logits.as_view(), vocab, out, scratch, table, gathered),
                None => self.argmax_split(&logits.as_view(), vocab, vocab, 1, out, scratch),
            };
        }
        let (table, gathered, dim) = match gather {
            Some(((table, dim), gathered)) => {
                check("matvec_argmax table", table.len(), vocab * dim)?;
                check("matvec_argmax gathered", gathered.len(), dim)?;
                if table.suffix() != "bf16" {
                    return Err(CudaError::Shape("matvec_argmax: the fused gather reads a bf16 table".into()));
                }
                (table.addr(self), device_addr(self, gathered), dim)
            }
            None => (0, 0, 0),
        };
        let argmax = ArgmaxEpi {
            v: addr(self, &scratch.argmax_v, scratch.argmax_v.len()),
            i: addr(self, &scratch.argmax_i, scratch.argmax_i.len()),
            ticket: device_addr(self, &scratch.argmax_tickets),
            out: device_addr(self, out),
            table,
            gathered,
            dim,
        };
        let epi = Epilogue { argmax: Some(argmax), ..Epilogue::default() };
        self.matvec_tc_epi(name, w, x, logits, (1, d_in, vocab), vocab, accumulate, epi)?;
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
        launch!(self, "argmax_f32", b, cfg(rows, 1024));
        Ok(())
    }
}
