//! The GPU side of the tooling: `cargo xtask test --gpu` (the GPU tier's release test binaries
//! and `dspark`, run here when there is a GPU, else bundled for `scripts/gpu-tier.sh` on a GPU
//! machine) and `cargo xtask ptx` (kernels/*.cu to the committed PTX, with a pinned nvcc).

use crate::{run, sha256, workspace_root};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// GPU-tier test binaries: (package, test target).
const GPU_TESTS: [(&str, &str); 3] =
    [("dspark-kernels", "gpu_kernels"), ("dspark-spec", "gpu_model"), ("dspark-model", "gpu_upload")];

/// Builds the GPU-tier test binaries in release mode. With a local GPU, runs them; otherwise
/// copies them into `.gpu-bundle/` next to `scripts/gpu-tier.sh`, which runs them (and
/// compute-sanitizer) on a machine that has the NVIDIA driver but no Rust.
pub(crate) fn gpu_tier() -> Result<i32> {
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
/// (file suffix, nvcc -arch) for every PTX variant: Hopper, sm_80 as the portable fallback, and
/// Ada (sm_89) for the modules that include `fp8.cuh` only — the E4M3 conversions and MMA that
/// sm_89 added are all that differ there (`__CUDA_ARCH__ >= 890`); Ada loads the sm_80 build of
/// every other module.
const PTX_TARGETS: [(&str, &str); 3] = [("sm90", "sm_90"), ("sm80", "sm_80"), ("sm89", "sm_89")];

/// Whether module `src` (its text) gets an sm_89 build: it includes the E4M3 header.
fn has_sm89_build(src: &str) -> bool {
    src.contains("#include \"fp8.cuh\"")
}
const NVCC_FLAGS: &str = "-ptx -O3 -std=c++17";

/// The pinned nvcc's folder, installed into `.venv-nvcc` on first use.
fn nvcc_bin(root: &Path) -> Result<PathBuf> {
    let venv = root.join(".venv-nvcc");
    let bin = venv.join("lib/python3.11/site-packages/nvidia/cu13/bin");
    if !bin.join("nvcc").exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "-q"]).args(NVCC_WHEELS))?;
    }
    Ok(bin)
}

/// Where `cargo xtask ptx --trace` writes the trace build (not committed; `DSPARK_PTX_DIR`
/// points the loader at it).
pub(crate) const TRACE_DIR: &str = "target/ptx-trace";

/// The trace build of every module for sm_90 (`-DDSPARK_TRACE`: kernels/trace.cuh), as plain
/// `<name>.sm90.ptx` files in [`TRACE_DIR`], for `DSPARK_PTX_DIR=target/ptx-trace dspark bench
/// --trace`. Only Hopper: the trace reads the PDL hooks, which the older builds compile out.
pub(crate) fn ptx_trace() -> Result<()> {
    let root = workspace_root();
    let bin = nvcc_bin(&root)?;
    let out_dir = root.join(TRACE_DIR);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("kernels"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for src in &sources {
        let stem = src.file_stem().and_then(|s| s.to_str()).context("kernel file name")?;
        let out = out_dir.join(format!("{stem}.sm90.ptx"));
        let mut cmd = Command::new(bin.join("nvcc"));
        cmd.args(NVCC_FLAGS.split(' ')).args(["-arch=sm_90", "-DDSPARK_TRACE"]).arg(src).arg("-o").arg(&out);
        run(&mut cmd)?;
    }
    println!("ptx --trace: {} modules in {}", sources.len(), out_dir.display());
    Ok(())
}

/// Compiles every `kernels/*.cu` to `crates/dspark-kernels/ptx/<name>.<target>.ptx.xz`: the PTX,
/// starting with a header that records the source hash (checked by a plain test), compressed by
/// `xz -9` (PTX is text: an eleventh of the bytes to track and carry; the loader inflates it once
/// per process). Writes `crates/dspark-kernels/src/cuda/ptx.rs`, the table of modules and kernel
/// names.
pub(crate) fn ptx() -> Result<()> {
    let root = workspace_root();
    let bin = nvcc_bin(&root)?;
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
         /// One compiled kernel file.\npub struct PtxModule {\n    pub name: &'static str,\n    /// The PTX, xz-compressed (`cuda::ptx_text` inflates it).\n    pub sm90: &'static [u8],\n    pub sm80: &'static [u8],\n    /// The sm_89 build, for the modules whose kernels use Ada's E4M3 instructions.\n    pub sm89: Option<&'static [u8]>,\n    pub functions: &'static [&'static str],\n}\n\npub const MODULES: &[PtxModule] = &[\n",
    );
    for src in &sources {
        let stem = src.file_stem().and_then(|s| s.to_str()).context("kernel file name")?.to_string();
        let mut hashed = common.clone();
        hashed.extend_from_slice(&std::fs::read(src).with_context(|| format!("reading {}", src.display()))?);
        let tmp = std::env::temp_dir().join("dspark-ptx-hash");
        std::fs::write(&tmp, &hashed).with_context(|| format!("writing {}", tmp.display()))?;
        let hash = sha256(&tmp)?;
        let mut functions = Vec::new();
        let text = std::fs::read_to_string(src).with_context(|| format!("reading {}", src.display()))?;
        let sm89 = has_sm89_build(&text);
        for (suffix, arch) in PTX_TARGETS {
            if suffix == "sm89" && !sm89 {
                continue;
            }
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
        let sm89_field =
            if sm89 { format!("Some(include_bytes!(\"../../ptx/{stem}.sm89.ptx.xz\"))") } else { "None".to_string() };
        table.push_str(&format!(
            "    PtxModule {{\n        name: \"{stem}\",\n        sm90: include_bytes!(\"../../ptx/{stem}.sm90.ptx.xz\"),\n        sm80: include_bytes!(\"../../ptx/{stem}.sm80.ptx.xz\"),\n        sm89: {sm89_field},\n        functions: &[{}],\n    }},\n",
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
