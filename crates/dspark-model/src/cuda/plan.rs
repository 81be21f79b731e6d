//! What a CUDA target plans at load: its context, KV element type, where its token embedding
//! lives, and how many rows one GEMM prefill chunk takes — and the device bytes that costs
//! beyond the weights, which the memory check before a load counts.
//!
//! The two memory levers a small card needs are here, both opt-in and both exact:
//!
//! * `embeddings: Host` keeps `embed_tokens` in mapped host memory (`host_table.rs` says why
//!   and what it costs): 1.24 GB of Qwen3-8B's device memory, for a PCIe round trip per step.
//!   A tied head streams the table every step, so a tied model refuses it.
//! * `prefill_rows` bounds a prefill chunk: its activation buffers, and the draft's capture
//!   rows, scale with it (~0.3 MB a row for Qwen3-8B, 0.6 GB at the default 2,048), while a
//!   chunk of fewer rows runs its GEMMs less efficiently and widens FP8 weights more often.

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::prefill::MAX_PREFILL_ROWS;
use crate::cuda::qwen3::CHUNK;
use crate::error::{Error, Result};
use dspark_kernels::cuda::gemm::{dequant_scratch, workspace_bytes};
use dspark_kernels::cuda::kv::KvDtype;

/// Where the token embedding table lives (`--embeddings`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Embeddings {
    /// Device memory, as every other weight.
    #[default]
    Device,
    /// Mapped page-locked host memory, read by the device over PCIe.
    Host,
}

impl Embeddings {
    /// `device` or `host`.
    pub fn parse(s: &str) -> Option<Embeddings> {
        match s {
            "device" => Some(Embeddings::Device),
            "host" => Some(Embeddings::Host),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Embeddings::Device => "device",
            Embeddings::Host => "host",
        }
    }
}

/// How a CUDA target lays itself out at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetPlan {
    /// KV positions (capped at `max_position_embeddings` when planned).
    pub max_len: usize,
    pub kv: KvDtype,
    pub embeddings: Embeddings,
    /// Most rows of one GEMM prefill chunk (`--prefill-chunk`), at most [`MAX_PREFILL_ROWS`].
    pub prefill_rows: usize,
}

impl TargetPlan {
    /// `max_len` positions of `kv` caches, the embedding on the device, prefill chunks of
    /// [`MAX_PREFILL_ROWS`].
    pub fn new(max_len: usize, kv: KvDtype) -> TargetPlan {
        TargetPlan { max_len, kv, embeddings: Embeddings::Device, prefill_rows: MAX_PREFILL_ROWS }
    }

    pub fn with_embeddings(self, embeddings: Embeddings) -> TargetPlan {
        TargetPlan { embeddings, ..self }
    }

    pub fn with_prefill_rows(self, prefill_rows: usize) -> TargetPlan {
        TargetPlan { prefill_rows, ..self }
    }

    /// The context this plan gives a target of `cfg`.
    pub fn context(&self, cfg: &Qwen3Config) -> usize {
        self.max_len.min(cfg.max_position_embeddings).max(1)
    }

    /// Rows of the GEMM prefill's buffers for `cfg`: 0 when every forward fits a [`CHUNK`] step.
    pub fn gemm_rows(&self, cfg: &Qwen3Config) -> usize {
        let ctx = self.context(cfg);
        if ctx > CHUNK {
            ctx.min(self.prefill_rows).max(1)
        } else {
            0
        }
    }

    /// Refuses what the plan cannot do for `cfg`, naming the flag.
    pub fn check(&self, cfg: &Qwen3Config) -> Result<()> {
        if self.prefill_rows == 0 || self.prefill_rows > MAX_PREFILL_ROWS {
            return Err(Error::Request(format!(
                "--prefill-chunk {}: must be 1 to {MAX_PREFILL_ROWS} rows",
                self.prefill_rows
            )));
        }
        if self.embeddings == Embeddings::Host && cfg.tie_word_embeddings {
            return Err(Error::Request(
                "--embeddings host: this model ties lm_head to embed_tokens (tie_word_embeddings: true), so the \
                 output head streams the table from the device every step; it stays on the device"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Device bytes a target of `cfg` plans beyond its weights: the KV caches, the prefill's
    /// buffers, cuBLAS workspace and FP8 dequant scratch, and the decode step's logits (small
    /// scratch is left out). The weights are counted from the checkpoint, without
    /// `embed_tokens` when it goes to the host ([`TargetPlan::host_tensors`]).
    pub fn device_bytes(&self, cfg: &Qwen3Config) -> usize {
        let (h, q, kvd, i) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let caches = 2 * cfg.num_hidden_layers * self.context(cfg) * kvd * self.kv.bytes();
        let rows = self.gemm_rows(cfg);
        // An FP8 target's GEMMs widen each projection into a bf16 scratch (gemm.rs), in tiles
        // past `dequant_scratch` values (fewer for short chunks).
        let dequant =
            if cfg.quantization.is_some() { 2 * dequant_scratch(rows, h * (q + 2 * kvd).max(2 * i)) } else { 0 };
        let prefill = rows * (4 * (2 * h + q + 2 * kvd + 2 * q + 2 * i) + 2 * h.max(q).max(i))
            + if rows > 0 { workspace_bytes(rows) + dequant } else { 0 };
        caches + prefill + CHUNK * cfg.vocab_size * 4
    }

    /// The checkpoint tensors this plan keeps off the device.
    pub fn host_tensors(&self) -> &'static [&'static str] {
        match self.embeddings {
            Embeddings::Device => &[],
            Embeddings::Host => &["model.embed_tokens.weight"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_kernels::cuda::gemm::WORKSPACE_BYTES;

    fn qwen3_8b() -> Qwen3Config {
        let json = r#"{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"hidden_size":4096,
            "intermediate_size":12288,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":151936,"max_position_embeddings":40960,"rms_norm_eps":1e-6,
            "rope_theta":1000000,"tie_word_embeddings":false,"torch_dtype":"bfloat16"}"#;
        let j = crate::checkpoint::json::JsonObject::parse(std::path::Path::new("config.json"), json);
        Qwen3Config::from_json(&j.expect("json")).expect("Qwen3-8B config")
    }

    #[test]
    fn short_chunks_shrink_the_plan_by_their_rows() {
        let cfg = qwen3_8b();
        let base = TargetPlan::new(8192, KvDtype::Bf16);
        assert_eq!(base.host_tensors(), &[] as &[&str]);
        assert_eq!(base.with_embeddings(Embeddings::Host).host_tensors(), &["model.embed_tokens.weight"]);
        let short = base.with_prefill_rows(256);
        let per_row = 4 * (2 * 4096 + 4096 + 2048 + 2 * 4096 + 2 * 12288) + 2 * 12288;
        // The chunk's buffers, and a 4 MiB cuBLAS workspace for 256 rows instead of 32 MiB.
        let workspace = WORKSPACE_BYTES - (4 << 20);
        assert_eq!(base.device_bytes(&cfg) - short.device_bytes(&cfg), (2048 - 256) * per_row + workspace);
        // A context within one decode step plans no prefill at all.
        assert_eq!(TargetPlan::new(CHUNK, KvDtype::F32).gemm_rows(&cfg), 0);
        assert_eq!(TargetPlan::new(CHUNK + 1, KvDtype::F32).gemm_rows(&cfg), CHUNK + 1);
    }

    #[test]
    fn bad_plans_name_their_flag() {
        let cfg = qwen3_8b();
        for rows in [0, MAX_PREFILL_ROWS + 1] {
            let e = TargetPlan::new(4096, KvDtype::F32).with_prefill_rows(rows).check(&cfg).unwrap_err();
            assert!(e.to_string().contains("--prefill-chunk"), "{e}");
        }
        let mut tied = cfg.clone();
        tied.tie_word_embeddings = true;
        let host = TargetPlan::new(4096, KvDtype::F32).with_embeddings(Embeddings::Host);
        assert!(host.check(&cfg).is_ok());
        let e = host.check(&tied).unwrap_err().to_string();
        assert!(e.contains("--embeddings host") && e.contains("tie_word_embeddings"), "{e}");
    }

    /// The draft's target side foreseen from a plan, as a loader fitting both counts it (the
    /// GPU tier checks it against built targets: `gpu_model::memory_plan`).
    #[test]
    fn the_draft_side_follows_the_plan() {
        use crate::cuda::dspark::DraftSide;
        use crate::cuda::prefill::PrefillMode;
        let cfg = qwen3_8b();
        let plan = TargetPlan::new(8192, KvDtype::Bf16);
        let side = |p: &TargetPlan, mode| DraftSide::of_plan(&cfg, p, mode, 132);
        let want = DraftSide {
            sms: 132,
            max_len: 8192,
            kv_dtype: KvDtype::Bf16,
            host_tables: false,
            prefill_rows: Some(2048),
        };
        assert_eq!(side(&plan, PrefillMode::Gemm), want);
        assert_eq!(side(&plan, PrefillMode::Exact).prefill_rows, None, "no GEMM prefill: no draft GEMM buffers");
        let small = plan.with_embeddings(Embeddings::Host).with_prefill_rows(256);
        assert_eq!(side(&small, PrefillMode::Gemm), DraftSide { host_tables: true, prefill_rows: Some(256), ..want });
        // A context of one decode chunk plans no prefill; one past max_position_embeddings is capped.
        assert_eq!(side(&TargetPlan::new(CHUNK, KvDtype::Bf16), PrefillMode::Gemm).prefill_rows, None);
        assert_eq!(side(&TargetPlan::new(1 << 20, KvDtype::Bf16), PrefillMode::Gemm).max_len, 40960);
    }
}
