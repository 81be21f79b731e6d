//! How a `generate` run chooses its tokens: `--sampling flags|model`, `--draft-law`, the
//! settings checked flag by flag ([`sampling_params`]), and what the stats say of them
//! ([`Sampling`]).

use crate::generate::GenerateArgs;
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use dspark_model::checkpoint::generation_config::SamplingDefaults;
use dspark_spec::{DraftLaw, SamplingParams};
use serde_json::json;

/// `--sampling flags|model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SamplingSource {
    Flags,
    Model,
}

/// `--draft-law greedy|sampled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DraftLawArg {
    Greedy,
    Sampled,
}

impl From<DraftLawArg> for DraftLaw {
    fn from(a: DraftLawArg) -> DraftLaw {
        match a {
            DraftLawArg::Greedy => DraftLaw::Greedy,
            DraftLawArg::Sampled => DraftLaw::Sampled,
        }
    }
}

pub(crate) fn law_name(law: DraftLaw) -> &'static str {
    match law {
        DraftLaw::Greedy => "greedy",
        DraftLaw::Sampled => "sampled",
    }
}

impl SamplingSource {
    fn name(self) -> &'static str {
        match self {
            SamplingSource::Flags => "flags",
            SamplingSource::Model => "model",
        }
    }
}

/// The sampling settings of a run, flags over (with `--sampling model`) the model's
/// `generation_config.json` values over greedy. Each flag is checked first, so an error names
/// the flag and the value it was given ("--top-p must be in (0, 1], got 1.5"); the file's
/// values were checked as it was read, naming the file and the field. The seed is `--seed`, else
/// random from the clock.
pub(crate) fn sampling_params(args: &GenerateArgs, model: Option<SamplingDefaults>) -> Result<SamplingParams> {
    let top_k = match args.top_k {
        Some(k) if k < 0 => bail!("--top-k must be ≥ 0 (0: off), got {k}"),
        Some(k) => Some(usize::try_from(k).context("--top-k is too large")?),
        None => None,
    };
    let base = model.unwrap_or(SamplingDefaults::GREEDY);
    let flags = SamplingParams {
        temperature: args.temperature.unwrap_or(SamplingDefaults::GREEDY.temperature),
        top_k: top_k.unwrap_or(SamplingDefaults::GREEDY.top_k),
        top_p: args.top_p.unwrap_or(SamplingDefaults::GREEDY.top_p),
        min_p: args.min_p.unwrap_or(SamplingDefaults::GREEDY.min_p),
        seed: 0,
    };
    flags.validate().map_err(|e| anyhow::anyhow!("{}", flag_message(&e)))?;
    let params = SamplingParams {
        temperature: args.temperature.unwrap_or(base.temperature),
        top_k: top_k.unwrap_or(base.top_k),
        top_p: args.top_p.unwrap_or(base.top_p),
        min_p: args.min_p.unwrap_or(base.min_p),
        seed: args.seed.unwrap_or_else(clock_seed),
    };
    params.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(params)
}

/// `SamplingParams::validate`'s message with its field named as the CLI spells the flag.
fn flag_message(e: &str) -> String {
    for (field, flag) in [("temperature", "--temperature"), ("top_p", "--top-p"), ("min_p", "--min-p")] {
        if let Some(rest) = e.strip_prefix(field) {
            return format!("{flag}{rest}");
        }
    }
    e.to_string()
}

/// A seed for a run given none: the clock's nanoseconds, mixed (splitmix64) and kept below 2³²
/// so that it prints short and survives any JSON reader's doubles.
fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut z = nanos.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & 0xFFFF_FFFF
}

/// An f32 setting as the shortest decimal that reads back as it (0.8, not 0.800000011920929).
fn num(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// What the stats say about how a run chose its tokens.
pub(crate) struct Sampling {
    pub(crate) source: SamplingSource,
    pub(crate) params: SamplingParams,
    /// The draft's law on speculative runs (`greedy`: its argmax; `sampled`: drawn from q).
    pub(crate) law: Option<&'static str>,
}

impl Sampling {
    /// `stats.sampling`: the settings and the seed used (null for greedy decoding, which draws
    /// nothing), and the draft law on speculative runs.
    pub(crate) fn json(&self) -> serde_json::Value {
        let p = &self.params;
        let mut v = json!({
            "source": self.source.name(),
            "temperature": num(p.temperature),
            "top_k": p.top_k,
            "top_p": num(p.top_p),
            "min_p": num(p.min_p),
            "seed": if p.is_greedy() { None } else { Some(p.seed) },
        });
        if let Some(law) = self.law {
            v["law"] = json!(law);
        }
        v
    }

    /// The stats line's mention of the settings, when sampling.
    pub(crate) fn line(&self) -> String {
        let p = &self.params;
        if p.is_greedy() {
            return String::new();
        }
        let law = self.law.map(|l| format!(", draft law {l}")).unwrap_or_default();
        format!(
            "; sampled at temperature {}, top-k {}, top-p {}, min-p {}, seed {}{law}",
            num(p.temperature),
            p.top_k,
            num(p.top_p),
            num(p.min_p),
            p.seed
        )
    }
}
