//! The all-reduce between the ranks of a [`super::CudaQwen3Tp`]: a sum of each rank's partial
//! `[rows, H]` over the ranks, every rank left holding it.
//!
//! * [`Nccl`]: one communicator per GPU (`ncclCommInitAll`, cudarc's bindings), the ranks'
//!   calls in one NCCL group because one thread drives every GPU. NCCL picks the reduction's
//!   order (ring or tree), so a sum's last bits may differ from the rank-order sum; what is
//!   guaranteed is that every rank gets the same bits.
//! * [`SameDevice`]: every rank on one GPU and one stream — how N > 1 is run and tested before
//!   a multi-GPU machine is lent (NCCL refuses two ranks on one device). The partials are added
//!   into rank 0's buffer in rank order (the CPU reference's order, `crate::tp::all_reduce`) and
//!   copied back to the others: a test device, not a collective for serving.

use crate::cuda::layers::{drv, gpu_err};
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::Gpu;
use std::sync::Arc;

/// Sums `bufs[r][..len]` over the ranks, in place.
pub trait AllReduce {
    fn all_reduce(&self, gpus: &[Arc<Gpu>], bufs: &mut [&mut CudaSlice<f32>], len: usize) -> Result<()>;
    /// What the runs report (`nccl`, `same-device`).
    fn name(&self) -> &'static str;
}

/// Every rank on one GPU and stream (see the module docs).
pub struct SameDevice;

impl AllReduce for SameDevice {
    fn all_reduce(&self, gpus: &[Arc<Gpu>], bufs: &mut [&mut CudaSlice<f32>], len: usize) -> Result<()> {
        let Some(g) = gpus.first() else { return Ok(()) };
        if gpus.iter().any(|o| !Arc::ptr_eq(o, g)) {
            return Err(Error::Request("same-device all-reduce: the ranks are on different GPUs".into()));
        }
        let (first, rest) = bufs.split_first_mut().ok_or_else(|| Error::Request("all-reduce of no ranks".into()))?;
        for b in rest.iter() {
            g.add_into(&mut first.slice_mut(..len), &b.slice(..len)).map_err(gpu_err)?;
        }
        for b in rest.iter_mut() {
            g.stream.memcpy_dtod(&first.slice(..len), &mut b.slice_mut(..len)).map_err(drv)?;
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "same-device"
    }
}

/// NCCL over the ranks' GPUs (see the module docs).
pub struct Nccl {
    comms: Vec<cudarc::nccl::safe::Comm>,
}

impl Nccl {
    /// One communicator per GPU of `gpus` (distinct devices), or an error saying what is missing.
    pub fn new(gpus: &[Arc<Gpu>]) -> Result<Nccl> {
        // SAFETY: only probes whether the library loads (cudarc would panic at the first call).
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(Error::Request(
                "--tensor-parallel: NCCL was not found (libnccl.so on LD_LIBRARY_PATH; the nvidia-nccl wheel \
                 ships libnccl.so.2: a link to it named libnccl.so will do)"
                    .into(),
            ));
        }
        let streams = gpus.iter().map(|g| g.stream.clone()).collect();
        let comms = cudarc::nccl::safe::Comm::from_devices(streams)
            .map_err(|e| Error::Request(format!("--tensor-parallel: ncclCommInitAll: {e:?}")))?;
        Ok(Nccl { comms })
    }
}

impl AllReduce for Nccl {
    fn all_reduce(&self, _gpus: &[Arc<Gpu>], bufs: &mut [&mut CudaSlice<f32>], len: usize) -> Result<()> {
        use cudarc::nccl::safe::ReduceOp;
        let err = |e: cudarc::nccl::result::NcclError| Error::Request(format!("NCCL all-reduce: {e:?}"));
        if bufs.len() != self.comms.len() {
            return Err(Error::Request(format!(
                "NCCL all-reduce: {} buffers for {} ranks",
                bufs.len(),
                self.comms.len()
            )));
        }
        // One thread drives every rank, so their calls go in one group (else the first blocks).
        cudarc::nccl::result::group_start().map_err(err)?;
        let mut result = Ok(());
        for (comm, b) in self.comms.iter().zip(bufs.iter_mut()) {
            if let Err(e) = comm.all_reduce_in_place(&mut b.slice_mut(..len), &ReduceOp::Sum) {
                result = Err(err(e));
                break;
            }
        }
        cudarc::nccl::result::group_end().map_err(err)?;
        result
    }

    fn name(&self) -> &'static str {
        "nccl"
    }
}
