//! Typed launch wrappers, one per kernel family of `kernels/*.cu`.
//!
//! Each wrapper checks every buffer length against the shape it is given, then launches on the
//! GPU's stream. Activations are f32 views; large weights are a [`WeightBuf`] in the
//! checkpoint's dtype, small per-channel weights (norms, head vectors) f32.

use super::pdl::{dptr, dptr_mut, Arg};
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

    /// Elements `range` of the buffer (a block of rows of the matrix).
    fn view(&self, range: std::ops::Range<usize>) -> WeightView<'_> {
        match self {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => WeightView::U16(s.slice(range)),
            WeightBuf::F32(s) => WeightView::F32(s.slice(range)),
        }
    }
}

enum WeightView<'a> {
    U16(CudaView<'a, u16>),
    F32(CudaView<'a, f32>),
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
/// Most query rows the split attention takes (verify and draft blocks are ≤ 8; prefill uses the
/// per-head kernel).
pub const SPLIT_ROWS: usize = 16;
/// Most logits rows and segments per row of one split argmax.
pub const ARGMAX_ROWS: usize = 64;
pub const ARGMAX_SEGMENTS: usize = 256;

impl OpScratch {
    /// Element counts of the buffers for `heads × head_dim` query heads: (attn_o, attn_ml,
    /// argmax pairs, tickets).
    pub fn sizes(heads: usize, head_dim: usize) -> (usize, usize, usize, usize) {
        let q = MAX_SPLITS * SPLIT_ROWS * heads;
        (q * head_dim, q * 2, ARGMAX_ROWS * ARGMAX_SEGMENTS, ARGMAX_ROWS)
    }
}

/// Rows of x per tensor-core matvec launch (the n-tile width).
const TC_ROWS: usize = 8;

/// Warps sharing one 16-row tile's K in the tensor-core matvec: enough warps in flight
/// (≥ 2048, about 16 per SM) for few-tile shapes, no split where tiles alone give that, and
/// never so much that a warp has less than 4 chunks of 32 k.
fn ksplit(tiles: usize, d_in: usize, warps: usize) -> usize {
    let mut ks = 1;
    while ks < warps && tiles * ks < 2048 && d_in / (32 * ks * 2) >= 4 {
        ks *= 2;
    }
    ks
}

/// The tensor-core matvec kernel for a shape on a GPU of `sms` SMs (kernels/matvec.cu). What
/// matters most is that the grid fits in one wave: K split over all 8 warps (few, long tiles)
/// takes 4 chunks per step at 2 blocks per SM, or alone on its SM when there are no more blocks
/// than SMs; everything else, and any grid above 2 blocks per SM (q|k|v's 384 tiles), takes 2
/// chunks per step at 3 blocks per SM. Measured with `dspark bench --matvec-variants`.
fn tc_kernel(tiles: usize, d_in: usize, sms: usize) -> &'static str {
    let ks = ksplit(tiles, d_in, 8);
    let blocks = tiles.div_ceil(8 / ks);
    if ks == 8 && blocks <= sms {
        "matvec_tc_u4b1_bf16"
    } else if ks == 8 && blocks <= 2 * sms {
        "matvec_tc_u4_bf16"
    } else {
        "matvec_tc_bf16"
    }
}

/// Dynamic shared memory of the kernels that use it: `attention_tc_hd*` stages Q (split in
/// two), a 32-key K and V tile and the 32 × 33 score tile (kernels/attention_tc.cu, TC_SMEM).
pub(crate) fn dynamic_smem(name: &str) -> Option<usize> {
    let hd = match name {
        "attention_tc_hd64_f32" => 64,
        "attention_tc_hd128_f32" => 128,
        _ => return None,
    };
    Some((2 * 32 + 2 * 32) * hd * 4 + 33 * 33 * 4)
}

fn aligned16<T>(gpu: &Gpu, v: &CudaView<T>) -> bool {
    use cudarc::driver::DevicePtr;
    let (ptr, _guard) = v.device_ptr(&gpu.stream);
    ptr % 16 == 0
}

fn check(what: &str, got: usize, want: usize) -> CudaResult<()> {
    if got < want {
        return Err(CudaError::Shape(format!("{what}: buffer holds {got} values, needs {want}")));
    }
    Ok(())
}

/// Buffer lengths (q, k, v, out) of an attention call against its shape.
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

fn cfg(grid: usize, block: u32) -> LaunchConfig {
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

/// The device address of a weight view, for [`Arg::Ptr`].
fn wptr(gpu: &Gpu, view: &WeightView<'_>) -> Arg {
    match view {
        WeightView::U16(s) => dptr(gpu, s),
        WeightView::F32(s) => dptr(gpu, s),
    }
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
        // embedding_*(table, ids, out, dim)
        let args =
            [wptr(self, &table.view(0..table.len())), dptr(self, ids), dptr_mut(self, out), Arg::I32(dim as i32)];
        self.launch_pdl(&format!("embedding_{}", table.suffix()), (rows as u32, 1, 1), 256, &args)
    }

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
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, kv_len, (n_heads, n_kv_heads, head_dim))?;
        let (nh, nkv, hd, kl) = (n_heads as i32, n_kv_heads as i32, head_dim as i32, kv_len as i32);
        let (c, fp) = match causal {
            Some(p) => (1i32, p as i32),
            None => (0, 0),
        };
        let mut b = self.stream.launch_builder(self.function("attention_f32")?);
        b.arg(q).arg(k).arg(v).arg(out).arg(&nh).arg(&nkv).arg(&hd).arg(&kl).arg(&c).arg(&fp);
        // SAFETY: matches attention_f32(q, k, v, out, nh, nkv, hd, kv_len, causal, first_pos).
        launch!(self, "attention_f32", b, cfg(rows * n_heads, 128));
        Ok(())
    }

    /// `y[m, o] (+)= Σ_k x[m, k] · W[o, k]` for `m` rows (any m).
    pub fn matvec(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        self.matvec_rows(w, 0, x, y, shape, accumulate)
    }

    /// [`Gpu::matvec`] over rows `row0 .. row0 + d_out` of `w` (a block of a stacked matrix,
    /// such as the k|v rows of the fused q|k|v projection).
    ///
    /// bf16 weights with `d_in % 8 == 0` and 16-byte aligned buffers take the tensor-core kernel
    /// in launches of up to 8 rows; everything else the general kernel in launches of 16.
    pub fn matvec_rows(
        &self,
        w: &WeightBuf,
        row0: usize,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        check("matvec w", w.len(), (row0 + d_out) * d_in)?;
        check("matvec x", x.len(), m * d_in)?;
        check("matvec y", y.len(), m * d_out)?;
        let wv = w.view(row0 * d_in..(row0 + d_out) * d_in);
        if matches!(w, WeightBuf::Bf16(_)) && self.tc_ok(&wv, x, d_in) {
            let name = tc_kernel(d_out.div_ceil(16), d_in, self.sms);
            return self.matvec_tc(name, &wv, x, y, (m, d_in, d_out), d_out, accumulate, None);
        }
        let name = format!("matvec_{}", w.suffix());
        let mut start = 0;
        while start < m {
            let rows = (m - start).min(16);
            let xs = x.slice(start * d_in..(start + rows) * d_in);
            let mut ys = y.slice_mut(start * d_out..(start + rows) * d_out);
            let (mm, di, dout, acc) = (rows as i32, d_in as i32, d_out as i32, accumulate as i32);
            launch_v!(self, name, wv, cfg(d_out.div_ceil(8), 256), |b| {
                b.arg(&xs).arg(&mut ys).arg(&mm).arg(&di).arg(&dout).arg(&acc);
            });
            start += rows;
        }
        Ok(())
    }

    /// Launches a tensor-core matvec kernel `name` (same signature as `matvec_tc_bf16`) in
    /// chunks of 8 rows. `y` is `[m, y_cols]`: `d_out`, or `d_out / 2` for the SwiGLU epilogue.
    #[allow(clippy::too_many_arguments)]
    fn matvec_tc(
        &self,
        name: &str,
        wv: &WeightView<'_>,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        (m, d_in, d_out): (usize, usize, usize),
        y_cols: usize,
        accumulate: bool,
        ks_override: Option<usize>,
    ) -> CudaResult<()> {
        let tiles = d_out.div_ceil(16);
        let warps = 8;
        let ks = ks_override.unwrap_or_else(|| ksplit(tiles, d_in, warps));
        let grid = tiles.div_ceil(warps / ks);
        let WeightView::U16(wv) = wv else {
            return Err(CudaError::Shape(format!("{name}: tensor-core matvec needs bf16 weights")));
        };
        let w = dptr(self, wv);
        let mut start = 0;
        while start < m {
            let rows = (m - start).min(TC_ROWS);
            let xs = x.slice(start * d_in..(start + rows) * d_in);
            let mut ys = y.slice_mut(start * y_cols..(start + rows) * y_cols);
            // matvec_tc_*(w, x, y, m, in, out, accumulate, ksplit)
            let args = [
                w,
                dptr(self, &xs),
                dptr_mut(self, &mut ys),
                Arg::I32(rows as i32),
                Arg::I32(d_in as i32),
                Arg::I32(d_out as i32),
                Arg::I32(accumulate as i32),
                Arg::I32(ks as i32),
            ];
            self.launch_pdl(name, (grid as u32, 1, 1), 32 * warps as u32, &args)?;
            start += rows;
        }
        Ok(())
    }

    /// Whether a 16-bit weight view and its activations can take the tensor-core kernels:
    /// `d_in % 8 == 0` and 16-byte aligned buffers (the callers check the dtype is bf16).
    fn tc_ok(&self, wv: &WeightView<'_>, x: &CudaView<f32>, d_in: usize) -> bool {
        matches!(wv, WeightView::U16(v) if aligned16(self, v)) && d_in % 8 == 0 && aligned16(self, x)
    }

    /// Times-only entry for `dspark bench --matvec-variants`: a named tensor-core variant on a
    /// bf16 weight.
    pub fn matvec_tc_variant(
        &self,
        name: &str,
        w: &WeightBuf,
        x: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        shape: (usize, usize, usize),
    ) -> CudaResult<()> {
        check("matvec w", w.len(), shape.1 * shape.2)?;
        check("matvec x", x.len(), shape.0 * shape.1)?;
        check("matvec y", y.len(), shape.0 * shape.2)?;
        if !matches!(w, WeightBuf::Bf16(_)) || shape.1 % 8 != 0 {
            return Err(CudaError::Shape(format!("{name}: bf16 weights with in % 8 == 0 only")));
        }
        // `name@ks` forces the K split (1, 2, 4 or 8) instead of the host's choice.
        let (name, ks) = match name.split_once('@') {
            Some((n, k)) => match k.parse::<usize>() {
                Ok(k) if [1, 2, 4, 8].contains(&k) => (n, Some(k)),
                _ => return Err(CudaError::Shape(format!("{name}: the K split after @ must be 1, 2, 4 or 8"))),
            },
            None => (name, None),
        };
        self.matvec_tc(name, &w.view(0..w.len()), x, y, shape, shape.2, false, ks)
    }

    /// `act = silu(gate) ⊙ up` where gate|up is one matrix `[2·inter, d_in]` with rows
    /// interleaved (gate_0, up_0, gate_1, up_1, …): the MLP's first half in one launch on the
    /// tensor-core path (the SwiGLU is its epilogue); other weights run the general matvec into
    /// `gate_up` and a pairwise SwiGLU.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_swiglu(
        &self,
        w: &WeightBuf,
        x: &CudaView<f32>,
        gate_up: &mut CudaViewMut<f32>,
        act: &mut CudaViewMut<f32>,
        (m, d_in, inter): (usize, usize, usize),
    ) -> CudaResult<()> {
        check("matvec_swiglu w", w.len(), 2 * inter * d_in)?;
        check("matvec_swiglu x", x.len(), m * d_in)?;
        check("matvec_swiglu act", act.len(), m * inter)?;
        let wv = w.view(0..w.len());
        if matches!(w, WeightBuf::Bf16(_)) && self.tc_ok(&wv, x, d_in) {
            return self.matvec_tc("matvec_tc_swiglu_bf16", &wv, x, act, (m, d_in, 2 * inter), inter, false, None);
        }
        self.matvec(w, x, gate_up, (m, d_in, 2 * inter), false)?;
        let (i, r) = (inter as i32, m as i32);
        let mut b = self.stream.launch_builder(self.function("swiglu_pairs_f32")?);
        b.arg(gate_up).arg(act).arg(&i).arg(&r);
        // SAFETY: matches swiglu_pairs_f32(gu, act, inter, rows); lengths checked above.
        launch!(self, "swiglu_pairs_f32", b, cfg((m * inter).div_ceil(256), 256));
        Ok(())
    }

    /// Attention of `rows` queries over the first `kv_len` cache rows (as [`Gpu::attention`]),
    /// on the split-KV kernel when the query group fits it, else the per-head kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split(
        &self,
        q: &CudaView<f32>,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        kv_len: usize,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: Option<usize>,
        scratch: &mut OpScratch,
    ) -> CudaResult<()> {
        let fits = matches!(head_dim, 64 | 128)
            && n_kv_heads > 0
            && n_heads % n_kv_heads == 0
            && rows <= SPLIT_ROWS
            && scratch.attn_o.len() >= MAX_SPLITS * rows * n_heads * head_dim
            && scratch.attn_ml.len() >= MAX_SPLITS * rows * n_heads * 2;
        if !fits {
            return self.attention(q, k, v, out, rows, kv_len, (n_heads, n_kv_heads, head_dim), causal);
        }
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, kv_len, (n_heads, n_kv_heads, head_dim))?;
        if !aligned16(self, k) || !aligned16(self, v) {
            return Err(CudaError::Shape("attention_split: K/V cache views must be 16-byte aligned".into()));
        }
        // One 32-key tile per block (the most blocks, no serial tiles) up to 2048 keys. Beyond,
        // one query row (decode) takes 64 keys per block and several rows (the tensor-core
        // kernel) 128: at 4096 keys those measured fastest among 32/64/128/256 (fewer partials
        // to write and combine; docs/perf.md). At most MAX_SPLITS slices.
        let group_queries = rows * (n_heads / n_kv_heads);
        let keys = match (kv_len <= 2048, group_queries <= 4) {
            (true, _) => 32,
            (false, true) => 64,
            (false, false) => 128,
        };
        let splits = kv_len.div_ceil(keys).clamp(1, MAX_SPLITS);
        let (r, nh, nkv, kl) = (rows as i32, n_heads as i32, n_kv_heads as i32, kv_len as i32);
        let (c, fp) = match causal {
            Some(p) => (1i32, p as i32),
            None => (0, 0),
        };
        // A block takes 4 queries (one per warp) when that is the whole group (decode); more
        // queries (verify, the draft block) go to the tensor-core kernel, 32 per block.
        let (name, per_block) = if group_queries <= 4 {
            (format!("attention_split_q1_hd{head_dim}_f32"), 4)
        } else {
            (format!("attention_tc_hd{head_dim}_f32"), 32)
        };
        let groups = group_queries.div_ceil(per_block);
        // attention_split_hd*_f32(q, k, v, part_o, part_ml, rows, nh, nkv, kv_len, causal, first_pos)
        let args = [
            dptr(self, q),
            dptr(self, k),
            dptr(self, v),
            dptr_mut(self, &mut scratch.attn_o),
            dptr_mut(self, &mut scratch.attn_ml),
            Arg::I32(r),
            Arg::I32(nh),
            Arg::I32(nkv),
            Arg::I32(kl),
            Arg::I32(c),
            Arg::I32(fp),
        ];
        let grid = ((n_kv_heads * groups) as u32, splits as u32, 1);
        match dynamic_smem(&name) {
            Some(smem) => self.launch_pdl_smem(&name, grid, 256, smem as u32, &args)?,
            None => self.launch_pdl(&name, grid, 128, &args)?,
        }
        // attention_combine_f32(part_o, part_ml, out, rows, nh, hd, splits)
        let args = [
            dptr(self, &scratch.attn_o),
            dptr(self, &scratch.attn_ml),
            dptr_mut(self, out),
            Arg::I32(r),
            Arg::I32(nh),
            Arg::I32(head_dim as i32),
            Arg::I32(splits as i32),
        ];
        self.launch_pdl("attention_combine_f32", ((rows * n_heads) as u32, 1, 1), 4 * head_dim as u32, &args)?;
        Ok(())
    }

    /// Fused norm + RoPE + cache append of a q|k|v projection output `[rows, (nq + 2·nkv)·hd]`
    /// for rows at positions `first_pos ..`: q into `q_out`, k and v into the caches at row
    /// `cache_row ..`. `nq = 0` for key/value-only input (the draft's context rows).
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_rope_append(
        &self,
        qkv: &CudaView<f32>,
        q_norm: &CudaView<f32>,
        k_norm: &CudaView<f32>,
        inv_freq: &CudaView<f32>,
        q_out: &mut CudaViewMut<f32>,
        k_cache: &mut CudaViewMut<f32>,
        v_cache: &mut CudaViewMut<f32>,
        (rows, nq, nkv): (usize, usize, usize),
        (first_pos, cache_row): (usize, usize),
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
        check("qkv_rope_append k_cache", k_cache.len(), (cache_row + rows) * nkv * hd)?;
        check("qkv_rope_append v_cache", v_cache.len(), (cache_row + rows) * nkv * hd)?;
        let threads = ((hd / 2).div_ceil(32) * 32) as u32;
        // qkv_rope_append_f32(qkv, q_norm, k_norm, inv_freq, q_out, k_cache, v_cache, nq, nkv,
        // hd, first_pos, cache_row, eps); lengths checked above.
        let args = [
            dptr(self, qkv),
            dptr(self, q_norm),
            dptr(self, k_norm),
            dptr(self, inv_freq),
            dptr_mut(self, q_out),
            dptr_mut(self, k_cache),
            dptr_mut(self, v_cache),
            Arg::I32(nq as i32),
            Arg::I32(nkv as i32),
            Arg::I32(hd as i32),
            Arg::I32(first_pos as i32),
            Arg::I32(cache_row as i32),
            Arg::F32(eps),
        ];
        self.launch_pdl("qkv_rope_append_f32", ((rows * (nq + 2 * nkv)) as u32, 1, 1), threads, &args)?;
        Ok(())
    }

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
        // gather_row_*(table, idx, out, dim)
        let args =
            [wptr(self, &table.view(0..table.len())), dptr(self, idx), dptr_mut(self, out), Arg::I32(dim as i32)];
        self.launch_pdl(&format!("gather_row_{}", table.suffix()), (1, 1, 1), 256, &args)
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
        // markov_gated_prep_f32(G, b, h, e, u, H, r)
        let args = [
            dptr(self, g),
            dptr(self, bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, u),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
        ];
        self.launch_pdl("markov_gated_prep_f32", (1, 1, 1), 256, &args)
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
        // markov_rnn_prep_f32(J, b, h, e, state, scratch, u, H, r)
        let args = [
            dptr(self, j),
            dptr(self, bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, state),
            dptr_mut(self, scratch),
            dptr_mut(self, u),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
        ];
        self.launch_pdl("markov_rnn_prep_f32", (1, 1, 1), 256, &args)
    }

    /// Confidence logits of `rows` slots: `logit[s] = w[..H]·h_s + (w[H..]·e_s if with_markov) +
    /// bias`, h `[rows, H]`, e `[rows, r]`.
    pub fn confidence(
        &self,
        w: &CudaView<f32>,
        bias: f32,
        h: &CudaView<f32>,
        e: &CudaView<f32>,
        (rows, hd, r): (usize, usize, usize),
        with_markov: bool,
        logit: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        let r = if with_markov { r } else { 0 };
        check("confidence weight", w.len(), hd + r)?;
        check("confidence h", h.len(), rows * hd)?;
        check("confidence e", e.len(), rows * r)?;
        check("confidence out", logit.len(), rows)?;
        if rows == 0 {
            return Ok(());
        }
        // confidence_f32(w, b, h, e, logit, H, r, with_markov), one block per row
        let args = [
            dptr(self, w),
            Arg::F32(bias),
            dptr(self, h),
            dptr(self, e),
            dptr_mut(self, logit),
            Arg::I32(hd as i32),
            Arg::I32(r as i32),
            Arg::I32(with_markov as i32),
        ];
        self.launch_pdl("confidence_f32", (rows as u32, 1, 1), 1024, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::{ksplit, tc_kernel};

    #[test]
    fn tc_kernel_follows_the_tile_count() {
        // An H200's 132 SMs.
        assert_eq!(tc_kernel(9496, 4096, 132), "matvec_tc_bf16"); // lm_head
        assert_eq!(tc_kernel(1536, 4096, 132), "matvec_tc_bf16"); // gate|up
        assert_eq!(tc_kernel(384, 4096, 132), "matvec_tc_bf16"); // q|k|v: 384 blocks
        assert_eq!(tc_kernel(256, 4096, 132), "matvec_tc_u4_bf16"); // o
        assert_eq!(tc_kernel(256, 12288, 132), "matvec_tc_u4_bf16"); // down
        assert_eq!(tc_kernel(128, 4096, 132), "matvec_tc_u4b1_bf16"); // the draft's k|v

        // A smaller GPU moves o to the 3-blocks-per-SM kernel.
        assert_eq!(tc_kernel(256, 4096, 100), "matvec_tc_bf16");
    }

    #[test]
    fn ksplit_follows_the_tile_count() {
        // Qwen3-8B shapes: q|k|v (384 tiles) and o/down/fc (256) split 8 ways; gate|up (1536)
        // 2 ways; lm_head and Markov W2 (9496) not at all.
        assert_eq!(ksplit(384, 4096, 8), 8);
        assert_eq!(ksplit(256, 12288, 8), 8);
        assert_eq!(ksplit(1536, 4096, 8), 2);
        assert_eq!(ksplit(9496, 4096, 8), 1);
        assert_eq!(ksplit(9496, 256, 8), 1);
        // A narrow K never leaves a warp with fewer than 4 chunks of 32.
        assert_eq!(ksplit(2, 64, 8), 1);
        assert_eq!(ksplit(4, 512, 8), 4);
        assert_eq!(ksplit(4, 256, 8), 2);
        assert_eq!(ksplit(4, 4096, 4), 4);
    }
}
