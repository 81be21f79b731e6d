//! Where the CUDA backends get their weights: a checkpoint, or random values made on the device.
//!
//! [`crate::cuda::qwen3::CudaQwen3`] and [`crate::cuda::dspark::CudaDraft`] are built by one
//! constructor over a [`WeightSource`], so `dspark bench` times exactly the structs and code
//! path `dspark generate --device cuda` runs, with Qwen3-8B-shaped random weights and no files
//! (Architecture Invariant: the bench has no model code of its own).
//!
//! * [`Checkpoint`] uploads tensors in their checkpoint dtype (large matrices) or as f32 (small
//!   vectors), after checking each shape, one synchronous copy from the mapped file each: the
//!   plain reference path.
//! * [`CheckpointUpload`] puts the same bytes in the same buffers at memory speed: matrices go
//!   straight from the mapped file through pinned staging, read on several threads while the
//!   previous chunk's copy runs (`cuda::upload`); q|k|v land in consecutive ranges of one
//!   buffer and gate|up rows are interleaved as they are staged, with no host copy of either.
//!   Its constructor checks that the checkpoint fits the GPU's free memory before anything is
//!   allocated.
//! * [`RandomWeights`] makes bf16 matrices uniform in ±`scale` with a device hash, norm weights
//!   of 1, and other small vectors uniform in ±`scale` from a host generator. It holds no
//!   optional tensors, so a random draft borrows the target's embedding and output head, as the
//!   published DSpark drafts do. Given an FP8 config (`dspark bench --weights fp8`), its
//!   projections are random E4M3 bytes with random 128 × 128 block scales.
//!
//! An FP8 target's projections come through [`WeightSource::fp8_linears`] (`cuda::fp8`).

use crate::checkpoint::fp8::Fp8Quant;
use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::fit::{check_fits, checkpoint_dir, device_bytes, device_bytes_without};
use crate::cuda::fp8::{self, RowOrder};
use crate::cuda::layers::{drv, gpu_err};
use crate::cuda::upload::{Image, LoadProgress, UploadOptions, Uploader};
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaSlice};
use dspark_kernels::cuda::host_table::HostTable;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::{CudaError, Gpu};
use dspark_tensor::arena::Arena;
use dspark_tensor::DType;
use dspark_testkit::Rng;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

/// Two matrices of `rows` rows each (equal byte lengths) with their rows interleaved: a_0, b_0,
/// a_1, b_1, … (the gate|up layout).
pub(crate) fn interleave_rows(a: &[u8], b: &[u8], rows: usize) -> Vec<u8> {
    let row = a.len() / rows.max(1);
    let mut bytes = Vec::with_capacity(2 * a.len());
    for r in 0..rows {
        bytes.extend_from_slice(&a[r * row..(r + 1) * row]);
        bytes.extend_from_slice(&b[r * row..(r + 1) * row]);
    }
    bytes
}

/// A provider of named tensors for the device backends.
pub trait WeightSource {
    /// A matrix `shape` in the source's dtype.
    fn matrix(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<WeightBuf>;
    /// Several matrices of one width as one, rows of the first first (q|k|v, gate|up).
    fn stacked(&self, arena: &Arena, parts: &[(&str, &[usize])]) -> Result<WeightBuf>;
    /// Two matrices of one shape `[rows, cols]` with their rows interleaved: a_0, b_0, a_1, b_1, …
    /// (gate|up, so every 16-row tile of the fused projection holds whole gate/up pairs).
    fn interleaved(&self, arena: &Arena, a: &str, b: &str, shape: &[usize]) -> Result<WeightBuf>;
    /// A gather-only matrix `shape` in mapped host memory, in the source's dtype (the token
    /// embedding under `--embeddings host`: `dspark_kernels::cuda::host_table`).
    fn host_table(&self, ctx: &Arc<CudaContext>, name: &str, shape: &[usize]) -> Result<HostTable>;
    /// A small tensor as f32.
    fn vector(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>>;
    /// A small tensor's values on the host.
    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
    /// Whether an optional tensor is present.
    fn contains(&self, name: &str) -> bool;
    /// One projection of an FP8 target (`quant`): `modules` (names without `.weight`, shapes
    /// `[rows, cols]` of one width) in `order`, as [`crate::cuda::fp8`] lays them out. Sources
    /// without FP8 weights refuse.
    fn fp8_linears(
        &self,
        _arena: &Arena,
        _quant: &Fp8Quant,
        modules: &[(&str, [usize; 2])],
        _order: RowOrder,
    ) -> Result<WeightBuf> {
        Err(Error::Request(format!("{:?}: this weight source holds no FP8 weights", modules.first().map(|m| m.0))))
    }
}

impl WeightSource for Checkpoint {
    fn matrix(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<WeightBuf> {
        let (dtype, bytes) = self.raw(name, shape)?;
        arena.weight(dtype, bytes).map_err(drv)
    }

    fn stacked(&self, arena: &Arena, parts: &[(&str, &[usize])]) -> Result<WeightBuf> {
        let raw = parts.iter().map(|(n, shape)| self.raw(n, shape)).collect::<Result<Vec<_>>>()?;
        if raw.iter().all(|(d, _)| *d == raw[0].0) {
            let bytes: Vec<u8> = raw.iter().flat_map(|(_, b)| b.iter().copied()).collect();
            arena.weight(raw[0].0, &bytes).map_err(drv)
        } else {
            // Mixed dtypes (not seen in published checkpoints) are widened to f32.
            let mut v = Vec::new();
            for (n, shape) in parts {
                v.extend(self.f32(n, shape)?);
            }
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            arena.weight(DType::F32, &bytes).map_err(drv)
        }
    }

    fn interleaved(&self, arena: &Arena, a: &str, b: &str, shape: &[usize]) -> Result<WeightBuf> {
        let (da, ba) = self.raw(a, shape)?;
        let (db, bb) = self.raw(b, shape)?;
        let rows = shape[0];
        if da == db {
            arena.weight(da, &interleave_rows(ba, bb, rows)).map_err(drv)
        } else {
            let (fa, fb) = (self.f32(a, shape)?, self.f32(b, shape)?);
            let row = fa.len() / rows;
            let mut bytes = Vec::with_capacity(8 * fa.len());
            for r in 0..rows {
                for v in fa[r * row..(r + 1) * row].iter().chain(&fb[r * row..(r + 1) * row]) {
                    bytes.extend_from_slice(&v.to_le_bytes());
                }
            }
            arena.weight(DType::F32, &bytes).map_err(drv)
        }
    }

    fn host_table(&self, ctx: &Arc<CudaContext>, name: &str, shape: &[usize]) -> Result<HostTable> {
        let (dtype, bytes) = self.raw(name, shape)?;
        let suffix = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        };
        HostTable::from_bytes(ctx, suffix, bytes).map_err(gpu_err)
    }

    fn vector(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>> {
        arena.upload(&self.f32(name, shape)?).map_err(drv)
    }

    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.f32(name, shape)
    }

    fn contains(&self, name: &str) -> bool {
        Checkpoint::contains(self, name)
    }

    fn fp8_linears(
        &self,
        arena: &Arena,
        quant: &Fp8Quant,
        modules: &[(&str, [usize; 2])],
        order: RowOrder,
    ) -> Result<WeightBuf> {
        fp8::load_linears(self, self, arena, quant, modules, order, &|image, dst| fp8::put_plain(arena, image, dst))
    }
}

/// A checkpoint loaded onto the device through pinned staging (see the module docs): the same
/// bytes in the same buffers as `impl WeightSource for Checkpoint`, at the link's speed (a
/// Qwen3-8B bf16 checkpoint in the page cache: 0.7 s onto an H200, against 24 s).
///
/// Copies are queued on the arena's stream and may still run when a call returns (whatever the
/// model queues after them is ordered after them); dropping the source, or [`finish`], waits
/// for them. `DSPARK_LOAD_SYNC=1` makes every call the plain path's, for A/B runs.
///
/// [`finish`]: CheckpointUpload::finish
pub struct CheckpointUpload<'a> {
    ck: &'a Checkpoint,
    /// `None` under `DSPARK_LOAD_SYNC=1`.
    up: Option<RefCell<Uploader>>,
    weights: usize,
}

impl<'a> CheckpointUpload<'a> {
    /// Checks that the checkpoint's tensors ([`device_bytes`]) plus `reserve` bytes (what else
    /// the caller will allocate: KV cache, activations; 0 to check the weights alone) fit the
    /// free memory of `ctx`'s GPU — an error naming the folder, the bytes needed and the bytes
    /// free if not — then allocates the pinned staging buffer.
    pub fn new(ck: &'a Checkpoint, ctx: &Arc<CudaContext>, reserve: usize) -> Result<CheckpointUpload<'a>> {
        Self::new_without(ck, ctx, reserve, &[])
    }

    /// [`CheckpointUpload::new`] for a load that will not upload the tensors named in `skip`
    /// (a draft's copies of its target's matrices, shared instead): they count neither in the
    /// memory check nor in the progress.
    pub fn new_without(
        ck: &'a Checkpoint,
        ctx: &Arc<CudaContext>,
        reserve: usize,
        skip: &[&str],
    ) -> Result<CheckpointUpload<'a>> {
        let weights = device_bytes_without(ck, skip);
        check_fits(ctx, &checkpoint_dir(ck), weights, reserve)?;
        let sync = std::env::var("DSPARK_LOAD_SYNC").is_ok_and(|v| v == "1");
        let mut up = Self::with_options(ck, ctx, (!sync).then(|| UploadOptions::from_env(weights)))?;
        up.weights = weights;
        Ok(up)
    }

    /// [`CheckpointUpload::new`] without the memory check, staged as `opts` says (`None`: the
    /// plain per-tensor path). Tests use it to force many small chunks.
    pub fn with_options(
        ck: &'a Checkpoint,
        ctx: &Arc<CudaContext>,
        opts: Option<UploadOptions>,
    ) -> Result<CheckpointUpload<'a>> {
        let up = match opts {
            Some(o) => Some(RefCell::new(Uploader::new(ctx, o)?)),
            None => None,
        };
        Ok(CheckpointUpload { ck, up, weights: device_bytes(ck) })
    }

    /// Reports the load's progress to `progress` (nothing when `None`) under `label`.
    pub fn with_progress(self, progress: Option<Arc<dyn LoadProgress>>, label: &str) -> CheckpointUpload<'a> {
        if let (Some(p), Some(up)) = (progress, &self.up) {
            up.borrow_mut().set_progress(p, label, self.weights as u64);
        }
        self
    }

    /// Bytes the checkpoint's tensors take on the device ([`device_bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights
    }

    /// Waits for every queued copy and reports the load complete (dropping does the same but
    /// cannot return an error).
    pub fn finish(self) -> Result<()> {
        match &self.up {
            Some(up) => up.borrow_mut().finish(),
            None => Ok(()),
        }
    }

    /// Uploads `image` into a new zeroed buffer of `n` elements of `dtype` (the image is
    /// exactly its bytes).
    fn put(
        &self,
        up: &RefCell<Uploader>,
        arena: &Arena,
        dtype: DType,
        n: usize,
        image: &Image<'_>,
    ) -> Result<WeightBuf> {
        let mut buf = arena.weight_zeros(dtype, n).map_err(drv)?;
        let mut up = up.borrow_mut();
        let stream = arena.stream();
        match &mut buf {
            WeightBuf::F32(s) => up.upload(stream, image, s)?,
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => up.upload(stream, image, s)?,
            // `weight_zeros` makes plain dtypes only; FP8 bytes go through `fp8_linears`.
            WeightBuf::Fp8(f) => up.upload(stream, image, &mut f.q)?,
        }
        Ok(buf)
    }
}

impl WeightSource for CheckpointUpload<'_> {
    fn matrix(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<WeightBuf> {
        let (dtype, bytes) = self.ck.raw(name, shape)?;
        match &self.up {
            Some(up) if !bytes.is_empty() => {
                self.put(up, arena, dtype, bytes.len() / dtype.size(), &Image::concat(vec![bytes]))
            }
            _ => self.ck.matrix(arena, name, shape),
        }
    }

    fn stacked(&self, arena: &Arena, parts: &[(&str, &[usize])]) -> Result<WeightBuf> {
        let raw = parts.iter().map(|(n, shape)| self.ck.raw(n, shape)).collect::<Result<Vec<_>>>()?;
        let len: usize = raw.iter().map(|(_, b)| b.len()).sum();
        match (&self.up, raw.first()) {
            (Some(up), Some(&(dtype, _))) if len > 0 && raw.iter().all(|(d, _)| *d == dtype) => {
                let image = Image::concat(raw.iter().map(|(_, b)| *b).collect());
                self.put(up, arena, dtype, len / dtype.size(), &image)
            }
            // Mixed dtypes are widened to f32 on the host, as the plain path does.
            _ => self.ck.stacked(arena, parts),
        }
    }

    fn interleaved(&self, arena: &Arena, a: &str, b: &str, shape: &[usize]) -> Result<WeightBuf> {
        let (da, ba) = self.ck.raw(a, shape)?;
        let (db, bb) = self.ck.raw(b, shape)?;
        let image = shape.first().and_then(|&rows| Image::interleave(ba, bb, rows));
        match (&self.up, image) {
            (Some(up), Some(image)) if da == db && !image.is_empty() => {
                self.put(up, arena, da, image.len() / da.size(), &image)
            }
            _ => self.ck.interleaved(arena, a, b, shape),
        }
    }

    fn host_table(&self, ctx: &Arc<CudaContext>, name: &str, shape: &[usize]) -> Result<HostTable> {
        // Straight from the mapped file into the table: nothing goes through the staging ring.
        self.ck.host_table(ctx, name, shape)
    }

    fn vector(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>> {
        let v = self.ck.f32(name, shape)?;
        match &self.up {
            // Through the ring too: a pageable copy could wait for the chunks queued before it.
            Some(up) if !v.is_empty() => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let mut buf = arena.zeros::<f32>(v.len()).map_err(drv)?;
                up.borrow_mut().upload(arena.stream(), &Image::concat(vec![&bytes]), &mut buf)?;
                Ok(buf)
            }
            _ => arena.upload(&v).map_err(drv),
        }
    }

    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.ck.f32(name, shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.ck.contains(name)
    }

    fn fp8_linears(
        &self,
        arena: &Arena,
        quant: &Fp8Quant,
        modules: &[(&str, [usize; 2])],
        order: RowOrder,
    ) -> Result<WeightBuf> {
        // The bytes through the staging ring like any matrix's; plain parts through `self`.
        fp8::load_linears(self.ck, self, arena, quant, modules, order, &|image, dst| match &self.up {
            Some(up) if !image.is_empty() => up.borrow_mut().upload(arena.stream(), image, dst),
            _ => fp8::put_plain(arena, image, dst),
        })
    }
}

impl Drop for CheckpointUpload<'_> {
    fn drop(&mut self) {
        if let Some(up) = &self.up {
            let _ = up.borrow_mut().finish();
        }
    }
}

/// Random bf16 weights made on the device (see the module docs).
pub struct RandomWeights {
    gpu: Arc<Gpu>,
    seed: Cell<u64>,
    /// Half-width of the uniform distribution.
    pub scale: f32,
}

impl RandomWeights {
    /// `scale` 0.02 keeps a 36-layer residual stream finite and its softmaxes non-degenerate.
    pub fn new(gpu: Arc<Gpu>, seed: u64, scale: f32) -> RandomWeights {
        RandomWeights { gpu, seed: Cell::new(seed), scale }
    }

    fn next_seed(&self) -> u64 {
        let s = self.seed.get();
        self.seed.set(s.wrapping_add(1));
        s
    }

    fn bf16(&self, arena: &Arena, n: usize) -> Result<WeightBuf> {
        let mut buf = arena.zeros::<u16>(n).map_err(drv)?;
        self.gpu
            .fill_uniform_bf16(&mut buf, self.next_seed(), self.scale)
            .map_err(|e: CudaError| Error::Request(e.to_string()))?;
        Ok(WeightBuf::Bf16(buf))
    }
}

impl WeightSource for RandomWeights {
    fn matrix(&self, arena: &Arena, _name: &str, shape: &[usize]) -> Result<WeightBuf> {
        self.bf16(arena, shape.iter().product())
    }

    fn stacked(&self, arena: &Arena, parts: &[(&str, &[usize])]) -> Result<WeightBuf> {
        self.bf16(arena, parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum())
    }

    fn interleaved(&self, arena: &Arena, _a: &str, _b: &str, shape: &[usize]) -> Result<WeightBuf> {
        self.bf16(arena, 2 * shape.iter().product::<usize>())
    }

    /// Made on the device like a matrix, then copied into the table.
    fn host_table(&self, ctx: &Arc<CudaContext>, _name: &str, shape: &[usize]) -> Result<HostTable> {
        let n: usize = shape.iter().product();
        let mut dev = self.gpu.stream.alloc_zeros::<u16>(n.max(1)).map_err(drv)?;
        self.gpu.fill_uniform_bf16(&mut dev, self.next_seed(), self.scale).map_err(gpu_err)?;
        let values = self.gpu.stream.clone_dtoh(&dev).map_err(drv)?;
        let mut t = HostTable::zeroed(ctx, "bf16", 2 * values.len()).map_err(gpu_err)?;
        for (d, v) in t.host_mut().map_err(gpu_err)?.chunks_exact_mut(2).zip(&values) {
            d.copy_from_slice(&v.to_le_bytes());
        }
        Ok(t)
    }

    fn vector(&self, arena: &Arena, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>> {
        arena.upload(&self.host(name, shape)?).map_err(drv)
    }

    fn host(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let n: usize = shape.iter().product();
        if name.ends_with("norm.weight") {
            return Ok(vec![1.0; n]);
        }
        let mut rng = Rng(self.next_seed().wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Ok((0..n).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * self.scale).collect())
    }

    fn contains(&self, _name: &str) -> bool {
        false
    }

    /// Random E4M3 bytes (|value| < 2) times random block scales in [¼, ½]·`scale`, so the
    /// weights stay within ±`scale` like the bf16 ones.
    fn fp8_linears(
        &self,
        arena: &Arena,
        quant: &Fp8Quant,
        modules: &[(&str, [usize; 2])],
        order: RowOrder,
    ) -> Result<WeightBuf> {
        let k = modules.first().map_or(0, |m| m.1[1]);
        let rows: Vec<usize> = modules.iter().map(|(_, s)| s[0]).collect();
        let mut q = arena.zeros::<u8>(rows.iter().sum::<usize>() * k).map_err(drv)?;
        self.gpu.fill_random_fp8(&mut q, self.next_seed()).map_err(|e: CudaError| Error::Request(e.to_string()))?;
        let [bn, bk] = quant.block;
        let n_scales: usize = rows.iter().map(|r| r.div_ceil(bn)).sum::<usize>() * k.div_ceil(bk);
        let mut rng = Rng(self.next_seed().wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let scales: Vec<f32> = (0..n_scales)
            .map(|_| (1.0 + (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * self.scale / 4.0)
            .collect();
        fp8::device_buf(arena, q, &scales, &fp8::scale_rows(&rows, bn, order), k, bk)
    }
}
