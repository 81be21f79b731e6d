//! `dspark`: fast exact decoding of Qwen3 models with DSpark speculative drafts.
//!
//! Subcommands: `generate` (greedy or sampled decoding, streaming text or one JSON object),
//! `serve` (an OpenAI-compatible HTTP server, `dspark_serve`), `info` (what a checkpoint folder holds) and `bench` (every phase against the HBM floor on
//! Qwen3-8B shapes, on a CUDA GPU). Errors print as one line and exit non-zero; nothing here
//! panics on user input. `generate` without `--target` runs the demo pair compiled into the
//! binary (`demo`), so a copied binary needs no other files.

mod bench;
mod demo;
mod generate;
mod load;
mod memory;
// `generate` hands `progress::load_bar()` to `CheckpointUpload::with_progress`.
mod progress;
mod sampling;
mod serve;

use clap::{Parser, Subcommand};
use dspark_kernels::KvDtype;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "dspark",
    version,
    about = "Qwen3 inference with DSpark speculative decoding (greedy or sampled, lossless)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generation from a prompt: greedy, or sampled with --temperature or --sampling model.
    Generate(generate::GenerateArgs),
    /// Summarise and check a checkpoint folder without loading its weights.
    Info {
        /// HF-layout model folder (config.json + safetensors).
        dir: PathBuf,
    },
    /// Benchmark every decoding phase on Qwen3-8B / DSpark-8B shapes against the HBM floor.
    Bench(bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, models, health,
    /// metrics).
    Serve(serve::ServeArgs),
}

/// `--kv-cache f32|bf16`.
pub(crate) fn parse_kv_cache(s: &str) -> Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("expected f32 or bf16, got {s:?}"))
}

pub(crate) fn parse_activations(s: &str) -> Result<dspark_kernels::Activations, String> {
    dspark_kernels::Activations::parse(s).ok_or_else(|| format!("expected f32, bf16 or e4m3, got {s:?}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Info { dir } => {
            dspark_model::checkpoint::info::Info::of_dir(&dir).map(|i| print!("{i}")).map_err(Into::into)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
