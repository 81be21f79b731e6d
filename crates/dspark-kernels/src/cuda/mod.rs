//! CUDA side of the op families: device discovery, PTX loading, and typed launch wrappers.
//!
//! Kernels are CUDA C in `kernels/*.cu`, compiled ahead of time by `cargo xtask ptx` to PTX
//! that is committed under `crates/dspark-kernels/ptx/` (one xz stream per source and target:
//! `sm_90` for Hopper, `sm_80` as the portable fallback that the driver JIT-compiles on any
//! newer GPU, and `sm_89` of the FP8 modules for Ada: [`PtxTarget`]). The binary embeds the compressed PTX, inflates it once per process
//! ([`ptx_text`]), and needs only the NVIDIA driver at run time: cudarc
//! loads libcuda dynamically, so a machine without a GPU still runs the CPU path.
//!
//! Every wrapper checks buffer lengths against the shape it is given before launching, so a
//! shape bug is an error on the host rather than an out-of-bounds access on the device.

mod argmax;
mod attention_prefill;
pub mod attention_seg;
pub mod attention_split;
pub mod gemm;
pub mod host_table;
pub mod kv;
pub mod kv_layers;
mod markov;
mod matvec;
mod matvec_pick;
mod matvec_split;
pub mod norm_fold;
pub mod ops;
mod pdl;
pub mod ptx;
pub mod rope_fold;
pub mod row_gemm;
pub mod sample;
pub mod tp;
pub mod trace;

use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DriverError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Errors of the CUDA layer.
#[derive(Debug)]
pub enum CudaError {
    /// No usable NVIDIA driver or device on this machine.
    Unavailable(String),
    Driver(DriverError),
    /// A wrapper refused its arguments before launching.
    Shape(String),
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaError::Unavailable(m) => write!(f, "CUDA is not available: {m}"),
            CudaError::Driver(e) => write!(f, "CUDA driver error: {e:?}"),
            CudaError::Shape(m) => write!(f, "kernel argument check failed: {m}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        CudaError::Driver(e)
    }
}

pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// Whether a CUDA driver with at least one device is present. Checked before any cudarc call
/// that would panic when libcuda is missing.
pub fn available() -> bool {
    // SAFETY: only probes whether the driver library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return false;
    }
    matches!(CudaContext::device_count(), Ok(n) if n > 0)
}

/// Kernels launched without PDL (`DSPARK_NO_PDL_FOR` replaces the list; empty: none; names are
/// matched by containment). Measured by turning PDL off for one kernel at a time (docs/perf.md):
/// it helps every other launch, but letting the split-attention combine or the SwiGLU matvec
/// start early cost the 8-row verify 2–5% (either alone, not additive) while decode gained
/// nothing from it. Measured again since (git history of docs/perf.md): the combine on PDL
/// gains decode 0.7% at 512 keys (±0 at 4096) and moves the verify by −0.3% to +0.8%, so only
/// the decode's combine, `attention_combine_q1_f32` (not on the list), launches with PDL. The
/// FP8 SwiGLU matvec follows its bf16 twin (not measured separately).
/// The segmented combine (`attention_seg.rs`) follows the tensor-core kernel's, as its twin does,
/// and the one-row FP8 SwiGLU that splits its own x (`_n1x`) its two-launch twin, and the bf16
/// SwiGLU on bf16-rounded x (`_x1`) its three-part twin.
const NO_PDL: [&str; 8] = [
    "attention_combine_f32",
    "attention_combine_seg_f32",
    "matvec_tc_swiglu_bf16",
    "matvec_tc_swiglu_x1_bf16",
    "matvec_tc_swiglu_fp8",
    "matvec_tc_swiglu_n1_fp8",
    "matvec_tc_swiglu_n1x_fp8",
    "matvec_tc_swiglu_a8",
];

/// One GPU: its context, the stream every op runs on, and the loaded kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    modules: Vec<Arc<CudaModule>>,
    /// Each loaded kernel with whether it launches with PDL (decided once, at load).
    functions: HashMap<&'static str, (CudaFunction, bool)>,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors: the matvec kernels are picked so their grid fits one wave.
    pub sms: usize,
    /// Whether kernels that support it launch with programmatic dependent launch (sm_90+;
    /// `DSPARK_NO_PDL=1` turns it off for A/B runs).
    pub pdl: bool,
    /// Whether a step's norm + RoPE + append runs inside its attention launch where the split
    /// kernels can take it (`rope_fold.rs`; `DSPARK_NO_ROPE_FOLD=1` turns it off for A/B runs).
    pub rope_fold: bool,
    /// Whether launches of more than 8 rows take the wide bf16 kernels, 16 or 32 rows a launch
    /// on one weight read (`matvec_pick.rs` `wide_twin`; `DSPARK_NO_WIDE=1` turns it off for A/B runs).
    pub wide: bool,
    /// The activations' precision in the bf16 tensor-core matvecs (`--activations`; bf16: the
    /// one-part `_x1` kernels, `matvec_pick.rs` `x1_twin`). Set before the models load.
    pub activations: crate::Activations,
    /// Whether, with bf16 activations, a norm-producing matvec stores its output as bf16 rows
    /// for a bf16 tensor-core consumer (`norm_fold.rs`; the `_x1h` kernels: half the bytes of
    /// x, the same bits; `DSPARK_NO_BF16_ROWS=1` keeps f32 rows for A/B runs).
    pub x_bf16_rows: bool,
    /// Whether, with bf16 activations, launches of 33–64 rows take the kernels that stage
    /// x once per block of 8 tiles (`matvec_split.rs` `split_twin`, kernels/matvec_split.cu; the same
    /// bits; `DSPARK_NO_WIDE_SPLIT=1` keeps matvec.cu's wide kernels for A/B runs). They need
    /// thread-block clusters (the sm_90 PTX).
    pub wide_split: bool,
    /// Whether a split twin is taken whatever its grid (tests: small shapes on the split
    /// kernels), not only where the grid covers the SMs.
    pub split_any_grid: bool,
    /// Whether the sm_90 PTX is loaded: thread-block clusters, which the split kernels need.
    pub(crate) clusters: bool,
    /// Whether the bf16-activation mode's tensor-core attention takes its one-MMA kernels
    /// (`attention_tc1_*`: Q, P and f32 caches rounded to TF32; `DSPARK_ATTN_3XTF32=1` keeps the
    /// f32 mode's 3xTF32 kernels for A/B runs).
    pub attention_1xtf32: bool,
    /// Whether launches of 17–32 rows take split twins too, as those of 33–64 do
    /// (`DSPARK_NO_SPLIT_32=1` keeps matvec.cu's wide kernels there for A/B runs).
    pub split_rows32: bool,
    /// Whether a batched step's sequences attend in one launch per kernel
    /// (`attention_seg.rs`; `DSPARK_NO_SEGMENTED=1` launches them one by one for A/B runs).
    pub segmented: bool,
    /// Whether a one-row step (decode) attends on the tensor-core kernel that verify steps use,
    /// without the folded RoPE, so that a row's attention is the same bits in every step that
    /// holds it (`ops.rs` `split_plan`; `DSPARK_ROW_EXACT=1` for A/B runs).
    pub row_exact: bool,
    /// With bf16 activations, the cuBLASLt handle whose planned GEMMs run the layers' bf16
    /// projections at every row count (`row_gemm.rs`; `DSPARK_NO_ROW_GEMM=1` keeps the matvec
    /// kernels for A/B runs). Made by [`Gpu::set_activations`]; `None` in the f32 mode, or when
    /// cuBLASLt is missing (the matvec kernels then run the mode).
    pub row_gemm: Option<Arc<row_gemm::RowGemm>>,
    /// Whether a one-row FP8 matvec splits its x itself, in shared memory, instead of after a
    /// `split_x_f16x2` launch (`matvec_pick.rs` `fp8_n1x_twin`; the same bits;
    /// `DSPARK_NO_FP8_SPLIT_IN_BLOCK=1` keeps the two launches for A/B runs).
    pub fp8_split_in_block: bool,
    /// Launches of two or more rows split x one block a row, the row's loads all in flight at
    /// once (`split_x_f16x2_row`, fp8.cu; the same bits as `split_x_f16x2`, which
    /// `DSPARK_NO_SPLIT_ROW=1` keeps for A/B runs, as rows too wide for the one block do).
    pub fp8_split_row: bool,
    /// FP8 projections take x quantized to E4M3 per row and 128-wide group, as Qwen and vLLM run
    /// FP8 checkpoints, on E4M3 MMAs (fp8.cuh): `--activations e4m3` ([`Gpu::set_activations`]),
    /// or `DSPARK_FP8_A8=1` for A/B runs. Not the CPU reference's arithmetic: a row's bits still
    /// do not depend on its launch. Taken only where the PTX has the E4M3 MMA
    /// ([`PtxTarget::e4m3_mma`]): the sm_80 build's E4M3 kernels trap, so there the flag leaves
    /// the W8A16 kernels in place.
    pub fp8_a8: bool,
    /// The build of the kernels this GPU loaded.
    pub ptx: PtxTarget,
    /// The dynamic shared memory each `_n1x` FP8 kernel may take with its blocks per SM still
    /// resident (0: none; measured at load by the driver's occupancy calculator).
    xsm_limits: HashMap<&'static str, usize>,
    profiling: AtomicBool,
    /// (kernel name, start, end) of every launch while profiling is on.
    profile: Mutex<Vec<(String, CudaEvent, CudaEvent)>>,
    /// Events made ahead of time, so a profiled launch costs the host two records, not two
    /// event creations (a host slower than the GPU would show up as kernel time).
    event_pool: Mutex<Vec<CudaEvent>>,
    /// The trace's launch log and ring (`dspark bench --trace`, trace.rs).
    trace: Mutex<trace::TraceState>,
    /// Whether launches go to the trace's log: read without the lock on every launch (an eager
    /// step makes ~300), so an untraced step pays one relaxed load a launch.
    trace_logging: AtomicBool,
}

/// Which build of the kernels a GPU loads (`cargo xtask ptx` makes each from `kernels/*.cu`).
/// Hopper and newer take `sm_90` (PDL, thread-block clusters, the split kernels of batched
/// rounds); Ada (8.9) takes `sm_89` for the modules that include `fp8.cuh` — E4M3 widened by one
/// `cvt` a pair where sm_80 places bits and multiplies, and the E4M3 MMA that
/// `--activations e4m3` runs on — and `sm_80` for every other module, as Ampere does for all.
/// `DSPARK_PTX=sm80|sm89` takes an older build on a newer GPU, so the GPU tier tests each one on
/// the GPU at hand; the driver JIT-compiles PTX for any newer architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PtxTarget {
    Sm80,
    Sm89,
    Sm90,
}

impl PtxTarget {
    /// The build a GPU of compute capability `(major, minor)` takes, or the one `DSPARK_PTX` asks
    /// for (`env`): a build newer than the GPU, or a name that is none of the three, is an error.
    pub fn pick((major, minor): (i32, i32), env: Option<&str>) -> CudaResult<PtxTarget> {
        let native = if major >= 9 {
            PtxTarget::Sm90
        } else if (major, minor) >= (8, 9) {
            PtxTarget::Sm89
        } else {
            PtxTarget::Sm80
        };
        let Some(v) = env else { return Ok(native) };
        let asked = match v {
            "sm80" => PtxTarget::Sm80,
            "sm89" => PtxTarget::Sm89,
            "sm90" => PtxTarget::Sm90,
            _ => return Err(CudaError::Unavailable(format!("DSPARK_PTX={v}: expected sm80, sm89 or sm90"))),
        };
        if asked > native {
            return Err(CudaError::Unavailable(format!(
                "DSPARK_PTX={v}: the {} build needs a newer GPU than this one (compute capability {major}.{minor})",
                asked.name()
            )));
        }
        Ok(asked)
    }

    /// `sm_80`, `sm_89` or `sm_90`.
    pub fn name(self) -> &'static str {
        match self {
            PtxTarget::Sm80 => "sm_80",
            PtxTarget::Sm89 => "sm_89",
            PtxTarget::Sm90 => "sm_90",
        }
    }

    /// Whether its FP8 kernels have the E4M3 MMA (`--activations e4m3`); the sm_80 build's trap.
    pub fn e4m3_mma(self) -> bool {
        self >= PtxTarget::Sm89
    }

    /// Module `m`'s xz-compressed PTX in this build (Ada's falls back to sm_80 where the module
    /// has no sm_89 build).
    fn packed(self, m: &ptx::PtxModule) -> &'static [u8] {
        match self {
            PtxTarget::Sm80 => m.sm80,
            PtxTarget::Sm89 => m.sm89.unwrap_or(m.sm80),
            PtxTarget::Sm90 => m.sm90,
        }
    }
}

/// Every module's PTX in `target`'s build, inflated from the committed xz streams once per
/// process (a few tens of ms; every later `Gpu::new` reuses it), in [`ptx::MODULES`]' order.
pub fn ptx_text(target: PtxTarget) -> CudaResult<&'static [String]> {
    static TEXT: [OnceLock<Vec<String>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let cell = &TEXT[target as usize];
    if let Some(t) = cell.get() {
        return Ok(t);
    }
    let mut text = Vec::with_capacity(ptx::MODULES.len());
    for m in ptx::MODULES {
        text.push(inflate(target.packed(m)).map_err(|e| {
            CudaError::Unavailable(format!("the {} PTX of module {} does not inflate: {e}", target.name(), m.name))
        })?);
    }
    Ok(cell.get_or_init(|| text))
}

/// Module `name`'s PTX for `target` from a `DSPARK_PTX_DIR` folder: `<dir>/<name>.sm90.ptx` (the
/// suffix as `cargo xtask ptx` names the builds); a missing or unreadable file is an error naming it.
fn ptx_from_dir(dir: &std::path::Path, name: &str, target: PtxTarget) -> CudaResult<String> {
    let path = dir.join(format!("{name}.{}.ptx", target.name().replace('_', "")));
    std::fs::read_to_string(&path).map_err(|e| {
        CudaError::Unavailable(format!(
            "DSPARK_PTX_DIR: cannot read {} ({e}); `cargo xtask ptx --trace` writes the sm_90 trace build",
            path.display()
        ))
    })
}

/// One xz stream as UTF-8 text.
pub fn inflate(packed: &[u8]) -> Result<String, String> {
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut std::io::Cursor::new(packed), &mut out).map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// The dynamic shared memory a kernel may take while `blocks` of its 256-thread blocks stay
/// resident on an SM, within the per-block opt-in limit `optin` less its static shared memory;
/// its launch limit is raised to that (above 48 KB a kernel must ask for it).
fn xsm_limit(f: &CudaFunction, blocks: u32, optin: usize) -> CudaResult<usize> {
    use cudarc::driver::sys::CUfunction_attribute as A;
    let fixed = f.get_attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?.max(0) as usize;
    let most = optin.saturating_sub(fixed);
    f.set_attribute(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, most as i32)?;
    Ok(f.occupancy_available_dynamic_smem_per_block(blocks, 32 * matvec_pick::TC_WARPS as u32)?.min(most))
}

/// The shared-memory carveout (percent) the one-row FP8 matvecs that split x in their blocks
/// (`_n1x`) ask for: on an SM of 228 KB (sm_90), 71% — the 164 KB configuration the decode
/// attention launches between them runs in, where the driver would give them 132 KB (their
/// 3 × 26 or 2 × 58 KB). Measured on an H100 (docs/perf.md): FP8 decode −0.5 to −1.3%, the verify
/// unchanged; the multi-row FP8 kernels asking for it too lost 3% of the verify (their x comes
/// through L1). Other SM sizes keep the driver's choice (`None`), as does
/// `DSPARK_NO_N1X_CARVEOUT=1` for A/B runs.
fn n1x_carveout(ctx: &CudaContext) -> CudaResult<Option<i32>> {
    const SM90_SMEM: i32 = 228 * 1024;
    const ATTENTION_CONFIG: i32 = 164 * 1024;
    let per_sm = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
    if per_sm != SM90_SMEM || std::env::var_os("DSPARK_NO_N1X_CARVEOUT").is_some() {
        return Ok(None);
    }
    Ok(Some(carveout_percent(ATTENTION_CONFIG, SM90_SMEM)))
}

/// The carveout percentage that lands on shared-memory configuration `config` of an SM of
/// `per_sm` bytes: the driver rounds the percentage's bytes up to a configuration, so the
/// percentage is rounded down (164 KB of 228: 71%, 165,765 bytes → 164 KB).
fn carveout_percent(config: i32, per_sm: i32) -> i32 {
    config * 100 / per_sm
}

/// Total time and launch count of one kernel name in a profile.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub name: String,
    pub launches: usize,
    pub micros: f64,
}

impl Gpu {
    /// Whether a row's attention must be the same bits in every step that holds it: asked for
    /// (`row_exact`), or implied by bf16 activations, whose rounding of x would turn the decode
    /// kernel's ~2⁻²² difference from the verify kernel's into a whole bf16 step — and by E4M3
    /// activations (`fp8_a8`) for the same reason.
    pub fn rows_exact(&self) -> bool {
        self.row_exact || self.activations == crate::Activations::Bf16 || self.fp8_a8
    }

    /// The tensor-core attention's kernel prefix: `attention_tc1` (one TF32 MMA a product) with
    /// bf16 activations and `attention_1xtf32`, else `attention_tc` (3xTF32).
    pub(crate) fn attention_tc_prefix(&self) -> &'static str {
        if self.attention_1xtf32 && self.activations == crate::Activations::Bf16 {
            "attention_tc1"
        } else {
            "attention_tc"
        }
    }

    /// Opens device `ordinal`, loads every kernel module, and creates the op stream.
    pub fn new(ordinal: usize) -> CudaResult<Gpu> {
        if !available() {
            return Err(CudaError::Unavailable("no NVIDIA driver (libcuda) or no device found".into()));
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream, no cross-stream events: the loop is single-stream and will be captured
        // into graphs, which event tracking would break.
        // SAFETY: every buffer is used on the one stream created below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let major =
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        if major < 8 {
            return Err(CudaError::Unavailable(format!(
                "compute capability {major}.{minor}; dspark needs 8.0 or newer"
            )));
        }
        // `DSPARK_PTX=sm80|sm89` loads an older build on a newer GPU (its FP8 widening and other
        // pre-Hopper paths, tested on the GPU at hand); those builds have no PDL wait, so no PDL
        // either.
        let ptx_env = std::env::var("DSPARK_PTX").ok();
        let target = PtxTarget::pick((major, minor), ptx_env.as_deref())?;
        let sm90 = target == PtxTarget::Sm90;
        let pdl = sm90 && std::env::var_os("DSPARK_NO_PDL").is_none();
        let no_pdl_for: Vec<String> = match std::env::var("DSPARK_NO_PDL_FOR") {
            Ok(v) => v.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
            Err(_) => NO_PDL.iter().map(|s| s.to_string()).collect(),
        };
        let mut modules = Vec::new();
        let mut functions = HashMap::new();
        let mut xsm_limits = HashMap::new();
        let optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            .max(0) as usize;
        let n1x_carveout = n1x_carveout(&ctx)?;
        // `DSPARK_PTX_DIR` (a developer's override): the modules' PTX from that folder instead of
        // the committed build, e.g. the trace build (`cargo xtask ptx --trace`, trace.rs).
        let ptx_dir = std::env::var_os("DSPARK_PTX_DIR").map(std::path::PathBuf::from);
        let from_dir: Vec<String> = match &ptx_dir {
            Some(dir) => ptx::MODULES.iter().map(|m| ptx_from_dir(dir, m.name, target)).collect::<CudaResult<_>>()?,
            None => Vec::new(),
        };
        let sources = if ptx_dir.is_some() { &from_dir[..] } else { ptx_text(target)? };
        for (m, src) in ptx::MODULES.iter().zip(sources) {
            let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(src.as_str())).map_err(|e| match &ptx_dir {
                Some(dir) => CudaError::Unavailable(format!(
                    "DSPARK_PTX_DIR={}: module {} does not load: {e}",
                    dir.display(),
                    m.name
                )),
                None => e.into(),
            })?;
            for &name in m.functions {
                let f = module.load_function(name)?;
                if let Some(bytes) = ops::dynamic_smem(name) {
                    // Kernels that need more than the default 48 KB of dynamic shared memory.
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )?;
                }
                if let Some(minb) = matvec_pick::n1x_blocks_per_sm(name) {
                    // A driver that refuses the query or the limit costs the in-block split, not
                    // the GPU: those launches then take the split launch (limit 0).
                    xsm_limits.insert(name, xsm_limit(&f, minb, optin).unwrap_or(0));
                    if let Some(pct) = n1x_carveout {
                        // A refused hint costs the measured 0.5–1%, not the GPU.
                        let _ = f.set_attribute(
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                            pct,
                        );
                    }
                }
                functions.insert(name, (f, pdl && !no_pdl_for.iter().any(|s| name.contains(s.as_str()))));
            }
            modules.push(module);
        }
        Ok(Gpu {
            ctx,
            stream,
            modules,
            functions,
            compute_capability: (major, minor),
            sms: sms.max(1) as usize,
            pdl,
            rope_fold: std::env::var_os("DSPARK_NO_ROPE_FOLD").is_none(),
            wide: std::env::var_os("DSPARK_NO_WIDE").is_none(),
            activations: crate::Activations::F32,
            x_bf16_rows: std::env::var_os("DSPARK_NO_BF16_ROWS").is_none(),
            wide_split: std::env::var_os("DSPARK_NO_WIDE_SPLIT").is_none(),
            split_any_grid: false,
            clusters: sm90,
            split_rows32: std::env::var_os("DSPARK_NO_SPLIT_32").is_none(),
            attention_1xtf32: std::env::var_os("DSPARK_ATTN_3XTF32").is_none(),
            segmented: std::env::var_os("DSPARK_NO_SEGMENTED").is_none(),
            row_exact: std::env::var_os("DSPARK_ROW_EXACT").is_some(),
            fp8_split_in_block: std::env::var_os("DSPARK_NO_FP8_SPLIT_IN_BLOCK").is_none(),
            fp8_split_row: std::env::var_os("DSPARK_NO_SPLIT_ROW").is_none(),
            fp8_a8: std::env::var_os("DSPARK_FP8_A8").is_some(),
            ptx: target,
            row_gemm: None,
            xsm_limits,
            profiling: AtomicBool::new(false),
            profile: Mutex::new(Vec::new()),
            event_pool: Mutex::new(Vec::new()),
            trace: Mutex::new(trace::TraceState::default()),
            trace_logging: AtomicBool::new(false),
        })
    }

    /// Sets the activations' precision in the bf16 tensor-core matvecs, before the models load.
    /// With bf16 activations the row GEMMs' handle is made here (`row_gemm.rs`), unless
    /// `DSPARK_NO_ROW_GEMM` is set; a machine without cuBLASLt runs the mode on the matvec
    /// kernels, and says so on stderr.
    pub fn set_activations(&mut self, activations: crate::Activations) -> CudaResult<()> {
        if activations == crate::Activations::E4m3 && !self.ptx.e4m3_mma() {
            let (a, b) = self.compute_capability;
            return Err(CudaError::Shape(format!(
                "--activations e4m3 needs the E4M3 MMA of the sm_89 or sm_90 kernels (Ada, Hopper or newer, without DSPARK_PTX=sm80); this GPU is sm_{a}{b} and runs the {} kernels",
                self.ptx.name()
            )));
        }
        self.activations = activations;
        self.fp8_a8 = activations == crate::Activations::E4m3 || std::env::var_os("DSPARK_FP8_A8").is_some();
        self.row_gemm = None;
        if activations == crate::Activations::Bf16 && std::env::var_os("DSPARK_NO_ROW_GEMM").is_none() {
            match row_gemm::RowGemm::new(self) {
                Ok(rg) => self.row_gemm = Some(Arc::new(rg)),
                Err(e) => eprintln!("warning: --activations bf16 runs on the matvec kernels: {e}"),
            }
        }
        Ok(())
    }

    /// The dynamic shared memory `_n1x` kernel `name` may take (0 for any other name).
    pub(crate) fn xsm_limit(&self, name: &str) -> usize {
        self.xsm_limits.get(name).copied().unwrap_or(0)
    }

    /// Turns per-launch timing on or off. While on, every op wrapper records a CUDA event
    /// before and after its launch (this serialises nothing but adds two event records per
    /// launch, so profiles are taken in separate runs from the timed ones).
    pub fn set_profiling(&self, on: bool) -> CudaResult<()> {
        if on {
            let mut pool = self.event_pool.lock().map_err(|_| CudaError::Shape("event pool poisoned".into()))?;
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            while pool.len() < 4096 {
                pool.push(self.ctx.new_event(flags)?);
            }
        }
        self.profiling.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether launches are being bracketed with events (CUDA graphs are not captured then).
    pub fn is_profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// Runs `launch` and, while profiling, brackets it with events under `name`.
    /// `shape` (blocks, threads a block) goes to the trace's launch log (trace.rs); cuBLAS calls
    /// pass `None`.
    pub(crate) fn timed(
        &self,
        name: &str,
        shape: Option<(u32, u32)>,
        launch: impl FnOnce() -> CudaResult<()>,
    ) -> CudaResult<()> {
        self.log_launch(name, shape);
        if !self.profiling.load(Ordering::Relaxed) {
            return launch();
        }
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = {
            let mut pool = self.event_pool.lock().map_err(|_| CudaError::Shape("event pool poisoned".into()))?;
            (pool.pop(), pool.pop())
        };
        let start = match start {
            Some(e) => e,
            None => self.ctx.new_event(flags)?,
        };
        let end = match end {
            Some(e) => e,
            None => self.ctx.new_event(flags)?,
        };
        start.record(&self.stream)?;
        launch()?;
        end.record(&self.stream)?;
        if let Ok(mut p) = self.profile.lock() {
            p.push((name.to_string(), start, end));
        }
        Ok(())
    }

    /// Drains the recorded launches into per-kernel totals, largest first (synchronises).
    pub fn take_profile(&self) -> CudaResult<Vec<KernelTime>> {
        let records = match self.profile.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => Vec::new(),
        };
        let mut totals: Vec<KernelTime> = Vec::new();
        let mut used = Vec::with_capacity(2 * records.len());
        for (name, start, end) in records {
            let us = start.elapsed_ms(&end)? as f64 * 1e3;
            used.push(start);
            used.push(end);
            match totals.iter_mut().find(|t| t.name == name) {
                Some(t) => {
                    t.launches += 1;
                    t.micros += us;
                }
                None => totals.push(KernelTime { name, launches: 1, micros: us }),
            }
        }
        if let Ok(mut pool) = self.event_pool.lock() {
            pool.extend(used);
        }
        totals.sort_by(|a, b| b.micros.total_cmp(&a.micros));
        Ok(totals)
    }

    /// A loaded kernel by name.
    pub fn function(&self, name: &str) -> CudaResult<&CudaFunction> {
        self.kernel(name).map(|(f, _)| f)
    }

    /// A loaded kernel and whether it launches with PDL: on sm_90+, unless `DSPARK_NO_PDL` is set
    /// or its name contains a part of the no-PDL list (`NO_PDL`, or instead the comma-separated
    /// `DSPARK_NO_PDL_FOR`; an empty one: none — for A/B runs of which boundaries PDL helps).
    pub(crate) fn kernel(&self, name: &str) -> CudaResult<(&CudaFunction, bool)> {
        match self.functions.get(name) {
            Some((f, pdl)) => Ok((f, *pdl)),
            None => Err(CudaError::Shape(format!("kernel `{name}` is not in the loaded PTX"))),
        }
    }

    /// Number of loaded modules (for `dspark info`-style reports).
    pub fn module_count(&self) -> usize {
        self.modules.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{carveout_percent, PtxTarget};

    /// Each GPU generation takes its own build, `DSPARK_PTX` only an older one, and a name that
    /// is no build is refused by name.
    #[test]
    fn ptx_targets_follow_the_compute_capability() {
        use PtxTarget::*;
        for (cc, native) in [((8, 0), Sm80), ((8, 6), Sm80), ((8, 9), Sm89), ((9, 0), Sm90), ((12, 0), Sm90)] {
            assert_eq!(PtxTarget::pick(cc, None).unwrap(), native, "{cc:?}");
            for (env, t) in [("sm80", Sm80), ("sm89", Sm89), ("sm90", Sm90)] {
                let got = PtxTarget::pick(cc, Some(env));
                if t <= native {
                    assert_eq!(got.unwrap(), t, "{cc:?} {env}");
                } else {
                    let e = got.unwrap_err().to_string();
                    assert!(e.contains(&format!("DSPARK_PTX={env}")) && e.contains(t.name()), "{e}");
                }
            }
        }
        let e = PtxTarget::pick((9, 0), Some("sm_90a")).unwrap_err().to_string();
        assert!(e.contains("DSPARK_PTX=sm_90a") && e.contains("sm80, sm89 or sm90"), "{e}");
        assert!(!Sm80.e4m3_mma() && Sm89.e4m3_mma() && Sm90.e4m3_mma());
    }

    /// The n1x carveout's percentage must round up to the attention's 164 KB on a 228 KB SM, not
    /// to the 132 KB below it (the driver's own choice) nor the 196 KB above.
    #[test]
    fn carveout_percent_lands_on_its_configuration() {
        let (config, per_sm, below) = (164 * 1024, 228 * 1024, 132 * 1024);
        let bytes = carveout_percent(config, per_sm) * per_sm / 100;
        assert!(bytes > below && bytes <= config, "{bytes} bytes");
    }
}
