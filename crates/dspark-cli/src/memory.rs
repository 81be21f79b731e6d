//! `--embeddings` and `--prefill-chunk`: the two device-memory levers of a CUDA target, shared by
//! `generate`, `serve` and `bench` (what they cost: `dspark_model::cuda::plan`).

use crate::load::Device;
use anyhow::{bail, Result};
use dspark_kernels::KvDtype;
use dspark_model::cuda::plan::{Embeddings, TargetPlan};
use dspark_model::cuda::prefill::MAX_PREFILL_ROWS;

/// The memory flags.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct MemoryArgs {
    /// Where the GPU keeps the token embedding: `device`, or `host` (page-locked host memory the
    /// GPU reads over PCIe: 1.24 GB less device memory for Qwen3-8B, for a PCIe round trip per
    /// step; not for models whose lm_head is tied to it).
    #[arg(long, default_value = "device", value_parser = parse_embeddings)]
    pub embeddings: Embeddings,
    /// Rows of one GEMM prefill chunk on the GPU, 1 to 2048 (default 2048): its buffers take
    /// ~0.3 MB a row for Qwen3-8B with a draft; fewer rows use less memory and prefill slower.
    #[arg(long, value_name = "ROWS")]
    pub prefill_chunk: Option<usize>,
}

impl MemoryArgs {
    /// The target's plan for `max_context` positions of `kv` caches on `device`; the flags are
    /// refused on the CPU, which holds every weight in host memory and chunks prompts for
    /// scheduling, not memory.
    pub fn plan(&self, device: Device, max_context: usize, kv: KvDtype) -> Result<TargetPlan> {
        let rows = self.prefill_chunk.unwrap_or(MAX_PREFILL_ROWS);
        if rows == 0 || rows > MAX_PREFILL_ROWS {
            bail!("--prefill-chunk {rows}: must be 1 to {MAX_PREFILL_ROWS} rows");
        }
        if device == Device::Cpu {
            if self.embeddings == Embeddings::Host {
                bail!("--embeddings host: the CPU backend keeps every weight in host memory already (the flag is for --device cuda)");
            }
            if let Some(rows) = self.prefill_chunk {
                bail!("--prefill-chunk {rows}: the CPU backend plans no GEMM prefill buffers (the flag is for --device cuda)");
            }
        }
        Ok(TargetPlan::new(max_context, kv).with_embeddings(self.embeddings).with_prefill_rows(rows))
    }
}

/// `--embeddings device|host`.
fn parse_embeddings(s: &str) -> Result<Embeddings, String> {
    Embeddings::parse(s).ok_or_else(|| format!("expected device or host, got {s:?}"))
}
