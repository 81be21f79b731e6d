//! Large-M projections for the prefill: cuBLAS GEMMs on the tensor cores, and the element-wise
//! ops that put their inputs in the weights' dtype (kernels/prefill.cu).
//!
//! The small-M matvec (matvec.rs) streams each weight once and is at the bandwidth floor for a
//! few rows, but its FLOP rate is that of a bandwidth-bound kernel (~18 TFLOP/s on the H200 at
//! 64 rows): a 4,000-token prompt took 3.6 s through it. A GEMM of hundreds of rows is bound by
//! the tensor cores instead, so the prefill hands its chunks to cuBLAS (`cublasGemmEx`):
//!
//! ```text
//! y[m, n] = x[m, k] · W[n, k]ᵀ  (+ y[m, n] when accumulating: the residual add, as beta = 1)
//! ```
//!
//! W is the checkpoint's matrix in its dtype (row-major `[n, k]`, the layout the matvec reads),
//! x an activation matrix in the same dtype (cuBLAS multiplies two operands of one type), y f32,
//! accumulated in f32 (`CUBLAS_COMPUTE_32F`). Row-major `x[m, k]` is column-major `k × m`, and
//! row-major `W[n, k]` column-major `k × n`, so `yᵀ = op(W)ᵀ · x` is cuBLAS's `TN` call with
//! `(m, n, k) = (n, m, k)`. For f32 weights (the test fixtures) the same call runs in f32 with no
//! rounding at all. cuBLAS gets a workspace from the model's arena at load, so it never
//! allocates while serving.
//!
//! Block-scaled FP8 weights (`WeightBuf::Fp8`, Qwen's layout: kernels/fp8.cuh) are widened per
//! GEMM into a bf16 scratch matrix the handle owns (`dequant_fp8_bf16`: each weight
//! `e4m3 · scale` rounded once to bf16, a relative rounding of at most 2^-9), then multiplied as
//! a bf16 weight with bf16 activations, f32 accumulation. cuBLAS's FP8 GEMMs would read the
//! bytes directly, but take one scale per tensor (or per row) on sm_90, not Qwen's 128 × 128
//! blocks; the widening streams 3 bytes per weight (read 1, write 2) for a GEMM whose chunk of
//! 2,048 rows does 2 × 2,048 FLOPs per weight, so it costs a few percent of a chunk
//! (`docs/perf.md`). The scratch need not hold a whole matrix: a weight larger than it is widened
//! and multiplied in tiles of whole 128-row scale blocks ([`dequant_tile_rows`]), each GEMM
//! writing its columns of y, so a model plans [`DEQUANT_SCRATCH`] values (32 MB) instead of its
//! largest projection (gate|up: 201 MB for Qwen3-8B). The tiles' products are the same; only
//! cuBLAS's choice of kernel per shape can change the order of a sum's f32 additions.

use super::ops::{aligned16, check, fp8_tile_rows, Fp8Buf, WeightBuf};
use super::pdl::{device_addr, dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::cublas::sys as cublas;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

/// Bytes of cuBLAS workspace planned per model (NVIDIA recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Bytes of cuBLAS workspace for GEMMs of chunks of up to `rows` rows: [`WORKSPACE_BYTES`], or
/// for chunks of 256 rows or fewer (a small card's `--prefill-chunk`) 4 MiB, NVIDIA's figure for
/// the GPUs before Hopper; the workspace only widens cuBLAS's choice of kernels.
pub fn workspace_bytes(rows: usize) -> usize {
    if rows <= 256 {
        4 << 20
    } else {
        WORKSPACE_BYTES
    }
}

/// bf16 values of the dequant scratch a model plans for its FP8 GEMMs (at most: a model whose
/// largest FP8 matrix is smaller plans that): 32 MB, 4,096 rows of 4,096 columns.
pub const DEQUANT_SCRATCH: usize = 16 << 20;

/// bf16 values of dequant scratch for FP8 GEMMs of chunks of up to `rows` rows whose largest
/// FP8 matrix holds `largest` values: 8,192 a row, at least 4 Mi (8 MB) and at most
/// [`DEQUANT_SCRATCH`]. A short chunk (`--prefill-chunk`) spends as long on each tile's widening
/// as on its GEMM, so more, smaller tiles cost it little, and a small card keeps 25 MB.
pub fn dequant_scratch(rows: usize, largest: usize) -> usize {
    largest.min(rows.saturating_mul(8192).clamp(4 << 20, DEQUANT_SCRATCH))
}

/// A cuBLAS handle on the GPU's op stream, with its workspace.
pub struct Blas {
    blas: CudaBlas,
    _workspace: CudaSlice<u8>,
    /// The bf16 image of an FP8 weight, rewritten before each of its GEMMs (see the module docs);
    /// empty when no weight is FP8.
    dequant: Option<CudaSlice<u16>>,
}

impl Blas {
    /// A handle on `gpu`'s stream that uses `workspace` (from the caller's arena) for scratch.
    pub fn new(gpu: &Gpu, mut workspace: CudaSlice<u8>) -> CudaResult<Blas> {
        let blas = CudaBlas::new(gpu.stream.clone()).map_err(|e| CudaError::Unavailable(format!("cuBLAS: {e:?}")))?;
        let bytes = workspace.len();
        let (ptr, _guard) = workspace.device_ptr_mut(&gpu.stream);
        // SAFETY: the handle is live and the workspace is a device buffer of `bytes` bytes that
        // this struct keeps alive for as long as the handle.
        let status = unsafe { cublas::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, bytes) };
        drop(_guard);
        status_ok("cublasSetWorkspace", status)?;
        Ok(Blas { blas, _workspace: workspace, dequant: None })
    }

    /// The handle with `scratch` as the bf16 image of FP8 weights (from the caller's arena, like
    /// the workspace): at least one row of the widest FP8 matrix it multiplies; larger matrices
    /// go in tiles.
    pub fn with_dequant(mut self, scratch: CudaSlice<u16>) -> Blas {
        self.dequant = Some(scratch);
        self
    }
}

fn status_ok(what: &str, status: cublas::cublasStatus_t) -> CudaResult<()> {
    if status == cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Shape(format!("{what} failed: {status:?}")))
    }
}

/// The 16-bit float formats a GEMM input can be rounded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

impl Half {
    /// The format of a weight matrix, `None` for f32 weights (which take f32 inputs as they are).
    pub fn of(w: &WeightBuf) -> Option<Half> {
        match w {
            WeightBuf::Bf16(_) => Some(Half::Bf16),
            WeightBuf::F16(_) => Some(Half::F16),
            WeightBuf::F32(_) => None,
            // Widened to bf16 for cuBLAS (module docs), so its activations are rounded to bf16.
            WeightBuf::Fp8(_) => Some(Half::Bf16),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Half::Bf16 => "bf16",
            Half::F16 => "f16",
        }
    }
}

/// A GEMM's activation input, in its weight's dtype: f32, or bf16/f16 bits.
pub enum GemmIn<'a> {
    F32(CudaView<'a, f32>),
    Half(CudaView<'a, u16>),
}

impl GemmIn<'_> {
    fn len(&self) -> usize {
        match self {
            GemmIn::F32(v) => v.len(),
            GemmIn::Half(v) => v.len(),
        }
    }
}

/// Rows of an FP8 weight `[n, k]` widened per GEMM call with a dequant scratch of `scratch`
/// bf16 values: all `n` when they fit, else the most whole 128-row scale blocks that do (or the
/// most rows, below one block), `None` when not one row fits.
pub fn dequant_tile_rows(scratch: usize, n: usize, k: usize) -> Option<usize> {
    let fit = scratch / k.max(1);
    match fit {
        0 => None,
        f if f >= n => Some(n.max(1)),
        f if f >= 128 => Some(f / 128 * 128),
        f => Some(f),
    }
}

/// One `cublasGemmEx` call: `y[:, n columns at y_ptr] = x · Wᵀ` (+ y when beta is 1), W `[n, k]`
/// at `w_ptr` (lda k), x `[m, k]` (ldb k), y rows of `ldc` values.
struct GemmExt {
    w_ptr: u64,
    w_type: cublas::cudaDataType,
    x_ptr: u64,
    y_ptr: u64,
    m: i32,
    k: i32,
    n: i32,
    ldc: i32,
}

impl GemmExt {
    fn run(&self, blas: &Blas, beta: f32) -> CudaResult<()> {
        let alpha = 1f32;
        // SAFETY: the caller checked the buffers' lengths for column-major op(A) = Wᵀ (k × n, lda
        // k), B = xᵀ (k × m, ldb k), C = yᵀ (n × m within ldc ≥ n); the activations are in the
        // weights' dtype (x_type = w_type) except for f32, which both are; alpha and beta are host
        // f32 scalars, as CUBLAS_COMPUTE_32F with the default host pointer mode expects.
        let status = unsafe {
            cublas::cublasGemmEx(
                *blas.blas.handle(),
                cublas::cublasOperation_t::CUBLAS_OP_T,
                cublas::cublasOperation_t::CUBLAS_OP_N,
                self.n,
                self.m,
                self.k,
                &alpha as *const f32 as *const _,
                self.w_ptr as *const _,
                self.w_type,
                self.k,
                self.x_ptr as *const _,
                self.w_type,
                self.k,
                &beta as *const f32 as *const _,
                self.y_ptr as *mut _,
                cublas::cudaDataType::CUDA_R_32F,
                self.ldc,
                cublas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        status_ok("cublasGemmEx", status)
    }
}

impl Gpu {
    /// `y[m, n] = x[m, k] · W[n, k]ᵀ`, or `y += …` when `accumulate`, on the tensor cores.
    /// `x` must be in `w`'s dtype (f32 for f32 weights, the 16 bits of bf16/f16 otherwise).
    pub fn gemm(
        &self,
        blas: &Blas,
        w: &WeightBuf,
        x: &GemmIn<'_>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        self.gemm_rows(blas, w, 0, x, y, shape, accumulate)
    }

    /// [`Gpu::gemm`] over rows `row0 .. row0 + n` of `w` (a block of a stacked matrix, such as
    /// the k|v rows of a fused q|k|v projection), as [`Gpu::matvec_rows`] is to the matvec.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_rows(
        &self,
        blas: &Blas,
        w: &WeightBuf,
        row0: usize,
        x: &GemmIn<'_>,
        y: &mut CudaViewMut<f32>,
        (m, k, n): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        check("gemm w", w.len(), (row0 + n) * k)?;
        check("gemm x", x.len(), m * k)?;
        check("gemm y", y.len(), m * n)?;
        fp8_tile_rows("gemm", w, row0, n)?;
        if m == 0 {
            return Ok(());
        }
        let dims = [m, n, k].map(i32::try_from);
        let [Ok(mi), Ok(ni), Ok(ki)] = dims else {
            return Err(CudaError::Shape(format!("gemm: shape {m} × {k} → {n} is past cuBLAS's 32-bit sizes")));
        };
        use cublas::cudaDataType::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
        let (x_ptr, _xg) = match (x, w) {
            (GemmIn::F32(v), WeightBuf::F32(_)) => v.device_ptr(&self.stream),
            (GemmIn::Half(v), WeightBuf::Bf16(_) | WeightBuf::F16(_) | WeightBuf::Fp8(_)) => v.device_ptr(&self.stream),
            _ => {
                return Err(CudaError::Shape(format!(
                    "gemm: activations must be in the weights' dtype ({})",
                    w.suffix()
                )))
            }
        };
        let (y_ptr, _yg) = y.device_ptr_mut(&self.stream);
        let beta = if accumulate { 1f32 } else { 0f32 };
        let name = format!("gemm_{}", w.suffix());
        let call = |w_ptr: u64, w_type, (n0, nt): (usize, usize)| {
            let ext =
                GemmExt { w_ptr, w_type, x_ptr, y_ptr: y_ptr + (4 * n0) as u64, m: mi, k: ki, n: nt as i32, ldc: ni };
            self.timed(&name, None, || ext.run(blas, beta))
        };
        // The first row's address: `row0 · k` elements of the weight's own size in.
        let at = |p: u64, bytes: usize| p + (row0 * k * bytes) as u64;
        match w {
            WeightBuf::Bf16(s) => {
                let (p, _g) = s.device_ptr(&self.stream);
                call(at(p, 2), CUDA_R_16BF, (0, n))
            }
            WeightBuf::F16(s) => {
                let (p, _g) = s.device_ptr(&self.stream);
                call(at(p, 2), CUDA_R_16F, (0, n))
            }
            WeightBuf::F32(s) => {
                let (p, _g) = s.device_ptr(&self.stream);
                call(at(p, 4), CUDA_R_32F, (0, n))
            }
            // Widened in tiles of whole rows as large as the scratch holds, each multiplied into
            // its columns of y (ldc stays n), so the scratch need not hold the whole matrix.
            WeightBuf::Fp8(f) => {
                let scratch = blas.dequant.as_ref().ok_or_else(|| {
                    CudaError::Shape(
                        "gemm: an FP8 weight needs the handle's dequant scratch (Blas::with_dequant)".into(),
                    )
                })?;
                // Tiled bytes are widened in whole 16-row tiles (dequant_fp8_bf16 starts at n0).
                let nt = dequant_tile_rows(scratch.len(), n, k)
                    .map(|nt| if f.tiled && nt < n { nt / 16 * 16 } else { nt })
                    .filter(|&nt| nt > 0)
                    .ok_or_else(|| {
                        CudaError::Shape(format!(
                            "gemm: an FP8 weight of {n} × {k} past a scratch of {}",
                            scratch.len()
                        ))
                    })?;
                let s_ptr = device_addr(self, scratch);
                for n0 in (0..n).step_by(nt) {
                    let rows = nt.min(n - n0);
                    self.dequant_fp8(f, s_ptr, (row0 + n0, rows), k)?;
                    call(s_ptr, CUDA_R_16BF, (n0, rows))?;
                }
                Ok(())
            }
        }
    }

    /// The bf16 image of rows `n0..n0 + rows` of FP8 weight `w` (`k` columns) at device address
    /// `scratch` (a handle's dequant scratch, checked by the caller to hold them):
    /// `dequant_fp8_bf16`.
    fn dequant_fp8(&self, w: &Fp8Buf, scratch: u64, (n0, rows): (usize, usize), k: usize) -> CudaResult<()> {
        check("gemm fp8 rows", w.srow.len().max(n0 + rows), w.srow.len())?;
        check("gemm fp8 bytes", w.q.len(), w.srow.len() * k)?;
        // dequant_fp8_bf16(w, scale, srow, out, rows, in, scale_cols, kb, tiled) on the tile's
        // rows: its bytes and scale-row map start n0 rows in (tiled: n0 is a whole tile, whose
        // bytes start n0 · k in too; the handle is shared, its scratch is the stream's alone).
        let args = [
            Arg::Ptr(device_addr(self, &w.q) + (n0 * k) as u64),
            dptr(self, &w.scale),
            Arg::Ptr(device_addr(self, &w.srow) + (4 * n0) as u64),
            Arg::Ptr(scratch),
            Arg::I32(rows as i32),
            Arg::I32(k as i32),
            Arg::I32(w.scale_cols as i32),
            Arg::I32(w.block_k as i32),
            Arg::I32(w.tiled as i32),
        ];
        // A row per block at a time (kernels/fp8.cu).
        self.launch_pdl("dequant_fp8_bf16", (rows.clamp(1, 16 * self.sms.max(1)) as u32, 1, 1), 256, &args)
    }

    /// `out[r] = round(rmsnorm(x[r]) · w)` into `half` bits, for `rows` rows of `dim` values.
    pub fn rmsnorm_to(
        &self,
        half: Half,
        x: &CudaView<f32>,
        w: &CudaView<f32>,
        eps: f32,
        rows: usize,
        out: &mut CudaViewMut<u16>,
    ) -> CudaResult<()> {
        let dim = w.len();
        check("rmsnorm_to x", x.len(), rows * dim)?;
        check("rmsnorm_to out", out.len(), rows * dim)?;
        let name = format!("rmsnorm_to_{}", half.suffix());
        // As rmsnorm_f32 launches (1,024 threads; one float4 a thread on whole aligned float4
        // rows of at most 4,096 values, 8-byte aligned output here), so the f32 values before
        // the rounding are its values.
        let vec4 =
            dim % 4 == 0 && aligned16(self, x) && aligned16(self, w) && device_addr(self, &out.as_view()) % 8 == 0;
        self.launch_rmsnorm(&name, (x, w, dptr_mut(self, out)), (rows, dim), eps, vec4)
    }

    /// `act[r, i] = round(silu(gu[r, 2i]) · gu[r, 2i + 1])` into `half` bits (gate|up interleaved).
    pub fn swiglu_pairs_to(
        &self,
        half: Half,
        gu: &CudaView<f32>,
        act: &mut CudaViewMut<u16>,
        inter: usize,
        rows: usize,
    ) -> CudaResult<()> {
        check("swiglu_pairs_to gu", gu.len(), rows * 2 * inter)?;
        check("swiglu_pairs_to act", act.len(), rows * inter)?;
        let n = i32::try_from(rows * inter).map_err(|_| CudaError::Shape("swiglu_pairs_to: too many values".into()))?;
        let name = format!("swiglu_pairs_to_{}", half.suffix());
        let args = [dptr(self, gu), dptr_mut(self, act), Arg::I32(inter as i32), Arg::I32(rows as i32)];
        self.launch_pdl(&name, (grid_stride_blocks(n as usize, self.sms), 1, 1), 256, &args)
    }

    /// `y[i] = round(x[i])` into `half` bits, for the first `n` values.
    pub fn cast_to(&self, half: Half, x: &CudaView<f32>, y: &mut CudaViewMut<u16>, n: usize) -> CudaResult<()> {
        check("cast_to x", x.len(), n)?;
        check("cast_to y", y.len(), n)?;
        let ni = i32::try_from(n).map_err(|_| CudaError::Shape("cast_to: too many values".into()))?;
        let name = format!("cast_to_{}", half.suffix());
        let args = [dptr(self, x), dptr_mut(self, y), Arg::I32(ni)];
        self.launch_pdl(&name, (grid_stride_blocks(n, self.sms), 1, 1), 256, &args)
    }
}

/// Blocks of 256 threads for a grid-stride loop over `n` values: enough to fill every SM a few
/// times over, no more than the values need.
fn grid_stride_blocks(n: usize, sms: usize) -> u32 {
    n.div_ceil(256).clamp(1, 8 * sms.max(1)) as u32
}

impl Gpu {
    /// `act[r, i] = silu(gu[r, 2i]) · gu[r, 2i + 1]` in f32 (gate|up interleaved), the input of
    /// an f32 `down` GEMM.
    pub fn swiglu_pairs(
        &self,
        gu: &CudaView<f32>,
        act: &mut CudaViewMut<f32>,
        inter: usize,
        rows: usize,
    ) -> CudaResult<()> {
        check("swiglu_pairs gu", gu.len(), rows * 2 * inter)?;
        check("swiglu_pairs act", act.len(), rows * inter)?;
        // swiglu_pairs_f32(gu, act, inter, rows): one thread per output, no grid-stride loop.
        let args = [dptr(self, gu), dptr_mut(self, act), Arg::I32(inter as i32), Arg::I32(rows as i32)];
        self.launch_pdl("swiglu_pairs_f32", ((rows * inter).div_ceil(256) as u32, 1, 1), 256, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequant_scratch_follows_the_chunk_between_its_bounds() {
        let gate_up = 2 * 12288 * 4096;
        assert_eq!(dequant_scratch(2048, gate_up), DEQUANT_SCRATCH, "default chunks: the cap");
        assert_eq!(dequant_scratch(256, gate_up), 4 << 20, "short chunks: the floor");
        assert_eq!(dequant_scratch(1024, gate_up), 1024 * 8192);
        assert_eq!(dequant_scratch(2048, 1000), 1000, "never more than the largest matrix");
        // Every Qwen3-8B projection still tiles in whole 128-row scale blocks at the floor.
        for (n, k) in [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)] {
            let rows = dequant_tile_rows(4 << 20, n, k).unwrap();
            assert!(rows >= 128 && rows.is_multiple_of(128), "{n} × {k}: tiles of {rows} rows");
        }
    }
}
