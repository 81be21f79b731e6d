//! Tensor parallelism's element-wise ops (kernels/tp.cu): a rank's shard of the embedding, the
//! residual add of an all-reduced partial, and each row's value at its argmax. The collectives themselves are NCCL's
//! (`dspark_model::cuda::tp`).

use super::ops::{check, wptr, WeightBuf};
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut};
use std::ops::Range;

impl Gpu {
    /// `out[r, :] = table[ids[r] − vocab.start, :]` for the ids in `vocab`, zeros for the rest;
    /// `table` holds rows `vocab` of the embedding (`[vocab.len(), dim]`).
    pub fn embedding_shard(
        &self,
        table: &WeightBuf,
        dim: usize,
        ids: &CudaView<u32>,
        rows: usize,
        vocab: Range<usize>,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        check("embedding_shard table", table.len(), vocab.len() * dim)?;
        check("embedding_shard ids", ids.len(), rows)?;
        check("embedding_shard out", out.len(), rows * dim)?;
        let (Ok(lo), Ok(hi)) = (u32::try_from(vocab.start), u32::try_from(vocab.end)) else {
            return Err(CudaError::Shape(format!("embedding_shard: vocabulary rows {vocab:?} past 32 bits")));
        };
        if matches!(table, WeightBuf::Fp8(_)) {
            return Err(CudaError::Shape("embedding_shard: an FP8 table".into()));
        }
        // embedding_shard_*(table, ids, out, dim, lo, hi)
        let args = [
            wptr(self, &table.view(0..table.len())),
            dptr(self, ids),
            dptr_mut(self, out),
            Arg::I32(dim as i32),
            Arg::I32(lo as i32),
            Arg::I32(hi as i32),
        ];
        self.launch_pdl(&format!("embedding_shard_{}", table.suffix()), (rows as u32, 1, 1), 256, &args)
    }

    /// `x += y`, element-wise.
    pub fn add_into(&self, x: &mut CudaViewMut<f32>, y: &CudaView<f32>) -> CudaResult<()> {
        check("add_into y", y.len(), x.len())?;
        let n = x.len();
        let Ok(ni) = i32::try_from(n) else {
            return Err(CudaError::Shape(format!("add_into: {n} values past 32 bits")));
        };
        if n == 0 {
            return Ok(());
        }
        let blocks = n.div_ceil(256).clamp(1, 16 * self.sms.max(1)) as u32;
        self.launch_pdl("add_f32", (blocks, 1, 1), 256, &[dptr_mut(self, x), dptr(self, y), Arg::I32(ni)])
    }

    /// `out[r] = x[r · stride + idx[r]]` for `rows` rows (each index below `stride`, as an
    /// argmax over the row leaves it).
    pub fn take_at(
        &self,
        x: &CudaView<f32>,
        idx: &CudaView<u32>,
        stride: usize,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        if rows == 0 {
            return Ok(());
        }
        check("take_at x", x.len(), rows * stride)?;
        check("take_at idx", idx.len(), rows)?;
        check("take_at out", out.len(), rows)?;
        let args =
            [dptr(self, x), dptr(self, idx), dptr_mut(self, out), Arg::I32(stride as i32), Arg::I32(rows as i32)];
        self.launch_pdl("take_at_f32", (1, 1, 1), 256, &args)
    }
}
