//! The bf16-activation mode's projections as cuBLASLt GEMMs, one algorithm per shape, so that a
//! row's output has the same bits whatever the step's row count (`--activations bf16`).
//!
//! ```text
//! y[m, n] = x[m, k] · W[n, k]ᵀ   (+ y when accumulating: the residual add, as beta = 1)
//! ```
//!
//! x bf16 rows (the mode rounds every projection's input to bf16 once), W the checkpoint's bf16
//! matrix, y f32, products accumulated in f32 (`CUBLAS_COMPUTE_32F`): the semantics of the
//! prefill's GEMMs (gemm.rs) and of bf16 engines.
//!
//! Why cuBLASLt and not the small-M matvec at every row count: past 8 rows the matvec family
//! (weights in registers, x in three or one bf16 parts, a K split fixed by the 8-row kernel so
//! that wider launches keep its bits) grows with the rows — 64 rows of q_proj took 32.7 µs
//! against 14 µs for cuBLAS on the H100 (docs/perf.md, issue #30) — while a tensor-core GEMM's
//! cost barely moves between 1 and 64 rows.
//!
//! Why one algorithm: the lossless invariant of batched rounds is that a request's rows get the
//! same bits alone (8 rows, or 1 plain-decode row) as among 64 rows of other requests. A GEMM
//! kernel computes each output element from its own row of x and column of W, in an order fixed
//! by its tile shape, split-K and reduction — not by the other rows — so one kernel
//! configuration used at every M gives every row the same bits; cuBLAS's default heuristics
//! pick a different kernel per M, which would not. So each shape is planned once, at load
//! ([`RowGemm::plan`]), on the real weight and 64 random rows: the reference is the first of the
//! heuristic's candidates for [`PLAN_ROWS`] rows (a fixed row count, so every engine on the same
//! GPU and library makes the same choice whatever its batch size) whose rows have the same bits
//! run as 1, 8, 13 and 33 rows at several offsets and in a second run of all 64; its class is
//! every candidate (for any of [`BUCKETS`]' row counts) that passes the same checks with the
//! reference's bits. Calls of m rows then run the class member that was fastest at the first
//! bucket ≥ m — which member wins moves no bit. (Measured on the H100 with cuBLAS 13: every
//! candidate of every Qwen3-8B shape was row-exact on its own; `docs/perf.md`.) A shape with no
//! such candidate is an error at load, and the model keeps the matvec path.
//! `DSPARK_ROW_GEMM_LOG=1` prints each shape's class and times.

use super::ops::{check, WeightBuf};
use super::{CudaError, CudaResult, Gpu};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// The row count whose heuristic candidates a shape's algorithm is chosen from: the most rows
/// a batched round verifies (8 requests' full blocks).
pub const PLAN_ROWS: usize = 64;

/// Heuristic candidates asked for per row count.
const CANDIDATES: usize = 8;

/// Calls timed per candidate and row count when a shape is planned: 10 for a 4096 × 4096
/// matrix, fewer for larger ones (at least 2), so planning lm_head stays within ~0.3 s.
fn timed_calls(n: usize, k: usize) -> usize {
    (10 * 4096 * 4096 / (n * k).max(1)).clamp(2, 10)
}

/// Bytes of cuBLASLt workspace (NVIDIA's figure for GPUs before Hopper; GEMMs of at most a few
/// hundred rows need no more).
pub const WORKSPACE_BYTES: usize = 4 << 20;

/// The row counts a shape's algorithms are timed at: a call of m rows runs the one chosen for
/// the first bucket ≥ m.
pub const BUCKETS: [usize; 5] = [1, 8, 16, 32, PLAN_ROWS];

/// A planned shape: for each of [`BUCKETS`], the algorithm calls of that many rows run.
#[derive(Clone, Copy)]
struct Plan {
    algos: [lt::cublasLtMatmulAlgo_t; BUCKETS.len()],
}

/// The bucket a call of `m` rows takes: the first of [`BUCKETS`] ≥ m, the last past them.
fn bucket(m: usize) -> usize {
    BUCKETS.iter().position(|&b| m <= b).unwrap_or(BUCKETS.len() - 1)
}

impl Plan {
    fn for_rows(&self, m: usize) -> &lt::cublasLtMatmulAlgo_t {
        &self.algos[bucket(m)]
    }
}

/// (m, offset) runs each candidate is checked with against its 64-row run.
const CHECKS: [(usize, usize); 6] = [(1, 0), (1, 63), (8, 0), (8, 56), (13, 3), (33, 31)];

/// A cuBLASLt handle on the GPU's stream with its workspace and each planned shape's algorithm.
pub struct RowGemm {
    handle: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    workspace: CudaSlice<u8>,
    /// `(n, k)` → the shape's algorithms, the fastest at each of [`BUCKETS`]' row counts: all of
    /// one bit-identical class (module docs).
    plans: Mutex<HashMap<(usize, usize), Plan>>,
}

// SAFETY: the handle and descriptor are opaque cuBLASLt objects that cuBLASLt allows to be used
// from any thread; every call that uses them goes through `&self` on the GPU's one stream.
unsafe impl Send for RowGemm {}
unsafe impl Sync for RowGemm {}

impl Drop for RowGemm {
    fn drop(&mut self) {
        // SAFETY: both were created by `RowGemm::new` and are destroyed once.
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            lt::cublasLtDestroy(self.handle);
        }
    }
}

fn lt_ok(what: &str, status: lt::cublasStatus_t) -> CudaResult<()> {
    if status == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Shape(format!("{what} failed: {status:?}")))
    }
}

/// A column-major matrix layout, destroyed when dropped.
struct Layout(lt::cublasLtMatrixLayout_t);

impl Layout {
    fn new(dtype: lt::cudaDataType, rows: usize, cols: usize, ld: usize) -> CudaResult<Layout> {
        let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
        // SAFETY: `l` is an out-pointer cuBLASLt fills.
        lt_ok("cublasLtMatrixLayoutCreate", unsafe {
            lt::cublasLtMatrixLayoutCreate(&mut l, dtype, rows as u64, cols as u64, ld as i64)
        })?;
        Ok(Layout(l))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `Layout::new`.
        unsafe { lt::cublasLtMatrixLayoutDestroy(self.0) };
    }
}

/// Column-major views of one call: W as `k × n` (ld k), x as `k × m` (ld k), y as `n × m`
/// (ld n) — row-major `y = x · Wᵀ` as the `TN` product.
struct Layouts {
    w: Layout,
    x: Layout,
    y: Layout,
}

impl Layouts {
    fn new(m: usize, k: usize, n: usize) -> CudaResult<Layouts> {
        Ok(Layouts {
            w: Layout::new(lt::cudaDataType::CUDA_R_16BF, k, n, k)?,
            x: Layout::new(lt::cudaDataType::CUDA_R_16BF, k, m, k)?,
            y: Layout::new(lt::cudaDataType::CUDA_R_32F, n, m, n)?,
        })
    }
}

impl RowGemm {
    /// A handle on `gpu`'s stream, or why not: cuBLASLt missing or refusing.
    pub fn new(gpu: &Gpu) -> CudaResult<RowGemm> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { lt::is_culib_present() } {
            return Err(CudaError::Unavailable("cuBLASLt (libcublasLt) was not found".into()));
        }
        let workspace = gpu.stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        let mut handle: lt::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: out-pointer filled by cuBLASLt.
        lt_ok("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut handle) })?;
        let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
        // SAFETY: out-pointer filled by cuBLASLt; the attributes are u32 enums of the sizes given.
        unsafe {
            let made = lt::cublasLtMatmulDescCreate(
                &mut desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType::CUDA_R_32F,
            );
            if let Err(e) = lt_ok("cublasLtMatmulDescCreate", made) {
                lt::cublasLtDestroy(handle);
                return Err(e);
            }
            let set = |attr, op: cublasOperation_t| {
                lt::cublasLtMatmulDescSetAttribute(
                    desc,
                    attr,
                    &op as *const _ as *const c_void,
                    std::mem::size_of::<cublasOperation_t>(),
                )
            };
            use lt::cublasLtMatmulDescAttributes_t::{CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB};
            let ta = set(CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t::CUBLAS_OP_T);
            let tb = set(CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t::CUBLAS_OP_N);
            let rg = RowGemm { handle, desc, workspace, plans: Mutex::new(HashMap::new()) };
            lt_ok("cublasLtMatmulDescSetAttribute(TRANSA)", ta)?;
            lt_ok("cublasLtMatmulDescSetAttribute(TRANSB)", tb)?;
            Ok(rg)
        }
    }

    fn plans(&self) -> CudaResult<std::sync::MutexGuard<'_, HashMap<(usize, usize), Plan>>> {
        self.plans.lock().map_err(|_| CudaError::Shape("row GEMM plans poisoned".into()))
    }

    /// Whether shape `n × k` has its algorithm.
    pub fn planned(&self, n: usize, k: usize) -> bool {
        self.plans().map(|p| p.contains_key(&(n, k))).unwrap_or(false)
    }

    /// The heuristic's candidates for `rows` rows of shape `n × k`, best first.
    fn candidates(&self, rows: usize, n: usize, k: usize) -> CudaResult<Vec<lt::cublasLtMatmulAlgo_t>> {
        let lay = Layouts::new(rows, k, n)?;
        let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
        let ws = self.workspace.len();
        // SAFETY: out-pointers filled by cuBLASLt; the preference is destroyed before returning.
        unsafe {
            lt_ok("cublasLtMatmulPreferenceCreate", lt::cublasLtMatmulPreferenceCreate(&mut pref))?;
            let set = lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            );
            let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); CANDIDATES];
            let mut got = 0i32;
            let heur = lt::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.desc,
                lay.w.0,
                lay.x.0,
                lay.y.0,
                lay.y.0,
                pref,
                CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut got,
            );
            lt::cublasLtMatmulPreferenceDestroy(pref);
            lt_ok("cublasLtMatmulPreferenceSetAttribute", set)?;
            lt_ok("cublasLtMatmulAlgoGetHeuristic", heur)?;
            Ok(results.into_iter().take(got.max(0) as usize).map(|r| r.algo).collect())
        }
    }

    /// One call: `y = x · Wᵀ` (+ y when `beta` is 1) for `m` rows at device addresses.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        gpu: &Gpu,
        algo: &lt::cublasLtMatmulAlgo_t,
        (w, x, y): (u64, u64, u64),
        (m, k, n): (usize, usize, usize),
        beta: f32,
    ) -> CudaResult<()> {
        let lay = Layouts::new(m, k, n)?;
        let alpha = 1f32;
        let (ws, _g) = self.workspace.device_ptr(&gpu.stream);
        // SAFETY: the caller checked W holds n × k bf16 values, x m × k and y m × n f32 at these
        // addresses; C and D are the same buffer, which cuBLASLt allows with one layout; alpha
        // and beta are host f32 scalars as the f32 scale type and the default pointer mode ask.
        let status = unsafe {
            lt::cublasLtMatmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                lay.w.0,
                x as *const c_void,
                lay.x.0,
                &beta as *const f32 as *const c_void,
                y as *const c_void,
                lay.y.0,
                y as *mut c_void,
                lay.y.0,
                algo,
                ws as *mut c_void,
                self.workspace.len(),
                gpu.stream.cu_stream() as _,
            )
        };
        lt_ok("cublasLtMatmul", status)
    }

    /// Chooses shape `n × k`'s algorithm on the bf16 weight `w` (module docs): the first of the
    /// heuristic's candidates whose rows have the same bits at every row count checked. Does
    /// nothing for a planned shape. Allocates its test rows on the stream (at load, once per
    /// shape).
    pub fn plan(&self, gpu: &Gpu, w: &WeightBuf, k: usize, n: usize) -> CudaResult<()> {
        if self.planned(n, k) {
            return Ok(());
        }
        let WeightBuf::Bf16(ws) = w else {
            return Err(CudaError::Shape("row GEMM: only bf16 weights are planned".into()));
        };
        check("row GEMM plan w", ws.len(), n * k)?;
        // Test rows: a fixed xorshift stream of values in [-1, 1), as bf16 bits.
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ ((n as u64) << 20) ^ k as u64;
        let x_host: Vec<u16> = (0..PLAN_ROWS * k)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                (v.to_bits() >> 16) as u16
            })
            .collect();
        let x = gpu.stream.clone_htod(&x_host)?;
        let mut y = gpu.stream.alloc_zeros::<f32>(PLAN_ROWS * n)?;
        let wp = ws.device_ptr(&gpu.stream).0;
        let xp = x.device_ptr(&gpu.stream).0;
        let yp = y.device_ptr_mut(&gpu.stream).0;
        let rows_at = |m: usize, off: usize| (wp, xp + (off * k * 2) as u64, yp + (off * n * 4) as u64, m);
        // The class: the first of the heuristic's 64-row candidates whose rows pass the checks,
        // then every candidate for any bucket's row count with the same bits at every check.
        let mut pool: Vec<lt::cublasLtMatmulAlgo_t> = Vec::new();
        for rows in std::iter::once(PLAN_ROWS).chain(BUCKETS) {
            for algo in self.candidates(rows, n, k)? {
                if !pool.iter().any(|a| a.data == algo.data) {
                    pool.push(algo);
                }
            }
        }
        let bits = |y: &CudaSlice<f32>| -> CudaResult<Vec<u32>> {
            Ok(gpu.stream.clone_dtoh(y)?.iter().map(|v| v.to_bits()).collect())
        };
        let mut reference: Option<Vec<u32>> = None;
        let mut class = Vec::new();
        for algo in &pool {
            let run = |(w, x, y, m): (u64, u64, u64, usize)| self.call(gpu, algo, (w, x, y), (m, k, n), 0.0);
            gpu.stream.memset_zeros(&mut y)?;
            if run(rows_at(PLAN_ROWS, 0)).is_err() {
                continue;
            }
            let all = bits(&y)?;
            if reference.as_ref().is_some_and(|r| *r != all) {
                continue;
            }
            let mut exact = run(rows_at(PLAN_ROWS, 0)).is_ok() && bits(&y)? == all;
            for (m, off) in CHECKS {
                if !exact {
                    break;
                }
                gpu.stream.memset_zeros(&mut y)?;
                exact = run(rows_at(m, off)).is_ok() && {
                    let got = bits(&y)?;
                    let r = off * n..(off + m) * n;
                    got[r.clone()] == all[r]
                };
            }
            if exact {
                reference.get_or_insert(all);
                class.push(*algo);
            }
        }
        if class.is_empty() {
            return Err(CudaError::Shape(format!(
                "row GEMM: none of cuBLASLt's {} algorithms for {n} × {k} gives each row the same bits at every row count",
                pool.len()
            )));
        }
        // The fastest of the class at each bucket's row count (which one wins changes no bit).
        let mut algos = [class[0]; BUCKETS.len()];
        let mut report = Vec::new();
        for (b, &m) in BUCKETS.iter().enumerate() {
            let mut best = f64::INFINITY;
            for algo in &class {
                let run = || self.call(gpu, algo, (wp, xp, yp), (m, k, n), 0.0);
                run()?;
                gpu.stream.synchronize()?;
                let t = std::time::Instant::now();
                let calls = timed_calls(n, k);
                for _ in 0..calls {
                    run()?;
                }
                gpu.stream.synchronize()?;
                let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
                if us < best {
                    best = us;
                    algos[b] = *algo;
                }
            }
            report.push(format!("{m}: {best:.1} µs"));
        }
        if std::env::var_os("DSPARK_ROW_GEMM_LOG").is_some() {
            eprintln!(
                "row GEMM {n} × {k}: {} candidates, {} in the class; {}",
                pool.len(),
                class.len(),
                report.join(", ")
            );
        }
        self.plans()?.insert((n, k), Plan { algos });
        Ok(())
    }
}

impl Gpu {
    /// `y[m, n] = x[m, k] · W[n, k]ᵀ`, or `y += …` when `accumulate`, on the shape's planned
    /// algorithm ([`RowGemm::plan`]); `x` bf16 rows, `w` a bf16 matrix.
    pub fn row_gemm_bf16(
        &self,
        rg: &RowGemm,
        w: &WeightBuf,
        x: &CudaView<u16>,
        y: &mut CudaViewMut<f32>,
        (m, k, n): (usize, usize, usize),
        accumulate: bool,
    ) -> CudaResult<()> {
        let WeightBuf::Bf16(ws) = w else {
            return Err(CudaError::Shape(format!("row GEMM: {} weights (bf16 only)", w.suffix())));
        };
        check("row GEMM w", ws.len(), n * k)?;
        check("row GEMM x", x.len(), m * k)?;
        check("row GEMM y", y.len(), m * n)?;
        if m == 0 {
            return Ok(());
        }
        let algo = *rg
            .plans()?
            .get(&(n, k))
            .ok_or_else(|| CudaError::Shape(format!("row GEMM: shape {n} × {k} was not planned at load")))?
            .for_rows(m);
        let wp = ws.device_ptr(&self.stream).0;
        let xp = x.device_ptr(&self.stream).0;
        let yp = y.device_ptr_mut(&self.stream).0;
        let beta = if accumulate { 1f32 } else { 0f32 };
        self.timed("row_gemm_bf16", None, || rg.call(self, &algo, (wp, xp, yp), (m, k, n), beta))
    }
}

#[cfg(test)]
mod tests {
    use super::{bucket, timed_calls, BUCKETS};

    #[test]
    fn a_call_takes_the_first_bucket_at_least_its_rows() {
        for m in 0..=100 {
            let b = bucket(m);
            let want = match m {
                0 | 1 => 0,
                2..=8 => 1,
                9..=16 => 2,
                17..=32 => 3,
                _ => 4,
            };
            assert_eq!(b, want, "{m} rows");
            assert!(m > BUCKETS[BUCKETS.len() - 1] || m <= BUCKETS[b]);
        }
    }

    #[test]
    fn planning_times_fewer_calls_on_larger_matrices() {
        assert_eq!(timed_calls(4096, 4096), 10);
        assert_eq!(timed_calls(151_936, 4096), 2);
        assert_eq!(timed_calls(24_576, 4096), 2);
        assert_eq!(timed_calls(96, 256), 10);
        assert_eq!(timed_calls(0, 0), 10);
    }
}
