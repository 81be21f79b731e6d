//! Developer tasks for the dspark workspace, run as `cargo xtask <command>` (USAGE below):
//! the test command (`test_data.rs` fetches and pins the inputs it needs first), the GPU tier's
//! bundle and the committed PTX (`gpu.rs`), the fixtures, the lossless soak and the fuzzing of
//! the checkpoint readers. Plain `std` plus shelling out to `tar`, `sha256sum` and cargo, so the
//! tool builds in seconds on a fresh machine.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod gpu;
mod test_data;

use gpu::{gpu_tier, ptx};
use test_data::fetch_test_data;

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  fetch-test-data        download the pinned test inputs into .test-data/ (idempotent)
  test [cargo args..]    fetch-test-data, then `cargo test --workspace [cargo args..]`
  test --gpu             the GPU tier: runs it here when a CUDA device is present, else builds
                         .gpu-bundle/ for scripts/gpu-tier.sh on a machine with only the driver
  fixtures               regenerate fixtures: `bash fixtures/gen/run.sh`
  ptx                    compile kernels/*.cu to committed PTX (pinned nvcc 13.0 in .venv-nvcc)
  ptx --trace            the kernels' trace build (sm_90, -DDSPARK_TRACE) into target/ptx-trace/,
                         for `DSPARK_PTX_DIR=target/ptx-trace dspark bench --trace`
  soak [cases]           release run of the lossless property (default 10000 cases);
                         record the result in docs/soak.md
  fuzz [runs]            the checkpoint readers' coverage-guided fuzz target (fuzz/, cargo-fuzz
                         on the nightly toolchain), seeded from the fixtures; default 1000000 runs
  help                   print this message
";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let command = args.next();
    let rest: Vec<OsString> = args.collect();
    let result = match command.as_ref().and_then(|c| c.to_str()) {
        Some("fetch-test-data") if rest.is_empty() => fetch_test_data().map(|()| 0),
        Some("test") if rest.first().is_some_and(|a| a == "--gpu") => gpu_tier(),
        Some("test") => fetch_test_data().and_then(|()| cargo_test(&rest)),
        Some("fixtures") if rest.is_empty() => fixtures(),
        Some("ptx") if rest.is_empty() => ptx().map(|()| 0),
        Some("ptx") if rest.len() == 1 && rest[0] == "--trace" => gpu::ptx_trace().map(|()| 0),
        Some("soak") if rest.len() <= 1 => soak(rest.first().and_then(|c| c.to_str()).unwrap_or("10000")),
        Some("fuzz") if rest.len() <= 1 => fuzz(rest.first().and_then(|c| c.to_str()).unwrap_or("1000000")),
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(0)
        }
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The workspace root: this crate lives in `<root>/xtask`.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn cargo_test(extra: &[OsString]) -> Result<i32> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args(["test", "--workspace"])
        .args(extra)
        .current_dir(workspace_root())
        .status()
        .context("running `cargo test`")?;
    if !status.success() || !extra.is_empty() {
        return Ok(status.code().unwrap_or(1));
    }
    // Machines without a GPU cannot run the GPU tier, but they can still compile it, so a
    // change that breaks the GPU tests fails here rather than on the next GPU run.
    // The whole workspace with the two features keeps every dependency's feature set the same
    // as the test build above, so only the test crates recompile.
    println!("building (not running) the GPU tier: cargo test --workspace --features …/gpu-tests --no-run");
    let status = Command::new(&cargo)
        .args([
            "test",
            "--workspace",
            "--features",
            "dspark-kernels/gpu-tests,dspark-spec/gpu-tests,dspark-model/gpu-tests",
            "--no-run",
        ])
        .current_dir(workspace_root())
        .status()
        .context("building the GPU tier")?;
    Ok(status.code().unwrap_or(1))
}

/// Seeds `fuzz/corpus/readers` from the fixtures and runs the `readers` target for `runs`
/// executions under libFuzzer (address sanitizer, debug assertions, a 2 GB RSS and 10 s
/// per-input limit): a panic, hang or out-of-memory fails the command and leaves the input in
/// `fuzz/artifacts/`. Needs the nightly toolchain and `cargo install cargo-fuzz`.
fn fuzz(runs: &str) -> Result<i32> {
    let runs: u64 = runs.parse().with_context(|| format!("fuzz: runs must be a number, got {runs:?}"))?;
    let root = workspace_root();
    let corpus = root.join("fuzz/corpus/readers");
    let manifest = root.join("fuzz/Cargo.toml");
    run(Command::new("cargo")
        .args(["+nightly", "run", "-q", "--manifest-path"])
        .arg(&manifest)
        .args(["--bin", "seed", "--"])
        .arg(&corpus))?;
    let status = Command::new("cargo")
        .args(["+nightly", "fuzz", "run", "readers"])
        .arg(&corpus)
        .args(["--", &format!("-runs={runs}"), "-rss_limit_mb=2048", "-timeout=10"])
        .current_dir(&root)
        .status()
        .context("cargo fuzz (install it with `cargo install cargo-fuzz`; it needs the nightly toolchain)")?;
    Ok(status.code().unwrap_or(1))
}

/// The lossless property (speculative == plain greedy) over many random target/draft pairs,
/// in release mode. The case count goes to proptest through `PROPTEST_CASES`.
fn soak(cases: &str) -> Result<i32> {
    if cases.parse::<u64>().is_err() {
        bail!("soak: expected a case count, got {cases:?}");
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let start = std::time::Instant::now();
    let status = Command::new(cargo)
        .args(["test", "--release", "-p", "dspark-spec", "--test", "lossless", "lossless_property"])
        .env("PROPTEST_CASES", cases)
        .current_dir(workspace_root())
        .status()
        .context("running the lossless soak")?;
    println!(
        "soak: {cases} cases, {}, {:.0} s",
        if status.success() { "passed" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    Ok(status.code().unwrap_or(1))
}

fn fixtures() -> Result<i32> {
    let status = Command::new("bash")
        .arg("fixtures/gen/run.sh")
        .current_dir(workspace_root())
        .status()
        .context("running `bash fixtures/gen/run.sh`")?;
    Ok(status.code().unwrap_or(1))
}

/// Runs a command to completion, failing on a non-zero exit.
fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} exited with {status}");
    }
    Ok(())
}

/// Lower-case hex SHA-256 of a file, via the `sha256sum` command.
fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output().context("running `sha256sum` (coreutils)")?;
    if !out.status.success() {
        bail!("sha256sum {} failed: {}", path.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(hex) if hex.len() == 64 => Ok(hex.to_ascii_lowercase()),
        _ => bail!("unexpected sha256sum output for {}: {text:?}", path.display()),
    }
}

/// The single file in `dir` whose name ends with `suffix`.
fn find_with_suffix(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(suffix)) {
            found.push(path);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => bail!("expected one *{suffix} file in {}, found {n}", dir.display()),
    }
}

/// A path relative to the workspace root, for messages.
fn display(path: &Path) -> String {
    let root = workspace_root();
    path.strip_prefix(&root).unwrap_or(path).display().to_string()
}

/// A temporary folder removed on drop (std has none; the only dependency allowed is anyhow).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<TempDir> {
        let tag: String = tag.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let path = std::env::temp_dir().join(format!("dspark-xtask-{}-{tag}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).with_context(|| format!("clearing {}", path.display()))?;
        }
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
