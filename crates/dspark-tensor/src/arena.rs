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
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::Location;
use std::sync::Arc;

/// Allocates device buffers on one stream and counts them.
pub struct Arena {
    stream: Arc<CudaStream>,
    allocations: Cell<usize>,
    bytes: Cell<usize>,
    /// Allocations and bytes by the source line that asked for them (`#[track_caller]`), for
    /// the memory report of `dspark bench --memory-sites`.
    sites: RefCell<BTreeMap<SiteKey, (usize, usize)>>,
    /// Buffers handed to every caller asking under one name and length ([`Arena::shared_zeros`]).
    shared: RefCell<SharedBufs>,
}

/// Shared buffers by (name, length), each a `CudaSlice<T>` of its caller's `T`.
type SharedBufs = BTreeMap<(&'static str, usize), Arc<dyn Any + Send + Sync>>;

/// A source line: file and line number.
type SiteKey = (&'static str, u32);

/// The bytes one source line of the loader allocated: `file:line`, allocations, bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub at: String,
    pub allocations: usize,
    pub bytes: usize,
}

impl Arena {
    pub fn new(stream: Arc<CudaStream>) -> Arena {
        Arena {
            stream,
            allocations: Cell::new(0),
            bytes: Cell::new(0),
            sites: RefCell::new(BTreeMap::new()),
            shared: RefCell::new(BTreeMap::new()),
        }
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

    /// Where the bytes went, largest first: each source line that allocated (the caller of the
    /// arena's method), with its count and bytes. Their bytes sum to [`Arena::bytes`].
    pub fn sites(&self) -> Vec<Site> {
        let mut v: Vec<Site> = self
            .sites
            .borrow()
            .iter()
            .map(|(&(file, line), &(allocations, bytes))| Site { at: format!("{file}:{line}"), allocations, bytes })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.at.cmp(&b.at)));
        v
    }

    #[track_caller]
    fn count<T>(&self, n: usize) {
        let bytes = n * std::mem::size_of::<T>();
        self.allocations.set(self.allocations.get() + 1);
        self.bytes.set(self.bytes.get() + bytes);
        let at = Location::caller();
        let mut sites = self.sites.borrow_mut();
        let e = sites.entry((at.file(), at.line())).or_insert((0, 0));
        e.0 += 1;
        e.1 += bytes;
    }

    /// A zeroed buffer of `n` elements.
    #[track_caller]
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, DriverError> {
        self.count::<T>(n.max(1));
        self.stream.alloc_zeros(n.max(1))
    }

    /// A zeroed buffer of `n` elements that every caller asking for `name` and `n` shares,
    /// allocated (and counted) once: scratch that each launch sequence on the arena's stream
    /// writes before it reads, such as the FP8 matvec's x split, which all of a model's FP8
    /// matrices of one width can share (a kernel writing it waits, by PDL, for the one before
    /// to finish reading).
    #[track_caller]
    pub fn shared_zeros<T: DeviceRepr + ValidAsZeroBits + Send + Sync + 'static>(
        &self,
        name: &'static str,
        n: usize,
    ) -> Result<Arc<CudaSlice<T>>, DriverError> {
        let found = self.shared.borrow().get(&(name, n)).cloned();
        if let Some(Ok(buf)) = found.map(|b| b.downcast::<CudaSlice<T>>()) {
            return Ok(buf);
        }
        let buf = Arc::new(self.zeros::<T>(n)?);
        self.shared.borrow_mut().insert((name, n), buf.clone());
        Ok(buf)
    }

    /// A buffer holding a copy of `data`.
    #[track_caller]
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, DriverError> {
        self.count::<T>(data.len());
        self.stream.clone_htod(data)
    }

    /// A zeroed weight matrix of `n` elements of `dtype`, for a loader that copies the
    /// checkpoint's bytes into it (the same buffer, and count, as [`Arena::weight`] makes).
    #[track_caller]
    pub fn weight_zeros(&self, dtype: DType, n: usize) -> Result<WeightBuf, DriverError> {
        Ok(match dtype {
            DType::F32 => WeightBuf::F32(self.zeros(n)?),
            DType::BF16 => WeightBuf::Bf16(self.zeros(n)?),
            DType::F16 => WeightBuf::F16(self.zeros(n)?),
        })
    }

    /// A weight matrix in its checkpoint dtype from little-endian bytes.
    #[track_caller]
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
