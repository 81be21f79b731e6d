//! Decoding loops, generic over [`dspark_model::TargetModel`].
//!
//! [`greedy`] is plain greedy decoding: the baseline every speculative result must equal token
//! for token (Architecture Invariant: speculative output == plain greedy output).
//! [`speculative`] is the DSpark loop, with [`verify_len`] choosing how many drafts to check;
//! [`verify_budget`] is the same choice across the requests of a batched round, and
//! [`batched`] runs many requests' rounds at once over `dspark_model::batch`.
//! [`sampled`] holds their sampling twins, [`sample`] and [`speculative_sampled`] (lossless
//! speculative sampling), over the [`sampler`]'s transform and uniforms.
//! The loops never name a backend; the CLI picks one and hands it in.
//!
//! Every loop reports each token as it is committed to an `on_token` callback, which gets an
//! [`Emitted`] (the id, and its [`TokenLogprob`] when [`GenerateOptions::logprobs`] asks) and
//! returns [`std::ops::ControlFlow`]: `Break` ends generation right after that token with
//! [`StopReason::Stopped`]; the tokens before it are exactly those of an unbroken run.

pub mod acceptance;
pub mod batched;
pub mod greedy;
pub mod logprobs;
pub mod sampled;
pub mod sampler;
pub mod speculative;
pub mod stats;
pub mod verify_budget;
pub mod verify_len;

pub use acceptance::{AcceptanceCheck, LowAcceptance};
pub use batched::{batched, BatchLimits, BatchOutput, BatchRequest, BatchVerify, Finished, Scheduler};
pub use greedy::{greedy, GenerateOptions};
pub use logprobs::{token_logprob, Emitted, TokenLogprob};
pub use sampled::{sample, speculative_sampled, DraftLaw};
pub use sampler::SamplingParams;
pub use speculative::{prefill, speculative};
pub use stats::{Generation, SpecStats, StopReason};
pub use verify_budget::verify_budget;
pub use verify_len::{CostTable, VerifyLen};
