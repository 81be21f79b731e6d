//! `--embeddings` and `--prefill-chunk`: the two device-memory levers of a CUDA target, shared by
//! `generate`, `serve` and `bench` (what they cost: `dspark_model::cuda::plan`).
//!
//! Left unset (`auto`), `generate` and `serve` fit them to the GPU, as llama.cpp's `--fit` and
//! vLLM's memory sizing do: the loader counts the target's and the draft's device bytes for
//! each plan in [`MemoryArgs::plans`]' order — the embedding on the device and chunks of 2,048
//! rows first; then the embedding in host memory, which costs decode nothing measurable; then
//! shorter chunks, which slow a long prompt's prefill — and loads the first that fits the free
//! memory with [`HEADROOM`] to spare, saying so on stderr when it is not the first
//! ([`choose`]). A flag that is given is kept; `bench` measures the first plan unless told.

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
    /// `auto` (the default): the device when the models fit there, else the host.
    #[arg(long, default_value = "auto", value_parser = parse_embeddings)]
    pub embeddings: Auto<Embeddings>,
    /// Rows of one GEMM prefill chunk on the GPU, 1 to 2048, or `auto` (the default: 2048, or
    /// fewer where the models would not fit): its buffers take ~0.3 MB a row for Qwen3-8B with a
    /// draft; fewer rows use less memory and prefill slower.
    #[arg(long, value_name = "ROWS", default_value = "auto", value_parser = parse_rows)]
    pub prefill_chunk: Auto<usize>,
}

/// A memory flag's value: `Auto(None)` for `auto`, else the value given. (A newtype, not a bare
/// `Option`: clap reads an `Option` field as a flag that may be absent.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auto<T>(pub Option<T>);

/// Device memory the fitted plan leaves free beyond what the loader counts: cuBLAS's own
/// allocations, CUDA graphs and the small buffers the plans leave out.
pub const HEADROOM: usize = 256 << 20;

/// Prefill chunk rows the fit tries, largest first.
const FIT_ROWS: [usize; 4] = [MAX_PREFILL_ROWS, 1024, 512, 256];

impl MemoryArgs {
    /// The target's plan for `max_context` positions of `kv` caches on `device`: the first of
    /// [`MemoryArgs::plans`] (what `bench` measures, and any loader that does not fit).
    pub fn plan(&self, device: Device, max_context: usize, kv: KvDtype) -> Result<TargetPlan> {
        Ok(self.plans(device, max_context, kv)?[0])
    }

    /// The plans a loader may take, most preferred first: one when both flags are given (or on
    /// the CPU), else what `auto` tries (module docs). The flags are refused on the CPU, which
    /// holds every weight in host memory and chunks prompts for scheduling, not memory.
    pub fn plans(&self, device: Device, max_context: usize, kv: KvDtype) -> Result<Vec<TargetPlan>> {
        if let Some(rows) = self.prefill_chunk.0 {
            if rows == 0 || rows > MAX_PREFILL_ROWS {
                bail!("--prefill-chunk {rows}: must be 1 to {MAX_PREFILL_ROWS} rows");
            }
        }
        let base = TargetPlan::new(max_context, kv);
        if device == Device::Cpu {
            if self.embeddings.0 == Some(Embeddings::Host) {
                bail!("--embeddings host: the CPU backend keeps every weight in host memory already (the flag is for --device cuda)");
            }
            if let Some(rows) = self.prefill_chunk.0 {
                bail!("--prefill-chunk {rows}: the CPU backend plans no GEMM prefill buffers (the flag is for --device cuda)");
            }
            return Ok(vec![base]);
        }
        let rows = self.prefill_chunk.0.map_or(FIT_ROWS.to_vec(), |r| vec![r]);
        let places = self.embeddings.0.map_or(vec![Embeddings::Device, Embeddings::Host], |e| vec![e]);
        Ok(rows
            .iter()
            .flat_map(|&r| places.iter().map(move |&e| base.with_embeddings(e).with_prefill_rows(r)))
            .collect())
    }
}

/// The flags that lay out `plan` (for messages).
fn flags(plan: &TargetPlan) -> String {
    format!("--embeddings {} --prefill-chunk {}", plan.embeddings.name(), plan.prefill_rows)
}

/// Which of `plans` to load: the first whose device bytes (`need`: `None` for a plan the model
/// refuses, such as a host embedding for a tied head) fit in `free` with [`HEADROOM`] to spare,
/// with a note for stderr when that is not the first; the only plan when there is one (its
/// load then gives the memory check's error). When none fits, an error naming the smallest.
pub fn choose(plans: &[TargetPlan], need: &[Option<usize>], free: usize) -> Result<(TargetPlan, Option<String>)> {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    if plans.len() == 1 {
        return Ok((plans[0], None));
    }
    let fitting = plans.iter().zip(need).position(|(_, n)| n.is_some_and(|n| n.saturating_add(HEADROOM) <= free));
    match fitting {
        Some(0) => Ok((plans[0], None)),
        Some(i) => {
            let first = match need.iter().flatten().next() {
                Some(n) => format!("{:.2} GiB", gib(*n)),
                None => "more".into(),
            };
            let note = format!(
                "dspark: the target and draft need {first} of GPU memory as first planned and {:.2} GiB is free: \
                 loading with {} ({:.2} GiB; give --embeddings and --prefill-chunk to choose)",
                gib(free),
                flags(&plans[i]),
                gib(need[i].unwrap_or(0))
            );
            Ok((plans[i], Some(note)))
        }
        None => {
            let smallest = plans.iter().zip(need).filter_map(|(p, n)| n.map(|n| (p, n))).min_by_key(|(_, n)| *n);
            match smallest {
                Some((p, n)) => bail!(
                    "the target and draft need {n} bytes ({:.2} GiB) of GPU memory even with {} (the smallest plan \
                     tried, {:.2} GiB kept free beside it), the GPU has {free} ({:.2} GiB) free; to plan less: \
                     --max-context N, --kv-cache bf16",
                    gib(n),
                    flags(p),
                    gib(HEADROOM),
                    gib(free)
                ),
                None => bail!("no memory plan applies to this model (see --embeddings, --prefill-chunk)"),
            }
        }
    }
}

/// `--embeddings auto|device|host`.
fn parse_embeddings(s: &str) -> Result<Auto<Embeddings>, String> {
    match s {
        "auto" => Ok(Auto(None)),
        _ => Embeddings::parse(s)
            .map(|e| Auto(Some(e)))
            .ok_or_else(|| format!("expected auto, device or host, got {s:?}")),
    }
}

/// `--prefill-chunk auto|ROWS`.
fn parse_rows(s: &str) -> Result<Auto<usize>, String> {
    match s {
        "auto" => Ok(Auto(None)),
        _ => s.parse().map(|r| Auto(Some(r))).map_err(|_| format!("expected auto or a number of rows, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(embeddings: Option<Embeddings>, rows: Option<usize>) -> MemoryArgs {
        MemoryArgs { embeddings: Auto(embeddings), prefill_chunk: Auto(rows) }
    }

    fn layout(plans: &[TargetPlan]) -> Vec<(&'static str, usize)> {
        plans.iter().map(|p| (p.embeddings.name(), p.prefill_rows)).collect()
    }

    #[test]
    fn auto_tries_the_host_embedding_before_shorter_chunks_and_keeps_given_flags() {
        let kv = KvDtype::Bf16;
        let all = args(None, None).plans(Device::Cuda, 8192, kv).unwrap();
        assert_eq!(
            layout(&all),
            [
                ("device", 2048),
                ("host", 2048),
                ("device", 1024),
                ("host", 1024),
                ("device", 512),
                ("host", 512),
                ("device", 256),
                ("host", 256)
            ]
        );
        assert!(all.iter().all(|p| p.max_len == 8192 && p.kv == kv));
        let host = args(Some(Embeddings::Host), None).plans(Device::Cuda, 8192, kv).unwrap();
        assert_eq!(layout(&host), [("host", 2048), ("host", 1024), ("host", 512), ("host", 256)]);
        let rows = args(None, Some(300)).plans(Device::Cuda, 8192, kv).unwrap();
        assert_eq!(layout(&rows), [("device", 300), ("host", 300)]);
        let both = args(Some(Embeddings::Device), Some(64)).plans(Device::Cuda, 8192, kv).unwrap();
        assert_eq!(layout(&both), [("device", 64)]);
        // bench and the CPU take the first; the CPU refuses the flags by name.
        assert_eq!(args(None, None).plan(Device::Cuda, 8192, kv).unwrap(), all[0]);
        assert_eq!(layout(&args(None, None).plans(Device::Cpu, 8192, kv).unwrap()), [("device", 2048)]);
        let err = args(Some(Embeddings::Host), None).plans(Device::Cpu, 8192, kv).unwrap_err().to_string();
        assert!(err.contains("--embeddings host"), "{err}");
        let err = args(None, Some(128)).plans(Device::Cpu, 8192, kv).unwrap_err().to_string();
        assert!(err.contains("--prefill-chunk 128"), "{err}");
        for bad in [0, MAX_PREFILL_ROWS + 1] {
            let err = args(None, Some(bad)).plans(Device::Cuda, 8192, kv).unwrap_err().to_string();
            assert!(err.contains(&format!("--prefill-chunk {bad}")), "{err}");
        }
    }

    #[test]
    fn choose_takes_the_first_plan_that_fits_with_headroom() {
        let plans = args(None, None).plans(Device::Cuda, 8192, KvDtype::Bf16).unwrap();
        let gb = |g: f64| (g * 1e9) as usize;
        // Falling sizes, the tied-head refusals as None.
        let need: Vec<Option<usize>> = [14.2, 13.0, 13.9, 12.7, 13.8, 12.5, 13.7, 12.4].map(|g| Some(gb(g))).to_vec();
        // Everything fits: the first, no note.
        let (p, note) = choose(&plans, &need, gb(20.0)).unwrap();
        assert_eq!((p, note), (plans[0], None));
        // 12.9 GB free: host at 2048 rows needs 13.0 + headroom, so host at 1024 (12.7).
        let free = gb(12.7) + HEADROOM;
        let (p, note) = choose(&plans, &need, free).unwrap();
        assert_eq!(p, plans[3]);
        let note = note.expect("a note when the first plan is not taken");
        assert!(note.contains("--embeddings host --prefill-chunk 1024") && note.contains("13.22 GiB"), "{note}");
        // One byte short of the headroom: the next smaller plan.
        let (p, _) = choose(&plans, &need, free - 1).unwrap();
        assert_eq!(p, plans[5]);
        // Nothing fits: the error names the smallest plan and what is free.
        let err = choose(&plans, &need, gb(12.0)).unwrap_err().to_string();
        assert!(err.contains("--embeddings host --prefill-chunk 256") && err.contains(&gb(12.4).to_string()), "{err}");
        // Refused plans are skipped; none applying is an error, not a panic.
        let mut tied = need.clone();
        for (i, n) in tied.iter_mut().enumerate() {
            if i % 2 == 1 {
                *n = None;
            }
        }
        let (p, _) = choose(&plans, &tied, gb(13.75) + HEADROOM).unwrap();
        assert_eq!(p, plans[6]);
        assert!(choose(&plans, &[None; 8], gb(100.0)).is_err());
        // A single plan is taken as it is: its load's memory check speaks for it.
        assert_eq!(choose(&plans[..1], &need[..1], 0).unwrap(), (plans[0], None));
    }
}
