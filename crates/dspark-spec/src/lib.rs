//! Decoding loops, generic over [`dspark_model::TargetModel`].
//!
//! [`greedy`] is plain greedy decoding: the baseline every speculative result must equal token
//! for token (Architecture Invariant: speculative output == plain greedy output). The loops
//! never name a backend; the CLI picks one and hands it in.

pub mod greedy;
pub mod stats;

pub use greedy::{greedy, GenerateOptions};
pub use stats::{Generation, StopReason};
