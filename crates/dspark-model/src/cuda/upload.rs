//! Checkpoint bytes onto the device at memory speed: pinned staging, parallel reads, copies
//! overlapped with them.
//!
//! A copy from pageable memory (the checkpoint's mmap) runs at a fraction of the link's speed
//! and is synchronous, and reading the mapped pages on one thread is slower still. The
//! [`Uploader`] instead owns one pinned host buffer used as a ring of in-flight chunks:
//!
//! ```text
//! for each chunk (≤ chunk bytes) of a destination's bytes:
//!     take the next free region of the ring (waiting for the event of the oldest copy that
//!         still reads it, if it overlaps)
//!     fill it from the source on `threads` threads at once (each a contiguous piece: the
//!         mapped pages are touched in parallel, which is what makes a hot page cache fast)
//!     cuMemcpyHtoDAsync(destination + chunk offset ← region) on the arena's stream; record
//!         the region's event
//! ```
//!
//! so the DMA of one chunk runs while the next ones are read (measured on the H200 with a
//! Qwen3-8B-shaped bf16 checkpoint, 16.4 GB, in the page cache: 0.64–0.76 s for the whole
//! `CudaQwen3` load, 21–26 GB/s, with 8 or 16 threads; 0.9 s with 4, 3.0 s with 1; the plain
//! per-tensor path 24.4 s — `tests/gpu_upload.rs::load_speed_qwen3_8b_shapes`). The copies are on the stream the
//! destination was allocated on, so everything the model does with a weight after loading it
//! (the draft's device copies of its k|v rows, say) is ordered after its upload; the ring is
//! drained before its buffer is freed.
//!
//! What lands in a destination is described by an [`Image`], never materialised on the host:
//! parts one after another (q|k|v) or two matrices with their rows interleaved (gate|up), each
//! chunk filled straight from the mapped bytes.
//!
//! Before anything is allocated, `fit::check_fits` compares the bytes a checkpoint puts on the
//! device (`fit::device_bytes`) with the driver's free memory.
//!
//! Knobs for A/B runs: `DSPARK_LOAD_THREADS` (reader threads, default the core count up to 8),
//! `DSPARK_LOAD_CHUNK_MIB` (chunk size, default 32; the ring holds four), and
//! `DSPARK_LOAD_SYNC=1` (`cuda::weights::CheckpointUpload` falls back to the plain per-tensor
//! copies of `impl WeightSource for Checkpoint`).

use crate::cuda::layers::drv;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, PinnedHostSlice};
use dspark_kernels::cuda::ops::fp8_place_tile;
use std::collections::VecDeque;
use std::sync::Arc;

/// Where a load reports how far it got. Called with `done` = 0 first, after each chunk is
/// queued, and with `done` = `total` once every copy has finished.
pub trait LoadProgress: Send + Sync {
    fn update(&self, label: &str, done: u64, total: u64);
}

/// The bytes of one device buffer, described by where they come from.
#[derive(Clone, Debug)]
pub struct Image<'a>(Layout<'a>);

#[derive(Clone, Debug)]
enum Layout<'a> {
    /// The parts one after another.
    Concat(Vec<&'a [u8]>),
    /// Rows of `row` bytes of `a` and `b` alternating: a_0, b_0, a_1, b_1, …
    Interleave { a: &'a [u8], b: &'a [u8], row: usize },
    /// An FP8 matrix of `cols` columns (the inner image, row-major) in tile order
    /// (`dspark_kernels::cuda::ops::fp8_place_tile`): a whole tile of 16 rows at a time.
    Tiled { inner: Box<Image<'a>>, cols: usize },
}

impl<'a> Image<'a> {
    /// `parts` one after another (the rows of the first, then the second's, …).
    pub fn concat(parts: Vec<&'a [u8]>) -> Image<'a> {
        Image(Layout::Concat(parts))
    }

    /// Two matrices of `rows` rows with their rows interleaved: a_0, b_0, a_1, b_1, … `None`
    /// unless both have the same length, a whole number of bytes per row.
    pub fn interleave(a: &'a [u8], b: &'a [u8], rows: usize) -> Option<Image<'a>> {
        if a.len() != b.len() || rows == 0 || !a.len().is_multiple_of(rows) {
            return None;
        }
        let row = a.len() / rows;
        Some(if row == 0 { Image::concat(Vec::new()) } else { Image(Layout::Interleave { a, b, row }) })
    }

    /// `inner`, a row-major FP8 matrix of `cols` columns, in the device's tile order. `None`
    /// unless the shape is tiled (`fp8_tiled`: rows a multiple of 16, columns of 64).
    pub fn tiled(inner: Image<'a>, cols: usize) -> Option<Image<'a>> {
        let rows = inner.len().checked_div(cols)?;
        if rows * cols != inner.len() || !dspark_kernels::cuda::ops::fp8_tiled(rows, cols) {
            return None;
        }
        Some(Image(Layout::Tiled { inner: Box::new(inner), cols }))
    }

    /// Bytes in the image.
    pub fn len(&self) -> usize {
        match &self.0 {
            Layout::Concat(parts) => parts.iter().map(|p| p.len()).sum(),
            Layout::Interleave { a, b, .. } => a.len() + b.len(),
            Layout::Tiled { inner, .. } => inner.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes bytes `offset .. offset + out.len()` of the image into `out`.
    ///
    /// # Panics
    /// If the window runs past the end of the image (the callers' windows come from
    /// [`Image::len`]).
    pub fn fill(&self, offset: usize, out: &mut [u8]) {
        let end = offset + out.len();
        assert!(end <= self.len(), "window {offset}..{end} of a {}-byte image", self.len());
        let mut pos = offset;
        match &self.0 {
            Layout::Concat(parts) => {
                let mut start = 0;
                for p in parts {
                    let p_end = start + p.len();
                    if pos < p_end && pos < end {
                        let n = end.min(p_end) - pos;
                        out[pos - offset..pos - offset + n].copy_from_slice(&p[pos - start..pos - start + n]);
                        pos += n;
                    }
                    start = p_end;
                }
            }
            &Layout::Interleave { a, b, row } => {
                while pos < end {
                    let (pair, within) = (pos / (2 * row), pos % (2 * row));
                    let (src, at) =
                        if within < row { (a, pair * row + within) } else { (b, pair * row + within - row) };
                    let n = (row - within % row).min(end - pos);
                    out[pos - offset..pos - offset + n].copy_from_slice(&src[at..at + n]);
                    pos += n;
                }
            }
            Layout::Tiled { inner, cols } => {
                // A tile's 16 rows read at once, their 64-byte chunks placed; a tile the window
                // cuts is placed whole into `part` first.
                let tile = 16 * cols;
                let (mut rows, mut part) = (vec![0u8; tile], Vec::new());
                while pos < end {
                    let t0 = pos / tile * tile;
                    inner.fill(t0, &mut rows);
                    let (a, b) = (pos - t0, (end - t0).min(tile));
                    if a == 0 && b == tile {
                        fp8_place_tile(&rows, *cols, &mut out[pos - offset..pos - offset + tile]);
                    } else {
                        part.resize(tile, 0);
                        fp8_place_tile(&rows, *cols, &mut part);
                        out[pos - offset..pos - offset + b - a].copy_from_slice(&part[a..b]);
                    }
                    pos = t0 + b;
                }
            }
        }
        debug_assert_eq!(pos, end);
    }
}

/// Fills `out` with bytes `offset ..` of `image`, split into up to `threads` contiguous pieces
/// of at least `min_piece` bytes (4 KiB-aligned), one per thread.
pub fn fill_parallel(image: &Image<'_>, offset: usize, out: &mut [u8], threads: usize, min_piece: usize) {
    let pieces = threads.min(out.len() / min_piece.max(1)).max(1);
    if pieces == 1 {
        image.fill(offset, out);
        return;
    }
    let step = out.len().div_ceil(pieces).next_multiple_of(4096);
    std::thread::scope(|s| {
        let mut parts = out.chunks_mut(step).enumerate();
        let first = parts.next();
        for (i, part) in parts {
            s.spawn(move || image.fill(offset + i * step, part));
        }
        if let Some((_, part)) = first {
            image.fill(offset, part);
        }
    });
}

/// The placement of chunks in a circular buffer of `cap` bytes, each tagged with what marks
/// its release (an event). Offsets are virtual (they only grow; physical = virtual mod `cap`),
/// no region straddles the end, and the live regions span at most `cap` virtual bytes, so no
/// two overlap physically.
#[derive(Debug)]
pub(crate) struct Ring<E> {
    cap: u64,
    head: u64,
    live: VecDeque<(u64, E)>,
}

impl<E> Ring<E> {
    pub(crate) fn new(cap: usize) -> Ring<E> {
        Ring { cap: cap as u64, head: 0, live: VecDeque::new() }
    }

    /// Where a region of `len` bytes (at most the capacity) goes: its virtual start, after
    /// handing every live region it would overlap to `release` (oldest first).
    pub(crate) fn place<X>(&mut self, len: usize, mut release: impl FnMut(E) -> Result<(), X>) -> Result<u64, X> {
        let len = len as u64;
        assert!(len <= self.cap, "a {len}-byte region in a {}-byte ring", self.cap);
        let mut v = self.head;
        if v % self.cap + len > self.cap {
            v += self.cap - v % self.cap;
        }
        while let Some(&(start, _)) = self.live.front() {
            if v + len - start <= self.cap {
                break;
            }
            let (_, e) = self.live.pop_front().expect("front exists");
            release(e)?;
        }
        Ok(v)
    }

    /// Records the region [`Ring::place`] gave, now in flight until `e` completes.
    pub(crate) fn push(&mut self, v: u64, len: usize, e: E) {
        self.head = v + len as u64;
        self.live.push_back((v, e));
    }

    /// The physical offset of virtual offset `v`.
    pub(crate) fn phys(&self, v: u64) -> usize {
        (v % self.cap) as usize
    }

    /// Hands every live region to `release`, oldest first.
    pub(crate) fn drain<X>(&mut self, mut release: impl FnMut(E) -> Result<(), X>) -> Result<(), X> {
        while let Some((_, e)) = self.live.pop_front() {
            release(e)?;
        }
        Ok(())
    }
}

/// How an [`Uploader`] stages its copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UploadOptions {
    /// Largest single copy.
    pub chunk: usize,
    /// Pinned staging bytes (chunks in flight × chunk).
    pub staging: usize,
    /// Threads that fill a chunk (the calling one included).
    pub threads: usize,
    /// Smallest piece of a chunk given to a thread of its own.
    pub min_piece: usize,
}

impl UploadOptions {
    /// Defaults, overridden by `DSPARK_LOAD_THREADS` and `DSPARK_LOAD_CHUNK_MIB`, with the
    /// staging buffer no larger than `total` bytes (rounded up to 4 KiB) needs.
    pub fn from_env(total: usize) -> UploadOptions {
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&v| v > 0);
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4);
        let threads = env("DSPARK_LOAD_THREADS").unwrap_or(cores.min(8));
        let chunk = env("DSPARK_LOAD_CHUNK_MIB").unwrap_or(32).min(1 << 12) << 20;
        let staging = (4 * chunk).min(total.max(1).next_multiple_of(4096));
        UploadOptions { chunk: chunk.min(staging), staging, threads, min_piece: 1 << 20 }
    }
}

/// Copies host bytes into device buffers through a ring of pinned memory (see the module docs).
pub struct Uploader {
    ctx: Arc<CudaContext>,
    opts: UploadOptions,
    /// Kept for its lifetime: the ring's memory.
    _staging: PinnedHostSlice<u8>,
    base: *mut u8,
    ring: Ring<CudaEvent>,
    spare: Vec<CudaEvent>,
    progress: Option<(Arc<dyn LoadProgress>, String)>,
    done: u64,
    total: u64,
}

impl Uploader {
    /// Allocates the pinned staging buffer of `opts` in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, opts: UploadOptions) -> Result<Uploader> {
        let staging_len = opts.staging.max(1);
        let opts = UploadOptions { chunk: opts.chunk.clamp(1, staging_len), threads: opts.threads.max(1), ..opts };
        // SAFETY: the memory is uninitialised; it is only ever written (by `fill`) before the
        // device reads the bytes written.
        let mut staging =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(staging_len, sys::CU_MEMHOSTALLOC_PORTABLE) }.map_err(drv)?;
        // The slice's own event is never recorded, so this does not wait.
        let base = staging.as_mut_ptr().map_err(drv)?;
        Ok(Uploader {
            ctx: ctx.clone(),
            opts,
            _staging: staging,
            base,
            ring: Ring::new(staging_len),
            spare: Vec::new(),
            progress: None,
            done: 0,
            total: 0,
        })
    }

    pub fn options(&self) -> UploadOptions {
        self.opts
    }

    /// Reports to `progress` under `label`, `total` bytes in all (reported as 0 done now).
    pub fn set_progress(&mut self, progress: Arc<dyn LoadProgress>, label: &str, total: u64) {
        progress.update(label, 0, total);
        self.progress = Some((progress, label.to_string()));
        self.total = total;
        self.done = 0;
    }

    /// Bytes queued so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    fn advance(&mut self, bytes: usize) {
        self.done += bytes as u64;
        if let Some((p, label)) = &self.progress {
            p.update(label, self.done.min(self.total), self.total.max(self.done));
        }
    }

    /// Queues copies of `image` into `dst` (exactly its size) on `stream`, which must belong to
    /// the uploader's context; returns once the last chunk is queued. The bytes are on the
    /// device for anything queued on `stream` after this.
    pub fn upload<T>(&mut self, stream: &CudaStream, image: &Image<'_>, dst: &mut CudaSlice<T>) -> Result<()> {
        let total = image.len();
        if total != dst.num_bytes() {
            return Err(Error::Request(format!(
                "upload of {total} bytes into a {}-byte device buffer",
                dst.num_bytes()
            )));
        }
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(drv(result::DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT)));
        }
        self.ctx.bind_to_thread().map_err(drv)?;
        let (dptr, _record) = dst.device_ptr_mut(stream);
        let mut off = 0;
        while off < total {
            let len = self.opts.chunk.min(total - off);
            let spare = &mut self.spare;
            let v = self
                .ring
                .place(len, |e: CudaEvent| {
                    let r = e.synchronize();
                    spare.push(e);
                    r
                })
                .map_err(drv)?;
            let phys = self.ring.phys(v);
            // SAFETY: `place` released every copy that read this region, and the ring lies
            // inside the staging allocation (`phys + len <= staging`).
            let buf = unsafe { std::slice::from_raw_parts_mut(self.base.add(phys), len) };
            fill_parallel(image, off, buf, self.opts.threads, self.opts.min_piece);
            // SAFETY: `dst` is `total` bytes long and `off + len <= total`; `buf` stays alive
            // and unwritten until the event recorded below completes.
            unsafe { result::memcpy_htod_async(dptr + off as u64, &buf[..], stream.cu_stream()) }.map_err(drv)?;
            let event = match self.spare.pop() {
                Some(e) => e,
                None => match self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)) {
                    Ok(e) => e,
                    Err(e) => {
                        // The copy is queued with nothing to mark its end: wait for it here.
                        let _ = stream.synchronize();
                        return Err(drv(e));
                    }
                },
            };
            if let Err(e) = event.record(stream) {
                let _ = stream.synchronize();
                self.spare.push(event);
                return Err(drv(e));
            }
            self.ring.push(v, len, event);
            self.advance(len);
            off += len;
        }
        Ok(())
    }

    /// Waits for every queued copy.
    pub fn synchronize(&mut self) -> Result<()> {
        let spare = &mut self.spare;
        self.ring
            .drain(|e: CudaEvent| {
                let r = e.synchronize();
                spare.push(e);
                r
            })
            .map_err(drv)
    }

    /// Waits for every queued copy, then reports the load complete.
    pub fn finish(&mut self) -> Result<()> {
        let r = self.synchronize();
        if let Some((p, label)) = &self.progress {
            let total = self.total.max(self.done);
            p.update(label, total, total);
        }
        self.progress = None;
        r
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        // No copy may still read the staging buffer when it is freed.
        let _ = self.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_testkit::Rng;

    fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
        (0..n).map(|_| rng.next_u64() as u8).collect()
    }

    /// Today's host interleave (`impl WeightSource for Checkpoint`).
    fn naive_interleave(a: &[u8], b: &[u8], rows: usize) -> Vec<u8> {
        let row = a.len() / rows;
        let mut out = Vec::new();
        for r in 0..rows {
            out.extend_from_slice(&a[r * row..(r + 1) * row]);
            out.extend_from_slice(&b[r * row..(r + 1) * row]);
        }
        out
    }

    /// Every window of `image`, filled whole, in random pieces, and in parallel, equals `want`'s.
    fn check_windows(rng: &mut Rng, image: &Image<'_>, want: &[u8]) {
        assert_eq!(image.len(), want.len());
        let mut whole = vec![0u8; want.len()];
        image.fill(0, &mut whole);
        assert_eq!(whole, want);
        for _ in 0..50 {
            let a = rng.below(want.len() + 1);
            let b = a + rng.below(want.len() - a + 1);
            let mut out = vec![0xAAu8; b - a];
            image.fill(a, &mut out);
            assert_eq!(out, want[a..b], "window {a}..{b}");
            let mut par = vec![0x55u8; b - a];
            fill_parallel(image, a, &mut par, 1 + rng.below(6), 1 + rng.below(64));
            assert_eq!(par, want[a..b], "parallel window {a}..{b}");
        }
    }

    #[test]
    fn concat_windows_match_the_host_copy() {
        let mut rng = Rng(7);
        for _ in 0..40 {
            let parts: Vec<Vec<u8>> = (0..rng.below(5))
                .map(|_| {
                    let n = rng.below(300);
                    bytes(&mut rng, n)
                })
                .collect();
            let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            let image = Image::concat(parts.iter().map(|p| p.as_slice()).collect());
            check_windows(&mut rng, &image, &want);
        }
    }

    #[test]
    fn interleave_windows_match_the_host_interleave() {
        let mut rng = Rng(11);
        for _ in 0..40 {
            let rows = 1 + rng.below(20);
            let row = 2 * (1 + rng.below(40));
            let (a, b) = (bytes(&mut rng, rows * row), bytes(&mut rng, rows * row));
            let want = naive_interleave(&a, &b, rows);
            let image = Image::interleave(&a, &b, rows).unwrap();
            check_windows(&mut rng, &image, &want);
        }
        assert!(Image::interleave(&[0; 4], &[0; 6], 2).is_none());
        assert!(Image::interleave(&[0; 6], &[0; 6], 4).is_none());
        assert!(Image::interleave(&[0; 6], &[0; 6], 0).is_none());
        assert!(Image::interleave(&[], &[], 3).unwrap().is_empty());
    }

    #[test]
    fn tiled_windows_match_the_kernels_tile_order() {
        use dspark_kernels::cuda::ops::fp8_tile_order;
        let mut rng = Rng(13);
        for _ in 0..20 {
            let (rows, cols) = (16 * (1 + rng.below(4)), 64 * (1 + rng.below(3)));
            let (a, b) = (bytes(&mut rng, rows * cols), bytes(&mut rng, rows * cols));
            // The fused shapes: q|k|v-style parts one after another, gate|up-style interleaved.
            let want = fp8_tile_order(&[a.clone(), b.clone()].concat(), 2 * rows, cols);
            let image = Image::tiled(Image::concat(vec![&a, &b]), cols).unwrap();
            check_windows(&mut rng, &image, &want);
            let want = fp8_tile_order(&naive_interleave(&a, &b, rows), 2 * rows, cols);
            let image = Image::tiled(Image::interleave(&a, &b, rows).unwrap(), cols).unwrap();
            check_windows(&mut rng, &image, &want);
        }
        // Shapes that are not whole tiles stay row-major: no tiled image.
        assert!(Image::tiled(Image::concat(vec![&[0u8; 8 * 64]]), 64).is_none());
        assert!(Image::tiled(Image::concat(vec![&[0u8; 16 * 32]]), 32).is_none());
        assert!(Image::tiled(Image::concat(vec![&[0u8; 16 * 64]]), 0).is_none());
    }

    /// Large enough that `fill_parallel` splits into 4 KiB-aligned pieces with a short last one.
    #[test]
    fn parallel_fill_of_a_large_interleave() {
        let mut rng = Rng(5);
        let (rows, row) = (300, 8192 + 6);
        let (a, b) = (bytes(&mut rng, rows * row), bytes(&mut rng, rows * row));
        let want = naive_interleave(&a, &b, rows);
        let image = Image::interleave(&a, &b, rows).unwrap();
        for threads in [1, 3, 8] {
            let mut out = vec![0u8; want.len() - 1000];
            fill_parallel(&image, 1000, &mut out, threads, 1 << 16);
            assert!(out == want[1000..], "{threads} threads");
        }
    }

    /// The chunks of a sequence of uploads, played through the ring: no region is handed out
    /// while a live one overlaps it, regions stay inside the buffer, and releases come oldest
    /// first.
    #[test]
    fn ring_regions_never_overlap_live_ones() {
        let mut rng = Rng(3);
        for _ in 0..50 {
            let cap = 1 + rng.below(100);
            let mut ring: Ring<usize> = Ring::new(cap);
            let mut live: VecDeque<(usize, usize, usize)> = VecDeque::new(); // (id, phys start, len)
            for id in 0..200 {
                let len = 1 + rng.below(cap);
                let v = ring
                    .place(len, |e| {
                        let (front, ..) = live.pop_front().expect("released a region not live");
                        assert_eq!(front, e, "released out of order");
                        Ok::<_, ()>(())
                    })
                    .unwrap();
                let p = ring.phys(v);
                assert!(p + len <= cap, "region {p}+{len} past the {cap}-byte buffer");
                for &(other, q, n) in &live {
                    assert!(p + len <= q || q + n <= p, "region {id} at {p}+{len} overlaps live {other} at {q}+{n}");
                }
                ring.push(v, len, id);
                live.push_back((id, p, len));
            }
            ring.drain(|e| {
                assert_eq!(live.pop_front().unwrap().0, e);
                Ok::<_, ()>(())
            })
            .unwrap();
            assert!(live.is_empty());
        }
    }

    #[test]
    fn options_fit_the_checkpoint() {
        let o = UploadOptions::from_env(10_000);
        assert_eq!(o.staging, 12_288);
        assert!(o.chunk <= o.staging && o.threads >= 1);
        let o = UploadOptions::from_env(20 << 30);
        assert!(o.staging >= o.chunk && o.staging.is_multiple_of(o.chunk));
    }
}
