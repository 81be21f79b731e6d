//! Typed launch wrappers: the weight and scratch types every family uses, the shared checks and
//! launch helpers, and the wrappers of embedding, RMSNorm and RoPE/append. Attention
//! (`attention_split.rs`), the matvec, argmax and Markov-head families have their own files
//! (`matvec.rs`, `argmax.rs`, `markov.rs`).
//!
//! Each wrapper checks every buffer length against the shape it is given, then launches on the
//! GPU's stream. Activations are f32 views; large weights are a [`WeightBuf`] in the
//! checkpoint's dtype, small per-channel weights (norms, head vectors) f32.

use super::attention_split::{split_partials, SPLIT_ROWS};
use super::kv::KvViewMut;
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// A weight matrix on the device in its checkpoint dtype (bf16 and f16 stored as raw u16), or
/// block-scaled FP8 ([`Fp8Buf`]).
pub enum WeightBuf {
    Bf16(CudaSlice<u16>),
    F16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    Fp8(Fp8Buf),
}

/// An FP8 weight matrix `[rows, cols]` as the kernels read it (kernels/fp8.cuh):
/// `W[o, k] = e4m3(q[o, k]) · scale[srow[o], k / block_k]`. The scale table stacks the scales of
/// every matrix of a fused projection (q|k|v, gate|up), and `srow` maps each row of the matrix
/// as laid out (stacked or interleaved) to its scale row, so one lookup serves both layouts.
pub struct Fp8Buf {
    /// E4M3 bytes `[rows, cols]`, in tile order where [`fp8_tiled`] holds for the shape (rows a
    /// multiple of 16, columns of 64; kernels/fp8.cuh), else row-major: [`fp8_tile_order`].
    pub q: CudaSlice<u8>,
    /// `[scale rows, scale_cols]` f32 block scales.
    pub scale: CudaSlice<f32>,
    /// `[rows]`: the scale row of each weight row.
    pub srow: CudaSlice<u32>,
    pub cols: usize,
    /// Scale blocks per row: `⌈cols / block_k⌉`.
    pub scale_cols: usize,
    /// Columns per scale block.
    pub block_k: usize,
    /// Scratch for x scaled and split into two f16 parts before each tensor-core launch, and
    /// each row's scale (kernels/fp8.cu `split_x_f16x2`): [`Fp8Buf::xsplit_len`] u32 words,
    /// shared by a model's matrices of one width (each launch writes it before it reads).
    pub xsplit: Arc<CudaSlice<u32>>,
    /// Whether `q` is in tile order ([`fp8_tiled`] of its shape).
    pub tiled: bool,
}

/// Whether an FP8 matrix of `rows` × `cols` lies in tile order on the device: whole tiles of 16
/// rows and chunks of 64 columns (kernels/fp8.cuh), so that a warp's load of a chunk is 512
/// contiguous bytes a row half. Qwen's projections all are.
pub fn fp8_tiled(rows: usize, cols: usize) -> bool {
    rows.is_multiple_of(16) && cols.is_multiple_of(64) && rows > 0 && cols > 0
}

/// Where byte `(o, k)` of a tiled `[rows, cols]` FP8 matrix lies (kernels/fp8.cuh `fp8_offset`):
/// tile o / 16, chunk k / 64 as 1 KB, rows 8–15 of the tile 512 bytes on, then lane
/// 4·(o % 8) + (k % 64) / 16 at 16 bytes each.
pub fn fp8_tile_offset(o: usize, k: usize, cols: usize) -> usize {
    let (r, t) = (o % 16, (k / 16) % 4);
    ((o / 16) * (cols / 64) + k / 64) * 1024 + (r / 8) * 512 + ((r % 8) * 4 + t) * 16 + k % 16
}

/// One tile: 16 row-major rows of `cols` bytes (`rows`) into `out` (16 · cols bytes) in tile
/// order — chunk c of 64 columns at c KB, rows 8–15 512 bytes on, row r's 64 bytes at
/// 64 · (r % 8), so lane 4·(r % 8) + t finds its 16 at 16 · lane ([`fp8_tile_offset`]).
pub fn fp8_place_tile(rows: &[u8], cols: usize, out: &mut [u8]) {
    for (r, row) in rows.chunks_exact(cols).enumerate() {
        let half = (r / 8) * 512 + (r % 8) * 64;
        for (c, chunk) in row.chunks_exact(64).enumerate() {
            let at = c * 1024 + half;
            out[at..at + 64].copy_from_slice(chunk);
        }
    }
}

/// A row-major `[rows, cols]` FP8 matrix in its device order: tile order where [`fp8_tiled`],
/// else as it is.
pub fn fp8_tile_order(q: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    if !fp8_tiled(rows, cols) || q.len() != rows * cols {
        return q.to_vec();
    }
    let mut out = vec![0u8; q.len()];
    for (tile, dst) in q.chunks_exact(16 * cols).zip(out.chunks_exact_mut(16 * cols)) {
        fp8_place_tile(tile, cols, dst);
    }
    out
}

/// Rows `row0 .. row0 + rows` of `w` as a kernel reads them: for a tiled FP8 weight they must
/// start and end at whole 16-row tiles (q|k|v's k|v rows do); an error naming `what` otherwise.
pub(crate) fn fp8_tile_rows(what: &str, w: &WeightBuf, row0: usize, rows: usize) -> Result<(), CudaError> {
    match w {
        WeightBuf::Fp8(f) if f.tiled && !(row0.is_multiple_of(16) && rows.is_multiple_of(16)) => Err(CudaError::Shape(
            format!("{what}: rows {row0}..{} of a tiled FP8 weight are not whole 16-row tiles", row0 + rows),
        )),
        _ => Ok(()),
    }
}

/// The most rows one FP8 tensor-core launch splits x for: a `_w4_fp8` twin's 32.
pub const FP8_SPLIT_ROWS: usize = 32;

impl Fp8Buf {
    /// u32 words of the x-split scratch for `cols` columns: two parts of the up to 32 rows a
    /// tensor-core launch takes (its wide twins: matvec_pick.rs `wide_twin`) as f16 pairs, then
    /// the rows' scales (64·cols + 128 bytes: 256 KB at 4,096 columns).
    pub fn xsplit_len(cols: usize) -> usize {
        2 * FP8_SPLIT_ROWS * cols / 2 + FP8_SPLIT_ROWS
    }

    /// The weight from its parts on the device: E4M3 bytes `q` `[srow.len(), cols]` in the
    /// shape's device order ([`fp8_tile_order`]: tiles where [`fp8_tiled`]), the scale
    /// table `scale` in blocks of `block_k` columns, each row's scale row `srow` (the largest
    /// `srow_max`), and the x-split scratch (at least [`Fp8Buf::xsplit_len`]). The parts are
    /// checked against each other.
    pub fn new(
        q: CudaSlice<u8>,
        scale: CudaSlice<f32>,
        (srow, srow_max): (CudaSlice<u32>, u32),
        cols: usize,
        block_k: usize,
        xsplit: Arc<CudaSlice<u32>>,
    ) -> Result<Fp8Buf, CudaError> {
        let tiled = fp8_tiled(srow.len(), cols);
        let buf = Fp8Buf { q, scale, srow, cols, scale_cols: cols.div_ceil(block_k.max(1)), block_k, xsplit, tiled };
        buf.check(srow_max)?;
        Ok(buf)
    }

    /// Checks the parts against each other (lengths, a nonzero block, `srow` in the table).
    fn check(&self, srow_max: u32) -> Result<(), CudaError> {
        let rows = self.srow.len();
        let bad = |m: String| Err(CudaError::Shape(format!("fp8 weight: {m}")));
        if self.block_k == 0 || self.scale_cols != self.cols.div_ceil(self.block_k) {
            return bad(format!(
                "{} scale columns for {} columns in blocks of {}",
                self.scale_cols, self.cols, self.block_k
            ));
        }
        if self.q.len() != rows * self.cols {
            return bad(format!("{} bytes for {rows} × {}", self.q.len(), self.cols));
        }
        if self.xsplit.len() < Self::xsplit_len(self.cols) {
            return bad(format!("x-split scratch of {} pairs for {} columns", self.xsplit.len(), self.cols));
        }
        if (srow_max as usize + 1) * self.scale_cols > self.scale.len() {
            return bad(format!("scale row {srow_max} past a table of {} values", self.scale.len()));
        }
        Ok(())
    }
}

impl WeightBuf {
    pub fn len(&self) -> usize {
        match self {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => s.len(),
            WeightBuf::F32(s) => s.len(),
            WeightBuf::Fp8(f) => f.q.len(),
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
            // The bytes and what is read with them; the x-split scratch is not weights.
            WeightBuf::Fp8(f) => f.q.len() + 4 * (f.scale.len() + f.srow.len()),
        }
    }

    pub(crate) fn suffix(&self) -> &'static str {
        match self {
            WeightBuf::Bf16(_) => "bf16",
            WeightBuf::F16(_) => "f16",
            WeightBuf::F32(_) => "f32",
            WeightBuf::Fp8(_) => "fp8",
        }
    }

    /// Elements `range` of the buffer (a block of rows of the matrix; for FP8 whole rows).
    pub(crate) fn view(&self, range: std::ops::Range<usize>) -> WeightView<'_> {
        match self {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => WeightView::U16(s.slice(range)),
            WeightBuf::F32(s) => WeightView::F32(s.slice(range)),
            WeightBuf::Fp8(f) => {
                let c = f.cols.max(1);
                WeightView::Fp8 {
                    q: f.q.slice(range.clone()),
                    scale: f.scale.slice(..),
                    srow: f.srow.slice(range.start / c..range.end.div_ceil(c)),
                    scale_cols: f.scale_cols,
                    block_k: f.block_k,
                    xsplit: f.xsplit.slice(..),
                    tiled: f.tiled,
                }
            }
        }
    }
}

pub(crate) enum WeightView<'a> {
    U16(CudaView<'a, u16>),
    F32(CudaView<'a, f32>),
    Fp8 {
        q: CudaView<'a, u8>,
        scale: CudaView<'a, f32>,
        srow: CudaView<'a, u32>,
        scale_cols: usize,
        block_k: usize,
        xsplit: CudaView<'a, u32>,
        /// Tile order (a view of tiled rows starts and ends at whole tiles: the callers check).
        tiled: bool,
    },
}

/// Scratch of the split-KV attention and split argmax, planned once per model.
pub struct OpScratch {
    /// `[splits, rows, heads, head_dim]` unnormalised partial outputs.
    pub attn_o: CudaSlice<f32>,
    /// `[splits, rows, heads, 2]` running max and sum.
    pub attn_ml: CudaSlice<f32>,
    /// `[rows, segments]` partial maxima and their indices, and one ticket per row.
    pub argmax_v: CudaSlice<f32>,
    pub argmax_i: CudaSlice<u32>,
    pub argmax_tickets: CudaSlice<u32>,
}

/// Most logits rows and segments per row of one split argmax.
pub const ARGMAX_ROWS: usize = 64;
pub const ARGMAX_SEGMENTS: usize = 256;

impl OpScratch {
    /// Element counts of the buffers for `nh × hd` query heads over `nkv` KV heads on `sms`
    /// SMs: (attn_o, attn_ml, argmax pairs, tickets). The partials hold the most (slice, row)
    /// pairs any split launch of up to [`SPLIT_ROWS`] rows takes on this GPU at any context
    /// ([`split_partials`]): 528 for Qwen3-8B on 132 SMs (8.7 MB: sixteen rows at 33 slices),
    /// where [`MAX_SPLITS`](super::attention_split::MAX_SPLITS) × [`SPLIT_ROWS`] = 2,048 would plan 34 MB a model.
    pub fn sizes((nh, nkv, hd): (usize, usize, usize), sms: usize) -> (usize, usize, usize, usize) {
        let most = (1..=SPLIT_ROWS).map(|rows| split_partials(rows, (nh, nkv), sms)).max().unwrap_or(1);
        let q = most * nh;
        (q * hd, q * 2, ARGMAX_ROWS * ARGMAX_SEGMENTS, ARGMAX_ROWS)
    }

    /// Whether the partials hold a split launch of `rows` rows of `nh × hd` query heads over
    /// `nkv` KV heads on `sms` SMs at any context (else the caller takes the per-head kernel).
    pub fn holds(&self, rows: usize, (nh, nkv, hd): (usize, usize, usize), sms: usize) -> bool {
        let pairs = split_partials(rows, (nh, nkv), sms);
        self.attn_o.len() >= pairs * nh * hd && self.attn_ml.len() >= pairs * nh * 2
    }
}

/// Dynamic shared memory of the kernels that use it: `attention_tc_hd*` stages Q (split in
/// two; the `attention_tc1` twins use the first half), a 32-key K and V tile and the 32 × 33
/// score tile (kernels/attention_tc.cu, TC_SMEM);
/// `attention_prefill_hd*` double-buffers 64-key bf16 K and V tiles (attention_prefill.rs).
pub(crate) fn dynamic_smem(name: &str) -> Option<usize> {
    let hd = match name.strip_suffix("_kvbf16").unwrap_or(name) {
        "attention_tc_hd64_f32"
        | "attention_tc_seg_hd64_f32"
        | "attention_tc1_hd64_f32"
        | "attention_tc1_seg_hd64_f32" => 64,
        "attention_tc_hd128_f32"
        | "attention_tc_seg_hd128_f32"
        | "attention_tc1_hd128_f32"
        | "attention_tc1_seg_hd128_f32" => 128,
        "attention_prefill_hd64_f32" => return Some(super::attention_prefill::smem_bytes(64)),
        "attention_prefill_hd128_f32" => return Some(super::attention_prefill::smem_bytes(128)),
        _ if name.starts_with("matvec_split_") => return super::matvec_split::split_smem_of(name),
        _ => return None,
    };
    Some((2 * 32 + 2 * 32) * hd * 4 + 33 * 33 * 4)
}

pub(crate) fn aligned16<T>(gpu: &Gpu, v: &CudaView<T>) -> bool {
    use cudarc::driver::DevicePtr;
    let (ptr, _guard) = v.device_ptr(&gpu.stream);
    ptr % 16 == 0
}

pub(crate) fn check(what: &str, got: usize, want: usize) -> CudaResult<()> {
    if got < want {
        return Err(CudaError::Shape(format!("{what}: buffer holds {got} values, needs {want}")));
    }
    Ok(())
}

/// A step's positions, for the kernels that depend on them (kernels/common.cuh): `dev` holds
/// `[first_pos, kv_len]` in device memory, written by the caller before the step's launches, so
/// that one captured CUDA graph serves every position. The host's `first_pos` and `kv_cap` are
/// for shape checks and launch geometry only: `kv_cap` must be at least every `kv_len` the launch
/// will see (a graph's grid covers `kv_cap` keys; slices past the step's keys exit at once).
pub struct StepLens<'a> {
    pub dev: CudaView<'a, u32>,
    pub first_pos: usize,
    pub kv_cap: usize,
}

pub(crate) fn cfg(grid: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

macro_rules! launch_v {
    ($gpu:expr, $name:expr, $view:expr, $cfg:expr, |$b:ident| $push:block) => {{
        let f = $gpu.function(&$name)?;
        let mut $b = $gpu.stream.launch_builder(f);
        match &$view {
            WeightView::U16(s) => {
                $b.arg(s);
            }
            WeightView::F32(s) => {
                $b.arg(s);
            }
            // FP8 matrices have kernels of their own (matvec.rs); no general kernel reads them.
            WeightView::Fp8 { .. } => {
                return Err(CudaError::Shape(format!("{}: FP8 weights are not supported here", $name)));
            }
        }
        $push;
        // SAFETY: argument types and order match the kernel signature in kernels/*.cu, and the
        // lengths were checked by the caller against the launch shape.
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        let shape = $crate::cuda::ops::launch_shape(&cfg);
        $gpu.timed(&$name, Some(shape), || unsafe { $b.launch(cfg) }.map(|_| ()).map_err(Into::into))?;
    }};
}

/// A launch's (blocks, threads a block), for the trace's launch log (trace.rs).
pub(crate) fn launch_shape(cfg: &cudarc::driver::LaunchConfig) -> (u32, u32) {
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    (g.0 * g.1 * g.2, b.0 * b.1 * b.2)
}

/// Launches a builder under the profiler.
macro_rules! launch {
    ($gpu:expr, $name:expr, $b:expr, $cfg:expr) => {{
        // SAFETY: see each call site: argument order matches the kernel signature.
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        let shape = $crate::cuda::ops::launch_shape(&cfg);
        $gpu.timed($name, Some(shape), || unsafe { $b.launch(cfg) }.map(|_| ()).map_err(Into::into))?;
    }};
}
pub(crate) use {launch, launch_v};

/// The device address of a weight view, for [`Arg::Ptr`].
pub(crate) fn wptr(gpu: &Gpu, view: &WeightView<'_>) -> Arg {
    match view {
        WeightView::U16(s) => dptr(gpu, s),
        WeightView::F32(s) => dptr(gpu, s),
        WeightView::Fp8 { q, .. } => dptr(gpu, q),
    }
}

impl Gpu {
    /// Fills `out` with bf16 values uniform in `[−scale, scale)` from a counter hash of `seed`
    /// (benchmark weights made on the device).
    pub fn fill_uniform_bf16(&self, out: &mut CudaSlice<u16>, seed: u64, scale: f32) -> CudaResult<()> {
        let n = out.len();
        let mut b = self.stream.launch_builder(self.function("fill_uniform_bf16")?);
        b.arg(out).arg(&n).arg(&seed).arg(&scale);
        // SAFETY: matches fill_uniform_bf16(out, n, seed, scale); the grid strides over n.
        launch!(self, "fill_uniform_bf16", b, cfg(n.div_ceil(256).clamp(1, 4096), 256));
        Ok(())
    }

    /// Random E4M3 bytes (no NaN code, |value| < 2) from a device hash, for the bench's FP8
    /// weights (kernels/random.cu).
    pub fn fill_random_fp8(&self, out: &mut CudaSlice<u8>, seed: u64) -> CudaResult<()> {
        let n = out.len();
        let mut b = self.stream.launch_builder(self.function("fill_random_fp8")?);
        b.arg(out).arg(&n).arg(&seed);
        // SAFETY: matches fill_random_fp8(out, n, seed); the grid strides over n.
        launch!(self, "fill_random_fp8", b, cfg(n.div_ceil(256).clamp(1, 4096), 256));
        Ok(())
    }

    /// `dst[r·dst_stride ..][..cols] = src[r·src_stride ..][..cols]` for `rows` rows.
    pub fn copy_rows(
        &self,
        src: &CudaView<f32>,
        dst: &mut CudaViewMut<f32>,
        rows: usize,
        cols: usize,
        (src_stride, dst_stride): (usize, usize),
    ) -> CudaResult<()> {
        if rows == 0 {
            return Ok(());
        }
        check("copy_rows src", src.len(), (rows - 1) * src_stride + cols)?;
        check("copy_rows dst", dst.len(), (rows - 1) * dst_stride + cols)?;
        // copy_rows_f32(src, dst, cols, src_stride, dst_stride).
        let args = [
            dptr(self, src),
            dptr_mut(self, dst),
            Arg::I32(cols as i32),
            Arg::I32(src_stride as i32),
            Arg::I32(dst_stride as i32),
        ];
        self.launch_pdl("copy_rows_f32", (rows as u32, 1, 1), 256, &args)?;
        Ok(())
    }

    /// One launch of an RMSNorm kernel of rmsnorm_f32's form (`rmsnorm_f32`, `rmsnorm_to_*`):
    /// (x, w, out, dim, eps, vec4), a block of 1,024 threads a row.
    pub(crate) fn launch_rmsnorm(
        &self,
        name: &str,
        (x, w, out): (&CudaView<f32>, &CudaView<f32>, Arg),
        (rows, dim): (usize, usize),
        eps: f32,
        vec4: bool,
    ) -> CudaResult<()> {
        let args = [dptr(self, x), dptr(self, w), out, Arg::I32(dim as i32), Arg::F32(eps), Arg::I32(vec4 as i32)];
        self.launch_pdl(name, (rows as u32, 1, 1), 1024, &args)
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
        // The one-float4-per-thread path needs whole, 16-byte aligned float4s in every row.
        let vec4 = dim % 4 == 0 && aligned16(self, x) && aligned16(self, w) && aligned16(self, &out.as_view());
        // rmsnorm_f32(x, w, out, dim, eps, vec4); lengths checked above.
        self.launch_rmsnorm("rmsnorm_f32", (x, w, dptr_mut(self, out)), (rows, dim), eps, vec4)?;
        Ok(())
    }

    /// Fused norm + RoPE + cache append of a q|k|v projection output `[rows, (nq + 2·nkv)·hd]`
    /// for rows at positions `first_pos ..` (from `lens`): q into `q_out`, k and v into the
    /// caches at the same rows. `nq = 0` for key/value-only input (the draft's context rows).
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_rope_append(
        &self,
        qkv: &CudaView<f32>,
        q_norm: &CudaView<f32>,
        k_norm: &CudaView<f32>,
        inv_freq: &CudaView<f32>,
        q_out: &mut CudaViewMut<f32>,
        k_cache: &mut KvViewMut<'_>,
        v_cache: &mut KvViewMut<'_>,
        (rows, nq, nkv): (usize, usize, usize),
        lens: &StepLens<'_>,
        eps: f32,
    ) -> CudaResult<()> {
        let hd = k_norm.len();
        if hd % 2 != 0 || hd > 512 || inv_freq.len() != hd / 2 || (nq > 0 && q_norm.len() != hd) {
            return Err(CudaError::Shape(format!(
                "qkv_rope_append: head_dim {hd} with {} frequencies",
                inv_freq.len()
            )));
        }
        check("qkv_rope_append qkv", qkv.len(), rows * (nq + 2 * nkv) * hd)?;
        check("qkv_rope_append q_out", q_out.len(), rows * nq * hd)?;
        check("qkv_rope_append k_cache", k_cache.len(), (lens.first_pos + rows) * nkv * hd)?;
        check("qkv_rope_append v_cache", v_cache.len(), (lens.first_pos + rows) * nkv * hd)?;
        check("qkv_rope_append lens", lens.dev.len(), 1)?;
        if k_cache.dtype() != v_cache.dtype() {
            return Err(CudaError::Shape("qkv_rope_append: K and V caches of different element types".into()));
        }
        let name = format!("qkv_rope_append_f32{}", k_cache.dtype().kernel_suffix());
        let threads = ((hd / 2).div_ceil(32) * 32) as u32;
        // qkv_rope_append_f32(qkv, q_norm, k_norm, inv_freq, q_out, k_cache, v_cache, nq, nkv,
        // hd, lens, eps); lengths checked above.
        let args = [
            dptr(self, qkv),
            dptr(self, q_norm),
            dptr(self, k_norm),
            dptr(self, inv_freq),
            dptr_mut(self, q_out),
            k_cache.arg(self),
            v_cache.arg(self),
            Arg::I32(nq as i32),
            Arg::I32(nkv as i32),
            Arg::I32(hd as i32),
            dptr(self, &lens.dev),
            Arg::F32(eps),
        ];
        self.launch_pdl(&name, ((rows * (nq + 2 * nkv)) as u32, 1, 1), threads, &args)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tile order is a permutation of the bytes that puts lane (g, t)'s 16 bytes of rows g and
    /// g + 8 of each 64-column chunk where the matvec's loads read them; other shapes stay.
    #[test]
    fn fp8_tile_order_is_the_kernels_layout() {
        for (rows, cols) in [(16, 64), (32, 192), (48, 4096)] {
            let q: Vec<u8> = (0..rows * cols).map(|i| (i * 7 + i / 251) as u8).collect();
            let t = fp8_tile_order(&q, rows, cols);
            let mut seen = vec![false; q.len()];
            for o in 0..rows {
                for k in 0..cols {
                    let at = fp8_tile_offset(o, k, cols);
                    assert!(!seen[at], "{rows}x{cols}: ({o}, {k}) lands on a taken byte");
                    seen[at] = true;
                    assert_eq!(t[at], q[o * cols + k]);
                }
            }
            // A warp's load of chunk c of tile T: row g's bytes 16t.. at lane 4g + t, rows 8–15 next.
            let (tile, c, g, tt) = (rows / 16 - 1, cols / 64 - 1, 5, 2);
            let base = (tile * (cols / 64) + c) * 1024;
            let row = tile * 16 + g;
            assert_eq!(t[base + (4 * g + tt) * 16..][..16], q[row * cols + c * 64 + 16 * tt..][..16]);
            assert_eq!(t[base + 512 + (4 * g + tt) * 16..][..16], q[(row + 8) * cols + c * 64 + 16 * tt..][..16]);
        }
        for (rows, cols) in [(8, 64), (16, 32), (24, 128), (0, 64)] {
            assert!(!fp8_tiled(rows, cols));
            let q: Vec<u8> = (0..rows * cols).map(|i| i as u8).collect();
            assert_eq!(fp8_tile_order(&q, rows, cols), q);
        }
    }
}
