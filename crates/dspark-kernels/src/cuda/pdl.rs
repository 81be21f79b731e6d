//! Launches with programmatic dependent launch (PDL) on Hopper.
//!
//! Decoding is a chain of ~300 short kernels per token, and at stream boundaries each one pays
//! a launch latency plus a ramp and a tail during which HBM sits partly idle. With PDL the
//! driver may start kernel N+1 as soon as every block of kernel N is resident (kernel N calls
//! `griddepcontrol.launch_dependents` first thing); N+1's blocks then fill SMs as N's drain and
//! issue their first *weight* loads — weights, which nothing writes — before
//! `griddepcontrol.wait` holds them until N has finished and its writes are visible. The
//! kernels launched this way are those whose CUDA source calls `pdl_trigger()` and
//! `pdl_wait()` (kernels/common.cuh), less the few that measured faster without it (`NO_PDL` in
//! `mod.rs`); everything else launches normally and waits for its predecessor in full (the
//! calls are no-ops then).
//!
//! cudarc's launch builder has no launch attributes, so this builds the `cuLaunchKernelEx`
//! parameter array itself: each argument is stored in a u64 slot (device pointers natively,
//! i32/f32 in the low bytes — little-endian, which is every CUDA host), and the kernel
//! parameter array points at the slots.

use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::sys;

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    Ptr(u64),
    I32(i32),
    F32(f32),
}

impl Gpu {
    /// Whether `name` launches with PDL (see [`Gpu::kernel`]); false for an unknown name.
    pub fn pdl_for(&self, name: &str) -> bool {
        self.kernel(name).is_ok_and(|(_, pdl)| pdl)
    }

    /// The most arguments a launch takes (the FP8 matvecs' 27 are the most today).
    pub(crate) const MAX_ARGS: usize = 28;

    /// Launches `name` on the op stream, with the PDL attribute when the GPU supports it.
    pub(crate) fn launch_pdl(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> CudaResult<()> {
        self.launch_pdl_smem(name, grid, block, 0, args)
    }

    /// [`Gpu::launch_pdl`] with `smem` bytes of dynamic shared memory (above 48 KB the kernel's
    /// limit must have been raised at load, see `Gpu::new`).
    pub(crate) fn launch_pdl_smem(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> CudaResult<()> {
        let (f, pdl) = self.kernel(name)?;
        // Fixed-size arrays: this runs ~300 times per decoded token, so no heap allocation.
        if args.len() > Self::MAX_ARGS {
            return Err(CudaError::Shape(format!(
                "{name}: {} kernel arguments, at most {}",
                args.len(),
                Self::MAX_ARGS
            )));
        }
        let mut slots = [0u64; Self::MAX_ARGS];
        for (slot, a) in slots.iter_mut().zip(args) {
            *slot = match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            };
        }
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); Self::MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(slots.iter_mut()) {
            *p = slot as *mut u64 as *mut std::ffi::c_void;
        }
        // SAFETY: a zeroed attribute is a valid "no attribute" value that we then fill in.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl),
        };
        self.timed(name, Some((grid.0 * grid.1 * grid.2, block)), || {
            self.ctx.bind_to_thread()?;
            // SAFETY: `params` holds one pointer per kernel parameter, each to a slot holding the
            // value in the parameter's type (the callers pass arguments in the order and types
            // of the kernel signature); the slots outlive the call, which copies them.
            unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(CudaError::Driver)
        })
    }
}

/// The raw device address of a buffer or view, for [`Arg::Ptr`]. Event tracking is off (one
/// stream), so the returned guard has nothing to record and is dropped at once.
pub(crate) fn dptr<T>(gpu: &Gpu, v: &impl cudarc::driver::DevicePtr<T>) -> Arg {
    Arg::Ptr(device_addr(gpu, v))
}

/// The raw device address of a buffer or view (see [`dptr`]).
pub(crate) fn device_addr<T>(gpu: &Gpu, v: &impl cudarc::driver::DevicePtr<T>) -> u64 {
    let (p, _guard) = v.device_ptr(&gpu.stream);
    p
}

/// As [`dptr`], for a buffer the kernel writes.
pub(crate) fn dptr_mut<T>(gpu: &Gpu, v: &mut impl cudarc::driver::DevicePtrMut<T>) -> Arg {
    let (p, _guard) = v.device_ptr_mut(&gpu.stream);
    Arg::Ptr(p)
}
