//! The device arena: the one place device memory is allocated.
//!
//! A model plans its buffers for a maximum context when it loads — weights, KV caches, and
//! activation buffers sized for the largest step — and takes them all from an [`Arena`].
//! Decoding reuses them; host data reaches them with copies into existing buffers. The arena
//! counts allocations and bytes, so "no device allocation per token" is a checked property
//! (Architecture Invariant), not a hope.

use crate::dtype::DType;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, DriverError, ValidAsZeroBits};
use dspark_kernels::cuda::ops::WeightBuf;
use std::cell::Cell;
use std::sync::Arc;

/// Allocates device buffers on one stream and counts them.
pub struct Arena {
    stream: Arc<CudaStream>,
    allocations: Cell<usize>,
    bytes: Cell<usize>,
}

impl Arena {
    pub fn new(stream: Arc<CudaStream>) -> Arena {
        Arena { stream, allocations: Cell::new(0), bytes: Cell::new(0) }
    }

    /// Number of device allocations made so far.
    pub fn allocations(&self) -> usize {
        self.allocations.get()
    }

    /// Bytes allocated so far.
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }

    /// The stream every buffer is allocated on (copies into them are ordered on it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn count<T>(&self, n: usize) {
        self.allocations.set(self.allocations.get() + 1);
        self.bytes.set(self.bytes.get() + n * std::mem::size_of::<T>());
    }

    /// A zeroed buffer of `n` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, DriverError> {
        self.count::<T>(n.max(1));
        self.stream.alloc_zeros(n.max(1))
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, DriverError> {
        self.count::<T>(data.len());
        self.stream.clone_htod(data)
    }

    /// A zeroed weight matrix of `n` elements of `dtype`, for a loader that copies the
    /// checkpoint's bytes into it (the same buffer, and count, as [`Arena::weight`] makes).
    pub fn weight_zeros(&self, dtype: DType, n: usize) -> Result<WeightBuf, DriverError> {
        Ok(match dtype {
            DType::F32 => WeightBuf::F32(self.zeros(n)?),
            DType::BF16 => WeightBuf::Bf16(self.zeros(n)?),
            DType::F16 => WeightBuf::F16(self.zeros(n)?),
        })
    }

    /// A weight matrix in its checkpoint dtype from little-endian bytes.
    pub fn weight(&self, dtype: DType, bytes: &[u8]) -> Result<WeightBuf, DriverError> {
        Ok(match dtype {
            DType::F32 => WeightBuf::F32(self.upload(&dtype.to_f32(bytes))?),
            DType::BF16 | DType::F16 => {
                let raw: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                let buf = self.upload(&raw)?;
                if dtype == DType::BF16 {
                    WeightBuf::Bf16(buf)
                } else {
                    WeightBuf::F16(buf)
                }
            }
        })
    }
}
