//! Causal attention of a prefill chunk on the bf16 tensor cores (kernels/attention_prefill.cu,
//! FlashAttention-2 style): every query row of the chunk against the whole cache up to its own
//! position, in one launch with no split over the keys and no combine.
//!
//! Q, K, V and P are rounded to bf16 where they enter the MMAs (f32 accumulation; the softmax
//! and O stay f32), as every peer's prefill does: results agree with the f32 CPU reference to
//! ~1e-3 of the output scale, not the 1e-5 of the decode and verify kernels, which stay
//! f32-exact. Blocks of 128 query rows of one head walk 64-key tiles up to their causal limit.

use super::kv::KvView;
use super::ops::{aligned16, check, StepLens};
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut};

/// Query rows per block (8 warps of 16) and threads per block of the prefill kernels.
const ROWS_PER_BLOCK: usize = 128;
const THREADS: u32 = 256;

/// Dynamic shared memory of `attention_prefill_hd{hd}_f32[_kvbf16]`: K and V tiles of 64 keys as
/// bf16, double-buffered (kernels/attention_prefill.cu, PF_SMEM).
pub(crate) fn smem_bytes(head_dim: usize) -> usize {
    2 * 2 * 64 * head_dim * 2
}

impl Gpu {
    /// Causal attention of `rows` query rows at positions `lens.first_pos ..` against cache rows
    /// `[0, first_pos + rows)`: q `[rows, nh·hd]` f32 (already normed and rotated), K/V caches
    /// `[≥ kv_len, nkv·hd]` (f32 or bf16, KvView), out `[rows, nh·hd]` f32. Bf16 tensor cores, f32 softmax and accumulation.
    ///
    /// Row r sees keys `0 ..= first_pos + r` (and none at or past kv_len); first_pos and kv_len
    /// are read from `lens.dev` on the device, so a captured graph serves every position. The
    /// host's `lens.first_pos` and `lens.kv_cap` only check the buffers: the caches must hold
    /// `kv_cap ≥ first_pos + rows` rows, and the kernel reads no row at or past `kv_cap`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill(
        &self,
        q: &CudaView<f32>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        lens: &StepLens<'_>,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    ) -> CudaResult<()> {
        if !matches!(head_dim, 64 | 128) || n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(CudaError::Shape(format!(
                "attention_prefill: head_dim {head_dim} must be 64 or 128, heads {n_heads} a non-zero multiple of kv heads {n_kv_heads}"
            )));
        }
        let (k_dtype, v_dtype) = (k.dtype(), v.dtype());
        if k_dtype != v_dtype {
            return Err(CudaError::Shape(format!(
                "attention_prefill: K cache is {}, V cache {}",
                k_dtype.name(),
                v_dtype.name()
            )));
        }
        let kv_cap = lens.kv_cap;
        if kv_cap < lens.first_pos + rows {
            return Err(CudaError::Shape(format!(
                "attention_prefill: kv_cap {kv_cap} below first_pos {} + rows {rows}",
                lens.first_pos
            )));
        }
        let q_len = rows * n_heads * head_dim;
        let kv_values = kv_cap * n_kv_heads * head_dim;
        check("attention_prefill q", q.len(), q_len)?;
        check("attention_prefill k", k.len(), kv_values)?;
        check("attention_prefill v", v.len(), kv_values)?;
        check("attention_prefill out", out.len(), q_len)?;
        check("attention_prefill lens", lens.dev.len(), 2)?;
        // The kernel indexes rows, heads and cache positions as 32-bit ints (element offsets are
        // 64-bit).
        if kv_cap > i32::MAX as usize || rows > i32::MAX as usize - ROWS_PER_BLOCK || n_heads > i32::MAX as usize {
            return Err(CudaError::Shape(format!(
                "attention_prefill: rows {rows}, kv_cap {kv_cap} or heads {n_heads} too large"
            )));
        }
        // 16-byte K/V chunk loads (cp.async or float4), 8-byte q loads and out stores.
        if !k.aligned16(self) || !v.aligned16(self) || !aligned16(self, q) || !aligned16(self, &out.as_view()) {
            return Err(CudaError::Shape("attention_prefill: q, K/V and out views must be 16-byte aligned".into()));
        }
        if rows == 0 {
            return Ok(());
        }
        let tiles = rows.div_ceil(ROWS_PER_BLOCK);
        if tiles > 65_535 {
            return Err(CudaError::Shape(format!("attention_prefill: {rows} rows exceed the grid")));
        }
        let name = format!("attention_prefill_hd{head_dim}_f32{}", k_dtype.kernel_suffix());
        // attention_prefill_hd*_f32[_kvbf16](q, k, v, out, rows, nh, nkv, lens, kv_cap)
        let args = [
            dptr(self, q),
            k.arg(self),
            v.arg(self),
            dptr_mut(self, out),
            Arg::I32(rows as i32),
            Arg::I32(n_heads as i32),
            Arg::I32(n_kv_heads as i32),
            dptr(self, &lens.dev),
            Arg::I32(kv_cap as i32),
        ];
        let grid = (n_heads as u32, tiles as u32, 1);
        self.launch_pdl_smem(&name, grid, THREADS, smem_bytes(head_dim) as u32, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::smem_bytes;

    #[test]
    fn shared_memory_is_two_buffers_of_k_and_v_tiles() {
        // 64 KB at head dim 128: above the default 48 KB, so `dynamic_smem` raises the limit.
        assert_eq!(smem_bytes(128), 65_536);
        assert_eq!(smem_bytes(64), 32_768);
        for name in ["attention_prefill_hd128_f32", "attention_prefill_hd128_f32_kvbf16"] {
            assert_eq!(super::super::ops::dynamic_smem(name), Some(65_536), "{name}");
        }
        assert_eq!(super::super::ops::dynamic_smem("attention_prefill_hd64_f32_kvbf16"), Some(32_768));
    }
}
