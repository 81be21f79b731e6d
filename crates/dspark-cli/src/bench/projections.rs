//! Projection microbenchmark: our matvec beside cuBLAS GEMM at M rows, on the same weights.
//!
//! Each weight shape is allocated as enough random bf16 copies to span 512 MB, and successive
//! calls rotate through them, so no call finds its weights in the 60 MB L2 (a single copy
//! re-read in a loop would measure L2, not HBM). Both sides run the same number of calls
//! between two CUDA events on the one stream, twice: replayed from a CUDA graph of the calls,
//! as `generate` runs its steps (and as engines that capture decoding in graphs run cuBLAS) —
//! the figure the report and the goals use — and launched one by one from the host. The eager
//! figure holds each launch's host work wherever the GPU finishes a call faster than the host
//! issues the next: cuBLAS took 11–17 µs a call on 1024 × 4096 eagerly and 6.95 µs replayed,
//! ours 5.5 and 5.0 (docs/perf.md). Ours is [`Gpu::matvec`] — the call the models make —
//! reading f32 activations; cuBLAS gets the same activations rounded to bf16 and writes bf16
//! (`cublasGemmEx`, f32 compute), which is how engines that hand these shapes to cuBLAS call it.
//!
//! With `fp8`, ours reads Qwen's block-scaled FP8 copies of the shape (E4M3 bytes, 128 × 128
//! f32 block scales: the FP8 matvec twins) while cuBLAS keeps its bf16 copies: the peer is the
//! bf16 GEMM a bf16 engine runs, and the floor is the FP8 bytes.

use anyhow::{Context, Result};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::ops::{Fp8Buf, WeightBuf};
use dspark_kernels::cuda::Gpu;
use half::bf16;

/// Bytes of weights the rotation spans.
const ROTATION_BYTES: usize = 512 << 20;

/// µs per call of one projection, replayed from a graph and launched eagerly.
pub struct Timing {
    pub ours: Micros,
    pub cublas: Micros,
    /// Each named tensor-core variant, replayed from a graph.
    pub variants: Vec<f64>,
}

/// µs per call: replayed from a CUDA graph, and launched one by one from the host.
#[derive(Clone, Copy, Debug)]
pub struct Micros {
    pub graph: f64,
    pub eager: f64,
}

/// Our matvec, cuBLAS and each named tensor-core variant on `W [out, in]` at `m` rows.
pub fn time_projection(
    gpu: &Gpu,
    blas: &CudaBlas,
    (out, inp, m): (usize, usize, usize),
    seed: u64,
    variants: &[&str],
    fp8: bool,
) -> Result<Timing> {
    let bytes = out * inp * 2;
    let copies = ROTATION_BYTES.div_ceil(bytes).max(1);
    let mut weights = Vec::with_capacity(copies);
    for c in 0..copies {
        let mut buf: CudaSlice<u16> = gpu.stream.alloc_zeros(out * inp)?;
        gpu.fill_uniform_bf16(&mut buf, seed * 1000 + c as u64, 0.02)?;
        weights.push(WeightBuf::Bf16(buf));
    }
    // FP8 copies for ours (as many: a half-size rotation still spans 4× the L2).
    let fp8_weights = if fp8 {
        (0..copies).map(|c| fp8_copy(gpu, (out, inp), seed * 1000 + c as u64)).collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let ours_w = if fp8 { &fp8_weights } else { &weights };
    let x_host: Vec<f32> = (0..m * inp).map(|i| ((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5).collect();
    let x = gpu.stream.clone_htod(&x_host)?;
    let x16: Vec<bf16> = x_host.iter().map(|&v| bf16::from_f32(v)).collect();
    let x16 = gpu.stream.clone_htod(&x16)?;
    let mut y = gpu.stream.alloc_zeros::<f32>(m * out)?;
    let mut y16 = gpu.stream.alloc_zeros::<bf16>(m * out)?;
    let calls = (3 * copies).max(30);

    let ours = timed(gpu, calls, |i| {
        gpu.matvec(&ours_w[i % copies], &x.as_view(), &mut y.as_view_mut(), (m, inp, out), false).context("matvec")
    })?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: out as i32,
        n: m as i32,
        k: inp as i32,
        alpha: bf16::ONE,
        lda: inp as i32,
        ldb: inp as i32,
        beta: bf16::ZERO,
        ldc: out as i32,
    };
    let cublas = timed(gpu, calls, |i| {
        let WeightBuf::Bf16(w) = &weights[i % copies] else { unreachable!("bench weights are bf16") };
        // SAFETY: bf16 and the stored u16 bits have the same size and layout.
        let w = unsafe { w.transmute::<bf16>(out * inp) }.context("bf16 view of the weights")?;
        // SAFETY: W [out, in] row-major is the column-major in × out matrix op(A)ᵀ; x [m, in]
        // row-major is column-major in × m; y [m, out] row-major is column-major out × m.
        unsafe { blas.gemm(cfg, &w, &x16, &mut y16) }.context("cublasGemmEx")?;
        Ok(())
    })?;
    let mut vt = Vec::new();
    for name in variants {
        let t = timed(gpu, calls, |i| {
            gpu.matvec_tc_variant(name, &ours_w[i % copies], &x.as_view(), &mut y.as_view_mut(), (m, inp, out))
                .context("matvec variant")
        })?;
        vt.push(t.graph);
    }
    Ok(Timing { ours, cublas, variants: vt })
}

/// One random FP8 weight `[out, inp]` in 128 × 128 blocks (bytes from the device hash, block
/// scales in [¼, ½]·0.02 so values stay within ±0.02 like the bf16 copies).
fn fp8_copy(gpu: &Gpu, (out, inp): (usize, usize), seed: u64) -> Result<WeightBuf> {
    let mut q: CudaSlice<u8> = gpu.stream.alloc_zeros(out * inp)?;
    gpu.fill_random_fp8(&mut q, seed)?;
    let (sr, sc) = (out.div_ceil(128), inp.div_ceil(128));
    let scale: Vec<f32> = (0..sr * sc).map(|i| 0.005 * (1.0 + ((i * 2654435761) % 1000) as f32 / 1000.0)).collect();
    let srow: Vec<u32> = (0..out).map(|o| (o / 128) as u32).collect();
    let buf = Fp8Buf::new(
        q,
        gpu.stream.clone_htod(&scale)?,
        (gpu.stream.clone_htod(&srow)?, sr.saturating_sub(1) as u32),
        inp,
        128,
        std::sync::Arc::new(gpu.stream.alloc_zeros::<u32>(Fp8Buf::xsplit_len(inp))?),
    )?;
    Ok(WeightBuf::Fp8(buf))
}

/// Replays of the captured calls timed per graph measurement.
const REPLAYS: usize = 3;

/// Mean µs per call over `calls` calls after a warm-up of the same length, between events:
/// launched one by one, then captured into one graph and replayed [`REPLAYS`] times.
fn timed(gpu: &Gpu, calls: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<Micros> {
    for i in 0..calls {
        f(i)?;
    }
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.stream.record_event(flags)?;
    for i in 0..calls {
        f(i)?;
    }
    let end = gpu.stream.record_event(flags)?;
    let eager = start.elapsed_ms(&end)? as f64 * 1e3 / calls as f64;

    gpu.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (0..calls).try_for_each(&mut f);
    // Capture must end even when a call failed, or the stream stays unusable.
    let graph = gpu.stream.end_capture(CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.context("the projection's graph capture recorded nothing")?;
    graph.launch()?; // warm-up replay
    let start = gpu.stream.record_event(flags)?;
    for _ in 0..REPLAYS {
        graph.launch()?;
    }
    let end = gpu.stream.record_event(flags)?;
    let graph = start.elapsed_ms(&end)? as f64 * 1e3 / (REPLAYS * calls) as f64;
    Ok(Micros { graph, eager })
}
