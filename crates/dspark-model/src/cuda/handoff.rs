//! The device buffers a target and the drafts loaded for it on the same GPU hand each other: the
//! target's layer captures (read by the draft), the draft's proposed tokens (read by the
//! target's verify) and a sampled draft's rows. Each carries a generation its writer bumps, so a
//! handle to contents since overwritten is refused instead of read.

use cudarc::driver::CudaSlice;
use std::sync::{Arc, Mutex};

/// A device buffer one model writes and another on the same GPU reads, with a `generation` the
/// writer bumps each time, so that a reader can refuse a handle to contents since overwritten.
pub struct Handoff<T> {
    pub data: CudaSlice<T>,
    pub generation: u64,
}

/// The token-major capture buffer `[CHUNK, T · H]` a target writes and a draft reads;
/// `generation` counts forwards. Shared between a [`CudaQwen3`] and the drafts loaded for it.
pub type SharedCapture = Arc<Mutex<Handoff<f32>>>;

/// The draft tokens of the last proposal of a draft on the target's GPU: the draft's Markov
/// chain writes them here and the target's verify reads them, so a round moves no token through
/// the host before its verify ([`Deferred::OnDevice`]). `generation` counts proposals.
pub type SharedTokens = Arc<Mutex<Handoff<u32>>>;

/// What a sampled draft drew its block from, for the target's verify to judge the drafts
/// against: the block's final logits rows `[B, V]` (Markov bias included) and each slot's
/// sampler state (`sample::ROW_WORDS` words). The draft allocates them at load and installs them
/// here; a proposal with [`DeviceTokens::sampled`] filled them, valid while the shared tokens'
/// generation is that proposal's.
pub struct DraftRows {
    pub logits: CudaSlice<f32>,
    pub state: CudaSlice<u32>,
}

/// The slot a draft on the target's GPU installs its [`DraftRows`] in.
pub type SharedDraftRows = Arc<Mutex<Option<DraftRows>>>;

/// Identity of a shared buffer, as carried in [`DeviceRows::buffer`] and
/// [`DeviceTokens::buffer`].
pub fn handoff_id<T>(h: &Arc<Mutex<Handoff<T>>>) -> usize {
    Arc::as_ptr(h) as usize
}
