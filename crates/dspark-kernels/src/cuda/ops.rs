//! Typed launch wrappers: the weight and scratch types every family uses, the shared checks and
//! launch helpers, and the wrappers of embedding, RMSNorm, RoPE/append and attention. The
//! matvec, argmax and Markov-head families have their own files (`matvec.rs`, `argmax.rs`,
//! `markov.rs`).
//!
//! Each wrapper checks every buffer length against the shape it is given, then launches on the
//! GPU's stream. Activations are f32 views; large weights are a [`WeightBuf`] in the
//! checkpoint's dtype, small per-channel weights (norms, head vectors) f32.

use super::kv::{KvView, KvViewMut};
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
    /// E4M3 bytes, row-major `[rows, cols]`.
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
}

impl Fp8Buf {
    /// u32 words of the x-split scratch for `cols` columns: two parts of the 8 rows a
    /// tensor-core launch takes as f16 pairs, then the 8 rows' scales (16·cols + 32 bytes: 64 KB
    /// at 4,096 columns).
    pub fn xsplit_len(cols: usize) -> usize {
        2 * 8 * cols / 2 + 8
    }

    /// The weight from its parts on the device: E4M3 bytes `q` `[srow.len(), cols]`, the scale
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
        let buf = Fp8Buf { q, scale, srow, cols, scale_cols: cols.div_ceil(block_k.max(1)), block_k, xsplit };
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

/// Most key slices of one split attention launch.
pub const MAX_SPLITS: usize = 128;

/// Keys of one tile of the split attentions (kernels/common.cuh `SPLIT_TILE`).
pub const SPLIT_TILE: usize = 32;

/// Key slices of a split attention launch: `(grid slices, stride)`. Slice s of a step takes the
/// 32-key tiles s, s + stride, s + 2·stride, … of its kv_len keys, and `min(stride, ⌈kv_len / 32⌉)`
/// slices run (`split_block_at`, common.cuh), so a short context gets one tile per block and a
/// long one as many slices as fill one wave of `slots` resident blocks with one query group per
/// KV head (`nkv` blocks a slice) — each block then walks several tiles. The stride depends on
/// the kernel (its `slots`), the model and the GPU only: never on kv_len or the row count, so a
/// query row's tiles, and the bits of its attention, are the same in every step that holds it
/// (a decode step, a verify step, a batched step's item, a graph's wider grid). The grid's
/// slices follow `kv_cap` only, as a captured graph needs. Measured on the H200 (git history of
/// docs/perf.md): one full wave beats both fixed 64- and 128-key slices, which left half the
/// SMs idle for part of the 2048–4096 range.
pub fn split_plan(kv_cap: usize, nkv: usize, slots: usize) -> (usize, usize) {
    let stride = (slots / nkv.max(1)).clamp(1, MAX_SPLITS);
    (kv_cap.div_ceil(SPLIT_TILE).clamp(1, stride), stride)
}
/// Most query rows the split attention takes (verify and draft blocks are ≤ 8; prefill uses the
/// per-head kernel).
pub const SPLIT_ROWS: usize = 16;
/// Most logits rows and segments per row of one split argmax.
pub const ARGMAX_ROWS: usize = 64;
pub const ARGMAX_SEGMENTS: usize = 256;

impl OpScratch {
    /// Element counts of the buffers for `nh × hd` query heads over `nkv` KV heads on `sms`
    /// SMs: (attn_o, attn_ml, argmax pairs, tickets). The partials hold the most (slice, row)
    /// pairs any split launch of up to [`SPLIT_ROWS`] rows takes on this GPU at any context
    /// ([`split_partials`]): 264 for Qwen3-8B on 132 SMs (4.3 MB), where [`MAX_SPLITS`] ×
    /// [`SPLIT_ROWS`] = 2,048 planned 34 MB a model.
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

/// The kernel shape of a split attention launch of `rows` rows over KV heads of `g` query heads
/// each: (queries per block, blocks per SM). A block takes 4 queries (one per warp) when that is
/// the whole group (decode); more queries (verify, the draft block) go to the tensor-core
/// kernel, 32 per block.
pub(crate) fn split_kernel(rows: usize, g: usize, row_exact: bool) -> (usize, usize) {
    if rows * g <= 4 && !row_exact {
        (4, 4)
    } else {
        (32, 2)
    }
}

/// (slice, row) pairs of the partials a split launch of `rows` rows writes at most, at any
/// context: [`split_plan`]'s slices at an unbounded `kv_cap` (each shorter context takes fewer)
/// times the rows.
pub fn split_partials(rows: usize, (nh, nkv): (usize, usize), sms: usize) -> usize {
    let g = nh / nkv.max(1);
    // The more of the two kernels the rows may take: a row-exact GPU runs a decode row on the
    // tensor-core kernel, others on the four-query one.
    let slices = |row_exact| split_plan(usize::MAX, nkv, split_kernel(rows, g, row_exact).1 * sms).0;
    slices(false).max(slices(true)) * rows
}

/// Dynamic shared memory of the kernels that use it: `attention_tc_hd*` stages Q (split in
/// two), a 32-key K and V tile and the 32 × 33 score tile (kernels/attention_tc.cu, TC_SMEM);
/// `attention_prefill_hd*` double-buffers 64-key bf16 K and V tiles (attention_prefill.rs).
pub(crate) fn dynamic_smem(name: &str) -> Option<usize> {
    let hd = match name.strip_suffix("_kvbf16").unwrap_or(name) {
        "attention_tc_hd64_f32" | "attention_tc_seg_hd64_f32" => 64,
        "attention_tc_hd128_f32" | "attention_tc_seg_hd128_f32" => 128,
        "attention_prefill_hd64_f32" => return Some(super::attention_prefill::smem_bytes(64)),
        "attention_prefill_hd128_f32" => return Some(super::attention_prefill::smem_bytes(128)),
        _ => return None,
    };
    Some((2 * 32 + 2 * 32) * hd * 4 + 33 * 33 * 4)
}

pub(crate) fn aligned16<T>(gpu: &Gpu, v: &CudaView<T>) -> bool {
    use cudarc::driver::DevicePtr;
    let (ptr, _guard) = v.device_ptr(&gpu.stream);
    ptr % 16 == 0
}

/// The element type of a K and V cache pair, which must agree.
fn same_kv(what: &str, k: &KvView<'_>, v: &KvView<'_>) -> CudaResult<super::kv::KvDtype> {
    if k.dtype() != v.dtype() {
        return Err(CudaError::Shape(format!("{what}: K cache is {}, V cache {}", k.dtype().name(), v.dtype().name())));
    }
    Ok(k.dtype())
}

pub(crate) fn check(what: &str, got: usize, want: usize) -> CudaResult<()> {
    if got < want {
        return Err(CudaError::Shape(format!("{what}: buffer holds {got} values, needs {want}")));
    }
    Ok(())
}

/// Buffer lengths (q, k, v, out) of an attention call against its shape.
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

fn check_attention(
    (q, k, v, out): (usize, usize, usize, usize),
    rows: usize,
    kv_len: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
) -> CudaResult<()> {
    check("attention q", q, rows * n_heads * head_dim)?;
    check("attention k", k, kv_len * n_kv_heads * head_dim)?;
    check("attention v", v, kv_len * n_kv_heads * head_dim)?;
    check("attention out", out, rows * n_heads * head_dim)
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
        $gpu.timed(&$name, || unsafe { $b.launch($cfg) }.map(|_| ()).map_err(Into::into))?;
    }};
}

/// Launches a builder under the profiler.
macro_rules! launch {
    ($gpu:expr, $name:expr, $b:expr, $cfg:expr) => {{
        // SAFETY: see each call site: argument order matches the kernel signature.
        $gpu.timed($name, || unsafe { $b.launch($cfg) }.map(|_| ()).map_err(Into::into))?;
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
        let args = [
            dptr(self, x),
            dptr(self, w),
            dptr_mut(self, out),
            Arg::I32(dim as i32),
            Arg::F32(eps),
            Arg::I32(vec4 as i32),
        ];
        self.launch_pdl("rmsnorm_f32", (rows as u32, 1, 1), 1024, &args)?;
        Ok(())
    }

    /// Attention of `rows` queries over the first `kv_len` cache rows (both from `lens`).
    /// `causal`: row r sits at `first_pos + r` and sees keys `0..=first_pos + r`; otherwise every
    /// key.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &CudaView<f32>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        lens: &StepLens<'_>,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: bool,
    ) -> CudaResult<()> {
        if head_dim % 32 != 0 || head_dim > 256 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(CudaError::Shape(format!(
                "attention: head_dim {head_dim} must be a multiple of 32 up to 256, heads {n_heads} a multiple of kv heads {n_kv_heads}"
            )));
        }
        let heads = (n_heads, n_kv_heads, head_dim);
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, lens.kv_cap, heads)?;
        check("attention lens", lens.dev.len(), 2)?;
        let kv = same_kv("attention", k, v)?;
        let (nh, nkv, hd, c) = (n_heads as i32, n_kv_heads as i32, head_dim as i32, causal as i32);
        let name = format!("attention_f32{}", kv.kernel_suffix());
        let mut b = self.stream.launch_builder(self.function(&name)?);
        b.arg(q);
        match (k, v) {
            (KvView::F32(k), KvView::F32(v)) => b.arg(k).arg(v),
            (KvView::Bf16(k), KvView::Bf16(v)) => b.arg(k).arg(v),
            _ => unreachable!("same_kv checked the pair"),
        };
        b.arg(out).arg(&nh).arg(&nkv).arg(&hd).arg(&lens.dev).arg(&c);
        // SAFETY: matches attention_f32[_kvbf16](q, k, v, out, nh, nkv, hd, lens, causal).
        launch!(self, &name, b, cfg(rows * n_heads, 128));
        Ok(())
    }

    /// Attention of `rows` queries over the first `kv_len` cache rows (as [`Gpu::attention`]),
    /// on the split-KV kernel when the query group fits it, else the per-head kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split(
        &self,
        q: &CudaView<f32>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        lens: &StepLens<'_>,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: bool,
        scratch: &mut OpScratch,
    ) -> CudaResult<()> {
        let fits = matches!(head_dim, 64 | 128)
            && n_kv_heads > 0
            && n_heads % n_kv_heads == 0
            && rows <= SPLIT_ROWS
            && scratch.holds(rows, (n_heads, n_kv_heads, head_dim), self.sms);
        if !fits {
            return self.attention(q, k, v, out, rows, lens, (n_heads, n_kv_heads, head_dim), causal);
        }
        let kv_cap = lens.kv_cap;
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, kv_cap, (n_heads, n_kv_heads, head_dim))?;
        check("attention lens", lens.dev.len(), 2)?;
        let kv = same_kv("attention_split", k, v)?;
        if !k.aligned16(self) || !v.aligned16(self) {
            return Err(CudaError::Shape("attention_split: K/V cache views must be 16-byte aligned".into()));
        }
        // The kernel by split_kernel's rule; the decode kernel's combine is a twin launched with
        // PDL (kernels/attention.cu).
        let group_queries = rows * (n_heads / n_kv_heads);
        let (per_block, per_sm) = split_kernel(rows, n_heads / n_kv_heads, self.row_exact);
        let (name, combine) = if per_block == 4 {
            (format!("attention_split_q1_hd{head_dim}_f32{}", kv.kernel_suffix()), "attention_combine_q1_f32")
        } else {
            (format!("attention_tc_hd{head_dim}_f32{}", kv.kernel_suffix()), "attention_combine_f32")
        };
        let groups = group_queries.div_ceil(per_block);
        let (splits, stride) = split_plan(kv_cap, n_kv_heads, per_sm * self.sms);
        let (r, nh, nkv, c) = (rows as i32, n_heads as i32, n_kv_heads as i32, causal as i32);
        // attention_split_q1 / attention_tc _hd*_f32(q, k, v, part_o, part_ml, rows, nh, nkv, lens,
        // causal, stride)
        let lens_dev = dptr(self, &lens.dev);
        let args = [
            dptr(self, q),
            k.arg(self),
            v.arg(self),
            dptr_mut(self, &mut scratch.attn_o),
            dptr_mut(self, &mut scratch.attn_ml),
            Arg::I32(r),
            Arg::I32(nh),
            Arg::I32(nkv),
            lens_dev,
            Arg::I32(c),
            Arg::I32(stride as i32),
        ];
        let grid = ((n_kv_heads * groups) as u32, splits as u32, 1);
        match dynamic_smem(&name) {
            Some(smem) => self.launch_pdl_smem(&name, grid, 256, smem as u32, &args)?,
            None => self.launch_pdl(&name, grid, 128, &args)?,
        }
        self.attention_combine(combine, scratch, out, rows, n_heads, head_dim, lens, (SPLIT_TILE, splits))
    }

    /// The merge of a split attention's partials (`scratch`) into `out [rows, nh·hd]`: kernel
    /// `name` (`attention_combine_f32`, or its PDL twin after the decode kernel).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_combine(
        &self,
        name: &str,
        scratch: &OpScratch,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        nh: usize,
        hd: usize,
        lens: &StepLens<'_>,
        (keys, splits): (usize, usize),
    ) -> CudaResult<()> {
        // attention_combine[_q1]_f32(part_o, part_ml, out, rows, nh, hd, lens, keys, max_splits)
        let args = [
            dptr(self, &scratch.attn_o),
            dptr(self, &scratch.attn_ml),
            dptr_mut(self, out),
            Arg::I32(rows as i32),
            Arg::I32(nh as i32),
            Arg::I32(hd as i32),
            dptr(self, &lens.dev),
            Arg::I32(keys as i32),
            Arg::I32(splits as i32),
        ];
        self.launch_pdl(name, ((rows * nh) as u32, 1, 1), 4 * hd as u32, &args)
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
    use super::{split_kernel, split_partials, split_plan, OpScratch, MAX_SPLITS, SPLIT_ROWS};

    #[test]
    fn split_partials_bound_every_launch_and_size_the_scratch() {
        // Qwen3-8B (32 heads over 8) on an H200's 132 SMs: a decode row takes 66 slices on the
        // four-query kernel, a verify row 33 on the tensor-core one at any row count; sixteen rows
        // take the most, 528 (8.7 MB of partials), where MAX_SPLITS × SPLIT_ROWS is 2,048.
        assert_eq!(split_partials(1, (32, 8), 132), 66);
        assert_eq!(split_partials(8, (32, 8), 132), 264);
        assert_eq!(split_partials(16, (32, 8), 132), 528);
        assert_eq!(OpScratch::sizes((32, 8, 128), 132).0, 528 * 32 * 128);
        for sms in [1, 20, 46, 108, 132, 170, 1000] {
            for (nh, nkv) in [(1, 1), (4, 1), (4, 4), (8, 2), (14, 2), (16, 8), (32, 8), (64, 8), (40, 8), (32, 32)] {
                for hd in [64, 128] {
                    let (ao, aml, ..) = OpScratch::sizes((nh, nkv, hd), sms);
                    assert!(ao <= MAX_SPLITS * SPLIT_ROWS * nh * hd && aml == ao / hd * 2);
                    for rows in 1..=SPLIT_ROWS {
                        let pairs = split_partials(rows, (nh, nkv), sms);
                        assert!(ao >= pairs * nh * hd, "{nh}/{nkv} heads, {rows} rows, {sms} SMs");
                        // What the launch takes at any context, as attention_split plans it, on a
                        // GPU of either mode.
                        for row_exact in [false, true] {
                            let per_sm = split_kernel(rows, nh / nkv, row_exact).1;
                            for kv_cap in [1, 31, 512, 4096, 16_384, 1 << 20] {
                                assert!(split_plan(kv_cap, nkv, per_sm * sms).0 * rows <= pairs);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_plan_fills_one_wave_at_a_stride_fixed_by_the_gpu() {
        // An H200: 132 SMs; Qwen3-8B's 8 KV heads.
        let (q1, tc) = (4 * 132, 2 * 132);
        // Short contexts: one 32-key tile per block; the stride is one wave whatever the context.
        assert_eq!(split_plan(512, 8, tc), (16, 33));
        assert_eq!(split_plan(1, 8, q1), (1, 66));
        // Long contexts: as many slices as fill one wave, each every stride-th tile.
        assert_eq!(split_plan(4096, 8, tc), (33, 33));
        assert_eq!(split_plan(8192, 8, tc), (33, 33));
        assert_eq!(split_plan(8192, 8, q1), (66, 66));
        assert_eq!(split_plan(2048, 8, q1), (64, 66));
        // Never more slices than the scratch holds, never fewer than one.
        assert_eq!(split_plan(1 << 20, 1, 10_000), (128, 128));
        assert_eq!(split_plan(4096, 1000, 10), (1, 1));
        // The stride follows neither the context nor anything but the KV heads and slots.
        for kv_cap in [1, 33, 100, 4096, 1 << 20] {
            assert_eq!(split_plan(kv_cap, 8, tc).1, 33);
            assert!(split_plan(kv_cap, 8, tc).0 <= 33);
        }
    }
}
